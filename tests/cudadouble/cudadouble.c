/*
 * The CUDA driver double: initialization, devices, error names, the test hooks.
 *
 * Each CUDA device is a simulated device of src/driver/drv_sim.c, opened at cuInit in backed mode (handles
 * are memfds, so data written through one mapping reads back through another) with no cost model.
 * Memory appears on first touch: a device of 80 GiB costs nothing until used.
 *
 * Every rule below quotes the cuda.h sentence it follows. "cuda.h is silent" marks a choice.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cd_internal.h"

cd_state cd = {.mu = PTHREAD_MUTEX_INITIALIZER};
atomic_ulong cd_calls[CD_E_COUNT];

void cd_lock(void) { pthread_mutex_lock(&cd.mu); }
void cd_unlock(void) { pthread_mutex_unlock(&cd.mu); }

static void vreport(const char *call, const char *prefix, const char *fmt, va_list ap)
{
    fprintf(stderr, "cudadouble: %s: %s", call, prefix);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    fflush(stderr);
}

void cd_undefined(const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(call, "", fmt, ap);
    va_end(ap);
    abort();
}

void cd_limitation(const char *call, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport(call, "double limitation: ", fmt, ap);
    va_end(ap);
    abort();
}

/* A configuration the test harness got wrong is not a CUDA result: stop with the reason. */
static _Noreturn void config_error(const char *fmt, ...) CD_PRINTF(1, 2);
static _Noreturn void config_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vreport("cuInit", "bad environment: ", fmt, ap);
    va_end(ap);
    abort();
}

/* ---- environment ------------------------------------------------------------------------------ */

static long env_long(const char *name, long def, long lo, long hi)
{
    const char *s = getenv(name);
    if (!s || !*s)
        return def;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi)
        config_error("%s=%s: want an integer in [%ld, %ld]", name, s, lo, hi);
    return v;
}

/* "0,2" -> bits 0 and 2; every ordinal must name a device. */
static unsigned env_ordinals(const char *name, int ndev)
{
    const char *s = getenv(name);
    unsigned mask = 0;
    while (s && *s) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s || v < 0 || v >= ndev || (*end && *end != ','))
            config_error("%s=%s: want a comma list of device ordinals below %d", name, getenv(name), ndev);
        mask |= 1u << v;
        s = *end ? end + 1 : end;
    }
    return mask;
}

/* "a:b,c:d": device a cannot access device b's memory. */
static void env_no_peer(int ndev)
{
    const char *all = getenv("CUDADOUBLE_NO_PEER"), *s = all;
    while (s && *s) {
        char *end, *end2;
        long a = strtol(s, &end, 10);
        long b = *end == ':' ? strtol(end + 1, &end2, 10) : -1;
        if (end == s || *end != ':' || end2 == end + 1 || a < 0 || a >= ndev || b < 0 || b >= ndev ||
            (*end2 && *end2 != ','))
            config_error("CUDADOUBLE_NO_PEER=%s: want a comma list of a:b device pairs", all);
        cd.dev[a].no_peer |= 1u << b;
        s = *end2 ? end2 + 1 : end2;
    }
}

static pthread_once_t version_once = PTHREAD_ONCE_INIT;

/* Read before cuInit too: cuDriverGetVersion and cuGetProcAddress need no initialization. */
static void read_version(void)
{
    cd.driver_version = (int)env_long("CUDADOUBLE_DRIVER_VERSION", 13000, 1000, 1000000);
    cd.getproc_errors = env_long("CUDADOUBLE_GETPROC_ERRORS", 0, 0, 1) != 0;
}

