/* sched.h: the scheduler (sched.c) and the task it shares with the routes
 * (task.c).
 *
 * A route parses a request into a q35_task (prompts tokenized, max_tokens
 * resolved) and submits it; the scheduler expands it into one sequence per
 * choice. Its one thread owns every engine session: it appends q35_events to
 * the task under the task's mutex and signals it, and the route turns them
 * into a JSON body or SSE chunks. Both sides hold a reference; a client that
 * goes away sets `cancelled`, and the scheduler drops its sequences at the
 * next step. The scheduler knows nothing of HTTP: what it needs from the
 * rest of the server (the tokenizer, the metrics sink) comes in its config. */
#ifndef Q35_SERVER_SCHED_H
#define Q35_SERVER_SCHED_H

#include "server/metrics.h"
#include "server/request.h"
#include "qwen35.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* How a choice ended. */
enum { Q35_FIN_NONE = 0, Q35_FIN_STOP, Q35_FIN_LENGTH, Q35_FIN_ABORT, Q35_FIN_ERROR };

/* One generated token of one choice as the client sees it. */
typedef struct q35_event {
    int32_t choice;
    int32_t token;             /* -1: text released at the end, no token */
    char *text;                /* released text (NUL-terminated, may be empty) */
    size_t len;
    float logprob;
    int32_t n_top;
    int32_t top_ids[20];
    float top_lp[20];
    int finish;                /* Q35_FIN_* on a choice's last event */
    char *stop_str;            /* the stop string that ended the choice */
    int32_t stop_id;           /* the stop token id that ended it, or -1 */
} q35_event;

/* The log-probabilities of one prompt's tokens (api.prompt_logprobs >= 0):
 * row i (1 <= i < n) is token i given the tokens before it, from the logits
 * of row i-1; row 0 has none (vLLM's null). Filled by the scheduler from
 * the prompt's evaluation before the prompt's first event. */
typedef struct q35_prompt_lp {
    int32_t n, k;              /* rows (the prompt's length), top entries per row */
    float *logprob;            /* (n) */
    int32_t *rank;             /* (n) 1 + the tokens with a higher logit */
    int32_t *top_ids;          /* (n, k) best first, ties lower id first */
    float *top_lp;             /* (n, k) */
} q35_prompt_lp;

typedef struct q35_task {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                  /* HTTP side + scheduler side */
    q35_api_request api;
    char id[48];
    long long created;
    int32_t **prompt_ids;      /* (api.n_prompts) tokenized prompts */
    int32_t *prompt_len;
    int32_t *max_tokens;       /* per prompt, resolved */
    q35_image_embeds **embeds; /* (api.n_images) the images encoded by the scheduler when the first choice starts; NULL before */
    int32_t n_choices;         /* n_prompts * n */
    q35_event *ev;             /* appended by the scheduler */
    size_t n_ev, cap_ev;
    int32_t n_finished;
    int32_t *completion_tokens;/* (n_choices) */
    int32_t cached_tokens;
    int32_t n_started;         /* choices whose prompt is done */
    char *tools_json;          /* chat: tools shown to the model and parsed out of its output, or NULL */
    bool think;                /* chat: the prompt opens a <think> block */
    bool llama;                /* llama-server's /completion: its response shapes */
    q35_chat_options chat;     /* chat: the template's variant and enable_thinking (add_generation_prompt unset) */
    int32_t turn_snap;         /* chat: prompt tokens a follow-up turn shares (0: unknown) */
    bool *prompt_ready;        /* (n_prompts) choice 0's prompt snapshot is cached (and its prompt_lp filled) */
    q35_prompt_lp *prompt_lp;  /* (n_prompts) when api.prompt_logprobs >= 0, else NULL */
    atomic_int cancelled;
    char *error;               /* set when the engine failed */
    double t_arrive, t_first_token;
} q35_task;

/* A task with one reference and nothing in it; NULL when out of memory. */
q35_task *q35_task_new(void);
/* The per-prompt arrays for api.n_prompts prompts and the per-choice counts
 * (n_choices = n_prompts * api.n); 0 or -1. */
int q35_task_alloc(q35_task *t);
void q35_task_release(q35_task *t);
/* Allocates t->prompt_lp for its tokenized prompts (api.prompt_logprobs
 * >= 0; nothing otherwise); 0 or -1. */
int q35_task_alloc_prompt_lp(q35_task *t);
/* Fills prompt rows first+1 .. first+n_rows (those below l->n) from the
 * logits of rows first .. first+n_rows-1 (n_rows rows of V values): each
 * row's log-softmax, one row at a time. */
void q35_prompt_lp_fill(q35_prompt_lp *l, const float *logits, int32_t V, int32_t first, int32_t n_rows,
                        const int32_t *prompt);
/* Appends an event (its text and stop_str pass to the task) and wakes the
 * waiting route; the scheduler's side. */
void q35_task_push(q35_task *t, q35_event *ev);

typedef struct q35_sched_config {
    q35_engine *engine;
    const q35_tokenizer *tok;  /* streams text and masks json_object; NULL: each token shows as "<id>" */
    q35_metrics *metrics;      /* what tokens and finished choices are counted into; NULL: nowhere */
    int32_t n_ctx;             /* context per slot */
    int parallel;              /* slots */
    int max_queue;             /* waiting tasks before a submit is refused */
    size_t cache_bytes;        /* prefix cache budget, 0: off */
    int32_t prefill_chunk;     /* prompt tokens per step */
    int32_t spec_k;            /* MTP draft tokens per step, 0: off */
    const int32_t *eos;        /* end-of-generation ids (up to 8) */
    int n_eos;
} q35_sched_config;

typedef struct q35_sched q35_sched;

/* Creates the sessions and starts the scheduler thread; 0, or -1 with msg. */
int q35_sched_start(const q35_sched_config *cfg, q35_sched **out, char *msg, size_t msg_size);
/* Queues every choice of t; false when the queue is full or the scheduler stopped. */
bool q35_sched_submit(q35_sched *s, q35_task *t);
/* Ends every running and waiting choice (error "the server is shutting
 * down"), joins the thread and frees the sessions and the cache; stats
 * stay readable until q35_sched_free. */
void q35_sched_stop(q35_sched *s);
void q35_sched_free(q35_sched *s); /* stops first when still running */

typedef struct q35_sched_stats {
    int running, waiting;
    size_t cache_bytes, cache_entries, cache_budget;
    unsigned long long cache_lookup_hits, cache_lookup_misses, cache_evictions; /* in lookups and entries */
    unsigned long long cache_queries, cache_hits; /* in prompt tokens */
    unsigned long long spec_steps, spec_drafts, spec_accepted;
    unsigned long long spec_accepted_at[Q35_SPEC_K_MAX]; /* by position in a step */
    int32_t spec_k;
} q35_sched_stats;
void q35_sched_get_stats(q35_sched *s, q35_sched_stats *st);

#endif
