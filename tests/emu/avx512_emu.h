/* tests/emu/avx512_emu.h: plain-C stand-ins for the AVX-512 intrinsics that
 * src/backend/cpu/kernels/avx512.c uses, so that its logic (lane layouts, masks, offsets,
 * exponent scaling) can be tested against the reference on a machine without
 * AVX-512. scripts/test-avx512-emu.sh force-includes this header when it
 * compiles avx512.c with AVX2 flags only: each _mm512_* name becomes a
 * function here that follows Intel's documented semantics element by
 * element. It checks correctness, never speed. An intrinsic added to
 * avx512.c needs a stand-in here too (the compile fails until it has one). */
#ifndef Q35_AVX512_EMU_H
#define Q35_AVX512_EMU_H
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
typedef union { float f[16]; int32_t i[16]; uint32_t u[16]; int8_t b[64]; uint8_t ub[64]; uint16_t h[32]; int64_t q[8]; } emu_v;
typedef uint16_t emu_mask16;
typedef uint64_t emu_mask64;
typedef uint32_t emu_mask32;
#define __m512 emu_v
#define __m512i emu_v
#define __mmask16 emu_mask16
#define __mmask64 emu_mask64
#define __mmask32 emu_mask32
static inline emu_v E_loadu_ps(const float *p) { emu_v r; memcpy(r.f, p, 64); return r; }
static inline emu_v E_loadu_si512(const void *p) { emu_v r; memcpy(r.ub, p, 64); return r; }
static inline float E_reduce_max_ps(emu_v a) { float m = a.f[0]; for (int i = 1; i < 16; i++) m = a.f[i] > m ? a.f[i] : m; return m; }
static inline emu_v E_abs_ps(emu_v a) { for (int i = 0; i < 16; i++) a.f[i] = fabsf(a.f[i]); return a; }
/* rounded as MXCSR says (nearest even); NaN or out of range gives the integer indefinite, INT32_MIN */
static inline emu_v E_cvtps_epi32(emu_v a) { emu_v r; for (int i = 0; i < 16; i++) { float f = nearbyintf(a.f[i]); r.i[i] = f >= -2147483648.0f && f < 2147483648.0f ? (int32_t)f : INT32_MIN; } return r; }
static inline emu_v E_mul_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] *= b.f[i]; return a; }
static inline emu_v E_add_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] += b.f[i]; return a; }
static inline emu_v E_set1_ps(float f) { emu_v r; for (int i = 0; i < 16; i++) r.f[i] = f; return r; }
static inline emu_v E_set1_epi32(int32_t v) { emu_v r; for (int i = 0; i < 16; i++) r.i[i] = v; return r; }
static inline emu_v E_set1_epi8(char v) { emu_v r; memset(r.b, v, 64); return r; }
static inline emu_v E_setzero(void) { emu_v r; memset(&r, 0, 64); return r; }
static inline __m128i E_cvtepi32_epi8(emu_v a) { int8_t b[16]; for (int i = 0; i < 16; i++) b[i] = (int8_t)a.i[i]; __m128i r; memcpy(&r, b, 16); return r; }
static inline int32_t E_reduce_add_epi32(emu_v a) { uint32_t s = 0; for (int i = 0; i < 16; i++) s += a.u[i]; return (int32_t)s; }
/* Intel's order: the upper half added to the lower, halving down to one lane (not left to right) */
static inline float E_reduce_add_ps(emu_v a) { for (int n = 8; n >= 1; n /= 2) for (int i = 0; i < n; i++) a.f[i] += a.f[i + n]; return a.f[0]; }
static inline emu_v E_shuffle_epi8(emu_v t, emu_v idx) { emu_v r; for (int i = 0; i < 64; i++) { int lane = i / 16 * 16; r.b[i] = idx.b[i] < 0 ? 0 : t.b[lane + (idx.ub[i] & 15)]; } return r; }
static inline emu_v E_castsi256_si512(__m256i a) { emu_v r; memset(&r, 0x5a, 64); memcpy(r.ub, &a, 32); return r; }
static inline emu_v E_inserti64x4(emu_v a, __m256i b, int k) { memcpy(a.ub + 32 * k, &b, 32); return a; }
static inline emu_v E_and_si512(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] &= b.u[i]; return a; }
static inline emu_v E_or_si512(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] |= b.u[i]; return a; }
static inline emu_v E_mask_sub_epi8(emu_v src, emu_mask64 k, emu_v a, emu_v b) { for (int i = 0; i < 64; i++) if (k >> i & 1) src.b[i] = (int8_t)(a.b[i] - b.b[i]); return src; }
static inline emu_mask64 E_movepi8_mask(emu_v a) { emu_mask64 m = 0; for (int i = 0; i < 64; i++) if (a.b[i] < 0) m |= 1ull << i; return m; }
static inline emu_v E_broadcast_i32x4(__m128i a) { emu_v r; for (int i = 0; i < 4; i++) memcpy(r.ub + 16 * i, &a, 16); return r; }
static inline emu_v E_cvtepi32_ps(emu_v a) { for (int i = 0; i < 16; i++) a.f[i] = (float)a.i[i]; return a; }
static inline emu_v E_sub_epi32(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] -= b.u[i]; return a; }
static inline emu_v E_add_epi32(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] += b.u[i]; return a; }
static inline emu_v E_cvtepu8_epi32(__m128i a) { uint8_t b[16]; memcpy(b, &a, 16); emu_v r; for (int i = 0; i < 16; i++) r.i[i] = b[i]; return r; }
static inline emu_v E_cvtepu16_epi32(__m256i a) { uint16_t b[16]; memcpy(b, &a, 32); emu_v r; for (int i = 0; i < 16; i++) r.i[i] = b[i]; return r; }
static inline emu_v E_dpbusd(emu_v src, emu_v a, emu_v b) { for (int i = 0; i < 16; i++) for (int j = 0; j < 4; j++) src.u[i] += (uint32_t)((int32_t)a.ub[4 * i + j] * (int32_t)b.b[4 * i + j]); return src; }
static inline emu_v E_scalef_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] = ldexpf(a.f[i], (int)floorf(b.f[i])); return a; }
static inline emu_v E_fmadd_ps(emu_v a, emu_v b, emu_v c) { for (int i = 0; i < 16; i++) a.f[i] = fmaf(a.f[i], b.f[i], c.f[i]); return a; }
static inline void E_mask_storeu_ps(float *p, emu_mask16 k, emu_v a) { for (int i = 0; i < 16; i++) if (k >> i & 1) p[i] = a.f[i]; }
static inline emu_v E_maskz_loadu_ps(emu_mask16 k, const float *p) { emu_v r = E_setzero(); for (int i = 0; i < 16; i++) if (k >> i & 1) r.f[i] = p[i]; return r; }
static inline __m256i E_maskz_loadu_epi16(emu_mask16 k, const void *p) { uint16_t b[16] = {0}; for (int i = 0; i < 16; i++) if (k >> i & 1) memcpy(&b[i], (const char *)p + 2 * i, 2); __m256i r; memcpy(&r, b, 32); return r; }
static inline emu_v E_cvtph_ps(__m256i a) { __m128i lo = _mm256_castsi256_si128(a), hi = _mm256_extracti128_si256(a, 1); emu_v r; _mm256_storeu_ps(r.f, _mm256_cvtph_ps(lo)); _mm256_storeu_ps(r.f + 8, _mm256_cvtph_ps(hi)); return r; }
static inline emu_v E_castsi512_ps(emu_v a) { return a; }
static inline emu_v E_slli_epi32(emu_v a, int n) { for (int i = 0; i < 16; i++) a.u[i] <<= n; return a; }
static inline emu_v E_sub_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] -= b.f[i]; return a; }
static inline emu_v E_max_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] = a.f[i] > b.f[i] ? a.f[i] : b.f[i]; return a; }
static inline emu_v E_fnmadd_ps(emu_v a, emu_v b, emu_v c) { for (int i = 0; i < 16; i++) a.f[i] = fmaf(-a.f[i], b.f[i], c.f[i]); return a; }
/* vrndscaleps with scale 0: imm's low bits pick the rounding; only to-nearest-even is used */
static inline emu_v E_roundscale_ps(emu_v a, int imm) { for (int i = 0; i < 16; i++) a.f[i] = (imm & 3) == 0 ? nearbyintf(a.f[i]) : a.f[i]; return a; }
static inline emu_v E_maskz_scalef_ps(emu_mask16 k, emu_v a, emu_v b) { emu_v r = E_scalef_ps(a, b); for (int i = 0; i < 16; i++) if (!(k >> i & 1)) r.f[i] = 0.0f; return r; }
/* the predicates avx512.c uses: _CMP_GE_OQ and _CMP_LT_OQ (ordered: false on NaN) */
static inline emu_mask16 E_cmp_ps_mask(emu_v a, emu_v b, int pred) {
    emu_mask16 m = 0;
    for (int i = 0; i < 16; i++) {
        int t = pred == _CMP_GE_OQ ? a.f[i] >= b.f[i] : pred == _CMP_LT_OQ ? a.f[i] < b.f[i] : -1;
        if (t < 0) abort();
        if (t) m |= (emu_mask16)(1u << i);
    }
    return m;
}
#define _mm512_sub_ps E_sub_ps
#define _mm512_max_ps E_max_ps
#define _mm512_fnmadd_ps E_fnmadd_ps
#define _mm512_roundscale_ps E_roundscale_ps
#define _mm512_maskz_scalef_ps E_maskz_scalef_ps
#define _mm512_cmp_ps_mask E_cmp_ps_mask
#define _mm512_loadu_ps E_loadu_ps
#define _mm512_loadu_si512 E_loadu_si512
#define _mm512_reduce_max_ps E_reduce_max_ps
#define _mm512_abs_ps E_abs_ps
#define _mm512_cvtps_epi32 E_cvtps_epi32
#define _mm512_mul_ps E_mul_ps
#define _mm512_add_ps E_add_ps
#define _mm512_set1_ps E_set1_ps
#define _mm512_set1_epi32 E_set1_epi32
#define _mm512_set1_epi8 E_set1_epi8
#define _mm512_setzero_ps E_setzero
#define _mm512_setzero_si512 E_setzero
#define _mm512_cvtepi32_epi8 E_cvtepi32_epi8
#define _mm512_reduce_add_epi32 E_reduce_add_epi32
#define _mm512_reduce_add_ps E_reduce_add_ps
#define _mm512_shuffle_epi8 E_shuffle_epi8
#define _mm512_castsi256_si512 E_castsi256_si512
#define _mm512_inserti64x4 E_inserti64x4
#define _mm512_and_si512 E_and_si512
#define _mm512_or_si512 E_or_si512
#define _mm512_mask_sub_epi8 E_mask_sub_epi8
#define _mm512_movepi8_mask E_movepi8_mask
#define _mm512_broadcast_i32x4 E_broadcast_i32x4
#define _mm512_cvtepi32_ps E_cvtepi32_ps
#define _mm512_sub_epi32 E_sub_epi32
#define _mm512_add_epi32 E_add_epi32
#define _mm512_cvtepu8_epi32 E_cvtepu8_epi32
#define _mm512_cvtepu16_epi32 E_cvtepu16_epi32
#define _mm512_dpbusd_epi32 E_dpbusd
#define _mm512_scalef_ps E_scalef_ps
#define _mm512_fmadd_ps E_fmadd_ps
#define _mm512_mask_storeu_ps E_mask_storeu_ps
#define _mm512_maskz_loadu_ps E_maskz_loadu_ps
#define _mm256_maskz_loadu_epi16 E_maskz_loadu_epi16
#define _mm512_cvtph_ps E_cvtph_ps
#define _mm512_castsi512_ps E_castsi512_ps
#define _mm512_slli_epi32 E_slli_epi32
static inline emu_v E_broadcast_i64x4(__m256i a) { emu_v r; memcpy(r.ub, &a, 32); memcpy(r.ub + 32, &a, 32); return r; }
static inline emu_v E_mask_srli_epi16(emu_v src, emu_mask32 k, emu_v a, int n) { for (int i = 0; i < 32; i++) if (k >> i & 1) src.h[i] = (uint16_t)(a.h[i] >> n); return src; }
static inline emu_v E_add_epi64(emu_v a, emu_v b) { for (int i = 0; i < 8; i++) a.q[i] = (int64_t)((uint64_t)a.q[i] + (uint64_t)b.q[i]); return a; }
#define _mm512_add_epi64 E_add_epi64
#define _mm512_broadcast_i64x4 E_broadcast_i64x4
#define _mm512_mask_srli_epi16 E_mask_srli_epi16

