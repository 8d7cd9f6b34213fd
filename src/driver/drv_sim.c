/*
 * The simulated GPU: the driver contract of driver.h, in host memory.
 *
 * Memory. VA reservations are real PROT_NONE, MAP_NORESERVE mappings, so a stray pointer into
 * reserved-but-unmapped device memory faults like on a GPU. In backed mode every physical handle is
 * a memfd of its size; mem_map only records the mapping (as on CUDA, a new mapping has no access),
 * set_access maps the memfd MAP_SHARED|MAP_FIXED read-write over the range, mem_unmap puts PROT_NONE
 * back. Several mappings of one handle therefore share contents, and contents move with the handle.
 * In unbacked mode only the bookkeeping runs: an 80 GiB device fits on a small host.
 *
 * Bookkeeping. Mappings are found through a hash of page numbers (va / granularity -> mapping):
 * every rule of map / unmap / set_access / lookup is a walk over the pages of the range. Handles,
 * classic allocations and events live in the same kind of hash; reservations in a sorted array.
 *
 * Streams. Each stream is a FIFO of work items run by one worker thread. Every item gets a
 * device-wide sequence number at enqueue; a sync waits until no stream's oldest pending item is older
 * than the sequence number seen at the call. event_record puts a marker in the queue; the event
 * points to its latest marker, waits hold a reference to the marker they wait for, so re-recording or
 * destroying an event never disturbs a wait already queued.
 *
 * Capture. A stream may capture (vmm_sim_driver_capture_begin): work queued on it, and on streams
 * that joined by waiting on one of its captured events, is kept in the capture's list instead of
 * running; the list becomes a graph at the end, and a launch queues copies of its items on a stream,
 * once per replay. The rules of driver.h ("Capture") are enforced: unsafe calls against the thread's
 * mode (capture_gate), synchronizing what a capture holds (capture_sync_gate, stream_sync of a
 * capturing stream), captured events queried or waited on across the capture boundary. Captures
 * are per device; the thread's mode is per thread for every device, as in CUDA.
 *
 * Locks. `mu` guards memory state, call counters and fault injection; `qmu` guards streams, queues,
 * markers, events and captures. Neither is held while a host function, memset or memcpy runs, and waits on
 * `done_cv` release `qmu`. No path holds both locks at once, so there is no lock order to keep.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "base/errors.h"
#include "driver/driver.h"

enum {
    SIM_CLASSIC_ALIGN = 512, /* mem_alloc pointer alignment (contract: sim 512) */
};

/* ---- process-wide live counters ---------------------------------------------------------------- */

enum sim_live {
    LIVE_PHYS_BYTES,
    LIVE_HANDLES,
    LIVE_MAPPED_BYTES,
    LIVE_RESERVED_BYTES,
    LIVE_CLASSIC,
    LIVE_STREAMS,
    LIVE_EVENTS,
    LIVE_HOST_BYTES,
    LIVE_HOST_ALLOCS,
    LIVE_COUNT
};

/* g_live: what open devices hold now. g_leaked: what devices still held when they were closed
 * (freed by close all the same); kept so that a leak stays visible after teardown. */
static _Atomic uint64_t g_live[LIVE_COUNT];
static _Atomic uint64_t g_leaked[LIVE_COUNT];

static void live_fill(vmm_sim_counters *out, const uint64_t v[LIVE_COUNT])
{
    out->phys_bytes = v[LIVE_PHYS_BYTES];
    out->live_handles = v[LIVE_HANDLES];
    out->mapped_bytes = v[LIVE_MAPPED_BYTES];
    out->reserved_va_bytes = v[LIVE_RESERVED_BYTES];
    out->live_classic_allocs = v[LIVE_CLASSIC];
    out->live_streams = v[LIVE_STREAMS];
    out->live_events = v[LIVE_EVENTS];
    out->host_bytes = v[LIVE_HOST_BYTES];
    out->live_host_allocs = v[LIVE_HOST_ALLOCS];
}

VMM_API void vmm_sim_global_live(vmm_sim_counters *out)
{
    uint64_t v[LIVE_COUNT];
    memset(out, 0, sizeof *out);
    for (int i = 0; i < LIVE_COUNT; i++)
        v[i] = atomic_load(&g_live[i]) + atomic_load(&g_leaked[i]);
    live_fill(out, v);
}

/* ---- a small hash map: nonzero uint64 key -> pointer (linear probing, backward-shift delete) ---- */

typedef struct hmap {
    uint64_t *keys; /* 0 = empty slot */
    void **vals;
    size_t cap;     /* power of two, or 0 */
    size_t count;
} hmap;

enum { HMAP_MIN_CAP = 16 }; /* load factor kept at most 1/2, so probes stay short */

static size_t hmap_slot(const hmap *h, uint64_t key)
{
    /* Fibonacci hashing: page numbers and pointers are sequential, the multiply spreads them. */
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 17) & (h->cap - 1);
}

static void hmap_put(hmap *h, uint64_t key, void *val)
{
    size_t i = hmap_slot(h, key);
    while (h->keys[i] != 0 && h->keys[i] != key)
        i = (i + 1) & (h->cap - 1);
    if (h->keys[i] == 0)
        h->count++;
    h->keys[i] = key;
    h->vals[i] = val;
}

/* Make room for `extra` more keys. 0, or -1 when out of host memory (map unchanged). */
static int hmap_reserve(hmap *h, size_t extra)
{
    size_t need = h->count + extra, cap = h->cap ? h->cap : HMAP_MIN_CAP;
    if (need < h->count)
        return -1;
    while (cap / 2 < need) {
        if (cap > SIZE_MAX / 4)
            return -1;
        cap *= 2;
    }
    if (cap == h->cap)
        return 0;
    hmap n = {calloc(cap, sizeof(uint64_t)), calloc(cap, sizeof(void *)), cap, 0};
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -1;
    }
    for (size_t i = 0; i < h->cap; i++)
        if (h->keys[i])
            hmap_put(&n, h->keys[i], h->vals[i]);
    free(h->keys);
    free(h->vals);
    *h = n;
    return 0;
}

static void *hmap_get(const hmap *h, uint64_t key)
{
    if (!h->cap || key == 0)
        return NULL;
    for (size_t i = hmap_slot(h, key); h->keys[i] != 0; i = (i + 1) & (h->cap - 1))
        if (h->keys[i] == key)
            return h->vals[i];
    return NULL;
}

static void *hmap_del(hmap *h, uint64_t key)
{
    if (!h->cap || key == 0)
        return NULL;
    size_t i = hmap_slot(h, key), mask = h->cap - 1;
    while (h->keys[i] != key) {
        if (h->keys[i] == 0)
            return NULL;
        i = (i + 1) & mask;
    }
    void *val = h->vals[i];
    /* Backward shift: pull later entries of the probe run into the hole when their home slot
     * allows it, so lookups never need tombstones. */
    for (size_t j = (i + 1) & mask; h->keys[j] != 0; j = (j + 1) & mask) {
        size_t home = hmap_slot(h, h->keys[j]);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            h->keys[i] = h->keys[j];
            h->vals[i] = h->vals[j];
            i = j;
        }
    }
    h->keys[i] = 0;
    h->vals[i] = NULL;
    h->count--;
    return val;
}

static void hmap_free(hmap *h)
{
    free(h->keys);
    free(h->vals);
    memset(h, 0, sizeof *h);
}

/* ---- device state ------------------------------------------------------------------------------ */

typedef struct sim_phys {
    uint64_t id;
    size_t size;
    size_t charged;  /* capacity taken: size, 0 for an import (vmm_sim_driver_import_fd) */
    int fd;          /* memfd in backed mode, else -1 */
    bool released;   /* mem_release was called: the id is dead, memory lives while mapped */
    bool exportable; /* created while pages were exportable (set_exportable): export_fd allowed */
    size_t n_mappings;
} sim_phys;

typedef struct sim_res {
    uintptr_t va;
    size_t size;
    size_t n_mappings;
} sim_res;

typedef struct sim_mapping {
    struct sim_mapping *prev, *next; /* every mapping of the device, for close */
    uintptr_t va;
    size_t size;
    sim_phys *phys;
    sim_res *res;
} sim_mapping;

typedef struct sim_classic {
    uintptr_t ptr;
    size_t size;     /* as asked */
    size_t charged;  /* bytes taken from capacity */
    size_t map_len;  /* bytes of the host mapping */
} sim_classic;

typedef struct sim_host {
    size_t size;     /* as asked */
    size_t map_len;  /* bytes of the host mapping */
} sim_host;

typedef struct sim_marker {
    bool done;
    unsigned refs;
} sim_marker;

typedef struct sim_event {
    sim_marker *latest; /* marker of the latest record, NULL if never recorded */
    uint64_t cap_id;    /* nonzero: last recorded in capture cap_id (a captured event) */
} sim_event;

enum sim_item_kind { ITEM_HOST, ITEM_MEMSET, ITEM_MEMCPY, ITEM_MEMCPY_HTOD, ITEM_MARK, ITEM_WAIT };

typedef struct sim_item {
    struct sim_item *next;
    uint64_t seq;
    enum sim_item_kind kind;
    void (*fn)(void *);
    void *arg;
    uintptr_t va;
    void *dst;
    size_t n;
    uint32_t value;
    bool backed;
    sim_marker *marker;
} sim_item;

typedef struct sim_device sim_device;

typedef struct sim_capture {
    uint64_t id;            /* unique in the process, from 1 */
    int mode;               /* VMM_CAPTURE_MODE_* it was begun in */
    pthread_t owner;
    struct sim_stream *origin;
    bool invalidated;
    sim_item *items, *tail; /* recorded work, in the order it was queued */
    size_t n_items;
    struct sim_capture *next;
} sim_capture;

/* A captured graph: item templates, copied onto a stream at each launch. */
struct vmm_sim_graph {
    sim_item *items;
    size_t n_items;
};

typedef struct sim_stream {
    struct sim_stream *next;
    sim_capture *cap;  /* capture this stream takes part in, or NULL */
    sim_device *dev;
    pthread_t thread;
    pthread_cond_t cv; /* work queued or stop asked */
    sim_item *head, *tail;
    bool stop;
} sim_stream;

struct sim_device {
    vmm_driver base;
    vmm_sim_options opt;
    unsigned gran_shift;

