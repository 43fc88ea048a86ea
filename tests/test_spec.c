/* Tests of speculative decoding with the MTP head: greedy output is
 * token-for-token the plain output whatever the drafts are, rollback
 * restores every state, and rejection sampling keeps the distribution. */
#include "golden.h"
#include "qwen35.h"
#include "session.h"
#include "test.h"

#include <math.h>

static q35_engine *load(const char *name, golden *g) {
    if (golden_load(name, g)) return NULL;
    q35_engine *e = NULL;
    q35_error err;
    if (q35_engine_load(g->model_dir, NULL, &e, &err)) q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
    return e;
}

/* Greedy generation of n tokens after the prompt with speculation k. */
static int generate(q35_engine *e, const golden *g, int32_t k, int32_t n, int32_t *out, q35_spec_stats *stats,
                    int32_t (*hook)(void *, int32_t, int32_t), void *hook_ctx) {
    q35_error err;
    q35_session *s;
    if (q35_session_new(e, 256, &s, &err)) return -1;
    if (q35_session_set_spec(s, k, &err)) { q35_session_free(s); return -1; }
    s->draft_hook = hook;
    s->draft_hook_ctx = hook_ctx;
    size_t V = (size_t)g->vocab_size;
    float *lg = malloc(sizeof(float) * V);
    int rc = q35_session_eval(s, g->prompt_ids, g->n_prompt, lg, 0, &err) ? -1 : 0;
    int32_t got = 0, last = q35_argmax(lg, (int32_t)V);
    out[got++] = last;
    while (!rc && got < n) {
        int32_t step[Q35_SPEC_K_MAX + 1], m;
        if (q35_session_step(s, last, NULL, step, &m, NULL, &err)) { rc = -1; break; }
        for (int32_t i = 0; i < m && got < n; i++) out[got++] = step[i];
        last = step[m - 1];
    }
    if (stats) *stats = q35_session_spec_stats(s);
    free(lg);
    q35_session_free(s);
    return rc;
}

/* A draft oracle: the reference continuation, wrong at about a third of the
 * positions (a fixed hash), so that steps see full acceptance, partial
 * acceptance and rejection. */
typedef struct { const int32_t *seq; int32_t base, n; } oracle;
static int32_t oracle_hook(void *ctx, int32_t pos, int32_t proposed) {
    oracle *o = ctx;
    int32_t i = pos - o->base;
    if (i < 0 || i >= o->n) return proposed;
    return (((uint32_t)pos * 2654435761u) >> 28) % 3 == 0 ? (o->seq[i] + 1) % 7 : o->seq[i];
}

TEST(spec, greedy_output_identical_with_any_drafts) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        q35_engine *e = load(golden_models[m], &g);
        REQUIRE(e);
        enum { N = 60 };
        int32_t plain[N], spec[N];
        REQUIRE(generate(e, &g, 0, N, plain, NULL, NULL, NULL) == 0);
        for (int i = 0; i < g.n_greedy; i++) CHECK_EQ_INT(plain[i], g.greedy_ids[i]);
        for (int32_t k = 1; k <= 4; k += 2) { /* one draft, and a chain of three */
            q35_spec_stats st;
            REQUIRE(generate(e, &g, k, N, spec, &st, NULL, NULL) == 0); /* the model's own (random) MTP drafts */
            CHECK_MSG(memcmp(plain, spec, sizeof plain) == 0, "%s k=%d: MTP drafts changed the output", golden_models[m], k);
            CHECK(st.drafts > 0);
            oracle o = {plain, g.n_prompt, N};
            REQUIRE(generate(e, &g, k, N, spec, &st, oracle_hook, &o) == 0);
            CHECK_MSG(memcmp(plain, spec, sizeof plain) == 0, "%s k=%d: oracle drafts changed the output", golden_models[m], k);
            /* both outcomes happened: some drafts accepted, some rejected */
            CHECK_MSG(st.accepted > 0 && st.accepted < st.drafts, "%s k=%d: accepted %lld of %lld",
                      golden_models[m], k, (long long)st.accepted, (long long)st.drafts);
        }
        q35_engine_free(e);
        golden_free(&g);
    }
}

