/* run.c: `qwen35 run` (greedy generation from token ids) and `qwen35 logits`
 * (float32 logits for every prompt position). Both interfaces are relied on
 * by scripts and tests: keep their options and output stable. */
#include "cli.h"
#include "qwen35.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* "1,2,3" -> ids; rejects empty items, signs, junk and overflow. */
static int parse_ids(const char *s, int32_t **out, int32_t *n_out) {
    size_t cap = 16, n = 0;
    int32_t *ids = malloc(cap * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    while (*p) {
        char *end;
        errno = 0;
        if (*p < '0' || *p > '9') { free(ids); return -1; }
        long v = strtol(p, &end, 10);
        if (errno || v > INT32_MAX || end == p) { free(ids); return -1; }
        if (n == cap) {
            cap *= 2;
            int32_t *nid = realloc(ids, cap * sizeof *ids);
            if (!nid) { free(ids); return -1; }
            ids = nid;
        }
        ids[n++] = (int32_t)v;
        p = end;
        if (*p == ',') { p++; if (!*p) { free(ids); return -1; } }
        else if (*p) { free(ids); return -1; }
    }
    if (!n) { free(ids); return -1; }
    *out = ids;
    *n_out = (int32_t)n;
    return 0;
}

#define MAX_IMAGES 16
#define IMAGE_BLOCK "<|vision_start|><|image_pad|><|vision_end|>"

typedef struct {
    const char *model, *ids, *text, *out, *draft_vocab, *chat;
    const char *images[MAX_IMAGES]; /* --image, in order */
    int n_images, print_ids;
    long n_gen, threads;
    int weights; /* q35_weights_mode */
    int kv_cache; /* q35_kv_cache */
    long spec_k; /* -1: the default (1 with an MTP head, else 0) */
} run_args;

static int parse_args(int argc, char **argv, run_args *a, int want_out, const char *usage) {
    memset(a, 0, sizeof *a);
    a->n_gen = 16;
    a->spec_k = -1;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(usage, stdout); exit(0); }
        if (!want_out && !strcmp(k, "--no-spec")) { a->spec_k = 0; continue; }
        if (want_out && !strcmp(k, "--print-ids")) { a->print_ids = 1; continue; }
        if (!strcmp(k, "--no-mmap")) { a->weights = Q35_WEIGHTS_IN_MEMORY; continue; }
        if (!strcmp(k, "--mmap")) { a->weights = Q35_WEIGHTS_MAPPED; continue; }
        if (!v) { fprintf(stderr, "%s: option %s needs a value\n%s", argv[0], k, usage); return -1; }
        char *end;
        if (!strcmp(k, "-m") || !strcmp(k, "--model")) a->model = v;
        else if (!strcmp(k, "--prompt-ids")) a->ids = v;
        else if (!want_out && !strcmp(k, "--prompt")) a->text = v;
        else if (!strcmp(k, "--kv-cache")) {
            if ((a->kv_cache = q35_kv_cache_parse(v)) < 0) {
                fprintf(stderr, "%s: --kv-cache must be f32 or q8 (got '%s')\n", argv[0], v);
                return -1;
            }
        }
        else if (!want_out && !strcmp(k, "--draft-vocab")) a->draft_vocab = v;
        else if (want_out && !strcmp(k, "--chat")) a->chat = v;
        else if (!want_out && !strcmp(k, "--image")) {
            if (a->n_images == MAX_IMAGES) { fprintf(stderr, "%s: at most %d --image\n", argv[0], MAX_IMAGES); return -1; }
            a->images[a->n_images++] = v;
        }
        else if (want_out && (!strcmp(k, "-o") || !strcmp(k, "--output"))) a->out = v;
        else if (!want_out && (!strcmp(k, "-n") || !strcmp(k, "--n-predict"))) {
            a->n_gen = strtol(v, &end, 10);
            if (*end || a->n_gen < 0 || a->n_gen > 1000000) { fprintf(stderr, "%s: bad -n '%s'\n", argv[0], v); return -1; }
        } else if (!want_out && !strcmp(k, "--spec-k")) {
            a->spec_k = strtol(v, &end, 10);
            if (*end || a->spec_k < 0 || a->spec_k > Q35_SPEC_K_MAX) {
                fprintf(stderr, "%s: --spec-k must be 0..%d (got '%s')\n", argv[0], Q35_SPEC_K_MAX, v);
                return -1;
            }
        } else if (!strcmp(k, "-t") || !strcmp(k, "--threads")) {
            a->threads = strtol(v, &end, 10);
            if (*end || a->threads < 0 || a->threads > 1024) { fprintf(stderr, "%s: bad -t '%s'\n", argv[0], v); return -1; }
        } else { fprintf(stderr, "%s: unknown option '%s'\n%s", argv[0], k, usage); return -1; }
        i++;
    }
    if (!a->model || (!!a->ids + !!a->text + !!a->chat != 1) || (want_out && !a->out)) {
        fprintf(stderr, "%s: missing required options\n%s", argv[0], usage);
        return -1;
    }
    return 0;
}

