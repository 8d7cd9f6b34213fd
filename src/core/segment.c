/*
 * Segments and pages. Expandable segments are VA reservations whose pages are mapped on demand at
 * the lowest unmapped address that fits; idle whole handles inside free blocks are unmapped into a
 * per-device cache of handles and mapped again wherever a request needs them, so physical memory
 * moves and data never does. Classic segments are mem_alloc (cuMemAlloc) allocations as in
 * PyTorch's caching allocator.
 *
 * Handles sized by need. A page is the unit of placement (large_page_size, small_page_size); a
 * physical handle covers one or more consecutive pages, up to max_handle_size in the large pool.
 * Every driver call is paid per handle (cuMemCreate 193 us, cuMemMap, cuMemUnmap), so a growth of
 * n pages takes ceil(n / max) handles of about equal size rather than n one-page handles, while a
 * large growth stays exactly what the request needs (no 20 MiB rounding of fixed big pages). A
 * small growth (fewer pages than one handle covers) maps ahead: its last handle runs on to a whole
 * max_handle_size handle, so a run of small requests (parameters, activations) grows once per
 * 20 MiB like fixed big pages rather than once per request (see plan_handles).
 * CUDA maps and unmaps a handle whole; cuda.h on cuMemUnmap: "The range must be the entire
 * contiguous address range that was mapped to. In other words, cuMemUnmap cannot unmap a sub-range
 * of an address range mapped by cuMemCreate / cuMemMap." So reclaim takes only handles lying wholly
 * inside an idle free block: a big handle with one page still in use stays mapped (its idle pages
 * stay cached in the free block; under memory pressure the OOM path looks elsewhere).
 */
#include <stdio.h>
#include <stdlib.h>

#include "base/base.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/alias.h"
#include "core/callbacks.h"
#include "core/capture.h"
#include "core/counters.h"
#include "core/events.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/segment.h"
#include "core/trace.h"
#include "core/types.h"
#include "driver/driver.h"

/* ---- segment records ---------------------------------------------------------------------- */

static void seg_link(vmm_allocator *a, vmm_segment *s)
{
    s->prev = NULL;
    s->next = a->segs;
    if (a->segs)
        a->segs->prev = s;
    a->segs = s;
    a->n_segs++;
}

static void seg_unlink(vmm_allocator *a, vmm_segment *s)
{
    if (s->prev)
        s->prev->next = s->next;
    else
        a->segs = s->next;
    if (s->next)
        s->next->prev = s->prev;
    a->n_segs--;
}

static void seg_delete(vmm_allocator *a, vmm_segment *s)
{
    if (s->pages)
        vmm_meta_free(a->meta, s->pages, s->n_pages * sizeof *s->pages);
    vmm_meta_free(a->meta, s, sizeof *s);
}

/* ---- cached handles ----------------------------------------------------------------------- */

size_t vmm_handles_bytes(const vmm_allocator *a, int pool)
{
    size_t n = 0;
    for (size_t i = 0; i < a->n_fh; i++)
        if (pool < 0 || a->fh[i].pool == pool)
            n += a->fh[i].size;
    return n;
}

/* What the growths in flight with the lock released (seg_map_pages) hold room for: bytes being
 * created (against the cap), handles being created (in the handle cache), handles being mapped (in
 * the quarantine, for a rollback). */
typedef struct growing_room {
    size_t bytes, handles, maps;
} growing_room;

static growing_room growing(const vmm_allocator *a)
{
    growing_room r = {0, 0, 0};
    for (const vmm_growth *g = a->growing; g; g = g->next) {
        r.bytes += g->new_bytes;
        r.handles += g->new_handles;
        r.maps += g->maps;
    }
    return r;
}

/* Room in the cache for every handle in existence, so putting one back never fails; handles that
 * growths are creating with the lock released count too (they may all come back at once). */
static int fh_reserve(vmm_allocator *a, size_t total)
{
    total += growing(a).handles;
    if (total <= a->cap_fh)
        return VMM_OK;
    size_t ncap = a->cap_fh ? a->cap_fh : 64;
    while (ncap < total)
        ncap *= 2;
    vmm_free_handle *n = vmm_meta_alloc(a->meta, ncap * sizeof *n);
    if (!n)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for the handle cache");
    for (size_t i = 0; i < a->n_fh; i++)
        n[i] = a->fh[i];
    if (a->fh)
        vmm_meta_free(a->meta, a->fh, a->cap_fh * sizeof *n);
    a->fh = n;
    a->cap_fh = ncap;
    return VMM_OK;
}

static void fh_put(vmm_allocator *a, vmm_phys h, size_t size, int pool)
{
    a->fh[a->n_fh].h = h;
    a->fh[a->n_fh].size = size;
    a->fh[a->n_fh].pool = pool;
    a->n_fh++;
}

/* Take a cached handle of exactly `size`, counting its bytes in `pool` from now on. */
static int fh_take(vmm_allocator *a, size_t size, int pool, vmm_phys *out)
{
    for (size_t i = a->n_fh; i-- > 0;) {
        if (a->fh[i].size != size)
            continue;
        *out = a->fh[i].h;
        if (a->fh[i].pool != pool) {
            vmm_stat_update(a->stats.reserved_bytes, a->fh[i].pool, -(int64_t)size);
            vmm_stat_update(a->stats.reserved_bytes, pool, (int64_t)size);
        }
        a->fh[i] = a->fh[--a->n_fh];
        return 1;
    }
    return 0;
}

static int release_at(vmm_allocator *a, size_t i)
{
    /* a cached handle is mapped nowhere: no lane's state (lane.c, "Driver calls") */
    vmm_lanes_yield(a, NULL);
    int r = a->drv->ops->mem_release(a->drv, a->fh[i].h);
    vmm_lanes_resume(a, NULL);
    if (r)
        return vmm_fail_drv(r, "mem_release");
    vmm_stat_update(a->stats.reserved_bytes, a->fh[i].pool, -(int64_t)a->fh[i].size);
    a->stats.num_device_free++;
    a->n_handles--;
    a->fh[i] = a->fh[--a->n_fh];
    return VMM_OK;
}

size_t vmm_handles_release(vmm_allocator *a, size_t keep_size, size_t need)
{
    size_t freed = 0;
    for (size_t i = a->n_fh; i-- > 0 && freed < need;) {
        if (keep_size && a->fh[i].size % keep_size == 0)
            continue;
        size_t sz = a->fh[i].size;
        if (release_at(a, i) != VMM_OK)
            break;
        freed += sz;
    }
    return freed;
}

/* ---- handle plans ------------------------------------------------------------------------- */

/* Most pages one handle may cover in segments of `pool`. Exportable pages stay one per handle:
 * vmm_ipc_get_handle exports, and vmm_ipc_open maps, one handle per page (api/ipc_api.c). The
 * small pool keeps its pages single too: its growths are one page. */
enum { HANDLE_PAGES_MAX = 512 }; /* bounds the plan's table (1 GiB of 2 MiB pages) */
static size_t handle_pages_max(const vmm_allocator *a, int pool)
{
    size_t ps = a->page_size[pool];
    if (pool != VMM_LARGE || a->dev.posix_fd_handles || a->cfg.max_handle_size <= ps)
        return 1;
    size_t m = a->cfg.max_handle_size / ps;
    return m < HANDLE_PAGES_MAX ? m : HANDLE_PAGES_MAX;
}

/* The handles for a mapping of n pages of size ps, at most m pages per handle: cached handles that
 * fit first, largest first (a remap costs an unmap and a map, a new handle a create as well); when
 * some pages are left and the mapping may run on to n_max pages, one cached handle that covers the
 * rest and overshoots by no more than that (its bytes are reserved already: mapping them costs no
 * memory, and the surplus is a free block for later requests); what is still left in
 * ceil(left / m) new handles of about equal size. With `tail` (growth), the last page gets a
 * handle of its own: it usually also holds the bytes of the requests placed after this one, and
 * whatever is placed there later straddles the growth's end, so a big handle reaching into it
 * would stay mapped while any of them lives, where a one-page handle lets the rest go back once
 * this request's range is free. It costs one create per growth and buys most of the peak
 * (measured: without it the replays reserve up to 0.4% more at their peak; docs/benchmarks.md,
 * "Driver calls: handles sized by need").
 *
 * `ahead` (small growths, see seg_map_pages): the last page's handle reaches up to `ahead` pages
 * past the request, at most a whole handle of m pages and no further than n_max. Those pages cost
 * no driver call (one create and one map either way; set_access covers the mapping's whole range in
 * one call) and hold the next requests, which are then placed without a growth of their own: each
 * growth costs at least a create and a set_access (229 us), most of the driver time of traces that
 * allocate many small tensors in a row. The surplus shares its handle with the request's last page,
 * as that page is shared with the next requests anyway. Large growths do not map ahead: they come
 * one at a time near the peak (the last activations, the logits), where pages mapped ahead would
 * stay unused and raise the peak (measured: up to +1.4% reserved at the peak; docs/benchmarks.md). */
typedef struct handle_plan {
    size_t n;                  /* pages mapped (n, or more with an overshooting cached handle) */
    size_t n_cached;           /* handles taken from the cache: chunk[0 .. n_cached) */
    size_t n_new;              /* handles to create: chunk[n_cached .. n_cached + n_new) */
    size_t cached_pages, new_pages;
    size_t *chunk;             /* pages per handle, in mapping order; NULL: counts only */
    size_t keep[HANDLE_PAGES_MAX + 1]; /* cached handles taken, by pages */
} handle_plan;

