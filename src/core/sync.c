/* sync.c: the token history of a session and prefix reuse (see
 * q35_session_sync in qwen35.h).
 *
 * A session records the token id of every position it evaluates (the
 * forward pass notes each batch's rows; a rewind cuts the record to the rows
 * kept; a snapshot carries the record of the session it was taken from).
 * The Gated DeltaNet state of a position folds in every token before it and
 * cannot be rewound, so the state at a shorter prefix exists only where it
 * was kept: reuse is the session's whole history, or a snapshot, when that
 * is a proper prefix of the new prompt. */
#include "core/session.h"
#include "base/util.h"

#include <stdlib.h>
#include <string.h>

void q35_hist_note(q35_session *s, const int32_t *tokens, int32_t n, int32_t pos0) {
    s->n_fed += n;
    if (s->n_hist != pos0) { /* the rows before these are not known */
        s->n_hist = -1;
        return;
    }
    memcpy(s->hist + pos0, tokens, sizeof(int32_t) * (size_t)n);
    s->n_hist = pos0 + n;
}

void q35_hist_cut(q35_session *s) {
    if (s->n_hist > s->pos) s->n_hist = s->pos;
}

const int32_t *q35_session_tokens(const q35_session *s, int32_t *n) {
    int known = s->n_hist == s->pos;
    if (n) *n = known ? s->pos : 0;
    return known ? s->hist : NULL;
}

/* Is ids[0..m) a proper prefix of prompt[0..n)? */
static int proper_prefix(const int32_t *ids, int32_t m, const int32_t *prompt, int32_t n) {
    return ids && m < n && !memcmp(ids, prompt, sizeof(int32_t) * (size_t)m);
}

/* The prompt checks of q35_session_reuse and q35_session_sync. */
static q35_status check_prompt(const q35_session *s, const int32_t *prompt, int32_t n, q35_error *err) {
    const int32_t V = s->engine->cfg.vocab_size;
    if (n <= 0 || !prompt) return q35_fail(err, Q35_ERR_ARG, "no prompt tokens to evaluate");
    if (n > s->n_ctx)
        return q35_fail(err, Q35_ERR_CONTEXT, "a prompt of %d tokens does not fit a %d-token context", n, s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= V)
            return q35_fail(err, Q35_ERR_ARG, "token id %d at index %d is outside the vocabulary [0, %d)", prompt[i], i, V);
    return Q35_OK;
}

q35_status q35_session_reuse(q35_session *s, const int32_t *prompt, int32_t n, const q35_snapshot *snap, int32_t *n_kept,
                             q35_error *err) {
    if (n_kept) *n_kept = 0;
    q35_status st = check_prompt(s, prompt, n, err);
    if (st) return st;
    int32_t n_own = 0, n_snap = 0;
    const int32_t *own = q35_session_tokens(s, &n_own);
    const int32_t *snap_ids = snap ? q35_snapshot_tokens(snap, &n_snap) : NULL;
    int use_own = proper_prefix(own, n_own, prompt, n);
    int use_snap = proper_prefix(snap_ids, n_snap, prompt, n) && n_snap > 0 && (!use_own || n_snap > n_own);
    int32_t keep = 0;
    if (use_snap) {
        if ((st = q35_snapshot_restore(s, snap, err))) return st;
        keep = n_snap;
    } else if (use_own) {
        keep = n_own;
    } else {
        q35_session_reset(s);
    }
    if (n_kept) *n_kept = keep;
    return Q35_OK;
}

q35_status q35_session_sync(q35_session *s, const int32_t *prompt, int32_t n, const q35_snapshot *snap, float *logits,
                            int32_t *n_reused, q35_error *err) {
    int32_t keep = 0;
    if (n_reused) *n_reused = 0;
    q35_status st = q35_session_reuse(s, prompt, n, snap, &keep, err);
    if (!st) st = q35_session_eval(s, prompt + keep, n - keep, logits, 0, err);
    if (!st && n_reused) *n_reused = keep;
    return st;
}
