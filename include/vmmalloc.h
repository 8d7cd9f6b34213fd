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
 *  conf: "key:value,key:value" (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax). Layers, each overriding
 *        the one before: PyTorch's PYTORCH_ALLOC_CONF (or PYTORCH_CUDA_ALLOC_CONF when that is unset;
 *        only the keys that mean the same in vmmalloc apply, PyTorch-only keys are ignored with a
 *        warning), then VMMALLOC_CONF, then conf. NULL or "" means defaults. Unknown keys and bad
 *        values give VMM_ECONFIG naming the key (and the variable) in vmm_last_error().
 *        docs/user-guide.md lists every key with its default.
 *  out:  receives the allocator; set to NULL on failure.
 * Thread safe (each call makes its own allocator).
 * Returns VMM_OK, VMM_ECONFIG, VMM_ENODEV (no libcuda, no device, a driver older than CUDA 12.0
 * gives VMM_ENOTSUP; no VMM support when expandable segments are asked for), VMM_ENOTSUP,
 * VMM_EDRIVER (a broken driver: vmm_last_error() names the CUresult), VMM_EHOSTMEM.
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
 * Returns VMM_OK, VMM_EBADPTR (never returned, interior pointer, double free; of two threads
 * freeing one pointer at once, one gets VMM_OK and the other this) or VMM_EINVAL (a is NULL):
 * nothing else, so callers that cannot retry (PyTorch's free hook) never leak a block. The
 * events a free records were taken by vmm_record_stream; one that could not be had or recorded
 * is recorded later (the block waits for it, never the caller), and waits that cannot have an
 * event at all synchronize the used stream (counted in num_event_waits).
 *
 * Thread caches (config key thread_cache, default 4M; a power of two near 1/512 of the small
 * pool's allocated bytes when that is more): a small-pool block of at most 64 KiB with no
 * vmm_record_stream use goes to the freeing thread's cache, and that thread's next malloc of the
 * same rounded size on the same stream gets it back without taking the allocator's lock; that is
 * how threads on one allocator run in parallel. Cached blocks count as freed in every counter and
 * go back to their pool (where they merge) before this thread maps new memory, before any OOM, on
 * vmm_empty_cache, vmm_check and snapshots, and when the thread exits. Caches turn off for
 * good once history is recorded or tags, sleep, IPC, private pools or callbacks are used.
 *
 * Lanes (config key lanes, default true): once a second thread mallocs, a malloc the thread cache
 * missed and a free it did not keep take only their stream's lock when cached memory serves them
 * (a block that fits, after the thread's own cached blocks of that stream went back to it; a
 * block with no vmm_record_stream use or group), so threads on their own streams do not queue on
 * the allocator's lock. Anything else (growth first) takes it as before, and whoever holds
 * it lets the streams' locks go around each driver call it makes (event records and queries, waits,
 * unmaps, handle releases, cudaMalloc / cudaFree in classic mode), so those never stop another
 * stream's lane. They turn off for good with the thread caches.
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
    /* sleep / wake, callbacks, IPC (vmm_sleep, vmm_add_free_memory_callback, vmm_ipc_*) */
    vmm_stat sleeping_bytes;                      /* live blocks asleep: no device memory behind them */
    int64_t backup_bytes;                         /* host bytes holding sleeping blocks' contents */
    int64_t num_sleeps;                           /* tags put to sleep */
    int64_t num_wakes;                            /* tags woken */
    int64_t num_wake_failures;                    /* vmm_wake calls undone for want of memory */
    int64_t num_free_memory_callbacks;            /* runs of the free-memory callbacks */
    int64_t num_free_memory_callback_hits;        /* runs in which one reported freeing memory */
    int64_t ipc_exported_blocks;                  /* live blocks shared with vmm_ipc_get_handle */
    int64_t ipc_limbo_blocks;                     /* freed here, still open in another process */
    int64_t ipc_open_mappings;                    /* other processes' blocks opened here */
} vmm_stats;

/* Fill *out with the allocator's counters. Returns VMM_OK or VMM_EINVAL. Current values are exact.
 * Peaks are exact with one thread; while several threads use thread caches (see vmm_free), a peak
 * of allocation / allocated_bytes / requested_bytes / active may be off by what the other threads'
 * caches held at that moment (at most a cache's cap each: thread_cache, see vmm_free). */
VMM_API int vmm_get_stats(vmm_allocator *a, vmm_stats *out);

