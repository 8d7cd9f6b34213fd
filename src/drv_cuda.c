/*
 * The cuda driver: the driver contract (driver.h) on a real GPU through the CUDA Driver API.
 *
 * libcuda.so.1 is loaded at run time with dlopen; only cuGetProcAddress is looked up with dlsym and
 * every other entry point is resolved through it, pinned at driver API version 12000 (as PyTorch
 * does), so each pointer has the ABI of the prototype written here whatever newer driver is
 * installed. cuda.h is used for types and constants only: the library never links libcuda.
 *
 * All work runs on the device's primary context, shared with the CUDA runtime and PyTorch. Each op
 * makes that context current on the calling thread for the duration of the call and gives the
 * thread back the context it had (a caller working on another device keeps it).
 *
 * Thread safety: the entry-point table is filled once per process (pthread_once) and read-only
 * after; a driver's state is read-only after open; the CUDA driver itself is thread safe. So no op
 * takes a lock.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#ifndef VMM_HAVE_CUDA_H

int vmm_driver_cuda_open(int ordinal, vmm_driver **out, char *msg, size_t msg_len)
{
    if (out)
        *out = NULL;
    if (msg && msg_len)
        snprintf(msg, msg_len,
                 "vmmalloc was built without the CUDA toolkit (cuda.h not found at configure time): "
                 "only the simulated driver is available");
    return VMM_DRV_NOT_SUPPORTED;
}

#else /* VMM_HAVE_CUDA_H */

#include <cuda.h>
#include <dlfcn.h>
#include <pthread.h>

/* The contract's result values are CUresult numbers, so results pass through unchanged. */
#define SAME_RESULT(ours, cuda) _Static_assert((int)(ours) == (int)(cuda), #ours " is " #cuda)
SAME_RESULT(VMM_DRV_SUCCESS, CUDA_SUCCESS);
SAME_RESULT(VMM_DRV_INVALID_VALUE, CUDA_ERROR_INVALID_VALUE);
SAME_RESULT(VMM_DRV_OUT_OF_MEMORY, CUDA_ERROR_OUT_OF_MEMORY);
SAME_RESULT(VMM_DRV_NOT_INITIALIZED, CUDA_ERROR_NOT_INITIALIZED);
SAME_RESULT(VMM_DRV_NO_DEVICE, CUDA_ERROR_NO_DEVICE);
SAME_RESULT(VMM_DRV_INVALID_DEVICE, CUDA_ERROR_INVALID_DEVICE);
SAME_RESULT(VMM_DRV_INVALID_HANDLE, CUDA_ERROR_INVALID_HANDLE);
SAME_RESULT(VMM_DRV_NOT_READY, CUDA_ERROR_NOT_READY);
SAME_RESULT(VMM_DRV_NOT_SUPPORTED, CUDA_ERROR_NOT_SUPPORTED);
SAME_RESULT(VMM_DRV_UNKNOWN, CUDA_ERROR_UNKNOWN);
/* vmm_phys holds a CUmemGenericAllocationHandle, streams and events are opaque pointers. */
_Static_assert(sizeof(vmm_phys) == sizeof(CUmemGenericAllocationHandle), "vmm_phys holds a CUDA handle");
_Static_assert(sizeof(uintptr_t) == sizeof(CUdeviceptr), "device pointers fit uintptr_t");

enum {
    /* Driver API version every entry point is requested at: CUDA 12.0, the first release with
     * cuGetProcAddress_v2; PyTorch pins the same. */
    CUDA_API_VERSION = 12000,
    /* A device whose granularity query fails (no VMM support) still reports a nominal unit so
     * callers' rounding never divides by zero: 2 MiB, the granularity of every current GPU. */
    NOMINAL_GRANULARITY = 2 << 20,
    LOAD_MESSAGE_MAX = 512,
};

