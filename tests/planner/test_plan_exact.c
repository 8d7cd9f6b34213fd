// ctest-labels: unit
// ctest-timeout: 1200
/* The exact search on MiniMalloc's "challenging" instances (the quickest of the eleven, see
 * docs/planner.md): a plan within capacity 1048576 must be found and verified, and since the
 * capacity equals the lower bound of these instances the plan is proven optimal. Then the
 * feasibility search must prove "no plan" one byte below the bound, and on a small random
 * instance minimising must agree with a capacity search one byte below its optimum. */
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc_plan.h"

enum {
    CAPACITY = 1048576,
    /* Generous: the instances take well under a second in a plain build, sanitizer builds and
     * a loaded 2-core machine are several times slower. */
    TIME_LIMIT_S = 120,
    /* The small random instances are proven in milliseconds in a plain build; the limit only has
     * to be long enough for the search to end (a cut search leaves the optimum unproven), also
     * under TSan on a loaded machine: give them room, it is not a speed test. */
    RANDOM_TIME_LIMIT_S = 600,
};

static int time_limit_s = TIME_LIMIT_S;

static int plan_with(vmm_plan_buffer *b, size_t n, int algo, uint64_t cap, vmm_plan_result *r)
{
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.algo = algo;
    o.capacity = cap;
    o.time_limit_s = time_limit_s;
    memset(r, 0, sizeof *r);
    return vmm_plan(b, n, &o, r);
}

int main(void)
{
    static const char *const files[] = {
        "workloads/minimalloc/G.1048576.csv",
        "workloads/minimalloc/K.1048576.csv",
        "workloads/minimalloc/I.1048576.csv",
    };
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        vmm_plan_problem p;
        const char *path = vmm_test_source_path(files[k]);
        if (vmm_plan_load_csv(path, &p)) {
            fprintf(stderr, "cannot load %s: %s\n", path, vmm_last_error());
            vmm_test_failures++;
            continue;
        }
        vmm_plan_result r;
        /* Greedy by size does not fit: the search has work to do. */
        CHECK_EQ(plan_with(p.buffers, p.count, VMM_PLAN_GREEDY_SIZE, CAPACITY, &r), VMM_ENOMEM);
        CHECK(r.arena_bytes > CAPACITY);
        unsigned long long t0 = vmm_test_now_ns();
        CHECK_OK(plan_with(p.buffers, p.count, VMM_PLAN_EXACT, CAPACITY, &r));
        double s = (double)(vmm_test_now_ns() - t0) * 1e-9;
        uint64_t arena = 0;
        CHECK_OK(vmm_plan_verify(p.buffers, p.count, &arena));
        CHECK_EQ(arena, r.arena_bytes);
        CHECK(arena <= CAPACITY);
        CHECK_EQ(r.lower_bound_bytes, CAPACITY);
        CHECK_EQ(r.optimal, 1);
        printf("%s: %zu buffers, arena %llu in %.3f s, %llu nodes\n", files[k], p.count,
               (unsigned long long)arena, s, (unsigned long long)r.nodes);
        /* Below the bound: proven impossible at once, offsets still written and valid. */
        CHECK_EQ(plan_with(p.buffers, p.count, VMM_PLAN_EXACT, CAPACITY - 1, &r), VMM_ENOMEM);
        CHECK(strstr(vmm_last_error(), "proven") != NULL);
        vmm_plan_problem_free(&p);
    }

    /* Minimising proves its optimum: one byte less is infeasible. Instances with more buffers
     * than brute force can check, some aligned. */
    uint64_t x = 0x243F6A8885A308D3ull;
    int strict = 0;
    time_limit_s = RANDOM_TIME_LIMIT_S;
    for (int t = 0; t < 20; t++) {
        enum { N = 14 };
        vmm_plan_buffer b[N];
        for (int i = 0; i < N; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            int64_t lo = (int64_t)(x % 10);
            b[i] = (vmm_plan_buffer){lo, lo + 1 + (int64_t)(x >> 8) % 6, 1 + (x >> 16) % 40,
                                     (x >> 24) % 3 == 0 ? 8 : 0, -1, 0, 0, 0, 0, 0};
        }
        vmm_plan_result r;
        CHECK_OK(plan_with(b, N, VMM_PLAN_EXACT, 0, &r));
        CHECK_EQ(r.optimal, 1);
        CHECK_OK(vmm_plan_verify(b, N, NULL));
        uint64_t opt = r.arena_bytes;
        strict += opt > r.lower_bound_bytes;
        if (opt > r.lower_bound_bytes)
            CHECK_EQ(plan_with(b, N, VMM_PLAN_EXACT, opt - 1, &r), VMM_ENOMEM);
        CHECK_OK(plan_with(b, N, VMM_PLAN_EXACT, opt, &r));
        CHECK(r.arena_bytes <= opt);
    }
    printf("%d of 20 random instances have an optimum above the bound\n", strict);
    TEST_DONE();
}
