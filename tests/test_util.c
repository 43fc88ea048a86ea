/* Tests of src/util.c: number conversions and file helpers. */
#include "test.h"
#include "base/util.h"
#include "helpers.h"

#include <stdint.h>
#include <unistd.h>

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

/* Mappings start on a 2 MiB boundary (huge pages), and the in-memory copy
 * lands at the same address with the same bytes, read-only. */
TEST(util, map_is_aligned_and_the_copy_replaces_it_in_place) {
    char path[1200];
    snprintf(path, sizeof path, "%s/map3m.bin", q35_test_tmpdir());
    size_t n = (3u << 20) + 123;
    unsigned char *src = malloc(n);
    REQUIRE(src);
    for (size_t i = 0; i < n; i++) src[i] = (unsigned char)(i * 2654435761u >> 13);
    REQUIRE(!test_spit(path, src, n));
    q35_mapped_file f;
    q35_error err = {0};
    REQUIRE_MSG(!q35_map_file(path, &f, &err), "%s", err.msg);
    CHECK(f.size == n && ((uintptr_t)f.data & ((2u << 20) - 1)) == 0);
    void *at = f.data;
    CHECK_MSG(!q35_map_copy(&f, path, &err), "%s", err.msg);
    CHECK(f.data == at && f.copied == 1);
    CHECK(!memcmp(f.data, src, n));
    q35_unmap_file(&f);
    free(src);
}

/* A file cut short after it was mapped: the copy fails with an error that
 * names it, and the file mapping stays in place. */
TEST(util, map_copy_of_a_shrunk_file_fails_cleanly) {
    char path[1200];
    snprintf(path, sizeof path, "%s/shrunk.bin", q35_test_tmpdir());
    size_t n = 1u << 20;
    char *src = calloc(1, n);
    REQUIRE(src && !test_spit(path, src, n));
    free(src);
    q35_mapped_file f;
    q35_error err = {0};
    REQUIRE_MSG(!q35_map_file(path, &f, &err), "%s", err.msg);
    REQUIRE(truncate(path, (off_t)(n / 2)) == 0);
    void *at = f.data;
    CHECK(q35_map_copy(&f, path, &err) == Q35_ERR_IO);
    CHECK(strstr(err.msg, "shrunk.bin") != NULL && strstr(err.msg, "shrank") != NULL);
    CHECK(f.data == at && f.copied == 0);
    q35_unmap_file(&f);
}
