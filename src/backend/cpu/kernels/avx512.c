/* avx512.c: matmul kernels for AVX-512 F/BW/VL/DQ with VNNI (compiled with
 * those flags only; dispatch.c checks cpuid before anything here runs).
 * avx512bf16.c compiles this file again, with AVX512_BF16 on and
 * Q35_KERNELS_BF16 defined, into the avx512bf16 table: the same kernels
 * but for BF16 weights (below).
 *
 * BFP4 / BFP8 weights (16-row panels, bfp.h): x is quantized per 16-value
 * block to int8 into per-thread scratch, then each 16x16 weight block is
 * four vpdpbusd whose 32-bit lanes are the panel's 16 rows, so no
 * horizontal sums. vpdpbusd multiplies unsigned by signed bytes, so weight
 * codes are value + 8 (bfp4, stored so: bfp.h) or become value + 128 (bfp8) and the block starts
 * from -8 * sum(q) or -128 * sum(q) to cancel the offset. One float FMA per
 * block and token applies x's block scale times the rows' 2^(E - 127 -
 * (w - 1)) (vscalefps makes every E exact, subnormal scales included; where
 * every product is a normal float, an integer add of E to x's scale's
 * exponent makes the same float, off the FMA's pipe). A panel tile serves
 * up to 8 tokens, so the weights are read and decoded once for a whole
 * small batch, and it prefetches ahead in the panel
 * stream (matmul_common.h). Batches of more than 8 tokens (prefill,
 * batched verify) decode each k-slice of two panels once into scratch
 * (bfp_slice_predecode) and then run a tile that only does the dot products
 * (bfp_slice_tile). Both tiles share the per-block arithmetic
 * (bfp_block_fma), so a token's outputs are bitwise the same in any batch
 * and for any row split.
 *
 * F32 / F16 / BF16 weights: rows widened to fp32 in registers, 4 rows x up
 * to 3 tokens x 2 halves of k of fp32 accumulators, x kept in fp32. In the
 * avx512bf16 table, BF16 weights instead meet x rounded to bf16
 * (vcvtne2ps2bf16) in vdpbf16ps, 32 inputs per instruction: half the
 * instructions and no widening of the weights, at the accuracy kernels.h
 * states for it. */
#include "formats/bfp.h"
#include "backend/cpu/kernels/kernels.h"
#include "backend/cpu/kernels/attend_q8.h"
#include "base/util.h"

#include <immintrin.h>
#include <math.h>

#include "backend/cpu/kernels/matmul_common.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The tiles' small loops over tokens, rows and groups must unroll fully so
 * that their arrays of vectors live in registers; -O2 alone keeps them as
 * loops over stack arrays. */

#define ISA_BFP_NT 8
/* calls of more tokens than one panel tile serves take the wide path (bfp_wide_panel) */
#define BFP_WIDE_MIN_TOKENS(is4) (ISA_BFP_NT + 1)

/* ---- activations quantized per block of 16 ---- */

static int act_quantize(act_q8 *a, const float *x, int64_t n_tok, int64_t n_in) {
    const int64_t n_blk = n_in / 16;
    if (!act_alloc(a, (size_t)(n_tok * n_blk), n_tok >= BFP_WIDE_MIN_TOKENS(1) ? (size_t)n_tok : 0)) return 0;
    /* a small batch's tokens side by side, block by block: the tiles then find every token's block at a
     * constant offset from one pointer, not at n_in apart (a register and an address computation each) */
    if (n_tok >= 2 && n_tok <= ISA_BFP_NT) a->il = (int)n_tok;
    for (int64_t t = 0; t < n_tok; t++) {
        for (int64_t j = t * n_blk; j < (t + 1) * n_blk; j++) {
            const int64_t i = a->il ? (j - t * n_blk) * n_tok + t : j; /* where block j goes */
            __m512 v = _mm512_loadu_ps(x + 16 * j);
            float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
            float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
            __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(inv))); /* nearest even */
            const __m128i q16 = _mm512_cvtepi32_epi8(qi), qu = _mm_xor_si128(q16, _mm_set1_epi8((char)0x80));
            _mm_storeu_si128((__m128i *)(a->q + 16 * i), q16);
            if (a->qu) _mm_storeu_si128((__m128i *)(a->qu + 16 * i), qu);
            a->d[i] = amax / 127.0f;
            /* the sum of the bytes stored (q + 128 summed by psadbw, less 16 * 128): the same as qi's for
             * finite x, and within +-2048 where x holds an infinity or a NaN (qi then holds INT_MIN) */
            const __m128i sad = _mm_sad_epu8(qu, _mm_setzero_si128());
            const int32_t sum = _mm_cvtsi128_si32(sad) + _mm_extract_epi32(sad, 2) - 2048;
            a->o4[i] = -8 * sum, a->o8[i] = -128 * sum; /* the tiles' starts (bfp_block_fma) */
        }
    }
    act_exp_ranges(a, n_tok, n_blk); /* the GEMV's and the wide path's exponent add */
    return 1;
}

/* ---- bfp weight decode: one group (4 inputs x 16 rows) to offset bytes ---- */

ALWAYS_INLINE __m512i bfp4_group(const uint8_t *p) {
    /* the 32 bytes in both halves; the upper half shifted down a nibble */
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    v = _mm512_mask_srli_epi16(v, (__mmask32)0xffff0000u, v, 4);
    /* low nibbles: rows 0..7, high nibbles: rows 8..15, stored as value + 8 (bfp.h) */
    return _mm512_and_si512(v, _mm512_set1_epi8(0x0f));
}

ALWAYS_INLINE __m512i bfp8_group(const uint8_t *p) {
    __m512i c = _mm512_loadu_si512(p);
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi8(0x7f));
    __m512i bias = _mm512_set1_epi8((char)0x80);
    /* 128 + m, or 128 - m where the sign bit is set */
    return _mm512_mask_sub_epi8(_mm512_or_si512(mag, bias), _mm512_movepi8_mask(c), bias, mag);
}

/* A block's 16 row scales 2^(E - 127 - (w - 1)): exact for every exponent
 * byte (the smallest, 2^-129, is a float subnormal). */
ALWAYS_INLINE __m512 bfp_row_scales(const int is4, const uint8_t *e16) {
    __m512i e = _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)e16)),
                                 _mm512_set1_epi32(is4 ? 129 : 133));
    return _mm512_scalef_ps(_mm512_set1_ps(1.0f), _mm512_cvtepi32_ps(e));
}

/* x's group g (4 int8) of a block broadcast to every lane: one
 * load-broadcast from memory, not a trip through a general register. */
ALWAYS_INLINE __m512i bcast_x4(const int8_t *xb, int g) {
    int32_t v;
    memcpy(&v, xb + 4 * g, 4);
    return _mm512_set1_epi32(v);
}

/* d + the dot of the offset bytes w with x's group g of the block at xb
 * (4 int8 in every lane), x taken as vpdpbusd's broadcast memory operand
 * ({1to16}): GCC emits a vpbroadcastd and a vpdpbusd for the intrinsics,
 * and in the panel tile of 5-8 tokens those broadcasts were a third of
 * the loop's instructions (8 tokens from DRAM: 0.41 -> 0.44 of a plain
 * read on one thread, 0.61 -> 0.65 on two). The GEMV keeps the intrinsic:
 * there one broadcast serves four panels. */
ALWAYS_INLINE __m512i dpbusd_x4(__m512i d, __m512i w, const int8_t *xb, int g) {
#ifdef Q35_AVX512_EMU /* tests/emu/avx512_emu.h: the same sum, with the intrinsic */
    d = _mm512_dpbusd_epi32(d, w, bcast_x4(xb, g));
#else
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(d) : "v"(w), "m"(*(const int32_t *)(xb + 4 * g)));
#endif
    return d;
}

/* The four dpbusd_x4 of a block (x's 16 int8 at xb) with xb in a register
 * and the groups at displacements 0, 4, 8 and 12 from it: the GEMV of three
 * and four tokens takes this form (bfp_gemv_fma, where dpbusd_x4's operands
 * let GCC hold every address in a register). The panel tile keeps
 * dpbusd_x4, whose operands GCC folds into displacements from one pointer
 * there: this form took its loop of 8 tokens from 98 to 106 instructions a
 * block. */
ALWAYS_INLINE __m512i dpbusd_block_x(__m512i d, const __m512i w[4], const int8_t *xb) {
#ifdef Q35_AVX512_EMU
    for (int g = 0; g < 4; g++) d = _mm512_dpbusd_epi32(d, w[g], bcast_x4(xb, g));
#else
    __asm__("vpdpbusd (%5)%{1to16%}, %1, %0\n\t"
            "vpdpbusd 4(%5)%{1to16%}, %2, %0\n\t"
            "vpdpbusd 8(%5)%{1to16%}, %3, %0\n\t"
            "vpdpbusd 12(%5)%{1to16%}, %4, %0"
            : "+v"(d)
            : "v"(w[0]), "v"(w[1]), "v"(w[2]), "v"(w[3]), "r"(xb), "m"(*(const int8_t(*)[16])xb));
#endif
    return d;
}

