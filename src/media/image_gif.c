/* image_gif.c: a single-frame GIF into RGB8 with giflib, as the processor's
 * decoder (torchvision's decode_gif, also giflib) composes its first frame.
 *
 * The canvas is the logical screen, filled with the background colour
 * (global colour table[background index]; black without a global table).
 * The frame's pixels are looked up in its local table, or the global one;
 * a pixel with the transparent index of the frame's graphic control
 * extension keeps the background. An interlaced frame is read in its four
 * passes. A second frame makes the file animated, which is refused:
 * torchvision gives every frame, and the processor then takes them for
 * separate images, which is not what a still image means. The screen and
 * the frame are checked against the pixel limit before anything is decoded;
 * the records are read one at a time (never giflib's DGifSlurp, which
 * allocates every frame a file declares). */
#include "media/image.h"

#include "base/util.h"

#include <gif_lib.h>
#include <stdlib.h>
#include <string.h>

typedef struct gif_reader {
    const uint8_t *data;
    size_t len, at;
} gif_reader;

static int on_read(GifFileType *g, GifByteType *out, int n) {
    gif_reader *r = g->UserData;
    size_t k = n < 0 ? 0 : (size_t)n;
    if (k > r->len - r->at) k = r->len - r->at;
    memcpy(out, r->data + r->at, k);
    r->at += k;
    return (int)k;
}

static q35_status gif_error(int code, const char *what, q35_error *err) {
    const char *m = GifErrorString(code);
    return q35_fail(err, Q35_ERR_FORMAT, "GIF image: %s (%s)", what, m ? m : "corrupt or truncated data");
}

/* The first frame's pixels onto the canvas (already the background). */
static q35_status read_frame(GifFileType *g, int transparent, int64_t max_pixels, q35_image *out, q35_error *err) {
    const GifImageDesc *d = &g->Image;
    const ColorMapObject *cmap = d->ColorMap ? d->ColorMap : g->SColorMap;
    if (!cmap) return q35_fail(err, Q35_ERR_FORMAT, "GIF image: a frame without a colour table");
    if (max_pixels <= 0) max_pixels = Q35_IMAGE_DEFAULT_MAX_PIXELS;
    if (d->Width <= 0 || d->Height <= 0) return q35_fail(err, Q35_ERR_FORMAT, "GIF image: empty frame");
    if ((int64_t)d->Width * d->Height > max_pixels) /* decoding time grows with it, even off the screen */
        return q35_fail(err, Q35_ERR_ARG, "GIF image: frame %dx%d is over the limit of %lld pixels", d->Width,
                        d->Height, (long long)max_pixels);
    GifPixelType *line = malloc((size_t)d->Width);
    if (!line) return q35_fail(err, Q35_ERR_NOMEM, "GIF image: no memory");
    static const int start[4] = {0, 4, 2, 1}, step[4] = {8, 8, 4, 2};
    const int passes = d->Interlace ? 4 : 1;
    for (int p = 0; p < passes; p++) {
        for (int y = d->Interlace ? start[p] : 0; y < d->Height; y += d->Interlace ? step[p] : 1) {
            if (DGifGetLine(g, line, d->Width) == GIF_ERROR) {
                free(line);
                return gif_error(g->Error, "bad image data", err);
            }
            const int64_t cy = (int64_t)d->Top + y;
            if (cy < 0 || cy >= out->height) continue;
            for (int x = 0; x < d->Width; x++) {
                const int64_t cx = (int64_t)d->Left + x;
                if (cx < 0 || cx >= out->width || line[x] == transparent || line[x] >= cmap->ColorCount) continue;
                uint8_t *px = out->rgb + (cy * out->width + cx) * 3;
                const GifColorType *c = &cmap->Colors[line[x]];
                px[0] = c->Red, px[1] = c->Green, px[2] = c->Blue;
            }
        }
    }
    free(line);
    return Q35_OK;
}

q35_status q35_decode_gif(const uint8_t *data, size_t len, int64_t max_pixels, q35_image *out, int *orientation,
                          q35_error *err) {
    *orientation = 1; /* GIF carries no EXIF */
    gif_reader reader = {data, len, 0};
    int code = 0;
    GifFileType *g = DGifOpen(&reader, on_read, &code);
    if (!g) return gif_error(code, "bad header", err);
    q35_status st = q35_image_alloc(out, g->SWidth, g->SHeight, max_pixels, "GIF", err);
    if (st != Q35_OK) goto done;
    GifColorType bg = {0, 0, 0};
    if (g->SColorMap && g->SBackGroundColor >= 0 && g->SBackGroundColor < g->SColorMap->ColorCount)
        bg = g->SColorMap->Colors[g->SBackGroundColor];
    for (int64_t i = 0; i < (int64_t)out->width * out->height; i++)
        out->rgb[3 * i] = bg.Red, out->rgb[3 * i + 1] = bg.Green, out->rgb[3 * i + 2] = bg.Blue;
    int transparent = NO_TRANSPARENT_COLOR, frames = 0;
    for (;;) {
        GifRecordType rt;
        if (DGifGetRecordType(g, &rt) == GIF_ERROR) {
            st = gif_error(g->Error, "truncated or corrupt file", err);
            break;
        }
        if (rt == TERMINATE_RECORD_TYPE) break;
        if (rt == EXTENSION_RECORD_TYPE) {
            int ext_code;
            GifByteType *ext;
            if (DGifGetExtension(g, &ext_code, &ext) == GIF_ERROR) {
                st = gif_error(g->Error, "bad extension", err);
                break;
            }
            if (ext_code == GRAPHICS_EXT_FUNC_CODE && ext && !frames) {
                GraphicsControlBlock gcb;
                if (ext[0] >= 4 && DGifExtensionToGCB(ext[0], ext + 1, &gcb) == GIF_OK)
                    transparent = gcb.TransparentColor;
            }
            while (ext && st == Q35_OK)
                if (DGifGetExtensionNext(g, &ext) == GIF_ERROR) st = gif_error(g->Error, "bad extension", err);
            if (st != Q35_OK) break;
            continue;
        }
        if (rt != IMAGE_DESC_RECORD_TYPE) continue;
        if (frames) {
            st = q35_fail(err, Q35_ERR_UNSUPPORTED, "GIF image: animated GIF (more than one frame) is not supported");
            break;
        }
        if (DGifGetImageDesc(g) == GIF_ERROR) {
            st = gif_error(g->Error, "bad frame header", err);
            break;
        }
        if ((st = read_frame(g, transparent, max_pixels, out, err)) != Q35_OK) break;
        frames++;
    }
    if (st == Q35_OK && !frames) st = q35_fail(err, Q35_ERR_FORMAT, "GIF image: no frame");
done:
    DGifCloseFile(g, &code);
    if (st != Q35_OK) q35_image_free(out);
    return st;
}
