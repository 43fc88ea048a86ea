/* Tests of src/util.c: number conversions and file helpers. */
#include "test.h"
#include "util.h"

TEST(util, bf16_round_trip_and_rounding) {
    CHECK(q35_bf16_to_f32(0x3f80) == 1.0f);
    CHECK(q35_f32_to_bf16(1.0f) == 0x3f80);
    /* 1 + 2^-8 is exactly half way between two bf16 values: ties go to even (1.0). */
    CHECK(q35_f32_to_bf16(1.00390625f) == 0x3f80);
    /* 1 + 3*2^-8 is half way between 0x3f81 and 0x3f82: even is 0x3f82. */
    CHECK(q35_f32_to_bf16(1.01171875f) == 0x3f82);
    CHECK(q35_f32_to_bf16(-2.0f) == 0xc000);
    CHECK(isnan(q35_bf16_to_f32(q35_f32_to_bf16(NAN))));
}

TEST(util, f16_round_trip_every_value) {
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = q35_f16_to_f32((uint16_t)h);
        if (isnan(f)) continue;
        if (q35_f32_to_f16(f) != h) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    CHECK(q35_f16_to_f32(0x3c00) == 1.0f);
    CHECK(q35_f16_to_f32(0x0001) == 5.9604644775390625e-08f);
    CHECK(q35_f32_to_f16(1e6f) == 0x7c00);
}

TEST(util, read_missing_file_names_it) {
    q35_error err = {0};
    char *buf = NULL;
    CHECK(q35_read_file("/nonexistent/q35/file.json", &buf, NULL, &err) == Q35_ERR_IO);
    CHECK(strstr(err.msg, "/nonexistent/q35/file.json") != NULL);
    CHECK(buf == NULL);
}
