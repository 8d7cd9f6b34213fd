/* MindSpore SOMAS style: try many (order x fit rule) placements plus the other greedy planners on
 * worker threads and keep the smallest arena (ties: the first in the list, so results do not
 * depend on thread timing). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "planner.h"

enum {
    H_PLACE = PLAN_ORDER_COUNT * PLAN_FIT_COUNT, /* the first H_PLACE candidates are order x fit */
    H_TREE = H_PLACE,
    H_GREEDY = H_PLACE + 1,
    H_COUNT = H_PLACE + 2,
    /* The tree recurses as deep as it grows; past this many items its recursion and its quadratic
     * child scans are not worth it (it never won on the large real traces). */
    H_TREE_MAX_ITEMS = 2000,
};

typedef struct worker {
    const plan_ctx *c;
    atomic_int *next;
    uint32_t *order;
    uint64_t *off, *best_off;
    uint64_t best;
    int best_idx;
    int rc;
    pthread_t th;
} worker;

static int run_candidate(worker *w, int h)
{
    if (h == H_TREE)
        return w->c->n > H_TREE_MAX_ITEMS ? 1 : plan_tree(w->c, w->off);
    if (h == H_GREEDY)
        return plan_greedy_shared(w->c, w->off);
    int rc = plan_make_order(w->c, h / PLAN_FIT_COUNT, w->order);
    return rc ? rc : plan_place(w->c, w->order, h % PLAN_FIT_COUNT, w->off);
}

static void *worker_main(void *arg)
{
    worker *w = arg;
    for (;;) {
        int h = atomic_fetch_add(w->next, 1);
        if (h >= H_COUNT)
            break;
        int rc = run_candidate(w, h);
        if (rc == 1)
            continue; /* skipped */
        if (rc) {
            w->rc = rc;
            break;
        }
        uint64_t a = plan_arena(w->c, w->off);
        if (a < w->best || (a == w->best && h < w->best_idx)) {
            w->best = a;
            w->best_idx = h;
            uint64_t *t = w->off;
            w->off = w->best_off;
            w->best_off = t;
        }
    }
    return NULL;
}

static void candidate_name(int h, char *buf, size_t len)
{
    if (h == H_TREE)
        snprintf(buf, len, "tree");
    else if (h == H_GREEDY)
        snprintf(buf, len, "greedy");
    else
        snprintf(buf, len, "%s/%s", plan_order_name(h / PLAN_FIT_COUNT), plan_fit_name(h % PLAN_FIT_COUNT));
}

int plan_heuristics(const plan_ctx *c, int threads, uint64_t *off, char *winner, size_t wlen)
{
    if (threads <= 0) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        threads = cpus > 0 ? (int)cpus : 1;
    }
    if (threads > H_COUNT)
        threads = H_COUNT;
    atomic_int next;
    atomic_init(&next, 0);
    worker *w = calloc((size_t)threads, sizeof *w);
    if (!w)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    int rc = VMM_OK, started = 0;
    size_t nn = c->n ? c->n : 1;
    for (int k = 0; k < threads; k++) {
        w[k] = (worker){c, &next, malloc(nn * sizeof(uint32_t)), malloc(nn * sizeof(uint64_t)),
                        malloc(nn * sizeof(uint64_t)), UINT64_MAX, H_COUNT, 0, 0};
        if (!w[k].order || !w[k].off || !w[k].best_off)
            rc = VMM_EHOSTMEM;
    }
    /* Thread 0's work runs on the caller's thread; the others get their own. */
    for (int k = 1; !rc && k < threads; k++) {
        if (pthread_create(&w[k].th, NULL, worker_main, &w[k]) != 0)
            break; /* fewer threads: the rest of the list still gets done by those running */
        started = k;
    }
    if (!rc)
        worker_main(&w[0]);
    for (int k = 1; k <= started; k++)
        pthread_join(w[k].th, NULL);
    int bi = -1;
    for (int k = 0; !rc && k < threads; k++) {
        if (w[k].rc)
            rc = w[k].rc;
        else if (w[k].best_idx < H_COUNT &&
                 (bi < 0 || w[k].best < w[bi].best || (w[k].best == w[bi].best && w[k].best_idx < w[bi].best_idx)))
            bi = k;
    }
    if (!rc && bi >= 0) {
        memcpy(off, w[bi].best_off, c->n * sizeof *off);
        candidate_name(w[bi].best_idx, winner, wlen);
    } else if (!rc) {
        rc = plan_naive(c, off); /* no items at all */
    }
    for (int k = 0; k < threads; k++) {
        free(w[k].order);
        free(w[k].off);
        free(w[k].best_off);
    }
    free(w);
    return rc ? vmm_fail(VMM_EHOSTMEM, "plan: out of host memory") : VMM_OK;
}
