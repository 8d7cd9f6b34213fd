/*
 * Core: per-thread caches of small freed blocks and the depot (tcache.c).
 */
#ifndef VMM_TCACHE_H
#define VMM_TCACHE_H

#include "core/types.h"

typedef struct vmm_tcache vmm_tcache;
typedef struct vmm_tc_state vmm_tc_state;
/* Give a cached block back to its pool (allocator lock held, block out of its bin): the
 * structural part of a free, no stats (the cache's delta counted it). alloc.c's. */
typedef void (*vmm_tc_release_fn)(vmm_allocator *a, vmm_block *b);
/* vmm_create: caches of at most cap_bytes (0: off); simple_round: sizes up to 64 KiB round to
 * 512 B steps; depot: full bins of freeing threads may go to the depot. VMM_EHOSTMEM. */
int vmm_tc_setup(vmm_allocator *a, size_t cap_bytes, int simple_round, int depot,
                 vmm_tc_release_fn release);
/* vmm_destroy: first (no lock held) unregister, so exiting threads leave a alone; then (lock
 * held) give back every cache's blocks and free the caches. */
void vmm_tc_unregister(vmm_allocator *a);
void vmm_tc_destroy(vmm_allocator *a);
/* Fast paths, allocator lock NOT held: 1 when served by the calling thread's cache, 0 when the
 * allocator must do it (nothing changed). malloc: a block of size's rounded size on stream s. */
int vmm_tc_malloc(vmm_allocator *a, size_t size, vmm_stream s, void **ptr);
/* *trim, when it returns 0: what the caller gives back of the calling thread's cache before its
 * free (vmm_tc_trim_self): 0 nothing, a block size for that bin (it was full, or the cache), or
 * SIZE_MAX for every bin (the cache holds more than a cap that fell). */
int vmm_tc_free(vmm_allocator *a, void *ptr, size_t *trim);
/* Allocator lock held: fold every cache's stats deltas (stats readers), or the calling thread's
 * own (before its slow path changes the counters, which keeps its peaks exact). */
void vmm_tc_fold(vmm_allocator *a);
void vmm_tc_fold_self(vmm_allocator *a);
/* Allocator lock held: give every cache's blocks back (or the calling thread's only); returns the
 * bytes given back. */
size_t vmm_tc_drain(vmm_allocator *a, int self_only);
size_t vmm_tc_drain_one(vmm_allocator *a, vmm_tcache *tc);
/* Allocator lock held: the older half of the calling thread's bin of blocks of `size` back, or of
 * every bin (size SIZE_MAX): a miss that found no fit, a full bin, a full cache; the thread keeps
 * its warm blocks. Returns the bytes given back. */
size_t vmm_tc_trim_self(vmm_allocator *a, size_t size);
/* Lane s's lock held (lane.c), not the allocator's: the older half of the calling thread's blocks
 * of lane s in its bin of `size`-byte blocks back to their pool; no deltas folded. Returns 0 when
 * the bin holds only other lanes' blocks (the allocator trims those), else 1. */
int vmm_tc_trim_lane(vmm_allocator *a, size_t size, vmm_stream s);
/* Lane s's lock held, not the allocator's: the older half of the calling thread's blocks of lane
 * s in every bin back (vmm_tc_trim_self's second step, for one lane; no deltas folded). Returns
 * the bytes given back. */
size_t vmm_tc_trim_lane_all(vmm_allocator *a, vmm_stream s);
/* Lane s's lock held, not the allocator's: vmm_tc_give_fit without folding deltas. */
size_t vmm_tc_give_fit_lane(vmm_allocator *a, size_t size, vmm_stream s);
/* Allocator lock held: the calling thread's smallest cached block of lane s at least `size` bytes
 * back to its pool (a malloc that found no fit: one block, the least disturbance). Returns its
 * size, 0 when the cache has none. */
size_t vmm_tc_give_fit(vmm_allocator *a, size_t size, vmm_stream s);
/* Allocator lock held: caches off for good, drained: sleep, IPC, tags, private pools, history and
 * callbacks need every malloc and free to pass under the allocator lock. */
void vmm_tc_off(vmm_allocator *a);
/* Off for good (vmm_tc_off; not a pause). */
int vmm_tc_disabled(const vmm_allocator *a);
int vmm_tc_on(const vmm_allocator *a);
/* Allocator lock held: caches drained and off until vmm_tc_resume (with pause's return), so that
 * the caller sees one state no thread changes meanwhile (vmm_check, snapshots). */
int vmm_tc_pause(vmm_allocator *a);
void vmm_tc_resume(vmm_allocator *a, int was);
/* Allocator lock or s->blk's lane's held, no thread cache's: 1 when the cache numbered
 * s->tc_owner holds s->blk (takes that cache's lock to look), 0 when no cache does. */
int vmm_tc_holds(vmm_allocator *a, const vmm_live_slot *s);
/* A free's removal from the live table (allocator lock or b's lane's held, no thread cache's): b
 * at addr goes out of the table unless a thread cache holds it (a free of a block freed already).
 * Looking and taking are one step under the lock of the cache the slot names, which every free
 * into that cache holds, so two threads freeing one pointer at once cannot put the block both in a
 * cache and in its pool. hint: the slot's tc_owner as the caller last saw it (0: none), whose
 * cache is locked first. 1 taken, 0 not in the table or cached (nothing changed). */
int vmm_tc_take_live(vmm_allocator *a, uintptr_t addr, const vmm_block *b, unsigned hint);
/* Caches, bytes they hold, most bytes one may hold now, and counts up to the last vmm_tc_fold
 * (the caller folds first, as for the stats): mallocs served and not, frees kept and not (the
 * allocator's), frees kept of blocks another cache handed out; allocator lock held. */
enum { VMM_TC_COUNTS = 5 };
void vmm_tc_info(vmm_allocator *a, size_t *caches, size_t *bytes, size_t *cap,
                 uint64_t counts[VMM_TC_COUNTS]);

#endif /* VMM_TCACHE_H */
