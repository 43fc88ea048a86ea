/* prepare.c: `qwen35 prepare` (checkpoint -> weight cache, with optional
 * download and source verification), `qwen35 verify` (re-hash a cache) and
 * `qwen35 info` (what a checkpoint or cache holds and what it costs per
 * token). The work is in the library (src/prepare.c, src/cache.c,
 * src/hub.c); this file parses options and draws progress. */
#include "model/prepare.h"
#include "core/calib.h"
#include "formats/gptq.h"
#include "formats/hub.h"
#include "cli.h"
#include "model/tensors.h"
#include "qwen35.h"

#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    int tty;
    double last;
    const char *label;
} progress_state;

/* A one-line bar on a terminal, redrawn at most 10 times a second. */
static void progress_bar(void *ctx, uint64_t done, uint64_t total, const char *what) {
    progress_state *ps = ctx;
    if (!ps->tty) return;
    double now = q35_now_seconds();
    if (done < total && now - ps->last < 0.1) return;
    ps->last = now;
    double frac = total ? (double)done / (double)total : 1.0;
    int w = 30, fill = (int)(frac * w);
    char bar[64];
    for (int i = 0; i < w; i++) bar[i] = i < fill ? '#' : '.';
    bar[w] = 0;
    const char *tail = what ? strrchr(what, '/') : NULL;
    tail = tail ? tail + 1 : what ? what : "";
    fprintf(stderr, "\r%s [%s] %5.1f%% %8.1f / %.1f MB  %-48.48s", ps->label, bar, 100.0 * frac, (double)done / 1e6,
            (double)total / 1e6, tail);
    if (done >= total) fputc('\n', stderr);
    fflush(stderr);
}

/* --calibrate: once prepare has planned the cache (and found the output
 * out of date), the checkpoint reads the text and each block-format matrix
 * whose input it summed is coded with GPTQ, before the cache is written.
 * With --calib-layers N the text is read once per N layers, summing only
 * those layers' inputs (the lm_head's and the MTP head's with the first
 * group): the memory of
 * the sums is that of N layers, and the bytes are the same. */
typedef struct {
    const char *checkpoint, *text_path;
    int32_t ctx, threads, layers_per_pass;
    q35_engine *e;
    void **made; /* the coded tensors, freed after prepare */
    int32_t n_made;
} calib_state;

static int layer_of(const char *name) { /* the N of "layers.N." (the text model's), or -1 */
    const char *l = strstr(name, "layers.");
    return l && strncmp(name, "mtp.", 4) ? atoi(l + 7) : -1;
}

static q35_status calibrate_items(void *ctx, q35_cache_item *items, int32_t n, q35_error *err) {
    calib_state *c = ctx;
    size_t n_ids = 0;
    int32_t *ids = NULL;
    q35_engine_params ep = {.n_threads = c->threads, .weights = Q35_WEIGHTS_MAPPED}; /* no huge-page copy */
    const char **names = calloc((size_t)n + 1, sizeof *names);
    int32_t *which = calloc((size_t)n + 1, sizeof *which);
    double t0 = q35_now_seconds();
    q35_status st = names && which ? Q35_OK : q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    if (!st) st = cli_tokenize_file(c->text_path, c->checkpoint, &ids, &n_ids, err);
    if (!st && n_ids < 2) st = q35_fail(err, Q35_ERR_ARG, "%s: %zu tokens, too few to calibrate with", c->text_path, n_ids);
    if (!st) st = q35_engine_load(c->checkpoint, &ep, &c->e, err);
    if (!st) c->made = calloc((size_t)n + 1, sizeof *c->made);
    if (!st && !c->made) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    int n_layer = st ? 0 : q35_engine_info(c->e)->n_layer, step = c->layers_per_pass;
    if (step <= 0 || step > n_layer) step = n_layer > 0 ? n_layer : 1;
    int passes = 0;
    for (int l0 = 0; !st && l0 < n_layer; l0 += step) {
        int32_t k = 0;
        for (int32_t i = 0; i < n; i++) { /* this group's candidates: block formats coded from floats */
            const q35_cache_item *it = &items[i];
            int l = layer_of(it->name);
            if (!q35_dtype_is_block(it->dtype) || it->dtype == it->src_dtype || it->ndim != 2) continue;
            if (!q35_engine_weight(c->e, it->name)) continue;
            if (l0 == 0 ? l >= step : l < l0 || l >= l0 + step) continue;
            names[k] = it->name;
            which[k++] = i;
        }
        if (!k) continue;
        q35_calib *cal = NULL;
        st = q35_calib_collect(c->e, ids, (int32_t)n_ids, c->ctx, names, k, &cal, err);
        passes++;
        for (int32_t j = 0; !st && j < k; j++) {
            q35_cache_item *it = &items[which[j]];
            size_t bytes;
            void *buf = NULL;
            st = q35_calib_encode(cal, it->name, it->dtype, q35_engine_threads(c->e), &buf, &bytes, err);
            if (!st && buf) {
                it->encoded = buf;
                c->made[c->n_made++] = buf;
            }
        }
        q35_calib_free(cal);
    }
    if (!st) fprintf(stderr, "qwen35 prepare: calibrated on %zu tokens of %s (%d pass%s) in %.1f s\n", n_ids,
                     c->text_path, passes, passes == 1 ? "" : "es", q35_now_seconds() - t0);
    if (!st && !passes) fprintf(stderr, "qwen35 prepare: note: the policy stores no matrix in a block format, so "
                                "nothing was calibrated\n");
    q35_engine_free(c->e); /* the coded tensors do not need it */
    c->e = NULL;
    free(ids);
    free(names);
    free(which);
    return st;
}

