/* matmul_common.h: what the ISA files (avx2.c, avx512.c) share ahead of
 * their register tiles: the quantized activations of bfp weights (act_q8,
 * carved out of the per-thread scratch) and the software prefetch of a bfp
 * panel. The loops around the tiles are matmul_driver.inc. */
#ifndef Q35_KERNELS_MATMUL_COMMON_H
#define Q35_KERNELS_MATMUL_COMMON_H

#include "backend/cpu/kernels/kernels.h"
#include "formats/bfp.h"

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Blocks per k-slice of a panel in the wide path: a slice's decoded weights
 * and row scales (320 bytes per block) stay in L1 while every token of a
 * chunk passes over them. */
#define BFP_SLICE_BLOCKS 32

/* The most panels one wide tile takes at once (avx512.c: two; avx2.c: one),
 * what the wide path's per-slice scratch is sized for. */
#define BFP_WIDE_MAX_PANELS 2

/* Activations quantized per block of 16 inputs, in per-thread scratch
 * (q35_kernels_scratch), for bfp weights. */
typedef struct act_q8 {
    int8_t *q;     /* (n_tok, n_in) */
    float *d;      /* (n_tok, n_in / 16): x ~= q * d */
    int32_t *o4;   /* (n_tok, n_in / 16), from each block's sum of q: the correction of bfp4's offset codes,
                    * avx512.c -8 * sum, avx2.c -4 * sum in each int16 half of the lane (see there) */
    int32_t *o8;   /* as o4: -128 * sum, bfp8's (avx512.c) */
    /* Allocated for the calls an ISA marks with act_alloc's wide_tok (the wide path's), NULL otherwise;
     * the slice arrays hold one slice per panel of a wide tile, panel p at p * BFP_SLICE_BLOCKS blocks: */
    uint8_t *qu;   /* (n_tok, n_in): q + 128 as unsigned bytes (avx512.c) */
    uint8_t *xe;   /* (n_tok, 2): the least and greatest exponent field of a token's d */
    uint8_t *dec;  /* (panels, BFP_SLICE_BLOCKS, 256): one k-slice of a panel, decoded */
    float *ws;     /* (panels, BFP_SLICE_BLOCKS, 16): that slice's row scales */
    int32_t *wc;   /* (panels, BFP_SLICE_BLOCKS, 16): -128 * each row's sum of the block's weights (avx512.c) */
    int32_t *wsb;  /* (panels, BFP_SLICE_BLOCKS, 16): the row scales' exponents less the bias, shifted to a float's */
    float *acc;    /* (n_tok, panels, 16): the panels' partial sums between slices */
    int xr;        /* the least exponent field of every token's d | the greatest << 8 (avx512.c's GEMV; avx2.c's
                    * wide path, where xe) */
    int il;        /* 0: q, d and sum token by token as above; else the tokens in groups of il, block by block
                    * within a group, its tokens' blocks side by side: token t's block b at act_at(a, t, n_blk)
                    * + b * il (avx512.c: 2 to 8 tokens, il = n_tok; avx2.c: also longer calls, il = 4, the
                    * last group's missing tokens left as holes) */
} act_q8;

/* Carves the arrays for n_blk activation blocks out of this thread's
 * scratch and, when wide_tok > 0 (the tokens of a call that takes the wide
 * path), those of the wide path too. */
