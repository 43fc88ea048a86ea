/* Tests of the host backends' profile (Q35_PROFILE, backend/profile.h). */
#include "backend/profile.h"
#include "helpers.h"
#include "qwen35.h"
#include "test.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

TEST(profile, roles_drop_the_layer_number) {
    char r[64];
    q35_prof_role("model.language_model.layers.17.mlp.down_proj.weight", r, sizeof r);
    CHECK_STR_EQ(r, "mlp.down_proj");
    q35_prof_role("mtp.layers.0.self_attn.q_proj.weight", r, sizeof r);
    CHECK_STR_EQ(r, "mtp.self_attn.q_proj");
    q35_prof_role("lm_head.weight", r, sizeof r);
    CHECK_STR_EQ(r, "lm_head");
    q35_prof_role("mtp.fc.weight", r, sizeof r);
    CHECK_STR_EQ(r, "mtp.fc");
}

/* What an engine on `backend` over `model` writes to stderr from load to
 * free, with Q35_PROFILE set to `value` (NULL: unset): with `image`, that
 * image through the tower first; then a 6-token prompt and one decode step. */
static char *profiled_run(const char *backend, const char *model, const char *image, const char *value) {
    char path[1200];
    snprintf(path, sizeof path, "%s/profile.txt", q35_test_tmpdir());
    const char *had = getenv("Q35_PROFILE");
    char *keep = had ? strdup(had) : NULL;
    FILE *f = fopen(path, "w+");
    fflush(stderr);
    int saved = f ? dup(2) : -1;
    if (saved < 0) {
        if (f) fclose(f);
        free(keep);
        return NULL;
    }
    dup2(fileno(f), 2);
    if (value) setenv("Q35_PROFILE", value, 1);
    else unsetenv("Q35_PROFILE");
    q35_engine_params p = {.n_threads = 2, .backend = backend};
    q35_engine *e = NULL;
    q35_session *s = NULL;
    q35_error err = {0};
    int ok = !q35_engine_load(q35_test_path(model), &p, &e, &err) && !q35_session_new(e, 64, &s, &err);
    if (ok && image) {
        q35_image_processor *ip = NULL;
        q35_image_pixels px = {0};
        q35_image_embeds *im = NULL;
        size_t len = 0;
        char *bytes = test_slurp(q35_test_path(image), &len);
        ok = bytes && !q35_image_processor_load(q35_test_path(model), &ip, &err) &&
             !q35_image_process(ip, bytes, len, &px, &err) && !q35_engine_encode_images(e, &px, 1, &im, &err);
        q35_image_embeds_free(im);
        q35_image_pixels_free(&px);
        q35_image_processor_free(ip);
        free(bytes);
    }
    if (ok) {
        const int32_t ids[7] = {5, 9, 2, 7, 1, 3, 4};
        float *lg = malloc(sizeof(float) * (size_t)q35_engine_info(e)->vocab_size);
        ok = !q35_session_eval(s, ids, 6, lg, 0, &err) && !q35_session_eval(s, ids + 6, 1, lg, 0, &err);
        free(lg);
    }
    q35_session_free(s);
    q35_engine_free(e);
    if (keep) setenv("Q35_PROFILE", keep, 1);
    else unsetenv("Q35_PROFILE");
    free(keep);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)(n > 0 ? n : 0) + 1);
    if (text && n > 0 && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = 0;
    fclose(f);
    if (!ok) q35_test_fail(__FILE__, __LINE__, "run on %s: %s", backend, err.msg);
    return text;
}

/* The line of `what` in the section that starts with `section`, or NULL. */
static const char *line_in(const char *text, const char *section, const char *what, char *line, size_t size) {
    const char *at = strstr(text, section);
    if (!at) return NULL;
    const char *end = strstr(at + 1, "profile: ");
    const char *hit = strstr(at, what);
    if (!hit || (end && hit > end)) return NULL;
    const char *nl = strchr(hit, '\n');
    snprintf(line, size, "%.*s", (int)(nl ? (size_t)(nl - hit) : strlen(hit)), hit);
    return line;
}

TEST(profile, a_profiled_engine_reports_each_part_of_its_passes) {
    const char *backends[2] = {"cpu", "ref"};
    for (int b = 0; b < 2; b++) {
        char *t = profiled_run(backends[b], "models/tiny-a", NULL, "1");
        REQUIRE(t);
        CHECK_MSG(strstr(t, "profile: passes of 6 rows, 1 runs") && strstr(t, "profile: passes of 1 rows, 1 runs"),
                  "%s: %s", backends[b], t);
        const char *parts[] = {"mlp.gate_proj + up_proj (+silu)", "mlp.down_proj", "lm_head", "gdn: conv, norms, delta rule",
                               "attention: norms, rope, cache, scores, values", "linear_attn.in_proj_qkv + in_proj_z",
                               "norms (and residual adds)", "(whole GDN layers)", "(whole attention layers)"};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            CHECK_MSG(strstr(t, parts[i]), "%s: no '%s' in:\n%s", backends[b], parts[i], t);
        /* the decode pass's lm_head: one call, with its bandwidth */
        char line[256];
        CHECK_MSG(line_in(t, "passes of 1 rows", "lm_head", line, sizeof line) && strstr(line, " 1.0 calls") &&
                      strstr(line, "GB/s"),
                  "%s: %s", backends[b], t);
        free(t);
    }
    char *quiet = profiled_run("cpu", "models/tiny-a", NULL, NULL);
    REQUIRE(quiet);
    CHECK_MSG(!strstr(quiet, "profile:"), "unset, yet: %s", quiet);
    free(quiet);
    quiet = profiled_run("cpu", "models/tiny-a", NULL, "0");
    REQUIRE(quiet);
    CHECK_MSG(!strstr(quiet, "profile:"), "Q35_PROFILE=0, yet: %s", quiet);
    free(quiet);
}

/* The vision tower's matmuls go to its own table (by images, blocks folded
 * into one role each), not to the pass before or after it. */
TEST(profile, the_vision_tower_has_its_own_table) {
    char *t = profiled_run("cpu", "models/vl-a", "images/exif2_40x24.jpg", "1");
    REQUIRE(t);
    const char *vis = strstr(t, "profile: vision tower of 1 images, 1 runs");
    CHECK_MSG(vis, "no tower section in:\n%s", t);
    char line[256];
    CHECK_MSG(!line_in(t, "passes of 6 rows", "visual.", line, sizeof line) &&
                  !line_in(t, "passes of 1 rows", "visual.", line, sizeof line),
              "tower rows in a pass's table:\n%s", t);
    CHECK_MSG(vis && strstr(vis, "visual.") && !strstr(t, "blocks.0"), "tower roles:\n%s", t);
    free(t);
}
