// ctest-labels: unit
// ctest-timeout: 60
/* The planner's verifier and lower bound: planted faults must be caught. */
#include <string.h>

#include "testutil.h"
#include "vmmalloc_plan.h"

static vmm_plan_buffer buf(int64_t lo, int64_t hi, uint64_t size, uint64_t off)
{
    vmm_plan_buffer b = {lo, hi, size, 0, -1, off, 0, 0, 0, 0};
    return b;
}

int main(void)
{
    uint64_t arena = 0, lb = 0;
    /* A valid plan: two overlapping in time side by side, a third reusing the first's space. */
    vmm_plan_buffer ok[3] = {buf(0, 10, 100, 0), buf(5, 15, 50, 100), buf(10, 20, 100, 0)};
    CHECK_OK(vmm_plan_verify(ok, 3, &arena));
    CHECK_EQ(arena, 150);
    CHECK_OK(vmm_plan_lower_bound(ok, 3, &lb));
    CHECK_EQ(lb, 150);

    /* Planted overlap in both time and address. */
    vmm_plan_buffer bad[3];
    memcpy(bad, ok, sizeof ok);
    bad[1].offset = 99;
    CHECK_EQ(vmm_plan_verify(bad, 3, NULL), VMM_ECORRUPT);
    CHECK(strstr(vmm_last_error(), "overlap") != NULL);
    /* Half-open lifetimes: [0,10) and [10,20) may share addresses; [0,11) may not. */
    memcpy(bad, ok, sizeof ok);
    bad[0].upper = 11;
    CHECK_EQ(vmm_plan_verify(bad, 3, NULL), VMM_ECORRUPT);

    /* Misalignment. */
    vmm_plan_buffer al[2] = {buf(0, 4, 24, 0), buf(0, 4, 64, 24)};
    al[1].alignment = 32;
    CHECK_EQ(vmm_plan_verify(al, 2, NULL), VMM_ECORRUPT);
    CHECK(strstr(vmm_last_error(), "aligned") != NULL);
    al[1].offset = 32;
    CHECK_OK(vmm_plan_verify(al, 2, &arena));
    CHECK_EQ(arena, 96);
    al[1].alignment = 24; /* not a power of two */
    CHECK_EQ(vmm_plan_verify(al, 2, NULL), VMM_EINVAL);

    /* Groups: members adjacent in array order, aligned; a group conflicts over its whole span. */
    vmm_plan_buffer g[3] = {buf(0, 2, 10, 0), buf(5, 6, 16, 16), buf(3, 4, 8, 0)};
    g[0].group = g[1].group = 7;
    g[1].alignment = 16;
    CHECK_EQ(vmm_plan_verify(g, 3, NULL), VMM_ECORRUPT); /* buffer 2 at time 3 is inside the group's span */
    g[2].offset = 32;
    CHECK_OK(vmm_plan_verify(g, 3, &arena));
    CHECK_EQ(arena, 40);
    g[1].offset = 48; /* gap inside the group */
    CHECK_EQ(vmm_plan_verify(g, 3, NULL), VMM_ECORRUPT);
    CHECK(strstr(vmm_last_error(), "group") != NULL);
    /* The bound counts the group as one block over [0, 6): 10 + 6 padding + 16, plus 8 at time 3. */
    CHECK_OK(vmm_plan_lower_bound(g, 3, &lb));
    CHECK_EQ(lb, 40);

    /* Invalid buffers. */
    vmm_plan_buffer z = buf(0, 1, 0, 0);
    CHECK_EQ(vmm_plan_verify(&z, 1, NULL), VMM_EINVAL);
    z = buf(3, 3, 8, 0);
    CHECK_EQ(vmm_plan_verify(&z, 1, NULL), VMM_EINVAL);
    CHECK_EQ(vmm_plan_lower_bound(&z, 1, &lb), VMM_EINVAL);
    CHECK_OK(vmm_plan_verify(NULL, 0, &arena));
    CHECK_EQ(arena, 0);
    TEST_DONE();
}
