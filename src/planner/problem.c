/* The planning problem, the utilities every algorithm uses: validation, items (groups fused),
 * time compression, arena of a plan, the clock. Calls nothing above it (the dispatcher, vmm_plan,
 * is plan.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "planner.h"

enum {
    /* Sizes are capped so that sums over every buffer (naive plans, group layouts) cannot wrap:
     * 2^62 bytes leaves two bits of headroom for alignment padding. */
    PLAN_MAX_BYTES_SHIFT = 62,
};

double plan_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* Rank of t among the sorted distinct times. */
static uint32_t time_rank(const int64_t *times, size_t nt, int64_t t)
{
    size_t lo = 0, hi = nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (times[mid] < t)
            lo = mid + 1;
        else
            hi = mid;
    }
    return (uint32_t)lo;
}

/* "buffer 3" or, with ids, "buffer 'b3'", for messages. */
static const char *bname(char *const *ids, size_t i, char *buf, size_t len)
{
    if (ids)
        snprintf(buf, len, "buffer '%s'", ids[i]);
    else
        snprintf(buf, len, "buffer %zu", i);
    return buf;
}

#define CHECK_FAIL(i, ...)                                                                          \
    do {                                                                                            \
        if (bad)                                                                                    \
            *bad = (i);                                                                             \
        rc = vmm_fail(VMM_EINVAL, __VA_ARGS__);                                                     \
        goto out;                                                                                   \
    } while (0)

int plan_check(const vmm_plan_buffer *bufs, size_t n, char *const *ids, size_t *bad)
{
    if (n > 0 && !bufs)
        return vmm_fail(VMM_EINVAL, "plan: NULL buffer array");
    char nm[96], nm2[96];
    int rc = VMM_OK;
    unsigned char *taken = NULL;
    for (size_t i = 0; i < n; i++) {
        const vmm_plan_buffer *b = &bufs[i];
        bname(ids, i, nm, sizeof nm);
        if (b->size == 0)
            CHECK_FAIL(i, "plan: %s has size 0", nm);
        if (b->size >> PLAN_MAX_BYTES_SHIFT)
            CHECK_FAIL(i, "plan: %s size %llu too large", nm, (unsigned long long)b->size);
        if (b->upper <= b->lower)
            CHECK_FAIL(i, "plan: %s has empty lifetime [%lld, %lld)", nm, (long long)b->lower,
                       (long long)b->upper);
        if (b->alignment & (b->alignment - 1))
            CHECK_FAIL(i, "plan: %s alignment %llu is not a power of two", nm, (unsigned long long)b->alignment);
        if (b->alignment >> PLAN_MAX_BYTES_SHIFT)
            CHECK_FAIL(i, "plan: %s alignment too large", nm);
        if (b->arena >= VMM_PLAN_MAX_ARENAS)
            CHECK_FAIL(i, "plan: %s: unknown arena %u (ids 0 to %d)", nm, b->arena, VMM_PLAN_MAX_ARENAS - 1);
        if (b->flags & ~(VMM_PLAN_UNPLANNED | VMM_PLAN_ALIAS))
            CHECK_FAIL(i, "plan: %s: unknown flags 0x%x", nm, b->flags);
        if ((b->flags & VMM_PLAN_UNPLANNED) && b->group >= 0)
            CHECK_FAIL(i, "plan: %s: a group member cannot be unplanned", nm);
    }
    taken = calloc(n ? n : 1, 1);
    if (!taken)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    for (size_t i = 0; i < n; i++) {
        const vmm_plan_buffer *b = &bufs[i];
        if (!(b->flags & VMM_PLAN_ALIAS))
            continue;
        bname(ids, i, nm, sizeof nm);
        if (b->alias == i)
            CHECK_FAIL(i, "plan: %s aliases itself", nm);
        if (b->alias >= n)
            CHECK_FAIL(i, "plan: %s: alias %llu is not a buffer index (%zu buffers)", nm,
                       (unsigned long long)b->alias, n);
        const vmm_plan_buffer *a = &bufs[b->alias];
        bname(ids, b->alias, nm2, sizeof nm2);
        if (b->group >= 0)
            CHECK_FAIL(i, "plan: %s: a group member cannot be an alias", nm);
        if (a->group >= 0)
            CHECK_FAIL(i, "plan: %s: its alias %s is a group member", nm, nm2);
        if (a->arena != b->arena)
            CHECK_FAIL(i, "plan: %s (arena %u) aliases %s in another arena (%u)", nm, b->arena, nm2, a->arena);
        /* The operator at step b.lower reads a for the last time and writes b over it. */
        if (a->upper != b->lower + 1 || a->lower >= b->lower)
            CHECK_FAIL(i, "plan: %s, born at %lld, may only alias a buffer born before and dying at that step "
                       "(upper %lld); %s lives [%lld, %lld)", nm, (long long)b->lower, (long long)b->lower + 1,
                       nm2, (long long)a->lower, (long long)a->upper);
        if (taken[b->alias])
            CHECK_FAIL(i, "plan: %s: %s is already aliased by another buffer", nm, nm2);
        if ((b->flags & VMM_PLAN_UNPLANNED) && !(a->flags & VMM_PLAN_UNPLANNED))
            CHECK_FAIL(i, "plan: %s is unplanned but aliases %s, which is planned", nm, nm2);
        taken[b->alias] = 1;
    }
out:
    free(taken);
    return rc;
}
#undef CHECK_FAIL

