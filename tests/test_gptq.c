/* Tests of src/formats/gptq.c: the calibrated BFP encoder. What it must do:
 * with no coupling between inputs it is the plain encoder; with real
 * correlated inputs the outputs move less than under the plain encoder;
 * its bytes depend neither on threads nor on how rows are chunked; the
 * factor really is the Cholesky factor of the damped inverse; bad input
 * fails cleanly. */
#include "formats/gptq.h"
#include "formats/bfp.h"
#include "test.h"
#include "base/util.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static double rng_unit(void) { /* uniform in [-1, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 4503599627370496.0 - 1.0;
}

/* n_tok input rows of width n whose inputs are correlated (a shared
 * component plus noise) and of very different sizes, as activations are. */
static float *make_inputs(int64_t n_tok, int64_t n) {
    float *x = malloc((size_t)(n_tok * n) * sizeof *x);
    for (int64_t t = 0; t < n_tok; t++) {
        double common = rng_unit();
        for (int64_t k = 0; k < n; k++) {
            double scale = 0.2 + 3.0 * (double)((k * 7) % n) / (double)n;
            x[t * n + k] = (float)(scale * (0.8 * common + 0.6 * rng_unit()));
        }
    }
    return x;
}

static double *gram(const float *x, int64_t n_tok, int64_t n) {
    double *H = calloc((size_t)(n * n), sizeof *H);
    for (int64_t t = 0; t < n_tok; t++)
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = i; j < n; j++) H[i * n + j] += (double)x[t * n + i] * x[t * n + j];
    return H;
}

static float *make_weights(int64_t rows, int64_t n) {
    float *w = malloc((size_t)(rows * n) * sizeof *w);
    for (int64_t i = 0; i < rows * n; i++) w[i] = (float)(0.05 * rng_unit());
    return w;
}

/* sum over rows and tokens of (x . (w - q))^2 for a packed q */
static double output_error(q35_dtype dt, const void *q, const float *w, const float *x, int64_t rows, int64_t n,
                           int64_t n_tok) {
    float *row = malloc((size_t)n * sizeof *row);
    double e = 0;
    for (int64_t r = 0; r < rows; r++) {
        q35_bfp_get_row(dt, q, n, r, row);
        for (int64_t t = 0; t < n_tok; t++) {
            double d = 0;
            for (int64_t k = 0; k < n; k++) d += (double)x[t * n + k] * ((double)w[r * n + k] - row[k]);
            e += d * d;
        }
    }
    free(row);
    return e;
}

TEST(gptq, uncoupled_inputs_give_the_plain_encoder) {
    /* H diagonal: no error can move to another input, so every code is the
     * plain encoder's under the exponent it would choose (with and without
     * the exponent search), whatever the coding order. */
    const int64_t rows = 35, n = 64;
    float *w = make_weights(rows, n);
    for (int flags = 0; flags <= (int)Q35_BFP_EXP_SEARCH; flags += (int)Q35_BFP_EXP_SEARCH) {
        for (int dt = Q35_DT_BFP8; dt <= Q35_DT_BFP4; dt++) {
            double *H = calloc((size_t)(n * n), sizeof *H);
            for (int64_t k = 0; k < n; k++) H[k * n + k] = 1.0 + (double)((k * 13) % 7); /* an order that permutes */
            q35_gptq g;
            q35_error err = {0};
            REQUIRE(q35_gptq_make(H, n, Q35_GPTQ_DAMP, 1, 1, &g, &err) == Q35_OK);
            CHECK(g.perm != NULL && g.perm[0] != 0);
            size_t nb = q35_bfp_tensor_bytes((q35_dtype)dt, rows, n);
            uint8_t *a = malloc(nb), *b = malloc(nb);
            REQUIRE(q35_bfp_pack_gptq((q35_dtype)dt, a, w, rows, n, &g, (unsigned)flags, 1, &err) == Q35_OK);
            REQUIRE(q35_bfp_pack_matrix((q35_dtype)dt, b, nb, w, Q35_DT_F32, rows, n, (unsigned)flags, &err) == Q35_OK);
            CHECK_MSG(!memcmp(a, b, nb), "dtype %d flags %d: the calibrated bytes differ from the plain encoder's", dt,
                      flags);
            free(a);
            free(b);
            q35_gptq_free(&g);
        }
    }
    free(w);
}

