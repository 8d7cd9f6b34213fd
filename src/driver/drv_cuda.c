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
 * thread back exactly the context it had: another device's, or none. A thread left holding our
 * context would have its runtime device silently switched (the runtime adopts the thread's current
 * driver context), so "none" is restored too.
 *
 * Events are small wrappers holding one CUevent per context they were used in, because an event
 * can only be recorded on a stream of its own context (cuEventRecord: "hEvent and hStream must be
 * from the same context otherwise CUDA_ERROR_INVALID_HANDLE is returned"), while record_stream and
 * pinned memory hand the allocator streams of other devices. event_prepare creates the per-context
 * event ahead of time; query / sync / wait use the one recorded last.
 *
 * Physical pages are created the way NCCL and vLLM's cumem allocator create theirs:
 * gpuDirectRDMACapable where the device reports GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (NCCL
 * buffer registration and GPUDirect RDMA need it), and exportable as POSIX file descriptors where
 * the device supports that handle type, falling back to no handle type, once and for good, if the
 * system refuses it (containers without the permission answer NOT_PERMITTED / NOT_SUPPORTED).
 *
 * Capture (CUDA graphs): stream_capture_info is cuStreamGetCaptureInfo (the _v2 ABI, which version
 * 12000 resolves to), the legacy stream's STREAM_CAPTURE_IMPLICIT answered as "capturing";
 * capture_mode_exchange is cuThreadExchangeStreamCaptureMode, thread-local, no context needed.
 *
 * Thread safety: the entry-point table is filled once per process (pthread_once) and read-only
 * after; a driver's state is read-only after open except the peer set and the handle-type
 * fallback, which are atomics; the CUDA driver itself is thread safe. One event is used by one
 * thread at a time (its owner's lock).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "driver/driver.h"

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
#include <stdatomic.h>

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
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_UNSUPPORTED, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_INVALIDATED, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_MERGE, CUDA_ERROR_STREAM_CAPTURE_MERGE);
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_UNMATCHED, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_WRONG_THREAD, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_ISOLATION, CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
SAME_RESULT(VMM_DRV_STREAM_CAPTURE_IMPLICIT, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
SAME_RESULT(VMM_DRV_CAPTURED_EVENT, CUDA_ERROR_CAPTURED_EVENT);
SAME_RESULT(VMM_CAPTURE_MODE_GLOBAL, CU_STREAM_CAPTURE_MODE_GLOBAL);
SAME_RESULT(VMM_CAPTURE_MODE_THREAD_LOCAL, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL);
SAME_RESULT(VMM_CAPTURE_MODE_RELAXED, CU_STREAM_CAPTURE_MODE_RELAXED);
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
    /* Peers set_access can grant: one bit each in a 64-bit mask (NVLink domains today have 8). */
    MAX_PEERS = 64,
    /* Contexts one event can be recorded in: its own plus peers that record_stream or pinned
     * memory brought; more are refused (the free path then falls back, see events.c). */
    EVENT_CONTEXTS = 8,
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
    CUresult (*driver_get_version)(int *);
    CUresult (*get_error_name)(CUresult, const char **);
    CUresult (*device_get)(CUdevice *, int);
    CUresult (*device_get_count)(int *);
    CUresult (*device_can_access_peer)(int *, CUdevice, CUdevice);
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
    CUresult (*stream_get_ctx)(CUstream, CUcontext *);
    /* cuStreamGetCaptureInfo at 12000 is the _v2 ABI (cudaTypedefs.h:
     * PFN_cuStreamGetCaptureInfo_v11030; the 7-argument _v3 came with 12030) */
    CUresult (*stream_get_capture_info)(CUstream, CUstreamCaptureStatus *, cuuint64_t *, CUgraph *,
                                        const CUgraphNode **, size_t *);
    CUresult (*thread_exchange_capture_mode)(CUstreamCaptureMode *);
    CUresult (*event_create)(CUevent *, unsigned int);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_query)(CUevent);
    CUresult (*event_synchronize)(CUevent);
    CUresult (*event_destroy)(CUevent);
    CUresult (*launch_host_func)(CUstream, CUhostFn, void *);
    CUresult (*memset_d32_async)(CUdeviceptr, unsigned int, size_t, CUstream);
    CUresult (*memcpy_dtoh_async)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*memcpy_htod_async)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*export_shareable)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                                 unsigned long long);
    CUresult (*import_shareable)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
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
    X(device_get_count, "cuDeviceGetCount")                \
    X(device_can_access_peer, "cuDeviceCanAccessPeer")     \
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
    X(stream_get_ctx, "cuStreamGetCtx")                    \
    X(stream_get_capture_info, "cuStreamGetCaptureInfo")   \
    X(thread_exchange_capture_mode, "cuThreadExchangeStreamCaptureMode") \
    X(event_create, "cuEventCreate")                       \
    X(event_record, "cuEventRecord")                       \
    X(event_query, "cuEventQuery")                         \
    X(event_synchronize, "cuEventSynchronize")             \
    X(event_destroy, "cuEventDestroy")                     \
    X(launch_host_func, "cuLaunchHostFunc")                \
    X(memset_d32_async, "cuMemsetD32Async")                \
    X(memcpy_dtoh_async, "cuMemcpyDtoHAsync")              \
    X(memcpy_htod_async, "cuMemcpyHtoDAsync")              \
    X(export_shareable, "cuMemExportToShareableHandle")    \
    X(import_shareable, "cuMemImportFromShareableHandle")  \
    X(host_alloc, "cuMemHostAlloc")                        \
    X(host_free, "cuMemFreeHost")

