/*
 * Pinned host memory: a caching allocator over the driver's host_alloc / host_free
 * (cuMemHostAlloc / cuMemFreeHost), in the manner of PyTorch's caching host allocator.
 *
 * Every block is one host allocation of a power-of-two size class; blocks are never split, so a
 * free block of class c serves any request that rounds to c. A block is in one of three places:
 *  - live:    handed out; `uses` lists the streams it is used on (the allocation stream first),
 *             each with an event taken and prepared for it (event_prepare) when the use was
 *             recorded, so that the free needs nothing it could fail to get;
 *  - pending: freed, with one event recorded on each used stream, on the FIFO pending list;
 *  - cached:  every event completed, on the free list of its class.
 * A use whose event could not be had (or recorded) at free time stays unrecorded: the free still
 * succeeds, and polling records it later (late is safe: it covers more work than needed).
 * All blocks are in one hash table by address (bad-pointer checks, record_stream). Pending blocks
 * move to their free list when polling finds all their events complete; polling happens at each
 * malloc and empty_cache, and never blocks. host_free synchronizes the device (cudaFreeHost does),
 * which is the reason to cache at all, so only empty_cache and the out-of-memory retry call it.
 *
 * Locking: the state has its own mutex; the allocator's lock is taken only to create the state on
 * first use (a->pinned). Driver calls are made with the mutex held (the driver locks its own).
 */
#include <stdio.h>
#include <string.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "core/capture.h"
#include "core/counters.h"
#include "core/lock.h"
#include "core/types.h"
#include "driver/driver.h"
#include "features/pinned.h"

enum {
    PIN_MIN_SHIFT = 9,                 /* 512 B: smallest class, the device allocator's alignment */
    PIN_MAX_SHIFT = 62,                /* 2^62: larger requests cannot be rounded without overflow */
    PIN_CLASSES = PIN_MAX_SHIFT + 1,   /* free list per shift 0..62 (below 9 unused) */
    PIN_TABLE_MIN = 64,                /* hash buckets at start; doubled past 1 block per bucket */
    PIN_USES_MIN = 4,                  /* streams per block before the array grows */
};

typedef enum pin_state { PIN_LIVE, PIN_PENDING, PIN_CACHED } pin_state;

typedef struct pin_block {
    void *ptr;
    size_t size;                  /* class size, 2^shift */
    size_t requested;
    int shift;
    pin_state state;
    vmm_stream *uses;             /* streams using it ([0] the allocation stream) */
    uint32_t n_uses, cap_uses;
    vmm_event *events;            /* one per use, same capacity as uses; NULL: none yet */
    uint32_t n_events;            /* pending: uses [0, n_events) are recorded, the rest not yet */
    struct pin_block *hnext;      /* hash chain */
    struct pin_block *prev, *next; /* pending list or free list of its class */
} pin_block;

typedef struct vmm_pinned vmm_pinned;

struct vmm_pinned {
    pthread_mutex_t mu;
    vmm_driver *drv;
    vmm_meta *meta;
    pin_block **table;
    size_t table_cap, n_blocks;
    pin_block *free_list[PIN_CLASSES];
    pin_block *pending_head, *pending_tail;
    vmm_event *idle_events;
    size_t n_idle, cap_idle;
    vmm_pinned_stats st;
};

/* ---- state creation ------------------------------------------------------------------------ */

static vmm_pinned *pinned_state(vmm_allocator *a, int create, int *rc)
{
    *rc = VMM_OK;
    vmm_lock(a);
    vmm_pinned *p = a->pinned;
    if (!p && create) {
        if (!a->drv->ops->host_alloc || !a->drv->ops->host_free) {
            *rc = vmm_fail(VMM_ENOTSUP, "pinned memory: the %s driver has no host allocation",
                           a->drv->ops->name);
        } else if (!(p = vmm_meta_alloc(a->meta, sizeof *p))) {
            *rc = vmm_fail(VMM_EHOSTMEM, "pinned memory: out of host memory for its state");
        } else if (pthread_mutex_init(&p->mu, NULL)) {
            vmm_meta_free(a->meta, p, sizeof *p);
            p = NULL;
            *rc = vmm_fail(VMM_EHOSTMEM, "pinned memory: pthread_mutex_init failed");
        } else {
            p->drv = a->drv;
            p->meta = a->meta;
            a->pinned = p;
        }
    }
    vmm_unlock(a);
    return p;
}

