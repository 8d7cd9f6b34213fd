/*
 * cuGetProcAddress of the CUDA double, and the oldest ABI variants.
 *
 * "For a requested driver symbol, if the specified CUDA version is greater than or equal to the
 * CUDA version in which the driver symbol was introduced, this API will return the function pointer
 * to the corresponding versioned function." The table below lists, per base name, each ABI variant
 * with the version cudaTypedefs.h gives it (PFN_<name>_v<version>): the newest variant not newer
 * than the request wins. Per-thread (_ptsz) variants count only with
 * CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM ("If a per-thread version is not found, the API will
 * return the legacy version"); CU_GET_PROC_ADDRESS_LEGACY_STREAM and CU_GET_PROC_ADDRESS_DEFAULT
 * skip them (DEFAULT means per-thread only for callers built with per-thread default streams, and
 * cuda.h's inline wrapper then passes the flag explicitly: a DEFAULT reaching the driver is legacy).
 *
 * Every variant is also exported under its own symbol name, as libcuda.so.1 does.
 */
#include <string.h>

#include "cd_internal.h"

typedef void (*cd_fn)(void);

typedef struct variant {
    int version;
    bool ptsz;
    cd_fn fn;
} variant;

typedef struct proc_symbol {
    const char *name;
    variant v[6];
} proc_symbol;

#define L(ver, f) {ver, false, (cd_fn)(f)}
#define P(ver, f) {ver, true, (cd_fn)(f)}

/* The 32-bit CUdeviceptr_v1 / unsigned int ABIs of CUDA before 3.2: reachable by asking for an old
 * version, never meant to be called on a 64-bit process of today. */
#define OLD_ABI(call)                                                                            \
    cd_limitation(call, "the 32-bit ABI of CUDA before 3.2 (CUdeviceptr_v1, unsigned int sizes) is "  \
                  "not modelled; ask cuGetProcAddress for version 3020 or later")

CUresult CUDAAPI cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytesize)
{
    (void)dptr;
    (void)bytesize;
    OLD_ABI("cuMemAlloc");
}

CUresult CUDAAPI cuMemFree(CUdeviceptr_v1 dptr)
{
    (void)dptr;
    OLD_ABI("cuMemFree");
}

CUresult CUDAAPI cuMemGetInfo(unsigned int *free_bytes, unsigned int *total)
{
    (void)free_bytes;
    (void)total;
    OLD_ABI("cuMemGetInfo");
}

CUresult CUDAAPI cuDeviceTotalMem(unsigned int *bytes, CUdevice dev)
{
    (void)bytes;
    (void)dev;
    OLD_ABI("cuDeviceTotalMem");
}

CUresult CUDAAPI cuMemcpyHtoDAsync(CUdeviceptr_v1 dstDevice, const void *srcHost, unsigned int ByteCount,
                                   CUstream hStream)
{
    (void)dstDevice;
    (void)srcHost;
    (void)ByteCount;
    (void)hStream;
    OLD_ABI("cuMemcpyHtoDAsync");
}

CUresult CUDAAPI cuMemcpyDtoHAsync(void *dstHost, CUdeviceptr_v1 srcDevice, unsigned int ByteCount,
                                   CUstream hStream)
{
    (void)dstHost;
    (void)srcDevice;
    (void)ByteCount;
    (void)hStream;
    OLD_ABI("cuMemcpyDtoHAsync");
}

