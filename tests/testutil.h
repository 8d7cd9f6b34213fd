/* Minimal test helpers: CHECK records a failure and goes on; tests end with TEST_DONE(). */
#ifndef VMM_TESTUTIL_H
#define VMM_TESTUTIL_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>

#include "vmmalloc.h"

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

/* Data-survival pattern: byte i*stride of p[0..n) gets (seed + i), the last byte gets seed.
 * A stride of one page or less touches every page, so a page mapped wrongly or lost shows. */
void vmm_test_fill(void *p, size_t n, unsigned seed, size_t stride);
/* 1 when p[0..n) still holds what vmm_test_fill(p, n, seed, stride) wrote, else 0. */
int vmm_test_intact(const void *p, size_t n, unsigned seed, size_t stride);

/* vmm_get_stats into a zeroed struct (a failure is counted as a CHECK failure). */
vmm_stats vmm_test_stats(vmm_allocator *a);
/* The number under `key` in vmm_stats_json's output (a flat key such as "lanes.mallocs"), -1 when
 * absent or on error. Thread safe. */
long long vmm_test_json_num(vmm_allocator *a, const char *key);
/* CHECK that no simulated device in the process holds anything any more (vmm_sim_global_live all
 * zero: physical bytes, handles, mappings, VA, classic allocations, streams, events). */
void vmm_test_check_no_sim_leaks(void);

/* A simulated kernel that holds its stream until the test opens the gate: launch
 * vmm_test_gate_wait with a vmm_test_gate (zero-initialised); it sets done when it ends. */
typedef struct vmm_test_gate {
    atomic_int open, done;
} vmm_test_gate;
void vmm_test_gate_wait(void *gate);

/* $VMM_PYTHON, else the system's python3 (a version manager's shim on PATH can take seconds to
 * start), else python3 from PATH; NULL when there is none. */
const char *vmm_test_python(void);
/* Runs the PyTorch script at source path rel with python3 and VMMALLOC_LIB set to this build's
 * library (VMM_SHARED_LIB): its exit status (0 pass, 77 skip, else fail); 77 in sanitizer builds (an
 * instrumented library cannot be loaded into PyTorch's process) and without python3. */
int vmm_test_run_torch_script(const char *rel);
/* Run the Python script `script` (a path relative to the source tree) with extra arguments `args`
 * ("" for none) on the vmmalloc package over the shared library ($VMM_SHARED_LIB, set by ctest) and
 * the simulated driver (sim_capacity 1G). Returns the test's exit status: 0 when the script passed,
 * 1 when it failed, 77 (skip) when python3 is missing and in ThreadSanitizer builds (an
 * uninstrumented python3 cannot host a TSan library). In AddressSanitizer builds the sanitizer
 * runtimes are preloaded into python3 and leak checking is left off (Python's own allocations). */
int vmm_test_run_python(const char *script, const char *args);

/* gpu tests: what to do after trying to open the cuda driver with result `r` (a vmm_drv_result)
 * and message `msg`. Returns 77 (skip) only when no CUDA driver is installed (NOT_INITIALIZED: no
 * libcuda.so.1 or the toolkit's stub) or it sees no device (NO_DEVICE); 1 (fail) for any other
 * failure, and for every failure when VMM_EXPECT_CUDA_DOUBLE=1 (the run is meant to use the CUDA
 * double, tests/cudadouble); 0 to go on. When the open succeeded it also fails (1) if the loaded
 * libcuda.so.1 is the double while VMM_EXPECT_CUDA_DOUBLE is unset, or a real driver while it is
 * set: the double must never pass for a GPU, nor a GPU for the double. Prints why. */
int vmm_test_gpu_gate(int r, const char *msg);
/* A CUDA Driver API entry point of the libcuda.so.1 already loaded in this process, resolved with
 * cuGetProcAddress_v2 at version 12000 (as the library resolves its own), for tests that observe
 * the driver directly; NULL when not loaded or not found. Cast to the PFN of that version. */
void *vmm_test_cu_proc(const char *symbol);
/* 1 when the libcuda.so.1 loaded in this process is the CUDA double. */
int vmm_test_cuda_is_double(void);

#endif
