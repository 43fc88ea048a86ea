/* policy.c: the weight cache's dtype policies: which dtype each tensor of
 * the model is stored in (prepare.h). */
#include "model/prepare.h"
#include "model/tensors.h"
#include "formats/bfp.h"

static const char *const policy_names[Q35_POLICY_COUNT] = {"default", "bf16", "bfp8", "bfp4-all", "tuned"};

const char *q35_policy_name(q35_policy_id p) { return p < Q35_POLICY_COUNT ? policy_names[p] : "?"; }

q35_status q35_policy_parse(const char *name, q35_policy_id *out, q35_error *err) {
    for (int i = 0; i < Q35_POLICY_COUNT; i++)
        if (!strcmp(name, policy_names[i])) { *out = (q35_policy_id)i; return Q35_OK; }
    return q35_fail(err, Q35_ERR_ARG, "unknown policy '%s' (choose default, bf16, bfp8, bfp4-all or tuned)", name);
}

q35_dtype q35_policy_dtype(q35_policy_id p, const char *name, q35_dtype src, int ndim, const int64_t *shape) {
    /* The vision tower is read once per image, not per token: its bandwidth
     * does not matter and its exactness does, so every policy keeps it as
     * the checkpoint stores it (docs/weight-cache.md). */
    if (!strncmp(name, "model.visual.", 13)) return src;
    int matrix = ndim == 2 && shape[1] % Q35_BFP_BLOCK == 0 && shape[0] > 0;
    q35_tensor_role role = q35_tensor_role_of(name);
    q35_dtype stored = ndim == 2 && src == Q35_DT_F32 && p == Q35_POLICY_BF16 ? Q35_DT_BF16 : src;
    if (!matrix || p == Q35_POLICY_BF16) return stored;
    switch (p) {
    case Q35_POLICY_BFP8: return Q35_DT_BFP8;
    case Q35_POLICY_BFP4_ALL: return Q35_DT_BFP4;
    default: break;
    }
    /* default and tuned: chosen by `qwen35 eval --kld-base` on the test models
     * (docs/weight-cache.md): BFP8 for the embedding and lm_head measured
     * the same as BF16 at half the bytes; BFP4 there cost measurably more. */
    if (role == Q35_ROLE_EMBED || role == Q35_ROLE_HEAD) return Q35_DT_BFP8;
    return role == Q35_ROLE_PROJECTION ? Q35_DT_BFP4 : src;
}

/* tuned: the exponent search (bfp.h) lowered the demo model's mean KL by
 * 10% at the same bytes, read by the same kernels (docs/weight-cache.md).
 * Its BFP8 tensors keep the plain encoder: every matrix at BFP8 adds only
 * 1e-4 nats (the bfp8 policy), so there is little left to gain. */
unsigned q35_policy_encode_flags(q35_policy_id p, q35_dtype dt) {
    return p == Q35_POLICY_TUNED && dt == Q35_DT_BFP4 ? Q35_BFP_EXP_SEARCH : 0u;
}
