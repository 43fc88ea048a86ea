/* gptq.h: the calibrated BFP encoder (GPTQ, Frantar et al. 2022, on the
 * block formats of bfp.h).
 *
 * The plain encoder rounds each weight to its nearest code. This one
 * rounds a matrix's rows so that the outputs move least on real inputs:
 * with H = sum over calibration rows of x x^T (the inputs the matrix saw
 * when the unquantized model read a calibration text), it visits the
 * inputs one at a time in a coding order and, for each row, codes w_k as the
 * plain encoder would under the block's exponent, then spreads the
 * rounding error over the inputs not yet coded, w_j -= e * U[k][j] / U[k][k]
 * (j after k in the order), where U is the upper Cholesky factor of H^-1
 * (U^T U = H^-1) with rows and columns in that order.
 * The weight cache codes the inputs in order of decreasing H[k][k] (the
 * inputs that carry most energy first, "act order"), with each block's
 * exponent fixed beforehand from the row's own values by the exponent
 * search of bfp.h. The stored format is the same, so kernels, bytes and speed do
 * not change.
 *
 * Everything is in double precision in a fixed order, and rows are
 * independent of each other, so the bytes do not depend on how the rows
 * are split over threads or chunks. docs/weight-cache.md has the recipe. */
#ifndef Q35_GPTQ_H
#define Q35_GPTQ_H

#include "qwen35.h"
#include "formats/tensor.h"

#include <stdint.h>

#define Q35_GPTQ_DAMP 0.01 /* damping added to H's diagonal, as a share of its mean */

/* The factor of one input: the order the inputs are coded in and U. */
typedef struct q35_gptq {
    int64_t n;
    int32_t *perm; /* perm[i] = the input coded i-th; NULL: 0 .. n-1 */
    double *U;     /* (n, n) upper triangular, in the coding order */
} q35_gptq;

/* From H (n x n, row-major, symmetric; only the upper triangle is read),
 * which out takes over (it becomes U): U^T U = (P (H + d I) P^T)^-1, with
 * d = damp * mean(diag H) and P the coding order: with act_order, inputs
 * by decreasing H[k][k] (ties by index), else in order. An input that never
 * moved (H[k][k] = 0) gets H[k][k] = 1 and no coupling, so its weights are
 * coded plainly. If the damped H is not positive definite in floating
 * point, d is raised tenfold (up to three times) before giving up with
 * Q35_ERR_ARG; on failure H stays the caller's, its contents undefined.
 * A non-finite diagonal is refused as such. The factorization's long steps
 * run on n_threads threads; U is the same on any number. */
q35_status q35_gptq_make(double *H, int64_t n, double damp, int act_order, int n_threads, q35_gptq *out,
                          q35_error *err);
void q35_gptq_free(q35_gptq *g); /* frees U and perm */

/* Rows of W (n_rows x n_in floats, row-major; n_rows a multiple of 16 or
 * the matrix's last rows) coded into dt's panel layout at dst (rows start on
 * a panel boundary), with g over n_in inputs. With a coding order, each
 * block's exponent is fixed first from the row's own values, as
 * q35_bfp_encode_block with flags (bfp.h: 0 or Q35_BFP_EXP_SEARCH) chooses
 * it; in order, by the plain rule from the values as they stand when the
 * block is reached (flags unused). Rows are split over n_threads threads
 * (<= 1: the calling thread). */
q35_status q35_bfp_pack_gptq(q35_dtype dt, void *dst, const float *W, int64_t n_rows, int64_t n_in, const q35_gptq *g,
                             unsigned flags, int n_threads, q35_error *err);

#endif
