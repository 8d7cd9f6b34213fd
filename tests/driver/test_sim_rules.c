/* The simulated driver's memory rules: each accepted case and each rejected one, with the exact
 * CUDA error kind, and the bookkeeping (capacity, live counters) each leaves behind. */
// ctest-labels: unit
#include <signal.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

static vmm_driver *open_sim(size_t capacity, int backed, int vmm)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.capacity = capacity;
    o.backed = backed;
    o.vmm_supported = vmm;
    vmm_driver *d = NULL;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_SUCCESS);
    return d;
}

static vmm_sim_counters counters(vmm_driver *d)
{
    vmm_sim_counters c;
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    return c;
}

/* Releasing a handle that is not live is undefined in CUDA ("If handle is not a valid handle the
 * behavior is undefined", cuMemRelease): the sim aborts, naming the call. Seen from a forked child
 * (the child only releases: no stream work, so the worker threads it lacks are not missed). */
static void check_release_aborts(vmm_driver *d, vmm_phys h)
{
    int fds[2];
    CHECK_EQ(pipe(fds), 0);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fds[1], 2);
        close(fds[0]);
        d->ops->mem_release(d, h);
        _exit(0); /* returned: not what we want */
    }
    close(fds[1]);
    char msg[512] = {0};
    size_t got = 0;
    ssize_t n;
    while (got < sizeof msg - 1 && (n = read(fds[0], msg + got, sizeof msg - 1 - got)) > 0)
        got += (size_t)n;
    close(fds[0]);
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT);
    CHECK(strstr(msg, "mem_release") != NULL);
    CHECK(strstr(msg, "If handle is not a valid handle the behavior is undefined") != NULL);
}

static void test_defaults_and_open(void)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    CHECK_EQ(o.capacity, 80 * GiB);
    CHECK_EQ(o.granularity, 2 * MiB);
    CHECK_EQ(o.backed, 1);
    CHECK_EQ(o.vmm_supported, 1);
    CHECK_EQ(o.cost_model, 1);
    CHECK_EQ(o.fail_kind, -2);
    CHECK_EQ(o.cost_ns[VMM_SIM_CALL_MEM_CREATE], 193000);
    CHECK_EQ(o.cost_ns[VMM_SIM_CALL_MEM_MAP], 1450);
    CHECK_EQ(o.cost_ns[VMM_SIM_CALL_SET_ACCESS], 36000);
    CHECK_EQ(o.cost_ns[VMM_SIM_CALL_MEM_UNMAP], 25600);
    CHECK_EQ(o.cost_ns[VMM_SIM_CALL_VA_RESERVE], 19000);
    CHECK_EQ(o.cost_ns[VMM_SIM_CALL_MEM_ALLOC], 50000);
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        CHECK(o.cost_ns[k] > 0);

    CHECK(strcmp(vmm_sim_call_name(VMM_SIM_CALL_MEM_MAP), "mem_map") == 0);
    CHECK(strcmp(vmm_sim_call_name(VMM_SIM_CALL_MEMCPY), "memcpy") == 0);
    CHECK(vmm_sim_call_name(-1) == NULL);
    CHECK(vmm_sim_call_name(VMM_SIM_CALL_COUNT) == NULL);

    /* bad options: a clear error and no device */
    vmm_driver *d = (vmm_driver *)&o;
    o.granularity = 3 * MiB;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_INVALID_VALUE);
    CHECK(d == NULL);
    CHECK(strstr(vmm_last_error(), "granularity") != NULL);
    o.granularity = 1024; /* below the host page */
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_INVALID_VALUE);
    vmm_sim_default_options(&o);
    o.capacity = 0;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_INVALID_VALUE);
    vmm_sim_default_options(&o);
    o.fail_kind = VMM_SIM_CALL_COUNT;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_INVALID_VALUE);
    o.fail_kind = VMM_SIM_CALL_MEM_MAP;
    o.fail_p = 1.5;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(vmm_driver_sim_open(&o, NULL), VMM_DRV_INVALID_VALUE);

    /* NULL options: the defaults */
    CHECK_EQ(vmm_driver_sim_open(NULL, &d), VMM_DRV_SUCCESS);
    vmm_device_info info;
    CHECK_EQ(d->ops->device_info(d, &info), VMM_DRV_SUCCESS);
    CHECK(d->is_sim);
    CHECK(strcmp(d->ops->name, "sim") == 0);
    CHECK_EQ(info.total_bytes, 80 * GiB);
    CHECK_EQ(info.granularity, 2 * MiB);
    CHECK_EQ(info.vmm_supported, 1);
    CHECK(strcmp(info.name, "sim") == 0);
    CHECK_EQ(d->ops->device_info(d, NULL), VMM_DRV_INVALID_VALUE);
    size_t fr = 0, tot = 0;
    CHECK_EQ(d->ops->mem_get_info(d, &fr, &tot), VMM_DRV_SUCCESS);
    CHECK_EQ(fr, 80 * GiB);
    CHECK_EQ(tot, 80 * GiB);
    d->ops->close(d);

    /* the contract's entry opens the kind it is given; another kind is refused, with a reason */
    vmm_sim_default_options(&o);
    o.capacity = 4 * GiB;
    char msg[128] = "x";
    CHECK_EQ(vmm_driver_open(VMM_DRIVER_SIM, 0, &o, &d, msg, sizeof msg), VMM_DRV_SUCCESS);
    CHECK(d->is_sim);
    CHECK_EQ(d->ops->device_info(d, &info), VMM_DRV_SUCCESS);
    CHECK_EQ(info.total_bytes, 4 * GiB);
    CHECK(msg[0] == '\0');
    d->ops->close(d);
    o.granularity = 3 * MiB;
    CHECK_EQ(vmm_driver_open(VMM_DRIVER_SIM, 0, &o, &d, NULL, 0), VMM_DRV_INVALID_VALUE);
    d = (vmm_driver *)&o;
    CHECK_EQ(vmm_driver_open(7, 0, &o, &d, msg, sizeof msg), VMM_DRV_INVALID_VALUE);
    CHECK(d == NULL);
    CHECK(strstr(msg, "kind 7") != NULL);
}

