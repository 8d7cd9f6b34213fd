/*
 * Internals of the CUDA driver double (libcuda.so.1 for tests): shared state and helpers.
 *
 * Layout: cudadouble.c (init, devices, error names, hooks), cd_tables.c (small containers),
 * cd_context.c (primary contexts, the per-thread context stack), cd_memory.c (virtual memory
 * management: reservations, handles, mappings, access, sharing), cd_linear.c (cuMemAlloc and
 * page-locked host memory), cd_stream.c (streams, events, stream-ordered work), cd_capture.c (stream
 * capture), cd_proc.c (cuGetProcAddress and the older ABI variants).
 *
 * Every memory, stream and event rule that the simulator (src/driver/drv_sim.c) has is left to it: each
 * CUDA device is one simulated device, and the double adds what CUDA has and the simulator lacks
 * (contexts, several devices, per-device access, reference-counted handles, capture).
 *
 * Locking: one mutex (cd.mu) guards every table here. It is never held across a simulator call that
 * can block (stream / event / device synchronization, stream destruction, mem_free, host_free),
 * because simulator worker threads take it when they run the double's stream-ordered work.
 */
#ifndef CD_INTERNAL_H
#define CD_INTERNAL_H

/* cuda.h then declares every ABI variant under its real symbol name (cuMemAlloc and cuMemAlloc_v2,
 * cuStreamSynchronize and cuStreamSynchronize_ptsz...) without its renaming macros, as for the
 * driver itself; the compiler checks each definition here against its prototype. */
#define __CUDA_API_VERSION_INTERNAL 1

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cudadouble.h"
#include "driver.h"

#define CD_PRINTF(f, a) __attribute__((format(printf, f, a)))

/* ---- tables (cd_tables.c) --------------------------------------------------------------------- */

/* Nonzero uint64 key -> pointer, open addressing. Iterate with keys[i] != 0 over [0, cap). */
typedef struct cd_map {
    uint64_t *keys;
    void **vals;
    size_t cap, count;
} cd_map;

void *cd_map_get(const cd_map *m, uint64_t key);
int cd_map_put(cd_map *m, uint64_t key, void *val); /* 0, or -1 out of host memory (unchanged) */
void *cd_map_del(cd_map *m, uint64_t key);

/* Address ranges [start, start+len) that do not overlap, sorted by start. Every struct kept here
 * starts with a cd_range. */
typedef struct cd_range {
    uintptr_t start;
    size_t len;
} cd_range;

typedef struct cd_ranges {
    cd_range **v;
    size_t n, cap;
} cd_ranges;

cd_range *cd_ranges_find(const cd_ranges *r, uintptr_t addr); /* the range holding addr */
bool cd_ranges_overlap(const cd_ranges *r, uintptr_t addr, size_t len);
int cd_ranges_add(cd_ranges *r, cd_range *x); /* 0, or -1 out of host memory */
void cd_ranges_remove(cd_ranges *r, cd_range *x);

/* A set of graph nodes (the dependencies of the next node captured on a stream) with its parallel
 * edge data, all zero: the double's edges carry no annotation. */
typedef struct cd_nodes {
    CUgraphNode *v;
    CUgraphEdgeData *edges;
    size_t n, cap;
} cd_nodes;

int cd_nodes_add(cd_nodes *s, CUgraphNode n);      /* adds if absent; 0, or -1 out of memory */
int cd_nodes_union(cd_nodes *s, const cd_nodes *o); /* 0, or -1 */
int cd_nodes_copy(cd_nodes *dst, const cd_nodes *src);
void cd_nodes_clear(cd_nodes *s);
void cd_nodes_free(cd_nodes *s);

/* ---- objects ---------------------------------------------------------------------------------- */

struct cd_ctx;
struct cd_capture;

typedef struct cd_stream {
    uint64_t id;             /* 0: the legacy stream of its context */
    struct cd_ctx *ctx;
    void *sim;               /* the simulator's stream; NULL is its default stream (legacy) */
    bool blocking;           /* made without CU_STREAM_NON_BLOCKING: synchronizes with legacy */
    unsigned long pending;   /* the double's queued work on it (ops, waits) not yet done */
    struct cd_capture *cap;  /* capture sequence this stream takes part in, or NULL */
    cd_nodes tail;           /* while capturing: what the next captured node depends on */
    struct cd_stream *next;  /* the context's list of created streams */
} cd_stream;

