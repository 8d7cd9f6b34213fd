/* Statistics: counters, vmm_get_stats / reset, the JSON dump, and vmm_check (every invariant). */
#include <stdio.h>
#include <string.h>

#include "api/sim_api.h"
#include "api/stats.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/alias.h"
#include "core/callbacks.h"
#include "core/capture.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/segment.h"
#include "core/tcache.h"
#include "core/types.h"
#include "driver/driver.h"
#include "features/ipc.h"
#include "features/mempool.h"
#include "features/sleep.h"

/* vmm_stat_add / vmm_stat_update are inline in internal.h (hot path). */

/* The arrays the malloc / free path keeps only per pool (plus ALL's peak): see vmm_hot_up. */
#define HOT_ARRAYS(X) X(allocation) X(allocated_bytes) X(requested_bytes) X(inactive_split) \
    X(inactive_split_bytes)

static void sum_pools(vmm_stat *st)
{
    st[VMM_POOL_ALL].current = st[VMM_POOL_SMALL].current + st[VMM_POOL_LARGE].current;
    st[VMM_POOL_ALL].allocated = st[VMM_POOL_SMALL].allocated + st[VMM_POOL_LARGE].allocated;
    st[VMM_POOL_ALL].freed = st[VMM_POOL_SMALL].freed + st[VMM_POOL_LARGE].freed;
}

/* active from allocation and pending: every allocation starts active, a direct free ends both at
 * once, a deferred one moves the block from allocation to pending until it completes. So since the
 * last cumulative reset active.freed = allocation.freed - deferrals + completions. */
static void derive_active(vmm_stat *act, const vmm_stat *alloc, const vmm_stat *pend)
{
    for (int p = 0; p < VMM_NPOOLS; p++) {
        vmm_stat *s = &act[p + 1];
        s->current = alloc[p + 1].current + pend[p].current;
        s->allocated = alloc[p + 1].allocated;
        s->freed = alloc[p + 1].freed - pend[p].allocated + pend[p].freed;
    }
    sum_pools(act);
}

void vmm_stats_derive(const vmm_allocator *a, vmm_stats *out)
{
    *out = a->stats;
#define SUM_(f) sum_pools(out->f);
    HOT_ARRAYS(SUM_)
#undef SUM_
    derive_active(out->active, out->allocation, a->pending);
    derive_active(out->active_bytes, out->allocated_bytes, a->pending_bytes);
}

static void fill_stats(vmm_allocator *a, vmm_stats *out)
{
    vmm_stats_derive(a, out);
    out->metadata_bytes = vmm_meta_bytes(a->meta);
}

VMM_API int vmm_get_stats(vmm_allocator *a, vmm_stats *out)
{
    if (!a || !out)
        return vmm_fail(VMM_EINVAL, "vmm_get_stats: NULL argument");
    vmm_lock(a);
    vmm_tc_fold(a); /* what threads' caches did since the last fold */
    fill_stats(a, out);
    vmm_unlock(a);
    return VMM_OK;
}

/* Every vmm_stat array of vmm_stats with its PyTorch name. */
#define STAT_ARRAYS(X)                                                                     \
    X(allocation) X(segment) X(active) X(inactive_split) X(allocated_bytes) X(reserved_bytes) \
    X(active_bytes) X(inactive_split_bytes) X(requested_bytes) X(mapped_bytes)
#define STAT_SINGLES(X) X(oversize_allocations) X(oversize_segments) X(sleeping_bytes)
#define STAT_COUNTERS(X)                                                                   \
    X(num_alloc_retries) X(num_ooms) X(num_sync_all_streams) X(num_device_alloc)          \
    X(num_device_free) X(num_event_waits) X(num_pages_mapped) X(num_pages_unmapped)       \
    X(num_pages_remapped) X(max_split_size) X(metadata_bytes) X(reserved_va_bytes)         \
    X(backup_bytes) X(num_sleeps) X(num_wakes) X(num_wake_failures)                       \
    X(num_free_memory_callbacks) X(num_free_memory_callback_hits) X(ipc_exported_blocks)  \
    X(ipc_limbo_blocks) X(ipc_open_mappings)

