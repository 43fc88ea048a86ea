/* kv_q8.c: the 8-bit KV cache rows (kv_q8.h). */
#include "formats/kv_q8.h"

#include <math.h>
#include <string.h>

void q35_kv_q8_quantize(uint8_t *row, const float *x, int32_t HD) {
    const int32_t nb = q35_kv_q8_nblocks(HD); /* <= Q35_KV_Q8_MAX_BLOCKS */
    int8_t *q = (int8_t *)(row + sizeof(float) * (size_t)nb);
    float amax[Q35_KV_Q8_MAX_BLOCKS] = {0}, id[Q35_KV_Q8_MAX_BLOCKS];
    /* b = q35_kv_q8_block_of(i, nb), stepped */
    for (int32_t i = 0, b = 0; i < HD; i++) {
        const float a = fabsf(x[i]);
        if (a > amax[b]) amax[b] = a; /* NaN: not greater */
        if ((i & 3) == 3 && ++b == nb) b = 0;
    }
    for (int32_t b = 0; b < nb; b++) {
        const float d = amax[b] / 127.0f;
        id[b] = amax[b] > 0.0f ? 127.0f / amax[b] : 0.0f;
        memcpy(row + sizeof(float) * (size_t)b, &d, sizeof d);
    }
    for (int32_t i = 0, b = 0; i < HD; i++) {
        /* to nearest even, as nearbyintf in the default rounding mode: |x id| <= 127 up to rounding of id,
         * and 1.5 * 2^23 added and taken away leaves an integer for any |v| < 2^22 (inf and NaN pass) */
        const float v = x[i] * id[b], r = (v + 12582912.0f) - 12582912.0f;
        q[i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r == r ? r : 0.0f); /* NaN: 0 */
        if ((i & 3) == 3 && ++b == nb) b = 0;
    }
}

void q35_kv_q8_dequantize(float *x, const uint8_t *row, int32_t HD) {
    const int32_t nb = q35_kv_q8_nblocks(HD);
    const int8_t *q = (const int8_t *)(row + sizeof(float) * (size_t)nb);
    for (int32_t i = 0; i < HD; i++) {
        float d;
        memcpy(&d, row + sizeof(float) * (size_t)q35_kv_q8_block_of(i, nb), sizeof d);
        x[i] = (float)q[i] * d;
    }
}
