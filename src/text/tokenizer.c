/* tokenizer.c: the byte-level BPE tokenizer (q35_tokenizer) and the streaming
 * detokenizer.
 *
 * Load: tokenizer.json, or vocab.json + merges.txt + tokenizer_config.json,
 * becomes an id -> bytes table (vocab strings are GPT-2 byte-level text and
 * are mapped back to raw bytes once, here), a bytes -> id hash, a
 * (left id, right id) -> (rank, merged id) hash, the added tokens, and the
 * pre-tokenizer regex compiled by PCRE2 (UTF + UCP, JIT when available).
 *
 * Encode, in Hugging Face's order: repair invalid UTF-8 -> split out added
 * tokens (leftmost-longest, on the raw text: they are normalized=false) ->
 * NFC each remaining segment (utf8proc) -> split it with the regex (HF Split,
 * behavior Isolated) -> BPE each piece over its bytes with HF's merge loop
 * (lowest rank first, leftmost on ties, stale queue entries skipped the same
 * way) so that even vocabularies whose merges disagree with tiktoken's rank
 * order give HF's ids.
 *
 * Decode: the bytes of each id are pushed through the UTF-8 repairer of
 * text.c, which gives the same text as HF's from_utf8_lossy over the whole
 * sequence while never emitting half a character. */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "base/utf8.h"
#include "base/util.h"

#include <jansson.h>
#include <pcre2.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <utf8proc.h>

/* The pre-tokenizer patterns, as they appear in the models' tokenizer.json.
 * Only used when the files do not carry one (vocab.json + merges.txt). */
static const char QWEN2_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char QWEN35_PATTERN[] =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
/* Among the added tokens only Qwen3.5's set has the audio ones. */
#define QWEN35_MARKER_TOKEN "<|audio_start|>"

enum { TOK_PRESENT = 1, TOK_ADDED = 2, TOK_SPECIAL = 4 };

/* One merge, packed so that a probe touches one cache line. */
typedef struct merge_entry {
    uint64_t key;     /* left id << 32 | right id; UINT64_MAX: empty */
    uint32_t rank;    /* line of merges.txt: lower merges first */
    int32_t new_id;   /* the token the pair becomes */
} merge_entry;

typedef struct added_token {
    int32_t id;
    uint32_t len;
    const char *text;  /* in the arena */
    bool special;
} added_token;

struct q35_tokenizer {
    uint64_t serial;       /* unique per load: names this tokenizer in the word caches */
    int32_t n_ids, cap_ids;
    uint32_t *off, *len;   /* (n_ids) bytes of each id in arena */
    uint8_t *flags;        /* (n_ids) TOK_* */
    char *arena;
    size_t arena_len, arena_cap;
    size_t max_piece;      /* longest token in bytes */

    int32_t *vocab_slot;   /* (vocab_mask+1) open-addressed ids of base tokens, -1 empty */
    uint32_t vocab_mask;

    merge_entry *merges;   /* (merge_mask+1) open-addressed */
    uint32_t merge_mask;
    size_t n_merges;

    int32_t byte_id[256];  /* the token of each single byte, -1 if none */
    added_token *added;
    int n_added;
    uint8_t added_first[256]; /* some added token starts with this byte */
    bool ignore_merges;
    pcre2_code *re;
};

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

/* ---- hashing ---- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static int32_t vocab_find(const q35_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slot) return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slot[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->arena + t->off[id], s, n) == 0) return id;
    }
}

static bool merge_find(const q35_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    for (uint32_t i = (uint32_t)hash_u64(key) & t->merge_mask;; i = (i + 1) & t->merge_mask) {
        const merge_entry *m = &t->merges[i];
        if (m->key == UINT64_MAX) return false;
        if (m->key == key) {
            *rank = m->rank;
            *new_id = m->new_id;
            return true;
        }
    }
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

/* ---- encoding ---- */

typedef struct symbol { int32_t id, prev, next; uint32_t len; } symbol;
typedef struct merge_item { uint32_t rank, pos; int32_t new_id; } merge_item;

