/* The cuda test group (CUDA=1 builds): the cuda backend against the
 * reference backend and the transformers goldens; the tolerances and their
 * derivation are at the head of test_cuda.c. Without a device every test
 * prints "skipped: no CUDA device" and passes. */
#ifdef Q35_CUDA
#include "backend/cuda/kernels.h"
#include "backend/cuda/layout.h"
#include "formats/bfp.h"
#include "model/prepare.h"
#include "golden.h"
#include "helpers.h"
#include "qwen35.h"
#include "test.h"

#include <cuda_runtime_api.h>
#include <math.h>

#define LOGIT_TOL 1e-4
#define PATH_TOL 2e-5

static int no_device(const char *test) {
    char why[200] = "";
    if (q35_cuda_device_count(why, sizeof why) > 0) return 0;
    printf("     cuda.%s: skipped: no CUDA device (%s)\n", test, why + (strncmp(why, "no CUDA device: ", 16) ? 0 : 16));
    return 1;
}

static q35_engine *load_on(const char *dir, const char *backend) {
    q35_engine_params p = {.n_threads = 2, .backend = backend};
    q35_engine *e = NULL;
    q35_error err = {0};
    if (q35_engine_load(dir, &p, &e, &err)) q35_test_fail(__FILE__, __LINE__, "load %s on %s: %s", dir, backend, err.msg);
    return e;
}

static q35_session *new_session(q35_engine *e) {
    q35_session *s = NULL;
    q35_error err = {0};
    if (e && q35_session_new(e, 256, &s, &err)) q35_test_fail(__FILE__, __LINE__, "session: %s", err.msg);
    return s;
}

TEST(cuda, without_a_device_open_fails_clearly) {
    char why[200] = "";
    q35_engine_params p = {.backend = "cuda"};
    q35_engine *e = NULL;
    q35_error err = {0};
    q35_status st = q35_engine_load(q35_test_path("models/tiny-a"), &p, &e, &err);
    if (q35_cuda_device_count(why, sizeof why) > 0) {
        REQUIRE_MSG(st == Q35_OK, "%s", err.msg);
        CHECK_STR_EQ(q35_engine_backend(e), "cuda");
        q35_engine_free(e);
        return;
    }
    CHECK(st == Q35_ERR_UNSUPPORTED && e == NULL);
    CHECK_MSG(strstr(err.msg, "needs a CUDA device") && strstr(err.msg, "--backend cpu"), "message: %s", err.msg);
}

/* Logits of every golden prompt against transformers and the reference
 * backend; plain and speculative greedy tokens against transformers. */
TEST(cuda, goldens_logits_and_greedy_tokens) {
    if (no_device("goldens_logits_and_greedy_tokens")) return;
    for (int m = 0; m < golden_n_models; m++) {
        golden g;
        REQUIRE_MSG(golden_load(golden_models[m], &g) == 0, "golden %s missing", golden_models[m]);
        const size_t V = (size_t)g.vocab_size;
        float *lg = malloc(sizeof(float) * V * (size_t)g.n_prompt), *ref = malloc(sizeof(float) * V * (size_t)g.n_prompt);
        q35_engine *ec = load_on(g.model_dir, "cuda"), *er = load_on(g.model_dir, "ref");
        q35_session *sc = new_session(ec), *sr = new_session(er);
        q35_error err = {0};
        if (sc && sr) {
            CHECK(!q35_session_eval(sc, g.prompt_ids, g.n_prompt, lg, Q35_EVAL_ALL_LOGITS, &err));
            CHECK(!q35_session_eval(sr, g.prompt_ids, g.n_prompt, ref, Q35_EVAL_ALL_LOGITS, &err));
            for (int32_t p = 0; p < g.n_prompt; p++) {
                double d = rel_max_diff(lg + p * V, g.prompt_logits + p * V, V);
                CHECK_MSG(d <= LOGIT_TOL, "%s: position %d: %.3g from transformers", golden_models[m], p, d);
                d = rel_max_diff(lg + p * V, ref + p * V, V);
                CHECK_MSG(d <= PATH_TOL, "%s: position %d: %.3g from the ref backend", golden_models[m], p, d);
            }
            for (int spec = 0; spec <= 2; spec += 2) {
                q35_session_reset(sc);
                CHECK(!q35_session_set_spec(sc, spec, &err));
                float *last = malloc(sizeof(float) * V);
                CHECK(!q35_session_eval(sc, g.prompt_ids, g.n_prompt, last, 0, &err));
                int32_t *toks = calloc((size_t)g.n_greedy + Q35_SPEC_K_MAX + 1, sizeof(int32_t));
                CHECK_EQ_INT(test_greedy_tokens(sc, last, g.n_greedy, toks), g.n_greedy);
                for (int32_t i = 0; i < g.n_greedy; i++)
                    CHECK_MSG(toks[i] == g.greedy_ids[i], "%s (spec %d): greedy token %d: %d, transformers %d",
                              golden_models[m], spec, i, toks[i], g.greedy_ids[i]);
                free(toks); free(last);
            }
        }
        q35_session_free(sc); q35_session_free(sr);
        q35_engine_free(ec); q35_engine_free(er);
        free(lg); free(ref);
        golden_free(&g);
    }
}

