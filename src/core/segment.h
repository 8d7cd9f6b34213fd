/*
 * Core: VA reservations, pages, the handle cache, classic segments (segment.c).
 */
#ifndef VMM_SEGMENT_H
#define VMM_SEGMENT_H

#include "core/types.h"

/* Expandable: map pages so that a free range of `size` bytes exists for stream/pool, and return
 * that FREE block (indexed). VMM_ENOMEM with *short_pages = handles missing when physical memory is
 * short; other codes for driver failures (state unchanged). */
int vmm_seg_grow(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size, vmm_block **out,
                 size_t *short_pages);
/* Unmap idle whole handles inside FREE blocks until `want` pages were freed (SIZE_MAX: all).
 * Returns the number of pages unmapped. */
size_t vmm_seg_reclaim(vmm_allocator *a, size_t want);
/* Release cached handles to the driver (all, or just those whose size is not a multiple of
 * `keep_size`, until `need` bytes were released); returns bytes released. */
size_t vmm_handles_release(vmm_allocator *a, size_t keep_size, size_t need);
/* Free reservations that are wholly unmapped. */
void vmm_seg_free_empty(vmm_allocator *a);
/* Classic: cuMemAlloc a segment for a rounded request; returns its FREE block (indexed). */
int vmm_seg_classic_alloc(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size,
                          vmm_block **out);
/* Classic: free cached whole segments (only >= min_size; stop once `need` bytes freed). */
size_t vmm_seg_classic_release(vmm_allocator *a, size_t min_size, size_t need, int oldest_first);
/* Destroy every segment, handle and record. */
void vmm_seg_destroy_all(vmm_allocator *a);
/* Grant the peers of the peer_access key (vmm_create). VMM_ECONFIG for a listed peer refused. */
int vmm_seg_peers_init(vmm_allocator *a);
/* Sum of bytes of cached handles, per pool (for stats checks). */
size_t vmm_handles_bytes(const vmm_allocator *a, int pool);
/* Quarantine entry (see vmm_quarantined) covering va, NULL when none (vmm_check). */
const vmm_quarantined *vmm_quarantine_find(const vmm_allocator *a, uintptr_t va);
/* Map pages [p0, p0 + n) of expandable segment seg with cached or new handles and grant access
 * (peers included), as growth does: VMM_ENOMEM with *short_pages when memory is short; on any
 * failure nothing is mapped. Block states are the caller's business (sleep.c: wake). */
int vmm_seg_map_pages(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n, size_t *short_pages);
/* Unmap the handle mapped at page pg of seg, every page it covers (no-op when unmapped), and
 * release it (release = 1; a handle the driver will not release is cached) or cache it (0).
 * VMM_EDRIVER when the unmap fails (nothing changed), VMM_EHOSTMEM. Block states are the caller's
 * business. */
int vmm_seg_unmap_page(vmm_allocator *a, vmm_segment *seg, size_t pg, int release);
/* Pages from pg to the end of the handle mapped there (1 when pg is unmapped). */
size_t vmm_seg_handle_pages(const vmm_segment *s, size_t pg);
/* Physical handles mapped in s (vmm_check counts handles). */
size_t vmm_seg_handles(const vmm_segment *s);
/* vmm_check's part: handle extents of s; NULL when right, else what is wrong (*at: where). */
const char *vmm_seg_check_handles(const vmm_segment *s, uintptr_t *at);
/* Unmap the pages of a DETACHING block after its before_unmap (callbacks.c): see segment.c. */
size_t vmm_seg_finish_detached(vmm_allocator *a, vmm_block *u, vmm_block **rest);

#endif /* VMM_SEGMENT_H */
