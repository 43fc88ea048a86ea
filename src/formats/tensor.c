/* tensor.c: dtype names and element access for stored tensors. */
#include "formats/tensor.h"
#include "formats/bfp.h"
#include "base/util.h"

const char *q35_dtype_name(q35_dtype dt) {
    switch (dt) {
    case Q35_DT_F32: return "F32";
    case Q35_DT_F16: return "F16";
    case Q35_DT_BF16: return "BF16";
    case Q35_DT_BFP8: return "BFP8";
    case Q35_DT_BFP4: return "BFP4";
    default: return "?";
    }
}

float q35_tensor_get_f32(const q35_tensor *t, int64_t i) {
    switch (t->dtype) {
    case Q35_DT_F32: { float f; memcpy(&f, (const char *)t->data + 4 * i, 4); return f; }
    case Q35_DT_F16: { uint16_t h; memcpy(&h, (const char *)t->data + 2 * i, 2); return q35_f16_to_f32(h); }
    case Q35_DT_BF16: { uint16_t h; memcpy(&h, (const char *)t->data + 2 * i, 2); return q35_bf16_to_f32(h); }
    case Q35_DT_BFP8:
    case Q35_DT_BFP4: {
        int64_t n_in = t->shape[t->ndim - 1];
        return q35_bfp_get(t->dtype, t->data, n_in, i / n_in, i % n_in);
    }
    default: return 0.0f;
    }
}
