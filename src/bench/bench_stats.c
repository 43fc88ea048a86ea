/* bench_stats.c: SSE parsing, timing statistics, hashing and /metrics
 * reading for `qwen35 bench` (see bench_stats.h). Nothing here does I/O or
 * reads a clock: times come in with the bytes. */
#include "bench/bench_stats.h"

#include <jansson.h>
#include <math.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SSE_MAX_LINE ((size_t)16 << 20)

const char *const q35_bench_metric_drafts[] = {
    "vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_drafts_total", NULL};
const char *const q35_bench_metric_draft_tokens[] = {
    "vllm:spec_decode_num_draft_tokens_total", "llamacpp:spec_decode_num_draft_tokens_total", NULL};
const char *const q35_bench_metric_accepted_tokens[] = {
    "vllm:spec_decode_num_accepted_tokens_total", "llamacpp:spec_decode_num_accepted_tokens_total", NULL};
const char *const q35_bench_metric_peak_memory[] = {"process_resident_memory_peak_bytes", NULL};
const char *const q35_bench_metric_resident_memory[] = {"process_resident_memory_bytes", NULL};

/* Appends n bytes to a growing NUL-terminated buffer; false when out of memory. */
static bool buf_append(char **buf, size_t *len, size_t *cap, const char *src, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t want = *cap ? *cap : 256;
        while (want < *len + n + 1) want *= 2;
        char *p = realloc(*buf, want);
        if (!p) return false;
        *buf = p;
        *cap = want;
    }
    memcpy(*buf + *len, src, n);
    *len += n;
    (*buf)[*len] = 0;
    return true;
}

void q35_bench_stream_init(q35_bench_stream *s) {
    memset(s, 0, sizeof *s);
    s->t_first_text = s->t_last_text = -1;
    s->completion_tokens = s->prompt_tokens = s->cached_tokens = -1;
    s->draft_tokens = s->accepted_tokens = -1;
}

void q35_bench_stream_free(q35_bench_stream *s) {
    free(s->line);
    free(s->data);
    free(s->text);
    q35_bench_stream_init(s);
}

static bool stream_fail(q35_bench_stream *s, const char *fmt, const char *detail) {
    s->failed = true;
    snprintf(s->error, sizeof s->error, fmt, detail);
    return false;
}

static int64_t json_int_or(json_t *obj, const char *key, int64_t fallback) {
    json_t *v = json_object_get(obj, key);
    return json_is_integer(v) ? (int64_t)json_integer_value(v) : fallback;
}

