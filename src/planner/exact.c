/* Exact search, after the ideas published with MiniMalloc (Moffitt, ASPLOS'23); the code is ours.
 *
 * The core is a feasibility test: is there a plan within `cap` bytes? Minimising the arena is a
 * search over caps (plan_exact, at the bottom).
 *
 * Canonical plans. Take a plan with the smallest sum of offsets: no item can move to any lower
 * free position. List its items by (offset, preorder rank). Each item then sits exactly at its
 * "resting height": align_up(max top of the time-overlapping items listed before it), because
 * items listed after it start no lower than it does. So the search builds that list: a node picks
 * the next item and puts it at its resting height, which may not be below the previous item's
 * offset (nor equal to it with a smaller rank). Dominance: if some unplaced item c could rest
 * entirely below the offset y about to be used (its resting height + size <= y), the plan being
 * built leaves a hole c fits in and every later item sits at >= y, so the finished plan would
 * not be of minimal offset sum: skip. Candidates are tried lowest resting height first, so the
 * first one at or above the smallest unplaced "resting top" ends the loop.
 *
 * Inference, per time slot: unplaced items live in the slot all overlap each other, so they stack
 * above max(top of what is placed there, the previous offset, the lowest resting height among
 * them); that plus their total size must fit in cap.
 *
 * Decomposition: a slot boundary that no unplaced item crosses splits the rest into independent
 * problems (placed items only act through resting heights and floors, which are already set);
 * each part is solved on its own, and a part without a plan fails the node.
 *
 * Search orders: the preorder rank breaks ties between equal resting heights and decides which
 * plans of equal offsets are canonical. Like MiniMalloc we try three preorders round robin with a
 * node limit that doubles each round ("level" k: each order with 2(n+1) << k nodes), since one
 * order often finds a plan quickly where another wanders; a completed search under any order
 * proves infeasibility.
 *
 * Minimising runs two searches (plan_exact, at the bottom). The bound search works on the lowest
 * cap not proven impossible, the lower bound at first: one level after another, resuming where it
 * stopped; a plan there is optimal, and on the MiniMalloc instances that is where the plans at
 * capacity come from. The improving search probes caps between what it proved impossible and its
 * best plan, many short searches at varied caps (improve_step), and finds the plans below the
 * heuristics' where the bound is out of reach. With two threads they run side by side, else they
 * take turns on one, node for node.
 *
 * Anytime: each search is a fixed sequence of feasibility tests whose sizes are counted in nodes,
 * never in seconds, and the two share nothing but the news that one holds a plan proven optimal.
 * The time limit (or a node limit) only cuts the sequences short and the best plan found so far
 * is kept, so the plan a run returns is the one any longer run had when its searches were as many
 * nodes in, on any machine and under any load. (Before, each cap probed while minimising got a
 * share of the time left, the lower bound a tenth: a shorter limit searched differently, and at
 * 6 s five of MiniMalloc's eleven instances stayed above capacity.) */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum {
    /* Cap on conflict-list and slot-list entries (uint32 each): beyond this the instance is too
     * dense to search and the seed is returned as is. 32 Mi entries = 128 MiB per list. */
    EXACT_MAX_ENTRIES = 32 << 20,
    /* Clock reads cost more than a node; look at the time every this many nodes. */
    EXACT_CLOCK_EVERY = 256,
    /* Preorders tried round robin (see the top comment). */
    EXACT_ORDERS = 3,
    /* Levels above this would overflow the node limit; a run never gets there. */
    EXACT_MAX_LEVEL = 40,
};

enum xs_status { XS_FOUND = 0, XS_NONE = 1, XS_LIMIT = 2, XS_STOP = 3 };

#define NO_POS UINT64_MAX
#define UNDO_SLOT 0x80000000u

typedef struct undo {
    uint32_t what; /* item index, or slot | UNDO_SLOT */
    uint64_t old;
} undo;

typedef struct cand {
    uint64_t off;
    uint32_t rank, item;
} cand;

