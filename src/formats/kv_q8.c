/* kv_q8.c: the 8-bit KV cache rows (kv_q8.h). */
#include "formats/kv_q8.h"

#include <math.h>
#include <string.h>

void q35_kv_q8_quantize(uint8_t *row, const float *x, int32_t HD) {
    const int32_t B = q35_kv_q8_block(HD), nb = HD / B;
    int8_t *q = (int8_t *)(row + sizeof(float) * (size_t)nb);
    for (int32_t b = 0; b < nb; b++) {
        float amax = 0.0f;
        for (int32_t i = 0; i < B; i++) amax = fmaxf(amax, fabsf(x[b * B + i]));
        const float d = amax / 127.0f, id = amax > 0.0f ? 127.0f / amax : 0.0f;
        memcpy(row + sizeof(float) * (size_t)b, &d, sizeof d);
        for (int32_t i = 0; i < B; i++) {
            float r = nearbyintf(x[b * B + i] * id); /* |r| <= 127 up to rounding of id */
            q[b * B + i] = (int8_t)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r == r ? r : 0.0f); /* NaN: 0 */
        }
    }
}

void q35_kv_q8_dequantize(float *x, const uint8_t *row, int32_t HD) {
    const int32_t B = q35_kv_q8_block(HD), nb = HD / B;
    const int8_t *q = (const int8_t *)(row + sizeof(float) * (size_t)nb);
    for (int32_t b = 0; b < nb; b++) {
        float d;
        memcpy(&d, row + sizeof(float) * (size_t)b, sizeof d);
        for (int32_t i = 0; i < B; i++) x[b * B + i] = (float)q[b * B + i] * d;
    }
}