/* cuGetProcAddress_v2 (CUDA 12+) and the older four-argument cuGetProcAddress. */
typedef CUresult (*get_proc_v2_fn)(const char *, void **, int, cuuint64_t,
                                   CUdriverProcAddressQueryResult *);
typedef CUresult (*get_proc_v1_fn)(const char *, void **, int, cuuint64_t);

/* Entry points. Member names avoid the cuda.h macros (cuMemAlloc -> cuMemAlloc_v2, ...); the
 * prototypes are those of the symbols version 12000 resolves to (cudaTypedefs.h's PFN_*_v<N> with
 * the largest N <= 12000). The pin matters: CUDA 13 added cuCtxSynchronize_v2, which takes a
 * context, and a driver asked for version 13000 may hand that out for "cuCtxSynchronize". */
static struct cuda_api {
    CUresult (*init)(unsigned int);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_attribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*device_get_name)(char *, int, CUdevice);
    CUresult (*device_total_mem)(size_t *, CUdevice);
    CUresult (*get_granularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*primary_ctx_retain)(CUcontext *, CUdevice);
    CUresult (*primary_ctx_release)(CUdevice);
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_get_info)(size_t *, size_t *);
    CUresult (*address_reserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*address_free)(CUdeviceptr, size_t);
    CUresult (*create)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *,
                       unsigned long long);
    CUresult (*release)(CUmemGenericAllocationHandle);
    CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*unmap)(CUdeviceptr, size_t);
    CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*retain_handle)(CUmemGenericAllocationHandle *, void *);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free)(CUdeviceptr);
    CUresult (*stream_create)(CUstream *, unsigned int);
    CUresult (*stream_destroy)(CUstream);
    CUresult (*stream_synchronize)(CUstream);
    CUresult (*stream_wait_event)(CUstream, CUevent, unsigned int);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_synchronize)(CUevent);
    CUresult (*event_destroy)(CUevent);
    CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
    CUresult (*memset_d32_async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*host_alloc)(void **, size_t, unsigned int);
    CUresult (*host_free)(void *);
} cu;

/* Outcome of loading libcuda, decided once per process. */
static pthread_once_t load_once = PTHREAD_ONCE_INIT;
static int load_result;
static char load_message[LOAD_MESSAGE_MAX];

static void msg_set(char *msg, size_t len, const char *fmt, ...) VMM_PRINTF(3, 4);
static void msg_set(char *msg, size_t len, const char *fmt, ...)
{
    if (!msg || !len)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, len, fmt, ap);
    va_end(ap);
}

/* "CUDA_ERROR_X" from the driver when it can say, else from our own table. */
static const char *result_name(CUresult r)
{
    const char *name = NULL;
    if (cu.get_error_name && cu.get_error_name(r, &name) == CUDA_SUCCESS && name)
        return name;
    if (r == CUDA_ERROR_STUB_LIBRARY) /* the stub cannot name its own results */
        return "CUDA_ERROR_STUB_LIBRARY";
    return vmm_drv_result_name((int)r);
}

/* A hint for results that mean "this is not a usable driver" rather than a failing call. */
static const char *result_hint(CUresult r)
{
    if (r == CUDA_ERROR_STUB_LIBRARY)
        return " (libcuda.so.1 is the CUDA toolkit's stub library, not an installed driver)";
    return "";
}

static get_proc_v2_fn get_proc_v2;
static get_proc_v1_fn get_proc_v1;

static CUresult resolve(const char *symbol, void **fn)
{
    /* The NULL stream of every resolved function is the legacy default stream, as PyTorch's. */
    const cuuint64_t flags = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    *fn = NULL;
    CUresult r;
    if (get_proc_v2) {
        CUdriverProcAddressQueryResult status = CU_GET_PROC_ADDRESS_SUCCESS;
        r = get_proc_v2(symbol, fn, CUDA_API_VERSION, flags, &status);
        if (r == CUDA_SUCCESS && status != CU_GET_PROC_ADDRESS_SUCCESS)
            r = CUDA_ERROR_NOT_FOUND;
    } else {
        r = get_proc_v1(symbol, fn, CUDA_API_VERSION, flags);
    }
    if (r == CUDA_SUCCESS && !*fn)
        r = CUDA_ERROR_NOT_FOUND;
    return r;
}

