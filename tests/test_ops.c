/* Tests of the kernels outside the matmuls (src/kernels/, kernels.h): the
 * Gated DeltaNet recurrence, its chunked form and one attention head, every
 * fast table against the scalar reference, and the batching invariance the
 * speculative verify relies on (a row gives the same bits alone or in a
 * batch, and the per-row state copies equal the states of single steps). */
#include "backend/cpu/compute.h"
#include "backend/cpu/kernels/kernels.h"
#include "base/util.h"
#include "test.h"

static uint64_t rng = 0x13198a2e03707344ull;
static float frand(void) { /* uniform in [-1, 1) */
    rng ^= rng >> 12;
    rng ^= rng << 25;
    rng ^= rng >> 27;
    return (float)((double)((rng * 0x2545f4914f6cdd1dull) >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

/* Every table this CPU runs, the reference first. */
static int tables(const q35_kernels **out) {
    const char *names[4] = {"ref", "avx2", "avx512", "avx512bf16"};
    int n = 0;
    for (int i = 0; i < 4; i++)
        if (q35_kernels_find(names[i], &out[n], NULL) == Q35_OK) n++;
    return n;
}

static double rel_max_diff(const float *a, const float *b, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > num || isnan(d)) num = isnan(d) ? INFINITY : d;
        if (fabs(b[i]) > den) den = fabs(b[i]);
    }
    return num / (den > 0 ? den : 1.0);
}

typedef struct gdn_case {
    int32_t T, DK, DV;
    float *S0, *q, *k, *v, *g, *beta;
} gdn_case;

static void gdn_case_make(gdn_case *c, int32_t T, int32_t DK, int32_t DV) {
    c->T = T, c->DK = DK, c->DV = DV;
    c->S0 = malloc(sizeof(float) * DK * DV);
    c->q = malloc(sizeof(float) * T * DK), c->k = malloc(sizeof(float) * T * DK);
    c->v = malloc(sizeof(float) * T * DV), c->g = malloc(sizeof(float) * T), c->beta = malloc(sizeof(float) * T);
    for (int32_t i = 0; i < DK * DV; i++) c->S0[i] = 0.3f * frand();
    for (int32_t t = 0; t < T; t++) {
        double nq = 0, nk = 0;
        for (int32_t i = 0; i < DK; i++) { c->q[t * DK + i] = frand(); c->k[t * DK + i] = frand(); }
        for (int32_t i = 0; i < DK; i++) { nq += c->q[t * DK + i] * c->q[t * DK + i]; nk += c->k[t * DK + i] * c->k[t * DK + i]; }
        for (int32_t i = 0; i < DK; i++) { c->q[t * DK + i] /= (float)sqrt(nq * DK); c->k[t * DK + i] /= (float)sqrt(nk); }
        for (int32_t i = 0; i < DV; i++) c->v[t * DV + i] = frand();
        c->g[t] = -0.5f * (frand() + 1.0f);
        c->beta[t] = 0.5f * (frand() + 1.0f);
    }
}

static void gdn_case_free(gdn_case *c) {
    free(c->S0); free(c->q); free(c->k); free(c->v); free(c->g); free(c->beta);
}

/* A BF16 tensor's values through q35_weights_f32 (eight at a time, then one by one): every offset and
 * length, every bit pattern class (zeros, subnormals, infinities, NaNs with payloads) the bits of
 * q35_weight_f32 one value at a time, and nothing written past the n asked for. */
TEST(ops, bf16_weights_convert_bit_for_bit) {
    uint16_t raw[80];
    const uint16_t special[] = {0x0000, 0x8000, 0x0001, 0x807f, 0x7f80, 0xff80, 0x7fc0, 0x7f81, 0xffff, 0x3f80};
    uint64_t lcg = 0x2545f4914f6cdd1dull; /* its own stream: the other tests' frand draws stay as they were */
    for (int i = 0; i < 80; i++) raw[i] = i < 10 ? special[i] : (uint16_t)((lcg = lcg * 6364136223846793005ull + 1) >> 48);
    q35_tensor w = {.name = "w", .dtype = Q35_DT_BF16, .ndim = 1, .shape = {80}, .data = raw, .nbytes = sizeof raw};
    long bad = 0;
    for (int64_t i0 = 0; i0 < 24; i0++)
        for (int64_t n = 0; i0 + n <= 80; n++) {
            float out[81];
            memset(out, 0x5a, sizeof out);
            q35_weights_f32(out, &w, i0, n);
            for (int64_t i = 0; i < n; i++) {
                const float want = q35_weight_f32(&w, i0 + i);
                bad += memcmp(&out[i], &want, sizeof want) != 0;
            }
            uint32_t tail;
            memcpy(&tail, &out[n], 4);
            bad += tail != 0x5a5a5a5au;
        }
    CHECK_MSG(bad == 0, "%ld values differ from q35_weight_f32 or were written past n", bad);
}

TEST(ops, gdn_recurrent_matches_ref) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int32_t shapes[][2] = {{128, 128}, {24, 40}, {16, 16}, {32, 72}, {16, 20}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (int32_t T = 1; T <= 5; T += 2) {
            gdn_case c;
            gdn_case_make(&c, T, shapes[si][0], shapes[si][1]);
            size_t SN = (size_t)c.DK * c.DV, ON = (size_t)T * c.DV;
            float *S_ref = malloc(sizeof(float) * SN), *o_ref = malloc(sizeof(float) * ON);
            float *S = malloc(sizeof(float) * SN), *o = malloc(sizeof(float) * ON);
            memcpy(S_ref, c.S0, sizeof(float) * SN);
            q35_gdn_recurrent_ref(S_ref, c.q, c.k, c.v, c.g, c.beta, o_ref, T, c.DK, c.DV, NULL, 0, NULL);
            for (int ti = 1; ti < n; ti++) {
                memcpy(S, c.S0, sizeof(float) * SN);
                tb[ti]->gdn_recurrent(S, c.q, c.k, c.v, c.g, c.beta, o, T, c.DK, c.DV, NULL, 0, NULL);
                CHECK_MSG(rel_max_diff(o, o_ref, ON) <= 1e-5, "%s DK=%d DV=%d T=%d: outputs %.3g", tb[ti]->name, c.DK,
                          c.DV, T, rel_max_diff(o, o_ref, ON));
                CHECK_MSG(rel_max_diff(S, S_ref, SN) <= 1e-5, "%s DK=%d DV=%d T=%d: states %.3g", tb[ti]->name, c.DK,
                          c.DV, T, rel_max_diff(S, S_ref, SN));
            }
            free(S_ref); free(o_ref); free(S); free(o);
            gdn_case_free(&c);
        }
}

/* The chunked form (prompts): every fast table against the reference's
 * chunked form, over partial, whole and several chunks. */
TEST(ops, gdn_chunked_matches_ref) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int32_t shapes[][2] = {{128, 128}, {32, 48}, {16, 16}, {24, 40}};
    const int32_t lengths[] = {1, 5, 64, 65, 150};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
        for (size_t li = 0; li < sizeof lengths / sizeof lengths[0]; li++) {
            const int32_t T = lengths[li];
            gdn_case c;
            gdn_case_make(&c, T, shapes[si][0], shapes[si][1]);
            size_t SN = (size_t)c.DK * c.DV, ON = (size_t)T * c.DV;
            float *S_ref = malloc(sizeof(float) * SN), *o_ref = malloc(sizeof(float) * ON);
            float *S = malloc(sizeof(float) * SN), *o = malloc(sizeof(float) * ON);
            float *scratch = malloc(sizeof(float) * q35_gdn_chunk_scratch_floats(c.DK, c.DV));
            memcpy(S_ref, c.S0, sizeof(float) * SN);
            q35_gdn_chunked_ref(S_ref, c.q, c.k, c.v, c.g, c.beta, o_ref, T, c.DK, c.DV, scratch);
            for (int ti = 1; ti < n; ti++) {
                memcpy(S, c.S0, sizeof(float) * SN);
                tb[ti]->gdn_chunked(S, c.q, c.k, c.v, c.g, c.beta, o, T, c.DK, c.DV, scratch);
                CHECK_MSG(rel_max_diff(o, o_ref, ON) <= 1e-5, "%s DK=%d DV=%d T=%d: outputs %.3g", tb[ti]->name, c.DK,
                          c.DV, T, rel_max_diff(o, o_ref, ON));
                CHECK_MSG(rel_max_diff(S, S_ref, SN) <= 1e-5, "%s DK=%d DV=%d T=%d: states %.3g", tb[ti]->name, c.DK,
                          c.DV, T, rel_max_diff(S, S_ref, SN));
            }
            free(S_ref); free(o_ref); free(S); free(o); free(scratch);
            gdn_case_free(&c);
        }
}

