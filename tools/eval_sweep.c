/* eval_sweep.c: `qwen35 eval --sweep DTYPE`: how much each matrix (or group
 * of matrices) costs or gains when stored as DTYPE, the rest of the model
 * as loaded; the measurement a cache policy is chosen from.
 *
 * One model and one base are loaded once. For each group, its matrices are
 * encoded from the base's weights into DTYPE in memory (through floats,
 * q35_dtype_encode: the bytes `prepare --set NAME=DTYPE` writes), bound in
 * place of the model's (q35_engine_set_weight, which reopens the backend),
 * the text is scored against the base (eval_windows), and the model's own
 * weights are bound again. The first row is the model as loaded. So
 *   -m CHECKPOINT --kld-base CHECKPOINT --sweep bfp4   what each matrix costs at BFP4
 *   -m DEFAULT_CACHE --kld-base CHECKPOINT --sweep bfp8   what raising each one to BFP8 gains
 * Only the text model's matrices are swept: the MTP head never reaches the
 * scored logits. Every figure is deterministic (any thread count gives the
 * same logits). */
#include "eval.h"
#include "base/util.h"
#include "core/calib.h"
#include "core/session.h"
#include "formats/cache.h"
#include "model/tensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ENCODE_ROWS 1024 /* rows decoded to floats at a time (a multiple of the panel height) */

typedef struct {
    char key[128];   /* the group's name */
    int32_t first;   /* its matrices: names[first .. first + n) */
    int32_t n;
    q35_dtype from;  /* the model's dtype of them (Q35_DT_COUNT: mixed) */
    eval_stats st;
    int64_t bytes_per_token, weight_bytes;
    double secs;
} sweep_group;

typedef struct {
    const q35_engine *m;
    q35_dtype to;
    const char *how;
    char (*names)[128]; /* the matrices to sweep, in binding order */
    q35_dtype *from;
    int32_t n_names;
} sweep_plan;

/* The group a matrix belongs to: itself, its kind (the layer number as *),
 * or its layer (the name up to the layer number). */
static void group_key(const char *name, const char *how, char key[128]) {
    snprintf(key, 128, "%s", name);
    if (!strcmp(how, "tensor")) return;
    const char *l = strstr(name, "layers.");
    if (!l) return;
    const char *num = l + 7, *dot = strchr(num, '.');
    if (!dot) return;
    if (!strcmp(how, "layer")) snprintf(key, 128, "%.*s", (int)(dot - name), name);
    else snprintf(key, 128, "%.*s*%s", (int)(num - name), name, dot);
}

static q35_status plan_one(void *ctx, const q35_model_tensor *t, q35_error *err) {
    sweep_plan *p = ctx;
    if (!t->def->matrix) return Q35_OK;
    const q35_tensor *w = q35_engine_weight(p->m, t->name);
    if (!w || w->dtype == p->to) return Q35_OK; /* already DTYPE: nothing to measure */
    if (!q35_cache_tensor_bytes(p->to, w->ndim, w->shape)) return Q35_OK; /* cannot be stored so (n_in % 16) */
    snprintf(p->names[p->n_names], 128, "%s", t->name);
    p->from[p->n_names++] = w->dtype;
    return Q35_OK;
}

/* Groups in order of their first matrix; names reordered so that each
 * group's matrices are consecutive (group i: names[first .. first + n)). */
static int32_t make_groups(sweep_plan *p, sweep_group *g) {
    int32_t n_groups = 0, n = p->n_names;
    char (*sorted)[128] = malloc((size_t)n * 128);
    int32_t *of = malloc((size_t)n * sizeof *of);
    if (!sorted || !of) { free(sorted); free(of); return -1; }
    for (int32_t i = 0; i < n; i++) {
        char key[128];
        group_key(p->names[i], p->how, key);
        int32_t k = 0;
        while (k < n_groups && strcmp(g[k].key, key)) k++;
        if (k == n_groups) {
            memset(&g[k], 0, sizeof g[k]);
            snprintf(g[k].key, sizeof g[k].key, "%s", key);
            g[k].from = p->from[i];
            n_groups++;
        }
        if (g[k].from != p->from[i]) g[k].from = Q35_DT_COUNT;
        g[k].n++;
        of[i] = k;
    }
    int32_t at = 0;
    for (int32_t k = 0; k < n_groups; k++) {
        g[k].first = at;
        for (int32_t i = 0; i < n; i++)
            if (of[i] == k) snprintf(sorted[at++], 128, "%s", p->names[i]);
    }
    memcpy(p->names, sorted, (size_t)n * 128);
    free(sorted);
    free(of);
    return n_groups;
}

/* The base's weight `name` encoded as dt into a new 64-byte aligned buffer (*t), with GPTQ where calib has
 * its input (the bytes prepare --calibrate stores), else plainly; 1 after printing why. */
