/*
 * The driver interface: everything vmmalloc asks of a GPU, as one table of functions.
 *
 * Two implementations: drv_cuda.c (the CUDA Driver API, loaded at run time with dlopen +
 * cuGetProcAddress, on the device's primary context) and drv_sim.c (a simulated GPU in host memory).
 * Nothing above this layer knows which one it talks to.
 *
 * Contract
 * --------
 * Return values. Every op returns a vmm_drv_result: VMM_DRV_SUCCESS (0) or an error kind whose
 * numeric value equals the CUresult the CUDA driver returns in that case, so the cuda
 * implementation passes results through and the sim returns what CUDA would:
 *   INVALID_VALUE    misaligned size/address/offset, size 0, a range outside its reservation,
 *                    unmapping a range that is not fully mapped, a pointer mem_free doesn't know.
 *   OUT_OF_MEMORY    mem_create / mem_alloc / va_reserve beyond what the device (or VA) has.
 *   INVALID_HANDLE   an unknown stream or event; an event recorded on a stream of another context
 *                    (cuda.h, cuEventRecord: "hEvent and hStream must be from the same context
 *                    otherwise CUDA_ERROR_INVALID_HANDLE is returned").
 *   NOT_READY        event_query: the event's work has not completed yet (not a failure).
 *   NOT_SUPPORTED    the device cannot do it (no VMM support, no such peer access).
 *   NOT_INITIALIZED / NO_DEVICE / INVALID_DEVICE   driver or device unusable (open only).
 *   UNKNOWN          an injected or unexplained failure.
 * A failed op changes no state.
 *
 * Not promised. Callers must never rely on what these do, because cuda.h does not say:
 *   - releasing a physical handle twice, or any use of a released handle ("If handle is not a
 *     valid handle the behavior is undefined", cuMemRelease);
 *   - va_free of a reservation that still has mappings (cuMemAddressFree documents no such case);
 *   - mem_map over a range that is already mapped ("cuMemMap can only create mappings on VA range
 *     reservations that are not currently mapped": no error code is promised);
 *   - using a stream or event after destroying it.
 * The sim refuses the mapping cases with INVALID_VALUE (its own choice) and aborts on a handle
 * released twice; the CUDA double (tests/cudadouble) aborts on all of them, naming the call.
 *
 * Alignment. `granularity` (device_info) is the unit of physical memory: mem_create sizes, and the
 * va, size and offset of mem_map / mem_unmap / set_access, must be multiples of it. va_reserve
 * sizes must be multiples of it; its alignment argument is 0 (granularity) or a power-of-two
 * multiple. mem_alloc has no alignment rule and returns 256-byte aligned pointers (sim: 512).
 *
 * Mappings. As in CUDA today, mem_map maps a whole handle: offset must be 0 and size must equal the
 * handle's size. A handle may be mapped at several places at once, and unmapped and mapped again
 * elsewhere; its contents stay with it. mem_unmap(va, size) must name exactly one earlier mem_map
 * range (CUDA cannot unmap part of a mapping). set_access may span several adjacent mappings (one
 * call per contiguous run is the cheap way). A handle's memory returns to the device only when it is
 * released *and* no longer mapped. Memory may not be touched before set_access.
 *
 * Streams and events. Streams are opaque pointers; NULL is the default stream. Work on one stream
 * runs in FIFO order. event_record captures the work queued on a stream so far; event_query returns
 * SUCCESS once that work has run, NOT_READY before; event_sync blocks until then. An event never
 * recorded counts as complete. stream_wait_event makes later work on a stream wait for the event
 * without blocking the host. launch_host runs fn(arg) in stream order (cuLaunchHostFunc); fn must
 * not call the driver. mem_free synchronizes the device first, as cuMemFree does; no other op
 * synchronizes anything (mem_unmap and mem_release do not wait for queued work: callers must prove
 * memory idle with an event first).
 *
 * Contexts and devices. A driver serves one device. The cuda driver works in the device's primary
 * context and leaves every calling thread with the context it had, none included (a thread left
 * holding our context would silently switch the CUDA runtime's current device). Streams passed
 * in may belong to another device (record_stream with a peer's stream, pinned memory used by
 * several devices): event_prepare makes an event recordable on such a stream ahead of time, so
 * that event_record at free time creates nothing. set_access grants the driver's device and every
 * peer added with peer_enable; ranges mapped before a peer was added need set_access again.
 *
 * Capture (CUDA graphs). While a stream captures (cuStreamBeginCapture), work queued on it is
 * recorded into a graph instead of running, and replayed later as often as the graph is launched.
 * Then: an event recorded on the stream is a captured event, which event_query / event_sync refuse
 * (CAPTURED_EVENT) and which proves nothing about work that runs; stream_sync of the stream, and
 * device_sync or mem_free (which synchronize the device) while any capture goes on, are refused
 * (STREAM_CAPTURE_UNSUPPORTED) and invalidate the capture; a capturing stream waiting on an event
 * recorded outside the capture is refused (STREAM_CAPTURE_ISOLATION). "Potentially unsafe" calls
 * (every allocation, mapping and release call: va_reserve, va_free, mem_create, mem_release,
 * mem_map, mem_unmap, set_access, mem_alloc, mem_free, host_alloc, host_free, lookup_mapping; and
 * event_query, event_sync, stream_sync, device_sync) made by a thread whose capture mode is not
 * relaxed fail with STREAM_CAPTURE_UNSUPPORTED and invalidate a capture begun in a mode that
 * forbids them: the calling thread's own capture unless it was begun relaxed, and, when the
 * thread is in global mode, every other thread's capture begun in global mode (cuda.h,
 * cuThreadExchangeStreamCaptureMode). Callers therefore make such calls with the thread in relaxed
 * mode (capture_mode_exchange), and never query, wait on or synchronize what a capture encompasses.
 * The sim models this on its own streams (captures are per simulated device; the thread mode is
 * per thread, as in CUDA); the CUDA double models it as cuda.h documents.
 *
 * Thread safety. Every op may be called from any thread concurrently; implementations lock what
 * they share. Callbacks from launch_host run on a driver-owned thread.
 */