static void plan_handles(const vmm_allocator *a, size_t ps, size_t m, size_t n, size_t n_max,
                         int tail, size_t ahead, handle_plan *pl)
{
    size_t cnt[HANDLE_PAGES_MAX + 1] = {0};
    for (size_t i = 0; i < a->n_fh; i++) {
        size_t sz = a->fh[i].size;
        if (sz % ps == 0 && sz / ps <= m)
            cnt[sz / ps]++;
    }
    size_t *chunk = pl->chunk, k = 0, left = n;
    for (size_t i = 0; i <= m; i++)
        pl->keep[i] = 0;
    for (size_t p = m < left ? m : left; p >= 1 && left; p--) {
        size_t t = cnt[p] < left / p ? cnt[p] : left / p;
        cnt[p] -= t;
        pl->keep[p] += t;
        left -= t * p;
        for (; chunk && t; t--)
            chunk[k++] = p;
        if (p > left && left)
            p = left + 1; /* next round: the largest that still fits */
    }
    if (!chunk)
        for (size_t p = 1; p <= m; p++)
            k += pl->keep[p];
    pl->n = n;
    if (left && n_max > n) {
        for (size_t p = left + 1; p <= m && p <= left + (n_max - n); p++) {
            if (!cnt[p])
                continue;
            pl->keep[p]++;
            if (chunk)
                chunk[k] = p;
            k++;
            pl->n = n - left + p;
            left = 0;
            break;
        }
    }
    pl->n_cached = k;
    pl->cached_pages = pl->n - left;
    pl->new_pages = left;
    if (ahead > m - 1)
        ahead = m - 1;
    if (ahead > n_max - pl->n)
        ahead = n_max - pl->n;
    if (tail && m > 1 && left && (left > 1 || ahead)) {
        /* the last page alone, or with the pages ahead */
        size_t l = left - 1, nn = (l + m - 1) / m;
        pl->n_new = nn + 1;
        for (size_t j = 0; chunk && j < nn; j++)
            chunk[k + j] = l / nn + (j < l % nn);
        if (chunk)
            chunk[k + nn] = 1 + ahead;
        pl->n += ahead;
        pl->new_pages += ahead;
        return;
    }
    pl->n_new = (left + m - 1) / m;
    for (size_t j = 0; chunk && j < pl->n_new; j++)
        chunk[k + j] = left / pl->n_new + (j < left % pl->n_new);
}

/* Release cached handles the plan does not take, until `need` bytes were released. */
static size_t release_unplanned(vmm_allocator *a, size_t ps, size_t m, const handle_plan *pl, size_t need)
{
    size_t keep[HANDLE_PAGES_MAX + 1], freed = 0;
    for (size_t i = 0; i <= m; i++)
        keep[i] = pl->keep[i];
    for (size_t i = a->n_fh; i-- > 0 && freed < need;) {
        size_t sz = a->fh[i].size;
        if (sz % ps == 0 && sz / ps <= m && keep[sz / ps]) {
            keep[sz / ps]--;
            continue;
        }
        if (release_at(a, i) != VMM_OK)
            break;
        freed += sz;
        /* release_at moved the last entry to i: it was looked at already */
    }
    return freed;
}

/* Growth sizes handles by need while at least 1/PRESSURE_DIVISOR of the allocator's limit stays
 * unreserved after it; nearer the limit it maps one handle per page (see seg_map_pages). */
enum { PRESSURE_DIVISOR = 8 };

/* Reserved bytes, and the bytes growths are creating with the lock released: room checks count
 * them, so that two threads cannot both pass the cap with the same room. */
static size_t reserved_now(const vmm_allocator *a)
{
    return (size_t)a->stats.reserved_bytes[VMM_POOL_ALL].current + growing(a).bytes;
}

/* ---- mapping ------------------------------------------------------------------------------ */

/* Unmap one page. Rollback paths retry a few times: a mapping must not outlive its record. The
 * lanes but keep (NULL: all) are let go meanwhile (lane.c, "Driver calls"): callers pass NULL where
 * the range is in no lane's reach (DETACHING, MAPPING, UNMAPPED or quarantined), else the lane of
 * the segment, whose blocks then stay as the caller left them. */
enum { UNMAP_TRIES = 8 };
static int unmap_page(vmm_allocator *a, const vmm_stream_rec *keep, uintptr_t va, size_t ps, int tries)
{
    int r = VMM_DRV_SUCCESS;
    vmm_lanes_yield(a, keep);
    for (int t = 0; t < tries; t++)
        if ((r = a->drv->ops->mem_unmap(a->drv, va, ps)) == VMM_DRV_SUCCESS)
            break;
    vmm_lanes_resume(a, keep);
    return r;
}

/* ---- quarantine of pages whose rollback unmap failed ---------------------------------------- */

/* Such a page's handle is still mapped: caching it would let it be mapped elsewhere too, and its
 * VA cannot be mapped again. It waits here (bytes still reserved) until an unmap succeeds. */

const vmm_quarantined *vmm_quarantine_find(const vmm_allocator *a, uintptr_t va)
{
    for (size_t i = 0; i < a->n_quar; i++)
        if (va >= a->quar[i].va && va - a->quar[i].va < a->quar[i].size)
            return &a->quar[i];
    return NULL;
}

/* Entries overlapping [va, va + size). */
static int quar_overlaps(const vmm_allocator *a, uintptr_t va, size_t size)
{
    for (size_t i = 0; i < a->n_quar; i++)
        if (a->quar[i].va < va + size && va < a->quar[i].va + a->quar[i].size)
            return 1;
    return 0;
}

/* Room for `total` entries, made before a growth maps anything so that a rollback cannot fail. */
static int quar_reserve(vmm_allocator *a, size_t total)
{
    total += growing(a).maps; /* room held for unlocked growths' rollbacks (seg_map_pages) */
    if (total <= a->cap_quar)
        return VMM_OK;
    size_t ncap = a->cap_quar ? a->cap_quar : 8;
    while (ncap < total)
        ncap *= 2;
    vmm_quarantined *n = vmm_meta_alloc(a->meta, ncap * sizeof *n);
    if (!n)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for the unmap quarantine");
    for (size_t i = 0; i < a->n_quar; i++)
        n[i] = a->quar[i];
    if (a->quar)
        vmm_meta_free(a->meta, a->quar, a->cap_quar * sizeof *n);
    a->quar = n;
    a->cap_quar = ncap;
    return VMM_OK;
}


/* Retry the unmaps; pages that come free return their handle to the cache. `report`: name the
 * first failure in the thread's last error. Returns the entries left. */
static size_t quar_retry(vmm_allocator *a, int tries, int report)
{
    if (!a->n_quar || fh_reserve(a, a->n_handles) != VMM_OK)
        return a->n_quar;
    for (size_t i = a->n_quar; i-- > 0;) {
        vmm_quarantined q = a->quar[i];
        int r = unmap_page(a, NULL, q.va, q.size, tries);
        if (r) {
            if (report)
                vmm_fail_drv(r, "mem_unmap (quarantined page)");
            report = 0;
            continue;
        }
        fh_put(a, q.h, q.size, q.pool);
        a->quar[i] = a->quar[--a->n_quar];
    }
    return a->n_quar;
}

/* ---- growing with the lock released ------------------------------------------------------- */

/* cuMemCreate is the costliest driver call (193 us in the cost model), set_access next (36 us): a
 * growth creates, maps and grants access to its new handles with the allocator lock released, so
 * that other threads' mallocs and frees do not wait for it (as PyTorch drops its lock around
 * cudaMalloc). Everything is decided first, under the lock: the plan, the cached handles taken, the
 * room (each growth in flight holds bytes against the cap and room in the handle cache and the
 * quarantine: see growing()), and the target range parked as a MAPPING block in no index, so
 * that no other thread grows into, merges with, reclaims or frees it. The page table learns of the
 * pages under the lock again, after the state was checked once more. */
typedef struct grow_park {
    vmm_block *u;              /* unmapped block starting at p0, n_max pages, indexed */
    vmm_block *rest;           /* spare record for the part of u past the mapping; NULL once used */
    int parked;                /* on success: u is MAPPING, exactly the pages mapped, in no index */
} grow_park;

/* Only a plain growth lets the lock go, and only with grow_unlocked (the default): private pools
 * (cur_mp) and lanes keep per-call state in the allocator, captures route other threads' mallocs,
 * and mapping callbacks order their notices under the lock (callbacks.c). */
static int may_unlock(const vmm_allocator *a, const vmm_segment *seg)
{
    return a->cfg.grow_unlocked && !a->cb_mapping && !vmm_cb_delivering(a) && !a->cur_mp &&
           !a->n_routes && !a->tag_path && !seg->mp && !seg->srec->tag && !seg->asleep;
}

/* Take u out of the unmapped index as a MAPPING block of `bytes` (the rest stays indexed). */
static void park(vmm_allocator *a, grow_park *gp, size_t bytes)
{
    vmm_block *u = gp->u;
    vmm_pool_erase(a, u);
    if (bytes < u->size) {
        vmm_block_split_into(u, gp->rest, bytes);
        vmm_pool_insert(a, gp->rest);
        gp->rest = NULL;
    }
    u->state = VMM_BLOCK_MAPPING;
    gp->parked = 1;
}

/* A failed growth's parked range goes back to the unmapped index, for the retry and OOM paths. */
static void unpark(vmm_allocator *a, grow_park *gp)
{
    vmm_block *u = gp->u;
    u->state = VMM_BLOCK_UNMAPPED;
    vmm_pool_insert(a, vmm_block_merge(a, u));
    gp->parked = 0;
}

