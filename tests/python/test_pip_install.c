// ctest-labels: python
// ctest-timeout: 300
/*
 * pip install as a user does it, offline, into fresh virtual environments: runs
 * tests/pip_install_check.py with the system's python3 (vmm_test_python). It builds the package
 * twice with CMake (a wheel from the tree, an sdist installed with build isolation), so it takes
 * some 30 s. Fails (never skips) when python3, pip or venv is missing: CI runs
 * ./tools/deps.sh --test first, which installs them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>

#include "testutil.h"

int main(void)
{
    const char *python = vmm_test_python();
    if (!python) {
        fprintf(stderr, "test_pip_install: python3 is not installed: run ./tools/deps.sh --test\n");
        return 1;
    }
    char cmd[4096];
    /* the sanitizer runtimes of this program must not leak into python and the compilers */
    snprintf(cmd, sizeof cmd, "env -u LD_PRELOAD -u ASAN_OPTIONS -u TSAN_OPTIONS %s '%s'", python,
             vmm_test_source_path("tests/pip_install_check.py"));
    int st = system(cmd);
    CHECK(st != -1 && WIFEXITED(st));
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    if (rc == 2)
        fprintf(stderr, "test_pip_install: pip or venv missing for %s: run ./tools/deps.sh --test\n", python);
    CHECK_EQ(rc, 0);
    TEST_DONE();
}
