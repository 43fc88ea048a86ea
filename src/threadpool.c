/* threadpool.c: persistent workers with a spin-then-sleep handoff (see
 * threadpool.h). One job at a time: q35_pool_run is not reentrant. */
#include "threadpool.h"
#include "util.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

#define SPIN_ITERS 20000 /* about tens of microseconds before sleeping */

struct q35_pool {
    int n;
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint generation; /* bumped to start a job */
    atomic_int pending;     /* workers still running the current job */
    atomic_int quit;
    q35_pool_fn fn;
    void *ctx;
};

typedef struct { q35_pool *pool; int index; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    q35_pool *pool = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->generation, memory_order_acquire)) == seen) {
            if (atomic_load(&pool->quit)) return NULL;
            if (++spins < SPIN_ITERS) { cpu_relax(); continue; }
            pthread_mutex_lock(&pool->mu);
            while (atomic_load(&pool->generation) == seen && !atomic_load(&pool->quit)) pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
            spins = 0;
        }
        seen = g;
        pool->fn(pool->ctx, index, pool->n);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_acq_rel);
    }
}

q35_status q35_pool_new(int n_threads, q35_pool **out, q35_error *err) {
    *out = NULL;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 1024) n_threads = 1024;
    q35_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    pool->n = n_threads;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    pool->threads = calloc((size_t)n_threads, sizeof *pool->threads);
    if (!pool->threads) { free(pool); return q35_fail(err, Q35_ERR_NOMEM, "out of memory"); }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof *wa);
        if (wa) { wa->pool = pool; wa->index = i; }
        if (!wa || pthread_create(&pool->threads[i], NULL, worker_main, wa) != 0) {
            free(wa);
            pool->n = i; /* the ones started so far are joined by free */
            q35_pool_free(pool);
            return q35_fail(err, Q35_ERR_NOMEM, "cannot start worker thread %d of %d", i, n_threads);
        }
    }
    *out = pool;
    return Q35_OK;
}

void q35_pool_free(q35_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->quit, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->threads);
    free(pool);
}

int q35_pool_size(const q35_pool *pool) { return pool ? pool->n : 1; }

void q35_pool_run(q35_pool *pool, q35_pool_fn fn, void *ctx) {
    if (!pool || pool->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n - 1, memory_order_release);
    pthread_mutex_lock(&pool->mu);
    atomic_fetch_add_explicit(&pool->generation, 1, memory_order_acq_rel);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    fn(ctx, 0, pool->n);
    /* spin while the others are likely running; yield once they may have
     * been descheduled (more threads than free cores) */
    for (int spins = 0; atomic_load_explicit(&pool->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ITERS) cpu_relax();
        else sched_yield();
    }
}

void q35_split(int64_t n, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi) {
    if (align < 1) align = 1;
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}