typedef struct xs {
    const plan_ctx *c;
    size_t n;
    uint32_t slots;
    uint32_t *nb_start, *nb;    /* conflict lists, CSR by item */
    uint32_t *sl_start, *sl;    /* items live in each slot, CSR by slot */
    uint32_t *rank;             /* preorder rank per item */
    /* state */
    uint32_t *wit;              /* per slot, a cache (not undone): an item live there that last
                                 * showed the floor high enough, i.e. unplaced and resting at most
                                 * the floor; place_rest checks it before scanning the slot */
    uint64_t *rest;             /* resting height of unplaced items */
    uint64_t *pos;              /* offset, or NO_POS */
    uint64_t *sol;              /* the plan found */
    uint64_t *floor, *total;    /* per slot: lowest offset left, unplaced bytes */
    uint32_t *cuts;             /* per boundary t|t+1: unplaced items crossing it */
    uint32_t *stamp, stamp_now; /* slots already marked affected by this placement */
    uint32_t *affected;
    undo *undo;
    size_t nundo, capundo;
    cand *cs;                   /* candidate lists of the open nodes, a stack */
    size_t ncs, capcs;
    uint32_t *parts;            /* item lists of the open partitions, a stack */
    size_t nparts, capparts;
    /* control */
    uint64_t cap;
    int order;                  /* the preorder in use (rank_items) */
    uint64_t nodes, budget;     /* budget: nodes left before XS_LIMIT */
    uint64_t node_limit;        /* stop once this many nodes were visited (UINT64_MAX: none) */
    double deadline;
    atomic_int *halt;           /* set when the other search made this one pointless */
    int oom, stopped;           /* stopped: deadline, node limit or halt */
    int clone;                  /* the lists above the state belong to another xs */
} xs;

static int grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 0;
    size_t nc = *cap ? *cap : 1024;
    while (nc < need)
        nc *= 2;
    void *np = realloc(*p, nc * elem);
    if (!np)
        return -1;
    *p = np;
    *cap = nc;
    return 0;
}

static int undo_push(xs *s, uint32_t what, uint64_t old)
{
    if (grow((void **)&s->undo, &s->capundo, s->nundo + 1, sizeof *s->undo)) {
        s->oom = 1;
        return -1;
    }
    s->undo[s->nundo++] = (undo){what, old};
    return 0;
}

/* Put item b at y, in two steps; record every change on the undo stack. place_own: b's own
 * slots (their floor, their unplaced bytes). place_rest: the resting heights b lifts and the floors
 * that follow, the cuts. Floors only rise in the second step, so when the slot inference already
 * fails after the first (most candidates tried), the second is not needed. */
static void place_own(xs *s, uint32_t b, uint64_t y)
{
    const plan_item *it = &s->c->items[b];
    uint64_t top = y + it->size;
    s->pos[b] = y;
    for (uint32_t t = it->lo; t < it->hi; t++) {
        if (undo_push(s, t | UNDO_SLOT, s->floor[t]))
            return;
        s->floor[t] = top;
        s->total[t] -= it->size;
    }
}

static void place_rest(xs *s, uint32_t b, uint64_t y)
{
    const plan_item *it = &s->c->items[b];
    uint64_t top = y + it->size;
    size_t naff = 0;
    s->stamp_now++;
    for (uint32_t k = s->nb_start[b]; k < s->nb_start[b + 1]; k++) {
        uint32_t j = s->nb[k];
        if (s->pos[j] != NO_POS || s->rest[j] >= top)
            continue;
        if (undo_push(s, j, s->rest[j]))
            return;
        uint64_t r = plan_align_up(top, s->c->items[j].align);
        s->rest[j] = r;
        /* j's slots may get a higher floor (the lowest resting height there may have risen);
         * only where the floor is below j's new height */
        for (uint32_t t = s->c->items[j].lo; t < s->c->items[j].hi; t++)
            if (s->floor[t] < r && s->stamp[t] != s->stamp_now) {
                s->stamp[t] = s->stamp_now;
                s->affected[naff++] = t;
            }
    }
    for (size_t k = 0; k < naff; k++) {
        uint32_t t = s->affected[k], w = s->wit[t];
        uint64_t m = UINT64_MAX, f = s->floor[t];
        if (s->pos[w] == NO_POS && s->rest[w] <= f)
            continue; /* the floor stands: what the scan below would find at once */
        for (uint32_t e = s->sl_start[t]; e < s->sl_start[t + 1] && m > f; e++) {
            uint32_t j = s->sl[e];
            if (s->pos[j] == NO_POS && s->rest[j] < m) {
                m = s->rest[j];
                w = j;
            }
        }
        s->wit[t] = w;
        if (m != UINT64_MAX && f < m) {
            if (undo_push(s, t | UNDO_SLOT, f))
                return;
            s->floor[t] = m;
        }
    }
    for (uint32_t t = it->lo; t + 1 < it->hi; t++)
        s->cuts[t]--;
}

