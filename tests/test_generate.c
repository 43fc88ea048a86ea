/* Tests of the generation API (q35_generation): greedy output as the old
 * step gives it, the same tokens as the sampler alone where the draws are
 * the same, the logits hook (also against forced drafts), each stop
 * condition, batched equal to single steps, the engine's EOS list, and
 * prefix reuse with q35_session_sync. */
#include "golden.h"
#include "helpers.h"
#include "qwen35.h"
#include "core/session.h"
#include "test.h"

#include <jansson.h>
#include <math.h>


/* A session with speculation k that has evaluated the first n_prompt
 * prompt tokens; logits receives the last row. */
static q35_session *prompted(q35_engine *e, const golden *g, int32_t k, int32_t n_ctx, int32_t n_prompt, float *logits) {
    q35_error err;
    q35_session *s = NULL;
    if (q35_session_new(e, n_ctx, &s, &err) || q35_session_set_spec(s, k, &err) ||
        q35_session_eval(s, g->prompt_ids, n_prompt, logits, 0, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        q35_session_free(s);
        return NULL;
    }
    return s;
}

/* Runs a generation to its end (or n tokens); returns the token count and
 * the stop reason in *stop. */
static int32_t run_gen(q35_session *s, const q35_gen_params *p, const float *logits, int32_t n, int32_t *out, int32_t *stop) {
    q35_error err;
    q35_generation *gen;
    if (q35_generation_new(s, p, &gen, &err)) { q35_test_fail(__FILE__, __LINE__, "%s", err.msg); return -1; }
    q35_gen_out o;
    int32_t got = 0;
    q35_status st = q35_generation_begin(gen, logits, &o, &err);
    while (!st) {
        for (int32_t i = 0; i < o.n_tokens && got < n; i++) out[got++] = o.tokens[i];
        if (o.stop || got >= n) break;
        st = q35_generation_step(gen, &o, &err);
    }
    if (st) q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
    *stop = o.stop;
    int32_t n_gen;
    const int32_t *toks = q35_generation_tokens(gen, &n_gen);
    if (!st && o.stop && (n_gen != got || memcmp(toks, out, sizeof(int32_t) * (size_t)got)))
        q35_test_fail(__FILE__, __LINE__, "q35_generation_tokens is not what the calls returned");
    q35_generation_free(gen);
    return st ? -1 : got;
}

static q35_sampler *sampler_of(q35_sampler_params sp, int32_t V, const int32_t *prompt, int32_t n_prompt) {
    q35_error err;
    q35_sampler *sm = NULL;
    if (q35_sampler_new(&sp, V, &sm, &err)) { q35_test_fail(__FILE__, __LINE__, "%s", err.msg); return NULL; }
    q35_sampler_set_prompt(sm, prompt, n_prompt);
    return sm;
}

/* Plain greedy decoding, one q35_session_eval per token, from the token
 * `first` chosen after the prompt: the reference every speculative path
 * must equal. lg is scratch (vocab floats). */
static void plain_greedy(q35_session *s, int32_t first, int32_t n, int32_t *out, float *lg) {
    q35_error err;
    const int32_t V = q35_engine_info(s->engine)->vocab_size;
    out[0] = first;
    for (int32_t got = 1; got < n; got++) {
        if (q35_session_eval(s, &out[got - 1], 1, lg, 0, &err)) { q35_test_fail(__FILE__, __LINE__, "%s", err.msg); return; }
        out[got] = q35_argmax(lg, V);
    }
}

/* The expected output itself as drafts. */
static int32_t exact_hook(void *ctx, int32_t pos, int32_t proposed) {
    oracle *o = ctx;
    int32_t i = pos - o->base;
    return i >= 0 && i < o->n ? o->seq[i] : proposed;
}

TEST(generate, greedy_equals_plain_decoding_with_any_drafts) {
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        q35_engine *e = golden_engine(golden_models[m], &g);
        REQUIRE(e);
        enum { N = 40 };
        const int32_t V = g.vocab_size;
        float *lg = malloc(sizeof(float) * (size_t)V);
        int32_t old[N], now[N], stop;
        q35_session *s = prompted(e, &g, 0, 256, g.n_prompt, lg);
        REQUIRE(s);
        plain_greedy(s, q35_argmax(lg, V), N, old, lg);
        q35_session_free(s);
        for (int i = 0; i < g.n_greedy && i < N; i++) CHECK_EQ_INT(old[i], g.greedy_ids[i]);
        q35_gen_params p = {.ignore_eos = 1};
        for (int32_t k = 0; k <= 3; k++) {
            for (int hooked = 0; hooked < 2; hooked++) {
                s = prompted(e, &g, k, 256, g.n_prompt, lg);
                REQUIRE(s);
                oracle o = {old, g.n_prompt, N};
                if (hooked) { s->draft_hook = oracle_hook; s->draft_hook_ctx = &o; }
                CHECK_EQ_INT(run_gen(s, &p, lg, N, now, &stop), N);
                CHECK_MSG(memcmp(old, now, sizeof old) == 0, "%s k=%d hooked=%d: the generation differs from plain greedy decoding",
                          golden_models[m], k, hooked);
                CHECK_EQ_INT(stop, Q35_STOP_NONE);
                if (k) CHECK(q35_session_spec_stats(s).drafts > 0);
                q35_session_free(s);
            }
            /* a sampler at temperature 0 without penalties is greedy too */
            q35_sampler *sm = sampler_of((q35_sampler_params){.top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 1}, V, NULL, 0);
            s = prompted(e, &g, k, 256, g.n_prompt, lg);
            REQUIRE(s && sm);
            q35_gen_params ps = {.sampler = sm, .ignore_eos = 1};
            CHECK_EQ_INT(run_gen(s, &ps, lg, N, now, &stop), N);
            CHECK_MSG(memcmp(old, now, sizeof old) == 0, "%s k=%d: a temperature-0 sampler changed the output", golden_models[m], k);
            q35_sampler_free(sm);
            q35_session_free(s);
        }
        free(lg);
        q35_engine_free(e);
        golden_free(&g);
    }
}

