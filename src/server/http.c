/* http.c: libmicrohttpd glue (http.h). The daemon has no listening socket
 * of its own: the listener (listen.c) accepts, admits and hands it
 * connections. It runs one thread per connection and tells the connection
 * table (conn.c) of each one, which enforces --request-timeout on the head
 * and body. The library's own error pages (HTML, for a request head it
 * cannot parse or that is over MHD_OPTION_CONNECTION_MEMORY_LIMIT, a bad
 * Content-Length, bad chunked encoding) never reach a client: the library
 * logs each one on the connection's thread just before it queues it, and
 * that log call writes the JSON answer on the socket and shuts its sending
 * side, so the page's write fails and the library closes (on_library_log). A
 * connection's first call allocates its body, later calls append uploaded
 * bytes (bounded by --max-body and --request-timeout), and the last hands
 * the whole request to q35_route (routes.c) on the same thread. A
 * connection accepted over the request slots may only ask for /health,
 * /metrics and /version. */
#include "server/http.h"
#include "server/buf.h"
#include "server/routes.h"
#include "server/wire.h"
#include "base/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

/* The request's Origin when --allowed-origins lists it (or is "*"); else NULL. */
const char *q35_http_allowed_origin(struct MHD_Connection *c) {
    const q35_conns *t = q35_conn_table_of(c);
    const q35_server *srv = t ? t->owner : NULL;
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    const char *list = srv ? srv->cfg.allowed_origins : NULL;
    if (!origin || !list) return NULL;
    size_t n = strlen(origin);
    for (const char *p = list; *p;) {
        size_t k = strcspn(p, ",");
        while (k && *p == ' ') { p++; k--; }
        size_t m = k;
        while (m && p[m - 1] == ' ') m--;
        if ((m == 1 && *p == '*') || (m == n && !memcmp(p, origin, n))) return origin;
        p += k;
        if (*p == ',') p++;
    }
    return NULL;
}

void q35_http_headers(struct MHD_Connection *c, struct MHD_Response *r, unsigned status) {
    const char *origin = q35_http_allowed_origin(c);
    if (origin) {
        MHD_add_response_header(r, "Access-Control-Allow-Origin", origin);
        MHD_add_response_header(r, "Vary", "Origin");
    }
    if (status == 429 || status == 503) MHD_add_response_header(r, "Retry-After", "1");
}

enum MHD_Result q35_http_send(struct MHD_Connection *c, unsigned status, const char *type, char *body, size_t len) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body ? body : (char *)"", body ? MHD_RESPMEM_MUST_FREE : MHD_RESPMEM_PERSISTENT);
    if (!r) { free(body); return MHD_NO; }
    MHD_add_response_header(r, "Content-Type", type);
    q35_http_headers(c, r, status);
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

enum MHD_Result q35_http_send_json(struct MHD_Connection *c, unsigned status, json_t *j) {
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s) return MHD_NO;
    return q35_http_send(c, status, "application/json", s, strlen(s));
}

enum MHD_Result q35_http_send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *param) {
    char *s = q35_api_error_json((int)status, msg, param);
    if (!s) return MHD_NO;
    return q35_http_send(c, status, "application/json", s, strlen(s));
}

bool q35_http_peer_gone(int fd) {
    if (fd < 0) return false;
    /* the end of the client's bytes (POLLRDHUP, a read of 0) is no hang-up:
     * a client may shut down its sending side and still read the answer;
     * a reset (POLLERR) or both directions closed (POLLHUP) is */
    struct pollfd p = {.fd = fd, .events = 0};
    if (poll(&p, 1, 0) <= 0) return false;
    return (p.revents & (POLLHUP | POLLERR | POLLNVAL)) != 0;
}

int q35_http_fd(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

void q35_http_wait(q35_task *t) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += 100 * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_cond_timedwait(&t->cv, &t->mu, &ts);
}

static bool answer_raw(q35_server *srv, int fd, int status, const char *msg);
static const char head_too_large[] = "the request head (request line and headers) is over this server's limit of %d bytes";

static enum MHD_Result add_size(void *cls, enum MHD_ValueKind kind, const char *key, const char *value) {
    (void)kind;
    *(size_t *)cls += strlen(key) + (value ? strlen(value) : 0) + 4; /* ": " and CRLF */
    return MHD_YES;
}

/* The request head's size, as sent less any spaces the library dropped
 * (the query's arguments counted like headers). */