static void test_va_rules(void)
{
    vmm_driver *d = open_sim(1 * GiB, 1, 1);
    const vmm_driver_ops *op = d->ops;
    uintptr_t va = 0;

    CHECK_EQ(op->va_reserve(d, 0, 0, &va), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->va_reserve(d, 3 * MiB, 0, &va), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 3 * MiB, &va), VMM_DRV_INVALID_VALUE); /* not a power of two */
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 1 * MiB, &va), VMM_DRV_INVALID_VALUE); /* below granularity */
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 0, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(counters(d).reserved_va_bytes, 0);

    /* VA is not device memory: far more than capacity can be reserved */
    CHECK_EQ(op->va_reserve(d, 64 * GiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(va % (2 * MiB), 0);
    CHECK_EQ(counters(d).reserved_va_bytes, 64 * GiB);
    uintptr_t va2 = 0;
    CHECK_EQ(op->va_reserve(d, 4 * MiB, 64 * MiB, &va2), VMM_DRV_SUCCESS);
    CHECK_EQ(va2 % (64 * MiB), 0);
    CHECK(va2 + 4 * MiB <= va || va2 >= va + 64 * GiB);

    /* va_free must name exactly one reservation */
    CHECK_EQ(op->va_free(d, va, 32 * GiB), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->va_free(d, va + 2 * MiB, 64 * GiB - 2 * MiB), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->va_free(d, 12345, 2 * MiB), VMM_DRV_INVALID_VALUE);

    /* a reservation with a mapping cannot be freed */
    vmm_phys h = 0;
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va2, 2 * MiB, 0, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va2, 4 * MiB), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_unmap(d, va2, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va2, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va2, 4 * MiB), VMM_DRV_INVALID_VALUE); /* twice */
    CHECK_EQ(op->va_free(d, va, 64 * GiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h), VMM_DRV_SUCCESS);
    vmm_sim_counters c = counters(d);
    CHECK_EQ(c.reserved_va_bytes, 0);
    CHECK_EQ(c.failures[VMM_SIM_CALL_VA_RESERVE], 5);
    CHECK_EQ(c.calls[VMM_SIM_CALL_VA_RESERVE], 7);
    CHECK_EQ(c.failures[VMM_SIM_CALL_VA_FREE], 5);
    op->close(d);
}