static void reset_stat(vmm_stat *s, int peaks, int cumulative)
{
    if (peaks)
        s->peak = s->current;
    if (cumulative)
        s->allocated = s->freed = 0;
}

/* peaks: every peak back to its current value; cumulative: allocated / freed and the counters to 0 */
static int reset_stats(vmm_allocator *a, int peaks, int cumulative, const char *fn)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "%s: allocator is NULL", fn);
    vmm_lock(a);
    vmm_tc_fold(a);
    vmm_stats *s = &a->stats, d;
    vmm_stats_derive(a, &d);
    /* peaks restart from the derived currents; the stored ones may be partial (vmm_hot_up) */
#define RESET_ARRAY_(f)                                                                    \
    for (int p = 0; p < VMM_POOL_COUNT; p++) {                                            \
        reset_stat(&s->f[p], peaks, cumulative);                                          \
        if (peaks)                                                                        \
            s->f[p].peak = d.f[p].current;                                                \
    }
    STAT_ARRAYS(RESET_ARRAY_)
#undef RESET_ARRAY_
    for (int p = 0; p < VMM_NPOOLS; p++) {
        reset_stat(&a->pending[p], peaks, cumulative);
        reset_stat(&a->pending_bytes[p], peaks, cumulative);
    }
#define RESET_SINGLE_(f) reset_stat(&s->f, peaks, cumulative);
    STAT_SINGLES(RESET_SINGLE_)
#undef RESET_SINGLE_
    if (cumulative) {
        s->num_alloc_retries = s->num_ooms = s->num_sync_all_streams = 0;
        s->num_device_alloc = s->num_device_free = s->num_event_waits = 0;
        s->num_pages_mapped = s->num_pages_unmapped = s->num_pages_remapped = 0;
        s->num_sleeps = s->num_wakes = s->num_wake_failures = 0;
        s->num_free_memory_callbacks = s->num_free_memory_callback_hits = 0;
    }
    vmm_unlock(a);
    return VMM_OK;
}

VMM_API int vmm_reset_stats(vmm_allocator *a, int cumulative)
{
    return reset_stats(a, 1, cumulative, "vmm_reset_stats");
}

VMM_API int vmm_reset_accumulated_stats(vmm_allocator *a)
{
    return reset_stats(a, 0, 1, "vmm_reset_accumulated_stats");
}

/* ---- JSON --------------------------------------------------------------------------------- */

typedef struct jbuf {
    char *buf;
    size_t len, off;
    int n;
} jbuf;

static void jput(jbuf *j, const char *key, long long v)
{
    int w = snprintf(j->off < j->len ? j->buf + j->off : NULL, j->off < j->len ? j->len - j->off : 0,
                     "%s\"%s\":%lld", j->n++ ? "," : "", key, v);
    j->off += (size_t)w;
}

static void jput_stat(jbuf *j, const char *name, const char *pool, const vmm_stat *s)
{
    char key[96];
    const char *field[4] = {"current", "peak", "allocated", "freed"};
    long long v[4] = {s->current, s->peak, s->allocated, s->freed};
    for (int i = 0; i < 4; i++) {
        if (pool)
            snprintf(key, sizeof key, "%s.%s.%s", name, pool, field[i]);
        else
            snprintf(key, sizeof key, "%s.%s", name, field[i]);
        jput(j, key, v[i]);
    }
}

