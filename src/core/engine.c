/* engine.c: loading a model (qwen35.h q35_engine_load): config.json, the
 * checkpoint or weight cache mapped (and read into huge-page memory or
 * not), every tensor bound and checked (model/weights.c), then the backend
 * opened over the bound weights (Q35_BACKEND: cpu, or the scalar reference).
 * q35_engine is never written after load, except by
 * q35_engine_set_draft_vocab. Sessions: session.c. */
#include "core/generate.h"
#include "core/session.h"
#include "formats/cache.h"
#include "formats/kv_q8.h"
#include "model/tensors.h"

#include <math.h>
#include <stdlib.h>
#ifdef __SSE2__
#include <immintrin.h>
#endif

static int64_t tensor_elems(const q35_tensor *t) { return t->data ? q35_tensor_nelem(t) : 0; }

static int64_t layer_bytes(const q35_layer_weights *l, int64_t *n_elems) {
    const q35_tensor *ts = (const q35_tensor *)l;
    int64_t bytes = 0;
    for (size_t j = 0; j < sizeof(q35_layer_weights) / sizeof(q35_tensor); j++) {
        if (n_elems) *n_elems += tensor_elems(&ts[j]);
        bytes += (int64_t)ts[j].nbytes;
    }
    return bytes;
}

/* Bytes of the weight files, all mapped. */
static int64_t file_bytes(const q35_checkpoint *ck) {
    int64_t n = 0;
    for (int32_t i = 0; i < ck->n_files; i++) n += (int64_t)ck->files[i].map.size;
    return n;
}

static void fill_info(q35_engine *e) {
    const q35_config *c = &e->cfg;
    const q35_weights *w = &e->w;
    q35_model_info *in = &e->info;
    in->vocab_size = c->vocab_size;
    in->hidden_size = c->hidden_size;
    in->n_layer = c->n_layer;
    in->n_layer_full = c->n_layer_full;
    in->max_position = c->max_position_embeddings;
    in->eos_token_id = c->eos_token_id;
    in->has_mtp = w->mtp.present;
    in->has_vision = c->vision.present && w->vision.present;
    in->file_bytes = file_bytes(&e->ck);
    in->weights_copied = e->ck.n_files > 0 && e->ck.files[0].map.copied; /* all files alike */
    const size_t row = q35_kv_row_bytes(in->kv_cache == Q35_KV_Q8, c->head_dim);
    in->kv_bytes_per_pos = (int64_t)(2 * (size_t)c->n_layer_full * (size_t)c->n_head_kv * row);
    int64_t n = tensor_elems(&w->embed) + tensor_elems(&w->final_norm);
    int64_t layers = 0;
    for (int32_t i = 0; i < c->n_layer; i++) layers += layer_bytes(&w->layers[i], &n);
    int64_t head = (int64_t)w->lm_head.nbytes, embed_row = (int64_t)w->embed.nbytes / c->vocab_size;
    if (!c->tie_word_embeddings) n += tensor_elems(&w->lm_head);
    in->n_params = n;
    in->weight_bytes = layers + (int64_t)w->embed.nbytes + (int64_t)w->final_norm.nbytes +
                       (c->tie_word_embeddings ? 0 : head);
    in->bytes_per_token = layers + (int64_t)w->final_norm.nbytes + head + embed_row;
    if (w->mtp.present) {
        const q35_mtp_weights *m = &w->mtp;
        in->mtp_bytes_per_draft = layer_bytes(&m->layer, NULL) + (int64_t)(m->fc.nbytes + m->norm.nbytes +
                                  m->pre_fc_norm_embedding.nbytes + m->pre_fc_norm_hidden.nbytes) + head + embed_row;
    }
}

