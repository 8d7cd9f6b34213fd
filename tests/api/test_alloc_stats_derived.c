// ctest-labels: unit
/* Stats the malloc / free path keeps partly (pool entries, ALL peaks; active as allocation +
 * pending): what vmm_get_stats reports must equal full bookkeeping, deferred frees and resets
 * included. */
#include <stdatomic.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static void wait_flag(void *arg)
{
    atomic_int *go = arg;
    for (int i = 0; i < 5000 && !atomic_load(go); i++)
        vmm_test_sleep_ms(1);
}

static vmm_stats get(vmm_allocator *a)
{
    vmm_stats s;
    CHECK_OK(vmm_get_stats(a, &s));
    return s;
}

/* ALL entries are the pools' sums; before any cumulative reset, current = allocated - freed. */
static void check_sums(const vmm_stats *s, int since_start)
{
    const vmm_stat *arr[] = {s->allocation, s->active, s->inactive_split, s->allocated_bytes,
                             s->active_bytes, s->inactive_split_bytes, s->requested_bytes};
    for (size_t k = 0; k < sizeof arr / sizeof arr[0]; k++) {
        const vmm_stat *st = arr[k];
        CHECK_EQ(st[VMM_POOL_ALL].current, st[VMM_POOL_SMALL].current + st[VMM_POOL_LARGE].current);
        CHECK_EQ(st[VMM_POOL_ALL].allocated,
                 st[VMM_POOL_SMALL].allocated + st[VMM_POOL_LARGE].allocated);
        CHECK_EQ(st[VMM_POOL_ALL].freed, st[VMM_POOL_SMALL].freed + st[VMM_POOL_LARGE].freed);
        for (int p = 0; p < VMM_POOL_COUNT; p++) {
            if (since_start)
                CHECK_EQ(st[p].current, st[p].allocated - st[p].freed);
            CHECK(st[p].peak >= st[p].current);
        }
    }
}

int main(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:false", &a));
    if (!a)
        TEST_DONE();
    vmm_stream s1 = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));

    /* peaks of ALL across pools: 3 small + 1 large live at once */
    void *sm[3], *lg = NULL;
    for (int i = 0; i < 3; i++)
        CHECK_OK(vmm_malloc(a, 4096, s1, &sm[i]));
    CHECK_OK(vmm_malloc(a, 8 * MiB, s1, &lg));
    vmm_stats s = get(a);
    check_sums(&s, 1);
    CHECK_EQ(s.allocation[VMM_POOL_ALL].peak, 4);
    CHECK_EQ(s.active[VMM_POOL_ALL].peak, 4);
    CHECK_EQ(s.active[VMM_POOL_SMALL].current, 3);
    CHECK_EQ(s.active_bytes[VMM_POOL_ALL].current, 3 * 4096 + 8 * (int64_t)MiB);
    CHECK_EQ(s.requested_bytes[VMM_POOL_ALL].current, 3 * 4096 + 8 * (int64_t)MiB);
    for (int i = 0; i < 3; i++)
        CHECK_OK(vmm_free(a, sm[i]));
    s = get(a);
    check_sums(&s, 1);
    CHECK_EQ(s.allocation[VMM_POOL_ALL].current, 1);
    CHECK_EQ(s.allocation[VMM_POOL_ALL].peak, 4);
    CHECK_EQ(s.active[VMM_POOL_SMALL].freed, 3);

    /* a deferred free: allocation ends at vmm_free, active only when the other stream's work ran */
    atomic_int go = 0;
    CHECK_OK(vmm_record_stream(a, lg, s2));
    CHECK_OK(vmm_sim_launch(a, s2, wait_flag, &go));
    CHECK_OK(vmm_free(a, lg));
    CHECK_OK(vmm_check(a));
    s = get(a);
    check_sums(&s, 1);
    CHECK_EQ(s.allocation[VMM_POOL_LARGE].current, 0);
    CHECK_EQ(s.allocation[VMM_POOL_LARGE].freed, 1);
    CHECK_EQ(s.active[VMM_POOL_LARGE].current, 1);
    CHECK_EQ(s.active[VMM_POOL_LARGE].freed, 0);
    CHECK_EQ(s.active_bytes[VMM_POOL_LARGE].current, 8 * (int64_t)MiB);

    /* while it is pending, a new block raises active's peak above allocation's */
    void *x = NULL;
    CHECK_OK(vmm_malloc(a, 2 * MiB, s1, &x));
    s = get(a);
    CHECK_EQ(s.active[VMM_POOL_LARGE].peak, 2);
    CHECK_EQ(s.allocation[VMM_POOL_LARGE].peak, 1);
    CHECK_EQ(s.active_bytes[VMM_POOL_LARGE].peak, 10 * (int64_t)MiB);

    /* reset while pending: peaks restart from the derived currents, cumulative counts from zero */
    CHECK_OK(vmm_reset_stats(a, 1));
    s = get(a);
    check_sums(&s, 0);
    CHECK_EQ(s.active[VMM_POOL_LARGE].peak, 2);
    CHECK_EQ(s.active[VMM_POOL_LARGE].freed, 0);
    CHECK_EQ(s.active[VMM_POOL_LARGE].allocated, 0);

    atomic_store(&go, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a)); /* polls the deferred free */
    CHECK_OK(vmm_check(a));
    s = get(a);
    CHECK_EQ(s.active[VMM_POOL_LARGE].current, 1);
    CHECK_EQ(s.active[VMM_POOL_LARGE].freed, 1); /* the pending block, freed after the reset */
    CHECK_EQ(s.active_bytes[VMM_POOL_LARGE].current, 2 * (int64_t)MiB);
    CHECK_OK(vmm_free(a, x));
    s = get(a);
    CHECK_EQ(s.active[VMM_POOL_ALL].current, 0);
    CHECK_EQ(s.active[VMM_POOL_ALL].freed, 2);
    CHECK_EQ(s.allocation[VMM_POOL_ALL].freed, 1);
    CHECK_EQ(s.allocation[VMM_POOL_ALL].current, 0);
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    TEST_DONE();
}
