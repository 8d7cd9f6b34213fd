// ctest-labels: unit
/* garbage_collection_threshold with per_process_memory_fraction: once reserved bytes pass
 * threshold x (fraction x device), a malloc that misses the cache first gives cached memory back
 * (expandable: idle free pages and their handles; classic: the oldest whole cached segments).
 * Without a fraction the threshold does nothing. No synchronization either way. */
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)
enum { N = 35, BLOCK_MIB = 10 };

/* 35 x 10 MiB, free every other one (18 holes), then ask for 20 MiB: no hole fits it. */
static void run(const char *conf, vmm_stats *before, vmm_stats *after)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    if (!a)
        return;
    char *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = NULL;
        CHECK_OK(vmm_malloc(a, BLOCK_MIB * MiB, NULL, (void **)&p[i]));
        CHECK_OK(vmm_check(a));
        if (p[i])
            vmm_test_fill(p[i], BLOCK_MIB * MiB, (unsigned)i, 65536);
    }
    for (int i = 0; i < N; i += 2) {
        CHECK_OK(vmm_free(a, p[i]));
        CHECK_OK(vmm_check(a));
        p[i] = NULL;
    }
    CHECK_OK(vmm_get_stats(a, before));
    char *big = NULL;
    CHECK_OK(vmm_malloc(a, 20 * MiB, NULL, (void **)&big));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_get_stats(a, after));
    if (big)
        vmm_test_fill(big, 20 * MiB, 77, 65536);
    for (int i = 1; i < N; i += 2) {
        CHECK(vmm_test_intact(p[i], BLOCK_MIB * MiB, (unsigned)i, 65536));
        CHECK_OK(vmm_free(a, p[i]));
    }
    if (big)
        CHECK(vmm_test_intact(big, 20 * MiB, 77, 65536));
    CHECK_OK(vmm_free(a, big));
    CHECK_OK(vmm_check(a));
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    /* classic mode's cuMemFree implies a device sync; expandable mode never syncs */
    CHECK_EQ(c.device_syncs, strstr(conf, "expandable_segments:false") ? (uint64_t)after->num_device_free : 0);
    CHECK_EQ(c.stream_syncs, 0);
    CHECK_EQ(c.event_syncs, 0);
    vmm_destroy(a);
}

int main(void)
{
    const size_t total = (size_t)N * BLOCK_MIB * MiB; /* 350 MiB */
    /* cap 512 MiB, collect above 0.6 x 512 = 307.2 MiB */
    const size_t limit = (size_t)(0.6 * 512.0 * (double)MiB);
    const char *base = "driver:sim,sim_capacity:1G,sim_backed:true";
    char conf[256];
    vmm_stats b, a;

    /* expandable: idle pages of the holes unmapped and their handles released */
    memset(&b, 0, sizeof b);
    memset(&a, 0, sizeof a);
    snprintf(conf, sizeof conf, "%s,per_process_memory_fraction:0.5,garbage_collection_threshold:0.6", base);
    run(conf, &b, &a);
    CHECK_EQ(b.reserved_bytes[VMM_POOL_ALL].current, (long long)total);
    CHECK_EQ(b.num_device_free, 0);
    CHECK(a.num_device_free > 0);
    CHECK(a.num_pages_unmapped > 0);
    CHECK(a.reserved_bytes[VMM_POOL_ALL].current <= (long long)(limit + 20 * MiB));
    CHECK_EQ(a.num_event_waits, 0);
    CHECK_EQ(a.num_ooms, 0);

    /* expandable without a fraction: no collection; growth past the peak recycles holes instead */
    memset(&b, 0, sizeof b);
    memset(&a, 0, sizeof a);
    snprintf(conf, sizeof conf, "%s,garbage_collection_threshold:0.6", base);
    run(conf, &b, &a);
    CHECK_EQ(a.num_device_free, 0);
    CHECK_EQ(a.reserved_bytes[VMM_POOL_ALL].current, (long long)total);
    CHECK_EQ(a.num_device_alloc, b.num_device_alloc);

    /* classic: the oldest whole cached segments go back, then a new one is made */
    memset(&b, 0, sizeof b);
    memset(&a, 0, sizeof a);
    snprintf(conf, sizeof conf,
             "%s,expandable_segments:false,per_process_memory_fraction:0.5,garbage_collection_threshold:0.6",
             base);
    run(conf, &b, &a);
    CHECK_EQ(b.reserved_bytes[VMM_POOL_ALL].current, (long long)total);
    CHECK(a.num_device_free >= 5); /* 42.8 MiB over the limit: five 10 MiB segments */
    CHECK(a.reserved_bytes[VMM_POOL_ALL].current <= (long long)(limit + 20 * MiB));
    CHECK_EQ(a.num_sync_all_streams, 0);

    /* classic without a fraction: nothing is freed */
    memset(&b, 0, sizeof b);
    memset(&a, 0, sizeof a);
    snprintf(conf, sizeof conf, "%s,expandable_segments:false,garbage_collection_threshold:0.6", base);
    run(conf, &b, &a);
    CHECK_EQ(a.num_device_free, 0);
    CHECK_EQ(a.reserved_bytes[VMM_POOL_ALL].current, (long long)(total + 20 * MiB));
    TEST_DONE();
}