/* Reset every peak to its current value, and the cumulative counters when `cumulative` is nonzero. */
VMM_API int vmm_reset_stats(vmm_allocator *a, int cumulative);

/* Reset only the cumulative counters (every stat's allocated / freed, num_alloc_retries, num_ooms,
 * num_sync_all_streams, num_device_alloc / free and vmmalloc's own num_* counters) to 0; peaks and
 * current values stay (PyTorch's reset_accumulated_memory_stats). Returns VMM_OK or VMM_EINVAL. */
VMM_API int vmm_reset_accumulated_stats(vmm_allocator *a);

/* Cap the bytes this allocator may reserve at `fraction` of the device's total memory (rounded down
 * to the allocation granularity), as the per_process_memory_fraction config key does at creation and
 * PyTorch's set_per_process_memory_fraction does for its allocator. fraction is in [0, 1]; 0 makes
 * every allocation fail. Memory reserved above a lowered cap stays (nothing is unmapped here); growth
 * past the cap then fails with VMM_ENOMEM (the OOM report names the cap). Thread safe.
 * Returns VMM_OK or VMM_EINVAL (NULL allocator, fraction out of range: nothing changed). */
VMM_API int vmm_set_memory_fraction(vmm_allocator *a, double fraction);

/* The fraction in force and, when cap_bytes is not NULL, the cap in bytes it gives.
 * Returns VMM_OK or VMM_EINVAL (NULL a or fraction). */
VMM_API int vmm_get_memory_fraction(vmm_allocator *a, double *fraction, size_t *cap_bytes);

/*
 * Write the stats as one flat JSON object into buf (NUL-terminated), with PyTorch's key names
 * ("allocated_bytes.all.current", "num_ooms", ...) plus vmmalloc's own ("num_event_waits",
 * "mapped_bytes.all.current", "metadata_bytes", "thread_caches.*", "growths_unlocked" (growths that
 * made their driver calls with the allocator lock released), "lanes.open", "lanes.mallocs" and
 * "lanes.frees" (per-stream locks open, and the mallocs and frees done under one; see vmm_free),
 * ...) and, on a simulated device,
 * "sim.device_syncs", "sim.stream_syncs", "sim.driver_time_ns" and "sim.calls.<kind>".
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

/* ---- CUDA graphs: capture and private pools (src/core/capture.c, src/features/mempool.c) -----------------------
 *
 * Capture. While a stream captures a CUDA graph, work queued on it is recorded, not run, and every
 * replay of the graph runs it again at the same addresses. The allocator is safe to call then: it
 * records no event or fence on a capturing stream (frees of blocks used by other streams wait until
 * no capture is underway), never waits or synchronizes (an allocation that would need to fails with
 * VMM_ENOMEM whose message says capture prevented the sync), and makes its driver calls with the
 * calling thread in relaxed capture mode (cuThreadExchangeStreamCaptureMode), so that cuMemCreate,
 * cuMemMap or an event query do not invalidate a capture of this or another thread. A capture is
 * "underway" while a route below is in force, or when the driver says the stream at hand captures.
 *
 * Private pools (PyTorch's graph pools, MempoolId_t). Memory handed to captured work belongs to the
 * graph: every replay writes it again, so it must not be handed to anyone else until the graph is
 * gone. vmm_pool_begin routes the allocations of some streams to the private pool with id
 * (id0, id1); blocks of a private pool, freed or not, are reused only by later allocations routed to
 * the same pool (several graphs may share one, as torch.cuda.graph(pool=...) does), and its pages
 * are never unmapped or returned while it has users. Each vmm_pool_begin of a pool adds a user,
 * vmm_pool_release takes one away (PyTorch's use_count); when the last goes, the pool's memory
 * returns to the default pools (cached, reusable by any allocation of its stream, returned to the
 * device by vmm_empty_cache) after one device synchronization, which waits for replays still
 * running. Expandable segments stay on in private pools: a pool grows by mapping pages, which may
 * come from idle pages of the default pools. Stats: vmm_pool_get_stats per pool, "private_pools.*"
 * in vmm_stats_json; vmm_check checks the pools; vmm_pool_lookup tells the pool of an address.
 *
 * Ids: any pair but (0, 0), which names the default pools. Thread safety: as everywhere; a filter
 * runs under the allocator's lock, must be fast and must not call the allocator.
 */

/* Route filter: nonzero when allocations on `stream` go to the pool (PyTorch passes a function that
 * compares the stream's capture id with its graph's). */
