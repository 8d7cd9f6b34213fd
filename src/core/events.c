/*
 * Events without synchronization: an event pool, deferred frees (blocks used by other streams
 * through vmm_record_stream), and per-stream fences that prove freed memory idle before its pages
 * are unmapped. Only the explicit wait functions block, and each wait is counted.
 */
#include <stdio.h>

#include "base/base.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/capture.h"
#include "core/events.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/types.h"
#include "driver/driver.h"

/* ---- stream records ---------------------------------------------------------------------- */

vmm_stream_rec *vmm_stream_rec_find(vmm_allocator *a, vmm_stream s)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r->stream == s && r->tag == 0) /* tagged memory has records of its own (sleep.c) */
            return r;
    return NULL;
}

vmm_stream_rec *vmm_stream_rec_next_key(vmm_allocator *a, const vmm_stream_rec *prev)
{
    /* a few lanes (streams): a selection pass per step beats keeping them sorted */
    vmm_stream_rec *best = NULL;
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if ((!prev || (uintptr_t)r->key > (uintptr_t)prev->key) &&
            (!best || (uintptr_t)r->key < (uintptr_t)best->key))
            best = r;
    return best;
}

vmm_stream_rec *vmm_stream_rec_get(vmm_allocator *a, vmm_stream s)
{
    vmm_stream_rec *found = vmm_stream_rec_find(a, s);
    if (found)
        return found;
    vmm_stream_rec *r = vmm_meta_alloc(a->meta, sizeof *r);
    if (!r)
        return NULL;
    r->stream = s;
    r->key = s;
    vmm_stream_rec_link(a, r);
    return r;
}

void vmm_stream_rec_link(vmm_allocator *a, vmm_stream_rec *r)
{
    /* held from birth while lanes are open: the allocator lock's holder releases it with the rest */
    atomic_init(&r->lock, a->lanes_open);
    vmm_witness_register(a, &r->lock, VMM_RANK_LANE, "a lane's lock", 1);
    r->next = a->streams;
    /* release: lane.c's lookups walk the list without the allocator lock */
    atomic_store_explicit(&a->streams, r, memory_order_release);
}

/* ---- event pool --------------------------------------------------------------------------- */

/* An idle event or a new one; VMM_OK, VMM_EHOSTMEM, or a driver result in *drv_r (no message). */
static int event_take(vmm_allocator *a, vmm_event *out, int *drv_r)
{
    *drv_r = VMM_DRV_SUCCESS;
    if (a->n_ev_pool) {
        *out = a->ev_pool[--a->n_ev_pool];
        return VMM_OK;
    }
    /* make room first, so vmm_event_put never fails */
    if (a->n_events + 1 > a->cap_ev_pool) {
        size_t ncap = a->cap_ev_pool ? a->cap_ev_pool * 2 : 16;
        vmm_event *np = vmm_meta_alloc(a->meta, ncap * sizeof *np);
        if (!np)
            return VMM_EHOSTMEM;
        for (size_t i = 0; i < a->n_ev_pool; i++)
            np[i] = a->ev_pool[i];
        if (a->ev_pool)
            vmm_meta_free(a->meta, a->ev_pool, a->cap_ev_pool * sizeof *np);
        a->ev_pool = np;
        a->cap_ev_pool = ncap;
    }
    vmm_lanes_yield(a, NULL);
    *drv_r = a->drv->ops->event_create(a->drv, out);
    vmm_lanes_resume(a, NULL);
    if (*drv_r)
        return VMM_EDRIVER;
    a->n_events++;
    return VMM_OK;
}

int vmm_event_get(vmm_allocator *a, vmm_event *out)
{
    int r;
    int rc = event_take(a, out, &r);
    if (rc == VMM_EHOSTMEM)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for the event pool");
    if (rc)
        return vmm_fail_drv(r, "event_create");
    return VMM_OK;
}

void vmm_event_put(vmm_allocator *a, vmm_event e) { a->ev_pool[a->n_ev_pool++] = e; }

vmm_event vmm_event_for_use(vmm_allocator *a, vmm_stream s)
{
    vmm_event e = NULL;
    int r;
    if (event_take(a, &e, &r) != VMM_OK)
        return NULL;
    /* an event of the pool may be prepared for other contexts already: it stays so */
    if (!a->drv->ops->event_prepare)
        return e;
    vmm_lanes_yield(a, NULL);
    r = a->drv->ops->event_prepare(a->drv, e, s);
    vmm_lanes_resume(a, NULL);
    if (r != VMM_DRV_SUCCESS) {
        vmm_event_put(a, e);
        return NULL;
    }
    return e;
}

