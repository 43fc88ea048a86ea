/* Tests of src/output_parser.c: reasoning and Qwen3.5 XML tool calls parsed
 * as vLLM's qwen3 reasoning parser and qwen3_coder tool parser do; the same
 * result whatever way the text is cut into pieces; malformed output ends up
 * as content; arbitrary bytes never break it. */
#include "test.h"
#include "base/utf8.h"
#include "base/util.h"

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"},\"ratio\":{\"type\":\"number\"},"
    "\"celsius\":{\"type\":\"boolean\"},\"opts\":{\"type\":\"object\"},\"tags\":{\"type\":\"array\"},"
    "\"maybe\":{\"type\":[\"integer\",\"null\"]}}}}},"
    "{\"type\":\"function\",\"function\":{\"name\":\"now\",\"parameters\":{}}}]";

/* What one parse produced: the concatenated deltas and the final fields. */
typedef struct parsed {
    q35_buf content, reasoning, names, args[4];
    char *tool_calls;
    const char *final_content, *final_reasoning;
} parsed;

static void collect(parsed *r, const q35_delta *d, size_t n) {
    for (size_t i = 0; i < n; i++) {
        switch (d[i].kind) {
        case Q35_DELTA_CONTENT: q35_buf_append(&r->content, d[i].text, d[i].len); break;
        case Q35_DELTA_REASONING: q35_buf_append(&r->reasoning, d[i].text, d[i].len); break;
        case Q35_DELTA_TOOL_NAME:
            q35_buf_append(&r->names, d[i].text, d[i].len);
            q35_buf_putc(&r->names, ';');
            break;
        case Q35_DELTA_TOOL_ARGS:
            if (d[i].tool_index < 4) q35_buf_append(&r->args[d[i].tool_index], d[i].text, d[i].len);
            break;
        }
    }
}

/* Parses text cut at the given offsets (ascending, may be empty). */
static q35_output_parser *parse_cuts(const char *tools, int in_reasoning, const char *text, const size_t *cuts,
                                     size_t n_cuts, parsed *r) {
    memset(r, 0, sizeof *r);
    q35_output_parser *p;
    q35_error err = {0};
    if (q35_output_parser_new(tools, in_reasoning, &p, &err) != Q35_OK) return NULL;
    const q35_delta *d;
    size_t n, from = 0, len = strlen(text);
    for (size_t i = 0; i <= n_cuts; i++) {
        size_t to = i < n_cuts ? cuts[i] : len;
        if (q35_output_parser_feed(p, text + from, to - from, &d, &n, &err) != Q35_OK) break;
        collect(r, d, n);
        from = to;
    }
    if (q35_output_parser_finish(p, &d, &n, &err) == Q35_OK) collect(r, d, n);
    r->tool_calls = q35_output_parser_tool_calls_json(p);
    r->final_content = q35_output_parser_content(p, NULL);
    r->final_reasoning = q35_output_parser_reasoning(p, NULL);
    return p;
}

static void parsed_free(parsed *r) {
    q35_buf_free(&r->content);
    q35_buf_free(&r->reasoning);
    q35_buf_free(&r->names);
    for (int i = 0; i < 4; i++) q35_buf_free(&r->args[i]);
    free(r->tool_calls);
}

static const char *s_or_empty(const q35_buf *b) { return b->data ? b->data : ""; }

/* Parses whole, then cut at every single point and byte by byte: every way
 * must give the same deltas in total and the same final fields. */
static void check(const char *tools, int in_reasoning, const char *text, const char *want_reasoning,
                  const char *want_content, const char *want_calls) {
    parsed whole;
    q35_output_parser *p = parse_cuts(tools, in_reasoning, text, NULL, 0, &whole);
    REQUIRE(p != NULL);
    CHECK_STR_EQ(whole.final_reasoning, want_reasoning);
    CHECK_STR_EQ(whole.final_content, want_content);
    CHECK_STR_EQ(s_or_empty(&whole.reasoning), want_reasoning);
    CHECK_STR_EQ(s_or_empty(&whole.content), want_content);
    if (want_calls) CHECK_STR_EQ(whole.tool_calls, want_calls);
    else CHECK_MSG(whole.tool_calls == NULL, "unexpected tool calls %s", whole.tool_calls);
    size_t len = strlen(text);
    size_t *cuts = malloc(sizeof *cuts * (len + 1));
    for (size_t k = 0; k <= len + 1; k++) {
        size_t n_cuts = 1;
        if (k <= len) cuts[0] = k;
        else for (n_cuts = 0; n_cuts < len; n_cuts++) cuts[n_cuts] = n_cuts; /* byte by byte */
        parsed part;
        q35_output_parser *q = parse_cuts(tools, in_reasoning, text, cuts, n_cuts, &part);
        REQUIRE(q != NULL);
        CHECK_MSG(!strcmp(s_or_empty(&part.reasoning), want_reasoning) && !strcmp(s_or_empty(&part.content), want_content) &&
                  !strcmp(s_or_empty(&part.names), s_or_empty(&whole.names)) &&
                  !strcmp(s_or_empty(&part.args[0]), s_or_empty(&whole.args[0])) &&
                  !strcmp(s_or_empty(&part.args[1]), s_or_empty(&whole.args[1])) &&
                  ((!part.tool_calls && !whole.tool_calls) || (part.tool_calls && whole.tool_calls && !strcmp(part.tool_calls, whole.tool_calls))),
                  "cut at %zu of \"%s\" gives reasoning \"%s\" content \"%s\" calls %s", k, text,
                  s_or_empty(&part.reasoning), s_or_empty(&part.content), part.tool_calls ? part.tool_calls : "none");
        parsed_free(&part);
        q35_output_parser_free(q);
    }
    free(cuts);
    parsed_free(&whole);
    q35_output_parser_free(p);
}

