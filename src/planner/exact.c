/* Exact search, after the ideas published with MiniMalloc (Moffitt, ASPLOS'23); the search below
 * is our own design.
 *
 * Canonical solutions. Any plan can be pushed down until every item rests on an item below it
 * that is live at the same time (or on 0), without growing the arena. Listing such a plan's items
 * by offset (ties by index), each item sits at align_up(top of the items live with it that come
 * earlier in the list). So the search builds the list: at each node it picks the next item, which
 * goes exactly at its resting height y, and y may never be below the previous item's offset
 * (the "floor"). Items whose resting height is below the floor cannot be next (they must later
 * rest on something not placed yet); items at the floor with a smaller index than the previous one
 * are skipped (the other order reaches the same plan); of identical items only the first unplaced
 * one is tried.
 *
 * Inference, to backtrack early:
 *  - an item whose resting height is below the floor and which has no unplaced time-neighbour left
 *    can never rest anywhere: dead end;
 *  - every unplaced item ends at or above max(floor, its resting height) + size: above the
 *    capacity means dead end;
 *  - per time slot, nothing unplaced can go below max(floor, top of what is placed there), so that
 *    plus the unplaced bytes live in the slot must fit under the capacity.
 * Without a capacity the search minimises: it first asks for a plan at the lower bound (often
 * exists, and the bound prunes hardest there), then branches and bounds below the best plan. */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum {
    /* Cap on conflict-list entries (uint32 each): beyond this the instance is too dense to search
     * and the seed is returned as is. 32 Mi entries = 128 MiB. */
    EXACT_MAX_NEIGHBOURS = 32 << 20,
    /* Clock reads cost more than a node; look at the time every this many nodes. */
    EXACT_CLOCK_EVERY = 1024,
};

typedef struct undo {
    uint32_t what; /* item index, or slot index | UNDO_SLOT */
    uint64_t old;
} undo;
#define UNDO_SLOT 0x80000000u

typedef struct search {
    const plan_ctx *c;
    size_t n;
    uint32_t slots;
    /* items in search order (size desc, then lifetime desc) */
    uint32_t *orig;            /* search index -> item index */
    uint32_t *lo, *hi;
    uint64_t *size, *align;
    uint32_t *nb_start, *nb;   /* conflict lists, CSR */
    uint32_t *twin_prev;       /* previous identical item, or UINT32_MAX */
    /* state */
    uint8_t *placed;
    uint64_t *rest;            /* max end of placed neighbours */
    uint32_t *free_nb;         /* unplaced neighbours */
    uint64_t *sky;             /* per slot: top of the placed items live there */
    uint64_t *remaining;       /* per slot: unplaced bytes live there */
    uint64_t *pos;             /* offset of placed items */
    undo *undo;
    size_t nundo, capundo;
    uint32_t *cand;
    size_t ncand, capcand;
    /* control */
    uint64_t cap;              /* a plan must fit in cap bytes */
    int minimise;              /* keep going after a plan, with cap = its arena - 1 */
    uint64_t best;             /* arena of best (UINT64_MAX none) */
    uint64_t *best_pos;        /* by search index */
    uint64_t nodes;
    double deadline;
    int stop, oom, timeout;
} search;

static int undo_push(search *s, uint32_t what, uint64_t old)
{
    if (s->nundo == s->capundo) {
        size_t nc = s->capundo ? 2 * s->capundo : 1024;
        undo *nu = realloc(s->undo, nc * sizeof *nu);
        if (!nu) {
            s->oom = s->stop = 1;
            return -1;
        }
        s->undo = nu;
        s->capundo = nc;
    }
    s->undo[s->nundo++] = (undo){what, old};
    return 0;
}

static void place(search *s, uint32_t b, uint64_t y)
{
    uint64_t top = y + s->size[b];
    s->placed[b] = 1;
    s->pos[b] = y;
    for (uint32_t k = s->nb_start[b]; k < s->nb_start[b + 1]; k++) {
        uint32_t j = s->nb[k];
        s->free_nb[j]--;
        if (!s->placed[j] && s->rest[j] < top) {
            if (undo_push(s, j, s->rest[j]))
                return;
            s->rest[j] = top;
        }
    }
    for (uint32_t t = s->lo[b]; t < s->hi[b]; t++) {
        if (undo_push(s, t | UNDO_SLOT, s->sky[t]))
            return;
        s->sky[t] = top;
        s->remaining[t] -= s->size[b];
    }
}

static void unplace(search *s, uint32_t b, size_t mark)
{
    while (s->nundo > mark) {
        undo u = s->undo[--s->nundo];
        if (u.what & UNDO_SLOT)
            s->sky[u.what & ~UNDO_SLOT] = u.old;
        else
            s->rest[u.what] = u.old;
    }
    for (uint32_t t = s->lo[b]; t < s->hi[b]; t++)
        s->remaining[t] += s->size[b];
    for (uint32_t k = s->nb_start[b]; k < s->nb_start[b + 1]; k++)
        s->free_nb[s->nb[k]]++;
    s->placed[b] = 0;
}

