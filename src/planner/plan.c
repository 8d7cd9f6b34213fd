/* The dispatcher: vmm_plan and its options. It calls the algorithms, which call the utilities of
 * problem.c; nothing below calls back up here. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner.h"

enum {
    /* "best" skips the exact search above this many items: the search keeps O(items) state per
     * node and a conflict list per item, and the heuristics are within a fraction of a percent of
     * the bound on real traces that large; there the reordering pass (improve.c) runs instead
     * (docs/planner.md). */
    PLAN_BEST_EXACT_MAX_ITEMS = 4096,
};
#define PLAN_DEFAULT_TIME_LIMIT_S 10.0
/* The tiling search's share of the time left after the heuristics, on instances it applies to. */
#define TILE_SHARE 0.75

static const char *const algo_names[VMM_PLAN_ALGO_COUNT] = {
    "naive", "greedy", "greedy-size", "tree", "heuristics", "exact", "best", "reuse", "double-cursor",
};

VMM_API const char *vmm_plan_algo_name(int algo)
{
    return algo >= 0 && algo < VMM_PLAN_ALGO_COUNT ? algo_names[algo] : "unknown";
}

VMM_API int vmm_plan_algo_from_name(const char *name, int *algo)
{
    for (int i = 0; name && algo && i < VMM_PLAN_ALGO_COUNT; i++)
        if (strcmp(name, algo_names[i]) == 0) {
            *algo = i;
            return VMM_OK;
        }
    return vmm_fail(VMM_EINVAL, "plan: unknown algorithm '%s' (naive, greedy, greedy-size, tree, "
                                "heuristics, exact, best, reuse, double-cursor)", name ? name : "(null)");
}

VMM_API void vmm_plan_options_init(vmm_plan_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->algo = VMM_PLAN_BEST;
    opt->time_limit_s = PLAN_DEFAULT_TIME_LIMIT_S;
}

/* The tiling search fell short: its deepest partial tiling (part, UINT64_MAX for the items it left
 * out) with the rest placed around it, in each order x fit rule of the heuristics; the lowest
 * replaces off when below *arena. */
static int tile_fallback(const plan_ctx *c, const uint64_t *part, uint64_t *off, uint64_t *arena, char *winner,
                         size_t wlen)
{
    size_t n = c->n, nf = 0;
    for (size_t i = 0; i < n; i++)
        nf += part[i] != UINT64_MAX;
    if (nf == 0)
        return VMM_OK;
    uint32_t *order = malloc(n * sizeof *order), *rule = malloc(n * sizeof *rule);
    uint64_t *cur = malloc(n * sizeof *cur);
    int rc = order && rule && cur ? VMM_OK : vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    for (int r = 0; !rc && r < PLAN_ORDER_COUNT; r++) {
        rc = plan_make_order(c, r, rule);
        size_t k = 0, m = nf;
        for (size_t j = 0; !rc && j < n; j++) /* the partial first (kept), then the rest by the rule */
            if (part[rule[j]] != UINT64_MAX)
                order[k++] = rule[j];
            else
                order[m++] = rule[j];
        for (int fit = 0; !rc && fit < PLAN_FIT_COUNT; fit++) {
            memcpy(cur, part, n * sizeof *cur);
            rc = plan_place_fixed(c, order, nf, fit, cur);
            uint64_t a = rc ? UINT64_MAX : plan_arena(c, cur);
            if (a < *arena) {
                memcpy(off, cur, n * sizeof *off);
                *arena = a;
                snprintf(winner, wlen, "tile+%s/%s", plan_order_name(r), plan_fit_name(fit));
            }
        }
    }
    free(order);
    free(rule);
    free(cur);
    return rc;
}

