/* test_sched.c: the server's scheduler (src/server/sched.c) driven without
 * HTTP on the tiny models: tasks are parsed and prepared by the server's own
 * request.c and prompt.c, submitted, and their events checked against plain
 * greedy decoding on a fresh session. The tiny models have no tokenizer, so
 * each token's text is "<id>". */
#include "base/util.h"
#include "golden.h"
#include "qwen35.h"
#include "server/prefix_cache.h"
#include "server/prompt.h"
#include "server/request.h"
#include "server/sched.h"
#include "test.h"

#include <time.h>

enum { N_CTX = 4096 };

typedef struct fixture {
    golden g;
    q35_engine *e;
    q35_sched *s;
    q35_metrics m;
    q35_api_limits lim;
} fixture;

static int fx_start(fixture *f, const char *model, int parallel, int max_queue, size_t cache_bytes, int32_t spec_k) {
    memset(f, 0, sizeof *f);
    if (golden_load(model, &f->g)) return -1;
    q35_error err;
    q35_engine_params ep = {.n_threads = 1};
    if (q35_engine_load(f->g.model_dir, &ep, &f->e, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        return -1;
    }
    q35_metrics_init(&f->m);
    int32_t eos = q35_engine_info(f->e)->eos_token_id;
    q35_sched_config sc = {.engine = f->e, .metrics = &f->m, .n_ctx = N_CTX, .parallel = parallel, .max_queue = max_queue,
                           .cache_bytes = cache_bytes, .prefill_chunk = 16, .spec_k = spec_k, .eos = &eos,
                           .n_eos = eos >= 0 ? 1 : 0};
    char msg[512];
    if (q35_sched_start(&sc, &f->s, msg, sizeof msg)) {
        q35_test_fail(__FILE__, __LINE__, "%s", msg);
        return -1;
    }
    f->lim = (q35_api_limits){.served_model_name = "m", .max_model_len = N_CTX, .vocab_size = f->g.vocab_size,
                              .max_n = 16, .max_logprobs = 20, .max_total_tokens = 8 * N_CTX, .max_stop = 16,
                              .max_stop_len = 256, .max_prompts = 64};
    return 0;
}

static void fx_stop(fixture *f) {
    q35_sched_free(f->s);
    q35_engine_free(f->e);
    q35_metrics_destroy(&f->m);
    golden_free(&f->g);
}

/* A completion task for the golden prompt with the extra fields `extra`
 * (JSON members, may be ""), prepared as the routes prepare one. */
static q35_task *task_for(fixture *f, int32_t n_prompt, const char *extra) {
    char body[4096];
    int k = snprintf(body, sizeof body, "{\"model\":\"m\",\"prompt\":[");
    for (int32_t i = 0; i < n_prompt; i++) k += snprintf(body + k, sizeof body - (size_t)k, "%s%d", i ? "," : "", f->g.prompt_ids[i]);
    snprintf(body + k, sizeof body - (size_t)k, "]%s%s}", *extra ? "," : "", extra);
    q35_task *t = q35_task_new();
    if (!t) return NULL;
    char msg[1024], param[128];
    int status;
    if ((status = q35_api_parse(body, strlen(body), Q35_API_COMPLETION, &f->lim, &t->api, msg, sizeof msg, param, sizeof param)) ||
        q35_prompt_prepare(NULL, &f->lim, t, msg, sizeof msg, &status)) {
        q35_test_fail(__FILE__, __LINE__, "request refused (%d): %s", status, msg);
        q35_task_release(t);
        return NULL;
    }
    t->t_arrive = q35_now_seconds();
    return t;
}

/* Waits (at most 60 s) until every choice of t has finished, or with
 * first_event until t has an event; false on time-out. */
static bool wait_for(q35_task *t, bool first_event) {
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 60;
    pthread_mutex_lock(&t->mu);
    int rc = 0;
    while (t->n_finished < t->n_choices && !(first_event && t->n_ev) && rc == 0)
        rc = pthread_cond_timedwait(&t->cv, &t->mu, &until);
    bool ok = first_event ? t->n_ev > 0 : t->n_finished == t->n_choices;
    pthread_mutex_unlock(&t->mu);
    return ok;
}
#define wait_done(t) wait_for((t), false)
#define wait_started(t) wait_for((t), true)

/* The generated ids of one choice (at most cap), its finish and last event. */
static int32_t choice_tokens(const q35_task *t, int32_t c, int32_t *out, int32_t cap, const q35_event **last) {
    int32_t n = 0;
    *last = NULL;
    for (size_t i = 0; i < t->n_ev; i++) {
        const q35_event *e = &t->ev[i];
        if (e->choice != c) continue;
        if (e->token >= 0 && n < cap) out[n++] = e->token;
        if (e->finish) *last = e;
    }
    return n;
}

/* The text of one choice, concatenated from its events. */
static void choice_text(const q35_task *t, int32_t c, char *out, size_t cap) {
    size_t n = 0;
    out[0] = 0;
    for (size_t i = 0; i < t->n_ev; i++)
        if (t->ev[i].choice == c && t->ev[i].len && n + t->ev[i].len < cap) {
            memcpy(out + n, t->ev[i].text, t->ev[i].len);
            n += t->ev[i].len;
            out[n] = 0;
        }
}

/* Plain greedy decoding of n tokens after the first n_prompt golden prompt
 * ids on a fresh session, one token per q35_session_eval. */
static int reference(fixture *f, int32_t n_prompt, int32_t n, int32_t *out) {
    q35_session *s;
    q35_error err;
    if (q35_session_new(f->e, N_CTX, &s, &err)) return -1;
    float *lg = malloc(sizeof *lg * (size_t)f->g.vocab_size);
    int rc = lg && !q35_session_eval(s, f->g.prompt_ids, n_prompt, lg, 0, &err) ? 0 : -1;
    for (int32_t i = 0; !rc && i < n; i++) {
        out[i] = q35_argmax(lg, f->g.vocab_size);
        if (i + 1 < n && q35_session_eval(s, &out[i], 1, lg, 0, &err)) rc = -1;
    }
    free(lg);
    q35_session_free(s);
    return rc;
}

TEST(sched, greedy_request_gives_plain_greedy_tokens) {
    enum { N = 20 };
    for (int32_t k = 0; k <= 1; k++) { /* plain batched decode, and MTP speculation */
        fixture f;
        REQUIRE(fx_start(&f, "tiny-a", 2, 8, 0, k) == 0);
        int32_t ref[N], got[N];
        REQUIRE(reference(&f, f.g.n_prompt, N, ref) == 0);
        for (int i = 0; i < N && i < f.g.n_greedy; i++) CHECK_EQ_INT(ref[i], f.g.greedy_ids[i]);
        q35_task *t = task_for(&f, f.g.n_prompt, "\"max_tokens\":20,\"temperature\":0,\"ignore_eos\":true");
        REQUIRE(t);
        REQUIRE(q35_sched_submit(f.s, t));
        REQUIRE(wait_done(t));
        const q35_event *last;
        CHECK_EQ_INT(choice_tokens(t, 0, got, N, &last), N);
        CHECK_MSG(!memcmp(got, ref, sizeof ref), "spec_k %d: the scheduler's greedy tokens differ from plain decoding", k);
        REQUIRE(last);
        CHECK_EQ_INT(last->finish, Q35_FIN_LENGTH);
        CHECK_EQ_INT(t->completion_tokens[0], N);
        CHECK(!t->error);
        /* the metrics sink saw the request */
        CHECK_EQ_INT(f.m.gen_tokens, N);
        CHECK_EQ_INT(f.m.prompt_tokens, f.g.n_prompt);
        CHECK_EQ_INT(f.m.finished[Q35_FIN_LENGTH], 1);
        CHECK_EQ_INT(f.m.ttft.total, 1);
        q35_task_release(t);
        fx_stop(&f);
    }
}

TEST(sched, n_choices_greedy_and_seeded) {
    enum { N = 12 };
    fixture f;
    REQUIRE(fx_start(&f, "tiny-b", 2, 8, 64u << 20, 1) == 0);
    int32_t ref[N], got[N];
    REQUIRE(reference(&f, f.g.n_prompt, N, ref) == 0);
    q35_task *t = task_for(&f, f.g.n_prompt, "\"max_tokens\":12,\"temperature\":0,\"ignore_eos\":true,\"n\":3");
    REQUIRE(t);
    REQUIRE(q35_sched_submit(f.s, t));
    REQUIRE(wait_done(t));
    REQUIRE(t->n_choices == 3);
    for (int32_t c = 0; c < 3; c++) {
        const q35_event *last;
        CHECK_EQ_INT(choice_tokens(t, c, got, N, &last), N);
        CHECK_MSG(!memcmp(got, ref, sizeof ref), "choice %d differs from plain greedy", c);
        CHECK(last && last->finish == Q35_FIN_LENGTH);
    }
    q35_task_release(t);
    /* sampled with a seed: each choice its own stream, the same on a rerun */
    int32_t first[2][N];
    for (int run = 0; run < 2; run++) {
        t = task_for(&f, f.g.n_prompt, "\"max_tokens\":12,\"temperature\":1,\"seed\":7,\"ignore_eos\":true,\"n\":2");
        REQUIRE(t);
        REQUIRE(q35_sched_submit(f.s, t));
        REQUIRE(wait_done(t));
        for (int32_t c = 0; c < 2; c++) {
            const q35_event *last;
            CHECK_EQ_INT(choice_tokens(t, c, got, N, &last), N);
            if (run == 0) memcpy(first[c], got, sizeof got);
            else CHECK_MSG(!memcmp(first[c], got, sizeof got), "seeded choice %d is not reproducible", c);
        }
        q35_task_release(t);
    }
    CHECK_MSG(memcmp(first[0], first[1], sizeof first[0]) != 0, "the two seeded choices drew the same tokens");
    fx_stop(&f);
}

TEST(sched, full_queue_refuses_and_cancel_frees_the_slot) {
    fixture f;
    REQUIRE(fx_start(&f, "tiny-a", 1, 1, 0, 0) == 0);
    /* a long request holds the only slot */
    q35_task *a = task_for(&f, f.g.n_prompt, "\"max_tokens\":4000,\"temperature\":0,\"ignore_eos\":true");
    REQUIRE(a);
    REQUIRE(q35_sched_submit(f.s, a));
    REQUIRE(wait_started(a));
    q35_task *b = task_for(&f, f.g.n_prompt, "\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true");
    q35_task *c = task_for(&f, f.g.n_prompt, "\"max_tokens\":4,\"temperature\":0,\"ignore_eos\":true");
    REQUIRE(b && c);
    CHECK(q35_sched_submit(f.s, b));  /* waits: the queue holds one */
    q35_sched_stats st;
    q35_sched_get_stats(f.s, &st);
    CHECK_EQ_INT(st.running, 1);
    CHECK_EQ_INT(st.waiting, 1);
    CHECK(!q35_sched_submit(f.s, c)); /* refused */
    CHECK_EQ_INT(c->refs, 1);         /* the scheduler kept no reference */
    q35_task_release(c);
    atomic_store(&a->cancelled, 1);
    REQUIRE(wait_done(a));
    const q35_event *last;
    int32_t got[4000];
    int32_t n = choice_tokens(a, 0, got, 4000, &last);
    CHECK(n < 4000);
    REQUIRE(last);
    CHECK_EQ_INT(last->finish, Q35_FIN_ABORT);
    /* the freed slot serves the waiting request */
    REQUIRE(wait_done(b));
    int32_t ref[4];
    REQUIRE(reference(&f, f.g.n_prompt, 4, ref) == 0);
    CHECK_EQ_INT(choice_tokens(b, 0, got, 4, &last), 4);
    CHECK(!memcmp(got, ref, sizeof ref));
    CHECK(last && last->finish == Q35_FIN_LENGTH);
    q35_sched_get_stats(f.s, &st);
    CHECK_EQ_INT(st.running, 0);
    CHECK_EQ_INT(st.waiting, 0);
    CHECK_EQ_INT(f.m.finished[Q35_FIN_ABORT], 1);
    q35_task_release(a);
    q35_task_release(b);
    fx_stop(&f);
}

TEST(sched, prefix_cache_serves_a_repeated_prompt) {
    enum { N = 10 };
    fixture f;
    REQUIRE(fx_start(&f, "tiny-c", 2, 8, 64u << 20, 0) == 0);
    int32_t out[3][N];
    int32_t cached[3];
    static const char *const extra[3] = {
        "\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true",
        "\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true",
        "\"max_tokens\":10,\"temperature\":0,\"ignore_eos\":true,\"cache_prompt\":false",
    };
    for (int i = 0; i < 3; i++) {
        q35_task *t = task_for(&f, f.g.n_prompt, extra[i]);
        REQUIRE(t);
        REQUIRE(q35_sched_submit(f.s, t));
        REQUIRE(wait_done(t));
        const q35_event *last;
        CHECK_EQ_INT(choice_tokens(t, 0, out[i], N, &last), N);
        cached[i] = t->cached_tokens;
        q35_task_release(t);
    }
    CHECK_EQ_INT(cached[0], 0);
    /* the snapshot one token before the prompt's end */
    CHECK_EQ_INT(cached[1], f.g.n_prompt - 1);
    CHECK_EQ_INT(cached[2], 0);
    CHECK(!memcmp(out[0], out[1], sizeof out[0]));
    CHECK(!memcmp(out[0], out[2], sizeof out[0]));
    q35_sched_stats st;
    q35_sched_get_stats(f.s, &st);
    CHECK(st.cache_entries >= 1 && st.cache_bytes > 0);
    CHECK_EQ_INT(st.cache_hits, (unsigned long long)(f.g.n_prompt - 1));
    CHECK_EQ_INT(st.cache_queries, 3ull * (unsigned long long)f.g.n_prompt);
    fx_stop(&f);
}

/* A completion task for token ids `ids` with one image span at [at, at + len)
 * whose hash is all `h` bytes. */
static q35_task *image_task(fixture *f, const int32_t *ids, int32_t n, int32_t at, int32_t len, uint8_t h) {
    char body[8192];
    int k = snprintf(body, sizeof body, "{\"model\":\"m\",\"max_tokens\":6,\"temperature\":0,\"ignore_eos\":true,\"prompt\":[");
    for (int32_t i = 0; i < n; i++) k += snprintf(body + k, sizeof body - (size_t)k, "%s%d", i ? "," : "", ids[i]);
    snprintf(body + k, sizeof body - (size_t)k, "]}");
    q35_task *t = q35_task_new();
    char msg[1024], param[128];
    int status;
    if (!t || q35_api_parse(body, strlen(body), Q35_API_COMPLETION, &f->lim, &t->api, msg, sizeof msg, param, sizeof param) ||
        q35_prompt_prepare(NULL, &f->lim, t, msg, sizeof msg, &status) || !(t->api.spans = calloc(1, sizeof *t->api.spans))) {
        if (t) q35_task_release(t);
        return NULL;
    }
    t->api.n_spans = 1;
    t->api.spans[0] = (q35_image_span){.pos = at, .len = len};
    memset(t->api.spans[0].sha256, h, 32);
    t->t_arrive = q35_now_seconds();
    return t;
}

/* A follow-up turn extends what a warm slot holds, token for token, but its
 * image is another: neither the slot's state nor a cached snapshot past the
 * image may serve it. The same follow-up with the first image reuses the
 * first turn's whole state (kept in the cache when the slot was taken). */
TEST(sched, prefix_reuse_stops_at_an_image_that_differs) {
    enum { N = 6, AT = 3, LEN = 4 };
    fixture f;
    REQUIRE(fx_start(&f, "tiny-c", 1, 8, 64u << 20, 0) == 0);
    int32_t n0 = f.g.n_prompt;
    REQUIRE(n0 > AT + LEN + 1);
    int32_t ids[512], out[3][N], cached[3];
    memcpy(ids, f.g.prompt_ids, sizeof *ids * (size_t)n0);
    const q35_event *last;
    q35_task *t = image_task(&f, ids, n0, AT, LEN, 0xa1);
    REQUIRE(t && q35_sched_submit(f.s, t) && wait_done(t));
    REQUIRE(choice_tokens(t, 0, out[0], N, &last) == N);
    q35_task_release(t);
    /* the follow-up: the first turn, its answer, two more tokens */
    int32_t n1 = n0 + N + 2;
    memcpy(ids + n0, out[0], sizeof *ids * N);
    ids[n0 + N] = ids[0];
    ids[n0 + N + 1] = ids[1];
    static const uint8_t hash_of[2] = {0xb2, 0xa1};
    for (int i = 0; i < 2; i++) {
        REQUIRE((t = image_task(&f, ids, n1, AT, LEN, hash_of[i])) && q35_sched_submit(f.s, t) && wait_done(t));
        CHECK_EQ_INT(choice_tokens(t, 0, out[1 + i], N, &last), N);
        cached[1 + i] = t->cached_tokens;
        q35_task_release(t);
    }
    CHECK(cached[1] <= AT);          /* another image: nothing after it */
    CHECK_EQ_INT(cached[2], n0 + N - 1); /* the first image: the first turn's whole state (its last token never went in) */
    fx_stop(&f);
}

/* Two warm slots hold the same ids with different images: a follow-up goes
 * to the slot that holds its own image and continues it whole. */
TEST(sched, a_follow_up_goes_to_the_warm_slot_with_its_image) {
    enum { N = 6, AT = 3, LEN = 4 };
    fixture f;
    REQUIRE(fx_start(&f, "tiny-c", 2, 8, 64u << 20, 0) == 0);
    int32_t n0 = f.g.n_prompt;
    REQUIRE(n0 > AT + LEN + 1);
    int32_t ids[512], out[N];
    memcpy(ids, f.g.prompt_ids, sizeof *ids * (size_t)n0);
    const q35_event *last;
    static const uint8_t hash_of[2] = {0xa1, 0xb2};
    for (int i = 0; i < 2; i++) { /* one after the other: A fills a slot, B takes the empty one */
        q35_task *t = image_task(&f, ids, n0, AT, LEN, hash_of[i]);
        REQUIRE(t && q35_sched_submit(f.s, t) && wait_done(t));
        REQUIRE(choice_tokens(t, 0, out, N, &last) == N); /* the same for both: the engine reads no pixels */
        q35_task_release(t);
    }
    int32_t n1 = n0 + N + 1;
    memcpy(ids + n0, out, sizeof *ids * N);
    ids[n0 + N] = ids[0];
    for (int i = 1; i >= 0; i--) {
        q35_task *t = image_task(&f, ids, n1, AT, LEN, hash_of[i]);
        REQUIRE(t && q35_sched_submit(f.s, t) && wait_done(t));
        CHECK_MSG(t->cached_tokens == n0 + N - 1, "image %d: %d cached", i, t->cached_tokens);
        q35_task_release(t);
    }
    fx_stop(&f);
}

TEST(sched, stop_tokens_and_stop_strings_finish_with_stop) {
    enum { N = 16 };
    fixture f;
    REQUIRE(fx_start(&f, "tiny-a", 2, 8, 0, 1) == 0);
    int32_t ref[N], got[N];
    REQUIRE(reference(&f, f.g.n_prompt, N, ref) == 0);
    /* the first position from 3 on whose token did not come earlier */
    int k = -1;
    for (int i = 3; i < N && k < 0; i++) {
        bool seen = false;
        for (int j = 0; j < i; j++) seen |= ref[j] == ref[i];
        if (!seen) k = i;
    }
    REQUIRE(k > 0);
    char extra[256];
    snprintf(extra, sizeof extra, "\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,\"stop_token_ids\":[%d]", ref[k]);
    q35_task *t = task_for(&f, f.g.n_prompt, extra);
    REQUIRE(t);
    REQUIRE(q35_sched_submit(f.s, t));
    REQUIRE(wait_done(t));
    const q35_event *last;
    CHECK_EQ_INT(choice_tokens(t, 0, got, N, &last), k + 1);
    CHECK(!memcmp(got, ref, sizeof *ref * (size_t)(k + 1)));
    REQUIRE(last);
    CHECK_EQ_INT(last->finish, Q35_FIN_STOP);
    CHECK_EQ_INT(last->stop_id, ref[k]);
    q35_task_release(t);
    /* a stop string: the text of token k ("<id>" without a tokenizer) */
    snprintf(extra, sizeof extra, "\"max_tokens\":16,\"temperature\":0,\"ignore_eos\":true,\"stop\":[\"<%d>\"]", ref[k]);
    t = task_for(&f, f.g.n_prompt, extra);
    REQUIRE(t);
    REQUIRE(q35_sched_submit(f.s, t));
    REQUIRE(wait_done(t));
    CHECK_EQ_INT(choice_tokens(t, 0, got, N, &last), k + 1);
    REQUIRE(last);
    CHECK_EQ_INT(last->finish, Q35_FIN_STOP);
    CHECK(last->stop_str && atoi(last->stop_str + 1) == ref[k]);
    char text[512], want[512];
    size_t w = 0;
    for (int i = 0; i < k; i++) w += (size_t)snprintf(want + w, sizeof want - w, "<%d>", ref[i]);
    choice_text(t, 0, text, sizeof text);
    CHECK_STR_EQ(text, want); /* everything before the stop string, none of it */
    q35_task_release(t);
    fx_stop(&f);
}
