/* sse.h: server-sent event framing (sse.c). */
#ifndef Q35_SERVER_SSE_H
#define Q35_SERVER_SSE_H

#include <jansson.h>
#include <stddef.h>

/* "data: <compact JSON>\n\n" appended to *buf (growing it); 0 or -1. */
int q35_sse_append_json(char **buf, size_t *len, size_t *cap, const json_t *event);
int q35_sse_append_raw(char **buf, size_t *len, size_t *cap, const char *data);

#endif
