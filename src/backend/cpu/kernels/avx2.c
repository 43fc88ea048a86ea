/* avx2.c: matmul kernels for AVX2 + FMA + F16C (compiled with those flags
 * only; dispatch.c checks cpuid before anything here runs).
 *
 * BFP4 / BFP8 weights (16-row panels, bfp.h): x is quantized per 16-value
 * block to int8 into per-thread scratch, the tokens of a call side by side
 * block by block (act_q8.il: all of a small batch's, a prompt's four by
 * four), so that a tile reaches each token's block at a constant offset
 * from one pointer. A weight group (4 inputs x 16 rows) splits into two
 * ymm of 8 rows x 4 inputs, so the integer dot products land in 32-bit
 * lanes, one per row, with no horizontal sums.
 * AVX2 has no vpdpbusd; vpmaddubsw (unsigned x signed bytes, int16 pairs,
 * saturating) and vpmaddwd do the work:
 *   bfp4: codes are stored as value + 8 (0..15, bfp.h), the unsigned operand as they are; products stay
 *         below 2 * 15 * 127, so the four groups of a block add up in int16
 *         before one vpmaddwd; the block starts at -8 * sum(q) to cancel.
 *   bfp8: 255 * 127 pairs would saturate, so the magnitude (<= 127) meets x
 *         with the weight's sign moved onto it (vpsignb).
 * One float FMA per block, half-panel and token applies x's block scale
 * times 2^(E - 127 - (w - 1)), built from two exact powers of two so that
 * every exponent byte works (bfp_scale_fma). The panel tile serves a
 * few tokens, reading and decoding the weights once. Decode (one token)
 * and 2-token steps run a group's four panels block by block
 * (bfp_gemv_groups_tile; two groups side by side, two streams),
 * prefetched ahead, so that decoding overlaps DRAM reads; batched decode
 * too (bfp4 calls of 3-8 tokens, bfp8 of 6-8), in passes of up to four
 * tokens (bfp_batch_tile) or, bfp4's 5-8, all in one pass with each block
 * decoded once (bfp_batch_one_pass); bfp8 calls of 3-5 tokens take the
 * panel tile.
 * Longer calls (prefill, 9 tokens and more) take a panel in k-slices
 * (bfp_wide_panel): each slice is decoded once into L1 scratch
 * (bfp_slice_predecode) and every token passes over it four at a time
 * (bfp_slice_tile). Every tile forms each block's exact integer dot and
 * ends the block with bfp_scale_fma, so a token's outputs are bitwise the
 * same in any batch.
 *
 * F32 / F16 / BF16 weights: rows widened to fp32 in registers, 4 rows x 1
 * token x 2 halves of k of accumulators, x kept in fp32; each token passes
 * over the 4 rows (hot in L1) in turn. */
#include "formats/bfp.h"
#include "backend/cpu/kernels/kernels.h"
#include "base/util.h"

#include <immintrin.h>

/* Software prefetches of bfp weights go to L2 here (every bfp tile of this file; the k-slice
 * path's own next-slice prefetch excepted): on a Zen 3 core (no AVX-512) the one-token GEMV
 * read 0.87-0.89 (bfp8) and 0.8-0.9 (bfp4) of a plain read with T0 prefetches 4 / 16 units ahead,
 * 0.99 and 0.96 with T2 prefetches 1 / 4 units ahead (two streams, bfp_gemv_groups_tile;
 * [12288, 4096] x 16 from DRAM, interleaved, medians of 9); qwen35 speed -t 1 / -t 2, interleaved:
 * 79-83% / 78-84% of the measured read -> 80-90% / 86-96%. */
#define BFP_PREFETCH_HINT _MM_HINT_T2
#include "backend/cpu/kernels/matmul_common.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The tiles' small loops over tokens, rows and groups must unroll fully so
 * that their arrays of vectors live in registers; -O2 alone keeps them as
 * loops over stack arrays. */

#define ISA_BFP_NT 4

/* ---- activations quantized per block of 16 ---- */

ALWAYS_INLINE float hmax8(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

/* Calls of this many tokens or more take the wide path (bfp_wide_panel), but those of up to
 * BFP_BATCH_TOKENS_MAX take the batch tile (so here the wide path sees prompts and their token
 * chunks, a last chunk of 4-8 among them). On
 * a hot [512, 4096] matrix, 1 thread: bfp4's panel tile was as fast at 3
 * tokens and faster at 2 (40 vs 44-48 us per token), the wide path faster
 * from 4 on (31-33 vs 39-47 us per token at 5-6); bfp8's panel tile (its
 * decode is one AND) was faster at 4 tokens (98-99 vs 89-91 GFLOP/s) and
 * as fast at 8. */
#define BFP_WIDE_MIN_TOKENS(is4) ((is4) ? 4 : 8)
/* Calls of BFP_BATCH_TOKENS_MIN(is4) to BFP_BATCH_TOKENS_MAX tokens take bfp_batch_tile (below). For
 * bfp8 ([12288, 4096] x 8 from DRAM, interleaved, medians of 9-11, cost against one token on one / two
 * threads) the panel tile was as fast at 4-5 tokens (4: 1.70 / 1.43-1.47 against 1.58-1.60 / 1.48-1.49;
 * 5: 2.18 / 1.85-1.88 against 2.26-2.34 / 1.99-2.03), the batch tile from 6 (6: 2.51 /
 * 2.12 -> 2.01 / 2.17; 7: 2.75 / 2.28 -> 2.28 / 2.39: faster on one thread, about as fast on two) and at
 * 8, where the wide path took them, 4.44-4.69
 * / 3.18-3.57 -> 2.47-3.61 / 2.50-2.77. */
#define BFP_BATCH_TOKENS_MIN(is4) ((is4) ? 3 : 6)
#define BFP_BATCH_TOKENS_MAX 8

static int act_quantize(act_q8 *a, const float *x, int64_t n_tok, int64_t n_in) {
    /* the tokens side by side block by block (act_q8.il), so that a tile finds each token's block at
     * a constant offset from one pointer: a small batch's all together, a prompt's four by four as the
     * wide path and the panel tile take them (the last four's missing tokens left as holes). Token by
     * token, the batch tile kept the tokens' offsets in general registers, reloaded from the stack,
     * and the slice tile a pointer per token. [12288, 4096] BFP4 from DRAM on a Zen 3 VM, interleaved
     * (best of 6, 6 rounds): two threads 4 / 8 / 64 / 128 tokens 0.96 / 0.97 / 0.96 / 0.93 of the
     * time before, one thread 0.90 / 0.95 / 0.96 (2 and 3 tokens within the noise) */
    const int il = n_tok < 2 ? 0 : n_tok <= BFP_BATCH_TOKENS_MAX ? (int)n_tok : ISA_BFP_NT;
    const size_t n_row = (size_t)(n_in / 16), n_blk = (size_t)(il ? (n_tok + il - 1) / il * il : n_tok) * n_row;
    /* the wide path's scratch from BFP_WIDE_MIN_TOKENS on */
    if (!act_alloc(a, n_blk, n_tok >= BFP_WIDE_MIN_TOKENS(1) ? (size_t)n_tok : 0)) return 0;
    int8_t *q = a->q;
    float *d = a->d;
    int32_t *o4 = a->o4;
    a->il = il;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t t = 0; t < (size_t)n_tok; t++) {
        const size_t at = (size_t)act_at(a, (int64_t)t, (int64_t)n_row), step = (size_t)act_step(a);
        for (size_t b = 0, j = t * n_row; b < n_row; b++, j++) {
            const size_t i = at + b * step; /* where token t's block b goes */
            __m256 v0 = _mm256_loadu_ps(x + 16 * j), v1 = _mm256_loadu_ps(x + 16 * j + 8);
            float amax = hmax8(_mm256_max_ps(_mm256_and_ps(v0, abs_mask), _mm256_and_ps(v1, abs_mask)));
            __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, inv)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, inv));
            /* packs work per 128-bit lane: restore element order after each */
            __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xd8);
            __m256i b8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(w16, w16), 0x08);
            __m128i qb = _mm256_castsi256_si128(b8);
            _mm_storeu_si128((__m128i *)(q + 16 * i), qb);
            /* sum of 16 signed bytes: |q + 128| sums with psadbw, minus 16 * 128 */
            __m128i sad = _mm_sad_epu8(_mm_xor_si128(qb, _mm_set1_epi8((char)0x80)), _mm_setzero_si128());
            const int32_t sum = _mm_cvtsi128_si32(sad) + _mm_extract_epi32(sad, 2) - 2048;
            /* bfp4's offset: -4 sum in both int16 halves, where the tiles start their int16 sums */
            o4[i] = (int32_t)((uint32_t)(uint16_t)(-4 * sum) * 0x10001u);
            d[i] = amax / 127.0f;
        }
    }
    if (a->xe) act_exp_ranges(a, n_tok, n_in / 16); /* the wide path's exponent add (decode needs none) */
    return 1;
}

