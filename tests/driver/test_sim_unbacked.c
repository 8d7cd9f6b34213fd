/* Unbacked mode: a full 80 GiB device of 2 MiB handles, reserved, mapped and made accessible,
 * on a host with far less RAM. Only bookkeeping runs; resident memory stays small. */
// ctest-labels: unit
#include <stdio.h>
#include <stdlib.h>

#include "driver.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* Resident set size of this process in bytes, from /proc/self/statm. */
static size_t rss_bytes(void)
{
    unsigned long size = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f)
        return 0;
    if (fscanf(f, "%lu %lu", &size, &resident) != 2)
        resident = 0;
    fclose(f);
    return (size_t)resident * 4096u;
}

enum { MAX_RSS_GROWTH_MIB = 64 }; /* bookkeeping for 40960 pages is a few MiB; RAM-backed would be 80 GiB */

static void order_check(void *arg) { *(int *)arg += 1; }

int main(void)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.backed = 0; /* capacity stays at the 80 GiB default */
    vmm_driver *d = NULL;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_SUCCESS);
    const vmm_driver_ops *op = d->ops;
    const size_t gran = o.granularity, n = o.capacity / gran;
    CHECK_EQ(n, 40960);
    vmm_phys *h = calloc(n, sizeof *h);
    size_t rss0 = rss_bytes();

    uintptr_t va = 0;
    CHECK_EQ(op->va_reserve(d, o.capacity + 2 * gran, 0, &va), VMM_DRV_SUCCESS);
    size_t created = 0;
    for (size_t i = 0; i < n; i++) {
        if (op->mem_create(d, gran, &h[i]) != VMM_DRV_SUCCESS)
            break;
        created++;
        CHECK_EQ(op->mem_map(d, va + i * gran, gran, 0, h[i]), VMM_DRV_SUCCESS);
    }
    CHECK_EQ(created, n);
    CHECK_EQ(op->set_access(d, va, o.capacity), VMM_DRV_SUCCESS); /* one call over every mapping */
    vmm_phys extra = 0;
    uintptr_t p = 0;
    CHECK_EQ(op->mem_create(d, gran, &extra), VMM_DRV_OUT_OF_MEMORY); /* full */
    CHECK_EQ(op->mem_alloc(d, 1, &p), VMM_DRV_OUT_OF_MEMORY);
    size_t fr = 1, tot = 0;
    CHECK_EQ(op->mem_get_info(d, &fr, &tot), VMM_DRV_SUCCESS);
    CHECK_EQ(fr, 0);
    CHECK_EQ(tot, 80 * GiB);
    vmm_sim_counters c;
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    CHECK_EQ(c.phys_bytes, 80 * GiB);
    CHECK_EQ(c.mapped_bytes, 80 * GiB);
    CHECK_EQ(c.live_handles, n);
    size_t rss1 = rss_bytes();
    CHECK(rss1 < rss0 + (size_t)MAX_RSS_GROWTH_MIB * MiB);
    printf("80 GiB unbacked: rss %zu -> %zu KiB\n", rss0 >> 10, rss1 >> 10);

    vmm_phys got = 0;
    CHECK_EQ(op->lookup_mapping(d, va + 12345 * gran + 77, &got), VMM_DRV_SUCCESS);
    CHECK_EQ(got, h[12345]);
    CHECK_EQ(op->lookup_mapping(d, va + n * gran, &got), VMM_DRV_INVALID_VALUE);

    /* stream work on unbacked memory: validated and ordered, but touches nothing */
    int ran = 0;
    unsigned out = 0xffffffffu;
    CHECK_EQ(op->memset32(d, va + 40 * GiB, 7, 1u << 28, NULL), VMM_DRV_SUCCESS); /* 1 GiB */
    CHECK_EQ(op->memcpy_dtoh(d, &out, va, sizeof out, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, NULL, order_check, &ran), VMM_DRV_SUCCESS);
    CHECK_EQ(op->memset32(d, va + n * gran, 7, 1, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->stream_sync(d, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(ran, 1);
    CHECK_EQ(out, 0xffffffffu);
    CHECK(rss_bytes() < rss0 + (size_t)MAX_RSS_GROWTH_MIB * MiB);

    /* release first, unmap after: the memory returns at the unmap */
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(op->mem_release(d, h[i]), VMM_DRV_SUCCESS);
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    CHECK_EQ(c.live_handles, 0);
    CHECK_EQ(c.phys_bytes, 80 * GiB);
    for (size_t i = 0; i < n; i++)
        CHECK_EQ(op->mem_unmap(d, va + i * gran, gran), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, o.capacity + 2 * gran), VMM_DRV_SUCCESS);
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    CHECK_EQ(c.phys_bytes + c.mapped_bytes + c.reserved_va_bytes, 0);
    CHECK_EQ(c.calls[VMM_SIM_CALL_MEM_CREATE], n + 1);
    /* the whole device is free again: one 80 GiB handle fits */
    CHECK_EQ(op->mem_create(d, o.capacity, &extra), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, extra), VMM_DRV_SUCCESS);
    op->close(d);
    free(h);
    vmm_sim_global_live(&c);
    CHECK_EQ(c.phys_bytes + c.live_handles + c.mapped_bytes + c.reserved_va_bytes, 0);
    TEST_DONE();
}
