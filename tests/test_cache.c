/* Weight cache tests: prepare the tiny checkpoints under every policy, load
 * the caches, compare logits with the checkpoint (bf16: bit-identical;
 * block formats: every weight within its block's quantization step), and
 * break caches and sources in the ways the issue lists: each must fail
 * with an error naming the file or tensor. */
#include "formats/bfp.h"
#include "model/prepare.h"
#include "backend/cpu/kernels/kernels.h"
#include "helpers.h"
#include "test.h"

#include <jansson.h>
#include <sys/stat.h>
#include <unistd.h>

static const char *model_dir(const char *name) { return q35_test_path(name); }

static const char *tmp_path(const char *name) {
    static char bufs[8][1200];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", q35_test_tmpdir(), name);
    return b;
}

static q35_status prepare(const char *src, const char *out, q35_policy_id policy, q35_error *err) {
    q35_prepare_params p = {.checkpoint = src, .out_dir = out, .policy = policy};
    memset(err, 0, sizeof *err);
    return q35_prepare(&p, err);
}

static float *all_logits_with(const char *dir, const q35_engine_params *params, const int32_t *ids, int32_t n,
                              int32_t *V) {
    q35_engine *e = NULL;
    q35_session *s = NULL;
    q35_error err = {0};
    if (q35_engine_load(dir, params, &e, &err) || q35_session_new(e, n, &s, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
        q35_engine_free(e);
        return NULL;
    }
    *V = q35_engine_info(e)->vocab_size;
    float *l = malloc(sizeof(float) * (size_t)n * (size_t)*V);
    if (q35_session_eval(s, ids, n, l, Q35_EVAL_ALL_LOGITS, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
        free(l);
        l = NULL;
    }
    q35_session_free(s);
    q35_engine_free(e);
    return l;
}

static float *all_logits(const char *dir, const int32_t *ids, int32_t n, int32_t *V) {
    return all_logits_with(dir, NULL, ids, n, V);
}

static const int32_t k_ids[] = {11, 200, 3, 57, 99, 140, 7, 250, 31, 64, 128, 5, 77, 190, 42, 300};
#define N_IDS ((int32_t)(sizeof k_ids / sizeof k_ids[0]))

TEST(cache, bf16_policy_matches_the_checkpoint_exactly) {
    const char *models[] = {"models/tiny-a", "models/tiny-b", "models/tiny-c"};
    for (int m = 0; m < 3; m++) {
        q35_error err;
        const char *out = tmp_path(models[m] + 7);
        REQUIRE_MSG(!prepare(model_dir(models[m]), out, Q35_POLICY_BF16, &err), "%s", err.msg);
        int32_t V1, V2;
        float *a = all_logits(model_dir(models[m]), k_ids, N_IDS, &V1), *b = all_logits(out, k_ids, N_IDS, &V2);
        REQUIRE(a && b && V1 == V2);
        CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)N_IDS * (size_t)V1), "%s: cache logits differ", models[m]);
        free(a);
        free(b);
    }
}

/* Every weight of a block-format cache decodes to the source value within
 * one quantization step of its block (2^(E - 127 - (w - 1))), and bf16 /
 * as-stored tensors are byte-identical. */
