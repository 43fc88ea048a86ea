/* bfp.c: the bfp4_b / bfp8_b codec and the layout in groups of four 16-row panels (see bfp.h).
 *
 * Scalar and exact: this runs once per tensor when the weight cache is
 * written, and it is the oracle for every kernel that reads the layout. */
#include "formats/bfp.h"
#include "base/util.h"

#include <math.h>

int q35_bfp_mant_bits(q35_dtype dt) {
    return dt == Q35_DT_BFP4 ? 3 : dt == Q35_DT_BFP8 ? 7 : 0;
}

/* One value's code under shared exponent E, following tt-metal's
 * convert_u32_to_bfp. An element whose own exponent is above E (only
 * possible during the exponent search) saturates, as tt-metal's search
 * assumes. */
static uint8_t encode_one(uint32_t u, int E, int w) {
    int e = (int)((u >> 23) & 0xff);
    if (e == 0) return 0; /* zero or denormal */
    uint32_t sign = u >> 31;
    uint32_t mag_max = (1u << w) - 1;
    uint32_t m;
    if (e > E) {
        m = mag_max;
    } else {
        uint32_t sig = (u & 0x7fffffu) | 0x800000u;
        int shift = E - e;
        sig = shift >= 32 ? 0 : sig >> shift; /* truncating alignment */
        int drop = 24 - w;
        m = sig >> drop;
        uint32_t round = sig & ((1u << drop) - 1), tie = 1u << (drop - 1);
        /* Half to even on what the alignment left: bits it dropped are not sticky. */
        if (round > tie || (round == tie && (m & 1))) m++;
        if (m > mag_max) m = mag_max;
    }
    if (m == 0) sign = 0;
    return (uint8_t)((sign << w) | m);
}

uint8_t q35_bfp_encode_value(q35_dtype dt, uint32_t bits, int E) {
    return encode_one(bits, E, q35_bfp_mant_bits(dt));
}

static double decode_exact(int E, uint8_t code, int w) {
    unsigned m = code & ((1u << w) - 1);
    if (m == 0) return 0.0;
    double v = ldexp((double)m, E - 127 - (w - 1));
    return (code >> w) & 1 ? -v : v;
}

static double block_sq_error(const uint32_t *in, const uint8_t *codes, int E, int w) {
    double err = 0.0;
    for (int i = 0; i < Q35_BFP_BLOCK; i++) {
        float x;
        memcpy(&x, &in[i], 4);
        double d = (double)x - decode_exact(E, codes[i], w);
        err += d * d;
    }
    return err;
}

uint8_t q35_bfp_encode_block(q35_dtype dt, const uint32_t in_bits[Q35_BFP_BLOCK], unsigned flags,
                             uint8_t codes[Q35_BFP_BLOCK]) {
    int w = q35_bfp_mant_bits(dt);
    int E = 0;
    for (int i = 0; i < Q35_BFP_BLOCK; i++) {
        int e = (int)((in_bits[i] >> 23) & 0xff); /* inf and NaN count as 255 */
        if (e > E) E = e;
    }
    for (int i = 0; i < Q35_BFP_BLOCK; i++) codes[i] = encode_one(in_bits[i], E, w);
    if ((flags & Q35_BFP_EXP_SEARCH) && E > w && E != 255) {
        uint8_t lower[Q35_BFP_BLOCK];
        for (int i = 0; i < Q35_BFP_BLOCK; i++) lower[i] = encode_one(in_bits[i], E - 1, w);
        if (block_sq_error(in_bits, lower, E - 1, w) < block_sq_error(in_bits, codes, E, w)) {
            memcpy(codes, lower, sizeof lower);
            E--;
        }
    }
    return (uint8_t)E;
}

float q35_bfp_decode(q35_dtype dt, uint8_t exp, uint8_t code) {
    return (float)decode_exact(exp, code, q35_bfp_mant_bits(dt));
}

/* Bytes of codes for one block of 16 rows x 16 inputs. */
static size_t block_code_bytes(q35_dtype dt) { return dt == Q35_DT_BFP4 ? 128 : 256; }

size_t q35_bfp_panel_bytes(q35_dtype dt, int64_t n_in) {
    return (size_t)(n_in / Q35_BFP_BLOCK) * (Q35_BFP_PANEL + block_code_bytes(dt));
}

