// ctest-labels: unit
// ctest-timeout: 900
/* The reordering pass (src/planner/improve.c): never worse than its start, every plan verified,
 * stops at its target; and `best` brings somas pangu_2.6B (18692 buffers, above the exact
 * search's cut-off) within 0.5% of the lower bound. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/planner.h"
#include "testutil.h"

/* Verify item offsets through the public checker (which shares no code with the algorithms). */
static int verify_items(const plan_ctx *c, const vmm_plan_buffer *bufs, size_t n, const uint64_t *off)
{
    vmm_plan_buffer *tmp = malloc(n * sizeof *tmp);
    if (!tmp)
        return VMM_EHOSTMEM;
    for (size_t i = 0; i < n; i++) {
        tmp[i] = bufs[i];
        tmp[i].offset = off[c->item_of[i]] + c->rel[i];
    }
    uint64_t arena = 0;
    int rc = vmm_plan_verify(tmp, n, &arena);
    if (!rc && arena != plan_arena(c, off))
        rc = VMM_ECORRUPT;
    free(tmp);
    return rc;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rnd(uint64_t m)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state % m;
}

static void random_instances(void)
{
    enum { N = 400, ROUNDS = 20 };
    vmm_plan_buffer *b = calloc(N, sizeof *b);
    uint64_t *off = calloc(N, sizeof *off), *start = calloc(N, sizeof *start);
    CHECK(b && off && start);
    if (!b || !off || !start)
        goto out;
    for (int round = 0; round < ROUNDS; round++) {
        for (size_t i = 0; i < N; i++) {
            b[i] = (vmm_plan_buffer){0};
            b[i].lower = (int64_t)rnd(500);
            b[i].upper = b[i].lower + 1 + (int64_t)rnd(round % 2 ? 40 : 200);
            b[i].size = 1 + rnd(1 << 16);
            b[i].alignment = i % 5 == 0 ? 256 : 0;
            b[i].group = i % 37 == 0 && i + 1 < N ? (int)(i / 37) : -1;
            if (b[i].group >= 0) { /* a two-member group, same lifetime */
                b[i + 1] = b[i];
                b[i + 1].size = 1 + rnd(1 << 12);
                i++;
            }
        }
        plan_ctx c;
        CHECK_OK(plan_ctx_build(&c, b, N));
        /* From the naive plan (end to end): the pass must find real reuse. */
        CHECK_OK(plan_naive(&c, off));
        uint64_t naive = plan_arena(&c, off);
        CHECK_OK(plan_improve(&c, 0, plan_now() + 60, off));
        CHECK_OK(verify_items(&c, b, N, off));
        CHECK(plan_arena(&c, off) < naive);
        CHECK(plan_arena(&c, off) >= c.lower_bound);
        /* From the heuristics' best: never worse. */
        char winner[64];
        CHECK_OK(plan_heuristics(&c, 2, off, winner, sizeof winner));
        uint64_t h = plan_arena(&c, off);
        CHECK_OK(plan_improve(&c, 0, plan_now() + 60, off));
        CHECK_OK(verify_items(&c, b, N, off));
        CHECK(plan_arena(&c, off) <= h);
        /* A target already met, or a deadline passed: the plan comes back unchanged. */
        CHECK_OK(plan_naive(&c, start));
        memcpy(off, start, N * sizeof *off);
        CHECK_OK(plan_improve(&c, naive, plan_now() + 60, off));
        CHECK(memcmp(off, start, N * sizeof *off) == 0);
        CHECK_OK(plan_improve(&c, 0, plan_now() - 1, off));
        CHECK(memcmp(off, start, N * sizeof *off) == 0);
        plan_ctx_free(&c);
    }
out:
    free(b);
    free(off);
    free(start);
}

static void pangu(void)
{
    const char *path = vmm_test_source_path("workloads/somas/somas_pangu_2.6B.csv");
    vmm_plan_problem p;
    int rc = vmm_plan_load_csv(path, &p);
    if (rc) {
        fprintf(stderr, "cannot load %s: %s (is workloads/ in the source tree?)\n", path,
                vmm_last_error());
        vmm_test_failures++;
        return;
    }
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.algo = VMM_PLAN_HEURISTICS;
    vmm_plan_result h, r;
    CHECK_OK(vmm_plan(p.buffers, p.count, &o, &h));
    /* best; a generous limit so that sanitizer builds on a loaded machine get there too (the pass
     * stops by itself when it stops gaining). */
    o.algo = VMM_PLAN_BEST;
    o.time_limit_s = 600;
    CHECK_OK(vmm_plan(p.buffers, p.count, &o, &r));
    CHECK_OK(vmm_plan_verify(p.buffers, p.count, NULL));
    printf("pangu_2.6B: heuristics %.4f (%s), best %.4f (%s) in %.1f s\n",
           (double)h.arena_bytes / (double)h.lower_bound_bytes, h.winner,
           (double)r.arena_bytes / (double)r.lower_bound_bytes, r.winner, r.seconds);
    CHECK(r.arena_bytes <= h.arena_bytes);
    CHECK((double)r.arena_bytes <= 1.005 * (double)r.lower_bound_bytes);
    vmm_plan_problem_free(&p);
}

int main(void)
{
    random_instances();
    pangu();
    TEST_DONE();
}
