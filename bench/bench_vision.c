/* bench_vision.c: encode time of the vision tower at Qwen3.5-9B's shapes.
 *
 * Build and run:  make build/bench_vision && build/bench_vision [--side PIXELS] [--reps N]
 *
 * Synthetic BF16 weights at the 9B tower's shapes (27 blocks, width 1152, MLP
 * 4304, 16 heads, patch 16, temporal patch 2, merge 2, output 4096, a 48x48
 * position table), held in memory, and one square image of --side pixels
 * (default 448: a 28 x 28 patch grid, 784 patches, 196 merged rows). It
 * times q35_vision_forward on 1 and 2 threads (the best of --reps runs, after
 * one warm-up) with the fastest kernel table, and prints seconds, GFLOP/s (the
 * matmuls and attention: 2 flops a multiply-add) and a hash of the output. */
#include "backend/cpu/vision.h"
#include "base/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;

static float next_uniform(void) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) & 0xFFFFFF) / 16777216.0f - 0.5f;
}

static q35_tensor make_bf16(int ndim, const int64_t *shape, float scale) {
    q35_tensor t = {.name = "synthetic", .dtype = Q35_DT_BF16, .ndim = ndim};
    int64_t n = 1;
    for (int i = 0; i < ndim; i++) n *= (t.shape[i] = shape[i]);
    uint16_t *d = malloc(sizeof(uint16_t) * (size_t)n);
    if (!d) {
        fprintf(stderr, "bench_vision: out of memory\n");
        exit(1);
    }
    for (int64_t i = 0; i < n; i++) d[i] = q35_f32_to_bf16(next_uniform() * scale);
    t.data = d;
    t.nbytes = sizeof(uint16_t) * (size_t)n;
    return t;
}

static q35_tensor mat(int64_t a, int64_t b) {
    int64_t s[2] = {a, b};
    return make_bf16(2, s, 2.0f / (float)b);
}

static q35_tensor vec(int64_t a, float scale, float offset) {
    q35_tensor t = make_bf16(1, &a, scale);
    uint16_t *d = (uint16_t *)t.data;
    for (int64_t i = 0; i < a; i++) d[i] = q35_f32_to_bf16(q35_bf16_to_f32(d[i]) + offset);
    return t;
}

int main(int argc, char **argv) {
    int side = 448, reps = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--side")) side = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
    }
    q35_vision_config vc = {.present = 1, .depth = 27, .hidden_size = 1152, .intermediate_size = 4304, .n_head = 16,
                            .head_dim = 72, .in_channels = 3, .patch_size = 16, .temporal_patch_size = 2,
                            .merge_size = 2, .out_hidden_size = 4096, .num_position_embeddings = 2304,
                            .grid_per_side = 48, .rope_theta = 10000.0f};
    const int64_t VH = vc.hidden_size, VI = vc.intermediate_size, VM = VH * 4, VP = 3 * 2 * 16 * 16;
    static q35_vision_weights w;
    w.present = 1;
    int64_t ps[5] = {VH, 3, 2, 16, 16}, pos[2] = {2304, VH};
    w.patch_w = make_bf16(5, ps, 2.0f / (float)VP);
    w.patch_b = vec(VH, 0.1f, 0);
    w.pos_embed = make_bf16(2, pos, 0.5f);
    for (int b = 0; b < vc.depth; b++) {
        q35_vision_block *B = &w.blocks[b];
        B->norm1_w = vec(VH, 0.2f, 1), B->norm1_b = vec(VH, 0.1f, 0);
        B->norm2_w = vec(VH, 0.2f, 1), B->norm2_b = vec(VH, 0.1f, 0);
        B->qkv_w = mat(3 * VH, VH), B->qkv_b = vec(3 * VH, 0.1f, 0);
        B->proj_w = mat(VH, VH), B->proj_b = vec(VH, 0.1f, 0);
        B->fc1_w = mat(VI, VH), B->fc1_b = vec(VI, 0.1f, 0);
        B->fc2_w = mat(VH, VI), B->fc2_b = vec(VH, 0.1f, 0);
    }
    w.merger_norm_w = vec(VH, 0.2f, 1), w.merger_norm_b = vec(VH, 0.1f, 0);
    w.merger_fc1_w = mat(VM, VM), w.merger_fc1_b = vec(VM, 0.1f, 0);
    w.merger_fc2_w = mat(vc.out_hidden_size, VM), w.merger_fc2_b = vec(vc.out_hidden_size, 0.1f, 0);

    const int32_t g = side / 32 * 2; /* smart_resize of a square side is a multiple of 32 */
    int32_t grid[1][3] = {{1, g, g}};
    const int64_t N = (int64_t)g * g, n_out = N / 4;
    float *pixels = malloc(sizeof(float) * (size_t)(N * VP)), *out = malloc(sizeof(float) * (size_t)(n_out * 4096));
    if (!pixels || !out) return 1;
    for (int64_t i = 0; i < N * VP; i++) pixels[i] = 2 * next_uniform();
    const double flops = 2.0 * N * ((double)VH * VP + vc.depth * (4.0 * VH * VH + 2.0 * VH * VI + 2.0 * N * VH)) +
                         2.0 * n_out * ((double)VM * VM + (double)VM * 4096);
    q35_error err;
    const q35_kernels *k;
    if (q35_kernels_init(&k, &err)) {
        fprintf(stderr, "bench_vision: %s\n", err.msg);
        return 1;
    }
    printf("vision tower, Qwen3.5-9B shapes: %dx%d image, %lld patches -> %lld rows of 4096, kernels %s, "
           "%.1f GFLOP\n", g * 16, g * 16, (long long)N, (long long)n_out, k->name, flops / 1e9);
    for (int threads = 1; threads <= 2; threads++) {
        q35_pool *pool = NULL;
        if (threads > 1 && q35_pool_new(threads, &pool, &err)) return 1;
        q35_host h = {k, pool};
        double best = 1e30;
        for (int r = 0; r <= reps; r++) {
            double t0 = q35_now_seconds();
            if (q35_vision_forward(&h, &vc, &w, pixels, 1, (const int32_t(*)[3])grid, out, &err)) {
                fprintf(stderr, "bench_vision: %s\n", err.msg);
                return 1;
            }
            double dt = q35_now_seconds() - t0;
            if (r > 0 && dt < best) best = dt; /* run 0 warms up */
        }
        uint64_t hash = 1469598103934665603ull;
        for (int64_t i = 0; i < n_out * 4096; i++) {
            uint32_t bits;
            memcpy(&bits, &out[i], 4);
            hash = (hash ^ bits) * 1099511628211ull;
        }
        printf("threads %d: %.3f s, %.1f GFLOP/s, output hash %016llx\n", threads, best, flops / best / 1e9,
               (unsigned long long)hash);
        q35_pool_free(pool);
    }
    return 0;
}
