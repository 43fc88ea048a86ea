/* Image prompts against transformers' fp32 goldens (scripts/make_vl_models.py,
 * tests/data/golden-vl): bytes -> processor -> vision tower -> expanded ids
 * -> logits at every position with the 3-axis rotary positions, greedy
 * continuations with and without MTP speculation, and the bad inputs. */
#include "golden.h"
#include "helpers.h"
#include "model/prepare.h"
#include "qwen35.h"
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

#define LOGIT_TOL 1e-4 /* max |diff| / max |logit| against transformers fp32 */

static const char *const vl_goldens[] = {"vl-a.one", "vl-a.two", "vl-b.one", "vl-b.two"};
#define N_VL (int)(sizeof vl_goldens / sizeof vl_goldens[0])

typedef struct vl_case {
    char model_dir[512];
    json_t *meta;
    int32_t *prompt_ids, n_prompt, *expanded, n_expanded, *greedy, n_greedy, vocab;
    float *logits; /* (n_expanded, vocab) */
    int32_t n_images;
    q35_image_pixels px[4];
} vl_case;

static int32_t *ids_of(json_t *a, int32_t *n) {
    *n = (int32_t)json_array_size(a);
    int32_t *v = malloc(sizeof(int32_t) * (size_t)(*n ? *n : 1));
    for (int32_t i = 0; i < *n; i++) v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static void case_free(vl_case *c) {
    for (int32_t i = 0; i < c->n_images; i++) q35_image_pixels_free(&c->px[i]);
    free(c->prompt_ids), free(c->expanded), free(c->greedy), free(c->logits);
    json_decref(c->meta);
}

/* Loads golden `name` and runs the model's processor on its image files. */
static int case_load(const char *name, vl_case *c) {
    memset(c, 0, sizeof *c);
    char rel[256];
    snprintf(rel, sizeof rel, "golden-vl/%s.golden.json", name);
    json_error_t je;
    c->meta = json_load_file(q35_test_path(rel), 0, &je);
    if (!c->meta) return -1;
    snprintf(c->model_dir, sizeof c->model_dir, "%s", q35_test_path(""));
    snprintf(c->model_dir + strlen(c->model_dir), sizeof c->model_dir - strlen(c->model_dir), "/models/%s",
             json_string_value(json_object_get(c->meta, "model")));
    c->prompt_ids = ids_of(json_object_get(c->meta, "prompt_ids"), &c->n_prompt);
    c->expanded = ids_of(json_object_get(c->meta, "expanded_ids"), &c->n_expanded);
    c->greedy = ids_of(json_object_get(c->meta, "greedy_ids"), &c->n_greedy);
    c->vocab = (int32_t)json_integer_value(json_object_get(c->meta, "vocab_size"));
    snprintf(rel, sizeof rel, "golden-vl/%s.prompt.f32", name);
    size_t len = 0;
    c->logits = (float *)test_slurp(q35_test_path(rel), &len);
    if (!c->logits || len != sizeof(float) * (size_t)c->n_expanded * (size_t)c->vocab) return -1;
    q35_image_processor *p = NULL;
    q35_error err = {0};
    if (q35_image_processor_load(c->model_dir, &p, &err)) return -1;
    json_t *files = json_object_get(c->meta, "image_files");
    int rc = 0;
    for (size_t i = 0; i < json_array_size(files) && !rc; i++) {
        snprintf(rel, sizeof rel, "images/%s", json_string_value(json_array_get(files, i)));
        char *bytes = test_slurp(q35_test_path(rel), &len);
        rc = !bytes || q35_image_process(p, bytes, len, &c->px[c->n_images], &err) != Q35_OK;
        if (!rc) c->n_images++;
        free(bytes);
    }
    q35_image_processor_free(p);
    return rc ? -1 : 0;
}

/* The case's images through the tower, and its prompt expanded (checked
 * against transformers' expansion). */
static int encode_and_expand(q35_engine *e, vl_case *c, q35_image_embeds **im, int32_t **ids, int32_t *n) {
    q35_error err = {0};
    if (q35_engine_encode_images(e, c->px, c->n_images, im, &err)) {
        q35_test_fail(__FILE__, __LINE__, "encode: %s", err.msg);
        return -1;
    }
    if (q35_engine_expand_images(e, c->prompt_ids, c->n_prompt, im, c->n_images, ids, n, &err)) {
        q35_test_fail(__FILE__, __LINE__, "expand: %s", err.msg);
        return -1;
    }
    json_t *grids = json_object_get(c->meta, "image_grid_thw");
    for (int32_t i = 0; i < c->n_images; i++)
        for (int a = 0; a < 3; a++)
            CHECK_EQ_INT(c->px[i].grid_thw[a], (int)json_integer_value(json_array_get(json_array_get(grids, (size_t)i), (size_t)a)));
    CHECK_EQ_INT(*n, c->n_expanded);
    CHECK(*n == c->n_expanded && !memcmp(*ids, c->expanded, sizeof(int32_t) * (size_t)*n));
    return 0;
}

static void free_embeds(q35_image_embeds **im, int32_t n) {
    for (int32_t i = 0; i < n; i++) q35_image_embeds_free(im[i]);
}

/* The end of a test over one case: its expanded ids, embeddings, engine. */
static void case_done(vl_case *c, int32_t *ids, q35_image_embeds **im, q35_engine *e) {
    free(ids);
    free_embeds(im, c->n_images);
    q35_engine_free(e);
    case_free(c);
}

TEST(mm, image_prompt_logits_match_transformers_at_every_position) {
    for (int k = 0; k < N_VL; k++) {
        vl_case c;
        REQUIRE_MSG(case_load(vl_goldens[k], &c) == 0, "golden %s missing", vl_goldens[k]);
        q35_engine *e = NULL;
        q35_session *s = NULL;
        q35_image_embeds *im[4] = {0};
        int32_t *ids = NULL, n = 0;
        q35_error err = {0};
        REQUIRE_MSG(q35_engine_load(c.model_dir, NULL, &e, &err) == Q35_OK, "load: %s", err.msg);
        if (!encode_and_expand(e, &c, im, &ids, &n) && q35_session_new(e, 0, &s, &err) == Q35_OK) {
            float *lg = malloc(sizeof(float) * (size_t)n * (size_t)c.vocab);
            CHECK(q35_session_eval_images(s, ids, n, im, c.n_images, lg, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
            double worst = 0;
            for (int32_t p = 0; p < n; p++) {
                double d = rel_max_diff(lg + (size_t)p * c.vocab, c.logits + (size_t)p * c.vocab, (size_t)c.vocab);
                if (d > worst) worst = d;
                CHECK_MSG(d <= LOGIT_TOL, "%s: position %d: relative diff %.3g > %.1g", vl_goldens[k], p, d, LOGIT_TOL);
            }
            CHECK(q35_session_rope_delta(s) < 0); /* an image's rows advance the rotary position by less */
            free(lg);
        }
        free(ids);
        free_embeds(im, c.n_images);
        q35_session_free(s);
        q35_engine_free(e);
        case_free(&c);
    }
}

/* Greedy continuation after the image prompt, plain and (vl-a, with its
 * MTP head) speculative with k = 1 and 3, against transformers' generate. */
TEST(mm, greedy_continuation_after_images_matches_transformers_with_and_without_mtp) {
    for (int k = 0; k < N_VL; k++) {
        vl_case c;
        REQUIRE_MSG(case_load(vl_goldens[k], &c) == 0, "golden %s missing", vl_goldens[k]);
        q35_engine *e = NULL;
        q35_image_embeds *im[4] = {0};
        int32_t *ids = NULL, n = 0;
        q35_error err = {0};
        REQUIRE_MSG(q35_engine_load(c.model_dir, NULL, &e, &err) == Q35_OK, "load: %s", err.msg);
        const int has_mtp = q35_engine_info(e)->has_mtp;
        if (!encode_and_expand(e, &c, im, &ids, &n)) {
            for (int32_t spec = 0; spec <= (has_mtp ? 3 : 0); spec += 1 + (spec == 1)) {
                q35_session *s = NULL;
                REQUIRE(q35_session_new(e, 0, &s, &err) == Q35_OK);
                if (spec) CHECK(q35_session_set_spec(s, spec, &err) == Q35_OK);
                float *lg = malloc(sizeof(float) * (size_t)c.vocab);
                int32_t out[64] = {0};
                CHECK(q35_session_eval_images(s, ids, n, im, c.n_images, lg, 0, &err) == Q35_OK);
                CHECK_EQ_INT(test_greedy_tokens(s, lg, c.n_greedy, out), c.n_greedy);
                for (int32_t i = 0; i < c.n_greedy; i++)
                    CHECK_MSG(out[i] == c.greedy[i], "%s (k = %d): greedy token %d: %d, transformers %d", vl_goldens[k],
                              spec, i, out[i], c.greedy[i]);
                if (spec) CHECK(q35_session_spec_stats(s).drafts > 0);
                free(lg);
                q35_session_free(s);
            }
        }
        free(ids);
        free_embeds(im, c.n_images);
        q35_engine_free(e);
        case_free(&c);
    }
}

/* A prompt evaluated in two calls (text, then the rest with its images) and
 * a snapshot restored into another session give the same logits and the
 * same continuation: the rotary offset travels with the state. */
TEST(mm, split_prompt_and_snapshot_keep_the_rotary_offset) {
    vl_case c;
    REQUIRE(case_load("vl-a.two", &c) == 0);
    q35_engine *e = NULL;
    q35_image_embeds *im[4] = {0};
    int32_t *ids = NULL, n = 0;
    q35_error err = {0};
    REQUIRE(q35_engine_load(c.model_dir, NULL, &e, &err) == Q35_OK);
    if (!encode_and_expand(e, &c, im, &ids, &n)) {
        int32_t first_pad = 0;
        while (ids[first_pad] != q35_engine_image_token(e)) first_pad++;
        q35_session *s = NULL, *t = NULL;
        REQUIRE(q35_session_new(e, 0, &s, &err) == Q35_OK && q35_session_new(e, 0, &t, &err) == Q35_OK);
        float *lg = malloc(sizeof(float) * (size_t)c.vocab);
        CHECK(q35_session_eval(s, ids, first_pad - 1, NULL, 0, &err) == Q35_OK);
        CHECK(q35_session_eval_images(s, ids + first_pad - 1, n - first_pad + 1, im, c.n_images, lg, 0, &err) == Q35_OK);
        double d = rel_max_diff(lg, c.logits + (size_t)(n - 1) * c.vocab, (size_t)c.vocab);
        CHECK_MSG(d <= LOGIT_TOL, "split prompt: last row differs by %.3g", d);
        q35_snapshot *snap = NULL;
        CHECK(q35_snapshot_take(s, &snap, &err) == Q35_OK);
        int32_t a[16], b[16];
        CHECK_EQ_INT(test_greedy_tokens(s, lg, 8, a), 8);
        CHECK(q35_snapshot_restore(t, snap, &err) == Q35_OK);
        CHECK_EQ_INT(q35_session_rope_delta(t), q35_session_rope_delta(s));
        CHECK_EQ_INT(test_greedy_tokens(t, lg, 8, b), 8);
        for (int i = 0; i < 8; i++) {
            CHECK_EQ_INT(a[i], c.greedy[i]);
            CHECK_EQ_INT(b[i], c.greedy[i]);
        }
        /* a session holding an image is never reused for a text prompt with the same ids */
        int32_t kept = -1;
        CHECK(q35_session_reuse(t, c.expanded, c.n_expanded, NULL, &kept, &err) == Q35_OK);
        CHECK_EQ_INT(kept, 0);
        CHECK_EQ_INT(q35_session_rope_delta(t), 0);
        q35_snapshot_free(snap);
        free(lg);
        q35_session_free(s);
        q35_session_free(t);
    }
    case_done(&c, ids, im, e);
}

/* Decode steps of sessions holding images, batched together and with a
 * text-only session, give each session's logits bit for bit as alone:
 * every row carries its own session's rotary offset. */
TEST(mm, batched_decode_after_images_equals_each_session_alone) {
    vl_case c[2];
    REQUIRE(case_load("vl-a.one", &c[0]) == 0 && case_load("vl-a.two", &c[1]) == 0);
    q35_engine *e = NULL;
    q35_error err = {0};
    REQUIRE(q35_engine_load(c[0].model_dir, NULL, &e, &err) == Q35_OK);
    const size_t V = (size_t)c[0].vocab;
    q35_image_embeds *im[2][4] = {{0}};
    int32_t *ids[2] = {0}, n[2] = {0};
    q35_session *a[3] = {0}, *b[3] = {0}; /* a: batched, b: alone; [2] text only */
    int ok = 1;
    for (int i = 0; i < 2 && ok; i++) ok = !encode_and_expand(e, &c[i], im[i], &ids[i], &n[i]);
    for (int i = 0; i < 3 && ok; i++) ok = !q35_session_new(e, 0, &a[i], &err) && !q35_session_new(e, 0, &b[i], &err);
    for (int i = 0; i < 2 && ok; i++)
        ok = !q35_session_eval_images(a[i], ids[i], n[i], im[i], c[i].n_images, NULL, 0, &err) &&
             !q35_session_eval_images(b[i], ids[i], n[i], im[i], c[i].n_images, NULL, 0, &err);
    ok = ok && !q35_session_eval(a[2], c[0].prompt_ids, 9, NULL, 0, &err) && !q35_session_eval(b[2], c[0].prompt_ids, 9, NULL, 0, &err);
    REQUIRE_MSG(ok, "setup: %s", err.msg);
    float *batch = malloc(sizeof(float) * 3 * V), *alone = malloc(sizeof(float) * V);
    for (int step = 0; step < 4; step++) {
        int32_t toks[3] = {c[0].greedy[step], c[1].greedy[step], c[0].greedy[step]};
        CHECK(q35_batch_decode(a, toks, 3, batch, &err) == Q35_OK);
        for (int i = 0; i < 3; i++) {
            CHECK(q35_session_eval(b[i], &toks[i], 1, alone, 0, &err) == Q35_OK);
            CHECK_MSG(!memcmp(alone, batch + i * V, sizeof(float) * V), "step %d, session %d: batched row differs", step, i);
        }
    }
    free(batch), free(alone);
    for (int i = 0; i < 3; i++) q35_session_free(a[i]), q35_session_free(b[i]);
    for (int i = 0; i < 2; i++) free(ids[i]), free_embeds(im[i], c[i].n_images), case_free(&c[i]);
    q35_engine_free(e);
}

/* Prefix reuse with images: a session (or a snapshot) holding the first
 * turn's image is kept for a prompt that extends it with the same image,
 * and never for one whose image differs (same ids, other pixels). */
TEST(mm, sync_with_images_reuses_a_prefix_only_for_the_same_images) {
    vl_case c;
    REQUIRE(case_load("vl-a.two", &c) == 0);
    q35_engine *e = NULL;
    q35_image_embeds *im[4] = {0}, *other[2] = {0};
    int32_t *ids = NULL, n = 0;
    q35_error err = {0};
    REQUIRE(q35_engine_load(c.model_dir, NULL, &e, &err) == Q35_OK);
    if (!encode_and_expand(e, &c, im, &ids, &n)) {
        const int32_t pad = q35_engine_image_token(e);
        int32_t cut = 0; /* just after the first image's rows */
        while (ids[cut] != pad) cut++;
        while (ids[cut] == pad) cut++;
        cut += 2;
        q35_image_pixels changed = c.px[0];
        changed.pixel_values = malloc(sizeof(float) * (size_t)(changed.n_patches * changed.patch_dim));
        memcpy(changed.pixel_values, c.px[0].pixel_values, sizeof(float) * (size_t)(changed.n_patches * changed.patch_dim));
        changed.pixel_values[5] += 0.5f;
        REQUIRE(q35_engine_encode_images(e, &changed, 1, other, &err) == Q35_OK);
        CHECK(q35_image_embeds_hash(other[0]) != q35_image_embeds_hash(im[0]));
        other[1] = im[1];
        q35_session *s = NULL, *t = NULL;
        REQUIRE(q35_session_new(e, 0, &s, &err) == Q35_OK && q35_session_new(e, 0, &t, &err) == Q35_OK);
        float *lg = malloc(sizeof(float) * (size_t)c.vocab);
        int32_t reused = -1;
        CHECK(q35_session_sync_images(s, ids, cut, im, 1, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        q35_snapshot *snap = NULL;
        CHECK(q35_snapshot_take(s, &snap, &err) == Q35_OK);
        /* the tagged form is what the history holds */
        int32_t *tagged = malloc(sizeof(int32_t) * (size_t)n), n_hist = 0;
        CHECK(q35_engine_tag_images(e, ids, n, im, 2, tagged, &err) == Q35_OK);
        const int32_t *hist = q35_session_tokens(s, &n_hist);
        CHECK(hist && n_hist == cut && !memcmp(hist, tagged, sizeof(int32_t) * (size_t)cut));
        CHECK(q35_session_sync_images(s, ids, n, im, 2, NULL, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, cut);
        double d = rel_max_diff(lg, c.logits + (size_t)(n - 1) * c.vocab, (size_t)c.vocab);
        CHECK_MSG(d <= LOGIT_TOL, "own prefix kept: last row differs by %.3g", d);
        CHECK(q35_session_sync_images(t, ids, n, im, 2, snap, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, cut);
        d = rel_max_diff(lg, c.logits + (size_t)(n - 1) * c.vocab, (size_t)c.vocab);
        CHECK_MSG(d <= LOGIT_TOL, "snapshot kept: last row differs by %.3g", d);
        /* the same ids with another first image: nothing is reused */
        CHECK(q35_session_sync_images(t, ids, n, other, 2, snap, lg, &reused, &err) == Q35_OK);
        CHECK_EQ_INT(reused, 0);
        CHECK(rel_max_diff(lg, c.logits + (size_t)(n - 1) * c.vocab, (size_t)c.vocab) > 0);
        /* an image's run cut short is refused, so no state ends inside an image */
        q35_session_reset(s);
        CHECK(q35_session_eval_images(s, ids, cut - 5, im, 1, NULL, 0, &err) == Q35_ERR_ARG);
        free(tagged);
        free(lg);
        free(changed.pixel_values);
        q35_image_embeds_free(other[0]);
        q35_snapshot_free(snap);
        q35_session_free(s);
        q35_session_free(t);
    }
    case_done(&c, ids, im, e);
}

/* Image logits at every position of one prompt from the engine loaded
 * from dir; NULL after a reported failure. */
static float *image_logits(const char *dir, vl_case *c) {
    q35_engine *e = NULL;
    q35_session *s = NULL;
    q35_image_embeds *im[4] = {0};
    int32_t *ids = NULL, n = 0;
    q35_error err = {0};
    float *lg = NULL;
    if (q35_engine_load(dir, NULL, &e, &err) != Q35_OK) {
        q35_test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
        return NULL;
    }
    if (!encode_and_expand(e, c, im, &ids, &n) && q35_session_new(e, 0, &s, &err) == Q35_OK) {
        lg = malloc(sizeof(float) * (size_t)n * (size_t)c->vocab);
        if (q35_session_eval_images(s, ids, n, im, c->n_images, lg, Q35_EVAL_ALL_LOGITS, &err) != Q35_OK) {
            q35_test_fail(__FILE__, __LINE__, "%s: %s", dir, err.msg);
            free(lg);
            lg = NULL;
        }
    }
    q35_session_free(s);
    free(ids);
    free_embeds(im, c->n_images);
    q35_engine_free(e);
    return lg;
}

/* A weight cache of vl-a holds the vision tower as the checkpoint stores
 * it, under every policy: with the bf16 policy (text matrices as stored
 * too) the one- and two-image prompts give the checkpoint's logits bit for
 * bit; with bfp4-all (every other matrix BFP4) every model.visual.*
 * tensor is still byte-identical to the source, and verify names a
 * corrupted one. */
TEST(mm, a_weight_cache_keeps_the_vision_tower_as_stored) {
    char bf16[1200], quant[1200], path[1300], src[1200];
    snprintf(bf16, sizeof bf16, "%s/vl-a-bf16", q35_test_tmpdir());
    snprintf(quant, sizeof quant, "%s/vl-a-bfp4-all", q35_test_tmpdir());
    snprintf(src, sizeof src, "%s", q35_test_path("models/vl-a")); /* q35_test_path's buffer is reused */
    q35_error err = {0};
    q35_prepare_params p = {.checkpoint = src, .out_dir = bf16, .policy = Q35_POLICY_BF16};
    REQUIRE_MSG(q35_prepare(&p, &err) == Q35_OK, "%s", err.msg);
    p.out_dir = quant, p.policy = Q35_POLICY_BFP4_ALL;
    REQUIRE_MSG(q35_prepare(&p, &err) == Q35_OK, "%s", err.msg);
    for (int k = 0; k < 2; k++) {
        vl_case c;
        REQUIRE(case_load(vl_goldens[k], &c) == 0);
        float *a = image_logits(c.model_dir, &c), *b = image_logits(bf16, &c);
        CHECK_MSG(a && b && !memcmp(a, b, sizeof(float) * (size_t)c.n_expanded * (size_t)c.vocab),
                  "%s: logits from the bf16 cache differ from the checkpoint's", vl_goldens[k]);
        free(a), free(b);
        case_free(&c);
    }
    q35_checkpoint ck, cache;
    REQUIRE_MSG(q35_checkpoint_open(src, &ck, &err) == Q35_OK, "%s", err.msg);
    REQUIRE_MSG(q35_cache_open(quant, &cache, &err) == Q35_OK, "%s", err.msg);
    int n_vision = 0, n_block = 0;
    const q35_tensor *victim = NULL;
    for (int32_t i = 0; i < ck.n_index; i++) {
        const q35_tensor *s = &ck.index[i]->tensor;
        if (strncmp(s->name, "model.visual.", 13)) continue;
        n_vision++;
        const q35_st_entry *e = q35_checkpoint_find(&cache, s->name);
        CHECK_MSG(e != NULL, "%s is not in the cache", s->name);
        if (!e) continue;
        CHECK_MSG(e->tensor.dtype == s->dtype && e->tensor.nbytes == s->nbytes &&
                  !memcmp(e->tensor.data, s->data, s->nbytes), "%s changed in the cache", s->name);
        if (!strcmp(s->name, "model.visual.blocks.0.attn.qkv.weight")) victim = &e->tensor;
    }
    for (int32_t i = 0; i < cache.n_index; i++) n_block += q35_dtype_is_block(cache.index[i]->tensor.dtype);
    CHECK_EQ_INT(n_vision, 33);
    CHECK(n_block > 0); /* the text matrices did follow the policy */
    REQUIRE(victim != NULL);
    size_t off = (size_t)((const char *)victim->data - (const char *)cache.files[0].map.data);
    q35_checkpoint_close(&cache);
    q35_checkpoint_close(&ck);
    CHECK(q35_cache_verify(quant, NULL, NULL, NULL, NULL, &err) == Q35_OK);
    snprintf(path, sizeof path, "%s/model.q35", quant);
    size_t len = 0;
    char *bytes = test_slurp(path, &len);
    REQUIRE(bytes && off < len);
    bytes[off] ^= 1;
    FILE *f = fopen(path, "wb");
    REQUIRE(f && fwrite(bytes, 1, len, f) == len);
    fclose(f);
    free(bytes);
    CHECK(q35_cache_verify(quant, NULL, NULL, NULL, NULL, &err) == Q35_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "model.visual.blocks.0.attn.qkv.weight") != NULL, "%s", err.msg);
}

TEST(mm, bad_image_input_is_refused_with_a_message_naming_it) {
    vl_case a, b;
    REQUIRE(case_load("vl-a.one", &a) == 0 && case_load("vl-b.one", &b) == 0);
    q35_engine *e = NULL;
    q35_image_embeds *im[2] = {0};
    q35_error err = {0};
    REQUIRE(q35_engine_load(a.model_dir, NULL, &e, &err) == Q35_OK);
    /* pixels from another tower's processor */
    CHECK_EQ_INT(q35_engine_encode_images(e, b.px, 1, im, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "patch_dim") != NULL);
    REQUIRE(q35_engine_encode_images(e, a.px, 1, im, &err) == Q35_OK);
    /* image_pad count against images given */
    int32_t *ids = NULL, n = 0, two_pads[3] = {a.expanded[0], q35_engine_image_token(e), q35_engine_image_token(e)};
    CHECK_EQ_INT(q35_engine_expand_images(e, two_pads, 3, im, 1, &ids, &n, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "2 <|image_pad|> tokens but 1 images") != NULL);
    CHECK_EQ_INT(q35_engine_expand_images(e, a.prompt_ids, a.n_prompt, im, 0, &ids, &n, &err), Q35_ERR_ARG);
    q35_session *s = NULL;
    REQUIRE(q35_session_new(e, 0, &s, &err) == Q35_OK);
    /* an unexpanded prompt: the run is one pad, the image has more rows */
    CHECK_EQ_INT(q35_session_eval_images(s, a.prompt_ids, a.n_prompt, im, 1, NULL, 0, &err), Q35_ERR_ARG);
    CHECK(strstr(err.msg, "image 0") != NULL);
    CHECK_EQ_INT(q35_session_pos(s), 0);
    CHECK_EQ_INT(q35_session_eval_images(s, a.expanded, a.n_expanded, im, 1, NULL, Q35_EVAL_REWINDABLE, &err), Q35_ERR_ARG);
    /* text only, but images given */
    CHECK_EQ_INT(q35_session_eval_images(s, a.prompt_ids, 5, im, 1, NULL, 0, &err), Q35_ERR_ARG);
    q35_session_free(s);
    /* an image whose tokens do not fit the context */
    REQUIRE(q35_session_new(e, 32, &s, &err) == Q35_OK);
    CHECK_EQ_INT(q35_session_eval_images(s, a.expanded, a.n_expanded, im, 1, NULL, 0, &err), Q35_ERR_CONTEXT);
    CHECK(strstr(err.msg, "images included") != NULL);
    q35_session_free(s);
    q35_image_embeds_free(im[0]);
    q35_engine_free(e);

    /* a text-only model: tiny-a's config without its vision_config */
    const char *dir = q35_test_tmpdir();
    char path[1024], cfg_path[1024];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    char *weights = realpath(q35_test_path("models/tiny-a/model.safetensors"), NULL);
    CHECK(weights && symlink(weights, path) == 0);
    free(weights);
    size_t len = 0;
    char *cfg = test_slurp(q35_test_path("models/tiny-a/config.json"), &len);
    json_t *j = cfg ? json_loadb(cfg, len, 0, NULL) : NULL;
    REQUIRE(j);
    json_object_del(j, "vision_config");
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", dir);
    CHECK(json_dump_file(j, cfg_path, 0) == 0);
    json_decref(j);
    free(cfg);
    REQUIRE_MSG(q35_engine_load(dir, NULL, &e, &err) == Q35_OK, "load: %s", err.msg);
    CHECK_EQ_INT(q35_engine_image_token(e), -1);
    CHECK_EQ_INT(q35_engine_encode_images(e, a.px, 1, im, &err), Q35_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "no vision tower") != NULL);
    CHECK(im[0] == NULL);
    q35_engine_free(e);
    case_free(&a);
    case_free(&b);
}

TEST(mm, processor_refuses_bytes_that_are_not_an_image) {
    q35_image_processor *p = NULL;
    q35_image_pixels px;
    q35_error err = {0};
    REQUIRE(q35_image_processor_load(q35_test_path("models/vl-a"), &p, &err) == Q35_OK);
    CHECK(q35_image_process(p, "not an image", 12, &px, &err) != Q35_OK);
    CHECK(px.pixel_values == NULL);
    CHECK(q35_image_process(p, "", 0, &px, &err) == Q35_ERR_FORMAT);
    /* the decoded-pixel limit: a 37x53 image passes 1961 pixels, not 1960 */
    size_t len = 0;
    char *jpg = test_slurp(q35_test_path("images/rgb_37x53.jpg"), &len);
    REQUIRE(jpg);
    q35_image_processor_set_max_pixels(p, 37 * 53);
    CHECK(q35_image_process(p, jpg, len, &px, &err) == Q35_OK);
    q35_image_pixels_free(&px);
    q35_image_processor_set_max_pixels(p, 37 * 53 - 1);
    CHECK(q35_image_process(p, jpg, len, &px, &err) != Q35_OK);
    CHECK(px.pixel_values == NULL);
    free(jpg);
    q35_image_processor_free(p);
    /* a broken preprocessor_config.json names its file */
    const char *dir = q35_test_tmpdir();
    char path[1024];
    snprintf(path, sizeof path, "%s/preprocessor_config.json", dir);
    CHECK(test_spit(path, "{\"patch_size\": \"x\"", 18) == 0);
    CHECK(q35_image_processor_load(dir, &p, &err) != Q35_OK);
    CHECK(strstr(err.msg, "preprocessor_config.json") != NULL);
}
