/* tests/test_vision.c: the vision tower on the host against transformers'
 * fp32 Qwen3_5VisionModel (tests/data/vision, scripts/make_vision_goldens.py).
 *
 * Tolerance: max |ours - HF| <= 1e-4 of the largest |output|, the measure
 * the text model's logits are held to. Both sides compute in float32 from
 * the same BF16 weights; they differ only in summation order (matmul
 * blocking, LayerNorm in double here), which moves the outputs by ~1e-6
 * relative. The fast kernels and the scalar reference both meet it (the
 * backend Q35_BACKEND picks), and any thread count gives the same bits. */
#include "test.h"

#include "backend/cpu/vision.h"
#include "formats/safetensors.h"
#include "media/vision_proc.h"
#include "golden.h"
#include "helpers.h"

#include "base/util.h"

#include <jansson.h>

typedef struct vision_case {
    q35_config cfg;
    q35_checkpoint ck;
    q35_weights *w;
    int32_t n_images, grids[4][3];
    float *pixels, *want;
    int64_t n_out, n_pix;
    double out_max;
} vision_case;

static float *read_f32(const char *rel, int64_t n) {
    size_t len = 0;
    char *p = test_slurp(q35_test_path(rel), &len);
    if (!p || len != sizeof(float) * (size_t)n) {
        q35_test_fail(__FILE__, __LINE__, "%s: %zu bytes, want %lld floats", rel, len, (long long)n);
        free(p);
        return NULL;
    }
    return (float *)p;
}

static void case_free(vision_case *c) {
    free(c->pixels), free(c->want), free(c->w);
    q35_checkpoint_close(&c->ck);
    memset(c, 0, sizeof *c);
}

/* tests/data/vision/NAME.json, its arrays, and the checkpoint dir (a tiny
 * tower, or a whole tiny model bound as the engine binds it) */
static int case_load(const char *name, const char *model_dir, vision_case *c) {
    memset(c, 0, sizeof *c);
    char rel[256];
    snprintf(rel, sizeof rel, "vision/%s.json", name);
    json_error_t jerr;
    json_t *meta = json_load_file(q35_test_path(rel), 0, &jerr);
    if (!meta) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", rel, jerr.text);
        return -1;
    }
    json_t *grids = json_object_get(meta, "grids");
    c->n_images = (int32_t)json_array_size(grids);
    for (int32_t i = 0; i < c->n_images && i < 4; i++)
        for (int k = 0; k < 3; k++) c->grids[i][k] = (int32_t)json_integer_value(json_array_get(json_array_get(grids, i), k));
    json_t *ps = json_object_get(meta, "pixels_shape"), *os = json_object_get(meta, "out_shape");
    c->n_pix = json_integer_value(json_array_get(ps, 0)) * json_integer_value(json_array_get(ps, 1));
    c->n_out = json_integer_value(json_array_get(os, 0)) * json_integer_value(json_array_get(os, 1));
    c->out_max = json_number_value(json_object_get(meta, "out_max_abs"));
    json_decref(meta);
    snprintf(rel, sizeof rel, "vision/%s.pixels.f32", name);
    c->pixels = read_f32(rel, c->n_pix);
    snprintf(rel, sizeof rel, "vision/%s.out.f32", name);
    c->want = read_f32(rel, c->n_out);
    q35_error err;
    char cfg_path[1200];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", q35_test_path(model_dir));
    c->w = calloc(1, sizeof *c->w);
    if (!c->pixels || !c->want || !c->w) return -1;
    if (q35_config_load(cfg_path, &c->cfg, &err) || q35_checkpoint_open(q35_test_path(model_dir), &c->ck, &err) ||
        q35_vision_weights_bind(&c->ck, &c->cfg, c->w, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", model_dir, err.msg);
        return -1;
    }
    return 0;
}

static q35_host host_for_backend(q35_pool *pool) {
    const char *b = getenv("Q35_BACKEND");
    if (b && !strcmp(b, "ref")) return (q35_host){.k = &q35_kernels_ref};
    return (q35_host){.k = q35_kernels_get(), .pool = pool};
}

static double run_case(const char *name, const char *model_dir, q35_pool *pool, float **out_keep) {
    vision_case c;
    double rel = 1e30;
    if (case_load(name, model_dir, &c)) {
        case_free(&c);
        return rel;
    }
    CHECK(c.cfg.vision.present && c.w->vision.present);
    float *out = malloc(sizeof(float) * (size_t)c.n_out);
    q35_error err;
    q35_host h = host_for_backend(pool);
    if (out && q35_vision_forward(&h, &c.cfg.vision, &c.w->vision, c.pixels, c.n_images,
                                  (const int32_t(*)[3])c.grids, out, &err) == Q35_OK) {
        double max_diff = 0;
        for (int64_t i = 0; i < c.n_out; i++) {
            double d = fabs((double)out[i] - c.want[i]);
            if (!(d <= max_diff)) max_diff = d;
        }
        rel = max_diff / c.out_max;
    } else if (out) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", name, err.msg);
    }
    if (out_keep) *out_keep = out;
    else free(out);
    case_free(&c);
    return rel;
}

