/* spec.c: one generation step, speculative with the MTP head (see qwen35.h).
 *
 * One step from `last` (x_P, to be evaluated at position P):
 *   1. draft: the pending MTP row (h_{P-1}, x_P) gives d_0; each further
 *      draft chains the MTP's own output hidden with the previous draft;
 *   2. verify: the target evaluates [x_P, d_0 .. d_{k-1}] as one rewindable
 *      batch, the state kept after each row (the GDN runs its recurrence row
 *      by row, so every row is computed exactly as single-token decode would);
 *   3. accept the longest prefix of drafts (greedy: equal to the target's
 *      argmax; sampling: accept d with probability min(1, p(d)/q(d)), on
 *      rejection sample from max(0, p - q) normalised), then one more token
 *      from the target (the correction, or the bonus after full acceptance:
 *      with a sampler, its own draw, as plain decoding makes it);
 *   4. rewind the session to the accepted rows.
 * Without drafts the step is 2 and 3 over one row. Every row a token is
 * chosen from, draft or target, first goes through q35_gen_process (the
 * generation's logits hook and min_tokens mask, generate.c), so p and q
 * are distributions of the same processed rows.
 *
 * Who chooses: the q35_generation's sampler (NULL: greedy), and every
 * random number, drafts' and acceptance tests' alike, comes from the
 * sampler's own RNG.
 *
 * With a reduced-vocabulary draft head (q35_engine_set_draft_vocab) step 1
 * reads only the subset's rows of lm_head: a greedy draft is the argmax over
 * the subset, a sampled one is drawn from the chooser's distribution of the
 * draft logits with every other token at -inf, so q is zero outside the
 * subset. Steps 2-4 do not change, so the output does not either. The head
 * itself is made in draft_vocab.c. */
#include "core/generate.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

static double uniform(q35_generation *g) { return q35_sampler_uniform(g->sampler); }

/* Greedy: no sampler, or one that only picks the argmax (then the verify
 * rows need no distributions and no draws). */
static int greedy(const q35_generation *g) {
    return !g->sampler || q35_sampler_is_argmax(g->sampler);
}

/* The distribution of the token after the step's first n_step tokens
 * (step: the drafts so far, not yet recorded by the sampler), from the
 * processed row r. */
static void dist(q35_generation *g, const float *r, const int32_t *step, int32_t n_step, float *probs) {
    q35_sampler_probs(g->sampler, r, step, n_step, probs);
}