q35_status q35_engine_load(const char *path, const q35_engine_params *params, q35_engine **out, q35_error *err) {
    *out = NULL;
    if (!path || !*path) return q35_fail(err, Q35_ERR_ARG, "no model path given");
    if (!q35_is_dir(path)) return q35_fail(err, Q35_ERR_IO, "%s: not a directory (expected a checkpoint directory or a weight cache)", path);
    q35_engine *e = calloc(1, sizeof *e);
    if (!e) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    char *cfg_path = q35_path_join(path, "config.json");
    q35_status st = q35_config_load(cfg_path, &e->cfg, err);
    free(cfg_path);
    if (!st) st = q35_cache_present(path) ? q35_cache_open(path, &e->ck, err) : q35_checkpoint_open(path, &e->ck, err);
    int32_t mode = params ? params->weights : Q35_WEIGHTS_AUTO;
    if (!st && mode == Q35_WEIGHTS_AUTO) {
        int64_t bytes = file_bytes(&e->ck);
        mode = q35_huge_pages_offered() && q35_mem_available() >= bytes + bytes / 4 ? Q35_WEIGHTS_IN_MEMORY
                                                                                    : Q35_WEIGHTS_MAPPED;
    }
    for (int32_t i = 0; !st && mode == Q35_WEIGHTS_IN_MEMORY && i < e->ck.n_files; i++)
        st = q35_map_copy(&e->ck.files[i].map, e->ck.files[i].path, err);
    if (!st) st = q35_weights_bind(&e->ck, &e->cfg, &e->w, err);
    if (!st) st = q35_backend_open(params ? params->backend : NULL, &e->cfg, &e->w, params ? params->n_threads : 0, &e->backend, err);
    int32_t kv = params ? params->kv_cache : Q35_KV_F32;
    if (!st && kv != Q35_KV_F32) {
        if (!q35_kv_cache_name(kv)) st = q35_fail(err, Q35_ERR_ARG, "unknown KV cache format %d", kv);
        else if (!e->backend->ops->set_kv_cache)
            st = q35_fail(err, Q35_ERR_UNSUPPORTED, "the %s backend keeps its KV cache in f32 only (asked for %s)",
                          e->backend->ops->name, q35_kv_cache_name(kv));
        else st = e->backend->ops->set_kv_cache(e->backend, kv, err);
    }
    if (!st) e->info.kv_cache = kv;
    if (!st && !(e->batch_logits = malloc(sizeof(float) * (size_t)Q35_UBATCH * (size_t)e->cfg.vocab_size)))
        st = q35_fail(err, Q35_ERR_NOMEM, "out of memory for batch logits");
    if (st) {
        q35_engine_free(e);
        return st;
    }
    fill_info(e);
    q35_eos_load(e, path);
    *out = e;
    return Q35_OK;
}

void q35_engine_free(q35_engine *e) {
    if (!e) return;
    if (e->backend) e->backend->ops->close(e->backend);
    free(e->batch_logits);
    q35_spec_free_draft_head(e);
    q35_checkpoint_close(&e->ck);
    free(e);
}

const q35_model_info *q35_engine_info(const q35_engine *e) { return &e->info; }

const char *q35_engine_kernels(const q35_engine *e, const char **note) {
    return e->backend->ops->kernels(e->backend, note);
}

const char *q35_engine_backend(const q35_engine *e) { return e->backend->ops->name; }

int32_t q35_engine_threads(const q35_engine *e) { return e->backend->ops->threads(e->backend); }

int32_t q35_kv_cache_parse(const char *name) {
    if (!name) return -1;
    if (!strcmp(name, "f32") || !strcmp(name, "fp32")) return Q35_KV_F32;
    if (!strcmp(name, "q8") || !strcmp(name, "q8_0")) return Q35_KV_Q8;
    return -1;
}

const char *q35_kv_cache_name(int32_t kv_cache) {
    return kv_cache == Q35_KV_F32 ? "f32" : kv_cache == Q35_KV_Q8 ? "q8" : NULL;
}

/* The greatest of x[0..n) that is not NaN (-inf when none): four chains of
 * maxps sixteen values at a time; maxps(x, m) is `x > m ? x : m` lane by
 * lane, so a NaN in x is dropped. */
float q35_row_max(const float *x, int32_t n) {
    float m = -INFINITY;
    int32_t i = 0;
#ifdef __SSE2__
    __m128 v[4] = {_mm_set1_ps(m), _mm_set1_ps(m), _mm_set1_ps(m), _mm_set1_ps(m)};
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) v[k] = _mm_max_ps(_mm_loadu_ps(x + i + 4 * k), v[k]);
    for (; i + 4 <= n; i += 4) v[0] = _mm_max_ps(_mm_loadu_ps(x + i), v[0]);
    float lanes[4];
    _mm_storeu_ps(lanes, _mm_max_ps(_mm_max_ps(v[0], v[1]), _mm_max_ps(v[2], v[3])));
    for (int j = 0; j < 4; j++) m = lanes[j] > m ? lanes[j] : m;
