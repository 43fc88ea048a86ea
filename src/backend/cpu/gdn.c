/* gdn.c: Gated DeltaNet forward (see gdn.h).
 *
 * Data flow for n_tok tokens (HF modeling_qwen3_5.py semantics, fp32):
 *   qkv = in_proj_qkv xn; z = in_proj_z xn; b = in_proj_b xn; a = in_proj_a xn
 *   qkv = silu(causal depthwise conv(qkv)) with conv_state as history
 *   q, k per K head: l2norm (eps 1e-6 inside the sqrt of the sum); q *= DK^-1/2
 *   beta = sigmoid(b); g = -exp(A_log) * softplus(a + dt_bias)
 *   V head hv reads K head hv / (HV/HK) (repeat-interleave, not tile)
 *   o = delta rule over S; o = rmsnorm(o) * w * silu(z); out = out_proj o
 * The four projections are one pool handoff; everything between them and
 * out_proj is a second one, over (sequence, K head) items: each item runs
 * the conv and norms of its own channels and then its V heads, so a decode
 * step reads each head's state twice (kernels.h: gdn_recurrent) and nothing
 * else waits on a single thread. A step of one row per sequence (decode,
 * alone or batched) makes the two one handoff over K heads instead
 * (layer_worker). */
#include "backend/cpu/gdn.h"

#include <math.h>
#include <stdlib.h>

static inline float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); } /* torch threshold 20 */

/* Per worker: packed q, k (T, DK), v, o (T, DV), g, beta (T) of one head, and the chunk scratch. */
static size_t head_scratch_floats(const q35_config *c, int32_t n_tok) {
    size_t T = (size_t)n_tok, DK = (size_t)c->lin_head_k_dim, DV = (size_t)c->lin_head_v_dim;
    return T * (DK * 2 + DV * 2 + 2) + q35_gdn_chunk_scratch_floats((int32_t)DK, (int32_t)DV);
}

size_t q35_gdn_scratch_floats(const q35_config *c, int32_t n_tok, int32_t n_workers) {
    size_t T = (size_t)n_tok, CD = (size_t)q35_conv_dim(c), HV = (size_t)c->lin_n_head_v;
    size_t DV = (size_t)c->lin_head_v_dim;
    /* raw qkv and conv output (T, CD), z and core output (T, HV*DV), b and a (T, HV) */
    return T * CD * 2 + T * HV * DV * 2 + T * HV * 2 + (size_t)n_workers * head_scratch_floats(c, n_tok);
}

void q35_gdn_recurrent(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                       float *o, int32_t T, int32_t DK, int32_t DV, float *S_after, size_t after_stride) {
    q35_kernels_get()->gdn_recurrent(S, q, k, v, g, beta, o, T, DK, DV, S_after, after_stride, NULL);
}

void q35_gdn_chunked(float *S, const float *q, const float *k, const float *v, const float *g, const float *beta,
                     float *o, int32_t T, int32_t DK, int32_t DV, float *scratch) {
    q35_kernels_get()->gdn_chunked(S, q, k, v, g, beta, o, T, DK, DV, scratch);
}

static void l2norm(float *x, int32_t n) {
    float r = 1.0f / sqrtf((float)q35_sum_squares(x, n) + 1e-6f);
    for (int32_t i = 0; i < n; i++) x[i] *= r;
}

typedef struct {
    const q35_kernels *k;
    const q35_config *c;
    const q35_layer_weights *l;
    const q35_gdn_seg *segs;
    int32_t n_segs;
    const float *raw, *z, *bb, *aa;
    float *y, *core, *head_scratch;
    size_t head_stride;
    _Atomic int64_t next; /* the first item no worker has claimed */
} heads_job;

/* Causal depthwise conv + SiLU of channels [ch0, ch0 + n) over one
 * sequence's rows (raw -> y), advancing its conv state: tap j multiplies the
 * input CK-1-j steps back. The taps go to the kernel as fp32, 64 channels at
 * a time. */
