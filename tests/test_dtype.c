/* Tests of src/formats/dtype.c: the dtype table's sizes and names agree with
 * the codecs, and its decode / encode / row copy give what the element
 * conversions and bfp.c give on their own. */
#include "formats/bfp.h"
#include "formats/dtype.h"
#include "test.h"
#include "base/util.h"

#include <stdlib.h>

TEST(dtype, sizes_and_names) {
    CHECK_EQ_INT(q35_dtype_bytes(Q35_DT_F32, 3, 5), 60);
    CHECK_EQ_INT(q35_dtype_bytes(Q35_DT_F16, 3, 5), 30);
    CHECK_EQ_INT(q35_dtype_bytes(Q35_DT_BF16, 1, 7), 14);
    const q35_dtype bfp[2] = {Q35_DT_BFP8, Q35_DT_BFP4};
    const int64_t rows[3] = {1, 16, 17}, cols[2] = {16, 4096};
    for (int d = 0; d < 2; d++)
        for (int r = 0; r < 3; r++)
            for (int c = 0; c < 2; c++)
                CHECK_EQ_INT(q35_dtype_bytes(bfp[d], rows[r], cols[c]), q35_bfp_tensor_bytes(bfp[d], rows[r], cols[c]));
    CHECK_EQ_INT(q35_dtype_row_bytes(Q35_DT_BFP4, 4096) * Q35_BFP_PANEL, q35_bfp_panel_bytes(Q35_DT_BFP4, 4096));
    for (int d = 0; d < Q35_DT_COUNT; d++) {
        q35_dtype got;
        CHECK(q35_dtype_parse(q35_dtype_name((q35_dtype)d), &got) && got == (q35_dtype)d);
        CHECK_EQ_INT(q35_dtype_is_block((q35_dtype)d), q35_bfp_mant_bits((q35_dtype)d) != 0);
    }
    q35_dtype got;
    CHECK(!q35_dtype_parse("bf16", &got) && !q35_dtype_parse("I32", &got));
    CHECK(q35_dtype_info(Q35_DT_COUNT) == NULL);
    CHECK_STR_EQ(q35_dtype_name(Q35_DT_COUNT), "?");
}

/* Encodes the same floats through the table and through the conversions of
 * util.h / bfp.c, and decodes them back whole, by ranges and by rows. */
TEST(dtype, encode_decode_match_the_codecs) {
    enum { R = 19, C = 48 };
    float *x = malloc(sizeof *x * R * C), *y = malloc(sizeof *y * R * C), *row = malloc(sizeof *row * C);
    uint8_t *a = malloc(R * C * 4 + 4096), *b = malloc(R * C * 4 + 4096);
    REQUIRE(x && y && row && a && b);
    uint64_t s = 0x243f6a8885a308d3ull;
    for (int i = 0; i < R * C; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = ((float)(s >> 40) / (float)(1u << 24) - 0.5f) * (i % 7 == 0 ? 100.0f : 1.0f);
    }
    for (int d = 0; d < Q35_DT_COUNT; d++) {
        q35_dtype dt = (q35_dtype)d;
        size_t n = q35_dtype_bytes(dt, R, C);
        memset(a, 0xa5, n);
        q35_dtype_encode(dt, a, x, R, C);
        if (q35_dtype_is_block(dt)) {
            q35_error err = {0};
            REQUIRE(q35_bfp_pack_matrix(dt, b, n, x, Q35_DT_F32, R, C, 0, &err) == Q35_OK);
        } else {
            for (int i = 0; i < R * C; i++) {
                if (dt == Q35_DT_F32) {
                    memcpy(b + 4 * i, &x[i], 4);
                } else {
                    uint16_t h = dt == Q35_DT_F16 ? q35_f32_to_f16(x[i]) : q35_f32_to_bf16(x[i]);
                    memcpy(b + 2 * i, &h, 2);
                }
            }
        }
        CHECK_MSG(!memcmp(a, b, n), "%s: encoded bytes differ", q35_dtype_name(dt));
        q35_dtype_decode(dt, a, C, 0, R * C, y);
        for (int r = 0; r < R; r++) {
            if (q35_dtype_is_block(dt)) q35_bfp_get_row(dt, a, C, r, row);
            for (int k = 0; k < C; k++) {
                float want = q35_dtype_is_block(dt) ? row[k]
                           : dt == Q35_DT_F32 ? x[r * C + k]
                           : dt == Q35_DT_F16 ? q35_f16_to_f32(q35_f32_to_f16(x[r * C + k]))
                                              : q35_bf16_to_f32(q35_f32_to_bf16(x[r * C + k]));
                CHECK_MSG(y[r * C + k] == want, "%s: value (%d, %d) decodes to %g, not %g", q35_dtype_name(dt), r, k,
                          (double)y[r * C + k], (double)want);
            }
        }
        /* a range that starts and ends inside blocks and crosses a row */
        int64_t i0 = 2 * C - 5, len = 30;
        q35_dtype_decode(dt, a, C, i0, len, row);
        CHECK_MSG(!memcmp(row, y + i0, sizeof *row * (size_t)len), "%s: a range decodes otherwise", q35_dtype_name(dt));
    }
    free(x); free(y); free(row); free(a); free(b);
}

TEST(dtype, copy_row_moves_a_row_exactly) {
    enum { R = 20, C = 32 };
    float x[R * C], got[C], want[C];
    for (int i = 0; i < R * C; i++) x[i] = (float)((i * 37) % 101 - 50) / 8.0f;
    for (int d = 0; d < Q35_DT_COUNT; d++) {
        q35_dtype dt = (q35_dtype)d;
        uint8_t *src = malloc(q35_dtype_bytes(dt, R, C)), *dst = calloc(1, q35_dtype_bytes(dt, 3, C));
        REQUIRE(src && dst);
        q35_dtype_encode(dt, src, x, R, C);
        q35_dtype_copy_row(dt, dst, 2, src, 17, C);
        q35_dtype_decode(dt, dst, C, 2 * C, C, got);
        q35_dtype_decode(dt, src, C, 17 * C, C, want);
        CHECK_MSG(!memcmp(got, want, sizeof got), "%s: the copied row differs", q35_dtype_name(dt));
        free(src);
        free(dst);
    }
}
