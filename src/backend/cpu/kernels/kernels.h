/* kernels.h: the compute kernels the forward pass calls.
 *
 * ref.c is the scalar reference: plain loops, double accumulation, every
 * dtype. It is the oracle the per-ISA kernels are tested against. avx2.c,
 * avx512.c and avx512bf16.c are compiled with their own instruction-set
 * flags and each exports one q35_kernels table; dispatch.c picks one at
 * start-up by cpuid (the last of ref, avx2, avx512 that the CPU runs), or
 * the one named by the environment variable Q35_KERNELS, the only way to
 * get avx512bf16 (less exact for BF16 weights, below). Nothing else in the
 * engine needs -m flags.
 *
 * Tolerances of the fast tables against ref, per output y = sum_i w_i x_i:
 *  - F32, F16, BF16 weights: float FMA with x kept in fp32; the error is
 *    float rounding, |dy| <= 1e-5 * sum_i |w_i x_i| in the tests.
 *  - BF16 weights in avx512bf16: x is rounded to bf16 (nearest even, 8
 *    significant bits) and vdpbf16ps adds the exact products into fp32,
 *    with denormal inputs and results flushed to zero. Rounding to 8 bits
 *    moves x by at most half a unit in its last place, less than 2^-8 of
 *    |x|, so each product is off by less than 2^-8 of itself and
 *    |dy| <= (2^-8 + 1e-5) * sum_i |w_i x_i|
 *    (the second term the fp32 accumulation), plus 2^-126 * (sum_i |w_i| +
 *    sum_i |x_i| + n_in) for the flushed denormals. |x| at or above
 *    (2 - 2^-8) * 2^127 rounds to infinity.
 *  - BFP4, BFP8 weights: x is quantized per 16-value block to int8
 *    (scale d_b = max_b |x| / 127, round to nearest) and the block dot
 *    products run on integers, exactly. So |dy| <= sum_b (d_b / 2) *
 *    sum_{i in b} |w_i|, plus float rounding: at most 1/254 of sum_b
 *    max_b|x| * sum_{i in b}|w_i|, and in practice a few 1e-4 of
 *    sum_i |w_i x_i| on random data (tests/test_kernels.c checks the bound).
 *    Each block then ends in one FMA, in block order: acc = fma(float(dot_b),
 *    2^(E_b - bias) * d_b, acc), the same bits on every table
 *    (kernels.bfp_is_the_exact_integer_dot computes it in scalar C).
 *
 * Every table computes one (token, row) output in the same order whatever
 * n_tok and [o0, o1) are, so results are bitwise independent of batching
 * and of how rows are split across threads (tested). */
#ifndef Q35_KERNELS_H
#define Q35_KERNELS_H

#include "qwen35.h"
#include "formats/kv_q8.h"
#include "formats/tensor.h"

#include <stddef.h>

/* y[t*n_out + o] = sum_i W[o,i] * x[t*n_in + i] for t < n_tok and o in [o0, o1),
 * where W is [n_out, n_in]. Rows outside [o0, o1) are not written. */
void q35_matmul_ref(float *y, const q35_tensor *W, const float *x, int64_t n_tok, int64_t o0, int64_t o1);

/* q35_matmul_ref for n matrices of the same n_in against one x: ys[i] rows
 * [o0[i], o1[i]) from Ws[i]. The fast tables quantize x once for all of
 * them (bfp weights); each piece's outputs are the same bits as a call for
 * that matrix alone. */
void q35_matmul_n_ref(int n, float *const *ys, const q35_tensor *const *Ws, const float *x, int64_t n_tok,
                      const int64_t *o0, const int64_t *o1);

/* Row r of a 2-D tensor (an embedding table) widened to float. */
void q35_get_row_ref(float *out, const q35_tensor *W, int64_t r);