/* Run algo on the items; fills off and the region's optimal/nodes/winner. */
static int run_algo(const plan_ctx *c, const vmm_plan_options *o, int algo, uint64_t capacity, double deadline,
                    uint64_t *off, char *winner, size_t wlen, uint64_t *nodes, int *optimal, int *infeasible)
{
    int rc = VMM_OK;
    switch (algo) {
    case VMM_PLAN_NAIVE:
        return plan_naive(c, off);
    case VMM_PLAN_GREEDY:
        return plan_greedy_shared(c, off);
    case VMM_PLAN_TREE:
        return plan_tree(c, off);
    case VMM_PLAN_REUSE:
        return plan_reuse(c, off);
    case VMM_PLAN_DOUBLE_CURSOR: /* the long-lived region; the short one comes as greedy-size */
        return plan_bump(c, off);
    case VMM_PLAN_GREEDY_SIZE: {
        uint32_t *order = malloc((c->n ? c->n : 1) * sizeof *order);
        if (!order)
            return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        rc = plan_make_order(c, PLAN_ORDER_SIZE, order);
        if (!rc)
            rc = plan_place(c, order, PLAN_FIT_BEST, off);
        free(order);
        return rc;
    }
    default:
        break;
    }
    rc = plan_heuristics(c, o->threads, off, winner, wlen);
    if (rc || algo == VMM_PLAN_HEURISTICS || c->n == 0)
        return rc;
    uint64_t arena = plan_arena(c, off);
    if (arena <= c->lower_bound || (capacity && arena <= capacity))
        return VMM_OK;
    if (plan_tile_applies(c)) {
        /* Every slot at the bound: a plan there is a tiling, which the tiling search looks for
         * with half the time (tile.c); the searches below get the rest. */
        uint64_t tn = 0, *toff = malloc(2 * c->n * sizeof *toff);
        int found = 0, threads = o->threads;
        if (threads <= 0) {
            long cpus = sysconf(_SC_NPROCESSORS_ONLN);
            threads = cpus > 0 ? (int)cpus : 1;
        }
        double now = plan_now();
        rc = toff ? plan_tile(c, deadline > now ? now + (deadline - now) * TILE_SHARE : deadline,
                              o->node_limit ? (o->node_limit > 1 ? o->node_limit / 2 : 1) : 0, threads,
                              toff, toff + c->n, &tn, &found)
                  : vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        *nodes += tn;
        if (!rc && found) {
            memcpy(off, toff, c->n * sizeof *off);
            snprintf(winner, wlen, "tile");
        }
        /* the deeper partial tiling and the other direction's, each completed by the rules */
        for (int k = 0; k < 2 && !rc && !found; k++)
            rc = tile_fallback(c, toff + k * c->n, off, &arena, winner, wlen);
        free(toff);
        if (rc || found || (capacity && arena <= capacity))
            return rc;
    }
    if (algo == VMM_PLAN_BEST && c->n > PLAN_BEST_EXACT_MAX_ITEMS) {
        rc = plan_improve(c, capacity, deadline, off);
        if (!rc && plan_arena(c, off) < arena)
            snprintf(winner, wlen, "improve");
        return rc;
    }
    uint64_t *seed = malloc(c->n * sizeof *seed);
    if (!seed)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    memcpy(seed, off, c->n * sizeof *seed);
    plan_exact_in ei = {capacity, deadline, {UINT64_MAX, UINT64_MAX}, o->threads};
    if (o->node_limit && capacity)
        ei.node_limit[0] = o->node_limit;
    else if (o->node_limit) /* in all: half each */
        ei.node_limit[0] = o->node_limit - o->node_limit / 2, ei.node_limit[1] = o->node_limit / 2;
    if (ei.threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        ei.threads = cpus > 0 ? (int)cpus : 1;
    }
    plan_exact_out eo;
    rc = plan_exact(c, seed, &ei, off, &eo);
    free(seed);
    *nodes += eo.nodes;
    if (!rc && plan_arena(c, off) < arena)
        snprintf(winner, wlen, "exact");
    /* proven for the items; the items are the buffers unless a chain's sizes differ */
    if (!rc && eo.optimal && !capacity && c->exact_items)
        *optimal = 1;
    *infeasible = eo.infeasible;
    return rc;
}

/* One region (an arena, or one cursor's part of it) planned on its own. */
typedef struct region {
    uint64_t top;    /* base + the plan's arena (base when empty) */
    uint64_t bound;  /* its lower bound from the buffers */
    uint64_t nodes;
    size_t buffers;
    int optimal, infeasible;
    char winner[48];
} region;

