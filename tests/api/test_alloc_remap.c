// ctest-labels: unit
/* Growth recycles idle pages: when growing would lift reserved bytes above their high-water mark,
 * whole idle pages inside free blocks are unmapped and their handles mapped where the growth goes
 * (no new handles, data of live blocks intact, no synchronization, no blocking); below the mark
 * growth creates handles and unmaps nothing. Pages a pending launch may still touch are never
 * taken. vmm_check runs after every step. */
#include <stdatomic.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static vmm_allocator *A;

static vmm_stats stats(void) { return vmm_test_stats(A); }

static uint64_t calls(int kind)
{
    vmm_sim_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(vmm_sim_get_counters(A, &c));
    return c.calls[kind];
}

/* The allocator made no synchronization (the test's own ones are `own`). */
static void no_sync_but(const vmm_sim_counters *own)
{
    vmm_sim_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(vmm_sim_get_counters(A, &c));
    CHECK_EQ(c.device_syncs, own ? own->device_syncs : 0);
    CHECK_EQ(c.stream_syncs, own ? own->stream_syncs : 0);
    CHECK_EQ(c.event_syncs, own ? own->event_syncs : 0);
    vmm_stats st = stats();
    CHECK_EQ(st.num_event_waits, 0);
    CHECK_EQ(st.num_sync_all_streams, 0);
}

static void *alloc(size_t n, vmm_stream s, unsigned seed)
{
    void *p = NULL;
    CHECK_OK(vmm_malloc(A, n, s, &p));
    CHECK_OK(vmm_check(A));
    if (p)
        vmm_test_fill(p, n, seed, 4096);
    return p;
}

static void release(void *p)
{
    CHECK_OK(vmm_free(A, p));
    CHECK_OK(vmm_check(A));
}

/* Small-pool pages idle after a burst move to the large pool instead of new handles. */
static void small_to_large(void)
{
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:true", &A));
    if (!A)
        return;
    enum { NS = 64 };
    char *s[NS];
    for (int i = 0; i < NS; i++)
        s[i] = alloc(MiB, NULL, (unsigned)i); /* 1 MiB: small pool, two per 2 MiB page */
    for (int i = 0; i < NS; i++)
        if (i % 16) {
            release(s[i]);
            s[i] = NULL;
        }
    vmm_stats st0 = stats();
    uint64_t create0 = calls(VMM_SIM_CALL_MEM_CREATE), unmap0 = calls(VMM_SIM_CALL_MEM_UNMAP);
    CHECK_EQ(st0.reserved_bytes[VMM_POOL_SMALL].current, 64 * MiB);
    /* the small pool holds 60 MiB free in whole pages: a 48 MiB tensor takes 24 of them */
    char *big = alloc(48 * MiB, NULL, 99);
    vmm_stats st1 = stats();
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_CREATE), create0);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_UNMAP) - unmap0, 24);
    CHECK_EQ(st1.num_device_alloc, st0.num_device_alloc);
    CHECK_EQ(st1.num_pages_remapped - st0.num_pages_remapped, 24);
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_ALL].peak, 64 * MiB);
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_ALL].current, 64 * MiB);
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_LARGE].current, 48 * MiB);
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_SMALL].current, 16 * MiB);
    CHECK(vmm_test_intact(big, 48 * MiB, 99, 4096));
    for (int i = 0; i < NS; i++)
        if (s[i]) {
            CHECK(vmm_test_intact(s[i], MiB, (unsigned)i, 4096));
            release(s[i]);
        }
    release(big);
    no_sync_but(NULL);
    vmm_destroy(A);
    A = NULL;
}

/* Holes of the large pool feed a request none of them fits; below the high-water mark growth
 * creates handles and unmaps nothing. */