typedef int (*vmm_stream_filter)(void *ctx, vmm_stream stream);

/*
 * Begin routing to private pool (id0, id1) the allocations made on `stream` (vmm_pool_begin) or on
 * every stream `filter(ctx, stream)` accepts (vmm_pool_begin_filter; NULL filter: every stream),
 * until vmm_pool_end. Creates the pool with one user, or adds a user to an existing one (also one
 * released to no user whose memory has not gone back yet). Routes in force are tried oldest first;
 * while any is in force, frees of blocks with record_stream uses are deferred and nothing waits.
 * Call it before the capture begins and vmm_pool_end after it ends (as PyTorch does). ctx is the
 * caller's and must outlive the route.
 * Returns VMM_OK, VMM_EINVAL (a NULL, id (0, 0), a route to this pool already in force),
 * VMM_EHOSTMEM (nothing changed).
 */
VMM_API int vmm_pool_begin(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_stream stream);
VMM_API int vmm_pool_begin_filter(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_stream_filter filter,
                                  void *ctx);

/* End the route to pool (id0, id1). The pool keeps its memory and its users. When it was the last
 * route in force, deferred frees go on (their events are recorded) and pools released meanwhile
 * give their memory back (vmm_pool_release). Returns VMM_OK, VMM_EINVAL (no route to that pool). */
VMM_API int vmm_pool_end(vmm_allocator *a, uint64_t id0, uint64_t id1);

/* Add a user to pool (id0, id1), creating it (empty) when needed, without routing anything
 * (PyTorch's createOrIncrefPool, for a pool object that outlives the graphs sharing it).
 * Returns VMM_OK, VMM_EINVAL (id (0, 0)), VMM_EHOSTMEM. */
VMM_API int vmm_pool_retain(vmm_allocator *a, uint64_t id0, uint64_t id1);

/*
 * Take a user away from pool (id0, id1) (PyTorch's releasePool, called when a graph is destroyed).
 * When none is left, the pool's memory returns to the default pools: blocks still allocated stay
 * valid and return to their stream's default pool when freed, free blocks become cached memory at
 * once. That needs one device synchronization (counted in num_sync_all_streams), to be sure no
 * replay still runs on the memory; while captures are underway (routes in force) it waits for the
 * last vmm_pool_end, and while a tag of its memory sleeps (vmm_sleep) it waits for that tag's
 * vmm_wake. Returns VMM_OK, VMM_EINVAL (no such pool, or no user left), VMM_EDRIVER (the
 * synchronization failed: the pool stays released and is retried at the next vmm_pool_end /
 * vmm_empty_cache).
 */
VMM_API int vmm_pool_release(vmm_allocator *a, uint64_t id0, uint64_t id1);

typedef struct vmm_pool_stats {
    int64_t use_count;        /* users (vmm_pool_begin / vmm_pool_retain minus vmm_pool_release) */
    int64_t routed;           /* 1 while a vmm_pool_begin route to it is in force */
    int64_t segments;         /* VA reservations (expandable) or cuMemAlloc segments it owns */
    int64_t reserved_bytes;   /* physical bytes mapped in them */
    int64_t allocations;      /* live blocks */
    int64_t allocated_bytes;  /* their rounded bytes */
    int64_t pending_bytes;    /* freed blocks waiting for other streams' events */
    int64_t free_bytes;       /* mapped bytes free: reusable by routed allocations only */
    int64_t num_mallocs;      /* allocations served since the pool was made */
} vmm_pool_stats;

/* Fill *out for pool (id0, id1). Returns VMM_OK, VMM_EINVAL (NULL argument, no such pool: one whose
 * memory went back after its last release no longer exists). Cost: linear in the pool's blocks. */
VMM_API int vmm_pool_get_stats(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_pool_stats *out);

/* The pool of the memory at ptr (any address inside a segment of the allocator, allocated or not):
 * *id0, *id1 get its id, (0, 0) for the default pools. Returns VMM_OK, VMM_EBADPTR (not this
 * allocator's memory), VMM_EINVAL. Linear in the number of segments. */
VMM_API int vmm_pool_lookup(vmm_allocator *a, const void *ptr, uint64_t *id0, uint64_t *id1);

/* ---- Pinned host memory (src/features/pinned.c) ---------------------------------------------------------
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
 * (the host cannot pin more, even after the cache was emptied; while a capture is
 * underway, a route in force or `stream` capturing, the cache is not emptied, since cuMemFreeHost
 * synchronizes the device), VMM_ENOTSUP, VMM_EDRIVER. */
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

