/* Tests of src/kernels/: every fast table against the scalar reference, for
 * every weight dtype, awkward shapes, partial output ranges, extreme values
 * and n_tok = 1, 2, 3, 8, 17; results independent of batching and row
 * splits up to 64 tokens; and the start-up dispatch. */
#include "formats/bfp.h"
#include "backend/cpu/kernels/kernels.h"
#include "test.h"
#include "base/util.h"

#include <float.h>
#include <stdint.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static double rng_unit(void) { /* uniform in [-1, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

enum { MAX_FAST_TABLES = 3 };

/* The fast tables this CPU can run, in the order of preference. */
static int fast_tables(const q35_kernels **out) {
    int n = 0;
    const char *names[MAX_FAST_TABLES] = {"avx2", "avx512", "avx512bf16"};
    for (int i = 0; i < MAX_FAST_TABLES; i++)
        if (q35_kernels_find(names[i], &out[n], NULL) == Q35_OK) n++;
    return n;
}

/* Whether table k rounds x to bf16 for BF16 weights (kernels.h). */
static int rounds_x_to_bf16(const q35_kernels *k, q35_dtype dt) {
    return dt == Q35_DT_BF16 && !strcmp(k->name, "avx512bf16");
}

typedef struct weights {
    q35_tensor t;
    void *data;
} weights;

/* Random [n_out, n_in] weights in dtype dt. `extreme` scales rows and
 * 16-wide blocks by powers of two over 2^-60 .. 2^60 and zeroes some blocks
 * (and puts bfp4's stored 0 in every block). */
static int make_weights(weights *w, q35_dtype dt, int64_t n_out, int64_t n_in, int extreme) {
    float *f = malloc(sizeof(float) * (size_t)(n_out * n_in));
    if (!f) return 0;
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t i = 0; i < n_in; i += 16) {
            float s = 1.0f;
            if (extreme) {
                int k = (int)(rng_unit() * 60.0);
                s = rng_unit() < -0.8 ? 0.0f : ldexpf(1.0f, k);
            }
            for (int64_t j = i; j < i + 16 && j < n_in; j++) f[r * n_in + j] = s * (float)rng_unit();
        }
    }
    size_t nb;
    w->data = NULL;
    if (dt == Q35_DT_BFP4 || dt == Q35_DT_BFP8) {
        nb = q35_bfp_tensor_bytes(dt, n_out, n_in);
        w->data = aligned_alloc(64, (nb + 63) & ~(size_t)63);
        if (w->data && q35_bfp_pack_matrix(dt, w->data, nb, f, Q35_DT_F32, n_out, n_in, 0, NULL) != Q35_OK) {
            free(w->data);
            w->data = NULL;
        }
        /* bfp4's stored 0, -8 steps, which no code is stored as (bfp.h): every reader takes it so */
        for (int64_t r = 0; extreme && w->data && dt == Q35_DT_BFP4 && r < n_out; r++)
            for (int64_t b = 0; b < n_in / 16; b++) {
                uint8_t st[16];
                const uint8_t e = q35_bfp_get_stored(dt, w->data, n_in, r, b, st);
                st[(r + 5 * b) % 16] = 0;
                if (rng_unit() < -0.5) st[(r + 5 * b + 7) % 16] = 0;
                q35_bfp_put_stored(dt, w->data, n_in, r, b, e, st);
            }
    } else {
        size_t es = dt == Q35_DT_F32 ? 4 : 2;
        nb = es * (size_t)(n_out * n_in);
        w->data = malloc(nb);
        for (int64_t i = 0; w->data && i < n_out * n_in; i++) {
            if (dt == Q35_DT_F32) ((float *)w->data)[i] = f[i];
            else if (dt == Q35_DT_BF16) ((uint16_t *)w->data)[i] = q35_f32_to_bf16(f[i]);
            else ((uint16_t *)w->data)[i] = q35_f32_to_f16(f[i] * (extreme ? 0x1p-60f : 1.0f));
        }
    }
    free(f);
    w->t = (q35_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {n_out, n_in}, .data = w->data, .nbytes = nb};
    return w->data != NULL;
}

/* The bound stated in kernels.h for output (t, o) of table k: float
 * rounding of sum |w x|, plus for bfp weights half an int8 step of x's
 * block scale times the block's sum |w|, or for x rounded to bf16 2^-8 of
 * sum |w x| and the flushed denormals. */
static double error_bound(const q35_kernels *k, const q35_tensor *W, const float *x, const float *row, int64_t t) {
    int64_t n_in = W->shape[1];
    const float *xt = x + t * n_in;
    double sum_abs = 0.0, quant = 0.0;
    for (int64_t i = 0; i < n_in; i++) sum_abs += fabs((double)row[i] * xt[i]);
    if (rounds_x_to_bf16(k, W->dtype)) {
        double flushed = (double)n_in;
        for (int64_t i = 0; i < n_in; i++) flushed += fabs((double)row[i]) + fabs((double)xt[i]);
        return (0x1p-8 + 1e-5) * sum_abs + 0x1p-126 * flushed + 1e-37;
    }
    if (W->dtype == Q35_DT_BFP4 || W->dtype == Q35_DT_BFP8) {
        for (int64_t b = 0; b < n_in; b += 16) {
            double amax = 0.0, wsum = 0.0;
            for (int64_t i = b; i < b + 16; i++) {
                if (fabs(xt[i]) > amax) amax = fabs(xt[i]);
                wsum += fabs(row[i]);
            }
            quant += amax / 127.0 / 2.0 * wsum;
        }
    }
    return quant * 1.001 + 1e-5 * sum_abs + 1e-37;
}

/* Checks one table on one case; returns the number of bad outputs. */
static long check_case(const q35_kernels *k, const q35_tensor *W, int64_t n_tok, int64_t o0, int64_t o1,
                       int extreme, double *worst_rel) {
    int64_t n_out = W->shape[0], n_in = W->shape[1];
    float *x = malloc(sizeof(float) * (size_t)(n_tok * n_in));
    float *y = malloc(sizeof(float) * (size_t)(n_tok * n_out));
    float *y_ref = malloc(sizeof(float) * (size_t)(n_tok * n_out));
    float *row = malloc(sizeof(float) * (size_t)n_in);
    long bad = 0;
    if (!x || !y || !y_ref || !row) { bad = 1; goto done; }
    for (int64_t i = 0; i < n_tok * n_in; i++) {
        double s = extreme ? ldexp(1.0, (int)(rng_unit() * 30.0)) : 1.0;
        x[i] = (float)(s * rng_unit());
        if (extreme && i % 37 < 16) x[i] = 0.0f;
    }
    for (int64_t i = 0; i < n_tok * n_out; i++) y[i] = y_ref[i] = NAN;
    q35_matmul_ref(y_ref, W, x, n_tok, o0, o1);
    q35_kernels_matmul(k, y, W, x, n_tok, o0, o1);
    for (int64_t o = 0; o < n_out; o++) {
        q35_get_row_ref(row, W, o);
        for (int64_t t = 0; t < n_tok; t++) {
            float a = y[t * n_out + o], b = y_ref[t * n_out + o];
            if (o < o0 || o >= o1) { /* untouched */
                bad += !isnan(a);
                continue;
            }
            double bound = error_bound(k, W, x, row, t), err = fabs((double)a - b);
            if (!(err <= bound)) {
                if (bad < 3)
                    fprintf(stderr, "    %s %s [%lld,%lld] tok %lld/%lld row %lld: %.9g vs ref %.9g (bound %.3g)\n",
                            k->name, q35_dtype_name(W->dtype), (long long)n_out, (long long)n_in, (long long)t,
                            (long long)n_tok, (long long)o, a, b, bound);
                bad++;
            }
            if (bound > 0 && err / bound > *worst_rel) *worst_rel = err / bound;
        }
    }
done:
    free(x);
    free(y);
    free(y_ref);
    free(row);
    return bad;
}

