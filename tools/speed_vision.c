/* speed_vision.c: `qwen35 speed --vision`: the vision tower's encode time at
 * Qwen3.5-9B's tower shapes (27 blocks, width 1152, MLP 4304, 16 heads,
 * patch 16, temporal patch 2, merge 2, out 4096, a 48 x 48 position table)
 * with synthetic BF16 weights (the published dtype), for one SIDE x SIDE
 * image (default 448: a 28 x 28 patch grid, 196 image tokens), on each
 * thread count. Prints one line per thread count and, with --json, a file. */
#include "backend/cpu/kernels/kernels.h"
#include "backend/cpu/threadpool.h"
#include "backend/cpu/vision.h"
#include "base/util.h"
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static float uniform(void) { /* xorshift64*, [-1, 1) */
    rng ^= rng >> 12, rng ^= rng << 25, rng ^= rng >> 27;
    return (float)((rng * 0x2545f4914f6cdd1dull) >> 40) / (float)(1 << 23) - 1.0f;
}

/* A BF16 tensor of the given shape, values scale * U(-1, 1) + offset (malloc'd data). */
static int synth(q35_tensor *t, int ndim, const int64_t *shape, float scale, float offset) {
    memset(t, 0, sizeof *t);
    t->name = "synthetic";
    t->dtype = Q35_DT_BF16;
    t->ndim = ndim;
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (t->shape[i] = shape[i]);
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)n);
    if (!d) return -1;
    for (int64_t i = 0; i < n; i++) d[i] = q35_f32_to_bf16(scale * uniform() + offset);
    t->data = d;
    t->nbytes = sizeof(uint16_t) * (size_t)n;
    return 0;
}

#define MAT(t, o, i) synth(&(t), 2, (int64_t[]){(o), (i)}, 0.02f, 0.0f)
#define VEC(t, n, off) synth(&(t), 1, (int64_t[]){(n)}, 0.02f, (off))

int cli_speed_vision(const int *threads, int n_threads, int side, const char *json_path) {
    q35_vision_config vc = {1, 27, 1152, 4304, 16, 72, 3, 16, 2, 2, 4096, 2304, 48, 10000.0f};
    const int64_t VH = vc.hidden_size, VI = vc.intermediate_size, VM = VH * 4, VO = vc.out_hidden_size;
    static q35_vision_weights w;
    int bad = synth(&w.patch_w, 5, (int64_t[]){VH, 3, 2, 16, 16}, 0.02f, 0.0f) || VEC(w.patch_b, VH, 0) ||
              synth(&w.pos_embed, 2, (int64_t[]){2304, VH}, 0.5f, 0.0f) || VEC(w.merger_norm_w, VH, 1) ||
              VEC(w.merger_norm_b, VH, 0) || MAT(w.merger_fc1_w, VM, VM) || VEC(w.merger_fc1_b, VM, 0) ||
              MAT(w.merger_fc2_w, VO, VM) || VEC(w.merger_fc2_b, VO, 0);
    for (int l = 0; !bad && l < vc.depth; l++) {
        q35_vision_block *B = &w.blocks[l];
        bad = VEC(B->norm1_w, VH, 1) || VEC(B->norm1_b, VH, 0) || MAT(B->qkv_w, 3 * VH, VH) || VEC(B->qkv_b, 3 * VH, 0) ||
              MAT(B->proj_w, VH, VH) || VEC(B->proj_b, VH, 0) || VEC(B->norm2_w, VH, 1) || VEC(B->norm2_b, VH, 0) ||
              MAT(B->fc1_w, VI, VH) || VEC(B->fc1_b, VI, 0) || MAT(B->fc2_w, VH, VI) || VEC(B->fc2_b, VH, 0);
    }
    w.present = 1;
    const int32_t g = side / 16;
    const int32_t grid[1][3] = {{1, g, g}};
    const int64_t n_patch = (int64_t)g * g, pd = 3 * 2 * 16 * 16, n_tok = n_patch / 4;
    float *px = malloc(sizeof(float) * (size_t)(n_patch * pd)), *out = malloc(sizeof(float) * (size_t)(n_tok * VO));
    if (bad || !px || !out || side % 32 || side < 32) {
        fprintf(stderr, "qwen35 speed --vision: %s\n", bad || !px || !out ? "out of memory" : "the side must be a multiple of 32");
        return 1;
    }
    for (int64_t i = 0; i < n_patch * pd; i++) px[i] = uniform();
    q35_error err = {0};
    const q35_kernels *k = NULL;
    if (q35_kernels_init(&k, &err)) {
        fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
        return 1;
    }
    FILE *js = json_path ? fopen(json_path, "w") : NULL;
    if (js) fprintf(js, "{\"tower\": \"qwen3.5-9b shapes, synthetic bf16\", \"image\": [%d, %d], \"patches\": %lld, "
                    "\"tokens\": %lld, \"kernels\": \"%s\", \"runs\": [", side, side, (long long)n_patch, (long long)n_tok, k->name);
    printf("vision tower, Qwen3.5-9B shapes (synthetic BF16 weights), %dx%d image: %lld patches, %lld tokens, kernels %s\n",
           side, side, (long long)n_patch, (long long)n_tok, k->name);
    for (int ti = 0; ti < n_threads; ti++) {
        q35_host h = {k, NULL};
        if (threads[ti] > 1 && q35_pool_new(threads[ti], &h.pool, &err)) {
            fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
            return 1;
        }
        double best = 1e30, t_sum = 0;
        const int reps = 2;
        for (int r = 0; r < reps; r++) {
            double t0 = cli_now();
            if (q35_vision_forward(&h, &vc, &w, px, 1, grid, out, &err)) {
                fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
                return 1;
            }
            double t = cli_now() - t0;
            t_sum += t;
            if (t < best) best = t;
        }
        q35_pool_free(h.pool);
        printf("  %d thread%s: encode %.2f s (best of %d; mean %.2f s), %.0f image tokens/s\n", threads[ti],
               threads[ti] > 1 ? "s" : "", best, reps, t_sum / reps, (double)n_tok / best);
        if (js) fprintf(js, "%s{\"threads\": %d, \"encode_s\": %.4f, \"mean_s\": %.4f}", ti ? ", " : "", threads[ti], best,
                        t_sum / reps);
    }
    if (js) fprintf(js, "]}\n"), fclose(js);
    free(px), free(out);
    return 0;
}
