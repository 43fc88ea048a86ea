/* cpu.c: the host backend's blocks (see cpu.h, backend.h).
 *
 * One forward pass over T rows (pre-norm decoder, HF Qwen3_5 semantics):
 *   begin:    x = embed[tokens]
 *   layer li: xn = rmsnorm1p(x, input_norm); x += mixer(xn)
 *                mixer = Gated DeltaNet (gdn.c) or gated attention (attention.c),
 *                each sequence's rows against its own state
 *             xn = rmsnorm1p(x, post_norm); x += mlp(xn)   (SwiGLU, compute.c)
 *   end:      xn = rmsnorm1p(x, final_norm), the output rows
 *   logits:   lm_head xn
 *
 * The MTP head (vLLM Qwen3_5MultiTokenPredictor semantics): one row pairs a
 * main-model output row h_p with the embedding of the next token x_{p+1},
 * and its output predicts x_{p+2}:
 *   u = fc [rmsnorm1p(E[x_{p+1}]) | rmsnorm1p(h_p)]     (embedding first)
 *   u += attn(rmsnorm1p(u)) at position p, with the MTP layer's own KV cache
 *   u += mlp(rmsnorm1p(u));  d = rmsnorm1p(u, mtp.norm);  logits = draft_head d
 * The embedding is the main model's; the draft head is lm_head or a copy of
 * some of its rows (then logits[i] is the logit of the i-th kept row). A
 * chained draft feeds d back as the hidden state of the next row.
 *
 * Multimodal rows (backend.h q35_bmm): an image row's input is the vision
 * tower's output row instead of an embedding (in the MTP head too, where
 * x_{p+1} is an image row), and its rotary position has three axes. */
#include "backend/cpu/cpu.h"
#include "backend/cpu/vision.h"
#include "base/util.h"

#include <stdlib.h>

static q35_host_backend *host_of(q35_backend *b) { return (q35_host_backend *)b; }

q35_status q35_host_scratch_fit(q35_host_backend *b, int32_t n_ctx, q35_error *err) {
    if (n_ctx <= b->mixer_ctx && b->mixer) return Q35_OK;
    int32_t n_workers = b->host.pool ? q35_pool_size(b->host.pool) : 1;
    size_t mix = q35_gdn_scratch_floats(b->c, Q35_UBATCH, n_workers);
    size_t att = q35_attention_scratch_floats(b->c, Q35_UBATCH, n_ctx, n_workers);
    float *m = malloc((mix > att ? mix : att) * sizeof(float));
    if (!m) return q35_fail(err, Q35_ERR_NOMEM, "out of memory for the scratch of a %d-position context", n_ctx);
    free(b->mixer);
    b->mixer = m;
    b->mixer_ctx = n_ctx;
    return Q35_OK;
}

/* Q35_PROFILE: a pass runs from its begin to the end of its logits (or to
 * its end, without logits). */
static void prof_pass_done(q35_host_backend *b, double t_end) {
    if (!b->prof_t0) return;
    q35_prof_add(b->host.prof, b->prof_pass_rows, NULL, 0, 0);
    q35_prof_add(b->host.prof, b->prof_pass_rows, "pass", 0, t_end - b->prof_t0);
    b->prof_t0 = 0;
}

static void host_begin(q35_backend *base, const q35_bseq *seqs, int32_t n_seqs, const int32_t *tokens, int32_t T) {
    q35_host_backend *b = host_of(base);
    const int32_t H = b->c->hidden_size;
    if (b->host.prof) {
        prof_pass_done(b, b->prof_t_end); /* the last pass had no logits */
        b->host.prof_rows = b->prof_pass_rows = T;
        b->prof_t0 = q35_now_seconds();
    }
    b->seqs = seqs;
    b->n_seqs = n_seqs;
    b->n_rows = T;
    for (int32_t i = 0; i < n_seqs; i++) {
        const q35_bseq *q = &seqs[i];
        for (int32_t t = q->row0; t < q->row0 + q->n_rows; t++) {
            const float *e = q->mm && q->mm->embed ? q->mm->embed[t - q->row0] : NULL;
            if (e) memcpy(b->x + (size_t)t * H, e, sizeof(float) * (size_t)H);
            else b->host.k->get_row(b->x + (size_t)t * H, &b->w->embed, tokens[t]);
        }
    }
}

