/*
 * Core: block records, the best-fit index, rounding, split, merge, the live table (pool.c).
 */
#ifndef VMM_POOL_H
#define VMM_POOL_H

#include "base/mutex.h"
#include "core/types.h"

size_t vmm_round_size(const vmm_config *c, size_t size);
int vmm_pool_of(size_t rounded);
/* Classic segment size for a rounded request (2 MiB / 20 MiB / round up to 2 MiB). */
size_t vmm_classic_segment_size(size_t rounded);
vmm_block *vmm_block_new(vmm_allocator *a);
void vmm_block_delete(vmm_allocator *a, vmm_block *b);
/* Lifetimes (pool.c): 1 when a request of `size` bytes (rounded) in lane sr is predicted to stay
 * (a large-pool size under 256 MiB most of whose blocks in the lane are still live), 0 when not,
 * -1 when the rule does not apply (lifetime_split off, classic segments, small pool, no lane).
 * Lane's lock or the allocator's held. */
int vmm_pool_long_lived(const vmm_allocator *a, vmm_stream_rec *sr, size_t size);
/* The best fit for `size` (rounded) among lane sr's free blocks of `pool`, whatever lifetime_split
 * predicts (NULL when none fits): what malloc takes before it waits on events for memory. Lane's
 * lock or the allocator's held. */
vmm_block *vmm_pool_fit_any(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size);
/* Whether lane sr has split: its requests predicted to stay go to its longlived segments, the
 * others' growth to its other segments. */
int vmm_pool_life_split(const vmm_stream_rec *sr);
/* alias.c's vmm_alias_enabled (its rule lives here, where the placement of alias_place asks it
 * without calling up into alias.c): alias_pages on, a default-pool expandable large-pool segment of
 * untagged memory, awake, one page per handle, no exportable handles, no mapping callbacks.
 * Allocator lock or seg's lane's held. */
int vmm_pool_aliasable(const vmm_allocator *a, const vmm_segment *seg);
/* Free the recycled records (destroy). */
void vmm_block_cache_drain(vmm_allocator *a);
/* Treap over (stream, size, addr). */
void vmm_tree_insert(vmm_block **root, vmm_block *b);
void vmm_tree_erase(vmm_block **root, vmm_block *b);
vmm_block *vmm_tree_lower_bound(vmm_block *root, vmm_stream s, size_t size, uintptr_t addr);
vmm_block *vmm_tree_next(vmm_block *root, const vmm_block *b);
int vmm_tree_contains(vmm_block *root, const vmm_block *b);
/* Put a FREE / UNMAPPED block in its index (and inactive_split stats), take it out. */
void vmm_pool_insert(vmm_allocator *a, vmm_block *b);
void vmm_pool_erase(vmm_allocator *a, vmm_block *b);
/* Split b (not in an index) so it keeps `size` bytes; returns the remainder (same state, not indexed). */
vmm_block *vmm_block_split(vmm_allocator *a, vmm_block *b, size_t size);
/* The same with a record the caller allocated (cannot fail). */
void vmm_block_split_into(vmm_block *b, vmm_block *r, size_t size);
/* Merge b (not in an index, FREE or UNMAPPED) with neighbours of the same state; returns the result
 * (not indexed). */
vmm_block *vmm_block_merge(vmm_allocator *a, vmm_block *b);
/* Free every record in a lane's record cache (vmm_destroy). */
void vmm_block_cache_drain_books(vmm_allocator *a, vmm_books *bk);
/* Take *b out of the free index for an allocation of `size` (rounded), split if the rules say so,
 * mark it allocated and live, update stats. `fitted`: *b is vmm_pool_best_fit's answer for `size`,
 * which lets a split leave the remainder in *b's index slot; *b is then a new record (the
 * allocated one). */
int vmm_pool_take(vmm_allocator *a, vmm_block **b, size_t size, size_t requested, int fitted);
/* malloc's cached path in one call: round `size`, best fit (in private pool mp's free blocks for
 * lane key s, or lane sr's when mp is NULL; sr NULL: the lane has no record yet, so no block),
 * take. *out NULL (VMM_OK) when no cached block fits; *rounded and *pool are set either way for
 * the slow path. */
int vmm_pool_malloc_cached(vmm_allocator *a, vmm_mempool *mp, vmm_stream_rec *sr, size_t size,
                           vmm_stream s, vmm_block **out, size_t *rounded, int *pool);
/* Return an allocated / pending block to its pool (merge, index, stats). */
void vmm_pool_release_block(vmm_allocator *a, vmm_block *b);
/* vmm_pool_release is also the public release of a private pool (vmmalloc.h, three arguments:
 * mempool.c). Inside the library a call with two arguments (allocator, block) is the block's. */
#define VMM_POOL_RELEASE_PICK_(x1, x2, x3, name, ...) name
#define vmm_pool_release(...)                                                                  \
    VMM_POOL_RELEASE_PICK_(__VA_ARGS__, vmm_pool_release, vmm_pool_release_block, _)(__VA_ARGS__)
/* Live table. */
int vmm_live_insert(vmm_allocator *a, vmm_block *b);
vmm_block *vmm_live_find(vmm_allocator *a, uintptr_t addr);
/* The same by table slot: find gives the slot, remove_at takes it (one probe sequence per free). */
vmm_block *vmm_live_find_slot(vmm_allocator *a, uintptr_t addr, size_t *slot);
void vmm_live_remove_at(vmm_allocator *a, size_t slot);
/* The slot's tc_owner as it reads now (a hint for vmm_tc_take_live). */
unsigned vmm_live_owner_at(const vmm_allocator *a, size_t slot);
/* Find and remove b (at addr; no thread cache may hold it: a drain's own block, or a large-pool
 * block) under its shard's lock in one hold, for writers that another lane may race on the shard:
 * 1 done, 0 it is not there (nothing changed). A free uses vmm_tc_take_live. */
