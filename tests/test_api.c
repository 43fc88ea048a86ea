/* test_api.c: the sampler and the server's protocol logic (src/sampler.c,
 * src/server/) on synthetic inputs: no model, no sockets. */
#include "core/generate.h"
#include "server/auth.h"
#include "server/json_prefix.h"
#include "server/metrics.h"
#include "server/request.h"
#include "server/sse.h"
#include "server/stop.h"
#include "text/schema.h"
#include "test.h"

#include <float.h>

/* ---- sampler ---- */

static q35_sampler *new_sampler(q35_sampler_params p, int32_t V) {
    q35_sampler *s = NULL;
    q35_error err;
    if (q35_sampler_new(&p, V, &s, &err)) return NULL;
    return s;
}

static const q35_sampler_params plain = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 42};

TEST(sampler, greedy_and_top_k_one_pick_the_argmax) {
    float l[6] = {0.1f, 2.0f, -1.0f, 2.0f, 0.5f, 1.9f};
    float c[6];
    q35_sampler_params p = plain;
    p.temperature = 0;
    q35_sampler *s = new_sampler(p, 6);
    REQUIRE(s);
    memcpy(c, l, sizeof l);
    CHECK_EQ_INT(q35_sampler_sample(s, c), 1); /* the lowest index among ties */
    q35_sampler_free(s);
    p = plain;
    p.top_k = 1;
    s = new_sampler(p, 6);
    for (int i = 0; i < 20; i++) {
        memcpy(c, l, sizeof l);
        CHECK_EQ_INT(q35_sampler_sample(s, c), 1);
    }
    q35_sampler_free(s);
}

/* q35_argmax against its definition (the first index that no later value
 * is greater than, NaNs never greater) on every length 1-40 and at an
 * offset past each vector lane: ties, NaNs (at 0 too), -0 and +0, infinities. */
static int32_t argmax_by_definition(const float *l, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

TEST(sampler, argmax_is_the_first_greatest_with_nans_and_zeros) {
    const float pool[] = {1.0f, 1.0f, -2.0f, 0.0f, -0.0f, NAN, INFINITY, -INFINITY, 3.5f, 3.5f, -1e30f, 1e-40f};
    enum { n_pool = sizeof pool / sizeof pool[0] };
    float l[48];
    long bad = 0;
    uint32_t r = 12345;
    for (int trial = 0; trial < 4000; trial++) {
        int32_t n = 1 + trial % 40, off = trial / 40 % 4;
        for (int32_t i = 0; i < n + off; i++) {
            r = r * 1664525u + 1013904223u;
            l[i] = pool[(r >> 8) % n_pool];
        }
        if (trial % 3 == 0) l[off] = NAN;
        bad += q35_argmax(l + off, n) != argmax_by_definition(l + off, n);
    }
    CHECK_EQ_INT(bad, 0);
    const float z[5] = {-0.0f, -1.0f, 0.0f, NAN, -0.0f};
    CHECK_EQ_INT(q35_argmax(z, 5), 0);
    const float big[9] = {NAN, 1, 2, 3, 4, 5, 6, 7, 8};
    CHECK_EQ_INT(q35_argmax(big, 9), 0);
    CHECK_EQ_INT(q35_argmax(big + 1, 8), 7);
}

TEST(sampler, same_seed_same_tokens_and_frequencies_follow_softmax) {
    enum { V = 5, N = 20000 };
    float l[V] = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f}, c[V];
    q35_sampler *a = new_sampler(plain, V), *b = new_sampler(plain, V);
    REQUIRE(a && b);
    int count[V] = {0};
    for (int i = 0; i < N; i++) {
        memcpy(c, l, sizeof l);
        int32_t ta = q35_sampler_sample(a, c);
        memcpy(c, l, sizeof l);
        int32_t tb = q35_sampler_sample(b, c);
        CHECK(ta == tb);
        count[ta]++;
    }
    double z = 0;
    for (int i = 0; i < V; i++) z += exp(l[i]);
    for (int i = 0; i < V; i++) CHECK_NEAR(count[i] / (double)N, exp(l[i]) / z, 0.015);
    q35_sampler_free(a);
    q35_sampler_free(b);
}

TEST(sampler, top_p_and_min_p_cut_the_tail) {
    enum { V = 4 };
    /* probabilities 0.5, 0.25, 0.125, 0.125 */
    float l[V] = {(float)log(0.5), (float)log(0.25), (float)log(0.125), (float)log(0.125)}, c[V];
    q35_sampler_params p = plain;
    p.top_p = 0.7f; /* keeps the first two */
    q35_sampler *s = new_sampler(p, V);
    int seen[V] = {0};
    for (int i = 0; i < 2000; i++) { memcpy(c, l, sizeof l); seen[q35_sampler_sample(s, c)]++; }
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0);
    q35_sampler_free(s);
    p = plain;
    p.min_p = 0.3f; /* keeps p >= 0.15: the first two */
    s = new_sampler(p, V);
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < 2000; i++) { memcpy(c, l, sizeof l); seen[q35_sampler_sample(s, c)]++; }
    CHECK(seen[0] > 0 && seen[1] > 0 && seen[2] == 0 && seen[3] == 0);
    q35_sampler_free(s);
}

