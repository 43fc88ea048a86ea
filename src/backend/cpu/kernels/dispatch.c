/* dispatch.c: picks the kernel table once at start-up (cpuid, or the
 * Q35_KERNELS environment variable) and owns the kernels' per-thread
 * scratch. Compiled without ISA flags, so it runs on any x86-64. */
#include "backend/cpu/kernels/kernels.h"
#include "base/util.h"

#include <cpuid.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static const q35_kernels *g_chosen;
static const char *g_note;

/* F16C straight from cpuid (leaf 1, ECX bit 29): not every compiler's
 * __builtin_cpu_supports knows its name. */
static int cpu_has_f16c(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}

static int cpu_has_avx2(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

static int cpu_has_avx512(void) {
    return cpu_has_avx2() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
}

/* AVX512_BF16 from cpuid leaf 7, sub-leaf 1, EAX bit 5 (GCC 12's
 * __builtin_cpu_supports does not know it). */
static int cpu_has_avx512bf16(void) {
    unsigned a, b, c, d;
    return cpu_has_avx512() && __get_cpuid_count(7, 1, &a, &b, &c, &d) && (a & (1u << 5));
}

/* avx512bf16 is taken only when Q35_KERNELS names it: it rounds x to bf16
 * for BF16 weights (kernels.h), up to 2^-9 of each product, which on a
 * BF16 checkpoint can move the logits by more than the 1e-4 the engine
 * keeps against transformers' fp32 (tests/test_model.c). */
static const q35_kernels *best_for_cpu(void) {
    __builtin_cpu_init();
    if (cpu_has_avx512()) return &q35_kernels_avx512;
    if (cpu_has_avx2()) return &q35_kernels_avx2;
    return &q35_kernels_ref;
}

q35_status q35_kernels_find(const char *name, const q35_kernels **out, q35_error *err) {
    __builtin_cpu_init();
    const q35_kernels *k = NULL;
    int ok = 0;
    if (!strcmp(name, "ref")) k = &q35_kernels_ref, ok = 1;
    else if (!strcmp(name, "avx2")) k = &q35_kernels_avx2, ok = cpu_has_avx2();
    else if (!strcmp(name, "avx512")) k = &q35_kernels_avx512, ok = cpu_has_avx512();
    else if (!strcmp(name, "avx512bf16")) k = &q35_kernels_avx512bf16, ok = cpu_has_avx512bf16();
    else
        return q35_fail(err, Q35_ERR_ARG, "kernels \"%s\": unknown (choose ref, avx2, avx512 or avx512bf16)", name);
    if (!ok)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "kernels \"%s\": this CPU lacks the instructions (%s)", name,
                        k == &q35_kernels_avx2     ? "AVX2, FMA, F16C"
                        : k == &q35_kernels_avx512 ? "AVX-512 F/BW/VL/DQ and VNNI"
                                                   : "AVX-512 F/BW/VL/DQ, VNNI and BF16");
    *out = k;
    return Q35_OK;
}

int q35_cpu_family_of(unsigned eax) {
    const int base = (int)(eax >> 8 & 0xf);
    return base == 0xf ? base + (int)(eax >> 20 & 0xff) : base;
}

/* The CPU's family where its vendor is AMD, else 0. */
static int amd_family(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(0, &a, &b, &c, &d) || b != 0x68747541u /* "Auth" */ || d != 0x69746e65u /* "enti" */ ||
        c != 0x444d4163u /* "cAMD" */ || !__get_cpuid(1, &a, &b, &c, &d))
        return 0;
    return q35_cpu_family_of(a);
}

int q35_kernels_prefetch_choice(const char *env, int amd_family) {
    if (env && *env) return !strcmp(env, "l1") ? 0 : !strcmp(env, "l2") ? 1 : -1;
    return amd_family == 0x19;
}

static int g_prefetch_l2 = -1; /* -1: not chosen yet */

/* Before q35_kernels_init has run (a table used straight from q35_kernels_get or _find), the choice
 * is made here the same way, except that a wrong Q35_PREFETCH gives the CPU's default (only
 * q35_kernels_init can refuse it). Every thread computes the same value, so the race is benign. */
int q35_kernels_prefetch_l2(void) {
    int v = __atomic_load_n(&g_prefetch_l2, __ATOMIC_RELAXED);
    if (v < 0) {
        v = q35_kernels_prefetch_choice(getenv("Q35_PREFETCH"), amd_family());
        if (v < 0) v = q35_kernels_prefetch_choice(NULL, amd_family());
        __atomic_store_n(&g_prefetch_l2, v, __ATOMIC_RELAXED);
    }
    return v;
}

q35_status q35_kernels_init(const q35_kernels **out, q35_error *err) {
    const char *pf = getenv("Q35_PREFETCH");
    const int l2 = q35_kernels_prefetch_choice(pf, amd_family());
    if (l2 < 0) return q35_fail(err, Q35_ERR_ARG, "Q35_PREFETCH=%s: unknown (choose l1 or l2)", pf);
    __atomic_store_n(&g_prefetch_l2, l2, __ATOMIC_RELAXED);
    const char *env = getenv("Q35_KERNELS");
    const q35_kernels *k;
    if (env && *env) {
        q35_error inner = {0}; /* its message is quoted: format into a separate buffer */
        q35_status st = q35_kernels_find(env, &k, &inner);
        if (st != Q35_OK) return q35_fail(err, st, "Q35_KERNELS=%s: %s", env, inner.msg);
        g_note = NULL;
    } else {
        k = best_for_cpu();
        g_note = k == &q35_kernels_ref ? "this CPU has no AVX2/FMA/F16C: using the scalar reference kernels (slow)"
                                       : NULL;
    }
    __atomic_store_n(&g_chosen, k, __ATOMIC_RELEASE);
    if (out) *out = k;
    return Q35_OK;
}

const q35_kernels *q35_kernels_get(void) {
    const q35_kernels *k = __atomic_load_n(&g_chosen, __ATOMIC_ACQUIRE);
    if (!k) {
        k = best_for_cpu();
        __atomic_store_n(&g_chosen, k, __ATOMIC_RELEASE);
    }
    return k;
}

const char *q35_kernels_note(void) { return g_note; }

/* Scratch: one buffer per thread, kept for the thread's life so that the
 * token loop never allocates once the largest shape has been seen. */
typedef struct scratch_buf {
    void *p;
    size_t cap;
} scratch_buf;

__thread uint64_t q35_kernels_x_epoch;

static pthread_key_t g_scratch_key;
static pthread_once_t g_scratch_once = PTHREAD_ONCE_INIT;
static int g_scratch_key_ok;

static void scratch_free(void *v) {
    scratch_buf *s = v;
    free(s->p);
    free(s);
}

static void scratch_key_init(void) {
    g_scratch_key_ok = pthread_key_create(&g_scratch_key, scratch_free) == 0;
}

void *q35_kernels_scratch(size_t bytes) {
    pthread_once(&g_scratch_once, scratch_key_init);
    if (!g_scratch_key_ok) return NULL;
    scratch_buf *s = pthread_getspecific(g_scratch_key);
    if (!s) {
        s = calloc(1, sizeof *s);
        if (!s) return NULL;
        if (pthread_setspecific(g_scratch_key, s) != 0) { free(s); return NULL; }
    }
    if (s->cap < bytes) {
        size_t cap = (bytes + 4095) & ~(size_t)4095;
        void *p = aligned_alloc(64, cap);
        if (!p) return NULL;
        free(s->p);
        s->p = p;
        s->cap = cap;
    }
    return s->p;
}

size_t q35_kernels_chunk_bytes(void) { return (size_t)2 << 20; }
