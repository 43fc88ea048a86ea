/* bench_kernels.c: speed of the matmul kernels, and the layout comparison
 * behind bfp.h's choice of 16-row panels.
 *
 * Build and run:  make build/bench_kernels && build/bench_kernels [--quick] [--json FILE]
 *                 build/bench_kernels --attention 8192,32768
 *
 * What it measures, on a [n_out = 12288, n_in = 4096] matrix (the MLP up /
 * gate shape of Qwen3.5-9B):
 *  1. the read-bandwidth ceiling, 1 and 2 threads (q35_read_bandwidth, the
 *     same figure qwen35 speed quotes);
 *  2. decode GEMV (n_tok = 1) per kernel table and dtype, 1 and 2 threads,
 *     in GB/s of weight bytes and % of the ceiling. Enough copies of the
 *     matrix are cycled that every call reads DRAM, as a forward pass does;
 *     threads split the rows (aligned to 16) and meet at a spin barrier
 *     after every call, as the forward pass will;
 *  3. small batches: time of n_tok = 2, 4, 8 relative to n_tok = 1;
 *  4. prefill: GFLOP/s at n_tok = 64 (2 * n_out * n_in * n_tok flops),
 *     for bfp weights also as a share of the int8 peak: the multiply-add
 *     rate of a loop of nothing but the tile's int8 dot instructions
 *     (avx2: vpmaddubsw and a 16-bit add per 32 products, 6 independent
 *     chains; avx512: vpdpbusd, 64 products, 12 chains), 1 and 2 threads,
 *     measured at the start and again beside each prefill figure (the
 *     share is against the best of the run);
 *  5. the layout comparison: bfp4 in 16-row panels (the library's layout and
 *     AVX2 kernel) against two other bfp4 layouts with AVX2 kernels written
 *     for them here: row-major with blocks along K ([n_out][n_blk exponents
 *     | n_in / 2 bytes of codes], int8 dot products like the library), and
 *     TT's own orientation with blocks along N (16-output panels, fp32 x,
 *     the layout a TT cache maps to without re-encoding).
 * With --attention DEPTH,... it measures only attention over a long cache
 * instead: one decode token's full-attention work at the 9B's shapes (8
 * layers x 4 KV heads of 4 query heads, head dim 256) over DEPTH positions,
 * fp32 and 8-bit rows, per table, 1 and 2 threads (ms per token, ns per key
 * and KV head, GB/s of cache read).
 * Every line is also written as one JSON object per line with --json. */
#include "formats/bfp.h"
#include "formats/kv_q8.h"
#include "backend/cpu/kernels/kernels.h"
#include "base/util.h"

#include <immintrin.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#define N_OUT 12288
#define N_IN 4096
#define TARGET_AVX2 __attribute__((target("avx2,fma")))

static FILE *g_json;
static double g_ceiling[3]; /* GB/s by thread count */
static int g_quick;

/* ---- threads: one helper plus the caller, a spin barrier per call ---- */

typedef struct spin_barrier {
    atomic_int count, gen;
    int n;
} spin_barrier;

static void barrier_wait(spin_barrier *b) {
    if (b->n == 1) return;
    int g = atomic_load(&b->gen);
    if (atomic_fetch_add(&b->count, 1) == b->n - 1) {
        atomic_store(&b->count, 0);
        atomic_fetch_add(&b->gen, 1);
    } else {
        while (atomic_load(&b->gen) == g) __builtin_ia32_pause();
    }
}

typedef void (*work_fn)(void *ctx, int copy, int64_t o0, int64_t o1);

typedef struct run {
    work_fn fn;
    void *ctx;
    int n_copies, reps, n_threads;
    int64_t n_rows;
    spin_barrier bar;
} run;

typedef struct worker { run *r; int ith; } worker;

static void *worker_main(void *v) {
    worker *w = v;
    run *r = w->r;
    /* split rows evenly, aligned to 16 (one bfp panel) */
    int64_t per = (r->n_rows / 16 + r->n_threads - 1) / r->n_threads * 16;
    int64_t o0 = per * w->ith, o1 = o0 + per < r->n_rows ? o0 + per : r->n_rows;
    barrier_wait(&r->bar);
    for (int rep = 0; rep < r->reps; rep++)
        for (int c = 0; c < r->n_copies; c++) {
            if (o0 < o1) r->fn(r->ctx, c, o0, o1);
            barrier_wait(&r->bar);
        }
    return NULL;
}

/* Seconds per call (one matrix copy), best of several trials. */
static double time_calls(work_fn fn, void *ctx, int n_copies, int64_t n_rows, int n_threads) {
    int trials = g_quick ? 3 : 7;
    double best = 1e30;
    for (int trial = 0; trial < trials; trial++) {
        run r = {.fn = fn, .ctx = ctx, .n_copies = n_copies, .reps = 1, .n_threads = n_threads, .n_rows = n_rows};
        r.bar.n = n_threads;
        pthread_t th;
        worker ws[2] = {{&r, 0}, {&r, 1}};
        if (n_threads == 2 && pthread_create(&th, NULL, worker_main, &ws[1]) != 0) return -1;
        double t0 = q35_now_seconds();
        worker_main(&ws[0]);
        double dt = q35_now_seconds() - t0;
        if (n_threads == 2) pthread_join(th, NULL);
        if (dt / n_copies < best) best = dt / n_copies;
    }
    return best;
}

