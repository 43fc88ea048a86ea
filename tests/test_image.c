/* tests/test_image.c: image decoding and Qwen3.5's image processor against
 * transformers (tests/data/images, made by scripts/make_image_goldens.py).
 *
 * Decoding is compared byte for byte with what the processor decodes
 * (torchvision's decode_image, RGB, EXIF orientation applied): the same
 * codecs with the same settings give the same bytes. The resized image is
 * compared byte for byte too, and pixel_values through their SHA-256: the
 * resampler computes torch's integer arithmetic exactly, and the
 * normalisation the same float32 operations, so the tolerance is zero; a
 * uint8 step would move a value by 1/127.5. Bad input must give a clear
 * error, never a crash. */
#include "test.h"

#include "media/image.h"
#include "media/vision_proc.h"

#include "base/util.h"

#include <jansson.h>
#include <openssl/sha.h>

static json_t *load_golden(void) {
    json_error_t jerr;
    json_t *g = json_load_file(q35_test_path("images/golden.json"), 0, &jerr);
    if (!g) q35_test_fail(__FILE__, __LINE__, "images/golden.json: %s", jerr.text);
    return g;
}

static int decode_file(const char *rel, q35_image *img, q35_error *err) {
    char *data = NULL;
    size_t n = 0;
    if (q35_read_file(q35_test_path(rel), &data, &n, err) != Q35_OK) return -1;
    q35_status st = q35_image_decode((const uint8_t *)data, n, 0, img, err);
    free(data);
    return st == Q35_OK ? 0 : -1;
}

static void hex_sha256(const void *p, size_t n, char out[65]) {
    unsigned char d[SHA256_DIGEST_LENGTH];
    SHA256(p, n, d);
    for (int i = 0; i < SHA256_DIGEST_LENGTH; i++) sprintf(out + 2 * i, "%02x", d[i]);
}

static void proc_for(json_t *overrides, q35_vision_proc *p) {
    q35_vision_proc_defaults(p);
    char *text = json_dumps(overrides, 0);
    q35_error err;
    if (q35_vision_proc_parse(text, strlen(text), "overrides", p, &err) != Q35_OK)
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
    free(text);
}

/* pixel_values back to the resized uint8 image (the inverse of the layout) */
static void unpatchify(const q35_vision_proc *p, const q35_vision_input *in, uint8_t *rgb) {
    const int ps = p->patch_size, m = p->merge_size, tp = p->temporal_patch_size;
    const int W = in->grid_w * ps;
    int64_t r = 0;
    for (int bh = 0; bh < in->grid_h / m; bh++)
        for (int bw = 0; bw < in->grid_w / m; bw++)
            for (int mh = 0; mh < m; mh++)
                for (int mw = 0; mw < m; mw++, r++)
                    for (int c = 0; c < 3; c++)
                        for (int py = 0; py < ps; py++)
                            for (int px = 0; px < ps; px++) {
                                float v = in->pixel_values[r * in->patch_dim + (int64_t)c * tp * ps * ps + py * ps + px];
                                int y = (bh * m + mh) * ps + py, x = (bw * m + mw) * ps + px;
                                rgb[((size_t)y * W + x) * 3 + c] = (uint8_t)lrintf(v * 127.5f + 127.5f);
                            }
}

static int count_diff(const uint8_t *a, const uint8_t *b, size_t n, int *max_diff) {
    int n_diff = 0;
    *max_diff = 0;
    for (size_t k = 0; k < n; k++) {
        int d = abs(a[k] - b[k]);
        n_diff += d != 0;
        if (d > *max_diff) *max_diff = d;
    }
    return n_diff;
}

/* Decodes every image of golden.json and hands it to fn with its entry;
 * returns how many fn says it checked. */
typedef int (*image_case_fn)(json_t *entry, const char *file, const q35_image *img);