/* The cuts rank only the candidates that can survive (sampler.c: buckets by distance from the best
 * logit, of the softmax's mass for top-p, of counts for top-k); the distribution must be the one a
 * ranking of the whole row gives: every candidate ranked by logit (ties: the lower id first), the k best,
 * the top-p cut where the cumulative probability (over the top-k's sum in rank order, or without top-k
 * the whole row's, q35_sampler_row_sum) reaches top_p, then min-p, then the tempered softmax of the
 * survivors, every weight q35_sampler_exp's.
 * Flat and peaked rows, ties, -inf entries, a row of one finite logit, several top_k, top_p and min_p:
 * bit for bit. */
typedef struct { float l; int32_t id; } ranked;
static int ranked_desc(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    if (x->l != y->l) return x->l > y->l ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

TEST(sampler, cuts_equal_a_ranking_of_the_whole_row) {
    enum { V = 40000 };
    float *l = malloc(sizeof(float) * V), *got = malloc(sizeof(float) * V), *want = malloc(sizeof(float) * V);
    ranked *r = malloc(sizeof(ranked) * V);
    REQUIRE(l && got && want && r);
    const float top_ps[] = {0.1f, 0.5f, 0.9f, 0.95f, 0.999f, 1.0f}, min_ps[] = {0.0f, 0.01f, 0.3f};
    const int32_t top_ks[] = {0, 1, 20, 1000};
    uint64_t x = 12345;
    long bad = 0, rows = 0;
    for (int kind = 0; kind < 5; kind++) {
        for (int32_t i = 0; i < V; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const float u = (float)((x >> 11) * 0x1.0p-53), w = (float)(((x >> 20) & 0xffff) / 65536.0);
            l[i] = kind == 0   ? 3.0f * (u + w - 1.0f)                    /* flat */
                   : kind == 1 ? (i % 97 == 0 ? 15.0f : 0.0f) + 4.0f * u  /* a few peaks */
                   : kind == 2 ? (float)(int)(8.0f * u)                    /* eight values: ties */
                   : kind == 3 ? (u < 0.5f ? -INFINITY : 2.0f * w)         /* half -inf */
                               : (i == 777 ? 1.0f : -INFINITY);            /* one finite */
        }
        for (int32_t i = 0; i < V; i++) r[i] = (ranked){l[i], i}; /* the whole row ranked */
        qsort(r, V, sizeof *r, ranked_desc);
        for (size_t ki = 0; ki < sizeof top_ks / sizeof *top_ks; ki++)
        for (size_t pi = 0; pi < sizeof top_ps / sizeof *top_ps; pi++)
            for (size_t mi = 0; mi < sizeof min_ps / sizeof *min_ps; mi++) {
                q35_sampler_params p = plain;
                p.temperature = 0.7f, p.top_k = top_ks[ki], p.top_p = top_ps[pi], p.min_p = min_ps[mi];
                if (!p.top_k && p.top_p >= 1.0f && p.min_p <= 0.0f) continue; /* no cut: another path */
                const int32_t k = p.top_k ? p.top_k : V;
                q35_sampler *s = new_sampler(p, V);
                REQUIRE(s != NULL);
                q35_sampler_probs(s, l, NULL, 0, got);
                q35_sampler_free(s);
                const float mx = r[0].l;
                double sum = 0; /* over the top-k in rank order, or the whole row's (the sampler's order) */
                if (k < V)
                    for (int32_t i = 0; i < k; i++) sum += (double)q35_sampler_exp(r[i].l - mx);
                else
                    sum = q35_sampler_row_sum(l, V, mx);
                int32_t n = k;
                if (p.top_p < 1.0f) {
                    double acc = 0;
                    for (int32_t i = 0; i < k; i++) {
                        acc += (double)q35_sampler_exp(r[i].l - mx) / sum;
                        if (acc >= p.top_p) { n = i + 1; break; }
                    }
                }
                if (p.min_p > 0.0f) {
                    int32_t m = 1;
                    while (m < n && (double)(r[m].l - mx) >= log((double)p.min_p)) m++;
                    n = m;
                }
                double tsum = 0;
                const float inv_t = 1.0f / p.temperature;
                for (int32_t i = 0; i < n; i++) tsum += (double)q35_sampler_exp((r[i].l - mx) * inv_t);
                for (int32_t i = 0; i < V; i++) want[i] = 0.0f;
                for (int32_t i = 0; i < n; i++)
                    want[r[i].id] = (float)((double)q35_sampler_exp((r[i].l - mx) * inv_t) / tsum);
                bad += memcmp(got, want, sizeof(float) * V) != 0;
                rows++;
            }
    }
    CHECK_MSG(bad == 0, "%ld of %ld rows: another distribution than the whole row's ranking", bad, rows);
    free(l), free(got), free(want), free(r);
}

/* The sampler's e^x (sampler.c): within 1 ulp of exp over [-87, 0], exactly 1 at 0 and 0 at -inf and
 * below -87; a row's weights, made four lanes at a time, are the scalar's bits (the uncut distribution
 * at temperature 1 is each weight times the reciprocal of the row's sum), and that sum is the weights'
 * sum up to the order of the additions. */
TEST(sampler, weights_are_exp_within_1_ulp_in_every_lane) {
    long bad = 0;
    double worst = 0;
    for (int32_t i = 0; i <= (1 << 21); i++) {
        const float x = -87.0f * (float)i / (float)(1 << 21);
        const double want = exp((double)x), got = q35_sampler_exp(x);
        const double ulp = (double)nextafterf((float)want, INFINITY) - (double)(float)want;
        const double e = fabs(got - want) / ulp;
        worst = e > worst ? e : worst;
        bad += e > 1.0;
    }
    CHECK_MSG(bad == 0, "%ld of 2^21 points beyond 1 ulp (worst %.2f)", bad, worst);
    CHECK(q35_sampler_exp(0.0f) == 1.0f);
    CHECK(q35_sampler_exp(-INFINITY) == 0.0f);
    CHECK(q35_sampler_exp(-87.5f) == 0.0f && q35_sampler_exp(-1e30f) == 0.0f);
    CHECK(q35_sampler_exp(-86.9f) > 0.0f);

    enum { V = 1001 }; /* blocks of 256 and a part, lanes and a part; NaNs count as -inf */
    float l[V], lc[V], probs[V];
    for (int32_t i = 0; i < V; i++) l[i] = i == 500 ? -INFINITY : (float)((i * 7919) % 997) / 50.0f - 10.0f;
    l[3] = 20.0f;
    memcpy(lc, l, sizeof l);
    l[5] = l[17] = l[V - 1] = NAN;
    lc[5] = lc[17] = lc[V - 1] = -INFINITY;
    q35_sampler *s = new_sampler(plain, V);
    REQUIRE(s != NULL);
    q35_sampler_probs(s, l, NULL, 0, probs);
    q35_sampler_free(s);
    memcpy(l, lc, sizeof l);
    const double sum = q35_sampler_row_sum(l, V, 20.0f);
    const float inv = (float)(1.0 / sum);
    double ref = 0;
    long diff = 0;
    for (int32_t i = 0; i < V; i++) {
        const float w = q35_sampler_exp(l[i] - 20.0f);
        ref += w;
        diff += probs[i] != w * inv;
    }
    CHECK_MSG(diff == 0, "%ld weights differ from the scalar's", diff);
    CHECK(probs[500] == 0.0f && probs[5] == 0.0f && probs[17] == 0.0f && probs[V - 1] == 0.0f && probs[3] > 0.99f);
    CHECK_NEAR(sum, ref, 1e-12 * ref);
}

/* The uncut draw walks blocks of weights, then one block: over a row of several blocks with heavy
 * tokens in different ones, the frequencies follow the tempered softmax, and the same seed gives the
 * same tokens. */
TEST(sampler, uncut_draw_across_blocks_follows_softmax) {
    enum { V = 1500, N = 30000 };
    static float l[V], c[V];
    const int32_t heavy[] = {0, 255, 256, 700, 1023, 1499};
    for (int32_t i = 0; i < V; i++) l[i] = -4.0f + (float)(i % 13) / 13.0f;
    for (size_t h = 0; h < sizeof heavy / sizeof *heavy; h++) l[heavy[h]] = 2.0f + 0.25f * (float)h;
    q35_sampler_params p = plain;
    p.temperature = 0.8f;
    q35_sampler *a = new_sampler(p, V), *b = new_sampler(p, V);
    REQUIRE(a && b);
    static int count[V];
    memset(count, 0, sizeof count);
    long same = 0;
    for (int i = 0; i < N; i++) {
        memcpy(c, l, sizeof l);
        const int32_t ta = q35_sampler_sample(a, c);
        memcpy(c, l, sizeof l);
        same += ta == q35_sampler_sample(b, c);
        REQUIRE(ta >= 0 && ta < V);
        count[ta]++;
    }
    CHECK(same == N);
    double z = 0, rest = 0;
    for (int32_t i = 0; i < V; i++) z += exp(l[i] / 0.8);
    for (size_t h = 0; h < sizeof heavy / sizeof *heavy; h++) {
        const int32_t t = heavy[h];
        CHECK_NEAR(count[t] / (double)N, exp(l[t] / 0.8) / z, 0.012);
        rest += exp(l[t] / 0.8) / z;
    }
    long light = 0;
    for (int32_t i = 0; i < V; i++) light += count[i];
    for (size_t h = 0; h < sizeof heavy / sizeof *heavy; h++) light -= count[heavy[h]];
    CHECK_NEAR(light / (double)N, 1.0 - rest, 0.012);
    q35_sampler_free(a);
    q35_sampler_free(b);
}

TEST(sampler, penalties_edit_only_seen_tokens) {
    enum { V = 4 };
    float c[V] = {2.0f, -2.0f, 1.0f, 1.0f};
    q35_sampler_params p = plain;
    p.temperature = 0;
    p.repetition_penalty = 2.0f;
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    q35_sampler *s = new_sampler(p, V);
    int32_t prompt[2] = {0, 1};
    q35_sampler_set_prompt(s, prompt, 2);
    q35_sampler_accept(s, 2);
    q35_sampler_accept(s, 2);
    q35_sampler_sample(s, c);
    CHECK_NEAR(c[0], 1.0, 1e-6);                   /* positive: divided */
    CHECK_NEAR(c[1], -4.0, 1e-6);                  /* negative: multiplied */
    CHECK_NEAR(c[2], 1.0 / 2 - 0.5 - 0.5, 1e-6);   /* output token: all three */
    CHECK_NEAR(c[3], 1.0, 1e-6);                   /* unseen */
    q35_sampler_free(s);
}

TEST(sampler, logprobs_are_a_log_softmax_with_sorted_top) {
    float l[5] = {1.0f, 3.0f, 2.0f, 3.0f, -INFINITY};
    int32_t ids[5];
    float lp[5];
    float x = q35_logprobs(l, 5, 2, 3, ids, lp);
    double z = exp(1.0) + 2 * exp(3.0) + exp(2.0);
    CHECK_NEAR(x, 2.0 - log(z), 1e-5);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 3);
    CHECK_EQ_INT(ids[2], 2);
    CHECK_NEAR(lp[0], 3.0 - log(z), 1e-5);
    q35_error err;
    q35_sampler *s;
    q35_sampler_params bad = plain;
    bad.top_p = 0;
    CHECK(q35_sampler_new(&bad, 5, &s, &err) == Q35_ERR_ARG);
}