static void check_dtype(q35_dtype dt, int extreme) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    int is_bfp = dt == Q35_DT_BFP4 || dt == Q35_DT_BFP8;
    /* n_in multiples of 16 but not of 64 or 256; odd n_out; one plain shape;
     * n_in large enough that n_tok = 17 spans two token chunks of the bfp
     * driver (16 tokens of q35_kernels_chunk_bytes). */
    int64_t shapes[][2] = {{37, 48}, {33, 80}, {5, 16}, {70, 272}, {48, 256}, {17, 37},
                           {19, (int64_t)q35_kernels_chunk_bytes() / 16}};
    int64_t n_toks[] = {1, 2, 3, 5, 8, 17};
    long bad = 0;
    double worst = 0.0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n_out = shapes[s][0], n_in = shapes[s][1];
        if (is_bfp && n_in % 16) continue;
        weights w;
        REQUIRE(make_weights(&w, dt, n_out, n_in, extreme));
        int64_t ranges[][2] = {{0, n_out}, {3, n_out - 2}, {16, n_out < 32 ? n_out : 32}, {n_out - 1, n_out}};
        for (int k = 0; k < n_tables; k++)
            for (size_t ti = 0; ti < sizeof n_toks / sizeof n_toks[0]; ti++)
                for (size_t ri = 0; ri < 4; ri++)
                    if (ranges[ri][0] < ranges[ri][1] &&
                        (n_in <= 4096 || (ri < 2 && (n_toks[ti] == 1 || n_toks[ti] == 17)))) /* keep it quick */
                        bad += check_case(tables[k], &w.t, n_toks[ti], ranges[ri][0], ranges[ri][1], extreme, &worst);
        free(w.data);
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(worst <= 1.0);
}

TEST(kernels, f32_matches_ref) { check_dtype(Q35_DT_F32, 0); }
TEST(kernels, f16_matches_ref) { check_dtype(Q35_DT_F16, 0); }
TEST(kernels, bf16_matches_ref) { check_dtype(Q35_DT_BF16, 0); }
TEST(kernels, bfp8_matches_ref) { check_dtype(Q35_DT_BFP8, 0); }
TEST(kernels, bfp4_matches_ref) { check_dtype(Q35_DT_BFP4, 0); }
TEST(kernels, extreme_values_match_ref) {
    check_dtype(Q35_DT_F32, 1);
    check_dtype(Q35_DT_F16, 1);
    check_dtype(Q35_DT_BF16, 1);
    check_dtype(Q35_DT_BFP8, 1);
    check_dtype(Q35_DT_BFP4, 1);
}

/* On random data the int8 activation error is far below the worst-case
 * bound: a few 1e-3 of sum |w x| at most for one output. */
TEST(kernels, bfp_typical_error) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    for (int d = 0; d < 2; d++) {
        weights w;
        REQUIRE(make_weights(&w, dts[d], 64, 1024, 0));
        float x[1024], y[64], y_ref[64], row[1024];
        for (int i = 0; i < 1024; i++) x[i] = (float)rng_unit();
        q35_matmul_ref(y_ref, &w.t, x, 1, 0, 64);
        for (int k = 0; k < n_tables; k++) {
            q35_kernels_matmul(tables[k], y, &w.t, x, 1, 0, 64);
            double worst = 0.0;
            for (int o = 0; o < 64; o++) {
                q35_get_row_ref(row, &w.t, o);
                double sum_abs = 0.0;
                for (int i = 0; i < 1024; i++) sum_abs += fabs((double)row[i] * x[i]);
                double rel = fabs((double)y[o] - y_ref[o]) / sum_abs;
                if (rel > worst) worst = rel;
            }
            CHECK_MSG(worst < 3e-3, "%s %s: worst |dy| / sum|wx| = %.3g", tables[k]->name,
                      q35_dtype_name(dts[d]), worst);
        }
        free(w.data);
    }
}

/* What every fast table computes for bfp weights (kernels.h), in scalar C:
 * x quantized per block of 16 (q = x * (127 / amax) rounded to the nearest
 * even, d = amax / 127), then per block, in block order, one FMA of the
 * block's exact dot of the weights (as the codec reads them) with q, times
 * d. The weights of a block share one power of two, so the double sum is
 * exact and, for weights of typical size, so is it as a float; the FMA's
 * product is then the tiles' dot * (2^(E - bias) * d), rounded once. */
static void bfp_exact_ref(float *y, const q35_tensor *W, const float *x, int64_t n_tok) {
    const int64_t n_out = W->shape[0], n_in = W->shape[1];
    float *row = malloc(sizeof(float) * (size_t)n_in);
    if (!row) return;
    for (int64_t o = 0; o < n_out; o++) {
        q35_get_row_ref(row, W, o);
        for (int64_t t = 0; t < n_tok; t++) {
            const float *xt = x + t * n_in;
            float acc = 0.0f;
            for (int64_t b = 0; b < n_in; b += 16) {
                float amax = 0.0f;
                for (int64_t i = b; i < b + 16; i++) amax = fabsf(xt[i]) > amax ? fabsf(xt[i]) : amax;
                const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
                double dot = 0.0;
                for (int64_t i = b; i < b + 16; i++) {
                    const float p = xt[i] * inv;
                    dot += (double)row[i] * (double)lrintf(p);
                }
                acc = fmaf((float)dot, d, acc);
            }
            y[t * n_out + o] = acc;
        }
    }
    free(row);
}

/* Each fast table's bfp products are that reference's bits, for every tile
 * (one and two tokens, the small batches, the wide path of prompts) and
 * zero blocks of x among them. Tolerance-free: a tile whose integer dot is
 * off by one unit in any block fails here, where the float reference's
 * bound above (x's rounding error) would let it pass. */
