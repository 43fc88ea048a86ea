/* kv_q8.h: the 8-bit KV cache rows (Q35_KV_Q8, as llama.cpp's q8_0 cache
 * types). A row of HD values (one KV head at one position) is stored as
 * nb fp32 scales, then HD int8 codes in order. With HD % 32 == 0 there are
 * nb = HD / 32 blocks of 32 values, interleaved by fours: value i belongs
 * to block (i / 4) % nb (q35_kv_q8_block_of), so that each 32-bit lane of
 * a 16- or 8-lane integer vector over the codes sees one block, at any
 * offset that is a multiple of 64 (32) values (attention's integer scores,
 * kernels.h); otherwise one block of all HD. Block b keeps d = max|x| / 127
 * and q = x * (127 / max|x|) rounded to nearest even (all 0 where max|x| is
 * 0; NaN gives 0), and stands for the values (float)q * d, each product
 * rounded once: every kernel table dequantizes with that one expression. */
#ifndef Q35_FORMATS_KV_Q8_H
#define Q35_FORMATS_KV_Q8_H

#include <stddef.h>
#include <stdint.h>

static inline int32_t q35_kv_q8_block(int32_t HD) { return HD % 32 ? HD : 32; }
#define Q35_KV_Q8_MAX_BLOCKS 64 /* HD <= 2048 (head_dim <= 1024 in any config) */
static inline int32_t q35_kv_q8_nblocks(int32_t HD) { return HD / q35_kv_q8_block(HD); }
/* the block of value i in a row of nb blocks */
static inline int32_t q35_kv_q8_block_of(int32_t i, int32_t nb) { return (i >> 2) % nb; }
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
