/* util.h: small shared helpers: error reporting, mapped files, number
 * conversions, and a monotonic clock. Nothing here knows about the model. */
#ifndef Q35_UTIL_H
#define Q35_UTIL_H

#include "qwen35.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* Fills err (if not NULL) and returns status, so callers can write
 * `return q35_fail(err, Q35_ERR_FORMAT, "%s: ...", path);`. */
q35_status q35_fail(q35_error *err, q35_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Runs fn(ctx, ith, nth) for ith = 0 .. nth-1 on nth threads (the calling
 * thread is 0) and returns when all are done; a share whose thread could not
 * be started runs on the calling thread, so the split never changes. For
 * long, coarse jobs (each call starts and joins threads). */
void q35_fork_join(int nth, void (*fn)(void *ctx, int ith, int nth), void *ctx);

/* Progress of a long job: bytes done so far of total, and what is at hand
 * (a file, a tensor). */
typedef void (*q35_progress_fn)(void *ctx, uint64_t done, uint64_t total, const char *what);

/* A whole file mapped read-only, at a 2 MiB boundary. */
typedef struct q35_mapped_file {
    void *data;
    size_t size;
    int fd;
    int copied; /* q35_map_copy replaced the mapping */
} q35_mapped_file;

q35_status q35_map_file(const char *path, q35_mapped_file *out, q35_error *err);
/* Replaces the file mapping, at the same address, by a read-only copy of the
 * file in anonymous memory (transparent huge pages where the kernel allows
 * them). On failure the file mapping stays as it was. */
q35_status q35_map_copy(q35_mapped_file *f, const char *path, q35_error *err);
/* Whether the kernel gives transparent huge pages to madvise'd memory. */
int q35_huge_pages_offered(void);
/* bytes of zeroed memory, on transparent huge pages (2 MiB aligned, pages
 * given as they are first touched) from 2 MiB up, else from calloc; freed
 * with q35_free_zeroed and the same size. NULL when out of memory. Large
 * caches read at a stride (a KV cache's rows for one head) miss the TLB on
 * 4 KiB pages. */
void *q35_alloc_zeroed(size_t bytes);
void q35_free_zeroed(void *p, size_t bytes);
/* MemAvailable in bytes (0 when unknown). */
int64_t q35_mem_available(void);
void q35_unmap_file(q35_mapped_file *f);

/* Reads a whole (small) file into a NUL-terminated heap buffer. */
q35_status q35_read_file(const char *path, char **out, size_t *size, q35_error *err);

/* "dir/name" into a new heap string. */
char *q35_path_join(const char *dir, const char *name);
bool q35_is_dir(const char *path);
bool q35_file_exists(const char *path);

static inline float q35_bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Round to nearest even, as torch does; NaN stays NaN. */
static inline uint16_t q35_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float q35_f16_to_f32(uint16_t h);
uint16_t q35_f32_to_f16(float f);

double q35_now_seconds(void); /* CLOCK_MONOTONIC */

#endif
