/* attention.c: gated full attention (see attention.h); the softmax over the
 * cache is the kernel table's attend_rows, per block of rows and KV head
 * with its query heads.
 *
 *   qg = q_proj xn viewed (NH, 2*HD): query = first HD, gate = last HD of each head
 *   q = rmsnorm1p(query, q_norm), k = rmsnorm1p(k_proj xn, k_norm), per head
 *   rotate-half RoPE on the first RD dims of q and k; the rest pass through
 *   o = softmax(q k^T / sqrt(HD), causal) v, q head h reads kv head h / (NH/NKV)
 *   out = o_proj (o * sigmoid(gate)) */
#include "backend/cpu/attention.h"

#include <math.h>
#include <stdlib.h>

/* Rows of one sequence that attend together (the kernels' attend_rows): a
 * prompt's rows read each key and value block from memory once per block
 * of rows instead of once per row. */
#define ATTN_ROWS 8

size_t q35_attention_scratch_floats(const q35_config *c, int32_t n_tok, int32_t n_ctx, int32_t n_workers) {
    size_t T = (size_t)n_tok, NH = (size_t)c->n_head, HD = (size_t)c->head_dim, NKV = (size_t)c->n_head_kv;
    /* qg (T, NH*2*HD), k and v (T, NKV*HD), o (T, NH*HD), rope inv_freq and a row's cosines and sines (RD / 2
     * each, in 2 RD), scores (ATTN_ROWS, NH/NKV, n_ctx) per worker */
    return T * NH * HD * 2 + T * NKV * HD * 2 + T * NH * HD + (size_t)2 * c->rotary_dim +
           (size_t)n_workers * ATTN_ROWS * (NH / NKV) * (size_t)n_ctx;
}

/* transformers: inv_freq[i] = 1 / theta^(2i/RD) and angle = pos * inv_freq[i], in fp32. The angles depend
 * on the row's position only, so a row's cosines and sines are made once (rope_table) and every q and k
 * head of the row rotated with them (rope_apply). With pos3 (mrope) each frequency takes the position
 * that the interleaved mrope_section layout (model.h) picks, (t, h, w); with t == h == w it is the
 * plain rotation at that position, bit for bit. */
static void rope_table(float *cs, float *sn, int32_t pos, const int32_t *pos3, const int32_t section[3], int32_t rd,
                       const float *inv_freq) {
    for (int32_t i = 0; i < rd / 2; i++) {
        int32_t p = pos;
        if (pos3) p = pos3[(i % 3 == 1 && i < 3 * section[1]) ? 1 : (i % 3 == 2 && i < 3 * section[2]) ? 2 : 0];
        float ang = (float)p * inv_freq[i];
        cs[i] = cosf(ang);
        sn[i] = sinf(ang);
    }
}

