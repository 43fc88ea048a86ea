/* eval.c: `qwen35 eval`: the quality of a model (checkpoint or weight
 * cache) on a text or a token sequence, measured rather than assumed.
 *
 * The sequence is cut into windows of --ctx tokens, each evaluated from an
 * empty session; within a window every position but the last predicts the
 * next token. Reported: perplexity exp(mean NLL); with --kld-base, the same
 * windows through the base model give the mean KL(base || model) per
 * position and how often both models' top-1 tokens agree. Logits are
 * computed in slices of 64 rows, so memory does not grow with the text. */
#include "cli.h"
#include "eval.h"
#include "qwen35.h"
#include "base/util.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char eval_usage[] =
    "usage: qwen35 eval -m MODEL (--text FILE [--tokenizer DIR] | --ids FILE) [--kld-base BASE_MODEL]\n"
    "                   [--ctx N] [-t THREADS] [--kv-cache f32|q8] [--json] [--sweep DTYPE [--group tensor|kind|layer]]\n"
    "  Perplexity of MODEL (a checkpoint or a weight cache) on a text, tokenized with the\n"
    "  tokenizer in DIR (default: MODEL's directory), or on token ids (integers separated\n"
    "  by commas or white space). With --kld-base, also the mean KL divergence from\n"
    "  BASE_MODEL's next-token distribution and the top-1 agreement.\n"
    "  --ctx N: window length in tokens (default 512).\n"
    "  --kv-cache q8: MODEL's sessions keep attention keys and values in 8 bits (BASE_MODEL's stay f32).\n"
    "  --sweep DTYPE (bf16, bfp8, bfp4; needs --kld-base): each matrix of MODEL in turn (or each\n"
    "  group: --group kind, the same matrix in every layer; --group layer, one layer's matrices)\n"
    "  stored as DTYPE, encoded from BASE_MODEL's weights as prepare --set does, the rest as\n"
    "  MODEL has it: the mean KL and bytes per token of each, one loaded model throughout.\n"
    "  --calibrate TEXT (with --sweep): block formats coded with GPTQ on BASE_MODEL's inputs\n"
    "  while it reads TEXT in windows of --calib-ctx tokens (default 512), as prepare --calibrate\n"
    "  (every input's sums at once: the memory of prepare --calibrate without --calib-layers).\n";

/* The text of `path` as token ids, with the tokenizer in `dir`. */
static int tokenize_file(const char *path, const char *dir, int32_t **out, int32_t *n_out) {
    q35_error err = {0};
    size_t n = 0;
    if (cli_tokenize_file(path, dir, out, &n, &err)) {
        fprintf(stderr, "qwen35 eval: %s\n", err.msg);
        return -1;
    }
    if (n < 2 || n > INT32_MAX) {
        fprintf(stderr, "qwen35 eval: %s: %zu tokens (at least 2 needed)\n", path, n);
        free(*out);
        return -1;
    }
    *n_out = (int32_t)n;
    return 0;
}

static int read_ids(const char *path, int32_t **out, int32_t *n_out) {
    FILE *fp = fopen(path, "r");
    if (!fp) { fprintf(stderr, "qwen35 eval: %s: %s\n", path, strerror(errno)); return -1; }
    size_t cap = 1024, n = 0;
    int32_t *v = malloc(cap * sizeof *v);
    int c, rc = 0;
    long long cur = -1;
    while (v && (c = fgetc(fp)) != EOF) {
        if (c >= '0' && c <= '9') {
            cur = (cur < 0 ? 0 : cur) * 10 + (c - '0');
            if (cur > INT32_MAX) { rc = -1; break; }
        } else if (c == ',' || c == ' ' || c == '\n' || c == '\t' || c == '\r') {
            if (cur >= 0) {
                if (n == cap) { cap *= 2; int32_t *nv = realloc(v, cap * sizeof *v); if (!nv) { rc = -1; break; } v = nv; }
                v[n++] = (int32_t)cur;
                cur = -1;
            }
        } else { rc = -1; break; }
    }
    if (!rc && cur >= 0) {
        if (n == cap) { int32_t *nv = realloc(v, (cap + 1) * sizeof *v); if (nv) v = nv; else rc = -1; }
        if (!rc) v[n++] = (int32_t)cur;
    }
    fclose(fp);
    if (rc || !v || n < 2) {
        fprintf(stderr, "qwen35 eval: %s: %s\n", path, rc || !v ? "not a list of token ids" : "needs at least 2 token ids");
        free(v);
        return -1;
    }
    *out = v;
    *n_out = (int32_t)n;
    return 0;
}

/* log-softmax of one row into out; returns the argmax. */
static int32_t log_softmax(const float *x, int32_t V, double *out) {
    int32_t best = 0;
    for (int32_t i = 1; i < V; i++) if (x[i] > x[best]) best = i;
    double m = x[best], s = 0;
    for (int32_t i = 0; i < V; i++) s += exp((double)x[i] - m);
    double lse = m + log(s);
    for (int32_t i = 0; i < V; i++) out[i] = (double)x[i] - lse;
    return best;
}