/* One complete event: [DONE], an error, or a completion chunk. */
static bool stream_event(q35_bench_stream *s, const char *data, size_t len, double t) {
    if (len == 6 && !memcmp(data, "[DONE]", 6)) {
        s->done = true;
        return true;
    }
    json_error_t jerr;
    json_t *root = json_loadb(data, len, 0, &jerr);
    if (!json_is_object(root)) {
        char excerpt[81];
        snprintf(excerpt, sizeof excerpt, "%.*s", (int)(len < 80 ? len : 80), data);
        json_decref(root);
        return stream_fail(s, "malformed event (not a JSON object): %s", excerpt);
    }
    s->n_events++;
    json_t *error = json_object_get(root, "error");
    if (error && !json_is_null(error)) {
        json_t *msg = json_is_object(error) ? json_object_get(error, "message") : error;
        char text[400];
        snprintf(text, sizeof text, "%s", json_is_string(msg) ? json_string_value(msg) : "(no message)");
        json_decref(root);
        return stream_fail(s, "the server sent an error event: %s", text);
    }
    json_t *choices = json_object_get(root, "choices");
    if (choices && !json_is_array(choices)) {
        json_decref(root);
        return stream_fail(s, "malformed event: %s", "\"choices\" is not an array");
    }
    json_t *choice = json_array_get(choices, 0);
    if (choice) {
        json_t *text = json_object_get(choice, "text");
        if (text && !json_is_string(text) && !json_is_null(text)) {
            json_decref(root);
            return stream_fail(s, "malformed event: %s", "\"text\" is not a string");
        }
        size_t n = json_is_string(text) ? json_string_length(text) : 0;
        if (n > 0) {
            if (!buf_append(&s->text, &s->text_len, &s->text_cap, json_string_value(text), n)) {
                json_decref(root);
                return stream_fail(s, "%s", "out of memory");
            }
            if (s->t_first_text < 0) s->t_first_text = t;
            s->t_last_text = t;
            s->n_text_events++;
        }
        json_t *finish = json_object_get(choice, "finish_reason");
        if (json_is_string(finish))
            snprintf(s->finish_reason, sizeof s->finish_reason, "%s", json_string_value(finish));
    }
    json_t *usage = json_object_get(root, "usage");
    if (json_is_object(usage)) {
        s->completion_tokens = json_int_or(usage, "completion_tokens", s->completion_tokens);
        s->prompt_tokens = json_int_or(usage, "prompt_tokens", s->prompt_tokens);
        json_t *details = json_object_get(usage, "prompt_tokens_details");
        if (json_is_object(details)) s->cached_tokens = json_int_or(details, "cached_tokens", s->cached_tokens);
    }
    json_t *timings = json_object_get(root, "timings");
    if (json_is_object(timings)) {
        s->draft_tokens = json_int_or(timings, "draft_n", s->draft_tokens);
        s->accepted_tokens = json_int_or(timings, "draft_n_accepted", s->accepted_tokens);
    }
    json_decref(root);
    return true;
}

static bool stream_dispatch(q35_bench_stream *s, double t) {
    bool ok = stream_event(s, s->data ? s->data : "", s->data_len, t);
    s->have_data = false;
    s->data_len = 0;
    return ok;
}

/* One line, without its terminator. Only data: lines matter; comments
 * (":ping"), event:, id: and retry: are ignored, as a browser would. */
static bool stream_line(q35_bench_stream *s, const char *line, size_t len, double t) {
    if (len == 0) return s->have_data ? stream_dispatch(s, t) : true;
    if (len < 5 || memcmp(line, "data:", 5) != 0) return true;
    line += 5;
    len -= 5;
    if (len > 0 && line[0] == ' ') line++, len--;
    if (s->have_data && !buf_append(&s->data, &s->data_len, &s->data_cap, "\n", 1))
        return stream_fail(s, "%s", "out of memory");
    if (!buf_append(&s->data, &s->data_len, &s->data_cap, line, len))
        return stream_fail(s, "%s", "out of memory");
    s->have_data = true;
    return true;
}

bool q35_bench_stream_feed(q35_bench_stream *s, const char *buf, size_t n, double t) {
    if (s->failed) return false;
    for (size_t i = 0; i < n && !s->done;) {
        const char *nl = memchr(buf + i, '\n', n - i);
        size_t take = nl ? (size_t)(nl - (buf + i)) : n - i;
        if (s->line_len + take > SSE_MAX_LINE) return stream_fail(s, "%s", "an SSE line longer than 16 MiB");
        if (!buf_append(&s->line, &s->line_len, &s->line_cap, buf + i, take))
            return stream_fail(s, "%s", "out of memory");
        i += take;
        if (!nl) break;
        i++; /* the '\n' */
        size_t len = s->line_len;
        if (len > 0 && s->line[len - 1] == '\r') len--;
        s->line_len = 0;
        if (!stream_line(s, s->line, len, t)) return false;
    }
    return true;
}

bool q35_bench_stream_finish(q35_bench_stream *s, double t) {
    if (s->failed) return false;
    if (s->done) return true;
    if (s->line_len > 0) {
        size_t len = s->line_len;
        s->line_len = 0;
        if (!stream_line(s, s->line, len, t)) return false;
    }
    return s->have_data ? stream_dispatch(s, t) : true;
}

/* ---- statistics ------------------------------------------------------- */

