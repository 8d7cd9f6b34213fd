/* ExecuTorch's two planners: naive (no reuse) and greedy shared objects. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

int plan_naive(const plan_ctx *c, uint64_t *off)
{
    uint64_t cur = 0;
    for (size_t i = 0; i < c->n; i++) {
        cur = plan_align_up(cur, c->items[i].align);
        off[i] = cur;
        cur += c->items[i].size;
    }
    return VMM_OK;
}

/* A shared object: a slot reused by items with pairwise disjoint lifetimes. Its lifetimes are kept
 * sorted by lo so that a conflict test is one binary search. */
typedef struct shared_obj {
    uint64_t size, align;
    uint32_t *lo, *hi; /* disjoint [lo, hi), sorted */
    size_t count, cap;
} shared_obj;

static int obj_conflicts(const shared_obj *o, uint32_t lo, uint32_t hi)
{
    size_t a = 0, b = o->count; /* first interval with lo >= hi is past any conflict */
    while (a < b) {
        size_t m = a + (b - a) / 2;
        if (o->lo[m] < hi)
            a = m + 1;
        else
            b = m;
    }
    return a > 0 && o->hi[a - 1] > lo;
}

static int obj_add(shared_obj *o, uint32_t lo, uint32_t hi)
{
    if (o->count == o->cap) {
        size_t nc = o->cap ? 2 * o->cap : 4;
        uint32_t *nl = realloc(o->lo, nc * sizeof *nl);
        if (!nl)
            return VMM_EHOSTMEM;
        o->lo = nl;
        uint32_t *nh = realloc(o->hi, nc * sizeof *nh);
        if (!nh)
            return VMM_EHOSTMEM;
        o->hi = nh;
        o->cap = nc;
    }
    size_t p = o->count;
    while (p > 0 && o->lo[p - 1] > lo) {
        o->lo[p] = o->lo[p - 1];
        o->hi[p] = o->hi[p - 1];
        p--;
    }
    o->lo[p] = lo;
    o->hi[p] = hi;
    o->count++;
    return VMM_OK;
}

int plan_greedy_shared(const plan_ctx *c, uint64_t *off)
{
    uint32_t *order = malloc((c->n ? c->n : 1) * sizeof *order);
    size_t *obj_of = malloc((c->n ? c->n : 1) * sizeof *obj_of);
    shared_obj *objs = calloc(c->n ? c->n : 1, sizeof *objs);
    size_t nobj = 0;
    int rc = VMM_OK;
    if (!order || !obj_of || !objs) {
        rc = VMM_EHOSTMEM;
        goto out;
    }
    rc = plan_make_order(c, PLAN_ORDER_SIZE, order);
    for (size_t k = 0; !rc && k < c->n; k++) {
        const plan_item *it = &c->items[order[k]];
        size_t best = SIZE_MAX, grow = SIZE_MAX;
        for (size_t j = 0; j < nobj; j++) {
            if (obj_conflicts(&objs[j], it->lo, it->hi))
                continue;
            if (objs[j].size >= it->size) {
                if (best == SIZE_MAX || objs[j].size < objs[best].size)
                    best = j;
            } else if (grow == SIZE_MAX || objs[j].size > objs[grow].size) {
                grow = j;
            }
        }
        if (best == SIZE_MAX)
            best = grow != SIZE_MAX ? grow : nobj++;
        shared_obj *o = &objs[best];
        o->size = it->size > o->size ? it->size : o->size;
        o->align = it->align > o->align ? it->align : o->align;
        obj_of[order[k]] = best;
        rc = obj_add(o, it->lo, it->hi);
    }
    if (!rc) {
        /* Objects end to end; an object's size is its largest member's, its alignment theirs. */
        uint64_t cur = 0;
        for (size_t j = 0; j < nobj; j++) {
            uint64_t sz = objs[j].size;
            cur = plan_align_up(cur, objs[j].align);
            objs[j].size = cur; /* the field holds the object's offset from here on */
            cur += sz;
        }
        for (size_t i = 0; i < c->n; i++)
            off[i] = objs[obj_of[i]].size;
    }
out:
    for (size_t j = 0; j < nobj; j++) {
        free(objs[j].lo);
        free(objs[j].hi);
    }
    free(objs);
    free(obj_of);
    free(order);
    return rc ? vmm_fail(VMM_EHOSTMEM, "plan: out of host memory") : VMM_OK;
}

typedef struct by_birth {
    uint32_t lo, idx;
} by_birth;

static int cmp_birth(const void *a, const void *b)
{
    const by_birth *x = a, *y = b;
    if (x->lo != y->lo)
        return x->lo < y->lo ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

int plan_bump(const plan_ctx *c, uint64_t *off)
{
    by_birth *o = malloc((c->n ? c->n : 1) * sizeof *o);
    if (!o)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    for (size_t i = 0; i < c->n; i++)
        o[i] = (by_birth){c->items[i].lo, (uint32_t)i};
    qsort(o, c->n, sizeof *o, cmp_birth);
    uint64_t cur = 0;
    for (size_t k = 0; k < c->n; k++) {
        const plan_item *it = &c->items[o[k].idx];
        cur = plan_align_up(cur, it->align);
        off[o[k].idx] = cur;
        cur += it->size;
    }
    free(o);
    return VMM_OK;
}
