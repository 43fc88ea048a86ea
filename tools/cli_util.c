/* cli_util.c: helpers shared by the subcommands. */
#include "cli.h"
#include "qwen35.h"

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
