/* Minimal test helpers: CHECK records a failure and goes on; tests end with TEST_DONE(). */
#ifndef VMM_TESTUTIL_H
#define VMM_TESTUTIL_H

#include <stdio.h>
#include <stdlib.h>

extern int vmm_test_failures;

#define CHECK(cond)                                                                        \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);       \
            vmm_test_failures++;                                                           \
        }                                                                                  \
    } while (0)

/* Compare two integers, printing both on failure. */
#define CHECK_EQ(a, b)                                                                     \
    do {                                                                                   \
        long long a_ = (long long)(a), b_ = (long long)(b);                                \
        if (a_ != b_) {                                                                    \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %lld, %s == %lld\n", __FILE__,  \
                    __LINE__, #a, a_, #b, b_);                                             \
            vmm_test_failures++;                                                           \
        }                                                                                  \
    } while (0)

/* A vmm status must be VMM_OK; prints vmm_last_error() otherwise. */
#define CHECK_OK(expr)                                                                     \
    do {                                                                                   \
        int rc_ = (expr);                                                                  \
        if (rc_ != 0) {                                                                    \
            fprintf(stderr, "%s:%d: %s returned %d (%s)\n", __FILE__, __LINE__, #expr, rc_, \
                    vmm_test_last_error());                                                \
            vmm_test_failures++;                                                           \
        }                                                                                  \
    } while (0)

#define TEST_DONE()                                                                        \
    do {                                                                                   \
        if (vmm_test_failures) {                                                           \
            fprintf(stderr, "%d check(s) failed\n", vmm_test_failures);                    \
            return 1;                                                                      \
        }                                                                                  \
        return 0;                                                                          \
    } while (0)

const char *vmm_test_last_error(void);
/* Monotonic clock in nanoseconds. */
unsigned long long vmm_test_now_ns(void);
/* Sleep for ms milliseconds. */
void vmm_test_sleep_ms(unsigned ms);
/* Path under the source tree (VMM_SOURCE_DIR from ctest, else "."); static buffer. */
const char *vmm_test_source_path(const char *rel);

#endif
