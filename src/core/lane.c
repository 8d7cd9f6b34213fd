/*
 * Lanes: a lock per stream (issue 13: threads on their own streams queued on one allocator lock
 * whenever their thread caches missed).
 *
 * A lane is a stream record (events.c) together with the index of its segments' free blocks
 * (pool.c). Until a second thread mallocs or frees under the allocator lock the lanes stay closed
 * and nothing changes: one allocator lock guards everything. A thread that only frees counts: a
 * consumer freeing what a producer allocates would otherwise queue both on the allocator lock for
 * good, with no depot (tcache.c). Once open:
 *
 * - vmm_lock takes the allocator lock and then every lane's lock, so whatever runs under it sees
 *   one state, exactly as before lanes;
 * - a malloc the thread cache missed tries its stream's lane first: best fit (after the thread's
 *   own cached block that fits), split and the live-table insert under that lane's lock only; a
 *   free the thread cache did not keep is done there too (with the bin's older half of that
 *   lane's blocks when the cache passed it on for a full bin).
 *   Anything else (no block fits, so the poll of deferred frees, growth or reclaim; a block with
 *   record_stream uses or in a group) goes to the allocator lock as before. A lane path makes no
 *   driver call and waits for nothing.
 *
 * What a lane path touches: its lane's index and the records of its segments' blocks, its lane's
 * books (counter deltas, record cache: while the path runs, vmm_books_of sends pool.c's updates
 * there), live-table shards (under their locks: writers of two lanes may share one) and the
 * calling thread's cache (its lock). It reads state that only the allocator lock's holder writes
 * (configuration, the flags lane_usable reads, malloc_count): that holder holds the lane's lock
 * too, so the reads see no writer. Lanes close for good when thread caches go off for good.
 *
 * Locks, in order: allocator lock, lanes (list order), a thread cache's, a live shard's. A lane
 * path holds one lane's lock and never waits for the allocator lock while holding it.
 *
 * Driver calls (issue 13: no call, query or wait under a lock another stream's cached path
 * needs): the allocator lock's holder lets the lanes go around each driver call it makes
 * (vmm_lanes_yield / vmm_lanes_resume), keeping at most the lane whose segment the call unmaps or
 * frees. Between the two it touches no other lane's state, and after resuming it reads again
 * whatever of that state it needs (lane paths ran meanwhile, and their books are folded again).
 *
 * Counters: a lane's books keep the deltas of its lane paths since the allocator lock was last
 * taken; taking it folds them in (vmm_lanes_lock_but, lock.c), so whoever holds it sees current values
 * exact, and everything under it counts in the allocator's own. As with thread caches, peaks are
 * exact for one thread; with several, a peak may miss what other lanes held at that moment.
 */
#include <string.h>

#include "base/mutex.h"
#include "core/counters.h"
#include "core/events.h"
#include "core/lane.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/tcache.h"
#include "core/types.h"

void vmm_lanes_setup(vmm_allocator *a)
{
    /* lanes need the thread caches: their `on` flag says when every call must take the lock */
    a->lanes_watch = a->cfg.lanes && a->cfg.thread_cache > 0;
}

void vmm_lanes_update_slow(vmm_allocator *a)
{
    if (a->lanes_open) {
        if (!vmm_tc_disabled(a))
            return;
        /* caches off for good (history, tags, IPC, ...): no lane path can run again, so the
         * allocator lock stops taking lane locks. Ours are released now (their books were folded
         * as vmm_lock took them); a lane path waiting for one finds the caches off and leaves. */
        atomic_store_explicit(&a->lanes_on, 0, memory_order_relaxed);
        a->lanes_open = 0;
        vmm_lanes_unlock_but(a, NULL);
        return;
    }
    if (!a->lanes_watch)
        return;
    if (vmm_tc_disabled(a)) {
        a->lanes_watch = 0; /* never, then */
        return;
    }
    if (!vmm_tc_on(a))
        return; /* paused (vmm_check, snapshot): the next malloc looks again */
    uintptr_t me = vmm_thread_id();
    if (!a->lock_owner || a->lock_owner == me) {
        a->lock_owner = me; /* one thread so far: one lock serves it best */
        return;
    }
    /* no lane path has run (lanes_on was clear), so every lane lock is free: take each, as
     * vmm_lock would have, for the vmm_unlock to come */
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        atomic_store_explicit(&r->lock, 1, memory_order_relaxed);
    a->lanes_open = 1;
    a->lanes_watch = 0;
    a->shards_locked = 1;
    atomic_store_explicit(&a->lanes_on, 1, memory_order_release);
}

/* A lane may do the work: read under its lock, these change only under the allocator lock.
 * Thread caches off (history, tags, sleep, IPC, private pools, callbacks) or paused (vmm_check,
 * snapshots) mean every malloc and free must pass the allocator lock. Pending deferred frees
 * (record_stream) do not: a lane malloc that finds a cached block needs none of them, and one that
 * does not goes to the allocator lock, whose malloc polls them before it grows. */
