/* policy.c: q35_session_step and q35_batch_step, the steps that choose
 * through a q35_policy (a distribution callback and an rng state of the
 * caller's) instead of a q35_generation's sampler. They run the same step
 * (spec.c) with a generation that has no hook, mask or stop conditions; the
 * draws come from the policy's rng state, advanced here. */
#include "core/generate.h"
#include "base/util.h"

#include <string.h>

/* xorshift64* over the policy's state: a 53-bit uniform in [0, 1). */
double q35_policy_uniform(const q35_policy *p) {
    uint64_t *st = p->rng;
    if (!*st) *st = 0x9e3779b97f4a7c15ull;
    *st ^= *st >> 12;
    *st ^= *st << 25;
    *st ^= *st >> 27;
    return (double)((*st * 2685821657736338717ull) >> 11) * (1.0 / 9007199254740992.0);
}

q35_status q35_batch_step(q35_session *const *ss, const int32_t *last, int32_t n, const q35_policy *const *policies,
                          int32_t *out, int32_t *n_out, q35_error *err) {
    if (n <= 0 || !ss || !last) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    if (n > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a step batch holds at most %d sessions (got %d)", Q35_UBATCH, n);
    q35_generation gs[Q35_UBATCH], *gp[Q35_UBATCH];
    for (int32_t i = 0; i < n; i++) {
        const q35_policy *pol = policies ? policies[i] : NULL;
        n_out[i] = 0;
        if (pol && pol->probs && !pol->rng) return q35_fail(err, Q35_ERR_ARG, "batch row %d: a sampling policy needs an rng state", i);
        static const q35_policy plain = {0};
        gs[i] = (q35_generation){.s = ss[i], .policy = pol ? pol : &plain, .last = last[i]};
        gp[i] = &gs[i];
    }
    return q35_step_generations(gp, n, out, n_out, err);
}

q35_status q35_session_step(q35_session *s, int32_t last, const q35_policy *policy, int32_t *out, int32_t *n_out,
                            float *logits_out, q35_error *err) {
    const q35_policy *pols[1] = {policy};
    q35_status st = q35_batch_step(&s, &last, 1, pols, out, n_out, err);
    if (!st && logits_out) memcpy(logits_out, s->spec_logits, sizeof(float) * (size_t)s->engine->cfg.vocab_size * (size_t)*n_out);
    return st;
}

