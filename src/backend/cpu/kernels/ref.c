/* ref.c: scalar reference kernels (see kernels.h). Correctness first: the
 * matmuls widen each weight to float (bfp blocks through the codec in bfp.c)
 * and accumulate in double; the GDN recurrence is the same algorithm as the
 * vector versions, in plain loops. */
#include "backend/cpu/kernels/kernels.h"
#include "formats/bfp.h"
#include "base/util.h"

#include <math.h>
#include <string.h>

static void row_to_f32(float *out, const q35_tensor *W, int64_t r) {
    int64_t n = W->shape[W->ndim - 1];
    const char *base = (const char *)W->data;
    switch (W->dtype) {
    case Q35_DT_F32:
        memcpy(out, base + (size_t)(r * n) * 4, (size_t)n * 4);
        break;
    case Q35_DT_BF16: {
        const uint16_t *p = (const uint16_t *)(base + (size_t)(r * n) * 2);
        for (int64_t i = 0; i < n; i++) out[i] = q35_bf16_to_f32(p[i]);
        break;
    }
    case Q35_DT_F16: {
        const uint16_t *p = (const uint16_t *)(base + (size_t)(r * n) * 2);
        for (int64_t i = 0; i < n; i++) out[i] = q35_f16_to_f32(p[i]);
        break;
    }
    case Q35_DT_BFP8:
    case Q35_DT_BFP4: /* 16-row panels, see bfp.h */
        q35_bfp_get_row(W->dtype, base, n, r, out);
        break;
    default:
        for (int64_t i = 0; i < n; i++) out[i] = 0.0f;
        break;
    }
}

void q35_get_row_ref(float *out, const q35_tensor *W, int64_t r) { row_to_f32(out, W, r); }

void q35_matmul_ref(float *y, const q35_tensor *W, const float *x, int64_t n_tok, int64_t o0, int64_t o1) {
    int64_t n_out = W->shape[0], n_in = W->shape[W->ndim - 1];
    float row[n_in > 0 ? n_in : 1]; /* n_in is a hidden size: a few KiB at most */
    for (int64_t o = o0; o < o1; o++) {
        row_to_f32(row, W, o);
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xt = x + t * n_in;
            double acc = 0.0;
            for (int64_t i = 0; i < n_in; i++) acc += (double)row[i] * (double)xt[i];
            y[t * n_out + o] = (float)acc;
        }
    }
}

void q35_matmul_n_ref(int n, float *const *ys, const q35_tensor *const *Ws, const float *x, int64_t n_tok,
                      const int64_t *o0, const int64_t *o1) {
    for (int i = 0; i < n; i++) q35_matmul_ref(ys[i], Ws[i], x, n_tok, o0[i], o1[i]);
}

/* The two reads of S that give a = S^T k and b = S^T q, summed over i in
 * ascending order per column j. */
static void gdn_read(float *a, float *b, const float *S, const float *k, const float *q, int32_t DK, int32_t DV) {
    for (int32_t j = 0; j < DV; j++) a[j] = b[j] = 0.0f;
    for (int32_t i = 0; i < DK; i++)
        for (int32_t j = 0; j < DV; j++) {
            a[j] += k[i] * S[(size_t)i * DV + j];
            b[j] += q[i] * S[(size_t)i * DV + j];
        }
}

