/*
 * Physical aliasing of partly used pages (the key alias_pages).
 *
 * With one handle per page, what is left at a peak is the free part of pages shared with a live
 * block. A block that stays (a K/V cache, an activation kept for backward) placed among
 * temporaries ends up alone in its mapped run once they die and their whole pages go back: its
 * first and last pages are partly free, and no request placed elsewhere in VA can use those
 * bytes. The driver contract lets a handle be mapped at several places at once (driver.h,
 * "Mappings"), and the CUDA Programming Guide's virtual aliasing makes such views coherent once
 * the writing operation has completed: the caching rule (a block is reused only after its free in
 * stream order) is the rule aliasing needs. So a growth whose first page would be partly used at
 * its start (the block starts at offset y) maps instead a page whose free part is exactly its
 * suffix from y (the head), and one whose last page would be used up to x maps a page whose free
 * prefix holds x (the tail): the growth creates one or two pages fewer, whatever VA they lie at.
 *
 * Bookkeeping. A page has at most two views (vmm_alias). Each byte is owned by one view; the other
 * covers it with a SHADOW block (mapped, in no index, never merged, split or handed out). Free
 * bytes are allocated only in the view that owns them. A view that holds no block in use is
 * unmapped by vmm_alias_reclaim (growth past the high-water mark, the OOM path, empty_cache): the
 * bytes it owned turn FREE in the other view. A handle is cached or released only once its last
 * view is gone, by the page code of segment.c, which sees a one-view page as any other. Reserved
 * bytes count handles, so a page is counted once; mapped_bytes counts VA, so both views.
 *
 * With alias_place the edges serve placement: a large request that no free block of about its size
 * serves is built by growth (segment.c, place_growth) from edges that vmm_alias_edge finds among
 * the lane's free blocks, whatever their size (a block reaching past its page lends that page's
 * part, cut off first), and idle views are unmapped before each growth so that their pages lend
 * edges again.
 *
 * Only the lane's own free blocks serve its growth (the same key), so stream order covers the
 * reuse as it covers best fit. Out of scope, keeping today's behaviour: private pools, tagged
 * memory (sleep), exportable handles, pages of several-page handles, mapping callbacks.
 */
#include <stddef.h>

#include "base/base.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/alias.h"
#include "core/counters.h"
#include "core/events.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/trace.h"
#include "core/types.h"
#include "driver/driver.h"

enum { ALIAS_UNMAP_TRIES = 8 };

int vmm_alias_enabled(const vmm_allocator *a, const vmm_segment *seg)
{
    return vmm_pool_aliasable(a, seg);
}

static size_t page_of(const vmm_block *b, uintptr_t addr)
{
    return (addr - b->seg->base) / b->seg->page_size;
}

/* Whether page bp of b's segment (b a block in it) has a SHADOW block: a second view. */
static int page_has_shadow(const vmm_block *b, size_t bp)
{
    const vmm_segment *s = b->seg;
    uintptr_t lo = s->base + bp * s->page_size, hi = lo + s->page_size;
    for (const vmm_block *c = b; c && c->addr + c->size > lo; c = c->prev)
        if (c->state == VMM_BLOCK_SHADOW)
            return 1;
    for (const vmm_block *c = b->next; c && c->addr < hi; c = c->next)
        if (c->state == VMM_BLOCK_SHADOW)
            return 1;
    return 0;
}

vmm_block *vmm_alias_find(vmm_allocator *a, vmm_stream_rec *sr, const vmm_segment *seg, size_t pg,
                          int head, size_t bound)
{
    size_t ps = a->page_size[VMM_LARGE];
    if (!bound || bound >= ps)
        return NULL;
    vmm_block *root = sr->free_tree[VMM_LARGE];
    /* sizes from the tightest fit up: a head of offset y <= bound is a block of ps - y bytes */
    size_t from = head ? ps - bound : bound;
    for (vmm_block *b = vmm_tree_lower_bound(root, sr->key, from, 0);
         b && b->seg->key == sr->key && b->size < ps; b = vmm_tree_next(root, b)) {
        const vmm_segment *s = b->seg;
        size_t off = (b->addr - s->base) % ps, bp = page_of(b, b->addr);
        int fits = head ? off != 0 && off + b->size == ps : off == 0;
        if (!fits || !vmm_alias_enabled(a, s) || !s->pages[bp] || b->group)
            continue;
        /* two views of one handle side by side would read as one two-page handle (segment.c) */
        if (s == seg && (bp + 1 == pg || pg + 1 == bp))
            continue;
        if (page_has_shadow(b, bp))
            continue;
        return b;
    }
    return NULL;
}