/* A block's exact integer dot d (16 rows) into acc: one FMA with x's block
 * scale xd times the row scales ws (a power of two, so the product is
 * rounded once). Every tile ends a block with this expression, or (the
 * GEMV) with one that rounds the same product the same. */
ALWAYS_INLINE __m512 bfp_dot_fma(__m512i d, __m512 ws, float xd, __m512 acc) {
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, _mm512_set1_ps(xd)), acc);
}

/* One block's contribution to one token and the panel's 16 rows, the same
 * expression in every tile so that a token's result does not depend on
 * the tile (nor so on the batch): the exact integer dot of the offset
 * weights w with x's 16 int8 (xb), started from -offset * sum(q) to
 * cancel the offset, then one FMA with x's block scale xd times the row
 * scales (a power of two, so the product is rounded once). That product is
 * ws * xd (ws: the row scales), or with eadd the integer add of eb (the rows'
 * (E - bias) << 23) to xd's bits: the same float where bfp_exps_add_exact
 * holds, which the caller checks (bfp_panel_loop). */
ALWAYS_INLINE __m512 bfp_block_fma(const int is4, const int nt, const int eadd, const __m512i w[4], const int8_t *xb,
                                   const int32_t *xo, const float *xd, __m512 ws, __m512i eb, __m512 acc) {
    __m512i d0 = _mm512_set1_epi32(*xo); /* -8 or -128 times x's sum: a broadcast from memory */
    if (nt >= 4) { /* the tokens' chains overlap: one chain, no add (the integer sum is the same) */
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) d0 = dpbusd_x4(d0, w[g], xb, g);
    } else { /* two chains halve the vpdpbusd latency per block */
        __m512i d1 = _mm512_setzero_si512();
        d0 = dpbusd_x4(d0, w[0], xb, 0);
        d1 = dpbusd_x4(d1, w[1], xb, 1);
        d0 = dpbusd_x4(d0, w[2], xb, 2);
        d1 = dpbusd_x4(d1, w[3], xb, 3);
        d0 = _mm512_add_epi32(d0, d1);
    }
    if (!eadd) return bfp_dot_fma(d0, ws, *xd, acc);
    int32_t xbits;
    memcpy(&xbits, xd, 4);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d0), _mm512_castsi512_ps(_mm512_add_epi32(eb, _mm512_set1_epi32(xbits))),
                           acc);
}

/* Two groups of bfp4_group (p: their 64 code bytes) from one 64-byte load:
 * the 64 low nibbles, then the 64 high ones after a shift, and two lane
 * shuffles put each group's rows 0-7 and 8-15 together. 5 vector uops for
 * two groups instead of two 32-byte broadcast loads and 4 uops (a broadcast
 * load measured 1.5 times a vector uop's cost on a Zen 5 core): with the
 * weights in cache one core's GEMV ran 50.5 -> 55.7 GB/s. It was measured
 * with the codes stored as sign and magnitude, when the nibbles were two
 * vpermb lookups (AVX512_VBMI) in place of the two ANDs, and is still taken
 * on the CPUs that have VBMI only (bfp_gemv_tile). */
ALWAYS_INLINE void bfp4_pair(const uint8_t *p, __m512i *w0, __m512i *w1) {
    const __m512i v = _mm512_loadu_si512((const void *)p), nib = _mm512_set1_epi8(0x0f);
    const __m512i lo = _mm512_and_si512(v, nib), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), nib);
    *w0 = _mm512_shuffle_i64x2(lo, hi, 0x44); /* lo's and hi's lanes 0-1: the first group */
    *w1 = _mm512_shuffle_i64x2(lo, hi, 0xee); /* lanes 2-3: the second */
}

/* A block's four groups as offset bytes (value + 8 or value + 128). */
ALWAYS_INLINE void bfp_block_decode(const int is4, const uint8_t *cb, __m512i w[4]) {
    #pragma GCC unroll 4
    for (int g = 0; g < 4; g++) w[g] = is4 ? bfp4_group(cb + g * 32) : bfp8_group(cb + g * 64);
}

/* The panel tile's prefetch distance in blocks (32 KiB of either). It is
 * one stream, so its lines in flight are the distance: at matmul_common.h's
 * 16 blocks, 5 and 8 tokens read 0.47 and 0.38 of a plain read of the same
 * matrices on one thread, at 64 0.60 and 0.45 (0.75 and 0.94 against 0.65
 * and 0.76 on two; bfp8, 8 tokens: 0.75 against 0.64; medians of 9
 * interleaved rounds). 8 tokens from L3 run 17 GB/s: the tile is then at
 * its compute. From 64 blocks (8 KiB of bfp4, 16 of bfp8) to 32 KiB, on a
 * Zen 4 VM ([12288, 4096] x 16 from DRAM, 8 tokens, the least of 12-15
 * passes, interleaved builds): bfp4 on two threads 22.2-23.9 -> 20.3-20.6
 * ms in five of six rounds (22.7 against 23.2 in the sixth; the tile's
 * arithmetic alone takes about 20.5), on one 43.7-47.1 -> 40.1-40.6; bfp8
 * 23.6-24.3 -> 22.6-24.5; 5 bfp4 tokens 13.9-14.3 either way; 64 KiB was
 * slower for both (bfp4 21.8-21.9, bfp8 24.6-27.9). */
#define BFP_TILE_PREFETCH_BLOCKS(is4) ((is4) ? 256 : 128)

#ifndef BFP_PANEL_EADD
#define BFP_PANEL_EADD 1 /* 0: the panel tile's scales always by the multiply */
#endif

/* Block b of a panel read from memory: asks for the block BFP_TILE_PREFETCH_BLOCKS ahead (into L2
 * where l2), decodes this one into w and returns its 16 exponent bytes. */
ALWAYS_INLINE __m128i bfp_block_read(const int is4, const bfp_panel pn, int64_t b, __m512i w[4], const int l2) {
    bfp_prefetch_block_ahead(pn, is4, b, BFP_TILE_PREFETCH_BLOCKS(is4), l2);
    bfp_block_decode(is4, pn.codes + b * BFP_UNIT(is4), w);
    return _mm_loadu_si128((const __m128i *)(pn.exps + b * BFP_UNIT(is4)));
}

/* Stores nt tokens' rows (those in mask `rows`) at y, token stride n_out. */
ALWAYS_INLINE void bfp_store(const int nt, const __m512 acc[], float *y, int64_t n_out, __mmask16 rows) {
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + t * n_out, rows, acc[t]);
}

#define BFP_ROWS_MASK(lo, hi) ((__mmask16)((0xffffu >> (16 - (hi))) & (0xffffu << (lo))))

/* Where token t's block b of x is in a (act_q8.il): its int8, and the
 * index of its scale and sum. il is a literal after inlining; where it is
 * set, the call's tokens are t = 0 .. il - 1. */
#define ACT_Q(a, il, t, b, n_in) ((il) ? (a)->q + 16 * ((b) * (il) + (t)) : (a)->q + (t) * (n_in) + 16 * (b))
#define ACT_I(il, t, b, n_blk) ((il) ? (b) * (il) + (t) : (t) * (n_blk) + (b))

/* y rows [row0 + lo, row0 + hi) for tokens [t0, t0 + nt) from one panel;
 * is4, nt, il (the layout of a: nt or 0) and eadd are constants after
 * inlining. With eadd the scale products are exponent adds (bfp_block_fma):
 * returns 0, storing nothing, where the panel's exponent bytes and the
 * tokens' d do not keep them exact, for the caller to take the loop again
 * without. */
ALWAYS_INLINE int bfp_panel_loop(const int is4, const int nt, const int il, const int eadd, const bfp_panel pn,
                                 int64_t n_in, const act_q8 *a, int64_t t0, float *y, int64_t n_out, int64_t row0,
                                 int lo, int hi, const int l2) {
    const int64_t n_blk = n_in / 16;
    const int32_t *xo = is4 ? a->o4 : a->o8;
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    __m128i e_lo = _mm_set1_epi8((char)0xff), e_hi = _mm_setzero_si128();
    bfp_prefetch_panel_ahead(pn, is4, BFP_TILE_PREFETCH_BLOCKS(is4), l2);
    for (int64_t b = 0; b < n_blk; b++) {
        __m512i w[4], eb = _mm512_setzero_si512();
        __m512 ws = _mm512_setzero_ps();
        const __m128i e8 = bfp_block_read(is4, pn, b, w, l2);
        if (eadd) {
            e_lo = _mm_min_epu8(e_lo, e8);
            e_hi = _mm_max_epu8(e_hi, e8);
            eb = _mm512_slli_epi32(_mm512_sub_epi32(_mm512_cvtepu8_epi32(e8), _mm512_set1_epi32(is4 ? 129 : 133)), 23);
        } else {
            ws = bfp_row_scales(is4, pn.exps + b * BFP_UNIT(is4));
        }
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            acc[t] = bfp_block_fma(is4, nt, eadd, w, ACT_Q(a, il, t0 + t, b, n_in), xo + ACT_I(il, t0 + t, b, n_blk),
                                   a->d + ACT_I(il, t0 + t, b, n_blk), ws, eb, acc[t]);
    }
    if (eadd && !bfp_exps_add_exact(is4, a->xr, bfp_bytes_range(e_lo, e_hi))) return 0;
    bfp_store(nt, acc, y + t0 * n_out + row0, n_out, BFP_ROWS_MASK(lo, hi));
    return 1;
}