/* ---- PyTorch pluggable allocator (src/api/pytorch.c) -----------------------------------------------
 *
 * vmm_torch_malloc / vmm_torch_free have the signatures torch.cuda.memory.CUDAPluggableAllocator
 * loads from a shared library (size_t-sized sizes, a cudaStream_t):
 *     torch.cuda.memory.change_current_allocator(torch.cuda.memory.CUDAPluggableAllocator(
 *         "libvmmalloc.so", "vmm_torch_malloc", "vmm_torch_free"))
 * before the first CUDA allocation (python/vmmalloc does this: vmmalloc.torch.install()). One
 * allocator per device is created on first use from VMMALLOC_CONF, then the conf given to
 * vmm_torch_configure, then "device:N" (the driver defaults to cuda).
 *
 * PyTorch reaches only malloc and free through that path (and the hooks set on it); torch.cuda's
 * memory functions (memory_stats, reset_*, _record_memory_history, _snapshot, the memory fraction)
 * reach vmmalloc through the vmm_torch_* helpers below, which the Python package calls with ctypes
 * from the torch._C entry points it replaces (docs/pytorch.md). With the graph hooks set on the
 * pluggable allocator (python/vmmalloc/graphs.py and its C++ shim), PyTorch also calls vmm_torch_record_stream,
 * vmm_torch_empty_cache and the pool entry points below itself (CUDA graphs). Failures of these entry points are kept process wide (not per
 * thread, since Python may ask from another thread than the one that allocated): see
 * vmm_torch_last_error and vmm_torch_oom_report. Everything here is thread safe, except
 * vmm_torch_shutdown.
 */

/* Most devices the pluggable allocator serves (device ordinals 0 .. VMM_TORCH_MAX_DEVICES-1). */
enum { VMM_TORCH_MAX_DEVICES = 64 };

/* Allocate on `device` for `stream` (a cudaStream_t). NULL when size is 0 or on failure: then
 * vmm_torch_last_error() says why, and on out-of-memory vmm_torch_oom_report() holds the report. */
VMM_API void *vmm_torch_malloc(ptrdiff_t size, int device, void *stream);

/* Status of the calling thread's last vmm_torch_malloc: VMM_OK (also for size 0), VMM_ENOMEM,
 * VMM_ENOTSUP (a refused capture), ...; vmm_last_error() on that thread has its message. For a
 * wrapper that turns a NULL into the caller's exception (python/vmmalloc/csrc/torch_alloc.cpp raises
 * PyTorch's OutOfMemoryError on VMM_ENOMEM). Thread safe (thread local). */
VMM_API int vmm_torch_malloc_status(void);

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

/* vmm_reset_accumulated_stats of one device's allocator, or of every existing one when device is -1
 * (PyTorch's reset_accumulated_memory_stats). Returns VMM_OK or the first failure. */
VMM_API int vmm_torch_reset_accumulated(int device);

/* 1 when the device's allocator exists (it served or was asked something), else 0; never creates
 * one. For callers that walk the devices in use (snapshots of every device). Thread safe. */
VMM_API int vmm_torch_has_allocator(int device);

/* vmm_set_memory_fraction on the device's allocator (created if needed). Its shape is that of
 * CUDAPluggableAllocator::set_memory_fraction_fn's function, void(double fraction, int device), so
 * torch.cuda.set_per_process_memory_fraction reaches it; a failure (fraction out of [0, 1], bad
 * device) is printed on stderr and kept for vmm_torch_last_error. */
VMM_API void vmm_torch_set_memory_fraction(double fraction, int device);

/* vmm_get_memory_fraction of the device's allocator (created if needed). Returns VMM_OK or the status. */
VMM_API int vmm_torch_get_memory_fraction(int device, double *fraction, size_t *cap_bytes);

/* vmm_record_history_ex on one device's allocator, or with device -1 on every existing one and on
 * every allocator created from then on (PyTorch records history for all devices at once;
 * max_entries 0 stops everywhere; the setting for later allocators is kept even when applying it
 * to an existing one failed). Returns VMM_OK or the first failure (message kept). */
VMM_API int vmm_torch_record_history_ex(int device, size_t max_entries, unsigned flags);

/* vmm_record_stream on the allocator that owns ptr. VMM_EBADPTR when none does. Its shape is that
 * of CUDAPluggableAllocator::set_record_stream_fn's function, void(void *ptr, cudaStream_t). */
