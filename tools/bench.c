/* bench.c: `qwen35 bench`, the seed's sequential streaming speed protocol
 * against any OpenAI-compatible server (qwen35 serve, llama-server, vLLM).
 *
 * For each workload it sends warmup and then measured /v1/completions
 * requests, one at a time: temperature 0, stream with usage, ignore_eos so
 * every request generates exactly max_tokens, and prefix caching switched off
 * per request where the server has a switch for it. The bytes of each
 * response go, stamped with CLOCK_MONOTONIC, to q35_bench_stream
 * (src/bench_stats.c), which yields TTFT, decode tok/s, the text and its
 * SHA-256. /metrics is read before and after every measured request, outside
 * the timed region, for the speculation counters and server memory. Results
 * go to the terminal as a table and, after every request, to the JSON file
 * (schema in bench/README.md), so a run that fails keeps what it measured. */
#include "bench/bench_stats.h"
#include "cli.h"
#include "qwen35.h"
#include "base/util.h"

#include <curl/curl.h>
#include <jansson.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define SCHEMA "qwen35-bench/1"

static const char *const builtin_workloads[] = {"short", "code", "long", "reasoning"};
#define N_BUILTIN (sizeof builtin_workloads / sizeof builtin_workloads[0])

typedef struct bench_opts {
    char base_url[512];   /* without a trailing "/" or "/v1" */
    const char *model;    /* NULL: the first of /v1/models */
    const char *api_key;
    const char *workload;
    const char *output;
    int warmups, runs, max_tokens;
    double timeout_s;     /* per request: until the first text, and between events */
    bool keep_prefix_cache;
} bench_opts;

typedef struct workload {
    char name[256];
    char path[PATH_MAX];
    char *prompt;
    size_t prompt_len;
} workload;

/* Speculation counters of one request (or a sum of them); -1: not known. */
typedef struct spec_counts {
    double drafts, draft_tokens, accepted_tokens;
    const char *source; /* "metrics", "response" or NULL */
} spec_counts;

typedef struct run_result {
    bool warmup, ok;
    double ttft_ms, decode_tok_s, total_ms;
    int64_t completion_tokens, prompt_tokens, cached_tokens, text_events;
    const char *tokens_source; /* "usage" or "chunks" */
    char sha256[65];
    char finish_reason[32];
    spec_counts spec;
    char error[1536];
} run_result;

/* ---- HTTP ------------------------------------------------------------- */

typedef struct grow_buf { char *data; size_t len, cap; } grow_buf;

static size_t collect_body(char *ptr, size_t size, size_t nmemb, void *user) {
    grow_buf *b = user;
    size_t n = size * nmemb;
    if (b->len + n + 1 > b->cap) {
        size_t want = b->cap ? b->cap * 2 : 4096;
        while (want < b->len + n + 1) want *= 2;
        char *p = realloc(b->data, want);
        if (!p) return 0;
        b->data = p;
        b->cap = want;
    }
    memcpy(b->data + b->len, ptr, n);
    b->len += n;
    b->data[b->len] = 0;
    return n;
}

static struct curl_slist *auth_headers(const bench_opts *o, bool json_body) {
    struct curl_slist *h = NULL;
    if (json_body) h = curl_slist_append(h, "Content-Type: application/json");
    if (o->api_key) {
        char line[1200];
        snprintf(line, sizeof line, "Authorization: Bearer %s", o->api_key);
        h = curl_slist_append(h, line);
    }
    return h;
}

/* The message of an error body in either the OpenAI/vLLM/llama-server shape
 * {"error": {"message": ...}}, the older flat {"message": ...}, or raw text. */
static void error_body_message(const char *body, char *out, size_t size) {
    json_t *root = body ? json_loads(body, 0, NULL) : NULL;
    json_t *err = json_object_get(root, "error");
    json_t *msg = json_is_object(err) ? json_object_get(err, "message") : err;
    if (!json_is_string(msg)) msg = json_object_get(root, "message");
    if (json_is_string(msg)) snprintf(out, size, "%s", json_string_value(msg));
    else snprintf(out, size, "%.200s", body && *body ? body : "(empty body)");
    json_decref(root);
}

static void http_status_error(long status, const char *url, const char *body, char *out, size_t size) {
    char msg[400];
    error_body_message(body, msg, sizeof msg);
    snprintf(out, size, "%s answered HTTP %ld: %s%s", url, status, msg,
             status == 401 || status == 403 ? " (pass the server's key with --api-key)" : "");
}

/* GET url into *body. Returns the HTTP status, or 0 with err filled. */
static long http_get(const bench_opts *o, const char *url, grow_buf *body, char *err, size_t err_size) {
    CURL *c = curl_easy_init();
    char cerr[CURL_ERROR_SIZE] = "";
    struct curl_slist *h = auth_headers(o, false);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, (long)(o->timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, (long)(o->timeout_s * 1000));
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    CURLcode rc = curl_easy_perform(c);
    long status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
    else snprintf(err, err_size, "cannot reach %s: %s", url, cerr[0] ? cerr : curl_easy_strerror(rc));
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    return status;
}

