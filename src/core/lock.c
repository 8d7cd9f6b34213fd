/*
 * The allocator lock's lane half (the inline vmm_lock / vmm_unlock are in lock.h): while lanes are
 * open (lane.c), holding the allocator lock means holding every lane's lock too, and taking them
 * folds each lane's books (counter deltas of its lane paths) into the allocator's counters, so
 * whoever holds the allocator lock sees current values. Below the lanes, the thread caches and
 * everything that locks the allocator: it calls nothing but the mutex and the counters.
 */
#include <string.h>

#include "base/mutex.h"
#include "core/counters.h"
#include "core/lock.h"
#include "core/types.h"

static void fold_one(vmm_allocator *a, vmm_books *bk);

void vmm_lanes_lock_but(vmm_allocator *a, const vmm_stream_rec *keep)
{
    /* keep's lock is held already. Only the allocator lock's holder ever holds two lane locks, so
     * taking the others around it cannot deadlock: a lane path holds one and waits for none. */
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r != keep)
            vmm_mutex_lock(&r->lock);
    /* then fold: lanes not locked yet still read what a fold writes (malloc_count) */
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r->bk.dirty)
            fold_one(a, &r->bk);
}

void vmm_lanes_unlock_but(vmm_allocator *a, const vmm_stream_rec *keep)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r != keep)
            vmm_mutex_unlock(&r->lock);
}

/* Add a lane's delta of one hot counter (pool entries as vmm_hot_up keeps them; ALL's peak) to the
 * allocator's; top[p] gets pool p's highest value meanwhile, top[ALL] the pools' (active's peaks). */
static void fold_hot(vmm_stat *s, vmm_stat *d, int64_t top[VMM_POOL_COUNT])
{
    top[VMM_POOL_ALL] = s[VMM_POOL_SMALL].current + s[VMM_POOL_LARGE].current + d[VMM_POOL_ALL].peak;
    for (int p = VMM_POOL_SMALL; p <= VMM_POOL_LARGE; p++) {
        top[p] = s[p].current + d[p].peak;
        s[p].current += d[p].current;
        s[p].allocated += d[p].allocated;
        s[p].freed += d[p].freed;
        vmm_peak_at(&s[p], top[p]);
    }
    vmm_peak_at(&s[VMM_POOL_ALL], top[VMM_POOL_ALL]);
    memset(d, 0, VMM_POOL_COUNT * sizeof *d);
}

static void fold_one(vmm_allocator *a, vmm_books *bk)
{
    vmm_stats *st = &a->stats, *d = &bk->d;
    int64_t top_n[VMM_POOL_COUNT], top_b[VMM_POOL_COUNT], top_x[VMM_POOL_COUNT];
    fold_hot(st->allocation, d->allocation, top_n);
    fold_hot(st->allocated_bytes, d->allocated_bytes, top_b);
    fold_hot(st->requested_bytes, d->requested_bytes, top_x);
    fold_hot(st->inactive_split, d->inactive_split, top_x);
    fold_hot(st->inactive_split_bytes, d->inactive_split_bytes, top_x);
    vmm_stat *o = &st->oversize_allocations;
    int64_t before = o->current;
    o->current += d->oversize_allocations.current;
    o->allocated += d->oversize_allocations.allocated;
    o->freed += d->oversize_allocations.freed;
    vmm_peak_at(o, before + d->oversize_allocations.peak);
    memset(&d->oversize_allocations, 0, sizeof d->oversize_allocations);
    /* active = allocation + pending: its peaks where the lane's allocations were highest */
    for (int p = 0; p < VMM_NPOOLS; p++) {
        vmm_peak_at(&st->active[p + 1], top_n[p + 1] + a->pending[p].current);
        vmm_peak_at(&st->active_bytes[p + 1], top_b[p + 1] + a->pending_bytes[p].current);
    }
    vmm_peak_at(&st->active[VMM_POOL_ALL], top_n[VMM_POOL_ALL] + a->pending[0].current + a->pending[1].current);
    vmm_peak_at(&st->active_bytes[VMM_POOL_ALL],
                top_b[VMM_POOL_ALL] + a->pending_bytes[0].current + a->pending_bytes[1].current);
    a->malloc_count += bk->mallocs;
    a->lane_counts[0] += bk->counts[0];
    a->lane_counts[1] += bk->counts[1];
    bk->mallocs = bk->counts[0] = bk->counts[1] = 0;
    bk->dirty = 0;
}