VMM_API int vmm_torch_record_stream(void *ptr, void *stream);

/*
 * CUDA graphs through the pluggable allocator: the hooks of CUDAPluggableAllocator's
 * set_begin_allocate_to_pool, set_end_allocate_to_pool_fn and set_release_pool (PyTorch's
 * beginAllocateToPool / endAllocateToPool / releasePool), with MempoolId_t (a pair of unsigned
 * long long) passed as id0, id1 and the std::function<bool(cudaStream_t)> filter as a C function
 * and its context (filter NULL: every stream). The C++ shim python/vmmalloc/csrc/graph_hooks.cpp
 * adapts the shapes. They act on the device's allocator (created if needed): vmm_pool_begin_filter,
 * vmm_pool_end, vmm_pool_release. Return VMM_OK or the status; the message is kept for
 * vmm_torch_last_error. ctx must stay valid until vmm_torch_end_allocate_to_pool.
 */
VMM_API int vmm_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1,
                                             vmm_stream_filter filter, void *ctx);
VMM_API int vmm_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1);
VMM_API int vmm_torch_release_pool(int device, uint64_t id0, uint64_t id1);

/* Capture guard for a pluggable allocator installed without the graph hooks (on: 1): from then on
 * vmm_torch_malloc on a stream that captures, with no private-pool route for it, fails (NULL; the
 * message says why) instead of handing out memory eager code would reuse while replays write it.
 * Costs one cuStreamGetCaptureInfo per allocation while on. Returns the previous setting. */
VMM_API int vmm_torch_set_capture_guard(int on);

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

/* ---- History, snapshots and fused buffers (src/api/history.c, src/api/snapshot.c, src/api/group.c) ----------
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
 * _dump_snapshot(), so pytorch.org/memory_viz, torch.cuda._memory_viz and vmm-viz
 * (python/vmmalloc/_vmm_viz.py) draw it. docs/snapshots.md describes the format and its mapping
 * of vmmalloc's state.
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
 * (0x...), one line per event, oldest first (vmm-viz reads it; call stacks are not written). Returns VMM_OK, VMM_EINVAL (NULL
 * argument, or the file cannot be written: the message names the path and the reason),
 * VMM_EHOSTMEM. */
VMM_API int vmm_history_csv(vmm_allocator *a, const char *path);

/*
 * Write a snapshot of a to `path` as a pickle (protocol 2) of PyTorch's snapshot dict:
 *   segments: one per mapped range of an expandable segment (as PyTorch reports expandable
 *     segments) or per classic segment, with device, address, total_size, allocated_size,
 *     active_size, requested_size, stream, segment_type ("small" / "large"), segment_pool_id (the private pool id for CUDA-graph memory, else (0, 0)),
 *     is_expandable, frames (where it was mapped) and blocks [{address, size, requested_size
 *     (kept by a pending block), state ("active_allocated" / "active_pending_free" / "inactive"),
 *     frames (its allocation's stack)}]; a fused block has "parts" [{offset, size}] too, and a
 *     first frame naming it;
 *   device_traces: one list per device ordinal up to this one, the history as
 *     {action, addr, size, stream, time_us (since the epoch), frames, compile_context "",
 *     user_metadata ""} (empty lists when history is off; an "oom" entry has device_free too,
 *     equal to addr);
 *   frames: [{filename, line, name}] innermost first, [] without stacks (vmm_record_history_ex);
 *   allocator_settings: {"PYTORCH_CUDA_ALLOC_CONF": the config string, "expandable_segments",
 *     "max_split_size", "garbage_collection_threshold", "roundup_power2_divisions",
 *     "allocator": "vmmalloc"};
 *   external_annotations: [].
 * The state is copied under the allocator's lock; stacks are named (dladdr) and the file written
 * after. Returns VMM_OK, VMM_EINVAL (NULL argument, file cannot be written: the message names the
 * path and the reason), VMM_EHOSTMEM.
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

/* ---- Tags, sleep and wake (src/features/sleep.c) --------------------------------------------------------
 *
 * Sleep gives a tag's device memory back without freeing its blocks: their physical pages are
 * unmapped and released while every virtual address stays reserved, so pointers (and captured CUDA
 * graphs) stay valid; wake maps fresh pages at the same addresses, restores the contents when they
 * were backed up, and grants the same access (peers included). vLLM's sleep levels map onto modes:
 * level 1 = weights BACKUP + kv_cache DISCARD, level 2 = both DISCARD.
 *
 * Tags. Every allocation has a tag: the allocator's current tag when it was made (vmm_set_tag; ""
 * is the untagged default), as vLLM's use_memory_pool(tag=...). Blocks of different tags never
 * share a page (each tag has its own segments), so a tag can sleep alone. Tagged memory always lives
 * in VMM segments, also with expandable_segments:false (untagged memory is classic cuMemAlloc memory
 * there, which cannot sleep). At most VMM_MAX_TAGS tags (the untagged one included) per allocator,
 * names up to VMM_TAG_NAME_MAX bytes.
 *
 * While a tag sleeps: allocations under it fail (VMM_EINVAL), other tags allocate and free as usual;
 * freeing one of its blocks is allowed (its address range goes back, nothing to unmap, its backup is
 * dropped); touching its memory is an error of the caller's (a GPU faults; the simulated device in
 * backed mode maps nothing there, so the host faults too). Private pools of CUDA graphs (vmm_pool_*)
 * do not sleep. A block shared with vmm_ipc_get_handle and still open in another process cannot
 * sleep (its pages live on there): vmm_sleep refuses.
 */