/* A simulator event, shared by a CUDA event's latest record and by cross-device waits on it. */
typedef struct cd_simev {
    int dev;
    vmm_event ev;
    unsigned refs;
} cd_simev;

typedef struct cd_event {
    uint64_t id;
    struct cd_ctx *ctx;
    unsigned flags;
    cd_simev *sim;   /* the latest record outside capture (or the never-recorded event) */
    uint64_t cap_id; /* nonzero: last recorded in capture sequence cap_id */
    cd_nodes nodes;  /* the recording stream's tail then (valid while that capture lasts) */
} cd_event;

typedef struct cd_ctx {
    int dev;
    unsigned retain;      /* cuDevicePrimaryCtxRetain references: 0 is inactive */
    bool ever_retained;
    CUresult sticky;      /* asynchronous error of the context (CUDA_ERROR_ILLEGAL_ADDRESS) */
    cd_stream legacy;     /* NULL / CU_STREAM_LEGACY (and CU_STREAM_PER_THREAD, see cd_stream.c) */
    cd_stream *streams;   /* streams created in this context, alive */
    unsigned long reclaimed; /* streams, events and allocations freed by resets */
} cd_ctx;

typedef struct cd_device {
    int ordinal;
    vmm_driver *sim;
    const vmm_driver_ops *ops;
    size_t capacity;
    bool vmm, rdma, posix_fd;
    unsigned no_peer; /* bit b: this device cannot access device b's memory */
    char name[64];
    cd_ctx ctx;       /* the primary context; CUcontext is its address */
} cd_device;

/* Graph nodes are opaque markers with their dependencies: enough to tell a joined fork. */
typedef struct cd_node {
    struct cd_node *next; /* all nodes of the graph */
    cd_nodes deps;
    bool mark;
} cd_node;

typedef struct cd_graph {
    uint64_t id;
    cd_node *nodes;
    size_t n_nodes;
    bool capturing; /* still owned by its capture sequence */
} cd_graph;

typedef struct cd_capture {
    uint64_t id; /* unique over the process, from 1 */
    CUstreamCaptureMode mode;
    pthread_t owner;
    cd_stream *origin;
    cd_graph *graph;
    bool invalidated;
    struct cd_capture *next;
} cd_capture;

/* Memory. */
typedef struct cd_handle {
    CUmemGenericAllocationHandle value;
    int dev;
    vmm_phys sim;
    size_t size;
    unsigned refs;  /* create / import / retain references not yet released */
    unsigned maps;  /* live cuMemMap mappings */
    CUmemAllocationProp prop; /* as it reads back (cuMemGetAllocationPropertiesFromHandle) */
    bool have_ino;  /* identity of its memory, to tell which device an exported fd came from */
    dev_t st_dev;
    ino_t st_ino;
} cd_handle;

typedef struct cd_res {
    cd_range r;    /* as reserved on the simulator (size rounded up to the granularity) */
    size_t asked;  /* the size cuMemAddressReserve was given, which cuMemAddressFree must repeat */
    int dev;
    unsigned maps;
} cd_res;

typedef struct cd_mapping {
    uintptr_t va;
    size_t size;
    cd_handle *h;
    cd_res *res;
    uint16_t *access; /* per granule: bit 2d read, bit 2d+1 write, for device d */
} cd_mapping;

typedef struct cd_linear {
    cd_range r;
    int dev;
    cd_ctx *ctx;
} cd_linear;

typedef struct cd_host {
    cd_range r;
    int dev;        /* whose simulator holds it */
    unsigned flags; /* CU_MEMHOSTALLOC_* */
} cd_host;

/* ---- global state (cudadouble.c) -------------------------------------------------------------- */

typedef struct cd_state {
    pthread_mutex_t mu;
    atomic_int initialized;
    int ndev;
    int driver_version;
    bool getproc_errors;   /* CUDADOUBLE_GETPROC_ERRORS: lookups that find nothing fail */
    size_t gran;
    unsigned gran_shift;
    cd_device dev[CUDADOUBLE_MAX_DEVICES];
    uint64_t next_id;      /* streams, events, graphs */
    uint64_t next_handle;
    uint64_t next_capture;
    cd_map streams, events, graphs, handles;
    cd_map pages;          /* va >> gran_shift -> cd_mapping */
    cd_ranges res, linear, host;
    cd_capture *captures;  /* sequences not ended yet */
    unsigned long n_mappings;
} cd_state;