/* Scratch memory of one q35_tokenize call. */
typedef struct encoder {
    const q35_tokenizer *t;
    int32_t *ids;
    size_t n_ids, cap_ids;
    symbol *sym;
    merge_item *heap;
    size_t cap_sym, cap_heap, n_heap;
    pcre2_match_data *md;
    bool oom;
    int match_error;  /* a PCRE2 error other than "no match" */
} encoder;

static void emit(encoder *e, int32_t id) {
    if (e->n_ids == e->cap_ids) {
        size_t cap = e->cap_ids ? 2 * e->cap_ids : 256;
        int32_t *p = realloc(e->ids, sizeof *p * cap);
        if (!p) { e->oom = true; return; }
        e->ids = p;
        e->cap_ids = cap;
    }
    e->ids[e->n_ids++] = id;
}

static bool item_less(const merge_item *a, const merge_item *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(encoder *e, merge_item it) {
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!item_less(&it, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = it;
}

static merge_item heap_pop(encoder *e) {
    merge_item top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0, n = e->n_heap;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && item_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!item_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (n) e->heap[i] = last;
    return top;
}

static void push_pair(encoder *e, int32_t pos) {
    const symbol *s = e->sym;
    if (pos < 0 || s[pos].next < 0) return;
    uint32_t rank;
    int32_t new_id;
    if (merge_find(e->t, s[pos].id, s[s[pos].next].id, &rank, &new_id))
        heap_push(e, (merge_item){rank, (uint32_t)pos, new_id});
}

/* Words repeat (Zipf), so each thread remembers the ids of short words, as
 * HF's BPE cache does. Entries name their tokenizer by serial, so a freed
 * and reloaded tokenizer never sees stale ids; thread-local, so no locks. */
#define WORD_CACHE_ENTRIES 1024
#define WORD_CACHE_BYTES 22
#define WORD_CACHE_IDS 8
typedef struct word_cache_entry {
    uint64_t serial;
    uint8_t len, n_ids;
    char bytes[WORD_CACHE_BYTES];
    int32_t ids[WORD_CACHE_IDS];
} word_cache_entry;
static _Thread_local word_cache_entry word_cache[WORD_CACHE_ENTRIES];

/* BPE over one pre-token, HF's models/bpe/word.rs merge loop. */
static void bpe_word(encoder *e, const char *w, size_t n) {
    const q35_tokenizer *t = e->t;
    if (n == 0) return;
    if (n == 1 || t->ignore_merges) {
        int32_t id = vocab_find(t, w, n);
        if (id >= 0) { emit(e, id); return; }
    }
    word_cache_entry *ce = NULL;
    if (n <= WORD_CACHE_BYTES) {
        ce = &word_cache[hash_bytes(w, n) & (WORD_CACHE_ENTRIES - 1)];
        if (ce->serial == t->serial && ce->len == n && !memcmp(ce->bytes, w, n)) {
            for (int i = 0; i < ce->n_ids; i++) emit(e, ce->ids[i]);
            return;
        }
    }
    size_t first_out = e->n_ids;
    if (n > e->cap_sym) {
        symbol *s = realloc(e->sym, sizeof *s * n);
        merge_item *h = realloc(e->heap, sizeof *h * 2 * n);
        if (s) e->sym = s;
        if (h) e->heap = h;
        if (!s || !h) { e->oom = true; return; }
        e->cap_sym = n;
    }
    symbol *s = e->sym;
    int32_t ns = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t id = t->byte_id[(uint8_t)w[i]];
        if (id < 0) continue; /* no token for this byte and no unk: HF drops it */
        s[ns] = (symbol){id, ns - 1, -1, 1};
        if (ns > 0) s[ns - 1].next = ns;
        ns++;
    }
    e->n_heap = 0;
    for (int32_t i = 0; i + 1 < ns; i++) push_pair(e, i);
    while (e->n_heap) {
        merge_item top = heap_pop(e);
        symbol *a = &s[top.pos];
        if (a->len == 0 || a->next < 0) continue;
        symbol *b = &s[a->next];
        uint32_t rank;
        int32_t new_id;
        /* A stale entry is one whose pair no longer yields the same token. */
        if (!merge_find(t, a->id, b->id, &rank, &new_id) || new_id != top.new_id) continue;
        a->id = new_id;
        a->len += b->len;
        b->len = 0;
        a->next = b->next;
        if (b->next >= 0) s[b->next].prev = (int32_t)top.pos;
        if (e->n_heap + 2 > 2 * e->cap_sym) continue; /* cannot happen: each merge adds at most two */
        push_pair(e, a->prev);
        push_pair(e, (int32_t)top.pos);
    }
    for (int32_t i = 0; i < ns && i >= 0; i = s[i].next) emit(e, s[i].id);
    size_t made = e->n_ids - first_out;
    if (ce && !e->oom && made <= WORD_CACHE_IDS) {
        ce->serial = t->serial;
        ce->len = (uint8_t)n;
        ce->n_ids = (uint8_t)made;
        memcpy(ce->bytes, w, n);
        memcpy(ce->ids, e->ids + first_out, sizeof *ce->ids * made);
    }
}

static bool is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((uint8_t)s[i] >= 0x80) return false;
    return true;
}

