/* Tests of src/chat.c and src/pyjson.c: every case of tests/data/chat/cases.json
 * (rendered by transformers' apply_chat_template, see
 * scripts/make-tokenizer-goldens.py) must come out byte for byte, and every
 * case the template rejects must be rejected. */
#include "text/pyjson.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* The one place the C renderer is deliberately more lenient than the template:
 * arguments given as a JSON string (what OpenAI clients send) are parsed. */
static bool string_arguments_case(const json_t *c) {
    const char *err = json_string_value(json_object_get(c, "error"));
    return err && strstr(err, "item pairs");
}

static bool ends_with_think(const char *s) {
    size_t n = strlen(s);
    return n >= 8 && !strcmp(s + n - 8, "<think>\n");
}

TEST(chat, golden_renders) {
    json_error_t je;
    json_t *cases = json_load_file(q35_test_path("chat/cases.json"), 0, &je);
    REQUIRE_MSG(json_is_array(cases), "chat/cases.json: %s", je.text);
    size_t i, same = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        char *messages = json_dumps(json_object_get(c, "messages"), JSON_COMPACT | JSON_ENCODE_ANY);
        json_t *tools_v = json_object_get(c, "tools");
        char *tools = tools_v ? json_dumps(tools_v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        q35_chat_options opt = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .enable_thinking = json_is_true(json_object_get(c, "enable_thinking")),
            .add_vision_id = json_is_true(json_object_get(c, "add_vision_id")),
        };
        char *text = NULL;
        q35_error err = {0};
        q35_status st = q35_chat_render(messages, tools, &opt, &text, &err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        const char *want_err = json_string_value(json_object_get(c, "error"));
        if (string_arguments_case(c)) {
            CHECK(st == Q35_OK && text && strstr(text, "<parameter=as>\nstring\n</parameter>\n"));
            same++;
        } else if (want) {
            if (st == Q35_OK && !strcmp(text, want)) same++;
            else q35_test_fail(__FILE__, __LINE__, "case %zu differs: %s\n--- got ---\n%s\n--- want ---\n%s", i,
                               st ? err.msg : "", text ? text : "", want);
        } else {
            /* The template's own messages must match; transformers' empty-conversation check words it differently. */
            bool ok = st == Q35_ERR_ARG && (strstr(err.msg, want_err) || !strncmp(want_err, "Cannot apply", 12));
            if (ok) same++;
            else q35_test_fail(__FILE__, __LINE__, "case %zu: want error \"%s\", got %s \"%s\"", i, want_err,
                               q35_status_name(st), err.msg);
        }
        free(text);
        free(messages);
        free(tools);
    }
    printf("    chat/cases.json: %zu/%zu renders equal transformers'\n", same, json_array_size(cases));
    CHECK(json_array_size(cases) >= 200);
    json_decref(cases);
}

/* tests/data/chat/variants.json (scripts/make-chat-goldens.py): the 0.8B's,
 * the 9B's, the demo model's and its vision templates, enable_thinking
 * absent, true, false and null, and image conversations. */
