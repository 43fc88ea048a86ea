/* cuda.c: the CUDA backend's object and its forward pass (see cuda.h). The
 * blocks are those of backend/cpu/cpu.c, in the same order, as kernels
 * (kernels.h); a residual add is folded into the matmul that produces it
 * (x + W h: the same rounding as computing W h and then adding). */
#include "backend/cuda/cuda.h"
#include "backend/cuda/matvec.h"
#include "backend/profile.h"
#include "base/util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define MIN_MAJOR 9 /* the build's machine code is sm_90 (plus compute_90 PTX) */
#define UPLOAD_CHUNK ((size_t)64 << 20)

int q35_cu_ok(cu_backend *b, cudaError_t rc, const char *what) {
    if (rc == cudaSuccess) return 1;
    if (!b->err_status) {
        b->err_status = Q35_ERR_IO;
        snprintf(b->err_msg, sizeof b->err_msg, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(rc),
                 cudaGetErrorName(rc));
    }
    return 0;
}

q35_status q35_cu_fail(cudaError_t rc, const char *what, q35_error *err) {
    q35_status st = rc == cudaErrorMemoryAllocation ? Q35_ERR_NOMEM : Q35_ERR_IO;
    return q35_fail(err, st, "CUDA: %s failed: %s (%s)", what, cudaGetErrorString(rc), cudaGetErrorName(rc));
}

int q35_cuda_device_count(char *why, size_t why_size) {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess || n == 0) {
        if (why) snprintf(why, why_size, "no CUDA device: cudaGetDeviceCount: %s", rc ? cudaGetErrorString(rc) : "0 devices");
        return 0;
    }
    return n;
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

q35_status q35_cuda_copy_bandwidth(double *gb_s, q35_error *err) {
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms[10];
    cudaError_t rc = cudaMalloc(&a, bytes);
    const char *what = "cudaMalloc (2 x 1 GiB)";
    if (!rc) rc = cudaMalloc(&b, bytes);
    if (!rc) { what = "cudaMemset"; rc = cudaMemset(a, 1, bytes); }
    if (!rc) { what = "cudaEventCreate"; rc = cudaEventCreate(&e0); }
    if (!rc) rc = cudaEventCreate(&e1);
    for (int i = 0; !rc && i < 11; i++) { /* the first is a warm-up */
        what = "cudaMemcpy (device to device)";
        rc = cudaEventRecord(e0, 0);
        if (!rc) rc = cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, bytes, cudaMemcpyDeviceToDevice, 0);
        if (!rc) rc = cudaEventRecord(e1, 0);
        if (!rc) rc = cudaEventSynchronize(e1);
        if (!rc && i) rc = cudaEventElapsedTime(&ms[i - 1], e0, e1);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (rc) return q35_cu_fail(rc, what, err);
    qsort(ms, 10, sizeof ms[0], cmp_float);
    *gb_s = 2.0 * (double)bytes / ((ms[4] + ms[5]) / 2.0 * 1e-3) / 1e9;
    return Q35_OK;
}

q35_status q35_cuda_mem_used(size_t *used, size_t *total, q35_error *err) {
    size_t f = 0, t = 0;
    cudaError_t rc = cudaMemGetInfo(&f, &t);
    if (rc) return q35_cu_fail(rc, "cudaMemGetInfo", err);
    *used = t - f;
    *total = t;
    return Q35_OK;
}

static cu_backend *cu_of(q35_backend *b) { return (cu_backend *)b; }
#define LAUNCH(b, name, call) q35_cu_launched((b), (call), "kernel " name)

int q35_cu_launched(cu_backend *b, cudaError_t rc, const char *what) {
    const int ok = q35_cu_ok(b, rc, what);
    if (ok && b->prof_on) q35_cu_prof_kernel(b, what);
    return ok;
}

/* ---- weights ---- */

static void *arena_take(cu_backend *b, size_t bytes) {
    bytes = (bytes + 255) / 256 * 256;
    if (b->arena_used + bytes > b->arena_size) return NULL;
    void *p = b->arena + b->arena_used;
    b->arena_used += bytes;
    return p;
}

/* t's image (layout.h) into dst, through a pinned staging buffer. */
static q35_status upload_image(const q35_tensor *t, const q35_cuda_mat_layout *L, uint8_t *dst, uint8_t *pin,
                               q35_error *err) {
    size_t per_row = L->pitch + L->exp_pitch;
    int64_t rows = (int64_t)(UPLOAD_CHUNK / per_row);
    if (rows < 1) rows = 1;
    for (int64_t r0 = 0; r0 < L->n_out; r0 += rows) {
        int64_t r1 = r0 + rows < L->n_out ? r0 + rows : L->n_out;
        uint8_t *codes = pin, *exps = pin + (size_t)(r1 - r0) * L->pitch;
        long n_cpu = sysconf(_SC_NPROCESSORS_ONLN); /* the re-layout runs at 0.1-0.25 GB/s per core */
        q35_cuda_mat_pack_rows_par(t, L, r0, r1, codes, L->exp_pitch ? exps : NULL, n_cpu > 16 ? 16 : (int)n_cpu);
        cudaError_t rc = cudaMemcpy(dst + (size_t)r0 * L->pitch, codes, (size_t)(r1 - r0) * L->pitch, cudaMemcpyHostToDevice);
        if (!rc && L->exp_pitch)
            rc = cudaMemcpy(dst + L->exp_offset + (size_t)r0 * L->exp_pitch, exps, (size_t)(r1 - r0) * L->exp_pitch,
                            cudaMemcpyHostToDevice);
        if (rc) return q35_cu_fail(rc, "cudaMemcpy (weights)", err);
    }
    return Q35_OK;
}

