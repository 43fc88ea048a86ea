/* Tests of src/bench_stats.c: the SSE stream a bench request reads, the
 * decode-rate formula, median selection, hashing, distinct completions and
 * /metrics parsing. Times are synthetic: each feed carries its own clock. */
#include "bench/bench_stats.h"
#include "test.h"

#include <stdint.h>

static const char *const CHUNK_A = "data: {\"id\":\"cmpl-1\",\"object\":\"text_completion\",\"choices\":"
                                   "[{\"index\":0,\"text\":\"Hello\",\"finish_reason\":null}]}\n\n";
static const char *const CHUNK_B = "data: {\"choices\":[{\"index\":0,\"text\":\" world\",\"finish_reason\":\"length\"}]}\n\n";
static const char *const USAGE = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":3,"
                                 "\"total_tokens\":8,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n";

static bool feed_str(q35_bench_stream *s, const char *text, double t) {
    return q35_bench_stream_feed(s, text, strlen(text), t);
}

TEST(bench, stream_records_text_times_and_usage) {
    q35_bench_stream s;
    q35_bench_stream_init(&s);
    CHECK(feed_str(&s, ": ping\n\n", 0.5));
    CHECK(feed_str(&s, "data: {\"choices\":[{\"index\":0,\"text\":\"\"}]}\n\n", 0.9)); /* empty text: not a text time */
    CHECK(feed_str(&s, CHUNK_A, 1.0));
    CHECK(feed_str(&s, CHUNK_B, 1.5));
    CHECK(feed_str(&s, USAGE, 1.6));
    CHECK(feed_str(&s, "data: [DONE]\n\n", 1.7));
    CHECK(q35_bench_stream_finish(&s, 1.8));
    CHECK(s.done);
    CHECK(!s.failed);
    CHECK_STR_EQ(s.text, "Hello world");
    CHECK_NEAR(s.t_first_text, 1.0, 0);
    CHECK_NEAR(s.t_last_text, 1.5, 0);
    CHECK_EQ_INT(s.n_text_events, 2);
    CHECK_EQ_INT(s.n_events, 4);
    CHECK_EQ_INT(s.completion_tokens, 3);
    CHECK_EQ_INT(s.prompt_tokens, 5);
    CHECK_EQ_INT(s.cached_tokens, 0);
    CHECK_EQ_INT(s.draft_tokens, -1);
    CHECK_STR_EQ(s.finish_reason, "length");
    q35_bench_stream_free(&s);
}

TEST(bench, stream_split_anywhere_gives_the_same_result) {
    /* The same bytes cut at every position, with CRLF line ends, must parse
     * the same: TCP may deliver an event in any number of pieces. */
    char all[1024];
    snprintf(all, sizeof all, "data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: {\"choices\":[{\"text\":\"b\"}]}\r\n\r\n"
                              "data: [DONE]\r\n\r\n");
    size_t n = strlen(all);
    for (size_t cut = 0; cut <= n; cut++) {
        q35_bench_stream s;
        q35_bench_stream_init(&s);
        CHECK(q35_bench_stream_feed(&s, all, cut, 1.0));
        CHECK(q35_bench_stream_feed(&s, all + cut, n - cut, 2.0));
        CHECK(q35_bench_stream_finish(&s, 3.0));
        CHECK(s.done);
        CHECK_STR_EQ(s.text, "ab");
        CHECK_EQ_INT(s.n_text_events, 2);
        q35_bench_stream_free(&s);
    }
}

TEST(bench, stream_joins_multiline_data_and_ignores_other_fields) {
    q35_bench_stream s;
    q35_bench_stream_init(&s);
    CHECK(feed_str(&s, "event: message\nid: 7\ndata: {\"choices\":\ndata: [{\"text\":\"x\"}]}\n\n", 1.0));
    CHECK_STR_EQ(s.text, "x");
    CHECK(feed_str(&s, "data:[DONE]\n\ndata: {not json after done\n\n", 2.0));
    CHECK(s.done);
    CHECK(!s.failed);
    q35_bench_stream_free(&s);
}

