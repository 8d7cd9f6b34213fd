/*
 * vmmalloc — a CUDA caching allocator over expandable virtual-memory segments.
 *
 * Conventions for every function in this header (zstd style):
 *  - Return value: an int status, VMM_OK (0) on success or a negative VMM_E* code. On failure
 *    vmm_last_error() holds a one-line message for the calling thread, and the allocator's
 *    state is exactly as before the call.
 *  - Units: sizes and counts are bytes unless named otherwise; times are nanoseconds.
 *  - Ownership: the caller owns what it passes in; pointers returned by vmm_malloc belong to the
 *    allocator and are given back with vmm_free.
 *  - Thread safety: every function taking a vmm_allocator may be called from any thread at any
 *    time, concurrently with any other, except vmm_destroy, which must be the last call on it.
 */
#ifndef VMMALLOC_H
#define VMMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(VMM_BUILDING_LIBRARY) && !defined(VMM_STATIC_DEFINE)
#define VMM_API __attribute__((visibility("default")))
#else
#define VMM_API
#endif

#define VMM_VERSION_MAJOR 0
#define VMM_VERSION_MINOR 1
#define VMM_VERSION_PATCH 0

/* Status codes: one list, expanded into the enum, vmm_strerror and vmm_status_name. */
#define VMM_STATUS_MAP(X)                                                                  \
    X(OK, 0, "success")                                                                    \
    X(ENOMEM, -1, "out of device memory")                                                  \
    X(EINVAL, -2, "invalid argument")                                                      \
    X(ENOTSUP, -3, "operation not supported")                                              \
    X(EDRIVER, -4, "driver call failed")                                                   \
    X(ECONFIG, -5, "invalid configuration")                                                \
    X(EBADPTR, -6, "pointer not allocated by this allocator, or already freed")           \
    X(ENODEV, -7, "no usable device or driver")                                            \
    X(ECORRUPT, -8, "allocator invariant violated")                                        \
    X(EHOSTMEM, -9, "out of host memory")                                                  \
    X(ERANGE, -10, "value out of range")

typedef enum vmm_status {
#define VMM_STATUS_ENUM_(name, value, text) VMM_##name = (value),
    VMM_STATUS_MAP(VMM_STATUS_ENUM_)
#undef VMM_STATUS_ENUM_
} vmm_status;

/* Human-readable text of a status code; "unknown status" for a value not in the list.
 * The string is static. Thread safe. */
VMM_API const char *vmm_strerror(int status);

/* The code's name without prefix ("ENOMEM"); "UNKNOWN" for a value not in the list. Thread safe. */
VMM_API const char *vmm_status_name(int status);

/* Message of the last failed call made by this thread (with details: the offending config key,
 * the OOM report, ...). Empty string when none failed yet. Valid until this thread's next vmmalloc call. */
VMM_API const char *vmm_last_error(void);

/* Opaque allocator: one device, one driver. */
typedef struct vmm_allocator vmm_allocator;

/* A CUstream / cudaStream_t on the cuda driver, or a stream made by vmm_sim_stream_create on the
 * simulated one. NULL is the device's default stream. */
typedef void *vmm_stream;

/*
 * Create an allocator.
 *  conf: "key:value,key:value" (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax). Keys from the environment
 *        variable VMMALLOC_CONF apply first; keys in conf override them. NULL or "" means defaults.
 *        Unknown keys and bad values give VMM_ECONFIG naming the key in vmm_last_error().
 *        docs/user-guide.md lists every key with its default.
 *  out:  receives the allocator; set to NULL on failure.
 * Returns VMM_OK, VMM_ECONFIG, VMM_ENODEV (no libcuda, no device, no VMM support when expandable
 * segments are asked for), VMM_EDRIVER, VMM_EHOSTMEM.
 */
VMM_API int vmm_create(const char *conf, vmm_allocator **out);

/* Destroy an allocator: waits for its pending frees to complete, then returns every page, physical
 * handle and VA range to the driver. Live blocks are reported on stderr (and counted) and their
 * memory is returned all the same. NULL is a no-op. Not thread safe with other calls on `a`. */