static const q35_sampler_params penalised = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .min_p = 0.01f,
                                             .presence_penalty = 0.3f, .frequency_penalty = 0.2f,
                                             .repetition_penalty = 1.1f, .seed = 77};

/* Without drafts a generation draws exactly as q35_sampler_sample does
 * token by token, so with the same seed the tokens are the same. */
TEST(generate, sampled_without_drafts_equals_the_sampler_token_by_token) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    enum { N = 40 };
    const int32_t V = g.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t ref[N], now[N], stop;
    q35_error err;
    const q35_sampler_params cases[2] = {penalised, {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 3}};
    for (int c = 0; c < 2; c++) {
        q35_session *s = prompted(e, &g, 0, 256, 16, lg);
        q35_sampler *sm = sampler_of(cases[c], V, g.prompt_ids, 16);
        REQUIRE(s && sm);
        for (int32_t i = 0; i < N; i++) {
            ref[i] = q35_sampler_sample(sm, lg);
            q35_sampler_accept(sm, ref[i]);
            REQUIRE(q35_session_eval(s, &ref[i], 1, lg, 0, &err) == Q35_OK);
        }
        q35_sampler_free(sm);
        q35_session_free(s);
        /* spec off, and spec on with drafting switched off for the generation */
        for (int32_t k = 0; k <= 2; k += 2) {
            s = prompted(e, &g, k, 256, 16, lg);
            sm = sampler_of(cases[c], V, g.prompt_ids, 16);
            REQUIRE(s && sm);
            q35_gen_params p = {.sampler = sm, .ignore_eos = 1, .max_drafts = k ? -1 : 0};
            CHECK_EQ_INT(run_gen(s, &p, lg, N, now, &stop), N);
            CHECK_MSG(memcmp(ref, now, sizeof ref) == 0, "case %d k=%d: the generation's draws differ from the sampler's", c, k);
            CHECK_EQ_INT(q35_session_spec_stats(s).drafts, 0);
            q35_sampler_free(sm);
            q35_session_free(s);
        }
    }
    free(lg);
    q35_engine_free(e);
    golden_free(&g);
}