static void check_weights(const char *src_dir, const char *cache_dir) {
    q35_checkpoint src, c;
    q35_error err;
    REQUIRE_MSG(!q35_checkpoint_open(src_dir, &src, &err), "%s", err.msg);
    if (q35_cache_open(cache_dir, &c, &err)) {
        q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
        q35_checkpoint_close(&src);
        return;
    }
    for (int32_t i = 0; i < c.n_index; i++) {
        const q35_tensor *t = &c.index[i]->tensor;
        const q35_st_entry *s = q35_checkpoint_find(&src, t->name);
        CHECK_MSG(s != NULL, "%s not in the source", t->name);
        if (!s) continue;
        if (t->dtype == s->tensor.dtype) {
            CHECK_MSG(t->nbytes == s->tensor.nbytes && !memcmp(t->data, s->tensor.data, t->nbytes), "%s changed", t->name);
            continue;
        }
        int w = q35_bfp_mant_bits(t->dtype);
        CHECK_MSG(w > 0 && t->ndim == 2, "%s: unexpected dtype %s", t->name, q35_dtype_name(t->dtype));
        if (w == 0) continue;
        int64_t R = t->shape[0], C = t->shape[1];
        float x[1024], y[1024];
        REQUIRE(C <= 1024);
        for (int64_t r = 0; r < R; r++) {
            q35_get_row_ref(x, &s->tensor, r);
            q35_get_row_ref(y, t, r);
            for (int64_t b = 0; b < C / 16; b++) {
                uint8_t codes[16];
                uint8_t E = q35_bfp_get_block(t->dtype, t->data, C, r, b, codes);
                double step = ldexp(1.0, E - 127 - (w - 1));
                for (int k = 0; k < 16; k++) {
                    double d = fabs((double)x[b * 16 + k] - (double)y[b * 16 + k]);
                    if (d > step) {
                        q35_test_fail(__FILE__, __LINE__, "%s[%lld, %lld]: %g vs %g (step %g)", t->name, (long long)r,
                                      (long long)(b * 16 + k), x[b * 16 + k], y[b * 16 + k], step);
                        r = R, b = C; /* one report per tensor */
                        break;
                    }
                }
            }
        }
    }
    q35_checkpoint_close(&c);
    q35_checkpoint_close(&src);
}

TEST(cache, block_policies_stay_within_the_quantization_step) {
    const q35_policy_id pol[] = {Q35_POLICY_DEFAULT, Q35_POLICY_BFP8, Q35_POLICY_BFP4_ALL};
    for (int p = 0; p < 3; p++) {
        q35_error err;
        const char *out = tmp_path(q35_policy_name(pol[p]));
        REQUIRE_MSG(!prepare(model_dir("models/tiny-c"), out, pol[p], &err), "%s", err.msg);
        check_weights(model_dir("models/tiny-c"), out);
        int32_t V;
        float *l = all_logits(out, k_ids, N_IDS, &V); /* it loads and runs */
        REQUIRE(l);
        for (int32_t i = 0; i < N_IDS * V; i++) CHECK(isfinite(l[i]));
        free(l);
    }
}

/* The tuned policy: default's dtypes; each BFP4 tensor is exactly the
 * exponent-searching encoder's output on the checkpoint's weights (and no
 * worse than the plain encoder's in squared error, better somewhere), each
 * other tensor the default cache's bytes; the manifest says which tensors
 * were searched; two prepares write the same file. */
