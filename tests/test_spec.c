/* Tests of speculative decoding with the MTP head: greedy output is
 * token-for-token the plain output whatever the drafts are, rollback
 * restores every state, and rejection sampling keeps the distribution. */
#include "model/prepare.h"
#include "golden.h"
#include "helpers.h"
#include "qwen35.h"
#include "core/session.h"
#include "test.h"

#include <math.h>


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
    if (!rc && test_greedy_tokens(s, lg, n, out) != n) rc = -1;
    if (stats) *stats = q35_session_spec_stats(s);
    free(lg);
    q35_session_free(s);
    return rc;
}

TEST(spec, greedy_output_identical_with_any_drafts) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        q35_engine *e = golden_engine(golden_models[m], &g);
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
            /* by position: draft j is accepted only after drafts 0..j-1, and they add up */
            int64_t sum = 0;
            for (int32_t j = 0; j < Q35_SPEC_K_MAX; j++) {
                sum += st.accepted_at[j];
                if (j >= k) CHECK_EQ_INT(st.accepted_at[j], 0);
                if (j) CHECK(st.accepted_at[j] <= st.accepted_at[j - 1]);
            }
            CHECK_EQ_INT(sum, st.accepted);
            CHECK(st.accepted_at[0] <= st.steps);
        }
        q35_engine_free(e);
        golden_free(&g);
    }
}