static const proc_symbol symbols[] = {
    {"cuGetProcAddress", {L(11030, cuGetProcAddress), L(12000, cuGetProcAddress_v2)}},
    {"cuInit", {L(2000, cuInit)}},
    {"cuDriverGetVersion", {L(2020, cuDriverGetVersion)}},
    {"cuGetErrorName", {L(6000, cuGetErrorName)}},
    {"cuGetErrorString", {L(6000, cuGetErrorString)}},
    {"cuDeviceGet", {L(2000, cuDeviceGet)}},
    {"cuDeviceGetCount", {L(2000, cuDeviceGetCount)}},
    {"cuDeviceGetAttribute", {L(2000, cuDeviceGetAttribute)}},
    {"cuDeviceGetName", {L(2000, cuDeviceGetName)}},
    {"cuDeviceTotalMem", {L(2000, cuDeviceTotalMem), L(3020, cuDeviceTotalMem_v2)}},
    {"cuDeviceCanAccessPeer", {L(4000, cuDeviceCanAccessPeer)}},
    {"cuMemGetAllocationGranularity", {L(10020, cuMemGetAllocationGranularity)}},
    {"cuDevicePrimaryCtxRetain", {L(7000, cuDevicePrimaryCtxRetain)}},
    {"cuDevicePrimaryCtxRelease",
     {L(7000, cuDevicePrimaryCtxRelease), L(11000, cuDevicePrimaryCtxRelease_v2)}},
    {"cuCtxGetCurrent", {L(4000, cuCtxGetCurrent)}},
    {"cuCtxSetCurrent", {L(4000, cuCtxSetCurrent)}},
    {"cuCtxPushCurrent", {L(2000, cuCtxPushCurrent), L(4000, cuCtxPushCurrent_v2)}},
    {"cuCtxPopCurrent", {L(2000, cuCtxPopCurrent), L(4000, cuCtxPopCurrent_v2)}},
    {"cuCtxGetDevice", {L(2000, cuCtxGetDevice), L(13000, cuCtxGetDevice_v2)}},
    {"cuCtxSynchronize", {L(2000, cuCtxSynchronize), L(13000, cuCtxSynchronize_v2)}},
    {"cuMemGetInfo", {L(2000, cuMemGetInfo), L(3020, cuMemGetInfo_v2)}},
    {"cuMemAddressReserve", {L(10020, cuMemAddressReserve)}},
    {"cuMemAddressFree", {L(10020, cuMemAddressFree)}},
    {"cuMemCreate", {L(10020, cuMemCreate)}},
    {"cuMemRelease", {L(10020, cuMemRelease)}},
    {"cuMemMap", {L(10020, cuMemMap)}},
    {"cuMemUnmap", {L(10020, cuMemUnmap)}},
    {"cuMemSetAccess", {L(10020, cuMemSetAccess)}},
    {"cuMemGetAccess", {L(10020, cuMemGetAccess)}},
    {"cuMemRetainAllocationHandle", {L(11000, cuMemRetainAllocationHandle)}},
    {"cuMemGetAllocationPropertiesFromHandle", {L(10020, cuMemGetAllocationPropertiesFromHandle)}},
    {"cuMemExportToShareableHandle", {L(10020, cuMemExportToShareableHandle)}},
    {"cuMemImportFromShareableHandle", {L(10020, cuMemImportFromShareableHandle)}},
    {"cuMemAlloc", {L(2000, cuMemAlloc), L(3020, cuMemAlloc_v2)}},
    {"cuMemFree", {L(2000, cuMemFree), L(3020, cuMemFree_v2)}},
    {"cuMemHostAlloc", {L(2020, cuMemHostAlloc)}},
    {"cuMemFreeHost", {L(2000, cuMemFreeHost)}},
    {"cuStreamCreate", {L(2000, cuStreamCreate)}},
    {"cuStreamDestroy", {L(2000, cuStreamDestroy), L(4000, cuStreamDestroy_v2)}},
    {"cuStreamSynchronize", {L(2000, cuStreamSynchronize), P(7000, cuStreamSynchronize_ptsz)}},
    {"cuStreamQuery", {L(2000, cuStreamQuery), P(7000, cuStreamQuery_ptsz)}},
    {"cuStreamWaitEvent", {L(3020, cuStreamWaitEvent), P(7000, cuStreamWaitEvent_ptsz)}},
    {"cuStreamGetCtx",
     {L(9020, cuStreamGetCtx), P(9020, cuStreamGetCtx_ptsz), L(12050, cuStreamGetCtx_v2),
      P(12050, cuStreamGetCtx_v2_ptsz)}},
    {"cuStreamBeginCapture",
     {L(10000, cuStreamBeginCapture), P(10000, cuStreamBeginCapture_ptsz), L(10010, cuStreamBeginCapture_v2),
      P(10010, cuStreamBeginCapture_v2_ptsz)}},
    {"cuStreamEndCapture", {L(10000, cuStreamEndCapture), P(10000, cuStreamEndCapture_ptsz)}},
    {"cuStreamIsCapturing", {L(10000, cuStreamIsCapturing), P(10000, cuStreamIsCapturing_ptsz)}},
    {"cuStreamGetCaptureInfo",
     {L(10010, cuStreamGetCaptureInfo), P(10010, cuStreamGetCaptureInfo_ptsz),
      L(11030, cuStreamGetCaptureInfo_v2), P(11030, cuStreamGetCaptureInfo_v2_ptsz),
      L(12030, cuStreamGetCaptureInfo_v3), P(12030, cuStreamGetCaptureInfo_v3_ptsz)}},
    {"cuThreadExchangeStreamCaptureMode", {L(10010, cuThreadExchangeStreamCaptureMode)}},
    {"cuGraphDestroy", {L(10000, cuGraphDestroy)}},
    {"cuEventCreate", {L(2000, cuEventCreate)}},
    {"cuEventRecord", {L(2000, cuEventRecord), P(7000, cuEventRecord_ptsz)}},
    {"cuEventQuery", {L(2000, cuEventQuery)}},
    {"cuEventSynchronize", {L(2000, cuEventSynchronize)}},
    {"cuEventDestroy", {L(2000, cuEventDestroy), L(4000, cuEventDestroy_v2)}},
    {"cuLaunchHostFunc", {L(10000, cuLaunchHostFunc), P(10000, cuLaunchHostFunc_ptsz)}},
    {"cuMemsetD32Async", {L(3020, cuMemsetD32Async), P(7000, cuMemsetD32Async_ptsz)}},
    {"cuMemsetD8Async", {L(3020, cuMemsetD8Async), P(7000, cuMemsetD8Async_ptsz)}},
    {"cuMemcpyDtoHAsync",
     {L(2000, cuMemcpyDtoHAsync), L(3020, cuMemcpyDtoHAsync_v2), P(7000, cuMemcpyDtoHAsync_v2_ptsz)}},
    {"cuMemcpyHtoDAsync",
     {L(2000, cuMemcpyHtoDAsync), L(3020, cuMemcpyHtoDAsync_v2), P(7000, cuMemcpyHtoDAsync_v2_ptsz)}},
};

