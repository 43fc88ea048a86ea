/* dtype.c: the dtype table (dtype.h): sizes, names and the float
 * conversions of each stored format; the block formats use the codec of
 * bfp.c. */
#include "formats/dtype.h"
#include "formats/bfp.h"
#include "base/util.h"

static void decode_f32(q35_dtype dt, const void *data, int64_t cols, int64_t i0, int64_t n, float *out) {
    memcpy(out, (const float *)data + i0, (size_t)n * sizeof *out);
}

/* F16 and BF16: two bytes a value, widened exactly. */
static void decode_half(q35_dtype dt, const void *data, int64_t cols, int64_t i0, int64_t n, float *out) {
    const uint8_t *p = (const uint8_t *)data + 2 * i0;
    for (int64_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        out[i] = dt == Q35_DT_F16 ? q35_f16_to_f32(h) : q35_bf16_to_f32(h);
    }
}

/* One block decoded at a time: a range may start and end inside blocks. */
static void decode_bfp(q35_dtype dt, const void *data, int64_t cols, int64_t i0, int64_t n, float *out) {
    uint8_t codes[Q35_BFP_BLOCK], exp = 0;
    int64_t have_r = -1, have_b = -1;
    for (int64_t i = 0; i < n; i++) {
        int64_t r = (i0 + i) / cols, k = (i0 + i) % cols;
        if (r != have_r || k / Q35_BFP_BLOCK != have_b) {
            have_r = r;
            have_b = k / Q35_BFP_BLOCK;
            exp = q35_bfp_get_stored(dt, data, cols, r, have_b, codes);
        }
        out[i] = q35_bfp_decode_stored(dt, exp, codes[k % Q35_BFP_BLOCK]);
    }
}

static void encode_f32(q35_dtype dt, void *dst, const float *src, int64_t n_rows, int64_t cols) {
    memcpy(dst, src, (size_t)(n_rows * cols) * sizeof *src);
}

/* F16 and BF16: each value rounded to nearest even. */
static void encode_half(q35_dtype dt, void *dst, const float *src, int64_t n_rows, int64_t cols) {
    uint16_t *o = dst;
    for (int64_t i = 0; i < n_rows * cols; i++) o[i] = dt == Q35_DT_F16 ? q35_f32_to_f16(src[i]) : q35_f32_to_bf16(src[i]);
}

static void encode_bfp(q35_dtype dt, void *dst, const float *src, int64_t n_rows, int64_t cols) {
    /* shape and size are the caller's promise (dtype.h), so this cannot fail */
    q35_bfp_pack_matrix(dt, dst, q35_bfp_tensor_bytes(dt, n_rows, cols), src, Q35_DT_F32, n_rows, cols, 0, NULL);
}

const q35_dtype_traits q35_dtype_table[Q35_DT_COUNT] = {
    [Q35_DT_F32] = {"F32", 1, 4, 1, decode_f32, encode_f32},
    [Q35_DT_F16] = {"F16", 1, 2, 1, decode_half, encode_half},
    [Q35_DT_BF16] = {"BF16", 1, 2, 1, decode_half, encode_half},
    [Q35_DT_BFP8] = {"BFP8", Q35_BFP_BLOCK, 1 + Q35_BFP_BLOCK, Q35_BFP_GROUP_ROWS, decode_bfp, encode_bfp},
    [Q35_DT_BFP4] = {"BFP4", Q35_BFP_BLOCK, 1 + Q35_BFP_BLOCK / 2, Q35_BFP_GROUP_ROWS, decode_bfp, encode_bfp},
};

const char *q35_dtype_name(q35_dtype dt) {
    const q35_dtype_traits *t = q35_dtype_info(dt);
    return t ? t->name : "?";
}

int q35_dtype_parse(const char *name, q35_dtype *out) {
    for (int d = 0; d < Q35_DT_COUNT; d++)
        if (!strcmp(name, q35_dtype_table[d].name)) { *out = (q35_dtype)d; return 1; }
    return 0;
}

size_t q35_dtype_row_bytes(q35_dtype dt, int64_t cols) {
    const q35_dtype_traits *t = &q35_dtype_table[dt];
    return (size_t)(cols / t->block_elems) * (size_t)t->block_bytes;
}

size_t q35_dtype_bytes(q35_dtype dt, int64_t rows, int64_t cols) {
    int64_t p = q35_dtype_table[dt].panel_rows;
    return (size_t)((rows + p - 1) / p * p) * q35_dtype_row_bytes(dt, cols);
}

void q35_dtype_decode(q35_dtype dt, const void *data, int64_t cols, int64_t i0, int64_t n, float *out) {
    q35_dtype_table[dt].decode(dt, data, cols, i0, n, out);
}

void q35_dtype_encode(q35_dtype dt, void *dst, const float *src, int64_t n_rows, int64_t cols) {
    q35_dtype_table[dt].encode(dt, dst, src, n_rows, cols);
}

void q35_dtype_copy_row(q35_dtype dt, void *dst, int64_t dst_row, const void *src, int64_t src_row, int64_t cols) {
    if (!q35_dtype_is_block(dt)) {
        size_t row = q35_dtype_row_bytes(dt, cols);
        memcpy((uint8_t *)dst + row * (size_t)dst_row, (const uint8_t *)src + row * (size_t)src_row, row);
        return;
    }
    for (int64_t b = 0; b < cols / Q35_BFP_BLOCK; b++) {
        uint8_t codes[Q35_BFP_BLOCK];
        uint8_t exp = q35_bfp_get_stored(dt, src, cols, src_row, b, codes);
        q35_bfp_put_stored(dt, dst, cols, dst_row, b, exp, codes);
    }
}