/* cuGetErrorName for results outside the contract's table (error.c asks through this). */
static const char *driver_result_name(int r)
{
    const char *name = NULL;
    if (cu.get_error_name && cu.get_error_name((CUresult)r, &name) == CUDA_SUCCESS)
        return name;
    return NULL;
}

static void load_fail(int result, const char *fmt, ...) VMM_PRINTF(2, 3);
static void load_fail(int result, const char *fmt, ...)
{
    load_result = result;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(load_message, sizeof load_message, fmt, ap);
    va_end(ap);
    memset(&cu, 0, sizeof cu);
}

static void load_libcuda(void)
{
    /* The handle is kept for the life of the process: unloading a driver that has started its
     * threads is unsafe, and the runtime or PyTorch may share it. */
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        const char *err = dlerror();
        load_fail(VMM_DRV_NOT_INITIALIZED, "libcuda.so.1 not found: %s",
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
        load_fail(VMM_DRV_NOT_SUPPORTED, "libcuda.so.1 has no cuGetProcAddress: not a CUDA driver, or "
                                         "one older than CUDA 11.3 (vmmalloc needs CUDA 12.0)");
        return;
    }
    /* Error names and the version first: a driver too old to have what we resolve below must be
     * reported as too old, not as a missing symbol or a failing cuInit. */
    void *p = NULL;
    if (resolve("cuGetErrorName", &p) == CUDA_SUCCESS)
        memcpy(&cu.get_error_name, &p, sizeof p);
    int version = 0;
    /* cuDriverGetVersion through dlsym: its ABI never changed, and an old driver may refuse to
     * resolve anything at a version newer than itself. */
    if ((p = dlsym(lib, "cuDriverGetVersion")) != NULL || resolve("cuDriverGetVersion", &p) == CUDA_SUCCESS) {
        memcpy(&cu.driver_get_version, &p, sizeof p);
        CUresult r = cu.driver_get_version(&version);
        if (r == CUDA_SUCCESS && version < CUDA_API_VERSION) {
            load_fail(VMM_DRV_NOT_SUPPORTED,
                      "the installed CUDA driver supports CUDA %d.%d; vmmalloc needs a driver for "
                      "CUDA %d.%d or newer (update the NVIDIA driver)",
                      version / 1000, version % 1000 / 10, CUDA_API_VERSION / 1000,
                      CUDA_API_VERSION % 1000 / 10);
            return;
        }
    }
#define RESOLVE_ONE_(member, symbol)                                                       \
    {                                                                                      \
        CUresult r_ = resolve(symbol, &p);                                                 \
        if (r_ != CUDA_SUCCESS) {                                                          \
            /* the stub library answers every call with STUB_LIBRARY: no driver installed */ \
            load_fail(r_ == CUDA_ERROR_STUB_LIBRARY ? VMM_DRV_NOT_INITIALIZED : (int)r_,      \
                      "cuGetProcAddress(\"%s\", %d) failed: %s (%d)%s", symbol,             \
                      (int)CUDA_API_VERSION, result_name(r_), (int)r_, result_hint(r_));   \
            return;                                                                        \
        }                                                                                  \
        _Static_assert(sizeof cu.member == sizeof p, "function pointers are pointer sized"); \
        memcpy(&cu.member, &p, sizeof p);                                                  \
    }
    CUDA_SYMBOLS(RESOLVE_ONE_)
#undef RESOLVE_ONE_
    vmm_drv_set_result_namer(driver_result_name);
    load_result = VMM_DRV_SUCCESS;
}

