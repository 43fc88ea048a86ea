/* chat.c: `qwen35 chat`, an interactive chat on the command line.
 *
 * Each user line becomes a message; the conversation is rendered with the
 * model's chat template, tokenized, and only the tokens the session has not
 * seen yet are evaluated (the previous turns stay in the session's state).
 * Replies stream as they are generated, with speculative decoding when the
 * model has an MTP head. /reset starts over, /quit (or end of input) leaves. */
#include "cli.h"
#include "qwen35.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The reply being streamed. */
typedef struct {
    q35_detokenizer *dt;
    int n_gen;
    char *text;
    size_t len;
} reply;

/* Prints one generated token's text (not the end token that stopped the reply). */
static void emit(reply *r, int32_t t, int32_t stop) {
    r->n_gen++;
    if (stop == Q35_STOP_EOS) return;
    size_t len;
    const char *piece = q35_detokenizer_feed(r->dt, t, &len);
    fwrite(piece, 1, len, stdout);
    fflush(stdout);
    char *grown = realloc(r->text, r->len + len + 1);
    if (grown) {
        r->text = grown;
        memcpy(r->text + r->len, piece, len);
        r->len += len;
        r->text[r->len] = 0;
    }
}

static int has_user(json_t *messages) {
    size_t i;
    json_t *m;
    json_array_foreach(messages, i, m) if (!strcmp(json_string_value(json_object_get(m, "role")), "user")) return 1;
    return 0;
}

static const char usage[] =
    "usage: qwen35 chat [-m MODEL] [--system TEXT] [--think] [-n MAX_TOKENS] [--temp T] [--seed N]\n"
    "                   [--ctx N] [--spec-k K | --no-spec] [-t THREADS] [--mmap | --no-mmap] [--image FILE]...\n"
    "                   [--kv-cache f32|q8]\n"
    "  Chat on the terminal. Without -m it uses the embedded demo model.\n"
    "  --image FILE (repeatable) goes with the first user message, before its text.\n"
    "  Lines starting with /reset clear the conversation; /quit or end of input leaves.\n";

