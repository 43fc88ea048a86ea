/* conn.c: the connection table and its watchdog (conn.h). The listener
 * admits a connection (counted per address and in all) when it accepts it;
 * libmicrohttpd tells us of every connection it takes and closes, and the
 * close gives the admission back. Each record keeps a
 * duplicate of the socket, so the watchdog can shut a connection down
 * (which wakes the connection's thread out of its poll) without racing the
 * library's close of its own descriptor. */
#include "server/conn.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <stddef.h>
#include <string.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct q35_conn {
    q35_conn *next, *prev;
    q35_conns *table;          /* the table it is in */
    int fd;                    /* our duplicate of the socket, or -1 */
    long long t_start_ms;      /* when the pending request's deadline started */
    bool pending;              /* a request is being received (the deadline runs) */
    bool reserved;             /* accepted over the request slots */
    bool killed;               /* shut down by the watchdog */
    bool has_thread;           /* thread is set (q35_conn_bind_thread) */
    pthread_t thread;          /* the library's thread serving it */
    q35_addr addr;             /* the client's, as admitted */
    q35_stream_watch *watch;   /* the streaming response, or NULL */
};

long long q35_conn_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int q35_conns_init(q35_conns *t, int slots, int max_per_client, double request_timeout_s, double write_timeout_s) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->slots = slots;
    t->max_per_client = max_per_client;
    t->request_timeout_s = request_timeout_s;
    t->write_timeout_s = write_timeout_s;
    t->addrs = calloc((size_t)(slots + Q35_CONN_RESERVED), sizeof *t->addrs);
    return t->addrs ? 0 : -1;
}

q35_addr q35_addr_of(const struct sockaddr *sa) {
    q35_addr a;
    memset(&a, 0, sizeof a);
    if (!sa) return a;
    a.family = sa->sa_family;
    if (sa->sa_family == AF_INET) memcpy(a.bytes, &((const struct sockaddr_in *)sa)->sin_addr, 4);
    else if (sa->sa_family == AF_INET6) memcpy(a.bytes, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
    return a;
}

/* Under t->mu: a's entry, or -1. */
static int addr_find(const q35_conns *t, const q35_addr *a) {
    for (int i = 0; i < t->n_addrs; i++)
        if (!memcmp(&t->addrs[i].addr, a, sizeof *a)) return i;
    return -1;
}

q35_admit q35_conn_admit(q35_conns *t, const q35_addr *a, bool *in_reserve) {
    pthread_mutex_lock(&t->mu);
    *in_reserve = t->admitted >= t->slots;
    q35_admit r = Q35_ADMIT_OK;
    int i = addr_find(t, a);
    if (t->max_per_client > 0 && i >= 0 && t->addrs[i].n >= t->max_per_client) r = Q35_ADMIT_PER_CLIENT;
    else if (t->admitted >= t->slots + Q35_CONN_RESERVED) r = Q35_ADMIT_FULL;
    if (r == Q35_ADMIT_OK) {
        if (i < 0) { /* fewer addresses than admitted connections: there is room */
            i = t->n_addrs++;
            t->addrs[i] = (q35_addr_count){*a, 0};
        }
        t->addrs[i].n++;
        t->admitted++;
    } else if (r == Q35_ADMIT_PER_CLIENT) {
        t->refused_per_client++;
    } else {
        t->refused_full++;
    }
    pthread_mutex_unlock(&t->mu);
    return r;
}

/* Under t->mu. */
static void release_locked(q35_conns *t, const q35_addr *a) {
    int i = addr_find(t, a);
    if (i < 0) return;
    t->admitted--;
    if (--t->addrs[i].n == 0) t->addrs[i] = t->addrs[--t->n_addrs];
}

void q35_conn_release(q35_conns *t, const q35_addr *a) {
    pthread_mutex_lock(&t->mu);
    release_locked(t, a);
    pthread_mutex_unlock(&t->mu);
}

void q35_conn_count_malformed(q35_conns *t) {
    pthread_mutex_lock(&t->mu);
    t->malformed++;
    pthread_mutex_unlock(&t->mu);
}

static q35_addr client_addr(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    return q35_addr_of(ci ? ci->client_addr : NULL);
}

void q35_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    q35_conns *t = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        q35_conn *k = calloc(1, sizeof *k);
        if (!k) return; /* untracked: libmicrohttpd's idle limit still applies; the close releases it below */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->table = t;
        k->fd = ci ? fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
        k->t_start_ms = q35_conn_now_ms();
        k->pending = true;
        k->addr = client_addr(c);
        pthread_mutex_lock(&t->mu);
        k->reserved = ++t->n > t->slots;
        k->next = t->head;
        if (t->head) t->head->prev = k;
        t->head = k;
        pthread_mutex_unlock(&t->mu);
        *socket_context = k;
        return;
    }
    q35_conn *k = *socket_context;
    if (!k) {
        q35_addr a = client_addr(c);
        q35_conn_release(t, &a);
        return;
    }
    pthread_mutex_lock(&t->mu);
    if (k->prev) k->prev->next = k->next; else t->head = k->next;
    if (k->next) k->next->prev = k->prev;
    t->n--;
    release_locked(t, &k->addr);
    pthread_mutex_unlock(&t->mu);
    if (k->fd >= 0) close(k->fd);
    free(k);
    *socket_context = NULL;
}