static int each_golden_image(image_case_fn fn) {
    json_t *g = load_golden();
    if (!g) return 0;
    size_t i;
    json_t *e;
    int n_checked = 0;
    json_array_foreach(json_object_get(g, "images"), i, e) {
        const char *file = json_string_value(json_object_get(e, "file"));
        char rel[512];
        snprintf(rel, sizeof rel, "images/%s", file);
        q35_image img;
        q35_error err;
        if (decode_file(rel, &img, &err)) {
            q35_test_fail(__FILE__, __LINE__, "%s: %s", file, err.msg);
            continue;
        }
        n_checked += fn(e, file, &img);
        q35_image_free(&img);
    }
    json_decref(g);
    return n_checked;
}

static int check_decoded(json_t *e, const char *file, const q35_image *img) {
    json_t *size = json_object_get(e, "decoded_size");
    CHECK_MSG(img->width == json_integer_value(json_array_get(size, 0)) &&
                  img->height == json_integer_value(json_array_get(size, 1)),
              "%s: decoded %dx%d", file, img->width, img->height);
    const char *want = json_string_value(json_object_get(e, "decoded_sha256"));
    if (!want) return 0;
    char got[65];
    hex_sha256(img->rgb, (size_t)img->width * img->height * 3, got);
    if (strcmp(got, want)) {
        int n_diff = -1, max_diff = 0;
        const char *png = json_string_value(json_object_get(e, "decoded_png"));
        q35_image ref;
        q35_error err;
        char rel[512];
        if (png && (snprintf(rel, sizeof rel, "images/%s", png), !decode_file(rel, &ref, &err))) {
            if (ref.width == img->width && ref.height == img->height)
                n_diff = count_diff(img->rgb, ref.rgb, (size_t)img->width * img->height * 3, &max_diff);
            q35_image_free(&ref);
        }
        q35_test_fail(__FILE__, __LINE__, "%s: decoded bytes differ (%d bytes, max %d)", file, n_diff, max_diff);
    }
    return 1;
}

TEST(image, decodes_every_test_image_to_the_processors_bytes) { CHECK(each_golden_image(check_decoded) >= 25); }

static int check_preprocessed(json_t *e, const char *file, const q35_image *img) {
    if (!json_object_get(e, "grid_thw")) return 0;
    q35_vision_proc p;
    proc_for(json_object_get(e, "overrides"), &p);
    q35_vision_input in;
    q35_error err;
    if (q35_vision_preprocess(&p, img, &in, &err) != Q35_OK) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", file, err.msg);
        return 0;
    }
    json_t *grid = json_object_get(e, "grid_thw"), *shape = json_object_get(e, "pixel_values_shape");
    int ok = in.grid_t == json_integer_value(json_array_get(grid, 0)) &&
             in.grid_h == json_integer_value(json_array_get(grid, 1)) &&
             in.grid_w == json_integer_value(json_array_get(grid, 2)) &&
             in.n_patches == json_integer_value(json_array_get(shape, 0)) &&
             in.patch_dim == json_integer_value(json_array_get(shape, 1));
    CHECK_MSG(ok, "%s: grid %d %d %d", file, in.grid_t, in.grid_h, in.grid_w);
    char png[600];
    snprintf(png, sizeof png, "images/%s.resized.png", file);
    q35_image ref;
    int checked = 0;
    if (ok && !decode_file(png, &ref, &err)) {
        const size_t n = (size_t)ref.width * ref.height * 3;
        uint8_t *mine = malloc(n);
        if (mine && ref.width == in.grid_w * p.patch_size && ref.height == in.grid_h * p.patch_size) {
            unpatchify(&p, &in, mine);
            int max_diff, n_diff = count_diff(mine, ref.rgb, n, &max_diff);
            CHECK_MSG(n_diff == 0, "%s: resized image differs in %d of %zu bytes (max %d)", file, n_diff, n, max_diff);
            char got[65];
            hex_sha256(in.pixel_values, sizeof(float) * (size_t)(in.n_patches * in.patch_dim), got);
            CHECK_MSG(!strcmp(got, json_string_value(json_object_get(e, "pixel_values_sha256"))),
                      "%s: pixel_values differ", file);
            checked = 1;
        } else {
            q35_test_fail(__FILE__, __LINE__, "%s: resized golden of another size", file);
        }
        free(mine);
        q35_image_free(&ref);
    }
    q35_vision_input_free(&in);
    return checked;
}

