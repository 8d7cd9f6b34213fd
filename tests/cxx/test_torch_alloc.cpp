// ctest: test_torch_alloc (tests/cxx/CMakeLists.txt)
//
// The out-of-memory shim (python/vmmalloc/csrc/torch_alloc.cpp) as CUDAPluggableAllocator drives it:
// its alloc and free functions cast to the types torch/csrc/cuda/CUDAPluggableAllocator.cpp keeps
// (std::function<void *(size_t, int, cudaStream_t)> and std::function<void(void *, size_t, int,
// cudaStream_t)>), over libvmmalloc on the simulated device. Checked: a served allocation returns
// its pointer and the free returns it; size 0 returns NULL without throwing (as PyTorch's own
// allocator); out of memory throws with "CUDA out of memory. " and vmmalloc's report; another
// failure (a bad device) throws with its message, not as out of memory; the allocator is intact
// afterwards. Built here without torch's headers, the shim throws std::runtime_error; built with
// them (VMM_WITH_C10, torch.utils.cpp_extension) the same paths throw c10::OutOfMemoryError / c10::Error
// (torch.OutOfMemoryError / RuntimeError in Python), which test_torch_alloc_c10 checks where c10's
// headers and library are installed.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>

#include "vmmalloc.h"

#if defined(VMM_WITH_C10)
#include <c10/util/Exception.h>
#endif

struct CUstream_st;
using cudaStream_t = CUstream_st *;

extern "C" int vmm_torch_alloc_init(void *malloc_fn, void *free_fn, void *status, void *last_error);
extern "C" int vmm_torch_alloc_raises_c10(void);
extern "C" void *vmm_torch_alloc_malloc(size_t size, int device, cudaStream_t stream);
extern "C" void vmm_torch_alloc_free(void *ptr, size_t size, int device, cudaStream_t stream);

static int failures = 0;
#define CHECK(c)                                                                                   \
    do {                                                                                           \
        if (!(c)) {                                                                                \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #c);             \
            failures++;                                                                            \
        }                                                                                          \
    } while (0)

// What a caller sees: "oom: <what>", "error: <what>" or "none".
static std::string outcome(const std::function<void *(size_t, int, cudaStream_t)> &alloc, size_t size,
                           int device, void **out)
{
    *out = nullptr;
    try {
        *out = alloc(size, device, nullptr);
        return "none";
    }
#if defined(VMM_WITH_C10)
    catch (const c10::OutOfMemoryError &e) {
        return std::string("oom: ") + e.what();
    } catch (const c10::Error &e) {
        return std::string("error: ") + e.what();
    }
#else
    catch (const std::runtime_error &e) {
        std::string w = e.what();
        return (w.rfind("CUDA out of memory. ", 0) == 0 ? "oom: " : "error: ") + w;
    }
#endif
}

int main()
{
    setenv("VMMALLOC_CONF", "driver:sim,sim_capacity:256M", 1);
    CHECK(vmm_torch_alloc_init(nullptr, nullptr, nullptr, nullptr) == -1);
    CHECK(vmm_torch_alloc_init(reinterpret_cast<void *>(&vmm_torch_malloc), reinterpret_cast<void *>(&vmm_torch_free),
                               reinterpret_cast<void *>(&vmm_torch_malloc_status),
                               reinterpret_cast<void *>(&vmm_last_error)) == 0);
#if defined(VMM_WITH_C10)
    CHECK(vmm_torch_alloc_raises_c10() == 1);
#else
    CHECK(vmm_torch_alloc_raises_c10() == 0);
#endif
    // CUDAPluggableAllocator keeps the addresses as these std::function types
    std::function<void *(size_t, int, cudaStream_t)> alloc(
        reinterpret_cast<void *(*)(size_t, int, cudaStream_t)>(&vmm_torch_alloc_malloc));
    std::function<void(void *, size_t, int, cudaStream_t)> release(
        reinterpret_cast<void (*)(void *, size_t, int, cudaStream_t)>(&vmm_torch_alloc_free));

    void *live = nullptr, *p = nullptr;
    CHECK(outcome(alloc, 1 << 20, 0, &live) == "none");
    CHECK(live != nullptr);
    CHECK(outcome(alloc, 0, 0, &p) == "none"); // zero bytes: NULL, no exception
    CHECK(p == nullptr);

    std::string oom = outcome(alloc, size_t(1) << 30, 0, &p); // 1 GiB on a 256 MiB device
    std::fprintf(stderr, "out of memory: %s\n", oom.c_str());
    CHECK(oom.rfind("oom: ", 0) == 0);
    CHECK(oom.find("CUDA out of memory. ") != std::string::npos);
    CHECK(oom.find("vmmalloc: out of memory. Tried to allocate 1024.00 MiB") != std::string::npos);
    CHECK(oom.find("on device 0") != std::string::npos);
    CHECK(p == nullptr);

    std::string bad = outcome(alloc, 4096, VMM_TORCH_MAX_DEVICES, &p);
    CHECK(bad.rfind("error: ", 0) == 0);
    CHECK(bad.find("out of range") != std::string::npos);
    CHECK(bad.find("CUDA out of memory") == std::string::npos);

    // intact: the live block is still there, and the memory serves again
    char json[1 << 16];
    CHECK(vmm_torch_stats_json(0, json, sizeof json) > 0);
    CHECK(std::strstr(json, "\"allocation.all.current\":1,") != nullptr);
    CHECK(std::strstr(json, "\"num_ooms\":1,") != nullptr);
    void *q = nullptr;
    CHECK(outcome(alloc, 100 << 20, 0, &q) == "none");
    CHECK(q != nullptr);
    release(q, 100 << 20, 0, nullptr);
    void *first = nullptr;
    CHECK(outcome(alloc, 1 << 20, 0, &first) == "none"); // reuse of a freed block works
    release(first, 1 << 20, 0, nullptr);
    release(live, 1 << 20, 0, nullptr);
    vmm_allocator *a = nullptr;
    CHECK(vmm_torch_get_allocator(0, &a) == VMM_OK);
    CHECK(vmm_check(a) == VMM_OK);
    vmm_torch_shutdown();
    if (failures)
        std::fprintf(stderr, "test_torch_alloc: %d failure(s)\n", failures);
    return failures ? 1 : 0;
}