void q35_gdn_recurrent_ref(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                           float *o, int32_t T, int32_t DK, int32_t DV, float *S_after, size_t after_stride,
                           const float *S_next) {
    (void)S_next;
    float a[DV > 0 ? DV : 1], b[DV > 0 ? DV : 1], delta[DV > 0 ? DV : 1]; /* DV: a head dim, <= a few hundred */
    gdn_read(a, b, S, k, q, DK, DV);
    for (int32_t t = 0; t < T; t++) {
        const float *qt = q + (size_t)t * DK, *kt = k + (size_t)t * DK, *vt = v + (size_t)t * DV;
        const float decay = expf(g[t]);
        float qk = 0.0f;
        for (int32_t i = 0; i < DK; i++) qk += qt[i] * kt[i];
        for (int32_t j = 0; j < DV; j++) {
            delta[j] = beta[t] * (vt[j] - decay * a[j]);
            o[(size_t)t * DV + j] = decay * b[j] + qk * delta[j];
        }
        for (int32_t i = 0; i < DK; i++)
            for (int32_t j = 0; j < DV; j++) S[(size_t)i * DV + j] = decay * S[(size_t)i * DV + j] + kt[i] * delta[j];
        if (t + 1 < T) {
            if (S_after) memcpy(S_after + (size_t)t * after_stride, S, sizeof(float) * (size_t)DK * DV);
            gdn_read(a, b, S, kt + DK, qt + DK, DK, DV);
        }
    }
}

size_t q35_gdn_chunk_scratch_floats(int32_t DK, int32_t DV) {
    size_t C = Q35_GDN_CHUNK_ROWS;
    /* A, QK (C, C); U (C, DV); W (C, DK); G, e^G (C); k scaled, transposed (DK, C); tmp (DV), tmpk (DK) */
    return C * C * 2 + C * (size_t)DV + C * (size_t)DK + C * 2 + (size_t)DK * C + (size_t)DV + (size_t)DK;
}

/* Chunked Gated DeltaNet (kernels.h), in plain loops. */
void q35_gdn_chunked_ref(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                     float *o, int32_t T, int32_t DK, int32_t DV, float *scratch) {
    const int32_t C = Q35_GDN_CHUNK_ROWS;
    float *A = scratch, *QK = A + C * C, *U = QK + C * C, *W = U + (size_t)C * DV, *G = W + (size_t)C * DK;
    float *tmp = G + C, *tmpk = tmp + DV;
    for (int32_t c0 = 0; c0 < T; c0 += C) {
        int32_t n = T - c0 < C ? T - c0 : C;
        const float *qc = q + (size_t)c0 * DK, *kc = k + (size_t)c0 * DK, *vc = v + (size_t)c0 * DV;
        const float *gc = g + c0, *bc = beta + c0;
        float *oc = o + (size_t)c0 * DV;
        float acc = 0.0f;
        for (int32_t i = 0; i < n; i++) { acc += gc[i]; G[i] = acc; }
        /* strictly lower part of (beta k) k^T * D, and the (q k^T) * D lower part */
        for (int32_t i = 0; i < n; i++)
            for (int32_t j = 0; j < n; j++) {
                float kk = 0.0f, qk = 0.0f;
                if (j <= i) {
                    for (int32_t d = 0; d < DK; d++) {
                        kk += kc[(size_t)i * DK + d] * kc[(size_t)j * DK + d];
                        qk += qc[(size_t)i * DK + d] * kc[(size_t)j * DK + d];
                    }
                }
                float dm = j <= i ? expf(G[i] - G[j]) : 0.0f;
                A[i * C + j] = j < i ? bc[i] * kk * dm : 0.0f;
                QK[i * C + j] = qk * dm;
            }
        /* forward substitution: row i of U = beta_i v_i - sum_{j<i} A[i][j] U[j] (same for W) */
        for (int32_t i = 0; i < n; i++) {
            float eg = expf(G[i]);
            for (int32_t d = 0; d < DV; d++) {
                float s = bc[i] * vc[(size_t)i * DV + d];
                for (int32_t j = 0; j < i; j++) s -= A[i * C + j] * U[(size_t)j * DV + d];
                U[(size_t)i * DV + d] = s;
            }
            for (int32_t d = 0; d < DK; d++) {
                float s = bc[i] * kc[(size_t)i * DK + d] * eg;
                for (int32_t j = 0; j < i; j++) s -= A[i * C + j] * W[(size_t)j * DK + d];
                W[(size_t)i * DK + d] = s;
            }
        }
        /* Vn = U - W S (in place in U), then the outputs */
        for (int32_t i = 0; i < n; i++) {
            for (int32_t d = 0; d < DV; d++) tmp[d] = 0.0f;
            for (int32_t e = 0; e < DK; e++) {
                float w = W[(size_t)i * DK + e];
                for (int32_t d = 0; d < DV; d++) tmp[d] += w * S[(size_t)e * DV + d];
            }
            for (int32_t d = 0; d < DV; d++) U[(size_t)i * DV + d] -= tmp[d];
        }
        for (int32_t i = 0; i < n; i++) {
            float eg = expf(G[i]);
            for (int32_t d = 0; d < DV; d++) tmp[d] = 0.0f;
            for (int32_t e = 0; e < DK; e++) {
                float qe = qc[(size_t)i * DK + e] * eg;
                for (int32_t d = 0; d < DV; d++) tmp[d] += qe * S[(size_t)e * DV + d];
            }
            for (int32_t j = 0; j <= i; j++) {
                float a = QK[i * C + j];
                for (int32_t d = 0; d < DV; d++) tmp[d] += a * U[(size_t)j * DV + d];
            }
            for (int32_t d = 0; d < DV; d++) oc[(size_t)i * DV + d] = tmp[d];
        }
        /* carry the state to the end of the chunk */
        float glast = G[n - 1], elast = expf(glast);
        for (int32_t e = 0; e < DK * DV; e++) S[e] *= elast;
        for (int32_t i = 0; i < n; i++) {
            float sc = expf(glast - G[i]);
            for (int32_t e = 0; e < DK; e++) tmpk[e] = kc[(size_t)i * DK + e] * sc;
            for (int32_t e = 0; e < DK; e++)
                for (int32_t d = 0; d < DV; d++) S[(size_t)e * DV + d] += tmpk[e] * U[(size_t)i * DV + d];
        }
    }
}

