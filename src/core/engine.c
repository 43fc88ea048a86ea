/* engine.c: the public API (qwen35.h) and the model's forward pass.
 *
 * q35_engine owns the mapped checkpoint and the bound weights; it is never
 * written after load. q35_session owns one sequence's state (GDN conv and
 * recurrent states, attention KV caches) and all scratch memory, sized at
 * creation so that evaluation allocates nothing.
 *
 * Forward of one micro-batch of T tokens (pre-norm decoder):
 *   x = embed[tokens]
 *   per layer: x += mixer(rmsnorm1p(x)); x += mlp(rmsnorm1p(x))
 *              mixer = Gated DeltaNet (gdn.c) or gated attention (attention.c)
 *   hidden = rmsnorm1p(x, final norm); logits = lm_head hidden */
#include "backend/cpu/attention.h"
#include "formats/cache.h"
#include "backend/cpu/gdn.h"
#include "backend/cpu/compute.h"
#include "backend/cpu/kernels/kernels.h"
#include "model/model.h"
#include "formats/safetensors.h"
#include "core/session.h"

#include <math.h>
#include <stdlib.h>

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
    in->file_bytes = file_bytes(&e->ck);
    in->weights_copied = e->ck.n_files > 0 && e->ck.files[0].map.copied; /* all files alike */
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
    const q35_kernels *kern = NULL;
    if (!st) st = q35_kernels_init(&kern, err); /* Q35_KERNELS may force a table */
    if (!st) st = q35_pool_new(params ? params->n_threads : 0, &e->pool, err);
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
    q35_pool_free(e->pool);
    free(e->batch_logits);
    q35_spec_free_draft_head(e);
    q35_checkpoint_close(&e->ck);
    free(e);
}

const q35_model_info *q35_engine_info(const q35_engine *e) { return &e->info; }

const char *q35_engine_kernels(const q35_engine *e, const char **note) {
    (void)e;
    if (note) *note = q35_kernels_note();
    return q35_kernels_get()->name;
}

int32_t q35_engine_threads(const q35_engine *e) { return q35_pool_size(e->pool); }

q35_status q35_session_new(q35_engine *e, int32_t n_ctx, q35_session **out, q35_error *err) {
    *out = NULL;
    const q35_config *c = &e->cfg;
    if (n_ctx <= 0 || n_ctx > c->max_position_embeddings) n_ctx = c->max_position_embeddings;
    q35_session *s = calloc(1, sizeof *s);
    if (!s) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    s->engine = e;
    s->n_ctx = n_ctx;
    size_t conv = (size_t)q35_conv_dim(c) * (size_t)(c->lin_conv_kernel - 1);
    size_t ssm = (size_t)c->lin_n_head_v * (size_t)c->lin_head_k_dim * (size_t)c->lin_head_v_dim;
    size_t kv = (size_t)n_ctx * (size_t)c->n_head_kv * (size_t)c->head_dim;
    int32_t n_gdn = c->n_layer - c->n_layer_full;
    s->state_floats = (size_t)n_gdn * (conv + ssm);
    s->state_block = calloc(s->state_floats ? s->state_floats : 1, sizeof(float));
    int ok = s->state_block != NULL;
    float *p = s->state_block;
    for (int32_t i = 0; ok && i < c->n_layer; i++) {
        if (c->layer_is_full[i]) {
            /* calloc of a large block maps zero pages lazily: only used positions cost memory */
            s->k_cache[i] = calloc(kv, sizeof(float));
            s->v_cache[i] = calloc(kv, sizeof(float));
            ok = s->k_cache[i] && s->v_cache[i];
        } else {
            s->conv_state[i] = p; p += conv;
            s->ssm_state[i] = p; p += ssm;
        }
    }
    size_t U = Q35_UBATCH, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    int32_t n_workers = q35_pool_size(e->pool);
    size_t mix = q35_gdn_scratch_floats(c, Q35_UBATCH, n_workers);
    size_t att = q35_attention_scratch_floats(c, Q35_UBATCH, n_ctx, n_workers);
    if (att > mix) mix = att;
    if (ok) {
        s->x = malloc(U * H * sizeof(float));
        s->xn = malloc(U * H * sizeof(float));
        s->tmp = malloc(U * H * sizeof(float));
        s->mlp_gate = malloc(U * I * sizeof(float));
        s->mlp_up = malloc(U * I * sizeof(float));
        s->mixer_scratch = malloc(mix * sizeof(float));
        s->spec_logits = malloc((Q35_SPEC_MAX + 1) * (size_t)c->vocab_size * sizeof(float));
        s->target_probs = malloc((size_t)c->vocab_size * sizeof(float));
        s->hist = malloc((size_t)n_ctx * sizeof(int32_t));
        ok = s->x && s->xn && s->tmp && s->mlp_gate && s->mlp_up && s->mixer_scratch && s->spec_logits && s->target_probs &&
             s->hist;
    }
    if (!ok) {
        q35_session_free(s);
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory creating a session of %d positions", n_ctx);
    }
    *out = s;
    return Q35_OK;
}