/* 2^(E - bias) for 8 exponent bytes, exact for every E (also when the
 * result is subnormal): the product of two normal powers of two. */
ALWAYS_INLINE __m256 exp_scale8(const uint8_t *e8, int bias) {
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e8));
    __m256i half = _mm256_srli_epi32(e, 1);
    __m256i p1 = _mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127 - 64)), 23);
    __m256i p2 = _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half), _mm256_set1_epi32(127 + 64 - bias)), 23);
    return _mm256_mul_ps(_mm256_castsi256_ps(p1), _mm256_castsi256_ps(p2));
}

/* exp_scale8 where every E >= bias - 126 (the result is a normal float):
 * its exponent field directly, the same value. */
ALWAYS_INLINE __m256 exp_scale8_normal(const uint8_t *e8, int bias) {
    __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)e8));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e, _mm256_set1_epi32(127 - bias)), 23));
}

/* Panel p's rows 8h..8h+7 of the unit at u (a group's block: its four panels' exponents first):
 * their 2^(E - bias), by exp_scale8_normal where the caller found the unit's bytes normal. */
ALWAYS_INLINE __m256 unit_row_scales(const uint8_t *u, int p, int h, int normal, int bias) {
    const uint8_t *e8 = u + 16 * p + 8 * h;
    return normal ? exp_scale8_normal(e8, bias) : exp_scale8(e8, bias);
}

/* Whether the 32 exponent bytes at e32 are all >= lo (exp_scale8_normal serves them). */
ALWAYS_INLINE int exps_at_least(const uint8_t *e32, int lo) {
    const __m256i e = _mm256_loadu_si256((const __m256i *)e32);
    return _mm256_movemask_epi8(_mm256_cmpeq_epi8(_mm256_max_epu8(e, _mm256_set1_epi8((char)lo)), e)) == -1;
}

/* x's four groups of 4 int8 in block b, each broadcast to all lanes (one
 * load-broadcast each, no ALU work). */
ALWAYS_INLINE __m256i bcast_x4(const int8_t *xb, int g) {
    int32_t v;
    memcpy(&v, xb + 4 * g, 4);
    return _mm256_set1_epi32(v);
}

/* 32 bytes of bfp4 codes (one group: 8 rows x 4 inputs, two nibbles per
 * byte, each stored as value + 8: bfp.h) as bytes: w[0] the low nibbles
 * (rows 0-7), w[1] the high. With the codes' sign and magnitude stored, two
 * vpshufb lookups more: in L2 one token's GEMV ran about 20% faster
 * without them. */
ALWAYS_INLINE void bfp4_unpack(const uint8_t *p, __m256i w[2]) {
    const __m256i nib = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_loadu_si256((const __m256i *)p);
    w[0] = _mm256_and_si256(v, nib);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), nib);
}

/* One block's contribution to one token and 8 rows from its exact integer
 * dot products: one FMA with x's block scale times the rows' 2^(E - bias).
 * Every tile ends a block with this expression, so a token's result does
 * not depend on the tile (the integer dot is exact however a tile forms
 * it). */
ALWAYS_INLINE __m256 bfp_scale_fma(__m256i dot, float xd, __m256 ws, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(ws, _mm256_set1_ps(xd)), acc);
}

/* bfp_scale_fma with the scale product made either way: add_scales, w holds the rows' exponents (E -
 * bias) << 23 and ws * xd is their integer add to xd's bits (where exact: the caller's check); else w
 * holds ws, multiplied. The same float either way, so the same FMA and bits. */
ALWAYS_INLINE __m256 bfp_scale_fma_by(const int add_scales, __m256i dot, float xd, __m256i w, __m256 acc) {
    if (!add_scales) return bfp_scale_fma(dot, xd, _mm256_castsi256_ps(w), acc);
    int32_t xbits;
    memcpy(&xbits, &xd, 4);
    return _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_castsi256_ps(_mm256_add_epi32(w, _mm256_set1_epi32(xbits))),
                           acc);
}

/* bfp_scale_fma for the panel and GEMV tiles' sums: bfp4's int16 pairs (weights as value + 8, started at
 * the offset -4 sum(q) in each half, bfp_group_dot) widened by vpmaddwd; bfp8's int32 dot as it is. */
ALWAYS_INLINE __m256 bfp_block_fma(const int is4, __m256i sum, float xd, __m256 ws, __m256 acc) {
    return bfp_scale_fma(is4 ? _mm256_madd_epi16(sum, _mm256_set1_epi16(1)) : sum, xd, ws, acc);
}