/* A device image of a random [n_out, n_in] matrix of dtype dt (weights
 * |w| when positive), and its host copy for q35_cuda_mat_get. */
typedef struct { q35_cuda_mat_layout L; uint8_t *img, *d_img; q35_cuda_mat m; } dev_mat;

static int dev_mat_make(dev_mat *M, q35_dtype dt, int64_t n_out, int64_t n_in, uint32_t seed, int positive) {
    const size_t n = (size_t)(n_out * n_in);
    float *src = malloc(sizeof(float) * n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        float v = ((float)(seed >> 8) / 16777216.0f - 0.5f) * (i % 9 ? 1.0f : 20.0f);
        src[i] = positive ? fabsf(v) + 0.01f : v;
    }
    void *data = src;
    size_t bytes = n * 4;
    q35_error err = {0};
    int ok = 1;
    if (dt == Q35_DT_BF16) {
        uint16_t *h = malloc(2 * n);
        for (size_t i = 0; i < n; i++) h[i] = q35_f32_to_bf16(src[i]);
        data = h, bytes = 2 * n;
    } else if (dt != Q35_DT_F32) {
        bytes = q35_bfp_tensor_bytes(dt, n_out, n_in);
        data = malloc(bytes);
        ok = !q35_bfp_pack_matrix(dt, data, bytes, src, Q35_DT_F32, n_out, n_in, 0, &err);
    }
    q35_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {n_out, n_in}, .data = data, .nbytes = bytes};
    memset(M, 0, sizeof *M);
    if (ok) ok = !q35_cuda_mat_layout_of(&t, &M->L, &err);
    if (ok) {
        M->img = calloc(1, M->L.bytes);
        q35_cuda_mat_pack_rows(&t, &M->L, 0, n_out, M->img, M->L.exp_pitch ? M->img + M->L.exp_offset : NULL);
        ok = !cudaMalloc((void **)&M->d_img, M->L.bytes) && !cudaMemcpy(M->d_img, M->img, M->L.bytes, cudaMemcpyHostToDevice);
    }
    if (ok)
        M->m = (q35_cuda_mat){(int32_t)dt, (int32_t)n_out, (int32_t)n_in, (int32_t)M->L.pitch, (int32_t)M->L.exp_pitch,
                              M->d_img, M->L.exp_pitch ? M->d_img + M->L.exp_offset : NULL};
    if (data != src) free(data);
    free(src);
    CHECK_MSG(ok, "%s %lldx%lld: making the image: %s", q35_dtype_name(dt), (long long)n_out, (long long)n_in, err.msg);
    return ok;
}

static void dev_mat_free(dev_mat *M) { cudaFree(M->d_img); free(M->img); }

/* How far y (T rows of M's n_out) is from base + x W^T in a double sum, in
 * units of the sum of |w x| (the worst output). */
static double worst_error(const dev_mat *M, const float *x, const float *base, const float *y, int32_t T) {
    double worst = 0;
    for (int32_t tt = 0; tt < T; tt++)
        for (int64_t o = 0; o < M->L.n_out; o++) {
            double want = base ? base[(size_t)tt * (size_t)M->L.n_out + (size_t)o] : 0, mag = 1e-30;
            for (int64_t i = 0; i < M->L.n_in; i++) {
                double p = (double)q35_cuda_mat_get(&M->L, M->img, o, i) * x[(size_t)tt * (size_t)M->L.n_in + (size_t)i];
                want += p, mag += fabs(p);
            }
            double d = fabs(y[(size_t)tt * (size_t)M->L.n_out + (size_t)o] - want) / mag;
            if (!(d <= worst)) worst = d; /* NaN counts as worst */
        }
    return worst;
}

