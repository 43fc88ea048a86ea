/* speed.c: `qwen35 speed`, the engine benchmark behind `make bench`.
 *
 * It measures, on one model (normally the synthetic cache with the exact
 * Qwen3.5-9B shapes): decode tok/s per thread count with GB/s and the share
 * of the machine's read bandwidth (q35_read_bandwidth's measurement, the
 * same ceiling bench_kernels uses, taken again right before every decode
 * step: the share is the median of the steps' shares of their own read),
 * prompt tok/s at several lengths, time to first token, the cost of
 * batched decode steps relative to one row, the cost of a speculative
 * verify step and of a draft, the tok/s a given acceptance rate would give
 * (labelled synthetic: random weights reject every draft), the same with
 * reduced-vocabulary draft heads (and the acceptance each would need to
 * match the full head), and peak RSS.
 * It prints a table and writes JSON. Timings are medians of repeats. */
#include "cli.h"
#include "qwen35.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The median over i < n of (num[i] - sub[i]) / den[i] (sub may be NULL; r: n doubles of scratch): a
 * cost from paired timings, each pair taken moments apart, so a change of the host's speed between pairs
 * cancels. */
static double median_ratio(double *r, const double *num, const double *sub, const double *den, int n) {
    for (int i = 0; i < n; i++) r[i] = (num[i] - (sub ? sub[i] : 0.0)) / den[i];
    return median(r, n);
}

/* A "Key: N kB" line of /proc/self/status (0 when absent): VmHWM is the
 * peak resident set since the last reset_peak_rss(), RssAnon and RssFile
 * the resident set now, anonymous and file-backed. */
static long status_kb(const char *key) {
    long kb = 0;
    size_t n = strlen(key);
    FILE *fp = fopen("/proc/self/status", "r");
    if (!fp) return 0;
    char line[256];
    while (fgets(line, sizeof line, fp))
        if (!strncmp(line, key, n) && line[n] == ':') kb = strtol(line + n + 1, NULL, 10);
    fclose(fp);
    return kb;
}

/* The read probe's buffer is not the engine's memory: forget it. */
static void reset_peak_rss(void) {
    FILE *fp = fopen("/proc/self/clear_refs", "w");
    if (fp) { fputs("5", fp); fclose(fp); }
}

static int parse_list(const char *s, int *out, int max) {
    int n = 0;
    while (*s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v <= 0 || v > 1000000) return -1;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return -1;
    }
    return n;
}

static const char usage[] =
    "usage: qwen35 speed -m MODEL [-t 1,2] [--prompt 254,512,2048] [--decode N] [--spec-k K]\n"
    "                    [--accept 0.83] [--draft-rows 16384,32768,65536] [--mmap | --no-mmap]\n"
    "                    [--depth 8192,32768] [--depth-prompt 512] [--kv-cache f32|q8] [--json FILE]\n"
    "  Engine speed: decode and prompt tok/s, GB/s against the read bandwidth measured before each step,\n"
    "  time to first token, batched and speculative step costs, peak RSS.\n"
    "  --depth: also decode and a prompt (--depth-prompt tokens; 0: none) after that many positions of context\n"
    "  (random states, q35_session_fill_random), against depth 0, and the memory a\n"
    "  session takes per 1k positions; at the largest thread count. --kv-cache q8: sessions keep\n"
    "  their attention keys and values in 8 bits (default f32).\n"
    "  --draft-rows: also a speculative step with a reduced-vocabulary draft head of\n"
    "  each many rows (the lowest token ids; default 32768; 0: none).\n"
    "  --mmap / --no-mmap: weights served from the mapped file / read into memory on huge pages\n"
    "  (default: in memory where the system offers huge pages and the memory, else mapped).\n"
    "usage: qwen35 speed --vision [--image-side 448] [-t 1,2] [--tower-dtype bf16|bfp8] [-m CACHE] [--json FILE]\n"
    "  The vision tower's encode time for one square image at Qwen3.5-9B's tower shapes\n"
    "  (synthetic BF16 weights, or their matrices as BFP8; no model needed). With -m, also\n"
    "  the time to first token that the image adds to a short text prompt on that model.\n";

/* Expected tokens per speculative step with k drafts each accepted with
 * probability a (given the previous one was): 1 + a + a^2 + ... + a^k. */
static double tokens_per_step(double a, int k) {
    double expect = 1, ak = 1;
    for (int j = 0; j < k; j++) { ak *= a; expect += ak; }
    return expect;
}

/* A greedy generation in s after the logits of its prompt: speed times its
 * steps, so it never stops before the context is full. */