TEST(spec, verify_rows_equal_single_token_decode) {
    golden g;
    q35_engine *e = load("tiny-b", &g);
    REQUIRE(e);
    size_t V = (size_t)g.vocab_size;
    q35_error err;
    q35_session *a, *b;
    REQUIRE(q35_session_new(e, 128, &a, &err) == Q35_OK && q35_session_new(e, 128, &b, &err) == Q35_OK);
    REQUIRE(q35_session_set_spec(a, 4, &err) == Q35_OK);
    CHECK(q35_session_eval(a, g.prompt_ids, 20, NULL, 0, &err) == Q35_OK);
    CHECK(q35_session_eval(b, g.prompt_ids, 20, NULL, 0, &err) == Q35_OK);
    float *la = malloc(sizeof(float) * V * 5), *lb = malloc(sizeof(float) * V);
    CHECK(q35_session_eval(a, g.prompt_ids + 20, 5, la, Q35_EVAL_ALL_LOGITS | Q35_EVAL_CHECKPOINT, &err) == Q35_OK);
    for (int i = 0; i < 5; i++) {
        CHECK(q35_session_eval(b, g.prompt_ids + 20 + i, 1, lb, 0, &err) == Q35_OK);
        CHECK_MSG(memcmp(la + i * V, lb, sizeof(float) * V) == 0, "row %d of a verify batch differs from decode", i);
    }
    /* rewind to 2 rows, then continue: equal to a session that only saw those */
    q35_session *c;
    REQUIRE(q35_session_new(e, 128, &c, &err) == Q35_OK);
    CHECK(q35_session_eval(c, g.prompt_ids, 20, NULL, 0, &err) == Q35_OK); /* the same chunked prefill as a */
    CHECK(q35_session_eval(c, g.prompt_ids + 20, 2, NULL, 0, &err) == Q35_OK);
    CHECK(q35_session_rewind(a, 2, &err) == Q35_OK);
    CHECK_EQ_INT(q35_session_pos(a), 22);
    CHECK(q35_session_rewind(a, 1, &err) == Q35_ERR_ARG); /* only once per checkpointed eval */
    CHECK(q35_session_eval(a, g.prompt_ids + 22, 3, la, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    float *lc = malloc(sizeof(float) * V * 3);
    CHECK(q35_session_eval(c, g.prompt_ids + 22, 3, lc, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK(memcmp(la, lc, sizeof(float) * V * 3) == 0);
    /* misuse */
    CHECK(q35_session_eval(a, g.prompt_ids, 6, la, Q35_EVAL_CHECKPOINT, &err) == Q35_ERR_ARG);
    CHECK(q35_session_set_spec(a, 9, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "range") != NULL);
    CHECK(q35_session_set_spec(a, -1, &err) == Q35_ERR_ARG);
    free(la); free(lb); free(lc);
    q35_session_free(a); q35_session_free(b); q35_session_free(c);
    q35_engine_free(e);
    golden_free(&g);
}

/* Sampling at temperature tau: probs = softmax(logits / tau). */
static void softmax_policy(void *ctx, const float *logits, const int32_t *prev, int32_t n_prev, float *probs) {
    (void)prev; (void)n_prev;
    const float tau = *(const float *)ctx;
    int32_t V = 320; /* tiny-a */
    float mx = logits[0];
    for (int32_t i = 1; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < V; i++) { probs[i] = expf((logits[i] - mx) / tau); sum += probs[i]; }
    for (int32_t i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
}

/* Chi-square statistic of counts against expected probabilities, pooling
 * bins with fewer than 5 expected; returns it and its degrees of freedom. */
static double chi_square(const int *counts, const double *p, int n_bins, int n, int *dof) {
    double stat = 0, pool_e = 0, pool_o = 0;
    int bins = 0;
    for (int i = 0; i < n_bins; i++) {
        double ex = p[i] * n;
        if (ex < 5) { pool_e += ex; pool_o += counts[i]; continue; }
        stat += (counts[i] - ex) * (counts[i] - ex) / ex;
        bins++;
    }
    if (pool_e > 0) { stat += (pool_o - pool_e) * (pool_o - pool_e) / (pool_e > 1e-9 ? pool_e : 1e-9); bins++; }
    *dof = bins - 1;
    return stat;
}

TEST(spec, rejection_sampling_keeps_the_distribution) {
    golden g;
    q35_engine *e = load("tiny-a", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size;
    REQUIRE(V == 320);
    q35_error err;
    q35_session *s;
    REQUIRE(q35_session_new(e, 64, &s, &err) == Q35_OK);
    REQUIRE(q35_session_set_spec(s, 2, &err) == Q35_OK);
    float tau = 1.0f;
    q35_policy pol = {softmax_policy, &tau, NULL};
    float *lg = malloc(sizeof(float) * V), *pr = malloc(sizeof(float) * V);
    const int32_t n_prompt = 8, first = 5;
    CHECK(q35_session_eval(s, g.prompt_ids, n_prompt, lg, 0, &err) == Q35_OK);
    q35_snapshot *snap;
    REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
    /* exact distribution of the second generated token given the first */
    CHECK(q35_session_eval(s, &first, 1, lg, 0, &err) == Q35_OK);
    softmax_policy(&tau, lg, NULL, 0, pr);
    double *exact = malloc(sizeof(double) * V);
    for (int32_t i = 0; i < V; i++) exact[i] = pr[i];
    /* many speculative steps from the same state; each emits its first token
     * either from an accepted draft or from the corrected distribution */
    enum { N = 4000 };
    int *counts = calloc((size_t)V, sizeof(int)), *draft_counts = calloc((size_t)V, sizeof(int));
    uint64_t rng = 12345;
    pol.rng = &rng;
    int64_t accepted = 0, drafts = 0;
    for (int t = 0; t < N; t++) {
        CHECK(q35_snapshot_restore(s, snap, &err) == Q35_OK);
        q35_spec_stats before = q35_session_spec_stats(s);
        int32_t out[Q35_SPEC_K_MAX + 1], m;
        REQUIRE(q35_session_step(s, first, &pol, out, &m, NULL, &err) == Q35_OK);
        q35_spec_stats after = q35_session_spec_stats(s);
        accepted += after.accepted - before.accepted;
        drafts += after.drafts - before.drafts;
        counts[out[0]]++;
        draft_counts[q35_argmax(s->draft_probs, V)]++; /* mode of q: a sanity signal only */
    }
    int dof;
    double stat = chi_square(counts, exact, V, N, &dof);
    /* the 0.9999 quantile of chi-square with dof degrees (Wilson-Hilferty) */
    double z = 3.719, h = 2.0 / (9.0 * dof), crit = dof * pow(1 - h + z * sqrt(h), 3);
    CHECK_MSG(stat < crit, "speculative samples do not follow the target: chi2 %.1f >= %.1f (dof %d)", stat, crit, dof);
    CHECK_MSG(drafts == 2 * N, "drafts %lld", (long long)drafts);
    CHECK_MSG(accepted > N / 20, "too few acceptances (%lld) to exercise the accept path", (long long)accepted);
    /* the test has power: the draft distribution q itself is rejected */
    float *q = malloc(sizeof(float) * V);
    memcpy(q, s->draft_probs, sizeof(float) * V);
    double *qd = malloc(sizeof(double) * V);
    double tv = 0;
    for (int32_t i = 0; i < V; i++) { qd[i] = q[i]; tv += fabs(qd[i] - exact[i]); }
    CHECK_MSG(tv / 2 > 0.05, "draft and target distributions are too close (TV %.3f) for this test to mean much", tv / 2);
    free(q); free(qd); free(counts); free(draft_counts); free(exact); free(lg); free(pr);
    q35_snapshot_free(snap);
    q35_session_free(s);
    q35_engine_free(e);
    golden_free(&g);
}

TEST(spec, snapshot_carries_the_mtp_state) {
    golden g;
    q35_engine *e = load("tiny-c", &g);
    REQUIRE(e);
    q35_error err;
    q35_session *s, *t;
    REQUIRE(q35_session_new(e, 128, &s, &err) == Q35_OK && q35_session_new(e, 128, &t, &err) == Q35_OK);
    REQUIRE(q35_session_set_spec(s, 2, &err) == Q35_OK && q35_session_set_spec(t, 2, &err) == Q35_OK);
    CHECK(q35_session_eval(s, g.prompt_ids, 30, NULL, 0, &err) == Q35_OK);
    q35_snapshot *snap;
    REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
    int32_t a[40], b[40], na = 0, nb = 0, last = 7;
    for (int32_t cur = last; na < 30;) {
        int32_t out[Q35_SPEC_K_MAX + 1], m;
        REQUIRE(q35_session_step(s, cur, NULL, out, &m, NULL, &err) == Q35_OK);
        for (int i = 0; i < m; i++) a[na++] = out[i];
        cur = out[m - 1];
    }
    q35_spec_stats sa = q35_session_spec_stats(s);
    CHECK(q35_session_eval(t, g.greedy_ids, 10, NULL, 0, &err) == Q35_OK); /* unrelated history first */
    CHECK(q35_snapshot_restore(t, snap, &err) == Q35_OK);
    for (int32_t cur = last; nb < 30;) {
        int32_t out[Q35_SPEC_K_MAX + 1], m;
        REQUIRE(q35_session_step(t, cur, NULL, out, &m, NULL, &err) == Q35_OK);
        for (int i = 0; i < m; i++) b[nb++] = out[i];
        cur = out[m - 1];
    }
    q35_spec_stats sb = q35_session_spec_stats(t);
    CHECK_EQ_INT(na, nb);
    CHECK(memcmp(a, b, sizeof(int32_t) * (size_t)na) == 0);
    /* the same drafts were proposed: the MTP's KV and pending rows came along */
    CHECK_EQ_INT(sa.drafts, sb.drafts);
    CHECK_EQ_INT(sa.accepted, sb.accepted);
    q35_snapshot_free(snap);
    q35_session_free(s); q35_session_free(t);
    q35_engine_free(e);
    golden_free(&g);
}

static void softmax_policy_b(void *ctx, const float *logits, const int32_t *prev, int32_t n_prev, float *probs) {
    (void)prev; (void)n_prev;
    const float tau = *(const float *)ctx;
    const int32_t V = 384; /* tiny-b */
    float mx = logits[0];
    for (int32_t i = 1; i < V; i++) if (logits[i] > mx) mx = logits[i];
    double sum = 0;
    for (int32_t i = 0; i < V; i++) { probs[i] = expf((logits[i] - mx) / tau); sum += probs[i]; }
    for (int32_t i = 0; i < V; i++) probs[i] = (float)(probs[i] / sum);
}

TEST(spec, batch_step_equals_single_session_steps) {
    golden g;
    q35_engine *e = load("tiny-b", &g);
    REQUIRE(e);
    q35_error err;
    enum { NS = 3, STEPS = 12 };
    q35_session *a[NS], *b[NS];
    const int32_t ks[NS] = {0, 1, 3}; /* a mix: no speculation, one draft, three */
    int32_t la[NS], lb[NS];
    float tau = 0.8f;
    uint64_t ra[NS], rb[NS];
    q35_policy pa[NS], pb[NS];
    const q35_policy *pola[NS];
    for (int i = 0; i < NS; i++) {
        REQUIRE(q35_session_new(e, 128, &a[i], &err) == Q35_OK && q35_session_new(e, 128, &b[i], &err) == Q35_OK);
        REQUIRE(q35_session_set_spec(a[i], ks[i], &err) == Q35_OK && q35_session_set_spec(b[i], ks[i], &err) == Q35_OK);
        CHECK(q35_session_eval(a[i], g.prompt_ids + 3 * i, 10 + i, NULL, 0, &err) == Q35_OK);
        CHECK(q35_session_eval(b[i], g.prompt_ids + 3 * i, 10 + i, NULL, 0, &err) == Q35_OK);
        la[i] = lb[i] = g.prompt_ids[20 + i];
        ra[i] = rb[i] = 1000 + (uint64_t)i;
        /* session 0 samples, the others are greedy */
        pa[i] = (q35_policy){i == 0 ? softmax_policy_b : NULL, &tau, &ra[i]};
        pb[i] = (q35_policy){i == 0 ? softmax_policy_b : NULL, &tau, &rb[i]};
        pola[i] = &pa[i];
    }
    for (int step = 0; step < STEPS; step++) {
        int32_t out[NS * (Q35_SPEC_K_MAX + 1)], n_out[NS];
        REQUIRE(q35_batch_step(a, la, NS, pola, out, n_out, &err) == Q35_OK);
        for (int i = 0; i < NS; i++) {
            int32_t o1[Q35_SPEC_K_MAX + 1], m;
            REQUIRE(q35_session_step(b[i], lb[i], &pb[i], o1, &m, NULL, &err) == Q35_OK);
            CHECK_EQ_INT(n_out[i], m);
            CHECK(memcmp(out + i * (Q35_SPEC_K_MAX + 1), o1, sizeof(int32_t) * (size_t)m) == 0);
            la[i] = out[i * (Q35_SPEC_K_MAX + 1) + n_out[i] - 1];
            lb[i] = o1[m - 1];
        }
    }
    for (int i = 0; i < NS; i++) {
        q35_spec_stats x = q35_session_spec_stats(a[i]), y = q35_session_spec_stats(b[i]);
        CHECK_EQ_INT(x.drafts, y.drafts);
        CHECK_EQ_INT(x.accepted, y.accepted);
        CHECK_EQ_INT(q35_session_pos(a[i]), q35_session_pos(b[i]));
        q35_session_free(a[i]);
        q35_session_free(b[i]);
    }
    q35_engine_free(e);
    golden_free(&g);
}