/* ---- use slots of a block (see vmm_block_ext) ---------------------------------------------- */

/* Take slot i out, its event (if any) back to the pool, keeping the recorded slots in front. */
static void slot_drop(vmm_allocator *a, vmm_block *b, uint32_t i)
{
    vmm_block_ext *x = b->ext;
    if (x->events[i])
        vmm_event_put(a, x->events[i]);
    uint32_t last = b->n_uses - 1;
    if (i < x->n_events) {
        uint32_t last_rec = x->n_events - 1;
        x->uses[i] = x->uses[last_rec];
        x->events[i] = x->events[last_rec];
        x->uses[last_rec] = x->uses[last];
        x->events[last_rec] = x->events[last];
        x->n_events--;
    } else {
        x->uses[i] = x->uses[last];
        x->events[i] = x->events[last];
    }
    b->n_uses--;
}

/* Record the unrecorded slots that can be (getting and preparing an event for an empty one);
 * a slot recorded moves into the recorded prefix. Failures leave a slot as it was. */
static void slots_record(vmm_allocator *a, vmm_block *b)
{
    vmm_block_ext *x = b->ext;
    for (uint32_t i = x->n_events; i < b->n_uses; i++) {
        /* capture (capture.c): nothing is recorded on a capturing stream, nor while captures are
         * routed; a use made by a capture that has ended needs no event (slot_drop moves the last
         * slot into i: i is looked at again, the unsigned wrap at 0 is undone by i++) */
        int use = vmm_capture_use_check(a, b, x->uses[i]);
        if (use == VMM_USE_DROP) {
            slot_drop(a, b, i--);
            continue;
        }
        if (use == VMM_USE_WAIT)
            continue;
        if (!x->events[i] && !(x->events[i] = vmm_event_for_use(a, x->uses[i])))
            continue;
        /* b is pending or being freed: no lane path touches its slots */
        vmm_lanes_yield(a, NULL);
        int r = a->drv->ops->event_record(a->drv, x->events[i], x->uses[i]);
        vmm_lanes_resume(a, NULL);
        if (r != VMM_DRV_SUCCESS)
            continue; /* the event stays in the slot, prepared: retried later */
        uint32_t k = x->n_events++;
        vmm_stream su = x->uses[i];
        vmm_event se = x->events[i];
        x->uses[i] = x->uses[k];
        x->events[i] = x->events[k];
        x->uses[k] = su;
        x->events[k] = se;
    }
}

/* ---- deferred frees ----------------------------------------------------------------------- */

enum { RECORD_TRIES_WAITING = 3 };

static void deferred_unlink(vmm_allocator *a, vmm_block *b)
{
    if (b->dprev)
        b->dprev->dnext = b->dnext;
    else
        a->deferred = b->dnext;
    if (b->dnext)
        b->dnext->dprev = b->dprev;
    b->dprev = b->dnext = NULL;
    atomic_fetch_sub_explicit(&a->n_deferred, 1, memory_order_relaxed);
}

void vmm_defer_free(vmm_allocator *a, vmm_block *b)
{
    b->ext->n_events = 0; /* an allocated block has no recorded slot */
    slots_record(a, b);
    b->state = VMM_BLOCK_PENDING;
    b->dprev = NULL;
    b->dnext = a->deferred;
    if (a->deferred)
        a->deferred->dprev = b;
    a->deferred = b;
    atomic_fetch_add_explicit(&a->n_deferred, 1, memory_order_relaxed);
}

/* Retry b's unrecorded slots, then drop the slots whose work has completed; 1 when none is left.
 * wait: block on recorded events, and synchronize the stream of a slot that still cannot be
 * recorded (recording late, or waiting for a whole stream, covers more work than the free needs:
 * safe). Without wait nothing blocks. */
