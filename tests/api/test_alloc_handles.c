// ctest-labels: unit
/* Handles sized by need (max_handle_size:20M, segment.c): a growth of many pages maps a few big
 * physical handles instead of one per page, so fewer driver calls; one segment mixes handle sizes;
 * reclaim unmaps a handle only when every page of it is idle (cuMemUnmap takes whole mappings), so
 * a big handle with a page still in use stays mapped and its data intact; vmm_check agrees after
 * every step; destroy gives every handle back; a small growth maps ahead to a whole handle, so the
 * next small requests need no growth, unless the device has no room for it. Pages are not
 * exportable here (ipc:false): exported pages stay one per handle (ipc.c). */
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static uint64_t calls(vmm_allocator *a, int kind)
{
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    return c.calls[kind];
}

static int64_t mapped_large(vmm_allocator *a)
{
    return vmm_test_stats(a).mapped_bytes[VMM_POOL_LARGE].current;
}

/* The handles of every mapped run: how many, and the pages each covers (in address order). */
typedef struct handles_seen {
    size_t n;
    size_t pages[64];
} handles_seen;

static void on_run(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *h, size_t n)
{
    (void)va;
    (void)size;
    (void)device;
    handles_seen *s = ctx;
    for (size_t i = 0; i < n; i++) {
        if (i == 0 || h[i] != h[i - 1]) {
            if (s->n < 64)
                s->pages[s->n] = 0;
            s->n++;
        }
        if (s->n <= 64)
            s->pages[s->n - 1]++;
    }
}

static handles_seen handles(vmm_allocator *a)
{
    handles_seen s;
    memset(&s, 0, sizeof s);
    CHECK_OK(vmm_get_mappings(a, on_run, &s));
    return s;
}

static vmm_allocator *make(const char *extra)
{
    char conf[256];
    /* handles by need up to 20 MiB: a key since the default maps one handle per page */
    snprintf(conf, sizeof conf, "driver:sim,sim_capacity:1G,sim_backed:true,ipc:false,max_handle_size:20M%s",
             extra);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    return a;
}

/* A 60 MiB growth: 30 pages of 2 MiB in 4 handles (10 + 10 + 9 pages, and the last page alone),
 * against 30 handles with max_handle_size:2M. */
static void growth_calls(void)
{
    vmm_allocator *a = make(""), *b = make(",max_handle_size:2M");
    if (!a || !b)
        return;
    uint64_t ca = calls(a, VMM_SIM_CALL_MEM_CREATE), cb = calls(b, VMM_SIM_CALL_MEM_CREATE);
    uint64_t ma = calls(a, VMM_SIM_CALL_MEM_MAP), sa = calls(a, VMM_SIM_CALL_SET_ACCESS);
    void *p = NULL, *q = NULL;
    CHECK_OK(vmm_malloc(a, 60 * MiB, NULL, &p));
    CHECK_OK(vmm_malloc(b, 60 * MiB, NULL, &q));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_check(b));
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_CREATE) - ca, 4);
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_MAP) - ma, 4);
    CHECK_EQ(calls(a, VMM_SIM_CALL_SET_ACCESS) - sa, 1);
    CHECK_EQ(calls(b, VMM_SIM_CALL_MEM_CREATE) - cb, 30);
    CHECK_EQ(mapped_large(a), 60 * MiB);
    CHECK_EQ(mapped_large(b), 60 * MiB);
    /* mixed sizes in one segment, as the mapping callbacks see them */
    handles_seen s = handles(a);
    CHECK_EQ(s.n, 4);
    CHECK_EQ(s.pages[0], 10);
    CHECK_EQ(s.pages[1], 10);
    CHECK_EQ(s.pages[2], 9);
    CHECK_EQ(s.pages[3], 1);
    CHECK_EQ(handles(b).n, 30);
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(b, q));
    vmm_destroy(a);
    vmm_destroy(b);
    vmm_test_check_no_sim_leaks();
}

/* Reclaim: a big handle with a page under a live block stays mapped (data intact); once all of it
 * is free it goes. */
