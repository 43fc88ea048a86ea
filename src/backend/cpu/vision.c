/* vision.c: the vision tower's forward pass on the host (vision.h has the
 * math), written as transformers' Qwen3_5VisionModel computes it:
 *
 *   position table: per patch (row r, column c of an h x w grid), bilinear
 *     with align_corners over the side x side table, four taps
 *     (r0,c0) (r0,c1) (r1,c0) (r1,c1) with weights wr*wc, src = r*(side-1)/(h-1);
 *   rotary: head dim D, inv_freq[j] = theta^(-2j / (D/2)) for j < D/4; the
 *     first D/4 angles are r * inv_freq, the next D/4 are c * inv_freq, and
 *     the rotation pairs element i with i + D/2 (rotate_half);
 *   LayerNorm eps 1e-6 everywhere, the MLP's gelu is the tanh form, the
 *     merger's is the exact (erf) one. The tanh form is computed as
 *     0.5 v (1 + tanh(u)) = v / (1 + exp(-2u)), the same function (one expf
 *     instead of tanhf, a third of the MLP's non-matmul time).
 * Patches arrive in merge-block order, and positions are computed in that
 * order, so the merger's groups are MS*MS consecutive rows. */
#include "backend/cpu/vision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define VISION_LN_EPS 1e-6f

int64_t q35_vision_out_rows(const q35_vision_config *vc, int32_t n_images, const int32_t (*grid)[3], q35_error *err) {
    int64_t n = 0;
    const int32_t m = vc->merge_size;
    for (int32_t i = 0; i < n_images; i++) {
        if (grid[i][0] < 1 || grid[i][1] < m || grid[i][2] < m || grid[i][1] % m || grid[i][2] % m ||
            grid[i][1] > 65536 || grid[i][2] > 65536 || grid[i][0] > 4096) {
            q35_fail(err, Q35_ERR_ARG, "vision: image %d has grid (%d, %d, %d), not a positive multiple of merge %d",
                     i, grid[i][0], grid[i][1], grid[i][2], m);
            return 0;
        }
        n += (int64_t)grid[i][0] * grid[i][1] * grid[i][2];
    }
    if (n == 0) q35_fail(err, Q35_ERR_ARG, "vision: no images");
    return n / ((int64_t)m * m);
}

static void vec_f32(float *dst, const q35_tensor *t, int64_t n) {
    for (int64_t i = 0; i < n; i++) dst[i] = q35_tensor_get_f32(t, i);
}

static void add_bias(float *y, const float *b, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) y[r * n + i] += b[i];
}

/* x += y + b, row by row (a loop the compiler vectorizes; an index modulo n did not) */
static void add_residual(float *x, const float *y, const float *b, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t i = 0; i < n; i++) x[r * n + i] += y[r * n + i] + b[i];
}

static void layer_norm(float *dst, const float *src, const float *w, const float *b, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        const float *x = src + r * n;
        float *y = dst + r * n;
        double mean = 0, var = 0;
        for (int64_t i = 0; i < n; i++) mean += x[i];
        mean /= (double)n;
        for (int64_t i = 0; i < n; i++) var += ((double)x[i] - mean) * ((double)x[i] - mean);
        const float rstd = (float)(1.0 / sqrt(var / (double)n + VISION_LN_EPS)), mu = (float)mean;
        for (int64_t i = 0; i < n; i++) y[i] = (x[i] - mu) * rstd * w[i] + b[i];
    }
}

/* (row, column) of patch k of one frame, in merge-block order */
static void patch_rc(int64_t k, int32_t w, int32_t m, int32_t *row, int32_t *col) {
    const int64_t bw = w / m, in_col = k % m, in_row = (k / m) % m, block = k / ((int64_t)m * m);
    *row = (int32_t)((block / bw) * m + in_row);
    *col = (int32_t)((block % bw) * m + in_col);
}

/* one axis of the bilinear, align_corners resampling, as transformers'
 * _interpolation_axis_taps_weights computes it in float32 */