/* v, held in a register: GCC otherwise loads a vector shared by two tokens
 * once per token, and reassociates a token's block sums into a tree whose
 * many live products spill. */
ALWAYS_INLINE __m256i in_register(__m256i v) {
    __asm__("" : "+x"(v));
    return v;
}

/* Stores nt tokens' 16 rows (only rows_lo..rows_hi) at y, token stride n_out. */
ALWAYS_INLINE void bfp_store(const int nt, __m256 acc[][2], float *y, int64_t n_out, int rows_lo, int rows_hi) {
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        float *yt = y + t * n_out;
        if (rows_lo == 0 && rows_hi == 16) {
            _mm256_storeu_ps(yt, acc[t][0]);
            _mm256_storeu_ps(yt + 8, acc[t][1]);
        } else {
            float tmp[16];
            _mm256_storeu_ps(tmp, acc[t][0]);
            _mm256_storeu_ps(tmp + 8, acc[t][1]);
            for (int r = rows_lo; r < rows_hi; r++) yt[r] = tmp[r];
        }
    }
}

/* Group g (4 inputs x 16 rows) of the block at cb decoded for
 * bfp_group_dot: bfp4 as value + 8, bfp8 as its magnitude; w[h] holds rows
 * 8h..8h+7. */
ALWAYS_INLINE void bfp_group_decode(const int is4, const uint8_t *cb, int g, __m256i w[2]) {
    if (is4) {
        bfp4_unpack(cb + 32 * g, w);
    } else {
        const __m256i mag7 = _mm256_set1_epi8(0x7f);
        w[0] = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(cb + 64 * g)), mag7);
        w[1] = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(cb + 64 * g + 32)), mag7);
    }
}

/* Adds group g's products with one token's broadcast x group xg to that
 * token's block sums of both halves (int16 for bfp4, int32 for bfp8; g = 0
 * starts them: bfp4's at that token's block offset *o4, -4 sum(q) in both
 * int16 halves of a lane, which vpmaddwd adds back to -8 sum(q)). */
ALWAYS_INLINE void bfp_group_dot(const int is4, const uint8_t *cb, int g, const __m256i w[2], __m256i xg,
                                 const int32_t *o4, __m256i sum[2]) {
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        if (is4) {
            /* value + 8 (<= 15) times |x| (<= 127), pairs: the four groups and the offset fit int16 */
            __m256i p = _mm256_maddubs_epi16(w[h], xg);
            sum[h] = in_register(_mm256_add_epi16(g ? sum[h] : bcast_x4((const int8_t *)o4, 0), p));
        } else {
            /* the weight's sign moves onto x (codes reloaded from L1) */
            __m256i sg = _mm256_loadu_si256((const __m256i *)(cb + 64 * g + 32 * h));
            __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(w[h], _mm256_sign_epi8(xg, sg)), _mm256_set1_epi16(1));
            sum[h] = g ? in_register(_mm256_add_epi32(sum[h], p)) : p;
        }
    }
}

/* y rows [row0, row0 + 16) (those in rows_lo..rows_hi) for tokens
 * [t0, t0 + nt) from one panel; is4 and nt are constants after inlining.
 * Group by group, each token's int16 (bfp4) or int32 (bfp8) block sums of
 * both 8-row halves are updated, so a group's decoded bytes and x's
 * broadcast group are live only briefly and, for decode (nt = 1), every
 * accumulator and constant stays in the 16 ymm registers. */
ALWAYS_INLINE void bfp_panel_tile(const int is4, const int nt, const bfp_panel pn, int64_t n_in, const act_q8 *a,
                                  int64_t t0, float *y, int64_t n_out, int64_t row0, int rows_lo, int rows_hi) {
    const int64_t n_blk = n_in / 16;
    const int unit = BFP_UNIT(is4);
    /* token t0 + t's block b at t * ti + b * bi from t0's block 0 (act_q8.il: t0 .. t0 + nt - 1 in one group) */
    const int64_t at = act_at(a, t0, n_blk), ti = a->il ? 1 : n_blk, bi = act_step(a);
    const int8_t *xq = a->q + 16 * at;
    const float *xd = a->d + at;
    const int32_t *xo = a->o4 + at;
    __m256 acc[ISA_BFP_NT][2];
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    bfp_prefetch_panel(pn, is4);
    for (int64_t b = 0; b < n_blk; b++) {
        const uint8_t *cb = pn.codes + b * unit;
        bfp_prefetch_block(pn, is4, b);
        /* sum[t][h]: token t, rows 8h..8h+7 */
        __m256i sum[ISA_BFP_NT][2];
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256i w[2];
            bfp_group_decode(is4, cb, g, w);
            #pragma GCC unroll 8
            for (int t = 0; t < nt; t++)
                bfp_group_dot(is4, cb, g, w, bcast_x4(xq + 16 * (t * ti + b * bi), g), xo + t * ti + b * bi, sum[t]);
        }
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            __m256 ws = exp_scale8(pn.exps + b * unit + 8 * h, is4 ? 129 : 133);
            #pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                acc[t][h] = bfp_block_fma(is4, sum[t][h], xd[t * ti + b * bi], ws, acc[t][h]);
            }
        }
    }
    bfp_store(nt, acc, y + t0 * n_out + row0, n_out, rows_lo, rows_hi);
}

/* Decode (one or two tokens) over a group's four panels at once, block by
 * block: bfp.h stores them so, unit after unit, one sequential stream, and
 * each unit is asked for BFP_GEMV_PREFETCH_BLOCKS ahead (past the group's
 * end, the next group's first units). Within a block the panels go one
 * after another, each through its four groups into its own int sums, so
 * that for one token only one panel's sums are live beside the eight
 * accumulators (two tokens' sixteen partly wait on the stack). Before,
 * two panels side by side and the group in two passes (the second from
 * L2, the memory idle meanwhile): from DRAM one Zen 5 core read 0.64-0.79
 * of a plain read of the same weights, now 0.95-0.99 (bfp8 0.72 -> 0.87; two
 * threads 0.68 -> 0.91 and 0.74 -> 0.95), the same 31 GB/s in cache
 * ([12288, 4096] x 24, interleaved, medians of 7-9). Each panel's outputs
 * are bfp_panel_tile's for nt = 1, bit for bit (the same integer sums and
 * bfp_block_fma, block by block in order). Prefetches go 4 bfp4 units
 * (2.3 KiB) or 1 bfp8 unit ahead into L2 (BFP_PREFETCH_HINT above); on
 * Zen 5, T0 16 / 4 units ahead measured best (the numbers before). One
 * bfp4 token asks 2 units (1.1 KiB, as far as a bfp8 unit) ahead: on a Zen 4
 * VM with these kernels ([12288, 4096] x 16 from DRAM, interleaved, medians
 * of 9-15) one thread read 0.82-0.83 of a plain read at 4 units and
 * 0.94-0.97 at 2, two threads (rows halved) took 1.03-1.06 and 0.98 times
 * a plain read; two tokens read less at 2 (0.69 -> 0.66), batches the same. */
