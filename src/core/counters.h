/*
 * Core: the statistics counters' updates, inline on the malloc / free path.
 */
#ifndef VMM_COUNTERS_H
#define VMM_COUNTERS_H

#include "core/types.h"

/* Add delta to a single counter (current, peak, allocated / freed). Inline: the malloc / free
 * path makes about 20 of these per pair, a call each cost more than the update. */
static inline void vmm_stat_add(vmm_stat *s, int64_t d)
{
    s->current += d;
    if (d > 0) {
        s->allocated += d;
        if (s->current > s->peak)
            s->peak = s->current;
    } else {
        s->freed -= d;
    }
}
/* Add delta to st[ALL] and st[pool + 1]. */
static inline void vmm_stat_update(vmm_stat *st, int pool, int64_t d)
{
    vmm_stat_add(&st[VMM_POOL_ALL], d);
    vmm_stat_add(&st[pool + 1], d);
}
/* The same with the sign known (d >= 0): no branch on it. */
static inline void vmm_stat_up(vmm_stat *st, int pool, int64_t d)
{
    for (int i = 0; i < 2; i++) {
        vmm_stat *s = &st[i ? pool + 1 : VMM_POOL_ALL];
        s->current += d;
        s->allocated += d;
        if (s->current > s->peak)
            s->peak = s->current;
    }
}
static inline void vmm_stat_down(vmm_stat *st, int pool, int64_t d)
{
    st[VMM_POOL_ALL].current -= d;
    st[VMM_POOL_ALL].freed += d;
    st[pool + 1].current -= d;
    st[pool + 1].freed += d;
}

/* The malloc / free path's stats (allocation, allocated_bytes, requested_bytes, inactive_split,
 * inactive_split_bytes) keep only the pool entries and the ALL peak; ALL's current, allocated and
 * freed are the pools' sums. active / active_bytes keep only their peaks (current = allocation +
 * pending). vmm_stats_derive fills in the rest. A malloc + free pair makes ~12 stat updates; this
 * halves the memory writes. Returns ALL's current. */
static inline int64_t vmm_hot_up(vmm_stat *st, int pool, int64_t d)
{
    vmm_stat *s = &st[pool + 1];
    s->current += d;
    s->allocated += d;
    if (s->current > s->peak)
        s->peak = s->current;
    int64_t all = st[VMM_POOL_SMALL].current + st[VMM_POOL_LARGE].current;
    if (all > st[VMM_POOL_ALL].peak)
        st[VMM_POOL_ALL].peak = all;
    return all;
}
static inline void vmm_hot_down(vmm_stat *st, int pool, int64_t d)
{
    st[pool + 1].current -= d;
    st[pool + 1].freed += d;
}
/* A free of allocated block b in counters st (the allocator's, or a lane's deltas): what pool.c's
 * take counted up. */
static inline void vmm_count_free(const vmm_allocator *a, vmm_stats *st, const vmm_block *b)
{
    int pool = b->seg->pool;
    vmm_hot_down(st->allocation, pool, 1);
    vmm_hot_down(st->allocated_bytes, pool, (int64_t)b->size);
    vmm_hot_down(st->requested_bytes, pool, (int64_t)b->requested);
    if (a->cfg.max_split_size != SIZE_MAX && b->size >= a->cfg.max_split_size)
        vmm_stat_add(&st->oversize_allocations, -1);
}
static inline void vmm_peak_at(vmm_stat *s, int64_t current)
{
    if (current > s->peak)
        s->peak = current;
}

#endif /* VMM_COUNTERS_H */