static int open_engine(const run_args *a, q35_engine **e) {
    q35_error err = {0};
    q35_engine_params p = {.n_threads = (int32_t)a->threads, .weights = a->weights, .kv_cache = a->kv_cache};
    if (q35_engine_load(a->model, &p, e, &err)) {
        fprintf(stderr, "qwen35: %s\n", err.msg);
        return -1;
    }
    const char *note = NULL;
    q35_engine_kernels(*e, &note);
    if (note) fprintf(stderr, "qwen35: %s\n", note);
    return 0;
}

static const char run_usage[] =
    "usage: qwen35 run -m MODEL_DIR (--prompt-ids 1,2,3 | --prompt TEXT) [--image FILE]... [-n N] [-t THREADS]\n"
    "                  [--spec-k K | --no-spec] [--draft-vocab FILE] [--mmap | --no-mmap] [--kv-cache f32|q8]\n"
    "  Greedy generation of N tokens. With --prompt-ids it prints the generated\n"
    "  token ids; with --prompt (tokenized by the model's tokenizer) it prints the\n"
    "  text as it is generated and stops at an end-of-text token. Then tok/s and\n"
    "  the speculative-decoding counters go to stderr. With an MTP head,\n"
    "  speculation drafts K tokens per step (default 1); the output is the same.\n"
    "  --draft-vocab FILE drafts over those token ids only (one per line, as\n"
    "  `qwen35 draft-vocab` writes): a cheaper draft; the output is the same.\n"
    "  Weights are read into memory on huge pages where the system allows it (--no-mmap\n"
    "  insists), else served from the mapped file (--mmap insists).\n"
    "  --kv-cache q8 keeps the attention keys and values in 8 bits with a scale per 32\n"
    "  (llama.cpp's -ctk q8_0 -ctv q8_0): 3.6x less memory and reading per position\n"
    "  (default f32, the exact values).\n"
    "  --image FILE (repeatable): an image, encoded by the vision tower. With --prompt it\n"
    "  goes in as <|vision_start|><|image_pad|><|vision_end|> before the text, or where the\n"
    "  text holds <|image_pad|> itself; --prompt-ids must hold one image_pad id per --image.\n";

/* Where generated tokens go: a comma-separated id list, or streamed text. */
typedef struct {
    q35_detokenizer *dt; /* NULL: ids */
    long n;
} sink;

/* Prints one token (in a text run, not the end-of-text token that stopped it). */
static void sink_put(sink *k, int32_t t, int32_t stop) {
    k->n++;
    if (!k->dt) {
        printf("%s%d", k->n > 1 ? "," : "", t);
        return;
    }
    if (stop == Q35_STOP_EOS) return;
    size_t len;
    const char *piece = q35_detokenizer_feed(k->dt, t, &len);
    fwrite(piece, 1, len, stdout);
}