    pthread_mutex_t mu;
    uint64_t calls[VMM_SIM_CALL_COUNT];
    uint64_t failures[VMM_SIM_CALL_COUNT];
    uint64_t device_syncs, stream_syncs, event_syncs, driver_time_ns;
    _Atomic uint64_t live[LIVE_COUNT];
    _Atomic uint64_t creates_in_flight;
    uint64_t nth_left[VMM_SIM_CALL_COUNT]; /* 0: off, else calls until the injected failure */
    uint64_t nth_any;
    double fail_p[VMM_SIM_CALL_COUNT];
    vmm_sim_call_hook hook;            /* vmm_sim_on_call: run at a call's start, mu not held */
    void *hook_arg;
    int hook_kind;                     /* -1: every kind */
    uint64_t rng;

    sim_res **res; /* sorted by va */
    size_t n_res, cap_res;
    hmap pages;    /* va >> gran_shift -> sim_mapping */
    sim_mapping *mappings;
    hmap handles;  /* id -> sim_phys (not released) */
    hmap classic;  /* ptr -> sim_classic */
    hmap host;     /* ptr -> sim_host (pinned host memory) */
    uint64_t next_handle;
    bool exportable; /* handles created now can be exported (set_exportable; backed mode only) */

    pthread_mutex_t qmu;
    pthread_cond_t done_cv; /* some item completed */
    sim_stream *streams;    /* every stream, the default one included */
    sim_stream *default_stream;
    hmap events;            /* pointer -> sim_event */
    uint64_t q_seq;
    sim_capture *captures;  /* captures not ended yet */
    _Atomic int n_captures; /* their number, read without qmu by the gates' fast path */
};

static int capture_gate(sim_device *d);
static int capture_sync_gate(sim_device *d);

static sim_device *dev_of(vmm_driver *drv) { return (sim_device *)drv; }

static void live_add(sim_device *d, enum sim_live i, uint64_t v)
{
    atomic_fetch_add(&d->live[i], v);
    atomic_fetch_add(&g_live[i], v);
}

static void live_sub(sim_device *d, enum sim_live i, uint64_t v)
{
    atomic_fetch_sub(&d->live[i], v);
    atomic_fetch_sub(&g_live[i], v);
}

/* ---- call accounting and fault injection ------------------------------------------------------- */

/* Kinds that "every kind" (-1) injection leaves alone: the queries device_info, mem_get_info and
 * event_query (failing them exercises no recovery path, only setup, reporting and polling loops
 * that would just poll again) and the teardown calls (mem_release, va_free,
 * stream_destroy, event_destroy: a caller cannot recover from those, a failure there can only
 * turn into a leak, which would hide the leaks the tests look for). They can still be failed by
 * naming them explicitly. */
static bool kind_in_any(int kind)
{
    switch (kind) {
    case VMM_SIM_CALL_DEVICE_INFO:
    case VMM_SIM_CALL_MEM_GET_INFO:
    case VMM_SIM_CALL_EVENT_QUERY:
    case VMM_SIM_CALL_MEM_RELEASE:
    case VMM_SIM_CALL_VA_FREE:
    case VMM_SIM_CALL_STREAM_DESTROY:
    case VMM_SIM_CALL_EVENT_DESTROY:
        return false;
    default:
        return true;
    }
}

/* splitmix64 (Steele, Lea, Flood 2014): tiny, full period, good enough for fault dice. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static double rng_unit(uint64_t *s) { return (double)(rng_next(s) >> 11) * 0x1p-53; }

static int injected_result(int kind)
{
    switch (kind) {
    case VMM_SIM_CALL_MEM_CREATE:
    case VMM_SIM_CALL_MEM_ALLOC:
    case VMM_SIM_CALL_VA_RESERVE:
    case VMM_SIM_CALL_HOST_ALLOC:
        return VMM_DRV_OUT_OF_MEMORY;
    default:
        return VMM_DRV_UNKNOWN;
    }
}

static void sleep_ns(uint64_t ns)
{
    struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* Count a call (mu held): returns the injected failure, or 0 to go on. */
static int call_begin_locked(sim_device *d, int kind)
{
    bool fail = false;
    if (VMM_UNLIKELY(d->hook != NULL) && (d->hook_kind == -1 || d->hook_kind == kind)) {
        /* every caller locks mu just before and has read nothing under it yet: the hook runs as
         * if before the call, free to make calls of its own (other threads' included) */
        vmm_sim_call_hook fn = d->hook;
        void *arg = d->hook_arg;
        pthread_mutex_unlock(&d->mu);
        fn(arg, kind);
        pthread_mutex_lock(&d->mu);
    }
    if (VMM_UNLIKELY(d->opt.real_time)) {
        /* the modeled cost in real time, the device lock let go as for the hook above */
        pthread_mutex_unlock(&d->mu);
        sleep_ns(d->opt.cost_ns[kind]);
        pthread_mutex_lock(&d->mu);
    }
    d->calls[kind]++;
    if (d->opt.cost_model)
        d->driver_time_ns += d->opt.cost_ns[kind];
    if (d->nth_left[kind] && --d->nth_left[kind] == 0)
        fail = true;
    if (d->nth_any && kind_in_any(kind) && --d->nth_any == 0)
        fail = true;
    if (d->fail_p[kind] > 0 && rng_unit(&d->rng) < d->fail_p[kind])
        fail = true;
    return fail ? injected_result(kind) : 0;
}

/* A call of a size-costed kind (mu held, after call_begin_locked charged cost_ns[kind]): charge
 * its sized cost instead. */
static void charge_size_locked(sim_device *d, int kind, uint64_t size)
{
    if (d->opt.cost_model && d->opt.n_cost_points) {
        d->driver_time_ns -= d->opt.cost_ns[kind];
        d->driver_time_ns += vmm_sim_cost_of(&d->opt, kind, size);
    }
}

/* Record the result (mu held). NOT_READY is an answer, not a failure. */
static int call_end_locked(sim_device *d, int kind, int r)
{
    if (r != VMM_DRV_SUCCESS && r != VMM_DRV_NOT_READY)
        d->failures[kind]++;
    return r;
}

/* The frame of a call that a capture may refuse and fault injection may fail: capture_gate first
 * (it takes the capture list's lock, not mu), then mu and the accounting; the refusal, or an
 * injected failure, stands in for the call's own result. gated_end records it and unlocks. */
static int gated_begin(sim_device *d, int kind)
{
    int gate = capture_gate(d);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, kind);
    return r ? r : gate;
}

static int gated_end(sim_device *d, int kind, int r)
{
    call_end_locked(d, kind, r);
    pthread_mutex_unlock(&d->mu);
    return r;
}

static int call_begin(sim_device *d, int kind)
{
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, kind);
    if (r)
        call_end_locked(d, kind, r);
    pthread_mutex_unlock(&d->mu);
    return r;
}

static int call_end(sim_device *d, int kind, int r)
{
    if (r != VMM_DRV_SUCCESS && r != VMM_DRV_NOT_READY) {
        pthread_mutex_lock(&d->mu);
        call_end_locked(d, kind, r);
        pthread_mutex_unlock(&d->mu);
    }
    return r;
}

/* ---- memory rules -------------------------------------------------------------------------------- */

static bool aligned(const sim_device *d, uintptr_t x) { return (x & (d->opt.granularity - 1)) == 0; }

/* va, size both granularity multiples, size nonzero, no wrap-around. */
static bool range_ok(const sim_device *d, uintptr_t va, size_t size)
{
    return size != 0 && aligned(d, va) && aligned(d, size) && va + size > va;
}

static uint64_t page_of(const sim_device *d, uintptr_t va) { return (uint64_t)(va >> d->gran_shift); }

/* Index of the first reservation with va > `va`. */
static size_t res_upper(const sim_device *d, uintptr_t va)
{
    size_t lo = 0, hi = d->n_res;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->res[mid]->va <= va)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The reservation holding all of [va, va+size), or NULL. */
static sim_res *res_containing(const sim_device *d, uintptr_t va, size_t size)
{
    size_t i = res_upper(d, va);
    if (i == 0)
        return NULL;
    sim_res *r = d->res[i - 1];
    return (va - r->va < r->size && size <= r->size - (va - r->va)) ? r : NULL;
}

static sim_mapping *mapping_at(const sim_device *d, uintptr_t va)
{
    return hmap_get(&d->pages, page_of(d, va));
}

/* Every page of [va, va+size) is mapped. */
static bool fully_mapped(const sim_device *d, uintptr_t va, size_t size)
{
    for (uintptr_t p = va; p - va < size;) {
        sim_mapping *m = mapping_at(d, p);
        if (!m)
            return false;
        p = m->va + m->size;
    }
    return true;
}

/* A range of bytes (any alignment) lies in mapped pages or inside one classic allocation. */
static bool bytes_addressable(const sim_device *d, uintptr_t va, size_t n)
{
    if (n == 0)
        return true;
    if (va + n < va)
        return false;
    uintptr_t first = va & ~(uintptr_t)(d->opt.granularity - 1);
    if (fully_mapped(d, first, va + n - first))
        return true;
    for (size_t i = 0; i < d->classic.cap; i++) {
        const sim_classic *c = d->classic.vals[i];
        if (d->classic.keys[i] && va >= c->ptr && va - c->ptr < c->size && n <= c->size - (va - c->ptr))
            return true;
    }
    return false;
}

static size_t capacity_left(sim_device *d)
{
    uint64_t used = atomic_load(&d->live[LIVE_PHYS_BYTES]);
    return used >= d->opt.capacity ? 0 : d->opt.capacity - (size_t)used;
}

/* Put PROT_NONE reserved memory back over [va, va+size). */
static int remap_none(uintptr_t va, size_t size)
{
    void *p = mmap((void *)va, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
                   -1, 0);
    return p == MAP_FAILED ? -1 : 0;
}

/* The handle's memory goes back to the device: released and no longer mapped anywhere. */
static void phys_maybe_free(sim_device *d, sim_phys *p)
{
    if (!p->released || p->n_mappings)
        return;
    live_sub(d, LIVE_PHYS_BYTES, p->charged);
    if (p->fd >= 0)
        close(p->fd);
    free(p);
}

static int sim_device_info(vmm_driver *drv, vmm_device_info *out)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_DEVICE_INFO);
    if (r)
        return r;
    if (!out)
        return call_end(d, VMM_SIM_CALL_DEVICE_INFO, VMM_DRV_INVALID_VALUE);
    memset(out, 0, sizeof *out);
    out->total_bytes = d->opt.capacity;
    out->granularity = d->opt.granularity;
    out->recommended_granularity = d->opt.granularity;
    out->vmm_supported = d->opt.vmm_supported;
    out->ordinal = 0;
    pthread_mutex_lock(&d->mu);
    out->posix_fd_handles = d->exportable;
    pthread_mutex_unlock(&d->mu);
    strcpy(out->name, "sim");
    return VMM_DRV_SUCCESS;
}

