/* compute.c: parallel matmul over the thread pool (see compute.h). */
#include "compute.h"
#include "kernels/kernels.h"

typedef struct {
    const q35_kernels *k;
    float *y;
    const q35_tensor *W;
    const float *x;
    int64_t n_tok, n_out;
} matmul_job;

static void matmul_worker(void *p, int ith, int nth) {
    const matmul_job *j = p;
    int64_t lo, hi;
    q35_split(j->n_out, 64, ith, nth, &lo, &hi); /* 64: whole weight panels per worker */
    if (lo < hi) j->k->matmul(j->y, j->W, j->x, j->n_tok, lo, hi);
}

void q35_matmul(q35_pool *pool, float *y, const q35_tensor *W, const float *x, int64_t n_tok) {
    matmul_job j = {q35_kernels_get(), y, W, x, n_tok, W->shape[0]};
    double work = (double)j.n_out * (double)W->shape[W->ndim - 1] * (double)n_tok;
    if (work < 2e5 || !pool) matmul_worker(&j, 0, 1); /* too small to be worth a handoff */
    else q35_pool_run(pool, matmul_worker, &j);
}
