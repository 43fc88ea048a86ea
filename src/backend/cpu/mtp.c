/* mtp.c: the multi-token-prediction head (vLLM Qwen3_5MultiTokenPredictor
 * semantics), used to draft tokens for speculative decoding.
 *
 * One row pairs the main model's post-final-norm hidden state h_p with the
 * embedding of the next token x_{p+1}; its output predicts x_{p+2}:
 *   u = fc [rmsnorm1p(E[x_{p+1}]) | rmsnorm1p(h_p)]     (embedding first)
 *   u += attn(rmsnorm1p(u)) at position p, with the MTP layer's own KV cache
 *   u += mlp(rmsnorm1p(u));  d = rmsnorm1p(u, mtp.norm);  logits = lm_head d
 * The embedding and lm_head are the main model's (the draft's logits may
 * come from a copy of a subset of lm_head's rows: q35_engine_set_draft_vocab,
 * then logits[i] is the logit of token draft_ids[i]). A chained draft feeds d
 * back as the hidden state of the next row. */
#include "backend/cpu/attention.h"
#include "backend/cpu/compute.h"
#include "backend/cpu/kernels/kernels.h"
#include "core/session.h"

void q35_mtp_rows(q35_session *s, const float *hidden, const int32_t *next, int32_t n, int32_t pos0, float *logits) {
    const q35_engine *e = s->engine;
    const q35_config *c = &e->cfg;
    const q35_mtp_weights *m = &e->w.mtp;
    const int32_t H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    float *cat = s->mtp_cat, *u = s->mtp_x, *un = s->mtp_xn;
    for (int32_t i = 0; i < n; i++) {
        float *row = cat + (size_t)i * 2 * H;
        q35_kernels_get()->get_row(row, &e->w.embed, next[i]);
        q35_rmsnorm1p(row, &m->pre_fc_norm_embedding, H, eps);
        q35_rmsnorm1p_to(row + H, hidden + (size_t)i * H, &m->pre_fc_norm_hidden, H, eps);
    }
    q35_matmul(e->pool, u, &m->fc, cat, n);
    for (int32_t i = 0; i < n; i++) q35_rmsnorm1p_to(un + (size_t)i * H, u + (size_t)i * H, &m->layer.input_norm, H, eps);
    /* cat is free again: it holds the mixer output (n, H) */
    q35_attn_seg seg = {0, n, pos0, s->mtp_k_cache, s->mtp_v_cache};
    q35_attention_forward(c, &m->layer, &seg, 1, un, cat, n, s->n_ctx, s->mixer_scratch, e->pool);
    for (size_t i = 0; i < (size_t)n * H; i++) u[i] += cat[i];
    for (int32_t i = 0; i < n; i++) q35_rmsnorm1p_to(un + (size_t)i * H, u + (size_t)i * H, &m->layer.post_norm, H, eps);
    q35_mlp_forward(c, &m->layer, un, cat, s->mlp_gate, s->mlp_up, n, e->pool);
    for (size_t i = 0; i < (size_t)n * H; i++) u[i] += cat[i];
    if (logits) {
        q35_rmsnorm1p_to(s->draft_hidden, u + (size_t)(n - 1) * H, &m->norm, H, eps);
        q35_matmul(e->pool, logits, q35_draft_head(e), s->draft_hidden, 1);
    }
}

void q35_mtp_flush(q35_session *s, int32_t next_token, float *logits) {
    if (!s->n_pending) return;
    int32_t next[Q35_SPEC_MAX + 1];
    for (int32_t i = 0; i + 1 < s->n_pending; i++) next[i] = s->pending_tok[i + 1];
    next[s->n_pending - 1] = next_token;
    q35_mtp_rows(s, s->pending_hidden, next, s->n_pending, s->pending_pos0, logits);
    s->n_pending = 0;
}
