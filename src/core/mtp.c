/* mtp.c: the MTP head's bookkeeping (the arithmetic is the backend's:
 * backend.h mtp). An MTP row at position p needs the target's hidden state
 * h_p and the token x_{p+1}; rows whose x_{p+1} is not known yet (the last
 * row of an eval, or every row of a verify pass until acceptance decides)
 * wait as the session's pending rows, their hidden states kept in the
 * backend, and go through the head when the next token arrives. */
#include "core/session.h"

void q35_mtp_rows(q35_session *s, q35_mtp_src src, int32_t row0, const int32_t *next, int32_t n, int32_t pos0,
                  const q35_bmm *mm, float *logits) {
    q35_backend *b = s->engine->backend;
    b->ops->mtp(b, s->state, src, row0, next, n, pos0, mm ? mm : q35_session_text_mm(s), logits);
}

/* An MTP row at cache position p turns at the target's rotary position of
 * row p (vLLM's EagleProposer: the draft rows take target_positions, and
 * each chained draft adds 1 on all three axes), and an image row x_{p+1}
 * enters as its vision embedding (vLLM embeds the shifted ids with the
 * multimodal embeddings). */
void q35_mtp_flush(q35_session *s, int32_t next_token, const float *next_embed, float *logits) {
    if (!s->n_pending) return;
    int32_t next[Q35_SPEC_MAX + 1];
    const float *embed[Q35_SPEC_MAX + 1] = {0};
    for (int32_t i = 0; i + 1 < s->n_pending; i++) next[i] = s->pending_tok[i + 1];
    next[s->n_pending - 1] = next_token;
    embed[s->n_pending - 1] = next_embed;
    q35_bmm mm = {s->rope_delta, s->pending_has_pos3 ? s->pending_pos3 : NULL, next_embed ? embed : NULL};
    int plain = !s->pending_has_pos3 && !next_embed;
    q35_mtp_rows(s, Q35_MTP_FROM_KEPT, 0, next, s->n_pending, s->pending_pos0, plain ? NULL : &mm, logits);
    s->n_pending = 0;
    s->pending_has_pos3 = 0;
}