TEST(cache, tuned_policy_is_default_with_the_exponent_search) {
    q35_error err;
    const char *src = model_dir("models/tiny-b"), *def = tmp_path("def"), *tuned = tmp_path("tuned"),
               *again = tmp_path("tuned2");
    REQUIRE_MSG(!prepare(src, def, Q35_POLICY_DEFAULT, &err), "%s", err.msg);
    REQUIRE_MSG(!prepare(src, tuned, Q35_POLICY_TUNED, &err), "%s", err.msg);
    REQUIRE_MSG(!prepare(src, again, Q35_POLICY_TUNED, &err), "%s", err.msg);
    q35_checkpoint ck = {0}, cd = {0}, ct = {0}, c2 = {0};
    REQUIRE(!q35_checkpoint_open(src, &ck, &err) && !q35_cache_open(def, &cd, &err) && !q35_cache_open(tuned, &ct, &err) &&
            !q35_cache_open(again, &c2, &err));
    char *man_path = q35_path_join(tuned, "manifest.json");
    json_t *man = json_load_file(man_path, 0, NULL), *mt = json_object_get(man, "tensors");
    REQUIRE(mt);
    int n_bfp4 = 0, n_better = 0, n_other = 0;
    for (int32_t i = 0; i < ct.n_index; i++) {
        const q35_tensor *t = &ct.index[i]->tensor, *d = &q35_checkpoint_find(&cd, ct.index[i]->name)->tensor;
        const q35_tensor *t2 = &q35_checkpoint_find(&c2, ct.index[i]->name)->tensor;
        const char *enc = json_string_value(json_object_get(json_object_get(mt, ct.index[i]->name), "encoder"));
        CHECK_EQ_INT(t->dtype, d->dtype);
        CHECK(t->nbytes == t2->nbytes && !memcmp(t->data, t2->data, t->nbytes));
        if (t->dtype != Q35_DT_BFP4) {
            CHECK(t->nbytes == d->nbytes && !memcmp(t->data, d->data, t->nbytes));
            CHECK(enc == NULL);
            n_other++;
            continue;
        }
        n_bfp4++;
        CHECK_STR_EQ(enc, "exponent search");
        const q35_tensor *w = &q35_checkpoint_find(&ck, ct.index[i]->name)->tensor;
        int64_t rows = w->shape[0], cols = w->shape[1];
        void *want = malloc(t->nbytes);
        REQUIRE(!q35_bfp_pack_matrix(Q35_DT_BFP4, want, t->nbytes, w->data, w->dtype, rows, cols, Q35_BFP_EXP_SEARCH,
                                     &err));
        CHECK_MSG(!memcmp(want, t->data, t->nbytes), "%s: not the searching encoder's bytes", ct.index[i]->name);
        double se_t = 0, se_d = 0;
        for (int64_t k = 0; k < rows * cols; k++) {
            double x = q35_tensor_get_f32(w, k), a = x - q35_tensor_get_f32(t, k), b = x - q35_tensor_get_f32(d, k);
            se_t += a * a;
            se_d += b * b;
        }
        CHECK_MSG(se_t <= se_d, "%s: squared error %g with the search, %g without", ct.index[i]->name, se_t, se_d);
        n_better += se_t < se_d;
        free(want);
    }
    CHECK(n_bfp4 > 10 && n_other > 10);
    CHECK_EQ_INT(n_better, n_bfp4); /* every matrix of a trained or random model has blocks that gain */
    CHECK_STR_EQ(json_string_value(json_object_get(man, "policy")), "tuned");
    json_decref(man);
    free(man_path);
    q35_checkpoint_close(&ck);
    q35_checkpoint_close(&cd);
    q35_checkpoint_close(&ct);
    q35_checkpoint_close(&c2);
    CHECK_EQ_INT(q35_policy_encode_flags(Q35_POLICY_TUNED, Q35_DT_BFP4), Q35_BFP_EXP_SEARCH);
    CHECK_EQ_INT(q35_policy_encode_flags(Q35_POLICY_TUNED, Q35_DT_BFP8), 0);
    CHECK_EQ_INT(q35_policy_encode_flags(Q35_POLICY_DEFAULT, Q35_DT_BFP4), 0);
}