/* ---- the read ceiling: the library's measurement, as qwen35 speed's ---- */

static void measure_ceiling(void) {
    for (int nt = 1; nt <= 2; nt++) {
        q35_error err = {0};
        if (q35_read_bandwidth(nt, &g_ceiling[nt], &err) != Q35_OK) {
            fprintf(stderr, "%s\n", err.msg);
            exit(1);
        }
        printf("read ceiling      %d thread%s  %6.1f GB/s\n", nt, nt > 1 ? "s" : " ", g_ceiling[nt]);
        if (g_json) fprintf(g_json, "{\"what\":\"read_ceiling\",\"threads\":%d,\"gbps\":%.2f}\n", nt, g_ceiling[nt]);
    }
}

/* ---- the int8 peak: the dot instructions alone, in independent chains ---- */

static double g_int8_peak[2][3]; /* [avx2, avx512][threads]: GOP/s, 2 per product */
#define PEAK_ITERS 4000000L
#define PEAK_REPS 15

/* A pure vpmaddubsw loop (32 products each, summed in 16-bit lanes as the 4-bit tiles sum theirs
 * before they widen), in six independent chains. Each chain's operand passes an empty asm each
 * time, so the compiler can neither hoist the products out of the loop nor share them among the
 * chains (with one operand for all it formed them once per iteration, and the loop measured
 * vpaddd and spills). On a Zen 3 core vpmaddubsw and vpmaddwd share one pipe: a product summed
 * into 32-bit lanes (both) takes twice as long as here. */
#define PEAK_AVX2_STEP(x, a)                                                                         \
    __asm__ volatile("" : "+x"(x));                                                                  \
    a = _mm256_add_epi16(a, _mm256_maddubs_epi16(w, x));
#define PEAK_AVX2_CHAINS 6
TARGET_AVX2 static void *peak_avx2(void *sink) {
    const __m256i w = _mm256_set1_epi8(3);
    __m256i a0 = _mm256_set1_epi32(0), a1 = _mm256_set1_epi32(1), a2 = _mm256_set1_epi32(2);
    __m256i a3 = _mm256_set1_epi32(3), a4 = _mm256_set1_epi32(4), a5 = _mm256_set1_epi32(5);
    __m256i x0 = _mm256_set1_epi8(1), x1 = _mm256_set1_epi8(2), x2 = _mm256_set1_epi8(3);
    __m256i x3 = _mm256_set1_epi8(4), x4 = _mm256_set1_epi8(5), x5 = _mm256_set1_epi8(6);
    for (long it = 0; it < PEAK_ITERS; it++) {
        PEAK_AVX2_STEP(x0, a0) PEAK_AVX2_STEP(x1, a1) PEAK_AVX2_STEP(x2, a2)
        PEAK_AVX2_STEP(x3, a3) PEAK_AVX2_STEP(x4, a4) PEAK_AVX2_STEP(x5, a5)
    }
    a0 = _mm256_add_epi32(_mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3)), _mm256_add_epi32(a4, a5));
    _mm256_storeu_si256(sink, a0);
    return NULL;
}

__attribute__((target("avx512f,avx512bw,avx512vnni"))) static void *peak_avx512(void *sink) {
    __m512i acc[12], w = _mm512_set1_epi8(3);
    for (int i = 0; i < 12; i++) acc[i] = _mm512_set1_epi32(i);
    for (long it = 0; it < PEAK_ITERS; it++) {
        __m512i x = _mm512_set1_epi32((int)it);
        #pragma GCC unroll 12
        for (int i = 0; i < 12; i++) acc[i] = _mm512_dpbusd_epi32(acc[i], w, x);
    }
    for (int i = 1; i < 12; i++) acc[0] = _mm512_add_epi32(acc[0], acc[i]);
    _mm512_storeu_si512(sink, acc[0]);
    return NULL;
}

/* GOP/s of g_peak_fn[isa] on nt threads, the least time of PEAK_REPS runs of a few ms each, folded into
 * g_int8_peak[isa][nt] as a running maximum: on a shared host a slow spell can last through all the
 * runs (it once put two threads' peak below the prompt tile's rate beside it), so the prompt tile's
 * share is taken against the best peak measured in the whole run, the peak being measured again
 * right beside each prompt figure. */
static void *(*const g_peak_fn[2])(void *) = {peak_avx2, peak_avx512};
static double int8_peak_update(int isa, int nt) {
    static int32_t sink[2][16] __attribute__((aligned(64)));
    const double products[2] = {PEAK_AVX2_CHAINS * 32.0 * PEAK_ITERS, 12.0 * 64 * PEAK_ITERS};
    double best = 1e30;
    for (int rep = 0; rep < PEAK_REPS; rep++) {
        pthread_t th;
        double t0 = q35_now_seconds();
        if (nt == 2 && pthread_create(&th, NULL, g_peak_fn[isa], sink[1]) != 0) break;
        g_peak_fn[isa](sink[0]);
        if (nt == 2) pthread_join(th, NULL);
        double dt = q35_now_seconds() - t0;
        if (dt < best) best = dt;
    }
    const double gops = 2.0 * products[isa] * nt / best / 1e9;
    if (gops > g_int8_peak[isa][nt]) g_int8_peak[isa][nt] = gops;
    return g_int8_peak[isa][nt];
}