/* Table of what to resolve: symbol names as cuGetProcAddress wants them (no _v2 suffix: the
 * requested version picks the variant). */
#define CUDA_SYMBOLS(X)                                    \
    X(init, "cuInit")                                      \
    X(device_get, "cuDeviceGet")                           \
    X(device_get_attribute, "cuDeviceGetAttribute")        \
    X(device_get_name, "cuDeviceGetName")                  \
    X(device_total_mem, "cuDeviceTotalMem")                \
    X(get_granularity, "cuMemGetAllocationGranularity")    \
    X(primary_ctx_retain, "cuDevicePrimaryCtxRetain")      \
    X(primary_ctx_release, "cuDevicePrimaryCtxRelease")    \
    X(ctx_get_current, "cuCtxGetCurrent")                  \
    X(ctx_set_current, "cuCtxSetCurrent")                  \
    X(ctx_synchronize, "cuCtxSynchronize")                 \
    X(mem_get_info, "cuMemGetInfo")                        \
    X(address_reserve, "cuMemAddressReserve")              \
    X(address_free, "cuMemAddressFree")                    \
    X(create, "cuMemCreate")                               \
    X(release, "cuMemRelease")                             \
    X(map, "cuMemMap")                                     \
    X(unmap, "cuMemUnmap")                                 \
    X(set_access, "cuMemSetAccess")                        \
    X(retain_handle, "cuMemRetainAllocationHandle")        \
    X(alloc, "cuMemAlloc")                                 \
    X(free, "cuMemFree")                                   \
    X(stream_create, "cuStreamCreate")                     \
    X(stream_destroy, "cuStreamDestroy")                   \
    X(stream_synchronize, "cuStreamSynchronize")           \
    X(stream_wait_event, "cuStreamWaitEvent")              \
    X(event_create, "cuEventCreate")                       \
    X(event_record, "cuEventRecord")                       \
    X(event_query, "cuEventQuery")                         \
    X(event_synchronize, "cuEventSynchronize")             \
    X(event_destroy, "cuEventDestroy")                     \
    X(launch_host_func, "cuLaunchHostFunc")                \
    X(memset_d32_async, "cuMemsetD32Async")                \
    X(memcpy_dtoh_async, "cuMemcpyDtoHAsync")              \
    X(host_alloc, "cuMemHostAlloc")                        \
    X(host_free, "cuMemFreeHost")

static void load_libcuda(void)
{
    /* The handle is kept for the life of the process: unloading a driver that has started its
     * threads is unsafe, and the runtime or PyTorch may share it. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        load_result = VMM_DRV_NOT_INITIALIZED;
        msg_set(load_message, sizeof load_message, "libcuda.so.1 not found: %s",
                err ? err : "unknown dlopen error");
        return;
    }
    /* dlsym returns void *; converting to a function pointer is what POSIX guarantees to work. */
    void *sym = dlsym(lib, "cuGetProcAddress_v2");
    if (sym) {
        memcpy(&get_proc_v2, &sym, sizeof sym);
    } else if ((sym = dlsym(lib, "cuGetProcAddress")) != NULL) {
        memcpy(&get_proc_v1, &sym, sizeof sym);
    } else {
        load_result = VMM_DRV_NOT_INITIALIZED;
        msg_set(load_message, sizeof load_message,
                "libcuda.so.1 has no cuGetProcAddress: not a CUDA driver, or one older than "
                "CUDA 11.3");
        return;
    }
    /* Error names first, so later messages can use them; optional. */
    void *p = NULL;
    if (resolve("cuGetErrorName", &p) == CUDA_SUCCESS)
        memcpy(&cu.get_error_name, &p, sizeof p);
#define RESOLVE_ONE_(member, symbol)                                                       \
    {                                                                                      \
        CUresult r_ = resolve(symbol, &p);                                                 \
        if (r_ != CUDA_SUCCESS) {                                                          \
            load_result = VMM_DRV_NOT_INITIALIZED;                                         \
            msg_set(load_message, sizeof load_message,                                     \
                    "cuGetProcAddress(\"%s\", %d) failed: %s (%d)%s", symbol,              \
                    (int)CUDA_API_VERSION, result_name(r_), (int)r_, result_hint(r_));     \
            memset(&cu, 0, sizeof cu);                                                     \
            return;                                                                        \
        }                                                                                  \
        _Static_assert(sizeof cu.member == sizeof p, "function pointers are pointer sized"); \
        memcpy(&cu.member, &p, sizeof p);                                                  \
    }
    CUDA_SYMBOLS(RESOLVE_ONE_)
#undef RESOLVE_ONE_
    load_result = VMM_DRV_SUCCESS;
}

