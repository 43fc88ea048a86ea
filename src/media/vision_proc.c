/* vision_proc.c: smart_resize, the preprocessor_config.json reader, and the
 * normalisation and patch layout of Qwen3.5's image processor
 * (vision_proc.h says what each step computes).
 *
 * The normalisation is computed as the torchvision backend fuses it: mean
 * and std are scaled by 1 / rescale_factor in float32 once, then each value
 * is (v - mean') / std' in float32, so the results are the same floats. */
#include "media/vision_proc.h"

#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void q35_vision_proc_defaults(q35_vision_proc *p) {
    memset(p, 0, sizeof *p);
    p->patch_size = 16;
    p->temporal_patch_size = 2;
    p->merge_size = 2;
    p->min_pixels = 65536;
    p->max_pixels = 16777216;
    p->do_resize = p->do_rescale = p->do_normalize = 1;
    p->rescale_factor = 1.0 / 255.0;
    for (int c = 0; c < 3; c++) p->image_mean[c] = p->image_std[c] = 0.5f;
}

static q35_status get_int(json_t *o, const char *key, int64_t lo, int64_t hi, int64_t *out, const char *label,
                          q35_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return Q35_OK;
    if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: %s must be an integer in [%lld, %lld]", label, key, (long long)lo,
                        (long long)hi);
    *out = json_integer_value(v);
    return Q35_OK;
}

static q35_status get_flag(json_t *o, const char *key, int32_t *out, const char *label, q35_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return Q35_OK;
    if (!json_is_boolean(v)) return q35_fail(err, Q35_ERR_FORMAT, "%s: %s must be true or false", label, key);
    *out = json_is_true(v);
    return Q35_OK;
}

static q35_status get_triple(json_t *o, const char *key, float out[3], const char *label, q35_error *err) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return Q35_OK;
    if (!json_is_array(v) || json_array_size(v) != 3)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: %s must be a list of 3 numbers", label, key);
    for (int c = 0; c < 3; c++) {
        json_t *x = json_array_get(v, (size_t)c);
        if (!json_is_number(x)) return q35_fail(err, Q35_ERR_FORMAT, "%s: %s must be a list of 3 numbers", label, key);
        out[c] = (float)json_number_value(x);
    }
    return Q35_OK;
}

q35_status q35_vision_proc_parse(const char *text, size_t len, const char *label, q35_vision_proc *p,
                                 q35_error *err) {
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    if (!root) return q35_fail(err, Q35_ERR_FORMAT, "%s: bad JSON at line %d: %s", label, jerr.line, jerr.text);
    q35_status st = Q35_OK;
    int64_t patch = p->patch_size, tpatch = p->temporal_patch_size, merge = p->merge_size;
    int64_t lo = p->min_pixels, hi = p->max_pixels, resample = 3;
    const int64_t big = (int64_t)1 << 40;
    if (!json_is_object(root)) {
        st = q35_fail(err, Q35_ERR_FORMAT, "%s: not a JSON object", label);
        goto done;
    }
    json_t *size = json_object_get(root, "size");
    if (size && !json_is_null(size) && !json_is_object(size)) {
        st = q35_fail(err, Q35_ERR_FORMAT, "%s: size must be an object", label);
        goto done;
    }
    if ((st = get_int(root, "patch_size", 1, 1024, &patch, label, err)) ||
        (st = get_int(root, "temporal_patch_size", 1, 64, &tpatch, label, err)) ||
        (st = get_int(root, "merge_size", 1, 64, &merge, label, err)) ||
        (size && (st = get_int(size, "shortest_edge", 0, big, &lo, label, err))) ||
        (size && (st = get_int(size, "longest_edge", 1, big, &hi, label, err))) ||
        (st = get_int(root, "min_pixels", 0, big, &lo, label, err)) ||
        (st = get_int(root, "max_pixels", 1, big, &hi, label, err)) ||
        (st = get_int(root, "resample", 0, 5, &resample, label, err)) ||
        (st = get_flag(root, "do_resize", &p->do_resize, label, err)) ||
        (st = get_flag(root, "do_rescale", &p->do_rescale, label, err)) ||
        (st = get_flag(root, "do_normalize", &p->do_normalize, label, err)) ||
        (st = get_triple(root, "image_mean", p->image_mean, label, err)) ||
        (st = get_triple(root, "image_std", p->image_std, label, err)))
        goto done;
    json_t *rf = json_object_get(root, "rescale_factor");
    if (rf && !json_is_null(rf)) {
        if (!json_is_number(rf) || !(json_number_value(rf) > 0)) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: rescale_factor must be a positive number", label);
            goto done;
        }
        p->rescale_factor = json_number_value(rf);
    }
    if (resample != 3) {
        st = q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: resample %lld (only bicubic, 3, is supported)", label,
                      (long long)resample);
        goto done;
    }
    for (int c = 0; c < 3; c++)
        if (!(p->image_std[c] != 0.0f)) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: image_std must not be 0", label);
            goto done;
        }
    if (lo > hi) {
        st = q35_fail(err, Q35_ERR_FORMAT, "%s: the minimum pixels %lld exceed the maximum %lld", label,
                      (long long)lo, (long long)hi);
        goto done;
    }
    p->patch_size = (int32_t)patch, p->temporal_patch_size = (int32_t)tpatch, p->merge_size = (int32_t)merge;
    p->min_pixels = lo, p->max_pixels = hi;
done:
    json_decref(root);
    return st;
}