static void measure_int8_peak(void) {
    const char *name[2] = {"avx2", "avx512"};
    for (int isa = 0; isa < 2; isa++) {
        if (isa == 0 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")))
            continue; /* g_int8_peak stays 0: no share is printed, no loop runs again */
        if (isa == 1 && !(__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vnni")))
            continue;
        for (int nt = 1; nt <= 2; nt++) {
            int8_peak_update(isa, nt);
            printf("int8 peak %-6s  %d thread%s  %6.1f GOP/s\n", name[isa], nt, nt > 1 ? "s" : " ", g_int8_peak[isa][nt]);
            if (g_json)
                fprintf(g_json, "{\"what\":\"int8_peak\",\"isa\":\"%s\",\"threads\":%d,\"gops\":%.1f}\n", name[isa],
                        nt, g_int8_peak[isa][nt]);
        }
    }
}

/* ---- the library's kernels ---- */

typedef struct mm_ctx {
    const q35_kernels *k;
    q35_tensor *W; /* n_copies copies */
    const float *x;
    float *y;
    int64_t n_tok;
} mm_ctx;

static void mm_work(void *v, int copy, int64_t o0, int64_t o1) {
    mm_ctx *c = v;
    q35_kernels_matmul(c->k, c->y, &c->W[copy], c->x, c->n_tok, o0, o1);
}

static uint64_t g_rng = 88172645463325252ull;
static float rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) / 16777216.0 * 2.0 - 1.0);
}

/* Weights on huge pages where the kernel allows, as the engine's are by
 * default (2 MiB aligned, MADV_HUGEPAGE); free() releases it. */