static q35_conn *conn_of(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

q35_conns *q35_conn_table_of(struct MHD_Connection *c) {
    q35_conn *k = conn_of(c);
    return k ? k->table : NULL;
}

void q35_conn_request_done(q35_conns *t, struct MHD_Connection *c) {
    q35_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    k->pending = false;
    pthread_mutex_unlock(&t->mu);
}

void q35_conn_response_done(q35_conns *t, struct MHD_Connection *c) {
    q35_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    k->pending = true;
    k->t_start_ms = q35_conn_now_ms();
    pthread_mutex_unlock(&t->mu);
}

bool q35_conn_reserved(q35_conns *t, struct MHD_Connection *c) {
    q35_conn *k = conn_of(c);
    pthread_mutex_lock(&t->mu);
    bool r = k && k->reserved;
    pthread_mutex_unlock(&t->mu);
    return r;
}

void q35_conn_bind_thread(q35_conns *t, struct MHD_Connection *c) {
    q35_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    k->thread = pthread_self();
    k->has_thread = true;
    pthread_mutex_unlock(&t->mu);
}

int q35_conn_fd_of_thread(q35_conns *t) {
    int fd = -1;
    pthread_t me = pthread_self();
    pthread_mutex_lock(&t->mu);
    for (q35_conn *k = t->head; k; k = k->next)
        if (k->has_thread && pthread_equal(k->thread, me)) {
            if (k->pending && !k->killed) fd = k->fd;
            break;
        }
    pthread_mutex_unlock(&t->mu);
    return fd;
}

void q35_conn_count_reserved_refusal(q35_conns *t) {
    pthread_mutex_lock(&t->mu);
    t->reserved_refused++;
    pthread_mutex_unlock(&t->mu);
}

void q35_conn_watch(q35_conns *t, struct MHD_Connection *c, q35_stream_watch *w) {
    q35_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    w->acked = 0;
    w->t_acked_ms = 0;
    k->watch = w;
    pthread_mutex_unlock(&t->mu);
}

void q35_conn_unwatch(q35_conns *t, q35_stream_watch *w) {
    pthread_mutex_lock(&t->mu);
    for (q35_conn *k = t->head; k; k = k->next)
        if (k->watch == w) k->watch = NULL;
    pthread_mutex_unlock(&t->mu);
}

void q35_conns_stats(q35_conns *t, q35_conn_stats *st) {
    pthread_mutex_lock(&t->mu);
    *st = (q35_conn_stats){t->n, t->timed_out, t->stalled, t->overflowed, t->reserved_refused,
                           t->refused_per_client, t->refused_full, t->malformed};
    pthread_mutex_unlock(&t->mu);
}

int q35_conns_answering(q35_conns *t) {
    int n = 0;
    pthread_mutex_lock(&t->mu);
    for (q35_conn *k = t->head; k; k = k->next) n += !k->pending;
    pthread_mutex_unlock(&t->mu);
    return n;
}

static void conn_kill(q35_conn *k) {
    if (k->fd >= 0) shutdown(k->fd, SHUT_RDWR);
    k->killed = true;
}

size_t q35_stream_backlog(q35_stream_watch *w) {
    /* consumed first: the reader only counts events that were in n_ev, and
     * n_ev only grows, so this n_ev is at least that consumed. The other
     * order lets the reader pass a stale n_ev in between: the difference
     * would wrap to a huge backlog and cancel a stream that keeps up. */
    size_t consumed = atomic_load(&w->consumed);
    pthread_mutex_lock(&w->task->mu);
    size_t n_ev = w->task->n_ev;
    pthread_mutex_unlock(&w->task->mu);
    return n_ev - consumed;
}

/* Under t->mu: whether the client took none of the bytes waiting for it
 * in the (TCP) socket for longer than limit_ms. Its acknowledgements show
 * what it takes: the socket's send buffer accepts a stream's output for a
 * while after the client stopped reading (seconds on a slow backend), and a
 * client that reads slowly but steadily leaves the buffer full, so that our
 * writes wait longer than it does. False where the kernel does not count
 * acknowledged bytes (before Linux 4.1): there only the backlog cap holds. */
static bool acks_stalled(q35_stream_watch *w, int fd, long long now, long long limit_ms) {
    struct tcp_info ti;
    socklen_t len = sizeof ti;
    int queued = 0;
    if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) ||
        len < offsetof(struct tcp_info, tcpi_bytes_acked) + sizeof ti.tcpi_bytes_acked || ioctl(fd, SIOCOUTQ, &queued))
        return false;
    if (!w->t_acked_ms || queued == 0 || ti.tcpi_bytes_acked != w->acked) {
        w->acked = ti.tcpi_bytes_acked;
        w->t_acked_ms = now;
        return false;
    }
    return now - w->t_acked_ms > limit_ms;
}

