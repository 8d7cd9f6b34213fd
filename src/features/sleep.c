/*
 * Tags, lanes, sleep and wake.
 *
 * Tags. Every allocation carries the allocator's current tag (vmm_set_tag). A tag other than the
 * untagged one ("", tag 0) has lanes of its own: one stream record per (stream, tag) whose key
 * ((uintptr_t)record | 1, never a stream pointer) is the first key of its segments' blocks in the
 * free indexes (segment.key), so blocks of different tags never share a segment, hence never a
 * page, and best fit never hands one tag's cached block to another. Tagged lanes always use VMM
 * segments (alloc.c), classic mode too.
 *
 * Sleep of a set of tags, under the allocator's lock except where noted:
 *  1. wait for the work that may still touch their blocks: pending frees (their events), then one
 *     event on each of their lanes' streams and on each stream vmm_record_stream named for a live
 *     block (counted in num_event_waits); nothing else is synchronized;
 *  2. copy the live blocks' bytes to one page-locked host buffer per tag (mode BACKUP), on the
 *     default stream, and wait for the copies;
 *  3. freeze their segments (asleep = 1): FREE blocks leave the free index, so no reclaim, growth or
 *     best fit touches them, and frees of their blocks take vmm_sleep_free's path; the tags refuse
 *     allocations from now on;
 *  4. queue before_unmap for their mapped pages and deliver it (the lock released meanwhile);
 *  5. unmap and release every mapped page of those segments (asleep = 2), turn the whole pages
 *     under free blocks into UNMAPPED blocks, release every cached handle.
 * Wake maps the pages under their blocks back (vmm_seg_map_pages: cached handles first, access for
 * the device and its peers), undoes everything when one run cannot be mapped, restores the backups,
 * and puts the free blocks back in the index.
 *
 * Sleep and wake calls are serialized by op_mu (taken before the allocator's lock), because step 4
 * releases the lock in the middle of a sleep.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "core/alias.h"
#include "core/callbacks.h"
#include "core/counters.h"
#include "core/events.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/segment.h"
#include "core/tcache.h"
#include "core/trace.h"
#include "core/types.h"
#include "driver/driver.h"
#include "features/ipc.h"
#include "features/mempool.h"
#include "features/sleep.h"

typedef struct backup_entry {
    uintptr_t addr;   /* live block start */
    size_t size;      /* its size; 0 once the block was freed while asleep */
    size_t off;       /* where its bytes are in the tag's host buffer */
} backup_entry;

typedef struct sleep_tag {
    char name[VMM_TAG_NAME_MAX + 1];
    int asleep;
    int mode;
    size_t sleeping;              /* bytes of its live blocks asleep */
    backup_entry *ent;            /* sorted by addr */
    size_t n_ent;
    void *host;                   /* page-locked buffer with the contents (BACKUP) */
    size_t host_size;
} sleep_tag;

struct vmm_sleep {
    pthread_mutex_t op_mu;
    vmm_stream_rec *last_lane;    /* the lane vmm_lane_get found last (records live until destroy) */
    int n_tags;
    sleep_tag tags[VMM_MAX_TAGS];
};

typedef struct vmm_sleep vmm_sleep_state;

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* The state, made on first use (caller holds the lock). */
static vmm_sleep_state *state(vmm_allocator *a)
{
    if (a->sleep)
        return a->sleep;
    vmm_sleep_state *S = vmm_meta_alloc(a->meta, sizeof *S);
    if (!S)
        return NULL;
    if (pthread_mutex_init(&S->op_mu, NULL)) {
        vmm_meta_free(a->meta, S, sizeof *S);
        return NULL;
    }
    S->n_tags = 1; /* tag 0: "" */
    vmm_tc_off(a); /* frozen segments, lanes: every malloc and free under the lock */
    a->sleep = S;
    return S;
}

static void update_tag_path(vmm_allocator *a)
{
    a->tag_path = a->cur_tag != 0 || (a->sleep && a->sleep->tags[0].asleep);
}

static int tag_find(const vmm_sleep_state *S, const char *name)
{
    if (!name)
        name = "";
    for (int i = 0; S && i < S->n_tags; i++)
        if (strcmp(S->tags[i].name, name) == 0)
            return i;
    return -1;
}

static const char *tag_name(const vmm_allocator *a, int t)
{
    return t == 0 ? "(untagged)" : a->sleep->tags[t].name;
}

/* ---- lanes ---------------------------------------------------------------------------------- */

int vmm_lane_get(vmm_allocator *a, vmm_stream s, int tag, vmm_stream_rec **out)
{
    vmm_sleep_state *S = a->sleep;
    if (S && S->tags[tag].asleep)
        return vmm_fail(VMM_EINVAL, "vmm_malloc: tag \"%s\" is asleep: vmm_wake it before allocating "
                                    "under it", S->tags[tag].name);
    if (tag == 0) {
        *out = vmm_stream_rec_get(a, s);
        return *out ? VMM_OK : vmm_fail(VMM_EHOSTMEM, "vmm_malloc: out of host memory for a stream record");
    }
    vmm_stream_rec *last = S->last_lane;
    if (last && last->stream == s && last->tag == tag) {
        *out = last;
        return VMM_OK;
    }
    int retired = 0;
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        if (r->stream == s && r->tag == tag) {
            *out = S->last_lane = r;
            return VMM_OK;
        }
        if (r->stream == s)
            retired |= r->retired;
    }
    if (!a->dev.vmm_supported)
        return vmm_fail(VMM_ENOTSUP, "vmm_malloc: tagged memory needs virtual memory management, which "
                                     "device %d lacks", a->dev.ordinal);
    vmm_stream_rec *r = vmm_meta_alloc(a->meta, sizeof *r);
    if (!r)
        return vmm_fail(VMM_EHOSTMEM, "vmm_malloc: out of host memory for a lane record");
    r->stream = s;
    r->tag = tag;
    r->key = (vmm_stream)((uintptr_t)r | 1);
    r->retired = retired;
    vmm_stream_rec_link(a, r);
    if (!a->cfg.expandable_segments)
        a->mixed_lanes = 1;
    *out = S->last_lane = r;
    return VMM_OK;
}