TEST(kernels, bfp_is_the_exact_integer_dot) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    /* 200 rows: three whole groups (the tiles of whole groups, two side by side) and a partial one */
    int64_t shapes[][2] = {{200, 272}, {21, 48}, {130, 1040}};
    int64_t n_toks[] = {1, 2, 3, 4, 5, 6, 8, 9, 17};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
            const int64_t n_out = shapes[s][0], n_in = shapes[s][1], max_tok = 17;
            weights w;
            REQUIRE(make_weights(&w, dts[d], n_out, n_in, 0));
            float *x = malloc(sizeof(float) * (size_t)(max_tok * n_in));
            float *y = malloc(sizeof(float) * (size_t)(max_tok * n_out));
            float *y_ref = malloc(sizeof(float) * (size_t)(max_tok * n_out));
            REQUIRE(x && y && y_ref);
            for (int64_t i = 0; i < max_tok * n_in; i++) x[i] = (i / 16) % 11 == 3 ? 0.0f : (float)rng_unit();
            for (size_t ti = 0; ti < sizeof n_toks / sizeof n_toks[0]; ti++) {
                const int64_t n_tok = n_toks[ti];
                bfp_exact_ref(y_ref, &w.t, x, n_tok);
                for (int k = 0; k < n_tables; k++) {
                    q35_kernels_matmul(tables[k], y, &w.t, x, n_tok, 0, n_out);
                    long bad = 0;
                    for (int64_t i = 0; i < n_tok * n_out; i++) bad += memcmp(&y[i], &y_ref[i], sizeof(float)) != 0;
                    CHECK_MSG(bad == 0, "%s %s [%lld, %lld] x %lld tokens: %ld outputs differ from the exact dot",
                              tables[k]->name, q35_dtype_name(dts[d]), (long long)n_out, (long long)n_in,
                              (long long)n_tok, bad);
                }
            }
            free(x);
            free(y);
            free(y_ref);
            free(w.data);
        }
}

/* y (n_tok, n_out) for x (n_tok, n_in) in three calls on row ranges split
 * at 7 and 33 (not panel-aligned, like uneven thread splits), or with
 * aligned at 64 and 80 (a whole group of four panels, then one panel: the
 * tiles that take whole groups). */
static void matmul_split(const q35_kernels *k, float *y, const q35_tensor *W, const float *x, int64_t n_tok,
                         int aligned) {
    int64_t n_out = W->shape[0], cut[4] = {0, aligned ? 64 : 7, aligned ? 80 : 33, n_out};
    for (int c = 0; c < 3; c++)
        if (cut[c] < n_out) q35_kernels_matmul(k, y, W, x, n_tok, cut[c], cut[c + 1] < n_out ? cut[c + 1] : n_out);
}

/* A token's outputs are bitwise the same alone, in a batch of every size
 * that picks a different tile or in a prompt of 64 (panel tiles and the
 * k-slice tiles of the wide path, one token chunk or two), and for any row
 * range: what batched verification, prompt processing and thread splits
 * rely on. The ranges of 93 rows hold runs of whole panels (decode takes
 * them in pairs); 130 rows split at 64 and 80 hold whole groups (decode's
 * groups side by side, the small-batch tile), weights from the encoder:
 * typical exponents, so the tiles' all-normal scale branch runs. */
TEST(kernels, batch_and_split_invariant) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    q35_dtype dts[5] = {Q35_DT_F32, Q35_DT_F16, Q35_DT_BF16, Q35_DT_BFP8, Q35_DT_BFP4};
    /* n_in = 1040 spans several k-slices of the wide bfp path, the last one
     * short; the last makes the bfp driver's token chunks 32 tokens long */
    int64_t shapes[][2] = {{45, 272}, {93, 272}, {130, 272}, {45, 1040}, {18, (int64_t)q35_kernels_chunk_bytes() / 32}};
    int64_t n_toks[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 17, 64};
    enum { max_tok = 64 };
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++) {
        int64_t n_out = shapes[s][0], n_in = shapes[s][1];
        float *x = malloc(sizeof(float) * (size_t)(max_tok * n_in));
        float *y = malloc(sizeof(float) * (size_t)(max_tok * n_out));
        float *yb = malloc(sizeof(float) * (size_t)(max_tok * n_out));
        REQUIRE(x && y && yb);
        for (int64_t i = 0; i < max_tok * n_in; i++) x[i] = (float)rng_unit();
        for (int d = 0; d < 5; d++) {
            weights w;
            REQUIRE(make_weights(&w, dts[d], n_out, n_in, 0));
            for (int k = 0; k < n_tables; k++) {
                q35_kernels_matmul(tables[k], y, &w.t, x, max_tok, 0, n_out);
                long bad = 0;
                for (size_t ti = 0; ti < sizeof n_toks / sizeof n_toks[0]; ti++) {
                    int64_t n = n_toks[ti];
                    int64_t starts[2] = {0, max_tok - n}; /* the batch's first and last tokens */
                    for (int si = 0; si < (n < max_tok ? 2 : 1); si++)
                        for (int aligned = 0; aligned < 2; aligned++) {
                            matmul_split(tables[k], yb, &w.t, x + starts[si] * n_in, n, aligned);
                            for (int64_t t = 0; t < n; t++)
                                bad += memcmp(yb + t * n_out, y + (starts[si] + t) * n_out, sizeof(float) * n_out) != 0;
                        }
                }
                CHECK_MSG(bad == 0, "%s %s [%lld,%lld]: %ld tokens differ", tables[k]->name, q35_dtype_name(dts[d]),
                          (long long)n_out, (long long)n_in, bad);
            }
            free(w.data);
        }
        free(x);
        free(y);
        free(yb);
    }
}

/* x for n_tok tokens of n_in, each token's blocks scaled by scales[t] times
 * 2^-2..2^2 at random (1e-36 exactly: the int8 scale stays subnormal). */
static void scaled_x(float *x, const float *scales, int n_tok, int n_in) {
    for (int t = 0; t < n_tok * (n_in / 16); t++) {
        float s = scales[t / (n_in / 16)];
        if (s != 1e-36f) s = ldexpf(s, (int)(rng_unit() * 3.0));
        for (int j = 0; j < 16; j++) x[16 * t + j] = s * (float)rng_unit();
    }
}

/* A raw bfp matrix (random codes), each exponent byte chosen by
 * exp_byte(panel, row, u) from a random u in 0..255; free() it. */
static uint8_t *raw_bfp(q35_dtype dt, int n_out, int n_in, int (*exp_byte)(int p, int row, int u), q35_tensor *W) {
    size_t nb = q35_bfp_tensor_bytes(dt, n_out, n_in), unit = q35_bfp_unit_bytes(dt);
    uint8_t *w = aligned_alloc(64, (nb + 63) & ~(size_t)63);
    if (!w) return NULL;
    for (size_t i = 0; i < nb; i++) w[i] = (uint8_t)(rng_unit() * 128.0 + 128.0);
    for (int p = 0; p < n_out / 16; p++) /* block i / 16, row i % 16 of panel p */
        for (int i = 0; i < n_in; i++)
            w[q35_bfp_panel_exps(dt, n_in, 16 * p) + (size_t)(i / 16) * unit + (size_t)(i % 16)] =
                (uint8_t)exp_byte(p, 16 * p + i % 16, (int)(rng_unit() * 128.0 + 128.0));
    *W = (q35_tensor){.name = "w", .dtype = dt, .ndim = 2, .shape = {n_out, n_in}, .data = w, .nbytes = nb};
    return w;
}