/* Undo place_own and, when rest, place_rest. */
static void unplace(xs *s, uint32_t b, size_t mark, int rest)
{
    const plan_item *it = &s->c->items[b];
    while (s->nundo > mark) {
        undo u = s->undo[--s->nundo];
        if (u.what & UNDO_SLOT)
            s->floor[u.what & ~UNDO_SLOT] = u.old;
        else
            s->rest[u.what] = u.old;
    }
    for (uint32_t t = it->lo; t < it->hi; t++)
        s->total[t] += it->size;
    for (uint32_t t = it->lo; rest && t + 1 < it->hi; t++)
        s->cuts[t]++;
    s->pos[b] = NO_POS;
}

/* Slot inference over [slo, shi) with every later offset >= y. */
static int slots_fit(const xs *s, uint32_t slo, uint32_t shi, uint64_t y)
{
    for (uint32_t t = slo; t < shi; t++) {
        if (!s->total[t])
            continue;
        uint64_t f = s->floor[t] > y ? s->floor[t] : y;
        if (f > s->cap || s->total[t] > s->cap - f)
            return 0;
    }
    return 1;
}

static int cand_less(const cand *x, const cand *y)
{
    return x->off < y->off || (x->off == y->off && x->rank < y->rank);
}

static void cand_swap(cand *a, cand *b)
{
    cand t = *a;
    *a = *b;
    *b = t;
}

/* Candidates by (resting height, rank), keys distinct (ranks are within a part): quicksort
 * (median of three, the smaller side recursed) finished by insertion sort. qsort's indirect calls
 * took over a third of the search's time. */
static void cand_sort(cand *c, size_t n)
{
    while (n > 16) {
        size_t m = n / 2;
        if (cand_less(&c[m], &c[0]))
            cand_swap(&c[m], &c[0]);
        if (cand_less(&c[n - 1], &c[0]))
            cand_swap(&c[n - 1], &c[0]);
        if (cand_less(&c[n - 1], &c[m]))
            cand_swap(&c[n - 1], &c[m]);
        cand pivot = c[m];
        size_t i = 0, j = n - 1;
        for (;;) {
            while (cand_less(&c[i], &pivot))
                i++;
            while (cand_less(&pivot, &c[j]))
                j--;
            if (i >= j)
                break;
            cand_swap(&c[i], &c[j]);
            i++;
            j--;
        }
        size_t left = j + 1; /* [0, j] <= pivot <= [j + 1, n) */
        if (left < n - left) {
            cand_sort(c, left);
            c += left;
            n -= left;
        } else {
            cand_sort(c + left, n - left);
            n = left;
        }
    }
    for (size_t i = 1; i < n; i++) {
        cand x = c[i];
        size_t k = i;
        while (k > 0 && cand_less(&x, &c[k - 1])) {
            c[k] = c[k - 1];
            k--;
        }
        c[k] = x;
    }
}

static int search_part(xs *s, size_t pbase, size_t pn, uint32_t slo, uint32_t shi, uint64_t last_off,
                       uint32_t last_rank);
static int rank_items(xs *s, const uint32_t *items, size_t m);

/* Search a piece cut off by decomposition afresh: its items ranked again by the current slot
 * totals (as MiniMalloc does for its sub-partitions), the old ranks restored afterwards. */
static int search_piece(xs *s, size_t pbase, size_t pn, uint32_t slo, uint32_t shi)
{
    if (pn == 0)
        return XS_FOUND;
    uint32_t *old = malloc(pn * sizeof *old);
    if (!old) {
        s->oom = 1;
        return XS_STOP;
    }
    for (size_t k = 0; k < pn; k++)
        old[k] = s->rank[s->parts[pbase + k]];
    int st = rank_items(s, s->parts + pbase, pn) ? XS_STOP : search_part(s, pbase, pn, slo, shi, 0, 0);
    for (size_t k = 0; k < pn; k++)
        s->rank[s->parts[pbase + k]] = old[k];
    free(old);
    return st;
}

/* Solve the unplaced items of partition (pbase, pn) over slots [slo, shi) split at every boundary
 * no unplaced item crosses; each piece starts afresh (offset 0, rank 0). */
