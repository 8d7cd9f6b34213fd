// ctest-labels: unit
// ctest-timeout: 300
// ctest-cudadouble
/* Sharing blocks across processes (src/api/ipc_api.c, its records src/features/ipc.c): two
 * processes, an exporter (parent) and an importer
 * (this program again, spawned with --child: a fresh process, which neither fork's inherited
 * driver state nor a sanitizer's fork handling can disturb), pass handles over a UNIX socket (SCM_RIGHTS).
 * Each side writes, the other reads, through the driver's copies as on a GPU:
 *  - a block spanning several pages, a small block at an offset inside its page, a block whose
 *    pages were remapped (recycled from another block) before it was shared, and a block of more
 *    pages than one message carries descriptors;
 *  - keep-alive: a block freed by the exporter while open elsewhere stays allocated (limbo) until
 *    the importer closes it, then comes back through vmm_ipc_collect or the free-memory callback on
 *    a cache miss; a handle released unopened gives its reference back; a second free of a block in
 *    limbo is refused;
 *  - the ipc config key: ipc:false makes export unsupported, ipc:true on an unbacked sim is a
 *    config error;
 *  - vmm_check on both sides at every step, nothing left alive at the end.
 * The _double copy runs the same through the cuda driver on the CUDA double (one device each). */
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"
#include "vmmalloc_sim.h"

#ifdef VMM_HAVE_CUDA_H
#include "cudadouble.h"
#endif

#define MiB ((size_t)1 << 20)
enum { STRIDE = 4096, MAXOPEN = 16 };
enum { CMD_QUIT, CMD_OPEN, CMD_CLOSE, CMD_RELEASE, CMD_CHECK };

typedef struct msg {
    int cmd, idx;
    unsigned s1, s2;
    uint64_t size;
} msg;

static int on_cuda;
static const char *extra_conf = "";

/* Nothing of the driver's left alive: the simulator's counters, or the double's objects. */
static void no_leaks(const char *who)
{
    if (!on_cuda) {
        vmm_test_check_no_sim_leaks();
        return;
    }
#ifdef VMM_HAVE_CUDA_H
    if (!getenv("VMM_EXPECT_CUDA_DOUBLE")) { /* a real GPU (VMM_TEST_ON_CUDA): no hooks to ask */
        printf("%s: the driver's objects left alive: double-only check, not run on a real driver\n", who);
        return;
    }
    const cudadouble_hooks_t *h = cudadouble_hooks();
    CHECK(h != NULL);
    if (!h)
        return;
    cudadouble_objects_t o;
    h->objects(&o);
    if (o.handle_refs || o.mappings || o.reservations || o.streams)
        fprintf(stderr, "%s: the double still has %u handle references, %u mappings, %u reservations, "
                        "%u streams\n", who, o.handle_refs, o.mappings, o.reservations, o.streams);
    CHECK(!o.handle_refs && !o.mappings && !o.reservations && !o.streams);
#else
    (void)who;
#endif
}

static vmm_allocator *make(void)
{
    char conf[512];
    snprintf(conf, sizeof conf, "%s%s%s", on_cuda ? "driver:cuda" : "driver:sim,sim_capacity:1G",
             *extra_conf ? "," : "", extra_conf);
    extra_conf = "";
    vmm_allocator *a = NULL;
    if (vmm_create(conf, &a) != VMM_OK) {
        fprintf(stderr, "vmm_create(%s): %s\n", conf, vmm_last_error());
        vmm_test_failures++;
    }
    return a;
}

static void put(vmm_allocator *a, const void *p, size_t n, unsigned seed)
{
    char *buf = malloc(n);
    vmm_test_fill(buf, n, seed, STRIDE);
    CHECK_EQ(a->drv->ops->memcpy_htod(a->drv, (uintptr_t)p, buf, n, NULL), 0);
    CHECK_EQ(a->drv->ops->stream_sync(a->drv, NULL), 0);
    free(buf);
}

static int intact(vmm_allocator *a, const void *p, size_t n, unsigned seed)
{
    char *buf = calloc(1, n);
    int ok = a->drv->ops->memcpy_dtoh(a->drv, buf, (uintptr_t)p, n, NULL) == 0 &&
             a->drv->ops->stream_sync(a->drv, NULL) == 0 && vmm_test_intact(buf, n, seed, STRIDE);
    free(buf);
    return ok;
}

