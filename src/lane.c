/*
 * Lanes: a lock per stream (issue 13: threads on their own streams queued on one allocator lock
 * whenever their thread caches missed).
 *
 * A lane is a stream record (events.c) together with the index of its segments' free blocks
 * (pool.c). Until a second thread makes a thread cache of the allocator the lanes stay closed and
 * nothing changes: one allocator lock guards everything. Once open (for good):
 *
 * - vmm_lock takes the allocator lock and then every lane's lock, so whatever runs under it sees
 *   one state, exactly as before lanes;
 * - a malloc the thread cache missed, of a small-pool size, tries its stream's lane first: best
 *   fit, split and the live-table insert under that lane's lock only; a free the thread cache
 *   passed on (its bin full) is done there too, with the bin's older half of that lane's blocks.
 *   Anything else (no block fits, so growth or reclaim; events pending; a block that is unusual)
 *   goes to the allocator lock as before. A lane path makes no driver call and waits for nothing.
 *
 * What a lane path touches: its lane's index and the records of its segments' blocks, its lane's
 * books (counter deltas, record cache; vmm_books_of routes the small pool's there while lanes are
 * open, for every caller), live-table shards (under their locks: writers of two lanes may share
 * one) and the calling thread's cache (its lock). It reads state that only the allocator lock's
 * holder writes (configuration, the flags lane_usable reads, malloc_count): that holder holds the
 * lane's lock too, so the reads see no writer.
 *
 * Locks, in order: allocator lock, lanes (list order), a thread cache's, a live shard's. A lane
 * path holds one lane's lock and never waits for the allocator lock while holding it.
 *
 * Counters: a lane's books keep deltas that vmm_lanes_fold adds to the allocator's under the
 * allocator lock (every stats reader folds first). As with thread caches, current values are
 * exact and peaks are exact for one thread; with lanes open a peak may miss what other lanes
 * held at that moment.
 */
#include <string.h>

#include "internal.h"

void vmm_lanes_lock_all(vmm_allocator *a)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        vmm_mutex_lock(&r->lock);
}

void vmm_lanes_unlock_all(vmm_allocator *a)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        vmm_mutex_unlock(&r->lock);
}

void vmm_lanes_maybe_open(vmm_allocator *a)
{
    if (a->lanes_open || vmm_tc_caches(a) < 2)
        return;
    /* no lane path has run (lanes_on was clear), so every lane lock is free: take each, as
     * vmm_lock would have, for the vmm_unlock to come */
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        atomic_store_explicit(&r->lock, 1, memory_order_relaxed);
    a->lanes_open = 1;
    atomic_store_explicit(&a->lanes_on, 1, memory_order_release);
}

/* Add a lane's delta of one hot counter (pool entries as vmm_hot_up keeps them) to the allocator's;
 * returns the highest net change of its small-pool entry (for active's peaks). */
static int64_t fold_hot(vmm_stat *s, vmm_stat *d)
{
    const int pi = VMM_POOL_SMALL;
    int64_t before_pool = s[pi].current;
    int64_t before_all = s[VMM_POOL_SMALL].current + s[VMM_POOL_LARGE].current;
    int64_t max_net = d[pi].peak;
    s[pi].current += d[pi].current;
    s[pi].allocated += d[pi].allocated;
    s[pi].freed += d[pi].freed;
    vmm_peak_at(&s[pi], before_pool + max_net);
    vmm_peak_at(&s[VMM_POOL_ALL], before_all + d[VMM_POOL_ALL].peak);
    memset(d, 0, VMM_POOL_COUNT * sizeof *d);
    return before_pool + max_net;
}

static void fold_one(vmm_allocator *a, vmm_books *bk)
{
    vmm_stats *st = &a->stats, *d = &bk->d;
    int64_t top_n = fold_hot(st->allocation, d->allocation);
    int64_t top_b = fold_hot(st->allocated_bytes, d->allocated_bytes);
    fold_hot(st->requested_bytes, d->requested_bytes);
    fold_hot(st->inactive_split, d->inactive_split);
    fold_hot(st->inactive_split_bytes, d->inactive_split_bytes);
    vmm_stat *o = &st->oversize_allocations;
    int64_t before = o->current;
    o->current += d->oversize_allocations.current;
    o->allocated += d->oversize_allocations.allocated;
    o->freed += d->oversize_allocations.freed;
    vmm_peak_at(o, before + d->oversize_allocations.peak);
    memset(&d->oversize_allocations, 0, sizeof d->oversize_allocations);
    /* active = allocation + pending: its peaks where the lane's allocations were highest */
    int64_t large_n = st->allocation[VMM_POOL_LARGE].current;
    int64_t large_b = st->allocated_bytes[VMM_POOL_LARGE].current;
    vmm_peak_at(&st->active[VMM_POOL_SMALL], top_n + a->pending[VMM_SMALL].current);
    vmm_peak_at(&st->active[VMM_POOL_ALL],
                top_n + large_n + a->pending[0].current + a->pending[1].current);
    vmm_peak_at(&st->active_bytes[VMM_POOL_SMALL], top_b + a->pending_bytes[VMM_SMALL].current);
    vmm_peak_at(&st->active_bytes[VMM_POOL_ALL],
                top_b + large_b + a->pending_bytes[0].current + a->pending_bytes[1].current);
    a->malloc_count += bk->mallocs;
    a->lane_counts[0] += bk->counts[0];
    a->lane_counts[1] += bk->counts[1];
    bk->mallocs = bk->counts[0] = bk->counts[1] = 0;
}

