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
 * remembered (a hash cache). A dead end names the placements that cause it (the cells that make
 * a wall cell, the items that turn candidates down), and a node whose candidate failed for
 * placements made before it fails at once, with that cause (conflict-directed backjumping: a
 * dead end in one piece no longer backtracks through the choices of pieces beside it). An item
 * refuted at a cell is not tried right on top of a later candidate with its lifetime (the same
 * pair swapped). A failed node's cause, when short, is kept across restarts as a nogood (placements
 * no tiling holds together), watched on two of its placements: a placement that completes one
 * fails at once, and one that leaves a single placement of it missing bars that one while it stays
 * (so a later restart does not rediscover what an earlier one learned). A node evaluates again
 * only the stretches a change since it last looked can affect (the stretch cache: exact, it
 * saves time, not nodes). Restarts follow Luby's sequence of node
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
    /* A restart's budget: TILE_UNIT (n + 1) nodes times 2^(Luby level). 8, not 2: with
     * backjumping a longer run pays (13 of 31 hard instances tiled in 1,000,000 nodes against 9). */
    TILE_UNIT = 8,
    TILE_CBJ_MAX = 8192,    /* most items for backjumping: (n + 1) n bits (8 MiB per orientation) */
    /* Nogoods: the longest cause kept (24: 12 and 48 tiled as many of 40 hard instances, 64
     * fewer), and the most literals kept (4 MiB per orientation), the older half forgotten at a
     * restart beyond half of that. */
    TILE_NG_LEN = 24,
    TILE_NG_LITS = 1 << 18,
    /* Watch lists per item and per bucket of offsets (a placement scans only the nogoods
     * watching the item at offsets in its bucket, not those at its other offsets). */
    TILE_WB = 16, /* 8% less time per node than one list per item (alternate 500/336) */
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
    uint64_t *zcut;               /* bit t: cuts[t] == 0 (a split point, found a word at a time) */
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
    /* Conflict-directed backjumping: a failure comes with the set of placements (by level, the
     * index in placed[]) that cause it, a bitset of nw words; acc holds one per active node
     * (indexed by nplaced at its entry). NULL acc: too many items for the n^2 bits, and a
     * failure is blamed on every placement (chronological backtracking). */
    uint64_t *why, *acc;
    size_t nw;
    uint32_t *lvl;                /* per placed item: its level */
    uint32_t *col_start, *col_n;  /* per slot: the placed items there, bottom up (CSR of item ids) */
    uint32_t *col;
    /* Swaps: when X failed at a cell and Y with X's lifetime is tried there, X right on top of Y
     * is X first with Y on top (refuted) again. Such (item, offset, level) are barred while Y
     * stays; forb_cnt counts an item's entries. */
    struct tile_forb {
        uint32_t item, level;
        uint64_t at;
    } *forb;
    size_t nforb, capforb;
    uint32_t *forb_cnt;
    /* Nogoods: the causes of failed nodes, kept across restarts (the instance's facts, not the
     * path's). A nogood is a set of placements (item at offset) that no tiling holds all of; it is
     * watched on two of them (per item, the nogoods watching it), so a placement looks only at
     * the nogoods watching it, and one that becomes all placed fails the placement at once. */
    struct tile_lit {
        uint32_t item;
        uint64_t at;
    } *ng_lit;
    size_t ng_nlit, ng_caplit;
    struct tile_ng {
        uint32_t start, len, w[2]; /* literals ng_lit[start .. start + len); watched: w[0], w[1] */
    } *ng;
    size_t nng, capng;
    struct tile_watch {
        uint64_t at;                /* the watched literal's offset (no look at the nogood when not h) */
        uint32_t g;
    } **wl;                         /* per item and offset bucket (wbucket): the nogoods watching it */
    uint32_t *wl_n, *wl_cap;
    int64_t ng_hit;                 /* the nogood the latest placement completed, or -1 */
    uint32_t node_lo, node_hi;      /* slots of the node placing now (ng_local) */
    /* Units: nogoods all of whose placements but one (item at offset) are made, so that one is
     * barred; found when a placement moves a watch, kept while it stays (level: its index). */
    struct tile_unit {
        uint32_t item, g, level;
        uint64_t at;
    } *unit;
    size_t nunit, capunit;
    uint32_t *unit_cnt;
    /* The stretch cache: a node's scan of the skyline evaluates a stretch again only when a slot it
     * depends on changed since (its slots, its walls', and the lifetimes of its walls' items). A
     * change (a floor, or an item's bars) stamps the slot with the clock in a max segment tree
     * over slots 0..slots; an entry (per stretch start) is good while no slot of its window has a
     * later stamp. */
    struct tile_sc {
        uint64_t stamp, h;
        uint32_t b, lo, hi, k[2];
    } *sc;
    uint64_t *seg, clock;
    uint32_t segn;
    uint32_t *reach0, *reach1;    /* per slot w: the latest end of items starting at w, the earliest start of items ending at w */
} ts;

int vmm_plan_tile_no_cache;