static int exp_by_row(int p, int row, int u) {
    return row % 4 == 0 ? 100 + u % 40 : row % 4 == 1 ? u % 9 : row % 4 == 2 ? 240 + u % 16 : u;
}

static int exp_by_panel(int p, int row, int u) {
    return p < 4 || p == 7 || p == 8 ? 100 + u % 41 : p == 4 ? u % 9 : p == 6 ? 240 + u % 16 : u;
}

/* The decode path (whole runs of panels, up to 4 tokens: bfp_gemv_tile in
 * avx512.c) against the single-panel tiles (16-row ranges), bit for bit, on
 * raw panels: random codes and exponent bytes by row (typical, 0..8 so
 * that the row scales and the products with x's scale are subnormal,
 * 240..255, any byte), x's blocks scaled per token (about 1, 1e12, a
 * subnormal int8 scale, zero). */
TEST(kernels, bfp_gemv_matches_panel_tile) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    enum { n_out = 144, n_in = 272, max_tok = 4 }; /* two whole groups of panels and one panel */
    const float scales[max_tok] = {1.0f, 1e12f, 1e-36f, 0.0f};
    float x[max_tok * n_in], y[max_tok * n_out], yp[max_tok * n_out];
    scaled_x(x, scales, max_tok, n_in);
    const q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    for (int d = 0; d < 2; d++) {
        q35_tensor W;
        uint8_t *w = raw_bfp(dts[d], n_out, n_in, exp_by_row, &W);
        REQUIRE(w);
        for (int k = 0; k < n_tables; k++)
            for (int n = 1; n <= max_tok; n++) {
                q35_kernels_matmul(tables[k], y, &W, x, n, 0, n_out);
                for (int o = 0; o < n_out; o += 16) q35_kernels_matmul(tables[k], yp, &W, x, n, o, o + 16);
                CHECK_MSG(!memcmp(y, yp, sizeof(float) * (size_t)(n * n_out)), "%s %s, %d tokens: decode path differs",
                          tables[k]->name, q35_dtype_name(dts[d]), n);
            }
        free(w);
    }
}

/* The kernels' bfp product written out, for raw panels at any exponent byte: x quantized per block of
 * 16 as the tables do (d = max|x| / 127, codes rounded to nearest even), each block's exact integer dot
 * with the stored values, then one fmaf with the rows' 2^(E - bias) times d, that product rounded once
 * (the multiply every tile's exponent add must equal). */
static void bfp_block_ref(float *y, const q35_tensor *W, const float *x, int n_tok) {
    const q35_dtype dt = W->dtype;
    const int n_out = (int)W->shape[0], n_in = (int)W->shape[1], bias = dt == Q35_DT_BFP4 ? 129 : 133;
    for (int o = 0; o < n_out; o++)
        for (int t = 0; t < n_tok; t++) {
            float acc = 0.0f;
            for (int b = 0; b < n_in / 16; b++) {
                const float *xb = x + (size_t)t * n_in + 16 * b;
                uint8_t s[16];
                const int E = q35_bfp_get_stored(dt, W->data, n_in, o, b, s);
                float amax = 0.0f;
                for (int i = 0; i < 16; i++) amax = fabsf(xb[i]) > amax ? fabsf(xb[i]) : amax;
                const float inv = amax > 0.0f ? 127.0f / amax : 0.0f, d = amax / 127.0f;
                long dot = 0;
                for (int i = 0; i < 16; i++)
                    dot += (long)q35_bfp_decode_stored(dt, (uint8_t)bias, s[i]) * lrintf(xb[i] * inv);
                acc = fmaf((float)dot, ldexpf(1.0f, E - bias) * d, acc);
            }
            y[(size_t)t * n_out + o] = acc;
        }
}

/* One call of n_tok tokens against bfp_block_ref, bit for bit (NaN matching NaN): whether it differs. */
static long call_matches_block_ref(const q35_kernels *k, const q35_tensor *W, const float *x, int n_tok, float *y,
                                   float *y_ref) {
    const int n_out = (int)W->shape[0];
    q35_kernels_matmul(k, y, W, x, n_tok, 0, n_out);
    bfp_block_ref(y_ref, W, x, n_tok);
    long bad = 0;
    for (int i = 0; i < n_tok * n_out; i++)
        bad += memcmp(&y[i], &y_ref[i], sizeof(float)) != 0 && !(isnan(y[i]) && isnan(y_ref[i]));
    CHECK_MSG(!bad, "%s %s, %d tokens: %ld outputs differ from the written-out product", k->name,
              q35_dtype_name(W->dtype), n_tok, bad);
    return bad != 0;
}

/* The decode path's scale products by the integer add of the exponents
 * (avx512.c's GEMV: bfp4 on VBMI cores, bfp8) against the single-panel tiles
 * and the product written out (bfp_block_ref), bit for bit, at the edges
 * where the add stops being exact:
 * group 0 typical exponent bytes, group 1 all 0 (row scale 2^-bias), group
 * 2 all 255, group 3 typical but for one 0 byte in its last block (the
 * add's check covers the whole group), and a last panel of any bytes. Every
 * block scale d of token 1 is 2^(bias + 1 - 127) (with group 1 the product
 * is the least normal float), of token 2 2^(bias - 127) (subnormal), of
 * token 3 1.5 * 2^(bias - 128) (with group 2 the greatest binade), of
 * token 4 twice that (past the largest float); token 5 has blocks of
 * zeros, token 6 a subnormal d, token 0 is typical. Every window of 1-4
 * tokens is one call. */
