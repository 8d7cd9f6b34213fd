// ctest-labels: gpu
// ctest-timeout: 900
/*
 * Runs tests/gpu_torch_dropin.py: torch.cuda's memory API, memory caps, snapshots, out of memory as
 * torch.OutOfMemoryError and a NCCL process group, all with vmmalloc installed (docs/pytorch.md).
 * The script exits 77 (skip) without PyTorch or a usable CUDA device, and so does this wrapper in
 * sanitizer builds (an instrumented library cannot be loaded into PyTorch's process).
 */
#include "testutil.h"

int main(void)
{
    return vmm_test_run_torch_script("tests/gpu_torch_dropin.py"); /* 0 pass, 77 skip, else fail */
}
