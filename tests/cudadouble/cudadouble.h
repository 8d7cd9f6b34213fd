/*
 * Test-side hooks of the CUDA driver double (libcuda.so.1 built in tests/cudadouble/).
 *
 * The double is a libcuda.so.1 that follows cuda.h's documentation strictly, with memory in host
 * memory (the simulator's, src/driver/drv_sim.c). Tests never link it: the library under test dlopen's
 * "libcuda.so.1" as it would on a GPU machine (the double's directory on LD_LIBRARY_PATH), and a
 * test reaches these hooks with cudadouble_hooks(), which dlopen's the same already-loaded library
 * with RTLD_NOLOAD and looks each hook up. On a machine with a real driver the lookups find nothing
 * (cudadouble_hooks returns NULL): that is how a test tells the double from a GPU.
 *
 * Environment read by the double at cuInit:
 *   CUDADOUBLE_DEVICES         number of devices (default 2, at most CUDADOUBLE_MAX_DEVICES)
 *   CUDADOUBLE_CAPACITY_MB     capacity of every device in MiB (default 81920: 80 GiB)
 *   CUDADOUBLE_GRANULARITY_KB  minimum granularity in KiB (default 2048); recommended is the same
 *   CUDADOUBLE_NO_VMM          comma list of device ordinals without VMM support
 *   CUDADOUBLE_NO_RDMA         comma list of ordinals without GPU_DIRECT_RDMA_WITH_CUDA_VMM
 *   CUDADOUBLE_NO_FD           comma list of ordinals without POSIX file descriptor handles
 *   CUDADOUBLE_NO_PEER         comma list of "a:b" pairs where device a cannot access device b
 *   CUDADOUBLE_DRIVER_VERSION  what cuDriverGetVersion reports (default 13000)
 *   CUDADOUBLE_FAIL_INIT       a CUresult number cuInit returns instead of success
 *   CUDADOUBLE_GETPROC_ERRORS  1: cuGetProcAddress answers CUDA_ERROR_NOT_FOUND for a symbol it
 *                              does not have (or not at that version), as shipped drivers do;
 *                              default 0 follows cuda.h: CUDA_SUCCESS with *pfn NULL and the reason
 *                              in symbolStatus ("The API will return CUDA_SUCCESS and set the
 *                              returned pfn to NULL if ... the driver symbol is invalid")
 * A malformed value aborts cuInit with a message (a broken test setup, not a CUDA result).
 *
 * Undefined behaviour (a handle released twice, a destroyed stream used, ...) aborts the process
 * with a message naming the call and the cuda.h passage; a test that wants to see it forks.
 */
#ifndef CUDADOUBLE_H
#define CUDADOUBLE_H

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#include "vmmalloc_sim.h"

enum { CUDADOUBLE_MAX_DEVICES = 8 };

/* The double's own objects alive now (a leak check for the library under test). */
typedef struct cudadouble_objects_t {
    unsigned streams;           /* cuStreamCreate'd, not destroyed */
    unsigned events;            /* cuEventCreate'd, not destroyed */
    unsigned graphs;            /* from cuStreamEndCapture, not cuGraphDestroy'ed (capturing ones too) */
    unsigned handle_refs;       /* cuMemCreate / import / retain references not cuMemRelease'd */
    unsigned reservations;      /* cuMemAddressReserve'd, not freed */
    unsigned mappings;          /* cuMemMap'ed, not unmapped */
    unsigned linear_allocs;     /* cuMemAlloc'ed, not freed */
    unsigned host_allocs;       /* cuMemHostAlloc'ed, not freed */
    unsigned captures;          /* capture sequences begun and not ended */
    unsigned long reclaimed_by_reset; /* streams, events, cuMemAlloc blocks freed because their
                                         primary context was released to zero */
} cudadouble_objects_t;

typedef struct cudadouble_hooks_t {
    /* The context current on the calling thread, NULL when none (never an error): lets a test see
     * which context a thread is left with after a call into the library under test. */
    CUcontext (*current_context)(void);
    /* The primary context of device `dev` (NULL when it was never retained), and its retain count. */
    CUcontext (*primary_context)(int dev, unsigned *retain_count);
    /* Plays "a kernel on device `dev` touches [p, p+n)": copies n bytes to buf (write 0) or from buf
     * (write 1) when every byte is mapped and cuMemSetAccess granted `dev` access to it (or it is a
     * cuMemAlloc allocation of `dev`, or page-locked host memory); CUDA_ERROR_ILLEGAL_ADDRESS
     * otherwise, touching nothing. Synchronous: it runs now, not in stream order. */
    CUresult (*device_access)(int dev, CUdeviceptr p, size_t n, void *buf, int write);
    /* Counters of device dev's simulated memory and calls, as vmm_sim_get_counters reports them.
     * They count simulator calls, not CUDA calls: the double's stream-ordered memsets and copies run
     * as launch_host, and it makes short-lived events of its own (implicit synchronization with the
     * legacy stream, cuStreamQuery, cross-device waits). Use calls() for CUDA-level counts.
     * Returns 0, or a CUresult (NOT_INITIALIZED, INVALID_DEVICE). */
    int (*counters)(int dev, vmm_sim_counters *out);
    /* Live resources summed over every device (as vmm_sim_global_live), plus the primary context
     * retain counts summed over every device (0 once every retain was released). Either pointer may
     * be NULL. The simulator counts the double's own short-lived helpers too (see counters). */
    void (*live)(vmm_sim_counters *out, unsigned *retained_contexts);
    /* Fault injection on device dev, as vmm_sim_fail_nth / vmm_sim_fail_random (kind: a
     * VMM_SIM_CALL_* value or -1). Injected failures return what CUDA would and change nothing. */
    int (*fail_nth)(int dev, int kind, uint64_t nth);
    int (*fail_random)(int dev, int kind, double p, uint64_t seed);
    /* Calls of one entry point by its cuda.h base name ("cuMemAlloc", "cuStreamSynchronize",
     * "cuGetProcAddress" for lookups), every ABI variant together (_v2, _ptsz...), failed calls
     * included; 0 for a name the double does not export. */
    unsigned long (*calls)(const char *name);
    /* The double's objects still alive (see cudadouble_objects_t). */
    void (*objects)(cudadouble_objects_t *out);
    /* The sticky error of device dev's primary context: CUDA_SUCCESS, or CUDA_ERROR_ILLEGAL_ADDRESS
     * once stream-ordered work of that context touched memory its device may not access (every
     * later call in that context then fails with it); CUDA_ERROR_INVALID_DEVICE for no such device. */
    CUresult (*sticky_error)(int dev);
} cudadouble_hooks_t;

/* Defined by the double (tests reach it with cudadouble_hooks(), never by linking). */
extern const cudadouble_hooks_t cudadouble_hooks_table;

/* The hooks of the double loaded in this process, or NULL when libcuda.so.1 is not the double
 * (or is not loaded). Header-only so tests need not link anything. */
#include <dlfcn.h>
static inline const cudadouble_hooks_t *cudadouble_hooks(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        return NULL;
    void *sym = dlsym(lib, "cudadouble_hooks_table");
    dlclose(lib);
    return (const cudadouble_hooks_t *)sym;
}

#endif /* CUDADOUBLE_H */
