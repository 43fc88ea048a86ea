/* cache.c: the model.q35 file format (see cache.h): parse and map a cache,
 * lay out and write one.
 *
 * Writing streams: the table is known before any data (every size follows
 * from dtype and shape), so each tensor is converted in chunks of whole
 * groups of 16-row panels straight to its offset, hashed on the way, and only one
 * chunk is in memory at a time. */
#include "formats/cache.h"
#include "formats/bfp.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK_BYTES (32u << 20) /* source bytes converted per step */

static uint32_t rd32(const uint8_t *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }
static uint64_t rd64(const uint8_t *p) { return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32; }
static void wr32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void wr64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

void q35_sha256_hex(const uint8_t sha[32], char hex[65]) {
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", sha[i]);
}

static void sha256(const void *data, size_t n, uint8_t out[32]) {
    unsigned len = 32;
    EVP_Digest(data, n, out, &len, EVP_sha256(), NULL);
}

size_t q35_cache_tensor_bytes(q35_dtype dt, int ndim, const int64_t *shape) {
    const q35_dtype_traits *t = q35_dtype_info(dt);
    if (!t || ndim < 1 || ndim > Q35_MAX_DIMS) return 0;
    uint64_t n = 1;
    for (int i = 0; i < ndim; i++) {
        if (shape[i] <= 0 || shape[i] > ((int64_t)1 << 40)) return 0;
        if (n > (UINT64_MAX >> 8) / (uint64_t)shape[i]) return 0;
        n *= (uint64_t)shape[i];
    }
    if (q35_dtype_is_block(dt) && (ndim != 2 || shape[1] % t->block_elems)) return 0; /* panels of a matrix */
    int64_t rows = ndim == 1 ? 1 : shape[0];
    return q35_dtype_bytes(dt, rows, (int64_t)n / rows);
}

/* The layout code a record gives each dtype. */
static uint32_t layout_of(q35_dtype dt) { return q35_dtype_is_block(dt) ? Q35_LAYOUT_BFP_PANELS : Q35_LAYOUT_ROWS; }

/* ---- reading ---- */

static int cmp_entry(const void *a, const void *b) {
    return strcmp(((const q35_st_entry *)a)->name, ((const q35_st_entry *)b)->name);
}

static q35_status parse_record(const uint8_t *r, int32_t idx, const uint8_t *base, size_t size, uint64_t data_off,
                               const char *label, q35_st_entry *e, q35_error *err) {
    if (!memchr(r, 0, Q35_CACHE_NAME_MAX) || !r[0])
        return q35_fail(err, Q35_ERR_FORMAT, "%s: table record %d: the name is empty or not terminated", label, idx);
    const char *name = (const char *)r;
    uint32_t dtype = rd32(r + 128), layout = rd32(r + 132), ndim = rd32(r + 136);
    if (dtype >= Q35_DT_COUNT)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': unknown dtype code %u", label, name, dtype);
    if (layout != layout_of((q35_dtype)dtype))
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': layout %u does not go with dtype %s", label, name, layout,
                        q35_dtype_name((q35_dtype)dtype));
    if (ndim < 1 || ndim > Q35_MAX_DIMS)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': %u dimensions", label, name, ndim);
    int64_t shape[Q35_MAX_DIMS] = {0};
    for (uint32_t d = 0; d < Q35_MAX_DIMS; d++) {
        int64_t v = (int64_t)rd64(r + 144 + 8 * d);
        if (d < ndim) shape[d] = v;
        else if (v != 0) return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape has junk past %u dims", label, name, ndim);
    }
    size_t need = q35_cache_tensor_bytes((q35_dtype)dtype, (int)ndim, shape);
    if (!need)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': shape does not fit dtype %s", label, name,
                        q35_dtype_name((q35_dtype)dtype));
    uint64_t off = rd64(r + 208), nbytes = rd64(r + 216);
    if (nbytes != need)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': %llu bytes recorded but dtype %s and its shape need %zu",
                        label, name, (unsigned long long)nbytes, q35_dtype_name((q35_dtype)dtype), need);
    if (off % Q35_CACHE_ALIGN || off < data_off || off > size || nbytes > size - off)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s': data [%llu, +%llu) is misaligned or outside the file "
                        "(%zu bytes; truncated?)", label, name, (unsigned long long)off, (unsigned long long)nbytes, size);
    e->name = strdup(name);
    if (!e->name) return q35_fail(err, Q35_ERR_NOMEM, "%s: out of memory", label);
    e->supported = 1;
    snprintf(e->dtype_name, sizeof e->dtype_name, "%s", q35_dtype_name((q35_dtype)dtype));
    e->tensor.name = e->name;
    e->tensor.dtype = (q35_dtype)dtype;
    e->tensor.ndim = (int32_t)ndim;
    memcpy(e->tensor.shape, shape, sizeof shape);
    e->tensor.data = base + off;
    e->tensor.nbytes = (size_t)nbytes;
    e->file = label;
    return Q35_OK;
}