/* ---- the logits hook ---- */

/* Bans the token generated last (no immediate repeats) and every id that
 * is 1 mod 5; counts its calls. */
typedef struct { int calls; } ban;
static void ban_hook(void *ctx, float *logits, int32_t n_vocab, const int32_t *prev, int32_t n_prev) {
    ((ban *)ctx)->calls++;
    for (int32_t v = 1; v < n_vocab; v += 5) logits[v] = -INFINITY;
    if (n_prev > 0) logits[prev[n_prev - 1]] = -INFINITY;
}
static int banned(const int32_t *toks, int32_t i) { return toks[i] % 5 == 1 || (i > 0 && toks[i] == toks[i - 1]); }

/* Forces every draft to a banned token: at odd positions one that is 1
 * mod 5; at even ones, with seq (the expected output), the token before
 * again. */
typedef struct { const int32_t *seq; int32_t base; } forcer;
static int32_t force_banned(void *ctx, int32_t pos, int32_t proposed) {
    const forcer *f = ctx;
    int32_t i = pos - f->base;
    if (pos % 2 || !f->seq) return 1 + 5 * (pos % 7);
    return i > 0 ? f->seq[i - 1] : proposed;
}

TEST(generate, a_masked_token_is_never_emitted_even_by_forced_drafts) {
    golden g;
    q35_engine *e = golden_engine("tiny-c", &g);
    REQUIRE(e);
    enum { N = 48 };
    const int32_t V = g.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V), *row = malloc(sizeof(float) * (size_t)V);
    int32_t ref[N], now[N], stop;
    q35_error err;
    /* the reference: plain decode, the hook applied by hand, greedy */
    q35_session *s = prompted(e, &g, 0, 256, g.n_prompt, lg);
    REQUIRE(s);
    ban b = {0};
    for (int32_t i = 0; i < N; i++) {
        memcpy(row, lg, sizeof(float) * (size_t)V);
        ban_hook(&b, row, V, ref, i);
        ref[i] = q35_argmax(row, V);
        CHECK(!banned(ref, i));
        REQUIRE(q35_session_eval(s, &ref[i], 1, lg, 0, &err) == Q35_OK);
    }
    q35_session_free(s);
    for (int32_t k = 0; k <= 3; k++) {
        /* drafts: the MTP's, forced to banned tokens, or the expected output itself (all accepted) */
        for (int forced = 0; forced < 3; forced++) {
            s = prompted(e, &g, k, 256, g.n_prompt, lg);
            REQUIRE(s);
            forcer f = {ref, g.n_prompt};
            oracle o = {ref, g.n_prompt, N};
            if (forced == 1) { s->draft_hook = force_banned; s->draft_hook_ctx = &f; }
            if (forced == 2) { s->draft_hook = exact_hook; s->draft_hook_ctx = &o; }
            b.calls = 0;
            q35_gen_params p = {.logits_fn = ban_hook, .logits_ctx = &b, .ignore_eos = 1};
            CHECK_EQ_INT(run_gen(s, &p, lg, N, now, &stop), N);
            CHECK_MSG(memcmp(ref, now, sizeof ref) == 0, "k=%d forced=%d: greedy output under the hook changed", k, forced);
            CHECK(b.calls >= N);
            q35_spec_stats st = q35_session_spec_stats(s);
            if (k && forced == 1) CHECK_EQ_INT(st.accepted, 0); /* a banned draft is never accepted */
            if (k && forced == 2) CHECK_EQ_INT(st.accepted, st.drafts);
            if (k) CHECK(st.drafts > 0);
            q35_session_free(s);
        }
    }
    /* sampled, temperature 1 (the banned tokens have real mass), drafts forced to banned tokens */
    for (int32_t k = 0; k <= 2; k += 2) {
        s = prompted(e, &g, k, 256, g.n_prompt, lg);
        q35_sampler *sm = sampler_of((q35_sampler_params){.temperature = 1.5f, .top_p = 1.0f, .repetition_penalty = 1.0f,
                                                          .seed = 11}, V, NULL, 0);
        REQUIRE(s && sm);
        forcer f = {NULL, g.n_prompt};
        s->draft_hook = force_banned;
        s->draft_hook_ctx = &f;
        enum { M = 120 };
        int32_t out[M];
        q35_gen_params p = {.sampler = sm, .logits_fn = ban_hook, .logits_ctx = &b, .ignore_eos = 1};
        CHECK_EQ_INT(run_gen(s, &p, lg, M, out, &stop), M);
        for (int32_t i = 0; i < M; i++) CHECK_MSG(!banned(out, i), "k=%d: token %d (%d) is banned", k, i, out[i]);
        if (k) CHECK(q35_session_spec_stats(s).drafts > 0);
        if (k) CHECK_EQ_INT(q35_session_spec_stats(s).accepted, 0);
        q35_sampler_free(sm);
        q35_session_free(s);
    }
    free(lg);
    free(row);
    q35_engine_free(e);
    golden_free(&g);
}