/* Two matrices of dtype dt (n_out 70 and 33) in one q35_cu_matmul_n call on
 * T rows, with tc off and on, and with add over a known y: each output
 * within 1e-5 of the sum of |w x| of a double sum. */
static void check_device_matmul(q35_dtype dt, int64_t n_in, int32_t T, uint32_t seed) {
    dev_mat A, B;
    if (!dev_mat_make(&A, dt, 70, n_in, seed, 0) || !dev_mat_make(&B, dt, 33, n_in, seed + 1, 0)) return;
    const size_t nx = (size_t)T * (size_t)n_in, na = (size_t)T * 70, nb = (size_t)T * 33;
    float *x = malloc(sizeof(float) * nx), *ya = malloc(sizeof(float) * na), *yb = malloc(sizeof(float) * nb);
    float *base = malloc(sizeof(float) * na);
    for (size_t i = 0; i < nx; i++) { seed = seed * 1664525u + 1013904223u; x[i] = (float)(seed >> 8) / 16777216.0f - 0.5f; }
    for (size_t i = 0; i < na; i++) base[i] = (float)(i % 13) - 6.0f;
    float *d_x = NULL, *d_a = NULL, *d_b = NULL;
    cudaError_t rc = cudaMalloc((void **)&d_x, sizeof(float) * nx);
    if (!rc) rc = cudaMalloc((void **)&d_a, sizeof(float) * na);
    if (!rc) rc = cudaMalloc((void **)&d_b, sizeof(float) * nb);
    if (!rc) rc = cudaMemcpy(d_x, x, sizeof(float) * nx, cudaMemcpyHostToDevice);
    for (int tc = 0; !rc && tc <= 1; tc++) {
        const q35_cuda_mat W[2] = {A.m, B.m};
        float *const y[2] = {d_a, d_b};
        rc = q35_cu_matmul_n(0, 2, W, y, d_x, T, 0, tc);
        if (!rc) rc = cudaMemcpy(ya, d_a, sizeof(float) * na, cudaMemcpyDeviceToHost);
        if (!rc) rc = cudaMemcpy(yb, d_b, sizeof(float) * nb, cudaMemcpyDeviceToHost);
        if (rc) break;
        double ea = worst_error(&A, x, NULL, ya, T), eb = worst_error(&B, x, NULL, yb, T);
        CHECK_MSG(ea <= 1e-5 && eb <= 1e-5, "%s n_in %lld T=%d tc %d: worst errors %.3g, %.3g of |w x|", q35_dtype_name(dt),
                  (long long)n_in, T, tc, ea, eb);
        /* y += x W^T */
        rc = cudaMemcpy(d_a, base, sizeof(float) * na, cudaMemcpyHostToDevice);
        if (!rc) rc = q35_cu_matmul_n(0, 1, &A.m, &d_a, d_x, T, 1, tc);
        if (!rc) rc = cudaMemcpy(ya, d_a, sizeof(float) * na, cudaMemcpyDeviceToHost);
        if (rc) break;
        ea = worst_error(&A, x, base, ya, T);
        CHECK_MSG(ea <= 1e-5, "%s n_in %lld T=%d tc %d, add: worst error %.3g of |w x|", q35_dtype_name(dt), (long long)n_in, T,
                  tc, ea);
    }
    CHECK_MSG(!rc, "%s n_in %lld T=%d: CUDA: %s", q35_dtype_name(dt), (long long)n_in, T, cudaGetErrorString(rc));
    cudaFree(d_x); cudaFree(d_a); cudaFree(d_b);
    dev_mat_free(&A); dev_mat_free(&B);
    free(x); free(ya); free(yb); free(base);
}

/* Both matmul kernels at every dtype the cache uses, row counts on both
 * sides of 8 and of the tensor-core tile (64), widths with partial windows
 * (and 1040, not a multiple of 32, where tensor cores decline). */
