/* threadpool.c: persistent workers with a spin-then-sleep handoff (see
 * threadpool.h). One job at a time: q35_pool_run is not reentrant.
 *
 * Handoff: the caller publishes fn/ctx and bumps `epoch`; workers spin on
 * epoch for up to SPIN_NS, then sleep on it with a futex. The caller makes
 * the wake syscall only when some worker has gone to sleep. Completion is
 * the mirror image: workers count `pending` down, the caller spins on it for
 * up to SPIN_NS and then sleeps on it, and the last worker wakes it only if
 * it sleeps. Each "announce, then check the other side" pair uses seq_cst
 * operations, so a wake-up is never lost. */
#include "backend/cpu/threadpool.h"
#include "base/util.h"

#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Decode runs hundreds of jobs per token with microseconds between them;
 * sleeping and waking costs tens of microseconds on a VM. Spin this long
 * first, then sleep (so idle workers do not burn a core between requests). */
#define SPIN_NS 200000

struct q35_pool {
    int n;
    pthread_t *threads;
    _Alignas(64) atomic_uint epoch;  /* bumped to start a job; futex word for sleeping workers */
    atomic_int sleepers;             /* workers in (or about to enter) a futex wait on epoch */
    atomic_int quit;
    q35_pool_fn fn;
    void *ctx;
    _Alignas(64) atomic_uint pending; /* workers still running the current job; futex word for the caller */
    atomic_int caller_sleeps;
};

typedef struct { q35_pool *pool; int index; } worker_arg;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void futex_wait(atomic_uint *word, unsigned expected) {
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAIT_PRIVATE, expected, NULL, NULL, 0);
}

static void futex_wake_all(atomic_uint *word) {
    syscall(SYS_futex, (unsigned *)word, FUTEX_WAKE_PRIVATE, 0x7fffffff, NULL, NULL, 0);
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Spins until *word != value or SPIN_NS pass; returns the last value read.
 * The clock is read once per 64 pauses only. */
static unsigned spin_while_equal(atomic_uint *word, unsigned value) {
    int64_t deadline = 0;
    for (int i = 0;; i++) {
        unsigned v = atomic_load_explicit(word, memory_order_acquire);
        if (v != value) return v;
        if ((i & 63) == 63) {
            int64_t t = now_ns();
            if (!deadline) deadline = t + SPIN_NS;
            else if (t > deadline) return v;
        }
        cpu_relax();
    }
}

static void *worker_main(void *p) {
    worker_arg *wa = p;
    q35_pool *pool = wa->pool;
    int index = wa->index;
    free(wa);
    unsigned seen = 0;
    for (;;) {
        while (spin_while_equal(&pool->epoch, seen) == seen) {
            if (atomic_load(&pool->quit)) return NULL;
            atomic_fetch_add(&pool->sleepers, 1);
            /* the kernel re-checks epoch == seen before sleeping */
            if (atomic_load(&pool->epoch) == seen && !atomic_load(&pool->quit)) futex_wait(&pool->epoch, seen);
            atomic_fetch_sub(&pool->sleepers, 1);
        }
        seen = atomic_load_explicit(&pool->epoch, memory_order_acquire);
        if (atomic_load(&pool->quit)) return NULL;
        pool->fn(pool->ctx, index, pool->n);
        if (atomic_fetch_sub(&pool->pending, 1) == 1 && atomic_load(&pool->caller_sleeps))
            futex_wake_all(&pool->pending);
    }
}

q35_status q35_pool_new(int n_threads, q35_pool **out, q35_error *err) {
    *out = NULL;
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)c : 1;
    }
    if (n_threads > 1024) n_threads = 1024;
    q35_pool *pool = aligned_alloc(64, (sizeof *pool + 63) & ~(size_t)63);
    if (!pool) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    memset(pool, 0, sizeof *pool);
    pool->n = n_threads;
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
    atomic_store(&pool->quit, 1);
    atomic_fetch_add(&pool->epoch, 1);
    futex_wake_all(&pool->epoch);
    for (int i = 1; i < pool->n; i++) pthread_join(pool->threads[i], NULL);
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
    atomic_store(&pool->pending, (unsigned)(pool->n - 1));
    atomic_fetch_add(&pool->epoch, 1); /* releases fn, ctx and pending */
    if (atomic_load(&pool->sleepers) > 0) futex_wake_all(&pool->epoch);
    fn(ctx, 0, pool->n);
    for (;;) {
        unsigned left = atomic_load(&pool->pending);
        if (!left) break;
        if (spin_while_equal(&pool->pending, left) != left) continue; /* progress: keep spinning */
        atomic_store(&pool->caller_sleeps, 1); /* no progress for SPIN_NS: sleep until the last one ends */
        if ((left = atomic_load(&pool->pending)) != 0) futex_wait(&pool->pending, left);
        atomic_store(&pool->caller_sleeps, 0);
    }
}

void q35_split(int64_t n, int64_t align, int ith, int nth, int64_t *lo, int64_t *hi) {
    if (align < 1) align = 1;
    int64_t blocks = (n + align - 1) / align;
    int64_t b0 = blocks * ith / nth, b1 = blocks * (ith + 1) / nth;
    *lo = b0 * align < n ? b0 * align : n;
    *hi = b1 * align < n ? b1 * align : n;
}

int q35_claim(_Atomic int64_t *next, int64_t n, int nth, int64_t *lo, int64_t *hi) {
    int64_t cur = atomic_load_explicit(next, memory_order_relaxed);
    for (;;) {
        if (cur >= n) return 0;
        int64_t c = nth > 1 ? (n - cur) / (2 * nth) : n - cur;
        if (c < 1) c = 1;
        if (atomic_compare_exchange_weak_explicit(next, &cur, cur + c, memory_order_relaxed, memory_order_relaxed)) {
            *lo = cur, *hi = cur + c;
            return 1;
        }
    }
}

void q35_homes_init(q35_homes *h, int64_t n, int nth) {
    h->parts = nth < n ? nth : (int)n;
    if (h->parts > Q35_HOMES_MAX) h->parts = Q35_HOMES_MAX;
    for (int p = 0; p < h->parts; p++) {
        int64_t lo, hi;
        q35_split(n, 1, p, h->parts, &lo, &hi);
        atomic_init(&h->r[p], (uint64_t)hi << 32 | (uint64_t)lo);
    }
}

/* [*lo, *hi) from home r: its front half (front) or its last item. */
static int homes_take(_Atomic uint64_t *r, int front, int64_t *lo, int64_t *hi) {
    uint64_t cur = atomic_load_explicit(r, memory_order_relaxed);
    for (;;) {
        const uint32_t a = (uint32_t)cur, b = (uint32_t)(cur >> 32);
        if (a >= b) return 0;
        const uint32_t n = front ? (b - a + 1) / 2 : 1;
        const uint64_t left = front ? (uint64_t)b << 32 | (a + n) : (uint64_t)(b - 1) << 32 | a;
        if (atomic_compare_exchange_weak_explicit(r, &cur, left, memory_order_relaxed, memory_order_relaxed)) {
            *lo = front ? a : b - 1, *hi = front ? a + n : b;
            return 1;
        }
    }
}

int q35_homes_claim(q35_homes *h, int ith, int64_t *lo, int64_t *hi) {
    if (ith < h->parts && homes_take(&h->r[ith], 1, lo, hi)) return 1;
    for (int d = 1; d <= h->parts; d++) {
        const int p = (ith + d) % h->parts;
        if (p != ith && homes_take(&h->r[p], 0, lo, hi)) return 1;
    }
    return 0;
}
