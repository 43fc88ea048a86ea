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

typedef struct q35_schema_node {
    int kind;
    int32_t n;          /* properties, literals or alternatives */
    char **str;         /* object: each key as JSON text without the quotes; literal: each value's JSON text */
    size_t *len;
    uint16_t *child;    /* object: each property's node; anyOf: each alternative; seq: each part */
    int32_t *next_req;  /* object (n + 1): the first required property at or after i, n: none */
    uint16_t item;      /* array */
    int32_t lo, hi;     /* array: min/maxItems; string: min/maxLength (hi -1: none) */
} q35_schema_node;

struct q35_schema {
    q35_schema_node *node;
    int32_t n, cap;
    uint16_t root;
};

#endif