static void *weights_alloc(size_t bytes) {
    void *p = NULL;
    size_t len = (bytes + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
    if (posix_memalign(&p, (size_t)2 << 20, len)) return NULL;
    madvise(p, len, MADV_HUGEPAGE);
    return p;
}

/* n_copies copies of one random matrix in dt, enough to overflow the caches. */
static q35_tensor *make_copies(q35_dtype dt, const float *w, int *n_copies_out) {
    size_t nb = dt == Q35_DT_BFP4 || dt == Q35_DT_BFP8 ? q35_bfp_tensor_bytes(dt, N_OUT, N_IN)
                : (size_t)N_OUT * N_IN * (dt == Q35_DT_F32 ? 4 : 2);
    int n_copies = (int)(((size_t)(g_quick ? 256 : 384) << 20) / nb) + 1;
    q35_tensor *W = calloc((size_t)n_copies, sizeof *W);
    uint8_t *first = weights_alloc(nb);
    if (!W || !first) return NULL;
    if (dt == Q35_DT_BFP4 || dt == Q35_DT_BFP8) {
        if (q35_bfp_pack_matrix(dt, first, nb, w, Q35_DT_F32, N_OUT, N_IN, 0, NULL) != Q35_OK) return NULL;
    } else {
        for (size_t i = 0; i < (size_t)N_OUT * N_IN; i++) {
            if (dt == Q35_DT_F32) ((float *)first)[i] = w[i];
            else if (dt == Q35_DT_BF16) ((uint16_t *)first)[i] = q35_f32_to_bf16(w[i]);
            else ((uint16_t *)first)[i] = q35_f32_to_f16(w[i]);
        }
    }
    for (int c = 0; c < n_copies; c++) {
        uint8_t *p = first;
        if (c) {
            p = weights_alloc(nb);
            if (!p) return NULL;
            memcpy(p, first, nb);
        }
        W[c] = (q35_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {N_OUT, N_IN}, .data = p, .nbytes = nb};
    }
    *n_copies_out = n_copies;
    return W;
}

static void free_copies(q35_tensor *W, int n) {
    for (int c = 0; c < n; c++) free((void *)W[c].data);
    free(W);
}

static void bench_table(const q35_kernels *k, q35_dtype dt, const float *w, const float *x, float *y) {
    int n_copies;
    q35_tensor *W = make_copies(dt, w, &n_copies);
    if (!W) { fprintf(stderr, "out of memory\n"); return; }
    double bytes = (double)W[0].nbytes;
    mm_ctx c = {.k = k, .W = W, .x = x, .y = y, .n_tok = 1};
    /* In-cache speed of one core: the first rows of one copy (about 256 KiB,
     * in L2; whole groups of bfp panels, as decode reads them), called
     * repeatedly. Above the DRAM figure means decode is bandwidth-bound on
     * this core. */
    int64_t hot_rows = (int64_t)(((size_t)256 << 10) / (W[0].nbytes / N_OUT)) / 64 * 64;
    if (hot_rows < 64) hot_rows = 64; /* BFP8: 60 rows of 4352 bytes make 256 KiB */
    mm_ctx hot = c;
    hot.W = calloc(64, sizeof *hot.W);
    if (!hot.W) return;
    for (int i = 0; i < 64; i++) hot.W[i] = W[0];
    double th = time_calls(mm_work, &hot, 64, hot_rows, 1);
    double hot_gbps = bytes * hot_rows / N_OUT / th / 1e9;
    hot.n_tok = 2; /* a verify step's or a batch of two's */
    double th2 = time_calls(mm_work, &hot, 64, hot_rows, 1);
    double hot2_gbps = bytes * hot_rows / N_OUT / th2 / 1e9;
    free(hot.W);
    printf("%-6s %-4s in cache, 1 thread: %6.1f GB/s (%.1f G weights/s); 2 tokens %6.1f GB/s\n", k->name,
           q35_dtype_name(dt), hot_gbps, (double)hot_rows * N_IN / th / 1e9, hot2_gbps);
    if (g_json)
        fprintf(g_json, "{\"what\":\"gemv_in_cache\",\"kernels\":\"%s\",\"dtype\":\"%s\",\"threads\":1,\"gbps\":%.2f,"
                "\"gbps_ntok2\":%.2f}\n", k->name, q35_dtype_name(dt), hot_gbps, hot2_gbps);
    for (int nt = 1; nt <= 2; nt++) {
        c.n_tok = 1;
        double t1 = time_calls(mm_work, &c, n_copies, N_OUT, nt);
        double gbps = bytes / t1 / 1e9;
        printf("%-6s %-4s gemv  %d thread%s  %6.1f GB/s  %5.1f%% of ceiling  %7.3f ms", k->name, q35_dtype_name(dt), nt,
               nt > 1 ? "s" : " ", gbps, 100.0 * gbps / g_ceiling[nt], t1 * 1e3);
        if (g_json)
            fprintf(g_json, "{\"what\":\"gemv\",\"kernels\":\"%s\",\"dtype\":\"%s\",\"threads\":%d,\"gbps\":%.2f,"
                    "\"pct_ceiling\":%.1f,\"ms\":%.4f", k->name, q35_dtype_name(dt), nt, gbps,
                    100.0 * gbps / g_ceiling[nt], t1 * 1e3);
        printf("  n_tok 2/4/8 cost:");
        for (int n_tok = 2; n_tok <= 8; n_tok *= 2) {
            c.n_tok = n_tok;
            double tn = time_calls(mm_work, &c, n_copies, N_OUT, nt);
            printf(" %.2f", tn / t1);
            if (g_json) fprintf(g_json, ",\"cost_ntok%d\":%.3f", n_tok, tn / t1);
        }
        /* prefill: one matrix, compute-bound */
        c.n_tok = 64;
        double tp = time_calls(mm_work, &c, 1, N_OUT, nt);
        double gflops = 2.0 * N_OUT * N_IN * 64 / tp / 1e9;
        printf("  prefill(64) %6.1f GFLOP/s", gflops);
        if (g_json) fprintf(g_json, ",\"prefill64_gflops\":%.1f", gflops);
        const int isa = strncmp(k->name, "avx512", 6) == 0;
        const double peak = (dt == Q35_DT_BFP4 || dt == Q35_DT_BFP8) && g_int8_peak[isa][nt] > 0
                                ? int8_peak_update(isa, nt)
                                : 0;
        if (peak > 0) {
            printf(" (%.0f%% of int8 peak)", 100.0 * gflops / peak);
            if (g_json) fprintf(g_json, ",\"pct_int8_peak\":%.1f,\"int8_peak_gops\":%.1f", 100.0 * gflops / peak, peak);
        }
        printf("\n");
        if (g_json) fprintf(g_json, "}\n");
        fflush(stdout);
    }
    free_copies(W, n_copies);
}

/* ---- other bfp4 layouts, for comparison ----
 * Both alternatives get an AVX2 kernel written for them here, and run
 * through the same harness as the library's panels. */

typedef struct layout_ctx {
    uint8_t **copies;
    const float *x;
    float *y;
    int8_t *xq; /* x quantized once up front (the library pays that per call) */
    float *xd;
    int32_t *xs;
    float pow2[256]; /* 2^(E - 129) */
} layout_ctx;

static void quantize_x_scalar(const float *x, int64_t n, int8_t *q, float *d, int32_t *s) {
    for (int64_t b = 0; b < n / 16; b++) {
        float amax = 0.0f;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[16 * b + i]));
        float inv = amax > 0 ? 127.0f / amax : 0.0f;
        int32_t sum = 0;
        for (int i = 0; i < 16; i++) sum += q[16 * b + i] = (int8_t)lrintf(x[16 * b + i] * inv);
        d[b] = amax / 127.0f;
        s[b] = sum;
    }
}

/* Row-major, blocks along K: row r is n_blk exponent bytes, then n_in / 2
 * bytes of codes, byte j holding inputs 2j (low nibble) and 2j + 1 (high). */
#define ROWMAJOR_ROW_BYTES (N_IN / 16 + N_IN / 2)