TEST(cuda, matmul_kernels_match_a_double_sum) {
    if (no_device("matmul_kernels_match_a_double_sum")) return;
    const q35_dtype dts[] = {Q35_DT_BFP4, Q35_DT_BFP8, Q35_DT_BF16, Q35_DT_F32};
    const int32_t rows[] = {1, 2, 3, 8, 9, 40, 65, 128};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++)
        for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
            check_device_matmul(dts[d], 1056, rows[r], 11u + (uint32_t)(d * 8 + r));
            check_device_matmul(dts[d], 96, rows[r], 91u + (uint32_t)(d * 8 + r));
            if (rows[r] == 40) check_device_matmul(dts[d], 1040, rows[r], 51u + (uint32_t)d);
        }
}

/* The tensor cores' third bf16 term of x is there: with positive weights
 * and inputs 1 + 2^-9 + 2^-17 + 2^-23 (three terms 1, 2^-9 + 2^-16 and
 * -2^-17 + 2^-23, exactly), two terms are off by 2^-17 - 2^-23 of every
 * product, one way; three are off only by the tensor cores' fp32 sums
 * (truncated, a few 2^-24 per step), well under a third of that. */
TEST(cuda, tensor_cores_carry_the_input_in_three_terms) {
    if (no_device("tensor_cores_carry_the_input_in_three_terms")) return;
    dev_mat A;
    if (!dev_mat_make(&A, Q35_DT_BFP8, 64, 64, 5u, 1)) return;
    const int32_t T = 16;
    float x[16 * 64], y[16 * 64];
    for (int i = 0; i < T * 64; i++) x[i] = 1.0f + 0x1p-9f + 0x1p-17f + 0x1p-23f;
    float *d_x = NULL, *d_y = NULL;
    double err[4] = {0};
    cudaError_t rc = cudaMalloc((void **)&d_x, sizeof x);
    if (!rc) rc = cudaMalloc((void **)&d_y, sizeof y);
    if (!rc) rc = cudaMemcpy(d_x, x, sizeof x, cudaMemcpyHostToDevice);
    for (int terms = 2; !rc && terms <= 3; terms++) {
        if (!q35_cu_matmul_tc_terms(0, d_y, A.m, d_x, T, 0, terms, &rc)) rc = cudaErrorInvalidValue;
        if (!rc) rc = cudaMemcpy(y, d_y, sizeof y, cudaMemcpyDeviceToHost);
        if (!rc) err[terms] = worst_error(&A, x, NULL, y, T);
    }
    CHECK_MSG(!rc, "CUDA: %s", cudaGetErrorString(rc));
    CHECK_MSG(err[2] > 5e-6 && err[3] < err[2] / 3, "worst errors: two terms %.3g (expected ~7.5e-6), three %.3g", err[2],
              err[3]);
    cudaFree(d_x); cudaFree(d_y);
    dev_mat_free(&A);
}

static void demo_prompt(int32_t *ids, int32_t n, int32_t vocab) {
    uint32_t s = 7;
    for (int32_t i = 0; i < n; i++) { s = s * 1664525u + 1013904223u; ids[i] = (int32_t)((s >> 8) % (uint32_t)vocab); }
}

/* The demo model through a BFP4 cache (qwen35 prepare's default policy). */
TEST(cuda, bfp4_cache_matches_the_reference) {
    if (no_device("bfp4_cache_matches_the_reference")) return;
    char out[1200];
    snprintf(out, sizeof out, "%s/cache", q35_test_tmpdir());
    char src[1200];
    snprintf(src, sizeof src, "%s/../../models/qwen35-demo", q35_test_data_dir());
    q35_prepare_params pp = {.checkpoint = src, .out_dir = out, .policy = Q35_POLICY_DEFAULT};
    q35_error err = {0};
    REQUIRE_MSG(!q35_prepare(&pp, &err), "prepare: %s", err.msg);
    q35_engine *ec = load_on(out, "cuda"), *er = load_on(out, "ref");
    REQUIRE(ec && er);
    const int32_t V = q35_engine_info(ec)->vocab_size, N = 40;
    int32_t ids[40];
    demo_prompt(ids, N, V);
    float *a = malloc(sizeof(float) * (size_t)V * N), *b = malloc(sizeof(float) * (size_t)V * N);
    q35_session *sc = new_session(ec), *sr = new_session(er);
    if (sc && sr) {
        CHECK(!q35_session_eval(sc, ids, N, a, Q35_EVAL_ALL_LOGITS, &err));
        CHECK(!q35_session_eval(sr, ids, N, b, Q35_EVAL_ALL_LOGITS, &err));
        for (int32_t p = 0; p < N; p++) {
            double d = rel_max_diff(a + (size_t)p * V, b + (size_t)p * V, (size_t)V);
            CHECK_MSG(d <= PATH_TOL, "position %d: %.3g from the ref backend", p, d);
        }
    }
    q35_session_free(sc); q35_session_free(sr);
    q35_engine_free(ec); q35_engine_free(er);
    free(a); free(b);
}