/* A run of text between added tokens: NFC, regex split, BPE. */
static void encode_segment(encoder *e, const char *s, size_t n) {
    if (n == 0) return;
    utf8proc_uint8_t *nfc = NULL;
    if (!is_ascii(s, n)) {
        utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, &nfc,
                                          UTF8PROC_STABLE | UTF8PROC_COMPOSE);
        if (k < 0) { e->oom = true; return; } /* the input is valid UTF-8, so only memory can fail */
        s = (const char *)nfc;
        n = (size_t)k;
    }
    size_t last = 0, from = 0;
    while (from < n && !e->oom && !e->match_error) {
        int rc = pcre2_match(e->t->re, (PCRE2_SPTR)s, n, from, PCRE2_NO_UTF_CHECK, e->md, NULL);
        if (rc < 0) {
            if (rc != PCRE2_ERROR_NOMATCH) e->match_error = rc;
            break;
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* HF ignores empty matches; step over one character */
            uint32_t cp;
            from = ms + (ms < n ? q35_utf8_next(s + ms, n - ms, &cp) : 1);
            continue;
        }
        if (ms > last) bpe_word(e, s + last, ms - last); /* Isolated keeps the gaps as pieces too */
        bpe_word(e, s + ms, me - ms);
        last = from = me;
    }
    if (last < n) bpe_word(e, s + last, n - last);
    free(nfc);
}

q35_status q35_tokenize(const q35_tokenizer *t, const char *text, size_t len, int parse_special, int32_t **ids,
                        size_t *n_ids, q35_error *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!text && len) return q35_fail(err, Q35_ERR_ARG, "tokenize: NULL text");
    encoder e = {.t = t};
    size_t n = len;
    char *fixed = NULL;
    if (!q35_utf8_valid(text, len)) {
        if (!(fixed = q35_utf8_repair(text, len, &n))) return q35_fail(err, Q35_ERR_NOMEM, "tokenize: out of memory");
        text = fixed;
    }
    e.md = pcre2_match_data_create_from_pattern(t->re, NULL);
    if (!e.md) e.oom = true;
    size_t seg = 0;
    for (size_t i = 0; i < n && !e.oom; i++) {
        if (!t->added_first[(uint8_t)text[i]]) continue;
        const added_token *best = NULL;
        for (int k = 0; k < t->n_added; k++) {
            const added_token *a = &t->added[k];
            if ((a->special && !parse_special) || a->len > n - i || (best && a->len <= best->len)) continue;
            if (!memcmp(text + i, a->text, a->len)) best = a;
        }
        if (!best) continue;
        encode_segment(&e, text + seg, i - seg);
        emit(&e, best->id);
        seg = i + best->len;
        i = seg - 1;
    }
    if (!e.oom) encode_segment(&e, text + seg, n - seg);
    if (e.match_error && !e.oom) {
        PCRE2_UCHAR msg[200];
        pcre2_get_error_message(e.match_error, msg, sizeof msg);
        q35_fail(err, Q35_ERR_UNSUPPORTED, "tokenize: the pre-tokenizer regex failed: %s", (const char *)msg);
    }
    pcre2_match_data_free(e.md);
    free(e.sym);
    free(e.heap);
    free(fixed);
    if (e.oom || e.match_error) {
        free(e.ids);
        return e.oom ? q35_fail(err, Q35_ERR_NOMEM, "tokenize: out of memory") : Q35_ERR_UNSUPPORTED;
    }
    *ids = e.ids;
    *n_ids = e.n_ids;
    return Q35_OK;
}

