/* torch inductor's allocation tree: TemporalSplit nodes hold children that share one address range
 * at different times, SpatialSplit nodes put a left and a right part side by side. Items go in
 * largest first; an item that fits nowhere grows the tree at the top. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum node_kind { N_ALLOC, N_EMPTY, N_TEMPORAL, N_SPATIAL };

typedef struct tnode {
    int kind;
    uint64_t size;
    uint32_t lo, hi;   /* bounding lifetime of everything allocated below; lo == hi when none */
    uint32_t item;     /* N_ALLOC */
    uint32_t left, right; /* N_SPATIAL */
    uint32_t *kids;    /* N_TEMPORAL */
    uint32_t nkids, capkids;
} tnode;

typedef struct tree {
    const plan_ctx *c;
    uint64_t unit; /* every size is rounded to the largest alignment, so sums stay aligned */
    tnode *n;
    uint32_t count, cap;
    int oom;
} tree;

static uint32_t node_new(tree *t, int kind, uint64_t size)
{
    if (t->count == t->cap) {
        uint32_t nc = t->cap ? 2 * t->cap : 64;
        tnode *nn = realloc(t->n, (size_t)nc * sizeof *nn);
        if (!nn) {
            t->oom = 1;
            return 0;
        }
        t->n = nn;
        t->cap = nc;
    }
    tnode *x = &t->n[t->count];
    memset(x, 0, sizeof *x);
    x->kind = kind;
    x->size = size;
    return t->count++;
}

static void kid_add(tree *t, uint32_t node, uint32_t kid)
{
    tnode *x = &t->n[node];
    if (x->nkids == x->capkids) {
        uint32_t nc = x->capkids ? 2 * x->capkids : 2;
        uint32_t *nk = realloc(x->kids, (size_t)nc * sizeof *nk);
        if (!nk) {
            t->oom = 1;
            return;
        }
        x->kids = nk;
        x->capkids = nc;
    }
    x->kids[x->nkids++] = kid;
}

static uint64_t item_size(const tree *t, uint32_t item) { return plan_align_up(t->c->items[item].size, t->unit); }

static uint32_t temporal_of(tree *t, uint32_t kid)
{
    uint32_t x = node_new(t, N_TEMPORAL, 0);
    if (t->oom)
        return 0;
    kid_add(t, x, kid);
    t->n[x].size = t->n[kid].size;
    t->n[x].lo = t->n[kid].lo;
    t->n[x].hi = t->n[kid].hi;
    return x;
}

static uint32_t spatial_of(tree *t, uint32_t left_kid, uint64_t extra)
{
    uint32_t l = temporal_of(t, left_kid);
    uint32_t e = t->oom ? 0 : node_new(t, N_EMPTY, extra);
    uint32_t r = t->oom ? 0 : temporal_of(t, e);
    uint32_t s = t->oom ? 0 : node_new(t, N_SPATIAL, 0);
    if (t->oom)
        return 0;
    t->n[s].left = l;
    t->n[s].right = r;
    t->n[s].size = t->n[l].size + t->n[r].size;
    t->n[s].lo = t->n[l].lo;
    t->n[s].hi = t->n[l].hi;
    return s;
}

static int node_overlaps(const tree *t, uint32_t v, uint32_t lo, uint32_t hi)
{
    const tnode *x = &t->n[v];
    if (x->lo >= x->hi || hi <= x->lo || x->hi <= lo)
        return 0;
    switch (x->kind) {
    case N_ALLOC:
        return 1;
    case N_SPATIAL:
        return node_overlaps(t, x->left, lo, hi) || node_overlaps(t, x->right, lo, hi);
    case N_TEMPORAL:
        for (uint32_t k = 0; k < x->nkids; k++)
            if (node_overlaps(t, x->kids[k], lo, hi))
                return 1;
        return 0;
    default:
        return 0;
    }
}

static void widen(tnode *x, uint32_t lo, uint32_t hi)
{
    if (x->lo >= x->hi) {
        x->lo = lo;
        x->hi = hi;
    } else {
        x->lo = lo < x->lo ? lo : x->lo;
        x->hi = hi > x->hi ? hi : x->hi;
    }
}

static int tree_alloc(tree *t, uint32_t v, uint32_t item, int is_last);