/* ---- stop conditions ---- */

TEST(generate, each_stop_condition_ends_or_continues_generation) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size, *ref = g.greedy_ids, n_ref = g.n_greedy; /* greedy: 1, 239, 161, 146, 103, ... */
    REQUIRE(n_ref >= 24);
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t out[64], stop, n;
    /* the first occurrence of a token */
    int32_t at = -1, id = ref[4];
    for (int32_t i = 0; i < n_ref && at < 0; i++) if (ref[i] == id) at = i;
    REQUIRE(at == 4);
    for (int32_t k = 0; k <= 3; k += 3) {
        /* an extra EOS id: stops at its first occurrence, the EOS the last token */
        q35_session *s = prompted(e, &g, k, 256, g.n_prompt, lg);
        REQUIRE(s);
        q35_gen_params p = {.eos_ids = &id, .n_eos_ids = 1};
        n = run_gen(s, &p, lg, 64, out, &stop);
        CHECK_EQ_INT(n, at + 1);
        CHECK_EQ_INT(stop, Q35_STOP_EOS);
        CHECK(memcmp(out, ref, sizeof(int32_t) * (size_t)(at + 1)) == 0);
        q35_session_free(s);
        /* ignore_eos: it goes on, to max_tokens, which ends it even mid-step */
        s = prompted(e, &g, k, 256, g.n_prompt, lg);
        p = (q35_gen_params){.eos_ids = &id, .n_eos_ids = 1, .ignore_eos = 1, .max_tokens = 11};
        n = run_gen(s, &p, lg, 64, out, &stop);
        CHECK_EQ_INT(n, 11);
        CHECK_EQ_INT(stop, Q35_STOP_LENGTH);
        CHECK(memcmp(out, ref, sizeof(int32_t) * 11) == 0);
        q35_session_free(s);
        /* a stop id ends it as such, also with ignore_eos */
        s = prompted(e, &g, k, 256, g.n_prompt, lg);
        p = (q35_gen_params){.stop_ids = &id, .n_stop_ids = 1, .ignore_eos = 1};
        n = run_gen(s, &p, lg, 64, out, &stop);
        CHECK_EQ_INT(n, at + 1);
        CHECK_EQ_INT(stop, Q35_STOP_TOKEN);
        q35_session_free(s);
        /* min_tokens: the EOS id is masked for the first 8 tokens, so the output leaves the reference at
         * index 4 (a plain decode with that token masked by hand says which), then stops at an EOS or goes on */
        s = prompted(e, &g, 0, 256, g.n_prompt, lg);
        int32_t want[24];
        q35_error err;
        float *row = malloc(sizeof(float) * (size_t)V);
        memcpy(row, lg, sizeof(float) * (size_t)V);
        for (int32_t i = 0; i < 24; i++) {
            if (i < 8) row[id] = -INFINITY;
            want[i] = q35_argmax(row, V);
            REQUIRE(q35_session_eval(s, &want[i], 1, row, 0, &err) == Q35_OK);
        }
        free(row);
        q35_session_free(s);
        int32_t want_n = 24;
        for (int32_t i = 8; i < 24; i++) if (want[i] == id) { want_n = i + 1; break; }
        s = prompted(e, &g, k, 256, g.n_prompt, lg);
        p = (q35_gen_params){.eos_ids = &id, .n_eos_ids = 1, .min_tokens = 8, .max_tokens = 24};
        n = run_gen(s, &p, lg, 64, out, &stop);
        CHECK_EQ_INT(n, want_n);
        CHECK_EQ_INT(stop, want_n < 24 ? Q35_STOP_EOS : Q35_STOP_LENGTH);
        CHECK(memcmp(out, want, sizeof(int32_t) * (size_t)n) == 0);
        for (int32_t i = 0; i < 8 && i < n; i++) CHECK(out[i] != id);
        CHECK(want[4] != id);
        q35_session_free(s);
        /* min_tokens masks stop ids as well */
        s = prompted(e, &g, k, 256, g.n_prompt, lg);
        p = (q35_gen_params){.stop_ids = &id, .n_stop_ids = 1, .min_tokens = 8, .max_tokens = 24};
        n = run_gen(s, &p, lg, 64, out, &stop);
        CHECK_EQ_INT(n, want_n);
        CHECK(memcmp(out, want, sizeof(int32_t) * (size_t)n) == 0);
        q35_session_free(s);
        /* the context: a 12-position session after an 8-token prompt feeds 4 more tokens and chooses a fifth */
        s = prompted(e, &g, k, 12, 8, lg);
        p = (q35_gen_params){.ignore_eos = 1};
        n = run_gen(s, &p, lg, 64, out, &stop);
        CHECK_EQ_INT(n, 5);
        CHECK_EQ_INT(stop, Q35_STOP_CONTEXT);
        CHECK_EQ_INT(q35_session_pos(s), 12);
        q35_session_free(s);
    }
    /* the engine's own EOS id stops a generation unless ignored; a stopped one steps no more */
    int32_t n_eos;
    const int32_t *eos = q35_engine_eos_ids(e, &n_eos);
    REQUIRE(n_eos == 1 && eos[0] == 319);
    q35_session *s = prompted(e, &g, 0, 256, g.n_prompt, lg);
    q35_error err;
    q35_generation *gen;
    REQUIRE(q35_generation_new(s, NULL, &gen, &err) == Q35_OK);
    float *forced = malloc(sizeof(float) * (size_t)V);
    for (int32_t v = 0; v < V; v++) forced[v] = v == 319 ? 1.0f : 0.0f;
    q35_gen_out o;
    CHECK(q35_generation_begin(gen, forced, &o, &err) == Q35_OK);
    CHECK(o.n_tokens == 1 && o.tokens[0] == 319 && o.stop == Q35_STOP_EOS);
    CHECK_EQ_INT(q35_generation_stop(gen), Q35_STOP_EOS);
    CHECK(q35_generation_step(gen, &o, &err) == Q35_ERR_ARG);
    CHECK(q35_generation_begin(gen, forced, &o, &err) == Q35_ERR_ARG);
    q35_generation_free(gen);
    /* bad arguments */
    int32_t bad = V;
    q35_gen_params p = {.stop_ids = &bad, .n_stop_ids = 1};
    CHECK(q35_generation_new(s, &p, &gen, &err) == Q35_ERR_ARG);
    q35_sampler *sm = sampler_of(penalised, V + 1, NULL, 0);
    p = (q35_gen_params){.sampler = sm};
    CHECK(q35_generation_new(s, &p, &gen, &err) == Q35_ERR_ARG);
    REQUIRE(q35_generation_new(s, NULL, &gen, &err) == Q35_OK);
    CHECK(q35_generation_step(gen, &o, &err) == Q35_ERR_ARG); /* not begun */
    q35_generation_free(gen);
    q35_sampler_free(sm);
    free(forced);
    q35_session_free(s);
    free(lg);
    q35_engine_free(e);
    golden_free(&g);
}