vmm_block *vmm_alias_edge(vmm_allocator *a, vmm_stream_rec *sr, const vmm_segment *seg, size_t pg,
                          int head, size_t lo, size_t hi, int largest, const vmm_segment *avoid_seg,
                          size_t avoid_pg, size_t *len)
{
    size_t ps = a->page_size[VMM_LARGE];
    vmm_block *root = sr->free_tree[VMM_LARGE], *best = NULL;
    size_t best_len = 0;
    if (hi > ps)
        hi = ps;
    if (lo >= hi)
        return NULL;
    for (vmm_block *b = vmm_tree_lower_bound(root, sr->key, 0, 0); b && b->seg->key == sr->key;
         b = vmm_tree_next(root, b)) {
        const vmm_segment *s = b->seg;
        uintptr_t x = b->addr - s->base, e = x + b->size;
        size_t n, bp;
        if (head) {
            if (x % ps == 0 || e < (x / ps + 1) * ps)
                continue;
            n = ps - x % ps;
            bp = x / ps;
        } else {
            if (e % ps == 0 || x > e / ps * ps)
                continue;
            n = e % ps;
            bp = e / ps;
        }
        if (n < lo || n >= hi || (best && (largest ? n <= best_len : n >= best_len)))
            continue;
        if (!vmm_alias_enabled(a, s) || !s->pages[bp] || b->group)
            continue;
        /* two views of one handle side by side would read as one two-page handle (segment.c) */
        if (s == seg && (bp + 1 == pg || pg + 1 == bp))
            continue;
        if ((s == avoid_seg && bp == avoid_pg) || page_has_shadow(b, bp))
            continue;
        best = b;
        best_len = n;
    }
    *len = best_len;
    return best;
}

vmm_block *vmm_alias_edge_cut(vmm_allocator *a, vmm_block *f, int head)
{
    size_t ps = f->seg->page_size;
    uintptr_t x = f->addr - f->seg->base, e = x + f->size;
    /* head: [x, page end) stays f; tail: f keeps up to the last page's start */
    size_t keep = head ? (x / ps + 1) * ps - x : e / ps * ps - x;
    if (keep == 0 || keep == f->size)
        return f;
    vmm_block *r = vmm_block_new(a);
    if (!r)
        return NULL;
    vmm_pool_erase(a, f);
    vmm_block_split_into(f, r, keep);
    r->n_uses = 0;
    vmm_pool_insert(a, f);
    vmm_pool_insert(a, r);
    return head ? f : r;
}

void vmm_alias_edge_join(vmm_allocator *a, vmm_block *e)
{
    if (e->state != VMM_BLOCK_FREE || !e->in_index)
        return;
    vmm_pool_erase(a, e);
    vmm_pool_insert(a, vmm_block_merge(a, e));
}

static void alias_link(vmm_allocator *a, vmm_alias *al)
{
    al->prev = NULL;
    al->next = a->aliases;
    if (a->aliases)
        a->aliases->prev = al;
    a->aliases = al;
    a->n_aliases++;
}

static void alias_unlink(vmm_allocator *a, vmm_alias *al)
{
    if (al->prev)
        al->prev->next = al->next;
    else
        a->aliases = al->next;
    if (al->next)
        al->next->prev = al->prev;
    a->n_aliases--;
}