/* The Gated DeltaNet recurrence of one V head over T rows (gdn.h):
 *   S = exp(g_t) S;  delta = beta_t (v_t - S^T k_t);  S += k_t delta^T;  o_t = S^T q_t
 * S (DK, DV) in place; q, k (T, DK) already normalised; v, o (T, DV); g,
 * beta (T). With S_after, the state after row t < T-1 is also written to
 * S_after + t * after_stride. S_next (or NULL) is the state the caller
 * runs next, DK x DV floats: the fast tables ask for it (into L2) while
 * this one's passes run, as it comes from memory with no stream a prefetcher
 * would follow. Computed as
 *   a = S^T k_t, b = S^T q_t                 (one read of S)
 *   delta = beta (v - e^g a), o = e^g b + (q.k) delta
 *   S = e^g S + k delta^T                    (one read-modify-write of S)
 * where the read-modify-write pass also forms a and b of row t+1, so T rows
 * cost T+1 passes over S. Each a[j], b[j] sums over i in ascending order, so
 * row t's results are the same bits whether it runs alone or in a batch. */
void q35_gdn_recurrent_ref(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                           float *o, int32_t T, int32_t DK, int32_t DV, float *S_after, size_t after_stride,
                           const float *S_next);

/* The same recurrence over T rows in chunks of Q35_GDN_CHUNK_ROWS (prompts;
 * HF torch_chunk_gated_delta_rule): within a chunk, with G the inclusive
 * cumsum of g and D[i][j] = exp(G[i] - G[j]) for j <= i,
 *   A = I + strictly_lower((beta k) k^T * D), U = A^-1 (beta v), W = A^-1 (beta k exp(G))
 *   Vn = U - W S;  O = (q exp(G)) S + ((q k^T) * D, lower incl. diagonal) Vn
 *   S = exp(G_last) S + (k exp(G_last - G))^T Vn
 * A is unit lower triangular, so A^-1 is applied by forward substitution.
 * Equal to the recurrence up to float rounding (tests/test_model.c);
 * scratch holds q35_gdn_chunk_scratch_floats(DK, DV) floats. */
#define Q35_GDN_CHUNK_ROWS 64
size_t q35_gdn_chunk_scratch_floats(int32_t DK, int32_t DV);
void q35_gdn_chunked_ref(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                         float *o, int32_t T, int32_t DK, int32_t DV, float *scratch);

/* sum x[i]^2 over n values in double, in eight interleaved partial sums
 * (eight independent chains of adds, not one chain four cycles a value). */