static uint64_t rest_at(const search *s, uint32_t i) { return plan_align_up(s->rest[i], s->align[i]); }

static void dfs(search *s, size_t depth, uint64_t floor, uint32_t last, uint64_t top)
{
    if (s->stop)
        return;
    if (depth == s->n) {
        s->best = top;
        memcpy(s->best_pos, s->pos, s->n * sizeof *s->pos);
        if (!s->minimise || top <= s->c->lower_bound)
            s->stop = 1;
        else
            s->cap = top - 1;
        return;
    }
    if (++s->nodes % EXACT_CLOCK_EVERY == 0 && plan_now() > s->deadline) {
        s->stop = s->timeout = 1;
        return;
    }
    for (uint32_t t = 0; t < s->slots; t++)
        if (s->remaining[t] && (s->sky[t] > floor ? s->sky[t] : floor) + s->remaining[t] > s->cap)
            return;
    size_t base = s->ncand;
    for (uint32_t i = 0; i < s->n; i++) {
        if (s->placed[i])
            continue;
        uint64_t y = rest_at(s, i);
        uint64_t eff = y >= floor ? y : plan_align_up(floor, s->align[i]);
        if (eff + s->size[i] > s->cap)
            goto prune;
        if (y < floor) {
            if (s->free_nb[i] == 0)
                goto prune; /* nothing left to rest on */
            continue;
        }
        if (y == floor && i < last)
            continue;
        if (s->twin_prev[i] != UINT32_MAX && !s->placed[s->twin_prev[i]])
            continue;
        if (s->ncand == s->capcand) {
            size_t nc = s->capcand ? 2 * s->capcand : 1024;
            uint32_t *nv = realloc(s->cand, nc * sizeof *nv);
            if (!nv) {
                s->oom = s->stop = 1;
                goto prune;
            }
            s->cand = nv;
            s->capcand = nc;
        }
        /* Insertion by (resting height asc, search index asc): low placements first. */
        size_t p = s->ncand++;
        while (p > base && rest_at(s, s->cand[p - 1]) > y) {
            s->cand[p] = s->cand[p - 1];
            p--;
        }
        s->cand[p] = i;
    }
    for (size_t k = base; k < s->ncand && !s->stop; k++) {
        uint32_t b = s->cand[k];
        uint64_t y = rest_at(s, b);
        if (y + s->size[b] > s->cap)
            continue; /* cap dropped since the list was made */
        size_t mark = s->nundo;
        place(s, b, y);
        if (!s->oom)
            dfs(s, depth + 1, y, b, top > y + s->size[b] ? top : y + s->size[b]);
        unplace(s, b, mark);
    }
prune:
    s->ncand = base;
}