int cmd_run(int argc, char **argv) {
    run_args a;
    if (parse_args(argc, argv, &a, 0, run_usage)) return 2;
    int32_t *ids = NULL, n_ids = 0;
    q35_tokenizer *tok = NULL;
    sink out_sink = {NULL, 0};
    int32_t ends[2];
    int n_ends = 0;
    q35_error err = {0};
    if (a.ids && parse_ids(a.ids, &ids, &n_ids)) { fprintf(stderr, "qwen35 run: bad --prompt-ids '%s'\n", a.ids); return 2; }
    if (a.text) {
        size_t n = 0;
        if (q35_tokenizer_load(a.model, &tok, &err) || q35_tokenize(tok, a.text, strlen(a.text), 1, &ids, &n, &err) ||
            q35_detokenizer_new(tok, 1, &out_sink.dt, &err)) {
            fprintf(stderr, "qwen35 run: %s\n", err.msg);
            q35_tokenizer_free(tok);
            free(ids);
            return 1;
        }
        if (!n) { fprintf(stderr, "qwen35 run: the prompt is empty\n"); q35_tokenizer_free(tok); return 2; }
        n_ids = (int32_t)n;
    }
    q35_engine *e = NULL;
    q35_session *s = NULL;
    cli_mm_prompt mp = {0};
    int failed = open_engine(&a, &e);
    if (!failed && a.n_images && a.ids) { /* the ids hold one image_pad per image */
        failed = cli_mm_encode(e, a.model, a.images, a.n_images, NULL, &mp, "qwen35 run") ||
                 q35_engine_expand_images(e, ids, n_ids, mp.images, mp.n_images, &mp.ids, &mp.n, &err);
        if (failed && mp.n_images) fprintf(stderr, "qwen35 run: %s\n", err.msg);
    } else if (!failed && a.n_images) { /* the images go before the text unless it places them itself */
        size_t tl = strlen(a.text), bl = strlen(IMAGE_BLOCK);
        char *text = malloc(bl * (size_t)a.n_images + tl + 1);
        if (text) {
            size_t at = 0;
            for (int i = 0; !strstr(a.text, "<|image_pad|>") && i < a.n_images; i++, at += bl) memcpy(text + at, IMAGE_BLOCK, bl);
            memcpy(text + at, a.text, tl + 1);
        }
        failed = !text || cli_mm_prompt_build(e, a.model, tok, text, a.images, a.n_images, NULL, &mp, "qwen35 run");
        if (!text) fprintf(stderr, "qwen35 run: out of memory\n");
        free(text);
    }
    if (!failed && a.n_images) n_ids = mp.n;
    if (!failed && q35_session_new(e, n_ids + (int32_t)a.n_gen + Q35_SPEC_K_MAX + 1, &s, &err)) {
        fprintf(stderr, "qwen35 run: %s\n", err.msg);
        failed = 1;
    }
    if (failed) {
        if (e) q35_engine_free(e);
        cli_mm_prompt_free(&mp);
        free(ids);
        q35_detokenizer_free(out_sink.dt);
        q35_tokenizer_free(tok);
        return 1;
    }
    const q35_model_info *info = q35_engine_info(e);
    float *logits = malloc(sizeof(float) * (size_t)info->vocab_size);
    int rc = 0;
    /* speculation is set before the prompt so that the MTP head sees it too */
    int32_t k = (int32_t)a.spec_k;
    if (k < 0) k = info->has_mtp ? 1 : 0;
    if (k > 0 && q35_session_set_spec(s, k, &err)) {
        fprintf(stderr, "qwen35 run: %s\n", err.msg);
        rc = 1;
    }
    if (!rc && !info->has_mtp) fprintf(stderr, "qwen35 run: the model has no MTP head; decoding without speculation\n");
    if (!rc && a.draft_vocab && cli_set_draft_vocab(e, a.draft_vocab, "qwen35 run")) rc = 1;
    double t0 = cli_now();
    q35_status st = rc ? Q35_OK
                    : !logits ? Q35_ERR_NOMEM
                    : mp.n_images ? q35_session_eval_images(s, mp.ids, mp.n, mp.images, mp.n_images, logits, 0, &err)
                                  : q35_session_eval(s, ids, n_ids, logits, 0, &err);
    if (!rc && st) {
        fprintf(stderr, "qwen35 run: %s\n", logits ? err.msg : "out of memory");
        rc = 1;
    }
    double t1 = cli_now(), t2 = t1;
    /* with --prompt-ids exactly N tokens; a text run ends at an end-of-text token too */
    if (tok) n_ends = cli_chat_end_ids(tok, info->vocab_size, ends);
    q35_gen_params gp = {.max_tokens = (int32_t)a.n_gen, .ignore_eos = !tok, .eos_ids = ends, .n_eos_ids = n_ends};
    q35_generation *gen = NULL;
    if (!rc && a.n_gen > 0 && q35_generation_new(s, &gp, &gen, &err)) {
        fprintf(stderr, "qwen35 run: %s\n", err.msg);
        rc = 1;
    }
    q35_gen_out o = {.stop = Q35_STOP_NONE};
    for (int first = 1; gen && !rc && !o.stop; first = 0) {
        if (first ? q35_generation_begin(gen, logits, &o, &err) : q35_generation_step(gen, &o, &err)) {
            fprintf(stderr, "\nqwen35 run: %s\n", err.msg);
            rc = 1;
            break;
        }
        for (int32_t i = 0; i < o.n_tokens; i++) sink_put(&out_sink, o.tokens[i], i + 1 == o.n_tokens ? o.stop : 0);
        fflush(stdout);
    }
    long n_done = out_sink.n;
    q35_generation_free(gen);
    t2 = cli_now();
    if (out_sink.dt) {
        size_t len;
        const char *tail = q35_detokenizer_flush(out_sink.dt, &len);
        fwrite(tail, 1, len, stdout);
    }
    if (n_done) printf("\n");
    if (!rc) {
        fprintf(stderr, "prompt: %d tokens in %.3f s (%.2f tok/s); generated: %ld tokens in %.3f s (%.2f tok/s)\n", n_ids,
                t1 - t0, n_ids / (t1 - t0), n_done, t2 - t1, n_done > 1 ? (n_done - 1) / (t2 - t1) : 0.0);
        cli_print_spec_stats(e, s);
    }
    free(logits);
    free(ids);
    cli_mm_prompt_free(&mp);
    q35_detokenizer_free(out_sink.dt);
    q35_tokenizer_free(tok);
    q35_session_free(s);
    q35_engine_free(e);
    return rc;
}