/* The exponent add where every token's d of the call is normal (a->xr; rarely not: a block of zeros)
 * and, after the panel, its exponent bytes keep the products normal (else the panel again with the
 * multiply, the same bits). The multiply shared the pipe of the vpdpbusd and the FMA, the add goes
 * beside them: on a Zen 4 core, [512, 4096] BFP4 from L2/L3 on one thread (least of 400 calls, three
 * interleaved rounds), 8 tokens 1.84-1.85 -> 1.61-1.62 ns per block, token and panel, 5 tokens 1.86 ->
 * 1.73-1.74; `qwen35 speed -t 2` at the 9B shapes, a step of 8 rows 0.266-0.283 -> 0.243-0.247 s
 * (three interleaved rounds). */
ALWAYS_INLINE void bfp_panel_tile(const int is4, const int nt, const bfp_panel pn, int64_t n_in, const act_q8 *a,
                                  int64_t t0, float *y, int64_t n_out, int64_t row0, int lo, int hi) {
    const int l2 = q35_kernels_prefetch_l2(), bias = is4 ? 129 : 133;
    const int eadd = BFP_PANEL_EADD && bfp_exps_add_exact(is4, a->xr, bias | bias << 8);
    if (nt > 1 && a->il == nt) {
        if (!eadd || !bfp_panel_loop(is4, nt, nt, 1, pn, n_in, a, 0, y, n_out, row0, lo, hi, l2))
            bfp_panel_loop(is4, nt, nt, 0, pn, n_in, a, 0, y, n_out, row0, lo, hi, l2);
    } else {
        if (!eadd || !bfp_panel_loop(is4, nt, 0, 1, pn, n_in, a, t0, y, n_out, row0, lo, hi, l2))
            bfp_panel_loop(is4, nt, 0, 0, pn, n_in, a, t0, y, n_out, row0, lo, hi, l2);
    }
}

/* Decode (up to BFP_GEMV_TOKENS tokens) over a group's four panels at once,
 * block by block: bfp.h stores them so, unit after unit, one sequential
 * stream. On a Zen 5 core one panel at a time streamed bfp4 at 17-19 GB/s
 * against a 34 GB/s plain read (in L2 it decodes 48 GB/s): the core is not
 * the limit, the lines in flight are. Four panels stored one after another
 * (eight streams, each panel's exponents and codes) streamed 0.83-0.88 of
 * a plain read of the same bytes; stored as units, 0.93-1.01 (one and two
 * threads, [12288, 4096] x 24 from DRAM, medians of nine interleaved
 * rounds). Each panel's outputs, token by token, are bfp_panel_tile's for
 * nt = 1, bit for bit (the same bfp_block_fma, block by block in order). */
#define BFP_GEMV_PANELS 4 /* a group, from its start (bfp_gemv_tile takes pn.exps as the group's) */
/* Units ahead: 9 KiB of bfp4 (8 and 12 blocks were no different), 4.3 KiB of bfp8: 8 blocks (8.5 KiB) read
 * 0.81 and 0.87-0.89 of a plain read on one and two threads, 4 blocks 0.86 and 0.96 (interleaved, medians of 9) */
#ifndef BFP_GEMV_PREFETCH_BLOCKS
#define BFP_GEMV_PREFETCH_BLOCKS(is4) ((is4) ? 16 : 4)
#endif
/* up to 4 tokens (a verify step, a small batch) take it too: 16 sums, four
 * panels' weights and the scales fit the 32 registers */
#ifndef BFP_GEMV_TOKENS
#define BFP_GEMV_TOKENS 4
#endif

#ifndef BFP_GEMV_EADD
#define BFP_GEMV_EADD 1 /* 0: the GEMV's scales always by vscalefps */
#endif

#ifndef BFP_GEMV_VBMI
#define BFP_GEMV_VBMI 1 /* 0: never take bfp4_pair */
#endif

/* The GEMV's row exponents E - 127 - (w - 1) as floats (exact integers)
 * in two vector uops: each exponent byte goes into the low byte of a lane
 * of 0x4b000000 (a masked vpshufb of the 16
 * bytes broadcast to every 128-bit lane: the float 2^23 + E, exactly), then
 * minus 2^23 + 129 (or 133), an exact float subtraction of integers. */
ALWAYS_INLINE __m512 bfp_row_exps_gemv(const int is4, const uint8_t *e16) {
    const __m512i idx = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __m512i v = _mm512_mask_shuffle_epi8(_mm512_set1_epi32(0x4b000000), (__mmask64)0x1111111111111111ull,
                                         _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)e16)), idx);
    return _mm512_sub_ps(_mm512_castsi512_ps(v), _mm512_set1_ps(8388608.0f + (is4 ? 129 : 133)));
}

/* bfp_bytes_range over the four 128-bit lanes of 64-byte minima and maxima */
static inline int bfp_bytes_range64(__m512i lo, __m512i hi) {
    const __m256i l = _mm256_min_epu8(_mm512_castsi512_si256(lo), _mm512_extracti64x4_epi64(lo, 1));
    const __m256i h = _mm256_max_epu8(_mm512_castsi512_si256(hi), _mm512_extracti64x4_epi64(hi, 1));
    return bfp_bytes_range(_mm_min_epu8(_mm256_castsi256_si128(l), _mm256_extracti128_si256(l, 1)),
                           _mm_max_epu8(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

/* The GEMV's prefetch goes to L1 (bfp_prefetch_group_unit), on Zen 4 to L2 (below). With four streams 2 KiB ahead (before the
 * units), prefetches into L1 waited for its few fill buffers and those into L2 measured better (decode
 * 3.40-3.82 against 2.61-3.11 tok/s on 1 thread); with one stream of units and the paired loads of
 * bfp4_pair, L1 reads more: [12288, 4096] x 24 from DRAM on one thread, interleaved, medians of 11:
 * bfp4 0.94 -> 0.99 and 0.94 -> 0.99 of a plain read, bfp8 0.92 -> 0.98 and 0.85 -> 0.94; two threads
 * 1.00 either way. */

/* Units ahead where the prefetches go to L2 (q35_kernels_prefetch_l2: Zen 4). On a Zen 4 core, one
 * thread, [12288, 4096] x 16 from DRAM, interleaved, medians of 9-15 against a plain read of the same
 * bytes: L1 prefetches read bfp4 0.86, bfp8 0.65-0.78, two bfp4 tokens 0.66; L2 prefetches at the L1
 * distances (16 / 4 units) bfp4 0.94-1.02, bfp8 0.76-0.81, two tokens 0.92-0.94; then the distance
 * (about 1.1 KiB best, 3-4.5 KiB worst): bfp4 2 units 1.06-1.08 (3: 0.77-0.81, 4: 0.60-0.65, 8:
 * 0.85-0.91, 12: 1.01, 24: 0.99), bfp8 1 unit 1.05-1.08 (2: 0.96-1.03, 3: 0.71-0.74); at 2 and 4
 * tokens bfp8 1 unit 0.86 -> 1.08 and 0.80 -> 0.90, bfp4 2 units 0.92 -> 0.91 and 0.61 -> 0.51.
 * With the exponent add (bfp_gemv_fma) two bfp4 tokens are no longer at the core's compute, and
 * their cost against one token's on two threads (rows halved, medians of 15-21 interleaved rounds)
 * is 16 units 1.06-1.09, 14 and more 1.08-1.09, 12 1.04, 10 1.00, 2 1.01-1.03; on one thread 10
 * units read 0.91-0.94 of a plain read, 16 0.96-1.01 (three and four tokens: the same either way).
 * Two threads are what a verify step runs on: 10. */
#define BFP_GEMV_PREFETCH_BLOCKS_L2(is4, nt) ((is4) ? ((nt) == 1 ? 2 : 10) : 1)

/* One block and token of the GEMV: bfp_block_fma's result bit for bit. One
 * vpdpbusd chain (the integer sum is exact in any order; the four panels
 * are four independent chains), and the scale xd * 2^e either as one
 * vscalefps (e: the exponents as floats; both it and bfp_block_fma's
 * ws * xd are xd * 2^e correctly rounded) or, with eadd, as one integer
 * add of e (the exponents shifted to a float's, E << 23) to xd's bits less
 * the bias (xdb), exact where bfp_exps_add_exact holds, which the caller
 * checks over the group before it keeps the result (the panel tile's
 * bfp_block_fma takes the bias off the exponents instead, once per block
 * for all its tokens; here the eight panels of a block share a token's
 * xdb, so the bias comes off x's bits once per token and block). The add
 * runs on any of a Zen 4 core's four vector pipes, vscalefps on the two
 * that also carry the vpdpbusd and the FMA: with the weights in L2 one Zen
 * 4 core's bfp4 GEMV ran 1.11-1.13x as fast (one and two tokens), and two
 * tokens from DRAM read 0.99-1.02 of a plain read, not 0.89-0.95
 * (interleaved, medians of 15; one token was at the read already).
 * x comes as broadcasts that GCC hoists out of the panel loop, one for the
 * four panels; from three tokens on those (four a token) and the sums (16
 * at four tokens) outgrow the 32 registers, and GCC 12 kept the sums on the
 * stack (43 stack references a block at four tokens), so there each vpdpbusd
 * takes x as its memory operand from one register a token (dpbusd_block_x;
 * with the intrinsics' memory form GCC held the 16 addresses in registers
 * and spilled those instead): 10 stack references. Zen 4, [512, 4096] from
 * L2 on one thread, least of 400 calls, three interleaved rounds, ns per
 * block, token and panel: bfp4 4 tokens 1.83-1.85 -> 1.75-1.77, 3 tokens
 * 1.97-1.98 -> 1.96-1.97; bfp8 4 tokens 2.31-2.33 -> 2.13-2.14, 3 tokens
 * 2.36-2.40 -> 2.32-2.34. */
#define BFP_GEMV_XREG_TOKENS 3 /* calls of this many tokens or more take dpbusd_block_x */
ALWAYS_INLINE __m512 bfp_gemv_fma(const int is4, const int nt, const int eadd, const __m512i w[4], const int8_t *xb,
                                  const int32_t *xo, const float *xd, __m512 e, __m512 acc) {
    __m512i d = _mm512_set1_epi32(*xo);
    if (nt >= BFP_GEMV_XREG_TOKENS) {
        d = dpbusd_block_x(d, w, xb);
    } else {
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) d = _mm512_dpbusd_epi32(d, w[g], bcast_x4(xb, g)); /* one broadcast for four panels */
    }
    if (eadd) {
        int32_t xb32;
        memcpy(&xb32, xd, 4);
        const __m512i xdb = _mm512_sub_epi32(_mm512_set1_epi32(xb32), _mm512_set1_epi32((is4 ? 129 : 133) << 23));
        return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(e), xdb)),
                               acc);
    }
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_scalef_ps(_mm512_set1_ps(*xd), e), acc);
}