static int split_and_search(xs *s, size_t pbase, size_t pn, uint32_t slo, uint32_t shi, uint64_t last_off,
                            uint32_t last_rank, int try_split)
{
    /* try_split: 1 = look for a cut; 2 = the same, and (pbase, pn) is itself a piece just cut off */
    uint32_t cut = shi;
    if (try_split)
        for (uint32_t t = slo; t + 1 < shi; t++)
            if (s->cuts[t] == 0) {
                cut = t + 1;
                break;
            }
    if (cut == shi)
        return try_split == 2 ? search_piece(s, pbase, pn, slo, shi)
                              : search_part(s, pbase, pn, slo, shi, last_off, last_rank);
    /* Pieces left to right: [slo, cut) now, then the rest recursively (it may split again). */
    size_t mark = s->nparts;
    if (grow((void **)&s->parts, &s->capparts, s->nparts + pn, sizeof *s->parts)) {
        s->oom = 1;
        return XS_STOP;
    }
    size_t lb = s->nparts, ln = 0;
    for (size_t k = 0; k < pn; k++) {
        uint32_t i = s->parts[pbase + k];
        if (s->pos[i] == NO_POS && s->c->items[i].hi <= cut)
            s->parts[lb + ln++] = i;
    }
    size_t rb = lb + ln, rn = 0;
    for (size_t k = 0; k < pn; k++) {
        uint32_t i = s->parts[pbase + k];
        if (s->pos[i] == NO_POS && s->c->items[i].lo >= cut)
            s->parts[rb + rn++] = i;
    }
    s->nparts = rb + rn;
    int st = search_piece(s, lb, ln, slo, cut);
    if (st == XS_FOUND)
        st = split_and_search(s, rb, rn, cut, shi, 0, 0, 2);
    s->nparts = mark;
    return st;
}

static int search_part(xs *s, size_t pbase, size_t pn, uint32_t slo, uint32_t shi, uint64_t last_off,
                       uint32_t last_rank)
{
    if (s->budget == 0)
        return XS_LIMIT;
    if (s->nodes >= s->node_limit || atomic_load_explicit(s->halt, memory_order_relaxed) ||
        (s->nodes % EXACT_CLOCK_EVERY == 0 && plan_now() > s->deadline)) {
        s->stopped = 1;
        return XS_STOP;
    }
    s->budget--;
    s->nodes++;
    size_t cbase = s->ncs;
    if (grow((void **)&s->cs, &s->capcs, s->ncs + pn, sizeof *s->cs)) {
        s->oom = 1;
        return XS_STOP;
    }
    size_t nc = 0, unplaced = 0;
    uint64_t min_top = UINT64_MAX;
    for (size_t k = 0; k < pn; k++) {
        uint32_t i = s->parts[pbase + k];
        if (s->pos[i] != NO_POS)
            continue;
        uint64_t top = s->rest[i] + s->c->items[i].size;
        if (top > s->cap)
            return XS_NONE; /* cannot go anywhere: resting heights only rise */
        min_top = top < min_top ? top : min_top;
        unplaced++;
    }
    if (unplaced == 0)
        return XS_FOUND;
    /* The candidates: canonical (not below the last offset, nor at it with a smaller rank) and
     * not dominated (below min_top: else an unplaced item would fit under it), in order. */
    for (size_t k = 0; k < pn; k++) {
        uint32_t i = s->parts[pbase + k];
        uint64_t r = s->rest[i];
        if (s->pos[i] == NO_POS && r < min_top && (r > last_off || (r == last_off && s->rank[i] >= last_rank)))
            s->cs[cbase + nc++] = (cand){r, s->rank[i], i};
    }
    s->ncs = cbase + nc;
    cand_sort(s->cs + cbase, nc);
    int st = XS_NONE;
    for (size_t k = 0; k < nc; k++) {
        cand cd = s->cs[cbase + k];
        size_t mark = s->nundo;
        int r = XS_NONE, rest = 0;
        place_own(s, cd.item, cd.off);
        if (!s->oom && slots_fit(s, slo, shi, cd.off)) {
            place_rest(s, cd.item, cd.off);
            rest = 1;
            if (!s->oom && slots_fit(s, slo, shi, cd.off))
                r = split_and_search(s, pbase, pn, slo, shi, cd.off, cd.rank, 1);
        }
        if (s->oom)
            r = XS_STOP;
        unplace(s, cd.item, mark, rest);
        if (r == XS_FOUND)
            s->sol[cd.item] = cd.off;
        if (r != XS_NONE) {
            st = r;
            break;
        }
    }
    s->ncs = cbase;
    return st;
}

/* ---- setup ----------------------------------------------------------------------------------- */

typedef struct pre {
    uint64_t k1, k2, k3;
    uint32_t idx;
} pre;