static inline void E_storeu_si512(void *p, emu_v a) { memcpy(p, a.ub, 64); }
static inline void E_storeu_ps(float *p, emu_v a) { memcpy(p, a.f, 64); }
static inline emu_v E_maskz_loadu_epi16_512(emu_mask32 k, const void *p) { emu_v r = E_setzero(); for (int i = 0; i < 32; i++) if (k >> i & 1) memcpy(&r.h[i], (const char *)p + 2 * i, 2); return r; }
#define _mm512_storeu_si512 E_storeu_si512
#define _mm512_storeu_ps E_storeu_ps
#define _mm512_maskz_loadu_epi16 E_maskz_loadu_epi16_512

/* Immediates as in Intel's pseudo-code: only the bits an instruction reads.
 * A cast to a wider vector leaves the upper bits undefined: 0x5a bytes here,
 * so that code relying on them fails. Aligned loads and stores abort where
 * the hardware would fault. */
static inline void E_check_aligned(const void *p) { if ((uintptr_t)p & 63) abort(); }
static inline emu_v E_load_si512(const void *p) { E_check_aligned(p); return E_loadu_si512(p); }
static inline void E_store_ps(float *p, emu_v a) { E_check_aligned(p); E_storeu_ps(p, a); }
static inline emu_v E_maskz_loadu_epi8(emu_mask64 k, const void *p) { emu_v r = E_setzero(); for (int i = 0; i < 64; i++) if (k >> i & 1) r.ub[i] = ((const uint8_t *)p)[i]; return r; }
static inline emu_v E_setr_epi32(int e0, int e1, int e2, int e3, int e4, int e5, int e6, int e7, int e8, int e9,
                                 int e10, int e11, int e12, int e13, int e14, int e15) {
    const int32_t v[16] = {e0, e1, e2, e3, e4, e5, e6, e7, e8, e9, e10, e11, e12, e13, e14, e15};
    emu_v r;
    memcpy(r.i, v, 64);
    return r;
}
static inline emu_v E_castps256_ps512(__m256 a) { emu_v r; memset(&r, 0x5a, 64); memcpy(r.f, &a, 32); return r; }
static inline __m128 E_castps512_ps128(emu_v a) { __m128 r; memcpy(&r, a.f, 16); return r; }
static inline __m256i E_castsi512_si256(emu_v a) { __m256i r; memcpy(&r, a.ub, 32); return r; }
static inline emu_v E_castps_si512(emu_v a) { return a; }
static inline emu_v E_broadcast_f32x8(__m256 a) { emu_v r; memcpy(r.f, &a, 32); memcpy(r.f + 8, &a, 32); return r; }
static inline emu_v E_insertf32x8(emu_v a, __m256 b, int imm) { memcpy(a.f + 8 * (imm & 1), &b, 32); return a; }
static inline __m128 E_extractf32x4_ps(emu_v a, int imm) { __m128 r; memcpy(&r, a.f + 4 * (imm & 3), 16); return r; }
static inline __m256i E_extracti64x4_epi64(emu_v a, int imm) { __m256i r; memcpy(&r, a.ub + 32 * (imm & 1), 32); return r; }
static inline emu_v E_cvtepi8_epi32(__m128i a) { int8_t b[16]; memcpy(b, &a, 16); emu_v r; for (int i = 0; i < 16; i++) r.i[i] = b[i]; return r; }
static inline emu_v E_xor_si512(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] ^= b.u[i]; return a; }
static inline emu_v E_sub_epi8(emu_v a, emu_v b) { for (int i = 0; i < 64; i++) a.ub[i] = (uint8_t)(a.ub[i] - b.ub[i]); return a; }
static inline emu_v E_min_epu8(emu_v a, emu_v b) { for (int i = 0; i < 64; i++) a.ub[i] = a.ub[i] < b.ub[i] ? a.ub[i] : b.ub[i]; return a; }
static inline emu_v E_max_epu8(emu_v a, emu_v b) { for (int i = 0; i < 64; i++) a.ub[i] = a.ub[i] > b.ub[i] ? a.ub[i] : b.ub[i]; return a; }
/* a count above 15 clears the element */
static inline emu_v E_srli_epi16(emu_v a, unsigned n) { for (int i = 0; i < 32; i++) a.h[i] = n > 15 ? 0 : (uint16_t)(a.h[i] >> n); return a; }
/* vpshufb within each 128-bit lane; bytes outside k keep src's */
static inline emu_v E_mask_shuffle_epi8(emu_v src, emu_mask64 k, emu_v t, emu_v idx) {
    emu_v r = E_shuffle_epi8(t, idx);
    for (int i = 0; i < 64; i++) if (k >> i & 1) src.b[i] = r.b[i];
    return src;
}
/* vshufps: in each 128-bit lane two of a's elements, then two of b's */
static inline emu_v E_shuffle_ps(emu_v a, emu_v b, int imm) {
    emu_v r;
    for (int l = 0; l < 16; l += 4) {
        r.f[l] = a.f[l + (imm & 3)], r.f[l + 1] = a.f[l + (imm >> 2 & 3)];
        r.f[l + 2] = b.f[l + (imm >> 4 & 3)], r.f[l + 3] = b.f[l + (imm >> 6 & 3)];
    }
    return r;
}
/* vshuff32x4 / vshufi32x4 / vshufi64x2 (the same bits moved): lanes 0-1 from a, 2-3 from b, 128 bits each */
static inline emu_v E_shuffle_x128(emu_v a, emu_v b, int imm) {
    emu_v r;
    for (int l = 0; l < 4; l++) memcpy(r.ub + 16 * l, (l < 2 ? a.ub : b.ub) + 16 * (imm >> 2 * l & 3), 16);
    return r;
}
/* vpermps: element i is a's element idx[i] mod 16 */
static inline emu_v E_permutexvar_ps(emu_v idx, emu_v a) { emu_v r; for (int i = 0; i < 16; i++) r.f[i] = a.f[idx.u[i] & 15]; return r; }
#undef _mm512_setr_epi32
#undef _mm512_insertf32x8
#undef _mm512_extractf32x4_ps
#undef _mm512_extracti64x4_epi64
#undef _mm512_srli_epi16
#undef _mm512_shuffle_ps
#undef _mm512_shuffle_f32x4
#undef _mm512_shuffle_i32x4
#undef _mm512_shuffle_i64x2
#define _mm512_load_si512 E_load_si512
#define _mm512_store_ps E_store_ps
#define _mm512_maskz_loadu_epi8 E_maskz_loadu_epi8
#define _mm512_setr_epi32 E_setr_epi32
#define _mm512_castps256_ps512 E_castps256_ps512
#define _mm512_castps512_ps128 E_castps512_ps128
#define _mm512_castsi512_si256 E_castsi512_si256
#define _mm512_castps_si512 E_castps_si512
#define _mm512_broadcast_f32x8 E_broadcast_f32x8
#define _mm512_insertf32x8 E_insertf32x8
#define _mm512_extractf32x4_ps E_extractf32x4_ps
#define _mm512_extracti64x4_epi64 E_extracti64x4_epi64
#define _mm512_cvtepi8_epi32 E_cvtepi8_epi32
#define _mm512_xor_si512 E_xor_si512
#define _mm512_sub_epi8 E_sub_epi8
#define _mm512_min_epu8 E_min_epu8
#define _mm512_max_epu8 E_max_epu8
#define _mm512_srli_epi16 E_srli_epi16
#define _mm512_mask_shuffle_epi8 E_mask_shuffle_epi8
#define _mm512_shuffle_ps E_shuffle_ps
#define _mm512_shuffle_f32x4 E_shuffle_x128
#define _mm512_shuffle_i32x4 E_shuffle_x128
#define _mm512_shuffle_i64x2 E_shuffle_x128
#define _mm512_permutexvar_ps E_permutexvar_ps
/* vpermt2ps / vpermt2d: element i is a's element idx[i] mod n where idx's bit log2(n) is
 * clear, else b's; vpermw: a's element idx[i] mod 32 */
