/* bench_cuda.c: the GPU speed figures of scripts/gpu-check.sh (CUDA=1
 * builds): device copy bandwidth, then on the cuda backend over one weight
 * cache: prompt 254 (time to first token), decode of one sequence (tok/s,
 * GB/s of the bytes one step reads, share of the copy bandwidth), a batch
 * of 8 sequences (aggregate tok/s), and device memory at the peak. Timings
 * are host clocks around calls that end in a synchronizing logits copy;
 * each figure is the median of its repeats, after a warm-up. Then a few
 * decode, batch and prompt passes with Q35_CUDA_PROFILE=1, whose kernel
 * times by pass shape the backend prints to stderr when it closes.
 *
 *   bench_cuda -m CACHE [--json OUT.json] [--decode N] */
#include "backend/cuda/layout.h"
#include "qwen35.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}
static double median(double *v, int n) { qsort(v, (size_t)n, sizeof *v, cmp_d); return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2; }

static void ids_of(int32_t *ids, int32_t n, int32_t vocab, uint32_t seed) {
    for (int32_t i = 0; i < n; i++) { seed = seed * 1664525u + 1013904223u; ids[i] = (int32_t)((seed >> 8) % (uint32_t)vocab); }
}

#define DIE(...) do { fprintf(stderr, "bench_cuda: " __VA_ARGS__); fputc('\n', stderr); return 1; } while (0)