/* ---- stop strings ---- */

/* Feeds pieces; returns everything released, and whether a stop matched. */
static void run_stop(char **stops, int n, const char *const *pieces, char *out, int *matched) {
    q35_stop_matcher m;
    q35_stop_init(&m, stops, n);
    out[0] = 0;
    for (int i = 0; pieces[i]; i++) {
        long r = q35_stop_feed(&m, pieces[i], strlen(pieces[i]));
        strncat(out, q35_stop_text(&m), (size_t)r);
        q35_stop_consume(&m, (size_t)r);
        if (m.matched >= 0) break;
    }
    if (m.matched < 0) {
        size_t r = q35_stop_finish(&m);
        strncat(out, q35_stop_text(&m), r);
    }
    *matched = m.matched;
    q35_stop_free(&m);
}

TEST(api, stop_strings_across_pieces_never_leak) {
    char *stops[2] = {"END", "\n\nUser:"};
    char out[256];
    int matched;
    const char *p1[] = {"Hello E", "N", "D and more", NULL};
    run_stop(stops, 2, p1, out, &matched);
    CHECK_STR_EQ(out, "Hello ");
    CHECK_EQ_INT(matched, 0);
    const char *p2[] = {"a\n", "\nUs", "e", "r: x", NULL};
    run_stop(stops, 2, p2, out, &matched);
    CHECK_STR_EQ(out, "a");
    CHECK_EQ_INT(matched, 1);
    const char *p3[] = {"EN", "x E", NULL}; /* held prefixes that never complete come out at the end */
    run_stop(stops, 2, p3, out, &matched);
    CHECK_STR_EQ(out, "ENx E");
    CHECK_EQ_INT(matched, -1);
    /* the held text is released as soon as it cannot start a stop string */
    q35_stop_matcher m;
    q35_stop_init(&m, stops, 2);
    CHECK_EQ_INT(q35_stop_feed(&m, "xxE", 3), 2);
    q35_stop_consume(&m, 2);
    CHECK_EQ_INT(q35_stop_feed(&m, "Z", 1), 2);
    q35_stop_free(&m);
}

