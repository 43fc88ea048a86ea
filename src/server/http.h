/* http.h: the libmicrohttpd side of the server (http.c): the daemon, one
 * thread per connection, request bodies read within the size and time
 * limits, and the helpers every route answers with. */
#ifndef Q35_SERVER_HTTP_H
#define Q35_SERVER_HTTP_H

#include "server/context.h"

#include <jansson.h>
#include <microhttpd.h>
#include <stdbool.h>
#include <stddef.h>

/* A request's body as it arrived, with its arrival time. */
typedef struct q35_http_body {
    char *data;                /* NUL-terminated; NULL when empty */
    size_t len, cap;
    double t_start;
    bool too_large;
} q35_http_body;

/* The longest request head (request line and headers) taken: 431 beyond.
 * The library's memory per connection (MHD_OPTION_CONNECTION_MEMORY_LIMIT)
 * is twice that, so that a head just under the limit still leaves room
 * for its answer's headers (0.9.75 closes without an answer when it
 * cannot build them). */
enum { Q35_HEAD_LIMIT = 32 << 10, Q35_HEAD_MAX = 2 * Q35_HEAD_LIMIT };

/* Listens on cfg.host:cfg.port (listen.h) and starts the daemon, every
 * connection dispatched to q35_route (routes.h). NULL on failure, with the
 * exit status in *rc (2: a bad address, 1: cannot listen), the reason
 * printed. */
struct MHD_Daemon *q35_http_start(q35_server *srv, int *rc);
/* Stops accepting, stops the daemon (closing every connection) and the connection watchdog. */
void q35_http_stop(q35_server *srv, struct MHD_Daemon *d);
/* The port the server listens on (the one picked for port 0). */
int q35_http_port(const q35_server *srv);

/* Responses: body is malloc'd and passes to the response (NULL: empty);
 * send_json takes j's reference. */
enum MHD_Result q35_http_send(struct MHD_Connection *c, unsigned status, const char *type, char *body, size_t len);
enum MHD_Result q35_http_send_json(struct MHD_Connection *c, unsigned status, json_t *j);
enum MHD_Result q35_http_send_error(struct MHD_Connection *c, unsigned status, const char *msg, const char *param);
/* The request's Origin when --allowed-origins allows it, else NULL. */
const char *q35_http_allowed_origin(struct MHD_Connection *c);
/* The headers every response gets: CORS for an allowed origin, Retry-After on 429 and 503. */
void q35_http_headers(struct MHD_Connection *c, struct MHD_Response *r, unsigned status);

/* The connection's socket, and whether its peer hung up. */
int q35_http_fd(struct MHD_Connection *c);
bool q35_http_peer_gone(int fd);
/* Waits on t->cv for up to 100 ms (t->mu held), so a waiting route can
 * poll its socket between the scheduler's signals. */
void q35_http_wait(q35_task *t);

#endif