static void axis_taps(int32_t index, int32_t size, int32_t side, int32_t taps[2], float wt[2]) {
    const float src = (float)index * (float)(side - 1) / (float)(size - 1 > 1 ? size - 1 : 1);
    const float f = floorf(src);
    for (int o = 0; o < 2; o++) {
        int32_t t = (int32_t)f + o;
        taps[o] = t < 0 ? 0 : t > side - 1 ? side - 1 : t;
        float d = fabsf(src - f - (float)o), v = 1.0f - d;
        wt[o] = v > 0 ? v : 0;
    }
}

/* Attention of one frame, one (head, block of ATTN_QBLOCK queries) at a
 * time, as two products through the kernels' gemm_f32: S = Q K^T with the
 * head's keys stored transposed, softmax_rows, then O = P V. gemm_f32
 * computes each row alone (kernels.h), so a query's output does not depend
 * on its block or on the thread that runs it. (Through the matmul tiles,
 * with K as the weight matrix, S took as long as O: the tiles' horizontal
 * sum per output is as costly as the 72 products it sums.) */
#define ATTN_QBLOCK 64

typedef struct attn_job {
    const q35_kernels *k;
    const float *qh;      /* (n_head, len, head_dim): q of each head, rotated */
    const float *kt;      /* (n_head, head_dim, len): k of each head, rotated, transposed */
    const float *vh;      /* (n_head, len, head_dim): v of each head */
    float *out;           /* (len, hidden) */
    float *scratch;       /* (nth, ATTN_QBLOCK * len) */
    int32_t len, n_head, head_dim, hidden;
    float scale;
} attn_job;

static void attn_worker(void *p, int ith, int nth) {
    const attn_job *j = p;
    const int32_t len = j->len, D = j->head_dim;
    const int64_t n_blk = (len + ATTN_QBLOCK - 1) / ATTN_QBLOCK;
    int64_t lo, hi;
    q35_split((int64_t)j->n_head * n_blk, 1, ith, nth, &lo, &hi);
    float *S = j->scratch + (size_t)ith * ATTN_QBLOCK * len;
    for (int64_t u = lo; u < hi; u++) {
        const int32_t hd = (int32_t)(u / n_blk), q0 = (int32_t)(u % n_blk) * ATTN_QBLOCK;
        const int32_t nq = len - q0 < ATTN_QBLOCK ? len - q0 : ATTN_QBLOCK;
        j->k->gemm_f32(S, (size_t)len, j->qh + ((size_t)hd * len + q0) * D, (size_t)D, j->kt + (size_t)hd * D * len,
                       (size_t)len, nq, len, D);
        j->k->softmax_rows(S, (size_t)len, nq, len, j->scale);
        j->k->gemm_f32(j->out + (size_t)q0 * j->hidden + (size_t)hd * D, (size_t)j->hidden, S, (size_t)len,
                       j->vh + (size_t)hd * len * D, (size_t)D, nq, D, len);
    }
}

/* q, k and v of one frame's rows (len, 3 * hidden) into attn_job's per-head layouts */
static void attn_gather(float *qh, float *kt, float *vh, const float *qkv, int32_t len, int32_t n_head, int32_t D,
                        int32_t hidden) {
    for (int32_t r = 0; r < len; r++) {
        const float *row = qkv + (size_t)r * 3 * hidden;
        for (int32_t hd = 0; hd < n_head; hd++) {
            memcpy(qh + ((size_t)hd * len + r) * D, row + (size_t)hd * D, sizeof(float) * (size_t)D);
            memcpy(vh + ((size_t)hd * len + r) * D, row + 2 * (size_t)hidden + (size_t)hd * D, sizeof(float) * (size_t)D);
            const float *k = row + hidden + (size_t)hd * D;
            for (int32_t d = 0; d < D; d++) kt[((size_t)hd * D + d) * len + r] = k[d];
        }
    }
}

static void rotate(float *x, const float *cs, const float *sn, int32_t D) {
    const int32_t half = D / 2;
    for (int32_t i = 0; i < half; i++) {
        const float a = x[i], b = x[i + half];
        x[i] = a * cs[i] - b * sn[i];
        x[i + half] = b * cs[i] + a * sn[i];
    }
}

