/* matmul_driver.h: the loops around the register tiles, shared by the ISA
 * files (avx2.c, avx512.c) so that only the tiles differ between them.
 *
 * Included by an ISA file after it defines:
 *   ISA_BFP_NT     tokens per bfp panel tile (at most 8)
 *   ISA_FLOAT_NR   rows per float tile (>= 2); remainders use 1 row
 *   ISA_FLOAT_NT   tokens per float tile (at most 8)
 *   int  act_quantize(act_q8 *a, const float *x, int64_t n_tok, int64_t n_in)
 *   void bfp_panel_tile(is4, nt, panel, n_in, a, t0, y, n_out, row0, lo, hi)
 *        rows [row0 + lo, row0 + hi) of one 16-row panel, tokens [t0, t0 + nt)
 *   void float_tile(dt, nr, nt, w0, row_bytes, x, n_in, t0, y, n_out, o)
 *        rows [o, o + nr), tokens [t0, t0 + nt)
 *   ISA_VEC, ISA_VEC_ADD64(a, b)   the widest integer vector, 64-bit lane add
 * and optionally BFP_GEMV_PANELS (one token over that many whole panels) with
 *   void bfp_gemv_tile(is4, panel, panel_bytes, n_in, a, y)   y = the first panel's row0
 * and optionally ISA_BFP_WIDE, BFP_WIDE_MIN_TOKENS(is4) (calls of that many
 * tokens take a panel in k-slices of BFP_SLICE_BLOCKS, bfp_wide_panel) and
 *   void bfp_slice_predecode(is4, panel, n_in, b0, nb, a)
 *        decode blocks [b0, b0 + nb) of a panel into act_alloc's wide scratch
 *   void bfp_slice_tokens(is4, panel, n_in, a, t0, t1, b0, nb, y, n_out, row0, lo, hi)
 *        tokens [t0, t1) over that slice, partial sums in a->acc between slices:
 *        after the last slice, bfp_panel_tile's rows, bitwise the same
 * The tiles are always_inline and every size reaches them as a literal, so
 * each (dtype, rows, tokens) case compiles to its own fully unrolled loop. */
#ifndef Q35_MATMUL_DRIVER_H
#define Q35_MATMUL_DRIVER_H

/* Blocks per k-slice of a panel in the wide path: a slice's decoded weights
 * and row scales (320 bytes per block) stay in L1 while every token of a
 * chunk passes over them. */
#define BFP_SLICE_BLOCKS 32

/* Activations quantized per block of 16 inputs, in per-thread scratch
 * (q35_kernels_scratch), for bfp weights. */
typedef struct act_q8 {
    int8_t *q;     /* (n_tok, n_in) */
    float *d;      /* (n_tok, n_in / 16): x ~= q * d */
    int32_t *sum;  /* (n_tok, n_in / 16): sum of q over the block */
    /* ISA_BFP_WIDE only (NULL otherwise): */
    int32_t *off;  /* (n_tok, n_in / 16): -4 * sum in each int16 half (bfp4's offset, see avx2.c) */
    uint8_t *dec;  /* (BFP_SLICE_BLOCKS, 256): one k-slice of a panel, decoded */
    float *ws;     /* (BFP_SLICE_BLOCKS, 16): that slice's row scales */
    float *acc;    /* (n_tok, 16): one panel's partial sums between slices */
} act_q8;

/* Carves the arrays for n_blk activation blocks out of this thread's
 * scratch and, when wide_tok > 0 (the tokens of a call that takes the wide
 * path), those of the wide path too. */
static inline int act_alloc(act_q8 *a, size_t n_blk, size_t wide_tok) {
    size_t q_bytes = (n_blk * 16 + 63) & ~(size_t)63, d_bytes = (n_blk * 4 + 63) & ~(size_t)63;
    size_t wide_bytes = wide_tok ? d_bytes + BFP_SLICE_BLOCKS * (256 + 64) + wide_tok * 64 : 0;
    char *s = q35_kernels_scratch(q_bytes + 2 * d_bytes + wide_bytes);
    if (!s) return 0;
    a->q = (int8_t *)s;
    a->d = (float *)(s + q_bytes);
    a->sum = (int32_t *)(s + q_bytes + d_bytes);
    s += q_bytes + 2 * d_bytes;
    a->off = wide_tok ? (int32_t *)s : NULL;
    a->dec = wide_tok ? (uint8_t *)(s + d_bytes) : NULL;
    a->ws = wide_tok ? (float *)(s + d_bytes + BFP_SLICE_BLOCKS * 256) : NULL;
    a->acc = wide_tok ? (float *)(s + d_bytes + BFP_SLICE_BLOCKS * 320) : NULL;
    return 1;
}

