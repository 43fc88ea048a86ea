/* avx2_ops.c: the forward pass's vector kernels outside the matmuls, for
 * AVX2 + FMA (compiled with those flags only; dispatch.c checks cpuid before
 * anything here runs). The avx2 and avx512 tables share them: the state
 * they stream is read from memory once per token, so wider vectors would
 * not make them faster.
 *
 * Gated DeltaNet recurrence (kernels.h has the algorithm): S (DK, DV) is
 * walked in column blocks of 32 (or 8) floats, rows i in ascending order, so
 * that each of a column's sums is one chain of FMAs in one vector lane, the
 * same chain in the read pass and in the read-modify-write pass that
 * computes the next row's sums. Shapes whose DV is not a multiple of 8 use
 * the reference.
 *
 * The chunked form (prompts) runs the chunk's matrix products (W S, q S,
 * QK Vn, the state update) as 4-row x 16-column register blocks, the
 * forward substitutions as row vectors and the k k^T, q k^T dots two at a
 * time. It has no stream to keep up with: there is about 1% of a prompt's
 * arithmetic here, and the scalar loops took 15-20% of prefill.
 *
 * Attention of the query heads that share a KV head against the KV cache:
 * attend_driver.inc over 8-float vectors (two keys per score tile); each key
 * and value row comes from memory once for the group. Head dims not a
 * multiple of 16 use the reference.
 *
 * gemm_f32 (the vision tower's attention): register tiles of 6 rows of A by
 * 16 columns of B, each C element one FMA chain over k. softmax_rows: its
 * row softmax, with attention's exp (attend_driver.inc), eight lanes of fp32
 * sums. silu_mul (SwiGLU, the GDN gated norm) and sigmoid_mul (attention's
 * output gate): the same exp. conv_silu (the GDN convolution): 8 channels
 * per vector, then silu_mul's silu. */
#include "backend/cpu/kernels/kernels.h"
#include "backend/cpu/kernels/attend_q8.h"
#include "base/util.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* a[j0..j0+8nv) = sum_i k[i] S[i][j], b likewise with q; with pf, one line of it per row i (pf + 64 i). */
ALWAYS_INLINE void gdn_read_block(const int nv, float *a, float *b, const float *S, const float *k, const float *q,
                                  int32_t DK, int32_t DV, int32_t j0, const char *pf) {
    __m256 acc_a[4], acc_b[4];
    #pragma GCC unroll 4
    for (int u = 0; u < nv; u++) acc_a[u] = acc_b[u] = _mm256_setzero_ps();
    for (int32_t i = 0; i < DK; i++) {
        const float *row = S + (size_t)i * DV + j0;
        if (pf) _mm_prefetch(pf + 64 * (size_t)i, _MM_HINT_T1);
        __m256 ki = _mm256_set1_ps(k[i]), qi = _mm256_set1_ps(q[i]);
        #pragma GCC unroll 4
        for (int u = 0; u < nv; u++) {
            __m256 s = _mm256_loadu_ps(row + 8 * u);
            acc_a[u] = _mm256_fmadd_ps(ki, s, acc_a[u]);
            acc_b[u] = _mm256_fmadd_ps(qi, s, acc_b[u]);
        }
    }
    #pragma GCC unroll 4
    for (int u = 0; u < nv; u++) {
        _mm256_storeu_ps(a + j0 + 8 * u, acc_a[u]);
        _mm256_storeu_ps(b + j0 + 8 * u, acc_b[u]);
    }
}

/* S[i][j] = decay S[i][j] + k[i] delta[j] over one column block, copying the
 * result to after (when given; with stream, past the caches: the copies are
 * read again only if a speculative row is rejected) and, when kn is given, forming the next
 * row's a and b from the new values exactly as gdn_read_block does; pf as there. */
ALWAYS_INLINE void gdn_update_block(const int nv, float *S, const float *k, const float *delta, float decay,
                                    float *after, int stream, const float *kn, const float *qn, float *a, float *b,
                                    int32_t DK, int32_t DV, int32_t j0, const char *pf) {
    __m256 d[4], acc_a[4], acc_b[4];
    const __m256 dec = _mm256_set1_ps(decay);
    #pragma GCC unroll 4
    for (int u = 0; u < nv; u++) {
        d[u] = _mm256_loadu_ps(delta + j0 + 8 * u);
        acc_a[u] = acc_b[u] = _mm256_setzero_ps();
    }
    for (int32_t i = 0; i < DK; i++) {
        float *row = S + (size_t)i * DV + j0;
        if (pf) _mm_prefetch(pf + 64 * (size_t)i, _MM_HINT_T1);
        __m256 ki = _mm256_set1_ps(k[i]);
        __m256 kni = _mm256_set1_ps(kn ? kn[i] : 0.0f), qni = _mm256_set1_ps(kn ? qn[i] : 0.0f);
        #pragma GCC unroll 4
        for (int u = 0; u < nv; u++) {
            __m256 s = _mm256_fmadd_ps(ki, d[u], _mm256_mul_ps(dec, _mm256_loadu_ps(row + 8 * u)));
            _mm256_storeu_ps(row + 8 * u, s);
            if (after && stream) _mm256_stream_ps(after + (size_t)i * DV + j0 + 8 * u, s);
            else if (after) _mm256_storeu_ps(after + (size_t)i * DV + j0 + 8 * u, s);
            if (kn) {
                acc_a[u] = _mm256_fmadd_ps(kni, s, acc_a[u]);
                acc_b[u] = _mm256_fmadd_ps(qni, s, acc_b[u]);
            }
        }
    }
    if (kn) {
        #pragma GCC unroll 4
        for (int u = 0; u < nv; u++) {
            _mm256_storeu_ps(a + j0 + 8 * u, acc_a[u]);
            _mm256_storeu_ps(b + j0 + 8 * u, acc_b[u]);
        }
    }
}