static void conv_channels(const heads_job *j, const q35_gdn_seg *sg, int32_t ch0, int32_t n) {
    const q35_config *c = j->c;
    const int32_t CD = q35_conv_dim(c), CK = c->lin_conv_kernel;
    const size_t r0 = (size_t)sg->row0 * CD;
    for (int32_t b = ch0; b < ch0 + n; b += 64) {
        const int32_t nb = ch0 + n - b < 64 ? ch0 + n - b : 64;
        float w[64 * 16];
        q35_weights_f32(w, &j->l->conv1d, (int64_t)b * CK, (int64_t)nb * CK);
        j->k->conv_silu(j->y + r0 + b, (size_t)CD, j->raw + r0 + b, (size_t)CD, w,
                        sg->conv_state + (size_t)b * (CK - 1), nb, sg->n_rows, CK,
                        sg->rows_conv ? sg->rows_conv + (size_t)b * (CK - 1) : NULL, sg->rows_stride);
    }
}

/* One V head h of one sequence: gates, delta rule over the sequence's rows,
 * gated RMSNorm into core. Its q, k and v are in y already. S_next: the
 * state this worker runs next (NULL: none), for the recurrence's prefetch. */
static void run_head(const heads_job *j, const q35_gdn_seg *sg, int32_t h, float *scr, const float *S_next) {
    const q35_config *c = j->c;
    const q35_layer_weights *l = j->l;
    const int32_t T = sg->n_rows, r0 = sg->row0, CD = q35_conv_dim(c);
    const int32_t HK = c->lin_n_head_k, HV = c->lin_n_head_v, DK = c->lin_head_k_dim, DV = c->lin_head_v_dim;
    const int32_t KD = HK * DK, VD = HV * DV, kh = h / (HV / HK);
    float *hq = scr, *hk = hq + (size_t)T * DK, *hv = hk + (size_t)T * DK, *ho = hv + (size_t)T * DV;
    float *hg = ho + (size_t)T * DV, *hb = hg + T, *chunk = hb + T;
    float A = expf(q35_tensor_get_f32(&l->A_log, h)), dt = q35_tensor_get_f32(&l->dt_bias, h);
    for (int32_t t = 0; t < T; t++) {
        const float *yt = j->y + (size_t)(r0 + t) * CD;
        memcpy(hq + (size_t)t * DK, yt + kh * DK, sizeof(float) * (size_t)DK);
        memcpy(hk + (size_t)t * DK, yt + KD + kh * DK, sizeof(float) * (size_t)DK);
        memcpy(hv + (size_t)t * DV, yt + 2 * KD + h * DV, sizeof(float) * (size_t)DV);
        hb[t] = sigmoidf_(j->bb[(size_t)(r0 + t) * HV + h]);
        hg[t] = -A * softplus(j->aa[(size_t)(r0 + t) * HV + h] + dt);
    }
    float *S = sg->ssm_state + (size_t)h * DK * DV;
    if (sg->recurrent || sg->rows_ssm || T == 1)
        j->k->gdn_recurrent(S, hq, hk, hv, hg, hb, ho, T, DK, DV, sg->rows_ssm ? sg->rows_ssm + (size_t)h * DK * DV : NULL,
                            sg->rows_stride, S_next);
    else
        j->k->gdn_chunked(S, hq, hk, hv, hg, hb, ho, T, DK, DV, chunk);
    for (int32_t t = 0; t < T; t++) { /* gated RMSNorm: normalise, * w (plain), * silu(z) */
        const float *o = ho + (size_t)t * DV, *zt = j->z + (size_t)(r0 + t) * VD + h * DV;
        float r = 1.0f / sqrtf((float)(q35_sum_squares(o, DV) / DV) + c->rms_norm_eps);
        float *dst = j->core + (size_t)(r0 + t) * VD + h * DV;
        j->k->silu_mul(dst, zt, NULL, DV);
        for (int32_t i0 = 0; i0 < DV; i0 += 256) { /* the weights converted 256 at a time */
            float wn[256];
            const int32_t m = DV - i0 < 256 ? DV - i0 : 256;
            q35_weights_f32(wn, &l->gdn_norm, i0, m);
            for (int32_t i = 0; i < m; i++) dst[i0 + i] = o[i0 + i] * r * wn[i] * dst[i0 + i];
        }
    }
}

/* One K head kh of one sequence and the V heads that read it: conv of its
 * q, k and v channels, L2 norm of q and k, then each V head. Items touch
 * disjoint channels, states and outputs, so any worker may run any. */