static q35_cuda_mat mat_of(const q35_cuda_mat_layout *L, const uint8_t *img) {
    q35_cuda_mat m = {(int32_t)L->dtype, (int32_t)L->n_out, (int32_t)L->n_in, (int32_t)L->pitch, (int32_t)L->exp_pitch,
                      img, L->exp_pitch ? img + L->exp_offset : NULL};
    return m;
}

/* The matmul kernel alone (kernels.cu) on an n_out x n_in matrix of dtype
 * filled with pseudo-random codes (block exponents near 2^-7), T input rows:
 * the median time of 21 calls, each on the next of several copies so that
 * the L2 holds none of it, and the bytes of one matrix image. */
q35_status q35_cuda_matmul_time(int32_t dtype, int32_t n_out, int32_t n_in, int32_t T, double *sec, size_t *bytes,
                                q35_error *err) {
    q35_tensor t = {.name = "bench", .dtype = (q35_dtype)dtype, .ndim = 2, .shape = {n_out, n_in}};
    q35_cuda_mat_layout L;
    q35_status st = q35_cuda_mat_layout_of(&t, &L, err);
    if (st) return st;
    const size_t img = (L.bytes + 255) / 256 * 256;
    int copies = (int)(((size_t)1 << 30) / img);
    copies = copies < 2 ? 2 : copies > 8 ? 8 : copies;
    uint8_t *w = NULL, *pin = NULL;
    float *x = NULL, *y = NULL, ms[21];
    cudaEvent_t e0 = NULL, e1 = NULL;
    const char *what = "cudaMalloc (matmul bench)";
    cudaError_t rc = cudaMalloc((void **)&w, img * (size_t)copies);
    if (!rc) rc = cudaMalloc((void **)&x, sizeof(float) * (size_t)T * (size_t)n_in);
    if (!rc) rc = cudaMalloc((void **)&y, sizeof(float) * (size_t)T * (size_t)n_out);
    if (!rc) { what = "cudaMallocHost"; rc = cudaMallocHost((void **)&pin, UPLOAD_CHUNK); }
    if (!rc) {
        uint64_t s = 0x9e3779b97f4a7c15ull;
        for (size_t i = 0; i < UPLOAD_CHUNK; i++) { s = s * 6364136223846793005ull + 1442695040888963407ull; pin[i] = (uint8_t)(s >> 56); }
        what = "cudaMemcpy (matmul bench)";
        for (size_t o = 0; !rc && o < img * (size_t)copies; o += UPLOAD_CHUNK) {
            size_t n = img * (size_t)copies - o < UPLOAD_CHUNK ? img * (size_t)copies - o : UPLOAD_CHUNK;
            rc = cudaMemcpy(w + o, pin, n, cudaMemcpyHostToDevice);
        }
        for (int c = 0; !rc && L.exp_pitch && c < copies; c++)
            rc = cudaMemset(w + (size_t)c * img + L.exp_offset, 120, L.exp_pitch * (size_t)n_out);
        for (size_t i = 0; i < (size_t)T * (size_t)n_in && i < UPLOAD_CHUNK / 4; i++) ((float *)pin)[i] = (float)(pin[i] % 17) / 16.0f - 0.5f;
        if (!rc && (size_t)T * (size_t)n_in <= UPLOAD_CHUNK / 4) rc = cudaMemcpy(x, pin, sizeof(float) * (size_t)T * (size_t)n_in, cudaMemcpyHostToDevice);
    }
    if (!rc) { what = "cudaEventCreate"; rc = cudaEventCreate(&e0); }
    if (!rc) rc = cudaEventCreate(&e1);
    for (int i = 0; !rc && i < 24; i++) { /* three warm-ups */
        q35_cuda_mat m = mat_of(&L, w + (size_t)(i % copies) * img);
        what = "kernel matmul (bench)";
        rc = cudaEventRecord(e0, 0);
        if (!rc) rc = q35_cu_matmul(0, y, m, x, T, 0);
        if (!rc) rc = cudaEventRecord(e1, 0);
        if (!rc) rc = cudaEventSynchronize(e1);
        if (!rc && i >= 3) rc = cudaEventElapsedTime(&ms[i - 3], e0, e1);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    if (pin) cudaFreeHost(pin);
    if (rc) return q35_cu_fail(rc, what, err);
    qsort(ms, 21, sizeof ms[0], cmp_float);
    *sec = ms[10] * 1e-3;
    *bytes = L.bytes;
    return Q35_OK;
}

/* Launch throughput: the mean time per launch of n back-to-back small
 * matmuls (8 x 64, F32) on one stream, the host enqueuing as fast as it can. */
q35_status q35_cuda_launch_time(int n, double *sec, q35_error *err) {
    float *w = NULL, *x = NULL, *y = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float ms = 0;
    cudaError_t rc = cudaMalloc((void **)&w, 8 * Q35_CU_WINDOW_BYTES); /* 8 rows of one window (64 of 128 values) */
    if (!rc) rc = cudaMalloc((void **)&x, 64 * 4);
    if (!rc) rc = cudaMalloc((void **)&y, 8 * 4);
    if (!rc) rc = cudaMemset(w, 0, 8 * Q35_CU_WINDOW_BYTES);
    if (!rc) rc = cudaMemset(x, 0, 64 * 4);
    if (!rc) rc = cudaEventCreate(&e0);
    if (!rc) rc = cudaEventCreate(&e1);
    q35_cuda_mat m = {Q35_DT_F32, 8, 64, Q35_CU_WINDOW_BYTES, 0, (const uint8_t *)w, NULL};
    for (int rep = 0; !rc && rep < 2; rep++) { /* the first warms up */
        rc = cudaEventRecord(e0, 0);
        for (int i = 0; !rc && i < n; i++) rc = q35_cu_matmul(0, y, m, x, 1, 0);
        if (!rc) rc = cudaEventRecord(e1, 0);
        if (!rc) rc = cudaEventSynchronize(e1);
        if (!rc) rc = cudaEventElapsedTime(&ms, e0, e1);
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
    if (rc) return q35_cu_fail(rc, "launch bench", err);
    *sec = ms * 1e-3 / n;
    return Q35_OK;
}

static q35_status up_mat(cu_backend *b, const q35_tensor *t, q35_cuda_mat *m, uint8_t *pin, q35_error *err) {
    memset(m, 0, sizeof *m);
    if (!t->data) return Q35_OK;
    q35_cuda_mat_layout L;
    q35_status st = q35_cuda_mat_layout_of(t, &L, err);
    if (st) return st;
    uint8_t *img = arena_take(b, L.bytes);
    if (!img) return q35_fail(err, Q35_ERR_NOMEM, "CUDA: weight arena too small at %s", t->name);
    st = upload_image(t, &L, img, pin, err);
    if (!st) *m = mat_of(&L, img);
    return st;
}

static q35_status up_vec(cu_backend *b, const q35_tensor *t, float **d, float *pin, q35_error *err) {
    *d = NULL;
    if (!t->data) return Q35_OK;
    int64_t n = q35_tensor_nelem(t);
    float *p = arena_take(b, (size_t)n * 4);
    if (!p) return q35_fail(err, Q35_ERR_NOMEM, "CUDA: weight arena too small at %s", t->name);
    for (int64_t i = 0; i < n; i++) pin[i] = q35_tensor_get_f32(t, i);
    cudaError_t rc = cudaMemcpy(p, pin, (size_t)n * 4, cudaMemcpyHostToDevice);
    if (rc) return q35_cu_fail(rc, "cudaMemcpy (weights)", err);
    *d = p;
    return Q35_OK;
}

static q35_status up_layer(cu_backend *b, const q35_layer_weights *l, cu_layer *d, uint8_t *pin, q35_error *err) {
    const q35_tensor *mt[] = {&l->gate_proj, &l->up_proj, &l->down_proj, &l->in_proj_qkv, &l->in_proj_z, &l->in_proj_b,
                              &l->in_proj_a, &l->out_proj, &l->q_proj, &l->k_proj, &l->v_proj, &l->o_proj};
    q35_cuda_mat *md[] = {&d->gate, &d->up, &d->down, &d->qkv, &d->z, &d->b, &d->a, &d->out, &d->q, &d->k, &d->v, &d->o};
    const q35_tensor *vt[] = {&l->input_norm, &l->post_norm, &l->conv1d, &l->A_log, &l->dt_bias, &l->gdn_norm,
                              &l->q_norm, &l->k_norm};
    float **vd[] = {&d->input_norm, &d->post_norm, &d->conv, &d->A_log, &d->dt_bias, &d->gdn_norm, &d->q_norm, &d->k_norm};
    q35_status st = Q35_OK;
    for (size_t i = 0; !st && i < sizeof mt / sizeof mt[0]; i++) st = up_mat(b, mt[i], md[i], pin, err);
    for (size_t i = 0; !st && i < sizeof vt / sizeof vt[0]; i++) st = up_vec(b, vt[i], vd[i], (float *)pin, err);
    return st;
}

static q35_status upload_weights(cu_backend *b, q35_error *err) {
    const q35_weights *w = b->w;
    uint8_t *pin = NULL;
    cudaError_t rc = cudaMallocHost((void **)&pin, UPLOAD_CHUNK + ((size_t)1 << 20));
    if (rc) return q35_cu_fail(rc, "cudaMallocHost (upload buffer)", err);
    q35_status st = up_mat(b, &w->embed, &b->embed, pin, err);
    if (!st) st = up_vec(b, &w->final_norm, &b->final_norm, (float *)pin, err);
    if (!st && w->lm_head.data == w->embed.data) b->lm_head = b->embed;
    else if (!st) st = up_mat(b, &w->lm_head, &b->lm_head, pin, err);
    for (int32_t i = 0; !st && i < b->c->n_layer; i++) st = up_layer(b, &w->layers[i], &b->layers[i], pin, err);
    if (!st && w->mtp.present) {
        st = up_layer(b, &w->mtp.layer, &b->mtp, pin, err);
        if (!st) st = up_mat(b, &w->mtp.fc, &b->mtp_fc, pin, err);
        if (!st) st = up_vec(b, &w->mtp.pre_fc_norm_embedding, &b->mtp_pre_emb, (float *)pin, err);
        if (!st) st = up_vec(b, &w->mtp.pre_fc_norm_hidden, &b->mtp_pre_hid, (float *)pin, err);
        if (!st) st = up_vec(b, &w->mtp.norm, &b->mtp_norm, (float *)pin, err);
    }
    cudaFreeHost(pin);
    b->draft_head = b->lm_head;
    return st;
}

/* ---- the pass ---- */

static float *scr(cu_backend *b, size_t off) { return b->scratch + off; }

/* Uploads the stage's bytes [from, from + n); ev marks when they were read
 * (not while capturing: the pass's graph launch is marked instead). */
static void stage_upload(cu_backend *b, cudaEvent_t ev, size_t from, size_t n) {
    CU_OK(b, cudaMemcpyAsync((uint8_t *)b->d_stage + from, (uint8_t *)b->stage + from, n, cudaMemcpyHostToDevice, b->stream));
    if (b->mode != CU_CAPTURE) CU_OK(b, cudaEventRecord(ev, b->stream));
}

/* The pass's first device work: the tokens and the sequence table from the
 * pinned stage, then the embedding rows. */
static void begin_body(cu_backend *b) {
    stage_upload(b, b->staged_pass, 0, offsetof(cu_stage, next));
    if (b->prof_on) q35_cu_prof_mark(b, b->n_rows); /* after the upload: the embedding's time is its own */
    const int32_t H = b->c->hidden_size;
    LAUNCH(b, "embed", q35_cu_embed(b->stream, scr(b, b->S.x), H, b->embed, b->d_stage->tokens, b->n_rows));
}

/* Every kernel of a pass reads its rows' tokens, positions and states from
 * the stage, and its pointers are fixed at open or state_new: a pass is a
 * function of (rows, sequences) alone, so it can be replayed as a graph. */
static void choose_mode(cu_backend *b) {
    b->mode = CU_DIRECT;
    if (!b->graphs || b->n_rows > CU_GRAPH_ROWS) return;
    for (int32_t i = 0; i < b->n_graphs; i++)
        if (b->graph[i].rows == b->n_rows && b->graph[i].seqs == b->n_seqs) {
            b->mode = CU_REPLAY, b->graph_at = i;
            return;
        }
    if (b->n_graphs >= CU_GRAPHS) return;
    if (!cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal)) b->mode = CU_CAPTURE;
    else (void)cudaGetLastError(); /* not capturing: the pass runs directly, and the next launch check must not see this */
}

static void cu_begin(q35_backend *base, const q35_bseq *seqs, int32_t n_seqs, const int32_t *tokens, int32_t T) {
    cu_backend *b = cu_of(base);
    b->n_seqs = n_seqs;
    b->n_rows = T;
    b->mode = CU_DIRECT;
    b->prof_on = 0;
    if (b->err_status || !CU_OK(b, cudaEventSynchronize(b->staged_pass))) return;
    for (int32_t i = 0; i < n_seqs; i++)
        if (seqs[i].mm && !b->err_status) { /* the session never gets here: encode_images refuses first */
            b->err_status = Q35_ERR_UNSUPPORTED;
            snprintf(b->err_msg, sizeof b->err_msg, "the cuda backend does not support image input yet");
        }
    if (b->err_status) return;
    cu_stage *g = b->stage;
    memcpy(g->tokens, tokens, sizeof(int32_t) * (size_t)T);
    for (int32_t i = 0; i < n_seqs; i++) {
        const q35_bseq *q = &seqs[i];
        q35_bstate *s = q->state;
        g->seqs[i] = (q35_cuda_seq){q->row0, q->n_rows, q->pos0, s->n_ctx, s->mem, s->mem + s->L.rec_floats,
                                    q->rewindable ? s->row_states : NULL};
        for (int32_t r = q->row0; r < q->row0 + q->n_rows; r++) g->row_seq[r] = i;
    }
    b->mm_segs = g->seqs, b->mm_n_segs = n_seqs, b->mm_rows = T;
    b->prof_on = q35_cu_prof_wanted();
    if (b->prof_on && b->prof && q35_cu_prof_pending(b) > 3000) { /* passes without logits: read their events now */
        if (CU_OK(b, cudaStreamSynchronize(b->stream))) q35_cu_prof_harvest(b);
    }
    if (!b->prof_on) choose_mode(b); /* profiled passes are timed kernel by kernel: no graph */
    if (b->mode != CU_REPLAY) begin_body(b);
}

/* A sequence with at least this many rows in a pass (or the MTP head's)
 * multiplies on tensor cores: prompts; never a verify step's rows (at most
 * Q35_SPEC_MAX + 1) or a decode row. */
#define CU_TC_ROWS (Q35_SPEC_MAX + 2)
/* a graph is keyed by (rows, sequences) alone: its passes must not reach tensor cores */
_Static_assert(CU_GRAPH_ROWS < CU_TC_ROWS, "graph passes must stay on the CUDA-core kernel");

/* The sequence whose rows hold row r, or NULL. */
static const q35_cuda_seq *seq_of_row(const cu_backend *b, int32_t r) {
    for (int32_t i = 0; i < b->mm_n_segs; i++)
        if (r >= b->mm_segs[i].row0 && r < b->mm_segs[i].row0 + b->mm_segs[i].n_rows) return &b->mm_segs[i];
    return NULL;
}

/* y[i] = x W[i]^T over the rows of the pass in flight (or the MTP head's):
 * one launch when no sequence reaches CU_TC_ROWS (every decode, verify and
 * batch step); else each such sequence's rows on tensor cores and each run
 * of the other rows on the CUDA-core kernel, so that a row's kernel depends
 * on its own sequence's rows alone, never on the batch around it. */
static int pass_mm(cu_backend *b, const char *what, int32_t n, const q35_cuda_mat *W, float *const *y, const float *x,
                   int add) {
    const int32_t T = b->mm_rows;
    int any = 0;
    for (int32_t i = 0; i < b->mm_n_segs; i++) any |= b->mm_segs[i].n_rows >= CU_TC_ROWS;
    if (!any) return q35_cu_launched(b, q35_cu_matmul_n(b->stream, n, W, y, x, T, add, 0), what);
    int32_t n_in = 0;
    for (int32_t i = 0; i < n; i++)
        if (W[i].n_out > 0) { n_in = W[i].n_in; break; }
    int ok = 1;
    for (int32_t r = 0, r1; ok && r < T; r = r1) {
        const q35_cuda_seq *g = seq_of_row(b, r);
        const int tc = g && g->n_rows >= CU_TC_ROWS;
        if (tc) r1 = g->row0 + g->n_rows;
        else
            for (r1 = r + 1; r1 < T; r1++) {
                const q35_cuda_seq *h = seq_of_row(b, r1);
                if (h && h->n_rows >= CU_TC_ROWS) break;
            }
        float *yy[4];
        for (int32_t i = 0; i < n && i < 4; i++) yy[i] = y[i] + (size_t)r * (size_t)(W[i].n_out > 0 ? W[i].n_out : 0);
        ok = q35_cu_launched(b, q35_cu_matmul_n(b->stream, n < 4 ? n : 4, W, yy, x + (size_t)r * (size_t)n_in, r1 - r, add, tc),
                             what);
    }
    return ok;
}

/* x += o_proj(attention(xn)) over seqs, against their kv_layer-th K/V (x, xn: rows of H). */
static void attention(cu_backend *b, const cu_layer *l, float *x, const float *xn, const q35_cuda_seq *seqs,
                      const int32_t *row_seq, int32_t kv_layer, int32_t T) {
    const q35_config *c = b->c;
    q35_cuda_attn a = {c->n_head, c->n_head_kv, c->head_dim, c->rotary_dim, c->rope_theta, c->rms_norm_eps,
                       1.0f / sqrtf((float)c->head_dim), kv_layer};
    float *qg = scr(b, b->S.qg), *k = scr(b, b->S.k), *v = scr(b, b->S.v), *o = scr(b, b->S.o);
    cudaStream_t s = b->stream;
    const q35_cuda_mat W[3] = {l->q, l->k, l->v};
    float *const y[3] = {qg, k, v};
    pass_mm(b, "kernel matmul q, k, v", 3, W, y, xn, 0);
    LAUNCH(b, "attn_prep", q35_cu_attn_prep(s, a, qg, k, v, l->q_norm, l->k_norm, seqs, row_seq, T));
    LAUNCH(b, "attn", q35_cu_attn(s, a, o, qg, seqs, row_seq, T));
    pass_mm(b, "kernel matmul o", 1, &l->o, &x, o, 1);
}

static void gdn(cu_backend *b, const cu_layer *l, int32_t gi, int32_t T) {
    const q35_config *c = b->c;
    q35_cuda_state_layout L;
    q35_cuda_state_layout_of(c, 1, &L);
    const size_t off = (size_t)gi * (L.conv_floats + L.ssm_floats);
    q35_cuda_gdn g = {c->lin_n_head_k, c->lin_n_head_v, c->lin_head_k_dim, c->lin_head_v_dim, q35_conv_dim(c),
                      c->lin_conv_kernel, c->rms_norm_eps, off, off + L.conv_floats, L.rec_floats};
    const float *xn = scr(b, b->S.xn);
    float *raw = scr(b, b->S.raw), *y = scr(b, b->S.y), *z = scr(b, b->S.z), *core = scr(b, b->S.core);
    float *bb = scr(b, b->S.bb), *aa = scr(b, b->S.aa);
    const q35_cuda_seq *seqs = b->d_stage->seqs;
    cudaStream_t s = b->stream;
    const q35_cuda_mat W[4] = {l->qkv, l->z, l->b, l->a};
    float *const out[4] = {raw, z, bb, aa};
    pass_mm(b, "kernel matmul qkv, z, b, a", 4, W, out, xn, 0);
    LAUNCH(b, "gdn_conv", q35_cu_gdn_conv(s, g, y, raw, l->conv, seqs, b->n_seqs));
    LAUNCH(b, "gdn_qknorm", q35_cu_gdn_qknorm(s, g, y, T));
    LAUNCH(b, "gdn_recur", q35_cu_gdn_recur(s, g, core, y, bb, aa, l->A_log, l->dt_bias, seqs, b->n_seqs));
    LAUNCH(b, "gdn_norm", q35_cu_gdn_norm(s, g, core, z, l->gdn_norm, T));
    float *const x = scr(b, b->S.x);
    pass_mm(b, "kernel matmul out", 1, &l->out, &x, core, 1);
}

/* x += down(silu(gate xn) * (up xn)). */
static void mlp(cu_backend *b, const cu_layer *l, float *x, const float *xn, int32_t T) {
    float *gate = scr(b, b->S.gate), *up = scr(b, b->S.up);
    cudaStream_t s = b->stream;
    const q35_cuda_mat W[2] = {l->gate, l->up};
    float *const y[2] = {gate, up};
    pass_mm(b, "kernel matmul gate, up", 2, W, y, xn, 0);
    LAUNCH(b, "swiglu", q35_cu_swiglu(s, gate, up, (size_t)T * (size_t)b->c->intermediate_size));
    pass_mm(b, "kernel matmul down", 1, &l->down, &x, gate, 1);
}

static void norm(cu_backend *b, float *dst, const float *src, const float *w, int32_t T, const char *what) {
    const int32_t H = b->c->hidden_size;
    q35_cu_launched(b, q35_cu_rmsnorm1p(b->stream, dst, H, src, H, w, T, H, b->c->rms_norm_eps), what);
}

static void layer_body(cu_backend *b, int32_t li) {
    const q35_config *c = b->c;
    const cu_layer *l = &b->layers[li];
    const int32_t T = b->n_rows, ki = q35_cuda_kind_index(c, li);
    float *x = scr(b, b->S.x), *xn = scr(b, b->S.xn);
    norm(b, xn, x, l->input_norm, T, "kernel rmsnorm (input)");
    if (c->layer_is_full[li]) {
        attention(b, l, x, xn, b->d_stage->seqs, b->d_stage->row_seq, ki, T);
    } else {
        gdn(b, l, ki, T);
    }
    norm(b, xn, x, l->post_norm, T, "kernel rmsnorm (post)");
    mlp(b, l, x, xn, T);
}

static void cu_layer_op(q35_backend *base, int32_t li) {
    cu_backend *b = cu_of(base);
    if (b->err_status || b->mode == CU_REPLAY) return;
    layer_body(b, li);
}

static void end_body(cu_backend *b) {
    norm(b, scr(b, b->S.xn), scr(b, b->S.x), b->final_norm, b->n_rows, "kernel rmsnorm (final)");
}

/* Ends a capture: the pass's graph, kept and launched. If capturing failed,
 * graphs are turned off and the pass runs directly. */
static void end_capture(cu_backend *b) {
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    const int failed_inside = b->err_status != Q35_OK;
    cudaError_t rc = cudaStreamEndCapture(b->stream, &graph);
    if (!rc && !failed_inside) rc = cudaGraphInstantiate(&exec, graph, 0);
    if (graph) cudaGraphDestroy(graph);
    if (rc || failed_inside) {
        if (exec) cudaGraphExecDestroy(exec);
        (void)cudaGetLastError(); /* a capture's error is not the pass's */
        fprintf(stderr, "qwen35: cuda graphs off: a pass of %d rows failed while captured (%s%s%s); it and later passes "
                        "run directly\n",
                b->n_rows, failed_inside ? b->err_msg : "", failed_inside && rc ? "; " : "", rc ? cudaGetErrorString(rc) : "");
        b->graphs = 0, b->mode = CU_DIRECT, b->err_status = Q35_OK, b->err_msg[0] = 0;
        begin_body(b);
        for (int32_t li = 0; li < b->c->n_layer; li++) layer_body(b, li);
        end_body(b);
        return;
    }
    b->graph[b->n_graphs].rows = b->n_rows;
    b->graph[b->n_graphs].seqs = b->n_seqs;
    b->graph[b->n_graphs].exec = exec;
    b->graph_at = b->n_graphs++;
    b->mode = CU_REPLAY;
}

static void cu_end(q35_backend *base) {
    cu_backend *b = cu_of(base);
    if (b->mode == CU_CAPTURE) {
        if (!b->err_status) end_body(b);
        end_capture(b);
    } else if (!b->err_status && b->mode == CU_DIRECT) {
        end_body(b);
    }
    if (b->err_status || b->mode != CU_REPLAY) return;
    if (CU_OK(b, cudaGraphLaunch(b->graph[b->graph_at].exec, b->stream))) CU_OK(b, cudaEventRecord(b->staged_pass, b->stream));
}

/* out (n, rows of W) = W x into host memory, through the logits scratch. */
static void head_to_host(cu_backend *b, q35_cuda_mat W, const float *x, int32_t n, float *out) {
    float *d = scr(b, b->S.logits);
    if (!LAUNCH(b, "matmul lm_head", q35_cu_matmul(b->stream, d, W, x, n, 0))) return;
    if (!CU_OK(b, cudaMemcpyAsync(out, d, sizeof(float) * (size_t)n * (size_t)W.n_out, cudaMemcpyDeviceToHost, b->stream)))
        return;
    CU_OK(b, cudaStreamSynchronize(b->stream));
    if (b->prof) q35_cu_prof_harvest(b);
}

static void cu_logits(q35_backend *base, int32_t row0, int32_t n, float *out) {
    cu_backend *b = cu_of(base);
    if (b->err_status) {
        memset(out, 0, sizeof(float) * (size_t)n * (size_t)b->c->vocab_size);
        return;
    }
    head_to_host(b, b->lm_head, scr(b, b->S.xn) + (size_t)row0 * b->c->hidden_size, n, out);
}

static void cu_keep_rows(q35_backend *base, q35_bstate *st, int32_t row0, int32_t n) {
    cu_backend *b = cu_of(base);
    if (b->err_status || !st->kept) return;
    const size_t H = (size_t)b->c->hidden_size;
    CU_OK(b, cudaMemcpyAsync(st->kept, scr(b, b->S.xn) + (size_t)row0 * H, sizeof(float) * H * (size_t)n,
                             cudaMemcpyDeviceToDevice, b->stream));
}

/* The MTP head (cpu.c): u = fc [norm(E next) | norm(h)]; u += attn(norm u) on
 * the MTP cache; u += mlp(norm u); with logits, draft = norm(u last) and the
 * draft head's logits of it. */
static void cu_mtp(q35_backend *base, q35_bstate *s, q35_mtp_src src, int32_t row0, const int32_t *next, int32_t n,
                   int32_t pos0, const q35_bmm *mm, float *logits) {
    cu_backend *b = cu_of(base);
    if (mm && !b->err_status) {
        b->err_status = Q35_ERR_UNSUPPORTED;
        snprintf(b->err_msg, sizeof b->err_msg, "the cuda backend does not support image input yet");
    }
    const q35_config *c = b->c;
    const int32_t H = c->hidden_size;
    const float eps = c->rms_norm_eps;
    if (b->err_status || !s->mtp_kv || !CU_OK(b, cudaEventSynchronize(b->staged_mtp))) {
        if (logits) memset(logits, 0, sizeof(float) * (size_t)b->draft_head.n_out);
        return;
    }
    cu_stage *g = b->stage;
    memcpy(g->next, next, sizeof(int32_t) * (size_t)n);
    memset(g->mtp_row_seq, 0, sizeof(int32_t) * (size_t)n);
    g->mtp_seq = (q35_cuda_seq){0, n, pos0, s->n_ctx, NULL, s->mtp_kv, NULL};
    b->mm_segs = &g->mtp_seq, b->mm_n_segs = 1, b->mm_rows = n;
    stage_upload(b, b->staged_mtp, offsetof(cu_stage, next), sizeof(cu_stage) - offsetof(cu_stage, next));
    const float *hidden = src == Q35_MTP_FROM_FORWARD ? scr(b, b->S.xn) : src == Q35_MTP_FROM_KEPT ? s->kept : s->draft;
    hidden += (size_t)row0 * H;
    float *cat = scr(b, b->S.mtp_cat), *u = scr(b, b->S.mtp_u), *un = scr(b, b->S.mtp_un);
    cudaStream_t st = b->stream;
    if (b->prof_on) q35_cu_prof_mark(b, Q35_PROF_MTP + n);
    LAUNCH(b, "embed (mtp)", q35_cu_embed(st, cat, 2 * H, b->embed, b->d_stage->next, n));
    q35_cu_launched(b, q35_cu_rmsnorm1p(st, cat, 2 * H, cat, 2 * H, b->mtp_pre_emb, n, H, eps), "kernel rmsnorm (mtp embedding)");
    q35_cu_launched(b, q35_cu_rmsnorm1p(st, cat + H, 2 * H, hidden, H, b->mtp_pre_hid, n, H, eps), "kernel rmsnorm (mtp hidden)");
    pass_mm(b, "kernel matmul mtp fc", 1, &b->mtp_fc, &u, cat, 0);
    norm(b, un, u, b->mtp.input_norm, n, "kernel rmsnorm (mtp input)");
    attention(b, &b->mtp, u, un, &b->d_stage->mtp_seq, b->d_stage->mtp_row_seq, 0, n);
    norm(b, un, u, b->mtp.post_norm, n, "kernel rmsnorm (mtp post)");
    mlp(b, &b->mtp, u, un, n);
    if (logits) {
        norm(b, s->draft, u + (size_t)(n - 1) * H, b->mtp_norm, 1, "kernel rmsnorm (mtp final)");
        head_to_host(b, b->draft_head, s->draft, 1, logits);
        if (b->err_status) memset(logits, 0, sizeof(float) * (size_t)b->draft_head.n_out);
    }
}

static q35_status cu_encode_images(q35_backend *base, const float *pixel_values, int32_t n_images,
                                   const int32_t (*grid_thw)[3], float *out, q35_error *err) {
    (void)base, (void)pixel_values, (void)n_images, (void)grid_thw, (void)out;
    return q35_fail(err, Q35_ERR_UNSUPPORTED, "the cuda backend does not support image input yet (use Q35_BACKEND=cpu)");
}

static q35_status cu_set_draft_head(q35_backend *base, const q35_tensor *head, q35_error *err) {
    cu_backend *b = cu_of(base);
    if (b->draft_mem) { cudaFree(b->draft_mem); b->draft_mem = NULL; }
    b->draft_head = b->lm_head;
    if (!head) return Q35_OK;
    q35_cuda_mat_layout L;
    q35_status st = q35_cuda_mat_layout_of(head, &L, err);
    if (st) return st;
    if (L.n_out > b->c->vocab_size || L.n_in != b->c->hidden_size)
        return q35_fail(err, Q35_ERR_ARG, "draft head %s: shape does not match lm_head", head->name);
    cudaError_t rc = cudaMalloc((void **)&b->draft_mem, L.bytes);
    if (rc) { b->draft_mem = NULL; return q35_cu_fail(rc, "cudaMalloc (draft head)", err); }
    uint8_t *pin = NULL;
    rc = cudaMallocHost((void **)&pin, UPLOAD_CHUNK + ((size_t)1 << 20));
    if (rc) st = q35_cu_fail(rc, "cudaMallocHost (upload buffer)", err);
    else st = upload_image(head, &L, b->draft_mem, pin, err);
    if (pin) cudaFreeHost(pin);
    if (st) { cudaFree(b->draft_mem); b->draft_mem = NULL; return st; }
    b->draft_head = mat_of(&L, b->draft_mem);
    return Q35_OK;
}

static q35_status cu_status(q35_backend *base, q35_error *err) {
    cu_backend *b = cu_of(base);
    if (!b->err_status) {
        cudaError_t rc = cudaPeekAtLastError(); /* a fault of work already finished */
        if (rc) q35_cu_ok(b, rc, "a kernel");
    }
    return b->err_status ? q35_fail(err, b->err_status, "%s", b->err_msg) : Q35_OK;
}

static const char *cu_kernels(const q35_backend *base, const char **note) {
    const cu_backend *b = (const cu_backend *)base;
    if (note) *note = b->note;
    return b->kernels_name;
}

static int32_t cu_threads(const q35_backend *base) { (void)base; return 1; }

static void cu_close(q35_backend *base) {
    cu_backend *b = cu_of(base);
    if (!b) return;
    if (b->stream) cudaStreamSynchronize(b->stream);
    q35_cu_prof_report(b);
    for (int32_t i = 0; i < b->n_graphs; i++) cudaGraphExecDestroy(b->graph[i].exec);
    if (b->staged_pass) cudaEventDestroy(b->staged_pass);
    if (b->staged_mtp) cudaEventDestroy(b->staged_mtp);
    if (b->stream) cudaStreamDestroy(b->stream);
    cudaFree(b->draft_mem);
    cudaFree(b->arena);
    cudaFree(b->scratch);
    cudaFree(b->d_stage);
    if (b->stage) cudaFreeHost(b->stage);
    free(b);
}

static const q35_backend_ops cu_ops = {
    .name = "cuda",
    .close = cu_close,
    .kernels = cu_kernels,
    .threads = cu_threads,
    .state_new = q35_cu_state_new,
    .state_free = q35_cu_state_free,
    .state_clear = q35_cu_state_clear,
    .state_set_spec = q35_cu_state_set_spec,
    .state_rewind = q35_cu_state_rewind,
    .snapshot_take = q35_cu_snapshot_take,
    .snapshot_restore = q35_cu_snapshot_restore,
    .snapshot_free = q35_cu_snapshot_free,
    .begin = cu_begin,
    .layer = cu_layer_op,
    .end = cu_end,
    .logits = cu_logits,
    .keep_rows = cu_keep_rows,
    .mtp = cu_mtp,
    .set_draft_head = cu_set_draft_head,
    .encode_images = cu_encode_images,
    .status = cu_status,
};

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

/* The device, its compute capability and its free memory against what the model needs. */
static q35_status pick_device(cu_backend *b, size_t need, q35_error *err) {
    char why[160];
    if (!q35_cuda_device_count(why, sizeof why))
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "the cuda backend needs a CUDA device: %s (use --backend cpu)", why);
    struct cudaDeviceProp p;
    cudaError_t rc = cudaGetDeviceProperties(&p, 0);
    if (!rc) rc = cudaSetDevice(0);
    if (rc) return q35_cu_fail(rc, "cudaGetDeviceProperties / cudaSetDevice", err);
    if (p.major < MIN_MAJOR)
        return q35_fail(err, Q35_ERR_UNSUPPORTED,
                        "CUDA device 0 (%s) has compute capability %d.%d; this build runs on %d.0 or newer (sm_90)",
                        p.name, p.major, p.minor, MIN_MAJOR);
    size_t free_b = 0, total_b = 0;
    rc = cudaMemGetInfo(&free_b, &total_b);
    if (rc) return q35_cu_fail(rc, "cudaMemGetInfo", err);
    if (need > free_b)
        return q35_fail(err, Q35_ERR_UNSUPPORTED,
                        "the model needs %.0f MiB of device memory (weights and scratch, before any session); CUDA "
                        "device 0 (%s) has %.0f MiB free of %.0f MiB",
                        mib(need), p.name, mib(free_b), mib(total_b));
    snprintf(b->kernels_name, sizeof b->kernels_name, "cuda sm_%d%d", p.major, p.minor);
    snprintf(b->note, sizeof b->note, "%s, %d SMs, %.0f MiB (%.0f MiB free at load)", p.name, p.multiProcessorCount,
             mib(total_b), mib(free_b));
    return Q35_OK;
}