int eval_open(const char *path, long threads, int32_t kv_cache, int32_t ctx, eval_model *m) {
    q35_error err = {0};
    q35_engine_params p = {.n_threads = (int32_t)threads, .kv_cache = kv_cache};
    if (q35_engine_load(path, &p, &m->e, &err) || q35_session_new(m->e, ctx, &m->s, &err)) {
        fprintf(stderr, "qwen35 eval: %s\n", err.msg);
        return -1;
    }
    m->logits = malloc((size_t)EVAL_SLICE * (size_t)q35_engine_info(m->e)->vocab_size * sizeof(float));
    return m->logits ? 0 : -1;
}

void eval_close(eval_model *m) {
    free(m->logits);
    q35_session_free(m->s);
    q35_engine_free(m->e);
}

int eval_windows(eval_model *m, eval_model *b, const int32_t *ids, int32_t n, int32_t win, eval_stats *out) {
    int32_t V = q35_engine_info(m->e)->vocab_size;
    double *lp = malloc((size_t)V * sizeof(double)), *lq = malloc((size_t)V * sizeof(double));
    eval_stats st = {0};
    q35_error err = {0};
    int rc = lp && lq ? 0 : 1;
    if (rc) fprintf(stderr, "qwen35 eval: out of memory\n");
    for (int32_t w0 = 0; !rc && w0 + 1 < n; w0 += win) {
        int32_t len = n - w0 < win ? n - w0 : win;
        q35_session_reset(m->s);
        if (b) q35_session_reset(b->s);
        for (int32_t s0 = 0; !rc && s0 < len; s0 += EVAL_SLICE) {
            int32_t k = len - s0 < EVAL_SLICE ? len - s0 : EVAL_SLICE;
            const int32_t *tok = ids + w0 + s0;
            if (q35_session_eval(m->s, tok, k, m->logits, Q35_EVAL_ALL_LOGITS, &err) ||
                (b && q35_session_eval(b->s, tok, k, b->logits, Q35_EVAL_ALL_LOGITS, &err))) {
                fprintf(stderr, "qwen35 eval: %s\n", err.msg);
                rc = 1;
                break;
            }
            for (int32_t r = 0; r < k && s0 + r + 1 < len; r++) {
                int32_t next = tok[r + 1];
                int32_t top_q = log_softmax(m->logits + (size_t)r * V, V, lq);
                st.nll -= lq[next];
                if (b) {
                    int32_t top_p = log_softmax(b->logits + (size_t)r * V, V, lp);
                    st.nll_base -= lp[next];
                    double kl = 0;
                    for (int32_t i = 0; i < V; i++) kl += exp(lp[i]) * (lp[i] - lq[i]);
                    st.kld += kl;
                    if (kl > st.kld_max) st.kld_max = kl;
                    st.agree += top_p == top_q;
                }
                st.scored++;
            }
        }
    }
    free(lp);
    free(lq);
    *out = st;
    return rc;
}

