// ctest-labels: unit
// ctest-timeout: 120
/*
 * Regressions of the defects the API fuzzer (fuzz/) found, each a short program against the public
 * API on the simulated device that failed before its fix:
 *  1. vmm_snapshot_pickle of a fused group with history on and no stacks: pointer arithmetic on a
 *     NULL frame array (clang's -fsanitize=undefined reports it; gcc's does not check it);
 *  2. mapping callbacks set, a malloc during a global-mode capture that recycles idle pages: the
 *     detached pages were unmapped in the caller's capture mode after delivery, invalidating the
 *     capture;
 *  3. vmm_wake whose host_free of the backup fails: the buffer was forgotten (leaked);
 *  4. classic segments, vmm_sleep of the untagged memory with one block freed and pending on a
 *     vmm_record_stream event (no block live): refused;
 *  5. vmm_wake that cannot confirm its restore copies: it unmapped the pages under the copies;
 *  6. vmm_pinned_malloc out of pinned memory during a capture: emptying the cache (cuMemFreeHost)
 *     synchronized the device and invalidated the capture;
 *  7. vmm_pool_release of a pool while its tag sleeps: its mapped segments joined the sleeping
 *     default pools (vmm_check: ECORRUPT);
 * and one of the same shape as 3: vmm_destroy leaked what the driver refused to release once
 * (handles, VA, classic segments, pinned blocks and events; the events found by the fuzzer).
 * Each ends with vmm_check and, after vmm_destroy, no simulated resource alive.
 */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

/* 1 */
static void snapshot_group_without_stacks(void)
{
    printf("snapshot of a fused group, history without stacks\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim", &a));
    if (!a)
        return;
    CHECK_OK(vmm_record_history(a, 64));
    size_t sizes[3] = {1000, 3000, 512};
    void *ptrs[3] = {0};
    CHECK_OK(vmm_malloc_group(a, sizes, 3, NULL, ptrs));
    char path[128];
    snprintf(path, sizeof path, "/tmp/vmm_reliability_%d.pickle", (int)getpid());
    CHECK_OK(vmm_snapshot_pickle(a, path));
    CHECK_EQ(access(path, R_OK), 0);
    unlink(path);
    CHECK_OK(vmm_free(a, ptrs[0]));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

/* 2 */
typedef struct maps {
    atomic_int after, before;
} maps;

static void on_map(void *ctx, uintptr_t va, size_t size, int dev, const uint64_t *h, size_t n)
{
    atomic_fetch_add(&((maps *)ctx)->after, 1);
}

static void on_unmap(void *ctx, uintptr_t va, size_t size, int dev, const uint64_t *h, size_t n)
{
    atomic_fetch_add(&((maps *)ctx)->before, 1);
}

static void callbacks_during_capture(void)
{
    printf("mapping callbacks, idle pages recycled during a global-mode capture\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:64M", &a));
    if (!a)
        return;
    vmm_stream s = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    /* 48 MiB cached on the default stream: a growth on s2 must recycle its idle pages */
    void *big = NULL;
    CHECK_OK(vmm_malloc(a, 48 * MiB, NULL, &big));
    CHECK_OK(vmm_free(a, big));
    CHECK_OK(vmm_sim_synchronize(a));
    void *w = NULL; /* what the captured work writes */
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &w));
    static maps m;
    CHECK_OK(vmm_set_mapping_callbacks(a, on_map, on_unmap, &m));
    /* s captures (global mode, as torch.cuda.graph does); this thread allocates on s2 */
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    CHECK_OK(vmm_sim_memset32(a, w, 0x5a5a5a5au, 1024, s));
    void *p = NULL;
    int64_t remapped = vmm_test_stats(a).num_pages_remapped;
    CHECK_OK(vmm_malloc(a, 32 * MiB, s2, &p));
    CHECK(vmm_test_stats(a).num_pages_remapped > remapped);
    CHECK(atomic_load(&m.before) > 0);
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g)); /* not invalidated */
    CHECK(g != NULL);
    /* the same after vmm_empty_cache during a capture */
    int before = atomic_load(&m.before);
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    CHECK_OK(vmm_sim_memset32(a, w, 0x5a5a5a5au, 1024, s));
    CHECK_OK(vmm_empty_cache(a));
    CHECK(atomic_load(&m.before) > before);
    vmm_sim_graph *g2 = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g2));
    CHECK_OK(vmm_free(a, w));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_stream_destroy(a, s));
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
    vmm_sim_graph_destroy(g2);
}

