/* tokenizer_load.c: loading the byte-level BPE tokenizer (q35_tokenizer_load).
 *
 * tokenizer.json, or vocab.json + merges.txt + tokenizer_config.json,
 * becomes an id -> bytes table (vocab strings are GPT-2 byte-level text and
 * are mapped back to raw bytes once, here), a bytes -> id hash, a
 * (left id, right id) -> (rank, merged id) hash, the added tokens, and the
 * pre-tokenizer regex compiled by PCRE2 (UTF + UCP, JIT when available).
 * The tables are tokenizer_impl.h; encoding and decoding are tokenizer.c. */
#include "text/tokenizer_impl.h"
#include "base/utf8.h"
#include "base/util.h"

#include <jansson.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

/* The pre-tokenizer patterns, as they appear in the models' tokenizer.json.
 * Only used when the files do not carry one (vocab.json + merges.txt). */
static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Among the added tokens only Qwen3.5's set has the audio ones. */
#define QWEN35_MARKER_TOKEN "<|audio_start|>"


/* ---- GPT-2 byte table ---- */

/* Byte-level text maps printable bytes to themselves and the other 68 bytes
 * to U+0100.. in byte order; byte_of_char inverts it (-1: not in the table). */
static int16_t byte_of_char[324];

static void init_byte_table(void) {
    int n = 0;
    for (int cp = 0; cp < 324; cp++) byte_of_char[cp] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        byte_of_char[printable ? b : 256 + n++] = (int16_t)b;
    }
}

/* Byte-level string -> raw bytes, as HF's ByteLevel decoder does: when any
 * character is outside the table the token's own UTF-8 is used. out must
 * hold n bytes. */
static size_t bytelevel_decode(const char *s, size_t n, char *out) {
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += q35_utf8_next(s + i, n - i, &cp);
        if (cp >= 324 || byte_of_char[cp] < 0) {
            memcpy(out, s, n);
            return n;
        }
        out[k++] = (char)byte_of_char[cp];
    }
    return k;
}

static uint32_t table_size(size_t n) {
    uint32_t s = 1024;
    while (s < 2 * n) s *= 2;
    return s;
}

/* ---- building the tables ---- */

typedef struct loader {
    q35_tokenizer *t;
    const char *file;  /* for messages */
    q35_error *err;
} loader;

static bool arena_add(q35_tokenizer *t, const char *s, size_t n, uint32_t *off) {
    if (t->arena_len + n > t->arena_cap) {
        size_t cap = t->arena_cap ? t->arena_cap * 2 : 1 << 20;
        while (cap < t->arena_len + n) cap *= 2;
        char *p = realloc(t->arena, cap);
        if (!p) return false;
        t->arena = p;
        t->arena_cap = cap;
    }
    memcpy(t->arena + t->arena_len, s, n);
    *off = (uint32_t)t->arena_len;
    t->arena_len += n;
    return true;
}

static q35_status ensure_ids(loader *L, int32_t n) {
    q35_tokenizer *t = L->t;
    if (n <= t->n_ids) return Q35_OK;
    if (n > t->cap_ids) { /* ids mostly arrive in order: grow geometrically */
        int32_t cap = t->cap_ids ? t->cap_ids : 1024;
        while (cap < n) cap *= 2;
        uint32_t *off = realloc(t->off, sizeof *off * (size_t)cap);
        if (off) t->off = off;
        uint32_t *len = realloc(t->len, sizeof *len * (size_t)cap);
        if (len) t->len = len;
        uint8_t *fl = realloc(t->flags, (size_t)cap);
        if (fl) t->flags = fl;
        if (!off || !len || !fl) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
        t->cap_ids = cap;
    }
    for (int32_t i = t->n_ids; i < n; i++) { t->off[i] = 0; t->len[i] = 0; t->flags[i] = 0; }
    t->n_ids = n;
    return Q35_OK;
}

/* Records id -> bytes of a byte-level vocab string. */
static q35_status set_token(loader *L, int32_t id, const char *text, size_t n, bool bytelevel) {
    if (id < 0 || id >= (1 << 24))
        return q35_fail(L->err, Q35_ERR_FORMAT, "%s: token id %d out of range", L->file, (int)id);
    q35_status st = ensure_ids(L, id + 1);
    if (st) return st;
    q35_tokenizer *t = L->t;
    if (t->flags[id] & TOK_PRESENT)
        return q35_fail(L->err, Q35_ERR_FORMAT, "%s: id %d is given to two tokens", L->file, (int)id);
    char stackbuf[256];
    char *tmp = n <= sizeof stackbuf ? stackbuf : malloc(n);
    if (!tmp) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
    size_t k = bytelevel ? bytelevel_decode(text, n, tmp) : (memcpy(tmp, text, n), n);
    bool ok = arena_add(t, tmp, k, &t->off[id]);
    if (tmp != stackbuf) free(tmp);
    if (!ok) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
    t->len[id] = (uint32_t)k;
    t->flags[id] |= TOK_PRESENT;
    if (k > t->max_piece) t->max_piece = k;
    return Q35_OK;
}