typedef struct text_case {
    int in_reasoning;
    const char *text, *reasoning, *content;
} text_case;

static void check_all(const char *tools, const text_case *cases, size_t n) {
    for (size_t i = 0; i < n; i++) check(tools, cases[i].in_reasoning, cases[i].text, cases[i].reasoning, cases[i].content, NULL);
}

TEST(output_parser, reasoning) {
    static const text_case cases[] = {
        /* Thinking on: the prompt ended with "<think>\n", the output starts inside. */
        {1, "Let me think.\n</think>\n\nThe answer is 4.", "Let me think.\n", "\n\nThe answer is 4."},
        {1, "<think>\nexplicit open\n</think>\n\nok", "\nexplicit open\n", "\n\nok"},
        {1, "cut off while still thinking <", "cut off while still thinking <", ""},
        {1, "", "", ""},
        /* Thinking off: content, unless the model opens a think block itself. */
        {0, "Plain answer with </think> inside.", "", "Plain answer with </think> inside."},
        {0, "<think>r</think>c", "r", "c"},
        {0, "a <think>not at start</think>", "", "a <think>not at start</think>"},
        /* Without tools, an unpaired <tool_call> still ends the reasoning. */
        {1, "hmm<tool_call>x</tool_call>", "hmm", "<tool_call>x</tool_call>"},
    };
    check_all(NULL, cases, sizeof cases / sizeof cases[0]);
}