static void growth_unlink(vmm_allocator *a, const vmm_growth *g);

/* Put g on the growth list, holding its room, and the quarantine room for its maps now (a rollback
 * after them may quarantine that many pages; other threads' reservations count it). 0 when host
 * memory for that is short: the growth keeps the lock then. */
static int growth_link(vmm_allocator *a, vmm_growth *g)
{
    g->next = a->growing;
    a->growing = g;
    if (quar_reserve(a, a->n_quar) == VMM_OK)
        return 1;
    growth_unlink(a, g);
    return 0;
}

/* Off the list: the room it held is the books' again (or, for the quarantine, its rollback's). */
static void growth_unlink(vmm_allocator *a, const vmm_growth *g)
{
    vmm_growth **pp = &a->growing;
    while (*pp != g)
        pp = &(*pp)->next;
    *pp = g->next;
}

/* A handle made: counted as the locked path counts it. */
static void handle_made(vmm_allocator *a, int pool, size_t sz)
{
    a->stats.num_device_alloc++;
    a->n_handles++;
    vmm_stat_update(a->stats.reserved_bytes, pool, (int64_t)sz);
    if (reserved_now(a) > a->reserved_hwm)
        a->reserved_hwm = reserved_now(a);
}

/* Map pages [p0, p0 + n) of seg with cached or new handles (see plan_handles) and one set_access
 * call; up to n_max pages when a cached handle overshoots or a small growth (`tail`, fewer pages
 * than one handle covers) maps ahead into a larger unmapped block; *mapped tells how many. On failure nothing is mapped as far as the page table knows; handles
 * created on the way stay cached, and handles the driver would not unmap go to the quarantine.
 * gp (growth; NULL: keep the lock): its block may be parked while handles are created unlocked. */
static int seg_map_pages(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n, size_t n_max,
                         int tail, size_t *mapped_out, size_t *short_pages, grow_park *gp)
{
    const vmm_driver_ops *ops = a->drv->ops;
    size_t ps = seg->page_size, m = seg->max_handle_pages;
    /* near the device's end, one handle per page: a big handle under one live page holds all its
     * pages, which the OOM path cannot unmap (docs/benchmarks.md, "Driver calls") */
    if (m > 1 && reserved_now(a) + n * ps + a->cap / PRESSURE_DIVISOR > a->cap)
        m = 1;
    if (quar_overlaps(a, seg->base + p0 * ps, n * ps))
        return vmm_fail(VMM_EDRIVER, "pages at 0x%llx are still mapped after a failed unmap",
                        (unsigned long long)(seg->base + p0 * ps));
    if (n_max > n && quar_overlaps(a, seg->base + (p0 + n) * ps, (n_max - n) * ps))
        n_max = n;
    size_t *chunk = vmm_meta_alloc(a->meta, (n + 1) * (sizeof *chunk + sizeof(vmm_phys)));
    if (!chunk)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for a page list");
    vmm_phys *hs = (vmm_phys *)(chunk + n + 1);
    size_t list_bytes = (n + 1) * (sizeof *chunk + sizeof(vmm_phys));
    handle_plan pl;
    pl.chunk = chunk;
    /* small growths map ahead to a whole handle (see plan_handles) */
    size_t ahead = tail && n < m ? m - 1 : 0;
    plan_handles(a, ps, m, n, n_max, tail, ahead, &pl);
    size_t nh = pl.n_cached + pl.n_new, total = pl.n;
    int rc = VMM_OK;
    if (quar_reserve(a, a->n_quar + nh) != VMM_OK ||
        /* the after_map notice is made now, so that announcing the mapping cannot fail */
        (VMM_UNLIKELY(a->cb_mapping) && vmm_cb_reserve(a, total) != VMM_OK)) {
        vmm_meta_free(a->meta, chunk, list_bytes);
        return VMM_EHOSTMEM;
    }
    if (pl.new_pages) {
        size_t want = pl.new_pages * ps;
        size_t room = a->cap > reserved_now(a) ? a->cap - reserved_now(a) : 0;
        /* cached handles this mapping cannot use only hold memory: let them go when the cap is in
         * the way, or when keeping them would lift reserved bytes past their high-water mark */
        size_t over = reserved_now(a) + want > a->reserved_hwm ? reserved_now(a) + want - a->reserved_hwm : 0;
        size_t lack = room < want ? want - room : 0;
        if (over > lack)
            lack = over;
        if (lack)
            release_unplanned(a, ps, m, &pl, lack);
        room = a->cap > reserved_now(a) ? a->cap - reserved_now(a) : 0;
        if (room / ps < pl.new_pages && ahead) {
            /* no room for the pages ahead: only what the request needs (as many handles or
             * fewer, so the room reserved above still covers them) */
            plan_handles(a, ps, m, n, n_max, tail, 0, &pl);
            nh = pl.n_cached + pl.n_new;
            total = pl.n;
        }
        if (room / ps < pl.new_pages)
            rc = VMM_ENOMEM, *short_pages = pl.new_pages - room / ps;
        else if (fh_reserve(a, a->n_handles + pl.n_new) != VMM_OK)
            rc = VMM_EHOSTMEM;
        if (rc) {
            vmm_meta_free(a->meta, chunk, list_bytes);
            return rc;
        }
    }
    size_t got = 0, mapped = 0, reused = 0;
    int accessed = 0; /* set_access made (unlocked growth) */
    /* a growth of cached handles only unlocks too: its maps and set_access are the calls left */
    vmm_growth g = {gp ? gp->u : NULL, seg->pool, 0, pl.n_cached, pl.new_pages * ps, pl.n_new, nh, NULL};
    if (gp && may_unlock(a, seg) && growth_link(a, &g)) {
        for (; got < pl.n_cached; got++) {
            fh_take(a, chunk[got] * ps, seg->pool, &hs[got]); /* counted by plan_handles */
            reused += chunk[got];
            g.held_bytes += chunk[got] * ps;
        }
        park(a, gp, total * ps);
        a->growths_unlocked++;
        vmm_unlock(a);
        /* the range is parked: its maps and access grant concern no other thread either */
        int r = VMM_DRV_SUCCESS;
        const char *call = "mem_create";
        for (; got < nh; got++)
            if ((r = ops->mem_create(a->drv, chunk[got] * ps, &hs[got])) != VMM_DRV_SUCCESS)
                break;
        for (size_t off = 0; r == VMM_DRV_SUCCESS && mapped < nh; off += chunk[mapped++]) {
            call = "mem_map";
            r = ops->mem_map(a->drv, seg->base + (p0 + off) * ps, chunk[mapped] * ps, 0, hs[mapped]);
            if (r)
                break;
        }
        if (r == VMM_DRV_SUCCESS) {
            call = "set_access";
            r = ops->set_access(a->drv, seg->base + p0 * ps, total * ps);
        }
        accessed = r == VMM_DRV_SUCCESS;
        vmm_lock(a);
        growth_unlink(a, &g); /* the quarantine room it held stays, for the rollback below */
        size_t made = 0;
        for (size_t k = pl.n_cached; k < got; k++) {
            handle_made(a, seg->pool, chunk[k] * ps);
            made += chunk[k];
        }
        /* what may have changed meanwhile: the segment put to sleep (sleep.c), mapping callbacks
         * set (their notice is made now) */
        if (r) {
            rc = r == VMM_DRV_OUT_OF_MEMORY && got < nh ? VMM_ENOMEM : vmm_fail_drv(r, call);
            if (got < nh)
                *short_pages = pl.new_pages - made;
        } else if (seg->asleep) {
            rc = vmm_fail(VMM_EINVAL, "vmm_malloc: its memory was put to sleep meanwhile");
        } else if (VMM_UNLIKELY(a->cb_mapping) && vmm_cb_reserve(a, total) != VMM_OK) {
            rc = VMM_EHOSTMEM;
        }
    }
    for (; rc == VMM_OK && got < nh; got++) {
        size_t sz = chunk[got] * ps;
        if (got < pl.n_cached) {
            fh_take(a, sz, seg->pool, &hs[got]); /* counted by plan_handles: cannot fail */
            reused += chunk[got];
            continue;
        }
        /* best stays UNMAPPED and indexed, which no lane path touches (lane.c, "Driver calls") */
        vmm_lanes_yield(a, NULL);
        int r = ops->mem_create(a->drv, sz, &hs[got]);
        vmm_lanes_resume(a, NULL);
        if (r) {
            /* keep what was made in the cache; the caller may free pages and retry */
            rc = r == VMM_DRV_OUT_OF_MEMORY ? VMM_ENOMEM : vmm_fail_drv(r, "mem_create");
            size_t made = 0;
            for (size_t k = pl.n_cached; k < got; k++)
                made += chunk[k];
            *short_pages = pl.new_pages - made;
            break;
        }
        handle_made(a, seg->pool, sz);
    }
    for (size_t off = 0; rc == VMM_OK && mapped < nh; off += chunk[mapped++]) {
        vmm_lanes_yield(a, NULL);
        int r = ops->mem_map(a->drv, seg->base + (p0 + off) * ps, chunk[mapped] * ps, 0, hs[mapped]);
        vmm_lanes_resume(a, NULL);
        if (r)
            rc = vmm_fail_drv(r, "mem_map");
        if (r)
            break;
    }
    if (rc == VMM_OK && !accessed) {
        vmm_lanes_yield(a, NULL);
        int r = ops->set_access(a->drv, seg->base + p0 * ps, total * ps);
        vmm_lanes_resume(a, NULL);
        if (r)
            rc = vmm_fail_drv(r, "set_access");
    }
    if (rc != VMM_OK) {
        for (size_t k = 0, off = 0; k < got; off += chunk[k++]) {
            uintptr_t va = seg->base + (p0 + off) * ps;
            size_t sz = chunk[k] * ps;
            if (k < mapped && unmap_page(a, NULL, va, sz, UNMAP_TRIES) != VMM_DRV_SUCCESS)
                a->quar[a->n_quar++] = (vmm_quarantined){va, sz, hs[k], seg->pool};
            else
                fh_put(a, hs[k], sz, seg->pool);
        }
        if (gp && gp->parked)
            unpark(a, gp);
        vmm_meta_free(a->meta, chunk, list_bytes);
        return rc;
    }
    for (size_t k = 0, off = 0; k < nh; off += chunk[k++])
        for (size_t j = 0; j < chunk[k]; j++)
            seg->pages[p0 + off + j] = hs[k];
    seg->mapped_pages += total;
    VMM_HISTORY(a, VMM_TRACE_SEGMENT_MAP, seg->base + p0 * ps, total * ps, seg->stream);
    vmm_stat_update(a->stats.mapped_bytes, seg->pool, (int64_t)(total * ps));
    a->stats.num_pages_mapped += (int64_t)total;
    a->stats.num_pages_remapped += (int64_t)reused;
    vmm_meta_free(a->meta, chunk, list_bytes);
    if (mapped_out)
        *mapped_out = total;
    if (VMM_UNLIKELY(a->cb_mapping))
        vmm_cb_mapped(a, seg, p0, total);
    return VMM_OK;
}

