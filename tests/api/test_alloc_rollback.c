// ctest-labels: unit
// ctest-timeout: 120
/* Growth rollback whose unmaps fail: a page the driver keeps mapped must stay out of use (its
 * handle is not cached, its VA is not mapped again) until an unmap succeeds; vmm_check holds after
 * every step, the memory comes back once the driver cooperates, and nothing leaks. */
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static const char *conf = "driver:sim,sim_capacity:96M,sim_backed:true";

static void check_no_leak(const vmm_sim_counters *base)
{
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.live_handles, base->live_handles);
    CHECK_EQ(g.phys_bytes, base->phys_bytes);
    CHECK_EQ(g.mapped_bytes, base->mapped_bytes);
    CHECK_EQ(g.reserved_va_bytes, base->reserved_va_bytes);
}

/* set_access fails after the pages were mapped and every rollback unmap fails too. */
static vmm_allocator *fail_growth(void **keep, vmm_stats *before, uint64_t seed)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, keep));
    CHECK_OK(vmm_check(a));
    *before = vmm_test_stats(a);
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_SET_ACCESS, 1));
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_MEM_UNMAP, 1.0, seed));
    void *p = NULL;
    CHECK(vmm_malloc(a, 10 * MiB, NULL, &p) != VMM_OK);
    CHECK(p == NULL);
    CHECK_OK(vmm_check(a));
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK(c.failures[VMM_SIM_CALL_MEM_UNMAP] > 0);
    return a;
}

static void test_quarantine_then_recover(void)
{
    vmm_sim_counters base;
    vmm_sim_global_live(&base);
    void *keep = NULL, *p = NULL, *q = NULL;
    vmm_stats before;
    vmm_allocator *a = fail_growth(&keep, &before, 7);
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.allocated_bytes[0].current, before.allocated_bytes[0].current);
    CHECK_EQ(st.mapped_bytes[0].current, before.mapped_bytes[0].current);
    /* the handles still mapped stay reserved */
    CHECK(st.reserved_bytes[0].current > before.reserved_bytes[0].current);
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK(c.mapped_bytes > (uint64_t)st.mapped_bytes[0].current);

    /* while the driver refuses: empty_cache and another growth keep the state consistent, and the
     * stuck pages are handed out to no one */
    vmm_empty_cache(a);
    CHECK_OK(vmm_check(a));
    int rc = vmm_malloc(a, 10 * MiB, NULL, &p);
    CHECK_OK(vmm_check(a));
    if (rc == VMM_OK) {
        CHECK_OK(vmm_free(a, p));
        CHECK_OK(vmm_check(a));
    }
    rc = vmm_malloc(a, 512 * 1024, NULL, &q); /* small pool: another reservation */
    CHECK_OK(vmm_check(a));
    if (rc == VMM_OK) {
        CHECK_OK(vmm_free(a, q));
        CHECK_OK(vmm_check(a));
    }

    /* the driver recovers: the next growth retries the unmaps and uses the memory */
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_MEM_UNMAP, 0.0, 0));
    CHECK_OK(vmm_malloc(a, 10 * MiB, NULL, &p));
    CHECK(p != NULL);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(a, keep));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    st = vmm_test_stats(a);
    CHECK_EQ(st.reserved_bytes[0].current, 0);
    CHECK_EQ(st.mapped_bytes[0].current, 0);
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.mapped_bytes, 0);
    CHECK_EQ(c.live_handles, 0);
    vmm_destroy(a);
    check_no_leak(&base);
}

/* empty_cache alone retries the unmaps and returns the memory. */
static void test_empty_cache_recovers(void)
{
    vmm_sim_counters base;
    vmm_sim_global_live(&base);
    void *keep = NULL;
    vmm_stats before;
    vmm_allocator *a = fail_growth(&keep, &before, 11);
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_MEM_UNMAP, 0.0, 0));
    CHECK_OK(vmm_free(a, keep));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.reserved_bytes[0].current, 0);
    CHECK_EQ(st.segment[0].current, 0);
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.mapped_bytes, 0);
    CHECK_EQ(c.live_handles, 0);
    CHECK_EQ(c.reserved_va_bytes, 0);
    vmm_destroy(a);
    check_no_leak(&base);
}

/* vmm_destroy retries the unmaps of stuck pages (here the first retry fails as well). */
static void test_destroy_retries(void)
{
    vmm_sim_counters base;
    vmm_sim_global_live(&base);
    void *keep = NULL;
    vmm_stats before;
    vmm_allocator *a = fail_growth(&keep, &before, 13);
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_MEM_UNMAP, 0.0, 0));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_MEM_UNMAP, 1));
    CHECK_OK(vmm_free(a, keep));
    vmm_destroy(a);
    check_no_leak(&base);
}

/* The driver never unmaps them: vmm_destroy reports the pages and still releases every handle. */
static void test_destroy_stuck(void)
{
    vmm_sim_counters base;
    vmm_sim_global_live(&base);
    void *keep = NULL;
    vmm_stats before;
    vmm_allocator *a = fail_growth(&keep, &before, 17);
    CHECK_OK(vmm_free(a, keep));
    vmm_destroy(a);
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.live_handles, base.live_handles);
}

int main(void)
{
    test_quarantine_then_recover();
    test_empty_cache_recovers();
    test_destroy_retries();
    test_destroy_stuck(); /* last: the simulated device keeps the stuck mappings */
    TEST_DONE();
}
