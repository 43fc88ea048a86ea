/* conn.c: the connection table and its watchdog (conn.h). libmicrohttpd
 * tells us of every connection it accepts and closes; each record keeps a
 * duplicate of the socket, so the watchdog can shut a connection down
 * (which wakes the connection's thread out of its poll) without racing the
 * library's close of its own descriptor. */
#include "server/conn.h"

#include <fcntl.h>
#include <string.h>
#include <stdlib.h>
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
    q35_stream_watch *watch;   /* the streaming response, or NULL */
};

long long q35_conn_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void q35_conns_init(q35_conns *t, int slots, double request_timeout_s, double write_timeout_s) {
    memset(t, 0, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->slots = slots;
    t->request_timeout_s = request_timeout_s;
    t->write_timeout_s = write_timeout_s;
}

void q35_conn_notify(void *cls, struct MHD_Connection *c, void **socket_context, enum MHD_ConnectionNotificationCode code) {
    q35_conns *t = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        q35_conn *k = calloc(1, sizeof *k);
        if (!k) return; /* untracked: libmicrohttpd's idle limit still applies */
        const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
        k->table = t;
        k->fd = ci ? fcntl(ci->connect_fd, F_DUPFD_CLOEXEC, 0) : -1;
        k->t_start_ms = q35_conn_now_ms();
        k->pending = true;
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
    if (!k) return;
    pthread_mutex_lock(&t->mu);
    if (k->prev) k->prev->next = k->next; else t->head = k->next;
    if (k->next) k->next->prev = k->prev;
    t->n--;
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

void q35_conn_count_reserved_refusal(q35_conns *t) {
    pthread_mutex_lock(&t->mu);
    t->reserved_refused++;
    pthread_mutex_unlock(&t->mu);
}

void q35_conn_watch(q35_conns *t, struct MHD_Connection *c, q35_stream_watch *w) {
    atomic_store(&w->t_progress_ms, q35_conn_now_ms());
    q35_conn *k = conn_of(c);
    if (!k) return;
    pthread_mutex_lock(&t->mu);
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
    *st = (q35_conn_stats){t->n, t->timed_out, t->stalled, t->overflowed, t->reserved_refused};
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

/* Under t->mu: a stream that stalled or holds too much unread output is
 * cancelled (its decode slot frees at the scheduler's next step) and its
 * connection shut; true when it was. */
static bool check_stream(q35_conns *t, q35_conn *k, long long now) {
    q35_stream_watch *w = k->watch;
    q35_task *r = w->task;
    pthread_mutex_lock(&r->mu);
    size_t n_ev = r->n_ev;
    pthread_mutex_unlock(&r->mu);
    size_t backlog = n_ev - atomic_load(&w->consumed);
    bool stalled = !atomic_load(&w->in_reader) && now - atomic_load(&w->t_progress_ms) > (long long)(t->write_timeout_s * 1000);
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

void q35_conns_destroy(q35_conns *t) { pthread_mutex_destroy(&t->mu); }