TEST(chat, golden_variant_renders) {
    json_error_t je;
    json_t *cases = json_load_file(q35_test_path("chat/variants.json"), 0, &je);
    REQUIRE_MSG(json_is_array(cases), "chat/variants.json: %s", je.text);
    static const struct { const char *name; int variant; } names[] = {
        {"qwen3.5-0.8b", Q35_CHAT_QWEN35_SMALL}, {"qwen3.5-9b", Q35_CHAT_QWEN35_9B}, {"demo", Q35_CHAT_DEMO},
        {"demo-vision", Q35_CHAT_DEMO_VISION}};
    size_t i, same = 0, per[4] = {0};
    json_t *c;
    json_array_foreach(cases, i, c) {
        const char *tname = json_string_value(json_object_get(c, "template"));
        int variant = -1;
        for (int k = 0; k < 4; k++)
            if (tname && !strcmp(tname, names[k].name)) { variant = names[k].variant; per[k]++; }
        REQUIRE_MSG(variant >= 0, "case %zu: template %s", i, tname ? tname : "?");
        char *messages = json_dumps(json_object_get(c, "messages"), JSON_COMPACT | JSON_ENCODE_ANY);
        json_t *tools_v = json_object_get(c, "tools"), *think = json_object_get(c, "enable_thinking");
        char *tools = tools_v ? json_dumps(tools_v, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
        q35_chat_options opt = {
            .add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
            .enable_thinking = json_is_true(think) ? 1 : json_is_false(think) ? -1 : 0,
            .add_vision_id = json_is_true(json_object_get(c, "add_vision_id")),
            .variant = variant,
        };
        char *text = NULL;
        q35_error err = {0};
        q35_status st = q35_chat_render(messages, tools, &opt, &text, &err);
        const char *want = json_string_value(json_object_get(c, "expected"));
        const char *want_err = json_string_value(json_object_get(c, "error"));
        bool demo = variant == Q35_CHAT_DEMO || variant == Q35_CHAT_DEMO_VISION;
        if (!demo && string_arguments_case(c)) {
            CHECK(st == Q35_OK && text && strstr(text, "<parameter=as>\nstring\n</parameter>\n"));
            same++;
        } else if (want) {
            if (st == Q35_OK && !strcmp(text, want)) same++;
            else q35_test_fail(__FILE__, __LINE__, "case %zu (%s) differs: %s\n--- got ---\n%s\n--- want ---\n%s", i, tname,
                               st ? err.msg : "", text ? text : "", want);
        } else {
            bool ok = st == Q35_ERR_ARG && (strstr(err.msg, want_err) || !strncmp(want_err, "Cannot apply", 12) ||
                                            demo);
            if (ok) same++;
            else q35_test_fail(__FILE__, __LINE__, "case %zu (%s): want error \"%s\", got %s \"%s\"", i, tname, want_err,
                               q35_status_name(st), err.msg);
        }
        if (text && want) CHECK_EQ_INT(q35_chat_thinks(&opt) && opt.add_generation_prompt,
                                       opt.add_generation_prompt && ends_with_think(want));
        free(text);
        free(messages);
        free(tools);
    }
    printf("    chat/variants.json: %zu/%zu renders equal transformers'\n", same, json_array_size(cases));
    for (int k = 0; k < 4; k++) CHECK(per[k] >= 200);
    json_decref(cases);
}

/* Each template is told apart by its SHA-256 (q35_chat_identify). */
TEST(chat, identify_templates_by_hash) {
    int v;
    char path[1024], hex[65];
    q35_error err = {0};
    char *dir = q35_path_join(q35_test_data_dir(), "chat");
    REQUIRE(q35_chat_identify(dir, &v, path, sizeof path, hex, &err) == Q35_OK);
    CHECK_EQ_INT(v, -2); /* no chat_template.jinja or tokenizer_config.json there */
    free(dir);
    dir = q35_path_join(q35_test_data_dir(), "../../models/qwen35-demo"); /* the demo with its vision tower */
    REQUIRE(q35_chat_identify(dir, &v, path, sizeof path, hex, &err) == Q35_OK);
    CHECK_EQ_INT(v, Q35_CHAT_DEMO_VISION);
    CHECK(!strcmp(hex, "2781d0707add9f1f41d46053d76ded4924989704959204a0ad15fd11e34985e2"));
    free(dir);
    /* tokenizer_config.json's chat_template, as a string and as a named list */
    char *text = NULL;
    size_t len = 0;
    REQUIRE(q35_read_file(q35_test_path("chat/qwen35_9b_chat_template.jinja"), &text, &len, &err) == Q35_OK);
    char tmp[] = "/tmp/q35-chat-XXXXXX";
    REQUIRE(mkdtemp(tmp) != NULL);
    char *cfg = q35_path_join(tmp, "tokenizer_config.json");
    for (int form = 0; form < 3; form++) {
        json_t *t = json_stringn(text, form == 2 ? len - 1 : len);
        json_t *j = form == 1 ? json_pack("{s:[{s:s,s:o}]}", "chat_template", "name", "default", "template", t)
                              : json_pack("{s:o}", "chat_template", t);
        REQUIRE(json_dump_file(j, cfg, 0) == 0);
        json_decref(j);
        REQUIRE(q35_chat_identify(tmp, &v, path, sizeof path, hex, &err) == Q35_OK);
        CHECK_EQ_INT(v, form == 2 ? -1 : Q35_CHAT_QWEN35_9B); /* one byte less: unknown */
        CHECK(!strcmp(path, cfg));
    }
    remove(cfg);
    /* the demo's text-only template (before its vision tower), as a checkpoint's chat_template.jinja */
    free(text);
    REQUIRE(q35_read_file(q35_test_path("chat/demo_chat_template.jinja"), &text, &len, &err) == Q35_OK);
    char *jinja = q35_path_join(tmp, "chat_template.jinja");
    FILE *f = fopen(jinja, "wb");
    REQUIRE(f && fwrite(text, 1, len, f) == len);
    fclose(f);
    REQUIRE(q35_chat_identify(tmp, &v, path, sizeof path, hex, &err) == Q35_OK);
    CHECK_EQ_INT(v, Q35_CHAT_DEMO);
    CHECK(!strcmp(hex, "9d002d01b7392892fe37a3ea70ee8f3ce5745319bb4208d01ab88440634f2259"));
    remove(jinja);
    free(jinja);
    rmdir(tmp);
    free(cfg);
    free(text);
}

TEST(chat, string_arguments_render_like_a_mapping) {
    const char *as_obj = "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                         "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":{\"a\":1,\"b\":[true,null]}}}]}]";
    const char *as_str = "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"content\":\"\",\"tool_calls\":"
                         "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\": 1, \\\"b\\\": [true, null]}\"}}]}]";
    char *a = NULL, *b = NULL;
    q35_error err = {0};
    REQUIRE(q35_chat_render(as_obj, NULL, NULL, &a, &err) == Q35_OK);
    REQUIRE(q35_chat_render(as_str, NULL, NULL, &b, &err) == Q35_OK);
    CHECK_STR_EQ(a, b);
    CHECK(strstr(a, "<parameter=b>\n[true, null]\n</parameter>") != NULL);
    free(a);
    free(b);
    const char *bad = "[{\"role\":\"user\",\"content\":\"q\"},{\"role\":\"assistant\",\"tool_calls\":"
                      "[{\"function\":{\"name\":\"f\",\"arguments\":\"not json\"}}]}]";
    CHECK(q35_chat_render(bad, NULL, NULL, &a, &err) == Q35_ERR_ARG);
    CHECK(a == NULL);
    CHECK(q35_chat_render("{\"role\":\"user\"}", NULL, NULL, &a, &err) == Q35_ERR_ARG);
    CHECK(q35_chat_render("[{\"role\":\"user\",\"content\":\"x\"}]", "{bad", NULL, &a, &err) == Q35_ERR_ARG);
}

static void check_repr(double x, const char *want) {
    q35_buf b = {0};
    q35_py_float_repr(x, &b);
    CHECK_STR_EQ(b.data, want);
    q35_buf_free(&b);
}

/* Python's repr(float), which both |tojson and |string print. */
TEST(chat, python_float_repr) {
    check_repr(1.0, "1.0");
    check_repr(-0.0, "-0.0");
    check_repr(0.1, "0.1");
    check_repr(1e16, "1e+16");
    check_repr(1e15, "1000000000000000.0");
    check_repr(0.0001, "0.0001");
    check_repr(1e-05, "1e-05");
    check_repr(1.5e300, "1.5e+300");
    check_repr(123456789.125, "123456789.125");
    check_repr(2.5e-7, "2.5e-07");
    check_repr(1.0 / 3.0, "0.3333333333333333");
    check_repr(5e-324, "5e-324");
}

/* The whole prompt path: C render, then C tokenizer with the real Qwen3.5
 * vocabulary, against transformers' render encoded by HF tokenizers. */
TEST(chat, golden_prompt_ids_qwen35) {
    q35_tokenizer *tok = NULL;
    q35_error err = {0};
    REQUIRE_MSG(q35_tokenizer_load(q35_test_path("tokenizers-gen/qwen35"), &tok, &err) == Q35_OK,
                "%s (run scripts/install-deps.sh)", err.msg);
    json_t *cases = json_load_file(q35_test_path("chat/cases.json"), 0, NULL);
    REQUIRE(json_is_array(cases));
    size_t i, checked = 0;
    json_t *c;
    json_array_foreach(cases, i, c) {
        json_t *want = json_object_get(c, "ids_qwen35");
        if (!json_is_array(want)) continue;
        char *messages = json_dumps(json_object_get(c, "messages"), JSON_COMPACT);
        json_t *tools_v = json_object_get(c, "tools");
        char *tools = tools_v ? json_dumps(tools_v, JSON_COMPACT) : NULL;
        q35_chat_options opt = {.add_generation_prompt = json_is_true(json_object_get(c, "add_generation_prompt")),
                                .enable_thinking = json_is_true(json_object_get(c, "enable_thinking")),
                                .add_vision_id = json_is_true(json_object_get(c, "add_vision_id"))};
        char *text = NULL;
        int32_t *ids = NULL;
        size_t n = 0;
        bool ok = q35_chat_render(messages, tools, &opt, &text, &err) == Q35_OK &&
                  q35_tokenize(tok, text, strlen(text), 1, &ids, &n, &err) == Q35_OK && n == json_array_size(want);
        for (size_t k = 0; ok && k < n; k++) ok = ids[k] == json_integer_value(json_array_get(want, k));
        CHECK_MSG(ok, "case %zu: prompt ids differ", i);
        checked++;
        free(ids);
        free(text);
        free(messages);
        free(tools);
    }
    printf("    chat/cases.json: %zu prompts give HF's Qwen3.5 ids\n", checked);
    CHECK(checked > 150);
    json_decref(cases);
    q35_tokenizer_free(tok);
}
