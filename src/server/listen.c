/* listen.c: the accept thread (listen.h). One poll() loop over the
 * listening socket, a wake-up pipe and the connections it holds:
 *   waiting   admitted, its first request line not arrived whole yet. The
 *             line is looked at with MSG_PEEK (the library reads it again),
 *             and SO_RCVLOWAT is raised past what has been seen, so a line
 *             that trickles in wakes the loop once per new piece instead of
 *             spinning; it is set back to 1 before the hand-over. Its
 *             deadline is --request-timeout (2 s at most in the reserve), as
 *             the watchdog's for the rest of the head.
 *   lingering refused: its answer sent and its sending side shut; what the
 *             client sends is read and dropped until it closes, for at most
 *             Q35_LINGER_SECONDS and Q35_LINGER_BYTES, then it is closed.
 * Accepted sockets are non-blocking from accept4; the answers are under
 * 1 KiB on a fresh socket, so one send() never blocks. */
#include "server/listen.h"
#include "server/wire.h"
#include "base/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

struct q35_listen_entry {
    int fd;
    bool lingering;            /* else waiting for its request line */
    double deadline;           /* q35_now_seconds() */
    size_t seen;               /* waiting: bytes peeked; lingering: bytes dropped */
    q35_addr addr;             /* waiting: its admission */
    struct sockaddr_storage sa;
    socklen_t sa_len;
};

int q35_listen_open(q35_listener *l, const char *host, int port, int backlog) {
    memset(l, 0, sizeof *l);
    l->fd = l->wake[0] = l->wake[1] = -1;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof ss);
    struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
    socklen_t len;
    if (inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
        sin->sin_family = AF_INET;
        sin->sin_port = htons((uint16_t)port);
        len = sizeof *sin;
    } else if (inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
        sin6->sin6_family = AF_INET6;
        sin6->sin6_port = htons((uint16_t)port);
        len = sizeof *sin6;
    } else {
        fprintf(stderr, "qwen35 serve: --host must be a numeric IPv4 or IPv6 address, got '%s'\n", host);
        return 2;
    }
    int one = 1;
    l->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (l->fd < 0 || setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) ||
        (ss.ss_family == AF_INET6 && setsockopt(l->fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one)) ||
        bind(l->fd, (struct sockaddr *)&ss, len) || listen(l->fd, backlog) ||
        pipe2(l->wake, O_CLOEXEC | O_NONBLOCK)) {
        fprintf(stderr, "qwen35 serve: cannot listen on %s:%d: %s\n", host, port, strerror(errno));
        q35_listen_close(l);
        return 1;
    }
    len = sizeof ss;
    getsockname(l->fd, (struct sockaddr *)&ss, &len);
    l->port = ntohs(ss.ss_family == AF_INET6 ? sin6->sin6_port : sin->sin_port);
    return 0;
}

/* Reads and drops what fd has now; false when the client closed or erred. */
static bool drop_input(int fd, size_t *dropped) {
    char buf[4096];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n > 0) { *dropped += (size_t)n; if (*dropped > Q35_LINGER_BYTES) return false; continue; }
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR);
    }
}

/* Removes entry i (the last one takes its place); closes its socket unless keep. */
static void entry_drop(q35_listener *l, int i, bool keep) {
    q35_listen_entry *e = &l->ent[i];
    if (!e->lingering && !keep) q35_conn_release(l->conns, &e->addr);
    if (e->lingering) drop_input(e->fd, &e->seen); /* what is left unread would turn the close into a reset */
    if (!keep) close(e->fd);
    l->ent[i] = l->ent[--l->n_ent];
}

/* Sends status's JSON answer on fd, shuts its sending side and lets it
 * linger (taking over entry i when i >= 0, else a new entry). */
static void refuse(q35_listener *l, int fd, int i, int status, const char *msg) {
    char resp[1024];
    size_t n = q35_wire_error(status, msg, resp, sizeof resp);
    if (n) (void)!send(fd, resp, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(fd, SHUT_WR);
    int lingering = 0, oldest = -1;
    for (int k = 0; k < l->n_ent; k++)
        if (l->ent[k].lingering) {
            lingering++;
            if (oldest < 0 || l->ent[k].deadline < l->ent[oldest].deadline) oldest = k;
        }
    if (i < 0 && (lingering >= Q35_LINGER_MAX || l->n_ent == l->cap_ent)) {
        if (oldest < 0) { close(fd); return; }
        entry_drop(l, oldest, false);
    }
    if (i < 0) i = l->n_ent++;
    l->ent[i] = (q35_listen_entry){.fd = fd, .lingering = true, .deadline = q35_now_seconds() + Q35_LINGER_SECONDS};
}

/* A waiting connection has bytes (or closed): hand it over, refuse it, or wait on. */
static void check_waiting(q35_listener *l, int i) {
    q35_listen_entry *e = &l->ent[i];
    char buf[Q35_REQUEST_LINE_MAX];
    ssize_t n = recv(e->fd, buf, sizeof buf, MSG_PEEK);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) { entry_drop(l, i, false); return; } /* the client left before its request */
    int status = q35_wire_request_line(buf, (size_t)n);
    int one = 1;
    if (status == 0) {
        int more = (int)n + 1;
        setsockopt(e->fd, SOL_SOCKET, SO_RCVLOWAT, &more, sizeof more);
        e->seen = (size_t)n;
        return;
    }
    setsockopt(e->fd, SOL_SOCKET, SO_RCVLOWAT, &one, sizeof one);
    if (status == 200) {
        int fd = e->fd;
        struct sockaddr_storage sa = e->sa;
        socklen_t sa_len = e->sa_len;
        q35_addr a = e->addr;
        entry_drop(l, i, true);
        /* the library owns fd from here, and closes it even when it fails */
        if (MHD_add_connection(l->daemon, fd, (struct sockaddr *)&sa, sa_len) != MHD_YES) q35_conn_release(l->conns, &a);
        return;
    }
    char msg[160];
    if (status == 414) snprintf(msg, sizeof msg, "the request line is over this server's limit of %d bytes", Q35_REQUEST_LINE_MAX);
    else if (status == 505) snprintf(msg, sizeof msg, "HTTP version not supported (use HTTP/1.1 or HTTP/1.0)");
    else snprintf(msg, sizeof msg, "malformed request line (expected METHOD TARGET HTTP/1.1)");
    q35_conn_release(l->conns, &e->addr);
    q35_conn_count_malformed(l->conns);
    refuse(l, e->fd, i, status, msg);
}

