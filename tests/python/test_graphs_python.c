// ctest-labels: unit
// ctest-timeout: 120
/*
 * Runs tests/graphs_python_check.py: vmmalloc.graphs (the CUDA graph hooks shim, built here with the
 * C++ compiler; capture refusal; mem_pool) with a fake torch, over the shared library on the
 * simulated driver. Skipped (77) when python3 is missing and in ThreadSanitizer builds (python3
 * cannot host a TSan library; test_graph_hooks and test_capture cover the same calls).
 */
#include "testutil.h"

int main(void) { return vmm_test_run_python("tests/graphs_python_check.py", ""); }
