/*
 * API: statistics, JSON, vmm_check (stats.c).
 */
#ifndef VMM_STATS_H
#define VMM_STATS_H

#include "core/types.h"

/* a->stats with the derived counters filled in (caller holds the lock). */
void vmm_stats_derive(const vmm_allocator *a, vmm_stats *out);

#endif /* VMM_STATS_H */
