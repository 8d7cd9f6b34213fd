/*
 * Core: the allocator lock: the allocator's futex mutex plus, while lanes are open, every
 * lane's lock (lock.c; lanes themselves: lane.c).
 */
#ifndef VMM_LOCK_H
#define VMM_LOCK_H

#include <stdatomic.h>

#include "base/mutex.h"
#include "core/types.h"

/* Lock ranks (base/mutex.h's witness checks them in Debug and sanitizer builds): a thread waits for
 * a lock only while holding locks of lower ranks (lanes: several, in list order). The registry
 * mutex of the thread caches (tcache.c, a pthread mutex, not checked) comes before them all.
 * A free takes a shard's lock and then only *tries* a cache's: a try never waits, so it may go
 * against the order (docs/design.md, "Locks, in order"). */
enum {
    VMM_RANK_ALLOCATOR = 1, /* vmm_lock's own mutex (a->lock) */
    VMM_RANK_LANE = 2,      /* a lane's lock (vmm_stream_rec.lock) */
    VMM_RANK_CACHE = 3,     /* a thread cache's lock (tcache.c) */
    VMM_RANK_DEPOT = 4,     /* the depot's lock (tcache.c) */
    VMM_RANK_SHARD = 5,     /* a live-table shard's lock (pool.c) */
};

/* While lanes are open, the allocator lock holds every lane's lock too (lock.c; vmm_lock / vmm_unlock call
 * these with the allocator's own lock held); taking them folds the lanes' books into the
 * allocator's counters, so every holder of the allocator lock sees them up to date. */
void vmm_lanes_lock_but(vmm_allocator *a, const vmm_stream_rec *keep);
void vmm_lanes_unlock_but(vmm_allocator *a, const vmm_stream_rec *keep);

/* While lanes are open the allocator lock holds every lane's lock too. Inline: one branch more
 * than the mutex alone on the one-thread path, which takes it twice per malloc + free pair. */
static inline void vmm_lock(vmm_allocator *a)
{
    vmm_mutex_lock(&a->lock);
    if (VMM_UNLIKELY(a->lanes_open))
        vmm_lanes_lock_but(a, NULL);
}

static inline void vmm_unlock(vmm_allocator *a)
{
    if (VMM_UNLIKELY(a->lanes_open))
        vmm_lanes_unlock_but(a, NULL);
    vmm_mutex_unlock(&a->lock);
}

/* Allocator lock held, around a driver call: the lanes other than keep (NULL: all) let go, so that
 * other streams' lane paths run while the driver works (lane.c, "Driver calls"). Between the two
 * the caller touches no state of a lane it let go; vmm_lanes_resume takes them again and folds
 * their books, and what the caller read of their state before may have changed. A pair inside
 * another (a batch of calls let go once, such as the poll of pending frees) does nothing; an inner
 * pair must then not need a lane kept, which only an outer pair with keep NULL could break. */
static inline void vmm_lanes_yield(vmm_allocator *a, const vmm_stream_rec *keep)
{
    if (VMM_UNLIKELY(a->lanes_open) && a->lanes_let_go++ == 0)
        vmm_lanes_unlock_but(a, keep);
}

static inline void vmm_lanes_resume(vmm_allocator *a, const vmm_stream_rec *keep)
{
    if (VMM_UNLIKELY(a->lanes_open) && --a->lanes_let_go == 0)
        vmm_lanes_lock_but(a, keep);
}

/* Lane paths may run (a relaxed peek; the lane functions read it again with acquire). */
static inline int vmm_lanes_on(const vmm_allocator *a)
{
    return atomic_load_explicit(&a->lanes_on, memory_order_relaxed);
}

#endif /* VMM_LOCK_H */
