/* sched_int.h: the scheduler's own types, shared by its two files:
 * sched.c (the thread, slots, the queue, decode steps, sampling, stop
 * strings) and sched_prefill.c (prompt evaluation and prefix reuse, images
 * included). Nothing outside the scheduler includes it. */
#ifndef Q35_SERVER_SCHED_INT_H
#define Q35_SERVER_SCHED_INT_H

#include "server/decoder.h"
#include "server/json_prefix.h"
#include "server/prefix_cache.h"
#include "server/sched.h"
#include "server/stop.h"
#include "text/schema.h"

#include <stdbool.h>
#include <stdint.h>

enum { SEQ_WAITING, SEQ_PREFILL, SEQ_DECODE };

typedef struct seq {
    q35_sched *sched;
    q35_task *req;
    int32_t choice, prompt_index;
    const int32_t *prompt;
    int32_t n_prompt, max_tokens;
    int slot, state;
    int32_t n_eval;            /* prompt tokens in the session */
    int32_t *tokens;           /* (n_prompt + max_tokens) prompt then generated ids */
    int32_t n_gen, last;
    bool looked_up;            /* the prefix cache was consulted */
    bool snap_done;            /* the prompt snapshot was taken */
    q35_sampler *sampler;
    q35_generation *gen;       /* from the end of the prompt on */
    bool json_on, json_done;   /* response_format json_object: output is held to one JSON object */
    bool json_wait;            /* ... once </think> ends the reasoning (thinking on) */
    q35_json_prefix json;
    const q35_schema *schema;  /* response_format json_schema (the request's); NULL: none */
    q35_schema_state gs;       /* ... its state after the output so far */
    q35_stop_matcher stop;
    q35_text_decoder *dec;
    double t_last;
    struct seq *next;
} seq;

/* What a free slot's session still holds. */
typedef struct warm_slot {
    bool held;                 /* the session's state (q35_session_tokens) may be reused */
    uint64_t salt;
    bool cacheable;            /* the request allowed caching */
    uint64_t last_used;
    q35_image_span *spans;     /* the images in what the session holds (prefix_cache.h), owned */
    int32_t n_spans;
} warm_slot;

struct q35_sched {
    q35_engine *engine;
    const q35_tokenizer *tok;
    q35_metrics *metrics;
    int32_t V, n_ctx;
    int max_queue;
    int32_t prefill_chunk;
    int32_t eos[8];
    int n_eos;
    const char **tok_bytes;    /* (V) each token's bytes, for json_object; NULL without a tokenizer */
    int32_t think_end;         /* the id of </think>, -1: none */
    int32_t tool_open;         /* the id of <tool_call>, -1: none */
    size_t *tok_len;
    q35_token_trie *trie;      /* the token strings, for json_schema's mask */
    uint8_t *live;             /* (V) the mask of one row */
    q35_session **sessions;
    seq **slots;
    warm_slot *warm;           /* (n_slots) */
    int n_slots;
    uint64_t warm_clock;
    float *logits;             /* (n_slots, V) */
    float *raw;                /* (V) logits before sampling, for logprobs */
    float *rows;               /* (rows_cap, V) every row of a prompt chunk, for prompt logprobs */
    int32_t rows_cap;
    seq **batch_seq;           /* (n_slots) the sequences of this step */
    q35_generation **batch_gen; /* (n_slots) their generations */
    q35_gen_out *batch_out;    /* (n_slots) what each yielded */

    pthread_mutex_t mu;        /* guards the wait list, counts and stats below */
    pthread_cond_t cv;
    seq *wait_head, *wait_tail;
    int n_waiting_req;         /* requests with a choice not yet admitted */
    int n_running;
    bool stop;
    pthread_t thread;
    bool started;

    q35_prefix_cache cache;
    unsigned long long cache_queries, cache_hits;
    int32_t spec_k;            /* draft tokens per step, 0: off */
    unsigned long long spec_steps, spec_drafts, spec_accepted;
    unsigned long long spec_accepted_at[Q35_SPEC_K_MAX];
};

/* sched.c */
void q35_seq_fail(q35_sched *S, seq *s, const char *msg);
void q35_seq_begin(q35_sched *S, seq *s, float *row);
/* sched_prefill.c */
void q35_seq_prefill(q35_sched *S, seq *s);
int q35_sched_pick_slot(q35_sched *S, const seq *s);

#endif
