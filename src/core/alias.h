/*
 * Core: physical aliasing of partly used pages (alias.c), the key alias_pages.
 */
#ifndef VMM_ALIAS_H
#define VMM_ALIAS_H

#include "core/types.h"

/* One physical page (a one-page handle) mapped at two places, its "views". Every byte of the page
 * is owned by exactly one view; in the other it is covered by a SHADOW block (vmm_block_state):
 * shadow[i] is view i's placeholder for the bytes the other view owns, one block inside the page,
 * NULL when view i owns the whole page (then the other's shadow covers it all). View 0 is where
 * the page was first mapped, view 1 the alias a growth made. One exception: a view 1 mapped
 * without access that the driver would not unmap owns nothing, and the bytes it was to own stay
 * SHADOW in view 0 too until vmm_alias_reclaim drops it (vmm_alias_map). */
typedef struct vmm_alias {
    vmm_phys h;
    vmm_segment *seg[2];
    size_t pg[2];              /* page index of each view in its segment */
    vmm_block *shadow[2];
    struct vmm_alias *prev, *next;
} vmm_alias;

/* Whether growth in seg may alias pages: alias_pages on, the large pool's expandable default-pool
 * segments of untagged memory whose handles are one page each, no mapping callbacks, no
 * exportable handles. Allocator lock held. */
int vmm_alias_enabled(const vmm_allocator *a, const vmm_segment *seg);

/* A FREE block of lane sr's large pool that a growth can take as a head page (head = 1: the block
 * is its page's free suffix [y, page end) with 0 < y <= bound) or as a tail page (head = 0: the
 * block is its page's free prefix [0, x) with bound <= x < page), on a page that has one view and
 * lies in an enabled segment, not next to page pg of seg (the view to be made there); the tightest
 * such block, NULL when none. Allocator lock held. */
vmm_block *vmm_alias_find(vmm_allocator *a, vmm_stream_rec *sr, const vmm_segment *seg, size_t pg,
                          int head, size_t bound);

/* alias_place: a free edge of a partly used page in lane sr's large pool, for the view to be made at
 * page pg of seg: head = 1, a page's free suffix (a FREE block starting mid-page and running to the
 * page's end or past it); head = 0, a page's free prefix (a FREE block ending mid-page and starting
 * at that page's start or before). Its length (*len, the edge's bytes in that page) lies in [lo, hi);
 * the shortest such edge, or with `largest` the longest; on a page with one view, in an enabled
 * segment, not next to page pg of seg, not page avoid_pg of avoid_seg (the other view this growth
 * makes). Returns the FREE block holding it, NULL when none. Scans the lane's large free blocks.
 * Allocator lock held. */
vmm_block *vmm_alias_edge(vmm_allocator *a, vmm_stream_rec *sr, const vmm_segment *seg, size_t pg,
                          int head, size_t lo, size_t hi, int largest, const vmm_segment *avoid_seg,
                          size_t avoid_pg, size_t *len);

/* Cut FREE block f (indexed, from vmm_alias_edge) at its edge's page boundary, so the edge is a
 * FREE block of its own inside its page (what vmm_alias_map takes): returns it (indexed), NULL when
 * host memory is short (nothing changed). vmm_alias_edge_join undoes it when the map fails. */
vmm_block *vmm_alias_edge_cut(vmm_allocator *a, vmm_block *f, int head);
void vmm_alias_edge_join(vmm_allocator *a, vmm_block *e);

/* Map the page of FREE block f (from vmm_alias_find) a second time at page pg of u's segment (u:
 * an UNMAPPED indexed block covering that page), one mem_map and one set_access. The new view owns
 * f's bytes, f becomes the old view's SHADOW, the rest of the new page its SHADOW. Returns VMM_OK
 * and *free_out, the (merged, indexed) FREE block holding the new view's bytes; VMM_EHOSTMEM, or
 * VMM_EDRIVER with the driver's refusal (nothing changed). Allocator lock held. */
int vmm_alias_map(vmm_allocator *a, vmm_block *f, vmm_block *u, size_t pg, vmm_block **free_out);

/* Unmap every view that holds no block in use (its owned bytes all FREE and idle: their frees
 * proven complete, after fences are recorded and polled here); the bytes it owned go back to the
 * other view (its SHADOW turns FREE and merges). Returns views unmapped. Growth past the
 * high-water mark and the OOM path call it before they look for idle pages. Allocator lock
 * held. */
size_t vmm_alias_reclaim(vmm_allocator *a);

/* vmm_destroy: unmap every second view and forget the records; the segments' teardown then
 * unmaps and releases each handle once. */
void vmm_alias_destroy_all(vmm_allocator *a);

/* vmm_check's part: every record's views map its handle, each view's shadow is the other's owned
 * range; *shadows is the number of SHADOW blocks the records name, *dups the views beyond the
 * first per pool (bytes, to take off reserved counted per mapped page) and *dup_handles. NULL when
 * right, else what is wrong (*at: where). */
const char *vmm_alias_check(const vmm_allocator *a, size_t *shadows, int64_t dups[VMM_NPOOLS],
                            size_t *dup_handles, uintptr_t *at);

#endif /* VMM_ALIAS_H */
