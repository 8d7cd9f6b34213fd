// ctest-labels: unit
/* Rounding, pools, split / merge / oversize rules against hand-computed cases, bad input and the
 * stats JSON; vmm_check after every step. */
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static vmm_allocator *make(const char *conf)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    return a;
}

static void *get(vmm_allocator *a, size_t n)
{
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, n, NULL, &p));
    CHECK_OK(vmm_check(a));
    return p;
}

static void put(vmm_allocator *a, void *p)
{
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
}

static void test_rounding(void)
{
    vmm_config c;
    vmm_config_defaults(&c);
    CHECK_EQ(vmm_round_size(&c, 1), 512);
    CHECK_EQ(vmm_round_size(&c, 511), 512);
    CHECK_EQ(vmm_round_size(&c, 512), 512);
    CHECK_EQ(vmm_round_size(&c, 513), 1024);
    CHECK_EQ(vmm_round_size(&c, 1200), 1536);
    CHECK_EQ(vmm_round_size(&c, 3 * MiB + 1), 3 * MiB + 512);
    CHECK_OK(vmm_config_parse(&c, "roundup_power2_divisions:4"));
    /* below 512 x 4 the plain rule holds (steps would not be multiples of 512) */
    CHECK_EQ(vmm_round_size(&c, 1200), 1536);
    /* 5000 in [4096, 8192), step 1024 -> 5120 */
    CHECK_EQ(vmm_round_size(&c, 5000), 5120);
    /* 1.2 MiB in [1, 2) MiB, step 256 KiB -> 1.25 MiB */
    CHECK_EQ(vmm_round_size(&c, 1258291), 1310720);
    CHECK_EQ(vmm_round_size(&c, 4096), 4096);       /* powers of two stay */
    CHECK_EQ(vmm_round_size(&c, 6 * MiB), 6 * MiB); /* already on a step */
    CHECK_EQ(vmm_pool_of(MiB), VMM_SMALL);
    CHECK_EQ(vmm_pool_of(MiB + 512), VMM_LARGE);
    CHECK_EQ(vmm_classic_segment_size(512), 2 * MiB);
    CHECK_EQ(vmm_classic_segment_size(MiB), 2 * MiB);
    CHECK_EQ(vmm_classic_segment_size(MiB + 512), 20 * MiB);
    CHECK_EQ(vmm_classic_segment_size(10 * MiB - 512), 20 * MiB);
    CHECK_EQ(vmm_classic_segment_size(10 * MiB), 10 * MiB);
    CHECK_EQ(vmm_classic_segment_size(11 * MiB - 512), 12 * MiB);
}

/* Classic: small segment split / merge / cache reuse, large split threshold, oversize. */
static void test_classic_rules(void)
{
    vmm_allocator *a = make("driver:sim,sim_capacity:1G,expandable_segments:false,max_split_size_mb:40");
    if (!a)
        return;
    vmm_stats s;
    char *p1 = get(a, 1000), *p2 = get(a, 1000);
    CHECK_EQ(vmm_usable_size(a, p1), 1024);
    CHECK(p2 == p1 + 1024); /* split from the same 2 MiB segment */
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.segment[VMM_POOL_SMALL].current, 1);
    CHECK_EQ(s.reserved_bytes[VMM_POOL_ALL].current, 2 * MiB);
    CHECK_EQ(s.allocated_bytes[VMM_POOL_ALL].current, 2048);
    CHECK_EQ(s.requested_bytes[VMM_POOL_ALL].current, 2000);
    CHECK_EQ(s.inactive_split[VMM_POOL_SMALL].current, 1);
    CHECK_EQ(s.inactive_split_bytes[VMM_POOL_SMALL].current, 2 * MiB - 2048);
    put(a, p1);
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.inactive_split[VMM_POOL_SMALL].current, 2);
    char *p3 = get(a, 600); /* best fit: the 1024 hole, split into 1024 (remainder 0) */
    CHECK(p3 == p1);
    put(a, p2);
    put(a, p3);
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.inactive_split[VMM_POOL_SMALL].current, 0); /* merged back into one block */
    CHECK_EQ(s.allocated_bytes[VMM_POOL_ALL].current, 0);

    /* large: 5 MiB request -> 20 MiB segment, remainder 15 MiB > 1 MiB: split */
    char *l1 = get(a, 5 * MiB), *l2 = get(a, 14 * MiB);
    CHECK(l2 == l1 + 5 * MiB);
    CHECK_EQ(vmm_usable_size(a, l2), 15 * MiB); /* remainder 1 MiB is not > 1 MiB: no split */
    char *l3 = get(a, 512 * 1024 + MiB); /* remainder of 1 MiB: not > 1 MiB -> new 20 MiB segment */
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.segment[VMM_POOL_LARGE].current, 2);
    put(a, l3);
    /* 19.5 MiB: fits the cached 20 MiB segment, remainder 0.5 MiB not split -> whole block */
    char *l4 = get(a, 19 * MiB + 512 * 1024);
    CHECK_EQ(vmm_usable_size(a, l4), 20 * MiB);
    put(a, l4);
    put(a, l1);
    put(a, l2);

    /* oversize (>= 40 MiB): never split; a smaller request never takes it */
    char *o1 = get(a, 50 * MiB);
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.oversize_allocations.current, 1);
    CHECK_EQ(s.oversize_segments.current, 1);
    put(a, o1);
    char *o2 = get(a, 30 * MiB); /* below max_split: must not reuse the 50 MiB block */
    CHECK(o2 != o1);
    char *o3 = get(a, 45 * MiB); /* oversize, 50 < 45 + 20: reuses the 50 MiB block unsplit */
    CHECK(o3 == o1);
    CHECK_EQ(vmm_usable_size(a, o3), 50 * MiB);
    put(a, o2);
    put(a, o3);
    char *o4 = get(a, 41 * MiB + 512 * 1024); /* 41.5 MiB: ok (<61.5) */
    CHECK(o4 == o1);
    put(a, o4);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.reserved_bytes[VMM_POOL_ALL].current, 0);
    CHECK_EQ(s.segment[VMM_POOL_ALL].current, 0);
    vmm_destroy(a);
}

