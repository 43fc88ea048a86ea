/* prepare.c: build a weight cache directory from a checkpoint (or from
 * pseudo-random weights with the exact Qwen3.5-9B shapes), and verify one.
 *
 * Flow of q35_prepare: hash the source files (and check them against
 * --expect) -> refuse an output directory that holds a different cache ->
 * plan every tensor's stored dtype with the policy -> stream the tensors
 * into model.q35 (cache.c) -> copy config and tokenizer files -> write
 * model-spec.json -> write manifest.json last. Source tensors are read
 * from the mapping one chunk at a time and their pages dropped afterwards,
 * so memory stays bounded by the chunk size, not by the checkpoint. */
#include "formats/bfp.h"
#include "model/prepare.h"
#include "model/tensors.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Files copied from a source checkpoint into the cache directory. */
static const char *const side_files[] = {
    "config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "vocab.json",
    "merges.txt", "special_tokens_map.json", "chat_template.jinja", "preprocessor_config.json",
};

/* ---- small file helpers ---- */

/* Writes data to path via path.partial, fsync and rename. */
static q35_status write_file_atomic(const char *path, const void *data, size_t n, q35_error *err) {
    char *tmp = malloc(strlen(path) + 16);
    if (!tmp) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    sprintf(tmp, "%s.partial", path);
    q35_status st = Q35_OK;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        st = q35_fail(err, Q35_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    } else {
        const char *p = data;
        size_t left = n;
        while (left && !st) {
            ssize_t w = write(fd, p, left);
            if (w < 0 && errno == EINTR) continue;
            if (w <= 0)
                st = q35_fail(err, Q35_ERR_IO, "%s: cannot write: %s%s", tmp, strerror(w < 0 ? errno : ENOSPC),
                              " (is the disk full?)");
            else { p += w; left -= (size_t)w; }
        }
        if (!st && fsync(fd) != 0) st = q35_fail(err, Q35_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
        if (close(fd) != 0 && !st) st = q35_fail(err, Q35_ERR_IO, "%s: close failed: %s", tmp, strerror(errno));
        if (!st && rename(tmp, path) != 0) st = q35_fail(err, Q35_ERR_IO, "%s: cannot rename: %s", tmp, strerror(errno));
        if (st) unlink(tmp);
    }
    free(tmp);
    return st;
}

static q35_status copy_file(const char *src, const char *dst, q35_error *err) {
    char *buf = NULL;
    size_t n = 0;
    q35_status st = q35_read_file(src, &buf, &n, err);
    if (!st) st = write_file_atomic(dst, buf, n, err);
    free(buf);
    return st;
}

static q35_status mkdir_p(const char *dir, q35_error *err) {
    char *p = strdup(dir);
    if (!p) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    for (char *s = p + 1;; s++) {
        if (*s == '/' || !*s) {
            char c = *s;
            *s = 0;
            if (mkdir(p, 0755) != 0 && errno != EEXIST) {
                q35_status st = q35_fail(err, Q35_ERR_IO, "%s: cannot create directory: %s", p, strerror(errno));
                free(p);
                return st;
            }
            *s = c;
            if (!c) break;
        }
    }
    free(p);
    if (!q35_is_dir(dir)) return q35_fail(err, Q35_ERR_IO, "%s: not a directory", dir);
    return Q35_OK;
}

static char *hex_of(const uint8_t sha[32]) {
    static __thread char hex[65];
    q35_sha256_hex(sha, hex);
    return hex;
}

/* ---- the Qwen3.5-9B config and the model's tensor list ---- */

char *q35_config_json_9b(void) {
    json_t *lt = json_array();
    for (int i = 0; i < 32; i++) json_array_append_new(lt, json_string((i + 1) % 4 ? "linear_attention" : "full_attention"));
    json_t *tc = json_pack(
        "{s:b, s:f, s:s, s:i, s:i, s:s, s:i, s:f, s:i, s:i, s:o, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:i, s:i,"
        " s:i, s:i, s:n, s:f, s:f, s:{s:b, s:[i,i,i], s:f, s:f, s:s}, s:b, s:b, s:i}",
        "attention_bias", 0, "attention_dropout", 0.0, "dtype", "bfloat16", "eos_token_id", 248044,
        "full_attention_interval", 4, "hidden_act", "silu", "hidden_size", 4096, "initializer_range", 0.02,
        "intermediate_size", 12288, "head_dim", 256, "layer_types", lt, "linear_conv_kernel_dim", 4,
        "linear_key_head_dim", 128, "linear_num_key_heads", 16, "linear_num_value_heads", 32,
        "linear_value_head_dim", 128, "mamba_ssm_dtype", "float32", "model_type", "qwen3_5_text",
        "max_position_embeddings", 262144, "mtp_num_hidden_layers", 1, "num_attention_heads", 16,
        "num_hidden_layers", 32, "pad_token_id", "partial_rotary_factor", 0.25, "rms_norm_eps", 1e-6,
        "rope_parameters", "mrope_interleaved", 1, "mrope_section", 11, 11, 10, "partial_rotary_factor", 0.25,
        "rope_theta", 10000000.0, "rope_type", "default", "tie_word_embeddings", 0, "attn_output_gate", 1,
        "num_key_value_heads", 4);
    json_object_set_new(tc, "vocab_size", json_integer(248320));
    json_t *root = json_pack("{s:[s], s:s, s:i, s:i, s:i, s:i, s:b, s:o}", "architectures",
                             "Qwen3_5ForConditionalGeneration", "model_type", "qwen3_5", "image_token_id", 248056,
                             "video_token_id", 248057, "vision_start_token_id", 248053, "vision_end_token_id", 248054,
                             "tie_word_embeddings", 0, "text_config", tc);
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS);
    json_decref(root);
    return s;
}

