/*
 * vmmalloc simulated device: what tests, stress and benchmarks use instead of a GPU.
 *
 * An allocator created with "driver:sim" owns one private simulated device. Its streams are FIFO
 * queues with one worker thread each; a launch runs a host function on the worker, in stream order,
 * standing in for a kernel. Events complete when their stream reaches them.
 *
 * Every function here returns VMM_ENOTSUP when `a` does not run on the simulated driver.
 * Thread safety: as for vmmalloc.h, any thread, concurrently.
 */
#ifndef VMMALLOC_SIM_H
#define VMMALLOC_SIM_H

#include "vmmalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Driver call kinds, as counted, costed and fault-injected by the simulator. The names are the
 * ones in "sim.calls.<kind>" stats keys and in the sim_fault config key. */
#define VMM_SIM_CALL_MAP(X)                                                                \
    X(DEVICE_INFO, "device_info")                                                          \
    X(MEM_GET_INFO, "mem_get_info")                                                        \
    X(VA_RESERVE, "va_reserve")                                                            \
    X(VA_FREE, "va_free")                                                              \
    X(MEM_CREATE, "mem_create")                                                            \
    X(MEM_RELEASE, "mem_release")                                                          \
    X(MEM_MAP, "mem_map")                                                                  \
    X(MEM_UNMAP, "mem_unmap")                                                              \
    X(SET_ACCESS, "set_access")                                                            \
    X(MEM_ALLOC, "mem_alloc")                                                              \
    X(MEM_FREE, "mem_free")                                                                \
    X(STREAM_CREATE, "stream_create")                                                      \
    X(STREAM_DESTROY, "stream_destroy")                                                    \
    X(STREAM_SYNC, "stream_sync")                                                          \
    X(DEVICE_SYNC, "device_sync")                                                          \
    X(EVENT_CREATE, "event_create")                                                        \
    X(EVENT_RECORD, "event_record")                                                        \
    X(EVENT_QUERY, "event_query")                                                          \
    X(EVENT_SYNC, "event_sync")                                                            \
    X(EVENT_DESTROY, "event_destroy")                                                      \
    X(STREAM_WAIT_EVENT, "stream_wait_event")                                              \
    X(LAUNCH_HOST, "launch_host")                                                          \
    X(MEMSET, "memset")                                                                    \
    X(MEMCPY, "memcpy")                                                                    \
    X(HOST_ALLOC, "host_alloc")                                                            \
    X(HOST_FREE, "host_free")

typedef enum vmm_sim_call {
#define VMM_SIM_CALL_ENUM_(name, str) VMM_SIM_CALL_##name,
    VMM_SIM_CALL_MAP(VMM_SIM_CALL_ENUM_)
#undef VMM_SIM_CALL_ENUM_
    VMM_SIM_CALL_COUNT
} vmm_sim_call;

/* Name of a call kind ("mem_map"), or NULL when out of range. */
VMM_API const char *vmm_sim_call_name(int kind);

/* Create a stream on the simulated device (a FIFO queue with its own worker thread). The stream
 * lives until vmm_sim_stream_destroy or vmm_destroy. Returns VMM_OK, VMM_ENOTSUP, VMM_EDRIVER. */
VMM_API int vmm_sim_stream_create(vmm_allocator *a, vmm_stream *out);

/* Destroy a stream made by vmm_sim_stream_create once its queued work has run. Blocks freed on it
 * must have been freed first. Returns VMM_OK, VMM_EINVAL, VMM_ENOTSUP. */
VMM_API int vmm_sim_stream_destroy(vmm_allocator *a, vmm_stream s);

/* Queue fn(arg) on stream s (NULL: default stream); it runs on that stream's worker after all work
 * queued before it, like a kernel. Does not wait. Returns VMM_OK, VMM_ENOTSUP, VMM_EDRIVER. */
VMM_API int vmm_sim_launch(vmm_allocator *a, vmm_stream s, void (*fn)(void *), void *arg);

/* Wait until every stream of the device has run all queued work (counted as a device sync). */
VMM_API int vmm_sim_synchronize(vmm_allocator *a);

/* Counters of the simulated device. */
typedef struct vmm_sim_counters {
    uint64_t calls[VMM_SIM_CALL_COUNT]; /* calls made, by kind, failed ones included */
    uint64_t failures[VMM_SIM_CALL_COUNT]; /* calls that returned an error, by kind */
    uint64_t device_syncs;              /* device-wide synchronizations (explicit or implied by mem_free) */
    uint64_t stream_syncs;              /* stream synchronizations */
    uint64_t event_syncs;               /* blocking event waits */
    uint64_t driver_time_ns;            /* modeled cost of all calls (see sim_cost_* keys) */
    uint64_t capacity_bytes;            /* device memory */
    uint64_t phys_bytes;                /* bytes in live physical handles and classic allocations */
    uint64_t live_handles;              /* physical handles created and not released */
    uint64_t mapped_bytes;              /* bytes of VA currently mapped */
    uint64_t reserved_va_bytes;         /* bytes of VA currently reserved */
    uint64_t live_classic_allocs;       /* mem_alloc blocks not freed */
    uint64_t live_streams;              /* streams created and not destroyed (default stream excluded) */
    uint64_t live_events;               /* events created and not destroyed */
    uint64_t host_bytes;                /* pinned host memory held (host_alloc, page rounded) */
    uint64_t live_host_allocs;          /* host_alloc blocks not freed */
} vmm_sim_counters;

/* Snapshot of the allocator's simulated device counters. */
VMM_API int vmm_sim_get_counters(vmm_allocator *a, vmm_sim_counters *out);

/* Sum of the live-resource counters (phys_bytes, live_handles, mapped_bytes, reserved_va_bytes,
 * live_classic_allocs, live_streams, live_events, host_bytes, live_host_allocs) over every
 * simulated device in the process, including destroyed ones: all zero once every allocator is
 * destroyed means nothing leaked. Always available (no allocator needed). */
VMM_API void vmm_sim_global_live(vmm_sim_counters *out);

/*
 * Fault injection. kind: a VMM_SIM_CALL_* value, or -1 for every kind.
 *  vmm_sim_fail_nth: the nth call (1-based, counted from now) of that kind fails once.
 *  vmm_sim_fail_random: each call of that kind fails with probability p (0 disables), drawn from a
 *  generator seeded with `seed` (deterministic per device).
 * Injected failures return the error kind the real driver would (out of memory for mem_create /
 * mem_alloc, an unknown/launch error otherwise) and change no state.
 */
VMM_API int vmm_sim_fail_nth(vmm_allocator *a, int kind, uint64_t nth);
VMM_API int vmm_sim_fail_random(vmm_allocator *a, int kind, double p, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_SIM_H */
