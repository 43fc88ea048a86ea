/* avx512.c: matmul kernels for AVX-512 F/BW/VL/DQ with VNNI (compiled with
 * those flags only; dispatch.c checks cpuid before anything here runs).
 *
 * BFP4 / BFP8 weights (16-row panels, bfp.h): x is quantized per 16-value
 * block to int8 into per-thread scratch, then each 16x16 weight block is
 * four vpdpbusd whose 32-bit lanes are the panel's 16 rows, so no
 * horizontal sums. vpdpbusd multiplies unsigned by signed bytes, so weight
 * codes become value + 8 (bfp4) or value + 128 (bfp8) and the block starts
 * from -8 * sum(q) or -128 * sum(q) to cancel the offset. One float FMA per
 * block and token applies x's block scale times 2^(E - 127 - (w - 1))
 * (vscalefps handles every E, subnormal results included). A panel tile
 * serves up to 8 tokens, so the weights are read and decoded once for a
 * whole small batch; larger batches walk the same panel (hot in L1/L2) once
 * per 8 tokens. The tile prefetches ahead in the panel stream
 * (matmul_driver.h).
 *
 * F32 / F16 / BF16 weights: rows widened to fp32 in registers, 4 rows x up
 * to 3 tokens x 2 halves of k of fp32 accumulators, x kept in fp32. */
#include "bfp.h"
#include "kernels.h"
#include "util.h"

#include <immintrin.h>

#include "matmul_driver.h"

#define ALWAYS_INLINE static inline __attribute__((always_inline))
/* The tiles' small loops over tokens, rows and groups must unroll fully so
 * that their arrays of vectors live in registers; -O2 alone keeps them as
 * loops over stack arrays. */

#define ISA_BFP_NT 8

/* ---- activations quantized per block of 16 ---- */

static int act_quantize(act_q8 *a, const float *x, int64_t n_tok, int64_t n_in) {
    size_t n_blk = (size_t)(n_tok * n_in / 16);
    if (!act_alloc(a, n_blk, 0)) return 0;
    int8_t *q = a->q;
    float *d = a->d;
    int32_t *sum = a->sum;
    for (size_t i = 0; i < n_blk; i++) {
        __m512 v = _mm512_loadu_ps(x + 16 * i);
        float amax = _mm512_reduce_max_ps(_mm512_abs_ps(v));
        float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
        __m512i qi = _mm512_cvtps_epi32(_mm512_mul_ps(v, _mm512_set1_ps(inv))); /* nearest even */
        _mm_storeu_si128((__m128i *)(q + 16 * i), _mm512_cvtepi32_epi8(qi));
        d[i] = amax / 127.0f;
        sum[i] = _mm512_reduce_add_epi32(qi);
    }
    return 1;
}

/* ---- bfp weight decode: one group (4 inputs x 16 rows) to offset bytes ---- */

ALWAYS_INLINE __m512i bfp4_group(const uint8_t *p, __m512i lut) {
    /* the 32 bytes in both halves; the upper half shifted down a nibble */
    __m512i v = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)p));
    v = _mm512_mask_srli_epi16(v, (__mmask32)0xffff0000u, v, 4);
    /* low nibbles: rows 0..7, high nibbles: rows 8..15 */
    return _mm512_shuffle_epi8(lut, _mm512_and_si512(v, _mm512_set1_epi8(0x0f)));
}

ALWAYS_INLINE __m512i bfp8_group(const uint8_t *p) {
    __m512i c = _mm512_loadu_si512(p);
    __m512i mag = _mm512_and_si512(c, _mm512_set1_epi8(0x7f));
    __m512i bias = _mm512_set1_epi8((char)0x80);
    /* 128 + m, or 128 - m where the sign bit is set */
    return _mm512_mask_sub_epi8(_mm512_or_si512(mag, bias), _mm512_movepi8_mask(c), bias, mag);
}

