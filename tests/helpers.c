/* helpers.c: see helpers.h. */
#include "helpers.h"
#include "test.h"
#include "base/util.h"

#include <stdio.h>
#include <string.h>

char *test_slurp(const char *path, size_t *len) {
    char *buf = NULL;
    return q35_read_file(path, &buf, len, NULL) ? NULL : buf;
}

int test_spit(const char *path, const void *data, size_t len) {
    FILE *fp = fopen(path, "wb");
    if (!fp) return -1;
    size_t w = fwrite(data, 1, len, fp);
    return (fclose(fp) == 0 && w == len) ? 0 : -1;
}

q35_status test_try_load(const char *dir, q35_error *err) {
    q35_engine *e = NULL;
    memset(err, 0, sizeof *err);
    q35_status st = q35_engine_load(dir, NULL, &e, err);
    q35_engine_free(e);
    return st;
}

int32_t oracle_hook(void *ctx, int32_t pos, int32_t proposed) {
    oracle *o = ctx;
    int32_t i = pos - o->base;
    if (i < 0 || i >= o->n) return proposed;
    return (((uint32_t)pos * 2654435761u) >> 28) % 3 == 0 ? (o->seq[i] + 1) % 7 : o->seq[i];
}

q35_generation *test_gen_after(q35_session *s, q35_sampler *sm, int32_t last) {
    q35_gen_params p = {.sampler = sm, .ignore_eos = 1};
    q35_generation *g = NULL;
    q35_gen_out o;
    q35_error err = {0};
    if (q35_generation_new(s, &p, &g, &err) || q35_generation_begin_with(g, last, &o, &err)) {
        q35_test_fail(__FILE__, __LINE__, "generation: %s", err.msg);
        q35_generation_free(g);
        return NULL;
    }
    return g;
}

int32_t test_gen_step(q35_generation *g, int32_t *out) {
    q35_gen_out o;
    q35_error err = {0};
    if (!g || q35_generation_step(g, &o, &err)) {
        q35_test_fail(__FILE__, __LINE__, "step: %s", g ? err.msg : "no generation");
        return -1;
    }
    memcpy(out, o.tokens, sizeof(int32_t) * (size_t)o.n_tokens);
    return o.n_tokens;
}

int32_t test_greedy_tokens(q35_session *s, const float *logits, int32_t n, int32_t *out) {
    q35_gen_params p = {.ignore_eos = 1}; /* no max_tokens: every step drafts in full, the excess is dropped */
    q35_generation *g = NULL;
    q35_gen_out o;
    q35_error err = {0};
    int32_t got = 0;
    q35_status st = q35_generation_new(s, &p, &g, &err);
    if (!st) st = q35_generation_begin(g, logits, &o, &err);
    while (!st) {
        for (int32_t i = 0; i < o.n_tokens && got < n; i++) out[got++] = o.tokens[i];
        if (o.stop || got == n) break;
        st = q35_generation_step(g, &o, &err);
    }
    q35_generation_free(g);
    if (st) { q35_test_fail(__FILE__, __LINE__, "generation: %s", err.msg); return -1; }
    return got;
}

int test_twin_sessions(q35_engine *e, int32_t n_ctx, int32_t k, const int32_t *tokens, int32_t n,
                       q35_session **spec, q35_session **plain) {
    q35_error err = {0};
    *spec = *plain = NULL;
    if (q35_session_new(e, n_ctx, spec, &err) || q35_session_new(e, n_ctx, plain, &err) ||
        q35_session_set_spec(*spec, k, &err) || q35_session_eval(*spec, tokens, n, NULL, 0, &err) ||
        q35_session_eval(*plain, tokens, n, NULL, 0, &err)) {
        q35_test_fail(__FILE__, __LINE__, "twin sessions: %s", err.msg);
        q35_session_free(*spec);
        q35_session_free(*plain);
        *spec = *plain = NULL;
        return -1;
    }
    return 0;
}
