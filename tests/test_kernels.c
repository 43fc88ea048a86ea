/* Tests of src/kernels/: every fast table against the scalar reference, for
 * every weight dtype, awkward shapes, partial output ranges, extreme values
 * and n_tok = 1, 2, 3, 8, 17; and the start-up dispatch. */
#include "bfp.h"
#include "kernels/kernels.h"
#include "test.h"
#include "util.h"

#include <stdint.h>

static uint64_t rng = 0x243f6a8885a308d3ull;
static double rng_unit(void) { /* uniform in [-1, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0;
}

/* The fast tables this CPU can run. */
static int fast_tables(const q35_kernels **out) {
    int n = 0;
    const char *names[2] = {"avx2", "avx512"};
    for (int i = 0; i < 2; i++)
        if (q35_kernels_find(names[i], &out[n], NULL) == Q35_OK) n++;
    return n;
}

typedef struct weights {
    q35_tensor t;
    void *data;
} weights;

/* Random [n_out, n_in] weights in dtype dt. `extreme` scales rows and
 * 16-wide blocks by powers of two over 2^-60 .. 2^60 and zeroes some blocks. */
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

/* The bound stated in kernels.h for output (t, o): float rounding of
 * sum |w x|, plus for bfp weights half an int8 step of x's block scale times
 * the block's sum |w|. */
static double error_bound(const q35_tensor *W, const float *x, const float *row, int64_t t) {
    int64_t n_in = W->shape[1];
    const float *xt = x + t * n_in;
    double sum_abs = 0.0, quant = 0.0;
    for (int64_t i = 0; i < n_in; i++) sum_abs += fabs((double)row[i] * xt[i]);
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
    k->matmul(y, W, x, n_tok, o0, o1);
    for (int64_t o = 0; o < n_out; o++) {
        q35_get_row_ref(row, W, o);
        for (int64_t t = 0; t < n_tok; t++) {
            float a = y[t * n_out + o], b = y_ref[t * n_out + o];
            if (o < o0 || o >= o1) { /* untouched */
                bad += !isnan(a);
                continue;
            }
            double bound = error_bound(W, x, row, t), err = fabs((double)a - b);
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
    const q35_kernels *tables[2];
    int n_tables = fast_tables(tables);
    int is_bfp = dt == Q35_DT_BFP4 || dt == Q35_DT_BFP8;
    /* n_in multiples of 16 but not of 64 or 256; odd n_out; one plain shape;
     * n_in large enough that n_tok = 17 spans two token chunks of the bfp
     * driver (it keeps a chunk's int8 activations under 256 KiB). */
    int64_t shapes[][2] = {{37, 48}, {33, 80}, {5, 16}, {70, 272}, {48, 256}, {17, 37}, {19, 16384}};
    int64_t n_toks[] = {1, 2, 3, 8, 17};
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
    const q35_kernels *tables[2];
    int n_tables = fast_tables(tables);
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    for (int d = 0; d < 2; d++) {
        weights w;
        REQUIRE(make_weights(&w, dts[d], 64, 1024, 0));
        float x[1024], y[64], y_ref[64], row[1024];
        for (int i = 0; i < 1024; i++) x[i] = (float)rng_unit();
        q35_matmul_ref(y_ref, &w.t, x, 1, 0, 64);
        for (int k = 0; k < n_tables; k++) {
            tables[k]->matmul(y, &w.t, x, 1, 0, 64);
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

/* One token's outputs are bitwise the same alone or in a batch of 17, and
 * for any row range (what batched verification and thread splits rely on):
 * the ranges cut panels, and hold runs of several whole ones (the decode
 * path takes whole panels in pairs). */
TEST(kernels, batch_and_split_invariant) {
    const q35_kernels *tables[2];
    int n_tables = fast_tables(tables);
    q35_dtype dts[5] = {Q35_DT_F32, Q35_DT_F16, Q35_DT_BF16, Q35_DT_BFP8, Q35_DT_BFP4};
    enum { n_out = 93, n_in = 272, n_tok = 17 };
    float *x = malloc(sizeof(float) * n_tok * n_in), *y = malloc(sizeof(float) * n_tok * n_out);
    float y1[n_out];
    REQUIRE(x && y);
    for (int i = 0; i < n_tok * n_in; i++) x[i] = (float)rng_unit();
    for (int d = 0; d < 5; d++) {
        weights w;
        REQUIRE(make_weights(&w, dts[d], n_out, n_in, 0));
        for (int k = 0; k < n_tables; k++) {
            tables[k]->matmul(y, &w.t, x, n_tok, 0, n_out);
            long bad = 0;
            for (int t = 0; t < n_tok; t += 5) {
                tables[k]->matmul(y1, &w.t, x + t * n_in, 1, 0, 7);
                tables[k]->matmul(y1, &w.t, x + t * n_in, 1, 7, 71);
                tables[k]->matmul(y1, &w.t, x + t * n_in, 1, 71, n_out);
                bad += memcmp(y1, y + t * n_out, sizeof y1) != 0;
                tables[k]->matmul(y1, &w.t, x + t * n_in, 1, 0, n_out);
                bad += memcmp(y1, y + t * n_out, sizeof y1) != 0;
            }
            CHECK_MSG(bad == 0, "%s %s: %ld tokens differ", tables[k]->name, q35_dtype_name(dts[d]), bad);
        }
        free(w.data);
    }
    free(x);
    free(y);
}

TEST(kernels, get_row_matches_ref) {
    const q35_kernels *tables[2];
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
    const q35_kernels *tables[2];
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

TEST(kernels, dispatch_by_cpu_and_env) {
    const q35_kernels *k = NULL;
    q35_error err = {0};
    CHECK(q35_kernels_find("ref", &k, &err) == Q35_OK && k == &q35_kernels_ref);
    CHECK(q35_kernels_find("sse9", &k, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "sse9") && strstr(err.msg, "avx512"));

    const char *old = getenv("Q35_KERNELS");
    char *saved = old ? strdup(old) : NULL;
    setenv("Q35_KERNELS", "bogus", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_ERR_ARG);
    CHECK(strstr(err.msg, "Q35_KERNELS=bogus") != NULL);
    setenv("Q35_KERNELS", "ref", 1);
    CHECK(q35_kernels_init(&k, &err) == Q35_OK && k == &q35_kernels_ref && q35_kernels_get() == k);
    unsetenv("Q35_KERNELS");
    CHECK(q35_kernels_init(&k, &err) == Q35_OK && q35_kernels_get() == k);
    const q35_kernels *fast[2];
    int n = fast_tables(fast);
    CHECK(k == (n ? fast[n - 1] : &q35_kernels_ref)); /* the best this CPU runs */
    CHECK((k == &q35_kernels_ref) == (q35_kernels_note() != NULL));
    if (saved) {
        setenv("Q35_KERNELS", saved, 1);
        free(saved);
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