/* T rows at once, with state copies, give the same bits as T single steps. */
TEST(ops, gdn_recurrent_rows_equal_single_steps) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int32_t shapes[][2] = {{128, 128}, {24, 40}};
    for (size_t si = 0; si < 2; si++) {
        const int32_t T = 4;
        gdn_case c;
        gdn_case_make(&c, T, shapes[si][0], shapes[si][1]);
        const int32_t DK = c.DK, DV = c.DV;
        size_t SN = (size_t)DK * DV, stride = SN + 8;
        float *S = malloc(sizeof(float) * SN), *S1 = malloc(sizeof(float) * SN);
        float *after = aligned_alloc(64, sizeof(float) * stride * T); /* aligned: the copies are streamed */
        float *o = malloc(sizeof(float) * T * DV), *o1 = malloc(sizeof(float) * DV);
        for (int ti = 0; ti < n; ti++) {
            memcpy(S, c.S0, sizeof(float) * SN);
            memcpy(S1, c.S0, sizeof(float) * SN);
            /* with a next state to ask for (the batch) and without (the steps): a hint, the same bits */
            tb[ti]->gdn_recurrent(S, c.q, c.k, c.v, c.g, c.beta, o, T, DK, DV, after, stride, c.S0);
            long bad = 0;
            for (int32_t t = 0; t < T; t++) {
                tb[ti]->gdn_recurrent(S1, c.q + t * DK, c.k + t * DK, c.v + t * DV, c.g + t, c.beta + t, o1, 1, DK, DV,
                                      NULL, 0, NULL);
                bad += memcmp(o1, o + (size_t)t * DV, sizeof(float) * DV) != 0;
                bad += memcmp(S1, t + 1 < T ? after + t * stride : S, sizeof(float) * SN) != 0;
            }
            CHECK_MSG(bad == 0, "%s DK=%d DV=%d: %ld rows or states differ", tb[ti]->name, DK, DV, bad);
        }
        free(S); free(S1); free(after); free(o); free(o1);
        gdn_case_free(&c);
    }
}

/* G heads sharing a KV head: each within 1e-5 of the reference, and the
 * same bits as that head run alone (G = 1). */
