/* Tests of the CUDA backend.
 *
 * cuda_layout: its host-side arithmetic (backend/cuda/layout.h), in every
 * build, no GPU needed: the device images of weights decode to the cache's
 * values, the state and scratch layouts, the configuration checks.
 *
 * cuda (CUDA=1 builds only, test_cuda_device.c): the backend against the reference backend and
 * the transformers goldens. Without a device each test prints
 * "skipped: no CUDA device" and passes; that is the only way one passes
 * without running.
 *
 * Tolerances. The reference backend sums every dot product in double from
 * exactly decoded weights; the cuda kernels sum the same products in fp32
 * (fmaf), each lane over n/32 terms in order and then a 5-level butterfly.
 * One such sum is off by at most about (n/32 + 5) * 2^-24 * sum |w x|,
 * 1.4e-6 of sum |w x| at n = 384 (the test models' widest input), and
 * norms, softmax and the recurrence add float roundings of the same size
 * per layer. The CPU backend's float-FMA kernels differ from the reference
 * in exactly this way and the suite holds them to PATH_TOL = 2e-5 of the
 * largest logit (test_backend.c); the cuda backend is held to the same
 * bound, and to the transformers goldens' LOGIT_TOL = 1e-4 as every backend. */
#include "backend/cuda/layout.h"
#include "backend/cuda/matvec.h"
#include "formats/bfp.h"
#include "formats/cache.h"
#include "golden.h"
#include "qwen35.h"
#include "test.h"

#include <math.h>
#include <stdint.h>

#define LOGIT_TOL 1e-4
#define PATH_TOL 2e-5

static uint32_t rng_next(uint32_t *s) { *s = *s * 1664525u + 1013904223u; return *s; }
static float rng_f(uint32_t *s) { return ((float)(rng_next(s) >> 8) / 16777216.0f - 0.5f) * 4.0f; }

static void check_bfp_image(q35_dtype dt, int64_t n_out, int64_t n_in) {
    uint32_t seed = 12345u + (uint32_t)dt;
    float *src = malloc(sizeof(float) * (size_t)(n_out * n_in));
    for (int64_t i = 0; i < n_out * n_in; i++) src[i] = rng_f(&seed) * (i % 7 == 0 ? 100.0f : 1.0f);
    size_t bytes = q35_bfp_tensor_bytes(dt, n_out, n_in);
    void *packed = malloc(bytes);
    q35_error err = {0};
    REQUIRE_MSG(!q35_bfp_pack_matrix(dt, packed, bytes, src, Q35_DT_F32, n_out, n_in, 0, &err), "%s", err.msg);
    q35_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {n_out, n_in}, .data = packed, .nbytes = bytes};
    q35_cuda_mat_layout L;
    REQUIRE(!q35_cuda_mat_layout_of(&t, &L, &err));
    CHECK(L.pitch % 16 == 0 && L.exp_pitch % 16 == 0 && L.exp_offset % 256 == 0);
    CHECK(L.exp_offset >= L.pitch * (size_t)n_out && L.bytes == L.exp_offset + L.exp_pitch * (size_t)n_out);
    uint8_t *img = calloc(1, L.bytes);
    /* in two pieces, as the upload does */
    int64_t mid = n_out / 3;
    q35_cuda_mat_pack_rows(&t, &L, 0, mid, img, img + L.exp_offset);
    q35_cuda_mat_pack_rows(&t, &L, mid, n_out, img + (size_t)mid * L.pitch, img + L.exp_offset + (size_t)mid * L.exp_pitch);
    /* the upload's threaded packing gives the same bytes */
    uint8_t *par = malloc(L.bytes);
    memset(par, 0xa5, L.bytes);
    memset(par + L.pitch * (size_t)n_out, 0, L.exp_offset - L.pitch * (size_t)n_out); /* the gap nobody writes */
    q35_cuda_mat_pack_rows_par(&t, &L, 0, n_out, par, par + L.exp_offset, 5);
    CHECK_MSG(!memcmp(par, img, L.bytes), "%s: 5 threads packed other bytes", q35_dtype_name(dt));
    free(par);
    int bad = 0;
    for (int64_t r = 0; r < n_out && bad < 5; r++)
        for (int64_t i = 0; i < n_in && bad < 5; i++) {
            float want = q35_bfp_get(dt, packed, n_in, r, i), got = q35_cuda_mat_get(&L, img, r, i);
            if (memcmp(&want, &got, 4)) { bad++; CHECK_MSG(0, "%s (%lld, %lld): %g, the cache holds %g", q35_dtype_name(dt), (long long)r, (long long)i, got, want); }
        }
    free(img); free(packed); free(src);
}