TEST(kernels, bfp_gemv_exponent_add_matches_panel_tile) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    enum { n_out = 272, n_in = 272, n_blk = n_in / 16, n_tok = 7, max_tok = 4 };
    static float x[n_tok * n_in], y[max_tok * n_out], yp[max_tok * n_out];
    const q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    long bad = 0;
    for (int d = 0; d < 2; d++) {
        const int bias = dts[d] == Q35_DT_BFP4 ? 129 : 133;
        for (int t = 0; t < n_tok; t++)
            for (int b = 0; b < n_blk; b++) {
                float *xb = x + t * n_in + 16 * b, amax = 0.0f, s = 1.0f;
                if (t == 1 || t == 2) amax = 127.0f * ldexpf(1.0f, bias - 127 + (t == 1));
                else if (t == 3 || t == 4) amax = 127.0f * ldexpf(1.5f, bias - 128 + (t == 4));
                else if (t == 5) s = b % 3 == 0 ? 0.0f : 1.0f;
                else if (t == 6) s = 1e-36f;
                for (int j = 0; j < 16; j++) xb[j] = (float)rng_unit() * (amax > 0.0f ? amax * 0.99f : s);
                if (amax > 0.0f) xb[b % 16] = b % 2 ? amax : -amax;
            }
        size_t nb = q35_bfp_tensor_bytes(dts[d], n_out, n_in), unit = q35_bfp_unit_bytes(dts[d]);
        uint8_t *w = aligned_alloc(64, (nb + 63) & ~(size_t)63);
        REQUIRE(w);
        for (size_t i = 0; i < nb; i++) w[i] = (uint8_t)(rng_unit() * 128.0 + 128.0);
        for (int p = 0; p < n_out / 16; p++)
            for (int i = 0; i < n_in; i++) { /* block i / 16, row i % 16 of panel p */
                int u = (int)(rng_unit() * 128.0 + 128.0), g = p / 4, e = 100 + u % 40;
                if (g == 1 || (g == 3 && p == 14 && i == n_in - 7)) e = 0;
                else if (g == 2) e = 255;
                else if (g == 4) e = u;
                w[q35_bfp_panel_exps(dts[d], n_in, 16 * p) + (size_t)(i / 16) * unit + (size_t)(i % 16)] = (uint8_t)e;
            }
        q35_tensor W = {.name = "w", .dtype = dts[d], .ndim = 2, .shape = {n_out, n_in}, .data = w, .nbytes = nb};
        for (int k = 0; k < n_tables; k++)
            for (int n = 1; n <= max_tok; n++)
                for (int t0 = 0; t0 + n <= n_tok; t0++) {
                    const float *xt = x + t0 * n_in;
                    q35_kernels_matmul(tables[k], y, &W, xt, n, 0, n_out);
                    for (int o = 0; o < n_out; o += 16) q35_kernels_matmul(tables[k], yp, &W, xt, n, o, o + 16);
                    long b = memcmp(y, yp, sizeof(float) * (size_t)(n * n_out)) != 0;
                    CHECK_MSG(!b, "%s %s, tokens %d..%d: decode path differs", tables[k]->name, q35_dtype_name(dts[d]),
                              t0, t0 + n - 1);
                    bad += b + call_matches_block_ref(tables[k], &W, xt, n, y, yp);
                }
        free(w);
    }
    CHECK_EQ_INT(bad, 0);
}

/* Every window of 2..max_tok consecutive tokens of x in one call against each token alone (y1, which
 * this fills), bit for bit; the windows that differ. */
static long windows_match_alone(const q35_kernels *k, const q35_tensor *W, const float *x, int max_tok, int n_in,
                                int n_out, float *y, float *y1) {
    long bad = 0;
    for (int t = 0; t < max_tok; t++) q35_kernels_matmul(k, y1 + t * n_out, W, x + t * n_in, 1, 0, n_out);
    for (int n = 2; n <= max_tok; n++)
        for (int t0 = 0; t0 + n <= max_tok; t0++) {
            q35_kernels_matmul(k, y, W, x + t0 * n_in, n, 0, n_out);
            long b = memcmp(y, y1 + t0 * n_out, sizeof(float) * (size_t)(n * n_out)) != 0;
            CHECK_MSG(!b, "%s %s, tokens %d..%d: differ from each token alone", k->name, q35_dtype_name(W->dtype),
                      t0, t0 + n - 1);
            bad += b;
        }
    return bad;
}

/* Small batches (2-8 tokens in one call: avx512.c's tokens side by side,
 * avx2.c's batch tile over whole groups) against each token alone, bit for
 * bit, on raw panels: 0-3 (a whole group: the all-normal scale branch), 7
 * and 8 typical exponent bytes (100..140), 4 bytes 0..8 (products
 * subnormal), 5 and 9 any byte, 6 bytes 240..255 (products past the largest
 * float with 2^100); x's blocks scaled
 * per token by 1, 2^100, 2^-60, 2^60, 1, 2^-100, about 1e-36 (a subnormal
 * int8 scale) and 0, and every window of 2-8 consecutive tokens (a tile
 * that made a block's scale product any other way than the multiply, an
 * integer add to the exponent say, would have to get every one of these
 * edges right). */
TEST(kernels, bfp_small_batches_match_single_tokens) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    enum { n_out = 160, n_in = 272, max_tok = 8 };
    const float scales[max_tok] = {1.0f, 0x1p100f, 0x1p-60f, 0x1p60f, 1.0f, 0x1p-100f, 1e-36f, 0.0f};
    float x[max_tok * n_in], y[max_tok * n_out], y1[max_tok * n_out];
    scaled_x(x, scales, max_tok, n_in);
    const q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    long bad = 0;
    for (int d = 0; d < 2; d++) {
        q35_tensor W;
        uint8_t *w = raw_bfp(dts[d], n_out, n_in, exp_by_panel, &W);
        REQUIRE(w);
        for (int k = 0; k < n_tables; k++) {
            bad += windows_match_alone(tables[k], &W, x, max_tok, n_in, n_out, y, y1);
            for (int n = 1; n <= max_tok; n += n < 2 ? 1 : n < 4 ? 2 : n < 5 ? 1 : 3) /* 1, 2, 4, 5, 8 */
                bad += call_matches_block_ref(tables[k], &W, x, n, y, y1);
        }
        free(w);
    }
    CHECK_EQ_INT(bad, 0);
}

/* The exponent add's edges in small batches (2-8 tokens in one call), against each token alone, bit
 * for bit: token 0's block scales d are all 2^(X - 127) (exponent field X), token 1's 1.5 * 2^(Y - 127)
 * (field Y > X), the last token's subnormal (at most 1e-36 / 127: an add would make it normal), the
 * others typical, so that the windows without the last token make their products by the add where it is
 * exact. Group 0's exponent bytes lie in [bias + 1 - X, bias + 11 - X], so that token 0's products reach
 * the least normal float; group 1 is the same but for one byte bias - X
 * in every block (a subnormal product: a tile must multiply there). Group 2's lie in [244 + bias - Y,
 * 254 + bias - Y] (token 1's products reach the greatest binade), group 3 likewise but for one byte
 * 255 + bias - Y (a product past the largest float: infinity, not an add's NaN). */
enum { EDGE_X = 100, EDGE_Y = 150 };
static int g_edge_bias;
static int exp_at_edges(int p, int row, int u) {
    const int g = p / 4, lo = g_edge_bias + 1 - EDGE_X, hi = 254 + g_edge_bias - EDGE_Y, r = row % 16;
    if (g == 1 && p % 4 == 1 && r == 5) return lo - 1;
    if (g == 3 && p % 4 == 2 && r == 9) return hi + 1;
    if (p % 4 == 0 && r == 0) return g < 2 ? lo : hi;
    return g < 2 ? lo + u % 11 : hi - u % 11;
}

