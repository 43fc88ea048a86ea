/* tests/emu/avx512_emu.h: plain-C stand-ins for the AVX-512 intrinsics that
 * src/kernels/avx512.c uses, so that its logic (lane layouts, masks, offsets,
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
static inline emu_v E_cvtps_epi32(emu_v a) { emu_v r; for (int i = 0; i < 16; i++) r.i[i] = (int32_t)nearbyintf(a.f[i]); return r; }
static inline emu_v E_mul_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] *= b.f[i]; return a; }
static inline emu_v E_add_ps(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.f[i] += b.f[i]; return a; }
static inline emu_v E_set1_ps(float f) { emu_v r; for (int i = 0; i < 16; i++) r.f[i] = f; return r; }
static inline emu_v E_set1_epi32(int32_t v) { emu_v r; for (int i = 0; i < 16; i++) r.i[i] = v; return r; }
static inline emu_v E_set1_epi8(char v) { emu_v r; memset(r.b, v, 64); return r; }
static inline emu_v E_setzero(void) { emu_v r; memset(&r, 0, 64); return r; }
static inline __m128i E_cvtepi32_epi8(emu_v a) { int8_t b[16]; for (int i = 0; i < 16; i++) b[i] = (int8_t)a.i[i]; __m128i r; memcpy(&r, b, 16); return r; }
static inline int32_t E_reduce_add_epi32(emu_v a) { int32_t s = 0; for (int i = 0; i < 16; i++) s += a.i[i]; return s; }
static inline float E_reduce_add_ps(emu_v a) { float s = 0; for (int i = 0; i < 16; i++) s += a.f[i]; return s; }
static inline emu_v E_shuffle_epi8(emu_v t, emu_v idx) { emu_v r; for (int i = 0; i < 64; i++) { int lane = i / 16 * 16; r.b[i] = idx.b[i] < 0 ? 0 : t.b[lane + (idx.ub[i] & 15)]; } return r; }
static inline emu_v E_castsi256_si512(__m256i a) { emu_v r; memset(&r, 0x5a, 64); memcpy(r.ub, &a, 32); return r; }
static inline emu_v E_inserti64x4(emu_v a, __m256i b, int k) { memcpy(a.ub + 32 * k, &b, 32); return a; }
static inline emu_v E_and_si512(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] &= b.u[i]; return a; }
static inline emu_v E_or_si512(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.u[i] |= b.u[i]; return a; }
static inline emu_v E_mask_sub_epi8(emu_v src, emu_mask64 k, emu_v a, emu_v b) { for (int i = 0; i < 64; i++) if (k >> i & 1) src.b[i] = (int8_t)(a.b[i] - b.b[i]); return src; }
static inline emu_mask64 E_movepi8_mask(emu_v a) { emu_mask64 m = 0; for (int i = 0; i < 64; i++) if (a.b[i] < 0) m |= 1ull << i; return m; }
static inline emu_v E_broadcast_i32x4(__m128i a) { emu_v r; for (int i = 0; i < 4; i++) memcpy(r.ub + 16 * i, &a, 16); return r; }
static inline emu_v E_cvtepi32_ps(emu_v a) { for (int i = 0; i < 16; i++) a.f[i] = (float)a.i[i]; return a; }
static inline emu_v E_sub_epi32(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.i[i] -= b.i[i]; return a; }
static inline emu_v E_add_epi32(emu_v a, emu_v b) { for (int i = 0; i < 16; i++) a.i[i] += b.i[i]; return a; }
static inline emu_v E_cvtepu8_epi32(__m128i a) { uint8_t b[16]; memcpy(b, &a, 16); emu_v r; for (int i = 0; i < 16; i++) r.i[i] = b[i]; return r; }
static inline emu_v E_cvtepu16_epi32(__m256i a) { uint16_t b[16]; memcpy(b, &a, 32); emu_v r; for (int i = 0; i < 16; i++) r.i[i] = b[i]; return r; }
static inline emu_v E_dpbusd(emu_v src, emu_v a, emu_v b) { for (int i = 0; i < 16; i++) for (int j = 0; j < 4; j++) src.i[i] += (int32_t)a.ub[4 * i + j] * (int32_t)b.b[4 * i + j]; return src; }
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