int cmd_chat(int argc, char **argv) {
    const char *model = NULL, *system_msg = NULL, *images[16];
    int n_images = 0;
    int think = 0, max_tokens = 512, ctx = 4096, spec_k = -1, threads = 0, weights = Q35_WEIGHTS_AUTO, kv = Q35_KV_F32;
    float temp = 0.0f;
    uint64_t seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(usage, stdout); return 0; }
        if (!strcmp(k, "--think")) { think = 1; continue; }
        if (!strcmp(k, "--no-spec")) { spec_k = 0; continue; }
        if (!strcmp(k, "--no-mmap")) { weights = Q35_WEIGHTS_IN_MEMORY; continue; }
        if (!strcmp(k, "--mmap")) { weights = Q35_WEIGHTS_MAPPED; continue; }
        if (!v) { fprintf(stderr, "qwen35 chat: %s needs a value\n%s", k, usage); return 2; }
        char *end = NULL;
        if (!strcmp(k, "-m")) model = v;
        else if (!strcmp(k, "--system")) system_msg = v;
        else if (!strcmp(k, "--kv-cache")) { if ((kv = q35_kv_cache_parse(v)) < 0) goto bad; }
        else if (!strcmp(k, "--image")) { if (n_images == 16) goto bad; images[n_images++] = v; }
        else if (!strcmp(k, "-n")) { max_tokens = (int)strtol(v, &end, 10); if (*end || max_tokens < 1) goto bad; }
        else if (!strcmp(k, "--ctx")) { ctx = (int)strtol(v, &end, 10); if (*end || ctx < 16) goto bad; }
        else if (!strcmp(k, "--temp")) { temp = strtof(v, &end); if (*end || !(temp >= 0) || temp > 10) goto bad; }
        else if (!strcmp(k, "--seed")) { seed = strtoull(v, &end, 10); if (*end) goto bad; }
        else if (!strcmp(k, "--spec-k")) { spec_k = (int)strtol(v, &end, 10); if (*end || spec_k < 0 || spec_k > Q35_SPEC_K_MAX) goto bad; }
        else if (!strcmp(k, "-t")) { threads = (int)strtol(v, &end, 10); if (*end || threads < 0) goto bad; }
        else { fprintf(stderr, "qwen35 chat: unknown option '%s'\n%s", k, usage); return 2; }
        i++;
        continue;
    bad:
        fprintf(stderr, "qwen35 chat: bad value '%s' for %s\n", v, k);
        return 2;
    }
    char *default_model = NULL;
    if (!model) model = default_model = cli_default_model();

    q35_error err = {0};
    q35_engine_params ep = {.n_threads = threads, .weights = weights, .kv_cache = kv};
    q35_engine *e = NULL;
    q35_tokenizer *tok = NULL;
    q35_session *s = NULL;
    q35_detokenizer *dt = NULL;
    q35_sampler *sampler = NULL;
    int rc = 1;
    if (q35_engine_load(model, &ep, &e, &err) || q35_tokenizer_load(model, &tok, &err) ||
        q35_session_new(e, ctx, &s, &err) || q35_detokenizer_new(tok, 1, &dt, &err)) {
        fprintf(stderr, "qwen35 chat: %s\n", err.msg);
        goto done;
    }
    const q35_model_info *info = q35_engine_info(e);
    if (spec_k < 0) spec_k = info->has_mtp ? 1 : 0;
    if (spec_k > 0 && q35_session_set_spec(s, spec_k, &err)) { fprintf(stderr, "qwen35 chat: %s\n", err.msg); goto done; }
    int32_t ends[2];
    int n_ends = cli_chat_end_ids(tok, info->vocab_size, ends);
    int variant = cli_chat_variant(model, "qwen35 chat");
    /* Replies take speculative steps either way: greedy ones the plain argmax
     * of each verify row, sampled ones the library's sampler through
     * speculative rejection sampling (the same distribution as sampling one
     * token at a time, as the server's sampled requests do). */
    if (temp > 0) {
        uint64_t s0 = seed ? seed : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
        q35_sampler_params sp = {temp, 0, 1.0f, 0.0f, 0.0f, 0.0f, 1.0f, s0};
        if (q35_sampler_new(&sp, info->vocab_size, &sampler, &err)) { fprintf(stderr, "qwen35 chat: %s\n", err.msg); goto done; }
    }
    q35_gen_params gp = {.sampler = sampler, .max_tokens = max_tokens, .eos_ids = ends, .n_eos_ids = n_ends};
    /* the images are encoded once; each turn expands its prompt with them */
    cli_mm_prompt im = {0};
    if (n_images && cli_mm_encode(e, model, images, n_images, NULL, &im, "qwen35 chat")) goto done;

    json_t *messages = json_array();
    if (system_msg) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system_msg));
    float *logits = malloc(sizeof(float) * (size_t)info->vocab_size);
    char line[8192];
    int tty = isatty(0);
    if (tty) fprintf(stderr, "qwen35 chat (%s). /reset clears, /quit leaves.\n", model);
    for (;;) {
        if (tty) { fputs("> ", stderr); fflush(stderr); }
        if (!fgets(line, sizeof line, stdin)) break;
        line[strcspn(line, "\r\n")] = 0;
        if (!strcmp(line, "/quit")) break;
        if (!strcmp(line, "/reset")) {
            json_array_clear(messages);
            if (system_msg) json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "system", "content", system_msg));
            q35_session_reset(s);
            continue;
        }
        if (!line[0]) continue;
        json_t *content;
        if (!n_images || has_user(messages)) {
            content = json_string(line);
        } else {
            content = json_array();
            for (int i = 0; i < n_images; i++) json_array_append_new(content, json_pack("{s:s}", "type", "image"));
            json_array_append_new(content, json_pack("{s:s,s:s}", "type", "text", "text", line));
        }
        json_array_append_new(messages, json_pack("{s:s,s:o}", "role", "user", "content", content));
        char *msgs = json_dumps(messages, JSON_COMPACT), *text = NULL;
        q35_chat_options co = {.add_generation_prompt = 1, .enable_thinking = think ? 1 : -1, .variant = variant};
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (q35_chat_render(msgs, NULL, &co, &text, &err) || q35_tokenize(tok, text, strlen(text), 1, &ids, &n_ids, &err)) {
            fprintf(stderr, "qwen35 chat: %s\n", err.msg);
            free(msgs); free(text); free(ids);
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        free(msgs);
        free(text);
        if (n_ids + (size_t)max_tokens + Q35_SPEC_K_MAX + 1 > (size_t)ctx) {
            fprintf(stderr, "qwen35 chat: the conversation (%zu tokens) no longer fits the %d-token context; /reset\n",
                    n_ids, ctx);
            free(ids);
            json_array_remove(messages, json_array_size(messages) - 1);
            continue;
        }
        /* evaluate only what the session has not seen (it starts over if the render diverged) */
        double t0 = cli_now();
        q35_generation *gen = NULL;
        /* with images: the prompt expanded by them, and the same prefix reuse */
        int32_t *x = NULL, nx = 0;
        q35_status st0 = !n_images ? q35_session_sync(s, ids, (int32_t)n_ids, NULL, logits, NULL, &err)
                         : q35_engine_expand_images(e, ids, (int32_t)n_ids, im.images, im.n_images, &x, &nx, &err)
                             ? err.status
                             : q35_session_sync_images(s, x, nx, im.images, im.n_images, NULL, logits, NULL, &err);
        free(x);
        if (st0 || q35_generation_new(s, &gp, &gen, &err)) {
            fprintf(stderr, "qwen35 chat: %s\n", err.msg);
            free(ids);
            break;
        }
        free(ids);
        /* the first token from the prompt's logits; each step then evaluates
         * the newest token and yields the next ones */
        q35_gen_out o;
        q35_status st = q35_generation_begin(gen, logits, &o, &err);
        double t1 = cli_now();
        reply r = {dt, 0, NULL, 0};
        for (;;) {
            if (st) { fprintf(stderr, "\nqwen35 chat: %s\n", err.msg); break; }
            for (int32_t i = 0; i < o.n_tokens; i++) emit(&r, o.tokens[i], i + 1 == o.n_tokens ? o.stop : 0);
            if (o.stop) break;
            st = q35_generation_step(gen, &o, &err);
        }
        q35_generation_free(gen);
        int n_gen = r.n_gen;
        char *out_text = r.text ? r.text : strdup("");
        size_t len;
        const char *tail = q35_detokenizer_flush(dt, &len);
        fwrite(tail, 1, len, stdout);
        fputc('\n', stdout);
        fflush(stdout);
        double t2 = cli_now();
        if (tty) fprintf(stderr, "[%d tokens, %.1f tok/s, first token %.2f s]\n", n_gen, n_gen > 1 ? (n_gen - 1) / (t2 - t1) : 0.0, t1 - t0);
        json_array_append_new(messages, json_pack("{s:s,s:s}", "role", "assistant", "content", out_text));
        free(out_text);
    }
    cli_print_spec_stats(e, s);
    json_decref(messages);
    free(logits);
    rc = 0;
done:
    cli_mm_prompt_free(&im);
    q35_sampler_free(sampler);
    q35_detokenizer_free(dt);
    q35_session_free(s);
    q35_tokenizer_free(tok);
    q35_engine_free(e);
    free(default_model);
    return rc;
}