static q35_status vocab_from_json(loader *L, json_t *vocab) {
    if (!json_is_object(vocab)) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: the vocabulary is not a JSON object", L->file);
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val))
            return q35_fail(L->err, Q35_ERR_FORMAT, "%s: vocab entry \"%.40s\" has no integer id", L->file, key);
        q35_status st = set_token(L, (int32_t)json_integer_value(val), key, strlen(key), true);
        if (st) return st;
    }
    return Q35_OK;
}

static q35_status build_vocab_hash(loader *L) {
    q35_tokenizer *t = L->t;
    uint32_t size = table_size((size_t)t->n_ids);
    t->vocab_slot = malloc(sizeof *t->vocab_slot * size);
    if (!t->vocab_slot) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
    memset(t->vocab_slot, 0xff, sizeof *t->vocab_slot * size);
    t->vocab_mask = size - 1;
    for (int b = 0; b < 256; b++) t->byte_id[b] = -1;
    for (int32_t id = 0; id < t->n_ids; id++) {
        if (!(t->flags[id] & TOK_PRESENT)) continue;
        const char *s = t->arena + t->off[id];
        if (vocab_find(t, s, t->len[id]) >= 0) continue; /* two strings with the same bytes: the first id wins */
        uint32_t i = (uint32_t)hash_bytes(s, t->len[id]) & t->vocab_mask;
        while (t->vocab_slot[i] >= 0) i = (i + 1) & t->vocab_mask;
        t->vocab_slot[i] = id;
        if (t->len[id] == 1 && t->byte_id[(uint8_t)s[0]] < 0) t->byte_id[(uint8_t)s[0]] = id;
    }
    return Q35_OK;
}

static q35_status merges_alloc(loader *L, size_t n) {
    q35_tokenizer *t = L->t;
    uint32_t size = table_size(n);
    t->merges = malloc(sizeof *t->merges * size);
    if (!t->merges) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
    for (uint32_t i = 0; i < size; i++) t->merges[i].key = UINT64_MAX;
    t->merge_mask = size - 1;
    return Q35_OK;
}

/* One merge "a b" (byte-level text), rank = its position. Like HF, a pair
 * seen twice keeps its first rank. */
static q35_status add_merge(loader *L, const char *a, size_t na, const char *b, size_t nb, size_t line) {
    q35_tokenizer *t = L->t;
    char buf[512];
    if (na + nb > sizeof buf) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: merge %zu is too long", L->file, line);
    size_t ka = bytelevel_decode(a, na, buf);
    size_t kb = bytelevel_decode(b, nb, buf + ka);
    int32_t ia = vocab_find(t, buf, ka), ib = vocab_find(t, buf + ka, kb), in = vocab_find(t, buf, ka + kb);
    if (ia < 0 || ib < 0 || in < 0)
        return q35_fail(L->err, Q35_ERR_FORMAT, "%s: merge %zu (\"%.*s %.*s\") names a token missing from the vocabulary",
                        L->file, line, (int)(na > 40 ? 40 : na), a, (int)(nb > 40 ? 40 : nb), b);
    uint64_t key = (uint64_t)(uint32_t)ia << 32 | (uint32_t)ib;
    uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;
    while (t->merges[i].key != UINT64_MAX) {
        if (t->merges[i].key == key) return Q35_OK;
        i = (i + 1) & t->merge_mask;
    }
    t->merges[i] = (merge_entry){key, (uint32_t)line, in};
    t->n_merges++;
    return Q35_OK;
}