#define BFP_GEMV_PANELS 4
#define BFP_GEMV_PREFETCH_BLOCKS(is4) ((is4) ? 4 : 1)
#define BFP_GEMV_PREFETCH_BLOCKS_NT(is4, nt) ((is4) && (nt) == 1 ? 2 : BFP_GEMV_PREFETCH_BLOCKS(is4))

/* Two tokens (a speculative step's verify of k = 1, a batch of 2) take it too: [12288, 4096] x 24 from
 * DRAM, interleaved, medians of 7: 0.43 -> 0.63 of a plain read on one thread, 0.59 -> 0.88 on two
 * (before, the one-panel tile, a stride through the units); three tokens gain nothing (0.38 -> 0.41:
 * their sums no longer fit the 16 registers), so they take another tile (bfp4: bfp_batch_tile below;
 * bfp8: the panel tile). */
#define BFP_GEMV_TOKENS 2

/* One token over two groups at once, unit by unit in turn: two sequential streams instead of
 * one. A Zen 3 core (no AVX-512) read one stream of units at 0.80-0.87 of a plain read whatever
 * the decode cost (0.78-0.80 with the arithmetic removed), the hint (T0, T1, T2, NTA) or the
 * distance (4-32 units); two streams read 0.93-0.96 ([12288, 4096] x 16 from DRAM, interleaved,
 * medians of 9-11; plain loads of one line each showed the same, 0.74 for one stream). Each
 * group's sums and FMAs are the one-group pass's, in block order: the same bits.
 * Two tokens too, since x's block is opaque to the compiler per panel (below): before, GCC kept
 * both tokens' broadcast groups live across the eight panels of a block and spilled the sums
 * (in L2 29 -> 40 us for [256, 4096] x 2), so two tokens took one group. On a Zen 4 core with
 * these kernels, [12288, 4096] x 16 from DRAM, interleaved, medians of 15: two tokens on one
 * thread 0.57 -> 0.73 of a plain read (bfp8 0.78 -> 0.96), on two threads (rows halved) 1.75 ->
 * 1.40 times a plain read (bfp8 1.21 -> 0.99); one token and the cost in L2 unchanged. */
#define BFP_GEMV_GROUPS 2
#define BFP_GEMV_GROUPS_TOKENS 2

/* The ng groups from pn's on (each one's first panel: its start), their first `ahead` units asked for. */
ALWAYS_INLINE void bfp_groups_begin(const int is4, const int ng, const bfp_panel pn, int64_t n_blk, int ahead,
                                    const uint8_t *groups[]) {
    #pragma GCC unroll 2
    for (int gi = 0; gi < ng; gi++) {
        groups[gi] = pn.exps + gi * n_blk * BFP_UNIT(is4);
        for (int b = 0; b < ahead; b++) bfp_prefetch_group_unit(groups[gi], is4, b, 0);
    }
}

ALWAYS_INLINE void bfp_gemv_groups_tile(const int is4, const int ng, const int nt, const bfp_panel pn, int64_t n_in,
                                        const act_q8 *a, float *y, int64_t n_out) {
    const int np = BFP_GEMV_PANELS;
    const int64_t n_blk = n_in / 16;
    const int unit = BFP_UNIT(is4), block_bytes = BFP_CODE_BYTES(is4), ahead = BFP_GEMV_PREFETCH_BLOCKS_NT(is4, nt);
    const int bias = is4 ? 129 : 133;
    __m256 acc[BFP_GEMV_GROUPS][BFP_GEMV_PANELS][BFP_GEMV_TOKENS][2];
    #pragma GCC unroll 2
    for (int gi = 0; gi < ng; gi++)
        #pragma GCC unroll 4
        for (int p = 0; p < np; p++)
            #pragma GCC unroll 4
            for (int t = 0; t < nt; t++) acc[gi][p][t][0] = acc[gi][p][t][1] = _mm256_setzero_ps();
    const uint8_t *groups[BFP_GEMV_GROUPS];
    bfp_groups_begin(is4, ng, pn, n_blk, ahead, groups);
    for (int64_t b = 0; b < n_blk; b++) {
        #pragma GCC unroll 2
        for (int gi = 0; gi < ng; gi++) {
            const uint8_t *u = groups[gi] + b * unit;
            bfp_prefetch_group_unit(groups[gi], is4, b + ahead, 0);
            /* the 64 exponent bytes nearly always all give normal scales (E >= 3 for bfp4, 7 for bfp8),
             * which take 2 vector ops a half instead of exp_scale8's 7 (bfp4 in L2: 28-30 -> 34 GB/s) */
            const int normal = exps_at_least(u, bias - 126) && exps_at_least(u + 32, bias - 126);
            #pragma GCC unroll 4
            for (int p = 0; p < np; p++) {
                const uint8_t *cb = u + 64 + p * block_bytes;
                /* two tokens: x's block opaque per panel, loaded again (one token keeps its four
                 * broadcast groups in registers for the block's panels, which measured faster) */
                const int8_t *xb = a->q + 16 * nt * b; /* two tokens: act_q8.il, side by side */
                if (nt > 1) __asm__("" : "+r"(xb));
                __m256i sum[BFP_GEMV_TOKENS][2];
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    __m256i w[2];
                    bfp_group_decode(is4, cb, g, w);
                    #pragma GCC unroll 4
                    for (int t = 0; t < nt; t++)
                        bfp_group_dot(is4, cb, g, w, bcast_x4(xb + 16 * t, g), a->o4 + nt * b + t, sum[t]);
                }
                #pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256 ws = unit_row_scales(u, p, h, normal, bias);
                    #pragma GCC unroll 4
                    for (int t = 0; t < nt; t++)
                        acc[gi][p][t][h] = bfp_block_fma(is4, sum[t][h], a->d[nt * b + t], ws, acc[gi][p][t][h]);
                }
            }
        }
    }
    #pragma GCC unroll 2
    for (int gi = 0; gi < ng; gi++)
        #pragma GCC unroll 4
        for (int p = 0; p < np; p++)
            #pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                float *yp = y + t * n_out + 16 * (np * gi + p);
                _mm256_storeu_ps(yp, acc[gi][p][t][0]);
                _mm256_storeu_ps(yp + 8, acc[gi][p][t][1]);
            }
}