typedef struct {
    q35_cache_item *v;
    int32_t n;
} item_list;

static q35_status add_item(void *ctx, const q35_model_tensor *t, q35_error *err) {
    item_list *l = ctx;
    q35_cache_item *it = &l->v[l->n++];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, "%s", t->name); /* the table's names are short */
    it->src_dtype = it->dtype = t->def->hf_dtype;
    it->ndim = t->ndim;
    memcpy(it->shape, t->shape, sizeof t->shape);
    return Q35_OK;
}

q35_status q35_model_tensors(const char *config_json, q35_cache_item **items, int32_t *n_out, q35_error *err) {
    q35_config c;
    q35_status st = q35_config_parse(config_json, strlen(config_json), "config", &c, err);
    if (st) return st;
    item_list l = {calloc((size_t)(c.n_layer + 1) * (size_t)q35_n_tensor_defs, sizeof *l.v), 0};
    if (!l.v) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    unsigned which = Q35_TENSORS_TEXT | (c.mtp_num_hidden_layers > 0 ? Q35_TENSORS_MTP : 0);
    q35_model_tensors_each(&c, which, NULL, add_item, &l, err);
    *items = l.v;
    *n_out = l.n;
    return Q35_OK;
}

/* ---- tensor sources ---- */

typedef struct {
    const q35_checkpoint *ck;
} ck_source;

static q35_status fill_from_checkpoint(void *ctx, const q35_cache_item *it, int32_t i, int64_t r0, int64_t n, void *buf,
                                       q35_error *err) {
    const ck_source *s = ctx;
    const q35_st_entry *e = q35_checkpoint_find(s->ck, it->name);
    if (!e) return q35_fail(err, Q35_ERR_FORMAT, "%s: tensor '%s' disappeared", s->ck->dir, it->name);
    size_t row = it->ndim == 1 ? e->tensor.nbytes : e->tensor.nbytes / (size_t)it->shape[0];
    const char *src = (const char *)e->tensor.data + (size_t)r0 * row;
    memcpy(buf, src, (size_t)n * row);
    /* drop the source pages: RSS stays at one chunk, not the checkpoint */
    long pg = sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)src + (uintptr_t)pg - 1) & ~(uintptr_t)(pg - 1);
    uintptr_t b = ((uintptr_t)src + (size_t)n * row) & ~(uintptr_t)(pg - 1);
    if (b > a) madvise((void *)a, b - a, MADV_DONTNEED);
    return Q35_OK;
}

/* Deterministic pseudo-random weights: each row's values depend only on the
 * tensor name and row index, so any chunking gives the same bytes. */
