/* safetensors.c: parse and map safetensors files and sharded checkpoints
 * (see safetensors.h). Nothing is trusted: the header length, every offset
 * and every shape is checked against the file before use. */
#include "formats/safetensors.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#define Q35_ST_MAX_HEADER (256u << 20) /* real headers are well under 1 MiB */

/* The element formats read from a checkpoint (the block formats exist only in a cache). */
static int dtype_from_name(const char *s, q35_dtype *dt, size_t *elem) {
    if (!q35_dtype_parse(s, dt) || q35_dtype_is_block(*dt)) return 0;
    *elem = (size_t)q35_dtype_info(*dt)->block_bytes;
    return 1;
}

/* Element sizes of the dtypes we only list (so sizes can still be checked). */
static size_t other_dtype_size(const char *s) {
    static const struct { const char *n; size_t sz; } t[] = {
        {"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4}, {"U32", 4}, {"I16", 2}, {"U16", 2},
        {"I8", 1}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1},
    };
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
        if (!strcmp(s, t[i].n)) return t[i].sz;
    return 0;
}

static void free_entries(q35_st_entry *e, int32_t n) {
    for (int32_t i = 0; i < n; i++) free(e[i].name);
    free(e);
}

q35_status q35_st_parse(const void *data, size_t size, const char *label, q35_st_file *out, q35_error *err) {
    out->n_entries = 0;
    out->entries = NULL;
    if (size < 8) return q35_fail(err, Q35_ERR_FORMAT, "%s: truncated safetensors file (%zu bytes)", label, size);
    const unsigned char *p = data;
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | p[i];
    if (hlen == 0 || hlen > Q35_ST_MAX_HEADER || hlen > size - 8)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: header length %llu does not fit the file (%zu bytes)", label,
                        (unsigned long long)hlen, size);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return q35_fail(err, Q35_ERR_FORMAT, "%s: header is not valid JSON: %s", label, jerr.text);
    if (!json_is_object(root)) {
        json_decref(root);
        return q35_fail(err, Q35_ERR_FORMAT, "%s: header is not a JSON object", label);
    }
    const unsigned char *base = p + 8 + hlen;
    size_t data_size = size - 8 - (size_t)hlen;
    size_t n_alloc = json_object_size(root);
    q35_st_entry *entries = calloc(n_alloc ? n_alloc : 1, sizeof *entries);
    if (!entries) { json_decref(root); return q35_fail(err, Q35_ERR_NOMEM, "%s: out of memory", label); }
    int32_t n = 0;
    q35_status st = Q35_OK;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (!strcmp(key, "__metadata__")) continue;
        json_t *jd = json_object_get(val, "dtype"), *js = json_object_get(val, "shape"),
               *jo = json_object_get(val, "data_offsets");
        if (!json_is_object(val) || !json_is_string(jd) || !json_is_array(js) || !json_is_array(jo) ||
            json_array_size(jo) != 2) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': malformed header entry", label, key);
            break;
        }
        q35_st_entry *e = &entries[n];
        e->name = strdup(key);
        if (!e->name) { st = q35_fail(err, Q35_ERR_NOMEM, "%s: out of memory", label); break; }
        n++;
        snprintf(e->dtype_name, sizeof e->dtype_name, "%s", json_string_value(jd));
        size_t elem = 0;
        e->supported = dtype_from_name(e->dtype_name, &e->tensor.dtype, &elem);
        if (!e->supported) elem = other_dtype_size(e->dtype_name);
        if (!elem) { st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': unknown dtype '%s'", label, key, e->dtype_name); break; }
        size_t nd = json_array_size(js);
        if (nd > Q35_MAX_DIMS) { st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': %zu dimensions (at most %d)", label, key, nd, Q35_MAX_DIMS); break; }
        e->tensor.ndim = (int32_t)nd;
        uint64_t nelem = 1;
        for (size_t d = 0; d < nd; d++) {
            json_t *x = json_array_get(js, d);
            if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) > ((json_int_t)1 << 40)) {
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': bad shape", label, key);
                break;
            }
            e->tensor.shape[d] = (int64_t)json_integer_value(x);
            if (e->tensor.shape[d] && nelem > (UINT64_MAX / 16) / (uint64_t)e->tensor.shape[d]) {
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape overflows", label, key);
                break;
            }
            nelem *= (uint64_t)e->tensor.shape[d];
        }
        if (st) break;
        json_t *jb = json_array_get(jo, 0), *je = json_array_get(jo, 1);
        if (!json_is_integer(jb) || !json_is_integer(je) || json_integer_value(jb) < 0 ||
            json_integer_value(je) < json_integer_value(jb)) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': bad data_offsets", label, key);
            break;
        }
        uint64_t b = (uint64_t)json_integer_value(jb), en = (uint64_t)json_integer_value(je);
        if (en > data_size) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) run past the end of the file "
                          "(%zu data bytes; truncated?)", label, key, (unsigned long long)b, (unsigned long long)en, data_size);
            break;
        }
        if (en - b != nelem * elem) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': %llu bytes stored but shape and dtype %s need %llu",
                          label, key, (unsigned long long)(en - b), e->dtype_name, (unsigned long long)(nelem * elem));
            break;
        }
        e->tensor.name = e->name;
        e->tensor.data = base + b;
        e->tensor.nbytes = (size_t)(en - b);
        e->file = label;
    }
    json_decref(root);
    if (st) { free_entries(entries, n); return st; }
    out->n_entries = n;
    out->entries = entries;
    return Q35_OK;
}