/* Software prefetch for the bfp tiles. A panel is one sequential stream;
 * each block asks for the block BFP_PREFETCH_BLOCKS ahead (past the panel's
 * end: the next panel's exponents, the next thing read) so that decoding
 * overlaps the DRAM latency: with the hardware prefetcher alone a core
 * reached about 60% of its read bandwidth on bfp4. A panel's first codes
 * are asked for when it starts, as the previous panel's prefetches only
 * reached its exponents. For bfp4 (128-byte blocks) 2 KiB ahead measured
 * best of 0.5-6 KiB on 4 KiB pages (1-4 KiB were within the noise of a
 * shared machine); counting in blocks keeps bfp8 (256-byte blocks, about
 * the same work per block) as far ahead in time, which lifted its GEMV from
 * 13.4-13.8 to 14.8-17.7 GB/s on 2 threads (bench_kernels). */
#define BFP_PREFETCH_BLOCKS 16

/* The same, `ahead` blocks ahead (a literal after inlining). */
static inline __attribute__((always_inline)) void bfp_prefetch_panel_ahead(const uint8_t *codes, int block_bytes,
                                                                           int ahead) {
    for (int l = 0; l < ahead * block_bytes; l += 64) _mm_prefetch((const char *)codes + l, _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void bfp_prefetch_block_ahead(const uint8_t *exps,
                                                                           const uint8_t *block_codes, int64_t b,
                                                                           int block_bytes, int ahead) {
    #pragma GCC unroll 4
    for (int l = 0; l < block_bytes; l += 64)
        _mm_prefetch((const char *)block_codes + ahead * block_bytes + l, _MM_HINT_T0);
    if ((b & 3) == 0) _mm_prefetch((const char *)exps + 16 * (b + ahead), _MM_HINT_T0);
}

static inline __attribute__((always_inline)) void bfp_prefetch_panel(const uint8_t *codes, int block_bytes) {
    bfp_prefetch_panel_ahead(codes, block_bytes, BFP_PREFETCH_BLOCKS);
}

static inline __attribute__((always_inline)) void bfp_prefetch_block(const uint8_t *exps, const uint8_t *block_codes,
                                                                     int64_t b, int block_bytes) {
    bfp_prefetch_block_ahead(exps, block_codes, b, block_bytes, BFP_PREFETCH_BLOCKS);
}

#endif

#ifdef ISA_BFP_NT

/* Calls `tile(..., n, ...)` with n as a literal for n = 1 .. 8 up to max. */
#define DRIVER_CASES_1_TO_8(max, n, call)                                                           \
    switch (n) {                                                                                    \
    case 1: { enum { n_ = 1 }; call; } break;                                                       \
    case 2: if ((max) >= 2) { enum { n_ = (max) >= 2 ? 2 : 1 }; call; } break;                      \
    case 3: if ((max) >= 3) { enum { n_ = (max) >= 3 ? 3 : 1 }; call; } break;                      \
    case 4: if ((max) >= 4) { enum { n_ = (max) >= 4 ? 4 : 1 }; call; } break;                      \
    case 5: if ((max) >= 5) { enum { n_ = (max) >= 5 ? 5 : 1 }; call; } break;                      \
    case 6: if ((max) >= 6) { enum { n_ = (max) >= 6 ? 6 : 1 }; call; } break;                      \
    case 7: if ((max) >= 7) { enum { n_ = (max) >= 7 ? 7 : 1 }; call; } break;                      \
    case 8: if ((max) >= 8) { enum { n_ = (max) >= 8 ? 8 : 1 }; call; } break;                      \
    }

/* Each (dtype, tokens) tile is its own function, so that the register
 * allocator sees one tile at a time: inlined side by side into one driver,
 * the tiles' accumulators and constants were spilled to the stack. */
typedef void (*bfp_tile_fn)(const uint8_t *panel, int64_t n_in, const act_q8 *a, int64_t t0, float *y, int64_t n_out,
                            int64_t row0, int lo, int hi);
#define DRIVER_BFP_TILE(tile, is4, nt)                                                                            \
    static __attribute__((noinline)) void tile##_##is4##_##nt(const uint8_t *panel, int64_t n_in, const act_q8 *a,  \
                                                               int64_t t0, float *y, int64_t n_out, int64_t row0,    \
                                                               int lo, int hi) {                                     \
        tile(is4, (nt) <= ISA_BFP_NT ? (nt) : 1, panel, n_in, a, t0, y, n_out, row0, lo, hi);                      \
    }
#define DRIVER_BFP_TILES(tile, is4)                                                                               \
    DRIVER_BFP_TILE(tile, is4, 1) DRIVER_BFP_TILE(tile, is4, 2) DRIVER_BFP_TILE(tile, is4, 3)                    \
    DRIVER_BFP_TILE(tile, is4, 4) DRIVER_BFP_TILE(tile, is4, 5) DRIVER_BFP_TILE(tile, is4, 6)                    \
    DRIVER_BFP_TILE(tile, is4, 7) DRIVER_BFP_TILE(tile, is4, 8)
/* [is4][tokens]; entries past ISA_BFP_NT are never called */
#define DRIVER_BFP_TABLE(tile)                                                                                    \
    DRIVER_BFP_TILES(tile, 0)                                                                                     \
    DRIVER_BFP_TILES(tile, 1)                                                                                     \
    static const bfp_tile_fn tile##s[2][9] = {                                                                    \
        {NULL, tile##_0_1, tile##_0_2, tile##_0_3, tile##_0_4, tile##_0_5, tile##_0_6, tile##_0_7, tile##_0_8},   \
        {NULL, tile##_1_1, tile##_1_2, tile##_1_3, tile##_1_4, tile##_1_5, tile##_1_6, tile##_1_7, tile##_1_8},   \
    };
DRIVER_BFP_TABLE(bfp_panel_tile)
#ifdef ISA_BFP_WIDE
/* Tokens [t0, t1) of one panel through the wide path, slice by slice. */
static inline __attribute__((always_inline)) void bfp_wide_panel(const int is4, const uint8_t *panel, int64_t n_in,
                                                                 const act_q8 *a, int64_t t0, int64_t t1, float *y,
                                                                 int64_t n_out, int64_t row0, int lo, int hi) {
    const int64_t n_blk = n_in / 16;
    for (int64_t b0 = 0; b0 < n_blk; b0 += BFP_SLICE_BLOCKS) {
        int nb = n_blk - b0 < BFP_SLICE_BLOCKS ? (int)(n_blk - b0) : BFP_SLICE_BLOCKS;
        bfp_slice_predecode(is4, panel, n_in, b0, nb, a);
        bfp_slice_tokens(is4, panel, n_in, a, t0, t1, b0, nb, y, n_out, row0, lo, hi);
    }
}
typedef void (*bfp_wide_fn)(const uint8_t *panel, int64_t n_in, const act_q8 *a, int64_t t0, int64_t t1, float *y,
                            int64_t n_out, int64_t row0, int lo, int hi);
#define DRIVER_BFP_WIDE(is4)                                                                                      \
    static __attribute__((noinline)) void bfp_wide_panel_##is4(const uint8_t *panel, int64_t n_in, const act_q8 *a, \
                                                                int64_t t0, int64_t t1, float *y, int64_t n_out,    \
                                                                int64_t row0, int lo, int hi) {                     \
        bfp_wide_panel(is4, panel, n_in, a, t0, t1, y, n_out, row0, lo, hi);                                      \
    }
DRIVER_BFP_WIDE(0)
DRIVER_BFP_WIDE(1)
static const bfp_wide_fn bfp_wide_panels[2] = {bfp_wide_panel_0, bfp_wide_panel_1};
#endif

#ifdef BFP_GEMV_PANELS
#define DRIVER_BFP_GEMV(is4)                                                                                      \
    static __attribute__((noinline)) void bfp_gemv_##is4(const uint8_t *panel, size_t panel_bytes, int64_t n_in,   \
                                                         const act_q8 *a, float *y) {                              \
        bfp_gemv_tile(is4, panel, panel_bytes, n_in, a, y);                                                       \
    }