/* ---- requests ---- */

static const q35_api_limits lim = {.served_model_name = "m", .max_model_len = 100, .vocab_size = 50, .max_n = 4,
                                   .max_logprobs = 5, .max_total_tokens = 200, .max_stop = 4, .max_stop_len = 16,
                                   .max_prompts = 4};

static int parse(const char *body, q35_api_kind kind, q35_api_request *r, char *param) {
    char msg[512];
    return q35_api_parse(body, strlen(body), kind, &lim, r, msg, sizeof msg, param, 64);
}

TEST(api, parse_completion_fields) {
    q35_api_request r;
    char param[64];
    REQUIRE(parse("{\"model\":\"m\",\"prompt\":[1,2,3],\"max_tokens\":5,\"temperature\":0.5,\"top_k\":-1,\"stop\":\"x\","
                  "\"n\":2,\"logprobs\":3,\"seed\":9,\"stream\":true,\"stream_options\":{\"include_usage\":true}}",
                  Q35_API_COMPLETION, &r, param) == 0);
    CHECK_EQ_INT(r.n_prompts, 1);
    CHECK_EQ_INT(r.prompts[0].n_ids, 3);
    CHECK_EQ_INT(r.max_tokens, 5);
    CHECK_NEAR(r.sampling.temperature, 0.5, 1e-7);
    CHECK_EQ_INT(r.sampling.top_k, 0);
    CHECK_EQ_INT(r.n_stop, 1);
    CHECK_EQ_INT(r.n, 2);
    CHECK_EQ_INT(r.logprobs, 3);
    CHECK(r.has_seed && r.sampling.seed == 9 && r.stream && r.include_usage);
    int32_t mt;
    char msg[512];
    CHECK_EQ_INT(q35_api_check_length(&r, 3, &lim, &mt, msg, sizeof msg), 0);
    CHECK_EQ_INT(mt, 5);
    CHECK_EQ_INT(q35_api_check_length(&r, 96, &lim, &mt, msg, sizeof msg), 400);
    CHECK(strstr(msg, "maximum context length is 100 tokens") != NULL);
    q35_api_request_free(&r);
    REQUIRE(parse("{\"prompt\":[\"a\",\"b\"]}", Q35_API_COMPLETION, &r, param) == 0);
    CHECK_EQ_INT(r.n_prompts, 2);
    CHECK_STR_EQ(r.prompts[1].text, "b");
    q35_api_request_free(&r);
}