void q35_session_free(q35_session *s) {
    if (!s) return;
    for (int32_t i = 0; i < Q35_MAX_LAYERS; i++) { free(s->k_cache[i]); free(s->v_cache[i]); }
    free(s->state_block);
    free(s->x); free(s->xn); free(s->tmp); free(s->mlp_gate); free(s->mlp_up); free(s->mixer_scratch);
    free(s->mtp_k_cache); free(s->mtp_v_cache); free(s->mtp_x); free(s->mtp_xn); free(s->mtp_cat);
    free(s->pending_hidden); free(s->draft_hidden); free(s->ckpt); free(s->hist);
    q35_spec_free_buffers(s);
    free(s);
}

void q35_session_reset(q35_session *s) {
    memset(s->state_block, 0, s->state_floats * sizeof(float));
    s->pos = 0; /* KV rows past pos are never read, so they need no clearing */
    s->n_pending = 0;
    s->ckpt_rows = 0;
    s->n_hist = 0;
}

int32_t q35_session_pos(const q35_session *s) { return s->pos; }
int32_t q35_session_ctx(const q35_session *s) { return s->n_ctx; }

int32_t q35_argmax(const float *logits, int32_t n) {
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = i;
    return best;
}

void q35_mlp_forward(const q35_config *c, const q35_layer_weights *l, const float *xn, float *out, float *gate,
                     float *up, int32_t T, q35_pool *pool) {
    q35_matmul_swiglu(pool, gate, gate, up, &l->gate_proj, &l->up_proj, xn, T);
    q35_matmul(pool, out, &l->down_proj, gate, T);
}

/* The rows of one forward pass that belong to one session. */
typedef struct {
    q35_session *s;
    int32_t row0, n_rows;
    int recurrent, checkpoint;
} seq_rows;

/* One forward pass over T <= Q35_UBATCH rows drawn from one or more
 * sessions (each at its own position, with its own states); the matmuls run
 * once over all rows. Scratch comes from `own`. Leaves the post-norm hidden
 * states in own->xn and advances each session's position. */
