// vmmalloc's malloc for PyTorch's CUDAPluggableAllocator, raising PyTorch's out-of-memory error.
//
// CUDAPluggableAllocator::malloc stores whatever its alloc function returns, NULL included, and
// hands it to the tensor (torch/csrc/cuda/CUDAPluggableAllocator.cpp), so a plain NULL on out of
// memory becomes a null data pointer that kernels later write through. An exception thrown by the
// alloc function propagates instead, up through the op to Python (RMM's allocator relies on this:
// pytorch#133280). This file wraps libvmmalloc's vmm_torch_malloc: on failure it throws
//   - c10::OutOfMemoryError (Python: torch.OutOfMemoryError, torch.cuda.OutOfMemoryError) for
//     VMM_ENOMEM, with "CUDA out of memory. " and vmmalloc's report as the message, when built
//     against the running torch's headers and libc10 (python/vmmalloc/_cxx.py: VMM_WITH_C10, the
//     include and library paths torch.utils.cpp_extension reports, torch's C++ ABI flag): the same
//     exception PyTorch's own caching allocator throws;
//   - c10::Error (RuntimeError) for other failures (a refused graph capture, a driver error);
//   - std::runtime_error (RuntimeError) for both when built without torch's headers (the plain
//     compiler fallback): still an exception, never a null tensor.
// Size 0 returns NULL without throwing, as PyTorch's caching allocator returns a null pointer for
// zero bytes. vmm_torch_alloc_free forwards to vmm_torch_free (CUDAPluggableAllocator loads both
// functions from one library).
//
// The libvmmalloc functions are handed over at run time (vmm_torch_alloc_init, from ctypes): nothing
// links libvmmalloc. Only c10's exception header is used from torch, so the ABI this depends on is
// the one c10::OutOfMemoryError's constructor has had since PyTorch 1.13 (SourceLocation, string).

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <sys/types.h>

#if defined(VMM_WITH_C10) && __has_include(<c10/util/Exception.h>)
#include <c10/util/Exception.h>
#define VMM_RAISES_C10 1
#else
#define VMM_RAISES_C10 0
#endif

struct CUstream_st;
using cudaStream_t = CUstream_st *;

namespace {

using malloc_c_t = void *(*)(ptrdiff_t size, int device, void *stream);
using free_c_t = void (*)(void *ptr, ptrdiff_t size, int device, void *stream);
using status_c_t = int (*)();
using error_c_t = const char *(*)();

struct Entry {
    malloc_c_t malloc_fn = nullptr;
    free_c_t free_fn = nullptr;
    status_c_t status = nullptr;
    error_c_t last_error = nullptr; // vmm_last_error: this thread's message
} g;

constexpr int kEnomem = -1; // VMM_ENOMEM (include/vmmalloc.h)

[[noreturn]] void raise_failure(int status, const std::string &why)
{
#if VMM_RAISES_C10
    if (status == kEnomem)
        TORCH_CHECK_WITH(OutOfMemoryError, false, "CUDA out of memory. ", why);
    TORCH_CHECK(false, why);
#else
    if (status == kEnomem)
        throw std::runtime_error("CUDA out of memory. " + why);
    throw std::runtime_error(why);
#endif
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int vmm_torch_alloc_init(void *malloc_fn, void *free_fn, void *status,
                                                                  void *last_error)
{
    if (!malloc_fn || !free_fn || !status || !last_error)
        return -1;
    g.malloc_fn = reinterpret_cast<malloc_c_t>(malloc_fn);
    g.free_fn = reinterpret_cast<free_c_t>(free_fn);
    g.status = reinterpret_cast<status_c_t>(status);
    g.last_error = reinterpret_cast<error_c_t>(last_error);
    return 0;
}

// 1 when a failure raises c10::OutOfMemoryError / c10::Error, 0 when std::runtime_error.
__attribute__((visibility("default"))) int vmm_torch_alloc_raises_c10(void) { return VMM_RAISES_C10; }

// CUDAPluggableAllocator's alloc function, in the type PyTorch calls it through
// (void *(size_t, int, cudaStream_t)): a definition with ssize_t is a call through a pointer of
// another function type, which clang's -fsanitize=function reports.
__attribute__((visibility("default"))) void *vmm_torch_alloc_malloc(size_t size, int device, cudaStream_t stream)
{
    if (!g.malloc_fn)
        throw std::runtime_error("vmmalloc: vmm_torch_alloc_init was not called");
    void *p = g.malloc_fn(static_cast<ptrdiff_t>(size), device, stream);
    if (p || size == 0)
        return p;
    int status = g.status();
    const char *msg = g.last_error();
    raise_failure(status, msg && *msg ? std::string(msg) : std::string("vmmalloc: allocation failed"));
}

// CUDAPluggableAllocator's free function: void(void *ptr, size_t size, int device, cudaStream_t stream).
__attribute__((visibility("default"))) void vmm_torch_alloc_free(void *ptr, size_t size, int device,
                                                                  cudaStream_t stream)
{
    if (g.free_fn)
        g.free_fn(ptr, static_cast<ptrdiff_t>(size), device, stream);
}

} // extern "C"