static size_t head_size(struct MHD_Connection *c, const char *url, const char *method) {
    size_t n = strlen(method) + strlen(url) + 12; /* two spaces, "HTTP/1.1", CRLF */
    MHD_get_connection_values(c, MHD_HEADER_KIND | MHD_GET_ARGUMENT_KIND, add_size, &n);
    return n + 2;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
    (void)version;
    q35_server *srv = cls;
    q35_http_body *b = *con_cls;
    if (!b) {
        b = calloc(1, sizeof *b);
        if (!b) return MHD_NO;
        b->t_start = q35_now_seconds();
        *con_cls = b;
        if (head_size(c, url, method) > Q35_HEAD_LIMIT) {
            /* the library's memory left after such a head may not hold its answer's headers: written here */
            char msg[200];
            snprintf(msg, sizeof msg, head_too_large, Q35_HEAD_LIMIT);
            answer_raw(srv, q35_http_fd(c), 431, msg);
            return MHD_NO;
        }
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtoull(cl, NULL, 10) > srv->cfg.max_body) b->too_large = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (q35_now_seconds() - b->t_start > srv->cfg.request_timeout_s) return MHD_NO; /* a body that trickles in */
        if (!b->too_large && b->len + *upload_size > srv->cfg.max_body) b->too_large = true;
        if (!b->too_large && q35_text_append(&b->data, &b->len, &b->cap, upload, *upload_size)) return MHD_NO;
        *upload_size = 0;
        return MHD_YES;
    }
    q35_conn_request_done(&srv->conns, c);
    if (q35_conn_reserved(&srv->conns, c) && strcmp(url, "/health") && strcmp(url, "/metrics") && strcmp(url, "/version")) {
        char msg[200];
        q35_conn_count_reserved_refusal(&srv->conns);
        snprintf(msg, sizeof msg, "the server is at its connection limit (%d); retry later", srv->conns.slots);
        return q35_http_send_error(c, 503, msg, NULL);
    }
    if (b->too_large) {
        char msg[200];
        snprintf(msg, sizeof msg, "the request body is over this server's limit of %zu bytes", srv->cfg.max_body);
        return q35_http_send_error(c, 413, msg, NULL);
    }
    return q35_route(srv, c, url, method, b);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    q35_server *srv = cls;
    q35_conn_response_done(&srv->conns, c);
    q35_http_body *b = *con_cls;
    if (b) { free(b->data); free(b); }
    *con_cls = NULL;
}

/* The library's first word of a request, on the connection's own thread. */
static void *on_uri(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)uri;
    q35_server *srv = cls;
    q35_conn_bind_thread(&srv->conns, c);
    return NULL; /* the request's context: on_request makes it */
}

/* The JSON answer for one of the library's own error pages (its status and
 * HTML text): the message. */
static void protocol_error_message(int status, const char *page, char *msg, size_t cap) {
    bool chunk = page && strstr(page, "chunk"), clen = page && strstr(page, "Content-Length");
    switch (status) {
    case 400:
        snprintf(msg, cap, "%s", chunk ? "malformed chunked encoding in the request body"
                                 : clen ? "the Content-Length header is not a number"
                                        : "malformed request head (a request line or header line that is not HTTP)");
        break;
    case 413:
        snprintf(msg, cap, "%s", chunk ? "a chunk size in the request body is too large" : "the Content-Length header is too large");
        break;
    case 414:
    case 431:
        snprintf(msg, cap, head_too_large, Q35_HEAD_LIMIT);
        break;
    case 505: snprintf(msg, cap, "HTTP version not supported (use HTTP/1.1 or HTTP/1.0)"); break;
    default: snprintf(msg, cap, "the server could not read the request"); break;
    }
}

/* Writes status's JSON answer on fd itself (below the library, which is
 * about to close the connection or to send a page of its own), shuts the
 * sending side (a page's write then fails and the library closes), and
 * drops what the client still sends for a while, so that the close is no
 * reset that could discard the answer. False: nothing was written. */
