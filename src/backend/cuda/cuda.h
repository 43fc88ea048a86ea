/* cuda.h: the CUDA backend (backend.h over device memory and one stream).
 *
 *   cuda.c     the backend object: device checks, weight upload, the pass
 *              (begin / layer / end), logits, keep_rows, the MTP head
 *   state.c    sequence states, per-row states for rewinding, snapshots,
 *              all device memory
 *   kernels.cu the kernels (kernels.h); layout.c the host-side layout
 *              arithmetic (layout.h, tested without a GPU)
 *
 * Everything a pass touches lives on the device: weights (uploaded at
 * open), states, scratch (one allocation sized for Q35_UBATCH rows). The
 * host part of a pass is the tokens and the batch's sequence table, copied
 * from pinned memory at begin() (and at mtp()); between begin() and end()
 * only kernels are enqueued, on one stream, with pointers fixed at open and
 * at state_new, which is what lets a decode step be captured as a graph.
 * logits() and mtp() with logits synchronize the stream (their results go
 * to host memory).
 *
 * Errors: the first failed CUDA call (or launch) of a void operation is
 * recorded with the call's name; every later operation does nothing, and
 * the backend's status() reports it (the core asks after each eval). */
#ifndef Q35_BACKEND_CUDA_H
#define Q35_BACKEND_CUDA_H

#include "backend/backend.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/layout.h"

typedef struct cu_layer {
    q35_cuda_mat gate, up, down, qkv, z, b, a, out, q, k, v, o;
    float *input_norm, *post_norm, *conv, *A_log, *dt_bias, *gdn_norm, *q_norm, *k_norm;
} cu_layer;

/* What begin() and mtp() upload: pinned on the host, mirrored on the device. */
typedef struct cu_stage {
    int32_t tokens[Q35_UBATCH], row_seq[Q35_UBATCH];
    q35_cuda_seq seqs[Q35_UBATCH];
    int32_t next[Q35_UBATCH], mtp_row_seq[Q35_UBATCH];
    q35_cuda_seq mtp_seq;
} cu_stage;

#define CU_GRAPHS 8      /* pass shapes kept as graphs */
#define CU_GRAPH_ROWS 8  /* passes of more rows (prompts) run directly */
enum { CU_DIRECT, CU_CAPTURE, CU_REPLAY };

typedef struct cu_backend {
    q35_backend base;
    q35_backend_ops ops;
    const q35_config *c;
    const q35_weights *w;
    int device;
    char kernels_name[64], note[512]; /* note: the device name (up to 256) and its figures */
    cudaStream_t stream;
    cudaEvent_t staged_pass, staged_mtp; /* the last uploads from the pinned stage have been read */
    /* weights */
    uint8_t *arena;
    size_t arena_size, arena_used;
    q35_cuda_mat embed, lm_head, mtp_fc, draft_head;
    uint8_t *draft_mem;                   /* draft_head's own image (set_draft_head), or NULL */
    float *final_norm, *mtp_pre_emb, *mtp_pre_hid, *mtp_norm;
    cu_layer layers[Q35_MAX_LAYERS], mtp;
    /* scratch of one pass */
    float *scratch;
    q35_cuda_scratch_layout S;
    cu_stage *stage, *d_stage;            /* pinned host, device */
    int32_t n_seqs, n_rows;
    const q35_cuda_seq *mm_segs;          /* the rows' sequences (host copy) and rows, for pass_mm */
    int32_t mm_n_segs, mm_rows;
    /* CUDA graphs of whole passes of up to CU_GRAPH_ROWS rows, by (rows,
     * sequences): captured on a shape's first pass, replayed after it */
    int graphs;                           /* 0: Q35_CUDA_GRAPHS=0, or a capture failed */
    int mode;                             /* this pass: CU_DIRECT, CU_CAPTURE or CU_REPLAY */
    int32_t n_graphs, graph_at;           /* graph_at: this pass's entry */
    struct { int32_t rows, seqs; cudaGraphExec_t exec; } graph[CU_GRAPHS];
    /* Q35_CUDA_PROFILE (profile.c): this pass is timed kernel by kernel */
    int prof_on;
    struct cu_prof *prof;
    /* the first error of a void operation */
    q35_status err_status;
    char err_msg[256];
} cu_backend;

struct q35_bstate {
    cu_backend *b;
    int32_t n_ctx;
    q35_cuda_state_layout L;
    float *mem;                 /* rec then kv */
    int32_t spec_k;
    float *row_states;          /* (spec_k, rec_floats) */
    float *mtp_kv, *kept, *draft;
};

/* Records the first failure (rc != cudaSuccess) of `what`; returns 1 on success. */
int q35_cu_ok(cu_backend *b, cudaError_t rc, const char *what);
/* The same failure as a status for an operation that returns one. */
q35_status q35_cu_fail(cudaError_t rc, const char *what, q35_error *err);
#define CU_OK(b, call) q35_cu_ok((b), (call), #call)
/* q35_cu_ok for a kernel launch, timed while profiling. */
int q35_cu_launched(cu_backend *b, cudaError_t rc, const char *what);

/* profile.c: kernel times by pass shape (tags: rows, or Q35_PROF_MTP + rows
 * for the MTP head; backend/profile.h's table), printed to stderr at close. */
typedef struct cu_prof cu_prof;
int q35_cu_prof_wanted(void);
void q35_cu_prof_mark(cu_backend *b, int32_t tag);
void q35_cu_prof_kernel(cu_backend *b, const char *name);
void q35_cu_prof_harvest(cu_backend *b);
int32_t q35_cu_prof_pending(const cu_backend *b); /* events recorded, not yet read */
void q35_cu_prof_report(cu_backend *b);

/* state.c */
q35_status q35_cu_state_new(q35_backend *b, int32_t n_ctx, q35_bstate **out, q35_error *err);
void q35_cu_state_free(q35_bstate *st);
void q35_cu_state_clear(q35_bstate *st);
q35_status q35_cu_state_set_spec(q35_bstate *st, int32_t k, q35_error *err);
void q35_cu_state_rewind(q35_bstate *st, int32_t n_keep);
q35_status q35_cu_snapshot_take(const q35_bstate *st, int32_t pos, int32_t n_kept, int mtp, q35_bsnap **out,
                                size_t *bytes, q35_error *err);
void q35_cu_snapshot_restore(q35_bstate *st, const q35_bsnap *snap);
void q35_cu_snapshot_free(q35_bsnap *snap);

#endif