/* With eadd, returns 0 (and stores nothing) where the group's exponent
 * bytes and the tokens' d do not keep the add exact: the caller then takes
 * the loop again without. */
ALWAYS_INLINE int bfp_gemv_loop(const int is4, const int nt, const int il, const int vbmi, const int eadd,
                                const uint8_t *group, int64_t n_in, const act_q8 *a, float *y, int64_t n_out,
                                const int l2) {
    const int np = BFP_GEMV_PANELS;
    const int64_t n_blk = n_in / 16;
    const int unit = BFP_UNIT(is4), block_bytes = BFP_CODE_BYTES(is4);
    const int ahead = l2 ? BFP_GEMV_PREFETCH_BLOCKS_L2(is4, nt) : BFP_GEMV_PREFETCH_BLOCKS(is4);
    __m512 acc[BFP_GEMV_PANELS][BFP_GEMV_TOKENS];
    #pragma GCC unroll 8
    for (int p = 0; p < np; p++)
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[p][t] = _mm512_setzero_ps();
    __m512i e_lo = _mm512_set1_epi8((char)0xff), e_hi = _mm512_setzero_si512(); /* eadd: the exponent bytes' range */
    for (int b = 0; b < ahead; b++) bfp_prefetch_group_unit(group, is4, b, l2);
    for (int64_t b = 0; b < n_blk; b++) {
        /* the group is one stream: the unit `ahead` blocks on (past the group's end, the next group's first) */
        const uint8_t *u = group + b * unit;
        bfp_prefetch_group_unit(group, is4, b + ahead, l2);
        if (eadd) { /* the unit's 64 exponent bytes, the four panels' */
            const __m512i e64 = _mm512_loadu_si512((const void *)u);
            e_lo = _mm512_min_epu8(e_lo, e64);
            e_hi = _mm512_max_epu8(e_hi, e64);
        }
        #pragma GCC unroll 8
        for (int p = 0; p < np; p++) {
            const uint8_t *cb = u + 64 + p * block_bytes;
            __m512i w[4];
            if (is4 && vbmi) {
                bfp4_pair(cb, &w[0], &w[1]);
                bfp4_pair(cb + 64, &w[2], &w[3]);
            } else {
                bfp_block_decode(is4, cb, w);
            }
            const __m512 e = eadd ? _mm512_castsi512_ps(_mm512_slli_epi32(
                                        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(u + 16 * p))), 23))
                                  : bfp_row_exps_gemv(is4, u + 16 * p);
            #pragma GCC unroll 4
            for (int t = 0; t < nt; t++)
                acc[p][t] = bfp_gemv_fma(is4, nt, eadd, w, ACT_Q(a, il, t, b, n_in),
                                         (is4 ? a->o4 : a->o8) + ACT_I(il, t, b, n_blk), a->d + ACT_I(il, t, b, n_blk),
                                         e, acc[p][t]);
        }
    }
    if (eadd && !bfp_exps_add_exact(is4, a->xr, bfp_bytes_range64(e_lo, e_hi))) return 0;
    #pragma GCC unroll 8
    for (int p = 0; p < np; p++)
        #pragma GCC unroll 4
        for (int t = 0; t < nt; t++) _mm512_storeu_ps(y + t * n_out + 16 * p, acc[p][t]);
    return 1;
}

/* bfp4 takes bfp4_pair where the CPU has AVX512_VBMI (where it was
 * measured): 2.5 vector uops per group and half a plain load, instead of 2
 * uops and a broadcast load (bfp4_group). */
ALWAYS_INLINE void bfp_gemv_tile(const int is4, const int nt, const bfp_panel pn, int64_t n_in, const act_q8 *a,
                                 float *y, int64_t n_out) {
    const int vbmi = is4 && BFP_GEMV_VBMI && __builtin_cpu_supports("avx512vbmi");
    const uint8_t *group = pn.exps; /* its first panel: the group's start */
    const int il = nt > 1 && a->il == nt, l2 = q35_kernels_prefetch_l2();
    /* the exponent add where the tokens' d are normal (rarely not: a block of zeros), bfp4 on VBMI cores
     * and bfp8 (where each was measured: bfp8 from L2/L3 on a Zen 4 core, [512, 4096], least of 400
     * calls, three interleaved rounds, 1 / 2 / 4 tokens 4.54-4.56 / 3.01-3.04 / 2.30-2.33 -> 4.43-4.51 /
     * 2.86-2.88 / 2.31-2.32 ns per block, token and panel). A group with an all-zero weight block
     * (exponent byte 0) fails the check unless every d is 2^3 or more and is done twice: rare in real
     * weights. */
    const int bias = is4 ? 129 : 133, eadd = BFP_GEMV_EADD && bfp_exps_add_exact(is4, a->xr, bias | bias << 8);
    if (vbmi && eadd && (il ? bfp_gemv_loop(is4, nt, nt, 1, 1, group, n_in, a, y, n_out, l2)
                            : bfp_gemv_loop(is4, nt, 0, 1, 1, group, n_in, a, y, n_out, l2)))
        return;
    if (!is4 && eadd && (il ? bfp_gemv_loop(is4, nt, nt, 0, 1, group, n_in, a, y, n_out, l2)
                            : bfp_gemv_loop(is4, nt, 0, 0, 1, group, n_in, a, y, n_out, l2)))
        return;
    if (vbmi && il) bfp_gemv_loop(is4, nt, nt, 1, 0, group, n_in, a, y, n_out, l2);
    else if (vbmi) bfp_gemv_loop(is4, nt, 0, 1, 0, group, n_in, a, y, n_out, l2);
    else if (il) bfp_gemv_loop(is4, nt, nt, 0, 0, group, n_in, a, y, n_out, l2);
    else bfp_gemv_loop(is4, nt, 0, 0, 0, group, n_in, a, y, n_out, l2);
}