/* The /metrics page, or NULL when the server has none (not an error). */
static char *fetch_metrics(const bench_opts *o) {
    char url[600], err[1024];
    grow_buf body = {0};
    snprintf(url, sizeof url, "%s/metrics", o->base_url);
    if (http_get(o, url, &body, err, sizeof err) != 200) {
        free(body.data);
        return NULL;
    }
    return body.data ? body.data : strdup("");
}

/* --model not given: ask /v1/models, as clients of vLLM do. */
static char *resolve_model(const bench_opts *o, char *err, size_t err_size) {
    char url[600];
    grow_buf body = {0};
    snprintf(url, sizeof url, "%s/v1/models", o->base_url);
    long status = http_get(o, url, &body, err, err_size);
    char *model = NULL;
    if (status == 200) {
        json_t *root = json_loads(body.data ? body.data : "", 0, NULL);
        json_t *id = json_object_get(json_array_get(json_object_get(root, "data"), 0), "id");
        if (json_is_string(id)) model = strdup(json_string_value(id));
        else snprintf(err, err_size, "%s: no model listed; name one with --model", url);
        json_decref(root);
    } else if (status != 0) {
        http_status_error(status, url, body.data, err, err_size);
    }
    free(body.data);
    return model;
}

/* ---- one streaming request -------------------------------------------- */

typedef struct stream_ctx {
    q35_bench_stream stream;
    CURL *curl;
    long status;         /* 0 until the headers are in */
    grow_buf error_body; /* the body of a non-200 answer */
    grow_buf head;       /* the first bytes of a 200 answer, for messages */
    double t_start, t_activity, timeout_s;
    bool timed_out;
} stream_ctx;

static size_t on_stream_bytes(char *ptr, size_t size, size_t nmemb, void *user) {
    stream_ctx *x = user;
    size_t n = size * nmemb;
    double now = q35_now_seconds();
    x->t_activity = now;
    if (!x->status) curl_easy_getinfo(x->curl, CURLINFO_RESPONSE_CODE, &x->status);
    if (x->status != 200) return x->error_body.len < 65536 ? collect_body(ptr, size, nmemb, &x->error_body) : n;
    if (x->head.len < 200) collect_body(ptr, 1, n < 200 ? n : 200, &x->head);
    return q35_bench_stream_feed(&x->stream, ptr, n, now) ? n : 0; /* 0 aborts the transfer */
}

/* Called by libcurl about once a second even when nothing arrives. */
static int on_stream_progress(void *user, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow) {
    stream_ctx *x = user;
    double now = q35_now_seconds();
    bool waiting_first = x->stream.t_first_text < 0 && now - x->t_start > x->timeout_s;
    bool stalled = now - x->t_activity > x->timeout_s;
    if (waiting_first || stalled) x->timed_out = true;
    return x->timed_out ? 1 : 0;
}

