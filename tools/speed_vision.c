/* speed_vision.c: `qwen35 speed --vision`: the vision tower's encode time at
 * Qwen3.5-9B's tower shapes (27 blocks, width 1152, MLP 4304, 16 heads,
 * patch 16, temporal patch 2, merge 2, out 4096, a 48 x 48 position table)
 * with synthetic BF16 weights (the published dtype), for one SIDE x SIDE
 * image (default 448: a 28 x 28 patch grid, 196 image tokens), on each
 * thread count. --tower-dtype bfp8 times the tower's matrices packed as
 * BFP8 instead and reports how far its output moves from the BF16 tower's.
 * With -m CACHE (a text model, e.g. make bench's synthetic 9B cache) also the
 * added time to first token: a text prompt of TEXT_TOKENS against the same
 * prompt holding the image (its rows plus vision_start/vision_end), i.e.
 * encode + prefill(TEXT_TOKENS + rows + 2) - prefill(TEXT_TOKENS). The
 * synthetic cache has no tower, so the image's rows enter the prefill as
 * text rows: the language model does the same work per row either way
 * (only the rows' embeddings and rotary positions differ). Prints one line
 * per thread count and, with --json, a file. */
#include "backend/cpu/kernels/kernels.h"
#include "backend/cpu/threadpool.h"
#include "backend/cpu/vision.h"
#include "formats/bfp.h"
#include "base/util.h"
#include "cli.h"

#include <math.h>
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

/* t as BFP8 in place (the tensor's data malloc'd, replaced) */
static int to_bfp8(q35_tensor *t) {
    const size_t nb = q35_bfp_tensor_bytes(Q35_DT_BFP8, t->shape[0], t->shape[1]);
    void *d = aligned_alloc(64, (nb + 63) / 64 * 64);
    q35_error err;
    if (!d || q35_bfp_pack_matrix(Q35_DT_BFP8, d, nb, t->data, t->dtype, t->shape[0], t->shape[1], 0, &err)) {
        free(d);
        return -1;
    }
    t->dtype = Q35_DT_BFP8, t->data = d, t->nbytes = nb;
    return 0;
}

#define TEXT_TOKENS 16

/* Seconds of one prefill of n random ids in a fresh session (the best of two). */
static double prefill_s(q35_engine *e, int32_t n, q35_error *err) {
    const q35_model_info *info = q35_engine_info(e);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    float *lg = malloc(sizeof(float) * (size_t)info->vocab_size);
    double best = -1;
    for (int32_t i = 0; ids && i < n; i++) ids[i] = (int32_t)(((uint64_t)i * 2654435761u + 17) % (uint64_t)info->vocab_size);
    for (int r = 0; ids && lg && r < 2; r++) {
        q35_session *s = NULL;
        if (q35_session_new(e, n + 8, &s, err)) break;
        double t0 = cli_now();
        q35_status st = q35_session_eval(s, ids, n, lg, 0, err);
        double t = cli_now() - t0;
        q35_session_free(s);
        if (st) { best = -1; break; }
        if (best < 0 || t < best) best = t;
    }
    free(ids), free(lg);
    return best;
}

