/*
 * Planner internals shared by the files in src/planner (private to the planner; the allocator never sees it).
 * Every algorithm works on "items": a buffer, or a contiguous group fused into one block. Times are
 * compressed to slot numbers 0..slots-1; item i is live in slots [lo, hi).
 */
#ifndef VMM_PLANNER_H
#define VMM_PLANNER_H

#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/errors.h"
#include "vmmalloc_plan.h"

typedef struct plan_item {
    uint32_t lo, hi;  /* live slots [lo, hi) */
    uint64_t size;    /* bytes, including padding between group members */
    uint64_t align;   /* power of two >= 1 */
} plan_item;

typedef struct plan_ctx {
    size_t n;          /* items */
    uint32_t slots;    /* distinct time points - 1 (at least 1) */
    plan_item *items;
    uint64_t lower_bound;
    uint64_t *live;    /* live bytes per slot (lower bound = max) */
    int64_t *time;     /* slots + 1 entries: the caller's time at each slot boundary */
    /* Back to the caller's buffers: buffer b sits at item_of[b]'s offset + rel[b]. */
    size_t nbuf;
    size_t *item_of;   /* SIZE_MAX: the buffer is not in this problem (unplanned, not selected) */
    uint64_t *rel;
    size_t nplanned;   /* buffers in items */
    unsigned char *chain; /* per item: an alias chain */
    uint64_t *key;     /* per item: the reuse key of its (first) buffer */
    int exact_items;   /* 0 when a chain's members differ in size (its item is then generous) */
    uint64_t bound;    /* lower bound from the buffers (aliases counted once); <= lower_bound,
                        * equal when exact_items */
} plan_ctx;

static inline uint64_t plan_align_up(uint64_t v, uint64_t a) { return (v + a - 1) & ~(a - 1); }

/* Modules call downward only: plan.c (vmm_plan, the dispatcher) > heuristics.c, exact.c,
 * improve.c > tree.c, place.c, naive.c > problem.c (these utilities); verify.c (the independent
 * checker and the lower bound) uses problem.c only; csv.c (files) uses verify.c's checks. */

/* ---- problem.c ----------------------------------------------------------------------------- */
/* The rules of vmm_plan_check; messages name buffers by ids[i] when ids is not NULL, else by
 * index; *bad (not NULL) gets the offending index. VMM_OK, VMM_EINVAL, VMM_EHOSTMEM. */
int plan_check(const vmm_plan_buffer *bufs, size_t n, char *const *ids, size_t *bad);
/* root[i]: the first buffer of i's alias chain (i itself when not an alias). bufs checked. */
void plan_alias_roots(const vmm_plan_buffer *bufs, size_t n, size_t *root);
/* Buffer i is left to the runtime: its chain's root is unplanned. */
int plan_is_unplanned(const vmm_plan_buffer *bufs, const size_t *root, size_t i);
/* Validate bufs and build the items of the planned buffers whose chain root r has sel[r] set
 * (sel NULL: every planned buffer, whatever its arena). VMM_EINVAL naming the buffer, VMM_EHOSTMEM. */
int plan_ctx_build_sel(plan_ctx *c, const vmm_plan_buffer *bufs, size_t n, const unsigned char *sel);
int plan_ctx_build(plan_ctx *c, const vmm_plan_buffer *bufs, size_t n);
void plan_ctx_free(plan_ctx *c);
/* Arena of item offsets off[] (max off + size). */
uint64_t plan_arena(const plan_ctx *c, const uint64_t *off);
/* Monotonic seconds. */
double plan_now(void);

/* ---- generate.c ----------------------------------------------------------------------------- */
const char *plan_gen_style_name(int style);

/* ---- naive.c -------------------------------------------------------------------------------- */
/* Each writes one offset per item into off and returns VMM_OK or VMM_EHOSTMEM. */
int plan_naive(const plan_ctx *c, uint64_t *off);
int plan_greedy_shared(const plan_ctx *c, uint64_t *off);
/* Items end to end in order of birth (lo, then index): the double cursor's lower cursor. */
int plan_bump(const plan_ctx *c, uint64_t *off);

/* ---- reuse.c -------------------------------------------------------------------------------- */
/* torch inductor's memory_plan_reuse: in time order, an item takes the offset of the last freed
 * item of the same size, alignment and key, else new bytes at the top. VMM_OK or VMM_EHOSTMEM. */
int plan_reuse(const plan_ctx *c, uint64_t *off);