/* What identifies a calibration: the encoder, its damping, the text's SHA-256 and the window length. */
static int calib_id(const char *path, int32_t ctx, char *out, size_t cap) {
    char *text = NULL;
    size_t len = 0;
    q35_error err = {0};
    if (q35_read_file(path, &text, &len, &err)) { fprintf(stderr, "qwen35 prepare: %s\n", err.msg); return -1; }
    uint8_t sha[32];
    unsigned n = 32;
    char hex[65];
    EVP_Digest(text, len, sha, &n, EVP_sha256(), NULL);
    q35_sha256_hex(sha, hex);
    free(text);
    snprintf(out, cap, "gptq damp=%g text-sha256=%s ctx=%d", Q35_GPTQ_DAMP, hex, ctx);
    return 0;
}

static const char prepare_usage[] =
    "usage: qwen35 prepare --checkpoint DIR --out CACHE_DIR [--policy NAME] [--expect FILE] [--force]\n"
    "       qwen35 prepare --download REPO --revision REV --checkpoint DIR --out CACHE_DIR [--hub-url URL] ...\n"
    "       qwen35 prepare --synthetic qwen3.5-9b|CONFIG.json --out CACHE_DIR [--policy NAME]\n"
    "  Converts a checkpoint into a weight cache directory (model.q35, config.json,\n"
    "  manifest.json, model-spec.json) that `-m CACHE_DIR` loads by mmap.\n"
    "  --policy      default (projections BFP4, embedding and lm_head BFP8, the rest as stored),\n"
    "                bf16 (as stored), bfp8 (every matrix BFP8), bfp4-all (every matrix BFP4),\n"
    "                tuned (default's dtypes, BFP4 encoded with the exponent search)\n"
    "  --expect FILE refuse source files whose SHA-256 differs from FILE\n"
    "                ({\"files\": {NAME: {\"size\", \"sha256\"}}}; an earlier manifest.json works)\n"
    "  --download    fetch REPO at REV from the Hugging Face Hub into --checkpoint DIR first\n"
    "                (resumable; each file checked against the Hub's SHA-256). --hub-url or\n"
    "                HF_ENDPOINT changes the server (https, or http on 127.0.0.1 only)\n"
    "  --synthetic   pseudo-random weights with the exact Qwen3.5-9B shapes, or those of a\n"
    "                config.json (for benchmarks and tests)\n"
    "  --set T=DTYPE store tensor T as bf16, bfp8, bfp4 or stored instead (repeatable)\n"
    "  --calibrate TEXT  encode the block-format matrices with GPTQ (docs/weight-cache.md): the\n"
    "                checkpoint reads TEXT (windows of --calib-ctx tokens, default 512) and each\n"
    "                matrix's rows are coded so that its outputs on those inputs move least\n"
    "  --calib-layers N  read TEXT once per N layers, holding only their sums (default: all at once)\n"
    "  -t THREADS    threads for the calibration (default: one per core)\n"
    "  --force       replace a different cache already in CACHE_DIR\n";