TEST(cache, policies_choose_dtypes) {
    int64_t proj[2] = {128, 64}, ab[2] = {6, 64}, odd[2] = {8, 24}, vec[1] = {64};
    const char *q = "model.language_model.layers.0.linear_attn.in_proj_qkv.weight";
    const char *a = "model.language_model.layers.0.linear_attn.in_proj_a.weight";
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_DEFAULT, q, Q35_DT_BF16, 2, proj), Q35_DT_BFP4);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_DEFAULT, a, Q35_DT_BF16, 2, ab), Q35_DT_BF16);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_DEFAULT, "lm_head.weight", Q35_DT_BF16, 2, proj), Q35_DT_BFP8);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_DEFAULT, "model.language_model.embed_tokens.weight", Q35_DT_BF16, 2, proj),
                 Q35_DT_BFP8);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_DEFAULT, "mtp.fc.weight", Q35_DT_BF16, 2, proj), Q35_DT_BFP4);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_BFP8, a, Q35_DT_BF16, 2, ab), Q35_DT_BFP8);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_BFP4_ALL, "lm_head.weight", Q35_DT_BF16, 2, proj), Q35_DT_BFP4);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_BFP4_ALL, q, Q35_DT_BF16, 2, odd), Q35_DT_BF16); /* 24 % 16 != 0 */
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_BFP4_ALL, "x.norm.weight", Q35_DT_F32, 1, vec), Q35_DT_F32);
    CHECK_EQ_INT(q35_policy_dtype(Q35_POLICY_BF16, q, Q35_DT_F32, 2, proj), Q35_DT_BF16);
    /* the vision tower stays as stored under every policy (F32 included) */
    for (int pol = 0; pol < Q35_POLICY_COUNT; pol++)
        for (int f32 = 0; f32 < 2; f32++) {
            q35_dtype dt = f32 ? Q35_DT_F32 : Q35_DT_BF16;
            CHECK_EQ_INT(q35_policy_dtype((q35_policy_id)pol, "model.visual.blocks.0.attn.qkv.weight", dt, 2, proj), dt);
            CHECK_EQ_INT(q35_policy_dtype((q35_policy_id)pol, "model.visual.merger.linear_fc1.weight", dt, 2, proj), dt);
        }
    q35_policy_id id;
    q35_error err = {0};
    CHECK(q35_policy_parse("bfp4-all", &id, &err) == Q35_OK && id == Q35_POLICY_BFP4_ALL);
    CHECK(q35_policy_parse("int4", &id, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "int4") != NULL);
}

/* ---- bad input ---- */

#define EXPECT_ERR(call, status, s1, s2)                                                                   \
    do {                                                                                                 \
        q35_error e_ = {0};                                                                              \
        q35_status st_ = (call);                                                                         \
        CHECK_MSG(st_ == (status), "status %s, expected %s (%s)", q35_status_name(st_), q35_status_name(status), \
                  e_.msg);                                                                               \
        CHECK_MSG(strstr(e_.msg, s1) != NULL, "message '%s' does not mention '%s'", e_.msg, s1);         \
        CHECK_MSG(strstr(e_.msg, s2) != NULL, "message '%s' does not mention '%s'", e_.msg, s2);         \
    } while (0)