/* ---- hash table of every block ------------------------------------------------------------- */

static size_t pin_hash(const void *ptr, size_t cap)
{
    /* Fibonacci hashing; blocks are page aligned, so the low bits carry nothing. */
    return (size_t)(((uint64_t)(uintptr_t)ptr * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static pin_block *table_find(const vmm_pinned *p, const void *ptr)
{
    if (!p->table_cap)
        return NULL;
    for (pin_block *b = p->table[pin_hash(ptr, p->table_cap)]; b; b = b->hnext)
        if (b->ptr == ptr)
            return b;
    return NULL;
}

/* Make room for one more block; 0 on success. */
static int table_reserve(vmm_pinned *p)
{
    if (p->n_blocks + 1 <= p->table_cap)
        return 0;
    size_t ncap = p->table_cap ? p->table_cap * 2 : PIN_TABLE_MIN;
    pin_block **nt = vmm_meta_alloc(p->meta, ncap * sizeof *nt);
    if (!nt)
        return -1;
    for (size_t i = 0; i < p->table_cap; i++) {
        for (pin_block *b = p->table[i], *next; b; b = next) {
            next = b->hnext;
            size_t h = pin_hash(b->ptr, ncap);
            b->hnext = nt[h];
            nt[h] = b;
        }
    }
    if (p->table)
        vmm_meta_free(p->meta, p->table, p->table_cap * sizeof *nt);
    p->table = nt;
    p->table_cap = ncap;
    return 0;
}

static void table_insert(vmm_pinned *p, pin_block *b)
{
    size_t h = pin_hash(b->ptr, p->table_cap);
    b->hnext = p->table[h];
    p->table[h] = b;
    p->n_blocks++;
}

static void table_remove(vmm_pinned *p, pin_block *b)
{
    pin_block **pp = &p->table[pin_hash(b->ptr, p->table_cap)];
    while (*pp != b)
        pp = &(*pp)->hnext;
    *pp = b->hnext;
    p->n_blocks--;
}

/* ---- lists --------------------------------------------------------------------------------- */

static void free_push(vmm_pinned *p, pin_block *b)
{
    b->state = PIN_CACHED;
    b->prev = NULL;
    b->next = p->free_list[b->shift];
    if (b->next)
        b->next->prev = b;
    p->free_list[b->shift] = b;
    p->st.cached_blocks++;
}

static void free_unlink(vmm_pinned *p, pin_block *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        p->free_list[b->shift] = b->next;
    if (b->next)
        b->next->prev = b->prev;
    b->prev = b->next = NULL;
    p->st.cached_blocks--;
}

static void pending_append(vmm_pinned *p, pin_block *b)
{
    b->state = PIN_PENDING;
    b->next = NULL;
    b->prev = p->pending_tail;
    if (p->pending_tail)
        p->pending_tail->next = b;
    else
        p->pending_head = b;
    p->pending_tail = b;
    p->st.pending_blocks++;
}

static void pending_unlink(vmm_pinned *p, pin_block *b)
{
    if (b->prev)
        b->prev->next = b->next;
    else
        p->pending_head = b->next;
    if (b->next)
        b->next->prev = b->prev;
    else
        p->pending_tail = b->prev;
    b->prev = b->next = NULL;
    p->st.pending_blocks--;
}

/* ---- events -------------------------------------------------------------------------------- */

/* An idle event or a new one; 0, or -1 (no message: callers go on without and retry later). */
static int event_take(vmm_pinned *p, vmm_event *out)
{
    if (p->n_idle) {
        *out = p->idle_events[--p->n_idle];
        return 0;
    }
    /* room to take it back first, so event_put never fails */
    if ((size_t)p->st.num_events + 1 > p->cap_idle) {
        size_t ncap = p->cap_idle ? p->cap_idle * 2 : 16;
        vmm_event *ne = vmm_meta_alloc(p->meta, ncap * sizeof *ne);
        if (!ne)
            return -1;
        if (p->idle_events) {
            memcpy(ne, p->idle_events, p->n_idle * sizeof *ne);
            vmm_meta_free(p->meta, p->idle_events, p->cap_idle * sizeof *ne);
        }
        p->idle_events = ne;
        p->cap_idle = ncap;
    }
    if (p->drv->ops->event_create(p->drv, out) != VMM_DRV_SUCCESS)
        return -1;
    p->st.num_events++;
    return 0;
}

static void event_put(vmm_pinned *p, vmm_event e) { p->idle_events[p->n_idle++] = e; }

/* An event made recordable on stream s (which may belong to any device's context), or NULL. */
static vmm_event event_for_use(vmm_pinned *p, vmm_stream s)
{
    vmm_event e = NULL;
    if (event_take(p, &e))
        return NULL;
    if (p->drv->ops->event_prepare && p->drv->ops->event_prepare(p->drv, e, s) != VMM_DRV_SUCCESS) {
        event_put(p, e);
        return NULL;
    }
    return e;
}

/* Take use i out, its event (if any) back to the pool, keeping the recorded uses in front. */
static void slot_drop(vmm_pinned *p, pin_block *b, uint32_t i)
{
    if (b->events[i])
        event_put(p, b->events[i]);
    uint32_t last = b->n_uses - 1;
    if (i < b->n_events) {
        uint32_t last_rec = b->n_events - 1;
        b->uses[i] = b->uses[last_rec];
        b->events[i] = b->events[last_rec];
        b->uses[last_rec] = b->uses[last];
        b->events[last_rec] = b->events[last];
        b->n_events--;
    } else {
        b->uses[i] = b->uses[last];
        b->events[i] = b->events[last];
    }
    b->n_uses--;
}

/* Record the unrecorded uses that can be (an event got and prepared first where missing). */
static void slots_record(vmm_pinned *p, pin_block *b)
{
    for (uint32_t i = b->n_events; i < b->n_uses; i++) {
        /* an event recorded on a capturing stream would be a graph node (capture.c): the next poll
         * after the capture records it */
        int capturing = 0;
        uint64_t cid = 0;
        if (p->drv->ops->stream_capture_info &&
            p->drv->ops->stream_capture_info(p->drv, b->uses[i], &capturing, &cid) == VMM_DRV_SUCCESS &&
            capturing)
            continue;
        if (!b->events[i] && !(b->events[i] = event_for_use(p, b->uses[i])))
            continue;
        if (p->drv->ops->event_record(p->drv, b->events[i], b->uses[i]) != VMM_DRV_SUCCESS)
            continue; /* keeps its prepared event: retried at the next poll */
        uint32_t k = b->n_events++;
        vmm_stream su = b->uses[i];
        vmm_event se = b->events[i];
        b->uses[i] = b->uses[k];
        b->events[i] = b->events[k];
        b->uses[k] = su;
        b->events[k] = se;
    }
}

/* Poll the pending blocks (oldest first, all of them: streams complete out of order), recording
 * the uses not recorded yet first. A block with every use recorded and completed goes to its free
 * list. Never blocks. */
static void pending_poll(vmm_pinned *p)
{
    for (pin_block *b = p->pending_head, *next; b; b = next) {
        next = b->next;
        if (b->n_events < b->n_uses)
            slots_record(p, b);
        for (uint32_t i = b->n_events; i-- > 0;)
            if (p->drv->ops->event_query(p->drv, b->events[i]) == VMM_DRV_SUCCESS)
                slot_drop(p, b, i); /* else not ready, or a failing query: ask again later */
        if (b->n_uses == 0) {
            pending_unlink(p, b);
            free_push(p, b);
        }
    }
}

/* ---- blocks -------------------------------------------------------------------------------- */

static void stats_live(vmm_pinned *p, const pin_block *b, int sign)
{
    vmm_stat_add(&p->st.allocations, sign);
    vmm_stat_add(&p->st.allocated_bytes, sign * (int64_t)b->size);
    vmm_stat_add(&p->st.requested_bytes, sign * (int64_t)b->requested);
}

static void block_delete(vmm_pinned *p, pin_block *b)
{
    if (b->uses)
        vmm_meta_free(p->meta, b->uses, b->cap_uses * sizeof *b->uses);
    if (b->events)
        vmm_meta_free(p->meta, b->events, b->cap_uses * sizeof *b->events);
    vmm_meta_free(p->meta, b, sizeof *b);
}

/* Return a cached block to the driver. */
static int block_release(vmm_pinned *p, pin_block *b)
{
    int r = p->drv->ops->host_free(p->drv, b->ptr);
    if (r)
        return vmm_fail_drv(r, "pinned memory: host_free");
    free_unlink(p, b);
    table_remove(p, b);
    p->st.num_host_free++;
    vmm_stat_add(&p->st.reserved_bytes, -(int64_t)b->size);
    vmm_stat_add(&p->st.segments, -1);
    block_delete(p, b);
    return VMM_OK;
}

/* Release every cached block; returns VMM_OK or the first failure (the others are still tried). */
static int release_cached(vmm_pinned *p)
{
    int rc = VMM_OK;
    for (int c = 0; c < PIN_CLASSES; c++) {
        for (pin_block *b = p->free_list[c], *next; b; b = next) {
            next = b->next;
            int r = block_release(p, b);
            if (r && rc == VMM_OK)
                rc = r;
        }
    }
    return rc;
}

/* Grow b's stream arrays (uses and events keep one capacity). */
static int block_reserve_use(vmm_pinned *p, pin_block *b)
{
    if (b->n_uses < b->cap_uses)
        return VMM_OK;
    uint32_t ncap = b->cap_uses ? b->cap_uses * 2 : PIN_USES_MIN;
    vmm_stream *nu = vmm_meta_alloc(p->meta, ncap * sizeof *nu);
    vmm_event *ne = vmm_meta_alloc(p->meta, ncap * sizeof *ne);
    if (!nu || !ne) {
        if (nu)
            vmm_meta_free(p->meta, nu, ncap * sizeof *nu);
        if (ne)
            vmm_meta_free(p->meta, ne, ncap * sizeof *ne);
        return vmm_fail(VMM_EHOSTMEM, "pinned memory: out of host memory for stream uses");
    }
    if (b->uses) {
        memcpy(nu, b->uses, b->n_uses * sizeof *nu);
        memcpy(ne, b->events, b->n_uses * sizeof *ne);
        vmm_meta_free(p->meta, b->uses, b->cap_uses * sizeof *nu);
        vmm_meta_free(p->meta, b->events, b->cap_uses * sizeof *ne);
    }
    b->uses = nu;
    b->events = ne;
    b->cap_uses = ncap;
    return VMM_OK;
}

/* A new block of class `shift` from the driver (retrying once after releasing the cache, unless
 * no_sync: a capture is underway, and host_free would synchronize the device, invalidating it). */
static int block_new(vmm_pinned *p, int shift, int no_sync, pin_block **out)
{
    size_t size = (size_t)1 << shift;
    pin_block *b = vmm_meta_alloc(p->meta, sizeof *b);
    if (!b || table_reserve(p) || block_reserve_use(p, b)) {
        if (b)
            block_delete(p, b);
        return vmm_fail(VMM_EHOSTMEM, "pinned memory: out of host memory for block records");
    }
    void *ptr = NULL;
    int r = p->drv->ops->host_alloc(p->drv, size, &ptr);
    int emptied = 0;
    if (r == VMM_DRV_OUT_OF_MEMORY && p->st.cached_blocks && !no_sync) {
        release_cached(p);
        emptied = 1;
        r = p->drv->ops->host_alloc(p->drv, size, &ptr);
    }
    if (r) {
        block_delete(p, b);
        if (r == VMM_DRV_OUT_OF_MEMORY)
            return vmm_fail(VMM_EHOSTMEM,
                            "pinned memory: cannot pin %zu more bytes of host memory (%lld bytes "
                            "pinned in %lld blocks, %lld of them in use; %s)",
                            size, (long long)p->st.reserved_bytes.current,
                            (long long)p->st.segments.current, (long long)p->st.allocations.current,
                            emptied           ? "the cache was emptied"
                            : p->st.cached_blocks ? "the cache was not emptied: a CUDA graph capture is "
                                                    "underway, and freeing host memory synchronizes "
                                                    "the device: capture prevented the sync"
                                              : "nothing was cached");
        return vmm_fail_drv(r, "pinned memory: host_alloc");
    }
    b->ptr = ptr;
    b->size = size;
    b->shift = shift;
    table_insert(p, b);
    p->st.num_host_alloc++;
    vmm_stat_add(&p->st.reserved_bytes, (int64_t)size);
    vmm_stat_add(&p->st.segments, 1);
    *out = b;
    return VMM_OK;
}

static int class_shift(size_t size)
{
    int s = PIN_MIN_SHIFT;
    while (((size_t)1 << s) < size)
        s++;
    return s;
}

/* ---- public -------------------------------------------------------------------------------- */

VMM_API int vmm_pinned_malloc(vmm_allocator *a, size_t size, vmm_stream stream, void **ptr)
{
    if (!a || !ptr)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_malloc: %s is NULL", a ? "ptr" : "allocator");
    *ptr = NULL;
    if (size == 0)
        return VMM_OK;
    if (size > ((size_t)1 << PIN_MAX_SHIFT))
        return vmm_fail(VMM_EINVAL, "vmm_pinned_malloc: size %zu is too large", size);
    int rc;
    vmm_pinned *p = pinned_state(a, 1, &rc);
    if (!p)
        return rc;
    int shift = class_shift(size);
    int mode = vmm_capture_relax(a); /* event queries, host_alloc: not to invalidate a capture */
    pthread_mutex_lock(&p->mu);
    pending_poll(p);
    pin_block *b = p->free_list[shift];
    int reused = b != NULL;
    if (!b) {
        /* A miss (host_alloc ahead, far dearer than a lock): whether captures are underway as the
         * device pools see them (capture.c), since then the cache must not be emptied. The
         * allocator's lock is taken without p->mu (vmm_destroy takes them in that order). */
        pthread_mutex_unlock(&p->mu);
        vmm_lock(a);
        int no_sync = vmm_capture_no_sync(a, stream);
        vmm_unlock(a);
        pthread_mutex_lock(&p->mu);
        b = p->free_list[shift];
        reused = b != NULL;
        if (!b)
            rc = block_new(p, shift, no_sync, &b);
    }
    if (reused) {
        free_unlink(p, b);
        p->st.num_reuses++;
    }
    if (rc == VMM_OK) {
        b->state = PIN_LIVE;
        b->requested = size;
        b->uses[0] = stream; /* capacity is at least PIN_USES_MIN */
        b->events[0] = event_for_use(p, stream); /* NULL: the free tries again */
        b->n_uses = 1;
        b->n_events = 0;
        stats_live(p, b, 1);
        *ptr = b->ptr;
    }
    pthread_mutex_unlock(&p->mu);
    vmm_capture_restore(a, mode);
    return rc;
}

/* The live block at ptr with p->mu held, or NULL with the message set. */
static pin_block *live_block(vmm_pinned *p, const void *ptr, const char *fn)
{
    pin_block *b = p ? table_find(p, ptr) : NULL;
    if (!b)
        vmm_fail(VMM_EBADPTR, "%s: %p was not returned by vmm_pinned_malloc of this allocator, or "
                              "is an interior pointer", fn, ptr);
    else if (b->state != PIN_LIVE)
        vmm_fail(VMM_EBADPTR, "%s: %p was already freed", fn, ptr);
    return b && b->state == PIN_LIVE ? b : NULL;
}

VMM_API int vmm_pinned_free(vmm_allocator *a, void *ptr)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_free: allocator is NULL");
    if (!ptr)
        return VMM_OK;
    int rc;
    vmm_pinned *p = pinned_state(a, 0, &rc);
    if (!p) {
        live_block(NULL, ptr, "vmm_pinned_free"); /* sets the message */
        return VMM_EBADPTR;
    }
    pthread_mutex_lock(&p->mu);
    pin_block *b = live_block(p, ptr, "vmm_pinned_free");
    if (!b) {
        rc = VMM_EBADPTR;
    } else {
        /* Record the events prepared when the uses were recorded. Cannot fail: a use that cannot
         * be recorded now stays unrecorded and polling retries it, so a caller that cannot retry
         * a failed free never leaks the block. */
        b->n_events = 0;
        slots_record(p, b);
        stats_live(p, b, -1);
        b->requested = 0;
        pending_append(p, b);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

VMM_API int vmm_pinned_record_stream(vmm_allocator *a, void *ptr, vmm_stream stream)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_record_stream: allocator is NULL");
    int rc;
    vmm_pinned *p = pinned_state(a, 0, &rc);
    if (!p) {
        live_block(NULL, ptr, "vmm_pinned_record_stream"); /* sets the message */
        return VMM_EBADPTR;
    }
    pthread_mutex_lock(&p->mu);
    pin_block *b = live_block(p, ptr, "vmm_pinned_record_stream");
    if (!b) {
        rc = VMM_EBADPTR;
    } else {
        uint32_t i = 0;
        while (i < b->n_uses && b->uses[i] != stream)
            i++;
        if (i == b->n_uses) {
            rc = block_reserve_use(p, b);
            if (rc == VMM_OK) {
                b->uses[i] = stream;
                b->events[i] = NULL;
                b->n_uses++;
            }
        }
        /* the free's event, now (prepared for `stream`, maybe another device's); without one the
         * use is kept all the same and the free tries again */
        if (rc == VMM_OK && !b->events[i])
            b->events[i] = event_for_use(p, stream);
    }
    pthread_mutex_unlock(&p->mu);
    return rc;
}

VMM_API int vmm_pinned_empty_cache(vmm_allocator *a)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_empty_cache: allocator is NULL");
    int rc;
    vmm_pinned *p = pinned_state(a, 0, &rc);
    if (!p)
        return VMM_OK;
    int mode = vmm_capture_relax(a);
    pthread_mutex_lock(&p->mu);
    pending_poll(p);
    rc = release_cached(p);
    pthread_mutex_unlock(&p->mu);
    vmm_capture_restore(a, mode);
    return rc;
}

VMM_API size_t vmm_pinned_usable_size(vmm_allocator *a, const void *ptr)
{
    int rc;
    vmm_pinned *p = a && ptr ? pinned_state(a, 0, &rc) : NULL;
    if (!p)
        return 0;
    pthread_mutex_lock(&p->mu);
    const pin_block *b = table_find(p, ptr);
    size_t n = b && b->state == PIN_LIVE ? b->size : 0;
    pthread_mutex_unlock(&p->mu);
    return n;
}

VMM_API int vmm_pinned_get_stats(vmm_allocator *a, vmm_pinned_stats *out)
{
    if (!a || !out)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_get_stats: NULL argument");
    int rc;
    vmm_pinned *p = pinned_state(a, 0, &rc);
    if (!p) {
        memset(out, 0, sizeof *out);
        return VMM_OK;
    }
    pthread_mutex_lock(&p->mu);
    *out = p->st;
    pthread_mutex_unlock(&p->mu);
    return VMM_OK;
}

static void stat_reset(vmm_stat *s, int cumulative)
{
    s->peak = s->current;
    if (cumulative)
        s->allocated = s->freed = 0;
}

VMM_API int vmm_pinned_reset_stats(vmm_allocator *a, int cumulative)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_reset_stats: allocator is NULL");
    int rc;
    vmm_pinned *p = pinned_state(a, 0, &rc);
    if (!p)
        return VMM_OK;
    pthread_mutex_lock(&p->mu);
    stat_reset(&p->st.allocations, cumulative);
    stat_reset(&p->st.allocated_bytes, cumulative);
    stat_reset(&p->st.requested_bytes, cumulative);
    stat_reset(&p->st.reserved_bytes, cumulative);
    stat_reset(&p->st.segments, cumulative);
    if (cumulative)
        p->st.num_host_alloc = p->st.num_host_free = p->st.num_reuses = p->st.num_event_waits = 0;
    pthread_mutex_unlock(&p->mu);
    return VMM_OK;
}

/* Append to buf at *off, keeping track of the length needed even past the end. */
static void json_put(char *buf, size_t len, size_t *off, const char *key, int64_t v)
{
    char tmp[128];
    int n = snprintf(tmp, sizeof tmp, "%s\"pinned.%s\":%lld", *off > 1 ? "," : "", key, (long long)v);
    if (*off < len)
        snprintf(buf + *off, len - *off, "%s", tmp);
    *off += (size_t)n;
}

static void json_stat(char *buf, size_t len, size_t *off, const char *name, const vmm_stat *s)
{
    static const char *const parts[] = {"current", "peak", "allocated", "freed"};
    const int64_t v[] = {s->current, s->peak, s->allocated, s->freed};
    char key[96];
    for (int i = 0; i < 4; i++) {
        snprintf(key, sizeof key, "%s.%s", name, parts[i]);
        json_put(buf, len, off, key, v[i]);
    }
}

VMM_API int vmm_pinned_stats_json(vmm_allocator *a, char *buf, size_t len)
{
    vmm_pinned_stats s = {0};
    if (!buf || len == 0)
        return vmm_fail(VMM_EINVAL, "vmm_pinned_stats_json: no buffer");
    int rc = vmm_pinned_get_stats(a, &s);
    if (rc)
        return rc;
    size_t off = 1;
    buf[0] = '{';
    if (len > 1)
        buf[1] = '\0';
    json_stat(buf, len, &off, "allocations", &s.allocations);
    json_stat(buf, len, &off, "allocated_bytes", &s.allocated_bytes);
    json_stat(buf, len, &off, "requested_bytes", &s.requested_bytes);
    json_stat(buf, len, &off, "reserved_bytes", &s.reserved_bytes);
    json_stat(buf, len, &off, "segments", &s.segments);
    json_put(buf, len, &off, "pending_blocks", s.pending_blocks);
    json_put(buf, len, &off, "cached_blocks", s.cached_blocks);
    json_put(buf, len, &off, "num_host_alloc", s.num_host_alloc);
    json_put(buf, len, &off, "num_host_free", s.num_host_free);
    json_put(buf, len, &off, "num_reuses", s.num_reuses);
    json_put(buf, len, &off, "num_event_waits", s.num_event_waits);
    json_put(buf, len, &off, "num_events", s.num_events);
    if (off + 2 > len) {
        buf[len - 1] = '\0';
        return vmm_fail(VMM_ERANGE, "vmm_pinned_stats_json: buffer of %zu bytes too small (%zu needed)",
                        len, off + 2);
    }
    buf[off] = '}';
    buf[off + 1] = '\0';
    return (int)(off + 1);
}

/* ---- teardown ------------------------------------------------------------------------------ */

void vmm_pinned_destroy(vmm_allocator *a)
{
    vmm_pinned *p = a->pinned;
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    /* Pending blocks: vmm_destroy may wait, and must before the memory goes. A use that still
     * cannot be recorded is waited for by synchronizing its stream. */
    for (pin_block *b = p->pending_head; b; b = b->next) {
        if (b->n_events < b->n_uses)
            slots_record(p, b);
        for (uint32_t i = 0; i < b->n_uses; i++) {
            if (i < b->n_events) {
                if (p->drv->ops->event_query(p->drv, b->events[i]) != VMM_DRV_SUCCESS) {
                    p->drv->ops->event_sync(p->drv, b->events[i]);
                    p->st.num_event_waits++;
                }
            } else {
                p->drv->ops->stream_sync(p->drv, b->uses[i]);
                p->st.num_event_waits++;
            }
        }
        while (b->n_uses)
            slot_drop(p, b, b->n_uses - 1);
    }
    /* live blocks hold the events prepared for their uses */
    for (size_t i = 0; i < p->table_cap; i++)
        for (pin_block *b = p->table[i]; b; b = b->hnext)
            if (b->state == PIN_LIVE)
                while (b->n_uses)
                    slot_drop(p, b, b->n_uses - 1);
    if (p->st.allocations.current)
        fprintf(stderr, "vmmalloc: vmm_destroy: %lld pinned block(s), %lld bytes, still allocated; "
                        "returning their memory anyway\n",
                (long long)p->st.allocations.current, (long long)p->st.allocated_bytes.current);
    for (size_t i = 0; i < p->table_cap; i++) {
        for (pin_block *b = p->table[i], *next; b; b = next) {
            next = b->hnext;
            /* the last chance: a transient refusal must not leak the block */
            int r = VMM_DRV_SUCCESS;
            for (int t = 0; t < 8 && (t == 0 || r != VMM_DRV_SUCCESS); t++)
                r = p->drv->ops->host_free(p->drv, b->ptr);
            if (r != VMM_DRV_SUCCESS)
                fprintf(stderr, "vmmalloc: vmm_destroy: a pinned block of %zu bytes could not be freed "
                                "(%s)\n", b->size, vmm_drv_result_name(r));
            block_delete(p, b);
        }
    }
    for (size_t i = 0; i < p->n_idle; i++) {
        int r = VMM_DRV_SUCCESS; /* tried again as the blocks above */
        for (int t = 0; t < 8 && (t == 0 || r != VMM_DRV_SUCCESS); t++)
            r = p->drv->ops->event_destroy(p->drv, p->idle_events[i]);
        if (r != VMM_DRV_SUCCESS)
            fprintf(stderr, "vmmalloc: vmm_destroy: a pinned event could not be destroyed (%s)\n",
                    vmm_drv_result_name(r));
    }
    if (p->idle_events)
        vmm_meta_free(p->meta, p->idle_events, p->cap_idle * sizeof *p->idle_events);
    if (p->table)
        vmm_meta_free(p->meta, p->table, p->table_cap * sizeof *p->table);
    pthread_mutex_unlock(&p->mu);
    pthread_mutex_destroy(&p->mu);
    vmm_meta_free(a->meta, p, sizeof *p);
    a->pinned = NULL;
}
