/* fuzz_output_parser.c: arbitrary generated text, cut into arbitrary pieces,
 * through the reasoning / tool-call parser, with and without tools. The
 * concatenated content and reasoning deltas must equal the final fields. */
#include "qwen35.h"
#include "base/utf8.h"

#include <stdlib.h>
#include <string.h>

static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
    "\"a\":{\"type\":\"integer\"},\"b\":{\"type\":\"number\"},\"c\":{\"type\":\"boolean\"},\"d\":{\"type\":\"object\"},"
    "\"e\":{\"type\":\"array\"},\"g\":{\"type\":[\"string\"]}}}}}]";

static void collect(const q35_delta *d, size_t n, q35_buf *content, q35_buf *reasoning) {
    for (size_t i = 0; i < n; i++) {
        if (d[i].kind == Q35_DELTA_CONTENT) q35_buf_append(content, d[i].text, d[i].len);
        if (d[i].kind == Q35_DELTA_REASONING) q35_buf_append(reasoning, d[i].text, d[i].len);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    int flags = data[0], step = data[1] % 13 + 1;
    q35_output_parser *p;
    q35_error err = {0};
    if (q35_output_parser_new(flags & 1 ? TOOLS : NULL, flags & 2, &p, &err) != Q35_OK) abort();
    q35_buf content = {0}, reasoning = {0};
    const q35_delta *d;
    size_t n;
    for (size_t i = 2; i < size; i += (size_t)step) {
        size_t k = size - i < (size_t)step ? size - i : (size_t)step;
        if (q35_output_parser_feed(p, (const char *)data + i, k, &d, &n, &err) != Q35_OK) abort();
        collect(d, n, &content, &reasoning);
    }
    if (q35_output_parser_finish(p, &d, &n, &err) != Q35_OK) abort();
    collect(d, n, &content, &reasoning);
    /* the deltas add up to the whole message, NUL bytes included */
    size_t cl = 0, rl = 0;
    const char *c = q35_output_parser_content(p, &cl), *r = q35_output_parser_reasoning(p, &rl);
    if (cl != content.len || rl != reasoning.len || (cl && memcmp(c, content.data, cl)) ||
        (rl && memcmp(r, reasoning.data, rl)))
        abort();
    free(q35_output_parser_tool_calls_json(p));
    q35_buf_free(&content);
    q35_buf_free(&reasoning);
    q35_output_parser_free(p);
    return 0;
}