static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t name_hash(const char *s) {
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

/* A roughly normal N(0, 1) draw: the sum of four uniform 16-bit values (Irwin-Hall), rescaled. */
static float approx_normal(uint64_t r) {
    float s = (float)(r & 0xffff) + (float)((r >> 16) & 0xffff) + (float)((r >> 32) & 0xffff) + (float)(r >> 48);
    return (s - 2.0f * 65535.0f) * (1.0f / (65535.0f * 0.57735f));
}

static float synthetic_value(const char *name, uint64_t r) {
    if (strstr(name, "A_log")) return logf(1.0f + 15.0f * (float)(r >> 40) / (float)(1ull << 24)); /* log U(1, 16) */
    if (strstr(name, "dt_bias")) return 1.0f + 0.1f * approx_normal(r);
    if (strstr(name, "linear_attn.norm.weight")) return 1.0f + 0.02f * approx_normal(r); /* a plain multiplier */
    if (strstr(name, "norm")) return 0.02f * approx_normal(r);                        /* applied as 1 + w */
    if (strstr(name, "conv1d")) return 0.2f * approx_normal(r);
    return 0.02f * approx_normal(r);
}

/* Block-format tensors are generated as codes directly (the float path
 * would spend minutes encoding 9 billion values): each block gets an
 * exponent near that of N(0, 0.02)'s block maximum and independent codes
 * whose magnitudes follow a half-normal of the same scale, so decoded
 * weights have the intended distribution. Codes are i.i.d., so filling
 * the panel sections byte by byte is as good as placing them one by one. */
static struct {
    uint8_t mag4[256], mag8[256]; /* uniform byte -> magnitude: inverse CDF of |N(0, scale)|, clamped */
} code_tables;
static pthread_once_t code_tables_once = PTHREAD_ONCE_INIT;

static void make_code_table(uint8_t *t, double scale, int mag_max) {
    for (int u = 0; u < 256; u++) {
        double p = (u + 0.5) / 256.0, lo = 0, hi = 10;
        for (int k = 0; k < 60; k++) { /* solve erf(x / sqrt 2) = p */
            double mid = 0.5 * (lo + hi);
            if (erf(mid / sqrt(2.0)) < p) lo = mid; else hi = mid;
        }
        long m = lround(lo * scale);
        t[u] = (uint8_t)(m > mag_max ? mag_max : m);
    }
}

#define SYNTH_EXP 122 /* 2^-5: the exponent of a typical block maximum of N(0, 0.02) */

static void make_code_tables(void) { /* one step is 2^(E-129) (bfp4) or 2^(E-133) (bfp8) */
    make_code_table(code_tables.mag4, 0.02 * 128.0, 7);
    make_code_table(code_tables.mag8, 0.02 * 2048.0, 127);
}

static void fill_bfp_codes(const q35_cache_item *it, int64_t r0, int64_t n, uint8_t *buf) {
    const int E = SYNTH_EXP;
    pthread_once(&code_tables_once, make_code_tables);
    int bfp4 = it->src_dtype == Q35_DT_BFP4;
    int64_t n_in = it->shape[1], n_blk = n_in / 16;
    const size_t unit = q35_bfp_unit_bytes(it->src_dtype), group = q35_bfp_group_bytes(it->src_dtype, n_in);
    uint64_t h = name_hash(it->name);
    for (int64_t g = 0; g < (n + Q35_BFP_GROUP_ROWS - 1) / Q35_BFP_GROUP_ROWS; g++) { /* r0: whole groups */
        uint64_t s = h ^ ((uint64_t)(r0 / Q35_BFP_GROUP_ROWS + g) * 0x2545f4914f6cdd1dull);
        for (int64_t b = 0; b < n_blk; b++) {
            uint8_t *ex = buf + (size_t)g * group + (size_t)b * unit, *c = ex + 64;
            for (int k = 0; k < 64; k += 8) {
                uint64_t r = splitmix(&s);
                for (int j = 0; j < 8; j++, r >>= 8) ex[k + j] = (uint8_t)(E + ((r & 0xff) < 40) - ((r & 0xff) > 235));
            }
            for (size_t k = 0; k < unit - 64; k += 2) { /* 32 random bits give two bytes of codes */
                uint64_t r = splitmix(&s);
                for (int j = 0; j < 2; j++, r >>= 32) {
                    uint8_t v;
                    if (bfp4) {
                        uint8_t lo = code_tables.mag4[r & 0xff], hi = code_tables.mag4[(r >> 8) & 0xff];
                        lo = lo ? (uint8_t)(lo | ((r >> 16) & 1) << 3) : 0;
                        hi = hi ? (uint8_t)(hi | ((r >> 17) & 1) << 3) : 0;
                        v = (uint8_t)(q35_bfp4_stored(lo) | q35_bfp4_stored(hi) << 4);
                    } else {
                        uint8_t m = code_tables.mag8[r & 0xff];
                        v = m ? (uint8_t)(m | ((r >> 16) & 1) << 7) : 0;
                    }
                    c[k + (size_t)j] = v;
                }
            }
        }
    }
}

static q35_status fill_synthetic(void *ctx, const q35_cache_item *it, int32_t i, int64_t r0, int64_t n, void *buf,
                                 q35_error *err) {
    if (q35_dtype_is_block(it->src_dtype)) {
        fill_bfp_codes(it, r0, n, buf);
        return Q35_OK;
    }
    int64_t row = 1;
    for (int d = 1; d < it->ndim; d++) row *= it->shape[d];
    if (it->ndim == 1) row = it->shape[0];
    float *f = malloc((size_t)row * sizeof *f);
    if (!f) return q35_fail(err, Q35_ERR_NOMEM, "tensor '%s': out of memory", it->name);
    /* the bulk, matrices of N(0, 0.02), skips synthetic_value's name tests (the same draws, faster) */
    int plain = it->src_dtype != Q35_DT_F32 && !strstr(it->name, "norm") && !strstr(it->name, "A_log") &&
                !strstr(it->name, "dt_bias") && !strstr(it->name, "conv1d");
    size_t row_bytes = q35_dtype_row_bytes(it->src_dtype, row);
    uint64_t h = name_hash(it->name);
    for (int64_t r = 0; r < n; r++) {
        uint64_t s = h ^ ((uint64_t)(r0 + r) * 0x2545f4914f6cdd1dull);
        for (int64_t k = 0; k < row; k++)
            f[k] = plain ? 0.02f * approx_normal(splitmix(&s)) : synthetic_value(it->name, splitmix(&s));
        q35_dtype_encode(it->src_dtype, (uint8_t *)buf + (size_t)r * row_bytes, f, 1, row);
    }
    free(f);
    return Q35_OK;
}

/* --set TENSOR=DTYPE: one tensor stored otherwise than the policy says
 * (how the default policy's embedding and lm_head choices were measured). */
static q35_status apply_overrides(const q35_prepare_params *p, q35_cache_item *items, int32_t n, q35_error *err) {
    for (int32_t k = 0; k < p->n_overrides; k++) {
        const char *o = p->overrides[k], *eq = strchr(o, '=');
        if (!eq) return q35_fail(err, Q35_ERR_ARG, "--set '%s': expected TENSOR=DTYPE", o);
        const char *dt = eq + 1;
        q35_cache_item *it = NULL;
        for (int32_t i = 0; i < n && !it; i++)
            if (strlen(items[i].name) == (size_t)(eq - o) && !strncmp(items[i].name, o, (size_t)(eq - o))) it = &items[i];
        if (!it) return q35_fail(err, Q35_ERR_ARG, "--set '%s': no tensor of that name", o);
        if (!strcmp(dt, "bf16")) it->dtype = Q35_DT_BF16;
        else if (!strcmp(dt, "bfp8")) it->dtype = Q35_DT_BFP8;
        else if (!strcmp(dt, "bfp4")) it->dtype = Q35_DT_BFP4;
        else if (!strcmp(dt, "stored")) it->dtype = it->src_dtype;
        else return q35_fail(err, Q35_ERR_ARG, "--set '%s': dtype must be bf16, bfp8, bfp4 or stored", o);
        if (!q35_cache_tensor_bytes(it->dtype, it->ndim, it->shape))
            return q35_fail(err, Q35_ERR_ARG, "--set '%s': tensor '%s' cannot be stored as %s", o, it->name, dt);
    }
    return Q35_OK;
}

/* ---- source hashes and --expect ---- */

typedef struct {
    char name[256];
    uint64_t size;
    uint8_t sha[32];
} src_file;

static q35_status hash_sources(const char *dir, const q35_checkpoint *ck, src_file **out, int32_t *n_out,
                               const q35_prepare_params *p, q35_error *err) {
    size_t cap = (size_t)ck->n_files + sizeof side_files / sizeof side_files[0] + 1;
    src_file *v = calloc(cap, sizeof *v);
    if (!v) return q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    int32_t n = 0;
    const char *extra[] = {"model.safetensors.index.json"};
    for (size_t i = 0; i < cap; i++) {
        const char *name;
        if (i < sizeof side_files / sizeof side_files[0]) name = side_files[i];
        else if (i == sizeof side_files / sizeof side_files[0]) name = extra[0];
        else {
            const char *path = ck->files[i - sizeof side_files / sizeof side_files[0] - 1].path;
            const char *slash = strrchr(path, '/');
            name = slash ? slash + 1 : path;
        }
        char *path = q35_path_join(dir, name);
        struct stat sb;
        if (path && stat(path, &sb) == 0 && S_ISREG(sb.st_mode)) {
            snprintf(v[n].name, sizeof v[n].name, "%s", name);
            v[n].size = (uint64_t)sb.st_size;
            q35_status st = q35_sha256_file(path, v[n].sha, p->progress, p->progress_ctx, err);
            if (st) { free(path); free(v); return st; }
            n++;
        }
        free(path);
    }
    *out = v;
    *n_out = n;
    return Q35_OK;
}

/* --expect FILE: {"files": {"NAME": {"size": N, "sha256": "hex"}}} (a
 * manifest.json of an earlier prepare has this form). Every source file
 * listed there must match; a listed shard that is missing is an error. */
static q35_status check_expect(const char *expect, const char *dir, const src_file *v, int32_t n, q35_error *err) {
    json_error_t je;
    json_t *root = json_load_file(expect, 0, &je);
    if (!root) return q35_fail(err, Q35_ERR_FORMAT, "%s: not valid JSON: %s (line %d)", expect, je.text, je.line);
    json_t *files = json_object_get(root, "files");
    q35_status st = Q35_OK;
    if (!json_is_object(files) || !json_object_size(files))
        st = q35_fail(err, Q35_ERR_FORMAT, "%s: no \"files\" object", expect);
    const char *key;
    json_t *val;
    if (!st) json_object_foreach(files, key, val) {
        const char *want = json_string_value(json_object_get(val, "sha256"));
        json_t *jsz = json_object_get(val, "size");
        if (!want || strlen(want) != 64) { st = q35_fail(err, Q35_ERR_FORMAT, "%s: '%s' has no sha256", expect, key); break; }
        const src_file *f = NULL;
        for (int32_t i = 0; i < n && !f; i++)
            if (!strcmp(v[i].name, key)) f = &v[i];
        if (!f) {
            if (strstr(key, ".safetensors")) { st = q35_fail(err, Q35_ERR_IO, "%s/%s: missing, but %s lists it", dir, key, expect); break; }
            continue; /* an optional side file (tokenizer, ...) */
        }
        char got[65];
        q35_sha256_hex(f->sha, got);
        if (strcasecmp(got, want) != 0) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s/%s: SHA-256 %s, but %s expects %s; refusing this source file", dir,
                          key, got, expect, want);
            break;
        }
        if (json_is_integer(jsz) && (uint64_t)json_integer_value(jsz) != f->size) {
            st = q35_fail(err, Q35_ERR_FORMAT, "%s/%s: %llu bytes, but %s expects %lld", dir, key,
                          (unsigned long long)f->size, expect, (long long)json_integer_value(jsz));
            break;
        }
    }
    json_decref(root);
    return st;
}

