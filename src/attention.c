/* attention.c: gated full attention, scalar reference (see attention.h).
 *
 *   qg = q_proj xn viewed (NH, 2*HD): query = first HD, gate = last HD of each head
 *   q = rmsnorm1p(query, q_norm), k = rmsnorm1p(k_proj xn, k_norm), per head
 *   rotate-half RoPE on the first RD dims of q and k; the rest pass through
 *   o = softmax(q k^T / sqrt(HD), causal) v, q head h reads kv head h / (NH/NKV)
 *   out = o_proj (o * sigmoid(gate)) */
#include "attention.h"
#include "compute.h"

#include <math.h>
#include <stdlib.h>

size_t q35_attention_scratch_floats(const q35_config *c, int32_t n_tok, int32_t n_ctx) {
    size_t T = (size_t)n_tok, NH = (size_t)c->n_head, HD = (size_t)c->head_dim, NKV = (size_t)c->n_head_kv;
    /* qg (T, NH*2*HD), k and v (T, NKV*HD), o (T, NH*HD), scores (n_ctx), rope cos/sin (RD/2 each) */
    return T * NH * HD * 2 + T * NKV * HD * 2 + T * NH * HD + (size_t)n_ctx + (size_t)c->rotary_dim;
}

void q35_rmsnorm1p_to(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps) {
    double ss = 0.0;
    for (int32_t i = 0; i < n; i++) ss += (double)src[i] * src[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (int32_t i = 0; i < n; i++) dst[i] = src[i] * r * (1.0f + q35_tensor_get_f32(w, i));
}

void q35_rmsnorm1p(float *x, const q35_tensor *w, int32_t n, float eps) { q35_rmsnorm1p_to(x, x, w, n, eps); }

/* transformers: inv_freq[i] = 1 / theta^(2i/RD) and angle = pos * inv_freq, in fp32. */
static void rope(float *x, int32_t pos, int32_t rd, const float *inv_freq) {
    int32_t half = rd / 2;
    for (int32_t i = 0; i < half; i++) {
        float ang = (float)pos * inv_freq[i];
        float cs = cosf(ang), sn = sinf(ang);
        float a = x[i], b = x[i + half];
        x[i] = a * cs - b * sn;
        x[i + half] = b * cs + a * sn;
    }
}

void q35_attention_forward(const q35_config *c, const q35_layer_weights *l, float *k_cache, float *v_cache,
                           int32_t pos0, const float *xn, float *out, int32_t n_tok, float *scratch, q35_pool *pool) {
    const int32_t T = n_tok, NH = c->n_head, NKV = c->n_head_kv, HD = c->head_dim, RD = c->rotary_dim;
    const int32_t QD = NH * HD, KVD = NKV * HD, group = NH / NKV;
    float *qg = scratch, *k = qg + (size_t)T * QD * 2, *v = k + (size_t)T * KVD, *o = v + (size_t)T * KVD;
    float *scores = o + (size_t)T * QD, *inv_freq = scores + pos0 + T;

    q35_matmul(pool, qg, &l->q_proj, xn, T);
    q35_matmul(pool, k, &l->k_proj, xn, T);
    q35_matmul(pool, v, &l->v_proj, xn, T);
    for (int32_t i = 0; i < RD / 2; i++) inv_freq[i] = 1.0f / powf(c->rope_theta, (float)(2 * i) / (float)RD);

    for (int32_t t = 0; t < T; t++) {
        int32_t pos = pos0 + t;
        for (int32_t h = 0; h < NH; h++) {
            float *qh = qg + (size_t)t * QD * 2 + (size_t)h * 2 * HD;
            q35_rmsnorm1p(qh, &l->q_norm, HD, c->rms_norm_eps);
            rope(qh, pos, RD, inv_freq);
        }
        for (int32_t h = 0; h < NKV; h++) {
            float *kh = k + (size_t)t * KVD + (size_t)h * HD;
            q35_rmsnorm1p(kh, &l->k_norm, HD, c->rms_norm_eps);
            rope(kh, pos, RD, inv_freq);
        }
        memcpy(k_cache + (size_t)pos * KVD, k + (size_t)t * KVD, sizeof(float) * (size_t)KVD);
        memcpy(v_cache + (size_t)pos * KVD, v + (size_t)t * KVD, sizeof(float) * (size_t)KVD);
    }

    const float scale = 1.0f / sqrtf((float)HD);
    for (int32_t t = 0; t < T; t++) {
        int32_t n_keys = pos0 + t + 1;
        for (int32_t h = 0; h < NH; h++) {
            const float *qh = qg + (size_t)t * QD * 2 + (size_t)h * 2 * HD;
            const float *gate = qh + HD;
            int32_t kvh = h / group;
            float mx = -INFINITY;
            for (int32_t p = 0; p < n_keys; p++) {
                const float *kp = k_cache + (size_t)p * KVD + (size_t)kvh * HD;
                double s = 0.0;
                for (int32_t d = 0; d < HD; d++) s += (double)qh[d] * kp[d];
                scores[p] = (float)s * scale;
                if (scores[p] > mx) mx = scores[p];
            }
            double sum = 0.0;
            for (int32_t p = 0; p < n_keys; p++) { scores[p] = expf(scores[p] - mx); sum += scores[p]; }
            float inv = (float)(1.0 / sum);
            float *oh = o + (size_t)t * QD + (size_t)h * HD;
            for (int32_t d = 0; d < HD; d++) oh[d] = 0.0f;
            for (int32_t p = 0; p < n_keys; p++) {
                const float *vp = v_cache + (size_t)p * KVD + (size_t)kvh * HD;
                float wgt = scores[p] * inv;
                for (int32_t d = 0; d < HD; d++) oh[d] += wgt * vp[d];
            }
            for (int32_t d = 0; d < HD; d++) oh[d] *= 1.0f / (1.0f + expf(-gate[d]));
        }
    }
    q35_matmul(pool, out, &l->o_proj, o, T);
}
