/* bench_sampler.c: what choosing a token costs at the Qwen3.5 vocabulary
 * (248,320 logits), one thread: greedy, temperature alone, top-p, min-p,
 * top-k with top-p (Qwen3.5's generation defaults), the distribution that
 * speculative sampling takes per verified row, and the top-5 logprobs. Two
 * rows: logits spread like a language model's (normal, sd 2.5, a few tokens
 * 16-22 above, which hold nearly all the mass) and a flat one (uniform over 20, peaks every 5,000 ids),
 * where top-p keeps many candidates. The least time of --reps calls each.
 *
 * Usage: bench_sampler [--reps N] [--decode-ms MS] [--json FILE]
 * With --decode-ms, each figure's share of a decode step too. */
#include "qwen35.h"
#include "base/util.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define V 248320

static _Noreturn void die(const char *what) {
    fprintf(stderr, "bench_sampler: %s\n", what);
    exit(1);
}

typedef struct {
    const char *name;
    float temperature, top_p, min_p;
    int32_t top_k;
    int what; /* 0 draw, 1 distribution, 2 logprobs */
} config;

static const config CONFIGS[] = {
    {"greedy", 0.0f, 1.0f, 0.0f, 0, 0},
    {"temperature 1", 1.0f, 1.0f, 0.0f, 0, 0},
    {"top-p 0.95", 0.7f, 0.95f, 0.0f, 0, 0},
    {"min-p 0.05", 0.7f, 1.0f, 0.05f, 0, 0},
    {"top-k 20, top-p 0.95", 0.6f, 0.95f, 0.0f, 20, 0},
    {"distribution, temperature 1", 1.0f, 1.0f, 0.0f, 0, 1},
    {"distribution, top-k 20, top-p 0.95", 0.6f, 0.95f, 0.0f, 20, 1},
    {"logprobs, top 5", 1.0f, 1.0f, 0.0f, 0, 2},
};

/* normal(0, 1) from a 64-bit LCG, Box-Muller */
static double gauss(uint64_t *x) {
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    const double u = ((double)(*x >> 11) + 0.5) * 0x1.0p-53;
    *x = *x * 6364136223846793005ull + 1442695040888963407ull;
    const double v = (double)(*x >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u)) * cos(2.0 * 3.14159265358979323846 * v);
}

static double best_ms(const config *c, const float *row, float *work, int reps) {
    q35_sampler_params p = {.temperature = c->temperature, .top_k = c->top_k, .top_p = c->top_p,
                            .min_p = c->min_p, .repetition_penalty = 1.0f, .seed = 1};
    q35_sampler *s = NULL;
    q35_error err;
    if (q35_sampler_new(&p, V, &s, &err)) die(err.msg);
    double best = INFINITY;
    volatile int32_t sink = 0;
    for (int r = 0; r < reps; r++) {
        if (c->what == 0) memcpy(work, row, sizeof(float) * V); /* the draw overwrites its row */
        const double t0 = q35_now_seconds();
        if (c->what == 0) sink += q35_sampler_sample(s, work);
        else if (c->what == 1) q35_sampler_probs(s, row, NULL, 0, work);
        else {
            int32_t ids[5];
            float lp[5];
            sink += (int32_t)q35_logprobs(row, V, 7, 5, ids, lp);
        }
        const double t = q35_now_seconds() - t0;
        best = t < best ? t : best;
    }
    (void)sink;
    q35_sampler_free(s);
    return best * 1e3;
}

int main(int argc, char **argv) {
    int reps = 40;
    double decode_ms = 0;
    const char *json_path = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode-ms") && i + 1 < argc) decode_ms = atof(argv[++i]);
        else if (!strcmp(argv[i], "--json") && i + 1 < argc) json_path = argv[++i];
        else die("usage: bench_sampler [--reps N] [--decode-ms MS] [--json FILE]");
    }
    if (reps < 1) reps = 1;
    float *rows[2], *work = malloc(sizeof(float) * V);
    uint64_t x = 12345;
    for (int k = 0; k < 2; k++) {
        rows[k] = malloc(sizeof(float) * V);
        if (!rows[k] || !work) die("out of memory");
    }
    for (int32_t i = 0; i < V; i++) {
        rows[0][i] = (float)(2.5 * gauss(&x)) + (i % 24832 == 11 ? 16.0f + (float)(i / 24832) * 0.6f : 0.0f);
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        rows[1][i] = (float)((double)(x >> 11) * 0x1.0p-53 * 20.0 - 10.0) + (i % 5000 == 0 ? 25.0f : 0.0f);
    }
    static const char *const ROW_NAMES[2] = {"model-like", "flat"};
    json_t *out = json_array();
    printf("sampler, one thread, %d logits, least of %d calls (ms per token%s)\n", V, reps,
           decode_ms > 0 ? "; share of a decode step" : "");
    printf("%-36s %12s %12s\n", "", ROW_NAMES[0], ROW_NAMES[1]);
    for (size_t c = 0; c < sizeof CONFIGS / sizeof *CONFIGS; c++) {
        double ms[2];
        for (int k = 0; k < 2; k++) ms[k] = best_ms(&CONFIGS[c], rows[k], work, reps);
        printf("%-36s %9.3f ms %9.3f ms", CONFIGS[c].name, ms[0], ms[1]);
        if (decode_ms > 0) printf("   %.2f%% / %.2f%%", 100 * ms[0] / decode_ms, 100 * ms[1] / decode_ms);
        printf("\n");
        json_t *o = json_pack("{s:s, s:f, s:f}", "config", CONFIGS[c].name, "model_like_ms", ms[0], "flat_ms", ms[1]);
        if (decode_ms > 0) json_object_set_new(o, "model_like_share_of_decode", json_real(ms[0] / decode_ms));
        json_array_append_new(out, o);
    }
    if (json_path && json_dump_file(out, json_path, JSON_INDENT(2)) != 0) die("cannot write the JSON file");
    json_decref(out);
    free(rows[0]), free(rows[1]), free(work);
    return 0;
}