DRIVER_BFP_GEMV(0)
DRIVER_BFP_GEMV(1)
#endif

/* y rows [o0, o1) from bfp weights W and activations a, quantized from x
 * (n_tok, n_in) by act_quantize. */
static void matmul_bfp(float *y, const q35_tensor *W, const act_q8 *a, int64_t n_tok, int64_t o0, int64_t o1) {
    const int64_t n_out = W->shape[0], n_in = W->shape[W->ndim - 1];
    const size_t panel_bytes = q35_bfp_panel_bytes(W->dtype, n_in);
    const int is4 = W->dtype == Q35_DT_BFP4;
    /* Tokens in chunks whose int8 activations (chunk * n_in bytes) stay in
     * L2, at most 256 KiB; within a chunk, panel outer and token groups
     * inner, so a panel (36 KiB of bfp4 at n_in = 4096) is read from memory
     * once per chunk and from L1/L2 by every group. Decode and small batches
     * are one chunk. */
    int64_t chunk = ((int64_t)256 << 10) / n_in / ISA_BFP_NT * ISA_BFP_NT;
    if (chunk < ISA_BFP_NT) chunk = ISA_BFP_NT;
#ifdef BFP_GEMV_PANELS
    /* decode: whole panels BFP_GEMV_PANELS at a time, the rest one by one */
    for (int64_t row0 = o0 / 16 * 16; n_tok == 1 && row0 < o1;) {
        const uint8_t *panel = (const uint8_t *)W->data + (size_t)(row0 / 16) * panel_bytes;
        if (row0 >= o0 && row0 + 16 * BFP_GEMV_PANELS <= o1) {
            (is4 ? bfp_gemv_1 : bfp_gemv_0)(panel, panel_bytes, n_in, a, y + row0);
            row0 += 16 * BFP_GEMV_PANELS;
        } else {
            int lo = o0 > row0 ? (int)(o0 - row0) : 0, hi = o1 < row0 + 16 ? (int)(o1 - row0) : 16;
            bfp_panel_tiles[is4][1](panel, n_in, a, 0, y, n_out, row0, lo, hi);
            row0 += 16;
        }
    }
    if (n_tok == 1) return;
#endif
    for (int64_t c0 = 0; c0 < n_tok; c0 += chunk) {
        int64_t c1 = c0 + chunk < n_tok ? c0 + chunk : n_tok;
        for (int64_t row0 = o0 / 16 * 16; row0 < o1; row0 += 16) {
            int lo = o0 > row0 ? (int)(o0 - row0) : 0, hi = o1 < row0 + 16 ? (int)(o1 - row0) : 16;
            const uint8_t *panel = (const uint8_t *)W->data + (size_t)(row0 / 16) * panel_bytes;
#ifdef ISA_BFP_WIDE
            if (c1 - c0 >= BFP_WIDE_MIN_TOKENS(is4) && a->dec) {
                bfp_wide_panels[is4](panel, n_in, a, c0, c1, y, n_out, row0, lo, hi);
                continue;
            }
#endif
            for (int64_t t0 = c0; t0 < c1; t0 += ISA_BFP_NT) {
                int nt = c1 - t0 < ISA_BFP_NT ? (int)(c1 - t0) : ISA_BFP_NT;
                bfp_panel_tiles[is4][nt](panel, n_in, a, t0, y, n_out, row0, lo, hi);
            }
        }
    }
}

