/*
 * The allocator's public entry points and the malloc path. One mutex per allocator (as PyTorch):
 * every public function takes it, so any of them may be called from any thread.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "api/group.h"
#include "api/stats.h"
#include "base/base.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/callbacks.h"
#include "core/capture.h"
#include "core/config.h"
#include "core/counters.h"
#include "core/events.h"
#include "api/history.h"
#include "core/lane.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/segment.h"
#include "core/tcache.h"
#include "core/types.h"
#include "driver/driver.h"
#include "features/ipc.h"
#include "features/mempool.h"
#include "features/pinned.h"
#include "features/sleep.h"

enum {
    MAX_REQUEST_SHIFT = 62,   /* sizes at or above 2^62 can't be rounded without overflow */
    GROW_ATTEMPTS = 6,        /* grow / reclaim rounds before giving up (each must progress) */
};

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* ---- create / destroy --------------------------------------------------------------------- */

static int open_driver(vmm_allocator *a)
{
    char msg[256] = "";
    int r = vmm_driver_open(a->cfg.driver, a->cfg.device, &a->cfg.sim, &a->drv, msg, sizeof msg);
    if (!r)
        return VMM_OK;
    if (a->cfg.driver == VMM_DRIVER_SIM)
        return vmm_fail_drv(r, "vmm_create: opening the simulated device");
    return vmm_fail(vmm_status_from_drv(r), "vmm_create: cuda driver, device %d: %s (%s)",
                    a->cfg.device, msg, vmm_drv_result_name(r));
}

/* Most reserved bytes a memory fraction allows: that share of the device, in whole granules. */
static size_t cap_of(const vmm_allocator *a, double fraction)
{
    size_t g = a->dev.granularity ? a->dev.granularity : 2 * VMM_MiB;
    return (size_t)((double)a->dev.total_bytes * fraction) / g * g;
}

static int setup_device(vmm_allocator *a)
{
    int r = a->drv->ops->device_info(a->drv, &a->dev);
    if (r)
        return vmm_fail_drv(r, "vmm_create: device_info");
    size_t g = a->dev.granularity ? a->dev.granularity : 2 * VMM_MiB;
    if (a->cfg.expandable_segments && !a->dev.vmm_supported)
        return vmm_fail(VMM_ENODEV, "vmm_create: device %d (%s) has no virtual memory management; "
                                    "use expandable_segments:false", a->dev.ordinal, a->dev.name);
    const char *keys[VMM_NPOOLS] = {"small_page_size", "large_page_size"};
    size_t ps[VMM_NPOOLS] = {a->cfg.small_page_size, a->cfg.large_page_size};
    for (int p = 0; p < VMM_NPOOLS; p++) {
        if (ps[p] == 0 || ps[p] % g)
            return vmm_fail(VMM_ECONFIG, "%s: %zu is not a multiple of the device granularity %zu",
                            keys[p], ps[p], g);
        a->page_size[p] = ps[p];
    }
    a->cap = cap_of(a, a->cfg.per_process_memory_fraction);
    a->va_size[VMM_LARGE] = round_up(a->dev.total_bytes, a->page_size[VMM_LARGE]);
    size_t small = round_up(a->dev.total_bytes / 16, a->page_size[VMM_SMALL]);
    a->va_size[VMM_SMALL] = small > 16 * a->page_size[VMM_SMALL] ? small : 16 * a->page_size[VMM_SMALL];
    a->stats.max_split_size = a->cfg.max_split_size == SIZE_MAX ? -1 : (int64_t)a->cfg.max_split_size;
    return VMM_OK;
}

/* Give a block a thread cache held back to its pool (tcache.c drains; allocator lock held, or the
 * block's lane's): the free as vmm_free does it, but no stats, which the cache's delta counted. */
static void tc_release(vmm_allocator *a, vmm_block *b)
{
    /* under the allocator lock or b's lane's (lane.c): found and removed in one shard-lock hold */
    if (VMM_UNLIKELY(!vmm_live_take(a, b->addr, b)))
        abort(); /* a cached block is live by construction: the table is corrupt */
    VMM_HISTORY(a, VMM_TRACE_FREE_REQUESTED, b->addr, b->size, b->seg->stream);
    b->free_seq = ++b->seg->srec->seq;
    b->requested = 0;
    vmm_pool_release(a, b);
}

