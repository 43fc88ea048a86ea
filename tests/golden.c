/* golden.c: read the transformers goldens (see golden.h). */
#include "golden.h"
#include "qwen35.h"
#include "test.h"

#include <jansson.h>
#include <math.h>

const char *const golden_models[] = {"tiny-a", "tiny-b", "tiny-c"};
const int golden_n_models = 3;

static int32_t *read_ids(json_t *arr, int32_t *n) {
    if (!json_is_array(arr)) return NULL;
    *n = (int32_t)json_array_size(arr);
    int32_t *ids = malloc(sizeof *ids * (size_t)(*n ? *n : 1));
    for (int32_t i = 0; i < *n; i++) ids[i] = (int32_t)json_integer_value(json_array_get(arr, (size_t)i));
    return ids;
}

static float *read_f32(const char *rel, size_t n) {
    FILE *fp = fopen(q35_test_path(rel), "rb");
    if (!fp) return NULL;
    float *v = malloc(sizeof *v * n);
    size_t got = fread(v, sizeof *v, n, fp);
    int extra = fgetc(fp) != EOF;
    fclose(fp);
    if (got != n || extra) { free(v); return NULL; }
    return v;
}

int golden_load(const char *name, golden *g) {
    memset(g, 0, sizeof *g);
    char rel[256];
    snprintf(rel, sizeof rel, "golden/%s.json", name);
    json_error_t jerr;
    json_t *root = json_load_file(q35_test_path(rel), 0, &jerr);
    if (!root) return -1;
    g->vocab_size = (int32_t)json_integer_value(json_object_get(root, "vocab_size"));
    g->prompt_ids = read_ids(json_object_get(root, "prompt_ids"), &g->n_prompt);
    g->greedy_ids = read_ids(json_object_get(root, "greedy_ids"), &g->n_greedy);
    char pf[300], gf[300];
    snprintf(pf, sizeof pf, "golden/%s", json_string_value(json_object_get(root, "prompt_logits_file")));
    snprintf(gf, sizeof gf, "golden/%s", json_string_value(json_object_get(root, "greedy_logits_file")));
    json_decref(root);
    if (!g->prompt_ids || !g->greedy_ids || g->vocab_size <= 0) { golden_free(g); return -1; }
    g->prompt_logits = read_f32(pf, (size_t)g->n_prompt * (size_t)g->vocab_size);
    g->greedy_logits = read_f32(gf, (size_t)g->n_greedy * (size_t)g->vocab_size);
    if (!g->prompt_logits || !g->greedy_logits) { golden_free(g); return -1; }
    snprintf(rel, sizeof rel, "models/%s", name);
    snprintf(g->model_dir, sizeof g->model_dir, "%s", q35_test_path(rel));
    return 0;
}

void golden_free(golden *g) {
    free(g->prompt_ids);
    free(g->greedy_ids);
    free(g->prompt_logits);
    free(g->greedy_logits);
    memset(g, 0, sizeof *g);
}

double rel_max_diff(const float *a, const float *b, size_t n) {
    double md = 0.0, mb = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (d > md || isnan(d)) md = isnan(d) ? INFINITY : d;
        if (fabs((double)b[i]) > mb) mb = fabs((double)b[i]);
    }
    return mb > 0 ? md / mb : md;
}

q35_engine *golden_engine(const char *name, golden *g) {
    if (golden_load(name, g)) {
        q35_test_fail(__FILE__, __LINE__, "no golden %s", name);
        return NULL;
    }
    q35_engine *e = NULL;
    q35_error err;
    if (q35_engine_load(g->model_dir, NULL, &e, &err)) q35_test_fail(__FILE__, __LINE__, "%s", err.msg);
    return e;
}
