// ctest-labels: unit
/* small_page_size / large_page_size other than the 2 MiB default: each pool maps and counts whole
 * pages of its own size, idle pages of the other size are released (not remapped) when growth
 * would lift reserved bytes past their peak, data stays intact, and sizes the device cannot map
 * are refused at create. */
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)
#define KiB ((size_t)1 << 10)

static size_t round_up(size_t x, size_t m) { return (x + m - 1) / m * m; }

/* 16 x 512 KiB (small pool) and 5 x 12 MiB (large pool) with the given page sizes. */
static void pools(size_t sps, size_t lps)
{
    char conf[256];
    snprintf(conf, sizeof conf, "driver:sim,sim_capacity:1G,sim_backed:true,small_page_size:%zuK,"
                                "large_page_size:%zuK", sps / KiB, lps / KiB);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    if (!a)
        return;
    char *s[16], *l[5];
    for (int i = 0; i < 16; i++) {
        s[i] = NULL;
        CHECK_OK(vmm_malloc(a, 512 * KiB, NULL, (void **)&s[i]));
        CHECK_OK(vmm_check(a));
        if (s[i])
            vmm_test_fill(s[i], 512 * KiB, (unsigned)i, 65536);
    }
    for (int i = 0; i < 5; i++) {
        l[i] = NULL;
        CHECK_OK(vmm_malloc(a, 12 * MiB, NULL, (void **)&l[i]));
        CHECK_OK(vmm_check(a));
        if (l[i])
            vmm_test_fill(l[i], 12 * MiB, 100u + (unsigned)i, 65536);
    }
    vmm_stats st = vmm_test_stats(a);
    /* blocks are packed from the lowest address: whole pages of each pool's size */
    CHECK_EQ(st.reserved_bytes[VMM_POOL_SMALL].current, round_up(8 * MiB, sps));
    CHECK_EQ(st.reserved_bytes[VMM_POOL_LARGE].current, round_up(60 * MiB, lps));
    CHECK_EQ(st.mapped_bytes[VMM_POOL_SMALL].current, round_up(8 * MiB, sps));
    CHECK_EQ(st.mapped_bytes[VMM_POOL_LARGE].current, round_up(60 * MiB, lps));
    CHECK_EQ(st.num_device_alloc, round_up(8 * MiB, sps) / sps + round_up(60 * MiB, lps) / lps);

    /* free the small blocks, then grow the large pool past the peak */
    for (int i = 0; i < 16; i++) {
        CHECK(vmm_test_intact(s[i], 512 * KiB, (unsigned)i, 65536));
        CHECK_OK(vmm_free(a, s[i]));
        CHECK_OK(vmm_check(a));
    }
    vmm_stats st0 = vmm_test_stats(a);
    char *big = NULL;
    CHECK_OK(vmm_malloc(a, 16 * MiB, NULL, (void **)&big));
    CHECK_OK(vmm_check(a));
    vmm_stats st1 = vmm_test_stats(a);
    size_t tail = round_up(60 * MiB, lps) - 60 * MiB; /* free mapped bytes after the last block */
    size_t grow = round_up(16 * MiB - tail, lps);
    if (sps == lps) {
        /* the small pool's idle pages move over: nothing new unless they fall short */
        size_t moved = grow < round_up(8 * MiB, sps) ? grow : round_up(8 * MiB, sps);
        CHECK_EQ(st1.num_pages_remapped - st0.num_pages_remapped, moved / lps);
        CHECK_EQ(st1.num_device_free, 0);
        CHECK_EQ(st1.reserved_bytes[VMM_POOL_ALL].current,
                 st0.reserved_bytes[VMM_POOL_ALL].current + (grow - moved));
    } else {
        /* handles of the other size cannot be mapped here: released, so the peak rises less */
        CHECK_EQ(st1.num_device_free, round_up(8 * MiB, sps) / sps);
        CHECK_EQ(st1.num_pages_remapped, 0);
        CHECK_EQ(st1.reserved_bytes[VMM_POOL_SMALL].current, 0);
        CHECK_EQ(st1.reserved_bytes[VMM_POOL_ALL].current,
                 st0.reserved_bytes[VMM_POOL_LARGE].current + grow);
    }
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_LARGE].current % lps, 0);
    CHECK_EQ(st1.num_event_waits, 0);
    if (big) {
        vmm_test_fill(big, 16 * MiB, 7, 65536);
        CHECK(vmm_test_intact(big, 16 * MiB, 7, 65536));
    }
    for (int i = 0; i < 5; i++) {
        CHECK(vmm_test_intact(l[i], 12 * MiB, 100u + (unsigned)i, 65536));
        CHECK_OK(vmm_free(a, l[i]));
    }
    CHECK_OK(vmm_free(a, big));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current, 0);
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.device_syncs + c.stream_syncs + c.event_syncs, 0);
    CHECK_EQ(c.live_handles, 0);
    vmm_destroy(a);
}

static void refused(const char *conf)
{
    vmm_allocator *a = NULL;
    CHECK_EQ(vmm_create(conf, &a), VMM_ECONFIG);
    CHECK(a == NULL);
    CHECK(strstr(vmm_last_error(), "page_size") != NULL);
}

int main(void)
{
    pools(2 * MiB, 2 * MiB);
    pools(4 * MiB, 8 * MiB);
    pools(2 * MiB, 20 * MiB); /* PyTorch's large pages (not a power of two) */
    pools(8 * MiB, 8 * MiB);
    refused("driver:sim,sim_backed:false,small_page_size:1M");         /* below granularity */
    refused("driver:sim,sim_backed:false,large_page_size:3M");         /* not a multiple of it */
    refused("driver:sim,sim_backed:false,small_page_size:3M");         /* not a power of two */
    refused("driver:sim,sim_backed:false,sim_granularity:4M,large_page_size:6M");
    TEST_DONE();
}
