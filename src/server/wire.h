/* wire.h: the bytes the server writes or checks below libmicrohttpd
 * (wire.c): a whole HTTP/1.1 error response with an OpenAI-shaped JSON
 * body, for answers the server writes on a socket itself (refusals at
 * accept, the library's own protocol errors), and the check of a
 * connection's first request line before the socket is handed to the
 * library. No I/O: tests/test_api.c and fuzz/fuzz_wire.c drive them. */
#ifndef Q35_SERVER_WIRE_H
#define Q35_SERVER_WIRE_H

#include <stddef.h>

/* The longest first request line the server takes, with the empty lines
 * before it (414 beyond). */
enum { Q35_REQUEST_LINE_MAX = 16 << 10 };

/* A whole response: status line, Content-Type application/json,
 * Content-Length, Connection: close, Retry-After: 1 on 429 and 503, and
 * the JSON error body of q35_api_error_json. Its length, or 0 when it
 * does not fit in cap (or the body cannot be made). */
size_t q35_wire_error(int status, const char *message, char *out, size_t cap);

/* The first request line in buf[0..n) (what has arrived of a connection's
 * bytes; empty lines before it are skipped, as libmicrohttpd does): 0 when
 * it has not arrived whole yet, 200 when libmicrohttpd will take it,
 * else the status to refuse it with: 400 (not METHOD SP TARGET SP
 * HTTP/d.d), 414 (no end within the first Q35_REQUEST_LINE_MAX bytes), 505 (an
 * HTTP version other than 1.x). At least as strict as libmicrohttpd
 * 0.9.75, so a line that passes never gets the library's own error page. */
int q35_wire_request_line(const char *buf, size_t n);

/* The reason phrase of a status this layer answers with ("Bad Request"...). */
const char *q35_wire_reason(int status);

#endif
