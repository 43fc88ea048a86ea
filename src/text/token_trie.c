/* token_trie.c: a byte trie of a vocabulary's token strings (schema.h),
 * and the mask of the tokens that can continue a schema's document.
 *
 * The nodes are stored in preorder, each with the index just past its
 * subtree, so the mask is one pass over the array: a node's state is its
 * parent's (one copy of the small recogniser state per node, kept per
 * depth) fed the node's byte, and a byte the recogniser refuses skips the
 * whole subtree: every token with that prefix. The cost is the number of
 * live prefixes, at most the trie's size.
 *
 * Inside a string nearly every token is live, so that case has a shortcut:
 * a "plain" token (printable ASCII but '"' and '\', and whole UTF-8
 * characters) is live when its characters fit the string's room, and only
 * the other tokens are walked, in a second trie of them alone. The same
 * for a tool call's raw string parameter, whose plain tokens are printable
 * ASCII but '<', and whole characters (a third trie).
 *
 * Inside a string with a pattern or a format (a DFA, schema_regex.c), the
 * plain tokens are walked in a fourth trie of them alone, by the DFA's
 * state and a character count only, one table lookup per node; the others
 * go through the whole recogniser in the second trie. */
#include "text/schema_impl.h"

#include <stdlib.h>
#include <string.h>

typedef struct trie_node {
    uint32_t end;        /* index just past this node's subtree */
    uint32_t tok_lo;     /* the tokens equal to this prefix: order[tok_lo, tok_hi) */
    uint32_t tok_hi;
    uint16_t depth;      /* 1 for a first byte */
    uint8_t byte;
} trie_node;

typedef struct trie {
    trie_node *node;
    uint32_t n, cap;
    int32_t *order;      /* its token ids sorted by their bytes */
    int32_t n_order;
    uint16_t max_depth;
} trie;

#define NOT_PLAIN 0xFFFF

struct q35_token_trie {
    trie all, special[2]; /* every token; those that are not plain in a JSON string, in a raw one */
    trie plain;          /* those plain in a JSON string */
    int32_t plain_max_chars; /* the most characters of one of them */
    uint16_t *chars[2];  /* (n_tokens) a plain token's characters (JSON string, raw), NOT_PLAIN otherwise */
    int32_t n_tokens;
    const char *const *bytes;
    const size_t *len;
};

static int by_bytes(const void *pa, const void *pb, void *ctx) {
    const q35_token_trie *t = ctx;
    int32_t a = *(const int32_t *)pa, b = *(const int32_t *)pb;
    size_t la = t->len[a], lb = t->len[b];
    int c = memcmp(t->bytes[a], t->bytes[b], la < lb ? la : lb);
    if (c) return c;
    return la < lb ? -1 : la > lb ? 1 : (a > b) - (a < b);
}

/* Adds the nodes under the prefix of length d shared by order[lo, hi)
 * (those equal to the prefix come first and are skipped). */
static int build(const q35_token_trie *t, trie *tr, int32_t lo, int32_t hi, size_t d) {
    while (lo < hi && t->len[tr->order[lo]] == d) lo++;
    while (lo < hi) {
        unsigned char b = (unsigned char)t->bytes[tr->order[lo]][d];
        int32_t e = lo;
        while (e < hi && (unsigned char)t->bytes[tr->order[e]][d] == b) e++;
        if (tr->n == tr->cap) {
            uint32_t cap = tr->cap ? 2 * tr->cap : 1024;
            trie_node *n = realloc(tr->node, sizeof *n * cap);
            if (!n) return -1;
            tr->node = n;
            tr->cap = cap;
        }
        uint32_t me = tr->n++;
        int32_t eq = lo;
        while (eq < e && t->len[tr->order[eq]] == d + 1) eq++;
        tr->node[me] = (trie_node){.tok_lo = (uint32_t)lo, .tok_hi = (uint32_t)eq, .depth = (uint16_t)(d + 1), .byte = b};
        if (d + 1 > tr->max_depth) tr->max_depth = (uint16_t)(d + 1);
        if (build(t, tr, lo, e, d + 1)) return -1;
        tr->node[me].end = tr->n;
        lo = e;
    }
    return 0;
}