q35_status q35_backend_cuda_open(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                                 q35_error *err) {
    (void)n_threads;
    *out = NULL;
    q35_status st = q35_cuda_check_config(c, err);
    if (st) return st;
    cu_backend *b = calloc(1, sizeof *b);
    if (!b) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    b->ops = cu_ops;
    b->base.ops = &b->ops;
    b->c = c;
    b->w = w;
    const char *g = getenv("Q35_CUDA_GRAPHS");
    b->graphs = !(g && !strcmp(g, "0"));
    q35_cuda_scratch_layout_of(c, Q35_UBATCH, w->mtp.present, &b->S);
    b->arena_size = q35_cuda_weight_bytes(c, w);
    const size_t scratch_bytes = b->S.total * sizeof(float);
    st = pick_device(b, b->arena_size + scratch_bytes + sizeof(cu_stage), err);
    cudaError_t rc = cudaSuccess;
    const char *what = NULL;
    if (!st) {
        if ((rc = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking))) what = "cudaStreamCreate";
        else if ((rc = cudaEventCreateWithFlags(&b->staged_pass, cudaEventDisableTiming))) what = "cudaEventCreate";
        else if ((rc = cudaEventCreateWithFlags(&b->staged_mtp, cudaEventDisableTiming))) what = "cudaEventCreate";
        else if ((rc = cudaMalloc((void **)&b->arena, b->arena_size ? b->arena_size : 256))) what = "cudaMalloc (weights)";
        else if ((rc = cudaMalloc((void **)&b->scratch, scratch_bytes))) what = "cudaMalloc (pass scratch)";
        else if ((rc = cudaMemset(b->scratch, 0, scratch_bytes))) what = "cudaMemset (pass scratch)";
        else if ((rc = cudaMalloc((void **)&b->d_stage, sizeof(cu_stage)))) what = "cudaMalloc (stage)";
        else if ((rc = cudaMallocHost((void **)&b->stage, sizeof(cu_stage)))) what = "cudaMallocHost (stage)";
        if (what) st = q35_cu_fail(rc, what, err);
    }
    if (!st) {
        memset(b->stage, 0, sizeof(cu_stage));
        st = upload_weights(b, err);
    }
    if (st) {
        cu_close(&b->base);
        return st;
    }
    *out = &b->base;
    return Q35_OK;
}
