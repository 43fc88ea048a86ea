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
 *   4. rewind the session to the accepted rows.
 *
 * With a reduced-vocabulary draft head (q35_engine_set_draft_vocab) step 1
 * reads only the subset's rows of lm_head: a greedy draft is the argmax over
 * the subset, a sampled one is drawn from the policy's distribution of the
 * draft logits with every other token at -inf, so q is zero outside the
 * subset. Steps 2-4 do not change, so the output does not either. The head
 * itself is made in draft_vocab.c. */
#include "core/session.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
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

int32_t q35_session_spec_k(const q35_session *s) { return s->spec_k; }
q35_spec_stats q35_session_spec_stats(const q35_session *s) { return s->stats; }

/* Drafts up to k tokens for session s after `last` (none when there is no
 * MTP row pending or no room in the context). */
static int32_t draft(q35_session *s, int32_t last, const q35_policy *policy, int32_t *drafts) {
    const int32_t V = s->engine->cfg.vocab_size;
    const int greedy = !policy || !policy->probs;
    int32_t k = s->spec_k, nd = 0;
    if (k > s->n_ctx - s->pos - 1) k = s->n_ctx - s->pos - 1; /* drafts must fit the context too */
    if (k <= 0 || !s->mtp_on || !s->n_pending) return 0;
    const int32_t P = s->pos, n_head = q35_engine_draft_vocab(s->engine);
    const int32_t *ids = s->engine->n_draft ? s->engine->draft_ids : NULL;
    q35_mtp_flush(s, last, s->draft_logits);
    for (int32_t j = 0; j < k; j++) {
        float *dl = s->draft_logits + (size_t)j * V; /* n_head logits: row i is token ids[i] (or i) */
        int32_t d;
        if (greedy) {
            d = q35_argmax(dl, n_head);
            if (ids) d = ids[d];
        } else {
            const float *full = dl;
            if (ids) { /* the policy sees the whole vocabulary, every token outside the subset at -inf */
                float *w = s->target_probs; /* free until accept() */
                for (int32_t v = 0; v < V; v++) w[v] = -INFINITY;
                for (int32_t i = 0; i < n_head; i++) w[ids[i]] = dl[i];
                full = w;
            }
            policy->probs(policy->ctx, full, drafts, j, s->draft_probs + (size_t)j * V);
            d = sample(s->draft_probs + (size_t)j * V, V, policy->rng);
        }
        if (s->draft_hook) d = s->draft_hook(s->draft_hook_ctx, P + 1 + j, d);
        drafts[nd++] = d;
        if (j + 1 < k) q35_mtp_rows(s, Q35_MTP_FROM_DRAFT, 0, &d, 1, P + j, dl + V);
    }
    return nd;
}

/* Chooses tokens from the verify rows (nd drafts, nd+1 rows): the accepted
 * drafts, then one token from the target. Returns how many were emitted. */
static int32_t accept(q35_session *s, const float *rows, const int32_t *drafts, int32_t nd, const q35_policy *policy,
                      int32_t *out, int32_t *n_acc_out) {
    const int32_t V = s->engine->cfg.vocab_size;
    const int greedy = !policy || !policy->probs;
    int32_t n_emit = 0, n_acc = 0;
    for (int32_t i = 0; i <= nd; i++) {
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
            /* q(d) = 0: d was not drawn from q (a test's draft hook put it
             * there), so the proposal was the point mass at d: accept with
             * probability p(d), else draw from p without d */
            const int forced = !(q[d] > 0);
            if (forced ? rng_uniform(policy->rng) < p[d]
                       : (double)p[d] >= (double)q[d] || rng_uniform(policy->rng) * q[d] < p[d]) {
                out[n_emit++] = d;
                n_acc++;
                continue;
            }
            double mass = 0.0; /* residual distribution max(0, p - q); q is 0 outside a draft vocabulary */
            for (int32_t v = 0; v < V; v++) {
                float r = forced ? (v == d ? 0.0f : p[v]) : p[v] - q[v];
                p[v] = r > 0 ? r : 0.0f;
                mass += p[v];
            }
            if (!(mass > 0)) policy->probs(policy->ctx, row, out, n_emit, p); /* p == q: fall back to p */
        }
        t = sample(p, V, policy->rng);
        out[n_emit++] = t;
        break;
    }
    *n_acc_out = n_acc;
    return n_emit;
}