void q35_gdn_recurrent_avx2(float *S, const float *q, const float *k, const float *v, const float *g,
                            const float *beta, float *o, int32_t T, int32_t DK, int32_t DV, float *S_after,
                            size_t after_stride, const float *S_next) {
    if (DV % 8 || DV > 1024) {
        q35_gdn_recurrent_ref(S, q, k, v, g, beta, o, T, DK, DV, S_after, after_stride, S_next);
        return;
    }
    float a[1024], b[1024], delta[1024];
    const int stream = S_after && (uintptr_t)S_after % 32 == 0 && after_stride % 8 == 0; /* every row 32-byte aligned */
    /* S_next's DK DV floats are 4 DK DV / 64 lines: the read pass and the first update pass visit the
     * rows of each 32-column block once, 2 DK (DV / 32) rows in all, the same count, so each row asks
     * for one line (blocks of 32 columns only; a narrower tail asks for none) */
    const char *pf = S_next && DV % 32 == 0 ? (const char *)S_next : NULL;
    const size_t pf_pass = (size_t)64 * DK * (size_t)(DV / 32), pf_block = (size_t)64 * DK;
    int32_t j0 = 0;
    for (; j0 + 32 <= DV; j0 += 32) gdn_read_block(4, a, b, S, k, q, DK, DV, j0, pf ? pf + pf_block * (j0 / 32) : NULL);
    for (; j0 < DV; j0 += 8) gdn_read_block(1, a, b, S, k, q, DK, DV, j0, NULL);
    for (int32_t t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * DK, *kt = k + (size_t)t * DK, *vt = v + (size_t)t * DV;
        float *ot = o + (size_t)t * DV;
        const float decay = expf(g[t]);
        float qk = 0.0f;
        for (int32_t i = 0; i < DK; i++) qk += qt[i] * kt[i];
        const __m256 dec = _mm256_set1_ps(decay), bt = _mm256_set1_ps(beta[t]), qkv = _mm256_set1_ps(qk);
        for (int32_t j = 0; j < DV; j += 8) {
            __m256 dj = _mm256_mul_ps(bt, _mm256_sub_ps(_mm256_loadu_ps(vt + j), _mm256_mul_ps(dec, _mm256_loadu_ps(a + j))));
            _mm256_storeu_ps(delta + j, dj);
            _mm256_storeu_ps(ot + j, _mm256_fmadd_ps(qkv, dj, _mm256_mul_ps(dec, _mm256_loadu_ps(b + j))));
        }
        const int next = t + 1 < T;
        float *after = S_after && next ? S_after + (size_t)t * after_stride : NULL;
        const float *kn = next ? kt + DK : NULL, *qn = next ? qt + DK : NULL;
        for (j0 = 0; j0 + 32 <= DV; j0 += 32)
            gdn_update_block(4, S, kt, delta, decay, after, stream, kn, qn, a, b, DK, DV, j0,
                             pf && t == 0 ? pf + pf_pass + pf_block * (j0 / 32) : NULL);
        for (; j0 < DV; j0 += 8)
            gdn_update_block(1, S, kt, delta, decay, after, stream, kn, qn, a, b, DK, DV, j0, NULL);
    }
    if (stream) _mm_sfence();
}

/* p 2^n through the exponent bits (n integral, p in [0.5, 2)); 0 where x is below lo */
ALWAYS_INLINE __m256 ldexp_or_zero8(__m256 p, __m256 n, __m256 x, float lo) {
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(_mm256_cmp_ps(x, _mm256_set1_ps(lo), _CMP_LT_OQ), _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

ALWAYS_INLINE float hmax8(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

#define AV __m256
#define AV_N 8
#define av_zero() _mm256_setzero_ps()
#define av_set1(f) _mm256_set1_ps(f)
#define av_load(p) _mm256_loadu_ps(p)
#define av_store(p, v) _mm256_storeu_ps((p), (v))
#define av_fmadd(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#define av_fnmadd(a, b, c) _mm256_fnmadd_ps((a), (b), (c))
#define av_round(v) _mm256_round_ps((v), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)
#define av_add(a, b) _mm256_add_ps((a), (b))
#define av_sub(a, b) _mm256_sub_ps((a), (b))
#define av_mul(a, b) _mm256_mul_ps((a), (b))
#define av_max(a, b) _mm256_max_ps((a), (b))
#define av_hsum(v) hsum8(v)
#define av_hmax(v) hmax8(v)
#define av_ldexp_or_zero(p, n, x) ldexp_or_zero8((p), (n), (x), ATT_EXP_LO)
/* The 8-bit cache's integer scores (attend_q8.h): per 32 codes, vpmaddubsw of the query's magnitudes
 * with the key's codes under the query's signs (|q| k sgn q: pairs at most 2 x 127 x 127, no
 * saturation), then vpmaddwd to 32-bit lanes, each its exact share of one block's dot product
 * (lane l: block l % nb). 8 blocks: q35_kv_q8_score_sum's tree is hsum8's. */
ALWAYS_INLINE float att_q8_score(const att_q8_query *qq, const uint8_t *row, int32_t HD, int32_t nb) {
    const int8_t *kc = (const int8_t *)(row + sizeof(float) * (size_t)nb);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc = _mm256_setzero_si256();
    for (int32_t j = 0; j < HD; j += 32) {
        const __m256i p = _mm256_maddubs_epi16(_mm256_load_si256((const __m256i *)(qq->a + j)),
                                               _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(kc + j)),
                                                                _mm256_load_si256((const __m256i *)(qq->c + j))));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    if (nb == 8)
        return hsum8(_mm256_mul_ps(_mm256_cvtepi32_ps(acc),
                                   _mm256_mul_ps(_mm256_load_ps(qq->d), _mm256_loadu_ps((const float *)row))));
    int32_t lanes[8], I[8] = {0};
    float kd[8];
    _mm256_storeu_si256((__m256i *)lanes, acc);
    for (int l = 0; l < 8; l++) I[l & (nb - 1)] += lanes[l]; /* nb 1, 2 or 4 */
    memcpy(kd, row, sizeof(float) * (size_t)nb);
    if (nb == 1) return (float)I[0] * (qq->d[0] * kd[0]);
    return q35_kv_q8_score_sum(I, qq->d, kd, nb);
}

/* The 8-bit cache's values (kernels.h) two keys at a time: vpmovsxbw of 16 codes of each, vpunpck{l,h}wd
 * to (key, next key) pairs of one column per 32-bit lane (lane 4j + e of the low vector: column d0 + 8j +
 * e, of the high one d0 + 8j + 4 + e, so block (d0 / 4 + 2j) % nb and the next), vpmaddwd with the pair's
 * weights u for those blocks and vpaddd: 16 products in two instructions where the float tile took 8 an
 * FMA and its codes a widening, a convert and a scale multiply per 8. A pair's weights come as four
 * vectors: low and high, for column tiles whose d0 / 4 % 8 is 0 and 4. */
typedef __m256i att_q8_wvec;
#define ATT_Q8_VT 16
#define ATT_Q8_WT 4
typedef struct {
    __m256i sidx, vidx[4], bm; /* a row's scales by lane (its nb first); the weight vectors' blocks by lane */
} att_q8_vctx;
ALWAYS_INLINE void att_q8_value_init(att_q8_vctx *c, int32_t nb) {
    int32_t si[8], vi[4][8];
    for (int l = 0; l < 8; l++) {
        si[l] = l & (nb - 1);
        for (int x = 0; x < 4; x++) vi[x][l] = (4 * (x >> 1) + 2 * (l / 4) + (x & 1)) & (nb - 1);
    }
    c->sidx = _mm256_loadu_si256((const __m256i *)si);
    for (int x = 0; x < 4; x++) c->vidx[x] = _mm256_loadu_si256((const __m256i *)vi[x]);
    c->bm = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
/* Pass 1: each key's products w v_d (lane b: block b % nb; an odd last pair's second weight 0) and their
 * largest per head, which is M (kernels.h); pass 2: u, and the pair's two keys' u as int16 pairs (lane b:
 * block b's) spread to the four weight vectors. */
ALWAYS_INLINE void att_q8_value_prep(const int ng, const att_q8_vctx *c, const float *w, size_t ss,
                                     const uint8_t *v, size_t kv_stride, int32_t c0, int32_t nk, __m256i *wt,
                                     float *S) {
    __m256 W[Q35_KV_Q8_VKEYS][4], mx[4];
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) mx[g] = _mm256_setzero_ps();
    const int32_t n2 = (nk + 1) & ~1;
    for (int32_t i = 0; i < n2; i++) {
        const int32_t p = c0 + (i < nk ? i : i - 1);
        const __m256 s = _mm256_permutevar8x32_ps(_mm256_maskload_ps((const float *)(v + (size_t)p * kv_stride), c->bm),
                                                  c->sidx);
        #pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            W[i][g] = _mm256_mul_ps(_mm256_set1_ps(i < nk ? w[(size_t)g * ss + (size_t)p] : 0.0f), s);
            mx[g] = _mm256_max_ps(mx[g], W[i][g]);
        }
    }
    __m256 iv[4];
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        float inv;
        q35_kv_q8_value_scales(hmax8(mx[g]), &inv, &S[g]);
        iv[g] = _mm256_set1_ps(inv);
    }
    for (int32_t j = 0; 2 * j < n2; j++)
        #pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            const __m256i u0 = _mm256_cvtps_epi32(_mm256_mul_ps(W[2 * j][g], iv[g]));
            const __m256i u1 = _mm256_cvtps_epi32(_mm256_mul_ps(W[2 * j + 1][g], iv[g]));
            const __m256i pr = _mm256_or_si256(u0, _mm256_slli_epi32(u1, 16));
            #pragma GCC unroll 4
            for (int x = 0; x < 4; x++) wt[(4 * j + g) * 4 + x] = _mm256_permutevar8x32_epi32(pr, c->vidx[x]);
        }
}