TEST(cuda_layout, bfp_images_decode_to_the_cache_values) {
    check_bfp_image(Q35_DT_BFP4, 37, 96);   /* a partial panel, and a partial 32-value chunk per row */
    check_bfp_image(Q35_DT_BFP8, 37, 96);
    check_bfp_image(Q35_DT_BFP4, 64, 256);
    check_bfp_image(Q35_DT_BFP8, 16, 16);
}

TEST(cuda_layout, float_images_keep_values_and_pad_rows) {
    uint16_t bf[3 * 260];
    for (int i = 0; i < 3 * 260; i++) bf[i] = (uint16_t)(0x3f80 + i);
    q35_tensor t = {.name = "b", .dtype = Q35_DT_BF16, .ndim = 2, .shape = {3, 260}, .data = bf, .nbytes = sizeof bf};
    q35_cuda_mat_layout L;
    q35_error err = {0};
    REQUIRE(!q35_cuda_mat_layout_of(&t, &L, &err));
    CHECK_EQ_INT(L.pitch, 1024); /* two windows of 256 values */
    CHECK_EQ_INT(L.bytes, 3 * 1024);
    uint8_t *img = malloc(L.bytes);
    memset(img, 0xff, L.bytes);
    q35_cuda_mat_pack_rows(&t, &L, 0, 3, img, NULL);
    for (int r = 0; r < 3; r++)
        for (int i = 0; i < 260; i++) CHECK(q35_cuda_mat_get(&L, img, r, i) == q35_bf16_to_f32(bf[r * 260 + i]));
    CHECK(img[512] == (bf[256] & 0xff) && img[513] == bf[256] >> 8); /* value 256 of row 0 opens the second window */
    int zero = 1; /* lane 1 onwards of the second window is padding */
    for (int i = 512 + 16; i < 1024; i++) zero &= img[i] == 0;
    CHECK(zero);
    free(img);
    q35_tensor bad = {.name = "x", .dtype = Q35_DT_BFP4, .ndim = 2, .shape = {4, 24}};
    CHECK(q35_cuda_mat_layout_of(&bad, &L, &err) == Q35_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "x: 24 inputs"), "message: %s", err.msg);
    q35_tensor odd = {.name = "y", .dtype = Q35_DT_F32, .ndim = 2, .shape = {4, 6}};
    CHECK(q35_cuda_mat_layout_of(&odd, &L, &err) == Q35_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "y: 6 inputs, not a multiple of 4"), "message: %s", err.msg);
}

/* The matmul kernel's per-lane code (matvec.h), run here for all 32 lanes
 * of every row with the kernel's butterfly, against a double-precision sum
 * over the cache's values: the image layout, the decoding and the indexing
 * the GPU runs, at partial windows, several input rows and tiny scales. */
