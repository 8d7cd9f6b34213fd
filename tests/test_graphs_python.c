// ctest-labels: unit
// ctest-timeout: 120
/*
 * Runs tests/graphs_python_check.py: vmmalloc.graphs (the CUDA graph hooks shim, built here with the
 * C++ compiler; capture refusal; mem_pool) with a fake torch, over the shared library on the
 * simulated driver. Skipped (77) when python3 is missing and in ThreadSanitizer builds (python3
 * cannot host a TSan library; test_graph_hooks and test_capture cover the same calls).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "testutil.h"

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
    const char *py = vmm_test_python();
    if (!py) {
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
             "env " PRELOAD " VMMALLOC_LIB='%s' VMMALLOC_CONF='driver:sim,sim_capacity:1G' %s '%s'", lib, py,
             vmm_test_source_path("tests/graphs_python_check.py"));
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
    TEST_DONE();
}
