/* The tiling search: plans that meet the lower bound on instances where every time slot's live
 * bytes equal it (the perfect packings of generate.c, and any instance whose peak is reached at
 * every moment). There a plan at the bound leaves no byte idle at any slot, so every slot fills
 * from 0 upwards without holes, and an item can only sit on a flat stretch of the filled height
 * ("skyline") over its whole lifetime. Take a maximal stretch [a, b) of equal height h below the
 * cap. When slot a - 1 is higher (a wall; or a is the edge), the cell (slot a, height h) must be
 * covered by an item starting exactly at a (one reaching back to a - 1 would overlap there), and
 * that item may never meet a slot above h; likewise the cell (b - 1, h) by an item ending exactly
 * at b when slot b is higher. With walls both sides the item must also fit between them, so it can
 * be placed now: the search branches on such a cell with the fewest candidates (as dancing links
 * picks the column with the fewest rows; the lowest stretch always has walls both sides; ties to
 * the lowest stretch forwards in time, to the leftmost backwards), fails a node when any wall cell
 * has none or the items that can fill up to a wall's top lack the bytes, and places each item at
 * its stretch's height. Identical items are tried once per node. A slot boundary no unplaced
 * item crosses splits the problem into parts solved on their own; parts proven impossible are
 * remembered (a hash cache). Restarts follow Luby's sequence of node
 * budgets, in both time directions (two searches, on two threads when the caller has them), each
 * with another tie order: a fixed sequence, so the search is anytime in nodes, as exact.c. Other instances (some slot below the bound) are not for this
 * search: plan_tile_applies says so. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum {
    TILE_CLOCK_EVERY = 256, /* nodes between clock reads */
    TILE_MAX_LEVEL = 40,
    TILE_MEMO = 1 << 16,    /* entries of the impossible-part cache (512 KiB per orientation) */
    TILE_UNIT = 2,          /* a restart's budget: TILE_UNIT (n + 1) nodes times 2^(Luby level) */
};

