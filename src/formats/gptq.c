/* gptq.c: the calibrated BFP encoder (see gptq.h). */
#include "formats/gptq.h"
#include "formats/bfp.h"
#include "base/util.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define PAR_MIN_WORK 200000.0 /* multiply-adds below which a step runs on one thread */

typedef struct {
    double *A, *row;
    int64_t n, j, i;
    double r;
} fact_step;

/* Column j of R for rows i < j: each row's sum along two rows, rows split over the threads. */
static void chol_rows(void *p, int ith, int nth) {
    const fact_step *f = p;
    const int64_t n = f->n, j = f->j;
    const double *rj = f->A + j * n;
    int64_t lo = (int64_t)((double)j * ith / nth), hi = (int64_t)((double)j * (ith + 1) / nth);
    for (int64_t i = lo; i < hi; i++) {
        double *ri = f->A + i * n;
        double s = ri[j];
        for (int64_t k = j + 1; k < n; k++) s -= ri[k] * rj[k];
        ri[j] = s / f->r;
    }
}

/* H = R R^T with R upper triangular (a Cholesky factorization taken from the
 * last index down), in place in the upper triangle; 0 when it fails (a pivot
 * that is not positive). Row-major, so each inner sum runs along two rows;
 * each element is the same sum in the same order on any thread count. */
static int reverse_cholesky(double *A, int64_t n, int nth) {
    for (int64_t j = n - 1; j >= 0; j--) {
        double *rj = A + j * n;
        double d = rj[j];
        for (int64_t k = j + 1; k < n; k++) d -= rj[k] * rj[k];
        if (!(d > 0)) return 0;
        fact_step f = {A, NULL, n, j, 0, sqrt(d)};
        rj[j] = f.r;
        if (nth > 1 && (double)j * (double)(n - j) > PAR_MIN_WORK) q35_fork_join(nth, chol_rows, &f);
        else chol_rows(&f, 0, 1);
    }
    return 1;
}

/* Row i of U into f->row: e_i - sum_{k>i} R[i][k] U[k], over the columns of
 * one thread's share (each column takes its terms in k order, as on one thread). */
static void inverse_cols(void *p, int ith, int nth) {
    const fact_step *f = p;
    const int64_t n = f->n, i = f->i;
    /* column j costs about j - i: shares of equal work end at i + (n - i) sqrt(t / nth) */
    int64_t lo = i + (int64_t)((double)(n - i) * sqrt((double)ith / nth));
    int64_t hi = ith + 1 == nth ? n : i + (int64_t)((double)(n - i) * sqrt((double)(ith + 1) / nth));
    const double *ri = f->A + i * n;
    double *row = f->row;
    for (int64_t j = lo; j < hi; j++) row[j] = j == i ? 1.0 : 0.0;
    for (int64_t k = i + 1; k < hi; k++) {
        double c = ri[k];
        const double *uk = f->A + k * n;
        for (int64_t j = k > lo ? k : lo; j < hi; j++) row[j] -= c * uk[j];
    }
}

/* U = R^-1 for R upper triangular in the upper triangle of A (in place):
 * row i of U is (e_i - sum_{k>i} R[i][k] U[k]) / R[i][i], from the last row up. */
static void upper_inverse(double *A, int64_t n, double *row, int nth) {
    for (int64_t i = n - 1; i >= 0; i--) {
        double *ri = A + i * n;
        fact_step f = {A, row, n, 0, i, 0};
        double work = (double)(n - i) * (double)(n - i) / 2;
        if (nth > 1 && work > PAR_MIN_WORK) q35_fork_join(nth, inverse_cols, &f);
        else inverse_cols(&f, 0, 1);
        double inv = 1.0 / ri[i];
        for (int64_t j = i; j < n; j++) ri[j] = row[j] * inv; /* after every share has read row i of R */
    }
}

static int32_t *diag_order(const double *H, int64_t n) {
    int32_t *perm = malloc((size_t)n * sizeof *perm);
    if (!perm) return NULL;
    for (int64_t i = 0; i < n; i++) perm[i] = (int32_t)i;
    for (int64_t i = 1; i < n; i++) { /* insertion sort: stable, so ties keep index order */
        int32_t v = perm[i];
        double d = H[(int64_t)v * n + v];
        int64_t k = i;
        while (k > 0 && H[(int64_t)perm[k - 1] * n + perm[k - 1]] < d) { perm[k] = perm[k - 1]; k--; }
        perm[k] = v;
    }
    return perm;
}