/* The identity of a cache: what was read and how it was converted. Two
 * prepares with the same identity give the same model.q35. */
static void cache_identity(const src_file *v, int32_t n, const q35_prepare_params *p, char hex[65]) {
    EVP_MD_CTX *md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), NULL);
    char line[400];
    snprintf(line, sizeof line, "q35cache v%u policy=%s synthetic=%s\n", Q35_CACHE_VERSION, q35_policy_name(p->policy),
             p->synthetic ? p->synthetic : "");
    EVP_DigestUpdate(md, line, strlen(line));
    for (int32_t i = 0; i < p->n_overrides; i++) {
        EVP_DigestUpdate(md, p->overrides[i], strlen(p->overrides[i]));
        EVP_DigestUpdate(md, "\n", 1);
    }
    if (p->calibration_id) {
        snprintf(line, sizeof line, "calibration=%s\n", p->calibration_id);
        EVP_DigestUpdate(md, line, strlen(line));
    }
    for (int32_t i = 0; i < n; i++) {
        snprintf(line, sizeof line, "%s %llu %s\n", v[i].name, (unsigned long long)v[i].size, hex_of(v[i].sha));
        EVP_DigestUpdate(md, line, strlen(line));
    }
    uint8_t sha[32];
    unsigned len = 32;
    EVP_DigestFinal_ex(md, sha, &len);
    EVP_MD_CTX_free(md);
    q35_sha256_hex(sha, hex);
}