int cmd_prepare(int argc, char **argv) {
    q35_prepare_params p = {0};
    const char *policy = "default", *download = NULL, *revision = NULL, *hub = getenv("HF_ENDPOINT");
    const char *sets[64];
    calib_state cs = {0};
    long calib_ctx = 512, threads = 0, calib_layers = 0;
    for (int i = 1; i < argc; i++) {
        const char *k = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(k, "-h") || !strcmp(k, "--help")) { fputs(prepare_usage, stdout); return 0; }
        if (!strcmp(k, "--force")) { p.force = 1; continue; }
        if (!v) { fprintf(stderr, "qwen35 prepare: option %s needs a value\n%s", k, prepare_usage); return 2; }
        if (!strcmp(k, "--checkpoint")) p.checkpoint = v;
        else if (!strcmp(k, "--out")) p.out_dir = v;
        else if (!strcmp(k, "--policy")) policy = v;
        else if (!strcmp(k, "--expect")) p.expect = v;
        else if (!strcmp(k, "--synthetic")) p.synthetic = v;
        else if (!strcmp(k, "--download")) download = v;
        else if (!strcmp(k, "--revision")) revision = v;
        else if (!strcmp(k, "--hub-url")) hub = v;
        else if (!strcmp(k, "--set") && p.n_overrides < 64) sets[p.n_overrides++] = v;
        else if (!strcmp(k, "--calibrate")) cs.text_path = v;
        else if (!strcmp(k, "--calib-ctx") || !strcmp(k, "--calib-layers") || !strcmp(k, "-t") ||
                 !strcmp(k, "--threads")) {
            char *end;
            long x = strtol(v, &end, 10);
            int is_ctx = !strcmp(k, "--calib-ctx"), is_layers = !strcmp(k, "--calib-layers");
            if (*end || x < (is_ctx ? 2 : is_layers ? 1 : 0) || x > (is_ctx ? 1 << 20 : 1024)) {
                fprintf(stderr, "qwen35 prepare: bad %s '%s'\n", k, v);
                return 2;
            }
            if (is_ctx) calib_ctx = x;
            else if (is_layers) calib_layers = x;
            else threads = x;
        } else { fprintf(stderr, "qwen35 prepare: unknown option '%s'\n%s", k, prepare_usage); return 2; }
        i++;
    }
    p.overrides = sets;
    q35_error err = {0};
    if (q35_policy_parse(policy, &p.policy, &err)) { fprintf(stderr, "qwen35 prepare: %s\n", err.msg); return 2; }
    if (!p.out_dir || (!p.checkpoint && !p.synthetic)) {
        fprintf(stderr, "qwen35 prepare: need --out and one of --checkpoint or --synthetic\n%s", prepare_usage);
        return 2;
    }
    if (download && (!revision || !p.checkpoint)) {
        fprintf(stderr, "qwen35 prepare: --download needs --revision and --checkpoint DIR (where the files go)\n");
        return 2;
    }
    char cid[200];
    if (!cs.text_path && (calib_ctx != 512 || calib_layers)) {
        fprintf(stderr, "qwen35 prepare: --calib-ctx and --calib-layers go with --calibrate\n");
        return 2;
    }
    if (cs.text_path) {
        if (!p.checkpoint || p.synthetic) {
            fprintf(stderr, "qwen35 prepare: --calibrate needs --checkpoint (a model to read the text with)\n");
            return 2;
        }
        if (calib_id(cs.text_path, (int32_t)calib_ctx, cid, sizeof cid)) return 2;
        cs.checkpoint = p.checkpoint;
        cs.ctx = (int32_t)calib_ctx;
        cs.threads = (int32_t)threads;
        cs.layers_per_pass = (int32_t)calib_layers;
        p.calibrate = calibrate_items;
        p.calibrate_ctx = &cs;
        p.calibration_id = cid;
    }
    progress_state ps = {isatty(2), 0, "prepare"};
    p.progress = progress_bar;
    p.progress_ctx = &ps;
    double t0 = q35_now_seconds();
    if (download) {
        q35_download_params d = {hub && *hub ? hub : "https://huggingface.co", download, revision, p.checkpoint,
                                 progress_bar, &ps};
        ps.label = "download";
        if (q35_hub_download(&d, &err)) { fprintf(stderr, "qwen35 prepare: %s\n", err.msg); return 1; }
        ps.label = "prepare";
    }
    q35_status st = q35_prepare(&p, &err);
    for (int32_t i = 0; i < cs.n_made; i++) free(cs.made[i]);
    free(cs.made);
    q35_engine_free(cs.e);
    if (st) {
        fprintf(stderr, "qwen35 prepare: %s\n", err.msg);
        return 1;
    }
    fprintf(stderr, "qwen35 prepare: %s ready (policy %s) in %.1f s\n", p.out_dir, policy, q35_now_seconds() - t0);
    return 0;
}

