/* The tiling search: plans that meet the lower bound on instances where every time slot's live
 * bytes equal it (the perfect packings of generate.c, and any instance whose peak is reached at
 * every moment). There a plan at the bound leaves no byte idle at any slot, so every slot is
 * filled from 0 upwards without holes, and an item can only sit on a flat stretch of the filled
 * height ("skyline") within its lifetime. Take a maximal stretch [a, b) of
 * equal height h below the cap: the cell (slot a, height h) must be covered by an item starting
 * exactly at slot a (an item reaching back to a - 1 would overlap there, or sit on a hole) and
 * when a - 1 is higher (a wall); likewise the cell (b - 1, h) by an item ending exactly at b,
 * when slot b is higher. Such an item must never meet a slot above h. Where both sides are walls
 * the item must also fit between them, so it can be placed now: the search branches on such a
 * cell with the fewest candidates (as dancing links picks the column with the fewest rows; the
 * lowest stretch always has walls both sides), fails a node when any wall cell has none, and
 * places each item at its stretch's height. Identical items are tried once per node. Restarts with doubling node budgets
 * and a different tie order each (a fixed sequence: the search is anytime in nodes, as exact.c).
 * Other instances (some slot below the bound) are not for this search: plan_tile says so. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum {
    TILE_CLOCK_EVERY = 256, /* nodes between clock reads */
    TILE_MAX_LEVEL = 40,
};

typedef struct ts {
    const plan_ctx *c;
    uint64_t cap;
    uint32_t *lo_start, *lo_list; /* items by first slot (CSR) */
    uint32_t *hi_start, *hi_list; /* items by end slot (CSR, index = hi) */
    uint64_t *floor;              /* filled height per slot */
    uint64_t *pos;                /* offset, or UINT64_MAX */
    uint32_t *cand;               /* candidate stack */
    size_t ncand, capcand;
    int oom;
    size_t left;                  /* unplaced items */
    uint64_t nodes, budget, node_limit, restart;
    double deadline;
    int stopped;
} ts;

static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* Max filled height over slots [lo, hi). */
static uint64_t max_floor(const ts *s, uint32_t lo, uint32_t hi)
{
    uint64_t m = 0;
    for (uint32_t t = lo; t < hi; t++)
        m = s->floor[t] > m ? s->floor[t] : m;
    return m;
}

/* Items that can cover the cell against a wall at height h: side 0, a left wall at slot w (items
 * starting at w), side 1, a right wall at w (items ending at w). Each must be able to sit at h
 * some day: no slot of its lifetime above h. With limit (the other wall of a stretch with walls
 * both sides) they must also fit between the walls, i.e. be placeable now. */
static size_t cell_cands(ts *s, int side, uint32_t w, uint64_t h, int has_limit, uint32_t limit, uint32_t *out)
{
    const plan_item *items = s->c->items;
    size_t k = 0;
    uint32_t e0 = side ? s->hi_start[w] : s->lo_start[w], e1 = side ? s->hi_start[w + 1] : s->lo_start[w + 1];
    const uint32_t *list = side ? s->hi_list : s->lo_list;
    for (uint32_t e = e0; e < e1; e++) {
        uint32_t i = list[e];
        const plan_item *it = &items[i];
        if (s->pos[i] != UINT64_MAX || h % it->align || it->size > s->cap - h)
            continue;
        if (has_limit ? (side ? it->lo < limit : it->hi > limit) : max_floor(s, it->lo, it->hi) > h)
            continue;
        if (out)
            out[k] = i;
        k++;
    }
    return k;
}