enum { VMM_MAX_TAGS = 64, VMM_TAG_NAME_MAX = 63 };

typedef enum vmm_sleep_mode {
    VMM_SLEEP_DISCARD = 0,   /* contents are dropped; wake gives memory of undefined contents */
    VMM_SLEEP_BACKUP = 1,    /* contents are copied to page-locked host memory and restored on wake */
    VMM_SLEEP_KEEP_HOST = 2  /* with BACKUP: keep the host buffer after wake for the next sleep of
                              * the tag (no pinning cost then, host memory held meanwhile) */
} vmm_sleep_mode;

/* Make `tag` (NULL or "": untagged) the tag of the allocations made from now on, by any thread
 * (an allocator-wide setting, as vLLM's). Creates the tag on first use. Returns VMM_OK, VMM_EINVAL
 * (name too long), VMM_ERANGE (VMM_MAX_TAGS tags exist), VMM_ENOTSUP (a tag other than "" on a
 * device without VMM support), VMM_EHOSTMEM. */
VMM_API int vmm_set_tag(vmm_allocator *a, const char *tag);

/* The current tag into buf (NUL-terminated). Returns its length or VMM_ERANGE / VMM_EINVAL. */
VMM_API int vmm_get_tag(vmm_allocator *a, char *buf, size_t len);

/* The tag of the live block at ptr into buf. Returns its length, VMM_EBADPTR, VMM_ERANGE. */
VMM_API int vmm_tag_of(vmm_allocator *a, const void *ptr, char *buf, size_t len);

/*
 * Put the blocks of tags[0..n_tags-1] to sleep (tags NULL or n_tags 0: every tag, the untagged one
 * included; a tag already asleep is left as it is). In order: wait for the work that still uses
 * them (an event on their streams and on every stream vmm_record_stream named, each wait counted
 * in num_event_waits; nothing else is synchronized), copy their contents to page-locked host memory
 * when mode has VMM_SLEEP_BACKUP (one buffer per tag), tell the before_unmap callback, unmap and
 * release their physical pages and the tags' free pages, then release every cached handle.
 * mem_get_info of the device rises by what was released.
 * Returns VMM_OK; VMM_EINVAL (unknown tag, bad mode, a block still open in another process, untagged
 * live blocks in classic segments; frees pending there on vmm_record_stream events are completed
 * first, they do not count as live); VMM_ENOTSUP (backup on a driver without host copies);
 * VMM_EHOSTMEM (no host memory for the backup); VMM_EDRIVER (a copy failed, a wait failed, or a
 * kept backup buffer too small could not be freed): in all of these
 * nothing changed. VMM_EDRIVER after the tags went to sleep when the driver refused to unmap some
 * page: it stays resident (reported in the message) and is reused by the wake.
 */
VMM_API int vmm_sleep(vmm_allocator *a, const char *const *tags, size_t n_tags, int mode);

/*
 * Wake tags[0..n_tags-1] (NULL / 0: every sleeping tag): map pages back at the same addresses
 * (cached handles and idle free pages of other tags are used first), grant access to the device and
 * its peers, restore backed-up contents, tell the after_map callback. Staged wakes (weights first,
 * the KV cache later) are separate calls. When the device cannot hold them everything is undone:
 * nothing stays mapped, the tags stay asleep with their backups, and VMM_ENOMEM says how much was
 * missing; a later wake, once memory is free, succeeds.
 * Returns VMM_OK, VMM_EINVAL (unknown tag), VMM_ENOMEM, VMM_EDRIVER (undone likewise; except when
 * the restore copies could not be waited for: then the pages mapped for them stay mapped, since
 * unmapping memory with copies queued on it would fault, and the next wake reuses them; the tags
 * stay asleep either way), VMM_EHOSTMEM.
 */