TEST(ops, attend_heads_match_ref) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int32_t dims[] = {256, 32, 24}, keys[] = {1, 7, 300}, groups[] = {1, 3, 4, 5};
    for (size_t di = 0; di < 3; di++)
        for (size_t ki = 0; ki < 3; ki++)
            for (size_t gi = 0; gi < 4; gi++) {
                const int32_t HD = dims[di], NK = keys[ki], G = groups[gi];
                const size_t stride = (size_t)HD * 3, q_stride = (size_t)HD * 2; /* other heads' rows in between */
                float *q = malloc(sizeof(float) * q_stride * G), *kc = malloc(sizeof(float) * stride * NK);
                float *vc = malloc(sizeof(float) * stride * NK), *scores = malloc(sizeof(float) * NK * G);
                float *o_ref = malloc(sizeof(float) * HD * G), *o = malloc(sizeof(float) * HD * G);
                float *o1 = malloc(sizeof(float) * HD);
                for (size_t i = 0; i < q_stride * G; i++) q[i] = 2.0f * frand();
                for (size_t i = 0; i < stride * NK; i++) { kc[i] = frand(); vc[i] = frand(); }
                float scale = 1.0f / sqrtf((float)HD);
                q35_attend_heads_ref(o_ref, (size_t)HD, q, q_stride, G, kc, vc, stride, NK, HD, scale, scores);
                for (int ti = 1; ti < n; ti++) {
                    tb[ti]->attend_heads(o, (size_t)HD, q, q_stride, G, kc, vc, stride, NK, HD, scale, scores);
                    CHECK_MSG(rel_max_diff(o, o_ref, (size_t)HD * G) <= 1e-5, "%s HD=%d keys=%d G=%d: %.3g",
                              tb[ti]->name, HD, NK, G, rel_max_diff(o, o_ref, (size_t)HD * G));
                    long bad = 0;
                    for (int32_t g = 0; g < G; g++) {
                        tb[ti]->attend_heads(o1, (size_t)HD, q + g * q_stride, q_stride, 1, kc, vc, stride, NK, HD,
                                             scale, scores);
                        bad += memcmp(o1, o + (size_t)g * HD, sizeof(float) * HD) != 0;
                    }
                    CHECK_MSG(bad == 0, "%s HD=%d keys=%d G=%d: %ld heads differ from alone", tb[ti]->name, HD, NK,
                              G, bad);
                }
                free(q); free(kc); free(vc); free(scores); free(o_ref); free(o); free(o1);
            }
}

/* R rows (causal: row r one key more than row r - 1; or all the same keys):
 * each within 1e-5 of the reference, and each the bits attend_heads gives
 * that row alone. 130 and 300 keys span several of the fast tables' key
 * blocks, and rows end inside and at the end of one. */
TEST(ops, attend_rows_equal_rows_alone) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int32_t dims[] = {256, 32, 24}, firsts[] = {1, 130, 300}, rows[] = {1, 3, 8}, groups[] = {1, 4, 5};
    for (size_t di = 0; di < 3; di++)
        for (size_t fi = 0; fi < 3; fi++)
            for (size_t ri = 0; ri < 3; ri++)
                for (size_t gi = 0; gi < 3; gi++)
                    for (int32_t step = 0; step <= 1; step++) {
                        const int32_t HD = dims[di], N0 = firsts[fi], R = rows[ri], G = groups[gi];
                        const int32_t NK = N0 + (R - 1) * step;
                        const size_t stride = (size_t)HD * 2, q_stride = (size_t)HD * 2, q_row = q_stride * G + 8;
                        const size_t o_row = (size_t)HD * G + 4;
                        float *q = malloc(sizeof(float) * q_row * R), *kc = malloc(sizeof(float) * stride * NK);
                        float *vc = malloc(sizeof(float) * stride * NK);
                        float *scores = malloc(sizeof(float) * (size_t)NK * G * R);
                        float *o_ref = calloc(o_row * R, sizeof(float)), *o = calloc(o_row * R, sizeof(float));
                        float *o1 = malloc(sizeof(float) * HD * G);
                        for (size_t i = 0; i < q_row * R; i++) q[i] = 2.0f * frand();
                        for (size_t i = 0; i < stride * NK; i++) { kc[i] = frand(); vc[i] = frand(); }
                        const float scale = 1.0f / sqrtf((float)HD);
                        q35_attend_rows_ref(o_ref, o_row, HD, q, q_row, q_stride, R, G, kc, vc, stride, N0, step, HD,
                                            scale, scores);
                        for (int ti = 1; ti < n; ti++) {
                            tb[ti]->attend_rows(o, o_row, HD, q, q_row, q_stride, R, G, kc, vc, stride, N0, step, HD,
                                                scale, scores);
                            long bad = 0;
                            double worst = 0;
                            for (int32_t r = 0; r < R; r++) {
                                double d = rel_max_diff(o + r * o_row, o_ref + r * o_row, (size_t)HD * G);
                                worst = d > worst ? d : worst;
                                tb[ti]->attend_heads(o1, HD, q + r * q_row, q_stride, G, kc, vc, stride,
                                                     N0 + r * step, HD, scale, scores);
                                bad += memcmp(o1, o + r * o_row, sizeof(float) * HD * G) != 0;
                            }
                            CHECK_MSG(worst <= 1e-5, "%s HD=%d keys=%d R=%d G=%d step=%d: %.3g", tb[ti]->name, HD,
                                      N0, R, G, step, worst);
                            CHECK_MSG(bad == 0, "%s HD=%d keys=%d R=%d G=%d step=%d: %ld rows differ from alone",
                                      tb[ti]->name, HD, N0, R, G, step, bad);
                        }
                        free(q); free(kc); free(vc); free(scores); free(o_ref); free(o); free(o1);
                    }
}

/* The weights' rounding in the 8-bit cache's values (kernels.h), per column of one (row, head) against
 * keys [0, n): the sum over value blocks of S sum_p |vc_p[d]|, S = M / 32767 with M the block's largest
 * w_p vd_p[b], w the softmax of s (from the fp32 reference's arithmetic, in double). */