TEST(api, generation_config_defaults_fill_missing_fields) {
    q35_sampler_params d = {.temperature = 0.7f, .top_k = 20, .top_p = 0.8f, .repetition_penalty = 1.05f};
    q35_api_limits l = lim;
    l.defaults = &d;
    q35_api_request r;
    char msg[256], param[64];
    const char *body = "{\"prompt\":[1],\"top_p\":0.5}";
    REQUIRE(q35_api_parse(body, strlen(body), Q35_API_COMPLETION, &l, &r, msg, sizeof msg, param, sizeof param) == 0);
    CHECK_NEAR(r.sampling.temperature, 0.7, 1e-6);
    CHECK_EQ_INT(r.sampling.top_k, 20);
    CHECK_NEAR(r.sampling.top_p, 0.5, 1e-6); /* what the request says wins */
    CHECK_NEAR(r.sampling.repetition_penalty, 1.05, 1e-6);
    q35_api_request_free(&r);
}

TEST(api, parse_rejects_by_name) {
    static const struct { const char *body; int kind, status; const char *param; } cases[] = {
        {"{\"prompt\":[1],\"logit_bias\":{\"x\":1}}", Q35_API_COMPLETION, 400, "logit_bias"},
        {"{\"prompt\":[1],\"logit_bias\":{\"1.5\":1}}", Q35_API_COMPLETION, 400, "logit_bias"},
        {"{\"prompt\":[1],\"logit_bias\":{\"50\":1}}", Q35_API_COMPLETION, 400, "logit_bias"},
        {"{\"prompt\":[1],\"logit_bias\":{\"3\":101}}", Q35_API_COMPLETION, 400, "logit_bias"},
        {"{\"prompt\":[1],\"logit_bias\":{\"3\":\"1\"}}", Q35_API_COMPLETION, 400, "logit_bias"},
        {"{\"prompt\":[1],\"logit_bias\":[1]}", Q35_API_COMPLETION, 400, "logit_bias"},
        {"{\"prompt\":[1],\"suffix\":\"s\"}", Q35_API_COMPLETION, 400, "suffix"},
        {"{\"prompt\":[1],\"best_of\":2}", Q35_API_COMPLETION, 400, "best_of"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"continue_final_message\":true}", Q35_API_CHAT, 400, "continue_final_message"},
        {"{\"messages\":[{\"role\":\"assistant\",\"content\":\"hi\"}],\"continue_final_message\":true,\"add_generation_prompt\":true}", Q35_API_CHAT, 400, "continue_final_message"},
        {"{\"prompt\":[1],\"model\":\"other\"}", Q35_API_COMPLETION, 404, "model"},
        {"{\"prompt\":[1,50]}", Q35_API_COMPLETION, 400, "prompt"},
        {"{\"prompt\":[1],\"n\":5}", Q35_API_COMPLETION, 400, "n"},
        {"{\"prompt\":[1],\"n\":4,\"max_tokens\":60}", Q35_API_COMPLETION, 400, "n"},
        {"{\"prompt\":[1],\"logprobs\":6}", Q35_API_COMPLETION, 400, "logprobs"},
        {"{\"prompt\":[1],\"top_p\":0}", Q35_API_COMPLETION, 400, "top_p"},
        {"{\"prompt\":[1],\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", Q35_API_COMPLETION, 400, "stop"},
        {"{\"prompt\":[1],\"echo\":true}", Q35_API_CHAT, 400, "messages"}, /* prompt is not a chat field: ignored */
        {"{\"messages\":[{\"role\":\"wizard\",\"content\":\"hi\"}]}", Q35_API_CHAT, 400, "messages"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"top_logprobs\":2}", Q35_API_CHAT, 400, "top_logprobs"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"tool_choice\":\"required\"}", Q35_API_CHAT, 400, "tool_choice"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}],\"chat_template_kwargs\":{\"x\":1}}", Q35_API_CHAT, 400, "chat_template_kwargs"},
        {"{\"prompt\":[1],\"prompt\":[2]}", Q35_API_COMPLETION, 400, ""},
        {"{\"prompt\":[1]", Q35_API_COMPLETION, 400, ""},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q35_api_request r;
        char param[64];
        int st = parse(cases[i].body, (q35_api_kind)cases[i].kind, &r, param);
        CHECK_MSG(st == cases[i].status, "case %zu (%s): status %d", i, cases[i].body, st);
        CHECK_MSG(!strcmp(param, cases[i].param), "case %zu: param '%s'", i, param);
        if (!st) q35_api_request_free(&r);
    }
}

