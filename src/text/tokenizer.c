/* tokenizer.c: encoding with a loaded byte-level BPE tokenizer
 * (q35_tokenize) and the streaming detokenizer. Loading is tokenizer_load.c.
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
 * base/utf8.h, which gives the same text as HF's from_utf8_lossy over the
 * whole sequence while never emitting half a character. */
#include "text/tokenizer_impl.h"
#include "base/utf8.h"
#include "base/util.h"

#include <stdlib.h>
#include <utf8proc.h>

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

/* Words repeat (Zipf), so each thread memoizes the ids of short words (HF's
 * BPE model keeps such a table too). Entries name their tokenizer by serial, so a freed
 * and reloaded tokenizer never sees stale ids; thread-local, so no locks. */
#define WORD_MEMO_ENTRIES 1024
#define WORD_MEMO_BYTES 22
#define WORD_MEMO_IDS 8
typedef struct word_memo_entry {
    uint64_t serial;
    uint8_t len, n_ids;
    char bytes[WORD_MEMO_BYTES];
    int32_t ids[WORD_MEMO_IDS];
} word_memo_entry;
static _Thread_local word_memo_entry word_memo[WORD_MEMO_ENTRIES];

/* BPE over one pre-token, HF's models/bpe/word.rs merge loop. */
static void bpe_word(encoder *e, const char *w, size_t n) {
    const q35_tokenizer *t = e->t;
    if (n == 0) return;
    if (n == 1 || t->ignore_merges) {
        int32_t id = vocab_find(t, w, n);
        if (id >= 0) { emit(e, id); return; }
    }
    word_memo_entry *me = NULL;
    if (n <= WORD_MEMO_BYTES) {
        me = &word_memo[hash_bytes(w, n) & (WORD_MEMO_ENTRIES - 1)];
        if (me->serial == t->serial && me->len == n && !memcmp(me->bytes, w, n)) {
            for (int i = 0; i < me->n_ids; i++) emit(e, me->ids[i]);
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
    if (me && !e->oom && made <= WORD_MEMO_IDS) {
        me->serial = t->serial;
        me->len = (uint8_t)n;
        me->n_ids = (uint8_t)made;
        memcpy(me->bytes, w, n);
        memcpy(me->ids, e->ids + first_out, sizeof *me->ids * made);
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