q35_status q35_batch_step(q35_session *const *ss, const int32_t *last, int32_t n, const q35_policy *const *policies,
                          int32_t *out, int32_t *n_out, q35_error *err) {
    if (n <= 0 || !ss || !last) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    q35_engine *e = ss[0]->engine;
    const int32_t V = e->cfg.vocab_size, K1 = Q35_SPEC_K_MAX + 1;
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const q35_policy *pol = policies ? policies[i] : NULL;
        n_out[i] = 0;
        if (last[i] < 0 || last[i] >= V)
            return q35_fail(err, Q35_ERR_ARG, "batch row %d: token id %d is outside the vocabulary [0, %d)", i, last[i], V);
        if (pol && pol->probs && !pol->rng) return q35_fail(err, Q35_ERR_ARG, "batch row %d: a sampling policy needs an rng state", i);
        if (ss[i]->engine != e) return q35_fail(err, Q35_ERR_ARG, "batch row %d uses another engine", i);
        total += (ss[i]->spec_k < Q35_SPEC_MAX ? ss[i]->spec_k : Q35_SPEC_MAX) + 1;
    }
    if (total > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a step batch holds at most %d rows (got %d)", Q35_UBATCH, total);
    float *logits = ss[0]->spec_logits;
    if (n > 1) logits = e->batch_logits; /* one lm_head pass over every row needs room for all of them */
    int32_t drafts[Q35_UBATCH][Q35_SPEC_MAX], nd[Q35_UBATCH], rows_tok[Q35_UBATCH][Q35_SPEC_MAX + 1];
    int32_t counts[Q35_UBATCH] = {0};
    const int32_t *toks[Q35_UBATCH] = {0};
    int ckpt[Q35_UBATCH] = {0};
    for (int32_t i = 0; i < n; i++) {
        nd[i] = draft(ss[i], last[i], policies ? policies[i] : NULL, drafts[i]);
        rows_tok[i][0] = last[i];
        memcpy(rows_tok[i] + 1, drafts[i], sizeof(int32_t) * (size_t)nd[i]);
        toks[i] = rows_tok[i];
        counts[i] = nd[i] + 1;
        ckpt[i] = nd[i] > 0;
    }
    q35_status st = q35_forward_sessions(ss, toks, counts, ckpt, n, logits, err);
    if (st) return st;
    for (int32_t i = 0, row = 0; i < n; i++) {
        q35_session *s = ss[i];
        int32_t n_acc = 0;
        n_out[i] = accept(s, logits + (size_t)row * V, drafts[i], nd[i], policies ? policies[i] : NULL, out + (size_t)i * K1,
                          &n_acc);
        if (s->spec_logits != logits + (size_t)row * V) /* the chosen rows, for callers that want logprobs */
            memcpy(s->spec_logits, logits + (size_t)row * V, sizeof(float) * (size_t)V * (size_t)n_out[i]);
        row += counts[i];
        if (nd[i]) {
            if ((st = q35_session_rewind(s, n_acc + 1, err))) return st;
            s->stats.steps++;
            s->stats.drafts += nd[i];
            s->stats.accepted += n_acc;
            for (int32_t j = 0; j < n_acc; j++) s->stats.accepted_at[j]++;
        }
    }
    return Q35_OK;
}

q35_status q35_session_step(q35_session *s, int32_t last, const q35_policy *policy, int32_t *out, int32_t *n_out,
                            float *logits_out, q35_error *err) {
    const q35_policy *pols[1] = {policy};
    q35_status st = q35_batch_step(&s, &last, 1, pols, out, n_out, err);
    if (!st && logits_out) memcpy(logits_out, s->spec_logits, sizeof(float) * (size_t)s->engine->cfg.vocab_size * (size_t)*n_out);
    return st;
}

const float *q35_session_step_logits(const q35_session *s) { return s->spec_logits; }
