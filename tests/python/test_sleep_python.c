// ctest-labels: unit
// ctest-timeout: 120
/*
 * Runs tests/sleep_python_check.py: tags, sleep and wake from Python (python/vmmalloc/sleepwake.py)
 * over the shared library on the simulated driver. Skipped (77) when python3 is missing and in
 * ThreadSanitizer builds (python3 cannot host a TSan library; test_sleep covers the same calls).
 */
#include "testutil.h"

int main(void) { return vmm_test_run_python("tests/sleep_python_check.py", ""); }