ALWAYS_INLINE void att_q8_value_tile(const int ng, const att_q8_vctx *c, float *o, size_t o_stride,
                                     const uint8_t *v, size_t kv_stride, int32_t c0, int32_t nk, int32_t d0,
                                     int32_t nb, const __m256i *wt, const float *S) {
    __m256i lo[4], hi[4];
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) lo[g] = hi[g] = _mm256_setzero_si256();
    const uint8_t *cv = v + sizeof(float) * (size_t)nb + d0 + (size_t)c0 * kv_stride;
    const int x = 2 * ((d0 / 16) & 1);
    for (int32_t j = 0; 2 * j < nk; j++, cv += 2 * kv_stride) {
        const __m256i a = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)cv));
        const __m256i b =
            _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(cv + (2 * j + 1 < nk ? kv_stride : 0))));
        const __m256i L = _mm256_unpacklo_epi16(a, b), H = _mm256_unpackhi_epi16(a, b);
        const __m256i *wj = wt + 16 * j + x;
        #pragma GCC unroll 4
        for (int g = 0; g < ng; g++) {
            lo[g] = _mm256_add_epi32(lo[g], _mm256_madd_epi16(L, wj[4 * g]));
            hi[g] = _mm256_add_epi32(hi[g], _mm256_madd_epi16(H, wj[4 * g + 1]));
            __asm__("" : "+x"(lo[g]), "+x"(hi[g])); /* accumulated in place: else GCC 12 copies each */
        }
    }
    #pragma GCC unroll 4
    for (int g = 0; g < ng; g++) {
        float *og = o + (size_t)g * o_stride + d0;
        const __m256 sg = _mm256_set1_ps(S[g]);
        _mm256_storeu_ps(og, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo[g], hi[g], 0x20)), sg,
                                             _mm256_loadu_ps(og)));
        _mm256_storeu_ps(og + 8, _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_permute2x128_si256(lo[g], hi[g], 0x31)), sg,
                                                 _mm256_loadu_ps(og + 8)));
    }
}
/* Scores of 2 keys x 4 heads with 8 blocks (HD 256), att_q8_score's bits: each 32 codes of a key
 * are loaded once for the four heads, a head's codes once for the two keys, and the eight
 * (key, head) vectors of block products are reduced together, through the same tree as hsum8
 * (lanes b + 4, then b + 2, then b + 1), instead of one hsum8 and one store each: on a Zen 3
 * core those reductions took a quarter of the attention's time at 32k keys. The last vector's
 * lane pairs are the heads' two scores, stored as pairs. Each (key, head) sum stays in a
 * register and is added to chunk by chunk: left free, GCC 12 unrolls the chunks and keeps most
 * of the 64 block products on the stack until it adds them (a store and a load each). One
 * thread's 8-bit attention (4 heads of 256, 32 KV heads of 2048 keys in cache, interleaved, the
 * least of 41 calls) took 64.9-65.3 ns per key and KV head so, 60.9-61.9 held (the same integer
 * sums, so the same bits). */