typedef struct ts {
    const plan_ctx *c;
    const plan_item *items;       /* c's items, in this search's orientation */
    uint64_t cap;
    uint32_t *lo_start, *lo_list; /* items by first slot (CSR) */
    uint32_t *hi_start, *hi_list; /* items by end slot (CSR, index = hi) */
    uint64_t *floor;              /* filled height per slot */
    uint64_t *pos;                /* offset, or UINT64_MAX */
    uint32_t *cand;               /* candidate stack */
    size_t ncand, capcand;
    int oom;
    uint64_t *diff;               /* basin_fits' scratch, slots + 1 */
    uint32_t *cuts;               /* per boundary t|t+1: unplaced items crossing it */
    uint64_t *memo;               /* parts proven impossible, by tile_key (a cache) */
    uint64_t *fw;                 /* Fenwick tree of the state hash, slots + 1 */
    uint64_t *best_pos;           /* the most items any restart placed so far, and how many */
    size_t *best_n;
    atomic_int *halt;             /* set when the other orientation made this one pointless */
    uint32_t *placed;             /* placement stack (for undo) */
    size_t nplaced;
    uint64_t nodes, budget, node_limit, restart;
    double deadline;
    int stopped;
    int lowest_first;             /* branching ties: 1 lowest stretch, 0 leftmost */
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
    const plan_item *items = s->items;
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

/* The bytes of unplaced items starting at w (side 0) or ending at w (side 1), all of them (*all)
 * and those that stay on the stretch's side of the limit (*inside). */
static void wall_sums(const ts *s, int side, uint32_t w, uint32_t limit, uint64_t *all, uint64_t *inside)
{
    uint32_t e0 = side ? s->hi_start[w] : s->lo_start[w], e1 = side ? s->hi_start[w + 1] : s->lo_start[w + 1];
    const uint32_t *list = side ? s->hi_list : s->lo_list;
    *all = *inside = 0;
    for (uint32_t e = e0; e < e1; e++) {
        uint32_t i = list[e];
        if (s->pos[i] != UINT64_MAX)
            continue;
        const plan_item *it = &s->items[i];
        *all += it->size;
        if (side ? it->lo >= limit : it->hi <= limit)
            *inside += it->size;
    }
}

static void fw_xor(ts *s, uint32_t t, uint64_t d);
static uint64_t zfloor(uint32_t t, uint64_t f);
static uint64_t zitem(uint32_t i);

/* Place item i at h (its lifetime's floor is flat at h). */
static void tile_put(ts *s, uint32_t i, uint64_t h)
{
    const plan_item *it = &s->items[i];
    s->pos[i] = h;
    s->placed[s->nplaced++] = i;
    fw_xor(s, it->lo, zitem(i));
    for (uint32_t t = it->lo; t < it->hi; t++) {
        fw_xor(s, t, zfloor(t, h) ^ zfloor(t, h + it->size));
        s->floor[t] = h + it->size;
    }
    for (uint32_t t = it->lo; t + 1 < it->hi; t++)
        s->cuts[t]--;
    if (s->nplaced > *s->best_n) { /* the deepest partial tiling: the fallback's start */
        *s->best_n = s->nplaced;
        memcpy(s->best_pos, s->pos, s->c->n * sizeof *s->best_pos);
    }
}

/* Take back the placements after mark, latest first. */
static void tile_undo(ts *s, size_t mark)
{
    while (s->nplaced > mark) {
        uint32_t i = s->placed[--s->nplaced];
        const plan_item *it = &s->items[i];
        fw_xor(s, it->lo, zitem(i));
        for (uint32_t t = it->lo; t < it->hi; t++) {
            fw_xor(s, t, zfloor(t, s->floor[t]) ^ zfloor(t, s->pos[i]));
            s->floor[t] = s->pos[i];
        }
        for (uint32_t t = it->lo; t + 1 < it->hi; t++)
            s->cuts[t]++;
        s->pos[i] = UINT64_MAX;
    }
}

/* A basin [a, b) at h between walls whose lower top is m: at every slot in it the rows [h, m) can
 * only be filled by unplaced items that stay inside [a, b). 1 when they have the bytes for it. */
static int basin_fits(ts *s, uint32_t a, uint32_t b, uint64_t need)
{
    uint64_t *d = s->diff;
    for (uint32_t t = a; t <= b; t++)
        d[t] = 0;
    for (uint32_t t = a; t < b; t++)
        for (uint32_t e = s->lo_start[t]; e < s->lo_start[t + 1]; e++) {
            uint32_t i = s->lo_list[e];
            if (s->pos[i] != UINT64_MAX || s->items[i].hi > b)
                continue;
            d[t] += s->items[i].size;
            d[s->items[i].hi] -= s->items[i].size; /* wraps, undone by the running sum */
        }
    uint64_t run = 0;
    for (uint32_t t = a; t < b; t++) {
        run += d[t];
        if (run < need)
            return 0;
    }
    return 1;
}

static int tile_node(ts *s, uint32_t lo, uint32_t hi);

/* The state hash: per slot, a value of its floor and of the unplaced items starting there,
 * kept in a Fenwick tree of XORs so that a part's hash is two prefix reads. */
static uint64_t zfloor(uint32_t t, uint64_t f) { return mix((uint64_t)t << 44 ^ f ^ UINT64_C(0xF100)); }
static uint64_t zitem(uint32_t i) { return mix(UINT64_C(0x51ED0000000) + i); }

static void fw_xor(ts *s, uint32_t t, uint64_t d)
{
    for (uint32_t i = t + 1; i <= s->c->slots; i += i & (0u - i))
        s->fw[i] ^= d;
}

static uint64_t fw_prefix(const ts *s, uint32_t t)
{
    uint64_t x = 0;
    for (uint32_t i = t; i > 0; i -= i & (0u - i))
        x ^= s->fw[i];
    return x;
}

/* The state of part [lo, hi): its floors and its unplaced items (all start inside it). */
static uint64_t tile_key(const ts *s, uint32_t lo, uint32_t hi)
{
    return (mix((uint64_t)lo << 32 | hi) ^ fw_prefix(s, hi) ^ fw_prefix(s, lo)) | 1; /* 0: empty entry */
}

/* Fill slots [lo, hi) (full slots, or the edges, on both sides) up to the cap. 1 done (the
 * placements stay), 0 impossible, -1 out of nodes or time; on 0 and -1 the state is as it was. */
static int tile_dfs(ts *s, uint32_t lo, uint32_t hi)
{
    /* A slot boundary no unplaced item crosses (as beside a full slot) splits the range into
     * parts solved on their own (each edge a wall: nothing reaches across it); one that fails
     * fails all, with no retrying of the others' choices. Guillotine cuts across time show up
     * here as the items below them get placed. */
    uint32_t a0 = lo;
    while (a0 < hi && s->floor[a0] >= s->cap)
        a0++;
    if (a0 == hi)
        return 1;
    uint32_t b0 = a0 + 1;
    while (b0 < hi && s->cuts[b0 - 1] > 0)
        b0++;
    if (b0 < hi) {
        size_t mark = s->nplaced;
        int st = tile_dfs(s, a0, b0);
        if (st == 1)
            st = tile_dfs(s, b0, hi);
        if (st != 1)
            tile_undo(s, mark);
        return st;
    }
    /* A part met before and proven impossible (same slots, same floors, same items left: other
     * branches above often lead back to it) is not searched again. */
    uint64_t key = tile_key(s, a0, b0);
    size_t slot = (size_t)(key & (TILE_MEMO - 1));
    if (s->memo[slot] == key)
        return 0;
    int res = tile_node(s, a0, b0);
    if (res == 0)
        s->memo[slot] = key;
    return res;
}

static int tile_node(ts *s, uint32_t lo, uint32_t hi)
{
    if (s->budget == 0 || s->nodes >= s->node_limit)
        return -1;
    if (s->nodes % TILE_CLOCK_EVERY == 0 &&
        (atomic_load_explicit(s->halt, memory_order_relaxed) || plan_now() > s->deadline)) {
        s->stopped = 1;
        return -1;
    }
    s->budget--;
    s->nodes++;
    /* Branch on the wall cell of a stretch walled both sides (the lowest one is) with the fewest
     * candidates; a wall cell anywhere without one fails the node. */
    size_t best = SIZE_MAX;
    uint64_t bh = UINT64_MAX;
    uint32_t ba = 0, bb = 0;
    int bside = 0;
    for (uint32_t a = lo; a < hi;) {
        uint32_t b = a + 1;
        while (b < hi && s->floor[b] == s->floor[a])
            b++;
        uint64_t h = s->floor[a];
        int lw = a == lo || s->floor[a - 1] > h, rw = b == hi || s->floor[b] > h;
        uint64_t hl = a == lo ? s->cap : s->floor[a - 1], hr = b == hi ? s->cap : s->floor[b];
        for (int side = 0; side < 2; side++) {
            if (!(side ? rw : lw))
                continue;
            int both = lw && rw;
            /* Against a wall the rows up to its top can only be filled by items that start (end)
             * right there; with walls both sides, up to the lower wall, by items that stay
             * between them. */
            uint64_t all, inside;
            wall_sums(s, side, side ? b : a, side ? a : b, &all, &inside);
            if (all < (side ? hr : hl) - h || (both && inside < (hl < hr ? hl : hr) - h))
                return 0;
            if (both && side == 0 && b - a > 2 && !basin_fits(s, a, b, (hl < hr ? hl : hr) - h))
                return 0;
            size_t k = cell_cands(s, side, side ? b : a, h, both, side ? a : b, NULL);
            if (k == 0)
                return 0;
            /* Ties: forwards in time to the lowest stretch, backwards to the leftmost. Leftmost
             * only, the search could hop between pieces tiled side by side under an address cut
             * (no time cut splits them: items above the cut cross), so a dead end in one was
             * backtracked through the other's choices (guillotine 1000/43: no tiling in 5 s);
             * lowest first tends to finish one level before the next, and solves it in about
             * 1.5 s. Neither rule wins everywhere, so the two directions differ in this too. */
            if (both && (k < best || (k == best && s->lowest_first && h < bh))) {
                best = k;
                bh = h;
                ba = a, bb = b, bside = side;
            }
        }
        a = b;
    }
    if (best == SIZE_MAX)
        return 0; /* cannot happen: the lowest stretch has walls both sides */
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
        while (y > 0 && s->items[cs[y - 1]].size < s->items[v].size) {
            cs[y] = cs[y - 1];
            y--;
        }
        cs[y] = v;
    }
    size_t rot = s->restart && k ? (size_t)(mix(s->restart * 1000003u + s->nodes) % k) : 0;
    int st = 0;
    for (size_t x = 0; x < k && st == 0; x++) {
        uint32_t i = cs[(x + rot) % k];
        const plan_item *it = &s->items[i];
        int dup = 0; /* an identical item already tried here */
        for (size_t y = 0; y < x && !dup; y++) {
            const plan_item *o = &s->items[cs[(y + rot) % k]];
            dup = o->lo == it->lo && o->hi == it->hi && o->size == it->size && o->align == it->align;
        }
        if (dup)
            continue;
        size_t mark = s->nplaced;
        tile_put(s, i, h);
        st = tile_dfs(s, lo, hi);
        if (st != 1)
            tile_undo(s, mark);
    }
    s->ncand = base;
    return st;
}

