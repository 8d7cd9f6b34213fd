/*
 * Private pools (PyTorch's graph pools): vmm_pool_begin / end / retain / release and what the rest
 * of the allocator asks of them.
 *
 * A pool is a set of segments whose FREE and UNMAPPED blocks live in the pool's own indexes
 * (vmm_mempool.free_tree / unmapped_tree; VMM_FREE_ROOT picks a segment's), so the default pools'
 * best fit, growth, page recycling and reclaim never see them: only allocations routed to the pool
 * reuse its blocks, and its pages stay mapped while it has users, because every replay of a graph
 * writes all the memory its capture was given. Growth works as in the default pools (expandable
 * segments: pages mapped on demand, cached or idle pages of the default pools taken first).
 *
 * Routes (PyTorch's captures_underway): (pool, stream or filter), tried oldest first by every
 * malloc while any is in force (vmm_mempool_route). n_routes != 0 is also the allocator's "captures
 * underway" (capture.c).
 *
 * Use counts follow PyTorch's beginAllocateToPool / releasePool: a begin creates the pool with one
 * user or adds one; release takes one away. At zero the pool is dissolved: after one device
 * synchronization (replays may still run on the memory, on streams the allocator never sees), its
 * segments become default-pool segments, their free blocks cached memory of their stream, the
 * blocks still allocated ordinary blocks. While captures are underway the dissolution waits
 * (freeable), since a synchronization would break them.
 */
#include <stdio.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "core/capture.h"
#include "core/events.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/tcache.h"
#include "core/types.h"
#include "features/mempool.h"

typedef struct vmm_route {
    vmm_mempool *mp;
    vmm_stream stream;
    vmm_stream_filter filter; /* NULL with all_streams 0: only `stream` */
    void *ctx;
    int all_streams;
} vmm_route;

static vmm_mempool *find_pool(const vmm_allocator *a, uint64_t id0, uint64_t id1)
{
    for (vmm_mempool *mp = a->mempools; mp; mp = mp->next)
        if (mp->id[0] == id0 && mp->id[1] == id1)
            return mp;
    return NULL;
}

static size_t find_route(const vmm_allocator *a, const vmm_mempool *mp)
{
    size_t i = 0;
    while (i < a->n_routes && a->routes[i].mp != mp)
        i++;
    return i;
}

vmm_mempool *vmm_mempool_route(vmm_allocator *a, vmm_stream s)
{
    for (size_t i = 0; i < a->n_routes; i++) {
        const vmm_route *r = &a->routes[i];
        if (r->filter ? r->filter(r->ctx, s) != 0 : (r->all_streams || r->stream == s))
            return r->mp;
    }
    return NULL;
}

/* ---- creating, dissolving ---------------------------------------------------------------------- */

static vmm_mempool *pool_new(vmm_allocator *a, uint64_t id0, uint64_t id1)
{
    vmm_mempool *mp = vmm_meta_alloc(a->meta, sizeof *mp);
    if (!mp)
        return NULL;
    mp->id[0] = id0;
    mp->id[1] = id1;
    mp->next = a->mempools;
    a->mempools = mp;
    return mp;
}

static void pool_unlink(vmm_allocator *a, vmm_mempool *mp)
{
    for (vmm_mempool **pp = &a->mempools; *pp; pp = &(*pp)->next)
        if (*pp == mp) {
            *pp = mp->next;
            break;
        }
    vmm_meta_free(a->meta, mp, sizeof *mp);
}

/* Hand every segment of mp to the default pools: indexed blocks move from mp's indexes to the
 * allocator's. Returns VMM_EHOSTMEM (nothing changed) when the list of blocks cannot be had. */
static int dissolve(vmm_allocator *a, vmm_mempool *mp)
{
    size_t n = 0;
    for (vmm_segment *s = a->segs; s; s = s->next)
        for (vmm_block *b = s->mp == mp ? s->first : NULL; b; b = b->next)
            n += b->in_index;
    vmm_block **moved = n ? vmm_meta_alloc(a->meta, n * sizeof *moved) : NULL;
    if (n && !moved)
        return vmm_fail(VMM_EHOSTMEM, "vmm_pool_release: out of host memory");
    size_t k = 0;
    for (vmm_segment *s = a->segs; s; s = s->next) {
        if (s->mp != mp)
            continue;
        for (vmm_block *b = s->first; b; b = b->next)
            if (b->in_index) {
                vmm_pool_erase(a, b);
                moved[k++] = b;
            }
        s->mp = NULL;
    }
    for (size_t i = 0; i < k; i++)
        vmm_pool_insert(a, moved[i]);
    if (moved)
        vmm_meta_free(a->meta, moved, n * sizeof *moved);
    pool_unlink(a, mp);
    return VMM_OK;
}

