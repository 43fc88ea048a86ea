/* bfp.h: Tenstorrent block floating point (bfp4_b, bfp8_b): the codec and
 * the weight-cache storage layout of Q35_DT_BFP4 / Q35_DT_BFP8 tensors.
 *
 * Codec. A block is 16 values sharing one 8-bit exponent E (bias 127, the
 * fp32 exponent field). Each value is a code (sign << w) | m, where m is a
 * w-bit magnitude that includes the hidden bit: w = 3 for bfp4, 7 for bfp8.
 * value = (-1)^s * m * 2^(E - 127 - (w - 1)). The encoder reproduces
 * tt-metal's convert_u32_to_bfp bit for bit: E is the largest exponent field
 * of the block; each significand is aligned by a truncating right shift, then
 * rounded to w bits half-to-even on the bits that remain (double rounding, on
 * purpose), saturated at 2^w - 1, and a zero magnitude never keeps its sign.
 * Zero and denormal inputs give code 0; inf and NaN only count as exponent
 * 255. Q35_BFP_EXP_SEARCH adds the optional 2026 exponent search (try E - 1,
 * keep it only if the block's squared error is strictly lower).
 *
 * Layout. TT stores Linear weights as [in, out], so its blocks run along the
 * output features. We re-encode from the checkpoint's [out, in] matrix with
 * blocks along the input dimension K instead: then one activation block
 * (16 consecutive inputs) meets one weight exponent per row, so the
 * activation can be quantized per block to int8 and the dot product runs on
 * integer units (vpdpbusd), with one float scale per 16 x 16 weights. The
 * codec is TT's exactly; only the block orientation differs, so values are
 * not bit-identical to TT's own tiles of the same weights.
 *
 * A tensor [n_out, n_in] (n_in % 16 == 0) is stored in panels of 16 rows,
 * four panels to a group (64 rows; Q35_BFP_GROUP_ROWS): ceil(n_out / 64)
 * groups, rows past n_out are padding (exponent 0, code 0: value 0). With n_blk =
 * n_in / 16 and C the bytes of one block's codes (128 for bfp4, 256 for
 * bfp8), group g starts at byte g * q35_bfp_group_bytes() and is n_blk
 * units, one per block b, of U = 4 * (16 + C) bytes (576 or 1088):
 *
 *   unit b of group g, at g * group_bytes + b * U:
 *     exponents  64 bytes:  byte 16*p + r = exponent of row r of panel p, block b
 *     codes      4 * C bytes: panel p's at 64 + p * C; its block b is four
 *                groups q = 0..3 of four inputs k = 16b + 4q + j (j = 0..3):
 *     bfp8: group = 64 bytes,  byte 4r + j = code(row r, k)
 *     bfp4: group = 32 bytes,  byte 4r + j (r < 8): low nibble = stored(row r, k),
 *                                                   high nibble = stored(row r + 8, k)
 *
 * bfp8 stores each code as it is. bfp4 stores each code c as its value in
 * steps plus 8 (offset binary): stored = 8 + m for c = m (sign clear), 8 - m
 * for c = 8 | m (q35_bfp4_stored), so 1..15 for -7..7 and 8 for zero, and
 * the kernels feed the nibble to the unsigned operand of their integer dot
 * products as it is (the offset cancels against -8 times x's block sum);
 * as the codec's sign and magnitude they cost two table lookups per 32
 * code bytes (vpshufb), 8 of the 78 AVX2 instructions of a 16 x 16 block
 * for two tokens. The stored 0 is the one nibble no code is written as
 * (the codec's -0, code 8, is stored as 8): it reads as value -8 (a block
 * step times -8) in the kernels, get_row and get alike, and get_block
 * turns it into code 8. Cache files before format 3 stored the codes
 * themselves.
 *
 * So 4.5 and 8.5 bits per weight, as in TT. One 32- or 64-byte group is
 * exactly one vpdpbusd operand: each 32-bit lane is one row and its four
 * bytes are four consecutive k (for bfp4 after splitting the nibbles: low
 * nibbles are rows 0-7, high rows 8-15), so no horizontal sums are needed.
 * A unit is a multiple of 64 bytes, so a 64-byte aligned tensor keeps every
 * exponent line and code group naturally aligned.
 *
 * A group is one sequential stream: decoding one token, a core reads the
 * four panels' block b together, unit after unit. Each panel stored whole
 * (its exponents, then its codes, as before this layout) made eight streams
 * per core for the same four panels at once, and the core's bfp4 GEMV read
 * 0.83-0.88 of a plain sequential read of the same bytes; one stream a group
 * reads 0.93-1.01 (AVX-512, [12288, 4096], one and two threads, medians of
 * nine interleaved rounds). A row range that starts or ends inside a group
 * reads its panels' parts of each unit (strided, from L2 for the panels
 * after the first: bfp_prefetch_unit).
 *
 * Why this layout. Decode reads each weight once, so it is bandwidth-bound
 * only while one core decodes faster than its share of DRAM (about 22 GB/s
 * per core for 44 GB/s on 2 cores); what decides is work per byte.
 * bench/bench_kernels.c compares three bfp4 layouts with AVX2 kernels on a
 * [12288, 4096] GEMV (n_tok = 1), best of several runs, on a 2-vCPU AMD EPYC
 * VM (AVX2, no AVX-512) that other jobs were loading at the time, so its
 * DRAM figures moved between runs (read ceiling 4-9 GB/s with 1 thread);
 * the hot-in-L2 figure (one core, weights in L2) is the stable one:
 *
 *   GB/s of bfp4 data             in L2, 1 thread      DRAM, 1 thread
 *   16-row panels (this layout)        11.7 - 16.4        2.8 - 5.9
 *   row-major, blocks along K           6.0 -  7.9        2.1 - 4.4
 *   TT orientation, blocks along N      1.8 -  4.0        1.2 - 1.5
 *
 * Panels need about 70 AVX2 instructions per 16 x 16 block; row-major
 * needs about twice that (block scales spread across lanes, a horizontal
 * sum per row), and TT's orientation more again (x stays fp32: a scalar
 * scale and a float decode per input). With AVX-512 VNNI a panel block is
 * about 30 instructions (one vpdpbusd per group). Kept in TT's orientation,
 * TT's tiles could be used without re-encoding; this layout instead
 * re-encodes the checkpoint's weights with the same codec along K.
 */
