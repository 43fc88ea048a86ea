/* generate.h: the state of one generation (q35_generation in qwen35.h),
 * shared by generate.c (the public calls, stop conditions) and spec.c (the
 * step: drafting, verification, acceptance). */
#ifndef Q35_GENERATE_H
#define Q35_GENERATE_H

#include "core/session.h"

#include <stdbool.h>

struct q35_generation {
    q35_session *s;
    q35_sampler *sampler;         /* NULL: greedy */
    q35_logits_fn logits_fn;
    void *logits_ctx;
    int32_t max_tokens, min_tokens, ignore_eos, max_drafts;
    int32_t *ends;                /* the EOS ids (n_eos of them), then the stop ids */
    int32_t n_eos, n_ends;
    int32_t *toks;                /* the tokens generated (n_gen), then room for a step's drafts */
    int32_t n_gen, cap;
    int32_t last;                 /* the newest token, not yet evaluated */
    int32_t started, stop;
    float *row;                   /* (V) the processed logits row */
};

/* One step for n generations (spec.c): each drafts, every verify row goes
 * through one forward pass, and out + i*(Q35_SPEC_K_MAX+1) receives the
 * n_out[i] tokens generation i accepted and chose (none recorded yet). */
q35_status q35_step_generations(q35_generation *const *gs, int32_t n, int32_t *out, int32_t *n_out, q35_error *err);

/* The most drafts g's steps make: the session's k cut by max_drafts. A step
 * of g takes at most that plus one rows of a forward pass. */
int32_t q35_gen_draft_cap(const q35_generation *g);

/* The row the chooser sees for the token after the first n_prev of g->toks:
 * the logits hook, then the min_tokens mask. */
const float *q35_gen_process(q35_generation *g, const float *row, int32_t n_prev);

/* sampler.c: a uniform draw in [0, 1) from the sampler's RNG; and
 * q35_sampler_sample with prev counted as generated. */
double q35_sampler_uniform(q35_sampler *s);
int32_t q35_sampler_vocab(const q35_sampler *s);
/* The sampler draws nothing and penalises nothing: it picks the argmax. */
bool q35_sampler_is_argmax(const q35_sampler *s);
int32_t q35_sampler_sample_after(q35_sampler *s, float *logits, const int32_t *prev, int32_t n_prev);
/* engine.c: the greatest of x[0..n) that is not NaN (-inf when none), as q35_argmax finds it. */
float q35_row_max(const float *x, int32_t n);
/* The sampler's e^x (within 1 ulp; 0 below -87), the same bits on every machine, and its softmax sum
 * of e^(logits[i] - mx) over a row (in blocks of lanes: its own order, not id order). */
float q35_sampler_exp(float x);
double q35_sampler_row_sum(const float *logits, int32_t n, float mx);

#endif