TEST(cache, corrupt_truncated_and_mismatched_caches_are_refused) {
    q35_error err;
    const char *out = tmp_path("c");
    REQUIRE_MSG(!prepare(model_dir("models/tiny-a"), out, Q35_POLICY_DEFAULT, &err), "%s", err.msg);
    char path[1300], cfg[1300];
    snprintf(path, sizeof path, "%s/model.q35", out);
    snprintf(cfg, sizeof cfg, "%s/config.json", out);
    size_t len, cfg_len;
    char *orig = test_slurp(path, &len), *orig_cfg = test_slurp(cfg, &cfg_len);
    REQUIRE(orig && orig_cfg && len > 8192);
    EXPECT_ERR(test_try_load(out, &e_), Q35_OK, "", "");
    EXPECT_ERR(q35_cache_verify(out, NULL, NULL, NULL, NULL, &e_), Q35_OK, "", "");

    REQUIRE(test_spit(path, orig, len - 100) == 0); /* truncated */
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_FORMAT, "model.q35", "truncated");
    REQUIRE(test_spit(path, orig, 60) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_FORMAT, "model.q35", "truncated");

    char *bad = malloc(len);
    memcpy(bad, orig, len);
    bad[0] = 'X';
    REQUIRE(test_spit(path, bad, len) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_FORMAT, "model.q35", "magic");
    memcpy(bad, orig, len);
    bad[8] = 9; /* version */
    REQUIRE(test_spit(path, bad, len) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_UNSUPPORTED, "model.q35", "version");
    memcpy(bad, orig, len);
    bad[Q35_CACHE_HEADER_BYTES + 5] ^= 1; /* a byte of the first tensor's name */
    REQUIRE(test_spit(path, bad, len) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_FORMAT, "model.q35", "table");

    /* a flipped data byte: loading does not hash, verify names the tensor */
    memcpy(bad, orig, len);
    uint64_t off = 0;
    for (int k = 7; k >= 0; k--) off = off << 8 | (uint8_t)orig[Q35_CACHE_HEADER_BYTES + 208 + k];
    bad[off + 3] ^= 0x10;
    REQUIRE(test_spit(path, bad, len) == 0);
    char first[Q35_CACHE_NAME_MAX];
    snprintf(first, sizeof first, "%s", orig + Q35_CACHE_HEADER_BYTES);
    EXPECT_ERR(q35_cache_verify(out, NULL, NULL, NULL, NULL, &e_), Q35_ERR_FORMAT, first, "failed verification");
    free(bad);

    /* the config beside the cache must be the one it was prepared from */
    REQUIRE(test_spit(path, orig, len) == 0);
    char *cfg2 = strdup(orig_cfg);
    char *at = strstr(cfg2, "\"rms_norm_eps\": 1e-06");
    REQUIRE(at);
    at[strlen("\"rms_norm_eps\": 1e-0")] = '5';
    REQUIRE(test_spit(cfg, cfg2, strlen(cfg2)) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_FORMAT, "config.json", "different");
    free(cfg2);

    /* a cache of another model under a right config: shapes are checked */
    const char *other = tmp_path("other");
    REQUIRE_MSG(!prepare(model_dir("models/tiny-c"), other, Q35_POLICY_DEFAULT, &err), "%s", err.msg);
    char other_q35[1300];
    snprintf(other_q35, sizeof other_q35, "%s/model.q35", other);
    size_t olen;
    char *o = test_slurp(other_q35, &olen);
    REQUIRE(o);
    memcpy(o + 80, orig + 80, 32); /* claim tiny-a's config, so the table hash stays valid */
    REQUIRE(test_spit(path, o, olen) == 0 && test_spit(cfg, orig_cfg, cfg_len) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_FORMAT, "model.q35", "shape");
    free(o);
    free(orig);
    free(orig_cfg);
}

TEST(cache, bad_sources_and_output_directories) {
    q35_error err;
    /* a truncated shard is named */
    char src[1200], cmd[3000];
    snprintf(src, sizeof src, "%s/src", q35_test_tmpdir());
    snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", model_dir("models/tiny-b"), src);
    REQUIRE(system(cmd) == 0);
    char shard[1300];
    snprintf(shard, sizeof shard, "%s/model.safetensors-00002-of-00003.safetensors", src);
    size_t len;
    char *orig = test_slurp(shard, &len);
    REQUIRE(orig);
    REQUIRE(test_spit(shard, orig, len / 2) == 0);
    EXPECT_ERR(prepare(src, tmp_path("o1"), Q35_POLICY_DEFAULT, &e_), Q35_ERR_FORMAT, "00002-of-00003", "truncated");
    REQUIRE(test_spit(shard, orig, len) == 0);

    /* --expect: a wrong SHA-256 is refused, naming the file */
    const char *out = tmp_path("o2");
    REQUIRE_MSG(!prepare(src, out, Q35_POLICY_DEFAULT, &err), "%s", err.msg);
    char man[1300];
    snprintf(man, sizeof man, "%s/manifest.json", out);
    q35_prepare_params p = {.checkpoint = src, .out_dir = tmp_path("o3"), .expect = man};
    EXPECT_ERR(q35_prepare(&p, &e_), Q35_OK, "", ""); /* the manifest of a good prepare is a good --expect */
    orig[len - 1] ^= 1; /* a flipped byte in the last tensor */
    REQUIRE(test_spit(shard, orig, len) == 0);
    p.out_dir = tmp_path("o4");
    EXPECT_ERR(q35_prepare(&p, &e_), Q35_ERR_FORMAT, "00002-of-00003", "SHA-256");
    struct stat sb;
    CHECK(stat(tmp_path("o4/model.q35"), &sb) != 0);

    /* the output directory holds a different cache: refused, unless --force */
    EXPECT_ERR(prepare(src, out, Q35_POLICY_DEFAULT, &e_), Q35_ERR_ARG, out, "different");
    p.out_dir = out;
    p.expect = NULL;
    p.force = 1;
    EXPECT_ERR(q35_prepare(&p, &e_), Q35_OK, "", "");
    /* the same cache again: nothing to do */
    EXPECT_ERR(prepare(src, out, Q35_POLICY_DEFAULT, &e_), Q35_OK, "", "");
    EXPECT_ERR(prepare(src, out, Q35_POLICY_BF16, &e_), Q35_ERR_ARG, out, "different");
    free(orig);

    q35_prepare_params bad = {.checkpoint = src, .out_dir = tmp_path("o5"), .policy = Q35_POLICY_COUNT};
    EXPECT_ERR(q35_prepare(&bad, &e_), Q35_ERR_ARG, "policy", "");
}

