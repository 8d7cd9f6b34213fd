/* Improvement after the heuristics ("squeaky wheel" reordering): the items that end above the
 * lower bound are the ones the placement order served too late, so they move up the order, the
 * order is placed again, and the lowest arena seen is kept. The first order is the best plan's
 * own (items by offset), so the search starts next to it. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum {
    /* Iterations without a new best before giving up: on the real traces a gain came within two
     * iterations or not at all (bert_base cycles between two arenas; docs/planner.md). */
    PLAN_IMPROVE_PATIENCE = 8,
};
/* How far a blamed item moves up, in units of n, scaled by how far above the bound it ends
 * relative to the arena's excess: 2 sends the item at the top to the front, the ones just above
 * the bound up a little. Smaller steps (0.05, 0.5 of n) left pangu_2.6B's arena unchanged. */
#define PLAN_IMPROVE_JUMP 2.0

typedef struct prio {
    double key;
    uint32_t idx;
} prio;

static int cmp_prio(const void *a, const void *b)
{
    const prio *x = a, *y = b;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Sort by key and renumber the keys 0..n-1 (positions in the order). */
static void prio_settle(prio *p, size_t n)
{
    qsort(p, n, sizeof *p, cmp_prio);
    for (size_t k = 0; k < n; k++)
        p[k].key = (double)k;
}

int plan_improve(const plan_ctx *c, uint64_t target, double deadline, uint64_t *off)
{
    size_t n = c->n;
    uint64_t best = plan_arena(c, off);
    if (target < c->lower_bound)
        target = c->lower_bound;
    if (n < 2 || best <= target)
        return VMM_OK;
    prio *p = malloc(n * sizeof *p);
    uint32_t *order = malloc(n * sizeof *order);
    uint64_t *cur = malloc(n * sizeof *cur);
    int rc = VMM_OK;
    if (!p || !order || !cur) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        p[i].key = (double)off[i]; /* by offset, ties by index (prio_settle) */
        p[i].idx = (uint32_t)i;
    }
    prio_settle(p, n);
    /* The first blame comes from the incoming plan itself (placing its order again would mostly
     * give it back). */
    memcpy(cur, off, n * sizeof *cur);
    uint64_t a = best;
    for (int stale = 0; stale < PLAN_IMPROVE_PATIENCE && plan_now() < deadline; stale++) {
        for (size_t k = 0; k < n; k++) {
            uint64_t top = cur[p[k].idx] + c->items[p[k].idx].size;
            if (top > c->lower_bound)
                p[k].key -= PLAN_IMPROVE_JUMP * (double)n * (double)(top - c->lower_bound) /
                            (double)(a - c->lower_bound);
        }
        prio_settle(p, n);
        for (size_t k = 0; k < n; k++)
            order[k] = p[k].idx;
        rc = plan_place(c, order, PLAN_FIT_FIRST, cur);
        if (rc)
            break;
        a = plan_arena(c, cur);
        if (a < best) {
            best = a;
            stale = -1;
            memcpy(off, cur, n * sizeof *off);
        }
        if (best <= target || a <= c->lower_bound)
            break;
    }
out:
    free(p);
    free(order);
    free(cur);
    return rc;
}
