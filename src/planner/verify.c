/* The independent verifier and the lower bound. The verifier shares nothing with the algorithms
 * (no items, no time compression): it re-reads the caller's buffers and sweeps time itself. Of
 * problem.c it uses the input rules only (plan_check) and, for the bound, the items. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

typedef struct member {
    int64_t group;
    size_t idx;
} member;

static int cmp_member(const void *a, const void *b)
{
    const member *x = a, *y = b;
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

typedef struct event {
    int64_t t;
    int start; /* 0 = end: at equal times ends go first, lifetimes being half-open */
    size_t idx;
} event;

static int cmp_event(const void *a, const void *b)
{
    const event *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    if (x->start != y->start)
        return x->start - y->start;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* (arena, offset, index) of buffer i, the order of the active array. */
static int active_less(const vmm_plan_buffer *bufs, size_t i, size_t j)
{
    if (bufs[i].arena != bufs[j].arena)
        return bufs[i].arena < bufs[j].arena;
    if (bufs[i].offset != bufs[j].offset)
        return bufs[i].offset < bufs[j].offset;
    return i < j;
}

static size_t active_pos(const vmm_plan_buffer *bufs, const size_t *act, size_t na, size_t idx)
{
    size_t lo = 0, hi = na;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (active_less(bufs, act[mid], idx))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* i and j may share bytes: one alias chain (in place), at the same offset. */
static int shares(const vmm_plan_buffer *bufs, const size_t *chain, size_t i, size_t j)
{
    return chain[i] == chain[j] && bufs[i].offset == bufs[j].offset;
}

/* The live buffer that b = act[pos] (just inserted) overlaps, or SIZE_MAX. The live ones sorted by
 * (arena, offset) are disjoint but for clusters of one chain at one offset: look past b's own
 * cluster to the next one above (its offset is what counts) and the next one below (each member:
 * they differ in size). */
static size_t overlapping(const vmm_plan_buffer *bufs, const size_t *chain, const size_t *act, size_t na,
                          size_t pos)
{
    size_t i = act[pos];
    const vmm_plan_buffer *b = &bufs[i];
    size_t up = pos + 1;
    while (up < na && shares(bufs, chain, i, act[up]))
        up++;
    if (up < na && bufs[act[up]].arena == b->arena && b->offset + b->size > bufs[act[up]].offset)
        return act[up];
    size_t dn = pos;
    while (dn > 0 && shares(bufs, chain, i, act[dn - 1]))
        dn--;
    if (dn == 0)
        return SIZE_MAX;
    size_t d = act[dn - 1];
    if (bufs[d].arena != b->arena)
        return SIZE_MAX;
    for (size_t k = dn; k > 0 && bufs[act[k - 1]].arena == b->arena && bufs[act[k - 1]].offset == bufs[d].offset;
         k--)
        if (bufs[act[k - 1]].offset + bufs[act[k - 1]].size > b->offset)
            return act[k - 1];
    return SIZE_MAX;
}

VMM_API int vmm_plan_verify(const vmm_plan_buffer *bufs, size_t n, uint64_t *arena_bytes)
{
    if (n > 0 && !bufs)
        return vmm_fail(VMM_EINVAL, "verify: NULL buffer array");
    uint64_t arena[VMM_PLAN_MAX_ARENAS] = {0};
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        const vmm_plan_buffer *b = &bufs[i];
        uint64_t a = b->alignment ? b->alignment : 1;
        if (b->size == 0 || b->upper <= b->lower || (a & (a - 1)))
            return vmm_fail(VMM_EINVAL, "verify: buffer %zu invalid (size %llu, [%lld, %lld), alignment %llu)",
                            i, (unsigned long long)b->size, (long long)b->lower, (long long)b->upper,
                            (unsigned long long)b->alignment);
    }
    int rc = plan_check(bufs, n, NULL, NULL); /* arenas, flags, the alias rules */
    if (rc)
        return rc;
    size_t *chain = malloc((n ? n : 1) * sizeof *chain);
    if (!chain)
        return vmm_fail(VMM_EHOSTMEM, "verify: out of host memory");
    /* Chains followed here on their own (no code shared with the planner's items). */
    for (size_t i = 0; i < n; i++) {
        size_t j = i;
        while (bufs[j].flags & VMM_PLAN_ALIAS)
            j = (size_t)bufs[j].alias;
        chain[i] = j;
    }
    for (size_t i = 0; i < n; i++) {
        const vmm_plan_buffer *b = &bufs[i];
        uint64_t a = b->alignment ? b->alignment : 1;
        if (bufs[chain[i]].flags & VMM_PLAN_UNPLANNED)
            continue; /* the runtime's: no bytes of any arena */
        if (b->offset % a) {
            free(chain);
            return vmm_fail(VMM_ECORRUPT, "verify: buffer %zu offset %llu not aligned to %llu", i,
                            (unsigned long long)b->offset, (unsigned long long)a);
        }
        if (b->offset + b->size < b->offset) {
            free(chain);
            return vmm_fail(VMM_ECORRUPT, "verify: buffer %zu end overflows", i);
        }
        if (b->offset + b->size > arena[b->arena])
            arena[b->arena] = b->offset + b->size;
        ng += b->group >= 0;
    }
    member *m = malloc((ng ? ng : 1) * sizeof *m);
    int64_t *elo = malloc((n ? n : 1) * sizeof *elo), *ehi = malloc((n ? n : 1) * sizeof *ehi);
    event *ev = malloc((2 * n + 1) * sizeof *ev);
    size_t *act = malloc((n ? n : 1) * sizeof *act);
    if (!m || !elo || !ehi || !ev || !act) {
        rc = vmm_fail(VMM_EHOSTMEM, "verify: out of host memory");
        goto out;
    }
    for (size_t i = 0, k = 0; i < n; i++) {
        elo[i] = bufs[i].lower;
        ehi[i] = bufs[i].upper;
        if (bufs[i].group >= 0)
            m[k++] = (member){bufs[i].group, i};
    }
    qsort(m, ng, sizeof *m, cmp_member);
    /* Groups: members adjacent in array order; each member conflicts over the group's whole span. */
    for (size_t s = 0; s < ng;) {
        size_t e = s + 1;
        int64_t lo = bufs[m[s].idx].lower, hi = bufs[m[s].idx].upper;
        while (e < ng && m[e].group == m[s].group) {
            const vmm_plan_buffer *p = &bufs[m[e - 1].idx], *q = &bufs[m[e].idx];
            uint64_t qa = q->alignment ? q->alignment : 1;
            uint64_t want = (p->offset + p->size + qa - 1) / qa * qa;
            if (q->offset != want) {
                rc = vmm_fail(VMM_ECORRUPT, "verify: group %lld broken: buffer %zu at %llu, expected %llu "
                              "(right after buffer %zu)", (long long)q->group, m[e].idx,
                              (unsigned long long)q->offset, (unsigned long long)want, m[e - 1].idx);
                goto out;
            }
            lo = q->lower < lo ? q->lower : lo;
            hi = q->upper > hi ? q->upper : hi;
            e++;
        }
        for (size_t k = s; k < e; k++) {
            elo[m[k].idx] = lo;
            ehi[m[k].idx] = hi;
        }
        s = e;
    }
    size_t nev = 0;
    for (size_t i = 0; i < n; i++) {
        if (bufs[chain[i]].flags & VMM_PLAN_UNPLANNED)
            continue;
        ev[nev++] = (event){elo[i], 1, i};
        ev[nev++] = (event){ehi[i], 0, i};
    }
    qsort(ev, nev, sizeof *ev, cmp_event);
    /* Live buffers sorted by offset are pairwise disjoint, so a new one overlaps some live buffer
     * exactly when it overlaps its neighbour below or above. */
    size_t na = 0;
    for (size_t k = 0; k < nev; k++) {
        size_t i = ev[k].idx;
        size_t pos = active_pos(bufs, act, na, i);
        if (!ev[k].start) {
            memmove(act + pos, act + pos + 1, (na - pos - 1) * sizeof *act);
            na--;
            continue;
        }
        const vmm_plan_buffer *b = &bufs[i];
        memmove(act + pos + 1, act + pos, (na - pos) * sizeof *act);
        act[pos] = i;
        na++;
        size_t other = overlapping(bufs, chain, act, na, pos);
        if (other != SIZE_MAX) {
            rc = vmm_fail(VMM_ECORRUPT, "verify: buffers %zu and %zu overlap ([%llu, +%llu) and [%llu, +%llu) "
                          "both live at time %lld)", other, i, (unsigned long long)bufs[other].offset,
                          (unsigned long long)bufs[other].size, (unsigned long long)b->offset,
                          (unsigned long long)b->size, (long long)ev[k].t);
            goto out;
        }
    }
    if (arena_bytes) {
        uint64_t sum = 0;
        for (int a = 0; a < VMM_PLAN_MAX_ARENAS; a++)
            sum += arena[a];
        *arena_bytes = sum;
    }
out:
    free(chain);
    free(m);
    free(elo);
    free(ehi);
    free(ev);
    free(act);
    return rc;
}

/* Bound of the planned buffers of arena a (a < 0: of each arena, summed). */
static int bound_of(const vmm_plan_buffer *bufs, size_t n, int a, uint64_t *out)
{
    if (!out)
        return vmm_fail(VMM_EINVAL, "lower bound: NULL output");
    int rc = plan_check(bufs, n, NULL, NULL);
    if (rc)
        return rc;
    unsigned char *sel = malloc(n ? n : 1);
    if (!sel)
        return vmm_fail(VMM_EHOSTMEM, "lower bound: out of host memory");
    uint64_t sum = 0;
    for (int id = a < 0 ? 0 : a; !rc && id < (a < 0 ? VMM_PLAN_MAX_ARENAS : a + 1); id++) {
        int any = 0;
        for (size_t i = 0; i < n; i++)
            any |= sel[i] = bufs[i].arena == (uint32_t)id;
        if (!any)
            continue;
        plan_ctx c;
        rc = plan_ctx_build_sel(&c, bufs, n, sel);
        if (!rc)
            sum += c.bound;
        plan_ctx_free(&c);
    }
    free(sel);
    if (!rc)
        *out = sum;
    return rc;
}

VMM_API int vmm_plan_lower_bound(const vmm_plan_buffer *bufs, size_t n, uint64_t *out)
{
    return bound_of(bufs, n, -1, out);
}

VMM_API int vmm_plan_lower_bound_arena(const vmm_plan_buffer *bufs, size_t n, uint32_t arena, uint64_t *out)
{
    if (arena >= VMM_PLAN_MAX_ARENAS)
        return vmm_fail(VMM_EINVAL, "lower bound: unknown arena %u", arena);
    return bound_of(bufs, n, (int)arena, out);
}
