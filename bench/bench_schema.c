/* bench_schema.c: the cost of masking one logits row with a JSON schema at
 * the Qwen3.5 vocabulary (248,320 tokens): the trie walk of
 * q35_token_trie_mask from states met while generating a document (inside
 * a string, between keys, in a number, in an array), averaged.
 *
 * Usage: bench_schema [--tokenizer DIR] [--reps N] [--decode-ms MS]
 * Prints ms per masked row and, with --decode-ms, its share of a decode step. */
#include "text/schema.h"
#include "base/util.h"
#include "qwen35.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\"},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":5},"
    "\"kind\":{\"enum\":[\"cat\",\"dog\",\"bird\"]},"
    "\"score\":{\"anyOf\":[{\"type\":\"number\"},{\"type\":\"null\"}]},"
    "\"note\":{\"type\":\"string\"}},"
    "\"required\":[\"name\",\"age\",\"tags\"]}";

/* Prefixes of a document, each a state the mask starts from. */
static const char *const PREFIXES[] = {
    "",
    "{",
    "{\"name\": \"Ali",
    "{\"name\": \"Alice\\",
    "{\"name\": \"Alice\", \"age\": 3",
    "{\"name\": \"Alice\", \"age\": 31, \"tags\": [",
    "{\"name\": \"Alice\", \"age\": 31, \"tags\": [\"a\", \"b",
    "{\"name\": \"Alice\", \"age\": 31, \"tags\": [\"a\"], \"kind\": \"d",
    "{\"name\": \"Alice\", \"age\": 31, \"tags\": [\"a\"], \"score\": 1.",
    "{\"name\": \"Alice\", \"age\": 31, \"tags\": [], \"note\": \"some free text",
};

/* The keywords of patterns, formats and bounds (their DFAs), and states inside them. */
static const char KW_SCHEMA[] =
    "{\"type\":\"object\",\"properties\":{"
    "\"code\":{\"type\":\"string\",\"pattern\":\"^[A-Z]{3}-[0-9]{3}$\"},"
    "\"note\":{\"type\":\"string\",\"pattern\":\"ok\",\"maxLength\":60},"
    "\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
    "\"mail\":{\"type\":\"string\",\"format\":\"email\"},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"p\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1},"
    "\"free\":{\"type\":\"string\",\"pattern\":\"end$\"}},"
    "\"required\":[\"code\",\"note\",\"when\",\"mail\",\"age\",\"p\",\"free\"]}";
static const char *const KW_PREFIXES[] = {
    "{\"code\": \"AB",
    "{\"code\": \"ABC-123\", \"note\": \"free text inside an unanchored pattern",
    "{\"code\": \"ABC-123\", \"note\": \"ok\", \"when\": \"2024-05-01T12:3",
    "{\"code\": \"ABC-123\", \"note\": \"ok\", \"when\": \"2024-05-01T12:30:00Z\", \"mail\": \"alice.b",
    "{\"code\": \"ABC-123\", \"note\": \"ok\", \"when\": \"2024-05-01T12:30:00Z\", \"mail\": \"a@b.org\", \"age\": 1",
    "{\"code\": \"ABC-123\", \"note\": \"ok\", \"when\": \"2024-05-01T12:30:00Z\", \"mail\": \"a@b.org\", \"age\": 12, \"p\": 0.",
    /* no maxLength: the state comes back token after token, its mask from the schema's cache after the first */
    "{\"code\": \"ABC-123\", \"note\": \"ok\", \"when\": \"2024-05-01T12:30:00Z\", \"mail\": \"a@b.org\", \"age\": 12, \"p\": 0.5, "
    "\"free\": \"some text",
};

/* Each prefix's mask, timed; prints them and returns the mean (worst in *worst), -1 on a refused prefix. */
static double time_prefixes(const q35_token_trie *trie, const q35_schema *s, const char *const *prefixes, int n, int reps,
                            uint8_t *live, double *worst);

/* A forced tool call (tool_choice), inside a raw string parameter. */
static const char TOOLS[] =
    "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
    "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\",\"days\"]}}}]";
static const char TOOL_PREFIX[] = "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar";

static double time_mask(const q35_token_trie *trie, const q35_schema *s, const char *prefix, int reps, uint8_t *live,
                        int32_t *n_live) {
    q35_schema_state st;
    q35_schema_start(s, &st);
    if (!q35_schema_feed(s, &st, prefix, strlen(prefix))) return -1;
    double a = q35_now_seconds();
    for (int r = 0; r < reps; r++) *n_live = q35_token_trie_mask(trie, s, &st, live);
    return (q35_now_seconds() - a) * 1e3 / reps;
}