static int sim_mem_get_info(vmm_driver *drv, size_t *free_bytes, size_t *total_bytes)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_MEM_GET_INFO);
    if (r)
        return r;
    if (!free_bytes || !total_bytes)
        return call_end(d, VMM_SIM_CALL_MEM_GET_INFO, VMM_DRV_INVALID_VALUE);
    *free_bytes = capacity_left(d);
    *total_bytes = d->opt.capacity;
    return VMM_DRV_SUCCESS;
}

static int va_reserve_locked(sim_device *d, size_t size, size_t alignment, uintptr_t *va)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    if (!va || size == 0 || !aligned(d, size))
        return VMM_DRV_INVALID_VALUE;
    /* alignment: 0 means the granularity, else a power of two that the granularity divides */
    size_t align = alignment ? alignment : d->opt.granularity;
    if ((align & (align - 1)) != 0 || !aligned(d, align))
        return VMM_DRV_INVALID_VALUE;
    if (size > SIZE_MAX - align)
        return VMM_DRV_OUT_OF_MEMORY;
    if (d->n_res == d->cap_res) {
        size_t cap = d->cap_res ? d->cap_res * 2 : 16;
        sim_res **n = realloc(d->res, cap * sizeof *n);
        if (!n)
            return VMM_DRV_OUT_OF_MEMORY;
        d->res = n;
        d->cap_res = cap;
    }
    sim_res *res = calloc(1, sizeof *res);
    if (!res)
        return VMM_DRV_OUT_OF_MEMORY;
    /* Over-reserve by the alignment and trim both ends: mmap only promises page alignment. */
    size_t span = size + align;
    void *raw = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (raw == MAP_FAILED) {
        free(res);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    uintptr_t base = ((uintptr_t)raw + align - 1) & ~(uintptr_t)(align - 1);
    if (base > (uintptr_t)raw)
        munmap(raw, base - (uintptr_t)raw);
    if ((uintptr_t)raw + span > base + size)
        munmap((void *)(base + size), (uintptr_t)raw + span - (base + size));
    res->va = base;
    res->size = size;
    size_t i = res_upper(d, base);
    memmove(&d->res[i + 1], &d->res[i], (d->n_res - i) * sizeof *d->res);
    d->res[i] = res;
    d->n_res++;
    live_add(d, LIVE_RESERVED_BYTES, size);
    *va = base;
    return VMM_DRV_SUCCESS;
}

static int sim_va_reserve(vmm_driver *drv, size_t size, size_t alignment, uintptr_t *va)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_VA_RESERVE);
    if (!r)
        r = va_reserve_locked(d, size, alignment, va);
    charge_size_locked(d, VMM_SIM_CALL_VA_RESERVE, size);
    return gated_end(d, VMM_SIM_CALL_VA_RESERVE, r);
}

/* cuMemAddressFree: the range must be exactly one reservation (same va and size as reserved) and,
 * per the contract, hold no mapping. */
static int va_free_locked(sim_device *d, uintptr_t va, size_t size)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    size_t i = res_upper(d, va);
    if (i == 0 || d->res[i - 1]->va != va || d->res[i - 1]->size != size)
        return VMM_DRV_INVALID_VALUE;
    sim_res *res = d->res[i - 1];
    if (res->n_mappings)
        return VMM_DRV_INVALID_VALUE;
    munmap((void *)res->va, res->size);
    memmove(&d->res[i - 1], &d->res[i], (d->n_res - i) * sizeof *d->res);
    d->n_res--;
    live_sub(d, LIVE_RESERVED_BYTES, res->size);
    free(res);
    return VMM_DRV_SUCCESS;
}

static int sim_va_free(vmm_driver *drv, uintptr_t va, size_t size)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_VA_FREE);
    if (!r)
        r = va_free_locked(d, va, size);
    charge_size_locked(d, VMM_SIM_CALL_VA_FREE, size);
    return gated_end(d, VMM_SIM_CALL_VA_FREE, r);
}

static int mem_create_locked(sim_device *d, size_t size, vmm_phys *out)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    if (!out || size == 0 || !aligned(d, size))
        return VMM_DRV_INVALID_VALUE;
    if (size > capacity_left(d))
        return VMM_DRV_OUT_OF_MEMORY;
    if (hmap_reserve(&d->handles, 1))
        return VMM_DRV_OUT_OF_MEMORY;
    sim_phys *p = calloc(1, sizeof *p);
    if (!p)
        return VMM_DRV_OUT_OF_MEMORY;
    p->fd = -1;
    if (d->opt.backed) {
        /* tmpfs pages appear on first touch, so a big untouched handle costs no RAM either */
        p->fd = memfd_create("vmmalloc-sim", MFD_CLOEXEC);
        if (p->fd < 0 || ftruncate(p->fd, (off_t)size) != 0) {
            if (p->fd >= 0)
                close(p->fd);
            free(p);
            return VMM_DRV_OUT_OF_MEMORY;
        }
    }
    p->id = ++d->next_handle;
    p->size = size;
    p->charged = size;
    p->exportable = d->exportable;
    hmap_put(&d->handles, p->id, p);
    live_add(d, LIVE_PHYS_BYTES, size);
    live_add(d, LIVE_HANDLES, 1);
    *out = p->id;
    return VMM_DRV_SUCCESS;
}

static int sim_mem_create(vmm_driver *drv, size_t size, vmm_phys *out)
{
    sim_device *d = dev_of(drv);
    int gate = capture_gate(d);
    atomic_fetch_add(&d->creates_in_flight, 1);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, VMM_SIM_CALL_MEM_CREATE);
    pthread_mutex_unlock(&d->mu);
    if (d->opt.real_time_create && !d->opt.real_time) {
        /* the call's modeled cost in real time, no lock held: what other threads wait for when the
         * caller holds one of its own (tests of segment.c's unlocked growth) */
        sleep_ns(d->opt.cost_ns[VMM_SIM_CALL_MEM_CREATE]);
    }
    pthread_mutex_lock(&d->mu);
    if (!r)
        r = gate;
    if (!r)
        r = mem_create_locked(d, size, out);
    charge_size_locked(d, VMM_SIM_CALL_MEM_CREATE, size);
    call_end_locked(d, VMM_SIM_CALL_MEM_CREATE, r);
    pthread_mutex_unlock(&d->mu);
    atomic_fetch_sub(&d->creates_in_flight, 1);
    return r;
}

/* A release of a handle that is not live is a caller bug CUDA gives no error for: stop here, loudly,
 * rather than hand back an answer a real driver does not promise (driver.h, "Not promised"). */
static _Noreturn void release_undefined(vmm_phys h)
{
    fprintf(stderr,
            "vmmalloc sim: mem_release: handle %llu is not a live physical handle (released twice, or "
            "never created); cuda.h, cuMemRelease: \"If handle is not a valid handle the behavior is "
            "undefined.\"\n",
            (unsigned long long)h);
    abort();
}

/* cuMemRelease: the handle dies now; its memory is freed once every mapping of it is unmapped too
 * (CUDA Driver API reference, cuMemRelease). An invalid handle (released twice, never created) is
 * undefined in CUDA: the sim aborts. */
static int mem_release_locked(sim_device *d, vmm_phys h)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    sim_phys *p = hmap_del(&d->handles, h);
    if (!p)
        release_undefined(h);
    p->released = true;
    live_sub(d, LIVE_HANDLES, 1);
    phys_maybe_free(d, p);
    return VMM_DRV_SUCCESS;
}

static int sim_mem_release(vmm_driver *drv, vmm_phys h)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_MEM_RELEASE);
    sim_phys *p = hmap_get(&d->handles, h);
    if (p)
        charge_size_locked(d, VMM_SIM_CALL_MEM_RELEASE, p->size);
    if (!r)
        r = mem_release_locked(d, h);
    return gated_end(d, VMM_SIM_CALL_MEM_RELEASE, r);
}

/* cuMemMap: the range must lie in a reservation made by cuMemAddressReserve; va, size and offset
 * multiples of the granularity (CUDA Driver API reference, cuMemMap). Offset 0 and whole-handle
 * size are the contract's (and today's CUDA) rule. Mapping over a mapped page is refused. */
static int mem_map_locked(sim_device *d, uintptr_t va, size_t size, size_t offset, vmm_phys h)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    if (!range_ok(d, va, size) || offset != 0)
        return VMM_DRV_INVALID_VALUE;
    sim_phys *p = hmap_get(&d->handles, h);
    if (!p)
        return VMM_DRV_INVALID_HANDLE;
    if (size != p->size)
        return VMM_DRV_INVALID_VALUE;
    sim_res *res = res_containing(d, va, size);
    if (!res)
        return VMM_DRV_INVALID_VALUE;
    for (uintptr_t a = va; a - va < size; a += d->opt.granularity)
        if (mapping_at(d, a))
            return VMM_DRV_INVALID_VALUE;
    sim_mapping *m = malloc(sizeof *m);
    if (!m || hmap_reserve(&d->pages, size >> d->gran_shift)) {
        free(m);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    *m = (sim_mapping){NULL, d->mappings, va, size, p, res};
    if (d->mappings)
        d->mappings->prev = m;
    d->mappings = m;
    for (uintptr_t a = va; a - va < size; a += d->opt.granularity)
        hmap_put(&d->pages, page_of(d, a), m);
    p->n_mappings++;
    res->n_mappings++;
    live_add(d, LIVE_MAPPED_BYTES, size);
    return VMM_DRV_SUCCESS;
}

static int sim_mem_map(vmm_driver *drv, uintptr_t va, size_t size, size_t offset, vmm_phys h)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_MEM_MAP);
    if (!r)
        r = mem_map_locked(d, va, size, offset, h);
    charge_size_locked(d, VMM_SIM_CALL_MEM_MAP, size);
    return gated_end(d, VMM_SIM_CALL_MEM_MAP, r);
}

static void mapping_drop(sim_device *d, sim_mapping *m)
{
    for (uintptr_t a = m->va; a - m->va < m->size; a += d->opt.granularity)
        hmap_del(&d->pages, page_of(d, a));
    if (m->prev)
        m->prev->next = m->next;
    else
        d->mappings = m->next;
    if (m->next)
        m->next->prev = m->prev;
    m->res->n_mappings--;
    m->phys->n_mappings--;
    live_sub(d, LIVE_MAPPED_BYTES, m->size);
    phys_maybe_free(d, m->phys);
    free(m);
}

/* cuMemUnmap: the range must be the entire range of one earlier cuMemMap; a sub-range cannot be
 * unmapped (CUDA Driver API reference, cuMemUnmap). Afterwards the range is a plain reservation
 * again, with no access. */
