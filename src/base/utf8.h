/* utf8.h: UTF-8 and string helpers shared by the tokenizer, the chat
 * renderer and the output parsers: a byte-at-a-time UTF-8 repairer that
 * follows the "maximal subpart" rule (what Python's errors="replace" and
 * Rust's from_utf8_lossy do, so a stream and a whole buffer give the same
 * text), Python's notion of whitespace, and a growable byte buffer. */
#ifndef Q35_TEXT_H
#define Q35_TEXT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* State of an unfinished character: the bytes seen so far and what the next
 * byte must be. */
typedef struct q35_utf8_state {
    uint8_t buf[4];
    uint8_t have, need;   /* bytes held, total length of the character */
    uint8_t lo, hi;       /* allowed range of the next byte */
} q35_utf8_state;

/* Longest output of one push: U+FFFD for the dropped prefix, then U+FFFD or a
 * whole 4-byte character for the new byte. */
#define Q35_UTF8_PUSH_MAX 7

/* Feeds one byte; writes the bytes now known to be output and returns their
 * count. */
size_t q35_utf8_push(q35_utf8_state *s, uint8_t byte, char *out);
/* End of input: a held partial character becomes one U+FFFD. */
size_t q35_utf8_flush(q35_utf8_state *s, char *out);

/* Valid UTF-8 copy of s (malloc'd, NUL-terminated); NULL when out of memory. */
char *q35_utf8_repair(const char *s, size_t n, size_t *out_len);
/* Is s valid UTF-8? */
bool q35_utf8_valid(const char *s, size_t n);
/* Decodes one character of valid UTF-8; returns its length. */
size_t q35_utf8_next(const char *s, size_t n, uint32_t *cp);
size_t q35_utf8_encode(uint32_t cp, char *out);

/* Python's str.isspace(): general category Zs, or bidi class WS, B or S. */
bool q35_py_isspace(uint32_t cp);

/* A growable byte string, always NUL-terminated once anything was added.
 * Appends after an allocation failure are ignored and set oom. */
typedef struct q35_buf {
    char *data;
    size_t len, cap;
    bool oom;
} q35_buf;

void q35_buf_append(q35_buf *b, const char *s, size_t n);
void q35_buf_puts(q35_buf *b, const char *s);
void q35_buf_putc(q35_buf *b, char c);
void q35_buf_printf(q35_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void q35_buf_free(q35_buf *b);
/* Hands the data to the caller (never NULL unless oom) and empties b. */
char *q35_buf_take(q35_buf *b, size_t *len);

#endif