static void q8_value_rounding(double *bound, const double *s, int32_t n, const uint8_t *vc, size_t stride, int32_t HD) {
    const int32_t nb = q35_kv_q8_nblocks(HD);
    double mx = -INFINITY, sum = 0;
    for (int32_t p = 0; p < n; p++) mx = s[p] > mx ? s[p] : mx;
    for (int32_t p = 0; p < n; p++) sum += exp(s[p] - mx);
    for (int32_t d = 0; d < HD; d++) bound[d] = 0;
    for (int32_t p0 = 0; p0 < n; p0 += Q35_KV_Q8_VKEYS) {
        double M = 0;
        for (int32_t p = p0; p < n && p < p0 + Q35_KV_Q8_VKEYS; p++)
            for (int32_t b = 0; b < nb; b++) {
                float vd;
                memcpy(&vd, vc + p * stride + 4 * b, 4);
                M = fmax(M, exp(s[p] - mx) / sum * vd);
            }
        for (int32_t p = p0; p < n && p < p0 + Q35_KV_Q8_VKEYS; p++)
            for (int32_t d = 0; d < HD; d++) bound[d] += M / 32767 * abs(((const int8_t *)(vc + p * stride + 4 * nb))[d]);
    }
}

/* The 8-bit KV cache: each element comes back within half a step (d / 2)
 * of its block, a zero block and NaN give codes 0; attention over it is the
 * fp32 reference over the dequantized rows (the same values) but for the
 * values' weights rounded to 15 bits of their block's largest (kernels.h):
 * the reference within half a unit of each weight of it, each fast table
 * within one unit of the reference (its softmax's exp is a polynomial),
 * every fast table the same bits as the others, each row and head the bits
 * it gives alone; over one key (weight 1) every table gives the definition's
 * bits. */
