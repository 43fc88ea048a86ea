/* schema_impl.h: the compiled form of a schema (schema.c builds it,
 * schema_match.c reads it). */
#ifndef Q35_TEXT_SCHEMA_IMPL_H
#define Q35_TEXT_SCHEMA_IMPL_H

#include "text/schema.h"

/* SK_SEQ: its children one after another (tool calls); SK_RAW: unquoted
 * text, a tool call's string parameter (lo/hi: characters) */
enum { SK_OBJECT, SK_ARRAY, SK_STRING, SK_NUMBER, SK_INTEGER, SK_LITERAL, SK_ANYOF, SK_SEQ, SK_RAW };

#define Q35_SCHEMA_MAX_NODES 4096
#define Q35_SCHEMA_MAX_ITEMS 1000   /* properties, enum values, anyOf alternatives */
#define Q35_SCHEMA_INT_DIGITS 15    /* digits in a number's integer part */
#define Q35_SCHEMA_FRAC_DIGITS 15   /* ... its fraction */
#define Q35_SCHEMA_EXP_DIGITS 2     /* ... its exponent (a double holds 1e99 with 15 digits before) */

#define Q35_SYM_WIDE 128     /* a DFA's symbol for any multi-byte UTF-8 character */
#define Q35_DFA_DEAD 0xFFFF

/* A DFA over the characters of a string (schema_regex.c): state 0 starts. */
typedef struct q35_schema_dfa {
    int32_t n;
    uint16_t (*next)[Q35_SYM_WIDE + 1]; /* (n, 129) the next state, Q35_DFA_DEAD: refused */
    uint8_t *accept;    /* (n) */
    uint16_t *dist;     /* (n) the fewest characters to an accepting state */
    int32_t max_dist;   /* the largest of dist */
} q35_schema_dfa;

/* token_trie.c's masks of the plain tokens from a DFA state where
 * maxLength cannot cut them: the same each time the state comes back
 * (free text before an unanchored pattern has matched), so kept, a few per
 * schema. Used by the one thread that masks the schema's rows. */
#define Q35_MASK_CACHE 8
typedef struct q35_mask_cache {
    struct {
        const void *trie;
        int32_t dfa, q;     /* q -1: empty */
        uint8_t *bits;      /* (n_tokens / 8 rounded up) the live plain tokens */
        int32_t n_live;
    } e[Q35_MASK_CACHE];
    int next;           /* the entry to replace */
} q35_mask_cache;

typedef struct q35_schema_node {
    int kind;
    int32_t n;          /* properties, literals or alternatives */
    char **str;         /* object: each key as JSON text without the quotes; literal: each value's JSON text */
    size_t *len;
    uint16_t *child;    /* object: each property's node; anyOf: each alternative; seq: each part; array: prefixItems */
    int32_t *next_req;  /* object (n + 1): the first required property at or after i, n: none */
    uint16_t item;      /* array */
    int32_t lo, hi;     /* array: min/maxItems; string: min/maxLength (hi -1: none) */
    int32_t dfa;        /* string: its pattern or format; number, integer: its range; -1: none */
} q35_schema_node;

struct q35_schema {
    q35_schema_node *node;
    int32_t n, cap;
    uint16_t root;
    q35_schema_dfa *dfa;
    int32_t n_dfa;
    int64_t regex_work;  /* schema_regex.c's budget, spent */
    q35_mask_cache *cache; /* NULL: none (out of memory at compile) */
};

/* Compiles a pattern (the subset schema_regex.c describes) into a DFA of
 * s; its index, or -1 with msg. */
int q35_schema_regex(q35_schema *s, const char *pattern, char *msg, size_t msg_size);
void q35_schema_dfa_free(q35_schema *s);
/* When st is one way of reading, inside a string with a DFA between
 * characters: the DFA, its state and the characters left (INT32_MAX: no
 * limit), for token_trie.c's walk. */
bool q35_schema_dfa_string(const q35_schema *s, const q35_schema_state *st, const q35_schema_dfa **dfa, uint16_t *q, int32_t *room);

/* schema_keywords.c, for schema.c's compiler (json_t is jansson's). */
struct json_t;
/* j with its allOf merged in (a new reference), or NULL with msg. */
struct json_t *q35_schema_merge_all_of(const struct json_t *root, const struct json_t *j, char *msg, size_t msg_size);
/* 0 when no two of oneOf's alternatives can hold at once (as far as this
 * check sees), else -1 with the first two that may. */
int q35_schema_one_of_disjoint(const struct json_t *root, const struct json_t *alts, size_t *a, size_t *b);
/* The anchored pattern of a format, NULL when it is not one known here. */
const char *q35_schema_format_regex(const char *format);
/* The pattern of the numbers (integers) j's bounds allow in *out
 * (malloc'd; NULL: no bounds); 0, or -1 with msg. */
int q35_schema_bounds_regex(const struct json_t *j, bool integer, char **out, char *msg, size_t msg_size);

#endif