VMM_API int vmm_create(const char *conf, vmm_allocator **out)
{
    if (!out)
        return vmm_fail(VMM_EINVAL, "vmm_create: out is NULL");
    *out = NULL;
    /* aligned: the live shards and the thread caches' fields sit on cache lines of their own */
    size_t asz = (sizeof(vmm_allocator) + 63) / 64 * 64;
    vmm_allocator *a = aligned_alloc(64, asz);
    if (!a)
        return vmm_fail(VMM_EHOSTMEM, "vmm_create: out of host memory");
    memset(a, 0, asz);
    /* lower layers call up through these (core/types.h, vmm_hooks) */
    a->hooks.tc_holds = vmm_tc_holds;
    a->hooks.finish_detached = vmm_seg_finish_detached;
    a->hooks.free = vmm_free;
    a->hooks.tag_asleep = vmm_sleep_tag_asleep;
    vmm_witness_register(a, &a->lock, VMM_RANK_ALLOCATOR, "the allocator lock", 0);
    for (size_t i = 0; i < VMM_LIVE_SHARDS; i++)
        vmm_witness_register(a, &a->live[i].lock, VMM_RANK_SHARD, "a live-table shard's lock", 0);
    a->t0_ns = vmm_history_now_ns();
    int rc = vmm_config_load(&a->cfg, conf);
    if (!rc)
        rc = vmm_meta_open(&a->meta);
    if (!rc)
        rc = open_driver(a);
    if (!rc)
        rc = setup_device(a);
    if (!rc)
        rc = vmm_seg_peers_init(a);
    if (!rc)
        rc = vmm_ipc_setup(a);
    if (!rc)
        rc = vmm_tc_setup(a, a->cfg.thread_cache, a->cfg.pow2_divisions[0] <= 1, a->cfg.depot,
                          tc_release);
    if (!rc)
        vmm_lanes_setup(a);
    if (rc) {
        if (a->drv)
            a->drv->ops->close(a->drv);
        if (a->meta)
            vmm_meta_close(a->meta);
        vmm_witness_forget(a);
        free(a);
        return rc;
    }
    *out = a;
    return VMM_OK;
}

VMM_API void vmm_destroy(vmm_allocator *a)
{
    if (!a)
        return;
    vmm_cb_destroy(a); /* before_unmap for what is still mapped, outside the lock */
    vmm_tc_unregister(a); /* exiting threads leave a alone from now on */
    vmm_lock(a);
    vmm_tc_destroy(a); /* cached blocks back to their pools first: they are not live */
    int mode = vmm_capture_relax(a); /* its driver calls must not invalidate a capture */
    vmm_ipc_destroy(a);
    vmm_sleep_destroy(a);
    vmm_pinned_destroy(a);
    vmm_events_shutdown(a);
    size_t live_n = vmm_live_count(a);
    if (live_n) {
        size_t bytes = 0;
        vmm_block *b;
        VMM_LIVE_FOREACH(a, b)
            bytes += b->size;
        fprintf(stderr, "vmmalloc: vmm_destroy: %zu live block(s), %zu bytes, still allocated; "
                        "returning their memory anyway\n", live_n, bytes);
    }
    if (a->hooks.group_destroy_all)
        a->hooks.group_destroy_all(a);
    vmm_history_destroy(a);
    vmm_live_free_table(a);
    vmm_seg_destroy_all(a);
    vmm_mempool_destroy_all(a);
    vmm_capture_destroy(a);
    vmm_block_cache_drain(a);
    for (size_t i = 0; i < a->n_sim_streams; i++)
        a->drv->ops->stream_destroy(a->drv, a->sim_streams[i]);
    if (a->sim_streams)
        vmm_meta_free(a->meta, a->sim_streams, a->cap_sim_streams * sizeof *a->sim_streams);
    vmm_capture_restore(a, mode);
    a->drv->ops->close(a->drv);
    vmm_meta_close(a->meta);
    vmm_unlock(a);
    vmm_witness_forget(a); /* its locks go with it */
    free(a);
}

/* ---- malloc path -------------------------------------------------------------------------- */