q35_status q35_gptq_make(double *H, int64_t n, double damp, int act_order, int n_threads, q35_gptq *out,
                          q35_error *err) {
    memset(out, 0, sizeof *out);
    if (n <= 0) return q35_fail(err, Q35_ERR_ARG, "gptq: no inputs");
    double *orig = malloc((size_t)n * (size_t)n * sizeof *orig), *row = malloc((size_t)n * sizeof *row);
    if (!orig || !row) {
        free(orig);
        free(row);
        return q35_fail(err, Q35_ERR_NOMEM, "gptq: out of memory for a %lld-input factor", (long long)n);
    }
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(H[i * n + i])) {
            free(orig);
            free(row);
            return q35_fail(err, Q35_ERR_ARG, "gptq: the calibration matrix's diagonal is not finite at input %lld "
                            "(the inputs overflowed)", (long long)i);
        }
    for (int64_t i = 0; i < n; i++) /* the full symmetric matrix from its upper triangle */
        for (int64_t j = 0; j < i; j++) H[i * n + j] = H[j * n + i];
    for (int64_t i = 0; i < n; i++) {
        if (H[i * n + i] != 0) continue; /* an input that never moved: coded plainly */
        for (int64_t j = 0; j < n; j++) H[i * n + j] = H[j * n + i] = 0;
        H[i * n + i] = 1;
    }
    int32_t *perm = act_order ? diag_order(H, n) : NULL;
    if (act_order && !perm) {
        free(orig);
        free(row);
        return q35_fail(err, Q35_ERR_NOMEM, "gptq: out of memory");
    }
    if (perm) { /* orig = P H P^T */
        for (int64_t i = 0; i < n; i++)
            for (int64_t j = 0; j < n; j++) orig[i * n + j] = H[(int64_t)perm[i] * n + perm[j]];
        memcpy(H, orig, (size_t)n * (size_t)n * sizeof *orig);
    }
    double mean = 0;
    for (int64_t i = 0; i < n; i++) mean += H[i * n + i];
    mean /= (double)n;
    memcpy(orig, H, (size_t)n * (size_t)n * sizeof *orig);
    q35_status st = Q35_ERR_ARG;
    for (int t = 0; t < 4; t++, damp *= 10) {
        if (t) memcpy(H, orig, (size_t)n * (size_t)n * sizeof *orig);
        for (int64_t i = 0; i < n; i++) H[i * n + i] += damp * mean;
        if (reverse_cholesky(H, n, n_threads)) {
            upper_inverse(H, n, row, n_threads);
            st = Q35_OK;
            break;
        }
    }
    free(orig);
    free(row);
    if (st) {
        free(perm);
        return q35_fail(err, Q35_ERR_ARG, "gptq: the calibration matrix (%lld inputs) is not positive definite "
                        "even damped by %g of its mean diagonal", (long long)n, damp / 10);
    }
    for (int64_t i = 0; i < n; i++) /* U is upper triangular: clear what the factorization left below */
        for (int64_t j = 0; j < i; j++) H[i * n + j] = 0;
    out->n = n;
    out->perm = perm;
    out->U = H;
    return Q35_OK;
}

void q35_gptq_free(q35_gptq *g) {
    if (!g) return;
    free(g->U);
    free(g->perm);
    memset(g, 0, sizeof *g);
}

typedef struct {
    q35_dtype dt;
    void *dst;
    const float *W;
    int64_t n_rows, n_in;
    const q35_gptq *g;
    unsigned flags;
    int failed;
} gptq_job;

