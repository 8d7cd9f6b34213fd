// ctest-labels: unit
// ctest-timeout: 300
/* greedy-size on 10^5 random buffers: a valid plan (timing is measured in docs/planner.md). */
#include <stdlib.h>
#include <time.h>

#include "testutil.h"
#include "vmmalloc_plan.h"

enum { N = 100000, HORIZON = 200000, MAX_LIFE = 200 }; /* mean live set ~50 buffers, as in the real traces */

int main(void)
{
    vmm_plan_buffer *b = calloc(N, sizeof *b);
    CHECK(b != NULL);
    if (!b)
        TEST_DONE();
    srand(12345);
    for (int i = 0; i < N; i++) {
        int64_t lo = rand() % HORIZON;
        b[i] = (vmm_plan_buffer){lo, lo + 1 + rand() % MAX_LIFE, 512 * (uint64_t)(1 + rand() % 4096),
                                 i % 7 == 0 ? 4096 : 0, -1, 0, 0, 0, 0, 0};
    }
    vmm_plan_options o;
    vmm_plan_options_init(&o);
    o.algo = VMM_PLAN_GREEDY_SIZE;
    vmm_plan_result r;
    unsigned long long t0 = vmm_test_now_ns();
    clock_t c0 = clock(); /* CPU time too: wall time on a shared 2-core machine is noisy */
    CHECK_OK(vmm_plan(b, N, &o, &r));
    printf("greedy-size: %d buffers in %.3f s wall, %.3f s CPU, arena/bound %.4f\n", N,
           (double)(vmm_test_now_ns() - t0) * 1e-9, (double)(clock() - c0) / CLOCKS_PER_SEC,
           (double)r.arena_bytes / (double)r.lower_bound_bytes);
    uint64_t arena = 0;
    CHECK_OK(vmm_plan_verify(b, N, &arena));
    CHECK_EQ(arena, r.arena_bytes);
    CHECK(r.arena_bytes >= r.lower_bound_bytes);
    CHECK(r.arena_bytes < 2 * r.lower_bound_bytes);
    free(b);
    TEST_DONE();
}