/* Opens the devices (lock held). */
static CUresult init_devices(void)
{
    int n = (int)env_long("CUDADOUBLE_DEVICES", 2, 0, CUDADOUBLE_MAX_DEVICES);
    size_t cap = (size_t)env_long("CUDADOUBLE_CAPACITY_MB", 81920, 1, 1L << 30) << 20;
    size_t gran = (size_t)env_long("CUDADOUBLE_GRANULARITY_KB", 2048, 4, 1L << 30) << 10;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (gran < page || (gran & (gran - 1)))
        config_error("CUDADOUBLE_GRANULARITY_KB: %zu bytes is not a power of two of at least a host "
                     "page (%zu)", gran, page);
    if (cap < gran)
        config_error("CUDADOUBLE_CAPACITY_MB: %zu bytes is below one granule (%zu)", cap, gran);
    /* "If there is no such device, cuDeviceGetCount() returns 0": and cuInit, as a real driver with
     * no GPU does, CUDA_ERROR_NO_DEVICE. */
    if (n == 0)
        return CUDA_ERROR_NO_DEVICE;
    unsigned no_vmm = env_ordinals("CUDADOUBLE_NO_VMM", n);
    unsigned no_rdma = env_ordinals("CUDADOUBLE_NO_RDMA", n);
    unsigned no_fd = env_ordinals("CUDADOUBLE_NO_FD", n);
    cd.gran = gran;
    while (((size_t)1 << cd.gran_shift) < gran)
        cd.gran_shift++;
    for (int i = 0; i < n; i++) {
        cd_device *d = &cd.dev[i];
        vmm_sim_options o;
        vmm_sim_default_options(&o);
        o.capacity = cap;
        o.granularity = gran;
        o.backed = 1;
        o.vmm_supported = !(no_vmm >> i & 1);
        o.cost_model = 0;
        int r = vmm_driver_sim_open(&o, &d->sim);
        if (r)
            config_error("opening simulated device %d failed: %s", i, vmm_drv_result_name(r));
        d->ops = d->sim->ops;
        d->ordinal = i;
        d->capacity = cap;
        d->vmm = o.vmm_supported;
        d->rdma = d->vmm && !(no_rdma >> i & 1);
        d->posix_fd = d->vmm && !(no_fd >> i & 1);
        snprintf(d->name, sizeof d->name, "CUDA double device %d", i);
        d->ctx.dev = i;
        d->ctx.legacy.ctx = &d->ctx;
    }
    cd.ndev = n;
    env_no_peer(n);
    return CUDA_SUCCESS;
}

/* ---- init and version ------------------------------------------------------------------------- */