static void test_create_release(void)
{
    vmm_driver *d = open_sim(8 * MiB, 0, 1);
    const vmm_driver_ops *op = d->ops;
    vmm_phys a = 0, b = 0, c = 0;

    CHECK_EQ(op->mem_create(d, 0, &a), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_create(d, 1 * MiB, &a), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_create(d, 2 * MiB, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_create(d, 10 * MiB, &a), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(op->mem_create(d, 6 * MiB, &a), VMM_DRV_SUCCESS);
    CHECK(a != 0);
    CHECK_EQ(op->mem_create(d, 4 * MiB, &b), VMM_DRV_OUT_OF_MEMORY); /* 2 MiB left */
    CHECK_EQ(op->mem_create(d, 2 * MiB, &b), VMM_DRV_SUCCESS);
    CHECK(b != a);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &c), VMM_DRV_OUT_OF_MEMORY); /* full */
    size_t fr = 1, tot = 0;
    CHECK_EQ(op->mem_get_info(d, &fr, &tot), VMM_DRV_SUCCESS);
    CHECK_EQ(fr, 0);
    CHECK_EQ(tot, 8 * MiB);
    vmm_sim_counters k = counters(d);
    CHECK_EQ(k.phys_bytes, 8 * MiB);
    CHECK_EQ(k.live_handles, 2);
    CHECK_EQ(k.capacity_bytes, 8 * MiB);

    CHECK_EQ(op->mem_release(d, a), VMM_DRV_SUCCESS);
    check_release_aborts(d, a); /* twice */
    check_release_aborts(d, 0);
    check_release_aborts(d, 987654);
    CHECK_EQ(op->mem_get_info(d, &fr, &tot), VMM_DRV_SUCCESS);
    CHECK_EQ(fr, 6 * MiB);
    CHECK_EQ(op->mem_create(d, 6 * MiB, &c), VMM_DRV_SUCCESS); /* capacity came back */
    CHECK_EQ(op->mem_release(d, b), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, c), VMM_DRV_SUCCESS);
    k = counters(d);
    CHECK_EQ(k.phys_bytes, 0);
    CHECK_EQ(k.live_handles, 0);
    CHECK_EQ(k.failures[VMM_SIM_CALL_MEM_CREATE], 6);
    CHECK_EQ(k.failures[VMM_SIM_CALL_MEM_RELEASE], 0); /* the bad releases aborted in children */
    op->close(d);
}