/* The driver's bfp_gemv_tile: one group. */
ALWAYS_INLINE void bfp_gemv_tile(const int is4, const int nt, const bfp_panel pn, int64_t n_in, const act_q8 *a,
                                 float *y, int64_t n_out) {
    bfp_gemv_groups_tile(is4, 1, nt, pn, n_in, a, y, n_out);
}

/* ---- small batches: 3 to 8 tokens (bfp8: 6 to 8) over one group's four panels, block by block ----
 * Read as the one-group decode tile reads them (one sequential stream of units, each asked for
 * BFP_GEMV_PREFETCH_BLOCKS ahead), in passes of at most BFP_BATCH_PASS tokens over the group
 * (bfp8's 6-8 tokens: two, the second from L2; bfp4's 5-8 take bfp_batch_one_pass below). Within a
 * pass a panel's block is decoded group by group once for all its tokens, whose int16 sums (8
 * registers for four) start at the offset
 * -4 sum(q) in each half (a->o4) as the wide path's do; the accumulators (4 panels x 4
 * tokens x 2 halves) wait in L1 between blocks. Each block and token ends in bfp_scale_fma
 * with the same exact integer dot, in block order: bfp_panel_tile's bits. Before, 4-8 tokens
 * took the wide path (a k-slice decoded into scratch, then the tokens over it; its slices
 * a stride through the group's units) and 3 the one-panel tile: [12288, 4096] x 12 from DRAM,
 * interleaved, medians of 9, cost against one token on one thread 3 / 4 / 5 / 8 tokens
 * 1.92-2.23 / 3.42-3.97 / 4.16-4.54 / 5.19-5.68 -> 1.76-1.80 / 2.26-2.35 / 3.04 / 4.58, two
 * threads 1.82-2.10 / 2.92-3.20 / 3.31-3.36 / 4.53-4.55 -> 1.63-1.69 / 2.07-2.25 / 2.65 / 4.00.
 * Four tokens are bound by the arithmetic (29 vector ops a block and token, 8 of them
 * vpmaddubsw); all eight tokens in one pass, with this loop's order, spilled their sums and ran
 * slower than two.
 * bfp8 blocks go as in the panel tile (the weight's sign moved onto x, int32 sums). */
#define BFP_BATCH_PASS 4 /* tokens per pass over a group: more spill */
/* bfp4 calls of up to BFP_BATCH_PAIR_TOKENS tokens read two groups side by side (two streams, as the
 * GEMV does), where the call's rows hold both whole; 4 tokens take the two groups one after the other.
 * On a Zen 4 VM with these kernels ([12288, 4096] x 16 from DRAM, interleaved, medians of 9-15),
 * against a plain read on one thread: 3 tokens 0.55 -> 0.64 (passes of 2-3 tokens, when 5-7 tokens
 * still took two: 0.29-0.30 -> 0.33), on two threads (rows halved) their cost 1.31 -> 1.10 plain
 * reads; in L2 the same. Passes of 4 cost 12% more over two groups (eight accumulator sets in L1 and
 * the compiler's addressing), so they keep one. */
#define BFP_BATCH_GROUPS 2
#define BFP_BATCH_PAIR_TOKENS 3

ALWAYS_INLINE void bfp_batch_tile(const int is4, const int ng, const int nt, const bfp_panel pn, int64_t n_in,
                                  const act_q8 *a, int64_t t0, float *y, int64_t n_out) {
    const int np = BFP_GEMV_PANELS;
    const int64_t n_blk = n_in / 16;
    const int unit = BFP_UNIT(is4), ahead = BFP_GEMV_PREFETCH_BLOCKS(is4), bias = is4 ? 129 : 133;
    const int64_t il = a->il; /* the call's tokens, side by side (act_q8.il) */
    const int8_t *xq = a->q + 16 * t0;
    const int32_t *xo = a->o4 + t0;
    const float *xd = a->d + t0;
    __m256 accs[BFP_BATCH_GROUPS][BFP_GEMV_PANELS][BFP_BATCH_PASS][2];
    memset(accs, 0, sizeof accs); /* in L1 between blocks anyway */
    const uint8_t *groups[BFP_BATCH_GROUPS];
    bfp_groups_begin(is4, ng, pn, n_blk, ahead, groups);
    for (int64_t b = 0; b < n_blk; b++) {
        #pragma GCC unroll 2
        for (int gi = 0; gi < ng; gi++) {
            __m256 (*acc)[BFP_BATCH_PASS][2] = accs[gi];
            const uint8_t *u = groups[gi] + b * unit;
            bfp_prefetch_group_unit(groups[gi], is4, b + ahead, 0);
            const int normal = exps_at_least(u, bias - 126) && exps_at_least(u + 32, bias - 126);
            #pragma GCC unroll 4
            for (int p = 0; p < np; p++) {
                const uint8_t *cb = u + 64 + p * BFP_CODE_BYTES(is4);
                /* x's block, opaque to the compiler per panel: else it keeps the tokens' broadcast
                 * groups live across the panels, and they spill */
                const int8_t *xb = xq + 16 * il * b;
                const int32_t *ob = xo + il * b;
                __asm__("" : "+r"(xb), "+r"(ob));
                __m256i sum[BFP_BATCH_PASS][2];
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) {
                    __m256i w[2];
                    bfp_group_decode(is4, cb, g, w);
                    #pragma GCC unroll 4
                    for (int t = 0; t < nt; t++)
                        bfp_group_dot(is4, cb, g, w, bcast_x4(xb + 16 * t, g), ob + t, sum[t]);
                }
                #pragma GCC unroll 2
                for (int h = 0; h < 2; h++) {
                    const __m256 ws = unit_row_scales(u, p, h, normal, bias);
                    #pragma GCC unroll 4
                    for (int t = 0; t < nt; t++)
                        acc[p][t][h] = bfp_block_fma(is4, sum[t][h], xd[il * b + t], ws, acc[p][t][h]);
                }
            }
        }
    }
    #pragma GCC unroll 2
    for (int gi = 0; gi < ng; gi++)
        #pragma GCC unroll 4
        for (int p = 0; p < np; p++)
            #pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                float *yp = y + (t0 + t) * n_out + 16 * (np * gi + p);
                _mm256_storeu_ps(yp, accs[gi][p][t][0]);
                _mm256_storeu_ps(yp + 8, accs[gi][p][t][1]);
            }
}

