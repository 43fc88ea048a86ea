/* Tests of src/bfp.c: the bfp4_b / bfp8_b codec against tt-metal's test
 * vectors and its documented rules, and the 16-row panel layout. */
#include "formats/bfp.h"
#include "test.h"
#include "base/util.h"

#include <stdint.h>

static uint32_t f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static void fill_block(uint32_t *bits, float first, float rest) {
    bits[0] = f32_bits(first);
    for (int i = 1; i < Q35_BFP_BLOCK; i++) bits[i] = f32_bits(rest);
}

/* A small deterministic generator (xorshift64*), so failures reproduce. */
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t rng_u32(void) {
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545f4914f6cdd1dull) >> 32);
}
static float rng_unit(void) { return (float)rng_u32() / 4294967296.0f * 2.0f - 1.0f; }

TEST(bfp, tt_vector_bfp4_plain_and_search) {
    uint32_t bits[16];
    uint8_t codes[16];
    fill_block(bits, 1.0f, 0.13f);
    uint8_t e = q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
    CHECK_EQ_INT(e, 0x7f);
    CHECK_EQ_INT(codes[0], 0x4);
    for (int i = 1; i < 16; i++) CHECK_EQ_INT(codes[i], 0x1);
    CHECK(q35_bfp_decode(Q35_DT_BFP4, e, codes[0]) == 1.0f);
    CHECK(q35_bfp_decode(Q35_DT_BFP4, e, codes[1]) == 0.25f);

    e = q35_bfp_encode_block(Q35_DT_BFP4, bits, Q35_BFP_EXP_SEARCH, codes);
    CHECK_EQ_INT(e, 0x7e);
    CHECK_EQ_INT(codes[0], 0x7);
    for (int i = 1; i < 16; i++) CHECK_EQ_INT(codes[i], 0x1);
    CHECK(q35_bfp_decode(Q35_DT_BFP4, e, codes[0]) == 0.875f);
    CHECK(q35_bfp_decode(Q35_DT_BFP4, e, codes[1]) == 0.125f);
}

TEST(bfp, tt_vector_bfp8_plain_and_search) {
    uint32_t bits[16];
    uint8_t codes[16];
    fill_block(bits, 1.0f, 0.008f);
    uint8_t e = q35_bfp_encode_block(Q35_DT_BFP8, bits, 0, codes);
    CHECK_EQ_INT(e, 0x7f);
    CHECK(q35_bfp_decode(Q35_DT_BFP8, e, codes[0]) == 1.0f);
    e = q35_bfp_encode_block(Q35_DT_BFP8, bits, Q35_BFP_EXP_SEARCH, codes);
    CHECK_EQ_INT(e, 0x7e);
    CHECK(q35_bfp_decode(Q35_DT_BFP8, e, codes[0]) == 0.9921875f);
    for (int i = 1; i < 16; i++) CHECK(q35_bfp_decode(Q35_DT_BFP8, e, codes[i]) == 0.0078125f);
}

/* Double rounding: the alignment shift truncates, and only then do the kept
 * bits round half to even. 1.25 + 2^-23 next to 2.0 aligns to exactly 2.5
 * bfp4 steps; a correctly rounded encoder would give 3 steps (1.5), tt-metal
 * rounds the tie to even (1.0). */
TEST(bfp, double_rounding_is_not_sticky) {
    uint32_t bits[16];
    uint8_t codes[16];
    /* 2.0 sets E = 128, step 0.5; the 2^-23 sliver is the bit that the
     * one-bit alignment shift throws away. */
    fill_block(bits, 2.0f, 1.25f + 0x1p-23f);
    uint8_t e = q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
    CHECK_EQ_INT(e, 128);
    CHECK_EQ_INT(codes[1], 2); /* 2.5 steps -> 2 (even), although the input is above 1.25 */
    CHECK(q35_bfp_decode(Q35_DT_BFP4, e, codes[1]) == 1.0f);
    /* 3.5 steps rounds up to 4. */
    fill_block(bits, 2.0f, 1.75f);
    q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
    CHECK_EQ_INT(codes[1], 4);
    /* Saturation: 1.999 with E from itself rounds to 8 steps -> 7, no carry. */
    fill_block(bits, 1.999f, 0.0f);
    e = q35_bfp_encode_block(Q35_DT_BFP4, bits, 0, codes);
    CHECK_EQ_INT(e, 127);
    CHECK_EQ_INT(codes[0], 7);
}