static void rowmajor_pack(uint8_t *dst, const float *w) {
    for (int64_t r = 0; r < N_OUT; r++) {
        uint8_t *row = dst + (size_t)r * ROWMAJOR_ROW_BYTES;
        for (int b = 0; b < N_IN / 16; b++) {
            uint32_t bits[16];
            uint8_t codes[16];
            memcpy(bits, w + r * N_IN + 16 * b, sizeof bits);
            row[b] = q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
            for (int j = 0; j < 8; j++) row[N_IN / 16 + 8 * b + j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
        }
    }
}

TARGET_AVX2 static void rowmajor_work(void *vctx, int copy, int64_t o0, int64_t o1) {
    layout_ctx *c = vctx;
    const int8_t *q = c->xq;
    const float *d = c->xd;
    const int32_t *s = c->xs;
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_setr_epi8(8, 9, 10, 11, 12, 13, 14, 15, 8, 7, 6, 5, 4, 3, 2, 1));
    const __m256i nib = _mm256_set1_epi8(0x0f), ones = _mm256_set1_epi16(1);
    for (int64_t r = o0; r < o1; r++) {
        const uint8_t *row = c->copies[copy] + (size_t)r * ROWMAJOR_ROW_BYTES;
        const uint8_t *exps = row, *codes = row + N_IN / 16;
        __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}; /* two FMA chains */
        for (int b8 = 0; b8 < N_IN / 16; b8 += 8) {
            /* scales of 8 blocks: x's d times 2^(E - 129) as two exact powers of two */
            __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(exps + b8)));
            __m256i half = _mm256_srli_epi32(e, 1);
            __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(63)), 23));
            __m256 p2 = _mm256_castsi256_ps(
                _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(e, half), _mm256_set1_epi32(62)), 23));
            __m256 sc8 = _mm256_mul_ps(_mm256_mul_ps(p1, p2), _mm256_loadu_ps(d + b8));
            /* 4 lanes per block: the offset 8 * sum(q) is 2 * sum per lane */
            __m256i corr8 = _mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)(s + b8)), 1);
            #pragma GCC unroll 4
            for (int pair = 0; pair < 4; pair++) {
                int b = b8 + 2 * pair;
                __m128i v = _mm_loadu_si128((const __m128i *)(codes + 8 * b));
                __m128i lo = _mm_and_si128(v, _mm256_castsi256_si128(nib));
                __m128i hi = _mm_and_si128(_mm_srli_epi16(v, 4), _mm256_castsi256_si128(nib));
                __m256i w = _mm256_set_m128i(_mm_unpackhi_epi8(lo, hi), _mm_unpacklo_epi8(lo, hi));
                w = _mm256_shuffle_epi8(lut, w);
                __m256i xv = _mm256_loadu_si256((const __m256i *)(q + 16 * b));
                __m256i dot = _mm256_madd_epi16(_mm256_maddubs_epi16(w, xv), ones);
                __m256i idx = _mm256_setr_epi32(2 * pair, 2 * pair, 2 * pair, 2 * pair, 2 * pair + 1, 2 * pair + 1,
                                                2 * pair + 1, 2 * pair + 1);
                __m256i corr = _mm256_permutevar8x32_epi32(corr8, idx);
                __m256 sc = _mm256_permutevar8x32_ps(sc8, idx);
                acc[pair & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(dot, corr)), sc, acc[pair & 1]);
            }
        }
        __m256 sum = _mm256_add_ps(acc[0], acc[1]);
        __m128 h = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
        h = _mm_hadd_ps(h, h);
        h = _mm_hadd_ps(h, h);
        c->y[r] = _mm_cvtss_f32(h);
    }
}

/* TT's orientation, blocks along N (the outputs), in 16-output panels:
 * panel p is n_in exponent bytes (one per input k), then n_in x 8 bytes of
 * codes, byte j of input k holding outputs 16p + 2j (low) and 2j + 1 (high).
 * A lossless reordering of TT tiles, so a TT cache could be used as is; x
 * stays in fp32 and each k is a scalar times 16 decoded weights. */
#define TT_PANEL_BYTES ((size_t)N_IN * 9)

static void tt_pack(uint8_t *dst, const float *w) {
    for (int64_t p = 0; p < N_OUT / 16; p++) {
        uint8_t *panel = dst + (size_t)p * TT_PANEL_BYTES;
        for (int64_t k = 0; k < N_IN; k++) {
            uint32_t bits[16];
            uint8_t codes[16];
            for (int j = 0; j < 16; j++) memcpy(&bits[j], w + (16 * p + j) * N_IN + k, 4);
            panel[k] = q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
            for (int j = 0; j < 8; j++) panel[N_IN + 8 * k + j] = (uint8_t)(codes[2 * j] | codes[2 * j + 1] << 4);
        }
    }
}