#define DRIVER_FLOAT_TILE(dt)                                                                                   \
    if (nr == ISA_FLOAT_NR)                                                                                     \
        DRIVER_CASES_1_TO_8(ISA_FLOAT_NT, nt, float_tile(dt, ISA_FLOAT_NR, n_, w0, row_bytes, x, n_in, t0, y, n_out, o)) \
    else                                                                                                        \
        DRIVER_CASES_1_TO_8(ISA_FLOAT_NT, nt, float_tile(dt, 1, n_, w0, row_bytes, x, n_in, t0, y, n_out, o))

static void matmul_float(float *y, const q35_tensor *W, const float *x, int64_t n_tok, int64_t o0, int64_t o1) {
    const int64_t n_out = W->shape[0], n_in = W->shape[W->ndim - 1];
    const size_t row_bytes = (size_t)n_in * (W->dtype == Q35_DT_F32 ? 4 : 2);
    /* Rows outer: ISA_FLOAT_NR rows (a few KiB each) stay in L1 while every
     * group of tokens passes over them. */
    for (int64_t o = o0; o < o1;) {
        int nr = o1 - o >= ISA_FLOAT_NR ? ISA_FLOAT_NR : 1;
        const char *w0 = (const char *)W->data + (size_t)o * row_bytes;
        for (int64_t t0 = 0; t0 < n_tok; t0 += ISA_FLOAT_NT) {
            int nt = n_tok - t0 < ISA_FLOAT_NT ? (int)(n_tok - t0) : ISA_FLOAT_NT;
            switch (W->dtype) {
            case Q35_DT_F32: DRIVER_FLOAT_TILE(Q35_DT_F32) break;
            case Q35_DT_F16: DRIVER_FLOAT_TILE(Q35_DT_F16) break;
            default: DRIVER_FLOAT_TILE(Q35_DT_BF16) break;
            }
        }
        o += nr;
    }
}

