/* image.h: images from untrusted bytes into 8-bit RGB.
 *
 * q35_image_decode sniffs the format from the first bytes (JPEG, PNG, WebP,
 * GIF), decodes it with the Debian library for that format (libjpeg-turbo,
 * libpng, libwebp, giflib) and gives one 8-bit RGB raster, rows top to bottom,
 * pixels R G B. It gives the bytes Qwen3.5's image processor starts from
 * when it is handed an image as a path, URL or base64 string (as a chat
 * request hands it): transformers' load_image_as_tensor, which is
 * torchvision's decode_image in RGB mode with apply_exif_orientation:
 *   - EXIF orientation (tag 0x0112) is applied for JPEG (first APP1 "Exif")
 *     and PNG (eXIf), then forgotten; a WebP's EXIF chunk is ignored;
 *   - alpha is dropped, not composited: the colour stored under a
 *     transparent pixel is what the model sees; a PNG tRNS is ignored;
 *   - grey is replicated, palettes looked up;
 *   - 16-bit PNG samples keep their high byte (torchvision would give
 *     uint16 values, which the processor does not scale: no golden there).
 *   - a GIF is its single frame on the background colour (image_gif.c).
 * Animated GIF and WebP, CMYK and YCCK JPEG are refused as unsupported.
 *
 * Every size is checked against limits before any pixel memory is taken, so
 * a small file that declares a huge image (a decompression bomb) costs
 * nothing. Errors are Q35_ERR_FORMAT (corrupt or truncated bytes),
 * Q35_ERR_UNSUPPORTED (a valid file this decoder does not take) or
 * Q35_ERR_ARG (over a limit), with a message naming the format. */
#ifndef Q35_MEDIA_IMAGE_H
#define Q35_MEDIA_IMAGE_H

#include "qwen35.h"

#include <stddef.h>
#include <stdint.h>

typedef enum q35_image_format {
    Q35_IMAGE_UNKNOWN = 0,
    Q35_IMAGE_JPEG,
    Q35_IMAGE_PNG,
    Q35_IMAGE_WEBP,
    Q35_IMAGE_GIF,
} q35_image_format;

typedef struct q35_image {
    int32_t width, height;
    uint8_t *rgb; /* (height, width, 3), owned; free with q35_image_free */
} q35_image;

/* Default pixel limit: Pillow's own decompression-bomb error threshold,
 * 2 * Image.MAX_IMAGE_PIXELS = 2 * 89478485 pixels. */
#define Q35_IMAGE_DEFAULT_MAX_PIXELS 178956970LL
#define Q35_IMAGE_MAX_SIDE 65535 /* as JPEG and WebP allow at most */

/* The format the bytes start like (Q35_IMAGE_UNKNOWN for none). */
q35_image_format q35_image_sniff(const uint8_t *data, size_t len);
const char *q35_image_format_name(q35_image_format f);

/* Decodes `data` into `out` (zeroed first). max_pixels <= 0 means the
 * default. On error out is left empty. */
q35_status q35_image_decode(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, q35_error *err);
void q35_image_free(q35_image *img);

/* EXIF: the orientation tag (0x0112) of a TIFF-structured EXIF blob (an
 * optional "Exif\0\0" prefix is skipped); 1 when there is none or it is not
 * 1..8. Never reads outside [data, data + len). */
int q35_exif_orientation(const uint8_t *data, size_t len);
/* Applies an EXIF orientation (2..8) as Pillow's exif_transpose does,
 * replacing img's pixels; 1 or anything else leaves it as it is. */
q35_status q35_image_orient(q35_image *img, int orientation, q35_error *err);

/* Per-format decoders (image_jpeg.c, image_png.c, image_webp.c,
 * image_gif.c): RGB8 before orientation, and the orientation the file's
 * EXIF gives (1 without one). */
q35_status q35_decode_jpeg(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                           q35_error *err);
q35_status q35_decode_png(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                          q35_error *err);
q35_status q35_decode_webp(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                           q35_error *err);
q35_status q35_decode_gif(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                          q35_error *err);

/* Checks a declared size against the limits and allocates the RGB raster:
 * the one place the decoders take pixel memory. */
q35_status q35_image_alloc(q35_image *img, int64_t width, int64_t height, int64_t max_pixels, const char *fmt,
                           q35_error *err);

#endif