static void reclaim_whole_handles(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    void *big = NULL, *c = NULL;
    /* 40 MiB: pages [0, 10) [10, 19) [19, 20) */
    CHECK_OK(vmm_malloc(a, 40 * MiB, NULL, &big));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(handles(a).n, 3);
    CHECK_OK(vmm_free(a, big));
    CHECK_OK(vmm_check(a));
    /* 10 MiB from the cached 40 MiB block: it lies in the first (20 MiB) handle */
    CHECK_OK(vmm_malloc(a, 10 * MiB, NULL, &c));
    CHECK(c == big);
    if (c)
        vmm_test_fill(c, 10 * MiB, 7, 4096);
    uint64_t unmap0 = calls(a, VMM_SIM_CALL_MEM_UNMAP), rel0 = calls(a, VMM_SIM_CALL_MEM_RELEASE);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    /* the 18 MiB handle and the one-page tail were wholly idle: unmapped and released; the first
     * handle is half in use: still mapped, all 20 MiB of it */
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_UNMAP) - unmap0, 2);
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_RELEASE) - rel0, 2);
    CHECK_EQ(mapped_large(a), 20 * MiB);
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[VMM_POOL_LARGE].current, 20 * MiB);
    handles_seen s = handles(a);
    CHECK_EQ(s.n, 1);
    CHECK_EQ(s.pages[0], 10);
    if (c)
        CHECK(vmm_test_intact(c, 10 * MiB, 7, 4096));
    /* a growth next to it maps new handles beside the big one: still one segment */
    void *d = NULL;
    CHECK_OK(vmm_malloc(a, 30 * MiB, NULL, &d));
    CHECK_OK(vmm_check(a));
    CHECK(handles(a).n >= 2);
    if (c)
        CHECK(vmm_test_intact(c, 10 * MiB, 7, 4096));
    CHECK_OK(vmm_free(a, d));
    CHECK_OK(vmm_free(a, c));
    CHECK_OK(vmm_check(a));
    /* now every page is idle: everything goes */
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(mapped_large(a), 0);
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current, 0);
    CHECK_EQ(handles(a).n, 0);
    /* destroy gives back every handle: creates and releases balance */
    void *e = NULL;
    CHECK_OK(vmm_malloc(a, 50 * MiB, NULL, &e));
    CHECK_OK(vmm_check(a));
    vmm_sim_counters k;
    CHECK_OK(vmm_sim_get_counters(a, &k));
    CHECK_EQ(k.live_handles, handles(a).n);
    vmm_destroy(a); /* e still allocated: destroy unmaps and releases it */
    vmm_test_check_no_sim_leaks();
}

/* Small growths map ahead: a 3 MiB request (2 pages) maps its first page in a handle of its own
 * and its last page in a whole 20 MiB handle reaching ahead, so five more such requests fit
 * without a growth; a large growth maps only what it needs. */
static void small_growth_maps_ahead(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    uint64_t c0 = calls(a, VMM_SIM_CALL_MEM_CREATE), s0 = calls(a, VMM_SIM_CALL_SET_ACCESS);
    void *p[6] = {0}, *big = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &p[0]));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_CREATE) - c0, 2);
    CHECK_EQ(calls(a, VMM_SIM_CALL_SET_ACCESS) - s0, 1);
    CHECK_EQ(mapped_large(a), 22 * MiB);
    handles_seen s = handles(a);
    CHECK_EQ(s.n, 2);
    CHECK_EQ(s.pages[0], 1);
    CHECK_EQ(s.pages[1], 10);
    for (int i = 1; i < 6; i++)
        CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &p[i]));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_CREATE) - c0, 2);
    CHECK_EQ(calls(a, VMM_SIM_CALL_SET_ACCESS) - s0, 1);
    /* 40 MiB after 18 MiB in use: 36 MiB past the mapped 22, no more (9 + 8 pages, the last alone) */
    CHECK_OK(vmm_malloc(a, 40 * MiB, NULL, &big));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(mapped_large(a), 58 * MiB);
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_CREATE) - c0, 5);
    for (int i = 0; i < 6; i++)
        CHECK_OK(vmm_free(a, p[i]));
    CHECK_OK(vmm_free(a, big));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current, 0);
    vmm_destroy(a);
    /* a nearly full device: one handle per page, nothing ahead; the growth maps what the request
     * needs */
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:true,ipc:false,"
                        "per_process_memory_fraction:0.0078125", &a)); /* 8 MiB */
    if (!a)
        return;
    void *q = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &q));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(mapped_large(a), 4 * MiB);
    CHECK_OK(vmm_free(a, q));
    vmm_destroy(a);
    vmm_test_check_no_sim_leaks();
}

/* Exportable pages (ipc on a backed sim) stay one handle per page: vmm_ipc_get_handle exports, and
 * vmm_ipc_open maps, one handle per page. */
static void exportable_pages_stay_single(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:true,ipc:true", &a));
    if (!a)
        return;
    uint64_t c0 = calls(a, VMM_SIM_CALL_MEM_CREATE);
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 20 * MiB, NULL, &p));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(calls(a, VMM_SIM_CALL_MEM_CREATE) - c0, 10);
    CHECK_EQ(handles(a).n, 10);
    CHECK_OK(vmm_free(a, p));
    vmm_destroy(a);
    vmm_test_check_no_sim_leaks();
}

int main(void)
{
    growth_calls();
    reclaim_whole_handles();
    small_growth_maps_ahead();
    exportable_pages_stay_single();
    TEST_DONE();
}