static void forward_rows(q35_session *own, const seq_rows *seqs, int32_t n_seqs, const int32_t *tokens, int32_t T) {
    const q35_engine *e = own->engine;
    const q35_config *c = &e->cfg;
    const int32_t H = c->hidden_size;
    q35_gdn_seg gsegs[Q35_UBATCH];
    q35_attn_seg asegs[Q35_UBATCH];
    const q35_kernels *kern = q35_kernels_get();
    for (int32_t t = 0; t < T; t++) kern->get_row(own->x + (size_t)t * H, &e->w.embed, tokens[t]);
    for (int32_t li = 0; li < c->n_layer; li++) {
        const q35_layer_weights *l = &e->w.layers[li];
        for (int32_t t = 0; t < T; t++)
            q35_rmsnorm1p_to(own->xn + (size_t)t * H, own->x + (size_t)t * H, &l->input_norm, H, c->rms_norm_eps);
        if (c->layer_is_full[li]) {
            for (int32_t i = 0; i < n_seqs; i++) {
                q35_session *s = seqs[i].s;
                asegs[i] = (q35_attn_seg){seqs[i].row0, seqs[i].n_rows, s->pos, s->k_cache[li], s->v_cache[li]};
            }
            q35_attention_forward(c, l, asegs, n_seqs, own->xn, own->tmp, T, own->n_ctx, own->mixer_scratch, e->pool);
        } else {
            for (int32_t i = 0; i < n_seqs; i++) {
                q35_session *s = seqs[i].s;
                q35_gdn_seg g = {seqs[i].row0, seqs[i].n_rows, s->conv_state[li], s->ssm_state[li], NULL, NULL, 0,
                                 seqs[i].recurrent || seqs[i].n_rows < Q35_GDN_MIN_CHUNKED};
                if (seqs[i].checkpoint) { /* slot t mirrors state_block after row t */
                    g.ckpt_conv = s->ckpt + (s->conv_state[li] - s->state_block);
                    g.ckpt_ssm = s->ckpt + (s->ssm_state[li] - s->state_block);
                    g.ckpt_stride = s->state_floats;
                    g.recurrent = 1;
                }
                gsegs[i] = g;
            }
            q35_gdn_forward(c, l, gsegs, n_seqs, own->xn, own->tmp, T, own->mixer_scratch, e->pool);
        }
        for (size_t i = 0; i < (size_t)T * H; i++) own->x[i] += own->tmp[i];
        for (int32_t t = 0; t < T; t++)
            q35_rmsnorm1p_to(own->xn + (size_t)t * H, own->x + (size_t)t * H, &l->post_norm, H, c->rms_norm_eps);
        q35_mlp_forward(c, l, own->xn, own->tmp, own->mlp_gate, own->mlp_up, T, e->pool);
        for (size_t i = 0; i < (size_t)T * H; i++) own->x[i] += own->tmp[i];
    }
    for (int32_t t = 0; t < T; t++)
        q35_rmsnorm1p_to(own->xn + (size_t)t * H, own->x + (size_t)t * H, &e->w.final_norm, H, c->rms_norm_eps);
    for (int32_t i = 0; i < n_seqs; i++) seqs[i].s->pos += seqs[i].n_rows;
}

/* After a forward pass over T rows of session s (post-norm hidden states in
 * hidden, input tokens in tokens, first at pos0): rows whose next token is
 * known go through the MTP now, filling its KV cache, and the rest wait for
 * it. A checkpointed (verify) batch keeps all rows pending, and its rows
 * become rewindable, until the caller knows which survive. */
static void commit_rows(q35_session *s, const float *hidden, const int32_t *tokens, int32_t T, int32_t pos0,
                        int checkpoint) {
    const size_t H = (size_t)s->engine->cfg.hidden_size;
    q35_hist_note(s, tokens, T, pos0);
    s->ckpt_rows = checkpoint ? T : 0;
    s->ckpt_pos0 = pos0;
    if (!s->mtp_on) return;
    int32_t n_now = checkpoint ? 0 : T - 1;
    if (n_now > 0) q35_mtp_rows(s, hidden, tokens + 1, n_now, pos0, NULL);
    s->n_pending = T - n_now;
    s->pending_pos0 = pos0 + n_now;
    memcpy(s->pending_hidden, hidden + (size_t)n_now * H, sizeof(float) * H * (size_t)s->n_pending);
    memcpy(s->pending_tok, tokens + n_now, sizeof(int32_t) * (size_t)s->n_pending);
}