VMM_API void vmm_destroy(vmm_allocator *a);

/*
 * Allocate `size` bytes of device memory, usable on `stream` without synchronization.
 * The pointer is aligned to at least 512 bytes. size 0 sets *ptr to NULL and returns VMM_OK.
 * Returns VMM_OK, VMM_ENOMEM (vmm_last_error() has the OOM report), VMM_EINVAL (size too large,
 * ptr NULL), VMM_EDRIVER.
 */
VMM_API int vmm_malloc(vmm_allocator *a, size_t size, vmm_stream stream, void **ptr);

/*
 * Free a pointer returned by vmm_malloc. The memory is reused on its allocation stream at once
 * (stream order makes that safe) and on other streams only after every stream recorded with
 * vmm_record_stream has finished the work queued before this free. NULL is a no-op.
 * Returns VMM_OK, VMM_EBADPTR (never returned, interior pointer, double free) or VMM_EINVAL (a is
 * NULL): nothing else, so callers that cannot retry (PyTorch's free hook) never leak a block. The
 * events a free records were taken by vmm_record_stream; one that could not be had or recorded
 * is recorded later (the block waits for it, never the caller), and waits that cannot have an
 * event at all synchronize the used stream (counted in num_event_waits).
 */
VMM_API int vmm_free(vmm_allocator *a, void *ptr);

/* Mark the block at ptr as used by `stream` (besides its allocation stream), so a later free waits
 * for work queued on `stream` up to that free. `stream` may belong to another device (the event
 * is made in the stream's context). The event the free will record is prepared here; when it
 * cannot be, the use is still recorded and the free falls back (see vmm_free), so the use is never
 * lost. Returns VMM_OK, VMM_EBADPTR, VMM_EINVAL (a stream destroyed through vmm_sim_stream_destroy),
 * VMM_EHOSTMEM (no host memory to record the use: nothing changed). */
VMM_API int vmm_record_stream(vmm_allocator *a, void *ptr, vmm_stream stream);

/*
 * Let kernels on device `peer` read and write every expandable-segment block of this allocator,
 * those mapped already and those mapped later (cuMemSetAccess for the device and each such peer,
 * as PyTorch's expandable segments do for the peers it enables). The peer_access config key sets
 * the initial peers (default all: every device the driver says can access this one). Memory of
 * classic segments (expandable_segments:false) follows CUDA's peer rules for cuMemAlloc memory
 * (cuCtxEnablePeerAccess), which this call does not touch. Enabling the own device or a peer
 * enabled before is a no-op. Thread safe.
 * Returns VMM_OK; VMM_ENOTSUP when the peer cannot access this device (cuDeviceCanAccessPeer) or
 * the driver has no peers (sim); VMM_ENODEV for no such device; VMM_EDRIVER when granting failed
 * (mapped memory may then be reachable from the peer only in part: call again).
 */
VMM_API int vmm_enable_peer_access(vmm_allocator *a, int peer);

/* Return all cached memory that no pending event guards (unmapped pages, their handles, whole free
 * classic segments) to the driver, without synchronizing. Returns VMM_OK or VMM_EDRIVER. */
VMM_API int vmm_empty_cache(vmm_allocator *a);

/* Size in bytes that vmm_malloc reserved for the live block at ptr (after rounding), or 0 when ptr
 * is not a live block start. Thread safe. */
VMM_API size_t vmm_usable_size(vmm_allocator *a, const void *ptr);

/* Counters with PyTorch's meaning. current / peak / allocated (cumulative) / freed (cumulative). */
typedef struct vmm_stat {
    int64_t current;
    int64_t peak;
    int64_t allocated;
    int64_t freed;
} vmm_stat;

enum { VMM_POOL_ALL = 0, VMM_POOL_SMALL = 1, VMM_POOL_LARGE = 2, VMM_POOL_COUNT = 3 };