TEST(output_parser, tool_calls_typed_by_schema) {
    check(TOOLS, 1,
          "I should call it.\n</think>\n\nChecking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n"
          "<parameter=days>\n3\n</parameter>\n<parameter=ratio>\n0.5\n</parameter>\n<parameter=celsius>\nTrue\n</parameter>\n"
          "<parameter=opts>\n{\"a\": [1, 2]}\n</parameter>\n<parameter=tags>\n[\"x\", \"y\"]\n</parameter>\n"
          "<parameter=maybe>\nnull\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>",
          "I should call it.\n", "\n\nChecking.\n\n",
          "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Zürich\\\", "
          "\\\"days\\\": 3, \\\"ratio\\\": 0.5, \\\"celsius\\\": true, \\\"opts\\\": {\\\"a\\\": [1, 2]}, \\\"tags\\\": [\\\"x\\\", "
          "\\\"y\\\"], \\\"maybe\\\": null, \\\"extra\\\": \\\"42\\\"}\"}}]");
    /* Two calls, numbers that are whole become ints, text between calls is dropped. */
    check(TOOLS, 0,
          "<tool_call>\n<function=get_weather>\n<parameter=ratio>\n2.0\n</parameter>\n<parameter=days>\nthree\n</parameter>\n"
          "</function>\n</tool_call>\nbetween\n<tool_call>\n<function=now>\n</function>\n</tool_call>",
          "", "",
          "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"ratio\\\": 2, \\\"days\\\": "
          "\\\"three\\\"}\"}},{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    /* A parameter without </parameter>, and a call cut off by the end of output. */
    check(TOOLS, 0,
          "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n<parameter=days>\n2",
          "", "",
          "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"arguments\":\"{\\\"city\\\": \\\"Paris\\\", "
          "\\\"days\\\": 2}\"}}]");
    /* A tool call inside the reasoning ends it. */
    check(TOOLS, 1, "need weather<tool_call><function=now></function></tool_call>", "need weather", "",
          "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
    /* A parameter given as a $ref into the parameters' $defs is read by its target's type (pydantic's nested models). */
    check("[{\"type\":\"function\",\"function\":{\"name\":\"book\",\"parameters\":{\"$defs\":{\"A\":{\"type\":\"object\"},"
          "\"N\":{\"type\":\"integer\"}},\"type\":\"object\",\"properties\":{\"to\":{\"$ref\":\"#/$defs/A\"},"
          "\"n\":{\"$ref\":\"#/$defs/N\"},\"bad\":{\"$ref\":\"#/$defs/none\"}}}}}]",
          0, "<tool_call>\n<function=book>\n<parameter=to>\n{\"city\": \"Oslo\"}\n</parameter>\n<parameter=n>\n7\n</parameter>\n"
          "<parameter=bad>\n8\n</parameter>\n</function>\n</tool_call>",
          "", "",
          "[{\"type\":\"function\",\"function\":{\"name\":\"book\",\"arguments\":\"{\\\"to\\\": {\\\"city\\\": \\\"Oslo\\\"}, "
          "\\\"n\\\": 7, \\\"bad\\\": \\\"8\\\"}\"}}]");
    /* A bare <function= block, vLLM's fallback. */
    check(TOOLS, 0, "x <function=now>\n</function>", "", "x ",
          "[{\"type\":\"function\",\"function\":{\"name\":\"now\",\"arguments\":\"{}\"}}]");
}

TEST(output_parser, malformed_output_is_content) {
    static const text_case cases[] = {
        {0, "<tool_call>no function here</tool_call> after", "", "<tool_call>no function here</tool_call> after"},
        {0, "text <tool_call>\n<function=>\n</tool_call>", "", "text <tool_call>\n<function=>\n</tool_call>"},
        {0, "unclosed <tool_call>\n<functi", "", "unclosed <tool_call>\n<functi"},
        {0, "<tool_call></tool_call><tool_call>", "", "<tool_call></tool_call><tool_call>"},
        {0, "a < b and c <tool> d", "", "a < b and c <tool> d"},
        {1, "</think></think><think>", "", "</think><think>"},
    };
    check_all(TOOLS, cases, sizeof cases / sizeof cases[0]);
}

TEST(output_parser, arbitrary_text_never_breaks_it) {
    static const char *const atoms[] = {"<tool_call>", "</tool_call>", "<function=", "</function>", "<parameter=",
                                        "</parameter>", "<think>", "</think>", ">", "<", "\n", "x", "get_weather", "now",
                                        "days", "3", "null", "{\"a\":", "\xe2\x82", "\xff", ""};
    uint32_t x = 99;
    for (int round = 0; round < 400; round++) {
        char text[512] = "";
        size_t len = 0;
        for (int k = 0; k < 24; k++) {
            x = x * 1664525u + 1013904223u;
            const char *a = atoms[(x >> 16) % (sizeof atoms / sizeof atoms[0])];
            size_t n = strlen(a);
            if (len + n >= sizeof text) break;
            memcpy(text + len, a, n);
            len += n;
        }
        text[len] = 0;
        size_t cuts[3] = {len / 3, len / 2, len - len / 4};
        parsed r;
        q35_output_parser *p = parse_cuts(round % 3 ? TOOLS : NULL, round & 1, text, cuts, 3, &r);
        REQUIRE(p != NULL);
        CHECK(!strcmp(s_or_empty(&r.content), r.final_content) && !strcmp(s_or_empty(&r.reasoning), r.final_reasoning));
        if (r.tool_calls) CHECK(strstr(r.tool_calls, "\"arguments\":\"{") != NULL);
        parsed_free(&r);
        q35_output_parser_free(p);
    }
    q35_output_parser *p;
    q35_error err = {0};
    CHECK(q35_output_parser_new("{\"not\": \"an array\"}", 0, &p, &err) == Q35_ERR_ARG);
}

/* Text after a malformed block may hold NUL bytes; it must all come back. */
TEST(output_parser, nul_bytes_after_a_malformed_block) {
    static const char text[] = "OK<tool_call>\n<fu\n</tool_call>3\0\0\0x";
    q35_output_parser *p;
    q35_error err = {0};
    REQUIRE(q35_output_parser_new(TOOLS, 0, &p, &err) == Q35_OK);
    const q35_delta *d;
    size_t n, total = 0;
    REQUIRE(q35_output_parser_feed(p, text, sizeof text - 1, &d, &n, &err) == Q35_OK);
    for (size_t i = 0; i < n; i++) total += d[i].len;
    REQUIRE(q35_output_parser_finish(p, &d, &n, &err) == Q35_OK);
    for (size_t i = 0; i < n; i++) total += d[i].len;
    CHECK_EQ_INT(total, sizeof text - 1);
    CHECK_STR_EQ(q35_output_parser_content(p, NULL), "OK<tool_call>\n<fu\n</tool_call>3");
    size_t len;
    const char *whole = q35_output_parser_content(p, &len); /* the whole message keeps them too */
    CHECK_EQ_INT(len, sizeof text - 1);
    CHECK(!memcmp(whole, text, sizeof text - 1));
    q35_output_parser_free(p);
}
