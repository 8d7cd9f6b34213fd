// ctest-labels: unit
/* Stream-ordered reuse with real delays: a block used by a slow launch on another stream is never
 * handed out before that launch ends, and malloc does not block meanwhile. Also remapping under
 * pressure waits only when nothing else can serve the request. */
#include <stdatomic.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

typedef struct slow {
    atomic_int done;
    unsigned ms;
    char *mem;
    size_t n;
} slow;

static void slow_kernel(void *arg)
{
    slow *s = arg;
    vmm_test_sleep_ms(s->ms);
    if (s->mem)
        memset(s->mem, 0x5a, s->n); /* the "kernel" still writes its buffer at the end */
    atomic_store(&s->done, 1);
}

int main(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_backed:true", &a));
    if (!a)
        TEST_DONE();
    vmm_stream s1 = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));

    /* block of s1 used by a slow kernel on s2, freed at once */
    char *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s1, (void **)&p));
    slow k = {0, 300, p, 4 * MiB};
    CHECK_OK(vmm_record_stream(a, p, s2));
    CHECK_OK(vmm_sim_launch(a, s2, slow_kernel, &k));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
    unsigned long long t0 = vmm_test_now_ns();
    char *q[8];
    for (int i = 0; i < 8; i++) {
        CHECK_OK(vmm_malloc(a, 4 * MiB, s1, (void **)&q[i]));
        CHECK(q[i] != p || atomic_load(&k.done));
        CHECK_OK(vmm_check(a));
    }
    unsigned long long dt = vmm_test_now_ns() - t0;
    CHECK(dt < 150ull * 1000000ull); /* malloc did not wait for the 300 ms kernel */
    CHECK(!atomic_load(&k.done));
    for (int i = 0; i < 8; i++)
        CHECK_OK(vmm_free(a, q[i]));
    for (int w = 0; w < 1000 && !atomic_load(&k.done); w++)
        vmm_test_sleep_ms(10);
    CHECK(atomic_load(&k.done));
    char *r = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s1, (void **)&r)); /* events done: the block is back */
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, r));
    vmm_stats st;
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK_EQ(st.num_event_waits, 0);

    /* a block freed on s1 is reused on s1 at once (stream order), not on s2 */
    char *x = NULL, *y = NULL;
    CHECK_OK(vmm_malloc(a, 6 * MiB, s1, (void **)&x));
    CHECK_OK(vmm_free(a, x));
    CHECK_OK(vmm_malloc(a, 6 * MiB, s1, (void **)&y));
    CHECK(x == y);
    CHECK_OK(vmm_free(a, y));
    CHECK_OK(vmm_malloc(a, 6 * MiB, s2, (void **)&y));
    CHECK(x != y);
    CHECK_OK(vmm_free(a, y));

    /* pressure: s1 freed most of the device while a slow kernel on s1 still runs; s2 needs it.
     * The pages are unmapped only once proven idle; the allocator waits (counted) only because
     * nothing else can serve the request. */
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a));
    char *big = NULL;
    CHECK_OK(vmm_malloc(a, 700 * MiB, s1, (void **)&big));
    slow k2 = {0, 200, big + 699 * MiB, MiB}; /* touches the tail at the end */
    CHECK_OK(vmm_sim_launch(a, s1, slow_kernel, &k2));
    CHECK_OK(vmm_free(a, big));
    char *other = NULL;
    CHECK_OK(vmm_malloc(a, 600 * MiB, s2, (void **)&other));
    CHECK(atomic_load(&k2.done)); /* got the pages only after the kernel using them ended */
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK(st.num_event_waits >= 1);
    CHECK(st.num_pages_remapped >= 250);
    for (size_t off = 0; off < 600 * MiB; off += 64 * 1024)
        other[off] = 1; /* mapped and writable */
    CHECK_OK(vmm_free(a, other));
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.device_syncs, 1); /* the explicit vmm_sim_synchronize only */
    CHECK_EQ(c.stream_syncs, 0);
    CHECK_OK(vmm_sim_stream_destroy(a, s2));
    vmm_destroy(a);
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes + g.live_handles + g.mapped_bytes + g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_events + g.live_streams, 0);
    TEST_DONE();
}