#endif
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* The first index of the greatest value, NaNs never greater (a NaN at 0
 * wins: nothing compares greater). Two passes over the row (a vocabulary's
 * logits, 1 MiB at Qwen3.5's, still in cache from the lm_head): the greatest
 * value, then its first index, sixteen compared at a time. */
int32_t q35_argmax(const float *logits, int32_t n) {
    if (n <= 0 || logits[0] != logits[0]) return 0;
    const float m = q35_row_max(logits, n); /* logits[0] or greater */
    int32_t i = 0;
#ifdef __SSE2__
    const __m128 mv = _mm_set1_ps(m);
    for (; i + 16 <= n; i += 16) {
        int hit = 0;
        for (int k = 0; k < 4; k++) hit |= _mm_movemask_ps(_mm_cmpeq_ps(_mm_loadu_ps(logits + i + 4 * k), mv)) << 4 * k;
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
#endif
    for (; logits[i] != m; i++) {}
    return i;
}


/* ---- replacing one weight (session.h), for `qwen35 eval --sweep` ---- */

typedef struct {
    const char *name;
    q35_tensor *slot;
} weight_lookup;

static q35_status find_slot(void *ctx, const q35_model_tensor *t, q35_error *err) {
    weight_lookup *l = ctx;
    if (t->def->matrix && t->slot && !strcmp(t->name, l->name)) l->slot = t->slot;
    return Q35_OK;
}

/* The slot of matrix `name` in e's weights, or NULL. */
static q35_tensor *weight_slot(const q35_engine *e, const char *name) {
    weight_lookup l = {name, NULL};
    q35_error err = {0};
    unsigned which = Q35_TENSORS_TEXT | (e->w.mtp.present ? Q35_TENSORS_MTP : 0);
    q35_model_tensors_each(&e->cfg, which, (q35_weights *)&e->w, find_slot, &l, &err);
    return l.slot;
}

const q35_tensor *q35_engine_weight(const q35_engine *e, const char *name) { return weight_slot(e, name); }

q35_status q35_engine_set_weight(q35_engine *e, const char *name, const q35_tensor *t, q35_error *err) {
    q35_tensor *slot = weight_slot(e, name);
    if (!slot) return q35_fail(err, Q35_ERR_ARG, "no matrix called '%s' in this model", name);
    if (__atomic_load_n(&e->n_sessions, __ATOMIC_RELAXED))
        return q35_fail(err, Q35_ERR_ARG, "weight '%s': %d session(s) still open", name, e->n_sessions);
    if (e->n_draft) return q35_fail(err, Q35_ERR_ARG, "weight '%s': a reduced draft head is set", name);
    int same = t->ndim == slot->ndim;
    for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == slot->shape[d];
    size_t need = same ? q35_cache_tensor_bytes(t->dtype, t->ndim, t->shape) : 0;
    if (!same || !need || t->nbytes != need || !t->data)
        return q35_fail(err, Q35_ERR_ARG, "weight '%s': the replacement (%s, %zu bytes) does not fit its shape", name,
                        q35_dtype_name(t->dtype), t->nbytes);
    q35_tensor old = *slot;
    int tied = e->cfg.tie_word_embeddings && slot == &e->w.embed;
    *slot = *t;
    slot->name = old.name;
    if (tied) e->w.lm_head = *slot;
    q35_backend *nb = NULL;
    q35_status st = q35_backend_open(e->backend->ops->name, &e->cfg, &e->w, q35_engine_threads(e), &nb, err);
    if (st) { /* the engine keeps its old weights and backend */
        *slot = old;
        if (tied) e->w.lm_head = old;
        return st;
    }
    e->backend->ops->close(e->backend);
    e->backend = nb;
    fill_info(e);
    return Q35_OK;
}

q35_status q35_engine_set_tap(q35_engine *e, q35_matmul_tap tap, void *ctx, q35_error *err) {
    if (!e->backend->ops->set_tap)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the %s backend cannot show its matmul inputs (calibration needs "
                        "the cpu or ref backend)", e->backend->ops->name);
    e->backend->ops->set_tap(e->backend, tap, ctx);
    return Q35_OK;
}
