/* prepare.h: writing a weight cache for the Qwen3.5 model (prepare.c,
 * policy.c) and checking one: the dtype policy, q35_prepare, q35_cache_verify,
 * and the model's tensor list that a cache is planned from. The cache file
 * format itself is formats/cache.h; this is what knows the model. */
#ifndef Q35_MODEL_PREPARE_H
#define Q35_MODEL_PREPARE_H

#include "formats/cache.h"

/* ---- the dtype policy: which dtype each tensor gets in a cache (policy.c) ---- */
typedef enum q35_policy_id {
    Q35_POLICY_DEFAULT = 0, /* projections BFP4; embedding and lm_head BFP8; small tensors as stored */
    Q35_POLICY_BF16,        /* every tensor as stored (F32 matrices rounded to BF16) */
    Q35_POLICY_BFP8,        /* every matrix BFP8 */
    Q35_POLICY_BFP4_ALL,    /* every matrix BFP4, embedding and lm_head included */
    Q35_POLICY_TUNED,       /* default's dtypes; BFP4 encoded with the exponent search (docs/weight-cache.md) */
    Q35_POLICY_COUNT
} q35_policy_id;

const char *q35_policy_name(q35_policy_id p);
q35_status q35_policy_parse(const char *name, q35_policy_id *out, q35_error *err);
/* The stored dtype of tensor `name` (source dtype src, shape) under p. */
q35_dtype q35_policy_dtype(q35_policy_id p, const char *name, q35_dtype src, int ndim, const int64_t *shape);
/* The encoder flags (bfp.h) p writes a tensor of dtype dt with, overrides included: 0 or Q35_BFP_EXP_SEARCH. */
unsigned q35_policy_encode_flags(q35_policy_id p, q35_dtype dt);

/* ---- prepare / verify ---- */
typedef struct q35_prepare_params {
    const char *checkpoint;   /* source checkpoint directory (or NULL with synthetic) */
    const char *out_dir;      /* cache directory to create */
    q35_policy_id policy;
    const char *expect;       /* NULL, or a JSON file of expected source files (size, sha256) */
    const char *synthetic;    /* NULL, "qwen3.5-9b" (exact shapes), or a config.json path: pseudo-random weights */
    int force;                /* replace a different cache in out_dir */
    const char *const *overrides; /* "TENSOR=DTYPE" (bf16, bfp8, bfp4, stored): exceptions to the policy */
    int32_t n_overrides;
    q35_progress_fn progress;
    void *progress_ctx;
    /* Calibrated encoding (qwen35 prepare --calibrate): called once with the
     * planned items (dtypes decided, overrides applied) after the output
     * directory is found out of date; it may set an item's `encoded` to its
     * stored bytes, made otherwise than by the plain encoders (kept alive by
     * the caller until q35_prepare returns). calibration_id names what they
     * were made from; it is part of the cache's identity and of the manifest. */
    q35_status (*calibrate)(void *ctx, q35_cache_item *items, int32_t n, q35_error *err);
    void *calibrate_ctx;
    const char *calibration_id;
} q35_prepare_params;

q35_status q35_prepare(const q35_prepare_params *p, q35_error *err);

/* Re-hashes every tensor of the cache in dir against its table and the
 * manifest. On a mismatch returns Q35_ERR_FORMAT; `report` (if not NULL)
 * receives one line per bad tensor. */
typedef void (*q35_report_fn)(void *ctx, const char *line);
q35_status q35_cache_verify(const char *dir, q35_report_fn report, void *report_ctx, q35_progress_fn progress,
                            void *progress_ctx, q35_error *err);

/* The text_config of Qwen3.5-9B (spec qwen35-model.md 1.2), as a full
 * config.json document (a new heap string). */
char *q35_config_json_9b(void);

/* The tensors (name, source dtype, shape) of the model a config describes,
 * text model and MTP head, in binding order. *items is a new array. */
q35_status q35_model_tensors(const char *config_json, q35_cache_item **items, int32_t *n, q35_error *err);

#endif
