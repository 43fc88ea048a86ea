/* schema.h: a JSON Schema subset compiled into a byte-level recogniser of
 * the documents it accepts (schema.c compiles, schema_match.c recognises),
 * and a byte trie of a vocabulary's token strings that masks the tokens
 * which cannot continue a document (token_trie.c). */
#ifndef Q35_TEXT_SCHEMA_H
#define Q35_TEXT_SCHEMA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct json_t;

typedef struct q35_schema q35_schema;

#define Q35_SCHEMA_DEPTH 16   /* nesting of containers and values in one document */
#define Q35_SCHEMA_THREADS 4  /* anyOf alternatives followed at once */

/* One frame: a value being read (its node, where in it). */
typedef struct q35_schema_frame {
    uint16_t node;
    uint8_t phase, x;
    uint16_t a, b, c;
} q35_schema_frame;

/* One way the bytes so far can be read; depth 0 with done: a whole document. */
typedef struct q35_schema_thread {
    uint8_t depth, done;
    q35_schema_frame f[Q35_SCHEMA_DEPTH];
} q35_schema_thread;

/* The recogniser's state: a plain struct (copy it to try bytes). */
typedef struct q35_schema_state {
    int n;
    q35_schema_thread t[Q35_SCHEMA_THREADS];
} q35_schema_state;

/* Compiles a schema. Returns 0, or -1 with *out NULL, `where` the path of
 * the offending part below the schema ("", ".properties.a.type", ...) and
 * msg what is wrong. */
int q35_schema_compile(const struct json_t *schema, q35_schema **out, char *where, size_t where_size, char *msg,
                       size_t msg_size);
void q35_schema_free(q35_schema *s);
/* The recogniser of one Qwen3.5 XML tool call (<tool_call>\n<function=NAME>
 * \n<parameter=KEY>\nVALUE\n</parameter>\n...</function>\n</tool_call>)
 * to the function `name` of the OpenAI `tools` list, or to any of them
 * (name NULL), with its required parameters valid for its schema. Errors
 * as q35_schema_compile, `where` below the tools list ("[0].function..."). */
int q35_schema_compile_tool_call(const struct json_t *tools, const char *name, q35_schema **out, char *where,
                                 size_t where_size, char *msg, size_t msg_size);

/* The value a "#..." JSON pointer ($ref) names in root, or NULL. */
const struct json_t *q35_schema_ref_target(const struct json_t *root, const char *ref);
/* j with its $refs into root followed (at most 16), or NULL where one does not resolve. */
const struct json_t *q35_schema_resolve(const struct json_t *root, const struct json_t *j);

void q35_schema_start(const q35_schema *s, q35_schema_state *st);
/* false when the byte cannot continue a valid document (st is then undefined) */
bool q35_schema_byte(const q35_schema *s, q35_schema_state *st, unsigned char c);
bool q35_schema_feed(const q35_schema *s, q35_schema_state *st, const char *p, size_t n);
/* the bytes so far are a whole valid document */
bool q35_schema_complete(const q35_schema *s, const q35_schema_state *st);
/* no byte can follow (a whole document that nothing may extend) */
bool q35_schema_closed(const q35_schema *s, const q35_schema_state *st);
/* When every way of reading the bytes is inside a JSON string (not in an
 * escape or a character), or inside a tool call's raw string that is past
 * any "null", the most characters one of them may still take (INT32_MAX:
 * no limit), *raw saying which kind; -1 otherwise. */
int32_t q35_schema_string_room(const q35_schema *s, const q35_schema_state *st, bool *raw);
/* copies only the used part of src */
void q35_schema_copy(q35_schema_state *dst, const q35_schema_state *src);

/* A byte trie of token strings, built once per vocabulary. */
typedef struct q35_token_trie q35_token_trie;
/* bytes[t] (len[t] bytes) is token t's string; NULL or empty: never allowed */
q35_token_trie *q35_token_trie_new(const char *const *bytes, const size_t *len, int32_t n_tokens);
void q35_token_trie_free(q35_token_trie *t);
/* Sets live[t] = 1 for each token whose bytes continue st, 0 otherwise;
 * returns how many are live. */
int32_t q35_token_trie_mask(const q35_token_trie *t, const q35_schema *s, const q35_schema_state *st, uint8_t *live);
/* The same for another byte recogniser: state (state_size bytes, copied per trie depth) fed one byte by
 * feed (false: refused). plain_live: every token plain inside a JSON string (printable ASCII but '"' and
 * '\\', and whole UTF-8 characters) continues the state and leaves it as it is, so only the others are
 * walked. */
typedef bool (*q35_trie_byte_fn)(void *state, unsigned char byte);
int32_t q35_token_trie_mask_by(const q35_token_trie *t, q35_trie_byte_fn feed, const void *state, size_t state_size,
                               bool plain_live, uint8_t *live);

#endif
