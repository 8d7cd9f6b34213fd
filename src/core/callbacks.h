/*
 * Core: free-memory and mapping callbacks (callbacks.c).
 */
#ifndef VMM_CALLBACKS_H
#define VMM_CALLBACKS_H

#include "core/types.h"

/* vmm_add_free_memory_callback with the lock held (api/ipc_api.c registers its collector so). */
int vmm_cb_add_free_locked(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx);
/* Run the free-memory callbacks with the lock released (caller holds it; it is held again on
 * return). Returns 1 when one reported freeing memory. */
int vmm_cb_run_free(vmm_allocator *a);
/* seg_map_pages succeeded on pages [p0, p0 + n) of seg (caller holds the lock): queue after_map,
 * in the notice vmm_cb_reserve made. Cannot fail. */
void vmm_cb_mapped(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n);
/* Room for one more queued notice of n pages, made before mapping so that vmm_cb_mapped cannot
 * fail. VMM_EHOSTMEM (message set). */
int vmm_cb_reserve(vmm_allocator *a, size_t n);
/* reclaim of whole pages [p0, p1) (segment page numbers) of FREE block b (in its index) while
 * mapping callbacks are set: carve them into a DETACHING block (out of every index), queue its
 * before_unmap. Returns the pages detached (0 on a host-memory failure: nothing changed). */
size_t vmm_cb_detach(vmm_allocator *a, vmm_block *b, size_t p0, size_t p1);
/* Work is queued (notices, detached pages): the caller should vmm_unlock_deliver. */
int vmm_cb_pending(const vmm_allocator *a);
/* Caller holds the lock: deliver what is queued (lock released meanwhile), then hold it again.
 * wait: until this thread delivered (else another thread delivering now does it). A no-op inside a
 * callback (the delivering thread goes on after it). */
void vmm_cb_flush(vmm_allocator *a, int wait);
/* Release the lock, deliver queued notices in order (no lock but the delivery mutex held), then
 * take the lock again to unmap the detached pages whose before_unmap ran, and release it. */
void vmm_unlock_deliver(vmm_allocator *a);
/* The same, waiting (a few seconds at most) when another thread delivers: for a malloc that needs
 * detached pages unmapped. */
void vmm_unlock_deliver_wait(vmm_allocator *a);
/* Notices made ahead (sleep / wake): a list of after_map (unmap 0) or before_unmap (1) notices for
 * pages [p0, p0 + n) of seg, queued together in the order added, or freed. */
typedef struct vmm_cb_notice vmm_cb_notice;
int vmm_cb_list_add(vmm_allocator *a, vmm_cb_notice **list, vmm_segment *seg, size_t p0, size_t n, int unmap);
void vmm_cb_list_queue(vmm_allocator *a, vmm_cb_notice *list);
void vmm_cb_list_free(vmm_allocator *a, vmm_cb_notice *list);
/* This thread runs a mapping callback of a (sleep / wake refuse to run there). */
int vmm_cb_delivering(const vmm_allocator *a);
/* Block b is on the detach list (vmm_check). */
int vmm_cb_is_detaching(const vmm_allocator *a, const vmm_block *b);
int vmm_cb_check(vmm_allocator *a);
/* vmm_destroy, before taking the lock: before_unmap for every mapping, then free the state. */
void vmm_cb_destroy(vmm_allocator *a);

#endif /* VMM_CALLBACKS_H */