TEST(spec, verify_rows_equal_single_token_decode) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    size_t V = (size_t)g.vocab_size;
    q35_error err;
    q35_session *a, *b;
    REQUIRE(test_twin_sessions(e, 128, 4, g.prompt_ids, 20, &a, &b) == 0);
    float *la = malloc(sizeof(float) * V * 5), *lb = malloc(sizeof(float) * V);
    CHECK(q35_session_eval(a, g.prompt_ids + 20, 5, la, Q35_EVAL_ALL_LOGITS | Q35_EVAL_REWINDABLE, &err) == Q35_OK);
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
    CHECK(q35_session_rewind(a, 1, &err) == Q35_ERR_ARG); /* only once per rewindable eval */
    CHECK(q35_session_eval(a, g.prompt_ids + 22, 3, la, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    float *lc = malloc(sizeof(float) * V * 3);
    CHECK(q35_session_eval(c, g.prompt_ids + 22, 3, lc, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK(memcmp(la, lc, sizeof(float) * V * 3) == 0);
    /* misuse */
    CHECK(q35_session_eval(a, g.prompt_ids, 6, la, Q35_EVAL_REWINDABLE, &err) == Q35_ERR_ARG);
    CHECK(q35_session_set_spec(a, 9, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "range") != NULL);
    CHECK(q35_session_set_spec(a, -1, &err) == Q35_ERR_ARG);
    free(la); free(lb); free(lc);
    q35_session_free(a); q35_session_free(b); q35_session_free(c);
    q35_engine_free(e);
    golden_free(&g);
}

/* With one draft slot a rejected draft's rewind trades the state and the
 * slot (state.c): after rewinds and accepts in turn, and after a change of
 * k, the session computes what a session that only saw the kept tokens does. */
TEST(spec, one_slot_rewinds_keep_the_state) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    size_t V = (size_t)g.vocab_size;
    q35_error err;
    q35_session *a, *c;
    REQUIRE(test_twin_sessions(e, 128, 1, g.prompt_ids, 10, &a, &c) == 0);
    float *la = malloc(sizeof(float) * V * 2), *lc = malloc(sizeof(float) * V * 2);
    REQUIRE(la && lc);
    int32_t next = 10;
    const int reject[7] = {1, 1, 0, 1, 0, 0, 1}; /* two rejections in a row: the blocks trade back */
    for (int i = 0; i < 7; i++) {
        const int32_t *t = g.prompt_ids + next;
        CHECK(q35_session_eval(a, t, 2, la, Q35_EVAL_ALL_LOGITS | Q35_EVAL_REWINDABLE, &err) == Q35_OK);
        if (reject[i]) CHECK(q35_session_rewind(a, 1, &err) == Q35_OK);
        CHECK(q35_session_eval(c, t, reject[i] ? 1 : 2, lc, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        CHECK_MSG(memcmp(la, lc, sizeof(float) * V) == 0, "round %d: the verify's first row differs", i);
        next += reject[i] ? 1 : 2;
        CHECK_EQ_INT(q35_session_pos(a), next);
    }
    CHECK(q35_session_eval(a, g.prompt_ids + next, 2, la, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK(q35_session_eval(c, g.prompt_ids + next, 2, lc, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK_MSG(memcmp(la, lc, sizeof(float) * V * 2) == 0, "after the rewinds the sessions differ");
    /* a new k replaces the slot, whichever block it was */
    REQUIRE(q35_session_set_spec(a, 2, &err) == Q35_OK);
    next += 2;
    CHECK(q35_session_eval(a, g.prompt_ids + next, 3, NULL, Q35_EVAL_REWINDABLE, &err) == Q35_OK);
    CHECK(q35_session_rewind(a, 1, &err) == Q35_OK);
    CHECK(q35_session_eval(c, g.prompt_ids + next, 1, NULL, 0, &err) == Q35_OK);
    CHECK(q35_session_eval(a, g.prompt_ids + next + 1, 2, la, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK(q35_session_eval(c, g.prompt_ids + next + 1, 2, lc, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
    CHECK_MSG(memcmp(la, lc, sizeof(float) * V * 2) == 0, "after k 1 -> 2 the sessions differ");
    free(la); free(lc);
    q35_session_free(a); q35_session_free(c);
    q35_engine_free(e);
    golden_free(&g);
}

/* probs = softmax(logits / tau) over tiny-a's vocabulary. */
static void softmax_tau(float tau, const float *logits, float *probs) {
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

/* Many speculative steps (k = 2, temperature 1) from one state of tiny-a:
 * the first token each emits, from an accepted draft or from the corrected
 * distribution, must follow the target's exact distribution (chi-square at
 * the 0.9999 quantile). With draft_ids, the draft head is reduced to them;
 * hook may replace drafts. Returns the draft distribution q of the last
 * step's first draft (V floats, malloc'd) and the exact distribution. */
/* The generation's first token is 5 (its hook masks every other one). */
static void only_5_first(void *ctx, float *logits, int32_t n_vocab, const int32_t *prev, int32_t n_prev) {
    (void)ctx; (void)prev;
    for (int32_t v = 0; !n_prev && v < n_vocab; v++) if (v != 5) logits[v] = -INFINITY;
}

static void check_rejection_sampling(const int32_t *draft_ids, int32_t n_draft, int32_t (*hook)(void *, int32_t, int32_t),
                                     void *hook_ctx, int64_t *accepted_out, float **q_out, double **exact_out) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size;
    REQUIRE(V == 320);
    q35_error err;
    if (draft_ids) REQUIRE(q35_engine_set_draft_vocab(e, draft_ids, n_draft, &err) == Q35_OK);
    q35_session *s;
    REQUIRE(q35_session_new(e, 64, &s, &err) == Q35_OK);
    REQUIRE(q35_session_set_spec(s, 2, &err) == Q35_OK);
    s->draft_hook = hook;
    s->draft_hook_ctx = hook_ctx;
    float tau = 1.0f;
    float *lg = malloc(sizeof(float) * V), *pr = malloc(sizeof(float) * V);
    const int32_t n_prompt = 8, first = 5;
    CHECK(q35_session_eval(s, g.prompt_ids, n_prompt, lg, 0, &err) == Q35_OK);
    float *lg_prompt = malloc(sizeof(float) * V);
    memcpy(lg_prompt, lg, sizeof(float) * V);
    q35_snapshot *snap;
    REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
    /* exact distribution of the second generated token given the first */
    CHECK(q35_session_eval(s, &first, 1, lg, 0, &err) == Q35_OK);
    softmax_tau(tau, lg, pr);
    double *exact = malloc(sizeof(double) * V);
    for (int32_t i = 0; i < V; i++) exact[i] = pr[i];
    enum { N = 4000 };
    int *counts = calloc((size_t)V, sizeof(int));
    /* a sampler at temperature tau with no cut and no penalty draws from softmax_tau */
    q35_sampler *sm = NULL;
    q35_sampler_params sp = {.temperature = tau, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 12345};
    REQUIRE(q35_sampler_new(&sp, V, &sm, &err) == Q35_OK);
    q35_gen_params gp = {.sampler = sm, .logits_fn = only_5_first, .ignore_eos = 1};
    int64_t accepted = 0, drafts = 0;
    for (int t = 0; t < N; t++) {
        CHECK(q35_snapshot_restore(s, snap, &err) == Q35_OK);
        q35_spec_stats before = q35_session_spec_stats(s);
        int32_t out[1];
        q35_generation *gen;
        q35_gen_out o;
        REQUIRE(q35_generation_new(s, &gp, &gen, &err) == Q35_OK);
        REQUIRE(q35_generation_begin(gen, lg_prompt, &o, &err) == Q35_OK && o.tokens[0] == first);
        REQUIRE(q35_generation_step(gen, &o, &err) == Q35_OK);
        out[0] = o.tokens[0];
        q35_generation_free(gen);
        q35_spec_stats after = q35_session_spec_stats(s);
        accepted += after.accepted - before.accepted;
        drafts += after.drafts - before.drafts;
        counts[out[0]]++;
    }
    int dof;
    double stat = chi_square(counts, exact, V, N, &dof);
    /* the 0.9999 quantile of chi-square with dof degrees (Wilson-Hilferty) */
    double z = 3.719, h = 2.0 / (9.0 * dof), crit = dof * pow(1 - h + z * sqrt(h), 3);
    CHECK_MSG(stat < crit, "speculative samples do not follow the target: chi2 %.1f >= %.1f (dof %d)", stat, crit,
              dof);
    CHECK_MSG(drafts == 2 * N, "drafts %lld", (long long)drafts);
    *accepted_out = accepted;
    *q_out = malloc(sizeof(float) * V);
    memcpy(*q_out, s->draft_probs, sizeof(float) * V);
    *exact_out = exact;
    free(counts); free(lg); free(pr); free(lg_prompt);
    q35_sampler_free(sm);
    q35_snapshot_free(snap);
    q35_session_free(s);
    q35_engine_free(e);
    golden_free(&g);
}

/* The target's exact distribution of that token (tiny-a, temperature 1). */
static double *exact_next(void) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    if (!e) return NULL;
    q35_error err;
    q35_session *s = NULL;
    float lg[320], pr[320], tau = 1.0f;
    const int32_t first = 5;
    double *exact = malloc(sizeof(double) * 320);
    if (q35_session_new(e, 64, &s, &err) || q35_session_eval(s, g.prompt_ids, 8, NULL, 0, &err) ||
        q35_session_eval(s, &first, 1, lg, 0, &err)) {
        free(exact);
        exact = NULL;
    } else {
        softmax_tau(tau, lg, pr);
        for (int32_t i = 0; i < 320; i++) exact[i] = pr[i];
    }
    q35_session_free(s);
    q35_engine_free(e);
    golden_free(&g);
    return exact;
}

TEST(spec, rejection_sampling_keeps_the_distribution) {
    int64_t accepted = 0;
    float *q = NULL;
    double *exact = NULL;
    check_rejection_sampling(NULL, 0, NULL, NULL, &accepted, &q, &exact);
    REQUIRE(q && exact);
    CHECK_MSG(accepted > 4000 / 20, "too few acceptances (%lld) to exercise the accept path", (long long)accepted);
    /* the test has power: the draft distribution q itself is rejected */
    double tv = 0;
    for (int32_t i = 0; i < 320; i++) tv += fabs((double)q[i] - exact[i]);
    CHECK_MSG(tv / 2 > 0.05, "draft and target distributions are too close (TV %.3f) for this test to mean much", tv / 2);
    free(q); free(exact);
}

/* The target's most likely next tokens fall outside the draft vocabulary
 * (q = 0 there): the residual max(0, p - q) must give them all their mass. */
TEST(spec, rejection_sampling_with_a_draft_vocabulary_keeps_the_distribution) {
    double *exact = exact_next();
    REQUIRE(exact);
    int64_t accepted = 0;
    float *q = NULL;
    /* the subset: every token but the most likely ones, together 30% of the mass */
    int32_t top[320], ids[320], n = 0, n_top = 0;
    uint8_t out[320] = {0};
    double outside = 0;
    while (outside < 0.3) {
        int32_t best = -1;
        for (int32_t i = 0; i < 320; i++)
            if (!out[i] && (best < 0 || exact[i] > exact[best])) best = i;
        out[best] = 1;
        top[n_top++] = best;
        outside += exact[best];
    }
    for (int32_t i = 0; i < 320; i++) if (!out[i]) ids[n++] = i;
    free(exact);
    check_rejection_sampling(ids, n, NULL, NULL, &accepted, &q, &exact);
    REQUIRE(q && exact);
    for (int t = 0; t < n_top; t++) CHECK_MSG(q[top[t]] == 0.0f, "draft probability %g outside the draft vocabulary", q[top[t]]);
    CHECK(accepted > 0);
    free(q); free(exact);
}

/* A draft the draft distribution could not propose (a hook forces the
 * target's most likely token while q gives it 0): accepted with
 * probability p, else replaced from p without it; still exact. */
static int32_t force_hook(void *ctx, int32_t pos, int32_t proposed) {
    (void)pos; (void)proposed;
    return *(const int32_t *)ctx;
}

TEST(spec, rejection_sampling_of_a_forced_draft_keeps_the_distribution) {
    double *exact = exact_next();
    REQUIRE(exact);
    int64_t accepted = 0;
    float *q = NULL;
    int32_t best = 0, ids[320], n = 0;
    for (int32_t i = 1; i < 320; i++) if (exact[i] > exact[best]) best = i;
    for (int32_t i = 0; i < 320; i++) if (i != best) ids[n++] = i;
    free(exact);
    check_rejection_sampling(ids, n, force_hook, &best, &accepted, &q, &exact);
    REQUIRE(q && exact);
    CHECK(q[best] == 0.0f);
    CHECK(accepted > 0); /* a forced draft is accepted with probability p(best) */
    free(q); free(exact);
}

TEST(spec, snapshot_carries_the_mtp_state) {
    golden g;
    q35_engine *e = golden_engine("tiny-c", &g);
    REQUIRE(e);
    q35_error err;
    q35_session *s, *t;
    REQUIRE(q35_session_new(e, 128, &s, &err) == Q35_OK && q35_session_new(e, 128, &t, &err) == Q35_OK);
    REQUIRE(q35_session_set_spec(s, 2, &err) == Q35_OK && q35_session_set_spec(t, 2, &err) == Q35_OK);
    CHECK(q35_session_eval(s, g.prompt_ids, 30, NULL, 0, &err) == Q35_OK);
    q35_snapshot *snap;
    REQUIRE(q35_snapshot_take(s, &snap, &err) == Q35_OK);
    int32_t a[40], b[40], na = 0, nb = 0, last = 7;
    q35_generation *ga = test_gen_after(s, NULL, last), *gb = NULL;
    REQUIRE(ga);
    while (na < 30) {
        int32_t out[Q35_SPEC_K_MAX + 1], m = test_gen_step(ga, out);
        REQUIRE(m > 0);
        for (int i = 0; i < m; i++) a[na++] = out[i];
    }
    q35_spec_stats sa = q35_session_spec_stats(s);
    CHECK(q35_session_eval(t, g.greedy_ids, 10, NULL, 0, &err) == Q35_OK); /* unrelated history first */
    CHECK(q35_snapshot_restore(t, snap, &err) == Q35_OK);
    REQUIRE((gb = test_gen_after(t, NULL, last)));
    while (nb < 30) {
        int32_t out[Q35_SPEC_K_MAX + 1], m = test_gen_step(gb, out);
        REQUIRE(m > 0);
        for (int i = 0; i < m; i++) b[nb++] = out[i];
    }
    q35_generation_free(ga);
    q35_generation_free(gb);
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

TEST(spec, batch_step_equals_single_session_steps) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    q35_error err;
    enum { NS = 3, STEPS = 12 };
    q35_session *a[NS], *b[NS];
    const int32_t ks[NS] = {0, 1, 3}; /* a mix: no speculation, one draft, three */
    q35_sampler *sa[NS] = {0}, *sb[NS] = {0};
    q35_generation *ga[NS], *gb[NS];
    /* session 0 samples (its own sampler on each side, the same seed), the others are greedy */
    const q35_sampler_params sp = {.temperature = 0.8f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 1000};
    REQUIRE(q35_sampler_new(&sp, g.vocab_size, &sa[0], &err) == Q35_OK && q35_sampler_new(&sp, g.vocab_size, &sb[0], &err) == Q35_OK);
    for (int i = 0; i < NS; i++) {
        REQUIRE(q35_session_new(e, 128, &a[i], &err) == Q35_OK && q35_session_new(e, 128, &b[i], &err) == Q35_OK);
        REQUIRE(q35_session_set_spec(a[i], ks[i], &err) == Q35_OK && q35_session_set_spec(b[i], ks[i], &err) == Q35_OK);
        CHECK(q35_session_eval(a[i], g.prompt_ids + 3 * i, 10 + i, NULL, 0, &err) == Q35_OK);
        CHECK(q35_session_eval(b[i], g.prompt_ids + 3 * i, 10 + i, NULL, 0, &err) == Q35_OK);
        REQUIRE((ga[i] = test_gen_after(a[i], sa[i], g.prompt_ids[20 + i])));
        REQUIRE((gb[i] = test_gen_after(b[i], sb[i], g.prompt_ids[20 + i])));
    }
    for (int step = 0; step < STEPS; step++) {
        q35_gen_out out[NS];
        REQUIRE(q35_generation_batch_step(ga, NS, out, &err) == Q35_OK);
        for (int i = 0; i < NS; i++) {
            int32_t o1[Q35_SPEC_K_MAX + 1], m = test_gen_step(gb[i], o1);
            CHECK_EQ_INT(out[i].n_tokens, m);
            CHECK(m > 0 && memcmp(out[i].tokens, o1, sizeof(int32_t) * (size_t)m) == 0);
        }
    }
    for (int i = 0; i < NS; i++) { q35_generation_free(ga[i]); q35_generation_free(gb[i]); }
    q35_sampler_free(sa[0]);
    q35_sampler_free(sb[0]);
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

/* ---- reduced-vocabulary draft head ---- */

/* generate() with a draft vocabulary set on the engine for the run. */
static int generate_dv(q35_engine *e, const golden *g, const int32_t *ids, int32_t n_ids, int32_t k, int32_t n, int32_t *out,
                       q35_spec_stats *stats) {
    q35_error err;
    if (q35_engine_set_draft_vocab(e, ids, n_ids, &err)) return -1;
    int rc = generate(e, g, k, n, out, stats, NULL, NULL);
    if (q35_engine_set_draft_vocab(e, NULL, 0, &err)) return -1;
    return rc;
}

TEST(spec, draft_vocab_greedy_output_identical_and_counted) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        q35_engine *e = golden_engine(golden_models[m], &g);
        REQUIRE(e);
        enum { N = 60 };
        const int32_t V = g.vocab_size;
        int32_t plain[N], spec[N];
        REQUIRE(generate(e, &g, 0, N, plain, NULL, NULL, NULL) == 0);
        int32_t *ids = malloc(sizeof(int32_t) * (size_t)V), n;
        uint8_t *used = calloc((size_t)V, 1);
        for (int i = 0; i < N; i++) used[plain[i]] = 1;
        for (int32_t k = 1; k <= 3; k += 2) {
            q35_spec_stats full, st;
            REQUIRE(generate(e, &g, k, N, spec, &full, NULL, NULL) == 0);
            /* every id, in a scrambled order: the same drafts, so the same counters */
            for (int32_t i = 0; i < V; i++) ids[i] = (int32_t)(((int64_t)i * 7919) % V);
            REQUIRE(generate_dv(e, &g, ids, V, k, N, spec, &st) == 0);
            CHECK_MSG(memcmp(plain, spec, sizeof plain) == 0, "%s k=%d: full draft vocabulary changed the output", golden_models[m], k);
            CHECK_EQ_INT(st.steps, full.steps);
            CHECK_EQ_INT(st.drafts, full.drafts);
            CHECK_EQ_INT(st.accepted, full.accepted);
            /* half the ids, holding every token of the output: drafts still land */
            n = 0;
            for (int32_t i = 0; i < V; i++) if (used[i] || i % 2) ids[n++] = i;
            REQUIRE(generate_dv(e, &g, ids, n, k, N, spec, &st) == 0);
            CHECK_MSG(memcmp(plain, spec, sizeof plain) == 0, "%s k=%d: half draft vocabulary changed the output", golden_models[m], k);
            CHECK(st.drafts > 0 && st.accepted <= st.drafts);
            /* none of the output's tokens: no draft can be accepted, and the output is the same */
            n = 0;
            for (int32_t i = 0; i < V; i++) if (!used[i]) ids[n++] = i;
            REQUIRE(generate_dv(e, &g, ids, n, k, N, spec, &st) == 0);
            CHECK_MSG(memcmp(plain, spec, sizeof plain) == 0, "%s k=%d: disjoint draft vocabulary changed the output", golden_models[m], k);
            CHECK(st.drafts > 0);
            CHECK_EQ_INT(st.accepted, 0);
            CHECK_EQ_INT(st.steps, N - 1); /* one token per step */
        }
        free(ids);
        free(used);
        q35_engine_free(e);
        golden_free(&g);
    }
}

static int32_t record_hook(void *ctx, int32_t pos, int32_t proposed) {
    (void)pos;
    *(int32_t *)ctx = proposed;
    return proposed;
}

/* One step from the same state with the full and with a reduced head (100
 * rows, not a whole number of bfp panels): the reduced draft logits are the
 * full ones at those ids, and the draft is their argmax. */
static void check_restricted_argmax(q35_engine *e, const golden *gp) {
    const golden g = *gp;
    const int32_t V = g.vocab_size;
    q35_error err;
    int32_t ids[100], n = 0;
    for (int32_t i = 0; i < V && n < 100; i += 2) ids[n++] = V - 1 - i; /* descending; the engine sorts them */
    float *full = malloc(sizeof(float) * (size_t)V), *sub = malloc(sizeof(float) * (size_t)n);
    int32_t proposed[2] = {-1, -1};
    int64_t bytes_full = q35_engine_info(e)->mtp_bytes_per_draft;
    for (int pass = 0; pass < 2; pass++) {
        if (pass) REQUIRE(q35_engine_set_draft_vocab(e, ids, n, &err) == Q35_OK);
        CHECK_EQ_INT(q35_engine_draft_vocab(e), pass ? n : V);
        q35_session *s;
        REQUIRE(q35_session_new(e, 64, &s, &err) == Q35_OK);
        REQUIRE(q35_session_set_spec(s, 1, &err) == Q35_OK);
        s->draft_hook = record_hook;
        s->draft_hook_ctx = &proposed[pass];
        CHECK(q35_session_eval(s, g.prompt_ids, 12, NULL, 0, &err) == Q35_OK);
        int32_t out[Q35_SPEC_K_MAX + 1];
        q35_generation *gen = test_gen_after(s, NULL, g.prompt_ids[12]);
        REQUIRE(test_gen_step(gen, out) > 0);
        q35_generation_free(gen);
        memcpy(pass ? sub : full, s->draft_logits, sizeof(float) * (size_t)(pass ? n : V));
        q35_session_free(s);
    }
    CHECK(q35_engine_info(e)->mtp_bytes_per_draft < bytes_full);
    /* row i of the reduced head is the i-th smallest id: bit for bit the full head's logit */
    int32_t best = -1;
    for (int32_t i = 0; i < n; i++) {
        int32_t id = V - 1 - 2 * (n - 1 - i);
        CHECK_MSG(sub[i] == full[id], "draft logit of token %d: %g reduced, %g full", id, sub[i], full[id]);
        if (best < 0 || full[id] > full[best]) best = id;
    }
    CHECK_EQ_INT(proposed[1], best);
    CHECK_EQ_INT(proposed[0], q35_argmax(full, V));
    REQUIRE(q35_engine_set_draft_vocab(e, NULL, 0, &err) == Q35_OK);
    CHECK_EQ_INT(q35_engine_draft_vocab(e), V);
    CHECK_EQ_INT(q35_engine_info(e)->mtp_bytes_per_draft, bytes_full);
    free(full); free(sub);
}

TEST(spec, draft_vocab_restricts_the_draft_argmax_exactly) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    check_restricted_argmax(e, &g);
    q35_engine_free(e);
    /* a weight cache: lm_head in bfp8 panels, moved row by row */
    char out[4096];
    snprintf(out, sizeof out, "%s/cache", q35_test_tmpdir());
    q35_prepare_params p = {.checkpoint = g.model_dir, .out_dir = out, .policy = Q35_POLICY_DEFAULT};
    q35_error err = {0};
    REQUIRE_MSG(q35_prepare(&p, &err) == Q35_OK, "%s", err.msg);
    REQUIRE_MSG(q35_engine_load(out, NULL, &e, &err) == Q35_OK, "%s", err.msg);
    CHECK_EQ_INT(e->w.lm_head.dtype, Q35_DT_BFP8);
    check_restricted_argmax(e, &g);
    q35_engine_free(e);
    golden_free(&g);
}

TEST(spec, draft_vocab_bad_input) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size;
    q35_error err;
    int32_t *ids = NULL, n = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/dv.txt", q35_test_tmpdir());
    /* missing file */
    CHECK(q35_draft_vocab_load("/nonexistent/dv.txt", V, &ids, &n, &err) == Q35_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/dv.txt") != NULL);
    static const struct { const char *text, *want; } bad[] = {
        {"", "no token ids"},
        {"# only a comment\n\n", "no token ids"},
        {"1\n2\nabc\n", ":3: expected a token id"},
        {"1 2x\n", ":1: expected a token id"},
        {"-1\n", "expected a token id"},
        {"1\n320\n", ":2: token id 320 is outside the vocabulary [0, 320)"},
        {"99999999999999999999999\n", "outside the vocabulary"},
        {"5\n6, 5\n", ":2: token id 5 is listed twice"},
        {"1\n2\0003\n", "NUL byte"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        size_t len = strlen(bad[i].text);
        if (strstr(bad[i].want, "NUL")) len = 7;
        REQUIRE(test_spit(path, bad[i].text, len) == 0);
        CHECK_MSG(q35_draft_vocab_load(path, V, &ids, &n, &err) == Q35_ERR_FORMAT, "case %zu loaded", i);
        CHECK_MSG(strstr(err.msg, bad[i].want) != NULL, "case %zu: '%s' does not say '%s'", i, err.msg, bad[i].want);
        CHECK(ids == NULL);
    }
    /* the format qwen35 draft-vocab writes */
    const char good[] = "# qwen35 draft vocabulary\n7\n3\n  11 # a comment\r\n0,1\n";
    REQUIRE(test_spit(path, good, strlen(good)) == 0);
    REQUIRE(q35_draft_vocab_load(path, V, &ids, &n, &err) == Q35_OK);
    CHECK_EQ_INT(n, 5);
    CHECK(ids[0] == 7 && ids[1] == 3 && ids[2] == 11 && ids[3] == 0 && ids[4] == 1);
    CHECK(q35_engine_set_draft_vocab(e, ids, n, &err) == Q35_OK);
    free(ids);
    /* the API checks too, and a failed call keeps the previous head */
    int32_t dup[3] = {4, 9, 4}, out_of_range[2] = {1, 320}, neg[1] = {-2};
    CHECK(q35_engine_set_draft_vocab(e, dup, 3, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "twice") != NULL);
    CHECK(q35_engine_set_draft_vocab(e, out_of_range, 2, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "outside the vocabulary") != NULL);
    CHECK(q35_engine_set_draft_vocab(e, neg, 1, &err) == Q35_ERR_ARG);
    CHECK(q35_engine_set_draft_vocab(e, NULL, 3, &err) == Q35_ERR_ARG);
    CHECK(q35_engine_set_draft_vocab(e, dup, V + 1, &err) == Q35_ERR_ARG);
    CHECK_EQ_INT(q35_engine_draft_vocab(e), 5);
    q35_engine_free(e);
    golden_free(&g);
}

/* ---- the sampler's distribution, as speculative sampling uses it ---- */

TEST(spec, sampler_probs_is_the_distribution_the_sampler_draws_from) {
    enum { V = 64, N = 40000 };
    float logits[V], probs[V], row[V];
    uint64_t x = 99;
    for (int i = 0; i < V; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        logits[i] = (float)((x >> 40) % 1000) / 250.0f;
    }
    const int32_t prompt[3] = {1, 2, 3}, before[2] = {4, 5}, prev[3] = {6, 4, 7};
    q35_sampler_params cases[] = {
        {.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 5},
        {.temperature = 0.7f, .top_k = 20, .top_p = 0.9f, .min_p = 0.05f, .presence_penalty = 0.5f,
         .frequency_penalty = 0.3f, .repetition_penalty = 1.3f, .seed = 6},
        {.temperature = 0.0f, .top_p = 1.0f, .presence_penalty = 2.0f, .repetition_penalty = 1.0f, .seed = 7},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        q35_error err;
        q35_sampler *a, *b;
        REQUIRE(q35_sampler_new(&cases[c], V, &a, &err) == Q35_OK && q35_sampler_new(&cases[c], V, &b, &err) == Q35_OK);
        q35_sampler_set_prompt(a, prompt, 3);
        q35_sampler_set_prompt(b, prompt, 3);
        for (int i = 0; i < 2; i++) { q35_sampler_accept(a, before[i]); q35_sampler_accept(b, before[i]); }
        /* a: probs with prev counted; b: prev really accepted, then draws */
        q35_sampler_probs(a, logits, prev, 3, probs);
        for (int i = 0; i < 3; i++) q35_sampler_accept(b, prev[i]);
        double sum = 0, exact[V];
        for (int i = 0; i < V; i++) { sum += probs[i]; exact[i] = probs[i]; }
        CHECK_NEAR(sum, 1.0, 1e-5);
        int counts[V] = {0};
        for (int t = 0; t < N; t++) {
            memcpy(row, logits, sizeof row);
            counts[q35_sampler_sample(b, row)]++;
        }
        for (int i = 0; i < V; i++) /* nothing outside the support is ever drawn */
            CHECK_MSG(probs[i] > 0 || counts[i] == 0, "case %zu: token %d drawn %d times with probability 0", c, i, counts[i]);
        if (cases[c].temperature == 0) {
            for (int i = 0; i < V; i++) CHECK(probs[i] == (counts[i] ? 1.0f : 0.0f));
        } else {
            int dof;
            double stat = chi_square(counts, exact, V, N, &dof);
            double z = 3.719, h = 2.0 / (9.0 * dof), crit = dof * pow(1 - h + z * sqrt(h), 3);
            CHECK_MSG(stat < crit, "case %zu: draws do not follow q35_sampler_probs: chi2 %.1f >= %.1f (dof %d)", c, stat, crit, dof);
        }
        /* probs left the sampler as it was: a's draws equal a fresh twin's */
        q35_sampler *t;
        REQUIRE(q35_sampler_new(&cases[c], V, &t, &err) == Q35_OK);
        q35_sampler_set_prompt(t, prompt, 3);
        for (int i = 0; i < 2; i++) q35_sampler_accept(t, before[i]);
        for (int i = 0; i < 50; i++) {
            float r1[V], r2[V];
            memcpy(r1, logits, sizeof r1);
            memcpy(r2, logits, sizeof r2);
            CHECK_EQ_INT(q35_sampler_sample(a, r1), q35_sampler_sample(t, r2));
        }
        q35_sampler_free(a); q35_sampler_free(b); q35_sampler_free(t);
    }
}