void vmm_lanes_fold(vmm_allocator *a)
{
    if (!a->lanes_open)
        return;
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        fold_one(a, &r->bk);
}

/* A lane may do the work: read under its lock, these change only under the allocator lock.
 * Thread caches off (history, tags, sleep, IPC, private pools, callbacks) or paused (vmm_check,
 * snapshots) mean every malloc and free must pass the allocator lock; pending deferred frees are
 * polled by the allocator's malloc. */
static int lane_usable(const vmm_allocator *a)
{
    return vmm_tc_on(a) && !a->deferred && !a->n_routes && !a->tag_path;
}

/* The untagged lane of stream s, without the allocator lock: records are linked with a release
 * store (vmm_stream_rec_link) and live until vmm_destroy. */
static vmm_stream_rec *lane_find(vmm_allocator *a, vmm_stream s)
{
    for (vmm_stream_rec *r = atomic_load_explicit(&a->streams, memory_order_acquire); r; r = r->next)
        if (r->stream == s && r->tag == 0)
            return r;
    return NULL;
}

int vmm_lane_malloc(vmm_allocator *a, size_t size, vmm_stream s, void **ptr)
{
    if (!atomic_load_explicit(&a->lanes_on, memory_order_acquire) ||
        vmm_pool_of(vmm_round_size(&a->cfg, size)) != VMM_SMALL)
        return 0;
    vmm_stream_rec *sr = lane_find(a, s);
    if (!sr)
        return 0; /* no block of s was ever made: the allocator makes its record */
    int done = 0;
    vmm_mutex_lock(&sr->lock);
    if (lane_usable(a)) {
        vmm_block *b;
        size_t rounded;
        int pool;
        int rc = vmm_pool_malloc_cached(a, NULL, sr, size, s, &b, &rounded, &pool);
        /* no fit: first, as the allocator's malloc does, the thread's smallest cached block of
         * this lane that fits (it may merge into a fit) */
        if (rc == VMM_OK && !b && vmm_tc_give_fit_lane(a, rounded, s))
            rc = vmm_pool_malloc_cached(a, NULL, sr, size, s, &b, &rounded, &pool);
        if (rc == VMM_OK && b) {
            sr->bk.mallocs++;
            sr->bk.counts[0]++;
            *ptr = (void *)b->addr;
            done = 1;
        }
    }
    vmm_mutex_unlock(&sr->lock);
    return done;
}

int vmm_lane_free(vmm_allocator *a, void *ptr, size_t trim)
{
    if (!atomic_load_explicit(&a->lanes_on, memory_order_acquire))
        return 0;
    /* the thread cache just looked this block up and found it fit to cache: a live block of the
     * small pool whose fields are the caller's; checked again under the lane's lock */
    vmm_block *b = vmm_live_lookup(a, (uintptr_t)ptr);
    if (!b || b->seg->pool != VMM_SMALL || b->seg->mp)
        return 0;
    vmm_stream_rec *sr = b->seg->srec;
    int done = 0;
    vmm_mutex_lock(&sr->lock);
    if (lane_usable(a) && b->state == VMM_BLOCK_ALLOCATED && !b->n_uses && !b->grouped &&
        vmm_live_take(a, (uintptr_t)ptr, b)) {
        vmm_stats *d = &sr->bk.d;
        vmm_hot_down(d->allocation, VMM_SMALL, 1);
        vmm_hot_down(d->allocated_bytes, VMM_SMALL, (int64_t)b->size);
        vmm_hot_down(d->requested_bytes, VMM_SMALL, (int64_t)b->requested);
        if (a->cfg.max_split_size != SIZE_MAX && b->size >= a->cfg.max_split_size)
            vmm_stat_add(&d->oversize_allocations, -1);
        /* stamped with its stream's sequence, as vmm_free does */
        b->free_seq = ++sr->seq;
        b->requested = 0;
        vmm_pool_release(a, b);
        sr->bk.counts[1]++;
        vmm_tc_trim_lane(a, trim, sr->key); /* room in the full bin, this lane's older half */
        done = 1;
    }
    vmm_mutex_unlock(&sr->lock);
    return done;
}
