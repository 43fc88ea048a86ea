/* compute.c: parallel matmuls over the thread pool, the SwiGLU MLP and
 * RMSNorm (see compute.h). */
#include "backend/cpu/compute.h"

#include <math.h>

#define ROW_ALIGN 64 /* whole weight panels per worker */
#define Q35_MATMUL_MAX_PIECES 8 /* per job */

typedef struct {
    const q35_kernels *k;
    int n;                       /* pieces */
    float *const *ys;
    const q35_tensor *const *Ws;
    const float *x;
    int64_t n_tok, n_blocks;     /* n_blocks: ROW_ALIGN-row blocks of all pieces together */
    float *swiglu_out;           /* q35_mlp: silu(y0) * y1 goes here (it may be y0) */
} matmul_job;

static int64_t piece_blocks(const q35_tensor *W) { return (W->shape[0] + ROW_ALIGN - 1) / ROW_ALIGN; }

/* The pieces' rows, concatenated and cut into blocks of ROW_ALIGN (a piece's
 * last block may be short), are split over the workers in fixed ranges; a
 * worker's ranges go to the kernels in one call, so x is quantized once. */
static void matmul_worker(void *p, int ith, int nth) {
    const matmul_job *j = p;
    int64_t lo, hi, base = 0, o0[Q35_MATMUL_MAX_PIECES], o1[Q35_MATMUL_MAX_PIECES];
    q35_split(j->n_blocks, 1, ith, nth, &lo, &hi);
    for (int i = 0; i < j->n; i++) {
        const q35_tensor *W = j->Ws[i];
        int64_t nb = piece_blocks(W), b0 = lo - base, b1 = hi - base;
        if (b0 < 0) b0 = 0;
        if (b1 > nb) b1 = nb;
        o0[i] = b0 * ROW_ALIGN;
        o1[i] = b0 >= b1 ? o0[i] : b1 * ROW_ALIGN < W->shape[0] ? b1 * ROW_ALIGN : W->shape[0];
        base += nb;
    }
    if (lo < hi) j->k->matmul_n(j->n, j->ys, j->Ws, j->x, j->n_tok, o0, o1);
}

static double job_work(const matmul_job *j) {
    double w = 0;
    for (int i = 0; i < j->n; i++) w += (double)j->Ws[i]->shape[0] * (double)j->Ws[i]->shape[j->Ws[i]->ndim - 1];
    return w * (double)j->n_tok;
}

static void run_job(const q35_host *h, matmul_job *j, q35_pool_fn fn) {
    j->n_blocks = 0;
    for (int i = 0; i < j->n; i++) j->n_blocks += piece_blocks(j->Ws[i]);
    if (job_work(j) < 2e5 || !h->pool) fn(j, 0, 1); /* too small to be worth a handoff */
    else q35_pool_run(h->pool, fn, j);
}

void q35_matmul(const q35_host *h, float *y, const q35_tensor *W, const float *x, int64_t n_tok) {
    q35_matmul_multi(h, 1, &y, &W, x, n_tok);
}

void q35_matmul_multi(const q35_host *h, int n, float *const *ys, const q35_tensor *const *Ws, const float *x,
                      int64_t n_tok) {
    if (h->tap) h->tap(h->tap_ctx, n, Ws, x, n_tok);
    for (int i = 0; i < n; i += Q35_MATMUL_MAX_PIECES) { /* callers pass 2-4 */
        matmul_job j = {h->k, n - i < Q35_MATMUL_MAX_PIECES ? n - i : Q35_MATMUL_MAX_PIECES,
                        ys + i, Ws + i, x, n_tok, 0, NULL};
        run_job(h, &j, matmul_worker);
    }
}

/* Each worker owns the same block range of gate and up (the split of one
 * piece), computes both and applies silu(gate) * up to its own rows while
 * they are still in its cache. */
static void swiglu_worker(void *p, int ith, int nth) {
    const matmul_job *j = p;
    const int64_t I = j->Ws[0]->shape[0];
    int64_t lo, hi;
    q35_split(I, ROW_ALIGN, ith, nth, &lo, &hi);
    if (lo >= hi) return;
    const int64_t o0[2] = {lo, lo}, o1[2] = {hi, hi};
    j->k->matmul_n(2, j->ys, j->Ws, j->x, j->n_tok, o0, o1);
    for (int64_t t = 0; t < j->n_tok; t++)
        j->k->silu_mul(j->swiglu_out + t * I + lo, j->ys[0] + t * I + lo, j->ys[1] + t * I + lo, hi - lo);
}

void q35_mlp(const q35_host *h, float *out, float *gate, float *up, const q35_tensor *W_gate, const q35_tensor *W_up,
             const q35_tensor *W_down, const float *x, int64_t n_tok) {
    float *ys[2] = {gate, up};
    const q35_tensor *Ws[2] = {W_gate, W_up};
    matmul_job j = {h->k, 2, ys, Ws, x, n_tok, 0, gate};
    if (h->tap) h->tap(h->tap_ctx, 2, Ws, x, n_tok);
    run_job(h, &j, swiglu_worker);
    q35_matmul(h, out, W_down, gate, n_tok);
}

void q35_rmsnorm1p_to(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps) {
    float r = 1.0f / sqrtf((float)(q35_sum_squares(src, n) / n) + eps);
    for (int32_t i = 0; i < n; i++) dst[i] = src[i] * r * (1.0f + q35_weight_f32(w, i));
}