/* ---- calls of more than 8 tokens (prefill, batched verify): k-slices decoded once ----
 * Two panels (32 rows) at a time where a call's rows hold both whole,
 * else one. The panels are done in k-slices of BFP_SLICE_BLOCKS blocks
 * (matmul_common.h): a slice of each is decoded once into L1 scratch
 * (bfp_slice_predecode), then every token of the chunk passes over them, 6
 * at a time for two panels and 8 for one (bfp_slice_tile), their partial
 * sums waiting in a->acc between slices. Each block and token is
 * bfp_block_fma's expression, in block order, so the results are bitwise
 * those of bfp_panel_tile. Up to 8 tokens the panel tile decodes each
 * panel once anyway, so the wide path starts above one token group.
 *
 * With two panels each x broadcast feeds two vpdpbusd, and the scale
 * product ws * xd (a power of two times a float) becomes an integer add of
 * the rows' exponents to xd's bits, off the two pipes that run vpdpbusd,
 * the multiply and the FMA on Zen 4/5: 2.5 cycles per block, token and
 * panel there against 3.0 for one panel with the multiply (L1-resident
 * microbenchmark). The add is the product exactly when both it and xd are
 * normal floats, which the tile checks per slice and token group against
 * the slice's exponent bytes and the tokens' d exponents (a->xe); where
 * they are not (a zero or subnormal d, extreme exponent bytes) the group
 * multiplies instead, the same bits either way. */

#define ISA_BFP_WIDE 1
#define ISA_BFP_WIDE_PANELS 2

/* Decodes blocks [b0, b0 + nb) of np panels of one group (pn and the one
 * after it) into a->dec (every block's four groups as signed bytes, the
 * weights' values, 256 bytes per block, bfp4 and bfp8 alike), a->ws (every
 * block's 16 row scales), a->wsb (their exponents, e << 23) and a->wc (-128
 * times each row's sum of the block's values), panel p's at p *
 * BFP_SLICE_BLOCKS blocks. The tile then takes x as the unsigned operand, q
 * + 128 (a->qu): sum (q + 128) w - 128 sum w is the same exact integer as
 * the offset form of bfp_block_fma, with the correction made once per block
 * for all tokens instead of per token. Returns the least and greatest
 * exponent byte of the slice, as lo | hi << 8. */
ALWAYS_INLINE int bfp_slice_predecode(const int is4, const int np, const bfp_panel pn, int64_t n_in, int64_t b0,
                                      int nb, const act_q8 *a) {
    (void)n_in;
    const __m512i ones = _mm512_set1_epi8(1);
    const int unit = BFP_UNIT(is4);
    __m128i e_lo = _mm_set1_epi8((char)0xff), e_hi = _mm_setzero_si128();
    #pragma GCC unroll 2
    for (int p = 0; p < np; p++) {
        const bfp_panel q = {pn.exps + 16 * p, pn.codes + p * BFP_CODE_BYTES(is4), pn.p + p};
        const int at = p * BFP_SLICE_BLOCKS;
        if (b0 == 0) bfp_prefetch_panel(q, is4);
        for (int i = 0; i < nb; i++) {
            __m512i w[4], sum = _mm512_setzero_si512();
            const int64_t b = b0 + i;
            bfp_prefetch_next_slice(q, is4, b);
            bfp_block_decode(is4, q.codes + b * unit, w);
            const __m128i e8 = _mm_loadu_si128((const __m128i *)(q.exps + b * unit));
            e_lo = _mm_min_epu8(e_lo, e8);
            e_hi = _mm_max_epu8(e_hi, e8);
            _mm512_storeu_ps(a->ws + 16 * (at + i), bfp_row_scales(is4, q.exps + b * unit));
            _mm512_storeu_si512(a->wsb + 16 * (at + i),
                                _mm512_slli_epi32(_mm512_sub_epi32(_mm512_cvtepu8_epi32(e8),
                                                                   _mm512_set1_epi32(is4 ? 129 : 133)), 23));
            #pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                /* offset bytes (value + 8 or + 128) to the values */
                const __m512i v = is4 ? _mm512_sub_epi8(w[g], _mm512_set1_epi8(8))
                                      : _mm512_xor_si512(w[g], _mm512_set1_epi8((char)0x80));
                sum = _mm512_dpbusd_epi32(sum, ones, v);
                _mm512_storeu_si512(a->dec + 256 * (at + i) + 64 * g, v);
            }
            _mm512_storeu_si512(a->wc + 16 * (at + i),
                                _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(sum, 7)));
        }
    }
    return bfp_bytes_range(e_lo, e_hi);
}

/* Tokens [t, t + nt) over the slice [b0, b0 + nb) of np panels that
 * bfp_slice_predecode left in a->dec / a->ws / a->wsb / a->wc: per block
 * and panel, four loads of weights, one of row scales and one of the
 * offset correction, held in registers for the tile's tokens, then only
 * each token's x broadcasts (each feeding every panel), one chain of four
 * vpdpbusd per panel from the correction (the tile's tokens are
 * independent chains), a convert and one FMA, the float expression of
 * bfp_block_fma; with add_scales (two panels) the scale product is made by
 * the integer add (above). Two panels: 12 accumulators, 12 weight vectors
 * and the chains in flight, about 28 of the 32 zmm registers; one: 8
 * accumulators and 6 weight vectors. The accumulators start at zero on the
 * first slice and go to y after the last one; in between they wait in
 * a->acc (row t - t0, panel p at 16 p). */
ALWAYS_INLINE void bfp_slice_tile(const int is4, const int np, const int nt, const int add_scales, int64_t n_in,
                                  const act_q8 *a, int64_t t0, int64_t t, int64_t b0, int nb, float *y, int64_t n_out,
                                  int64_t row0, int lo, int hi) {
    const int64_t n_blk = n_in / 16;
    const uint8_t *xu = a->qu + t * n_in;
    const float *xd = a->d + t * n_blk;
    float *pacc = a->acc + 16 * np * (t - t0);
    __m512 acc[2][8];
    #pragma GCC unroll 2
    for (int p = 0; p < np; p++)
        #pragma GCC unroll 8
        for (int j = 0; j < nt; j++) acc[p][j] = b0 ? _mm512_loadu_ps(pacc + 16 * (np * j + p)) : _mm512_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const int64_t b = b0 + i;
        __m512i w[2][4], wc[2], wsb[2];
        __m512 ws[2];
        #pragma GCC unroll 2
        for (int p = 0; p < np; p++) {
            const int at = p * BFP_SLICE_BLOCKS + i;
            #pragma GCC unroll 4
            for (int g = 0; g < 4; g++) w[p][g] = _mm512_loadu_si512(a->dec + 256 * at + 64 * g);
            if (add_scales) wsb[p] = _mm512_loadu_si512(a->wsb + 16 * at);
            else ws[p] = _mm512_loadu_ps(a->ws + 16 * at);
            wc[p] = _mm512_loadu_si512(a->wc + 16 * at);
        }
        #pragma GCC unroll 8
        for (int j = 0; j < nt; j++) {
            const int8_t *xb = (const int8_t *)xu + j * n_in + 16 * b;
            __m512i d[2];
            #pragma GCC unroll 2
            for (int p = 0; p < np; p++) d[p] = wc[p];
            #pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                const __m512i xv = bcast_x4(xb, g);
                #pragma GCC unroll 2
                for (int p = 0; p < np; p++) d[p] = _mm512_dpbusd_epi32(d[p], xv, w[p][g]);
            }
            if (add_scales) {
                int32_t xbits;
                memcpy(&xbits, xd + j * n_blk + b, 4);
                #pragma GCC unroll 2
                for (int p = 0; p < np; p++)
                    acc[p][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d[p]),
                                                _mm512_castsi512_ps(_mm512_add_epi32(wsb[p], _mm512_set1_epi32(xbits))),
                                                acc[p][j]);
            } else {
                #pragma GCC unroll 2
                for (int p = 0; p < np; p++) acc[p][j] = bfp_dot_fma(d[p], ws[p], xd[j * n_blk + b], acc[p][j]);
            }
        }
    }
    if (b0 + nb < n_blk) {
        #pragma GCC unroll 2
        for (int p = 0; p < np; p++)
            #pragma GCC unroll 8
            for (int j = 0; j < nt; j++) _mm512_storeu_ps(pacc + 16 * (np * j + p), acc[p][j]);
    } else {
        #pragma GCC unroll 2
        for (int p = 0; p < np; p++)
            bfp_store(nt, acc[p], y + t * n_out + row0 + 16 * p, n_out, np == 1 ? BFP_ROWS_MASK(lo, hi) : 0xffff);
    }
}

/* Tokens [t0, t1) over one slice of np panels (matmul_driver.inc's
 * bfp_wide_panel walks the slices): groups of 6 (two panels) or 8 (one),
 * then of 4, 2 and 1 (a token's results do not depend on its group). */