CUresult cd_check_init(void)
{
    /* cuLaunchHostFunc: "The host function must not make any CUDA API calls. Attempting to use a
     * CUDA API may result in CUDA_ERROR_NOT_PERMITTED, but this is not required." The double does. */
    if (cd_in_callback)
        return CUDA_ERROR_NOT_PERMITTED;
    /* cuInit: "If cuInit() has not been called, any function from the driver API will return
     * CUDA_ERROR_NOT_INITIALIZED." */
    return atomic_load(&cd.initialized) ? CUDA_SUCCESS : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult CUDAAPI cuInit(unsigned int Flags)
{
    CD_CALL(cuInit);
    if (cd_in_callback)
        return CUDA_ERROR_NOT_PERMITTED;
    /* "Currently, the Flags parameter must be 0." */
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&version_once, read_version);
    long fail = env_long("CUDADOUBLE_FAIL_INIT", 0, 0, 100000);
    if (fail)
        return (CUresult)fail;
    CUresult r = CUDA_SUCCESS;
    cd_lock();
    if (!atomic_load(&cd.initialized)) {
        r = init_devices();
        if (!r)
            atomic_store(&cd.initialized, 1);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuDriverGetVersion(int *driverVersion)
{
    CD_CALL(cuDriverGetVersion);
    /* "This function automatically returns CUDA_ERROR_INVALID_VALUE if driverVersion is NULL."
     * No initialization needed: NOT_INITIALIZED is not among its results. */
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_once(&version_once, read_version);
    *driverVersion = cd.driver_version;
    return CUDA_SUCCESS;
}

/* cuGetProcAddress needs the version before cuInit (it is how callers find cuInit). */
int cd_driver_version(void)
{
    pthread_once(&version_once, read_version);
    return cd.driver_version;
}

/* ---- error names ------------------------------------------------------------------------------ */

#define CD_RESULTS(X)                                                                          \
    X(CUDA_SUCCESS, "no error")                                                                \
    X(CUDA_ERROR_INVALID_VALUE, "invalid argument")                                            \
    X(CUDA_ERROR_OUT_OF_MEMORY, "out of memory")                                               \
    X(CUDA_ERROR_NOT_INITIALIZED, "initialization error (cuInit not called)")                  \
    X(CUDA_ERROR_DEINITIALIZED, "driver shutting down")                                        \
    X(CUDA_ERROR_PROFILER_DISABLED, "profiler disabled")                                       \
    X(CUDA_ERROR_PROFILER_NOT_INITIALIZED, "profiler not initialized")                         \
    X(CUDA_ERROR_PROFILER_ALREADY_STARTED, "profiler already started")                         \
    X(CUDA_ERROR_PROFILER_ALREADY_STOPPED, "profiler already stopped")                         \
    X(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library")                                \
    X(CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "call requires a newer driver")                   \
    X(CUDA_ERROR_DEVICE_UNAVAILABLE, "device unavailable")                                     \
    X(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected")                              \
    X(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal")                                     \
    X(CUDA_ERROR_DEVICE_NOT_LICENSED, "device not licensed")                                   \
    X(CUDA_ERROR_INVALID_IMAGE, "invalid kernel image")                                        \
    X(CUDA_ERROR_INVALID_CONTEXT, "invalid device context")                                    \
    X(CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "context already current")                           \
    X(CUDA_ERROR_MAP_FAILED, "mapping failed")                                                 \
    X(CUDA_ERROR_UNMAP_FAILED, "unmapping failed")                                             \
    X(CUDA_ERROR_ARRAY_IS_MAPPED, "array is mapped")                                           \
    X(CUDA_ERROR_ALREADY_MAPPED, "resource already mapped")                                    \
    X(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image for the device")                          \
    X(CUDA_ERROR_ALREADY_ACQUIRED, "resource already acquired")                                \
    X(CUDA_ERROR_NOT_MAPPED, "resource not mapped")                                            \
    X(CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "resource not mapped as array")                          \
    X(CUDA_ERROR_NOT_MAPPED_AS_POINTER, "resource not mapped as pointer")                      \
    X(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error")                                 \
    X(CUDA_ERROR_UNSUPPORTED_LIMIT, "limit not supported")                                     \
    X(CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "context already in use")                             \
    X(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access unsupported")                           \
    X(CUDA_ERROR_INVALID_PTX, "invalid PTX")                                                   \
    X(CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "invalid graphics context")                         \
    X(CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error")                           \
    X(CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "JIT compiler not found")                             \
    X(CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "unsupported PTX version")                           \
    X(CUDA_ERROR_JIT_COMPILATION_DISABLED, "JIT compilation disabled")                         \
    X(CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "unsupported execution affinity")                  \
    X(CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "unsupported device-side synchronization")          \
    X(CUDA_ERROR_CONTAINED, "contained error")                                                 \
    X(CUDA_ERROR_INVALID_SOURCE, "invalid source")                                             \
    X(CUDA_ERROR_FILE_NOT_FOUND, "file not found")                                             \
    X(CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "shared object symbol not found")             \
    X(CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "shared object initialization failed")             \
    X(CUDA_ERROR_OPERATING_SYSTEM, "operating system call failed")                             \
    X(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle")                                    \
    X(CUDA_ERROR_ILLEGAL_STATE, "illegal state")                                               \
    X(CUDA_ERROR_LOSSY_QUERY, "lossy query")                                                   \
    X(CUDA_ERROR_NOT_FOUND, "named symbol not found")                                          \
    X(CUDA_ERROR_NOT_READY, "device not ready")                                                \
    X(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered")                  \
    X(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "too many resources requested for launch")           \
    X(CUDA_ERROR_LAUNCH_TIMEOUT, "launch timed out")                                           \
    X(CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "incompatible texturing")                      \
    X(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access already enabled")                   \
    X(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access not enabled")                           \
    X(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "primary context active")                             \
    X(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed")                                 \
    X(CUDA_ERROR_ASSERT, "device-side assert triggered")                                       \
    X(CUDA_ERROR_TOO_MANY_PEERS, "too many peers")                                             \
    X(CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "host memory already registered")             \
    X(CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "host memory not registered")                     \
    X(CUDA_ERROR_HARDWARE_STACK_ERROR, "hardware stack error")                                 \
    X(CUDA_ERROR_ILLEGAL_INSTRUCTION, "illegal instruction")                                   \
    X(CUDA_ERROR_MISALIGNED_ADDRESS, "misaligned address")                                     \
    X(CUDA_ERROR_INVALID_ADDRESS_SPACE, "invalid address space")                               \
    X(CUDA_ERROR_INVALID_PC, "invalid program counter")                                        \
    X(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure")                                  \
    X(CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "cooperative launch too large")                 \
    X(CUDA_ERROR_TENSOR_MEMORY_LEAK, "tensor memory leak")                                     \
    X(CUDA_ERROR_NOT_PERMITTED, "operation not permitted")                                     \
    X(CUDA_ERROR_NOT_SUPPORTED, "operation not supported")                                     \
    X(CUDA_ERROR_SYSTEM_NOT_READY, "system not ready")                                         \
    X(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system driver mismatch")                             \
    X(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "compatibility mode not supported on device") \
    X(CUDA_ERROR_MPS_CONNECTION_FAILED, "MPS connection failed")                               \
    X(CUDA_ERROR_MPS_RPC_FAILURE, "MPS RPC failure")                                           \
    X(CUDA_ERROR_MPS_SERVER_NOT_READY, "MPS server not ready")                                 \
    X(CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "MPS client limit reached")                          \
    X(CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "MPS connection limit reached")                  \
    X(CUDA_ERROR_MPS_CLIENT_TERMINATED, "MPS client terminated")                               \
    X(CUDA_ERROR_CDP_NOT_SUPPORTED, "dynamic parallelism not supported")                       \
    X(CUDA_ERROR_CDP_VERSION_MISMATCH, "dynamic parallelism version mismatch")                 \
    X(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "operation not permitted when stream is capturing") \
    X(CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "operation failed due to a previous error during capture") \
    X(CUDA_ERROR_STREAM_CAPTURE_MERGE, "operation would result in a merge of separate capture sequences") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "capture was not ended in the same stream as it began") \
    X(CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "capturing stream has unjoined work")                \
    X(CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "dependency created on uncaptured work in another stream") \
    X(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "legacy stream would depend on a capturing blocking stream") \
    X(CUDA_ERROR_CAPTURED_EVENT, "operation not permitted on an event last recorded in a capturing stream") \
    X(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "capture sequence ended from another thread") \
    X(CUDA_ERROR_TIMEOUT, "wait operation timed out")                                          \
    X(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "graph update was not performed")                  \
    X(CUDA_ERROR_EXTERNAL_DEVICE, "external device error")                                     \
    X(CUDA_ERROR_INVALID_CLUSTER_SIZE, "invalid cluster size")                                 \
    X(CUDA_ERROR_FUNCTION_NOT_LOADED, "function not loaded")                                   \
    X(CUDA_ERROR_INVALID_RESOURCE_TYPE, "invalid resource type")                               \
    X(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "invalid resource configuration")             \
    X(CUDA_ERROR_KEY_ROTATION, "key rotation error")                                           \
    X(CUDA_ERROR_UNKNOWN, "unknown error")

static const struct {
    CUresult r;
    const char *name, *text;
} results[] = {
#define CD_RESULT_ROW_(r, text) {r, #r, text},
    CD_RESULTS(CD_RESULT_ROW_)
#undef CD_RESULT_ROW_
};

/* "If the error code is not recognized, CUDA_ERROR_INVALID_VALUE will be returned and *pStr will
 * be set to the NULL address." Neither needs cuInit (NOT_INITIALIZED is not among the results). */
static CUresult describe(CUresult error, const char **pStr, bool name)
{
    if (!pStr)
        return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof results / sizeof results[0]; i++)
        if (results[i].r == error) {
            *pStr = name ? results[i].name : results[i].text;
            return CUDA_SUCCESS;
        }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr)
{
    CD_CALL(cuGetErrorName);
    return describe(error, pStr, true);
}

CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr)
{
    CD_CALL(cuGetErrorString);
    return describe(error, pStr, false);
}

/* ---- devices ---------------------------------------------------------------------------------- */

cd_device *cd_dev(int ordinal) { return ordinal >= 0 && ordinal < cd.ndev ? &cd.dev[ordinal] : NULL; }

bool cd_can_access(int a, int b) { return a == b || !(cd.dev[a].no_peer >> b & 1); }

CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal)
{
    CD_CALL(cuDeviceGet);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    /* "given an ordinal in the range [0, cuDeviceGetCount()-1]"; outside it cuda.h lists both
     * INVALID_VALUE and INVALID_DEVICE: the double answers INVALID_DEVICE, as real drivers do. */
    if (!cd_dev(ordinal))
        return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetCount(int *count)
{
    CD_CALL(cuDeviceGetCount);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    *count = cd.ndev;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev)
{
    CD_CALL(cuDeviceGetName);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    cd_device *d = cd_dev(dev);
    if (!d)
        return CUDA_ERROR_INVALID_DEVICE;
    /* "name is shortened to the specified len, if len is less than the device name" */
    snprintf(name, (size_t)len, "%s", d->name);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    CD_CALL(cuDeviceTotalMem);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    cd_device *d = cd_dev(dev);
    if (!d)
        return CUDA_ERROR_INVALID_DEVICE;
    *bytes = d->capacity;
    return CUDA_SUCCESS;
}

/* Attributes of an H100-like device; the memory ones follow the CUDADOUBLE_* settings. */
static int attribute(const cd_device *d, CUdevice_attribute a)
{
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: return 1024;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: return 64;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: return 65535;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: return 49152;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: return 65536;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: return 32;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: return 2147483647;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: return 65536;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: return 1980000;
    case CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT: return 512;
    case CU_DEVICE_ATTRIBUTE_GPU_OVERLAP: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: return 132;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: return CU_COMPUTEMODE_DEFAULT;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS: return 1;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: return 1;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: return 0x10 + d->ordinal;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: return 2619000;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: return 5120;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: return 52428800;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: return 2048;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: return 3;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: return 9;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: return 0;
    case CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: return 233472;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR: return 65536;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: return 1;
    case CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID: return d->ordinal;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: return 1;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM: return 1;
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH: return 1;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: return 232448;
    case CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED: return 1;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: return d->vmm;
    case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: return d->posix_fd;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR: return 32;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: return d->rdma;
    case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED: return d->rdma;
    case CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK: return 1024;
    case CU_DEVICE_ATTRIBUTE_NUMA_ID: return -1;
    case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID: return -1; /* "Returns -1 when system does not support NUMA" */
    /* Everything the double does not model reads as absent: Windows handles, fabric handles,
     * compression, memory pools, multicast, host-located VMM, MPS... */
    default: return 0;
    }
}

CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    CD_CALL(cuDeviceGetAttribute);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    cd_device *d = cd_dev(dev);
    if (!d)
        return CUDA_ERROR_INVALID_DEVICE;
    /* cuda.h is silent on an attribute number outside the enum: INVALID_VALUE (in its list). */
    if ((int)attrib < 1 || (int)attrib >= (int)CU_DEVICE_ATTRIBUTE_MAX)
        return CUDA_ERROR_INVALID_VALUE;
    *pi = attribute(d, attrib);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev)
{
    CD_CALL(cuDeviceCanAccessPeer);
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* cuda.h lists no INVALID_VALUE here; a NULL out pointer gets it all the same. */
    if (!canAccessPeer)
        return CUDA_ERROR_INVALID_VALUE;
    if (!cd_dev(dev) || !cd_dev(peerDev))
        return CUDA_ERROR_INVALID_DEVICE;
    /* "Returns in *canAccessPeer a value of 1 if contexts on dev are capable of directly accessing
     * memory from contexts on peerDev and 0 otherwise." A device is not its own peer (0), as on
     * real drivers; CUDADOUBLE_NO_PEER "a:b" makes (a, b) 0. */
    *canAccessPeer = dev != peerDev && cd_can_access(dev, peerDev);
    return CUDA_SUCCESS;
}

/* ---- handles of streams, events, graphs ------------------------------------------------------- */

uint64_t cd_encode(uint64_t id, unsigned tag) { return id << 8 | tag; }

