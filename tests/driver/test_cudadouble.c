// ctest-labels: unit double
// ctest-cudadouble: only
// ctest-timeout: 300
/*
 * The CUDA driver double (tests/cudadouble) against cuda.h: every entry point is reached as a
 * library under test reaches it, dlopen("libcuda.so.1") + cuGetProcAddress_v2, and the double's
 * hooks play kernels (device_access) and inject faults.
 *
 * Each case runs in a forked child of a parent that never initializes the driver, so every case
 * starts from a fresh driver (its own CUDADOUBLE_* environment, no sticky error left by another
 * case), and the undefined-behaviour cases can abort.
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cudadouble.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- the API, as a library under test resolves it --------------------------------------------- */

static void *lib;
static PFN_cuGetProcAddress_v12000 get_proc;
static PFN_cuGetProcAddress_v11030 get_proc_v1;
static const cudadouble_hooks_t *hooks;

static struct {
    PFN_cuInit_v2000 Init;
    PFN_cuDriverGetVersion_v2020 DriverGetVersion;
    PFN_cuGetErrorName_v6000 GetErrorName;
    PFN_cuGetErrorString_v6000 GetErrorString;
    PFN_cuDeviceGet_v2000 DeviceGet;
    PFN_cuDeviceGetCount_v2000 DeviceGetCount;
    PFN_cuDeviceGetAttribute_v2000 DeviceGetAttribute;
    PFN_cuDeviceGetName_v2000 DeviceGetName;
    PFN_cuDeviceTotalMem_v3020 DeviceTotalMem;
    PFN_cuDeviceCanAccessPeer_v4000 DeviceCanAccessPeer;
    PFN_cuMemGetAllocationGranularity_v10020 MemGetAllocationGranularity;
    PFN_cuDevicePrimaryCtxRetain_v7000 PrimaryCtxRetain;
    PFN_cuDevicePrimaryCtxRelease_v11000 PrimaryCtxRelease;
    PFN_cuCtxGetCurrent_v4000 CtxGetCurrent;
    PFN_cuCtxSetCurrent_v4000 CtxSetCurrent;
    PFN_cuCtxPushCurrent_v4000 CtxPushCurrent;
    PFN_cuCtxPopCurrent_v4000 CtxPopCurrent;
    PFN_cuCtxGetDevice_v2000 CtxGetDevice;
    PFN_cuCtxSynchronize_v2000 CtxSynchronize;
    PFN_cuMemGetInfo_v3020 MemGetInfo;
    PFN_cuMemAddressReserve_v10020 MemAddressReserve;
    PFN_cuMemAddressFree_v10020 MemAddressFree;
    PFN_cuMemCreate_v10020 MemCreate;
    PFN_cuMemRelease_v10020 MemRelease;
    PFN_cuMemMap_v10020 MemMap;
    PFN_cuMemUnmap_v10020 MemUnmap;
    PFN_cuMemSetAccess_v10020 MemSetAccess;
    PFN_cuMemGetAccess_v10020 MemGetAccess;
    PFN_cuMemRetainAllocationHandle_v11000 MemRetainAllocationHandle;
    PFN_cuMemGetAllocationPropertiesFromHandle_v10020 MemGetAllocationPropertiesFromHandle;
    PFN_cuMemExportToShareableHandle_v10020 MemExportToShareableHandle;
    PFN_cuMemImportFromShareableHandle_v10020 MemImportFromShareableHandle;
    PFN_cuMemAlloc_v3020 MemAlloc;
    PFN_cuMemFree_v3020 MemFree;
    PFN_cuMemHostAlloc_v2020 MemHostAlloc;
    PFN_cuMemFreeHost_v2000 MemFreeHost;
    PFN_cuStreamCreate_v2000 StreamCreate;
    PFN_cuStreamDestroy_v4000 StreamDestroy;
    PFN_cuStreamSynchronize_v2000 StreamSynchronize;
    PFN_cuStreamQuery_v2000 StreamQuery;
    PFN_cuStreamWaitEvent_v3020 StreamWaitEvent;
    PFN_cuStreamGetCtx_v9020 StreamGetCtx;
    PFN_cuStreamBeginCapture_v10010 StreamBeginCapture;
    PFN_cuStreamEndCapture_v10000 StreamEndCapture;
    PFN_cuStreamIsCapturing_v10000 StreamIsCapturing;
    PFN_cuStreamGetCaptureInfo_v11030 StreamGetCaptureInfo;
    PFN_cuThreadExchangeStreamCaptureMode_v10010 ThreadExchangeStreamCaptureMode;
    PFN_cuGraphDestroy_v10000 GraphDestroy;
    PFN_cuEventCreate_v2000 EventCreate;
    PFN_cuEventRecord_v2000 EventRecord;
    PFN_cuEventQuery_v2000 EventQuery;
    PFN_cuEventSynchronize_v2000 EventSynchronize;
    PFN_cuEventDestroy_v4000 EventDestroy;
    PFN_cuLaunchHostFunc_v10000 LaunchHostFunc;
    PFN_cuMemsetD32Async_v3020 MemsetD32Async;
    PFN_cuMemsetD8Async_v3020 MemsetD8Async;
    PFN_cuMemcpyDtoHAsync_v3020 MemcpyDtoHAsync;
    PFN_cuMemcpyHtoDAsync_v3020 MemcpyHtoDAsync;
} cu;

static void *proc(const char *name, int version, cuuint64_t flags)
{
    void *p = NULL;
    CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    CUresult r = get_proc(name, &p, version, flags, &st);
    if (r != CUDA_SUCCESS || st != CU_GET_PROC_ADDRESS_SUCCESS || !p) {
        fprintf(stderr, "cuGetProcAddress(%s, %d) failed: %d / %d\n", name, version, (int)r, (int)st);
        exit(2);
    }
    return p;
}

#define RESOLVE(member, name)                                                              \
    do {                                                                                   \
        void *p_ = proc(name, 12000, CU_GET_PROC_ADDRESS_LEGACY_STREAM);                   \
        memcpy(&cu.member, &p_, sizeof p_);                                                \
    } while (0)

static void *sym(const char *name)
{
    return dlsym(lib, name);
}

static void load(void)
{
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "libcuda.so.1 (the CUDA double) not found: %s; this test runs with "
                        "tests/cudadouble's build directory on LD_LIBRARY_PATH\n", dlerror());
        exit(1);
    }
    void *p = sym("cuGetProcAddress_v2");
    void *q = sym("cuGetProcAddress");
    hooks = cudadouble_hooks();
    if (!p || !q || !hooks) {
        fprintf(stderr, "libcuda.so.1 is not the CUDA double (no cuGetProcAddress_v2 or hooks)\n");
        exit(1);
    }
    memcpy(&get_proc, &p, sizeof p);
    memcpy(&get_proc_v1, &q, sizeof q);
    RESOLVE(Init, "cuInit");
    RESOLVE(DriverGetVersion, "cuDriverGetVersion");
    RESOLVE(GetErrorName, "cuGetErrorName");
    RESOLVE(GetErrorString, "cuGetErrorString");
    RESOLVE(DeviceGet, "cuDeviceGet");
    RESOLVE(DeviceGetCount, "cuDeviceGetCount");
    RESOLVE(DeviceGetAttribute, "cuDeviceGetAttribute");
    RESOLVE(DeviceGetName, "cuDeviceGetName");
    RESOLVE(DeviceTotalMem, "cuDeviceTotalMem");
    RESOLVE(DeviceCanAccessPeer, "cuDeviceCanAccessPeer");
    RESOLVE(MemGetAllocationGranularity, "cuMemGetAllocationGranularity");
    RESOLVE(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    RESOLVE(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease");
    RESOLVE(CtxGetCurrent, "cuCtxGetCurrent");
    RESOLVE(CtxSetCurrent, "cuCtxSetCurrent");
    RESOLVE(CtxPushCurrent, "cuCtxPushCurrent");
    RESOLVE(CtxPopCurrent, "cuCtxPopCurrent");
    RESOLVE(CtxGetDevice, "cuCtxGetDevice");
    RESOLVE(CtxSynchronize, "cuCtxSynchronize");
    RESOLVE(MemGetInfo, "cuMemGetInfo");
    RESOLVE(MemAddressReserve, "cuMemAddressReserve");
    RESOLVE(MemAddressFree, "cuMemAddressFree");
    RESOLVE(MemCreate, "cuMemCreate");
    RESOLVE(MemRelease, "cuMemRelease");
    RESOLVE(MemMap, "cuMemMap");
    RESOLVE(MemUnmap, "cuMemUnmap");
    RESOLVE(MemSetAccess, "cuMemSetAccess");
    RESOLVE(MemGetAccess, "cuMemGetAccess");
    RESOLVE(MemRetainAllocationHandle, "cuMemRetainAllocationHandle");
    RESOLVE(MemGetAllocationPropertiesFromHandle, "cuMemGetAllocationPropertiesFromHandle");
    RESOLVE(MemExportToShareableHandle, "cuMemExportToShareableHandle");
    RESOLVE(MemImportFromShareableHandle, "cuMemImportFromShareableHandle");
    RESOLVE(MemAlloc, "cuMemAlloc");
    RESOLVE(MemFree, "cuMemFree");
    RESOLVE(MemHostAlloc, "cuMemHostAlloc");
    RESOLVE(MemFreeHost, "cuMemFreeHost");
    RESOLVE(StreamCreate, "cuStreamCreate");
    RESOLVE(StreamDestroy, "cuStreamDestroy");
    RESOLVE(StreamSynchronize, "cuStreamSynchronize");
    RESOLVE(StreamQuery, "cuStreamQuery");
    RESOLVE(StreamWaitEvent, "cuStreamWaitEvent");
    RESOLVE(StreamGetCtx, "cuStreamGetCtx");
    RESOLVE(StreamBeginCapture, "cuStreamBeginCapture");
    RESOLVE(StreamEndCapture, "cuStreamEndCapture");
    RESOLVE(StreamIsCapturing, "cuStreamIsCapturing");
    RESOLVE(StreamGetCaptureInfo, "cuStreamGetCaptureInfo");
    RESOLVE(ThreadExchangeStreamCaptureMode, "cuThreadExchangeStreamCaptureMode");
    RESOLVE(GraphDestroy, "cuGraphDestroy");
    RESOLVE(EventCreate, "cuEventCreate");
    RESOLVE(EventRecord, "cuEventRecord");
    RESOLVE(EventQuery, "cuEventQuery");
    RESOLVE(EventSynchronize, "cuEventSynchronize");
    RESOLVE(EventDestroy, "cuEventDestroy");
    RESOLVE(LaunchHostFunc, "cuLaunchHostFunc");
    RESOLVE(MemsetD32Async, "cuMemsetD32Async");
    RESOLVE(MemsetD8Async, "cuMemsetD8Async");
    RESOLVE(MemcpyDtoHAsync, "cuMemcpyDtoHAsync");
    RESOLVE(MemcpyHtoDAsync, "cuMemcpyHtoDAsync");
}

/* ---- helpers ---------------------------------------------------------------------------------- */

static CUcontext ctx_of(int dev)
{
    CUcontext c = NULL;
    CHECK_EQ(cu.PrimaryCtxRetain(&c, dev), CUDA_SUCCESS);
    return c;
}

/* cuInit and device dev's primary context current. */
static CUcontext init_with(int dev)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CUcontext c = ctx_of(dev);
    CHECK_EQ(cu.CtxSetCurrent(c), CUDA_SUCCESS);
    return c;
}