int main(int argc, char **argv) {
    const char *model = NULL, *json = NULL;
    int n_decode = 64;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-m")) model = argv[i + 1];
        else if (!strcmp(argv[i], "--json")) json = argv[i + 1];
        else if (!strcmp(argv[i], "--decode")) n_decode = atoi(argv[i + 1]);
        else DIE("unknown option %s", argv[i]);
    }
    if (!model || n_decode < 4) DIE("usage: bench_cuda -m CACHE [--json OUT] [--decode N >= 4]");
    q35_error err = {0};
    double copy_gbs = 0;
    size_t used0 = 0, used = 0, total = 0, peak = 0;
    if (q35_cuda_copy_bandwidth(&copy_gbs, &err) || q35_cuda_mem_used(&used0, &total, &err)) DIE("%s", err.msg);
    printf("device copy bandwidth: %.0f GB/s (read + write)\n", copy_gbs);
    /* the matmul kernel alone at the 9B's shapes, and the launch rate */
    static const struct { int32_t dt, n_out, n_in; const char *what; } mm[] = {
        {Q35_DT_BFP4, 12288, 4096, "gate/up"}, {Q35_DT_BFP4, 4096, 12288, "down"}, {Q35_DT_BFP4, 8192, 4096, "qkv / q"},
        {Q35_DT_BFP4, 4096, 4096, "z / out / o"}, {Q35_DT_BFP4, 1024, 4096, "k / v"},
        {Q35_DT_BFP8, 248320, 4096, "lm_head"}, {Q35_DT_BF16, 4096, 4096, "bf16"}};
    static const int32_t rows[] = {1, 2, 8};
    char mm_json[4096] = "";
    size_t mj = 0;
    for (size_t i = 0; i < sizeof mm / sizeof mm[0]; i++)
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            double sec = 0;
            size_t by = 0;
            if (q35_cuda_matmul_time(mm[i].dt, mm[i].n_out, mm[i].n_in, rows[r], &sec, &by, &err)) DIE("%s", err.msg);
            printf("matmul %-12s %-5s %6d x %-6d T=%d: %8.1f us, %5.0f GB/s = %5.1f%% of the copy bandwidth\n", mm[i].what,
                   q35_dtype_info((q35_dtype)mm[i].dt)->name, mm[i].n_out, mm[i].n_in, rows[r], sec * 1e6, by / sec / 1e9,
                   100.0 * by / sec / 1e9 / copy_gbs);
            if (mj < sizeof mm_json - 200)
                mj += (size_t)snprintf(mm_json + mj, sizeof mm_json - mj, "%s{\"what\": \"%s\", \"T\": %d, \"us\": %.2f, \"gb_s\": %.1f}",
                                       mj ? ", " : "", mm[i].what, rows[r], sec * 1e6, by / sec / 1e9);
        }
    double launch = 0;
    if (q35_cuda_launch_time(2000, &launch, &err)) DIE("%s", err.msg);
    printf("launch: %.2f us per kernel back to back on one stream\n", launch * 1e6);
    q35_engine_params p = {.backend = "cuda"};
    q35_engine *e = NULL;
    double t0 = q35_now_seconds();
    if (q35_engine_load(model, &p, &e, &err)) DIE("%s", err.msg);
    const double load_s = q35_now_seconds() - t0;
    const q35_model_info *mi = q35_engine_info(e);
    const int32_t V = mi->vocab_size, NP = 254, NB = 8;
    printf("loaded %s on %s (%s) in %.1f s\n", model, q35_engine_backend(e), q35_engine_kernels(e, NULL), load_s);
    float *lg = malloc(sizeof(float) * (size_t)V * NB);
    int32_t *ids = malloc(sizeof(int32_t) * (NP + 1024));
    ids_of(ids, NP + 1024, V, 1);
    q35_session *s = NULL;
    if (!lg || !ids || q35_session_new(e, 4096, &s, &err)) DIE("%s", err.msg ? err.msg : "out of memory");
    /* prompt 254: warm-up, then 3 timed */
    double ttft[3], dec[4096];
    for (int r = -1; r < 3; r++) {
        q35_session_reset(s);
        t0 = q35_now_seconds();
        if (q35_session_eval(s, ids, NP, lg, 0, &err)) DIE("prompt: %s", err.msg);
        if (r >= 0) ttft[r] = q35_now_seconds() - t0;
    }
    /* decode one sequence after the prompt */
    if (n_decode > 4096 - NP - 8) n_decode = 4096 - NP - 8;
    for (int i = 0; i < n_decode; i++) {
        t0 = q35_now_seconds();
        if (q35_session_eval(s, ids + NP + (i % 1024), 1, lg, 0, &err)) DIE("decode: %s", err.msg);
        dec[i] = q35_now_seconds() - t0;
    }
    if (!q35_cuda_mem_used(&used, &total, &err) && used > peak) peak = used;
    const double step = median(dec + 2, n_decode - 2); /* the first two warm up */
    /* a batch of 8 sequences: short prompts, then decode steps together */
    q35_session *b[8] = {0};
    int32_t tok[8];
    for (int i = 0; i < NB; i++) {
        if (q35_session_new(e, 1024, &b[i], &err)) DIE("batch session: %s", err.msg);
        if (q35_session_eval(b[i], ids + 16 * i, 16, NULL, 0, &err)) DIE("batch prompt: %s", err.msg);
        tok[i] = ids[500 + i];
    }
    double bt[64];
    int nb = n_decode < 64 ? n_decode : 64;
    for (int i = 0; i < nb; i++) {
        t0 = q35_now_seconds();
        if (q35_batch_decode(b, tok, NB, lg, &err)) DIE("batch decode: %s", err.msg);
        bt[i] = q35_now_seconds() - t0;
        for (int j = 0; j < NB; j++) tok[j] = q35_argmax(lg + (size_t)j * V, V);
    }
    if (!q35_cuda_mem_used(&used, &total, &err) && used > peak) peak = used;
    const double bstep = median(bt + 2, nb - 2);
    const double tok_s = 1.0 / step, gb_s = (double)mi->bytes_per_token / step / 1e9;
    const double ttft_s = median(ttft, 3);
    printf("decode 1 sequence: %.1f tok/s, %.0f GB/s of %.2f GB per token = %.1f%% of the copy bandwidth\n", tok_s, gb_s,
           (double)mi->bytes_per_token / 1e9, 100.0 * gb_s / copy_gbs);
    printf("prompt %d: TTFT %.1f ms, %.0f tok/s\n", NP, ttft_s * 1e3, NP / ttft_s);
    printf("batch of %d: %.1f tok/s aggregate (%.2fx one sequence)\n", NB, NB / bstep, NB / bstep / tok_s);
    printf("device memory: %.0f MiB in use at the peak (%.0f MiB before load, %.0f MiB total)\n", peak / 1048576.0,
           used0 / 1048576.0, total / 1048576.0);
    if (json) {
        FILE *f = fopen(json, "w");
        if (!f) DIE("cannot write %s", json);
        fprintf(f,
                "{\"model\": \"%s\", \"kernels\": \"%s\", \"load_s\": %.2f, \"copy_gb_s\": %.1f,\n"
                " \"decode_tok_s\": %.2f, \"decode_gb_s\": %.1f, \"bytes_per_token\": %lld, \"bandwidth_share\": %.4f,\n"
                " \"prompt_tokens\": %d, \"ttft_ms\": %.2f, \"prompt_tok_s\": %.1f,\n"
                " \"batch\": %d, \"batch_tok_s\": %.2f, \"batch_speedup\": %.3f,\n"
                " \"peak_device_mib\": %.0f, \"device_total_mib\": %.0f, \"launch_us\": %.2f,\n \"matmul\": [%s]}\n",
                model, q35_engine_kernels(e, NULL), load_s, copy_gbs, tok_s, gb_s, (long long)mi->bytes_per_token,
                gb_s / copy_gbs, NP, ttft_s * 1e3, NP / ttft_s, NB, NB / bstep, NB / bstep / tok_s, peak / 1048576.0,
                total / 1048576.0, launch * 1e6, mm_json);
        fclose(f);
    }
    /* kernel by kernel (Q35_CUDA_PROFILE: no graphs; the table goes to stderr at engine_free) */
    setenv("Q35_CUDA_PROFILE", "1", 1);
    for (int i = 0; i < 8; i++)
        if (q35_session_eval(s, ids + NP + 100 + i, 1, lg, 0, &err)) DIE("profiled decode: %s", err.msg);
    for (int i = 0; i < 4; i++)
        if (q35_batch_decode(b, tok, NB, lg, &err)) DIE("profiled batch: %s", err.msg);
    q35_session_reset(s);
    if (q35_session_eval(s, ids, NP, lg, 0, &err)) DIE("profiled prompt: %s", err.msg);
    unsetenv("Q35_CUDA_PROFILE");
    for (int i = 0; i < NB; i++) q35_session_free(b[i]);
    q35_session_free(s);
    q35_engine_free(e);
    free(lg); free(ids);
    return 0;
}