/* ---- batched steps ---- */

TEST(generate, batch_step_equals_single_generation_steps) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    enum { NS = 4, STEPS = 14 };
    const int32_t V = g.vocab_size;
    const int32_t ks[NS] = {0, 1, 3, 2};
    float *lg = malloc(sizeof(float) * (size_t)V);
    q35_session *s[2][NS];
    q35_sampler *sm[2][NS];
    q35_generation *gen[2][NS];
    q35_gen_out o[2][NS];
    q35_error err;
    ban b = {0};
    int32_t stop_id = 7;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < NS; i++) {
            s[c][i] = prompted(e, &g, ks[i], 128, 10 + i, lg);
            REQUIRE(s[c][i]);
            q35_sampler_params sp = penalised;
            sp.seed = 100 + (uint64_t)i;
            sm[c][i] = i % 2 ? sampler_of(sp, V, g.prompt_ids, 10 + i) : NULL; /* 1 and 3 sample, 0 and 2 are greedy */
            q35_gen_params p = {.sampler = sm[c][i], .ignore_eos = 1, .max_tokens = 30 + 3 * i};
            if (i >= 2) { p.logits_fn = ban_hook; p.logits_ctx = &b; p.stop_ids = &stop_id; p.n_stop_ids = 1; }
            REQUIRE(q35_generation_new(s[c][i], &p, &gen[c][i], &err) == Q35_OK);
            REQUIRE(q35_generation_begin(gen[c][i], lg, &o[c][i], &err) == Q35_OK);
        }
    for (int step = 0; step < STEPS; step++) {
        q35_generation *live[NS];
        int idx[NS], n = 0;
        for (int i = 0; i < NS; i++) if (!o[0][i].stop) { idx[n] = i; live[n++] = gen[0][i]; }
        if (!n) break;
        q35_gen_out batch[NS];
        REQUIRE(q35_generation_batch_step(live, n, batch, &err) == Q35_OK);
        for (int j = 0; j < n; j++) {
            int i = idx[j];
            o[0][i] = batch[j];
            REQUIRE(q35_generation_step(gen[1][i], &o[1][i], &err) == Q35_OK);
            CHECK_EQ_INT(o[0][i].n_tokens, o[1][i].n_tokens);
            CHECK_EQ_INT(o[0][i].stop, o[1][i].stop);
            CHECK(memcmp(o[0][i].tokens, o[1][i].tokens, sizeof(int32_t) * (size_t)o[1][i].n_tokens) == 0);
        }
    }
    for (int i = 0; i < NS; i++) {
        int32_t na, nb;
        const int32_t *ta = q35_generation_tokens(gen[0][i], &na), *tb = q35_generation_tokens(gen[1][i], &nb);
        CHECK_EQ_INT(na, nb);
        CHECK(na > STEPS && memcmp(ta, tb, sizeof(int32_t) * (size_t)na) == 0);
        q35_spec_stats x = q35_session_spec_stats(s[0][i]), y = q35_session_spec_stats(s[1][i]);
        CHECK_EQ_INT(x.drafts, y.drafts);
        CHECK_EQ_INT(x.accepted, y.accepted);
        for (int c = 0; c < 2; c++) {
            q35_generation_free(gen[c][i]);
            q35_sampler_free(sm[c][i]);
            q35_session_free(s[c][i]);
        }
    }
    free(lg);
    q35_engine_free(e);
    golden_free(&g);
}