TEST(gptq, outputs_move_less_than_under_the_plain_encoder) {
    const int64_t rows = 48, n = 128, n_tok = 600;
    float *x = make_inputs(n_tok, n), *w = make_weights(rows, n);
    for (int dt = Q35_DT_BFP8; dt <= Q35_DT_BFP4; dt++) {
        for (int order = 0; order <= 1; order++) {
            q35_gptq g;
            q35_error err = {0};
            REQUIRE(q35_gptq_make(gram(x, n_tok, n), n, Q35_GPTQ_DAMP, order, 2, &g, &err) == Q35_OK);
            size_t nb = q35_bfp_tensor_bytes((q35_dtype)dt, rows, n);
            uint8_t *a = malloc(nb), *b = malloc(nb);
            REQUIRE(q35_bfp_pack_gptq((q35_dtype)dt, a, w, rows, n, &g, Q35_BFP_EXP_SEARCH, 1, &err) == Q35_OK);
            REQUIRE(q35_bfp_pack_matrix((q35_dtype)dt, b, nb, w, Q35_DT_F32, rows, n, Q35_BFP_EXP_SEARCH, &err) == Q35_OK);
            double eg = output_error((q35_dtype)dt, a, w, x, rows, n, n_tok);
            double ep = output_error((q35_dtype)dt, b, w, x, rows, n, n_tok);
            /* measured: 0.32-0.39 of the plain error on these inputs */
            CHECK_MSG(eg < 0.6 * ep, "dtype %d order %d: output error %.4g calibrated vs %.4g plain", dt, order, eg, ep);
            free(a);
            free(b);
            q35_gptq_free(&g);
        }
    }
    free(x);
    free(w);
}

TEST(gptq, bytes_do_not_depend_on_threads_or_chunks) {
    const int64_t rows = 16 * 5 + 3, n = 96, n_tok = 200;
    float *x = make_inputs(n_tok, n), *w = make_weights(rows, n);
    q35_gptq g;
    q35_error err = {0};
    REQUIRE(q35_gptq_make(gram(x, n_tok, n), n, Q35_GPTQ_DAMP, 1, 1, &g, &err) == Q35_OK);
    size_t nb = q35_bfp_tensor_bytes(Q35_DT_BFP4, rows, n), first = q35_bfp_tensor_bytes(Q35_DT_BFP4, 64, n);
    uint8_t *one = malloc(nb), *three = malloc(nb), *chunks = malloc(nb);
    REQUIRE(q35_bfp_pack_gptq(Q35_DT_BFP4, one, w, rows, n, &g, Q35_BFP_EXP_SEARCH, 1, &err) == Q35_OK);
    REQUIRE(q35_bfp_pack_gptq(Q35_DT_BFP4, three, w, rows, n, &g, Q35_BFP_EXP_SEARCH, 3, &err) == Q35_OK);
    /* two chunks of whole groups of panels, as the cache writer cuts a large tensor */
    REQUIRE(q35_bfp_pack_gptq(Q35_DT_BFP4, chunks, w, 64, n, &g, Q35_BFP_EXP_SEARCH, 2, &err) == Q35_OK);
    REQUIRE(q35_bfp_pack_gptq(Q35_DT_BFP4, chunks + first, w + 64 * n, rows - 64, n, &g, Q35_BFP_EXP_SEARCH, 1, &err) ==
            Q35_OK);
    CHECK(!memcmp(one, three, nb));
    CHECK(!memcmp(one, chunks, nb));
    free(one);
    free(three);
    free(chunks);
    free(x);
    free(w);
    q35_gptq_free(&g);
}

TEST(gptq, factor_is_the_cholesky_factor_of_the_damped_inverse) {
    const int64_t n = 40, n_tok = 90;
    float *x = make_inputs(n_tok, n);
    for (int64_t t = 0; t < n_tok; t++) x[t * n + 7] = 0; /* an input that never moves */
    double *H = gram(x, n_tok, n), *Hf = malloc((size_t)(n * n) * sizeof *Hf);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++) Hf[i * n + j] = i <= j ? H[i * n + j] : H[j * n + i];
    q35_gptq g;
    q35_error err = {0};
    REQUIRE(q35_gptq_make(H, n, Q35_GPTQ_DAMP, 1, 1, &g, &err) == Q35_OK);
    /* what the factor stands for: the dead input gets 1 and no coupling, then damping */
    for (int64_t j = 0; j < n; j++) Hf[7 * n + j] = Hf[j * n + 7] = 0;
    Hf[7 * n + 7] = 1;
    double mean = 0;
    for (int64_t i = 0; i < n; i++) mean += Hf[i * n + i];
    mean /= (double)n;
    for (int64_t i = 0; i < n; i++) Hf[i * n + i] += Q35_GPTQ_DAMP * mean;
    /* (U^T U) (P Hd P^T) = I, and the order is by decreasing diagonal */
    double worst = 0;
    for (int64_t i = 0; i < n; i++) {
        if (i) CHECK(Hf[g.perm[i - 1] * n + g.perm[i - 1]] >= Hf[g.perm[i] * n + g.perm[i]]);
        for (int64_t j = 0; j < i; j++) CHECK(g.U[i * n + j] == 0);
        for (int64_t j = 0; j < n; j++) {
            double s = 0;
            for (int64_t k = 0; k < n; k++) {
                double utu = 0;
                for (int64_t m = 0; m < n; m++) utu += g.U[m * n + i] * g.U[m * n + k];
                s += utu * Hf[(int64_t)g.perm[k] * n + g.perm[j]];
            }
            double d = fabs(s - (i == j ? 1.0 : 0.0));
            if (d > worst) worst = d;
        }
    }
    CHECK_MSG(worst < 1e-9, "|U^T U H - I| = %g", worst);
    free(Hf);
    free(x);
    q35_gptq_free(&g);
}