/* The characters of a plain token (raw: of a raw string), or NOT_PLAIN. */
static uint16_t plain_chars(const unsigned char *p, size_t n, bool raw) {
    size_t chars = 0;
    for (size_t i = 0; i < n; chars++) {
        unsigned c = p[i];
        if (c < 0x80) {
            if (c < 0x20 || (raw ? c == '<' : c == '"' || c == '\\')) return NOT_PLAIN;
            i++;
            continue;
        }
        unsigned lo = 0x80, hi = 0xBF, k;
        if (c >= 0xC2 && c <= 0xDF) k = 1;
        else if (c == 0xE0) { k = 2; lo = 0xA0; }
        else if (c == 0xED) { k = 2; hi = 0x9F; }
        else if (c >= 0xE1 && c <= 0xEF) k = 2;
        else if (c == 0xF0) { k = 3; lo = 0x90; }
        else if (c == 0xF4) { k = 3; hi = 0x8F; }
        else if (c >= 0xF1 && c <= 0xF3) k = 3;
        else return NOT_PLAIN;
        if (i + k >= n) return NOT_PLAIN; /* a character cut at the end */
        for (unsigned j = 1; j <= k; j++) {
            if (p[i + j] < lo || p[i + j] > hi) return NOT_PLAIN;
            lo = 0x80;
            hi = 0xBF;
        }
        i += k + 1;
    }
    return chars < NOT_PLAIN ? (uint16_t)chars : NOT_PLAIN;
}

/* A trie of every token, or (chars) of those not plain there (want_plain: of those plain there). */
static int make_trie(q35_token_trie *t, trie *tr, const uint16_t *chars, bool want_plain) {
    tr->order = malloc(sizeof *tr->order * (size_t)(t->n_tokens > 0 ? t->n_tokens : 1));
    if (!tr->order) return -1;
    for (int32_t i = 0; i < t->n_tokens; i++)
        if (t->bytes[i] && t->len[i] && t->len[i] < 65535 && (!chars || (chars[i] == NOT_PLAIN) != want_plain))
            tr->order[tr->n_order++] = i;
    qsort_r(tr->order, (size_t)tr->n_order, sizeof *tr->order, by_bytes, t);
    return build(t, tr, 0, tr->n_order, 0);
}

q35_token_trie *q35_token_trie_new(const char *const *bytes, const size_t *len, int32_t n_tokens) {
    q35_token_trie *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bytes = bytes;
    t->len = len;
    t->n_tokens = n_tokens;
    for (int k = 0; k < 2; k++) {
        t->chars[k] = malloc(sizeof *t->chars[k] * (size_t)(n_tokens > 0 ? n_tokens : 1));
        if (!t->chars[k]) { q35_token_trie_free(t); return NULL; }
        for (int32_t i = 0; i < n_tokens; i++)
            t->chars[k][i] = bytes[i] && len[i] ? plain_chars((const unsigned char *)bytes[i], len[i], k) : NOT_PLAIN;
    }
    for (int32_t i = 0; i < n_tokens; i++)
        if (t->chars[0][i] != NOT_PLAIN && t->chars[0][i] > t->plain_max_chars) t->plain_max_chars = t->chars[0][i];
    if (make_trie(t, &t->all, NULL, false) || make_trie(t, &t->special[0], t->chars[0], false) ||
        make_trie(t, &t->special[1], t->chars[1], false) || make_trie(t, &t->plain, t->chars[0], true)) {
        q35_token_trie_free(t);
        return NULL;
    }
    return t;
}

