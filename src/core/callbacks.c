/*
 * Callbacks: free-memory callbacks (PyTorch's FreeMemoryCallback, run on a cache miss) and mapping
 * callbacks (after_map / before_unmap, for communication libraries that follow physical mappings).
 *
 * Neither kind runs under the allocator's lock. Free-memory callbacks run from malloc with the lock
 * released (malloc then looks in the cache again). Mapping notices are queued under the lock by
 * whatever maps or unmaps pages, and delivered, in queue order, by the thread of that call before
 * it returns (vmm_unlock_deliver): the lock released, a delivery mutex held so that notices of
 * several threads keep their order. A page can only be unmapped after its before_unmap returned, so
 * reclaiming idle pages with mapping callbacks set detaches them instead (vmm_cb_detach): the whole
 * pages become a DETACHING block, in no index and mapped, their before_unmap is queued, and the
 * delivering thread unmaps them afterwards (vmm_seg_finish_detached); their handles then go to the
 * cache. An allocation short of memory while pages wait there is retried after the delivery
 * (alloc.c). Sleep and wake queue notices for the pages they unmap and map (sleep.c).
 *
 * Locking: the list of free-memory callbacks, the queue and the detach list are under the
 * allocator's lock; delivery_mu orders deliveries and is held while callbacks run. A callback may
 * call the allocator: nested calls on the delivering thread do not deliver (the outer delivery
 * loop picks up what they queue) and do not run the free-memory callbacks again.
 */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "core/callbacks.h"
#include "core/capture.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/segment.h"
#include "core/tcache.h"
#include "core/types.h"

enum {
    FREE_CB_MAX = 32, /* free-memory callbacks per allocator */
    NOTICE_MAP = 0,
    NOTICE_UNMAP = 1,
};

typedef struct vmm_cb_notice notice;
struct vmm_cb_notice {
    struct vmm_cb_notice *next;
    int kind;             /* NOTICE_MAP (after_map) or NOTICE_UNMAP (before_unmap) */
    uintptr_t va;
    size_t size;
    size_t n, cap;        /* handles */
    uint64_t *handles;
    vmm_block *detach;    /* before_unmap of a DETACHING block: it may be unmapped once delivered */
};

typedef struct free_cb {
    vmm_free_memory_fn fn;
    void *ctx;
} free_cb;

typedef struct detached {
    vmm_block *b;
    int ready;            /* its before_unmap was delivered: unmap it */
} detached;

typedef struct vmm_cb vmm_cb;
struct vmm_cb {
    free_cb fcb[FREE_CB_MAX];
    int n_fcb;
    int running;          /* free-memory runs in progress (lock released) */
    vmm_mapping_fn after_map, before_unmap;
    void *ctx;
    notice *head, *tail;  /* queued notices, oldest first */
    notice *spare;        /* made by vmm_cb_reserve for the next vmm_cb_mapped */
    detached *det;
    size_t n_det, cap_det;
    pthread_mutex_t delivery_mu;
};

/* The allocator this thread delivers notices of (nested calls do not deliver again), and whether
 * it runs free-memory callbacks now (nested misses do not run them again). */
static _Thread_local vmm_allocator *tls_delivering;
static _Thread_local vmm_allocator *tls_freeing;

static vmm_cb *cb_get(vmm_allocator *a)
{
    if (a->cb)
        return a->cb;
    vmm_cb *cb = vmm_meta_alloc(a->meta, sizeof *cb);
    if (!cb)
        return NULL;
    if (pthread_mutex_init(&cb->delivery_mu, NULL)) {
        vmm_meta_free(a->meta, cb, sizeof *cb);
        return NULL;
    }
    vmm_tc_off(a); /* callbacks see every mapping change in order: all under the lock */
    a->cb = cb;
    return cb;
}

/* ---- notices ------------------------------------------------------------------------------ */

