/* gdn.h: the Gated DeltaNet layer (Qwen3.5's linear-attention mixer).
 *
 * Per layer and sequence it keeps two states:
 *   conv_state (CD, CK-1)   the last CK-1 raw (pre-conv) qkv inputs, oldest first
 *   ssm_state  (HV, DK, DV) the delta-rule memory S, fp32
 * Prompts use the chunked algorithm (chunk 64), single tokens the
 * recurrence; both compute the same function up to rounding. */
#ifndef Q35_GDN_H
#define Q35_GDN_H

#include "backend/cpu/compute.h"
#include "model/model.h"

/* One sequence's rows within a batch, and that sequence's layer state.
 * With rows_conv and rows_ssm (recurrent path only: a rewindable pass), the states after each
 * row t < n_rows-1 are also written to ckpt_* + t*rows_stride. */
typedef struct q35_gdn_seg {
    int32_t row0, n_rows;
    float *conv_state;   /* (CD, CK-1) */
    float *ssm_state;    /* (HV, DK, DV) */
    float *rows_conv, *rows_ssm;
    size_t rows_stride;
    int recurrent;       /* run the recurrence even for many rows */
} q35_gdn_seg;

/* Scratch floats q35_gdn_forward needs for n_tok rows and n_workers threads. */
size_t q35_gdn_scratch_floats(const q35_config *c, int32_t n_tok, int32_t n_workers);

/* out (n_tok, H) = GDN mixer of xn (n_tok, H), where the rows are split into
 * sequences (segs), each advancing its own state. Projections run once over
 * all rows; (sequence, head) pairs are spread over the pool (with one row
 * per sequence, K heads: a worker computes its heads' projections). */
void q35_gdn_forward(const q35_host *h, const q35_config *c, const q35_layer_weights *l, const q35_gdn_seg *segs,
                     int32_t n_segs, const float *xn, float *out, int32_t n_tok, float *scratch);

/* The two delta-rule kernels, per V head, exposed for tests: the kernel
 * table's gdn_recurrent and gdn_chunked of the cpuid-chosen table (kernels.h;
 * scratch for the chunked one: q35_gdn_chunk_scratch_floats).
 * S (DK, DV); q, k (T, DK) already L2-normalised, q scaled; v (T, DV); g, beta (T); o (T, DV). */
void q35_gdn_recurrent(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                       float *o, int32_t T, int32_t DK, int32_t DV, float *S_after, size_t after_stride);
void q35_gdn_chunked(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                     float *o, int32_t T, int32_t DK, int32_t DV, float *scratch);

#endif