#ifndef Q35_BFP_H
#define Q35_BFP_H

#include "qwen35.h"
#include "formats/tensor.h"

#include <stddef.h>
#include <stdint.h>

#define Q35_BFP_BLOCK 16 /* values per shared exponent */
#define Q35_BFP_PANEL 16 /* rows per panel in the storage layout */
#define Q35_BFP_GROUP 4  /* panels per group (stored block by block, interleaved) */
#define Q35_BFP_GROUP_ROWS (Q35_BFP_PANEL * Q35_BFP_GROUP)

/* Encoder flags. */
#define Q35_BFP_EXP_SEARCH 1u /* tt-metal's optional exponent search (spec 1.3 step 4) */

/* Magnitude bits w for Q35_DT_BFP4 (3) or Q35_DT_BFP8 (7); 0 for other dtypes. */
int q35_bfp_mant_bits(q35_dtype dt);

/* Encodes 16 fp32 bit patterns (bf16 input: widen with `h << 16` first) into
 * 16 one-byte codes (sign at bit w) and returns the shared exponent byte. */
uint8_t q35_bfp_encode_block(q35_dtype dt, const uint32_t in_bits[Q35_BFP_BLOCK], unsigned flags,
                             uint8_t codes[Q35_BFP_BLOCK]);

/* One value's code under a given shared exponent E, by the encoder's rule
 * for each value (a value whose own exponent field is above E saturates). */
uint8_t q35_bfp_encode_value(q35_dtype dt, uint32_t bits, int E);

/* One code under shared exponent exp, exactly as a float (never -0). */
float q35_bfp_decode(q35_dtype dt, uint8_t exp, uint8_t code);

/* Bytes of one 16-row panel's weights, of one group of four panels, and of
 * a whole [n_out, n_in] tensor (whole groups). */
size_t q35_bfp_panel_bytes(q35_dtype dt, int64_t n_in);
size_t q35_bfp_group_bytes(q35_dtype dt, int64_t n_in);
size_t q35_bfp_tensor_bytes(q35_dtype dt, int64_t n_out, int64_t n_in);

/* Bytes from one block's unit of a group to the next: 4 * (16 + C). */
static inline size_t q35_bfp_unit_bytes(q35_dtype dt) { return dt == Q35_DT_BFP4 ? 576 : 1088; }