/* The hook of a chained draft row sees the drafts before it: every call is
 * logged with its last prev token, and every draft after the first of a
 * step must have had a call whose prev ends with the draft before it. */
typedef struct { int32_t n, n_prev[4096], tail[4096]; } hook_log;
static void log_hook(void *ctx, float *logits, int32_t n_vocab, const int32_t *prev, int32_t n_prev) {
    (void)logits; (void)n_vocab;
    hook_log *l = ctx;
    if (l->n < 4096) { l->n_prev[l->n] = n_prev; l->tail[l->n] = n_prev ? prev[n_prev - 1] : -1; l->n++; }
}
typedef struct { int32_t n, pos[1024], tok[1024]; } draft_log;
static int32_t log_draft(void *ctx, int32_t pos, int32_t proposed) {
    draft_log *l = ctx;
    if (l->n < 1024) { l->pos[l->n] = pos; l->tok[l->n] = proposed; l->n++; }
    return proposed;
}

TEST(generate, the_hook_of_a_draft_row_sees_the_drafts_before_it) {
    golden g;
    q35_engine *e = golden_engine("tiny-b", &g);
    REQUIRE(e);
    const int32_t V = g.vocab_size, n_prompt = 12;
    float *lg = malloc(sizeof(float) * (size_t)V);
    int32_t out[40], stop;
    for (int sampled = 0; sampled < 2; sampled++) {
        q35_session *s = prompted(e, &g, 3, 256, n_prompt, lg);
        q35_sampler *sm = sampled ? sampler_of(penalised, V, NULL, 0) : NULL;
        REQUIRE(s);
        hook_log *hl = calloc(1, sizeof *hl);
        draft_log *dl = calloc(1, sizeof *dl);
        s->draft_hook = log_draft;
        s->draft_hook_ctx = dl;
        q35_gen_params p = {.sampler = sm, .logits_fn = log_hook, .logits_ctx = hl, .ignore_eos = 1};
        CHECK_EQ_INT(run_gen(s, &p, lg, 40, out, &stop), 40);
        int32_t chained = 0;
        for (int32_t i = 1; i < dl->n; i++) {
            if (dl->pos[i] != dl->pos[i - 1] + 1) continue; /* the first draft of a step */
            int found = 0;
            for (int32_t c = 0; c < hl->n && !found; c++)
                found = hl->n_prev[c] == dl->pos[i] - n_prompt && hl->tail[c] == dl->tok[i - 1];
            CHECK_MSG(found, "sampled=%d: no hook call saw draft %d before position %d", sampled, dl->tok[i - 1], dl->pos[i]);
            chained++;
        }
        CHECK(chained > 10);
        free(hl);
        free(dl);
        q35_sampler_free(sm);
        q35_session_free(s);
    }
    free(lg);
    q35_engine_free(e);
    golden_free(&g);
}

