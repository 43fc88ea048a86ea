/* layout.h: the CUDA backend's host-side arithmetic, in plain C so that it
 * compiles (and is unit-tested) without nvcc or a GPU: the device image of
 * a weight matrix, the layout of a sequence state and of the pass scratch,
 * and the checks of a configuration against what the kernels support.
 *
 * Device image of a matrix [n_out, n_in] (what the matmul kernels read):
 * rows of whole windows (matvec.h: 32 lane chunks of 16 bytes; lane l's
 * chunk holds the values at 128 j + 4 l + e of its window), pitch a
 * multiple of 512 bytes, padding zero:
 *   F32, F16, BF16  the values, in that interleaving
 *   BFP8, BFP4      the codes in that interleaving, offset-binary (value +
 *                   128, + 8), one byte / one nibble each (the even value of
 *                   a byte in its low nibble); then, from exp_offset
 *                   (256-aligned), each row's block exponents (pitch
 *                   exp_pitch), each window's in lane-group order
 * n_in is a multiple of 4 (16 for BFP). The cache's 16-row panels (bfp.h)
 * are laid out for an int8 dot product on one CPU core; a warp reads one
 * row per pass instead, its inputs as 512 consecutive bytes per group,
 * which is what this re-layout buys. The codec (code, shared exponent,
 * value = (-1)^s m 2^(E - 127 - (w - 1))) is unchanged. */
#ifndef Q35_CUDA_LAYOUT_H
#define Q35_CUDA_LAYOUT_H

#include "model/model.h"

#include <stddef.h>
#include <stdint.h>

typedef struct q35_cuda_mat_layout {
    q35_dtype dtype;
    int64_t n_out, n_in;
    size_t pitch;      /* bytes per row of values or codes, a multiple of 16 */
    size_t exp_pitch;  /* BFP: exponent bytes per row (0 otherwise) */
    size_t exp_offset; /* BFP: where the exponents start */
    size_t bytes;      /* the whole image */
} q35_cuda_mat_layout;

/* The image of a 1-D or 2-D tensor (a 1-D one is one row). Q35_ERR_FORMAT
 * for a dtype or shape the kernels do not take. */
q35_status q35_cuda_mat_layout_of(const q35_tensor *t, q35_cuda_mat_layout *out, q35_error *err);

/* Rows [r0, r1) of t's image: values or codes into codes ((r1 - r0) * pitch
 * bytes), BFP exponents into exps ((r1 - r0) * exp_pitch bytes; NULL for
 * the other dtypes). Padding bytes are zero. */
void q35_cuda_mat_pack_rows(const q35_tensor *t, const q35_cuda_mat_layout *L, int64_t r0, int64_t r1, void *codes,
                            void *exps);

/* The same over n_threads threads (disjoint row ranges; identical bytes). */
void q35_cuda_mat_pack_rows_par(const q35_tensor *t, const q35_cuda_mat_layout *L, int64_t r0, int64_t r1, void *codes,
                                void *exps, int n_threads);

/* Element (r, i) of a whole image in host memory, as the kernels decode it. */
float q35_cuda_mat_get(const q35_cuda_mat_layout *L, const void *image, int64_t r, int64_t i);

/* A sequence state in device memory: one allocation holding
 *   rec   every GDN layer's conv state (CD, CK-1) then recurrent state
 *         (HV, DK, DV), in layer order (the block a rewind or snapshot copies)
 *   kv    every full layer's K (n_ctx, NKV*HD) then V (n_ctx, NKV*HD)
 * and, after state_set_spec, a second one for speculation:
 *   rows  spec_k copies of rec (the state after each row of a verify pass)
 *   mtp   the MTP layer's K then V; kept (SPEC_MAX+1, H); draft (H). */
typedef struct q35_cuda_state_layout {
    size_t conv_floats, ssm_floats; /* one GDN layer */
    size_t rec_floats;              /* all GDN layers */
    size_t kv_row_floats;           /* NKV * HD */
    size_t kv_layer_floats;         /* K and V of one full layer: 2 * n_ctx * kv_row_floats */
    size_t kv_floats;               /* all full layers */
    size_t total_floats;            /* rec + kv */
} q35_cuda_state_layout;

void q35_cuda_state_layout_of(const q35_config *c, int32_t n_ctx, q35_cuda_state_layout *out);

/* Layer li's index among the layers of its kind (GDN or full attention). */
int32_t q35_cuda_kind_index(const q35_config *c, int32_t li);

/* Offsets (in floats, each 64-float aligned) of the pass scratch for
 * `rows` rows; total is the sum. */
typedef struct q35_cuda_scratch_layout {
    size_t x, xn, tmp, gate, up;          /* (rows, H) x3, (rows, I) x2 */
    size_t qg, k, v, o;                   /* attention: (rows, 2*NH*HD), (rows, KVD) x2, (rows, NH*HD) */
    size_t raw, y, z, core, bb, aa;       /* GDN: (rows, CD) x2, (rows, HV*DV) x2, (rows, HV) x2 */
    size_t mtp_u, mtp_un, mtp_cat;        /* (rows, H) x2, (rows, 2H) */
    size_t logits;                        /* (rows, V) */
    size_t total;
} q35_cuda_scratch_layout;

void q35_cuda_scratch_layout_of(const q35_config *c, int32_t rows, int mtp, q35_cuda_scratch_layout *out);

/* Q35_ERR_UNSUPPORTED naming the first dimension the kernels do not take. */
q35_status q35_cuda_check_config(const q35_config *c, q35_error *err);

/* Device bytes the weights of w take as images (every tensor the backend
 * uploads), for the memory check at open. */
size_t q35_cuda_weight_bytes(const q35_config *c, const q35_weights *w);

/* The devices this build can see: the count (0: none), and in why a line
 * saying why there are none. Defined only when built with CUDA (Q35_CUDA). */
int q35_cuda_device_count(char *why, size_t why_size);

/* CUDA builds only, for the GPU benchmark: device 0's device-to-device
 * copy bandwidth (bytes read plus written per second, median of several
 * copies of a 1 GiB buffer), and its memory in use now (total - free). */
q35_status q35_cuda_copy_bandwidth(double *gb_s, q35_error *err);
q35_status q35_cuda_mem_used(size_t *used, size_t *total, q35_error *err);
/* The matmul kernel alone on an n_out x n_in matrix of dtype, T rows (median
 * seconds per call, the L2 cold; bytes of the matrix image), and the mean
 * time per launch of n tiny matmuls back to back on one stream. */
q35_status q35_cuda_matmul_time(int32_t dtype, int32_t n_out, int32_t n_in, int32_t T, double *sec, size_t *bytes,
                                q35_error *err);
q35_status q35_cuda_launch_time(int n, double *sec, q35_error *err);

#endif