TEST(bench, stream_rejects_malformed_events) {
    q35_bench_stream s;
    q35_bench_stream_init(&s);
    CHECK(feed_str(&s, CHUNK_A, 1.0));
    CHECK(!feed_str(&s, "data: {\"choices\": [{\"text\": \"oops\"\n\n", 1.1));
    CHECK(s.failed);
    CHECK_MSG(strstr(s.error, "malformed") != NULL, "error: %s", s.error);
    CHECK(!feed_str(&s, CHUNK_B, 1.2)); /* stays failed */
    q35_bench_stream_free(&s);

    q35_bench_stream_init(&s);
    CHECK(!feed_str(&s, "data: {\"choices\": 3}\n\n", 1.0));
    CHECK(s.failed);
    q35_bench_stream_free(&s);

    q35_bench_stream_init(&s);
    CHECK(!feed_str(&s, "data: [1, 2]\n\n", 1.0));
    q35_bench_stream_free(&s);
}

TEST(bench, stream_reports_error_events) {
    q35_bench_stream s;
    q35_bench_stream_init(&s);
    CHECK(!feed_str(&s, "data: {\"error\":{\"message\":\"engine died\",\"code\":500}}\n\n", 1.0));
    CHECK(s.failed);
    CHECK_MSG(strstr(s.error, "engine died") != NULL, "error: %s", s.error);
    q35_bench_stream_free(&s);
}

TEST(bench, stream_cut_mid_stream_has_no_done) {
    /* A server that dies mid-stream: the events so far count, [DONE] never
     * comes, and an unterminated last event is still dispatched at finish. */
    q35_bench_stream s;
    q35_bench_stream_init(&s);
    CHECK(feed_str(&s, CHUNK_A, 1.0));
    CHECK(feed_str(&s, "data: {\"choices\":[{\"text\":\"!\"}]}", 1.1));
    CHECK(q35_bench_stream_finish(&s, 1.2));
    CHECK(!s.done);
    CHECK_STR_EQ(s.text, "Hello!");
    CHECK_EQ_INT(s.completion_tokens, -1);
    q35_bench_stream_free(&s);

    q35_bench_stream_init(&s);
    CHECK(feed_str(&s, "data: {\"choices\":[{\"text\":\"trunc", 1.0));
    CHECK(!q35_bench_stream_finish(&s, 1.1));
    CHECK(s.failed);
    q35_bench_stream_free(&s);
}

TEST(bench, stream_reads_llama_server_timings) {
    q35_bench_stream s;
    q35_bench_stream_init(&s);
    CHECK(feed_str(&s, "data: {\"choices\":[],\"usage\":{\"completion_tokens\":512},"
                       "\"timings\":{\"draft_n\":279,\"draft_n_accepted\":232}}\n\n", 1.0));
    CHECK_EQ_INT(s.draft_tokens, 279);
    CHECK_EQ_INT(s.accepted_tokens, 232);
    CHECK_EQ_INT(s.completion_tokens, 512);
    q35_bench_stream_free(&s);
}

TEST(bench, decode_rate_is_the_seed_formula) {
    /* 512 tokens: the first arrives at TTFT, the other 511 over 6.71 s. */
    CHECK_NEAR(q35_bench_decode_rate(512, 0.209, 0.209 + 6.71), 511 / 6.71, 1e-9);
    CHECK_NEAR(q35_bench_decode_rate(2, 1.0, 1.5), 2.0, 1e-12);
    CHECK(isnan(q35_bench_decode_rate(1, 1.0, 2.0)));
    CHECK(isnan(q35_bench_decode_rate(0, -1, -1)));
    CHECK(isnan(q35_bench_decode_rate(10, 2.0, 2.0)));
    CHECK(isnan(q35_bench_decode_rate(10, 2.0, 1.0)));
}