static int oom(vmm_allocator *a, size_t size, size_t rounded, const char *tried)
{
    size_t free_b = 0, total = a->dev.total_bytes;
    vmm_tc_fold(a); /* the report's counters */
    vmm_lanes_yield(a, NULL);
    if (a->drv->ops->mem_get_info(a->drv, &free_b, &total))
        free_b = 0;
    vmm_lanes_resume(a, NULL);
    a->stats.num_ooms++;
    VMM_HISTORY(a, VMM_TRACE_OOM, free_b, size, NULL);
    vmm_stats st;
    vmm_stats_derive(a, &st);
    const vmm_stats *s = &st;
    double mib = (double)VMM_MiB;
    /* memory of private pools (CUDA graphs) is counted in the totals; say how much (as PyTorch) */
    int64_t n_pools, pool_res, pool_alloc, routes;
    vmm_mempool_totals(a, &n_pools, &pool_res, &pool_alloc, &routes);
    char pools[160] = "";
    if (n_pools)
        snprintf(pools, sizeof pools, " Private pools (CUDA graphs): %lld, reserving %.2f MiB of "
                 "which %.2f MiB allocated.", (long long)n_pools, (double)pool_res / mib,
                 (double)pool_alloc / mib);
    return vmm_fail(VMM_ENOMEM,
                    "vmmalloc: out of memory. Tried to allocate %.2f MiB (%zu bytes, %zu after rounding) "
                    "on device %d (%s), total capacity %.2f MiB, of which %.2f MiB is free; "
                    "this allocator may use %.2f MiB. Allocated by this allocator: %.2f MiB; "
                    "reserved but unallocated: %.2f MiB (cached handles %.2f MiB).%s Tried: %s.",
                    (double)size / mib, size, rounded, a->dev.ordinal, a->dev.name,
                    (double)total / mib, (double)free_b / mib, (double)a->cap / mib,
                    (double)s->allocated_bytes[0].current / mib,
                    (double)(s->reserved_bytes[0].current - s->allocated_bytes[0].current) / mib,
                    (double)vmm_handles_bytes(a, -1) / mib, pools, tried);
}

/* garbage_collection_threshold: with a memory fraction set, give back cached memory once reserved
 * bytes pass threshold x cap (PyTorch frees old unsplit cached blocks; we free the oldest whole
 * classic segments, or idle free pages and their handles). */
static void collect_garbage(vmm_allocator *a)
{
    double th = a->cfg.garbage_collection_threshold;
    if (th <= 0.0 || a->cfg.per_process_memory_fraction >= 1.0)
        return;
    size_t limit = (size_t)(th * (double)a->cap);
    size_t reserved = (size_t)a->stats.reserved_bytes[0].current;
    if (reserved <= limit)
        return;
    size_t need = reserved - limit;
    if (!a->cfg.expandable_segments) {
        vmm_seg_classic_release(a, 0, need, 1);
        return;
    }
    /* fence unfenced frees and poll: pages of streams that caught up count as idle (no wait) */
    vmm_fences_record(a);
    vmm_fences_poll(a);
    size_t cached = vmm_handles_bytes(a, -1);
    if (cached < need)
        vmm_seg_reclaim(a, (need - cached + a->page_size[VMM_LARGE] - 1) / a->page_size[VMM_LARGE]);
    vmm_handles_release(a, 0, need);
}

VMM_API int vmm_set_memory_fraction(vmm_allocator *a, double fraction)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_set_memory_fraction: allocator is NULL");
    if (!(fraction >= 0.0 && fraction <= 1.0))
        return vmm_fail(VMM_EINVAL, "vmm_set_memory_fraction: %g is not in [0, 1]", fraction);
    vmm_lock(a);
    a->cfg.per_process_memory_fraction = fraction;
    a->cap = cap_of(a, fraction);
    vmm_unlock(a);
    return VMM_OK;
}

VMM_API int vmm_get_memory_fraction(vmm_allocator *a, double *fraction, size_t *cap_bytes)
{
    if (!a || !fraction)
        return vmm_fail(VMM_EINVAL, "vmm_get_memory_fraction: NULL argument");
    vmm_lock(a);
    *fraction = a->cfg.per_process_memory_fraction;
    if (cap_bytes)
        *cap_bytes = a->cap;
    vmm_unlock(a);
    return VMM_OK;
}