/* scores[0, n_keys) (mx their largest) in place by their softmax: expf, the sum in double */
static void softmax_weights(float *scores, int32_t n_keys, float mx) {
    double sum = 0.0;
    for (int32_t p = 0; p < n_keys; p++) { scores[p] = expf(scores[p] - mx); sum += scores[p]; }
    const float inv = (float)(1.0 / sum);
    for (int32_t p = 0; p < n_keys; p++) scores[p] *= inv;
}

/* fp32 rows kv_stride floats apart */
static void attend_head(float *o, const float *q, const float *k, const float *v, size_t kv_stride, int32_t n_keys,
                        int32_t HD, float scale, float *scores) {
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_keys; p++) {
        double acc = 0.0;
        for (int32_t d = 0; d < HD; d++) acc += (double)q[d] * k[(size_t)p * kv_stride + (size_t)d];
        scores[p] = (float)acc * scale;
        if (scores[p] > mx) mx = scores[p];
    }
    softmax_weights(scores, n_keys, mx);
    for (int32_t d = 0; d < HD; d++) o[d] = 0.0f;
    for (int32_t p = 0; p < n_keys; p++)
        for (int32_t d = 0; d < HD; d++) o[d] += scores[p] * v[(size_t)p * kv_stride + (size_t)d];
}

/* one query head over the 8-bit cache: its integer scores, then the values by blocks of keys, each
 * weight rounded to 15 bits of the block's largest (kernels.h) */
