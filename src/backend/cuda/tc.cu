/* tc.cu: the prompt matmul on tensor cores (passes of more than 8 rows).
 *
 * y (T, n_out) = x (T, n_in) W^T with mma.sync m16n8k16 (bf16 operands,
 * fp32 accumulation). W's BF16 values and BFP codes times their block
 * scale are exact in bf16 (a BFP4 code has 3 significant bits, a BFP8 code
 * 7, the scale is a power of two); x is not, so each input is split into
 * SPLITS bf16 terms, x = x1 + x2 (+ x3), each the rounding of what the
 * terms before it left, and every term is multiplied in full: with three
 * terms the input is carried to 2^-24 of itself, as in fp32; with two, to
 * 2^-16. A block takes 64 rows of x and 64 rows of W; its 8 warps each
 * hold a 32 x 16 tile of y; k advances 32 at a time through shared memory:
 * x split into its terms, W decoded from the lane-interleaved image
 * (matvec.h) into bf16. Each output is summed in k order by one thread's
 * accumulators, so it does not depend on the rows around it. */
#include "backend/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/matvec.h"

#define TC_M 64 /* rows of x per block */
#define TC_N 64 /* rows of W per block */
#define TC_K 32 /* inputs per step */
#define TC_W (TC_K / 2 + 4) /* shared words per tile row: bf16 pairs, padded against bank conflicts */

__device__ __forceinline__ uint32_t bf16_bits(float f) { return (uint32_t)__bfloat16_as_ushort(__float2bfloat16_rn(f)); }
__device__ __forceinline__ float bf16_value(uint32_t h) { return __uint_as_float(h << 16); }

