/* resize.c: antialiased bicubic resampling of RGB8, as torch computes it for
 * the image processor.
 *
 * Qwen3.5's image processor (transformers' Qwen2VLImageProcessor, the
 * torchvision backend that AutoProcessor picks) resizes the uint8 image with
 * torchvision's resize(BICUBIC, antialias=True). On a CPU that goes to
 * torch's native uint8 path (_upsample_bicubic2d_aa, the PIL-derived
 * separable convolution): per output pixel a window of input pixels weighted
 * by Keys' cubic (a = -0.5) stretched by the scale when shrinking, the
 * weights normalised to sum 1 in double, then turned into int16 with the
 * largest number of fraction bits that keeps the largest weight below 2^15;
 * a horizontal pass into a uint8 buffer, then a vertical pass, each sum
 * starting at half an output step, shifted down and clamped to 0..255. A
 * pass whose size does not change is skipped. This file computes the same
 * integers, so the resized image is the same bytes. */
#include "media/vision_proc.h"

#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct resample_taps {
    int32_t n_out, max_taps;
    int32_t *first, *count; /* (n_out) window start and length */
    int16_t *w;             /* (n_out, max_taps) */
    unsigned precision;     /* fraction bits of w */
} resample_taps;

static double cubic_aa(double x) {
    const double a = -0.5;
    x = fabs(x);
    if (x < 1.0) return ((a + 2) * x - (a + 3)) * x * x + 1;
    if (x < 2.0) return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a;
    return 0.0;
}

static void taps_free(resample_taps *t) {
    free(t->first);
    free(t->count);
    free(t->w);
    memset(t, 0, sizeof *t);
}

static q35_status taps_make(int32_t n_in, int32_t n_out, resample_taps *t, q35_error *err) {
    memset(t, 0, sizeof *t);
    const double scale = (double)n_in / (double)n_out;
    const double support = scale >= 1.0 ? 2.0 * scale : 2.0; /* interp_size 4, halved */
    const double invscale = scale >= 1.0 ? 1.0 / scale : 1.0;
    const int32_t max_taps = (int32_t)ceil(support) * 2 + 1;
    double *wd = calloc((size_t)n_out * (size_t)max_taps, sizeof *wd);
    t->first = malloc(sizeof(int32_t) * (size_t)n_out);
    t->count = malloc(sizeof(int32_t) * (size_t)n_out);
    t->w = calloc((size_t)n_out * (size_t)max_taps, sizeof *t->w);
    if (!wd || !t->first || !t->count || !t->w) {
        free(wd);
        taps_free(t);
        return q35_fail(err, Q35_ERR_NOMEM, "image resize: no memory for the filter taps");
    }
    t->n_out = n_out;
    t->max_taps = max_taps;
    double w_max = 0.0;
    for (int32_t i = 0; i < n_out; i++) {
        const double center = scale * (i + 0.5);
        int64_t lo = (int64_t)(center - support + 0.5);
        if (lo < 0) lo = 0;
        int64_t hi = (int64_t)(center + support + 0.5);
        if (hi > n_in) hi = n_in;
        int32_t n = (int32_t)(hi - lo);
        if (n > max_taps) n = max_taps;
        double *w = wd + (size_t)i * (size_t)max_taps, total = 0.0;
        for (int32_t j = 0; j < n; j++) {
            w[j] = cubic_aa(((double)(j + lo) - center + 0.5) * invscale);
            total += w[j];
        }
        for (int32_t j = 0; j < n; j++) {
            if (total != 0.0) w[j] /= total;
            if (w[j] > w_max) w_max = w[j];
        }
        t->first[i] = (int32_t)lo;
        t->count[i] = n;
    }
    unsigned p;
    for (p = 0; p < 22; p++) {
        int next = (int)(0.5 + w_max * (double)(1 << (p + 1)));
        if (next >= (1 << 15)) break;
    }
    t->precision = p;
    for (size_t k = 0; k < (size_t)n_out * (size_t)max_taps; k++) {
        double v = wd[k] * (double)(1 << p);
        t->w[k] = (int16_t)(v < 0 ? (int)(-0.5 + v) : (int)(0.5 + v));
    }
    free(wd);
    return Q35_OK;
}