static int cmp_pre(const void *a, const void *b)
{
    const pre *x = a, *y = b;
    if (x->k1 != y->k1)
        return x->k1 < y->k1 ? 1 : -1;
    if (x->k2 != y->k2)
        return x->k2 < y->k2 ? 1 : -1;
    if (x->k3 != y->k3)
        return x->k3 < y->k3 ? 1 : -1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Rank items[0..m) by preorder s->order, keys descending: 0 = (peak unplaced slot total, length,
 * area), 1 = (peak total, area, length), 2 = (length, area, peak total); length in the caller's
 * time units, as MiniMalloc's preorders use them. */
static int rank_items(xs *s, const uint32_t *items, size_t m)
{
    pre *p = malloc((m ? m : 1) * sizeof *p);
    if (!p) {
        s->oom = 1;
        return -1;
    }
    for (size_t k = 0; k < m; k++) {
        uint32_t i = items[k];
        const plan_item *it = &s->c->items[i];
        uint64_t peak = 0;
        for (uint32_t t = it->lo; t < it->hi; t++)
            peak = s->total[t] > peak ? s->total[t] : peak;
        uint64_t len = (uint64_t)s->c->time[it->hi] - (uint64_t)s->c->time[it->lo];
        uint64_t area = it->size * len;
        if (len && area / len != it->size)
            area = UINT64_MAX; /* saturate instead of wrapping */
        uint64_t key[3] = {peak, len, area};
        if (s->order == 1)
            key[1] = area, key[2] = len;
        else if (s->order == 2)
            key[0] = len, key[1] = area, key[2] = peak;
        p[k] = (pre){key[0], key[1], key[2], i};
    }
    qsort(p, m, sizeof *p, cmp_pre);
    for (size_t r = 0; r < m; r++)
        s->rank[p[r].idx] = (uint32_t)r;
    free(p);
    return 0;
}

static void xs_free(xs *s)
{
    if (!s->clone) {
        free(s->nb_start);
        free(s->nb);
        free(s->sl_start);
        free(s->sl);
    }
    free(s->rank);
    free(s->wit);
    free(s->rest);
    free(s->pos);
    free(s->sol);
    free(s->floor);
    free(s->total);
    free(s->cuts);
    free(s->stamp);
    free(s->affected);
    free(s->undo);
    free(s->cs);
    free(s->parts);
}

static int cmp_by_lo(const void *a, const void *b)
{
    const uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* 1 when the lists would be too big to search. */
static int xs_init(xs *s, const plan_ctx *c)
{
    size_t n = c->n, nn = n ? n : 1;
    s->c = c;
    s->n = n;
    s->slots = c->slots;
    s->nb_start = calloc(n + 1, sizeof *s->nb_start);
    s->sl_start = calloc((size_t)c->slots + 1, sizeof *s->sl_start);
    s->rank = calloc(nn, sizeof *s->rank);
    s->wit = calloc(c->slots, sizeof *s->wit);
    s->rest = calloc(nn, sizeof *s->rest);
    s->pos = malloc(nn * sizeof *s->pos);
    s->sol = calloc(nn, sizeof *s->sol);
    s->floor = calloc(c->slots, sizeof *s->floor);
    s->total = calloc(c->slots, sizeof *s->total);
    s->cuts = calloc(c->slots, sizeof *s->cuts);
    s->stamp = calloc(c->slots, sizeof *s->stamp);
    s->affected = calloc(c->slots, sizeof *s->affected);
    uint64_t *bylo = malloc(nn * sizeof *bylo);
    size_t nfill = nn > c->slots ? nn : c->slots; /* per slot first, then per item */
    uint32_t *fill = calloc(nfill, sizeof *fill);
    int rc = VMM_OK;
    if (!s->nb_start || !s->sl_start || !s->wit || !s->rank || !s->rest || !s->pos || !s->sol || !s->floor || !s->total ||
        !s->cuts || !s->stamp || !s->affected || !bylo || !fill) {
        rc = VMM_EHOSTMEM;
        goto out;
    }
    size_t slot_entries = 0;
    for (size_t i = 0; i < n; i++) {
        const plan_item *it = &c->items[i];
        s->pos[i] = NO_POS;
        slot_entries += it->hi - it->lo;
        for (uint32_t t = it->lo; t < it->hi; t++) {
            s->total[t] += it->size;
            s->sl_start[t + 1]++;
        }
        for (uint32_t t = it->lo; t + 1 < it->hi; t++)
            s->cuts[t]++;
        bylo[i] = (uint64_t)it->lo << 32 | i;
    }
    if (slot_entries > EXACT_MAX_ENTRIES) {
        rc = 1;
        goto out;
    }
    for (uint32_t t = 0; t < c->slots; t++)
        s->sl_start[t + 1] += s->sl_start[t];
    s->sl = malloc((slot_entries ? slot_entries : 1) * sizeof *s->sl);
    if (!s->sl) {
        rc = VMM_EHOSTMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++)
        for (uint32_t t = c->items[i].lo; t < c->items[i].hi; t++)
            s->sl[s->sl_start[t] + fill[t]++] = (uint32_t)i;
    for (uint32_t t = 0; t < c->slots; t++) /* a witness must be live in its slot */
        s->wit[t] = s->sl_start[t + 1] > s->sl_start[t] ? s->sl[s->sl_start[t]] : 0;
    /* Conflicts by a sweep in lifetime-start order: j after i conflicts while lo_j < hi_i. */
    qsort(bylo, n, sizeof *bylo, cmp_by_lo);
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t a = 0; a < n; a++) {
            uint32_t i = (uint32_t)bylo[a];
            for (size_t b = a + 1; b < n; b++) {
                uint32_t j = (uint32_t)bylo[b];
                if (c->items[j].lo >= c->items[i].hi)
                    break;
                if (pass == 0) {
                    s->nb_start[i + 1]++;
                    s->nb_start[j + 1]++;
                    total += 2;
                } else {
                    s->nb[s->nb_start[i] + fill[i]++] = j;
                    s->nb[s->nb_start[j] + fill[j]++] = i;
                }
            }
            if (total > EXACT_MAX_ENTRIES) {
                rc = 1;
                goto out;
            }
        }
        if (pass == 0) {
            for (size_t i = 0; i < n; i++)
                s->nb_start[i + 1] += s->nb_start[i];
            s->nb = malloc((total ? total : 1) * sizeof *s->nb);
            if (!s->nb) {
                rc = VMM_EHOSTMEM;
                goto out;
            }
            memset(fill, 0, nn * sizeof *fill);
        }
    }
out:
    free(bylo);
    free(fill);
    return rc;
}

