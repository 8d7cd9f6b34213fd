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
 * Returns VMM_OK or VMM_EBADPTR (never returned, interior pointer, double free).
 */
VMM_API int vmm_free(vmm_allocator *a, void *ptr);

/* Mark the block at ptr as used by `stream` (besides its allocation stream), so a later free waits
 * for work queued on `stream` up to that free. Returns VMM_OK or VMM_EBADPTR. */
VMM_API int vmm_record_stream(vmm_allocator *a, void *ptr, vmm_stream stream);

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
    int64_t num_event_waits;                      /* blocking waits on a guarding event */
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

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_H */
