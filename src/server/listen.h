/* listen.h: the server's listening socket and its accept thread
 * (listen.c). libmicrohttpd's own accept can only close a connection it
 * will not take; this thread accepts instead, admits each connection in
 * the table (conn.h), answers those over --max-conns-per-client with 429
 * and those over all connection slots with 503 (JSON bodies, Retry-After,
 * Connection: close), holds each admitted one until its first request
 * line has arrived and checks it (wire.h: a bad one gets its JSON 400,
 * 414 or 505 here), and hands the rest to the daemon with
 * MHD_add_connection. A refused connection is closed gracefully: its
 * answer, then shutdown(SHUT_WR), then what the client still sends is
 * read and dropped for a short while, so the client reads the answer
 * instead of a reset. */
#ifndef Q35_SERVER_LISTEN_H
#define Q35_SERVER_LISTEN_H

#include "server/conn.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdbool.h>

/* Refused connections lingering at once (more: the oldest is closed). */
enum { Q35_LINGER_MAX = 1024 };
/* How long a refused connection lingers, and how much is read from it. */
#define Q35_LINGER_SECONDS 2.0
enum { Q35_LINGER_BYTES = 256 << 10 };

typedef struct q35_listen_entry q35_listen_entry;
typedef struct q35_listener {
    int fd;                    /* the listening socket */
    int wake[2];               /* a pipe: a byte stops the thread */
    int port;                  /* the bound port */
    pthread_t thread;
    bool running;
    struct MHD_Daemon *daemon; /* where admitted connections go */
    q35_conns *conns;
    double request_timeout_s;  /* for a first request line */
    q35_listen_entry *ent;     /* connections held: waiting for a request line, or lingering */
    int n_ent, cap_ent;
} q35_listener;

/* Binds host:port (a numeric IPv4 or IPv6 address) with the given listen
 * backlog: 0, or the exit status (2: not a numeric address, 1: cannot
 * listen), the reason printed. */
int q35_listen_open(q35_listener *l, const char *host, int port, int backlog);
/* Starts the accept thread handing connections to d; 0 or -1. */
int q35_listen_start(q35_listener *l, struct MHD_Daemon *d, q35_conns *conns, double request_timeout_s);
/* Stops the thread (if started) and closes the socket and every connection it holds. */
void q35_listen_close(q35_listener *l);

#endif