/* An output directory may be new, empty of cache files, or hold this very
 * cache (then prepare has nothing to do). Anything else needs --force. */
static q35_status check_out_dir(const char *out, const char *identity, int force, int *up_to_date, q35_error *err) {
    *up_to_date = 0;
    char *man = q35_path_join(out, "manifest.json"), *cache = q35_path_join(out, Q35_CACHE_FILE);
    q35_status st = Q35_OK;
    int has_man = q35_file_exists(man), has_cache = q35_file_exists(cache);
    if (has_man || has_cache) {
        json_t *root = has_man ? json_load_file(man, 0, NULL) : NULL;
        const char *id = json_string_value(json_object_get(root, "cache_id"));
        if (id && !strcmp(id, identity) && has_cache) {
            *up_to_date = 1;
        } else if (!force) {
            st = q35_fail(err, Q35_ERR_ARG, "%s: already holds a different weight cache%s; choose another directory "
                          "or pass --force to replace it", out, has_man ? "" : " (or an incomplete one)");
        } else {
            unlink(man);
            unlink(cache);
        }
        json_decref(root);
    }
    free(man);
    free(cache);
    return st;
}

static json_t *shape_json(const q35_cache_item *it) {
    json_t *a = json_array();
    for (int d = 0; d < it->ndim; d++) json_array_append_new(a, json_integer(it->shape[d]));
    return a;
}

