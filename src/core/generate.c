/* generate.c: one generation (q35_generation in qwen35.h): the end-of-
 * sequence ids of the engine, the logits hook and min_tokens mask every
 * chosen row goes through, and the stop conditions. The step itself
 * (drafting, verification, acceptance) is spec.c's.
 *
 * Data flow of one step: spec.c drafts (each draft row through
 * q35_gen_process, the drafts written after the generated tokens so that
 * the hook sees them), verifies all rows in one forward pass, and accepts
 * with the sampler's distribution of each processed row; then emit() here
 * records each token (the list, the sampler's penalties) and ends the
 * generation at the first token that stops it. */
#include "core/generate.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- end-of-sequence ids ---- */

static void add_eos(q35_engine *e, json_t *v) {
    for (size_t i = 0; v && i < (json_is_array(v) ? json_array_size(v) : 1); i++) {
        json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
        if (!json_is_integer(x)) continue;
        json_int_t id = json_integer_value(x);
        if (id < 0 || id >= e->cfg.vocab_size) continue;
        int dup = 0;
        for (int32_t k = 0; k < e->n_eos; k++) dup |= e->eos_ids[k] == (int32_t)id;
        if (!dup && e->n_eos < Q35_MAX_EOS) e->eos_ids[e->n_eos++] = (int32_t)id;
    }
}

void q35_eos_load(q35_engine *e, const char *dir) {
    e->n_eos = 0;
    static const char *const files[] = {"config.json", "generation_config.json"};
    for (int f = 0; f < 2; f++) {
        char *path = q35_path_join(dir, files[f]);
        json_t *root = path ? json_load_file(path, 0, NULL) : NULL;
        free(path);
        if (!f) add_eos(e, json_object_get(json_object_get(root, "text_config"), "eos_token_id"));
        add_eos(e, json_object_get(root, "eos_token_id"));
        json_decref(root);
    }
}

const int32_t *q35_engine_eos_ids(const q35_engine *e, int32_t *n) {
    if (n) *n = e->n_eos;
    return e->eos_ids;
}

/* ---- the row a token is chosen from ---- */

const float *q35_gen_process(q35_generation *g, const float *row, int32_t n_prev) {
    const int32_t V = g->s->engine->cfg.vocab_size;
    /* greedy with nothing to change: the argmax reads the row as it is (no copy of V floats) */
    if (!g->sampler && !g->logits_fn && n_prev >= g->min_tokens) return row;
    memcpy(g->row, row, sizeof(float) * (size_t)V);
    if (g->logits_fn) g->logits_fn(g->logits_ctx, g->row, V, g->toks, n_prev);
    if (n_prev < g->min_tokens)
        for (int32_t i = g->ignore_eos ? g->n_eos : 0; i < g->n_ends; i++) g->row[g->ends[i]] = -INFINITY;
    return g->row;
}

/* ---- generations ---- */

q35_status q35_generation_new(q35_session *s, const q35_gen_params *p, q35_generation **out, q35_error *err) {
    *out = NULL;
    static const q35_gen_params none = {0};
    if (!s) return q35_fail(err, Q35_ERR_ARG, "a generation needs a session");
    if (!p) p = &none;
    const q35_engine *e = s->engine;
    const int32_t V = e->cfg.vocab_size;
    if (p->n_eos_ids < 0 || p->n_stop_ids < 0 || (p->n_eos_ids && !p->eos_ids) || (p->n_stop_ids && !p->stop_ids))
        return q35_fail(err, Q35_ERR_ARG, "generation: bad eos_ids or stop_ids");
    for (int32_t i = 0; i < p->n_eos_ids + p->n_stop_ids; i++) {
        int32_t id = i < p->n_eos_ids ? p->eos_ids[i] : p->stop_ids[i - p->n_eos_ids];
        if (id < 0 || id >= V) return q35_fail(err, Q35_ERR_ARG, "generation: end token id %d is outside the vocabulary [0, %d)", id, V);
    }
    if (p->sampler && q35_sampler_vocab(p->sampler) != V)
        return q35_fail(err, Q35_ERR_ARG, "generation: the sampler has %d tokens, the model %d", q35_sampler_vocab(p->sampler), V);
    q35_generation *g = calloc(1, sizeof *g);
    if (!g) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    g->s = s;
    g->sampler = p->sampler;
    g->logits_fn = p->logits_fn;
    g->logits_ctx = p->logits_ctx;
    g->max_tokens = p->max_tokens > 0 ? p->max_tokens : 0;
    g->min_tokens = p->min_tokens > 0 ? p->min_tokens : 0;
    g->ignore_eos = p->ignore_eos != 0;
    g->max_drafts = p->max_drafts;
    /* no more tokens than the context can feed, plus the last one, plus a step's drafts */
    int64_t cap = (int64_t)s->n_ctx + 1;
    if (g->max_tokens && g->max_tokens < cap) cap = g->max_tokens;
    g->cap = (int32_t)cap + Q35_SPEC_K_MAX + 1;
    g->toks = malloc(sizeof(int32_t) * (size_t)g->cap);
    g->row = malloc(sizeof(float) * (size_t)V);
    g->ends = malloc(sizeof(int32_t) * (size_t)(e->n_eos + p->n_eos_ids + p->n_stop_ids + 1));
    if (!g->toks || !g->row || !g->ends) {
        int32_t want = g->cap;
        q35_generation_free(g);
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory for a generation of %d tokens", want);
    }
    for (int32_t i = 0; i < e->n_eos + p->n_eos_ids; i++) {
        int32_t id = i < e->n_eos ? e->eos_ids[i] : p->eos_ids[i - e->n_eos], dup = 0;
        for (int32_t k = 0; k < g->n_ends; k++) dup |= g->ends[k] == id;
        if (!dup) g->ends[g->n_ends++] = id;
    }
    g->n_eos = g->n_ends;
    for (int32_t i = 0; i < p->n_stop_ids; i++) g->ends[g->n_ends++] = p->stop_ids[i];
    *out = g;
    return Q35_OK;
}