static void add_rows(float *x, const float *y, int32_t T, int32_t H) {
    for (size_t i = 0; i < (size_t)T * H; i++) x[i] += y[i];
}

/* x += y, then dst = rmsnorm1p(x) (add_norm_rows), or dst = rmsnorm1p(src)
 * (norm_rows), row by row: over the pool for a prompt's rows (each row's
 * arithmetic is the same on any worker), on the calling thread for a few. */
typedef struct {
    float *dst, *x;   /* x: add_norm_rows */
    const float *src; /* y, or norm_rows' input */
    const q35_tensor *w;
    int32_t T, H;
    float eps;
} norm_job;

static void norm_worker(void *p, int ith, int nth) {
    const norm_job *j = p;
    int64_t lo, hi;
    q35_split(j->T, 1, ith, nth, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const size_t at = (size_t)t * (size_t)j->H;
        if (j->x) add_rows(j->x + at, j->src + at, 1, j->H);
        q35_rmsnorm1p_to(j->dst + at, j->x ? j->x + at : j->src + at, j->w, j->H, j->eps);
    }
}

#define NORM_POOL_ROWS 16 /* fewer rows: a handoff costs more than it saves */

static void run_norm(const q35_host *h, norm_job *j) {
    const double t0 = h->prof ? q35_now_seconds() : 0;
    if (j->T < NORM_POOL_ROWS || !h->pool) norm_worker(j, 0, 1);
    else q35_pool_run(h->pool, norm_worker, j);
    if (h->prof) q35_prof_add(h->prof, h->prof_rows, "norms (and residual adds)", 0, q35_now_seconds() - t0);
}

static void add_norm_rows(const q35_host *h, float *dst, float *x, const float *y, const q35_tensor *w, int32_t T,
                          int32_t H, float eps) {
    norm_job j = {dst, x, y, w, T, H, eps};
    run_norm(h, &j);
}

static void norm_rows(const q35_host *h, float *dst, const float *src, const q35_tensor *w, int32_t T, int32_t H,
                      float eps) {
    norm_job j = {dst, NULL, src, w, T, H, eps};
    run_norm(h, &j);
}

static void host_layer(q35_backend *base, int32_t li) {
    q35_host_backend *b = host_of(base);
    const q35_config *c = b->c;
    const q35_layer_weights *l = &b->w->layers[li];
    const int32_t H = c->hidden_size, T = b->n_rows;
    const double t0 = b->host.prof ? q35_now_seconds() : 0;
    norm_rows(&b->host, b->xn, b->x, &l->input_norm, T, H, c->rms_norm_eps);
    if (c->layer_is_full[li]) {
        q35_attn_seg segs[Q35_UBATCH];
        for (int32_t i = 0; i < b->n_seqs; i++) {
            const q35_bseq *q = &b->seqs[i];
            segs[i] = (q35_attn_seg){q->row0, q->n_rows, q->pos0, q->state->k_cache[li], q->state->v_cache[li],
                                     (size_t)q->state->n_ctx * q->state->kv_row_bytes, q->state->kv_q8,
                                     q->mm ? q->mm->rope_delta : 0, q->mm ? q->mm->pos3 : NULL};
        }
        q35_attention_forward(&b->host, c, l, segs, b->n_seqs, b->xn, b->tmp, T, b->mixer_ctx, b->mixer);
    } else {
        q35_gdn_seg segs[Q35_UBATCH];
        for (int32_t i = 0; i < b->n_seqs; i++) {
            const q35_bseq *q = &b->seqs[i];
            q35_bstate *s = q->state;
            q35_gdn_seg g = {q->row0, q->n_rows, s->conv_state[li], s->ssm_state[li], NULL, NULL, 0, q->recurrent};
            if (q->rewindable) { /* slot t mirrors state_block after row t */
                g.rows_conv = s->row_states + (s->conv_state[li] - s->state_block);
                g.rows_ssm = s->row_states + (s->ssm_state[li] - s->state_block);
                g.rows_stride = s->state_floats;
                g.recurrent = 1;
            }
            segs[i] = g;
        }
        q35_gdn_forward(&b->host, c, l, segs, b->n_seqs, b->xn, b->tmp, T, b->mixer);
    }
    add_norm_rows(&b->host, b->xn, b->x, b->tmp, &l->post_norm, T, H, c->rms_norm_eps);
    q35_mlp(&b->host, b->tmp, b->mlp_gate, b->mlp_up, &l->gate_proj, &l->up_proj, &l->down_proj, b->xn, T);
    add_rows(b->x, b->tmp, T, H);
    if (b->host.prof)
        q35_prof_add(b->host.prof, T, c->layer_is_full[li] ? "(whole attention layers)" : "(whole GDN layers)", 0,
                     q35_now_seconds() - t0);
}