VMM_API int vmm_wake(vmm_allocator *a, const char *const *tags, size_t n_tags);

/* 1 when `tag` sleeps, 0 when awake, VMM_EINVAL for an unknown tag. */
VMM_API int vmm_is_asleep(vmm_allocator *a, const char *tag);

/* ---- Callbacks (src/core/callbacks.c) ----------------------------------------------------------------
 *
 * Free-memory callbacks are PyTorch's FreeMemoryCallback (trigger_free_memory_callbacks): when an
 * allocation finds no cached block, the allocator runs them, with its lock released, before growing
 * or releasing cached memory, and looks in the cache again if one reports it freed something. That
 * is how memory held for other parties comes back on demand (the IPC limbo below registers one).
 * Counted in num_free_memory_callbacks / num_free_memory_callback_hits.
 *
 * Mapping callbacks let a communication library follow the physical mappings of expandable memory
 * (NCCL buffer registration, NVLS / symmetric memory, UCX): after_map is called after pages are
 * mapped and access is granted, before_unmap before they are unmapped (while the handles still
 * name them: PyTorch's SEGMENT_UNMAP trace comes after the unmap). Each call gives a run of pages
 * [va, va + size), the device, and handles[i] the physical handle (CUmemGenericAllocationHandle)
 * mapped at va + i * size / n_handles. Callbacks run on the thread of the call that mapped or
 * unmapped, before that call returns (or, when another thread is delivering notices at that moment,
 * by that thread right after), with no allocator lock held (one internal mutex keeps them in
 * order), so they may call the allocator, and a lock they take may be held by a thread waiting in
 * the allocator. Pages about to be unmapped wait, out of use, until before_unmap returned; sleep and
 * wake wait for their notices, so do not call them holding a lock the callbacks take. Classic
 * (cuMemAlloc) segments and blocks opened with vmm_ipc_open are not reported.
 */
typedef int (*vmm_free_memory_fn)(void *ctx);
typedef void (*vmm_mapping_fn)(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *handles,
                               size_t n_handles);

/* Register / remove a free-memory callback (fn, ctx). fn returns nonzero when it freed memory; it
 * may call the allocator (vmm_free, ...). Removal waits for a run in progress on another thread.
 * Returns VMM_OK, VMM_EINVAL (NULL fn, unknown pair on removal), VMM_EHOSTMEM. */
VMM_API int vmm_add_free_memory_callback(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx);
VMM_API int vmm_remove_free_memory_callback(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx);

/* Set the mapping callbacks (either may be NULL); after_map is called at once for every run mapped
 * now, so a late user learns the present state. All NULL removes them (notices still queued are
 * delivered first). Setting them while others are set is VMM_EINVAL: remove first.
 * Returns VMM_OK, VMM_EINVAL, VMM_EHOSTMEM. */
VMM_API int vmm_set_mapping_callbacks(vmm_allocator *a, vmm_mapping_fn after_map, vmm_mapping_fn before_unmap,
                                      void *ctx);

/* Call fn for every run of mapped pages of the expandable segments now (a copy taken under the
 * lock, fn called without it), in address order. Returns VMM_OK, VMM_EINVAL, VMM_EHOSTMEM. */
VMM_API int vmm_get_mappings(vmm_allocator *a, vmm_mapping_fn fn, void *ctx);

/* ---- Sharing blocks across processes (src/api/ipc_api.c) ----------------------------------------
 *
 * A live block of an expandable segment can be opened by another process at a new address, with
 * the same memory (no copy): the exporter makes a handle (its pages' shareable POSIX file
 * descriptors, their size, the block's offset and size, the device, and a reference counter shared
 * in memory), sends it over a UNIX socket (vmm_ipc_send, SCM_RIGHTS) or its own way
 * (vmm_ipc_handle_desc: bytes plus descriptors), and the other side opens it with its allocator of
 * the same device. Pages must be created exportable: the ipc config key (default auto: wherever
 * the device supports POSIX file descriptor handles; the simulated device does in backed mode).
 *
 * Keep-alive (PyTorch's CudaIPCSentData / CudaIPCSentDataLimbo rules): each vmm_ipc_get_handle
 * counts one reference on the block; vmm_ipc_close (or vmm_ipc_handle_release of a handle never
 * opened) gives it back. vmm_free of a block with references outstanding parks it: still allocated
 * (counted in allocated bytes and ipc_limbo_blocks) until the count is zero, then it is freed by the
 * allocator's free-memory callback (on a cache miss) or vmm_ipc_collect. Ordering of work is the
 * users': the exporter's writes must have completed before the other side uses the memory. A
 * consumer that dies without closing keeps its block in limbo for the exporter's life (as in
 * PyTorch).
 */