/* A segment of mp belongs to a tag that sleeps: dissolved now, the segment (mapped: pools do not
 * sleep) would join the default pools of a sleeping tag, whose segments are all asleep. It waits
 * for the wake (vmm_wake settles). */
static int tag_sleeps(const vmm_allocator *a, const vmm_mempool *mp)
{
    for (const vmm_segment *s = a->sleep ? a->segs : NULL; s; s = s->next)
        if (s->mp == mp && a->hooks.tag_asleep(a, s->srec->tag))
            return 1;
    return 0;
}

static int dissolvable(const vmm_allocator *a, const vmm_mempool *mp)
{
    return mp->freeable && !mp->routed && !tag_sleeps(a, mp);
}

static int any_freeable(const vmm_allocator *a)
{
    for (const vmm_mempool *mp = a->mempools; mp; mp = mp->next)
        if (dissolvable(a, mp))
            return 1;
    return 0;
}

/* Dissolve the released pools (no user left), if no capture is underway. VMM_OK, or the failure of
 * the synchronization (message set; they stay for a later try). */
static int settle(vmm_allocator *a)
{
    if (a->n_routes || !any_freeable(a))
        return VMM_OK;
    /* Replays of the pools' graphs may still run (on any stream): wait for the device once. */
    int m = vmm_capture_relax(a);
    int r = a->drv->ops->device_sync(a->drv);
    vmm_capture_restore(a, m);
    a->stats.num_sync_all_streams++;
    if (r)
        return vmm_fail_drv(r, "vmm_pool_release: device_sync");
    /* Everything queued so far has run: every free stamped so far is idle. */
    for (vmm_stream_rec *sr = a->streams; sr; sr = sr->next)
        if (sr->done_seq < sr->seq)
            sr->done_seq = sr->seq;
    int rc = VMM_OK;
    for (vmm_mempool *mp = a->mempools, *next; mp; mp = next) {
        next = mp->next;
        if (dissolvable(a, mp) && rc == VMM_OK)
            rc = dissolve(a, mp);
    }
    return rc;
}

void vmm_mempool_settle(vmm_allocator *a) { (void)settle(a); }

/* ---- public API ---------------------------------------------------------------------------------- */

static int begin(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_stream stream, vmm_stream_filter filter,
                 void *ctx, int all, const char *fn)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "%s: allocator is NULL", fn);
    if (!id0 && !id1)
        return vmm_fail(VMM_EINVAL, "%s: pool id (0, 0) names the default pools", fn);
    vmm_lock(a);
    int rc = VMM_OK;
    vmm_mempool *mp = find_pool(a, id0, id1);
    if (mp && mp->routed)
        rc = vmm_fail(VMM_EINVAL, "%s: allocations are routed to pool (%llu, %llu) already", fn,
                      (unsigned long long)id0, (unsigned long long)id1);
    if (!rc && a->n_routes == a->cap_routes) {
        size_t ncap = a->cap_routes ? a->cap_routes * 2 : 4;
        vmm_route *nr = vmm_meta_alloc(a->meta, ncap * sizeof *nr);
        if (!nr) {
            rc = vmm_fail(VMM_EHOSTMEM, "%s: out of host memory", fn);
        } else {
            for (size_t i = 0; i < a->n_routes; i++)
                nr[i] = a->routes[i];
            if (a->routes)
                vmm_meta_free(a->meta, a->routes, a->cap_routes * sizeof *nr);
            a->routes = nr;
            a->cap_routes = ncap;
        }
    }
    if (!rc && !mp && !(mp = pool_new(a, id0, id1)))
        rc = vmm_fail(VMM_EHOSTMEM, "%s: out of host memory", fn);
    if (!rc) {
        /* a pool released to no user and not dissolved yet comes back to life */
        mp->use_count = mp->use_count > 0 ? mp->use_count + 1 : 1;
        mp->freeable = 0;
        mp->routed = 1;
        vmm_tc_off(a); /* routed allocations go to private pools: all under the lock */
        a->routes[a->n_routes++] = (vmm_route){mp, stream, filter, ctx, all};
    }
    vmm_unlock(a);
    return rc;
}