static int lane_usable(const vmm_allocator *a)
{
    return vmm_tc_on(a) && !a->n_routes && !a->tag_path;
}

int vmm_lane_malloc(vmm_allocator *a, size_t size, vmm_stream s, void **ptr)
{
    if (!atomic_load_explicit(&a->lanes_on, memory_order_acquire))
        return 0;
    vmm_stream_rec *sr = vmm_stream_rec_find(a, s);
    if (!sr)
        return 0; /* no block of s was ever made: the allocator makes its record */
    int done = 0;
    vmm_mutex_lock(&sr->lock);
    if (lane_usable(a)) {
        sr->bk.in_path = 1; /* pool.c counts and recycles records in this lane's books */
        sr->bk.dirty = 1;
        vmm_block *b;
        size_t rounded;
        int pool;
        int rc = vmm_pool_malloc_cached(a, NULL, sr, size, s, &b, &rounded, &pool);
        /* no fit: first, as the allocator's malloc does, the thread's smallest cached block of
         * this lane that fits, then the older half of this lane's blocks in every bin (they may
         * merge into a fit). Only growth needs the allocator lock, which takes every lane's: on
         * the ring pattern with two threads under 1% of the lane's mallocs found no fit, but each
         * trim under the allocator lock (up to 8 blocks from each of 128 bins) stalled the other
         * thread's lane meanwhile: a fifth of the time went there (perf). */
        if (rc == VMM_OK && !b && vmm_tc_give_fit_lane(a, rounded, s))
            rc = vmm_pool_malloc_cached(a, NULL, sr, size, s, &b, &rounded, &pool);
        /* (small pool only: cached blocks cannot merge into a large fit; and not while deferred
         * frees wait, which the allocator polls first. Their count, not their list: the
         * allocator's holder changes the list while it lets the lanes go around its queries.) */
        if (rc == VMM_OK && !b && pool == VMM_SMALL &&
            !atomic_load_explicit(&a->n_deferred, memory_order_relaxed) && vmm_tc_trim_lane_all(a, s))
            rc = vmm_pool_malloc_cached(a, NULL, sr, size, s, &b, &rounded, &pool);
        if (rc == VMM_OK && b) {
            sr->bk.mallocs++;
            sr->bk.counts[0]++;
            *ptr = (void *)b->addr;
            done = 1;
        }
        sr->bk.in_path = 0;
    }
    vmm_mutex_unlock(&sr->lock);
    return done;
}

int vmm_lane_free(vmm_allocator *a, void *ptr, size_t trim)
{
    if (!atomic_load_explicit(&a->lanes_on, memory_order_acquire))
        return 0;
    /* trim: the thread cache found this small block fit to cache and its bin full. A second free
     * racing this one (the caller's bug) may free the block's record at any moment until the lane's
     * lock is held and the block found live again: its lane is read under the live-table shard's
     * lock, and its record only once it is live in that lane under that lane's lock. */
    vmm_live_slot sl = {0};
    vmm_stream_rec *sr = NULL;
    int pool;
    vmm_block *b = vmm_live_lane_of(a, (uintptr_t)ptr, trim != 0, &sr, &sl, &pool);
    if (!b || !sr)
        return 0;
    int done = 0;
    vmm_mutex_lock(&sr->lock);
    if (!vmm_live_still(a, (uintptr_t)ptr, b, sr, pool)) {
        vmm_mutex_unlock(&sr->lock);
        return 0; /* freed meanwhile: the allocator says so */
    }
    sr->bk.in_path = 1; /* pool.c counts and recycles records in this lane's books */
    sr->bk.dirty = 1;
    /* the full bin first, as the allocator's free does: the older half of this lane's blocks in
     * it; a bin holding only other lanes' blocks is the allocator's to trim, as is every bin
     * (trim SIZE_MAX: vmm_tc_trim_lane declines it). A block a thread cache holds is not taken
     * (freed already: vmm_free says so). */
    unsigned seen = atomic_load_explicit(&sl.tc_owner, memory_order_relaxed);
    if (lane_usable(a) && b->state == VMM_BLOCK_ALLOCATED && !b->n_uses && !b->grouped &&
        (!trim || vmm_tc_trim_lane(a, trim, sr->key)) && vmm_tc_take_live(a, (uintptr_t)ptr, b, seen)) {
        vmm_count_free(a, &sr->bk.d, b);
        /* stamped with its stream's sequence, as vmm_free does */
        b->free_seq = ++sr->seq;
        b->requested = 0;
        vmm_pool_release(a, b);
        sr->bk.counts[1]++;
        done = 1;
    }
    sr->bk.in_path = 0;
    vmm_mutex_unlock(&sr->lock);
    return done;
}