static q35_status merges_from_json(loader *L, json_t *merges) {
    if (!json_is_array(merges)) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: model.merges is not an array", L->file);
    q35_status st = merges_alloc(L, json_array_size(merges));
    if (st) return st;
    size_t i;
    json_t *m;
    json_array_foreach(merges, i, m) {
        const char *a, *b;
        size_t na, nb;
        if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
            json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0)); na = json_string_length(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1)); nb = json_string_length(json_array_get(m, 1));
        } else if (json_is_string(m)) { /* older files: "a b" */
            a = json_string_value(m);
            const char *sp = strchr(a, ' ');
            if (!sp) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: merge %zu has no space", L->file, i);
            na = (size_t)(sp - a); b = sp + 1; nb = strlen(b);
        } else return q35_fail(L->err, Q35_ERR_FORMAT, "%s: merge %zu is neither a pair nor a string", L->file, i);
        if ((st = add_merge(L, a, na, b, nb, i))) return st;
    }
    return Q35_OK;
}

static q35_status merges_from_txt(loader *L, const char *text, size_t n) {
    size_t lines = 0;
    for (size_t i = 0; i < n; i++) lines += text[i] == '\n';
    q35_status st = merges_alloc(L, lines + 1);
    if (st) return st;
    size_t rank = 0, lineno = 0;
    for (size_t i = 0; i < n;) {
        const char *line = text + i;
        const char *nl = memchr(line, '\n', n - i);
        size_t len = nl ? (size_t)(nl - line) : n - i;
        i += len + (nl != NULL);
        lineno++;
        if (len && line[len - 1] == '\r') len--;
        if (len == 0 || (lineno == 1 && len >= 8 && !memcmp(line, "#version", 8))) continue;
        const char *sp = memchr(line, ' ', len);
        if (!sp || memchr(sp + 1, ' ', len - (size_t)(sp + 1 - line)))
            return q35_fail(L->err, Q35_ERR_FORMAT, "%s: line %zu is not two symbols separated by one space", L->file, lineno);
        if ((st = add_merge(L, line, (size_t)(sp - line), sp + 1, len - (size_t)(sp + 1 - line), rank++))) return st;
    }
    return Q35_OK;
}

static q35_status add_added(loader *L, int32_t id, json_t *entry) {
    json_t *content = json_object_get(entry, "content");
    if (!json_is_string(content) || json_string_length(content) == 0)
        return q35_fail(L->err, Q35_ERR_FORMAT, "%s: added token %d has no content", L->file, (int)id);
    static const char *const unsupported[] = {"lstrip", "rstrip", "single_word", "normalized"};
    for (int i = 0; i < 4; i++)
        if (json_is_true(json_object_get(entry, unsupported[i])))
            return q35_fail(L->err, Q35_ERR_UNSUPPORTED, "%s: added token \"%s\" sets %s, which this tokenizer does not implement",
                            L->file, json_string_value(content), unsupported[i]);
    q35_tokenizer *t = L->t;
    const char *s = json_string_value(content);
    size_t n = json_string_length(content);
    q35_status st = ensure_ids(L, id + 1);
    if (st) return st;
    if (id < 0) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: added token with negative id", L->file);
    if (t->flags[id] & TOK_ADDED) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: id %d is added twice", L->file, (int)id);
    /* An added token may also be in the model's vocab (same id); the decoder
     * then gives the same bytes either way. */
    if (!(t->flags[id] & TOK_PRESENT) && (st = set_token(L, id, s, n, true))) return st;
    added_token *a = realloc(t->added, sizeof *a * (size_t)(t->n_added + 1));
    if (!a) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
    t->added = a;
    uint32_t off;
    if (!arena_add(t, s, n, &off)) return q35_fail(L->err, Q35_ERR_NOMEM, "%s: out of memory", L->file);
    a[t->n_added++] = (added_token){.id = id, .len = (uint32_t)n, .text = (const char *)(uintptr_t)off,
                                    .special = json_is_true(json_object_get(entry, "special"))};
    t->flags[id] |= TOK_ADDED | (a[t->n_added - 1].special ? TOK_SPECIAL : 0);
    return Q35_OK;
}

static q35_status compile_regex(loader *L, const char *pattern) {
    int code;
    PCRE2_SIZE at;
    L->t->re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &at, NULL);
    if (!L->t->re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return q35_fail(L->err, Q35_ERR_UNSUPPORTED, "%s: pre-tokenizer regex does not compile at offset %zu: %s",
                        L->file, (size_t)at, (const char *)msg);
    }
    pcre2_jit_compile(L->t->re, PCRE2_JIT_COMPLETE); /* without JIT the interpreter still gives the same matches */
    return Q35_OK;
}

static bool json_str_is(json_t *obj, const char *key, const char *want) {
    json_t *v = json_object_get(obj, key);
    return json_is_string(v) && !strcmp(json_string_value(v), want);
}