static CUmemAllocationProp device_prop(int dev)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    return p;
}

static CUmemAccessDesc access_for(int dev, CUmemAccess_flags flags)
{
    CUmemAccessDesc a;
    memset(&a, 0, sizeof a);
    a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    a.location.id = dev;
    a.flags = flags;
    return a;
}

/* A reserved, mapped, dev0-accessible range of `size` bytes on the current context's device. */
typedef struct vmm_range {
    CUdeviceptr va;
    size_t size;
    CUmemGenericAllocationHandle h;
} vmm_range;

static vmm_range vmm_make(int dev, size_t size, unsigned handle_types)
{
    vmm_range v = {0, size, 0};
    CUmemAllocationProp p = device_prop(dev);
    p.requestedHandleTypes = (CUmemAllocationHandleType)handle_types;
    CHECK_EQ(cu.MemAddressReserve(&v.va, size, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemCreate(&v.h, size, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemMap(v.va, size, 0, v.h, 0), CUDA_SUCCESS);
    CUmemAccessDesc a = access_for(dev, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cu.MemSetAccess(v.va, size, &a, 1), CUDA_SUCCESS);
    return v;
}

static void vmm_drop(vmm_range v)
{
    CHECK_EQ(cu.MemUnmap(v.va, v.size), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(v.h), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAddressFree(v.va, v.size), CUDA_SUCCESS);
}

/* Nothing of the double's left alive (streams, events, memory, captures), nor in its simulator. */
static void check_clean(void)
{
    cudadouble_objects_t o;
    hooks->objects(&o);
    CHECK_EQ(o.streams, 0);
    CHECK_EQ(o.events, 0);
    CHECK_EQ(o.graphs, 0);
    CHECK_EQ(o.handle_refs, 0);
    CHECK_EQ(o.reservations, 0);
    CHECK_EQ(o.mappings, 0);
    CHECK_EQ(o.linear_allocs, 0);
    CHECK_EQ(o.host_allocs, 0);
    CHECK_EQ(o.captures, 0);
    vmm_sim_counters live;
    hooks->live(&live, NULL);
    CHECK_EQ(live.phys_bytes, 0);
    CHECK_EQ(live.live_handles, 0);
    CHECK_EQ(live.mapped_bytes, 0);
    CHECK_EQ(live.reserved_va_bytes, 0);
    CHECK_EQ(live.live_classic_allocs, 0);
    CHECK_EQ(live.live_streams, 0);
    CHECK_EQ(live.live_events, 0);
    CHECK_EQ(live.host_bytes, 0);
}

/* Run fn on a thread of its own and wait for it. */
static void on_thread(void *(*fn)(void *), void *arg)
{
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, fn, arg), 0);
    pthread_join(t, NULL);
}

static void set_flag(void *p) { atomic_store((atomic_int *)p, 1); }

/* ---- cases ------------------------------------------------------------------------------------ */