__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                 "{%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int DT, int SPLITS>
__global__ void __launch_bounds__(256) tc_matmul_kernel(float *y, q35_cuda_mat W, const float *x, int32_t T, int add) {
    constexpr int VALS = DT == Q35_CU_BFP8 ? 16 : DT == Q35_CU_BFP4 ? 32 : 8, WIN = 32 * VALS;
    constexpr bool BFP = DT == Q35_CU_BFP8 || DT == Q35_CU_BFP4;
    __shared__ uint32_t As[SPLITS][TC_M][TC_W];
    __shared__ uint32_t Bs[TC_N][TC_W];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, gid = lane >> 2, tig = lane & 3;
    const int32_t m0 = blockIdx.y * TC_M, n0 = blockIdx.x * TC_N;
    const int wm = (warp & 1) * 32, wn = (warp >> 1) * 16; /* the warp's tile of y */
    float acc[2][2][4];
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    for (int32_t k0 = 0; k0 < W.n_in; k0 += TC_K) {
        { /* x: 64 rows x 32 inputs, 8 per thread, split into bf16 terms */
            const int r = tid >> 2, c = (tid & 3) * 8;
            const int32_t t = m0 + r;
            float v[8];
#pragma unroll
            for (int e = 0; e < 8; e++) v[e] = t < T && k0 + c + e < W.n_in ? x[(size_t)t * W.n_in + k0 + c + e] : 0.0f;
#pragma unroll
            for (int s = 0; s < SPLITS; s++)
#pragma unroll
                for (int e = 0; e < 8; e += 2) {
                    const uint32_t h0 = bf16_bits(v[e]), h1 = bf16_bits(v[e + 1]);
                    As[s][r][(c + e) / 2] = h0 | (h1 << 16);
                    v[e] -= bf16_value(h0), v[e + 1] -= bf16_value(h1);
                }
        }
        /* W: 64 rows x 32 inputs; inputs k0 .. k0+31 are group j of 8 consecutive lanes' chunks */
        const int32_t w = k0 / WIN, rem = k0 % WIN, j = rem / 128, l0 = (rem % 128) / 4;
#pragma unroll
        for (int p = tid; p < TC_N * 8; p += 256) {
            const int r = p >> 3, c = p & 7;
            const int64_t o = n0 + r;
            float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            if (o < W.n_out && k0 + 4 * c < W.n_in) {
                const int l = l0 + c;
                const uint4 q4 = __ldg((const uint4 *)(W.codes + (size_t)o * W.pitch + (size_t)w * Q35_CU_WINDOW_BYTES +
                                                       (size_t)l * Q35_CU_CHUNK));
                const uint32_t q[4] = {q4.x, q4.y, q4.z, q4.w};
                q35_cu_group(DT, q, j, v);
                if (BFP) {
                    const uint8_t e = W.exps[(size_t)o * W.exp_pitch + (size_t)w * (WIN / 16) + (size_t)(l / 4) * (VALS / 4) + j];
                    const float sc = q35_cu_bfp_scale(e, DT == Q35_CU_BFP8 ? 7 : 3);
#pragma unroll
                    for (int e2 = 0; e2 < 4; e2++) v[e2] *= sc;
                }
            }
            Bs[r][2 * c] = bf16_bits(v[0]) | (bf16_bits(v[1]) << 16);
            Bs[r][2 * c + 1] = bf16_bits(v[2]) | (bf16_bits(v[3]) << 16);
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < TC_K / 2; kk += 8) { /* two k16 steps, in words */
            uint32_t b[2][2];
#pragma unroll
            for (int ni = 0; ni < 2; ni++) {
                const int n = wn + ni * 8 + gid;
                b[ni][0] = Bs[n][kk + tig], b[ni][1] = Bs[n][kk + 4 + tig];
            }
#pragma unroll
            for (int s = 0; s < SPLITS; s++)
#pragma unroll
                for (int mi = 0; mi < 2; mi++) {
                    const int m = wm + mi * 16 + gid;
                    const uint32_t a[4] = {As[s][m][kk + tig], As[s][m + 8][kk + tig], As[s][m][kk + 4 + tig],
                                           As[s][m + 8][kk + 4 + tig]};
#pragma unroll
                    for (int ni = 0; ni < 2; ni++) mma_bf16(acc[mi][ni], a, b[ni][0], b[ni][1]);
                }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mi = 0; mi < 2; mi++)
#pragma unroll
        for (int ni = 0; ni < 2; ni++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int32_t t = m0 + wm + mi * 16 + gid + (e >= 2 ? 8 : 0);
                const int64_t o = n0 + wn + ni * 8 + 2 * tig + (e & 1);
                if (t < T && o < W.n_out) {
                    float *dst = y + (size_t)t * W.n_out + o;
                    *dst = add ? *dst + acc[mi][ni][e] : acc[mi][ni][e];
                }
            }
}

/* Q35_CUDA_TC: 0 (off: the CUDA-core kernel for every pass), 2 or 3 terms
 * (default 3). */
static int tc_splits(void) {
    static int splits = -1;
    if (splits < 0) {
        const char *v = getenv("Q35_CUDA_TC");
        splits = v && !strcmp(v, "0") ? 0 : v && !strcmp(v, "2") ? 2 : 3;
    }
    return splits;
}

template <int DT>
static void launch_tc(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add, int splits) {
    dim3 grid((unsigned)((W.n_out + TC_N - 1) / TC_N), (unsigned)((T + TC_M - 1) / TC_M));
    if (splits == 2) tc_matmul_kernel<DT, 2><<<grid, 256, 0, s>>>(y, W, x, T, add);
    else tc_matmul_kernel<DT, 3><<<grid, 256, 0, s>>>(y, W, x, T, add);
}

extern "C" int q35_cu_matmul_tc(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add,
                                cudaError_t *rc) {
    return q35_cu_matmul_tc_terms(s, y, W, x, T, add, tc_splits(), rc);
}

extern "C" int q35_cu_matmul_tc_terms(cudaStream_t s, float *y, q35_cuda_mat W, const float *x, int32_t T, int add,
                                      int splits, cudaError_t *rc) {
    if ((splits != 2 && splits != 3) || W.n_in % TC_K || T <= 0) return 0;
    switch (W.dtype) {
    case Q35_CU_BF16: launch_tc<Q35_CU_BF16>(s, y, W, x, T, add, splits); break;
    case Q35_CU_BFP8: launch_tc<Q35_CU_BFP8>(s, y, W, x, T, add, splits); break;
    case Q35_CU_BFP4: launch_tc<Q35_CU_BFP4>(s, y, W, x, T, add, splits); break;
    default: return 0;
    }
    *rc = cudaGetLastError();
    return 1;
}