TARGET_AVX2 static void tt_work(void *vctx, int copy, int64_t o0, int64_t o1) {
    layout_ctx *c = vctx;
    const __m256 mag = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
    const __m256i sign_bit = _mm256_set1_epi32(8), nib = _mm256_set1_epi32(0x0f);
    for (int64_t p = o0 / 16; p < o1 / 16; p++) {
        const uint8_t *exps = c->copies[copy] + (size_t)p * TT_PANEL_BYTES, *codes = exps + N_IN;
        /* even / odd outputs, two k-chains each */
        __m256 acc[2][2] = {{_mm256_setzero_ps(), _mm256_setzero_ps()}, {_mm256_setzero_ps(), _mm256_setzero_ps()}};
        for (int64_t k8 = 0; k8 < N_IN; k8 += 8) {
            /* x[k] * 2^(E_k - 129) for 8 inputs at once, then broadcast from memory */
            float s8[8];
            __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(exps + k8)));
            _mm256_storeu_ps(s8, _mm256_mul_ps(_mm256_loadu_ps(c->x + k8), _mm256_i32gather_ps(c->pow2, e, 4)));
            #pragma GCC unroll 8
            for (int kk = 0; kk < 8; kk++) {
                int64_t k = k8 + kk;
                __m256 s = _mm256_broadcast_ss(&s8[kk]);
                __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8 * k)));
                __m256i lo = _mm256_and_si256(v, nib), hi = _mm256_srli_epi32(v, 4);
                /* magnitude by table (vpermps reads the low 3 bits), sign bit 3 to bit 31 */
                __m256 wl = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, lo),
                                          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(lo, sign_bit), 28)));
                __m256 wh = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, hi),
                                          _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_and_si256(hi, sign_bit), 28)));
                acc[0][kk & 1] = _mm256_fmadd_ps(wl, s, acc[0][kk & 1]);
                acc[1][kk & 1] = _mm256_fmadd_ps(wh, s, acc[1][kk & 1]);
            }
        }
        float ev[8], od[8];
        _mm256_storeu_ps(ev, _mm256_add_ps(acc[0][0], acc[0][1]));
        _mm256_storeu_ps(od, _mm256_add_ps(acc[1][0], acc[1][1]));
        for (int j = 0; j < 8; j++) {
            c->y[16 * p + 2 * j] = ev[j];
            c->y[16 * p + 2 * j + 1] = od[j];
        }
    }
}

typedef struct alt_layout {
    const char *name;
    size_t bytes;
    void (*pack)(uint8_t *dst, const float *w);
    work_fn work;
    size_t bytes_per_row; /* for the in-cache slice */
} alt_layout;

static void bench_layout(const alt_layout *L, const float *w, const float *x, float *y) {
    int n_copies = (int)(((size_t)(g_quick ? 256 : 384) << 20) / L->bytes) + 1;
    uint8_t **copies = calloc((size_t)n_copies, sizeof *copies);
    static int8_t xq[N_IN];
    static float xd[N_IN / 16];
    static int32_t xs[N_IN / 16];
    static layout_ctx c;
    if (!copies) return;
    for (int cp = 0; cp < n_copies; cp++) {
        copies[cp] = weights_alloc(L->bytes);
        if (!copies[cp]) return;
        if (cp) memcpy(copies[cp], copies[0], L->bytes);
        else L->pack(copies[0], w);
    }
    quantize_x_scalar(x, N_IN, xq, xd, xs);
    c = (layout_ctx){.copies = copies, .x = x, .y = y, .xq = xq, .xd = xd, .xs = xs};
    for (int e = 0; e < 256; e++) c.pow2[e] = ldexpf(1.0f, e - 129);
    /* The answer against the reference on the same weights (in this layout's
     * blocking), relative to sum |w x| of the row. */
    L->work(&c, 0, 0, N_OUT);
    double worst = 0;
    for (int r = 0; r < N_OUT; r += 97) {
        double ref = 0, sum_abs = 0;
        for (int i = 0; i < N_IN; i++) {
            uint32_t bits[16];
            uint8_t codes[16];
            int is_tt = L->pack == tt_pack;
            for (int j = 0; j < 16; j++) /* the block holding (r, i) in this layout */
                memcpy(&bits[j], is_tt ? w + (r / 16 * 16 + j) * N_IN + i : w + r * N_IN + i / 16 * 16 + j, 4);
            uint8_t e = q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
            double wv = q35_bfp_decode(Q35_DT_BFP4, e, codes[is_tt ? r % 16 : i % 16]);
            ref += wv * x[i];
            sum_abs += fabs(wv * x[i]);
        }
        worst = fmax(worst, fabs(y[r] - ref) / sum_abs);
    }
    printf("layout %-22s check: worst |y - ref| / sum|w x| = %.2g\n", L->name, worst);
    /* in cache, 1 thread: the same rows of copy 0 again and again */
    int64_t hot_rows = (int64_t)(((size_t)256 << 10) / L->bytes_per_row) / 16 * 16;
    uint8_t *firsts[64];
    for (int i = 0; i < 64; i++) firsts[i] = copies[0];
    c.copies = firsts;
    double th = time_calls(L->work, &c, 64, hot_rows, 1);
    c.copies = copies;
    double hot = (double)L->bytes_per_row * hot_rows / th / 1e9;
    printf("layout %-22s in cache, 1 thread: %6.1f GB/s\n", L->name, hot);
    if (g_json) fprintf(g_json, "{\"what\":\"layout_in_cache\",\"layout\":\"%s\",\"threads\":1,\"gbps\":%.2f}\n", L->name, hot);
    for (int nt = 1; nt <= 2; nt++) {
        double t = time_calls(L->work, &c, n_copies, N_OUT, nt);
        double gbps = L->bytes / t / 1e9;
        printf("layout %-22s gemv  %d thread%s  %6.1f GB/s  %5.1f%% of ceiling  %7.3f ms\n", L->name, nt,
               nt > 1 ? "s" : " ", gbps, 100.0 * gbps / g_ceiling[nt], t * 1e3);
        if (g_json)
            fprintf(g_json, "{\"what\":\"layout_gemv\",\"layout\":\"%s\",\"threads\":%d,\"gbps\":%.2f,\"pct_ceiling\":%.1f}\n",
                    L->name, nt, gbps, 100.0 * gbps / g_ceiling[nt]);
    }
    for (int cp = 0; cp < n_copies; cp++) free(copies[cp]);
    free(copies);
}

