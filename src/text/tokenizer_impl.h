/* tokenizer_impl.h: the tables of a loaded tokenizer (struct q35_tokenizer)
 * and their lookups, shared by tokenizer_load.c, which builds them, and
 * tokenizer.c, which encodes and decodes with them. Private to src/text. */
#ifndef Q35_TOKENIZER_IMPL_H
#define Q35_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include "qwen35.h"

#include <pcre2.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
    uint64_t serial;       /* unique per load: names this tokenizer in the word memos */
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

/* ---- lookups ---- */

static inline uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
    return h ^ (h >> 29);
}

static inline uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return x;
}

static inline int32_t vocab_find(const q35_tokenizer *t, const char *s, size_t n) {
    if (!t->vocab_slot) return -1;
    for (uint32_t i = (uint32_t)hash_bytes(s, n) & t->vocab_mask;; i = (i + 1) & t->vocab_mask) {
        int32_t id = t->vocab_slot[i];
        if (id < 0) return -1;
        if (t->len[id] == n && memcmp(t->arena + t->off[id], s, n) == 0) return id;
    }
}

static inline bool merge_find(const q35_tokenizer *t, int32_t a, int32_t b, uint32_t *rank, int32_t *new_id) {
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

#endif
