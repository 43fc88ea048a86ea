/* attend_q8.h: a query head prepared for the 8-bit KV cache's integer
 * scores (kernels.h, attend_driver.inc), shared by the avx2 and avx512
 * tables' attention. */
#ifndef Q35_KERNELS_ATTEND_Q8_H
#define Q35_KERNELS_ATTEND_Q8_H

#include <stdint.h>
#include <string.h>

#include "formats/kv_q8.h"

/* A query head rounded to the 8-bit row format for the integer scores: codes c, their magnitudes a,
 * block scales d, and corr[l] = -128 times the sum of the codes in 32-bit lane l of a 64-byte vector
 * (for vpdpbusd with the key codes made unsigned by adding 128). */
#define ATT_Q8_HD_MAX 512
#define ATT_Q8_R 8 /* rows per pass */
typedef struct att_q8_query {
    int8_t c[ATT_Q8_HD_MAX];
    uint8_t a[ATT_Q8_HD_MAX];
    float d[16];
    int32_t corr[16];
} __attribute__((aligned(64))) att_q8_query;

static inline void att_q8_prepare(att_q8_query *qq, const float *q, int32_t HD) {
    const int32_t nb = q35_kv_q8_nblocks(HD);
    uint8_t row[ATT_Q8_HD_MAX + 4 * 16];
    q35_kv_q8_quantize(row, q, HD);
    memset(qq->d, 0, sizeof qq->d);
    memset(qq->corr, 0, sizeof qq->corr);
    memcpy(qq->d, row, sizeof(float) * (size_t)nb);
    memcpy(qq->c, row + sizeof(float) * (size_t)nb, (size_t)HD);
    for (int32_t i = 0; i < HD; i++) {
        qq->a[i] = (uint8_t)(qq->c[i] < 0 ? -qq->c[i] : qq->c[i]);
        qq->corr[(i >> 2) & 15] -= 128 * qq->c[i];
    }
}

#endif