void q35_generation_free(q35_generation *g) {
    if (!g) return;
    free(g->toks);
    free(g->row);
    free(g->ends);
    free(g);
}

/* Why tok ends the generation, if it does. An id that is both EOS and a
 * stop id ends it as EOS, unless EOS is ignored. */
static int32_t end_of(const q35_generation *g, int32_t tok) {
    for (int32_t i = g->ignore_eos ? g->n_eos : 0; i < g->n_ends; i++)
        if (g->ends[i] == tok) return i < g->n_eos ? Q35_STOP_EOS : Q35_STOP_TOKEN;
    return Q35_STOP_NONE;
}

/* Records the chosen tokens up to the first that stops the generation. */
static void emit(q35_generation *g, const int32_t *toks, int32_t n, q35_gen_out *out) {
    out->n_tokens = 0;
    out->stop = Q35_STOP_NONE;
    for (int32_t i = 0; i < n && !g->stop; i++) {
        int32_t t = toks[i];
        g->toks[g->n_gen++] = t;
        if (g->sampler) q35_sampler_accept(g->sampler, t);
        out->tokens[out->n_tokens++] = t;
        g->stop = end_of(g, t);
        if (!g->stop && g->max_tokens && g->n_gen >= g->max_tokens) g->stop = Q35_STOP_LENGTH;
    }
    g->last = out->tokens[out->n_tokens - 1];
    if (!g->stop && g->s->pos >= g->s->n_ctx) g->stop = Q35_STOP_CONTEXT;
    out->stop = g->stop;
}

q35_status q35_generation_begin(q35_generation *g, const float *logits, q35_gen_out *out, q35_error *err) {
    if (g->started) return q35_fail(err, Q35_ERR_ARG, "the generation has begun already");
    if (!logits) return q35_fail(err, Q35_ERR_ARG, "no logits to begin the generation from");
    const float *row = q35_gen_process(g, logits, 0);
    int32_t t = g->sampler ? q35_sampler_sample(g->sampler, g->row) : q35_argmax(row, g->s->engine->cfg.vocab_size);
    g->started = 1;
    emit(g, &t, 1, out);
    return Q35_OK;
}

q35_status q35_generation_begin_with(q35_generation *g, int32_t token, q35_gen_out *out, q35_error *err) {
    if (g->started) return q35_fail(err, Q35_ERR_ARG, "the generation has begun already");
    const int32_t V = g->s->engine->cfg.vocab_size;
    if (token < 0 || token >= V) return q35_fail(err, Q35_ERR_ARG, "token id %d is outside the vocabulary [0, %d)", token, V);
    g->started = 1;
    emit(g, &token, 1, out);
    return Q35_OK;
}

q35_status q35_generation_batch_step(q35_generation *const *gens, int32_t n, q35_gen_out *out, q35_error *err) {
    if (n <= 0 || !gens || !out) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    for (int32_t i = 0; i < n; i++) {
        out[i].n_tokens = 0;
        out[i].stop = gens[i]->stop;
        if (!gens[i]->started) return q35_fail(err, Q35_ERR_ARG, "batch row %d: the generation has not begun", i);
        if (gens[i]->stop) return q35_fail(err, Q35_ERR_ARG, "batch row %d: the generation has stopped", i);
    }
    /* consecutive generations whose rows fit one forward pass go together */
    int32_t toks[Q35_UBATCH * (Q35_SPEC_K_MAX + 1)], counts[Q35_UBATCH];
    for (int32_t i0 = 0; i0 < n;) {
        int32_t m = 0, rows = 0;
        while (i0 + m < n && m < Q35_UBATCH && rows + q35_gen_draft_cap(gens[i0 + m]) + 1 <= Q35_UBATCH)
            rows += q35_gen_draft_cap(gens[i0 + m++]) + 1;
        q35_status st = q35_step_generations(gens + i0, m, toks, counts, err);
        if (st) return st;
        for (int32_t i = 0; i < m; i++) emit(gens[i0 + i], toks + (size_t)i * (Q35_SPEC_K_MAX + 1), counts[i], &out[i0 + i]);
        i0 += m;
    }
    return Q35_OK;
}

q35_status q35_generation_step(q35_generation *g, q35_gen_out *out, q35_error *err) {
    return q35_generation_batch_step(&g, 1, out, err);
}

const int32_t *q35_generation_tokens(const q35_generation *g, int32_t *n) {
    if (n) *n = g->n_gen;
    return g->toks;
}

q35_stop_reason q35_generation_stop(const q35_generation *g) { return (q35_stop_reason)g->stop; }