static q35_generation *timing_gen(q35_session *s, const float *logits, q35_error *err) {
    q35_gen_params p = {.ignore_eos = 1};
    q35_generation *g = NULL;
    q35_gen_out o;
    if (q35_generation_new(s, &p, &g, err) || q35_generation_begin(g, logits, &o, err)) {
        q35_generation_free(g);
        return NULL;
    }
    return g;
}

/* The median seconds of a plain decode step (on the non-speculative session
 * plain), and in decode steps the costs of a verify step (k+1 checkpointed
 * rows with their logits, as a speculative step computes them, rewound), of
 * a whole speculative step (draft + verify) on s with the full draft head
 * (r_step[0]) and with a reduced head of rows[h] rows (the lowest ids;
 * r_step[1 + h]), and of those steps' drafts (the step less the verify:
 * r_draft). All of them are interleaved in one loop, and each cost is the
 * median over the rounds of that round's time over its own decode step, so
 * that a change in the machine's read bandwidth between rounds (other
 * tenants) cancels. Both sessions start over from a short prompt; s needs
 * SPEC_REPS * (1 + (n_rows + 1) * (k + 1)) more positions. */
enum { SPEC_REPS = 8 };
static int time_spec_steps(q35_engine *e, q35_session *s, q35_session *plain, const int32_t *toks, int k, const int *rows,
                           int n_rows, double *t_decode, double *r_verify, double *r_step, double *r_draft,
                           q35_error *err) {
    enum { REPS = SPEC_REPS };
    double d[REPS], v[REPS], w[9][REPS];
    int32_t max_rows = 0;
    for (int h = 0; h < n_rows; h++) max_rows = rows[h] > max_rows ? rows[h] : max_rows;
    int32_t *ids = malloc(sizeof *ids * (size_t)(max_rows ? max_rows : 1));
    float *logits = malloc(sizeof *logits * (size_t)(k + 1) * (size_t)q35_engine_info(e)->vocab_size);
    if (!ids || !logits) { free(ids); free(logits); return -1; }
    for (int32_t i = 0; i < max_rows; i++) ids[i] = i;
    q35_session_reset(s);
    q35_session_reset(plain);
    q35_generation *gs = NULL, *gp = NULL;
    int rc = q35_session_eval(s, toks, 8, logits, 0, err) || !(gs = timing_gen(s, logits, err)) ||
             q35_session_eval(plain, toks, 8, logits, 0, err) || !(gp = timing_gen(plain, logits, err)) ? -1 : 0;
    q35_gen_out o;
    for (int r = 0; r < REPS && !rc; r++) {
        double t0 = cli_now();
        if (q35_generation_step(gp, &o, err)) rc = -1;
        d[r] = cli_now() - t0;
        /* rows the last step left for the MTP are flushed by the next draft, not by the verify; they are
         * dropped here, untimed, so that the verify is what a speculative step's verify computes */
        if (!rc && (q35_session_set_spec(s, 0, err) || q35_session_set_spec(s, k, err))) rc = -1;
        t0 = cli_now();
        if (!rc && (q35_session_eval(s, toks + 20, k + 1, logits, Q35_EVAL_REWINDABLE | Q35_EVAL_ALL_LOGITS, err) ||
                    q35_session_rewind(s, 1, err)))
            rc = -1;
        v[r] = cli_now() - t0;
        for (int h = 0; h <= n_rows && !rc; h++) {
            /* the head is copied outside the timed step */
            if (q35_engine_set_draft_vocab(e, h ? ids : NULL, h ? rows[h - 1] : 0, err)) { rc = -1; break; }
            t0 = cli_now();
            if (q35_generation_step(gs, &o, err)) rc = -1;
            w[h][r] = cli_now() - t0;
        }
    }
    q35_generation_free(gs);
    q35_generation_free(gp);
    if (q35_engine_set_draft_vocab(e, NULL, 0, rc ? NULL : err)) rc = -1;
    free(ids);
    free(logits);
    if (rc) return -1;
    double r[REPS];
    *r_verify = median_ratio(r, v, NULL, d, REPS);
    for (int h = 0; h <= n_rows; h++) {
        r_step[h] = median_ratio(r, w[h], NULL, d, REPS);
        r_draft[h] = median_ratio(r, w[h], v, d, REPS);
    }
    *t_decode = median(d, REPS);
    return 0;
}