/* A second search state over s's lists (which it shares; s must not be searching). */
static int xs_clone(xs *d, const xs *s)
{
    size_t nn = s->n ? s->n : 1, ns = s->slots;
    memset(d, 0, sizeof *d);
    d->c = s->c;
    d->n = s->n;
    d->slots = s->slots;
    d->nb_start = s->nb_start;
    d->nb = s->nb;
    d->sl_start = s->sl_start;
    d->sl = s->sl;
    d->clone = 1;
    d->rank = calloc(nn, sizeof *d->rank);
    d->wit = malloc(ns * sizeof *d->wit);
    d->rest = malloc(nn * sizeof *d->rest);
    d->pos = malloc(nn * sizeof *d->pos);
    d->sol = calloc(nn, sizeof *d->sol);
    d->floor = malloc(ns * sizeof *d->floor);
    d->total = malloc(ns * sizeof *d->total);
    d->cuts = malloc(ns * sizeof *d->cuts);
    d->stamp = calloc(ns, sizeof *d->stamp);
    d->affected = calloc(ns, sizeof *d->affected);
    if (!d->rank || !d->wit || !d->rest || !d->pos || !d->sol || !d->floor || !d->total ||
        !d->cuts || !d->stamp || !d->affected)
        return VMM_EHOSTMEM;
    memcpy(d->rest, s->rest, nn * sizeof *d->rest);
    memcpy(d->pos, s->pos, nn * sizeof *d->pos);
    memcpy(d->floor, s->floor, ns * sizeof *d->floor);
    memcpy(d->total, s->total, ns * sizeof *d->total);
    memcpy(d->cuts, s->cuts, ns * sizeof *d->cuts);
    memcpy(d->wit, s->wit, ns * sizeof *d->wit);
    return VMM_OK;
}

/* Stop here? Checked before every search with the rule used inside it (on the node count before
 * the next node), so a run stopped by a node limit stops where a run stopped by time after as many
 * nodes did. */
static int xs_stop(xs *s)
{
    if (!s->stopped && (s->nodes >= s->node_limit || atomic_load_explicit(s->halt, memory_order_relaxed) ||
                        plan_now() > s->deadline))
        s->stopped = 1;
    return s->stopped;
}

/* Is there a plan within cap? Levels lv0..lv1 of the round robin (top comment). XS_FOUND (s->sol
 * holds it), XS_NONE (proven not), XS_LIMIT (level lv1 ran out of nodes), XS_STOP (stopped, or
 * out of memory). */
