/* buf.h: appending to a growing NUL-terminated text held as (*buf, *len,
 * *cap), the form the SSE and Prometheus writers take (buf.c, over
 * base/utf8.h's q35_buf). Both return 0, or -1 when memory runs out (the
 * text is then as it was). */
#ifndef Q35_SERVER_BUF_H
#define Q35_SERVER_BUF_H

#include <stddef.h>

int q35_text_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n);
int q35_text_appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

#endif