TEST(kernels, bfp_small_batches_exponent_add_edges) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    enum { n_out = 256, n_in = 64, n_blk = n_in / 16, max_tok = 8 };
    static float x[max_tok * n_in], y[max_tok * n_out], y1[max_tok * n_out];
    const float ones[max_tok] = {1, 1, 1, 1, 1, 1, 1, 1};
    scaled_x(x, ones, max_tok, n_in);
    for (int t = 0; t < max_tok; t += t < 1 ? 1 : max_tok - 2) /* 0, 1 and the last */
        for (int b = 0; b < n_blk; b++) {
            const float amax = t > 1 ? 1e-36f : 127.0f * (t ? ldexpf(1.5f, EDGE_Y - 127) : ldexpf(1.0f, EDGE_X - 127));
            float *xb = x + t * n_in + 16 * b;
            for (int j = 0; j < 16; j++) xb[j] = amax * 0.99f * (float)rng_unit();
            xb[(5 * b) % 16] = b % 2 ? amax : -amax;
        }
    const q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    long bad = 0;
    for (int d = 0; d < 2; d++) {
        g_edge_bias = dts[d] == Q35_DT_BFP4 ? 129 : 133;
        q35_tensor W;
        uint8_t *w = raw_bfp(dts[d], n_out, n_in, exp_at_edges, &W);
        REQUIRE(w);
        for (int k = 0; k < n_tables; k++) {
            bad += windows_match_alone(tables[k], &W, x, max_tok, n_in, n_out, y, y1);
            static float y_ref[max_tok * n_out];
            for (int n = 1; n <= max_tok; n += n < 2 ? 1 : n < 4 ? 2 : n < 5 ? 1 : 3) /* 1, 2, 4, 5, 8 */
                bad += call_matches_block_ref(tables[k], &W, x, n, y, y_ref);
            /* the data reach the edges: token 0's outputs in group 1 tiny but not zero, token 1's in group 3 infinite */
            long inf = 0, tiny = 0;
            for (int o = 0; o < n_out; o++) {
                inf += isinf(y1[n_out + o]) && o >= 192;
                tiny += y1[o] != 0.0f && fabsf(y1[o]) < 0x1p-100f && o >= 64 && o < 128;
            }
            CHECK_MSG(inf > 0 && tiny > 0, "%s %s: %ld infinite, %ld tiny outputs", tables[k]->name,
                      q35_dtype_name(dts[d]), inf, tiny);
        }
        free(w);
    }
    CHECK_EQ_INT(bad, 0);
}

/* The wide path (prompts: more than 8 tokens, two panels at a time where
 * avx512.c can) against each token alone (the decode path), bit for bit, on
 * raw panels whose scale products sit at the edges of the normal floats:
 * panels 0-1 typical exponent bytes, 2-3 all 0 (row scale 2^-bias), 4-5 all
 * 255, 6-7 any byte (0..8, 240..255 among them), and a last half panel.
 * Token 5's blocks are near 1e12. Every block scale d of tokens 6-11 is
 * 2^(bias + 1 - 127), so with panels 2-3 the product d 2^-bias is the least
 * normal float; of tokens 12-17 2^(bias - 127): there it is subnormal.
 * Tokens 18-23 have d = 1.5 * 2^(bias - 128), so with panels 4-5 the
 * product is in the greatest binade; tokens 24-29 twice that: it overflows.
 * Tokens 30-35 have blocks of zeros or a subnormal d, and token 36 (alone in
 * its group of tokens) is as tokens 6-11 but for an infinity in one block.
 * n_in = 1040 spans three k-slices, the last one block long. Calls of all 37
 * tokens and of windows of 9-11 (below). */
TEST(kernels, bfp_wide_matches_single_tokens) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    enum { n_out = 136, n_in = 1040, n_blk = n_in / 16, n_tok = 37 };
    static float x[n_tok * n_in], y[n_tok * n_out], y1[n_tok * n_out];
    /* calls of tokens [t0, t0 + n): all of them, and windows of 9-11 typical and edge tokens, whose last
     * group of tokens is short (avx2.c takes four at a time: 1, 2 or 3 left; avx512.c six or eight, then
     * four, two and one) */
    const int windows[][2] = {{0, n_tok}, {0, 9}, {0, 10}, {0, 11}, {1, 9}, {2, 11}, {6, 10}, {6, 11}, {18, 11},
                              {20, 10}, {20, 11}, {26, 11}};
    const q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    for (int d = 0; d < 2; d++) {
        const int bias = dts[d] == Q35_DT_BFP4 ? 129 : 133;
        for (int t = 0; t < n_tok; t++)
            for (int b = 0; b < n_blk; b++) {
                float *xb = x + t * n_in + 16 * b, amax = 0.0f, s = 1.0f;
                if ((t >= 6 && t < 18) || t == 36) amax = 127.0f * ldexpf(1.0f, bias - 127 + (t < 12 || t == 36));
                else if (t >= 18 && t < 30) amax = 127.0f * ldexpf(1.5f, bias - 128 + (t >= 24));
                else if (t == 5) s = 1e12f;
                else if (t >= 30 && t < 36) s = t % 2 ? 1e-36f : b % 3 == 0 ? 0.0f : 1.0f;
                for (int j = 0; j < 16; j++) xb[j] = (float)rng_unit() * (amax > 0.0f ? amax * 0.99f : s);
                if (amax > 0.0f) xb[b % 16] = b % 2 ? amax : -amax;
                if (t == 36 && b == 40) xb[3] = INFINITY;
            }
        size_t nb = q35_bfp_tensor_bytes(dts[d], n_out, n_in), unit = q35_bfp_unit_bytes(dts[d]);
        uint8_t *w = aligned_alloc(64, (nb + 63) & ~(size_t)63);
        REQUIRE(w);
        for (size_t i = 0; i < nb; i++) w[i] = (uint8_t)(rng_unit() * 128.0 + 128.0);
        for (int p = 0; p < (n_out + 15) / 16; p++)
            for (int i = 0; i < n_blk * 16; i++) { /* block i / 16, row i % 16 of panel p */
                int u = (int)(rng_unit() * 128.0 + 128.0), row = i % 16;
                int any = row % 4 == 0 ? 100 + u % 40 : row % 4 == 1 ? u % 9 : row % 4 == 2 ? 240 + u % 16 : u;
                w[q35_bfp_panel_exps(dts[d], n_in, 16 * p) + (size_t)(i / 16) * unit + (size_t)row] =
                    (uint8_t)(p < 2 ? 100 + u % 40 : p < 4 ? 0 : p < 6 ? 255 : any);
            }
        q35_tensor W = {.name = "w", .dtype = dts[d], .ndim = 2, .shape = {n_out, n_in}, .data = w, .nbytes = nb};
        for (int k = 0; k < n_tables; k++) {
            for (int t = 0; t < n_tok; t++) q35_kernels_matmul(tables[k], y1 + t * n_out, &W, x + t * n_in, 1, 0, n_out);
            long bad = 0;
            for (size_t wi = 0; wi < sizeof windows / sizeof windows[0]; wi++) {
                const int t0 = windows[wi][0], n = windows[wi][1];
                memset(y, 0xff, sizeof y); /* NaNs: a token the call leaves unwritten fails */
                q35_kernels_matmul(tables[k], y, &W, x + t0 * n_in, n, 0, n_out);
                bad += memcmp(y, y1 + t0 * n_out, sizeof(float) * (size_t)(n * n_out)) != 0;
            }
            CHECK_MSG(bad == 0, "%s %s: %ld calls of the wide path differ from single tokens", tables[k]->name,
                      q35_dtype_name(dts[d]), bad);
        }
        free(w);
    }
}

