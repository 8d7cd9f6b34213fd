// ctest-labels: unit
// ctest-timeout: 180
/*
 * Runs tests/snapshot_frames.py: Python and native call stacks in snapshots, recorded through the
 * vmmalloc Python package on the simulated driver (no PyTorch), checked with
 * tests/snapshot_check.py. Skipped (77) when python3 is missing and in ThreadSanitizer builds
 * (TSan cannot run inside an uninstrumented python3; test_history and test_snapshot cover the same
 * recording under TSan). VMM_FRAMES_BENCH=1 adds the cost measurement (--bench).
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
    const char *python = vmm_test_python();
    if (!python) {
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
             "env " PRELOAD " VMMALLOC_LIB='%s' VMMALLOC_CONF='driver:sim,sim_capacity:1G' %s '%s'%s",
             lib, python, vmm_test_source_path("tests/snapshot_frames.py"),
             getenv("VMM_FRAMES_BENCH") ? " --bench" : "");
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st));
    CHECK_EQ(WIFEXITED(st) ? WEXITSTATUS(st) : -1, 0);
    TEST_DONE();
}
