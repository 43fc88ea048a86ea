/* vision_proc.h: Qwen3.5's image processor: an RGB8 image into the patch
 * rows the vision tower reads (`pixel_values`) and its grid
 * (`image_grid_thw`), as transformers' Qwen2VLImageProcessor (the class
 * AutoProcessor gives for qwen3_5, torchvision backend) computes them.
 *
 * The steps: smart_resize picks the size (both sides multiples of
 * patch * merge, the area within [min_pixels, max_pixels], the aspect kept as
 * closely as it can), bicubic antialiased resampling to it (resize.c), the
 * fused rescale and normalisation (v - mean/rescale) / (std/rescale) in
 * float32, and the patch layout: one row per patch, rows ordered by merge
 * block (block row, block column, then the merge x merge patches inside it,
 * row-major), each row (channel, temporal copy, patch row, patch column) with
 * the image repeated temporal_patch_size times. grid = (1, H / patch,
 * W / patch). */
#ifndef Q35_MEDIA_VISION_PROC_H
#define Q35_MEDIA_VISION_PROC_H

#include "media/image.h"

typedef struct q35_vision_proc {
    int32_t patch_size, temporal_patch_size, merge_size;
    int64_t min_pixels, max_pixels; /* size.shortest_edge, size.longest_edge */
    int32_t do_resize, do_rescale, do_normalize;
    double rescale_factor;
    float image_mean[3], image_std[3];
} q35_vision_proc;

/* The values of Qwen3.5's (and Qwen3-VL's) preprocessor_config.json:
 * patch 16, temporal patch 2, merge 2, min 65536 and max 16777216 pixels,
 * rescale 1/255, mean and std 0.5. */
void q35_vision_proc_defaults(q35_vision_proc *p);

/* Reads a preprocessor_config.json over the defaults (size.shortest_edge /
 * size.longest_edge, or the older min_pixels / max_pixels, which win as in
 * the processor's constructor; patch_size, temporal_patch_size, merge_size,
 * do_resize, do_rescale, rescale_factor, do_normalize, image_mean,
 * image_std). A resample other than bicubic (3) is Q35_ERR_UNSUPPORTED. */
q35_status q35_vision_proc_parse(const char *json, size_t len, const char *label, q35_vision_proc *p,
                                 q35_error *err);

/* transformers' smart_resize (Python's round-half-to-even included). An
 * aspect ratio over 200 is Q35_ERR_ARG, as there. */
q35_status q35_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels, int64_t max_pixels,
                            int32_t *out_height, int32_t *out_width, q35_error *err);

/* resize.c: `in` resampled to out_w x out_h (out is allocated). */
q35_status q35_image_resize_bicubic(const q35_image *in, int32_t out_w, int32_t out_h, q35_image *out,
                                    q35_error *err);

typedef struct q35_vision_input {
    int32_t grid_t, grid_h, grid_w; /* image_grid_thw */
    int64_t n_patches;              /* grid_t * grid_h * grid_w */
    int64_t patch_dim;              /* 3 * temporal_patch_size * patch_size^2 */
    float *pixel_values;            /* (n_patches, patch_dim), owned */
} q35_vision_input;

/* The whole processor on one decoded image. */
q35_status q35_vision_preprocess(const q35_vision_proc *p, const q35_image *img, q35_vision_input *out,
                                 q35_error *err);
/* The last two steps only, on an image already at its final size (both sides
 * multiples of patch * merge). */
q35_status q35_vision_patchify(const q35_vision_proc *p, const q35_image *img, q35_vision_input *out,
                               q35_error *err);
void q35_vision_input_free(q35_vision_input *in);

#endif