static void holes_and_mark(void)
{
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:true", &A));
    if (!A)
        return;
    char *x = alloc(32 * MiB, NULL, 1), *y = alloc(32 * MiB, NULL, 2);
    release(x);
    release(y);
    CHECK_OK(vmm_empty_cache(A));
    CHECK_OK(vmm_check(A));
    CHECK_EQ(stats().reserved_bytes[VMM_POOL_ALL].current, 0);
    CHECK_EQ(stats().reserved_bytes[VMM_POOL_ALL].peak, 64 * MiB);

    /* below the mark (64 MiB): plain growth */
    uint64_t create0 = calls(VMM_SIM_CALL_MEM_CREATE), unmap0 = calls(VMM_SIM_CALL_MEM_UNMAP);
    char *c = alloc(8 * MiB, NULL, 3), *d = alloc(8 * MiB, NULL, 4), *e = alloc(8 * MiB, NULL, 5);
    release(d);
    char *f = alloc(16 * MiB, NULL, 6); /* the 8 MiB hole does not fit it */
    char *g = alloc(24 * MiB, NULL, 7);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_CREATE) - create0, 32);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_UNMAP), unmap0);
    CHECK_EQ(stats().reserved_bytes[VMM_POOL_ALL].current, 64 * MiB);
    char *h = alloc(8 * MiB, NULL, 8); /* fills d's hole */
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_CREATE) - create0, 32);

    /* at the mark: c's hole (4 idle pages) is recycled, the rest is created */
    release(c);
    vmm_stats st0 = stats();
    char *i = alloc(16 * MiB, NULL, 9);
    vmm_stats st1 = stats();
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_CREATE) - create0, 36);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_UNMAP) - unmap0, 4);
    CHECK_EQ(st1.num_pages_remapped - st0.num_pages_remapped, 4);
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_ALL].current, 72 * MiB);
    CHECK_EQ(st1.reserved_bytes[VMM_POOL_ALL].peak, 72 * MiB);
    CHECK(vmm_test_intact(e, 8 * MiB, 5, 4096));
    CHECK(vmm_test_intact(f, 16 * MiB, 6, 4096));
    CHECK(vmm_test_intact(g, 24 * MiB, 7, 4096));
    CHECK(vmm_test_intact(h, 8 * MiB, 8, 4096));
    CHECK(vmm_test_intact(i, 16 * MiB, 9, 4096));
    release(e);
    release(f);
    release(g);
    release(h);
    release(i);
    no_sync_but(NULL);
    vmm_destroy(A);
    A = NULL;
}

/* Pages freed behind a launch still running are not taken (growth creates instead, without
 * waiting: the launch only ends when the test lets it); once the launch is done they are. */
static void pending_work(void)
{
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:true", &A));
    if (!A)
        return;
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(A, &s));
    char *x = alloc(16 * MiB, s, 1);
    char *pin = alloc(2 * MiB, s, 2); /* keeps x's hole from touching unmapped space */
    vmm_test_gate k = {0, 0};
    CHECK_OK(vmm_sim_launch(A, s, vmm_test_gate_wait, &k));
    release(x); /* the kernel may still use it: stream order */
    uint64_t create0 = calls(VMM_SIM_CALL_MEM_CREATE), unmap0 = calls(VMM_SIM_CALL_MEM_UNMAP);
    unsigned long long t0 = vmm_test_now_ns();
    char *y = NULL;
    CHECK_OK(vmm_malloc(A, 32 * MiB, s, (void **)&y));
    unsigned long long dt = vmm_test_now_ns() - t0;
    CHECK(!atomic_load(&k.done)); /* malloc did not wait for the kernel */
    CHECK(dt < 200ull * 1000 * 1000);
    CHECK_OK(vmm_check(A));
    if (y)
        vmm_test_fill(y, 32 * MiB, 3, 4096);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_CREATE) - create0, 16);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_UNMAP), unmap0);
    atomic_store(&k.open, 1);
    vmm_sim_counters own;
    CHECK_OK(vmm_sim_synchronize(A)); /* the test waits for its kernel, the allocator never does */
    CHECK(atomic_load(&k.done));
    CHECK_OK(vmm_sim_get_counters(A, &own));
    /* now x's pages are idle: a request past the mark (and too big for x's hole) takes them */
    char *z = alloc(24 * MiB, s, 4);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_CREATE) - create0, 20);
    CHECK_EQ(calls(VMM_SIM_CALL_MEM_UNMAP) - unmap0, 8);
    CHECK_EQ(stats().reserved_bytes[VMM_POOL_ALL].peak, 58 * MiB);
    CHECK(vmm_test_intact(pin, 2 * MiB, 2, 4096));
    CHECK(vmm_test_intact(y, 32 * MiB, 3, 4096));
    CHECK(vmm_test_intact(z, 24 * MiB, 4, 4096));
    release(pin);
    release(y);
    release(z);
    no_sync_but(&own);
    vmm_destroy(A);
    A = NULL;
}

int main(void)
{
    small_to_large();
    holes_and_mark();
    pending_work();
    TEST_DONE();
}
