// ctest-labels: unit
/* Fused buffers: members aligned, in order, inside one block, disjoint (checked by writing
 * through backed memory); one allocation in the stats; freed together through the first pointer
 * only; bad arguments leave the allocator as it was; a group live at destroy does not leak. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"

#define MiB ((size_t)1 << 20)

static void check_layout(vmm_allocator *a, const size_t *sizes, size_t n, void **ptrs)
{
    uintptr_t base = (uintptr_t)ptrs[0];
    size_t usable = vmm_usable_size(a, ptrs[0]);
    CHECK(usable > 0);
    for (size_t i = 0; i < n; i++) {
        uintptr_t p = (uintptr_t)ptrs[i];
        CHECK(p % VMM_GROUP_ALIGN == 0);
        CHECK(p + sizes[i] <= base + usable);
        if (i) {
            uintptr_t end = (uintptr_t)ptrs[i - 1] + sizes[i - 1];
            CHECK(p >= end);                     /* after the previous member */
            CHECK(p - end < VMM_GROUP_ALIGN);    /* with padding only */
        }
        if (i)
            CHECK_EQ(vmm_usable_size(a, ptrs[i]), 0); /* not a block of its own */
    }
}

int main(void)
{
    /* records from libc malloc, where the leak checker of the address sanitizer sees them */
    setenv("VMM_META_NO_JEMALLOC", "1", 1);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:512M,sim_backed:true", &a));
    if (!a)
        TEST_DONE();
    vmm_stats st0, st;
    CHECK_OK(vmm_get_stats(a, &st0));

    size_t sizes[5] = {1000, 1, 4096, 513, 3 * MiB + 7};
    void *ptrs[5] = {0};
    CHECK_OK(vmm_malloc_group(a, sizes, 5, NULL, ptrs));
    check_layout(a, sizes, 5, ptrs);
    /* members are disjoint: fill each with its own byte, then read all back */
    for (int i = 0; i < 5; i++)
        memset(ptrs[i], 0x10 + i, sizes[i]);
    for (int i = 0; i < 5; i++) {
        const unsigned char *c = ptrs[i];
        size_t bad = 0;
        for (size_t k = 0; k < sizes[i]; k++)
            bad += c[k] != (unsigned char)(0x10 + i);
        CHECK_EQ(bad, 0);
    }
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK_EQ(st.allocation[VMM_POOL_ALL].current, st0.allocation[VMM_POOL_ALL].current + 1);
    CHECK_EQ(st.allocated_bytes[VMM_POOL_ALL].current, (int64_t)vmm_usable_size(a, ptrs[0]));
    CHECK_OK(vmm_check(a));

    /* another member's pointer is not freeable, and the failure changes nothing */
    for (int i = 1; i < 5; i++)
        CHECK_EQ(vmm_free(a, ptrs[i]), VMM_EBADPTR);
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK_EQ(st.allocation[VMM_POOL_ALL].current, 1);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, ptrs[0]));
    CHECK_EQ(vmm_free(a, ptrs[0]), VMM_EBADPTR); /* freed together: once */
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK_EQ(st.allocation[VMM_POOL_ALL].current, 0);
    CHECK_EQ(st.allocated_bytes[VMM_POOL_ALL].current, 0);
    CHECK_OK(vmm_check(a));

    /* the freed block is reused by a plain malloc, which is no group: members don't linger */
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &p));
    CHECK_OK(vmm_free(a, p));

    /* one member: same as a malloc of that size */
    size_t one = 12345;
    void *q = NULL;
    CHECK_OK(vmm_malloc_group(a, &one, 1, NULL, &q));
    CHECK(q != NULL && (uintptr_t)q % VMM_GROUP_ALIGN == 0);
    CHECK(vmm_usable_size(a, q) >= one);

    /* bad arguments: EINVAL, every pointer NULL, nothing allocated */
    void *bad[3] = {(void *)1, (void *)1, (void *)1};
    size_t zero[3] = {100, 0, 100};
    CHECK_EQ(vmm_malloc_group(a, zero, 3, NULL, bad), VMM_EINVAL);
    CHECK(!bad[0] && !bad[1] && !bad[2]);
    CHECK_EQ(vmm_malloc_group(a, sizes, 0, NULL, bad), VMM_EINVAL);
    CHECK_EQ(vmm_malloc_group(a, NULL, 3, NULL, bad), VMM_EINVAL);
    CHECK_EQ(vmm_malloc_group(a, sizes, 3, NULL, NULL), VMM_EINVAL);
    CHECK_EQ(vmm_malloc_group(NULL, sizes, 3, NULL, bad), VMM_EINVAL);
    size_t huge[2] = {(size_t)1 << 61, (size_t)1 << 61};
    bad[0] = bad[1] = (void *)1;
    CHECK_EQ(vmm_malloc_group(a, huge, 2, NULL, bad), VMM_EINVAL);
    CHECK(!bad[0] && !bad[1]);
    size_t toobig[2] = {400 * MiB, 400 * MiB};
    CHECK_EQ(vmm_malloc_group(a, toobig, 2, NULL, bad), VMM_ENOMEM);
    CHECK(!bad[0] && !bad[1]);
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK_EQ(st.allocation[VMM_POOL_ALL].current, 1);
    CHECK_OK(vmm_check(a));

    /* groups left live at destroy are reported and their records freed (the sanitizers check) */
    size_t two[2] = {600, 700};
    void *g2[2];
    CHECK_OK(vmm_malloc_group(a, two, 2, NULL, g2));
    check_layout(a, two, 2, g2);
    vmm_destroy(a);
    TEST_DONE();
}