static int encode_from_base(const q35_engine *base, q35_calib *calib, const char *name, q35_dtype dt, q35_tensor *t) {
    const q35_tensor *src = q35_engine_weight(base, name);
    if (!src) { fprintf(stderr, "qwen35 eval: the base has no matrix '%s'\n", name); return 1; }
    if (q35_dtype_is_block(src->dtype)) {
        fprintf(stderr, "qwen35 eval: the base's '%s' is %s: a sweep encodes from a checkpoint's weights\n", name,
                q35_dtype_name(src->dtype));
        return 1;
    }
    int64_t rows = src->shape[0], cols = src->shape[1];
    size_t bytes = q35_cache_tensor_bytes(dt, src->ndim, src->shape);
    void *dst = NULL;
    size_t made_bytes = 0;
    q35_error err = {0};
    if (calib && q35_dtype_is_block(dt) &&
        q35_calib_encode(calib, name, dt, q35_engine_threads(base), &dst, &made_bytes, &err)) {
        fprintf(stderr, "qwen35 eval: %s\n", err.msg);
        return 1;
    }
    if (!dst) { /* plainly */
        dst = aligned_alloc(64, (bytes + 63) / 64 * 64);
        float *f = malloc((size_t)ENCODE_ROWS * (size_t)cols * sizeof *f);
        if (!dst || !f) {
            fprintf(stderr, "qwen35 eval: out of memory encoding '%s'\n", name);
            free(dst);
            free(f);
            return 1;
        }
        memset(dst, 0, bytes);
        for (int64_t r0 = 0; r0 < rows; r0 += ENCODE_ROWS) {
            int64_t k = rows - r0 < ENCODE_ROWS ? rows - r0 : ENCODE_ROWS;
            q35_dtype_decode(src->dtype, src->data, cols, r0 * cols, k * cols, f);
            q35_dtype_encode(dt, (uint8_t *)dst + q35_dtype_bytes(dt, r0, cols), f, k, cols);
        }
        free(f);
    }
    *t = *src;
    t->dtype = dt;
    t->data = dst;
    t->nbytes = bytes;
    return 0;
}

/* Binds with[i] as matrix names[i] (i < n), the session of win positions
 * made again around it (a weight changes only while no session is open);
 * 1 after printing why. */
static int bind_group(eval_model *m, char (*names)[128], int32_t n, const q35_tensor *with, int32_t win) {
    q35_error err = {0};
    q35_session_free(m->s);
    m->s = NULL;
    for (int32_t i = 0; i < n; i++)
        if (q35_engine_set_weight(m->e, names[i], &with[i], &err)) {
            fprintf(stderr, "qwen35 eval: %s\n", err.msg);
            return 1;
        }
    if (q35_session_new(m->e, win, &m->s, &err)) {
        fprintf(stderr, "qwen35 eval: %s\n", err.msg);
        return 1;
    }
    return 0;
}

static const char *from_name(q35_dtype d) { return d == Q35_DT_COUNT ? "mixed" : q35_dtype_name(d); }

static void print_json(const sweep_group *base, const sweep_group *g, int32_t n_groups, const char *to,
                       const char *how, int32_t n_tokens, int32_t win, char (*names)[128]) {
    printf("{\"sweep\": \"%s\", \"group\": \"%s\", \"tokens\": %d, \"ctx\": %d, \"scored\": %ld, "
           "\"base_perplexity\": %.6f,\n \"rows\": [\n", to, how, n_tokens, win, base->st.scored,
           exp(base->st.nll_base / (double)base->st.scored));
    for (int32_t i = -1; i < n_groups; i++) {
        const sweep_group *r = i < 0 ? base : &g[i];
        double sc = (double)r->st.scored;
        printf("  {\"group\": \"%s\", \"from\": \"%s\", \"to\": \"%s\", \"tensors\": [", i < 0 ? "(as loaded)" : r->key,
               i < 0 ? "-" : from_name(r->from), i < 0 ? "-" : to);
        for (int32_t k = 0; i >= 0 && k < r->n; k++) printf("%s\"%s\"", k ? ", " : "", names[r->first + k]);
        printf("], \"bytes_per_token\": %lld, \"weight_bytes\": %lld, \"perplexity\": %.6f, \"kld_mean\": %.8f, "
               "\"kld_max\": %.8f, \"top1_agreement\": %.6f, \"kld_delta\": %.8f, \"bytes_per_token_delta\": %lld}%s\n",
               (long long)r->bytes_per_token, (long long)r->weight_bytes, exp(r->st.nll / sc), r->st.kld / sc,
               r->st.kld_max, (double)r->st.agree / sc, r->st.kld / sc - base->st.kld / (double)base->st.scored,
               (long long)(r->bytes_per_token - base->bytes_per_token), i + 1 < n_groups ? "," : "");
    }
    printf(" ]}\n");
}

static const sweep_group *sort_base;
static int by_effect(const void *a, const void *b) { /* largest |delta KL| first, then model order */
    const sweep_group *x = a, *y = b;
    double bk = sort_base->st.kld;
    double dx = fabs(x->st.kld - bk), dy = fabs(y->st.kld - bk);
    return dx < dy ? 1 : dx > dy ? -1 : x->first - y->first;
}