static inline int act_alloc(act_q8 *a, size_t n_blk, size_t wide_tok) {
#define ACT_ROUND(n) (((size_t)(n) + 63) & ~(size_t)63)
    const size_t q_bytes = ACT_ROUND(n_blk * 16), d_bytes = ACT_ROUND(n_blk * 4);
    const size_t slice = (size_t)BFP_WIDE_MAX_PANELS * BFP_SLICE_BLOCKS; /* blocks */
    size_t at = q_bytes + 3 * d_bytes, qu = at, xe = qu + q_bytes,
           dec = xe + ACT_ROUND(wide_tok * 2), ws = dec + slice * 256, wc = ws + slice * 64, wsb = wc + slice * 64,
           acc = wsb + slice * 64, end = acc + wide_tok * BFP_WIDE_MAX_PANELS * 64;
#undef ACT_ROUND
    char *s = q35_kernels_scratch(wide_tok ? end : at);
    if (!s) return 0;
    a->q = (int8_t *)s;
    a->d = (float *)(s + q_bytes);
    a->o4 = (int32_t *)(s + q_bytes + d_bytes);
    a->o8 = (int32_t *)(s + q_bytes + 2 * d_bytes);
    a->qu = wide_tok ? (uint8_t *)(s + qu) : NULL;
    a->xe = wide_tok ? (uint8_t *)(s + xe) : NULL;
    a->dec = wide_tok ? (uint8_t *)(s + dec) : NULL;
    a->ws = wide_tok ? (float *)(s + ws) : NULL;
    a->wc = wide_tok ? (int32_t *)(s + wc) : NULL;
    a->wsb = wide_tok ? (int32_t *)(s + wsb) : NULL;
    a->acc = wide_tok ? (float *)(s + acc) : NULL;
    a->il = 0;
    return 1;
}

/* Where token t's block 0 is in a's arrays (q in blocks of 16 bytes, d, o4, o8); its block b is b
 * blocks further (token by token) or b * il (act_q8.il). */
static inline int64_t act_at(const act_q8 *a, int64_t t, int64_t n_blk) {
    return a->il ? (t - t % a->il) * n_blk + t % a->il : t * n_blk;
}

/* From one block of a token to its next (act_q8.il). */
static inline int64_t act_step(const act_q8 *a) { return a->il ? a->il : 1; }

/* Whether the integer add of a row exponent (E - bias) << 23 to the bits of
 * a token's d is the product d * 2^(E - bias), exactly: when d and that
 * product are normal floats, for every d whose exponent field lies in xr
 * (the least | the greatest << 8) and every exponent byte in erange (the
 * same). A zero or subnormal d, or a product out of the normal range, is
 * left to the multiply (vscalefps or ws * xd: both the correctly rounded
 * d * 2^(E - bias) for every E). */
static inline int bfp_exps_add_exact(const int is4, int xr, int erange) {
    const int bias = is4 ? 129 : 133, x_lo = xr & 0xff, x_hi = xr >> 8;
    const int e_lo = (erange & 0xff) - bias, e_hi = (erange >> 8) - bias;
    return x_lo >= 1 && x_hi <= 254 && x_lo + e_lo >= 1 && x_hi + e_hi <= 254;
}

/* The least byte of lo | the greatest of hi << 8 (running minima and maxima of exponent bytes). */
static inline int bfp_bytes_range(__m128i lo, __m128i hi) {
    uint8_t l8[16], h8[16];
    _mm_storeu_si128((__m128i *)l8, lo);
    _mm_storeu_si128((__m128i *)h8, hi);
    int l = 255, h = 0;
    for (int i = 0; i < 16; i++) l = l8[i] < l ? l8[i] : l, h = h8[i] > h ? h8[i] : h;
    return l | h << 8;
}

/* After quantization: each token's least and greatest exponent field of its block scales d into a->xe
 * (where allocated), all tokens' into a->xr (as lo | hi << 8), what the exponent add's checks take.
 * Token t's block b is at d[act_at(a, t, n_blk) + b * act_step(a)] (act_q8.il). */
static inline void act_exp_ranges(act_q8 *a, int64_t n_tok, int64_t n_blk) {
    uint32_t x_lo = 255, x_hi = 0;
    const int64_t stride = act_step(a);
    for (int64_t t = 0; t < n_tok; t++) {
        const float *dt = a->d + act_at(a, t, n_blk);
        uint32_t e_lo = 255, e_hi = 0;
        for (int64_t b = 0; b < n_blk; b++) {
            uint32_t bits;
            memcpy(&bits, &dt[b * stride], 4);
            bits = bits >> 23 & 0xff;
            e_lo = bits < e_lo ? bits : e_lo;
            e_hi = bits > e_hi ? bits : e_hi;
        }
        if (a->xe) a->xe[2 * t] = (uint8_t)e_lo, a->xe[2 * t + 1] = (uint8_t)e_hi;
        x_lo = e_lo < x_lo ? e_lo : x_lo;
        x_hi = e_hi > x_hi ? e_hi : x_hi;
    }
    a->xr = (int)(x_lo | x_hi << 8);
}