static inline void att_q8_tile_2x4(const att_q8_query *qq, const uint8_t *k, size_t kv_stride, int32_t p0,
                                   float scale, float *s, size_t n_keys) {
    const uint8_t *r0 = k + (size_t)p0 * kv_stride, *r1 = r0 + kv_stride;
    const int8_t *k0 = (const int8_t *)(r0 + 32), *k1 = (const int8_t *)(r1 + 32);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[2][4];
    #pragma GCC unroll 4
    for (int g = 0; g < 4; g++) acc[0][g] = acc[1][g] = _mm256_setzero_si256();
    #pragma GCC unroll 8
    for (int32_t j = 0; j < 256; j += 32) {
        const __m256i x0 = _mm256_loadu_si256((const __m256i *)(k0 + j)), x1 = _mm256_loadu_si256((const __m256i *)(k1 + j));
        #pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            const __m256i a = _mm256_load_si256((const __m256i *)(qq[g].a + j));
            const __m256i c = _mm256_load_si256((const __m256i *)(qq[g].c + j));
            acc[0][g] = _mm256_add_epi32(acc[0][g], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(x0, c)), ones));
            acc[1][g] = _mm256_add_epi32(acc[1][g], _mm256_madd_epi16(_mm256_maddubs_epi16(a, _mm256_sign_epi8(x1, c)), ones));
            __asm__("" : "+x"(acc[0][g]), "+x"(acc[1][g])); /* in registers, added in order (above) */
        }
    }
    const __m256 kd0 = _mm256_loadu_ps((const float *)r0), kd1 = _mm256_loadu_ps((const float *)r1);
    __m256 t[2][4];
    #pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        const __m256 qd = _mm256_load_ps(qq[g].d);
        t[0][g] = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[0][g]), _mm256_mul_ps(qd, kd0));
        t[1][g] = _mm256_mul_ps(_mm256_cvtepi32_ps(acc[1][g]), _mm256_mul_ps(qd, kd1));
    }
    /* v[0..7] = (head 0, key 0), (2, 0), (0, 1), (2, 1), (1, 0), (3, 0), (1, 1), (3, 1): after the
     * three steps lane l holds v[2l] for l < 4 and v[2(l - 4) + 1] above */
    const __m256 v[8] = {t[0][0], t[0][2], t[1][0], t[1][2], t[0][1], t[0][3], t[1][1], t[1][3]};
    __m256 b4[4];
    #pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        b4[i] = _mm256_add_ps(_mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x20),
                              _mm256_permute2f128_ps(v[2 * i], v[2 * i + 1], 0x31));
    const __m256 b2a = _mm256_add_ps(_mm256_shuffle_ps(b4[0], b4[1], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(b4[0], b4[1], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 b2b = _mm256_add_ps(_mm256_shuffle_ps(b4[2], b4[3], _MM_SHUFFLE(1, 0, 1, 0)),
                                     _mm256_shuffle_ps(b4[2], b4[3], _MM_SHUFFLE(3, 2, 3, 2)));
    const __m256 h = _mm256_mul_ps(_mm256_add_ps(_mm256_shuffle_ps(b2a, b2b, _MM_SHUFFLE(2, 0, 2, 0)),
                                                 _mm256_shuffle_ps(b2a, b2b, _MM_SHUFFLE(3, 1, 3, 1))),
                                   _mm256_set1_ps(scale));
    const __m128 lo = _mm256_castps256_ps128(h), hi = _mm256_extractf128_ps(h, 1);
    _mm_storel_pi((__m64 *)s, lo);
    _mm_storeh_pi((__m64 *)(s + n_keys), lo);
    _mm_storel_pi((__m64 *)(s + 2 * n_keys), hi);
    _mm_storeh_pi((__m64 *)(s + 3 * n_keys), hi);
}
#define ATT_Q8_TILE att_q8_tile_2x4
#define ATT_Q8_HDM 32
#define ATT_KP 2
#define ATT_FN q35_attend_heads_avx2
#define ATT_ROWS_FN q35_attend_rows_avx2
#define ATT_ROWS_Q8_FN q35_attend_rows_q8_avx2
/* L2 where the CPU's choice is (q35_kernels_prefetch_l2: AMD family 19h, Zen 3 and 4), else L1. On a Zen 4
 * VM with these kernels (one thread, one decode token's attention at the 9B shapes, 8k keys from DRAM,
 * interleaved, medians of 11) fp32 188 -> 107 ns per key and KV head, q8 68 -> 64; on a Zen 3 VM (8k and
 * 32k keys, 13 interleaved pairs) either level gave one thread the same 64-67 (q8) and 128-135 ns (fp32). */
#define ATT_PF_L2() q35_kernels_prefetch_l2()
#include "attend_driver.inc"

/* ---- Gated DeltaNet, chunked (prompts) ---- */

/* acc[r][u] += sum_{k < K} a[r * as + k] * b[k * bs + 8u] for R rows (R <= 4)
 * and 16 columns: the chunk's small matrix products, each output a chain of
 * FMAs over k in ascending order. */
ALWAYS_INLINE void mm_rows16(const int R, __m256 acc[4][2], const float *a, size_t as, const float *b, size_t bs,
                             int32_t K) {
    for (int32_t k = 0; k < K; k++) {
        __m256 b0 = _mm256_loadu_ps(b + (size_t)k * bs), b1 = _mm256_loadu_ps(b + (size_t)k * bs + 8);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 ar = _mm256_broadcast_ss(a + (size_t)r * as + k);
            acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
        }
    }
}

/* The chunk's three row-block products, R rows from row i0, 16 columns from d0:
 *   MM_VN:  U[i] -= W[i] S                                  (Vn, in place)
 *   MM_OUT: o[i] = e^G[i] (q[i] S) + sum_{j <= i} QK[i][j] Vn[j]
 *   MM_S:   S[e] = e^G_last S[e] + sum_j KsT[e][j] Vn[j]     (rows e of the state) */
enum { MM_VN, MM_OUT, MM_S };
typedef struct chunk_mats {
    float *S, *U, *o;
    const float *W, *q, *QK, *KsT, *eG;
    int32_t n, C, DK, DV;
    float elast;
} chunk_mats;

ALWAYS_INLINE void chunk_block(const int op, const int R, const chunk_mats *m, int32_t i0, int32_t d0) {
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        if (op == MM_S) {
            const float *s = m->S + (size_t)(i0 + r) * m->DV + d0;
            acc[r][0] = _mm256_mul_ps(_mm256_set1_ps(m->elast), _mm256_loadu_ps(s));
            acc[r][1] = _mm256_mul_ps(_mm256_set1_ps(m->elast), _mm256_loadu_ps(s + 8));
        } else {
            acc[r][0] = acc[r][1] = _mm256_setzero_ps();
        }
    }
    if (op == MM_VN) {
        mm_rows16(R, acc, m->W + (size_t)i0 * m->DK, m->DK, m->S + d0, m->DV, m->DK);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 2
            for (int h = 0; h < 2; h++) {
                float *u = m->U + (size_t)(i0 + r) * m->DV + d0 + 8 * h;
                _mm256_storeu_ps(u, _mm256_sub_ps(_mm256_loadu_ps(u), acc[r][h]));
            }
    } else if (op == MM_OUT) {
        mm_rows16(R, acc, m->q + (size_t)i0 * m->DK, m->DK, m->S + d0, m->DV, m->DK);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 eg = _mm256_set1_ps(m->eG[i0 + r]);
            acc[r][0] = _mm256_mul_ps(acc[r][0], eg);
            acc[r][1] = _mm256_mul_ps(acc[r][1], eg);
        }
        /* QK[i][j] is zero for j > i, so every row of the block may run to i0 + R */
        mm_rows16(R, acc, m->QK + (size_t)i0 * m->C, m->C, m->U + d0, m->DV, i0 + R);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(m->o + (size_t)(i0 + r) * m->DV + d0, acc[r][0]);
            _mm256_storeu_ps(m->o + (size_t)(i0 + r) * m->DV + d0 + 8, acc[r][1]);
        }
    } else {
        mm_rows16(R, acc, m->KsT + (size_t)i0 * m->C, m->C, m->U + d0, m->DV, m->n);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            _mm256_storeu_ps(m->S + (size_t)(i0 + r) * m->DV + d0, acc[r][0]);
            _mm256_storeu_ps(m->S + (size_t)(i0 + r) * m->DV + d0 + 8, acc[r][1]);
        }
    }
}