static uint32_t float_bits(double v) {
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static int block_exponent(const double *v, int64_t stride) {
    int E = 0;
    for (int i = 0; i < Q35_BFP_BLOCK; i++) {
        int e = (int)((float_bits(v[i * stride]) >> 23) & 0xff);
        if (e > E) E = e;
    }
    return E;
}

/* One panel: rows [r0, r0 + nr) (nr <= 16) coded input by input, in the
 * factor's order; w (16, n) holds the rows in that order as they change. */
static void gptq_panel(const gptq_job *j, int64_t r0, int nr, double *w, int *E, uint8_t *codes) {
    const int64_t n = j->n_in, n_blk = n / Q35_BFP_BLOCK;
    const int32_t *perm = j->g->perm;
    for (int r = 0; r < nr; r++) {
        const float *src = j->W + (r0 + r) * n;
        for (int64_t k = 0; k < n; k++) w[r * n + k] = src[perm ? perm[k] : k];
        if (perm) /* exponents fixed first from the row's own values */
            for (int64_t b = 0; b < n_blk; b++) {
                uint32_t bits[Q35_BFP_BLOCK];
                uint8_t tmp[Q35_BFP_BLOCK];
                memcpy(bits, src + b * Q35_BFP_BLOCK, sizeof bits);
                E[r * n_blk + b] = q35_bfp_encode_block(j->dt, bits, j->flags, tmp);
            }
    }
    double e[Q35_BFP_PANEL];
    for (int64_t k = 0; k < n; k++) {
        int64_t ko = perm ? perm[k] : k, b = ko / Q35_BFP_BLOCK;
        if (!perm && ko % Q35_BFP_BLOCK == 0) /* in order: the exponent from the values as they stand now */
            for (int r = 0; r < nr; r++) E[r * n_blk + b] = block_exponent(w + r * n + k, 1);
        const double *u = j->g->U + k * n;
        for (int r = 0; r < nr; r++) {
            int Er = E[r * n_blk + b];
            uint8_t c = q35_bfp_encode_value(j->dt, float_bits(w[r * n + k]), Er);
            codes[((int64_t)r * n_blk + b) * Q35_BFP_BLOCK + ko % Q35_BFP_BLOCK] = c;
            e[r] = (w[r * n + k] - (double)q35_bfp_decode(j->dt, (uint8_t)Er, c)) / u[k];
        }
        for (int r = 0; r < nr; r++) {
            double er = e[r], *wr = w + r * n;
            if (er != 0)
                for (int64_t c2 = k + 1; c2 < n; c2++) wr[c2] -= er * u[c2];
        }
    }
    for (int r = 0; r < nr; r++)
        for (int64_t b = 0; b < n_blk; b++)
            q35_bfp_put_block(j->dt, j->dst, n, r0 + r, b, (uint8_t)E[r * n_blk + b],
                              codes + ((int64_t)r * n_blk + b) * Q35_BFP_BLOCK);
}

static void gptq_worker(void *p, int ith, int nth) {
    gptq_job *j = p;
    size_t cells = (size_t)Q35_BFP_PANEL * (size_t)j->n_in;
    double *w = malloc(cells * sizeof *w);
    int *E = malloc(cells / Q35_BFP_BLOCK * sizeof *E);
    uint8_t *codes = malloc(cells);
    if (!w || !E || !codes) {
        __atomic_store_n(&j->failed, 1, __ATOMIC_RELAXED);
        free(w); free(E); free(codes);
        return;
    }
    int64_t n_panels = (j->n_rows + Q35_BFP_PANEL - 1) / Q35_BFP_PANEL;
    for (int64_t p0 = ith; p0 < n_panels; p0 += nth) {
        int64_t r0 = p0 * Q35_BFP_PANEL;
        int nr = (int)(j->n_rows - r0 < Q35_BFP_PANEL ? j->n_rows - r0 : Q35_BFP_PANEL);
        gptq_panel(j, r0, nr, w, E, codes);
    }
    free(w);
    free(E);
    free(codes);
}

q35_status q35_bfp_pack_gptq(q35_dtype dt, void *dst, const float *W, int64_t n_rows, int64_t n_in, const q35_gptq *g,
                             unsigned flags, int n_threads, q35_error *err) {
    if (!q35_bfp_mant_bits(dt) || n_rows <= 0 || n_in <= 0 || n_in % Q35_BFP_BLOCK || g->n != n_in)
        return q35_fail(err, Q35_ERR_ARG, "gptq: cannot code [%lld, %lld] as %s", (long long)n_rows, (long long)n_in,
                        q35_dtype_name(dt));
    q35_bfp_clear(dt, dst, n_rows, n_in); /* padding rows: exponent 0, code 0 */
    int64_t n_panels = (n_rows + Q35_BFP_PANEL - 1) / Q35_BFP_PANEL;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > n_panels) n_threads = (int)n_panels;
    gptq_job j = {dt, dst, W, n_rows, n_in, g, flags, 0};
    q35_fork_join(n_threads, gptq_worker, &j); /* panels dealt round-robin: the bytes do not depend on it */
    if (j.failed) return q35_fail(err, Q35_ERR_NOMEM, "gptq: out of memory for a panel of %lld inputs", (long long)n_in);
    return Q35_OK;
}
