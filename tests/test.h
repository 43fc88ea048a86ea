/* tests/test.h: the project's single test harness.
 *
 * A test is a function registered at load time with TEST(group, name). The
 * runner (tests/test_main.c) runs every test, or only the groups named on its
 * command line, and ends with the line "N passed, N failed". CHECK* macros
 * record a failure and keep going; REQUIRE* record it and leave the test, for
 * when later lines would dereference something that is not there. */
#ifndef Q35_TEST_H
#define Q35_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*q35_test_fn)(void);
void q35_test_register(const char *group, const char *name, q35_test_fn fn);
void q35_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
int q35_test_failed_now(void);

/* Path of the repository root's tests/data directory (set by the runner). */
const char *q35_test_data_dir(void);
/* Builds "<data dir>/<rel>" into a static rotating buffer. */
const char *q35_test_path(const char *rel);
/* A fresh, empty temporary directory for this test, removed by the runner. */
const char *q35_test_tmpdir(void);

#define TEST(group, name)                                                  \
    static void test_##group##_##name(void);                               \
    __attribute__((constructor)) static void reg_##group##_##name(void) {  \
        q35_test_register(#group, #name, test_##group##_##name);           \
    }                                                                      \
    static void test_##group##_##name(void)

#define CHECK(cond)                                                        \
    do { if (!(cond)) q35_test_fail(__FILE__, __LINE__, "CHECK(%s)", #cond); } while (0)
#define CHECK_MSG(cond, ...)                                               \
    do { if (!(cond)) q35_test_fail(__FILE__, __LINE__, __VA_ARGS__); } while (0)
#define REQUIRE(cond)                                                      \
    do { if (!(cond)) { q35_test_fail(__FILE__, __LINE__, "REQUIRE(%s)", #cond); return; } } while (0)
#define REQUIRE_MSG(cond, ...)                                             \
    do { if (!(cond)) { q35_test_fail(__FILE__, __LINE__, __VA_ARGS__); return; } } while (0)
#define CHECK_EQ_INT(a, b)                                                 \
    do { long long a_ = (long long)(a), b_ = (long long)(b);               \
         if (a_ != b_) q35_test_fail(__FILE__, __LINE__, "%s == %s (%lld vs %lld)", #a, #b, a_, b_); } while (0)
#define CHECK_STR_EQ(a, b)                                                 \
    do { const char *a_ = (a), *b_ = (b);                                  \
         if (!a_ || !b_ || strcmp(a_, b_) != 0)                            \
             q35_test_fail(__FILE__, __LINE__, "%s == %s (\"%s\" vs \"%s\")", #a, #b, a_ ? a_ : "(null)", b_ ? b_ : "(null)"); } while (0)
#define CHECK_NEAR(a, b, tol)                                              \
    do { double a_ = (a), b_ = (b);                                        \
         if (!(fabs(a_ - b_) <= (tol))) q35_test_fail(__FILE__, __LINE__, "|%s - %s| <= %g (%.9g vs %.9g)", #a, #b, (double)(tol), a_, b_); } while (0)

#endif