/* chunk_block over rows [0, rows) in blocks of 4 and every 16 columns. */
static void chunk_product(const int op, const chunk_mats *m, int32_t rows) {
    for (int32_t i0 = 0; i0 < rows; i0 += 4)
        for (int32_t d0 = 0; d0 < m->DV; d0 += 16) {
            switch (rows - i0 >= 4 ? 4 : rows - i0) {
            case 4: chunk_block(op, 4, m, i0, d0); break;
            case 3: chunk_block(op, 3, m, i0, d0); break;
            case 2: chunk_block(op, 2, m, i0, d0); break;
            default: chunk_block(op, 1, m, i0, d0); break;
            }
        }
}

/* (a . c, b . c) over n floats (n a multiple of 16). */
ALWAYS_INLINE void dot2(const float *a, const float *b, const float *c, int32_t n, float *ac, float *bc) {
    __m256 x0 = _mm256_setzero_ps(), x1 = _mm256_setzero_ps(), y0 = _mm256_setzero_ps(), y1 = _mm256_setzero_ps();
    for (int32_t d = 0; d < n; d += 16) {
        __m256 c0 = _mm256_loadu_ps(c + d), c1 = _mm256_loadu_ps(c + d + 8);
        x0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d), c0, x0);
        x1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + d + 8), c1, x1);
        y0 = _mm256_fmadd_ps(_mm256_loadu_ps(b + d), c0, y0);
        y1 = _mm256_fmadd_ps(_mm256_loadu_ps(b + d + 8), c1, y1);
    }
    *ac = hsum8(_mm256_add_ps(x0, x1));
    *bc = hsum8(_mm256_add_ps(y0, y1));
}

/* dst[i] = s * src[i] - sum_{j < i} A[i][j] dst[j] for one row i, n floats
 * (a multiple of 8) in column blocks of 64. */
static void forward_subst_row(float *dst, const float *src, float s, const float *Ai, int32_t i, size_t stride,
                              int32_t n) {
    const __m256 sv = _mm256_set1_ps(s);
    for (int32_t d0 = 0; d0 < n; d0 += 64) {
        const int nv = n - d0 >= 64 ? 8 : (n - d0) / 8;
        __m256 acc[8];
        for (int u = 0; u < nv; u++) acc[u] = _mm256_mul_ps(sv, _mm256_loadu_ps(src + d0 + 8 * u));
        for (int32_t j = 0; j < i; j++) {
            const __m256 a = _mm256_broadcast_ss(Ai + j);
            const float *row = dst + (size_t)j * stride + d0;
            if (nv == 8) {
                #pragma GCC unroll 8
                for (int u = 0; u < 8; u++) acc[u] = _mm256_fnmadd_ps(a, _mm256_loadu_ps(row + 8 * u), acc[u]);
            } else {
                for (int u = 0; u < nv; u++) acc[u] = _mm256_fnmadd_ps(a, _mm256_loadu_ps(row + 8 * u), acc[u]);
            }
        }
        for (int u = 0; u < nv; u++) _mm256_storeu_ps(dst + (size_t)i * stride + d0 + 8 * u, acc[u]);
    }
}

/* kernels.h's chunked form with the chunk's products as register-blocked
 * AVX2 loops (the reference's algorithm and scratch, the sums in other
 * orders: equal up to float rounding). DK and DV multiples of 16 (the
 * model's 128); other shapes use the reference. */