static double time_prefixes(const q35_token_trie *trie, const q35_schema *s, const char *const *prefixes, int n, int reps,
                            uint8_t *live, double *worst) {
    double total = 0;
    *worst = 0;
    for (int p = 0; p < n; p++) {
        int32_t n_live = 0;
        double ms = time_mask(trie, s, prefixes[p], reps, live, &n_live);
        if (ms < 0) { fprintf(stderr, "bench_schema: prefix %d refused\n", p); return -1; }
        total += ms;
        if (ms > *worst) *worst = ms;
        printf("  %-70.70s %7d live  %6.2f ms\n", prefixes[p], n_live, ms);
    }
    return total / n;
}

int main(int argc, char **argv) {
    const char *dir = "tests/data/tokenizers-gen/qwen35";
    int reps = 20;
    double decode_ms = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--tokenizer")) dir = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--decode-ms")) decode_ms = atof(argv[i + 1]);
    }
    q35_tokenizer *tok;
    q35_error err = {0};
    if (q35_tokenizer_load(dir, &tok, &err)) { fprintf(stderr, "bench_schema: %s\n", err.msg); return 1; }
    int32_t V = q35_tokenizer_n_ids(tok);
    const char **bytes = calloc((size_t)V, sizeof *bytes);
    size_t *len = calloc((size_t)V, sizeof *len);
    uint8_t *live = malloc((size_t)V);
    for (int32_t t = 0; t < V; t++)
        if (!q35_token_is_special(tok, t)) bytes[t] = q35_token_bytes(tok, t, &len[t]);
    double t0 = q35_now_seconds();
    q35_token_trie *trie = q35_token_trie_new(bytes, len, V);
    double t_build = q35_now_seconds() - t0;
    json_t *j = json_loads(SCHEMA, 0, NULL);
    q35_schema *s;
    char where[128], msg[256];
    if (!trie || !j || q35_schema_compile(j, &s, where, sizeof where, msg, sizeof msg)) {
        fprintf(stderr, "bench_schema: setup failed: %s %s\n", where, msg);
        return 1;
    }
    double worst, mean = time_prefixes(trie, s, PREFIXES, (int)(sizeof PREFIXES / sizeof *PREFIXES), reps, live, &worst);
    if (mean < 0) return 1;
    printf("schema mask: %d tokens, trie built in %.0f ms; %.2f ms per masked row (mean), %.2f ms worst", V,
           t_build * 1e3, mean, worst);
    if (decode_ms > 0) printf("; %.2f%% of a %.0f ms decode step (worst %.2f%%)", 100 * mean / decode_ms, decode_ms, 100 * worst / decode_ms);
    printf("\n");
    json_t *kj = json_loads(KW_SCHEMA, 0, NULL);
    q35_schema *ks;
    if (!kj || q35_schema_compile(kj, &ks, where, sizeof where, msg, sizeof msg)) {
        fprintf(stderr, "bench_schema: keywords schema refused: %s %s\n", where, msg);
        return 1;
    }
    mean = time_prefixes(trie, ks, KW_PREFIXES, (int)(sizeof KW_PREFIXES / sizeof *KW_PREFIXES), reps, live, &worst);
    if (mean < 0) return 1;
    printf("pattern / format / bounds mask: %.2f ms per masked row (mean), %.2f ms worst", mean, worst);
    if (decode_ms > 0) printf("; %.2f%% of a %.0f ms decode step (worst %.2f%%)", 100 * mean / decode_ms, decode_ms, 100 * worst / decode_ms);
    printf("\n");
    q35_schema_free(ks);
    json_decref(kj);
    json_t *tj = json_loads(TOOLS, 0, NULL);
    q35_schema *ts;
    int32_t n_live = 0;
    if (!tj || q35_schema_compile_tool_call(tj, NULL, &ts, where, sizeof where, msg, sizeof msg)) {
        fprintf(stderr, "bench_schema: tools refused: %s %s\n", where, msg);
        return 1;
    }
    double ms = time_mask(trie, ts, TOOL_PREFIX, reps, live, &n_live);
    printf("tool-call mask (tool_choice), inside a string parameter: %d live, %.2f ms per row", n_live, ms);
    if (decode_ms > 0) printf("; %.2f%% of a %.0f ms decode step", 100 * ms / decode_ms, decode_ms);
    printf("\n");
    q35_schema_free(ts);
    json_decref(tj);
    q35_schema_free(s);
    q35_token_trie_free(trie);
    json_decref(j);
    free(bytes); free(len); free(live);
    q35_tokenizer_free(tok);
    return 0;
}