static q35_status write_json(const char *dir, const char *name, json_t *doc, q35_error *err) {
    char *text = json_dumps(doc, JSON_INDENT(2) | JSON_SORT_KEYS);
    char *path = q35_path_join(dir, name);
    q35_status st = text && path ? Q35_OK : q35_fail(err, Q35_ERR_NOMEM, "out of memory");
    if (!st) {
        size_t n = strlen(text);
        text[n] = '\n'; /* json_dumps leaves room for the NUL, which we replace */
        st = write_file_atomic(path, text, n + 1, err);
    }
    free(text);
    free(path);
    return st;
}

q35_status q35_prepare(const q35_prepare_params *p, q35_error *err) {
    if (!p->out_dir || !*p->out_dir) return q35_fail(err, Q35_ERR_ARG, "no output directory given");
    if (!p->checkpoint == !p->synthetic)
        return q35_fail(err, Q35_ERR_ARG, "give either a source checkpoint or --synthetic");
    size_t sl = p->synthetic ? strlen(p->synthetic) : 0;
    int synth_file = sl > 5 && !strcmp(p->synthetic + sl - 5, ".json");
    if (p->synthetic && strcmp(p->synthetic, "qwen3.5-9b") && !synth_file)
        return q35_fail(err, Q35_ERR_ARG, "unknown synthetic model '%s' (qwen3.5-9b, or a config.json path)",
                        p->synthetic);
    if (p->policy >= Q35_POLICY_COUNT) return q35_fail(err, Q35_ERR_ARG, "unknown policy");
    q35_checkpoint ck = {0};
    char *config_text = NULL;
    size_t config_len = 0;
    src_file *sources = NULL;
    int32_t n_sources = 0, n_items = 0;
    q35_cache_item *items = NULL;
    json_t *manifest = NULL;
    char *cache_path = NULL;
    q35_status st = Q35_OK;

    if (p->checkpoint) {
        char *cfg = q35_path_join(p->checkpoint, "config.json");
        q35_config c;
        st = q35_config_load(cfg, &c, err);
        if (!st) st = q35_read_file(cfg, &config_text, &config_len, err);
        free(cfg);
        if (!st) st = q35_checkpoint_open(p->checkpoint, &ck, err);
        if (!st) st = hash_sources(p->checkpoint, &ck, &sources, &n_sources, p, err);
        if (!st && p->expect) st = check_expect(p->expect, p->checkpoint, sources, n_sources, err);
    } else {
        if (p->expect) st = q35_fail(err, Q35_ERR_ARG, "--expect checks source files; --synthetic has none");
        if (synth_file) {
            if (!st) st = q35_read_file(p->synthetic, &config_text, &config_len, err);
        } else {
            config_text = q35_config_json_9b();
            config_len = config_text ? strlen(config_text) : 0;
            if (!st && !config_text) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory");
        }
    }
    char identity[65];
    int up_to_date = 0;
    if (!st) {
        cache_identity(sources, n_sources, p, identity);
        st = mkdir_p(p->out_dir, err);
    }
    if (!st) st = check_out_dir(p->out_dir, identity, p->force, &up_to_date, err);
    if (!st && up_to_date) goto done;

    /* plan */
    if (!st && p->checkpoint) {
        items = calloc((size_t)ck.n_index + 1, sizeof *items);
        if (!items) st = q35_fail(err, Q35_ERR_NOMEM, "out of memory");
        for (int32_t i = 0; !st && i < ck.n_index; i++) {
            const q35_st_entry *e = ck.index[i];
            if (!e->supported) {
                st = q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: tensor '%s' has dtype %s, which a cache cannot hold", e->file,
                              e->name, e->dtype_name);
                break;
            }
            q35_cache_item *it = &items[n_items++];
            if (strlen(e->name) >= sizeof it->name) {
                st = q35_fail(err, Q35_ERR_UNSUPPORTED, "%s: tensor name '%s' is longer than %d bytes", e->file, e->name,
                              Q35_CACHE_NAME_MAX - 1);
                break;
            }
            snprintf(it->name, sizeof it->name, "%s", e->name);
            it->src_dtype = e->tensor.dtype;
            it->ndim = e->tensor.ndim;
            memcpy(it->shape, e->tensor.shape, sizeof it->shape);
            if (it->ndim == 0) { it->ndim = 1; it->shape[0] = 1; } /* a scalar is a 1-vector */
        }
    } else if (!st) {
        st = q35_model_tensors(config_text, &items, &n_items, err);
    }
    for (int32_t i = 0; !st && i < n_items; i++)
        items[i].dtype = q35_policy_dtype(p->policy, items[i].name, items[i].src_dtype, items[i].ndim, items[i].shape);
    if (!st) st = apply_overrides(p, items, n_items, err);
    for (int32_t i = 0; !st && i < n_items; i++) items[i].encode_flags = q35_policy_encode_flags(p->policy, items[i].dtype);
    if (!st && p->calibrate && p->checkpoint) st = p->calibrate(p->calibrate_ctx, items, n_items, err);
    for (int32_t i = 0; !st && p->synthetic && i < n_items; i++) /* whole panels: generate the codes themselves */
        if (items[i].dtype != items[i].src_dtype && q35_dtype_is_block(items[i].dtype) &&
            items[i].shape[0] % q35_dtype_info(items[i].dtype)->panel_rows == 0)
            items[i].src_dtype = items[i].dtype;

    /* the cache file; a config hash ties it to the config.json beside it */
    if (!st) {
        uint8_t cfg_sha[32];
        unsigned len = 32;
        EVP_Digest(config_text, config_len, cfg_sha, &len, EVP_sha256(), NULL);
        cache_path = q35_path_join(p->out_dir, Q35_CACHE_FILE);
        ck_source src = {&ck};
        st = q35_cache_write(cache_path, items, n_items, cfg_sha, p->checkpoint ? fill_from_checkpoint : fill_synthetic,
                             &src, p->progress, p->progress_ctx, err);
    }
    /* side files */
    if (!st && p->checkpoint) {
        for (size_t i = 0; !st && i < sizeof side_files / sizeof side_files[0]; i++) {
            char *a = q35_path_join(p->checkpoint, side_files[i]), *b = q35_path_join(p->out_dir, side_files[i]);
            if (q35_file_exists(a)) st = copy_file(a, b, err);
            free(a);
            free(b);
        }
    } else if (!st) {
        char *b = q35_path_join(p->out_dir, "config.json");
        st = write_file_atomic(b, config_text, config_len, err);
        free(b);
    }
    q35_config cfg;
    if (!st) st = q35_config_parse(config_text, config_len, "config.json", &cfg, err);
    if (!st) {
        int64_t ctx = cfg.max_position_embeddings < 8192 ? cfg.max_position_embeddings : 8192;
        json_t *spec = json_pack("{s:s, s:I, s:{s:b, s:i}, s:i, s:s}", "model", p->synthetic ? "synthetic (pseudo-random weights)" : "Qwen3.5",
                                 "max_context", (json_int_t)ctx, "mtp", "enabled", cfg.mtp_num_hidden_layers > 0,
                                 "draft_tokens", cfg.mtp_num_hidden_layers > 0 ? 1 : 0, "concurrency", 1, "policy",
                                 q35_policy_name(p->policy));
        st = write_json(p->out_dir, "model-spec.json", spec, err);
        json_decref(spec);
    }
    /* manifest last: its presence means the directory is complete */
    if (!st) {
        json_t *files = json_object(), *tensors = json_object();
        for (int32_t i = 0; i < n_sources; i++)
            json_object_set_new(files, sources[i].name, json_pack("{s:I, s:s}", "size", (json_int_t)sources[i].size,
                                                                  "sha256", hex_of(sources[i].sha)));
        uint64_t total = 0;
        int32_t counts[Q35_DT_COUNT] = {0};
        for (int32_t i = 0; i < n_items; i++) {
            const q35_cache_item *it = &items[i];
            json_t *tj = json_pack("{s:s, s:s, s:o, s:I, s:I, s:s}", "dtype", q35_dtype_name(it->dtype), "source_dtype",
                                   q35_dtype_name(it->src_dtype), "shape", shape_json(it), "offset",
                                   (json_int_t)it->offset, "bytes", (json_int_t)it->nbytes, "sha256", hex_of(it->sha256));
            /* only where the bytes were encoded with it: synthetic codes and as-stored tensors are copied */
            if (it->encoded)
                json_object_set_new(tj, "encoder", json_string("gptq"));
            else if ((it->encode_flags & Q35_BFP_EXP_SEARCH) && it->dtype != it->src_dtype)
                json_object_set_new(tj, "encoder", json_string("exponent search"));
            json_object_set_new(tensors, it->name, tj);
            total += it->nbytes;
            counts[it->dtype]++;
        }
        json_t *by_dtype = json_object();
        for (int d = 0; d < Q35_DT_COUNT; d++)
            if (counts[d]) json_object_set_new(by_dtype, q35_dtype_name((q35_dtype)d), json_integer(counts[d]));
        json_error_t je;
        json_t *config = json_loadb(config_text, config_len, 0, &je);
        struct stat sb;
        uint64_t fsize = stat(cache_path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
        manifest = json_pack("{s:s, s:i, s:s, s:s, s:o, s:o, s:o, s:o, s:{s:s, s:I, s:I, s:i}}", "qwen35_version",
                             Q35_VERSION, "format_version", Q35_CACHE_VERSION, "policy", q35_policy_name(p->policy),
                             "cache_id", identity, "files", files, "tensors", tensors, "tensors_by_dtype", by_dtype,
                             "config", config ? config : json_null(), "cache", "file", Q35_CACHE_FILE, "size",
                             (json_int_t)fsize, "tensor_bytes", (json_int_t)total, "tensor_count", n_items);
        if (p->synthetic) json_object_set_new(manifest, "synthetic", json_string(p->synthetic));
        if (p->checkpoint) json_object_set_new(manifest, "source", json_string(p->checkpoint));
        if (p->calibration_id) json_object_set_new(manifest, "calibration", json_string(p->calibration_id));
        if (p->n_overrides) {
            json_t *ov = json_array();
            for (int32_t i = 0; i < p->n_overrides; i++) json_array_append_new(ov, json_string(p->overrides[i]));
            json_object_set_new(manifest, "overrides", ov);
        }
        st = write_json(p->out_dir, "manifest.json", manifest, err);
    }
done:
    json_decref(manifest);
    free(cache_path);
    free(items);
    free(sources);
    free(config_text);
    if (p->checkpoint) q35_checkpoint_close(&ck);
    return st;
}