/* ---- bfp4 batches of BFP_BATCH_ONE_PASS_MIN to BFP_BATCH_TOKENS_MAX tokens: one pass over a group ----
 * Read as bfp_batch_tile reads a group (one stream of units, each asked for BFP_GEMV_PREFETCH_BLOCKS
 * ahead), but in one pass for all the call's tokens: each panel's block is decoded once into eight
 * registers (its four groups' two halves), with its row scales, and the tokens go over it one after
 * another, each with its two int16 sums (started at the offset -4 sum(q), as bfp_group_dot's) and
 * bfp_block_fma into accumulators that wait in L1. Two passes decoded each block twice and read the
 * group's second pass from L2. The same exact integer dots in block order: bfp_panel_tile's bits.
 * From DRAM on a Zen 3 VM (16 copies, interleaved with two passes call by call, best of 6, 4-6 rounds),
 * [12288, 4096] on two threads 5 / 6 / 7 / 8 tokens 0.83 / 0.91 / 0.90 / 0.94 of the time, on one
 * 0.94 / 0.98 / 0.91 / 0.96; [4096, 12288] 5 / 8 tokens 0.89 / 0.93 (two threads), 0.87 / 0.91 (one).
 * Tokens two at a time over the block spilled the weights and sums; 3 and 4 tokens ran as fast or
 * slower (1.0-1.1), so they keep bfp_batch_tile. */
#define BFP_BATCH_ONE_PASS_MIN 5
ALWAYS_INLINE void bfp_batch_one_pass(const int nt, const bfp_panel pn, int64_t n_in, const act_q8 *a, float *y,
                                      int64_t n_out) {
    const int np = BFP_GEMV_PANELS, is4 = 1, unit = BFP_UNIT(is4), ahead = BFP_GEMV_PREFETCH_BLOCKS(is4), bias = 129;
    const int64_t n_blk = n_in / 16, il = a->il; /* the call's tokens side by side (act_q8.il = nt) */
    __m256 acc[BFP_GEMV_PANELS][BFP_BATCH_TOKENS_MAX][2];
    memset(acc, 0, sizeof acc); /* in L1 between blocks anyway */
    const uint8_t *group;
    bfp_groups_begin(is4, 1, pn, n_blk, ahead, &group);
    for (int64_t b = 0; b < n_blk; b++) {
        const uint8_t *u = group + b * unit;
        bfp_prefetch_group_unit(group, is4, b + ahead, 0);
        const int normal = exps_at_least(u, bias - 126) && exps_at_least(u + 32, bias - 126);
        #pragma GCC unroll 4
        for (int p = 0; p < np; p++) {
            const uint8_t *cb = u + 64 + p * BFP_CODE_BYTES(is4);
            /* x's block, opaque per panel (as in bfp_batch_tile) */
            const int8_t *xb = a->q + 16 * il * b;
            const int32_t *ob = a->o4 + il * b;
            const float *db = a->d + il * b;
            __asm__("" : "+r"(xb), "+r"(ob), "+r"(db));
            __m256i w[4][2];
            #pragma GCC unroll 4
            for (int g = 0; g < 4; g++) {
                bfp_group_decode(is4, cb, g, w[g]);
                w[g][0] = in_register(w[g][0]);
                w[g][1] = in_register(w[g][1]);
            }
            const __m256 ws[2] = {unit_row_scales(u, p, 0, normal, bias), unit_row_scales(u, p, 1, normal, bias)};
            #pragma GCC unroll 1 /* a loop: unrolled, the tokens' loads and sums compete for the registers */
            for (int t = 0; t < nt; t++) {
                __m256i sum[2];
                #pragma GCC unroll 4
                for (int g = 0; g < 4; g++) bfp_group_dot(is4, cb, g, w[g], bcast_x4(xb + 16 * t, g), ob + t, sum);
                #pragma GCC unroll 2
                for (int h = 0; h < 2; h++) acc[p][t][h] = bfp_block_fma(is4, sum[h], db[t], ws[h], acc[p][t][h]);
            }
        }
    }
    #pragma GCC unroll 4
    for (int p = 0; p < np; p++) bfp_store(nt, acc[p], y + 16 * p, n_out, 0, 16);
}

/* ---- calls of BFP_WIDE_MIN_TOKENS or more that no tile above takes: prefill, 9 tokens and more ----
 * A panel is done in k-slices of BFP_SLICE_BLOCKS blocks: a slice is decoded
 * once into L1 scratch (bfp_slice_predecode), then every token of the chunk
 * passes over it four at a time (bfp_slice_tile), its partial sums waiting
 * in a->acc between slices. The integer dot products are the panel tile's
 * (weights as value + 8 for bfp4, magnitude with the sign moved onto x for
 * bfp8, the sign read from the codes in place), and each block and token
 * ends in bfp_scale_fma, in block order, so the results are bitwise those
 * of bfp_panel_tile.
 *
 * bfp4's offset -8 sum(q) starts the int16 sums instead of being subtracted
 * from the int32 dot: a->o4 holds -4 sum(q) in both int16 halves of a
 * lane, which vpmaddwd adds back to -8 sum(q). Bounds per int16 lane (one
 * row; inputs k = 4g + {0, 1} or {2, 3} of the four groups g): a vpmaddubsw
 * pair |(v + 8) q + (v' + 8) q'| <= 2 * 15 * 127 = 3810, four of them
 * <= 15240, the start |4 sum(q)| <= 4 * 16 * 127 = 8128: |lane| <= 23368
 * < 32767, so the int16 sums are exact and the int32 dot is too. */

#define ISA_BFP_WIDE 1
/* Tokens per pass over a decoded slice (bfp_slice_tile). Four tokens' sums and accumulators fill the 16
 * registers and a few spill, but each weight vector serves four tokens, and the Zen 3 core is bound by its
 * vector instructions and loads rather than by the spills: [512, 4096] bfp4 x 64 hot in cache (1.2 MB,
 * L3), one thread, interleaved medians of 41 calls, 26.7-27.7 us per token with two tokens, 25.5-26.2 with
 * three (no spills), 24.6-26.1 with four; bfp8 the same within the noise (37-42 us); prompts of 256 at the
 * 9B shapes on two threads, three interleaved rounds, 20.2-21.4 / 20.9-21.5 / 21.8-22.1 tok/s. Each half's
 * sums then their FMAs (four live sums instead of eight, x broadcast twice) ran at 31-33. */
#define BFP_SLICE_TOKENS 4
_Static_assert(BFP_SLICE_TOKENS == ISA_BFP_NT, "act_quantize groups a prompt's tokens as the slice tile takes them");

/* Decodes blocks [b0, b0 + nb) of a panel: codes to bytes in a->dec, bfp4's
 * to value + 8, bfp8's to their magnitude (256 bytes per block, group g and
 * half h at 64 g + 32 h, as bfp8's codes are laid out), every block's 16
 * row scales' exponents (E - bias) << 23 in a->wsb and, unless every token
 * of the call adds them, the scales 2^(E - bias) in a->ws. Returns the
 * least and greatest exponent byte of the slice, as lo | hi << 8
 * (bfp_slice_tokens' check for the exponent add). */