typedef struct cuda_driver {
    vmm_driver base; /* first: the contract's header */
    CUdevice dev;
    CUcontext ctx;   /* the device's primary context, retained for the driver's life */
    vmm_device_info info;
} cuda_driver;

static cuda_driver *as_cuda(vmm_driver *d) { return (cuda_driver *)d; }

/* Make d's context current on this thread; *prev gets the thread's context before. */
static CUresult ctx_enter(const cuda_driver *d, CUcontext *prev)
{
    *prev = NULL;
    CUresult r = cu.ctx_get_current(prev);
    if (r != CUDA_SUCCESS)
        return r;
    if (*prev == d->ctx)
        return CUDA_SUCCESS;
    return cu.ctx_set_current(d->ctx);
}

/* Give the thread back the context it had. A thread that had none keeps ours: that is what the
 * runtime would have made current anyway, and it makes the next op on this thread cheaper. */
static void ctx_leave(const cuda_driver *d, CUcontext prev)
{
    if (prev && prev != d->ctx)
        cu.ctx_set_current(prev);
}

/* Return the result of `call` made with d's context current. */
#define RETURN_IN_CONTEXT(d, call)                                                         \
    do {                                                                                   \
        CUcontext prev_;                                                                   \
        CUresult r_ = ctx_enter((d), &prev_);                                              \
        if (r_ == CUDA_SUCCESS)                                                            \
            r_ = (call);                                                                   \
        ctx_leave((d), prev_);                                                             \
        return (int)r_;                                                                    \
    } while (0)

static CUstream as_stream(void *s) { return (CUstream)s; }
static CUevent as_event(vmm_event e) { return (CUevent)e; }

static CUmemAllocationProp device_prop(const cuda_driver *d)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->info.ordinal;
    return prop;
}

static int cu_device_info(vmm_driver *d, vmm_device_info *out)
{
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    *out = as_cuda(d)->info;
    return VMM_DRV_SUCCESS;
}

static int cu_mem_get_info(vmm_driver *d, size_t *free_bytes, size_t *total_bytes)
{
    size_t f = 0, t = 0;
    CUcontext prev;
    CUresult r = ctx_enter(as_cuda(d), &prev);
    if (r == CUDA_SUCCESS)
        r = cu.mem_get_info(&f, &t);
    ctx_leave(as_cuda(d), prev);
    if (r == CUDA_SUCCESS) {
        if (free_bytes)
            *free_bytes = f;
        if (total_bytes)
            *total_bytes = t;
    }
    return (int)r;
}

static int cu_va_reserve(vmm_driver *d, size_t size, size_t alignment, uintptr_t *va)
{
    cuda_driver *c = as_cuda(d);
    if (!va)
        return VMM_DRV_INVALID_VALUE;
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    CUdeviceptr p = 0;
    CUcontext prev;
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.address_reserve(&p, size, alignment, 0, 0);
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS)
        *va = (uintptr_t)p;
    return (int)r;
}