static void attend_head_q8(float *o, const float *q, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                           int32_t n_keys, int32_t HD, float scale, float *scores) {
    const int32_t nb = q35_kv_q8_nblocks(HD);
    uint8_t qrow[(32 + 4) * Q35_KV_Q8_MAX_BLOCKS];
    q35_kv_q8_quantize(qrow, q, HD);
    float qd[Q35_KV_Q8_MAX_BLOCKS], kd[Q35_KV_Q8_MAX_BLOCKS];
    memcpy(qd, qrow, sizeof(float) * (size_t)nb);
    const int8_t *qc = (const int8_t *)(qrow + sizeof(float) * (size_t)nb);
    float mx = -INFINITY;
    for (int32_t p = 0; p < n_keys; p++) {
        const uint8_t *row = k + (size_t)p * kv_stride;
        const int8_t *kc = (const int8_t *)(row + sizeof(float) * (size_t)nb);
        int32_t I[Q35_KV_Q8_MAX_BLOCKS] = {0};
        for (int32_t d = 0; d < HD; d++) I[q35_kv_q8_block_of(d, nb)] += (int32_t)qc[d] * kc[d];
        memcpy(kd, row, sizeof(float) * (size_t)nb);
        scores[p] = q35_kv_q8_score_sum(I, qd, kd, nb) * scale;
        if (scores[p] > mx) mx = scores[p];
    }
    softmax_weights(scores, n_keys, mx);
    for (int32_t d = 0; d < HD; d++) o[d] = 0.0f;
    for (int32_t p0 = 0; p0 < n_keys; p0 += Q35_KV_Q8_VKEYS) {
        const int32_t p1 = p0 + Q35_KV_Q8_VKEYS < n_keys ? p0 + Q35_KV_Q8_VKEYS : n_keys;
        float M = 0.0f, inv, S;
        for (int32_t p = p0; p < p1; p++) {
            float vmax = 0.0f;
            memcpy(kd, v + (size_t)p * kv_stride, sizeof(float) * (size_t)nb);
            for (int32_t b = 0; b < nb; b++) vmax = kd[b] > vmax ? kd[b] : vmax;
            M = scores[p] * vmax > M ? scores[p] * vmax : M;
        }
        q35_kv_q8_value_scales(M, &inv, &S);
        int32_t I[32 * Q35_KV_Q8_MAX_BLOCKS] = {0};
        for (int32_t p = p0; p < p1; p++) {
            const uint8_t *row = v + (size_t)p * kv_stride;
            const int8_t *vc = (const int8_t *)(row + sizeof(float) * (size_t)nb);
            int32_t u[Q35_KV_Q8_MAX_BLOCKS];
            memcpy(kd, row, sizeof(float) * (size_t)nb);
            for (int32_t b = 0; b < nb; b++) u[b] = (int32_t)rintf(scores[p] * kd[b] * inv);
            for (int32_t d = 0; d < HD; d++) I[d] += u[q35_kv_q8_block_of(d, nb)] * vc[d];
        }
        for (int32_t d = 0; d < HD; d++) o[d] = fmaf((float)I[d], S, o[d]);
    }
}

void q35_attend_head_ref(float *o, const float *q, const float *k, const float *v, size_t kv_stride, int32_t n_keys,
                         int32_t HD, float scale, float *scores) {
    attend_head(o, q, k, v, kv_stride, n_keys, HD, scale, scores);
}

void q35_attend_heads_ref(float *o, size_t o_stride, const float *q, size_t q_stride, int32_t G, const float *k,
                          const float *v, size_t kv_stride, int32_t n_keys, int32_t HD, float scale, float *scores) {
    for (int32_t g = 0; g < G; g++)
        q35_attend_head_ref(o + (size_t)g * o_stride, q + (size_t)g * q_stride, k, v, kv_stride, n_keys, HD, scale,
                            scores);
}

void q35_attend_rows_ref(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row, size_t q_stride,
                         int32_t R, int32_t G, const float *k, const float *v, size_t kv_stride, int32_t n_keys0,
                         int32_t key_step, int32_t HD, float scale, float *scores) {
    for (int32_t r = 0; r < R; r++)
        q35_attend_heads_ref(o + (size_t)r * o_row, o_stride, q + (size_t)r * q_row, q_stride, G, k, v, kv_stride,
                             n_keys0 + r * key_step, HD, scale, scores);
}

void q35_attend_rows_q8_ref(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row, size_t q_stride,
                            int32_t R, int32_t G, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                            int32_t n_keys0, int32_t key_step, int32_t HD, float scale, float *scores) {
    for (int32_t r = 0; r < R; r++)
        for (int32_t g = 0; g < G; g++)
            attend_head_q8(o + (size_t)r * o_row + (size_t)g * o_stride, q + (size_t)r * q_row + (size_t)g * q_stride,
                           k, v, kv_stride, n_keys0 + r * key_step, HD, scale, scores);
}