int vmm_alias_map(vmm_allocator *a, vmm_block *f, vmm_block *u, size_t pg, vmm_block **free_out)
{
    const vmm_driver_ops *ops = a->drv->ops;
    vmm_segment *seg = u->seg, *fseg = f->seg;
    size_t ps = seg->page_size, fpg = page_of(f, f->addr);
    size_t off = (f->addr - fseg->base) % ps;
    int head = off != 0; /* f is its page's free suffix (head) or prefix (tail) */
    uintptr_t va = seg->base + pg * ps;
    vmm_phys h = fseg->pages[fpg];
    vmm_alias *al = vmm_meta_alloc(a->meta, sizeof *al);
    vmm_block *r[3] = {vmm_block_new(a), vmm_block_new(a), vmm_block_new(a)};
    if (!al || !r[0] || !r[1] || !r[2]) {
        if (al)
            vmm_meta_free(a->meta, al, sizeof *al);
        for (int i = 0; i < 3; i++)
            if (r[i])
                vmm_block_delete(a, r[i]);
        return vmm_fail(VMM_EHOSTMEM, "out of host memory for an alias record");
    }
    /* out of every index while the driver works: a SHADOW block is taken or merged by no path */
    vmm_pool_erase(a, f);
    f->state = VMM_BLOCK_SHADOW;
    vmm_pool_erase(a, u);
    vmm_lanes_yield(a, NULL);
    const char *call = "mem_map";
    int rc = ops->mem_map(a->drv, va, ps, 0, h), unmapped = 1;
    if (rc == VMM_DRV_SUCCESS) {
        call = "set_access";
        rc = ops->set_access(a->drv, va, ps);
        if (rc != VMM_DRV_SUCCESS) {
            unmapped = 0;
            for (int t = 0; t < ALIAS_UNMAP_TRIES && !unmapped; t++)
                unmapped = ops->mem_unmap(a->drv, va, ps) == VMM_DRV_SUCCESS;
        }
    }
    vmm_lanes_resume(a, NULL);
    if (rc != VMM_DRV_SUCCESS && unmapped) {
        f->state = VMM_BLOCK_FREE;
        vmm_pool_insert(a, f);
        vmm_pool_insert(a, u);
        vmm_meta_free(a->meta, al, sizeof *al);
        for (int i = 0; i < 3; i++)
            vmm_block_delete(a, r[i]);
        return vmm_fail_drv(rc, call);
    }
    /* carve the page out of u: [u before][page][u after] */
    vmm_block *page = u;
    int used = 0;
    if (u->addr < va) {
        vmm_block_split_into(u, r[used], va - u->addr);
        vmm_pool_insert(a, u); /* UNMAPPED, merged already */
        page = r[used++];
    }
    if (page->size > ps) {
        vmm_block_split_into(page, r[used], ps);
        vmm_pool_insert(a, r[used++]);
    }
    al->h = h;
    al->seg[0] = fseg;
    al->pg[0] = fpg;
    al->seg[1] = seg;
    al->pg[1] = pg;
    vmm_block *own = NULL;
    if (rc != VMM_DRV_SUCCESS) {
        /* mapped without access and the driver would not unmap it: a view that owns nothing (its
         * whole page SHADOW), dropped by the next vmm_alias_reclaim, which gives f back. Until
         * then f stays SHADOW too, owned by neither view: the old view's page is then never idle
         * whole, so the page code does not unmap it and give back a handle the new view maps,
         * and no growth makes the page a third view */
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_UNMAP, f->addr, f->size, fseg->stream);
        page->state = VMM_BLOCK_SHADOW;
        page->free_seq = 0; /* fresh VA: no work ran through this view (view_idle) */
        al->shadow[0] = f;
        al->shadow[1] = page;
    } else {
        vmm_block *second = r[used++];
        size_t cut = head ? off : f->size; /* the new view owns [off, ps) or [0, f->size) */
        vmm_block_split_into(page, second, cut);
        own = head ? second : page;
        vmm_block *shadow = head ? page : second;
        /* the history trace follows the bytes each view owns, as snapshots show them (SHADOW
         * blocks in no segment): f's range leaves the old view's segment, the same bytes join
         * the new view's, so mapped ranges add up to reserved bytes and PyTorch's viewer, which
         * replays the trace back from the snapshot's segments, finds every block in one */
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_UNMAP, f->addr, f->size, fseg->stream);
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_MAP, own->addr, own->size, seg->stream);
        shadow->state = VMM_BLOCK_SHADOW;
        shadow->free_seq = 0; /* fresh VA: no work ran through this view (view_idle) */
        own->state = VMM_BLOCK_FREE;
        own->free_seq = f->free_seq;
        own->gc_stamp = f->gc_stamp;
        own->n_uses = 0;
        own = vmm_block_merge(a, own);
        vmm_pool_insert(a, own);
        al->shadow[0] = f;
        al->shadow[1] = shadow;
    }
    for (int i = used; i < 3; i++)
        vmm_block_delete(a, r[i]);
    seg->pages[pg] = h;
    seg->mapped_pages++;
    vmm_stat_update(a->stats.mapped_bytes, seg->pool, (int64_t)ps);
    a->stats.num_pages_mapped++;
    alias_link(a, al);
    *free_out = own;
    if (rc != VMM_DRV_SUCCESS)
        return vmm_fail_drv(rc, call);
    return VMM_OK;
}