static int malloc_expandable(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size,
                             vmm_block **out, char *tried, size_t tried_len)
{
    int retried = 0, rc = VMM_ENOMEM;
    size_t off = 0;
    for (int attempt = 0; attempt < GROW_ATTEMPTS; attempt++) {
        size_t short_pages = 0;
        rc = vmm_seg_grow(a, sr, pool, size, out, &short_pages);
        if (rc != VMM_ENOMEM)
            return rc;
        if (!retried) {
            a->stats.num_alloc_retries++;
            retried = 1;
        }
        size_t got;
        if (attempt == 0) {
            /* what other threads' caches hold back, then idle pages, as few as the request lacks */
            vmm_tc_drain(a, 0);
            vmm_fences_poll(a);
            got = vmm_seg_reclaim(a, short_pages);
            off += (size_t)snprintf(tried + off, tried_len - off, "remapping %zu idle page(s)", got);
        } else if (attempt == 1) {
            vmm_fences_poll(a);
            got = vmm_seg_reclaim(a, SIZE_MAX);
        } else if (attempt == 2) {
            /* fence the streams with frees no fence covers yet; they may be done already */
            vmm_fences_record(a);
            vmm_fences_poll(a);
            vmm_events_process(a);
            got = vmm_seg_reclaim(a, SIZE_MAX);
        } else if (attempt == 3) {
            /* a free block that fits, turned down by lifetime_split (pool.c, "Lifetimes"), before
             * running out or waiting: placement gives way to memory */
            if (pool == VMM_LARGE && !a->cur_mp && (*out = vmm_pool_fit_any(a, sr, pool, size)) != NULL)
                return VMM_OK;
            /* last resort: wait for the events guarding the memory we need; never while a
             * capture is underway (capture.c): it fails clearly instead */
            if (vmm_capture_no_sync(a, sr->stream)) {
                if (off < tried_len)
                    vmm_capture_oom_note(a, sr->stream, tried + off, tried_len - off);
                return rc;
            }
            size_t waits = vmm_events_wait_all(a);
            vmm_fences_record(a);
            waits += vmm_fences_wait(a);
            got = vmm_seg_reclaim(a, SIZE_MAX);
            if (off < tried_len)
                off += (size_t)snprintf(tried + off, tried_len - off, ", waiting on %zu event(s)",
                                        waits);
            if (waits)
                got++;
        } else {
            got = 0;
        }
        if (!got && attempt >= 3)
            break;
    }
    if (off < tried_len)
        snprintf(tried + off, tried_len - off, ", unmapping every idle page");
    return rc;
}

static int malloc_classic(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size,
                          vmm_block **out, char *tried, size_t tried_len)
{
    int rc = vmm_seg_classic_alloc(a, sr, pool, size, out);
    if (rc != VMM_ENOMEM)
        return rc;
    a->stats.num_alloc_retries++;
    /* what other threads' caches hold back may make a cached segment whole again */
    vmm_tc_drain(a, 0);
    /* cuMemFree synchronizes the device: nothing more while a capture is underway (capture.c) */
    if (vmm_capture_no_sync(a, sr->stream)) {
        size_t off = strlen(tried);
        vmm_capture_oom_note(a, sr->stream, tried + off, tried_len - off);
        return rc;
    }
    /* PyTorch's order: free cached oversize segments, then sync everything and free all cached */
    if (a->cfg.max_split_size != SIZE_MAX &&
        vmm_seg_classic_release(a, a->cfg.max_split_size, vmm_classic_segment_size(size), 0)) {
        rc = vmm_seg_classic_alloc(a, sr, pool, size, out);
        if (rc != VMM_ENOMEM)
            return rc;
    }
    a->stats.num_sync_all_streams++;
    vmm_events_wait_all(a);
    size_t freed = vmm_seg_classic_release(a, 0, SIZE_MAX, 0);
    snprintf(tried, tried_len, "freeing every cached segment (%zu bytes) after waiting on pending frees",
             freed);
    return vmm_seg_classic_alloc(a, sr, pool, size, out);
}

/* malloc_locked's answer when memory is short while detached pages wait for their before_unmap
 * (callbacks.c): vmm_malloc delivers, then tries again. */
enum { MALLOC_RETRY_DELIVER = 1 };

/* No cached block fits: garbage collection, growth / remapping (or a classic segment), OOM. Kept
 * out of line so the cached path stays short. lane: the tagged lane (sleep.c), NULL for the
 * stream's own record. last: report OOM rather than ask for MALLOC_RETRY_DELIVER. */