double q35_bench_decode_rate(int64_t completion_tokens, double t_first_text, double t_last_text) {
    double dt = t_last_text - t_first_text;
    if (completion_tokens < 2 || !(dt > 0)) return NAN;
    return (double)(completion_tokens - 1) / dt;
}

size_t q35_bench_median_index(const double *v, size_t n) {
    /* Rank every finite sample by (value, index); the median is the one whose
     * rank is (count - 1) / 2. O(n^2), and n is the number of runs. */
    size_t count = 0;
    for (size_t i = 0; i < n; i++) count += isfinite(v[i]) ? 1 : 0;
    if (count == 0) return SIZE_MAX;
    size_t want = (count - 1) / 2;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        size_t rank = 0;
        for (size_t j = 0; j < n; j++)
            if (isfinite(v[j]) && (v[j] < v[i] || (v[j] == v[i] && j < i))) rank++;
        if (rank == want) return i;
    }
    return SIZE_MAX; /* not reached */
}

q35_bench_range q35_bench_range_of(const double *v, size_t n) {
    q35_bench_range r = {NAN, NAN, NAN, SIZE_MAX, 0};
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(v[i])) continue;
        if (r.n == 0 || v[i] < r.min) r.min = v[i];
        if (r.n == 0 || v[i] > r.max) r.max = v[i];
        r.n++;
    }
    r.median_index = q35_bench_median_index(v, n);
    if (r.median_index != SIZE_MAX) r.median = v[r.median_index];
    return r;
}

size_t q35_bench_count_distinct(const char *const *items, size_t n) {
    size_t distinct = 0;
    for (size_t i = 0; i < n; i++) {
        if (!items[i]) continue;
        bool seen = false;
        for (size_t j = 0; j < i && !seen; j++) seen = items[j] && !strcmp(items[j], items[i]);
        distinct += seen ? 0 : 1;
    }
    return distinct;
}

void q35_bench_sha256_hex(const void *data, size_t n, char out[65]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int md_len = 0;
    if (!EVP_Digest(data, n, md, &md_len, EVP_sha256(), NULL) || md_len != 32) {
        out[0] = 0;
        return;
    }
    for (unsigned i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", md[i]);
}

/* ---- Prometheus text exposition ---------------------------------------- */

/* The value of one sample line "name{labels} value [timestamp]", after the
 * name. Label values are quoted strings that may hold '}' or escaped quotes. */
static bool prom_sample_value(const char *p, const char *end, double *value) {
    if (p < end && *p == '{') {
        bool quoted = false;
        for (p++; p < end; p++) {
            if (quoted && *p == '\\') { p++; continue; }
            if (*p == '"') quoted = !quoted;
            else if (!quoted && *p == '}') break;
        }
        if (p >= end) return false;
        p++;
    }
    if (p >= end || (*p != ' ' && *p != '\t')) return false;
    char num[64];
    while (p < end && (*p == ' ' || *p == '\t')) p++;
    size_t len = 0;
    while (p + len < end && p[len] != ' ' && p[len] != '\t' && len < sizeof num - 1) len++;
    memcpy(num, p, len);
    num[len] = 0;
    char *stop;
    *value = strtod(num, &stop);
    return len > 0 && *stop == 0;
}

bool q35_prom_sum(const char *text, const char *name, double *sum) {
    size_t name_len = strlen(name);
    bool found = false;
    double total = 0;
    for (const char *line = text; line && *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        double v;
        if (line[0] != '#' && (size_t)(end - line) > name_len && !memcmp(line, name, name_len) &&
            prom_sample_value(line + name_len, end, &v)) {
            total += v;
            found = true;
        }
        line = *end ? end + 1 : end;
    }
    if (found) *sum = total;
    return found;
}

const char *q35_prom_first(const char *text, const char *const *names, double *value) {
    for (size_t i = 0; names[i]; i++)
        if (q35_prom_sum(text, names[i], value)) return names[i];
    return NULL;
}