/* ---- place.c -------------------------------------------------------------------------------- */
enum plan_fit { PLAN_FIT_BEST = 0, PLAN_FIT_FIRST = 1, PLAN_FIT_COUNT = 2 };
enum plan_order {
    PLAN_ORDER_SIZE = 0,     /* size desc, then longer lifetime (TFLite greedy by size) */
    PLAN_ORDER_AREA,         /* size x lifetime desc */
    PLAN_ORDER_LENGTH,       /* lifetime desc, then size */
    PLAN_ORDER_BREADTH,      /* peak live bytes within the lifetime desc, then size */
    PLAN_ORDER_START,        /* lower asc, then size desc */
    PLAN_ORDER_END,          /* upper desc, then size desc */
    PLAN_ORDER_COUNT
};
/* Fill order[] (n item indices) by rule. VMM_OK or VMM_EHOSTMEM. */
int plan_make_order(const plan_ctx *c, int rule, uint32_t *order);
/* Place items in the given order, each into the gap among time-overlapping placed items chosen by
 * fit (or on top of them all). VMM_OK or VMM_EHOSTMEM. */
int plan_place(const plan_ctx *c, const uint32_t *order, int fit, uint64_t *off);
/* The same with the first nfixed items of order kept where off already has them (a valid partial
 * plan); the rest placed around them. */
int plan_place_fixed(const plan_ctx *c, const uint32_t *order, size_t nfixed, int fit, uint64_t *off);
const char *plan_order_name(int rule);
const char *plan_fit_name(int fit);

/* ---- tree.c --------------------------------------------------------------------------------- */
int plan_tree(const plan_ctx *c, uint64_t *off);

/* ---- heuristics.c --------------------------------------------------------------------------- */
/* Run every heuristic on `threads` threads (0 = CPUs), keep the lowest arena. winner gets its name. */
int plan_heuristics(const plan_ctx *c, int threads, uint64_t *off, char *winner, size_t wlen);

/* ---- improve.c ------------------------------------------------------------------------------ */
/* Improve the valid plan in off by placing reordered items again until the arena is at most
 * target (or the lower bound), the deadline passes or progress stops; off keeps the lowest arena
 * seen (never higher than it came in). VMM_OK or VMM_EHOSTMEM. */
int plan_improve(const plan_ctx *c, uint64_t target, double deadline, uint64_t *off);

/* ---- tile.c --------------------------------------------------------------------------------- */
/* 1 when every slot's live bytes equal the lower bound (a plan at the bound is then a tiling). */
int plan_tile_applies(const plan_ctx *c);
/* Look for a plan at the lower bound by the tiling search, until the deadline or node_limit (0:
 * none) nodes; *found = 1 and off filled when it finds one. Else off holds the deepest partial
 * tiling seen (UINT64_MAX for the items it left out; all of them when plan_tile_applies is 0,
 * when nothing is searched), and alt (unless NULL) the other time direction's deepest partial
 * tiling (all UINT64_MAX when found). With threads >= 2 the two time directions run on two threads (one
 * started and joined here); the result under a node limit does not depend on threads. *nodes:
 * nodes visited. VMM_OK or VMM_EHOSTMEM. */
int plan_tile(const plan_ctx *c, double deadline, uint64_t node_limit, int threads, uint64_t *off, uint64_t *alt,
              uint64_t *nodes, int *found);
/* Tests only (0 by default; set it before plan_tile, not during): 1 turns the tiling search's
 * stretch cache off, so every node evaluates every stretch again. The search and its result are
 * the same either way; only the time differs. */
extern int vmm_plan_tile_no_cache;

/* ---- exact.c -------------------------------------------------------------------------------- */
typedef struct plan_exact_in {
    uint64_t capacity;      /* 0: minimise; else stop at the first plan within it */
    double deadline;        /* plan_now() time */
    uint64_t node_limit[2]; /* nodes the bound search and the improving search may visit (with a
                             * capacity: [0] for the one search); UINT64_MAX: no limit */
    int threads;            /* >= 2: minimising runs its two searches on two threads */
} plan_exact_in;
typedef struct plan_exact_out {
    int optimal;     /* the search finished: off is minimal (or capacity proven infeasible) */
    int infeasible;  /* capacity given and proven impossible */
    uint64_t nodes;  /* both searches */
    uint64_t search_nodes[2]; /* the bound search's, the improving search's */
} plan_exact_out;
/* Search from seed (a valid plan, may be NULL) for a smaller arena; with a capacity stop at the
 * first plan fitting it. off gets the best plan (the seed when nothing better is found). The
 * search is anytime (exact.c): each of its searches visits the same nodes in the same order
 * whatever the deadline and node limits, and the plan returned is the best one they found by the
 * node counts they reached (out->search_nodes); node limits of those counts give the same arena. */
int plan_exact(const plan_ctx *c, const uint64_t *seed, const plan_exact_in *in, uint64_t *off,
               plan_exact_out *out);

#endif /* VMM_PLANNER_H */