static int mem_unmap_locked(sim_device *d, uintptr_t va, size_t size)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    if (!range_ok(d, va, size))
        return VMM_DRV_INVALID_VALUE;
    sim_mapping *m = mapping_at(d, va);
    if (!m || m->va != va || m->size != size)
        return VMM_DRV_INVALID_VALUE;
    if (d->opt.backed && remap_none(va, size) != 0)
        return VMM_DRV_OUT_OF_MEMORY;
    mapping_drop(d, m);
    return VMM_DRV_SUCCESS;
}

static int sim_mem_unmap(vmm_driver *drv, uintptr_t va, size_t size)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_MEM_UNMAP);
    if (!r)
        r = mem_unmap_locked(d, va, size);
    charge_size_locked(d, VMM_SIM_CALL_MEM_UNMAP, size);
    return gated_end(d, VMM_SIM_CALL_MEM_UNMAP, r);
}

/* cuMemSetAccess: every page of the range must be mapped; it may span adjacent mappings. In backed
 * mode this is where the memory becomes reachable: the handle's memfd goes over the range. */
static int set_access_locked(sim_device *d, uintptr_t va, size_t size)
{
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    if (!range_ok(d, va, size) || !fully_mapped(d, va, size))
        return VMM_DRV_INVALID_VALUE;
    if (!d->opt.backed)
        return VMM_DRV_SUCCESS;
    for (uintptr_t a = va; a - va < size;) {
        sim_mapping *m = mapping_at(d, a);
        uintptr_t end = m->va + m->size;
        if (end - va > size)
            end = va + size;
        void *p = mmap((void *)a, end - a, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, m->phys->fd,
                       (off_t)(a - m->va));
        if (p == MAP_FAILED) {
            /* Only the host running out of mappings (vm.max_map_count) gets here. Undo what this
             * call opened so the range is as before: no access. */
            if (a > va)
                remap_none(va, a - va);
            return VMM_DRV_OUT_OF_MEMORY;
        }
        a = end;
    }
    return VMM_DRV_SUCCESS;
}

static int sim_set_access(vmm_driver *drv, uintptr_t va, size_t size)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_SET_ACCESS);
    if (!r)
        r = set_access_locked(d, va, size);
    charge_size_locked(d, VMM_SIM_CALL_SET_ACCESS, size);
    return gated_end(d, VMM_SIM_CALL_SET_ACCESS, r);
}

/* cuMemAlloc: no alignment rule, size 0 is invalid. Backed: real read-write memory. Unbacked: a
 * PROT_NONE NORESERVE range, which gives a unique address and costs nothing. Capacity is shared
 * with the physical handles; an allocation is charged in 512-byte units, its alignment. */
static int mem_alloc_locked(sim_device *d, size_t size, uintptr_t *out)
{
    if (!out || size == 0 || size > SIZE_MAX - SIM_CLASSIC_ALIGN)
        return VMM_DRV_INVALID_VALUE;
    size_t charged = (size + SIM_CLASSIC_ALIGN - 1) & ~(size_t)(SIM_CLASSIC_ALIGN - 1);
    if (charged > capacity_left(d))
        return VMM_DRV_OUT_OF_MEMORY;
    if (hmap_reserve(&d->classic, 1))
        return VMM_DRV_OUT_OF_MEMORY;
    sim_classic *c = calloc(1, sizeof *c);
    if (!c)
        return VMM_DRV_OUT_OF_MEMORY;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    c->map_len = (size + page - 1) & ~(page - 1);
    int prot = d->opt.backed ? PROT_READ | PROT_WRITE : PROT_NONE;
    void *p = mmap(NULL, c->map_len, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        free(c);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    c->ptr = (uintptr_t)p;
    c->size = size;
    c->charged = charged;
    hmap_put(&d->classic, c->ptr, c);
    live_add(d, LIVE_PHYS_BYTES, charged);
    live_add(d, LIVE_CLASSIC, 1);
    *out = c->ptr;
    return VMM_DRV_SUCCESS;
}

static int sim_mem_alloc(vmm_driver *drv, size_t size, uintptr_t *out)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_MEM_ALLOC);
    if (!r)
        r = mem_alloc_locked(d, size, out);
    charge_size_locked(d, VMM_SIM_CALL_MEM_ALLOC, size);
    return gated_end(d, VMM_SIM_CALL_MEM_ALLOC, r);
}

static void device_sync_wait(sim_device *d);

/* cuMemFree synchronizes the device before freeing (CUDA Programming Guide, implicit
 * synchronization). The pointer is taken out of the table first, so a concurrent free of the same
 * pointer fails instead of racing. */
static int sim_mem_free(vmm_driver *drv, uintptr_t ptr)
{
    sim_device *d = dev_of(drv);
    /* unsafe, and it synchronizes the device: never while a capture goes on */
    int gate = capture_gate(d);
    if (!gate)
        gate = capture_sync_gate(d);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, VMM_SIM_CALL_MEM_FREE);
    if (!r)
        r = gate;
    sim_classic *c = NULL;
    if (!r) {
        c = hmap_del(&d->classic, ptr);
        if (!c)
            r = VMM_DRV_INVALID_VALUE;
        else
            charge_size_locked(d, VMM_SIM_CALL_MEM_FREE, c->size);
    }
    call_end_locked(d, VMM_SIM_CALL_MEM_FREE, r);
    if (c)
        d->device_syncs++;
    pthread_mutex_unlock(&d->mu);
    if (!c)
        return r;
    device_sync_wait(d);
    munmap((void *)c->ptr, c->map_len);
    live_sub(d, LIVE_PHYS_BYTES, c->charged);
    live_sub(d, LIVE_CLASSIC, 1);
    free(c);
    return VMM_DRV_SUCCESS;
}

/* cuMemHostAlloc: real read-write host memory in both modes (the caller writes into it), charged
 * to no capacity; only injected faults or a failing mmap make it run out. */
static int host_alloc_locked(sim_device *d, size_t size, void **out)
{
    if (!out || size == 0)
        return VMM_DRV_INVALID_VALUE;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (size > SIZE_MAX - page)
        return VMM_DRV_OUT_OF_MEMORY;
    if (hmap_reserve(&d->host, 1))
        return VMM_DRV_OUT_OF_MEMORY;
    sim_host *h = calloc(1, sizeof *h);
    if (!h)
        return VMM_DRV_OUT_OF_MEMORY;
    h->size = size;
    h->map_len = (size + page - 1) & ~(page - 1);
    void *p = mmap(NULL, h->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    if (p == MAP_FAILED) {
        free(h);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    hmap_put(&d->host, (uint64_t)(uintptr_t)p, h);
    live_add(d, LIVE_HOST_BYTES, h->map_len);
    live_add(d, LIVE_HOST_ALLOCS, 1);
    *out = p;
    return VMM_DRV_SUCCESS;
}

static int sim_host_alloc(vmm_driver *drv, size_t size, void **out)
{
    sim_device *d = dev_of(drv);
    int r = gated_begin(d, VMM_SIM_CALL_HOST_ALLOC);
    if (!r)
        r = host_alloc_locked(d, size, out);
    return gated_end(d, VMM_SIM_CALL_HOST_ALLOC, r);
}

/* cuMemFreeHost synchronizes the device like cuMemFree (that is why pinned memory is cached). */
static int sim_host_free(vmm_driver *drv, void *ptr)
{
    sim_device *d = dev_of(drv);
    /* unsafe, and it synchronizes the device: never while a capture goes on */
    int gate = capture_gate(d);
    if (!gate)
        gate = capture_sync_gate(d);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, VMM_SIM_CALL_HOST_FREE);
    if (!r)
        r = gate;
    sim_host *h = NULL;
    if (!r) {
        h = ptr ? hmap_del(&d->host, (uint64_t)(uintptr_t)ptr) : NULL;
        if (!h)
            r = VMM_DRV_INVALID_VALUE;
    }
    call_end_locked(d, VMM_SIM_CALL_HOST_FREE, r);
    if (h)
        d->device_syncs++;
    pthread_mutex_unlock(&d->mu);
    if (!h)
        return r;
    device_sync_wait(d);
    munmap(ptr, h->map_len);
    live_sub(d, LIVE_HOST_BYTES, h->map_len);
    live_sub(d, LIVE_HOST_ALLOCS, 1);
    free(h);
    return VMM_DRV_SUCCESS;
}

static int sim_lookup_mapping(vmm_driver *drv, uintptr_t va, vmm_phys *out)
{
    sim_device *d = dev_of(drv);
    if (!d->opt.vmm_supported)
        return VMM_DRV_NOT_SUPPORTED;
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    /* cuMemRetainAllocationHandle + cuMemRelease on CUDA: unsafe calls */
    int gate = capture_gate(d);
    if (gate)
        return gate;
    pthread_mutex_lock(&d->mu);
    sim_mapping *m = mapping_at(d, va);
    *out = m ? m->phys->id : 0;
    pthread_mutex_unlock(&d->mu);
    return m ? VMM_DRV_SUCCESS : VMM_DRV_INVALID_VALUE;
}

/* ---- streams ------------------------------------------------------------------------------------ */

static void marker_unref(sim_marker *m)
{
    if (m && --m->refs == 0)
        free(m);
}

static void item_run(sim_device *d, sim_item *it)
{
    switch (it->kind) {
    case ITEM_HOST:
        it->fn(it->arg);
        break;
    case ITEM_MEMSET:
        if (it->backed) {
            uint32_t *w = (uint32_t *)it->va;
            for (size_t i = 0; i < it->n; i++)
                w[i] = it->value;
        }
        break;
    case ITEM_MEMCPY:
        if (it->backed && it->n)
            memcpy(it->dst, (const void *)it->va, it->n);
        break;
    case ITEM_MEMCPY_HTOD:
        if (it->backed && it->n)
            memcpy((void *)it->va, it->dst, it->n);
        break;
    case ITEM_MARK:
        break;
    case ITEM_WAIT:
        pthread_mutex_lock(&d->qmu);
        while (!it->marker->done)
            pthread_cond_wait(&d->done_cv, &d->qmu);
        pthread_mutex_unlock(&d->qmu);
        break;
    }
}

static void *stream_worker(void *arg)
{
    sim_stream *s = arg;
    sim_device *d = s->dev;
    pthread_mutex_lock(&d->qmu);
    for (;;) {
        while (!s->head && !s->stop)
            pthread_cond_wait(&s->cv, &d->qmu);
        if (!s->head)
            break;
        /* The item stays at the head while it runs, so syncs see it as pending. */
        sim_item *it = s->head;
        pthread_mutex_unlock(&d->qmu);
        item_run(d, it);
        pthread_mutex_lock(&d->qmu);
        s->head = it->next;
        if (!s->head)
            s->tail = NULL;
        if (it->kind == ITEM_MARK)
            it->marker->done = true;
        marker_unref(it->marker);
        free(it);
        pthread_cond_broadcast(&d->done_cv);
    }
    pthread_mutex_unlock(&d->qmu);
    return NULL;
}

/* qmu held. NULL names the default stream; anything not on the list is not a stream. */
static sim_stream *stream_find(sim_device *d, void *s)
{
    if (!s)
        return d->default_stream;
    for (sim_stream *it = d->streams; it; it = it->next)
        if (it == s)
            return it;
    return NULL;
}

/* qmu held. */
static void stream_push(sim_device *d, sim_stream *s, sim_item *it)
{
    it->seq = ++d->q_seq;
    it->next = NULL;
    if (s->tail)
        s->tail->next = it;
    else
        s->head = it;
    s->tail = it;
    pthread_cond_signal(&s->cv);
}

/* qmu held: s has no pending item queued at or before sequence number t. */
static bool stream_idle_at(const sim_stream *s, uint64_t t) { return !s->head || s->head->seq > t; }

static void device_sync_wait(sim_device *d)
{
    pthread_mutex_lock(&d->qmu);
    uint64_t t = d->q_seq;
    for (;;) {
        bool busy = false;
        for (sim_stream *s = d->streams; s && !busy; s = s->next)
            busy = !stream_idle_at(s, t);
        if (!busy)
            break;
        pthread_cond_wait(&d->done_cv, &d->qmu);
    }
    pthread_mutex_unlock(&d->qmu);
}

static int stream_start(sim_device *d, sim_stream **out)
{
    sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return VMM_DRV_OUT_OF_MEMORY;
    s->dev = d;
    if (pthread_cond_init(&s->cv, NULL) != 0) {
        free(s);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    if (pthread_create(&s->thread, NULL, stream_worker, s) != 0) {
        pthread_cond_destroy(&s->cv);
        free(s);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    *out = s;
    return VMM_DRV_SUCCESS;
}

/* Drain and join; s is already off the list. */
static void stream_stop(sim_device *d, sim_stream *s)
{
    pthread_mutex_lock(&d->qmu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&d->qmu);
    pthread_join(s->thread, NULL);
    pthread_cond_destroy(&s->cv);
    free(s);
}

static int sim_stream_create(vmm_driver *drv, void **out)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_STREAM_CREATE);
    if (r)
        return r;
    if (!out)
        return call_end(d, VMM_SIM_CALL_STREAM_CREATE, VMM_DRV_INVALID_VALUE);
    sim_stream *s;
    r = stream_start(d, &s);
    if (r)
        return call_end(d, VMM_SIM_CALL_STREAM_CREATE, r);
    pthread_mutex_lock(&d->qmu);
    s->next = d->streams;
    d->streams = s;
    pthread_mutex_unlock(&d->qmu);
    live_add(d, LIVE_STREAMS, 1);
    *out = s;
    return VMM_DRV_SUCCESS;
}

/* Runs the stream's queued work to the end, then frees it. The default stream cannot be destroyed. */
static int sim_stream_destroy(vmm_driver *drv, void *sp)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_STREAM_DESTROY);
    if (r)
        return r;
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = sp ? stream_find(d, sp) : NULL;
    if (s == d->default_stream)
        s = NULL;
    if (s && s->cap) {
        /* its capture could never end: refused (CUDA leaves it undefined) */
        pthread_mutex_unlock(&d->qmu);
        return call_end(d, VMM_SIM_CALL_STREAM_DESTROY, VMM_DRV_STREAM_CAPTURE_UNSUPPORTED);
    }
    if (s) {
        sim_stream **pp = &d->streams;
        while (*pp != s)
            pp = &(*pp)->next;
        *pp = s->next;
    }
    pthread_mutex_unlock(&d->qmu);
    if (!s)
        return call_end(d, VMM_SIM_CALL_STREAM_DESTROY, VMM_DRV_INVALID_HANDLE);
    stream_stop(d, s);
    live_sub(d, LIVE_STREAMS, 1);
    return VMM_DRV_SUCCESS;
}

