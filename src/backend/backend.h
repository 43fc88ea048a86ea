/* backend.h: the compute-backend seam.
 *
 * A backend is one model loaded onto one device. It owns where the weights
 * and every sequence's state live (host memory, device memory) and runs the
 * model's blocks: a batch of rows through one decoder layer, the LM head,
 * the MTP head. The core (src/core) writes the forward pass once against
 * these operations and keeps everything that is not arithmetic: positions,
 * which rows belong to which session, speculation (drafting, acceptance,
 * rollback), sampling, snapshots as objects, scheduling. Nothing here knows
 * about tokens' meaning or about sessions' bookkeeping.
 *
 * One forward pass over T rows drawn from several sequences:
 *
 *   begin(seqs, tokens)      embed the rows; stage the batch
 *   layer(0) .. layer(L-1)   x += mixer(norm(x)); x += mlp(norm(x)), each
 *                            sequence's rows against its own state
 *   end()                    final norm: the output rows (post-norm hidden)
 *   logits(rows) / keep_rows / mtp(FROM_FORWARD ...)   read the output rows
 *
 * Between begin() and end() nothing returns to the caller but control: the
 * operations may be asynchronous (a device stream), and a backend may
 * capture begin..end as one graph and replay it for a batch of the same
 * shape. Only logits() and mtp() with logits hand results back to host
 * memory. Calls on one backend never overlap.
 *
 * Results must not depend on the batch: row r of a sequence gives the same
 * bits whether it runs alone or beside other sequences' rows, and with
 * `recurrent` set the Gated DeltaNet runs row by row as a one-token step
 * does (what makes a speculative verify row equal to plain decode). */
#ifndef Q35_BACKEND_H
#define Q35_BACKEND_H

#include "model/model.h"

#define Q35_UBATCH 128  /* most rows in one forward pass */
#define Q35_SPEC_MAX 8  /* most draft tokens per speculative step (qwen35.h Q35_SPEC_K_MAX) */

typedef struct q35_backend q35_backend;   /* one model on one device */
typedef struct q35_bstate q35_bstate;     /* one sequence's state on that device */
typedef struct q35_bsnap q35_bsnap;       /* a copy of a state's first pos positions */

/* What multimodal rows add to a run of rows (q35_bseq.mm, mtp's mm; NULL
 * for plain text, whose rotary position is its cache position). Row i's
 * rotary position is (t, h, w) = pos3[3i..3i+2] when pos3 is given, else
 * cache position + rope_delta on all three axes (text after an image);
 * its input is embed[i] (H floats, host memory) instead of its token's
 * embedding where embed and embed[i] are not NULL. */
typedef struct q35_bmm {
    int32_t rope_delta;
    const int32_t *pos3;       /* (n_rows, 3) or NULL */
    const float *const *embed; /* (n_rows) or NULL */
} q35_bmm;

/* One sequence's rows in a forward pass: rows [row0, row0 + n_rows) of the
 * batch, at cache positions pos0.., against its state. */
typedef struct q35_bseq {
    q35_bstate *state;
    int32_t row0, n_rows, pos0;
    int recurrent;   /* Gated DeltaNet row by row (the decode form) however many rows */
    int rewindable;  /* keep the state after each row, so rewind() may drop rows (implies recurrent) */
    const q35_bmm *mm; /* NULL: text rows */
} q35_bseq;

/* Where the hidden states of MTP rows come from. */
typedef enum q35_mtp_src {
    Q35_MTP_FROM_FORWARD = 0, /* output rows of the last forward pass, from row0 */
    Q35_MTP_FROM_KEPT = 1,    /* the state's kept rows (keep_rows), from row0 */
    Q35_MTP_FROM_DRAFT = 2,   /* the state's last MTP output (a chained draft); one row */
} q35_mtp_src;

/* A calibration tap (set_tap): the n matrices Ws about to be multiplied
 * by the same input rows x (n_tok, n_in), row-major floats. */
typedef void (*q35_matmul_tap)(void *ctx, int n, const q35_tensor *const *Ws, const float *x, int64_t n_tok);

