// ctest-labels: unit
// ctest-timeout: 120
/* Review of the slow paths: driver failures midway through growth leave a consistent state, streams
 * destroyed by the user are never used again and do not pin memory, and the OOM rule holds
 * (a request fails only when live bytes plus the request exceed the allowed memory). */
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static const char *conf = "driver:sim,sim_capacity:96M,sim_backed:true";

/* A block freed after its stream was destroyed: the stream's work has run, so its pages must be
 * reusable by another stream (no fence can be recorded on a destroyed stream). */
static void test_free_after_stream_destroy(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    void *p = NULL, *q = NULL;
    CHECK_OK(vmm_malloc(a, 60 * MiB, s, &p));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_stream_destroy(a, s));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    /* 60 MiB live on no stream + 60 MiB: only the freed pages can serve it */
    CHECK_OK(vmm_malloc(a, 60 * MiB, NULL, &q));
    CHECK(q != NULL);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, q));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[0].current, 0);
    vmm_destroy(a);
}

/* record_stream on a stream the user destroys before the free: the free succeeds (no event is
 * recorded on the dead stream) and the block comes back. */
static void test_record_stream_then_destroy(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &p));
    CHECK_OK(vmm_record_stream(a, p, s));
    CHECK_OK(vmm_sim_stream_destroy(a, s));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.allocated_bytes[0].current, 0);
    CHECK_EQ(st.active_bytes[0].current, 0);
    /* record_stream naming the destroyed stream is refused; the block stays freeable */
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &p));
    CHECK_EQ(vmm_record_stream(a, p, s), VMM_EINVAL);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).active_bytes[0].current, 0);
    /* a stream created later (perhaps at the same address) is tracked afresh */
    vmm_stream s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    CHECK_OK(vmm_malloc(a, 4 * MiB, s2, &p));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    vmm_destroy(a);
}

/* Growth whose set_access (or a later mem_map) fails: nothing stays mapped, no handle leaks, the
 * stats still add up, and the same request then succeeds (pytorch#188008). */
static void test_growth_failures(void)
{
    static const int kinds[] = {VMM_SIM_CALL_SET_ACCESS, VMM_SIM_CALL_MEM_MAP, VMM_SIM_CALL_MEM_CREATE,
                                VMM_SIM_CALL_VA_RESERVE};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        for (uint64_t nth = 1; nth <= 3; nth++) {
            vmm_allocator *a = NULL;
            CHECK_OK(vmm_create(conf, &a));
            void *keep = NULL, *p = NULL;
            CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &keep));
            vmm_stats before = vmm_test_stats(a);
            CHECK_OK(vmm_sim_fail_nth(a, kinds[k], nth));
            int rc = vmm_malloc(a, 10 * MiB, NULL, &p);
            CHECK_OK(vmm_check(a));
            if (rc) {
                CHECK(p == NULL);
                vmm_stats st = vmm_test_stats(a);
                CHECK_EQ(st.allocated_bytes[0].current, before.allocated_bytes[0].current);
                CHECK_EQ(st.mapped_bytes[0].current, before.mapped_bytes[0].current);
            } else {
                CHECK_OK(vmm_free(a, p));
            }
            CHECK_OK(vmm_sim_fail_nth(a, kinds[k], 0));
            CHECK_OK(vmm_malloc(a, 10 * MiB, NULL, &p));
            CHECK_OK(vmm_check(a));
            CHECK_OK(vmm_free(a, p));
            CHECK_OK(vmm_free(a, keep));
            CHECK_OK(vmm_empty_cache(a));
            CHECK_OK(vmm_check(a));
            vmm_stats st = vmm_test_stats(a);
            CHECK_EQ(st.reserved_bytes[0].current, 0);
            CHECK_EQ(st.mapped_bytes[0].current, 0);
            vmm_destroy(a);
        }
    }
}

/* A deferred free whose second event_record fails: the free still succeeds (a caller that cannot
 * retry would leak the block), the use is recorded later, and the next malloc completes it. */
