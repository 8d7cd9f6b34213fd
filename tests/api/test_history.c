// ctest-labels: unit
/* History ring: each event kind is recorded where it happens, with the right address, size and
 * stream; times never go back and are microseconds since the epoch; the ring keeps the newest
 * entries when full or resized; recording off records nothing; the CSV holds the same entries.
 * Call stacks: one interned stack per call site, kept on live blocks until their free completes,
 * on trace entries as the context flags say, kept across a resize, named from libc when
 * symbolized; bad flags refused, Python stacks refused outside Python; threads recording stacks
 * while the ring is resized and switched (for TSan). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "history.h"
#include "internal.h" /* vmm_lock (history.h no longer includes every header) */
#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)
enum { RING = 4096 };

static vmm_trace_entry ev[RING];

static size_t history(vmm_allocator *a)
{
    int64_t n = vmm_history_get(a, ev, RING);
    CHECK(n >= 0 && n <= RING);
    return n < 0 ? 0 : (size_t)n;
}

/* Index of the first entry at or after `from` with this action and address, or -1. */
static long find(size_t n, size_t from, int action, uintptr_t addr)
{
    for (size_t i = from; i < n; i++)
        if (ev[i].action == action && ev[i].addr == addr)
            return (long)i;
    return -1;
}

static size_t count(size_t n, int action)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++)
        c += ev[i].action == action;
    return c;
}