void q35_gdn_chunked_avx2(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                          float *o, int32_t T, int32_t DK, int32_t DV, float *scratch) {
    if (DK % 16 || DV % 16) {
        q35_gdn_chunked_ref(S, q, k, v, g, beta, o, T, DK, DV, scratch);
        return;
    }
    const int32_t C = Q35_GDN_CHUNK_ROWS;
    float *A = scratch, *QK = A + C * C, *U = QK + C * C, *W = U + (size_t)C * DV, *G = W + (size_t)C * DK;
    float *eG = G + C, *KsT = eG + C;
    for (int32_t c0 = 0; c0 < T; c0 += C) {
        const int32_t n = T - c0 < C ? T - c0 : C;
        const float *qc = q + (size_t)c0 * DK, *kc = k + (size_t)c0 * DK, *vc = v + (size_t)c0 * DV;
        const float *gc = g + c0, *bc = beta + c0;
        float acc = 0.0f;
        for (int32_t i = 0; i < n; i++) {
            acc += gc[i];
            G[i] = acc;
            eG[i] = expf(acc);
        }
        for (int32_t i = 0; i < n; i++) {
            for (int32_t j = 0; j <= i; j++) {
                float kk, qk, dm = expf(G[i] - G[j]);
                dot2(kc + (size_t)i * DK, qc + (size_t)i * DK, kc + (size_t)j * DK, DK, &kk, &qk);
                A[i * C + j] = j < i ? bc[i] * kk * dm : 0.0f;
                QK[i * C + j] = qk * dm;
            }
            for (int32_t j = i + 1; j < n; j++) QK[i * C + j] = 0.0f;
        }
        for (int32_t i = 0; i < n; i++) {
            forward_subst_row(U, vc + (size_t)i * DV, bc[i], A + i * C, i, DV, DV);
            forward_subst_row(W, kc + (size_t)i * DK, bc[i] * eG[i], A + i * C, i, DK, DK);
        }
        const float glast = G[n - 1];
        for (int32_t i = 0; i < n; i++) {
            const float sc = expf(glast - G[i]);
            for (int32_t e = 0; e < DK; e++) KsT[(size_t)e * C + i] = kc[(size_t)i * DK + e] * sc;
        }
        chunk_mats m = {S, U, o + (size_t)c0 * DV, W, qc, QK, KsT, eG, n, C, DK, DV, expf(glast)};
        chunk_product(MM_VN, &m, n);
        chunk_product(MM_OUT, &m, n);
        chunk_product(MM_S, &m, DK);
    }
}

/* ---- gemm_f32 ---- */

/* Rows [0, mr) of A against columns [0, 16) of B masked to nc, C's tile. */
ALWAYS_INLINE void gemm_tile_avx2(const int mr, float *C, size_t ldc, const float *A, size_t lda, const float *B,
                                  size_t ldb, int64_t K, int nc) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc), lane);
    const __m256i m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nc - 8), lane);
    __m256 acc[6][2];
    #pragma GCC unroll 6
    for (int r = 0; r < mr; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int64_t k = 0; k < K; k++) {
        const __m256 b0 = _mm256_maskload_ps(B + (size_t)k * ldb, m0), b1 = _mm256_maskload_ps(B + (size_t)k * ldb + 8, m1);
        #pragma GCC unroll 6
        for (int r = 0; r < mr; r++) {
            const __m256 a = _mm256_broadcast_ss(A + (size_t)r * lda + k);
            acc[r][0] = _mm256_fmadd_ps(a, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(a, b1, acc[r][1]);
        }
    }
    #pragma GCC unroll 6
    for (int r = 0; r < mr; r++) {
        _mm256_maskstore_ps(C + (size_t)r * ldc, m0, acc[r][0]);
        _mm256_maskstore_ps(C + (size_t)r * ldc + 8, m1, acc[r][1]);
    }
}

void q35_gemm_f32_avx2(float *C, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb, int64_t M,
                       int64_t N, int64_t K) {
    for (int64_t n0 = 0; n0 < N; n0 += 16) { /* a 16-column panel of B stays in cache for every row tile */
        const int nc = N - n0 < 16 ? (int)(N - n0) : 16;
        for (int64_t m0 = 0; m0 < M; m0 += 6) {
            float *c = C + (size_t)m0 * ldc + n0;
            const float *a = A + (size_t)m0 * lda, *b = B + n0;
            switch (M - m0 < 6 ? (int)(M - m0) : 6) {
            case 1: gemm_tile_avx2(1, c, ldc, a, lda, b, ldb, K, nc); break;
            case 2: gemm_tile_avx2(2, c, ldc, a, lda, b, ldb, K, nc); break;
            case 3: gemm_tile_avx2(3, c, ldc, a, lda, b, ldb, K, nc); break;
            case 4: gemm_tile_avx2(4, c, ldc, a, lda, b, ldb, K, nc); break;
            case 5: gemm_tile_avx2(5, c, ldc, a, lda, b, ldb, K, nc); break;
            default: gemm_tile_avx2(6, c, ldc, a, lda, b, ldb, K, nc); break;
            }
        }
    }
}

/* ---- softmax_rows ---- */

/* exp: attend_driver.inc's att_exp_neg (e^x for x <= 0, within 1.3 ulp; 0 below -87.34) */
void q35_softmax_rows_avx2(float *S, size_t lds, int64_t rows, int64_t n, float scale) {
    const __m256 sc = _mm256_set1_ps(scale);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int64_t n8 = n / 8 * 8;
    const __m256i tail = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - n8)), lane);
    for (int64_t r = 0; r < rows; r++) {
        float *s = S + (size_t)r * lds;
        __m256 mx = _mm256_set1_ps(-INFINITY);
        int64_t c = 0;
        for (; c < n8; c += 8) {
            __m256 v = _mm256_mul_ps(_mm256_loadu_ps(s + c), sc);
            _mm256_storeu_ps(s + c, v);
            mx = _mm256_max_ps(mx, v);
        }
        if (c < n) {
            __m256 v = _mm256_mul_ps(_mm256_maskload_ps(s + c, tail), sc);
            _mm256_maskstore_ps(s + c, tail, v);
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), v, _mm256_castsi256_ps(tail)));
        }
        __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
        m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        m4 = _mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1));
        const __m256 m = _mm256_set1_ps(_mm_cvtss_f32(m4));
        __m256 sum = _mm256_setzero_ps();
        for (c = 0; c < n8; c += 8) {
            __m256 e = att_exp_neg(_mm256_sub_ps(_mm256_loadu_ps(s + c), m));
            _mm256_storeu_ps(s + c, e);
            sum = _mm256_add_ps(sum, e);
        }
        if (c < n) {
            __m256 e = att_exp_neg(_mm256_sub_ps(_mm256_maskload_ps(s + c, tail), m));
            e = _mm256_and_ps(e, _mm256_castsi256_ps(tail));
            _mm256_maskstore_ps(s + c, tail, e);
            sum = _mm256_add_ps(sum, e);
        }
        const __m256 inv = _mm256_set1_ps(1.0f / hsum8(sum));
        for (c = 0; c < n8; c += 8) _mm256_storeu_ps(s + c, _mm256_mul_ps(_mm256_loadu_ps(s + c), inv));
        if (c < n) _mm256_maskstore_ps(s + c, tail, _mm256_mul_ps(_mm256_maskload_ps(s + c, tail), inv));
    }
}