int cmd_eval(int argc, char **argv) {
    const char *model_path = NULL, *ids_path = NULL, *base_path = NULL, *text_path = NULL, *tok_dir = NULL;
    long ctx = 512, threads = 0;
    int32_t kv_cache = Q35_KV_F32;
    const char *sweep = NULL, *group = "tensor", *calib_path = NULL;
    long calib_ctx = 512;
    int json = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(eval_usage, stdout); return 0; }
        if (!strcmp(k, "--json")) { json = 1; continue; }
        if (!v) { fprintf(stderr, "qwen35 eval: option %s needs a value\n%s", k, eval_usage); return 2; }
        char *end;
        if (!strcmp(k, "-m") || !strcmp(k, "--model")) model_path = v;
        else if (!strcmp(k, "--ids")) ids_path = v;
        else if (!strcmp(k, "--text")) text_path = v;
        else if (!strcmp(k, "--tokenizer")) tok_dir = v;
        else if (!strcmp(k, "--kv-cache")) {
            if ((kv_cache = q35_kv_cache_parse(v)) < 0) {
                fprintf(stderr, "qwen35 eval: --kv-cache must be f32 or q8 (got '%s')\n", v);
                return 2;
            }
        }
        else if (!strcmp(k, "--kld-base")) base_path = v;
        else if (!strcmp(k, "--sweep")) sweep = v;
        else if (!strcmp(k, "--group")) group = v;
        else if (!strcmp(k, "--calibrate")) calib_path = v;
        else if (!strcmp(k, "--calib-ctx")) {
            calib_ctx = strtol(v, &end, 10);
            if (*end || calib_ctx < 2 || calib_ctx > (1 << 20)) {
                fprintf(stderr, "qwen35 eval: bad --calib-ctx '%s'\n", v);
                return 2;
            }
        }
        else if (!strcmp(k, "--ctx")) {
            ctx = strtol(v, &end, 10);
            if (*end || ctx < 2 || ctx > (1 << 24)) { fprintf(stderr, "qwen35 eval: bad --ctx '%s'\n", v); return 2; }
        } else if (!strcmp(k, "-t") || !strcmp(k, "--threads")) {
            threads = strtol(v, &end, 10);
            if (*end || threads < 0 || threads > 1024) { fprintf(stderr, "qwen35 eval: bad -t '%s'\n", v); return 2; }
        } else { fprintf(stderr, "qwen35 eval: unknown option '%s'\n%s", k, eval_usage); return 2; }
        i++;
    }
    if (!model_path || !ids_path == !text_path) {
        fprintf(stderr, "qwen35 eval: need -m and one of --text or --ids\n%s", eval_usage);
        return 2;
    }
    if (sweep && (!base_path || (strcmp(sweep, "bf16") && strcmp(sweep, "bfp8") && strcmp(sweep, "bfp4")))) {
        fprintf(stderr, "qwen35 eval: --sweep needs a dtype (bf16, bfp8 or bfp4) and --kld-base\n%s", eval_usage);
        return 2;
    }
    if (!calib_path && calib_ctx != 512) {
        fprintf(stderr, "qwen35 eval: --calib-ctx goes with --calibrate\n%s", eval_usage);
        return 2;
    }
    if (calib_path && !sweep) {
        fprintf(stderr, "qwen35 eval: --calibrate goes with --sweep\n%s", eval_usage);
        return 2;
    }
    if (strcmp(group, "tensor") && strcmp(group, "kind") && strcmp(group, "layer")) {
        fprintf(stderr, "qwen35 eval: bad --group '%s' (tensor, kind or layer)\n%s", group, eval_usage);
        return 2;
    }
    int32_t *ids, n;
    if (ids_path ? read_ids(ids_path, &ids, &n) : tokenize_file(text_path, tok_dir ? tok_dir : model_path, &ids, &n))
        return 2;
    int32_t win = (int32_t)(ctx < n ? ctx : n);
    eval_model m = {0}, b = {0};
    int rc = 0;
    if (eval_open(model_path, threads, kv_cache, win, &m) ||
        (base_path && eval_open(base_path, threads, Q35_KV_F32, win, &b)))
        rc = 1;
    int32_t V = rc ? 0 : q35_engine_info(m.e)->vocab_size;
    if (!rc && base_path && q35_engine_info(b.e)->vocab_size != V) {
        fprintf(stderr, "qwen35 eval: %s has %d logits per position, %s has %d\n", model_path, V, base_path,
                q35_engine_info(b.e)->vocab_size);
        rc = 1;
    }
    eval_stats r = {0};
    double t0 = q35_now_seconds();
    q35_calib *calib = NULL;
    if (!rc && calib_path) {
        int32_t *cids = NULL, cn = 0;
        q35_error err = {0};
        if (tokenize_file(calib_path, tok_dir ? tok_dir : base_path, &cids, &cn)) {
            rc = 2;
        } else {
            if (q35_calib_collect(b.e, cids, cn, (int32_t)calib_ctx, NULL, 0, &calib, &err)) {
                fprintf(stderr, "qwen35 eval: calibration: %s\n", err.msg);
                rc = 1;
            } else {
                fprintf(stderr, "sweep: calibrated on %d tokens of %s\n", cn, calib_path);
            }
            free(cids);
        }
    }
    if (!rc && sweep) rc = eval_sweep(&m, &b, ids, n, win, sweep, group, json, calib);
    else if (!rc) rc = eval_windows(&m, base_path ? &b : NULL, ids, n, win, &r);
    long scored = r.scored;
    double secs = q35_now_seconds() - t0;
    if (!rc && !sweep) {
        double ppl = exp(r.nll / (double)scored);
        if (json) {
            printf("{\"model\": \"%s\", \"tokens\": %d, \"scored\": %ld, \"ctx\": %d, \"perplexity\": %.6f", model_path, n,
                   scored, win, ppl);
            if (base_path)
                printf(", \"base\": \"%s\", \"base_perplexity\": %.6f, \"kld_mean\": %.8f, \"kld_max\": %.8f, "
                       "\"top1_agreement\": %.6f", base_path, exp(r.nll_base / (double)scored), r.kld / (double)scored,
                       r.kld_max, (double)r.agree / (double)scored);
            printf("}\n");
        } else {
            printf("model: %s\ntokens: %d (%ld scored, windows of %d)\nperplexity: %.4f\n", model_path, n, scored, win, ppl);
            if (base_path)
                printf("base: %s\nbase perplexity: %.4f\nKL divergence (base || model): mean %.6f, max %.6f\n"
                       "top-1 agreement: %.2f%% (%ld of %ld)\n", base_path, exp(r.nll_base / (double)scored),
                       r.kld / (double)scored, r.kld_max, 100.0 * (double)r.agree / (double)scored, r.agree, scored);
        }
        fprintf(stderr, "eval: %ld positions in %.2f s\n", scored, secs);
    }
    free(ids);
    q35_calib_free(calib);
    if (m.e) eval_close(&m);
    if (b.e) eval_close(&b);
    return rc;
}