/* Snapshot / restore, rewind, batch against single, and repeats: all bit for bit. */
TEST(cuda, snapshots_rewinds_batches_and_repeats_are_exact) {
    if (no_device("snapshots_rewinds_batches_and_repeats_are_exact")) return;
    q35_engine *e = load_on(q35_test_path("models/tiny-b"), "cuda");
    REQUIRE(e);
    const int32_t V = q35_engine_info(e)->vocab_size;
    const size_t row = sizeof(float) * (size_t)V;
    int32_t ids[24];
    demo_prompt(ids, 24, V);
    float *a = malloc(row * 4), *b = malloc(row * 4);
    q35_error err = {0};
    q35_session *s = new_session(e), *t = new_session(e);
    REQUIRE(s && t);
    /* snapshot at 16, continue 4 tokens; restore and continue again */
    CHECK(!q35_session_eval(s, ids, 16, NULL, 0, &err));
    q35_snapshot *snap = NULL;
    REQUIRE_MSG(!q35_snapshot_take(s, &snap, &err), "%s", err.msg);
    CHECK(!q35_session_eval(s, ids + 16, 4, a, Q35_EVAL_ALL_LOGITS, &err));
    CHECK(!q35_snapshot_restore(t, snap, &err));
    CHECK(!q35_session_eval(t, ids + 16, 4, b, Q35_EVAL_ALL_LOGITS, &err));
    CHECK_MSG(!memcmp(a, b, row * 4), "restored snapshot differs");
    /* repeat: the same prompt from scratch twice */
    q35_session_reset(s); q35_session_reset(t);
    CHECK(!q35_session_eval(s, ids, 20, a, 0, &err));
    CHECK(!q35_session_eval(t, ids, 20, b, 0, &err));
    CHECK_MSG(!memcmp(a, b, row), "a repeat differs");
    /* batch == single: one decode step of both sessions together and alone */
    q35_session *both[2] = {s, t};
    int32_t next[2] = {ids[20], ids[21]};
    CHECK(!q35_batch_decode(both, next, 2, a, &err));
    q35_session_free(t);
    t = new_session(e);
    CHECK(!q35_session_eval(t, ids, 20, NULL, 0, &err));
    CHECK(!q35_session_eval(t, next + 1, 1, b, 0, &err));
    CHECK_MSG(!memcmp(a + V, b, row), "a batch row differs from the same row alone");
    /* rewind: 3 rewindable rows, keep 1, then the next token = plain decode */
    q35_session_reset(s); q35_session_reset(t);
    CHECK(!q35_session_set_spec(s, 2, &err));
    CHECK(!q35_session_eval(s, ids, 10, NULL, 0, &err));
    CHECK(!q35_session_eval(s, ids + 10, 3, NULL, Q35_EVAL_REWINDABLE, &err));
    CHECK(!q35_session_rewind(s, 1, &err));
    CHECK(!q35_session_eval(s, ids + 11, 1, a, Q35_EVAL_RECURRENT, &err));
    CHECK(!q35_session_eval(t, ids, 10, NULL, 0, &err));
    CHECK(!q35_session_eval(t, ids + 10, 2, b, Q35_EVAL_RECURRENT, &err));
    CHECK_MSG(!memcmp(a, b, row), "after a rewind the next row differs from plain decode");
    q35_snapshot_free(snap);
    q35_session_free(s); q35_session_free(t);
    q35_engine_free(e);
    free(a); free(b);
}
#endif