ALWAYS_INLINE void bfp_slice_tokens(const int is4, const int np, int erange, const bfp_panel pn, int64_t n_in,
                                    const act_q8 *a, int64_t t0, int64_t t1, int64_t b0, int nb, float *y,
                                    int64_t n_out, int64_t row0, int lo, int hi) {
#define BFP_SLICE_GROUP(nt)                                                                                          \
    do {                                                                                                             \
        if (np == 2 && bfp_scales_add(is4, a, t, nt, erange))                                                        \
            bfp_slice_tile(is4, np, nt, 1, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi);                          \
        else                                                                                                         \
            bfp_slice_tile(is4, np, nt, 0, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi);                          \
        t += nt;                                                                                                     \
    } while (0)
    const int group = np == 2 ? 6 : 8;
    int64_t t = t0;
    while (t + group <= t1) BFP_SLICE_GROUP(group);
    if (t + 4 <= t1) BFP_SLICE_GROUP(4);
    if (t + 2 <= t1) BFP_SLICE_GROUP(2);
    if (t < t1) BFP_SLICE_GROUP(1);
#undef BFP_SLICE_GROUP
    (void)pn;
}

/* ---- F32 / F16 / BF16 weights ---- */

#define ISA_FLOAT_NR 4
#define ISA_VEC __m512i
#define ISA_VEC_ADD64(a, b) _mm512_add_epi64(a, b)

#define ISA_FLOAT_NT 3

/* 16 weights from element i of a row, widened to fp32; lanes outside m read nothing. */
ALWAYS_INLINE __m512 load_w16(const q35_dtype dt, const void *row, int64_t i, __mmask16 m) {
    if (dt == Q35_DT_F32) return _mm512_maskz_loadu_ps(m, (const float *)row + i);
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)row + i);
    if (dt == Q35_DT_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

#ifdef Q35_KERNELS_BF16
/* 32 bf16 from p, the lanes outside m zero. */
ALWAYS_INLINE __m512bh load_bf16x32(const uint16_t *p, __mmask32 m) {
    __m512i v = _mm512_maskz_loadu_epi16(m, p);
    __m512bh r;
    memcpy(&r, &v, sizeof r);
    return r;
}

/* 32 inputs of x from element i rounded to bf16 (nearest even, denormals
 * to zero), in element order like the weights; lanes outside m zero. */
ALWAYS_INLINE __m512bh load_x_bf16x32(const float *x, int64_t i, __mmask32 m) {
    return _mm512_cvtne2ps_pbh(_mm512_maskz_loadu_ps((__mmask16)(m >> 16), x + i + 16),
                               _mm512_maskz_loadu_ps((__mmask16)m, x + i));
}

/* float_tile for BF16 weights with vdpbf16ps: lane j of an accumulator
 * sums the input pairs 32c + 2j, 32c + 2j + 1 for c in order, then the 16
 * lanes are added (the same for every row and token whatever the tile).
 * 4 rows x 3 tokens are 12 independent accumulator chains, enough to hide
 * the instruction's latency without splitting k; each token's 32 inputs
 * are converted once per 4 rows. */
ALWAYS_INLINE void bf16_dot_tile(const int nr, const int nt, const char *w0, size_t row_bytes, const float *x,
                                 int64_t n_in, int64_t t0, float *y, int64_t n_out, int64_t o) {
    __m512 acc[ISA_FLOAT_NR][ISA_FLOAT_NT];
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[r][t] = _mm512_setzero_ps();
    const float *xt0 = x + t0 * n_in;
    for (int64_t i = 0; i < n_in; i += 32) { /* the last 32 masked */
        __mmask32 m = n_in - i >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (n_in - i)) - 1);
        __m512bh w[ISA_FLOAT_NR];
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) w[r] = load_bf16x32((const uint16_t *)(w0 + (size_t)r * row_bytes) + i, m);
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m512bh xb = load_x_bf16x32(xt0 + t * n_in, i, m);
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], w[r], xb);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) y[(t0 + t) * n_out + o + r] = _mm512_reduce_add_ps(acc[r][t]);
}
#endif

/* Rows [o, o + nr) for tokens [t0, t0 + nt); dt, nr, nt constant after inlining. */
ALWAYS_INLINE void float_tile(const q35_dtype dt, const int nr, const int nt, const char *w0, size_t row_bytes,
                              const float *x, int64_t n_in, int64_t t0, float *y, int64_t n_out, int64_t o) {
#ifdef Q35_KERNELS_BF16
    if (dt == Q35_DT_BF16) {
        bf16_dot_tile(nr, nt, w0, row_bytes, x, n_in, t0, y, n_out, o);
        return;
    }
#endif
    /* Two interleaved halves of k (u) give enough independent FMA chains
     * for small tiles, and every row and token is summed in the same order
     * whatever the tile: results do not depend on n_tok or on [o0, o1). */
    const int nu = 2;
    __m512 acc[2][ISA_FLOAT_NR][ISA_FLOAT_NT];
    #pragma GCC unroll 8
    for (int u = 0; u < nu; u++)
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            #pragma GCC unroll 8
            for (int t = 0; t < nt; t++) acc[u][r][t] = _mm512_setzero_ps();
    const float *xt0 = x + t0 * n_in;
    int64_t i = 0;
    for (; i + 16 * nu <= n_in; i += 16 * nu) {
        #pragma GCC unroll 8
        for (int u = 0; u < nu; u++) {
            __m512 w[ISA_FLOAT_NR];
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) w[r] = load_w16(dt, w0 + (size_t)r * row_bytes, i + 16 * u, 0xffff);
            #pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                __m512 xv = _mm512_loadu_ps(xt0 + t * n_in + i + 16 * u);
                #pragma GCC unroll 8
                for (int r = 0; r < nr; r++) acc[u][r][t] = _mm512_fmadd_ps(w[r], xv, acc[u][r][t]);
            }
        }
    }
    for (; i < n_in; i += 16) { /* the rest, 16 at a time, the last one masked */
        __mmask16 m = n_in - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n_in - i)) - 1);
        __m512 w[ISA_FLOAT_NR];
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++) w[r] = load_w16(dt, w0 + (size_t)r * row_bytes, i, m);
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            __m512 xv = _mm512_maskz_loadu_ps(m, xt0 + t * n_in + i);
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) acc[0][r][t] = _mm512_fmadd_ps(w[r], xv, acc[0][r][t]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++)
            y[(t0 + t) * n_out + o + r] =
                _mm512_reduce_add_ps(nu == 2 ? _mm512_add_ps(acc[0][r][t], acc[nu - 1][r][t]) : acc[0][r][t]);
}

#include "matmul_driver.inc"

/* kernels.h's gemm_f32: register tiles of 8 rows of A by 32 columns of B
 * (two vectors, masked at the right edge), each C element one FMA chain
 * over k; a 32-column panel of B stays in cache for every row tile. */
ALWAYS_INLINE void gemm_tile(const int mr, float *C, size_t ldc, const float *A, size_t lda, const float *B,
                             size_t ldb, int64_t K, __mmask16 m0, __mmask16 m1) {
    __m512 acc[8][2];
    #pragma GCC unroll 8
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m512 b0 = _mm512_maskz_loadu_ps(m0, B + (size_t)k * ldb), b1 = _mm512_maskz_loadu_ps(m1, B + (size_t)k * ldb + 16);
        #pragma GCC unroll 8
        for (int r = 0; r < mr; r++) {
            const __m512 a = _mm512_set1_ps(A[(size_t)r * lda + k]);
            acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < mr; r++) {
        _mm512_mask_storeu_ps(C + (size_t)r * ldc, m0, acc[r][0]);
        _mm512_mask_storeu_ps(C + (size_t)r * ldc + 16, m1, acc[r][1]);
    }
}

static void gemm_f32(float *C, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb, int64_t M,
                     int64_t N, int64_t K) {
    for (int64_t n0 = 0; n0 < N; n0 += 32) {
        const int nc = N - n0 < 32 ? (int)(N - n0) : 32;
        const __mmask16 m0 = nc >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << nc) - 1);
        const __mmask16 m1 = nc >= 32 ? (__mmask16)0xffff : nc > 16 ? (__mmask16)((1u << (nc - 16)) - 1) : 0;
        for (int64_t r0 = 0; r0 < M; r0 += 8) {
            float *c = C + (size_t)r0 * ldc + n0;
            const float *a = A + (size_t)r0 * lda, *b = B + n0;
            DRIVER_CASES_1_TO_8(8, M - r0 < 8 ? (int)(M - r0) : 8, gemm_tile(n_, c, ldc, a, lda, b, ldb, K, m0, m1))
        }
    }
}

/* ---- attention (attend_driver.inc over 16-float vectors, four keys per score tile) ---- */

