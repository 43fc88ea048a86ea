/* dtype.h: the stored number formats of a tensor and what every part of the
 * code needs to know of each: its name, how many bytes a row takes, whether
 * rows are stored in panels, and how to turn floats into stored bytes and
 * back. One table (dtype.c) answers these, so that code outside the kernels
 * asks it instead of switching on the dtype.
 *
 * A row of n values is n / block_elems blocks of block_bytes each. The
 * element formats (F32, F16, BF16) have blocks of one value and store a
 * tensor row-major. The block formats (BFP8, BFP4: 16 values sharing an
 * exponent, bfp.h) store a [rows, cols] matrix in groups of panel_rows
 * rows (four 16-row panels), the last one padded with zero rows; block_bytes counts a row's
 * share of a panel block (one exponent byte and its codes). */
#ifndef Q35_DTYPE_H
#define Q35_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum q35_dtype {
    Q35_DT_F32 = 0,
    Q35_DT_F16 = 1,
    Q35_DT_BF16 = 2,
    Q35_DT_BFP8 = 3, /* Tenstorrent bfp8_b codes, blocks of 16 along in, 16-row panels (bfp.h) */
    Q35_DT_BFP4 = 4, /* Tenstorrent bfp4_b codes, blocks of 16 along in, 16-row panels (bfp.h) */
    Q35_DT_COUNT
} q35_dtype;

typedef struct q35_dtype_traits {
    const char *name;    /* "F32", "BF16", "BFP4": as safetensors headers and manifests spell them */
    int32_t block_elems; /* values per block along a row: 1, or 16 for a block format */
    int32_t block_bytes; /* bytes of one block of one row: 4, 2, 2, 17 (BFP8), 9 (BFP4) */
    int32_t panel_rows;  /* rows stored together: 1 (row-major), 64 (a group of bfp panels) */
    /* Values [i0, i0 + n) of a [*, cols] tensor, flat index in PyTorch
     * order, decoded to n floats (exactly: every stored value is a float). */
    void (*decode)(q35_dtype dt, const void *data, int64_t cols, int64_t i0, int64_t n, float *out);
    /* n_rows rows of cols floats (row-major) encoded into dst, which starts
     * on a panel boundary and holds q35_dtype_bytes(dt, n_rows, cols) bytes;
     * padding rows of the last panel are written as zeros. cols must be a
     * multiple of block_elems. */
    void (*encode)(q35_dtype dt, void *dst, const float *src, int64_t n_rows, int64_t cols);
} q35_dtype_traits;

extern const q35_dtype_traits q35_dtype_table[Q35_DT_COUNT];

/* The traits of dt; NULL for a code outside the enum (a corrupt file's). */
static inline const q35_dtype_traits *q35_dtype_info(q35_dtype dt) {
    return (unsigned)dt < Q35_DT_COUNT ? &q35_dtype_table[dt] : NULL;
}

const char *q35_dtype_name(q35_dtype dt); /* "?" for an unknown code */
/* The dtype named `name` (exact, as q35_dtype_name spells it); 0 if none. */
int q35_dtype_parse(const char *name, q35_dtype *out);

/* 1 for the block formats (stored in panels), 0 for the element formats. */
static inline int q35_dtype_is_block(q35_dtype dt) { return q35_dtype_info(dt) && q35_dtype_table[dt].block_elems > 1; }

/* Bytes of one row of cols values, and of a [rows, cols] tensor (rows
 * rounded up to whole panels). */
size_t q35_dtype_row_bytes(q35_dtype dt, int64_t cols);
size_t q35_dtype_bytes(q35_dtype dt, int64_t rows, int64_t cols);

/* Decodes values [i0, i0 + n) / encodes n_rows rows: the traits' functions. */
void q35_dtype_decode(q35_dtype dt, const void *data, int64_t cols, int64_t i0, int64_t n, float *out);
void q35_dtype_encode(q35_dtype dt, void *dst, const float *src, int64_t n_rows, int64_t cols);

/* Copies row src_row of a [*, cols] tensor at src to row dst_row of one at
 * dst, both of dtype dt, byte for byte (block formats: block by block
 * inside the panels). */
void q35_dtype_copy_row(q35_dtype dt, void *dst, int64_t dst_row, const void *src, int64_t src_row, int64_t cols);

#endif