VMM_API int vmm_stats_json(vmm_allocator *a, char *buf, size_t len)
{
    if (!a || !buf || len == 0)
        return vmm_fail(VMM_EINVAL, "vmm_stats_json: NULL argument or zero length");
    vmm_stats s;
    vmm_lock(a);
    vmm_tc_fold(a);
    fill_stats(a, &s);
    vmm_sim_counters c;
    int sim = vmm_sim_counters_of(a, &c) == 0; /* the simulator through the sim API */
    int64_t n_pools, pool_res, pool_alloc, routes; /* private pools (mempool.c) */
    vmm_mempool_totals(a, &n_pools, &pool_res, &pool_alloc, &routes);
    size_t tc_n, tc_bytes, tc_cap; /* thread caches (tcache.c) */
    uint64_t tc_counts[VMM_TC_COUNTS];
    vmm_tc_info(a, &tc_n, &tc_bytes, &tc_cap, tc_counts);
    int tc_on = vmm_tc_on(a);
    long long unlocked = (long long)a->growths_unlocked;
    /* read under the lock: another thread's malloc opens the lanes and folds their counts */
    int lanes_open = a->lanes_open;
    long long lane_mallocs = (long long)a->lane_counts[0], lane_frees = (long long)a->lane_counts[1];
    vmm_unlock(a);
    jbuf j = {buf, len, 0, 0};
    static const char *pools[VMM_POOL_COUNT] = {"all", "small_pool", "large_pool"};
    buf[0] = '{';
    j.off = 1;
#define JSON_ARRAY_(f)                                                                     \
    for (int p = 0; p < VMM_POOL_COUNT; p++)                                              \
        jput_stat(&j, #f, pools[p], &s.f[p]);
    STAT_ARRAYS(JSON_ARRAY_)
#undef JSON_ARRAY_
#define JSON_SINGLE_(f) jput_stat(&j, #f, NULL, &s.f);
    STAT_SINGLES(JSON_SINGLE_)
#undef JSON_SINGLE_
#define JSON_COUNTER_(f) jput(&j, #f, s.f);
    STAT_COUNTERS(JSON_COUNTER_)
#undef JSON_COUNTER_
    jput(&j, "private_pools.count", n_pools);
    jput(&j, "private_pools.routes", routes);
    jput(&j, "private_pools.reserved_bytes", pool_res);
    jput(&j, "private_pools.allocated_bytes", pool_alloc);
    jput(&j, "thread_caches.on", tc_on);
    jput(&j, "thread_caches.count", (long long)tc_n);
    jput(&j, "thread_caches.bytes", (long long)tc_bytes);
    jput(&j, "thread_caches.cap_bytes", (long long)tc_cap);
    jput(&j, "thread_caches.malloc_hits", (long long)tc_counts[0]);
    jput(&j, "thread_caches.malloc_misses", (long long)tc_counts[1]);
    jput(&j, "thread_caches.frees_kept", (long long)tc_counts[2]);
    jput(&j, "thread_caches.frees_passed", (long long)tc_counts[3]);
    jput(&j, "thread_caches.frees_kept_from_others", (long long)tc_counts[4]);
    jput(&j, "lanes.open", lanes_open);
    jput(&j, "lanes.mallocs", lane_mallocs);
    jput(&j, "lanes.frees", lane_frees);
    jput(&j, "growths_unlocked", unlocked);
    if (sim) {
        jput(&j, "sim.device_syncs", (long long)c.device_syncs);
        jput(&j, "sim.stream_syncs", (long long)c.stream_syncs);
        jput(&j, "sim.event_syncs", (long long)c.event_syncs);
        jput(&j, "sim.driver_time_ns", (long long)c.driver_time_ns);
        char key[64];
        for (int k = 0; k < VMM_SIM_CALL_COUNT; k++) {
            snprintf(key, sizeof key, "sim.calls.%s", vmm_sim_call_name(k));
            jput(&j, key, (long long)c.calls[k]);
        }
    }
    int w = snprintf(j.off < len ? buf + j.off : NULL, j.off < len ? len - j.off : 0, "}");
    j.off += (size_t)w;
    if (j.off >= len) {
        buf[len - 1] = '\0';
        return vmm_fail(VMM_ERANGE, "vmm_stats_json: buffer of %zu bytes too small (%zu needed)",
                        len, j.off + 1);
    }
    return (int)j.off;
}

/* ---- vmm_check ------------------------------------------------------------------------------ */

typedef struct sums {
    int64_t v[VMM_NPOOLS][10];
    size_t shadows;            /* SHADOW blocks seen (alias.c) */
} sums;
enum { S_ALLOC, S_ALLOC_B, S_REQ_B, S_ACTIVE, S_ACTIVE_B, S_ISPLIT, S_ISPLIT_B, S_SEG, S_MAPPED, S_RES };

static int bad(const char *what, uintptr_t addr)
{
    return vmm_fail(VMM_ECORRUPT, "vmm_check: %s (at 0x%llx)", what, (unsigned long long)addr);
}

static int in_deferred(const vmm_allocator *a, const vmm_block *b)
{
    for (const vmm_block *d = a->deferred; d; d = d->dnext)
        if (d == b)
            return 1;
    return 0;
}

static size_t tree_count(const vmm_block *t)
{
    return t ? 1 + tree_count(t->left) + tree_count(t->right) : 0;
}

/* The growth that parked MAPPING block b, NULL when none did. */
static const vmm_growth *growth_of(const vmm_allocator *a, const vmm_block *b)
{
    for (const vmm_growth *g = a->growing; g; g = g->next)
        if (g->blk == b)
            return g;
    return NULL;
}

static int check_segment(vmm_allocator *a, vmm_segment *s, sums *sm, size_t *nfree, size_t *nunm,
                         size_t *nlive)
{
    int p = s->pool;
    uintptr_t at = s->base;
    const vmm_block *prev = NULL;
    if (s->first && s->first->prev)
        return bad("first block has a predecessor", s->base);
    const char *why;
    for (vmm_block *b = s->first; b; prev = b, b = b->next) {
        if (b->addr != at || b->seg != s || b->prev != prev || b->size == 0 || b->size % 512)
            return bad("blocks do not tile the segment", b->addr);
        at += b->size;
        if (prev && prev->state == b->state &&
            (b->state == VMM_BLOCK_FREE || b->state == VMM_BLOCK_UNMAPPED))
            return bad("two neighbouring free blocks not merged", b->addr);
        switch (b->state) {
        case VMM_BLOCK_FREE:
            if (s->asleep) { /* sleep.c: frozen or asleep, its free blocks are out of the index */
                if (b->in_index)
                    return bad("free block of a sleeping segment is in the free index", b->addr);
                break;
            }
            (*nfree)++;
            if (!b->in_index || !vmm_tree_contains(*VMM_FREE_ROOT(a, s), b))
                return bad("free block missing from the free index", b->addr);
            if (b->prev || b->next) {
                sm->v[p][S_ISPLIT]++;
                sm->v[p][S_ISPLIT_B] += (int64_t)b->size;
            }
            break;
        case VMM_BLOCK_UNMAPPED:
            (*nunm)++;
            if (!s->expandable || (b->addr - s->base) % s->page_size || b->size % s->page_size)
                return bad("unmapped block not page aligned", b->addr);
            if (!b->in_index || !vmm_tree_contains(*VMM_UNMAPPED_ROOT(a, s), b))
                return bad("unmapped block missing from the unmapped index", b->addr);
            break;
        case VMM_BLOCK_ALLOCATED:
            (*nlive)++;
            if (vmm_live_find(a, b->addr) != b)
                return bad("allocated block missing from the live table", b->addr);
            if ((why = vmm_live_check_slot(a, b)) != NULL)
                return bad(why, b->addr);
            sm->v[p][S_ALLOC]++;
            sm->v[p][S_ALLOC_B] += (int64_t)b->size;
            sm->v[p][S_REQ_B] += (int64_t)b->requested;
            sm->v[p][S_ACTIVE]++;
            sm->v[p][S_ACTIVE_B] += (int64_t)b->size;
            break;
        case VMM_BLOCK_PENDING:
            if (!in_deferred(a, b) || vmm_live_find(a, b->addr))
                return bad("pending block not on the deferred list only", b->addr);
            sm->v[p][S_ACTIVE]++;
            sm->v[p][S_ACTIVE_B] += (int64_t)b->size;
            break;
        case VMM_BLOCK_DETACHING: /* callbacks.c: mapped until its before_unmap has run */
            if (!s->expandable || (b->addr - s->base) % s->page_size || b->size % s->page_size ||
                b->in_index || !vmm_cb_is_detaching(a, b))
                return bad("detaching block not whole pages on the detach list only", b->addr);
            break;
        case VMM_BLOCK_MAPPING: /* segment.c: a growth creates its handles unlocked */
            if (!s->expandable || (b->addr - s->base) % s->page_size || b->size % s->page_size ||
                b->in_index || !growth_of(a, b))
                return bad("mapping block not whole pages of a growth in flight only", b->addr);
            break;
        case VMM_BLOCK_SHADOW: /* alias.c: bytes of an aliased page that its other view owns */
            sm->shadows++;
            if (!s->expandable || b->in_index ||
                (b->addr - s->base) / s->page_size != (b->addr + b->size - 1 - s->base) / s->page_size)
                return bad("shadow block not inside one page or in an index", b->addr);
            break;
        default:
            return bad("block in an unknown state", b->addr);
        }
    }
    if (at != s->base + s->size)
        return bad("blocks do not cover the segment", s->base);
    sm->v[p][S_SEG]++;
    if (!s->expandable) {
        sm->v[p][S_MAPPED] += (int64_t)s->size;
        sm->v[p][S_RES] += (int64_t)s->size;
        return VMM_OK;
    }
    /* pages: mapped exactly where a block other than UNMAPPED lies, as the driver sees it */
    size_t ps = s->page_size, mapped = 0;
    const vmm_block *b = s->first;
    for (size_t pg = 0; pg < s->n_pages; pg++) {
        uintptr_t va = s->base + pg * ps;
        while (b->addr + b->size <= va)
            b = b->next;
        int want = 0, inflight = 0;
        for (const vmm_block *c = b; c && c->addr < va + ps; c = c->next) {
            want |= c->state != VMM_BLOCK_UNMAPPED && c->state != VMM_BLOCK_MAPPING;
            inflight |= c->state == VMM_BLOCK_MAPPING;
        }
        int under = want;
        if (s->asleep == 2) {
            /* asleep: a page stays mapped only under a detaching block or where the driver refused
             * its unmap; never under an unmapped block */
            if (!want && s->pages[pg])
                return bad("page of an unmapped block is mapped", va);
            want = s->pages[pg] != 0;
        }
        if (want != (s->pages[pg] != 0))
            return bad(want ? "page under a block is not mapped" : "page of an unmapped block is mapped",
                       va);
        /* a quarantined page (failed rollback unmap) is unmapped in the page table but still
         * mapped in the driver, with the handle recorded in the quarantine */
        const vmm_quarantined *q = vmm_quarantine_find(a, va);
        if (q && want)
            return bad("a quarantined page lies under a block in use", va);
        /* Ask the driver only where a mistake can hide: mapped and quarantined pages, and the
         * unmapped pages next to mapped ones. Asking about every page of an 80-141 GiB reservation
         * would cost ~10^5 driver calls per check on a real GPU. */
        int edge = (pg > 0 && s->pages[pg - 1]) || (pg + 1 < s->n_pages && s->pages[pg + 1]);
        if (!want && !q && !edge && !(s->asleep && under))
            continue;
        /* a growth in flight maps these pages with the lock released (segment.c): the driver may
         * have them mapped before the page table says so */
        if (inflight)
            continue;
        vmm_phys h = 0;
        int r = a->drv->ops->lookup_mapping(a->drv, va, &h);
        int ok = want ? r == VMM_DRV_SUCCESS && h == s->pages[pg]
                      : q ? r == VMM_DRV_SUCCESS && h == q->h : r != VMM_DRV_SUCCESS || h == 0;
        if (!ok)
            return bad("the driver's mapping differs from the page table", va);
        mapped += want;
    }
    if (mapped != s->mapped_pages)
        return bad("mapped page count is wrong", s->base);
    uintptr_t hat = 0;
    const char *hbad = vmm_seg_check_handles(s, &hat);
    if (hbad)
        return bad(hbad, hat);
    sm->v[p][S_MAPPED] += (int64_t)(mapped * ps);
    sm->v[p][S_RES] += (int64_t)(mapped * ps);
    return VMM_OK;
}

/* Use slots of a block (see vmm_block_ext): an allocated block has none recorded, a pending one
 * has an event in every recorded slot (unrecorded ones may be empty: retried by the deferred
 * scan). Adds the events the slots hold to *nev. */
static int check_slots(const vmm_block *b, size_t *nev)
{
    if (!b->n_uses)
        return VMM_OK;
    const vmm_block_ext *x = b->ext;
    if (!x || b->n_uses > x->cap_uses || x->cap_events != x->cap_uses || x->n_events > b->n_uses)
        return bad("record_stream slots out of bounds", b->addr);
    if (b->state == VMM_BLOCK_ALLOCATED && x->n_events)
        return bad("allocated block with a recorded event", b->addr);
    for (uint32_t i = 0; i < b->n_uses; i++) {
        if (i < x->n_events && !x->events[i])
            return bad("recorded slot without an event", b->addr);
        *nev += x->events[i] != NULL;
    }
    return VMM_OK;
}

/* Every event created is in exactly one place: the pool, a fence, or a use slot of a live or
 * pending block. */
static int check_events(const vmm_allocator *a)
{
    size_t nev = a->n_ev_pool, ndef = 0;
    for (const vmm_stream_rec *r = a->streams; r; r = r->next)
        for (const vmm_fence *f = r->fences; f; f = f->next)
            nev++;
    vmm_block *lb;
    VMM_LIVE_FOREACH(a, lb) {
        int rc = check_slots(lb, &nev);
        if (rc)
            return rc;
    }
    for (const vmm_block *b = a->deferred; b; b = b->dnext) {
        ndef++;
        if (b->state != VMM_BLOCK_PENDING)
            return bad("deferred block not pending", b->addr);
        int rc = check_slots(b, &nev);
        if (rc)
            return rc;
    }
    if (ndef != atomic_load_explicit(&a->n_deferred, memory_order_relaxed))
        return bad("deferred block count is wrong", 0);
    if (nev != a->n_events)
        return vmm_fail(VMM_ECORRUPT, "vmm_check: %zu events accounted for, %zu created", nev,
                        a->n_events);
    return VMM_OK;
}

static int check_locked(vmm_allocator *a)
{
    sums sm;
    memset(&sm, 0, sizeof sm);
    size_t nfree = 0, nunm = 0, nlive = 0, nsegs = 0;
    for (vmm_segment *s = a->segs; s; s = s->next) {
        nsegs++;
        int rc = check_segment(a, s, &sm, &nfree, &nunm, &nlive);
        if (rc)
            return rc;
    }
    if (nsegs != a->n_segs)
        return bad("segment count is wrong", 0);
    size_t tf = 0;
    for (vmm_stream_rec *r = a->streams; r; r = r->next)
        tf += tree_count(r->free_tree[0]) + tree_count(r->free_tree[1]);
    size_t tu = tree_count(a->unmapped_tree[0]) + tree_count(a->unmapped_tree[1]);
    size_t pf = 0, pu = 0; /* private pools' indexes (mempool.c) */
    int mrc = vmm_mempool_check(a, &pf, &pu);
    if (mrc)
        return mrc;
    tf += pf;
    tu += pu;
    if (tf != nfree)
        return bad("free index holds blocks that are not free", 0);
    if (tu != nunm || nunm != a->n_unmapped_blocks)
        return bad("unmapped index holds blocks that are not unmapped", 0);
    if (nlive != vmm_live_count(a))
        return bad("live table holds blocks that are not allocated", 0);
    int erc = check_events(a);
    if (!erc)
        erc = vmm_sleep_check(a);
    if (!erc)
        erc = vmm_cb_check(a);
    if (!erc)
        erc = vmm_ipc_check(a);
    if (erc)
        return erc;
    for (int p = 0; p < VMM_NPOOLS; p++) {
        for (size_t i = 0; i < a->n_fh; i++)
            if (a->fh[i].pool == p)
                sm.v[p][S_RES] += (int64_t)a->fh[i].size;
        for (size_t i = 0; i < a->n_quar; i++)
            if (a->quar[i].pool == p)
                sm.v[p][S_RES] += (int64_t)a->quar[i].size;
        /* cached handles a growth in flight took: reserved, in no segment nor cache */
        for (const vmm_growth *g = a->growing; g; g = g->next)
            if (g->pool == p)
                sm.v[p][S_RES] += (int64_t)g->held_bytes;
    }
    /* an aliased page is mapped twice and reserved once (alias.c) */
    size_t ashadows = 0, adup_handles = 0;
    int64_t adups[VMM_NPOOLS] = {0, 0};
    uintptr_t aat = 0;
    const char *abad = vmm_alias_check(a, &ashadows, adups, &adup_handles, &aat);
    if (abad)
        return bad(abad, aat);
    if (ashadows != sm.shadows)
        return bad("shadow blocks that no aliased page names", 0);
    for (int p = 0; p < VMM_NPOOLS; p++)
        sm.v[p][S_RES] -= adups[p];
    vmm_stats derived;
    vmm_stats_derive(a, &derived);
    const vmm_stats *st = &derived;
    const vmm_stat *arr[10] = {st->allocation, st->allocated_bytes, st->requested_bytes, st->active,
                               st->active_bytes, st->inactive_split, st->inactive_split_bytes,
                               st->segment, st->mapped_bytes, st->reserved_bytes};
    static const char *names[10] = {"allocation", "allocated_bytes", "requested_bytes", "active",
                                    "active_bytes", "inactive_split", "inactive_split_bytes",
                                    "segment", "mapped_bytes", "reserved_bytes"};
    for (int k = 0; k < 10; k++) {
        for (int p = 0; p < VMM_NPOOLS; p++) {
            if (arr[k][p + 1].current != sm.v[p][k])
                return vmm_fail(VMM_ECORRUPT, "vmm_check: stat %s.%s.current is %lld, recomputed %lld",
                                names[k], p ? "large_pool" : "small_pool",
                                (long long)arr[k][p + 1].current, (long long)sm.v[p][k]);
        }
        if (arr[k][0].current != arr[k][1].current + arr[k][2].current)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: stat %s.all is not the sum of the pools", names[k]);
    }
    size_t nh = a->n_fh + a->n_quar;
    for (const vmm_growth *g = a->growing; g; g = g->next)
        nh += g->held_handles;
    for (vmm_segment *s = a->segs; s; s = s->next)
        nh += vmm_seg_handles(s);
    nh -= adup_handles;
    if (nh != a->n_handles)
        return bad("physical handle count is wrong", 0);
    if ((size_t)st->reserved_bytes[0].current > a->cap)
        return bad("reserved bytes exceed the allowed memory", 0);
    return VMM_OK;
}

VMM_API int vmm_check(vmm_allocator *a)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_check: allocator is NULL");
    vmm_lock(a);
    int tc = vmm_tc_pause(a); /* one state: cached blocks back in their pools, no fast path */
    int m = vmm_capture_relax(a); /* lookup_mapping is an unsafe call while capturing (driver.h) */
    int rc = check_locked(a);
    vmm_tc_resume(a, tc);
    vmm_capture_restore(a, m);
    vmm_unlock(a);
    return rc;
}
