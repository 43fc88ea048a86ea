/* state.c: sequence states and snapshots in device memory (see cuda.h,
 * layout.h). Copies run on the backend's stream, so they are ordered with
 * the passes around them; a snapshot is a device allocation. */
#include "backend/cuda/cuda.h"
#include "base/util.h"

#include <stdlib.h>

struct q35_bsnap {
    cu_backend *b;
    int32_t pos, n_kept, mtp;
    float *mem; /* rec; per full layer K rows [0, pos) then V rows; with mtp: MTP K, V rows, kept */
};

static double mib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0); }

static q35_status dev_alloc(float **p, size_t floats, const char *what, q35_error *err) {
    size_t bytes = (floats ? floats : 1) * sizeof(float);
    cudaError_t rc = cudaMalloc((void **)p, bytes);
    if (rc) {
        *p = NULL;
        size_t free_b = 0, total_b = 0;
        cudaGetLastError(); /* an allocation failure is not sticky */
        cudaMemGetInfo(&free_b, &total_b);
        return q35_fail(err, Q35_ERR_NOMEM, "CUDA: cudaMalloc of %.1f MiB for %s failed: %s (%.0f MiB free of %.0f MiB)",
                        mib(bytes), what, cudaGetErrorString(rc), mib(free_b), mib(total_b));
    }
    rc = cudaMemset(*p, 0, bytes);
    if (rc) return q35_cu_fail(rc, "cudaMemset", err);
    return Q35_OK;
}

q35_status q35_cu_state_new(q35_backend *base, int32_t n_ctx, q35_bstate **out, q35_error *err) {
    cu_backend *b = (cu_backend *)base;
    *out = NULL;
    if (b->err_status) return q35_fail(err, b->err_status, "%s", b->err_msg);
    q35_bstate *s = calloc(1, sizeof *s);
    if (!s) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    s->b = b;
    s->n_ctx = n_ctx;
    q35_cuda_state_layout_of(b->c, n_ctx, &s->L);
    q35_status st = dev_alloc(&s->mem, s->L.total_floats, "a session's state", err);
    if (st) {
        q35_cu_state_free(s);
        return st;
    }
    *out = s;
    return Q35_OK;
}

void q35_cu_state_free(q35_bstate *s) {
    if (!s) return;
    cudaStreamSynchronize(s->b->stream); /* no pass may still read it */
    cudaFree(s->mem);
    cudaFree(s->row_states);
    cudaFree(s->mtp_kv);
    cudaFree(s->kept);
    cudaFree(s->draft);
    free(s);
}

void q35_cu_state_clear(q35_bstate *s) {
    cu_backend *b = s->b;
    if (b->err_status) return;
    CU_OK(b, cudaMemsetAsync(s->mem, 0, s->L.rec_floats * sizeof(float), b->stream)); /* KV rows past pos are never read */
}

q35_status q35_cu_state_set_spec(q35_bstate *s, int32_t k, q35_error *err) {
    cu_backend *b = s->b;
    if (k == 0) return Q35_OK; /* the buffers stay for a later k */
    const size_t H = (size_t)b->c->hidden_size;
    q35_status st = Q35_OK;
    if (!s->mtp_kv) st = dev_alloc(&s->mtp_kv, s->L.kv_layer_floats, "the MTP layer's KV cache", err);
    if (!st && !s->kept) st = dev_alloc(&s->kept, (Q35_SPEC_MAX + 1) * H, "kept hidden rows", err);
    if (!st && !s->draft) st = dev_alloc(&s->draft, H, "the draft row", err);
    if (!st && k != s->spec_k) {
        float *rows = NULL;
        cudaStreamSynchronize(b->stream);
        st = dev_alloc(&rows, (size_t)k * s->L.rec_floats, "per-row states of a verify pass", err);
        if (!st) {
            cudaFree(s->row_states);
            s->row_states = rows;
            s->spec_k = k;
        }
    }
    return st;
}

void q35_cu_state_rewind(q35_bstate *s, int32_t n_keep) {
    cu_backend *b = s->b;
    if (b->err_status) return;
    CU_OK(b, cudaMemcpyAsync(s->mem, s->row_states + (size_t)(n_keep - 1) * s->L.rec_floats,
                             s->L.rec_floats * sizeof(float), cudaMemcpyDeviceToDevice, b->stream));
}

/* Copies between a state and a snapshot's buffer, in the snapshot's order; to_snap picks the direction. */
static void snap_copy(q35_bstate *s, const q35_bsnap *snap, int to_snap) {
    cu_backend *b = s->b;
    const q35_config *c = b->c;
    const size_t rows = (size_t)snap->pos * s->L.kv_row_floats, H = (size_t)c->hidden_size;
    float *p = snap->mem;
#define COPY(state_ptr, n)                                                                                          \
    do {                                                                                                            \
        float *sp_ = (state_ptr);                                                                                   \
        CU_OK(b, cudaMemcpyAsync(to_snap ? p : sp_, to_snap ? sp_ : p, (n) * sizeof(float), cudaMemcpyDeviceToDevice, \
                                 b->stream));                                                                       \
        p += (n);                                                                                                   \
    } while (0)
    COPY(s->mem, s->L.rec_floats);
    float *kv = s->mem + s->L.rec_floats;
    for (int32_t j = 0; j < c->n_layer_full; j++) {
        float *K = kv + (size_t)j * s->L.kv_layer_floats;
        COPY(K, rows);
        COPY(K + (size_t)s->n_ctx * s->L.kv_row_floats, rows);
    }
    if (snap->mtp && s->mtp_kv) {
        COPY(s->mtp_kv, rows);
        COPY(s->mtp_kv + (size_t)s->n_ctx * s->L.kv_row_floats, rows);
        COPY(s->kept, (size_t)snap->n_kept * H);
    }
#undef COPY
}

q35_status q35_cu_snapshot_take(const q35_bstate *s, int32_t pos, int32_t n_kept, int mtp, q35_bsnap **out,
                                size_t *bytes, q35_error *err) {
    cu_backend *b = s->b;
    *out = NULL;
    if (b->err_status) return q35_fail(err, b->err_status, "%s", b->err_msg);
    const size_t rows = (size_t)pos * s->L.kv_row_floats, H = (size_t)b->c->hidden_size;
    size_t floats = s->L.rec_floats + (size_t)b->c->n_layer_full * 2 * rows;
    if (mtp) floats += 2 * rows + (size_t)n_kept * H;
    q35_bsnap *snap = calloc(1, sizeof *snap);
    if (!snap) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    *snap = (q35_bsnap){b, pos, mtp ? n_kept : 0, mtp && s->mtp_kv, NULL};
    q35_status st = dev_alloc(&snap->mem, floats, "a snapshot", err);
    if (st) {
        free(snap);
        return st;
    }
    snap_copy((q35_bstate *)s, snap, 1);
    if (b->err_status) {
        q35_cu_snapshot_free(snap);
        return q35_fail(err, b->err_status, "%s", b->err_msg);
    }
    *bytes = floats * sizeof(float);
    *out = snap;
    return Q35_OK;
}

void q35_cu_snapshot_restore(q35_bstate *s, const q35_bsnap *snap) {
    if (s->b->err_status) return;
    snap_copy(s, snap, 0);
}

void q35_cu_snapshot_free(q35_bsnap *snap) {
    if (!snap) return;
    cudaStreamSynchronize(snap->b->stream);
    cudaFree(snap->mem);
    free(snap);
}
