/* util.c: error reporting, file mapping and small conversions (see util.h). */
#include "base/util.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

q35_status q35_fail(q35_error *err, q35_status status, const char *fmt, ...) {
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
        err->status = status;
    }
    return status;
}

const char *q35_status_name(q35_status status) {
    switch (status) {
    case Q35_OK: return "ok";
    case Q35_ERR_IO: return "i/o error";
    case Q35_ERR_FORMAT: return "format error";
    case Q35_ERR_UNSUPPORTED: return "unsupported";
    case Q35_ERR_NOMEM: return "out of memory";
    case Q35_ERR_ARG: return "bad argument";
    case Q35_ERR_CONTEXT: return "context full";
    }
    return "unknown error";
}

/* Huge pages are 2 MiB on x86-64: mappings start on that boundary so that
 * the kernel can back them with huge pages where it allows (large page-cache
 * folios for the file, transparent huge pages for the anonymous copy). */
#define HUGE_PAGE ((size_t)2 << 20)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

/* Reserves len bytes of address space at a HUGE_PAGE boundary (PROT_NONE, to
 * be mapped over with MAP_FIXED), or NULL. */
static char *reserve_aligned(size_t len) {
    size_t total = len + HUGE_PAGE;
    char *r = mmap(NULL, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (r == MAP_FAILED) return NULL;
    char *a = (char *)round_up((uintptr_t)r, HUGE_PAGE);
    if (a > r) munmap(r, (size_t)(a - r));
    if (r + total > a + len) munmap(a + len, (size_t)(r + total - (a + len)));
    return a;
}

void *q35_alloc_zeroed(size_t bytes) {
    if (bytes < HUGE_PAGE) return calloc(bytes ? bytes : 1, 1);
    size_t len = round_up(bytes, HUGE_PAGE);
    char *a = reserve_aligned(len);
    if (!a) return NULL;
    if (mmap(a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        munmap(a, len);
        return NULL;
    }
    madvise(a, len, MADV_HUGEPAGE);
    return a;
}

void q35_free_zeroed(void *p, size_t bytes) {
    if (!p) return;
    if (bytes < HUGE_PAGE) free(p);
    else munmap(p, round_up(bytes, HUGE_PAGE));
}

q35_status q35_map_file(const char *path, q35_mapped_file *out, q35_error *err) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return q35_fail(err, Q35_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return q35_fail(err, Q35_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return q35_fail(err, Q35_ERR_IO, "%s: not a regular file", path);
    }
    out->size = (size_t)st.st_size;
    if (out->size > 0) {
        size_t len = round_up(out->size, (size_t)sysconf(_SC_PAGESIZE));
        char *at = reserve_aligned(len);
        void *p = at ? mmap(at, len, PROT_READ, MAP_PRIVATE | MAP_FIXED, fd, 0) : MAP_FAILED;
        if (p == MAP_FAILED) {
            int e = errno;
            if (at) munmap(at, len);
            close(fd);
            return q35_fail(err, Q35_ERR_IO, "%s: cannot map: %s", path, strerror(e));
        }
        madvise(p, len, MADV_HUGEPAGE); /* a hint: kernels without file huge pages refuse it, harmlessly */
        out->data = p;
    }
    out->fd = fd;
    return Q35_OK;
}

q35_status q35_map_copy(q35_mapped_file *f, const char *path, q35_error *err) {
    if (!f->data || f->copied) return Q35_OK;
    size_t len = round_up(f->size, (size_t)sysconf(_SC_PAGESIZE));
    char *a = reserve_aligned(len);
    if (!a || mmap(a, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
        if (a) munmap(a, len);
        return q35_fail(err, Q35_ERR_NOMEM, "%s: cannot allocate %zu bytes for the weights", path, f->size);
    }
    madvise(a, len, MADV_HUGEPAGE);
    /* pread, not a copy out of the mapping: no page-table work for pages
     * that are dropped right after */
    for (size_t done = 0; done < f->size;) {
        size_t want = f->size - done < ((size_t)64 << 20) ? f->size - done : ((size_t)64 << 20);
        ssize_t got = pread(f->fd, a + done, want, (off_t)done);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            int e = got < 0 ? errno : 0;
            munmap(a, len);
            return q35_fail(err, Q35_ERR_IO, "%s: cannot read for the in-memory copy: %s", path,
                            e ? strerror(e) : "the file shrank after it was opened");
        }
        done += (size_t)got;
    }
    /* read-only like the file mapping, then moved over it: every pointer
     * into the weights stays valid */
    if (mprotect(a, len, PROT_READ) != 0 ||
        mremap(a, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, f->data) == MAP_FAILED) {
        int e = errno;
        munmap(a, len);
        return q35_fail(err, Q35_ERR_IO, "%s: cannot place the in-memory copy: %s", path, strerror(e));
    }
    f->copied = 1;
    return Q35_OK;
}

int q35_huge_pages_offered(void) {
    char buf[128] = "";
    FILE *fp = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!fp) return 0;
    if (!fgets(buf, sizeof buf, fp)) buf[0] = 0;
    fclose(fp);
    return strstr(buf, "[always]") != NULL || strstr(buf, "[madvise]") != NULL;
}

int64_t q35_mem_available(void) {
    long long kb = 0;
    char line[256];
    FILE *fp = fopen("/proc/meminfo", "r");
    if (!fp) return 0;
    while (fgets(line, sizeof line, fp))
        if (sscanf(line, "MemAvailable: %lld kB", &kb) == 1) break;
    fclose(fp);
    return (int64_t)kb * 1024;
}

void q35_unmap_file(q35_mapped_file *f) {
    if (f->data) munmap(f->data, f->size);
    if (f->fd >= 0) close(f->fd);
    f->data = NULL;
    f->size = 0;
    f->fd = -1;
}

q35_status q35_read_file(const char *path, char **out, size_t *size, q35_error *err) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    if (!fp) return q35_fail(err, Q35_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 4096, len = 0;
    char *buf = malloc(cap + 1);
    if (!buf) { fclose(fp); return q35_fail(err, Q35_ERR_NOMEM, "%s: out of memory", path); }
    for (;;) {
        if (len == cap) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) { free(buf); fclose(fp); return q35_fail(err, Q35_ERR_NOMEM, "%s: out of memory", path); }
            buf = nb;
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) break;
    }
    int bad = ferror(fp);
    fclose(fp);
    if (bad) { free(buf); return q35_fail(err, Q35_ERR_IO, "%s: read error", path); }
    buf[len] = 0;
    *out = buf;
    if (size) *size = len;
    return Q35_OK;
}

