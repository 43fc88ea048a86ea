/* Tests of the backend seam: choosing a backend, and the scalar reference
 * backend and the CPU backend computing the same model through it. (The
 * whole suite also runs with Q35_BACKEND=ref: scripts/run-tests.sh.) */
#include "golden.h"
#include "helpers.h"
#include "qwen35.h"
#include "test.h"

#define LOGIT_TOL 1e-4 /* max |diff| / max |logit| against transformers fp32 (as test_model.c) */
#define PATH_TOL 2e-5  /* between two engine paths that differ only in rounding */

static q35_engine *load_on(const char *dir, const char *backend, int threads) {
    q35_engine_params p = {.n_threads = threads, .backend = backend};
    q35_engine *e = NULL;
    q35_error err = {0};
    if (q35_engine_load(dir, &p, &e, &err)) q35_test_fail(__FILE__, __LINE__, "load on %s: %s", backend, err.msg);
    return e;
}

TEST(backend, an_unknown_backend_is_refused_with_the_choices) {
    q35_engine_params p = {.backend = "vulkan"};
    q35_engine *e = NULL;
    q35_error err = {0};
    CHECK(q35_engine_load(q35_test_path("models/tiny-a"), &p, &e, &err) == Q35_ERR_ARG);
    CHECK(e == NULL);
    CHECK_MSG(strstr(err.msg, "'vulkan'") && strstr(err.msg, "cpu, ref"), "message: %s", err.msg);
}

TEST(backend, each_backend_says_what_it_is) {
    q35_engine *r = load_on(q35_test_path("models/tiny-a"), "ref", 2);
    q35_engine *c = load_on(q35_test_path("models/tiny-a"), "cpu", 2);
    REQUIRE(r && c);
    CHECK_STR_EQ(q35_engine_backend(r), "ref");
    CHECK_STR_EQ(q35_engine_kernels(r, NULL), "ref");
    CHECK_EQ_INT(q35_engine_threads(r), 1); /* the reference is one thread whatever is asked */
    CHECK_STR_EQ(q35_engine_backend(c), "cpu");
    CHECK_EQ_INT(q35_engine_threads(c), 2);
    q35_engine_free(r);
    q35_engine_free(c);
}

/* Both backends give transformers' logits, agree with each other to
 * rounding, and speculative greedy decoding through either gives the same
 * tokens as transformers' greedy decoding. */
TEST(backend, ref_and_cpu_give_the_goldens_and_agree) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        REQUIRE_MSG(golden_load(golden_models[m], &g) == 0, "golden %s missing", golden_models[m]);
        const size_t V = (size_t)g.vocab_size;
        float *lg[2] = {malloc(sizeof(float) * V * (size_t)g.n_prompt), malloc(sizeof(float) * V * (size_t)g.n_prompt)};
        int32_t *toks[2] = {calloc((size_t)g.n_greedy + Q35_SPEC_K_MAX + 1, sizeof(int32_t)),
                            calloc((size_t)g.n_greedy + Q35_SPEC_K_MAX + 1, sizeof(int32_t))};
        const char *names[2] = {"ref", "cpu"};
        for (int b = 0; b < 2; b++) {
            q35_engine *e = load_on(g.model_dir, names[b], 2);
            q35_session *s = NULL;
            q35_error err = {0};
            if (!e || q35_session_new(e, 0, &s, &err)) { CHECK_MSG(0, "%s: %s", names[b], err.msg); q35_engine_free(e); continue; }
            CHECK(q35_session_eval(s, g.prompt_ids, g.n_prompt, lg[b], Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
            for (int32_t p = 0; p < g.n_prompt; p++) {
                double d = rel_max_diff(lg[b] + p * V, g.prompt_logits + p * V, V);
                CHECK_MSG(d <= LOGIT_TOL, "%s on %s: position %d: relative diff %.3g", golden_models[m], names[b], p, d);
            }
            /* the same prompt again, then speculative greedy steps */
            q35_session_reset(s);
            CHECK(q35_session_set_spec(s, 2, &err) == Q35_OK);
            float *last = malloc(sizeof(float) * V);
            CHECK(q35_session_eval(s, g.prompt_ids, g.n_prompt, last, 0, &err) == Q35_OK);
            CHECK_EQ_INT(test_greedy_tokens(s, last, g.n_greedy, toks[b]), g.n_greedy);
            for (int32_t i = 0; i < g.n_greedy; i++)
                CHECK_MSG(toks[b][i] == g.greedy_ids[i], "%s on %s: speculative greedy token %d: %d, transformers %d",
                          golden_models[m], names[b], i, toks[b][i], g.greedy_ids[i]);
            free(last);
            q35_session_free(s);
            q35_engine_free(e);
        }
        for (int32_t p = 0; p < g.n_prompt; p++) {
            double d = rel_max_diff(lg[1] + p * V, lg[0] + p * V, V);
            CHECK_MSG(d <= PATH_TOL, "%s: position %d: cpu and ref differ by %.3g", golden_models[m], p, d);
        }
        free(lg[0]); free(lg[1]); free(toks[0]); free(toks[1]);
        golden_free(&g);
    }
}