/* Decode and prompt speed at context depths: one session per depth (row 0:
 * depth 0), filled with random states to that depth (attention reads d rows
 * of every KV cache, as after a real prompt of d tokens). The sessions take
 * decode steps in turn, one each (0, d1, d2, 0, d1, d2, ...), DEPTH_ROUNDS *
 * n_decode times: decode_vs0 is the median over those turns of depth 0's
 * step time over the depth's, so a change of the host's read bandwidth
 * between turns cancels; decode_tok_s is from the median step. Then, in as
 * many rounds, one prompt of depth_prompt tokens at each depth (refilled
 * first), the best time of each. The memory per 1k positions is the
 * resident growth over the deepest session's fill, before anything runs. */
typedef struct { int depth; double decode_tok_s, decode_vs0, prompt_tok_s; } depth_row;

static int time_depths(q35_engine *e, const int *depths, int n_depths, int n_decode, int depth_prompt,
                       const int32_t *toks, depth_row *out, double *bytes_per_1k, q35_error *err) {
    enum { DEPTH_ROUNDS = 3 };
    const int n_rows = n_depths + 1, per = DEPTH_ROUNDS * n_decode;
    int32_t max_d = 0;
    for (int i = 0; i < n_depths; i++) if (depths[i] > max_d) max_d = depths[i];
    q35_session *ss[9] = {NULL};
    int rc = 0;
    long kb0 = 0, kb1 = 0;
    for (int i = 0; i < n_rows && !rc; i++) {
        const int32_t depth = i ? depths[i - 1] : 0;
        if (q35_session_new(e, depth + (depth_prompt > per ? depth_prompt : per) + 8, &ss[i], err)) { rc = -1; break; }
        const int deepest = depth == max_d && !kb1;
        if (deepest) kb0 = status_kb("RssAnon");
        if (q35_session_fill_random(ss[i], depth, 1, err)) rc = -1;
        if (deepest) kb1 = status_kb("RssAnon");
    }
    *bytes_per_1k = max_d > 0 ? (double)(kb1 - kb0) * 1024.0 / max_d * 1024.0 : 0;
    double *dt = malloc(sizeof(double) * (size_t)(n_rows * per)), *ratio = malloc(sizeof(double) * (size_t)per);
    double *best_prompt = calloc((size_t)n_rows, sizeof(double));
    float *logits = malloc(sizeof(float) * (size_t)q35_engine_info(e)->vocab_size); /* a step reads lm_head too */
    if (!dt || !ratio || !logits || !best_prompt) rc = -1;
    for (int j = 0; j < per && !rc; j++)
        for (int i = 0; i < n_rows && !rc; i++) {
            double t0 = cli_now();
            if (q35_session_eval(ss[i], toks + j % 64, 1, logits, 0, err)) rc = -1;
            dt[i * per + j] = cli_now() - t0;
        }
    for (int round = 0; round < DEPTH_ROUNDS && depth_prompt && !rc; round++)
        for (int i = 0; i < n_rows && !rc; i++) {
            if (q35_session_fill_random(ss[i], i ? depths[i - 1] : 0, 1, err)) { rc = -1; break; }
            double t0 = cli_now();
            if (q35_session_eval(ss[i], toks, depth_prompt, logits, 0, err)) { rc = -1; break; }
            double secs = cli_now() - t0;
            if (!best_prompt[i] || secs < best_prompt[i]) best_prompt[i] = secs;
        }
    for (int i = 0; i < n_rows && !rc; i++) {
        depth_row *r = &out[i];
        r->depth = i ? depths[i - 1] : 0;
        r->decode_vs0 = median_ratio(ratio, dt, NULL, dt + i * per, per);
        r->decode_tok_s = 1.0 / median(dt + i * per, per);
        r->prompt_tok_s = depth_prompt ? depth_prompt / best_prompt[i] : 0;
    }
    for (int i = 0; i < n_rows && !rc; i++)
        fprintf(stderr, "depth %d: decode %.2f tok/s (%.0f%% of depth 0), prompt of %d tokens %.2f tok/s\n", out[i].depth,
                out[i].decode_tok_s, 100.0 * out[i].decode_vs0, depth_prompt, out[i].prompt_tok_s);
    free(best_prompt);
    free(ratio);
    free(dt);
    free(logits);
    for (int i = 0; i < n_rows; i++) q35_session_free(ss[i]);
    return rc;
}

typedef struct { int rows; double step_cost, draft_cost, tok_s, speedup, break_even; } draft_row;

typedef struct { int threads; double tok_s, gb_s, pct, bw; } decode_row;

/* The buffer read beside each decode step: 16 times a 32 MiB L3, 13-25 ms a
 * pass at 20-40 GB/s. */
