/* session.c: sessions and the model's forward pass over the backend.
 *
 * The forward pass, written once for every backend (backend.h):
 *   begin(rows)              embed the rows of one or more sessions
 *   layer(li), li = 0..L-1   each decoder layer over all rows
 *   end()                    final norm
 * then lm_head for the rows whose logits are wanted, and the MTP head for
 * the rows whose next token is known (commit_rows). A session's rows carry
 * its own position and state, so a batch of sessions computes each one as
 * if it were alone. */
#include "core/session.h"
#include "base/util.h"

#include <stdlib.h>

static const q35_backend_ops *ops_of(const q35_session *s) { return s->engine->backend->ops; }

q35_status q35_session_new(q35_engine *e, int32_t n_ctx, q35_session **out, q35_error *err) {
    *out = NULL;
    const q35_config *c = &e->cfg;
    if (n_ctx <= 0 || n_ctx > c->max_position_embeddings) n_ctx = c->max_position_embeddings;
    q35_session *s = calloc(1, sizeof *s);
    if (!s) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    s->engine = e;
    s->n_ctx = n_ctx;
    q35_status st = e->backend->ops->state_new(e->backend, n_ctx, &s->state, err);
    if (!st) {
        /* counted while it holds a backend state (sessions may be made on several threads) */
        __atomic_fetch_add(&e->n_sessions, 1, __ATOMIC_RELAXED);
        s->spec_logits = malloc((Q35_SPEC_MAX + 1) * (size_t)c->vocab_size * sizeof(float));
        s->target_probs = malloc((size_t)c->vocab_size * sizeof(float));
        s->hist = malloc((size_t)n_ctx * sizeof(int32_t));
        if (!s->spec_logits || !s->target_probs || !s->hist)
            st = q35_fail(err, Q35_ERR_NOMEM, "out of memory creating a session of %d positions", n_ctx);
    }
    if (st) {
        q35_session_free(s);
        return st;
    }
    *out = s;
    return Q35_OK;
}

void q35_session_free(q35_session *s) {
    if (!s) return;
    if (s->state) {
        ops_of(s)->state_free(s->state);
        __atomic_fetch_sub(&s->engine->n_sessions, 1, __ATOMIC_RELAXED);
    }
    free(s->spec_logits); free(s->draft_logits); free(s->draft_probs); free(s->target_probs); free(s->hist);
    free(s);
}

void q35_session_reset(q35_session *s) {
    ops_of(s)->state_clear(s->state);
    s->pos = 0;
    s->rope_delta = 0;
    s->n_pending = 0;
    s->rewind_rows = 0;
    s->n_hist = 0;
}

q35_status q35_session_fill_random(q35_session *s, int32_t n, uint64_t seed, q35_error *err) {
    if (n < 0 || n >= s->n_ctx)
        return q35_fail(err, Q35_ERR_ARG, "fill of %d positions: the session holds %d", n, s->n_ctx);
    if (!ops_of(s)->state_fill)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the %s backend cannot fill a session with random states",
                        ops_of(s)->name);
    q35_session_reset(s);
    if (n > 0) ops_of(s)->state_fill(s->state, n, seed);
    s->pos = n;
    s->n_hist = n ? -1 : 0;
    return Q35_OK;
}

int32_t q35_session_pos(const q35_session *s) { return s->pos; }
int32_t q35_session_ctx(const q35_session *s) { return s->n_ctx; }

q35_status q35_session_set_spec(q35_session *s, int32_t k, q35_error *err) {
    const q35_engine *e = s->engine;
    if (k < 0 || k > Q35_SPEC_K_MAX)
        return q35_fail(err, Q35_ERR_ARG, "speculative draft length %d is out of range [0, %d]", k, Q35_SPEC_K_MAX);
    if (k > 0 && !e->w.mtp.present)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the model has no MTP head (mtp.* tensors), so it cannot speculate");
    s->rewind_rows = 0;
    if (k == 0) {
        s->spec_k = 0;
        s->mtp_on = 0;
        s->n_pending = 0;
        return Q35_OK;
    }
    size_t V = (size_t)e->cfg.vocab_size;
    if (!s->draft_logits) s->draft_logits = calloc(Q35_SPEC_MAX * V, sizeof(float));
    if (!s->draft_probs) s->draft_probs = calloc(Q35_SPEC_MAX * V, sizeof(float));
    if (!s->draft_logits || !s->draft_probs)
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory for speculative decoding buffers (k = %d)", k);
    q35_status st = ops_of(s)->state_set_spec(s->state, k, err);
    if (st) return st;
    s->spec_k = k;
    s->mtp_on = 1;
    return Q35_OK;
}