static void run_k_head(const heads_job *j, int32_t seg_i, int32_t kh, float *scr, const float *S_next) {
    const q35_config *c = j->c;
    const q35_gdn_seg *sg = &j->segs[seg_i];
    const int32_t HK = c->lin_n_head_k, HV = c->lin_n_head_v, DK = c->lin_head_k_dim, DV = c->lin_head_v_dim;
    const int32_t KD = HK * DK, CD = q35_conv_dim(c), rep = HV / HK;
    conv_channels(j, sg, kh * DK, DK);
    conv_channels(j, sg, KD + kh * DK, DK);
    conv_channels(j, sg, 2 * KD + kh * rep * DV, rep * DV);
    const float s = 1.0f / sqrtf((float)DK);
    for (int32_t t = 0; t < sg->n_rows; t++) {
        float *yt = j->y + (size_t)(sg->row0 + t) * CD;
        l2norm(yt + kh * DK, DK);
        l2norm(yt + KD + kh * DK, DK);
        for (int32_t i = 0; i < DK; i++) yt[kh * DK + i] *= s;
    }
    for (int32_t h = kh * rep; h < (kh + 1) * rep; h++)
        run_head(j, sg, h, scr, h + 1 < (kh + 1) * rep ? sg->ssm_state + (size_t)(h + 1) * DK * DV : S_next);
}

/* Items (sequence, K head) claimed one at a time by whichever worker is
 * free: a fixed share per worker left the step to the slower core wherever
 * another tenant took one. The last V head's delta rule prefetches the
 * first state of item i + nth, the one this worker claims next when the
 * workers keep pace (a hint only: any guess gives the same results). */
static void heads_worker(void *p, int ith, int nth) {
    heads_job *j = p;
    const int64_t HK = j->c->lin_n_head_k, n = (int64_t)j->n_segs * HK;
    const int64_t rep = j->c->lin_n_head_v / HK, DKV = (int64_t)j->c->lin_head_k_dim * j->c->lin_head_v_dim;
    for (int64_t i; (i = q35_claim_one(&j->next, n)) >= 0;) {
        const int64_t guess = i + nth;
        run_k_head(j, (int32_t)(i / HK), (int32_t)(i % HK), j->head_scratch + (size_t)ith * j->head_stride,
                   guess < n ? j->segs[guess / HK].ssm_state + (size_t)(guess % HK * rep * DKV) : NULL);
    }
}

/* The whole layer up to out_proj for a step of one row per sequence (a
 * decode step, alone or batched), in one hand-off: a worker takes ranges of K heads (q35_homes: its own
 * share first) and for each computes the rows of the four projections that
 * those heads read (their q and k channels, their V heads' v and z
 * channels, b and a) in one kernel call, then those heads of every
 * sequence, so the heads' inputs are in the cache of the core that wrote
 * them. With the projections and the heads claimed apart
 * (q35_matmul_multi, then heads_worker) the heads read them from the other
 * core's cache, and in the VM's fast-reading spells that part doubled
 * (docs/performance.md). Every row and head has the value the two
 * hand-offs give it (a row's value does not depend on its range), so the
 * results are bit for bit the same. */
typedef struct {
    heads_job h;
    const float *xn;
    uint64_t epoch; /* q35_kernels_x_epoch: each worker quantizes xn once */
    int prof;       /* time worker 0's projections (t_proj, seconds) */
    double t_proj;
    q35_homes homes;
} layer_job;

