/* eval.h: what `qwen35 eval` (tools/eval.c) shares with its per-tensor
 * sweep (tools/eval_sweep.c): a loaded model with one session, and the
 * window loop that scores a token sequence against a base model. */
#ifndef Q35_TOOLS_EVAL_H
#define Q35_TOOLS_EVAL_H

#include "qwen35.h"
#include "core/calib.h"

#define EVAL_SLICE 64 /* rows of logits computed at a time */

typedef struct eval_model {
    q35_engine *e;
    q35_session *s; /* of the window length */
    float *logits;  /* (EVAL_SLICE, V) */
} eval_model;

/* Sums over the scored positions (every position of a window but its last). */
typedef struct eval_stats {
    long scored, agree;      /* positions; those where both models' top-1 tokens agree */
    double nll, nll_base;    /* -log p(next) of the model and of the base */
    double kld, kld_max;     /* KL(base || model) in nats: sum and largest */
} eval_stats;

/* Loads path with a session of ctx positions; on failure prints why and returns -1. */
int eval_open(const char *path, long threads, int32_t kv_cache, int32_t ctx, eval_model *m);
void eval_close(eval_model *m);
/* ids cut into windows of win tokens, each from an empty session, through m
 * and (when not NULL) b in step; 0, or 1 after printing why. */
int eval_windows(eval_model *m, eval_model *b, const int32_t *ids, int32_t n, int32_t win, eval_stats *out);
/* --sweep DTYPE (tools/eval_sweep.c): every group of m's matrices in turn
 * stored as DTYPE, encoded from b's weights (block formats with GPTQ where
 * calib, collected on b, has the input; else plainly); prints the table (or
 * JSON); returns the exit status. group: "tensor", "kind" or "layer". */
int eval_sweep(eval_model *m, eval_model *b, const int32_t *ids, int32_t n, int32_t win, const char *dtype,
               const char *group, int json, q35_calib *calib);

#endif
