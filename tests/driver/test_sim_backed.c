/* Backed mode: physical handles are real memory. Contents are shared by every mapping of a handle,
 * move with it to a new address, and memory is unreachable before set_access and after unmap. */
// ctest-labels: unit
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "driver.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

enum { CHILD_FAULTED = 42, CHILD_NO_FAULT = 43 }; /* exit codes of the touching child */

static vmm_driver *open_backed(void)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.capacity = 64 * MiB;
    vmm_driver *d = NULL;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_SUCCESS);
    return d;
}

/* Whether the kernel lets us read / write one byte at p, asked without touching it: write(2) from
 * or read(2) into a faulting address fails with EFAULT instead of raising SIGSEGV. */
static int probe(const void *p, int want_write)
{
    int fds[2];
    char c = 'x';
    if (pipe(fds) != 0)
        return -1;
    int ok;
    if (want_write) {
        ok = write(fds[1], &c, 1) == 1 && read(fds[0], (void *)p, 1) == 1;
    } else {
        ok = write(fds[1], p, 1) == 1;
    }
    int err = errno;
    close(fds[0]);
    close(fds[1]);
    return ok ? 1 : (err == EFAULT ? 0 : -1);
}

static void on_segv(int sig)
{
    (void)sig;
    _exit(CHILD_FAULTED);
}

/* Touch p in a child process; returns the child's exit code (CHILD_FAULTED when it faulted). */
static int touch_in_child(volatile unsigned char *p)
{
    pid_t pid = fork();
    if (pid == 0) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, NULL);
        sigaction(SIGBUS, &sa, NULL);
        p[0] = 1;
        _exit(CHILD_NO_FAULT);
    }
    int st = 0;
    if (pid < 0 || waitpid(pid, &st, 0) != pid)
        return -1;
    if (WIFSIGNALED(st) && (WTERMSIG(st) == SIGSEGV || WTERMSIG(st) == SIGBUS))
        return CHILD_FAULTED;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Runs first, while the process has no threads, so fork is plain: the child opens its own device. */
static void test_fault_before_access(void)
{
    pid_t pid = fork();
    if (pid == 0) {
        vmm_driver *d = open_backed();
        uintptr_t va = 0;
        vmm_phys h = 0;
        int ok = d->ops->va_reserve(d, 4 * MiB, 0, &va) == 0 && d->ops->mem_create(d, 2 * MiB, &h) == 0 &&
                 d->ops->mem_map(d, va, 2 * MiB, 0, h) == 0;
        if (!ok)
            _exit(2);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_segv;
        sigaction(SIGSEGV, &sa, NULL);
        *(volatile unsigned char *)va = 1; /* mapped, no access yet */
        _exit(CHILD_NO_FAULT);
    }
    int st = 0;
    CHECK(pid > 0 && waitpid(pid, &st, 0) == pid);
    int faulted = (WIFEXITED(st) && WEXITSTATUS(st) == CHILD_FAULTED) ||
                  (WIFSIGNALED(st) && WTERMSIG(st) == SIGSEGV);
    CHECK(faulted);
}

static void test_access_lifecycle(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    uintptr_t va = 0;
    vmm_phys h = 0;
    CHECK_EQ(op->va_reserve(d, 8 * MiB, 0, &va), VMM_DRV_SUCCESS);
    unsigned char *p = (unsigned char *)va;
    CHECK_EQ(probe(p, 0), 0); /* reserved only */
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h), VMM_DRV_SUCCESS);
    CHECK_EQ(probe(p, 0), 0); /* mapped, no access */
    CHECK_EQ(probe(p, 1), 0);
    CHECK_EQ(op->set_access(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(probe(p, 0), 1);
    CHECK_EQ(probe(p + 2 * MiB - 1, 1), 1);
    CHECK_EQ(probe(p + 2 * MiB, 0), 0); /* the next page of the reservation */
    CHECK_EQ(touch_in_child(p + 100), CHILD_NO_FAULT);
    CHECK_EQ(touch_in_child(p + 2 * MiB), CHILD_FAULTED);
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(probe(p, 0), 0); /* unmapped: gone */
    CHECK_EQ(touch_in_child(p + 100), CHILD_FAULTED);
    /* mapped again: no access until set_access again, as on CUDA */
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h), VMM_DRV_SUCCESS);
    CHECK_EQ(probe(p, 0), 0);
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, 8 * MiB), VMM_DRV_SUCCESS);
}

static void fill(unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)(i * 31u + seed);
}

static int same(const unsigned char *p, size_t n, unsigned seed)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] != (unsigned char)(i * 31u + seed))
            return 0;
    return 1;
}

