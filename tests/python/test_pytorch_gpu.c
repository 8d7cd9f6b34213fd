// ctest-labels: gpu
// ctest-timeout: 1800
/*
 * Runs tests/gpu_torch_train.py: a small transformer trained with PyTorch's native allocator,
 * with expandable_segments:True and with vmmalloc installed; losses must match. The script exits
 * 77 (skip) without PyTorch or a usable CUDA device, and so does this wrapper in sanitizer builds
 * (an instrumented library cannot be loaded into PyTorch's process).
 */
#include "testutil.h"

int main(void)
{
    return vmm_test_run_torch_script("tests/gpu_torch_train.py"); /* 0 pass, 77 skip, else fail */
}