#define AV __m512
#define AV_N 16
#define av_zero() _mm512_setzero_ps()
#define av_set1(f) _mm512_set1_ps(f)
#define av_load(p) _mm512_loadu_ps(p)
#define av_store(p, v) _mm512_storeu_ps((p), (v))
#define av_fmadd(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#define av_fnmadd(a, b, c) _mm512_fnmadd_ps((a), (b), (c))
/* The value tiles' weight as vfmadd231ps's {1to16} memory operand: GCC keeps a broadcast of its own for a
 * weight that feeds two FMAs, which on a Zen 4 core took the value pass's pipes too (one thread's 8-bit
 * attention at 8k keys 45.7-46.4 -> 42.7-42.8, at 32k 46.6-46.7 -> 43.4-44.0 ns per key and KV head, interleaved,
 * medians of 9) */
ALWAYS_INLINE __m512 av_fmadd_bcast_(const float *p, __m512 b, __m512 c) {
#ifdef Q35_AVX512_EMU /* tests/emu/avx512_emu.h: c + b * (*p), with the intrinsics */
    c = _mm512_fmadd_ps(b, _mm512_set1_ps(*p), c);
#else
    __asm__("vfmadd231ps %2%{1to16%}, %1, %0" : "+v"(c) : "v"(b), "m"(*p));
#endif
    return c;
}
#define av_fmadd_bcast(p, b, c) av_fmadd_bcast_((p), (b), (c))
#define av_round(v) _mm512_roundscale_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define av_add(a, b) _mm512_add_ps((a), (b))
#define av_sub(a, b) _mm512_sub_ps((a), (b))
#define av_mul(a, b) _mm512_mul_ps((a), (b))
#define av_max(a, b) _mm512_max_ps((a), (b))
#define av_hsum(v) _mm512_reduce_add_ps(v)
#define av_hmax(v) _mm512_reduce_max_ps(v)
/* vscalefps: p 2^n exactly; 0 where x is below the range */
#define av_ldexp_or_zero(p, n, x) \
    _mm512_maskz_scalef_ps(_mm512_cmp_ps_mask((x), _mm512_set1_ps(ATT_EXP_LO), _CMP_GE_OQ), (p), (n))
/* The 8-bit cache's integer scores (attend_q8.h): a key's 64-code vectors (a last 32 masked), made
 * unsigned by adding 128 (xor 0x80), against the query's signed codes with vpdpbusd, from -128 times the
 * query's lane sums, so each lane ends at its exact share of one block's dot product (lane l: block
 * l % nb). */
ALWAYS_INLINE __m512i att_q8_lanes(const att_q8_query *qq, const int8_t *kc, int32_t HD) {
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    __m512i acc = _mm512_load_si512(qq->corr);
    int32_t j = 0;
    for (; j + 64 <= HD; j += 64)
        acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(_mm512_loadu_si512(kc + j), x80), _mm512_load_si512(qq->c + j));
    if (j < HD) { /* the last 32 codes into lanes 0-7, the rest 128 x 0 */
        const __mmask64 m = ((__mmask64)1 << (HD - j)) - 1;
        acc = _mm512_dpbusd_epi32(acc, _mm512_xor_si512(_mm512_maskz_loadu_epi8(m, kc + j), x80),
                                  _mm512_maskz_loadu_epi8(m, qq->c + j));
    }
    return acc;
}

/* q35_kv_q8_score_sum of a key's block dots: for 8 blocks in vectors (lanes b + b+4, b+2, b+1, as its tree) */
ALWAYS_INLINE float att_q8_score(const att_q8_query *qq, const uint8_t *row, int32_t HD, int32_t nb) {
    const __m512i acc = att_q8_lanes(qq, (const int8_t *)(row + sizeof(float) * (size_t)nb), HD);
    if (nb == 8) {
        const __m256i I = _mm256_add_epi32(_mm512_castsi512_si256(acc), _mm512_extracti64x4_epi64(acc, 1));
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(I),
                                       _mm256_mul_ps(_mm256_load_ps(qq->d), _mm256_loadu_ps((const float *)row)));
        __m128 s = _mm_add_ps(_mm256_castps256_ps128(t), _mm256_extractf128_ps(t, 1));
        s = _mm_add_ps(s, _mm_movehl_ps(s, s));
        return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
    }
    float kd[8];
    memcpy(kd, row, sizeof(float) * (size_t)nb);
    if (nb == 1) return (float)_mm512_reduce_add_epi32(acc) * (qq->d[0] * kd[0]);
    int32_t lanes[16], I[8] = {0};
    _mm512_storeu_si512(lanes, acc);
    for (int l = 0; l < 16; l++) I[l & (nb - 1)] += lanes[l]; /* nb 2 or 4 */
    return q35_kv_q8_score_sum(I, qq->d, kd, nb);
}

/* 4 keys x 4 heads with 8 blocks (so HD 256): each head's lanes folded to its 8 block sums (two heads per vector),
 * then the tree across 128-bit quarters (b + 4), and over the 4 keys at once (b + 2, b + 1): lane 4g + i
 * of the last vector is head g's score of key i, att_q8_score's bits. Two keys' 8 chains of vpdpbusd go
 * chunk by chunk side by side rather than one key's 4 after the other's (each chain's chunks in the same
 * order, so the same sums): one thread's attention in L2 (4 heads of 256, 1024 keys, least of 800 calls,
 * ten interleaved rounds on a Zen 4 core) 28.6-29.4 -> 27.8-28.3 ns per key. */