char *q35_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    size_t n = a;
    if (a && dir[a - 1] != '/') p[n++] = '/';
    memcpy(p + n, name, b + 1);
    return p;
}

bool q35_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool q35_file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

float q35_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff;
    uint32_t u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400));
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ff) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (man << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t q35_f32_to_f16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    if (isnan(f)) return sign | 0x7e00;
    float a = fabsf(f);
    if (a >= 65520.0f) return sign | 0x7c00;
    if (a < 6.103515625e-05f) { /* subnormal or zero: fixed-point round to even */
        float scaled = a * 16777216.0f; /* 2^24 */
        return sign | (uint16_t)lrintf(scaled);
    }
    uint32_t exp = ((u >> 23) & 0xff) - 127 + 15;
    uint32_t man = u & 0x7fffff;
    uint32_t h = (exp << 10) | (man >> 13);
    uint32_t rem = man & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return sign | (uint16_t)h;
}

double q35_now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct {
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
    int ith, nth;
} fork_arg;

static void *fork_main(void *p) {
    fork_arg *a = p;
    a->fn(a->ctx, a->ith, a->nth);
    return NULL;
}

void q35_fork_join(int nth, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    enum { MAX_FORK = 256 };
    if (nth < 1) nth = 1;
    if (nth > MAX_FORK) nth = MAX_FORK;
    pthread_t th[MAX_FORK];
    fork_arg args[MAX_FORK];
    int started[MAX_FORK] = {0};
    for (int t = 1; t < nth; t++) {
        args[t] = (fork_arg){fn, ctx, t, nth};
        started[t] = !pthread_create(&th[t], NULL, fork_main, &args[t]);
    }
    fn(ctx, 0, nth);
    for (int t = 1; t < nth; t++)
        if (!started[t]) fn(ctx, t, nth);
    for (int t = 1; t < nth; t++)
        if (started[t]) pthread_join(th[t], NULL);
}
