/* Tests of src/chat.c and src/pyjson.c: every case of tests/data/chat/cases.json
 * (rendered by transformers' apply_chat_template, see
 * scripts/make-tokenizer-goldens.py) must come out byte for byte, and every
 * case the template rejects must be rejected. */
#include "text/pyjson.h"
#include "test.h"
#include "base/util.h"

#include <jansson.h>

/* The one place the C renderer is deliberately more lenient than the template:
 * arguments given as a JSON string (what OpenAI clients send) are parsed. */
static bool string_arguments_case(const json_t *c) {
    const char *err = json_string_value(json_object_get(c, "error"));
    return err && strstr(err, "item pairs");
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