static void host_end(q35_backend *base) {
    q35_host_backend *b = host_of(base);
    norm_rows(&b->host, b->xn, b->x, &b->w->final_norm, b->n_rows, b->c->hidden_size, b->c->rms_norm_eps);
    b->seqs = NULL;
    if (b->host.prof) b->prof_t_end = q35_now_seconds();
}

static void host_logits(q35_backend *base, int32_t row0, int32_t n, float *out) {
    q35_host_backend *b = host_of(base);
    b->host.prof_label = "lm_head"; /* also where it is the embedding, tied */
    q35_matmul(&b->host, out, &b->w->lm_head, b->xn + (size_t)row0 * b->c->hidden_size, n);
    b->host.prof_label = NULL;
    if (b->host.prof) prof_pass_done(b, q35_now_seconds());
}

static void host_keep_rows(q35_backend *base, q35_bstate *st, int32_t row0, int32_t n) {
    q35_host_backend *b = host_of(base);
    const size_t H = (size_t)b->c->hidden_size;
    memcpy(st->kept, b->xn + (size_t)row0 * H, sizeof(float) * H * (size_t)n);
}

static void host_mtp(q35_backend *base, q35_bstate *s, q35_mtp_src src, int32_t row0, const int32_t *next, int32_t n,
                     int32_t pos0, const q35_bmm *mm, float *logits) {
    q35_host_backend *b = host_of(base);
    const q35_config *c = b->c;
    const q35_mtp_weights *m = &b->w->mtp;
    const int32_t H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    const float *hidden = src == Q35_MTP_FROM_FORWARD ? b->xn : src == Q35_MTP_FROM_KEPT ? s->kept : s->draft_hidden;
    hidden += (size_t)row0 * H;
    float *cat = b->mtp_cat, *u = b->mtp_x, *un = b->mtp_xn;
    double t0 = 0;
    if (b->host.prof) { /* the MTP head's own table */
        prof_pass_done(b, b->prof_t_end);
        b->host.prof_rows = Q35_PROF_MTP + n;
        t0 = q35_now_seconds();
    }
    for (int32_t i = 0; i < n; i++) {
        float *row = cat + (size_t)i * 2 * H;
        const float *e = mm && mm->embed ? mm->embed[i] : NULL;
        if (e) memcpy(row, e, sizeof(float) * (size_t)H);
        else b->host.k->get_row(row, &b->w->embed, next[i]);
        q35_rmsnorm1p(row, &m->pre_fc_norm_embedding, H, eps);
        q35_rmsnorm1p_to(row + H, hidden + (size_t)i * H, &m->pre_fc_norm_hidden, H, eps);
    }
    q35_matmul(&b->host, u, &m->fc, cat, n);
    norm_rows(&b->host, un, u, &m->layer.input_norm, n, H, eps);
    /* cat is free again: it holds the blocks' outputs (n, H) */
    q35_attn_seg seg = {0, n, pos0, s->mtp_k_cache, s->mtp_v_cache, (size_t)s->n_ctx * s->kv_row_bytes, s->kv_q8,
                        mm ? mm->rope_delta : 0, mm ? mm->pos3 : NULL};
    q35_attention_forward(&b->host, c, &m->layer, &seg, 1, un, cat, n, b->mixer_ctx, b->mixer);
    add_norm_rows(&b->host, un, u, cat, &m->layer.post_norm, n, H, eps);
    q35_mlp(&b->host, cat, b->mlp_gate, b->mlp_up, &m->layer.gate_proj, &m->layer.up_proj, &m->layer.down_proj, un, n);
    add_rows(u, cat, n, H);
    if (logits) {
        q35_rmsnorm1p_to(s->draft_hidden, u + (size_t)(n - 1) * H, &m->norm, H, eps);
        b->host.prof_label = "mtp draft head";
        q35_matmul(&b->host, logits, b->draft_head, s->draft_hidden, 1);
        b->host.prof_label = NULL;
    }
    if (b->host.prof) {
        q35_prof_add(b->host.prof, Q35_PROF_MTP + n, NULL, 0, 0);
        q35_prof_add(b->host.prof, Q35_PROF_MTP + n, "pass", 0, q35_now_seconds() - t0);
    }
}