int vmm_seg_map_pages(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n, size_t *short_pages)
{
    return seg_map_pages(a, seg, p0, n, n, 0, NULL, short_pages, NULL);
}

/* ---- handle extents ----------------------------------------------------------------------- */

/* The page table names a handle at every page it covers, and a handle is mapped at one place
 * only: its extent is the run of equal entries around any of its pages (at most
 * max_handle_pages, so finding it costs a few steps). */
static size_t handle_first(const vmm_segment *s, size_t pg)
{
    vmm_phys h = s->pages[pg];
    while (pg > 0 && s->pages[pg - 1] == h)
        pg--;
    return pg;
}

static size_t handle_end(const vmm_segment *s, size_t pg)
{
    vmm_phys h = s->pages[pg];
    while (pg < s->n_pages && s->pages[pg] == h)
        pg++;
    return pg;
}

size_t vmm_seg_handle_pages(const vmm_segment *s, size_t pg)
{
    return s->pages[pg] ? handle_end(s, pg) - pg : 1;
}

size_t vmm_seg_handles(const vmm_segment *s)
{
    size_t n = 0;
    for (size_t pg = 0; s->expandable && pg < s->n_pages; pg++)
        n += s->pages[pg] && (pg == 0 || s->pages[pg - 1] != s->pages[pg]);
    return n;
}

const char *vmm_seg_check_handles(const vmm_segment *s, uintptr_t *at)
{
    for (size_t pg = 0; s->expandable && pg < s->n_pages;) {
        if (!s->pages[pg]) {
            pg++;
            continue;
        }
        size_t end = handle_end(s, pg);
        *at = s->base + pg * s->page_size;
        if (end - pg > s->max_handle_pages)
            return "a handle covers more pages than max_handle_size allows";
        pg = end;
    }
    return NULL;
}

int vmm_seg_unmap_page(vmm_allocator *a, vmm_segment *seg, size_t pg, int release)
{
    vmm_phys h = seg->pages[pg];
    if (!h)
        return VMM_OK;
    /* the handle goes whole: cuMemUnmap cannot unmap part of what one cuMemMap mapped */
    size_t ps = seg->page_size, p0 = handle_first(seg, pg), n = handle_end(seg, pg) - p0;
    size_t sz = n * ps;
    /* room in the cache first: a handle the driver will not release waits there */
    if (fh_reserve(a, a->n_handles) != VMM_OK)
        return VMM_EHOSTMEM;
    int r = unmap_page(a, seg->srec, seg->base + p0 * ps, sz, UNMAP_TRIES);
    if (r)
        return vmm_fail_drv(r, "mem_unmap");
    for (size_t k = 0; k < n; k++)
        seg->pages[p0 + k] = 0;
    seg->mapped_pages -= n;
    vmm_stat_update(a->stats.mapped_bytes, seg->pool, -(int64_t)sz);
    a->stats.num_pages_unmapped += (int64_t)n;
    if (release) {
        vmm_lanes_yield(a, seg->srec);
        r = a->drv->ops->mem_release(a->drv, h);
        vmm_lanes_resume(a, seg->srec);
    }
    if (release && r == VMM_DRV_SUCCESS) {
        vmm_stat_update(a->stats.reserved_bytes, seg->pool, -(int64_t)sz);
        a->stats.num_device_free++;
        a->n_handles--;
    } else {
        fh_put(a, h, sz, seg->pool);
    }
    return VMM_OK;
}

/* ---- growth ------------------------------------------------------------------------------- */

/* VA reservation sizes. A large-pool reservation spans the whole device (rounded to pages), so any
 * request that can be satisfied fits in a fresh one; a small-pool one spans 1/16 of it (small
 * blocks are at most 1 MiB; more reservations are added when one is full). Per (stream, device)
 * that is ~1.07 x device memory of VA: with 80 GiB devices, 128 TiB of user VA holds ~1500
 * (stream, device) pairs, against ~730 for PyTorch's 2 x 1.125 x. Reservations are made on
 * first use and returned by vmm_empty_cache once wholly unmapped. */
enum { SMALL_VA_DIVISOR = 16, SMALL_VA_MIN_PAGES = 16 };

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

static int seg_new_expandable(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t min_size,
                              int longlived, vmm_block **out)
{
    size_t ps = a->page_size[pool];
    size_t va = a->va_size[pool];
    if (va < round_up(min_size, ps))
        va = round_up(min_size, ps);
    vmm_segment *s = vmm_meta_alloc(a->meta, sizeof *s);
    vmm_block *b = vmm_block_new(a);
    vmm_phys *pages = vmm_meta_alloc(a->meta, (va / ps) * sizeof *pages);
    if (!s || !b || !pages) {
        if (s)
            vmm_meta_free(a->meta, s, sizeof *s);
        if (b)
            vmm_block_delete(a, b);
        if (pages)
            vmm_meta_free(a->meta, pages, (va / ps) * sizeof *pages);
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for a segment record");
    }
    uintptr_t base;
    vmm_lanes_yield(a, NULL); /* a new range: no lane's state */
    int r = a->drv->ops->va_reserve(a->drv, va, 0, &base);
    vmm_lanes_resume(a, NULL);
    if (r) {
        vmm_meta_free(a->meta, s, sizeof *s);
        vmm_block_delete(a, b);
        vmm_meta_free(a->meta, pages, (va / ps) * sizeof *pages);
        return vmm_fail_drv(r, "va_reserve");
    }
    s->base = base;
    s->size = va;
    s->stream = sr->stream;
    s->key = sr->key;
    s->srec = sr;
    s->mp = a->cur_mp;
    s->pool = pool;
    s->expandable = 1;
    s->longlived = longlived;
    s->page_size = ps;
    s->max_handle_pages = handle_pages_max(a, pool);
    s->n_pages = va / ps;
    s->pages = pages;
    s->first = b;
    b->addr = base;
    b->size = va;
    b->seg = s;
    b->state = VMM_BLOCK_UNMAPPED;
    seg_link(a, s);
    vmm_pool_insert(a, b);
    vmm_stat_update(a->stats.segment, pool, 1);
    a->stats.reserved_va_bytes += (int64_t)va;
    *out = b;
    return VMM_OK;
}

/* Pages of unmapped block u to map so that a range of `size` starting at the free block before u
 * (or at u) fits; 0 when the range around u is too small. */
static size_t grow_need(const vmm_block *u, size_t size, size_t ps)
{
    const vmm_block *p = u->prev && u->prev->state == VMM_BLOCK_FREE ? u->prev : NULL;
    const vmm_block *n = u->next && u->next->state == VMM_BLOCK_FREE ? u->next : NULL;
    size_t avail = (p ? p->size : 0) + u->size + (n ? n->size : 0);
    if (avail < size)
        return 0;
    uintptr_t end = (p ? p->addr : u->addr) + size;
    if (end <= u->addr)
        return 0; /* the free block alone fits: the best-fit rules turned it down */
    size_t need = round_up(end - u->addr, ps);
    return need < u->size ? need : u->size;
}

/* Unmapped block of sr's pool to grow into for `size` bytes: the one needing the fewest pages,
 * then the lowest, in a segment whose longlived flag is `longlived` (-1: any); NULL when none fits
 * (*need then is what a fresh reservation maps). */
static vmm_block *grow_target(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size,
                              int longlived, size_t *need_out)
{
    size_t ps = a->page_size[pool];
    vmm_block *best = NULL;
    size_t best_need = round_up(size, ps);
    /* the private pool of the malloc in progress has its own index (mempool.c) */
    vmm_block *root = a->cur_mp ? a->cur_mp->unmapped_tree[pool] : a->unmapped_tree[pool];
    for (vmm_block *u = vmm_tree_lower_bound(root, sr->key, 0, 0);
         u && u->seg->key == sr->key; u = vmm_tree_next(root, u)) {
        size_t need = longlived < 0 || u->seg->longlived == longlived ? grow_need(u, size, ps) : 0;
        if (need && (!best || need < best_need || (need == best_need && u->addr < best->addr))) {
            best = u;
            best_need = need;
        }
    }
    *need_out = best_need;
    return best;
}