static void xwrite(int fd, const void *p, size_t n)
{
    if (write(fd, p, n) != (ssize_t)n) {
        perror("write");
        exit(10);
    }
}

static int xread(int fd, void *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, (char *)p + done, n - done);
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

/* ---- the importer ------------------------------------------------------------------------------ */

static int child(int sock)
{
    /* the importer's device maps pages of any multiple of its granularity: 64 KiB on the sim, for
     * the exporter of 64 KiB pages below */
    if (!on_cuda)
        extra_conf = "sim_granularity:64K,small_page_size:64K,large_page_size:64K";
    vmm_allocator *a = make();
    if (!a)
        return 1;
    void *open[MAXOPEN] = {0};
    size_t size[MAXOPEN] = {0};
    for (;;) {
        msg m;
        if (xread(sock, &m, sizeof m))
            break;
        int ok = 1;
        if (m.cmd == CMD_QUIT)
            break;
        if (m.cmd == CMD_OPEN || m.cmd == CMD_RELEASE) {
            vmm_ipc_handle *h = NULL;
            CHECK_OK(vmm_ipc_recv(sock, &h));
            if (h && m.cmd == CMD_RELEASE) {
                CHECK_OK(vmm_ipc_handle_release(h));
            } else if (h) {
                vmm_ipc_desc d;
                CHECK_OK(vmm_ipc_handle_desc(h, &d, NULL, NULL));
                CHECK(d.size >= m.size && d.size - m.size < 4096); /* the block's (rounded) size */
                CHECK_EQ(d.pid, getppid());
                void *p = NULL;
                CHECK_OK(vmm_ipc_open(a, h, &p));
                vmm_ipc_handle_free(h);
                ok = p && intact(a, p, (size_t)m.size, m.s1);
                if (p) {
                    put(a, p, (size_t)m.size, m.s2);
                    open[m.idx] = p;
                    size[m.idx] = (size_t)m.size;
                }
            }
        } else if (m.cmd == CMD_CLOSE) {
            CHECK_OK(vmm_ipc_close(a, open[m.idx]));
            open[m.idx] = NULL;
        } else if (m.cmd == CMD_CHECK) {
            ok = intact(a, open[m.idx], size[m.idx], m.s1);
        }
        CHECK(ok);
        CHECK_OK(vmm_check(a));
        char r = ok ? 'k' : 'x';
        xwrite(sock, &r, 1);
    }
    CHECK_EQ(vmm_ipc_close(a, (void *)0x1234), VMM_EBADPTR);
    vmm_stats st = vmm_test_stats(a);
    int left = 0;
    for (int i = 0; i < MAXOPEN; i++)
        left += open[i] != NULL;
    CHECK_EQ(st.ipc_open_mappings, left);
    vmm_destroy(a); /* closes what is still open */
    no_leaks("importer");
    return vmm_test_failures ? 1 : 0;
}

/* ---- the exporter ----------------------------------------------------------------------------- */

static int sock_p;

static int ask(const msg *m, const vmm_ipc_handle *h)
{
    xwrite(sock_p, m, sizeof *m);
    if (h)
        CHECK_OK(vmm_ipc_send(sock_p, h));
    char r = 0;
    if (xread(sock_p, &r, 1))
        return 0;
    return r == 'k';
}

/* Share block p (n bytes) as open slot idx: the child checks seed s1, writes s2, we check s2. */
static void share(vmm_allocator *a, void *p, size_t n, int idx, unsigned s1, unsigned s2)
{
    put(a, p, n, s1);
    vmm_ipc_handle *h = NULL;
    CHECK_OK(vmm_ipc_get_handle(a, p, &h));
    if (!h)
        return;
    msg m = {CMD_OPEN, idx, s1, s2, n};
    CHECK(ask(&m, h));
    vmm_ipc_handle_free(h);
    CHECK(intact(a, p, n, s2));
    /* and back: a write here is seen there */
    put(a, p, n, s1 + 100);
    msg c = {CMD_CHECK, idx, s1 + 100, 0, 0};
    CHECK(ask(&c, NULL));
    CHECK_OK(vmm_check(a));
}