static void check_matvec(q35_dtype dt, int64_t n_out, int64_t n_in, int nt) {
    uint32_t seed = 777u + (uint32_t)(dt * 131 + n_in);
    const size_t n = (size_t)(n_out * n_in);
    float *src = malloc(sizeof(float) * n), *x = malloc(sizeof(float) * (size_t)nt * (size_t)n_in);
    for (size_t i = 0; i < n; i++) src[i] = rng_f(&seed) * (i % 5 == 0 ? 30.0f : 1.0f) * (i / (size_t)n_in == 1 ? 1e-37f : 1.0f);
    for (size_t i = 0; i < (size_t)nt * (size_t)n_in; i++) x[i] = rng_f(&seed);
    void *data = src;
    size_t bytes = n * 4;
    uint16_t *h = NULL;
    q35_error err = {0};
    if (dt == Q35_DT_BF16 || dt == Q35_DT_F16) {
        h = malloc(2 * n);
        for (size_t i = 0; i < n; i++) h[i] = dt == Q35_DT_BF16 ? q35_f32_to_bf16(src[i]) : q35_f32_to_f16(src[i]);
        data = h, bytes = 2 * n;
    } else if (dt != Q35_DT_F32) {
        bytes = q35_bfp_tensor_bytes(dt, n_out, n_in);
        data = malloc(bytes);
        REQUIRE_MSG(!q35_bfp_pack_matrix(dt, data, bytes, src, Q35_DT_F32, n_out, n_in, 0, &err), "%s", err.msg);
    }
    q35_tensor t = {.name = "w", .dtype = dt, .ndim = 2, .shape = {n_out, n_in}, .data = data, .nbytes = bytes};
    q35_cuda_mat_layout L;
    REQUIRE_MSG(!q35_cuda_mat_layout_of(&t, &L, &err), "%s", err.msg);
    uint8_t *img = calloc(1, L.bytes);
    q35_cuda_mat_pack_rows(&t, &L, 0, n_out, img, L.exp_pitch ? img + L.exp_offset : NULL);
    const int vals = q35_cu_vals(dt), nw = (int)(L.pitch / Q35_CU_WINDOW_BYTES);
    int bad = 0;
    for (int64_t o = 0; o < n_out; o++) {
        float lanes[32][8] = {{0}};
        for (int l = 0; l < 32; l++)
            for (int w = 0; w < nw; w++) {
                uint32_t q[4], ex[2] = {0, 0};
                memcpy(q, img + (size_t)o * L.pitch + (size_t)w * Q35_CU_WINDOW_BYTES + (size_t)l * Q35_CU_CHUNK, 16);
                if (L.exp_pitch)
                    memcpy(ex, img + L.exp_offset + (size_t)o * L.exp_pitch + (size_t)w * (32 * vals / 16) + (size_t)(l / 4) * (vals / 4),
                           (size_t)vals / 4);
                q35_cu_lane_window(dt, q, ex, x, (int32_t)n_in, w, l, nt, 8, lanes[l]);
            }
        for (int off = 16; off; off >>= 1) { /* the kernel's butterfly: every lane ends with the same sum */
            float next[32][8];
            for (int l = 0; l < 32; l++)
                for (int tt = 0; tt < nt; tt++) next[l][tt] = lanes[l][tt] + lanes[l ^ off][tt];
            memcpy(lanes, next, sizeof lanes);
        }
        for (int tt = 0; tt < nt; tt++) {
            double want = 0, mag = 0;
            for (int64_t i = 0; i < n_in; i++) {
                double p = (double)q35_cuda_mat_get(&L, img, o, i) * x[(size_t)tt * (size_t)n_in + (size_t)i];
                want += p, mag += fabs(p);
            }
            const double d = fabs(lanes[0][tt] - want);
            if (!(d <= 1e-5 * mag) && bad++ < 5)
                CHECK_MSG(0, "%s %lldx%lld row %lld input %d: %.9g, want %.9g (|w x| sum %.3g)", q35_dtype_name(dt),
                          (long long)n_out, (long long)n_in, (long long)o, tt, lanes[0][tt], want, mag);
        }
    }
    if (data != src && data != h) free(data);
    free(img); free(h); free(src); free(x);
}

