/* kernels.cu: the CUDA backend's kernels (kernels.h). fp32 arithmetic with
 * explicit fmaf in every sum, one fixed order per output. The matmul is the
 * decode-path design: one warp per output row, each lane's 16-byte chunks
 * of the row decoded in registers and multiplied with float4 inputs that
 * the 32 lanes read as 512 consecutive bytes (matvec.h's lane-interleaved
 * layout, run on the host by the layout tests), the weights read once for
 * up to 8 tokens; prompts re-read the weights once per 8 rows (tensor-core
 * tiles are the next step). */
#include "backend/cuda/kernels.h"

#include <cuda_fp16.h>

#include "backend/cuda/matvec.h"
#include <math.h>

enum { DT_F32 = 0, DT_F16 = 1, DT_BF16 = 2, DT_BFP8 = 3, DT_BFP4 = 4 }; /* q35_dtype */

/* ---- weights ---- */

/* Element (r, i) of a matrix image (matvec.h's layout), for the embedding. */
__device__ float mat_get(const q35_cuda_mat &W, int64_t r, int64_t i) {
    int k;
    const uint8_t *ch = W.codes + (size_t)r * W.pitch + q35_cu_chunk_of(W.dtype, i, &k);
    const uint32_t e = W.exps ? W.exps[(size_t)r * W.exp_pitch + q35_cu_exp_of(W.dtype, i / 16)] : 0;
    return q35_cu_value(W.dtype, ch, k, e);
}

/* Up to MM_GROUP matrices of one dtype and width that share an input: one
 * launch, their rows' blocks one after another. */
#define MM_GROUP 4
struct mm_group {
    q35_cuda_mat W[MM_GROUP];
    float *y[MM_GROUP];
    int32_t block0[MM_GROUP]; /* each matrix's first block */
    int32_t n;
};

/* One warp per output row, 8 rows per block: lane l takes chunk l of every
 * window of the row (matvec.h), four windows' loads at a time, then a
 * fixed butterfly over the lanes. Tokens [t0, t0 + NT) (blockIdx.y). */
template <int DT, int NT>
__global__ void __launch_bounds__(256) matmul_kernel(mm_group G, const float *x, int32_t T, int add) {
    constexpr int VALS = DT == DT_F32 ? 4 : DT == DT_BFP8 ? 16 : DT == DT_BFP4 ? 32 : 8, WIN = 32 * VALS;
    constexpr bool BFP = DT == DT_BFP8 || DT == DT_BFP4;
    q35_cuda_mat W = G.W[0];
    float *y = G.y[0];
    int32_t first = 0;
#pragma unroll
    for (int g = 1; g < MM_GROUP; g++)
        if (g < G.n && (int32_t)blockIdx.x >= G.block0[g]) W = G.W[g], y = G.y[g], first = G.block0[g];
    const int lane = threadIdx.x & 31;
    const int64_t o = (int64_t)(blockIdx.x - first) * 8 + (threadIdx.x >> 5);
    const int32_t t0 = blockIdx.y * NT, nt = T - t0 < NT ? T - t0 : NT;
    if (o >= W.n_out) return;
    const int32_t nw = W.pitch / Q35_CU_WINDOW_BYTES;
    const uint8_t *row = W.codes + (size_t)o * W.pitch + (size_t)lane * Q35_CU_CHUNK;
    const uint8_t *er = BFP ? W.exps + (size_t)o * W.exp_pitch + (size_t)(lane >> 2) * (VALS / 4) : nullptr;
    const float *xt = x + (size_t)t0 * W.n_in;
    float acc[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) acc[t] = 0.0f;
    for (int32_t w0 = 0; w0 < nw; w0 += 4) {
        uint4 q[4];
        uint32_t ex[4][2];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (w0 + u >= nw) break;
            q[u] = __ldg((const uint4 *)(row + (size_t)(w0 + u) * Q35_CU_WINDOW_BYTES));
            if (DT == DT_BFP4) {
                const uint2 e2 = __ldg((const uint2 *)(er + (size_t)(w0 + u) * (WIN / 16)));
                ex[u][0] = e2.x, ex[u][1] = e2.y;
            } else if (DT == DT_BFP8) {
                ex[u][0] = __ldg((const uint32_t *)(er + (size_t)(w0 + u) * (WIN / 16))), ex[u][1] = 0;
            } else {
                ex[u][0] = ex[u][1] = 0;
            }
        }
#pragma unroll
        for (int u = 0; u < 4; u++) {
            if (w0 + u >= nw) break;
            const uint32_t qw[4] = {q[u].x, q[u].y, q[u].z, q[u].w};
            q35_cu_lane_window(DT, qw, ex[u], xt, W.n_in, w0 + u, lane, nt, NT, acc);
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
#pragma unroll
        for (int off = 16; off; off >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], off);
    }
    if (lane == 0)
        for (int t = 0; t < nt; t++) {
            float *dst = y + (size_t)(t0 + t) * W.n_out + o;
            *dst = add ? *dst + acc[t] : acc[t];
        }
}