/* ---- public tag calls ------------------------------------------------------------------------- */

VMM_API int vmm_set_tag(vmm_allocator *a, const char *tag)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_set_tag: allocator is NULL");
    if (!tag)
        tag = "";
    if (strlen(tag) > VMM_TAG_NAME_MAX)
        return vmm_fail(VMM_EINVAL, "vmm_set_tag: tag \"%.20s...\" is longer than %d bytes", tag,
                        VMM_TAG_NAME_MAX);
    vmm_lock(a);
    int rc = VMM_OK;
    vmm_sleep_state *S = state(a);
    int t = S ? tag_find(S, tag) : -1;
    if (!S) {
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_set_tag: out of host memory");
    } else if (t < 0 && S->n_tags == VMM_MAX_TAGS) {
        rc = vmm_fail(VMM_ERANGE, "vmm_set_tag: %d tags exist already", VMM_MAX_TAGS);
    } else if (t != 0 && !a->dev.vmm_supported) {
        rc = vmm_fail(VMM_ENOTSUP, "vmm_set_tag: tagged memory needs virtual memory management, which "
                                   "device %d lacks", a->dev.ordinal);
    } else {
        if (t < 0) {
            t = S->n_tags++;
            memset(&S->tags[t], 0, sizeof S->tags[t]);
            snprintf(S->tags[t].name, sizeof S->tags[t].name, "%s", tag);
        }
        a->cur_tag = t;
        update_tag_path(a);
    }
    vmm_unlock(a);
    return rc;
}

static int copy_name(const char *name, char *buf, size_t len)
{
    size_t n = strlen(name);
    if (!buf || len == 0)
        return vmm_fail(VMM_EINVAL, "NULL or empty buffer");
    snprintf(buf, len, "%s", name);
    if (n >= len)
        return vmm_fail(VMM_ERANGE, "buffer of %zu bytes too small for the tag (%zu)", len, n + 1);
    return (int)n;
}

VMM_API int vmm_get_tag(vmm_allocator *a, char *buf, size_t len)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_get_tag: allocator is NULL");
    vmm_lock(a);
    char name[VMM_TAG_NAME_MAX + 1];
    snprintf(name, sizeof name, "%s", a->sleep ? a->sleep->tags[a->cur_tag].name : "");
    vmm_unlock(a);
    return copy_name(name, buf, len);
}

VMM_API int vmm_tag_of(vmm_allocator *a, const void *ptr, char *buf, size_t len)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_tag_of: allocator is NULL");
    vmm_lock(a);
    vmm_block *b = vmm_live_find(a, (uintptr_t)ptr);
    char name[VMM_TAG_NAME_MAX + 1] = "";
    if (b && a->sleep)
        snprintf(name, sizeof name, "%s", a->sleep->tags[b->seg->srec->tag].name);
    vmm_unlock(a);
    if (!b)
        return vmm_fail(VMM_EBADPTR, "vmm_tag_of: %p is not a live block of this allocator", ptr);
    return copy_name(name, buf, len);
}

VMM_API int vmm_is_asleep(vmm_allocator *a, const char *tag)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_is_asleep: allocator is NULL");
    vmm_lock(a);
    int t = tag_find(a->sleep, tag);
    int rc = t < 0 ? (a->sleep || (tag && *tag) ? vmm_fail(VMM_EINVAL, "vmm_is_asleep: unknown tag \"%s\"", tag)
                                                : 0)
                   : a->sleep->tags[t].asleep;
    vmm_unlock(a);
    return rc;
}

/* ---- helpers ---------------------------------------------------------------------------------- */

/* Tags named (all when n is 0) as a mask, those with asleep == want only. VMM_EINVAL for an
 * unknown name. */
static int tag_mask(vmm_allocator *a, const char *const *tags, size_t n, int want, uint64_t *mask,
                    const char *fn)
{
    vmm_sleep_state *S = a->sleep;
    *mask = 0;
    if (!tags || n == 0) {
        for (int t = 0; t < S->n_tags; t++)
            if (S->tags[t].asleep == want)
                *mask |= (uint64_t)1 << t;
        return VMM_OK;
    }
    for (size_t i = 0; i < n; i++) {
        int t = tag_find(S, tags[i]);
        if (t < 0)
            return vmm_fail(VMM_EINVAL, "%s: unknown tag \"%s\"", fn, tags[i] ? tags[i] : "");
        if (S->tags[t].asleep == want)
            *mask |= (uint64_t)1 << t;
    }
    return VMM_OK;
}

/* A segment that sleeps with the tags of mask: a VMM segment of the default pools. */
static int seg_of(const vmm_segment *s, uint64_t mask)
{
    return s->expandable && !s->mp && (mask >> s->srec->tag & 1);
}

static int block_live(const vmm_block *b)
{
    return b->state == VMM_BLOCK_ALLOCATED || b->state == VMM_BLOCK_PENDING;
}

/* A block of an untagged classic segment waits for its free to complete. */
static int classic_pending(const vmm_allocator *a)
{
    for (const vmm_segment *s = a->segs; s; s = s->next)
        for (const vmm_block *b = s->expandable ? NULL : s->first; b; b = b->next)
            if (b->state == VMM_BLOCK_PENDING)
                return 1;
    return 0;
}