q35_status q35_cache_parse(const void *data, size_t size, const char *label, q35_st_file *out, q35_error *err) {
    out->n_entries = 0;
    out->entries = NULL;
    const uint8_t *p = data;
    if (size < Q35_CACHE_HEADER_BYTES)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: truncated cache (%zu bytes, shorter than the header)", label, size);
    if (memcmp(p, Q35_CACHE_MAGIC, 8) != 0)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: not a qwen35 weight cache (bad magic)", label);
    uint32_t version = rd32(p + 8), hbytes = rd32(p + 12), n = rd32(p + 16), rbytes = rd32(p + 20);
    uint64_t table_off = rd64(p + 24), data_off = rd64(p + 32), fsize = rd64(p + 40);
    if (version != Q35_CACHE_VERSION)
        return q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: cache format version %u, this qwen35 reads version %u "
                        "(prepare the cache again)", label, version, Q35_CACHE_VERSION);
    if (hbytes != Q35_CACHE_HEADER_BYTES || rbytes != Q35_CACHE_RECORD_BYTES || table_off != Q35_CACHE_HEADER_BYTES)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: corrupt header (header %u, record %u bytes, table at %llu)", label,
                        hbytes, rbytes, (unsigned long long)table_off);
    if (fsize != size)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: file is %zu bytes but its header says %llu (%s)", label, size,
                        (unsigned long long)fsize, size < fsize ? "truncated" : "trailing bytes");
    if (n == 0 || n > (1u << 20) || table_off + (uint64_t)n * rbytes > data_off || data_off > size)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: corrupt header (%u tensors, data at %llu)", label, n,
                        (unsigned long long)data_off);
    uint8_t sha[32];
    sha256(p + table_off, (size_t)n * rbytes, sha);
    if (memcmp(sha, p + 48, 32) != 0)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: the tensor table does not match its SHA-256 (corrupt header)", label);
    q35_st_entry *entries = calloc(n, sizeof *entries);
    if (!entries) return q35_fail(err, Q35_ERR_NOMEM, "%s: out of memory", label);
    q35_status st = Q35_OK;
    int32_t done = 0;
    for (uint32_t i = 0; i < n && !st; i++) {
        st = parse_record(p + table_off + (size_t)i * rbytes, (int32_t)i, p, size, data_off, label, &entries[i], err);
        if (!st) done++;
    }
    if (!st) {
        qsort(entries, n, sizeof *entries, cmp_entry);
        for (uint32_t i = 1; i < n && !st; i++)
            if (!strcmp(entries[i].name, entries[i - 1].name))
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' is listed twice", label, entries[i].name);
    }
    if (st) {
        for (int32_t i = 0; i < done; i++) free(entries[i].name);
        free(entries);
        return st;
    }
    out->n_entries = (int32_t)n;
    out->entries = entries;
    return Q35_OK;
}

int q35_cache_present(const char *dir) {
    char *p = q35_path_join(dir, Q35_CACHE_FILE);
    int r = p && q35_file_exists(p);
    free(p);
    return r;
}

static int cmp_entry_ptr(const void *a, const void *b) {
    return strcmp((*(const q35_st_entry *const *)a)->name, (*(const q35_st_entry *const *)b)->name);
}