static int temporal_alloc(tree *t, uint32_t v, uint32_t item, int is_last)
{
    const plan_item *it = &t->c->items[item];
    uint64_t slot = t->n[v].size, bsize = item_size(t, item);
    if (!is_last && bsize > slot)
        return 0;
    uint32_t hit = UINT32_MAX, nhit = 0;
    for (uint32_t k = 0; k < t->n[v].nkids && nhit < 2; k++)
        if (node_overlaps(t, t->n[v].kids[k], it->lo, it->hi)) {
            hit = t->n[v].kids[k];
            nhit++;
        }
    if (nhit > 1)
        return 0;
    if (nhit == 1) {
        if (!tree_alloc(t, hit, item, is_last))
            return 0;
    } else {
        if (t->n[v].nkids == 1 && t->n[t->n[v].kids[0]].kind == N_EMPTY)
            t->n[v].nkids = 0;
        if (bsize > slot) {
            /* Grow: pad every child up to the new size, then the item takes the whole slot. */
            for (uint32_t k = 0; k < t->n[v].nkids && !t->oom; k++) {
                uint32_t s = spatial_of(t, t->n[v].kids[k], bsize - t->n[t->n[v].kids[k]].size);
                t->n[v].kids[k] = s;
            }
            slot = bsize;
        }
        uint32_t a = node_new(t, N_ALLOC, bsize);
        if (t->oom)
            return 0;
        t->n[a].item = item;
        t->n[a].lo = it->lo;
        t->n[a].hi = it->hi;
        uint32_t kid = slot == bsize ? a : spatial_of(t, a, slot - bsize);
        if (t->oom)
            return 0;
        kid_add(t, v, kid);
        if (t->oom)
            return 0;
    }
    uint64_t m = 0;
    for (uint32_t k = 0; k < t->n[v].nkids; k++)
        m = t->n[t->n[v].kids[k]].size > m ? t->n[t->n[v].kids[k]].size : m;
    t->n[v].size = m;
    widen(&t->n[v], it->lo, it->hi);
    return 1;
}

static int tree_alloc(tree *t, uint32_t v, uint32_t item, int is_last)
{
    switch (t->n[v].kind) {
    case N_TEMPORAL:
        return temporal_alloc(t, v, item, is_last);
    case N_SPATIAL: {
        uint32_t l = t->n[v].left, r = t->n[v].right;
        if (!tree_alloc(t, l, item, 0) && !tree_alloc(t, r, item, is_last))
            return 0;
        t->n[v].size = t->n[l].size + t->n[r].size;
        widen(&t->n[v], t->c->items[item].lo, t->c->items[item].hi);
        return 1;
    }
    default:
        return 0;
    }
}

static void tree_offsets(const tree *t, uint32_t v, uint64_t at, uint64_t *off)
{
    const tnode *x = &t->n[v];
    switch (x->kind) {
    case N_ALLOC:
        off[x->item] = at;
        break;
    case N_SPATIAL:
        tree_offsets(t, x->left, at, off);
        tree_offsets(t, x->right, at + t->n[x->left].size, off);
        break;
    case N_TEMPORAL:
        for (uint32_t k = 0; k < x->nkids; k++)
            tree_offsets(t, x->kids[k], at, off);
        break;
    default:
        break;
    }
}

int plan_tree(const plan_ctx *c, uint64_t *off)
{
    tree t = {c, 1, NULL, 0, 0, 0};
    for (size_t i = 0; i < c->n; i++)
        t.unit = c->items[i].align > t.unit ? c->items[i].align : t.unit;
    uint32_t *order = malloc((c->n ? c->n : 1) * sizeof *order);
    int rc = order ? plan_make_order(c, PLAN_ORDER_SIZE, order) : VMM_EHOSTMEM;
    uint32_t root = rc ? 0 : node_new(&t, N_TEMPORAL, 0);
    for (size_t k = 0; !rc && !t.oom && k < c->n; k++) {
        uint32_t item = order[k];
        if (tree_alloc(&t, root, item, 1) || t.oom)
            continue;
        /* Fits nowhere: a new slot on top of everything (inductor's allocate_at_end). */
        uint32_t a = node_new(&t, N_ALLOC, item_size(&t, item));
        if (t.oom)
            break;
        t.n[a].item = item;
        t.n[a].lo = c->items[item].lo;
        t.n[a].hi = c->items[item].hi;
        uint32_t right = temporal_of(&t, a);
        uint32_t s = t.oom ? 0 : node_new(&t, N_SPATIAL, 0);
        uint32_t nr = t.oom ? 0 : node_new(&t, N_TEMPORAL, 0);
        if (t.oom)
            break;
        t.n[s].left = root;
        t.n[s].right = right;
        t.n[s].size = t.n[root].size + t.n[right].size;
        t.n[s].lo = t.n[root].lo;
        t.n[s].hi = t.n[root].hi;
        widen(&t.n[s], c->items[item].lo, c->items[item].hi);
        kid_add(&t, nr, s);
        t.n[nr].size = t.n[s].size;
        t.n[nr].lo = t.n[s].lo;
        t.n[nr].hi = t.n[s].hi;
        root = nr;
    }
    if (!rc && !t.oom)
        tree_offsets(&t, root, 0, off);
    for (uint32_t v = 0; v < t.count; v++)
        free(t.n[v].kids);
    free(t.n);
    free(order);
    if (rc || t.oom)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    return VMM_OK;
}