static void expandable_events(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M", &a));
    if (!a)
        return;
    void *p = NULL;
    /* off: nothing recorded */
    CHECK_EQ(vmm_history_get(a, NULL, 0), 0);
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &p));
    CHECK_OK(vmm_free(a, p));
    CHECK_EQ(vmm_history_get(a, NULL, 0), 0);
    vmm_stats st;
    CHECK_OK(vmm_get_stats(a, &st));
    int64_t mapped_before = st.mapped_bytes[0].current;

    CHECK_OK(vmm_record_history(a, RING));
    vmm_stream s1 = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    void *x = NULL, *y = NULL, *z = NULL;
    CHECK_OK(vmm_malloc(a, 5 * MiB, s1, &x));   /* new stream: maps pages */
    CHECK_OK(vmm_malloc(a, 1000, s1, &y));      /* small pool */
    CHECK_OK(vmm_malloc(a, 7 * MiB, s1, &z));
    size_t n = history(a);
    long ix = find(n, 0, VMM_TRACE_ALLOC, (uintptr_t)x);
    long iy = find(n, 0, VMM_TRACE_ALLOC, (uintptr_t)y);
    long iz = find(n, 0, VMM_TRACE_ALLOC, (uintptr_t)z);
    CHECK(ix >= 0 && iy > ix && iz > iy);
    if (ix >= 0 && iy >= 0 && iz >= 0) {
        CHECK_EQ(ev[ix].size, vmm_usable_size(a, x));
        CHECK_EQ(ev[iy].size, vmm_usable_size(a, y));
        CHECK(ev[ix].stream == s1 && ev[iz].stream == s1);
    }
    /* a map of the pages holding x comes before its alloc */
    long im = -1;
    for (long i = 0; ix >= 0 && i < ix; i++)
        if (ev[i].action == VMM_TRACE_SEGMENT_MAP && ev[i].addr <= (uintptr_t)x &&
            (uintptr_t)x + 5 * MiB <= ev[i].addr + ev[i].size)
            im = i;
    CHECK(im >= 0);
    if (im >= 0)
        CHECK(ev[im].stream == s1 && ev[im].size % (2 * MiB) == 0);

    /* plain free: requested and completed at once, in that order */
    CHECK_OK(vmm_free(a, z));
    n = history(a);
    long fr = find(n, 0, VMM_TRACE_FREE_REQUESTED, (uintptr_t)z);
    long fc = find(n, 0, VMM_TRACE_FREE_COMPLETED, (uintptr_t)z);
    CHECK(fr > iz && fc == fr + 1);

    /* free of a block used on another stream: completed only once that stream's work ran */
    vmm_test_gate g = {0};
    CHECK_OK(vmm_record_stream(a, x, s2));
    CHECK_OK(vmm_sim_launch(a, s2, vmm_test_gate_wait, &g));
    CHECK_OK(vmm_free(a, x));
    void *w = NULL;
    CHECK_OK(vmm_malloc(a, 512, s1, &w)); /* polls pending frees: x's event is not done */
    n = history(a);
    fr = find(n, 0, VMM_TRACE_FREE_REQUESTED, (uintptr_t)x);
    CHECK(fr >= 0);
    CHECK_EQ(find(n, 0, VMM_TRACE_FREE_COMPLETED, (uintptr_t)x), -1);
    atomic_store(&g.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_free(a, w));
    CHECK_OK(vmm_malloc(a, 512, s1, &w)); /* the next malloc finds the event done */
    n = history(a);
    fc = find(n, 0, VMM_TRACE_FREE_COMPLETED, (uintptr_t)x);
    CHECK(fc > fr);
    if (fc >= 0)
        CHECK(ev[fc].stream == s1);

    /* empty_cache unmaps idle pages */
    CHECK_OK(vmm_free(a, w));
    CHECK_OK(vmm_free(a, y));
    CHECK_OK(vmm_empty_cache(a));
    n = history(a);
    CHECK(count(n, VMM_TRACE_SEGMENT_UNMAP) > 0);
    CHECK_OK(vmm_get_stats(a, &st));
    uint64_t unmapped = 0, mapped = 0;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].action == VMM_TRACE_SEGMENT_UNMAP)
            unmapped += ev[i].size;
        if (ev[i].action == VMM_TRACE_SEGMENT_MAP)
            mapped += ev[i].size;
    }
    /* the map and unmap events account for every change of mapped bytes */
    CHECK_EQ((int64_t)mapped - (int64_t)unmapped, st.mapped_bytes[0].current - mapped_before);

    /* times: monotonic, since create */
    for (size_t i = 1; i < n; i++)
        CHECK(ev[i].time_us >= ev[i - 1].time_us);

    /* oom: size asked for */
    void *big = NULL;
    CHECK_EQ(vmm_malloc(a, 300 * MiB, s1, &big), VMM_ENOMEM);
    n = history(a);
    CHECK(n > 0 && ev[n - 1].action == VMM_TRACE_OOM && ev[n - 1].size == 300 * MiB);
    CHECK_OK(vmm_check(a));

    /* CSV: same entries */
    char path[256];
    snprintf(path, sizeof path, "/tmp/vmm_history_%d.csv", (int)getpid());
    CHECK_OK(vmm_history_csv(a, path));
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    if (f) {
        char line[256];
        CHECK(fgets(line, sizeof line, f) && strcmp(line, "action,addr,size,stream,time_us\n") == 0);
        size_t k = 0;
        char act[32];
        unsigned long long addr, size, stream, t;
        while (fscanf(f, "%31[^,],%llx,%llu,%llx,%llu\n", act, &addr, &size, &stream, &t) == 5) {
            CHECK(k < n);
            if (k < n) {
                CHECK(strcmp(act, vmm_trace_action_name(ev[k].action)) == 0);
                CHECK(addr == ev[k].addr && size == ev[k].size && t == ev[k].time_us);
                CHECK(stream == (uintptr_t)ev[k].stream);
            }
            k++;
        }
        CHECK_EQ(k, n);
        fclose(f);
    }
    unlink(path);
    CHECK_EQ(vmm_history_csv(a, "/nonexistent-dir/x.csv"), VMM_EINVAL);
    CHECK(strstr(vmm_last_error(), "/nonexistent-dir/x.csv") != NULL);
    vmm_destroy(a);
}

static void classic_events(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M,expandable_segments:false", &a));
    if (!a)
        return;
    CHECK_OK(vmm_record_history(a, 64));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 12 * MiB, NULL, &p));
    CHECK_OK(vmm_free(a, p));
    size_t n = history(a);
    CHECK_EQ(n, 4);
    int want[4] = {VMM_TRACE_SEGMENT_ALLOC, VMM_TRACE_ALLOC, VMM_TRACE_FREE_REQUESTED,
                   VMM_TRACE_FREE_COMPLETED};
    for (size_t i = 0; i < 4 && i < n; i++)
        CHECK_EQ(ev[i].action, want[i]);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_EQ(vmm_history_get(a, ev, RING), 5);
    CHECK_EQ(ev[4].action, VMM_TRACE_SEGMENT_FREE);
    CHECK_EQ(ev[4].addr, ev[0].addr);
    CHECK_EQ(ev[4].size, ev[0].size);
    CHECK(ev[0].size >= 12 * MiB);
    CHECK(strcmp(vmm_trace_action_name(VMM_TRACE_SEGMENT_FREE), "segment_free") == 0);
    CHECK(strcmp(vmm_trace_action_name(99), "unknown") == 0);
    vmm_destroy(a);
}