/* vLLM's leniency: unknown top-level fields are ignored (and listed), null is "not given". */
TEST(api, parse_accepts_what_vllm_accepts) {
    q35_api_request r;
    char param[64];
    REQUIRE(parse("{\"prompt\":[1],\"logit_bias\":null,\"suffix\":null,\"store\":true,\"metadata\":{\"a\":\"b\"},"
                  "\"reasoning_effort\":\"low\",\"service_tier\":\"auto\",\"best_of\":1,\"user\":null,\"seed\":null,"
                  "\"max_tokens\":null,\"stop\":null,\"n\":null,\"echo\":null}", Q35_API_COMPLETION, &r, param) == 0);
    CHECK_STR_EQ(r.ignored, "store, metadata, reasoning_effort, service_tier");
    CHECK_EQ_INT(r.n_bias, 0);
    CHECK_EQ_INT(r.max_tokens, -1);
    q35_api_request_free(&r);
    REQUIRE(parse("{\"messages\":[{\"role\":\"developer\",\"content\":\"d\"},{\"role\":\"user\",\"content\":\"u\"},"
                  "{\"role\":\"assistant\",\"content\":\"The answer is\"}],\"max_tokens\":3,\"max_completion_tokens\":9,"
                  "\"logit_bias\":{\"5\":-100,\"7\":2.5},\"parallel_tool_calls\":true,\"store\":false,"
                  "\"add_generation_prompt\":false,\"chat_template_kwargs\":{\"enable_thinking\":null}}",
                  Q35_API_CHAT, &r, param) == 0);
    CHECK_EQ_INT(r.max_tokens, 9); /* max_completion_tokens wins */
    CHECK_STR_EQ(json_string_value(json_object_get(json_array_get(r.messages, 0), "role")), "system");
    CHECK(r.continue_final && !r.add_generation_prompt);
    CHECK_EQ_INT(r.enable_thinking, -1);
    CHECK_EQ_INT(r.n_bias, 2);
    CHECK(r.bias_ids[0] == 5 && r.bias[0] == -100 && r.bias_ids[1] == 7 && r.bias[1] == 2.5f);
    CHECK_STR_EQ(r.ignored, "store");
    q35_api_request_free(&r);
    REQUIRE(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"u\"},{\"role\":\"assistant\",\"content\":\"a\"}]}",
                  Q35_API_CHAT, &r, param) == 0);
    CHECK(!r.continue_final && r.add_generation_prompt); /* without either flag: a new turn, as vLLM */
    q35_api_request_free(&r);
}