/* 3 */
static void wake_host_free_fails(void)
{
    printf("vmm_wake: freeing the backup buffer fails\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_backed:true", &a));
    if (!a)
        return;
    CHECK_OK(vmm_set_tag(a, "w"));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4096, NULL, &p));
    vmm_test_fill(p, 4096, 3, 64);
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_BACKUP));
    int64_t backup = vmm_test_stats(a).backup_bytes;
    CHECK(backup > 0);
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_HOST_FREE, 1));
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK(vmm_test_intact(p, 4096, 3, 64));
    /* the buffer is still held and counted (as a kept one), not forgotten */
    CHECK_EQ(vmm_test_stats(a).backup_bytes, backup);
    CHECK_OK(vmm_check(a));
    /* the next sleep and wake reuse it, then free it */
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_BACKUP));
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK_EQ(vmm_test_stats(a).backup_bytes, 0);
    CHECK(vmm_test_intact(p, 4096, 3, 64));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, p));
    /* and held at destroy: freed there */
    void *r = NULL;
    CHECK_OK(vmm_malloc(a, 4096, NULL, &r));
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_BACKUP));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_HOST_FREE, 1));
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK(vmm_test_stats(a).backup_bytes > 0);
    CHECK_OK(vmm_free(a, r));
    vmm_destroy(a);
}

/* 4 */
static void classic_sleep_with_pending_free(void)
{
    printf("classic segments: sleep of untagged memory with a free pending on an event\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,expandable_segments:false", &a));
    if (!a)
        return;
    vmm_stream s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &p));
    CHECK_OK(vmm_record_stream(a, p, s2));
    CHECK_OK(vmm_free(a, p)); /* pending on s2's event: nothing live */
    CHECK_OK(vmm_sim_synchronize(a)); /* the event completed; no allocator call polled it */
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_DISCARD));
    CHECK_EQ(vmm_is_asleep(a, ""), 1);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_wake(a, NULL, 0));
    /* a live block still refuses, as documented */
    CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &p));
    CHECK_EQ(vmm_sleep(a, NULL, 0, VMM_SLEEP_DISCARD), VMM_EINVAL);
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    vmm_destroy(a);
}

/* 5 */
static void wake_unconfirmed_restores(void)
{
    printf("vmm_wake: the restore copies cannot be waited for\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_backed:true", &a));
    if (!a)
        return;
    CHECK_OK(vmm_set_tag(a, "kv"));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &p));
    vmm_test_fill(p, 4 * MiB, 9, 4096);
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_BACKUP));
    /* the restores queue behind a kernel on the default stream; both waits for them fail */
    static vmm_test_gate g;
    CHECK_OK(vmm_sim_launch(a, NULL, vmm_test_gate_wait, &g));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_EVENT_SYNC, 1));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_STREAM_SYNC, 1));
    CHECK_EQ(vmm_wake(a, NULL, 0), VMM_EDRIVER);
    CHECK_EQ(vmm_is_asleep(a, "kv"), 1);
    /* the copies run now: into memory still mapped */
    atomic_store(&g.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK(atomic_load(&g.done));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK(vmm_test_intact(p, 4 * MiB, 9, 4096));
    CHECK_OK(vmm_check(a));
    /* and freed while asleep with those pages mapped */
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_BACKUP));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_EVENT_SYNC, 1));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_STREAM_SYNC, 1));
    CHECK_EQ(vmm_wake(a, NULL, 0), VMM_EDRIVER);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

/* 6 */
static void pinned_oom_during_capture(void)
{
    printf("pinned malloc out of pinned memory while another stream captures\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim", &a));
    if (!a)
        return;
    vmm_stream s = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    void *h = NULL, *h2 = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 4096, s2, &h));
    CHECK_OK(vmm_pinned_free(a, h));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_pinned_malloc(a, 8192, s2, &h2)); /* polls: the 4 KiB block is cached now */
    vmm_pinned_stats ps;
    CHECK_OK(vmm_pinned_get_stats(a, &ps));
    CHECK_EQ(ps.cached_blocks, 1);
    CHECK_OK(vmm_pool_begin(a, 3, 0, s));
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_HOST_ALLOC, 1)); /* host out of pinned memory once */
    void *x = NULL;
    CHECK_EQ(vmm_pinned_malloc(a, 65536, s2, &x), VMM_EHOSTMEM);
    CHECK(strstr(vmm_last_error(), "capture") != NULL);
    CHECK_OK(vmm_pinned_get_stats(a, &ps));
    CHECK_EQ(ps.cached_blocks, 1); /* not emptied */
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g)); /* not invalidated */
    CHECK_OK(vmm_pool_end(a, 3, 0));
    CHECK_OK(vmm_pool_release(a, 3, 0));
    /* no capture: the cache is emptied and the retry succeeds, as before */
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_HOST_ALLOC, 1));
    CHECK_OK(vmm_pinned_malloc(a, 65536, s2, &x));
    CHECK_OK(vmm_pinned_get_stats(a, &ps));
    CHECK_EQ(ps.cached_blocks, 0);
    CHECK_OK(vmm_pinned_free(a, x));
    CHECK_OK(vmm_pinned_free(a, h2));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_stream_destroy(a, s));
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
}