/* The block of view i's page holding address x (from its shadow, which lies in the page). */
static vmm_block *block_at(vmm_block *from, uintptr_t x)
{
    while (from->addr > x)
        from = from->prev;
    while (from->addr + from->size <= x)
        from = from->next;
    return from;
}

/* Whether view i holds no block in use: every block of its page but its shadow is FREE, and idle:
 * its free is proven complete (vmm_block_idle). An unmap is not stream ordered, so a FREE block
 * whose stream may still run work on it keeps its view mapped, as idle pages are unmapped only
 * once idle (segment.c). The shadow's bytes count too: view 0's shadow is the free block the other
 * view took (vmm_alias_map), and work queued before its free may still run through view 0's
 * addresses. Its stamp stays; it is not merged, so the blocks beside it do not carry it: a block
 * whose free waited on another stream's event (record_stream) turns FREE with the older stamp of
 * its host free and may be idle while the shadow's stream still runs that work. */
static int view_idle(const vmm_alias *al, int i)
{
    const vmm_segment *s = al->seg[i];
    uintptr_t lo = s->base + al->pg[i] * s->page_size, hi = lo + s->page_size;
    if (!vmm_block_idle(al->shadow[i]))
        return 0;
    for (const vmm_block *b = block_at(al->shadow[i], lo); b && b->addr < hi; b = b->next)
        if (b != al->shadow[i] && (b->state != VMM_BLOCK_FREE || !vmm_block_idle(b)))
            return 0;
    return 1;
}

/* Unmap view i (view_idle, shadow[i] set): its page becomes UNMAPPED, the bytes it owned turn FREE
 * in the other view. 0 when the driver refuses the unmap or host memory is short (nothing
 * changed). */
