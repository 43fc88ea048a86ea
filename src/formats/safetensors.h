/* safetensors.h: reader for Hugging Face safetensors files and sharded
 * checkpoints.
 *
 * A file is: an 8-byte little-endian header length N, N bytes of JSON
 * ({"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...}), then the
 * tensor bytes. Every offset, shape and size is checked against the file
 * before a tensor is exposed, since checkpoints come from the network. */
#ifndef Q35_SAFETENSORS_H
#define Q35_SAFETENSORS_H

#include "formats/tensor.h"
#include "base/util.h"

/* dtypes outside q35_dtype (I8, F64, ...) are listed but cannot be bound. */
typedef struct q35_st_entry {
    char *name;
    int supported;            /* dtype is F32, F16 or BF16 */
    char dtype_name[16];      /* as written in the header */
    q35_tensor tensor;        /* name points at `name`; data into the mapping */
    const char *file;         /* path of the shard that holds it */
} q35_st_entry;

typedef struct q35_st_file {
    char *path;
    q35_mapped_file map;
    int32_t n_entries;
    q35_st_entry *entries;
} q35_st_file;

/* Parses a safetensors image already in memory (the fuzz target's entry).
 * `label` names the file in error messages. Entries point into `data`. */
q35_status q35_st_parse(const void *data, size_t size, const char *label, q35_st_file *out, q35_error *err);
q35_status q35_st_open(const char *path, q35_st_file *out, q35_error *err);
void q35_st_close(q35_st_file *f);

/* A checkpoint directory: one model.safetensors, or the shards named in
 * model.safetensors.index.json's weight_map. Lookup is by exact name. An
 * open weight cache takes the same form (q35_cache_open, cache.h), one file
 * and its entries, so that the weights bind from either. */
typedef struct q35_checkpoint {
    char *dir;
    int32_t n_files;
    q35_st_file *files;
    int32_t n_index;              /* sorted (name -> entry) for binary search */
    const q35_st_entry **index;
} q35_checkpoint;

q35_status q35_checkpoint_open(const char *dir, q35_checkpoint *out, q35_error *err);
void q35_checkpoint_close(q35_checkpoint *ck);
const q35_st_entry *q35_checkpoint_find(const q35_checkpoint *ck, const char *name);

#endif