/* ---- verify ---- */

static void reportf(q35_report_fn report, void *ctx, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void reportf(q35_report_fn report, void *ctx, const char *fmt, ...) {
    if (!report) return;
    char line[1200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    report(ctx, line);
}

q35_status q35_cache_verify(const char *dir, q35_report_fn report, void *rctx, q35_progress_fn progress, void *pctx,
                            q35_error *err) {
    q35_checkpoint cache;
    q35_status st = q35_cache_open(dir, &cache, err);
    if (st) return st;
    const q35_st_file *f = &cache.files[0];
    const uint8_t *base = f->map.data;
    uint32_t n = (uint32_t)f->n_entries;
    char *man_path = q35_path_join(dir, "manifest.json");
    json_error_t je;
    json_t *man = json_load_file(man_path, 0, &je);
    json_t *mt = json_object_get(man, "tensors");
    int32_t bad = 0;
    char first[200] = "";
    if (!man) {
        reportf(report, rctx, "%s: missing or unreadable (%s); checking the cache file alone", man_path, je.text);
    }
    uint64_t total = 0, done = 0;
    for (uint32_t i = 0; i < n; i++) total += f->entries[i].tensor.nbytes;
    for (uint32_t i = 0; i < n; i++) {
        const uint8_t *r = base + Q35_CACHE_HEADER_BYTES + (size_t)i * Q35_CACHE_RECORD_BYTES;
        const char *name = (const char *)r;
        uint64_t off = 0, nb = 0;
        for (int k = 7; k >= 0; k--) { off = off << 8 | r[208 + k]; nb = nb << 8 | r[216 + k]; }
        uint8_t sha[32];
        unsigned len = 32;
        EVP_Digest(base + off, (size_t)nb, sha, &len, EVP_sha256(), NULL);
        done += nb;
        if (progress) progress(pctx, done, total, name);
        char got[65], want[65];
        q35_sha256_hex(sha, got);
        q35_sha256_hex(r + 224, want);
        const char *mwant = mt ? json_string_value(json_object_get(json_object_get(mt, name), "sha256")) : NULL;
        if (memcmp(sha, r + 224, 32) != 0) {
            reportf(report, rctx, "tensor '%s': SHA-256 %s, table says %s (data corrupt)", name, got, want);
        } else if (mt && (!mwant || strcmp(mwant, got))) {
            reportf(report, rctx, "tensor '%s': SHA-256 %s, manifest.json says %s", name, got, mwant ? mwant : "nothing");
        } else {
            continue;
        }
        if (!bad++) snprintf(first, sizeof first, "%s", name);
    }
    if (mt && json_object_size(mt) != n) {
        reportf(report, rctx, "%s: lists %zu tensors, the cache holds %u", man_path, json_object_size(mt), n);
        if (!bad++) snprintf(first, sizeof first, "(tensor count)");
    }
    if (bad) st = q35_fail(err, Q35_ERR_FORMAT, "%s: %d tensor%s failed verification (first: '%s')", f->path, bad,
                           bad == 1 ? "" : "s", first);
    json_decref(man);
    free(man_path);
    q35_checkpoint_close(&cache);
    return st;
}
