// ctest-labels: unit
// ctest-timeout: 300
/* OOM recovery with fault injection on every driver call kind: each failing call fails cleanly
 * (a status code, vmm_check passes), and a retry works. Nothing leaks. */
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)
enum { SLOTS = 12 };

static void noop(void *arg) { (void)arg; }

/* A workload that touches every path: growth, reuse, record_stream, pressure remapping,
 * empty_cache. Returns the number of calls that failed. */
static int workload(vmm_allocator *a, vmm_stream s, int strict)
{
    void *p[SLOTS] = {0};
    int fails = 0;
    static const size_t sizes[SLOTS] = {1000, 3 * MiB, 700 * 1024, 9 * MiB, 512, 5 * MiB,
                                        20 * MiB, 1 << 16, 2 * MiB, 11 * MiB, 1, 4 * MiB};
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < SLOTS; i++) {
            int rc = vmm_malloc(a, sizes[i] * (size_t)(round + 1), i % 2 ? s : NULL, &p[i]);
            if (rc) {
                fails++;
                p[i] = NULL;
                CHECK(rc == VMM_ENOMEM || rc == VMM_EDRIVER || rc == VMM_EHOSTMEM);
                CHECK(!strict);
            }
            if (p[i] && i % 3 == 0) {
                rc = vmm_record_stream(a, p[i], i % 2 ? NULL : s);
                CHECK_OK(rc);
                if (vmm_sim_launch(a, i % 2 ? NULL : s, noop, NULL))
                    fails++;
            }
            CHECK_OK(vmm_check(a));
        }
        for (int i = 0; i < SLOTS; i += 2) {
            int rc = vmm_free(a, p[i]);
            if (rc) {
                fails++;
                CHECK(rc == VMM_EDRIVER || rc == VMM_EHOSTMEM);
                CHECK(!strict);
                rc = vmm_free(a, p[i]); /* a retry works */
                CHECK_OK(rc);
            }
            p[i] = NULL;
            CHECK_OK(vmm_check(a));
        }
        if (round == 1) {
            /* pressure: the device is 96 MiB; this needs pages from free blocks */
            void *big = NULL;
            int rc = vmm_malloc(a, 40 * MiB, s, &big);
            if (rc) {
                fails++;
                CHECK(!strict || rc == VMM_ENOMEM);
            }
            CHECK_OK(vmm_check(a));
            CHECK_OK(vmm_free(a, big));
        }
        if (vmm_empty_cache(a))
            fails++;
        CHECK_OK(vmm_check(a));
        for (int i = 1; i < SLOTS; i += 2) {
            if (vmm_free(a, p[i])) {
                fails++;
                CHECK_OK(vmm_free(a, p[i])); /* a retry works */
            }
            p[i] = NULL;
        }
    }
    return fails;
}

int main(void)
{
    int total_fail_seen = 0;
    for (int kind = 0; kind < VMM_SIM_CALL_COUNT; kind++) {
        for (unsigned nth = 1; nth <= 4; nth++) {
            vmm_allocator *a = NULL;
            CHECK_OK(vmm_create("driver:sim,sim_capacity:96M,sim_backed:true", &a));
            if (!a)
                TEST_DONE();
            vmm_stream s = NULL;
            CHECK_OK(vmm_sim_stream_create(a, &s));
            CHECK_OK(vmm_sim_fail_nth(a, kind, nth));
            total_fail_seen += workload(a, s, 0);
            vmm_sim_counters c;
            CHECK_OK(vmm_sim_get_counters(a, &c));
            /* after the injected failure everything works again */
            CHECK_OK(vmm_sim_fail_nth(a, kind, 0));
            void *p = NULL;
            CHECK_OK(vmm_malloc(a, 8 * MiB, s, &p));
            CHECK_OK(vmm_free(a, p));
            CHECK_OK(vmm_check(a));
            vmm_destroy(a);
        }
    }
    /* random failures on every kind at once */
    for (unsigned seed = 1; seed <= 20; seed++) {
        vmm_allocator *a = NULL;
        CHECK_OK(vmm_create("driver:sim,sim_capacity:96M,sim_backed:true", &a));
        if (!a)
            break;
        vmm_stream s = NULL;
        CHECK_OK(vmm_sim_stream_create(a, &s));
        CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_MEM_CREATE, 0.05, seed));
        total_fail_seen += workload(a, s, 0);
        CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_MEM_CREATE, 0.0, seed));
        vmm_destroy(a);
    }
    printf("%d failed call(s) seen, all clean\n", total_fail_seen);
    CHECK(total_fail_seen > 0);
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes + g.live_handles + g.mapped_bytes + g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_events + g.live_streams + g.live_classic_allocs, 0);
    TEST_DONE();
}