q35_status q35_st_open(const char *path, q35_st_file *out, q35_error *err) {
    memset(out, 0, sizeof *out);
    out->map.fd = -1;
    out->path = strdup(path);
    if (!out->path) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    q35_status st = q35_map_file(path, &out->map, err);
    if (!st) st = q35_st_parse(out->map.data, out->map.size, out->path, out, err);
    if (st) q35_st_close(out);
    return st;
}

void q35_st_close(q35_st_file *f) {
    free_entries(f->entries, f->n_entries);
    q35_unmap_file(&f->map);
    free(f->path);
    memset(f, 0, sizeof *f);
    f->map.fd = -1;
}

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const q35_st_entry *const *)a)->name, (*(const q35_st_entry *const *)b)->name);
}

/* Shard names come from weight_map, in first-seen order, without duplicates. */
static q35_status read_index(const char *index_path, char ***names, int32_t *n_names, json_t **weight_map_out,
                             json_t **root_out, q35_error *err) {
    char *text = NULL;
    size_t len = 0;
    q35_status st = q35_read_file(index_path, &text, &len, err);
    if (st) return st;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root) return q35_fail(err, Q35_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", index_path, jerr.text, jerr.line);
    json_t *wm = json_object_get(root, "weight_map");
    if (!json_is_object(wm) || json_object_size(wm) == 0) {
        json_decref(root);
        return q35_fail(err, Q35_ERR_FORMAT, "%s: no weight_map object", index_path);
    }
    char **list = calloc(json_object_size(wm), sizeof *list);
    int32_t n = 0;
    const char *key;
    json_t *val;
    json_object_foreach(wm, key, val) {
        q35_status bad = Q35_OK;
        const char *fn = json_string_value(val);
        if (!fn)
            bad = q35_fail(err, Q35_ERR_FORMAT, "%s: weight_map['%s'] is not a file name", index_path, key);
        else if (strchr(fn, '/') || !strcmp(fn, "..") || !*fn)
            bad = q35_fail(err, Q35_ERR_FORMAT, "%s: weight_map['%s'] names '%s', which is not a plain file name",
                           index_path, key, fn);
        if (bad) { /* the message is formatted before the JSON it quotes is freed */
            free(list);
            json_decref(root);
            return bad;
        }
        int seen = 0;
        for (int32_t i = 0; i < n && !seen; i++) seen = !strcmp(list[i], fn);
        if (!seen) list[n++] = (char *)fn;
    }
    *names = list;
    *n_names = n;
    *weight_map_out = wm;
    *root_out = root;
    return Q35_OK;
}

