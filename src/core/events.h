/*
 * Core: stream records, the event pool, deferred frees, fences (events.c).
 */
#ifndef VMM_EVENTS_H
#define VMM_EVENTS_H

#include "core/types.h"

/* Stream record of s (created on first use); NULL when out of host memory. */
vmm_stream_rec *vmm_stream_rec_get(vmm_allocator *a, vmm_stream s);
/* Put a new record (fields set) on the list; its lane lock is born held while lanes are open. */
void vmm_stream_rec_link(vmm_allocator *a, vmm_stream_rec *r);
/* The same without creating one: NULL when s has no record yet. Safe without the allocator lock
 * (lane.c): records are linked with a release store (vmm_stream_rec_link), the list head is read
 * atomically, and records live until vmm_destroy. */
vmm_stream_rec *vmm_stream_rec_find(vmm_allocator *a, vmm_stream s);
/* The record whose lane key follows prev's (the first with prev NULL): walks the lanes in the
 * order of their keys, which was the order of the one free index of all lanes before indexes were
 * per lane (reclaim keeps its order so). */
vmm_stream_rec *vmm_stream_rec_next_key(vmm_allocator *a, const vmm_stream_rec *prev);
/* An idle event from the pool, or a new one (VMM_EHOSTMEM / driver status, message set). */
int vmm_event_get(vmm_allocator *a, vmm_event *out);
/* Back to the pool; never fails (the pool has room for every event created). */
void vmm_event_put(vmm_allocator *a, vmm_event e);
/* An event for a use of a block on stream s: from the pool and made recordable on s
 * (event_prepare, when the driver has it). NULL when none could be had; sets no error message
 * (callers go on without one and try again later). */
vmm_event vmm_event_for_use(vmm_allocator *a, vmm_stream s);
/* Free of a block with record_stream uses: record each slot's event on its stream (getting one
 * first for an empty slot) and put the block on the deferred list. Never fails: a slot that
 * cannot be recorded now stays unrecorded, and the deferred scan retries it. */
void vmm_defer_free(vmm_allocator *a, vmm_block *b);
/* Poll pending frees (retrying unrecorded slots first); completed ones return to their pool.
 * Never blocks. */
void vmm_events_process(vmm_allocator *a);
/* Wait for every pending free (counts num_event_waits): unrecorded slots are retried, and when
 * still impossible their stream is synchronized instead (counted as an event wait too). Returns
 * how many pending frees completed. */
size_t vmm_events_wait_all(vmm_allocator *a);
/* Poll outstanding fences (no blocking). */
void vmm_fences_poll(vmm_allocator *a);
/* Record a fence on every stream with frees not yet covered by one. */
void vmm_fences_record(vmm_allocator *a);
/* Wait on outstanding fences (counts num_event_waits); returns how many were waited on. */
size_t vmm_fences_wait(vmm_allocator *a);
/* Memory of a FREE block proven idle (no queued work can still touch it). */
int vmm_block_idle(const vmm_block *b);
/* Destroy: wait all, return events, destroy every event and stream record. */
void vmm_events_shutdown(vmm_allocator *a);
/* Forget fences of a stream that is being destroyed (its work has run). */
void vmm_stream_rec_retire(vmm_allocator *a, vmm_stream s);
/* A stream was created (possibly at a retired stream's address): track it again. */
void vmm_stream_rec_revive(vmm_allocator *a, vmm_stream s);

#endif /* VMM_EVENTS_H */