TEST(image, preprocesses_every_test_image_as_transformers_does) {
    CHECK(each_golden_image(check_preprocessed) >= 25);
}

TEST(image, lays_patches_out_in_transformers_order) {
    json_t *g = load_golden();
    REQUIRE(g);
    json_t *l = json_object_get(g, "layout");
    REQUIRE(l);
    q35_vision_proc p;
    q35_vision_proc_defaults(&p);
    p.patch_size = (int32_t)json_integer_value(json_object_get(l, "patch_size"));
    p.merge_size = (int32_t)json_integer_value(json_object_get(l, "merge_size"));
    p.temporal_patch_size = (int32_t)json_integer_value(json_object_get(l, "temporal_patch_size"));
    p.min_pixels = json_integer_value(json_object_get(l, "min_pixels"));
    p.max_pixels = json_integer_value(json_object_get(l, "max_pixels"));
    char rel[512];
    snprintf(rel, sizeof rel, "images/%s", json_string_value(json_object_get(l, "file")));
    q35_image img;
    q35_error err;
    REQUIRE_MSG(!decode_file(rel, &img, &err), "%s", err.msg);
    q35_vision_input in;
    REQUIRE_MSG(q35_vision_preprocess(&p, &img, &in, &err) == Q35_OK, "%s", err.msg);
    json_t *shape = json_object_get(l, "pixel_values_shape");
    REQUIRE(in.n_patches == json_integer_value(json_array_get(shape, 0)));
    REQUIRE(in.patch_dim == json_integer_value(json_array_get(shape, 1)));
    char *want = NULL;
    size_t n = 0;
    snprintf(rel, sizeof rel, "images/%s", json_string_value(json_object_get(l, "pixel_values_file")));
    REQUIRE(q35_read_file(q35_test_path(rel), &want, &n, &err) == Q35_OK);
    REQUIRE(n == sizeof(float) * (size_t)(in.n_patches * in.patch_dim));
    CHECK(!memcmp(want, in.pixel_values, n));
    free(want);
    q35_vision_input_free(&in);
    q35_image_free(&img);
    json_decref(g);
}

TEST(image, smart_resize_matches_transformers) {
    json_t *g = load_golden();
    REQUIRE(g);
    size_t i;
    json_t *e;
    json_array_foreach(json_object_get(g, "smart_resize_factor32"), i, e) {
        int64_t h = json_integer_value(json_array_get(e, 0)), w = json_integer_value(json_array_get(e, 1));
        int32_t oh = 0, ow = 0;
        q35_error err;
        CHECK_MSG(q35_smart_resize(h, w, 32, 65536, 16777216, &oh, &ow, &err) == Q35_OK, "%s", err.msg);
        CHECK_MSG(oh == json_integer_value(json_array_get(e, 2)) && ow == json_integer_value(json_array_get(e, 3)),
                  "%lldx%lld -> %dx%d", (long long)h, (long long)w, oh, ow);
    }
    int32_t oh, ow;
    q35_error err;
    CHECK(q35_smart_resize(10, 2010, 32, 65536, 16777216, &oh, &ow, &err) == Q35_ERR_ARG); /* aspect > 200 */
    json_decref(g);
}

static q35_status decode_bytes(const void *p, size_t n, int64_t max_pixels, q35_error *err) {
    q35_image img;
    q35_status st = q35_image_decode(p, n, max_pixels, &img, err);
    if (st == Q35_OK) q35_image_free(&img);
    else CHECK(img.rgb == NULL && img.width == 0);
    return st;
}