static inline uint8_t clamp_shift(int32_t acc, unsigned p) {
    acc >>= p;
    return (uint8_t)(acc < 0 ? 0 : acc > 255 ? 255 : acc);
}

/* rows of src (w_in wide) -> rows of dst (t->n_out wide) */
static void pass_horizontal(const uint8_t *src, int32_t w_in, int32_t h, const resample_taps *t, uint8_t *dst) {
    const int32_t half = t->precision ? 1 << (t->precision - 1) : 0;
    for (int32_t y = 0; y < h; y++) {
        const uint8_t *row = src + (size_t)y * (size_t)w_in * 3;
        uint8_t *out = dst + (size_t)y * (size_t)t->n_out * 3;
        for (int32_t x = 0; x < t->n_out; x++) {
            const int16_t *w = t->w + (size_t)x * (size_t)t->max_taps;
            const uint8_t *px = row + (size_t)t->first[x] * 3;
            int32_t r = half, g = half, b = half;
            for (int32_t j = 0; j < t->count[x]; j++) {
                r += px[3 * j] * w[j], g += px[3 * j + 1] * w[j], b += px[3 * j + 2] * w[j];
            }
            out[3 * x] = clamp_shift(r, t->precision);
            out[3 * x + 1] = clamp_shift(g, t->precision);
            out[3 * x + 2] = clamp_shift(b, t->precision);
        }
    }
}

/* columns: src (w wide, h_in tall) -> dst (w wide, t->n_out tall) */
static void pass_vertical(const uint8_t *src, int32_t w, const resample_taps *t, uint8_t *dst) {
    const int32_t half = t->precision ? 1 << (t->precision - 1) : 0;
    const size_t stride = (size_t)w * 3;
    for (int32_t y = 0; y < t->n_out; y++) {
        const int16_t *wt = t->w + (size_t)y * (size_t)t->max_taps;
        uint8_t *out = dst + (size_t)y * stride;
        for (size_t c = 0; c < stride; c++) {
            int32_t acc = half;
            const uint8_t *px = src + (size_t)t->first[y] * stride + c;
            for (int32_t j = 0; j < t->count[y]; j++) acc += px[(size_t)j * stride] * wt[j];
            out[c] = clamp_shift(acc, t->precision);
        }
    }
}

q35_status q35_image_resize_bicubic(const q35_image *in, int32_t out_w, int32_t out_h, q35_image *out,
                                    q35_error *err) {
    memset(out, 0, sizeof *out);
    if (out_w <= 0 || out_h <= 0 || in->width <= 0 || in->height <= 0)
        return q35_fail(err, Q35_ERR_ARG, "image resize: empty size");
    const size_t n_out = (size_t)out_w * (size_t)out_h * 3;
    out->rgb = malloc(n_out);
    if (!out->rgb) return q35_fail(err, Q35_ERR_NOMEM, "image resize: no memory for %dx%d", out_w, out_h);
    out->width = out_w;
    out->height = out_h;
    const int need_h = out_w != in->width, need_v = out_h != in->height;
    if (!need_h && !need_v) {
        memcpy(out->rgb, in->rgb, n_out);
        return Q35_OK;
    }
    resample_taps th = {0}, tv = {0};
    uint8_t *mid = NULL;
    q35_status st = Q35_OK;
    if (need_h && (st = taps_make(in->width, out_w, &th, err)) != Q35_OK) goto done;
    if (need_v && (st = taps_make(in->height, out_h, &tv, err)) != Q35_OK) goto done;
    if (need_h && need_v) {
        mid = malloc((size_t)out_w * (size_t)in->height * 3);
        if (!mid) {
            st = q35_fail(err, Q35_ERR_NOMEM, "image resize: no memory");
            goto done;
        }
        pass_horizontal(in->rgb, in->width, in->height, &th, mid);
        pass_vertical(mid, out_w, &tv, out->rgb);
    } else if (need_h) {
        pass_horizontal(in->rgb, in->width, in->height, &th, out->rgb);
    } else {
        pass_vertical(in->rgb, in->width, &tv, out->rgb);
    }
done:
    free(mid);
    taps_free(&th);
    taps_free(&tv);
    if (st != Q35_OK) q35_image_free(out);
    return st;
}