TEST(cuda_layout, the_kernels_lane_code_computes_the_matrix_product) {
    const q35_dtype dts[] = {Q35_DT_BFP4, Q35_DT_BFP8, Q35_DT_BF16, Q35_DT_F16, Q35_DT_F32};
    for (size_t d = 0; d < sizeof dts / sizeof dts[0]; d++) {
        check_matvec(dts[d], 5, 64, 1);    /* less than one window */
        check_matvec(dts[d], 3, 1040, 3);  /* whole windows and a partial one */
        check_matvec(dts[d], 2, 4096, 8);  /* the 9B's width: 4 windows of BFP4 (the kernel's 4 loads at a time) */
        check_matvec(dts[d], 2, 5120 + 16, 2);
    }
}

static q35_config small_config(void) {
    q35_config c = {0};
    c.vocab_size = 320; c.hidden_size = 64; c.intermediate_size = 128; c.n_layer = 4;
    c.n_head = 4; c.n_head_kv = 2; c.head_dim = 24; c.rotary_dim = 12;
    c.lin_n_head_k = 2; c.lin_n_head_v = 4; c.lin_head_k_dim = 16; c.lin_head_v_dim = 24; c.lin_conv_kernel = 4;
    c.layer_is_full[3] = 1; c.n_layer_full = 1;
    return c;
}

TEST(cuda_layout, states_and_scratch_are_laid_out_disjoint) {
    q35_config c = small_config();
    q35_cuda_state_layout L;
    q35_cuda_state_layout_of(&c, 100, &L);
    const size_t CD = 2 * 2 * 16 + 4 * 24;
    CHECK_EQ_INT(L.conv_floats, CD * 3);
    CHECK_EQ_INT(L.ssm_floats, 4 * 16 * 24);
    CHECK_EQ_INT(L.rec_floats, 3 * (CD * 3 + 4 * 16 * 24));
    CHECK_EQ_INT(L.kv_layer_floats, 2 * 100 * 48);
    CHECK_EQ_INT(L.total_floats, L.rec_floats + L.kv_layer_floats);
    CHECK_EQ_INT(q35_cuda_kind_index(&c, 2), 2);
    CHECK_EQ_INT(q35_cuda_kind_index(&c, 3), 0);
    q35_cuda_scratch_layout S;
    q35_cuda_scratch_layout_of(&c, 128, 1, &S);
    size_t offs[] = {S.x, S.xn, S.tmp, S.gate, S.up, S.qg, S.k, S.v, S.o, S.raw, S.y, S.z, S.core, S.bb, S.aa,
                     S.mtp_u, S.mtp_un, S.mtp_cat, S.logits, S.total};
    size_t need[] = {128 * 64, 128 * 64, 128 * 64, 128 * 128, 128 * 128, 128 * 2 * 96, 128 * 48, 128 * 48, 128 * 96,
                     128 * CD, 128 * CD, 128 * 96, 128 * 96, 128 * 4, 128 * 4, 128 * 64, 128 * 64, 128 * 128, 128 * 320};
    for (size_t i = 0; i + 1 < sizeof offs / sizeof offs[0]; i++) {
        CHECK_MSG(offs[i] % 64 == 0, "field %zu at %zu", i, offs[i]);
        CHECK_MSG(offs[i + 1] >= offs[i] + need[i], "field %zu: %zu floats at %zu, the next at %zu", i, need[i], offs[i], offs[i + 1]);
    }
}

TEST(cuda_layout, configurations_beyond_the_kernels_are_refused) {
    q35_config c = small_config();
    q35_error err = {0};
    CHECK(q35_cuda_check_config(&c, &err) == Q35_OK);
    c.head_dim = 1024;
    CHECK(q35_cuda_check_config(&c, &err) == Q35_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "head_dim up to 512 (this model: 1024)"), "message: %s", err.msg);
    c = small_config();
    c.lin_head_k_dim = 300;
    CHECK(q35_cuda_check_config(&c, &err) == Q35_ERR_UNSUPPORTED);
    CHECK_MSG(strstr(err.msg, "linear_key_head_dim"), "message: %s", err.msg);
}
