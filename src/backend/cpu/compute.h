/* compute.h: what the host blocks (attention.c, gdn.c, cpu.c) compute with:
 * a kernel table and a pool of workers (q35_host), matmuls over the pool,
 * and RMSNorm.
 *
 * The matmuls split their output rows across the pool's workers in aligned
 * ranges, claimed in shrinking ranges by whichever worker is free (any
 * number of tokens): each output row is computed
 * by exactly one worker, and its value does not depend on which, so results
 * do not depend on the thread count or the timing. */
#ifndef Q35_COMPUTE_H
#define Q35_COMPUTE_H

#include "backend/cpu/kernels/kernels.h"
#include "backend/profile.h"
#include "backend/cpu/threadpool.h"
#include "backend/backend.h"
#include "base/util.h"
#include "formats/tensor.h"

#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* The kernels and the workers of one host backend: the CPU backend's
 * cpuid-chosen table and its pool, or the reference backend's scalar table
 * and no pool (everything on the calling thread). */
typedef struct q35_host {
    const q35_kernels *k;
    q35_pool *pool; /* NULL: one thread */
    /* Calibration (backend.h set_tap): called before every matmul of the
     * model with the matrices and their input rows, on the calling thread. */
    q35_matmul_tap tap;
    void *tap_ctx;
    /* Q35_PROFILE (profile.h): NULL, or where the timed parts go, keyed by
     * the rows of the pass in flight (prof_rows, set at its begin) */
    q35_prof *prof;
    int32_t prof_rows;
    const char *prof_label; /* NULL, or the next matmuls' name (lm_head, tied to the embedding) */
} q35_host;


/* y (n_tok, n_out) = x (n_tok, n_in) W^T, with W (n_out, n_in). */
void q35_matmul(const q35_host *h, float *y, const q35_tensor *W, const float *x, int64_t n_tok);

/* ys[i] = x Ws[i]^T for n matrices of the same n_in, in one handoff to the
 * pool: the rows of all of them are split over the workers together, and
 * each worker quantizes x once for all its rows (kernels' matmul_n). */
void q35_matmul_multi(const q35_host *h, int n, float *const *ys, const q35_tensor *const *Ws, const float *x,
                      int64_t n_tok);

/* A new value for kernels.h's q35_kernels_x_epoch, for a job whose workers
 * call matmul_n several times with the same x. */
uint64_t q35_x_epoch_new(void);

/* Adds a hand-off of n matrices to h's profile (Q35_PROFILE; h->prof set):
 * named h->prof_label, else the first's role, then the others' last part,
 * then suffix ("linear_attn.in_proj_qkv + in_proj_z"), with their bytes. */
void q35_prof_matmuls(const q35_host *h, int32_t rows, int n, const q35_tensor *const *Ws, const char *suffix,
                      double seconds);

/* out (n_tok, H) = down(silu(x W_gate^T) * (x W_up^T)), the SwiGLU MLP,
 * with gate and up (n_tok, I) as scratch. The gate and up products are one
 * handoff; each worker applies silu(gate) * up to the rows it has just
 * computed, while they are in its cache. */
void q35_mlp(const q35_host *h, float *out, float *gate, float *up, const q35_tensor *W_gate, const q35_tensor *W_up,
             const q35_tensor *W_down, const float *x, int64_t n_tok);

/* w[i] as float: BF16 and F32 read inline, other dtypes through q35_tensor_get_f32. */
static inline float q35_weight_f32(const q35_tensor *w, int64_t i) {
    if (w->dtype == Q35_DT_BF16) return q35_bf16_to_f32(((const uint16_t *)w->data)[i]);
    if (w->dtype == Q35_DT_F32) return ((const float *)w->data)[i];
    return q35_tensor_get_f32(w, i);
}

/* w's values [i0, i0 + n) as q35_weight_f32 gives them, into dst: the
 * dtype checked once; BF16 eight at a time (each value's 16 bits above 16
 * zero bits, q35_bf16_to_f32's bits: GCC 12 at -O2 left the loop scalar,
 * three instructions a value, where the GDN convolution converts its taps
 * for every row of every layer). */
static inline void q35_weights_f32(float *dst, const q35_tensor *w, int64_t i0, int64_t n) {
    if (w->dtype == Q35_DT_BF16) {
        const uint16_t *s = (const uint16_t *)w->data + i0;
        int64_t i = 0;
#ifdef __SSE2__
        for (; i + 8 <= n; i += 8) {
            const __m128i v = _mm_loadu_si128((const __m128i *)(s + i)), z = _mm_setzero_si128();
            _mm_storeu_si128((__m128i *)(dst + i), _mm_unpacklo_epi16(z, v));
            _mm_storeu_si128((__m128i *)(dst + i + 4), _mm_unpackhi_epi16(z, v));
        }
#endif
        for (; i < n; i++) dst[i] = q35_bf16_to_f32(s[i]);
    } else if (w->dtype == Q35_DT_F32) {
        memcpy(dst, (const float *)w->data + i0, sizeof(float) * (size_t)n);
    } else {
        for (int64_t i = 0; i < n; i++) dst[i] = q35_tensor_get_f32(w, i0 + i);
    }
}

/* RMSNorm with the (1 + w) weight convention: dst = src / rms(src) * (1 + w),
 * over n values, the sum of squares in double (q35_sum_squares's order): the
 * kernel table's rmsnorm1p (kernels.h), the same bits in every table. dst may
 * be src. */
void q35_rmsnorm1p_to(float *dst, const float *src, const q35_tensor *w, int32_t n, float eps);
static inline void q35_rmsnorm1p(float *x, const q35_tensor *w, int32_t n, float eps) { q35_rmsnorm1p_to(x, x, w, n, eps); }

#endif
