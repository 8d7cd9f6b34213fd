// ctest-labels: unit
/* Fragmentation: the same trace OOMs in classic mode and succeeds in expandable mode, where free
 * pages move to where the request goes; data of live blocks stays intact. */
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)
enum { N = 150 };

/* 150 x 6 MiB, free two of every three, then ask for 600 MiB on a 1 GiB device. */
static int run(const char *conf, vmm_stats *st)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    if (!a)
        return -1;
    char *p[N];
    for (int i = 0; i < N; i++) {
        CHECK_OK(vmm_malloc(a, 6 * MiB, NULL, (void **)&p[i]));
        vmm_test_fill(p[i], 6 * MiB, (unsigned)i, 65536);
    }
    for (int i = 0; i < N; i++)
        if (i % 3 != 1) {
            CHECK_OK(vmm_free(a, p[i]));
            p[i] = NULL;
        }
    CHECK_OK(vmm_check(a));
    char *big = NULL;
    int rc = vmm_malloc(a, 600 * MiB, NULL, (void **)&big);
    CHECK_OK(vmm_check(a));
    if (rc == VMM_OK) {
        for (size_t off = 0; off < 600 * MiB; off += 65536)
            big[off] = 0x77;
        CHECK_OK(vmm_free(a, big));
    } else {
        CHECK(strstr(vmm_last_error(), "Tried to allocate 600.00 MiB") != NULL);
        CHECK(strstr(vmm_last_error(), "reserved but unallocated") != NULL);
    }
    for (int i = 0; i < N; i++)
        if (p[i]) {
            CHECK(vmm_test_intact(p[i], 6 * MiB, (unsigned)i, 65536));
            CHECK_OK(vmm_free(a, p[i]));
        }
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_get_stats(a, st));
    vmm_destroy(a);
    return rc;
}

int main(void)
{
    vmm_stats cs, es;
    int crc = run("driver:sim,sim_capacity:1G,sim_backed:true,expandable_segments:false", &cs);
    CHECK_EQ(crc, VMM_ENOMEM);
    CHECK_EQ(cs.num_ooms, 1);
    CHECK_EQ(cs.num_sync_all_streams, 1);
    int erc = run("driver:sim,sim_capacity:1G,sim_backed:true", &es);
    CHECK_EQ(erc, VMM_OK);
    CHECK_EQ(es.num_ooms, 0);
    CHECK_EQ(es.num_sync_all_streams, 0);
    CHECK(es.num_pages_remapped > 0);
    CHECK(es.num_pages_unmapped > 0);
    CHECK(es.reserved_bytes[0].peak <= (int64_t)(1024 * MiB));
    printf("classic: OOM; expandable: ok, %lld pages remapped, %lld event waits, peak reserved %lld MiB\n",
           (long long)es.num_pages_remapped, (long long)es.num_event_waits,
           (long long)(es.reserved_bytes[0].peak >> 20));
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes + g.live_handles + g.mapped_bytes + g.reserved_va_bytes, 0);
    TEST_DONE();
}