static int sim_stream_sync(vmm_driver *drv, void *sp)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_STREAM_SYNC);
    if (r)
        return r;
    if ((r = capture_gate(d)) != 0)
        return call_end(d, VMM_SIM_CALL_STREAM_SYNC, r);
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = stream_find(d, sp);
    if (!s) {
        pthread_mutex_unlock(&d->qmu);
        return call_end(d, VMM_SIM_CALL_STREAM_SYNC, VMM_DRV_INVALID_HANDLE);
    }
    if (s->cap) {
        /* its work is a graph's now: it never completes; the capture is invalidated */
        s->cap->invalidated = true;
        pthread_mutex_unlock(&d->qmu);
        return call_end(d, VMM_SIM_CALL_STREAM_SYNC, VMM_DRV_STREAM_CAPTURE_UNSUPPORTED);
    }
    uint64_t t = d->q_seq;
    /* A stream destroyed meanwhile by another thread was drained: nothing left to wait for. */
    while (stream_find(d, sp) == s && !stream_idle_at(s, t))
        pthread_cond_wait(&d->done_cv, &d->qmu);
    pthread_mutex_unlock(&d->qmu);
    pthread_mutex_lock(&d->mu);
    d->stream_syncs++;
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

static int sim_device_sync(vmm_driver *drv)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_DEVICE_SYNC);
    if (r)
        return r;
    if ((r = capture_gate(d)) != 0 || (r = capture_sync_gate(d)) != 0)
        return call_end(d, VMM_SIM_CALL_DEVICE_SYNC, r);
    device_sync_wait(d);
    pthread_mutex_lock(&d->mu);
    d->device_syncs++;
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

/* qmu held: keep item it in capture c (a graph node) instead of running it. */
static int capture_push(sim_capture *c, sim_item *it)
{
    if (c->invalidated) {
        free(it);
        return VMM_DRV_STREAM_CAPTURE_INVALIDATED;
    }
    it->next = NULL;
    if (c->tail)
        c->tail->next = it;
    else
        c->items = it;
    c->tail = it;
    c->n_items++;
    return VMM_DRV_SUCCESS;
}

/* Queue one item on stream sp (validated under qmu), or keep it in the stream's capture. Takes
 * ownership of it either way. */
static int enqueue(sim_device *d, void *sp, sim_item *it)
{
    int r = VMM_DRV_SUCCESS;
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = stream_find(d, sp);
    if (s && s->cap)
        r = capture_push(s->cap, it);
    else if (s)
        stream_push(d, s, it);
    pthread_mutex_unlock(&d->qmu);
    if (!s)
        free(it);
    return s ? r : VMM_DRV_INVALID_HANDLE;
}

static int sim_launch_host(vmm_driver *drv, void *sp, void (*fn)(void *), void *arg)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_LAUNCH_HOST);
    if (r)
        return r;
    if (!fn)
        return call_end(d, VMM_SIM_CALL_LAUNCH_HOST, VMM_DRV_INVALID_VALUE);
    sim_item *it = calloc(1, sizeof *it);
    if (!it)
        return call_end(d, VMM_SIM_CALL_LAUNCH_HOST, VMM_DRV_OUT_OF_MEMORY);
    it->kind = ITEM_HOST;
    it->fn = fn;
    it->arg = arg;
    return call_end(d, VMM_SIM_CALL_LAUNCH_HOST, enqueue(d, sp, it));
}

/* cuMemsetD32Async: 4-byte aligned destination. The bytes must be mapped (VMM) or inside one
 * classic allocation when queued; unmapping them before the work runs is the caller's bug and
 * faults like a kernel touching freed memory would. */
static int sim_memset32(vmm_driver *drv, uintptr_t va, uint32_t value, size_t n, void *sp)
{
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, VMM_SIM_CALL_MEMSET);
    if (!r && ((va & 3) != 0 || n > SIZE_MAX / 4 || !bytes_addressable(d, va, n * 4)))
        r = VMM_DRV_INVALID_VALUE;
    call_end_locked(d, VMM_SIM_CALL_MEMSET, r);
    pthread_mutex_unlock(&d->mu);
    if (r)
        return r;
    sim_item *it = calloc(1, sizeof *it);
    if (!it)
        return call_end(d, VMM_SIM_CALL_MEMSET, VMM_DRV_OUT_OF_MEMORY);
    *it = (sim_item){.kind = ITEM_MEMSET, .va = va, .value = value, .n = n, .backed = d->opt.backed};
    return call_end(d, VMM_SIM_CALL_MEMSET, enqueue(d, sp, it));
}

static int sim_memcpy_dtoh(vmm_driver *drv, void *dst, uintptr_t va, size_t n, void *sp)
{
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, VMM_SIM_CALL_MEMCPY);
    if (!r && ((!dst && n) || !bytes_addressable(d, va, n)))
        r = VMM_DRV_INVALID_VALUE;
    call_end_locked(d, VMM_SIM_CALL_MEMCPY, r);
    pthread_mutex_unlock(&d->mu);
    if (r)
        return r;
    sim_item *it = calloc(1, sizeof *it);
    if (!it)
        return call_end(d, VMM_SIM_CALL_MEMCPY, VMM_DRV_OUT_OF_MEMORY);
    *it = (sim_item){.kind = ITEM_MEMCPY, .va = va, .dst = dst, .n = n, .backed = d->opt.backed};
    return call_end(d, VMM_SIM_CALL_MEMCPY, enqueue(d, sp, it));
}

/* cuMemcpyHtoDAsync: counted as a memcpy call (one kind for both directions). */
static int sim_memcpy_htod(vmm_driver *drv, uintptr_t va, const void *src, size_t n, void *sp)
{
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    int r = call_begin_locked(d, VMM_SIM_CALL_MEMCPY);
    if (!r && ((!src && n) || !bytes_addressable(d, va, n)))
        r = VMM_DRV_INVALID_VALUE;
    call_end_locked(d, VMM_SIM_CALL_MEMCPY, r);
    pthread_mutex_unlock(&d->mu);
    if (r)
        return r;
    sim_item *it = calloc(1, sizeof *it);
    if (!it)
        return call_end(d, VMM_SIM_CALL_MEMCPY, VMM_DRV_OUT_OF_MEMORY);
    *it = (sim_item){.kind = ITEM_MEMCPY_HTOD, .va = va, .dst = (void *)(uintptr_t)src, .n = n,
                     .backed = d->opt.backed};
    return call_end(d, VMM_SIM_CALL_MEMCPY, enqueue(d, sp, it));
}