TEST(vision, tower_equals_transformers_fp32_on_tiny_random_towers) {
    const char *names[] = {"vt-a", "vt-b", "vt-c"};
    q35_pool *pool = NULL;
    q35_error err;
    REQUIRE(q35_pool_new(2, &pool, &err) == Q35_OK);
    for (int i = 0; i < 3; i++) {
        char dir[64];
        snprintf(dir, sizeof dir, "vision/%s", names[i]);
        double rel = run_case(names[i], dir, pool, NULL);
        CHECK_MSG(rel <= 1e-4, "%s: max |diff| / max |out| = %.3g", names[i], rel);
        if (getenv("Q35_TEST_VERBOSE")) fprintf(stderr, "    %s: max |diff| / max |out| = %.3g\n", names[i], rel);
    }
    q35_pool_free(pool);
}

TEST(vision, tower_of_a_tiny_checkpoint_binds_through_the_tensor_table) {
    double rel = run_case("tiny-a-visual", "models/tiny-a", NULL, NULL);
    CHECK_MSG(rel <= 1e-4, "tiny-a: max |diff| / max |out| = %.3g", rel);
    /* the engine's own bind takes the tower too */
    q35_config cfg;
    q35_checkpoint ck;
    q35_error err;
    q35_weights *w = calloc(1, sizeof *w);
    REQUIRE(w);
    char path[1200];
    snprintf(path, sizeof path, "%s/config.json", q35_test_path("models/tiny-b"));
    REQUIRE(q35_config_load(path, &cfg, &err) == Q35_OK);
    REQUIRE(q35_checkpoint_open(q35_test_path("models/tiny-b"), &ck, &err) == Q35_OK);
    CHECK_MSG(q35_weights_bind(&ck, &cfg, w, &err) == Q35_OK, "%s", err.msg);
    CHECK(w->vision.present && w->vision.blocks[0].qkv_w.data != NULL);
    q35_checkpoint_close(&ck);
    free(w);
}

TEST(vision, tower_output_does_not_depend_on_the_thread_count) {
    float *one = NULL, *two = NULL;
    q35_pool *pool = NULL;
    q35_error err;
    REQUIRE(q35_pool_new(2, &pool, &err) == Q35_OK);
    run_case("vt-a", "vision/vt-a", NULL, &one);
    run_case("vt-a", "vision/vt-a", pool, &two);
    REQUIRE(one && two);
    CHECK(!memcmp(one, two, sizeof(float) * 22 * 24));
    free(one), free(two);
    q35_pool_free(pool);
}

/* An image of 120 patches (attention in query blocks of 64 and 56, split
 * over the pool) beside one of 8: the same bits on 1, 2 and 3 threads. */
TEST(vision, many_patches_give_the_same_bits_on_one_two_and_three_threads) {
    vision_case c;
    REQUIRE(!case_load("vt-a", "vision/vt-a", &c));
    const int32_t grids[2][3] = {{1, 12, 10}, {1, 2, 4}};
    const int64_t n_patch = 128, pd = c.n_pix / 88, n_out = n_patch / 4 * c.cfg.vision.out_hidden_size;
    float *px = malloc(sizeof(float) * (size_t)(n_patch * pd)), *outs[3] = {NULL, NULL, NULL};
    REQUIRE(px);
    for (int64_t i = 0; i < n_patch * pd; i++) px[i] = (float)((i * 7919) % 2001 - 1000) / 500.0f;
    q35_error err;
    for (int t = 0; t < 3; t++) {
        q35_pool *pool = NULL;
        if (t > 0) REQUIRE(q35_pool_new(t + 1, &pool, &err) == Q35_OK);
        q35_host h = host_for_backend(pool);
        outs[t] = malloc(sizeof(float) * (size_t)n_out);
        REQUIRE(outs[t]);
        CHECK_MSG(q35_vision_forward(&h, &c.cfg.vision, &c.w->vision, px, 2, grids, outs[t], &err) == Q35_OK, "%s",
                  err.msg);
        q35_pool_free(pool);
    }
    double mx = 0;
    for (int64_t i = 0; i < n_out; i++) mx = fabs(outs[0][i]) > mx ? fabs(outs[0][i]) : mx;
    CHECK(mx > 0 && mx < 1e6);
    CHECK(!memcmp(outs[0], outs[1], sizeof(float) * (size_t)n_out));
    CHECK(!memcmp(outs[0], outs[2], sizeof(float) * (size_t)n_out));
    for (int t = 0; t < 3; t++) free(outs[t]);
    free(px);
    case_free(&c);
}