VMM_API int vmm_pool_begin(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_stream stream)
{
    return begin(a, id0, id1, stream, NULL, NULL, 0, "vmm_pool_begin");
}

VMM_API int vmm_pool_begin_filter(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_stream_filter filter,
                                  void *ctx)
{
    return begin(a, id0, id1, NULL, filter, ctx, filter == NULL, "vmm_pool_begin_filter");
}

VMM_API int vmm_pool_end(vmm_allocator *a, uint64_t id0, uint64_t id1)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pool_end: allocator is NULL");
    vmm_lock(a);
    int rc = VMM_OK;
    vmm_mempool *mp = find_pool(a, id0, id1);
    size_t i = mp ? find_route(a, mp) : a->n_routes;
    if (i == a->n_routes) {
        rc = vmm_fail(VMM_EINVAL, "vmm_pool_end: no allocations are routed to pool (%llu, %llu)",
                      (unsigned long long)id0, (unsigned long long)id1);
    } else {
        for (; i + 1 < a->n_routes; i++)
            a->routes[i] = a->routes[i + 1];
        a->n_routes--;
        mp->routed = 0;
        if (!a->n_routes) {
            /* no capture underway any more (as far as routes tell): what waited for that goes on */
            int m = vmm_capture_relax(a);
            vmm_events_process(a);
            (void)settle(a);
            vmm_capture_restore(a, m);
        }
    }
    vmm_unlock(a);
    return rc;
}

VMM_API int vmm_pool_retain(vmm_allocator *a, uint64_t id0, uint64_t id1)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pool_retain: allocator is NULL");
    if (!id0 && !id1)
        return vmm_fail(VMM_EINVAL, "vmm_pool_retain: pool id (0, 0) names the default pools");
    vmm_lock(a);
    int rc = VMM_OK;
    vmm_mempool *mp = find_pool(a, id0, id1);
    if (!mp && !(mp = pool_new(a, id0, id1)))
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_pool_retain: out of host memory");
    if (!rc) {
        mp->use_count = mp->use_count > 0 ? mp->use_count + 1 : 1;
        mp->freeable = 0;
    }
    vmm_unlock(a);
    return rc;
}

/* parenthesized: not internal.h's two-argument macro */
VMM_API int(vmm_pool_release)(vmm_allocator *a, uint64_t id0, uint64_t id1)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_pool_release: allocator is NULL");
    vmm_lock(a);
    int rc = VMM_OK;
    vmm_mempool *mp = find_pool(a, id0, id1);
    if (!mp || mp->use_count <= 0) {
        rc = vmm_fail(VMM_EINVAL, "vmm_pool_release: pool (%llu, %llu) %s", (unsigned long long)id0,
                      (unsigned long long)id1, mp ? "has no user left" : "does not exist");
    } else if (--mp->use_count == 0) {
        mp->freeable = 1;
        rc = settle(a);
    }
    vmm_unlock(a);
    return rc;
}

static void pool_stats(const vmm_allocator *a, const vmm_mempool *mp, vmm_pool_stats *o)
{
    o->use_count = mp->use_count;
    o->routed = mp->routed;
    o->num_mallocs = (int64_t)mp->n_mallocs;
    for (const vmm_segment *s = a->segs; s; s = s->next) {
        if (s->mp != mp)
            continue;
        o->segments++;
        o->reserved_bytes += (int64_t)(s->expandable ? s->mapped_pages * s->page_size : s->size);
        for (const vmm_block *b = s->first; b; b = b->next) {
            if (b->state == VMM_BLOCK_ALLOCATED) {
                o->allocations++;
                o->allocated_bytes += (int64_t)b->size;
            } else if (b->state == VMM_BLOCK_PENDING) {
                o->pending_bytes += (int64_t)b->size;
            } else if (b->state == VMM_BLOCK_FREE) {
                o->free_bytes += (int64_t)b->size;
            }
        }
    }
}

VMM_API int vmm_pool_get_stats(vmm_allocator *a, uint64_t id0, uint64_t id1, vmm_pool_stats *out)
{
    if (!a || !out)
        return vmm_fail(VMM_EINVAL, "vmm_pool_get_stats: NULL argument");
    vmm_lock(a);
    const vmm_mempool *mp = find_pool(a, id0, id1);
    int rc = VMM_OK;
    if (!mp) {
        rc = vmm_fail(VMM_EINVAL, "vmm_pool_get_stats: no pool (%llu, %llu)", (unsigned long long)id0,
                      (unsigned long long)id1);
    } else {
        *out = (vmm_pool_stats){0};
        pool_stats(a, mp, out);
    }
    vmm_unlock(a);
    return rc;
}