static inline emu_v E_permutex2var_ps(emu_v a, emu_v idx, emu_v b) { emu_v r; for (int i = 0; i < 16; i++) r.f[i] = (idx.u[i] & 16 ? b : a).f[idx.u[i] & 15]; return r; }
static inline emu_v E_permutex2var_epi32(emu_v a, emu_v idx, emu_v b) { emu_v r; for (int i = 0; i < 16; i++) r.u[i] = (idx.u[i] & 16 ? b : a).u[idx.u[i] & 15]; return r; }
static inline emu_v E_permutexvar_epi16(emu_v idx, emu_v a) { emu_v r; for (int i = 0; i < 32; i++) r.h[i] = a.h[idx.h[i] & 31]; return r; }
/* vblendmps: b's element where k's bit is set, else a's */
static inline emu_v E_mask_blend_ps(emu_mask16 k, emu_v a, emu_v b) { for (int i = 0; i < 16; i++) if (k >> i & 1) a.f[i] = b.f[i]; return a; }
static inline emu_v E_cvtepi8_epi16(__m256i a) { int8_t b[32]; memcpy(b, &a, 32); emu_v r; for (int i = 0; i < 32; i++) r.h[i] = (uint16_t)(int16_t)b[i]; return r; }
/* vpdpwssd: each 32-bit lane plus its two signed 16-bit products (wrapping, no saturation) */
static inline emu_v E_dpwssd(emu_v src, emu_v a, emu_v b) {
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 2; j++) src.u[i] += (uint32_t)((int32_t)(int16_t)a.h[2 * i + j] * (int16_t)b.h[2 * i + j]);
    return src;
}
/* vpshufd: in each 128-bit lane, element i is the lane's element (imm >> 2i) & 3; vpunpck{l,h}wd: in
 * each 128-bit lane, the low (high) four 16-bit elements of a and b alternately */
