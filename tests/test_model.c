/* Tests of the reference forward pass against transformers' fp32 goldens,
 * and of the equivalences the engine relies on: chunked GDN == recurrence,
 * prefill then decode == token by token, and any prompt split. */
#include "backend/cpu/gdn.h"
#include "golden.h"
#include "model/prepare.h"
#include "qwen35.h"
#include "test.h"

#include <jansson.h>

#define LOGIT_TOL 1e-4 /* max |diff| / max |logit| against transformers fp32 */
#define PATH_TOL 2e-5  /* between two engine paths that differ only in rounding */

static q35_engine *load_engine(const golden *g) {
    q35_engine *e = NULL;
    q35_error err = {0};
    if (q35_engine_load(g->model_dir, NULL, &e, &err)) q35_test_fail(__FILE__, __LINE__, "load: %s", err.msg);
    return e;
}

TEST(model, prompt_logits_match_transformers) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        REQUIRE_MSG(golden_load(golden_models[m], &g) == 0, "golden %s missing", golden_models[m]);
        q35_engine *e = load_engine(&g);
        q35_session *s = NULL;
        q35_error err = {0};
        if (e && q35_session_new(e, 0, &s, &err) == Q35_OK) {
            CHECK_EQ_INT(q35_engine_info(e)->vocab_size, g.vocab_size);
            size_t V = (size_t)g.vocab_size;
            float *lg = malloc(sizeof(float) * V * (size_t)g.n_prompt);
            CHECK(q35_session_eval(s, g.prompt_ids, g.n_prompt, lg, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
            for (int32_t p = 0; p < g.n_prompt; p++) {
                double d = rel_max_diff(lg + p * V, g.prompt_logits + p * V, V);
                CHECK_MSG(d <= LOGIT_TOL, "%s: position %d: relative diff %.3g > %.1g", golden_models[m], p, d, LOGIT_TOL);
            }
            free(lg);
        }
        q35_session_free(s);
        q35_engine_free(e);
        golden_free(&g);
    }
}

TEST(model, greedy_tokens_and_decode_logits_match_transformers) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        REQUIRE_MSG(golden_load(golden_models[m], &g) == 0, "golden %s missing", golden_models[m]);
        q35_engine *e = load_engine(&g);
        q35_session *s = NULL;
        q35_error err = {0};
        if (e && q35_session_new(e, 0, &s, &err) == Q35_OK) {
            size_t V = (size_t)g.vocab_size;
            float *lg = malloc(sizeof(float) * V);
            CHECK(q35_session_eval(s, g.prompt_ids, g.n_prompt, lg, 0, &err) == Q35_OK);
            for (int32_t i = 0; i < g.n_greedy; i++) {
                int32_t tok = q35_argmax(lg, (int32_t)V);
                CHECK_MSG(tok == g.greedy_ids[i], "%s: greedy token %d: %d, transformers %d", golden_models[m], i, tok,
                          g.greedy_ids[i]);
                double d = rel_max_diff(lg, g.greedy_logits + i * V, V);
                CHECK_MSG(d <= LOGIT_TOL, "%s: decode step %d: relative diff %.3g", golden_models[m], i, d);
                tok = g.greedy_ids[i]; /* follow the reference so one slip does not cascade */
                CHECK(q35_session_eval(s, &tok, 1, lg, 0, &err) == Q35_OK);
            }
            free(lg);
        }
        q35_session_free(s);
        q35_engine_free(e);
        golden_free(&g);
    }
}

/* Evaluates ids in pieces of the given sizes; returns all-row logits. */
static float *eval_pieces(q35_engine *e, const int32_t *ids, int32_t n, const int32_t *sizes, int n_sizes, int flags) {
    q35_session *s = NULL;
    q35_error err = {0};
    if (q35_session_new(e, 0, &s, &err)) return NULL;
    size_t V = (size_t)q35_engine_info(e)->vocab_size;
    float *lg = malloc(sizeof(float) * V * (size_t)n);
    int32_t done = 0;
    for (int i = 0; i < n_sizes && done < n; i++) {
        int32_t k = sizes[i] < n - done ? sizes[i] : n - done;
        if (q35_session_eval(s, ids + done, k, lg + done * V, flags | Q35_EVAL_ALL_LOGITS, &err)) {
            free(lg);
            lg = NULL;
            break;
        }
        done += k;
    }
    q35_session_free(s);
    return lg;
}