static void ring_wraps(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M", &a));
    if (!a)
        return;
    CHECK_OK(vmm_record_history(a, 16));
    void *last = NULL;
    for (int i = 0; i < 100; i++) {
        CHECK_OK(vmm_malloc(a, (size_t)(i + 1) * 4096, NULL, &last));
        CHECK_OK(vmm_free(a, last));
    }
    CHECK_EQ(vmm_history_get(a, ev, RING), 16);
    /* the newest 16: 8 (alloc, free_requested, free_completed)... ending with the last free */
    CHECK_EQ(ev[15].action, VMM_TRACE_FREE_COMPLETED);
    CHECK_EQ(ev[15].addr, (uintptr_t)last);
    CHECK_EQ(ev[13].action, VMM_TRACE_ALLOC);
    CHECK_EQ(ev[13].size, 100 * 4096);
    for (int i = 1; i < 16; i++)
        CHECK(ev[i].time_us >= ev[i - 1].time_us);
    vmm_trace_entry before[16];
    memcpy(before, ev, sizeof before);
    /* shrink: the newest 4 stay, in order */
    CHECK_OK(vmm_record_history(a, 4));
    CHECK_EQ(vmm_history_get(a, ev, RING), 4);
    for (int i = 0; i < 4; i++)
        CHECK(memcmp(&ev[i], &before[12 + i], sizeof ev[i]) == 0);
    /* grow: all 4 stay, then new ones follow */
    CHECK_OK(vmm_record_history(a, 32));
    CHECK_EQ(vmm_history_get(a, ev, 2), 4); /* count beyond max */
    CHECK(memcmp(&ev[0], &before[14], sizeof ev[0]) == 0); /* max 2: the newest 2 */
    CHECK(memcmp(&ev[1], &before[15], sizeof ev[1]) == 0);
    CHECK_EQ(vmm_history_get(a, ev, RING), 4);
    CHECK(memcmp(&ev[0], &before[12], sizeof ev[0]) == 0);
    CHECK_OK(vmm_malloc(a, 4096, NULL, &last));
    CHECK_EQ(vmm_history_get(a, ev, RING), 5);
    CHECK_EQ(ev[4].action, VMM_TRACE_ALLOC);
    CHECK_OK(vmm_free(a, last));
    /* off again: ring dropped, nothing more recorded */
    CHECK_OK(vmm_record_history(a, 0));
    CHECK_OK(vmm_malloc(a, 4096, NULL, &last));
    CHECK_OK(vmm_free(a, last));
    CHECK_EQ(vmm_history_get(a, ev, RING), 0);
    CHECK_EQ(vmm_record_history(NULL, 4), VMM_EINVAL);
    CHECK_EQ(vmm_history_get(a, NULL, 3), VMM_EINVAL);
    CHECK_EQ(vmm_record_history(a, SIZE_MAX), VMM_EINVAL);
    vmm_destroy(a);
}

/* ---- call stacks ---------------------------------------------------------------------------- */

static __attribute__((noinline)) void *site_a(vmm_allocator *a, size_t n)
{
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, n, NULL, &p));
    __asm__ volatile("" ::: "memory");
    return p;
}

static __attribute__((noinline)) void *site_b(vmm_allocator *a, size_t n)
{
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, n, NULL, &p));
    __asm__ volatile("" ::: "memory");
    return p;
}

static uint32_t stack_of(vmm_allocator *a, void *p)
{
    vmm_lock(a);
    uint32_t id = vmm_history_block_stack(a, (uintptr_t)p);
    vmm_unlock(a);
    return id;
}

