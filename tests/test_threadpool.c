/* Tests of the thread pool and of determinism across thread counts. */
#include "golden.h"
#include "qwen35.h"
#include "test.h"
#include "backend/cpu/threadpool.h"

#include <stdatomic.h>

typedef struct { atomic_int calls; int seen[64]; int nth; } job;

static void count_job(void *p, int ith, int nth) {
    job *j = p;
    atomic_fetch_add(&j->calls, 1);
    j->seen[ith]++;
    j->nth = nth;
}

TEST(pool, every_worker_runs_once_per_job) {
    for (int n = 1; n <= 5; n++) {
        q35_pool *pool;
        q35_error err;
        REQUIRE(q35_pool_new(n, &pool, &err) == Q35_OK);
        CHECK_EQ_INT(q35_pool_size(pool), n);
        job j = {0};
        for (int r = 0; r < 300; r++) q35_pool_run(pool, count_job, &j); /* spins, sleeps, wakes */
        CHECK_EQ_INT(atomic_load(&j.calls), 300 * n);
        for (int i = 0; i < n; i++) CHECK_EQ_INT(j.seen[i], 300);
        CHECK_EQ_INT(j.nth, n);
        q35_pool_free(pool);
    }
}

TEST(pool, split_covers_aligned_ranges) {
    for (int64_t n = 0; n < 300; n += 7)
        for (int nth = 1; nth <= 6; nth++) {
            int64_t next = 0;
            for (int i = 0; i < nth; i++) {
                int64_t lo, hi;
                q35_split(n, 16, i, nth, &lo, &hi);
                CHECK(lo == next && hi >= lo && hi <= n);
                CHECK(lo % 16 == 0 || lo == n);
                next = hi;
            }
            CHECK_EQ_INT(next, n);
        }
}

TEST(pool, logits_identical_for_any_thread_count) {
    golden g;
    REQUIRE(golden_load("tiny-c", &g) == 0);
    size_t V = (size_t)g.vocab_size, n = (size_t)g.n_prompt;
    float *ref = NULL;
    for (int th = 1; th <= 4; th++) {
        q35_engine_params p = {.n_threads = th};
        q35_engine *e;
        q35_session *s;
        q35_error err;
        REQUIRE(q35_engine_load(g.model_dir, &p, &e, &err) == Q35_OK);
        REQUIRE(q35_session_new(e, 64, &s, &err) == Q35_OK);
        float *lg = malloc(sizeof(float) * V * n);
        CHECK(q35_session_eval(s, g.prompt_ids, (int32_t)n, lg, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        if (!ref) ref = lg;
        else {
            CHECK_MSG(memcmp(ref, lg, sizeof(float) * V * n) == 0, "%d threads give other logits", th);
            free(lg);
        }
        q35_session_free(s);
        q35_engine_free(e);
    }
    free(ref);
    golden_free(&g);
}