size_t q35_bfp_group_bytes(q35_dtype dt, int64_t n_in) { return Q35_BFP_GROUP * q35_bfp_panel_bytes(dt, n_in); }

size_t q35_bfp_tensor_bytes(q35_dtype dt, int64_t n_out, int64_t n_in) {
    int64_t n_group = (n_out + Q35_BFP_GROUP_ROWS - 1) / Q35_BFP_GROUP_ROWS;
    return (size_t)n_group * q35_bfp_group_bytes(dt, n_in);
}

/* Where row r, block b lives: its exponent byte and the start of its codes. */
static void locate(q35_dtype dt, int64_t n_in, int64_t r, int64_t b, size_t *exp_off, size_t *code_off) {
    size_t unit = (size_t)b * q35_bfp_unit_bytes(dt);
    *exp_off = q35_bfp_panel_exps(dt, n_in, r) + unit + (size_t)(r % Q35_BFP_PANEL);
    *code_off = q35_bfp_panel_codes(dt, n_in, r) + unit;
}

/* Byte index in a block's codes of (row-in-panel rr, input kk) and, for bfp4,
 * whether it is the high nibble. */
static size_t code_byte(q35_dtype dt, int rr, int kk, int *high) {
    int g = kk / 4, j = kk % 4;
    if (dt == Q35_DT_BFP8) {
        *high = 0;
        return (size_t)(g * 64 + 4 * rr + j);
    }
    *high = rr >= 8;
    return (size_t)(g * 32 + 4 * (rr % 8) + j);
}

void q35_bfp_put_block(q35_dtype dt, void *data, int64_t n_in, int64_t r, int64_t b, uint8_t exp,
                       const uint8_t codes[Q35_BFP_BLOCK]) {
    uint8_t s[Q35_BFP_BLOCK];
    for (int i = 0; i < Q35_BFP_BLOCK; i++) s[i] = dt == Q35_DT_BFP4 ? q35_bfp4_stored(codes[i]) : codes[i];
    q35_bfp_put_stored(dt, data, n_in, r, b, exp, s);
}

uint8_t q35_bfp_get_block(q35_dtype dt, const void *data, int64_t n_in, int64_t r, int64_t b,
                          uint8_t codes[Q35_BFP_BLOCK]) {
    uint8_t exp = q35_bfp_get_stored(dt, data, n_in, r, b, codes);
    if (dt == Q35_DT_BFP4)
        for (int i = 0; i < Q35_BFP_BLOCK; i++) codes[i] = q35_bfp4_code(codes[i]);
    return exp;
}

void q35_bfp_put_stored(q35_dtype dt, void *data, int64_t n_in, int64_t r, int64_t b, uint8_t exp,
                        const uint8_t codes[Q35_BFP_BLOCK]) {
    uint8_t *p = data;
    size_t eo, co;
    locate(dt, n_in, r, b, &eo, &co);
    p[eo] = exp;
    int rr = (int)(r % Q35_BFP_PANEL);
    for (int kk = 0; kk < Q35_BFP_BLOCK; kk++) {
        int high;
        uint8_t *c = p + co + code_byte(dt, rr, kk, &high);
        if (dt == Q35_DT_BFP8)
            *c = codes[kk];
        else if (high)
            *c = (uint8_t)((*c & 0x0f) | (codes[kk] << 4));
        else
            *c = (uint8_t)((*c & 0xf0) | (codes[kk] & 0x0f));
    }
}

uint8_t q35_bfp_get_stored(q35_dtype dt, const void *data, int64_t n_in, int64_t r, int64_t b,
                           uint8_t codes[Q35_BFP_BLOCK]) {
    const uint8_t *p = data;
    size_t eo, co;
    locate(dt, n_in, r, b, &eo, &co);
    int rr = (int)(r % Q35_BFP_PANEL);
    for (int kk = 0; kk < Q35_BFP_BLOCK; kk++) {
        int high;
        uint8_t c = p[co + code_byte(dt, rr, kk, &high)];
        codes[kk] = dt == Q35_DT_BFP8 ? c : high ? (uint8_t)(c >> 4) : (uint8_t)(c & 0x0f);
    }
    return p[eo];
}