typedef struct vmm_stats {
    /* Indexed by VMM_POOL_*. */
    vmm_stat allocation[VMM_POOL_COUNT];          /* live blocks handed out */
    vmm_stat segment[VMM_POOL_COUNT];             /* segments (VA ranges or cuMemAlloc segments) */
    vmm_stat active[VMM_POOL_COUNT];              /* blocks allocated or pending free */
    vmm_stat inactive_split[VMM_POOL_COUNT];      /* free blocks inside partly used segments */
    vmm_stat allocated_bytes[VMM_POOL_COUNT];     /* rounded bytes handed out */
    vmm_stat reserved_bytes[VMM_POOL_COUNT];      /* physical bytes held (mapped + cached handles) */
    vmm_stat active_bytes[VMM_POOL_COUNT];
    vmm_stat inactive_split_bytes[VMM_POOL_COUNT];
    vmm_stat requested_bytes[VMM_POOL_COUNT];     /* bytes asked for, before rounding */
    vmm_stat mapped_bytes[VMM_POOL_COUNT];        /* bytes mapped into VA */
    vmm_stat oversize_allocations;
    vmm_stat oversize_segments;
    int64_t num_alloc_retries;
    int64_t num_ooms;
    int64_t num_sync_all_streams;
    int64_t num_device_alloc;                     /* cuMemCreate / cuMemAlloc calls */
    int64_t num_device_free;                      /* cuMemRelease / cuMemFree calls */
    int64_t num_event_waits;                      /* blocking waits on a guarding event, or on a
                                                     used stream (stream sync) where no event could
                                                     be recorded for a freed block */
    int64_t num_pages_mapped;
    int64_t num_pages_unmapped;
    int64_t num_pages_remapped;                   /* cached handles mapped again elsewhere */
    int64_t max_split_size;                       /* bytes; -1 when unlimited */
    int64_t metadata_bytes;                       /* host bytes held for block and segment records */
    int64_t reserved_va_bytes;                    /* virtual address space reserved */
} vmm_stats;

/* Fill *out with the allocator's counters. Returns VMM_OK or VMM_EINVAL. */
VMM_API int vmm_get_stats(vmm_allocator *a, vmm_stats *out);

/* Reset every peak to its current value, and the cumulative counters when `cumulative` is nonzero. */
VMM_API int vmm_reset_stats(vmm_allocator *a, int cumulative);

/*
 * Write the stats as one flat JSON object into buf (NUL-terminated), with PyTorch's key names
 * ("allocated_bytes.all.current", "num_ooms", ...) plus vmmalloc's own ("num_event_waits",
 * "mapped_bytes.all.current", "metadata_bytes", ...) and, on a simulated device, "sim.device_syncs",
 * "sim.stream_syncs", "sim.driver_time_ns" and "sim.calls.<kind>".
 * Returns the length written (> 0) on success, VMM_ERANGE when len is too small (the output is
 * truncated but terminated), VMM_EINVAL for bad arguments.
 */
VMM_API int vmm_stats_json(vmm_allocator *a, char *buf, size_t len);

/*
 * Walk every structure and check every invariant: blocks tile each segment exactly, no two free
 * neighbours that should have merged, pools hold exactly the free blocks, stats equal recomputed
 * sums, mapped pages match the driver's view. Returns VMM_OK or VMM_ECORRUPT with the first broken
 * invariant in vmm_last_error(). Cost is linear in the number of blocks and pages; meant for tests.
 */
VMM_API int vmm_check(vmm_allocator *a);

/* The configuration in force, as a "key:value,..." string written into buf (NUL-terminated).
 * Returns the length or VMM_ERANGE when buf is too small. */
VMM_API int vmm_config_string(vmm_allocator *a, char *buf, size_t len);

/* ---- Pinned host memory (src/pinned.c) ---------------------------------------------------------
 *
 * A caching allocator for page-locked host memory (cuMemHostAlloc), the staging buffers of
 * asynchronous copies. It hangs off a device allocator and uses its driver and streams; its state is
 * created on first use and destroyed by vmm_destroy (which waits for pending frees, then returns
 * every block to the driver). Blocks are rounded to a power of two (at least 512 bytes) and cached
 * on one free list per size; a block is never split.
 *
 * Reuse is stream ordered through events: vmm_pinned_free records an event on the allocation stream
 * and on every stream given to vmm_pinned_record_stream, and the block is handed out again only once
 * all of them have completed (polled with event queries, never waited for). Unlike device memory, a
 * pinned block is not reused at once even on its own stream: the host writes into a new block at
 * once, while copies queued on the stream may still read the old contents.
 *
 * Needs a driver with host memory (cuda, sim); VMM_ENOTSUP otherwise.
 */