static q35_status host_set_kv_cache(q35_backend *base, int32_t kv_cache, q35_error *err) {
    if (kv_cache != Q35_KV_F32 && kv_cache != Q35_KV_Q8)
        return q35_fail(err, Q35_ERR_ARG, "unknown KV cache format %d", kv_cache);
    host_of(base)->kv_cache = kv_cache;
    return Q35_OK;
}

static q35_status host_set_draft_head(q35_backend *base, const q35_tensor *head, q35_error *err) {
    q35_host_backend *b = host_of(base);
    b->draft_head = head ? head : &b->w->lm_head;
    return Q35_OK;
}

static q35_status host_encode_images(q35_backend *base, const float *pixel_values, int32_t n_images,
                                     const int32_t (*grid_thw)[3], float *out, q35_error *err) {
    q35_host_backend *b = host_of(base);
    if (!b->c->vision.present || !b->w->vision.present)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the model has no vision tower (model.visual.* weights): it takes no images");
    if (b->c->vision.out_hidden_size != b->c->hidden_size)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "vision out_hidden_size %d is not the language model's width %d",
                        b->c->vision.out_hidden_size, b->c->hidden_size);
    if (!b->host.prof)
        return q35_vision_forward(&b->host, &b->c->vision, &b->w->vision, pixel_values, n_images, grid_thw, out, err);
    prof_pass_done(b, b->prof_t_end); /* the vision tower's own table, by images */
    b->host.prof_rows = Q35_PROF_VISION + n_images;
    const double t0 = q35_now_seconds();
    q35_status st = q35_vision_forward(&b->host, &b->c->vision, &b->w->vision, pixel_values, n_images, grid_thw, out, err);
    q35_prof_add(b->host.prof, Q35_PROF_VISION + n_images, NULL, 0, 0);
    q35_prof_add(b->host.prof, Q35_PROF_VISION + n_images, "pass", 0, q35_now_seconds() - t0);
    return st;
}

static void host_set_tap(q35_backend *base, q35_matmul_tap tap, void *ctx) {
    q35_host_backend *b = host_of(base);
    b->host.tap = tap;
    b->host.tap_ctx = ctx;
}

static q35_status host_status(q35_backend *base, q35_error *err) {
    (void)base; (void)err;
    return Q35_OK; /* host operations cannot fail once the state exists */
}

