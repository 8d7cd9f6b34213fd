// ctest-labels: gpu
// ctest-timeout: 1800
/*
 * Runs tests/gpu_torch_train.py: a small transformer trained with PyTorch's native allocator,
 * with expandable_segments:True and with vmmalloc installed; losses must match. The script exits
 * 77 (skip) without PyTorch or a usable CUDA device, and so does this wrapper in sanitizer builds
 * (an instrumented library cannot be loaded into PyTorch's process).
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "testutil.h"

int main(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    fprintf(stderr, "sanitizer build: the PyTorch run needs an uninstrumented library: skipped\n");
    return 77;
#else
    const char *lib = getenv("VMM_SHARED_LIB");
    if (!lib) {
        fprintf(stderr, "VMM_SHARED_LIB is not set (run through ctest)\n");
        return 1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "env VMMALLOC_LIB='%s' python3 '%s'", lib,
             vmm_test_source_path("tests/gpu_torch_train.py"));
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) {
        fprintf(stderr, "could not run python3\n");
        return 1;
    }
    int rc = WEXITSTATUS(st);
    if (rc == 127) {
        fprintf(stderr, "python3 not found: skipped\n");
        return 77;
    }
    return rc; /* 0 pass, 77 skip, else fail */
#endif
}