static __attribute__((noinline)) int malloc_slow(vmm_allocator *a, size_t size, size_t rounded,
                                                 int pool, vmm_stream stream, vmm_stream_rec *lane,
                                                 vmm_block **out, int last)
{
    vmm_stream_rec *sr = lane ? lane : vmm_stream_rec_get(a, stream);
    if (!sr)
        return vmm_fail(VMM_EHOSTMEM, "vmm_malloc: out of host memory for a stream record");
    int rc;
    char tried[512] = "cached blocks of this stream, completed deferred frees";
    /* classic garbage collection frees segments (cuMemFree synchronizes): not while capturing */
    if (a->cfg.expandable_segments || !vmm_capture_no_sync(a, stream))
        collect_garbage(a);
    if (rounded > a->cap) {
        rc = VMM_ENOMEM;
        snprintf(tried, sizeof tried, "nothing (the request exceeds the allowed memory)");
    } else if (a->cfg.expandable_segments || sr->tag) {
        /* tagged memory is always in VMM segments, classic mode too: it must be able to sleep */
        rc = malloc_expandable(a, sr, pool, rounded, out, tried, sizeof tried);
    } else {
        rc = malloc_classic(a, sr, pool, rounded, out, tried, sizeof tried);
    }
    if (rc == VMM_ENOMEM && !last && a->cb && vmm_cb_pending(a))
        return MALLOC_RETRY_DELIVER;
    if (rc == VMM_ENOMEM)
        return oom(a, size, rounded, tried);
    return rc;
}

static int malloc_locked(vmm_allocator *a, size_t size, vmm_stream stream, void **ptr, int last)
{
    a->malloc_count++;
    int callbacks_run = 0, own_cache_drained = 0, slept_meanwhile = 0;
again:;
    /* captures underway (mempool.c): the stream's allocations may go to a private pool */
    vmm_mempool *mp = NULL;
    if (VMM_UNLIKELY(a->n_routes != 0))
        mp = vmm_mempool_route(a, stream);
    /* deferred frees are polled only while there are some: no driver call otherwise; and not while
     * captures are underway (PyTorch's process_events is skipped then too) */
    if (VMM_UNLIKELY(a->deferred != NULL) && !a->n_routes) {
        int m = vmm_capture_relax(a);
        vmm_events_process(a);
        vmm_capture_restore(a, m);
    }
    /* tagged allocations, or untagged ones while untagged memory sleeps, go through their lane */
    vmm_stream key = stream;
    vmm_stream_rec *lane = NULL;
    if (VMM_UNLIKELY(a->tag_path)) {
        int lrc = vmm_lane_get(a, stream, a->cur_tag, &lane);
        if (lrc)
            return lrc;
        key = lane->key;
    }
    /* a cached block implies its stream's record exists (its lane's index); the slow path makes one */
    vmm_block *b;
    size_t rounded;
    int pool;
    vmm_stream_rec *sr = lane ? lane : mp ? NULL : vmm_stream_rec_find(a, stream);
    int rc = vmm_pool_malloc_cached(a, mp, sr, size, key, &b, &rounded, &pool);
    if (VMM_UNLIKELY(!b)) {
        if (rc)
            return rc;
        /* before new memory, what this thread's cache holds back: one cached block that fits
         * (the least disturbance), else the older half of every bin, else all of it (they may
         * merge into a fit, or free pages a remap can move) */
        while (own_cache_drained < 3) {
            size_t got = own_cache_drained == 0   ? vmm_tc_give_fit(a, rounded, key)
                         : own_cache_drained == 1 ? vmm_tc_trim_self(a, SIZE_MAX)
                                                  : vmm_tc_drain(a, 1);
            own_cache_drained++;
            if (got)
                goto again;
        }
        /* PyTorch's step 2: free-memory callbacks (outside the lock), then the cache again */
        if (VMM_UNLIKELY(a->cb_free_n) && !callbacks_run) {
            callbacks_run = 1;
            if (vmm_cb_run_free(a))
                goto again;
        }
        /* segments made now belong to mp; driver calls in relaxed capture mode (capture.c) */
        a->cur_mp = mp;
        int m = vmm_capture_relax(a);
        int tag_path = a->tag_path;
        rc = malloc_slow(a, size, rounded, pool, stream, lane, &b, last);
        vmm_capture_restore(a, m);
        a->cur_mp = NULL;
        /* untagged memory put to sleep while a growth created handles with the lock released
         * (segment.c): the growth gave up; once more, as a malloc after the sleep (which
         * vmm_lane_get refuses with its own message) */
        if (rc && a->tag_path != tag_path && !slept_meanwhile++)
            goto again;
        if (rc)
            return rc;
        rc = vmm_pool_take(a, &b, rounded, size, 0);
        if (rc)
            return rc;
    }
    if (VMM_UNLIKELY(mp != NULL))
        mp->n_mallocs++;
    *ptr = (void *)b->addr;
    VMM_HISTORY(a, VMM_TRACE_ALLOC, b->addr, b->size, stream);
    return VMM_OK;
}

