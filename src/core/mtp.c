/* mtp.c: the MTP head's bookkeeping (the arithmetic is the backend's:
 * backend.h mtp). An MTP row at position p needs the target's hidden state
 * h_p and the token x_{p+1}; rows whose x_{p+1} is not known yet (the last
 * row of an eval, or every row of a verify pass until acceptance decides)
 * wait as the session's pending rows, their hidden states kept in the
 * backend, and go through the head when the next token arrives. */
#include "core/session.h"

void q35_mtp_rows(q35_session *s, q35_mtp_src src, int32_t row0, const int32_t *next, int32_t n, int32_t pos0,
                  float *logits) {
    q35_backend *b = s->engine->backend;
    b->ops->mtp(b, s->state, src, row0, next, n, pos0, logits);
}

void q35_mtp_flush(q35_session *s, int32_t next_token, float *logits) {
    if (!s->n_pending) return;
    int32_t next[Q35_SPEC_MAX + 1];
    for (int32_t i = 0; i + 1 < s->n_pending; i++) next[i] = s->pending_tok[i + 1];
    next[s->n_pending - 1] = next_token;
    q35_mtp_rows(s, Q35_MTP_FROM_KEPT, 0, next, s->n_pending, s->pending_pos0, logits);
    s->n_pending = 0;
}