VMM_API int vmm_plan_check(const vmm_plan_buffer *bufs, size_t n, size_t *bad)
{
    return plan_check(bufs, n, NULL, bad);
}

void plan_alias_roots(const vmm_plan_buffer *bufs, size_t n, size_t *root)
{
    /* Aliases point to buffers born strictly earlier (plan_check), so chains end. Each walk stops
     * at a buffer already resolved, then the path is filled in: O(n) in all. */
    for (size_t i = 0; i < n; i++)
        root[i] = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (root[j] == SIZE_MAX && (bufs[j].flags & VMM_PLAN_ALIAS))
            j = (size_t)bufs[j].alias;
        size_t r = root[j] != SIZE_MAX ? root[j] : j;
        for (size_t k = i; root[k] == SIZE_MAX;) {
            root[k] = r;
            if (!(bufs[k].flags & VMM_PLAN_ALIAS))
                break;
            k = (size_t)bufs[k].alias;
        }
    }
}

int plan_is_unplanned(const vmm_plan_buffer *bufs, const size_t *root, size_t i)
{
    return (bufs[root[i]].flags & VMM_PLAN_UNPLANNED) != 0;
}

typedef struct bevent {
    int64_t t;
    int64_t d; /* bytes starting (+) or ending (-) */
} bevent;

static int cmp_bevent(const void *a, const void *b)
{
    const bevent *x = a, *y = b;
    return (x->t > y->t) - (x->t < y->t);
}

/* Group members sorted by (group, position in the array); a merge sort keeps this reentrant
 * (qsort has no context argument in C11). */
static void sort_members(size_t *idx, size_t *tmp, size_t n, const vmm_plan_buffer *bufs)
{
    if (n < 2)
        return;
    size_t h = n / 2;
    sort_members(idx, tmp, h, bufs);
    sort_members(idx + h, tmp, n - h, bufs);
    size_t i = 0, j = h, k = 0;
    while (i < h && j < n) {
        const vmm_plan_buffer *a = &bufs[idx[i]], *b = &bufs[idx[j]];
        int take_right = b->group < a->group || (b->group == a->group && idx[j] < idx[i]);
        tmp[k++] = take_right ? idx[j++] : idx[i++];
    }
    while (i < h)
        tmp[k++] = idx[i++];
    while (j < n)
        tmp[k++] = idx[j++];
    memcpy(idx, tmp, n * sizeof *idx);
}