/* ---- silu_mul, sigmoid_mul ---- */

/* With t = e^-|g| (never above 1, so no overflow), sigmoid(g) is 1 / (1 + t)
 * for g >= 0 and t / (1 + t) below: silu(g) u = (g >= 0 ? g : g t) / (1 +
 * t) u, and u sigmoid(g) = u ((g >= 0 ? 1 : t) / (1 + t)). blendv picks its
 * second operand where g's sign bit is set. A NaN g gives t = 0: silu's
 * numerator keeps it, sigmoid puts it back. */
static inline __m256 gate8(const int silu, __m256 g, __m256 u) {
    const __m256 t = att_exp_neg(_mm256_or_ps(g, _mm256_set1_ps(-0.0f))); /* -|g| */
    const __m256 den = _mm256_add_ps(_mm256_set1_ps(1.0f), t);
    if (silu) return _mm256_mul_ps(_mm256_div_ps(_mm256_blendv_ps(g, _mm256_mul_ps(g, t), g), den), u);
    const __m256 sig = _mm256_div_ps(_mm256_blendv_ps(_mm256_set1_ps(1.0f), t, g), den);
    return _mm256_mul_ps(u, _mm256_blendv_ps(sig, g, _mm256_cmp_ps(g, g, _CMP_UNORD_Q))); /* a NaN g stays NaN */
}

static inline __attribute__((always_inline)) void gate_mul(const int silu, float *h, const float *g, const float *u,
                                                           int64_t n) {
    const __m256 one = _mm256_set1_ps(1.0f);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(h + i, gate8(silu, _mm256_loadu_ps(g + i), u ? _mm256_loadu_ps(u + i) : one));
    if (i < n) { /* the tail through masked lanes: the same arithmetic */
        const __m256i m =
            _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        const __m256 um = u ? _mm256_maskload_ps(u + i, m) : one;
        _mm256_maskstore_ps(h + i, m, gate8(silu, _mm256_maskload_ps(g + i, m), um));
    }
}

void q35_silu_mul_avx2(float *h, const float *g, const float *u, int64_t n) { gate_mul(1, h, g, u, n); }

void q35_sigmoid_mul_avx2(float *h, const float *g, const float *u, int64_t n) { gate_mul(0, h, g, u, n); }

/* ---- rmsnorm1p ---- */

/* The sum of squares as two vectors of four doubles, which are the reference's eight partial sums (lane j
 * of the first is sum j, of the second sum 4 + j; products of floats are exact in double), then the
 * reference's tail and combination; the outputs the reference's float products. BF16 and F32 weights
 * here, other dtypes through the reference. */
void q35_rmsnorm1p_avx2(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps) {
    if (w->dtype != Q35_DT_BF16 && w->dtype != Q35_DT_F32) {
        q35_rmsnorm1p_ref(dst, src, w, n, eps);
        return;
    }
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int32_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(src + i);
        const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v)), hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
        s0 = _mm256_add_pd(s0, _mm256_mul_pd(lo, lo));
        s1 = _mm256_add_pd(s1, _mm256_mul_pd(hi, hi));
    }
    double s[8];
    _mm256_storeu_pd(s, s0);
    _mm256_storeu_pd(s + 4, s1);
    for (int32_t t = i; t < n; t++) s[0] += (double)src[t] * src[t];
    const double ss = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    const float r = 1.0f / sqrtf((float)(ss / n) + eps);
    const __m256 rv = _mm256_set1_ps(r), one = _mm256_set1_ps(1.0f);
    const int bf16 = w->dtype == Q35_DT_BF16;
    const uint16_t *wb = (const uint16_t *)w->data;
    const float *wf = (const float *)w->data;
    for (i = 0; i + 8 <= n; i += 8) {
        const __m256 wv = bf16 ? _mm256_castsi256_ps(_mm256_slli_epi32(
                                     _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(wb + i))), 16))
                               : _mm256_loadu_ps(wf + i);
        _mm256_storeu_ps(dst + i, _mm256_mul_ps(_mm256_mul_ps(_mm256_loadu_ps(src + i), rv), _mm256_add_ps(one, wv)));
    }
    for (; i < n; i++) dst[i] = src[i] * r * (1.0f + (bf16 ? q35_bf16_to_f32(wb[i]) : wf[i]));
}

/* ---- conv_silu ---- */

/* The 4 x 4 transposes in each 128-bit lane of a, b, c, d (rows): out[j]
 * is their column j. */
static inline void transpose_4x4x2(__m256 a, __m256 b, __m256 c, __m256 d, __m256 out[4]) {
    const __m256 t0 = _mm256_unpacklo_ps(a, b), t1 = _mm256_unpackhi_ps(a, b);
    const __m256 t2 = _mm256_unpacklo_ps(c, d), t3 = _mm256_unpackhi_ps(c, d);
    out[0] = _mm256_shuffle_ps(t0, t2, 0x44), out[1] = _mm256_shuffle_ps(t0, t2, 0xee);
    out[2] = _mm256_shuffle_ps(t1, t3, 0x44), out[3] = _mm256_shuffle_ps(t1, t3, 0xee);
}

/* Record l (s = 3 or 4 floats, channel after channel) as 4 floats; the
 * last 3-float record's fourth is not read (masked). */
static inline __m128 conv_rec(const float *p, int s, int l) {
    if (s == 3 && l == 7) return _mm_maskload_ps(p + 21, _mm_setr_epi32(-1, -1, -1, 0));
    return _mm_loadu_ps(p + (size_t)s * l);
}