/* y rows [row0 + lo, row0 + hi) for tokens [t0, t0 + nt) from one panel;
 * is4 and nt are constants after inlining. */
ALWAYS_INLINE void bfp_panel_tile(const int is4, const int nt, const uint8_t *panel, int64_t n_in, const act_q8 *a,
                                  int64_t t0, float *y, int64_t n_out, int64_t row0, int lo, int hi) {
    const __mmask16 rows = (__mmask16)((0xffffu >> (16 - hi)) & (0xffffu << lo));
    const int64_t n_blk = n_in / 16;
    const uint8_t *exps = panel, *codes = panel + n_blk * 16;
    const int block_bytes = is4 ? 128 : 256, group_bytes = is4 ? 32 : 64;
    const int offset_shift = is4 ? 3 : 7; /* weight offset 8 or 128 */
    /* code -> value + 8: codes 0..7 are +m, 8..15 are -m */
    const __m512i lut = _mm512_broadcast_i32x4(_mm_setr_epi8(8, 9, 10, 11, 12, 13, 14, 15, 8, 7, 6, 5, 4, 3, 2, 1));
    const __m512i exp_bias = _mm512_set1_epi32(is4 ? 129 : 133);
    const int8_t *xq = a->q + t0 * n_in;
    const float *xd = a->d + t0 * n_blk;
    const int32_t *xs = a->sum + t0 * n_blk;
    __m512 acc[8];
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t] = _mm512_setzero_ps();
    bfp_prefetch_panel(codes, block_bytes);
    for (int64_t b = 0; b < n_blk; b++) {
        const uint8_t *cb = codes + b * block_bytes;
        bfp_prefetch_block(exps, cb, b, block_bytes);
        __m512i w[4];
        #pragma GCC unroll 8
        for (int g = 0; g < 4; g++) w[g] = is4 ? bfp4_group(cb + g * group_bytes, lut) : bfp8_group(cb + g * group_bytes);
        __m512 wexp = _mm512_cvtepi32_ps(
            _mm512_sub_epi32(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(exps + 16 * b))), exp_bias));
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const int8_t *xb = xq + t * n_in + 16 * b;
            int32_t x4[4];
            memcpy(x4, xb, 16);
            /* two chains halve the vpdpbusd latency per block */
            __m512i d0 = _mm512_set1_epi32(-xs[t * n_blk + b] * (1 << offset_shift));
            __m512i d1 = _mm512_setzero_si512();
            d0 = _mm512_dpbusd_epi32(d0, w[0], _mm512_set1_epi32(x4[0]));
            d1 = _mm512_dpbusd_epi32(d1, w[1], _mm512_set1_epi32(x4[1]));
            d0 = _mm512_dpbusd_epi32(d0, w[2], _mm512_set1_epi32(x4[2]));
            d1 = _mm512_dpbusd_epi32(d1, w[3], _mm512_set1_epi32(x4[3]));
            __m512 scale = _mm512_scalef_ps(_mm512_set1_ps(xd[t * n_blk + b]), wexp);
            acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(d0, d1)), scale, acc[t]);
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) _mm512_mask_storeu_ps(y + (t0 + t) * n_out + row0, rows, acc[t]);
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

/* Rows [o, o + nr) for tokens [t0, t0 + nt); dt, nr, nt constant after inlining. */
ALWAYS_INLINE void float_tile(const q35_dtype dt, const int nr, const int nt, const char *w0, size_t row_bytes,
                              const float *x, int64_t n_in, int64_t t0, float *y, int64_t n_out, int64_t o) {
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

#include "matmul_driver.h"

/* Row fetches are one row per token (embeddings): the reference is fast enough. */
const q35_kernels q35_kernels_avx512 = {"avx512", matmul_isa, matmul_n_isa, q35_get_row_ref, q35_gdn_recurrent_avx2,
                                         q35_gdn_chunked_avx2, q35_attend_heads_avx2, read_stream};