/* Allocate `size` bytes of page-locked host memory whose first use is on `stream`. size 0 sets *ptr
 * to NULL and returns VMM_OK. Returns VMM_OK, VMM_EINVAL (ptr NULL, size too large), VMM_EHOSTMEM
 * (the host cannot pin more, even after the cache was emptied), VMM_ENOTSUP, VMM_EDRIVER. */
VMM_API int vmm_pinned_malloc(vmm_allocator *a, size_t size, vmm_stream stream, void **ptr);

/* Free a block from vmm_pinned_malloc. It becomes reusable once the work queued so far on its
 * streams has run. NULL is a no-op. Returns VMM_OK, VMM_EBADPTR (unknown, interior or already freed
 * pointer) or VMM_EINVAL (a is NULL), nothing else: the events it records were taken when the uses
 * were (vmm_pinned_malloc, vmm_pinned_record_stream), and one that could not be had or recorded
 * is recorded by a later poll; the block is not reused before. */
VMM_API int vmm_pinned_free(vmm_allocator *a, void *ptr);

/* Mark the block at ptr as used by `stream` too, so its reuse also waits for that stream's work
 * queued before the free. Returns VMM_OK, VMM_EBADPTR, VMM_EHOSTMEM. */
VMM_API int vmm_pinned_record_stream(vmm_allocator *a, void *ptr, vmm_stream stream);

/* Return every cached block whose events have completed to the driver (cuMemFreeHost, which
 * synchronizes the device: call it rarely). Blocks still in use or pending stay. Returns VMM_OK or
 * VMM_EDRIVER. */
VMM_API int vmm_pinned_empty_cache(vmm_allocator *a);

/* Bytes of the live pinned block at ptr (its power-of-two size class), 0 when ptr is not one. */
VMM_API size_t vmm_pinned_usable_size(vmm_allocator *a, const void *ptr);

typedef struct vmm_pinned_stats {
    vmm_stat allocations;       /* blocks handed out */
    vmm_stat allocated_bytes;   /* their size-class bytes */
    vmm_stat requested_bytes;   /* bytes asked for */
    vmm_stat reserved_bytes;    /* page-locked bytes held: handed out, pending and cached */
    vmm_stat segments;          /* host allocations held (one per block) */
    int64_t pending_blocks;     /* freed, waiting for their events */
    int64_t cached_blocks;      /* free and reusable */
    int64_t num_host_alloc;     /* cuMemHostAlloc calls that succeeded */
    int64_t num_host_free;      /* cuMemFreeHost calls that succeeded */
    int64_t num_reuses;         /* mallocs served from the cache */
    int64_t num_event_waits;    /* blocking event (or, with no event, stream) waits; vmm_destroy only */
    int64_t num_events;         /* events created and not destroyed */
} vmm_pinned_stats;

/* Fill *out (all zero before the first pinned call). Returns VMM_OK or VMM_EINVAL. */
VMM_API int vmm_pinned_get_stats(vmm_allocator *a, vmm_pinned_stats *out);

/* Reset the pinned peaks to their current values (and the cumulative counters when `cumulative`). */
VMM_API int vmm_pinned_reset_stats(vmm_allocator *a, int cumulative);

/* The pinned stats as one flat JSON object, keys "pinned.<name>[.current|.peak|.allocated|.freed]".
 * Returns the length, VMM_ERANGE when len is too small (truncated, terminated), VMM_EINVAL. */
VMM_API int vmm_pinned_stats_json(vmm_allocator *a, char *buf, size_t len);