VMM_API int vmm_malloc(vmm_allocator *a, size_t size, vmm_stream stream, void **ptr)
{
    if (!a || !ptr)
        return vmm_fail(VMM_EINVAL, "vmm_malloc: %s is NULL", a ? "ptr" : "allocator");
    *ptr = NULL;
    if (size == 0)
        return VMM_OK;
    if (size >= ((size_t)1 << MAX_REQUEST_SHIFT))
        return vmm_fail(VMM_EINVAL, "vmm_malloc: size %zu is too large", size);
    /* this thread's cache: no lock another thread needs (tcache.c) */
    if (vmm_tc_malloc(a, size, stream, ptr))
        return VMM_OK;
    /* missed: the stream's lane, whose lock other streams' threads do not need (lane.c) */
    if (VMM_UNLIKELY(vmm_lanes_on(a)) && vmm_lane_malloc(a, size, stream, ptr))
        return VMM_OK;
    VMM_HISTORY_CONTEXT_BEGIN(a); /* Python frames for the history, gathered before the lock */
    vmm_lock(a);
    vmm_lanes_update(a); /* a second thread mallocs: lanes from now on (or never again) */
    vmm_tc_fold_self(a); /* counters exact before this malloc moves them (peaks) */
    int rc = malloc_locked(a, size, stream, ptr, 0);
    if (VMM_UNLIKELY(a->cb != NULL)) {
        /* callbacks: deliver what this call queued; when memory was short while detached pages
         * waited for their before_unmap, deliver (they are unmapped then) and try again */
        for (int i = 0; rc == MALLOC_RETRY_DELIVER; i++) {
            vmm_unlock_deliver_wait(a);
            vmm_lock(a);
            rc = malloc_locked(a, size, stream, ptr, i > 0);
        }
        vmm_unlock_deliver(a);
    } else {
        vmm_unlock(a);
    }
    VMM_HISTORY_CONTEXT_END();
    return rc;
}

/* ---- free / record_stream ----------------------------------------------------------------- */

static vmm_block *find_live(vmm_allocator *a, const void *ptr, const char *fn)
{
    vmm_block *b = vmm_live_find(a, (uintptr_t)ptr);
    if (!b)
        vmm_fail(VMM_EBADPTR, "%s: %p was not returned by vmm_malloc of this allocator, is an "
                              "interior pointer, or was already freed", fn, ptr);
    return b;
}