static int block_events_done(vmm_allocator *a, vmm_block *b, int wait)
{
    vmm_block_ext *x = b->ext;
    /* waiting, a passing failure is worth another try or two before synchronizing a stream */
    for (int t = wait ? RECORD_TRIES_WAITING : 1; t > 0 && x->n_events < b->n_uses; t--)
        slots_record(a, b);
    /* downwards: slot_drop moves only already visited slots into i */
    for (uint32_t i = x->n_events; i-- > 0;) {
        int r;
        if (wait)
            a->stats.num_event_waits++;
        vmm_lanes_yield(a, NULL);
        /* a failed wait keeps the slot for the next scan (no stream sync: expandable mode
         * synchronizes only where no event can stand in); NOT_READY or a failed query: later */
        if (wait)
            r = a->drv->ops->event_sync(a->drv, x->events[i]);
        else
            r = a->drv->ops->event_query(a->drv, x->events[i]);
        vmm_lanes_resume(a, NULL);
        if (r == VMM_DRV_SUCCESS)
            slot_drop(a, b, i);
    }
    if (wait) {
        for (uint32_t i = b->n_uses; i-- > x->n_events;) {
            /* a capturing stream cannot be synchronized: its slot waits for the capture's end */
            if (vmm_capture_stream(a, x->uses[i], NULL))
                continue;
            /* no event could be recorded for this use: wait for its whole stream instead */
            a->stats.num_event_waits++;
            vmm_lanes_yield(a, NULL);
            int r = a->drv->ops->stream_sync(a->drv, x->uses[i]);
            vmm_lanes_resume(a, NULL);
            if (r == VMM_DRV_SUCCESS)
                slot_drop(a, b, i);
        }
    }
    return b->n_uses == 0;
}

static size_t deferred_scan(vmm_allocator *a, int wait)
{
    /* the events' calls of the whole scan with the lanes let go once (each call alone cost every
     * lane's lock twice: 200 queries with 32 lanes took ~30 us more): pending blocks' slots, the
     * event pool and the deferred list are the allocator lock's alone. What is done goes on a list
     * of its own (dnext, in scan order) and back to its lane's pool once the lanes are held. */
    size_t n = 0;
    vmm_block *done = NULL, **tail = &done;
    vmm_lanes_yield(a, NULL);
    vmm_block *b = a->deferred;
    while (b) {
        vmm_block *next = b->dnext;
        if (block_events_done(a, b, wait)) {
            deferred_unlink(a, b);
            *tail = b;
            tail = &b->dnext;
            n++;
        }
        b = next;
    }
    vmm_lanes_resume(a, NULL);
    while (done) {
        b = done;
        done = b->dnext;
        b->dnext = NULL;
        b->requested = 0; /* kept while pending: snapshots show what waits */
        if (VMM_UNLIKELY(a->capture != NULL))
            vmm_capture_forget_block(a, b);
        vmm_pool_release(a, b);
    }
    return n;
}

void vmm_events_process(vmm_allocator *a)
{
    if (a->deferred)
        deferred_scan(a, 0);
}

size_t vmm_events_wait_all(vmm_allocator *a) { return a->deferred ? deferred_scan(a, 1) : 0; }

/* ---- fences ------------------------------------------------------------------------------- */

static void fence_pop(vmm_allocator *a, vmm_stream_rec *r)
{
    vmm_fence *f = r->fences;
    r->fences = f->next;
    if (!r->fences)
        r->fences_tail = NULL;
    if (f->seq > r->done_seq)
        r->done_seq = f->seq;
    vmm_event_put(a, f->ev);
    vmm_meta_free(a->meta, f, sizeof *f);
}

/* A fence's event query or wait, the lanes let go meanwhile (fences are the allocator lock's). */
static int fence_event(vmm_allocator *a, vmm_event ev, int wait)
{
    vmm_lanes_yield(a, NULL);
    int r = wait ? a->drv->ops->event_sync(a->drv, ev) : a->drv->ops->event_query(a->drv, ev);
    vmm_lanes_resume(a, NULL);
    return r;
}

void vmm_fences_poll(vmm_allocator *a)
{
    /* fences are the allocator lock's: every stream's queries with the lanes let go once */
    vmm_lanes_yield(a, NULL);
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        while (r->fences && fence_event(a, r->fences->ev, 0) == VMM_DRV_SUCCESS)
            fence_pop(a, r);
    vmm_lanes_resume(a, NULL);
}

void vmm_fences_record(vmm_allocator *a)
{
    /* captures underway (capture.c): a fence on a capturing stream would be a graph node */
    if (a->n_routes)
        return;
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        /* read before the record: lane frees stamp r->seq while the lanes are let go, and the
         * fence covers only what was queued before it */
        uint64_t seq = r->seq;
        uint64_t covered = r->fences_tail ? r->fences_tail->seq : r->done_seq;
        if (seq <= covered)
            continue;
        if (r->retired) {
            r->done_seq = r->seq; /* destroyed: its work has run */
            continue;
        }
        if (vmm_capture_stream(a, r->stream, NULL))
            continue;
        vmm_fence *f = vmm_meta_alloc(a->meta, sizeof *f);
        if (!f)
            return;
        if (vmm_event_get(a, &f->ev) != VMM_OK) {
            vmm_meta_free(a->meta, f, sizeof *f);
            return;
        }
        vmm_lanes_yield(a, NULL);
        int rr = a->drv->ops->event_record(a->drv, f->ev, r->stream);
        vmm_lanes_resume(a, NULL);
        if (rr != VMM_DRV_SUCCESS) {
            vmm_event_put(a, f->ev);
            vmm_meta_free(a->meta, f, sizeof *f);
            continue;
        }
        f->seq = seq;
        if (r->fences_tail)
            r->fences_tail->next = f;
        else
            r->fences = f;
        r->fences_tail = f;
    }
}

