/* ref.c: scalar reference kernels (see kernels.h). Correctness first: they
 * widen each weight to float (bfp blocks through the codec in bfp.c) and
 * accumulate in double. */
#include "kernels.h"
#include "bfp.h"
#include "util.h"

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

uint64_t q35_read_stream_ref(const void *p, size_t bytes) {
    const uint64_t *q = p;
    uint64_t s[8] = {0};
    for (size_t i = 0; i + 8 <= bytes / 8; i += 8)
        for (int j = 0; j < 8; j++) s[j] += q[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

const q35_kernels q35_kernels_ref = {"ref", q35_matmul_ref, q35_get_row_ref, q35_read_stream_ref};
