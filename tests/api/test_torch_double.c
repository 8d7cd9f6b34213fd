// ctest-labels: unit
// ctest-timeout: 120
// ctest-cudadouble: only
/*
 * The PyTorch entry points over the cuda driver on the CUDA double's two devices (what the double can
 * show of torch.distributed's needs, docs/pytorch.md "Distributed"): one allocator per device, created
 * on first use with "device:N"; peers granted (peer_access:all by default: a kernel of the other device
 * may read and write each device's blocks, checked with the double's device_access); a free given
 * the wrong device still finds its allocator; per-device memory fractions (PyTorch's hook); and the
 * mapping callbacks a communication library registers memory with (NCCL's ncclCommRegister on a GPU)
 * report each device's own mappings with their physical handles. Everything is returned at the end.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef VMM_HAVE_CUDA_H
int main(void)
{
    printf("built without the CUDA toolkit: no CUDA double (skipped)\n");
    return 77;
}
#else

#include <cuda.h>

#include "cudadouble.h"
#include "testutil.h"
#include "vmmalloc.h"

#define MiB ((size_t)1 << 20)

typedef struct mapping_log {
    int calls, wrong_device, handles_missing, device;
    size_t bytes;
} mapping_log;

static void on_map(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *handles, size_t n)
{
    mapping_log *m = ctx;
    (void)va;
    m->calls++;
    m->bytes += size;
    if (device != m->device)
        m->wrong_device++;
    if (n == 0 || !handles || !handles[0])
        m->handles_missing++;
}

int main(void)
{
    setenv("VMMALLOC_CONF", "driver:cuda", 1);
    void *p0 = vmm_torch_malloc((ptrdiff_t)(6 * MiB), 0, NULL); /* loads libcuda.so.1: the double */
    const cudadouble_hooks_t *hooks = cudadouble_hooks();
    if (!hooks) {
        printf("the CUDA double is not loaded (run through ctest as test_torch_double): skipped\n");
        return 77;
    }
    void *p1 = vmm_torch_malloc((ptrdiff_t)(6 * MiB), 1, NULL);
    CHECK(p0 != NULL && p1 != NULL);
    if (!p0 || !p1) {
        char msg[2048];
        vmm_torch_last_error(msg, sizeof msg);
        fprintf(stderr, "%s\n", msg);
        TEST_DONE();
    }
    vmm_allocator *a0 = NULL, *a1 = NULL;
    CHECK_OK(vmm_torch_get_allocator(0, &a0));
    CHECK_OK(vmm_torch_get_allocator(1, &a1));
    CHECK(a0 && a1 && a0 != a1);
    char conf[4096];
    CHECK(vmm_config_string(a1, conf, sizeof conf) > 0 && strstr(conf, "device:1") != NULL);
    CHECK(vmm_config_string(a0, conf, sizeof conf) > 0 && strstr(conf, "device:0") != NULL);

    /* peers granted both ways; each device reaches its own memory too */
    uint32_t word = 0xC0FFEEu;
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)p0, sizeof word, &word, 1), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(0, (CUdeviceptr)(uintptr_t)p1, sizeof word, &word, 1), CUDA_SUCCESS);
    uint32_t back = 0;
    CHECK_EQ(hooks->device_access(0, (CUdeviceptr)(uintptr_t)p0, sizeof back, &back, 0), CUDA_SUCCESS);
    CHECK_EQ(back, 0xC0FFEEu); /* device 1's write is in device 0's memory */

    /* registration hooks: each device's mappings, reported with its ordinal and handles */
    mapping_log m0 = {0, 0, 0, 0, 0}, m1 = {0, 0, 0, 1, 0};
    CHECK_OK(vmm_set_mapping_callbacks(a0, on_map, NULL, &m0));
    CHECK_OK(vmm_set_mapping_callbacks(a1, on_map, NULL, &m1));
    CHECK(m0.calls >= 1 && m1.calls >= 1); /* what was mapped already */
    size_t before0 = m0.bytes;
    void *big = vmm_torch_malloc((ptrdiff_t)(40 * MiB), 0, NULL);
    CHECK(big != NULL);
    CHECK(m0.bytes >= before0 + 40 * MiB);
    CHECK_EQ(m0.wrong_device, 0);
    CHECK_EQ(m1.wrong_device, 0);
    CHECK_EQ(m0.handles_missing + m1.handles_missing, 0);
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)big + 30 * MiB, sizeof word, &word, 1),
             CUDA_SUCCESS); /* memory mapped later reaches the peer too */

    /* per-device fraction: device 1 capped at half, device 0 not */
    double f = 0;
    size_t cap1 = 0, cap0 = 0;
    vmm_torch_set_memory_fraction(0.5, 1);
    CHECK_OK(vmm_torch_get_memory_fraction(1, &f, &cap1));
    CHECK(f == 0.5);
    CHECK_OK(vmm_torch_get_memory_fraction(0, &f, &cap0));
    CHECK(f == 1.0 && cap1 > 0 && cap1 <= cap0 / 2);
    CHECK(vmm_torch_malloc((ptrdiff_t)(cap1 + 64 * MiB), 1, NULL) == NULL);
    CHECK_EQ(vmm_torch_malloc_status(), VMM_ENOMEM);

    /* frees naming the wrong device find the right allocator */
    vmm_torch_free(p0, (ptrdiff_t)(6 * MiB), 1, NULL);
    vmm_torch_free(p1, (ptrdiff_t)(6 * MiB), 0, NULL);
    vmm_torch_free(big, (ptrdiff_t)(40 * MiB), 0, NULL);
    CHECK_OK(vmm_check(a0));
    CHECK_OK(vmm_check(a1));
    CHECK_OK(vmm_set_mapping_callbacks(a0, NULL, NULL, NULL));
    CHECK_OK(vmm_set_mapping_callbacks(a1, NULL, NULL, NULL));
    vmm_torch_shutdown();
    vmm_sim_counters live;
    unsigned ctxs = 0;
    hooks->live(&live, &ctxs);
    CHECK_EQ(live.live_handles, 0);
    CHECK_EQ(live.mapped_bytes, 0);
    CHECK_EQ(live.reserved_va_bytes, 0);
    TEST_DONE();
}
#endif