static const char *host_kernels(const q35_backend *base, const char **note) {
    const q35_host_backend *b = (const q35_host_backend *)base;
    if (note) *note = b->host.k == q35_kernels_get() ? q35_kernels_note() : NULL;
    return b->host.k->name;
}

static int32_t host_threads(const q35_backend *base) {
    const q35_host_backend *b = (const q35_host_backend *)base;
    return b->host.pool ? q35_pool_size(b->host.pool) : 1;
}

static void host_close(q35_backend *base) {
    q35_host_backend *b = host_of(base);
    if (!b) return;
    if (b->host.prof) {
        prof_pass_done(b, b->prof_t_end);
        q35_prof_close(b->host.prof, stderr);
    }
    q35_pool_free(b->host.pool);
    free(b->x); free(b->xn); free(b->tmp); free(b->mlp_gate); free(b->mlp_up); free(b->mixer);
    free(b->mtp_x); free(b->mtp_xn); free(b->mtp_cat);
    free(b);
}

static const q35_backend_ops host_ops = {
    .close = host_close,
    .kernels = host_kernels,
    .threads = host_threads,
    .state_new = q35_host_state_new,
    .state_free = q35_host_state_free,
    .state_clear = q35_host_state_clear,
    .state_fill = q35_host_state_fill,
    .state_set_spec = q35_host_state_set_spec,
    .state_rewind = q35_host_state_rewind,
    .snapshot_take = q35_host_snapshot_take,
    .snapshot_restore = q35_host_snapshot_restore,
    .snapshot_free = q35_host_snapshot_free,
    .begin = host_begin,
    .layer = host_layer,
    .end = host_end,
    .logits = host_logits,
    .keep_rows = host_keep_rows,
    .mtp = host_mtp,
    .set_draft_head = host_set_draft_head,
    .set_kv_cache = host_set_kv_cache,
    .encode_images = host_encode_images,
    .set_tap = host_set_tap,
    .status = host_status,
};

q35_status q35_host_backend_open(const char *name, const q35_kernels *k, int32_t n_threads, const q35_config *c,
                                 const q35_weights *w, q35_backend **out, q35_error *err) {
    *out = NULL;
    q35_host_backend *b = calloc(1, sizeof *b);
    if (!b) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    b->ops = host_ops;
    b->ops.name = name;
    b->base.ops = &b->ops;
    b->host.k = k;
    b->c = c;
    b->w = w;
    b->draft_head = &w->lm_head;
    b->host.prof = q35_prof_open();
    q35_status st = n_threads == 1 ? Q35_OK : q35_pool_new(n_threads, &b->host.pool, err);
    size_t U = Q35_UBATCH, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    if (!st) {
        b->x = malloc(U * H * sizeof(float));
        b->xn = malloc(U * H * sizeof(float));
        b->tmp = malloc(U * H * sizeof(float));
        b->mlp_gate = malloc(U * I * sizeof(float));
        b->mlp_up = malloc(U * I * sizeof(float));
        int ok = b->x && b->xn && b->tmp && b->mlp_gate && b->mlp_up;
        if (ok && w->mtp.present) {
            b->mtp_x = malloc(U * H * sizeof(float));
            b->mtp_xn = malloc(U * H * sizeof(float));
            b->mtp_cat = malloc(U * 2 * H * sizeof(float));
            ok = b->mtp_x && b->mtp_xn && b->mtp_cat;
        }
        if (!ok) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory for the %s backend's scratch", name);
    }
    if (!st) st = q35_host_scratch_fit(b, 1, err);
    if (st) {
        host_close(&b->base);
        return st;
    }
    *out = &b->base;
    return Q35_OK;
}

q35_status q35_backend_cpu_open(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                                q35_error *err) {
    const q35_kernels *k = NULL;
    q35_status st = q35_kernels_init(&k, err); /* Q35_KERNELS may force a table */
    if (st) return st;
    return q35_host_backend_open("cpu", k, n_threads, c, w, out, err);
}