TEST(vision, refuses_bad_grids_and_a_missing_tower) {
    vision_case c;
    REQUIRE(!case_load("vt-a", "vision/vt-a", &c));
    q35_host h = host_for_backend(NULL);
    float out[64];
    q35_error err;
    const int32_t odd[1][3] = {{1, 3, 4}}, zero[1][3] = {{1, 0, 4}};
    CHECK(q35_vision_forward(&h, &c.cfg.vision, &c.w->vision, c.pixels, 1, odd, out, &err) == Q35_ERR_ARG);
    CHECK(q35_vision_forward(&h, &c.cfg.vision, &c.w->vision, c.pixels, 1, zero, out, &err) == Q35_ERR_ARG);
    CHECK(q35_vision_forward(&h, &c.cfg.vision, &c.w->vision, c.pixels, 0, odd, out, &err) == Q35_ERR_ARG);
    q35_vision_weights none = {0};
    CHECK(q35_vision_forward(&h, &c.cfg.vision, &none, c.pixels, 1, (const int32_t(*)[3])c.grids, out, &err) ==
          Q35_ERR_UNSUPPORTED);
    case_free(&c);
}

/* Image files -> decoder -> processor -> tower, against the processor and
 * the tower of transformers run on the same files. */
TEST(vision, image_files_encode_as_transformers_encodes_them) {
    vision_case c;
    REQUIRE(!case_load("vt-a", "vision/vt-a", &c));
    json_error_t jerr;
    json_t *meta = json_load_file(q35_test_path("vision/vt-a.images.json"), 0, &jerr);
    REQUIRE_MSG(meta, "%s", jerr.text);
    char *pre = json_dumps(json_object_get(meta, "preprocessor_config"), 0);
    q35_vision_proc p;
    q35_error err;
    q35_vision_proc_defaults(&p);
    REQUIRE(pre && q35_vision_proc_parse(pre, strlen(pre), "preprocessor_config", &p, &err) == Q35_OK);
    free(pre);
    json_t *files = json_object_get(meta, "files"), *grids = json_object_get(meta, "grids");
    const int32_t n_images = (int32_t)json_array_size(files);
    REQUIRE(n_images == 2 && json_array_size(grids) == 2);
    int32_t grid[2][3];
    q35_vision_input in[2] = {0};
    int64_t rows = 0;
    for (int32_t i = 0; i < n_images; i++) {
        char rel[256];
        snprintf(rel, sizeof rel, "images/%s", json_string_value(json_array_get(files, (size_t)i)));
        size_t len = 0;
        char *bytes = test_slurp(q35_test_path(rel), &len);
        q35_image img;
        REQUIRE(bytes && q35_image_decode((const uint8_t *)bytes, len, 0, &img, &err) == Q35_OK);
        free(bytes);
        REQUIRE_MSG(q35_vision_preprocess(&p, &img, &in[i], &err) == Q35_OK, "%s", err.msg);
        q35_image_free(&img);
        grid[i][0] = in[i].grid_t, grid[i][1] = in[i].grid_h, grid[i][2] = in[i].grid_w;
        for (int k = 0; k < 3; k++)
            CHECK(grid[i][k] == json_integer_value(json_array_get(json_array_get(grids, (size_t)i), (size_t)k)));
        rows += in[i].n_patches;
    }
    const int64_t dim = in[0].patch_dim;
    float *pixels = malloc(sizeof(float) * (size_t)(rows * dim));
    REQUIRE(pixels);
    memcpy(pixels, in[0].pixel_values, sizeof(float) * (size_t)(in[0].n_patches * dim));
    memcpy(pixels + in[0].n_patches * dim, in[1].pixel_values, sizeof(float) * (size_t)(in[1].n_patches * dim));
    json_t *os = json_object_get(meta, "out_shape");
    const int64_t n_out = json_integer_value(json_array_get(os, 0)) * json_integer_value(json_array_get(os, 1));
    float *want = read_f32("vision/vt-a.images.out.f32", n_out), *out = malloc(sizeof(float) * (size_t)n_out);
    q35_host h = host_for_backend(NULL);
    REQUIRE(want && out);
    REQUIRE_MSG(q35_vision_forward(&h, &c.cfg.vision, &c.w->vision, pixels, 2, (const int32_t(*)[3])grid, out,
                                   &err) == Q35_OK, "%s", err.msg);
    double max_diff = 0;
    for (int64_t i = 0; i < n_out; i++)
        if (fabs((double)out[i] - want[i]) > max_diff) max_diff = fabs((double)out[i] - want[i]);
    const double rel = max_diff / json_number_value(json_object_get(meta, "out_max_abs"));
    CHECK_MSG(rel <= 1e-4, "max |diff| / max |out| = %.3g", rel);
    free(pixels), free(want), free(out);
    q35_vision_input_free(&in[0]), q35_vision_input_free(&in[1]);
    json_decref(meta);
    case_free(&c);
}
