// ctest-labels: unit
// ctest-timeout: 120
/*
 * Runs tests/pytorch_python_check.py (the vmmalloc Python package over the shared library, on the
 * simulated driver, without PyTorch). Skipped (77) when python3 is missing, and in
 * ThreadSanitizer builds (TSan cannot run inside an uninstrumented python3: it crashes at start,
 * preloaded or not; test_pytorch_alloc covers the same entry points under TSan). Fails when the
 * script fails.
 */
#include "testutil.h"

int main(void) { return vmm_test_run_python("tests/pytorch_python_check.py", ""); }