typedef struct q35_backend_ops {
    const char *name; /* "cpu", "ref", "cuda" */
    void (*close)(q35_backend *b);
    /* The kernels in use and a note for the user, or NULL (qwen35.h q35_engine_kernels). */
    const char *(*kernels)(const q35_backend *b, const char **note);
    int32_t (*threads)(const q35_backend *b);

    /* ---- sequence state: KV caches, GDN conv and recurrent states ---- */
    q35_status (*state_new)(q35_backend *b, int32_t n_ctx, q35_bstate **out, q35_error *err);
    void (*state_free)(q35_bstate *st);
    void (*state_clear)(q35_bstate *st); /* back to position 0: recurrent states zeroed */
    /* Room for speculation with k drafts: the MTP layer's KV cache, k+1 kept
     * hidden rows, and the per-row states of a rewindable pass of k+1 rows.
     * k = 0 releases nothing but marks them unused. */
    q35_status (*state_set_spec)(q35_bstate *st, int32_t k, q35_error *err);
    /* After a rewindable pass of n_rows rows: the state as it was after row
     * n_keep-1 (1 <= n_keep < n_rows). Attention rows past it are simply
     * overwritten later, so only recurrent states move. */
    void (*state_rewind)(q35_bstate *st, int32_t n_keep);
    /* For timing at a context depth (qwen35 speed --depth): positions
     * [0, pos) of every attention cache (the MTP layer's too where it has
     * room) and the recurrent states filled with pseudo-random values from
     * seed, small and finite, nothing a model would compute; the same seed
     * gives the same values. NULL: the backend has none. */
    void (*state_fill)(q35_bstate *st, int32_t pos, uint64_t seed);

    /* ---- snapshots: positions [0, pos), the kept rows [0, n_kept) and, with
     * mtp, the MTP layer's KV rows; *bytes is what the copy holds ---- */
    q35_status (*snapshot_take)(const q35_bstate *st, int32_t pos, int32_t n_kept, int mtp, q35_bsnap **out,
                                size_t *bytes, q35_error *err);
    /* Into a state with room for the snapshot's positions (the core checks). */
    void (*snapshot_restore)(q35_bstate *st, const q35_bsnap *snap);
    void (*snapshot_free)(q35_bsnap *snap);

    /* ---- one forward pass (see the head of this file) ---- */
    void (*begin)(q35_backend *b, const q35_bseq *seqs, int32_t n_seqs, const int32_t *tokens, int32_t n_rows);
    void (*layer)(q35_backend *b, int32_t li);
    void (*end)(q35_backend *b);
    /* out (n, vocab) = lm_head of output rows [row0, row0 + n), into host memory. */
    void (*logits)(q35_backend *b, int32_t row0, int32_t n, float *out);
    /* Copies output rows [row0, row0 + n) to st's kept rows [0, n) (n <= Q35_SPEC_MAX + 1). */
    void (*keep_rows)(q35_backend *b, q35_bstate *st, int32_t row0, int32_t n);

    /* ---- the MTP head ----
     * n rows pairing hidden states (from src, starting at row0) with the
     * next tokens, at positions pos0..: they write the MTP layer's KV cache
     * of st. With logits, the last row's draft logits over the draft head
     * (set_draft_head) go to host memory and its MTP output is kept as st's
     * draft row (Q35_MTP_FROM_DRAFT). */
    void (*mtp)(q35_backend *b, q35_bstate *st, q35_mtp_src src, int32_t row0, const int32_t *next, int32_t n,
                int32_t pos0, const q35_bmm *mm, float *logits);
    /* The rows the draft logits come from: head (n_draft, H), a copy of some
     * of lm_head's rows in its dtype that the caller keeps alive, or NULL for
     * lm_head itself. */
    q35_status (*set_draft_head)(q35_backend *b, const q35_tensor *head, q35_error *err);

    /* The KV cache format (a q35_kv_cache) of the states made after this
     * call; the engine sets it once, before any state. NULL: fp32 only. */
    q35_status (*set_kv_cache)(q35_backend *b, int32_t kv_cache, q35_error *err);

    /* ---- the vision tower (model.visual.*) ----
     * out (sum t*h*w / MS^2, VO) = the tower over n_images images, their
     * pixel rows (sum t*h*w, C*TP*PS*PS) one image after another, each with
     * its grid_thw row; host memory in and out, outside any forward pass.
     * Q35_ERR_UNSUPPORTED when the weights hold no tower or the backend has
     * none (NULL: the same). */
    q35_status (*encode_images)(q35_backend *b, const float *pixel_values, int32_t n_images,
                                const int32_t (*grid_thw)[3], float *out, q35_error *err);

    /* Calibration (qwen35 prepare --calibrate): tap (NULL: none) sees every
     * matmul of the text model and the MTP head before it runs, with the
     * bound weights' tensors (the q35_weights handed to open) and their
     * input rows. NULL: the backend cannot (its inputs live on a device). */
    void (*set_tap)(q35_backend *b, q35_matmul_tap tap, void *ctx);

    /* The first failure of an operation above that returns nothing (a device
     * fault, a failed copy), or Q35_OK; after one, a backend may do nothing
     * more (q35_backend_status). */
    q35_status (*status)(q35_backend *b, q35_error *err);
} q35_backend_ops;

/* Every backend's handle starts with this. */
struct q35_backend {
    const q35_backend_ops *ops;
};

/* ops->status through a NULL check (a backend may leave it out). */
static inline q35_status q35_backend_status(q35_backend *b, q35_error *err) {
    return b->ops->status ? b->ops->status(b, err) : Q35_OK;
}

/* Opens backend `name` ("cpu", "ref", "cuda" in a CUDA build; NULL: the environment variable
 * Q35_BACKEND, else "cpu") over bound weights, which the caller keeps alive
 * (a backend may copy or repack them onto its device). n_threads <= 0: one
 * per core, for backends that use host threads. An unknown name fails with
 * Q35_ERR_ARG and lists the backends there are. */
q35_status q35_backend_open(const char *name, const q35_config *c, const q35_weights *w, int32_t n_threads,
                            q35_backend **out, q35_error *err);

/* The backends of this build, by name. */
q35_status q35_backend_cpu_open(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                                q35_error *err);
q35_status q35_backend_ref_open(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                                q35_error *err);
/* Built with CUDA=1 (Q35_CUDA) only: device 0, or Q35_ERR_UNSUPPORTED naming what is missing. */
q35_status q35_backend_cuda_open(const q35_config *c, const q35_weights *w, int32_t n_threads, q35_backend **out,
                                 q35_error *err);

#endif
