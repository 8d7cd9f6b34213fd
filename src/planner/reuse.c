/* torch inductor's memory_plan_reuse: a free list keyed by exact (size, alignment, caller's key).
 * Items are taken in time order; an item ending at a slot frees its bytes before the items
 * starting there are placed (lifetimes are half-open); a new item pops the most recently freed
 * offset of its class, or takes new bytes at the top. No splitting, no merging: the baseline
 * that inductor users compare against. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

typedef struct kitem {
    uint64_t size, align, key;
    uint32_t idx;
} kitem;

static int cmp_kitem(const void *a, const void *b)
{
    const kitem *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? -1 : 1;
    if (x->align != y->align)
        return x->align < y->align ? -1 : 1;
    if (x->key != y->key)
        return x->key < y->key ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

typedef struct tkey {
    uint32_t t, idx;
} tkey;

static int cmp_tkey(const void *a, const void *b)
{
    const tkey *x = a, *y = b;
    if (x->t != y->t)
        return x->t < y->t ? -1 : 1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

int plan_reuse(const plan_ctx *c, uint64_t *off)
{
    size_t n = c->n, nn = n ? n : 1;
    kitem *k = malloc(nn * sizeof *k);
    uint32_t *cls = malloc(nn * sizeof *cls);
    size_t *first = malloc((nn + 1) * sizeof *first); /* class q's stack: stack[first[q] ..) */
    size_t *top = calloc(nn, sizeof *top);
    uint64_t *stack = malloc(nn * sizeof *stack);
    tkey *born = malloc(nn * sizeof *born), *dies = malloc(nn * sizeof *dies);
    int rc = VMM_OK;
    if (!k || !cls || !first || !top || !stack || !born || !dies) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        k[i] = (kitem){c->items[i].size, c->items[i].align, c->key[i], (uint32_t)i};
    qsort(k, n, sizeof *k, cmp_kitem);
    size_t nq = 0;
    for (size_t j = 0; j < n; j++) {
        if (j == 0 || k[j].size != k[j - 1].size || k[j].align != k[j - 1].align || k[j].key != k[j - 1].key)
            first[nq++] = j; /* a class's stack holds at most its members */
        cls[k[j].idx] = (uint32_t)(nq - 1);
    }
    for (size_t i = 0; i < n; i++) {
        born[i] = (tkey){c->items[i].lo, (uint32_t)i};
        dies[i] = (tkey){c->items[i].hi, (uint32_t)i};
    }
    qsort(born, n, sizeof *born, cmp_tkey);
    qsort(dies, n, sizeof *dies, cmp_tkey);
    uint64_t end = 0;
    for (size_t b = 0, d = 0; b < n; b++) {
        uint32_t i = born[b].idx;
        for (; d < n && dies[d].t <= born[b].t; d++) {
            uint32_t q = cls[dies[d].idx];
            stack[first[q] + top[q]++] = off[dies[d].idx];
        }
        uint32_t q = cls[i];
        if (top[q]) {
            off[i] = stack[first[q] + --top[q]];
        } else {
            off[i] = plan_align_up(end, c->items[i].align);
            end = off[i] + c->items[i].size;
        }
    }
out:
    free(k);
    free(cls);
    free(first);
    free(top);
    free(stack);
    free(born);
    free(dies);
    return rc;
}
