/* The independent verifier and the lower bound. The verifier shares nothing with the algorithms
 * (no items, no time compression): it re-reads the caller's buffers and sweeps time itself. */
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

/* Position of (off, idx) in the active array sorted by (offset, index). */
static size_t active_pos(const vmm_plan_buffer *bufs, const size_t *act, size_t na, size_t idx)
{
    size_t lo = 0, hi = na;
    uint64_t off = bufs[idx].offset;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        uint64_t mo = bufs[act[mid]].offset;
        if (mo < off || (mo == off && act[mid] < idx))
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

VMM_API int vmm_plan_verify(const vmm_plan_buffer *bufs, size_t n, uint64_t *arena_bytes)
{
    if (n > 0 && !bufs)
        return vmm_fail(VMM_EINVAL, "verify: NULL buffer array");
    uint64_t arena = 0;
    size_t ng = 0;
    for (size_t i = 0; i < n; i++) {
        const vmm_plan_buffer *b = &bufs[i];
        uint64_t a = b->alignment ? b->alignment : 1;
        if (b->size == 0 || b->upper <= b->lower || (a & (a - 1)))
            return vmm_fail(VMM_EINVAL, "verify: buffer %zu invalid (size %llu, [%lld, %lld), alignment %llu)",
                            i, (unsigned long long)b->size, (long long)b->lower, (long long)b->upper,
                            (unsigned long long)b->alignment);
        if (b->offset % a)
            return vmm_fail(VMM_ECORRUPT, "verify: buffer %zu offset %llu not aligned to %llu", i,
                            (unsigned long long)b->offset, (unsigned long long)a);
        if (b->offset + b->size < b->offset)
            return vmm_fail(VMM_ECORRUPT, "verify: buffer %zu end overflows", i);
        if (b->offset + b->size > arena)
            arena = b->offset + b->size;
        ng += b->group >= 0;
    }
    member *m = malloc((ng ? ng : 1) * sizeof *m);
    int64_t *elo = malloc((n ? n : 1) * sizeof *elo), *ehi = malloc((n ? n : 1) * sizeof *ehi);
    event *ev = malloc((2 * n + 1) * sizeof *ev);
    size_t *act = malloc((n ? n : 1) * sizeof *act);
    int rc = VMM_OK;
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
    for (size_t i = 0; i < n; i++) {
        ev[2 * i] = (event){elo[i], 1, i};
        ev[2 * i + 1] = (event){ehi[i], 0, i};
    }
    qsort(ev, 2 * n, sizeof *ev, cmp_event);
    /* Live buffers sorted by offset are pairwise disjoint, so a new one overlaps some live buffer
     * exactly when it overlaps its neighbour below or above. */
    size_t na = 0;
    for (size_t k = 0; k < 2 * n; k++) {
        size_t i = ev[k].idx;
        size_t pos = active_pos(bufs, act, na, i);
        if (!ev[k].start) {
            memmove(act + pos, act + pos + 1, (na - pos - 1) * sizeof *act);
            na--;
            continue;
        }
        const vmm_plan_buffer *b = &bufs[i];
        size_t other = SIZE_MAX;
        if (pos > 0 && bufs[act[pos - 1]].offset + bufs[act[pos - 1]].size > b->offset)
            other = act[pos - 1];
        else if (pos < na && b->offset + b->size > bufs[act[pos]].offset)
            other = act[pos];
        if (other != SIZE_MAX) {
            rc = vmm_fail(VMM_ECORRUPT, "verify: buffers %zu and %zu overlap ([%llu, +%llu) and [%llu, +%llu) "
                          "both live at time %lld)", other, i, (unsigned long long)bufs[other].offset,
                          (unsigned long long)bufs[other].size, (unsigned long long)b->offset,
                          (unsigned long long)b->size, (long long)ev[k].t);
            goto out;
        }
        memmove(act + pos + 1, act + pos, (na - pos) * sizeof *act);
        act[pos] = i;
        na++;
    }
    if (arena_bytes)
        *arena_bytes = arena;
out:
    free(m);
    free(elo);
    free(ehi);
    free(ev);
    free(act);
    return rc;
}

VMM_API int vmm_plan_lower_bound(const vmm_plan_buffer *bufs, size_t n, uint64_t *out)
{
    if (!out)
        return vmm_fail(VMM_EINVAL, "lower bound: NULL output");
    plan_ctx c;
    int rc = plan_ctx_build(&c, bufs, n);
    if (rc)
        return rc;
    *out = c.lower_bound;
    plan_ctx_free(&c);
    return VMM_OK;
}
