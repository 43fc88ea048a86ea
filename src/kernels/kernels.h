/* kernels.h: the compute kernels the forward pass calls.
 *
 * ref.c is the scalar reference: plain loops, double accumulation, every
 * dtype. It is the oracle the per-ISA kernels are tested against. */
#ifndef Q35_KERNELS_H
#define Q35_KERNELS_H

#include "tensor.h"

/* y[t*n_out + o] = sum_i W[o,i] * x[t*n_in + i] for t < n_tok and o in [o0, o1),
 * where W is [n_out, n_in]. Rows outside [o0, o1) are not written. */
void q35_matmul_ref(float *y, const q35_tensor *W, const float *x, int64_t n_tok, int64_t o0, int64_t o1);

/* Row r of a 2-D tensor (an embedding table) widened to float. */
void q35_get_row_ref(float *out, const q35_tensor *W, int64_t r);

#endif
