/* session.h: the engine's and session's internals, shared by engine.c
 * (load), session.c (evaluation over the backend), snapshot.c, mtp.c (the
 * MTP head's bookkeeping), spec.c (speculative decoding) and draft_vocab.c.
 *
 * The numbers live in the backend (backend/backend.h): weights, KV caches,
 * recurrent states, hidden rows. A session here holds what the core decides
 * with: its position, which evaluated rows still wait for the MTP, the
 * extent of a rewindable pass, and the host buffers of a speculative step.
 * Its memory is sized when it is created (and when speculation is switched
 * on); evaluation allocates nothing. */
#ifndef Q35_SESSION_H
#define Q35_SESSION_H

#include "backend/backend.h"
#include "formats/safetensors.h"
#include "model/model.h"

#define Q35_MAX_EOS 16   /* end-of-sequence ids an engine keeps */
/* A sequence's run of fewer rows than this goes through the Gated DeltaNet
 * row by row (the recurrent form), so a speculative verify pass (at most
 * Q35_SPEC_MAX + 1 rows) computes each row exactly as single-token decode
 * does, in a batch or alone. */
#define GDN_MIN_CHUNKED 16

struct q35_engine {
    q35_config cfg;
    q35_checkpoint ck;
    q35_weights w;
    q35_model_info info;
    q35_backend *backend;  /* where the model runs (Q35_BACKEND) */
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
    int32_t n_sessions;    /* open sessions: a weight may be replaced only when there are none */
};

struct q35_session {
    q35_engine *engine;
    q35_bstate *state;                 /* KV caches, GDN states and hidden rows, in the backend */
    int32_t n_ctx, pos;

    /* MTP head (active when the checkpoint has one and speculation is on) */
    int32_t mtp_on;
    /* Rows the target has evaluated whose next token is not yet known to
     * the MTP: row i sits at position pending_pos0 + i with input token
     * pending_tok[i]; its hidden state is the backend state's kept row i. */
    int32_t n_pending, pending_pos0;
    int32_t pending_tok[Q35_SPEC_MAX + 1];
    /* A pending row of an image prompt has its own 3-axis rotary position
     * (then n_pending is 1). */
    int32_t pending_has_pos3, pending_pos3[3];

    /* Multimodal rotary: rows after an image turn at cache position +
     * rope_delta (transformers' rope_deltas: the image's positions advance
     * by max(h, w) / merge, not by its row count); 0 for text. */
    int32_t rope_delta;
    q35_bmm text_mm;                   /* {rope_delta} for text rows, handed to the backend */

    /* speculative verification: the last eval was rewindable (the backend
     * kept the state after each of its rows), so q35_session_rewind can
     * drop its rejected rows */
    int32_t spec_k;
    int32_t rewind_pos0, rewind_rows;  /* position and length of that eval; 0 rows: none */

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

void q35_spec_free_draft_head(q35_engine *e); /* draft_vocab.c */

/* ---- replacing one weight (engine.c), for `qwen35 eval --sweep` ----
 * The bound tensor called `name` (a matrix of the text model or the MTP
 * head), or NULL if there is none. */
const q35_tensor *q35_engine_weight(const q35_engine *e, const char *name);
/* Binds t (same shape, any dtype the matmul kernels read; its data stays
 * the caller's and must outlive its use) in place of the weight `name`, and
 * reopens the backend over the new weights (a backend may copy them), so no
 * session may be open. Tied embeddings: replacing the embedding replaces
 * the lm_head too. The engine's byte counts (q35_engine_info) follow. */
q35_status q35_engine_set_weight(q35_engine *e, const char *name, const q35_tensor *t, q35_error *err);
/* Calibration: every matmul of the model from now on first calls tap with
 * its matrices (the bound tensors, as q35_engine_weight returns them) and
 * input rows (NULL: none). Host backends only (Q35_ERR_UNSUPPORTED
 * elsewhere); replacing a weight reopens the backend without it. */
q35_status q35_engine_set_tap(q35_engine *e, q35_matmul_tap tap, void *ctx, q35_error *err);
/* generate.c: reads the end-of-sequence ids of the model directory dir. */
void q35_eos_load(q35_engine *e, const char *dir);
/* sync.c: the token history. note: rows pos0.. of tokens were evaluated;
 * cut: the session now holds only its first pos tokens. */
void q35_hist_note(q35_session *s, const int32_t *tokens, int32_t n, int32_t pos0);
void q35_hist_cut(q35_session *s);
/* q35_draft_vocab_load on size bytes already read (name: for messages). */
q35_status q35_draft_vocab_parse(const char *data, size_t size, const char *name, int32_t vocab_size, int32_t **ids,
                                 int32_t *n, q35_error *err);

/* The MTP head (mtp.c). Rows pairing hidden states (from src: the last
 * forward pass's output rows, the kept rows, or the last draft) with the
 * next tokens x_{p+1}, at positions pos0..: they write the MTP KV cache;
 * with logits, the last row's draft logits (predicting x_{p+2}) are
 * computed and its MTP hidden kept for chaining. */
void q35_mtp_rows(q35_session *s, q35_mtp_src src, int32_t row0, const int32_t *next, int32_t n, int32_t pos0,
                  const q35_bmm *mm, float *logits);
/* Runs the pending rows, the last one with next_token (whose input is
 * next_embed when it is an image row, else NULL); clears them. */
void q35_mtp_flush(q35_session *s, int32_t next_token, const float *next_embed, float *logits);

/* session.c: the text rows' q35_bmm of s (NULL while its rope_delta is 0,
 * so text-only sessions run exactly the text path). */
const q35_bmm *q35_session_text_mm(q35_session *s);
/* After a forward pass (see session.c): the token history, pending MTP
 * rows. hist_ids (NULL: tokens) is what the history records; mm the rows'
 * multimodal part or NULL. */
void q35_commit_rows(q35_session *s, int32_t row0, const int32_t *tokens, const int32_t *hist_ids, int32_t T,
                     int32_t pos0, int rewindable, const q35_bmm *mm);
/* session.c: n checked tokens of s in passes of up to Q35_UBATCH rows
 * (q35_session_eval's flags). For an image prompt (mm.c): pos3 (n, 3) the
 * rows' rotary positions, embed (n) their input rows (NULL entries: the
 * token's), hist (n) what the history records; all NULL for text. */
q35_status q35_eval_rows(q35_session *s, const int32_t *tokens, int32_t n, float *logits, int flags,
                         const int32_t *pos3, const float *const *embed, const int32_t *hist, q35_error *err);
/* The forward pass over seqs (rows in order, tokens flat). */
void q35_forward(q35_backend *b, const q35_config *c, const q35_bseq *seqs, int32_t n_seqs, const int32_t *tokens,
                 int32_t n_rows);

/* One forward pass over several sessions at once (session.c): session i
 * feeds counts[i] tokens (rewindable when rewindable[i]); logits, when
 * given, receive every row in order, (sum of counts, V). At most
 * Q35_UBATCH rows in all. */
q35_status q35_forward_sessions(q35_session *const *ss, const int32_t *const *tokens, const int32_t *counts,
                                const int *rewindable, int32_t n, float *logits, q35_error *err);

#endif