TEST(gptq, bad_input_fails_cleanly) {
    q35_error err = {0};
    q35_gptq g;
    /* not positive definite however damped: a negative diagonal */
    double H[4] = {-5, 0, 0, -5};
    CHECK(q35_gptq_make(H, 2, Q35_GPTQ_DAMP, 0, 1, &g, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "not positive definite") != NULL);
    CHECK(g.U == NULL && g.perm == NULL);
    /* a non-finite diagonal (inputs that overflowed) is named as such */
    double Hn[4] = {NAN, 0, 0, 1};
    CHECK(q35_gptq_make(Hn, 2, Q35_GPTQ_DAMP, 0, 1, &g, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "not finite") != NULL);
    /* a width the block format cannot hold (40), and a factor of another width (48 for 32) */
    double *I = calloc(40 * 40, sizeof *I);
    for (int k = 0; k < 40; k++) I[k * 40 + k] = 1;
    REQUIRE(q35_gptq_make(I, 40, Q35_GPTQ_DAMP, 0, 1, &g, &err) == Q35_OK);
    float w[48] = {0};
    uint8_t dst[1024];
    CHECK(q35_bfp_pack_gptq(Q35_DT_BFP4, dst, w, 1, 40, &g, 0, 1, &err) == Q35_ERR_ARG);
    q35_gptq_free(&g);
    I = calloc(32 * 32, sizeof *I);
    for (int k = 0; k < 32; k++) I[k * 32 + k] = 1;
    REQUIRE(q35_gptq_make(I, 32, Q35_GPTQ_DAMP, 0, 1, &g, &err) == Q35_OK);
    CHECK(q35_bfp_pack_gptq(Q35_DT_BFP4, dst, w, 1, 48, &g, 0, 1, &err) == Q35_ERR_ARG);
    CHECK(q35_bfp_pack_gptq(Q35_DT_BF16, dst, w, 1, 32, &g, 0, 1, &err) == Q35_ERR_ARG);
    q35_gptq_free(&g);
}

TEST(gptq, damping_rises_until_the_factorization_holds) {
    /* not positive definite as it stands (off-diagonal 1.05 > 1) nor damped by 0.01 of the mean diagonal,
     * positive definite damped by 0.1: the factor must be that of H + 0.1 I */
    double *H = malloc(4 * sizeof *H);
    H[0] = 1, H[1] = 1.05, H[2] = 1.05, H[3] = 1;
    q35_gptq g;
    q35_error err = {0};
    REQUIRE(q35_gptq_make(H, 2, Q35_GPTQ_DAMP, 0, 1, &g, &err) == Q35_OK);
    double a = 1.1, b = 1.05, det = a * a - b * b; /* (H + 0.1 I)^-1 = [a -b; -b a] / det */
    double inv[4] = {a / det, -b / det, -b / det, a / det}, worst = 0;
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 2; j++) {
            double utu = 0;
            for (int m = 0; m < 2; m++) utu += g.U[m * 2 + i] * g.U[m * 2 + j];
            if (fabs(utu - inv[i * 2 + j]) > worst) worst = fabs(utu - inv[i * 2 + j]);
        }
    CHECK_MSG(worst < 1e-12, "U^T U is %g away from (H + 0.1 I)^-1", worst);
    q35_gptq_free(&g);
}

TEST(gptq, the_factor_does_not_depend_on_threads) {
    /* 1000 inputs: the middle of the factorization and the first third of the inverse are split over the
     * threads (steps of more than 2e5 multiply-adds) */
    const int64_t n = 1000, n_tok = 300;
    float *x = make_inputs(n_tok, n);
    double *H = gram(x, n_tok, n);
    double *H2 = malloc((size_t)(n * n) * sizeof *H2);
    memcpy(H2, H, (size_t)(n * n) * sizeof *H2);
    q35_gptq a, b;
    q35_error err = {0};
    REQUIRE(q35_gptq_make(H, n, Q35_GPTQ_DAMP, 1, 1, &a, &err) == Q35_OK);
    REQUIRE(q35_gptq_make(H2, n, Q35_GPTQ_DAMP, 1, 3, &b, &err) == Q35_OK);
    CHECK(!memcmp(a.U, b.U, (size_t)(n * n) * sizeof *a.U));
    CHECK(!memcmp(a.perm, b.perm, (size_t)n * sizeof *a.perm));
    q35_gptq_free(&a);
    q35_gptq_free(&b);
    free(x);
}