q35_status q35_session_eval(q35_session *s, const int32_t *tokens, int32_t n, float *logits, int flags, q35_error *err) {
    const q35_config *c = &s->engine->cfg;
    if (n <= 0 || !tokens) return q35_fail(err, Q35_ERR_ARG, "no tokens to evaluate");
    if (n > s->n_ctx - s->pos)
        return q35_fail(err, Q35_ERR_CONTEXT, "%d tokens do not fit: position %d of a %d-token context", n, s->pos,
                        s->n_ctx);
    for (int32_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= c->vocab_size)
            return q35_fail(err, Q35_ERR_ARG, "token id %d at index %d is outside the vocabulary [0, %d)", tokens[i], i,
                            c->vocab_size);
    const int checkpoint = (flags & Q35_EVAL_CHECKPOINT) != 0;
    if (checkpoint && (!s->spec_k || n > s->spec_k + 1))
        return q35_fail(err, Q35_ERR_ARG, "a checkpointed eval takes at most spec_k+1 = %d tokens (got %d)",
                        s->spec_k + 1, n);
    const int32_t H = c->hidden_size, V = c->vocab_size;
    for (int32_t done = 0; done < n;) {
        int32_t T = n - done < Q35_UBATCH ? n - done : Q35_UBATCH;
        int32_t pos0 = s->pos;
        /* rows left pending by the previous call learn their next token now */
        if (s->mtp_on && s->n_pending) q35_mtp_flush(s, tokens[done], NULL);
        seq_rows one = {s, 0, T, (flags & Q35_EVAL_RECURRENT) != 0, checkpoint};
        forward_rows(s, &one, 1, tokens + done, T);
        if (logits && (flags & Q35_EVAL_ALL_LOGITS))
            q35_matmul(s->engine->pool, logits + (size_t)done * V, &s->engine->w.lm_head, s->xn, T);
        else if (logits && done + T == n)
            q35_matmul(s->engine->pool, logits, &s->engine->w.lm_head, s->xn + (size_t)(T - 1) * H, 1);
        commit_rows(s, s->xn, tokens + done, T, pos0, checkpoint);
        done += T;
    }
    return Q35_OK;
}

q35_status q35_session_rewind(q35_session *s, int32_t n_keep, q35_error *err) {
    if (!s->ckpt_rows) return q35_fail(err, Q35_ERR_ARG, "nothing to rewind: the last eval was not checkpointed");
    if (n_keep < 1 || n_keep > s->ckpt_rows)
        return q35_fail(err, Q35_ERR_ARG, "cannot keep %d rows of a %d-row eval", n_keep, s->ckpt_rows);
    if (n_keep < s->ckpt_rows)
        memcpy(s->state_block, s->ckpt + (size_t)(n_keep - 1) * s->state_floats, s->state_floats * sizeof(float));
    /* attention rows past the new end are overwritten before they are ever read */
    s->pos = s->ckpt_pos0 + n_keep;
    if (s->mtp_on && s->n_pending > n_keep) s->n_pending = n_keep;
    s->ckpt_rows = 0;
    q35_hist_cut(s);
    return Q35_OK;
}

