/* avx2.c: matmul kernels for AVX2 + FMA + F16C (compiled with those flags
 * only; dispatch.c checks cpuid before anything here runs).
 *
 * BFP4 / BFP8 weights (16-row panels, bfp.h): x is quantized per 16-value
 * block to int8 into per-thread scratch. A weight group (4 inputs x 16
 * rows) splits into two ymm of 8 rows x 4 inputs, so the integer dot
 * products land in 32-bit lanes, one per row, with no horizontal sums.
 * AVX2 has no vpdpbusd; vpmaddubsw (unsigned x signed bytes, int16 pairs,
 * saturating) and vpmaddwd do the work:
 *   bfp4: codes become value + 8 (1..15) through one vpshufb; products stay
 *         below 2 * 15 * 127, so the four groups of a block add up in int16
 *         before one vpmaddwd; the block starts at -8 * sum(q) to cancel.
 *   bfp8: 255 * 127 pairs would saturate, so the magnitude (<= 127) meets x
 *         with the weight's sign moved onto it (vpsignb).
 * One float FMA per block, half-panel and token applies x's block scale
 * times 2^(E - 127 - (w - 1)), built from two exact powers of two so that
 * every exponent byte works. A tile serves up to 4 tokens, so a small
 * batch reads and decodes the weights once.
 *
 * F32 / F16 / BF16 weights: rows widened to fp32 in registers, 4 rows x 1
 * token x 2 halves of k of accumulators, x kept in fp32; each token passes
 * over the 4 rows (hot in L1) in turn. */
#include "bfp.h"
#include "kernels.h"
#include "util.h"

#include <immintrin.h>

#include "matmul_driver.h"

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

static int act_quantize(act_q8 *a, const float *x, int64_t n_tok, int64_t n_in) {
    size_t n_blk = (size_t)(n_tok * n_in / 16);
    if (!act_alloc(a, n_blk)) return 0;
    int8_t *q = a->q;
    float *d = a->d;
    int32_t *sum = a->sum;
    const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t i = 0; i < n_blk; i++) {
        __m256 v0 = _mm256_loadu_ps(x + 16 * i), v1 = _mm256_loadu_ps(x + 16 * i + 8);
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
        sum[i] = _mm_cvtsi128_si32(sad) + _mm_extract_epi32(sad, 2) - 2048;
        d[i] = amax / 127.0f;
    }
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

/* y rows [row0, row0 + 16) (those in rows_lo..rows_hi) for tokens
 * [t0, t0 + nt) from one panel; is4 and nt are constants after inlining. */
ALWAYS_INLINE void bfp_panel_tile(const int is4, const int nt, const uint8_t *panel, int64_t n_in, const act_q8 *a,
                                  int64_t t0, float *y, int64_t n_out, int64_t row0, int rows_lo, int rows_hi) {
    const int64_t n_blk = n_in / 16;
    const uint8_t *exps = panel, *codes = panel + n_blk * 16;
    const int block_bytes = is4 ? 128 : 256;
    /* code -> value + 8: codes 0..7 are +m, 8..15 are -m */
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(8, 9, 10, 11, 12, 13, 14, 15, 8, 7, 6, 5, 4, 3, 2, 1));
    const __m256i nib = _mm256_set1_epi8(0x0f), mag7 = _mm256_set1_epi8(0x7f), ones = _mm256_set1_epi16(1);
    const int8_t *xq = a->q + t0 * n_in;
    const float *xd = a->d + t0 * n_blk;
    const int32_t *xs = a->sum + t0 * n_blk;
    __m256 acc[4][2];
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
    for (int64_t b = 0; b < n_blk; b++) {
        const uint8_t *cb = codes + b * block_bytes;
        /* w[g][h]: group g, rows 8h..8h+7; bfp8 also keeps the codes for their signs */
        __m256i w[4][2], sg[4][2];
        #pragma GCC unroll 8
        for (int g = 0; g < 4; g++) {
            if (is4) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(cb + 32 * g));
                w[g][0] = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, nib));
                w[g][1] = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), nib));
            } else {
                #pragma GCC unroll 8
                for (int h = 0; h < 2; h++) {
                    sg[g][h] = _mm256_loadu_si256((const __m256i *)(cb + 64 * g + 32 * h));
                    w[g][h] = _mm256_and_si256(sg[g][h], mag7);
                }
            }
        }
        __m256 ws[2] = {exp_scale8(exps + 16 * b, is4 ? 129 : 133), exp_scale8(exps + 16 * b + 8, is4 ? 129 : 133)};
        #pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            const int8_t *xb = xq + t * n_in + 16 * b;
            int32_t x4[4];
            memcpy(x4, xb, 16);
            __m256 xscale = _mm256_set1_ps(xd[t * n_blk + b]);
            #pragma GCC unroll 8
            for (int h = 0; h < 2; h++) {
                __m256i dot;
                if (is4) {
                    __m256i s16 = _mm256_maddubs_epi16(w[0][h], _mm256_set1_epi32(x4[0]));
                    #pragma GCC unroll 8
                    for (int g = 1; g < 4; g++)
                        s16 = _mm256_add_epi16(s16, _mm256_maddubs_epi16(w[g][h], _mm256_set1_epi32(x4[g])));
                    dot = _mm256_sub_epi32(_mm256_madd_epi16(s16, ones), _mm256_set1_epi32(xs[t * n_blk + b] * 8));
                } else {
                    dot = _mm256_setzero_si256();
                    #pragma GCC unroll 8
                    for (int g = 0; g < 4; g++) {
                        __m256i xg = _mm256_sign_epi8(_mm256_set1_epi32(x4[g]), sg[g][h]);
                        dot = _mm256_add_epi32(dot, _mm256_madd_epi16(_mm256_maddubs_epi16(w[g][h], xg), ones));
                    }
                }
                acc[t][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(ws[h], xscale), acc[t][h]);
            }
        }
    }
    #pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        float *yt = y + (t0 + t) * n_out + row0;
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

/* ---- F32 / F16 / BF16 weights ---- */

#define ISA_FLOAT_NR 4
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
    int64_t i = 0;
    for (; i + 8 * nu <= n_in; i += 8 * nu) {
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

#include "matmul_driver.h"

/* Row fetches are one row per token (embeddings): the reference is fast enough. */
const q35_kernels q35_kernels_avx2 = {"avx2", matmul_isa, q35_get_row_ref, q35_gdn_recurrent_avx2,
                                       q35_attend_head_avx2};
