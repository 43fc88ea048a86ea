/* cpu.h: the host backend, shared by the CPU backend (cpuid-chosen kernels,
 * a pool of workers) and the scalar reference backend (backend/ref: the
 * reference kernels, one thread). Both keep weights where they are mapped
 * and every state in host memory.
 *
 *   cpu.c    the backend object, its scratch, the forward pass's blocks
 *            (begin / layer / end), logits, the MTP head
 *   state.c  sequence states, per-row states for rewinding, snapshots
 *
 * Scratch for one forward pass (Q35_UBATCH rows) belongs to the backend,
 * not to a sequence: calls on one backend never overlap, and the attention
 * part grows with the largest context of any state (sized in state_new,
 * never during a pass). */
#ifndef Q35_BACKEND_CPU_H
#define Q35_BACKEND_CPU_H

#include "backend/backend.h"
#include "backend/cpu/attention.h"
#include "backend/cpu/compute.h"
#include "backend/cpu/gdn.h"

typedef struct q35_host_backend {
    q35_backend base;
    q35_backend_ops ops;            /* the shared table, under this backend's name */
    q35_host host;
    const q35_config *c;
    const q35_weights *w;
    const q35_tensor *draft_head;   /* the draft logits' rows: lm_head or a subset copy */
    int32_t kv_cache;               /* a q35_kv_cache, for the states made from now on */
    /* scratch of one pass */
    float *x, *xn, *tmp;            /* (UBATCH, H) residual stream, normed input, block output */
    float *mlp_gate, *mlp_up;       /* (UBATCH, I) */
    float *mixer;                   /* GDN or attention scratch for mixer_ctx positions */
    int32_t mixer_ctx;
    float *mtp_x, *mtp_xn, *mtp_cat; /* (UBATCH, H), (UBATCH, H), (UBATCH, 2H) */
    /* the pass in flight (begin .. end) */
    const q35_bseq *seqs;
    int32_t n_seqs, n_rows;
    double prof_t0, prof_t_end;     /* Q35_PROFILE: the pass's begin (0: none open) and end */
    int32_t prof_pass_rows;
} q35_host_backend;

struct q35_bstate {
    q35_host_backend *b;
    int32_t n_ctx;
    float *conv_state[Q35_MAX_LAYERS]; /* (CD, CK-1) GDN layers only */
    float *ssm_state[Q35_MAX_LAYERS];  /* (HV, DK, DV) GDN layers only */
    int32_t kv_q8;                     /* 1: the KV caches hold 8-bit rows (attention.h) */
    size_t kv_row_bytes;               /* one head's row of one position: HD floats or q8 bytes */
    uint8_t *k_cache[Q35_MAX_LAYERS];  /* (NKV, n_ctx, row) full layers only (attention.h) */
    uint8_t *v_cache[Q35_MAX_LAYERS];
    float *state_block;                /* one allocation behind every conv and ssm state */
    size_t state_floats;
    /* speculation (state_set_spec) */
    int32_t spec_k;
    float *row_states;                 /* (spec_k, state_floats): state_block after each row of a rewindable pass */
    uint8_t *mtp_k_cache, *mtp_v_cache; /* (NKV, n_ctx, row) the MTP layer's own KV */
    float *kept;                       /* (SPEC_MAX+1, H) post-norm hidden rows waiting for the MTP */
    float *draft_hidden;               /* (H) MTP output of the last draft row (chained drafts) */
};

/* A host backend computing with kernel table k on n_threads workers (1: no
 * pool, everything on the calling thread; <= 0: one per core). */
q35_status q35_host_backend_open(const char *name, const q35_kernels *k, int32_t n_threads, const q35_config *c,
                                 const q35_weights *w, q35_backend **out, q35_error *err);

/* state.c */
q35_status q35_host_state_new(q35_backend *b, int32_t n_ctx, q35_bstate **out, q35_error *err);
void q35_host_state_free(q35_bstate *st);
void q35_host_state_clear(q35_bstate *st);
q35_status q35_host_state_set_spec(q35_bstate *st, int32_t k, q35_error *err);
void q35_host_state_rewind(q35_bstate *st, int32_t n_keep);
void q35_host_state_fill(q35_bstate *st, int32_t pos, uint64_t seed);
q35_status q35_host_snapshot_take(const q35_bstate *st, int32_t pos, int32_t n_kept, int mtp, q35_bsnap **out,
                                  size_t *bytes, q35_error *err);
void q35_host_snapshot_restore(q35_bstate *st, const q35_bsnap *snap);
void q35_host_snapshot_free(q35_bsnap *snap);
/* Grows the pass scratch to hold attention over n_ctx positions. */
q35_status q35_host_scratch_fit(q35_host_backend *b, int32_t n_ctx, q35_error *err);

#endif