static bool answer_raw(q35_server *srv, int fd, int status, const char *msg) {
    char resp[1024];
    size_t n = q35_wire_error(status, msg, resp, sizeof resp), off = 0;
    double t_end = q35_now_seconds() + 1;
    while (n && off < n && q35_now_seconds() < t_end) {
        ssize_t k = send(fd, resp + off, n - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (k > 0) { off += (size_t)k; continue; }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) break;
        poll(&(struct pollfd){.fd = fd, .events = POLLOUT}, 1, 100);
    }
    if (!off) return false;
    shutdown(fd, SHUT_WR);
    q35_conn_count_malformed(&srv->conns);
    char sink[4096];
    size_t dropped = 0;
    while (dropped < Q35_LINGER_BYTES && q35_now_seconds() < t_end) {
        ssize_t k = recv(fd, sink, sizeof sink, MSG_DONTWAIT);
        if (k > 0) { dropped += (size_t)k; continue; }
        if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) break;
        poll(&(struct pollfd){.fd = fd, .events = POLLIN}, 1, 100);
    }
    return true;
}

/* The library is about to send its error page for status on the calling
 * thread's connection, which waits for a request: answered in JSON instead. */
static bool answer_protocol_error(q35_server *srv, int status, const char *page) {
    int fd = q35_conn_fd_of_thread(&srv->conns);
    if (fd < 0) return false;
    char msg[200];
    protocol_error_message(status, page, msg, sizeof msg);
    return answer_raw(srv, fd, status, msg);
}

/* MHD_OPTION_EXTERNAL_LOGGER: the library's messages to stderr, except
 * the error pages it is about to send, which are answered in JSON instead
 * ("Error processing request (HTTP response code is %u ('%s')). ...", the
 * one message libmicrohttpd 0.9.75 logs for each of them). */
static void on_library_log(void *cls, const char *fm, va_list ap) {
    static const char page[] = "Error processing request (HTTP response code is %u ('%s'))";
    if (!strncmp(fm, page, sizeof page - 1)) {
        va_list aq;
        va_copy(aq, ap);
        unsigned status = va_arg(aq, unsigned);
        const char *html = va_arg(aq, const char *);
        va_end(aq);
        if (answer_protocol_error(cls, (int)status, html)) return;
    }
    fputs("qwen35 serve: libmicrohttpd: ", stderr);
    vfprintf(stderr, fm, ap);
}

struct MHD_Daemon *q35_http_start(q35_server *srv, int *rc) {
    const q35_server_config *cfg = &srv->cfg;
    int slots = cfg->parallel + cfg->max_queue + 64;
    if (q35_conns_init(&srv->conns, slots, cfg->max_conns_per_client, cfg->request_timeout_s, cfg->write_timeout_s)) {
        fprintf(stderr, "qwen35 serve: out of memory\n");
        *rc = 1;
        return NULL;
    }
    srv->conns.owner = srv;
    if ((*rc = q35_listen_open(&srv->listener, cfg->host, cfg->port, cfg->backlog))) return NULL;
    if (q35_conns_start(&srv->conns)) {
        fprintf(stderr, "qwen35 serve: cannot start the connection watchdog\n");
        q35_listen_close(&srv->listener);
        *rc = 1;
        return NULL;
    }
    /* poll, not select, in the connection threads: descriptors past FD_SETSIZE are fine. The library's own
     * limit sits well above the listener's (slots + reserve), which is the one that applies: a connection
     * it refused would never be reported closed, and its admission never given back. */
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_POLL |
                     MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC | MHD_USE_ERROR_LOG;
    struct MHD_Daemon *d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, srv,
                                            MHD_OPTION_EXTERNAL_LOGGER, on_library_log, srv,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(2 * (slots + Q35_CONN_RESERVED) + 64),
                                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)Q35_HEAD_MAX,
                                            MHD_OPTION_URI_LOG_CALLBACK, on_uri, srv,
                                            MHD_OPTION_NOTIFY_CONNECTION, q35_conn_notify, &srv->conns,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
                                            MHD_OPTION_END);
    if (!d || q35_listen_start(&srv->listener, d, &srv->conns, cfg->request_timeout_s)) {
        fprintf(stderr, "qwen35 serve: cannot start the HTTP daemon on %s:%d\n", cfg->host, cfg->port);
        q35_listen_close(&srv->listener);
        if (d) MHD_stop_daemon(d);
        q35_conns_stop(&srv->conns);
        *rc = 1;
        return NULL;
    }
    return d;
}

void q35_http_stop(q35_server *srv, struct MHD_Daemon *d) {
    q35_listen_close(&srv->listener);
    MHD_stop_daemon(d);
    q35_conns_stop(&srv->conns);
}

int q35_http_port(const q35_server *srv) { return srv->listener.port; }