/* ---- capture ------------------------------------------------------------------------------------ */

/* The calling thread's capture interaction mode, for every simulated device (CUDA's is per thread). */
static _Thread_local int sim_thread_mode = VMM_CAPTURE_MODE_GLOBAL;
static _Atomic uint64_t g_capture_ids;

/* qmu held: the capture with that id, or NULL once it ended. */
static sim_capture *capture_find(sim_device *d, uint64_t id)
{
    for (sim_capture *c = d->captures; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

/* A "potentially unsafe" call (driver.h, Capture) made now by this thread: refused, invalidating the
 * captures whose mode forbids it (cuda.h, cuThreadExchangeStreamCaptureMode), or 0. */
static int capture_gate(sim_device *d)
{
    if (atomic_load_explicit(&d->n_captures, memory_order_acquire) == 0 ||
        sim_thread_mode == VMM_CAPTURE_MODE_RELAXED)
        return 0;
    int r = 0;
    pthread_t self = pthread_self();
    pthread_mutex_lock(&d->qmu);
    for (sim_capture *c = d->captures; c; c = c->next) {
        if (c->mode == VMM_CAPTURE_MODE_RELAXED)
            continue;
        bool mine = pthread_equal(c->owner, self) != 0;
        bool global = sim_thread_mode == VMM_CAPTURE_MODE_GLOBAL && c->mode == VMM_CAPTURE_MODE_GLOBAL;
        if (mine || global) {
            c->invalidated = true;
            r = VMM_DRV_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    pthread_mutex_unlock(&d->qmu);
    return r;
}

/* A call that synchronizes the whole device (device_sync, mem_free, host_free) while work is being
 * captured would wait for what never runs: refused in every mode, every capture invalidated. */
static int capture_sync_gate(sim_device *d)
{
    if (atomic_load_explicit(&d->n_captures, memory_order_acquire) == 0)
        return 0;
    int r = 0;
    pthread_mutex_lock(&d->qmu);
    for (sim_capture *c = d->captures; c; c = c->next) {
        c->invalidated = true;
        r = VMM_DRV_STREAM_CAPTURE_UNSUPPORTED;
    }
    pthread_mutex_unlock(&d->qmu);
    return r;
}

/* qmu held: query or sync of an event last recorded in a capture (cuda.h, CUDA_ERROR_CAPTURED_EVENT:
 * "the operation is not permitted on an event which was last recorded in a capturing stream"); the
 * capture, if it goes on, is invalidated. */
static int captured_event_locked(sim_device *d, sim_event *e)
{
    sim_capture *c = capture_find(d, e->cap_id);
    if (c)
        c->invalidated = true;
    return VMM_DRV_CAPTURED_EVENT;
}

/* qmu held: stream s waits on event e, one of them in a capture. */
static int capture_wait_locked(sim_device *d, sim_stream *s, sim_event *e)
{
    sim_capture *ec = e->cap_id ? capture_find(d, e->cap_id) : NULL;
    if (s->cap) {
        if (s->cap->invalidated)
            return VMM_DRV_STREAM_CAPTURE_INVALIDATED;
        if (ec == s->cap)
            return VMM_DRV_SUCCESS; /* within the capture: its list is already in that order */
        s->cap->invalidated = true;
        if (ec) {
            ec->invalidated = true;
            return VMM_DRV_STREAM_CAPTURE_MERGE;
        }
        /* an event recorded outside the capture (or in one that ended) */
        return e->cap_id ? VMM_DRV_CAPTURED_EVENT : VMM_DRV_STREAM_CAPTURE_ISOLATION;
    }
    if (!ec)
        return VMM_DRV_CAPTURED_EVENT; /* its capture ended: it stands for nodes of a graph */
    if (ec->invalidated)
        return VMM_DRV_STREAM_CAPTURE_INVALIDATED;
    /* a fork: s joins the capture, its later work is recorded after what the event covers */
    s->cap = ec;
    return VMM_DRV_SUCCESS;
}

static int sim_stream_capture_info(vmm_driver *drv, void *sp, int *capturing, uint64_t *id)
{
    sim_device *d = dev_of(drv);
    if (!capturing || !id)
        return VMM_DRV_INVALID_VALUE;
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = stream_find(d, sp);
    *capturing = s && s->cap;
    *id = s && s->cap && !s->cap->invalidated ? s->cap->id : 0;
    pthread_mutex_unlock(&d->qmu);
    return s ? VMM_DRV_SUCCESS : VMM_DRV_INVALID_HANDLE;
}

static int sim_capture_mode_exchange(vmm_driver *drv, int *mode)
{
    (void)drv;
    if (!mode || *mode < VMM_CAPTURE_MODE_GLOBAL || *mode > VMM_CAPTURE_MODE_RELAXED)
        return VMM_DRV_INVALID_VALUE;
    int prev = sim_thread_mode;
    sim_thread_mode = *mode;
    *mode = prev;
    return VMM_DRV_SUCCESS;
}

int vmm_sim_driver_capture_begin(vmm_driver *drv, void *sp, int mode)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    if (mode < VMM_CAPTURE_MODE_GLOBAL || mode > VMM_CAPTURE_MODE_RELAXED)
        return VMM_DRV_INVALID_VALUE;
    sim_device *d = dev_of(drv);
    sim_capture *c = calloc(1, sizeof *c);
    if (!c)
        return VMM_DRV_OUT_OF_MEMORY;
    int r = VMM_DRV_SUCCESS;
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = stream_find(d, sp);
    if (!s)
        r = VMM_DRV_INVALID_HANDLE;
    else if (s == d->default_stream)
        r = VMM_DRV_STREAM_CAPTURE_UNSUPPORTED; /* "Capture may not be initiated if stream is
                                                 * CU_STREAM_LEGACY" */
    else if (s->cap)
        r = VMM_DRV_INVALID_VALUE;
    if (!r) {
        c->id = atomic_fetch_add(&g_capture_ids, 1) + 1;
        c->mode = mode;
        c->owner = pthread_self();
        c->origin = s;
        c->next = d->captures;
        d->captures = c;
        s->cap = c;
        atomic_fetch_add_explicit(&d->n_captures, 1, memory_order_release);
    }
    pthread_mutex_unlock(&d->qmu);
    if (r)
        free(c);
    return r;
}

static void items_free(sim_item *it)
{
    while (it) {
        sim_item *next = it->next;
        free(it);
        it = next;
    }
}

int vmm_sim_driver_capture_end(vmm_driver *drv, void *sp, vmm_sim_graph **graph)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    if (!graph)
        return VMM_DRV_INVALID_VALUE;
    *graph = NULL;
    sim_device *d = dev_of(drv);
    vmm_sim_graph *g = calloc(1, sizeof *g);
    if (!g)
        return VMM_DRV_OUT_OF_MEMORY;
    int r = VMM_DRV_SUCCESS;
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = stream_find(d, sp);
    sim_capture *c = s ? s->cap : NULL;
    if (!s)
        r = VMM_DRV_INVALID_HANDLE;
    else if (!c)
        r = VMM_DRV_INVALID_VALUE;
    else if (c->origin != s)
        r = VMM_DRV_STREAM_CAPTURE_UNMATCHED;
    else if (c->mode != VMM_CAPTURE_MODE_RELAXED && !pthread_equal(c->owner, pthread_self()))
        r = VMM_DRV_STREAM_CAPTURE_WRONG_THREAD;
    if (r && c)
        c->invalidated = true;
    if (!r) {
        for (sim_stream *m = d->streams; m; m = m->next)
            if (m->cap == c)
                m->cap = NULL;
        for (sim_capture **pp = &d->captures; *pp; pp = &(*pp)->next)
            if (*pp == c) {
                *pp = c->next;
                break;
            }
        atomic_fetch_sub_explicit(&d->n_captures, 1, memory_order_release);
        if (c->invalidated) {
            r = VMM_DRV_STREAM_CAPTURE_INVALIDATED;
        } else {
            g->items = c->items;
            g->n_items = c->n_items;
            c->items = NULL;
        }
    }
    pthread_mutex_unlock(&d->qmu);
    if (!r) {
        *graph = g;
    } else {
        free(g);
    }
    if (c && (!r || r == VMM_DRV_STREAM_CAPTURE_INVALIDATED)) {
        items_free(c->items);
        free(c);
    }
    return r;
}

int vmm_sim_driver_graph_launch(vmm_driver *drv, vmm_sim_graph *g, void *sp)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    if (!g)
        return VMM_DRV_INVALID_VALUE;
    sim_device *d = dev_of(drv);
    /* The graph's memory must still be there: a replay touches every address it was captured with. */
    int r = VMM_DRV_SUCCESS;
    pthread_mutex_lock(&d->mu);
    for (const sim_item *it = g->items; it && !r; it = it->next)
        if ((it->kind == ITEM_MEMSET && !bytes_addressable(d, it->va, it->n * 4)) ||
            (it->kind == ITEM_MEMCPY && !bytes_addressable(d, it->va, it->n)))
            r = VMM_DRV_INVALID_VALUE;
    pthread_mutex_unlock(&d->mu);
    if (r)
        return r;
    sim_item *head = NULL, **link = &head;
    for (const sim_item *it = g->items; it; it = it->next) {
        sim_item *n = malloc(sizeof *n);
        if (!n) {
            items_free(head);
            return VMM_DRV_OUT_OF_MEMORY;
        }
        *n = *it;
        n->next = NULL;
        n->marker = NULL;
        *link = n;
        link = &n->next;
    }
    pthread_mutex_lock(&d->qmu);
    sim_stream *s = stream_find(d, sp);
    if (!s || s->cap) {
        r = s ? VMM_DRV_INVALID_VALUE : VMM_DRV_INVALID_HANDLE;
    } else {
        while (head) {
            sim_item *next = head->next;
            stream_push(d, s, head);
            head = next;
        }
    }
    pthread_mutex_unlock(&d->qmu);
    items_free(head);
    return r;
}

void vmm_sim_driver_graph_destroy(vmm_sim_graph *g)
{
    if (!g)
        return;
    items_free(g->items);
    free(g);
}

size_t vmm_sim_driver_graph_nodes(const vmm_sim_graph *g) { return g ? g->n_items : 0; }

/* ---- events ------------------------------------------------------------------------------------- */

static sim_event *event_find(sim_device *d, vmm_event e) { return hmap_get(&d->events, (uint64_t)(uintptr_t)e); }

static int sim_event_create(vmm_driver *drv, vmm_event *out)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_EVENT_CREATE);
    if (r)
        return r;
    if (!out)
        return call_end(d, VMM_SIM_CALL_EVENT_CREATE, VMM_DRV_INVALID_VALUE);
    sim_event *e = calloc(1, sizeof *e);
    pthread_mutex_lock(&d->qmu);
    if (e && hmap_reserve(&d->events, 1) == 0)
        hmap_put(&d->events, (uint64_t)(uintptr_t)e, e);
    else
        r = VMM_DRV_OUT_OF_MEMORY;
    pthread_mutex_unlock(&d->qmu);
    if (r) {
        free(e);
        return call_end(d, VMM_SIM_CALL_EVENT_CREATE, r);
    }
    live_add(d, LIVE_EVENTS, 1);
    *out = e;
    return VMM_DRV_SUCCESS;
}