/* Whether tokens [t, t + nt) may add the exponents of a slice whose
 * exponent bytes span erange (bfp_slice_predecode): every d of theirs and
 * every product with the rows' 2^(E - bias) a normal float. */
static inline int bfp_scales_add(const int is4, const act_q8 *a, int64_t t, int nt, int erange) {
    int x_lo = 255, x_hi = 0;
    for (int j = 0; j < nt; j++) {
        x_lo = a->xe[2 * (t + j)] < x_lo ? a->xe[2 * (t + j)] : x_lo;
        x_hi = a->xe[2 * (t + j) + 1] > x_hi ? a->xe[2 * (t + j) + 1] : x_hi;
    }
    return bfp_exps_add_exact(is4, x_lo | x_hi << 8, erange);
}

/* bfp.h's layout as the tiles read it: a group of four 16-row panels is one
 * unit of BFP_UNIT bytes per block (the four panels' exponents, 64 bytes,
 * then their codes). A panel is its block 0's exponents and codes, and its
 * index p in the group; block b lies b units further. */
#define BFP_CODE_BYTES(is4) ((is4) ? 128 : 256)
#define BFP_UNIT(is4) ((int)q35_bfp_unit_bytes((is4) ? Q35_DT_BFP4 : Q35_DT_BFP8))
typedef struct bfp_panel {
    const uint8_t *exps, *codes;
    int p;
} bfp_panel;

/* The panel of rows [row0, row0 + 16) (row0 a multiple of 16) of a bfp
 * tensor at data with n_in inputs. */
static inline __attribute__((always_inline)) bfp_panel bfp_panel_at(const uint8_t *data, const int is4, int64_t n_in,
                                                                    int64_t row0) {
    const q35_dtype dt = is4 ? Q35_DT_BFP4 : Q35_DT_BFP8;
    return (bfp_panel){data + q35_bfp_panel_exps(dt, n_in, row0), data + q35_bfp_panel_codes(dt, n_in, row0),
                       (int)(row0 / Q35_BFP_PANEL % Q35_BFP_GROUP)};
}

/* Software prefetch for the bfp tiles. Each block asks for the block
 * BFP_PREFETCH_BLOCKS ahead (past the group's end: the next group's first
 * units) so that decoding overlaps the DRAM latency: with the hardware
 * prefetcher alone a core reached about 60% of its read bandwidth on bfp4.
 * A panel asks for its first blocks when it starts. For bfp4 (128-byte
 * blocks) 2 KiB ahead measured best of 0.5-6 KiB on 4 KiB pages (1-4 KiB
 * were within the noise of a shared machine); counting in blocks keeps bfp8
 * (256-byte blocks, about the same work per block) as far ahead in time,
 * which lifted its GEMV from 13.4-13.8 to 14.8-17.7 GB/s on 2 threads
 * (bench_kernels).
 *
 * The tiles that take one panel at a time ask for that panel's lines only,
 * a stride through its group's units. Asking for whole units where a
 * group's first panel starts (the other three then read from L2) was slower:
 * the first panel waits on four times its bytes while the other three leave
 * the memory idle (8 tokens, one thread: 0.35 against 0.42 of a plain read
 * of the same matrices; 5 tokens 0.42 against 0.54). */
#define BFP_PREFETCH_BLOCKS 16
/* Into L1 by default: avx512.c's GEMV once read more with L2 (when it read eight streams); with one
 * stream of units, L1 reads more there on Zen 5, L2 on Zen 4 (avx512.c passes the helpers below
 * q35_kernels_prefetch_l2(), which chooses by CPU). avx2.c sets L2 for all its bfp
 * tiles: on a Zen 3 core (its one-token GEMV reading two groups as two streams) L2 read more (avx2.c
 * says how much); on Zen 5, with Q35_KERNELS=avx2 and the one-stream GEMV of then, L2 had decoded
 * 2.64-2.71 against 2.84-3.15 tok/s on 1 thread (9B shapes, interleaved), not re-measured since. */
#ifndef BFP_PREFETCH_HINT
#define BFP_PREFETCH_HINT _MM_HINT_T0
#endif