static q35_status check_normalizer(loader *L, json_t *norm) {
    if (!norm || json_is_null(norm) || json_str_is(norm, "type", "NFC")) return Q35_OK;
    if (json_str_is(norm, "type", "Sequence")) {
        json_t *list = json_object_get(norm, "normalizers");
        if (json_is_array(list) && json_array_size(list) == 1 && json_str_is(json_array_get(list, 0), "type", "NFC"))
            return Q35_OK;
    }
    return q35_fail(L->err, Q35_ERR_UNSUPPORTED, "%s: only an NFC normalizer is supported", L->file);
}

/* The Qwen shape: Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)]. */
static q35_status pretokenizer_pattern(loader *L, json_t *pre, const char **pattern) {
    json_t *list = json_object_get(pre, "pretokenizers");
    json_t *split = json_array_get(list, 0), *bl = json_array_get(list, 1);
    if (!json_str_is(pre, "type", "Sequence") || json_array_size(list) != 2 || !json_str_is(split, "type", "Split") ||
        !json_str_is(bl, "type", "ByteLevel") || !json_str_is(split, "behavior", "Isolated") ||
        json_is_true(json_object_get(split, "invert")) || json_is_true(json_object_get(bl, "use_regex")) ||
        json_is_true(json_object_get(bl, "add_prefix_space")))
        return q35_fail(L->err, Q35_ERR_UNSUPPORTED,
                        "%s: pre_tokenizer must be Sequence[Split(Regex, Isolated), ByteLevel(use_regex=false)]", L->file);
    json_t *re = json_object_get(json_object_get(split, "pattern"), "Regex");
    if (!json_is_string(re))
        return q35_fail(L->err, Q35_ERR_UNSUPPORTED, "%s: the Split pre-tokenizer has no Regex pattern", L->file);
    *pattern = json_string_value(re);
    return Q35_OK;
}

static q35_status load_json(loader *L, const char *path, json_t **out) {
    char *text = NULL;
    size_t n = 0;
    q35_status st = q35_read_file(path, &text, &n, L->err);
    if (st) return st;
    json_error_t je;
    *out = json_loadb(text, n, JSON_ALLOW_NUL, &je);
    free(text);
    if (!*out) return q35_fail(L->err, Q35_ERR_FORMAT, "%s: invalid JSON at line %d: %s", path, je.line, je.text);
    return Q35_OK;
}

static q35_status load_tokenizer_json(loader *L, const char *path) {
    json_t *root;
    L->file = path;
    q35_status st = load_json(L, path, &root);
    if (st) return st;
    json_t *model = json_object_get(root, "model");
    const char *pattern = NULL;
    if (!json_is_object(model)) st = q35_fail(L->err, Q35_ERR_FORMAT, "%s: no \"model\" object", path);
    else if (json_object_get(model, "type") && !json_str_is(model, "type", "BPE"))
        st = q35_fail(L->err, Q35_ERR_UNSUPPORTED, "%s: model type is not BPE", path);
    else if (json_is_true(json_object_get(model, "byte_fallback")) ||
             json_string_length(json_object_get(model, "continuing_subword_prefix")) ||
             json_string_length(json_object_get(model, "end_of_word_suffix")))
        st = q35_fail(L->err, Q35_ERR_UNSUPPORTED, "%s: BPE options byte_fallback/subword prefixes are not supported", path);
    if (!st) st = check_normalizer(L, json_object_get(root, "normalizer"));
    if (!st) st = pretokenizer_pattern(L, json_object_get(root, "pre_tokenizer"), &pattern);
    if (!st) st = vocab_from_json(L, json_object_get(model, "vocab"));
    if (!st) st = build_vocab_hash(L);
    if (!st) st = merges_from_json(L, json_object_get(model, "merges"));
    if (!st) {
        json_t *added = json_object_get(root, "added_tokens"), *e;
        size_t i;
        json_array_foreach(added, i, e) {
            json_t *id = json_object_get(e, "id");
            if (!json_is_integer(id)) { st = q35_fail(L->err, Q35_ERR_FORMAT, "%s: added token %zu has no id", path, i); break; }
            if ((st = add_added(L, (int32_t)json_integer_value(id), e))) break;
        }
    }
    L->t->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    if (!st) st = compile_regex(L, pattern);
    json_decref(root);
    return st;
}