#ifndef VMM_DRIVER_H
#define VMM_DRIVER_H

#include <stddef.h>
#include <stdint.h>

#include "base/errors.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

/* vmm_drv_result, its names and its status codes: base/errors.h (error.c maps them without
 * knowing the driver). */

/* The implementations vmm_driver_open opens (the configuration's driver key). */
enum { VMM_DRIVER_SIM = 0, VMM_DRIVER_CUDA = 1 };

/* Capture interaction modes of a thread and of a capture (CUstreamCaptureMode's values). */
enum { VMM_CAPTURE_MODE_GLOBAL = 0, VMM_CAPTURE_MODE_THREAD_LOCAL = 1, VMM_CAPTURE_MODE_RELAXED = 2 };


typedef uint64_t vmm_phys; /* physical allocation handle (CUmemGenericAllocationHandle); 0 is none */
typedef void *vmm_event;   /* CUevent or a sim event */

typedef struct vmm_device_info {
    size_t total_bytes;      /* device memory */
    size_t granularity;      /* minimum allocation granularity for mem_create / map */
    size_t recommended_granularity;
    int vmm_supported;       /* virtual memory management available */
    int ordinal;             /* device number */
    int device_count;        /* devices the driver sees (1 on the sim) */
    int gdr_supported;       /* GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: pages are created
                                gpuDirectRDMACapable (NCCL / RDMA registration works) */
    int posix_fd_handles;    /* pages are created exportable as POSIX file descriptors */
    char name[64];           /* "sim" or the GPU's name */
} vmm_device_info;

typedef struct vmm_driver vmm_driver;