void q35_gemm_f32_ref(float *C, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb, int64_t M,
                      int64_t N, int64_t K) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0.0;
            for (int64_t k = 0; k < K; k++) acc += (double)A[m * lda + k] * B[k * ldb + n];
            C[m * ldc + n] = (float)acc;
        }
}

void q35_softmax_rows_ref(float *S, size_t lds, int64_t rows, int64_t n, float scale) {
    for (int64_t r = 0; r < rows; r++) {
        float *s = S + (size_t)r * lds, mx = -INFINITY;
        for (int64_t c = 0; c < n; c++) {
            s[c] *= scale;
            if (s[c] > mx) mx = s[c];
        }
        double sum = 0.0;
        for (int64_t c = 0; c < n; c++) s[c] = expf(s[c] - mx), sum += s[c];
        const float inv = (float)(1.0 / sum);
        for (int64_t c = 0; c < n; c++) s[c] *= inv;
    }
}

void q35_silu_mul_ref(float *h, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = g[i] / (1.0f + expf(-g[i])) * (u ? u[i] : 1.0f);
}

void q35_conv_silu_ref(float *y, size_t ldy, const float *x, size_t ldx, const float *w, float *state, int32_t n,
                       int32_t T, int32_t CK, float *rows, size_t rows_stride) {
    for (int32_t c = 0; c < n; c++) {
        float hist[16];
        float *st = state + (size_t)c * (CK - 1);
        for (int32_t i = 0; i < CK - 1; i++) hist[i] = st[i];
        for (int32_t t = 0; t < T; t++) {
            hist[CK - 1] = x[(size_t)t * ldx + c];
            float acc = 0.0f;
            for (int32_t i = 0; i < CK; i++) acc += w[(size_t)c * CK + i] * hist[i];
            y[(size_t)t * ldy + c] = acc / (1.0f + expf(-acc));
            for (int32_t i = 0; i < CK - 1; i++) hist[i] = hist[i + 1];
            if (rows && t + 1 < T)
                memcpy(rows + (size_t)t * rows_stride + (size_t)c * (CK - 1), hist, sizeof(float) * (size_t)(CK - 1));
        }
        for (int32_t i = 0; i < CK - 1; i++) st[i] = hist[i];
    }
}

void q35_sigmoid_mul_ref(float *h, const float *g, const float *u, int64_t n) {
    for (int64_t i = 0; i < n; i++) h[i] = u[i] * (1.0f / (1.0f + expf(-g[i])));
}

void q35_rmsnorm1p_ref(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps) {
    const float r = 1.0f / sqrtf((float)(q35_sum_squares(src, n) / n) + eps);
    for (int32_t i = 0; i < n; i++) {
        const float wf = w->dtype == Q35_DT_BF16  ? q35_bf16_to_f32(((const uint16_t *)w->data)[i])
                         : w->dtype == Q35_DT_F32 ? ((const float *)w->data)[i]
                                                  : q35_tensor_get_f32(w, i);
        dst[i] = src[i] * r * (1.0f + wf);
    }
}

uint64_t q35_read_stream_ref(const void *p, size_t bytes) {
    const uint64_t *q = p;
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= bytes / 8; i += 8)
        for (int j = 0; j < 8; j++) s[j] += q[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

const q35_kernels q35_kernels_ref = {"ref", q35_matmul_n_ref, q35_get_row_ref, q35_gdn_recurrent_ref,
                                     q35_gdn_chunked_ref, q35_attend_heads_ref, q35_read_stream_ref,
                                     q35_attend_rows_ref, q35_gemm_f32_ref, q35_softmax_rows_ref,
                                     q35_attend_rows_q8_ref, q35_silu_mul_ref,
                                     q35_sigmoid_mul_ref, q35_conv_silu_ref, q35_rmsnorm1p_ref};