/* Eight channels' records of s floats as one vector per element: v[i]
 * holds element i of channels 0..7 (for s = 3, v[3] is not defined). */
static inline void conv_recs_load(const float *p, int s, __m256 v[4]) {
    transpose_4x4x2(_mm256_set_m128(conv_rec(p, s, 4), conv_rec(p, s, 0)),
                    _mm256_set_m128(conv_rec(p, s, 5), conv_rec(p, s, 1)),
                    _mm256_set_m128(conv_rec(p, s, 6), conv_rec(p, s, 2)),
                    _mm256_set_m128(conv_rec(p, s, 7), conv_rec(p, s, 3)), v);
}

/* The inverse for 3-float records (a history of 3 taps): each channel's
 * record stored as 4 floats in channel order, so that its fourth is
 * overwritten by the next channel's, and the last one's through the mask. */
static inline void conv_hist_store(float *p, const __m256 h[3]) {
    __m256 c[4];
    transpose_4x4x2(h[0], h[1], h[2], _mm256_setzero_ps(), c);
    for (int l = 0; l < 7; l++)
        _mm_storeu_ps(p + 3 * l, l < 4 ? _mm256_castps256_ps128(c[l]) : _mm256_extractf128_ps(c[l - 4], 1));
    _mm_maskstore_ps(p + 21, _mm_setr_epi32(-1, -1, -1, 0), _mm256_extractf128_ps(c[3], 1));
}

/* conv_silu8 for 4 taps and 8 whole channels: the taps and the history
 * transposed in registers. Rows are summed as conv_silu8 sums them. */
static void conv_silu8_k4(float *y, size_t ldy, const float *x, size_t ldx, const float *w, float *state, int32_t T,
                          float *rows, size_t rows_stride) {
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 wv[4], hv[4];
    conv_recs_load(w, 4, wv);
    conv_recs_load(state, 3, hv);
    __m256 h0 = hv[0], h1 = hv[1], h2 = hv[2]; /* named, so that they stay in registers */
    for (int32_t t = 0; t < T; t++) {
        const __m256 h3 = _mm256_loadu_ps(x + (size_t)t * ldx);
        __m256 acc = _mm256_add_ps(_mm256_setzero_ps(), _mm256_mul_ps(wv[0], h0)); /* from +0, as the reference */
        acc = _mm256_add_ps(acc, _mm256_mul_ps(wv[1], h1));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(wv[2], h2));
        acc = _mm256_add_ps(acc, _mm256_mul_ps(wv[3], h3));
        _mm256_storeu_ps(y + (size_t)t * ldy, gate8(1, acc, one));
        h0 = h1, h1 = h2, h2 = h3;
        if (rows && t + 1 < T) conv_hist_store(rows + (size_t)t * rows_stride, (const __m256[3]){h0, h1, h2});
    }
    conv_hist_store(state, (const __m256[3]){h0, h1, h2});
}

/* Channels [c, c + 8) (lanes under m) over every row: the taps and the
 * history transposed into one vector per tap, then per row one multiply and
 * one add per tap in tap order (the reference's sum, bit for bit) and
 * silu_mul's silu. CK is a literal after inlining where it is 4. */
static inline __attribute__((always_inline)) void conv_silu8(const int CK, float *y, size_t ldy, const float *x,
                                                             size_t ldx, const float *w, float *state, int nl,
                                                             int32_t T, float *rows, size_t rows_stride) {
    float wt[16][8] = {{0}}, ht[16][8] = {{0}};
    for (int l = 0; l < nl; l++)
        for (int i = 0; i < CK; i++) {
            wt[i][l] = w[(size_t)l * CK + i];
            if (i < CK - 1) ht[i][l] = state[(size_t)l * (CK - 1) + i];
        }
    const __m256i m = _mm256_cmpgt_epi32(_mm256_set1_epi32(nl), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 one = _mm256_set1_ps(1.0f);
    __m256 wv[16], hv[16];
    for (int i = 0; i < CK; i++) wv[i] = _mm256_loadu_ps(wt[i]), hv[i] = _mm256_loadu_ps(ht[i]);
    for (int32_t t = 0; t < T; t++) {
        hv[CK - 1] = _mm256_maskload_ps(x + (size_t)t * ldx, m);
        __m256 acc = _mm256_setzero_ps();
        for (int i = 0; i < CK; i++) acc = _mm256_add_ps(acc, _mm256_mul_ps(wv[i], hv[i]));
        _mm256_maskstore_ps(y + (size_t)t * ldy, m, gate8(1, acc, one));
        for (int i = 0; i < CK - 1; i++) hv[i] = hv[i + 1];
        if (rows && t + 1 < T) {
            for (int i = 0; i < CK - 1; i++) _mm256_storeu_ps(ht[i], hv[i]);
            float *r = rows + (size_t)t * rows_stride;
            for (int l = 0; l < nl; l++)
                for (int i = 0; i < CK - 1; i++) r[(size_t)l * (CK - 1) + i] = ht[i][l];
        }
    }
    for (int i = 0; i < CK - 1; i++) _mm256_storeu_ps(ht[i], hv[i]);
    for (int l = 0; l < nl; l++)
        for (int i = 0; i < CK - 1; i++) state[(size_t)l * (CK - 1) + i] = ht[i][l];
}

void q35_conv_silu_avx2(float *y, size_t ldy, const float *x, size_t ldx, const float *w, float *state, int32_t n,
                        int32_t T, int32_t CK, float *rows, size_t rows_stride) {
    for (int32_t c = 0; c < n; c += 8) {
        const int nl = n - c < 8 ? (int)(n - c) : 8;
        float *yc = y + c, *sc = state + (size_t)c * (CK - 1), *rc = rows ? rows + (size_t)c * (CK - 1) : NULL;
        if (CK == 4 && nl == 8) conv_silu8_k4(yc, ldy, x + c, ldx, w + (size_t)c * 4, sc, T, rc, rows_stride);
        else if (CK == 4) conv_silu8(4, yc, ldy, x + c, ldx, w + (size_t)c * 4, sc, nl, T, rc, rows_stride);
        else conv_silu8(CK, yc, ldy, x + c, ldx, w + (size_t)c * CK, sc, nl, T, rc, rows_stride);
    }
}

