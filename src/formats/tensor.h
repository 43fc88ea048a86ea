/* tensor.h: the engine's view of one weight tensor.
 *
 * Weights are never copied: `data` points into a read-only mapping of a
 * safetensors shard or of a weight cache. Shapes follow PyTorch order, so a
 * Linear weight is [out_features, in_features] with rows contiguous. */
#ifndef Q35_TENSOR_H
#define Q35_TENSOR_H

#include "formats/dtype.h"

#include <stddef.h>
#include <stdint.h>

#define Q35_MAX_DIMS 8

typedef struct q35_tensor {
    const char *name;              /* checkpoint name, e.g. "lm_head.weight" */
    q35_dtype dtype;
    int32_t ndim;
    int64_t shape[Q35_MAX_DIMS];   /* PyTorch order, outermost first */
    const void *data;              /* read-only, inside a mapping */
    size_t nbytes;
} q35_tensor;

static inline int64_t q35_tensor_nelem(const q35_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}

/* Element i of a tensor, widened to float (bfp tensors: slow, one block decoded). */
float q35_tensor_get_f32(const q35_tensor *t, int64_t i);

#endif