q35_status q35_cache_open(const char *dir, q35_checkpoint *out, q35_error *err) {
    memset(out, 0, sizeof *out);
    out->dir = strdup(dir);
    out->files = calloc(1, sizeof *out->files);
    if (!out->dir || !out->files) { q35_checkpoint_close(out); return q35_fail(err, Q35_ERR_NOMEM, "out of memory"); }
    q35_st_file *f = &out->files[0];
    f->map.fd = -1;
    f->path = q35_path_join(dir, Q35_CACHE_FILE);
    q35_status st = q35_map_file(f->path, &f->map, err);
    out->n_files = 1;
    if (!st) st = q35_cache_parse(f->map.data, f->map.size, f->path, f, err);
    if (!st) { /* the config the engine reads must be the one the cache was prepared from */
        char *cfg = q35_path_join(dir, "config.json"), *text = NULL;
        size_t len = 0;
        st = q35_read_file(cfg, &text, &len, err);
        if (!st) {
            uint8_t sha[32];
            sha256(text, len, sha);
            if (memcmp(sha, (const uint8_t *)f->map.data + 80, 32) != 0)
                st = q35_fail(err, Q35_ERR_FORMAT, "%s: does not match %s (the cache was prepared from a different "
                              "config.json)", cfg, f->path);
        }
        free(text);
        free(cfg);
    }
    if (!st) {
        out->index = calloc((size_t)f->n_entries, sizeof *out->index);
        if (!out->index) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory");
        for (int32_t i = 0; !st && i < f->n_entries; i++) out->index[i] = &f->entries[i];
        if (!st) {
            out->n_index = f->n_entries;
            qsort(out->index, (size_t)out->n_index, sizeof *out->index, cmp_entry_ptr);
        }
    }
    if (st) q35_checkpoint_close(out);
    return st;
}

/* ---- writing ---- */

static int cmp_item(const void *a, const void *b) {
    return strcmp(((const q35_cache_item *)a)->name, ((const q35_cache_item *)b)->name);
}

static q35_status write_all(int fd, const void *buf, size_t n, uint64_t off, const char *path, q35_error *err) {
    const char *p = buf;
    while (n) {
        ssize_t w = pwrite(fd, p, n, (off_t)off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            int e = w < 0 ? errno : ENOSPC;
            return q35_fail(err, Q35_ERR_IO, "%s: cannot write at byte %llu: %s%s", path, (unsigned long long)off,
                            strerror(e), e == ENOSPC || e == EFBIG || e == EDQUOT ? " (is the disk full?)" : "");
        }
        p += w; n -= (size_t)w; off += (uint64_t)w;
    }
    return Q35_OK;
}

/* Converts rows of src (item->src_dtype) into the stored dtype, through
 * floats (tmp, when the source is not F32 already). For a block format the
 * rows start on a panel boundary, so they land at a panel's offset. */
static void convert_rows(const q35_cache_item *it, const void *src, int64_t n_rows, int64_t row_elems, void *dst,
                         float *tmp) {
    if (it->dtype == it->src_dtype) { /* already in the stored form (synthetic codes, as-stored tensors) */
        memcpy(dst, src, q35_dtype_bytes(it->dtype, n_rows, row_elems));
        return;
    }
    const float *f = src;
    if (it->src_dtype != Q35_DT_F32) {
        q35_dtype_decode(it->src_dtype, src, row_elems, 0, n_rows * row_elems, tmp);
        f = tmp;
    }
    if (it->encode_flags && q35_dtype_is_block(it->dtype)) /* shape and size were checked when planned */
        q35_bfp_pack_matrix(it->dtype, dst, q35_dtype_bytes(it->dtype, n_rows, row_elems), f, Q35_DT_F32, n_rows,
                            row_elems, it->encode_flags, NULL);
    else
        q35_dtype_encode(it->dtype, dst, f, n_rows, row_elems);
}

