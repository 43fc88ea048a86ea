/* draft_vocab.c: `qwen35 draft-vocab`, the token-id list behind a
 * reduced-vocabulary draft head (`--draft-vocab FILE` of run, serve and
 * q35_engine_set_draft_vocab).
 *
 * It tokenizes a corpus with the model's tokenizer, counts every id, and
 * writes the N most frequent (ties: the lower id first), the tokenizer's
 * special tokens always among them so that a draft can still propose an end
 * of turn. With --check it reports the share of a held-out text's tokens the
 * list covers: a greedy draft that the full head gets accepted is still
 * accepted with the reduced head whenever the target's token is in the list,
 * so one minus that share bounds the acceptance the reduction can lose. */
#include "cli.h"
#include "qwen35.h"
#include "base/util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: qwen35 draft-vocab (-m MODEL | --tokenizer DIR) --text FILE [--text FILE ...]\n"
    "                          --size N|P% [-o FILE] [--check HELDOUT_FILE]\n"
    "  Writes the N most frequent token ids of the texts (or P% of the vocabulary),\n"
    "  one per line, most frequent first, the tokenizer's special tokens included:\n"
    "  a draft vocabulary for --draft-vocab. --check prints the share of a held-out\n"
    "  text's tokens it covers.\n";

typedef struct { int64_t count; int32_t id; } id_count;

static int by_count(const void *a, const void *b) {
    const id_count *x = a, *y = b;
    if (x->count != y->count) return x->count > y->count ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* Adds the token counts of the file at path; returns its token count or -1. */
static int64_t count_file(const q35_tokenizer *tok, const char *path, int64_t *counts, int32_t n_ids) {
    q35_error err = {0};
    char *text;
    size_t len, n = 0;
    int32_t *ids = NULL;
    if (q35_read_file(path, &text, &len, &err) || q35_tokenize(tok, text, len, 0, &ids, &n, &err)) {
        fprintf(stderr, "qwen35 draft-vocab: %s\n", err.msg);
        return -1;
    }
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < n_ids) counts[ids[i]]++;
    free(ids);
    free(text);
    return (int64_t)n;
}

int cmd_draft_vocab(int argc, char **argv) {
    const char *model = NULL, *tok_dir = NULL, *out_path = NULL, *check = NULL, *size_arg = NULL;
    const char *texts[64];
    int n_texts = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(usage, stdout); return 0; }
        if (!v) { fprintf(stderr, "qwen35 draft-vocab: %s needs a value\n%s", k, usage); return 2; }
        if (!strcmp(k, "-m") || !strcmp(k, "--model")) model = v;
        else if (!strcmp(k, "--tokenizer")) tok_dir = v;
        else if (!strcmp(k, "--text")) {
            if (n_texts == 64) { fprintf(stderr, "qwen35 draft-vocab: at most 64 --text files\n"); return 2; }
            texts[n_texts++] = v;
        } else if (!strcmp(k, "--size")) size_arg = v;
        else if (!strcmp(k, "-o") || !strcmp(k, "--output")) out_path = v;
        else if (!strcmp(k, "--check")) check = v;
        else { fprintf(stderr, "qwen35 draft-vocab: unknown option '%s'\n%s", k, usage); return 2; }
        i++;
    }
    if ((!model == !tok_dir) || !n_texts || !size_arg) {
        fprintf(stderr, "qwen35 draft-vocab: missing required options\n%s", usage);
        return 2;
    }
    q35_error err = {0};
    q35_tokenizer *tok = NULL;
    if (q35_tokenizer_load(tok_dir ? tok_dir : model, &tok, &err)) {
        fprintf(stderr, "qwen35 draft-vocab: %s\n", err.msg);
        return 1;
    }
    const int32_t V = q35_tokenizer_n_ids(tok);
    char *end;
    errno = 0;
    double size = strtod(size_arg, &end);
    int pct = *end == '%';
    if (errno || end == size_arg || (*end && !(pct && !end[1])) || !(size > 0) || (pct && size > 100) ||
        (!pct && (size != (double)(int64_t)size || size > V))) {
        fprintf(stderr, "qwen35 draft-vocab: --size must be 1..%d token ids or a percentage 0-100%% (got '%s')\n", V,
                size_arg);
        q35_tokenizer_free(tok);
        return 2;
    }
    int32_t n_keep = pct ? (int32_t)(size / 100.0 * V + 0.5) : (int32_t)size;
    if (n_keep < 1) n_keep = 1;
    int64_t *counts = calloc((size_t)V, sizeof *counts), total = 0;
    id_count *order = malloc(sizeof *order * (size_t)V);
    int rc = counts && order ? 0 : 1;
    if (rc) fprintf(stderr, "qwen35 draft-vocab: out of memory\n");
    for (int i = 0; i < n_texts && !rc; i++) {
        int64_t n = count_file(tok, texts[i], counts, V);
        if (n < 0) rc = 1;
        total += n;
    }
    if (!rc) {
        /* special tokens first, whatever their count; ids naming no token never */
        int32_t n_special = 0, n_named = 0;
        for (int32_t id = 0; id < V; id++) {
            size_t len;
            if (!q35_token_bytes(tok, id, &len) && !q35_token_is_special(tok, id)) continue;
            int special = q35_token_is_special(tok, id);
            order[n_named++] = (id_count){special ? INT64_MAX : counts[id], id};
            n_special += special;
        }
        qsort(order, (size_t)n_named, sizeof *order, by_count);
        if (n_keep > n_named) n_keep = n_named;
        int64_t covered = 0;
        for (int32_t i = 0; i < n_keep; i++)
            if (order[i].count != INT64_MAX) covered += order[i].count;
        FILE *fp = out_path ? fopen(out_path, "w") : stdout;
        if (!fp) {
            fprintf(stderr, "qwen35 draft-vocab: cannot write %s: %s\n", out_path, strerror(errno));
            rc = 1;
        } else {
            fprintf(fp, "# qwen35 draft vocabulary: %d of %d token ids (%d special), most frequent first in %lld tokens of",
                    n_keep, V, n_special, (long long)total);
            for (int i = 0; i < n_texts; i++) fprintf(fp, " %s", texts[i]);
            fprintf(fp, "\n# they cover %.2f%% of those tokens\n", total ? 100.0 * (double)covered / (double)total : 0.0);
            for (int32_t i = 0; i < n_keep; i++) fprintf(fp, "%d\n", order[i].id);
            if (out_path && fclose(fp)) {
                fprintf(stderr, "qwen35 draft-vocab: cannot write %s: %s\n", out_path, strerror(errno));
                rc = 1;
            }
        }
        fprintf(stderr, "qwen35 draft-vocab: %d of %d ids; they cover %.2f%% of the %lld tokens of the texts\n", n_keep, V,
                total ? 100.0 * (double)covered / (double)total : 0.0, (long long)total);
        if (!rc && check) {
            int64_t *held = calloc((size_t)V, sizeof *held);
            int64_t n = held ? count_file(tok, check, held, V) : -1, in = 0;
            if (n < 0) rc = 1;
            for (int32_t i = 0; i < n_keep && !rc; i++) in += held[order[i].id];
            if (!rc)
                fprintf(stderr, "qwen35 draft-vocab: %s: %lld tokens, %.2f%% of them in the draft vocabulary\n", check, (long long)n,
                       n ? 100.0 * (double)in / (double)n : 0.0);
            free(held);
        }
    }
    free(counts);
    free(order);
    q35_tokenizer_free(tok);
    return rc;
}