int32_t q35_token_id(const q35_tokenizer *t, const char *text, size_t len) {
    for (int k = 0; k < t->n_added; k++)
        if (t->added[k].len == len && !memcmp(t->added[k].text, text, len)) return t->added[k].id;
    return vocab_find(t, text, len);
}

const char *q35_token_bytes(const q35_tokenizer *t, int32_t id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !(t->flags[id] & TOK_PRESENT)) {
        if (len) *len = 0;
        return NULL;
    }
    if (len) *len = t->len[id];
    return t->arena + t->off[id];
}

int q35_token_is_special(const q35_tokenizer *t, int32_t id) {
    return id >= 0 && id < t->n_ids && (t->flags[id] & TOK_SPECIAL);
}

/* ---- decoding ---- */

struct q35_detokenizer {
    const q35_tokenizer *tok;
    bool skip_special;
    q35_utf8_state utf8;
    char *out;  /* 3 * (max_piece + 3) + 1: every byte, held ones included, can become a U+FFFD */
};

q35_status q35_detokenizer_new(const q35_tokenizer *tok, int skip_special, q35_detokenizer **out, q35_error *err) {
    q35_detokenizer *d = calloc(1, sizeof *d);
    if (d) d->out = malloc(3 * (tok->max_piece + 3) + Q35_UTF8_PUSH_MAX + 1);
    if (!d || !d->out) {
        if (d) free(d);
        *out = NULL;
        return q35_fail(err, Q35_ERR_NOMEM, "detokenizer: out of memory");
    }
    d->tok = tok;
    d->skip_special = skip_special != 0;
    d->out[0] = 0;
    *out = d;
    return Q35_OK;
}

void q35_detokenizer_free(q35_detokenizer *d) {
    if (!d) return;
    free(d->out);
    free(d);
}

void q35_detokenizer_reset(q35_detokenizer *d) { memset(&d->utf8, 0, sizeof d->utf8); }

const char *q35_detokenizer_feed(q35_detokenizer *d, int32_t id, size_t *len) {
    size_t n = 0, k = 0;
    const char *b = q35_token_bytes(d->tok, id, &n);
    if (b && !(d->skip_special && q35_token_is_special(d->tok, id)))
        for (size_t i = 0; i < n; i++) k += q35_utf8_push(&d->utf8, (uint8_t)b[i], d->out + k);
    d->out[k] = 0;
    if (len) *len = k;
    return d->out;
}

const char *q35_detokenizer_flush(q35_detokenizer *d, size_t *len) {
    size_t k = q35_utf8_flush(&d->utf8, d->out);
    d->out[k] = 0;
    if (len) *len = k;
    return d->out;
}

q35_status q35_detokenize(const q35_tokenizer *tok, const int32_t *ids, size_t n, int skip_special, char **text,
                          size_t *len, q35_error *err) {
    *text = NULL;
    q35_detokenizer *d;
    q35_status st = q35_detokenizer_new(tok, skip_special, &d, err);
    if (st) return st;
    q35_buf b = {0};
    size_t k;
    for (size_t i = 0; i < n; i++) {
        const char *s = q35_detokenizer_feed(d, ids[i], &k);
        q35_buf_append(&b, s, k);
    }
    const char *s = q35_detokenizer_flush(d, &k);
    q35_buf_append(&b, s, k);
    q35_detokenizer_free(d);
    *text = q35_buf_take(&b, len);
    if (!*text) return q35_fail(err, Q35_ERR_NOMEM, "detokenize: out of memory");
    return Q35_OK;
}