static int32_t sample(q35_generation *g, const float *probs, int32_t n) {
    double u = uniform(g), total = 0.0;
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

/* The session's k cut by the generation's limit. */
int32_t q35_gen_draft_cap(const q35_generation *g) {
    int32_t k = g->s->spec_k < Q35_SPEC_MAX ? g->s->spec_k : Q35_SPEC_MAX;
    if (g->max_drafts < 0) return 0;
    return g->max_drafts > 0 && g->max_drafts < k ? g->max_drafts : k;
}

/* How many drafts g's next step may make: q35_gen_draft_cap, cut by the tokens
 * max_tokens leaves (the step's last token comes from the target) and by
 * the context. */
static int32_t draft_room(const q35_generation *g) {
    const q35_session *s = g->s;
    int32_t k = q35_gen_draft_cap(g);
    if (g->max_tokens > 0 && k > g->max_tokens - g->n_gen - 1) k = g->max_tokens - g->n_gen - 1;
    if (k > s->n_ctx - s->pos - 1) k = s->n_ctx - s->pos - 1; /* drafts must fit the context too */
    return k;
}

/* Drafts up to k tokens after g->last into drafts (none when there is no
 * MTP row pending or no room). For a generation, drafts is g->toks + n_gen,
 * so that the hook of draft j sees the drafts before it. */
static int32_t draft(q35_generation *g, int32_t *drafts) {
    q35_session *s = g->s;
    const int32_t V = s->engine->cfg.vocab_size;
    int32_t k = draft_room(g), nd = 0;
    if (k <= 0 || !s->mtp_on || !s->n_pending) return 0;
    const int32_t P = s->pos, n_head = q35_engine_draft_vocab(s->engine);
    const int32_t *ids = s->engine->n_draft ? s->engine->draft_ids : NULL;
    q35_mtp_flush(s, g->last, NULL, s->draft_logits);
    for (int32_t j = 0; j < k; j++) {
        float *dl = s->draft_logits + (size_t)j * V; /* n_head logits: row i is token ids[i] (or i) */
        int32_t d;
        if (greedy(g) && !g->logits_fn && g->n_gen + j >= g->min_tokens) { /* nothing masks the row: argmax over the head as it is */
            d = q35_argmax(dl, n_head);
            if (ids) d = ids[d];
        } else {
            const float *full = dl;
            if (ids) { /* the chooser sees the whole vocabulary, every token outside the subset at -inf */
                float *w = s->target_probs; /* free until accept() */
                for (int32_t v = 0; v < V; v++) w[v] = -INFINITY;
                for (int32_t i = 0; i < n_head; i++) w[ids[i]] = dl[i];
                full = w;
            }
            full = q35_gen_process(g, full, g->n_gen + j);
            if (greedy(g)) {
                d = q35_argmax(full, V);
            } else {
                dist(g, full, drafts, j, s->draft_probs + (size_t)j * V);
                d = sample(g, s->draft_probs + (size_t)j * V, V);
            }
        }
        if (s->draft_hook) d = s->draft_hook(s->draft_hook_ctx, P + 1 + j, d);
        drafts[nd++] = d;
        if (j + 1 < k) q35_mtp_rows(s, Q35_MTP_FROM_DRAFT, 0, &d, 1, P + j, NULL, dl + V);
    }
    return nd;
}

/* Chooses tokens from the verify rows (nd drafts, nd+1 rows): the accepted
 * drafts, then one token from the target. Returns how many were emitted. */
static int32_t accept(q35_generation *g, const float *rows, const int32_t *drafts, int32_t nd, int32_t *out,
                      int32_t *n_acc_out) {
    q35_session *s = g->s;
    const int32_t V = s->engine->cfg.vocab_size;
    int32_t n_emit = 0, n_acc = 0;
    for (int32_t i = 0; i <= nd; i++) {
        /* the accepted tokens so far are drafts[0..i): the hook sees them after the generated ones */
        const float *row = q35_gen_process(g, rows + (size_t)i * V, g->n_gen + i);
        int32_t t;
        if (greedy(g)) {
            t = q35_argmax(row, V);
            out[n_emit++] = t;
            if (i < nd && t == drafts[i]) { n_acc++; continue; }
            break;
        }
        if (i == nd) { /* no draft to test: exactly the sampler's own draw */
            out[n_emit++] = q35_sampler_sample_after(g->sampler, g->row, drafts, i);
            break;
        }
        float *p = s->target_probs;
        dist(g, row, drafts, i, p);
        if (i < nd) {
            const float *q = s->draft_probs + (size_t)i * V;
            int32_t d = drafts[i];
            /* q(d) = 0: d was not drawn from q (a test's draft hook put it
             * there), so the proposal was the point mass at d: accept with
             * probability p(d), else draw from p without d */
            const int forced = !(q[d] > 0);
            if (forced ? uniform(g) < p[d] : (double)p[d] >= (double)q[d] || uniform(g) * q[d] < p[d]) {
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
            if (!(mass > 0)) dist(g, row, drafts, i, p); /* p == q: fall back to p */
        }
        t = sample(g, p, V);
        out[n_emit++] = t;
        break;
    }
    *n_acc_out = n_acc;
    return n_emit;
}

q35_status q35_step_generations(q35_generation *const *gs, int32_t n, int32_t *out, int32_t *n_out, q35_error *err) {
    if (n <= 0 || !gs) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    q35_engine *e = gs[0]->s->engine;
    const int32_t V = e->cfg.vocab_size, K1 = Q35_SPEC_K_MAX + 1;
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        const q35_session *s = gs[i]->s;
        n_out[i] = 0;
        if (gs[i]->last < 0 || gs[i]->last >= V)
            return q35_fail(err, Q35_ERR_ARG, "batch row %d: token id %d is outside the vocabulary [0, %d)", i, gs[i]->last, V);
        if (s->engine != e) return q35_fail(err, Q35_ERR_ARG, "batch row %d uses another engine", i);
        total += q35_gen_draft_cap(gs[i]) + 1;
    }
    if (total > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a step batch holds at most %d rows (got %d)", Q35_UBATCH, total);
    float *logits = gs[0]->s->spec_logits;
    if (n > 1) logits = e->batch_logits; /* one lm_head pass over every row needs room for all of them */
    int32_t local[Q35_UBATCH][Q35_SPEC_MAX], *drafts[Q35_UBATCH], nd[Q35_UBATCH], rows_tok[Q35_UBATCH][Q35_SPEC_MAX + 1];
    int32_t counts[Q35_UBATCH] = {0};
    const int32_t *toks[Q35_UBATCH] = {0};
    q35_session *ss[Q35_UBATCH];
    int ckpt[Q35_UBATCH] = {0};
    for (int32_t i = 0; i < n; i++) {
        q35_generation *g = gs[i];
        ss[i] = g->s;
        drafts[i] = g->toks ? g->toks + g->n_gen : local[i];
        nd[i] = draft(g, drafts[i]);
        rows_tok[i][0] = g->last;
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
        n_out[i] = accept(gs[i], logits + (size_t)row * V, drafts[i], nd[i], out + (size_t)i * K1, &n_acc);
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

const float *q35_session_step_logits(const q35_session *s) { return s->spec_logits; }
