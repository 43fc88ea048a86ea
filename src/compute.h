/* compute.h: the forward pass's entry to the kernels and the thread pool.
 * q35_matmul splits the output rows of one matmul across the pool's
 * workers in fixed, aligned ranges, so results do not depend on the thread
 * count (each output row is computed by exactly one worker, in the same
 * order). */
#ifndef Q35_COMPUTE_H
#define Q35_COMPUTE_H

#include "tensor.h"
#include "threadpool.h"

/* y (n_tok, n_out) = x (n_tok, n_in) W^T, with W (n_out, n_in). */
void q35_matmul(q35_pool *pool, float *y, const q35_tensor *W, const float *x, int64_t n_tok);

#endif