static void print_table(const sweep_group *base, sweep_group *g, int32_t n_groups, const char *to, const char *how) {
    double sc = (double)base->st.scored, k0 = base->st.kld / sc;
    printf("sweep: each %s in turn as %s; %ld scored positions; base perplexity %.4f\n", how, to, base->st.scored,
           exp(base->st.nll_base / sc));
    printf("| %s | from | tensors | bytes/token | Δ bytes/token | KL mean | Δ KL | KL max | top-1 | PPL |\n", how);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    printf("| (as loaded) | - | - | %lld | 0 | %.5f | 0 | %.4f | %.2f%% | %.4f |\n", (long long)base->bytes_per_token, k0,
           base->st.kld_max, 100.0 * (double)base->st.agree / sc, exp(base->st.nll / sc));
    sort_base = base;
    qsort(g, (size_t)n_groups, sizeof *g, by_effect);
    for (int32_t i = 0; i < n_groups; i++)
        printf("| %s | %s | %d | %lld | %+lld | %.5f | %+.5f | %.4f | %.2f%% | %.4f |\n", g[i].key, from_name(g[i].from),
               g[i].n, (long long)g[i].bytes_per_token, (long long)(g[i].bytes_per_token - base->bytes_per_token),
               g[i].st.kld / sc, g[i].st.kld / sc - k0, g[i].st.kld_max, 100.0 * (double)g[i].st.agree / sc,
               exp(g[i].st.nll / sc));
}

int eval_sweep(eval_model *m, eval_model *b, const int32_t *ids, int32_t n, int32_t win, const char *dtype,
               const char *how, int json, q35_calib *calib) {
    q35_dtype to = !strcmp(dtype, "bf16") ? Q35_DT_BF16 : !strcmp(dtype, "bfp8") ? Q35_DT_BFP8 : Q35_DT_BFP4;
    const q35_config *c = &m->e->cfg;
    int32_t cap = (c->n_layer + 1) * q35_n_tensor_defs;
    sweep_plan p = {m->e, to, how, calloc((size_t)cap, 128), calloc((size_t)cap, sizeof(q35_dtype)), 0};
    sweep_group *groups = calloc((size_t)cap, sizeof *groups);
    q35_tensor *own = calloc((size_t)cap, sizeof *own), *made = calloc((size_t)cap, sizeof *made);
    q35_error err = {0};
    int rc = 0;
    int32_t n_groups = 0;
    if (!p.names || !p.from || !groups || !own || !made) { fprintf(stderr, "qwen35 eval: out of memory\n"); rc = 1; }
    if (!rc && q35_model_tensors_each(c, Q35_TENSORS_TEXT, NULL, plan_one, &p, &err)) {
        fprintf(stderr, "qwen35 eval: %s\n", err.msg);
        rc = 1;
    }
    if (!rc && (n_groups = make_groups(&p, groups)) < 0) { fprintf(stderr, "qwen35 eval: out of memory\n"); rc = 1; }
    if (!rc && !n_groups) { fprintf(stderr, "qwen35 eval: no matrix of the model can change to %s\n", dtype); rc = 1; }
    for (int32_t i = 0; !rc && i < p.n_names; i++) own[i] = *q35_engine_weight(m->e, p.names[i]);
    sweep_group base = {.key = "(as loaded)"};
    double t0 = q35_now_seconds();
    if (!rc) rc = eval_windows(m, b, ids, n, win, &base.st);
    base.bytes_per_token = q35_engine_info(m->e)->bytes_per_token;
    base.weight_bytes = q35_engine_info(m->e)->weight_bytes;
    base.secs = q35_now_seconds() - t0;
    if (!rc) fprintf(stderr, "sweep: as loaded: KL %.6f (%.1f s)\n", base.st.kld / (double)base.st.scored, base.secs);
    for (int32_t gi = 0; !rc && gi < n_groups; gi++) {
        sweep_group *g = &groups[gi];
        t0 = q35_now_seconds();
        for (int32_t k = 0; !rc && k < g->n; k++) rc = encode_from_base(b->e, calib, p.names[g->first + k], to,
                                                                          &made[g->first + k]);
        if (!rc) rc = bind_group(m, p.names + g->first, g->n, made + g->first, win);
        if (!rc) {
            g->bytes_per_token = q35_engine_info(m->e)->bytes_per_token;
            g->weight_bytes = q35_engine_info(m->e)->weight_bytes;
            rc = eval_windows(m, b, ids, n, win, &g->st);
        }
        if (!rc) rc = bind_group(m, p.names + g->first, g->n, own + g->first, win); /* the model's own again */
        for (int32_t k = 0; k < g->n; k++) {
            free((void *)made[g->first + k].data);
            made[g->first + k].data = NULL;
        }
        g->secs = q35_now_seconds() - t0;
        if (!rc)
            fprintf(stderr, "sweep: %d/%d %s: KL %.6f (%.1f s)\n", gi + 1, n_groups, g->key,
                    g->st.kld / (double)g->st.scored, g->secs);
    }
    if (!rc && json) print_json(&base, groups, n_groups, q35_dtype_name(to), how, n, win, p.names);
    else if (!rc) print_table(&base, groups, n_groups, q35_dtype_name(to), how);
    free(p.names);
    free(p.from);
    free(groups);
    free(own);
    free(made);
    return rc;
}