static notice *notice_new(vmm_allocator *a, size_t cap)
{
    notice *n = vmm_meta_alloc(a->meta, sizeof *n);
    uint64_t *h = cap ? vmm_meta_alloc(a->meta, cap * sizeof *h) : NULL;
    if (!n || (cap && !h)) {
        if (n)
            vmm_meta_free(a->meta, n, sizeof *n);
        if (h)
            vmm_meta_free(a->meta, h, cap * sizeof *h);
        return NULL;
    }
    n->handles = h;
    n->cap = cap;
    return n;
}

static void notice_free(vmm_allocator *a, notice *n)
{
    if (n->handles)
        vmm_meta_free(a->meta, n->handles, n->cap * sizeof *n->handles);
    vmm_meta_free(a->meta, n, sizeof *n);
}

static void notice_fill(notice *n, int kind, const vmm_segment *seg, size_t p0, size_t pages)
{
    n->kind = kind;
    n->va = seg->base + p0 * seg->page_size;
    n->size = pages * seg->page_size;
    n->n = pages;
    for (size_t i = 0; i < pages; i++)
        n->handles[i] = (uint64_t)seg->pages[p0 + i];
    n->next = NULL;
}

static void enqueue(vmm_cb *cb, notice *n)
{
    n->next = NULL;
    if (cb->tail)
        cb->tail->next = n;
    else
        cb->head = n;
    cb->tail = n;
}

int vmm_cb_reserve(vmm_allocator *a, size_t n)
{
    vmm_cb *cb = a->cb;
    if (cb->spare && cb->spare->cap >= n)
        return VMM_OK;
    notice *s = notice_new(a, n < 16 ? 16 : n);
    if (!s)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for an after_map notice");
    if (cb->spare)
        notice_free(a, cb->spare);
    cb->spare = s;
    return VMM_OK;
}

void vmm_cb_mapped(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n)
{
    vmm_cb *cb = a->cb;
    notice *s = cb->spare;
    cb->spare = NULL;
    notice_fill(s, NOTICE_MAP, seg, p0, n);
    enqueue(cb, s);
}

/* Every run of mapped pages of expandable segments that is not on its way out (DETACHING), as
 * notices of `kind` appended to *list (not to the queue). VMM_EHOSTMEM: *list freed. */
static int runs_collect(vmm_allocator *a, int kind, notice **list)
{
    notice *head = NULL, **tail = &head;
    for (vmm_segment *s = a->segs; s; s = s->next) {
        if (!s->expandable || !s->mapped_pages)
            continue;
        size_t ps = s->page_size;
        const vmm_block *b = s->first;
        for (size_t pg = 0; pg < s->n_pages;) {
            while (b && b->addr + b->size <= s->base + pg * ps)
                b = b->next;
            int out = !s->pages[pg] || (b && b->state == VMM_BLOCK_DETACHING);
            if (out) {
                pg++;
                continue;
            }
            size_t end = pg;
            const vmm_block *c = b;
            while (end < s->n_pages && s->pages[end]) {
                while (c && c->addr + c->size <= s->base + end * ps)
                    c = c->next;
                if (c && c->state == VMM_BLOCK_DETACHING)
                    break;
                end++;
            }
            notice *n = notice_new(a, end - pg);
            if (!n) {
                while (head) {
                    notice *x = head->next;
                    notice_free(a, head);
                    head = x;
                }
                *list = NULL;
                return vmm_fail(VMM_EHOSTMEM, "out of host memory for the list of mappings");
            }
            notice_fill(n, kind, s, pg, end - pg);
            *tail = n;
            tail = &n->next;
            pg = end;
        }
    }
    *list = head;
    return VMM_OK;
}

static void list_free(vmm_allocator *a, notice *n)
{
    while (n) {
        notice *x = n->next;
        notice_free(a, n);
        n = x;
    }
}