static int cu_va_free(vmm_driver *d, uintptr_t va, size_t size)
{
    cuda_driver *c = as_cuda(d);
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    RETURN_IN_CONTEXT(c, cu.address_free((CUdeviceptr)va, size));
}

static int cu_mem_create(vmm_driver *d, size_t size, vmm_phys *out)
{
    cuda_driver *c = as_cuda(d);
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    CUmemAllocationProp prop = device_prop(c);
    CUmemGenericAllocationHandle h = 0;
    CUcontext prev;
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.create(&h, size, &prop, 0);
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS)
        *out = (vmm_phys)h;
    return (int)r;
}

static int cu_mem_release(vmm_driver *d, vmm_phys h)
{
    cuda_driver *c = as_cuda(d);
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    RETURN_IN_CONTEXT(c, cu.release((CUmemGenericAllocationHandle)h));
}

static int cu_mem_map(vmm_driver *d, uintptr_t va, size_t size, size_t offset, vmm_phys h)
{
    cuda_driver *c = as_cuda(d);
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    RETURN_IN_CONTEXT(c, cu.map((CUdeviceptr)va, size, offset, (CUmemGenericAllocationHandle)h, 0));
}

static int cu_mem_unmap(vmm_driver *d, uintptr_t va, size_t size)
{
    cuda_driver *c = as_cuda(d);
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    RETURN_IN_CONTEXT(c, cu.unmap((CUdeviceptr)va, size));
}

static int cu_set_access(vmm_driver *d, uintptr_t va, size_t size)
{
    cuda_driver *c = as_cuda(d);
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    CUmemAccessDesc desc;
    memset(&desc, 0, sizeof desc);
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = c->info.ordinal;
    desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    RETURN_IN_CONTEXT(c, cu.set_access((CUdeviceptr)va, size, &desc, 1));
}

static int cu_mem_alloc(vmm_driver *d, size_t size, uintptr_t *out)
{
    cuda_driver *c = as_cuda(d);
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    CUdeviceptr p = 0;
    CUcontext prev;
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.alloc(&p, size);
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS)
        *out = (uintptr_t)p;
    return (int)r;
}

static int cu_mem_free(vmm_driver *d, uintptr_t ptr)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.free((CUdeviceptr)ptr));
}

static int cu_stream_create(vmm_driver *d, void **out)
{
    cuda_driver *c = as_cuda(d);
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    CUstream s = NULL;
    CUcontext prev;
    /* Non-blocking: the allocator's streams must not serialize with the legacy default stream. */
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.stream_create(&s, CU_STREAM_NON_BLOCKING);
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS)
        *out = (void *)s;
    return (int)r;
}

static int cu_stream_destroy(vmm_driver *d, void *s)
{
    if (!s) /* the default stream is not ours to destroy */
        return VMM_DRV_INVALID_HANDLE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.stream_destroy(as_stream(s)));
}

static int cu_stream_sync(vmm_driver *d, void *s)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.stream_synchronize(as_stream(s)));
}

static int cu_device_sync(vmm_driver *d) { RETURN_IN_CONTEXT(as_cuda(d), cu.ctx_synchronize()); }

static int cu_event_create(vmm_driver *d, vmm_event *out)
{
    cuda_driver *c = as_cuda(d);
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    CUevent e = NULL;
    CUcontext prev;
    /* Events only order and prove completion; timing would make record and query slower. */
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.event_create(&e, CU_EVENT_DISABLE_TIMING);
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS)
        *out = (vmm_event)e;
    return (int)r;
}

static int cu_event_record(vmm_driver *d, vmm_event e, void *s)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.event_record(as_event(e), as_stream(s)));
}

static int cu_event_query(vmm_driver *d, vmm_event e)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.event_query(as_event(e)));
}

static int cu_event_sync(vmm_driver *d, vmm_event e)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.event_synchronize(as_event(e)));
}