/* Expandable: pages mapped on demand, split whenever remainder >= 512, merge, unmap on empty_cache. */
static void test_expandable_rules(void)
{
    vmm_allocator *a = make("driver:sim,sim_capacity:1G");
    if (!a)
        return;
    vmm_stats s;
    char *p1 = get(a, 3 * MiB), *p2 = get(a, 3 * MiB);
    CHECK(p2 == p1 + 3 * MiB); /* lowest free address */
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.segment[VMM_POOL_LARGE].current, 1);
    CHECK_EQ(s.mapped_bytes[VMM_POOL_LARGE].current, 6 * MiB); /* 2 + 2 pages... */
    CHECK_EQ(s.reserved_bytes[VMM_POOL_ALL].current, 6 * MiB);
    char *p3 = get(a, MiB + 512); /* large pool; fits the mapped tail? no: 0 bytes left, maps 1 page */
    CHECK(p3 == p2 + 3 * MiB);
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.mapped_bytes[VMM_POOL_LARGE].current, 8 * MiB);
    put(a, p2);
    char *p4 = get(a, 2 * MiB); /* best fit in the 3 MiB hole, split (remainder 1 MiB >= 512) */
    CHECK(p4 == p2);
    char *q = get(a, MiB - 512 - 512); /* small pool: its own reservation */
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.segment[VMM_POOL_SMALL].current, 1);
    CHECK_EQ(s.mapped_bytes[VMM_POOL_SMALL].current, 2 * MiB);
    put(a, q);
    put(a, p1);
    put(a, p3);
    put(a, p4);
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.allocated_bytes[VMM_POOL_ALL].current, 0);
    CHECK_EQ(s.num_event_waits, 0);
    /* empty_cache never waits: the first call fences the default stream's frees, the second
     * (after the fence ran) unmaps and releases */
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.reserved_bytes[VMM_POOL_ALL].current, 0);
    CHECK_EQ(s.mapped_bytes[VMM_POOL_ALL].current, 0);
    CHECK_EQ(s.segment[VMM_POOL_ALL].current, 0);
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.device_syncs, 1); /* only the explicit vmm_sim_synchronize */
    CHECK_EQ(c.stream_syncs, 0);
    CHECK_EQ(c.live_handles, 0);
    vmm_destroy(a);
}

static void test_bad_input(void)
{
    void *p = (void *)1;
    CHECK_EQ(vmm_malloc(NULL, 16, NULL, &p), VMM_EINVAL);
    CHECK(strlen(vmm_last_error()) > 0);
    CHECK_EQ(vmm_free(NULL, p), VMM_EINVAL);
    vmm_allocator *a = make("driver:sim,sim_capacity:1G");
    if (!a)
        return;
    CHECK_OK(vmm_malloc(a, 0, NULL, &p));
    CHECK(p == NULL);
    CHECK_EQ(vmm_malloc(a, SIZE_MAX, NULL, &p), VMM_EINVAL);
    CHECK_EQ(vmm_malloc(a, SIZE_MAX - 4096, NULL, &p), VMM_EINVAL);
    CHECK_EQ(vmm_malloc(a, (size_t)1 << 61, NULL, &p), VMM_ENOMEM);
    CHECK(strstr(vmm_last_error(), "out of memory") != NULL);
    CHECK_EQ(vmm_malloc(a, 16, NULL, NULL), VMM_EINVAL);
    CHECK_OK(vmm_check(a));
    char *q = get(a, 4096);
    CHECK_EQ(vmm_free(a, q + 512), VMM_EBADPTR); /* interior */
    CHECK_EQ(vmm_free(a, (void *)&p), VMM_EBADPTR); /* foreign */
    CHECK_EQ(vmm_record_stream(a, q + 512, NULL), VMM_EBADPTR);
    CHECK_EQ(vmm_usable_size(a, q + 512), 0);
    CHECK_OK(vmm_check(a));
    put(a, q);
    CHECK_EQ(vmm_free(a, q), VMM_EBADPTR); /* double free */
    CHECK(strstr(vmm_last_error(), "already freed") != NULL);
    CHECK_EQ(vmm_record_stream(a, q, NULL), VMM_EBADPTR); /* freed block */
    CHECK_OK(vmm_free(a, NULL));
    CHECK_OK(vmm_check(a));
    vmm_stats s;
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.allocation[0].current, 0);
    CHECK_EQ(s.num_ooms, 1);
    /* a second allocator does not accept the first's pointers */
    vmm_allocator *b = make("driver:sim,sim_capacity:1G");
    char *r = get(a, 4096);
    if (b) {
        CHECK_EQ(vmm_free(b, r), VMM_EBADPTR);
        CHECK_OK(vmm_check(b));
        vmm_destroy(b);
    }
    put(a, r);
    CHECK_EQ(vmm_create("driver:sim,bogus_key:1", &b), VMM_ECONFIG);
    CHECK(b == NULL);
    CHECK_EQ(vmm_create("driver:sim,small_page_size:3M", &b), VMM_ECONFIG);
    vmm_destroy(a);
}

