/*
 * Events without synchronization: an event pool, deferred frees (blocks used by other streams
 * through vmm_record_stream), and per-stream fences that prove freed memory idle before its pages
 * are unmapped. Only the explicit wait functions block, and each wait is counted.
 */
#include "internal.h"

/* ---- stream records ---------------------------------------------------------------------- */

vmm_stream_rec *vmm_stream_rec_get(vmm_allocator *a, vmm_stream s)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r->stream == s)
            return r;
    vmm_stream_rec *r = vmm_meta_alloc(a->meta, sizeof *r);
    if (!r)
        return NULL;
    r->stream = s;
    r->next = a->streams;
    a->streams = r;
    return r;
}

/* ---- event pool --------------------------------------------------------------------------- */

int vmm_event_get(vmm_allocator *a, vmm_event *out)
{
    if (a->n_ev_pool) {
        *out = a->ev_pool[--a->n_ev_pool];
        return VMM_OK;
    }
    /* make room first, so vmm_event_put never fails */
    if (a->n_events + 1 > a->cap_ev_pool) {
        size_t ncap = a->cap_ev_pool ? a->cap_ev_pool * 2 : 16;
        vmm_event *np = vmm_meta_alloc(a->meta, ncap * sizeof *np);
        if (!np)
            return vmm_fail(VMM_EHOSTMEM, "out of host memory for the event pool");
        for (size_t i = 0; i < a->n_ev_pool; i++)
            np[i] = a->ev_pool[i];
        if (a->ev_pool)
            vmm_meta_free(a->meta, a->ev_pool, a->cap_ev_pool * sizeof *np);
        a->ev_pool = np;
        a->cap_ev_pool = ncap;
    }
    int r = a->drv->ops->event_create(a->drv, out);
    if (r)
        return vmm_fail_drv(r, "event_create");
    a->n_events++;
    return VMM_OK;
}

void vmm_event_put(vmm_allocator *a, vmm_event e) { a->ev_pool[a->n_ev_pool++] = e; }

/* ---- deferred frees ----------------------------------------------------------------------- */

static void deferred_unlink(vmm_allocator *a, vmm_block *b)
{
    if (b->dprev)
        b->dprev->dnext = b->dnext;
    else
        a->deferred = b->dnext;
    if (b->dnext)
        b->dnext->dprev = b->dprev;
    b->dprev = b->dnext = NULL;
    a->n_deferred--;
}

int vmm_defer_free(vmm_allocator *a, vmm_block *b)
{
    vmm_event *evs = vmm_meta_alloc(a->meta, b->n_uses * sizeof *evs);
    if (!evs)
        return vmm_fail(VMM_EHOSTMEM, "vmm_free: out of host memory for events");
    uint32_t n = 0;
    int rc = VMM_OK;
    for (; n < b->n_uses; n++) {
        rc = vmm_event_get(a, &evs[n]);
        if (rc)
            break;
        int r = a->drv->ops->event_record(a->drv, evs[n], b->ext->uses[n]);
        if (r) {
            vmm_event_put(a, evs[n]);
            rc = vmm_fail_drv(r, "vmm_free: event_record");
            break;
        }
    }
    if (rc) {
        /* recorded events are harmless to reuse: back to the pool, block stays allocated */
        while (n)
            vmm_event_put(a, evs[--n]);
        vmm_meta_free(a->meta, evs, b->n_uses * sizeof *evs);
        return rc;
    }
    b->ext->events = evs;
    b->ext->n_events = b->ext->cap_events = n;
    b->state = VMM_BLOCK_PENDING;
    b->dprev = NULL;
    b->dnext = a->deferred;
    if (a->deferred)
        a->deferred->dprev = b;
    a->deferred = b;
    a->n_deferred++;
    return VMM_OK;
}

/* Drop completed events from the front of b's list; 1 when none is left. */
static int block_events_done(vmm_allocator *a, vmm_block *b, int wait)
{
    while (b->ext->n_events) {
        vmm_event e = b->ext->events[b->ext->n_events - 1];
        if (wait) {
            a->stats.num_event_waits++;
            if (a->drv->ops->event_sync(a->drv, e) != VMM_DRV_SUCCESS)
                return 0;
        } else if (a->drv->ops->event_query(a->drv, e) != VMM_DRV_SUCCESS) {
            return 0; /* NOT_READY, or a failed query: try again later */
        }
        vmm_event_put(a, e);
        b->ext->n_events--;
    }
    return 1;
}

static size_t deferred_scan(vmm_allocator *a, int wait)
{
    size_t n = 0;
    vmm_block *b = a->deferred;
    while (b) {
        vmm_block *next = b->dnext;
        if (block_events_done(a, b, wait)) {
            deferred_unlink(a, b);
            vmm_meta_free(a->meta, b->ext->events, b->ext->cap_events * sizeof *b->ext->events);
            b->ext->events = NULL;
            b->ext->cap_events = 0;
            vmm_pool_release(a, b);
            n++;
        }
        b = next;
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

void vmm_fences_poll(vmm_allocator *a)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        while (r->fences && a->drv->ops->event_query(a->drv, r->fences->ev) == VMM_DRV_SUCCESS)
            fence_pop(a, r);
}

void vmm_fences_record(vmm_allocator *a)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        uint64_t covered = r->fences_tail ? r->fences_tail->seq : r->done_seq;
        if (r->seq <= covered)
            continue;
        if (r->retired) {
            r->done_seq = r->seq; /* destroyed: its work has run */
            continue;
        }
        vmm_fence *f = vmm_meta_alloc(a->meta, sizeof *f);
        if (!f)
            return;
        if (vmm_event_get(a, &f->ev) != VMM_OK) {
            vmm_meta_free(a->meta, f, sizeof *f);
            return;
        }
        if (a->drv->ops->event_record(a->drv, f->ev, r->stream) != VMM_DRV_SUCCESS) {
            vmm_event_put(a, f->ev);
            vmm_meta_free(a->meta, f, sizeof *f);
            continue;
        }
        f->seq = r->seq;
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
            if (a->drv->ops->event_sync(a->drv, r->fences_tail->ev) != VMM_DRV_SUCCESS)
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
    for (size_t i = 0; i < a->live_cap; i++) {
        vmm_block *b = a->live[i];
        for (uint32_t k = 0; b && k < b->n_uses;) {
            if (b->ext->uses[k] == s)
                b->ext->uses[k] = b->ext->uses[--b->n_uses];
            else
                k++;
        }
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
        /* events that could not be waited on: give the blocks back regardless */
        vmm_block *b = a->deferred;
        while (b->ext->n_events)
            vmm_event_put(a, b->ext->events[--b->ext->n_events]);
        deferred_unlink(a, b);
        vmm_meta_free(a->meta, b->ext->events, b->ext->cap_events * sizeof *b->ext->events);
        b->ext->events = NULL;
        b->ext->cap_events = 0;
        vmm_pool_release(a, b);
    }
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        while (r->fences)
            fence_pop(a, r);
    while (a->streams) {
        vmm_stream_rec *r = a->streams;
        a->streams = r->next;
        vmm_meta_free(a->meta, r, sizeof *r);
    }
    while (a->n_ev_pool) {
        a->drv->ops->event_destroy(a->drv, a->ev_pool[--a->n_ev_pool]);
        a->n_events--;
    }
    if (a->ev_pool)
        vmm_meta_free(a->meta, a->ev_pool, a->cap_ev_pool * sizeof *a->ev_pool);
    a->ev_pool = NULL;
    a->cap_ev_pool = 0;
}