TEST(cache, an_interrupted_prepare_leaves_nothing_that_looks_complete) {
    q35_error err;
    const char *out = tmp_path("i");
    REQUIRE_MSG(!prepare(model_dir("models/tiny-a"), out, Q35_POLICY_DEFAULT, &err), "%s", err.msg);
    /* what a crash mid-write leaves: only the .partial files */
    char a[1300], b[1300];
    snprintf(a, sizeof a, "%s/model.q35", out);
    snprintf(b, sizeof b, "%s/model.q35.partial", out);
    REQUIRE(rename(a, b) == 0);
    snprintf(a, sizeof a, "%s/manifest.json", out);
    REQUIRE(remove(a) == 0);
    EXPECT_ERR(test_try_load(out, &e_), Q35_ERR_IO, out, "model.safetensors");
    EXPECT_ERR(q35_cache_verify(out, NULL, NULL, NULL, NULL, &e_), Q35_ERR_IO, "model.q35", "cannot open");
    /* and the next prepare completes over them */
    EXPECT_ERR(prepare(model_dir("models/tiny-a"), out, Q35_POLICY_DEFAULT, &e_), Q35_OK, "", "");
    EXPECT_ERR(test_try_load(out, &e_), Q35_OK, "", "");
}

TEST(cache, synthetic_9b_tensor_list) {
    char *cfg = q35_config_json_9b();
    q35_cache_item *items;
    int32_t n;
    q35_error err;
    REQUIRE_MSG(!q35_model_tensors(cfg, &items, &n, &err), "%s", err.msg);
    CHECK_EQ_INT(n, 427 + 15);
    int64_t params = 0, mtp = 0;
    for (int32_t i = 0; i < n; i++) {
        int64_t e = 1;
        for (int d = 0; d < items[i].ndim; d++) e *= items[i].shape[d];
        if (!strncmp(items[i].name, "mtp.", 4)) mtp += e; else params += e;
    }
    CHECK_EQ_INT(params, 8953803264LL); /* spec qwen35-model.md 2.1 */
    CHECK_EQ_INT(mtp, 243290624LL);     /* spec 2.2 */
    free(items);
    free(cfg);
}

