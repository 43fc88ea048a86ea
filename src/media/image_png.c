/* image_png.c: PNG into RGB8 with libpng, as the processor's decoder
 * (torchvision's decode_image in RGB mode, also libpng) reads it.
 *
 * Per colour type:
 *   palette      the palette colours; a tRNS chunk is ignored
 *   grey         1/2/4 bits scaled to 0..255, then replicated
 *   16-bit       the high byte of each sample (libpng's strip_16; the
 *                processor itself has no 8-bit reading of these: torchvision
 *                gives uint16 values that it then treats as 8-bit ones)
 *   alpha        dropped (strip_alpha), without compositing
 * No gamma or colour-profile correction is applied, as none is there.
 * The size is checked against the limits after the header and before any
 * pixel memory; libpng's own user limits are set to the same. The EXIF
 * orientation comes from an eXIf chunk before the image data; one after
 * it is ignored, as torchvision ignores it. The chunks after the image
 * data are still read (and their CRCs checked), so a file cut short after
 * its pixels is refused.
 * libpng reports errors through a longjmp back here. */
#include "media/image.h"

#include "base/util.h"

#include <png.h>
#include <stdlib.h>
#include <string.h>

typedef struct png_reader {
    const uint8_t *data;
    size_t len, at;
} png_reader;

typedef struct png_guard {
    char msg[256];
} png_guard;

static void on_read(png_structp png, png_bytep out, size_t n) {
    png_reader *r = png_get_io_ptr(png);
    if (n > r->len - r->at) png_error(png, "truncated file");
    memcpy(out, r->data + r->at, n);
    r->at += n;
}

static void on_error(png_structp png, png_const_charp msg) {
    png_guard *g = png_get_error_ptr(png);
    snprintf(g->msg, sizeof g->msg, "%s", msg);
    png_longjmp(png, 1);
}

static void on_warning(png_structp png, png_const_charp msg) { (void)png, (void)msg; }

static int exif_of(png_structp png, png_infop info) {
    png_uint_32 n = 0;
    png_bytep exif = NULL;
    if (info && png_get_eXIf_1(png, info, &n, &exif) && exif) return q35_exif_orientation(exif, n);
    return 0;
}

q35_status q35_decode_png(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                          q35_error *err) {
    png_guard guard = {{0}};
    png_reader reader = {data, len, 0};
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &guard, on_error, on_warning);
    if (!png) return q35_fail(err, Q35_ERR_NOMEM, "PNG image: no memory");
    png_infop info = png_create_info_struct(png), end_info = png_create_info_struct(png);
    uint8_t *volatile rows = NULL;
    png_bytep *volatile row_ptrs = NULL;
    volatile q35_status st = Q35_OK;
    if (!info || !end_info) {
        png_destroy_read_struct(&png, info ? &info : NULL, end_info ? &end_info : NULL);
        return q35_fail(err, Q35_ERR_NOMEM, "PNG image: no memory");
    }
    if (setjmp(png_jmpbuf(png))) {
        free(rows);
        free(row_ptrs);
        q35_image_free(out);
        png_destroy_read_struct(&png, &info, &end_info);
        if (st == Q35_OK) st = q35_fail(err, Q35_ERR_FORMAT, "PNG image: %s", guard.msg);
        return st;
    }
    png_set_user_limits(png, Q35_IMAGE_MAX_SIDE, Q35_IMAGE_MAX_SIDE);
    png_set_chunk_malloc_max(png, 64u << 20);
    png_set_read_fn(png, &reader, on_read);
    png_read_info(png, info);

    png_uint_32 w, h;
    int depth, ctype, interlace;
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, &interlace, NULL, NULL);
    int o = exif_of(png, info);
    st = q35_image_alloc(out, w, h, max_pixels, "PNG", err);
    if (st != Q35_OK) longjmp(png_jmpbuf(png), 1);

    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_strip_16(png);
    int passes = png_set_interlace_handling(png);
    (void)passes;
    png_read_update_info(png, info);
    const int channels = png_get_channels(png, info);
    const size_t rowbytes = png_get_rowbytes(png, info);
    if (channels < 1 || channels > 4 || rowbytes < (size_t)w * (size_t)channels) {
        st = q35_fail(err, Q35_ERR_FORMAT, "PNG image: unexpected row layout");
        longjmp(png_jmpbuf(png), 1);
    }
    /* The whole image at once: interlaced files need it, and it is at most
     * 8 bytes a pixel within the pixel limit. */
    rows = malloc(rowbytes * h);
    row_ptrs = malloc(sizeof(png_bytep) * h);
    if (!rows || !row_ptrs) {
        st = q35_fail(err, Q35_ERR_NOMEM, "PNG image: no memory for %ux%u", (unsigned)w, (unsigned)h);
        longjmp(png_jmpbuf(png), 1);
    }
    for (png_uint_32 y = 0; y < h; y++) row_ptrs[y] = rows + rowbytes * y;
    png_read_image(png, row_ptrs);
    png_read_end(png, end_info);
    *orientation = o ? o : 1;

    for (png_uint_32 y = 0; y < h; y++) {
        const uint8_t *src = row_ptrs[y];
        uint8_t *dst = out->rgb + (size_t)y * w * 3;
        for (png_uint_32 x = 0; x < w; x++) {
            uint8_t r, g, b;
            if (channels <= 2) {
                r = g = b = src[x * (size_t)channels];
            } else {
                r = src[x * (size_t)channels], g = src[x * (size_t)channels + 1], b = src[x * (size_t)channels + 2];
            }
            dst[3 * x] = r, dst[3 * x + 1] = g, dst[3 * x + 2] = b;
        }
    }
    free(rows);
    free(row_ptrs);
    png_destroy_read_struct(&png, &info, &end_info);
    return Q35_OK;
}
