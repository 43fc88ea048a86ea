/* processor.c: the public image processor (qwen35.h "Images"): a model
 * directory's preprocessor_config.json over Qwen3.5's defaults, and the
 * whole road from encoded bytes to pixel_values (image.c decodes,
 * vision_proc.c resizes, normalises and lays out the patches). */
#include "media/vision_proc.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

struct q35_image_processor {
    q35_vision_proc p;
    int64_t max_pixels; /* decoded width * height */
};

void q35_image_processor_set_max_pixels(q35_image_processor *p, int64_t max_pixels) {
    p->max_pixels = max_pixels > 0 ? max_pixels : Q35_IMAGE_MAX_DECODED_PIXELS;
}

q35_status q35_image_processor_load(const char *dir, q35_image_processor **out, q35_error *err) {
    *out = NULL;
    q35_image_processor *ip = calloc(1, sizeof *ip);
    if (!ip) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    q35_vision_proc_defaults(&ip->p);
    ip->max_pixels = Q35_IMAGE_MAX_DECODED_PIXELS;
    char path[4096];
    struct stat sb;
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir ? dir : ".");
    if (dir && stat(path, &sb) == 0) {
        char *text = NULL;
        size_t len = 0;
        q35_status st = q35_read_file(path, &text, &len, err);
        if (!st) st = q35_vision_proc_parse(text, len, path, &ip->p, err);
        free(text);
        if (st) {
            free(ip);
            return st;
        }
    }
    *out = ip;
    return Q35_OK;
}

void q35_image_processor_free(q35_image_processor *p) { free(p); }

q35_status q35_image_process(const q35_image_processor *p, const void *data, size_t len, q35_image_pixels *out,
                             q35_error *err) {
    memset(out, 0, sizeof *out);
    if (!data || !len) return q35_fail(err, Q35_ERR_FORMAT, "image: no bytes");
    q35_image img = {0};
    q35_status st = q35_image_decode(data, len, p->max_pixels, &img, err);
    if (st) return st;
    q35_vision_input in = {0};
    st = q35_vision_preprocess(&p->p, &img, &in, err);
    q35_image_free(&img);
    if (st) return st;
    out->grid_thw[0] = in.grid_t, out->grid_thw[1] = in.grid_h, out->grid_thw[2] = in.grid_w;
    out->n_patches = in.n_patches;
    out->patch_dim = in.patch_dim;
    out->pixel_values = in.pixel_values; /* ownership moves to out */
    return Q35_OK;
}

void q35_image_pixels_free(q35_image_pixels *px) {
    if (!px) return;
    free(px->pixel_values);
    px->pixel_values = NULL;
}