TEST(image, refuses_truncated_and_corrupt_files_with_a_message) {
    const char *files[] = {"images/rgb_37x53.jpg", "images/progressive_50x50.jpg", "images/rgba_64x40.png",
                           "images/interlaced_45x45.png", "images/lossy_70x50.webp",
                           "images/lossless_alpha_31x29.webp", "images/interlaced_trns_50x36.gif"};
    for (size_t f = 0; f < sizeof files / sizeof *files; f++) {
        char *data = NULL;
        size_t n = 0;
        q35_error err;
        REQUIRE(q35_read_file(q35_test_path(files[f]), &data, &n, &err) == Q35_OK);
        CHECK_MSG(decode_bytes(data, n, 0, &err) == Q35_OK, "%s: %s", files[f], err.msg);
        /* cut anywhere past the signature: an error naming the format, never a crash */
        for (size_t cut = 12; cut < n; cut += 1 + n / 40) {
            err.msg[0] = 0;
            q35_status st = decode_bytes(data, cut, 0, &err);
            CHECK_MSG(st == Q35_ERR_FORMAT, "%s cut at %zu: status %d (%s)", files[f], cut, st, err.msg);
            CHECK_MSG(strstr(err.msg, "JPEG") || strstr(err.msg, "PNG") || strstr(err.msg, "WebP") ||
                          strstr(err.msg, "GIF"), "%s", err.msg);
        }
        /* flipped bytes in the body: decoded or refused, never a crash (ASan watches) */
        for (size_t at = 20; at < n; at += 1 + n / 25) {
            char saved = data[at];
            data[at] = (char)(data[at] ^ 0x5a);
            (void)decode_bytes(data, n, 0, &err);
            data[at] = saved;
        }
        free(data);
    }
}

TEST(image, refuses_a_huge_declared_size_before_allocating) {
    /* Files of a few hundred bytes whose headers declare 60000 x 60000,
     * 65000 x 65000 and 16383 x 16383 pixels: refused at the header, before
     * the codec or we allocate anything for the pixels. */
    const char *bombs[] = {"images/bomb_60000x60000.png", "images/bomb_65000x65000.jpg",
                           "images/bomb_16383x16383.webp", "images/bomb_65000x65000.gif"};
    q35_error err;
    for (size_t i = 0; i < sizeof bombs / sizeof *bombs; i++) {
        char *bytes = NULL;
        size_t len = 0;
        REQUIRE(q35_read_file(q35_test_path(bombs[i]), &bytes, &len, &err) == Q35_OK);
        CHECK(len < 2000);
        CHECK_MSG(decode_bytes(bytes, len, 0, &err) == Q35_ERR_ARG, "%s: %s", bombs[i], err.msg);
        CHECK_MSG(strstr(err.msg, "over the limit") != NULL, "%s: %s", bombs[i], err.msg);
        free(bytes);
    }
    /* The caller's limit holds for a real file too. */
    char *data = NULL;
    size_t n = 0;
    REQUIRE(q35_read_file(q35_test_path("images/lossy_70x50.webp"), &data, &n, &err) == Q35_OK);
    CHECK(decode_bytes(data, n, 70 * 50, &err) == Q35_OK);
    CHECK(decode_bytes(data, n, 70 * 50 - 1, &err) == Q35_ERR_ARG);
    free(data);
}