/* ---- PyTorch pluggable allocator (src/pytorch.c) -----------------------------------------------
 *
 * vmm_torch_malloc / vmm_torch_free have the signatures torch.cuda.memory.CUDAPluggableAllocator
 * loads from a shared library (size_t-sized sizes, a cudaStream_t):
 *     torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(
 *         "libvmmalloc.so", "vmm_torch_malloc", "vmm_torch_free"))
 * before the first CUDA allocation (python/vmmalloc does this: vmmalloc.torch.install()). One
 * allocator per device is created on first use from VMMALLOC_CONF, then the conf given to
 * vmm_torch_configure, then "device:N" (the driver defaults to cuda).
 *
 * PyTorch reaches only malloc and free through that path; memory_stats, empty_cache,
 * record_stream and the OOM text are reached through the vmm_torch_* helpers below, which the
 * Python package calls with ctypes. Failures of these entry points are kept process wide (not per
 * thread, since Python may ask from another thread than the one that allocated): see
 * vmm_torch_last_error and vmm_torch_oom_report. Everything here is thread safe, except
 * vmm_torch_shutdown.
 */

/* Most devices the pluggable allocator serves (device ordinals 0 .. VMM_TORCH_MAX_DEVICES-1). */
enum { VMM_TORCH_MAX_DEVICES = 64 };

/* Allocate on `device` for `stream` (a cudaStream_t). NULL when size is 0 or on failure: then
 * vmm_torch_last_error() says why, and on out-of-memory vmm_torch_oom_report() holds the report. */
VMM_API void *vmm_torch_malloc(ptrdiff_t size, int device, void *stream);

/* Free a pointer from vmm_torch_malloc (size, device and stream as PyTorch passes them; the device
 * is tried first, then every other). A bad pointer is reported on stderr and in vmm_torch_last_error. */
VMM_API void vmm_torch_free(void *ptr, ptrdiff_t size, int device, void *stream);

/* Set the conf ("key:value,...", NULL or "" for VMMALLOC_CONF alone) used for allocators created from
 * now on. It is checked at once (with VMMALLOC_CONF): VMM_ECONFIG naming the key when bad. VMM_EINVAL
 * when some device's allocator exists already (the conf would apply to only some devices). */
VMM_API int vmm_torch_configure(const char *conf);

/* The allocator of `device`, created if needed (for stats, vmm_sim_* calls in tests, ...). */
VMM_API int vmm_torch_get_allocator(int device, vmm_allocator **out);

/* vmm_stats_json of the device's allocator (created if needed). Returns the length or a status. */
VMM_API int vmm_torch_stats_json(int device, char *buf, size_t len);

/* vmm_empty_cache / vmm_reset_stats(a, 0) of one device's allocator, or of every existing one when
 * device is -1. Returns VMM_OK or the first failure. */
VMM_API int vmm_torch_empty_cache(int device);
VMM_API int vmm_torch_reset_peaks(int device);

/* vmm_record_stream on the allocator that owns ptr. VMM_EBADPTR when none does. */
VMM_API int vmm_torch_record_stream(void *ptr, void *stream);

/* vmm_snapshot_pickle / vmm_record_history of the device's allocator (created if needed); on
 * failure the message is kept for vmm_torch_last_error. Returns VMM_OK or the status. */
VMM_API int vmm_torch_snapshot(int device, const char *path);
VMM_API int vmm_torch_record_history(int device, size_t max_entries);

/* Copy the last failure message of any vmm_torch_* call (any thread) / the last out-of-memory
 * report into buf (NUL-terminated; "" when none). Return the full length of the text. */
VMM_API int vmm_torch_last_error(char *buf, size_t len);
VMM_API int vmm_torch_oom_report(char *buf, size_t len);

/* Destroy every device's allocator and forget the conf and messages (for tests and orderly exits;
 * no other vmm_torch_* call may run meanwhile, and pointers still live are reported and lost). */
VMM_API void vmm_torch_shutdown(void);

