/* kernels.h: the CUDA backend's device kernels (kernels.cu), behind C
 * launchers that enqueue on a stream and return cudaGetLastError(). Each
 * is the device form of a host block (backend/cpu: compute.c, attention.c,
 * gdn.c), in fp32 with fixed reduction orders: every output is computed by
 * one warp or block in an order that depends only on its own inputs, never
 * on the batch around it or on timing, so results repeat bit for bit and a
 * row gives the same bits alone or in a batch (the caller picks tensor
 * cores or not by the row's own sequence: cuda.c's pass_mm). Norms sum squares in double
 * as the host blocks do. */
#ifndef Q35_CUDA_KERNELS_H
#define Q35_CUDA_KERNELS_H

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix in device memory (layout.h: q35_cuda_mat_layout). */
typedef struct q35_cuda_mat {
    int32_t dtype;               /* q35_dtype */
    int32_t n_out, n_in;
    int32_t pitch, exp_pitch;    /* bytes */
    const uint8_t *codes, *exps; /* exps: BFP only */
} q35_cuda_mat;

/* One sequence of a pass, in device memory. */
typedef struct q35_cuda_seq {
    int32_t row0, n_rows, pos0, n_ctx;
    float *rec;        /* GDN states (layout.h), or NULL */
    float *kv;         /* full layers' K/V (or the MTP layer's): layout.h */
    float *row_states; /* rewindable: slot t = rec after row t; else NULL */
} q35_cuda_seq;

/* y (T, n_out) = x (T, n_in) W^T, plus y's old value with add (y += W x). */
cudaError_t q35_cu_matmul(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add);
/* The same for n matrices sharing the input x: y[i] = x W[i]^T, in one
 * launch per run of up to 4 matrices of one dtype and width (absent ones,
 * n_out 0, skipped); each output as the single form computes it. With tc,
 * the matrices whose dtype allows it go to tensor cores instead (tc.cu);
 * the caller decides, so that a row's kernel depends only on what its own
 * sequence contributes to the pass. */
cudaError_t q35_cu_matmul_n(cudaStream_t s, int32_t n, const q35_cuda_mat *W, float *const *y, const float *x, int32_t T,
                            int add, int tc);
/* tc.cu: q35_cu_matmul on tensor cores, for passes of more than 8 rows:
 * returns 0 (nothing launched) where it does not apply (Q35_CUDA_TC=0, a
 * dtype other than BF16 / BFP8 / BFP4, n_in not a multiple of 32), else
 * 1 with the launch's error in *rc. */
int q35_cu_matmul_tc(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add, cudaError_t *rc);
/* The same with the number of bf16 terms of x given (2 or 3; else 0). */
int q35_cu_matmul_tc_terms(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add, int terms,
                           cudaError_t *rc);
/* out row t (stride out_stride) = W row tokens[t], widened to float. */
cudaError_t q35_cu_embed(cudaStream_t s, float *out, int32_t out_stride, q35_cuda_mat W, const int32_t *tokens, int32_t T);
/* dst = src / rms(src) * (1 + w) per row of n (strides in floats). */
cudaError_t q35_cu_rmsnorm1p(cudaStream_t s, float *dst, int32_t dst_stride, const float *src, int32_t src_stride,
                             const float *w, int32_t T, int32_t n, float eps);
/* gate = silu(gate) * up over n values. */
cudaError_t q35_cu_swiglu(cudaStream_t s, float *gate, const float *up, size_t n);

/* Attention geometry of one layer. */
typedef struct q35_cuda_attn {
    int32_t NH, NKV, HD, RD;
    float theta, eps, scale;
    int32_t kv_layer;  /* this layer's K at seq.kv + kv_layer * 2 * n_ctx * NKV*HD, then its V */
} q35_cuda_attn;
/* q/k norms and RoPE of qg (T, NH*2*HD) and k (T, NKV*HD); k and v go to the cache at each row's position. */
cudaError_t q35_cu_attn_prep(cudaStream_t s, q35_cuda_attn a, float *qg, float *k, const float *v, const float *q_norm,
                             const float *k_norm, const q35_cuda_seq *seqs, const int32_t *row_seq, int32_t T);
/* o (T, NH*HD) = softmax attention over each row's cache, gated by sigmoid(gate). */
cudaError_t q35_cu_attn(cudaStream_t s, q35_cuda_attn a, float *o, const float *qg, const q35_cuda_seq *seqs,
                        const int32_t *row_seq, int32_t T);

/* Gated DeltaNet geometry of one layer. */
typedef struct q35_cuda_gdn {
    int32_t HK, HV, DK, DV, CD, CK;
    float eps;
    size_t conv_off, ssm_off; /* this layer's states within seq.rec, floats */
    size_t rec_floats;        /* stride of seq.row_states slots */
} q35_cuda_gdn;
/* y = silu(causal conv(raw)) per sequence, advancing its conv state. */
cudaError_t q35_cu_gdn_conv(cudaStream_t s, q35_cuda_gdn g, float *y, const float *raw, const float *conv_w,
                            const q35_cuda_seq *seqs, int32_t n_seqs);
/* L2 norms of q and k in y (T, CD), q scaled by DK^-1/2. */
cudaError_t q35_cu_gdn_qknorm(cudaStream_t s, q35_cuda_gdn g, float *y, int32_t T);
/* core (T, HV*DV) = delta rule per sequence and V head, row by row. */
cudaError_t q35_cu_gdn_recur(cudaStream_t s, q35_cuda_gdn g, float *core, const float *y, const float *bb,
                             const float *aa, const float *A_log, const float *dt_bias, const q35_cuda_seq *seqs,
                             int32_t n_seqs);
/* core = rmsnorm(core) * w * silu(z) per (row, V head). */
cudaError_t q35_cu_gdn_norm(cudaStream_t s, q35_cuda_gdn g, float *core, const float *z, const float *w, int32_t T);

#ifdef __cplusplus
}
#endif

#endif