static backup_entry *entry_find(sleep_tag *T, uintptr_t addr)
{
    size_t lo = 0, hi = T->n_ent;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (T->ent[mid].addr < addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < T->n_ent && T->ent[lo].addr == addr ? &T->ent[lo] : NULL;
}

static int entry_cmp(const void *x, const void *y)
{
    const backup_entry *p = x, *q = y;
    return p->addr < q->addr ? -1 : p->addr > q->addr;
}

/* Give T's host buffer back. When the driver refuses, the buffer stays T's (counted in
 * backup_bytes, as a kept buffer): the next drop, sleep or vmm_destroy tries again, so it is never
 * forgotten alive. Returns the driver's result. */
static int host_release(vmm_allocator *a, sleep_tag *T)
{
    int r = a->drv->ops->host_free(a->drv, T->host);
    if (r != VMM_DRV_SUCCESS)
        return r;
    a->stats.backup_bytes -= (int64_t)T->host_size;
    T->host = NULL;
    T->host_size = 0;
    return r;
}

/* Drop tag T's backup (host buffer kept when keep, or when it cannot be freed now). */
static void backup_drop(vmm_allocator *a, sleep_tag *T, int keep)
{
    if (T->ent)
        vmm_meta_free(a->meta, T->ent, T->n_ent * sizeof *T->ent);
    T->ent = NULL;
    T->n_ent = 0;
    if (T->host && !keep)
        (void)host_release(a, T);
}

/* Wait on one event recorded on stream s now; falls back to synchronizing s. Counted. */
static int wait_stream(vmm_allocator *a, vmm_stream s)
{
    const vmm_driver_ops *ops = a->drv->ops;
    a->stats.num_event_waits++;
    vmm_event e = vmm_event_for_use(a, s);
    int r = VMM_DRV_UNKNOWN;
    if (e) {
        r = ops->event_record(a->drv, e, s);
        if (r == VMM_DRV_SUCCESS)
            r = ops->event_sync(a->drv, e);
        vmm_event_put(a, e);
    }
    if (r != VMM_DRV_SUCCESS)
        r = ops->stream_sync(a->drv, s);
    return r == VMM_DRV_SUCCESS ? VMM_OK : vmm_fail_drv(r, "vmm_sleep: waiting for a stream");
}

static int stream_add(vmm_stream **v, size_t *n, size_t *cap, vmm_stream s, vmm_meta *m)
{
    for (size_t i = 0; i < *n; i++)
        if ((*v)[i] == s)
            return VMM_OK;
    if (*n == *cap) {
        size_t ncap = *cap ? 2 * *cap : 16;
        vmm_stream *x = vmm_meta_alloc(m, ncap * sizeof *x);
        if (!x)
            return vmm_fail(VMM_EHOSTMEM, "vmm_sleep: out of host memory");
        if (*n)
            memcpy(x, *v, *n * sizeof *x);
        if (*v)
            vmm_meta_free(m, *v, *cap * sizeof *x);
        *v = x;
        *cap = ncap;
    }
    (*v)[(*n)++] = s;
    return VMM_OK;
}

/* Step 1 of sleep: the work that may still use the tags' memory. */
static int wait_work(vmm_allocator *a, uint64_t mask)
{
    vmm_stream *v = NULL;
    size_t n = 0, cap = 0;
    int rc = VMM_OK;
    for (vmm_stream_rec *r = a->streams; r && !rc; r = r->next)
        if ((mask >> r->tag & 1) && !r->retired)
            rc = stream_add(&v, &n, &cap, r->stream, a->meta);
    for (vmm_segment *s = a->segs; s && !rc; s = s->next) {
        if (!seg_of(s, mask))
            continue;
        for (vmm_block *b = s->first; b && !rc; b = b->next)
            for (uint32_t i = 0; block_live(b) && i < b->n_uses && !rc; i++)
                rc = stream_add(&v, &n, &cap, b->ext->uses[i], a->meta);
    }
    for (size_t i = 0; i < n && !rc; i++)
        rc = wait_stream(a, v[i]);
    if (v)
        vmm_meta_free(a->meta, v, cap * sizeof *v);
    if (rc)
        return rc;
    /* pending frees of these segments: their streams have run what was queued, the scan sees it */
    vmm_events_process(a);
    for (vmm_block *b = a->deferred; b; b = b->dnext)
        if (seg_of(b->seg, mask)) {
            vmm_events_wait_all(a);
            break;
        }
    for (vmm_block *b = a->deferred; b; b = b->dnext)
        if (seg_of(b->seg, mask))
            return vmm_fail(VMM_EDRIVER, "vmm_sleep: a pending free at 0x%llx could not be completed",
                            (unsigned long long)b->addr);
    return VMM_OK;
}

/* Wait for the default stream's work (the backup copies). */
static int wait_copies(vmm_allocator *a) { return wait_stream(a, NULL); }

/* Step 2 of sleep for tag t: host buffer and copies. VMM_OK, or an error with nothing kept. */
static int backup_tag(vmm_allocator *a, int t, uint64_t bit)
{
    sleep_tag *T = &a->sleep->tags[t];
    const vmm_driver_ops *ops = a->drv->ops;
    size_t n = 0, total = 0;
    for (vmm_segment *s = a->segs; s; s = s->next)
        if (seg_of(s, bit))
            for (vmm_block *b = s->first; b; b = b->next)
                if (b->state == VMM_BLOCK_ALLOCATED) {
                    n++;
                    total += b->size;
                }
    if (!n)
        return VMM_OK;
    backup_entry *ent = vmm_meta_alloc(a->meta, n * sizeof *ent);
    if (!ent)
        return vmm_fail(VMM_EHOSTMEM, "vmm_sleep: out of host memory for the backup list");
    size_t i = 0, off = 0;
    for (vmm_segment *s = a->segs; s; s = s->next)
        if (seg_of(s, bit))
            for (vmm_block *b = s->first; b; b = b->next)
                if (b->state == VMM_BLOCK_ALLOCATED) {
                    ent[i++] = (backup_entry){b->addr, b->size, off};
                    off += b->size;
                }
    qsort(ent, n, sizeof *ent, entry_cmp);
    int fresh = 0;
    if (!T->host || T->host_size < total) {
        if (T->host) { /* a kept buffer too small: a new one */
            int r = host_release(a, T);
            if (r) { /* still T's kept buffer: nothing changed */
                vmm_meta_free(a->meta, ent, n * sizeof *ent);
                return vmm_fail(vmm_status_from_drv(r), "vmm_sleep: freeing the kept backup buffer "
                                "of tag \"%s\" (too small now): %s", tag_name(a, t),
                                vmm_drv_result_name(r));
            }
        }
        int r = ops->host_alloc(a->drv, total, &T->host);
        if (r) {
            vmm_meta_free(a->meta, ent, n * sizeof *ent);
            T->host = NULL;
            return vmm_fail(r == VMM_DRV_OUT_OF_MEMORY ? VMM_EHOSTMEM : vmm_status_from_drv(r),
                            "vmm_sleep: cannot get %zu bytes of page-locked host memory for the backup "
                            "of tag \"%s\": %s", total, tag_name(a, t), vmm_drv_result_name(r));
        }
        T->host_size = total;
        a->stats.backup_bytes += (int64_t)total;
        fresh = 1;
    }
    int rc = VMM_OK;
    for (i = 0; i < n && !rc; i++) {
        int r = ops->memcpy_dtoh(a->drv, (char *)T->host + ent[i].off, ent[i].addr, ent[i].size, NULL);
        if (r)
            rc = vmm_fail_drv(r, "vmm_sleep: copying a block to host memory");
    }
    /* the copies queued must have run before the buffer goes, whatever failed */
    int wrc = wait_copies(a);
    if (!rc)
        rc = wrc;
    if (rc) {
        vmm_meta_free(a->meta, ent, n * sizeof *ent);
        if (fresh)
            (void)host_release(a, T); /* refused: kept for the next sleep or vmm_destroy */
        return rc;
    }
    T->ent = ent;
    T->n_ent = n;
    return VMM_OK;
}

/* Absorb FREE neighbours of FREE block b (a segment out of the index: plain list surgery). */
static vmm_block *merge_unindexed(vmm_allocator *a, vmm_block *b)
{
    vmm_block *n = b->next;
    if (n && n->state == VMM_BLOCK_FREE) {
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        vmm_block_delete(a, n);
    }
    vmm_block *p = b->prev;
    if (p && p->state == VMM_BLOCK_FREE) {
        p->size += b->size;
        p->next = b->next;
        if (b->next)
            b->next->prev = p;
        vmm_block_delete(a, b);
        b = p;
    }
    return b;
}

/* In an asleep segment: the whole unmapped pages under FREE block b become an UNMAPPED block
 * (indexed, merged), so the VA can be reused and wake maps only what blocks need. Left as it is
 * when records cannot be had or a page there is still mapped. Returns the last block of what b
 * became (a walk goes on at its next; merging may have deleted b's old neighbours). */
static vmm_block *normalize(vmm_allocator *a, vmm_block *b)
{
    vmm_segment *seg = b->seg;
    size_t ps = seg->page_size, off = b->addr - seg->base;
    size_t p0 = round_up(off, ps) / ps, p1 = (off + b->size) / ps;
    if (p0 >= p1)
        return b;
    for (size_t p = p0; p < p1; p++)
        if (seg->pages[p])
            return b;
    uintptr_t ua = seg->base + p0 * ps, ue = seg->base + p1 * ps;
    vmm_block *r1 = b->addr < ua ? vmm_block_new(a) : NULL;
    vmm_block *r2 = b->addr + b->size > ue ? vmm_block_new(a) : NULL;
    if ((b->addr < ua && !r1) || (b->addr + b->size > ue && !r2)) {
        if (r1)
            vmm_block_delete(a, r1);
        if (r2)
            vmm_block_delete(a, r2);
        return b;
    }
    vmm_block *u = b;
    if (r1) {
        vmm_block_split_into(b, r1, ua - b->addr);
        u = r1;
    }
    if (r2)
        vmm_block_split_into(u, r2, ue - u->addr);
    u->state = VMM_BLOCK_UNMAPPED;
    u = vmm_block_merge(a, u);
    vmm_pool_insert(a, u);
    return r2 ? r2 : u;
}

/* Segments of mask into an array (sleep / wake work on a snapshot of them). */
static int segs_of(vmm_allocator *a, uint64_t mask, int asleep, vmm_segment ***out, size_t *n)
{
    size_t k = 0;
    for (vmm_segment *s = a->segs; s; s = s->next)
        k += seg_of(s, mask) && s->asleep == asleep;
    *out = NULL;
    *n = 0;
    if (!k)
        return VMM_OK;
    vmm_segment **v = vmm_meta_alloc(a->meta, k * sizeof *v);
    if (!v)
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for the list of segments");
    k = 0;
    for (vmm_segment *s = a->segs; s; s = s->next)
        if (seg_of(s, mask) && s->asleep == asleep)
            v[k++] = s;
    *out = v;
    *n = k;
    return VMM_OK;
}

/* Page pg of seg lies under a DETACHING block (callbacks.c unmaps it itself). */
static int page_detaching(const vmm_segment *seg, size_t pg)
{
    uintptr_t va = seg->base + pg * seg->page_size;
    for (const vmm_block *b = seg->first; b; b = b->next)
        if (va >= b->addr && va < b->addr + b->size)
            return b->state == VMM_BLOCK_DETACHING;
    return 0;
}

/* Notices for every run of mapped, non-detaching pages of segs, into *list (freed on failure). */
static int announce(vmm_allocator *a, vmm_segment **segs, size_t n, int unmap, vmm_cb_notice **list)
{
    *list = NULL;
    for (size_t i = 0; i < n; i++) {
        vmm_segment *s = segs[i];
        for (size_t pg = 0; pg < s->n_pages;) {
            if (!s->pages[pg] || page_detaching(s, pg)) {
                pg++;
                continue;
            }
            size_t end = pg;
            while (end < s->n_pages && s->pages[end] && !page_detaching(s, end))
                end++;
            int rc = vmm_cb_list_add(a, list, s, pg, end - pg, unmap);
            if (rc) {
                vmm_cb_list_free(a, *list);
                *list = NULL;
                return rc;
            }
            pg = end;
        }
    }
    return VMM_OK;
}

/* ---- sleep -------------------------------------------------------------------------------------- */

VMM_API int vmm_sleep(vmm_allocator *a, const char *const *tags, size_t n_tags, int mode)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_sleep: allocator is NULL");
    if (mode != VMM_SLEEP_DISCARD && mode != VMM_SLEEP_BACKUP &&
        mode != (VMM_SLEEP_BACKUP | VMM_SLEEP_KEEP_HOST))
        return vmm_fail(VMM_EINVAL, "vmm_sleep: bad mode %d (DISCARD, BACKUP or BACKUP | KEEP_HOST)", mode);
    if (vmm_cb_delivering(a))
        return vmm_fail(VMM_EINVAL, "vmm_sleep: called from a mapping callback of this allocator");
    vmm_lock(a);
    vmm_sleep_state *S = state(a);
    vmm_unlock(a);
    if (!S)
        return vmm_fail(VMM_EHOSTMEM, "vmm_sleep: out of host memory");
    pthread_mutex_lock(&S->op_mu);
    vmm_lock(a);
    vmm_clear_error();
    const vmm_driver_ops *ops = a->drv->ops;
    uint64_t mask;
    vmm_segment **segs = NULL;
    size_t n_segs = 0;
    int rc = tag_mask(a, tags, n_tags, 0, &mask, "vmm_sleep");
    if (rc || !mask)
        goto out;
    if ((mode & VMM_SLEEP_BACKUP) && (!ops->memcpy_dtoh || !ops->memcpy_htod || !ops->host_alloc)) {
        rc = vmm_fail(VMM_ENOTSUP, "vmm_sleep: the %s driver cannot copy to host memory: use "
                                   "VMM_SLEEP_DISCARD", ops->name);
        goto out;
    }
    /* alias_pages (core/alias.c): a page mapped at two places of untagged memory cannot be put
     * to sleep view by view; views that hold nothing in use go first, and any left refuses */
    if ((mask & 1) && a->n_aliases && (vmm_alias_reclaim(a), a->n_aliases)) {
        rc = vmm_fail(VMM_EINVAL, "vmm_sleep: %zu page(s) of untagged memory are mapped at two places "
                                  "with blocks in use (alias_pages): free them first",
                      a->n_aliases);
        goto out;
    }
    /* Frees pending on other streams' events in classic segments: step 1 would wait for them
     * anyway, so they count as freed, whether or not some other call polled their events first. */
    if (mask & 1 && classic_pending(a)) {
        vmm_events_process(a);
        if (classic_pending(a))
            vmm_events_wait_all(a);
    }
    for (vmm_segment *s = a->segs; s; s = s->next) {
        if (!s->expandable && (mask & 1)) {
            for (vmm_block *b = s->first; b; b = b->next)
                if (b->state == VMM_BLOCK_PENDING) {
                    rc = vmm_fail(VMM_EDRIVER, "vmm_sleep: the pending free at 0x%llx (classic segment) "
                                               "could not be completed", (unsigned long long)b->addr);
                    goto out;
                } else if (block_live(b)) {
                    rc = vmm_fail(VMM_EINVAL, "vmm_sleep: untagged block at 0x%llx lives in a classic "
                                              "(cuMemAlloc) segment, which cannot release its memory and "
                                              "keep its address: tag it (vmm_set_tag) or use "
                                              "expandable_segments:true", (unsigned long long)b->addr);
                    goto out;
                }
        }
        if (seg_of(s, mask) && a->ipc && vmm_ipc_shared_in(a, s)) {
            rc = vmm_fail(VMM_EINVAL, "vmm_sleep: a block of tag \"%s\" is open in another process "
                                      "(vmm_ipc_get_handle): its pages live on there",
                          tag_name(a, s->srec->tag));
            goto out;
        }
    }
    /* 1. the work that still uses them */
    rc = wait_work(a, mask);
    /* 2. backups */
    uint64_t backed = 0;
    for (int t = 0; !rc && t < S->n_tags; t++) {
        if (!(mask >> t & 1) || !(mode & VMM_SLEEP_BACKUP))
            continue;
        rc = backup_tag(a, t, (uint64_t)1 << t);
        if (!rc)
            backed |= (uint64_t)1 << t;
    }
    if (!rc)
        rc = segs_of(a, mask, 0, &segs, &n_segs);
    /* before_unmap notices, made now: past this point nothing can fail */
    vmm_cb_notice *notes = NULL;
    if (!rc && a->cb_mapping)
        rc = announce(a, segs, n_segs, 1, &notes);
    if (rc) {
        for (int t = 0; t < S->n_tags; t++)
            if (backed >> t & 1)
                backup_drop(a, &S->tags[t], (mode & VMM_SLEEP_KEEP_HOST) != 0);
        goto out;
    }
    /* 3. freeze: out of the free index, tags refuse allocations */
    for (size_t i = 0; i < n_segs; i++) {
        for (vmm_block *b = segs[i]->first; b; b = b->next)
            if (b->state == VMM_BLOCK_FREE && b->in_index)
                vmm_pool_erase(a, b);
        segs[i]->asleep = 1;
    }
    for (int t = 0; t < S->n_tags; t++)
        if (mask >> t & 1) {
            S->tags[t].asleep = 1;
            S->tags[t].mode = mode;
            a->stats.num_sleeps++;
        }
    update_tag_path(a);
    /* 4. before_unmap, delivered with the lock released (the segments are frozen meanwhile) */
    if (notes) {
        vmm_cb_list_queue(a, notes);
        vmm_cb_flush(a, 1);
    }
    /* 5. unmap and release; free blocks' whole pages become unmapped blocks */
    size_t stuck = 0;
    for (size_t i = 0; i < n_segs; i++) {
        vmm_segment *s = segs[i];
        size_t ps = s->page_size, run0 = 0, run = 0;
        for (size_t pg = 0; pg <= s->n_pages; pg++) {
            int done = 0;
            size_t hn = 1; /* a handle may cover several pages and unmaps whole (segment.c) */
            if (pg < s->n_pages && s->pages[pg] && !page_detaching(s, pg)) {
                hn = vmm_seg_handle_pages(s, pg);
                if (vmm_seg_unmap_page(a, s, pg, 1) == VMM_OK)
                    done = 1;
                else
                    stuck += hn;
            }
            if (done && !run)
                run0 = pg;
            run = done ? run + hn : run;
            if (!done && run) {
                VMM_HISTORY(a, VMM_TRACE_SEGMENT_UNMAP, s->base + run0 * ps, run * ps, s->stream);
                run = 0;
            }
            pg += hn - 1;
        }
        s->asleep = 2;
        for (vmm_block *b = s->first; b; b = b->next) {
            if (b->state == VMM_BLOCK_FREE)
                b = normalize(a, b);
            else if (b->state == VMM_BLOCK_ALLOCATED)
                S->tags[s->srec->tag].sleeping += b->size;
        }
    }
    for (int t = 0; t < S->n_tags; t++)
        if (mask >> t & 1)
            vmm_stat_add(&a->stats.sleeping_bytes, (int64_t)S->tags[t].sleeping);
    /* the tags' cached free pages, and every cached handle, go back to the device */
    vmm_handles_release(a, 0, SIZE_MAX);
    if (mask & 1 && !a->cfg.expandable_segments)
        vmm_seg_classic_release(a, 0, SIZE_MAX, 0);
    if (stuck)
        rc = vmm_fail(VMM_EDRIVER, "vmm_sleep: the tags sleep, but the driver refused to unmap %zu "
                                   "page(s): they stay resident until wake (%s)", stuck, vmm_last_error());
out:
    if (segs)
        vmm_meta_free(a->meta, segs, n_segs * sizeof *segs);
    vmm_unlock_deliver(a);
    pthread_mutex_unlock(&S->op_mu);
    return rc;
}