/* Search order: size desc, lifetime desc, then item index. */
typedef struct sk {
    uint64_t size;
    uint32_t len, idx;
} sk;
static int cmp_sk(const void *a, const void *b)
{
    const sk *x = a, *y = b;
    if (x->size != y->size)
        return x->size < y->size ? 1 : -1;
    if (x->len != y->len)
        return x->len < y->len ? 1 : -1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

static void search_free(search *s)
{
    free(s->orig);
    free(s->lo);
    free(s->hi);
    free(s->size);
    free(s->align);
    free(s->nb_start);
    free(s->nb);
    free(s->twin_prev);
    free(s->placed);
    free(s->rest);
    free(s->free_nb);
    free(s->sky);
    free(s->remaining);
    free(s->pos);
    free(s->undo);
    free(s->cand);
    free(s->best_pos);
}

/* 1 when the conflict lists would be too big to search. */
static int search_init(search *s, const plan_ctx *c)
{
    size_t n = c->n;
    s->c = c;
    s->n = n;
    s->slots = c->slots;
    sk *keys = malloc((n ? n : 1) * sizeof *keys);
    s->orig = malloc((n ? n : 1) * sizeof *s->orig);
    s->lo = malloc((n ? n : 1) * sizeof *s->lo);
    s->hi = malloc((n ? n : 1) * sizeof *s->hi);
    s->size = malloc((n ? n : 1) * sizeof *s->size);
    s->align = malloc((n ? n : 1) * sizeof *s->align);
    s->nb_start = calloc(n + 1, sizeof *s->nb_start);
    s->twin_prev = malloc((n ? n : 1) * sizeof *s->twin_prev);
    s->placed = calloc(n ? n : 1, 1);
    s->rest = calloc(n ? n : 1, sizeof *s->rest);
    s->free_nb = calloc(n ? n : 1, sizeof *s->free_nb);
    s->sky = calloc(c->slots, sizeof *s->sky);
    s->remaining = calloc(c->slots, sizeof *s->remaining);
    s->pos = calloc(n ? n : 1, sizeof *s->pos);
    s->best_pos = calloc(n ? n : 1, sizeof *s->best_pos);
    if (!keys || !s->orig || !s->lo || !s->hi || !s->size || !s->align || !s->nb_start || !s->twin_prev ||
        !s->placed || !s->rest || !s->free_nb || !s->sky || !s->remaining || !s->pos || !s->best_pos) {
        free(keys);
        return VMM_EHOSTMEM;
    }
    for (size_t i = 0; i < n; i++)
        keys[i] = (sk){c->items[i].size, c->items[i].hi - c->items[i].lo, (uint32_t)i};
    qsort(keys, n, sizeof *keys, cmp_sk);
    for (size_t i = 0; i < n; i++) {
        const plan_item *it = &c->items[keys[i].idx];
        s->orig[i] = keys[i].idx;
        s->lo[i] = it->lo;
        s->hi[i] = it->hi;
        s->size[i] = it->size;
        s->align[i] = it->align;
        for (uint32_t t = it->lo; t < it->hi; t++)
            s->remaining[t] += it->size;
    }
    free(keys);
    /* Conflict lists: count, then fill. Quadratic, but the search is for modest n. */
    size_t total = 0;
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < n; i++) {
            for (size_t j = 0; j < n; j++) {
                if (i == j || s->hi[i] <= s->lo[j] || s->hi[j] <= s->lo[i])
                    continue;
                if (pass == 0)
                    total++;
                else
                    s->nb[s->nb_start[i] + s->free_nb[i]++] = (uint32_t)j;
            }
            if (pass == 0) {
                s->nb_start[i + 1] = (uint32_t)total;
                if (total > EXACT_MAX_NEIGHBOURS)
                    return 1;
            }
        }
        if (pass == 0) {
            s->nb = malloc((total ? total : 1) * sizeof *s->nb);
            if (!s->nb)
                return VMM_EHOSTMEM;
        }
    }
    for (size_t i = 0; i < n; i++) {
        s->twin_prev[i] = UINT32_MAX;
        for (size_t j = i; j-- > 0;) {
            if (s->size[j] != s->size[i])
                break; /* sorted by size: no twin further back */
            if (s->lo[j] == s->lo[i] && s->hi[j] == s->hi[i] && s->align[j] == s->align[i]) {
                s->twin_prev[i] = (uint32_t)j;
                break;
            }
        }
    }
    return VMM_OK;
}

int plan_exact(const plan_ctx *c, const uint64_t *seed, uint64_t capacity, double deadline, uint64_t *off,
               plan_exact_out *out)
{
    memset(out, 0, sizeof *out);
    uint64_t seed_arena = seed ? plan_arena(c, seed) : UINT64_MAX;
    if (seed)
        memcpy(off, seed, c->n * sizeof *off);
    if (c->n == 0) {
        out->optimal = 1;
        return VMM_OK;
    }
    if ((capacity && seed_arena <= capacity) || seed_arena <= c->lower_bound) {
        out->optimal = seed_arena <= c->lower_bound;
        return VMM_OK;
    }
    search s;
    memset(&s, 0, sizeof s);
    int rc = search_init(&s, c);
    if (rc == 1) {
        search_free(&s);
        if (!seed)
            return plan_naive(c, off);
        return VMM_OK;
    }
    if (rc) {
        search_free(&s);
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    }
    s.best = UINT64_MAX;
    s.deadline = deadline;
    if (capacity) {
        s.cap = capacity;
        dfs(&s, 0, 0, 0, 0);
        out->infeasible = !s.timeout && !s.oom && s.best == UINT64_MAX;
        out->optimal = out->infeasible;
    } else {
        /* Phase 1: a plan at the lower bound, with half the time. */
        double now = plan_now();
        s.cap = c->lower_bound;
        s.deadline = now + (deadline - now) / 2;
        dfs(&s, 0, 0, 0, 0);
        if (s.best != UINT64_MAX) {
            out->optimal = 1;
        } else if (!s.oom) {
            /* Phase 2: branch and bound below the seed. */
            s.stop = s.timeout = 0;
            s.deadline = deadline;
            s.minimise = 1;
            s.cap = seed_arena - 1;
            dfs(&s, 0, 0, 0, 0);
            out->optimal = !s.timeout && !s.oom;
        }
    }
    out->nodes = s.nodes;
    if (s.best != UINT64_MAX && s.best < seed_arena)
        for (size_t i = 0; i < s.n; i++)
            off[s.orig[i]] = s.best_pos[i];
    else if (!seed)
        rc = plan_naive(c, off);
    int oom = s.oom;
    search_free(&s);
    if (oom)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    return rc;
}