TEST(ops, kv_q8_rows_and_attention_over_them) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int32_t dims[] = {256, 128, 64, 32, 24, 16, 48}, firsts[] = {1, 130}, rows[] = {1, 5}, groups[] = {1, 4, 5};
    for (size_t di = 0; di < 7; di++) {
        const int32_t HD = dims[di], B = q35_kv_q8_block(HD), nb = q35_kv_q8_nblocks(HD);
        const size_t rb = q35_kv_q8_row_bytes(HD), stride = rb + 16; /* padding between rows */
        CHECK_EQ_INT((int64_t)rb, (int64_t)(HD + 4 * (HD / B)));
        CHECK_EQ_INT(nb, HD % 32 ? 1 : HD / 32);
        { /* round trip, a zero block, NaN; value i in block (i / 4) % nb */
            float x[256], y[256];
            uint8_t row[256 + 32];
            int32_t count[8] = {0};
            for (int32_t i = 0; i < HD; i++) x[i] = 3.0f * frand();
            for (int32_t i = 0; i < HD; i++)
                if (q35_kv_q8_block_of(i, nb) == 0) x[i] = 0.0f;
            x[HD - 1] = NAN;
            q35_kv_q8_quantize(row, x, HD);
            q35_kv_q8_dequantize(y, row, HD);
            long bad = 0;
            for (int32_t b = 0; b < nb; b++) {
                float d, amax = 0;
                memcpy(&d, row + 4 * b, 4);
                for (int32_t i = 0; i < HD; i++)
                    if (i / 4 % nb == b && x[i] == x[i]) amax = fmaxf(amax, fabsf(x[i]));
                bad += d != amax / 127.0f;
                for (int32_t i = 0; i < HD; i++)
                    if (i / 4 % nb == b) {
                        count[b]++;
                        bad += x[i] == x[i] ? !(fabsf(y[i] - x[i]) <= 0.5f * d * 1.0001f) : y[i] != 0.0f;
                    }
                bad += count[b] != B;
            }
            for (int32_t i = 0; i < HD; i++)
                if (i / 4 % nb == 0) bad += y[i] != 0.0f || row[4 * nb + i] != 0;
            CHECK_MSG(bad == 0, "HD=%d: %ld values off", HD, bad);
        }
        for (size_t fi = 0; fi < 2; fi++)
            for (size_t ri = 0; ri < 2; ri++)
                for (size_t gi = 0; gi < 3; gi++)
                    for (int32_t step = 0; step <= 1; step++) {
                        const int32_t N0 = firsts[fi], R = rows[ri], G = groups[gi], NK = N0 + (R - 1) * step;
                        const size_t q_stride = (size_t)HD * 2, q_row = q_stride * G + 8, o_row = (size_t)HD * G + 4;
                        float *q = malloc(sizeof(float) * q_row * R), *x = malloc(sizeof(float) * HD);
                        uint8_t *kc = malloc(stride * NK), *vc = malloc(stride * NK);
                        float *kf = malloc(sizeof(float) * HD * NK), *vf = malloc(sizeof(float) * HD * NK);
                        float *scores = malloc(sizeof(float) * (size_t)NK * G * R);
                        float *o_ref = calloc(o_row * R, sizeof(float)), *o_f = calloc(o_row * R, sizeof(float));
                        float *o = calloc(o_row * R, sizeof(float)), *o1 = malloc(sizeof(float) * HD * G);
                        for (size_t i = 0; i < q_row * R; i++) q[i] = 2.0f * frand();
                        /* row 0's head 0 and key 0 at full scale with one sign pattern: every code product
                         * 127 x 127 (no saturation in the integer dots) */
                        for (int32_t i = 0; i < HD; i++) q[i] = i % 3 ? 2.0f : -2.0f;
                        for (int32_t p = 0; p < NK; p++) {
                            for (int32_t i = 0; i < HD; i++) x[i] = frand() * (i % 7 == 3 ? 8.0f : 1.0f);
                            if (p == 0)
                                for (int32_t i = 0; i < HD; i++) x[i] = i % 3 ? 1.0f : -1.0f;
                            q35_kv_q8_quantize(kc + p * stride, x, HD);
                            for (int32_t i = 0; i < HD; i++) x[i] = frand();
                            q35_kv_q8_quantize(vc + p * stride, x, HD);
                            q35_kv_q8_dequantize(kf + (size_t)p * HD, kc + p * stride, HD);
                            q35_kv_q8_dequantize(vf + (size_t)p * HD, vc + p * stride, HD);
                        }
                        const float scale = 1.0f / sqrtf((float)HD);
                        q35_attend_rows_q8_ref(o_ref, o_row, HD, q, q_row, q_stride, R, G, kc, vc, stride, N0, step,
                                               HD, scale, scores);
                        /* the fp32 reference over the same values: the cache's, and each query head rounded
                         * to the row format as the integer scores take it */
                        float *qf = malloc(sizeof(float) * q_row * R);
                        uint8_t qrow[256 + 32];
                        memcpy(qf, q, sizeof(float) * q_row * R);
                        for (int32_t r = 0; r < R; r++)
                            for (int32_t g = 0; g < G; g++) {
                                q35_kv_q8_quantize(qrow, q + r * q_row + g * q_stride, HD);
                                q35_kv_q8_dequantize(qf + r * q_row + g * q_stride, qrow, HD);
                            }
                        q35_attend_rows_ref(o_f, o_row, HD, qf, q_row, q_stride, R, G, kf, vf, HD, N0, step, HD, scale,
                                            scores);
                        /* each (row, head)'s rounding bound, from the scores of the same values */
                        double *bound = malloc(sizeof(double) * (size_t)HD * G * R), *sd = malloc(sizeof(double) * NK);
                        for (int32_t r = 0; r < R; r++)
                            for (int32_t g = 0; g < G; g++) {
                                const float *qh = qf + r * q_row + g * q_stride;
                                for (int32_t p = 0; p < N0 + r * step; p++) {
                                    double dot = 0;
                                    for (int32_t i = 0; i < HD; i++) dot += (double)qh[i] * kf[(size_t)p * HD + i];
                                    sd[p] = dot * scale;
                                }
                                q8_value_rounding(bound + ((size_t)r * G + g) * HD, sd, N0 + r * step, vc, stride, HD);
                            }
                        free(qf);
                        free(sd);
                        /* |o - o_base| <= units * bound + rel * max |o_base| in every element of a row */
#define Q8_WITHIN(o_, base, units, rel, worst_)                                                              \
    do {                                                                                                     \
        worst_ = 0;                                                                                          \
        for (int32_t r = 0; r < R; r++) {                                                                    \
            double top = 0;                                                                                  \
            for (int32_t i = 0; i < HD * G; i++) top = fmax(top, fabs((double)(base)[r * o_row + i]));       \
            for (int32_t i = 0; i < HD * G; i++) {                                                           \
                double d = fabs((double)(o_)[r * o_row + i] - (base)[r * o_row + i]);                        \
                d = d != d ? INFINITY : d / ((units) * bound[(size_t)r * HD * G + i] + (rel) * top + 1e-30); \
                worst_ = d > worst_ ? d : worst_;                                                            \
            }                                                                                                \
        }                                                                                                    \
    } while (0)
                        double worst;
                        Q8_WITHIN(o_ref, o_f, 0.5, 1e-6, worst);
                        CHECK_MSG(worst <= 1.0, "ref HD=%d keys=%d R=%d G=%d: q8 %.3g of its bound from fp32 over the same values",
                                  HD, N0, R, G, worst);
                        /* one key: weight 1, so M = the row's largest scale and o = fmaf(u vc, S, 0) */
                        float *o_one = malloc(sizeof(float) * HD * G);
                        if (N0 == 1) {
                            float M = 0, vd[8], inv, S;
                            memcpy(vd, vc, 4 * (size_t)nb);
                            for (int32_t b = 0; b < nb; b++) M = vd[b] > M ? vd[b] : M;
                            q35_kv_q8_value_scales(M, &inv, &S);
                            for (int32_t i = 0; i < HD; i++)
                                o_one[i] = fmaf((float)((int32_t)rintf(vd[q35_kv_q8_block_of(i, nb)] * inv) *
                                                        ((const int8_t *)(vc + 4 * nb))[i]),
                                                S, 0.0f);
                            for (int32_t g = 1; g < G; g++) memcpy(o_one + g * HD, o_one, sizeof(float) * HD);
                            CHECK_MSG(memcmp(o_ref, o_one, sizeof(float) * HD * G) == 0, "ref HD=%d R=%d G=%d: one key's values",
                                      HD, R, G);
                        }
                        float *o_first = malloc(sizeof(float) * o_row * R);
                        for (int ti = 1; ti < n; ti++) {
                            tb[ti]->attend_rows_q8(o, o_row, HD, q, q_row, q_stride, R, G, kc, vc, stride, N0, step,
                                                   HD, scale, scores);
                            long bad = 0, heads = 0;
                            Q8_WITHIN(o, o_ref, 1.01, 1e-5, worst);
                            if (N0 == 1)
                                CHECK_MSG(memcmp(o, o_one, sizeof(float) * HD * G) == 0, "%s HD=%d R=%d G=%d: one key's values",
                                          tb[ti]->name, HD, R, G);
                            if (ti == 1) memcpy(o_first, o, sizeof(float) * o_row * R);
                            for (int32_t r = 0; r < R; r++) {
                                CHECK_MSG(memcmp(o + r * o_row, o_first + r * o_row, sizeof(float) * HD * G) == 0,
                                          "%s HD=%d keys=%d R=%d G=%d step=%d: row %d differs from %s", tb[ti]->name, HD,
                                          N0, R, G, step, r, tb[1]->name);
                                tb[ti]->attend_rows_q8(o1, 0, HD, q + r * q_row, 0, q_stride, 1, G, kc, vc, stride,
                                                       N0 + r * step, 0, HD, scale, scores);
                                bad += memcmp(o1, o + r * o_row, sizeof(float) * HD * G) != 0;
                                /* each head alone: the score tiles of several heads give att_q8_score's bits */
                                for (int32_t g = 0; g < G; g++) {
                                    tb[ti]->attend_rows_q8(o1, 0, HD, q + r * q_row + g * q_stride, 0, q_stride, 1, 1,
                                                           kc, vc, stride, N0 + r * step, 0, HD, scale, scores);
                                    heads += memcmp(o1, o + r * o_row + g * HD, sizeof(float) * HD) != 0;
                                }
                            }
                            CHECK_MSG(worst <= 1.0, "%s HD=%d keys=%d R=%d G=%d step=%d: %.3g of its bound from ref",
                                      tb[ti]->name, HD, N0, R, G, step, worst);
                            CHECK_MSG(bad == 0, "%s HD=%d keys=%d R=%d G=%d step=%d: %ld rows differ from alone",
                                      tb[ti]->name, HD, N0, R, G, step, bad);
                            CHECK_MSG(heads == 0, "%s HD=%d keys=%d R=%d G=%d step=%d: %ld heads differ from alone",
                                      tb[ti]->name, HD, N0, R, G, step, heads);
                        }
                        free(q); free(x); free(kc); free(vc); free(kf); free(vf); free(scores);
                        free(o_ref); free(o_f); free(o); free(o1); free(bound); free(o_one); free(o_first);
#undef Q8_WITHIN
                    }
    }
}