/* ---- wake ----------------------------------------------------------------------------------------- */

typedef struct mapped_run {
    vmm_segment *seg;
    size_t p0, n;
} mapped_run;

/* Page pg of seg must be mapped for its blocks: unmapped now, under a block that is not UNMAPPED
 * (nor DETACHING: that one is mapped, and on its way out). */
static int page_needed(const vmm_segment *s, size_t pg)
{
    if (s->pages[pg])
        return 0;
    uintptr_t va = s->base + pg * s->page_size, end = va + s->page_size;
    for (const vmm_block *b = s->first; b && b->addr < end; b = b->next)
        if (b->addr + b->size > va && b->state != VMM_BLOCK_UNMAPPED && b->state != VMM_BLOCK_DETACHING &&
            b->state != VMM_BLOCK_MAPPING) /* a growth in flight maps that one (segment.c) */
            return 1;
    return 0;
}

/* Undo what this wake mapped: before_unmap first (when set), then unmap and release. */
static void unmap_runs(vmm_allocator *a, mapped_run *runs, size_t n)
{
    if (a->cb_mapping) {
        /* their after_map may have gone out already (map_run delivers): before_unmap too */
        vmm_cb_notice *notes = NULL;
        int ok = 1;
        for (size_t i = 0; i < n && ok; i++)
            ok = vmm_cb_list_add(a, &notes, runs[i].seg, runs[i].p0, runs[i].n, 1) == VMM_OK;
        if (ok) {
            vmm_cb_list_queue(a, notes);
            vmm_cb_flush(a, 1);
        } else {
            vmm_cb_list_free(a, notes); /* out of host memory: unmapped unannounced */
        }
    }
    for (size_t i = 0; i < n; i++) {
        for (size_t k = 0; k < runs[i].n; k++)
            vmm_seg_unmap_page(a, runs[i].seg, runs[i].p0 + k, 1);
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_UNMAP, runs[i].seg->base + runs[i].p0 * runs[i].seg->page_size,
                    runs[i].n * runs[i].seg->page_size, runs[i].seg->stream);
    }
    vmm_handles_release(a, 0, SIZE_MAX);
}

