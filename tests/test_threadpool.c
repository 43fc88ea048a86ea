/* Tests of the thread pool and of determinism across thread counts. */
#include "golden.h"
#include "qwen35.h"
#include "test.h"
#include "backend/cpu/compute.h"
#include "backend/cpu/threadpool.h"
#include "formats/bfp.h"

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

/* Home ranges with stealing (q35_homes), on one thread: a worker takes
 * halves of its own home front to back, then the others' items one at a
 * time from their backs, next worker first; every item once. */
TEST(pool, homes_give_a_worker_its_own_halves_then_the_others_backs) {
    q35_homes h;
    q35_homes_init(&h, 10, 3); /* homes [0,3) [3,6) [6,10) */
    CHECK_EQ_INT(h.parts, 3);
    const int64_t want[][2] = {{0, 2}, {2, 3}, {5, 6}, {4, 5}, {3, 4}, {9, 10}, {8, 9}, {7, 8}, {6, 7}};
    int64_t lo, hi;
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        REQUIRE(q35_homes_claim(&h, 0, &lo, &hi));
        CHECK_MSG(lo == want[i][0] && hi == want[i][1], "claim %zu: [%ld, %ld)", i, (long)lo, (long)hi);
    }
    CHECK(!q35_homes_claim(&h, 0, &lo, &hi));
    CHECK(!q35_homes_claim(&h, 2, &lo, &hi));
    q35_homes_init(&h, 2, 5); /* more workers than items: workers 2-4 have no home and only steal */
    CHECK_EQ_INT(h.parts, 2);
    REQUIRE(q35_homes_claim(&h, 4, &lo, &hi)); /* worker (4 + 1) % 2's home first */
    CHECK(lo == 1 && hi == 2);
    REQUIRE(q35_homes_claim(&h, 1, &lo, &hi)); /* its own is empty: worker 0's */
    CHECK(lo == 0 && hi == 1);
    CHECK(!q35_homes_claim(&h, 0, &lo, &hi));
    q35_homes_init(&h, 0, 2);
    CHECK(!q35_homes_claim(&h, 1, &lo, &hi));
}

typedef struct { q35_homes h; _Atomic int taken[1000]; int64_t n; atomic_int disorder; } homes_job;

static void homes_worker(void *p, int ith, int nth) {
    homes_job *j = p;
    (void)nth;
    int64_t lo, hi, own_end = -1;
    while (q35_homes_claim(&j->h, ith, &lo, &hi)) {
        int64_t home_lo, home_hi;
        q35_split(j->n, 1, ith, j->h.parts, &home_lo, &home_hi);
        if (ith < j->h.parts && lo >= home_lo && hi <= home_hi) { /* own ranges: in increasing order */
            if (lo < own_end) atomic_fetch_add(&j->disorder, 1);
            own_end = hi;
        }
        for (int64_t i = lo; i < hi; i++) atomic_fetch_add(&j->taken[i], 1);
    }
}

/* On a pool of 2-5 workers racing for them, every item is taken exactly once. */
TEST(pool, homes_claimed_by_racing_workers_take_each_item_once) {
    static homes_job j;
    long bad = 0;
    for (int nth = 2; nth <= 5; nth++) {
        q35_pool *pool;
        q35_error err;
        REQUIRE(q35_pool_new(nth, &pool, &err) == Q35_OK);
        for (int r = 0; r < 200; r++) {
            j.n = r % 2 ? 1000 : 1 + r % 7; /* many items, and fewer than workers */
            for (int64_t i = 0; i < 1000; i++) atomic_store(&j.taken[i], 0);
            q35_homes_init(&j.h, j.n, nth);
            q35_pool_run(pool, homes_worker, &j);
            for (int64_t i = 0; i < 1000; i++) bad += atomic_load(&j.taken[i]) != (i < j.n);
        }
        q35_pool_free(pool);
    }
    CHECK_MSG(bad == 0, "%ld items taken other than once", bad);
    CHECK_EQ_INT(atomic_load(&j.disorder), 0);
}

/* The prompt three times over (144 rows) puts every part of a layer on the pool, the Gated DeltaNet's
 * heads and attention's units included (the 48-row prompt runs its heads inline), claimed by whichever
 * worker is free: 2 to 4 workers on however many cores, bit for bit against one thread. */
