/* hub.c: fetch a model repository revision from the Hugging Face Hub with
 * libcurl (see hub.h, q35_hub_download).
 *
 * 1. GET {endpoint}/api/models/{repo}/tree/{revision}?recursive=true lists the
 *    files with their sizes, git blob ids and, for LFS files, SHA-256.
 * 2. Each wanted file (weights, JSON, tokenizer text) is fetched from
 *    {endpoint}/{repo}/resolve/{revision}/{path} into dest/NAME.partial. A
 *    transfer that breaks resumes with a Range request, a few times here and
 *    on the next run from the .partial left behind.
 * 3. The finished file is hashed (SHA-256 for LFS files, the git blob SHA-1
 *    otherwise) and renamed into place only if it matches; a mismatch
 *    deletes the download and fails, naming the file. */
#include "formats/hub.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_ATTEMPTS 5

typedef struct {
    char *data;
    size_t len, cap;
} membuf;

static size_t mem_write(char *p, size_t sz, size_t n, void *ctx) {
    membuf *b = ctx;
    size_t add = sz * n;
    if (b->len + add + 1 > b->cap) {
        size_t cap = (b->len + add + 1) * 2;
        if (cap > (64u << 20)) return 0; /* a file listing is small */
        char *nd = realloc(b->data, cap);
        if (!nd) return 0;
        b->data = nd;
        b->cap = cap;
    }
    memcpy(b->data + b->len, p, add);
    b->len += add;
    b->data[b->len] = 0;
    return add;
}

typedef struct {
    FILE *fp;
    uint64_t base, total, done;
    const char *name;
    q35_progress_fn progress;
    void *ctx;
    double last;
} file_sink;

static size_t file_write(char *p, size_t sz, size_t n, void *ctx) {
    file_sink *s = ctx;
    size_t w = fwrite(p, sz, n, s->fp);
    s->done += w * sz;
    if (s->progress) s->progress(s->ctx, s->base + s->done, s->total, s->name);
    return w * sz;
}

static int endpoint_ok(const char *url) {
    if (!strncmp(url, "https://", 8)) return 1;
    /* plain http only to this machine (tests, local mirrors) */
    const char *local[] = {"http://127.0.0.1:", "http://127.0.0.1/", "http://localhost:", "http://localhost/"};
    for (size_t i = 0; i < sizeof local / sizeof local[0]; i++)
        if (!strncmp(url, local[i], strlen(local[i]))) return 1;
    return 0;
}

static int wanted(const char *path) {
    if (strchr(path, '/') || path[0] == '.') return 0; /* top-level files only */
    const char *ext[] = {".safetensors", ".json", ".txt", ".jinja"};
    size_t n = strlen(path);
    for (size_t i = 0; i < sizeof ext / sizeof ext[0]; i++) {
        size_t m = strlen(ext[i]);
        if (n > m && !strcmp(path + n - m, ext[i])) return 1;
    }
    return 0;
}

static void curl_common(CURL *c, const char *url) {
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
    curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
    curl_easy_setopt(c, CURLOPT_FAILONERROR, 1L);
    curl_easy_setopt(c, CURLOPT_USERAGENT, "qwen35/" Q35_VERSION);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 30L);
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L); /* a stalled transfer fails and resumes */
    curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
}

