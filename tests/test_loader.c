/* Bad-input tests of the checkpoint loader: every broken file gives a clear
 * error naming the file (and the tensor), never a crash. Each test copies
 * tests/data/models/tiny-a (a single-file checkpoint) or tiny-b (sharded)
 * into a temporary directory and breaks one thing. */
#include "qwen35.h"
#include "helpers.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>

/* Copies every file of tests/data/models/NAME into a fresh directory. */
static const char *copy_model(const char *name) {
    static char dst[1100];
    snprintf(dst, sizeof dst, "%s/%s", q35_test_tmpdir(), name);
    char cmd[3000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' && cp -r '%s/models/%s' '%s'", dst, q35_test_data_dir(), name, dst);
    return system(cmd) == 0 ? dst : NULL;
}

#define EXPECT_LOAD_ERROR(dir, status, s1, s2)                                                        \
    do {                                                                                             \
        q35_error e_;                                                                                \
        q35_status st_ = test_try_load(dir, &e_);                                                         \
        CHECK_MSG(st_ == (status), "status %s, expected %s (%s)", q35_status_name(st_),              \
                  q35_status_name(status), e_.msg);                                                  \
        CHECK_MSG(strstr(e_.msg, s1) != NULL, "message '%s' does not mention '%s'", e_.msg, s1);     \
        CHECK_MSG(strstr(e_.msg, s2) != NULL, "message '%s' does not mention '%s'", e_.msg, s2);     \
    } while (0)

/* Rewrites the JSON header of a safetensors file through `edit`, keeping the data. */
static int edit_header(const char *path, void (*edit)(json_t *hdr)) {
    size_t len;
    char *buf = test_slurp(path, &len);
    if (!buf) return -1;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | (unsigned char)buf[i];
    json_t *hdr = json_loadb(buf + 8, (size_t)hlen, 0, NULL);
    if (!hdr) { free(buf); return -1; }
    edit(hdr);
    char *text = json_dumps(hdr, JSON_COMPACT);
    json_decref(hdr);
    size_t nh = strlen(text), data_len = len - 8 - (size_t)hlen;
    char *out = malloc(8 + nh + data_len);
    for (int i = 0; i < 8; i++) out[i] = (char)((uint64_t)nh >> (8 * i));
    memcpy(out + 8, text, nh);
    memcpy(out + 8 + nh, buf + 8 + hlen, data_len);
    int rc = test_spit(path, out, 8 + nh + data_len);
    free(text); free(out); free(buf);
    return rc;
}

#define GATE "model.language_model.layers.0.mlp.gate_proj.weight"

static void swap_gate_shape(json_t *hdr) {
    json_t *shape = json_object_get(json_object_get(hdr, GATE), "shape");
    json_t *a = json_incref(json_array_get(shape, 0)), *b = json_incref(json_array_get(shape, 1));
    json_array_set_new(shape, 0, b);
    json_array_set_new(shape, 1, a);
}
static void gate_dtype_i16(json_t *hdr) { json_object_set_new(json_object_get(hdr, GATE), "dtype", json_string("I16")); }
static void rename_gate(json_t *hdr) {
    json_object_set(hdr, "model.language_model.layers.0.mlp.gate_projX.weight", json_object_get(hdr, GATE));
    json_object_del(hdr, GATE);
}
static void gate_offsets_past_end(json_t *hdr) {
    json_t *off = json_object_get(json_object_get(hdr, GATE), "data_offsets");
    json_int_t b = json_integer_value(json_array_get(off, 0));
    json_array_set_new(off, 0, json_integer(b + (1 << 30)));
    json_array_set_new(off, 1, json_integer(b + (1 << 30) + 64 * 128 * 2));
}

TEST(loader, missing_directory_and_files) {
    EXPECT_LOAD_ERROR("/nonexistent/qwen35-model", Q35_ERR_IO, "/nonexistent/qwen35-model", "not a directory");
    const char *d = copy_model("tiny-a");
    REQUIRE(d);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    REQUIRE(remove(p) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_IO, d, "model.safetensors");
    snprintf(p, sizeof p, "%s/config.json", d);
    REQUIRE(remove(p) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_IO, "config.json", "cannot open");
}

TEST(loader, bad_config_values) {
    const char *d = copy_model("tiny-a");
    REQUIRE(d);
    char p[1200];
    snprintf(p, sizeof p, "%s/config.json", d);
    size_t len;
    char *orig = test_slurp(p, &len);
    REQUIRE(orig);
    REQUIRE(test_spit(p, "{\"text_config\": {", 17) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "config.json", "not valid JSON");

    json_t *root = json_loads(orig, 0, NULL);
    REQUIRE(root);
    struct { const char *key; json_t *val; q35_status st; const char *word; } cases[] = {
        {"hidden_act", json_string("gelu"), Q35_ERR_UNSUPPORTED, "hidden_act"},
        {"model_type", json_string("llama"), Q35_ERR_UNSUPPORTED, "model_type"},
        {"head_dim", json_string("32"), Q35_ERR_FORMAT, "head_dim"},
        {"num_key_value_heads", json_integer(3), Q35_ERR_UNSUPPORTED, "num_key_value_heads"},
        {"hidden_size", json_integer(-4), Q35_ERR_UNSUPPORTED, "hidden_size"},
        {"layer_types", json_pack("[s]", "full_attention"), Q35_ERR_FORMAT, "layer_types"},
        {"attention_bias", json_true(), Q35_ERR_UNSUPPORTED, "attention_bias"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *copy = json_deep_copy(root);
        json_object_set_new(json_object_get(copy, "text_config"), cases[i].key, cases[i].val);
        char *text = json_dumps(copy, 0);
        REQUIRE(test_spit(p, text, strlen(text)) == 0);
        EXPECT_LOAD_ERROR(d, cases[i].st, "config.json", cases[i].word);
        free(text);
        json_decref(copy);
    }
    json_decref(root);
    free(orig);
}

TEST(loader, truncated_and_corrupt_safetensors) {
    const char *d = copy_model("tiny-a");
    REQUIRE(d);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    size_t len;
    char *orig = test_slurp(p, &len);
    REQUIRE(orig && len > 4096);

    REQUIRE(test_spit(p, orig, len / 2) == 0); /* cut in the middle of the data */
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "model.safetensors", "past the end");
    REQUIRE(test_spit(p, orig, 5) == 0); /* shorter than the length prefix */
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "model.safetensors", "truncated");
    REQUIRE(test_spit(p, orig, 100) == 0); /* inside the header */
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "model.safetensors", "header length");

    char *bad = malloc(len);
    memcpy(bad, orig, len);
    bad[8] = 'X'; /* the header's opening brace */
    REQUIRE(test_spit(p, bad, len) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "model.safetensors", "JSON");
    memcpy(bad, orig, len);
    bad[7] = 0x40; /* an absurd header length */
    REQUIRE(test_spit(p, bad, len) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "model.safetensors", "header length");
    free(bad);

    REQUIRE(test_spit(p, orig, len) == 0);
    REQUIRE(edit_header(p, gate_offsets_past_end) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "model.safetensors", GATE);
    free(orig);
}