/* C = A B on awkward sizes and padded strides: each fast table within float
 * rounding of the reference, the padding untouched, and every row the same
 * bits as when computed alone. */
TEST(ops, gemm_f32_matches_ref_and_rows_do_not_depend_on_their_neighbours) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int64_t Ms[] = {1, 7, 9, 64}, Ns[] = {1, 15, 17, 33, 72, 100}, Ks[] = {1, 3, 72, 300};
    for (size_t mi = 0; mi < 4; mi++)
        for (size_t ni = 0; ni < 6; ni++)
            for (size_t ki = 0; ki < 4; ki++) {
                const int64_t M = Ms[mi], N = Ns[ni], K = Ks[ki];
                const size_t lda = (size_t)K + 3, ldb = (size_t)N + 5, ldc = (size_t)N + 2;
                float *A = malloc(sizeof(float) * lda * M), *B = malloc(sizeof(float) * ldb * K);
                float *ref = malloc(sizeof(float) * ldc * M), *C = malloc(sizeof(float) * ldc * M);
                float *row = malloc(sizeof(float) * ldc);
                double *mag = malloc(sizeof(double) * (size_t)(M * N));
                for (size_t i = 0; i < lda * M; i++) A[i] = frand();
                for (size_t i = 0; i < ldb * K; i++) B[i] = frand();
                for (int64_t m = 0; m < M; m++)
                    for (int64_t c = 0; c < N; c++) {
                        double s = 0;
                        for (int64_t k = 0; k < K; k++) s += fabs((double)A[m * lda + k] * B[k * ldb + c]);
                        mag[m * N + c] = s;
                    }
                q35_gemm_f32_ref(ref, ldc, A, lda, B, ldb, M, N, K);
                for (int ti = 0; ti < n; ti++) {
                    for (size_t i = 0; i < ldc * M; i++) C[i] = 12345.0f;
                    tb[ti]->gemm_f32(C, ldc, A, lda, B, ldb, M, N, K);
                    long bad = 0, pad = 0, alone = 0;
                    for (int64_t m = 0; m < M; m++) {
                        for (int64_t c = 0; c < N; c++)
                            bad += !(fabs((double)C[m * ldc + c] - ref[m * ldc + c]) <= 1e-5 * mag[m * N + c] + 1e-30);
                        for (size_t c = (size_t)N; c < ldc; c++) pad += C[m * ldc + c] != 12345.0f;
                        tb[ti]->gemm_f32(row, ldc, A + m * lda, lda, B, ldb, 1, N, K);
                        alone += memcmp(row, C + m * ldc, sizeof(float) * (size_t)N) != 0;
                    }
                    CHECK_MSG(bad == 0 && pad == 0 && alone == 0,
                              "%s M=%lld N=%lld K=%lld: %ld outside the bound, %ld padding written, %ld rows differ alone",
                              tb[ti]->name, (long long)M, (long long)N, (long long)K, bad, pad, alone);
                }
                free(A), free(B), free(ref), free(C), free(row), free(mag);
            }
}

/* Row softmax on awkward widths with padded rows: within 1e-6 of the
 * reference per element, relative to the row's largest, rows summing to 1,
 * the padding untouched. */
TEST(ops, softmax_rows_match_ref) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    const int64_t widths[] = {1, 7, 8, 9, 64, 100, 784};
    for (size_t wi = 0; wi < 7; wi++) {
        const int64_t N = widths[wi], R = 5;
        const size_t ld = (size_t)N + 3;
        float *src = malloc(sizeof(float) * ld * R), *ref = malloc(sizeof(float) * ld * R);
        float *got = malloc(sizeof(float) * ld * R);
        for (size_t i = 0; i < ld * R; i++) src[i] = 12.0f * frand();
        memcpy(ref, src, sizeof(float) * ld * R);
        q35_softmax_rows_ref(ref, ld, R, N, 0.7f);
        for (int ti = 0; ti < n; ti++) {
            memcpy(got, src, sizeof(float) * ld * R);
            tb[ti]->softmax_rows(got, ld, R, N, 0.7f);
            double worst = 0, sum_err = 0;
            long pad = 0;
            for (int64_t r = 0; r < R; r++) {
                double mx = 0, sum = 0;
                for (int64_t c = 0; c < N; c++) mx = ref[r * ld + c] > mx ? ref[r * ld + c] : mx;
                for (int64_t c = 0; c < N; c++) {
                    double d = fabs((double)got[r * ld + c] - ref[r * ld + c]) / mx;
                    if (!(d <= worst)) worst = d;
                    sum += got[r * ld + c];
                }
                if (fabs(sum - 1) > sum_err) sum_err = fabs(sum - 1);
                for (size_t c = (size_t)N; c < ld; c++) pad += got[r * ld + c] != src[r * ld + c];
            }
            CHECK_MSG(worst <= 1e-6 && sum_err <= 1e-5 && pad == 0, "%s N=%lld: worst %.3g, |sum - 1| %.3g, %ld padding written",
                      tb[ti]->name, (long long)N, worst, sum_err, pad);
        }
        free(src), free(ref), free(got);
    }
}

