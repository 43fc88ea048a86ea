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
 * With an MTP head the session speculates (k = 1), so the head runs over
 * every row but each window's last and its matrices' inputs are summed too
 * (not the lm_head's inside the head: drafts compute no logits here).
 * Matrices that never ran (the vision tower) have none. */
#ifndef Q35_CORE_CALIB_H
#define Q35_CORE_CALIB_H

#include "core/session.h"
#include "formats/gptq.h"

typedef struct q35_calib q35_calib;

/* only (n_only names of bound matrices; NULL: every matrix) limits the sums
 * to the inputs of those matrices, so a large model can be calibrated a few
 * layers at a time; a sum shared by several matrices is kept if any of
 * them is named, and is the same whatever else is named. */
q35_status q35_calib_collect(q35_engine *e, const int32_t *ids, int32_t n, int32_t win, const char *const *only,
                             int32_t n_only, q35_calib **out, q35_error *err);
void q35_calib_free(q35_calib *c);

/* *g = the GPTQ factor (q35_gptq_make with Q35_GPTQ_DAMP, act order) of the input of
 * the matrix bound as `name`, made on first use and kept with the
 * statistics, or NULL when the matrix never ran; *rows (if not NULL) gets
 * the number of rows summed. */
q35_status q35_calib_factor(q35_calib *c, const char *name, const q35_gptq **g, int64_t *rows, q35_error *err);

/* The engine's bound matrix `name` (F32, F16 or BF16) coded as dt (BFP4 or
 * BFP8) by the calibrated encoder (q35_bfp_pack_gptq with the exponent
 * search, act order) on n_threads threads, into a new 64-byte aligned
 * buffer of q35_cache_tensor_bytes (the bytes `prepare --calibrate` stores);
 * *out NULL when the matrix's input was not summed. Free with free(). */
q35_status q35_calib_encode(q35_calib *c, const char *name, q35_dtype dt, int n_threads, void **out, size_t *bytes,
                            q35_error *err);

#endif