/* Work already queued for the event keeps its marker: destroying a pending event is allowed, as
 * with cuEventDestroy, and does not wait. */
static int sim_event_destroy(vmm_driver *drv, vmm_event ev)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_EVENT_DESTROY);
    if (r)
        return r;
    pthread_mutex_lock(&d->qmu);
    sim_event *e = ev ? hmap_del(&d->events, (uint64_t)(uintptr_t)ev) : NULL;
    if (e)
        marker_unref(e->latest);
    pthread_mutex_unlock(&d->qmu);
    if (!e)
        return call_end(d, VMM_SIM_CALL_EVENT_DESTROY, VMM_DRV_INVALID_HANDLE);
    free(e);
    live_sub(d, LIVE_EVENTS, 1);
    return VMM_DRV_SUCCESS;
}

static int sim_event_record(vmm_driver *drv, vmm_event ev, void *sp)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_EVENT_RECORD);
    if (r)
        return r;
    sim_item *it = calloc(1, sizeof *it);
    sim_marker *m = calloc(1, sizeof *m);
    if (!it || !m) {
        free(it);
        free(m);
        return call_end(d, VMM_SIM_CALL_EVENT_RECORD, VMM_DRV_OUT_OF_MEMORY);
    }
    pthread_mutex_lock(&d->qmu);
    sim_event *e = ev ? event_find(d, ev) : NULL;
    sim_stream *s = stream_find(d, sp);
    if (e && s && s->cap) {
        /* a captured event: it stands for graph nodes, not for work that runs */
        int cr = s->cap->invalidated ? VMM_DRV_STREAM_CAPTURE_INVALIDATED : VMM_DRV_SUCCESS;
        if (!cr)
            e->cap_id = s->cap->id;
        pthread_mutex_unlock(&d->qmu);
        free(it);
        free(m);
        return call_end(d, VMM_SIM_CALL_EVENT_RECORD, cr);
    }
    if (e)
        e->cap_id = 0;
    bool idle = s && !s->head;
    if (e && s) {
        /* On an idle stream the marker is complete at once, as on a GPU with nothing queued (and
         * independent of when the worker thread gets a core) */
        m->refs = idle ? 1 : 2; /* the event and the queued marker item */
        m->done = idle;
        marker_unref(e->latest);
        e->latest = m;
        it->kind = ITEM_MARK;
        it->marker = m;
        if (!idle)
            stream_push(d, s, it);
    }
    pthread_mutex_unlock(&d->qmu);
    if (idle && e)
        free(it);
    if (!e || !s) {
        free(it);
        free(m);
        return call_end(d, VMM_SIM_CALL_EVENT_RECORD, VMM_DRV_INVALID_HANDLE);
    }
    return VMM_DRV_SUCCESS;
}

static int sim_event_query(vmm_driver *drv, vmm_event ev)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_EVENT_QUERY);
    if (r)
        return r;
    if ((r = capture_gate(d)) != 0)
        return call_end(d, VMM_SIM_CALL_EVENT_QUERY, r);
    pthread_mutex_lock(&d->qmu);
    sim_event *e = ev ? event_find(d, ev) : NULL;
    if (!e)
        r = VMM_DRV_INVALID_HANDLE;
    else if (e->cap_id)
        r = captured_event_locked(d, e);
    else if (e->latest && !e->latest->done)
        r = VMM_DRV_NOT_READY;
    pthread_mutex_unlock(&d->qmu);
    return call_end(d, VMM_SIM_CALL_EVENT_QUERY, r);
}

static int sim_event_sync(vmm_driver *drv, vmm_event ev)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_EVENT_SYNC);
    if (r)
        return r;
    if ((r = capture_gate(d)) != 0)
        return call_end(d, VMM_SIM_CALL_EVENT_SYNC, r);
    pthread_mutex_lock(&d->qmu);
    sim_event *e = ev ? event_find(d, ev) : NULL;
    if (e && e->cap_id) {
        r = captured_event_locked(d, e);
        pthread_mutex_unlock(&d->qmu);
        return call_end(d, VMM_SIM_CALL_EVENT_SYNC, r);
    }
    sim_marker *m = e ? e->latest : NULL;
    if (m) {
        /* hold the marker: the event may be re-recorded or destroyed while we wait */
        m->refs++;
        while (!m->done)
            pthread_cond_wait(&d->done_cv, &d->qmu);
        marker_unref(m);
    }
    pthread_mutex_unlock(&d->qmu);
    if (!e)
        return call_end(d, VMM_SIM_CALL_EVENT_SYNC, VMM_DRV_INVALID_HANDLE);
    pthread_mutex_lock(&d->mu);
    d->event_syncs++;
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

/* Later work on the stream waits for the event's latest record as of now; the host goes on. */
static int sim_stream_wait_event(vmm_driver *drv, void *sp, vmm_event ev)
{
    sim_device *d = dev_of(drv);
    int r = call_begin(d, VMM_SIM_CALL_STREAM_WAIT_EVENT);
    if (r)
        return r;
    sim_item *it = calloc(1, sizeof *it);
    if (!it)
        return call_end(d, VMM_SIM_CALL_STREAM_WAIT_EVENT, VMM_DRV_OUT_OF_MEMORY);
    pthread_mutex_lock(&d->qmu);
    sim_event *e = ev ? event_find(d, ev) : NULL;
    sim_stream *s = stream_find(d, sp);
    bool queued = false;
    if (!e || !s) {
        r = VMM_DRV_INVALID_HANDLE;
    } else if (s->cap || e->cap_id) {
        r = capture_wait_locked(d, s, e);
    } else if (e->latest && !e->latest->done) {
        e->latest->refs++;
        it->kind = ITEM_WAIT;
        it->marker = e->latest;
        stream_push(d, s, it);
        queued = true;
    }
    pthread_mutex_unlock(&d->qmu);
    if (!queued)
        free(it);
    return call_end(d, VMM_SIM_CALL_STREAM_WAIT_EVENT, r);
}

/* ---- shareable handles (POSIX file descriptors) -------------------------------------------------- */

/* These two are not driver ops (the contract has no sharing): the CUDA double (tests/cudadouble)
 * builds cuMemExportToShareableHandle / cuMemImportFromShareableHandle on them. They are not counted
 * as calls and take no injected faults (no call kind names them). */

/* A new descriptor (close-on-exec) of handle h's memfd: whoever holds it shares the memory. */
int vmm_sim_driver_export_fd(vmm_driver *drv, vmm_phys h, int *fd)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    if (!fd)
        return VMM_DRV_INVALID_VALUE;
    sim_device *d = dev_of(drv);
    if (!d->opt.vmm_supported || !d->opt.backed)
        return VMM_DRV_NOT_SUPPORTED; /* unbacked handles have no memory to share */
    int r = VMM_DRV_SUCCESS;
    pthread_mutex_lock(&d->mu);
    sim_phys *p = hmap_get(&d->handles, h);
    if (!p) {
        r = VMM_DRV_INVALID_HANDLE; /* as mem_map answers a released handle */
    } else {
        *fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
        if (*fd < 0)
            r = VMM_DRV_OUT_OF_MEMORY; /* the process ran out of descriptors */
    }
    pthread_mutex_unlock(&d->mu);
    return r;
}

/* A new handle on the memory behind fd (a memfd of a granularity-multiple size, as export_fd hands
 * out; the handle keeps its own descriptor, so the caller may close fd). Its size is the file's.
 * The memory already exists, on this device or another one (the exporter's), so the import is
 * not charged to capacity: like cuMemGetInfo on a GPU, free memory does not change when memory
 * is imported. The handle counts as live until released, as any other. */
int vmm_sim_driver_import_fd(vmm_driver *drv, int fd, vmm_phys *out)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    sim_device *d = dev_of(drv);
    if (!d->opt.vmm_supported || !d->opt.backed)
        return VMM_DRV_NOT_SUPPORTED;
    struct stat st;
    /* F_GET_SEALS answers only for a memfd: anything else was not exported by a sim */
    if (fd < 0 || fstat(fd, &st) != 0 || fcntl(fd, F_GET_SEALS) < 0 || st.st_size <= 0 ||
        !aligned(d, (uintptr_t)st.st_size))
        return VMM_DRV_INVALID_VALUE;
    sim_phys *p = calloc(1, sizeof *p);
    if (!p)
        return VMM_DRV_OUT_OF_MEMORY;
    p->fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    if (p->fd < 0) {
        free(p);
        return VMM_DRV_OUT_OF_MEMORY;
    }
    p->size = (size_t)st.st_size;
    p->charged = 0;
    pthread_mutex_lock(&d->mu);
    int r = hmap_reserve(&d->handles, 1) ? VMM_DRV_OUT_OF_MEMORY : VMM_DRV_SUCCESS;
    if (!r) {
        p->id = ++d->next_handle;
        hmap_put(&d->handles, p->id, p);
        live_add(d, LIVE_HANDLES, 1);
        *out = p->id;
    }
    pthread_mutex_unlock(&d->mu);
    if (r) {
        close(p->fd);
        free(p);
    }
    return r;
}

/* The same as driver ops (set_exportable / export_fd / import_fd), for the allocator's IPC. Every
 * handle of a backed sim is a memfd; set_exportable only decides which handles export_fd accepts,
 * as CUDA accepts only handles created with an exportable handle type. */