typedef struct cuda_driver {
    vmm_driver base; /* first: the contract's header */
    CUdevice dev;
    CUcontext ctx;   /* the device's primary context, retained for the driver's life */
    vmm_device_info info;
    _Atomic uint64_t peers;   /* bit i: set_access also grants device i (peer_enable) */
    _Atomic int fd_handles;   /* pages requested exportable as POSIX fds (cleared on refusal) */
    int fd_supported;         /* HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
} cuda_driver;

static cuda_driver *as_cuda(vmm_driver *d) { return (cuda_driver *)d; }

/* Make `want` current on this thread; *prev gets the thread's context before (NULL: none). */
static CUresult ctx_enter_ctx(CUcontext want, CUcontext *prev)
{
    *prev = NULL;
    CUresult r = cu.ctx_get_current(prev);
    if (r != CUDA_SUCCESS)
        return r;
    if (*prev == want)
        return CUDA_SUCCESS;
    return cu.ctx_set_current(want);
}

static CUresult ctx_enter(const cuda_driver *d, CUcontext *prev) { return ctx_enter_ctx(d->ctx, prev); }

/* Give the thread back the context it had, none included: a thread that had none must not be left
 * with ours, or the CUDA runtime would silently take our device as that thread's device. */
static void ctx_leave_ctx(CUcontext want, CUcontext prev)
{
    if (prev != want)
        cu.ctx_set_current(prev);
}

static void ctx_leave(const cuda_driver *d, CUcontext prev) { ctx_leave_ctx(d->ctx, prev); }

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

static CUmemAllocationProp device_prop(const cuda_driver *d)
{
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = d->info.ordinal;
    if (d->fd_handles)
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    prop.allocFlags.gpuDirectRDMACapable = d->info.gdr_supported ? 1 : 0;
    return prop;
}

static int cu_device_info(vmm_driver *d, vmm_device_info *out)
{
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    *out = as_cuda(d)->info;
    out->posix_fd_handles = as_cuda(d)->fd_handles;
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

/* Refusals of an exportable handle type that mean "not here" rather than "no memory". */
static int handle_type_refused(CUresult r)
{
    return r == CUDA_ERROR_NOT_PERMITTED || r == CUDA_ERROR_NOT_SUPPORTED ||
           r == CUDA_ERROR_INVALID_VALUE;
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
    if (handle_type_refused(r) && prop.requestedHandleTypes != CU_MEM_HANDLE_TYPE_NONE) {
        /* Exportable handles refused (a container without the permission): go on without, for
         * good, as NCCL and vLLM do; a real size error fails again below and is reported. */
        prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
        r = cu.create(&h, size, &prop, 0);
        if (r == CUDA_SUCCESS)
            c->fd_handles = 0;
    }
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

/* Read/write for our device and every enabled peer, in one call: PyTorch's expandable segments
 * grant each peer the same way, since a kernel on a peer faults on memory it was not granted. */
static int cu_set_access(vmm_driver *d, uintptr_t va, size_t size)
{
    cuda_driver *c = as_cuda(d);
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    CUmemAccessDesc desc[MAX_PEERS];
    memset(desc, 0, sizeof desc);
    size_t n = 0;
    desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc[n].location.id = c->info.ordinal;
    desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    uint64_t peers = c->peers;
    for (int i = 0; i < MAX_PEERS && n < MAX_PEERS; i++) {
        if (!(peers >> i & 1) || i == c->info.ordinal)
            continue;
        desc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        desc[n].location.id = i;
        desc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    }
    RETURN_IN_CONTEXT(c, cu.set_access((CUdeviceptr)va, size, desc, n));
}

static int cu_peer_enable(vmm_driver *d, int peer)
{
    cuda_driver *c = as_cuda(d);
    if (peer == c->info.ordinal)
        return VMM_DRV_SUCCESS;
    if (peer < 0 || peer >= c->info.device_count)
        return VMM_DRV_INVALID_DEVICE;
    if (peer >= MAX_PEERS)
        return VMM_DRV_NOT_SUPPORTED;
    if (!c->info.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    CUdevice pd;
    CUresult r = cu.device_get(&pd, peer);
    int can = 0;
    /* cuDeviceCanAccessPeer(&can, dev, peerDev): "can dev access memory of peerDev" - here the
     * peer is the one that will touch our memory. */
    if (r == CUDA_SUCCESS)
        r = cu.device_can_access_peer(&can, pd, c->dev);
    if (r != CUDA_SUCCESS)
        return (int)r;
    if (!can)
        return VMM_DRV_NOT_SUPPORTED;
    atomic_fetch_or(&c->peers, (uint64_t)1 << peer);
    return VMM_DRV_SUCCESS;
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

/* ---- events: one CUevent per context the event was used in --------------------------------- */

typedef struct cu_event {
    int n;    /* slots in use; slot 0 is in the driver's own context */
    int last; /* slot recorded last: what query / sync / wait look at */
    struct {
        CUcontext ctx;
        CUevent ev;
    } slot[EVENT_CONTEXTS];
} cu_event;

static cu_event *as_event(vmm_event e) { return (cu_event *)e; }

/* The context a stream belongs to. The NULL stream and the special handles (legacy, per-thread)
 * mean the current context's stream; every op runs with d's context current, so d's. */
static CUresult stream_context(const cuda_driver *c, void *s, CUcontext *ctx)
{
    if (!s || as_stream(s) == CU_STREAM_LEGACY || as_stream(s) == CU_STREAM_PER_THREAD) {
        *ctx = c->ctx;
        return CUDA_SUCCESS;
    }
    return cu.stream_get_ctx(as_stream(s), ctx);
}

/* Events only order and prove completion; timing would make record and query slower. */
static CUresult event_create_in(CUcontext ctx, CUevent *ev)
{
    CUcontext prev;
    CUresult r = ctx_enter_ctx(ctx, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.event_create(ev, CU_EVENT_DISABLE_TIMING);
    ctx_leave_ctx(ctx, prev);
    return r;
}

/* The slot of e for stream s's context, created when missing (create 0: only look). */
static CUresult event_slot(const cuda_driver *c, cu_event *e, void *s, int create, int *slot)
{
    CUcontext ctx = NULL;
    CUresult r = stream_context(c, s, &ctx);
    if (r != CUDA_SUCCESS)
        return r;
    for (int i = 0; i < e->n; i++)
        if (e->slot[i].ctx == ctx) {
            *slot = i;
            return CUDA_SUCCESS;
        }
    if (!create)
        return CUDA_ERROR_NOT_FOUND;
    if (e->n == EVENT_CONTEXTS)
        return CUDA_ERROR_NOT_SUPPORTED;
    r = event_create_in(ctx, &e->slot[e->n].ev);
    if (r != CUDA_SUCCESS)
        return r;
    e->slot[e->n].ctx = ctx;
    *slot = e->n++;
    return CUDA_SUCCESS;
}

static int cu_event_create(vmm_driver *d, vmm_event *out)
{
    cuda_driver *c = as_cuda(d);
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    cu_event *e = calloc(1, sizeof *e);
    if (!e)
        return VMM_DRV_OUT_OF_MEMORY;
    CUresult r = event_create_in(c->ctx, &e->slot[0].ev);
    if (r != CUDA_SUCCESS) {
        free(e);
        return (int)r;
    }
    e->slot[0].ctx = c->ctx;
    e->n = 1;
    *out = (vmm_event)e;
    return VMM_DRV_SUCCESS;
}

static int cu_event_prepare(vmm_driver *d, vmm_event ev, void *s)
{
    if (!ev)
        return VMM_DRV_INVALID_HANDLE;
    int slot;
    CUcontext prev;
    cuda_driver *c = as_cuda(d);
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = event_slot(c, as_event(ev), s, 1, &slot);
    ctx_leave(c, prev);
    return (int)r;
}

static int cu_event_record(vmm_driver *d, vmm_event ev, void *s)
{
    if (!ev)
        return VMM_DRV_INVALID_HANDLE;
    cuda_driver *c = as_cuda(d);
    cu_event *e = as_event(ev);
    int slot = 0;
    CUcontext prev;
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = event_slot(c, e, s, 1, &slot);
    if (r == CUDA_SUCCESS)
        r = cu.event_record(e->slot[slot].ev, as_stream(s));
    if (r == CUDA_SUCCESS)
        e->last = slot;
    ctx_leave(c, prev);
    return (int)r;
}

static int cu_event_query(vmm_driver *d, vmm_event ev)
{
    if (!ev)
        return VMM_DRV_INVALID_HANDLE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.event_query(as_event(ev)->slot[as_event(ev)->last].ev));
}

static int cu_event_sync(vmm_driver *d, vmm_event ev)
{
    if (!ev)
        return VMM_DRV_INVALID_HANDLE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.event_synchronize(as_event(ev)->slot[as_event(ev)->last].ev));
}

static int cu_event_destroy(vmm_driver *d, vmm_event ev)
{
    if (!ev)
        return VMM_DRV_INVALID_HANDLE;
    cu_event *e = as_event(ev);
    CUresult first = CUDA_SUCCESS;
    for (int i = 0; i < e->n; i++) {
        CUcontext prev;
        CUresult r = ctx_enter_ctx(e->slot[i].ctx, &prev);
        if (r == CUDA_SUCCESS)
            r = cu.event_destroy(e->slot[i].ev);
        ctx_leave_ctx(e->slot[i].ctx, prev);
        if (first == CUDA_SUCCESS)
            first = r;
    }
    free(e);
    return (int)first;
}

/* "The event may be from a different context or device than hStream" (cuStreamWaitEvent). */
static int cu_stream_wait_event(vmm_driver *d, void *s, vmm_event ev)
{
    if (!ev)
        return VMM_DRV_INVALID_HANDLE;
    RETURN_IN_CONTEXT(as_cuda(d),
                      cu.stream_wait_event(as_stream(s), as_event(ev)->slot[as_event(ev)->last].ev, 0));
}

/* ---- capture ------------------------------------------------------------------------------- */

static int cu_stream_capture_info(vmm_driver *d, void *s, int *capturing, uint64_t *id)
{
    if (!capturing || !id)
        return VMM_DRV_INVALID_VALUE;
    *capturing = 0;
    *id = 0;
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_NONE;
    cuuint64_t cid = 0;
    CUcontext prev;
    cuda_driver *c = as_cuda(d);
    /* the legacy stream (NULL) is the current context's: ours for the call */
    CUresult r = ctx_enter(c, &prev);
    if (r == CUDA_SUCCESS)
        r = cu.stream_get_capture_info(as_stream(s), &st, &cid, NULL, NULL, NULL);
    ctx_leave(c, prev);
    if (r == CUDA_ERROR_STREAM_CAPTURE_IMPLICIT) {
        /* "if this is called on CU_STREAM_LEGACY while a blocking stream in the same context is
         * capturing": nothing may be queued on the legacy stream until that capture ends */
        *capturing = 1;
        return VMM_DRV_SUCCESS;
    }
    if (r != CUDA_SUCCESS)
        return (int)r;
    if (st != CU_STREAM_CAPTURE_STATUS_NONE) {
        *capturing = 1;
        /* "Valid data (other than capture status) is returned only if ... the returned capture
         * status is CU_STREAM_CAPTURE_STATUS_ACTIVE" */
        *id = st == CU_STREAM_CAPTURE_STATUS_ACTIVE ? (uint64_t)cid : 0;
    }
    return VMM_DRV_SUCCESS;
}

/* Thread-local and context-free: no context switch. */
static int cu_capture_mode_exchange(vmm_driver *d, int *mode)
{
    (void)d;
    if (!mode || *mode < VMM_CAPTURE_MODE_GLOBAL || *mode > VMM_CAPTURE_MODE_RELAXED)
        return VMM_DRV_INVALID_VALUE;
    CUstreamCaptureMode m = (CUstreamCaptureMode)*mode;
    CUresult r = cu.thread_exchange_capture_mode(&m);
    if (r == CUDA_SUCCESS)
        *mode = (int)m;
    return (int)r;
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

static int cu_memcpy_htod(vmm_driver *d, uintptr_t va, const void *src, size_t n, void *s)
{
    if (!src && n)
        return VMM_DRV_INVALID_VALUE;
    RETURN_IN_CONTEXT(as_cuda(d), cu.memcpy_htod_async((CUdeviceptr)va, src, n, as_stream(s)));
}

/* The ipc config key: pages exportable as POSIX fds from now on, or plain. A refusal by the system
 * at cuMemCreate time still falls back to plain pages (cu_mem_create). */
static int cu_set_exportable(vmm_driver *d, int on)
{
    cuda_driver *c = as_cuda(d);
    if (on && (!c->info.vmm_supported || !c->fd_supported))
        return VMM_DRV_NOT_SUPPORTED;
    c->fd_handles = on != 0;
    return VMM_DRV_SUCCESS;
}

/* A POSIX fd travels by value: cuMemExportToShareableHandle writes an int, and
 * cuMemImportFromShareableHandle takes it in the pointer, (void *)(uintptr_t)fd. No context is
 * needed (the handle names its device), but the calls run in ours like every other. */
static int cu_export_fd(vmm_driver *d, vmm_phys h, int *fd)
{
    if (!fd)
        return VMM_DRV_INVALID_VALUE;
    int out = -1;
    CUcontext prev;
    CUresult r = ctx_enter(as_cuda(d), &prev);
    if (r == CUDA_SUCCESS)
        r = cu.export_shareable(&out, (CUmemGenericAllocationHandle)h,
                                CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    ctx_leave(as_cuda(d), prev);
    if (r == CUDA_SUCCESS)
        *fd = out;
    return (int)r;
}

static int cu_import_fd(vmm_driver *d, int fd, vmm_phys *out)
{
    if (!out || fd < 0)
        return VMM_DRV_INVALID_VALUE;
    CUmemGenericAllocationHandle h = 0;
    CUcontext prev;
    CUresult r = ctx_enter(as_cuda(d), &prev);
    if (r == CUDA_SUCCESS)
        r = cu.import_shareable(&h, (void *)(uintptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ctx_leave(as_cuda(d), prev);
    if (r == CUDA_SUCCESS)
        *out = (vmm_phys)h;
    return (int)r;
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
    .event_prepare = cu_event_prepare,
    .peer_enable = cu_peer_enable,
    .stream_capture_info = cu_stream_capture_info,
    .capture_mode_exchange = cu_capture_mode_exchange,
    .launch_host = cu_launch_host,
    .memset32 = cu_memset32,
    .memcpy_dtoh = cu_memcpy_dtoh,
    .memcpy_htod = cu_memcpy_htod,
    .set_exportable = cu_set_exportable,
    .export_fd = cu_export_fd,
    .import_fd = cu_import_fd,
    .lookup_mapping = cu_lookup_mapping,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .close = cu_close,
};

static int device_attribute(const cuda_driver *c, CUdevice_attribute attr, const char *name, int *out,
                            char *msg, size_t msg_len)
{
    *out = 0;
    CUresult r = cu.device_get_attribute(out, attr, c->dev);
    if (r != CUDA_SUCCESS)
        msg_set(msg, msg_len, "device %d: cuDeviceGetAttribute(%s) failed: %s (%d)", c->info.ordinal,
                name, result_name(r), (int)r);
    return (int)r;
}

/* Device facts the contract's device_info reports, queried once at open. */
static CUresult query_device(cuda_driver *c, char *msg, size_t msg_len)
{
    vmm_device_info *info = &c->info;
    int vmm = 0, gdr = 0, fd = 0;
    int r = device_attribute(c, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                             "VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED", &vmm, msg, msg_len);
    if (r == CUDA_SUCCESS && vmm)
        r = device_attribute(c, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED,
                             "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED", &gdr, msg, msg_len);
    if (r == CUDA_SUCCESS && vmm)
        r = device_attribute(c, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                             "HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED", &fd, msg, msg_len);
    if (r != CUDA_SUCCESS)
        return (CUresult)r;
    info->vmm_supported = vmm != 0;
    info->gdr_supported = gdr != 0;
    c->fd_handles = fd != 0;
    c->fd_supported = fd != 0;
    CUresult cr = cu.device_get_count(&info->device_count);
    if (cr == CUDA_SUCCESS)
        cr = cu.device_total_mem(&info->total_bytes, c->dev);
    if (cr == CUDA_SUCCESS)
        cr = cu.device_get_name(info->name, (int)sizeof info->name, c->dev);
    if (cr != CUDA_SUCCESS) {
        msg_set(msg, msg_len, "device %d: cuDeviceGetCount/TotalMem/GetName failed: %s (%d)",
                info->ordinal, result_name(cr), (int)cr);
        return cr;
    }
    info->name[sizeof info->name - 1] = '\0';
    info->granularity = NOMINAL_GRANULARITY;
    info->recommended_granularity = NOMINAL_GRANULARITY;
    if (info->vmm_supported) {
        /* the granularity of the pages we will create: same properties as mem_create */
        CUmemAllocationProp prop = device_prop(c);
        size_t min = 0, rec = 0;
        cr = cu.get_granularity(&min, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        if (cr == CUDA_SUCCESS)
            cr = cu.get_granularity(&rec, &prop, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        if (cr != CUDA_SUCCESS || min == 0) {
            msg_set(msg, msg_len, "device %d: cuMemGetAllocationGranularity failed: %s (%d)",
                    info->ordinal, result_name(cr), (int)cr);
            return cr != CUDA_SUCCESS ? cr : CUDA_ERROR_UNKNOWN;
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
        /* The stub library means no driver is installed; any other failure is a broken one and
         * keeps its own result, so that it is not mistaken for "no GPU here". */
        return r == CUDA_ERROR_STUB_LIBRARY ? VMM_DRV_NOT_INITIALIZED : (int)r;
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
        return r == CUDA_ERROR_INVALID_VALUE || r == CUDA_ERROR_INVALID_DEVICE ? VMM_DRV_INVALID_DEVICE
                                                                             : (int)r;
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