/* Plan the buffers selected by sel (by chain root) with algo, their offsets (plus base) into tmp. */
static int plan_region(const vmm_plan_buffer *bufs, size_t n, const unsigned char *sel, const vmm_plan_options *o,
                       int algo, uint64_t capacity, double deadline, uint64_t base, vmm_plan_buffer *tmp, region *g)
{
    memset(g, 0, sizeof *g);
    snprintf(g->winner, sizeof g->winner, "%s", vmm_plan_algo_name(algo));
    plan_ctx c;
    int rc = plan_ctx_build_sel(&c, bufs, n, sel);
    if (rc)
        return rc;
    uint64_t *off = calloc(c.n ? c.n : 1, sizeof *off);
    if (!off) {
        plan_ctx_free(&c);
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    }
    rc = run_algo(&c, o, algo, capacity, deadline, off, g->winner, sizeof g->winner, &g->nodes, &g->optimal,
                  &g->infeasible);
    if (!rc) {
        for (size_t i = 0; i < n; i++)
            if (c.item_of[i] != SIZE_MAX)
                tmp[i].offset = base + off[c.item_of[i]] + c.rel[i];
        g->top = base + plan_arena(&c, off);
        g->bound = c.bound;
        g->buffers = c.nplanned;
        if (g->top - base <= c.bound)
            g->optimal = 1;
    }
    free(off);
    plan_ctx_free(&c);
    return rc;
}

/* The share of the time left for one of `left` parts still to plan. */
static double share(double end, int left)
{
    double now = plan_now();
    return end > now ? now + (end - now) / left : end;
}

/* Arena a with the double cursor: long-lived chains and groups (lifetime >= frac of the arena's
 * span) planned from the bottom, the rest above their top. */
static int plan_cursors(const vmm_plan_buffer *bufs, size_t n, const unsigned char *sel, const vmm_plan_options *o,
                        uint64_t capacity, double end, vmm_plan_buffer *tmp, vmm_plan_arena_result *ar, region *all)
{
    plan_ctx c;
    int rc = plan_ctx_build_sel(&c, bufs, n, sel);
    if (rc)
        return rc;
    unsigned char *lsel = calloc(n ? n : 1, 1), *ssel = calloc(n ? n : 1, 1);
    if (!lsel || !ssel) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    double frac = o->long_lived > 0 ? o->long_lived : 0.5;
    double span = (double)(c.time[c.slots] - c.time[0]);
    uint64_t salign = 1;
    for (size_t i = 0; i < n; i++) {
        if (c.item_of[i] == SIZE_MAX)
            continue;
        const plan_item *it = &c.items[c.item_of[i]];
        int is_long = (double)(c.time[it->hi] - c.time[it->lo]) >= frac * span;
        (is_long ? lsel : ssel)[i] = 1; /* roots and group members; sel is read at chain roots */
        if (!is_long && it->align > salign)
            salign = it->align;
    }
    int algo = o->algo == VMM_PLAN_DOUBLE_CURSOR ? VMM_PLAN_DOUBLE_CURSOR : o->algo;
    region lg, sg;
    rc = plan_region(bufs, n, lsel, o, algo, 0, share(end, 2), 0, tmp, &lg);
    if (rc)
        goto out;
    uint64_t base = plan_align_up(lg.top, salign);
    uint64_t scap = capacity ? (capacity > base ? capacity - base : 1) : 0;
    int salgo = o->algo == VMM_PLAN_DOUBLE_CURSOR ? VMM_PLAN_GREEDY_SIZE : o->algo;
    rc = plan_region(bufs, n, ssel, o, salgo, scap, share(end, 1), base, tmp, &sg);
    if (rc)
        goto out;
    all->top = sg.buffers ? sg.top : lg.top;
    all->bound = c.bound;
    all->nodes = lg.nodes + sg.nodes;
    all->buffers = lg.buffers + sg.buffers;
    all->infeasible = 0; /* a proof under the cursor rule says nothing of the arena */
    all->optimal = all->top <= c.bound;
    snprintf(all->winner, sizeof all->winner, "cursor %.19s+%.19s", lg.winner, sg.winner);
    ar->long_lived_bytes = lg.top;
out:
    free(lsel);
    free(ssel);
    plan_ctx_free(&c);
    return rc;
}