/* x rounded to bf16 the way kernels.h says avx512bf16 does for BF16
 * weights: nearest even, denormals to zero. */
static float round_to_bf16(float f) {
    if (fabsf(f) < FLT_MIN) return 0.0f;
    uint32_t u;
    memcpy(&u, &f, 4);
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, 4);
    return f;
}

/* BF16 weights with small integer values and x on a 1/64 grid, so that
 * every product and partial sum is exact in fp32: each table's output is
 * exactly sum w x, with x rounded to bf16 (ties to even) where the table
 * says it rounds x (many x here need rounding, some are ties). n_in = 83
 * leaves a tail of 19 past 64. Denormal x count as zero there. */
TEST(kernels, bf16_x_rounding_is_exact) {
    const q35_kernels *tables[MAX_FAST_TABLES + 1] = {&q35_kernels_ref};
    int n_tables = 1 + fast_tables(tables + 1);
    enum { n_out = 6, n_in = 83, n_tok = 2 };
    float wf[n_out * n_in], x[n_tok * n_in], y[n_tok * n_out];
    uint16_t wb[n_out * n_in];
    for (int i = 0; i < n_out * n_in; i++) {
        wf[i] = (float)(int)(rng_unit() * 3.0); /* -2 .. 2 */
        wb[i] = q35_f32_to_bf16(wf[i]);
    }
    for (int i = 0; i < n_tok * n_in; i++) x[i] = (float)(int)(rng_unit() * 8192.0) / 64.0f;
    q35_tensor W = {.name = "w", .dtype = Q35_DT_BF16, .ndim = 2, .shape = {n_out, n_in}, .data = wb,
                    .nbytes = sizeof wb};
    long rounded = 0;
    for (int i = 0; i < n_tok * n_in; i++) rounded += round_to_bf16(x[i]) != x[i];
    CHECK(rounded > n_tok * n_in / 4); /* the case does test rounding */
    for (int k = 0; k < n_tables; k++) {
        int r = rounds_x_to_bf16(tables[k], Q35_DT_BF16);
        q35_kernels_matmul(tables[k], y, &W, x, n_tok, 0, n_out);
        long bad = 0;
        for (int t = 0; t < n_tok; t++)
            for (int o = 0; o < n_out; o++) {
                double want = 0.0;
                for (int i = 0; i < n_in; i++) {
                    float xi = x[t * n_in + i];
                    want += (double)wf[o * n_in + i] * (r ? round_to_bf16(xi) : xi);
                }
                bad += y[t * n_out + o] != (float)want;
            }
        CHECK_MSG(bad == 0, "%s: %ld outputs are not the exact sum", tables[k]->name, bad);
        if (r) { /* denormal x reads as zero */
            float xd[n_tok * n_in], yd[n_tok * n_out];
            for (int i = 0; i < n_tok * n_in; i++) xd[i] = 0x1p-130f;
            q35_kernels_matmul(tables[k], yd, &W, xd, n_tok, 0, n_out);
            for (int i = 0; i < n_tok * n_out; i++) CHECK(yd[i] == 0.0f);
        }
    }
}

/* matmul_n (x quantized once for all pieces) gives each piece the same bits
 * as a call for that piece alone: mixed dtypes, a piece of another n_in, partial
 * and empty row ranges, one token and a batch. */
TEST(kernels, matmul_n_equals_separate_calls) {
    const q35_kernels *tables[1 + MAX_FAST_TABLES] = {&q35_kernels_ref};
    int n_tables = 1 + fast_tables(tables + 1);
    enum { n_in = 272, n_tok_max = 9, n_out_max = 45, n_piece = 5 };
    const q35_dtype dts[n_piece] = {Q35_DT_BFP4, Q35_DT_BF16, Q35_DT_BFP8, Q35_DT_BFP4, Q35_DT_BFP4};
    const int64_t outs[n_piece] = {45, 20, 33, 16, 40}, ins[n_piece] = {n_in, n_in, n_in, 144, n_in};
    const int64_t o0[n_piece] = {0, 3, 16, 0, 8}, o1[n_piece] = {45, 17, 33, 16, 8};
    weights w[n_piece];
    const q35_tensor *Ws[n_piece];
    float *x = malloc(sizeof(float) * n_tok_max * n_in), *ys[n_piece], *y1 = malloc(sizeof(float) * n_tok_max * n_out_max);
    REQUIRE(x && y1);
    for (int i = 0; i < n_tok_max * n_in; i++) x[i] = (float)rng_unit();
    for (int i = 0; i < n_piece; i++) {
        REQUIRE(make_weights(&w[i], dts[i], outs[i], ins[i], 0));
        Ws[i] = &w[i].t;
        ys[i] = malloc(sizeof(float) * n_tok_max * n_out_max);
        REQUIRE(ys[i]);
    }
    const int64_t toks[2] = {1, n_tok_max};
    for (int k = 0; k < n_tables; k++)
        for (int c = 0; c < 2; c++) {
            for (int i = 0; i < n_piece; i++)
                for (int j = 0; j < n_tok_max * n_out_max; j++) ys[i][j] = NAN;
            tables[k]->matmul_n(n_piece, ys, Ws, x, toks[c], o0, o1);
            for (int i = 0; i < n_piece; i++) {
                for (int j = 0; j < n_tok_max * n_out_max; j++) y1[j] = NAN;
                q35_kernels_matmul(tables[k], y1, Ws[i], x, toks[c], o0[i], o1[i]);
                CHECK_MSG(memcmp(y1, ys[i], sizeof(float) * n_tok_max * n_out_max) == 0,
                          "%s, %lld tokens: piece %d differs", tables[k]->name, (long long)toks[c], i);
            }
        }
    for (int i = 0; i < n_piece; i++) {
        free(w[i].data);
        free(ys[i]);
    }
    free(x);
    free(y1);
}

TEST(kernels, get_row_matches_ref) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    q35_dtype dts[5] = {Q35_DT_F32, Q35_DT_F16, Q35_DT_BF16, Q35_DT_BFP8, Q35_DT_BFP4};
    for (int d = 0; d < 5; d++) {
        weights w;
        REQUIRE(make_weights(&w, dts[d], 19, 80, 1));
        float a[80], b[80];
        for (int k = 0; k < n_tables; k++)
            for (int r = 0; r < 19; r++) {
                q35_get_row_ref(a, &w.t, r);
                tables[k]->get_row(b, &w.t, r);
                CHECK(memcmp(a, b, sizeof a) == 0);
            }
        free(w.data);
    }
}

/* The bandwidth probe reads every byte: the fast tables' checksums (sums of
 * 64-bit words, wrapping) equal the reference's, for sizes of one and
 * several 4 KiB steps. */