static void test_defer_free_failure(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    vmm_stream s1 = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &p));
    CHECK_OK(vmm_record_stream(a, p, s1));
    CHECK_OK(vmm_record_stream(a, p, s2));
    CHECK_OK(vmm_record_stream(a, p, NULL)); /* its own stream: nothing to track */
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_EVENT_RECORD, 2));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).allocation[0].current, 0);
    CHECK_EQ(vmm_free(a, p), VMM_EBADPTR);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_synchronize(a));
    void *q = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &q)); /* processes the deferred free */
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).active[0].current, 1);
    CHECK_OK(vmm_free(a, q));
    CHECK_OK(vmm_sim_stream_destroy(a, s1));
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    vmm_destroy(a);
}

/* empty_cache whose unmap / release / va_free fails midway: what was done is accounted, what was
 * not stays cached and consistent, and a second empty_cache returns everything. */
static void test_empty_cache_failures(void)
{
    static const int kinds[] = {VMM_SIM_CALL_MEM_UNMAP, VMM_SIM_CALL_MEM_RELEASE, VMM_SIM_CALL_VA_FREE};
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        /* one reservation becomes empty (the small one holds the live block): one va_free */
        uint64_t last = kinds[k] == VMM_SIM_CALL_VA_FREE ? 1 : 4;
        for (uint64_t nth = 1; nth <= last; nth += 3) {
            vmm_allocator *a = NULL;
            CHECK_OK(vmm_create(conf, &a));
            void *p = NULL, *q = NULL, *r = NULL;
            CHECK_OK(vmm_malloc(a, 20 * MiB, NULL, &p));
            CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &q));
            CHECK_OK(vmm_malloc(a, 12 * MiB, NULL, &r));
            CHECK_OK(vmm_free(a, p));
            CHECK_OK(vmm_free(a, r));
            CHECK_OK(vmm_check(a));
            CHECK_OK(vmm_sim_fail_nth(a, kinds[k], nth));
            CHECK_EQ(vmm_empty_cache(a), VMM_EDRIVER);
            CHECK_OK(vmm_check(a));
            CHECK_OK(vmm_sim_fail_nth(a, kinds[k], 0));
            CHECK_OK(vmm_empty_cache(a));
            CHECK_OK(vmm_check(a));
            vmm_stats st = vmm_test_stats(a);
            /* only the page under the live 1 MiB block stays */
            CHECK_EQ(st.mapped_bytes[0].current, 2 * MiB);
            CHECK_EQ(st.reserved_bytes[0].current, 2 * MiB);
            CHECK_OK(vmm_free(a, q));
            CHECK_OK(vmm_empty_cache(a));
            CHECK_OK(vmm_check(a));
            st = vmm_test_stats(a);
            CHECK_EQ(st.reserved_bytes[0].current, 0);
            CHECK_EQ(st.segment[0].current, 0);
            vmm_destroy(a);
        }
    }
}

/* A fused group whose member sizes are each just below the size limit: their sum must not wrap
 * around into a small block with members pointing past its end. */
static void test_group_size_overflow(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    const size_t big = ((size_t)1 << 62) - 1;
    const size_t sizes[5] = {big, big, big, big, 4096};
    void *ptrs[5] = {0};
    int rc = vmm_malloc_group(a, sizes, 5, NULL, ptrs);
    CHECK_EQ(rc, VMM_EINVAL);
    CHECK(ptrs[0] == NULL && ptrs[4] == NULL);
    if (rc == VMM_OK)
        CHECK_OK(vmm_free(a, ptrs[0]));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).allocation[0].current, 0);
    vmm_destroy(a);
}

int main(void)
{
    test_free_after_stream_destroy();
    test_record_stream_then_destroy();
    test_growth_failures();
    test_defer_free_failure();
    test_group_size_overflow();
    test_empty_cache_failures();
    TEST_DONE();
}
