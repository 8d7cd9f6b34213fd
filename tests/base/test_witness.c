// ctest-labels: unit
/* Lock ranks (src/base/witness.c, core/lock.h): in Debug and sanitizer builds, waiting for a lock
 * out of rank order aborts, naming both locks; a trylock against the order is allowed; locks of a
 * `multi` rank may be held together. Each violation runs in a child, whose abort and message are
 * checked. In other builds the witness is compiled out: skipped. The library's own lock order is
 * exercised by every multi-threaded test of those builds (test_tcache, test_lanes, stress). */
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

#if defined(VMM_WITNESS)
static _Atomic int lo, hi, lane1, lane2, solo1, solo2;
static const char owner = 0;

/* Run fn in a child; returns 1 when it died of SIGABRT with both names in its stderr. */
static int aborts_naming(void (*fn)(void), const char *name1, const char *name2)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 2);
        fn();
        _exit(0);
    }
    close(fds[1]);
    char buf[1024] = {0};
    size_t n = 0;
    ssize_t r;
    while (n < sizeof buf - 1 && (r = read(fds[0], buf + n, sizeof buf - 1 - n)) > 0)
        n += (size_t)r;
    close(fds[0]);
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid);
    printf("child: %s", buf);
    return WIFSIGNALED(st) && WTERMSIG(st) == SIGABRT && strstr(buf, name1) && strstr(buf, name2);
}

static void high_then_low(void)
{
    vmm_mutex_lock(&hi);
    vmm_mutex_lock(&lo); /* rank 1 while holding rank 2: aborts */
}

static void two_solo(void)
{
    vmm_mutex_lock(&solo1);
    vmm_mutex_lock(&solo2); /* same rank, not multi: aborts */
}

static void library_out_of_order(void)
{
    /* a live-table shard's lock, then the allocator lock: the real ranks of core/lock.h */
    vmm_allocator *a;
    CHECK_OK(vmm_create("driver:sim", &a));
    vmm_mutex_lock(&a->live[0].lock);
    vmm_lock(a);
}
#endif

int main(void)
{
#if !defined(VMM_WITNESS)
    printf("skip: lock ranks are checked in Debug and sanitizer builds only (VMM_WITNESS)\n");
    return 77;
#else
    vmm_witness_register(&owner, &lo, 1, "lock-low", 0);
    vmm_witness_register(&owner, &hi, 2, "lock-high", 0);
    vmm_witness_register(&owner, &lane1, 3, "lane-one", 1);
    vmm_witness_register(&owner, &lane2, 3, "lane-two", 1);
    vmm_witness_register(&owner, &solo1, 4, "solo-one", 0);
    vmm_witness_register(&owner, &solo2, 4, "solo-two", 0);

    /* in order, a multi rank twice, a try against the order, releases in any order: fine */
    vmm_mutex_lock(&lo);
    vmm_mutex_lock(&hi);
    vmm_mutex_lock(&lane1);
    vmm_mutex_lock(&lane2);
    vmm_mutex_unlock(&hi);
    vmm_mutex_unlock(&lane1);
    vmm_mutex_unlock(&lane2);
    vmm_mutex_unlock(&lo);
    vmm_mutex_lock(&hi);
    CHECK(vmm_mutex_trylock(&lo));
    vmm_mutex_unlock(&lo);
    vmm_mutex_unlock(&hi);

    CHECK(aborts_naming(high_then_low, "lock-low", "lock-high"));
    CHECK(aborts_naming(two_solo, "solo-one", "solo-two"));
    CHECK(aborts_naming(library_out_of_order, "the allocator lock", "a live-table shard's lock"));

    /* forgotten locks are not checked any more */
    vmm_witness_forget(&owner);
    vmm_mutex_lock(&hi);
    vmm_mutex_lock(&lo);
    vmm_mutex_unlock(&lo);
    vmm_mutex_unlock(&hi);

    /* the allocator's own order holds on a malloc / free / check round */
    vmm_allocator *a;
    CHECK_OK(vmm_create("driver:sim", &a));
    void *p[64];
    for (int i = 0; i < 64; i++)
        CHECK_OK(vmm_malloc(a, 512 * (size_t)(i + 1), NULL, &p[i]));
    for (int i = 0; i < 64; i++)
        CHECK_OK(vmm_free(a, p[i]));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    TEST_DONE();
#endif
}