int cli_speed_vision(const int *threads, int n_threads, int side, const char *json_path, const char *model,
                     const char *tower_dtype) {
    q35_vision_config vc = {1, 27, 1152, 4304, 16, 72, 3, 16, 2, 2, 4096, 2304, 48, 10000.0f};
    const int64_t VH = vc.hidden_size, VI = vc.intermediate_size, VM = VH * 4, VO = vc.out_hidden_size;
    const int bfp8 = tower_dtype && !strcmp(tower_dtype, "bfp8");
    if (tower_dtype && !bfp8 && strcmp(tower_dtype, "bf16")) {
        fprintf(stderr, "qwen35 speed --vision: --tower-dtype is bf16 or bfp8, not '%s'\n", tower_dtype);
        return 2;
    }
    static q35_vision_weights w, wq;
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
    wq = w; /* the tower timed: w itself, or its matrices as BFP8 (patch embedding and position table as stored) */
    if (bfp8) {
        bad = bad || to_bfp8(&wq.merger_fc1_w) || to_bfp8(&wq.merger_fc2_w);
        for (int l = 0; !bad && l < vc.depth; l++) {
            q35_vision_block *B = &wq.blocks[l];
            bad = to_bfp8(&B->qkv_w) || to_bfp8(&B->proj_w) || to_bfp8(&B->fc1_w) || to_bfp8(&B->fc2_w);
        }
    }
    const int32_t g = side / 16;
    const int32_t grid[1][3] = {{1, g, g}};
    const int64_t n_patch = (int64_t)g * g, pd = 3 * 2 * 16 * 16, n_tok = n_patch / 4;
    float *px = malloc(sizeof(float) * (size_t)(n_patch * pd)), *out = malloc(sizeof(float) * (size_t)(n_tok * VO));
    float *ref = bfp8 ? malloc(sizeof(float) * (size_t)(n_tok * VO)) : NULL;
    if (bad || !px || !out || (bfp8 && !ref) || side % 32 || side < 32) {
        fprintf(stderr, "qwen35 speed --vision: %s\n", bad || !px || !out || (bfp8 && !ref) ? "out of memory" : "the side must be a multiple of 32");
        return 1;
    }
    for (int64_t i = 0; i < n_patch * pd; i++) px[i] = uniform();
    q35_error err = {0};
    const q35_kernels *k = NULL;
    if (q35_kernels_init(&k, &err)) {
        fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
        return 1;
    }
    const char *dt = bfp8 ? "bfp8" : "bf16";
    FILE *js = json_path ? fopen(json_path, "w") : NULL;
    if (js) fprintf(js, "{\"tower\": \"qwen3.5-9b shapes, synthetic bf16\", \"tower_dtype\": \"%s\", \"image\": [%d, %d], "
                    "\"patches\": %lld, \"tokens\": %lld, \"kernels\": \"%s\", \"text_tokens\": %d, \"runs\": [", dt, side, side,
                    (long long)n_patch, (long long)n_tok, k->name, TEXT_TOKENS);
    printf("vision tower, Qwen3.5-9B shapes (synthetic BF16 weights, matrices %s), %dx%d image: %lld patches, %lld "
           "tokens, kernels %s\n", bfp8 ? "as BFP8" : "as BF16", side, side, (long long)n_patch, (long long)n_tok, k->name);
    int rc = 0;
    for (int ti = 0; ti < n_threads && !rc; ti++) {
        q35_host h = {.k = k};
        if (threads[ti] > 1 && q35_pool_new(threads[ti], &h.pool, &err)) {
            fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
            return 1;
        }
        double best = 1e30, t_sum = 0;
        const int reps = 2;
        for (int r = 0; r < reps && !rc; r++) {
            double t0 = cli_now();
            if (q35_vision_forward(&h, &vc, &wq, px, 1, grid, out, &err)) rc = 1;
            double t = cli_now() - t0;
            t_sum += t;
            if (t < best) best = t;
        }
        double rel_max = -1, rel_rms = -1;
        if (!rc && bfp8 && ti == 0) { /* the BF16 tower's output, once */
            if (q35_vision_forward(&h, &vc, &w, px, 1, grid, ref, &err)) rc = 1;
            double mx = 0, dmax = 0, dss = 0, ss = 0;
            for (int64_t i = 0; i < n_tok * VO; i++) {
                double d = fabs((double)out[i] - ref[i]);
                if (fabs(ref[i]) > mx) mx = fabs(ref[i]);
                if (!(d <= dmax)) dmax = d;
                dss += d * d, ss += (double)ref[i] * ref[i];
            }
            rel_max = dmax / mx, rel_rms = sqrt(dss / ss);
        }
        q35_pool_free(h.pool);
        if (rc) {
            fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
            break;
        }
        double t_text = -1, t_image = -1;
        if (model) { /* the same thread count on the language model */
            q35_engine_params p = {.n_threads = threads[ti]};
            q35_engine *e = NULL;
            if (q35_engine_load(model, &p, &e, &err) || (t_text = prefill_s(e, TEXT_TOKENS, &err)) < 0 ||
                (t_image = prefill_s(e, TEXT_TOKENS + (int32_t)n_tok + 2, &err)) < 0) {
                fprintf(stderr, "qwen35 speed --vision: %s\n", err.msg);
                rc = 1;
            }
            q35_engine_free(e);
            if (rc) break;
        }
        printf("  %d thread%s: encode %.2f s (best of %d; mean %.2f s), %.0f image tokens/s", threads[ti],
               threads[ti] > 1 ? "s" : "", best, reps, t_sum / reps, (double)n_tok / best);
        if (rel_max >= 0) printf("; output vs the BF16 tower: max |diff| %.2g, rms %.2g of its max / rms", rel_max, rel_rms);
        if (model)
            printf("\n    time to first token: %d-token text prompt %.2f s, with the image %.2f s (+%.2f s: encode %.2f + "
                   "%lld more prompt rows %.2f)", TEXT_TOKENS, t_text, best + t_image, best + t_image - t_text, best,
                   (long long)n_tok + 2, t_image - t_text);
        printf("\n");
        if (js) {
            fprintf(js, "%s{\"threads\": %d, \"encode_s\": %.4f, \"mean_s\": %.4f", ti ? ", " : "", threads[ti], best,
                    t_sum / reps);
            if (rel_max >= 0) fprintf(js, ", \"out_rel_max_vs_bf16\": %.3g, \"out_rel_rms_vs_bf16\": %.3g", rel_max, rel_rms);
            if (model)
                fprintf(js, ", \"ttft_text_s\": %.4f, \"ttft_image_s\": %.4f, \"added_ttft_s\": %.4f", t_text,
                        best + t_image, best + t_image - t_text);
            fprintf(js, "}");
        }
    }
    if (js) fprintf(js, "]}\n"), fclose(js);
    free(px), free(out), free(ref);
    return rc;
}