/* Map run [p0, p0 + n) of seg, making room once from idle pages and cached handles. */
static int map_run(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n)
{
    size_t short_pages = 0;
    int rc = vmm_seg_map_pages(a, seg, p0, n, &short_pages);
    if (rc != VMM_ENOMEM)
        return rc;
    /* idle pages of awake lanes (proven idle by fences, no waiting), detached ones included */
    vmm_fences_record(a);
    vmm_fences_poll(a);
    vmm_seg_reclaim(a, short_pages ? short_pages : n);
    if (a->cb)
        vmm_cb_flush(a, 1);
    short_pages = 0;
    return vmm_seg_map_pages(a, seg, p0, n, &short_pages);
}

VMM_API int vmm_wake(vmm_allocator *a, const char *const *tags, size_t n_tags)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_wake: allocator is NULL");
    if (vmm_cb_delivering(a))
        return vmm_fail(VMM_EINVAL, "vmm_wake: called from a mapping callback of this allocator");
    vmm_lock(a);
    vmm_sleep_state *S = a->sleep;
    vmm_unlock(a);
    if (!S) {
        if (tags && n_tags)
            for (size_t i = 0; i < n_tags; i++)
                if (tags[i] && *tags[i])
                    return vmm_fail(VMM_EINVAL, "vmm_wake: unknown tag \"%s\"", tags[i]);
        return VMM_OK;
    }
    pthread_mutex_lock(&S->op_mu);
    vmm_lock(a);
    vmm_clear_error();
    const vmm_driver_ops *ops = a->drv->ops;
    uint64_t mask;
    vmm_segment **segs = NULL;
    size_t n_segs = 0, n_runs = 0, cap_runs = 0, bytes = 0;
    mapped_run *runs = NULL;
    int rc = tag_mask(a, tags, n_tags, 1, &mask, "vmm_wake");
    if (!rc && mask)
        rc = segs_of(a, mask, 2, &segs, &n_segs);
    if (rc || !mask)
        goto out;
    /* map every run of needed pages; undo all at the first that cannot be mapped */
    for (size_t i = 0; i < n_segs && !rc; i++) {
        vmm_segment *s = segs[i];
        for (size_t pg = 0; pg < s->n_pages && !rc;) {
            if (!page_needed(s, pg)) {
                pg++;
                continue;
            }
            size_t end = pg;
            while (end < s->n_pages && page_needed(s, end))
                end++;
            if (n_runs == cap_runs) {
                size_t ncap = cap_runs ? 2 * cap_runs : 16;
                mapped_run *x = vmm_meta_alloc(a->meta, ncap * sizeof *x);
                if (!x) {
                    rc = vmm_fail(VMM_EHOSTMEM, "vmm_wake: out of host memory");
                    break;
                }
                if (n_runs)
                    memcpy(x, runs, n_runs * sizeof *x);
                if (runs)
                    vmm_meta_free(a->meta, runs, cap_runs * sizeof *x);
                runs = x;
                cap_runs = ncap;
            }
            bytes += (end - pg) * s->page_size;
            rc = map_run(a, s, pg, end - pg);
            if (!rc)
                runs[n_runs++] = (mapped_run){s, pg, end - pg};
            pg = end;
        }
    }
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", vmm_last_error());
        size_t free_b = 0, total = 0;
        ops->mem_get_info(a->drv, &free_b, &total);
        unmap_runs(a, runs, n_runs);
        a->stats.num_wake_failures++;
        if (rc == VMM_ENOMEM) {
            size_t need = 0;
            for (size_t i = 0; i < n_segs; i++)
                for (size_t pg = 0; pg < segs[i]->n_pages; pg++)
                    need += page_needed(segs[i], pg) ? segs[i]->page_size : 0;
            rc = vmm_fail(VMM_ENOMEM, "vmm_wake: the device cannot hold the %zu bytes the tags need "
                                      "(%zu bytes free on device %d, this allocator may hold %zu): "
                                      "nothing stays mapped, the tags stay asleep; wake them once "
                                      "memory is free", need, free_b, a->dev.ordinal, a->cap);
        } else {
            rc = vmm_fail(rc, "vmm_wake: %s; nothing stays mapped, the tags stay asleep", why);
        }
        goto out;
    }
    /* restore the backups, on the default stream, and wait for the copies */
    for (int t = 0; t < S->n_tags && !rc; t++) {
        sleep_tag *T = &S->tags[t];
        if (!(mask >> t & 1) || !(T->mode & VMM_SLEEP_BACKUP))
            continue;
        for (size_t i = 0; i < T->n_ent && !rc; i++) {
            if (!T->ent[i].size)
                continue; /* freed while asleep */
            int r = ops->memcpy_htod(a->drv, T->ent[i].addr, (const char *)T->host + T->ent[i].off,
                                     T->ent[i].size, NULL);
            if (r)
                rc = vmm_fail_drv(r, "vmm_wake: restoring a block from host memory");
        }
    }
    /* the restores queued must have run before anything is unmapped, whatever failed */
    int wrc = wait_copies(a);
    if (!rc)
        rc = wrc;
    if (rc) {
        char why[512];
        snprintf(why, sizeof why, "%s", vmm_last_error());
        a->stats.num_wake_failures++;
        if (wrc) {
            /* The restores may still be queued: unmapping now would let them write into unmapped
             * memory. The pages stay mapped (resident, as pages sleep could not unmap), the tags
             * asleep with their backups; the next wake uses these pages and restores again. */
            rc = vmm_fail(rc, "vmm_wake: %s; the restore copies could not be confirmed, so the %zu "
                              "page run(s) mapped for them stay mapped; the tags stay asleep", why, n_runs);
            goto out;
        }
        unmap_runs(a, runs, n_runs);
        rc = vmm_fail(rc, "vmm_wake: %s; nothing stays mapped, the tags stay asleep", why);
        goto out;
    }
    /* awake: free blocks back in the index */
    for (size_t i = 0; i < n_segs; i++) {
        for (vmm_block *b = segs[i]->first; b; b = b->next)
            if (b->state == VMM_BLOCK_FREE) {
                b->free_seq = 0; /* fresh pages: no work touched them */
                b->gc_stamp = a->malloc_count;
                vmm_pool_insert(a, b);
            }
        segs[i]->asleep = 0;
    }
    for (int t = 0; t < S->n_tags; t++) {
        if (!(mask >> t & 1))
            continue;
        sleep_tag *T = &S->tags[t];
        vmm_stat_add(&a->stats.sleeping_bytes, -(int64_t)T->sleeping);
        T->sleeping = 0;
        backup_drop(a, T, (T->mode & VMM_SLEEP_KEEP_HOST) != 0);
        T->asleep = 0;
        a->stats.num_wakes++;
    }
    update_tag_path(a);
    (void)bytes;
    /* private pools released while their tags slept can join the default pools now */
    vmm_mempool_settle(a);