typedef struct vmm_ipc_handle vmm_ipc_handle;

enum { VMM_IPC_MAGIC = 0x766d6d69 /* "vmmi" */, VMM_IPC_VERSION = 1 };

/* The bytes of a handle; its descriptors travel beside it: n_pages page descriptors, then the
 * reference counter's. */
typedef struct vmm_ipc_desc {
    uint32_t magic;          /* VMM_IPC_MAGIC */
    uint32_t version;        /* VMM_IPC_VERSION */
    int32_t device;          /* exporter's device ordinal */
    int32_t pid;             /* exporter's process id */
    uint64_t export_id;      /* identifies the exported block in the exporter */
    uint64_t size;           /* bytes of the block */
    uint64_t offset;         /* block start - first page start */
    uint64_t page_size;      /* bytes per page */
    uint64_t n_pages;        /* pages the block spans */
} vmm_ipc_desc;

/* Export the live block at ptr (its first byte). *out owns new descriptors. Returns VMM_OK,
 * VMM_EBADPTR, VMM_EINVAL (the block sleeps), VMM_ENOTSUP (a classic segment, or pages not
 * exportable: see the ipc key), VMM_EDRIVER, VMM_EHOSTMEM. */
VMM_API int vmm_ipc_get_handle(vmm_allocator *a, const void *ptr, vmm_ipc_handle **out);

/* The handle's bytes and descriptors (owned by the handle). Returns VMM_OK or VMM_EINVAL. */
VMM_API int vmm_ipc_handle_desc(const vmm_ipc_handle *h, vmm_ipc_desc *desc, const int **fds,
                                size_t *n_fds);

/* A handle from bytes and descriptors received some other way; takes ownership of the fds on
 * success. Returns VMM_OK, VMM_EINVAL (not a vmmalloc handle, wrong count), VMM_EHOSTMEM. */
VMM_API int vmm_ipc_handle_from(const vmm_ipc_desc *desc, const int *fds, size_t n_fds,
                                vmm_ipc_handle **out);

/* Close this process's descriptors and free the handle (its reference travels with a copy sent
 * elsewhere). NULL is a no-op. */
VMM_API void vmm_ipc_handle_free(vmm_ipc_handle *h);

/* Give the handle's reference back without opening it (a handle that will never be opened), then
 * free it. Returns VMM_OK, VMM_EINVAL (opened already: close the mapping instead). */
VMM_API int vmm_ipc_handle_release(vmm_ipc_handle *h);

/* Send / receive a handle over a connected AF_UNIX socket (one message, SCM_RIGHTS for the
 * descriptors). Returns VMM_OK, VMM_EINVAL (not a handle, a malformed message), VMM_EHOSTMEM,
 * VMM_EDRIVER (the socket call failed: errno in the message). */
VMM_API int vmm_ipc_send(int sock, const vmm_ipc_handle *h);
VMM_API int vmm_ipc_recv(int sock, vmm_ipc_handle **out);

/* Map the block of handle h at a new address of this process: *ptr its first byte. The handle's
 * reference is taken over by the mapping (a second open of the same handle counts one more).
 * Returns VMM_OK, VMM_EINVAL (another device, a malformed handle), VMM_ENOTSUP (no import on this
 * driver), VMM_EDRIVER, VMM_EHOSTMEM; on failure nothing is mapped. */
VMM_API int vmm_ipc_open(vmm_allocator *a, vmm_ipc_handle *h, void **ptr);

/* Unmap a block opened with vmm_ipc_open and give its reference back. Returns VMM_OK, VMM_EBADPTR. */
VMM_API int vmm_ipc_close(vmm_allocator *a, void *ptr);

/* Free the blocks in limbo whose references all came back (as torch.cuda.ipc_collect). Returns how
 * many were freed, or a negative status. */
VMM_API int vmm_ipc_collect(vmm_allocator *a);

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_H */