const q35_bmm *q35_session_text_mm(q35_session *s) {
    if (!s->rope_delta) return NULL;
    s->text_mm = (q35_bmm){s->rope_delta, NULL, NULL};
    return &s->text_mm;
}

/* After a forward pass over T rows of session s (its output rows from
 * row0 in the backend, input tokens in tokens, first at pos0): rows whose
 * next token is known go through the MTP now, filling its KV cache, and the
 * rest wait for it. A rewindable (verify) pass keeps all rows pending until
 * the caller knows which survive. */
void q35_commit_rows(q35_session *s, int32_t row0, const int32_t *tokens, const int32_t *hist_ids, int32_t T,
                     int32_t pos0, int rewindable, const q35_bmm *mm) {
    q35_hist_note(s, hist_ids ? hist_ids : tokens, T, pos0);
    s->rewind_rows = rewindable ? T : 0;
    s->rewind_pos0 = pos0;
    if (!s->mtp_on) return;
    int32_t n_now = rewindable ? 0 : T - 1;
    if (n_now > 0) {
        /* row i pairs with input i+1: its rotary position is row i's, its next input row i+1's */
        q35_bmm sub = {0};
        if (mm) sub = (q35_bmm){mm->rope_delta, mm->pos3, mm->embed ? mm->embed + 1 : NULL};
        q35_mtp_rows(s, Q35_MTP_FROM_FORWARD, row0, tokens + 1, n_now, pos0, mm ? &sub : NULL, NULL);
    }
    s->n_pending = T - n_now;
    s->pending_pos0 = pos0 + n_now;
    s->pending_has_pos3 = mm && mm->pos3;
    if (s->pending_has_pos3) memcpy(s->pending_pos3, mm->pos3 + (size_t)3 * n_now, sizeof s->pending_pos3);
    ops_of(s)->keep_rows(s->engine->backend, s->state, row0 + n_now, s->n_pending);
    memcpy(s->pending_tok, tokens + n_now, sizeof(int32_t) * (size_t)s->n_pending);
}

void q35_forward(q35_backend *b, const q35_config *c, const q35_bseq *seqs, int32_t n_seqs, const int32_t *tokens,
                 int32_t n_rows) {
    b->ops->begin(b, seqs, n_seqs, tokens, n_rows);
    for (int32_t li = 0; li < c->n_layer; li++) b->ops->layer(b, li);
    b->ops->end(b);
}