/* vLLM's prompt logprobs: echo with logprobs implies them, prompt_logprobs asks for them (and wins). */
TEST(api, prompt_logprobs_from_echo_or_asked) {
    static const struct { const char *body; int status; int32_t plp; const char *param; } cases[] = {
        {"{\"prompt\":[1],\"echo\":true,\"logprobs\":2}", 0, 2, ""},
        {"{\"prompt\":[1],\"logprobs\":2}", 0, -1, ""},
        {"{\"prompt\":[1],\"echo\":true}", 0, -1, ""},
        {"{\"prompt\":[1],\"echo\":true,\"logprobs\":1,\"prompt_logprobs\":5}", 0, 5, ""},
        {"{\"prompt\":[1],\"prompt_logprobs\":0}", 0, 0, ""},
        {"{\"prompt\":[1],\"prompt_logprobs\":null,\"echo\":true,\"logprobs\":0}", 0, 0, ""},
        {"{\"prompt\":[1],\"prompt_logprobs\":21}", 400, -1, "prompt_logprobs"},
        {"{\"prompt\":[1],\"prompt_logprobs\":\"3\"}", 400, -1, "prompt_logprobs"},
        {"{\"prompt\":[1],\"prompt_logprobs\":-1}", 400, -1, "prompt_logprobs"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        q35_api_request r;
        char param[64];
        int st = parse(cases[i].body, Q35_API_COMPLETION, &r, param);
        CHECK_MSG(st == cases[i].status, "%s: status %d", cases[i].body, st);
        CHECK_MSG(!strcmp(param, cases[i].param), "%s: param '%s'", cases[i].body, param);
        if (!st) {
            CHECK_MSG(r.prompt_logprobs == cases[i].plp, "%s: %d", cases[i].body, r.prompt_logprobs);
            q35_api_request_free(&r);
        }
    }
}

TEST(api, parse_chat_request) {
    q35_api_request r;
    char param[64];
    REQUIRE(parse("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"hi\"}]}],"
                  "\"max_completion_tokens\":7,\"logprobs\":true,\"top_logprobs\":2,\"chat_template_kwargs\":{\"enable_thinking\":false},"
                  "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{}}}],"
                  "\"tool_choice\":{\"type\":\"function\",\"function\":{\"name\":\"f\"}}}",
                  Q35_API_CHAT, &r, param) == 0);
    CHECK_EQ_INT(r.max_tokens, 7);
    CHECK_EQ_INT(r.logprobs, 2);
    CHECK_EQ_INT(r.enable_thinking, 0);
    CHECK(r.tools && r.tool_choice_named && !strcmp(r.tool_choice, "f"));
    CHECK_EQ_INT((int)json_array_size(r.messages), 2);
    q35_api_request_free(&r);
}

TEST(api, error_body_sse_and_metrics_text) {
    char *e = q35_api_error_json(404, "no \"such\" model", "model");
    CHECK_STR_EQ(e, "{\"error\":{\"message\":\"no \\\"such\\\" model\",\"type\":\"NotFoundError\",\"param\":\"model\",\"code\":404}}");
    free(e);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    json_t *j = json_pack("{s:s}", "a", "x\ny");
    CHECK(q35_sse_append_json(&buf, &len, &cap, j) == 0);
    CHECK(q35_sse_append_raw(&buf, &len, &cap, "[DONE]") == 0);
    CHECK_STR_EQ(buf, "data: {\"a\":\"x\\ny\"}\n\ndata: [DONE]\n\n");
    json_decref(j);
    free(buf);
    q35_hist h;
    const double b[] = {0.1, 1.0};
    q35_hist_init(&h, b, 2);
    q35_hist_observe(&h, 0.05);
    q35_hist_observe(&h, 0.5);
    q35_hist_observe(&h, 5.0);
    buf = NULL; len = cap = 0;
    CHECK(q35_prom_hist(&buf, &len, &cap, "t_seconds", "T.", "m=\"x\"", &h) == 0);
    CHECK(strstr(buf, "t_seconds_bucket{m=\"x\",le=\"0.1\"} 1\n") != NULL);
    CHECK(strstr(buf, "t_seconds_bucket{m=\"x\",le=\"1\"} 2\n") != NULL);
    CHECK(strstr(buf, "t_seconds_bucket{m=\"x\",le=\"+Inf\"} 3\n") != NULL);
    CHECK(strstr(buf, "t_seconds_count{m=\"x\"} 3\n") != NULL);
    free(buf);
}

TEST(api, bearer_keys) {
    CHECK(q35_bearer_ok("Bearer k3y", "k3y"));
    CHECK(q35_bearer_ok("bearer  k3y ", "k3y"));
    CHECK(!q35_bearer_ok("Bearer k3", "k3y"));
    CHECK(!q35_bearer_ok("Bearer k3yy", "k3y"));
    CHECK(!q35_bearer_ok("Basic k3y", "k3y"));
    CHECK(!q35_bearer_ok(NULL, "k3y"));
    CHECK(q35_secret_equal("a", 1, "a", 1) && !q35_secret_equal("a", 1, "b", 1));
}

/* ---- json_object ---- */

static int json_ok(const char *s, bool *complete) {
    q35_json_prefix p;
    q35_json_prefix_init(&p);
    bool ok = q35_json_prefix_feed(&p, s, strlen(s));
    *complete = ok && q35_json_prefix_complete(&p);
    return ok;
}

TEST(api, json_prefix_accepts_objects_and_their_prefixes) {
    static const char *const whole[] = {
        "{}", " {\"a\": 1}", "{\"a\":[1,-2.5e+3,0,true,false,null,{}],\"b\":{\"c\":\"x\\n\\u00e9\\\"\"}}",
        "{\"k\": [ ] }", "{\"\xc3\xa9\": \"\xe4\xb8\xad\"}", "{\"n\":0.5E-2}",
    };
    for (size_t i = 0; i < sizeof whole / sizeof *whole; i++) {
        bool complete;
        CHECK_MSG(json_ok(whole[i], &complete) && complete, "whole %zu: %s", i, whole[i]);
        for (size_t k = 0; k < strlen(whole[i]); k++) { /* every proper prefix is a live prefix */
            char pre[256];
            snprintf(pre, sizeof pre, "%.*s", (int)k, whole[i]);
            CHECK_MSG(json_ok(pre, &complete) && !complete, "prefix %zu of %zu: %s", k, i, pre);
        }
    }
    static const char *const bad[] = {
        "[]", "\"x\"", "1", "{a", "{\"a\" 1}", "{\"a\":01}", "{\"a\":1,}", "{\"a\":[1,]}", "{\"a\":tru e}",
        "{\"a\":\"x\ny\"}", "{\"a\":\"\\q\"}", "{\"a\":\"\\u12g4\"}", "{}x", "{}{}", "{\"a\":-}", "{\"a\":1.}",
        "{\"a\":1e}", "{         \"a\":1}", "{\"a\":]", "{\"a\":[}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        bool complete;
        CHECK_MSG(!json_ok(bad[i], &complete), "accepted %zu: %s", i, bad[i]);
    }
    bool complete;
    CHECK(json_ok("{}\n ", &complete) && complete); /* trailing blanks are fine */
}

/* json_object's mask walks the token trie (q35_token_trie_mask_by, only the non-plain tokens inside a
 * string); it must mark exactly the tokens whose bytes continue the state, as feeding each token's bytes
 * to a copy of it does: every single byte, empty and missing tokens, and 4000 random strings of JSON's
 * structural bytes, escapes, digits, letters, blanks, control bytes and whole and cut UTF-8 characters,
 * from every prefix of a few objects (keys, strings, escapes, \\u digits, numbers, literals, nesting). */
TEST(api, json_object_mask_by_trie_equals_token_by_token) {
    enum { NT = 256 + 2 + 4000 };
    static char store[NT][8];
    const char *bytes[NT];
    size_t len[NT];
    for (int t = 0; t < 256; t++) store[t][0] = (char)t, bytes[t] = store[t], len[t] = 1;
    bytes[256] = NULL, len[256] = 0;       /* a special token */
    bytes[257] = store[257], len[257] = 0; /* empty */
    static const char *const parts[] = {"{", "}", "[", "]", "\"", "\\", ":", ",", " ", "\n", "\t", "0", "1", "9", "-",
                                        "+", ".", "e", "E", "u", "a", "f", "t", "r", "n", "l", "s", "A", "x", "\xc3\xa9",
                                        "\xe4\xb8\xad", "\xc3", "\x01", "/", "b"};
    const int np = (int)(sizeof parts / sizeof *parts);
    uint64_t x = 99;
    for (int t = 258; t < NT; t++) {
        size_t n = 0;
        int k = 1 + (int)((x = x * 6364136223846793005ull + 1442695040888963407ull) >> 61);
        for (int i = 0; i < k; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            const char *q = parts[(x >> 33) % (uint64_t)np];
            size_t m = strlen(q);
            if (n + m > sizeof store[t]) break;
            memcpy(store[t] + n, q, m);
            n += m;
        }
        bytes[t] = store[t], len[t] = n;
    }
    q35_token_trie *trie = q35_token_trie_new(bytes, len, NT);
    REQUIRE(trie != NULL);
    static uint8_t live[NT];
    static const char *const docs[] = {
        "{\"a\": [1, -2.5e+3, 0, true, false, null, {}, []], \"b\": {\"c\": \"x\\n\\u00e9\\\"\xc3\xa9\"}}",
        "{ \"k\" :\n[ [ ] , { \"z\" : 0.5E-2 } ] }",
    };
    long bad = 0, states = 0;
    for (size_t d = 0; d < sizeof docs / sizeof *docs; d++)
        for (size_t k = 0; k < strlen(docs[d]); k++) {
            q35_json_prefix js;
            q35_json_prefix_init(&js);
            REQUIRE(q35_json_prefix_feed(&js, docs[d], k));
            q35_token_trie_mask_by(trie, q35_json_prefix_byte, &js, sizeof js, q35_json_prefix_in_string(&js), live);
            for (int t = 0; t < NT; t++) {
                q35_json_prefix trial = js;
                const bool want = bytes[t] && len[t] && q35_json_prefix_feed(&trial, bytes[t], len[t]);
                bad += want != (live[t] != 0);
            }
            states++;
        }
    CHECK_MSG(bad == 0 && states > 100, "%ld token decisions differ over %ld states", bad, states);
    q35_token_trie_free(trie);
}