static inline emu_v E_shuffle_epi32(emu_v a, int imm) { emu_v r; for (int i = 0; i < 16; i++) r.u[i] = a.u[i / 4 * 4 + ((imm >> 2 * (i % 4)) & 3)]; return r; }
static inline emu_v E_unpack_epi16(emu_v a, emu_v b, int hi) { emu_v r; for (int i = 0; i < 32; i++) r.h[i] = (i % 2 ? b : a).h[i / 8 * 8 + 4 * hi + i % 8 / 2]; return r; }
#define _mm512_shuffle_epi32(a, imm) E_shuffle_epi32((a), (imm))
#define _mm512_unpacklo_epi16(a, b) E_unpack_epi16((a), (b), 0)
#define _mm512_unpackhi_epi16(a, b) E_unpack_epi16((a), (b), 1)
#define _mm512_permutex2var_ps E_permutex2var_ps
#define _mm512_permutex2var_epi32 E_permutex2var_epi32
#define _mm512_permutexvar_epi16 E_permutexvar_epi16
#define _mm512_mask_blend_ps E_mask_blend_ps
#define _mm512_cvtepi8_epi16 E_cvtepi8_epi16
#define _mm512_dpwssd_epi32 E_dpwssd

/* avx512.c's inline assembly has intrinsic forms under Q35_AVX512_EMU. The
 * CPU check for AVX512_VBMI (the bfp4 GEMV's paired loads are taken on such
 * CPUs) answers yes, or no where Q35_EMU_NO_VBMI is set (the path without);
 * avx512.c asks about nothing else. */
