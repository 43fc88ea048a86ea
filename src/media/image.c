/* image.c: the format sniffer and dispatch of q35_image_decode, the one
 * allocation of pixel memory (after the limits), the EXIF orientation reader
 * and the eight orientations as Pillow's ImageOps.exif_transpose applies
 * them.
 *
 * The EXIF reader is a bounded walk of the TIFF structure's first IFD only
 * (where the orientation tag lives): a byte-order mark, IFD0's offset, its
 * entry count, and 12-byte entries; every offset is checked against the blob
 * before it is read. */
#include "media/image.h"

#include "base/util.h"

#include <stdlib.h>
#include <string.h>

q35_image_format q35_image_sniff(const uint8_t *d, size_t n) {
    if (n >= 3 && d[0] == 0xFF && d[1] == 0xD8 && d[2] == 0xFF) return Q35_IMAGE_JPEG;
    if (n >= 8 && !memcmp(d, "\x89PNG\r\n\x1a\n", 8)) return Q35_IMAGE_PNG;
    if (n >= 12 && !memcmp(d, "RIFF", 4) && !memcmp(d + 8, "WEBP", 4)) return Q35_IMAGE_WEBP;
    if (n >= 6 && (!memcmp(d, "GIF87a", 6) || !memcmp(d, "GIF89a", 6))) return Q35_IMAGE_GIF;
    return Q35_IMAGE_UNKNOWN;
}

const char *q35_image_format_name(q35_image_format f) {
    switch (f) {
    case Q35_IMAGE_JPEG: return "JPEG";
    case Q35_IMAGE_PNG: return "PNG";
    case Q35_IMAGE_WEBP: return "WebP";
    case Q35_IMAGE_GIF: return "GIF";
    default: return "unknown";
    }
}

void q35_image_free(q35_image *img) {
    if (!img) return;
    free(img->rgb);
    memset(img, 0, sizeof *img);
}

q35_status q35_image_alloc(q35_image *img, int64_t width, int64_t height, int64_t max_pixels, const char *fmt,
                           q35_error *err) {
    if (max_pixels <= 0) max_pixels = Q35_IMAGE_DEFAULT_MAX_PIXELS;
    if (width <= 0 || height <= 0)
        return q35_fail(err, Q35_ERR_FORMAT, "%s image: empty size %lldx%lld", fmt, (long long)width,
                        (long long)height);
    if (width > Q35_IMAGE_MAX_SIDE || height > Q35_IMAGE_MAX_SIDE || width * height > max_pixels)
        return q35_fail(err, Q35_ERR_ARG, "%s image: %lldx%lld pixels is over the limit of %lld pixels", fmt,
                        (long long)width, (long long)height, (long long)max_pixels);
    img->rgb = malloc((size_t)width * (size_t)height * 3);
    if (!img->rgb) return q35_fail(err, Q35_ERR_NOMEM, "%s image: no memory for %lldx%lld", fmt,
                                   (long long)width, (long long)height);
    img->width = (int32_t)width;
    img->height = (int32_t)height;
    return Q35_OK;
}

static uint32_t rd16(const uint8_t *p, int be) { return be ? (uint32_t)p[0] << 8 | p[1] : (uint32_t)p[1] << 8 | p[0]; }
static uint32_t rd32(const uint8_t *p, int be) {
    return be ? (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]
              : (uint32_t)p[3] << 24 | (uint32_t)p[2] << 16 | (uint32_t)p[1] << 8 | p[0];
}

int q35_exif_orientation(const uint8_t *d, size_t n) {
    if (!d) return 1;
    if (n >= 6 && !memcmp(d, "Exif\0\0", 6)) d += 6, n -= 6;
    if (n < 8) return 1;
    int be;
    if (!memcmp(d, "II*\0", 4)) be = 0;
    else if (!memcmp(d, "MM\0*", 4)) be = 1;
    else return 1;
    uint32_t ifd = rd32(d + 4, be);
    if (ifd > n || n - ifd < 2) return 1;
    uint32_t count = rd16(d + ifd, be);
    for (uint32_t i = 0; i < count; i++) {
        size_t at = (size_t)ifd + 2 + (size_t)i * 12;
        if (at + 12 > n) return 1;
        const uint8_t *e = d + at;
        if (rd16(e, be) != 0x0112) continue;
        uint32_t type = rd16(e + 2, be), cnt = rd32(e + 4, be);
        uint32_t v;
        if (type == 3 && cnt >= 1) v = rd16(e + 8, be);      /* SHORT, stored inline */
        else if (type == 4 && cnt == 1) v = rd32(e + 8, be); /* LONG, stored inline */
        else return 1;
        return v >= 1 && v <= 8 ? (int)v : 1;
    }
    return 1;
}

q35_status q35_image_orient(q35_image *img, int o, q35_error *err) {
    if (o < 2 || o > 8) return Q35_OK;
    const int64_t W = img->width, H = img->height;
    const int swap = o >= 5; /* TRANSPOSE, ROTATE_270, TRANSVERSE, ROTATE_90 swap the sides */
    const int64_t ow = swap ? H : W, oh = swap ? W : H;
    uint8_t *dst = malloc((size_t)(W * H * 3));
    if (!dst) return q35_fail(err, Q35_ERR_NOMEM, "image orientation: no memory");
    for (int64_t y = 0; y < oh; y++) {
        for (int64_t x = 0; x < ow; x++) {
            int64_t sx, sy;
            switch (o) {
            case 2: sx = W - 1 - x; sy = y; break;          /* FLIP_LEFT_RIGHT */
            case 3: sx = W - 1 - x; sy = H - 1 - y; break;  /* ROTATE_180 */
            case 4: sx = x; sy = H - 1 - y; break;          /* FLIP_TOP_BOTTOM */
            case 5: sx = y; sy = x; break;                  /* TRANSPOSE */
            case 6: sx = y; sy = H - 1 - x; break;          /* ROTATE_270 (clockwise) */
            case 7: sx = W - 1 - y; sy = H - 1 - x; break;  /* TRANSVERSE */
            default: sx = W - 1 - y; sy = x; break;         /* 8: ROTATE_90 (counter-clockwise) */
            }
            memcpy(dst + (y * ow + x) * 3, img->rgb + (sy * W + sx) * 3, 3);
        }
    }
    free(img->rgb);
    img->rgb = dst;
    img->width = (int32_t)ow;
    img->height = (int32_t)oh;
    return Q35_OK;
}

q35_status q35_image_decode(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, q35_error *err) {
    memset(out, 0, sizeof *out);
    if (!data || len == 0) return q35_fail(err, Q35_ERR_FORMAT, "image: no bytes");
    int orientation = 1;
    q35_status st;
    switch (q35_image_sniff(data, len)) {
    case Q35_IMAGE_JPEG: st = q35_decode_jpeg(data, len, max_pixels, out, &orientation, err); break;
    case Q35_IMAGE_PNG: st = q35_decode_png(data, len, max_pixels, out, &orientation, err); break;
    case Q35_IMAGE_WEBP: st = q35_decode_webp(data, len, max_pixels, out, &orientation, err); break;
    case Q35_IMAGE_GIF: st = q35_decode_gif(data, len, max_pixels, out, &orientation, err); break;
    default:
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "image: unsupported format (not JPEG, PNG, WebP or GIF)");
    }
    if (st == Q35_OK) st = q35_image_orient(out, orientation, err);
    if (st != Q35_OK) q35_image_free(out);
    return st;
}