static q35_status write_tensor(int fd, const char *path, q35_cache_item *it, int32_t idx, q35_cache_fill_fn fill,
                               void *fill_ctx, q35_progress_fn progress, void *progress_ctx, uint64_t *done,
                               uint64_t total, q35_error *err) {
    int64_t rows = it->shape[0], row_elems = 1;
    for (int d = 1; d < it->ndim; d++) row_elems *= it->shape[d];
    if (it->ndim == 1) { rows = 1; row_elems = it->shape[0]; }
    size_t src_row = q35_dtype_row_bytes(it->src_dtype, row_elems);
    int64_t chunk = (int64_t)(CHUNK_BYTES / (src_row ? src_row : 1));
    chunk = chunk / Q35_BFP_GROUP_ROWS * Q35_BFP_GROUP_ROWS; /* whole groups of bfp panels */
    if (chunk < Q35_BFP_GROUP_ROWS) chunk = Q35_BFP_GROUP_ROWS;
    if (chunk > rows) chunk = rows;
    int need_tmp = it->dtype != it->src_dtype && it->src_dtype != Q35_DT_F32; /* converted through floats */
    void *src = malloc(q35_dtype_bytes(it->src_dtype, chunk, row_elems));
    void *dst = malloc(q35_dtype_bytes(it->dtype, chunk, row_elems));
    float *tmp = need_tmp ? malloc((size_t)chunk * (size_t)row_elems * sizeof *tmp) : NULL;
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    q35_status st = Q35_OK;
    if (!src || !dst || !md || (need_tmp && !tmp))
        st = q35_fail(err, Q35_ERR_NOMEM, "tensor '%s': out of memory for a %lld-row chunk", it->name, (long long)chunk);
    if (!st) EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    uint64_t off = it->offset;
    for (int64_t r0 = 0; !st && r0 < rows; r0 += chunk) {
        int64_t n = rows - r0 < chunk ? rows - r0 : chunk;
        size_t out_n = q35_dtype_bytes(it->dtype, n, row_elems);
        if (it->encoded) { /* made before: rows start on a panel boundary, so the chunk is a byte range */
            memcpy(dst, (const uint8_t *)it->encoded + q35_dtype_bytes(it->dtype, r0, row_elems), out_n);
        } else {
            st = fill(fill_ctx, it, idx, r0, n, src, err);
            if (!st) convert_rows(it, src, n, row_elems, dst, tmp);
        }
        if (!st) st = write_all(fd, dst, out_n, off, path, err);
        if (!st) EVP_DigestUpdate(md, dst, out_n);
        off += out_n;
        *done += out_n;
        if (!st && progress) progress(progress_ctx, *done, total, it->name);
    }
    if (!st && off != it->offset + it->nbytes)
        st = q35_fail(err, Q35_ERR_FORMAT, "tensor '%s': wrote %llu bytes, planned %llu", it->name,
                      (unsigned long long)(off - it->offset), (unsigned long long)it->nbytes);
    if (!st) {
        unsigned len = 32;
        EVP_DigestFinal_ex(md, it->sha256, &len);
    }
    EVP_MD_CTX_free(md);
    free(src);
    free(dst);
    free(tmp);
    return st;
}

static void encode_record(const q35_cache_item *it, uint8_t *r) {
    memset(r, 0, Q35_CACHE_RECORD_BYTES);
    memcpy(r, it->name, strlen(it->name));
    wr32(r + 128, (uint32_t)it->dtype);
    wr32(r + 132, layout_of(it->dtype));
    wr32(r + 136, (uint32_t)it->ndim);
    for (int d = 0; d < it->ndim; d++) wr64(r + 144 + 8 * d, (uint64_t)it->shape[d]);
    wr64(r + 208, it->offset);
    wr64(r + 216, it->nbytes);
    memcpy(r + 224, it->sha256, 32);
}