extern cd_state cd;

void cd_lock(void);
void cd_unlock(void);

/* "cudadouble: <call>: <what>" on stderr, then abort: what cuda.h leaves undefined. */
_Noreturn void cd_undefined(const char *call, const char *fmt, ...) CD_PRINTF(2, 3);
/* "cudadouble: <call>: double limitation: <what>", then abort: allowed by CUDA, not modelled. */
_Noreturn void cd_limitation(const char *call, const char *fmt, ...) CD_PRINTF(2, 3);

/* NOT_INITIALIZED before a successful cuInit; NOT_PERMITTED inside a cuLaunchHostFunc function. */
CUresult cd_check_init(void);
int cd_driver_version(void); /* CUDADOUBLE_DRIVER_VERSION, readable before cuInit */
extern _Thread_local bool cd_in_callback; /* this thread runs a cuLaunchHostFunc function */
/* Device by ordinal, NULL when out of range. */
cd_device *cd_dev(int ordinal);
/* Device a can access device b's memory (cuDeviceCanAccessPeer, or a == b). */
bool cd_can_access(int a, int b);

/* Encoded handles of streams, events and graphs: (id << 8) | tag, never 0, 1 or 2. */
enum { CD_TAG_STREAM = 0x5d, CD_TAG_EVENT = 0xe7, CD_TAG_GRAPH = 0x6a };
uint64_t cd_encode(uint64_t id, unsigned tag);
/* The object a handle names (lock held); aborts naming `call` when it is destroyed or unknown. */
void *cd_decode(const char *call, const void *handle, unsigned tag, const cd_map *m, const char *what);

/* ---- calls (cudadouble.c) --------------------------------------------------------------------- */

#define CD_ENTRY_POINTS(X)                                                                   \
    X(cuGetProcAddress) X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) \
    X(cuDeviceGet) X(cuDeviceGetCount) X(cuDeviceGetAttribute) X(cuDeviceGetName)            \
    X(cuDeviceTotalMem) X(cuDeviceCanAccessPeer) X(cuMemGetAllocationGranularity)            \
    X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease) X(cuCtxGetCurrent)              \
    X(cuCtxSetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuCtxGetDevice)              \
    X(cuCtxSynchronize) X(cuMemGetInfo) X(cuMemAddressReserve) X(cuMemAddressFree)           \
    X(cuMemCreate) X(cuMemRelease) X(cuMemMap) X(cuMemUnmap) X(cuMemSetAccess)               \
    X(cuMemGetAccess) X(cuMemRetainAllocationHandle) X(cuMemGetAllocationPropertiesFromHandle) \
    X(cuMemExportToShareableHandle) X(cuMemImportFromShareableHandle) X(cuMemAlloc)          \
    X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuStreamCreate) X(cuStreamDestroy)     \
    X(cuStreamSynchronize) X(cuStreamQuery) X(cuStreamWaitEvent) X(cuStreamGetCtx)           \
    X(cuStreamBeginCapture) X(cuStreamEndCapture) X(cuStreamIsCapturing)                     \
    X(cuStreamGetCaptureInfo) X(cuThreadExchangeStreamCaptureMode) X(cuGraphDestroy)         \
    X(cuEventCreate) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventDestroy) \
    X(cuLaunchHostFunc) X(cuMemsetD32Async) X(cuMemsetD8Async) X(cuMemcpyDtoHAsync)          \
    X(cuMemcpyHtoDAsync)

enum cd_entry {
#define CD_ENTRY_ENUM_(n) CD_E_##n,
    CD_ENTRY_POINTS(CD_ENTRY_ENUM_)
#undef CD_ENTRY_ENUM_
    CD_E_COUNT
};

extern atomic_ulong cd_calls[CD_E_COUNT];
#define CD_CALL(n) atomic_fetch_add_explicit(&cd_calls[CD_E_##n], 1, memory_order_relaxed)

/* ---- contexts (cd_context.c) ------------------------------------------------------------------ */

