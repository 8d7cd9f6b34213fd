// ctest-labels: unit
// ctest-timeout: 180
/*
 * Runs tests/torch_dropin_check.py: torch.cuda's memory functions (memory_stats, memory_allocated,
 * max_memory_*, reset_*, _record_memory_history, _snapshot, _dump_snapshot, memory_snapshot,
 * set/get_per_process_memory_fraction, empty_cache, torch.accelerator's) answered by vmmalloc after
 * vmmalloc.torch.install(), over the shared library on the simulated driver: against a stand-in
 * torch that mimics PyTorch 2.11's entry points and wrappers, and against the real PyTorch Python
 * layer when one is importable. Skipped (77) when python3 is missing and in ThreadSanitizer builds
 * (python3 cannot host a TSan library; test_pytorch_alloc covers the C entry points under TSan).
 */
#include "testutil.h"

int main(void) { return vmm_test_run_python("tests/torch_dropin_check.py", ""); }
