/* metrics.h: the server's Prometheus metrics (metrics.c). Histograms and
 * the text exposition format, the counters the scheduler and the routes
 * feed (q35_metrics, safe from any thread), and the /metrics page, which
 * adds the scheduler's gauges and the process's memory. */
#ifndef Q35_SERVER_METRICS_H
#define Q35_SERVER_METRICS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define Q35_HIST_MAX_BUCKETS 24
typedef struct q35_hist {
    int n_buckets;
    double le[Q35_HIST_MAX_BUCKETS];   /* upper bounds, increasing; +Inf is implicit */
    uint64_t count[Q35_HIST_MAX_BUCKETS];
    uint64_t total;
    double sum;
} q35_hist;

void q35_hist_init(q35_hist *h, const double *bounds, int n);
void q35_hist_observe(q35_hist *h, double v);
/* Appends the Prometheus text of a histogram (HELP, TYPE, cumulative
 * _bucket lines, _sum, _count) with the given label set, e.g.
 * model_name="x". Returns 0 or -1. */
int q35_prom_hist(char **buf, size_t *len, size_t *cap, const char *name, const char *help, const char *labels,
                  const q35_hist *h);
/* One counter or gauge sample with HELP and TYPE lines. */
int q35_prom_value(char **buf, size_t *len, size_t *cap, const char *name, const char *type, const char *help,
                   const char *labels, double value);
/* The server's counters: what the scheduler reports as tokens come out and
 * choices end, and the routes' refusals. finish is a Q35_FIN_* (sched.h). */
enum { Q35_METRICS_N_FINISH = 5 };
typedef struct q35_metrics {
    pthread_mutex_t mu;
    q35_hist ttft, itl, e2e;
    unsigned long long prompt_tokens, gen_tokens;
    unsigned long long finished[Q35_METRICS_N_FINISH];
    unsigned long long rejected;
} q35_metrics;

void q35_metrics_init(q35_metrics *m);
/* The observers below do nothing when m is NULL. */
void q35_metrics_destroy(q35_metrics *m);
void q35_metrics_first_token(q35_metrics *m, double ttft_s);
void q35_metrics_token_gap(q35_metrics *m, double itl_s);
void q35_metrics_tokens(q35_metrics *m, int32_t prompt_tokens, int32_t gen_tokens);
void q35_metrics_request_done(q35_metrics *m, int finish, double e2e_s);
void q35_metrics_rejected(q35_metrics *m);

/* The /metrics page (vLLM's metric names where they exist): the counters of
 * m, the scheduler's gauges and counters st, labelled with the served
 * model's name. malloc'd; *len its bytes. */
struct q35_sched_stats;
struct q35_conn_stats;
/* conns: the connection table's counts, or NULL to leave them out. */
char *q35_metrics_text(q35_metrics *m, const struct q35_sched_stats *st, const struct q35_conn_stats *conns,
                       const char *served_name, size_t *len);

#endif