int plan_ctx_build_sel(plan_ctx *c, const vmm_plan_buffer *bufs, size_t n, const unsigned char *sel)
{
    memset(c, 0, sizeof *c);
    if (n >= UINT32_MAX / 2)
        return vmm_fail(VMM_EINVAL, "plan: too many buffers (%zu)", n);
    int rc = plan_check(bufs, n, NULL, NULL);
    if (rc)
        return rc;
    uint64_t total = 0;
    size_t ngrouped = 0;
    for (size_t i = 0; i < n; i++) {
        total += bufs[i].size + (bufs[i].alignment ? bufs[i].alignment : 1);
        if (total >> PLAN_MAX_BYTES_SHIFT)
            return vmm_fail(VMM_EINVAL, "plan: total of sizes too large");
        ngrouped += bufs[i].group >= 0;
    }
    c->nbuf = n;
    c->exact_items = 1;
    c->item_of = calloc(n ? n : 1, sizeof *c->item_of);
    c->rel = calloc(n ? n : 1, sizeof *c->rel);
    c->items = calloc(n ? n : 1, sizeof *c->items);
    c->chain = calloc(n ? n : 1, 1);
    c->key = calloc(n ? n : 1, sizeof *c->key);
    int64_t *lo = calloc(n ? n : 1, sizeof *lo), *hi = calloc(n ? n : 1, sizeof *hi);
    size_t *gidx = calloc(ngrouped ? ngrouped : 1, sizeof *gidx);
    size_t *gtmp = calloc(ngrouped ? ngrouped : 1, sizeof *gtmp);
    size_t *root = calloc(n ? n : 1, sizeof *root);
    int64_t *times = calloc(2 * n + 2, sizeof *times);
    bevent *ev = NULL;
    if (!c->item_of || !c->rel || !c->items || !c->chain || !c->key || !lo || !hi || !gidx || !gtmp || !root ||
        !times) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    plan_alias_roots(bufs, n, root);
    size_t ni = 0, ng = 0;
    for (size_t i = 0; i < n; i++) {
        c->item_of[i] = SIZE_MAX; /* not in this problem until placed in an item */
        if (plan_is_unplanned(bufs, root, i) || (sel && !sel[root[i]]))
            continue;
        if (bufs[i].group >= 0) {
            gidx[ng++] = i;
            continue;
        }
        if (root[i] != i)
            continue; /* an alias: joins its chain's item below */
        c->item_of[i] = ni;
        c->items[ni].size = bufs[i].size;
        c->items[ni].align = bufs[i].alignment ? bufs[i].alignment : 1;
        c->key[ni] = bufs[i].key;
        lo[ni] = bufs[i].lower;
        hi[ni] = bufs[i].upper;
        c->nplanned++;
        ni++;
    }
    /* Alias chains: one item at the root's offset, the largest member's size and alignment, over
     * the whole chain's lifetime (the root is born first). */
    for (size_t i = 0; i < n; i++) {
        size_t r = root[i];
        if (r == i || c->item_of[r] == SIZE_MAX)
            continue;
        size_t it = c->item_of[r];
        c->item_of[i] = it;
        c->chain[it] = 1;
        uint64_t al = bufs[i].alignment ? bufs[i].alignment : 1;
        if (bufs[i].size != c->items[it].size)
            c->exact_items = 0;
        c->items[it].size = bufs[i].size > c->items[it].size ? bufs[i].size : c->items[it].size;
        c->items[it].align = al > c->items[it].align ? al : c->items[it].align;
        hi[it] = bufs[i].upper > hi[it] ? bufs[i].upper : hi[it];
        c->nplanned++;
    }
    sort_members(gidx, gtmp, ng, bufs);
    for (size_t s = 0; s < ng;) {
        size_t e = s;
        while (e < ng && bufs[gidx[e]].group == bufs[gidx[s]].group)
            e++;
        /* Layout relative to a base aligned to the largest member alignment: then each member's
         * absolute offset is aligned exactly as vmm_plan_verify requires. */
        uint64_t align = 1, pos = 0;
        int64_t glo = bufs[gidx[s]].lower, ghi = bufs[gidx[s]].upper;
        for (size_t k = s; k < e; k++) {
            const vmm_plan_buffer *b = &bufs[gidx[k]];
            uint64_t a = b->alignment ? b->alignment : 1;
            align = a > align ? a : align;
            pos = plan_align_up(pos, a);
            c->rel[gidx[k]] = pos;
            c->item_of[gidx[k]] = ni;
            pos += b->size;
            glo = b->lower < glo ? b->lower : glo;
            ghi = b->upper > ghi ? b->upper : ghi;
        }
        c->items[ni].size = pos;
        c->items[ni].align = align;
        c->key[ni] = bufs[gidx[s]].key;
        c->nplanned += e - s;
        lo[ni] = glo;
        hi[ni] = ghi;
        ni++;
        s = e;
    }
    c->n = ni;
    size_t nt = 0;
    for (size_t i = 0; i < ni; i++) {
        times[nt++] = lo[i];
        times[nt++] = hi[i];
    }
    if (nt == 0) {
        times[nt++] = 0;
        times[nt++] = 1;
    }
    qsort(times, nt, sizeof *times, cmp_i64);
    size_t u = 0;
    for (size_t i = 0; i < nt; i++)
        if (u == 0 || times[i] != times[u - 1])
            times[u++] = times[i];
    c->slots = (uint32_t)(u > 1 ? u - 1 : 1);
    c->live = calloc((size_t)c->slots + 1, sizeof *c->live);
    c->time = malloc(((size_t)c->slots + 1) * sizeof *c->time);
    if (!c->live || !c->time) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    for (size_t i = 0; i < ni; i++) {
        c->items[i].lo = time_rank(times, u, lo[i]);
        c->items[i].hi = time_rank(times, u, hi[i]);
        c->live[c->items[i].lo] += c->items[i].size;
        c->live[c->items[i].hi] -= c->items[i].size; /* wraps, undone by the prefix sum */
    }
    memcpy(c->time, times, ((size_t)c->slots + 1) * sizeof *c->time);
    uint64_t cur = 0;
    for (uint32_t s = 0; s < c->slots; s++) {
        cur += c->live[s];
        c->live[s] = cur;
        if (cur > c->lower_bound)
            c->lower_bound = cur;
    }
    c->bound = c->lower_bound;
    if (!c->exact_items) {
        /* The items overstate chains of unequal sizes: the bound from the buffers themselves,
         * each chain member with its own size, a link counted once over the step it shares. */
        size_t ne = 0;
        ev = malloc((4 * n + 1) * sizeof *ev);
        if (!ev) {
            rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
            goto out;
        }
        for (size_t i = 0; i < ni; i++)
            if (!c->chain[i]) {
                ev[ne++] = (bevent){lo[i], (int64_t)c->items[i].size};
                ev[ne++] = (bevent){hi[i], -(int64_t)c->items[i].size};
            }
        for (size_t i = 0; i < n; i++) {
            if (c->item_of[i] == SIZE_MAX || !c->chain[c->item_of[i]])
                continue;
            ev[ne++] = (bevent){bufs[i].lower, (int64_t)bufs[i].size};
            ev[ne++] = (bevent){bufs[i].upper, -(int64_t)bufs[i].size};
            if (bufs[i].flags & VMM_PLAN_ALIAS) {
                const vmm_plan_buffer *t = &bufs[bufs[i].alias];
                int64_t m = (int64_t)(t->size < bufs[i].size ? t->size : bufs[i].size);
                ev[ne++] = (bevent){bufs[i].lower, -m};
                ev[ne++] = (bevent){t->upper, m};
            }
        }
        qsort(ev, ne, sizeof *ev, cmp_bevent);
        int64_t live = 0, peak = 0;
        for (size_t k = 0; k < ne; k++) {
            live += ev[k].d;
            if ((k + 1 == ne || ev[k + 1].t != ev[k].t) && live > peak)
                peak = live; /* after every event of one time */
        }
        c->bound = (uint64_t)peak;
    }
out:
    free(ev);
    free(root);
    free(lo);
    free(hi);
    free(gidx);
    free(gtmp);
    free(times);
    if (rc)
        plan_ctx_free(c);
    return rc;
}

int plan_ctx_build(plan_ctx *c, const vmm_plan_buffer *bufs, size_t n)
{
    return plan_ctx_build_sel(c, bufs, n, NULL);
}

void plan_ctx_free(plan_ctx *c)
{
    free(c->items);
    free(c->chain);
    free(c->key);
    free(c->live);
    free(c->time);
    free(c->item_of);
    free(c->rel);
    memset(c, 0, sizeof *c);
}

uint64_t plan_arena(const plan_ctx *c, const uint64_t *off)
{
    uint64_t a = 0;
    for (size_t i = 0; i < c->n; i++)
        if (off[i] + c->items[i].size > a)
            a = off[i] + c->items[i].size;
    return a;
}
