/* test_wire.c: what the server checks and writes below libmicrohttpd
 * (src/server/wire.c): the first request line's check, and whole error
 * responses with their JSON bodies. No sockets. */
#include "server/wire.h"
#include "test.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int line(const char *s) { return q35_wire_request_line(s, strlen(s)); }

TEST(wire, request_lines_the_library_takes_pass_and_their_prefixes_wait) {
    static const char *const ok[] = {
        "GET / HTTP/1.1\r\n", "GET /health HTTP/1.0\n", "POST /v1/completions HTTP/1.1\r\nHost: x\r\n",
        "\r\n\r\nGET / HTTP/1.1\r\n", "\nOPTIONS * HTTP/1.1\r\n", "GET /a b HTTP/1.1\r\n", "GET  /x HTTP/1.9\r\n",
        "M-SEARCH /x?y=1 HTTP/1.1\r\n",
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        CHECK_MSG(line(ok[i]) == 200, "%zu: %s -> %d", i, ok[i], line(ok[i]));
        const char *lf = strrchr(ok[i], '\n');
        size_t first_end = (size_t)(strchr(ok[i] + strspn(ok[i], "\r\n"), '\n') - ok[i]);
        (void)lf;
        for (size_t k = 0; k < first_end; k++) /* a line that arrives in pieces is never refused early */
            CHECK_MSG(q35_wire_request_line(ok[i], k) == 0, "%zu: prefix %zu", i, k);
    }
}

TEST(wire, request_lines_the_library_refuses_get_their_status_here) {
    static const struct { const char *line; int status; } bad[] = {
        {"GARBAGE\r\n", 400}, {"GET /\r\n", 400}, {"GET\r\n", 400}, {" / HTTP/1.1\r\n", 400},
        {"GET / HTTP/1.1 \r\n", 400}, {"GET / HTTP/1.1\r\r\n", 400}, {"GET / http/1.1\r\n", 400},
        {"GET / HTTP/1.x\r\n", 400}, {"GET / HTTP/11\r\n", 400}, {"GET / FOO/1.1\r\n", 400},
        {"GET  HTTP/1.1\r\n", 400}, {"GET /\x01 HTTP/1.1\r\n", 400}, {"G(T / HTTP/1.1\r\n", 400},
        {"\rGET / HTTP/1.1\r\n", 400}, {"GET / HTTP/0.9\r\n", 505}, {"GET / HTTP/2.0\r\n", 505},
        {"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", 505}, {"GET / HTTP/9.9\n", 505},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        CHECK_MSG(line(bad[i].line) == bad[i].status, "%zu: %s -> %d, want %d", i, bad[i].line, line(bad[i].line), bad[i].status);
    /* a NUL inside the line is a control byte too */
    CHECK(q35_wire_request_line("GET /\0 HTTP/1.1\r\n", 17) == 400);
}

TEST(wire, a_request_line_without_an_end_is_414_past_the_limit) {
    size_t n = Q35_REQUEST_LINE_MAX + 2;
    char *buf = malloc(n);
    memcpy(buf, "GET /", 5);
    memset(buf + 5, 'a', n - 5);
    CHECK(q35_wire_request_line(buf, Q35_REQUEST_LINE_MAX - 1) == 0);
    CHECK(q35_wire_request_line(buf, Q35_REQUEST_LINE_MAX) == 414);
    memcpy(buf + Q35_REQUEST_LINE_MAX - 11, " HTTP/1.1\r\n", 11); /* ends on the limit's last byte */
    CHECK(q35_wire_request_line(buf, n) == 200);
    for (size_t i = 0; i < n; i++) buf[i] = i % 2 ? '\n' : '\r'; /* only empty lines: never a request */
    CHECK(q35_wire_request_line(buf, n) == 414);
    free(buf);
}

/* Splits a whole response into its status, a header's value and the body. */
static json_t *parse_response(const char *r, size_t n, int *status, const char *header, char *value, size_t cap) {
    const char *end = strstr(r, "\r\n\r\n");
    if (!end || sscanf(r, "HTTP/1.1 %d ", status) != 1) return NULL;
    value[0] = 0;
    char key[64];
    snprintf(key, sizeof key, "\r\n%s: ", header);
    const char *h = strstr(r, key);
    if (h && h < end) snprintf(value, cap, "%.*s", (int)strcspn(h + strlen(key), "\r"), h + strlen(key));
    const char *cl = strstr(r, "\r\nContent-Length: ");
    size_t body = (size_t)(end + 4 - r);
    if (!cl || strtoul(cl + 18, NULL, 10) != n - body) return NULL;
    return json_loadb(r + body, n - body, 0, NULL);
}

TEST(wire, error_responses_are_whole_with_a_json_body) {
    static const int statuses[] = {400, 413, 414, 429, 431, 503, 505};
    for (size_t i = 0; i < sizeof statuses / sizeof *statuses; i++) {
        char r[1024], v[64];
        size_t n = q35_wire_error(statuses[i], "a \"quoted\" reason", r, sizeof r);
        CHECK(n > 0 && n < sizeof r);
        int status;
        json_t *j = parse_response(r, n, &status, "Retry-After", v, sizeof v);
        CHECK_MSG(j != NULL, "%d: %s", statuses[i], r);
        CHECK(status == statuses[i]);
        CHECK(!strcmp(v, statuses[i] == 429 || statuses[i] == 503 ? "1" : ""));
        CHECK(strstr(r, "\r\nContent-Type: application/json\r\n") && strstr(r, "\r\nConnection: close\r\n"));
        json_t *e = json_object_get(j, "error");
        CHECK(json_integer_value(json_object_get(e, "code")) == statuses[i]);
        CHECK(!strcmp(json_string_value(json_object_get(e, "message")), "a \"quoted\" reason"));
        CHECK(json_is_string(json_object_get(e, "type")));
        json_decref(j);
    }
    char small[64];
    CHECK(q35_wire_error(400, "x", small, sizeof small) == 0); /* too small: nothing, never a cut response */
}
