/* bandwidth.c: the machine's read-bandwidth ceiling, q35_read_bandwidth().
 *
 * One measurement for every program that quotes "% of bandwidth" (qwen35
 * speed, bench_kernels), so their percentages mean the same thing. Each
 * worker of a thread pool streams its own contiguous share of a 1 GiB
 * buffer with the chosen kernel table's read_stream (on AVX2 machines eight
 * independent ymm load chains), which is the best sequential read this code
 * knows how to issue; a matmul kernel reading its weights the same way can
 * reach it but not pass it. The buffer has ordinary 4 KiB pages, as the
 * weights mapped from the cache file have. Compiled without ISA flags. */
#include "backend/cpu/kernels/kernels.h"
#include "backend/cpu/threadpool.h"
#include "base/util.h"

#include <stdatomic.h>
#include <sys/mman.h>
#include <unistd.h>

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 5

typedef struct bw_job {
    uint8_t *buf;
    q35_read_stream_fn read;
    int touch;                 /* first pass: write the pages (each thread its own share) */
    _Atomic uint64_t checksum; /* keeps the reads alive */
} bw_job;

static void bw_worker(void *ctx, int ith, int nth) {
    bw_job *job = ctx;
    int64_t lo, hi;
    q35_split((int64_t)BW_BYTES, 4096, ith, nth, &lo, &hi);
    if (job->touch) {
        memset(job->buf + lo, ith + 1, (size_t)(hi - lo));
        return;
    }
    atomic_fetch_add_explicit(&job->checksum, job->read(job->buf + lo, (size_t)(hi - lo)), memory_order_relaxed);
}

q35_status q35_read_bandwidth(int32_t n_threads, double *gb_s, q35_error *err) {
    if (n_threads <= 0) n_threads = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    q35_pool *pool;
    q35_status st = q35_pool_new(n_threads, &pool, err);
    if (st != Q35_OK) return st;
    void *buf = mmap(NULL, BW_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        q35_pool_free(pool);
        return q35_fail(err, Q35_ERR_NOMEM, "read bandwidth: cannot map a %zu MiB buffer", BW_BYTES >> 20);
    }
    /* on huge pages where the kernel allows, as the engine's weights are by default */
    madvise(buf, BW_BYTES, MADV_HUGEPAGE);
    bw_job job = {.buf = buf, .read = q35_kernels_get()->read_stream, .touch = 1};
    q35_pool_run(pool, bw_worker, &job);
    job.touch = 0;
    double best = 0.0;
    for (int pass = 0; pass < BW_PASSES; pass++) {
        double t0 = q35_now_seconds();
        q35_pool_run(pool, bw_worker, &job);
        double dt = q35_now_seconds() - t0;
        if (dt > 0 && BW_BYTES / dt > best) best = BW_BYTES / dt;
    }
    munmap(buf, BW_BYTES);
    q35_pool_free(pool);
    *gb_s = best / 1e9;
    return Q35_OK;
}
