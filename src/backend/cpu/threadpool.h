/* threadpool.h: a persistent pool of worker threads for the forward pass.
 *
 * q35_pool_run(pool, fn, ctx) calls fn(ctx, i, n) once for every i in
 * 0..n-1 (the calling thread is worker 0) and returns when all are done.
 * Results must not depend on scheduling: work is split by worker index,
 * or claimed by whichever worker is free (compute.c's matmuls, the Gated
 * DeltaNet's heads, attention's units), where which worker computes an item
 * does not change its value. Threads are created once, at pool creation: the
 * token loop creates none. Workers spin briefly between jobs (decode runs
 * hundreds of jobs per token) and then sleep on a futex. */
#ifndef Q35_THREADPOOL_H
#define Q35_THREADPOOL_H

#include "qwen35.h"

#include <stdatomic.h>

typedef struct q35_pool q35_pool;
typedef void (*q35_pool_fn)(void *ctx, int ith, int nth);

/* n_threads <= 0: one per online CPU. */
q35_status q35_pool_new(int n_threads, q35_pool **out, q35_error *err);
void q35_pool_free(q35_pool *pool);
int q35_pool_size(const q35_pool *pool);
void q35_pool_run(q35_pool *pool, q35_pool_fn fn, void *ctx);

/* [lo, hi) of n items for worker ith of nth, in multiples of `align`
 * (except the end), so that every worker gets a contiguous, fixed range. */
void q35_split(int64_t n, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi);

/* Claims the calling worker's next range [*lo, *hi) of a job's n items from
 * *next (0 when the job starts): a quarter of what is left for two workers
 * (1 / (2 nth) of it), at least one, so the claims shrink towards the end
 * (guided scheduling) and a worker slowed by something else on its core
 * leaves its share to the others instead of holding them at the job's end.
 * A worker's ranges come in increasing order. Returns 0 when nothing is
 * left. */
int q35_claim(_Atomic int64_t *next, int64_t n, int nth, int64_t *lo, int64_t *hi);

/* The next of a job's n items from *next, one at a time (the Gated
 * DeltaNet's heads and attention's units: large items; for the heads, whose
 * worker prefetches the state of the item it expects next, q35_claim's
 * ranges took 3.9-4.1 against 3.5-3.6 ms of a two-thread decode step, two
 * interleaved rounds); -1 when none is left. */
static inline int64_t q35_claim_one(_Atomic int64_t *next, int64_t n) {
    const int64_t i = atomic_fetch_add_explicit(next, 1, memory_order_relaxed);
    return i < n ? i : -1;
}

/* Items split into fixed home ranges, one per worker (q35_split's), that
 * the others may steal from: for a job whose worker keeps what it computed
 * in its cache for its own next step (the Gated DeltaNet's layer of a decode
 * step: gdn.c), so each worker should run its own share, but a worker slowed
 * by another tenant of its core must not hold the job. */
#define Q35_HOMES_MAX 64
typedef struct q35_homes {
    int parts;                          /* homes: min(nth, n, Q35_HOMES_MAX) */
    _Atomic uint64_t r[Q35_HOMES_MAX];  /* each home's items left: lo in the low 32 bits, hi in the high */
} q35_homes;

/* n items (< 2^31) for nth workers. */
void q35_homes_init(q35_homes *h, int64_t n, int nth);
/* The calling worker's next range [*lo, *hi): from the front of its own
 * home, half of what is left there (at least one), in increasing order;
 * once that is empty, one item at a time from the back of the others',
 * starting with home (ith + 1) % parts. Workers without a home (ith >= parts)
 * only steal. Returns 0 when every home is empty. */
int q35_homes_claim(q35_homes *h, int ith, int64_t *lo, int64_t *hi);

#endif
