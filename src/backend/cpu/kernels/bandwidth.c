/* bandwidth.c: the machine's read-bandwidth ceiling, q35_read_bandwidth().
 *
 * One measurement for every program that quotes "% of bandwidth" (qwen35
 * speed, bench_kernels), so their percentages mean the same thing. Each
 * worker of a thread pool streams its own contiguous share of a 1 GiB
 * buffer with the chosen kernel table's read_stream (on AVX2 machines eight
 * independent ymm load chains), which is the best sequential read this code
 * knows how to issue; a matmul kernel reading its weights the same way can
 * reach it but not pass it. The buffer is on huge pages where the kernel
 * allows, as the engine's weights are by default. A probe
 * (q35_read_probe_new) keeps its buffer and threads, so that a benchmark can
 * measure again beside each of its steps. Compiled without ISA flags. */
#include "backend/cpu/kernels/kernels.h"
#include "backend/cpu/threadpool.h"
#include "base/util.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define BW_BYTES ((size_t)1 << 30)
#define BW_PASSES 5

struct q35_read_probe {
    q35_pool *pool;
    uint8_t *buf;
    size_t bytes;
    q35_read_stream_fn read;
    int touch;                 /* first pass: write the pages (each thread its own share) */
    _Atomic uint64_t checksum; /* keeps the reads alive */
};

static void probe_worker(void *ctx, int ith, int nth) {
    q35_read_probe *p = ctx;
    int64_t lo, hi;
    q35_split((int64_t)p->bytes, 4096, ith, nth, &lo, &hi);
    if (p->touch) {
        memset(p->buf + lo, ith + 1, (size_t)(hi - lo));
        return;
    }
    atomic_fetch_add_explicit(&p->checksum, p->read(p->buf + lo, (size_t)(hi - lo)), memory_order_relaxed);
}

q35_status q35_read_probe_new(int32_t n_threads, size_t bytes, q35_read_probe **out, q35_error *err) {
    *out = NULL;
    if (n_threads <= 0) n_threads = (int32_t)sysconf(_SC_NPROCESSORS_ONLN);
    if (n_threads < 1) n_threads = 1;
    bytes = bytes ? (bytes + 4095) & ~(size_t)4095 : BW_BYTES;
    q35_read_probe *p = calloc(1, sizeof *p);
    if (!p) return q35_fail(err, Q35_ERR_NOMEM, "read bandwidth: out of memory");
    p->bytes = bytes;
    q35_status st = q35_pool_new(n_threads, &p->pool, err);
    if (st != Q35_OK) {
        free(p);
        return st;
    }
    void *buf = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (buf == MAP_FAILED) {
        q35_pool_free(p->pool);
        free(p);
        return q35_fail(err, Q35_ERR_NOMEM, "read bandwidth: cannot map a %zu MiB buffer", bytes >> 20);
    }
    /* on huge pages where the kernel allows, as the engine's weights are by default */
    madvise(buf, bytes, MADV_HUGEPAGE);
    p->buf = buf, p->read = q35_kernels_get()->read_stream, p->touch = 1;
    q35_pool_run(p->pool, probe_worker, p);
    p->touch = 0;
    *out = p;
    return Q35_OK;
}

double q35_read_probe_run(q35_read_probe *p, int passes) {
    double best = 0.0;
    for (int pass = 0; pass < (passes > 0 ? passes : 1); pass++) {
        double t0 = q35_now_seconds();
        q35_pool_run(p->pool, probe_worker, p);
        double dt = q35_now_seconds() - t0;
        if (dt > 0 && p->bytes / dt > best) best = p->bytes / dt;
    }
    return best / 1e9;
}

void q35_read_probe_free(q35_read_probe *p) {
    if (!p) return;
    munmap(p->buf, p->bytes);
    q35_pool_free(p->pool);
    free(p);
}

q35_status q35_read_bandwidth(int32_t n_threads, double *gb_s, q35_error *err) {
    q35_read_probe *p;
    q35_status st = q35_read_probe_new(n_threads, BW_BYTES, &p, err);
    if (st != Q35_OK) return st;
    *gb_s = q35_read_probe_run(p, BW_PASSES);
    q35_read_probe_free(p);
    return Q35_OK;
}