int vmm_cb_list_add(vmm_allocator *a, vmm_cb_notice **list, vmm_segment *seg, size_t p0, size_t n, int unmap)
{
    notice *x = notice_new(a, n);
    if (!x)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for a mapping notice");
    notice_fill(x, unmap ? NOTICE_UNMAP : NOTICE_MAP, seg, p0, n);
    x->next = *list; /* newest first: vmm_cb_list_queue reverses */
    *list = x;
    return VMM_OK;
}

void vmm_cb_list_queue(vmm_allocator *a, vmm_cb_notice *list)
{
    notice *rev = NULL;
    while (list) {
        notice *x = list->next;
        list->next = rev;
        rev = list;
        list = x;
    }
    while (rev) {
        notice *x = rev->next;
        enqueue(a->cb, rev);
        rev = x;
    }
}

void vmm_cb_list_free(vmm_allocator *a, vmm_cb_notice *list) { list_free(a, list); }

/* ---- detaching pages before their unmap ----------------------------------------------------- */

size_t vmm_cb_detach(vmm_allocator *a, vmm_block *b, size_t p0, size_t p1)
{
    vmm_cb *cb = a->cb;
    vmm_segment *seg = b->seg;
    size_t ps = seg->page_size;
    uintptr_t ua = seg->base + p0 * ps, ue = seg->base + p1 * ps;
    vmm_block *r1 = b->addr < ua ? vmm_block_new(a) : NULL;
    vmm_block *r2 = b->addr + b->size > ue ? vmm_block_new(a) : NULL;
    notice *n = notice_new(a, p1 - p0);
    int room = cb->n_det < cb->cap_det;
    if (!room) {
        size_t ncap = cb->cap_det ? 2 * cb->cap_det : 16;
        detached *d = vmm_meta_alloc(a->meta, ncap * sizeof *d);
        if (d) {
            if (cb->n_det)
                memcpy(d, cb->det, cb->n_det * sizeof *d);
            if (cb->det)
                vmm_meta_free(a->meta, cb->det, cb->cap_det * sizeof *d);
            cb->det = d;
            cb->cap_det = ncap;
            room = 1;
        }
    }
    if (!room || !n || (b->addr < ua && !r1) || (b->addr + b->size > ue && !r2)) {
        if (r1)
            vmm_block_delete(a, r1);
        if (r2)
            vmm_block_delete(a, r2);
        if (n)
            notice_free(a, n);
        return 0;
    }
    vmm_pool_erase(a, b);
    vmm_block *u = b;
    if (r1) {
        vmm_block_split_into(b, r1, ua - b->addr);
        vmm_pool_insert(a, b);
        u = r1;
    }
    if (r2) {
        vmm_block_split_into(u, r2, ue - u->addr);
        vmm_pool_insert(a, r2);
    }
    u->state = VMM_BLOCK_DETACHING;
    u->in_index = 0;
    cb->det[cb->n_det++] = (detached){u, 0};
    notice_fill(n, NOTICE_UNMAP, seg, p0, p1 - p0);
    n->detach = u;
    enqueue(cb, n);
    return p1 - p0;
}

int vmm_cb_is_detaching(const vmm_allocator *a, const vmm_block *b)
{
    const vmm_cb *cb = a->cb;
    for (size_t i = 0; cb && i < cb->n_det; i++)
        if (cb->det[i].b == b)
            return 1;
    return 0;
}

/* Unmap the detached blocks whose before_unmap ran (lock held). */
static void finish_ready(vmm_allocator *a)
{
    vmm_cb *cb = a->cb;
    size_t ready = 0;
    for (size_t i = 0; i < cb->n_det; i++)
        ready += cb->det[i].ready != 0;
    if (!ready)
        return;
    /* The caller's capture mode was given back before delivery: unmapping in it would invalidate
     * a global-mode capture (capture.c). */
    int mode = vmm_capture_relax(a);
    for (size_t i = 0; i < cb->n_det;) {
        if (!cb->det[i].ready) {
            i++;
            continue;
        }
        vmm_block *rest = NULL;
        a->hooks.finish_detached(a, cb->det[i].b, &rest);
        if (rest) { /* the driver refused a page: the rest is tried at the next delivery */
            cb->det[i].b = rest;
            i++;
            continue;
        }
        cb->det[i] = cb->det[--cb->n_det];
    }
    vmm_capture_restore(a, mode);
}