/* Hashes a file with `md` into hex. */
static q35_status hash_file(const char *path, const EVP_MD *md, const char *prefix, size_t prefix_len, char *hex,
                            q35_error *err) {
    FILE *fp = fopen(path, "rb");
    if (!fp) return q35_fail(err, Q35_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    EVP_DigestInit_ex(ctx, md, NULL);
    if (prefix_len) EVP_DigestUpdate(ctx, prefix, prefix_len);
    char *buf = malloc(1u << 20);
    size_t r;
    while (buf && (r = fread(buf, 1, 1u << 20, fp)) > 0) EVP_DigestUpdate(ctx, buf, r);
    int bad = !buf || ferror(fp);
    fclose(fp);
    free(buf);
    unsigned char out[64];
    unsigned len = 0;
    EVP_DigestFinal_ex(ctx, out, &len);
    EVP_MD_CTX_free(ctx);
    if (bad) return q35_fail(err, Q35_ERR_IO, "%s: read error", path);
    for (unsigned i = 0; i < len; i++) snprintf(hex + 2 * i, 3, "%02x", out[i]);
    return Q35_OK;
}

/* Checks a finished download against the Hub's id for it. */
static q35_status check_file(const char *path, const char *name, uint64_t size, const char *sha256, const char *git_oid,
                             q35_error *err) {
    char hex[129];
    struct stat sb;
    if (stat(path, &sb) != 0 || (uint64_t)sb.st_size != size)
        return q35_fail(err, Q35_ERR_FORMAT, "%s: %lld bytes, the Hub says %llu", name,
                        stat(path, &sb) == 0 ? (long long)sb.st_size : -1LL, (unsigned long long)size);
    q35_status st;
    if (sha256) {
        if ((st = hash_file(path, EVP_sha256(), NULL, 0, hex, err))) return st;
        if (strcasecmp(hex, sha256))
            return q35_fail(err, Q35_ERR_FORMAT, "%s: SHA-256 %s, but the Hub's LFS SHA-256 is %s; refusing the file "
                            "(deleted, download again)", name, hex, sha256);
    } else if (git_oid) {
        char prefix[64];
        int n = snprintf(prefix, sizeof prefix, "blob %llu", (unsigned long long)size);
        if ((st = hash_file(path, EVP_sha1(), prefix, (size_t)n + 1, hex, err))) return st;
        if (strcasecmp(hex, git_oid))
            return q35_fail(err, Q35_ERR_FORMAT, "%s: git blob id %s, but the Hub says %s; refusing the file (deleted, "
                            "download again)", name, hex, git_oid);
    }
    return Q35_OK;
}

static q35_status fetch_file(CURL *c, const q35_download_params *p, const char *name, uint64_t size,
                             const char *sha256, const char *git_oid, q35_error *err) {
    char *dest = q35_path_join(p->dest_dir, name);
    char *part = malloc(strlen(dest) + 16);
    char *url = malloc(strlen(p->endpoint) + strlen(p->repo) + strlen(p->revision) + strlen(name) + 32);
    q35_status st = dest && part && url ? Q35_OK : q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    if (st) goto out;
    sprintf(part, "%s.partial", dest);
    sprintf(url, "%s/%s/resolve/%s/%s", p->endpoint, p->repo, p->revision, name);
    /* already here and intact: nothing to fetch */
    if (q35_file_exists(dest) && !check_file(dest, name, size, sha256, git_oid, NULL)) goto out;
    for (int attempt = 0; attempt < MAX_ATTEMPTS; attempt++) {
        struct stat sb;
        uint64_t have = stat(part, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        if (have > size) { unlink(part); have = 0; }
        if (have == size && size) break;
        FILE *fp = fopen(part, have ? "ab" : "wb");
        if (!fp) { st = q35_fail(err, Q35_ERR_IO, "%s: cannot create: %s", part, strerror(errno)); goto out; }
        file_sink sink = {fp, have, size, 0, name, p->progress, p->progress_ctx, 0};
        curl_easy_reset(c);
        curl_common(c, url);
        curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, file_write);
        curl_easy_setopt(c, CURLOPT_WRITEDATA, &sink);
        if (have) curl_easy_setopt(c, CURLOPT_RESUME_FROM_LARGE, (curl_off_t)have);
        CURLcode rc = curl_easy_perform(c);
        long code = 0;
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &code);
        int wclose = fclose(fp);
        if (wclose != 0) { st = q35_fail(err, Q35_ERR_IO, "%s: write error (is the disk full?)", part); goto out; }
        if (rc == CURLE_OK && have && code == 200) { /* the server ignored the range: it sent the whole file */
            unlink(part);
            continue;
        }
        if (rc == CURLE_OK) break;
        if (rc == CURLE_HTTP_RETURNED_ERROR && code >= 400 && code < 500 && code != 416 && code != 429) {
            st = q35_fail(err, Q35_ERR_IO, "%s: HTTP %ld", url, code);
            goto out;
        }
        if (rc == CURLE_WRITE_ERROR) { st = q35_fail(err, Q35_ERR_IO, "%s: write error (is the disk full?)", part); goto out; }
        if (attempt + 1 == MAX_ATTEMPTS) {
            st = q35_fail(err, Q35_ERR_IO, "%s: %s after %d attempts; run again to resume from %s", url,
                          curl_easy_strerror(rc), MAX_ATTEMPTS, part);
            goto out;
        }
    }
    st = check_file(part, name, size, sha256, git_oid, err);
    if (st) { unlink(part); goto out; }
    if (rename(part, dest) != 0) st = q35_fail(err, Q35_ERR_IO, "%s: cannot rename: %s", part, strerror(errno));
out:
    free(dest);
    free(part);
    free(url);
    return st;
}