static char *request_body(const bench_opts *o, const char *model, const workload *w, int seq) {
    json_t *b = json_object();
    json_object_set_new(b, "model", json_string(model));
    json_object_set_new(b, "prompt", json_stringn(w->prompt, w->prompt_len));
    json_object_set_new(b, "max_tokens", json_integer(o->max_tokens));
    json_object_set_new(b, "temperature", json_real(0));
    json_object_set_new(b, "stream", json_true());
    json_object_set_new(b, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(b, "ignore_eos", json_true());
    if (!o->keep_prefix_cache) {
        /* llama-server reuses the cached prompt unless told not to; vLLM has
         * no per-request switch, but a salt no other request shares keeps
         * this one from hitting blocks cached by the previous ones. */
        char salt[96];
        snprintf(salt, sizeof salt, "qwen35-bench-%ld-%d", (long)getpid(), seq);
        json_object_set_new(b, "cache_prompt", json_false());
        json_object_set_new(b, "cache_salt", json_string(salt));
    }
    char *s = json_dumps(b, JSON_COMPACT);
    json_decref(b);
    return s;
}

static void run_request(const bench_opts *o, const char *model, const workload *w, int seq, run_result *r) {
    char url[600], cerr[CURL_ERROR_SIZE] = "";
    snprintf(url, sizeof url, "%s/v1/completions", o->base_url);
    stream_ctx x = {.timeout_s = o->timeout_s};
    q35_bench_stream_init(&x.stream);
    char *body = request_body(o, model, w, seq);
    struct curl_slist *h = auth_headers(o, true);
    h = curl_slist_append(h, "Accept: text/event-stream");
    x.curl = curl_easy_init();
    curl_easy_setopt(x.curl, CURLOPT_URL, url);
    curl_easy_setopt(x.curl, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(x.curl, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(x.curl, CURLOPT_WRITEFUNCTION, on_stream_bytes);
    curl_easy_setopt(x.curl, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(x.curl, CURLOPT_XFERINFOFUNCTION, on_stream_progress);
    curl_easy_setopt(x.curl, CURLOPT_XFERINFODATA, &x);
    curl_easy_setopt(x.curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(x.curl, CURLOPT_ERRORBUFFER, cerr);
    curl_easy_setopt(x.curl, CURLOPT_CONNECTTIMEOUT_MS, (long)(o->timeout_s * 1000));
    curl_easy_setopt(x.curl, CURLOPT_TCP_NODELAY, 1L);
    curl_easy_setopt(x.curl, CURLOPT_NOSIGNAL, 1L);

    x.t_start = x.t_activity = q35_now_seconds();
    CURLcode rc = curl_easy_perform(x.curl);
    double t_end = q35_now_seconds();
    if (!x.status) curl_easy_getinfo(x.curl, CURLINFO_RESPONSE_CODE, &x.status);
    const char *ctype = NULL;
    curl_easy_getinfo(x.curl, CURLINFO_CONTENT_TYPE, &ctype);
    q35_bench_stream *s = &x.stream;
    bool parsed = rc == CURLE_OK && x.status == 200 ? q35_bench_stream_finish(s, t_end) : !s->failed;
    size_t esz = sizeof r->error;

    if (x.timed_out && s->t_first_text < 0)
        snprintf(r->error, esz, "%s: no text within %g s of sending the request (per-request timeout, --timeout)", url, o->timeout_s);
    else if (x.timed_out)
        snprintf(r->error, esz, "%s: the stream stalled for %g s after %lld events (per-request timeout, --timeout)",
                 url, o->timeout_s, (long long)s->n_events);
    else if (!parsed)
        snprintf(r->error, esz, "%s: %s", url, s->error);
    else if (x.status != 0 && x.status != 200)
        http_status_error(x.status, url, x.error_body.data, r->error, esz);
    else if (rc != CURLE_OK && x.status == 0)
        snprintf(r->error, esz, "cannot reach %s: %s", url, cerr[0] ? cerr : curl_easy_strerror(rc));
    else if (s->n_events == 0 && !s->done && !(ctype && strstr(ctype, "event-stream")))
        snprintf(r->error, esz, "%s answered without streaming (Content-Type: %s, body starts \"%.60s\"); "
                 "the server must support stream=true", url, ctype ? ctype : "none", x.head.data ? x.head.data : "");
    else if (!s->done)
        snprintf(r->error, esz, "%s: the stream ended after %lld events without data: [DONE] "
                 "(the server stopped mid-stream%s%s)", url, (long long)s->n_events,
                 rc != CURLE_OK ? ": " : "", rc != CURLE_OK ? (cerr[0] ? cerr : curl_easy_strerror(rc)) : "");
    else if (s->n_text_events == 0)
        snprintf(r->error, esz, "%s: the stream carried no text", url);
    r->ok = r->error[0] == 0;

    r->total_ms = (t_end - x.t_start) * 1e3;
    r->ttft_ms = s->t_first_text >= 0 ? (s->t_first_text - x.t_start) * 1e3 : NAN;
    r->text_events = s->n_text_events;
    r->completion_tokens = s->completion_tokens >= 0 ? s->completion_tokens : s->n_text_events;
    r->tokens_source = s->completion_tokens >= 0 ? "usage" : "chunks";
    r->decode_tok_s = q35_bench_decode_rate(r->completion_tokens, s->t_first_text, s->t_last_text);
    r->prompt_tokens = s->prompt_tokens;
    r->cached_tokens = s->cached_tokens;
    q35_bench_sha256_hex(s->text ? s->text : "", s->text_len, r->sha256);
    snprintf(r->finish_reason, sizeof r->finish_reason, "%s", s->finish_reason);
    r->spec = (spec_counts){-1, s->draft_tokens >= 0 ? (double)s->draft_tokens : -1,
                            s->accepted_tokens >= 0 ? (double)s->accepted_tokens : -1,
                            s->draft_tokens >= 0 ? "response" : NULL};

    q35_bench_stream_free(s);
    free(x.error_body.data);
    free(x.head.data);
    free(body);
    curl_slist_free_all(h);
    curl_easy_cleanup(x.curl);
}

/* ---- metrics around a request ------------------------------------------ */

typedef struct metrics_snap {
    bool have;
    double drafts, draft_tokens, accepted_tokens; /* -1: not exposed */
    double peak_bytes, resident_bytes;            /* -1: not exposed */
} metrics_snap;

static const metrics_snap no_metrics = {false, -1, -1, -1, -1, -1};

static metrics_snap read_metrics(const bench_opts *o) {
    metrics_snap m = no_metrics;
    char *page = fetch_metrics(o);
    if (!page) return m;
    m.have = true;
    q35_prom_first(page, q35_bench_metric_drafts, &m.drafts);
    q35_prom_first(page, q35_bench_metric_draft_tokens, &m.draft_tokens);
    q35_prom_first(page, q35_bench_metric_accepted_tokens, &m.accepted_tokens);
    q35_prom_first(page, q35_bench_metric_peak_memory, &m.peak_bytes);
    q35_prom_first(page, q35_bench_metric_resident_memory, &m.resident_bytes);
    free(page);
    return m;
}

static double counter_delta(double before, double after) {
    return before >= 0 && after >= 0 ? after - before : -1;
}

/* ---- workloads --------------------------------------------------------- */

/* Where the stored prompts live: $Q35_BENCH_WORKLOADS, then bench/workloads
 * next to the build directory that holds this program, then ./bench/workloads. */
static bool find_builtin(const char *name, char *path, size_t size) {
    char exe[PATH_MAX];
    const char *env = getenv("Q35_BENCH_WORKLOADS");
    if (env && *env) {
        snprintf(path, size, "%.3000s/%.200s.txt", env, name);
        if (q35_file_exists(path)) return true;
    }
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) *slash = 0;
        snprintf(path, size, "%.3000s/../bench/workloads/%.200s.txt", exe, name);
        if (q35_file_exists(path)) return true;
    }
    snprintf(path, size, "bench/workloads/%s.txt", name);
    return q35_file_exists(path);
}

static bool is_builtin(const char *name) {
    for (size_t i = 0; i < N_BUILTIN; i++)
        if (!strcmp(name, builtin_workloads[i])) return true;
    return false;
}

/* Loads one workload: a built-in name or a file whose content is the prompt.
 * Trailing newlines are not part of the prompt. */
static bool load_workload(const char *spec, workload *w, char *err, size_t err_size) {
    memset(w, 0, sizeof *w);
    if (is_builtin(spec)) {
        snprintf(w->name, sizeof w->name, "%s", spec);
        if (!find_builtin(spec, w->path, sizeof w->path)) {
            snprintf(err, err_size, "workload '%s': bench/workloads/%s.txt not found (set Q35_BENCH_WORKLOADS "
                     "to the folder holding it)", spec, spec);
            return false;
        }
    } else {
        const char *base = strrchr(spec, '/');
        snprintf(w->name, sizeof w->name, "%s", base ? base + 1 : spec);
        char *dot = strrchr(w->name, '.');
        if (dot && dot != w->name) *dot = 0;
        snprintf(w->path, sizeof w->path, "%s", spec);
    }
    char resolved[PATH_MAX];
    if (realpath(w->path, resolved)) snprintf(w->path, sizeof w->path, "%s", resolved);
    q35_error qerr = {0};
    if (q35_read_file(w->path, &w->prompt, &w->prompt_len, &qerr) != Q35_OK) {
        snprintf(err, err_size, "workload '%.200s': %.900s (use short, code, long, reasoning, all or a file)", spec, qerr.msg);
        return false;
    }
    while (w->prompt_len > 0 && (w->prompt[w->prompt_len - 1] == '\n' || w->prompt[w->prompt_len - 1] == '\r'))
        w->prompt[--w->prompt_len] = 0;
    if (w->prompt_len == 0) {
        snprintf(err, err_size, "workload '%.200s': %.900s is empty", spec, w->path);
        return false;
    }
    return true;
}

/* "all", one name or file, or a comma-separated list of them. */
static int load_workloads(const char *spec, workload **out, char *err, size_t err_size) {
    char list[4096];
    if (!strcmp(spec, "all")) snprintf(list, sizeof list, "short,code,long,reasoning");
    else snprintf(list, sizeof list, "%s", spec);
    int n = 0;
    workload *ws = NULL;
    for (char *save = NULL, *item = strtok_r(list, ",", &save); item; item = strtok_r(NULL, ",", &save)) {
        workload *grown = realloc(ws, sizeof *ws * (size_t)(n + 1));
        if (!grown) { snprintf(err, err_size, "out of memory"); n = -1; break; }
        ws = grown;
        if (!load_workload(item, &ws[n], err, err_size)) { n = -1; break; }
        n++;
    }
    if (n == 0) snprintf(err, err_size, "--workload names nothing");
    *out = ws;
    return n;
}

/* ---- reporting ---------------------------------------------------------- */

static json_t *num_or_null(double v) { return isfinite(v) && v >= 0 ? json_real(v) : json_null(); }
static json_t *int_or_null(int64_t v) { return v >= 0 ? json_integer(v) : json_null(); }

static json_t *spec_json(const spec_counts *s) {
    if (!s->source) return json_null();
    json_t *j = json_object();
    json_object_set_new(j, "drafts", num_or_null(s->drafts));
    json_object_set_new(j, "draft_tokens", num_or_null(s->draft_tokens));
    json_object_set_new(j, "accepted_tokens", num_or_null(s->accepted_tokens));
    double rate = s->draft_tokens > 0 && s->accepted_tokens >= 0 ? s->accepted_tokens / s->draft_tokens : NAN;
    double len = s->drafts > 0 && s->accepted_tokens >= 0 ? 1 + s->accepted_tokens / s->drafts : NAN;
    json_object_set_new(j, "acceptance_rate", num_or_null(rate));
    json_object_set_new(j, "mean_acceptance_length", num_or_null(len));
    json_object_set_new(j, "source", json_string(s->source));
    return j;
}

/* "warmup2" or "run3": the names the table and the JSON share. */
static void run_label(const run_result *r, int index, int warmups, char *out, size_t size) {
    if (r->warmup) snprintf(out, size, "warmup%d", index + 1);
    else snprintf(out, size, "run%d", index - warmups + 1);
}

static json_t *run_json(const run_result *r, int index, int warmups) {
    char label[32];
    run_label(r, index, warmups, label, sizeof label);
    json_t *j = json_object();
    json_object_set_new(j, "index", json_integer(index));
    json_object_set_new(j, "label", json_string(label));
    json_object_set_new(j, "warmup", json_boolean(r->warmup));
    json_object_set_new(j, "ok", json_boolean(r->ok));
    json_object_set_new(j, "ttft_ms", num_or_null(r->ttft_ms));
    json_object_set_new(j, "decode_tok_s", num_or_null(r->decode_tok_s));
    json_object_set_new(j, "total_ms", num_or_null(r->total_ms));
    json_object_set_new(j, "completion_tokens", int_or_null(r->completion_tokens));
    json_object_set_new(j, "completion_tokens_source", json_string(r->tokens_source));
    json_object_set_new(j, "text_events", json_integer(r->text_events));
    json_object_set_new(j, "prompt_tokens", int_or_null(r->prompt_tokens));
    json_object_set_new(j, "cached_tokens", int_or_null(r->cached_tokens));
    json_object_set_new(j, "finish_reason", r->finish_reason[0] ? json_string(r->finish_reason) : json_null());
    json_object_set_new(j, "sha256", json_string(r->sha256));
    json_object_set_new(j, "spec_decode", spec_json(&r->spec));
    json_object_set_new(j, "error", r->error[0] ? json_string(r->error) : json_null());
    return j;
}

static json_t *range_json(q35_bench_range rg) {
    return json_pack("{s:o,s:o,s:o}", "min", num_or_null(rg.min), "median", num_or_null(rg.median),
                     "max", num_or_null(rg.max));
}

/* Adds b's known counters into a (a starts as all -1 with source NULL). */
static void spec_add(spec_counts *a, const spec_counts *b) {
    if (!b->source) return;
    double *dst[3] = {&a->drafts, &a->draft_tokens, &a->accepted_tokens};
    const double src[3] = {b->drafts, b->draft_tokens, b->accepted_tokens};
    for (int k = 0; k < 3; k++)
        if (src[k] >= 0) *dst[k] = (*dst[k] < 0 ? 0 : *dst[k]) + src[k];
    a->source = a->source && strcmp(a->source, b->source) ? "mixed" : b->source;
}

typedef struct workload_summary {
    q35_bench_range decode, ttft;
    size_t median_run; /* index into the workload's runs; SIZE_MAX: none */
    size_t distinct, measured;
    int64_t prompt_tokens;
    bool all_max_tokens;
    spec_counts spec;
} workload_summary;

static workload_summary summarize(const run_result *runs, size_t n, int max_tokens) {
    workload_summary s = {.median_run = SIZE_MAX, .prompt_tokens = -1, .all_max_tokens = true,
                          .spec = {-1, -1, -1, NULL}};
    double *decode = calloc(n + 1, sizeof *decode), *ttft = calloc(n + 1, sizeof *ttft);
    const char **hashes = calloc(n + 1, sizeof *hashes);
    size_t *which = calloc(n + 1, sizeof *which);
    for (size_t i = 0; i < n; i++) {
        if (runs[i].warmup || !runs[i].ok) continue;
        decode[s.measured] = runs[i].decode_tok_s;
        ttft[s.measured] = runs[i].ttft_ms;
        hashes[s.measured] = runs[i].sha256;
        which[s.measured] = i;
        s.measured++;
        if (runs[i].prompt_tokens >= 0) s.prompt_tokens = runs[i].prompt_tokens;
        if (runs[i].completion_tokens != max_tokens) s.all_max_tokens = false;
        spec_add(&s.spec, &runs[i].spec);
    }
    s.decode = q35_bench_range_of(decode, s.measured);
    s.ttft = q35_bench_range_of(ttft, s.measured);
    if (s.decode.median_index != SIZE_MAX) s.median_run = which[s.decode.median_index];
    s.distinct = q35_bench_count_distinct(hashes, s.measured);
    free(decode), free(ttft), free(hashes), free(which);
    return s;
}

typedef struct bench_state {
    const bench_opts *o;
    const char *model;
    workload *workloads;
    int n_workloads;
    run_result **runs; /* per workload, warmups first */
    int *n_runs;
    double peak_bytes, resident_max_bytes;
    bool metrics_available;
    const char *error;
    char started_at[32];
} bench_state;

static json_t *report_json(const bench_state *b) {
    const bench_opts *o = b->o;
    json_t *root = json_object();
    json_object_set_new(root, "schema", json_string(SCHEMA));
    json_object_set_new(root, "tool", json_string("qwen35 bench " Q35_VERSION));
    json_object_set_new(root, "started_at", json_string(b->started_at));
    json_object_set_new(root, "url", json_string(o->base_url));
    json_object_set_new(root, "model", json_string(b->model));
    json_object_set_new(root, "config", json_pack("{s:s,s:i,s:i,s:i,s:f,s:b,s:b,s:s,s:f}",
        "endpoint", "/v1/completions", "max_tokens", o->max_tokens, "warmups", o->warmups, "runs", o->runs,
        "temperature", 0.0, "ignore_eos", 1, "stream", 1,
        "prefix_cache", o->keep_prefix_cache ? "server default" : "off per request (cache_prompt=false, unique cache_salt)",
        "timeout_s", o->timeout_s));
    json_t *wl = json_array();
    spec_counts total = {-1, -1, -1, NULL};
    for (int i = 0; i < b->n_workloads; i++) {
        const workload *w = &b->workloads[i];
        workload_summary s = summarize(b->runs[i], (size_t)b->n_runs[i], o->max_tokens);
        spec_add(&total, &s.spec);
        char psha[65];
        q35_bench_sha256_hex(w->prompt, w->prompt_len, psha);
        json_t *runs = json_array();
        for (int k = 0; k < b->n_runs[i]; k++) json_array_append_new(runs, run_json(&b->runs[i][k], k, o->warmups));
        json_t *summary = json_object();
        json_object_set_new(summary, "measured_runs", json_integer((json_int_t)s.measured));
        json_object_set_new(summary, "decode_tok_s", range_json(s.decode));
        json_object_set_new(summary, "ttft_ms", range_json(s.ttft));
        json_object_set_new(summary, "median_run", s.median_run != SIZE_MAX ? json_integer((json_int_t)s.median_run) : json_null());
        json_object_set_new(summary, "distinct_completions", json_integer((json_int_t)s.distinct));
        json_object_set_new(summary, "all_max_tokens", json_boolean(s.all_max_tokens && s.measured > 0));
        json_object_set_new(summary, "spec_decode", spec_json(&s.spec));
        json_t *wj = json_object();
        json_object_set_new(wj, "name", json_string(w->name));
        json_object_set_new(wj, "prompt_file", json_string(w->path));
        json_object_set_new(wj, "prompt_sha256", json_string(psha));
        json_object_set_new(wj, "prompt_bytes", json_integer((json_int_t)w->prompt_len));
        json_object_set_new(wj, "prompt_tokens", int_or_null(s.prompt_tokens));
        json_object_set_new(wj, "summary", summary);
        json_object_set_new(wj, "runs", runs);
        json_array_append_new(wl, wj);
    }
    json_object_set_new(root, "workloads", wl);
    json_object_set_new(root, "spec_decode", spec_json(&total));
    json_t *mem = json_object();
    json_object_set_new(mem, "peak_bytes", num_or_null(b->peak_bytes));
    json_object_set_new(mem, "max_sampled_resident_bytes", num_or_null(b->resident_max_bytes));
    json_object_set_new(root, "server_memory", mem);
    json_object_set_new(root, "metrics_available", json_boolean(b->metrics_available));
    json_object_set_new(root, "complete", json_boolean(b->error == NULL));
    json_object_set_new(root, "error", b->error ? json_string(b->error) : json_null());
    return root;
}

/* Written after every request, through a temporary file, so the file on
 * disk is always whole and holds every run so far. */
static bool write_report(const bench_state *b) {
    if (!b->o->output) return true;
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", b->o->output);
    json_t *root = report_json(b);
    int rc = json_dump_file(root, tmp, JSON_INDENT(2) | JSON_REAL_PRECISION(10));
    json_decref(root);
    if (rc != 0 || rename(tmp, b->o->output) != 0) {
        fprintf(stderr, "qwen35 bench: cannot write %s\n", b->o->output);
        return false;
    }
    return true;
}

static void print_run(const workload *w, const run_result *r, int k, int warmups) {
    char label[32];
    run_label(r, k, warmups, label, sizeof label);
    if (!r->ok) {
        printf("%-10s %-8s FAILED: %s\n", w->name, label, r->error);
    } else {
        char spec[48] = "-";
        if (r->spec.draft_tokens >= 0 && r->spec.accepted_tokens >= 0)
            snprintf(spec, sizeof spec, "%.0f/%.0f", r->spec.accepted_tokens, r->spec.draft_tokens);
        printf("%-10s %-8s %9.2f %12.2f %9.2f %7lld  %.12s  %s\n", w->name, label, r->ttft_ms, r->decode_tok_s,
               r->total_ms / 1e3, (long long)r->completion_tokens, r->sha256, spec);
    }
    fflush(stdout);
}

static void print_summary(const bench_state *b) {
    printf("\n%-10s %6s  %-26s  %-26s  %6s  %8s  %s\n", "workload", "prompt", "decode tok/s min/med/max",
           "TTFT ms min/med/max", "median", "distinct", "spec accepted/drafted (rate)");
    spec_counts total = {-1, -1, -1, NULL};
    for (int i = 0; i < b->n_workloads; i++) {
        workload_summary s = summarize(b->runs[i], (size_t)b->n_runs[i], b->o->max_tokens);
        spec_add(&total, &s.spec);
        char prompt[24] = "?", dec[64], ttft[64], med[32] = "-", spec[64] = "-";
        if (s.prompt_tokens >= 0) snprintf(prompt, sizeof prompt, "%lld", (long long)s.prompt_tokens);
        snprintf(dec, sizeof dec, s.decode.n ? "%.2f / %.2f / %.2f" : "-", s.decode.min, s.decode.median, s.decode.max);
        snprintf(ttft, sizeof ttft, s.ttft.n ? "%.1f / %.1f / %.1f" : "-", s.ttft.min, s.ttft.median, s.ttft.max);
        if (s.median_run != SIZE_MAX)
            run_label(&b->runs[i][s.median_run], (int)s.median_run, b->o->warmups, med, sizeof med);
        if (s.spec.draft_tokens > 0 && s.spec.accepted_tokens >= 0)
            snprintf(spec, sizeof spec, "%.0f/%.0f (%.2f%%)", s.spec.accepted_tokens, s.spec.draft_tokens,
                     100 * s.spec.accepted_tokens / s.spec.draft_tokens);
        printf("%-10s %6s  %-26s  %-26s  %6s  %4zu of %zu  %s\n", b->workloads[i].name, prompt, dec, ttft, med,
               s.distinct, s.measured, spec);
        if (s.measured > 0 && !s.all_max_tokens)
            printf("%-10s warning: not every measured run generated exactly %d tokens (does the server honour ignore_eos?)\n",
                   "", b->o->max_tokens);
    }
    if (total.source && total.draft_tokens >= 0)
        printf("speculation over all measured runs: %.0f drafts, %.0f draft tokens proposed, %.0f accepted (%.2f%%), from %s\n",
               total.drafts, total.draft_tokens, total.accepted_tokens,
               total.draft_tokens > 0 ? 100 * total.accepted_tokens / total.draft_tokens : 0.0, total.source);
    else
        printf("speculation: the server reported no counters\n");
    if (b->peak_bytes >= 0) printf("server peak memory: %.1f MiB (reported peak)\n", b->peak_bytes / 1048576.0);
    else if (b->resident_max_bytes >= 0)
        printf("server peak memory: %.1f MiB (largest resident size sampled after each request)\n",
               b->resident_max_bytes / 1048576.0);
    else printf("server peak memory: not reported\n");
}

/* ---- the command -------------------------------------------------------- */

static void bench_usage(FILE *fp) {
    fprintf(fp,
        "usage: qwen35 bench --url URL [options]\n\n"
        "Sequential streaming speed benchmark against an OpenAI-compatible server\n"
        "(qwen35 serve, llama-server, vLLM): /v1/completions, temperature 0, ignore_eos,\n"
        "prefix caching off per request. Decode tok/s = (completion_tokens - 1) /\n"
        "(last_text_time - first_text_time). See bench/README.md.\n\n"
        "  --url URL          server base URL, e.g. http://127.0.0.1:8000 (a trailing /v1 is fine)\n"
        "  --model NAME       model name to send (default: the first of GET /v1/models)\n"
        "  --api-key KEY      bearer token (default: $OPENAI_API_KEY when set)\n"
        "  --workload W       short, code, long, reasoning, all, a prompt FILE, or a comma list\n"
        "                     (default: reasoning)\n"
        "  --warmups N        unmeasured requests per workload first (default 2)\n"
        "  --runs N           measured requests per workload (default 5)\n"
        "  --max-tokens N     tokens generated per request (default 512)\n"
        "  --timeout S        per-request limit on the wait for the first text and on any\n"
        "                     gap between events, seconds (default 300)\n"
        "  --keep-prefix-cache  do not send cache_prompt=false / cache_salt\n"
        "  --output FILE      write the JSON report here (rewritten after every request)\n");
}

static bool parse_int_arg(const char *s, int lo, int *out) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end != 0 || v < lo || v > 1000000) return false;
    *out = (int)v;
    return true;
}

static int parse_opts(int argc, char **argv, bench_opts *o) {
    const char *url = NULL;
    *o = (bench_opts){.workload = "reasoning", .warmups = 2, .runs = 5, .max_tokens = 512, .timeout_s = 300};
    o->api_key = getenv("OPENAI_API_KEY");
    if (o->api_key && !*o->api_key) o->api_key = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = true;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { bench_usage(stdout); return 0; }
        if (!strcmp(a, "--keep-prefix-cache")) { o->keep_prefix_cache = true; continue; }
        if (!v) { fprintf(stderr, "qwen35 bench: %s needs a value (see --help)\n", a); return 2; }
        if (!strcmp(a, "--url")) url = v;
        else if (!strcmp(a, "--model")) o->model = v;
        else if (!strcmp(a, "--api-key")) o->api_key = v;
        else if (!strcmp(a, "--workload")) o->workload = v;
        else if (!strcmp(a, "--output")) o->output = v;
        else if (!strcmp(a, "--warmups")) ok = parse_int_arg(v, 0, &o->warmups);
        else if (!strcmp(a, "--runs")) ok = parse_int_arg(v, 1, &o->runs);
        else if (!strcmp(a, "--max-tokens")) ok = parse_int_arg(v, 2, &o->max_tokens);
        else if (!strcmp(a, "--timeout")) { char *end; o->timeout_s = strtod(v, &end); ok = *end == 0 && o->timeout_s > 0; }
        else { fprintf(stderr, "qwen35 bench: unknown option '%s' (see --help)\n", a); return 2; }
        if (!ok) { fprintf(stderr, "qwen35 bench: bad value '%s' for %s\n", v, a); return 2; }
        i++;
    }
    if (!url) { fprintf(stderr, "qwen35 bench: --url is required (see --help)\n"); return 2; }
    if (strncmp(url, "http://", 7) && strncmp(url, "https://", 8)) {
        fprintf(stderr, "qwen35 bench: --url must start with http:// or https:// (got '%s')\n", url);
        return 2;
    }
    if (strlen(url) >= sizeof o->base_url - 32) {
        fprintf(stderr, "qwen35 bench: --url is too long\n");
        return 2;
    }
    snprintf(o->base_url, sizeof o->base_url, "%s", url);
    size_t n = strlen(o->base_url);
    while (n > 0 && o->base_url[n - 1] == '/') o->base_url[--n] = 0;
    if (n >= 3 && !strcmp(o->base_url + n - 3, "/v1")) o->base_url[n - 3] = 0;
    return -1;
}