static void print_line(void *ctx, const char *line) { fprintf(ctx, "%s\n", line); }

int cmd_verify(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(argc == 2 && !strcmp(argv[1], "--help") ? stdout : stderr,
                "usage: qwen35 verify CACHE_DIR\n  Re-hashes every tensor of a weight cache and names each mismatch.\n");
        return argc == 2 && !strcmp(argv[1], "--help") ? 0 : 2;
    }
    progress_state ps = {isatty(2), 0, "verify"};
    q35_error err = {0};
    if (q35_cache_verify(argv[1], print_line, stderr, progress_bar, &ps, &err)) {
        fprintf(stderr, "qwen35 verify: %s\n", err.msg);
        return 1;
    }
    printf("%s: ok\n", argv[1]);
    return 0;
}

/* ---- info ---- */

static uint64_t row_bytes(const q35_tensor *t) {
    if (t->ndim < 2) return t->nbytes;
    return q35_dtype_row_bytes(t->dtype, q35_tensor_nelem(t) / t->shape[0]);
}

typedef struct {
    int32_t count[Q35_DT_COUNT];
    uint64_t bytes[Q35_DT_COUNT], total, per_token, mtp, lm_head;
    int32_t n, vision_n;
    uint64_t vision; /* model.visual.*: read once per image, not per token */
} tally;

/* Bytes per generated token: every text-model weight once, the embedding as
 * one row (unless tied: then it is also the lm_head), the MTP head and the
 * vision tower apart. */
static void add_tensor(tally *t, const char *name, const q35_tensor *x, int tied) {
    q35_tensor_role role = q35_tensor_role_of(name);
    t->n++;
    t->count[x->dtype]++;
    t->bytes[x->dtype] += x->nbytes;
    t->total += x->nbytes;
    if (!strncmp(name, "model.visual.", 13)) t->vision_n++, t->vision += x->nbytes;
    else if (!strncmp(name, "mtp.", 4)) t->mtp += x->nbytes;
    else if (role == Q35_ROLE_EMBED)
        t->per_token += tied ? x->nbytes + row_bytes(x) : row_bytes(x);
    else t->per_token += x->nbytes;
    if (role == Q35_ROLE_HEAD || (tied && role == Q35_ROLE_EMBED))
        t->lm_head = x->nbytes;
}

static void print_tally(const tally *t) {
    printf("tensors: %d", t->n);
    for (int d = 0; d < Q35_DT_COUNT; d++)
        if (t->count[d]) printf(", %d %s", t->count[d], q35_dtype_name((q35_dtype)d));
    printf("\n");
    for (int d = 0; d < Q35_DT_COUNT; d++)
        if (t->count[d]) printf("  %-5s %4d tensors %16llu bytes\n", q35_dtype_name((q35_dtype)d), t->count[d],
                                (unsigned long long)t->bytes[d]);
    printf("total bytes: %llu (%.3f GB)\n", (unsigned long long)t->total, (double)t->total / 1e9);
    printf("bytes read per generated token: %llu (%.3f GB), plus %llu for each MTP draft (MTP head%s)\n",
           (unsigned long long)t->per_token, (double)t->per_token / 1e9,
           (unsigned long long)(t->mtp ? t->mtp + t->lm_head : 0), t->mtp ? " and lm_head again" : ": none");
    if (t->vision_n)
        printf("vision tower: %d tensors, %llu bytes, read once per image (in the totals above)\n", t->vision_n, (unsigned long long)t->vision);
}