static size_t recycle_idle(vmm_allocator *a, size_t ps, size_t want, const vmm_block *target,
                           size_t size);

/* The block of u's segment holding address x, walking from u. */
static vmm_block *block_at(vmm_block *u, uintptr_t x)
{
    while (u->addr > x)
        u = u->prev;
    while (u->addr + u->size <= x)
        u = u->next;
    return u;
}

/* The end of a growth whose first (h) and last (t) of n pages from page p0 are views now (from: a
 * block in the segment near them; the request starts at address `at`): *whole is the FREE block
 * holding the request when the views cover it all, else *best and *need are the pages between. */
static void views_rest(vmm_block *from, uintptr_t at, size_t p0, size_t n, size_t h, size_t t,
                       vmm_block **best, size_t *need, vmm_block **whole)
{
    const vmm_segment *seg = from->seg;
    size_t ps = seg->page_size;
    if (h + t >= n) {
        /* lanes ran during the views' driver calls: the free block before the range (pf) may
         * have been handed out meanwhile; then the view's own bytes, and vmm_seg_grow grows on */
        vmm_block *w = block_at(from, at);
        *whole = w->state == VMM_BLOCK_FREE ? w : from;
        return;
    }
    *best = block_at(from, seg->base + (p0 + h) * ps);
    *need = (n - h - t) * ps;
}

/* alias_pages (alias.c): the growth of `size` bytes into unmapped block *best (*need bytes of
 * pages from its start) maps its first page as a second view of a page whose free suffix starts
 * where the request can start (the request then begins at that offset, and still ends in its
 * last page), and its last page as a view of a page whose free prefix holds the request's end.
 * On return *best and *need are what is left to map with new or cached handles (the pages
 * between), or *whole is the FREE block holding the whole request when nothing is left. A failed
 * alias leaves the views made so far, whose bytes reclaim gives back. */
static int alias_growth(vmm_allocator *a, vmm_stream_rec *sr, size_t size, vmm_block **best,
                        size_t *need, vmm_block **whole)
{
    vmm_block *u = *best;
    vmm_segment *seg = u->seg;
    size_t ps = seg->page_size, n = *need / ps, p0 = (u->addr - seg->base) / ps;
    if (!n)
        return VMM_OK;
    vmm_block *pf = u->prev && u->prev->state == VMM_BLOCK_FREE ? u->prev : NULL;
    uintptr_t u0 = u->addr, start = pf ? pf->addr : u0;
    vmm_block *fh = NULL, *ft = NULL, *from = u, *anchor = NULL;
    int rc;
    /* a head: only where the request starts on the page boundary and takes two pages or more.
     * Mapped before the tail is looked for: lanes run during vmm_alias_map's driver calls, and a
     * lane malloc may take (or a lane free merge) a FREE block found before them */
    if (!pf && n >= 2)
        fh = vmm_alias_find(a, sr, seg, p0, 1, n * ps - size);
    size_t y = fh ? (fh->addr - fh->seg->base) % ps : 0;
    if (fh) {
        if ((rc = vmm_alias_map(a, fh, u, p0, &anchor)))
            return rc;
        from = anchor;
    }
    size_t x = start + y + size - (u0 + (n - 1) * ps); /* bytes of the last page used */
    /* the head's page has a SHADOW block now: vmm_alias_find passes over it (two views at most) */
    if (x < ps && !(fh && n == 1))
        ft = vmm_alias_find(a, sr, seg, p0 + n - 1, 0, x);
    if (!fh && !ft)
        return VMM_OK;
    if (ft && (rc = vmm_alias_map(a, ft, block_at(from, u0 + (n - 1) * ps), p0 + n - 1, &anchor)))
        return rc;
    if (ft)
        from = anchor;
    views_rest(from, start + y, p0, n, fh != NULL, ft != NULL, best, need, whole);
    return VMM_OK;
}

/* alias_place (alias.c): the growth of `size` bytes into unmapped block *best (*need bytes of
 * pages from its start) built from free page edges, the rule of a page-level model of the traces:
 * where the request does not continue a mapped run (no free block before *best), its first page is
 * a view of a page's free suffix used whole (a suffix of exactly the request's last partial page
 * first, then none when a free prefix of exactly that exists, else the largest suffix), and where
 * its last page is partly used, that page is a view of the shortest free prefix holding the
 * request's end that leaves at most alias_place_tail_gap free, else a new page. Nothing is left
 * free between two used ranges of a page. Out as alias_growth's. */
static int place_growth(vmm_allocator *a, vmm_stream_rec *sr, size_t size, vmm_block **best,
                        size_t *need, vmm_block **whole)
{
    vmm_block *u = *best;
    vmm_segment *seg = u->seg;
    size_t ps = seg->page_size, n = *need / ps, p0 = (u->addr - seg->base) / ps, len = 0;
    if (!n)
        return VMM_OK;
    vmm_block *pf = u->prev && u->prev->state == VMM_BLOCK_FREE ? u->prev : NULL;
    uintptr_t start = pf ? pf->addr : u->addr;
    vmm_block *fh = NULL, *ft = NULL;
    size_t y = 0, r = size % ps, hpg = SIZE_MAX;
    if (!pf && size >= ps && r) {
        fh = vmm_alias_edge(a, sr, seg, p0, 1, r, r + 1, 0, NULL, 0, &len);
        if (!fh && !vmm_alias_edge(a, sr, seg, p0 + size / ps, 0, r, r + 1, 0, NULL, 0, &len))
            fh = vmm_alias_edge(a, sr, seg, p0, 1, 1, ps, 1, NULL, 0, &len);
        if (fh) {
            y = ps - len;
            size_t nh = (y + size + ps - 1) / ps;
            if (nh * ps > u->size) {
                fh = NULL; /* no room for the extra page: no head */
                y = 0;
            } else {
                n = nh;
                hpg = (fh->addr - fh->seg->base) / ps;
            }
        }
    }
    /* the head first: lanes run during its driver calls (vmm_alias_map), so the tail is looked
     * for after it, in the free blocks as they are then */
    vmm_block *from = u, *anchor = NULL;
    int rc;
    if (fh) {
        vmm_block *c = vmm_alias_edge_cut(a, fh, 1);
        if (!c) {
            fh = NULL; /* host memory short: no head, the request from the page start */
            y = 0;
            n = *need / ps;
        } else if ((rc = vmm_alias_map(a, c, u, p0, &anchor))) {
            vmm_alias_edge_join(a, c);
            return rc;
        } else {
            from = anchor;
        }
    }
    size_t x = start + y + size - (seg->base + (p0 + n - 1) * ps); /* bytes of the last page used */
    if (x < ps && !(fh && n == 1)) {
        ft = vmm_alias_edge(a, sr, seg, p0 + n - 1, 0, x, x + a->cfg.alias_place_tail_gap + 1, 0,
                            fh ? fh->seg : NULL, hpg, &len);
        if (ft && (ft = vmm_alias_edge_cut(a, ft, 0)) != NULL) {
            if ((rc = vmm_alias_map(a, ft, block_at(from, seg->base + (p0 + n - 1) * ps), p0 + n - 1,
                                    &anchor))) {
                vmm_alias_edge_join(a, ft);
                return rc;
            }
            from = anchor;
        }
    }
    if (!fh && !ft)
        return VMM_OK;
    views_rest(from, start + y, p0, n, fh != NULL, ft != NULL, best, need, whole);
    return VMM_OK;
}

static int grow_once(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size, int longlived,
                     vmm_block **out, size_t *short_pages)
{
    size_t ps = a->page_size[pool], m = handle_pages_max(a, pool);
    size_t best_need;
    quar_retry(a, 1, 0);
    /* alias_place: views holding no block in use give their bytes back before the search, so a
     * page whose other view is idle offers its free edge again (vmm_alias_edge takes pages of one
     * view only): on the 76 traces the held bytes over the 47 large ones fall further with it
     * (docs/benchmarks.md, "Handle sizes") */
    if (a->cfg.alias_place && a->n_aliases)
        vmm_alias_reclaim(a);
    vmm_block *best = grow_target(a, sr, pool, size, longlived, &best_need);
    /* Growth past the high-water mark of reserved bytes takes idle pages first (see recycle_idle) */
    handle_plan pl;
    pl.chunk = NULL;
    plan_handles(a, ps, m, best_need / ps, best ? best->size / ps : SIZE_MAX, 0, 0, &pl);
    size_t fresh = pl.new_pages * ps;
    if (fresh && reserved_now(a) + fresh > a->reserved_hwm) {
        /* alias views holding no block in use give their bytes back first (alias.c); the unmapped
         * blocks merge, best among them */
        if (a->n_aliases && vmm_alias_reclaim(a))
            best = grow_target(a, sr, pool, size, longlived, &best_need);
        size_t over = reserved_now(a) + fresh - a->reserved_hwm;
        /* lanes ran during its driver calls: best's free neighbours may have changed */
        if (recycle_idle(a, ps, over < fresh ? over : fresh, best, size) || a->lanes_open)
            best = grow_target(a, sr, pool, size, longlived, &best_need);
    }
    if (!best) {
        int rc = seg_new_expandable(a, sr, pool, size, longlived > 0, &best);
        if (rc)
            return rc;
        best_need = round_up(size, ps);
    }
    vmm_segment *seg = best->seg;
    if (vmm_alias_enabled(a, seg)) {
        vmm_block *whole = NULL;
        int rc = a->cfg.alias_place ? place_growth(a, sr, size, &best, &best_need, &whole)
                                    : alias_growth(a, sr, size, &best, &best_need, &whole);
        if (rc || whole) {
            if (!rc)
                *out = whole;
            return rc;
        }
    }
    /* a block record for the unmapped rest, in case the mapping does not take all of best */
    vmm_block *rest = vmm_block_new(a);
    if (!rest)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for a block record");
    size_t mapped = 0;
    grow_park gp = {best, rest, 0};
    int rc = seg_map_pages(a, seg, (best->addr - seg->base) / ps, best_need / ps, best->size / ps,
                           1, &mapped, short_pages, &gp);
    if (rc) {
        if (gp.rest)
            vmm_block_delete(a, gp.rest);
        return rc;
    }
    best_need = mapped * ps;
    if (gp.parked) {
        /* parked (created unlocked): out of the index and split already */
        if (gp.rest)
            vmm_block_delete(a, gp.rest);
    } else {
        vmm_pool_erase(a, best);
        if (best_need < best->size) {
            vmm_block_split_into(best, rest, best_need);
            vmm_pool_insert(a, rest);
        } else {
            vmm_block_delete(a, rest);
        }
    }
    best->state = VMM_BLOCK_FREE;
    best->free_seq = 0; /* fresh pages: no work ever touched them */
    best->gc_stamp = a->malloc_count;
    best = vmm_block_merge(a, best);
    vmm_pool_insert(a, best);
    *out = best;
    return VMM_OK;
}

