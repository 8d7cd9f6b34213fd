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
    uint64_t creates_in_flight;         /* mem_create calls begun and not returned (sim_real_time_create
                                         * makes them last; tests see the allocator lock is not held) */
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

/*
 * Call hook, for tests of what the allocator holds while it calls the driver: fn(arg, kind) runs
 * on the calling thread at the start of every call of that kind (-1: every kind), before the call
 * does anything, with no lock of the simulated device held, so it may wait for other threads
 * that allocate meanwhile. fn NULL removes the hook. One hook per device; set it while no other
 * thread uses the allocator. Returns VMM_OK, VMM_EINVAL (kind out of range), VMM_ENOTSUP (not
 * the sim).
 */
typedef void (*vmm_sim_call_hook)(void *arg, int kind);
VMM_API int vmm_sim_on_call(vmm_allocator *a, int kind, vmm_sim_call_hook fn, void *arg);

/* ---- CUDA graph capture on the simulated device ------------------------------------------------
 *
 * Enough of CUDA's stream capture to test what an allocator must do while a graph is captured and
 * replayed. While stream s captures, work queued on it (vmm_sim_launch, vmm_sim_memset32, and the
 * work of streams that joined through vmm_sim_stream_wait_stream) is recorded instead of run; the
 * capture's end gives a graph; each vmm_sim_graph_launch queues the recorded work again, in the
 * recorded order, on a stream. The rules of CUDA's capture modes are enforced (src/driver/driver.h,
 * "Capture"): an unsafe driver call (allocation, mapping, event query or synchronization) made by a
 * thread whose mode forbids it fails with CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and invalidates the
 * capture; so do synchronizing the capturing stream or the device; events recorded in a capture
 * cannot be queried. vmm_sim_capture_end then reports the invalidation. Thread safety: as above.
 */

/* Capture modes (CUstreamCaptureMode's values). */
enum { VMM_SIM_CAPTURE_GLOBAL = 0, VMM_SIM_CAPTURE_THREAD_LOCAL = 1, VMM_SIM_CAPTURE_RELAXED = 2 };

/* Work recorded by a capture; owned by the caller, freed with vmm_sim_graph_destroy. */
typedef struct vmm_sim_graph vmm_sim_graph;

/* Stream s (made by vmm_sim_stream_create; the default stream cannot capture) begins capturing in
 * `mode` (VMM_SIM_CAPTURE_*). Returns VMM_OK, VMM_EINVAL (s captures already, bad mode, NULL a),
 * VMM_EDRIVER (the default stream, an unknown stream: the message names the driver result),
 * VMM_ENOTSUP. */
VMM_API int vmm_sim_capture_begin(vmm_allocator *a, vmm_stream s, int mode);

/* End the capture begun on s: *graph gets the recorded work (caller owns it). Returns VMM_OK;
 * VMM_EDRIVER with *graph NULL when the capture was invalidated (the message says
 * CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: some rule was broken while it went on), when s does not
 * capture or began no capture, or when another thread ends a capture not begun relaxed;
 * VMM_EINVAL, VMM_ENOTSUP. */
VMM_API int vmm_sim_capture_end(vmm_allocator *a, vmm_stream s, vmm_sim_graph **graph);

/* Replay: queue the graph's recorded work on stream s (not capturing), in order. Does not wait.
 * VMM_EDRIVER (CUDA_ERROR_INVALID_VALUE) when memory the graph touches is no longer mapped: the
 * replay would fault. */
VMM_API int vmm_sim_graph_launch(vmm_allocator *a, vmm_sim_graph *g, vmm_stream s);

/* Free a graph (NULL is a no-op). Needs no allocator: valid after vmm_destroy. */
VMM_API void vmm_sim_graph_destroy(vmm_sim_graph *g);

/* Work items recorded in g (0 for NULL). */
VMM_API size_t vmm_sim_graph_nodes(const vmm_sim_graph *g);

/* Set the calling thread's capture mode to *mode and return the previous one in *mode
 * (cuThreadExchangeStreamCaptureMode). VMM_EINVAL for a mode out of range. */
VMM_API int vmm_sim_capture_mode_exchange(vmm_allocator *a, int *mode);

/* Stream-ordered fill of n 32-bit words at p with value (cuMemsetD32Async): a "kernel" that writes
 * device memory, recorded when s captures. p must be mapped (VMM_EDRIVER otherwise). */
VMM_API int vmm_sim_memset32(vmm_allocator *a, void *p, uint32_t value, size_t n, vmm_stream s);

/* Later work on s waits for the work queued on `on` so far (an event recorded on `on`, waited on by
 * s). While `on` captures this forks s into its capture (s's later work is recorded too, until the
 * capture ends); waiting back on s from the capturing stream joins it. */
VMM_API int vmm_sim_stream_wait_stream(vmm_allocator *a, vmm_stream s, vmm_stream on);

/* Whether stream s takes part in a capture now (*capturing 1 or 0) and the capture's id (nonzero,
 * unique in the process; 0 when not capturing). */
VMM_API int vmm_sim_stream_capture_info(vmm_allocator *a, vmm_stream s, int *capturing, uint64_t *id);

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_SIM_H */