q35_status q35_smart_resize(int64_t height, int64_t width, int64_t factor, int64_t min_pixels, int64_t max_pixels,
                            int32_t *out_height, int32_t *out_width, q35_error *err) {
    if (height <= 0 || width <= 0 || factor <= 0) return q35_fail(err, Q35_ERR_ARG, "smart_resize: empty size");
    const double ratio = (double)(height > width ? height : width) / (double)(height > width ? width : height);
    if (ratio > 200)
        return q35_fail(err, Q35_ERR_ARG, "image %lldx%lld: aspect ratio %.4g is over 200", (long long)width,
                        (long long)height, ratio);
    /* Python's round() rounds halves to even, as nearbyint does in the default mode */
    int64_t h = (int64_t)nearbyint((double)height / (double)factor) * factor;
    int64_t w = (int64_t)nearbyint((double)width / (double)factor) * factor;
    if (h * w > max_pixels) {
        const double beta = sqrt((double)(height * width) / (double)max_pixels);
        h = (int64_t)floor((double)height / beta / (double)factor) * factor;
        w = (int64_t)floor((double)width / beta / (double)factor) * factor;
        if (h < factor) h = factor;
        if (w < factor) w = factor;
    } else if (h * w < min_pixels) {
        const double beta = sqrt((double)min_pixels / (double)(height * width));
        h = (int64_t)ceil((double)height * beta / (double)factor) * factor;
        w = (int64_t)ceil((double)width * beta / (double)factor) * factor;
    }
    if (h <= 0 || w <= 0 || h > Q35_IMAGE_MAX_SIDE || w > Q35_IMAGE_MAX_SIDE)
        return q35_fail(err, Q35_ERR_ARG, "image %lldx%lld: resized size %lldx%lld is out of range",
                        (long long)width, (long long)height, (long long)w, (long long)h);
    *out_height = (int32_t)h;
    *out_width = (int32_t)w;
    return Q35_OK;
}

void q35_vision_input_free(q35_vision_input *in) {
    if (!in) return;
    free(in->pixel_values);
    memset(in, 0, sizeof *in);
}

q35_status q35_vision_patchify(const q35_vision_proc *p, const q35_image *img, q35_vision_input *out,
                               q35_error *err) {
    memset(out, 0, sizeof *out);
    const int32_t ps = p->patch_size, m = p->merge_size, tp = p->temporal_patch_size;
    if (ps <= 0 || m <= 0 || tp <= 0) return q35_fail(err, Q35_ERR_ARG, "image processor: bad patch sizes");
    if (img->width % (ps * m) || img->height % (ps * m))
        return q35_fail(err, Q35_ERR_ARG, "image processor: %dx%d is not a multiple of patch %d x merge %d",
                        img->width, img->height, ps, m);
    const int32_t gh = img->height / ps, gw = img->width / ps;
    out->grid_t = 1, out->grid_h = gh, out->grid_w = gw;
    out->n_patches = (int64_t)gh * gw;
    out->patch_dim = (int64_t)3 * tp * ps * ps;
    out->pixel_values = malloc(sizeof(float) * (size_t)(out->n_patches * out->patch_dim));
    if (!out->pixel_values) return q35_fail(err, Q35_ERR_NOMEM, "image processor: no memory for %lld patches",
                                            (long long)out->n_patches);
    /* the fused rescale + normalise of the torchvision backend */
    float mean[3], scale_inv[3];
    int normalize = p->do_normalize, rescale = p->do_rescale;
    for (int c = 0; c < 3; c++) {
        mean[c] = p->image_mean[c], scale_inv[c] = p->image_std[c];
        if (normalize && rescale) {
            const float k = (float)(1.0 / p->rescale_factor);
            mean[c] *= k, scale_inv[c] *= k;
        }
    }
    const float rf = (float)p->rescale_factor;
    float *row = out->pixel_values;
    for (int32_t bh = 0; bh < gh / m; bh++)
        for (int32_t bw = 0; bw < gw / m; bw++)
            for (int32_t mh = 0; mh < m; mh++)
                for (int32_t mw = 0; mw < m; mw++, row += out->patch_dim) {
                    const int32_t y0 = (bh * m + mh) * ps, x0 = (bw * m + mw) * ps;
                    float *dst = row;
                    for (int c = 0; c < 3; c++) {
                        float *first = dst;
                        for (int32_t py = 0; py < ps; py++) {
                            const uint8_t *src = img->rgb + ((size_t)(y0 + py) * (size_t)img->width + (size_t)x0) * 3;
                            for (int32_t px = 0; px < ps; px++) {
                                float v = (float)src[3 * px + c];
                                if (normalize) v = (v - mean[c]) / scale_inv[c];
                                else if (rescale) v = v * rf;
                                *dst++ = v;
                            }
                        }
                        for (int32_t t = 1; t < tp; t++, dst += ps * ps)
                            memcpy(dst, first, sizeof(float) * (size_t)ps * (size_t)ps);
                    }
                }
    return Q35_OK;
}

q35_status q35_vision_preprocess(const q35_vision_proc *p, const q35_image *img, q35_vision_input *out,
                                 q35_error *err) {
    memset(out, 0, sizeof *out);
    if (!p->do_resize) return q35_vision_patchify(p, img, out, err);
    int32_t h, w;
    q35_status st = q35_smart_resize(img->height, img->width, (int64_t)p->patch_size * p->merge_size, p->min_pixels,
                                     p->max_pixels, &h, &w, err);
    if (st != Q35_OK) return st;
    q35_image resized;
    if ((st = q35_image_resize_bicubic(img, w, h, &resized, err)) != Q35_OK) return st;
    st = q35_vision_patchify(p, &resized, out, err);
    q35_image_free(&resized);
    return st;
}
