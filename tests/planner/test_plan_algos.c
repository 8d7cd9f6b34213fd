// ctest-labels: unit
// ctest-timeout: 300
/* Every planner algorithm on small instances with a known optimum. The optimum of a random tiny
 * instance comes from brute force: every plan can be pushed down until each buffer rests on one
 * below it, and such a plan is rebuilt by placing its buffers in offset order, each on top of the
 * earlier ones live with it; so the best over all orders is the optimum. */
#include <string.h>

#include "testutil.h"
#include "vmmalloc_plan.h"

enum { TINY = 7, TRIALS = 40 };

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint64_t rnd(uint64_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state % n;
}

static uint64_t best_of_orders(const vmm_plan_buffer *b, int n, int *perm, int k, uint64_t *off, uint64_t best)
{
    if (k == n) {
        uint64_t top = 0;
        for (int i = 0; i < n; i++)
            top = off[perm[i]] + b[perm[i]].size > top ? off[perm[i]] + b[perm[i]].size : top;
        return top < best ? top : best;
    }
    for (int i = k; i < n; i++) {
        int t = perm[k];
        perm[k] = perm[i];
        perm[i] = t;
        int x = perm[k];
        uint64_t at = 0;
        for (int j = 0; j < k; j++) {
            int y = perm[j];
            if (b[x].lower < b[y].upper && b[y].lower < b[x].upper && off[y] + b[y].size > at)
                at = off[y] + b[y].size;
        }
        off[x] = at;
        best = best_of_orders(b, n, perm, k + 1, off, best);
        perm[i] = perm[k];
        perm[k] = t;
    }
    return best;
}

static int run(vmm_plan_buffer *b, size_t n, int algo, uint64_t cap, vmm_plan_result *r)
{
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.algo = algo;
    o.capacity = cap;
    o.time_limit_s = 20;
    memset(r, 0, sizeof *r);
    int rc = vmm_plan(b, n, &o, r);
    if (rc == VMM_OK) {
        uint64_t arena = 0;
        CHECK_OK(vmm_plan_verify(b, n, &arena));
        CHECK_EQ(arena, r->arena_bytes);
        CHECK(r->arena_bytes >= r->lower_bound_bytes);
    }
    return rc;
}

int main(void)
{
    vmm_plan_result r;
    /* MiniMalloc's example: optimum 12 = the bound. */
    vmm_plan_buffer ex[5] = {{0, 3, 4, 0, -1, 0, 0, 0, 0, 0}, {3, 9, 4, 0, -1, 0, 0, 0, 0, 0}, {0, 9, 4, 0, -1, 0, 0, 0, 0, 0},
                             {9, 21, 4, 0, -1, 0, 0, 0, 0, 0}, {0, 21, 4, 0, -1, 0, 0, 0, 0, 0}};
    for (int a = 0; a < VMM_PLAN_ALGO_COUNT; a++) {
        CHECK_OK(run(ex, 5, a, 0, &r));
        CHECK_EQ(r.lower_bound_bytes, 12);
        if (a == VMM_PLAN_NAIVE)
            CHECK_EQ(r.arena_bytes, 20);
        else if (a == VMM_PLAN_DOUBLE_CURSOR) /* the two living >= half the span (8 B) below the rest (8 B) */
            CHECK_EQ(r.arena_bytes, 16);
        else
            CHECK_EQ(r.arena_bytes, 12);
    }
    /* Random tiny instances against brute force; exact must prove the optimum. */
    int improved = 0;
    for (int t = 0; t < TRIALS; t++) {
        vmm_plan_buffer b[TINY];
        uint64_t off[TINY];
        int perm[TINY];
        for (int i = 0; i < TINY; i++) {
            int64_t lo = (int64_t)rnd(6);
            b[i] = (vmm_plan_buffer){lo, lo + 1 + (int64_t)rnd(4), 1 + rnd(9), 0, -1, 0, 0, 0, 0, 0};
            perm[i] = i;
        }
        uint64_t opt = best_of_orders(b, TINY, perm, 0, off, UINT64_MAX);
        CHECK_OK(run(b, TINY, VMM_PLAN_EXACT, 0, &r));
        CHECK_EQ(r.arena_bytes, opt);
        CHECK_EQ(r.optimal, 1);
        uint64_t exact = r.arena_bytes;
        for (int a = 0; a < VMM_PLAN_EXACT; a++) {
            CHECK_OK(run(b, TINY, a, 0, &r));
            CHECK(r.arena_bytes >= opt);
            if (a == VMM_PLAN_GREEDY_SIZE && r.arena_bytes > exact)
                improved++;
        }
        /* Capacity: the optimum fits, one byte less is proven impossible. */
        CHECK_OK(run(b, TINY, VMM_PLAN_BEST, opt, &r));
        CHECK(r.arena_bytes <= opt);
        if (opt > r.lower_bound_bytes)
            CHECK_EQ(run(b, TINY, VMM_PLAN_EXACT, opt - 1, &r), VMM_ENOMEM);
    }
    printf("exact beat greedy-size on %d of %d tiny instances\n", improved, TRIALS);

    /* Alignment and groups through every algorithm. */
    vmm_plan_buffer g[6] = {{0, 4, 100, 64, 1, 0, 0, 0, 0, 0}, {0, 4, 28, 0, 1, 0, 0, 0, 0, 0}, {2, 8, 64, 128, -1, 0, 0, 0, 0, 0},
                            {4, 9, 10, 0, 2, 0, 0, 0, 0, 0},   {5, 9, 30, 32, 2, 0, 0, 0, 0, 0}, {8, 12, 5, 0, -1, 0, 0, 0, 0, 0}};
    for (int a = 0; a < VMM_PLAN_ALGO_COUNT; a++) {
        CHECK_OK(run(g, 6, a, 0, &r));
        CHECK_EQ(g[1].offset, g[0].offset + 100);
        CHECK_EQ(g[4].offset, (g[3].offset + 10 + 31) / 32 * 32);
        CHECK_EQ(g[2].offset % 128, 0);
    }
    /* Bad input leaves the array alone. */
    vmm_plan_buffer bad[2] = {{0, 4, 8, 0, -1, 77, 0, 0, 0, 0}, {4, 4, 8, 0, -1, 77, 0, 0, 0, 0}};
    CHECK_EQ(vmm_plan(bad, 2, NULL, &r), VMM_EINVAL);
    CHECK_EQ(bad[0].offset, 77);
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.algo = 99;
    CHECK_EQ(vmm_plan(ex, 5, &o, &r), VMM_EINVAL);
    int algo = -1;
    CHECK_OK(vmm_plan_algo_from_name("greedy-size", &algo));
    CHECK_EQ(algo, VMM_PLAN_GREEDY_SIZE);
    CHECK_EQ(vmm_plan_algo_from_name("fastest", &algo), VMM_EINVAL);
    TEST_DONE();
}
