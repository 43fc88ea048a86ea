/* http.c: libmicrohttpd glue (http.h). The daemon runs one thread per
 * connection, at most --max-conns-per-client from one address (more are
 * closed as they are accepted), and tells the connection table (conn.c) of
 * each one, which enforces --request-timeout on the head and body. A
 * connection's first call allocates its body, later calls append uploaded
 * bytes (bounded by --max-body and --request-timeout), and the last hands
 * the whole request to q35_route (routes.c) on the same thread. A
 * connection accepted over the request slots may only ask for /health,
 * /metrics and /version. */
#include "server/http.h"
#include "server/buf.h"
#include "server/routes.h"
#include "base/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <poll.h>
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

struct MHD_Daemon *q35_http_start(q35_server *srv, int *rc) {
    const q35_server_config *cfg = &srv->cfg;
    q35_conns_init(&srv->conns, cfg->parallel + cfg->max_queue + 64, cfg->request_timeout_s, cfg->write_timeout_s);
    srv->conns.owner = srv;
    if (q35_conns_start(&srv->conns)) {
        fprintf(stderr, "qwen35 serve: cannot start the connection watchdog\n");
        *rc = 1;
        return NULL;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_ERROR_LOG;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, cfg->host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)cfg->port);
    } else if (inet_pton(AF_INET6, cfg->host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)cfg->port);
        flags |= MHD_USE_IPv6;
    } else {
        fprintf(stderr, "qwen35 serve: --host must be a numeric IPv4 or IPv6 address, got '%s'\n", cfg->host);
        *rc = 2;
        q35_conns_stop(&srv->conns);
        return NULL;
    }
    struct MHD_Daemon *d = MHD_start_daemon(flags, (uint16_t)cfg->port, NULL, NULL, on_request, srv,
                                            MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&ss,
                                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)cfg->timeout_s,
                                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)(srv->conns.slots + Q35_CONN_RESERVED),
                                            MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)cfg->max_conns_per_client,
                                            MHD_OPTION_NOTIFY_CONNECTION, q35_conn_notify, &srv->conns,
                                            MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
                                            MHD_OPTION_THREAD_STACK_SIZE, (size_t)(1u << 20),
                                            MHD_OPTION_END);
    if (!d) {
        fprintf(stderr, "qwen35 serve: cannot listen on %s:%d: %s\n", cfg->host, cfg->port, strerror(errno));
        *rc = 1;
        q35_conns_stop(&srv->conns);
    }
    return d;
}

void q35_http_stop(q35_server *srv, struct MHD_Daemon *d) {
    MHD_stop_daemon(d);
    q35_conns_stop(&srv->conns);
}

int q35_http_port(struct MHD_Daemon *d, int fallback) {
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
    return di ? di->port : fallback;
}