static void bench_layouts(const float *w, const float *x, float *y) {
    alt_layout layouts[2] = {
        {"BFP4 K-rows (row-major)", (size_t)ROWMAJOR_ROW_BYTES * N_OUT, rowmajor_pack, rowmajor_work, ROWMAJOR_ROW_BYTES},
        {"BFP4 N-blocks (TT)", TT_PANEL_BYTES * (N_OUT / 16), tt_pack, tt_work, TT_PANEL_BYTES / 16},
    };
    for (int i = 0; i < 2; i++) bench_layout(&layouts[i], w, x, y);
}

/* ---- attention over a long cache: decode at the 9B's shapes ----
 * One token's full-attention work: 8 layers x 4 KV heads ("streams"), each
 * 4 query heads of 256 over n_keys positions of its own cache, fp32 or 8-bit
 * (formats/kv_q8.h), head-major as the engine keeps it. Threads split the
 * streams as the engine splits KV heads. Every call reads each cache once
 * (0.57 GB q8, 2.1 GB fp32 at 32k: from DRAM). */

#define ATT_LAYERS 8
#define ATT_NKV 4
#define ATT_G 4
#define ATT_HD 256

typedef struct att_ctx {
    const q35_kernels *k;
    int q8;
    int32_t n_keys;
    size_t row_bytes;
    uint8_t *kc[ATT_LAYERS], *vc[ATT_LAYERS];
    float *q, *o, *scores[2];
} att_ctx;

static void att_work(void *v, int copy, int64_t s0, int64_t s1) {
    att_ctx *c = v;
    float *scores = c->scores[s0 != 0];
    for (int64_t s = s0; s < s1; s++) {
        const int l = (int)(s / ATT_NKV), h = (int)(s % ATT_NKV);
        const size_t head = (size_t)h * c->row_bytes * (size_t)c->n_keys;
        const float *q = c->q + (size_t)s * ATT_G * ATT_HD;
        float *o = c->o + (size_t)s * ATT_G * ATT_HD;
        if (c->q8)
            c->k->attend_rows_q8(o, 0, ATT_HD, q, 0, ATT_HD, 1, ATT_G, c->kc[l] + head, c->vc[l] + head, c->row_bytes,
                                 c->n_keys, 0, ATT_HD, 0.0625f, scores);
        else
            c->k->attend_rows(o, 0, ATT_HD, q, 0, ATT_HD, 1, ATT_G, (const float *)(c->kc[l] + head),
                              (const float *)(c->vc[l] + head), ATT_HD, c->n_keys, 0, ATT_HD, 0.0625f, scores);
    }
    (void)copy;
}

static void bench_attention(const int32_t *depths, int n_depths) {
    const char *names[2] = {"avx2", "avx512"};
    float *row = malloc(sizeof(float) * ATT_HD);
    for (int di = 0; di < n_depths; di++)
        for (int q8 = 1; q8 >= 0; q8--) {
            att_ctx c = {.q8 = q8, .n_keys = depths[di], .row_bytes = q35_kv_row_bytes(q8, ATT_HD)};
            const size_t per_layer = c.row_bytes * (size_t)ATT_NKV * (size_t)c.n_keys;
            int ok = row != NULL;
            for (int l = 0; l < ATT_LAYERS; l++) {
                c.kc[l] = ok ? weights_alloc(per_layer) : NULL;
                c.vc[l] = ok ? weights_alloc(per_layer) : NULL;
                ok = ok && c.kc[l] && c.vc[l];
                for (size_t r = 0; ok && r < (size_t)ATT_NKV * (size_t)c.n_keys; r++)
                    for (int kv = 0; kv < 2; kv++) {
                        for (int d = 0; d < ATT_HD; d++) row[d] = rnd();
                        uint8_t *dst = (kv ? c.vc[l] : c.kc[l]) + r * c.row_bytes;
                        if (q8) q35_kv_q8_quantize(dst, row, ATT_HD);
                        else memcpy(dst, row, sizeof(float) * ATT_HD);
                    }
            }
            const size_t qn = (size_t)ATT_LAYERS * ATT_NKV * ATT_G * ATT_HD;
            c.q = ok ? malloc(sizeof(float) * qn) : NULL;
            c.o = ok ? malloc(sizeof(float) * qn) : NULL;
            for (int t = 0; t < 2; t++) c.scores[t] = ok ? malloc(sizeof(float) * ATT_G * (size_t)c.n_keys) : NULL;
            if (!c.q || !c.o || !c.scores[0] || !c.scores[1]) {
                fprintf(stderr, "attention: out of memory at %d keys\n", c.n_keys);
                ok = 0;
            }
            for (size_t i = 0; ok && i < qn; i++) c.q[i] = 2.0f * rnd();
            const double bytes = 2.0 * (double)per_layer * ATT_LAYERS, units = (double)ATT_LAYERS * ATT_NKV * c.n_keys;
            for (int n = 0; ok && n < 2; n++) {
                if (q35_kernels_find(names[n], &c.k, NULL) != Q35_OK) continue;
                for (int nt = 1; nt <= 2; nt++) {
                    double t = time_calls(att_work, &c, 1, ATT_LAYERS * ATT_NKV, nt);
                    printf("attention %-6s %-3s %6d keys  %d thread%s  %7.2f ms per token  %5.1f ns per key and KV head"
                           "  %5.1f GB/s\n", names[n], q8 ? "q8" : "f32", c.n_keys, nt, nt > 1 ? "s" : " ", t * 1e3,
                           t * 1e9 / units * nt, bytes / t / 1e9);
                    if (g_json)
                        fprintf(g_json, "{\"what\":\"attention\",\"kernels\":\"%s\",\"kv_cache\":\"%s\",\"keys\":%d,"
                                "\"threads\":%d,\"ms\":%.3f,\"gbps\":%.2f}\n", names[n], q8 ? "q8" : "f32", c.n_keys,
                                nt, t * 1e3, bytes / t / 1e9);
                    fflush(stdout);
                }
            }
            for (int l = 0; l < ATT_LAYERS; l++) {
                free(c.kc[l]);
                free(c.vc[l]);
            }
            free(c.q);
            free(c.o);
            free(c.scores[0]);
            free(c.scores[1]);
        }
    free(row);
}