static int drop_view(vmm_allocator *a, vmm_alias *al, int i)
{
    vmm_segment *s = al->seg[i];
    size_t ps = s->page_size;
    uintptr_t lo = s->base + al->pg[i] * ps, hi = lo + ps;
    vmm_block *r1 = vmm_block_new(a), *r2 = vmm_block_new(a);
    if (!r1 || !r2) {
        if (r1)
            vmm_block_delete(a, r1);
        if (r2)
            vmm_block_delete(a, r2);
        return 0;
    }
    uint64_t seq = 0, stamp = 0;
    /* the bytes view i owns: its page but its shadow, which lies at one end (for the trace) */
    const vmm_block *sh = al->shadow[i];
    uintptr_t own_lo = sh->addr == lo ? sh->addr + sh->size : lo, own_hi = sh->addr == lo ? hi : sh->addr;
    /* the page's FREE blocks out of the index, cut at the page's edges, SHADOW meanwhile (no path
     * takes or merges them while the lanes run during the unmap) */
    vmm_block *first = block_at(al->shadow[i], lo);
    for (vmm_block *b = first; b && b->addr < hi; b = b->next) {
        if (b->state != VMM_BLOCK_FREE)
            continue;
        vmm_pool_erase(a, b);
        if (b->free_seq > seq)
            seq = b->free_seq;
        if (b->gc_stamp > stamp)
            stamp = b->gc_stamp;
        b->state = VMM_BLOCK_SHADOW;
    }
    if (first->addr < lo) {
        vmm_block_split_into(first, r1, lo - first->addr);
        first->state = VMM_BLOCK_FREE;
        vmm_pool_insert(a, first);
        first = r1;
        r1 = NULL;
    }
    vmm_block *last = block_at(first, hi - 1);
    if (last->addr + last->size > hi) {
        vmm_block_split_into(last, r2, hi - last->addr);
        r2->state = VMM_BLOCK_FREE;
        vmm_pool_insert(a, r2);
        r2 = NULL;
    }
    if (r1)
        vmm_block_delete(a, r1);
    if (r2)
        vmm_block_delete(a, r2);
    vmm_lanes_yield(a, NULL);
    int rc = VMM_DRV_SUCCESS;
    for (int t = 0; t < ALIAS_UNMAP_TRIES; t++)
        if ((rc = a->drv->ops->mem_unmap(a->drv, lo, ps)) == VMM_DRV_SUCCESS)
            break;
    vmm_lanes_resume(a, NULL);
    if (rc != VMM_DRV_SUCCESS) {
        /* the view stays: its free pieces back (merged, indexed) */
        for (vmm_block *b = first, *n; b && b->addr < hi; b = n) {
            n = b->next;
            if (b == al->shadow[i] || b->state != VMM_BLOCK_SHADOW)
                continue;
            b->state = VMM_BLOCK_FREE;
            b = vmm_block_merge(a, b);
            n = b->next;
            vmm_pool_insert(a, b);
        }
        vmm_fail_drv(rc, "mem_unmap (aliased page)");
        return 0;
    }
    /* one UNMAPPED block for the page, merged with its unmapped neighbours */
    while (first->next && first->next->addr < hi) {
        vmm_block *n = first->next;
        first->size += n->size;
        first->next = n->next;
        if (n->next)
            n->next->prev = first;
        vmm_block_delete(a, n);
    }
    first->state = VMM_BLOCK_UNMAPPED;
    first->n_uses = 0;
    first = vmm_block_merge(a, first);
    vmm_pool_insert(a, first);
    s->pages[al->pg[i]] = 0;
    s->mapped_pages--;
    vmm_stat_update(a->stats.mapped_bytes, s->pool, -(int64_t)ps);
    a->stats.num_pages_unmapped++;
    vmm_block *back = al->shadow[1 - i];
    /* as in vmm_alias_map: the bytes leave view i's segment and join the other view's */
    if (own_hi > own_lo)
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_UNMAP, own_lo, own_hi - own_lo, s->stream);
    if (back) {
        VMM_HISTORY(a, VMM_TRACE_SEGMENT_MAP, back->addr, back->size, al->seg[1 - i]->stream);
        back->state = VMM_BLOCK_FREE;
        if (own_hi > own_lo) { /* its bytes were view i's; else back keeps its own (f's) */
            /* the later of the two: back's own stamp covers work queued through its view before
             * the bytes went to view i (view_idle) */
            if (seq > back->free_seq)
                back->free_seq = seq;
            back->gc_stamp = stamp;
        }
        back->n_uses = 0;
        back = vmm_block_merge(a, back);
        vmm_pool_insert(a, back);
    }
    alias_unlink(a, al);
    vmm_meta_free(a->meta, al, sizeof *al);
    return 1;
}

