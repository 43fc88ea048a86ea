/* metrics.c: histograms, the Prometheus text format, the server's counters
 * and the /metrics page (metrics.h). The scheduler thread and the HTTP
 * threads observe into a q35_metrics under its mutex; /metrics reads it and
 * the scheduler's stats into one text page. */
#include "server/metrics.h"
#include "server/buf.h"
#include "server/conn.h"
#include "server/sched.h"

#include <stdio.h>
#include <string.h>

/* ---- histograms and the text format ---- */

void q35_hist_init(q35_hist *h, const double *bounds, int n) {
    memset(h, 0, sizeof *h);
    h->n_buckets = n < Q35_HIST_MAX_BUCKETS ? n : Q35_HIST_MAX_BUCKETS;
    for (int i = 0; i < h->n_buckets; i++) h->le[i] = bounds[i];
}

void q35_hist_observe(q35_hist *h, double v) {
    for (int i = 0; i < h->n_buckets; i++)
        if (v <= h->le[i]) { h->count[i]++; break; }
    h->total++;
    h->sum += v;
}

int q35_prom_hist(char **buf, size_t *len, size_t *cap, const char *name, const char *help, const char *labels,
                  const q35_hist *h) {
    const char *sep = labels && *labels ? "," : "";
    if (!labels) labels = "";
    int rc = q35_text_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < h->n_buckets && !rc; i++) {
        cum += h->count[i];
        rc = q35_text_appendf(buf, len, cap, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, labels, sep, h->le[i], (unsigned long long)cum);
    }
    if (!rc) rc = q35_text_appendf(buf, len, cap, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, labels, sep, (unsigned long long)h->total);
    if (!rc) rc = q35_text_appendf(buf, len, cap, "%s_sum{%s} %.9g\n%s_count{%s} %llu\n", name, labels, h->sum, name, labels,
                             (unsigned long long)h->total);
    return rc;
}

int q35_prom_value(char **buf, size_t *len, size_t *cap, const char *name, const char *type, const char *help,
                   const char *labels, double value) {
    return q35_text_appendf(buf, len, cap, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %.17g\n", name, help, name, type, name,
                      labels ? labels : "", value);
}

/* ---- the server's counters ---- */

void q35_metrics_init(q35_metrics *m) {
    static const double ttft_b[] = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                                    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
    static const double itl_b[] = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0,
                                   2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0};
    static const double e2e_b[] = {0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
                                   40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
    memset(m, 0, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    q35_hist_init(&m->ttft, ttft_b, (int)(sizeof ttft_b / sizeof *ttft_b));
    q35_hist_init(&m->itl, itl_b, (int)(sizeof itl_b / sizeof *itl_b));
    q35_hist_init(&m->e2e, e2e_b, (int)(sizeof e2e_b / sizeof *e2e_b));
}

void q35_metrics_destroy(q35_metrics *m) { pthread_mutex_destroy(&m->mu); }

void q35_metrics_first_token(q35_metrics *m, double s) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    q35_hist_observe(&m->ttft, s);
    pthread_mutex_unlock(&m->mu);
}

void q35_metrics_token_gap(q35_metrics *m, double s) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    q35_hist_observe(&m->itl, s);
    pthread_mutex_unlock(&m->mu);
}

void q35_metrics_tokens(q35_metrics *m, int32_t p, int32_t g) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->prompt_tokens += (unsigned long long)p;
    m->gen_tokens += (unsigned long long)g;
    pthread_mutex_unlock(&m->mu);
}

void q35_metrics_request_done(q35_metrics *m, int finish, double e2e) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    if (finish >= 0 && finish < Q35_METRICS_N_FINISH) m->finished[finish]++;
    q35_hist_observe(&m->e2e, e2e);
    pthread_mutex_unlock(&m->mu);
}

void q35_metrics_rejected(q35_metrics *m) {
    if (!m) return;
    pthread_mutex_lock(&m->mu);
    m->rejected++;
    pthread_mutex_unlock(&m->mu);
}

/* ---- the /metrics page ---- */

/* VmRSS / VmHWM from /proc/self/status, in bytes. */
static void read_rss(double *rss, double *hwm) {
    *rss = *hwm = 0;
    FILE *fp = fopen("/proc/self/status", "r");
    if (!fp) return;
    char line[256];
    while (fgets(line, sizeof line, fp)) {
        long kb;
        if (sscanf(line, "VmRSS: %ld kB", &kb) == 1) *rss = (double)kb * 1024;
        if (sscanf(line, "VmHWM: %ld kB", &kb) == 1) *hwm = (double)kb * 1024;
    }
    fclose(fp);
}

/* One more sample of a metric whose HELP and TYPE lines are out already. */
static void prom_sample(char **b, size_t *n, size_t *cap, const char *name, const char *labels, unsigned long long v) {
    q35_text_appendf(b, n, cap, "%s{%s} %llu\n", name, labels, v);
}