q35_status q35_hub_download(const q35_download_params *p, q35_error *err) {
    if (!p->endpoint || !endpoint_ok(p->endpoint))
        return q35_fail(err, Q35_ERR_ARG, "hub URL '%s': must be https:// (plain http only to 127.0.0.1 or localhost)",
                        p->endpoint ? p->endpoint : "");
    if (!p->repo || !*p->repo || strstr(p->repo, "..") || !p->revision || !*p->revision || strchr(p->revision, '/'))
        return q35_fail(err, Q35_ERR_ARG, "bad repository '%s' or revision '%s'", p->repo ? p->repo : "",
                        p->revision ? p->revision : "");
    if (mkdir(p->dest_dir, 0755) != 0 && errno != EEXIST)
        return q35_fail(err, Q35_ERR_IO, "%s: cannot create directory: %s", p->dest_dir, strerror(errno));
    curl_global_init(CURL_GLOBAL_DEFAULT);
    CURL *c = curl_easy_init();
    if (!c) return q35_fail(err, Q35_ERR_NOMEM, "cannot start libcurl");
    char *url = malloc(strlen(p->endpoint) + strlen(p->repo) + strlen(p->revision) + 64);
    sprintf(url, "%s/api/models/%s/tree/%s?recursive=true", p->endpoint, p->repo, p->revision);
    membuf list = {0};
    curl_common(c, url);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, mem_write);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &list);
    CURLcode rc = curl_easy_perform(c);
    q35_status st = Q35_OK;
    json_t *root = NULL;
    if (rc != CURLE_OK) {
        st = q35_fail(err, Q35_ERR_IO, "%s: %s", url, curl_easy_strerror(rc));
    } else {
        json_error_t je;
        root = json_loadb(list.data ? list.data : "", list.len, 0, &je);
        if (!json_is_array(root)) st = q35_fail(err, Q35_ERR_FORMAT, "%s: not a JSON file list", url);
    }
    size_t i;
    json_t *f;
    int n_files = 0;
    if (!st) json_array_foreach(root, i, f) {
        const char *path = json_string_value(json_object_get(f, "path"));
        const char *type = json_string_value(json_object_get(f, "type"));
        if (!path || (type && strcmp(type, "file")) || !wanted(path)) continue;
        json_t *lfs = json_object_get(f, "lfs");
        json_t *jsz = lfs ? json_object_get(lfs, "size") : json_object_get(f, "size");
        const char *sha = lfs ? json_string_value(json_object_get(lfs, "oid")) : NULL;
        const char *oid = json_string_value(json_object_get(f, "oid"));
        if (!json_is_integer(jsz) || json_integer_value(jsz) < 0 || (lfs && (!sha || strlen(sha) != 64)) || (!lfs && !oid)) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s: entry '%s' has no size or hash", url, path);
            break;
        }
        st = fetch_file(c, p, path, (uint64_t)json_integer_value(jsz), sha, oid, err);
        if (st) break;
        n_files++;
    }
    if (!st && !n_files) st = q35_fail(err, Q35_ERR_FORMAT, "%s: no model files in %s at %s", url, p->repo, p->revision);
    json_decref(root);
    free(list.data);
    free(url);
    curl_easy_cleanup(c);
    return st;
}