/* rotate-half on the first rd dims of x */
static void rope_apply(float *x, const float *cs, const float *sn, int32_t rd) {
    int32_t half = rd / 2;
    for (int32_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

typedef struct {
    const q35_config *c;
    const q35_kernels *k;
    const q35_attn_seg *segs;
    int32_t n_segs, n_tok;
    const float *qg;
    float *o, *scores;
    size_t scores_stride;
    _Atomic int64_t next; /* the first unit no worker has claimed */
} attn_job;

/* Rows [r, r + R) of sequence sg (consecutive positions) and KV head kvh:
 * causal softmax attention of the query heads that read kvh over the
 * sequence's cache, then their sigmoid output gates. */
static void attend(const attn_job *j, const q35_attn_seg *sg, int32_t r, int32_t R, int32_t kvh, float *scores) {
    const q35_config *c = j->c;
    const int32_t NH = c->n_head, NKV = c->n_head_kv, HD = c->head_dim, QD = NH * HD;
    const int32_t G = NH / NKV, h0 = kvh * G, n_keys = sg->pos0 + (r - sg->row0) + 1;
    const float *q = j->qg + (size_t)r * QD * 2 + (size_t)h0 * 2 * HD;
    float *o = j->o + (size_t)r * QD + (size_t)h0 * HD;
    const uint8_t *kc = (const uint8_t *)sg->k_cache + (size_t)kvh * sg->head_stride;
    const uint8_t *vc = (const uint8_t *)sg->v_cache + (size_t)kvh * sg->head_stride;
    if (sg->q8)
        j->k->attend_rows_q8(o, (size_t)QD, (size_t)HD, q, (size_t)QD * 2, (size_t)2 * HD, R, G, kc, vc,
                             q35_kv_q8_row_bytes(HD), n_keys, 1, HD, 1.0f / sqrtf((float)HD), scores);
    else
        j->k->attend_rows(o, (size_t)QD, (size_t)HD, q, (size_t)QD * 2, (size_t)2 * HD, R, G, (const float *)kc,
                          (const float *)vc, (size_t)HD, n_keys, 1, HD, 1.0f / sqrtf((float)HD), scores);
    for (int32_t t = 0; t < R; t++)
        for (int32_t g = 0; g < G; g++) {
            const float *gate = q + (size_t)t * QD * 2 + (size_t)g * 2 * HD + HD;
            float *oh = o + (size_t)t * QD + (size_t)g * HD;
            j->k->sigmoid_mul(oh, gate, oh, HD);
        }
}

/* The work in units of (block of ATTN_ROWS consecutive rows of one
 * sequence, KV head), blocks in segment order. */
static int64_t attn_units(const attn_job *j) {
    int64_t n = 0;
    for (int32_t si = 0; si < j->n_segs; si++) n += (j->segs[si].n_rows + ATTN_ROWS - 1) / ATTN_ROWS;
    return n * j->c->n_head_kv;
}

/* Units claimed one at a time by whichever worker is free (in increasing
 * order, so the walk over segments only moves forward). */
static void attn_worker(void *p, int ith, int nth) {
    attn_job *j = p;
    (void)nth;
    const int64_t NKV = j->c->n_head_kv, n = attn_units(j);
    int32_t si = 0;
    int64_t seg_first = 0; /* the first block of segment si */
    for (int64_t i; (i = q35_claim_one(&j->next, n)) >= 0;) {
        int64_t blk = i / NKV;
        int32_t kvh = (int32_t)(i % NKV);
        for (;;) {
            int64_t nb = (j->segs[si].n_rows + ATTN_ROWS - 1) / ATTN_ROWS;
            if (blk < seg_first + nb) break;
            seg_first += nb;
            si++;
        }
        const q35_attn_seg *sg = &j->segs[si];
        int32_t t0 = (int32_t)(blk - seg_first) * ATTN_ROWS;
        int32_t R = sg->n_rows - t0 < ATTN_ROWS ? sg->n_rows - t0 : ATTN_ROWS;
        attend(j, sg, sg->row0 + t0, R, kvh, j->scores + (size_t)ith * j->scores_stride);
    }
}

void q35_attention_forward(const q35_host *hc, const q35_config *c, const q35_layer_weights *l, const q35_attn_seg *segs,
                           int32_t n_segs, const float *xn, float *out, int32_t n_tok, int32_t n_ctx, float *scratch) {
    const int32_t T = n_tok, NH = c->n_head, NKV = c->n_head_kv, HD = c->head_dim, RD = c->rotary_dim;
    const int32_t QD = NH * HD, KVD = NKV * HD;
    float *qg = scratch, *k = qg + (size_t)T * QD * 2, *v = k + (size_t)T * KVD, *o = v + (size_t)T * KVD;
    float *inv_freq = o + (size_t)T * QD, *rope_cs = inv_freq + RD / 2, *rope_sn = rope_cs + RD / 2;
    float *scores = inv_freq + 2 * RD;

    float *ys[3] = {qg, k, v};
    const q35_tensor *Ws[3] = {&l->q_proj, &l->k_proj, &l->v_proj};
    q35_matmul_multi(hc, 3, ys, Ws, xn, T);
    const double t0 = hc->prof ? q35_now_seconds() : 0;
    for (int32_t i = 0; i < RD / 2; i++) inv_freq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)RD);

    for (int32_t si = 0; si < n_segs; si++) {
        const q35_attn_seg *sg = &segs[si];
        for (int32_t t = 0; t < sg->n_rows; t++) {
            int32_t r = sg->row0 + t, pos = sg->pos0 + t;
            const int32_t *p3 = sg->pos3 ? sg->pos3 + (size_t)3 * t : NULL;
            rope_table(rope_cs, rope_sn, pos + sg->rope_delta, p3, c->mrope_section, RD, inv_freq);
            for (int32_t h = 0; h < NH; h++) {
                float *qh = qg + (size_t)r * QD * 2 + (size_t)h * 2 * HD;
                q35_rmsnorm1p(qh, &l->q_norm, HD, c->rms_norm_eps);
                rope_apply(qh, rope_cs, rope_sn, RD);
            }
            for (int32_t h = 0; h < NKV; h++) {
                float *kh = k + (size_t)r * KVD + (size_t)h * HD;
                q35_rmsnorm1p(kh, &l->k_norm, HD, c->rms_norm_eps);
                rope_apply(kh, rope_cs, rope_sn, RD);
            }
            const size_t row_bytes = q35_kv_row_bytes(sg->q8, HD);
            for (int32_t h = 0; h < NKV; h++) {
                size_t at = (size_t)h * sg->head_stride + (size_t)pos * row_bytes, from = (size_t)r * KVD + (size_t)h * HD;
                uint8_t *kd = (uint8_t *)sg->k_cache + at, *vd = (uint8_t *)sg->v_cache + at;
                if (sg->q8) {
                    q35_kv_q8_quantize(kd, k + from, HD);
                    q35_kv_q8_quantize(vd, v + from, HD);
                } else {
                    memcpy(kd, k + from, sizeof(float) * (size_t)HD);
                    memcpy(vd, v + from, sizeof(float) * (size_t)HD);
                }
            }
        }
    }
    attn_job j = {c, hc->k, segs, n_segs, T, qg, o, scores, (size_t)ATTN_ROWS * (NH / NKV) * n_ctx, 0};
    double work = 0; /* multiply-adds, to keep tiny jobs off the pool */
    for (int32_t si = 0; si < n_segs; si++) work += (double)segs[si].n_rows * (segs[si].pos0 + segs[si].n_rows) * NH * HD;
    if (work < 1e5) attn_worker(&j, 0, 1);
    else q35_pool_run(hc->pool, attn_worker, &j);
    if (hc->prof)
        q35_prof_add(hc->prof, hc->prof_rows, "attention: norms, rope, cache, scores, values", 0, q35_now_seconds() - t0);
    q35_matmul(hc, out, &l->o_proj, o, T);
}