out:
    if (segs)
        vmm_meta_free(a->meta, segs, n_segs * sizeof *segs);
    if (runs)
        vmm_meta_free(a->meta, runs, cap_runs * sizeof *runs);
    vmm_unlock_deliver(a);
    pthread_mutex_unlock(&S->op_mu);
    return rc;
}

/* ---- free of a sleeping block ----------------------------------------------------------------- */

void vmm_sleep_free(vmm_allocator *a, vmm_block *b, size_t slot)
{
    vmm_segment *seg = b->seg;
    vmm_live_remove_at(a, slot);
    VMM_HISTORY(a, VMM_TRACE_FREE_REQUESTED, b->addr, b->size, seg->stream);
    if (b->group)
        a->hooks.group_drop(a, b);
    vmm_count_free(a, &a->stats, b);
    if (a->ipc)
        (void)vmm_ipc_hold(a, b); /* an export record without readers goes */
    /* its uses cannot touch unmapped memory (or were waited for when it fell asleep) */
    while (b->n_uses) {
        b->n_uses--;
        if (b->ext->events[b->n_uses])
            vmm_event_put(a, b->ext->events[b->n_uses]);
        b->ext->events[b->n_uses] = NULL;
    }
    if (b->ext)
        b->ext->n_events = 0;
    sleep_tag *T = &a->sleep->tags[seg->srec->tag];
    if (seg->asleep == 2) {
        T->sleeping -= b->size;
        vmm_stat_add(&a->stats.sleeping_bytes, -(int64_t)b->size);
    }
    backup_entry *e = entry_find(T, b->addr);
    if (e)
        e->size = 0;
    VMM_HISTORY(a, VMM_TRACE_FREE_COMPLETED, b->addr, b->size, seg->stream);
    b->requested = 0;
    b->state = VMM_BLOCK_FREE;
    b->in_index = 0;
    b->free_seq = 0;
    b->gc_stamp = a->malloc_count;
    b = merge_unindexed(a, b);
    if (seg->asleep == 2)
        (void)normalize(a, b);
}