static inline void att_q8_tile_4x4(const att_q8_query *qq, const uint8_t *k, size_t kv_stride, int32_t p0,
                                   float scale, float *s, size_t n_keys) {
    const __m512 qd01 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(qq[0].d)), _mm256_load_ps(qq[1].d), 1);
    const __m512 qd23 = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_load_ps(qq[2].d)), _mm256_load_ps(qq[3].d), 1);
    __m512 w[4];
    /* the four heads' codes stay in 16 registers for the 4 keys */
    __m512i qc[4][4];
    #pragma GCC unroll 4
    for (int j = 0; j < 4; j++)
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) qc[g][j] = _mm512_load_si512(qq[g].c + 64 * j);
    __m512i A[4][4];
    const __m512i x80 = _mm512_set1_epi8((char)0x80);
    #pragma GCC unroll 2
    for (int i0 = 0; i0 < 4; i0 += 2) {
        #pragma GCC unroll 2
        for (int i = i0; i < i0 + 2; i++)
            #pragma GCC unroll 4
            for (int g = 0; g < 4; g++) A[i][g] = _mm512_load_si512(qq[g].corr);
        #pragma GCC unroll 4
        for (int j = 0; j < 4; j++)
            #pragma GCC unroll 2
            for (int i = i0; i < i0 + 2; i++) {
                const int8_t *kc = (const int8_t *)(k + (size_t)(p0 + i) * kv_stride + 32);
                const __m512i kx = _mm512_xor_si512(_mm512_loadu_si512(kc + 64 * j), x80);
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) A[i][g] = _mm512_dpbusd_epi32(A[i][g], kx, qc[g][j]);
            }
    }
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        const uint8_t *row = k + (size_t)(p0 + i) * kv_stride;
        const __m512i a0 = A[i][0], a1 = A[i][1], a2 = A[i][2], a3 = A[i][3];
        const __m512i P = _mm512_add_epi32(_mm512_shuffle_i32x4(a0, a1, _MM_SHUFFLE(1, 0, 1, 0)),
                                           _mm512_shuffle_i32x4(a0, a1, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m512i Q = _mm512_add_epi32(_mm512_shuffle_i32x4(a2, a3, _MM_SHUFFLE(1, 0, 1, 0)),
                                           _mm512_shuffle_i32x4(a2, a3, _MM_SHUFFLE(3, 2, 3, 2)));
        const __m512 kd = _mm512_broadcast_f32x8(_mm256_loadu_ps((const float *)row));
        const __m512 tP = _mm512_mul_ps(_mm512_cvtepi32_ps(P), _mm512_mul_ps(qd01, kd));
        const __m512 tQ = _mm512_mul_ps(_mm512_cvtepi32_ps(Q), _mm512_mul_ps(qd23, kd));
        w[i] = _mm512_add_ps(_mm512_shuffle_f32x4(tP, tQ, _MM_SHUFFLE(2, 0, 2, 0)),
                             _mm512_shuffle_f32x4(tP, tQ, _MM_SHUFFLE(3, 1, 3, 1)));
    }
    const __m512 x01 = _mm512_add_ps(_mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(w[0], w[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 x23 = _mm512_add_ps(_mm512_shuffle_ps(w[2], w[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm512_shuffle_ps(w[2], w[3], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m512 h = _mm512_mul_ps(_mm512_add_ps(_mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(2, 0, 2, 0)),
                                                 _mm512_shuffle_ps(x01, x23, _MM_SHUFFLE(3, 1, 3, 1))),
                                   _mm512_set1_ps(scale));
    _mm_storeu_ps(s, _mm512_castps512_ps128(h));
    _mm_storeu_ps(s + n_keys, _mm512_extractf32x4_ps(h, 1));
    _mm_storeu_ps(s + 2 * n_keys, _mm512_extractf32x4_ps(h, 2));
    _mm_storeu_ps(s + 3 * n_keys, _mm512_extractf32x4_ps(h, 3));
}

/* The 8-bit cache's values (kernels.h) two keys at a time over 32 columns: vpmovsxbw of each key's 32
 * codes, vpshufd to the column order 0 1 4 5 2 3 6 7 in each 8, then vpunpck{l,h}wd to (key, next key)
 * pairs of one column per 32-bit lane, lane l of the first vector column c(l) = 4 (l / 2) + l % 2 and of
 * the second c(l) + 2, so that lane l of both is in block l / 2 (& (nb - 1)) and one vector of the pair's
 * weights u serves both: vpdpwssd adds 32 products an instruction where the float tile took 16 an FMA and
 * its codes a widening, a convert and a scale multiply per 16. The in-lane shuffles run beside vpdpwssd
 * on a Zen 4 core, where the two-source vpermt2w that made the pairs before shares its pipe: a pair's
 * 32 columns (8 vpdpwssd, the codes' loads and widening) took 9.8 cycles in a loop alone, 8.0 now,
 * with each weight vector loaded once into a register (GCC took it as a memory operand of both
 * vpdpwssd, and a 64-byte load a cycle is the limit there). One thread's attention, 4 heads of 256 over
 * 1024 keys in L2 (least of 1000 calls, three interleaved rounds): 30.4-30.7 -> 28.7-29.1 ns per key. */
typedef __m512i att_q8_wvec;
#define ATT_Q8_VT 32
#define ATT_Q8_WT 1
typedef struct {
    __m512i sidx; /* a pair's scales by lane: lane i < 8 block i % nb of the first key, 8 + i of the second */
    __m512i uidx; /* the pair's u (int32 lanes as above) to int16 pairs by lane */
    __m512i oidx[2]; /* the sums back to column order (both halves) */
    __mmask16 bm;
} att_q8_vctx;
ALWAYS_INLINE void att_q8_value_init(att_q8_vctx *c, int32_t nb) {
    int32_t si[16], oi[2][16];
    int16_t ui[32];
    for (int i = 0; i < 8; i++) si[i] = i & (nb - 1), si[8 + i] = 16 + (i & (nb - 1));
    for (int l = 0; l < 16; l++)
        ui[2 * l] = (int16_t)(2 * ((l / 2) & (nb - 1))), ui[2 * l + 1] = (int16_t)(2 * (8 + ((l / 2) & (nb - 1))));
    for (int col = 0; col < 32; col++) oi[col / 16][col % 16] = (col % 4 < 2 ? 0 : 16) + 2 * (col / 4) + col % 2;
    c->sidx = _mm512_loadu_si512(si), c->uidx = _mm512_loadu_si512(ui);
    for (int h = 0; h < 2; h++) c->oidx[h] = _mm512_loadu_si512(oi[h]);
    c->bm = (__mmask16)((1u << nb) - 1);
}
/* Pass 1: each pair's products w v_d by lane (blocks repeat in the lanes, an odd last pair's second
 * weight is 0) and their largest per head, which is M (kernels.h); pass 2: u and the weight vectors. */
ALWAYS_INLINE void att_q8_value_prep(const int ng, const att_q8_vctx *c, const float *w, size_t ss,
                                     const uint8_t *v, size_t kv_stride, int32_t c0, int32_t nk, __m512i *wt,
                                     float *S) {
    __m512 W[Q35_KV_Q8_VKEYS / 2][4], mx[4];
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) mx[g] = _mm512_setzero_ps();
    for (int32_t j = 0; 2 * j < nk; j++) {
        const int32_t p = c0 + 2 * j, two = 2 * j + 1 < nk;
        const __m512 sp = _mm512_permutex2var_ps(_mm512_maskz_loadu_ps(c->bm, v + (size_t)p * kv_stride), c->sidx,
                                                 _mm512_maskz_loadu_ps(c->bm, v + (size_t)(p + two) * kv_stride));
        #pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            const float *wg = w + (size_t)g * ss;
            const __m512 wp =
                _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(wg[p]), _mm512_set1_ps(two ? wg[p + 1] : 0.0f));
            W[j][g] = _mm512_mul_ps(wp, sp);
            mx[g] = _mm512_max_ps(mx[g], W[j][g]);
        }
    }
    __m512 iv[4];
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        float inv;
        q35_kv_q8_value_scales(_mm512_reduce_max_ps(mx[g]), &inv, &S[g]);
        iv[g] = _mm512_set1_ps(inv);
    }
    for (int32_t j = 0; 2 * j < nk; j++)
        #pragma GCC unroll 4
        for (int g = 0; g < ng; g++) /* 0 <= u <= 32767: an int32 lane's low int16 is u */
            wt[4 * j + g] = _mm512_permutexvar_epi16(c->uidx, _mm512_cvtps_epi32(_mm512_mul_ps(W[j][g], iv[g])));
}

/* a value row's 32 codes from p as int16, in the column order 0 1 4 5 2 3 6 7 of each 8 */
ALWAYS_INLINE __m512i att_q8_codes_0145(const uint8_t *p) {
    return _mm512_shuffle_epi32(_mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)p)), 0xd8);
}

ALWAYS_INLINE void att_q8_value_tile(const int ng, const att_q8_vctx *c, float *o, size_t o_stride,
                                     const uint8_t *v, size_t kv_stride, int32_t c0, int32_t nk, int32_t d0,
                                     int32_t nb, const __m512i *wt, const float *S) {
    __m512i acc[4][2];
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) acc[g][0] = acc[g][1] = _mm512_setzero_si512();
    const uint8_t *cv = v + sizeof(float) * (size_t)nb + d0 + (size_t)c0 * kv_stride;
    for (int32_t j = 0; 2 * j < nk; j++, cv += 2 * kv_stride) {
        const __m512i a = att_q8_codes_0145(cv), b = att_q8_codes_0145(cv + (2 * j + 1 < nk ? kv_stride : 0));
        const __m512i L = _mm512_unpacklo_epi16(a, b), H = _mm512_unpackhi_epi16(a, b);
        #pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            __m512i u = _mm512_load_si512(&wt[4 * j + g]);
#ifndef Q35_AVX512_EMU /* u loaded once, in a register; the sums accumulated in place (else GCC 12 copies each twice) */
            __asm__("" : "+v"(u));
#endif
            acc[g][0] = _mm512_dpwssd_epi32(acc[g][0], L, u);
            acc[g][1] = _mm512_dpwssd_epi32(acc[g][1], H, u);
#ifndef Q35_AVX512_EMU
            __asm__("" : "+v"(acc[g][0]), "+v"(acc[g][1]));
#endif
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        float *og = o + (size_t)g * o_stride + d0;
        const __m512 sg = _mm512_set1_ps(S[g]);
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m512i I = _mm512_permutex2var_epi32(acc[g][0], c->oidx[h], acc[g][1]); /* column order */
            _mm512_storeu_ps(og + 16 * h, _mm512_fmadd_ps(_mm512_cvtepi32_ps(I), sg, _mm512_loadu_ps(og + 16 * h)));
        }
    }
}

#define ATT_Q8_TILE att_q8_tile_4x4
#define ATT_Q8_HDM 32
#define ATT_KP 4
#define ATT_FN attend_heads_isa
#define ATT_ROWS_FN attend_rows_isa
#define ATT_ROWS_Q8_FN attend_rows_q8_isa
#define ATT_LINKAGE static
#define ATT_PF_L2() q35_kernels_prefetch_l2()
#include "attend_driver.inc"

/* Row fetches are one row per token (embeddings): the reference is fast enough. */
#ifdef Q35_KERNELS_BF16
const q35_kernels q35_kernels_avx512bf16 = {"avx512bf16", matmul_n_isa, q35_get_row_ref,
                                             q35_gdn_recurrent_avx2, q35_gdn_chunked_avx2, attend_heads_isa,
                                             read_stream, attend_rows_isa, gemm_f32,
                                             q35_softmax_rows_avx2, attend_rows_q8_isa,
                                             q35_silu_mul_avx2, q35_sigmoid_mul_avx2,
                                         q35_conv_silu_avx2, q35_rmsnorm1p_avx2};
#else
const q35_kernels q35_kernels_avx512 = {"avx512", matmul_n_isa, q35_get_row_ref, q35_gdn_recurrent_avx2,
                                         q35_gdn_chunked_avx2, attend_heads_isa, read_stream, attend_rows_isa,
                                         gemm_f32, q35_softmax_rows_avx2, attend_rows_q8_isa,
                                         q35_silu_mul_avx2, q35_sigmoid_mul_avx2,
                                         q35_conv_silu_avx2, q35_rmsnorm1p_avx2};
#endif