static int feasible(xs *s, uint64_t cap, int lv0, int lv1)
{
    s->cap = cap;
    if (cap < s->c->lower_bound)
        return XS_NONE;
    if (xs_stop(s))
        return XS_STOP;
    size_t pn = s->n;
    if (grow((void **)&s->parts, &s->capparts, pn, sizeof *s->parts)) {
        s->oom = 1;
        return XS_STOP;
    }
    for (size_t i = 0; i < pn; i++)
        s->parts[i] = (uint32_t)i;
    s->nparts = pn;
    for (int lv = lv0; lv <= lv1 && lv <= EXACT_MAX_LEVEL; lv++)
        for (int o = 0; o < EXACT_ORDERS; o++) {
            s->order = o;
            s->budget = 2 * (uint64_t)(s->n + 1) << lv;
            int st = split_and_search(s, 0, pn, 0, s->slots, 0, 0, 2);
            if (st != XS_LIMIT)
                return st;
        }
    return XS_LIMIT;
}

/* ---- minimising: two searches ------------------------------------------------------------------ */

/* What the two searches tell each other. Only ever used to stop one when the other holds a plan
 * proven optimal, so it never changes which plan a run returns, only how soon. */
typedef struct exact_shared {
    atomic_uint_fast64_t bound_cap;    /* the bound search's cap: every lower cap is impossible */
    atomic_uint_fast64_t improve_best; /* the improving search's arena */
    atomic_int halt_bound, halt_improve;
} exact_shared;

/* The bound search: the lowest cap not proven impossible, one level of its round robin a step;
 * a plan there is optimal. */
typedef struct bound_search {
    xs *s;
    exact_shared *sh;
    uint64_t cap;
    int level, found, done;
} bound_search;

static void bound_step(bound_search *b)
{
    if (atomic_load(&b->sh->improve_best) <= b->cap || b->level > EXACT_MAX_LEVEL) {
        b->done = 1; /* the improving search's plan is optimal, or the search is exhausted */
        return;
    }
    int st = feasible(b->s, b->cap, b->level, b->level);
    if (st == XS_FOUND) {
        b->found = b->done = 1;
        atomic_store(&b->sh->halt_improve, 1);
    } else if (st == XS_NONE) {
        b->cap++;
        b->level = 0;
        atomic_store(&b->sh->bound_cap, b->cap);
    } else if (st == XS_LIMIT) {
        b->level++;
    } else {
        b->done = 1;
    }
}

/* The improving search: bisects the caps between what it proved impossible and its best plan,
 * the split point of each probe drawn between a quarter and three quarters of the interval by a
 * fixed pseudo-random sequence; a probe that runs out of nodes moves the bisection up, a plan
 * moves the top down, and when the interval left is small it starts again from the bottom. The
 * probes get node limits by Luby's sequence (1 1 2 1 1 2 4 ... levels 0 0 1 0 0 1 2 ...): how
 * hard a cap is to search varies wildly between nearby caps, so many short probes at varied caps,
 * with now and then a longer one, find plans far sooner than a few long ones. */
typedef struct improve_search {
    xs *s;
    exact_shared *sh;
    uint64_t *off;     /* its best plan */
    uint64_t best;     /* its arena (UINT64_MAX: none) */
    uint64_t none_max; /* every cap up to it is proven impossible */
    uint64_t lo;       /* bisection: the lowest cap left in this pass */
    uint64_t probes;
    int done;
} improve_search;

enum {
    /* A bisection pass ends when the interval left is below 1/2^IMPROVE_PASS_SHIFT of the whole. */
    IMPROVE_PASS_SHIFT = 5,
};

/* Level of probe i (from 0) by Luby's sequence: 0 0 1 0 0 1 2 0 0 1 0 0 1 2 3 ... */
static int luby_level(uint64_t i)
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