/* silu(g) u and u sigmoid(g): every table within kernels.h's bound of the
 * reference (NaN and infinities where it has them), over typical and extreme
 * g (zeros, subnormals, +-87..100, +-1e30, infinities, NaN; some random g
 * fall in -88.7 .. -87.3, where the fast exp gives 0); in place (h = g for
 * silu, h = u for sigmoid) the same; silu with u NULL the same as u all
 * ones; and any piece of the array, at any offset and length (the vector
 * tails), gives each element the same bits. */
static void check_gate_op(int silu) {
    const q35_kernels *tb[4];
    int n = tables(tb);
    enum { N = 1003 };
    static float g[N], u[N], ones[N], ref[N], h[N], h2[N];
    const float special[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 87.0f, -87.0f, 88.7f, -88.8f, -100.0f, 100.0f,
                             1e30f, -1e30f, INFINITY, -INFINITY, NAN, 20.0f, -20.0f, 1e-3f, -1e-3f};
    const int n_special = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) {
        g[i] = i < n_special ? special[i] : frand() * (i % 3 == 0 ? 1.0f : i % 3 == 1 ? 10.0f : 100.0f);
        u[i] = 3.0f * frand();
        ones[i] = 1.0f;
    }
    const double flushed = silu ? 1.1e-36 : 1.2e-38; /* |h| / |u| where the fast exp gives 0 */
    (silu ? q35_silu_mul_ref : q35_sigmoid_mul_ref)(ref, g, u, N);
    for (int ti = 0; ti < n; ti++) {
        const q35_gate_mul_fn fn = silu ? tb[ti]->silu_mul : tb[ti]->sigmoid_mul;
        long bad = 0, pieces = 0, other = 0;
        fn(h, g, u, N);
        for (int i = 0; i < N; i++) {
            const double bound = 1e-6 * fabs(ref[i]) + flushed * fabs(u[i]);
            bad += !(isnan(ref[i]) ? isnan(h[i]) : isinf(ref[i]) ? h[i] == ref[i] : fabs((double)h[i] - ref[i]) <= bound);
        }
        memcpy(h2, silu ? g : u, sizeof g); /* in place */
        fn(h2, silu ? h2 : g, silu ? u : h2, N);
        other += memcmp(h2, h, sizeof h) != 0;
        if (silu) { /* no u */
            fn(h, g, NULL, N);
            fn(h2, g, ones, N);
            other += memcmp(h2, h, sizeof h) != 0;
            fn(h, g, u, N);
        }
        const int offs[] = {0, 1, 5, 8, 13}, lens[] = {1, 7, 8, 9, 31};
        for (int a = 0; a < 5; a++)
            for (int b = 0; b < 5; b++) {
                memset(h2, 0, sizeof h2);
                fn(h2 + offs[a], g + offs[a], u + offs[a], lens[b]);
                pieces += memcmp(h2 + offs[a], h + offs[a], sizeof(float) * (size_t)lens[b]) != 0;
                for (int i = 0; i < N; i++) pieces += (i < offs[a] || i >= offs[a] + lens[b]) && h2[i] != 0.0f;
            }
        CHECK_MSG(bad == 0 && pieces == 0 && other == 0,
                  "%s %s: %ld outside the bound of the reference, %ld pieces differ, %ld in place / without u differ",
                  tb[ti]->name, silu ? "silu_mul" : "sigmoid_mul", bad, pieces, other);
    }
}

TEST(ops, silu_mul_matches_ref) { check_gate_op(1); }
TEST(ops, sigmoid_mul_matches_ref) { check_gate_op(0); }

/* rmsnorm1p: the reference within 2e-6 of the formula in double, src / sqrt(mean(src^2) + eps) (1 + w);
 * every table the reference's bits, for BF16, F32 and F16 weights (F16 through the reference), lengths
 * around the vector widths, rows of zeros, of huge values (1e30: the mean overflows a float, r = 0) and of
 * subnormals, and in place. */