/* Runs every request of every workload; stops at the first failed request. */
static void bench_all(bench_state *b, char *err, size_t err_size) {
    const bench_opts *o = b->o;
    int seq = 0;
    printf("%-10s %-8s %9s %12s %9s %7s  %-12s  %s\n", "workload", "run", "ttft_ms", "decode_tok/s", "total_s",
           "tokens", "sha256", "spec acc/draft");
    for (int i = 0; i < b->n_workloads && !b->error; i++) {
        for (int k = 0; k < o->warmups + o->runs && !b->error; k++) {
            run_result *r = &b->runs[i][k];
            memset(r, 0, sizeof *r);
            r->warmup = k < o->warmups;
            metrics_snap before = b->metrics_available && !r->warmup ? read_metrics(o) : no_metrics;
            run_request(o, b->model, &b->workloads[i], seq++, r);
            b->n_runs[i] = k + 1;
            metrics_snap after = b->metrics_available ? read_metrics(o) : no_metrics;
            if (before.have && after.have) {
                spec_counts m = {counter_delta(before.drafts, after.drafts),
                                 counter_delta(before.draft_tokens, after.draft_tokens),
                                 counter_delta(before.accepted_tokens, after.accepted_tokens), "metrics"};
                if (m.draft_tokens >= 0 || m.drafts >= 0) r->spec = m;
            }
            if (after.peak_bytes > b->peak_bytes) b->peak_bytes = after.peak_bytes;
            if (after.resident_bytes > b->resident_max_bytes) b->resident_max_bytes = after.resident_bytes;
            print_run(&b->workloads[i], r, k, o->warmups);
            if (!r->ok) {
                snprintf(err, err_size, "%s", r->error);
                b->error = err;
            }
            write_report(b);
        }
    }
}

