/* Minimal C test harness: each CHECK prints nothing on success; each TEST prints one line
 * "PASS name" or "FAIL name: why" that tests/run.sh counts. Return test_summary() from main. */
#ifndef ZR_TEST_CHECK_H
#define ZR_TEST_CHECK_H

#include <math.h>
#include <stdio.h>

static int test_failed_flag, test_n_pass, test_n_fail;
static char test_why[512];

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond) && !test_failed_flag) {                                                        \
            test_failed_flag = 1;                                                                  \
            snprintf(test_why, sizeof test_why, "%s:%d: %s", __FILE__, __LINE__, #cond);           \
        }                                                                                          \
    } while (0)
#define CHECK_MSG(cond, ...)                                                                       \
    do {                                                                                           \
        if (!(cond) && !test_failed_flag) {                                                        \
            test_failed_flag = 1;                                                                  \
            int o_ = snprintf(test_why, sizeof test_why, "%s:%d: ", __FILE__, __LINE__);           \
            snprintf(test_why + o_, sizeof test_why - (size_t)o_, __VA_ARGS__);                   \
        }                                                                                          \
    } while (0)
#define CHECK_NEAR(a, b, tol)                                                                      \
    CHECK_MSG(fabs((double)(a) - (double)(b)) <= (tol), "%s = %.9g, expected %.9g (tol %g)", #a,   \
              (double)(a), (double)(b), (double)(tol))

#define TEST(name)                                                                                 \
    static void test_##name(void);                                                                 \
    static void run_##name(void) {                                                                 \
        test_failed_flag = 0;                                                                      \
        test_##name();                                                                             \
        if (test_failed_flag) {                                                                    \
            test_n_fail++;                                                                         \
            printf("FAIL %s: %s\n", #name, test_why);                                              \
        } else {                                                                                   \
            test_n_pass++;                                                                         \
            printf("PASS %s\n", #name);                                                            \
        }                                                                                          \
        fflush(stdout);                                                                            \
    }                                                                                              \
    static void test_##name(void)
#define RUN(name) run_##name()

static inline int test_summary(void) { return test_n_fail ? 1 : 0; }

#endif