int vmm_cb_pending(const vmm_allocator *a)
{
    const vmm_cb *cb = a->cb;
    return cb && (cb->head != NULL || cb->n_det != 0);
}

/* ---- delivery ------------------------------------------------------------------------------- */

/* Deliver until the queue is empty (delivery_mu held by the caller). */
static void deliver_locked(vmm_allocator *a)
{
    vmm_cb *cb = a->cb;
    vmm_allocator *outer = tls_delivering;
    tls_delivering = a;
    for (;;) {
        vmm_lock(a);
        finish_ready(a);
        notice *list = cb->head;
        cb->head = cb->tail = NULL;
        vmm_mapping_fn am = cb->after_map, bu = cb->before_unmap;
        void *ctx = cb->ctx;
        int dev = a->dev.ordinal;
        vmm_unlock(a);
        if (!list)
            break;
        for (notice *n = list; n; n = n->next) {
            vmm_mapping_fn fn = n->kind == NOTICE_MAP ? am : bu;
            if (fn)
                fn(ctx, n->va, n->size, dev, n->handles, n->n);
        }
        vmm_lock(a);
        while (list) {
            notice *x = list->next;
            for (size_t i = 0; list->detach && i < cb->n_det; i++)
                if (cb->det[i].b == list->detach)
                    cb->det[i].ready = 1;
            notice_free(a, list);
            list = x;
        }
        vmm_unlock(a);
    }
    tls_delivering = outer;
}

enum { DELIVER_TRY, DELIVER_WAIT, DELIVER_WAIT_BOUNDED, BOUNDED_WAIT_S = 5 };

/* Deliver what is queued (no allocator lock held by the caller). DELIVER_TRY returns at once when
 * another thread delivers: that thread delivers what this one queued, since it loops until the
 * queue is empty and looks again after it let go of the delivery mutex. Waiting is for callers that
 * need their notices delivered now (detached pages to be unmapped, sleep before it unmaps): a
 * thread that waits must not hold a lock the callbacks take; the bounded wait (a malloc short of
 * memory) gives up after BOUNDED_WAIT_S seconds and reports out of memory instead of hanging. */
static void deliver(vmm_allocator *a, int mode)
{
    vmm_cb *cb = a->cb;
    for (;;) {
        int got;
        if (mode == DELIVER_WAIT) {
            got = pthread_mutex_lock(&cb->delivery_mu) == 0;
        } else if (mode == DELIVER_WAIT_BOUNDED) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_sec += BOUNDED_WAIT_S;
            got = pthread_mutex_timedlock(&cb->delivery_mu, &ts) == 0;
        } else {
            got = pthread_mutex_trylock(&cb->delivery_mu) == 0;
        }
        if (!got)
            return;
        deliver_locked(a);
        pthread_mutex_unlock(&cb->delivery_mu);
        /* queued after our last look but before we let go: the queuer may have given up on us */
        vmm_lock(a);
        int again = cb->head != NULL;
        vmm_unlock(a);
        if (!again)
            return;
        mode = DELIVER_TRY;
    }
}

static void deliver_loop(vmm_allocator *a)
{
    pthread_mutex_lock(&a->cb->delivery_mu);
    deliver_locked(a);
    pthread_mutex_unlock(&a->cb->delivery_mu);
}

int vmm_cb_delivering(const vmm_allocator *a) { return tls_delivering == a; }

void vmm_unlock_deliver(vmm_allocator *a)
{
    int go = a->cb && tls_delivering != a && vmm_cb_pending(a);
    vmm_unlock(a);
    if (go)
        deliver(a, DELIVER_TRY);
}

