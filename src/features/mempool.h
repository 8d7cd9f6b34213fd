/*
 * Feature: private pools (mempool.c).
 */
#ifndef VMM_MEMPOOL_H
#define VMM_MEMPOOL_H

#include "core/types.h"

/* The private pool an allocation on stream s goes to while routes are in force (NULL: default). */
vmm_mempool *vmm_mempool_route(vmm_allocator *a, vmm_stream s);
/* Released pools waiting for a moment without captures (and for their tags to be awake):
 * dissolve them now if possible (synchronizes the device once). Called when the last route ends,
 * by vmm_empty_cache and by vmm_wake. */
void vmm_mempool_settle(vmm_allocator *a);
/* Totals over private pools for the stats JSON and the OOM report (caller holds the lock). */
void vmm_mempool_totals(const vmm_allocator *a, int64_t *pools, int64_t *reserved, int64_t *allocated,
                        int64_t *routes);
/* vmm_check's part: pools' indexes, routes. *nfree / *nunm: blocks in the pools' indexes. */
int vmm_mempool_check(vmm_allocator *a, size_t *nfree, size_t *nunm);
/* Pool id of a segment ((0, 0) for the default pools), e.g. for snapshots' segment_pool_id. */
void vmm_mempool_id_of(const vmm_segment *s, uint64_t id[2]);
/* Free every pool record and route (vmm_destroy, after the segments went). */
void vmm_mempool_destroy_all(vmm_allocator *a);

#endif /* VMM_MEMPOOL_H */