/* The newest variant of sym usable at `version` (a _ptsz one wins a tie when allowed), or NULL. */
static const variant *pick(const proc_symbol *sym, int version, bool per_thread)
{
    const variant *best = NULL;
    for (size_t i = 0; i < sizeof sym->v / sizeof sym->v[0] && sym->v[i].fn; i++) {
        const variant *v = &sym->v[i];
        if (v->version > version || (v->ptsz && !per_thread))
            continue;
        if (!best || v->version > best->version || (v->version == best->version && v->ptsz))
            best = v;
    }
    return best;
}

CUresult cd_get_proc(const char *symbol_name, void **pfn, int version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult *status)
{
    if (!symbol_name || !pfn)
        return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    /* Flags outside the enum, or both stream kinds at once: INVALID_VALUE (cuda.h is silent). */
    const cuuint64_t both = CU_GET_PROC_ADDRESS_LEGACY_STREAM | CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    if ((flags & ~both) || flags == both)
        return CUDA_ERROR_INVALID_VALUE;
    /* "If the specified CUDA version is greater than the driver version, the API will return
     * CUDA_ERROR_INVALID_VALUE." */
    if (version > cd_driver_version())
        return CUDA_ERROR_INVALID_VALUE;
    const proc_symbol *sym = NULL;
    for (size_t i = 0; i < sizeof symbols / sizeof symbols[0] && !sym; i++)
        if (strcmp(symbols[i].name, symbol_name) == 0)
            sym = &symbols[i];
    bool per_thread = flags == CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
    const variant *v = sym ? pick(sym, version, per_thread) : NULL;
    /* "CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND - The requested symbol was not found";
     * "CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT - The requested symbol was found but is not
     * supported by cudaVersion specified". And: "The API will return CUDA_SUCCESS and set the
     * returned pfn to NULL if the requested driver function is not supported on the platform, no
     * ABI compatible driver function exists for the specified cudaVersion or if the driver symbol
     * is invalid." (CUDADOUBLE_GETPROC_ERRORS=1 answers CUDA_ERROR_NOT_FOUND instead, as shipped
     * drivers do.) */
    CUdriverProcAddressQueryResult st = !sym ? CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND
                                        : !v ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                                             : CU_GET_PROC_ADDRESS_SUCCESS;
    if (status)
        *status = st;
    if (!v)
        return cd.getproc_errors ? CUDA_ERROR_NOT_FOUND : CUDA_SUCCESS;
    memcpy(pfn, &v->fn, sizeof v->fn); /* a function pointer travels as void *, as dlsym's do */
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                     CUdriverProcAddressQueryResult *symbolStatus)
{
    CD_CALL(cuGetProcAddress);
    return cd_get_proc(symbol, pfn, cudaVersion, flags, symbolStatus);
}

/* The CUDA 11.3 ABI: no status out parameter. */
CUresult CUDAAPI cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags)
{
    CD_CALL(cuGetProcAddress);
    return cd_get_proc(symbol, pfn, cudaVersion, flags, NULL);
}