typedef struct vmm_driver_ops {
    const char *name; /* "cuda" or "sim" */
    int (*device_info)(vmm_driver *d, vmm_device_info *out);
    int (*mem_get_info)(vmm_driver *d, size_t *free_bytes, size_t *total_bytes);
    int (*va_reserve)(vmm_driver *d, size_t size, size_t alignment, uintptr_t *va);
    int (*va_free)(vmm_driver *d, uintptr_t va, size_t size);
    int (*mem_create)(vmm_driver *d, size_t size, vmm_phys *out);
    int (*mem_release)(vmm_driver *d, vmm_phys h);
    int (*mem_map)(vmm_driver *d, uintptr_t va, size_t size, size_t offset, vmm_phys h);
    int (*mem_unmap)(vmm_driver *d, uintptr_t va, size_t size);
    int (*set_access)(vmm_driver *d, uintptr_t va, size_t size);
    int (*mem_alloc)(vmm_driver *d, size_t size, uintptr_t *out);
    int (*mem_free)(vmm_driver *d, uintptr_t ptr);
    int (*stream_create)(vmm_driver *d, void **out);
    int (*stream_destroy)(vmm_driver *d, void *s);
    int (*stream_sync)(vmm_driver *d, void *s);
    int (*device_sync)(vmm_driver *d);
    int (*event_create)(vmm_driver *d, vmm_event *out);
    int (*event_record)(vmm_driver *d, vmm_event e, void *s);
    int (*event_query)(vmm_driver *d, vmm_event e);
    int (*event_sync)(vmm_driver *d, vmm_event e);
    int (*event_destroy)(vmm_driver *d, vmm_event e);
    int (*stream_wait_event)(vmm_driver *d, void *s, vmm_event e);
    /* OPTIONAL (NULL: every event can be recorded on every stream the caller passes, as on the
     * sim). Make e recordable on stream s, which may belong to another device's context: after
     * SUCCESS, event_record(e, s) allocates nothing and cannot fail for want of resources. An
     * event may be prepared for several contexts; it stays prepared until destroyed. */
    int (*event_prepare)(vmm_driver *d, vmm_event e, void *s);
    /* OPTIONAL (NULL: NOT_SUPPORTED). Add device `peer` to the devices set_access grants
     * read/write access. NOT_SUPPORTED when the peer cannot access this device's memory
     * (cuDeviceCanAccessPeer), INVALID_DEVICE for no such device; adding the driver's own device
     * or a peer already added succeeds and changes nothing. */
    int (*peer_enable)(vmm_driver *d, int peer);
    /* OPTIONAL (NULL: streams never capture). Whether stream s takes part in a capture now
     * (cuStreamGetCaptureInfo): *capturing 1 and *id the capture sequence's id (unique in the
     * process, nonzero) while it does, an invalidated capture included; 0 and 0 otherwise. The
     * legacy default stream next to a capturing blocking stream answers *capturing 1, *id 0
     * (cuda.h: STREAM_CAPTURE_IMPLICIT; nothing may be queued on it then). Not an unsafe call.
     * INVALID_HANDLE for an unknown stream. */
    int (*stream_capture_info)(vmm_driver *d, void *s, int *capturing, uint64_t *id);
    /* OPTIONAL (NULL: no capture modes). Set the calling thread's capture mode to *mode
     * (VMM_CAPTURE_MODE_*) and return the previous one in *mode
     * (cuThreadExchangeStreamCaptureMode). INVALID_VALUE for a mode out of range. */
    int (*capture_mode_exchange)(vmm_driver *d, int *mode);
    int (*launch_host)(vmm_driver *d, void *s, void (*fn)(void *), void *arg);
    /* Stream-ordered fill of n 32-bit words at va with value (cuMemsetD32Async). */
    int (*memset32)(vmm_driver *d, uintptr_t va, uint32_t value, size_t n, void *s);
    /* Stream-ordered copy of n bytes from device va to host memory (cuMemcpyDtoHAsync). */
    int (*memcpy_dtoh)(vmm_driver *d, void *dst, uintptr_t va, size_t n, void *s);
    /* OPTIONAL (NULL: none; sleep with backup answers VMM_ENOTSUP). Stream-ordered copy of n bytes
     * from host memory src to device va (cuMemcpyHtoDAsync); src must stay valid until the copy
     * has run (an event recorded after it completes). */
    int (*memcpy_htod)(vmm_driver *d, uintptr_t va, const void *src, size_t n, void *s);
    /* OPTIONAL (NULL: pages are never exportable). Pages created from now on are exportable as
     * POSIX file descriptors (on = 1: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) or plain (0: no
     * handle type). NOT_SUPPORTED when on is asked of a device that cannot export; device_info's
     * posix_fd_handles says what pages are created as. */
    int (*set_exportable)(vmm_driver *d, int on);
    /* OPTIONAL, present with set_exportable. *fd gets a new close-on-exec descriptor of handle h's
     * memory (cuMemExportToShareableHandle); the caller owns it. INVALID_VALUE for a handle that
     * was not created exportable. */
    int (*export_fd)(vmm_driver *d, vmm_phys h, int *fd);
    /* OPTIONAL, present with set_exportable. *out gets a new handle on the memory behind fd (a
     * descriptor export_fd made, in this process or another: cuMemImportFromShareableHandle); the
     * caller keeps fd (it may close it at once) and releases the handle with mem_release. The
     * memory is the exporter's: importing does not charge the device again. */
    int (*import_fd)(vmm_driver *d, int fd, vmm_phys *out);
    /* Physical handle mapped at the page containing va, or 0 and INVALID_VALUE when unmapped.
     * Used by vmm_check to compare the allocator's page table with the driver's. */
    int (*lookup_mapping)(vmm_driver *d, uintptr_t va, vmm_phys *out);
    /* OPTIONAL (NULL: unsupported; callers answer VMM_ENOTSUP). Page-locked host memory usable by
     * every context of the process (cuMemHostAlloc with CU_MEMHOSTALLOC_PORTABLE): `size` bytes,
     * nonzero, any value; *out page aligned. OUT_OF_MEMORY when the host cannot pin that much.
     * Host memory is not charged to the device's capacity. */
    int (*host_alloc)(vmm_driver *d, size_t size, void **out);
    /* OPTIONAL, present with host_alloc (cuMemFreeHost). Synchronizes the device first, as
     * cudaFreeHost does, so callers free only memory whose events have completed, and rarely.
     * INVALID_VALUE for a pointer host_alloc did not return. */
    int (*host_free)(vmm_driver *d, void *p);
    /* Tear the driver down: releases the context / the simulated device. Resources still live are
     * counted as leaks by the sim but freed all the same. */
    void (*close)(vmm_driver *d);
} vmm_driver_ops;