void *cd_decode(const char *call, const void *handle, unsigned tag, const cd_map *m, const char *what)
{
    uint64_t v = (uint64_t)(uintptr_t)handle, id = v >> 8;
    if ((v & 0xff) != tag || id == 0 || id > cd.next_id)
        cd_undefined(call, "%p is not a %s this driver made; cuda.h gives no result for an invalid "
                     "handle (cuStreamGetCtx: \"Passing an invalid handle will result in undefined "
                     "behavior.\")", handle, what);
    void *o = cd_map_get(m, id);
    if (!o)
        cd_undefined(call, "%s %p was destroyed (or died with its primary context's reset); using a "
                     "destroyed handle is undefined (cuStreamGetCtx: \"Passing an invalid handle "
                     "will result in undefined behavior.\")", what, handle);
    return o;
}

/* ---- hooks ------------------------------------------------------------------------------------ */

static const char *const entry_names[CD_E_COUNT] = {
#define CD_ENTRY_NAME_(n) [CD_E_##n] = #n,
    CD_ENTRY_POINTS(CD_ENTRY_NAME_)
#undef CD_ENTRY_NAME_
};

static unsigned long hook_calls(const char *name)
{
    for (int i = 0; name && i < CD_E_COUNT; i++)
        if (strcmp(entry_names[i], name) == 0)
            return atomic_load(&cd_calls[i]);
    return 0;
}

static int hook_counters(int dev, vmm_sim_counters *out)
{
    if (!atomic_load(&cd.initialized))
        return CUDA_ERROR_NOT_INITIALIZED;
    cd_device *d = cd_dev(dev);
    return d ? vmm_sim_driver_counters(d->sim, out) : CUDA_ERROR_INVALID_DEVICE;
}

static void hook_live(vmm_sim_counters *out, unsigned *retained_contexts)
{
    if (out)
        vmm_sim_global_live(out);
    if (retained_contexts)
        *retained_contexts = cd_retained_total();
}

static int hook_fail_nth(int dev, int kind, uint64_t nth)
{
    if (!atomic_load(&cd.initialized))
        return CUDA_ERROR_NOT_INITIALIZED;
    cd_device *d = cd_dev(dev);
    return d ? vmm_sim_driver_fail_nth(d->sim, kind, nth) : CUDA_ERROR_INVALID_DEVICE;
}

static int hook_fail_random(int dev, int kind, double p, uint64_t seed)
{
    if (!atomic_load(&cd.initialized))
        return CUDA_ERROR_NOT_INITIALIZED;
    cd_device *d = cd_dev(dev);
    return d ? vmm_sim_driver_fail_random(d->sim, kind, p, seed) : CUDA_ERROR_INVALID_DEVICE;
}

static void hook_objects(cudadouble_objects_t *out)
{
    memset(out, 0, sizeof *out);
    cd_lock();
    out->streams = (unsigned)cd.streams.count;
    out->events = (unsigned)cd.events.count;
    out->graphs = cd_graphs_live();
    for (size_t i = 0; i < cd.handles.cap; i++)
        if (cd.handles.keys[i])
            out->handle_refs += ((cd_handle *)cd.handles.vals[i])->refs;
    out->reservations = (unsigned)cd.res.n;
    out->mappings = (unsigned)cd.n_mappings;
    out->linear_allocs = (unsigned)cd.linear.n;
    out->host_allocs = (unsigned)cd.host.n;
    for (cd_capture *c = cd.captures; c; c = c->next)
        out->captures++;
    for (int i = 0; i < cd.ndev; i++)
        out->reclaimed_by_reset += cd.dev[i].ctx.reclaimed;
    cd_unlock();
}

static CUresult hook_sticky_error(int dev)
{
    cd_lock();
    cd_device *d = atomic_load(&cd.initialized) ? cd_dev(dev) : NULL;
    CUresult r = d ? d->ctx.sticky : CUDA_ERROR_INVALID_DEVICE;
    cd_unlock();
    return r;
}

const cudadouble_hooks_t cudadouble_hooks_table = {
    .current_context = cd_hook_current_context,
    .primary_context = cd_hook_primary_context,
    .device_access = cd_hook_device_access,
    .counters = hook_counters,
    .live = hook_live,
    .fail_nth = hook_fail_nth,
    .fail_random = hook_fail_random,
    .calls = hook_calls,
    .objects = hook_objects,
    .sticky_error = hook_sticky_error,
};
