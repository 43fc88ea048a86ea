/* calib.c: calibration statistics for the GPTQ encoder (see calib.h). */
#include "core/calib.h"
#include "base/util.h"
#include "formats/bfp.h"
#include "formats/cache.h"
#include "formats/gptq.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define CALIB_SLICE 64    /* rows of logits at a time */
#define CALIB_MAX_W 8     /* matrices sharing one input */
#define CALIB_ENCODE_ROWS 1024 /* rows decoded to floats at a time (whole panels) */

typedef struct calib_slot {
    const q35_tensor *W[CALIB_MAX_W];
    int n_w;
    int64_t n_in, rows;
    double *H;    /* (n_in, n_in): the upper triangle of sum x x^T, until factored; NULL: not summed */
    q35_gptq g;   /* g.U took H over */
    int factored, failed; /* failed: the factorization gave up (H is spent) */
} calib_slot;

struct q35_calib {
    q35_engine *e;
    calib_slot *slots;
    int32_t n_slots, cap;
    int failed;   /* out of memory inside the tap */
    int threads;  /* for the sums and the factorizations: the engine's */
    const q35_tensor **only; /* the matrices whose inputs are summed (n_only; NULL: all) */
    int32_t n_only;
};

static int wanted(const q35_calib *c, int n, const q35_tensor *const *Ws) {
    if (!c->only) return 1;
    for (int i = 0; i < n; i++)
        for (int32_t k = 0; k < c->n_only; k++)
            if (c->only[k] == Ws[i]) return 1;
    return 0;
}

static calib_slot *slot_of(q35_calib *c, int n, const q35_tensor *const *Ws) {
    for (int32_t i = 0; i < c->n_slots; i++)
        if (c->slots[i].W[0] == Ws[0]) return &c->slots[i];
    if (c->n_slots == c->cap) {
        int32_t cap = c->cap ? 2 * c->cap : 64;
        calib_slot *s = realloc(c->slots, (size_t)cap * sizeof *s);
        if (!s) return NULL;
        c->slots = s;
        c->cap = cap;
    }
    int64_t n_in = Ws[0]->shape[Ws[0]->ndim - 1];
    double *H = NULL;
    if (wanted(c, n, Ws) && !(H = calloc((size_t)n_in * (size_t)n_in, sizeof *H))) return NULL;
    calib_slot *s = &c->slots[c->n_slots++];
    memset(s, 0, sizeof *s);
    s->n_w = n < CALIB_MAX_W ? n : CALIB_MAX_W;
    for (int i = 0; i < s->n_w; i++) s->W[i] = Ws[i];
    s->n_in = n_in;
    s->H = H;
    return s;
}

/* H += x^T x over the upper triangle: for each row of H, the call's tokens
 * in order, an axpy each (which the compiler vectorizes at -O3), so a row of
 * H stays in cache while the tokens pass; every element takes its products in
 * token order, whichever thread owns its row. */
typedef struct {
    double *H;
    const float *x;
    int64_t n_tok, m;
} sum_job;

__attribute__((optimize("O3"))) static void add_rows(void *p, int ith, int nth) {
    const sum_job *j = p;
    const int64_t m = j->m;
    /* row i costs m - i: shares of equal work start at m - m sqrt(1 - t / nth) */
    int64_t lo = m - (int64_t)((double)m * sqrt(1.0 - (double)ith / nth));
    int64_t hi = ith + 1 == nth ? m : m - (int64_t)((double)m * sqrt(1.0 - (double)(ith + 1) / nth));
    for (int64_t i = lo; i < hi; i++) {
        double *h = j->H + i * m;
        for (int64_t t = 0; t < j->n_tok; t++) {
            const float *xt = j->x + t * m;
            double xi = xt[i];
            if (xi == 0) continue;
            for (int64_t k = i; k < m; k++) h[k] += xi * (double)xt[k];
        }
    }
}

static void calib_tap(void *ctx, int n, const q35_tensor *const *Ws, const float *x, int64_t n_tok) {
    q35_calib *c = ctx;
    if (c->failed || n < 1) return;
    calib_slot *s = slot_of(c, n, Ws);
    if (!s) { c->failed = 1; return; }
    if (s->H) {
        sum_job j = {s->H, x, n_tok, s->n_in};
        double work = (double)n_tok * (double)s->n_in * (double)s->n_in / 2;
        if (c->threads > 1 && work > 2e6) q35_fork_join(c->threads, add_rows, &j);
        else add_rows(&j, 0, 1);
    }
    s->rows += n_tok;
}

