/* snapshot.c: a copy of a session's whole state at its position (qwen35.h).
 * The numbers (GDN states, KV rows 0..pos-1, and with the MTP on its KV
 * rows and the pending hidden rows) are the backend's copy; what the core
 * keeps beside it is which rows are pending and their tokens. */
#include "core/session.h"
#include "base/util.h"

#include <stdlib.h>

struct q35_snapshot {
    const q35_engine *engine;
    int32_t pos;
    q35_bsnap *data;
    void (*free_data)(q35_bsnap *);    /* the backend's, kept so a snapshot may outlive its engine */
    int has_mtp;                       /* taken with the MTP on: its part is in data */
    int32_t n_pending, pending_pos0;
    int32_t pending_tok[Q35_SPEC_MAX + 1];
    int32_t pending_has_pos3, pending_pos3[3];
    int32_t rope_delta;                /* the session's multimodal rotary offset (session.h) */
    int32_t *tokens;                   /* the session's token ids 0..pos-1; NULL: not known */
    size_t bytes;
};

q35_status q35_snapshot_take(const q35_session *s, q35_snapshot **out, q35_error *err) {
    *out = NULL;
    q35_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    const q35_backend_ops *ops = s->engine->backend->ops;
    q35_status st = ops->snapshot_take(s->state, s->pos, s->mtp_on ? s->n_pending : 0, s->mtp_on, &snap->data,
                                       &snap->bytes, err);
    if (st) {
        free(snap);
        return st;
    }
    if (s->n_hist == s->pos && (snap->tokens = malloc(((size_t)s->pos + 1) * sizeof(int32_t)))) {
        memcpy(snap->tokens, s->hist, (size_t)s->pos * sizeof(int32_t));
        snap->bytes += (size_t)s->pos * sizeof(int32_t);
    }
    snap->engine = s->engine;
    snap->free_data = ops->snapshot_free;
    snap->pos = s->pos;
    snap->has_mtp = s->mtp_on;
    snap->rope_delta = s->rope_delta;
    if (s->mtp_on) {
        snap->n_pending = s->n_pending;
        snap->pending_pos0 = s->pending_pos0;
        memcpy(snap->pending_tok, s->pending_tok, sizeof snap->pending_tok);
        snap->pending_has_pos3 = s->pending_has_pos3;
        memcpy(snap->pending_pos3, s->pending_pos3, sizeof snap->pending_pos3);
    }
    *out = snap;
    return Q35_OK;
}

q35_status q35_snapshot_restore(q35_session *s, const q35_snapshot *snap, q35_error *err) {
    if (snap->engine != s->engine) return q35_fail(err, Q35_ERR_ARG, "snapshot belongs to another engine");
    if (snap->pos > s->n_ctx)
        return q35_fail(err, Q35_ERR_CONTEXT, "snapshot of %d positions does not fit a %d-token context", snap->pos, s->n_ctx);
    s->engine->backend->ops->snapshot_restore(s->state, snap->data);
    s->pos = snap->pos;
    s->rope_delta = snap->rope_delta;
    s->pending_has_pos3 = 0;
    s->n_hist = snap->tokens ? snap->pos : -1;
    if (snap->tokens) memcpy(s->hist, snap->tokens, (size_t)snap->pos * sizeof(int32_t));
    s->rewind_rows = 0;
    s->n_pending = 0; /* without the MTP's part, drafting resumes after the next eval */
    if (s->mtp_on && snap->has_mtp) {
        s->n_pending = snap->n_pending;
        s->pending_pos0 = snap->pending_pos0;
        memcpy(s->pending_tok, snap->pending_tok, sizeof s->pending_tok);
        s->pending_has_pos3 = snap->pending_has_pos3;
        memcpy(s->pending_pos3, snap->pending_pos3, sizeof s->pending_pos3);
    }
    return Q35_OK;
}

int32_t q35_snapshot_pos(const q35_snapshot *snap) { return snap->pos; }
size_t q35_snapshot_bytes(const q35_snapshot *snap) { return snap->bytes; }
const int32_t *q35_snapshot_tokens(const q35_snapshot *snap, int32_t *n) {
    if (n) *n = snap->tokens ? snap->pos : 0;
    return snap->tokens;
}

void q35_snapshot_free(q35_snapshot *snap) {
    if (!snap) return;
    if (snap->data) snap->free_data(snap->data);
    free(snap->tokens);
    free(snap);
}
