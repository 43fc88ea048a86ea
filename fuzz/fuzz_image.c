/* fuzz_image.c: arbitrary bytes through the image decoders (JPEG, PNG,
 * WebP, the EXIF orientation reader) and, for what decodes, Qwen3.5's image
 * processor at a small size. Any input must give an image within the pixel
 * limit or an error; never a crash, a leak or an out-of-bounds access.
 * Seeds: fuzz/corpus/image. */
#include "media/image.h"
#include "media/vision_proc.h"

#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* copy so that ASan sees exactly `size` bytes */
    uint8_t *buf = malloc(size ? size : 1);
    memcpy(buf, data, size);
    q35_error err;
    q35_image img;
    const int64_t limit = 1 << 20;
    (void)q35_exif_orientation(buf, size);
    if (q35_image_decode(buf, size, limit, &img, &err) == Q35_OK) {
        if (img.width <= 0 || img.height <= 0 || (int64_t)img.width * img.height > limit) abort();
        q35_vision_proc p;
        q35_vision_proc_defaults(&p);
        p.patch_size = 4;
        p.min_pixels = 64;
        p.max_pixels = 32 * 32;
        q35_vision_input in;
        if (q35_vision_preprocess(&p, &img, &in, &err) == Q35_OK) q35_vision_input_free(&in);
        q35_image_free(&img);
    } else if (img.rgb) {
        abort();
    }
    free(buf);
    return 0;
}
