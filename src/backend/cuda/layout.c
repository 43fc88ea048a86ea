/* layout.c: the CUDA backend's host-side layout arithmetic (layout.h). */
#include "backend/cuda/layout.h"
#include "backend/cuda/matvec.h"
#include "formats/bfp.h"
#include "base/util.h"

#include <pthread.h>
#include <stdlib.h>

static size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }

q35_status q35_cuda_mat_layout_of(const q35_tensor *t, q35_cuda_mat_layout *L, q35_error *err) {
    memset(L, 0, sizeof *L);
    if (t->ndim < 1 || t->ndim > 2)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: %d dimensions, the CUDA backend takes 1 or 2", t->name, t->ndim);
    L->dtype = t->dtype;
    L->n_out = t->ndim == 2 ? t->shape[0] : 1;
    L->n_in = t->shape[t->ndim - 1];
    const size_t n_in = (size_t)L->n_in, n_out = (size_t)L->n_out;
    switch (t->dtype) {
    case Q35_DT_F32:
    case Q35_DT_F16:
    case Q35_DT_BF16:
    case Q35_DT_BFP8:
    case Q35_DT_BFP4: break;
    default:
        return q35_fail(err, Q35_ERR_FORMAT, "%s: dtype %d is not supported by the CUDA backend", t->name,
                        (int)t->dtype);
    }
    const int bfp = q35_dtype_is_block(t->dtype);
    if (n_in % (bfp ? Q35_BFP_BLOCK : 4))
        return q35_fail(err, Q35_ERR_FORMAT, "%s: %zu inputs, not a multiple of %d", t->name, n_in, bfp ? Q35_BFP_BLOCK : 4);
    const size_t win = 32 * (size_t)q35_cu_vals(t->dtype), windows = (n_in + win - 1) / win;
    L->pitch = windows * Q35_CU_WINDOW_BYTES;
    L->bytes = L->pitch * n_out;
    if (bfp) {
        L->exp_pitch = windows * (win / Q35_BFP_BLOCK);
        L->exp_offset = round_up(L->bytes, 256);
        L->bytes = L->exp_offset + L->exp_pitch * n_out;
    }
    return Q35_OK;
}

void q35_cuda_mat_pack_rows(const q35_tensor *t, const q35_cuda_mat_layout *L, int64_t r0, int64_t r1, void *codes,
                            void *exps) {
    const int64_t n_in = L->n_in;
    memset(codes, 0, (size_t)(r1 - r0) * L->pitch);
    if (!q35_dtype_is_block(L->dtype)) { /* groups of 4 values move whole */
        const size_t eb = L->dtype == Q35_DT_F32 ? 4 : 2, row = (size_t)n_in * eb;
        for (int64_t r = r0; r < r1; r++) {
            const uint8_t *src = (const uint8_t *)t->data + (size_t)r * row;
            uint8_t *dst = (uint8_t *)codes + (size_t)(r - r0) * L->pitch;
            for (int64_t i = 0; i < n_in; i += 4) {
                int k;
                size_t at = q35_cu_chunk_of(L->dtype, i, &k);
                memcpy(dst + at + (size_t)k * eb, src + (size_t)i * eb, 4 * eb);
            }
        }
        return;
    }
    memset(exps, 0, (size_t)(r1 - r0) * L->exp_pitch);
    const int bfp8 = L->dtype == Q35_DT_BFP8;
    for (int64_t r = r0; r < r1; r++) {
        uint8_t *dst = (uint8_t *)codes + (size_t)(r - r0) * L->pitch, *e = (uint8_t *)exps + (size_t)(r - r0) * L->exp_pitch;
        for (int64_t b = 0; b < n_in / Q35_BFP_BLOCK; b++) {
            uint8_t c[Q35_BFP_BLOCK];
            e[q35_cu_exp_of(L->dtype, b)] = q35_bfp_get_stored(L->dtype, t->data, n_in, r, b, c);
            for (int q = 0; q < Q35_BFP_BLOCK; q += 4) { /* 4 lanes, 4 values each */
                int k;
                uint8_t *ch = dst + q35_cu_chunk_of(L->dtype, b * Q35_BFP_BLOCK + q, &k);
                for (int m = 0; m < 4; m++) { /* to offset-binary: bfp8's sign and magnitude, bfp4's as stored */
                    const uint8_t v = c[q + m];
                    if (bfp8) ch[k + m] = (uint8_t)(v & 0x80 ? 128 - (v & 0x7f) : 128 + v);
                    else ch[(k + m) / 2] |= (uint8_t)(v << (4 * ((k + m) % 2)));
                }
            }
        }
    }
}