TEST(cache, synthetic_weights_are_deterministic_and_load) {
    char cfg[1200];
    snprintf(cfg, sizeof cfg, "%s/config.json", model_dir("models/tiny-c"));
    q35_error err = {0};
    for (int k = 0; k < 2; k++) {
        q35_prepare_params p = {.synthetic = cfg, .out_dir = tmp_path(k ? "s2" : "s1")};
        REQUIRE_MSG(!q35_prepare(&p, &err), "%s", err.msg);
    }
    size_t a_len, b_len;
    char a_path[1300], b_path[1300];
    snprintf(a_path, sizeof a_path, "%s/model.q35", tmp_path("s1"));
    snprintf(b_path, sizeof b_path, "%s/model.q35", tmp_path("s2"));
    char *a = test_slurp(a_path, &a_len), *b = test_slurp(b_path, &b_len);
    REQUIRE(a && b);
    CHECK(a_len == b_len && !memcmp(a, b, a_len));
    free(a);
    free(b);
    CHECK_MSG(!q35_cache_verify(tmp_path("s1"), NULL, NULL, NULL, NULL, &err), "%s", err.msg);
    int32_t V;
    float *l = all_logits(tmp_path("s1"), k_ids, N_IDS, &V);
    REQUIRE(l);
    for (int32_t i = 0; i < N_IDS * V; i++) CHECK(isfinite(l[i]));
    free(l);
    /* the generated matrices have the intended scale, N(0, 0.02) */
    q35_checkpoint ck;
    REQUIRE_MSG(!q35_cache_open(tmp_path("s1"), &ck, &err), "%s", err.msg);
    const q35_st_entry *e = q35_checkpoint_find(&ck, "model.language_model.layers.0.mlp.up_proj.weight");
    REQUIRE(e && e->tensor.dtype == Q35_DT_BFP4);
    double s2 = 0;
    int64_t n = 0;
    float row[64];
    for (int64_t r = 0; r < e->tensor.shape[0]; r++, n += 64) {
        q35_get_row_ref(row, &e->tensor, r);
        for (int c = 0; c < 64; c++) s2 += (double)row[c] * row[c];
    }
    CHECK_NEAR(sqrt(s2 / (double)n), 0.02, 0.006);
    q35_checkpoint_close(&ck);
}

/* Weights read into anonymous memory (at the address of the file mapping)
 * and weights served from the mapped file give the same logits, bit for
 * bit, for a cache and a safetensors checkpoint; the default reads them in
 * when the kernel offers huge pages (a tiny model always fits). */
TEST(cache, weights_in_memory_or_mapped_give_identical_logits) {
    q35_error err;
    const char *out = tmp_path("nommap-a");
    REQUIRE_MSG(!prepare(model_dir("models/tiny-a"), out, Q35_POLICY_DEFAULT, &err), "%s", err.msg);
    const char *dirs[] = {out, model_dir("models/tiny-b")};
    const q35_engine_params copy = {.weights = Q35_WEIGHTS_IN_MEMORY}, mapped = {.weights = Q35_WEIGHTS_MAPPED};
    for (int d = 0; d < 2; d++) {
        int32_t V1 = 0, V2 = 0;
        float *a = all_logits_with(dirs[d], &mapped, k_ids, N_IDS, &V1);
        float *b = all_logits_with(dirs[d], &copy, k_ids, N_IDS, &V2);
        REQUIRE(a && b && V1 == V2);
        CHECK_MSG(!memcmp(a, b, sizeof(float) * (size_t)N_IDS * (size_t)V1), "%s: mapped and in-memory logits differ",
                  dirs[d]);
        free(a);
        free(b);
        const q35_engine_params *modes[] = {NULL, &mapped, &copy};
        const int copied[] = {q35_huge_pages_offered(), 0, 1};
        for (int m = 0; m < 3; m++) {
            q35_engine *e = NULL;
            REQUIRE_MSG(!q35_engine_load(dirs[d], modes[m], &e, &err), "%s", err.msg);
            CHECK_MSG(q35_engine_info(e)->weights_copied == copied[m], "%s: mode %d", dirs[d], m);
            CHECK(q35_engine_info(e)->file_bytes > 0);
            q35_engine_free(e);
        }
    }
}