/* ---- History, snapshots and fused buffers (src/history.c, src/snapshot.c, src/group.c) ----------
 *
 * History: a ring of the allocator's last events (what PyTorch calls the trace), kept while
 * vmm_record_history is on. Each entry has an action, an address, a size, a stream and a time in
 * microseconds since the epoch (as PyTorch's time_us; read from the monotonic clock plus an offset
 * taken once per process, so times never go back). When the ring is full the oldest entry goes.
 * Recording costs one branch per event while off, a copy of 40 bytes while on. With
 * vmm_record_history_ex it can also keep the call stack of each event (native return addresses,
 * Python frames), shown as "frames" in snapshots; docs/snapshots.md gives the measured cost.
 *
 * Snapshot: vmm_snapshot_pickle writes the allocator's segments and blocks with their states, and
 * the history, in the format of PyTorch's torch.cuda.memory._snapshot() pickled by
 * _dump_snapshot(), so pytorch.org/memory_viz, torch.cuda._memory_viz and tools/vmm_viz.py
 * (vmm-viz) draw it. docs/snapshots.md describes the format and its mapping of vmmalloc's state.
 *
 * Fused buffers: vmm_malloc_group places n buffers side by side in one block (a gradient bucket,
 * a broadcast of all weights), freed together.
 */

/* Trace actions, named as in PyTorch's snapshot (vmm_trace_action_name). */
typedef enum vmm_trace_action {
    VMM_TRACE_ALLOC = 0,          /* a block handed out: addr, rounded size */
    VMM_TRACE_FREE_REQUESTED = 1, /* vmm_free called on it */
    VMM_TRACE_FREE_COMPLETED = 2, /* it is back in its pool (after the events of other streams) */
    VMM_TRACE_SEGMENT_ALLOC = 3,  /* classic segment allocated (cuMemAlloc) */
    VMM_TRACE_SEGMENT_FREE = 4,   /* classic segment freed */
    VMM_TRACE_SEGMENT_MAP = 5,    /* expandable segment: pages mapped at [addr, addr + size) */
    VMM_TRACE_SEGMENT_UNMAP = 6,  /* expandable segment: pages unmapped */
    VMM_TRACE_OOM = 7,            /* out of memory: size requested, addr = device bytes free */
    VMM_TRACE_ACTION_COUNT = 8
} vmm_trace_action;

typedef struct vmm_trace_entry {
    int action;               /* vmm_trace_action */
    uintptr_t addr;
    size_t size;
    vmm_stream stream;
    uint64_t time_us;         /* microseconds since the epoch */
} vmm_trace_entry;

/* PyTorch's name of a trace action ("alloc", "free_requested", "segment_map", ...); "unknown" for a
 * value out of range. Static string, thread safe. */
VMM_API const char *vmm_trace_action_name(int action);

/* Keep the last max_entries events from now on (0 stops recording and drops the ring). Changing the
 * size keeps the newest entries that fit. No call stacks: vmm_record_history_ex(a, n, 0).
 * Returns VMM_OK, VMM_EINVAL, VMM_EHOSTMEM. */
VMM_API int vmm_record_history(vmm_allocator *a, size_t max_entries);

/* Flags of vmm_record_history_ex: which call stacks to keep, and where (PyTorch's stacks= and
 * context= arguments of torch.cuda.memory._record_memory_history). */
enum {
    /* Native return addresses of the calling thread (glibc backtrace, at most 64 frames), kept as
     * numbers and named with dladdr only when a snapshot is written. Frames inside libvmmalloc.so
     * are left out of snapshots. */
    VMM_HISTORY_STACKS_NATIVE = 1,
    /* The calling thread's Python frames (file, function, line; at most 96), when the process runs
     * CPython 3.10 or later (found with dlsym; the library never links libpython). They are read
     * when the thread holds the GIL, or, for vmm_malloc, gathered before the allocator's lock by
     * taking the GIL for a Python thread that released it (as PyTorch's allocator does); threads
     * Python never ran on have none. In a snapshot a stack with both shows the native frames down
     * to the Python interpreter, then the Python frames. */
    VMM_HISTORY_STACKS_PYTHON = 2,
    VMM_HISTORY_STACKS_ALL = 3,
    /* Default (neither flag): frames on live blocks, segments and every trace entry (context
     * "all"). CONTEXT_ALLOC: trace entries of frees carry none ("alloc"). CONTEXT_STATE: only live
     * blocks and segments carry frames, trace entries none ("state"). */
    VMM_HISTORY_CONTEXT_ALLOC = 4,
    VMM_HISTORY_CONTEXT_STATE = 8
};

