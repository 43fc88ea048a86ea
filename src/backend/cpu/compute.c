/* compute.c: parallel matmuls over the thread pool, the SwiGLU MLP and
 * RMSNorm (see compute.h). */
#include "backend/cpu/compute.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

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
    _Atomic int64_t next;        /* the first block (or row block of the MLP) no worker has claimed */
    uint64_t epoch;              /* the job's q35_kernels_x_epoch: a worker quantizes x once for its claims */
} matmul_job;

static _Atomic uint64_t g_epoch;

uint64_t q35_x_epoch_new(void) { return atomic_fetch_add_explicit(&g_epoch, 1, memory_order_relaxed) + 1; }

static int64_t piece_blocks(const q35_tensor *W) { return (W->shape[0] + ROW_ALIGN - 1) / ROW_ALIGN; }

/* Blocks [lo, hi) of the pieces' rows (below) in one kernel call, so x is
 * quantized once for them. */
static void matmul_range(const matmul_job *j, int64_t lo, int64_t hi) {
    int64_t base = 0, o0[Q35_MATMUL_MAX_PIECES], o1[Q35_MATMUL_MAX_PIECES];
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

/* The job's n blocks, in the ranges this worker claims (q35_claim; which
 * worker computes a row does not change its value, the kernels' rule, so
 * neither does the order of claims), each to range(j, lo, hi), x quantized
 * once for all of them (q35_kernels_x_epoch), prompts as decode. A fixed
 * half per worker, as prompts once took, leaves the job to the slower core
 * wherever the other tenant of a VM takes one for a while: prompts of 256
 * and 512 at the 9B shapes on two Zen 3 threads, 7 interleaved pairs,
 * 18.6-21.2 -> 19.8-21.2 tok/s, faster in every pair (by 0.2-12%). */
static void run_ranges(matmul_job *j, int64_t n, int nth, void (*range)(const matmul_job *, int64_t, int64_t)) {
    int64_t lo, hi;
    q35_kernels_x_epoch = j->epoch;
    while (q35_claim(&j->next, n, nth, &lo, &hi)) range(j, lo, hi);
    q35_kernels_x_epoch = 0;
}

/* The pieces' rows, concatenated and cut into blocks of ROW_ALIGN (a piece's
 * last block may be short), go to the workers in ranges (run_ranges); a
 * range goes to the kernels in one call, whatever pieces it spans. */
static void matmul_worker(void *p, int ith, int nth) {
    matmul_job *j = p;
    run_ranges(j, j->n_blocks, nth, matmul_range);
}

static double job_work(const matmul_job *j) {
    double w = 0;
    for (int i = 0; i < j->n; i++) w += (double)j->Ws[i]->shape[0] * (double)j->Ws[i]->shape[j->Ws[i]->ndim - 1];
    return w * (double)j->n_tok;
}

static void swiglu_worker(void *p, int ith, int nth);

void q35_prof_matmuls(const q35_host *h, int32_t rows, int n, const q35_tensor *const *Ws, const char *suffix,
                      double seconds) {
    char name[64], role[64];
    double bytes = 0;
    for (int i = 0; i < n; i++) bytes += (double)Ws[i]->nbytes;
    if (h->prof_label) {
        snprintf(name, sizeof name, "%s", h->prof_label);
    } else { /* the first's role, then the others' last part */
        q35_prof_role(Ws[0]->name, name, sizeof name);
        for (int i = 1; i < n; i++) {
            q35_prof_role(Ws[i]->name, role, sizeof role);
            const char *last = strrchr(role, '.');
            size_t at = strlen(name);
            snprintf(name + at, sizeof name - at, " + %.24s", last ? last + 1 : role);
        }
        size_t at = strlen(name);
        snprintf(name + at, sizeof name - at, "%s", suffix);
    }
    q35_prof_add(h->prof, rows, name, bytes, seconds);
}

static void run_job(const q35_host *h, matmul_job *j, q35_pool_fn fn) {
    const double t0 = h->prof ? q35_now_seconds() : 0;
    atomic_init(&j->next, 0);
    j->epoch = q35_x_epoch_new();
    j->n_blocks = 0;
    for (int i = 0; i < j->n; i++) j->n_blocks += piece_blocks(j->Ws[i]);
    if (job_work(j) < 2e5 || !h->pool) fn(j, 0, 1); /* too small to be worth a handoff */
    else q35_pool_run(h->pool, fn, j);
    if (h->prof)
        q35_prof_matmuls(h, h->prof_rows ? h->prof_rows : (int32_t)j->n_tok, j->n, j->Ws,
                         fn == swiglu_worker ? " (+silu)" : "", q35_now_seconds() - t0);
}

void q35_matmul(const q35_host *h, float *y, const q35_tensor *W, const float *x, int64_t n_tok) {
    q35_matmul_multi(h, 1, &y, &W, x, n_tok);
}

void q35_matmul_multi(const q35_host *h, int n, float *const *ys, const q35_tensor *const *Ws, const float *x,
                      int64_t n_tok) {
    if (h->tap) h->tap(h->tap_ctx, n, Ws, x, n_tok);
    for (int i = 0; i < n; i += Q35_MATMUL_MAX_PIECES) { /* callers pass 2-4 */
        matmul_job j = {h->k, n - i < Q35_MATMUL_MAX_PIECES ? n - i : Q35_MATMUL_MAX_PIECES,
                        ys + i, Ws + i, x, n_tok, 0, NULL, 0, 0};
        run_job(h, &j, matmul_worker);
    }
}

/* Each range a worker takes (blocks [b0, b1) of ROW_ALIGN rows) is the same
 * rows of gate and up: it computes both and applies silu(gate) * up to
 * those rows while they are still in its cache. */
static void swiglu_range(const matmul_job *j, int64_t b0, int64_t b1) {
    const int64_t I = j->Ws[0]->shape[0], lo = b0 * ROW_ALIGN, hi = b1 * ROW_ALIGN < I ? b1 * ROW_ALIGN : I;
    if (lo >= hi) return;
    const int64_t o0[2] = {lo, lo}, o1[2] = {hi, hi};
    j->k->matmul_n(2, j->ys, j->Ws, j->x, j->n_tok, o0, o1);
    for (int64_t t = 0; t < j->n_tok; t++)
        j->k->silu_mul(j->swiglu_out + t * I + lo, j->ys[0] + t * I + lo, j->ys[1] + t * I + lo, hi - lo);
}

static void swiglu_worker(void *p, int ith, int nth) {
    matmul_job *j = p;
    run_ranges(j, piece_blocks(j->Ws[0]), nth, swiglu_range);
}

void q35_mlp(const q35_host *h, float *out, float *gate, float *up, const q35_tensor *W_gate, const q35_tensor *W_up,
             const q35_tensor *W_down, const float *x, int64_t n_tok) {
    float *ys[2] = {gate, up};
    const q35_tensor *Ws[2] = {W_gate, W_up};
    matmul_job j = {h->k, 2, ys, Ws, x, n_tok, 0, gate, 0, 0};
    if (h->tap) h->tap(h->tap_ctx, 2, Ws, x, n_tok);
    run_job(h, &j, swiglu_worker);
    q35_matmul(h, out, W_down, gate, n_tok);
}

void q35_rmsnorm1p_to(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps) {
    q35_kernels_get()->rmsnorm1p(dst, src, w, n, eps);
}