static void test_map_rules(int backed)
{
    vmm_driver *d = open_sim(1 * GiB, backed, 1);
    const vmm_driver_ops *op = d->ops;
    uintptr_t va = 0, other = 0;
    vmm_phys h2 = 0, h4 = 0;
    CHECK_EQ(op->va_reserve(d, 16 * MiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 0, &other), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h2), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 4 * MiB, &h4), VMM_DRV_SUCCESS);

    /* misaligned va, size, offset; size 0; offset != 0; size != handle size */
    CHECK_EQ(op->mem_map(d, va + 4096, 2 * MiB, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va, 1 * MiB, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va, 0, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 2 * MiB, h4), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 4096, h4), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h4), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va, 4 * MiB, 0, h2), VMM_DRV_INVALID_VALUE);
    /* unknown handle */
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, 424242), VMM_DRV_INVALID_HANDLE);
    /* outside any reservation, or running past its end */
    CHECK_EQ(op->mem_map(d, va + 16 * MiB + 64 * GiB, 2 * MiB, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va + 14 * MiB, 4 * MiB, 0, h4), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, other, 4 * MiB, 0, h4), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(counters(d).mapped_bytes, 0);

    /* accepted */
    CHECK_EQ(op->mem_map(d, va, 4 * MiB, 0, h4), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va + 4 * MiB, 2 * MiB, 0, h2), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, other, 2 * MiB, 0, h2), VMM_DRV_SUCCESS); /* a handle mapped twice */
    CHECK_EQ(counters(d).mapped_bytes, 8 * MiB);
    /* over a mapped range, fully or partly */
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va + 2 * MiB, 2 * MiB, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_map(d, va + 4 * MiB, 4 * MiB, 0, h4), VMM_DRV_INVALID_VALUE);

    /* lookup_mapping follows the pages */
    vmm_phys got = 7;
    CHECK_EQ(op->lookup_mapping(d, va + 3 * MiB + 17, &got), VMM_DRV_SUCCESS);
    CHECK_EQ(got, h4);
    CHECK_EQ(op->lookup_mapping(d, va + 4 * MiB, &got), VMM_DRV_SUCCESS);
    CHECK_EQ(got, h2);
    CHECK_EQ(op->lookup_mapping(d, other + 1, &got), VMM_DRV_SUCCESS);
    CHECK_EQ(got, h2);
    CHECK_EQ(op->lookup_mapping(d, va + 6 * MiB, &got), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(got, 0);

    /* set_access: mapped pages only, may span adjacent mappings */
    CHECK_EQ(op->set_access(d, va, 8 * MiB), VMM_DRV_INVALID_VALUE);  /* last 2 MiB unmapped */
    CHECK_EQ(op->set_access(d, va + 6 * MiB, 2 * MiB), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->set_access(d, va, 4096), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->set_access(d, va, 0), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->set_access(d, va, 6 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->set_access(d, va + 2 * MiB, 2 * MiB), VMM_DRV_SUCCESS); /* part of a mapping */
    CHECK_EQ(op->set_access(d, other, 2 * MiB), VMM_DRV_SUCCESS);

    /* unmap: exactly one earlier mapping */
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_INVALID_VALUE);       /* part of one */
    CHECK_EQ(op->mem_unmap(d, va + 2 * MiB, 2 * MiB), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_unmap(d, va, 6 * MiB), VMM_DRV_INVALID_VALUE);       /* two of them */
    CHECK_EQ(op->mem_unmap(d, va + 6 * MiB, 2 * MiB), VMM_DRV_INVALID_VALUE); /* nothing there */
    CHECK_EQ(op->mem_unmap(d, va + 4096, 2 * MiB), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_unmap(d, va, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, va, 4 * MiB), VMM_DRV_INVALID_VALUE);       /* twice */
    CHECK_EQ(op->lookup_mapping(d, va, &got), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(counters(d).mapped_bytes, 4 * MiB);

    /* released while mapped: the handle is dead at once, its memory lives on until unmapped */
    CHECK_EQ(op->mem_release(d, h2), VMM_DRV_SUCCESS);
    vmm_sim_counters k = counters(d);
    CHECK_EQ(k.live_handles, 1);
    CHECK_EQ(k.phys_bytes, 6 * MiB);
    CHECK_EQ(op->mem_map(d, va + 8 * MiB, 2 * MiB, 0, h2), VMM_DRV_INVALID_HANDLE);
    check_release_aborts(d, h2); /* twice, though its memory is still mapped */
    CHECK_EQ(op->lookup_mapping(d, other, &got), VMM_DRV_SUCCESS);
    CHECK_EQ(got, h2);
    CHECK_EQ(op->mem_unmap(d, va + 4 * MiB, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(counters(d).phys_bytes, 6 * MiB); /* still mapped at `other` */
    CHECK_EQ(op->mem_unmap(d, other, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(counters(d).phys_bytes, 4 * MiB); /* now it is gone */

    /* the reservation is plain again: map anew, at once */
    CHECK_EQ(op->mem_map(d, va + 12 * MiB, 4 * MiB, 0, h4), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, va + 12 * MiB, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h4), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, 16 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, other, 2 * MiB), VMM_DRV_SUCCESS);
    k = counters(d);
    CHECK_EQ(k.phys_bytes, 0);
    CHECK_EQ(k.mapped_bytes, 0);
    CHECK_EQ(k.reserved_va_bytes, 0);
    CHECK_EQ(k.live_handles, 0);
    CHECK_EQ(k.failures[VMM_SIM_CALL_MEM_MAP], 15);
    CHECK_EQ(k.failures[VMM_SIM_CALL_MEM_UNMAP], 6);
    CHECK_EQ(k.failures[VMM_SIM_CALL_SET_ACCESS], 4);
    op->close(d);
}

static void test_classic(int backed)
{
    vmm_driver *d = open_sim(4 * MiB, backed, 1);
    const vmm_driver_ops *op = d->ops;
    uintptr_t p = 0, q = 0, r = 0;
    vmm_phys h = 0;

    CHECK_EQ(op->mem_alloc(d, 0, &p), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_alloc(d, 100, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_alloc(d, 5 * MiB, &p), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(op->mem_alloc(d, 1000, &p), VMM_DRV_SUCCESS);
    CHECK_EQ(p % 512, 0);
    CHECK_EQ(op->mem_alloc(d, 2 * MiB, &q), VMM_DRV_SUCCESS);
    CHECK(p != q);
    vmm_sim_counters k = counters(d);
    CHECK_EQ(k.live_classic_allocs, 2);
    CHECK_EQ(k.phys_bytes, 2 * MiB + 1024); /* charged in 512-byte units */
    /* capacity is shared with physical handles */
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_OUT_OF_MEMORY);
    CHECK_EQ(op->mem_alloc(d, 2 * MiB, &r), VMM_DRV_OUT_OF_MEMORY);
    if (backed) {
        memset((void *)p, 0xab, 1000);
        CHECK_EQ(((unsigned char *)p)[999], 0xab);
    }
    CHECK_EQ(op->mem_free(d, q + 512), VMM_DRV_INVALID_VALUE); /* interior pointer */
    CHECK_EQ(op->mem_free(d, 0), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->mem_free(d, q), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_free(d, q), VMM_DRV_INVALID_VALUE); /* twice */
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_free(d, p), VMM_DRV_SUCCESS);
    k = counters(d);
    CHECK_EQ(k.live_classic_allocs, 0);
    CHECK_EQ(k.phys_bytes, 0);
    CHECK_EQ(k.device_syncs, 2); /* each successful mem_free synchronized the device */
    CHECK_EQ(k.failures[VMM_SIM_CALL_MEM_FREE], 3);
    op->close(d);
}

static void test_no_vmm(void)
{
    vmm_driver *d = open_sim(1 * GiB, 1, 0);
    const vmm_driver_ops *op = d->ops;
    vmm_device_info info;
    uintptr_t va = 0, p = 0;
    vmm_phys h = 0, got = 0;
    CHECK_EQ(op->device_info(d, &info), VMM_DRV_SUCCESS);
    CHECK_EQ(info.vmm_supported, 0);
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 0, &va), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->mem_map(d, 2 * MiB, 2 * MiB, 0, 1), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->mem_unmap(d, 2 * MiB, 2 * MiB), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->set_access(d, 2 * MiB, 2 * MiB), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->mem_release(d, 1), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->va_free(d, 2 * MiB, 2 * MiB), VMM_DRV_NOT_SUPPORTED);
    CHECK_EQ(op->lookup_mapping(d, 2 * MiB, &got), VMM_DRV_NOT_SUPPORTED);
    /* the classic path still works */
    CHECK_EQ(op->mem_alloc(d, 4096, &p), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_free(d, p), VMM_DRV_SUCCESS);
    op->close(d);
}

static void test_global_live(void)
{
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes, 0);
    CHECK_EQ(g.live_handles, 0);

    vmm_driver *a = open_sim(1 * GiB, 0, 1);
    vmm_driver *b = open_sim(1 * GiB, 1, 1);
    vmm_phys h = 0, h2 = 0;
    uintptr_t va = 0, p = 0;
    void *s = NULL;
    vmm_event e = NULL;
    CHECK_EQ(a->ops->mem_create(a, 4 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->mem_create(b, 2 * MiB, &h2), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->va_reserve(b, 8 * MiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->mem_map(b, va, 2 * MiB, 0, h2), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->mem_alloc(b, 100, &p), VMM_DRV_SUCCESS);
    CHECK_EQ(a->ops->stream_create(a, &s), VMM_DRV_SUCCESS);
    CHECK_EQ(a->ops->event_create(a, &e), VMM_DRV_SUCCESS);
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes, 6 * MiB + 512);
    CHECK_EQ(g.live_handles, 2);
    CHECK_EQ(g.mapped_bytes, 2 * MiB);
    CHECK_EQ(g.reserved_va_bytes, 8 * MiB);
    CHECK_EQ(g.live_classic_allocs, 1);
    CHECK_EQ(g.live_streams, 1);
    CHECK_EQ(g.live_events, 1);
    CHECK_EQ(a->ops->event_destroy(a, e), VMM_DRV_SUCCESS);
    CHECK_EQ(a->ops->stream_destroy(a, s), VMM_DRV_SUCCESS);
    CHECK_EQ(a->ops->mem_release(a, h), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->mem_unmap(b, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->mem_release(b, h2), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->va_free(b, va, 8 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(b->ops->mem_free(b, p), VMM_DRV_SUCCESS);
    a->ops->close(a);
    b->ops->close(b);
    vmm_test_check_no_sim_leaks();
}

int main(void)
{
    test_defaults_and_open();
    test_va_rules();
    test_create_release();
    test_map_rules(1);
    test_map_rules(0);
    test_classic(1);
    test_classic(0);
    test_no_vmm();
    test_global_live();
    TEST_DONE();
}
