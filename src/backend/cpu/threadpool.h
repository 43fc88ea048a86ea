/* threadpool.h: a persistent pool of worker threads for the forward pass.
 *
 * q35_pool_run(pool, fn, ctx) calls fn(ctx, i, n) once for every i in
 * 0..n-1 (the calling thread is worker 0) and returns when all are done.
 * Results must not depend on scheduling: work is split by worker index,
 * or (compute.c's matmuls of up to 8 tokens) claimed by whichever worker
 * is free, where which worker computes an item does not change its value. Threads are created once, at pool creation: the
 * token loop creates none. Workers spin briefly between jobs (decode runs
 * hundreds of jobs per token) and then sleep on a futex. */
#ifndef Q35_THREADPOOL_H
#define Q35_THREADPOOL_H

#include "qwen35.h"

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

#endif
