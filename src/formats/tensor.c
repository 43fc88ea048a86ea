/* tensor.c: element access for stored tensors.
 *
 * The norms, gates and conv taps of the forward pass read their weights
 * element by element through here, so the float dtypes are widened inline
 * (an indirect call per element through the dtype table measured ~9% more
 * instructions for a decode step of the demo model); the block formats go
 * through the table's decoder. */
#include "formats/tensor.h"
#include "base/util.h"

float q35_tensor_get_f32(const q35_tensor *t, int64_t i) {
    uint16_t h;
    float f;
    switch (t->dtype) {
    case Q35_DT_F32: memcpy(&f, (const char *)t->data + 4 * i, 4); return f;
    case Q35_DT_BF16: memcpy(&h, (const char *)t->data + 2 * i, 2); return q35_bf16_to_f32(h);
    case Q35_DT_F16: memcpy(&h, (const char *)t->data + 2 * i, 2); return q35_f16_to_f32(h);
    default: break;
    }
    if (!q35_dtype_info(t->dtype)) return 0.0f;
    q35_dtype_decode(t->dtype, t->data, t->ndim ? t->shape[t->ndim - 1] : 1, i, 1, &f);
    return f;
}