static const char logits_usage[] =
    "usage: qwen35 logits -m MODEL_DIR (--prompt-ids 1,2,3 | --chat REQ.json [--print-ids]) -o FILE\n"
    "                     [-t THREADS] [--mmap | --no-mmap]\n"
    "  Writes little-endian float32 logits: one row of vocab_size values per prompt position.\n"
    "  --chat renders an OpenAI chat request (messages with text and image_url parts; an image\n"
    "  as a data: URL with base64 or a local file path, relative to REQ.json) with the generation\n"
    "  prompt through the model's chat template, tokenizer and image processor; its positions\n"
    "  are those of the expanded prompt (each image's <|image_pad|> repeated to its token count).\n"
    "  --print-ids prints the expanded prompt's ids, comma-separated, on stdout.\n";

int cmd_logits(int argc, char **argv) {
    run_args a;
    if (parse_args(argc, argv, &a, 1, logits_usage)) return 2;
    if (a.print_ids && !a.chat) { fprintf(stderr, "qwen35 logits: --print-ids goes with --chat\n%s", logits_usage); return 2; }
    cli_mm_prompt mp = {0};
    if (a.ids && parse_ids(a.ids, &mp.ids, &mp.n)) { fprintf(stderr, "qwen35 logits: bad --prompt-ids '%s'\n", a.ids); return 2; }
    q35_engine *e = NULL;
    q35_session *s = NULL;
    q35_error err = {0};
    if (open_engine(&a, &e)) { cli_mm_prompt_free(&mp); return 1; }
    if (a.chat && cli_mm_prompt_from_request(e, a.model, a.chat, &mp, "qwen35 logits")) {
        q35_engine_free(e);
        return 1;
    }
    if (q35_session_new(e, mp.n, &s, &err)) {
        fprintf(stderr, "qwen35 logits: %s\n", err.msg);
        cli_mm_prompt_free(&mp);
        q35_engine_free(e);
        return 1;
    }
    if (a.print_ids) {
        for (int32_t i = 0; i < mp.n; i++) printf("%s%d", i ? "," : "", mp.ids[i]);
        printf("\n");
    }
    const q35_model_info *info = q35_engine_info(e);
    size_t n_vals = (size_t)mp.n * (size_t)info->vocab_size;
    float *logits = malloc(sizeof(float) * n_vals);
    int rc = 0;
    q35_status st = !logits ? Q35_ERR_NOMEM
                    : a.chat ? q35_session_eval_images(s, mp.ids, mp.n, mp.images, mp.n_images, logits, Q35_EVAL_ALL_LOGITS, &err)
                             : q35_session_eval(s, mp.ids, mp.n, logits, Q35_EVAL_ALL_LOGITS, &err);
    if (st) {
        fprintf(stderr, "qwen35 logits: %s\n", logits ? err.msg : "out of memory");
        rc = 1;
    } else {
        FILE *fp = fopen(a.out, "wb");
        /* x86-64 is little-endian, so the floats are written as they are */
        if (!fp || fwrite(logits, sizeof(float), n_vals, fp) != n_vals || fclose(fp) != 0) {
            fprintf(stderr, "qwen35 logits: cannot write %s: %s\n", a.out, strerror(errno));
            rc = 1;
        }
    }
    free(logits);
    cli_mm_prompt_free(&mp);
    q35_session_free(s);
    q35_engine_free(e);
    return rc;
}