/* The helpers below take l2: 0 for BFP_PREFETCH_HINT's level, 1 for L2 (avx512.c's tiles pass
 * q35_kernels_prefetch_l2(), a choice by CPU or Q35_PREFETCH; a branch per block, not per line). */

/* Block b's lines of panel pn: its exponents (the unit's first line, the
 * group's four panels') and its codes. */
static inline __attribute__((always_inline)) void bfp_prefetch_unit(const bfp_panel pn, const int is4, int64_t b,
                                                                    const int l2) {
    const int unit = BFP_UNIT(is4), cbytes = BFP_CODE_BYTES(is4);
    const char *e = (const char *)pn.exps + b * unit, *c = (const char *)pn.codes + b * unit;
    if (l2) {
        _mm_prefetch(e, _MM_HINT_T1);
        #pragma GCC unroll 4
        for (int l = 0; l < cbytes; l += 64) _mm_prefetch(c + l, _MM_HINT_T1);
    } else {
        _mm_prefetch(e, BFP_PREFETCH_HINT);
        #pragma GCC unroll 4
        for (int l = 0; l < cbytes; l += 64) _mm_prefetch(c + l, BFP_PREFETCH_HINT);
    }
}

/* All of a group's unit b, its four panels' exponents and codes: for the
 * GEMVs, which read whole units (group: the group's first panel's exps). */
static inline __attribute__((always_inline)) void bfp_prefetch_group_unit(const uint8_t *group, const int is4,
                                                                          int64_t b, const int l2) {
    const int unit = BFP_UNIT(is4);
    const char *u = (const char *)group + b * unit;
    if (l2) {
        #pragma GCC unroll 17
        for (int l = 0; l < unit; l += 64) _mm_prefetch(u + l, _MM_HINT_T1);
    } else {
        #pragma GCC unroll 17
        for (int l = 0; l < unit; l += 64) _mm_prefetch(u + l, BFP_PREFETCH_HINT);
    }
}

/* The first `ahead` blocks of a panel (a literal after inlining). */
static inline __attribute__((always_inline)) void bfp_prefetch_panel_ahead(const bfp_panel pn, const int is4,
                                                                           int ahead, const int l2) {
    for (int b = 0; b < ahead; b++) bfp_prefetch_unit(pn, is4, b, l2);
}

/* Block b + ahead, as block b is read. */
static inline __attribute__((always_inline)) void bfp_prefetch_block_ahead(const bfp_panel pn, const int is4,
                                                                           int64_t b, int ahead, const int l2) {
    bfp_prefetch_unit(pn, is4, b + ahead, l2);
}

static inline __attribute__((always_inline)) void bfp_prefetch_panel(const bfp_panel pn, const int is4) {
    bfp_prefetch_panel_ahead(pn, is4, BFP_PREFETCH_BLOCKS, 0);
}

static inline __attribute__((always_inline)) void bfp_prefetch_block(const bfp_panel pn, const int is4, int64_t b) {
    bfp_prefetch_block_ahead(pn, is4, b, BFP_PREFETCH_BLOCKS, 0);
}

/* The wide path's predecode of block b asks for the same block of the next
 * k-slice (after a panel's last slice: past its group's end) into L2:
 * the slice's tokens run in between, so it has arrived before it is
 * decoded. 16 blocks ahead, as the tiles ask, it came as the next
 * predecode's quick loop waited for it: prompts of 512 on one thread
 * 27.7-28.3 against 25.3-25.7 tok/s at the 9B shapes (avx512, interleaved). */
static inline __attribute__((always_inline)) void bfp_prefetch_next_slice(const bfp_panel pn, const int is4,
                                                                          int64_t b) {
    const int unit = BFP_UNIT(is4), cbytes = BFP_CODE_BYTES(is4);
    const char *e = (const char *)pn.exps + (b + BFP_SLICE_BLOCKS) * unit;
    const char *c = (const char *)pn.codes + (b + BFP_SLICE_BLOCKS) * unit;
    #pragma GCC unroll 4
    for (int l = 0; l < cbytes; l += 64) _mm_prefetch(c + l, _MM_HINT_T1);
    _mm_prefetch(e, _MM_HINT_T1);
}

#endif