void q35_token_trie_free(q35_token_trie *t) {
    if (!t) return;
    free(t->all.node);
    free(t->all.order);
    free(t->plain.node);
    free(t->plain.order);
    for (int k = 0; k < 2; k++) {
        free(t->special[k].node);
        free(t->special[k].order);
        free(t->chars[k]);
    }
    free(t);
}

/* Marks the live tokens of one trie for a recogniser whose state (size bytes) is copied per depth by copy
 * and fed a byte by feed (false: refused, and the node's subtree is skipped); returns how many. Inlined
 * with constant callbacks, so the schema's walk calls its own functions directly. */
static inline __attribute__((always_inline)) int32_t
walk_with(const trie *tr, bool (*feed)(const void *ctx, void *st, unsigned char b),
          void (*copy)(void *dst, const void *src, size_t size), const void *ctx, const void *state, size_t size,
          uint8_t *live) {
    unsigned char *at = malloc(size * ((size_t)tr->max_depth + 1));
    if (!at) return 0;
    copy(at, state, size);
    int32_t n_live = 0;
    for (uint32_t i = 0; i < tr->n;) {
        const trie_node *nd = &tr->node[i];
        unsigned char *cur = at + size * nd->depth;
        copy(cur, cur - size, size);
        if (!feed(ctx, cur, nd->byte)) { i = nd->end; continue; }
        for (uint32_t k = nd->tok_lo; k < nd->tok_hi; k++) live[tr->order[k]] = 1;
        n_live += (int32_t)(nd->tok_hi - nd->tok_lo);
        i++;
    }
    free(at);
    return n_live;
}

static bool schema_feed(const void *ctx, void *st, unsigned char b) { return q35_schema_byte(ctx, st, b); }
static void schema_copy(void *dst, const void *src, size_t size) { (void)size, q35_schema_copy(dst, src); }

/* Marks the live tokens of one trie; returns how many. */
static int32_t walk(const trie *tr, const q35_schema *s, const q35_schema_state *st, uint8_t *live) {
    return walk_with(tr, schema_feed, schema_copy, s, st, sizeof *st, live);
}

/* The plain tokens from DFA state q0 with `room` characters left (INT32_MAX: no limit). */
static int32_t walk_dfa(const trie *tr, const q35_schema_dfa *D, uint16_t q0, int32_t room, uint8_t *live) {
    uint16_t *q = malloc(sizeof *q * ((size_t)tr->max_depth + 1));
    int32_t *chars = malloc(sizeof *chars * ((size_t)tr->max_depth + 1)), n_live = 0;
    if (!q || !chars) { free(q); free(chars); return 0; }
    q[0] = q0;
    chars[0] = 0;
    for (uint32_t i = 0; i < tr->n;) {
        const trie_node *nd = &tr->node[i];
        uint16_t d = nd->depth, b = nd->byte;
        if ((b & 0xC0) == 0x80) { /* inside a character: its lead byte took the step */
            q[d] = q[d - 1];
            chars[d] = chars[d - 1];
        } else {
            uint16_t nq = D->next[q[d - 1]][b < 0x80 ? b : Q35_SYM_WIDE];
            if (nq == Q35_DFA_DEAD || (room != INT32_MAX && chars[d - 1] + 1 + D->dist[nq] > room)) { i = nd->end; continue; }
            q[d] = nq;
            chars[d] = chars[d - 1] + 1;
        }
        for (uint32_t k = nd->tok_lo; k < nd->tok_hi; k++) live[tr->order[k]] = 1;
        n_live += (int32_t)(nd->tok_hi - nd->tok_lo);
        i++;
    }
    free(q);
    free(chars);
    return n_live;
}

#define CACHE_MIN_LIVE 16384

