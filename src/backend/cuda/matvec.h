/* matvec.h: one lane's share of a matrix row times the input rows, in the
 * device image's lane-interleaved layout (layout.h). The matmul kernel
 * (kernels.cu) runs exactly this code per lane, then sums the 32 lanes
 * with a butterfly; the layout tests run it on the host for all 32 lanes
 * against the cache's values, so that the layout, the decoding and the
 * indexing are checked where there is no GPU.
 *
 * A row is cut into windows of 32 chunks of 16 bytes (512 bytes, WIN
 * values: 128 F32, 256 F16/BF16, 512 BFP8, 1024 BFP4). Lane l's chunk of
 * window w holds the values at w*WIN + 128*j + 4*l + e for the groups j <
 * VALS/4 and e < 4, in (j, e) order, so that the 32 lanes read group j's
 * inputs as 32 consecutive float4 (512 coalesced bytes). BFP codes are
 * stored offset-binary (value + 8 for BFP4, + 128 for BFP8), which decode
 * as float(0x4B000000 | u) - (2^23 + offset), exactly. The block (16
 * values) of group j of lane l is 8*j + l/4 of its window; a window's
 * exponent bytes are stored lane group by lane group: g = l/4 reads its
 * VALS/4 bytes (one per j) at g*VALS/4. */
#ifndef Q35_CUDA_MATVEC_H
#define Q35_CUDA_MATVEC_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define Q35_HD __host__ __device__ __forceinline__
#ifdef __CUDA_ARCH__
#define Q35_UNROLL _Pragma("unroll")
#else
#define Q35_UNROLL
#endif
#else
#include <math.h>
#include "base/util.h"
#define Q35_HD static inline
#define Q35_UNROLL
#endif

/* q35_dtype values (formats/dtype.h), repeated for the device compiler. */
enum { Q35_CU_F32 = 0, Q35_CU_F16 = 1, Q35_CU_BF16 = 2, Q35_CU_BFP8 = 3, Q35_CU_BFP4 = 4 };

#define Q35_CU_CHUNK 16                       /* bytes one lane reads per window */
#define Q35_CU_WINDOW_BYTES (32 * Q35_CU_CHUNK) /* one window of a row, all lanes */

/* Values per 16-byte chunk; a window holds 32 times that. */
Q35_HD int q35_cu_vals(int dt) { return dt == Q35_CU_F32 ? 4 : dt == Q35_CU_BFP8 ? 16 : dt == Q35_CU_BFP4 ? 32 : 8; }
Q35_HD int q35_cu_is_bfp(int dt) { return dt == Q35_CU_BFP8 || dt == Q35_CU_BFP4; }

Q35_HD float q35_cu_bits_float(uint32_t u) {
#ifdef __CUDA_ARCH__
    return __uint_as_float(u);
#else
    float f;
    memcpy(&f, &u, 4);
    return f;
#endif
}

Q35_HD float q35_cu_half(uint32_t h) {
#ifdef __CUDACC__
    return __half2float(__ushort_as_half((unsigned short)h));
#else
    return q35_f16_to_f32((uint16_t)h);
#endif
}

/* 2^(E - 127 - (w - 1)) for a block exponent byte E and w magnitude bits. */
Q35_HD float q35_cu_bfp_scale(uint32_t e, int w) {
    int f = (int)e - (w - 1);
    return f >= 1 ? q35_cu_bits_float((uint32_t)f << 23) : ldexpf(1.0f, f - 127);
}

/* Where value i of a row lives: the byte offset of its lane's chunk in the
 * row, and its index *k within the chunk. */
Q35_HD size_t q35_cu_chunk_of(int dt, int64_t i, int *k) {
    const int64_t win = 32 * q35_cu_vals(dt), w = i / win, rem = i % win, j = rem / 128, l = (rem % 128) / 4;
    *k = (int)(4 * j + rem % 4);
    return (size_t)w * Q35_CU_WINDOW_BYTES + (size_t)l * Q35_CU_CHUNK;
}

/* Where block b's exponent lives in a row's exponents (window by window,
 * lane group g = l/4 then group j: block 8 j + g of its window). */
Q35_HD size_t q35_cu_exp_of(int dt, int64_t b) {
    const int64_t vals = q35_cu_vals(dt), per_win = 2 * vals, w = b / per_win, rem = b % per_win;
    return (size_t)(w * per_win + (rem % 8) * (vals / 4) + rem / 8);
}