int cmd_info(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        int help = argc == 2 && !strcmp(argv[1], "--help");
        fprintf(help ? stdout : stderr,
                "usage: qwen35 info PATH\n  Tensor counts by dtype, bytes, bytes read per generated token, and the\n"
                "  cache size the exact Qwen3.5-9B shapes give under each policy.\n");
        return help ? 0 : 2;
    }
    const char *path = argv[1];
    q35_error err = {0};
    q35_checkpoint ck;
    int is_cache = q35_cache_present(path);
    q35_config cfg;
    char *cfg_path = q35_path_join(path, "config.json");
    q35_status st = q35_config_load(cfg_path, &cfg, &err);
    free(cfg_path);
    if (!st) st = is_cache ? q35_cache_open(path, &ck, &err) : q35_checkpoint_open(path, &ck, &err);
    if (st) { fprintf(stderr, "qwen35 info: %s\n", err.msg); return 1; }
    tally t = {0};
    for (int32_t i = 0; i < ck.n_index; i++) add_tensor(&t, ck.index[i]->name, &ck.index[i]->tensor, cfg.tie_word_embeddings);
    char *policy = NULL;
    if (is_cache) {
        char *man = q35_path_join(path, "manifest.json"), *text = NULL;
        size_t len;
        if (!q35_read_file(man, &text, &len, NULL)) {
            const char *k = strstr(text, "\"policy\": \"");
            if (k) { k += 11; policy = strndup(k, strcspn(k, "\"")); }
        }
        free(text);
        free(man);
    }
    printf("%s: %s%s%s%s\n", path, is_cache ? "weight cache (model.q35)" : "checkpoint", policy ? ", policy " : "",
           policy ? policy : "", "");
    print_tally(&t);
    q35_checkpoint_close(&ck);

    /* the same policy on the real 9B shapes */
    char *cfg9 = q35_config_json_9b();
    q35_cache_item *items = NULL;
    int32_t n = 0;
    if (!cfg9 || q35_model_tensors(cfg9, &items, &n, &err)) { fprintf(stderr, "qwen35 info: %s\n", err.msg); free(cfg9); free(policy); return 1; }
    printf("Qwen3.5-9B (exact shapes, text model and MTP head) as a cache:\n");
    for (int p = 0; p < Q35_POLICY_COUNT; p++) {
        tally t9 = {0};
        for (int32_t i = 0; i < n; i++) {
            q35_tensor x = {.name = items[i].name, .ndim = items[i].ndim};
            memcpy(x.shape, items[i].shape, sizeof x.shape);
            x.dtype = q35_policy_dtype((q35_policy_id)p, items[i].name, items[i].src_dtype, items[i].ndim, items[i].shape);
            x.nbytes = q35_cache_tensor_bytes(x.dtype, x.ndim, x.shape);
            add_tensor(&t9, items[i].name, &x, 0);
        }
        int mine = policy && !strcmp(policy, q35_policy_name((q35_policy_id)p));
        printf("  %-9s %6.3f GB, %6.3f GB per token:", q35_policy_name((q35_policy_id)p), (double)t9.total / 1e9,
               (double)t9.per_token / 1e9);
        for (int d = 0; d < Q35_DT_COUNT; d++)
            if (t9.count[d]) printf(" %d %s", t9.count[d], q35_dtype_name((q35_dtype)d));
        printf("%s\n", mine ? "   <- this cache's policy" : "");
    }
    printf("  (the seed's TT package: 298 BFP4 + 162 BF16 files, 9.700 GB)\n");
    free(items);
    free(cfg9);
    free(policy);
    return 0;
}
