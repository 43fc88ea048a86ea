/* Tests of the host backends' profile (Q35_PROFILE, backend/cpu/profile.h). */
#include "backend/cpu/profile.h"
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

/* What an engine on `backend` writes to stderr from load to free, with
 * Q35_PROFILE set to `value` (NULL: unset), after a 6-token prompt and one
 * decode step. */
static char *profiled_run(const char *backend, const char *value) {
    char path[1200];
    snprintf(path, sizeof path, "%s/profile.txt", q35_test_tmpdir());
    fflush(stderr);
    int saved = dup(2);
    FILE *f = fopen(path, "w+");
    if (!f || saved < 0) return NULL;
    dup2(fileno(f), 2);
    if (value) setenv("Q35_PROFILE", value, 1);
    else unsetenv("Q35_PROFILE");
    q35_engine_params p = {.n_threads = 2, .backend = backend};
    q35_engine *e = NULL;
    q35_session *s = NULL;
    q35_error err = {0};
    int ok = !q35_engine_load(q35_test_path("models/tiny-a"), &p, &e, &err) && !q35_session_new(e, 64, &s, &err);
    if (ok) {
        const int32_t ids[7] = {5, 9, 2, 7, 1, 3, 4};
        float *lg = malloc(sizeof(float) * (size_t)q35_engine_info(e)->vocab_size);
        ok = !q35_session_eval(s, ids, 6, lg, 0, &err) && !q35_session_eval(s, ids + 6, 1, lg, 0, &err);
        free(lg);
    }
    q35_session_free(s);
    q35_engine_free(e);
    unsetenv("Q35_PROFILE");
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = calloc(1, (size_t)n + 1);
    if (text && fread(text, 1, (size_t)n, f) != (size_t)n) text[0] = 0;
    fclose(f);
    if (!ok) q35_test_fail(__FILE__, __LINE__, "run on %s: %s", backend, err.msg);
    return text;
}

TEST(profile, a_profiled_engine_reports_each_part_of_its_passes) {
    const char *backends[2] = {"cpu", "ref"};
    for (int b = 0; b < 2; b++) {
        char *t = profiled_run(backends[b], "1");
        REQUIRE(t);
        CHECK_MSG(strstr(t, "profile: passes of 6 rows, 1 runs") && strstr(t, "profile: passes of 1 rows, 1 runs"),
                  "%s: %s", backends[b], t);
        const char *parts[] = {"mlp.gate_proj + up_proj (+silu)", "mlp.down_proj", "lm_head", "gdn: conv, norms, delta rule",
                               "attention: norms, rope, cache, scores, values", "linear_attn.in_proj_qkv + in_proj_z",
                               "norms (and residual adds)", "(whole GDN layers)", "(whole attention layers)"};
        for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++)
            CHECK_MSG(strstr(t, parts[i]), "%s: no '%s' in:\n%s", backends[b], parts[i], t);
        /* a matrix's line ends with its bandwidth; the decode pass's lm_head is one call */
        const char *lm = strstr(strstr(t, "passes of 1 rows"), "lm_head");
        CHECK(lm && strstr(lm, "1.0 calls") && strstr(lm, "GB/s") && strstr(lm, "GB/s") < strchr(lm, '\n') + 1);
        free(t);
    }
    char *quiet = profiled_run("cpu", NULL);
    REQUIRE(quiet);
    CHECK_MSG(!strstr(quiet, "profile:"), "unset, yet: %s", quiet);
    free(quiet);
    quiet = profiled_run("cpu", "0");
    REQUIRE(quiet);
    CHECK_MSG(!strstr(quiet, "profile:"), "Q35_PROFILE=0, yet: %s", quiet);
    free(quiet);
}
