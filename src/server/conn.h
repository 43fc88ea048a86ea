/* conn.h: the server's open connections (conn.c). The listener (listen.h)
 * admits each accepted socket here first: at most --max-conns-per-client
 * from one address and slots + Q35_CONN_RESERVED in all, counted from
 * accept to close. Every connection handed to libmicrohttpd then gets a
 * record: its deadline for a whole request
 * (head and body, --request-timeout, however slowly the bytes trickle in),
 * whether it was accepted over the request slots (then it may only ask for
 * /health, /metrics and /version, with a short deadline), and the streaming
 * response it carries, if any. A watchdog thread closes connections past
 * their deadline and cancels streams whose client stopped reading
 * (--write-timeout) or whose unread output passed its cap. */
#ifndef Q35_SERVER_CONN_H
#define Q35_SERVER_CONN_H

#include "server/sched.h"

#include <microhttpd.h>
#include <pthread.h>
#include <sys/socket.h>
#include <stdatomic.h>
#include <stdbool.h>

/* Connections accepted past the request slots, for /health and /metrics. */
enum { Q35_CONN_RESERVED = 16 };
/* Unread events a stream may hold before it is cancelled as too slow. */
enum { Q35_STREAM_BACKLOG_MAX = 32768 };
/* A streaming socket's send buffer (the kernel doubles it). */
enum { Q35_STREAM_SNDBUF = 64 << 10 };

/* What a streaming response shares with the watchdog. */
typedef struct q35_stream_watch {
    q35_task *task;
    atomic_size_t consumed;    /* events the reader has turned into output */
    /* the watchdog's own, under the table's lock: the socket's count of
     * bytes the client acknowledged, and when it last grew (or nothing
     * waited to be sent) */
    unsigned long long acked;
    long long t_acked_ms;      /* 0: not sampled yet */
} q35_stream_watch;

/* A client address (the port left out), the key of the per-client count. */
typedef struct q35_addr {
    sa_family_t family;
    unsigned char bytes[16];
} q35_addr;

typedef struct q35_addr_count {
    q35_addr addr;
    int n;
} q35_addr_count;

/* What q35_conn_admit decided. */
typedef enum { Q35_ADMIT_OK, Q35_ADMIT_PER_CLIENT, Q35_ADMIT_FULL } q35_admit;

typedef struct q35_conn q35_conn;
typedef struct q35_conns {
    pthread_mutex_t mu;
    q35_conn *head;
    int n;                     /* connections the library holds */
    int slots;                 /* connections before the reserve */
    int admitted;              /* accepted and not closed yet (the listener's and the library's) */
    int max_per_client;        /* 0: no limit */
    q35_addr_count *addrs;     /* admitted connections per address, n_addrs of them (slots + reserve at most) */
    int n_addrs;
    double request_timeout_s, write_timeout_s;
    pthread_t thread;
    bool running;
    atomic_int stop;
    unsigned long long timed_out, stalled, overflowed, reserved_refused; /* under mu */
    unsigned long long refused_per_client, refused_full, malformed;     /* under mu */
    const void *owner;         /* the server, for code that holds only a connection */
} q35_conns;

typedef struct q35_conn_stats {
    int open;
    unsigned long long timed_out, stalled, overflowed, reserved_refused;
    unsigned long long refused_per_client, refused_full, malformed;
} q35_conn_stats;

/* 0, or -1 when the per-address table cannot be allocated. */
int q35_conns_init(q35_conns *t, int slots, int max_per_client, double request_timeout_s, double write_timeout_s);
/* Starts and stops the watchdog thread; 0 or -1. */
int q35_conns_start(q35_conns *t);
void q35_conns_stop(q35_conns *t);
void q35_conns_destroy(q35_conns *t);
void q35_conns_stats(q35_conns *t, q35_conn_stats *st);
/* Connections whose request has arrived and is not answered yet. */
int q35_conns_answering(q35_conns *t);

/* The address of a socket's peer, as counted. */
q35_addr q35_addr_of(const struct sockaddr *sa);
/* Counts an accepted connection from a in (Q35_ADMIT_OK), or says why not
 * (then nothing is counted, and the refusal is): over --max-conns-per-client
 * from a, or over slots + Q35_CONN_RESERVED in all. *in_reserve: whether it
 * lands past the slots. */
q35_admit q35_conn_admit(q35_conns *t, const q35_addr *a, bool *in_reserve);
/* Takes back an admission whose connection closed before the library took it. */
void q35_conn_release(q35_conns *t, const q35_addr *a);
/* Counts a malformed request answered below the routes (a JSON 400/413/414/431/505). */
void q35_conn_count_malformed(q35_conns *t);
/* The calling thread serves c from now on (thread per connection): the
 * library's protocol errors on this thread are c's (q35_conn_fd_of_thread). */
void q35_conn_bind_thread(q35_conns *t, struct MHD_Connection *c);
/* The duplicate socket of the connection the calling thread serves, when
 * it is waiting for a request (no response begun), else -1. */
int q35_conn_fd_of_thread(q35_conns *t);

/* libmicrohttpd's MHD_OPTION_NOTIFY_CONNECTION callback (cls: the table). */
void q35_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code);

/* The table c's record is in (its owner is the server), or NULL. */
q35_conns *q35_conn_table_of(struct MHD_Connection *c);
/* The request on c has arrived whole: no deadline until it is answered. */
void q35_conn_request_done(q35_conns *t, struct MHD_Connection *c);
/* The request on c was answered: the next one's deadline starts now. */
void q35_conn_response_done(q35_conns *t, struct MHD_Connection *c);
/* Whether c was accepted in the reserve (over the request slots). */
bool q35_conn_reserved(q35_conns *t, struct MHD_Connection *c);
/* Counts a refusal of a reserve connection's request. */
void q35_conn_count_reserved_refusal(q35_conns *t);
/* Puts a stream under the watchdog (w->task set, t_progress now) and takes
 * it off again (from any thread, also after the connection closed). */
void q35_conn_watch(q35_conns *t, struct MHD_Connection *c, q35_stream_watch *w);
void q35_conn_unwatch(q35_conns *t, q35_stream_watch *w);
/* Events of w's task its reader has not turned into output yet (from any
 * thread, while the reader runs). */
size_t q35_stream_backlog(q35_stream_watch *w);
long long q35_conn_now_ms(void);

#endif