cd_ctx *cd_current(void);                 /* the calling thread's context, or NULL */
cd_ctx *cd_ctx_of(CUcontext h);           /* our context of that handle, or NULL */
CUresult cd_ctx_usable(const cd_ctx *c);  /* INVALID_CONTEXT, the sticky error, or SUCCESS */
/* The calling thread's context, usable (lock held). */
CUresult cd_enter(cd_ctx **out);
cd_device *cd_ctx_dev(const cd_ctx *c);
/* Record an asynchronous error on c (lock held); it stays for the life of the process. */
void cd_ctx_fail(cd_ctx *c, CUresult r, const char *fmt, ...) CD_PRINTF(3, 4);
CUcontext cd_hook_current_context(void);
CUcontext cd_hook_primary_context(int dev, unsigned *retain_count);
unsigned cd_retained_total(void);

/* ---- memory (cd_memory.c, cd_linear.c) -------------------------------------------------------- */

/* Device dev may read (write: write) every byte of [p, p+n) (lock held). */
bool cd_dev_can_touch(int dev, uintptr_t p, size_t n, bool write);
/* [p, p+n) is device memory or page-locked host memory the double knows, wholly: mapped pages, one
 * cuMemAlloc allocation, or one cuMemHostAlloc allocation (lock held). */
bool cd_known_memory(uintptr_t p, size_t n);
/* Some byte of [p, p+n) is device address space (a reservation or a cuMemAlloc block). */
bool cd_device_space(uintptr_t p, size_t n);
cd_linear *cd_linear_at(uintptr_t p, size_t n);
cd_host *cd_host_at(uintptr_t p, size_t n);
/* The primary context of ctx dev is being reset (lock held): its cuMemAlloc blocks go; they are
 * moved to *out (an array the caller frees) for mem_free outside the lock. */
size_t cd_linear_take_ctx(cd_ctx *c, cd_linear ***out);
CUresult cd_hook_device_access(int dev, CUdeviceptr p, size_t n, void *buf, int write);

/* ---- streams and events (cd_stream.c) --------------------------------------------------------- */

/* The stream a handle names (lock held): NULL and CU_STREAM_LEGACY are the current context's
 * legacy stream, CU_STREAM_PER_THREAD (and NULL when ptsz) its per-thread stream. The stream's
 * context must be usable. *per_thread tells a per-thread handle (may be NULL). */
CUresult cd_stream_get(const char *call, CUstream h, bool ptsz, cd_stream **out, bool *per_thread);
cd_event *cd_event_get(const char *call, CUevent h);
/* Drop a reference to a simulator event (lock held), destroying it at the last. */
void cd_simev_unref(cd_simev *e);
/* Destroy a stream's simulator side; may block, so no lock. */
void cd_stream_sim_destroy(cd_device *d, void *sim);

/* ---- capture (cd_capture.c) ------------------------------------------------------------------- */

/* A "potentially unsafe API call" (cuThreadExchangeStreamCaptureMode) made now: STREAM_CAPTURE_
 * UNSUPPORTED, invalidating the captures that forbid it, or SUCCESS (lock held). */
CUresult cd_capture_unsafe(void);
/* Some stream of c not created NON_BLOCKING is capturing (the legacy stream is unusable then). */
bool cd_ctx_blocking_capture(const cd_ctx *c);
/* Invalidate every capture of c's streams (blocking ones only if blocking_only). */
void cd_capture_invalidate_ctx(const cd_ctx *c, bool blocking_only);
void cd_capture_invalidate(cd_capture *c);
cd_capture *cd_capture_find(uint64_t id);
/* Before stream-ordered work on s (lock held): STREAM_CAPTURE_* errors for work the capture rules
 * refuse; *capturing when s is capturing (the work is to become part of the graph, not run). */
CUresult cd_capture_check(cd_stream *s, bool per_thread, bool *capturing);
/* A node for work captured on s, after its current dependencies (lock held). */
CUresult cd_capture_node(cd_stream *s);
unsigned cd_graphs_live(void); /* lock held */

/* ---- entry-point lookup (cd_proc.c) ----------------------------------------------------------- */

CUresult cd_get_proc(const char *symbol, void **pfn, int version, cuuint64_t flags,
                     CUdriverProcAddressQueryResult *status);

#endif /* CD_INTERNAL_H */