VMM_API int vmm_free(vmm_allocator *a, void *ptr)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_free: allocator is NULL");
    if (!ptr)
        return VMM_OK;
    size_t trim = 0;
    if (vmm_tc_free(a, ptr, &trim))
        return VMM_OK;
    /* not for the cache (or its bin was full: the bin's trim too): on the block's lane (lane.c) */
    if (VMM_UNLIKELY(vmm_lanes_on(a)) && vmm_lane_free(a, ptr, trim))
        return VMM_OK;
    vmm_lock(a);
    vmm_lanes_update(a); /* a second thread frees (a consumer): lanes, as for a malloc */
    vmm_tc_fold_self(a);
    if (trim)
        vmm_tc_trim_self(a, trim); /* the cache was full: room for the frees to come */
    int rc = VMM_OK;
    size_t slot = 0;
    vmm_block *b = vmm_live_find_slot(a, (uintptr_t)ptr, &slot);
    if (VMM_UNLIKELY(!b)) {
        rc = vmm_fail(VMM_EBADPTR, "vmm_free: %p was not returned by vmm_malloc of this allocator, is "
                                   "an interior pointer, or was already freed", ptr);
    } else if (VMM_UNLIKELY(b->seg->asleep)) {
        vmm_sleep_free(a, b, slot); /* nothing mapped, nothing to wait for */
    } else if (VMM_UNLIKELY(a->ipc != NULL) && (rc = vmm_ipc_hold(a, b)) != 0) {
        if (rc > 0)
            rc = VMM_OK; /* shared and still open in another process: freed when they let go */
    } else if (VMM_UNLIKELY(b->seg->pool == VMM_SMALL &&
                            !vmm_tc_take_live(a, (uintptr_t)ptr, b, vmm_live_owner_at(a, slot)))) {
        /* a thread cache took it since the lookup: another thread freed it at the same moment */
        rc = vmm_fail(VMM_EBADPTR, "vmm_free: %p was already freed", ptr);
    } else {
        vmm_stream_rec *sr = b->seg->srec;
        int pool = b->seg->pool;
        /* the slot found above, before anything lets the lanes go: their inserts and removals
         * move the entries of a shard (small-pool blocks: taken above, under the lock of the
         * cache their slot names) */
        if (pool != VMM_SMALL)
            vmm_live_remove_at(a, slot);
        /* used by other streams: record the events prepared by record_stream and wait for them
         * on the deferred list. Cannot fail: what cannot be recorded now is retried later, so a
         * caller that cannot retry (PyTorch's free hook) never leaks the block. */
        if (VMM_UNLIKELY(b->n_uses))
            vmm_defer_free(a, b);
        VMM_HISTORY(a, VMM_TRACE_FREE_REQUESTED, b->addr, b->size, b->seg->stream);
        if (VMM_UNLIKELY(b->group != NULL))
            a->hooks.group_drop(a, b);
        /* stamp with the own stream's sequence: a fence recorded later proves it idle */
        b->free_seq = ++sr->seq;
        vmm_count_free(a, &a->stats, b);
        if (VMM_LIKELY(b->state == VMM_BLOCK_ALLOCATED)) {
            b->requested = 0;
            vmm_pool_release(a, b);
        } else {
            /* deferred: still active, counted as pending (see vmm_hot_up) */
            vmm_stat_add(&a->pending[pool], 1);
            vmm_stat_add(&a->pending_bytes[pool], (int64_t)b->size);
        }
    }
    vmm_unlock(a);
    return rc;
}

static int stream_retired(const vmm_allocator *a, vmm_stream s)
{
    for (const vmm_stream_rec *r = a->streams; r; r = r->next)
        if (r->stream == s)
            return r->retired;
    return 0;
}

/* Room for one more use slot in b (uses and events grow together); VMM_OK or VMM_EHOSTMEM with
 * nothing changed but, at the first call, an empty side record. */
static int reserve_use_slot(vmm_allocator *a, vmm_block *b)
{
    if (!b->ext) {
        /* first record_stream of this record: its side record, kept until it is deleted */
        b->ext = vmm_meta_alloc(a->meta, sizeof *b->ext);
        if (!b->ext)
            return vmm_fail(VMM_EHOSTMEM, "vmm_record_stream: out of host memory");
    }
    vmm_block_ext *x = b->ext;
    if (b->n_uses < x->cap_uses)
        return VMM_OK;
    uint32_t ncap = x->cap_uses ? x->cap_uses * 2 : 2;
    vmm_stream *nu = vmm_meta_alloc(a->meta, ncap * sizeof *nu);
    vmm_event *ne = vmm_meta_alloc(a->meta, ncap * sizeof *ne);
    if (!nu || !ne) {
        if (nu)
            vmm_meta_free(a->meta, nu, ncap * sizeof *nu);
        if (ne)
            vmm_meta_free(a->meta, ne, ncap * sizeof *ne);
        return vmm_fail(VMM_EHOSTMEM, "vmm_record_stream: out of host memory");
    }
    for (uint32_t k = 0; k < b->n_uses; k++) {
        nu[k] = x->uses[k];
        ne[k] = x->events[k];
    }
    if (x->uses)
        vmm_meta_free(a->meta, x->uses, x->cap_uses * sizeof *nu);
    if (x->events)
        vmm_meta_free(a->meta, x->events, x->cap_events * sizeof *ne);
    x->uses = nu;
    x->events = ne;
    x->cap_uses = x->cap_events = ncap;
    return VMM_OK;
}