ALWAYS_INLINE int bfp_slice_predecode(const int is4, const int np, const bfp_panel pn, int64_t n_in, int64_t b0,
                                      int nb, const act_q8 *a) {
    (void)np, (void)n_in; /* np = 1: this ISA's wide tiles take one panel */
    const int unit = BFP_UNIT(is4), bias = is4 ? 129 : 133;
    if (b0 == 0) bfp_prefetch_panel(pn, is4);
    __m128i e_lo = _mm_set1_epi8((char)0xff), e_hi = _mm_setzero_si128();
    for (int i = 0; i < nb; i++) {
        const __m128i e = _mm_loadu_si128((const __m128i *)(pn.exps + (b0 + i) * unit));
        e_lo = _mm_min_epu8(e_lo, e);
        e_hi = _mm_max_epu8(e_hi, e);
    }
    const int erange = bfp_bytes_range(e_lo, e_hi);
    /* the row scales only where some token of the call multiplies (bfp_slice_tokens: its tokens' d exponents
     * lie within a->xr); a normal float's bits are the exponents' plus 127 << 23 */
    const int scales = !bfp_exps_add_exact(is4, a->xr, erange), normal = (erange & 0xff) >= bias - 126;
    for (int i = 0; i < nb; i++) {
        const int64_t b = b0 + i;
        const uint8_t *cb = pn.codes + b * unit, *e16 = pn.exps + b * unit;
        bfp_prefetch_next_slice(pn, is4, b);
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m256i w[2], *d = (__m256i *)(a->dec + 256 * i + 64 * g);
            bfp_group_decode(is4, cb, g, w);
            _mm256_store_si256(d, w[0]);
            _mm256_store_si256(d + 1, w[1]);
        }
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const __m256i eb = _mm256_slli_epi32(
                _mm256_sub_epi32(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(e16 + 8 * h))),
                                 _mm256_set1_epi32(bias)),
                23);
            _mm256_store_si256((__m256i *)(a->wsb + 16 * i + 8 * h), eb);
            if (scales)
                _mm256_store_ps(a->ws + 16 * i + 8 * h,
                                normal ? _mm256_castsi256_ps(_mm256_add_epi32(eb, _mm256_set1_epi32(127 << 23)))
                                       : exp_scale8(e16 + 8 * h, bias));
        }
    }
    return erange;
}

/* Tokens [t, t + nt) (nt = 1 .. BFP_SLICE_TOKENS) over the slice [b0, b0 + nb) that
 * bfp_slice_predecode left in a->dec / a->ws / a->wsb. Group by group, each
 * weight vector is loaded once for all nt tokens; each token's two block sums
 * and two accumulators are live, 4 registers a token. With
 * add_scales the scale product ws * xd is the integer add of the rows'
 * exponents (a->wsb) to xd's bits, exact where bfp_scales_add holds: the
 * same bits, and the multiply leaves the FP pipes, which the convert and the
 * FMA keep busy (a Zen 4 VM with these kernels: [256, 4096] x 64 and x 128
 * hot in L2 2% less time for bfp4, 4% for bfp8; prompts of 512 at the 9B
 * shapes on two threads 26.4-26.5 -> 27.0-27.7 tok/s, interleaved). The accumulators start at zero on the first
 * slice and go to y after the last one; in between they wait in a->acc (row
 * t - t0). */
ALWAYS_INLINE void bfp_slice_tile(const int is4, const int nt, const int add_scales, const bfp_panel pn, int64_t n_in,
                                  const act_q8 *a, int64_t t0, int64_t t, int64_t b0, int nb, float *y, int64_t n_out,
                                  int64_t row0, int rows_lo, int rows_hi) {
    const int64_t n_blk = n_in / 16;
    const __m256i ones = _mm256_set1_epi16(1);
    /* tokens t .. t + nt - 1 side by side, il = 4 (act_q8.il): token t + j's block b at at + b * il + j */
    const int64_t at = act_at(a, t, n_blk), il = a->il;
    const int8_t *xq = a->q + 16 * at;
    const float *xd = a->d + at;
    const int32_t *xo = a->o4 + at;
    float *pacc = a->acc + 16 * (t - t0);
    __m256 acc[BFP_SLICE_TOKENS][2];
    #pragma GCC unroll 4
    for (int j = 0; j < nt; j++)
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) acc[j][h] = b0 ? _mm256_load_ps(pacc + 16 * j + 8 * h) : _mm256_setzero_ps();
    for (int i = 0; i < nb; i++) {
        const int64_t b = b0 + i;
        const uint8_t *wb = a->dec + 256 * i, *cb = pn.codes + b * BFP_UNIT(is4); /* cb: bfp8's signs */
        __m256i sum[BFP_SLICE_TOKENS][2];
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                __m256i wv = in_register(_mm256_load_si256((const __m256i *)(wb + 64 * g + 32 * h)));
                #pragma GCC unroll 4
                for (int j = 0; j < nt; j++) {
                    __m256i xg = bcast_x4(xq + 16 * (b * il + j), g);
                    if (is4) {
                        __m256i p = _mm256_maddubs_epi16(wv, xg);
                        sum[j][h] = in_register(
                            _mm256_add_epi16(g ? sum[j][h] : bcast_x4((const int8_t *)(xo + b * il + j), 0), p));
                    } else {
                        __m256i sg = _mm256_loadu_si256((const __m256i *)(cb + 64 * g + 32 * h));
                        __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(wv, _mm256_sign_epi8(xg, sg)), ones);
                        sum[j][h] = g ? in_register(_mm256_add_epi32(sum[j][h], p)) : p;
                    }
                }
            }
        }
        #pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            /* the rows' exponents (add_scales) or their scales 2^(E - bias) */
            const __m256i wsb = add_scales ? _mm256_load_si256((const __m256i *)(a->wsb + 16 * i + 8 * h))
                                           : _mm256_castps_si256(_mm256_load_ps(a->ws + 16 * i + 8 * h));
            #pragma GCC unroll 4
            for (int j = 0; j < nt; j++)
                acc[j][h] = bfp_scale_fma_by(add_scales, is4 ? _mm256_madd_epi16(sum[j][h], ones) : sum[j][h],
                                             xd[b * il + j], wsb, acc[j][h]);
        }
    }
    if (b0 + nb < n_blk) {
        #pragma GCC unroll 4
        for (int j = 0; j < nt; j++)
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) _mm256_store_ps(pacc + 16 * j + 8 * h, acc[j][h]);
    } else {
        bfp_store(nt, acc, y + t * n_out + row0, n_out, rows_lo, rows_hi);
    }
}