/* More verify rows than one forward pass holds (20 generations of k = 8:
 * 180 rows): the batch takes several passes, and each generation still
 * gets what it gets alone. */
TEST(generate, a_batch_larger_than_a_pass_equals_single_steps) {
    golden g;
    q35_engine *e = golden_engine("tiny-a", &g);
    REQUIRE(e);
    enum { NS = 20, STEPS = 3 };
    const int32_t V = g.vocab_size;
    float *lg = malloc(sizeof(float) * (size_t)V);
    q35_session *s[2][NS];
    q35_generation *gen[2][NS];
    q35_gen_out o[2][NS];
    q35_error err;
    for (int c = 0; c < 2; c++)
        for (int i = 0; i < NS; i++) {
            REQUIRE((s[c][i] = prompted(e, &g, 8, 64, 4 + i, lg)));
            q35_gen_params p = {.ignore_eos = 1};
            REQUIRE(q35_generation_new(s[c][i], &p, &gen[c][i], &err) == Q35_OK);
            REQUIRE(q35_generation_begin(gen[c][i], lg, &o[c][i], &err) == Q35_OK);
        }
    for (int step = 0; step < STEPS; step++) {
        REQUIRE(q35_generation_batch_step(gen[0], NS, o[0], &err) == Q35_OK);
        for (int i = 0; i < NS; i++) {
            REQUIRE(q35_generation_step(gen[1][i], &o[1][i], &err) == Q35_OK);
            CHECK_EQ_INT(o[0][i].n_tokens, o[1][i].n_tokens);
            CHECK(memcmp(o[0][i].tokens, o[1][i].tokens, sizeof(int32_t) * (size_t)o[1][i].n_tokens) == 0);
        }
    }
    for (int i = 0; i < NS; i++) {
        CHECK_EQ_INT(q35_session_pos(s[0][i]), q35_session_pos(s[1][i]));
        CHECK_EQ_INT(q35_session_spec_stats(s[0][i]).drafts, 8 * STEPS);
        for (int c = 0; c < 2; c++) {
            q35_generation_free(gen[c][i]);
            q35_session_free(s[c][i]);
        }
    }
    free(lg);
    q35_engine_free(e);
    golden_free(&g);
}
