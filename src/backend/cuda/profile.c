/* profile.c: kernel times per pass shape (Q35_CUDA_PROFILE=1; cuda.h).
 * While it is set, passes run directly (no graphs) and an event is recorded
 * at each pass's (or MTP head's) start and after each kernel; after each
 * synchronizing logits copy the time between consecutive events is added
 * to a table by (pass shape, kernel name). The table goes to stderr when
 * the backend closes: the split of a step among matmuls, the recurrence,
 * attention and the small kernels, and how far the kernels' sum is from
 * the step's wall time (launch and host gaps). */
#include "backend/cuda/cuda.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROF_EVENTS 4096
#define PROF_ROWS 256

struct cu_prof {
    cudaEvent_t ev[PROF_EVENTS];
    const char *name[PROF_EVENTS]; /* NULL: a pass's start */
    int32_t tag[PROF_EVENTS];
    int32_t n_ev, n_created;
    struct { int32_t tag; const char *name; int64_t calls; double ms; } row[PROF_ROWS];
    int32_t n_rows;
    struct { int32_t tag; int64_t passes; } shape[32];
    int32_t n_shapes;
};

int q35_cu_prof_wanted(void) {
    const char *v = getenv("Q35_CUDA_PROFILE");
    return v && *v && strcmp(v, "0");
}

static void record(cu_backend *b, int32_t tag, const char *name) {
    if (!b->prof) b->prof = calloc(1, sizeof *b->prof);
    cu_prof *p = b->prof;
    if (!p || p->n_ev >= PROF_EVENTS) return;
    if (p->n_ev >= p->n_created) {
        if (cudaEventCreate(&p->ev[p->n_ev])) { (void)cudaGetLastError(); return; } /* not the next launch's error */
        p->n_created++;
    }
    if (cudaEventRecord(p->ev[p->n_ev], b->stream)) { (void)cudaGetLastError(); return; }
    p->name[p->n_ev] = name, p->tag[p->n_ev] = tag;
    p->n_ev++;
}

void q35_cu_prof_mark(cu_backend *b, int32_t tag) { record(b, tag, NULL); }

void q35_cu_prof_kernel(cu_backend *b, const char *name) {
    if (b->prof && b->prof->n_ev > 0) record(b, b->prof->tag[b->prof->n_ev - 1], name);
}

static void add(cu_prof *p, int32_t tag, const char *name, double ms) {
    for (int32_t i = 0; i < p->n_rows; i++)
        if (p->row[i].tag == tag && !strcmp(p->row[i].name, name)) { p->row[i].calls++, p->row[i].ms += ms; return; }
    if (p->n_rows < PROF_ROWS) {
        p->row[p->n_rows].tag = tag, p->row[p->n_rows].name = name;
        p->row[p->n_rows].calls = 1, p->row[p->n_rows].ms = ms;
        p->n_rows++;
    }
}

int32_t q35_cu_prof_pending(const cu_backend *b) { return b->prof ? b->prof->n_ev : 0; }

void q35_cu_prof_harvest(cu_backend *b) {
    cu_prof *p = b->prof;
    if (!p) return;
    for (int32_t i = 0; i < p->n_ev; i++) {
        if (!p->name[i]) { /* a pass's start */
            int32_t s = 0;
            while (s < p->n_shapes && p->shape[s].tag != p->tag[i]) s++;
            if (s == p->n_shapes && s < 32) p->shape[p->n_shapes++].tag = p->tag[i];
            if (s < p->n_shapes) p->shape[s].passes++;
            continue;
        }
        float ms = 0;
        if (i > 0 && !cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i])) add(p, p->tag[i], p->name[i], ms);
    }
    p->n_ev = 0;
    (void)cudaGetLastError();
}

void q35_cu_prof_report(cu_backend *b) {
    cu_prof *p = b->prof;
    if (!p) return;
    if (!cudaStreamSynchronize(b->stream)) q35_cu_prof_harvest(b); /* passes since the last logits */
    for (int32_t s = 0; s < p->n_shapes; s++) {
        const int32_t tag = p->shape[s].tag;
        const double passes = (double)(p->shape[s].passes ? p->shape[s].passes : 1);
        double total = 0;
        for (int32_t i = 0; i < p->n_rows; i++)
            if (p->row[i].tag == tag) total += p->row[i].ms;
        fprintf(stderr, "cuda profile: %s of %d rows, %lld runs: kernels %.1f us per run\n",
                tag >= CU_PROF_MTP ? "MTP head" : "pass", tag >= CU_PROF_MTP ? tag - CU_PROF_MTP : tag,
                (long long)p->shape[s].passes, 1e3 * total / passes);
        for (int32_t i = 0; i < p->n_rows; i++)
            if (p->row[i].tag == tag)
                fprintf(stderr, "  %-34s %6.1f calls %9.1f us %5.1f%%\n", p->row[i].name, p->row[i].calls / passes,
                        1e3 * p->row[i].ms / passes, total > 0 ? 100.0 * p->row[i].ms / total : 0.0);
    }
    for (int32_t i = 0; i < p->n_created; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    b->prof = NULL;
}