static void test_contents(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    uintptr_t a = 0, b = 0;
    vmm_phys h1 = 0, h2 = 0;
    CHECK_EQ(op->va_reserve(d, 8 * MiB, 0, &a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_reserve(d, 8 * MiB, 0, &b), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 4 * MiB, &h1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h2), VMM_DRV_SUCCESS);
    /* h1 at a and at b + 4 MiB; h2 right after h1 at a */
    CHECK_EQ(op->mem_map(d, a, 4 * MiB, 0, h1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, a + 4 * MiB, 2 * MiB, 0, h2), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, b + 4 * MiB, 4 * MiB, 0, h1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->set_access(d, a, 6 * MiB), VMM_DRV_SUCCESS); /* one call over two mappings */
    CHECK_EQ(op->set_access(d, b + 4 * MiB, 4 * MiB), VMM_DRV_SUCCESS);

    unsigned char *pa = (unsigned char *)a, *pb = (unsigned char *)b + 4 * MiB;
    fill(pa, 4 * MiB, 7);
    fill(pa + 4 * MiB, 2 * MiB, 99);
    CHECK(same(pb, 4 * MiB, 7)); /* seen through the second mapping */
    pb[12345] = 0x5a;
    CHECK_EQ(pa[12345], 0x5a); /* and back */
    pb[12345] = (unsigned char)(12345u * 31u + 7);

    /* unmap everything of h1, map it at a new address: contents came along */
    CHECK_EQ(op->mem_unmap(d, a, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, b + 4 * MiB, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, b, 4 * MiB, 0, h1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->set_access(d, b, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK(same((unsigned char *)b, 4 * MiB, 7));
    CHECK(same(pa + 4 * MiB, 2 * MiB, 99)); /* h2 untouched by its neighbour's moves */

    /* released while mapped: still readable until unmapped */
    CHECK_EQ(op->mem_release(d, h1), VMM_DRV_SUCCESS);
    CHECK(same((unsigned char *)b, 4 * MiB, 7));
    CHECK_EQ(op->mem_unmap(d, b, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, a + 4 * MiB, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h2), VMM_DRV_SUCCESS);

    /* a fresh handle reusing the same capacity starts zeroed (no stale contents) */
    vmm_phys h3 = 0;
    CHECK_EQ(op->mem_create(d, 4 * MiB, &h3), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, a, 4 * MiB, 0, h3), VMM_DRV_SUCCESS);
    CHECK_EQ(op->set_access(d, a, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(pa[0] | pa[4 * MiB - 1] | pa[12345], 0);
    CHECK_EQ(op->mem_unmap(d, a, 4 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h3), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, a, 8 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, b, 8 * MiB), VMM_DRV_SUCCESS);
}

static void test_memset_memcpy(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    uintptr_t va = 0, cls = 0;
    vmm_phys h = 0;
    CHECK_EQ(op->va_reserve(d, 4 * MiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->set_access(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    void *s = NULL;
    CHECK_EQ(op->stream_create(d, &s), VMM_DRV_SUCCESS);

    uint32_t out[4] = {0};
    CHECK_EQ(op->memset32(d, va + 64, 0xdeadbeefu, 1024, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->memcpy_dtoh(d, out, va + 60, sizeof out, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_sync(d, s), VMM_DRV_SUCCESS);
    CHECK_EQ(out[0], 0);
    CHECK_EQ(out[1], 0xdeadbeefu);
    CHECK_EQ(out[3], 0xdeadbeefu);
    CHECK_EQ(((uint32_t *)va)[16 + 1023], 0xdeadbeefu);
    CHECK_EQ(((uint32_t *)va)[16 + 1024], 0);

    /* rejected: misaligned, running off the mapped pages, unmapped, bad stream */
    CHECK_EQ(op->memset32(d, va + 2, 1, 4, s), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->memset32(d, va + 2 * MiB - 8, 1, 4, s), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->memset32(d, va + 2 * MiB, 1, 1, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->memcpy_dtoh(d, out, va + 2 * MiB - 4, 8, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->memcpy_dtoh(d, NULL, va, 8, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->memset32(d, va, 1, 1, (void *)out), VMM_DRV_INVALID_HANDLE);

    /* classic allocations too, on the default stream */
    CHECK_EQ(op->mem_alloc(d, 4096, &cls), VMM_DRV_SUCCESS);
    CHECK_EQ(op->memset32(d, cls, 0x01020304u, 1024, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(op->memcpy_dtoh(d, out, cls + 4080, 16, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(op->memset32(d, cls + 4092, 0, 2, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->stream_sync(d, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(out[2], 0x01020304u);
    CHECK_EQ(op->mem_free(d, cls), VMM_DRV_SUCCESS);

    CHECK_EQ(op->stream_destroy(d, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, 4 * MiB), VMM_DRV_SUCCESS);
}

int main(void)
{
    test_fault_before_access();
    vmm_driver *d = open_backed();
    test_access_lifecycle(d);
    test_contents(d);
    test_memset_memcpy(d);
    vmm_sim_counters c;
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    CHECK_EQ(c.phys_bytes, 0);
    CHECK_EQ(c.mapped_bytes, 0);
    CHECK_EQ(c.reserved_va_bytes, 0);
    d->ops->close(d);
    vmm_sim_global_live(&c);
    CHECK_EQ(c.phys_bytes + c.live_handles + c.mapped_bytes + c.reserved_va_bytes + c.live_streams, 0);
    TEST_DONE();
}