char *q35_metrics_text(q35_metrics *m, const q35_sched_stats *st, const q35_conn_stats *cs, const char *served_name, size_t *len) {
    char *b = NULL;
    size_t n = 0, cap = 0;
    char lab[300];
    snprintf(lab, sizeof lab, "model_name=\"%s\"", served_name);
    double rss, hwm;
    read_rss(&rss, &hwm);
    pthread_mutex_lock(&m->mu);
    q35_prom_value(&b, &n, &cap, "vllm:num_requests_running", "gauge", "Requests in the decode batch.", lab, st->running);
    q35_prom_value(&b, &n, &cap, "vllm:num_requests_waiting", "gauge", "Sequences waiting for a slot.", lab, st->waiting);
    q35_prom_value(&b, &n, &cap, "vllm:prompt_tokens_total", "counter", "Prompt tokens processed.", lab, (double)m->prompt_tokens);
    q35_prom_value(&b, &n, &cap, "vllm:generation_tokens_total", "counter", "Tokens generated.", lab, (double)m->gen_tokens);
    static const char *const reasons[] = {"none", "stop", "length", "abort", "error"};
    char l2[400];
    for (int i = Q35_FIN_STOP; i <= Q35_FIN_ERROR; i++) {
        snprintf(l2, sizeof l2, "%s,finished_reason=\"%s\"", lab, reasons[i]);
        if (i == Q35_FIN_STOP) q35_prom_value(&b, &n, &cap, "vllm:request_success_total", "counter", "Finished requests by reason.", l2, (double)m->finished[i]);
        else prom_sample(&b, &n, &cap, "vllm:request_success_total", l2, m->finished[i]);
    }
    q35_prom_value(&b, &n, &cap, "qwen35:requests_rejected_total", "counter", "Requests refused because the queue was full.", lab, (double)m->rejected);
    q35_prom_hist(&b, &n, &cap, "vllm:time_to_first_token_seconds", "Time to first token.", lab, &m->ttft);
    q35_prom_hist(&b, &n, &cap, "vllm:inter_token_latency_seconds", "Time between two tokens of a sequence.", lab, &m->itl);
    q35_prom_hist(&b, &n, &cap, "vllm:e2e_request_latency_seconds", "Request latency, arrival to last token.", lab, &m->e2e);
    pthread_mutex_unlock(&m->mu);
    q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_drafts_total", "counter", "Speculation steps (MTP drafts verified).", lab, (double)st->spec_steps);
    q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_draft_tokens_total", "counter", "Draft tokens proposed.", lab, (double)st->spec_drafts);
    q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Draft tokens accepted.", lab, (double)st->spec_accepted);
    for (int j = 0; j < st->spec_k && j < Q35_SPEC_K_MAX; j++) { /* draft j of a step is accepted only after 0..j-1 */
        snprintf(l2, sizeof l2, "%s,position=\"%d\"", lab, j);
        if (!j) q35_prom_value(&b, &n, &cap, "vllm:spec_decode_num_accepted_tokens_per_pos_total", "counter",
                               "Draft tokens accepted, by their position in a step.", l2, (double)st->spec_accepted_at[j]);
        else prom_sample(&b, &n, &cap, "vllm:spec_decode_num_accepted_tokens_per_pos_total", l2, st->spec_accepted_at[j]);
    }
    q35_prom_value(&b, &n, &cap, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", lab, (double)st->cache_queries);
    q35_prom_value(&b, &n, &cap, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens restored from the prefix cache.", lab, (double)st->cache_hits);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_bytes", "gauge", "Bytes held by prefix cache snapshots.", lab, (double)st->cache_bytes);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_entries", "gauge", "Snapshots in the prefix cache.", lab, (double)st->cache_entries);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_capacity_bytes", "gauge", "The prefix cache's budget (--prefix-cache-bytes).", lab, (double)st->cache_budget);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_lookup_hits_total", "counter", "Prefix cache lookups that restored a snapshot.", lab, (double)st->cache_lookup_hits);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_lookup_misses_total", "counter", "Prefix cache lookups that found none.", lab, (double)st->cache_lookup_misses);
    q35_prom_value(&b, &n, &cap, "qwen35:prefix_cache_evictions_total", "counter", "Snapshots dropped to make room.", lab, (double)st->cache_evictions);
    if (cs) {
        q35_prom_value(&b, &n, &cap, "qwen35:connections_open", "gauge", "Open HTTP connections.", "", (double)cs->open);
        q35_prom_value(&b, &n, &cap, "qwen35:connections_timed_out_total", "counter", "Connections closed for not sending a whole request within --request-timeout.", "", (double)cs->timed_out);
        q35_prom_value(&b, &n, &cap, "qwen35:streams_stalled_total", "counter", "Streams cancelled because their client read nothing for --write-timeout.", "", (double)cs->stalled);
        q35_prom_value(&b, &n, &cap, "qwen35:streams_overflowed_total", "counter", "Streams cancelled because their client left too much output unread.", "", (double)cs->overflowed);
        q35_prom_value(&b, &n, &cap, "qwen35:connections_reserve_refused_total", "counter", "Requests refused on connections over the request slots.", "", (double)cs->reserved_refused);
        q35_prom_value(&b, &n, &cap, "qwen35:connections_refused_total", "counter", "Connections answered 429 or 503 as they were accepted.", "reason=\"per_client\"", (double)cs->refused_per_client);
        prom_sample(&b, &n, &cap, "qwen35:connections_refused_total", "reason=\"server_full\"", cs->refused_full);
        q35_prom_value(&b, &n, &cap, "qwen35:requests_malformed_total", "counter", "Requests answered 400, 413, 414, 431 or 505 before they reached a route (not HTTP, a head too large, bad framing).", "", (double)cs->malformed);
    }
    q35_prom_value(&b, &n, &cap, "process_resident_memory_bytes", "gauge", "Resident memory (VmRSS).", "", rss);
    q35_prom_value(&b, &n, &cap, "process_resident_memory_peak_bytes", "gauge", "Peak resident memory (VmHWM).", "", hwm);
    *len = n;
    return b;
}