/* walk_dfa, through the schema's cache when maxLength cannot cut any plain token there. */
static int32_t walk_plain_dfa(const q35_token_trie *t, const q35_schema *s, const q35_schema_dfa *D, uint16_t q, int32_t room,
                              uint8_t *live) {
    q35_mask_cache *c = s->cache;
    if (!c || (room != INT32_MAX && room < t->plain_max_chars + D->max_dist)) return walk_dfa(&t->plain, D, q, room, live);
    int32_t dfa = (int32_t)(D - s->dfa);
    size_t n_bytes = ((size_t)t->n_tokens + 7) / 8;
    for (int i = 0; i < Q35_MASK_CACHE; i++) {
        if (c->e[i].trie != t || c->e[i].dfa != dfa || c->e[i].q != q) continue;
        const uint8_t *bits = c->e[i].bits;
        for (int32_t k = 0; k < t->n_tokens; k++) live[k] = bits[k >> 3] >> (k & 7) & 1;
        return c->e[i].n_live;
    }
    int32_t n_live = walk_dfa(&t->plain, D, q, room, live);
    if (n_live < CACHE_MIN_LIVE) return n_live; /* a walk of few live prefixes costs less than reading a mask back */
    int i = c->next;
    uint8_t *bits = c->e[i].trie == t && c->e[i].bits ? c->e[i].bits : realloc(c->e[i].bits, n_bytes);
    if (!bits) return n_live;
    memset(bits, 0, n_bytes);
    for (int32_t k = 0; k < t->n_tokens; k++) bits[k >> 3] |= (uint8_t)(live[k] << (k & 7));
    c->e[i].bits = bits;
    c->e[i].trie = t;
    c->e[i].dfa = dfa;
    c->e[i].q = q;
    c->e[i].n_live = n_live;
    c->next = (i + 1) % Q35_MASK_CACHE;
    return n_live;
}

/* walk() for an opaque recogniser (q35_token_trie_mask_by); ctx holds its byte function */
typedef struct { q35_trie_byte_fn feed; } opaque_feed;
static bool opaque_byte(const void *ctx, void *st, unsigned char b) { return ((const opaque_feed *)ctx)->feed(st, b); }
static void plain_copy(void *dst, const void *src, size_t size) { memcpy(dst, src, size); }

static int32_t walk_by(const trie *tr, q35_trie_byte_fn feed, const void *state, size_t size, uint8_t *live) {
    const opaque_feed f = {feed};
    return walk_with(tr, opaque_byte, plain_copy, &f, state, size, live);
}

int32_t q35_token_trie_mask_by(const q35_token_trie *t, q35_trie_byte_fn feed, const void *state, size_t state_size,
                               bool plain_live, uint8_t *live) {
    memset(live, 0, (size_t)t->n_tokens);
    if (!plain_live) return walk_by(&t->all, feed, state, state_size, live);
    int32_t n_live = 0;
    for (int32_t i = 0; i < t->n_tokens; i++)
        if (t->chars[0][i] != NOT_PLAIN) { live[i] = 1; n_live++; }
    return n_live + walk_by(&t->special[0], feed, state, state_size, live);
}

int32_t q35_token_trie_mask(const q35_token_trie *t, const q35_schema *s, const q35_schema_state *st, uint8_t *live) {
    memset(live, 0, (size_t)t->n_tokens);
    const q35_schema_dfa *D;
    uint16_t q;
    int32_t left;
    if (q35_schema_dfa_string(s, st, &D, &q, &left)) return walk_plain_dfa(t, s, D, q, left, live) + walk(&t->special[0], s, st, live);
    bool raw;
    int32_t room = q35_schema_string_room(s, st, &raw);
    if (room < 0) return walk(&t->all, s, st, live);
    const uint16_t *chars = t->chars[raw];
    int32_t n_live = 0;
    for (int32_t i = 0; i < t->n_tokens; i++)
        if (chars[i] <= room && chars[i] != NOT_PLAIN) { live[i] = 1; n_live++; }
    return n_live + walk(&t->special[raw], s, st, live);
}
