/* cli_util.c: helpers shared by the subcommands. */
#include "cli.h"
#include "qwen35.h"
#include "base/util.h"

#include <jansson.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define DEMO_MODEL "models/qwen35-demo"

/* The embedded default model: $QWEN35_MODEL, else models/qwen35-demo of the
 * source tree the binary was built in (build/qwen35 -> ../models), else the
 * same path relative to the working directory. */
char *cli_default_model(void) {
    const char *env = getenv("QWEN35_MODEL");
    if (env && *env) return strdup(env);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = 0;
        char *slash = strrchr(exe, '/');
        if (slash) {
            *slash = 0;
            char path[PATH_MAX + 64];
            snprintf(path, sizeof path, "%s/../%s", exe, DEMO_MODEL);
            struct stat st;
            if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) return strdup(path);
        }
    }
    return strdup(DEMO_MODEL);
}

int cli_set_draft_vocab(q35_engine *e, const char *path, const char *prog) {
    q35_error err = {0};
    if (q35_engine_set_draft_vocab_file(e, path, &err)) {
        fprintf(stderr, "%s: --draft-vocab: %s\n", prog, err.msg);
        return -1;
    }
    return 0;
}

int cli_chat_end_ids(const q35_tokenizer *tok, int32_t n_vocab, int32_t *ids) {
    static const char *const ends[] = {"<|im_end|>", "<|endoftext|>"};
    int n = 0;
    for (int i = 0; tok && i < 2; i++) {
        int32_t id = q35_token_id(tok, ends[i], strlen(ends[i]));
        if (id >= 0 && id < n_vocab) ids[n++] = id;
    }
    return n;
}

int cli_chat_variant(const char *dir, const char *who) {
    int v;
    char path[1024], hex[65];
    q35_error err = {0};
    if (q35_chat_identify(dir, &v, path, sizeof path, hex, &err)) {
        fprintf(stderr, "%s: %s\n", who, err.msg);
        v = -1;
    }
    if (v == -1) fprintf(stderr, "%s: unknown chat template %s (SHA-256 %s): rendering Qwen3.5-9B's\n", who, path, hex);
    return v < 0 ? Q35_CHAT_QWEN35_9B : v;
}

double cli_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void cli_print_spec_stats(const q35_engine *e, const q35_session *s) {
    int32_t k = q35_session_spec_k(s);
    if (k <= 0) return;
    q35_spec_stats st = q35_session_spec_stats(s);
    fprintf(stderr, "speculation: k=%d, draft head %d of %d rows, %lld steps, %lld drafts, %lld accepted "
            "(acceptance %.1f%%, mean acceptance length %.2f tokens per step)\n", k, q35_engine_draft_vocab(e),
            q35_engine_info(e)->vocab_size, (long long)st.steps, (long long)st.drafts, (long long)st.accepted,
            st.drafts ? 100.0 * (double)st.accepted / (double)st.drafts : 0.0,
            st.steps ? 1.0 + (double)st.accepted / (double)st.steps : 0.0);
    if (k > 1) {
        fprintf(stderr, "speculation: accepted by draft position:");
        for (int32_t j = 0; j < k; j++) fprintf(stderr, " %lld", (long long)st.accepted_at[j]);
        fprintf(stderr, " (of %lld steps)\n", (long long)st.steps);
    }
}

static int thinking_of(const json_t *v) { return json_is_true(v) ? 1 : json_is_false(v) ? -1 : 0; }

char *cli_render_chat(const char *path, int variant, const char *prog) {
    json_error_t je;
    json_t *req = json_load_file(path, 0, &je);
    if (!req) {
        fprintf(stderr, "%s: %s: %s (line %d)\n", prog, path, je.text, je.line);
        return NULL;
    }
    json_t *messages = json_is_array(req) ? req : json_object_get(req, "messages");
    json_t *tools = json_is_object(req) ? json_object_get(req, "tools") : NULL;
    json_t *kwargs = json_is_object(req) ? json_object_get(req, "chat_template_kwargs") : NULL;
    q35_chat_options opt = {.add_generation_prompt = 1, .variant = variant};
    if (json_is_object(req)) {
        json_t *agp = json_object_get(req, "add_generation_prompt");
        if (agp) opt.add_generation_prompt = json_is_true(agp);
        opt.enable_thinking = thinking_of(json_object_get(req, "enable_thinking"));
    }
    if (kwargs) opt.enable_thinking = thinking_of(json_object_get(kwargs, "enable_thinking"));
    char *m = messages ? json_dumps(messages, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *t = tools ? json_dumps(tools, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
    char *text = NULL;
    q35_error err = {0};
    if (!m) fprintf(stderr, "%s: %s: no \"messages\"\n", prog, path);
    else if (q35_chat_render(m, t, &opt, &text, &err) != Q35_OK) fprintf(stderr, "%s: %s: %s\n", prog, path, err.msg);
    free(m);
    free(t);
    json_decref(req);
    return text;
}

q35_status cli_tokenize_file(const char *path, const char *dir, int32_t **ids, size_t *n, q35_error *err) {
    char *text = NULL;
    size_t len = 0;
    q35_tokenizer *tok = NULL;
    *ids = NULL;
    *n = 0;
    q35_status st = q35_read_file(path, &text, &len, err);
    if (!st) st = q35_tokenizer_load(dir, &tok, err);
    if (!st) st = q35_tokenize(tok, text, len, 0, ids, n, err);
    q35_tokenizer_free(tok);
    free(text);
    return st;
}
