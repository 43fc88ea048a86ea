/* cache.h: the weight cache: one file, model.q35, that the engine maps and
 * binds without converting anything. Here: its format, reading it (parse,
 * open) and writing it from tensors a caller supplies. What to write and
 * how to check a cache directory are model/prepare.h (prepare, verify).
 *
 * A cache directory holds:
 *   model.q35        header, tensor table, tensor data (below)
 *   config.json      copied from the source (the engine reads it as usual)
 *   tokenizer files  copied when the source has them
 *   manifest.json    source files (size, SHA-256), qwen35 version, dtype policy,
 *                    per-tensor dtype/shape/SHA-256, the model config
 *   model-spec.json  context length, MTP, concurrency
 * model.q35 and manifest.json are written as *.partial, fsynced and renamed,
 * manifest last, so an interrupted prepare leaves nothing that looks
 * complete.
 *
 * model.q35, all integers little-endian:
 *   header (128 bytes)
 *     0  char[8]  magic "Q35CACHE"
 *     8  u32      format version (Q35_CACHE_VERSION)
 *    12  u32      header bytes (128)
 *    16  u32      tensor count N
 *    20  u32      table record bytes (256)
 *    24  u64      table offset (128)
 *    32  u64      data offset (table end rounded up to 4096)
 *    40  u64      file size in bytes (a shorter file is truncated)
 *    48  u8[32]   SHA-256 of the N table records
 *    80  u8[32]   SHA-256 of the config.json the cache was prepared from
 *   112  u8[16]   zero
 *   table: N records of 256 bytes, sorted by name
 *     0  char[128] tensor name, NUL-padded (at most 127 bytes)
 *   128  u32      dtype (q35_dtype: 0 F32, 1 F16, 2 BF16, 3 BFP8, 4 BFP4)
 *   132  u32      layout: 0 row-major, 1 bfp 16-row panels (see bfp.h)
 *   136  u32      ndim (1..8)
 *   140  u32      zero
 *   144  i64[8]   shape, PyTorch order; unused dims 0
 *   208  u64      data offset from the start of the file (a multiple of 64)
 *   216  u64      data bytes (must equal what dtype, layout and shape need)
 *   224  u8[32]   SHA-256 of the data bytes
 *   data: each tensor at its offset, 64-byte aligned, zero padding between.
 *
 * Loading checks magic, version, sizes, the table hash, every record
 * (name, dtype, layout, shape, byte count, bounds, alignment) and the
 * config hash, but not the data hashes: that is `qwen35 verify`. */
#ifndef Q35_CACHE_H
#define Q35_CACHE_H

#include "formats/safetensors.h"

#define Q35_CACHE_MAGIC "Q35CACHE"
#define Q35_CACHE_VERSION 3u /* 2: bfp panels in groups of four, block by block (bfp.h); 3: bfp4 codes stored as value + 8 */
#define Q35_CACHE_HEADER_BYTES 128u
#define Q35_CACHE_RECORD_BYTES 256u
#define Q35_CACHE_NAME_MAX 128
#define Q35_CACHE_ALIGN 64u
#define Q35_CACHE_FILE "model.q35"

enum { Q35_LAYOUT_ROWS = 0, Q35_LAYOUT_BFP_PANELS = 1 };

/* Bytes a tensor of this dtype and shape occupies (BFP: panels of 16 rows
 * over the last dimension; 0 when it cannot be stored that way). */
size_t q35_cache_tensor_bytes(q35_dtype dt, int ndim, const int64_t *shape);

/* Parses a cache image in memory (the fuzz target's entry): header, table,
 * records and bounds. Entries point into `data`; `label` names the file. */
q35_status q35_cache_parse(const void *data, size_t size, const char *label, q35_st_file *out, q35_error *err);

/* 1 when dir holds a cache (dir/model.q35), 0 otherwise. */
int q35_cache_present(const char *dir);

/* Maps dir/model.q35 and fills out as q35_checkpoint_open does for a
 * checkpoint, so that the weights bind unchanged; also checks dir/config.json against the hash
 * recorded at prepare time. */
q35_status q35_cache_open(const char *dir, q35_checkpoint *out, q35_error *err);

/* ---- writing ---- */
/* One tensor of a cache being written. */
typedef struct q35_cache_item {
    char name[Q35_CACHE_NAME_MAX];
    q35_dtype src_dtype, dtype;
    unsigned encode_flags; /* block formats: the encoder's flags (bfp.h: Q35_BFP_EXP_SEARCH), else 0 */
    const void *encoded;   /* the stored bytes already made (the calibrated encoder's), or NULL: from fill */
    int32_t ndim;
    int64_t shape[Q35_MAX_DIMS];
    uint64_t offset, nbytes;
    uint8_t sha256[32];
} q35_cache_item;

/* Produces rows [r0, r0 + n) of item i (rows over the first dimension of a
 * 2-D view [shape0, rest]) in the item's source dtype into buf. */
typedef q35_status (*q35_cache_fill_fn)(void *ctx, const q35_cache_item *item, int32_t i, int64_t r0, int64_t n,
                                        void *buf, q35_error *err);

/* Lays out items (sorted by name; offsets assigned) and writes the cache
 * file at `path` (written as path.partial, fsynced, renamed). Fills each
 * item's sha256. */
q35_status q35_cache_write(const char *path, q35_cache_item *items, int32_t n, const uint8_t config_sha256[32],
                           q35_cache_fill_fn fill, void *fill_ctx, q35_progress_fn progress, void *progress_ctx,
                           q35_error *err);

/* SHA-256 of a whole file, streamed (for the manifest and --expect). */
q35_status q35_sha256_file(const char *path, uint8_t out[32], q35_progress_fn progress, void *ctx, q35_error *err);
void q35_sha256_hex(const uint8_t sha[32], char hex[65]);

#endif