void q35_bfp_clear(q35_dtype dt, void *data, int64_t n_out, int64_t n_in) {
    size_t bytes = q35_bfp_tensor_bytes(dt, n_out, n_in), unit = q35_bfp_unit_bytes(dt);
    memset(data, 0, bytes);
    if (dt == Q35_DT_BFP4) /* code 0 is stored as 8 in both nibbles, after each unit's 64 exponent bytes */
        for (size_t at = 0; at < bytes; at += unit) memset((uint8_t *)data + at + 64, 0x88, unit - 64);
}

q35_status q35_bfp_pack_matrix(q35_dtype dt, void *dst, size_t dst_size, const void *src, q35_dtype src_dt,
                               int64_t n_out, int64_t n_in, unsigned flags, q35_error *err) {
    if (dt != Q35_DT_BFP4 && dt != Q35_DT_BFP8)
        return q35_fail(err, Q35_ERR_ARG, "bfp pack: target dtype %s is not a block format", q35_dtype_name(dt));
    if (src_dt != Q35_DT_F32 && src_dt != Q35_DT_BF16)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "bfp pack: source dtype %s (want F32 or BF16)",
                        q35_dtype_name(src_dt));
    if (n_out <= 0 || n_in <= 0 || n_in % Q35_BFP_BLOCK != 0)
        return q35_fail(err, Q35_ERR_ARG, "bfp pack: shape [%lld, %lld]: n_in must be a positive multiple of %d",
                        (long long)n_out, (long long)n_in, Q35_BFP_BLOCK);
    size_t need = q35_bfp_tensor_bytes(dt, n_out, n_in);
    if (dst_size < need)
        return q35_fail(err, Q35_ERR_ARG, "bfp pack: destination holds %zu bytes, need %zu", dst_size, need);
    q35_bfp_clear(dt, dst, n_out, n_in); /* padding rows: exponent 0, code 0 */
    int64_t n_blk = n_in / Q35_BFP_BLOCK;
    for (int64_t r = 0; r < n_out; r++) {
        for (int64_t b = 0; b < n_blk; b++) {
            uint32_t bits[Q35_BFP_BLOCK];
            int64_t i0 = r * n_in + b * Q35_BFP_BLOCK;
            if (src_dt == Q35_DT_F32) {
                memcpy(bits, (const float *)src + i0, sizeof bits);
            } else {
                const uint16_t *h = (const uint16_t *)src + i0;
                for (int i = 0; i < Q35_BFP_BLOCK; i++) bits[i] = (uint32_t)h[i] << 16;
            }
            uint8_t codes[Q35_BFP_BLOCK];
            uint8_t exp = q35_bfp_encode_block(dt, bits, flags, codes);
            q35_bfp_put_block(dt, dst, n_in, r, b, exp, codes);
        }
    }
    return Q35_OK;
}

float q35_bfp_decode_stored(q35_dtype dt, uint8_t exp, uint8_t s) {
    /* bfp4: (s - 8) steps of 2^(E - 127 - (w - 1)), exact in a float as the codec's values are */
    return dt == Q35_DT_BFP4 ? (float)ldexp((double)s - 8.0, exp - 127 - (q35_bfp_mant_bits(dt) - 1))
                             : q35_bfp_decode(dt, exp, s);
}

void q35_bfp_get_row(q35_dtype dt, const void *data, int64_t n_in, int64_t r, float *out) {
    for (int64_t b = 0; b < n_in / Q35_BFP_BLOCK; b++) {
        uint8_t s[Q35_BFP_BLOCK];
        uint8_t exp = q35_bfp_get_stored(dt, data, n_in, r, b, s);
        for (int i = 0; i < Q35_BFP_BLOCK; i++) out[b * Q35_BFP_BLOCK + i] = q35_bfp_decode_stored(dt, exp, s[i]);
    }
}

float q35_bfp_get(q35_dtype dt, const void *data, int64_t n_in, int64_t r, int64_t i) {
    uint8_t s[Q35_BFP_BLOCK];
    uint8_t exp = q35_bfp_get_stored(dt, data, n_in, r, i / Q35_BFP_BLOCK, s);
    return q35_bfp_decode_stored(dt, exp, s[i % Q35_BFP_BLOCK]);
}