/* Every implementation starts its state with this header. */
struct vmm_driver {
    const vmm_driver_ops *ops;
    int is_sim;
};

enum { VMM_SIM_COST_POINTS_MAX = 128, VMM_SIM_COST_FILE_MAX = 256 };

/* Options of the simulated device (set from the sim_* config keys). */
typedef struct vmm_sim_options {
    size_t capacity;         /* bytes; default 80 GiB */
    size_t granularity;      /* bytes, power of two; default 2 MiB */
    int backed;              /* 1: physical handles are real memfd memory; 0: accounting only */
    int vmm_supported;       /* 0 simulates a device without VMM support */
    int cost_model;          /* 1: add modeled per-call costs to driver_time_ns */
    int real_time_create;    /* 1: mem_create sleeps its modeled cost, outside the device lock */
    int real_time;           /* 1: every call does (mem_create included) */
    uint64_t cost_ns[VMM_SIM_CALL_COUNT]; /* modeled cost per call kind, nanoseconds */
    /* Costs by size (sim_cost_file, a table tools/gpu-check measures): a call of a kind that has
     * points here costs, for its size in bytes (the handle's, range's or allocation's), the linear
     * interpolation between the points around it, the first point's below it and the last two's
     * line above the last (never less than the last); other kinds cost cost_ns[kind]. Only
     * driver_time_ns follows them: the real-time sleeps keep cost_ns. */
    struct vmm_sim_cost_point {
        int kind;
        uint64_t size, ns;
    } cost_points[VMM_SIM_COST_POINTS_MAX];
    int n_cost_points;
    char cost_file[VMM_SIM_COST_FILE_MAX]; /* the file they came from, "" for none */
    int fail_kind;           /* -2: none; -1 all kinds; else a VMM_SIM_CALL_* with fail_p */
    double fail_p;
    uint64_t fail_seed;
} vmm_sim_options;

/* sim_options.c: the options as data (no device), what code above the driver may use of the
 * simulator (the configuration's sim_* keys). */
void vmm_sim_default_options(vmm_sim_options *o);
/* The modeled cost in nanoseconds of one call of `kind` on `size` bytes under options o (the
 * cost_points of that kind, else cost_ns[kind]). */
uint64_t vmm_sim_cost_of(const vmm_sim_options *o, int kind, uint64_t size);
/* The VMM_SIM_CALL_* named by the len bytes at name (vmm_sim_call_name's names, any case); -3 for
 * none. */
int vmm_sim_call_kind(const char *name, size_t len);
/* Reads the "sim_cost_table" array of a cost file's text ([["kind", size_bytes, ns], ...]) into o:
 * size 0 sets cost_ns[kind], other sizes are cost_points. VMM_ECONFIG (message naming key and path)
 * on a bad table, o then partly written: parse into a copy. */
int vmm_sim_cost_table_parse(vmm_sim_options *o, const char *key, const char *path, const char *text);