int vmm_seg_grow(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size, vmm_block **out,
                 size_t *short_pages)
{
    /* once the lane has split (pool.c, "Lifetimes"), a request predicted to stay grows its
     * longlived segments, any other its other segments */
    int longlived = -1;
    if (!a->cur_mp && vmm_pool_life_split(sr))
        longlived = vmm_pool_long_lived(a, sr, size);
    for (;;) {
        int rc = grow_once(a, sr, pool, size, longlived, out, short_pages);
        /* another thread took the free block before the range while the handles were created
         * with the lock released: grow on from what is mapped now (each round maps pages) */
        if (rc || (*out)->size >= size)
            return rc;
    }
}

/* ---- reclaiming idle pages ---------------------------------------------------------------- */

/* The run [*p0, *p1) of handles lying wholly inside FREE block b at or above address lo, from the
 * first one on, of at least `want` pages where there are that many (whole handles: a bit more); 0
 * when none. A handle reaching past the block (part of it under a block in use, or not idle) ends
 * the run: it can only be unmapped whole, so it stays mapped until its every page is free. */
static size_t whole_handles(const vmm_block *b, uintptr_t lo, size_t want, size_t *p0, size_t *p1)
{
    const vmm_segment *seg = b->seg;
    size_t ps = seg->page_size;
    uintptr_t from = lo > b->addr ? lo : b->addr;
    if (from >= b->addr + b->size)
        return 0;
    size_t q = round_up(from - seg->base, ps) / ps, end = (b->addr + b->size - seg->base) / ps;
    /* a handle begun before the block's first whole page is not the block's to unmap */
    if (q < end && handle_first(seg, q) < q)
        q = handle_end(seg, q);
    size_t r = q;
    while (r < end && r - q < want && seg->pages[r]) {
        size_t e = handle_end(seg, r);
        if (e > end)
            break;
        r = e;
    }
    *p0 = q;
    *p1 = r;
    return r > q ? r - q : 0;
}

/* Unmap whole handles inside FREE block b at or above address lo, `want` pages or a little more;
 * returns pages unmapped. The range leaves the index first as a DETACHING block of its own, which
 * no lane path takes or merges: the unmaps then let every lane go (lane.c, "Driver calls"). */
static size_t reclaim_block(vmm_allocator *a, vmm_block *b, uintptr_t lo, size_t want)
{
    vmm_segment *seg = b->seg;
    size_t ps = seg->page_size;
    size_t p0, p1;
    if (!whole_handles(b, lo, want, &p0, &p1))
        return 0;
    /* mapping callbacks: before_unmap runs first, outside the lock (callbacks.c) */
    if (VMM_UNLIKELY(a->cb_mapping))
        return vmm_cb_detach(a, b, p0, p1);
    vmm_block *r1 = vmm_block_new(a), *r2 = vmm_block_new(a);
    if (!r1 || !r2) {
        if (r1)
            vmm_block_delete(a, r1);
        if (r2)
            vmm_block_delete(a, r2);
        return 0;
    }
    vmm_pool_erase(a, b);
    vmm_block *u = b;
    uintptr_t ua = seg->base + p0 * ps, ue = seg->base + p1 * ps;
    if (b->addr < ua) {
        vmm_block_split_into(b, r1, ua - b->addr);
        vmm_pool_insert(a, b);
        u = r1;
        r1 = NULL;
    }
    if (u->addr + u->size > ue) {
        vmm_block_split_into(u, r2, ue - u->addr);
        vmm_pool_insert(a, r2);
        r2 = NULL;
    }
    if (r1)
        vmm_block_delete(a, r1);
    if (r2)
        vmm_block_delete(a, r2);
    u->state = VMM_BLOCK_DETACHING;
    vmm_block *rest;
    size_t n = vmm_seg_finish_detached(a, u, &rest);
    if (rest) {
        /* the driver refused from there on: the pages stay mapped and free */
        rest->state = VMM_BLOCK_FREE;
        vmm_pool_insert(a, vmm_block_merge(a, rest));
    }
    return n;
}

/* Unmap the pages of DETACHING block u, whose before_unmap has run (callbacks.c): handles to the
 * cache, the block UNMAPPED, merged and indexed. Returns the pages unmapped. When the driver
 * refuses one, the pages before it are done and *rest gets the remainder (still DETACHING, to be
 * tried again); otherwise *rest is NULL. */
size_t vmm_seg_finish_detached(vmm_allocator *a, vmm_block *u, vmm_block **rest)
{
    vmm_segment *seg = u->seg;
    size_t ps = seg->page_size, p0 = (u->addr - seg->base) / ps, n = u->size / ps;
    *rest = u;
    vmm_block *r = vmm_block_new(a);
    if (!r || fh_reserve(a, a->n_handles) != VMM_OK) {
        if (r)
            vmm_block_delete(a, r);
        return 0;
    }
    size_t k = 0;
    while (k < n) { /* whole handles: detach ranges come from whole_handles */
        size_t e = handle_end(seg, p0 + k) - p0;
        /* u is in no index and not FREE: no lane path takes or merges it meanwhile */
        int dr = unmap_page(a, NULL, seg->base + (p0 + k) * ps, (e - k) * ps, 1);
        if (dr) {
            vmm_fail_drv(dr, "mem_unmap");
            break;
        }
        fh_put(a, seg->pages[p0 + k], (e - k) * ps, seg->pool);
        for (; k < e; k++)
            seg->pages[p0 + k] = 0;
    }
    if (!k) {
        vmm_block_delete(a, r);
        return 0;
    }
    seg->mapped_pages -= k;
    VMM_HISTORY(a, VMM_TRACE_SEGMENT_UNMAP, seg->base + p0 * ps, k * ps, seg->stream);
    vmm_stat_update(a->stats.mapped_bytes, seg->pool, -(int64_t)(k * ps));
    a->stats.num_pages_unmapped += (int64_t)k;
    if (k < n) {
        vmm_block_split_into(u, r, k * ps); /* r: the rest, still DETACHING */
        *rest = r;
    } else {
        vmm_block_delete(a, r);
        *rest = NULL;
    }
    u->state = VMM_BLOCK_UNMAPPED;
    vmm_pool_insert(a, vmm_block_merge(a, u));
    return k;
}

/* ---- recycling idle pages for growth ------------------------------------------------------ */

/* Growth that would lift reserved bytes above their high-water mark first unmaps idle whole pages
 * inside free blocks and maps their handles where the growth needs them. A recycled page costs an
 * unmap (25.6 us in the cost model) instead of a create (193 us), and reserved memory stays at the
 * most that was ever needed at once instead of holding every hole. Below the mark growth creates
 * handles as before, so a loop that repeats what it once reserved causes no unmap churn: every
 * unmap replaces a create that would have raised the peak. Oldest free blocks go first (least
 * likely to be reused soon); pages are only taken when a completed fence proves them idle. */

static int has_whole_handle(const vmm_block *b)
{
    size_t p0, p1;
    return whole_handles(b, 0, 1, &p0, &p1) != 0;
}

/* A candidate of recycle_idle, by its place in its lane's index rather than its record: the lanes
 * run while reclaim_block unmaps (lane.c, "Driver calls"), and may take, merge or split it. */
typedef struct recycle_cand {
    vmm_stream_rec *r;
    int pool;
    vmm_stream key;
    size_t size;
    uintptr_t addr;
    uint64_t gc_stamp;
    uintptr_t lo; /* only pages at or above this address (the growth target's upper neighbour) */
} recycle_cand;