static uint64_t mix(uint64_t x)
{
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* Slot t changed (its floor, or the bars of an item starting or ending there). */
static void sc_touch(ts *s, uint32_t t)
{
    uint64_t v = ++s->clock;
    for (uint32_t i = t + s->segn; i > 0; i >>= 1)
        s->seg[i] = v; /* v is the latest stamp: every node above takes it */
}

/* An item's bars changed: the cells it is a candidate of (its first slot and its end). */
static void sc_touch_item(ts *s, uint32_t j)
{
    if (s->sc) {
        sc_touch(s, s->items[j].lo);
        sc_touch(s, s->items[j].hi);
    }
}

/* The latest stamp of slots [l, r]. */
static uint64_t sc_max(const ts *s, uint32_t l, uint32_t r)
{
    uint64_t m = 0;
    for (uint32_t a = l + s->segn, b = r + s->segn + 1; a < b; a >>= 1, b >>= 1) {
        if (a & 1)
            m = s->seg[a] > m ? s->seg[a] : m, a++;
        if (b & 1)
            b--, m = s->seg[b] > m ? s->seg[b] : m;
    }
    return m;
}

/* 1 when every placement of nogood ng is of an item meeting the slots of the node placing now. A
 * nogood is a fact about the whole instance, but one naming a placement of another part (parts
 * split apart are solved one after the other, and an earlier one's placements are undone when a
 * later one fails) would give a failure a cause that lacks a placement it needs; such a nogood is
 * not used there (only less pruning). */
static int ng_local(const ts *s, const struct tile_ng *ng)
{
    const struct tile_lit *l = s->ng_lit + ng->start;
    for (uint32_t q = 0; q < ng->len; q++) {
        const plan_item *it = &s->items[l[q].item];
        if (it->lo >= s->node_hi || it->hi <= s->node_lo)
            return 0;
    }
    return 1;
}

/* 1 when item i may not go to h: a swap of a refuted pair, or a nogood whose other placements are
 * all made. Adds the reason to w when given: what refuted the pair's first try, and the placement
 * of the pair's second; or the nogood's other placements. */
static int barred(const ts *s, uint32_t i, uint64_t h, uint64_t *w)
{
    if (s->forb_cnt && s->forb_cnt[i])
        for (size_t e = s->nforb; e > 0; e--) {
            const struct tile_forb *f = &s->forb[e - 1];
            if (f->item != i || f->at != h)
                continue;
            if (w) {
                const uint64_t *r = s->acc + (size_t)f->level * s->nw;
                for (size_t k = 0; k < s->nw; k++)
                    w[k] |= r[k];
                w[f->level / 64] |= UINT64_C(1) << (f->level % 64);
            }
            return 1;
        }
    if (!s->unit_cnt || !s->unit_cnt[i])
        return 0;
    for (size_t e = s->nunit; e > 0; e--) {
        const struct tile_unit *u = &s->unit[e - 1];
        if (u->item != i || u->at != h || !ng_local(s, &s->ng[u->g]))
            continue;
        if (w) {
            const struct tile_ng *ng = &s->ng[u->g];
            const struct tile_lit *l = s->ng_lit + ng->start;
            for (uint32_t q = 0; q < ng->len; q++)
                if (l[q].item != i)
                    w[s->lvl[l[q].item] / 64] |= UINT64_C(1) << (s->lvl[l[q].item] % 64);
        }
        return 1;
    }
    return 0;
}

/* Add to w the reasons of the candidates of a walled-both-sides cell that barred() turns down. */
static void why_barred(const ts *s, uint64_t *w, int side, uint32_t t, uint64_t h)
{
    if (!s->acc)
        return;
    uint32_t e0 = side ? s->hi_start[t] : s->lo_start[t], e1 = side ? s->hi_start[t + 1] : s->lo_start[t + 1];
    const uint32_t *list = side ? s->hi_list : s->lo_list;
    for (uint32_t e = e0; e < e1; e++)
        if (s->pos[list[e]] == UINT64_MAX)
            barred(s, list[e], h, w);
}

/* Items that can cover the cell against a wall at height h: side 0, a left wall at slot w (items
 * starting at w), side 1, a right wall at w (items ending at w). Each must be able to sit at h
 * some day: no slot of its lifetime above h. limit is the stretch's other end; with has_limit
 * (a wall there too) they must also fit between the walls, i.e. be placeable now. */
static size_t cell_cands(ts *s, int side, uint32_t w, uint64_t h, int has_limit, uint32_t limit, uint32_t *out)
{
    const plan_item *items = s->items;
    size_t k = 0;
    uint32_t e0 = side ? s->hi_start[w] : s->lo_start[w], e1 = side ? s->hi_start[w + 1] : s->lo_start[w + 1];
    const uint32_t *list = side ? s->hi_list : s->lo_list;
    /* Without a limit, the stretch's slots are at h, so only a lifetime reaching past its other
     * end (limit) can meet a higher slot: the nearest one there (nh: side 0 the first slot at or
     * after limit above h, side 1 one past the last before limit), found once, as far as the
     * candidates reach (scanned). */
    uint32_t scanned = limit, nh = side ? 0 : UINT32_MAX;
    for (uint32_t e = e0; e < e1; e++) {
        uint32_t i = list[e];
        const plan_item *it = &items[i];
        if (s->pos[i] != UINT64_MAX || (h & (it->align - 1)) || it->size > s->cap - h)
            continue;
        if (has_limit) {
            if (side ? it->lo < limit : it->hi > limit)
                continue;
        } else if (side) {
            for (; nh == 0 && scanned > it->lo; scanned--)
                if (s->floor[scanned - 1] > h)
                    nh = scanned;
            if (it->lo < nh)
                continue;
        } else {
            for (; nh == UINT32_MAX && scanned < it->hi; scanned++)
                if (s->floor[scanned] > h)
                    nh = scanned;
            if (it->hi > nh)
                continue;
        }
        if (has_limit && barred(s, i, h, NULL))
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

/* Add to w the placed items that meet slots [t0, t1) above height y (their top above y). */
/* What a failure's cause names: placed items, by a test on their slots and rows. */
enum { W_CELL, W_ABOVE, W_CROSS, W_START, W_END, W_ALL, W_BASIN };

/* Add to w the placed items that: W_CELL cover the cell (t, y); W_ABOVE meet slot t above row y;
 * W_CROSS cross the boundary t - 1|t; W_START (W_END) start (end) at t; W_ALL meet slots [t, u);
 * W_BASIN top out at y somewhere in [t, u) or start there. */
static void why_set(const ts *s, uint64_t *w, uint32_t i)
{
    uint32_t l = s->lvl[i];
    w[l / 64] |= UINT64_C(1) << (l % 64);
}

static void why_add(const ts *s, uint64_t *w, int kind, uint32_t t, uint32_t u, uint64_t y)
{
    if (!s->acc)
        return;
    int column = kind == W_CELL || kind == W_ABOVE || kind == W_CROSS;
    if (column && (t >= s->c->slots || (kind == W_CROSS && t == 0)))
        return; /* no such slot (nothing crosses the edges) */
    const uint32_t *col = column ? s->col + s->col_start[t] : NULL;
    uint32_t m = column ? s->col_n[t] : 0;
    switch (kind) {
    case W_CELL: { /* the column is sorted by offset and has no holes below the floor */
        uint32_t lo = 0, hi = m;
        while (lo < hi) {
            uint32_t mid = lo + (hi - lo) / 2;
            if (s->pos[col[mid]] + s->items[col[mid]].size <= y)
                lo = mid + 1;
            else
                hi = mid;
        }
        if (lo < m && s->pos[col[lo]] <= y)
            why_set(s, w, col[lo]);
        return;
    }
    case W_ABOVE:
        for (uint32_t k = m; k > 0 && s->pos[col[k - 1]] + s->items[col[k - 1]].size > y; k--)
            why_set(s, w, col[k - 1]);
        return;
    case W_CROSS:
        for (uint32_t k = 0; k < m; k++)
            if (s->items[col[k]].lo < t)
                why_set(s, w, col[k]);
        return;
    case W_START:
    case W_END: {
        const uint32_t *list = kind == W_END ? s->hi_list : s->lo_list;
        const uint32_t *st = kind == W_END ? s->hi_start : s->lo_start;
        for (uint32_t e = st[t]; e < st[t + 1]; e++)
            if (s->pos[list[e]] != UINT64_MAX)
                why_set(s, w, list[e]);
        return;
    }
    default:
        break;
    }
    for (size_t l = 0; l < s->nplaced; l++) {
        uint32_t i = s->placed[l];
        const plan_item *it = &s->items[i];
        if (it->lo < u && it->hi > t && (kind == W_ALL || s->pos[i] + it->size == y || it->lo >= t))
            why_set(s, w, i);
    }
}

static void why_clear(ts *s)
{
    if (s->acc)
        memset(s->why, 0, s->nw * sizeof *s->why);
}

/* Add to w the placements that make the cell of a stretch [a, b) at h (part [lo, hi)) on side 0
 * (slot a) or 1 (slot b - 1) one that only an unplaced item starting at a (ending at b) can cover,
 * and at h: the item just below the cell (nothing can reach down past it), the placed ones
 * starting (ending) there, and the wall's item at h (rows: all of the wall above h, for a claim
 * on the rows up to its top), or at a part's edge the items crossing it (all placed). */
static void why_side(const ts *s, uint64_t *w, int side, uint32_t a, uint32_t b, uint32_t lo, uint32_t hi,
                     uint64_t h, int rows)
{
    uint32_t t = side ? b - 1 : a, wt = side ? b : a - 1, edge = side ? b == hi : a == lo;
    if (h > 0)
        why_add(s, w, W_CELL, t, 0, h - 1);
    why_add(s, w, side ? W_END : W_START, side ? b : a, 0, 0);
    if (edge)
        why_add(s, w, W_CROSS, side ? b : a, 0, 0);
    else
        why_add(s, w, rows ? W_ABOVE : W_CELL, wt, 0, h);
}

/* ... and what keeps the items there from reaching past the stretch's other end (a wall there). */
static void why_limit(const ts *s, uint64_t *w, int side, uint32_t a, uint32_t b, uint32_t lo, uint32_t hi,
                      uint64_t h, int rows)
{
    uint32_t wt = side ? a - 1 : b, edge = side ? a == lo : b == hi;
    if (edge)
        why_add(s, w, W_CROSS, side ? a : b, 0, 0);
    else
        why_add(s, w, rows ? W_ABOVE : W_CELL, wt, 0, h);
}

/* Add to w, for each unplaced item cell_cands (without a limit) turned down for a slot above h
 * in its lifetime, the placed item covering that slot at h. */
static void why_cands(const ts *s, uint64_t *w, int side, uint32_t t, uint64_t h)
{
    if (!s->acc)
        return;
    uint32_t e0 = side ? s->hi_start[t] : s->lo_start[t], e1 = side ? s->hi_start[t + 1] : s->lo_start[t + 1];
    const uint32_t *list = side ? s->hi_list : s->lo_list;
    for (uint32_t e = e0; e < e1; e++) {
        uint32_t i = list[e];
        const plan_item *it = &s->items[i];
        if (s->pos[i] != UINT64_MAX || (h & (it->align - 1)) || it->size > s->cap - h)
            continue;
        uint32_t u = it->lo;
        while (u < it->hi && s->floor[u] <= h)
            u++;
        if (u < it->hi)
            why_add(s, w, W_CELL, u, 0, h);
    }
}

static void fw_xor(ts *s, uint32_t t, uint64_t d);
static uint64_t zfloor(uint32_t t, uint64_t f);
static uint64_t zitem(uint32_t i);

static size_t wbucket(uint32_t i, uint64_t at)
{
    return (size_t)i * TILE_WB + (size_t)((at >> 4 ^ at >> 9 ^ at >> 14) & (TILE_WB - 1));
}

static int ng_watch(ts *s, uint32_t item, uint64_t at, uint32_t g)
{
    size_t i = wbucket(item, at);
    if (s->wl_n[i] == s->wl_cap[i]) {
        uint32_t nc = 2 * s->wl_cap[i] + 4;
        struct tile_watch *nw = realloc(s->wl[i], nc * sizeof *nw);
        if (!nw)
            return -1;
        s->wl[i] = nw;
        s->wl_cap[i] = nc;
    }
    s->wl[i][s->wl_n[i]++] = (struct tile_watch){at, g};
    return 0;
}

/* Nogood g lacks only its literal x: bar it while the latest placement stays. */
static void ng_unit(ts *s, uint32_t g, uint32_t x)
{
    const struct tile_lit *l = &s->ng_lit[s->ng[g].start + x];
    if (s->pos[l->item] != UINT64_MAX)
        return; /* placed elsewhere: g holds */
    if (s->nunit == s->capunit) {
        size_t nc = 2 * s->capunit + 64;
        struct tile_unit *nu = realloc(s->unit, nc * sizeof *nu);
        if (!nu)
            return; /* fewer bars: only less pruning */
        s->unit = nu;
        s->capunit = nc;
    }
    s->unit[s->nunit++] = (struct tile_unit){l->item, g, (uint32_t)s->nplaced - 1, l->at};
    s->unit_cnt[l->item]++;
    sc_touch_item(s, l->item);
}

/* Item i just went to h: the nogoods watching i on (i, h) move that watch to a literal not
 * placed, or, when every other literal is placed too, are complete (ng_hit). */
static void ng_put(ts *s, uint32_t i, uint64_t h)
{
    s->ng_hit = -1;
    if (!s->wl)
        return;
    size_t bi = wbucket(i, h);
    struct tile_watch *wl = s->wl[bi];
    for (uint32_t e = 0; e < s->wl_n[bi];) {
        if (wl[e].at != h) { /* i elsewhere: this nogood holds while i stays */
            e++;
            continue;
        }
        uint32_t g = wl[e].g;
        struct tile_ng *ng = &s->ng[g];
        const struct tile_lit *l = s->ng_lit + ng->start;
        int k = l[ng->w[0]].item == i ? 0 : 1;
        uint32_t other = ng->w[1 - k], r = ng->len;
        for (uint32_t x = 0; x < ng->len; x++)
            if (x != ng->w[0] && x != ng->w[1] && s->pos[l[x].item] != l[x].at) {
                r = x;
                break;
            }
        if (r < ng->len && ng_watch(s, l[r].item, l[r].at, g) == 0) {
            ng->w[k] = r;
            wl[e] = wl[--s->wl_n[bi]];
            if (s->pos[l[other].item] == l[other].at) { /* a unit when r is the last one not made */
                uint32_t x = r + 1;
                while (x < ng->len && (x == other || s->pos[l[x].item] == l[x].at))
                    x++;
                if (x == ng->len)
                    ng_unit(s, g, r);
            }
            continue;
        }
        if (s->pos[l[other].item] == l[other].at) {
            if (s->ng_hit < 0 && ng_local(s, ng))
                s->ng_hit = g;
        } else
            ng_unit(s, g, other);
        e++;
    }
}

/* Keep the cause in s->why (levels of the placements now made) as a nogood, when short. */
static void ng_learn(ts *s)
{
    if (!s->wl)
        return;
    uint32_t len = 0;
    for (size_t w = 0; w < s->nw; w++)
        len += (uint32_t)__builtin_popcountll(s->why[w]);
    if (len == 0 || len > TILE_NG_LEN)
        return;
    if (s->ng_nlit + len > s->ng_caplit || s->nng == s->capng)
        return; /* full until the next restart forgets */
    struct tile_ng *ng = &s->ng[s->nng];
    ng->start = (uint32_t)s->ng_nlit;
    ng->len = len;
    struct tile_lit *l = s->ng_lit + s->ng_nlit;
    uint32_t x = 0;
    for (size_t w = 0; w < s->nw; w++)
        for (uint64_t b = s->why[w]; b; b &= b - 1) {
            uint32_t i = s->placed[w * 64 + (size_t)__builtin_ctzll(b)];
            l[x++] = (struct tile_lit){i, s->pos[i]};
        }
    /* watch the two latest placements: the backjump undoes the latest, so one watch is free */
    ng->w[0] = len - 1;
    ng->w[1] = len > 1 ? len - 2 : len - 1;
    if (ng_watch(s, l[ng->w[0]].item, l[ng->w[0]].at, (uint32_t)s->nng) != 0)
        return;
    if (len > 1 && ng_watch(s, l[ng->w[1]].item, l[ng->w[1]].at, (uint32_t)s->nng) != 0) {
        s->wl_n[wbucket(l[ng->w[0]].item, l[ng->w[0]].at)]--; /* just added, the last entry */
        return;
    }
    s->nng++;
    s->ng_nlit += len;
}

/* At a restart (nothing placed): beyond half the room, forget the older half of the nogoods. */
static void ng_forget(ts *s)
{
    if (!s->wl || (s->ng_nlit <= s->ng_caplit / 2 && s->nng <= s->capng / 2))
        return;
    size_t keep = s->nng / 2, from = s->nng - keep;
    uint32_t base = keep ? s->ng[from].start : (uint32_t)s->ng_nlit;
    memmove(s->ng_lit, s->ng_lit + base, (s->ng_nlit - base) * sizeof *s->ng_lit);
    s->ng_nlit -= base;
    memmove(s->ng, s->ng + from, keep * sizeof *s->ng);
    s->nng = keep;
    for (size_t i = 0; i < s->c->n * TILE_WB; i++)
        s->wl_n[i] = 0;
    for (size_t g = 0; g < s->nng; g++) {
        struct tile_ng *ng = &s->ng[g];
        ng->start -= base;
        for (int k = 0; k < (ng->w[1] != ng->w[0] ? 2 : 1); k++) { /* fits: lists only shrank */
            const struct tile_lit *l = &s->ng_lit[ng->start + ng->w[k]];
            ng_watch(s, l->item, l->at, (uint32_t)g);
        }
    }
}

/* Place item i at h (its lifetime's floor is flat at h). */
static void tile_put(ts *s, uint32_t i, uint64_t h)
{
    const plan_item *it = &s->items[i];
    s->pos[i] = h;
    if (s->acc)
        s->lvl[i] = (uint32_t)s->nplaced;
    s->placed[s->nplaced++] = i;
    fw_xor(s, it->lo, zitem(i));
    for (uint32_t t = it->lo; t < it->hi; t++) {
        fw_xor(s, t, zfloor(t, h) ^ zfloor(t, h + it->size));
        s->floor[t] = h + it->size;
        if (s->sc)
            sc_touch(s, t);
        if (s->acc)
            s->col[s->col_start[t] + s->col_n[t]++] = i;
    }
    for (uint32_t t = it->lo; t + 1 < it->hi; t++)
        if (--s->cuts[t] == 0)
            s->zcut[t / 64] |= UINT64_C(1) << (t % 64);
    if (s->nplaced > *s->best_n) { /* the deepest partial tiling: the fallback's start */
        *s->best_n = s->nplaced;
        memcpy(s->best_pos, s->pos, s->c->n * sizeof *s->best_pos);
    }
    ng_put(s, i, h);
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
            if (s->sc)
                sc_touch(s, t);
            if (s->acc)
                s->col_n[t]--;
        }
        for (uint32_t t = it->lo; t + 1 < it->hi; t++)
            if (s->cuts[t]++ == 0)
                s->zcut[t / 64] &= ~(UINT64_C(1) << (t % 64));
        s->pos[i] = UINT64_MAX;
    }
    while (s->nunit && s->unit[s->nunit - 1].level >= s->nplaced) {
        s->unit_cnt[s->unit[--s->nunit].item]--;
        sc_touch_item(s, s->unit[s->nunit].item);
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
    uint32_t b0 = hi; /* the first boundary b0 - 1|b0 in (a0, hi) no unplaced item crosses */
    for (uint32_t t = a0, w = t / 64; t + 1 < hi; w++, t = w * 64) {
        uint64_t z = s->zcut[w] & (~UINT64_C(0) << (t % 64));
        if (z) {
            t = w * 64 + (uint32_t)__builtin_ctzll(z);
            b0 = t + 1 < hi ? t + 1 : hi;
            break;
        }
    }
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
    if (s->memo[slot] == key) {
        why_clear(s); /* the part's state: every placement in it */
        why_add(s, s->why, W_ALL, a0, b0, 0);
        return 0;
    }
    int res = tile_node(s, a0, b0);
    if (res == 0)
        s->memo[slot] = key;
    return res;
}

/* The wall cell of stretch [a, b) (part [lo, hi)) on side 0 (slot a, against a left wall) or 1
 * (slot b - 1, right wall): its candidates, or 0 when it has none or the items that could fill
 * up to the wall's top lack the bytes. With why, the cause of a 0 goes to s->why. */
static size_t stretch_side(ts *s, int side, uint32_t a, uint32_t b, uint32_t lo, uint32_t hi, int why)
{
    uint64_t h = s->floor[a];
    int lw = a == lo || s->floor[a - 1] > h, rw = b == hi || s->floor[b] > h;
    uint64_t hl = a == lo ? s->cap : s->floor[a - 1], hr = b == hi ? s->cap : s->floor[b];
    int both = lw && rw;
    /* Against a wall the rows up to its top can only be filled by items that start (end) right
     * there; with walls both sides, up to the lower wall, by items that stay between them. */
    uint64_t all, inside;
    wall_sums(s, side, side ? b : a, side ? a : b, &all, &inside);
    int fail = all < (side ? hr : hl) - h;
    int wide = !fail && both && inside < (hl < hr ? hl : hr) - h;
    int basin = !fail && !wide && both && side == 0 && b - a > 2 && (!basin_fits(s, a, b, (hl < hr ? hl : hr) - h));
    size_t k = fail || wide || basin ? 0 : cell_cands(s, side, side ? b : a, h, both, side ? a : b, NULL);
    if (k == 0 && why) {
        /* Why: the wall cell (both walls' when both count), every column of a basin (its floor),
         * and what turned down each candidate of a one-wall cell. */
        why_clear(s);
        if (basin) {
            why_add(s, s->why, W_BASIN, a, b, h);
            why_side(s, s->why, 0, a, b, lo, hi, h, 1);
            why_side(s, s->why, 1, a, b, lo, hi, h, 1);
        } else {
            why_side(s, s->why, side, a, b, lo, hi, h, fail || wide);
            if (both)
                why_limit(s, s->why, side, a, b, lo, hi, h, wide);
            if (both && !fail && !wide)
                why_barred(s, s->why, side, side ? b : a, h);
            else if (!fail)
                why_cands(s, s->why, side, side ? b : a, h);
        }
    }
    return k;
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
    s->node_lo = lo;
    s->node_hi = hi;
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
        uint32_t k[2] = {UINT32_MAX, UINT32_MAX};
        struct tile_sc *e = s->sc ? &s->sc[a] : NULL;
        if (e && e->stamp && e->b == b && e->h == h && e->lo == lo && e->hi == hi) {
            /* a one-wall cell's candidates must not meet a slot above h: their lifetimes too */
            uint32_t wl = a ? a - 1 : 0, wr = b;
            if (rw && !lw && s->reach1[b] < wl)
                wl = s->reach1[b];
            if (lw && !rw && s->reach0[a] > wr)
                wr = s->reach0[a];
            if (sc_max(s, wl, wr) < e->stamp)
                k[0] = e->k[0], k[1] = e->k[1];
        }
        if (k[0] == UINT32_MAX && k[1] == UINT32_MAX) {
            for (int side = 0; side < 2; side++)
                if (side ? rw : lw) {
                    k[side] = (uint32_t)stretch_side(s, side, a, b, lo, hi, 0);
                    if (k[side] == 0)
                        break;
                }
            if (e && k[0] != 0 && k[1] != 0)
                *e = (struct tile_sc){++s->clock, h, b, lo, hi, {k[0], k[1]}};
        }
        int both = lw && rw;
        for (int side = 0; side < 2; side++) {
            if (!(side ? rw : lw))
                continue;
            if (k[side] == 0) {
                stretch_side(s, side, a, b, lo, hi, 1); /* again, for the cause */
                return 0;
            }
            /* Ties: forwards in time to the lowest stretch, backwards to the leftmost. Leftmost
             * only, the search could hop between pieces tiled side by side under an address cut
             * (no time cut splits them: items above the cut cross), so a dead end in one was
             * backtracked through the other's choices (guillotine 1000/43: no tiling in 5 s);
             * lowest first tends to finish one level before the next, and solves it in about
             * 1.5 s. Neither rule wins everywhere, so the two directions differ in this too. */
            if (both && (k[side] < best || (k[side] == best && s->lowest_first && h < bh))) {
                best = k[side];
                bh = h;
                ba = a, bb = b, bside = side;
            }
        }
        a = b;
    }
    if (best == SIZE_MAX) { /* cannot happen: the lowest stretch has walls both sides */
        why_clear(s);
        why_add(s, s->why, W_ALL, 0, s->c->slots, 0);
        return 0;
    }
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
    /* This node fails, when every candidate fails, for the placements that make the cell a wall
     * cell with these candidates, and for those that made each candidate fail but the candidate
     * itself. A candidate failing for placements made before it (not for itself) fails this
     * node at once: the other candidates meet the same cause (backjumping). */
    size_t L = s->nplaced;
    uint64_t *acc = s->acc ? s->acc + L * s->nw : NULL;
    if (acc) {
        memset(acc, 0, s->nw * sizeof *acc);
        why_side(s, acc, bside, ba, bb, lo, hi, h, 0);
        why_limit(s, acc, bside, ba, bb, lo, hi, h, 0);
        why_barred(s, acc, bside, bside ? bb : ba, h);
    }
    int st = 0, jumped = 0;
    for (size_t x = 0; x < k && st == 0 && !jumped; x++) {
        uint32_t i = cs[(x + rot) % k];
        const plan_item *it = &s->items[i];
        int dup = 0; /* an identical item already tried here */
        for (size_t y = 0; y < x && !dup; y++) {
            const plan_item *o = &s->items[cs[(y + rot) % k]];
            dup = o->lo == it->lo && o->hi == it->hi && o->size == it->size && o->align == it->align;
        }
        if (dup)
            continue;
        size_t fmark = s->nforb;
        for (size_t y = 0; acc && y < x; y++) { /* the refuted ones with i's lifetime: not on i */
            uint32_t j = cs[(y + rot) % k];
            const plan_item *o = &s->items[j];
            if (o->lo != it->lo || o->hi != it->hi || o->size == it->size || ((h + it->size) & (o->align - 1)))
                continue;
            if (s->nforb == s->capforb) {
                size_t nc = 2 * s->capforb + 16;
                struct tile_forb *nf = realloc(s->forb, nc * sizeof *nf);
                if (!nf)
                    break; /* fewer bars: only less pruning */
                s->forb = nf;
                s->capforb = nc;
            }
            s->forb[s->nforb++] = (struct tile_forb){j, (uint32_t)L, h + it->size};
            s->forb_cnt[j]++;
            sc_touch_item(s, j);
        }
        s->node_lo = lo; /* a child node's since the last candidate */
        s->node_hi = hi;
        tile_put(s, i, h);
        if (s->ng_hit >= 0) { /* a nogood: fails for its placements */
            const struct tile_ng *ng = &s->ng[s->ng_hit];
            why_clear(s);
            for (uint32_t q = 0; q < ng->len; q++)
                why_set(s, s->why, s->ng_lit[ng->start + q].item);
            st = 0;
        } else
            st = tile_dfs(s, lo, hi);
        if (st != 1)
            tile_undo(s, L);
        while (s->nforb > fmark) {
            s->forb_cnt[s->forb[--s->nforb].item]--;
            sc_touch_item(s, s->forb[s->nforb].item);
        }
        if (st == 0 && acc) {
            if (!(s->why[L / 64] >> (L % 64) & 1)) {
                jumped = 1; /* s->why stands for this node too */
                continue;
            }
            s->why[L / 64] &= ~(UINT64_C(1) << (L % 64));
            for (size_t w = 0; w < s->nw; w++)
                acc[w] |= s->why[w];
        }
    }
    if (st == 0 && acc && !jumped) {
        memcpy(s->why, acc, s->nw * sizeof *acc);
        ng_learn(s);
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
    free(s->zcut);
    free(s->memo);
    free(s->fw);
    free(s->why);
    free(s->acc);
    free(s->lvl);
    free(s->col_start);
    free(s->col_n);
    free(s->col);
    free(s->forb);
    free(s->forb_cnt);
    if (s->wl)
        for (size_t i = 0; i < s->c->n * TILE_WB; i++)
            free(s->wl[i]);
    free(s->wl);
    free(s->wl_n);
    free(s->wl_cap);
    free(s->ng);
    free(s->ng_lit);
    free(s->unit);
    free(s->unit_cnt);
    free(s->sc);
    free(s->seg);
    free(s->reach0);
    free(s->reach1);
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
    s->zcut = calloc((S + 63) / 64, sizeof *s->zcut);
    s->memo = calloc(TILE_MEMO, sizeof *s->memo);
    s->fw = calloc(S + 1, sizeof *s->fw);
    s->nw = (n + 63) / 64;
    if (n <= TILE_CBJ_MAX) {
        size_t cells = 0;
        for (size_t i = 0; i < n; i++)
            cells += c->items[i].hi - c->items[i].lo;
        s->why = calloc(s->nw, sizeof *s->why);
        s->acc = calloc((n + 1) * s->nw, sizeof *s->acc);
        s->lvl = calloc(n, sizeof *s->lvl);
        s->col_start = calloc(S + 1, sizeof *s->col_start);
        s->col_n = calloc(S, sizeof *s->col_n);
        s->col = malloc((cells ? cells : 1) * sizeof *s->col);
        s->forb_cnt = calloc(n, sizeof *s->forb_cnt);
        if (!s->why || !s->acc || !s->lvl || !s->col_start || !s->col_n || !s->col || !s->forb_cnt) {
            free(s->forb_cnt);
            s->forb_cnt = NULL;
            free(s->why); /* chronological backtracking then */
            free(s->acc);
            free(s->lvl);
            free(s->col_start);
            free(s->col_n);
            free(s->col);
            s->why = s->acc = NULL;
            s->lvl = s->col_start = s->col_n = s->col = NULL;
        }
    }
    if (s->acc) { /* nogoods need the causes; without room for them, none are kept */
        s->ng_caplit = TILE_NG_LITS;
        s->capng = TILE_NG_LITS / 2;
        s->ng_lit = malloc(s->ng_caplit * sizeof *s->ng_lit);
        s->ng = malloc(s->capng * sizeof *s->ng);
        s->wl = calloc(n * TILE_WB, sizeof *s->wl);
        s->wl_n = calloc(n * TILE_WB, sizeof *s->wl_n);
        s->wl_cap = calloc(n * TILE_WB, sizeof *s->wl_cap);
        s->unit_cnt = calloc(n, sizeof *s->unit_cnt);
        if (!s->ng_lit || !s->ng || !s->wl || !s->wl_n || !s->wl_cap || !s->unit_cnt) {
            free(s->unit_cnt);
            s->unit_cnt = NULL;
            free(s->ng_lit);
            free(s->ng);
            free(s->wl);
            free(s->wl_n);
            free(s->wl_cap);
            s->ng_lit = NULL;
            s->ng = NULL;
            s->wl = NULL;
            s->wl_n = s->wl_cap = NULL;
        }
    }
    s->ng_hit = -1;
    s->segn = 1;
    while (s->segn < S + 1)
        s->segn *= 2;
    s->sc = vmm_plan_tile_no_cache ? NULL : calloc(S, sizeof *s->sc);
    s->seg = calloc(2 * (size_t)s->segn, sizeof *s->seg);
    s->reach0 = calloc(S + 1, sizeof *s->reach0);
    s->reach1 = malloc((S + 1) * sizeof *s->reach1);
    if (!s->sc || !s->seg || !s->reach0 || !s->reach1) { /* no cache: every stretch at every node */
        free(s->sc);
        free(s->seg);
        free(s->reach0);
        free(s->reach1);
        s->sc = NULL;
        s->seg = NULL;
        s->reach0 = s->reach1 = NULL;
    }
    s->capcand = 4 * n + 16; /* grows when a path holds more */
    s->cand = malloc(s->capcand * sizeof *s->cand);
    uint32_t *fl = calloc(S + 1, sizeof *fl), *fh = calloc(S + 1, sizeof *fh);
    int rc = VMM_OK;
    if (!items || !s->lo_start || !s->hi_start || !s->lo_list || !s->hi_list || !s->floor || !s->pos ||
        !s->placed || !s->diff || !s->cuts || !s->zcut || !s->memo || !s->fw || !s->cand || !fl || !fh) {
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
    if (s->sc) {
        for (size_t t = 0; t <= S; t++)
            s->reach1[t] = (uint32_t)S;
        for (size_t i = 0; i < n; i++) {
            if (items[i].hi > s->reach0[items[i].lo])
                s->reach0[items[i].lo] = items[i].hi;
            if (items[i].lo < s->reach1[items[i].hi])
                s->reach1[items[i].hi] = items[i].lo;
        }
    }
    if (s->col_start) { /* a slot's column holds at most the items live there */
        for (size_t i = 0; i < n; i++)
            for (uint32_t t = items[i].lo; t < items[i].hi; t++)
                s->col_start[t + 1]++;
        for (size_t t = 0; t < S; t++)
            s->col_start[t + 1] += s->col_start[t];
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
    if (s->col_n)
        memset(s->col_n, 0, S * sizeof *s->col_n);
    if (s->sc)
        memset(s->sc, 0, S * sizeof *s->sc); /* floors back to 0: nothing cached holds */
    memset(s->fw, 0, (S + 1) * sizeof *s->fw);
    for (uint32_t t = 0; t < (uint32_t)S; t++)
        fw_xor(s, t, zfloor(t, 0));
    for (size_t i = 0; i < n; i++)
        fw_xor(s, s->items[i].lo, zitem((uint32_t)i));
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = s->items[i].lo; t + 1 < s->items[i].hi; t++)
            s->cuts[t]++;
    memset(s->zcut, 0, (S + 63) / 64 * sizeof *s->zcut);
    for (uint32_t t = 0; t < (uint32_t)S; t++)
        if (s->cuts[t] == 0)
            s->zcut[t / 64] |= UINT64_C(1) << (t % 64);
    s->nplaced = 0;
    s->ncand = 0;
    while (s->nunit)
        s->unit_cnt[s->unit[--s->nunit].item]--;
    ng_forget(s);
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