static long long json_num(const char *js, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(js, pat);
    if (!p)
        return -999999;
    return strtoll(p + strlen(pat), NULL, 10);
}

static void test_stats_json(void)
{
    vmm_allocator *a = make("driver:sim,sim_capacity:1G");
    if (!a)
        return;
    void *p = get(a, 5 * MiB), *q = get(a, 1000);
    static char js[32768];
    int n = vmm_stats_json(a, js, sizeof js);
    CHECK(n > 0);
    CHECK(js[0] == '{' && js[n - 1] == '}');
    vmm_stats s;
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(json_num(js, "allocated_bytes.all.current"), s.allocated_bytes[0].current);
    CHECK_EQ(json_num(js, "allocated_bytes.large_pool.current"), 5 * MiB);
    CHECK_EQ(json_num(js, "requested_bytes.small_pool.current"), 1000);
    CHECK_EQ(json_num(js, "reserved_bytes.all.peak"), s.reserved_bytes[0].peak);
    CHECK_EQ(json_num(js, "mapped_bytes.all.current"), s.mapped_bytes[0].current);
    CHECK_EQ(json_num(js, "segment.all.current"), 2);
    CHECK_EQ(json_num(js, "num_ooms"), 0);
    CHECK_EQ(json_num(js, "num_event_waits"), 0);
    CHECK_EQ(json_num(js, "num_pages_remapped"), s.num_pages_remapped);
    CHECK(json_num(js, "metadata_bytes") > 0);
    CHECK_EQ(json_num(js, "max_split_size"), -1);
    CHECK_EQ(json_num(js, "sim.device_syncs"), 0);
    CHECK(json_num(js, "sim.calls.mem_map") >= 4);
    CHECK(json_num(js, "sim.driver_time_ns") >= 0);
    const char *keys[] = {"allocation.all.current", "active.small_pool.peak", "inactive_split.large_pool.freed",
                          "active_bytes.all.allocated", "inactive_split_bytes.all.current",
                          "oversize_allocations.current", "oversize_segments.peak", "num_alloc_retries",
                          "num_sync_all_streams", "num_device_alloc", "num_device_free",
                          "sim.stream_syncs", "sim.calls.set_access"};
    for (size_t i = 0; i < sizeof keys / sizeof *keys; i++)
        CHECK(json_num(js, keys[i]) != -999999);
    char small[64];
    CHECK_EQ(vmm_stats_json(a, small, sizeof small), VMM_ERANGE);
    CHECK(strlen(small) == sizeof small - 1);
    put(a, p);
    put(a, q);
    CHECK_OK(vmm_reset_stats(a, 0));
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.allocated_bytes[0].peak, 0);
    CHECK(s.allocated_bytes[0].allocated > 0);
    CHECK_OK(vmm_reset_stats(a, 1));
    CHECK_OK(vmm_get_stats(a, &s));
    CHECK_EQ(s.allocated_bytes[0].allocated, 0);
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

static void test_destroy_live(void)
{
    vmm_allocator *a = make("driver:sim,sim_capacity:1G,sim_backed:true");
    if (!a)
        return;
    for (int i = 0; i < 10; i++)
        get(a, (size_t)(i + 1) * 700 * 1024);
    vmm_destroy(a);
    a = make("driver:sim,sim_capacity:1G,expandable_segments:false");
    if (!a)
        return;
    for (int i = 0; i < 10; i++)
        get(a, (size_t)(i + 1) * 700 * 1024);
    vmm_destroy(a);
    vmm_test_check_no_sim_leaks();
}

int main(void)
{
    test_rounding();
    test_classic_rules();
    test_expandable_rules();
    test_bad_input();
    test_stats_json();
    test_destroy_live();
    TEST_DONE();
}