q35_status q35_session_eval(q35_session *s, const int32_t *tokens, int32_t n, float *logits, int flags, q35_error *err) {
    q35_engine *e = s->engine;
    const q35_config *c = &e->cfg;
    if (n <= 0 || !tokens) return q35_fail(err, Q35_ERR_ARG, "no tokens to evaluate");
    if (n > s->n_ctx - s->pos)
        return q35_fail(err, Q35_ERR_CONTEXT, "%d tokens do not fit: position %d of a %d-token context", n, s->pos,
                        s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return q35_fail(err, Q35_ERR_ARG, "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                            c->vocab_size);
    const int rewindable = (flags & Q35_EVAL_REWINDABLE) != 0;
    if (rewindable && (!s->spec_k || n > s->spec_k + 1))
        return q35_fail(err, Q35_ERR_ARG, "a rewindable eval takes at most spec_k+1 = %d tokens (got %d)",
                        s->spec_k + 1, n);
    return q35_eval_rows(s, tokens, n, logits, flags, NULL, NULL, NULL, err);
}

q35_status q35_eval_rows(q35_session *s, const int32_t *tokens, int32_t n, float *logits, int flags,
                         const int32_t *pos3, const float *const *embed, const int32_t *hist, q35_error *err) {
    q35_engine *e = s->engine;
    const q35_config *c = &e->cfg;
    const int rewindable = (flags & Q35_EVAL_REWINDABLE) != 0;
    const int32_t V = c->vocab_size;
    for (int32_t done = 0; done < n;) {
        int32_t T = n - done < Q35_UBATCH ? n - done : Q35_UBATCH;
        int32_t pos0 = s->pos;
        /* rows left pending by the previous call learn their next token now */
        if (s->mtp_on && s->n_pending) q35_mtp_flush(s, tokens[done], embed ? embed[done] : NULL, NULL);
        q35_bmm mm = {0, pos3 ? pos3 + (size_t)3 * done : NULL, embed ? embed + done : NULL};
        q35_bseq one = {s->state, 0, T, pos0, (flags & Q35_EVAL_RECURRENT) != 0 || T < GDN_MIN_CHUNKED, rewindable,
                        pos3 ? &mm : q35_session_text_mm(s)};
        q35_forward(e->backend, c, &one, 1, tokens + done, T);
        s->pos += T;
        if (logits && (flags & Q35_EVAL_ALL_LOGITS))
            e->backend->ops->logits(e->backend, 0, T, logits + (size_t)done * V);
        else if (logits && done + T == n)
            e->backend->ops->logits(e->backend, T - 1, 1, logits);
        q35_commit_rows(s, 0, tokens + done, hist ? hist + done : NULL, T, pos0, rewindable, one.mm);
        done += T;
    }
    return q35_backend_status(e->backend, err); /* a device fault of the pass */
}

q35_status q35_session_rewind(q35_session *s, int32_t n_keep, q35_error *err) {
    if (!s->rewind_rows) return q35_fail(err, Q35_ERR_ARG, "nothing to rewind: the last eval was not rewindable");
    if (n_keep < 1 || n_keep > s->rewind_rows)
        return q35_fail(err, Q35_ERR_ARG, "cannot keep %d rows of a %d-row eval", n_keep, s->rewind_rows);
    if (n_keep < s->rewind_rows) ops_of(s)->state_rewind(s->state, n_keep);
    /* attention rows past the new end are overwritten before they are ever read */
    s->pos = s->rewind_pos0 + n_keep;
    if (s->mtp_on && s->n_pending > n_keep) s->n_pending = n_keep;
    s->rewind_rows = 0;
    q35_hist_cut(s);
    return Q35_OK;
}

q35_status q35_forward_sessions(q35_session *const *ss, const int32_t *const *tokens, const int32_t *counts,
                                const int *rewindable, int32_t n, float *logits, q35_error *err) {
    if (n <= 0 || !ss || !tokens) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    q35_engine *e = ss[0]->engine;
    const q35_config *c = &e->cfg;
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        q35_session *s = ss[i];
        if (s->engine != e) return q35_fail(err, Q35_ERR_ARG, "batch row %d uses another engine", i);
        for (int32_t j = 0; j < i; j++)
            if (ss[j] == s) return q35_fail(err, Q35_ERR_ARG, "session repeated in batch rows %d and %d", j, i);
        if (counts[i] < 1 || counts[i] > s->n_ctx - s->pos)
            return q35_fail(err, Q35_ERR_CONTEXT, "batch row %d: %d tokens do not fit: position %d of a %d-token context",
                            i, counts[i], s->pos, s->n_ctx);
        if (rewindable[i] && (!s->spec_k || counts[i] > s->spec_k + 1))
            return q35_fail(err, Q35_ERR_ARG, "batch row %d: a rewindable eval takes at most spec_k+1 tokens", i);
        for (int32_t t = 0; t < counts[i]; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= c->vocab_size)
                return q35_fail(err, Q35_ERR_ARG, "batch row %d: token id %d is outside the vocabulary", i, tokens[i][t]);
        total += counts[i];
    }
    if (total > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a batch holds at most %d rows (got %d)", Q35_UBATCH, total);
    q35_bseq seqs[Q35_UBATCH] = {{0}};
    int32_t flat[Q35_UBATCH] = {0}, row = 0;
    for (int32_t i = 0; i < n; i++) {
        q35_session *s = ss[i];
        if (s->mtp_on && s->n_pending) q35_mtp_flush(s, tokens[i][0], NULL, NULL);
        seqs[i] = (q35_bseq){s->state, row, counts[i], s->pos, counts[i] < GDN_MIN_CHUNKED, rewindable[i],
                             q35_session_text_mm(s)};
        memcpy(flat + row, tokens[i], sizeof(int32_t) * (size_t)counts[i]);
        row += counts[i];
    }
    q35_forward(e->backend, c, seqs, n, flat, total);
    if (logits) e->backend->ops->logits(e->backend, 0, total, logits);
    for (int32_t i = 0; i < n; i++) {
        ss[i]->pos += counts[i];
        q35_commit_rows(ss[i], seqs[i].row0, tokens[i], NULL, counts[i], seqs[i].pos0, rewindable[i], seqs[i].mm);
    }
    return q35_backend_status(e->backend, err); /* a device fault of the pass */
}

q35_status q35_batch_decode(q35_session *const *sessions, const int32_t *tokens, int32_t n, float *logits,
                            q35_error *err) {
    if (n <= 0 || !sessions || !tokens) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    if (n > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a batch holds at most %d sessions (got %d)", Q35_UBATCH, n);
    const int32_t *toks[Q35_UBATCH];
    int32_t counts[Q35_UBATCH];
    int rewindable[Q35_UBATCH];
    for (int32_t i = 0; i < n; i++) { toks[i] = &tokens[i]; counts[i] = 1; rewindable[i] = 0; }
    return q35_forward_sessions(sessions, toks, counts, rewindable, n, logits, err);
}