int vmm_sleep_tag_asleep(const vmm_allocator *a, int t)
{
    return a->sleep && t < a->sleep->n_tags && a->sleep->tags[t].asleep;
}

/* ---- check and teardown ---------------------------------------------------------------------- */

int vmm_sleep_check(vmm_allocator *a)
{
    for (vmm_stream_rec *r = a->streams; r; r = r->next) {
        vmm_stream want = r->tag ? (vmm_stream)((uintptr_t)r | 1) : r->stream;
        if (r->key != want || (r->tag && (!a->sleep || r->tag >= a->sleep->n_tags)))
            return vmm_fail(VMM_ECORRUPT, "vmm_check: stream record %p has a wrong lane key or tag", (void *)r);
    }
    for (vmm_segment *s = a->segs; s; s = s->next)
        if (s->key != s->srec->key)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: segment at 0x%llx has another key than its lane",
                            (unsigned long long)s->base);
    vmm_sleep_state *S = a->sleep;
    if (!S)
        return a->stats.sleeping_bytes.current == 0
                   ? VMM_OK
                   : vmm_fail(VMM_ECORRUPT, "vmm_check: sleeping bytes without any tag");
    int64_t total = 0, host = 0;
    for (int t = 0; t < S->n_tags; t++) {
        sleep_tag *T = &S->tags[t];
        size_t live = 0;
        for (vmm_segment *s = a->segs; s; s = s->next) {
            if (!seg_of(s, (uint64_t)1 << t))
                continue;
            if (!T->asleep && s->asleep)
                return vmm_fail(VMM_ECORRUPT, "vmm_check: segment at 0x%llx sleeps, its tag \"%s\" does not",
                                (unsigned long long)s->base, T->name);
            if (T->asleep && !s->asleep)
                return vmm_fail(VMM_ECORRUPT, "vmm_check: tag \"%s\" sleeps, its segment at 0x%llx does not",
                                T->name, (unsigned long long)s->base);
            for (vmm_block *b = s->first; s->asleep == 2 && b; b = b->next)
                if (b->state == VMM_BLOCK_ALLOCATED)
                    live += b->size;
        }
        if (live != T->sleeping)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: tag \"%s\" counts %zu sleeping bytes, its blocks %zu",
                            T->name, T->sleeping, live);
        for (size_t i = 0; i < T->n_ent; i++) {
            const backup_entry *e = &T->ent[i];
            if (!e->size)
                continue;
            vmm_block *b = vmm_live_find(a, e->addr);
            if (!T->asleep || !b || b->size != e->size || e->off + e->size > T->host_size)
                return vmm_fail(VMM_ECORRUPT, "vmm_check: backup of 0x%llx (tag \"%s\") matches no "
                                              "sleeping block", (unsigned long long)e->addr, T->name);
        }
        total += (int64_t)T->sleeping;
        host += (int64_t)T->host_size;
    }
    if (total != a->stats.sleeping_bytes.current)
        return vmm_fail(VMM_ECORRUPT, "vmm_check: stat sleeping_bytes is %lld, the tags hold %lld",
                        (long long)a->stats.sleeping_bytes.current, (long long)total);
    if (host != a->stats.backup_bytes)
        return vmm_fail(VMM_ECORRUPT, "vmm_check: stat backup_bytes is %lld, the buffers hold %lld",
                        (long long)a->stats.backup_bytes, (long long)host);
    return VMM_OK;
}

void vmm_sleep_destroy(vmm_allocator *a)
{
    vmm_sleep_state *S = a->sleep;
    if (!S)
        return;
    for (int t = 0; t < S->n_tags; t++) {
        backup_drop(a, &S->tags[t], 0);
        /* the last chance: once more, then it is reported (the driver keeps it) */
        if (S->tags[t].host && host_release(a, &S->tags[t]))
            fprintf(stderr, "vmmalloc: vmm_destroy: the backup buffer of tag \"%s\" (%zu bytes of "
                            "pinned host memory) could not be freed\n", S->tags[t].name,
                    S->tags[t].host_size);
    }
    pthread_mutex_destroy(&S->op_mu);
    vmm_meta_free(a->meta, S, sizeof *S);
    a->sleep = NULL;
    a->cur_tag = 0;
    a->tag_path = 0;
}