/* 7 */
static void pool_release_while_asleep(void)
{
    printf("private pool released while its tag sleeps\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim", &a));
    if (!a)
        return;
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    void *d = NULL, *x = NULL, *y = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, s, &d)); /* default pools: it sleeps */
    CHECK_OK(vmm_pool_begin(a, 5, 0, s));
    CHECK_OK(vmm_malloc(a, 2 * MiB, s, &x));
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &y));
    CHECK_OK(vmm_pool_end(a, 5, 0));
    CHECK_OK(vmm_free(a, y));
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_DISCARD));
    CHECK_OK(vmm_pool_release(a, 5, 0));
    CHECK_OK(vmm_check(a));
    vmm_pool_stats st;
    CHECK_OK(vmm_pool_get_stats(a, 5, 0, &st)); /* waits for the wake to go back */
    CHECK_EQ(st.use_count, 0);
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(vmm_pool_get_stats(a, 5, 0, &st), VMM_EINVAL); /* gone back now */
    uint64_t i0 = 1, i1 = 1;
    CHECK_OK(vmm_pool_lookup(a, x, &i0, &i1));
    CHECK(i0 == 0 && i1 == 0);
    CHECK_OK(vmm_free(a, x));
    CHECK_OK(vmm_free(a, d));
    /* the pool's memory sleeps with its tag from now on */
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_DISCARD));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_wake(a, NULL, 0));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_sim_stream_destroy(a, s));
    vmm_destroy(a);
}

/* Same shape as 3: vmm_destroy ignored a refused release (handle, VA, classic segment, pinned
 * block, backup buffer) and leaked it; it now tries again. */
static void destroy_after_refusals(int expandable)
{
    printf("vmm_destroy: the first release of each kind refused (%s)\n", expandable ? "expandable" : "classic");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(expandable ? "driver:sim,sim_backed:true" : "driver:sim,sim_backed:true,"
                                                                    "expandable_segments:false", &a));
    if (!a)
        return;
    void *p = NULL, *q = NULL, *h = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &p));
    CHECK_OK(vmm_malloc(a, 5000, NULL, &q));
    vmm_stream s2 = NULL; /* an event for q's use on s2, pooled once its free completed */
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    CHECK_OK(vmm_record_stream(a, q, s2));
    CHECK_OK(vmm_free(a, q)); /* cached */
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a)); /* polls the event back to the pool */
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    if (expandable) { /* pinned blocks and their events (destroyed before the allocator's) */
        CHECK_OK(vmm_pinned_malloc(a, 4096, NULL, &h));
        CHECK_OK(vmm_pinned_free(a, h));
    }
    if (expandable) { /* a kept backup buffer */
        CHECK_OK(vmm_set_tag(a, "t"));
        void *t = NULL;
        CHECK_OK(vmm_malloc(a, 4096, NULL, &t));
        CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_BACKUP | VMM_SLEEP_KEEP_HOST));
        CHECK_OK(vmm_wake(a, NULL, 0));
        CHECK_OK(vmm_free(a, t));
    }
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    const int kinds[] = {VMM_SIM_CALL_MEM_RELEASE, VMM_SIM_CALL_VA_FREE, VMM_SIM_CALL_MEM_FREE,
                         VMM_SIM_CALL_HOST_FREE, VMM_SIM_CALL_EVENT_DESTROY};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        CHECK_OK(vmm_sim_fail_nth(a, kinds[i], 1));
    vmm_destroy(a); /* reports live blocks: none; leaks show in the final check */
}

static void destroy_refusals(void)
{
    destroy_after_refusals(1);
    destroy_after_refusals(0);
}

static const struct {
    const char *name;
    void (*fn)(void);
} cases[] = {
    {"snapshot", snapshot_group_without_stacks}, {"callbacks", callbacks_during_capture},
    {"wake_host_free", wake_host_free_fails},    {"classic_sleep", classic_sleep_with_pending_free},
    {"wake_restores", wake_unconfirmed_restores}, {"pinned", pinned_oom_during_capture},
    {"pool_release", pool_release_while_asleep}, {"destroy", destroy_refusals},
};

/* No argument: every case; else the cases named. */
int main(int argc, char **argv)
{
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int run = argc < 2;
        for (int k = 1; k < argc; k++)
            run |= strcmp(argv[k], cases[i].name) == 0;
        if (run)
            cases[i].fn();
    }
    vmm_test_check_no_sim_leaks();
    TEST_DONE();
}
