/* image_webp.c: WebP (lossy, lossless, with or without alpha) into RGB8
 * with libwebp.
 *
 * The processor's decoder (torchvision's decode_image in RGB mode) asks
 * libwebp for RGB with its defaults (fancy chroma upsampling), which drops
 * the alpha channel; the same call here gives the same bytes. The size
 * comes from WebPGetFeatures and is checked against the limits before
 * decoding. Animated files are refused, as there. An EXIF chunk is ignored:
 * torchvision applies the EXIF orientation to JPEG and PNG only, so a WebP
 * is used as stored. */
#include "media/image.h"

#include "base/util.h"

#include <string.h>
#include <webp/decode.h>

q35_status q35_decode_webp(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                           q35_error *err) {
    WebPBitstreamFeatures f;
    VP8StatusCode vs = WebPGetFeatures(data, len, &f);
    if (vs == VP8_STATUS_NOT_ENOUGH_DATA) return q35_fail(err, Q35_ERR_FORMAT, "WebP image: truncated file");
    if (vs != VP8_STATUS_OK) return q35_fail(err, Q35_ERR_FORMAT, "WebP image: bad header (libwebp status %d)", (int)vs);
    if (f.has_animation) return q35_fail(err, Q35_ERR_UNSUPPORTED, "WebP image: animated WebP is not supported");
    q35_status st = q35_image_alloc(out, f.width, f.height, max_pixels, "WebP", err);
    if (st != Q35_OK) return st;
    const size_t stride = (size_t)out->width * 3, size = stride * (size_t)out->height;
    if (!WebPDecodeRGBInto(data, len, out->rgb, size, (int)stride)) {
        q35_image_free(out);
        return q35_fail(err, Q35_ERR_FORMAT, "WebP image: corrupt or truncated data");
    }
    *orientation = 1;
    return Q35_OK;
}