static void print_machine(void) {
    char line[256], model[256] = "unknown";
    FILE *f = fopen("/proc/cpuinfo", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "model name", 10)) {
            char *p = strchr(line, ':');
            snprintf(model, sizeof model, "%s", p ? p + 2 : line);
            model[strcspn(model, "\n")] = 0;
            break;
        }
    if (f) fclose(f);
    printf("machine: %s, %ld cpus; matrix [%d, %d]\n", model, sysconf(_SC_NPROCESSORS_ONLN), N_OUT, N_IN);
    if (g_json) fprintf(g_json, "{\"what\":\"machine\",\"cpu\":\"%s\",\"n_out\":%d,\"n_in\":%d}\n", model, N_OUT, N_IN);
}

int main(int argc, char **argv) {
    const char *only = NULL, *attention = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) g_quick = 1;
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) g_json = fopen(argv[++i], "w");
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc) only = argv[++i];
        else if (!strcmp(argv[i], "--attention") && i + 1 < argc) attention = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--quick] [--json FILE] [--dtype BFP4|BFP8|BF16|F16|F32] "
                    "[--attention DEPTH,...]\n", argv[0]);
            return 2;
        }
    }
    q35_error err = {0};
    const q35_kernels *best;
    if (q35_kernels_init(&best, &err) != Q35_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    if (q35_kernels_note()) printf("note: %s\n", q35_kernels_note());
    print_machine();
    if (attention) { /* that alone */
        int32_t depths[8];
        int n = 0;
        for (const char *p = attention; *p && n < 8; p += strspn(p, ","))  {
            char *end;
            long v = strtol(p, &end, 10);
            if (end == p || v < 1 || v > (1 << 20)) {
                fprintf(stderr, "--attention: bad depth list '%s'\n", attention);
                return 2;
            }
            depths[n++] = (int32_t)v;
            p = end;
        }
        bench_attention(depths, n);
        if (g_json) fclose(g_json);
        return 0;
    }
    measure_ceiling();
    measure_int8_peak();
    float *w = malloc(sizeof(float) * N_OUT * N_IN), *x = malloc(sizeof(float) * 64 * N_IN);
    float *y = malloc(sizeof(float) * 64 * N_OUT);
    if (!w || !x || !y) return 1;
    for (size_t i = 0; i < (size_t)N_OUT * N_IN; i++) w[i] = rnd() * rnd();
    for (size_t i = 0; i < (size_t)64 * N_IN; i++) x[i] = rnd();
    const char *names[3] = {"avx2", "avx512", "avx512bf16"};
    q35_dtype dts[5] = {Q35_DT_BFP4, Q35_DT_BFP8, Q35_DT_BF16, Q35_DT_F16, Q35_DT_F32};
    for (int d = 0; d < 5; d++) {
        if (only && strcmp(only, q35_dtype_name(dts[d]))) continue;
        for (int n = 0; n < 3; n++) {
            const q35_kernels *k;
            if (n == 2 && dts[d] != Q35_DT_BF16) continue; /* avx512bf16 differs from avx512 only there */
            if (q35_kernels_find(names[n], &k, NULL) == Q35_OK) bench_table(k, dts[d], w, x, y);
        }
    }
    const q35_kernels *k2;
    if ((!only || !strcmp(only, "BFP4")) && q35_kernels_find("avx2", &k2, NULL) == Q35_OK) bench_layouts(w, x, y);
    free(w);
    free(x);
    free(y);
    if (g_json) fclose(g_json);
    return 0;
}
