/* session.h: the engine's and session's internals, shared by engine.c
 * (load, forward), mtp.c (the MTP head) and spec.c (speculative decoding).
 *
 * A session's memory is sized when it is created (and when speculation is
 * switched on); evaluation allocates nothing. */
#ifndef Q35_SESSION_H
#define Q35_SESSION_H

#include "model/model.h"
#include "formats/safetensors.h"
#include "backend/cpu/threadpool.h"

#define Q35_UBATCH 128   /* tokens per forward micro-batch: bounds scratch memory */
#define Q35_SPEC_MAX 8   /* most draft tokens per speculative step */
/* Batches shorter than this run the GDN recurrence row by row, so a verify
 * batch computes each row exactly as single-token decode does. */
#define Q35_GDN_MIN_CHUNKED 16
#define Q35_MAX_EOS 16   /* end-of-sequence ids an engine keeps */

struct q35_engine {
    q35_config cfg;
    q35_checkpoint ck;
    q35_weights w;
    q35_model_info info;
    q35_pool *pool;        /* the workers every session of this engine computes with */
    float *batch_logits;   /* (UBATCH, V) for multi-session steps; its pages are touched on first use */
    /* Reduced-vocabulary draft head (q35_engine_set_draft_vocab): rows
     * draft_ids[i] of lm_head, ascending, copied in lm_head's dtype into
     * draft_head_data; n_draft 0: the draft uses the whole lm_head. */
    int32_t n_draft;
    int32_t *draft_ids;    /* (n_draft) */
    q35_tensor draft_head; /* (n_draft, H) */
    void *draft_head_data;
    /* End-of-sequence ids (q35_engine_eos_ids): config.json's, then
     * generation_config.json's, without repeats (generate.c). */
    int32_t eos_ids[Q35_MAX_EOS];
    int32_t n_eos;
};

struct q35_session {
    q35_engine *engine;
    int32_t n_ctx, pos;
    float *conv_state[Q35_MAX_LAYERS]; /* (CD, CK-1) GDN layers only */
    float *ssm_state[Q35_MAX_LAYERS];  /* (HV, DK, DV) GDN layers only */
    float *k_cache[Q35_MAX_LAYERS];    /* (n_ctx, NKV*HD) full layers only */
    float *v_cache[Q35_MAX_LAYERS];
    float *state_block;                /* one allocation behind conv and ssm states */
    size_t state_floats;
    float *x, *xn, *tmp;               /* (UBATCH, H) */
    float *mlp_gate, *mlp_up;          /* (UBATCH, I) */
    float *mixer_scratch;

    /* MTP head (active when the checkpoint has one and speculation is on) */
    int32_t mtp_on;
    float *mtp_k_cache, *mtp_v_cache;  /* (n_ctx, NKV*HD) the MTP layer's own KV */
    float *mtp_x, *mtp_xn, *mtp_cat;   /* (UBATCH, H), (UBATCH, H), (UBATCH, 2H) */
    /* Rows the target has evaluated whose next token is not yet known to
     * the MTP: row i sits at position pending_pos0 + i with input token
     * pending_tok[i] and post-norm hidden state pending_hidden[i]. */
    int32_t n_pending, pending_pos0;
    int32_t pending_tok[Q35_SPEC_MAX + 1];
    float *pending_hidden;             /* (SPEC_MAX+1, H) */
    float *draft_hidden;               /* (H) MTP output of the last draft row (chained drafts) */

    /* speculative verification: GDN states after each row of the last
     * checkpointed eval, so that q35_session_rewind can drop rejected rows */
    int32_t spec_k;
    float *ckpt;                       /* (spec_k, state_floats) */
    int32_t ckpt_pos0, ckpt_rows;      /* position and length of that eval; 0 rows: none */

    /* Tests may replace each draft (at position pos) to steer acceptance. */
    int32_t (*draft_hook)(void *ctx, int32_t pos, int32_t proposed);
    void *draft_hook_ctx;
    float *spec_logits;                /* (SPEC_MAX+1, V) target logits of a step (allocated with the session) */
    float *draft_logits;               /* (SPEC_MAX, V) */
    float *draft_probs;                /* (SPEC_MAX, V) the distributions drafts were sampled from */
    float *target_probs;               /* (V) (allocated with the session) */
    q35_spec_stats stats;

    /* The token ids at positions 0..n_hist-1 (sync.c): every eval and step
     * records its input here; n_hist < 0 when they are not known (restored
     * from a snapshot that did not know its own). n_fed counts every token
     * evaluated since the session was made. */
    int32_t *hist;                     /* (n_ctx) */
    int32_t n_hist;
    int64_t n_fed;
};

void q35_spec_free_buffers(q35_session *s); /* spec.c */
/* generate.c: reads the end-of-sequence ids of the model directory dir. */
void q35_eos_load(q35_engine *e, const char *dir);
/* sync.c: the token history. note: rows pos0.. of tokens were evaluated;
 * cut: the session now holds only its first pos tokens. */
void q35_hist_note(q35_session *s, const int32_t *tokens, int32_t n, int32_t pos0);
void q35_hist_cut(q35_session *s);
void q35_spec_free_draft_head(q35_engine *e); /* spec.c */
/* q35_draft_vocab_load on size bytes already read (name: for messages). */
q35_status q35_draft_vocab_parse(const char *data, size_t size, const char *name, int32_t vocab_size, int32_t **ids,
                                 int32_t *n, q35_error *err);
/* The tensor the MTP draft's logits come from: the reduced head or lm_head. */
static inline const q35_tensor *q35_draft_head(const q35_engine *e) { return e->n_draft ? &e->draft_head : &e->w.lm_head; }

/* The MTP head (mtp.c). Rows (h_p, next token x_{p+1}) at positions
 * pos0.. write the MTP KV cache; with logits, the last row's draft logits
 * (predicting x_{p+2}) are computed and its MTP hidden kept for chaining. */
void q35_mtp_rows(q35_session *s, const float *hidden, const int32_t *next, int32_t n, int32_t pos0, float *logits);
/* Runs the pending rows, the last one with next_token; clears them. */
void q35_mtp_flush(q35_session *s, int32_t next_token, float *logits);

/* One forward pass over several sessions at once (engine.c): session i
 * feeds counts[i] tokens (checkpointed when checkpoint[i]); logits, when
 * given, receive every row in order, (sum of counts, V). At most
 * Q35_UBATCH rows in all. */
q35_status q35_forward_sessions(q35_session *const *ss, const int32_t *const *tokens, const int32_t *counts,
                                const int *checkpoint, int32_t n, float *logits, q35_error *err);

/* Shared forward helpers (engine.c). */
void q35_mlp_forward(const q35_config *c, const q35_layer_weights *l, const float *xn, float *out, float *gate,
                     float *up, int32_t T, q35_pool *pool);

#endif
