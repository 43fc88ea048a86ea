/* buf.c: growing text buffers (buf.h): the stop matcher, the SSE framing,
 * the Prometheus text and request bodies append through these. */
#include "server/buf.h"
#include "base/utf8.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

int q35_text_append(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    q35_buf b = {.data = *buf, .len = *len, .cap = *cap};
    q35_buf_append(&b, s, n);
    *buf = b.data;
    *len = b.len;
    *cap = b.cap;
    return b.oom ? -1 : 0;
}

int q35_text_appendf(char **buf, size_t *len, size_t *cap, const char *fmt, ...) {
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return -1;
    if ((size_t)n < sizeof tmp) return q35_text_append(buf, len, cap, tmp, (size_t)n);
    char *big = malloc((size_t)n + 1);
    if (!big) return -1;
    va_start(ap, fmt);
    vsnprintf(big, (size_t)n + 1, fmt, ap);
    va_end(ap);
    int rc = q35_text_append(buf, len, cap, big, (size_t)n);
    free(big);
    return rc;
}
