/* Simulated driver counters, modeled driver time, fault injection (nth and seeded random, from the
 * API and from the options) and leak accounting at close. */
// ctest-labels: unit
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

static vmm_driver *open_opts(const vmm_sim_options *o)
{
    vmm_driver *d = NULL;
    CHECK_EQ(vmm_driver_sim_open(o, &d), VMM_DRV_SUCCESS);
    return d;
}

static vmm_driver *open_small(void)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.capacity = 64 * MiB;
    o.backed = 0;
    return open_opts(&o);
}

static vmm_sim_counters counters(vmm_driver *d)
{
    vmm_sim_counters c;
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    return c;
}

static void noop(void *arg) { (void)arg; }

static void test_counters_and_time(void)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.capacity = 64 * MiB;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        o.cost_ns[k] = 1000u * (unsigned)(k + 1); /* distinct, so a wrong kind shows */
    vmm_driver *d = open_opts(&o);
    const vmm_driver_ops *op = d->ops;
    uintptr_t va = 0;
    vmm_phys h = 0;
    vmm_event e = NULL;
    CHECK_EQ(op->va_reserve(d, 4 * MiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h), VMM_DRV_INVALID_VALUE); /* a failed call counts */
    CHECK_EQ(op->set_access(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_create(d, &e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_query(d, e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_destroy(d, e), VMM_DRV_SUCCESS);

    vmm_sim_counters c = counters(d);
    uint64_t expect_time = 0, total_calls = 0;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++) {
        expect_time += c.calls[k] * o.cost_ns[k];
        total_calls += c.calls[k];
    }
    CHECK_EQ(total_calls, 11);
    CHECK_EQ(c.calls[VMM_SIM_CALL_MEM_MAP], 2);
    CHECK_EQ(c.failures[VMM_SIM_CALL_MEM_MAP], 1);
    CHECK_EQ(c.calls[VMM_SIM_CALL_EVENT_QUERY], 1);
    CHECK_EQ(c.failures[VMM_SIM_CALL_EVENT_QUERY], 0);
    CHECK_EQ(c.driver_time_ns, expect_time);
    CHECK_EQ(c.driver_time_ns, 1000u * ((VMM_SIM_CALL_VA_RESERVE + 1) + (VMM_SIM_CALL_MEM_CREATE + 1) +
                                        2 * (VMM_SIM_CALL_MEM_MAP + 1) + (VMM_SIM_CALL_SET_ACCESS + 1) +
                                        (VMM_SIM_CALL_EVENT_CREATE + 1) + (VMM_SIM_CALL_EVENT_QUERY + 1) +
                                        (VMM_SIM_CALL_MEM_UNMAP + 1) + (VMM_SIM_CALL_MEM_RELEASE + 1) +
                                        (VMM_SIM_CALL_VA_FREE + 1) + (VMM_SIM_CALL_EVENT_DESTROY + 1)));
    CHECK_EQ(c.capacity_bytes, 64 * MiB);

    /* NOT_READY is an answer, not a failure */
    void *s = NULL;
    CHECK_EQ(op->stream_create(d, &s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_create(d, &e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_sync(d, e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_destroy(d, e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, s), VMM_DRV_SUCCESS);
    c = counters(d);
    CHECK_EQ(c.event_syncs, 1);
    CHECK_EQ(c.failures[VMM_SIM_CALL_EVENT_SYNC], 0);
    op->close(d);

    /* cost model off: no driver time, calls still counted */
    vmm_sim_default_options(&o);
    o.cost_model = 0;
    d = open_opts(&o);
    CHECK_EQ(d->ops->device_sync(d), VMM_DRV_SUCCESS);
    c = counters(d);
    CHECK_EQ(c.calls[VMM_SIM_CALL_DEVICE_SYNC], 1);
    CHECK_EQ(c.device_syncs, 1);
    CHECK_EQ(c.driver_time_ns, 0);
    d->ops->close(d);

    /* the default model: one mem_create is 193 us */
    d = open_small();
    CHECK_EQ(d->ops->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(counters(d).driver_time_ns, 193000);
    CHECK_EQ(d->ops->mem_release(d, h), VMM_DRV_SUCCESS);
    d->ops->close(d);
}

static void test_fail_nth(void)
{
    vmm_driver *d = open_small();
    const vmm_driver_ops *op = d->ops;
    vmm_phys h[4] = {0};
    uintptr_t va = 0;

    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_MEM_CREATE, 3), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h[0]), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h[1]), VMM_DRV_SUCCESS);
    vmm_sim_counters before = counters(d);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h[2]), VMM_DRV_OUT_OF_MEMORY); /* the 3rd */
    vmm_sim_counters after = counters(d);
    CHECK_EQ(after.phys_bytes, before.phys_bytes); /* no state changed */
    CHECK_EQ(after.live_handles, before.live_handles);
    CHECK_EQ(after.failures[VMM_SIM_CALL_MEM_CREATE], 1);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h[2]), VMM_DRV_SUCCESS); /* once only */
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h[3]), VMM_DRV_SUCCESS);

    /* other kinds: UNKNOWN, and the map did not happen */
    CHECK_EQ(op->va_reserve(d, 8 * MiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_MEM_MAP, 1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h[0]), VMM_DRV_UNKNOWN);
    vmm_phys got = 0;
    CHECK_EQ(op->lookup_mapping(d, va, &got), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(counters(d).mapped_bytes, 0);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h[0]), VMM_DRV_SUCCESS);

    /* cancel with 0 */
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_MEM_MAP, 1), VMM_DRV_SUCCESS);
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_MEM_MAP, 0), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va + 2 * MiB, 2 * MiB, 0, h[1]), VMM_DRV_SUCCESS);

    /* kind -1: counts the calls of every kind it covers; queries are not among them */
    vmm_device_info info;
    size_t fr, tot;
    CHECK_EQ(vmm_sim_driver_fail_nth(d, -1, 3), VMM_DRV_SUCCESS);
    CHECK_EQ(op->device_info(d, &info), VMM_DRV_SUCCESS);        /* not counted */
    CHECK_EQ(op->mem_get_info(d, &fr, &tot), VMM_DRV_SUCCESS);   /* not counted */
    CHECK_EQ(op->set_access(d, va, 4 * MiB), VMM_DRV_SUCCESS);    /* 1 */
    CHECK_EQ(op->device_sync(d), VMM_DRV_SUCCESS);                /* 2 */
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_UNKNOWN);     /* 3 */
    CHECK_EQ(op->lookup_mapping(d, va, &got), VMM_DRV_SUCCESS);   /* still mapped */
    CHECK_EQ(got, h[0]);
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, va + 2 * MiB, 2 * MiB), VMM_DRV_SUCCESS);

    /* explicitly named, even a teardown kind fails */
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_MEM_RELEASE, 1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h[0]), VMM_DRV_UNKNOWN);
    for (int i = 0; i < 4; i++)
        CHECK_EQ(op->mem_release(d, h[i]), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, 8 * MiB), VMM_DRV_SUCCESS);

    /* injected failures of other kinds: OOM for va_reserve and mem_alloc; a failed launch runs nothing */
    uintptr_t p = 0;
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_VA_RESERVE, 1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 0, &va), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_MEM_ALLOC, 1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_alloc(d, 100, &p), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_EVENT_RECORD, 1), VMM_DRV_SUCCESS);
    vmm_event e = NULL;
    CHECK_EQ(op->event_create(d, &e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, NULL, noop, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, NULL), VMM_DRV_UNKNOWN);
    CHECK_EQ(op->event_query(d, e), VMM_DRV_SUCCESS); /* still never recorded */
    CHECK_EQ(op->event_destroy(d, e), VMM_DRV_SUCCESS);

    /* bad arguments */
    CHECK_EQ(vmm_sim_driver_fail_nth(d, VMM_SIM_CALL_COUNT, 1), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(vmm_sim_driver_fail_nth(d, -2, 1), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(vmm_sim_driver_fail_random(d, 0, 1.5, 1), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(vmm_sim_driver_fail_random(d, 0, -0.1, 1), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(vmm_sim_driver_counters(d, NULL), VMM_DRV_INVALID_VALUE);
    vmm_driver not_sim = {d->ops, 0};
    vmm_sim_counters c;
    CHECK_EQ(vmm_sim_driver_counters(&not_sim, &c), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(vmm_sim_driver_fail_nth(&not_sim, 0, 1), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(vmm_sim_driver_fail_random(&not_sim, 0, 0.5, 1), VMM_DRV_NOT_SUPPORTED);

    c = counters(d);
    CHECK_EQ(c.phys_bytes + c.live_handles + c.mapped_bytes + c.reserved_va_bytes + c.live_events, 0);
    op->close(d);
}

enum { DRAWS = 400 };

/* Outcome bits of DRAWS mem_create+release pairs under random failure of mem_create. */
static void draw_pattern(vmm_driver *d, unsigned char out[DRAWS])
{
    for (int i = 0; i < DRAWS; i++) {
        vmm_phys h = 0;
        int r = d->ops->mem_create(d, 2 * MiB, &h);
        out[i] = r == VMM_DRV_SUCCESS;
        CHECK(r == VMM_DRV_SUCCESS || r == VMM_DRV_OUT_OF_MEMORY);
        if (r == VMM_DRV_SUCCESS)
            CHECK_EQ(d->ops->mem_release(d, h), VMM_DRV_SUCCESS);
    }
}

static void test_fail_random(void)
{
    unsigned char a[DRAWS], b[DRAWS], c[DRAWS];
    vmm_driver *d = open_small();
    CHECK_EQ(vmm_sim_driver_fail_random(d, VMM_SIM_CALL_MEM_CREATE, 0.25, 12345), VMM_DRV_SUCCESS);
    draw_pattern(d, a);
    CHECK_EQ(vmm_sim_driver_fail_random(d, VMM_SIM_CALL_MEM_CREATE, 0.25, 12345), VMM_DRV_SUCCESS);
    draw_pattern(d, b); /* reseeded: the same sequence again */
    CHECK(memcmp(a, b, DRAWS) == 0);
    int fails = 0;
    for (int i = 0; i < DRAWS; i++)
        fails += !a[i];
    CHECK(fails > DRAWS / 8 && fails < DRAWS * 3 / 8); /* ~100 of 400 at p = 0.25 */
    CHECK_EQ(counters(d).failures[VMM_SIM_CALL_MEM_CREATE], 2 * fails);
    CHECK_EQ(vmm_sim_driver_fail_random(d, VMM_SIM_CALL_MEM_CREATE, 0.25, 999), VMM_DRV_SUCCESS);
    draw_pattern(d, c); /* another seed, another sequence */
    CHECK(memcmp(a, c, DRAWS) != 0);
    CHECK_EQ(vmm_sim_driver_fail_random(d, VMM_SIM_CALL_MEM_CREATE, 0.0, 1), VMM_DRV_SUCCESS);
    draw_pattern(d, c); /* p = 0: off */
    int none = 1;
    for (int i = 0; i < DRAWS; i++)
        none &= c[i];
    CHECK(none);

    /* kind -1, p = 1: every covered kind fails, queries and teardown do not */
    vmm_phys h = 0;
    uintptr_t va = 0;
    vmm_device_info info;
    CHECK_EQ(d->ops->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(vmm_sim_driver_fail_random(d, -1, 1.0, 7), VMM_DRV_SUCCESS);
    CHECK_EQ(d->ops->va_reserve(d, 2 * MiB, 0, &va), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(d->ops->device_sync(d), VMM_DRV_UNKNOWN);
    CHECK_EQ(d->ops->launch_host(d, NULL, noop, NULL), VMM_DRV_UNKNOWN);
    CHECK_EQ(d->ops->device_info(d, &info), VMM_DRV_SUCCESS);
    CHECK_EQ(d->ops->mem_release(d, h), VMM_DRV_SUCCESS);
    CHECK_EQ(vmm_sim_driver_fail_random(d, -1, 0.0, 7), VMM_DRV_SUCCESS);
    CHECK_EQ(d->ops->device_sync(d), VMM_DRV_SUCCESS);
    d->ops->close(d);

    /* from the options at open: two devices with the same seed fail identically */
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.capacity = 64 * MiB;
    o.backed = 0;
    o.fail_kind = VMM_SIM_CALL_MEM_CREATE;
    o.fail_p = 0.25;
    o.fail_seed = 12345;
    d = open_opts(&o);
    draw_pattern(d, b);
    d->ops->close(d);
    d = open_opts(&o);
    draw_pattern(d, c);
    d->ops->close(d);
    CHECK(memcmp(b, c, DRAWS) == 0);
    CHECK(memcmp(a, b, DRAWS) == 0); /* same seed as the API path: same dice */
    o.fail_kind = -1;
    o.fail_p = 1.0;
    d = open_opts(&o);
    CHECK_EQ(d->ops->mem_create(d, 2 * MiB, &h), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(d->ops->mem_map(d, 0, 2 * MiB, 0, 1), VMM_DRV_UNKNOWN);
    d->ops->close(d);
}

/* A device closed with live resources frees them, yet they stay visible in vmm_sim_global_live.
 * Runs in a child (first, while single-threaded) so the leak does not outlive it. */
static int leak_child(void)
{
    int bad = 0;
    vmm_sim_counters g;
    vmm_driver *d = open_small();
    vmm_phys h = 0, h2 = 0;
    uintptr_t va = 0, p = 0;
    void *s = NULL;
    vmm_event e = NULL;
    /* h (4 MiB, two pages) mapped twice: close must free each multi-page mapping once */
    bad |= d->ops->va_reserve(d, 16 * MiB, 0, &va) | d->ops->mem_create(d, 4 * MiB, &h) |
           d->ops->mem_create(d, 2 * MiB, &h2) | d->ops->mem_map(d, va, 4 * MiB, 0, h) |
           d->ops->mem_map(d, va + 8 * MiB, 4 * MiB, 0, h) | d->ops->set_access(d, va, 4 * MiB) |
           d->ops->mem_map(d, va + 4 * MiB, 2 * MiB, 0, h2) | d->ops->mem_release(d, h2) |
           d->ops->mem_alloc(d, 1000, &p) | d->ops->stream_create(d, &s) | d->ops->event_create(d, &e) |
           d->ops->launch_host(d, s, noop, NULL) | d->ops->event_record(d, e, s);
    d->ops->close(d);
    vmm_sim_global_live(&g);
    bad |= g.phys_bytes != 6 * MiB + 1024;
    bad |= g.live_handles != 1;
    bad |= g.mapped_bytes != 10 * MiB;
    bad |= g.reserved_va_bytes != 16 * MiB;
    bad |= g.live_classic_allocs != 1;
    bad |= g.live_streams != 1;
    bad |= g.live_events != 1;
    /* a clean device after it adds nothing */
    d = open_small();
    bad |= d->ops->mem_create(d, 2 * MiB, &h) | d->ops->mem_release(d, h);
    d->ops->close(d);
    vmm_sim_global_live(&g);
    bad |= g.live_handles != 1 || g.phys_bytes != 6 * MiB + 1024;
    return bad ? 1 : 0;
}

int main(void)
{
    pid_t pid = fork();
    if (pid == 0)
        _exit(leak_child());
    int st = -1;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);

    test_counters_and_time();
    test_fail_nth();
    test_fail_random();

    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes + g.live_handles + g.mapped_bytes + g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_classic_allocs + g.live_streams + g.live_events, 0);
    TEST_DONE();
}