/* Luby's sequence of restart levels: 0 0 1 0 0 1 2 0 0 1 0 0 1 2 3 ... */
static int tile_luby(uint64_t i)
{
    uint64_t x = i + 1;
    for (;;) {
        int k = 1;
        while (k < 63 && ((UINT64_C(1) << k) - 1) < x)
            k++;
        if (x == (UINT64_C(1) << k) - 1)
            return k - 1;
        x -= (UINT64_C(1) << (k - 1)) - 1;
    }
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

static void ts_free(ts *s)
{
    free(s->lo_start);
    free(s->hi_start);
    free(s->lo_list);
    free(s->hi_list);
    free(s->floor);
    free(s->pos);
    free(s->cand);
    free(s->placed);
    free(s->diff);
    free(s->cuts);
    free(s->memo);
    free(s->fw);
    free((void *)s->items);
}

/* Orientation o: 1 reverses time. */
static int ts_init(ts *s, const plan_ctx *c, int o)
{
    size_t n = c->n, S = c->slots;
    memset(s, 0, sizeof *s);
    s->c = c;
    s->cap = c->lower_bound;
    s->lowest_first = o == 0;
    plan_item *items = malloc(n * sizeof *items);
    s->items = items;
    s->lo_start = calloc(S + 2, sizeof *s->lo_start);
    s->hi_start = calloc(S + 2, sizeof *s->hi_start);
    s->lo_list = malloc(n * sizeof *s->lo_list);
    s->hi_list = malloc(n * sizeof *s->hi_list);
    s->floor = calloc(S, sizeof *s->floor);
    s->pos = malloc(n * sizeof *s->pos);
    s->placed = malloc(n * sizeof *s->placed);
    s->diff = malloc((S + 1) * sizeof *s->diff);
    s->cuts = calloc(S, sizeof *s->cuts);
    s->memo = calloc(TILE_MEMO, sizeof *s->memo);
    s->fw = calloc(S + 1, sizeof *s->fw);
    s->capcand = 4 * n + 16; /* grows when a path holds more */
    s->cand = malloc(s->capcand * sizeof *s->cand);
    uint32_t *fl = calloc(S + 1, sizeof *fl), *fh = calloc(S + 1, sizeof *fh);
    int rc = VMM_OK;
    if (!items || !s->lo_start || !s->hi_start || !s->lo_list || !s->hi_list || !s->floor || !s->pos ||
        !s->placed || !s->diff || !s->cuts || !s->memo || !s->fw || !s->cand || !fl || !fh) {
        rc = VMM_EHOSTMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        items[i] = c->items[i];
        if (o & 1) {
            items[i].lo = (uint32_t)S - c->items[i].hi;
            items[i].hi = (uint32_t)S - c->items[i].lo;
        }
        s->lo_start[items[i].lo + 1]++;
        s->hi_start[items[i].hi + 1]++;
    }
    for (size_t t = 0; t <= S; t++) {
        s->lo_start[t + 1] += s->lo_start[t];
        s->hi_start[t + 1] += s->hi_start[t];
    }
    for (size_t i = 0; i < n; i++) {
        s->lo_list[s->lo_start[items[i].lo] + fl[items[i].lo]++] = (uint32_t)i;
        s->hi_list[s->hi_start[items[i].hi] + fh[items[i].hi]++] = (uint32_t)i;
    }
out:
    free(fl);
    free(fh);
    return rc;
}

/* One orientation's sequence of restarts, run by one thread (or taking turns with the other). */
typedef struct tile_run {
    ts s;
    uint64_t r, total, limit; /* next restart, nodes so far, node limit */
    uint64_t *best;           /* deepest partial tiling (a complete one when found) */
    size_t best_n;
    int done, found;
    atomic_int halt;          /* read by s's node loop */
    struct tile_run *other;
    int strict;               /* under a node limit: orientation 1 finding does not stop 0 */
    int o;
} tile_run;

/* One restart of x; sets done when x has nothing more to do. */
static void tile_step(tile_run *x)
{
    ts *s = &x->s;
    size_t n = s->c->n, S = s->c->slots;
    int lv = tile_luby(x->r);
    if (x->total >= x->limit || lv > TILE_MAX_LEVEL) {
        x->done = 1;
        return;
    }
    for (size_t i = 0; i < n; i++)
        s->pos[i] = UINT64_MAX;
    memset(s->floor, 0, S * sizeof *s->floor);
    memset(s->cuts, 0, S * sizeof *s->cuts);
    memset(s->fw, 0, (S + 1) * sizeof *s->fw);
    for (uint32_t t = 0; t < (uint32_t)S; t++)
        fw_xor(s, t, zfloor(t, 0));
    for (size_t i = 0; i < n; i++)
        fw_xor(s, s->items[i].lo, zitem((uint32_t)i));
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = s->items[i].lo; t + 1 < s->items[i].hi; t++)
            s->cuts[t]++;
    s->nplaced = 0;
    s->ncand = 0;
    s->restart = x->r++;
    s->nodes = 0;
    s->node_limit = x->limit - x->total;
    s->budget = (uint64_t)TILE_UNIT * (n + 1) << lv;
    int st = tile_dfs(s, 0, (uint32_t)S);
    x->total += s->nodes;
    if (st == 1) {
        memcpy(x->best, s->pos, n * sizeof *x->best);
        x->best_n = n;
        x->found = 1;
        /* the other orientation stops, unless a node limit asks for orientation 0's result */
        if (!x->strict || x->o == 0)
            atomic_store(&x->other->halt, 1);
    }
    if (st == 1 || st == 0 || s->stopped)
        x->done = 1; /* found; proven, no tiling; out of time, memory, or stopped by the other */
}