template <int DT>
static void launch_matmul(cudaStream_t s, const mm_group &G, unsigned blocks, const float *x, int32_t T, int add) {
    dim3 block(256);
    if (T == 1) matmul_kernel<DT, 1><<<dim3(blocks, 1), block, 0, s>>>(G, x, T, add);
    else if (T == 2) matmul_kernel<DT, 2><<<dim3(blocks, 1), block, 0, s>>>(G, x, T, add);
    else if (T <= 4) matmul_kernel<DT, 4><<<dim3(blocks, 1), block, 0, s>>>(G, x, T, add);
    else matmul_kernel<DT, 8><<<dim3(blocks, (unsigned)((T + 7) / 8)), block, 0, s>>>(G, x, T, add);
}

static cudaError_t launch_group(cudaStream_t s, const mm_group &G, unsigned blocks, const float *x, int32_t T, int add) {
    switch (G.W[0].dtype) {
    case DT_F32: launch_matmul<DT_F32>(s, G, blocks, x, T, add); break;
    case DT_F16: launch_matmul<DT_F16>(s, G, blocks, x, T, add); break;
    case DT_BF16: launch_matmul<DT_BF16>(s, G, blocks, x, T, add); break;
    case DT_BFP8: launch_matmul<DT_BFP8>(s, G, blocks, x, T, add); break;
    case DT_BFP4: launch_matmul<DT_BFP4>(s, G, blocks, x, T, add); break;
    default: return cudaErrorInvalidValue;
    }
    return cudaGetLastError();
}

extern "C" cudaError_t q35_cu_matmul_n(cudaStream_t s, int32_t n, const q35_cuda_mat *W, float *const *y, const float *x,
                                       int32_t T, int add, int tc) {
    if (T <= 0) return cudaSuccess;
    q35_cuda_mat tc_left[MM_GROUP];
    float *tc_left_y[MM_GROUP];
    if (tc && n <= MM_GROUP) { /* tensor cores where the dtype allows, a matrix at a time */
        int32_t left = 0;
        for (int32_t i = 0; i < n; i++) {
            cudaError_t rc = cudaSuccess;
            if (W[i].n_out <= 0) continue;
            if (!q35_cu_matmul_tc(s, y[i], W[i], x, T, add, &rc)) tc_left[left] = W[i], tc_left_y[left++] = y[i];
            else if (rc) return rc;
        }
        W = tc_left, y = tc_left_y, n = left;
    }
    mm_group G;
    memset(&G, 0, sizeof G);
    unsigned blocks = 0;
    for (int32_t i = 0; i <= n; i++) {
        const bool last = i == n, present = !last && W[i].n_out > 0;
        const bool joins = present && G.n > 0 && G.n < MM_GROUP && W[i].dtype == G.W[0].dtype && W[i].n_in == G.W[0].n_in;
        if (G.n > 0 && (last || (present && !joins))) { /* the group so far, in one launch */
            cudaError_t rc = launch_group(s, G, blocks, x, T, add);
            if (rc) return rc;
            memset(&G, 0, sizeof G);
            blocks = 0;
        }
        if (!present) continue;
        G.W[G.n] = W[i], G.y[G.n] = y[i], G.block0[G.n] = (int32_t)blocks;
        G.n++;
        blocks += (unsigned)((W[i].n_out + 7) / 8);
    }
    return cudaSuccess;
}