/* Growth recycles a hole between two blocks in use only when it holds at least this many whole
 * pages of idle handles. Its two edge pages stay mapped (each shared with a live neighbour), and
 * a later request of the hole's size, which would have fitted in place, grows elsewhere while the
 * edge slivers stay idle beside live blocks. On the 59 traces in docs/benchmarks.md ("Handle
 * sizes", with the lifetimes' partly-used-page split) holes of one page or more held a QLoRA
 * step's smallest capacity at 1.0094x the lower bound (1.0024x with two); three or four left 2-3
 * idle pages in each 5 and 7.5 MiB hole of a bf16 training step of a 2.7B-parameter model, which
 * held 1.0108 with four, 1.0078 with three (1.0043 with two). A free block at the end of a mapped run (beside
 * unmapped pages or the segment's end) makes no new slivers: one whole page is enough. The OOM
 * path (vmm_seg_reclaim) takes every idle page. */
enum { RECYCLE_MIN_PAGES = 2 };

static int recyclable(const vmm_block *b, uintptr_t lo)
{
    size_t p0, p1;
    /* above lo, the block's lower edge is the growth's new block, in use */
    int edge = (lo <= b->addr && (!b->prev || b->prev->state == VMM_BLOCK_UNMAPPED)) || !b->next ||
               b->next->state == VMM_BLOCK_UNMAPPED;
    size_t want = edge ? 1 : RECYCLE_MIN_PAGES;
    return whole_handles(b, lo, want, &p0, &p1) >= want; /* stops once it has `want` pages */
}

/* Idle FREE blocks that recyclable() takes, other than k0, and k1 only above k1_lo; stored in out
 * unless it is NULL. */
static size_t recycle_candidates(vmm_allocator *a, const vmm_block *k0, const vmm_block *k1,
                                 uintptr_t k1_lo, recycle_cand *out)
{
    size_t n = 0;
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        for (int pool = 0; pool < VMM_NPOOLS; pool++) {
            vmm_block **root = &r->free_tree[pool];
            /* blocks smaller than a page hold no whole handle: start past them */
            for (vmm_block *b = vmm_tree_lower_bound(*root, r->key, a->page_size[pool], 0);
                 b && b->seg->key == r->key; b = vmm_tree_next(*root, b)) {
                uintptr_t lo = b == k1 ? k1_lo : 0;
                if (b == k0 || !b->seg->expandable || !recyclable(b, lo) || !vmm_block_idle(b))
                    continue;
                if (out)
                    out[n] = (recycle_cand){r, pool, b->seg->key, b->size, b->addr, b->gc_stamp, lo};
                n++;
            }
        }
    }
    return n;
}

/* The candidate's block if it is still there as it was: FREE, idle, holding a whole handle. */
static vmm_block *recycle_find(const recycle_cand *c)
{
    vmm_block *b = vmm_tree_lower_bound(c->r->free_tree[c->pool], c->key, c->size, c->addr);
    if (!b || b->addr != c->addr || b->size != c->size || b->seg->key != c->key)
        return NULL;
    return recyclable(b, c->lo) && vmm_block_idle(b) ? b : NULL;
}

static int older_first(const void *x, const void *y)
{
    const recycle_cand *p = x, *q = y;
    if (p->gc_stamp != q->gc_stamp)
        return p->gc_stamp < q->gc_stamp ? -1 : 1;
    return p->addr < q->addr ? -1 : p->addr > q->addr;
}

/* Free up to `want` bytes for growth with pages of size ps: cached handles of other sizes are
 * released, idle pages are unmapped (handles of size ps cached for the growth, others released).
 * Never blocks. The growth of `size` bytes into `target` (the unmapped block to grow into) starts
 * at target's free lower neighbour, which it takes whole: that one is kept. Of the free upper
 * neighbour only the part the growth reaches is kept; its pages above the request's end would
 * stay idle beside it (an inference whose 7 GiB tensor grew into target while 1.7 GiB of idle
 * pages above it stayed mapped held 1.10x what it handed out). Returns bytes made available. */
static size_t recycle_idle(vmm_allocator *a, size_t ps, size_t want, const vmm_block *target,
                           size_t size)
{
    size_t got = vmm_handles_release(a, ps, want);
    if (got >= want)
        return got;
    /* fence the frees no fence covers yet and poll: a stream that has caught up proves them idle
     * now, a busy one by a later growth */
    vmm_fences_record(a);
    vmm_fences_poll(a);
    const vmm_block *k0 = NULL, *k1 = NULL;
    uintptr_t k1_lo = 0, t_addr = target ? target->addr : 0;
    const vmm_segment *t_seg = target ? target->seg : NULL;
    if (target && target->prev && target->prev->state == VMM_BLOCK_FREE)
        k0 = target->prev;
    if (target && target->next && target->next->state == VMM_BLOCK_FREE) {
        k1 = target->next;
        uintptr_t end = (k0 ? k0->addr : target->addr) + size;
        k1_lo = end > k1->addr ? end : k1->addr;
    }
    size_t n = recycle_candidates(a, k0, k1, k1_lo, NULL);
    recycle_cand *c = n ? vmm_meta_alloc(a->meta, n * sizeof *c) : NULL;
    if (!c)
        return got;
    recycle_candidates(a, k0, k1, k1_lo, c);
    qsort(c, n, sizeof *c, older_first);
    size_t other = 0;
    /* each candidate looked up again: reclaim_block splits its own block and merges unmapped ones
     * (target among them: it is not read again), and the lanes run during its unmaps; the free
     * block ending where target begins stays, whichever it is by then */
    for (size_t i = 0; i < n && got < want; i++) {
        vmm_block *b = recycle_find(&c[i]);
        if (!b || (b->seg == t_seg && b->addr + b->size == t_addr))
            continue;
        size_t bps = b->seg->page_size;
        size_t k = reclaim_block(a, b, c[i].lo, (want - got + bps - 1) / bps);
        if (!k)
            break; /* the driver refuses: growth creates handles instead */
        got += k * bps;
        if (bps != ps)
            other += k * bps;
    }
    vmm_meta_free(a->meta, c, n * sizeof *c);
    if (other)
        vmm_handles_release(a, ps, other);
    return got;
}

size_t vmm_seg_reclaim(vmm_allocator *a, size_t want)
{
    size_t got = 0;
    quar_retry(a, 1, 0); /* silent: the OOM path calls this; empty_cache reports below */
    /* views that hold no block in use first: their bytes go back to the other view, whose page
     * may then be idle whole */
    if (a->n_aliases)
        vmm_alias_reclaim(a);
    /* lanes in key order: smallest stream first, then by size and address, as ever */
    for (int pool = 0; pool < VMM_NPOOLS && got < want; pool++) {
        for (vmm_stream_rec *r = vmm_stream_rec_next_key(a, NULL); r && got < want;
             r = vmm_stream_rec_next_key(a, r)) {
            vmm_block *b = vmm_tree_lower_bound(r->free_tree[pool], NULL, 0, 0);
            while (b && got < want) {
                vmm_block *next = vmm_tree_next(r->free_tree[pool], b);
                vmm_stream nk = next ? next->seg->key : NULL;
                size_t ns = next ? next->size : 0;
                uintptr_t na = next ? next->addr : 0;
                if (b->seg->expandable && vmm_block_idle(b)) {
                    if (has_whole_handle(b)) {
                        size_t n = reclaim_block(a, b, 0, want - got);
                        if (n == 0)
                            return got; /* the driver refuses: stop here */
                        got += n;
                        /* the lanes ran during the unmaps: next may be gone, so find where it
                         * was by its key (b's pieces are smaller: they sort before it) */
                        if (a->lanes_open && next)
                            next = vmm_tree_lower_bound(r->free_tree[pool], nk, ns, na);
                    }
                }
                b = next;
            }
        }
    }
    return got;
}

void vmm_seg_free_empty(vmm_allocator *a)
{
    quar_retry(a, 1, 1);
    vmm_segment *s = a->segs;
    while (s) {
        vmm_segment *next = s->next;
        vmm_block *b = s->first;
        if (s->expandable && b->state == VMM_BLOCK_UNMAPPED && !b->next && !s->asleep &&
            !quar_overlaps(a, s->base, s->size)) {
            /* one UNMAPPED block, which no lane path reads */
            vmm_lanes_yield(a, NULL);
            int r = a->drv->ops->va_free(a->drv, s->base, s->size);
            vmm_lanes_resume(a, NULL);
            if (r) {
                vmm_fail_drv(r, "va_free");
                return;
            }
            vmm_pool_erase(a, b);
            vmm_block_delete(a, b);
            vmm_stat_update(a->stats.segment, s->pool, -1);
            a->stats.reserved_va_bytes -= (int64_t)s->size;
            seg_unlink(a, s);
            seg_delete(a, s);
        }
        s = next;
    }
}

/* ---- classic segments --------------------------------------------------------------------- */