static void close_there(int idx)
{
    msg m = {CMD_CLOSE, idx, 0, 0, 0};
    CHECK(ask(&m, NULL));
}

static void parent(void)
{
    vmm_allocator *a = make();
    if (!a)
        return;
    /* several pages */
    void *big = NULL;
    size_t nbig = 7 * MiB + 1234;
    CHECK_OK(vmm_malloc(a, nbig, NULL, &big));
    share(a, big, nbig, 0, 1, 2);
    CHECK_EQ(vmm_test_stats(a).ipc_exported_blocks, 1);
    /* a small block at an offset inside its page */
    void *pad[3], *small = NULL;
    for (int i = 0; i < 3; i++)
        CHECK_OK(vmm_malloc(a, 3000, NULL, &pad[i]));
    CHECK_OK(vmm_malloc(a, 5000, NULL, &small));
    {
        vmm_ipc_handle *h = NULL;
        CHECK_OK(vmm_ipc_get_handle(a, small, &h));
        vmm_ipc_desc d;
        CHECK_OK(vmm_ipc_handle_desc(h, &d, NULL, NULL));
        CHECK(d.offset != 0 && d.n_pages == 1);
        CHECK_OK(vmm_ipc_handle_release(h)); /* never sent: its reference goes back here */
    }
    share(a, small, 5000, 1, 3, 4);
    /* pages recycled from another block: a 16 MiB block freed, another stream's 16 MiB growth
     * past the high-water mark remaps its idle pages */
    void *old = NULL, *moved = NULL;
    vmm_stream s2 = NULL;
    CHECK_EQ(a->drv->ops->stream_create(a->drv, &s2), 0);
    CHECK_OK(vmm_malloc(a, 16 * MiB, NULL, &old));
    CHECK_OK(vmm_free(a, old));
    int64_t remapped0 = vmm_test_stats(a).num_pages_remapped;
    CHECK_OK(vmm_malloc(a, 16 * MiB, s2, &moved));
    CHECK(vmm_test_stats(a).num_pages_remapped > remapped0);
    share(a, moved, 16 * MiB, 2, 5, 6);
    /* keep-alive: freed here while open there */
    int64_t alloc0 = vmm_test_stats(a).allocated_bytes[0].current;
    CHECK_OK(vmm_free(a, moved));
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.ipc_limbo_blocks, 1);
    CHECK_EQ(st.allocated_bytes[0].current, alloc0); /* still allocated */
    CHECK_EQ(vmm_free(a, moved), VMM_EBADPTR);       /* a second free */
    CHECK_EQ(vmm_ipc_collect(a), 0);                 /* still open there */
    msg c2 = {CMD_CHECK, 2, 5 + 100, 0, 0};
    CHECK(ask(&c2, NULL)); /* the memory is intact there */
    close_there(2);
    CHECK_EQ(vmm_ipc_collect(a), 1);
    st = vmm_test_stats(a);
    CHECK_EQ(st.ipc_limbo_blocks, 0);
    CHECK_EQ(st.allocated_bytes[0].current, alloc0 - 16 * (int64_t)MiB);
    CHECK_OK(vmm_check(a));
    /* the same through the free-memory callback on a cache miss */
    CHECK_OK(vmm_free(a, big));
    CHECK_EQ(vmm_test_stats(a).ipc_limbo_blocks, 1);
    close_there(0);
    int64_t runs0 = vmm_test_stats(a).num_free_memory_callbacks;
    void *again = NULL;
    CHECK_OK(vmm_malloc(a, 7 * MiB, NULL, &again)); /* no cached block: callbacks, then the cache */
    st = vmm_test_stats(a);
    CHECK(st.num_free_memory_callbacks > runs0);
    CHECK(st.num_free_memory_callback_hits >= 1);
    CHECK_EQ(st.ipc_limbo_blocks, 0);
    CHECK(again == big); /* the block came back and served the request */
    CHECK_OK(vmm_free(a, again));
    /* a handle the other side releases without opening: the free goes through at once */
    {
        vmm_ipc_handle *h = NULL;
        CHECK_OK(vmm_ipc_get_handle(a, pad[0], &h));
        msg m = {CMD_RELEASE, 0, 0, 0, 3000};
        CHECK(ask(&m, h));
        vmm_ipc_handle_free(h);
        CHECK_OK(vmm_free(a, pad[0]));
        CHECK_EQ(vmm_test_stats(a).ipc_limbo_blocks, 0);
    }
    /* more pages than one message carries descriptors (sim: 64 KiB pages) */
    if (!on_cuda) {
        void *many = NULL;
        vmm_allocator *b = NULL;
        CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,sim_granularity:64K,small_page_size:64K,"
                            "large_page_size:64K", &b));
        if (b) {
            CHECK_OK(vmm_malloc(b, 20 * MiB, NULL, &many)); /* 320 pages */
            share(b, many, 20 * MiB, 3, 7, 8);
            close_there(3);
            CHECK_OK(vmm_free(b, many));
            CHECK_OK(vmm_check(b));
            vmm_destroy(b);
        }
    }
    /* still open there at the end: the small block; its free parks it, destroy reports */
    close_there(1);
    CHECK_OK(vmm_free(a, small));
    for (int i = 1; i < 3; i++)
        CHECK_OK(vmm_free(a, pad[i]));
    CHECK_EQ(a->drv->ops->stream_destroy(a->drv, s2), 0);
    CHECK_OK(vmm_check(a));
    st = vmm_test_stats(a);
    CHECK_EQ(st.ipc_exported_blocks + st.ipc_limbo_blocks, 0);
    CHECK_EQ(st.allocated_bytes[0].current, 0);
    vmm_destroy(a);
    no_leaks("exporter");
}