VMM_API int vmm_pool_lookup(vmm_allocator *a, const void *ptr, uint64_t *id0, uint64_t *id1)
{
    if (!a || !id0 || !id1)
        return vmm_fail(VMM_EINVAL, "vmm_pool_lookup: NULL argument");
    uintptr_t p = (uintptr_t)ptr;
    vmm_lock(a);
    const vmm_segment *s = a->segs;
    while (s && !(p >= s->base && p - s->base < s->size))
        s = s->next;
    uint64_t id[2] = {0, 0};
    if (s)
        vmm_mempool_id_of(s, id);
    vmm_unlock(a);
    *id0 = id[0];
    *id1 = id[1];
    return s ? VMM_OK
             : vmm_fail(VMM_EBADPTR, "vmm_pool_lookup: %p is not in a segment of this allocator", ptr);
}

/* ---- for the rest of the allocator ---------------------------------------------------------------- */

void vmm_mempool_id_of(const vmm_segment *s, uint64_t id[2])
{
    id[0] = s->mp ? s->mp->id[0] : 0;
    id[1] = s->mp ? s->mp->id[1] : 0;
}

void vmm_mempool_totals(const vmm_allocator *a, int64_t *pools, int64_t *reserved, int64_t *allocated,
                        int64_t *routes)
{
    *pools = *reserved = *allocated = 0;
    *routes = (int64_t)a->n_routes;
    for (const vmm_mempool *mp = a->mempools; mp; mp = mp->next)
        (*pools)++;
    if (!a->mempools)
        return;
    for (const vmm_segment *s = a->segs; s; s = s->next) {
        if (!s->mp)
            continue;
        *reserved += (int64_t)(s->expandable ? s->mapped_pages * s->page_size : s->size);
        for (const vmm_block *b = s->first; b; b = b->next)
            if (b->state == VMM_BLOCK_ALLOCATED)
                *allocated += (int64_t)b->size;
    }
}

static size_t tree_count(const vmm_block *t) { return t ? 1 + tree_count(t->left) + tree_count(t->right) : 0; }

int vmm_mempool_check(vmm_allocator *a, size_t *nfree, size_t *nunm)
{
    *nfree = *nunm = 0;
    size_t routed = 0;
    for (const vmm_mempool *mp = a->mempools; mp; mp = mp->next) {
        if ((!mp->id[0] && !mp->id[1]) || mp->use_count < 0)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: private pool with id (0, 0) or a negative use count");
        if (mp->freeable != (mp->use_count == 0))
            return vmm_fail(VMM_ECORRUPT, "vmm_check: pool (%llu, %llu) released state is wrong",
                            (unsigned long long)mp->id[0], (unsigned long long)mp->id[1]);
        if (mp->routed != (find_route(a, mp) < a->n_routes))
            return vmm_fail(VMM_ECORRUPT, "vmm_check: pool (%llu, %llu) route flag is wrong",
                            (unsigned long long)mp->id[0], (unsigned long long)mp->id[1]);
        routed += (size_t)mp->routed;
        for (int p = 0; p < VMM_NPOOLS; p++) {
            *nfree += tree_count(mp->free_tree[p]);
            *nunm += tree_count(mp->unmapped_tree[p]);
        }
    }
    if (routed != a->n_routes)
        return vmm_fail(VMM_ECORRUPT, "vmm_check: %zu routes in force, %zu pools routed", a->n_routes, routed);
    for (const vmm_segment *s = a->segs; s; s = s->next) {
        const vmm_mempool *mp = a->mempools;
        while (s->mp && mp && mp != s->mp)
            mp = mp->next;
        if (s->mp && !mp)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: segment at 0x%llx belongs to a pool that is gone",
                            (unsigned long long)s->base);
    }
    return VMM_OK;
}

void vmm_mempool_destroy_all(vmm_allocator *a)
{
    while (a->mempools) {
        vmm_mempool *mp = a->mempools;
        a->mempools = mp->next;
        vmm_meta_free(a->meta, mp, sizeof *mp);
    }
    if (a->routes)
        vmm_meta_free(a->meta, a->routes, a->cap_routes * sizeof *a->routes);
    a->routes = NULL;
    a->n_routes = a->cap_routes = 0;
}