int vmm_live_take(vmm_allocator *a, uintptr_t addr, const vmm_block *b);
/* Writer's locks held: b (allocated) may no longer go to a thread cache (record_stream, groups). */
void vmm_live_tc_forbid(vmm_allocator *a, const vmm_block *b);
/* The live table's hashing, inline for a thread cache's free (tcache.c), which probes a slot on
 * every cached pair. Shards [0, VMM_LIVE_HALF) hold small-pool blocks, the others the large
 * pool's (pool.c, live_shard_of). */
enum { VMM_LIVE_HALF = VMM_LIVE_SHARDS / 2 };
/* A block's shard in its pool's half: its 2 MiB region hashed (Fibonacci hashing, the top bits),
 * so one segment's blocks spread over few shards and two streams' segments seldom share one. */
static inline size_t vmm_live_region_shard(uintptr_t addr)
{
    return (size_t)(((uint64_t)addr >> 21) * 0x9E3779B97F4A7C15ull >> (64 - __builtin_ctz(VMM_LIVE_HALF)));
}
/* Where a shard's probe for addr starts (mask: its capacity - 1). */
static inline size_t vmm_live_hash(uintptr_t addr, size_t mask)
{
    return (size_t)(((uint64_t)addr >> 9) * 0x9E3779B97F4A7C15ull >> 20) & mask;
}
/* Index of addr's block in shard sh, or SIZE_MAX. */
static inline size_t vmm_live_shard_find(const vmm_live_shard *sh, uintptr_t addr)
{
    if (!sh->cap)
        return SIZE_MAX;
    size_t mask = sh->cap - 1;
    for (size_t i = vmm_live_hash(addr, mask); sh->t[i].blk; i = (i + 1) & mask)
        if (sh->t[i].addr == addr)
            return i;
    return SIZE_MAX;
}
/* Thread caches, no allocator lock: addr's slot in its small-pool shard (small-pool shards only:
 * nothing else can be thread-cached) with that shard's lock held (good until
 * vmm_live_slot_unlock), or NULL with none held. A cache's free writes tc_owner there; nothing
 * else of the slot may change. */
static inline vmm_live_slot *vmm_live_slot_lock(vmm_allocator *a, uintptr_t addr, size_t *shard)
{
    size_t s = vmm_live_region_shard(addr);
    vmm_live_shard *sh = &a->live[s];
    vmm_mutex_lock(&sh->lock);
    size_t i = vmm_live_shard_find(sh, addr);
    if (VMM_UNLIKELY(i == SIZE_MAX)) {
        vmm_mutex_unlock(&sh->lock);
        return NULL;
    }
    *shard = s;
    return &sh->t[i];
}
#define vmm_live_slot_unlock(a, shard) vmm_mutex_unlock(&(a)->live[(shard)].lock)
/* The slot vmm_live_slot_lock gave goes out of the table, and its shard's lock is let go. */
void vmm_live_slot_take(vmm_allocator *a, size_t shard, vmm_live_slot *sl);
/* A thread cache hands the block at addr out again for `requested` bytes (its cache's lock held):
 * block record and slot. */
void vmm_live_set_requested(vmm_allocator *a, uintptr_t addr, size_t requested);
/* Tests only (NULL otherwise): called by a full bin's move to the depot after a block left the bin
 * and before its slot names the depot, with both caches' locks held. */
extern void (*vmm_tc_test_depot_hook)(uintptr_t addr);
/* A cached block moves between a thread's cache and the depot (tcache.c; the thread's cache's lock
 * and the depot's held, no shard's): its slot names cache `owner` (0: none), and with
 * requested > 0 it is handed out for that many bytes (record and slot). */
void vmm_live_set_owner(vmm_allocator *a, uintptr_t addr, unsigned owner, size_t requested);
/* vmm_check: NULL when b's slot agrees with b (no thread cache holding anything), else what not. */
const char *vmm_live_check_slot(vmm_allocator *a, const vmm_block *b);
/* Blocks in the live table (thread-cached ones too; allocator lock held). */
size_t vmm_live_count(const vmm_allocator *a);
void vmm_live_free_table(vmm_allocator *a);
/* Lanes' free: the live block at addr (the large pool's shards first unless small_only, whose
 * locks are taken while lanes are open; then the small pool's) and its lane *sr (NULL: a private
 * pool's), read while the block was live; *pool: where it was found; *copy: its small-pool slot.
 * NULL when addr is not live. */
vmm_block *vmm_live_lane_of(vmm_allocator *a, uintptr_t addr, int small_only, vmm_stream_rec **sr,
                            vmm_live_slot *copy, int *pool);
/* Whether addr is still live block b of lane sr in `pool`: with sr's lock held, once true it stays
 * so (only that lane's paths and the allocator lock's holder free its blocks' records). */
int vmm_live_still(vmm_allocator *a, uintptr_t addr, const vmm_block *b, const vmm_stream_rec *sr, int pool);
/* Every block in the live table, thread-cached ones included (allocator lock held). */
#define VMM_LIVE_FOREACH(a, b)                                                                 \
    for (size_t vmm_s_ = 0; vmm_s_ < VMM_LIVE_SHARDS; vmm_s_++)                               \
        for (size_t vmm_i_ = 0; vmm_i_ < (a)->live[vmm_s_].cap; vmm_i_++)                     \
            if (((b) = (a)->live[vmm_s_].t[vmm_i_].blk) != NULL)

#endif /* VMM_POOL_H */