size_t vmm_alias_reclaim(vmm_allocator *a)
{
    size_t n = 0;
    if (!a->aliases)
        return 0;
    /* fence the frees no fence covers yet and poll, as recycle_idle (segment.c) does: a view is
     * dropped only once its free blocks are proven idle (view_idle) */
    vmm_fences_record(a);
    vmm_fences_poll(a);
    for (vmm_alias *al = a->aliases, *next; al; al = next) {
        next = al->next;
        /* the later view first: the page then stays where it was mapped first */
        for (int i = 1; i >= 0; i--) {
            if (al->shadow[i] && !al->seg[i]->asleep && view_idle(al, i)) {
                n += (size_t)drop_view(a, al, i);
                break;
            }
        }
    }
    return n;
}

void vmm_alias_destroy_all(vmm_allocator *a)
{
    while (a->aliases) {
        vmm_alias *al = a->aliases;
        vmm_segment *s = al->seg[1];
        size_t ps = s->page_size;
        /* the handle stays mapped in view 0, which the segments' teardown unmaps and releases */
        for (int t = 0; t < ALIAS_UNMAP_TRIES; t++)
            if (a->drv->ops->mem_unmap(a->drv, s->base + al->pg[1] * ps, ps) == VMM_DRV_SUCCESS)
                break;
        s->pages[al->pg[1]] = 0;
        alias_unlink(a, al);
        vmm_meta_free(a->meta, al, sizeof *al);
    }
}

/* The range [lo, hi) of its page (offsets) that view i does not own: its shadow's, empty when it
 * has none. */
static void shadow_range(const vmm_alias *al, int i, size_t *lo, size_t *hi)
{
    const vmm_block *b = al->shadow[i];
    const vmm_segment *s = al->seg[i];
    *lo = *hi = 0;
    if (b) {
        *lo = b->addr - (s->base + al->pg[i] * s->page_size);
        *hi = *lo + b->size;
    }
}

const char *vmm_alias_check(const vmm_allocator *a, size_t *shadows, int64_t dups[VMM_NPOOLS],
                            size_t *dup_handles, uintptr_t *at)
{
    size_t n = 0;
    *shadows = 0;
    *dup_handles = 0;
    for (const vmm_alias *al = a->aliases; al; al = al->next) {
        n++;
        size_t ps = al->seg[0]->page_size, lo[2], hi[2];
        for (int i = 0; i < 2; i++) {
            const vmm_segment *s = al->seg[i];
            *at = s->base + al->pg[i] * s->page_size;
            if (al->pg[i] >= s->n_pages || s->pages[al->pg[i]] != al->h || s->page_size != ps)
                return "an aliased page's view does not map its handle";
            const vmm_block *b = al->shadow[i];
            if (b && (b->seg != s || b->state != VMM_BLOCK_SHADOW || b->in_index || b->addr < *at ||
                      b->addr + b->size > *at + ps))
                return "an aliased page's shadow is not a SHADOW block inside its page";
            *shadows += b != NULL;
            shadow_range(al, i, &lo[i], &hi[i]);
        }
        /* each byte owned by exactly one view: the shadows are complements within the page;
         * or view 1, mapped without access, owns nothing (and the bytes it was to own may be
         * the old view's SHADOW still: vmm_alias_map) */
        int ok;
        if (al->shadow[1] && hi[1] - lo[1] == ps)
            ok = 1;
        else if (!al->shadow[0] || !al->shadow[1])
            ok = (al->shadow[0] || al->shadow[1]) && hi[0] - lo[0] + hi[1] - lo[1] == ps;
        else
            ok = hi[0] - lo[0] + hi[1] - lo[1] == ps &&
                 ((lo[0] == 0 && hi[0] == lo[1] && hi[1] == ps) || (lo[1] == 0 && hi[1] == lo[0] && hi[0] == ps));
        if (!ok)
            return "an aliased page's bytes are not owned by exactly one view";
        if (al->seg[0] == al->seg[1] && (al->pg[0] + 1 == al->pg[1] || al->pg[1] + 1 == al->pg[0]))
            return "two views of one page lie side by side";
        dups[al->seg[1]->pool] += (int64_t)ps;
        (*dup_handles)++;
    }
    if (n != a->n_aliases)
        return "aliased page count is wrong";
    return NULL;
}