static int cu_event_destroy(vmm_driver *d, vmm_event e)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.event_destroy(as_event(e)));
}

static int cu_stream_wait_event(vmm_driver *d, void *s, vmm_event e)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.stream_wait_event(as_stream(s), as_event(e), 0));
}

static int cu_launch_host(vmm_driver *d, void *s, void (*fn)(void *), void *arg)
{
    if (!fn)
        return VMM_DRV_INVALID_VALUE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.launch_host_func(as_stream(s), fn, arg));
}

static int cu_memset32(vmm_driver *d, uintptr_t va, uint32_t value, size_t n, void *s)
{
    RETURN_IN_CONTEXT(as_cuda(d), cu.memset_d32_async((CUdeviceptr)va, value, n, as_stream(s)));
}

static int cu_memcpy_dtoh(vmm_driver *d, void *dst, uintptr_t va, size_t n, void *s)
{
    if (!dst && n)
        return VMM_DRV_INVALID_VALUE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.memcpy_dtoh_async(dst, (CUdeviceptr)va, n, as_stream(s)));
}

/* Page-locked host memory, usable from every context (PORTABLE), for the pinned cache. */
static int cu_host_alloc(vmm_driver *d, size_t size, void **out)
{
    if (!out || !size)
        return VMM_DRV_INVALID_VALUE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.host_alloc(out, size, CU_MEMHOSTALLOC_PORTABLE));
}

static int cu_host_free(vmm_driver *d, void *p) { RETURN_IN_CONTEXT(as_cuda(d), cu.host_free(p)); }

static int cu_lookup_mapping(vmm_driver *d, uintptr_t va, vmm_phys *out)
{
    cuda_driver *c = as_cuda(d);
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    *out = 0;
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    CUmemGenericAllocationHandle h = 0;
    CUcontext prev;
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.retain_handle(&h, (void *)va);
    /* Retaining added a reference to the handle; drop it so the caller's count is unchanged. */
    if (r == CUDA_SUCCESS)
        r = cu.release(h);
    ctx_leave(c, prev);
    if (r == CUDA_SUCCESS)
        *out = (vmm_phys)h;
    return (int)r;
}

static void cu_close(vmm_driver *d)
{
    if (!d)
        return;
    cuda_driver *c = as_cuda(d);
    /* The primary context lives on while the runtime or PyTorch still holds it. */
    cu.primary_ctx_release(c->dev);
    free(c);
}

static const vmm_driver_ops cuda_ops = {
    .name = "cuda",
    .device_info = cu_device_info,
    .mem_get_info = cu_mem_get_info,
    .va_reserve = cu_va_reserve,
    .va_free = cu_va_free,
    .mem_create = cu_mem_create,
    .mem_release = cu_mem_release,
    .mem_map = cu_mem_map,
    .mem_unmap = cu_mem_unmap,
    .set_access = cu_set_access,
    .mem_alloc = cu_mem_alloc,
    .mem_free = cu_mem_free,
    .stream_create = cu_stream_create,
    .stream_destroy = cu_stream_destroy,
    .stream_sync = cu_stream_sync,
    .device_sync = cu_device_sync,
    .event_create = cu_event_create,
    .event_record = cu_event_record,
    .event_query = cu_event_query,
    .event_sync = cu_event_sync,
    .event_destroy = cu_event_destroy,
    .stream_wait_event = cu_stream_wait_event,
    .launch_host = cu_launch_host,
    .memset32 = cu_memset32,
    .memcpy_dtoh = cu_memcpy_dtoh,
    .lookup_mapping = cu_lookup_mapping,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .close = cu_close,
};