/* Value k of a chunk with exponent byte e (BFP; ignored otherwise). */
Q35_HD float q35_cu_value(int dt, const uint8_t *chunk, int k, uint32_t e) {
    uint16_t h;
    switch (dt) {
    case Q35_CU_F32: { float f; memcpy(&f, chunk + 4 * k, 4); return f; }
    case Q35_CU_F16: memcpy(&h, chunk + 2 * k, 2); return q35_cu_half(h);
    case Q35_CU_BF16: memcpy(&h, chunk + 2 * k, 2); return q35_cu_bits_float((uint32_t)h << 16);
    case Q35_CU_BFP8: return (float)((int)chunk[k] - 128) * q35_cu_bfp_scale(e, 7);
    default: return (float)((int)((chunk[k / 2] >> (4 * (k % 2))) & 15) - 8) * q35_cu_bfp_scale(e, 3);
    }
}

/* The 4 values of group j of a chunk (words q): the values themselves for
 * the float formats, the signed integer codes for BFP (the block scale is
 * applied to the group's sum). */
Q35_HD void q35_cu_group(int dt, const uint32_t q[4], int j, float w[4]) {
    if (dt == Q35_CU_F32) {
        Q35_UNROLL
        for (int e = 0; e < 4; e++) w[e] = q35_cu_bits_float(q[e]);
    } else if (dt == Q35_CU_BF16) {
        const uint32_t a = q[2 * j], b = q[2 * j + 1];
        w[0] = q35_cu_bits_float(a << 16), w[1] = q35_cu_bits_float(a & 0xffff0000u);
        w[2] = q35_cu_bits_float(b << 16), w[3] = q35_cu_bits_float(b & 0xffff0000u);
    } else if (dt == Q35_CU_F16) {
        const uint32_t a = q[2 * j], b = q[2 * j + 1];
        w[0] = q35_cu_half(a & 0xffff), w[1] = q35_cu_half(a >> 16), w[2] = q35_cu_half(b & 0xffff), w[3] = q35_cu_half(b >> 16);
    } else if (dt == Q35_CU_BFP8) {
        const uint32_t u = q[j];
        Q35_UNROLL
        for (int e = 0; e < 4; e++) w[e] = q35_cu_bits_float(0x4B000000u | ((u >> (8 * e)) & 0xffu)) - 8388736.0f;
    } else {
        const uint32_t u = q[j >> 1] >> (16 * (j & 1));
        Q35_UNROLL
        for (int e = 0; e < 4; e++) w[e] = q35_cu_bits_float(0x4B000000u | ((u >> (4 * e)) & 15u)) - 8388616.0f;
    }
}

/* One float4 of an input row (16-byte aligned on the device). */
typedef struct q35_cu_f4 { float x, y, z, w; } q35_cu_f4;
Q35_HD q35_cu_f4 q35_cu_load4(const float *p) {
#ifdef __CUDA_ARCH__
    const float4 v = __ldg((const float4 *)p);
    q35_cu_f4 r = {v.x, v.y, v.z, v.w};
    return r;
#else
    q35_cu_f4 r = {p[0], p[1], p[2], p[3]};
    return r;
#endif
}

/* acc[t] += lane l's share of window w for the input rows t < nt (x: nt
 * rows of n_in floats). q: the lane's chunk of the window; ex: its lane
 * group's exponent bytes of the window (BFP only). The groups in order,
 * each a 4-term fmaf chain, then for BFP times its block scale. */
Q35_HD void q35_cu_lane_window(int dt, const uint32_t q[4], const uint32_t ex[2], const float *x, int32_t n_in,
                               int32_t w, int l, int nt, int nt_max, float *acc) {
    const int vals = q35_cu_vals(dt), groups = vals / 4, win = 32 * vals;
    const int32_t x0 = w * win + 4 * l;
    const int full = (w + 1) * win <= n_in;
    Q35_UNROLL
    for (int j = 0; j < groups; j++) {
        const int32_t xi = x0 + 128 * j;
        if (!full && xi >= n_in) break;
        float v[4];
        q35_cu_group(dt, q, j, v);
        const float sc = q35_cu_is_bfp(dt) ? q35_cu_bfp_scale((ex[j >> 2] >> (8 * (j & 3))) & 0xffu, dt == Q35_CU_BFP8 ? 7 : 3) : 1.0f;
        Q35_UNROLL
        for (int t = 0; t < nt_max; t++) {
            if (t >= nt) break;
            const q35_cu_f4 a = q35_cu_load4(x + (size_t)t * (size_t)n_in + (size_t)xi);
            float s = v[0] * a.x;
            s = fmaf(v[1], a.y, s);
            s = fmaf(v[2], a.z, s);
            s = fmaf(v[3], a.w, s);
            acc[t] = q35_cu_is_bfp(dt) ? fmaf(sc, s, acc[t]) : acc[t] + s;
        }
    }
}

#endif