size_t vmm_fences_wait(vmm_allocator *a)
{
    size_t n = 0;
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        while (r->fences) {
            a->stats.num_event_waits++;
            n++;
            if (fence_event(a, r->fences_tail->ev, 1) != VMM_DRV_SUCCESS)
                break;
            /* the newest fence done implies every older one is */
            uint64_t seq = r->fences_tail->seq;
            while (r->fences)
                fence_pop(a, r);
            r->done_seq = seq;
        }
    }
    return n;
}

int vmm_block_idle(const vmm_block *b)
{
    const vmm_stream_rec *r = b->seg->srec;
    return r->retired || b->free_seq <= r->done_seq;
}

void vmm_stream_rec_retire(vmm_allocator *a, vmm_stream s)
{
    /* a record even for a stream never allocated on, so that record_stream can refuse it */
    (void)vmm_stream_rec_get(a, s);
    vmm_capture_forget_stream(a, s);
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        if (r->stream != s)
            continue;
        uint64_t seq = r->seq;
        while (r->fences)
            fence_pop(a, r);
        r->done_seq = seq;
        /* blocks of this stream freed later are idle at once: no fence can be recorded on it */
        r->retired = 1;
    }
    /* a live block used by the dead stream: its work there has run, no event to record at free */
    vmm_block *lb;
    VMM_LIVE_FOREACH(a, lb) {
        for (uint32_t k = 0; k < lb->n_uses;) {
            if (lb->ext->uses[k] == s)
                slot_drop(a, lb, k);
            else
                k++;
        }
    }
    /* the same for pending frees (their slots on it, recorded or not, are done); a block left
     * with no slot completes at the next scan */
    for (vmm_block *b = a->deferred; b; b = b->dnext) {
        for (uint32_t k = b->n_uses; k-- > 0;)
            if (b->ext->uses[k] == s)
                slot_drop(a, b, k);
    }
}

void vmm_stream_rec_revive(vmm_allocator *a, vmm_stream s)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r->stream == s)
            r->retired = 0;
}

void vmm_events_shutdown(vmm_allocator *a)
{
    vmm_events_wait_all(a);
    while (a->deferred) {
        /* events that could not be waited on, uses that could not be recorded nor synchronized:
         * give the blocks back regardless */
        vmm_block *b = a->deferred;
        while (b->n_uses)
            slot_drop(a, b, b->n_uses - 1);
        deferred_unlink(a, b);
        b->requested = 0;
        if (a->capture)
            vmm_capture_forget_block(a, b);
        vmm_pool_release(a, b);
    }
    /* live blocks hold the events prepared for their uses: every event goes back to be destroyed */
    vmm_block *lb;
    VMM_LIVE_FOREACH(a, lb) {
        vmm_block *b = lb;
        for (uint32_t k = 0; k < b->n_uses; k++) {
            if (b->ext->events[k])
                vmm_event_put(a, b->ext->events[k]);
            b->ext->events[k] = NULL;
        }
    }
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        while (r->fences)
            fence_pop(a, r);
    while (a->streams) {
        vmm_stream_rec *r = a->streams;
        a->streams = r->next;
        vmm_block_cache_drain_books(a, &r->bk);
        vmm_meta_free(a->meta, r, sizeof *r);
    }
    while (a->n_ev_pool) {
        /* the last chance: a transient refusal must not leak the event (vmm_destroy) */
        vmm_event e = a->ev_pool[--a->n_ev_pool];
        int r = VMM_DRV_SUCCESS;
        for (int t = 0; t < 8 && (t == 0 || r != VMM_DRV_SUCCESS); t++)
            r = a->drv->ops->event_destroy(a->drv, e);
        if (r != VMM_DRV_SUCCESS)
            fprintf(stderr, "vmmalloc: vmm_destroy: an event could not be destroyed (%s)\n",
                    vmm_drv_result_name(r));
        a->n_events--;
    }
    if (a->ev_pool)
        vmm_meta_free(a->meta, a->ev_pool, a->cap_ev_pool * sizeof *a->ev_pool);
    a->ev_pool = NULL;
    a->cap_ev_pool = 0;
}
