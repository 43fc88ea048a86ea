/* tensor.c: element access for stored tensors. */
#include "formats/tensor.h"

float q35_tensor_get_f32(const q35_tensor *t, int64_t i) {
    if (!q35_dtype_info(t->dtype)) return 0.0f;
    float f;
    q35_dtype_decode(t->dtype, t->data, t->ndim ? t->shape[t->ndim - 1] : 1, i, 1, &f);
    return f;
}
