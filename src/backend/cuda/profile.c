/* profile.c: kernel times per pass shape (Q35_CUDA_PROFILE=1; cuda.h).
 * While it is set, passes run directly (no graphs) and an event is recorded
 * at each pass's (or MTP head's) start and after each kernel; after each
 * synchronizing logits copy the time between consecutive events goes to
 * the shared profile table (backend/profile.h) by (pass shape, kernel
 * name), its "pass" row the sum of the pass's kernels. The table goes to
 * stderr when the backend closes: the split of a step among matmuls, the
 * recurrence, attention and the small kernels. */
#include "backend/cuda/cuda.h"
#include "backend/profile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROF_EVENTS 4096

struct cu_prof {
    cudaEvent_t ev[PROF_EVENTS];
    const char *name[PROF_EVENTS]; /* NULL: a pass's start */
    int32_t tag[PROF_EVENTS];
    int32_t n_ev, n_created;
    q35_prof *table;
};

int q35_cu_prof_wanted(void) {
    const char *v = getenv("Q35_CUDA_PROFILE");
    return v && *v && strcmp(v, "0");
}

static void record(cu_backend *b, int32_t tag, const char *name) {
    if (!b->prof && (b->prof = calloc(1, sizeof *b->prof)) && !(b->prof->table = q35_prof_new())) {
        free(b->prof);
        b->prof = NULL;
    }
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

int32_t q35_cu_prof_pending(const cu_backend *b) { return b->prof ? b->prof->n_ev : 0; }

void q35_cu_prof_harvest(cu_backend *b) {
    cu_prof *p = b->prof;
    if (!p) return;
    for (int32_t i = 0; i < p->n_ev; i++) {
        float ms = 0;
        if (!p->name[i]) q35_prof_add(p->table, p->tag[i], NULL, 0, 0); /* a pass's start */
        else if (i > 0 && !cudaEventElapsedTime(&ms, p->ev[i - 1], p->ev[i])) {
            q35_prof_add(p->table, p->tag[i], p->name[i], 0, 1e-3 * ms);
            q35_prof_add(p->table, p->tag[i], "pass", 0, 1e-3 * ms);
        }
    }
    p->n_ev = 0;
    (void)cudaGetLastError();
}

void q35_cu_prof_report(cu_backend *b) {
    cu_prof *p = b->prof;
    if (!p) return;
    if (!cudaStreamSynchronize(b->stream)) q35_cu_prof_harvest(b); /* passes since the last logits */
    q35_prof_close(p->table, stderr);
    for (int32_t i = 0; i < p->n_created; i++) cudaEventDestroy(p->ev[i]);
    free(p);
    b->prof = NULL;
}
