/* json_prefix.h: the recogniser of JSON object prefixes (json_prefix.c), which
 * response_format json_object masks the sampler's choices with. */
#ifndef Q35_SERVER_JSON_PREFIX_H
#define Q35_SERVER_JSON_PREFIX_H

#include <stdbool.h>
#include <stddef.h>

/* Recognises prefixes of one JSON object, byte by byte (json_prefix.c). The
 * state is a small plain struct: copy it to try a token's bytes. */
#define Q35_JSON_MAX_DEPTH 32
#define Q35_JSON_MAX_WS 8      /* whitespace bytes in a row outside strings */
typedef struct q35_json_prefix {
    char stack[Q35_JSON_MAX_DEPTH]; /* '{' or '[' per open container */
    int depth, mode, aux, lit, ws_run;
    bool in_key, after_open;
} q35_json_prefix;

void q35_json_prefix_init(q35_json_prefix *p);
/* false when the bytes cannot continue a valid object (p is then undefined) */
bool q35_json_prefix_feed(q35_json_prefix *p, const char *s, size_t n);
bool q35_json_prefix_complete(const q35_json_prefix *p);
/* one byte (q35_json_prefix_feed's step; a q35_trie_byte_fn for a q35_json_prefix) */
bool q35_json_prefix_byte(void *p, unsigned char c);
/* inside a string, where any byte >= 0x20 but '"' and '\\' continues it and leaves the state as it is */
bool q35_json_prefix_in_string(const q35_json_prefix *p);

#endif