static void case_init(void)
{
    int n = -1, v = 0;
    /* "If cuInit() has not been called, any function from the driver API will return
     * CUDA_ERROR_NOT_INITIALIZED." Version and error names need no initialization. */
    CHECK_EQ(cu.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    CUcontext c = NULL;
    CHECK_EQ(cu.CtxGetCurrent(&c), CUDA_ERROR_NOT_INITIALIZED);
    CHECK_EQ(cu.DriverGetVersion(&v), CUDA_SUCCESS);
    CHECK_EQ(v, 12080);
    CHECK_EQ(cu.DriverGetVersion(NULL), CUDA_ERROR_INVALID_VALUE);
    const char *s = NULL;
    CHECK_EQ(cu.GetErrorName(CUDA_ERROR_ILLEGAL_ADDRESS, &s), CUDA_SUCCESS);
    CHECK(s && strcmp(s, "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    CHECK_EQ(cu.GetErrorString(CUDA_ERROR_OUT_OF_MEMORY, &s), CUDA_SUCCESS);
    CHECK(s && strlen(s) > 0);
    CHECK_EQ(cu.GetErrorName((CUresult)12345, &s), CUDA_ERROR_INVALID_VALUE);
    CHECK(s == NULL);
    /* "Currently, the Flags parameter must be 0." */
    CHECK_EQ(cu.Init(1), CUDA_ERROR_INVALID_VALUE);
    setenv("CUDADOUBLE_FAIL_INIT", "999", 1);
    CHECK_EQ(cu.Init(0), CUDA_ERROR_UNKNOWN);
    CHECK_EQ(cu.DeviceGetCount(&n), CUDA_ERROR_NOT_INITIALIZED);
    unsetenv("CUDADOUBLE_FAIL_INIT");
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CHECK_EQ(cu.DeviceGetCount(&n), CUDA_SUCCESS);
    CHECK_EQ(n, 2);
    CHECK_EQ(hooks->calls("cuInit"), 4);
}

static void case_no_device(void)
{
    CHECK_EQ(cu.Init(0), CUDA_ERROR_NO_DEVICE);
}

static void *sym_or_null(const char *name, int version, cuuint64_t flags, CUdriverProcAddressQueryResult *st)
{
    void *p = (void *)&p;
    CHECK_EQ(get_proc(name, &p, version, flags, st), CUDA_SUCCESS);
    return p;
}

static void case_get_proc(void)
{
    CUdriverProcAddressQueryResult st;
    const cuuint64_t legacy = CU_GET_PROC_ADDRESS_LEGACY_STREAM;
    const cuuint64_t ptds = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    /* The version picks the ABI, the symbol name has no _v2. */
    CHECK(sym_or_null("cuMemAlloc", 12000, legacy, &st) == sym("cuMemAlloc_v2"));
    CHECK(sym_or_null("cuMemAlloc", 3010, legacy, &st) == sym("cuMemAlloc"));
    CHECK(sym_or_null("cuCtxSynchronize", 12000, legacy, &st) == sym("cuCtxSynchronize"));
    CHECK(sym_or_null("cuCtxSynchronize", 13000, legacy, &st) == sym("cuCtxSynchronize_v2"));
    CHECK(sym_or_null("cuStreamBeginCapture", 12000, legacy, &st) == sym("cuStreamBeginCapture_v2"));
    CHECK(sym_or_null("cuStreamBeginCapture", 10000, legacy, &st) == sym("cuStreamBeginCapture"));
    CHECK(sym_or_null("cuStreamGetCaptureInfo", 12000, legacy, &st) == sym("cuStreamGetCaptureInfo_v2"));
    CHECK(sym_or_null("cuStreamGetCaptureInfo", 12030, legacy, &st) == sym("cuStreamGetCaptureInfo_v3"));
    CHECK(sym_or_null("cuDevicePrimaryCtxRelease", 12000, legacy, &st) ==
          sym("cuDevicePrimaryCtxRelease_v2"));
    CHECK(sym_or_null("cuDevicePrimaryCtxRelease", 10000, legacy, &st) == sym("cuDevicePrimaryCtxRelease"));
    CHECK(sym_or_null("cuCtxPushCurrent", 12000, legacy, &st) == sym("cuCtxPushCurrent_v2"));
    CHECK(sym_or_null("cuMemGetInfo", 12000, legacy, &st) == sym("cuMemGetInfo_v2"));
    CHECK(sym_or_null("cuEventDestroy", 12000, legacy, &st) == sym("cuEventDestroy_v2"));
    CHECK(sym_or_null("cuStreamGetCtx", 12000, legacy, &st) == sym("cuStreamGetCtx"));
    CHECK(sym_or_null("cuStreamGetCtx", 12050, legacy, &st) == sym("cuStreamGetCtx_v2"));
    CHECK(sym_or_null("cuGetProcAddress", 12000, legacy, &st) == sym("cuGetProcAddress_v2"));
    /* Per-thread variants only when asked for; none before CUDA 7.0 for the copies. */
    CHECK(sym_or_null("cuStreamSynchronize", 12000, ptds, &st) == sym("cuStreamSynchronize_ptsz"));
    CHECK(sym_or_null("cuStreamSynchronize", 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st) ==
          sym("cuStreamSynchronize"));
    CHECK(sym_or_null("cuMemcpyHtoDAsync", 12000, ptds, &st) == sym("cuMemcpyHtoDAsync_v2_ptsz"));
    CHECK(sym_or_null("cuMemcpyHtoDAsync", 5000, ptds, &st) == sym("cuMemcpyHtoDAsync_v2"));
    CHECK(sym_or_null("cuMemsetD8Async", 12000, ptds, &st) == sym("cuMemsetD8Async_ptsz"));
    CHECK(sym_or_null("cuInit", 12000, ptds, &st) == sym("cuInit")); /* "return the legacy version" */
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SUCCESS);
    /* "The API will return CUDA_SUCCESS and set the returned pfn to NULL if ... the driver symbol is
     * invalid", the reason in symbolStatus. */
    CHECK(sym_or_null("cuNoSuchCall", 12000, legacy, &st) == NULL);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK(sym_or_null("cuMemAlloc_v2", 12000, legacy, &st) == NULL);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK(sym_or_null("cuMemCreate", 10010, legacy, &st) == NULL);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    /* "If the specified CUDA version is greater than the driver version, the API will return
     * CUDA_ERROR_INVALID_VALUE." */
    void *p = NULL;
    CHECK_EQ(get_proc("cuInit", &p, 13010, legacy, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(get_proc("cuInit", NULL, 12000, legacy, &st), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(get_proc_v1("cuMemMap", &p, 12000, legacy), CUDA_SUCCESS);
    CHECK(p == sym("cuMemMap"));
    CHECK(hooks->calls("cuGetProcAddress") > 60);
}

static void case_get_proc_errors(void)
{
    CUdriverProcAddressQueryResult st;
    void *p = NULL;
    CHECK_EQ(get_proc("cuNoSuchCall", &p, 12000, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    CHECK_EQ(get_proc("cuMemCreate", &p, 10010, 0, &st), CUDA_ERROR_NOT_FOUND);
    CHECK_EQ(st, CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT);
    CHECK(p == NULL);
}

static void case_devices(void)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CUdevice d = -1;
    CHECK_EQ(cu.DeviceGet(&d, 1), CUDA_SUCCESS);
    CHECK_EQ(d, 1);
    CHECK_EQ(cu.DeviceGet(&d, 2), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(cu.DeviceGet(NULL, 0), CUDA_ERROR_INVALID_VALUE);
    char name[64];
    CHECK_EQ(cu.DeviceGetName(name, sizeof name, 1), CUDA_SUCCESS);
    CHECK(strcmp(name, "CUDA double device 1") == 0);
    CHECK_EQ(cu.DeviceGetName(name, 5, 0), CUDA_SUCCESS);
    CHECK(strcmp(name, "CUDA") == 0);
    CHECK_EQ(cu.DeviceGetName(name, 64, 7), CUDA_ERROR_INVALID_DEVICE);
    size_t total = 0;
    CHECK_EQ(cu.DeviceTotalMem(&total, 0), CUDA_SUCCESS);
    CHECK_EQ(total, 80 * GiB);
    int v = -1;
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(v, 1);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 1),
             CUDA_SUCCESS);
    CHECK_EQ(v, 1);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 1),
             CUDA_SUCCESS);
    CHECK_EQ(v, 1);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING, 0), CUDA_SUCCESS);
    CHECK_EQ(v, 1);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_WIN32_HANDLE_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(v, 0);
    CHECK_EQ(cu.DeviceGetAttribute(&v, (CUdevice_attribute)0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_MAX, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, 3), CUDA_ERROR_INVALID_DEVICE);
    int can = -1;
    CHECK_EQ(cu.DeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
    CHECK_EQ(can, 1);
    CHECK_EQ(cu.DeviceCanAccessPeer(&can, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(can, 0);
    CUmemAllocationProp p = device_prop(1);
    size_t g = 0;
    CHECK_EQ(cu.MemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    CHECK_EQ(g, 2 * MiB);
    CHECK_EQ(cu.MemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED), CUDA_SUCCESS);
    CHECK_EQ(g, 2 * MiB);
    CHECK_EQ(cu.MemGetAllocationGranularity(&g, &p, (CUmemAllocationGranularity_flags)7),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemGetAllocationGranularity(&g, NULL, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_ERROR_INVALID_VALUE);
}

static void case_device_env(void)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    int n = 0, v = -1, can = -1;
    CHECK_EQ(cu.DeviceGetCount(&n), CUDA_SUCCESS);
    CHECK_EQ(n, 3);
    size_t total = 0, g = 0;
    CHECK_EQ(cu.DeviceTotalMem(&total, 2), CUDA_SUCCESS);
    CHECK_EQ(total, 64 * MiB);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 2),
             CUDA_SUCCESS);
    CHECK_EQ(v, 0);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, 1),
             CUDA_SUCCESS);
    CHECK_EQ(v, 0);
    CHECK_EQ(cu.DeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, 0),
             CUDA_SUCCESS);
    CHECK_EQ(v, 0);
    CHECK_EQ(cu.DeviceCanAccessPeer(&can, 0, 1), CUDA_SUCCESS);
    CHECK_EQ(can, 0);
    CHECK_EQ(cu.DeviceCanAccessPeer(&can, 1, 0), CUDA_SUCCESS);
    CHECK_EQ(can, 1);
    CUmemAllocationProp p = device_prop(0);
    CHECK_EQ(cu.MemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
    CHECK_EQ(g, 64 << 10);
    CUmemGenericAllocationHandle h = 0;
    /* capabilities the devices lack */
    p = device_prop(2);
    CHECK_EQ(cu.MemGetAllocationGranularity(&g, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
             CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(cu.MemCreate(&h, 64 << 10, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = device_prop(0);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CHECK_EQ(cu.MemCreate(&h, 64 << 10, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = device_prop(1);
    p.allocFlags.gpuDirectRDMACapable = 1;
    CHECK_EQ(cu.MemCreate(&h, 64 << 10, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = device_prop(0);
    CHECK_EQ(cu.MemCreate(&h, 128 * MiB, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    /* cuMemSetAccess for a device that cannot reach the memory's device: INVALID_DEVICE */
    init_with(1);
    vmm_range r = vmm_make(1, 64 << 10, 0);
    CUmemAccessDesc a = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cu.MemSetAccess(r.va, r.size, &a, 1), CUDA_ERROR_INVALID_DEVICE);
    a = access_for(2, CU_MEM_ACCESS_FLAGS_PROT_READ);
    CHECK_EQ(cu.MemSetAccess(r.va, r.size, &a, 1), CUDA_SUCCESS);
    vmm_drop(r);
    CHECK_EQ(cu.PrimaryCtxRelease(1), CUDA_SUCCESS);
    check_clean();
}

static void *thread_current(void *arg)
{
    CUcontext c = (CUcontext)&c;
    CHECK_EQ(cu.CtxGetCurrent(&c), CUDA_SUCCESS);
    CHECK(c == NULL); /* a new thread has no context */
    *(CUcontext *)arg = hooks->current_context();
    return NULL;
}

static void case_contexts(void)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CUcontext cur = (CUcontext)&cur;
    CHECK_EQ(cu.CtxGetCurrent(&cur), CUDA_SUCCESS);
    CHECK(cur == NULL);
    /* Calls that work on the current context need one. */
    CUdeviceptr p = 0;
    CUstream s = NULL;
    CUevent e = NULL;
    size_t fr = 0, tot = 0;
    CHECK_EQ(cu.MemAlloc(&p, 256), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.StreamCreate(&s, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.EventCreate(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.MemGetInfo(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.CtxSynchronize(), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.MemAddressReserve(&p, 2 * MiB, 0, 0, 0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.StreamSynchronize(NULL), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.StreamGetCtx(NULL, &cur), CUDA_ERROR_INVALID_CONTEXT);
    CUdevice d = -1;
    CHECK_EQ(cu.CtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
    /* Retained, not made current ("the newly retained context is not pushed onto the stack"). */
    unsigned count = 9;
    CHECK(hooks->primary_context(0, &count) == NULL);
    CUcontext c0 = ctx_of(0), c0b = ctx_of(0), c1 = ctx_of(1);
    CHECK(c0 == c0b && c0 != c1);
    CHECK(hooks->primary_context(0, &count) == c0);
    CHECK_EQ(count, 2);
    CHECK(hooks->current_context() == NULL);
    CHECK_EQ(cu.CtxSetCurrent(c0), CUDA_SUCCESS);
    CHECK_EQ(cu.CtxGetDevice(&d), CUDA_SUCCESS);
    CHECK_EQ(d, 0);
    CHECK_EQ(cu.MemGetInfo(&fr, &tot), CUDA_SUCCESS);
    CHECK_EQ(tot, 80 * GiB);
    /* The stack: push, pop, set replaces the top. */
    CHECK_EQ(cu.CtxPushCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(cu.CtxGetDevice(&d), CUDA_SUCCESS);
    CHECK_EQ(d, 1);
    CHECK_EQ(cu.CtxSetCurrent(c0), CUDA_SUCCESS); /* top is c0 now, c0 under it */
    CHECK_EQ(cu.CtxPopCurrent(&cur), CUDA_SUCCESS);
    CHECK(cur == c0);
    CHECK(hooks->current_context() == c0);
    CHECK_EQ(cu.CtxPushCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(cu.CtxPopCurrent(&cur), CUDA_SUCCESS);
    CHECK(cur == c1 && hooks->current_context() == c0);
    /* "If ctx is NULL then the CUDA context previously bound to the calling CPU thread is unbound" */
    CHECK_EQ(cu.CtxSetCurrent(NULL), CUDA_SUCCESS);
    CHECK(hooks->current_context() == NULL);
    CHECK_EQ(cu.CtxSetCurrent(NULL), CUDA_SUCCESS); /* a no-op on an empty stack */
    CHECK_EQ(cu.CtxPopCurrent(&cur), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.CtxPushCurrent(NULL), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.CtxSetCurrent((CUcontext)&cur), CUDA_ERROR_INVALID_CONTEXT);
    CUcontext seen = (CUcontext)&seen;
    CHECK_EQ(cu.CtxSetCurrent(c0), CUDA_SUCCESS);
    on_thread(thread_current, &seen);
    CHECK(seen == NULL);
    /* Streams know their context; the special handles name the current one. */
    CHECK_EQ(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamCreate(&s, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.CtxPushCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamGetCtx(s, &cur), CUDA_SUCCESS);
    CHECK(cur == c0);
    CHECK_EQ(cu.StreamGetCtx(CU_STREAM_LEGACY, &cur), CUDA_SUCCESS);
    CHECK(cur == c1);
    CHECK_EQ(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);
    /* Released to zero: the context is reset, its stream and memory go with it. */
    CHECK_EQ(cu.MemAlloc(&p, 4096), CUDA_SUCCESS);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemGetInfo(&fr, &tot), CUDA_SUCCESS); /* one reference left */
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemGetInfo(&fr, &tot), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_ERROR_INVALID_CONTEXT);
    CHECK_EQ(cu.CtxPushCurrent(c0), CUDA_ERROR_INVALID_CONTEXT);
    cudadouble_objects_t o;
    hooks->objects(&o);
    CHECK_EQ(o.streams, 0);
    CHECK_EQ(o.linear_allocs, 0);
    CHECK_EQ(o.reclaimed_by_reset, 2);
    CHECK(ctx_of(0) == c0); /* the same handle, active again */
    CHECK_EQ(cu.MemGetInfo(&fr, &tot), CUDA_SUCCESS);
    CHECK_EQ(fr, tot);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    CHECK_EQ(cu.PrimaryCtxRelease(1), CUDA_SUCCESS);
    unsigned retained = 7;
    hooks->live(NULL, &retained);
    CHECK_EQ(retained, 0);
    check_clean();
}

static void case_alloc_props(void)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = device_prop(0);
    /* no context needed: the device is prop->location.id's */
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemCreate(&h, 0, &p, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemCreate(&h, 1 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, NULL, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemCreate(NULL, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p.type = CU_MEM_ALLOCATION_TYPE_INVALID;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = device_prop(0);
    p.location.type = CU_MEM_LOCATION_TYPE_HOST;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p.location.type = CU_MEM_LOCATION_TYPE_HOST_NUMA_CURRENT;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = device_prop(5);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_DEVICE);
    p = device_prop(0);
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_WIN32;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p.requestedHandleTypes = (CUmemAllocationHandleType)0x100;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = device_prop(0);
    p.win32HandleMetaData = &p;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = device_prop(0);
    p.allocFlags.compressionType = 5;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    p = device_prop(0);
    p.allocFlags.usage = CU_MEM_CREATE_USAGE_TILE_POOL;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_NOT_SUPPORTED);
    p = device_prop(0);
    p.allocFlags.reserved[2] = 1;
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_INVALID_VALUE);
    /* Compression is a hint: accepted, and the handle says it was not granted. */
    p = device_prop(1);
    p.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
    p.allocFlags.gpuDirectRDMACapable = 1;
    p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    CUmemGenericAllocationHandle h1 = 0, h0 = 0;
    CHECK_EQ(cu.MemCreate(&h1, 4 * MiB, &p, 0), CUDA_SUCCESS);
    CUmemAllocationProp got;
    memset(&got, 0xff, sizeof got);
    CHECK_EQ(cu.MemGetAllocationPropertiesFromHandle(&got, h1), CUDA_SUCCESS);
    CHECK_EQ(got.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    CHECK_EQ(got.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    CHECK_EQ(got.location.id, 1);
    CHECK_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CHECK_EQ(got.allocFlags.gpuDirectRDMACapable, 1);
    CHECK_EQ(got.allocFlags.compressionType, CU_MEM_ALLOCATION_COMP_NONE);
    /* Handle values are unique over devices. */
    p = device_prop(0);
    CHECK_EQ(cu.MemCreate(&h0, 2 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK(h0 != h1 && h0 != 0);
    /* An 80 GiB device: more is out of memory, and what fits costs no host memory until touched. */
    CUmemGenericAllocationHandle big = 0;
    CHECK_EQ(cu.MemCreate(&big, 81 * GiB, &p, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(cu.MemCreate(&big, 60 * GiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(big), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h1), CUDA_SUCCESS);
    check_clean();
}

static void case_vmm(void)
{
    init_with(0);
    CUdeviceptr va = 0, va2 = 0;
    CUmemGenericAllocationHandle h1 = 0, h2 = 0, got = 0;
    CUmemAllocationProp p = device_prop(0);
    /* cuMemAddressReserve: "The size and address parameters must be a multiple of the host page
     * size and the alignment must be a power of two or zero" */
    CHECK_EQ(cu.MemAddressReserve(&va, 2 * MiB + 1, 0, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemAddressReserve(&va, 2 * MiB, 3 * MiB, 0, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemAddressReserve(&va, 2 * MiB, 0, 0, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemAddressReserve(&va2, 4096, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAddressFree(va2, 2 * MiB), CUDA_ERROR_INVALID_VALUE); /* not the size it was given */
    CHECK_EQ(cu.MemAddressFree(va2, 4096), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAddressReserve(&va, 8 * MiB, 8 * MiB, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(va % (8 * MiB), 0);
    CHECK_EQ(cu.MemCreate(&h1, 2 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemCreate(&h2, 2 * MiB, &p, 0), CUDA_SUCCESS);
    /* Two mappings of one handle, and a second handle between them. */
    CHECK_EQ(cu.MemMap(va, 2 * MiB, 0, h1, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemMap(va + 2 * MiB, 2 * MiB, 0, h2, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemMap(va + 4 * MiB, 2 * MiB, 0, h1, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemMap(va + 6 * MiB, 2 * MiB, 2 * MiB, h2, 0), CUDA_ERROR_INVALID_VALUE); /* offset */
    CHECK_EQ(cu.MemMap(va + 6 * MiB, 4 * MiB, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);       /* past it */
    CHECK_EQ(cu.MemMap(va + 6 * MiB + 4096, 2 * MiB, 0, h2, 0), CUDA_ERROR_INVALID_VALUE);
    /* "all mappings start with no accessibility setup" */
    unsigned char buf[64], back[64];
    for (size_t i = 0; i < sizeof buf; i++)
        buf[i] = (unsigned char)(i * 7 + 1);
    CHECK_EQ(hooks->device_access(0, va, sizeof buf, buf, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUmemAccessDesc a = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cu.MemSetAccess(va, 8 * MiB, &a, 1), CUDA_ERROR_INVALID_VALUE); /* not fully mapped */
    CHECK_EQ(cu.MemSetAccess(va, 6 * MiB, NULL, 1), CUDA_ERROR_INVALID_VALUE);
    CUmemAccessDesc bad = access_for(0, (CUmemAccess_flags)2);
    CHECK_EQ(cu.MemSetAccess(va, 6 * MiB, &bad, 1), CUDA_ERROR_INVALID_VALUE);
    bad = access_for(4, CU_MEM_ACCESS_FLAGS_PROT_READ);
    CHECK_EQ(cu.MemSetAccess(va, 6 * MiB, &bad, 1), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(cu.MemSetAccess(va, 6 * MiB, &a, 1), CUDA_SUCCESS);
    /* Data written through one mapping reads back through the other. */
    CHECK_EQ(hooks->device_access(0, va + 100, sizeof buf, buf, 1), CUDA_SUCCESS);
    memset(back, 0, sizeof back);
    CHECK_EQ(hooks->device_access(0, va + 4 * MiB + 100, sizeof back, back, 0), CUDA_SUCCESS);
    CHECK(memcmp(buf, back, sizeof buf) == 0);
    /* A read straddling two handles is fine when both grant it. */
    CHECK_EQ(hooks->device_access(0, va + 2 * MiB - 32, sizeof back, back, 0), CUDA_SUCCESS);
    /* Per device: device 1 has no access until granted; READ grants no writes. */
    CHECK_EQ(hooks->device_access(1, va + 100, sizeof back, back, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUmemAccessDesc both[2] = {access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                               access_for(1, CU_MEM_ACCESS_FLAGS_PROT_READ)};
    CHECK_EQ(cu.MemSetAccess(va, 2 * MiB, both, 2), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(1, va + 100, sizeof back, back, 0), CUDA_SUCCESS);
    CHECK(memcmp(buf, back, sizeof buf) == 0);
    CHECK_EQ(hooks->device_access(1, va + 100, sizeof buf, buf, 1), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_EQ(hooks->device_access(1, va + 4 * MiB, 8, back, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    unsigned long long flags = 99;
    CUmemLocation loc = {CU_MEM_LOCATION_TYPE_DEVICE, 1};
    CHECK_EQ(cu.MemGetAccess(&flags, &loc, va + 5), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READ);
    CHECK_EQ(cu.MemGetAccess(&flags, &loc, va + 4 * MiB), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_NONE);
    loc.id = 0;
    CHECK_EQ(cu.MemGetAccess(&flags, &loc, va + 2 * MiB), CUDA_SUCCESS);
    CHECK_EQ(flags, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cu.MemGetAccess(&flags, &loc, va + 6 * MiB), CUDA_ERROR_INVALID_VALUE);
    /* "The handle is guaranteed to be the same handle value used to map the memory", from any
     * address of the mapping; it must be released as many times. */
    CHECK_EQ(cu.MemRetainAllocationHandle(&got, (void *)(uintptr_t)(va + 4 * MiB + 12345)), CUDA_SUCCESS);
    CHECK_EQ(got, h1);
    CHECK_EQ(cu.MemRelease(got), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRetainAllocationHandle(&got, (void *)(uintptr_t)(va + 6 * MiB)), CUDA_ERROR_INVALID_VALUE);
    /* "cuMemUnmap cannot unmap a sub-range" */
    CHECK_EQ(cu.MemUnmap(va, 1 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemUnmap(va, 4 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemUnmap(va + 4 * MiB, 2 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cu.MemUnmap(va + 4 * MiB, 2 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(hooks->device_access(0, va + 4 * MiB, 8, back, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* Mapped again: contents follow the handle, access starts over. */
    CHECK_EQ(cu.MemMap(va + 4 * MiB, 2 * MiB, 0, h1, 0), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(0, va + 4 * MiB + 100, 8, back, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_EQ(cu.MemSetAccess(va + 4 * MiB, 2 * MiB, &a, 1), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(0, va + 4 * MiB + 100, sizeof back, back, 0), CUDA_SUCCESS);
    CHECK(memcmp(buf, back, sizeof buf) == 0);
    /* Released while mapped: "The generic memory handle can be freed when there are still
     * outstanding mappings made with this handle." The memory stays until unmapped, and the
     * mapping still yields the handle. */
    CHECK_EQ(cu.MemRelease(h1), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(0, va + 100, sizeof back, back, 0), CUDA_SUCCESS);
    CHECK(memcmp(buf, back, sizeof buf) == 0);
    CHECK_EQ(cu.MemRetainAllocationHandle(&got, (void *)(uintptr_t)va), CUDA_SUCCESS);
    CHECK_EQ(got, h1);
    CHECK_EQ(cu.MemRelease(got), CUDA_SUCCESS);
    vmm_sim_counters k;
    CHECK_EQ(hooks->counters(0, &k), 0);
    CHECK_EQ(k.mapped_bytes, 6 * MiB);
    CHECK_EQ(k.live_handles, 2);
    CHECK_EQ(cu.MemUnmap(va, 2 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cu.MemUnmap(va + 4 * MiB, 2 * MiB), CUDA_SUCCESS);
    CHECK_EQ(hooks->counters(0, &k), 0);
    CHECK_EQ(k.live_handles, 1); /* h1's memory went with its last mapping */
    CHECK_EQ(cu.MemUnmap(va + 2 * MiB, 2 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h2), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAddressFree(va + 2 * MiB, 6 * MiB), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemAddressFree(va, 8 * MiB), CUDA_SUCCESS);
    CHECK_EQ(hooks->calls("cuMemMap"), 7);
    check_clean();
}

/* ---- streams and data ------------------------------------------------------------------------- */

typedef struct host_call {
    atomic_int ran;
    CUresult api; /* what a driver call made from inside the function answered */
} host_call;

static void call_driver_inside(void *arg)
{
    host_call *h = arg;
    int n = 0;
    h->api = cu.DeviceGetCount(&n);
    atomic_store(&h->ran, 1);
}

static void case_streams(void)
{
    init_with(0);
    CUstream s = NULL, nb = NULL;
    CHECK_EQ(cu.StreamCreate(&s, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamCreate(&nb, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr d = 0;
    CHECK_EQ(cu.MemAlloc(&d, 0), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
    unsigned char out[4096];
    CHECK_EQ(cu.MemsetD8Async(d, 0xab, 4096, s), CUDA_SUCCESS);
    CHECK_EQ(cu.MemsetD32Async(d + 16, 0x01020304u, 4, s), CUDA_SUCCESS);
    CHECK_EQ(cu.MemcpyDtoHAsync(out, d, sizeof out, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(out[0], 0xab);
    CHECK_EQ(out[4095], 0xab);
    uint32_t w;
    memcpy(&w, out + 16, 4);
    CHECK_EQ(w, 0x01020304u);
    CHECK_EQ(out[32], 0xab);
    unsigned char in[256];
    for (size_t i = 0; i < sizeof in; i++)
        in[i] = (unsigned char)i;
    CHECK_EQ(cu.MemcpyHtoDAsync(d + 1000, in, sizeof in, NULL), CUDA_SUCCESS); /* legacy stream */
    CHECK_EQ(cu.MemcpyDtoHAsync(out, d + 1000, sizeof in, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    CHECK(memcmp(in, out, sizeof in) == 0);
    /* what the double refuses when queued */
    CHECK_EQ(cu.MemsetD32Async(d + 2, 0, 4, s), CUDA_ERROR_INVALID_VALUE); /* "four byte aligned" */
    CHECK_EQ(cu.MemsetD8Async(d + 4000, 0, 200, s), CUDA_ERROR_INVALID_VALUE); /* past the block */
    CHECK_EQ(cu.MemsetD8Async((CUdeviceptr)(uintptr_t)in, 0, 8, s), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemcpyDtoHAsync((void *)(uintptr_t)d, d, 8, s), CUDA_ERROR_INVALID_VALUE);
    /* Page-locked host memory is reachable by every device. */
    void *pinned = NULL;
    CHECK_EQ(cu.MemHostAlloc(&pinned, 8192, CU_MEMHOSTALLOC_PORTABLE), CUDA_SUCCESS);
    CHECK_EQ(cu.MemHostAlloc(&pinned, 8192, 0x80), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemsetD8Async((CUdeviceptr)(uintptr_t)pinned, 7, 8192, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(((unsigned char *)pinned)[8191], 7);
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)pinned, 4, out, 0), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(1, d, 4, out, 0), CUDA_ERROR_ILLEGAL_ADDRESS); /* device 0's block */
    CHECK_EQ(cu.MemFreeHost(pinned), CUDA_SUCCESS);
    CHECK_EQ(cu.MemFreeHost(pinned), CUDA_ERROR_INVALID_VALUE);
    /* Host functions run in stream order; a query sees work still queued. */
    vmm_test_gate gate = {0};
    atomic_int after = 0;
    CUevent e = NULL;
    CHECK_EQ(cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(cu.EventQuery(e), CUDA_SUCCESS); /* never recorded: "an empty set of work" */
    CHECK_EQ(cu.LaunchHostFunc(nb, vmm_test_gate_wait, &gate), CUDA_SUCCESS);
    CHECK_EQ(cu.LaunchHostFunc(nb, set_flag, &after), CUDA_SUCCESS);
    CHECK_EQ(cu.EventRecord(e, nb), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamQuery(nb), CUDA_ERROR_NOT_READY);
    CHECK_EQ(cu.EventQuery(e), CUDA_ERROR_NOT_READY);
    /* NON_BLOCKING: legacy work does not wait for it */
    atomic_int legacy_ran = 0;
    CHECK_EQ(cu.LaunchHostFunc(NULL, set_flag, &legacy_ran), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(CU_STREAM_LEGACY), CUDA_SUCCESS);
    CHECK_EQ(atomic_load(&legacy_ran), 1);
    CHECK_EQ(atomic_load(&after), 0);
    atomic_store(&gate.open, 1);
    CHECK_EQ(cu.EventSynchronize(e), CUDA_SUCCESS);
    CHECK_EQ(atomic_load(&after), 1);
    CHECK_EQ(cu.StreamQuery(nb), CUDA_SUCCESS);
    /* A blocking stream: legacy work waits for it ("CU_STREAM_NON_BLOCKING: ... the created stream
     * should perform no implicit synchronization with stream 0"; the default one does). */
    vmm_test_gate gate2 = {0};
    atomic_int legacy2 = 0;
    CHECK_EQ(cu.LaunchHostFunc(s, vmm_test_gate_wait, &gate2), CUDA_SUCCESS);
    CHECK_EQ(cu.LaunchHostFunc(NULL, set_flag, &legacy2), CUDA_SUCCESS);
    vmm_test_sleep_ms(30);
    CHECK_EQ(atomic_load(&legacy2), 0);
    CHECK_EQ(cu.StreamQuery(NULL), CUDA_ERROR_NOT_READY);
    atomic_store(&gate2.open, 1);
    CHECK_EQ(cu.StreamSynchronize(NULL), CUDA_SUCCESS);
    CHECK_EQ(atomic_load(&legacy2), 1);
    /* "The host function must not make any CUDA API calls. Attempting to use a CUDA API may result
     * in CUDA_ERROR_NOT_PERMITTED" */
    host_call hc = {0, CUDA_SUCCESS};
    CHECK_EQ(cu.LaunchHostFunc(s, call_driver_inside, &hc), CUDA_SUCCESS);
    CHECK_EQ(cu.CtxSynchronize(), CUDA_SUCCESS);
    CHECK_EQ(atomic_load(&hc.ran), 1);
    CHECK_EQ(hc.api, CUDA_ERROR_NOT_PERMITTED);
    CHECK_EQ(cu.LaunchHostFunc(s, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    /* destroying a busy stream returns at once */
    vmm_test_gate gate3 = {0};
    CHECK_EQ(cu.LaunchHostFunc(nb, vmm_test_gate_wait, &gate3), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(nb), CUDA_SUCCESS);
    atomic_store(&gate3.open, 1);
    while (!atomic_load(&gate3.done))
        vmm_test_sleep_ms(1);
    CHECK_EQ(cu.StreamDestroy(NULL), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cu.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(cu.MemFree(d), CUDA_SUCCESS);
    CHECK_EQ(cu.MemFree(d), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemFree(0), CUDA_SUCCESS);
    CHECK_EQ(hooks->calls("cuMemsetD8Async"), 4);
    for (int i = 0; i < 200; i++) { /* the reaper of the busy stream is done shortly */
        cudadouble_objects_t o;
        vmm_sim_counters live;
        hooks->objects(&o);
        hooks->live(&live, NULL);
        if (live.live_streams == 0)
            break;
        vmm_test_sleep_ms(5);
    }
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    check_clean();
}

/* Device 1 writes memory only device 0 may touch: the context of device 1 fails for good. */
static void case_illegal_address(void)
{
    CUcontext c0 = init_with(0);
    vmm_range r = vmm_make(0, 2 * MiB, 0);
    unsigned char buf[16];
    memset(buf, 0x5a, sizeof buf);
    CHECK_EQ(hooks->device_access(0, r.va, sizeof buf, buf, 1), CUDA_SUCCESS);
    CUcontext c1 = ctx_of(1);
    CHECK_EQ(cu.CtxPushCurrent(c1), CUDA_SUCCESS);
    CUstream s1 = NULL;
    CHECK_EQ(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    /* Granted READ: the copy out works, a memset is an illegal address. */
    CUmemAccessDesc both[2] = {access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE),
                               access_for(1, CU_MEM_ACCESS_FLAGS_PROT_READ)};
    CHECK_EQ(cu.MemSetAccess(r.va, r.size, both, 2), CUDA_SUCCESS);
    unsigned char out[16] = {0};
    CHECK_EQ(cu.MemcpyDtoHAsync(out, r.va, sizeof out, s1), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(s1), CUDA_SUCCESS);
    CHECK(memcmp(out, buf, sizeof out) == 0);
    CHECK_EQ(cu.MemsetD8Async(r.va, 0, 16, s1), CUDA_SUCCESS); /* reported later, as on a GPU */
    CHECK_EQ(cu.StreamSynchronize(s1), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_EQ(hooks->sticky_error(1), CUDA_ERROR_ILLEGAL_ADDRESS);
    CUdeviceptr p = 0;
    CHECK_EQ(cu.MemAlloc(&p, 64), CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_EQ(cu.CtxSynchronize(), CUDA_ERROR_ILLEGAL_ADDRESS);
    /* nothing was written; device 0 goes on */
    CHECK_EQ(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);
    CHECK(hooks->current_context() == c0);
    CHECK_EQ(hooks->sticky_error(0), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(0, r.va, sizeof out, out, 0), CUDA_SUCCESS);
    CHECK(memcmp(out, buf, sizeof out) == 0);
    CHECK_EQ(cu.CtxSynchronize(), CUDA_SUCCESS);
    vmm_drop(r);
}

static void case_events(void)
{
    CUcontext c0 = init_with(0);
    CUcontext c1 = ctx_of(1);
    CUstream s0 = NULL, s1 = NULL;
    CUevent e0 = NULL, e1 = NULL;
    CHECK_EQ(cu.StreamCreate(&s0, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cu.EventCreate(&e0, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.EventCreate(&e0, CU_EVENT_INTERPROCESS), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.EventCreate(&e0, 0x40), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.CtxPushCurrent(c1), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamCreate(&s1, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cu.EventCreate(&e1, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    /* "hEvent and hStream must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE is
     * returned." NULL is the current context's (device 1's) legacy stream. */
    CHECK_EQ(cu.EventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cu.EventRecord(e0, NULL), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cu.EventRecord(e1, s0), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(cu.EventRecord(NULL, s1), CUDA_ERROR_INVALID_HANDLE);
    /* "hEvent may be from a different context or device than hStream": device 1's stream waits for
     * device 0's work. */
    vmm_test_gate gate = {0};
    atomic_int after = 0;
    CHECK_EQ(cu.LaunchHostFunc(s0, vmm_test_gate_wait, &gate), CUDA_SUCCESS);
    CHECK_EQ(cu.EventRecord(e0, s0), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamWaitEvent(s1, e0, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.LaunchHostFunc(s1, set_flag, &after), CUDA_SUCCESS);
    CHECK_EQ(cu.EventRecord(e1, s1), CUDA_SUCCESS);
    /* re-recording e0 now does not change what s1 waits for */
    CHECK_EQ(cu.CtxPopCurrent(NULL), CUDA_SUCCESS);
    CHECK_EQ(cu.EventRecord(e0, NULL), CUDA_SUCCESS);
    CHECK_EQ(cu.EventQuery(e0), CUDA_SUCCESS);
    vmm_test_sleep_ms(30);
    CHECK_EQ(atomic_load(&after), 0);
    CHECK_EQ(cu.EventQuery(e1), CUDA_ERROR_NOT_READY);
    atomic_store(&gate.open, 1);
    CHECK_EQ(cu.EventSynchronize(e1), CUDA_SUCCESS);
    CHECK_EQ(atomic_load(&after), 1);
    CHECK_EQ(cu.StreamWaitEvent(s1, NULL, 0), CUDA_ERROR_INVALID_HANDLE);
    /* "This flag is invalid outside of stream capture." */
    CHECK_EQ(cu.StreamWaitEvent(s1, e0, CU_EVENT_WAIT_EXTERNAL), CUDA_ERROR_INVALID_VALUE);
    /* An event of another context can be waited on, synchronized and destroyed from here. */
    CHECK_EQ(cu.EventDestroy(e1), CUDA_SUCCESS);
    CHECK_EQ(cu.EventDestroy(e0), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(s1), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(s0), CUDA_SUCCESS);
    (void)c0;
    CHECK_EQ(cu.PrimaryCtxRelease(1), CUDA_SUCCESS);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    check_clean();
}

/* ---- capture ---------------------------------------------------------------------------------- */

typedef struct alloc_try {
    CUcontext ctx;
    CUstreamCaptureMode mode;
    CUresult r;
} alloc_try;

/* cuMemAlloc from another thread, in `mode` */
static void *alloc_elsewhere(void *arg)
{
    alloc_try *t = arg;
    CHECK_EQ(cu.CtxSetCurrent(t->ctx), CUDA_SUCCESS);
    CUstreamCaptureMode m = t->mode;
    CHECK_EQ(cu.ThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
    CHECK_EQ(m, CU_STREAM_CAPTURE_MODE_GLOBAL); /* a thread starts in the default mode */
    CUdeviceptr p = 0;
    t->r = cu.MemAlloc(&p, 512);
    if (t->r == CUDA_SUCCESS)
        CHECK_EQ(cu.MemFree(p), CUDA_SUCCESS);
    return NULL;
}

typedef struct end_try {
    CUstream s;
    CUresult r;
} end_try;

static void *end_elsewhere(void *arg)
{
    end_try *t = arg;
    CUgraph g = (CUgraph)&g;
    t->r = cu.StreamEndCapture(t->s, &g);
    return NULL;
}

static void case_capture(void)
{
    CUcontext c0 = init_with(0);
    CUstream s = NULL, s2 = NULL, blocking = NULL;
    CHECK_EQ(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CUdeviceptr d = 0, p = 0;
    CHECK_EQ(cu.MemAlloc(&d, 4096), CUDA_SUCCESS);
    CHECK_EQ(cu.MemsetD8Async(d, 1, 4096, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(s), CUDA_SUCCESS);
    CUstreamCaptureStatus st = CU_STREAM_CAPTURE_STATUS_ACTIVE;
    CUgraph g = NULL;
    /* "Capture may not be initiated if stream is CU_STREAM_LEGACY" */
    CHECK_EQ(cu.StreamBeginCapture(NULL, CU_STREAM_CAPTURE_MODE_GLOBAL),
             CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(cu.StreamBeginCapture(s, (CUstreamCaptureMode)9), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_INVALID_VALUE); /* not capturing */

    /* GLOBAL: work is captured, not run; an unsafe call fails and invalidates the capture. */
    CHECK_EQ(cu.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cuuint64_t id1 = 0;
    CUgraph during = NULL;
    const CUgraphNode *deps = NULL;
    size_t ndeps = 9;
    CHECK_EQ(cu.StreamGetCaptureInfo(s, &st, &id1, &during, &deps, &ndeps), CUDA_SUCCESS);
    CHECK(id1 != 0 && during != NULL);
    CHECK_EQ(ndeps, 0);
    CHECK_EQ(cu.MemsetD8Async(d, 2, 4096, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamGetCaptureInfo(s, &st, &id1, &during, &deps, &ndeps), CUDA_SUCCESS);
    CHECK_EQ(ndeps, 1);
    CHECK_EQ(cu.StreamGetCaptureInfo(s, NULL, &id1, NULL, NULL, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemAlloc(&p, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED); /* cuda.h's example */
    CHECK_EQ(cu.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK_EQ(cu.MemsetD8Async(d, 3, 4096, s), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    g = (CUgraph)&g;
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK(g == NULL);
    CHECK_EQ(cu.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    unsigned char out[8];
    CHECK_EQ(cu.MemcpyDtoHAsync(out, d, 8, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(out[0], 1); /* the captured memset never ran */

    /* A GLOBAL capture forbids unsafe calls in other threads of GLOBAL mode, not in RELAXED ones. */
    alloc_try t = {c0, CU_STREAM_CAPTURE_MODE_RELAXED, CUDA_ERROR_UNKNOWN};
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    on_thread(alloc_elsewhere, &t);
    CHECK_EQ(t.r, CUDA_SUCCESS);
    CHECK_EQ(cu.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    t.mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
    on_thread(alloc_elsewhere, &t);
    CHECK_EQ(t.r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(cu.StreamIsCapturing(s, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* THREAD_LOCAL: other threads are free, this one is not. */
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
    on_thread(alloc_elsewhere, &t);
    CHECK_EQ(t.r, CUDA_SUCCESS);
    CHECK_EQ(cu.MemAlloc(&p, 256), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* RELAXED capture, and a RELAXED thread: unsafe calls proceed; the graph comes back. */
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAlloc(&p, 256), CUDA_SUCCESS);
    CHECK_EQ(cu.MemFree(p), CUDA_SUCCESS);
    cuuint64_t id2 = 0;
    CHECK_EQ(cu.StreamGetCaptureInfo(s, &st, &id2, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK(id2 > id1);
    CHECK_EQ(cu.MemsetD32Async(d, 5, 4, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_SUCCESS);
    CHECK(g != NULL);
    CHECK_EQ(cu.GraphDestroy(g), CUDA_SUCCESS);
    CHECK_EQ(cu.GraphDestroy(NULL), CUDA_ERROR_INVALID_VALUE);
    CUstreamCaptureMode m = CU_STREAM_CAPTURE_MODE_RELAXED;
    CHECK_EQ(cu.ThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
    CHECK_EQ(m, CU_STREAM_CAPTURE_MODE_GLOBAL);
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAlloc(&p, 256), CUDA_SUCCESS); /* this thread is RELAXED */
    CHECK_EQ(cu.MemFree(p), CUDA_SUCCESS);
    /* ... but an event recorded in capture cannot be queried ("attempting cuEventQuery on an event
     * that was last recorded inside a capture sequence"), and a capturing stream not synchronized. */
    CUevent e = NULL;
    CHECK_EQ(cu.EventCreate(&e, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.EventRecord(e, s), CUDA_SUCCESS);
    CHECK_EQ(cu.EventQuery(e), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(cu.EventSynchronize(e), CUDA_ERROR_CAPTURED_EVENT);
    CHECK_EQ(cu.StreamSynchronize(s), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(cu.EventQuery(e), CUDA_ERROR_CAPTURED_EVENT); /* still its last record */
    CHECK_EQ(cu.EventRecord(e, s), CUDA_SUCCESS);
    CHECK_EQ(cu.EventSynchronize(e), CUDA_SUCCESS);
    CHECK_EQ(cu.ThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS); /* back to GLOBAL */
    CHECK_EQ(m, CU_STREAM_CAPTURE_MODE_RELAXED);
    m = (CUstreamCaptureMode)5;
    CHECK_EQ(cu.ThreadExchangeStreamCaptureMode(&m), CUDA_ERROR_INVALID_VALUE);

    /* Waiting on an event from outside the capture crosses its boundary (ISOLATION) unless the
     * wait is external. */
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamWaitEvent(s, e, CU_EVENT_WAIT_EXTERNAL), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamWaitEvent(s, e, 0), CUDA_ERROR_STREAM_CAPTURE_ISOLATION);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* Fork and join: s2 joins through an event, and must be joined back. */
    CUevent fork = NULL, join = NULL;
    CHECK_EQ(cu.EventCreate(&fork, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(cu.EventCreate(&join, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cu.MemsetD8Async(d, 9, 16, s), CUDA_SUCCESS);
    CHECK_EQ(cu.EventRecord(fork, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamWaitEvent(s2, fork, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamIsCapturing(s2, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE);
    cuuint64_t id_s = 0, id_s2 = 1;
    CHECK_EQ(cu.StreamGetCaptureInfo(s, &st, &id_s, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamGetCaptureInfo(s2, &st, &id_s2, NULL, NULL, NULL), CUDA_SUCCESS);
    CHECK_EQ(id_s, id_s2);
    CHECK_EQ(cu.MemsetD8Async(d + 16, 9, 16, s2), CUDA_SUCCESS);
    /* "Capture must be ended on the same stream in which it was initiated" */
    CHECK_EQ(cu.StreamEndCapture(s2, &g), CUDA_ERROR_STREAM_CAPTURE_UNMATCHED);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(cu.StreamIsCapturing(s2, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    for (int joined = 0; joined < 2; joined++) {
        CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
        CHECK_EQ(cu.EventRecord(fork, s), CUDA_SUCCESS);
        CHECK_EQ(cu.StreamWaitEvent(s2, fork, 0), CUDA_SUCCESS);
        CHECK_EQ(cu.MemsetD8Async(d + 16, 9, 16, s2), CUDA_SUCCESS);
        CHECK_EQ(cu.MemsetD8Async(d, 9, 16, s), CUDA_SUCCESS);
        if (joined) {
            CHECK_EQ(cu.EventRecord(join, s2), CUDA_SUCCESS);
            CHECK_EQ(cu.StreamWaitEvent(s, join, 0), CUDA_SUCCESS);
            CHECK_EQ(cu.StreamGetCaptureInfo(s, &st, NULL, NULL, &deps, &ndeps), CUDA_SUCCESS);
            CHECK_EQ(ndeps, 2); /* both branches */
        }
        g = (CUgraph)&g;
        CHECK_EQ(cu.StreamEndCapture(s, &g), joined ? CUDA_SUCCESS : CUDA_ERROR_STREAM_CAPTURE_UNJOINED);
        CHECK(joined ? g != NULL : g == NULL);
        if (g)
            CHECK_EQ(cu.GraphDestroy(g), CUDA_SUCCESS);
        CHECK_EQ(cu.StreamIsCapturing(s2, &st), CUDA_SUCCESS);
        CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_NONE);
    }
    CHECK_EQ(cu.StreamSynchronize(s2), CUDA_SUCCESS);
    CHECK_EQ(cu.MemcpyDtoHAsync(out, d, 8, s), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamSynchronize(s), CUDA_SUCCESS);
    CHECK_EQ(out[0], 1);

    /* A GLOBAL capture must be ended by its own thread. */
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    end_try et = {s, CUDA_SUCCESS};
    on_thread(end_elsewhere, &et);
    CHECK_EQ(et.r, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
    CHECK_EQ(cu.StreamEndCapture(s, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);

    /* While a blocking stream captures, the legacy stream is unusable (STREAM_CAPTURE_IMPLICIT). */
    CHECK_EQ(cu.StreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamIsCapturing(NULL, &st), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK_EQ(cu.StreamIsCapturing(blocking, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_ACTIVE); /* "The blocking stream capture is not invalidated." */
    CHECK_EQ(cu.MemsetD8Async(d, 4, 8, NULL), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
    CHECK_EQ(cu.StreamIsCapturing(blocking, &st), CUDA_SUCCESS);
    CHECK_EQ(st, CU_STREAM_CAPTURE_STATUS_INVALIDATED);
    CHECK_EQ(cu.StreamEndCapture(blocking, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
    CHECK_EQ(cu.MemsetD8Async(d, 4, 8, NULL), CUDA_SUCCESS);
    CHECK_EQ(cu.CtxSynchronize(), CUDA_SUCCESS);

    CHECK_EQ(cu.EventDestroy(e), CUDA_SUCCESS);
    CHECK_EQ(cu.EventDestroy(fork), CUDA_SUCCESS);
    CHECK_EQ(cu.EventDestroy(join), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(blocking), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(s2), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(cu.MemFree(d), CUDA_SUCCESS);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    check_clean();
}

/* A POSIX file descriptor travels by value in the osHandle pointer, as in CUDA's samples. */
static CUresult import_fd(CUmemGenericAllocationHandle *h, int fd)
{
    void *os_handle = (void *)(uintptr_t)fd;
    return cu.MemImportFromShareableHandle(h, os_handle, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
}

static void case_share_fd(void)
{
    init_with(0);
    vmm_range a = vmm_make(0, 4 * MiB, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    int fd = -1;
    CHECK_EQ(cu.MemExportToShareableHandle(&fd, a.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 1),
             CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(cu.MemExportToShareableHandle(&fd, a.h, CU_MEM_HANDLE_TYPE_WIN32, 0), CUDA_ERROR_NOT_SUPPORTED);
    CHECK_EQ(cu.MemExportToShareableHandle(&fd, a.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_SUCCESS);
    CHECK(fd >= 0);
    /* The import is a new handle on the same memory, of the exporter's device. */
    CUmemGenericAllocationHandle h2 = 0;
    CHECK_EQ(import_fd(&h2, fd), CUDA_SUCCESS);
    CHECK(h2 != 0 && h2 != a.h);
    close(fd); /* the handle keeps what it needs */
    CUmemAllocationProp got;
    CHECK_EQ(cu.MemGetAllocationPropertiesFromHandle(&got, h2), CUDA_SUCCESS);
    CHECK_EQ(got.location.id, 0);
    CHECK_EQ(got.requestedHandleTypes, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    CUdeviceptr vb = 0;
    CHECK_EQ(cu.MemAddressReserve(&vb, 4 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemMap(vb, 4 * MiB, 0, h2, 0), CUDA_SUCCESS);
    CUmemAccessDesc acc = access_for(0, CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
    CHECK_EQ(cu.MemSetAccess(vb, 4 * MiB, &acc, 1), CUDA_SUCCESS);
    char msg[] = "written through the exporter's mapping";
    char back[sizeof msg] = {0};
    CHECK_EQ(hooks->device_access(0, a.va + 3 * MiB, sizeof msg, msg, 1), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(0, vb + 3 * MiB, sizeof back, back, 0), CUDA_SUCCESS);
    CHECK(strcmp(msg, back) == 0);
    /* free memory does not change with the import: the memory exists once */
    size_t fr = 0, tot = 0;
    CHECK_EQ(cu.MemGetInfo(&fr, &tot), CUDA_SUCCESS);
    CHECK_EQ(tot - fr, 4 * MiB);
    /* A handle made without POSIX_FILE_DESCRIPTOR: "CU_MEM_HANDLE_TYPE_NONE: Does not allow any
     * export mechanism." */
    vmm_range b = vmm_make(0, 2 * MiB, 0);
    CHECK_EQ(cu.MemExportToShareableHandle(&fd, b.h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
             CUDA_ERROR_INVALID_VALUE);
    int pipe_fds[2];
    CHECK_EQ(pipe(pipe_fds), 0);
    CUmemGenericAllocationHandle h3 = 0;
    CHECK_EQ(import_fd(&h3, pipe_fds[0]), CUDA_ERROR_INVALID_VALUE); /* not memory */
    CHECK_EQ(import_fd(&h3, 9999), CUDA_ERROR_INVALID_VALUE);        /* no such descriptor */
    close(pipe_fds[0]);
    close(pipe_fds[1]);
    vmm_drop(b);
    CHECK_EQ(cu.MemUnmap(vb, 4 * MiB), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h2), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAddressFree(vb, 4 * MiB), CUDA_SUCCESS);
    vmm_drop(a);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    check_clean();
}

static void case_faults(void)
{
    init_with(0);
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = device_prop(0);
    CHECK_EQ(hooks->fail_nth(0, VMM_SIM_CALL_MEM_CREATE, 2), 0);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_ERROR_OUT_OF_MEMORY); /* the injected one */
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h), CUDA_SUCCESS);
    CHECK_EQ(hooks->fail_nth(0, VMM_SIM_CALL_STREAM_CREATE, 1), 0);
    CUstream s = NULL;
    CHECK_EQ(cu.StreamCreate(&s, 0), CUDA_ERROR_UNKNOWN);
    CHECK_EQ(cu.StreamCreate(&s, 0), CUDA_SUCCESS);
    CHECK_EQ(hooks->fail_random(0, VMM_SIM_CALL_VA_RESERVE, 1.0, 7), 0);
    CUdeviceptr va = 0;
    CHECK_EQ(cu.MemAddressReserve(&va, 2 * MiB, 0, 0, 0), CUDA_ERROR_OUT_OF_MEMORY);
    CHECK_EQ(hooks->fail_random(0, VMM_SIM_CALL_VA_RESERVE, 0.0, 7), 0);
    CHECK_EQ(cu.MemAddressReserve(&va, 2 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemAddressFree(va, 2 * MiB), CUDA_SUCCESS);
    vmm_sim_counters k;
    CHECK_EQ(hooks->counters(0, &k), 0);
    CHECK_EQ(k.failures[VMM_SIM_CALL_MEM_CREATE], 1);
    CHECK_EQ(k.calls[VMM_SIM_CALL_MEM_CREATE], 3);
    CHECK_EQ(k.failures[VMM_SIM_CALL_STREAM_CREATE], 1);
    CHECK_EQ(k.capacity_bytes, 80 * GiB);
    CHECK_EQ(hooks->counters(5, &k), CUDA_ERROR_INVALID_DEVICE);
    CHECK_EQ(hooks->fail_nth(0, 9999, 1), CUDA_ERROR_INVALID_VALUE);
    CHECK_EQ(hooks->calls("cuMemCreate"), 3);
    CHECK_EQ(hooks->calls("cuNoSuchCall"), 0);
    CHECK_EQ(cu.StreamDestroy(s), CUDA_SUCCESS);
    CHECK_EQ(cu.PrimaryCtxRelease(0), CUDA_SUCCESS);
    check_clean();
}

/* ---- undefined behaviour: each of these aborts, naming the call ------------------------------- */

static void abort_release_twice(void)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = device_prop(0);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.MemRelease(h), CUDA_SUCCESS);
    cu.MemRelease(h);
}

static void abort_release_unknown(void)
{
    CHECK_EQ(cu.Init(0), CUDA_SUCCESS);
    cu.MemRelease(0x1234);
}

static void abort_map_released(void)
{
    init_with(0);
    vmm_range r = vmm_make(0, 2 * MiB, 0);
    CHECK_EQ(cu.MemRelease(r.h), CUDA_SUCCESS);
    CHECK_EQ(cu.MemUnmap(r.va, r.size), CUDA_SUCCESS);
    cu.MemMap(r.va, r.size, 0, r.h, 0);
}

static void abort_destroyed_stream(void)
{
    init_with(0);
    CUstream s = NULL;
    CHECK_EQ(cu.StreamCreate(&s, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamDestroy(s), CUDA_SUCCESS);
    cu.StreamSynchronize(s);
}

static void abort_destroyed_event(void)
{
    init_with(0);
    CUevent e = NULL;
    CHECK_EQ(cu.EventCreate(&e, 0), CUDA_SUCCESS);
    CHECK_EQ(cu.EventDestroy(e), CUDA_SUCCESS);
    cu.EventQuery(e);
}

static void abort_free_mapped(void)
{
    init_with(0);
    vmm_range r = vmm_make(0, 2 * MiB, 0);
    cu.MemAddressFree(r.va, r.size);
}

static void abort_map_over_mapping(void)
{
    init_with(0);
    vmm_range r = vmm_make(0, 2 * MiB, 0);
    CUmemGenericAllocationHandle h2 = 0;
    CUmemAllocationProp p = device_prop(0);
    CHECK_EQ(cu.MemCreate(&h2, 2 * MiB, &p, 0), CUDA_SUCCESS);
    cu.MemMap(r.va, r.size, 0, h2, 0);
}

static void abort_map_other_device(void)
{
    init_with(0);
    CUdeviceptr va = 0;
    CHECK_EQ(cu.MemAddressReserve(&va, 2 * MiB, 0, 0, 0), CUDA_SUCCESS);
    CUmemGenericAllocationHandle h = 0;
    CUmemAllocationProp p = device_prop(1);
    CHECK_EQ(cu.MemCreate(&h, 2 * MiB, &p, 0), CUDA_SUCCESS);
    cu.MemMap(va, 2 * MiB, 0, h, 0);
}

static void abort_destroy_capturing_graph(void)
{
    init_with(0);
    CUstream s = NULL;
    CHECK_EQ(cu.StreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
    CHECK_EQ(cu.StreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUstreamCaptureStatus st;
    CUgraph g = NULL;
    CHECK_EQ(cu.StreamGetCaptureInfo(s, &st, NULL, &g, NULL, NULL), CUDA_SUCCESS);
    cu.GraphDestroy(g);
}

/* ---- driver ----------------------------------------------------------------------------------- */

/* Runs fn in a child with a fresh driver, loaded there after the child's environment is set
 * (env: "NAME=VALUE" strings, NULL-terminated, or NULL). needle NULL: the child must pass its
 * checks; else it must abort with a message containing needle. */
static void run_env(const char *name, void (*fn)(void), const char *needle, const char *const *env)
{
    int fds[2];
    if (pipe(fds) != 0) {
        CHECK(!"pipe");
        return;
    }
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        vmm_test_failures = 0; /* the parent's count of failed cases is not this case's */
        close(fds[0]);
        if (needle)
            dup2(fds[1], 2);
        for (size_t i = 0; env && env[i]; i++)
            putenv(strdup(env[i]));
        load();
        fn();
        _exit(vmm_test_failures ? 1 : needle ? 3 : 0);
    }
    close(fds[1]);
    char msg[4096] = {0};
    size_t got = 0;
    ssize_t n;
    while ((n = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0 && got < sizeof msg - 1)
        got += (size_t)n;
    close(fds[0]);
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    bool ok;
    if (needle)
        ok = WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(msg, needle) && strstr(msg, "cudadouble: ");
    else
        ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
    printf("%-28s %s\n", name, ok ? "ok" : "FAILED");
    if (!ok) {
        fprintf(stderr, "%s: status %#x%s%s\n", name, st, needle ? ", child said: " : "", msg);
        vmm_test_failures++;
    }
}

static void run(const char *name, void (*fn)(void), const char *needle) { run_env(name, fn, needle, NULL); }

int main(void)
{
    /* The environment the cases expect by default (ctest sets CUDADOUBLE_DEVICES=2 too). */
    static const char *const knobs[] = {"CUDADOUBLE_CAPACITY_MB", "CUDADOUBLE_GRANULARITY_KB",
                                        "CUDADOUBLE_NO_VMM",      "CUDADOUBLE_NO_RDMA",
                                        "CUDADOUBLE_NO_FD",       "CUDADOUBLE_NO_PEER",
                                        "CUDADOUBLE_DRIVER_VERSION", "CUDADOUBLE_FAIL_INIT",
                                        "CUDADOUBLE_GETPROC_ERRORS"};
    for (size_t i = 0; i < sizeof knobs / sizeof knobs[0]; i++)
        unsetenv(knobs[i]);
    setenv("CUDADOUBLE_DEVICES", "2", 1);

    static const char *const version_env[] = {"CUDADOUBLE_DRIVER_VERSION=12080", NULL};
    static const char *const no_device_env[] = {"CUDADOUBLE_DEVICES=0", NULL};
    static const char *const getproc_env[] = {"CUDADOUBLE_GETPROC_ERRORS=1", NULL};
    static const char *const device_env[] = {"CUDADOUBLE_DEVICES=3", "CUDADOUBLE_CAPACITY_MB=64",
                                             "CUDADOUBLE_GRANULARITY_KB=64", "CUDADOUBLE_NO_VMM=2",
                                             "CUDADOUBLE_NO_RDMA=1", "CUDADOUBLE_NO_FD=0,1",
                                             "CUDADOUBLE_NO_PEER=0:1", NULL};
    run_env("init", case_init, NULL, version_env);
    run_env("no device", case_no_device, NULL, no_device_env);
    run("cuGetProcAddress", case_get_proc, NULL);
    run_env("cuGetProcAddress errors", case_get_proc_errors, NULL, getproc_env);
    run("devices", case_devices, NULL);
    run_env("device environment", case_device_env, NULL, device_env);
    run("contexts", case_contexts, NULL);
    run("allocation properties", case_alloc_props, NULL);
    run("virtual memory", case_vmm, NULL);
    run("streams and data", case_streams, NULL);
    run("illegal address", case_illegal_address, NULL);
    run("events across contexts", case_events, NULL);
    run("capture", case_capture, NULL);
    run("fd export and import", case_share_fd, NULL);
    run("fault injection", case_faults, NULL);

    const char *undefined = "If handle is not a valid handle the behavior is undefined";
    run("release twice", abort_release_twice, undefined);
    run("release unknown handle", abort_release_unknown, undefined);
    run("map a released handle", abort_map_released, undefined);
    run("destroyed stream", abort_destroyed_stream, "cuStreamSynchronize: stream");
    run("destroyed event", abort_destroyed_event, "cuEventQuery: event");
    run("free a mapped range", abort_free_mapped, "cuMemAddressFree");
    run("map over a mapping", abort_map_over_mapping, "can only create mappings on VA range reservations");
    run("map another device's handle", abort_map_other_device, "double limitation");
    run("destroy a capturing graph", abort_destroy_capturing_graph, "cuGraphDestroy");
    TEST_DONE();
}
