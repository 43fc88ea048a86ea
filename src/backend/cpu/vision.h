/* vision.h: Qwen3.5's vision tower on the host (vision.c).
 *
 * pixel_values (the image processor's rows, all images one after another,
 * each in merge-block order) -> one row of the language model's width per
 * merged patch group:
 *   x = patches W_patch^T + b                       the Conv3d (stride = kernel) as a matmul
 *   x += bilinear(pos_embed, grid)                  the learned side x side table resampled
 *                                                   to each image's grid (align_corners)
 *   per block: x += proj(attn(rot(LN1(x))));  x += fc2(gelu_tanh(fc1(LN2(x))))
 *              attention is bidirectional, within one image (one frame); q and k
 *              carry the 2D rotary of each patch's (row, column)
 *   out = fc2(gelu(fc1(concat_{MS x MS}(LN(x)))))   the merger: each group of MS*MS
 *                                                   consecutive rows becomes one
 * Matmuls split their output rows over the pool (compute.h), attention
 * splits (head, block of 64 queries) units in fixed ranges (vision.c), so the
 * output does not depend on the thread count. Scratch is allocated per
 * call: an image is encoded once, outside the token loop. */
#ifndef Q35_CPU_VISION_H
#define Q35_CPU_VISION_H

#include "backend/cpu/compute.h"
#include "model/model.h"

/* grid_thw: n_images rows of (t, h, w), as image_grid_thw; pixel_values has
 * sum(t*h*w) rows of C*TP*PS*PS. out: sum(t*h*w) / MS^2 rows of VO. */
q35_status q35_vision_forward(const q35_host *h, const q35_vision_config *vc, const q35_vision_weights *w,
                              const float *pixel_values, int32_t n_images, const int32_t (*grid_thw)[3], float *out,
                              q35_error *err);

/* Rows of the output for these grids (0 with an error for a bad grid). */
int64_t q35_vision_out_rows(const q35_vision_config *vc, int32_t n_images, const int32_t (*grid_thw)[3],
                            q35_error *err);

#endif