VMM_API int vmm_plan(vmm_plan_buffer *bufs, size_t n, const vmm_plan_options *opt, vmm_plan_result *res)
{
    double t0 = plan_now();
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    if (opt)
        o = *opt;
    if (o.algo < 0 || o.algo >= VMM_PLAN_ALGO_COUNT)
        return vmm_fail(VMM_EINVAL, "plan: unknown algorithm %d", o.algo);
    if (!(o.time_limit_s >= 0) || o.threads < 0 || !(o.long_lived >= 0 && o.long_lived <= 1))
        return vmm_fail(VMM_EINVAL, "plan: bad time limit, thread count or long-lived fraction");
    int rc = plan_check(bufs, n, NULL, NULL);
    if (rc)
        return rc;
    vmm_plan_result r;
    memset(&r, 0, sizeof r);
    size_t *root = malloc((n ? n : 1) * sizeof *root);
    unsigned char *sel = malloc(n ? n : 1);
    vmm_plan_buffer *tmp = malloc((n ? n : 1) * sizeof *tmp);
    if (!root || !sel || !tmp) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    plan_alias_roots(bufs, n, root);
    unsigned used = 0; /* arenas with planned buffers, a bit each */
    for (size_t i = 0; i < n; i++) {
        tmp[i] = bufs[i];
        tmp[i].offset = 0;
        if (plan_is_unplanned(bufs, root, i))
            r.unplanned++;
        else
            used |= 1u << bufs[i].arena;
    }
    for (uint32_t a = 0; a < VMM_PLAN_MAX_ARENAS; a++)
        if (o.capacities && o.capacities[a] && !(used >> a & 1u)) {
            rc = vmm_fail(VMM_EINVAL, "plan: a capacity for arena %u, which has no planned buffer", a);
            goto out;
        }
    int left = __builtin_popcount(used), cursor = o.double_cursor || o.algo == VMM_PLAN_DOUBLE_CURSOR;
    double end = t0 + o.time_limit_s;
    int all_optimal = 1, fails = 0;
    char failmsg[256] = "";
    for (uint32_t a = 0; a < VMM_PLAN_MAX_ARENAS; a++) {
        if (!(used >> a & 1u))
            continue;
        for (size_t i = 0; i < n; i++)
            sel[i] = bufs[i].arena == a;
        vmm_plan_arena_result *ar = &r.arenas[r.arena_count++];
        ar->id = a;
        ar->capacity = o.capacities && o.capacities[a] ? o.capacities[a] : o.capacity;
        region g;
        if (cursor)
            rc = plan_cursors(bufs, n, sel, &o, ar->capacity, share(end, left), tmp, ar, &g);
        else
            rc = plan_region(bufs, n, sel, &o, o.algo, ar->capacity, share(end, left), 0, tmp, &g);
        left--;
        if (rc)
            goto out;
        ar->bytes = g.top;
        ar->lower_bound_bytes = g.bound;
        ar->buffers = (uint32_t)g.buffers;
        ar->optimal = g.optimal;
        r.arena_bytes += g.top;
        r.lower_bound_bytes += g.bound;
        r.nodes += g.nodes;
        all_optimal &= g.optimal;
        snprintf(r.winner, sizeof r.winner, "%s", r.arena_count == 1 ? g.winner : "per arena");
        if (ar->capacity && g.top > ar->capacity && !fails++)
            snprintf(failmsg, sizeof failmsg, "arena %u: %s plan of %llu bytes exceeds capacity %llu", a,
                     g.infeasible ? "proven: no" : "best found", (unsigned long long)g.top,
                     (unsigned long long)ar->capacity);
    }
    if (r.arena_count == 0)
        snprintf(r.winner, sizeof r.winner, "%s", vmm_plan_algo_name(o.algo));
    uint64_t arena = 0;
    rc = vmm_plan_verify(tmp, n, &arena);
    if (rc) {
        rc = vmm_fail(VMM_ECORRUPT, "plan: %s produced an invalid plan: %s", vmm_plan_algo_name(o.algo),
                      vmm_last_error());
        goto out;
    }
    if (arena != r.arena_bytes) {
        rc = vmm_fail(VMM_ECORRUPT, "plan: arena mismatch (%llu vs %llu)", (unsigned long long)arena,
                      (unsigned long long)r.arena_bytes);
        goto out;
    }
    memcpy(bufs, tmp, n * sizeof *bufs);
    r.optimal = all_optimal;
    r.seconds = plan_now() - t0;
    if (res)
        *res = r;
    if (fails)
        rc = vmm_fail(VMM_ENOMEM, "plan: %s: %s%s", vmm_plan_algo_name(o.algo), failmsg,
                      fails > 1 ? " (and other arenas)" : "");
out:
    free(root);
    free(sel);
    free(tmp);
    return rc;
}
