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

static const char *const algo_names[VMM_PLAN_ALGO_COUNT] = {
    "naive", "greedy", "greedy-size", "tree", "heuristics", "exact", "best",
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
                                "heuristics, exact, best)", name ? name : "(null)");
}

VMM_API void vmm_plan_options_init(vmm_plan_options *opt)
{
    if (!opt)
        return;
    memset(opt, 0, sizeof *opt);
    opt->algo = VMM_PLAN_BEST;
    opt->time_limit_s = PLAN_DEFAULT_TIME_LIMIT_S;
}

/* Run the chosen algorithm on the items; fills off and the result's optimal/nodes/winner. */
static int run_algo(const plan_ctx *c, const vmm_plan_options *o, double t0, uint64_t *off,
                    vmm_plan_result *r, int *infeasible)
{
    int rc = VMM_OK;
    switch (o->algo) {
    case VMM_PLAN_NAIVE:
        return plan_naive(c, off);
    case VMM_PLAN_GREEDY:
        return plan_greedy_shared(c, off);
    case VMM_PLAN_TREE:
        return plan_tree(c, off);
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
    rc = plan_heuristics(c, o->threads, off, r->winner, sizeof r->winner);
    if (rc || o->algo == VMM_PLAN_HEURISTICS)
        return rc;
    uint64_t arena = plan_arena(c, off);
    if (arena <= c->lower_bound || (o->capacity && arena <= o->capacity))
        return VMM_OK;
    if (o->algo == VMM_PLAN_BEST && c->n > PLAN_BEST_EXACT_MAX_ITEMS) {
        rc = plan_improve(c, o->capacity, t0 + o->time_limit_s, off);
        if (!rc && plan_arena(c, off) < arena)
            snprintf(r->winner, sizeof r->winner, "improve");
        return rc;
    }
    uint64_t *seed = malloc(c->n * sizeof *seed);
    if (!seed)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    memcpy(seed, off, c->n * sizeof *seed);
    plan_exact_in ei = {o->capacity, t0 + o->time_limit_s, {UINT64_MAX, UINT64_MAX}, o->threads};
    if (o->node_limit && o->capacity)
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
    r->nodes = eo.nodes;
    if (!rc && plan_arena(c, off) < arena)
        snprintf(r->winner, sizeof r->winner, "exact");
    if (!rc && eo.optimal && !o->capacity)
        r->optimal = 1;
    *infeasible = eo.infeasible;
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
    if (!(o.time_limit_s >= 0) || o.threads < 0)
        return vmm_fail(VMM_EINVAL, "plan: bad time limit or thread count");
    vmm_plan_result r;
    memset(&r, 0, sizeof r);
    snprintf(r.winner, sizeof r.winner, "%s", vmm_plan_algo_name(o.algo));
    plan_ctx c;
    int rc = plan_ctx_build(&c, bufs, n);
    if (rc)
        return rc;
    uint64_t *off = calloc(c.n ? c.n : 1, sizeof *off);
    vmm_plan_buffer *tmp = malloc((n ? n : 1) * sizeof *tmp);
    int infeasible = 0;
    if (!off || !tmp) {
        rc = vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        goto out;
    }
    rc = run_algo(&c, &o, t0, off, &r, &infeasible);
    if (rc)
        goto out;
    for (size_t i = 0; i < n; i++) {
        tmp[i] = bufs[i];
        tmp[i].offset = off[c.item_of[i]] + c.rel[i];
    }
    uint64_t arena = 0;
    rc = vmm_plan_verify(tmp, n, &arena);
    if (rc) {
        rc = vmm_fail(VMM_ECORRUPT, "plan: %s produced an invalid plan: %s", vmm_plan_algo_name(o.algo),
                      vmm_last_error());
        goto out;
    }
    if (arena != plan_arena(&c, off)) {
        rc = vmm_fail(VMM_ECORRUPT, "plan: arena mismatch (%llu vs %llu)", (unsigned long long)arena,
                      (unsigned long long)plan_arena(&c, off));
        goto out;
    }
    memcpy(bufs, tmp, n * sizeof *bufs);
    r.arena_bytes = arena;
    r.lower_bound_bytes = c.lower_bound;
    if (arena <= c.lower_bound)
        r.optimal = 1;
    r.seconds = plan_now() - t0;
    if (res)
        *res = r;
    if (o.capacity && arena > o.capacity)
        rc = vmm_fail(VMM_ENOMEM, "plan: %s: %s plan of %llu bytes exceeds capacity %llu",
                      vmm_plan_algo_name(o.algo), infeasible ? "proven: no" : "best found",
                      (unsigned long long)arena, (unsigned long long)o.capacity);
out:
    free(off);
    free(tmp);
    plan_ctx_free(&c);
    return rc;
}