static void accept_some(q35_listener *l) {
    for (int k = 0; k < 64; k++) {
        q35_listen_entry e = {.sa_len = sizeof e.sa};
        e.fd = accept4(l->fd, (struct sockaddr *)&e.sa, &e.sa_len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (e.fd < 0) {
            if (errno == EINTR || errno == ECONNABORTED) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                /* out of descriptors: let the oldest lingering one go, else wait a little */
                int oldest = -1;
                for (int j = 0; j < l->n_ent; j++)
                    if (l->ent[j].lingering && (oldest < 0 || l->ent[j].deadline < l->ent[oldest].deadline)) oldest = j;
                if (oldest >= 0) entry_drop(l, oldest, false);
                else nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
            }
            return;
        }
        e.addr = q35_addr_of((struct sockaddr *)&e.sa);
        bool reserve;
        char msg[200];
        switch (q35_conn_admit(l->conns, &e.addr, &reserve)) {
        case Q35_ADMIT_OK: {
            double t = l->request_timeout_s;
            e.deadline = q35_now_seconds() + (reserve && t > 2 ? 2 : t);
            l->ent[l->n_ent++] = e; /* admitted ones never pass slots + reserve: there is room */
            break;
        }
        case Q35_ADMIT_PER_CLIENT:
            snprintf(msg, sizeof msg, "too many connections from your address (this server allows %d per client, "
                     "--max-conns-per-client); retry later", l->conns->max_per_client);
            refuse(l, e.fd, -1, 429, msg);
            break;
        case Q35_ADMIT_FULL:
            snprintf(msg, sizeof msg, "the server is at its connection limit (%d); retry later",
                     l->conns->slots + Q35_CONN_RESERVED);
            refuse(l, e.fd, -1, 503, msg);
            break;
        }
    }
}

static void *listen_main(void *arg) {
    q35_listener *l = arg;
    struct pollfd *p = malloc((size_t)(l->cap_ent + 2) * sizeof *p);
    if (!p) return NULL;
    for (;;) {
        double now = q35_now_seconds(), next = now + 1;
        for (int i = l->n_ent - 1; i >= 0; i--)
            if (l->ent[i].deadline <= now) entry_drop(l, i, false);
            else if (l->ent[i].deadline < next) next = l->ent[i].deadline;
        p[0] = (struct pollfd){.fd = l->fd, .events = POLLIN};
        p[1] = (struct pollfd){.fd = l->wake[0], .events = POLLIN};
        for (int i = 0; i < l->n_ent; i++) p[2 + i] = (struct pollfd){.fd = l->ent[i].fd, .events = POLLIN};
        int n_polled = l->n_ent;
        int ms = (int)((next - now) * 1000) + 1;
        if (poll(p, (nfds_t)(2 + n_polled), ms) < 0 && errno != EINTR) nanosleep(&(struct timespec){0, 10 * 1000000L}, NULL);
        if (p[1].revents) break;
        /* from the end: a removal moves the last entry, which is already done, into i */
        for (int i = n_polled - 1; i >= 0; i--) {
            if (!p[2 + i].revents) continue;
            q35_listen_entry *e = &l->ent[i];
            if (!e->lingering) check_waiting(l, i);
            else if (!drop_input(e->fd, &e->seen)) entry_drop(l, i, false);
        }
        if (p[0].revents & POLLIN) accept_some(l);
    }
    free(p);
    return NULL;
}

int q35_listen_start(q35_listener *l, struct MHD_Daemon *d, q35_conns *conns, double request_timeout_s) {
    l->daemon = d;
    l->conns = conns;
    l->request_timeout_s = request_timeout_s;
    l->cap_ent = conns->slots + Q35_CONN_RESERVED + Q35_LINGER_MAX;
    l->ent = calloc((size_t)l->cap_ent, sizeof *l->ent);
    if (!l->ent || pthread_create(&l->thread, NULL, listen_main, l)) return -1;
    l->running = true;
    return 0;
}

void q35_listen_close(q35_listener *l) {
    if (l->running) {
        (void)!write(l->wake[1], "x", 1);
        pthread_join(l->thread, NULL);
        l->running = false;
    }
    while (l->n_ent > 0) entry_drop(l, l->n_ent - 1, false);
    free(l->ent);
    l->ent = NULL;
    int *fds[] = {&l->fd, &l->wake[0], &l->wake[1]};
    for (int i = 0; i < 3; i++)
        if (*fds[i] >= 0) { close(*fds[i]); *fds[i] = -1; }
}
