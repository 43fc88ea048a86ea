/* token_trie.c: a byte trie of a vocabulary's token strings (schema.h),
 * and the mask of the tokens that can continue a schema's document.
 *
 * The nodes are stored in preorder, each with the index just past its
 * subtree, so the mask is one pass over the array: a node's state is its
 * parent's (one copy of the small recogniser state per node, kept per
 * depth) fed the node's byte, and a byte the recogniser refuses skips the
 * whole subtree: every token with that prefix. The cost is the number of
 * live prefixes, at most the trie's size. */
#include "text/schema.h"

#include <stdlib.h>
#include <string.h>

typedef struct trie_node {
    uint32_t end;        /* index just past this node's subtree */
    uint32_t tok_lo;     /* the tokens equal to this prefix: order[tok_lo, tok_hi) */
    uint32_t tok_hi;
    uint16_t depth;      /* 1 for a first byte */
    uint8_t byte;
} trie_node;

struct q35_token_trie {
    trie_node *node;
    uint32_t n, cap;
    int32_t *order;      /* token ids sorted by their bytes */
    int32_t n_order;
    int32_t n_tokens;
    uint16_t max_depth;
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
static int build(q35_token_trie *t, int32_t lo, int32_t hi, size_t d) {
    while (lo < hi && t->len[t->order[lo]] == d) lo++;
    while (lo < hi) {
        unsigned char b = (unsigned char)t->bytes[t->order[lo]][d];
        int32_t e = lo;
        while (e < hi && (unsigned char)t->bytes[t->order[e]][d] == b) e++;
        if (t->n == t->cap) {
            uint32_t cap = t->cap ? 2 * t->cap : 1024;
            trie_node *n = realloc(t->node, sizeof *n * cap);
            if (!n) return -1;
            t->node = n;
            t->cap = cap;
        }
        uint32_t me = t->n++;
        int32_t eq = lo;
        while (eq < e && t->len[t->order[eq]] == d + 1) eq++;
        t->node[me] = (trie_node){.tok_lo = (uint32_t)lo, .tok_hi = (uint32_t)eq, .depth = (uint16_t)(d + 1), .byte = b};
        if (d + 1 > t->max_depth) t->max_depth = (uint16_t)(d + 1);
        if (build(t, lo, e, d + 1)) return -1;
        t->node[me].end = t->n;
        lo = e;
    }
    return 0;
}

q35_token_trie *q35_token_trie_new(const char *const *bytes, const size_t *len, int32_t n_tokens) {
    q35_token_trie *t = calloc(1, sizeof *t);
    if (!t) return NULL;
    t->bytes = bytes;
    t->len = len;
    t->n_tokens = n_tokens;
    t->order = malloc(sizeof *t->order * (size_t)(n_tokens > 0 ? n_tokens : 1));
    if (!t->order) { free(t); return NULL; }
    for (int32_t i = 0; i < n_tokens; i++)
        if (bytes[i] && len[i] && len[i] < 65535) t->order[t->n_order++] = i;
    qsort_r(t->order, (size_t)t->n_order, sizeof *t->order, by_bytes, t);
    if (build(t, 0, t->n_order, 0)) { q35_token_trie_free(t); return NULL; }
    return t;
}

void q35_token_trie_free(q35_token_trie *t) {
    if (!t) return;
    free(t->node);
    free(t->order);
    free(t);
}

int32_t q35_token_trie_mask(const q35_token_trie *t, const q35_schema *s, const q35_schema_state *st, uint8_t *live) {
    memset(live, 0, (size_t)t->n_tokens);
    q35_schema_state *at = malloc(sizeof *at * ((size_t)t->max_depth + 1));
    if (!at) return 0;
    q35_schema_copy(&at[0], st);
    int32_t n_live = 0;
    for (uint32_t i = 0; i < t->n;) {
        const trie_node *nd = &t->node[i];
        q35_schema_state *cur = &at[nd->depth];
        q35_schema_copy(cur, &at[nd->depth - 1]);
        if (!q35_schema_byte(s, cur, nd->byte)) { i = nd->end; continue; }
        for (uint32_t k = nd->tok_lo; k < nd->tok_hi; k++) live[t->order[k]] = 1;
        n_live += (int32_t)(nd->tok_hi - nd->tok_lo);
        i++;
    }
    free(at);
    return n_live;
}