extern char **environ;

static void run_pair(void)
{
    int sv[2];
    CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fflush(stdout);
    fflush(stderr);
    char fd[16];
    snprintf(fd, sizeof fd, "%d", sv[1]);
    char *argv[] = {"test_ipc", on_cuda ? "--child-cuda" : "--child-sim", fd, NULL};
    pid_t pid;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addclose(&fa, sv[0]);
    int rc = posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    CHECK_EQ(rc, 0);
    close(sv[1]);
    if (rc)
        return;
    sock_p = sv[0];
    parent();
    msg q = {CMD_QUIT, 0, 0, 0, 0};
    xwrite(sock_p, &q, sizeof q);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    close(sock_p);
}

/* ---- the config key ---------------------------------------------------------------------------- */

static void config_key(void)
{
    vmm_allocator *a = NULL;
    CHECK_EQ(vmm_create("driver:sim,sim_backed:false,ipc:true", &a), VMM_ECONFIG);
    CHECK(strstr(vmm_last_error(), "ipc") != NULL);
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M,ipc:false", &a));
    if (a) {
        void *p = NULL;
        CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &p));
        vmm_ipc_handle *h = NULL;
        CHECK_EQ(vmm_ipc_get_handle(a, p, &h), VMM_ENOTSUP);
        CHECK(strstr(vmm_last_error(), "ipc:false") != NULL);
        CHECK_EQ(vmm_ipc_get_handle(a, (char *)p + 512, &h), VMM_EBADPTR);
        CHECK_OK(vmm_free(a, p));
        vmm_destroy(a);
    }
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M,expandable_segments:false", &a));
    if (a) {
        void *p = NULL;
        CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &p));
        vmm_ipc_handle *h = NULL;
        CHECK_EQ(vmm_ipc_get_handle(a, p, &h), VMM_ENOTSUP);
        CHECK_OK(vmm_free(a, p));
        vmm_destroy(a);
    }
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    if (argc == 3 && !strncmp(argv[1], "--child-", 8)) {
        on_cuda = !strcmp(argv[1], "--child-cuda");
        return child(atoi(argv[2]));
    }
    on_cuda = 0;
    config_key();
    run_pair();
    vmm_test_check_no_sim_leaks();
#ifdef VMM_HAVE_CUDA_H
    /* the cuda driver part: on the double (its _double test), or on a real GPU when asked
     * (VMM_TEST_ON_CUDA=1: tools/gpu-check's features phase) */
    if (getenv("VMM_EXPECT_CUDA_DOUBLE") || getenv("VMM_TEST_ON_CUDA")) {
        /* each process opens the driver itself: nothing of it is loaded yet here */
        on_cuda = 1;
        setenv("CUDADOUBLE_CAPACITY_MB", "1024", 1);
        run_pair();
    }
#endif
    TEST_DONE();
}
