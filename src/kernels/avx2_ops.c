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
 * Attention of one query head against the KV cache: dot products with four
 * accumulators, a scalar softmax, then the weighted sum of value rows in
 * column blocks of 64 floats. Head dims not a multiple of 32 use the
 * reference. */
#include "kernels.h"

#include <immintrin.h>
#include <math.h>
#include <stdint.h>

#define ALWAYS_INLINE static inline __attribute__((always_inline))

ALWAYS_INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* a[j0..j0+8nv) = sum_i k[i] S[i][j], b likewise with q. */
ALWAYS_INLINE void gdn_read_block(const int nv, float *a, float *b, const float *S, const float *k, const float *q,
                                  int32_t DK, int32_t DV, int32_t j0) {
    __m256 acc_a[4], acc_b[4];
    #pragma GCC unroll 4
    for (int u = 0; u < nv; u++) acc_a[u] = acc_b[u] = _mm256_setzero_ps();
    for (int32_t i = 0; i < DK; i++) {
        const float *row = S + (size_t)i * DV + j0;
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
 * row's a and b from the new values exactly as gdn_read_block does. */
ALWAYS_INLINE void gdn_update_block(const int nv, float *S, const float *k, const float *delta, float decay,
                                    float *after, int stream, const float *kn, const float *qn, float *a, float *b,
                                    int32_t DK, int32_t DV, int32_t j0) {
    __m256 d[4], acc_a[4], acc_b[4];
    const __m256 dec = _mm256_set1_ps(decay);
    #pragma GCC unroll 4
    for (int u = 0; u < nv; u++) {
        d[u] = _mm256_loadu_ps(delta + j0 + 8 * u);
        acc_a[u] = acc_b[u] = _mm256_setzero_ps();
    }
    for (int32_t i = 0; i < DK; i++) {
        float *row = S + (size_t)i * DV + j0;
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
                            size_t after_stride) {
    if (DV % 8 || DV > 1024) {
        q35_gdn_recurrent_ref(S, q, k, v, g, beta, o, T, DK, DV, S_after, after_stride);
        return;
    }
    float a[1024], b[1024], delta[1024];
    const int stream = S_after && (uintptr_t)S_after % 32 == 0 && after_stride % 8 == 0; /* every row 32-byte aligned */
    int32_t j0 = 0;
    for (; j0 + 32 <= DV; j0 += 32) gdn_read_block(4, a, b, S, k, q, DK, DV, j0);
    for (; j0 < DV; j0 += 8) gdn_read_block(1, a, b, S, k, q, DK, DV, j0);
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
            gdn_update_block(4, S, kt, delta, decay, after, stream, kn, qn, a, b, DK, DV, j0);
        for (; j0 < DV; j0 += 8) gdn_update_block(1, S, kt, delta, decay, after, stream, kn, qn, a, b, DK, DV, j0);
    }
    if (stream) _mm_sfence();
}

void q35_attend_head_avx2(float *o, const float *q, const float *k, const float *v, size_t kv_stride, int32_t n_keys,
                          int32_t HD, float scale, float *scores) {
    if (HD % 32) {
        q35_attend_head_ref(o, q, k, v, kv_stride, n_keys, HD, scale, scores);
        return;
    }
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_keys; p++) {
        const float *kp = k + (size_t)p * kv_stride;
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int32_t d = 0; d < HD; d += 32)
            #pragma GCC unroll 4
            for (int u = 0; u < 4; u++)
                acc[u] = _mm256_fmadd_ps(_mm256_loadu_ps(q + d + 8 * u), _mm256_loadu_ps(kp + d + 8 * u), acc[u]);
        float s = hsum8(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]))) * scale;
        scores[p] = s;
        if (s > mx) mx = s;
    }
    double sum = 0.0;
    for (int32_t p = 0; p < n_keys; p++) { scores[p] = expf(scores[p] - mx); sum += scores[p]; }
    const float inv = (float)(1.0 / sum);
    for (int32_t d = 0; d < HD; d += 32) {
        __m256 acc[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int32_t p = 0; p < n_keys; p++) {
            const float *vp = v + (size_t)p * kv_stride + d;
            __m256 w = _mm256_set1_ps(scores[p] * inv);
            #pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[u] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp + 8 * u), acc[u]);
        }
        #pragma GCC unroll 4
        for (int u = 0; u < 4; u++) _mm256_storeu_ps(o + d + 8 * u, acc[u]);
    }
}