/* kernels.h's read_stream: eight independent chains of the widest aligned
 * loads. No software prefetch: it measured slower, the hardware prefetcher
 * already streams sequential reads. */
static uint64_t read_stream(const void *p, size_t bytes) {
    const ISA_VEC *q = p;
    ISA_VEC a[8];
    memset(a, 0, sizeof a);
    for (size_t i = 0; i + 8 <= bytes / sizeof(ISA_VEC); i += 8)
        #pragma GCC unroll 8
        for (int j = 0; j < 8; j++) a[j] = ISA_VEC_ADD64(a[j], q[i + j]);
    #pragma GCC unroll 8
    for (int j = 1; j < 8; j++) a[0] = ISA_VEC_ADD64(a[0], a[j]);
    uint64_t lanes[sizeof(ISA_VEC) / 8], sum = 0;
    memcpy(lanes, &a[0], sizeof lanes);
    for (size_t j = 0; j < sizeof(ISA_VEC) / 8; j++) sum += lanes[j];
    return sum;
}

/* kernels.h's matmul_n: x is quantized once, for the first bfp piece, and
 * serves every bfp piece after it (again only if a piece's n_in differs). */
static void matmul_n_isa(int n, float *const *ys, const q35_tensor *const *Ws, const float *x, int64_t n_tok,
                         const int64_t *o0, const int64_t *o1) {
    act_q8 a;
    int64_t a_n_in = -1; /* n_in of the activations in a; 0: no scratch, the reference runs */
    for (int i = 0; i < n; i++) {
        const q35_tensor *W = Ws[i];
        const int64_t n_in = W->shape[W->ndim - 1];
        if (o0[i] >= o1[i]) continue;
        switch (W->dtype) {
        case Q35_DT_BFP4:
        case Q35_DT_BFP8:
            if (a_n_in != n_in && a_n_in != 0) a_n_in = act_quantize(&a, x, n_tok, n_in) ? n_in : 0;
            if (a_n_in == n_in) matmul_bfp(ys[i], W, &a, n_tok, o0[i], o1[i]);
            else q35_matmul_ref(ys[i], W, x, n_tok, o0[i], o1[i]);
            break;
        case Q35_DT_F32:
        case Q35_DT_F16:
        case Q35_DT_BF16: matmul_float(ys[i], W, x, n_tok, o0[i], o1[i]); break;
        default: q35_matmul_ref(ys[i], W, x, n_tok, o0[i], o1[i]); break;
        }
    }
}

#endif