TEST(model, prefill_equals_token_by_token) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        REQUIRE(golden_load(golden_models[m], &g) == 0);
        q35_engine *e = load_engine(&g);
        REQUIRE(e);
        int32_t n = g.n_prompt, all[1] = {n}, ones[256];
        for (int i = 0; i < 256; i++) ones[i] = 1;
        float *a = eval_pieces(e, g.prompt_ids, n, all, 1, 0);
        float *b = eval_pieces(e, g.prompt_ids, n, ones, n, 0);
        float *c = eval_pieces(e, g.prompt_ids, n, all, 1, Q35_EVAL_RECURRENT);
        REQUIRE(a && b && c);
        size_t V = (size_t)g.vocab_size;
        for (int32_t p = 0; p < n; p++) {
            CHECK_MSG(rel_max_diff(b + p * V, a + p * V, V) <= PATH_TOL, "%s: pos %d token-by-token vs prefill", golden_models[m], p);
            CHECK_MSG(rel_max_diff(c + p * V, a + p * V, V) <= PATH_TOL, "%s: pos %d recurrent vs chunked prefill", golden_models[m], p);
        }
        free(a); free(b); free(c);
        q35_engine_free(e);
        golden_free(&g);
    }
}

TEST(model, prompt_split_anywhere_gives_same_logits) {
    golden g;
    REQUIRE(golden_load("tiny-b", &g) == 0);
    q35_engine *e = load_engine(&g);
    REQUIRE(e);
    int32_t n = g.n_prompt, all[1] = {n};
    size_t V = (size_t)g.vocab_size;
    float *ref = eval_pieces(e, g.prompt_ids, n, all, 1, 0);
    REQUIRE(ref);
    for (int32_t k = 1; k < n; k++) {
        int32_t sizes[2] = {k, n - k};
        float *lg = eval_pieces(e, g.prompt_ids, n, sizes, 2, 0);
        REQUIRE(lg);
        double d = rel_max_diff(lg, ref, V * (size_t)n);
        CHECK_MSG(d <= PATH_TOL, "split at %d: relative diff %.3g", k, d);
        free(lg);
    }
    free(ref);
    q35_engine_free(e);
    golden_free(&g);
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13; rng_state ^= rng_state >> 7; rng_state ^= rng_state << 17;
    return (float)((rng_state >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

TEST(gdn, chunked_equals_recurrent_on_random_data) {
    const int32_t DK = 24, DV = 20;
    const int32_t lengths[] = {1, 2, 63, 64, 65, 130, 200};
    float *scratch = malloc(sizeof(float) * q35_gdn_chunk_scratch_floats(DK, DV));
    for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
        int32_t T = lengths[li];
        float *q = malloc(sizeof(float) * T * DK), *k = malloc(sizeof(float) * T * DK), *v = malloc(sizeof(float) * T * DV);
        float *g = malloc(sizeof(float) * T), *b = malloc(sizeof(float) * T);
        float *o1 = malloc(sizeof(float) * T * DV), *o2 = malloc(sizeof(float) * T * DV);
        float S1[24 * 20], S2[24 * 20];
        for (int32_t t = 0; t < T; t++) {
            double n2 = 0, m2 = 0;
            for (int32_t i = 0; i < DK; i++) { q[t * DK + i] = frand(); k[t * DK + i] = frand(); }
            for (int32_t i = 0; i < DK; i++) { n2 += q[t * DK + i] * q[t * DK + i]; m2 += k[t * DK + i] * k[t * DK + i]; }
            for (int32_t i = 0; i < DK; i++) { q[t * DK + i] /= (float)sqrt(n2 * DK); k[t * DK + i] /= (float)sqrt(m2); }
            for (int32_t i = 0; i < DV; i++) v[t * DV + i] = frand();
            g[t] = -0.5f * (frand() + 1.0f); /* decays in (0.37, 1] */
            b[t] = 0.5f * (frand() + 1.0f);
        }
        for (int32_t i = 0; i < DK * DV; i++) S1[i] = S2[i] = 0.1f * frand(); /* a non-zero initial state */
        q35_gdn_recurrent(S1, q, k, v, g, b, o1, T, DK, DV, NULL, 0);
        q35_gdn_chunked(S2, q, k, v, g, b, o2, T, DK, DV, scratch);
        CHECK_MSG(rel_max_diff(o2, o1, (size_t)T * DV) <= 1e-5, "T=%d outputs differ: %.3g", T, rel_max_diff(o2, o1, (size_t)T * DV));
        CHECK_MSG(rel_max_diff(S2, S1, (size_t)DK * DV) <= 1e-5, "T=%d states differ: %.3g", T, rel_max_diff(S2, S1, (size_t)DK * DV));
        free(q); free(k); free(v); free(g); free(b); free(o1); free(o2);
    }
    free(scratch);
}

TEST(model, batch_decode_rows_equal_single_sessions) {
    golden g;
    REQUIRE(golden_load("tiny-c", &g) == 0);
    q35_engine *e = load_engine(&g);
    REQUIRE(e);
    size_t V = (size_t)g.vocab_size;
    q35_session *a[3], *b[3];
    q35_error err;
    float *la = malloc(sizeof(float) * V * 3), *lb = malloc(sizeof(float) * V);
    for (int i = 0; i < 3; i++) {
        REQUIRE(q35_session_new(e, 128, &a[i], &err) == Q35_OK && q35_session_new(e, 128, &b[i], &err) == Q35_OK);
        int32_t n = 5 + 7 * i; /* different lengths and contents per row */
        CHECK(q35_session_eval(a[i], g.prompt_ids + i, n, NULL, 0, &err) == Q35_OK);
        CHECK(q35_session_eval(b[i], g.prompt_ids + i, n, NULL, 0, &err) == Q35_OK);
    }
    for (int step = 0; step < 4; step++) {
        int32_t toks[3] = {g.greedy_ids[step], g.greedy_ids[step + 1], g.greedy_ids[step + 2]};
        CHECK(q35_batch_decode(a, toks, 3, la, &err) == Q35_OK);
        for (int i = 0; i < 3; i++) {
            CHECK(q35_session_eval(b[i], &toks[i], 1, lb, 0, &err) == Q35_OK);
            CHECK_MSG(memcmp(la + i * V, lb, V * sizeof(float)) == 0, "step %d row %d differs", step, i);
        }
    }
    q35_session *dup[2] = {a[0], a[0]};
    int32_t t2[2] = {1, 2};
    CHECK(q35_batch_decode(dup, t2, 2, la, &err) == Q35_ERR_ARG);
    for (int i = 0; i < 3; i++) { q35_session_free(a[i]); q35_session_free(b[i]); }
    free(la); free(lb);
    q35_engine_free(e);
    golden_free(&g);
}

/* Steps of one row per sequence run a GDN layer with each worker on its
 * own K heads (gdn.c: layer_worker) once the heads are big enough for the
 * pool, which the tiny models' are not: a synthetic model with wider heads
 * (4 K heads, 3 V heads each, DK 32 != DV 64), whose 5-row batch steps take
 * that path and its single sessions' steps (one row: under gdn.c's 1e5) the
 * two hand-offs, inline. The batch rows equal the single sessions' bit for
 * bit on 2 threads, on 3 (which do not divide the K heads) and on 5 (a
 * worker without heads). */
TEST(model, batch_rows_with_heads_per_worker_equal_single_sessions) {
    char path[1300], cfg_path[1300], dir[1300];
    snprintf(path, sizeof path, "%s/config.json", q35_test_path("models/tiny-c"));
    snprintf(cfg_path, sizeof cfg_path, "%s/wide-gdn.json", q35_test_tmpdir());
    snprintf(dir, sizeof dir, "%s/wide-gdn", q35_test_tmpdir());
    json_error_t jerr;
    json_t *cfg = json_load_file(path, 0, &jerr), *tc = json_object_get(cfg, "text_config");
    REQUIRE_MSG(tc, "%s: %s", path, jerr.text);
    json_object_set_new(tc, "linear_num_key_heads", json_integer(4));
    json_object_set_new(tc, "linear_num_value_heads", json_integer(12));
    json_object_set_new(tc, "linear_key_head_dim", json_integer(32));
    json_object_set_new(tc, "linear_value_head_dim", json_integer(64));
    REQUIRE(json_dump_file(cfg, cfg_path, 0) == 0);
    json_decref(cfg);
    q35_prepare_params pp = {.synthetic = cfg_path, .out_dir = dir};
    q35_error err = {0};
    REQUIRE_MSG(!q35_prepare(&pp, &err), "%s", err.msg);
    enum { N = 5 }; /* 5 rows x 12 heads x 32 x 64 > gdn.c's 1e5: the pool's */
    const int threads[3] = {2, 3, 5};
    for (int ti = 0; ti < 3; ti++) {
        q35_engine_params ep = {.n_threads = threads[ti]};
        q35_engine *e = NULL;
        REQUIRE_MSG(!q35_engine_load(dir, &ep, &e, &err), "%s", err.msg);
        const size_t V = (size_t)q35_engine_info(e)->vocab_size;
        q35_session *a[N], *b[N];
        float *la = malloc(sizeof(float) * V * N), *lb = malloc(sizeof(float) * V);
        int32_t prompt[16];
        for (int32_t i = 0; i < 16; i++) prompt[i] = (int32_t)((i * 37 + 11) % (int32_t)V);
        for (int i = 0; i < N; i++) {
            REQUIRE(q35_session_new(e, 64, &a[i], &err) == Q35_OK && q35_session_new(e, 64, &b[i], &err) == Q35_OK);
            CHECK(q35_session_eval(a[i], prompt + i, 3 + 2 * i, NULL, 0, &err) == Q35_OK);
            CHECK(q35_session_eval(b[i], prompt + i, 3 + 2 * i, NULL, 0, &err) == Q35_OK);
        }
        for (int step = 0; step < 3; step++) {
            int32_t toks[N];
            for (int i = 0; i < N; i++) toks[i] = (int32_t)((step * 53 + i * 29 + 5) % (int32_t)V);
            CHECK(q35_batch_decode(a, toks, N, la, &err) == Q35_OK);
            for (int i = 0; i < N; i++) {
                CHECK(q35_session_eval(b[i], &toks[i], 1, lb, 0, &err) == Q35_OK);
                CHECK_MSG(memcmp(la + i * V, lb, V * sizeof(float)) == 0, "%d threads: step %d row %d differs",
                          threads[ti], step, i);
            }
        }
        for (int i = 0; i < N; i++) { q35_session_free(a[i]); q35_session_free(b[i]); }
        free(la); free(lb);
        q35_engine_free(e);
    }
}

TEST(model, snapshot_restore_continues_exactly) {
    golden g;
    REQUIRE(golden_load("tiny-a", &g) == 0);
    q35_engine *e = load_engine(&g);
    REQUIRE(e);
    size_t V = (size_t)g.vocab_size;
    q35_error err;
    q35_session *s, *t;
    REQUIRE(q35_session_new(e, 256, &s, &err) == Q35_OK && q35_session_new(e, 256, &t, &err) == Q35_OK);
    CHECK(q35_session_eval(s, g.prompt_ids, 30, NULL, 0, &err) == Q35_OK);
    q35_snapshot *snap;
    REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
    CHECK_EQ_INT(q35_snapshot_pos(snap), 30);
    float *l1 = malloc(sizeof(float) * V * 18), *l2 = malloc(sizeof(float) * V * 18);
    CHECK(q35_session_eval(s, g.prompt_ids + 30, 18, l1, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    /* a different history in t, then the snapshot: t must continue like s */
    CHECK(q35_session_eval(t, g.greedy_ids, 20, NULL, 0, &err) == Q35_OK);
    CHECK(q35_snapshot_restore(t, snap, &err) == Q35_OK);
    CHECK_EQ_INT(q35_session_pos(t), 30);
    CHECK(q35_session_eval(t, g.prompt_ids + 30, 18, l2, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK(memcmp(l1, l2, sizeof(float) * V * 18) == 0);
    /* and back into s itself: rollback */
    CHECK(q35_snapshot_restore(s, snap, &err) == Q35_OK);
    CHECK(q35_session_eval(s, g.prompt_ids + 30, 18, l2, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK(memcmp(l1, l2, sizeof(float) * V * 18) == 0);
    q35_session *small;
    REQUIRE(q35_session_new(e, 16, &small, &err) == Q35_OK);
    CHECK(q35_snapshot_restore(small, snap, &err) == Q35_ERR_CONTEXT);
    q35_session_free(small);
    q35_snapshot_free(snap);
    free(l1); free(l2);
    q35_session_free(s); q35_session_free(t);
    q35_engine_free(e);
    golden_free(&g);
}

/* A snapshot into sessions of other capacities, whose caches lay the KV
 * heads n_ctx rows apart (tiny-b has two KV heads), and back. */
TEST(model, snapshot_restores_into_any_capacity) {
    golden g;
    REQUIRE(golden_load("tiny-b", &g) == 0);
    q35_engine *e = load_engine(&g);
    REQUIRE(e);
    REQUIRE(g.n_prompt >= 48);
    size_t V = (size_t)g.vocab_size;
    q35_error err;
    q35_session *s;
    REQUIRE(q35_session_new(e, 256, &s, &err) == Q35_OK);
    CHECK(q35_session_eval(s, g.prompt_ids, 30, NULL, 0, &err) == Q35_OK);
    q35_snapshot *snap;
    REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
    float *l1 = malloc(sizeof(float) * V * 18), *l2 = malloc(sizeof(float) * V * 18);
    REQUIRE(l1 && l2);
    CHECK(q35_session_eval(s, g.prompt_ids + 30, 18, l1, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    /* into sessions of other capacities (their caches lay heads n_ctx rows apart): the same continuation */
    const int32_t caps[2] = {52, 400};
    for (int ci = 0; ci < 2; ci++) {
        const int32_t cap = caps[ci];
        q35_session *u;
        REQUIRE(q35_session_new(e, cap, &u, &err) == Q35_OK);
        CHECK(q35_snapshot_restore(u, snap, &err) == Q35_OK);
        CHECK(q35_session_eval(u, g.prompt_ids + 30, 18, l2, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        CHECK_MSG(memcmp(l1, l2, sizeof(float) * V * 18) == 0, "restored into a session of %d positions", cap);
        q35_snapshot *back;
        REQUIRE(q35_snapshot_take(u, &back, &err) == Q35_OK); /* and a snapshot of that one back into s */
        CHECK(q35_snapshot_restore(s, back, &err) == Q35_OK);
        CHECK_EQ_INT(q35_session_pos(s), 48);
        float *a = malloc(sizeof(float) * V * 4), *b = malloc(sizeof(float) * V * 4);
        REQUIRE(a && b);
        CHECK(q35_session_eval(s, g.greedy_ids, 4, a, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        CHECK(q35_snapshot_restore(u, back, &err) == Q35_OK);
        CHECK(q35_session_eval(u, g.greedy_ids, 4, b, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        CHECK(memcmp(a, b, sizeof(float) * V * 4) == 0);
        free(a);
        free(b);
        q35_snapshot_free(back);
        q35_session_free(u);
    }
    q35_snapshot_free(snap);
    free(l1); free(l2);
    q35_session_free(s);
    q35_engine_free(e);
    golden_free(&g);
}

TEST(model, eval_rejects_bad_tokens_and_context_overflow) {
    golden g;
    REQUIRE(golden_load("tiny-a", &g) == 0);
    q35_engine *e = load_engine(&g);
    REQUIRE(e);
    q35_error err;
    q35_session *s;
    REQUIRE(q35_session_new(e, 8, &s, &err) == Q35_OK);
    int32_t bad[2] = {1, g.vocab_size};
    CHECK(q35_session_eval(s, bad, 2, NULL, 0, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "vocabulary") != NULL);
    CHECK_EQ_INT(q35_session_pos(s), 0); /* left as it was */
    CHECK(q35_session_eval(s, g.prompt_ids, 9, NULL, 0, &err) == Q35_ERR_CONTEXT);
    CHECK(q35_session_eval(s, g.prompt_ids, 8, NULL, 0, &err) == Q35_OK);
    CHECK(q35_session_eval(s, g.prompt_ids, 1, NULL, 0, &err) == Q35_ERR_CONTEXT);
    q35_session_free(s);
    q35_engine_free(e);
    golden_free(&g);
}