/* splitmix64: a fixed pseudo-random sequence (the same on every run and platform). */
static uint64_t mix64(uint64_t x)
{
    x += UINT64_C(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

static void improve_step(improve_search *m)
{
    uint64_t low = m->none_max + 1;
    if (low >= m->best || m->best <= atomic_load(&m->sh->bound_cap)) {
        m->done = 1; /* its plan is optimal */
        atomic_store(&m->sh->halt_bound, 1);
        return;
    }
    uint64_t pass_end = (m->best - low) >> IMPROVE_PASS_SHIFT;
    if (m->lo < low || m->lo + pass_end >= m->best)
        m->lo = low; /* a new pass */
    /* a cap in [lo, best - 1], frac/1024 of the way, frac in [256, 768] */
    uint64_t span = m->best - 1 - m->lo, frac = 256 + mix64(m->probes) % 513;
    uint64_t cap = m->lo + span / 1024 * frac + span % 1024 * frac / 1024;
    int lv = luby_level(m->probes);
    m->probes++;
    int st = feasible(m->s, cap, lv, lv);
    if (st == XS_FOUND) {
        uint64_t a = plan_arena(m->s->c, m->s->sol);
        if (a < m->best) {
            memcpy(m->off, m->s->sol, m->s->c->n * sizeof *m->off);
            m->best = a;
            atomic_store(&m->sh->improve_best, a);
        }
    } else if (st == XS_NONE || st == XS_LIMIT) {
        if (st == XS_NONE && cap > m->none_max)
            m->none_max = cap;
        m->lo = cap + 1;
    } else {
        m->done = 1;
    }
}

static void *improve_main(void *arg)
{
    improve_search *m = arg;
    while (!m->done)
        improve_step(m);
    return NULL;
}

int plan_exact(const plan_ctx *c, const uint64_t *seed, const plan_exact_in *in, uint64_t *off, plan_exact_out *out)
{
    memset(out, 0, sizeof *out);
    uint64_t seed_arena = seed ? plan_arena(c, seed) : UINT64_MAX;
    if (seed)
        memcpy(off, seed, c->n * sizeof *off);
    if (c->n == 0) {
        out->optimal = 1;
        return VMM_OK;
    }
    if ((in->capacity && seed_arena <= in->capacity) || seed_arena <= c->lower_bound) {
        out->optimal = seed_arena <= c->lower_bound;
        return VMM_OK;
    }
    xs s, t;
    memset(&s, 0, sizeof s);
    memset(&t, 0, sizeof t);
    t.clone = 1;
    exact_shared sh;
    atomic_init(&sh.bound_cap, c->lower_bound);
    atomic_init(&sh.improve_best, seed_arena);
    atomic_init(&sh.halt_bound, 0);
    atomic_init(&sh.halt_improve, 0);
    uint64_t *ioff = NULL;
    int rc = xs_init(&s, c);
    if (rc == 1) { /* too dense: keep the seed */
        xs_free(&s);
        return seed ? VMM_OK : plan_naive(c, off);
    }
    if (!rc && !in->capacity) {
        rc = xs_clone(&t, &s);
        ioff = malloc(c->n * sizeof *ioff);
        if (!ioff)
            rc = VMM_EHOSTMEM;
    }
    if (rc) {
        xs_free(&s);
        xs_free(&t);
        free(ioff);
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    }
    s.deadline = t.deadline = in->deadline;
    s.node_limit = in->node_limit[0];
    t.node_limit = in->node_limit[1];
    s.halt = &sh.halt_bound;
    t.halt = &sh.halt_improve;
    uint64_t best = seed_arena;
    if (in->capacity) {
        int st = feasible(&s, in->capacity, 0, EXACT_MAX_LEVEL);
        if (st == XS_FOUND) {
            memcpy(off, s.sol, c->n * sizeof *off);
            best = plan_arena(c, off);
        }
        out->infeasible = st == XS_NONE;
        out->optimal = out->infeasible;
    } else {
        /* Minimise with the two searches (top comment): each visits its nodes in the same order
         * whatever the limits, so a run's arena is a function of the node counts they reached
         * (when both reach an optimum, which of the two plans comes back may depend on timing).
         * With two threads they run side by side, else they take turns, fewer nodes first. */
        bound_search b = {&s, &sh, c->lower_bound, 0, 0, 0};
        improve_search m = {&t, &sh, ioff, seed_arena, c->lower_bound - 1, c->lower_bound, 0, 0};
        if (seed)
            memcpy(ioff, seed, c->n * sizeof *ioff);
        pthread_t th;
        int threaded = in->threads >= 2 && pthread_create(&th, NULL, improve_main, &m) == 0;
        if (threaded) {
            while (!b.done)
                bound_step(&b);
            pthread_join(th, NULL);
        } else {
            while (!b.done || !m.done) {
                if (!b.done && (m.done || s.nodes <= t.nodes))
                    bound_step(&b);
                else
                    improve_step(&m);
            }
        }
        if (b.found) {
            memcpy(off, s.sol, c->n * sizeof *off);
            best = plan_arena(c, off);
        }
        if (m.best < best) {
            memcpy(off, m.off, c->n * sizeof *off);
            best = m.best;
        }
        uint64_t proven = b.cap > m.none_max + 1 ? b.cap : m.none_max + 1; /* every lower cap impossible */
        out->optimal = best <= proven;
    }
    out->search_nodes[0] = s.nodes;
    out->search_nodes[1] = t.nodes;
    out->nodes = s.nodes + t.nodes;
    int oom = s.oom || t.oom;
    xs_free(&s);
    xs_free(&t);
    free(ioff);
    if (best == UINT64_MAX)
        return plan_naive(c, off);
    if (oom)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    return VMM_OK;
}
