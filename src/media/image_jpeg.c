/* image_jpeg.c: JPEG into RGB8 with libjpeg-turbo, as the processor's
 * decoder (torchvision's decode_image in RGB mode, libjpeg-turbo too) does.
 *
 * libjpeg's defaults (the accurate integer IDCT, fancy chroma upsampling),
 * RGB out of YCbCr or RGB files, grey replicated; the same settings give the
 * same bytes. CMYK and YCCK files are refused. The header is read first and
 * its size checked against the limits before libjpeg is let to allocate
 * anything for the pixels. A premature end of data, which libjpeg only warns
 * about (padding the rest with grey), is an error here. The EXIF orientation comes from the first
 * APP1 segment that starts "Exif\0\0". libjpeg reports fatal errors through
 * error_exit, which longjmps back here. */
#include "media/image.h"

#include "base/util.h"

#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
/* after stdio.h: jpeglib.h uses FILE */
#include <jerror.h>
#include <jpeglib.h>

typedef struct jpeg_guard {
    struct jpeg_error_mgr mgr;
    jmp_buf jump;
    char msg[JMSG_LENGTH_MAX];
} jpeg_guard;

static void on_error(j_common_ptr c) {
    jpeg_guard *g = (jpeg_guard *)c->err;
    (*c->err->format_message)(c, g->msg);
    longjmp(g->jump, 1);
}

static void on_message(j_common_ptr c, int level) {
    /* level -1 is a warning: only running out of data is fatal */
    if (level == -1 && c->err->msg_code == JWRN_JPEG_EOF) on_error(c);
}

q35_status q35_decode_jpeg(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                           q35_error *err) {
    struct jpeg_decompress_struct cinfo;
    jpeg_guard guard;
    /* volatile: read after a longjmp */
    uint8_t *volatile row = NULL;
    volatile q35_status st = Q35_OK;
    memset(&cinfo, 0, sizeof cinfo);
    memset(&guard, 0, sizeof guard);
    cinfo.err = jpeg_std_error(&guard.mgr);
    guard.mgr.error_exit = on_error;
    guard.mgr.emit_message = on_message;
    if (setjmp(guard.jump)) {
        free(row);
        q35_image_free(out);
        jpeg_destroy_decompress(&cinfo);
        if (st == Q35_OK) st = q35_fail(err, Q35_ERR_FORMAT, "JPEG image: %s", guard.msg);
        return st;
    }
    jpeg_create_decompress(&cinfo);
    jpeg_mem_src(&cinfo, data, (unsigned long)len);
    jpeg_save_markers(&cinfo, JPEG_APP0 + 1, 0xFFFF);
    jpeg_read_header(&cinfo, TRUE);

    *orientation = 1;
    for (jpeg_saved_marker_ptr m = cinfo.marker_list; m; m = m->next) {
        if (m->marker == JPEG_APP0 + 1 && m->data_length >= 6 && !memcmp(m->data, "Exif\0\0", 6)) {
            *orientation = q35_exif_orientation(m->data, m->data_length);
            break;
        }
    }
    int grey = cinfo.jpeg_color_space == JCS_GRAYSCALE;
    if (!grey && cinfo.jpeg_color_space != JCS_YCbCr && cinfo.jpeg_color_space != JCS_RGB) {
        jpeg_destroy_decompress(&cinfo);
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "JPEG image: colour space %d (CMYK or YCCK) is not supported",
                        (int)cinfo.jpeg_color_space);
    }
    cinfo.out_color_space = grey ? JCS_GRAYSCALE : JCS_RGB;
    q35_status ast = q35_image_alloc(out, cinfo.image_width, cinfo.image_height, max_pixels, "JPEG", err);
    if (ast != Q35_OK) {
        jpeg_destroy_decompress(&cinfo);
        return ast;
    }
    jpeg_start_decompress(&cinfo);
    if ((int)cinfo.output_width != out->width || (int)cinfo.output_height != out->height) {
        st = q35_fail(err, Q35_ERR_FORMAT, "JPEG image: output size differs from the header");
        longjmp(guard.jump, 1);
    }
    const int w = out->width;
    if (grey) {
        row = malloc((size_t)w);
        if (!row) {
            st = q35_fail(err, Q35_ERR_NOMEM, "JPEG image: no memory");
            longjmp(guard.jump, 1);
        }
    }
    while (cinfo.output_scanline < cinfo.output_height) {
        uint8_t *dst = out->rgb + (size_t)cinfo.output_scanline * (size_t)w * 3;
        JSAMPROW rows[1] = {grey ? row : dst};
        jpeg_read_scanlines(&cinfo, rows, 1);
        if (grey)
            for (int x = 0; x < w; x++) dst[3 * x] = dst[3 * x + 1] = dst[3 * x + 2] = row[x];
    }
    jpeg_finish_decompress(&cinfo);
    jpeg_destroy_decompress(&cinfo);
    free(row);
    return Q35_OK;
}
