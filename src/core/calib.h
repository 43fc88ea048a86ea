/* calib.h: calibration statistics for the GPTQ encoder (formats/gptq.h):
 * what each matrix of a model sees when the model reads a text.
 *
 * q35_calib_collect runs a token sequence through an engine (windows of win
 * tokens, each from an empty session, every position's logits computed so
 * that the lm_head sees every row) with a tap on its matmuls (backend.h
 * set_tap), and sums H = sum x x^T over the input rows of each distinct
 * input: matrices multiplied by the same rows in one call (q/k/v; the Gated
 * DeltaNet's in_proj_qkv, z, a, b; gate and up) share one H. Sums are in
 * double precision in row order, on the calling thread, so they do not
 * depend on the engine's thread count (the rows themselves do not either).
 * Matrices that never ran (the MTP head when nothing drafts, the vision
 * tower) have none. */
#ifndef Q35_CORE_CALIB_H
#define Q35_CORE_CALIB_H

#include "core/session.h"
#include "formats/gptq.h"

typedef struct q35_calib q35_calib;

q35_status q35_calib_collect(q35_engine *e, const int32_t *ids, int32_t n, int32_t win, q35_calib **out,
                             q35_error *err);
void q35_calib_free(q35_calib *c);

/* *g = the GPTQ factor (q35_gptq_make with Q35_GPTQ_DAMP, act order) of the input of
 * the matrix bound as `name`, made on first use and kept with the
 * statistics, or NULL when the matrix never ran; *rows (if not NULL) gets
 * the number of rows summed. */
q35_status q35_calib_factor(q35_calib *c, const char *name, const q35_gptq **g, int64_t *rows, q35_error *err);

#endif
