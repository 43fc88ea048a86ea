/* Tests of the engine's EOS list and of prefix reuse (q35_session_sync,
 * the token history sessions and snapshots keep). */
#include "model/prepare.h"
#include "golden.h"
#include "helpers.h"
#include "qwen35.h"
#include "core/session.h"
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

/* A copy of tiny-a whose config.json says text_config.eos_token_id = cfg
 * (JSON) and whose generation_config.json says gen (NULL: no such file);
 * the weights are a link. */
static q35_engine *load_with_eos(const char *cfg, const char *gen) {
    char dir[4096], path[4200], src[4200];
    snprintf(dir, sizeof dir, "%s/eos-%d", q35_test_tmpdir(), (int)(strlen(cfg) * 31 + (gen ? strlen(gen) : 7)));
    if (mkdir(dir, 0755)) return NULL;
    snprintf(src, sizeof src, "%s/models/tiny-a/model.safetensors", q35_test_data_dir());
    char abs_src[4096];
    if (!realpath(src, abs_src)) return NULL;
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (symlink(abs_src, path)) return NULL;
    snprintf(src, sizeof src, "%s/models/tiny-a/config.json", q35_test_data_dir());
    json_t *root = json_load_file(src, 0, NULL), *v = json_loads(cfg, JSON_DECODE_ANY, NULL);
    json_object_set_new(json_object_get(root, "text_config"), "eos_token_id", v);
    snprintf(path, sizeof path, "%s/config.json", dir);
    int bad = json_dump_file(root, path, 0);
    json_decref(root);
    if (bad) return NULL;
    if (gen) {
        snprintf(path, sizeof path, "%s/generation_config.json", dir);
        if (test_spit(path, gen, strlen(gen))) return NULL;
    }
    q35_engine *e = NULL;
    q35_error err;
    if (q35_engine_load(dir, NULL, &e, &err)) q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
    return e;
}

static void check_eos(const char *cfg, const char *gen, const int32_t *want, int32_t n_want) {
    q35_engine *e = load_with_eos(cfg, gen);
    REQUIRE_MSG(e, "cannot make the model for %s / %s", cfg, gen ? gen : "-");
    int32_t n;
    const int32_t *ids = q35_engine_eos_ids(e, &n);
    CHECK_MSG(n == n_want && !memcmp(ids, want, sizeof(int32_t) * (size_t)n), "%s / %s: %d ids", cfg, gen ? gen : "-", n);
    q35_engine_free(e);
}

TEST(eos, the_engine_lists_config_then_generation_config_ids_once) {
    check_eos("319", "{\"eos_token_id\": 319}", (const int32_t[]){319}, 1);
    check_eos("[319, 5]", "{\"eos_token_id\": [7, 319, 2]}", (const int32_t[]){319, 5, 7, 2}, 4);
    check_eos("12", NULL, (const int32_t[]){12}, 1);
    check_eos("[3, 4]", "not json", (const int32_t[]){3, 4}, 2);
    /* ids outside the vocabulary and non-integers are no token */
    check_eos("[3, 320, -1, \"x\"]", "{\"eos_token_id\": [4, 99999]}", (const int32_t[]){3, 4}, 2);
    check_eos("null", "{\"eos_token_id\": 9}", (const int32_t[]){9}, 1);
}

TEST(eos, a_weight_cache_keeps_the_list) {
    golden g;
    REQUIRE(golden_load("tiny-b", &g) == 0);
    char out[4096];
    snprintf(out, sizeof out, "%s/cache", q35_test_tmpdir());
    q35_prepare_params p = {.checkpoint = g.model_dir, .out_dir = out};
    q35_error err = {0};
    q35_engine *a = NULL, *b = NULL;
    REQUIRE_MSG(q35_prepare(&p, &err) == Q35_OK, "%s", err.msg);
    REQUIRE(q35_engine_load(g.model_dir, NULL, &a, &err) == Q35_OK && q35_engine_load(out, NULL, &b, &err) == Q35_OK);
    int32_t na, nb;
    const int32_t *ia = q35_engine_eos_ids(a, &na), *ib = q35_engine_eos_ids(b, &nb);
    CHECK(na == 1 && ia[0] == 383);
    CHECK(na == nb && !memcmp(ia, ib, sizeof(int32_t) * (size_t)na));
    q35_engine_free(a);
    q35_engine_free(b);
    golden_free(&g);
}

/* ---- q35_session_sync ---- */


/* The logits of a fresh session that evaluates prompt in the pieces cuts
 * lists (each an end, the last one n), with speculation k. */
