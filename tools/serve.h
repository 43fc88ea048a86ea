/* serve.h: what the parts of `qwen35 serve` share.
 *
 *   serve.c        command line, HTTP (libmicrohttpd, one thread per
 *                  connection), routing, auth, JSON responses and SSE
 *   serve_sched.c  the scheduler thread: it alone owns the engine sessions,
 *                  admits queued sequences into free slots, evaluates
 *                  prompts in chunks, runs one batched decode step for every
 *                  active sequence, samples, matches stop strings and keeps
 *                  the prefix cache of state snapshots
 *
 * An HTTP thread parses a request into a `request`, which the scheduler
 * expands into one `seq` per choice. The scheduler appends `tok_event`s to
 * the request under its mutex and signals it; the HTTP thread turns them into
 * a JSON body or SSE chunks. A request is shared by both sides through a
 * reference count; a client that goes away sets `cancelled`, and the
 * scheduler drops its sequences at the next step. */
#ifndef Q35_SERVE_H
#define Q35_SERVE_H

#include "server/api.h"
#include "qwen35.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

enum { FIN_NONE = 0, FIN_STOP, FIN_LENGTH, FIN_ABORT, FIN_ERROR };

/* One generated token of one choice as the client sees it. */
typedef struct tok_event {
    int32_t choice;
    int32_t token;             /* -1: text released at the end, no token */
    char *text;                /* released text (NUL-terminated, may be empty) */
    size_t len;
    float logprob;
    int32_t n_top;
    int32_t top_ids[20];
    float top_lp[20];
    int finish;                /* FIN_* on a choice's last event */
    char *stop_str;            /* the stop string that ended the choice */
    int32_t stop_id;           /* the stop token id that ended it, or -1 */
} tok_event;

typedef struct request {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                  /* HTTP side + scheduler side */
    q35_api_request api;
    char id[48];
    long long created;
    int32_t **prompt_ids;      /* (api.n_prompts) tokenized prompts */
    int32_t *prompt_len;
    int32_t *max_tokens;       /* per prompt, resolved */
    int32_t n_choices;         /* n_prompts * n */
    tok_event *ev;             /* appended by the scheduler */
    size_t n_ev, cap_ev;
    int32_t n_finished;
    int32_t *completion_tokens;/* (n_choices) */
    int32_t cached_tokens;
    int32_t n_started;         /* choices whose prompt is done */
    char *tools_json;          /* chat: tools shown to the model and parsed out of its output, or NULL */
    bool think;                /* chat: the prompt opens a <think> block */
    int32_t turn_ckpt;         /* chat: prompt tokens a follow-up turn shares (0: unknown) */
    bool *prompt_ready;        /* (n_prompts) choice 0's prompt checkpoint is cached */
    atomic_int cancelled;
    char *error;               /* set when the engine failed */
    double t_arrive, t_first_token;
} request;

void request_release(request *r);

/* Server configuration, filled from the command line. */
typedef struct serve_config {
    const char *model_path;
    const char *host;
    int port;
    const char *api_key;
    const char *served_name;
    int32_t max_model_len;     /* 0: default */
    int parallel;
    int max_queue;             /* waiting requests before 429 */
    size_t max_body;
    double timeout_s;          /* idle connection / slow body limit */
    int threads;
    int weights;               /* q35_weights_mode: --mmap / --no-mmap */
    size_t cache_bytes;        /* prefix cache budget */
    int32_t prefill_chunk;
    int32_t spec_k;            /* MTP draft tokens per step, 0: off */
} serve_config;

/* ---- scheduler (serve_sched.c) ---- */
int sched_start(q35_engine *engine, const serve_config *cfg, int32_t n_ctx, const int32_t *eos_ids, int n_eos,
                char *msg, size_t msg_size);
/* Queues every choice of r; false when the queue is full. */
bool sched_submit(request *r);
/* Each token's bytes (ids below the vocabulary size), which json_object
 * needs; call before the first request. */
void sched_set_token_bytes(const char *const *bytes, const size_t *lens);
void sched_stop(void);

typedef struct sched_stats {
    int running, waiting;
    size_t cache_bytes, cache_entries;
    unsigned long long cache_queries, cache_hits; /* in prompt tokens */
    unsigned long long spec_steps, spec_drafts, spec_accepted;
    unsigned long long spec_accepted_at[Q35_SPEC_K_MAX]; /* by position in a step */
    int32_t spec_k;
} sched_stats;
void sched_get_stats(sched_stats *st);

/* ---- metrics (serve.c) ---- */
void metrics_first_token(double ttft_s);
void metrics_token_gap(double itl_s);
void metrics_tokens(int32_t prompt_tokens, int32_t gen_tokens);
void metrics_request_done(int finish, double e2e_s);

/* Streaming token-to-text for one choice (serve.c owns the tokenizer;
 * without one, each token shows as "<id>"). The returned text is owned by
 * the decoder and valid until its next call. */
typedef struct text_decoder text_decoder;
text_decoder *decoder_new(void);
const char *decoder_feed(text_decoder *d, int32_t token, size_t *len);
const char *decoder_flush(text_decoder *d, size_t *len);
void decoder_free(text_decoder *d);

#endif
