/* calib.c: calibration statistics for the GPTQ encoder (see calib.h). */
#include "core/calib.h"
#include "formats/gptq.h"

#include <stdlib.h>
#include <string.h>

#define CALIB_SLICE 64    /* rows of logits at a time */
#define CALIB_MAX_W 8     /* matrices sharing one input */

typedef struct calib_slot {
    const q35_tensor *W[CALIB_MAX_W];
    int n_w;
    int64_t n_in, rows;
    double *H;    /* (n_in, n_in): the upper triangle of sum x x^T, until factored */
    q35_gptq g;   /* g.U took H over */
    int factored;
} calib_slot;

struct q35_calib {
    q35_engine *e;
    calib_slot *slots;
    int32_t n_slots, cap;
    int failed;   /* out of memory inside the tap */
};

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
    double *H = calloc((size_t)n_in * (size_t)n_in, sizeof *H);
    if (!H) return NULL;
    calib_slot *s = &c->slots[c->n_slots++];
    memset(s, 0, sizeof *s);
    s->n_w = n < CALIB_MAX_W ? n : CALIB_MAX_W;
    for (int i = 0; i < s->n_w; i++) s->W[i] = Ws[i];
    s->n_in = n_in;
    s->H = H;
    return s;
}

/* H += x^T x over the upper triangle, one row at a time (an axpy per input,
 * which the compiler vectorizes at -O3). */
__attribute__((optimize("O3"))) static void add_rows(double *H, const float *x, int64_t n_tok, int64_t m) {
    for (int64_t t = 0; t < n_tok; t++) {
        const float *xt = x + t * m;
        for (int64_t i = 0; i < m; i++) {
            double xi = xt[i], *h = H + i * m;
            if (xi == 0) continue;
            for (int64_t j = i; j < m; j++) h[j] += xi * (double)xt[j];
        }
    }
}

static void calib_tap(void *ctx, int n, const q35_tensor *const *Ws, const float *x, int64_t n_tok) {
    q35_calib *c = ctx;
    if (c->failed || n < 1) return;
    calib_slot *s = slot_of(c, n, Ws);
    if (!s) { c->failed = 1; return; }
    add_rows(s->H, x, n_tok, s->n_in);
    s->rows += n_tok;
}

q35_status q35_calib_collect(q35_engine *e, const int32_t *ids, int32_t n, int32_t win, q35_calib **out,
                             q35_error *err) {
    *out = NULL;
    if (n < 1 || win < 1) return q35_fail(err, Q35_ERR_ARG, "calibration: no tokens");
    q35_calib *c = calloc(1, sizeof *c);
    int32_t V = q35_engine_info(e)->vocab_size;
    float *logits = malloc((size_t)CALIB_SLICE * (size_t)V * sizeof *logits);
    q35_session *s = NULL;
    q35_status st = !c || !logits ? q35_fail(err, Q35_ERR_NOMEM, "calibration: out of memory") : Q35_OK;
    if (!st) c->e = e;
    if (!st) st = q35_session_new(e, win, &s, err);
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
            if (!s->factored) {
                q35_status st = q35_gptq_make(s->H, s->n_in, Q35_GPTQ_DAMP, 1, &s->g, err);
                if (st) return st;
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
