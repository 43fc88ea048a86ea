/* tests/test_main.c: the test runner.
 *
 * Usage: test_runner [GROUP...]. With no argument every registered test
 * runs. Each test gets a fresh temporary directory. The last line printed is
 * "N passed, N failed" so that CI and people read the same verdict. */

#include "test.h"

#include <stdarg.h>
#include <stdint.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct { const char *group, *name; q35_test_fn fn; } test_entry;

static test_entry *g_tests;
static int g_n_tests, g_cap_tests;
static int g_cur_failures;
static char g_data_dir[2048] = "tests/data";
static char g_tmpdir[4096];

void q35_test_register(const char *group, const char *name, q35_test_fn fn) {
    if (g_n_tests == g_cap_tests) {
        g_cap_tests = g_cap_tests ? 2 * g_cap_tests : 64;
        g_tests = realloc(g_tests, sizeof *g_tests * (size_t)g_cap_tests);
        if (!g_tests) abort();
    }
    g_tests[g_n_tests++] = (test_entry){group, name, fn};
}

void q35_test_fail(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    g_cur_failures++;
    if (g_cur_failures > 20) return; /* one broken loop should not flood the log */
    fprintf(stderr, "    %s:%d: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

int q35_test_failed_now(void) { return g_cur_failures; }
const char *q35_test_data_dir(void) { return g_data_dir; }

const char *q35_test_path(const char *rel) {
    static char bufs[8][4096];
    static int next;
    char *b = bufs[next++ & 7];
    snprintf(b, sizeof bufs[0], "%s/%s", g_data_dir, rel);
    return b;
}

const char *q35_test_tmpdir(void) {
    if (!g_tmpdir[0]) {
        const char *base = getenv("TMPDIR");
        snprintf(g_tmpdir, sizeof g_tmpdir, "%s/q35test.XXXXXX", base && *base ? base : "/tmp");
        if (!mkdtemp(g_tmpdir)) { perror("mkdtemp"); abort(); }
    }
    return g_tmpdir;
}

static void remove_tmpdir(void) {
    if (!g_tmpdir[0]) return;
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", g_tmpdir);
    g_tmpdir[0] = 0;
}

static int selected(const test_entry *t, int argc, char **argv) {
    if (argc <= 1) return 1;
    for (int i = 1; i < argc; i++) {
        char full[512];
        snprintf(full, sizeof full, "%s.%s", t->group, t->name);
        if (!strcmp(argv[i], t->group) || !strcmp(argv[i], full)) return 1;
    }
    return 0;
}

static int cmp_tests(const void *a, const void *b) {
    const test_entry *x = a, *y = b;
    int c = strcmp(x->group, y->group);
    return c ? c : strcmp(x->name, y->name);
}

int main(int argc, char **argv) {
    const char *dd = getenv("Q35_TEST_DATA");
    if (dd && *dd) snprintf(g_data_dir, sizeof g_data_dir, "%s", dd);
    qsort(g_tests, (size_t)g_n_tests, sizeof *g_tests, cmp_tests);
    int passed = 0, failed = 0;
    for (int i = 0; i < g_n_tests; i++) {
        test_entry *t = &g_tests[i];
        if (!selected(t, argc, argv)) continue;
        g_cur_failures = 0;
        struct timespec t0, t1;
        clock_gettime(CLOCK_MONOTONIC, &t0);
        t->fn();
        clock_gettime(CLOCK_MONOTONIC, &t1);
        remove_tmpdir();
        double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
        if (g_cur_failures) {
            failed++;
            printf("FAIL %s.%s (%d failures, %.0f ms)\n", t->group, t->name, g_cur_failures, ms);
        } else {
            passed++;
            printf("ok   %s.%s (%.0f ms)\n", t->group, t->name, ms);
        }
        fflush(stdout);
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