/* Under t->mu: a stream that stalled or holds too much unread output is
 * cancelled (its decode slot frees at the scheduler's next step) and its
 * connection shut; true when it was. A stream stalls when its client
 * acknowledged none of the bytes waiting in the socket for --write-timeout. */
static bool check_stream(q35_conns *t, q35_conn *k, long long now) {
    q35_stream_watch *w = k->watch;
    q35_task *r = w->task;
    size_t backlog = q35_stream_backlog(w);
    bool stalled = acks_stalled(w, k->fd, now, (long long)(t->write_timeout_s * 1000));
    if (!stalled && backlog <= Q35_STREAM_BACKLOG_MAX) return false;
    atomic_store(&r->cancelled, 1);
    conn_kill(k);
    if (stalled) t->stalled++; else t->overflowed++;
    return true;
}

static void *watchdog_main(void *arg) {
    q35_conns *t = arg;
    long long req_ms = (long long)(t->request_timeout_s * 1000);
    long long reserve_ms = req_ms < 2000 ? req_ms : 2000;
    while (!atomic_load(&t->stop)) {
        struct timespec nap = {0, 100 * 1000000L};
        nanosleep(&nap, NULL);
        long long now = q35_conn_now_ms();
        pthread_mutex_lock(&t->mu);
        for (q35_conn *k = t->head; k; k = k->next) {
            if (k->killed) continue;
            if (k->pending && now - k->t_start_ms > (k->reserved ? reserve_ms : req_ms)) {
                conn_kill(k);
                t->timed_out++;
            } else if (k->watch) {
                check_stream(t, k, now);
            }
        }
        pthread_mutex_unlock(&t->mu);
    }
    return NULL;
}

int q35_conns_start(q35_conns *t) {
    if (pthread_create(&t->thread, NULL, watchdog_main, t)) return -1;
    t->running = true;
    return 0;
}

void q35_conns_stop(q35_conns *t) {
    if (!t->running) return;
    atomic_store(&t->stop, 1);
    pthread_join(t->thread, NULL);
    t->running = false;
}

void q35_conns_destroy(q35_conns *t) {
    pthread_mutex_destroy(&t->mu);
    free(t->addrs);
    t->addrs = NULL;
}
