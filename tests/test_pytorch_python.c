// ctest-labels: unit
// ctest-timeout: 120
/*
 * Runs tests/test_python_helper.py (the vmmalloc Python package over the shared library, on the
 * simulated driver, without PyTorch). Skipped (77) when python3 is missing, and in
 * ThreadSanitizer builds (TSan cannot run inside an uninstrumented python3: it crashes at start,
 * preloaded or not; test_pytorch_alloc covers the same entry points under TSan). Fails when the
 * script fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "testutil.h"

/* In an AddressSanitizer build the library needs the sanitizer runtime loaded first into python3
 * (which is not instrumented): preload it, and leave Python's own allocations alone. */
#if defined(__SANITIZE_ADDRESS__)
#define PRELOAD "LD_PRELOAD=\"$(${CC:-cc} -print-file-name=libasan.so) " \
                "$(${CC:-cc} -print-file-name=libubsan.so)\" ASAN_OPTIONS=detect_leaks=0"
#else
#define PRELOAD ""
#endif

int main(void)
{
#if defined(__SANITIZE_THREAD__)
    fprintf(stderr, "ThreadSanitizer build: python3 cannot host the library: skipped\n");
    return 77;
#endif
    if (system("python3 -c 'import ctypes, json' >/dev/null 2>&1") != 0) {
        fprintf(stderr, "python3 not available: skipped\n");
        return 77;
    }
    const char *lib = getenv("VMM_SHARED_LIB");
    if (!lib) {
        fprintf(stderr, "VMM_SHARED_LIB is not set (run through ctest)\n");
        return 1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "env " PRELOAD " VMMALLOC_LIB='%s' VMMALLOC_CONF='driver:sim,sim_capacity:1G' python3 '%s'",
             lib, vmm_test_source_path("tests/test_python_helper.py"));
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
    TEST_DONE();
}
