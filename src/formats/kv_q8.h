/* kv_q8.h: the 8-bit KV cache rows (Q35_KV_Q8, as llama.cpp's q8_0 cache
 * types). A row of HD values (one KV head at one position) is stored as
 * HD / B fp32 scales, then HD int8 codes, with B = 32 where HD % 32 == 0
 * and B = HD otherwise (one scale). Block b keeps d = max|x| / 127 and
 * q = x * (127 / max|x|) rounded to nearest even (all 0 where max|x| is 0;
 * NaN gives 0), and stands for the values (float)q * d, each product
 * rounded once: every kernel table dequantizes with that one expression. */
#ifndef Q35_FORMATS_KV_Q8_H
#define Q35_FORMATS_KV_Q8_H

#include <stddef.h>
#include <stdint.h>

static inline int32_t q35_kv_q8_block(int32_t HD) { return HD % 32 ? HD : 32; }
static inline size_t q35_kv_q8_row_bytes(int32_t HD) {
    return sizeof(float) * (size_t)(HD / q35_kv_q8_block(HD)) + (size_t)HD;
}
/* Bytes of one such row, or of HD fp32 values when q8 is 0: the KV cache's row either way. */
static inline size_t q35_kv_row_bytes(int q8, int32_t HD) {
    return q8 ? q35_kv_q8_row_bytes(HD) : sizeof(float) * (size_t)HD;
}
void q35_kv_q8_quantize(uint8_t *row, const float *x, int32_t HD);
void q35_kv_q8_dequantize(float *x, const uint8_t *row, int32_t HD);

#endif