TEST(bench, median_is_a_real_sample) {
    const double five[] = {71.2, 70.5, 76.1, 69.0, 72.4};
    CHECK_EQ_INT(q35_bench_median_index(five, 5), 0); /* 71.2 */
    const double four[] = {4, 1, 3, 2};
    CHECK_EQ_INT(q35_bench_median_index(four, 4), 3); /* lower middle: 2 */
    const double ties[] = {5, 5, 5};
    CHECK_EQ_INT(q35_bench_median_index(ties, 3), 1);
    const double one[] = {9};
    CHECK_EQ_INT(q35_bench_median_index(one, 1), 0);
    const double gaps[] = {NAN, 3, INFINITY, 1, 2};
    CHECK_EQ_INT(q35_bench_median_index(gaps, 5), 4); /* among 3, 1, 2 */
    const double none[] = {NAN};
    CHECK(q35_bench_median_index(none, 1) == SIZE_MAX);
    CHECK(q35_bench_median_index(none, 0) == SIZE_MAX);

    q35_bench_range r = q35_bench_range_of(five, 5);
    CHECK_NEAR(r.min, 69.0, 0);
    CHECK_NEAR(r.median, 71.2, 0);
    CHECK_NEAR(r.max, 76.1, 0);
    CHECK_EQ_INT(r.n, 5);
    r = q35_bench_range_of(none, 1);
    CHECK(isnan(r.median) && isnan(r.min) && r.n == 0);
}

TEST(bench, sha256_and_distinct_completions) {
    char h[65], e[65], x[65];
    q35_bench_sha256_hex("abc", 3, h);
    CHECK_STR_EQ(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    q35_bench_sha256_hex("", 0, e);
    CHECK_STR_EQ(e, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    q35_bench_sha256_hex("abd", 3, x);
    const char *five_same[] = {h, h, h, h, h};
    CHECK_EQ_INT(q35_bench_count_distinct(five_same, 5), 1);
    /* The seed's longer prompt: three distinct completions in five repeats. */
    const char *seed_long[] = {h, e, h, x, e};
    CHECK_EQ_INT(q35_bench_count_distinct(seed_long, 5), 3);
    const char *with_null[] = {NULL, h, NULL};
    CHECK_EQ_INT(q35_bench_count_distinct(with_null, 3), 1);
    CHECK_EQ_INT(q35_bench_count_distinct(with_null, 0), 0);
}

TEST(bench, prometheus_sums_labelled_samples) {
    const char *page =
        "# HELP vllm:spec_decode_num_drafts_total Number of drafts.\n"
        "# TYPE vllm:spec_decode_num_drafts_total counter\n"
        "vllm:spec_decode_num_drafts_total{engine=\"0\",model_name=\"q{1}\"} 200.0\n"
        "vllm:spec_decode_num_drafts_total{engine=\"1\",model_name=\"a \\\"b\\\"\"} 79 1700000000000\n"
        "vllm:spec_decode_num_drafts_created{engine=\"0\"} 1.7e9\n"
        "llamacpp:spec_decode_num_draft_tokens_total 300\n"
        "process_resident_memory_bytes 1.5e+09\n";
    double v = 0;
    CHECK(q35_prom_sum(page, "vllm:spec_decode_num_drafts_total", &v));
    CHECK_NEAR(v, 279, 0);
    CHECK(q35_prom_sum(page, "process_resident_memory_bytes", &v));
    CHECK_NEAR(v, 1.5e9, 0);
    CHECK(!q35_prom_sum(page, "vllm:spec_decode_num_drafts", &v)); /* a prefix is not the name */
    CHECK(!q35_prom_sum("", "x", &v));
    const char *name = q35_prom_first(page, q35_bench_metric_draft_tokens, &v);
    CHECK_STR_EQ(name, "llamacpp:spec_decode_num_draft_tokens_total");
    CHECK_NEAR(v, 300, 0);
    CHECK(q35_prom_first(page, q35_bench_metric_peak_memory, &v) == NULL);
}