static int tile_dfs(ts *s)
{
    if (s->left == 0)
        return 1;
    if (s->budget == 0 || s->nodes >= s->node_limit)
        return -1;
    if (s->nodes % TILE_CLOCK_EVERY == 0 && plan_now() > s->deadline) {
        s->stopped = 1;
        return -1;
    }
    s->budget--;
    s->nodes++;
    uint32_t S = s->c->slots;
    /* Branch on the wall cell of a stretch walled both sides (the lowest one is) with the fewest
     * candidates; a wall cell anywhere without one fails the node. */
    size_t best = SIZE_MAX;
    uint32_t ba = 0, bb = 0;
    int bside = 0;
    for (uint32_t a = 0; a < S;) {
        uint32_t b = a + 1;
        while (b < S && s->floor[b] == s->floor[a])
            b++;
        uint64_t h = s->floor[a];
        if (h < s->cap) {
            int lw = a == 0 || s->floor[a - 1] > h, rw = b == S || s->floor[b] > h;
            for (int side = 0; side < 2; side++) {
                if (!(side ? rw : lw))
                    continue;
                int both = lw && rw;
                size_t k = cell_cands(s, side, side ? b : a, h, both, side ? a : b, NULL);
                if (k == 0)
                    return 0;
                if (both && k < best) {
                    best = k;
                    ba = a, bb = b, bside = side;
                }
            }
        }
        a = b;
    }
    if (best == SIZE_MAX)
        return 0; /* items left but no room: cannot happen at zero slack */
    uint64_t h = s->floor[ba];
    size_t base = s->ncand;
    if (base + best > s->capcand) {
        size_t nc = 2 * (base + best);
        uint32_t *np = realloc(s->cand, nc * sizeof *np);
        if (!np) {
            s->oom = s->stopped = 1;
            return -1;
        }
        s->cand = np;
        s->capcand = nc;
    }
    uint32_t *cs = s->cand + base;
    size_t k = cell_cands(s, bside, bside ? bb : ba, h, 1, bside ? ba : bb, cs);
    s->ncand += k;
    /* tie order: larger first, then a rotation that differs per restart */
    for (size_t x = 1; x < k; x++) {
        uint32_t v = cs[x];
        size_t y = x;
        while (y > 0 && s->c->items[cs[y - 1]].size < s->c->items[v].size) {
            cs[y] = cs[y - 1];
            y--;
        }
        cs[y] = v;
    }
    size_t rot = s->restart && k ? (size_t)(mix(s->restart * 1000003u + s->nodes) % k) : 0;
    int st = 0;
    for (size_t x = 0; x < k && st == 0; x++) {
        uint32_t i = cs[(x + rot) % k];
        const plan_item *it = &s->c->items[i];
        int dup = 0; /* an identical item already tried here */
        for (size_t y = 0; y < x && !dup; y++) {
            const plan_item *o = &s->c->items[cs[(y + rot) % k]];
            dup = o->lo == it->lo && o->hi == it->hi && o->size == it->size && o->align == it->align;
        }
        if (dup)
            continue;
        s->pos[i] = h;
        s->left--;
        for (uint32_t t = it->lo; t < it->hi; t++)
            s->floor[t] = h + it->size;
        st = tile_dfs(s);
        if (st == 1)
            break;
        for (uint32_t t = it->lo; t < it->hi; t++)
            s->floor[t] = h;
        s->left++;
        s->pos[i] = UINT64_MAX;
    }
    s->ncand = base;
    return st;
}

int plan_tile_applies(const plan_ctx *c)
{
    if (c->n == 0)
        return 0;
    for (uint32_t t = 0; t < c->slots; t++)
        if (c->live[t] != c->lower_bound)
            return 0;
    return 1;
}

int plan_tile(const plan_ctx *c, double deadline, uint64_t node_limit, uint64_t *off, uint64_t *nodes,
              int *found)
{
    *found = 0;
    *nodes = 0;
    if (!plan_tile_applies(c))
        return VMM_OK;
    size_t n = c->n, S = c->slots;
    ts s;
    memset(&s, 0, sizeof s);
    s.c = c;
    s.cap = c->lower_bound;
    s.deadline = deadline;
    s.node_limit = node_limit ? node_limit : UINT64_MAX;
    s.lo_start = calloc(S + 2, sizeof *s.lo_start);
    s.hi_start = calloc(S + 2, sizeof *s.hi_start);
    s.lo_list = malloc(n * sizeof *s.lo_list);
    s.hi_list = malloc(n * sizeof *s.hi_list);
    s.floor = calloc(S, sizeof *s.floor);
    s.pos = malloc(n * sizeof *s.pos);
    s.capcand = 4 * n + 16; /* grows when a path holds more */
    s.cand = malloc(s.capcand * sizeof *s.cand);
    int rc = VMM_OK;
    if (!s.lo_start || !s.hi_start || !s.lo_list || !s.hi_list || !s.floor || !s.pos || !s.cand) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        s.lo_start[c->items[i].lo + 1]++;
        s.hi_start[c->items[i].hi + 1]++;
    }
    for (size_t t = 0; t <= S; t++) {
        s.lo_start[t + 1] += s.lo_start[t];
        s.hi_start[t + 1] += s.hi_start[t];
    }
    {
        uint32_t *fl = calloc(S + 1, sizeof *fl), *fh = calloc(S + 1, sizeof *fh);
        if (!fl || !fh) {
            free(fl);
            free(fh);
            rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
            goto out;
        }
        for (size_t i = 0; i < n; i++) {
            s.lo_list[s.lo_start[c->items[i].lo] + fl[c->items[i].lo]++] = (uint32_t)i;
            s.hi_list[s.hi_start[c->items[i].hi] + fh[c->items[i].hi]++] = (uint32_t)i;
        }
        free(fl);
        free(fh);
    }
    for (int lv = 0; lv <= TILE_MAX_LEVEL && !s.stopped && s.nodes < s.node_limit; lv++) {
        for (size_t i = 0; i < n; i++)
            s.pos[i] = UINT64_MAX;
        memset(s.floor, 0, S * sizeof *s.floor);
        s.left = n;
        s.ncand = 0;
        s.restart = (uint64_t)lv;
        s.budget = (uint64_t)(n + 1) << lv;
        int st = tile_dfs(&s);
        if (st == 1) {
            memcpy(off, s.pos, n * sizeof *off);
            *found = 1;
            break;
        }
        if (st == 0 && lv == 0)
            break; /* the first order completed: proven, no tiling */
    }
    *nodes = s.nodes;
    if (s.oom)
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
out:
    free(s.lo_start);
    free(s.hi_start);
    free(s.lo_list);
    free(s.hi_list);
    free(s.floor);
    free(s.pos);
    free(s.cand);
    return rc;
}