int cmd_bench(int argc, char **argv) {
    bench_opts o;
    int rc = parse_opts(argc, argv, &o);
    if (rc >= 0) return rc;
    char err[2048] = "";
    bench_state b = {.o = &o, .peak_bytes = -1, .resident_max_bytes = -1};
    time_t now = time(NULL);
    strftime(b.started_at, sizeof b.started_at, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    b.n_workloads = load_workloads(o.workload, &b.workloads, err, sizeof err);
    if (b.n_workloads <= 0) {
        fprintf(stderr, "qwen35 bench: %s\n", err);
        free(b.workloads);
        return 2;
    }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    char *model = o.model ? strdup(o.model) : resolve_model(&o, err, sizeof err);
    rc = 1;
    if (model) {
        b.model = model;
        b.runs = calloc((size_t)b.n_workloads, sizeof *b.runs);
        b.n_runs = calloc((size_t)b.n_workloads, sizeof *b.n_runs);
        for (int i = 0; i < b.n_workloads; i++) b.runs[i] = calloc((size_t)(o.warmups + o.runs), sizeof **b.runs);
        char *page = fetch_metrics(&o);
        b.metrics_available = page != NULL;
        free(page);
        printf("qwen35 bench: %s  model %s  max_tokens %d  warmups %d  runs %d  metrics %s\n", o.base_url, model,
               o.max_tokens, o.warmups, o.runs, b.metrics_available ? "yes" : "no");
        bench_all(&b, err, sizeof err);
        print_summary(&b);
        bool written = write_report(&b);
        if (b.error) fprintf(stderr, "qwen35 bench: %s%s\n", b.error,
                             o.output ? "; the runs so far are in the JSON report" : "");
        else if (o.output && written) printf("wrote %s\n", o.output);
        rc = b.error || !written ? 1 : 0;
        for (int i = 0; i < b.n_workloads; i++) free(b.runs[i]);
        free(b.runs);
        free(b.n_runs);
    } else {
        fprintf(stderr, "qwen35 bench: %s\n", err);
    }
    for (int i = 0; i < b.n_workloads; i++) free(b.workloads[i].prompt);
    free(b.workloads);
    free(model);
    curl_global_cleanup();
    return rc;
}