static void fresh(q35_engine *e, int32_t k, const int32_t *prompt, const int32_t *cuts, int n_cuts, float *logits) {
    q35_error err;
    q35_session *s = NULL;
    int32_t done = 0;
    if (q35_session_new(e, 128, &s, &err) || q35_session_set_spec(s, k, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        q35_session_free(s);
        return;
    }
    for (int c = 0; c < n_cuts; c++) {
        if (q35_session_eval(s, prompt + done, cuts[c] - done, logits, 0, &err)) q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        done = cuts[c];
    }
    q35_session_free(s);
}

TEST(sync, reuses_the_history_a_prompt_extends_and_starts_over_on_divergence) {
    golden g;
    q35_engine *e = golden_engine("tiny-c", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size;
    REQUIRE(g.n_prompt >= 44);
    size_t row = sizeof(float) * (size_t)V;
    float *lg = malloc(row), *want = malloc(row);
    q35_error err;
    for (int32_t k = 0; k <= 2; k += 2) {
        q35_session *s;
        REQUIRE(q35_session_new(e, 128, &s, &err) == Q35_OK && q35_session_set_spec(s, k, &err) == Q35_OK);
        int32_t reused = -1, n;
        /* an empty session evaluates all of it */
        CHECK(q35_session_sync(s, g.prompt_ids, 20, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        CHECK_EQ_INT(s->n_fed, 20);
        fresh(e, k, g.prompt_ids, (const int32_t[]){20}, 1, want);
        CHECK(memcmp(lg, want, row) == 0);
        const int32_t *held = q35_session_tokens(s, &n);
        CHECK(held && n == 20 && !memcmp(held, g.prompt_ids, sizeof(int32_t) * 20));
        /* a prompt that extends the history: only the new tokens are evaluated, and the logits are those of a
         * fresh session fed the same pieces */
        CHECK(q35_session_sync(s, g.prompt_ids, 32, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 20);
        CHECK_EQ_INT(s->n_fed, 32);
        CHECK_EQ_INT(q35_session_pos(s), 32);
        fresh(e, k, g.prompt_ids, (const int32_t[]){20, 32}, 2, want);
        CHECK(memcmp(lg, want, row) == 0);
        /* generated tokens are part of the history: a follow-up that extends them reuses them too */
        q35_generation *gen;
        q35_gen_params p = {.ignore_eos = 1, .max_tokens = 6};
        q35_gen_out o;
        REQUIRE(q35_generation_new(s, &p, &gen, &err) == Q35_OK);
        REQUIRE(q35_generation_begin(gen, lg, &o, &err) == Q35_OK);
        while (!o.stop) REQUIRE(q35_generation_step(gen, &o, &err) == Q35_OK);
        int32_t n_gen, follow[48];
        const int32_t *gt = q35_generation_tokens(gen, &n_gen);
        REQUIRE(n_gen == 6);
        memcpy(follow, g.prompt_ids, sizeof(int32_t) * 32);
        memcpy(follow + 32, gt, sizeof(int32_t) * 6); /* the last one was chosen, not evaluated */
        for (int32_t i = 38; i < 44; i++) follow[i] = g.prompt_ids[i];
        q35_generation_free(gen);
        CHECK_EQ_INT(q35_session_pos(s), 37);
        held = q35_session_tokens(s, &n);
        CHECK(held && n == 37 && !memcmp(held, follow, sizeof(int32_t) * 37));
        int64_t fed = s->n_fed;
        CHECK(q35_session_sync(s, follow, 44, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 37);
        CHECK_EQ_INT(s->n_fed - fed, 7);
        fresh(e, 0, follow, (const int32_t[]){44}, 1, want); /* other pieces: close, if not bit for bit */
        CHECK(rel_max_diff(lg, want, (size_t)V) < 1e-4);
        /* divergence: a different token inside the history means a full evaluation */
        follow[10] = (follow[10] + 1) % V;
        fed = s->n_fed;
        CHECK(q35_session_sync(s, follow, 44, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        CHECK_EQ_INT(s->n_fed - fed, 44);
        fresh(e, k, follow, (const int32_t[]){44}, 1, want);
        CHECK(memcmp(lg, want, row) == 0);
        /* the same prompt again: its last row must be evaluated again, and the state cannot go back */
        fed = s->n_fed;
        CHECK(q35_session_sync(s, follow, 44, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        CHECK_EQ_INT(s->n_fed - fed, 44);
        CHECK(memcmp(lg, want, row) == 0);
        /* a shorter prompt: a prefix of the history, which the state has passed */
        CHECK(q35_session_sync(s, follow, 30, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        fresh(e, k, follow, (const int32_t[]){30}, 1, want);
        CHECK(memcmp(lg, want, row) == 0);
        /* bad input leaves the session as it was */
        int32_t bad[2] = {1, V};
        CHECK(q35_session_sync(s, bad, 2, NULL, lg, &reused, &err) == Q35_ERR_ARG);
        CHECK(q35_session_sync(s, follow, 0, NULL, lg, &reused, &err) == Q35_ERR_ARG);
        int32_t *big = calloc(129, sizeof(int32_t));
        CHECK(q35_session_sync(s, big, 129, NULL, lg, &reused, &err) == Q35_ERR_CONTEXT);
        free(big);
        CHECK_EQ_INT(q35_session_pos(s), 30);
        q35_session_free(s);
    }
    free(lg);
    free(want);
    q35_engine_free(e);
    golden_free(&g);
}

TEST(sync, a_snapshot_at_a_shorter_prefix_is_restored) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size;
    REQUIRE(g.n_prompt >= 41);
    size_t row = sizeof(float) * (size_t)V;
    float *lg = malloc(row), *want = malloc(row);
    q35_error err;
    for (int32_t k = 0; k <= 1; k++) {
        q35_session *s, *t;
        REQUIRE(q35_session_new(e, 128, &s, &err) == Q35_OK && q35_session_set_spec(s, k, &err) == Q35_OK);
        REQUIRE(q35_session_new(e, 128, &t, &err) == Q35_OK && q35_session_set_spec(t, k, &err) == Q35_OK);
        int32_t reused, n;
        CHECK(q35_session_sync(s, g.prompt_ids, 24, NULL, NULL, &reused, &err) == Q35_OK);
        q35_snapshot *snap;
        REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
        const int32_t *st = q35_snapshot_tokens(snap, &n);
        CHECK(st && n == 24 && !memcmp(st, g.prompt_ids, sizeof(int32_t) * 24));
        CHECK(q35_session_sync(s, g.prompt_ids, 36, NULL, NULL, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 24);
        /* a prompt that leaves s's history at 30 but holds the snapshot's 24 tokens */
        int32_t other[41];
        memcpy(other, g.prompt_ids, sizeof other);
        other[30] = (other[30] + 3) % V;
        int64_t fed = s->n_fed;
        CHECK(q35_session_sync(s, other, 40, snap, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 24);
        CHECK_EQ_INT(s->n_fed - fed, 16);
        fresh(e, k, other, (const int32_t[]){24, 40}, 2, want);
        CHECK(memcmp(lg, want, row) == 0);
        const int32_t *held = q35_session_tokens(s, &n);
        CHECK(held && n == 40 && !memcmp(held, other, sizeof(int32_t) * 40));
        /* in another session, whose own history is shorter than the snapshot's */
        CHECK(q35_session_sync(t, g.prompt_ids, 8, NULL, NULL, &reused, &err) == Q35_OK);
        CHECK(q35_session_sync(t, other, 40, snap, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 24);
        CHECK(memcmp(lg, want, row) == 0);
        /* the session's own history wins when it is the longer prefix */
        fed = t->n_fed;
        CHECK(q35_session_sync(t, other, 41, snap, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 40);
        CHECK_EQ_INT(t->n_fed - fed, 1);
        /* a snapshot that is not a prefix of the prompt is not used */
        other[3] = (other[3] + 1) % V;
        CHECK(q35_session_sync(t, other, 40, snap, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        fresh(e, k, other, (const int32_t[]){40}, 1, want);
        CHECK(memcmp(lg, want, row) == 0);
        q35_snapshot_free(snap);
        q35_session_free(s);
        q35_session_free(t);
    }
    free(lg);
    free(want);
    q35_engine_free(e);
    golden_free(&g);
}

/* q35_session_reuse keeps what it can and evaluates nothing: the caller
 * feeds the rest, here in chunks as a server's prefill does. */
TEST(sync, reuse_keeps_the_prefix_and_leaves_the_rest_to_the_caller) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size;
    size_t row = sizeof(float) * (size_t)V;
    float *lg = malloc(row), *want = malloc(row);
    q35_error err;
    q35_session *s;
    REQUIRE(q35_session_new(e, 128, &s, &err) == Q35_OK && q35_session_set_spec(s, 1, &err) == Q35_OK);
    int32_t kept = -1;
    CHECK(q35_session_sync(s, g.prompt_ids, 10, NULL, NULL, NULL, &err) == Q35_OK);
    int64_t fed = s->n_fed;
    CHECK(q35_session_reuse(s, g.prompt_ids, 40, NULL, &kept, &err) == Q35_OK);
    CHECK_EQ_INT(kept, 10);
    CHECK_EQ_INT(s->n_fed, fed);
    CHECK_EQ_INT(q35_session_pos(s), 10);
    for (int32_t done = kept; done < 40; done += 8) /* chunks of 8 */
        CHECK(q35_session_eval(s, g.prompt_ids + done, 40 - done < 8 ? 40 - done : 8, lg, 0, &err) == Q35_OK);
    fresh(e, 1, g.prompt_ids, (const int32_t[]){10, 18, 26, 34, 40}, 5, want);
    CHECK(memcmp(lg, want, row) == 0);
    /* no reusable prefix: the session starts over, nothing evaluated */
    int32_t other[12];
    memcpy(other, g.prompt_ids, sizeof other);
    other[0] = (other[0] + 1) % V;
    fed = s->n_fed;
    CHECK(q35_session_reuse(s, other, 12, NULL, &kept, &err) == Q35_OK);
    CHECK_EQ_INT(kept, 0);
    CHECK_EQ_INT(q35_session_pos(s), 0);
    CHECK_EQ_INT(s->n_fed, fed);
    CHECK(q35_session_reuse(s, other, 0, NULL, &kept, &err) == Q35_ERR_ARG);
    q35_session_free(s);
    free(lg);
    free(want);
    q35_engine_free(e);
    golden_free(&g);
}

/* q35_session_fill_random (qwen35 speed --depth): a session left at a depth
 * whose states attention and the Gated DeltaNet then read. */
TEST(sync, a_random_fill_sets_a_depth_whose_states_are_read) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size, tok = g.prompt_ids[0];
    size_t row = sizeof(float) * (size_t)V;
    float *a = malloc(row), *b = malloc(row), *c = malloc(row);
    REQUIRE(a && b && c);
    q35_error err;
    q35_session *s;
    REQUIRE(q35_session_new(e, 64, &s, &err) == Q35_OK);
    int32_t n = -1;
    CHECK(q35_session_fill_random(s, 40, 1, &err) == Q35_OK);
    CHECK_EQ_INT(q35_session_pos(s), 40);
    CHECK(q35_session_tokens(s, &n) == NULL && n == 0); /* no ids behind the depth */
    CHECK(q35_session_eval(s, &tok, 1, a, 0, &err) == Q35_OK);
    CHECK_EQ_INT(q35_session_pos(s), 41);
    int finite = 1;
    for (int32_t i = 0; i < V; i++) finite &= isfinite(a[i]) != 0;
    CHECK(finite);
    CHECK(q35_session_fill_random(s, 40, 1, &err) == Q35_OK); /* the same seed: the same bits */
    CHECK(q35_session_eval(s, &tok, 1, b, 0, &err) == Q35_OK);
    CHECK(memcmp(a, b, row) == 0);
    CHECK(q35_session_fill_random(s, 40, 2, &err) == Q35_OK); /* another seed: other states, other logits */
    CHECK(q35_session_eval(s, &tok, 1, b, 0, &err) == Q35_OK);
    CHECK(memcmp(a, b, row) != 0);
    CHECK(q35_session_fill_random(s, 39, 1, &err) == Q35_OK); /* another depth: another attention span */
    CHECK(q35_session_eval(s, &tok, 1, b, 0, &err) == Q35_OK);
    CHECK(memcmp(a, b, row) != 0);
    /* depth 0 is an empty session, as q35_session_reset leaves it */
    CHECK(q35_session_fill_random(s, 0, 1, &err) == Q35_OK);
    CHECK(q35_session_eval(s, &tok, 1, b, 0, &err) == Q35_OK);
    q35_session_reset(s);
    CHECK(q35_session_eval(s, &tok, 1, c, 0, &err) == Q35_OK);
    CHECK(memcmp(b, c, row) == 0);
    CHECK(q35_session_fill_random(s, 64, 1, &err) == Q35_ERR_ARG && strstr(err.msg, "64"));
    CHECK(q35_session_fill_random(s, -1, 1, &err) == Q35_ERR_ARG);
    q35_session_free(s);
    free(a);
    free(b);
    free(c);
    q35_engine_free(e);
    golden_free(&g);
}