/* vmm_record_history with call stacks: flags is 0 or VMM_HISTORY_STACKS_* with at most one
 * VMM_HISTORY_CONTEXT_* flag. Stacks are interned (one copy of each distinct stack, at most 64 MiB
 * per allocator; further new stacks are not kept) and dropped with the ring. Changing the size
 * keeps the newest entries and, if stacks stay on, their stacks. Returns VMM_OK, VMM_EINVAL (bad
 * flags), VMM_ENOTSUP (VMM_HISTORY_STACKS_PYTHON in a process without CPython >= 3.10),
 * VMM_EHOSTMEM. */
VMM_API int vmm_record_history_ex(vmm_allocator *a, size_t max_entries, unsigned flags);

/* Copy the newest min(max, held) entries of the ring, oldest first, into out (out may be NULL
 * when max is 0).
 * Returns the number of entries the ring holds (which may exceed max), or a negative status. */
VMM_API int64_t vmm_history_get(vmm_allocator *a, vmm_trace_entry *out, size_t max);

/* Write the ring as CSV, header "action,addr,size,stream,time_us", addresses and streams in hex
 * (0x...), one line per event, oldest first (vmm-viz reads it). Returns VMM_OK, VMM_EINVAL (NULL
 * argument, or the file cannot be written: the message names the path and the reason),
 * VMM_EHOSTMEM. */
VMM_API int vmm_history_csv(vmm_allocator *a, const char *path);

/*
 * Write a snapshot of a to `path` as a pickle (protocol 2) of PyTorch's snapshot dict:
 *   segments: one per mapped range of an expandable segment (as PyTorch reports expandable
 *     segments) or per classic segment, with device, address, total_size, allocated_size,
 *     active_size, requested_size, stream, segment_type ("small" / "large"), segment_pool_id (0, 0),
 *     is_expandable, frames [] and blocks [{address, size, requested_size, state
 *     ("active_allocated" / "active_pending_free" / "inactive"), frames []}]; a fused block has
 *     "parts" [{offset, size}] too, and a frame naming it;
 *   device_traces: one list per device ordinal up to this one, the history as
 *     {action, addr, size, stream, time_us, frames []} (empty lists when history is off; an
 *     "oom" entry has device_free too, equal to addr);
 *   allocator_settings: {"PYTORCH_CUDA_ALLOC_CONF": the config string, "expandable_segments",
 *     "max_split_size", "garbage_collection_threshold", "allocator": "vmmalloc"};
 *   external_annotations: [].
 * The state is copied under the allocator's lock, the file written after. Returns VMM_OK,
 * VMM_EINVAL (NULL argument, file cannot be written: the message names the path and the reason),
 * VMM_EHOSTMEM.
 */
VMM_API int vmm_snapshot_pickle(vmm_allocator *a, const char *path);

/* Alignment of each buffer of a fused group, bytes (PyTorch's block granularity). */
enum { VMM_GROUP_ALIGN = 512 };

/*
 * Allocate n buffers of sizes[0..n-1] bytes side by side in one block usable on `stream`: ptrs[i]
 * is the first byte of buffer i, each aligned to VMM_GROUP_ALIGN, in order, with at most
 * VMM_GROUP_ALIGN - 1 bytes of padding after each. The block counts as one allocation in the stats
 * and shows as one block with its parts in snapshots. Free it with vmm_free(a, ptrs[0]); vmm_free
 * of another member gives VMM_EBADPTR. Returns VMM_OK, VMM_EINVAL (NULL argument, n == 0, a size
 * of 0, total too large), VMM_ENOMEM, VMM_EHOSTMEM, VMM_EDRIVER; on failure every ptrs[i] is NULL.
 */
VMM_API int vmm_malloc_group(vmm_allocator *a, const size_t *sizes, size_t n, vmm_stream stream,
                             void **ptrs);

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_H */
