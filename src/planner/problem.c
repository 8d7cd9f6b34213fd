/* The planning problem, the utilities every algorithm uses: validation, items (groups fused),
 * time compression, arena of a plan, the clock. Calls nothing above it (the dispatcher, vmm_plan,
 * is plan.c). */
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

static int validate_buffer(const vmm_plan_buffer *b, size_t i)
{
    if (b->size == 0)
        return vmm_fail(VMM_EINVAL, "plan: buffer %zu has size 0", i);
    if (b->size >> PLAN_MAX_BYTES_SHIFT)
        return vmm_fail(VMM_EINVAL, "plan: buffer %zu size %llu too large", i, (unsigned long long)b->size);
    if (b->upper <= b->lower)
        return vmm_fail(VMM_EINVAL, "plan: buffer %zu has empty lifetime [%lld, %lld)", i,
                        (long long)b->lower, (long long)b->upper);
    if (b->alignment & (b->alignment - 1))
        return vmm_fail(VMM_EINVAL, "plan: buffer %zu alignment %llu is not a power of two", i,
                        (unsigned long long)b->alignment);
    if (b->alignment >> PLAN_MAX_BYTES_SHIFT)
        return vmm_fail(VMM_EINVAL, "plan: buffer %zu alignment too large", i);
    return VMM_OK;
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

int plan_ctx_build(plan_ctx *c, const vmm_plan_buffer *bufs, size_t n)
{
    memset(c, 0, sizeof *c);
    if (n > 0 && !bufs)
        return vmm_fail(VMM_EINVAL, "plan: NULL buffer array");
    if (n >= UINT32_MAX / 2)
        return vmm_fail(VMM_EINVAL, "plan: too many buffers (%zu)", n);
    uint64_t total = 0;
    size_t ngrouped = 0;
    for (size_t i = 0; i < n; i++) {
        int rc = validate_buffer(&bufs[i], i);
        if (rc)
            return rc;
        total += bufs[i].size + (bufs[i].alignment ? bufs[i].alignment : 1);
        if (total >> PLAN_MAX_BYTES_SHIFT)
            return vmm_fail(VMM_EINVAL, "plan: total of sizes too large");
        ngrouped += bufs[i].group >= 0;
    }
    c->nbuf = n;
    c->item_of = calloc(n ? n : 1, sizeof *c->item_of);
    c->rel = calloc(n ? n : 1, sizeof *c->rel);
    c->items = calloc(n ? n : 1, sizeof *c->items);
    int64_t *lo = calloc(n ? n : 1, sizeof *lo), *hi = calloc(n ? n : 1, sizeof *hi);
    size_t *gidx = calloc(ngrouped ? ngrouped : 1, sizeof *gidx);
    size_t *gtmp = calloc(ngrouped ? ngrouped : 1, sizeof *gtmp);
    int64_t *times = calloc(2 * n + 2, sizeof *times);
    int rc = VMM_OK;
    if (!c->item_of || !c->rel || !c->items || !lo || !hi || !gidx || !gtmp || !times) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    size_t ni = 0, ng = 0;
    for (size_t i = 0; i < n; i++) {
        if (bufs[i].group >= 0) {
            gidx[ng++] = i;
            continue;
        }
        c->item_of[i] = ni;
        c->items[ni].size = bufs[i].size;
        c->items[ni].align = bufs[i].alignment ? bufs[i].alignment : 1;
        lo[ni] = bufs[i].lower;
        hi[ni] = bufs[i].upper;
        ni++;
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
out:
    free(lo);
    free(hi);
    free(gidx);
    free(gtmp);
    free(times);
    if (rc)
        plan_ctx_free(c);
    return rc;
}

void plan_ctx_free(plan_ctx *c)
{
    free(c->items);
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