static void layer_worker(void *p, int ith, int nth) {
    (void)nth;
    layer_job *lj = p;
    const heads_job *j = &lj->h;
    const q35_config *c = j->c;
    const q35_layer_weights *l = j->l;
    const int64_t HK = c->lin_n_head_k, DK = c->lin_head_k_dim, DV = c->lin_head_v_dim;
    const int64_t rep = c->lin_n_head_v / HK, KD = HK * DK, DKV = DK * DV;
    float *const ys[6] = {(float *)j->raw, (float *)j->raw, (float *)j->raw, (float *)j->z, (float *)j->bb,
                          (float *)j->aa};
    const q35_tensor *Ws[6] = {&l->in_proj_qkv, &l->in_proj_qkv, &l->in_proj_qkv, &l->in_proj_z, &l->in_proj_b,
                               &l->in_proj_a};
    float *scr = j->head_scratch + (size_t)ith * j->head_stride;
    int64_t lo, hi;
    q35_kernels_x_epoch = lj->epoch;
    while (q35_homes_claim(&lj->homes, ith, &lo, &hi)) {
        const int64_t o0[6] = {lo * DK, KD + lo * DK, 2 * KD + lo * rep * DV, lo * rep * DV, lo * rep, lo * rep};
        const int64_t o1[6] = {hi * DK, KD + hi * DK, 2 * KD + hi * rep * DV, hi * rep * DV, hi * rep, hi * rep};
        const double t0 = ith == 0 && lj->prof ? q35_now_seconds() : 0;
        j->k->matmul_n(6, ys, Ws, lj->xn, j->n_segs, o0, o1);
        if (t0) lj->t_proj += q35_now_seconds() - t0;
        for (int32_t si = 0; si < j->n_segs; si++)
            for (int64_t kh = lo; kh < hi; kh++) { /* prefetching the state of the next (sequence, K head) */
                const int32_t ns = kh + 1 < hi ? si : si + 1;
                const int64_t nk = kh + 1 < hi ? kh + 1 : lo;
                run_k_head(j, si, (int32_t)kh, scr,
                           ns < j->n_segs ? j->segs[ns].ssm_state + (size_t)(nk * rep * DKV) : NULL);
            }
    }
    q35_kernels_x_epoch = 0;
}

void q35_gdn_forward(const q35_host *hc, const q35_config *c, const q35_layer_weights *l, const q35_gdn_seg *segs,
                     int32_t n_segs, const float *xn, float *out, int32_t n_tok, float *scratch) {
    const int32_t T = n_tok, CD = q35_conv_dim(c);
    const int32_t HV = c->lin_n_head_v, DK = c->lin_head_k_dim, DV = c->lin_head_v_dim, VD = HV * DV;
    float *raw = scratch, *y = raw + (size_t)T * CD, *z = y + (size_t)T * CD, *core = z + (size_t)T * VD;
    float *bb = core + (size_t)T * VD, *aa = bb + (size_t)T * HV, *heads = aa + (size_t)T * HV;

    float *ys[4] = {raw, z, bb, aa};
    const q35_tensor *Ws[4] = {&l->in_proj_qkv, &l->in_proj_z, &l->in_proj_b, &l->in_proj_a};
    int32_t max_rows = 0;
    for (int32_t si = 0; si < n_segs; si++) if (segs[si].n_rows > max_rows) max_rows = segs[si].n_rows;
    heads_job j = {hc->k, c, l, segs, n_segs, raw, z, bb, aa, y, core, heads, head_scratch_floats(c, max_rows), 0};
    /* a handoff costs microseconds: tiny models run their heads inline */
    const int big = (double)T * HV * DK * DV >= 1e5;
    if (big && n_segs == T) { /* one row per sequence (decode, batch steps): layer_worker */
        if (hc->tap) hc->tap(hc->tap_ctx, 4, Ws, xn, T);
        const double t0 = hc->prof ? q35_now_seconds() : 0;
        layer_job lj = {j, xn, q35_x_epoch_new(), hc->prof != NULL, 0, {0}};
        q35_homes_init(&lj.homes, c->lin_n_head_k, q35_pool_size(hc->pool));
        q35_pool_run(hc->pool, layer_worker, &lj);
        if (hc->prof) { /* worker 0's projections, then the rest of the hand-off */
            q35_prof_matmuls(hc, hc->prof_rows, 4, Ws, "", lj.t_proj);
            q35_prof_add(hc->prof, hc->prof_rows, "gdn: conv, norms, delta rule", 0, q35_now_seconds() - t0 - lj.t_proj);
        }
    } else {
        q35_matmul_multi(hc, 4, ys, Ws, xn, T); /* the four projections of xn in one pass over the pool */
        const double t0 = hc->prof ? q35_now_seconds() : 0;
        if (big) q35_pool_run(hc->pool, heads_worker, &j);
        else heads_worker(&j, 0, 1);
        if (hc->prof) q35_prof_add(hc->prof, hc->prof_rows, "gdn: conv, norms, delta rule", 0, q35_now_seconds() - t0);
    }
    q35_matmul(hc, out, &l->out_proj, core, T);
}
