/* test_conn.c: the connection watchdog's view of a stream (src/server/conn.c):
 * the backlog it reads while the stream's reader keeps pace. No sockets. */
#include "server/conn.h"
#include "test.h"

#include <pthread.h>
#include <string.h>

typedef struct {
    q35_task task;
    q35_stream_watch w;
    atomic_int stop;
} lockstep;

/* The scheduler appends one event and the reader takes it at once, as
 * fast as they can. */
static void *lockstep_main(void *arg) {
    lockstep *s = arg;
    while (!atomic_load(&s->stop)) {
        pthread_mutex_lock(&s->task.mu);
        size_t n = ++s->task.n_ev;
        pthread_mutex_unlock(&s->task.mu);
        atomic_store(&s->w.consumed, n);
    }
    return NULL;
}

TEST(conn, a_stream_backlog_read_while_the_reader_runs_never_wraps) {
    static lockstep s;
    memset(&s, 0, sizeof s);
    pthread_mutex_init(&s.task.mu, NULL);
    s.w.task = &s.task;
    pthread_t th;
    CHECK(pthread_create(&th, NULL, lockstep_main, &s) == 0);
    /* a backlog is at most the events there are; a wrapped difference
     * (the reader past a stale count) is near SIZE_MAX */
    size_t worst = 0, worst_n = 0;
    for (int i = 0; i < 1000000; i++) {
        size_t b = q35_stream_backlog(&s.w);
        pthread_mutex_lock(&s.task.mu);
        size_t n = s.task.n_ev;
        pthread_mutex_unlock(&s.task.mu);
        if (b > n && b > worst) { worst = b; worst_n = n; }
    }
    atomic_store(&s.stop, 1);
    pthread_join(th, NULL);
    pthread_mutex_destroy(&s.task.mu);
    CHECK(s.task.n_ev > 1000); /* the reader did run alongside */
    CHECK_MSG(worst == 0, "backlog read as %zu events with %zu there", worst, worst_n);
}

TEST(conn, the_backlog_is_what_the_reader_has_left) {
    q35_task task;
    memset(&task, 0, sizeof task);
    pthread_mutex_init(&task.mu, NULL);
    q35_stream_watch w = {.task = &task};
    task.n_ev = 40;
    atomic_store(&w.consumed, 15);
    CHECK(q35_stream_backlog(&w) == 25);
    atomic_store(&w.consumed, 40);
    CHECK(q35_stream_backlog(&w) == 0);
    pthread_mutex_destroy(&task.mu);
}