void vmm_unlock_deliver_wait(vmm_allocator *a)
{
    int go = a->cb && tls_delivering != a && vmm_cb_pending(a);
    vmm_unlock(a);
    if (go)
        deliver(a, DELIVER_WAIT_BOUNDED);
}

void vmm_cb_flush(vmm_allocator *a, int wait)
{
    if (!a->cb || tls_delivering == a || !vmm_cb_pending(a))
        return;
    vmm_unlock(a);
    deliver(a, wait ? DELIVER_WAIT : DELIVER_TRY);
    vmm_lock(a);
}

/* ---- free-memory callbacks ------------------------------------------------------------------ */

int vmm_cb_run_free(vmm_allocator *a)
{
    vmm_cb *cb = a->cb;
    if (!cb || !cb->n_fcb || tls_freeing == a)
        return 0;
    free_cb list[FREE_CB_MAX];
    int n = cb->n_fcb;
    memcpy(list, cb->fcb, (size_t)n * sizeof *list);
    cb->running++;
    a->stats.num_free_memory_callbacks++;
    vmm_allocator *outer = tls_freeing;
    tls_freeing = a;
    vmm_unlock(a);
    int freed = 0;
    for (int i = 0; i < n; i++)
        freed |= list[i].fn(list[i].ctx) != 0;
    vmm_lock(a);
    tls_freeing = outer;
    cb->running--;
    if (freed)
        a->stats.num_free_memory_callback_hits++;
    return freed;
}

int vmm_cb_add_free_locked(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx)
{
    vmm_cb *cb = cb_get(a);
    if (!cb)
        return vmm_fail(VMM_EHOSTMEM, "vmm_add_free_memory_callback: out of host memory");
    if (cb->n_fcb == FREE_CB_MAX)
        return vmm_fail(VMM_EINVAL, "vmm_add_free_memory_callback: %d callbacks are registered already",
                        FREE_CB_MAX);
    cb->fcb[cb->n_fcb++] = (free_cb){fn, ctx};
    a->cb_free_n = cb->n_fcb;
    return VMM_OK;
}

VMM_API int vmm_add_free_memory_callback(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx)
{
    if (!a || !fn)
        return vmm_fail(VMM_EINVAL, "vmm_add_free_memory_callback: NULL %s", a ? "fn" : "allocator");
    vmm_lock(a);
    int rc = vmm_cb_add_free_locked(a, fn, ctx);
    vmm_unlock(a);
    return rc;
}

VMM_API int vmm_remove_free_memory_callback(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx)
{
    if (!a || !fn)
        return vmm_fail(VMM_EINVAL, "vmm_remove_free_memory_callback: NULL %s", a ? "fn" : "allocator");
    for (;;) {
        vmm_lock(a);
        vmm_cb *cb = a->cb;
        int i = 0;
        while (cb && i < cb->n_fcb && !(cb->fcb[i].fn == fn && cb->fcb[i].ctx == ctx))
            i++;
        if (!cb || i == cb->n_fcb) {
            vmm_unlock(a);
            return vmm_fail(VMM_EINVAL, "vmm_remove_free_memory_callback: not registered");
        }
        /* a run on another thread may still call it: wait (not when this thread runs it) */
        if (cb->running && tls_freeing != a) {
            vmm_unlock(a);
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
            continue;
        }
        memmove(&cb->fcb[i], &cb->fcb[i + 1], (size_t)(cb->n_fcb - i - 1) * sizeof cb->fcb[0]);
        cb->n_fcb--;
        a->cb_free_n = cb->n_fcb;
        vmm_unlock(a);
        return VMM_OK;
    }
}

/* ---- mapping callbacks ---------------------------------------------------------------------- */