TEST(ops, rmsnorm1p_matches_ref) {
    const q35_kernels *tb[4];
    const int nt = tables(tb);
    enum { N = 4099 };
    static float src[N], w32[N], want[N], got[N];
    static uint16_t w16[N], wh[N];
    const int32_t lens[] = {1, 3, 7, 8, 9, 15, 16, 17, 31, 255, 256, 257, 4096, 4099};
    const int n_lens = (int)(sizeof lens / sizeof lens[0]);
    for (int i = 0; i < N; i++) {
        w32[i] = 0.5f * frand();
        w16[i] = q35_f32_to_bf16(w32[i]);
        wh[i] = q35_f32_to_f16(w32[i]);
    }
    const q35_tensor ws[3] = {{.name = "w", .dtype = Q35_DT_BF16, .ndim = 1, .shape = {N}, .data = w16, .nbytes = 2 * N},
                              {.name = "w", .dtype = Q35_DT_F32, .ndim = 1, .shape = {N}, .data = w32, .nbytes = 4 * N},
                              {.name = "w", .dtype = Q35_DT_F16, .ndim = 1, .shape = {N}, .data = wh, .nbytes = 2 * N}};
    long formula_bad = 0, bits_bad = 0, checked = 0;
    for (int kind = 0; kind < 4; kind++) {
        for (int i = 0; i < N; i++)
            src[i] = kind == 0 ? 3.0f * frand() : kind == 1 ? 0.0f : kind == 2 ? 1e30f * frand() : 1e-39f * frand();
        for (int wi = 0; wi < 3; wi++)
            for (int li = 0; li < n_lens; li++) {
                const int32_t n = lens[li];
                const float eps = 1e-6f;
                q35_rmsnorm1p_ref(want, src, &ws[wi], n, eps);
                if (kind == 0) {
                    double ss = 0;
                    for (int32_t i = 0; i < n; i++) ss += (double)src[i] * src[i];
                    const double r = 1.0 / sqrt(ss / n + eps);
                    for (int32_t i = 0; i < n; i++) {
                        const double f = src[i] * r * (1.0 + q35_tensor_get_f32(&ws[wi], i));
                        formula_bad += !(fabs(want[i] - f) <= 2e-6 * fabs(f) + 1e-30);
                    }
                }
                if (kind == 1) /* zeros stay zeros */
                    for (int32_t i = 0; i < n; i++) formula_bad += want[i] != 0.0f;
                for (int ti = 0; ti < nt; ti++) {
                    tb[ti]->rmsnorm1p(got, src, &ws[wi], n, eps);
                    bits_bad += memcmp(got, want, sizeof(float) * (size_t)n) != 0;
                    memcpy(got, src, sizeof(float) * (size_t)n); /* in place */
                    tb[ti]->rmsnorm1p(got, got, &ws[wi], n, eps);
                    bits_bad += memcmp(got, want, sizeof(float) * (size_t)n) != 0;
                    checked += 2;
                }
            }
    }
    CHECK_MSG(formula_bad == 0 && bits_bad == 0, "%ld outputs off the formula, %ld of %ld calls not the reference's bits",
              formula_bad, bits_bad, checked);
}

/* The GDN convolution: for every table, channel counts with and without a
 * vector tail (13 = 8 + 5, 16), kernel sizes 1, 3, 4, 16 and strided rows,
 * each output is silu_mul's silu of the sum the test forms itself (taps in
 * order, products rounded then added), bit for bit; the state after the
 * rows and the per-row states (rows) are exactly the inputs they should
 * hold; and 37 rows in one call equal 20 then 17 with the state carried. */
TEST(ops, conv_silu_sums_and_states) {
    const q35_kernels *tb[4];
    int n_tb = tables(tb);
    enum { T = 37, LD = 40, MAXC = 16 };
    static float x[T * LD], w[MAXC * 16], st0[MAXC * 15], st[MAXC * 15], st2[MAXC * 15], y[T * LD], y2[T * LD];
    static float acc[T * LD], want[T * LD], rows[T * MAXC * 15];
    const int chans[2] = {13, 16}, cks[4] = {1, 3, 4, 16};
    for (int i = 0; i < T * LD; i++) x[i] = 4.0f * frand();
    for (int ci = 0; ci < 2; ci++)
        for (int ki = 0; ki < 4; ki++) {
            const int n = chans[ci], CK = cks[ki], H = CK - 1;
            for (int i = 0; i < n * CK; i++) w[i] = frand();
            for (int i = 0; i < n * H; i++) st0[i] = 4.0f * frand();
            for (int c = 0; c < n; c++) /* the sums, as the kernels must form them */
                for (int t = 0; t < T; t++) {
                    float a = 0.0f;
                    for (int i = 0; i < CK; i++) {
                        int back = CK - 1 - i; /* tap i reads the input `back` rows before t */
                        float in = t - back >= 0 ? x[(t - back) * LD + c] : st0[c * H + (H - (back - t))];
                        a += w[c * CK + i] * in;
                    }
                    acc[t * LD + c] = a;
                }
            for (int ti = 0; ti < n_tb; ti++) {
                long bad_y = 0, bad_st = 0, bad_rows = 0, bad_split = 0;
                for (int t = 0; t < T; t++) tb[ti]->silu_mul(want + t * LD, acc + t * LD, NULL, n);
                memcpy(st, st0, sizeof st0);
                tb[ti]->conv_silu(y, LD, x, LD, w, st, n, T, CK, rows, (size_t)(n * H));
                for (int t = 0; t < T; t++) bad_y += memcmp(y + t * LD, want + t * LD, sizeof(float) * (size_t)n) != 0;
                for (int c = 0; c < n; c++)
                    for (int i = 0; i < H; i++) {
                        bad_st += st[c * H + i] != x[(T - H + i) * LD + c];
                        for (int t = 0; t + 1 < T; t++) {
                            int r = t - (H - 1) + i; /* the input row held after row t */
                            float in = r >= 0 ? x[r * LD + c] : st0[c * H + H + r];
                            bad_rows += rows[(size_t)t * n * H + c * H + i] != in;
                        }
                    }
                memcpy(st2, st0, sizeof st0);
                tb[ti]->conv_silu(y2, LD, x, LD, w, st2, n, 20, CK, NULL, 0);
                tb[ti]->conv_silu(y2 + 20 * LD, LD, x + 20 * LD, LD, w, st2, n, T - 20, CK, NULL, 0);
                for (int t = 0; t < T; t++) bad_split += memcmp(y2 + t * LD, y + t * LD, sizeof(float) * (size_t)n) != 0;
                bad_split += memcmp(st2, st, sizeof(float) * (size_t)(n * H)) != 0;
                CHECK_MSG(bad_y + bad_st + bad_rows + bad_split == 0,
                          "%s, %d channels, kernel %d: %ld rows of y, %ld state, %ld row states, %ld split differ",
                          tb[ti]->name, n, CK, bad_y, bad_st, bad_rows, bad_split);
            }
        }
}