#define PROBE_BYTES ((size_t)512 << 20)

int cmd_speed(int argc, char **argv) {
    const char *model = NULL, *json_path = NULL, *tower_dtype = NULL;
    int threads[8] = {1, 2}, n_threads = 2, prompts[8] = {254, 512, 2048}, n_prompts = 3, n_decode = 16, spec_k = 1;
    int draft_rows[8] = {32768}, n_draft_rows = 1, depths[8], n_depths = 0, depth_prompt = 512;
    depth_row drow[9];
    double ctx_bytes_per_1k = 0;
    draft_row dr[8] = {{0}};
    int n_dr = 0;
    double accept = 0.83;
    int weights = Q35_WEIGHTS_AUTO, vision = 0, image_side = 448, kv_cache = Q35_KV_F32;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(usage, stdout); return 0; }
        if (!strcmp(k, "--vision")) { vision = 1; continue; }
        if (!strcmp(k, "--no-mmap")) { weights = Q35_WEIGHTS_IN_MEMORY; continue; }
        if (!strcmp(k, "--mmap")) { weights = Q35_WEIGHTS_MAPPED; continue; }
        if (!v) { fprintf(stderr, "qwen35 speed: %s needs a value\n%s", k, usage); return 2; }
        if (!strcmp(k, "-m")) model = v;
        else if (!strcmp(k, "--json")) json_path = v;
        else if (!strcmp(k, "--kv-cache")) { if ((kv_cache = q35_kv_cache_parse(v)) < 0) goto bad; }
        else if (!strcmp(k, "--tower-dtype")) tower_dtype = v;
        else if (!strcmp(k, "--image-side")) { image_side = atoi(v); if (image_side < 32 || image_side % 32 || image_side > 4096) goto bad; }
        else if (!strcmp(k, "-t")) { if ((n_threads = parse_list(v, threads, 8)) <= 0) goto bad; }
        else if (!strcmp(k, "--depth-prompt")) { depth_prompt = atoi(v); if (depth_prompt < 0 || depth_prompt > 8192) goto bad; }
        else if (!strcmp(k, "--depth")) { if ((n_depths = parse_list(v, depths, 8)) <= 0) goto bad; }
        else if (!strcmp(k, "--prompt")) { if ((n_prompts = parse_list(v, prompts, 8)) <= 0) goto bad; }
        else if (!strcmp(k, "--decode")) { n_decode = atoi(v); if (n_decode < 2 || n_decode > 10000) goto bad; }
        else if (!strcmp(k, "--spec-k")) { spec_k = atoi(v); if (spec_k < 0 || spec_k > Q35_SPEC_K_MAX) goto bad; }
        else if (!strcmp(k, "--accept")) { accept = atof(v); if (!(accept >= 0 && accept <= 1)) goto bad; }
        else if (!strcmp(k, "--draft-rows")) {
            if (!strcmp(v, "0")) n_draft_rows = 0;
            else if ((n_draft_rows = parse_list(v, draft_rows, 8)) <= 0) goto bad;
        }
        else { fprintf(stderr, "qwen35 speed: unknown option '%s'\n%s", k, usage); return 2; }
        i++;
        continue;
    bad:
        fprintf(stderr, "qwen35 speed: bad value '%s' for %s\n", v, k);
        return 2;
    }
    if (tower_dtype && !vision) { fprintf(stderr, "qwen35 speed: --tower-dtype goes with --vision\n%s", usage); return 2; }
    if (vision) return cli_speed_vision(threads, n_threads, image_side, json_path, model, tower_dtype);
    if (!model) { fprintf(stderr, "qwen35 speed: -m MODEL is required\n%s", usage); return 2; }

    int max_prompt = n_depths ? depth_prompt : 0; /* time_depths reads that many of the tokens */
    for (int i = 0; i < n_prompts; i++) if (prompts[i] > max_prompt) max_prompt = prompts[i];
    int32_t n_ctx = max_prompt + n_decode + 64;
    int32_t spec_ctx = 8 + SPEC_REPS * (1 + (n_draft_rows + 1) * (spec_k + 1)); /* time_spec_steps */
    if (n_ctx < spec_ctx) n_ctx = spec_ctx;
    q35_error err = {0};
    decode_row rows[8];
    double prompt_tok_s[8] = {0}, ttft_254 = -1, batch_ratio[4] = {0}, verify_ratio = 0, draft_ratio = 0,
           step_spec_s = 0, decode_s = 0, synthetic_tok_s = 0;
    const int batch_sizes[4] = {1, 2, 4, 8};
    long anon_kb = 0, file_kb = 0; /* with one session of the longest prompt live */
    long peak_kb = 0; /* VmHWM before each read probe (reset_peak_rss forgets it after) */
    q35_model_info info = {0};
    const char *kernels = "?";
    int rc = 0;
    uint64_t rng = 88172645463325252ull;

    for (int ti = 0; ti < n_threads && !rc; ti++) {
        q35_engine_params p = {.n_threads = threads[ti], .weights = weights, .kv_cache = kv_cache};
        q35_engine *e;
        if (q35_engine_load(model, &p, &e, &err)) { fprintf(stderr, "qwen35 speed: %s\n", err.msg); return 1; }
        info = *q35_engine_info(e);
        kernels = q35_engine_kernels(e, NULL);
        int last_t = ti == n_threads - 1; /* the fuller measurements run once, at the largest thread count */
        q35_session *s;
        if (q35_session_new(e, n_ctx, &s, &err)) { fprintf(stderr, "qwen35 speed: %s\n", err.msg); q35_engine_free(e); return 1; }
        int n_toks = max_prompt + n_decode + 16 > 64 ? max_prompt + n_decode + 16 : 64; /* the spec steps use 48 */
        int32_t *toks = malloc(sizeof(int32_t) * (size_t)n_toks);
        for (int i = 0; i < n_toks; i++) {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
            toks[i] = (int32_t)(rng % (uint64_t)info.vocab_size);
        }
        /* decode: a short prompt, then single steps */
        float *first = malloc(sizeof(float) * (size_t)info.vocab_size);
        q35_generation *gen = NULL;
        if (!first || q35_session_eval(s, toks, 8, first, 0, &err) || !(gen = timing_gen(s, first, &err))) {
            free(first);
            rc = 1;
            break;
        }
        free(first);
        /* each step right after a read of the probe's buffer on as many threads (best of two passes), and
         * the share of bandwidth the median of the steps' shares of their own read: the host's bandwidth
         * moves within seconds where other tenants share it */
        double *dt = malloc(sizeof(double) * (size_t)n_decode * 3), *bw = dt + n_decode, *share = bw + n_decode;
        q35_read_probe *probe = NULL;
        long hwm = status_kb("VmHWM"); /* the peak so far, which the probe's buffer is not part of */
        if (hwm > peak_kb) peak_kb = hwm;
        if (!strcmp(q35_engine_backend(e), "cuda")) { /* the host's read rate says nothing of a device's step */
            if (ti == 0) fprintf(stderr, "qwen35 speed: the cuda backend: no share of the host's read bandwidth (bench_cuda "
                                         "measures the device's)\n");
        } else if (q35_read_probe_new(threads[ti], PROBE_BYTES, &probe, &err)) {
            fprintf(stderr, "qwen35 speed: %s (no share of bandwidth)\n", err.msg);
            probe = NULL;
        }
        q35_gen_out o;
        for (int i = 0; i < n_decode && !rc; i++) {
            bw[i] = probe ? q35_read_probe_run(probe, 2) : 0;
            double t0 = cli_now();
            if (q35_generation_step(gen, &o, &err)) rc = 1;
            dt[i] = cli_now() - t0;
            share[i] = bw[i] > 0 ? (double)info.bytes_per_token / dt[i] / 1e9 / bw[i] : 0;
        }
        q35_read_probe_free(probe);
        reset_peak_rss();
        q35_generation_free(gen);
        decode_s = median(dt, n_decode);
        rows[ti].threads = threads[ti];
        rows[ti].tok_s = 1.0 / decode_s;
        rows[ti].gb_s = (double)info.bytes_per_token / decode_s / 1e9;
        rows[ti].bw = median(bw, n_decode); /* 0 without the probe, and so is the share */
        rows[ti].pct = 100.0 * median(share, n_decode);
        free(dt);
        fprintf(stderr, "decode, %d thread(s): %.2f tok/s, %.1f GB/s of %.1f GB/s measured (%.0f%%)\n", threads[ti],
                rows[ti].tok_s, rows[ti].gb_s, rows[ti].bw, rows[ti].pct);

        if (last_t && !rc) {
            for (int pi = 0; pi < n_prompts && !rc; pi++) { /* prompt processing from an empty session */
                q35_session_reset(s);
                double t0 = cli_now();
                float *lg = malloc(sizeof(float) * (size_t)info.vocab_size);
                if (q35_session_eval(s, toks, prompts[pi], lg, 0, &err)) rc = 1;
                (void)q35_argmax(lg, info.vocab_size);
                double t = cli_now() - t0;
                free(lg);
                prompt_tok_s[pi] = prompts[pi] / t;
                if (prompts[pi] == 254) ttft_254 = t;
                fprintf(stderr, "prompt %d tokens: %.2f tok/s (%.2f s)\n", prompts[pi], prompt_tok_s[pi], t);
            }
            anon_kb = status_kb("RssAnon");
            file_kb = status_kb("RssFile");
            /* batched decode across sessions: cost of a step of N rows relative to one */
            q35_session *bs[8];
            int nb = 0;
            for (; nb < 8 && !rc; nb++) {
                if (q35_session_new(e, 64, &bs[nb], &err)) { rc = 1; break; }
                if (q35_session_eval(bs[nb], toks + nb, 4, NULL, 0, &err)) { rc = 1; nb++; break; }
            }
            /* rounds of 1, 2, 4 and 8 rows in turn; each cost the median over the rounds of that round's step
             * over its own one-row step, so that a change in the read bandwidth between rounds cancels */
            enum { BATCH_ROUNDS = 7 };
            double bt[4][BATCH_ROUNDS];
            for (int r = 0; r < BATCH_ROUNDS && !rc; r++)
                for (int bi = 0; bi < 4 && !rc; bi++) {
                    double t0 = cli_now();
                    if (q35_batch_decode(bs, toks + 16, batch_sizes[bi], NULL, &err)) rc = 1;
                    bt[bi][r] = cli_now() - t0;
                }
            double br[BATCH_ROUNDS];
            for (int bi = 0; bi < 4 && !rc; bi++) batch_ratio[bi] = median_ratio(br, bt[bi], NULL, bt[0], BATCH_ROUNDS);
            for (int bi = 0; bi < 4 && !rc; bi++)
                fprintf(stderr, "batch decode of %d rows: %.3f s per step (median), %.2fx one row (median of rounds)\n",
                        batch_sizes[bi], median(bt[bi], BATCH_ROUNDS), batch_ratio[bi]);
            for (int i = 0; i < nb; i++) q35_session_free(bs[i]);
            /* speculation: a verify step of k+1 rows, and a whole step with drafting */
            if (!rc && info.has_mtp && spec_k > 0) {
                int head_rows[8];
                for (int di = 0; di < n_draft_rows; di++)
                    head_rows[di] = draft_rows[di] < info.vocab_size ? draft_rows[di] : info.vocab_size;
                q35_session *plain = NULL;
                double t_dec = 0, r_step[9], r_draft[9];
                if (q35_session_new(e, n_ctx, &plain, &err) || q35_session_set_spec(s, spec_k, &err) ||
                    time_spec_steps(e, s, plain, toks, spec_k, head_rows, n_draft_rows, &t_dec, &verify_ratio, r_step,
                                    r_draft, &err))
                    rc = 1;
                q35_session_free(plain);
                if (!rc) {
                    step_spec_s = r_step[0] * t_dec;
                    draft_ratio = r_draft[0];
                    synthetic_tok_s = tokens_per_step(accept, spec_k) / step_spec_s;
                    fprintf(stderr, "speculation k=%d: decode step %.3f s; step %.2fx a decode step (verify %.2fx, drafting "
                            "%.2fx); SYNTHETIC acceptance %.2f -> %.2f tok/s (%.2fx plain decode)\n", spec_k, t_dec,
                            step_spec_s / t_dec, verify_ratio, draft_ratio, accept, synthetic_tok_s, synthetic_tok_s * t_dec);
                }
                /* reduced-vocabulary draft heads: the same verify step, a draft that reads fewer rows */
                for (int di = 0; di < n_draft_rows && !rc; di++) {
                    draft_row *d = &dr[n_dr++];
                    d->rows = head_rows[di];
                    /* the whole step is the robust figure; its split into verify and draft is a difference of
                     * two times, which the machine's noise can even make negative */
                    d->step_cost = r_step[1 + di];
                    d->draft_cost = r_draft[1 + di];
                    double t = d->step_cost; /* in decode steps */
                    d->speedup = tokens_per_step(accept, spec_k) / t;
                    d->tok_s = d->speedup / t_dec;
                    /* the acceptance at which this head only matches the full one */
                    double want = tokens_per_step(accept, spec_k) * t / (step_spec_s / t_dec), lo = 0, hi = 1;
                    for (int it = 0; it < 50; it++) {
                        double mid = 0.5 * (lo + hi);
                        if (tokens_per_step(mid, spec_k) < want) lo = mid; else hi = mid;
                    }
                    d->break_even = want <= 1 ? 0 : want > tokens_per_step(1, spec_k) ? 1 : hi;
                    fprintf(stderr, "speculation k=%d, draft head of %d rows: step %.2fx a decode step (drafting %.2fx); "
                            "SYNTHETIC acceptance %.2f -> %.2f tok/s (%.2fx plain decode); it matches the full head at "
                            "acceptance %.3f\n", spec_k, d->rows, d->step_cost, d->draft_cost, accept, d->tok_s, d->speedup,
                            d->break_even);
                }
            }
        }
        if (last_t && !rc && n_depths) {
            q35_session_free(s); /* its memory is not the depth session's */
            s = NULL;
            if (time_depths(e, depths, n_depths, n_decode, depth_prompt, toks, drow, &ctx_bytes_per_1k, &err)) rc = 1;
        }
        free(toks);
        q35_session_free(s);
        q35_engine_free(e);
        if (rc) fprintf(stderr, "qwen35 speed: %s\n", err.msg);
    }
    if (rc) return 1;

    char cpu[256] = "unknown";
    FILE *ci = fopen("/proc/cpuinfo", "r");
    if (ci) {
        char line[512];
        while (fgets(line, sizeof line, ci))
            if (!strncmp(line, "model name", 10)) {
                char *c = strchr(line, ':');
                if (c) { snprintf(cpu, sizeof cpu, "%s", c + 2); cpu[strcspn(cpu, "\n")] = 0; }
                break;
            }
        fclose(ci);
    }
    long rss = status_kb("VmHWM");
    if (peak_kb > rss) rss = peak_kb;
    printf("\nqwen35 speed: %s\n", model);
    printf("machine: %s, %ld cores, %s kernels; bytes per token %.2f GB; peak RSS %.2f GB; KV cache %s "
           "(%.1f KiB per position)\n", cpu, sysconf(_SC_NPROCESSORS_ONLN), kernels, info.bytes_per_token / 1e9,
           rss / 1048576.0, q35_kv_cache_name(info.kv_cache), info.kv_bytes_per_pos / 1024.0);
    printf("%-10s %10s %10s %12s %8s\n", "threads", "tok/s", "GB/s", "measured BW", "% BW");
    for (int i = 0; i < n_threads; i++)
        printf("%-10d %10.2f %10.1f %12.1f %7.0f%%\n", rows[i].threads, rows[i].tok_s, rows[i].gb_s, rows[i].bw, rows[i].pct);
    for (int i = 0; i < n_prompts; i++) printf("prompt %-5d %8.2f tok/s\n", prompts[i], prompt_tok_s[i]);
    if (ttft_254 >= 0) printf("time to first token at 254: %.2f s\n", ttft_254);
    /* the weights are resident as file pages (mapped) or as the anonymous copy (in memory); the rest is the
     * engine's own memory: KV cache and recurrent states for one context, scratch, logits */
    double weights_gb = info.weights_copied ? info.file_bytes / 1e9 : file_kb * 1024 / 1e9;
    double other_gb = (anon_kb * 1024 - (info.weights_copied ? info.file_bytes : 0)) / 1e9;
    printf("memory: weight files %.2f GB (%s), resident %.2f GB; engine memory %.2f GB (one %d-token session)\n",
           info.file_bytes / 1e9, info.weights_copied ? "copied into memory" : "mapped", weights_gb, other_gb, n_ctx);
    printf("batch cost N=1,2,4,8: %.2f %.2f %.2f %.2f\n", batch_ratio[0], batch_ratio[1], batch_ratio[2], batch_ratio[3]);
    if (synthetic_tok_s > 0)
        printf("spec k=%d: step %.2fx (verify %.2fx, draft %.2fx) of a decode step; %.2f tok/s at SYNTHETIC acceptance %.2f\n",
               spec_k, verify_ratio + draft_ratio, verify_ratio, draft_ratio, synthetic_tok_s, accept);
    for (int i = 0; i < n_dr; i++)
        printf("  draft head %6d rows: step %.2fx (draft %.2fx); %.2f tok/s at the same acceptance (%.2fx decode); "
               "break-even acceptance %.3f\n", dr[i].rows, dr[i].step_cost, dr[i].draft_cost, dr[i].tok_s, dr[i].speedup,
               dr[i].break_even);
    for (int i = 0; n_depths && i <= n_depths; i++)
        printf("depth %-6d decode %6.2f tok/s (%3.0f%% of depth 0), prompt %d %6.2f tok/s\n", drow[i].depth,
               drow[i].decode_tok_s, 100.0 * drow[i].decode_vs0, depth_prompt, drow[i].prompt_tok_s);
    if (n_depths) printf("context memory: %.1f MiB per 1k positions\n", ctx_bytes_per_1k / 1048576.0);

    if (json_path) {
        FILE *fp = fopen(json_path, "w");
        if (!fp) { fprintf(stderr, "qwen35 speed: cannot write %s: %s\n", json_path, strerror(errno)); return 1; }
        fprintf(fp, "{\n  \"schema\": \"qwen35-speed/1\",\n  \"model\": \"%s\",\n  \"cpu\": \"%s\",\n  \"cores\": %ld,\n  \"kernels\": \"%s\",\n",
                model, cpu, sysconf(_SC_NPROCESSORS_ONLN), kernels);
        fprintf(fp, "  \"bytes_per_token\": %lld,\n  \"peak_rss_bytes\": %lld,\n", (long long)info.bytes_per_token,
                (long long)rss * 1024);
        fprintf(fp, "  \"kv_cache\": \"%s\",\n  \"kv_bytes_per_position\": %lld,\n", q35_kv_cache_name(info.kv_cache),
                (long long)info.kv_bytes_per_pos);
        fprintf(fp, "  \"weight_file_bytes\": %lld,\n  \"weights_copied\": %s,\n  \"engine_memory_bytes\": %lld,\n  \"decode\": [",
                (long long)info.file_bytes, info.weights_copied ? "true" : "false",
                (long long)(anon_kb * 1024 - (info.weights_copied ? info.file_bytes : 0)));
        for (int i = 0; i < n_threads; i++)
            fprintf(fp, "%s\n    {\"threads\": %d, \"tok_s\": %.4f, \"gb_s\": %.3f, \"measured_bw_gb_s\": %.3f, \"pct_bw\": %.2f}",
                    i ? "," : "", rows[i].threads, rows[i].tok_s, rows[i].gb_s, rows[i].bw, rows[i].pct);
        fprintf(fp, "\n  ],\n  \"prompt\": [");
        for (int i = 0; i < n_prompts; i++)
            fprintf(fp, "%s{\"tokens\": %d, \"tok_s\": %.4f}", i ? ", " : "", prompts[i], prompt_tok_s[i]);
        fprintf(fp, "],\n  \"ttft_254_s\": %.4f,\n  \"batch_cost\": {\"1\": %.4f, \"2\": %.4f, \"4\": %.4f, \"8\": %.4f},\n",
                ttft_254, batch_ratio[0], batch_ratio[1], batch_ratio[2], batch_ratio[3]);
        fprintf(fp, "  \"spec\": {\"k\": %d, \"step_cost\": %.4f, \"verify_cost\": %.4f, \"draft_cost\": %.4f, "
                "\"synthetic_acceptance\": %.3f, \"synthetic_tok_s\": %.4f, \"draft_heads\": [", spec_k,
                verify_ratio + draft_ratio, verify_ratio, draft_ratio, accept, synthetic_tok_s);
        for (int i = 0; i < n_dr; i++)
            fprintf(fp, "%s\n    {\"rows\": %d, \"step_cost\": %.4f, \"draft_cost\": %.4f, \"synthetic_tok_s\": %.4f, "
                    "\"speedup\": %.4f, \"break_even_acceptance\": %.4f}", i ? "," : "", dr[i].rows, dr[i].step_cost,
                    dr[i].draft_cost, dr[i].tok_s, dr[i].speedup, dr[i].break_even);
        fprintf(fp, "%s]},\n  \"context_bytes_per_1k\": %.0f,\n  \"depth\": [", n_dr ? "\n  " : "", ctx_bytes_per_1k);
        for (int i = 0; n_depths && i <= n_depths; i++)
            fprintf(fp, "%s\n    {\"depth\": %d, \"decode_tok_s\": %.4f, \"decode_vs_depth0\": %.4f, \"prompt_tokens\": %d, "
                    "\"prompt_tok_s\": %.4f}", i ? "," : "", drow[i].depth, drow[i].decode_tok_s,
                    drow[i].decode_vs0, depth_prompt, drow[i].prompt_tok_s);
        fprintf(fp, "%s]\n}\n", n_depths ? "\n  " : "");
        if (fclose(fp)) { fprintf(stderr, "qwen35 speed: cannot write %s\n", json_path); return 1; }
        printf("wrote %s\n", json_path);
    }
    return 0;
}