/* Where block 0 of the panel holding row r lies in a tensor with n_in
 * inputs: its 16 exponent bytes and its codes (block b: add b units). A
 * group is n_in / 16 units. */
static inline size_t q35_bfp_panel_exps(q35_dtype dt, int64_t n_in, int64_t r) {
    return (size_t)(r / Q35_BFP_GROUP_ROWS) * (size_t)(n_in / Q35_BFP_BLOCK) * q35_bfp_unit_bytes(dt) +
           (size_t)(r / Q35_BFP_PANEL % Q35_BFP_GROUP) * Q35_BFP_PANEL;
}
static inline size_t q35_bfp_panel_codes(q35_dtype dt, int64_t n_in, int64_t r) {
    return (size_t)(r / Q35_BFP_GROUP_ROWS) * (size_t)(n_in / Q35_BFP_BLOCK) * q35_bfp_unit_bytes(dt) +
           Q35_BFP_GROUP * Q35_BFP_PANEL + (size_t)(r / Q35_BFP_PANEL % Q35_BFP_GROUP) * (dt == Q35_DT_BFP4 ? 128 : 256);
}

/* A bfp4 code's stored form (value + 8) and back. Code 8 (-0) is stored
 * as 8 (zero), and the stored 0 (-8, no code's value) reads as code 8; so
 * both keep every value the codec has. */
static inline uint8_t q35_bfp4_stored(uint8_t code) {
    return (uint8_t)(code & 8 ? 8 - (code & 7) : 8 + (code & 7));
}
static inline uint8_t q35_bfp4_code(uint8_t stored) {
    return (uint8_t)(stored >= 8 ? stored - 8 : stored ? 8 | (8 - stored) : 8);
}

/* Stores / loads block b of row r (exponent and 16 unpacked codes) in the
 * panel layout described above. */
void q35_bfp_put_block(q35_dtype dt, void *data, int64_t n_in, int64_t r, int64_t b, uint8_t exp,
                       const uint8_t codes[Q35_BFP_BLOCK]);
uint8_t q35_bfp_get_block(q35_dtype dt, const void *data, int64_t n_in, int64_t r, int64_t b,
                          uint8_t codes[Q35_BFP_BLOCK]);
/* The same with the stored values (bfp4: value + 8, 0..15; bfp8: the
 * codes), as the kernels read them: a copy through these is exact for any
 * bytes. */
void q35_bfp_put_stored(q35_dtype dt, void *data, int64_t n_in, int64_t r, int64_t b, uint8_t exp,
                        const uint8_t stored[Q35_BFP_BLOCK]);
uint8_t q35_bfp_get_stored(q35_dtype dt, const void *data, int64_t n_in, int64_t r, int64_t b,
                           uint8_t stored[Q35_BFP_BLOCK]);

/* Sets a whole [n_out, n_in] tensor (its padding rows too) to exponent 0
 * and code 0, the value zero: what pack_matrix leaves in padding rows. */
void q35_bfp_clear(q35_dtype dt, void *data, int64_t n_out, int64_t n_in);

/* Converts a row-major [n_out, n_in] F32 or BF16 matrix (src_dt) into the
 * panel layout of dt in dst (dst_size >= q35_bfp_tensor_bytes(dt, n_out,
 * n_in); padding rows are written as zeros). The weight-cache writer calls
 * this once per tensor. */
q35_status q35_bfp_pack_matrix(q35_dtype dt, void *dst, size_t dst_size, const void *src, q35_dtype src_dt,
                               int64_t n_out, int64_t n_in, unsigned flags, q35_error *err);

/* A stored value as a float: bfp4's value + 8 as it is (the stored 0 is -8
 * steps, as the kernels read it), bfp8's code by the codec. */
float q35_bfp_decode_stored(q35_dtype dt, uint8_t exp, uint8_t stored);

/* Row r of a packed [*, n_in] tensor decoded to n_in floats, and one
 * element: the codec's values (bfp4's stored 0, outside it, as -8 steps). */
void q35_bfp_get_row(q35_dtype dt, const void *data, int64_t n_in, int64_t r, float *out);
float q35_bfp_get(q35_dtype dt, const void *data, int64_t n_in, int64_t r, int64_t i);

#endif