static inline double q35_sum_squares(const float *x, int32_t n) {
    double s[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int32_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += (double)x[i + k] * x[i + k];
    for (; i < n; i++) s[0] += (double)x[i] * x[i];
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* dst (n values) = rmsnorm1p(src) with weights w (n values, any dtype):
 *   r = 1 / sqrtf((float)(q35_sum_squares(src, n) / n) + eps),  dst[i] = src[i] * r * (1 + w[i])
 * (float, in that order; each product in the sum is exact), so every table gives the same bits. dst may
 * be src. */
void q35_rmsnorm1p_ref(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps);

/* One query head against n_keys cached positions (rows of k and v, stride
 * kv_stride floats): o (HD) = softmax(scale * k q) v. scores (n_keys) is
 * scratch. */
void q35_attend_head_ref(float *o, const float *q, const float *k, const float *v, size_t kv_stride, int32_t n_keys,
                         int32_t HD, float scale, float *scores);

/* G query heads that share one KV head (grouped-query attention) and
 * n_keys: head g reads q + g * q_stride and writes o + g * o_stride, the
 * same bits whatever G is (a head alone gives them too); scores
 * (G * n_keys) is scratch. The fast tables read each key and value row once
 * for all G. */
void q35_attend_heads_ref(float *o, size_t o_stride, const float *q, size_t q_stride, int32_t G, const float *k,
                          const float *v, size_t kv_stride, int32_t n_keys, int32_t HD, float scale, float *scores);
/* attend_heads for R rows of query heads: row r's heads at q + r * q_row
 * and o + r * o_row, against keys [0, n_keys0 + r * key_step) (key_step 1:
 * consecutive positions of one causal sequence; 0: every row the same keys).
 * Each row gives the bits attend_heads gives it alone; the fast tables read
 * the keys and values from memory once for the R rows. scores
 * (R * G * (n_keys0 + (R - 1) * key_step)) is scratch. */
void q35_attend_rows_ref(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row, size_t q_stride,
                         int32_t R, int32_t G, const float *k, const float *v, size_t kv_stride, int32_t n_keys0,
                         int32_t key_step, int32_t HD, float scale, float *scores);

/* attend_rows over an 8-bit cache (formats/kv_q8.h): key and value rows (q35_kv_q8_row_bytes)
 * kv_stride bytes apart, HD <= 32 Q35_KV_Q8_MAX_BLOCKS. Each query head is first rounded to the
 * cache's row format (q35_kv_q8_quantize: codes qc, block scales qd, as llama.cpp's q8_0 cache
 * rounds Q for K Q^T), and the score of a key with codes kc and scales kd is scale times
 * q35_kv_q8_score_sum of the exact integer block dots I[b] = sum of qc[i] kc[i] over the values i of
 * block b: the fast tables form those with integer dot products (AVX-512 vpdpbusd, AVX2 vpmaddubsw),
 * and every table gives the same bits for a score. The values are integer dot products too: with a
 * head's softmax weights w[p] (the reference's expf, the fast tables' polynomial) and the value rows'
 * codes vc and scales vd, the keys go in blocks of Q35_KV_Q8_VKEYS from key 0, and for each block
 *   M = max over its keys p of w[p] * max_b vd_p[b]   (= the largest w[p] * vd_p[b]: rounding is monotonic)
 *   inv, S = q35_kv_q8_value_scales(M)
 *   u_p[b] = rint(w[p] * vd_p[b] * inv)   (float products in that order, 0 <= u <= 32767)
 *   o[d] = fmaf((float)I[d], S, o[d]),  I[d] = sum over the block's keys of u_p[block of d] vc_p[d]
 * (I exact in int32: 32 keys x 32767 x 127 < 2^31), o starting at 0: each weight rounded to 15 bits of
 * its block's largest, so |o - the same sum in exact arithmetic| <= 0.5 S sum |vc_p[d]| per block and
 * float rounding (the fast tables: AVX-512 vpdpwssd, AVX2 vpmaddwd, over two keys' codes at a time).
 * Given the same weights every table gives the same bits, and the fast tables share one softmax.
 * Each row gives the same bits alone as in any block of rows. */
#define Q35_KV_Q8_VKEYS 32
/* a value block's scales from its largest weight M: inv = 32767 / M and S = M / 32767, both 0 where M
 * is below FLT_MIN (so its weights round to 0, and the block adds fmaf(0, 0, o)) */
static inline void q35_kv_q8_value_scales(float M, float *inv, float *S) {
    const int ok = M >= 1.17549435e-38f;
    *inv = ok ? 32767.0f / M : 0.0f;
    *S = ok ? M / 32767.0f : 0.0f;
}
/* sum over b < nb of t_b = (float)I[b] * (qd[b] * kd[b]) (I[b] exact in a float: |I[b]| < 2^24), added
 * in a halving tree: while w > 1 terms are left, h = (w + 1) / 2 and t_b += t_{b + h} for b + h < w
 * (for 8 blocks: lanes b and b + 4, then b + 2, then b + 1, as a vector reduction) */
static inline float q35_kv_q8_score_sum(const int32_t *I, const float *qd, const float *kd, int32_t nb) {
    float t[Q35_KV_Q8_MAX_BLOCKS];
    t[0] = 0.0f; /* nb >= 1 */
    for (int32_t b = 0; b < nb; b++) t[b] = (float)I[b] * (qd[b] * kd[b]);
    for (int32_t w = nb; w > 1;) {
        const int32_t h = (w + 1) / 2;
        for (int32_t b = 0; b + h < w; b++) t[b] += t[b + h];
        w = h;
    }
    return t[0];
}
void q35_attend_rows_q8_ref(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row, size_t q_stride,
                            int32_t R, int32_t G, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                            int32_t n_keys0, int32_t key_step, int32_t HD, float scale, float *scores);

/* C (M, N) = A (M, K) B (K, N), all row-major fp32, rows lda, ldb, ldc
 * floats apart: the vision tower's attention products (S = Q K^T with K^T
 * stored, O = P V). Each C[m][n] is one sum over k in ascending order (the
 * reference in double, the fast tables one fp32 FMA chain), whatever M, N
 * and the tiling: a row's result does not depend on the rows beside it,
 * and the fast tables are within float rounding of the reference,
 * |dC| <= 1e-5 * sum_k |A[m][k] B[k][n]| in the tests. */
void q35_gemm_f32_ref(float *C, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb, int64_t M,
                      int64_t N, int64_t K);

/* Each of rows rows of S (n floats, rows lds floats apart) in place:
 * s = scale * s, then softmax(s) = exp(s - max s) / sum exp(s - max s).
 * The reference takes expf and sums in double; the fast tables use a
 * polynomial exp (about 2e-7 relative on [-87, 0]; below -87.3 it gives
 * about 1e-38, not 0) and fp32 lanes, within 1e-6 of the reference per
 * element relative to the row's largest in the tests (about 1e-7 seen). */
void q35_softmax_rows_ref(float *S, size_t lds, int64_t rows, int64_t n, float scale);

/* h[i] = silu(g[i]) * u[i] = g[i] / (1 + exp(-g[i])) * u[i] for i < n, or
 * silu(g[i]) alone where u is NULL (SwiGLU, the GDN convolution); h may be
 * g. The reference takes expf; the fast tables use attention's polynomial
 * exp of -|g| (within 1.3 ulp; 0 below -87.34, where expf is under 1.2e-38)
 * and a division: |dh| <= 1e-6 |h| + 1.1e-36 |u| in the tests (the second
 * term is g in -88.73 .. -87.34, where h is below 1.05e-36 |u| and the fast
 * tables give 0). Each element's bits do not depend on n or on where it
 * sits in the array. */
void q35_silu_mul_ref(float *h, const float *g, const float *u, int64_t n);

/* The GDN causal depthwise convolution and its SiLU, n channels over T rows:
 * channel c of row t is y[t * ldy + c] = silu(sum_{i < CK} w[c * CK + i] *
 * h[i]), h the channel's last CK inputs up to row t (x[t * ldx + c] last,
 * state[c * (CK - 1) ..] before row 0), the sum from 0 in tap order, each
 * product rounded then added (no FMA), silu as silu_mul's. state (n, CK - 1)
 * moves past row T - 1; with rows, the state after each row t < T - 1 also
 * goes to rows + t * rows_stride. CK <= 16. The fast tables' sums are the
 * reference's bits; their silu is silu_mul's. */
void q35_conv_silu_ref(float *y, size_t ldy, const float *x, size_t ldx, const float *w, float *state, int32_t n,
                       int32_t T, int32_t CK, float *rows, size_t rows_stride);

/* h[i] = u[i] * sigmoid(g[i]) = u[i] * (1 / (1 + exp(-g[i]))) for i < n
 * (attention's output gate); h may be u. The same exp and bounds as
 * silu_mul, with 1.2e-38 |u| for the second term. */
void q35_sigmoid_mul_ref(float *h, const float *g, const float *u, int64_t n);

/* AVX2 versions (avx2_ops.c), shared by the avx2 and avx512 tables. */
void q35_gdn_recurrent_avx2(float *S, const float *q, const float *k, const float *v, const float *g,
                            const float *beta, float *o, int32_t T, int32_t DK, int32_t DV, float *S_after,
                            size_t after_stride, const float *S_next);
void q35_gdn_chunked_avx2(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                          float *o, int32_t T, int32_t DK, int32_t DV, float *scratch);
void q35_attend_heads_avx2(float *o, size_t o_stride, const float *q, size_t q_stride, int32_t G, const float *k,
                           const float *v, size_t kv_stride, int32_t n_keys, int32_t HD, float scale, float *scores);
void q35_attend_rows_avx2(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row, size_t q_stride,
                          int32_t R, int32_t G, const float *k, const float *v, size_t kv_stride, int32_t n_keys0,
                          int32_t key_step, int32_t HD, float scale, float *scores);
void q35_attend_rows_q8_avx2(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row, size_t q_stride,
                             int32_t R, int32_t G, const uint8_t *k, const uint8_t *v, size_t kv_stride,
                             int32_t n_keys0, int32_t key_step, int32_t HD, float scale, float *scores);
void q35_softmax_rows_avx2(float *S, size_t lds, int64_t rows, int64_t n, float scale);
void q35_silu_mul_avx2(float *h, const float *g, const float *u, int64_t n);
void q35_sigmoid_mul_avx2(float *h, const float *g, const float *u, int64_t n);
void q35_rmsnorm1p_avx2(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps);
void q35_conv_silu_avx2(float *y, size_t ldy, const float *x, size_t ldx, const float *w, float *state, int32_t n,
                        int32_t T, int32_t CK, float *rows, size_t rows_stride);
void q35_gemm_f32_avx2(float *C, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb, int64_t M,
                       int64_t N, int64_t K);

typedef void (*q35_matmul_n_fn)(int n, float *const *ys, const q35_tensor *const *Ws, const float *x,
                                int64_t n_tok, const int64_t *o0, const int64_t *o1);
typedef void (*q35_get_row_fn)(float *out, const q35_tensor *W, int64_t r);
typedef void (*q35_gdn_recurrent_fn)(float *S, const float *q, const float *k, const float *v, const float *g,
                                     const float *beta, float *o, int32_t T, int32_t DK, int32_t DV, float *S_after,
                                     size_t after_stride, const float *S_next);
typedef void (*q35_gdn_chunked_fn)(float *S, const float *q, const float *k, const float *v, const float *g,
                                   const float *beta, float *o, int32_t T, int32_t DK, int32_t DV, float *scratch);
typedef void (*q35_attend_heads_fn)(float *o, size_t o_stride, const float *q, size_t q_stride, int32_t G,
                                    const float *k, const float *v, size_t kv_stride, int32_t n_keys, int32_t HD,
                                    float scale, float *scores);
typedef void (*q35_attend_rows_fn)(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row,
                                   size_t q_stride, int32_t R, int32_t G, const float *k, const float *v,
                                   size_t kv_stride, int32_t n_keys0, int32_t key_step, int32_t HD, float scale,
                                   float *scores);
typedef void (*q35_attend_rows_q8_fn)(float *o, size_t o_row, size_t o_stride, const float *q, size_t q_row,
                                      size_t q_stride, int32_t R, int32_t G, const uint8_t *k, const uint8_t *v,
                                      size_t kv_stride, int32_t n_keys0, int32_t key_step, int32_t HD, float scale,
                                      float *scores);
typedef uint64_t (*q35_read_stream_fn)(const void *p, size_t bytes);
typedef void (*q35_softmax_rows_fn)(float *S, size_t lds, int64_t rows, int64_t n, float scale);
/* silu_mul and sigmoid_mul: h from a gate g and a factor u, elementwise */
typedef void (*q35_gate_mul_fn)(float *h, const float *g, const float *u, int64_t n);
typedef void (*q35_conv_silu_fn)(float *y, size_t ldy, const float *x, size_t ldx, const float *w, float *state,
                                 int32_t n, int32_t T, int32_t CK, float *rows, size_t rows_stride);
typedef void (*q35_rmsnorm1p_fn)(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps);
typedef void (*q35_gemm_f32_fn)(float *C, size_t ldc, const float *A, size_t lda, const float *B, size_t ldb,
                                int64_t M, int64_t N, int64_t K);

/* Reads bytes (a multiple of 4096) from p (64-byte aligned) front to back as
 * fast as the instruction set allows: the widest aligned loads into several
 * independent accumulators, and returns a checksum of them (so the loads
 * are not optimized away). It is the "best sequential read" behind
 * q35_read_bandwidth(), the ceiling the matmul kernels are measured
 * against. */
uint64_t q35_read_stream_ref(const void *p, size_t bytes);

/* One instruction set's kernels. Every entry has the semantics of the _ref
 * function of the same name; matmul_n and get_row take every dtype (F32,
 * F16, BF16, BFP8, BFP4). matmul_n may be called from several threads at
 * once on disjoint [o0, o1) ranges; ranges aligned to 16 rows (one bfp
 * panel) avoid decoding a panel twice. */
typedef struct q35_kernels {
    const char *name; /* "ref", "avx2", "avx512", "avx512bf16" */
    q35_matmul_n_fn matmul_n; /* one matrix, or several sharing an input (projections, gate and up) */
    q35_get_row_fn get_row;
    q35_gdn_recurrent_fn gdn_recurrent;
    q35_gdn_chunked_fn gdn_chunked;
    q35_attend_heads_fn attend_heads;
    q35_read_stream_fn read_stream;
    q35_attend_rows_fn attend_rows;
    q35_gemm_f32_fn gemm_f32;
    q35_softmax_rows_fn softmax_rows;
    q35_attend_rows_q8_fn attend_rows_q8;
    q35_gate_mul_fn silu_mul;
    q35_gate_mul_fn sigmoid_mul;
    q35_conv_silu_fn conv_silu;
    q35_rmsnorm1p_fn rmsnorm1p;
} q35_kernels;

extern const q35_kernels q35_kernels_ref;
extern const q35_kernels q35_kernels_avx2;   /* AVX2 + FMA + F16C */
extern const q35_kernels q35_kernels_avx512; /* AVX-512 F/BW/VL/DQ + VNNI */
extern const q35_kernels q35_kernels_avx512bf16; /* the same + AVX512_BF16 */

/* q35_matmul_ref's y for one matrix through table k (matmul_n with n = 1). */
static inline void q35_kernels_matmul(const q35_kernels *k, float *y, const q35_tensor *W, const float *x,
                                      int64_t n_tok, int64_t o0, int64_t o1) {
    k->matmul_n(1, &y, &W, x, n_tok, &o0, &o1);
}

/* Chooses the table once: Q35_KERNELS if set (an unknown name, or one this
 * CPU cannot run, fails with Q35_ERR_ARG / Q35_ERR_UNSUPPORTED and names the
 * choices), otherwise the best the CPU supports. On success *out is the
 * table and q35_kernels_get() returns it from then on. */
q35_status q35_kernels_init(const q35_kernels **out, q35_error *err);

/* Whether the avx512 table's bfp tiles (the GEMV and the panel tile) and its attention prefetch into
 * L2 instead of L1: chosen by q35_kernels_init (again at each call of it), from Q35_PREFETCH (l1 or l2;
 * it refuses any other value), else by CPU: L2 on AMD family 19h (Zen 4, the family's only CPUs with
 * AVX-512; Zen 3 runs the avx2 table, which does not ask: one core's GEMV from DRAM read 0.86 of a
 * plain read with L1 prefetches, 1.06 with L2; docs/performance.md), L1 elsewhere (Zen 5 measured
 * better with L1). The prefetch level changes no result. */
int q35_kernels_prefetch_l2(void);
/* The family in cpuid leaf 1's EAX: the base family, plus the extended family when the base is 0xf. */
int q35_cpu_family_of(unsigned eax);
/* The choice for an environment value (NULL or empty: none) and an AMD CPU family (0: not AMD):
 * 1 for L2, 0 for L1, -1 for a value that is neither l1 nor l2. */
int q35_kernels_prefetch_choice(const char *env, int amd_family);

/* The table by name ("ref", "avx2", "avx512", "avx512bf16") if this CPU can run it. */
q35_status q35_kernels_find(const char *name, const q35_kernels **out, q35_error *err);

/* The chosen table. Before q35_kernels_init succeeded it chooses by cpuid
 * alone (ignoring Q35_KERNELS), so it never fails. */
const q35_kernels *q35_kernels_get(void);

/* NULL, or a line for the user about the choice (e.g. that this CPU has no
 * AVX2 and runs the slow scalar kernels). */
const char *q35_kernels_note(void);

/* Per-thread scratch for the fast kernels (activation quantization): at
 * least `bytes`, 64-byte aligned, grown only when a call needs more than any
 * call before it on this thread, freed when the thread exits. NULL when out
 * of memory; the kernels then fall back to the reference path. */
void *q35_kernels_scratch(size_t bytes);

/* Set by a caller whose matmul_n calls on this thread, until it sets 0
 * again, all read the same x (the same pointer and contents): calls under
 * the same nonzero value quantize x for bfp weights once, the first time,
 * and reuse it from this thread's scratch. A thread pool's matmul job, whose
 * workers claim rows in several calls, sets a value of its own. */
extern __thread uint64_t q35_kernels_x_epoch;

/* Bytes of int8 activations a prompt's matmul takes per chunk of tokens (each
 * panel is read and predecoded once per chunk): 2 MiB, so that a pass of 128
 * rows is one chunk at the 9B's widths (down_proj's 12288 inputs included).
 * The activations come from L2 and beyond as a stream, slice by slice, which
 * costs less than reading and predecoding the panels again: on a Zen 3 VM
 * (512 KiB L2, avx2 table, prompts of 512 on two threads, interleaved) chunks
 * of half the L2 (then the size, from sysconf) gave down_proj 0.58 of gate +
 * up's time for half its weights, 1 and 2 MiB 0.51-0.53, the prompt 3% faster.
 * Before that, on Zen 5's 1 MiB L2, 512 KiB against 256 KiB: 29.6-30.1 against
 * 28.5-29.0 tok/s on one thread. */
size_t q35_kernels_chunk_bytes(void);

#endif