q35_status q35_calib_collect(q35_engine *e, const int32_t *ids, int32_t n, int32_t win, const char *const *only,
                             int32_t n_only, q35_calib **out, q35_error *err) {
    *out = NULL;
    if (n < 1 || win < 1) return q35_fail(err, Q35_ERR_ARG, "calibration: no tokens");
    q35_calib *c = calloc(1, sizeof *c);
    if (c && only) {
        c->only = calloc((size_t)n_only + 1, sizeof *c->only);
        if (!c->only) {
            free(c);
            c = NULL;
        }
        for (int32_t i = 0; c && i < n_only; i++) {
            c->only[i] = q35_engine_weight(e, only[i]);
            if (!c->only[i]) {
                free(c->only);
                free(c);
                return q35_fail(err, Q35_ERR_ARG, "calibration: no matrix called '%s'", only[i]);
            }
        }
        if (c) c->n_only = n_only;
    }
    int32_t V = q35_engine_info(e)->vocab_size;
    float *logits = malloc((size_t)CALIB_SLICE * (size_t)V * sizeof *logits);
    q35_session *s = NULL;
    q35_status st = !c || !logits ? q35_fail(err, Q35_ERR_NOMEM, "calibration: out of memory") : Q35_OK;
    if (!st) c->e = e, c->threads = q35_engine_threads(e);
    if (!st) st = q35_session_new(e, win, &s, err);
    /* with an MTP head, the session speculates, so every row but a window's last also goes through the
     * head (its KV cache and matrices: what drafting reads), and the head's inputs are summed too */
    if (!st && e->w.mtp.present) st = q35_session_set_spec(s, 1, err);
    if (!st) st = q35_engine_set_tap(e, calib_tap, c, err);
    for (int32_t w0 = 0; !st && w0 < n; w0 += win) {
        int32_t len = n - w0 < win ? n - w0 : win;
        q35_session_reset(s);
        for (int32_t s0 = 0; !st && s0 < len; s0 += CALIB_SLICE) {
            int32_t k = len - s0 < CALIB_SLICE ? len - s0 : CALIB_SLICE;
            st = q35_session_eval(s, ids + w0 + s0, k, logits, Q35_EVAL_ALL_LOGITS, err);
            if (!st && c->failed) st = q35_fail(err, Q35_ERR_NOMEM, "calibration: out of memory for the input sums");
        }
    }
    if (c) q35_engine_set_tap(e, NULL, NULL, NULL);
    q35_session_free(s);
    free(logits);
    if (st) {
        q35_calib_free(c);
        return st;
    }
    *out = c;
    return Q35_OK;
}

void q35_calib_free(q35_calib *c) {
    if (!c) return;
    for (int32_t i = 0; i < c->n_slots; i++) {
        if (c->slots[i].factored) q35_gptq_free(&c->slots[i].g);
        else free(c->slots[i].H);
    }
    free(c->only);
    free(c->slots);
    free(c);
}

q35_status q35_calib_factor(q35_calib *c, const char *name, const q35_gptq **g, int64_t *rows, q35_error *err) {
    *g = NULL;
    const q35_tensor *w = q35_engine_weight(c->e, name);
    for (int32_t i = 0; w && i < c->n_slots; i++) {
        calib_slot *s = &c->slots[i];
        for (int j = 0; j < s->n_w; j++) {
            if (s->W[j] != w) continue;
            if (s->failed) return q35_fail(err, Q35_ERR_ARG, "calibration of '%s': its factorization failed", name);
            if (!s->H && !s->factored) return Q35_OK; /* not summed */
            if (!s->factored) {
                q35_status st = q35_gptq_make(s->H, s->n_in, Q35_GPTQ_DAMP, 1, c->threads, &s->g, err);
                if (st) {
                    s->failed = 1;
                    return st;
                }
                s->factored = 1;
                s->H = NULL;
            }
            *g = &s->g;
            if (rows) *rows = s->rows;
            return Q35_OK;
        }
    }
    return Q35_OK;
}

q35_status q35_calib_encode(q35_calib *c, const char *name, q35_dtype dt, int n_threads, void **out, size_t *bytes,
                            q35_error *err) {
    *out = NULL;
    *bytes = 0;
    const q35_tensor *src = q35_engine_weight(c->e, name);
    if (!src) return q35_fail(err, Q35_ERR_ARG, "calibration: no matrix called '%s'", name);
    if (q35_dtype_is_block(src->dtype) || src->ndim != 2 || !q35_dtype_is_block(dt))
        return q35_fail(err, Q35_ERR_ARG, "calibration: '%s' (%s) cannot be coded as %s from its bound weights", name,
                        q35_dtype_name(src->dtype), q35_dtype_name(dt));
    const q35_gptq *g = NULL;
    q35_status st = q35_calib_factor(c, name, &g, NULL, err);
    if (st || !g) return st;
    int64_t rows = src->shape[0], cols = src->shape[1];
    size_t nb = q35_cache_tensor_bytes(dt, src->ndim, src->shape);
    if (!nb) return q35_fail(err, Q35_ERR_ARG, "calibration: '%s' [%lld, %lld] cannot be stored as %s", name,
                             (long long)rows, (long long)cols, q35_dtype_name(dt));
    void *dst = aligned_alloc(64, (nb + 63) / 64 * 64);
    float *f = malloc((size_t)CALIB_ENCODE_ROWS * (size_t)cols * sizeof *f);
    if (!dst || !f) st = q35_fail(err, Q35_ERR_NOMEM, "calibration: out of memory coding '%s'", name);
    if (!st) memset(dst, 0, nb);
    for (int64_t r0 = 0; !st && r0 < rows; r0 += CALIB_ENCODE_ROWS) {
        int64_t k = rows - r0 < CALIB_ENCODE_ROWS ? rows - r0 : CALIB_ENCODE_ROWS;
        q35_dtype_decode(src->dtype, src->data, cols, r0 * cols, k * cols, f);
        st = q35_bfp_pack_gptq(dt, (uint8_t *)dst + q35_dtype_bytes(dt, r0, cols), f, k, cols, g, Q35_BFP_EXP_SEARCH,
                               n_threads, err);
    }
    free(f);
    if (st) {
        free(dst);
        return st;
    }
    *out = dst;
    *bytes = nb;
    return Q35_OK;
}