q35_status q35_cache_write(const char *path, q35_cache_item *items, int32_t n, const uint8_t config_sha256[32],
                           q35_cache_fill_fn fill, void *fill_ctx, q35_progress_fn progress, void *progress_ctx,
                           q35_error *err) {
    if (n <= 0) return q35_fail(err, Q35_ERR_ARG, "%s: no tensors to write", path);
    qsort(items, (size_t)n, sizeof *items, cmp_item);
    uint64_t data_off = round_up(Q35_CACHE_HEADER_BYTES + (uint64_t)n * Q35_CACHE_RECORD_BYTES, 4096);
    uint64_t off = data_off, total = 0;
    for (int32_t i = 0; i < n; i++) {
        q35_cache_item *it = &items[i];
        if (strlen(it->name) >= Q35_CACHE_NAME_MAX)
            return q35_fail(err, Q35_ERR_UNSUPPORTED, "tensor '%s': name longer than %d bytes", it->name, Q35_CACHE_NAME_MAX - 1);
        if (i && !strcmp(it->name, items[i - 1].name))
            return q35_fail(err, Q35_ERR_FORMAT, "tensor '%s' appears twice", it->name);
        it->nbytes = q35_cache_tensor_bytes(it->dtype, it->ndim, it->shape);
        if (!it->nbytes)
            return q35_fail(err, Q35_ERR_UNSUPPORTED, "tensor '%s': cannot be stored as %s", it->name,
                            q35_dtype_name(it->dtype));
        it->offset = off;
        off = round_up(off + it->nbytes, Q35_CACHE_ALIGN);
        total += it->nbytes;
    }
    uint64_t fsize = off;
    char *partial = malloc(strlen(path) + 16);
    if (!partial) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    sprintf(partial, "%s.partial", path);
    int fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        q35_status st = q35_fail(err, Q35_ERR_IO, "%s: cannot create: %s", partial, strerror(errno));
        free(partial);
        return st;
    }
    q35_status st = Q35_OK;
    /* reserve the whole file first, so a full disk shows up before hours of work */
    int pr = posix_fallocate(fd, 0, (off_t)fsize);
    if (pr == ENOSPC || pr == EFBIG || pr == EDQUOT)
        st = q35_fail(err, Q35_ERR_IO, "%s: cannot reserve %llu bytes: %s (is the disk full?)", partial,
                      (unsigned long long)fsize, strerror(pr));
    uint64_t done = 0;
    for (int32_t i = 0; !st && i < n; i++)
        st = write_tensor(fd, partial, &items[i], i, fill, fill_ctx, progress, progress_ctx, &done, total, err);
    uint8_t *head = NULL;
    size_t head_n = (size_t)data_off;
    if (!st) {
        head = calloc(1, head_n);
        if (!head) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    }
    if (!st) {
        uint8_t *table = head + Q35_CACHE_HEADER_BYTES;
        for (int32_t i = 0; i < n; i++) encode_record(&items[i], table + (size_t)i * Q35_CACHE_RECORD_BYTES);
        memcpy(head, Q35_CACHE_MAGIC, 8);
        wr32(head + 8, Q35_CACHE_VERSION);
        wr32(head + 12, Q35_CACHE_HEADER_BYTES);
        wr32(head + 16, (uint32_t)n);
        wr32(head + 20, Q35_CACHE_RECORD_BYTES);
        wr64(head + 24, Q35_CACHE_HEADER_BYTES);
        wr64(head + 32, data_off);
        wr64(head + 40, fsize);
        sha256(table, (size_t)n * Q35_CACHE_RECORD_BYTES, head + 48);
        memcpy(head + 80, config_sha256, 32);
        st = write_all(fd, head, head_n, 0, partial, err);
    }
    if (!st && ftruncate(fd, (off_t)fsize) != 0)
        st = q35_fail(err, Q35_ERR_IO, "%s: cannot set the size: %s", partial, strerror(errno));
    if (!st && fsync(fd) != 0) st = q35_fail(err, Q35_ERR_IO, "%s: fsync failed: %s", partial, strerror(errno));
    if (close(fd) != 0 && !st) st = q35_fail(err, Q35_ERR_IO, "%s: close failed: %s", partial, strerror(errno));
    if (!st && rename(partial, path) != 0)
        st = q35_fail(err, Q35_ERR_IO, "%s: cannot rename to %s: %s", partial, path, strerror(errno));
    if (st) unlink(partial); /* a failed write leaves nothing behind */
    free(head);
    free(partial);
    return st;
}

q35_status q35_sha256_file(const char *path, uint8_t out[32], q35_progress_fn progress, void *ctx, q35_error *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return q35_fail(err, Q35_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    uint64_t total = fstat(fd, &sb) == 0 ? (uint64_t)sb.st_size : 0, done = 0;
    size_t cap = 4u << 20;
    char *buf = malloc(cap);
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    q35_status st = buf && md ? Q35_OK : q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    if (!st) EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    while (!st) {
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) { st = q35_fail(err, Q35_ERR_IO, "%s: read error: %s", path, strerror(errno)); break; }
        if (r == 0) break;
        EVP_DigestUpdate(md, buf, (size_t)r);
        done += (uint64_t)r;
        if (progress) progress(ctx, done, total, path);
    }
    if (!st) {
        unsigned len = 32;
        EVP_DigestFinal_ex(md, out, &len);
    }
    EVP_MD_CTX_free(md);
    free(buf);
    close(fd);
    return st;
}