static q35_status load_vocab_merges(loader *L, const char *dir) {
    char *vocab_path = q35_path_join(dir, "vocab.json"), *merges_path = q35_path_join(dir, "merges.txt");
    char *config_path = q35_path_join(dir, "tokenizer_config.json");
    json_t *vocab = NULL, *config = NULL;
    char *merges = NULL;
    size_t merges_len = 0;
    q35_status st = Q35_OK;
    if (!vocab_path || !merges_path || !config_path) { st = q35_fail(L->err, Q35_ERR_NOMEM, "out of memory"); goto done; }
    L->file = vocab_path;
    if ((st = load_json(L, vocab_path, &vocab)) || (st = vocab_from_json(L, vocab)) || (st = build_vocab_hash(L))) goto done;
    L->file = merges_path;
    if ((st = q35_read_file(merges_path, &merges, &merges_len, L->err)) || (st = merges_from_txt(L, merges, merges_len))) goto done;
    L->file = config_path;
    if ((st = load_json(L, config_path, &config))) goto done;
    json_t *dec = json_object_get(config, "added_tokens_decoder"), *e;
    const char *key;
    if (dec && !json_is_object(dec)) { st = q35_fail(L->err, Q35_ERR_FORMAT, "%s: added_tokens_decoder is not an object", config_path); goto done; }
    json_object_foreach(dec, key, e) {
        char *end;
        long id = strtol(key, &end, 10);
        if (*end || end == key || id < 0 || id >= (1 << 24)) { st = q35_fail(L->err, Q35_ERR_FORMAT, "%s: bad added token id \"%s\"", config_path, key); goto done; }
        if ((st = add_added(L, (int32_t)id, e))) goto done;
    }
    /* These files carry no regex. A Qwen3.5 vocabulary (recognised by its
     * added tokens) gets the \p{M} pattern its tokenizer.json names, others
     * Qwen2's. (transformers' Qwen2Tokenizer would use Qwen2's for both;
     * tokenizer.json is what the model was trained with.) */
    bool qwen35 = false;
    for (int i = 0; i < L->t->n_added; i++)
        qwen35 |= L->t->added[i].len == strlen(QWEN35_MARKER_TOKEN) &&
                  !memcmp(L->t->arena + (uintptr_t)L->t->added[i].text, QWEN35_MARKER_TOKEN, L->t->added[i].len);
    st = compile_regex(L, qwen35 ? QWEN35_PATTERN : QWEN2_PATTERN);
done:
    json_decref(vocab);
    json_decref(config);
    free(merges);
    free(vocab_path);
    free(merges_path);
    free(config_path);
    return st;
}

q35_status q35_tokenizer_load(const char *dir, q35_tokenizer **out, q35_error *err) {
    *out = NULL;
    if (!dir) return q35_fail(err, Q35_ERR_ARG, "tokenizer: no directory given");
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, init_byte_table);
    q35_tokenizer *t = calloc(1, sizeof *t);
    if (!t) return q35_fail(err, Q35_ERR_NOMEM, "tokenizer: out of memory");
    loader L = {.t = t, .file = dir, .err = err};
    char *tj = q35_path_join(dir, "tokenizer.json");
    q35_status st;
    if (!tj) st = q35_fail(err, Q35_ERR_NOMEM, "tokenizer: out of memory");
    else if (q35_file_exists(tj)) st = load_tokenizer_json(&L, tj);
    else {
        char *vj = q35_path_join(dir, "vocab.json");
        bool have = vj && q35_file_exists(vj);
        free(vj);
        st = have ? load_vocab_merges(&L, dir)
                  : q35_fail(err, Q35_ERR_IO, "%s: no tokenizer.json and no vocab.json + merges.txt + tokenizer_config.json", dir);
    }
    free(tj);
    if (!st && t->n_ids == 0) st = q35_fail(err, Q35_ERR_FORMAT, "%s: the vocabulary is empty", dir);
    if (st) { q35_tokenizer_free(t); return st; }
    static atomic_uint_fast64_t next_serial = 1;
    t->serial = atomic_fetch_add(&next_serial, 1);
    /* Arena offsets become pointers once the arena stops moving. */
    for (int i = 0; i < t->n_added; i++) {
        t->added[i].text = t->arena + (uintptr_t)t->added[i].text;
        t->added_first[(uint8_t)t->added[i].text[0]] = 1;
    }
    *out = t;
    return Q35_OK;
}

void q35_tokenizer_free(q35_tokenizer *t) {
    if (!t) return;
    free(t->off); free(t->len); free(t->flags); free(t->arena);
    free(t->vocab_slot);
    free(t->merges);
    free(t->added);
    pcre2_code_free(t->re);
    free(t);
}

int32_t q35_tokenizer_n_ids(const q35_tokenizer *t) { return t->n_ids; }