VMM_API int vmm_set_mapping_callbacks(vmm_allocator *a, vmm_mapping_fn after_map, vmm_mapping_fn before_unmap,
                                      void *ctx)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_set_mapping_callbacks: allocator is NULL");
    vmm_lock(a);
    vmm_cb *cb = cb_get(a);
    if (!cb) {
        vmm_unlock(a);
        return vmm_fail(VMM_EHOSTMEM, "vmm_set_mapping_callbacks: out of host memory");
    }
    if (!after_map && !before_unmap) {
        /* removal: what is queued goes to the callbacks it was queued for */
        if (a->cb_mapping && tls_delivering != a) {
            vmm_unlock(a);
            deliver(a, DELIVER_WAIT);
            vmm_lock(a);
        }
        cb->after_map = cb->before_unmap = NULL;
        cb->ctx = NULL;
        a->cb_mapping = 0;
        vmm_unlock(a);
        return VMM_OK;
    }
    if (a->cb_mapping) {
        vmm_unlock(a);
        return vmm_fail(VMM_EINVAL, "vmm_set_mapping_callbacks: callbacks are set already; remove them "
                                    "first (all NULL)");
    }
    notice *list = NULL;
    int rc = after_map ? runs_collect(a, NOTICE_MAP, &list) : VMM_OK;
    if (rc) {
        vmm_unlock(a);
        return rc;
    }
    cb->after_map = after_map;
    cb->before_unmap = before_unmap;
    cb->ctx = ctx;
    a->cb_mapping = 1;
    while (list) {
        notice *x = list->next;
        enqueue(cb, list);
        list = x;
    }
    vmm_unlock_deliver(a);
    return VMM_OK;
}

VMM_API int vmm_get_mappings(vmm_allocator *a, vmm_mapping_fn fn, void *ctx)
{
    if (!a || !fn)
        return vmm_fail(VMM_EINVAL, "vmm_get_mappings: NULL %s", a ? "fn" : "allocator");
    vmm_lock(a);
    notice *list = NULL;
    int rc = runs_collect(a, NOTICE_MAP, &list);
    int dev = a->dev.ordinal;
    vmm_unlock(a);
    if (rc)
        return rc;
    for (notice *n = list; n; n = n->next)
        fn(ctx, n->va, n->size, dev, n->handles, n->n);
    list_free(a, list);
    return VMM_OK;
}

/* ---- check and teardown ------------------------------------------------------------------------ */

int vmm_cb_check(vmm_allocator *a)
{
    const vmm_cb *cb = a->cb;
    for (size_t i = 0; cb && i < cb->n_det; i++) {
        const vmm_block *b = cb->det[i].b;
        if (b->state != VMM_BLOCK_DETACHING)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: the detach list holds a block that is not detaching "
                                          "(at 0x%llx)", (unsigned long long)b->addr);
        for (size_t k = i + 1; k < cb->n_det; k++)
            if (cb->det[k].b == b)
                return vmm_fail(VMM_ECORRUPT, "vmm_check: a block is twice on the detach list");
    }
    if (cb && cb->n_fcb != a->cb_free_n)
        return vmm_fail(VMM_ECORRUPT, "vmm_check: free-memory callback count is wrong");
    return VMM_OK;
}

void vmm_cb_destroy(vmm_allocator *a)
{
    vmm_cb *cb = a->cb;
    if (!cb)
        return;
    if (a->cb_mapping) {
        /* what is queued first, then before_unmap for everything still mapped */
        deliver_loop(a);
        notice *list = NULL;
        if (cb->before_unmap && runs_collect(a, NOTICE_UNMAP, &list) == VMM_OK) {
            for (notice *n = list; n; n = n->next)
                cb->before_unmap(cb->ctx, n->va, n->size, a->dev.ordinal, n->handles, n->n);
            list_free(a, list);
        }
    }
    list_free(a, cb->head);
    if (cb->spare)
        notice_free(a, cb->spare);
    if (cb->det)
        vmm_meta_free(a->meta, cb->det, cb->cap_det * sizeof *cb->det);
    pthread_mutex_destroy(&cb->delivery_mu);
    vmm_meta_free(a->meta, cb, sizeof *cb);
    a->cb = NULL;
    a->cb_mapping = 0;
    a->cb_free_n = 0;
}
