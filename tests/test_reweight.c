/* Replacing one weight of a loaded engine (q35_engine_set_weight, the
 * mechanism of `qwen35 eval --sweep`): the logits must be bit for bit those
 * of a weight cache prepared with the same tensor overridden, binding the
 * model's own tensor again must give the checkpoint's logits back, and a
 * replacement that cannot be bound is refused with the engine unchanged. */
#include "core/session.h"
#include "model/prepare.h"
#include "helpers.h"
#include "test.h"

static const int32_t k_ids[] = {11, 200, 3, 57, 99, 140, 7, 250, 31, 64, 128, 5, 77, 190, 42, 300};
#define N_IDS ((int32_t)(sizeof k_ids / sizeof k_ids[0]))

/* Logits of every position of k_ids from a fresh session of e (NULL on failure). */
static float *logits_of(q35_engine *e) {
    q35_session *s = NULL;
    q35_error err = {0};
    int32_t V = q35_engine_info(e)->vocab_size;
    float *l = malloc(sizeof(float) * (size_t)N_IDS * (size_t)V);
    if (!l || q35_session_new(e, N_IDS, &s, &err) || q35_session_eval(s, k_ids, N_IDS, l, Q35_EVAL_ALL_LOGITS, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        free(l);
        l = NULL;
    }
    q35_session_free(s);
    return l;
}

/* src (a checkpoint tensor) encoded as dt into a new buffer (t->data). */
static void encode(const q35_tensor *src, q35_dtype dt, q35_tensor *t) {
    int64_t rows = src->shape[0], cols = src->shape[1];
    float *f = malloc(sizeof(float) * (size_t)(rows * cols));
    *t = *src;
    t->dtype = dt;
    t->nbytes = q35_dtype_bytes(dt, rows, cols);
    void *d = aligned_alloc(64, (t->nbytes + 63) / 64 * 64);
    q35_dtype_decode(src->dtype, src->data, cols, 0, rows * cols, f);
    q35_dtype_encode(dt, d, f, rows, cols);
    t->data = d;
    free(f);
}

/* Loads the cache prepared from model with the bf16 policy and `set`
 * (NAME=DTYPE), and returns its logits and bytes per token. */
static float *cache_logits(const char *model, const char *set, int64_t *bytes_per_token) {
    char out[1200];
    snprintf(out, sizeof out, "%s/cache", q35_test_tmpdir());
    const char *overrides[] = {set};
    q35_prepare_params p = {.checkpoint = model, .out_dir = out, .policy = Q35_POLICY_BF16, .overrides = overrides,
                            .n_overrides = 1, .force = 1};
    q35_error err = {0};
    q35_engine *e = NULL;
    if (q35_prepare(&p, &err) || q35_engine_load(out, NULL, &e, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        return NULL;
    }
    float *l = logits_of(e);
    *bytes_per_token = q35_engine_info(e)->bytes_per_token;
    q35_engine_free(e);
    return l;
}

static void check_swap(const char *model_rel, const char *name, q35_dtype dt, const char *set) {
    const char *model = q35_test_path(model_rel);
    q35_engine *e = NULL;
    q35_error err = {0};
    REQUIRE_MSG(!q35_engine_load(model, NULL, &e, &err), "%s", err.msg);
    int32_t V = q35_engine_info(e)->vocab_size;
    size_t n = sizeof(float) * (size_t)N_IDS * (size_t)V;
    float *orig = logits_of(e);
    const q35_tensor *slot = q35_engine_weight(e, name);
    REQUIRE_MSG(orig && slot, "%s: no weight %s", model_rel, name);
    q35_tensor own = *slot, made;
    encode(&own, dt, &made);

    q35_session *s = NULL;
    REQUIRE(!q35_session_new(e, 8, &s, &err));
    CHECK_EQ_INT(q35_engine_set_weight(e, name, &made, &err), Q35_ERR_ARG); /* a session is open */
    CHECK(strstr(err.msg, "session") != NULL);
    q35_session_free(s);

    REQUIRE_MSG(!q35_engine_set_weight(e, name, &made, &err), "%s", err.msg);
    CHECK_EQ_INT(q35_engine_weight(e, name)->dtype, dt);
    int64_t want_bpt = 0;
    float *swapped = logits_of(e), *cached = cache_logits(model, set, &want_bpt);
    REQUIRE(swapped && cached);
    CHECK_MSG(!memcmp(swapped, cached, n), "%s: %s replaced in memory and prepared --set %s give different logits",
              model_rel, name, set);
    CHECK_MSG(memcmp(swapped, orig, n), "%s: replacing %s changed nothing", model_rel, name);
    CHECK_EQ_INT(q35_engine_info(e)->bytes_per_token, want_bpt);

    REQUIRE_MSG(!q35_engine_set_weight(e, name, &own, &err), "%s", err.msg);
    float *back = logits_of(e);
    REQUIRE(back);
    CHECK_MSG(!memcmp(back, orig, n), "%s: the model's own %s bound again does not give its logits back", model_rel, name);

    q35_tensor bad = made;
    bad.shape[0] -= 16;
    CHECK_EQ_INT(q35_engine_set_weight(e, name, &bad, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "does not fit") != NULL);
    CHECK_EQ_INT(q35_engine_set_weight(e, "model.language_model.norm.weight", &made, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "no matrix") != NULL);
    float *still = logits_of(e);
    REQUIRE(still);
    CHECK_MSG(!memcmp(still, orig, n), "%s: a refused replacement changed the logits", model_rel);
    free(orig); free(swapped); free(cached); free(back); free(still);
    free((void *)made.data);
    q35_engine_free(e);
}

TEST(reweight, a_matrix_replaced_in_memory_equals_the_prepared_cache) {
    check_swap("models/tiny-a", "model.language_model.layers.0.mlp.down_proj.weight", Q35_DT_BFP4,
               "model.language_model.layers.0.mlp.down_proj.weight=bfp4");
    check_swap("models/tiny-b", "model.language_model.layers.2.self_attn.q_proj.weight", Q35_DT_BFP8,
               "model.language_model.layers.2.self_attn.q_proj.weight=bfp8");
}

TEST(reweight, a_tied_embedding_replaces_the_lm_head_too) {
    check_swap("models/tiny-c", "model.language_model.embed_tokens.weight", Q35_DT_BFP4,
               "model.language_model.embed_tokens.weight=bfp4");
}