static void *tile_main(void *arg)
{
    tile_run *x = arg;
    while (!x->done)
        tile_step(x);
    return NULL;
}

int plan_tile(const plan_ctx *c, double deadline, uint64_t node_limit, int threads, uint64_t *off, uint64_t *alt,
              uint64_t *nodes, int *found)
{
    *found = 0;
    *nodes = 0;
    for (size_t i = 0; i < c->n; i++)
        off[i] = UINT64_MAX;
    if (alt)
        memcpy(alt, off, c->n * sizeof *alt);
    if (!plan_tile_applies(c))
        return VMM_OK;
    size_t n = c->n;
    /* Time forwards and backwards: the same instance searched from its other end (filling from
     * the top would be no different: items have no address of their own to mirror). Each
     * orientation has its own restarts and half the node limit, so the result under a node limit
     * is the same with one thread (taking turns) or two (side by side): orientation 0's tiling
     * when it finds one, else 1's; else the deeper partial, 0's on a tie. */
    tile_run run[2];
    memset(run, 0, sizeof run);
    int rc = VMM_OK;
    for (int o = 0; o < 2; o++) {
        tile_run *x = &run[o];
        x->o = o;
        x->other = &run[1 - o];
        x->strict = node_limit != 0;
        x->limit = node_limit ? (o == 0 ? node_limit - node_limit / 2 : node_limit / 2) : UINT64_MAX;
        x->done = x->limit == 0;
        atomic_init(&x->halt, 0);
        x->best = malloc((n ? n : 1) * sizeof *x->best);
        if (!rc)
            rc = ts_init(&x->s, c, o);
        if (!x->best)
            rc = VMM_EHOSTMEM;
        if (rc)
            continue;
        for (size_t i = 0; i < n; i++)
            x->best[i] = UINT64_MAX;
        x->s.best_pos = x->best;
        x->s.best_n = &x->best_n;
        x->s.halt = &x->halt;
        x->s.deadline = deadline;
    }
    if (!rc) {
        pthread_t th;
        if (threads >= 2 && pthread_create(&th, NULL, tile_main, &run[1]) == 0) {
            tile_main(&run[0]);
            pthread_join(th, NULL);
        } else {
            while (!run[0].done || !run[1].done)
                for (int o = 0; o < 2; o++)
                    if (!run[o].done)
                        tile_step(&run[o]);
        }
    }
    int oom = 0;
    if (!rc) {
        int w = run[0].found ? 0 : run[1].found ? 1 : run[1].best_n > run[0].best_n ? 1 : 0;
        memcpy(off, run[w].best, n * sizeof *off);
        if (alt && !run[w].found)
            memcpy(alt, run[1 - w].best, n * sizeof *alt);
        *found = run[w].found;
        *nodes = run[0].total + run[1].total;
        oom = run[0].s.oom || run[1].s.oom;
    }
    for (int o = 0; o < 2; o++) {
        ts_free(&run[o].s);
        free(run[o].best);
    }
    if (rc || oom)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    return VMM_OK;
}