extern "C" cudaError_t q35_cu_matmul(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add) {
    return q35_cu_matmul_n(s, 1, &W, &y, x, T, add, 0);
}

__global__ void embed_kernel(float *out, int32_t out_stride, q35_cuda_mat W, const int32_t *tokens) {
    const int32_t t = blockIdx.x, r = tokens[t];
    for (int32_t i = threadIdx.x; i < W.n_in; i += blockDim.x) out[(size_t)t * out_stride + i] = mat_get(W, r, i);
}

extern "C" cudaError_t q35_cu_embed(cudaStream_t s, float *out, int32_t out_stride, q35_cuda_mat W, const int32_t *tokens,
                                    int32_t T) {
    if (T <= 0) return cudaSuccess;
    embed_kernel<<<T, 256, 0, s>>>(out, out_stride, W, tokens);
    return cudaGetLastError();
}

/* ---- reductions in a fixed order ---- */

__device__ __forceinline__ double warp_sum(double v) {
#pragma unroll
    for (int off = 16; off; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

/* Sum over a block of 256 threads: each warp's butterfly, then warp 0 over the 8 partials. */
__device__ double block_sum256(double v, double *sh) {
    v = warp_sum(v);
    if ((threadIdx.x & 31) == 0) sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double r = 0.0;
    for (int i = 0; i < 8; i++) r += sh[i];
    __syncthreads();
    return r;
}

__global__ void __launch_bounds__(256) rmsnorm1p_kernel(float *dst, int32_t dst_stride, const float *src,
                                                        int32_t src_stride, const float *w, int32_t n, float eps) {
    __shared__ double sh[8];
    const float *x = src + (size_t)blockIdx.x * src_stride;
    float *d = dst + (size_t)blockIdx.x * dst_stride;
    double ss = 0.0;
    for (int32_t i = threadIdx.x; i < n; i += 256) ss += (double)x[i] * x[i];
    ss = block_sum256(ss, sh);
    const float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int32_t i = threadIdx.x; i < n; i += 256) d[i] = x[i] * r * (1.0f + w[i]);
}

extern "C" cudaError_t q35_cu_rmsnorm1p(cudaStream_t s, float *dst, int32_t dst_stride, const float *src,
                                        int32_t src_stride, const float *w, int32_t T, int32_t n, float eps) {
    if (T <= 0) return cudaSuccess;
    rmsnorm1p_kernel<<<T, 256, 0, s>>>(dst, dst_stride, src, src_stride, w, n, eps);
    return cudaGetLastError();
}

__device__ __forceinline__ float silu(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void swiglu_kernel(float *gate, const float *up, size_t n) {
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        gate[i] = silu(gate[i]) * up[i];
}

extern "C" cudaError_t q35_cu_swiglu(cudaStream_t s, float *gate, const float *up, size_t n) {
    if (!n) return cudaSuccess;
    size_t blocks = (n + 255) / 256;
    swiglu_kernel<<<(unsigned)(blocks < 65535 ? blocks : 65535), 256, 0, s>>>(gate, up, n);
    return cudaGetLastError();
}

/* ---- gated attention ---- */

__device__ __forceinline__ int32_t row_pos(const q35_cuda_seq &q, int32_t r) { return q.pos0 + (r - q.row0); }

/* One warp per head vector: q heads of qg (h < NH), then k heads (h >= NH):
 * rmsnorm1p with q_norm / k_norm (sum in double), rotate-half RoPE on the
 * first RD dims with fp32 angles pos * theta^(-2i/RD); k and v rows go to
 * the cache. */
__global__ void attn_prep_kernel(q35_cuda_attn a, float *qg, float *k, const float *v, const float *q_norm,
                                 const float *k_norm, const q35_cuda_seq *seqs, const int32_t *row_seq) {
    __shared__ float vec[512];
    const int32_t r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, HD = a.HD, KVD = a.NKV * HD;
    const q35_cuda_seq q = seqs[row_seq[r]];
    const int32_t pos = row_pos(q, r);
    const bool is_q = h < a.NH;
    float *x = is_q ? qg + (size_t)r * a.NH * 2 * HD + (size_t)h * 2 * HD : k + (size_t)r * KVD + (size_t)(h - a.NH) * HD;
    const float *w = is_q ? q_norm : k_norm;
    double ss = 0.0;
    for (int32_t i = lane; i < HD; i += 32) { float f = x[i]; vec[i] = f; ss += (double)f * f; }
    ss = warp_sum(ss);
    const float rn = 1.0f / sqrtf((float)(ss / HD) + a.eps);
    __syncwarp();
    for (int32_t i = lane; i < HD; i += 32) vec[i] = vec[i] * rn * (1.0f + w[i]);
    __syncwarp();
    const int32_t half = a.RD / 2;
    for (int32_t i = lane; i < HD; i += 32) {
        float out = vec[i];
        if (i < a.RD) {
            int32_t f = i < half ? i : i - half;
            float inv_freq = 1.0f / powf(a.theta, (float)(2 * f) / (float)a.RD);
            float ang = (float)pos * inv_freq, cs = cosf(ang), sn = sinf(ang);
            out = i < half ? vec[i] * cs - vec[i + half] * sn : vec[i] * cs + vec[i - half] * sn;
        }
        x[i] = out;
    }
    if (!is_q) {
        const int32_t kvh = h - a.NH;
        float *kc = q.kv + (size_t)a.kv_layer * 2 * q.n_ctx * KVD + (size_t)pos * KVD + (size_t)kvh * HD;
        float *vc = kc + (size_t)q.n_ctx * KVD;
        const float *vr = v + (size_t)r * KVD + (size_t)kvh * HD;
        __syncwarp();
        for (int32_t i = lane; i < HD; i += 32) { kc[i] = x[i]; vc[i] = vr[i]; }
    }
}

extern "C" cudaError_t q35_cu_attn_prep(cudaStream_t s, q35_cuda_attn a, float *qg, float *k, const float *v,
                                        const float *q_norm, const float *k_norm, const q35_cuda_seq *seqs,
                                        const int32_t *row_seq, int32_t T) {
    if (T <= 0) return cudaSuccess;
    attn_prep_kernel<<<dim3(T, a.NH + a.NKV), 32, 0, s>>>(a, qg, k, v, q_norm, k_norm, seqs, row_seq);
    return cudaGetLastError();
}

#define ATTN_WARPS 16 /* a decode row's keys over 16 warps: each warp's keys are a chain of dependent steps */
#define ATTN_DPL 16 /* dims per lane: HD <= 512 (layout.c checks) */

/* One block per (row, query head): warp w takes keys w, w+16, ... of the
 * row's causal window with an online softmax; the 16 partial results are
 * merged in warp order. */
__global__ void __launch_bounds__(ATTN_WARPS * 32) attn_kernel(q35_cuda_attn a, float *o, const float *qg,
                                                               const q35_cuda_seq *seqs, const int32_t *row_seq) {
    __shared__ float part_m[ATTN_WARPS], part_l[ATTN_WARPS];
    __shared__ float part_o[ATTN_WARPS][512];
    const int32_t r = blockIdx.x, h = blockIdx.y, HD = a.HD, KVD = a.NKV * HD;
    const int32_t warp = threadIdx.x >> 5, lane = threadIdx.x & 31, kvh = h / (a.NH / a.NKV);
    const q35_cuda_seq q = seqs[row_seq[r]];
    const int32_t n_keys = row_pos(q, r) + 1;
    const float *qh = qg + (size_t)r * a.NH * 2 * HD + (size_t)h * 2 * HD;
    const float *K = q.kv + (size_t)a.kv_layer * 2 * q.n_ctx * KVD + (size_t)kvh * HD, *V = K + (size_t)q.n_ctx * KVD;
    float qv[ATTN_DPL], acc[ATTN_DPL];
#pragma unroll
    for (int j = 0; j < ATTN_DPL; j++) { int d = lane + 32 * j; qv[j] = d < HD ? qh[d] : 0.0f; acc[j] = 0.0f; }
    float m = -INFINITY, l = 0.0f;
    for (int32_t p = warp; p < n_keys; p += ATTN_WARPS) {
        const float *kp = K + (size_t)p * KVD, *vp = V + (size_t)p * KVD;
        float dot = 0.0f;
#pragma unroll
        for (int j = 0; j < ATTN_DPL; j++) { int d = lane + 32 * j; if (d < HD) dot = fmaf(qv[j], kp[d], dot); }
#pragma unroll
        for (int off = 16; off; off >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
        const float sc = dot * a.scale, mn = fmaxf(m, sc), corr = expf(m - mn), e = expf(sc - mn);
        l = l * corr + e;
#pragma unroll
        for (int j = 0; j < ATTN_DPL; j++) { int d = lane + 32 * j; if (d < HD) acc[j] = fmaf(e, vp[d], acc[j] * corr); }
        m = mn;
    }
    if (lane == 0) { part_m[warp] = m; part_l[warp] = l; }
#pragma unroll
    for (int j = 0; j < ATTN_DPL; j++) { int d = lane + 32 * j; if (d < HD) part_o[warp][d] = acc[j]; }
    __syncthreads();
    if (warp) return;
    float M = -INFINITY;
    for (int w = 0; w < ATTN_WARPS; w++) M = fmaxf(M, part_m[w]);
    float L = 0.0f;
    for (int w = 0; w < ATTN_WARPS; w++) if (part_l[w] > 0.0f) L += part_l[w] * expf(part_m[w] - M);
    const float *gate = qh + HD;
    float *oh = o + (size_t)r * a.NH * HD + (size_t)h * HD;
    for (int32_t d = lane; d < HD; d += 32) {
        float s = 0.0f;
        for (int w = 0; w < ATTN_WARPS; w++) if (part_l[w] > 0.0f) s += part_o[w][d] * expf(part_m[w] - M);
        oh[d] = s / L * sigmoid(gate[d]);
    }
}

extern "C" cudaError_t q35_cu_attn(cudaStream_t s, q35_cuda_attn a, float *o, const float *qg, const q35_cuda_seq *seqs,
                                   const int32_t *row_seq, int32_t T) {
    if (T <= 0) return cudaSuccess;
    attn_kernel<<<dim3(T, a.NH), ATTN_WARPS * 32, 0, s>>>(a, o, qg, seqs, row_seq);
    return cudaGetLastError();
}

/* ---- Gated DeltaNet ---- */

/* One thread per (sequence, channel): the sequence's rows in order through
 * the CK taps (tap j multiplies the input CK-1-j steps back), SiLU, and the
 * conv state advanced (and copied after each row of a rewindable pass).
 * CK is a template argument where it is 4 (Qwen3.5's), so the taps and the
 * history stay in registers; KCK = 0 takes it from g (local arrays). */
template <int KCK>
__global__ void gdn_conv_kernel(q35_cuda_gdn g, float *y, const float *raw, const float *conv_w, const q35_cuda_seq *seqs) {
    const int32_t ch = blockIdx.x * blockDim.x + threadIdx.x, CK = KCK ? KCK : g.CK;
    const q35_cuda_seq q = seqs[blockIdx.y];
    if (ch >= g.CD) return;
    float w[KCK ? KCK : 16], hist[KCK ? KCK : 16];
#pragma unroll
    for (int i = 0; i < (KCK ? KCK : 16); i++)
        if (i < CK) w[i] = conv_w[(size_t)ch * CK + i];
    float *st = q.rec + g.conv_off + (size_t)ch * (CK - 1);
#pragma unroll
    for (int i = 0; i < (KCK ? KCK : 16) - 1; i++)
        if (i < CK - 1) hist[i] = st[i];
    float next = q.n_rows > 0 ? raw[(size_t)q.row0 * g.CD + ch] : 0.0f;
    for (int32_t t = 0; t < q.n_rows; t++) {
        const size_t row = (size_t)(q.row0 + t);
        hist[CK - 1] = next;
        if (t + 1 < q.n_rows) next = raw[(row + 1) * g.CD + ch]; /* the next row's input, loaded ahead */
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < (KCK ? KCK : 16); i++)
            if (i < CK) acc = fmaf(w[i], hist[i], acc);
        y[row * g.CD + ch] = silu(acc);
#pragma unroll
        for (int i = 0; i < (KCK ? KCK : 16) - 1; i++)
            if (i < CK - 1) hist[i] = hist[i + 1];
        if (q.row_states && t + 1 < q.n_rows) {
            float *ck = q.row_states + (size_t)t * g.rec_floats + g.conv_off + (size_t)ch * (CK - 1);
#pragma unroll
            for (int i = 0; i < (KCK ? KCK : 16) - 1; i++)
                if (i < CK - 1) ck[i] = hist[i];
        }
    }
#pragma unroll
    for (int i = 0; i < (KCK ? KCK : 16) - 1; i++)
        if (i < CK - 1) st[i] = hist[i];
}

extern "C" cudaError_t q35_cu_gdn_conv(cudaStream_t s, q35_cuda_gdn g, float *y, const float *raw, const float *conv_w,
                                       const q35_cuda_seq *seqs, int32_t n_seqs) {
    if (n_seqs <= 0) return cudaSuccess;
    const dim3 grid((g.CD + 127) / 128, n_seqs);
    if (g.CK == 4) gdn_conv_kernel<4><<<grid, 128, 0, s>>>(g, y, raw, conv_w, seqs);
    else gdn_conv_kernel<0><<<grid, 128, 0, s>>>(g, y, raw, conv_w, seqs);
    return cudaGetLastError();
}

/* One warp per (row, K head): x / sqrt(sum x^2 + 1e-6) for q and k (sum in double), q also * DK^-1/2. */
__global__ void gdn_qknorm_kernel(q35_cuda_gdn g, float *y) {
    const int32_t r = blockIdx.x, kh = blockIdx.y, lane = threadIdx.x, KD = g.HK * g.DK;
    const float qs = 1.0f / sqrtf((float)g.DK);
    for (int which = 0; which < 2; which++) {
        float *x = y + (size_t)r * g.CD + (size_t)which * KD + (size_t)kh * g.DK;
        double ss = 0.0;
        for (int32_t i = lane; i < g.DK; i += 32) ss += (double)x[i] * x[i];
        ss = warp_sum(ss);
        const float rn = 1.0f / sqrtf((float)ss + 1e-6f);
        for (int32_t i = lane; i < g.DK; i += 32) x[i] = which ? x[i] * rn : x[i] * rn * qs;
    }
}

extern "C" cudaError_t q35_cu_gdn_qknorm(cudaStream_t s, q35_cuda_gdn g, float *y, int32_t T) {
    if (T <= 0) return cudaSuccess;
    gdn_qknorm_kernel<<<dim3(T, g.HK), 32, 0, s>>>(g, y);
    return cudaGetLastError();
}

#define GDN_COLS 32  /* columns of S per block: the delta rule is independent per column */
#define GDN_RMAX 16  /* rows of S per thread: warps = ceil(DK / 16) <= 16 (DK <= 256, layout.c checks) */
#define GDN_WMAX 16

/* Block (V head h, 32 columns j of S (DK, DV), sequence): warp w keeps rows
 * i in [16 w, 16 w + 16) of the columns in registers, for all of the
 * sequence's rows t:
 *   a_j = sum_i k_i S_ij,  b_j = sum_i q_i S_ij,  qk = sum_i q_i k_i
 *     (each warp its rows in ascending order, then the warps in order)
 *   delta_j = beta (v_j - e^g a_j),  o_j = e^g b_j + qk delta_j
 *   S_ij = e^g S_ij + k_i delta_j
 * with beta = sigmoid(b), g = -exp(A_log) softplus(a + dt_bias) (gdn.c). */
__global__ void __launch_bounds__(GDN_COLS * GDN_WMAX) gdn_recur_kernel(q35_cuda_gdn g, float *core, const float *y,
                                                                         const float *bb, const float *aa,
                                                                         const float *A_log, const float *dt_bias,
                                                                         const q35_cuda_seq *seqs) {
    __shared__ float sq[256], sk[256], pa[GDN_WMAX][GDN_COLS], pb[GDN_WMAX][GDN_COLS], pq[GDN_WMAX];
    const int32_t blocks_per_head = (g.DV + GDN_COLS - 1) / GDN_COLS;
    const int32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int32_t h = blockIdx.x / blocks_per_head, j = (blockIdx.x % blocks_per_head) * GDN_COLS + lane;
    const q35_cuda_seq q = seqs[blockIdx.y];
    const int32_t DK = g.DK, DV = g.DV, KD = g.HK * DK, kh = h / (g.HV / g.HK);
    const int32_t n_warps = blockDim.x >> 5, i0 = warp * GDN_RMAX, R = DK - i0 < GDN_RMAX ? DK - i0 : GDN_RMAX;
    const bool live = j < DV;
    float *Sj = q.rec + g.ssm_off + (size_t)h * DK * DV + (live ? j : 0);
    float s[GDN_RMAX];
#pragma unroll
    for (int r = 0; r < GDN_RMAX; r++) s[r] = r < R && live ? Sj[(i0 + r) * DV] : 0.0f;
    const float A = expf(A_log[h]), dt = dt_bias[h];
    /* a row's inputs (thread i < DK: q_i and k_i; the lane's v_j; b, a), loaded a row ahead */
    const int32_t me = threadIdx.x; /* blockDim = 32 ceil(DK / 16) >= DK */
    float nq = 0.0f, nk = 0.0f, nv = 0.0f, nb = 0.0f, na = 0.0f;
#define GDN_LOAD(r)                                                                   \
    do {                                                                              \
        const float *yr_ = y + (size_t)(r) * g.CD;                                    \
        if (me < DK) nq = yr_[(size_t)kh * DK + me], nk = yr_[KD + (size_t)kh * DK + me]; \
        nv = live ? yr_[2 * KD + (size_t)h * DV + j] : 0.0f;                           \
        nb = bb[(size_t)(r) * g.HV + h], na = aa[(size_t)(r) * g.HV + h];              \
    } while (0)
    if (q.n_rows > 0) GDN_LOAD(q.row0);
    for (int32_t t = 0; t < q.n_rows; t++) {
        const size_t row = (size_t)(q.row0 + t);
        if (me < DK) sq[me] = nq, sk[me] = nk;
        const float v = nv, b_in = nb, a_in = na;
        if (t + 1 < q.n_rows) GDN_LOAD(row + 1);
        __syncthreads();
        float a = 0.0f, b = 0.0f, qk = 0.0f;
#pragma unroll
        for (int r = 0; r < GDN_RMAX; r++)
            if (r < R) {
                a = fmaf(sk[i0 + r], s[r], a);
                b = fmaf(sq[i0 + r], s[r], b);
                qk = fmaf(sq[i0 + r], sk[i0 + r], qk);
            }
        pa[warp][lane] = a, pb[warp][lane] = b;
        if (lane == 0) pq[warp] = qk;
        __syncthreads();
        a = pa[0][lane], b = pb[0][lane], qk = pq[0];
        for (int w = 1; w < n_warps; w++) a += pa[w][lane], b += pb[w][lane], qk += pq[w];
        const float beta = sigmoid(b_in), decay = expf(-A * softplus(a_in + dt));
        const float delta = beta * (v - decay * a);
        if (warp == 0 && live) core[row * g.HV * DV + (size_t)h * DV + j] = decay * b + qk * delta;
        float *ck = q.row_states && t + 1 < q.n_rows && live
                        ? q.row_states + (size_t)t * g.rec_floats + g.ssm_off + (size_t)h * DK * DV + j : nullptr;
#pragma unroll
        for (int r = 0; r < GDN_RMAX; r++)
            if (r < R) s[r] = fmaf(sk[i0 + r], delta, decay * s[r]);
        if (ck)
#pragma unroll
            for (int r = 0; r < GDN_RMAX; r++)
                if (r < R) ck[(i0 + r) * DV] = s[r];
        __syncthreads(); /* sq, sk, pa, pb are rewritten by the next row */
    }
    if (live)
#pragma unroll
        for (int r = 0; r < GDN_RMAX; r++)
            if (r < R) Sj[(i0 + r) * DV] = s[r];
#undef GDN_LOAD
}

extern "C" cudaError_t q35_cu_gdn_recur(cudaStream_t s, q35_cuda_gdn g, float *core, const float *y, const float *bb,
                                        const float *aa, const float *A_log, const float *dt_bias,
                                        const q35_cuda_seq *seqs, int32_t n_seqs) {
    if (n_seqs <= 0) return cudaSuccess;
    const int32_t per_head = (g.DV + GDN_COLS - 1) / GDN_COLS;
    const int32_t warps = (g.DK + GDN_RMAX - 1) / GDN_RMAX;
    gdn_recur_kernel<<<dim3(g.HV * per_head, n_seqs), GDN_COLS * warps, 0, s>>>(g, core, y, bb, aa, A_log, dt_bias, seqs);
    return cudaGetLastError();
}

/* One warp per (row, V head): o / rms(o) * w * silu(z), the sum in double. */
__global__ void gdn_norm_kernel(q35_cuda_gdn g, float *core, const float *z, const float *w) {
    const int32_t r = blockIdx.x, h = blockIdx.y, lane = threadIdx.x, VD = g.HV * g.DV;
    float *o = core + (size_t)r * VD + (size_t)h * g.DV;
    const float *zr = z + (size_t)r * VD + (size_t)h * g.DV;
    double ss = 0.0;
    for (int32_t i = lane; i < g.DV; i += 32) ss += (double)o[i] * o[i];
    ss = warp_sum(ss);
    const float rn = 1.0f / sqrtf((float)(ss / g.DV) + g.eps);
    for (int32_t i = lane; i < g.DV; i += 32) o[i] = o[i] * rn * w[i] * silu(zr[i]);
}

extern "C" cudaError_t q35_cu_gdn_norm(cudaStream_t s, q35_cuda_gdn g, float *core, const float *z, const float *w,
                                       int32_t T) {
    if (T <= 0) return cudaSuccess;
    gdn_norm_kernel<<<dim3(T, g.HV), 32, 0, s>>>(g, core, z, w);
    return cudaGetLastError();
}