q35_status q35_vision_forward(const q35_host *h, const q35_vision_config *vc, const q35_vision_weights *w,
                              const float *pixel_values, int32_t n_images, const int32_t (*grid)[3], float *out,
                              q35_error *err) {
    if (!w->present) return q35_fail(err, Q35_ERR_UNSUPPORTED, "vision: the model has no vision tower weights");
    const int64_t n_out = q35_vision_out_rows(vc, n_images, grid, err);
    if (n_out == 0) return err ? err->status : Q35_ERR_ARG;
    const int32_t m = vc->merge_size, VH = vc->hidden_size, VI = vc->intermediate_size, D = vc->head_dim;
    const int32_t side = vc->grid_per_side, NH = vc->n_head;
    const int64_t N = n_out * m * m, VM = (int64_t)VH * m * m;
    int32_t max_len = 0;
    for (int32_t i = 0; i < n_images; i++)
        if (grid[i][1] * grid[i][2] > max_len) max_len = grid[i][1] * grid[i][2];
    if (D / 4 > 1024) return q35_fail(err, Q35_ERR_UNSUPPORTED, "vision: head_dim %d is over 4096", D);
    const int nth = h->pool ? q35_pool_size(h->pool) : 1;
    const int64_t vmax = VI > 3 * VH ? VI : 3 * VH;
    float *x = malloc(sizeof(float) * (size_t)(N * VH)), *ln = malloc(sizeof(float) * (size_t)(N * VH));
    float *big = malloc(sizeof(float) * (size_t)(N * vmax));
    float *att = malloc(sizeof(float) * (size_t)(N * VH)), *cs = malloc(sizeof(float) * (size_t)(N * D / 2));
    float *sn = malloc(sizeof(float) * (size_t)(N * D / 2));
    float *heads = malloc(sizeof(float) * (size_t)max_len * 3 * VH);
    float *scratch = malloc(sizeof(float) * (size_t)nth * ATTN_QBLOCK * max_len);
    float *vec = malloc(sizeof(float) * (size_t)(3 * VH + VI + VM + 4 * VH + vc->out_hidden_size));
    float *mbuf = malloc(sizeof(float) * (size_t)(n_out * VM));
    q35_status st = Q35_OK;
    if (!x || !ln || !big || !att || !cs || !sn || !heads || !scratch || !vec || !mbuf) {
        st = q35_fail(err, Q35_ERR_NOMEM, "vision: no memory for %lld patches", (long long)N);
        goto done;
    }

    /* patch embedding: the Conv3d over (C, TP, PS, PS) as one matrix */
    q35_tensor patch = w->patch_w;
    patch.ndim = 2;
    patch.shape[1] = (int64_t)vc->in_channels * vc->temporal_patch_size * vc->patch_size * vc->patch_size;
    q35_matmul(h, x, &patch, pixel_values, N);
    vec_f32(vec, &w->patch_b, VH);
    add_bias(x, vec, N, VH);

    /* learned positions and rotary angles, per patch */
    const int32_t q4 = D / 4;
    float inv_freq[1024];
    for (int32_t j = 0; j < q4; j++)
        inv_freq[j] = 1.0f / powf(vc->rope_theta, (float)(2 * j) / (float)(D / 2));
    int64_t r0 = 0;
    for (int32_t im = 0; im < n_images; im++) {
        const int32_t gt = grid[im][0], gh = grid[im][1], gw = grid[im][2];
        for (int64_t k = 0; k < (int64_t)gt * gh * gw; k++) {
            int32_t row, col, tr[2], tc[2];
            float wr[2], wc[2];
            patch_rc(k % ((int64_t)gh * gw), gw, m, &row, &col);
            axis_taps(row, gh, side, tr, wr);
            axis_taps(col, gw, side, tc, wc);
            float *xr = x + (r0 + k) * VH;
            for (int32_t c = 0; c < VH; c++) {
                float s = 0;
                for (int a = 0; a < 2; a++)
                    for (int b = 0; b < 2; b++)
                        s += q35_tensor_get_f32(&w->pos_embed, ((int64_t)tr[a] * side + tc[b]) * VH + c) * (wr[a] * wc[b]);
                xr[c] += s;
            }
            float *c0 = cs + (r0 + k) * (D / 2), *s0 = sn + (r0 + k) * (D / 2);
            for (int32_t j = 0; j < q4; j++) {
                const float ar = (float)row * inv_freq[j], ac = (float)col * inv_freq[j];
                c0[j] = cosf(ar), s0[j] = sinf(ar);
                c0[q4 + j] = cosf(ac), s0[q4 + j] = sinf(ac);
            }
        }
        r0 += (int64_t)gt * gh * gw;
    }

    float *b_qkv = vec, *b_fc1 = b_qkv + 3 * VH, *lnw = b_fc1 + VI, *lnb = lnw + VH, *b_proj = lnb + VH,
          *b_fc2 = b_proj + VH;
    for (int32_t li = 0; li < vc->depth; li++) {
        const q35_vision_block *B = &w->blocks[li];
        vec_f32(lnw, &B->norm1_w, VH), vec_f32(lnb, &B->norm1_b, VH);
        layer_norm(ln, x, lnw, lnb, N, VH);
        q35_matmul(h, big, &B->qkv_w, ln, N);
        vec_f32(b_qkv, &B->qkv_b, 3 * VH);
        add_bias(big, b_qkv, N, 3 * VH);
        for (int64_t r = 0; r < N; r++)
            for (int32_t hd = 0; hd < NH; hd++)
                for (int s = 0; s < 2; s++) /* q, then k */
                    rotate(big + r * 3 * VH + (int64_t)s * VH + (int64_t)hd * D, cs + r * (D / 2), sn + r * (D / 2), D);
        int64_t start = 0;
        for (int32_t im = 0; im < n_images; im++) {
            const int32_t len = grid[im][1] * grid[im][2];
            for (int32_t t = 0; t < grid[im][0]; t++, start += len) { /* attention within one frame */
                float *qh = heads, *kt = heads + (size_t)len * VH, *vh = heads + 2 * (size_t)len * VH;
                attn_gather(qh, kt, vh, big + start * 3 * VH, len, NH, D, VH);
                attn_job j = {h->k, qh, kt, vh, att + start * VH, scratch, len, NH, D, VH, 1.0f / sqrtf((float)D)};
                if (h->pool && (int64_t)len * len * VH > 100000) q35_pool_run(h->pool, attn_worker, &j);
                else attn_worker(&j, 0, 1);
            }
        }
        q35_matmul(h, ln, &B->proj_w, att, N);
        vec_f32(b_proj, &B->proj_b, VH);
        add_residual(x, ln, b_proj, N, VH);

        vec_f32(lnw, &B->norm2_w, VH), vec_f32(lnb, &B->norm2_b, VH);
        layer_norm(ln, x, lnw, lnb, N, VH);
        q35_matmul(h, big, &B->fc1_w, ln, N);
        vec_f32(b_fc1, &B->fc1_b, VI);
        for (int64_t i = 0; i < N * VI; i++) {
            const float v = big[i] + b_fc1[i % VI];
            big[i] = v / (1.0f + expf(-1.5957691216057308f * (v + 0.044715f * v * v * v)));
        }
        q35_matmul(h, ln, &B->fc2_w, big, N);
        vec_f32(b_fc2, &B->fc2_b, VH);
        add_residual(x, ln, b_fc2, N, VH);
    }

    /* the merger: LayerNorm per patch, MS*MS consecutive patches as one row */
    vec_f32(lnw, &w->merger_norm_w, VH), vec_f32(lnb, &w->merger_norm_b, VH);
    layer_norm(ln, x, lnw, lnb, N, VH);
    float *b_m1 = vec, *b_m2 = vec + VM;
    q35_matmul(h, mbuf, &w->merger_fc1_w, ln, n_out);
    vec_f32(b_m1, &w->merger_fc1_b, VM);
    for (int64_t i = 0; i < n_out * VM; i++) {
        const float v = mbuf[i] + b_m1[i % VM];
        mbuf[i] = 0.5f * v * (1.0f + erff(v * 0.70710678118654752f));
    }
    q35_matmul(h, out, &w->merger_fc2_w, mbuf, n_out);
    vec_f32(b_m2, &w->merger_fc2_b, vc->out_hidden_size);
    add_bias(out, b_m2, n_out, vc->out_hidden_size);
done:
    free(x), free(ln), free(big), free(att), free(cs), free(sn), free(heads), free(scratch), free(vec), free(mbuf);
    return st;
}