/* Rows [r0, r1) of a chunk, packed by one thread. */
typedef struct pack_job {
    const q35_tensor *t;
    const q35_cuda_mat_layout *L;
    int64_t c0, r0, r1; /* c0: the chunk's first row */
    uint8_t *codes, *exps;
} pack_job;

static void *pack_part(void *arg) {
    pack_job *j = arg;
    q35_cuda_mat_pack_rows(j->t, j->L, j->r0, j->r1, j->codes + (size_t)(j->r0 - j->c0) * j->L->pitch,
                           j->exps ? j->exps + (size_t)(j->r0 - j->c0) * j->L->exp_pitch : NULL);
    return NULL;
}

#define PACK_THREADS_MAX 64

void q35_cuda_mat_pack_rows_par(const q35_tensor *t, const q35_cuda_mat_layout *L, int64_t r0, int64_t r1, void *codes,
                                void *exps, int n_threads) {
    int64_t n = n_threads < 1 ? 1 : n_threads > PACK_THREADS_MAX ? PACK_THREADS_MAX : n_threads;
    if (n > r1 - r0) n = r1 - r0;
    pack_job jobs[PACK_THREADS_MAX];
    pthread_t th[PACK_THREADS_MAX];
    int started[PACK_THREADS_MAX] = {0};
    for (int64_t i = 0; i < n; i++) {
        jobs[i] = (pack_job){t, L, r0, r0 + (r1 - r0) * i / n, r0 + (r1 - r0) * (i + 1) / n, codes, exps};
        started[i] = i > 0 && !pthread_create(&th[i], NULL, pack_part, &jobs[i]);
    }
    for (int64_t i = 0; i < n; i++)
        if (!started[i]) pack_part(&jobs[i]); /* the first part, and any whose thread did not start */
    for (int64_t i = 1; i < n; i++)
        if (started[i]) pthread_join(th[i], NULL);
}

float q35_cuda_mat_get(const q35_cuda_mat_layout *L, const void *image, int64_t r, int64_t i) {
    int k;
    const uint8_t *ch = (const uint8_t *)image + (size_t)r * L->pitch + q35_cu_chunk_of(L->dtype, i, &k);
    const uint8_t e = L->exp_pitch ? ((const uint8_t *)image)[L->exp_offset + (size_t)r * L->exp_pitch +
                                                               q35_cu_exp_of(L->dtype, i / Q35_BFP_BLOCK)]
                                   : 0;
    return q35_cu_value(L->dtype, ch, k, e);
}

void q35_cuda_state_layout_of(const q35_config *c, int32_t n_ctx, q35_cuda_state_layout *L) {
    L->conv_floats = (size_t)q35_conv_dim(c) * (size_t)(c->lin_conv_kernel - 1);
    L->ssm_floats = (size_t)c->lin_n_head_v * (size_t)c->lin_head_k_dim * (size_t)c->lin_head_v_dim;
    L->rec_floats = (size_t)(c->n_layer - c->n_layer_full) * (L->conv_floats + L->ssm_floats);
    L->kv_row_floats = (size_t)c->n_head_kv * (size_t)c->head_dim;
    L->kv_layer_floats = 2 * (size_t)n_ctx * L->kv_row_floats;
    L->kv_floats = (size_t)c->n_layer_full * L->kv_layer_floats;
    L->total_floats = L->rec_floats + L->kv_floats;
}

int32_t q35_cuda_kind_index(const q35_config *c, int32_t li) {
    int32_t n = 0;
    for (int32_t i = 0; i < li; i++) n += c->layer_is_full[i] == c->layer_is_full[li];
    return n;
}