TEST(image, refuses_unsupported_formats_by_name) {
    q35_error err;
    CHECK(decode_bytes("", 0, 0, &err) == Q35_ERR_FORMAT);
    CHECK(decode_bytes("BM\x36\0\0\0\0\0\0\0\x36\0\0\0", 14, 0, &err) == Q35_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "unsupported format") != NULL, "%s", err.msg);
    CHECK(decode_bytes("GIF89a\1\0\1\0\0\0\0;", 14, 0, &err) == Q35_ERR_FORMAT); /* no frame */
    CHECK_MSG(strstr(err.msg, "GIF") != NULL, "%s", err.msg);
    char *gif = NULL;
    size_t n = 0;
    REQUIRE(q35_read_file(q35_test_path("images/animated_20x14.gif"), &gif, &n, &err) == Q35_OK);
    CHECK(decode_bytes(gif, n, 0, &err) == Q35_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "animated") != NULL, "%s", err.msg);
    free(gif);
    CHECK(decode_bytes("<svg xmlns='http://www.w3.org/2000/svg'/>", 41, 0, &err) == Q35_ERR_UNSUPPORTED);
}

TEST(image, reads_16_bit_png_as_the_high_byte) {
    q35_image img;
    q35_error err;
    REQUIRE_MSG(!decode_file("images/rgb16_20x20.png", &img, &err), "%s", err.msg);
    CHECK(img.width == 20 && img.height == 20);
    q35_image_free(&img);
}

TEST(image, reads_the_exif_orientation_within_bounds) {
    static const uint8_t le[] = {'I', 'I', '*', 0, 8, 0, 0, 0, 1, 0, 0x12, 0x01, 3, 0, 1, 0, 0, 0, 6, 0, 0, 0};
    static const uint8_t be[] = {'M', 'M', 0, '*', 0, 0, 0, 8, 0, 1, 0x01, 0x12, 0, 3, 0, 0, 0, 1, 0, 3, 0, 0};
    CHECK_EQ_INT(q35_exif_orientation(le, sizeof le), 6);
    CHECK_EQ_INT(q35_exif_orientation(be, sizeof be), 3);
    for (size_t n = 0; n < sizeof le; n++) CHECK(q35_exif_orientation(le, n) == 1 || n >= 20);
    static const uint8_t far[] = {'I', 'I', '*', 0, 0xff, 0xff, 0xff, 0x7f};
    CHECK_EQ_INT(q35_exif_orientation(far, sizeof far), 1);
}

TEST(image, reads_a_preprocessor_config_and_refuses_bad_fields) {
    q35_vision_proc p;
    q35_error err;
    q35_vision_proc_defaults(&p);
    const char *cfg = "{\"size\": {\"longest_edge\": 1000000, \"shortest_edge\": 3136}, \"patch_size\": 14,"
                      " \"merge_size\": 2, \"image_mean\": [0.48, 0.45, 0.40], \"image_std\": [0.26, 0.26, 0.27],"
                      " \"image_processor_type\": \"Qwen2VLImageProcessorFast\"}";
    REQUIRE_MSG(q35_vision_proc_parse(cfg, strlen(cfg), "cfg", &p, &err) == Q35_OK, "%s", err.msg);
    CHECK(p.patch_size == 14 && p.min_pixels == 3136 && p.max_pixels == 1000000);
    CHECK_NEAR(p.image_mean[0], 0.48, 1e-7);
    q35_vision_proc_defaults(&p);
    const char *old = "{\"min_pixels\": 100, \"max_pixels\": 5000, \"size\": {\"shortest_edge\": 1, \"longest_edge\": 9}}";
    REQUIRE(q35_vision_proc_parse(old, strlen(old), "cfg", &p, &err) == Q35_OK);
    CHECK(p.min_pixels == 100 && p.max_pixels == 5000);
    const char *bad[] = {"[1]", "{\"patch_size\": 0}", "{\"image_std\": [1, 0, 1]}", "{\"resample\": 2}",
                         "{\"size\": 5}", "{\"image_mean\": [1, 2]}", "{\"do_resize\": 1}", "{\"min_pixels\": 9, \"max_pixels\": 8}",
                         "{"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        q35_vision_proc_defaults(&p);
        CHECK_MSG(q35_vision_proc_parse(bad[i], strlen(bad[i]), "cfg", &p, &err) != Q35_OK, "%s", bad[i]);
    }
}