/* driver.c: the contract's one entry, what code above the driver opens a device with. kind
 * VMM_DRIVER_SIM: the simulated device with options sim (NULL: the defaults), as
 * vmm_driver_sim_open; VMM_DRIVER_CUDA: device `ordinal` through libcuda.so.1, as
 * vmm_driver_cuda_open (msg gets its reason on failure). Returns a vmm_drv_result, *out the driver
 * on success; INVALID_VALUE (*out NULL) for another kind. msg (may be NULL) is "" unless a reason
 * was given. */
int vmm_driver_open(int kind, int ordinal, const vmm_sim_options *sim, vmm_driver **out, char *msg,
                    size_t msg_len);

/* drv_sim.c (the tests open it by name; the library through vmm_driver_open) */
int vmm_driver_sim_open(const vmm_sim_options *o, vmm_driver **out);
int vmm_sim_driver_counters(vmm_driver *d, vmm_sim_counters *out);
int vmm_sim_driver_fail_nth(vmm_driver *d, int kind, uint64_t nth);
int vmm_sim_driver_fail_random(vmm_driver *d, int kind, double p, uint64_t seed);
int vmm_sim_driver_on_call(vmm_driver *d, int kind, vmm_sim_call_hook fn, void *arg);
/* Sharing a handle's memory through a POSIX file descriptor (for the CUDA double's
 * cuMemExportToShareableHandle / cuMemImportFromShareableHandle). Backed mode only: NOT_SUPPORTED
 * unbacked or without VMM. export_fd: *fd gets a new close-on-exec descriptor of h's memory
 * (INVALID_HANDLE for a handle that is not live). import_fd: *out gets a new live handle sharing the
 * memory behind fd (a descriptor export_fd made, size a granularity multiple, else INVALID_VALUE);
 * the handle keeps its own descriptor and is not charged to capacity (the memory already exists).
 * Neither is counted as a call nor takes injected faults. */
int vmm_sim_driver_export_fd(vmm_driver *d, vmm_phys h, int *fd);
int vmm_sim_driver_import_fd(vmm_driver *d, int fd, vmm_phys *out);
/* Stream capture on the simulated device (vmm_sim_capture_begin & co. in vmmalloc_sim.h; the
 * CUDA double does not use them). begin: s (not the default stream, which stands for CUDA's legacy
 * stream) captures in `mode` (VMM_CAPTURE_MODE_*); INVALID_VALUE when it captures already.
 * end: the capture begun on s ends, every stream that joined it leaves it, and *graph gets the
 * recorded work (NULL and STREAM_CAPTURE_INVALIDATED when the capture was invalidated;
 * STREAM_CAPTURE_UNMATCHED on another stream, STREAM_CAPTURE_WRONG_THREAD from another thread
 * than a non-relaxed capture's owner). launch: queue the graph's work on s as one would replay it
 * (INVALID_VALUE when its memory is no longer mapped, or s captures). Graphs do not belong to a
 * device: graph_destroy works after the device is gone. Not counted as calls, no injected faults. */
int vmm_sim_driver_capture_begin(vmm_driver *d, void *s, int mode);
int vmm_sim_driver_capture_end(vmm_driver *d, void *s, vmm_sim_graph **graph);
int vmm_sim_driver_graph_launch(vmm_driver *d, vmm_sim_graph *g, void *s);
void vmm_sim_driver_graph_destroy(vmm_sim_graph *g);
size_t vmm_sim_driver_graph_nodes(const vmm_sim_graph *g);

/* drv_cuda.c (the tests open it by name; the library through vmm_driver_open): opens
 * libcuda.so.1 and device `ordinal` on its primary context. Returns a
 * vmm_drv_result; on failure msg (if non-NULL) gets a short reason. The results say why:
 *   NOT_INITIALIZED  no CUDA driver is installed: no libcuda.so.1, or the toolkit's stub library;
 *   NO_DEVICE        a driver without any GPU;
 *   INVALID_DEVICE   no device `ordinal`;
 *   NOT_SUPPORTED    a driver older than CUDA 12.0, or a libcuda.so.1 that is not a CUDA driver;
 *   anything else    the CUresult of the call that failed (named in msg): a broken driver. */
int vmm_driver_cuda_open(int ordinal, vmm_driver **out, char *msg, size_t msg_len);

#endif /* VMM_DRIVER_H */