void q35_cuda_scratch_layout_of(const q35_config *c, int32_t rows, int mtp, q35_cuda_scratch_layout *L) {
    const size_t R = (size_t)rows, H = (size_t)c->hidden_size, I = (size_t)c->intermediate_size;
    const size_t QD = (size_t)c->n_head * (size_t)c->head_dim, KVD = (size_t)c->n_head_kv * (size_t)c->head_dim;
    const size_t CD = (size_t)q35_conv_dim(c), HV = (size_t)c->lin_n_head_v, VD = HV * (size_t)c->lin_head_v_dim;
    size_t at = 0;
#define PLACE(field, n) do { L->field = at; at += round_up((n), 64); } while (0)
    PLACE(x, R * H); PLACE(xn, R * H); PLACE(tmp, R * H); PLACE(gate, R * I); PLACE(up, R * I);
    PLACE(qg, R * 2 * QD); PLACE(k, R * KVD); PLACE(v, R * KVD); PLACE(o, R * QD);
    PLACE(raw, R * CD); PLACE(y, R * CD); PLACE(z, R * VD); PLACE(core, R * VD); PLACE(bb, R * HV); PLACE(aa, R * HV);
    PLACE(mtp_u, mtp ? R * H : 0); PLACE(mtp_un, mtp ? R * H : 0); PLACE(mtp_cat, mtp ? R * 2 * H : 0);
    PLACE(logits, R * (size_t)c->vocab_size);
#undef PLACE
    L->total = at;
}

/* Kernel limits: cuda_kernels.cu sizes its per-thread arrays by these. */
#define MAX_HEAD_DIM 512   /* attention: 16 dims per lane */
#define MAX_LIN_DK 256     /* GDN: q and k of one row in shared memory */
#define MAX_CONV_KERNEL 16

q35_status q35_cuda_check_config(const q35_config *c, q35_error *err) {
    const char *what = NULL;
    int32_t have = 0, most = 0;
    if (c->head_dim > MAX_HEAD_DIM) { what = "head_dim"; have = c->head_dim; most = MAX_HEAD_DIM; }
    else if (c->lin_head_k_dim > MAX_LIN_DK) { what = "linear_key_head_dim"; have = c->lin_head_k_dim; most = MAX_LIN_DK; }
    else if (c->lin_conv_kernel > MAX_CONV_KERNEL || c->lin_conv_kernel < 1) {
        what = "linear_conv_kernel_dim"; have = c->lin_conv_kernel; most = MAX_CONV_KERNEL;
    } else if (c->rotary_dim > c->head_dim || c->rotary_dim % 2) { what = "rotary_dim"; have = c->rotary_dim; most = c->head_dim; }
    if (what)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the CUDA backend takes %s up to %d (this model: %d)", what, most, have);
    if (c->n_head_kv <= 0 || c->n_head % c->n_head_kv || c->lin_n_head_k <= 0 || c->lin_n_head_v % c->lin_n_head_k)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the CUDA backend needs query heads in whole groups per KV head");
    return Q35_OK;
}

static size_t image_bytes(const q35_tensor *t) {
    q35_cuda_mat_layout L;
    return t->data && !q35_cuda_mat_layout_of(t, &L, NULL) ? round_up(L.bytes, 256) : 0;
}

/* Small tensors (norms, conv taps, gates) go up widened to F32. */
static size_t vec_bytes(const q35_tensor *t) { return t->data ? round_up((size_t)q35_tensor_nelem(t) * 4, 256) : 0; }

static size_t layer_bytes(const q35_layer_weights *l) {
    const q35_tensor *mats[] = {&l->gate_proj, &l->up_proj, &l->down_proj, &l->in_proj_qkv, &l->in_proj_z,
                                &l->in_proj_b, &l->in_proj_a, &l->out_proj, &l->q_proj, &l->k_proj, &l->v_proj,
                                &l->o_proj};
    const q35_tensor *vecs[] = {&l->input_norm, &l->post_norm, &l->conv1d, &l->A_log, &l->dt_bias, &l->gdn_norm,
                                &l->q_norm, &l->k_norm};
    size_t n = 0;
    for (size_t i = 0; i < sizeof mats / sizeof mats[0]; i++) n += image_bytes(mats[i]);
    for (size_t i = 0; i < sizeof vecs / sizeof vecs[0]; i++) n += vec_bytes(vecs[i]);
    return n;
}

size_t q35_cuda_weight_bytes(const q35_config *c, const q35_weights *w) {
    size_t n = image_bytes(&w->embed) + vec_bytes(&w->final_norm);
    if (w->lm_head.data != w->embed.data) n += image_bytes(&w->lm_head);
    for (int32_t i = 0; i < c->n_layer; i++) n += layer_bytes(&w->layers[i]);
    if (w->mtp.present)
        n += layer_bytes(&w->mtp.layer) + image_bytes(&w->mtp.fc) + vec_bytes(&w->mtp.norm) +
             vec_bytes(&w->mtp.pre_fc_norm_embedding) + vec_bytes(&w->mtp.pre_fc_norm_hidden);
    return n;
}