TEST(pool, logits_identical_for_any_thread_count) {
    golden g;
    REQUIRE(golden_load("tiny-c", &g) == 0);
    const size_t V = (size_t)g.vocab_size, n = (size_t)g.n_prompt, n_long = 3 * n;
    int32_t *ids = malloc(sizeof(int32_t) * n_long);
    REQUIRE(ids != NULL);
    for (size_t i = 0; i < n_long; i++) ids[i] = g.prompt_ids[i % n];
    float *ref = NULL, *ref_long = NULL;
    for (int th = 1; th <= 4; th++) {
        q35_engine_params p = {.n_threads = th};
        q35_engine *e;
        q35_session *s;
        q35_error err;
        REQUIRE(q35_engine_load(g.model_dir, &p, &e, &err) == Q35_OK);
        REQUIRE(q35_session_new(e, (int32_t)n_long, &s, &err) == Q35_OK);
        float *lg = malloc(sizeof(float) * V * n), *lg_long = malloc(sizeof(float) * V * n_long);
        REQUIRE(lg != NULL && lg_long != NULL);
        CHECK(q35_session_eval(s, g.prompt_ids, (int32_t)n, lg, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        q35_session_reset(s);
        CHECK(q35_session_eval(s, ids, (int32_t)n_long, lg_long, Q35_EVAL_ALL_LOGITS, &err) == Q35_OK);
        if (!ref) {
            ref = lg, ref_long = lg_long;
        } else {
            CHECK_MSG(memcmp(ref, lg, sizeof(float) * V * n) == 0, "%d threads give other logits", th);
            CHECK_MSG(memcmp(ref_long, lg_long, sizeof(float) * V * n_long) == 0,
                      "%d threads give other logits for %zu rows", th, n_long);
            free(lg), free(lg_long);
        }
        q35_session_free(s);
        q35_engine_free(e);
    }
    free(ref), free(ref_long), free(ids);
    golden_free(&g);
}

/* A [n_out, n_in] BFP4 matrix of pseudo-random values (its own buffer in t->data). */
static int bfp4_matrix(q35_tensor *t, int64_t n_out, int64_t n_in, uint32_t seed) {
    size_t nb = q35_bfp_tensor_bytes(Q35_DT_BFP4, n_out, n_in);
    float *f = malloc(sizeof(float) * (size_t)(n_out * n_in));
    void *d = aligned_alloc(64, (nb + 63) & ~(size_t)63);
    if (!f || !d) return 0;
    for (int64_t i = 0; i < n_out * n_in; i++) {
        seed = seed * 1664525u + 1013904223u;
        f[i] = (float)(seed >> 8) / 8388608.0f - 1.0f;
    }
    int ok = q35_bfp_pack_matrix(Q35_DT_BFP4, d, nb, f, Q35_DT_F32, n_out, n_in, 0, NULL) == Q35_OK;
    free(f);
    *t = (q35_tensor){.name = "w", .dtype = Q35_DT_BFP4, .ndim = 2, .shape = {n_out, n_in}, .data = d, .nbytes = nb};
    return ok;
}

/* Matmuls are claimed in shrinking ranges by whichever worker is free
 * (compute.c), so which worker computes which rows changes from call to
 * call; the results must not. Two matrices in one handoff (a range may span
 * both) and the SwiGLU MLP, on pools of 2 and 3 workers, 30 times each with
 * x and -x in turn in one buffer (a worker quantizes x once per job, never
 * across jobs), bit for bit against one thread: decode, a verify step, a
 * batch, and 9 and 37 tokens (prompts: the wide path). */
TEST(pool, matmuls_claimed_by_free_workers_match_one_thread) {
    enum { N_IN = 512, A = 400, B = 208, I = 704, H = 512, MAX_TOK = 37 };
    q35_tensor Wa, Wb, Wg, Wu, Wd;
    REQUIRE(bfp4_matrix(&Wa, A, N_IN, 1) && bfp4_matrix(&Wb, B, N_IN, 2) && bfp4_matrix(&Wg, I, N_IN, 3) &&
            bfp4_matrix(&Wu, I, N_IN, 4) && bfp4_matrix(&Wd, H, I, 5));
    static float x[MAX_TOK * N_IN], ya[MAX_TOK * A], yb[MAX_TOK * B], ra[2 * MAX_TOK * A], rb[2 * MAX_TOK * B];
    static float out[MAX_TOK * H], rout[2 * MAX_TOK * H], gate[MAX_TOK * I], up[MAX_TOK * I];
    for (int i = 0; i < MAX_TOK * N_IN; i++) x[i] = (float)((i * 7919) % 2001) / 1000.0f - 1.0f;
    const q35_host one = {.k = q35_kernels_get()};
    const q35_tensor *Ws[2] = {&Wa, &Wb};
    const int toks[5] = {1, 2, 8, 9, 37};
    long bad = 0;
    for (int n = 2; n <= 3; n++) {
        q35_pool *pool;
        q35_error err;
        REQUIRE(q35_pool_new(n, &pool, &err) == Q35_OK);
        const q35_host many = {.k = q35_kernels_get(), .pool = pool};
        for (int ti = 0; ti < 5; ti++) {
            const int nt = toks[ti];
            float *ys[2] = {ya, yb};
            for (int sign = 0; sign < 2; sign++) { /* x, then -x in the same buffer */
                float *rys[2] = {ra + sign * MAX_TOK * A, rb + sign * MAX_TOK * B};
                q35_matmul_multi(&one, 2, rys, Ws, x, nt);
                q35_mlp(&one, rout + sign * MAX_TOK * H, gate, up, &Wg, &Wu, &Wd, x, nt);
                for (int i = 0; i < MAX_TOK * N_IN; i++) x[i] = -x[i];
            }
            for (int r = 0; r < 30; r++) { /* x's contents change between calls: no call may reuse the last x */
                const int sign = r % 2;
                q35_matmul_multi(&many, 2, ys, Ws, x, nt);
                q35_mlp(&many, out, gate, up, &Wg, &Wu, &Wd, x, nt);
                bad += memcmp(ya, ra + sign * MAX_TOK * A, sizeof(float) * (size_t)(nt * A)) != 0;
                bad += memcmp(yb, rb + sign * MAX_TOK * B, sizeof(float) * (size_t)(nt * B)) != 0;
                bad += memcmp(out, rout + sign * MAX_TOK * H, sizeof(float) * (size_t)(nt * H)) != 0;
                for (int i = 0; i < MAX_TOK * N_IN; i++) x[i] = -x[i];
            }
        }
        q35_pool_free(pool);
    }
    CHECK_MSG(bad == 0, "%ld results differ from one thread's", bad);
    free((void *)Wa.data), free((void *)Wb.data), free((void *)Wg.data), free((void *)Wu.data), free((void *)Wd.data);
}