/* Every representable value of every normal exponent comes back exactly. */
TEST(bfp, every_representable_value_round_trips) {
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    long bad = 0, tried = 0;
    for (int d = 0; d < 2; d++) {
        q35_dtype dt = dts[d];
        int w = q35_bfp_mant_bits(dt);
        for (int E = 1; E <= 254; E++) {
            for (unsigned code = 0; code < (2u << w); code++) {
                unsigned m = code & ((1u << w) - 1);
                float v = q35_bfp_decode(dt, (uint8_t)E, (uint8_t)code);
                if (m == 0 && code != 0) continue; /* -0 is never produced */
                if (v != 0.0f && fpclassify(v) != FP_NORMAL) continue; /* flushed on input */
                uint32_t bits[16];
                /* Element 0 pins the shared exponent at E: magnitude 2^(w-1). */
                fill_block(bits, q35_bfp_decode(dt, (uint8_t)E, (uint8_t)(1u << (w - 1))), v);
                uint8_t codes[16];
                uint8_t e = q35_bfp_encode_block(dt, bits, 0, codes);
                tried++;
                if (e != E || codes[5] != code) bad++;
                /* Every bfp value is exact in bf16 as well. */
                if (q35_bf16_to_f32(q35_f32_to_bf16(v)) != v) bad++;
            }
        }
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(tried > 30000);
}

/* Error bounds relative to the block maximum: a non-saturated element is off
 * by at most half a step plus what the truncating shift lost (< 2^-23 of the
 * block scale); a saturated one by less than one step. The exponent search
 * never makes the block's squared error worse. */
TEST(bfp, error_bounds_random_blocks) {
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    long bad = 0;
    for (int d = 0; d < 2; d++) {
        q35_dtype dt = dts[d];
        int w = q35_bfp_mant_bits(dt);
        for (int trial = 0; trial < 20000; trial++) {
            float x[16];
            uint32_t bits[16];
            float scale = ldexpf(1.0f, (int)(rng_u32() % 60) - 30);
            float amax = 0.0f;
            for (int i = 0; i < 16; i++) {
                float u = rng_unit();
                x[i] = scale * u * u * u; /* heavy-ish tails */
                if (fabsf(x[i]) > amax) amax = fabsf(x[i]);
                bits[i] = f32_bits(x[i]);
            }
            uint8_t codes[16], codes_s[16];
            uint8_t e = q35_bfp_encode_block(dt, bits, 0, codes);
            double step = ldexp(1.0, e - 127 - (w - 1));
            double se = 0.0, se_s = 0.0;
            uint8_t es = q35_bfp_encode_block(dt, bits, Q35_BFP_EXP_SEARCH, codes_s);
            for (int i = 0; i < 16; i++) {
                double dec = q35_bfp_decode(dt, e, codes[i]);
                double err = fabs((double)x[i] - dec);
                unsigned m = codes[i] & ((1u << w) - 1);
                int saturated = m == (1u << w) - 1;
                if (err > (saturated ? step : 0.5 * step + step * 0x1p-16)) bad++;
                if (err > amax * ldexp(1.0, 1 - w)) bad++; /* relative to the block max */
                if (fabs(x[i]) == amax && m < (1u << (w - 1))) bad++; /* the max keeps its hidden bit */
                se += err * err;
                double ds = (double)x[i] - q35_bfp_decode(dt, es, codes_s[i]);
                se_s += ds * ds;
            }
            if (se_s > se) bad++;
            if (es != e && es != e - 1) bad++;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

TEST(bfp, zeros_denormals_and_negative_zero) {
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    for (int d = 0; d < 2; d++) {
        q35_dtype dt = dts[d];
        int w = q35_bfp_mant_bits(dt);
        uint32_t bits[16];
        uint8_t codes[16];
        fill_block(bits, 0.0f, -0.0f);
        CHECK_EQ_INT(q35_bfp_encode_block(dt, bits, Q35_BFP_EXP_SEARCH, codes), 0);
        for (int i = 0; i < 16; i++) CHECK_EQ_INT(codes[i], 0);
        /* Denormals contribute exponent 0 and encode as 0, even alone. */
        fill_block(bits, -0x1p-130f, 0x1p-149f);
        CHECK_EQ_INT(q35_bfp_encode_block(dt, bits, 0, codes), 0);
        for (int i = 0; i < 16; i++) CHECK_EQ_INT(codes[i], 0);
        /* Tiny negatives next to a large value lose their sign with their magnitude. */
        fill_block(bits, 1000.0f, -1e-3f);
        q35_bfp_encode_block(dt, bits, 0, codes);
        for (int i = 1; i < 16; i++) CHECK_EQ_INT(codes[i], 0);
        /* A sign-only code still decodes to +0 (the packer never writes one). */
        float z = q35_bfp_decode(dt, 127, (uint8_t)(1u << w));
        CHECK(z == 0.0f && !signbit(z));
    }
    /* Random blocks: no code is ever a signed zero. */
    long neg_zero = 0;
    for (int trial = 0; trial < 5000; trial++) {
        uint32_t bits[16];
        uint8_t codes[16];
        for (int i = 0; i < 16; i++) bits[i] = f32_bits(ldexpf(rng_unit(), -(int)(rng_u32() % 24)));
        q35_bfp_encode_block(Q35_DT_BFP4, bits, Q35_BFP_EXP_SEARCH, codes);
        for (int i = 0; i < 16; i++) neg_zero += codes[i] == 0x8;
    }
    CHECK_EQ_INT(neg_zero, 0);
}

TEST(bfp, inf_and_nan_inputs) {
    uint32_t bits[16];
    uint8_t codes[16];
    fill_block(bits, INFINITY, 1.0f);
    CHECK_EQ_INT(q35_bfp_encode_block(Q35_DT_BFP4, bits, Q35_BFP_EXP_SEARCH, codes), 255);
    CHECK_EQ_INT(codes[0], 0x4); /* inf's significand is the hidden bit alone */
    fill_block(bits, -NAN, 1.0f);
    CHECK_EQ_INT(q35_bfp_encode_block(Q35_DT_BFP8, bits, Q35_BFP_EXP_SEARCH, codes), 255);
    /* m * 2^122 overflows fp32, as TT's unpacker does (exponent field 255). */
    CHECK(isinf(q35_bfp_decode(Q35_DT_BFP8, 255, codes[0])));
    CHECK(q35_bfp_decode(Q35_DT_BFP8, 255, codes[1]) == 0.0f); /* 1.0 is far below the block scale */
}

/* The layout: explicit byte positions, packing and unpacking, padding rows,
 * BF16 input equal to its F32 widening, and shape errors. */
TEST(bfp, panel_layout_positions) {
    enum { n_out = 83, n_in = 48 }; /* two groups of four panels, the second mostly padding; three blocks */
    static float w[n_out * n_in];
    for (int i = 0; i < n_out * n_in; i++) w[i] = rng_unit();
    q35_dtype dts[2] = {Q35_DT_BFP4, Q35_DT_BFP8};
    for (int d = 0; d < 2; d++) {
        q35_dtype dt = dts[d];
        const size_t C = dt == Q35_DT_BFP4 ? 128 : 256, U = 4 * (16 + C); /* a block's codes; a unit */
        size_t nb = q35_bfp_tensor_bytes(dt, n_out, n_in);
        CHECK_EQ_INT(nb, 2 * 3 * U);
        CHECK_EQ_INT(q35_bfp_unit_bytes(dt), U);
        uint8_t *buf = malloc(nb);
        REQUIRE(buf);
        q35_error err = {0};
        REQUIRE(q35_bfp_pack_matrix(dt, buf, nb, w, Q35_DT_F32, n_out, n_in, 0, &err) == Q35_OK);
        /* Input 21: block 1, group 1, j = 1. Row 9: group 0, panel 0, row 9 (a high nibble of bfp4); row 57:
         * group 0, panel 3, row 9; row 75: group 1 (3 units on), panel 0, row 11. */
        const struct { int r; size_t group, p, rr; } at[3] = {{9, 0, 0, 9}, {57, 0, 3, 9}, {75, 3 * U, 0, 11}};
        for (int i = 0; i < 3; i++) {
            uint32_t bits[16];
            uint8_t codes[16];
            memcpy(bits, &w[at[i].r * n_in + 16], sizeof bits);
            uint8_t e = q35_bfp_encode_block(dt, bits, 0, codes);
            size_t unit = at[i].group + 1 * U, rr = at[i].rr;
            CHECK_EQ_INT(buf[unit + 16 * at[i].p + rr], e);
            CHECK_EQ_INT(q35_bfp_panel_exps(dt, n_in, at[i].r), at[i].group + 16 * at[i].p);
            CHECK_EQ_INT(q35_bfp_panel_codes(dt, n_in, at[i].r), at[i].group + 64 + at[i].p * C);
            size_t codes_at = unit + 64 + at[i].p * C;
            if (dt == Q35_DT_BFP4) /* stored as value + 8 */
                CHECK_EQ_INT(rr >= 8 ? buf[codes_at + 32 + 4 * (rr - 8) + 1] >> 4
                                     : buf[codes_at + 32 + 4 * rr + 1] & 15,
                             (codes[5] & 8 ? -(codes[5] & 7) : codes[5]) + 8);
            else
                CHECK_EQ_INT(buf[codes_at + 64 + 4 * rr + 1], codes[5]);
        }
        uint32_t bits[16];
        uint8_t codes[16], e;
        /* Rows and elements decode to the codec's values. */
        long bad = 0;
        float row[n_in];
        for (int r = 0; r < n_out; r++) {
            q35_bfp_get_row(dt, buf, n_in, r, row);
            for (int b = 0; b < n_in / 16; b++) {
                memcpy(bits, &w[r * n_in + 16 * b], sizeof bits);
                e = q35_bfp_encode_block(dt, bits, 0, codes);
                for (int i = 0; i < 16; i++) {
                    float v = q35_bfp_decode(dt, e, codes[i]);
                    bad += row[16 * b + i] != v;
                    bad += q35_bfp_get(dt, buf, n_in, r, 16 * b + i) != v;
                }
            }
        }
        CHECK_EQ_INT(bad, 0);
        /* Padding rows 83..127 read as zero, and bfp4 stores their zero codes as 8. */
        if (dt == Q35_DT_BFP4) CHECK_EQ_INT(buf[3 * U + 64 + 3 * C + 127], 0x88);
        q35_bfp_get_row(dt, buf, n_in, 127, row);
        for (int i = 0; i < n_in; i++) bad += row[i] != 0.0f;
        CHECK_EQ_INT(bad, 0);
        /* BF16 input packs like its exact F32 widening. */
        uint16_t wb[n_out * n_in];
        float wbf[n_out * n_in];
        for (int i = 0; i < n_out * n_in; i++) {
            wb[i] = q35_f32_to_bf16(w[i]);
            wbf[i] = q35_bf16_to_f32(wb[i]);
        }
        uint8_t *b1 = malloc(nb), *b2 = malloc(nb);
        REQUIRE(b1 && b2);
        CHECK(q35_bfp_pack_matrix(dt, b1, nb, wb, Q35_DT_BF16, n_out, n_in, Q35_BFP_EXP_SEARCH, &err) == Q35_OK);
        CHECK(q35_bfp_pack_matrix(dt, b2, nb, wbf, Q35_DT_F32, n_out, n_in, Q35_BFP_EXP_SEARCH, &err) == Q35_OK);
        CHECK(memcmp(b1, b2, nb) == 0);
        /* Shape and size errors. */
        CHECK(q35_bfp_pack_matrix(dt, b1, nb, w, Q35_DT_F32, n_out, 40, 0, &err) == Q35_ERR_ARG);
        CHECK(q35_bfp_pack_matrix(dt, b1, nb - 1, w, Q35_DT_F32, n_out, n_in, 0, &err) == Q35_ERR_ARG);
        CHECK(strstr(err.msg, "need") != NULL);
        CHECK(q35_bfp_pack_matrix(dt, b1, nb, w, Q35_DT_F16, n_out, n_in, 0, &err) == Q35_ERR_UNSUPPORTED);
        free(b1);
        free(b2);
        free(buf);
    }
}

/* bfp4's stored form: every code's value + 8 and back, the value the same
 * through put_block / get_row, code 8 (-0) stored as zero, and the stored
 * 0 (no code's) read as -8 steps by get_row and get and as code 8 by
 * get_block; a copy through get_stored / put_stored keeps every byte. */
TEST(bfp, bfp4_codes_are_stored_as_value_plus_8) {
    for (int c = 0; c < 16; c++) {
        const int v = c & 8 ? -(c & 7) : c & 7;
        CHECK_EQ_INT(q35_bfp4_stored((uint8_t)c), v + 8);
        CHECK_EQ_INT(q35_bfp4_code(q35_bfp4_stored((uint8_t)c)), c == 8 ? 0 : c);
    }
    CHECK_EQ_INT(q35_bfp4_code(0), 8);
    enum { n_in = 32 };
    const size_t nb = q35_bfp_tensor_bytes(Q35_DT_BFP4, 1, n_in);
    uint8_t *buf = malloc(nb), *cp = malloc(nb);
    REQUIRE(buf && cp);
    q35_bfp_clear(Q35_DT_BFP4, buf, 1, n_in);
    uint8_t codes[16], got[16];
    for (int i = 0; i < 16; i++) codes[i] = (uint8_t)i;
    q35_bfp_put_block(Q35_DT_BFP4, buf, n_in, 0, 0, 130, codes); /* a step of 2 */
    float row[n_in];
    q35_bfp_get_row(Q35_DT_BFP4, buf, n_in, 0, row);
    for (int i = 0; i < 16; i++) {
        CHECK(row[i] == q35_bfp_decode(Q35_DT_BFP4, 130, (uint8_t)i));
        CHECK(row[16 + i] == 0.0f); /* block 1: cleared */
    }
    CHECK_EQ_INT(q35_bfp_get_block(Q35_DT_BFP4, buf, n_in, 0, 0, got), 130);
    for (int i = 0; i < 16; i++) CHECK_EQ_INT(got[i], i == 8 ? 0 : i);
    uint8_t stored[16];
    for (int i = 0; i < 16; i++) stored[i] = (uint8_t)i;
    q35_bfp_put_stored(Q35_DT_BFP4, buf, n_in, 0, 1, 130, stored);
    CHECK(q35_bfp_get(Q35_DT_BFP4, buf, n_in, 0, 16) == -16.0f);
    CHECK(q35_bfp_get(Q35_DT_BFP4, buf, n_in, 0, 31) == 14.0f);
    CHECK_EQ_INT(q35_bfp_get_block(Q35_DT_BFP4, buf, n_in, 0, 1, got), 130);
    CHECK_EQ_INT(got[0], 8);
    q35_bfp_clear(Q35_DT_BFP4, cp, 1, n_in);
    for (int b = 0; b < 2; b++) {
        uint8_t e = q35_bfp_get_stored(Q35_DT_BFP4, buf, n_in, 0, b, stored);
        q35_bfp_put_stored(Q35_DT_BFP4, cp, n_in, 0, b, e, stored);
    }
    CHECK(memcmp(buf, cp, nb) == 0);
    free(buf);
    free(cp);
}
