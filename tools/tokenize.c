/* tokenize.c: `qwen35 tokenize`, text or a chat request to token ids.
 *
 *   qwen35 tokenize -m MODEL_DIR [--text STR | --file PATH | --chat REQ.json]
 *                   [--no-special] [--ids-only] [--bench]
 *
 * Without --text/--file/--chat the text is read from stdin. --chat takes an
 * OpenAI chat request ({"messages": [...], "tools": [...],
 * "chat_template_kwargs": {"enable_thinking": ...}}) or a bare messages
 * array, renders it with the model directory's template (identified by
 * its SHA-256; Qwen3.5-9B's when unknown; generation prompt on) and
 * tokenizes the prompt. --bench encodes the input (one document per line)
 * repeatedly for a few seconds and prints MB/s. */
#include "cli.h"
#include "qwen35.h"
#include "base/util.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void usage(FILE *fp) {
    fprintf(fp, "usage: qwen35 tokenize -m MODEL_DIR [--text STR | --file PATH | --chat REQUEST.json]\n"
                "                       [--no-special] [--ids-only] [--bench]\n"
                "  -m DIR         directory with tokenizer.json, or vocab.json + merges.txt + tokenizer_config.json\n"
                "  --text STR     the text to tokenize (default: stdin)\n"
                "  --file PATH    read the text from a file\n"
                "  --chat FILE    render an OpenAI chat request (or messages array) first, then tokenize\n"
                "  --no-special   treat special tokens in the text as plain text\n"
                "  --ids-only     print only the ids, on one line\n"
                "  --bench        time the encoder on the input, one document per line; print MB/s\n");
}

static char *read_stream(FILE *fp, size_t *len) {
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (size_t k; buf && (k = fread(buf + n, 1, cap - n, fp)) > 0;) {
        n += k;
        if (n == cap) {
            char *p = realloc(buf, cap *= 2);
            if (!p) { free(buf); return NULL; }
            buf = p;
        }
    }
    if (buf) buf[n] = 0;
    *len = n;
    return buf;
}

/* Prints bytes as a JSON-like string: printable UTF-8 as is, others escaped. */
static void print_piece(const char *s, size_t n) {
    putchar('"');
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') printf("\\%c", c);
        else if (c == '\n') fputs("\\n", stdout);
        else if (c == '\t') fputs("\\t", stdout);
        else if (c == '\r') fputs("\\r", stdout);
        else if (c < 0x20 || c == 0x7f) printf("\\x%02x", c);
        else if (c >= 0x80) {
            /* whole characters print as themselves, stray bytes as \xNN */
            size_t len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 0;
            bool ok = len && i + len <= n;
            for (size_t k = 1; ok && k < len; k++) ok = ((unsigned char)s[i + k] & 0xC0) == 0x80;
            if (ok) { fwrite(s + i, 1, len, stdout); i += len - 1; }
            else printf("\\x%02x", c);
        } else putchar(c);
    }
    putchar('"');
}

static int bench(const q35_tokenizer *tok, const char *text, size_t len, int parse_special) {
    size_t bytes = 0, tokens = 0;
    double t0 = q35_now_seconds(), t;
    do {
        for (const char *p = text, *end = text + len; p < end;) {
            const char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t n = nl ? (size_t)(nl - p) : (size_t)(end - p);
            int32_t *ids;
            size_t n_ids;
            q35_error err = {0};
            if (q35_tokenize(tok, p, n, parse_special, &ids, &n_ids, &err) != Q35_OK) {
                fprintf(stderr, "qwen35 tokenize: %s\n", err.msg);
                return 1;
            }
            free(ids);
            bytes += n;
            tokens += n_ids;
            p += n + 1;
        }
        t = q35_now_seconds() - t0;
    } while (t < 3.0);
    printf("{\"bytes\": %zu, \"tokens\": %zu, \"seconds\": %.3f, \"mb_per_s\": %.2f, \"tokens_per_s\": %.0f, \"threads\": 1}\n",
           bytes, tokens, t, (double)bytes / t / 1e6, (double)tokens / t);
    return 0;
}

int cmd_tokenize(int argc, char **argv) {
    const char *model = NULL, *text_arg = NULL, *file = NULL, *chat = NULL;
    int parse_special = 1, ids_only = 0, do_bench = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        bool has_value = i + 1 < argc;
        if ((!strcmp(a, "-m") || !strcmp(a, "--model")) && has_value) model = argv[++i];
        else if (!strcmp(a, "--text") && has_value) text_arg = argv[++i];
        else if (!strcmp(a, "--file") && has_value) file = argv[++i];
        else if (!strcmp(a, "--chat") && has_value) chat = argv[++i];
        else if (!strcmp(a, "--no-special")) parse_special = 0;
        else if (!strcmp(a, "--ids-only")) ids_only = 1;
        else if (!strcmp(a, "--bench")) do_bench = 1;
        else if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else { fprintf(stderr, "qwen35 tokenize: unknown or incomplete option '%s'\n", a); usage(stderr); return 2; }
    }
    if (!model) { usage(stderr); return 2; }
    q35_tokenizer *tok;
    q35_error err = {0};
    if (q35_tokenizer_load(model, &tok, &err) != Q35_OK) {
        fprintf(stderr, "qwen35 tokenize: %s\n", err.msg);
        return 1;
    }
    char *text = NULL;
    size_t len = 0;
    if (chat) {
        if ((text = cli_render_chat(chat, cli_chat_variant(model, "qwen35 tokenize"), "qwen35 tokenize"))) len = strlen(text);
    } else if (text_arg) {
        text = strdup(text_arg);
        len = strlen(text_arg);
    } else if (file) {
        if (q35_read_file(file, &text, &len, &err) != Q35_OK) fprintf(stderr, "qwen35 tokenize: %s\n", err.msg);
    } else text = read_stream(stdin, &len);
    int rc = 1;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!text) {
    } else if (do_bench) rc = bench(tok, text, len, parse_special);
    else if (q35_tokenize(tok, text, len, parse_special, &ids, &n, &err) != Q35_OK) fprintf(stderr, "qwen35 tokenize: %s\n", err.msg);
    else {
        for (size_t i = 0; i < n; i++) printf(i ? " %d" : "%d", (int)ids[i]);
        putchar('\n');
        for (size_t i = 0; !ids_only && i < n; i++) {
            size_t k;
            const char *b = q35_token_bytes(tok, ids[i], &k);
            printf("%6d  ", (int)ids[i]);
            print_piece(b ? b : "", k);
            putchar('\n');
        }
        if (!ids_only) printf("%zu tokens\n", n);
        rc = 0;
    }
    free(ids);
    free(text);
    q35_tokenizer_free(tok);
    return rc;
}