VMM_API int vmm_record_stream(vmm_allocator *a, void *ptr, vmm_stream stream)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_record_stream: allocator is NULL");
    vmm_lock(a);
    int rc = VMM_OK;
    vmm_block *b = find_live(a, ptr, "vmm_record_stream");
    if (!b) {
        rc = VMM_EBADPTR;
    } else if (stream_retired(a, stream)) {
        /* no event could ever be recorded on it: the block would become unfreeable */
        rc = vmm_fail(VMM_EINVAL, "vmm_record_stream: stream %p was destroyed", stream);
    } else if (stream != b->seg->stream) {
        uint32_t i = 0;
        while (i < b->n_uses && b->ext->uses[i] != stream)
            i++;
        if (i == b->n_uses) {
            rc = reserve_use_slot(a, b);
            if (rc == VMM_OK) {
                b->ext->uses[i] = stream;
                b->ext->events[i] = NULL;
                if (b->n_uses++ == 0)
                    vmm_live_tc_forbid(a, b); /* its free must record events: no thread cache */
            }
        }
        /* Everything the free needs, now: an event made recordable on `stream` (which may belong
         * to another device's context). Without one the use is recorded all the same (the caller
         * cannot handle an error either) and the free tries again. */
        if (rc == VMM_OK && !b->ext->events[i])
            b->ext->events[i] = vmm_event_for_use(a, stream);
        /* a use by captured work runs only in replays: remembered, so that the free drops it once
         * the capture has ended instead of waiting for it (capture.c) */
        uint64_t cid = 0;
        if (rc == VMM_OK && vmm_capture_stream(a, stream, &cid))
            (void)vmm_capture_use_add(a, b, stream, cid); /* if not remembered, it is waited for */
        else if (rc == VMM_OK && VMM_UNLIKELY(a->capture != NULL))
            vmm_capture_use_eager(a, b, stream);
    }
    vmm_unlock(a);
    return rc;
}

/* ---- cache control ------------------------------------------------------------------------ */

VMM_API int vmm_empty_cache(vmm_allocator *a)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_empty_cache: allocator is NULL");
    vmm_lock(a);
    vmm_clear_error();
    vmm_tc_drain(a, 0); /* what threads' caches hold back is cache too */
    int mode = vmm_capture_relax(a); /* no driver call may invalidate a capture (capture.c) */
    vmm_events_process(a);
    vmm_mempool_settle(a); /* released private pools: their memory joins what is returned below */
    if (a->cfg.expandable_segments || a->mixed_lanes) {
        /* no waiting: fence what is unfenced, take what is already proven idle */
        vmm_fences_poll(a);
        vmm_fences_record(a);
        vmm_fences_poll(a);
        vmm_seg_reclaim(a, SIZE_MAX);
        if (VMM_UNLIKELY(a->cb != NULL))
            vmm_cb_flush(a, 0); /* pages detached for before_unmap come back as cached handles */
        vmm_handles_release(a, 0, SIZE_MAX);
        vmm_seg_free_empty(a);
    }
    /* cuMemFree synchronizes the device: not while captures are underway (capture.c) */
    if (!a->cfg.expandable_segments && !a->n_routes)
        vmm_seg_classic_release(a, 0, SIZE_MAX, 0);
    vmm_capture_restore(a, mode);
    int rc = vmm_last_error()[0] ? VMM_EDRIVER : VMM_OK;
    if (VMM_UNLIKELY(a->cb != NULL))
        vmm_unlock_deliver(a);
    else
        vmm_unlock(a);
    return rc;
}

VMM_API size_t vmm_usable_size(vmm_allocator *a, const void *ptr)
{
    if (!a || !ptr)
        return 0;
    vmm_lock(a);
    vmm_block *b = vmm_live_find(a, (uintptr_t)ptr);
    size_t n = b ? b->size : 0;
    vmm_unlock(a);
    return n;
}

VMM_API int vmm_config_string(vmm_allocator *a, char *buf, size_t len)
{
    if (!a || !buf)
        return vmm_fail(VMM_EINVAL, "vmm_config_string: NULL argument");
    return vmm_config_format(&a->cfg, buf, len);
}