TEST(loader, wrong_shape_dtype_or_missing_tensor) {
    const char *d = copy_model("tiny-a");
    REQUIRE(d);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors", d);
    size_t len;
    char *orig = test_slurp(p, &len);
    REQUIRE(orig);
    REQUIRE(edit_header(p, swap_gate_shape) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, GATE, "expected");
    REQUIRE(test_spit(p, orig, len) == 0 && edit_header(p, gate_dtype_i16) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_UNSUPPORTED, GATE, "I16");
    REQUIRE(test_spit(p, orig, len) == 0 && edit_header(p, rename_gate) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "missing tensor", GATE);
    REQUIRE(test_spit(p, orig, len) == 0);
    EXPECT_LOAD_ERROR(d, Q35_OK, "", ""); /* restored: loads again */
    free(orig);
}

TEST(loader, sharded_index_errors) {
    const char *d = copy_model("tiny-b");
    REQUIRE(d);
    char p[1200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", d);
    EXPECT_LOAD_ERROR(d, Q35_OK, "", "");
    json_t *idx = json_load_file(p, 0, NULL);
    REQUIRE(idx);
    json_t *wm = json_object_get(idx, "weight_map");
    const char *shard = json_string_value(json_object_get(wm, "lm_head.weight"));
    REQUIRE(shard);
    char shard_path[1300];
    snprintf(shard_path, sizeof shard_path, "%s/%s", d, shard);

    json_t *moved = json_deep_copy(idx); /* the index points a tensor at the wrong shard */
    const char *other = NULL;
    const char *k;
    json_t *v;
    json_object_foreach(wm, k, v) if (strcmp(json_string_value(v), shard)) { other = json_string_value(v); break; }
    REQUIRE(other);
    json_object_set_new(json_object_get(moved, "weight_map"), "lm_head.weight", json_string(other));
    REQUIRE(json_dump_file(moved, p, 0) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "lm_head.weight", other);
    json_decref(moved);

    json_t *escape = json_deep_copy(idx); /* shard names must stay inside the directory */
    json_object_set_new(json_object_get(escape, "weight_map"), "lm_head.weight", json_string("../evil.safetensors"));
    REQUIRE(json_dump_file(escape, p, 0) == 0);
    EXPECT_LOAD_ERROR(d, Q35_ERR_FORMAT, "lm_head.weight", "plain file name");
    json_decref(escape);

    REQUIRE(json_dump_file(idx, p, 0) == 0);
    REQUIRE(remove(shard_path) == 0); /* a shard named by the index is missing */
    EXPECT_LOAD_ERROR(d, Q35_ERR_IO, shard, "cannot open");
    json_decref(idx);
}