q35_status q35_checkpoint_open(const char *dir, q35_checkpoint *out, q35_error *err) {
    memset(out, 0, sizeof *out);
    out->dir = strdup(dir);
    if (!out->dir) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    char *index_path = q35_path_join(dir, "model.safetensors.index.json");
    char *single_path = q35_path_join(dir, "model.safetensors");
    q35_status st = Q35_OK;
    json_t *root = NULL, *wm = NULL;
    char **shards = NULL;
    int32_t n_shards = 0;
    if (q35_file_exists(index_path)) {
        st = read_index(index_path, &shards, &n_shards, &wm, &root, err);
    } else if (q35_file_exists(single_path)) {
        shards = calloc(1, sizeof *shards);
        shards[0] = "model.safetensors";
        n_shards = 1;
    } else {
        st = q35_fail(err, Q35_ERR_IO, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    if (!st) {
        out->files = calloc((size_t)n_shards, sizeof *out->files);
        for (int32_t i = 0; i < n_shards && !st; i++) {
            char *p = q35_path_join(dir, shards[i]);
            st = q35_st_open(p, &out->files[i], err);
            free(p);
            if (!st) out->n_files = i + 1;
        }
    }
    if (!st) {
        int32_t total = 0;
        for (int32_t i = 0; i < out->n_files; i++) total += out->files[i].n_entries;
        out->index = calloc((size_t)(total ? total : 1), sizeof *out->index);
        for (int32_t i = 0; i < out->n_files; i++)
            for (int32_t j = 0; j < out->files[i].n_entries; j++) out->index[out->n_index++] = &out->files[i].entries[j];
        qsort(out->index, (size_t)out->n_index, sizeof *out->index, cmp_entry_ptr);
        for (int32_t i = 1; i < out->n_index && !st; i++)
            if (!strcmp(out->index[i]->name, out->index[i - 1]->name))
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' appears in both %s and %s", dir,
                              out->index[i]->name, out->index[i - 1]->file, out->index[i]->file);
    }
    if (!st && wm) { /* every tensor the index promises must be in the shard it names */
        const char *key;
        json_t *val;
        json_object_foreach(wm, key, val) {
            const q35_st_entry *e = q35_checkpoint_find(out, key);
            const char *want = json_string_value(val);
            size_t wl = strlen(want), fl = e ? strlen(e->file) : 0;
            if (!e) {
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' is listed in the index but missing from %s", dir, key, want);
                break;
            }
            if (fl < wl || strcmp(e->file + fl - wl, want) != 0) {
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' is in %s, but the index says %s", dir, key, e->file, want);
                break;
            }
        }
    }
    free(shards);
    if (root) json_decref(root);
    free(index_path);
    free(single_path);
    if (st) q35_checkpoint_close(out);
    return st;
}

void q35_checkpoint_close(q35_checkpoint *ck) {
    for (int32_t i = 0; i < ck->n_files; i++) q35_st_close(&ck->files[i]);
    free(ck->files);
    free(ck->index);
    free(ck->dir);
    memset(ck, 0, sizeof *ck);
}

const q35_st_entry *q35_checkpoint_find(const q35_checkpoint *ck, const char *name) {
    int32_t lo = 0, hi = ck->n_index - 1;
    while (lo <= hi) {
        int32_t mid = lo + (hi - lo) / 2;
        int c = strcmp(ck->index[mid]->name, name);
        if (!c) return ck->index[mid];
        if (c < 0) lo = mid + 1; else hi = mid - 1;
    }
    return NULL;
}