static int sim_set_exportable(vmm_driver *drv, int on)
{
    sim_device *d = dev_of(drv);
    if (on && (!d->opt.vmm_supported || !d->opt.backed))
        return VMM_DRV_NOT_SUPPORTED;
    pthread_mutex_lock(&d->mu);
    d->exportable = on != 0;
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

static int sim_export_fd(vmm_driver *drv, vmm_phys h, int *fd)
{
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    sim_phys *p = hmap_get(&d->handles, h);
    bool ok = p && p->exportable;
    pthread_mutex_unlock(&d->mu);
    if (p && !ok)
        return VMM_DRV_INVALID_VALUE; /* as cuMemExportToShareableHandle on a handle type NONE */
    return vmm_sim_driver_export_fd(drv, h, fd);
}

static int sim_import_fd(vmm_driver *drv, int fd, vmm_phys *out)
{
    int r = vmm_sim_driver_import_fd(drv, fd, out);
    if (r == VMM_DRV_SUCCESS) {
        sim_device *d = dev_of(drv);
        pthread_mutex_lock(&d->mu);
        sim_phys *p = hmap_get(&d->handles, *out);
        if (p)
            p->exportable = true; /* an imported memfd can be passed on again */
        pthread_mutex_unlock(&d->mu);
    }
    return r;
}

/* ---- counters, fault injection control ---------------------------------------------------------- */

int vmm_sim_driver_counters(vmm_driver *drv, vmm_sim_counters *out)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    sim_device *d = dev_of(drv);
    uint64_t v[LIVE_COUNT];
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&d->mu);
    memcpy(out->calls, d->calls, sizeof out->calls);
    memcpy(out->failures, d->failures, sizeof out->failures);
    out->device_syncs = d->device_syncs;
    out->stream_syncs = d->stream_syncs;
    out->event_syncs = d->event_syncs;
    out->driver_time_ns = d->driver_time_ns;
    for (int i = 0; i < LIVE_COUNT; i++)
        v[i] = atomic_load(&d->live[i]);
    pthread_mutex_unlock(&d->mu);
    out->capacity_bytes = d->opt.capacity;
    live_fill(out, v);
    out->creates_in_flight = atomic_load(&d->creates_in_flight);
    return VMM_DRV_SUCCESS;
}

/* The test setters' argument check: a sim driver, a call kind or -1 (every kind). */
static int setter_check(const vmm_driver *drv, int kind)
{
    if (!drv || !drv->is_sim)
        return VMM_DRV_NOT_SUPPORTED;
    return kind < -1 || kind >= VMM_SIM_CALL_COUNT ? VMM_DRV_INVALID_VALUE : VMM_DRV_SUCCESS;
}

/* nth == 0 cancels a pending nth failure of that kind. kind -1 counts calls of every kind that
 * "every kind" covers (see kind_in_any). */
int vmm_sim_driver_fail_nth(vmm_driver *drv, int kind, uint64_t nth)
{
    int r = setter_check(drv, kind);
    if (r)
        return r;
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    if (kind == -1)
        d->nth_any = nth;
    else
        d->nth_left[kind] = nth;
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

int vmm_sim_driver_on_call(vmm_driver *drv, int kind, vmm_sim_call_hook fn, void *arg)
{
    int r = setter_check(drv, kind);
    if (r)
        return r;
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    d->hook = fn;
    d->hook_arg = arg;
    d->hook_kind = kind;
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

static void fail_random_locked(sim_device *d, int kind, double p, uint64_t seed)
{
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        if (k == kind || (kind == -1 && kind_in_any(k)))
            d->fail_p[k] = p;
    d->rng = seed;
}

/* p in [0, 1]; 0 turns that kind's random failures off. The generator is reseeded each call. */
int vmm_sim_driver_fail_random(vmm_driver *drv, int kind, double p, uint64_t seed)
{
    int r = setter_check(drv, kind);
    if (r)
        return r;
    if (!(p >= 0.0 && p <= 1.0))
        return VMM_DRV_INVALID_VALUE;
    sim_device *d = dev_of(drv);
    pthread_mutex_lock(&d->mu);
    fail_random_locked(d, kind, p, seed);
    pthread_mutex_unlock(&d->mu);
    return VMM_DRV_SUCCESS;
}

/* ---- open / close ------------------------------------------------------------------------------- */

static void sim_close(vmm_driver *drv)
{
    if (!drv)
        return;
    sim_device *d = dev_of(drv);
    /* Streams first: their queued work may still touch memory. Captures never ended go with them. */
    pthread_mutex_lock(&d->qmu);
    sim_stream *list = d->streams;
    d->streams = NULL;
    d->default_stream = NULL;
    while (d->captures) {
        sim_capture *c = d->captures;
        d->captures = c->next;
        items_free(c->items);
        free(c);
    }
    pthread_mutex_unlock(&d->qmu);
    while (list) {
        sim_stream *next = list->next;
        stream_stop(d, list);
        list = next;
    }
    /* What is still live now is a leak: move it from the live sums to the leaked ones. */
    for (int i = 0; i < LIVE_COUNT; i++) {
        uint64_t v = atomic_load(&d->live[i]);
        atomic_fetch_sub(&g_live[i], v);
        atomic_fetch_add(&g_leaked[i], v);
    }
    for (size_t i = 0; i < d->events.cap; i++) {
        sim_event *e = d->events.vals[i];
        if (d->events.keys[i]) {
            marker_unref(e->latest);
            free(e);
        }
    }
    /* Released handles die with their last mapping; the others are in `handles`. */
    for (sim_mapping *m = d->mappings, *next; m; m = next) {
        next = m->next;
        if (--m->phys->n_mappings == 0 && m->phys->released) {
            if (m->phys->fd >= 0)
                close(m->phys->fd);
            free(m->phys);
        }
        free(m);
    }
    for (size_t i = 0; i < d->handles.cap; i++) {
        sim_phys *p = d->handles.vals[i];
        if (d->handles.keys[i]) {
            if (p->fd >= 0)
                close(p->fd);
            free(p);
        }
    }
    for (size_t i = 0; i < d->classic.cap; i++) {
        sim_classic *c = d->classic.vals[i];
        if (d->classic.keys[i]) {
            munmap((void *)c->ptr, c->map_len);
            free(c);
        }
    }
    for (size_t i = 0; i < d->host.cap; i++) {
        sim_host *h = d->host.vals[i];
        if (d->host.keys[i]) {
            munmap((void *)(uintptr_t)d->host.keys[i], h->map_len);
            free(h);
        }
    }
    for (size_t i = 0; i < d->n_res; i++) {
        munmap((void *)d->res[i]->va, d->res[i]->size);
        free(d->res[i]);
    }
    free(d->res);
    hmap_free(&d->pages);
    hmap_free(&d->handles);
    hmap_free(&d->classic);
    hmap_free(&d->host);
    hmap_free(&d->events);
    pthread_cond_destroy(&d->done_cv);
    pthread_mutex_destroy(&d->qmu);
    pthread_mutex_destroy(&d->mu);
    free(d);
}

static const vmm_driver_ops sim_ops = {
    .name = "sim",
    .device_info = sim_device_info,
    .mem_get_info = sim_mem_get_info,
    .va_reserve = sim_va_reserve,
    .va_free = sim_va_free,
    .mem_create = sim_mem_create,
    .mem_release = sim_mem_release,
    .mem_map = sim_mem_map,
    .mem_unmap = sim_mem_unmap,
    .set_access = sim_set_access,
    .mem_alloc = sim_mem_alloc,
    .mem_free = sim_mem_free,
    .stream_create = sim_stream_create,
    .stream_destroy = sim_stream_destroy,
    .stream_sync = sim_stream_sync,
    .device_sync = sim_device_sync,
    .event_create = sim_event_create,
    .event_record = sim_event_record,
    .event_query = sim_event_query,
    .event_sync = sim_event_sync,
    .event_destroy = sim_event_destroy,
    .stream_wait_event = sim_stream_wait_event,
    .stream_capture_info = sim_stream_capture_info,
    .capture_mode_exchange = sim_capture_mode_exchange,
    .launch_host = sim_launch_host,
    .memset32 = sim_memset32,
    .memcpy_dtoh = sim_memcpy_dtoh,
    .memcpy_htod = sim_memcpy_htod,
    .set_exportable = sim_set_exportable,
    .export_fd = sim_export_fd,
    .import_fd = sim_import_fd,
    .lookup_mapping = sim_lookup_mapping,
    .host_alloc = sim_host_alloc,
    .host_free = sim_host_free,
    .close = sim_close,
};

static int options_check(const vmm_sim_options *o)
{
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t g = o->granularity;
    if (g < page || (g & (g - 1)) != 0) {
        vmm_fail(VMM_ECONFIG, "sim: granularity %zu must be a power of two of at least the host page (%zu)",
                 g, page);
        return VMM_DRV_INVALID_VALUE;
    }
    if (o->capacity < g) {
        vmm_fail(VMM_ECONFIG, "sim: capacity %zu is below one granule (%zu)", o->capacity, g);
        return VMM_DRV_INVALID_VALUE;
    }
    if (o->fail_kind < -2 || o->fail_kind >= VMM_SIM_CALL_COUNT || !(o->fail_p >= 0.0 && o->fail_p <= 1.0)) {
        vmm_fail(VMM_ECONFIG, "sim: fault kind %d / probability %g out of range", o->fail_kind, o->fail_p);
        return VMM_DRV_INVALID_VALUE;
    }
    return VMM_DRV_SUCCESS;
}

int vmm_driver_sim_open(const vmm_sim_options *o, vmm_driver **out)
{
    vmm_sim_options defaults;
    if (!out)
        return VMM_DRV_INVALID_VALUE;
    *out = NULL;
    if (!o) {
        vmm_sim_default_options(&defaults);
        o = &defaults;
    }
    int r = options_check(o);
    if (r)
        return r;
    sim_device *d = calloc(1, sizeof *d);
    if (!d) {
        vmm_fail(VMM_EHOSTMEM, "sim: out of host memory");
        return VMM_DRV_OUT_OF_MEMORY;
    }
    d->base.ops = &sim_ops;
    d->base.is_sim = 1;
    d->opt = *o;
    d->exportable = o->backed && o->vmm_supported; /* every backed handle is a memfd */
    while (((size_t)1 << d->gran_shift) < o->granularity)
        d->gran_shift++;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->qmu, NULL);
    pthread_cond_init(&d->done_cv, NULL);
    if (o->fail_kind != -2)
        fail_random_locked(d, o->fail_kind, o->fail_p, o->fail_seed);
    sim_stream *s;
    r = stream_start(d, &s);
    if (r) {
        vmm_fail(VMM_EHOSTMEM, "sim: cannot start the default stream's thread");
        pthread_cond_destroy(&d->done_cv);
        pthread_mutex_destroy(&d->qmu);
        pthread_mutex_destroy(&d->mu);
        free(d);
        return r;
    }
    d->streams = d->default_stream = s;
    *out = &d->base;
    return VMM_DRV_SUCCESS;
}
