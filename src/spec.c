/* spec.c: speculative decoding with the MTP head (see qwen35.h).
 *
 * One step from `last` (x_P, to be evaluated at position P):
 *   1. draft: the pending MTP row (h_{P-1}, x_P) gives d_0; each further
 *      draft chains the MTP's own output hidden with the previous draft;
 *   2. verify: the target evaluates [x_P, d_0 .. d_{k-1}] as one batch with
 *      per-row state checkpoints (the GDN runs its recurrence row by row, so
 *      every row is computed exactly as single-token decode would);
 *   3. accept the longest prefix of drafts (greedy: equal to the target's
 *      argmax; sampling: accept d with probability min(1, p(d)/q(d)), on
 *      rejection sample from max(0, p - q) normalised), then one more token
 *      from the target (the correction, or the bonus after full acceptance);
 *   4. rewind the session to the accepted rows. */
#include "kernels/kernels.h"
#include "session.h"

#include <stdlib.h>

static double rng_uniform(uint64_t *st) { /* xorshift64*, 53-bit uniform in [0, 1) */
    if (!*st) *st = 0x9e3779b97f4a7c15ull;
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return (double)((*st * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

static int32_t sample(const float *probs, int32_t n, uint64_t *rng) {
    double u = rng_uniform(rng), total = 0.0;
    for (int32_t i = 0; i < n; i++) total += probs[i];
    u *= total;
    double acc = 0.0;
    int32_t last_nz = 0;
    for (int32_t i = 0; i < n; i++) {
        if (probs[i] <= 0) continue;
        acc += probs[i];
        last_nz = i;
        if (u < acc) return i;
    }
    return last_nz; /* rounding left u at the very top */
}

void q35_spec_free_buffers(q35_session *s) {
    free(s->spec_logits); free(s->draft_logits); free(s->draft_probs); free(s->target_probs);
    s->spec_logits = s->draft_logits = s->draft_probs = s->target_probs = NULL;
}

q35_status q35_session_set_spec(q35_session *s, int32_t k, q35_error *err) {
    const q35_engine *e = s->engine;
    const q35_config *c = &e->cfg;
    if (k < 0 || k > Q35_SPEC_K_MAX)
        return q35_fail(err, Q35_ERR_ARG, "speculative draft length %d is out of range [0, %d]", k, Q35_SPEC_K_MAX);
    if (k > 0 && !e->w.mtp.present)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the model has no MTP head (mtp.* tensors), so it cannot speculate");
    if (k == 0) {
        s->spec_k = 0;
        s->mtp_on = 0;
        s->n_pending = 0;
        s->ckpt_rows = 0;
        return Q35_OK;
    }
    size_t H = (size_t)c->hidden_size, V = (size_t)c->vocab_size, U = Q35_UBATCH;
    size_t kv = (size_t)s->n_ctx * (size_t)c->n_head_kv * (size_t)c->head_dim;
    int ok = 1;
#define ALLOC(ptr, n) do { if (!(ptr)) { (ptr) = calloc((n), sizeof(float)); ok = ok && (ptr); } } while (0)
    ALLOC(s->mtp_k_cache, kv);
    ALLOC(s->mtp_v_cache, kv);
    ALLOC(s->mtp_x, U * H);
    ALLOC(s->mtp_xn, U * H);
    ALLOC(s->mtp_cat, U * 2 * H);
    ALLOC(s->pending_hidden, (Q35_SPEC_MAX + 1) * H);
    ALLOC(s->draft_hidden, H);
    ALLOC(s->draft_logits, Q35_SPEC_MAX * V);
    ALLOC(s->draft_probs, Q35_SPEC_MAX * V);
#undef ALLOC
    if (ok && k != s->spec_k) {
        float *nc = realloc(s->ckpt, (size_t)k * s->state_floats * sizeof(float));
        if (nc) s->ckpt = nc; else ok = 0;
    }
    if (!ok) return q35_fail(err, Q35_ERR_NOMEM, "out of memory for speculative decoding buffers (k = %d)", k);
    s->spec_k = k;
    s->mtp_on = 1;
    s->ckpt_rows = 0;
    return Q35_OK;
}

int32_t q35_session_spec_k(const q35_session *s) { return s->spec_k; }
q35_spec_stats q35_session_spec_stats(const q35_session *s) { return s->stats; }

q35_status q35_session_step(q35_session *s, int32_t last, const q35_policy *policy, int32_t *out, int32_t *n_out,
                            float *logits_out, q35_error *err) {
    const q35_config *c = &s->engine->cfg;
    const int32_t V = c->vocab_size;
    const int greedy = !policy || !policy->probs;
    *n_out = 0;
    if (last < 0 || last >= V)
        return q35_fail(err, Q35_ERR_ARG, "token id %d is outside the vocabulary [0, %d)", last, V);
    if (!greedy && !policy->rng) return q35_fail(err, Q35_ERR_ARG, "a sampling policy needs an rng state");

    int32_t k = s->spec_k;
    if (k > s->n_ctx - s->pos - 1) k = s->n_ctx - s->pos - 1; /* drafts must fit the context too */
    int32_t drafts[Q35_SPEC_MAX], nd = 0;
    if (k > 0 && s->mtp_on && s->n_pending > 0) {
        const int32_t P = s->pos;
        q35_mtp_flush(s, last, s->draft_logits);
        for (int32_t j = 0; j < k; j++) {
            float *dl = s->draft_logits + (size_t)j * V;
            int32_t d;
            if (greedy) {
                d = q35_argmax(dl, V);
            } else {
                policy->probs(policy->ctx, dl, drafts, j, s->draft_probs + (size_t)j * V);
                d = sample(s->draft_probs + (size_t)j * V, V, policy->rng);
            }
            if (s->draft_hook) d = s->draft_hook(s->draft_hook_ctx, P + 1 + j, d);
            drafts[nd++] = d;
            if (j + 1 < k) q35_mtp_rows(s, s->draft_hidden, &d, 1, P + j, dl + V);
        }
    }

    int32_t batch[Q35_SPEC_MAX + 1];
    batch[0] = last;
    memcpy(batch + 1, drafts, sizeof(int32_t) * (size_t)nd);
    int32_t n = nd + 1;
    q35_status st = q35_session_eval(s, batch, n, s->spec_logits, Q35_EVAL_ALL_LOGITS | (nd ? Q35_EVAL_CHECKPOINT : 0), err);
    if (st) return st;
    const float *rows = s->spec_logits;

    int32_t n_emit = 0, n_acc = 0;
    for (int32_t i = 0; i < n; i++) {
        const float *row = rows + (size_t)i * V;
        int32_t t;
        if (greedy) {
            t = q35_argmax(row, V);
            out[n_emit++] = t;
            if (i < nd && t == drafts[i]) { n_acc++; continue; }
            break;
        }
        float *p = s->target_probs;
        policy->probs(policy->ctx, row, out, n_emit, p);
        if (i < nd) {
            const float *q = s->draft_probs + (size_t)i * V;
            int32_t d = drafts[i];
            if ((double)p[d] >= (double)q[d] || rng_uniform(policy->rng) * q[d] < p[d]) {
                out[n_emit++] = d;
                n_acc++;
                continue;
            }
            double mass = 0.0; /* residual distribution max(0, p - q) */
            for (int32_t v = 0; v < V; v++) {
                float r = p[v] - q[v];
                p[v] = r > 0 ? r : 0.0f;
                mass += p[v];
            }
            if (!(mass > 0)) policy->probs(policy->ctx, row, out, n_emit, p); /* p == q: fall back to p */
        }
        t = sample(p, V, policy->rng);
        out[n_emit++] = t;
        break;
    }
    if (logits_out) memcpy(logits_out, rows, sizeof(float) * (size_t)V * (size_t)n_emit);
    if (nd) {
        st = q35_session_rewind(s, n_acc + 1, err);
        if (st) return st;
        s->stats.steps++;
        s->stats.drafts += nd;
        s->stats.accepted += n_acc;
    }
    *n_out = n_emit;
    return Q35_OK;
}
