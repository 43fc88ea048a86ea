/* bench_stats.h: the measurement logic of `qwen35 bench`, kept free of I/O so
 * that unit tests can drive it with synthetic bytes and clocks.
 *
 * Data flow: the bytes of one streaming /v1/completions response arrive in
 * pieces, each stamped with its arrival time, and go to q35_bench_stream_feed.
 * The stream splits them into server-sent events, parses each event's JSON and
 * keeps what the protocol needs: the arrival times of the first and last
 * events that carry non-empty text, the text itself (for its SHA-256), the
 * final usage, and any speculation counters the server puts in the response.
 * Separately, q35_prom_sum reads counters out of a /metrics page, and the
 * stats helpers turn a workload's runs into min / median / max. */
#ifndef Q35_BENCH_STATS_H
#define Q35_BENCH_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* ---- one streamed completion ------------------------------------------ */

typedef struct q35_bench_stream {
    /* SSE framing: the line being assembled and the data of the event being
     * assembled (several data: lines join with '\n', as the SSE spec says). */
    char *line;
    size_t line_len, line_cap;
    char *data;
    size_t data_len, data_cap;
    bool have_data;

    /* What the events said. */
    char *text; /* every choices[0].text concatenated, NUL-terminated */
    size_t text_len, text_cap;
    double t_first_text, t_last_text; /* arrival of first/last event with non-empty text; -1: none */
    int64_t n_events;                 /* data events, [DONE] excluded */
    int64_t n_text_events;            /* events that carried non-empty text */
    int64_t completion_tokens;        /* usage.completion_tokens; -1: never reported */
    int64_t prompt_tokens;            /* usage.prompt_tokens; -1: never reported */
    int64_t cached_tokens;            /* usage.prompt_tokens_details.cached_tokens; -1: absent */
    int64_t draft_tokens;             /* timings.draft_n (llama-server); -1: absent */
    int64_t accepted_tokens;          /* timings.draft_n_accepted (llama-server); -1: absent */
    char finish_reason[32];           /* "" until a chunk names one */
    bool done;                        /* saw data: [DONE] */
    bool failed;                      /* a malformed or error event: error says which */
    char error[512];
} q35_bench_stream;

void q35_bench_stream_init(q35_bench_stream *s);
void q35_bench_stream_free(q35_bench_stream *s);

/* Feeds n bytes that arrived at time t (seconds, CLOCK_MONOTONIC). Returns
 * false once the stream is unusable: a data event that is not a JSON object,
 * an event carrying {"error": ...}, or a line longer than 16 MiB. Bytes after
 * [DONE] are ignored. */
bool q35_bench_stream_feed(q35_bench_stream *s, const char *buf, size_t n, double t);

/* At the end of the transfer: dispatches an event left without its closing
 * blank line. Returns false when that event is malformed. */
bool q35_bench_stream_finish(q35_bench_stream *s, double t);

/* ---- statistics ------------------------------------------------------- */

/* Decode throughput exactly as the seed defines it:
 * (completion_tokens - 1) / (last_text_time - first_text_time). The first
 * token's time belongs to TTFT, so it is left out. NAN when it is undefined
 * (fewer than two tokens, or no time between first and last text). */
double q35_bench_decode_rate(int64_t completion_tokens, double t_first_text, double t_last_text);

/* Index into v of the median sample among its finite values: the middle one
 * for an odd count, the lower middle for an even count, so that the median is
 * always a real run whose own evidence can be shown (as the seed submits its
 * median-throughput iteration). Equal values keep their original order.
 * Returns SIZE_MAX when v holds no finite value. */
size_t q35_bench_median_index(const double *v, size_t n);

typedef struct q35_bench_range {
    double min, median, max; /* NAN when no finite sample */
    size_t median_index;     /* SIZE_MAX when no finite sample */
    size_t n;                /* finite samples */
} q35_bench_range;

q35_bench_range q35_bench_range_of(const double *v, size_t n);

/* How many different strings items holds (NULL entries are skipped). */
size_t q35_bench_count_distinct(const char *const *items, size_t n);

/* SHA-256 of n bytes as 64 lowercase hex digits and a NUL. */
void q35_bench_sha256_hex(const void *data, size_t n, char out[65]);

/* ---- Prometheus text exposition ---------------------------------------- */

/* Sums every sample of the metric called exactly `name` (whatever its labels)
 * in a /metrics page. Returns false when the page has no such sample. */
bool q35_prom_sum(const char *text, const char *name, double *sum);

/* The metric names bench reads, each list NULL-terminated and tried in order;
 * the first name present in the page wins. qwen35 serve should expose the
 * first name of each list (the vLLM names, so vLLM dashboards work too).
 *   drafts:           speculation steps that proposed draft tokens
 *   draft_tokens:     draft tokens proposed
 *   accepted_tokens:  draft tokens the target model accepted
 *   peak_memory:      the server process's peak resident set (VmHWM), bytes
 *   resident_memory:  its current resident set, bytes (sampled after every
 *                     request; the largest sample stands in for the peak) */
extern const char *const q35_bench_metric_drafts[];
extern const char *const q35_bench_metric_draft_tokens[];
extern const char *const q35_bench_metric_accepted_tokens[];
extern const char *const q35_bench_metric_peak_memory[];
extern const char *const q35_bench_metric_resident_memory[];

/* The first name of a list that q35_prom_sum finds in text; NULL if none. */
const char *q35_prom_first(const char *text, const char *const *names, double *value);

#endif