#define Q35_AVX512_EMU 1
static inline int E_cpu_supports(const char *feature) {
    if (strcmp(feature, "avx512vbmi")) abort();
    static int vbmi = -1;
    if (vbmi < 0) vbmi = getenv("Q35_EMU_NO_VBMI") == NULL;
    return vbmi;
}
#define __builtin_cpu_supports E_cpu_supports

/* AVX512_BF16, after Intel's pseudo-code for VCVTNE2PS2BF16 and VDPBF16PS:
 * rounding to nearest even, denormal inputs read as (signed) zero, denormal
 * results flushed to (signed) zero, MXCSR ignored. vdpbf16ps adds the odd
 * element's product first, then the even one's, each as an fp32 FMA (the
 * product of two bf16 is exact in fp32 unless it underflows). NaN payloads
 * are not modelled beyond "a NaN stays a NaN". */
#define __m512bh emu_v
static inline uint16_t E_f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7f800000u) == 0) return (uint16_t)((u >> 16) & 0x8000u); /* zero or denormal: signed zero */
    if ((u & 0x7f800000u) == 0x7f800000u) /* infinity as is; NaN quiet */
        return (uint16_t)((u >> 16) | ((u & 0x007fffffu) ? 0x0040u : 0));
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float E_daz(float f) { return fpclassify(f) == FP_SUBNORMAL ? copysignf(0.0f, f) : f; }
static inline float E_bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return E_daz(f); }
static inline emu_v E_cvtne2ps_pbh(emu_v a, emu_v b) { emu_v r; for (int i = 0; i < 16; i++) { r.h[i] = E_f32_to_bf16(b.f[i]); r.h[16 + i] = E_f32_to_bf16(a.f[i]); } return r; }
static inline emu_v E_dpbf16_ps(emu_v src, emu_v a, emu_v b) {
    for (int i = 0; i < 16; i++) {
        float acc = E_daz(src.f[i]);
        acc = E_daz(fmaf(E_bf16_to_f32(a.h[2 * i + 1]), E_bf16_to_f32(b.h[2 * i + 1]), acc));
        acc = E_daz(fmaf(E_bf16_to_f32(a.h[2 * i]), E_bf16_to_f32(b.h[2 * i]), acc));
        src.f[i] = acc;
    }
    return src;
}
#define _mm512_cvtne2ps_pbh E_cvtne2ps_pbh
#define _mm512_dpbf16_ps E_dpbf16_ps

#endif