/* Device facts the contract's device_info reports, queried once at open. */
static CUresult query_device(cuda_driver *c, char *msg, size_t msg_len)
{
    vmm_device_info *info = &c->info;
    int vmm = 0;
    CUresult r = cu.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                                         c->dev);
    if (r != CUDA_SUCCESS) {
        msg_set(msg, msg_len, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED) failed: %s (%d)",
                result_name(r), (int)r);
        return r;
    }
    info->vmm_supported = vmm != 0;
    r = cu.device_total_mem(&info->total_bytes, c->dev);
    if (r == CUDA_SUCCESS)
        r = cu.device_get_name(info->name, (int)sizeof info->name, c->dev);
    if (r != CUDA_SUCCESS) {
        msg_set(msg, msg_len, "device %d: cuDeviceTotalMem/cuDeviceGetName failed: %s (%d)",
                info->ordinal, result_name(r), (int)r);
        return r;
    }
    info->name[sizeof info->name - 1] = '\0';
    info->granularity = NOMINAL_GRANULARITY;
    info->recommended_granularity = NOMINAL_GRANULARITY;
    if (info->vmm_supported) {
        CUmemAllocationProp prop = device_prop(c);
        size_t min = 0, rec = 0;
        r = cu.get_granularity(&min, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (r == CUDA_SUCCESS)
            r = cu.get_granularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        if (r != CUDA_SUCCESS || min == 0) {
            msg_set(msg, msg_len, "device %d: cuMemGetAllocationGranularity failed: %s (%d)",
                    info->ordinal, result_name(r), (int)r);
            return r != CUDA_SUCCESS ? r : CUDA_ERROR_UNKNOWN;
        }
        info->granularity = min;
        info->recommended_granularity = rec ? rec : min;
    }
    return CUDA_SUCCESS;
}

int vmm_driver_cuda_open(int ordinal, vmm_driver **out, char *msg, size_t msg_len)
{
    if (msg && msg_len)
        msg[0] = '\0';
    if (!out) {
        msg_set(msg, msg_len, "vmm_driver_cuda_open: out is NULL");
        return VMM_DRV_INVALID_VALUE;
    }
    *out = NULL;
    if (ordinal < 0) {
        msg_set(msg, msg_len, "device ordinal %d is negative", ordinal);
        return VMM_DRV_INVALID_DEVICE;
    }
    pthread_once(&load_once, load_libcuda);
    if (load_result != VMM_DRV_SUCCESS) {
        msg_set(msg, msg_len, "%s", load_message);
        return load_result;
    }
    CUresult r = cu.init(0);
    if (r != CUDA_SUCCESS) {
        msg_set(msg, msg_len, "cuInit failed: %s (%d)%s", result_name(r), (int)r, result_hint(r));
        /* NO_DEVICE says what it means; any other cuInit failure means no usable driver. */
        return r == CUDA_ERROR_NO_DEVICE ? VMM_DRV_NO_DEVICE : VMM_DRV_NOT_INITIALIZED;
    }
    cuda_driver *c = calloc(1, sizeof *c);
    if (!c) {
        msg_set(msg, msg_len, "out of host memory");
        return VMM_DRV_OUT_OF_MEMORY;
    }
    c->base.ops = &cuda_ops;
    c->base.is_sim = 0;
    c->info.ordinal = ordinal;
    r = cu.device_get(&c->dev, ordinal);
    if (r != CUDA_SUCCESS) {
        msg_set(msg, msg_len, "cuDeviceGet(%d) failed: %s (%d)", ordinal, result_name(r), (int)r);
        free(c);
        return r == CUDA_ERROR_INVALID_VALUE ? VMM_DRV_INVALID_DEVICE : (int)r;
    }
    r = query_device(c, msg, msg_len);
    if (r != CUDA_SUCCESS) {
        free(c);
        return (int)r;
    }
    r = cu.primary_ctx_retain(&c->ctx, c->dev);
    if (r != CUDA_SUCCESS) {
        msg_set(msg, msg_len, "device %d: cuDevicePrimaryCtxRetain failed: %s (%d)", ordinal,
                result_name(r), (int)r);
        free(c);
        return (int)r;
    }
    *out = &c->base;
    return VMM_DRV_SUCCESS;
}

#endif /* VMM_HAVE_CUDA_H */
