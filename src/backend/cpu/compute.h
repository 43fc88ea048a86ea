/* compute.h: the forward pass's entry to the kernels and the thread pool.
 * The matmuls split their output rows across the pool's workers in fixed,
 * aligned ranges, so results do not depend on the thread count (each output
 * row is computed by exactly one worker, in the same order). */
#ifndef Q35_COMPUTE_H
#define Q35_COMPUTE_H

#include "formats/tensor.h"
#include "backend/cpu/threadpool.h"

/* y (n_tok, n_out) = x (n_tok, n_in) W^T, with W (n_out, n_in). */
void q35_matmul(q35_pool *pool, float *y, const q35_tensor *W, const float *x, int64_t n_tok);

/* ys[i] = x Ws[i]^T for n matrices of the same n_in, in one handoff to the
 * pool: the rows of all of them are split over the workers together, and
 * each worker quantizes x once for all its rows (kernels' matmul_n). */
void q35_matmul_multi(q35_pool *pool, int n, float *const *ys, const q35_tensor *const *Ws, const float *x,
                      int64_t n_tok);

/* h (n_tok, I) = silu(x W_gate^T) * (x W_up^T), with gate and up (n_tok, I)
 * as scratch (h may be gate). One handoff; each worker applies the product
 * to the rows it has just computed. */
void q35_matmul_swiglu(q35_pool *pool, float *h, float *gate, float *up, const q35_tensor *W_gate,
                       const q35_tensor *W_up, const float *x, int64_t n_tok);

#endif