int vmm_seg_classic_alloc(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size,
                          vmm_block **out)
{
    size_t seg_size = vmm_classic_segment_size(size);
    if (reserved_now(a) + seg_size > a->cap)
        return VMM_ENOMEM;
    vmm_segment *s = vmm_meta_alloc(a->meta, sizeof *s);
    vmm_block *b = vmm_block_new(a);
    if (!s || !b) {
        if (s)
            vmm_meta_free(a->meta, s, sizeof *s);
        if (b)
            vmm_block_delete(a, b);
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for a segment record");
    }
    uintptr_t p;
    vmm_lanes_yield(a, NULL); /* a new segment: no lane's state */
    int r = a->drv->ops->mem_alloc(a->drv, seg_size, &p);
    vmm_lanes_resume(a, NULL);
    if (r) {
        vmm_meta_free(a->meta, s, sizeof *s);
        vmm_block_delete(a, b);
        return r == VMM_DRV_OUT_OF_MEMORY ? VMM_ENOMEM : vmm_fail_drv(r, "mem_alloc");
    }
    a->stats.num_device_alloc++;
    VMM_HISTORY(a, VMM_TRACE_SEGMENT_ALLOC, p, seg_size, sr->stream);
    s->base = p;
    s->size = seg_size;
    s->stream = sr->stream;
    s->key = sr->key;
    s->srec = sr;
    s->mp = a->cur_mp;
    s->pool = pool;
    s->first = b;
    b->addr = p;
    b->size = seg_size;
    b->seg = s;
    b->state = VMM_BLOCK_FREE;
    b->gc_stamp = a->malloc_count;
    seg_link(a, s);
    vmm_pool_insert(a, b);
    vmm_stat_update(a->stats.segment, pool, 1);
    vmm_stat_update(a->stats.reserved_bytes, pool, (int64_t)seg_size);
    vmm_stat_update(a->stats.mapped_bytes, pool, (int64_t)seg_size);
    if (a->cfg.max_split_size != SIZE_MAX && seg_size >= a->cfg.max_split_size)
        vmm_stat_add(&a->stats.oversize_segments, 1);
    *out = b;
    return VMM_OK;
}

static int classic_releasable(const vmm_segment *s, size_t min_size)
{
    const vmm_block *b = s->first;
    /* a private pool's segments stay while it has users (mempool.c) */
    return !s->expandable && !s->mp && b->state == VMM_BLOCK_FREE && !b->next && s->size >= min_size;
}

size_t vmm_seg_classic_release(vmm_allocator *a, size_t min_size, size_t need, int oldest_first)
{
    size_t freed = 0;
    while (freed < need) {
        vmm_segment *pick = NULL;
        for (vmm_segment *s = a->segs; s; s = s->next) {
            if (!classic_releasable(s, min_size))
                continue;
            if (!pick || (oldest_first && s->first->gc_stamp < pick->first->gc_stamp))
                pick = s;
            if (!oldest_first)
                break;
        }
        if (!pick)
            break;
        /* cuMemFree synchronizes the device: its one block out of the index, every lane goes on
         * meanwhile (lane.c, "Driver calls") */
        vmm_block *only = pick->first;
        vmm_pool_erase(a, only);
        only->state = VMM_BLOCK_DETACHING;
        vmm_lanes_yield(a, NULL);
        int r = a->drv->ops->mem_free(a->drv, pick->base);
        vmm_lanes_resume(a, NULL);
        only->state = VMM_BLOCK_FREE;
        if (r) {
            vmm_pool_insert(a, only);
            vmm_fail_drv(r, "mem_free");
            break;
        }
        a->stats.num_device_free++;
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_FREE, pick->base, pick->size, pick->stream);
        freed += pick->size;
        vmm_block_delete(a, only);
        vmm_stat_update(a->stats.segment, pick->pool, -1);
        vmm_stat_update(a->stats.reserved_bytes, pick->pool, -(int64_t)pick->size);
        vmm_stat_update(a->stats.mapped_bytes, pick->pool, -(int64_t)pick->size);
        if (a->cfg.max_split_size != SIZE_MAX && pick->size >= a->cfg.max_split_size)
            vmm_stat_add(&a->stats.oversize_segments, -1);
        seg_unlink(a, pick);
        seg_delete(a, pick);
    }
    return freed;
}

/* ---- teardown ----------------------------------------------------------------------------- */

/* vmm_destroy's last chance to give something back: tried as often as an unmap (a transient
 * refusal must not leak it), then reported. what: 0 handle, 1 VA range, 2 classic segment. */
static void give_back(vmm_allocator *a, int what, vmm_phys h, uintptr_t va, size_t size)
{
    const vmm_driver_ops *ops = a->drv->ops;
    int r = VMM_DRV_SUCCESS;
    for (int t = 0; t < UNMAP_TRIES; t++) {
        r = what == 0 ? ops->mem_release(a->drv, h) : what == 1 ? ops->va_free(a->drv, va, size)
                                                                 : ops->mem_free(a->drv, va);
        if (r == VMM_DRV_SUCCESS)
            return;
    }
    fprintf(stderr, "vmmalloc: vmm_destroy: %s could not be returned to the driver (%s)\n",
            what == 0 ? "a physical handle" : what == 1 ? "a VA reservation" : "a classic segment",
            vmm_drv_result_name(r));
}

void vmm_seg_destroy_all(vmm_allocator *a)
{
    vmm_alias_destroy_all(a); /* each handle is then mapped once: released once below */
    if (quar_retry(a, UNMAP_TRIES, 1)) {
        fprintf(stderr, "vmmalloc: vmm_destroy: %zu quarantined page(s) could not be unmapped; "
                        "releasing their handles anyway\n", a->n_quar);
        while (a->n_quar) {
            give_back(a, 0, a->quar[--a->n_quar].h, 0, 0);
            a->n_handles--;
        }
    }
    if (a->quar)
        vmm_meta_free(a->meta, a->quar, a->cap_quar * sizeof *a->quar);
    a->quar = NULL;
    a->cap_quar = 0;
    while (a->segs) {
        vmm_segment *s = a->segs;
        vmm_block *b = s->first;
        while (b) {
            vmm_block *n = b->next;
            vmm_block_delete(a, b);
            b = n;
        }
        if (s->expandable) {
            for (size_t p = 0; p < s->n_pages;) {
                if (!s->pages[p]) {
                    p++;
                    continue;
                }
                size_t e = handle_end(s, p);
                unmap_page(a, NULL, s->base + p * s->page_size, (e - p) * s->page_size, UNMAP_TRIES);
                give_back(a, 0, s->pages[p], 0, 0);
                a->n_handles--;
                p = e;
            }
            give_back(a, 1, 0, s->base, s->size);
        } else {
            give_back(a, 2, 0, s->base, 0);
        }
        seg_unlink(a, s);
        seg_delete(a, s);
    }
    a->unmapped_tree[0] = a->unmapped_tree[1] = NULL;
    while (a->n_fh) {
        give_back(a, 0, a->fh[--a->n_fh].h, 0, 0);
        a->n_handles--;
    }
    if (a->fh)
        vmm_meta_free(a->meta, a->fh, a->cap_fh * sizeof *a->fh);
    a->fh = NULL;
    a->cap_fh = 0;
}

/* ---- peer access ---------------------------------------------------------------------------- */

/* set_access again over every mapped run of every expandable segment, so a peer added now reaches
 * memory mapped before. Quarantined pages are not in the page table and are never handed out. */
static int seg_regrant_all(vmm_allocator *a)
{
    for (vmm_segment *s = a->segs; s; s = s->next) {
        if (!s->expandable)
            continue;
        size_t ps = s->page_size;
        for (size_t pg = 0; pg < s->n_pages;) {
            if (!s->pages[pg]) {
                pg++;
                continue;
            }
            size_t end = pg;
            while (end < s->n_pages && s->pages[end])
                end++;
            vmm_lanes_yield(a, NULL); /* mapped pages: only the allocator lock's holder changes them */
            int r = a->drv->ops->set_access(a->drv, s->base + pg * ps, (end - pg) * ps);
            vmm_lanes_resume(a, NULL);
            if (r)
                return vmm_fail_drv(r, "vmm_enable_peer_access: set_access");
            pg = end;
        }
    }
    return VMM_OK;
}

static int peer_enable(vmm_allocator *a, int peer)
{
    if (!a->drv->ops->peer_enable)
        return peer == a->dev.ordinal ? VMM_OK
                                      : vmm_fail(VMM_ENOTSUP, "peer access to device %d: the %s driver "
                                                              "has no peer devices", peer, a->drv->ops->name);
    int r = a->drv->ops->peer_enable(a->drv, peer);
    if (r == VMM_DRV_NOT_SUPPORTED)
        return vmm_fail(VMM_ENOTSUP, "peer access: device %d cannot access the memory of device %d "
                                     "(cuDeviceCanAccessPeer says no)", peer, a->dev.ordinal);
    if (r)
        return vmm_fail(vmm_status_from_drv(r), "peer access to device %d: %s (%d)", peer,
                        vmm_drv_result_name(r), r);
    return VMM_OK;
}

int vmm_seg_peers_init(vmm_allocator *a)
{
    if (a->cfg.peer_all) {
        /* every peer the driver allows; the others simply stay without access */
        for (int i = 0; a->drv->ops->peer_enable && i < a->dev.device_count && i < 64; i++)
            if (i != a->dev.ordinal)
                (void)a->drv->ops->peer_enable(a->drv, i);
        return VMM_OK;
    }
    for (int i = 0; i < 64; i++)
        if (a->cfg.peer_mask >> i & 1) {
            int rc = peer_enable(a, i);
            if (rc)
                return vmm_fail(rc == VMM_ENOTSUP ? VMM_ECONFIG : rc, "peer_access: %s", vmm_last_error());
        }
    return VMM_OK;
}

VMM_API int vmm_enable_peer_access(vmm_allocator *a, int peer)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_enable_peer_access: allocator is NULL");
    if (peer < 0)
        return vmm_fail(VMM_EINVAL, "vmm_enable_peer_access: device %d is negative", peer);
    vmm_lock(a);
    int m = vmm_capture_relax(a); /* cuMemSetAccess must not invalidate a capture */
    int rc = peer_enable(a, peer);
    if (rc == VMM_OK && peer != a->dev.ordinal)
        rc = seg_regrant_all(a);
    vmm_capture_restore(a, m);
    vmm_unlock(a);
    return rc;
}