TEST(kernels, read_stream_reads_everything) {
    const q35_kernels *tables[MAX_FAST_TABLES];
    int n_tables = fast_tables(tables);
    size_t max_bytes = 5 * 4096;
    uint64_t *buf = aligned_alloc(64, max_bytes);
    REQUIRE(buf);
    for (size_t i = 0; i < max_bytes / 8; i++) buf[i] = (uint64_t)(rng_unit() * 9.2e18) ^ (i << 40);
    for (size_t bytes = 4096; bytes <= max_bytes; bytes += 4 * 4096) {
        uint64_t want = q35_read_stream_ref(buf, bytes);
        CHECK(q35_kernels_ref.read_stream(buf, bytes) == want);
        for (int k = 0; k < n_tables; k++)
            CHECK_MSG(tables[k]->read_stream(buf, bytes) == want, "%s, %zu bytes", tables[k]->name, bytes);
        buf[bytes / 8 - 1] ^= 1; /* the last word counts too */
        CHECK(q35_read_stream_ref(buf, bytes) != want);
        for (int k = 0; k < n_tables; k++) CHECK(tables[k]->read_stream(buf, bytes) != want);
        buf[bytes / 8 - 1] ^= 1;
    }
    free(buf);
}

/* The read probe (q35_read_probe_*): an odd size rounds up to whole pages,
 * each run on 1 and 2 threads gives a positive, finite bandwidth, and the
 * probe can run again and again before it is freed; freeing NULL is a no-op. */
TEST(kernels, read_probe_runs_again_and_again) {
    for (int nt = 1; nt <= 2; nt++) {
        q35_read_probe *p = NULL;
        q35_error err;
        REQUIRE(q35_read_probe_new(nt, ((size_t)8 << 20) + 123, &p, &err) == Q35_OK);
        for (int r = 0; r < 3; r++) {
            double gb = q35_read_probe_run(p, r + 1);
            CHECK_MSG(gb > 0.0 && gb < 1e6, "%d threads, run %d: %g GB/s", nt, r, gb);
        }
        q35_read_probe_free(p);
    }
    q35_read_probe_free(NULL);
}

TEST(kernels, dispatch_by_cpu_and_env) {
    const q35_kernels *k = NULL;
    q35_error err = {0};
    CHECK(q35_kernels_find("ref", &k, &err) == Q35_OK && k == &q35_kernels_ref);
    CHECK(q35_kernels_find("sse9", &k, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "sse9") && strstr(err.msg, "avx512") && strstr(err.msg, "avx512bf16"));
    /* avx512bf16 needs avx512 and more; where the CPU lacks it, it is refused naming what is missing */
    const q35_kernels *k512 = NULL, *kbf16 = NULL;
    q35_status st512 = q35_kernels_find("avx512", &k512, NULL);
    q35_status stbf16 = q35_kernels_find("avx512bf16", &kbf16, &err);
    CHECK(stbf16 == Q35_OK || stbf16 == Q35_ERR_UNSUPPORTED);
    if (stbf16 == Q35_OK) CHECK(kbf16 == &q35_kernels_avx512bf16 && st512 == Q35_OK && k512 == &q35_kernels_avx512);
    else CHECK(strstr(err.msg, "avx512bf16") && strstr(err.msg, "BF16"));

    const char *old = getenv("Q35_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    setenv("Q35_KERNELS", "bogus", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "Q35_KERNELS=bogus") != NULL);
    setenv("Q35_KERNELS", "avx512bf16", 1); /* forced: taken where it runs, a clear error elsewhere */
    if (stbf16 == Q35_OK) CHECK(q35_kernels_init(&k, &err) == Q35_OK && k == &q35_kernels_avx512bf16);
    else CHECK(q35_kernels_init(&k, &err) == Q35_ERR_UNSUPPORTED && strstr(err.msg, "Q35_KERNELS=avx512bf16"));
    setenv("Q35_KERNELS", "ref", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_OK && k == &q35_kernels_ref && q35_kernels_get() == k);
    unsetenv("Q35_KERNELS");
    CHECK(q35_kernels_init(&k, &err) == Q35_OK && q35_kernels_get() == k);
    const q35_kernels *fast[MAX_FAST_TABLES];
    int n = fast_tables(fast);
    if (n && fast[n - 1] == &q35_kernels_avx512bf16) n--; /* only when asked for */
    CHECK(k == (n ? fast[n - 1] : &q35_kernels_ref));     /* the best this CPU runs */
    CHECK((k == &q35_kernels_ref) == (q35_kernels_note() != NULL));
    if (saved) {
        setenv("Q35_KERNELS", saved, 1);
        free(saved);
    }
    q35_kernels_init(&k, NULL);
}

/* The prefetch level of the avx512 bfp tiles and attention: L2 on AMD family 19h (Zen 4), L1
 * elsewhere, either forced by Q35_PREFETCH (q35_kernels_init sets it); any other value of it is
 * refused by q35_kernels_init, naming it. */
TEST(kernels, prefetch_level_by_cpu_and_env) {
    CHECK_EQ_INT(q35_kernels_prefetch_choice(NULL, 0x19), 1);
    CHECK_EQ_INT(q35_kernels_prefetch_choice("", 0x19), 1);
    CHECK_EQ_INT(q35_kernels_prefetch_choice(NULL, 0x1a), 0); /* Zen 5 */
    CHECK_EQ_INT(q35_kernels_prefetch_choice(NULL, 0), 0);    /* not AMD */
    CHECK_EQ_INT(q35_kernels_prefetch_choice("l1", 0x19), 0);
    CHECK_EQ_INT(q35_kernels_prefetch_choice("l2", 0), 1);
    CHECK_EQ_INT(q35_kernels_prefetch_choice("L2", 0), -1);
    CHECK_EQ_INT(q35_kernels_prefetch_choice("l3", 0x19), -1);
    CHECK_EQ_INT(q35_cpu_family_of(0x00A10F11u), 0x19); /* Zen 4 (family 0xf + 0xa, model 0x11) */
    CHECK_EQ_INT(q35_cpu_family_of(0x00B40F40u), 0x1a); /* Zen 5 */
    CHECK_EQ_INT(q35_cpu_family_of(0x000806F8u), 6);    /* an Intel Xeon: base family 6, no extension */

    const char *old = getenv("Q35_PREFETCH");
    char *saved = old ? strdup(old) : NULL;
    const q35_kernels *k = NULL;
    q35_error err = {0};
    setenv("Q35_PREFETCH", "l9", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "Q35_PREFETCH=l9") && strstr(err.msg, "l1 or l2"));
    setenv("Q35_PREFETCH", "l1", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_OK);
    CHECK_EQ_INT(q35_kernels_prefetch_l2(), 0); /* what the tiles read from then on */
    setenv("Q35_PREFETCH", "l2", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_OK);
    CHECK_EQ_INT(q35_kernels_prefetch_l2(), 1);
    if (saved) {
        setenv("Q35_PREFETCH", saved, 1);
        free(saved);
    } else {
        unsetenv("Q35_PREFETCH");
    }
    q35_kernels_init(&k, NULL);
}

TEST(kernels, scratch_is_reused) {
    void *a = q35_kernels_scratch(1000);
    void *b = q35_kernels_scratch(10);
    REQUIRE(a && b);
    CHECK(a == b);
    CHECK(((uintptr_t)a & 63) == 0);
}