q35_status q35_forward_sessions(q35_session *const *ss, const int32_t *const *tokens, const int32_t *counts,
                                const int *checkpoint, int32_t n, float *logits, q35_error *err) {
    if (n <= 0 || !ss || !tokens) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    const q35_engine *e = ss[0]->engine;
    const q35_config *c = &e->cfg;
    q35_session *own = ss[0]; /* the scratch of the session with the largest context fits every row */
    int32_t total = 0;
    for (int32_t i = 0; i < n; i++) {
        q35_session *s = ss[i];
        if (s->engine != e) return q35_fail(err, Q35_ERR_ARG, "batch row %d uses another engine", i);
        for (int32_t j = 0; j < i; j++)
            if (ss[j] == s) return q35_fail(err, Q35_ERR_ARG, "session repeated in batch rows %d and %d", j, i);
        if (counts[i] < 1 || counts[i] > s->n_ctx - s->pos)
            return q35_fail(err, Q35_ERR_CONTEXT, "batch row %d: %d tokens do not fit: position %d of a %d-token context",
                            i, counts[i], s->pos, s->n_ctx);
        if (checkpoint[i] && (!s->spec_k || counts[i] > s->spec_k + 1))
            return q35_fail(err, Q35_ERR_ARG, "batch row %d: a checkpointed eval takes at most spec_k+1 tokens", i);
        for (int32_t t = 0; t < counts[i]; t++)
            if (tokens[i][t] < 0 || tokens[i][t] >= c->vocab_size)
                return q35_fail(err, Q35_ERR_ARG, "batch row %d: token id %d is outside the vocabulary", i, tokens[i][t]);
        if (s->n_ctx > own->n_ctx) own = s;
        total += counts[i];
    }
    if (total > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a batch holds at most %d rows (got %d)", Q35_UBATCH, total);
    const size_t H = (size_t)c->hidden_size;
    seq_rows seqs[Q35_UBATCH] = {{0}};
    int32_t flat[Q35_UBATCH] = {0}, pos0[Q35_UBATCH] = {0}, row = 0;
    for (int32_t i = 0; i < n; i++) {
        q35_session *s = ss[i];
        if (s->mtp_on && s->n_pending) q35_mtp_flush(s, tokens[i][0], NULL);
        seqs[i] = (seq_rows){s, row, counts[i], 0, checkpoint[i]};
        memcpy(flat + row, tokens[i], sizeof(int32_t) * (size_t)counts[i]);
        pos0[i] = s->pos;
        row += counts[i];
    }
    forward_rows(own, seqs, n, flat, total);
    if (logits) q35_matmul(e->pool, logits, &e->w.lm_head, own->xn, total);
    for (int32_t i = 0; i < n; i++)
        commit_rows(ss[i], own->xn + (size_t)seqs[i].row0 * H, tokens[i], counts[i], pos0[i], checkpoint[i]);
    return Q35_OK;
}

q35_status q35_batch_decode(q35_session *const *sessions, const int32_t *tokens, int32_t n, float *logits,
                            q35_error *err) {
    if (n <= 0 || !sessions || !tokens) return q35_fail(err, Q35_ERR_ARG, "empty batch");
    if (n > Q35_UBATCH) return q35_fail(err, Q35_ERR_ARG, "a batch holds at most %d sessions (got %d)", Q35_UBATCH, n);
    const int32_t *toks[Q35_UBATCH];
    int32_t counts[Q35_UBATCH];
    int ckpt[Q35_UBATCH];
    for (int32_t i = 0; i < n; i++) { toks[i] = &tokens[i]; counts[i] = 1; ckpt[i] = 0; }
    return q35_forward_sessions(sessions, toks, counts, ckpt, n, logits, err);
}

struct q35_snapshot {
    const q35_engine *engine;
    int32_t pos;
    float *state;   /* copy of the session's GDN states (state_floats) */
    float *kv;      /* per full layer: K rows 0..pos-1, then V rows 0..pos-1 */
    /* the MTP's part, when the session had it on: its KV rows 0..pos-1 (K
     * then V) and the rows still waiting for their next token */
    float *mtp_kv;
    int32_t n_pending, pending_pos0;
    int32_t pending_tok[Q35_SPEC_MAX + 1];
    float *pending_hidden;
    int32_t *tokens; /* the session's token ids 0..pos-1; NULL: not known */
    size_t bytes;
};

static size_t kv_row_floats(const q35_config *c) { return (size_t)c->n_head_kv * (size_t)c->head_dim; }

q35_status q35_snapshot_take(const q35_session *s, q35_snapshot **out, q35_error *err) {
    *out = NULL;
    const q35_config *c = &s->engine->cfg;
    size_t rows = (size_t)s->pos * kv_row_floats(c), H = (size_t)c->hidden_size;
    size_t kv_floats = (size_t)c->n_layer_full * 2 * rows;
    q35_snapshot *snap = calloc(1, sizeof *snap);
    if (!snap) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    snap->engine = s->engine;
    snap->pos = s->pos;
    snap->state = malloc((s->state_floats ? s->state_floats : 1) * sizeof(float));
    snap->kv = malloc((kv_floats ? kv_floats : 1) * sizeof(float));
    int ok = snap->state && snap->kv;
    if (ok && s->mtp_on) {
        snap->mtp_kv = malloc((rows ? 2 * rows : 1) * sizeof(float));
        snap->pending_hidden = malloc((size_t)(Q35_SPEC_MAX + 1) * H * sizeof(float));
        ok = snap->mtp_kv && snap->pending_hidden;
    }
    if (!ok) {
        q35_snapshot_free(snap);
        return q35_fail(err, Q35_ERR_NOMEM, "out of memory for a snapshot of %d positions", s->pos);
    }
    if (s->n_hist == s->pos && (snap->tokens = malloc(((size_t)s->pos + 1) * sizeof(int32_t))))
        memcpy(snap->tokens, s->hist, (size_t)s->pos * sizeof(int32_t));
    memcpy(snap->state, s->state_block, s->state_floats * sizeof(float));
    float *p = snap->kv;
    for (int32_t i = 0; i < c->n_layer; i++) {
        if (!c->layer_is_full[i]) continue;
        memcpy(p, s->k_cache[i], rows * sizeof(float)); p += rows;
        memcpy(p, s->v_cache[i], rows * sizeof(float)); p += rows;
    }
    snap->bytes = (s->state_floats + kv_floats) * sizeof(float) + (snap->tokens ? (size_t)s->pos * sizeof(int32_t) : 0);
    if (s->mtp_on) {
        memcpy(snap->mtp_kv, s->mtp_k_cache, rows * sizeof(float));
        memcpy(snap->mtp_kv + rows, s->mtp_v_cache, rows * sizeof(float));
        snap->n_pending = s->n_pending;
        snap->pending_pos0 = s->pending_pos0;
        memcpy(snap->pending_tok, s->pending_tok, sizeof snap->pending_tok);
        memcpy(snap->pending_hidden, s->pending_hidden, (size_t)s->n_pending * H * sizeof(float));
        snap->bytes += (2 * rows + (size_t)s->n_pending * H) * sizeof(float);
    }
    *out = snap;
    return Q35_OK;
}

q35_status q35_snapshot_restore(q35_session *s, const q35_snapshot *snap, q35_error *err) {
    const q35_config *c = &s->engine->cfg;
    if (snap->engine != s->engine) return q35_fail(err, Q35_ERR_ARG, "snapshot belongs to another engine");
    if (snap->pos > s->n_ctx)
        return q35_fail(err, Q35_ERR_CONTEXT, "snapshot of %d positions does not fit a %d-token context", snap->pos, s->n_ctx);
    memcpy(s->state_block, snap->state, s->state_floats * sizeof(float));
    size_t rows = (size_t)snap->pos * kv_row_floats(c);
    const float *p = snap->kv;
    for (int32_t i = 0; i < c->n_layer; i++) {
        if (!c->layer_is_full[i]) continue;
        memcpy(s->k_cache[i], p, rows * sizeof(float)); p += rows;
        memcpy(s->v_cache[i], p, rows * sizeof(float)); p += rows;
    }
    s->pos = snap->pos;
    s->n_hist = snap->tokens ? snap->pos : -1;
    if (snap->tokens) memcpy(s->hist, snap->tokens, (size_t)snap->pos * sizeof(int32_t));
    s->ckpt_rows = 0;
    s->n_pending = 0; /* without the MTP's part, drafting resumes after the next eval */
    if (s->mtp_on && snap->mtp_kv) {
        memcpy(s->mtp_k_cache, snap->mtp_kv, rows * sizeof(float));
        memcpy(s->mtp_v_cache, snap->mtp_kv + rows, rows * sizeof(float));
        s->n_pending = snap->n_pending;
        s->pending_pos0 = snap->pending_pos0;
        memcpy(s->pending_tok, snap->pending_tok, sizeof s->pending_tok);
        memcpy(s->pending_hidden, snap->pending_hidden, (size_t)snap->n_pending * (size_t)c->hidden_size * sizeof(float));
    }
    return Q35_OK;
}

int32_t q35_snapshot_pos(const q35_snapshot *snap) { return snap->pos; }
size_t q35_snapshot_bytes(const q35_snapshot *snap) { return snap->bytes; }
const int32_t *q35_snapshot_tokens(const q35_snapshot *snap, int32_t *n) {
    if (n) *n = snap->tokens ? snap->pos : 0;
    return snap->tokens;
}

void q35_snapshot_free(q35_snapshot *snap) {
    if (!snap) return;
    free(snap->state);
    free(snap->kv);
    free(snap->mtp_kv);
    free(snap->pending_hidden);
    free(snap->tokens);
    free(snap);
}
