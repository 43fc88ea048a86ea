/* wire.c: raw error responses and the first-request-line check (wire.h).
 * The request line follows libmicrohttpd 0.9.75's parse_initial_message_line
 * and parse_http_version: a line ends at CRLF or a bare LF, the method runs
 * to the first space, the version is what follows the last space and must
 * be exactly "HTTP/" digit "." digit, major 1 (0 and 2..9 are 505). The check is stricter where the library is
 * lenient in ways no client needs: a method must be a token, the target
 * must be there, and control bytes are refused. */
#include "server/wire.h"
#include "server/request.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *q35_wire_reason(int status) {
    switch (status) {
    case 400: return "Bad Request";
    case 408: return "Request Timeout";
    case 413: return "Content Too Large";
    case 414: return "URI Too Long";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    default: return "Error";
    }
}

size_t q35_wire_error(int status, const char *message, char *out, size_t cap) {
    char *body = q35_api_error_json(status, message, NULL);
    if (!body) return 0;
    size_t blen = strlen(body);
    int n = snprintf(out, cap,
                     "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                     "Connection: close\r\n%s\r\n%s",
                     status, q35_wire_reason(status), blen, status == 429 || status == 503 ? "Retry-After: 1\r\n" : "",
                     body);
    free(body);
    return n > 0 && (size_t)n < cap ? (size_t)n : 0;
}

static int is_tchar(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

int q35_wire_request_line(const char *buf, size_t n) {
    size_t start = 0, lim = n < Q35_REQUEST_LINE_MAX ? n : Q35_REQUEST_LINE_MAX;
    for (;;) { /* empty lines before the request line; they count towards the limit */
        if (start < lim && buf[start] == '\n') { start++; continue; }
        if (start + 1 < lim && buf[start] == '\r' && buf[start + 1] == '\n') { start += 2; continue; }
        break;
    }
    const char *line = buf + start;
    const char *lf = memchr(line, '\n', lim - start);
    if (!lf) return n >= Q35_REQUEST_LINE_MAX ? 414 : 0;
    size_t len = (size_t)(lf - line);
    if (len && line[len - 1] == '\r') len--;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)line[i] < 0x20 || line[i] == 0x7f) return 400;
    size_t m = 0;
    while (m < len && is_tchar((unsigned char)line[m])) m++;
    if (!m || m >= len || line[m] != ' ') return 400;
    size_t end = len; /* a space after the version makes it no version (the library's 400) */
    size_t v = end;
    while (v > m && line[v - 1] != ' ') v--;
    /* v: the version's first byte; the target lies between the method's space and the version's */
    size_t t = m;
    while (t < v && line[t] == ' ') t++;
    if (v <= m + 1 || t >= v) return 400;
    const char *ver = line + v;
    if (end - v != 8 || memcmp(ver, "HTTP/", 5) || ver[6] != '.' || ver[5] < '0' || ver[5] > '9' || ver[7] < '0' ||
        ver[7] > '9')
        return 400;
    return ver[5] == '1' ? 200 : 505;
}