/* One bfp_slice_tile call for tokens [t, t + nt), with the exponent add where it is exact for them. */
ALWAYS_INLINE void bfp_slice_step(const int is4, const int nt, int erange, const bfp_panel pn, int64_t n_in,
                                  const act_q8 *a, int64_t t0, int64_t t, int64_t b0, int nb, float *y, int64_t n_out,
                                  int64_t row0, int lo, int hi) {
    if (bfp_scales_add(is4, a, t, nt, erange))
        bfp_slice_tile(is4, nt, 1, pn, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi);
    else
        bfp_slice_tile(is4, nt, 0, pn, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi);
}

/* Tokens [t0, t1) over one slice, BFP_SLICE_TOKENS at a time and the rest
 * in one call (matmul_driver.inc's bfp_wide_panel walks the slices). */
ALWAYS_INLINE void bfp_slice_tokens(const int is4, const int np, int erange, const bfp_panel pn, int64_t n_in,
                                    const act_q8 *a, int64_t t0, int64_t t1, int64_t b0, int nb, float *y,
                                    int64_t n_out, int64_t row0, int lo, int hi) {
    (void)np;
    int64_t t = t0;
    for (; t + BFP_SLICE_TOKENS <= t1; t += BFP_SLICE_TOKENS)
        bfp_slice_step(is4, BFP_SLICE_TOKENS, erange, pn, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi);
    _Static_assert(BFP_SLICE_TOKENS == 4, "the rest below takes 1 to 3 tokens");
    switch (t1 - t) {
    case 3: bfp_slice_step(is4, 3, erange, pn, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi); break;
    case 2: bfp_slice_step(is4, 2, erange, pn, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi); break;
    case 1: bfp_slice_step(is4, 1, erange, pn, n_in, a, t0, t, b0, nb, y, n_out, row0, lo, hi); break;
    default: break;
    }
}

/* ---- F32 / F16 / BF16 weights ---- */

#define ISA_FLOAT_NR 4
#define ISA_VEC __m256i
#define ISA_VEC_ADD64(a, b) _mm256_add_epi64(a, b)

#define ISA_FLOAT_NT 1

/* 8 weights from element i of a row, widened to fp32. */
ALWAYS_INLINE __m256 load_w8(const q35_dtype dt, const void *row, int64_t i) {
    if (dt == Q35_DT_F32) return _mm256_loadu_ps((const float *)row + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)row + i));
    if (dt == Q35_DT_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

ALWAYS_INLINE float widen(const q35_dtype dt, const void *row, int64_t i) {
    if (dt == Q35_DT_F32) return ((const float *)row)[i];
    uint16_t h = ((const uint16_t *)row)[i];
    return dt == Q35_DT_F16 ? q35_f16_to_f32(h) : q35_bf16_to_f32(h);
}

/* Software prefetch distance of the float tiles, per row. The hardware
 * prefetcher alone reached about 90-94% of a plain sequential read on one
 * core for bf16 (4 rows, 4 streams); 256 bytes ahead added 2-6%, while 512
 * bytes was no better and 0.75-2 KiB were 5-15% slower, as was asking for
 * the next tile's row heads early. More rows per tile (5-8 streams) did
 * not help either. */
#define FLOAT_PREFETCH_BYTES 256

/* Rows [o, o + nr) for tokens [t0, t0 + nt); dt, nr, nt constant after inlining. */
ALWAYS_INLINE void float_tile(const q35_dtype dt, const int nr, const int nt, const char *w0, size_t row_bytes,
                              const float *x, int64_t n_in, int64_t t0, float *y, int64_t n_out, int64_t o) {
    /* Two interleaved halves of k (u) give enough independent FMA chains
     * for small tiles, and every row and token is summed in the same order
     * whatever the tile: results do not depend on n_tok or on [o0, o1). */
    const int nu = 2;
    __m256 acc[2][ISA_FLOAT_NR][ISA_FLOAT_NT];
    #pragma GCC unroll 8
    for (int u = 0; u < nu; u++)
        #pragma GCC unroll 8
        for (int r = 0; r < nr; r++)
            #pragma GCC unroll 8
            for (int t = 0; t < nt; t++) acc[u][r][t] = _mm256_setzero_ps();
    const float *xt0 = x + t0 * n_in;
    const int elt = dt == Q35_DT_F32 ? 4 : 2;
    int64_t i = 0;
    for (; i + 8 * nu <= n_in; i += 8 * nu) {
        /* The first token group, which reads the rows from memory, asks for
         * each row's line FLOAT_PREFETCH_BYTES ahead, past a row's end the
         * same place in the next tile's rows. */
        if (t0 == 0 && ((i * elt) & 63) == 0) {
            size_t ahead = (size_t)(i * elt) + FLOAT_PREFETCH_BYTES;
            if (ahead >= row_bytes) ahead += (size_t)(nr - 1) * row_bytes;
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) _mm_prefetch(w0 + (size_t)r * row_bytes + ahead, _MM_HINT_T0);
        }
        #pragma GCC unroll 8
        for (int u = 0; u < nu; u++) {
            __m256 w[ISA_FLOAT_NR];
            #pragma GCC unroll 8
            for (int r = 0; r < nr; r++) w[r] = load_w8(dt, w0 + (size_t)r * row_bytes, i + 8 * u);
            #pragma GCC unroll 8
            for (int t = 0; t < nt; t++) {
                __m256 xv = _mm256_loadu_ps(xt0 + t * n_in + i + 8 * u);
                #pragma GCC unroll 8
                for (int r = 0; r < nr; r++) acc[u][r][t] = _mm256_fmadd_ps(w[r], xv, acc[u][r][t]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int r = 0; r < nr; r++)
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            float s = hsum8(nu == 2 ? _mm256_add_ps(acc[0][r][t], acc[nu - 1][r][t]) : acc[0][r][t]);
            for (int64_t j = i; j < n_in; j++) s += widen(dt, w0 + (size_t)r * row_bytes, j) * xt0[t * n_in + j];
            y[(t0 + t) * n_out + o + r] = s;
        }
}

#include "matmul_driver.inc"

/* Row fetches are one row per token (embeddings): the reference is fast enough. */
const q35_kernels q35_kernels_avx2 = {"avx2", matmul_n_isa, q35_get_row_ref, q35_gdn_recurrent_avx2,
                                       q35_gdn_chunked_avx2, q35_attend_heads_avx2, read_stream,
                                       q35_attend_rows_avx2, q35_gemm_f32_avx2, q35_softmax_rows_avx2,
                                       q35_attend_rows_q8_avx2, q35_silu_mul_avx2,
                                       q35_sigmoid_mul_avx2, q35_conv_silu_avx2, q35_rmsnorm1p_avx2};
