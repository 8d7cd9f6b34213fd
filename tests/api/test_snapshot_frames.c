// ctest-labels: unit
// ctest-timeout: 180
/*
 * Runs tests/snapshot_frames.py: Python and native call stacks in snapshots, recorded through the
 * vmmalloc Python package on the simulated driver (no PyTorch), checked with
 * tests/snapshot_check.py. Skipped (77) when python3 is missing and in ThreadSanitizer builds
 * (TSan cannot run inside an uninstrumented python3; test_history and test_snapshot cover the same
 * recording under TSan). VMM_FRAMES_BENCH=1 adds the cost measurement (--bench).
 */
#include <stdlib.h>

#include "testutil.h"

int main(void) { return vmm_test_run_python("tests/snapshot_frames.py", getenv("VMM_FRAMES_BENCH") ? "--bench" : ""); }