/* Trace stack ids of the newest entry with this action and address, or UINT32_MAX. */
static uint32_t entry_stack(vmm_allocator *a, int action, void *p)
{
    vmm_trace_entry *e = NULL;
    uint32_t *ids = NULL;
    size_t n = 0;
    vmm_lock(a);
    int rc = vmm_history_copy_ex(a, &e, &ids, &n);
    vmm_unlock(a);
    CHECK_OK(rc);
    uint32_t r = UINT32_MAX;
    for (size_t i = 0; i < n; i++)
        if (e[i].action == action && e[i].addr == (uintptr_t)p)
            r = ids[i];
    free(e);
    free(ids);
    return r;
}

static void stacks(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M", &a));
    if (!a)
        return;
    CHECK_EQ(vmm_record_history_ex(a, 64, 1u << 7), VMM_EINVAL);
    CHECK_EQ(vmm_record_history_ex(a, 64, VMM_HISTORY_CONTEXT_ALLOC | VMM_HISTORY_CONTEXT_STATE), VMM_EINVAL);
    /* no CPython in this process */
    CHECK_EQ(vmm_record_history_ex(a, 64, VMM_HISTORY_STACKS_PYTHON), VMM_ENOTSUP);
    CHECK(strstr(vmm_last_error(), "CPython") != NULL);

    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t now_us = (uint64_t)rt.tv_sec * 1000000u + (uint64_t)rt.tv_nsec / 1000u;
    /* the same path through the allocator for both: pages mapped before, both cached allocs */
    CHECK_OK(vmm_free(a, site_a(a, 4096)));
    CHECK_OK(vmm_record_history_ex(a, 256, VMM_HISTORY_STACKS_NATIVE));
    void *pa[2];
    volatile int two = 2; /* not unrolled into two call sites */
    for (int i = 0; i < two; i++)
        pa[i] = site_a(a, 4096); /* one call site: the same stack twice */
    void *p1 = pa[0], *p2 = pa[1], *p3 = site_b(a, 4096);
    uint32_t s1 = stack_of(a, p1), s2 = stack_of(a, p2), s3 = stack_of(a, p3);
    CHECK(s1 != 0 && s3 != 0);
    CHECK_EQ(s1, s2); /* one call site, one interned stack */
    CHECK(s1 != s3);
    CHECK_EQ(entry_stack(a, VMM_TRACE_ALLOC, p1), s1);
    vmm_trace_entry e[4];
    CHECK(vmm_history_get(a, e, 4) > 0);
    /* microseconds since the epoch, not since vmm_create */
    CHECK(e[0].time_us + 60u * 1000000u >= now_us && e[0].time_us <= now_us + 60u * 1000000u);

    /* the frames: the call sites are different return addresses; libc's frames are named */
    uint64_t w1[160], w3[160];
    vmm_lock(a);
    size_t n1 = vmm_history_stack_words(a, s1, w1, 160);
    size_t n3 = vmm_history_stack_words(a, s3, w3, 160);
    vmm_unlock(a);
    CHECK(n1 >= 3 && n1 <= 64 && n3 >= 3);
    CHECK(memcmp(w1, w3, 8 * (n1 < n3 ? n1 : n3)) != 0);
    vmm_symcache *sc = vmm_symcache_new();
    vmm_frame fr[160];
    long nf = vmm_symbolize(sc, w1, n1, fr, 160);
    CHECK(nf == (long)n1); /* a static test binary: nothing is dropped */
    int libc_named = 0;
    for (long i = 0; i < nf; i++) {
        CHECK(fr[i].filename && fr[i].name && fr[i].line == 0);
        libc_named |= strstr(fr[i].filename, "libc.so") && strcmp(fr[i].name, "__libc_start_main") == 0;
    }
    CHECK(libc_named);
    vmm_symcache_free(sc);

    /* a freed block forgets its stack once its free completed; the free carries its own */
    CHECK_OK(vmm_free(a, p2));
    CHECK_EQ(stack_of(a, p2), 0);
    uint32_t fs = entry_stack(a, VMM_TRACE_FREE_REQUESTED, p2);
    CHECK(fs != 0 && fs != UINT32_MAX && fs != s1);
    CHECK_EQ(entry_stack(a, VMM_TRACE_FREE_COMPLETED, p2), s1); /* the alloc's, as PyTorch */

    /* a resize with stacks keeps them */
    CHECK_OK(vmm_record_history_ex(a, 1024, VMM_HISTORY_STACKS_NATIVE));
    CHECK_EQ(stack_of(a, p1), s1);
    CHECK_EQ(entry_stack(a, VMM_TRACE_ALLOC, p3), s3);

    /* context alloc: frees without stacks; context state: no trace stacks, blocks keep theirs */
    CHECK_OK(vmm_record_history_ex(a, 1024, VMM_HISTORY_STACKS_NATIVE | VMM_HISTORY_CONTEXT_ALLOC));
    void *p4 = site_b(a, 8192);
    CHECK_OK(vmm_free(a, p4));
    CHECK(entry_stack(a, VMM_TRACE_ALLOC, p4) != 0);
    CHECK_EQ(entry_stack(a, VMM_TRACE_FREE_REQUESTED, p4), 0);
    CHECK_OK(vmm_record_history_ex(a, 1024, VMM_HISTORY_STACKS_NATIVE | VMM_HISTORY_CONTEXT_STATE));
    void *p5 = site_b(a, 8192);
    CHECK(stack_of(a, p5) != 0);
    CHECK_EQ(entry_stack(a, VMM_TRACE_ALLOC, p5), 0);
    /* stacks off: no stacks, old ids dropped */
    CHECK_OK(vmm_record_history_ex(a, 1024, 0));
    CHECK_EQ(stack_of(a, p1), 0);
    CHECK_EQ(entry_stack(a, VMM_TRACE_ALLOC, p1), 0);
    void *p6 = site_a(a, 4096);
    CHECK_EQ(entry_stack(a, VMM_TRACE_ALLOC, p6), 0);
    CHECK_OK(vmm_record_history(a, 0));
    CHECK_EQ(stack_of(a, p6), 0);
    void *all[] = {p1, p3, p5, p6};
    for (int i = 0; i < 4; i++)
        CHECK_OK(vmm_free(a, all[i]));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

typedef struct stack_worker {
    vmm_allocator *a;
    atomic_int *stop;
    int fails;
} stack_worker;

static void *stack_thread(void *arg)
{
    stack_worker *w = arg;
    void *p[8];
    for (int round = 0; !atomic_load(w->stop) && round < 4000; round++) {
        for (int i = 0; i < 8; i++)
            p[i] = (i & 1 ? site_a : site_b)(w->a, (size_t)(i + 1) * 3000);
        for (int i = 0; i < 8; i++)
            if (vmm_free(w->a, p[i]) != VMM_OK)
                w->fails++;
    }
    return NULL;
}

/* Threads allocate with stacks while the main thread resizes the ring and switches stacks and
 * context on and off, and takes snapshots: no race (TSan), nothing lost. */
static void stacks_threads(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:512M", &a));
    if (!a)
        return;
    atomic_int stop = 0;
    stack_worker w[3];
    pthread_t t[3];
    CHECK_OK(vmm_record_history_ex(a, 512, VMM_HISTORY_STACKS_NATIVE));
    for (int i = 0; i < 3; i++) {
        w[i] = (stack_worker){a, &stop, 0};
        pthread_create(&t[i], NULL, stack_thread, &w[i]);
    }
    static const unsigned flags[] = {VMM_HISTORY_STACKS_NATIVE, 0,
                                     VMM_HISTORY_STACKS_NATIVE | VMM_HISTORY_CONTEXT_ALLOC,
                                     VMM_HISTORY_STACKS_NATIVE | VMM_HISTORY_CONTEXT_STATE};
    char path[64];
    snprintf(path, sizeof path, "/tmp/vmm_history_threads_%d.pickle", (int)getpid());
    for (int k = 0; k < 40; k++) {
        CHECK_OK(vmm_record_history_ex(a, (size_t)(64 + 37 * k), flags[k % 4]));
        if (k % 10 == 9)
            CHECK_OK(vmm_snapshot_pickle(a, path));
        if (k % 13 == 12)
            CHECK_OK(vmm_record_history(a, 0));
        vmm_test_sleep_ms(2);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].fails, 0);
    }
    unlink(path);
    CHECK_EQ(vmm_test_stats(a).allocation[0].current, 0);
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

int main(void)
{
    expandable_events();
    classic_events();
    ring_wraps();
    stacks();
    stacks_threads();
    TEST_DONE();
}
