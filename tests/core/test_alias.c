// ctest-labels: unit
// ctest-timeout: 120
// ctest-cudadouble
/*
 * alias_pages (src/core/alias.c): a growth maps a partly used page whose free part fits its first
 * or last page a second time, instead of a new page.
 *  - tail: a stayer's first page keeps a free prefix once the block before it is gone; a later
 *    block grown elsewhere in VA ends in that prefix: one page fewer held (with the key off the
 *    same steps hold one more), its bytes written through one view read through the other;
 *  - head: a stayer's last page keeps a free suffix that no gap next to it can use; a later block
 *    starts at that offset of its first page, which is the same page;
 *  - freeing either block first, then empty_cache: the bytes go back (reserved down to what the
 *    other block holds, then to 0), the other block's data intact;
 *  - on a device just large enough, the aliased growth fits where the key off runs out of memory,
 *    and a growth that needs every page drops the view that holds nothing, whose page is then
 *    idle whole and remapped;
 *  - destroy with views still mapped returns every handle and VA range (sim counters);
 *  - vmm_check after every step (each byte owned by one view, reserved counting a page once).
 * On the CUDA double (copy test_alias_double) the same steps run against driver:cuda, the bytes
 * checked through cuMemcpy where the double offers no host view.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "internal.h"
#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static int on_double(void)
{
    const char *e = getenv("VMM_EXPECT_CUDA_DOUBLE");
    return e && strcmp(e, "1") == 0;
}

/* An allocator with 2 MiB one-handle pages, alias_pages as asked, `cap` bytes of device, and the
 * keys in `extra` (",key:value..." or ""). */
static vmm_allocator *make_conf(int alias, size_t cap, const char *extra)
{
    char conf[512];
    vmm_allocator *a = NULL;
    if (on_double()) {
        /* the double's device is larger: cap it with the memory fraction */
        vmm_allocator *probe = NULL;
        if (vmm_create("driver:cuda", &probe) != VMM_OK) {
            fprintf(stderr, "driver:cuda: %s\n", vmm_last_error());
            vmm_test_failures++;
            return NULL;
        }
        /* half a MiB over: the cap is rounded down to whole pages */
        double frac = (double)(cap + MiB / 2) / (double)probe->dev.total_bytes;
        vmm_destroy(probe);
        snprintf(conf, sizeof conf, "driver:cuda,ipc:false,max_handle_size:2M,alias_pages:%s,"
                 "per_process_memory_fraction:%.9f,thread_cache:0%s", alias ? "true" : "false", frac, extra);
    } else {
        snprintf(conf, sizeof conf, "driver:sim,sim_capacity:%zuM,sim_backed:true,ipc:false,max_handle_size:2M,"
                 "alias_pages:%s,thread_cache:0%s", cap / MiB, alias ? "true" : "false", extra);
    }
    CHECK_OK(vmm_create(conf, &a));
    return a;
}

static vmm_allocator *make(int alias, size_t cap)
{
    return make_conf(alias, cap, "");
}

static int64_t reserved(vmm_allocator *a)
{
    return vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current;
}

static void *take(vmm_allocator *a, size_t n)
{
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, n, NULL, &p));
    CHECK_OK(vmm_check(a));
    return p;
}

static void give(vmm_allocator *a, void *p)
{
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
}

/* Bytes through the device pointer, by the driver's stream-ordered copies and a sync (the
 * double's device memory is not the host's to touch), one pattern per MiB (seed + k for the k-th)
 * so that any whole MiB can be checked on its own. */
static void fill(vmm_allocator *a, void *p, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    if (!h)
        return;
    for (size_t k = 0; k * MiB < n; k++)
        vmm_test_fill(h + k * MiB, n - k * MiB < MiB ? n - k * MiB : MiB, seed + (unsigned)k, 4096);
    CHECK_EQ(a->drv->ops->memcpy_htod(a->drv, (uintptr_t)p, h, n, NULL), 0);
    CHECK_EQ(a->drv->ops->stream_sync(a->drv, NULL), 0);
    free(h);
}

static int intact(vmm_allocator *a, const void *p, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    int ok = h && a->drv->ops->memcpy_dtoh(a->drv, h, (uintptr_t)p, n, NULL) == 0 &&
             a->drv->ops->stream_sync(a->drv, NULL) == 0;
    for (size_t k = 0; ok && k * MiB < n; k++)
        ok = vmm_test_intact(h + k * MiB, n - k * MiB < MiB ? n - k * MiB : MiB, seed + (unsigned)k, 4096);
    free(h);
    return ok;
}

/* Whether n bytes at device pointers p and q read the same (two views of one page). */
static int same(vmm_allocator *a, const void *p, const void *q, size_t n)
{
    unsigned char *h = malloc(2 * n);
    int ok = h && a->drv->ops->memcpy_dtoh(a->drv, h, (uintptr_t)p, n, NULL) == 0 &&
             a->drv->ops->memcpy_dtoh(a->drv, h + n, (uintptr_t)q, n, NULL) == 0 &&
             a->drv->ops->stream_sync(a->drv, NULL) == 0 && memcmp(h, h + n, n) == 0;
    free(h);
    return ok;
}

/* Tail: A [0, 3M) and S [3M, 8M) (S stays); A freed; B (5 MiB) grows after S, pages 4-6, and its
 * last page (1 MiB used) is page 1, whose free prefix [2M, 3M) A left. Returns the allocator with
 * S and B live; *s, *b their pointers. */
static vmm_allocator *tail_case(int alias, char **s, char **b)
{
    vmm_allocator *a = make(alias, 64 * MiB);
    if (!a)
        return NULL;
    char *pa = take(a, 3 * MiB);
    *s = take(a, 5 * MiB);
    CHECK_EQ((uintptr_t)*s, (uintptr_t)pa + 3 * MiB);
    fill(a, *s, 5 * MiB, 11);
    give(a, pa);
    CHECK_EQ(reserved(a), 8 * MiB);
    *b = take(a, 5 * MiB);
    fill(a, *b, 5 * MiB, 22);
    CHECK(intact(a, *s, 5 * MiB, 11));
    CHECK(intact(a, *b, 5 * MiB, 22));
    return a;
}

static void tail(void)
{
    char *s, *b;
    /* without the key: page 0 goes to B, B's last page is a new one (6 pages for 10 MiB) */
    vmm_allocator *a = tail_case(0, &s, &b);
    if (!a)
        return;
    CHECK_EQ(reserved(a), 12 * MiB);
    CHECK_EQ(vmm_test_stats(a).mapped_bytes[VMM_POOL_ALL].current, 12 * MiB);
    vmm_destroy(a);

    for (int order = 0; order < 2; order++) {
        a = tail_case(1, &s, &b);
        if (!a)
            return;
        /* B's last page is page 1 mapped again: 5 pages held, 6 mapped */
        CHECK_EQ(reserved(a), 10 * MiB);
        CHECK_EQ(vmm_test_stats(a).mapped_bytes[VMM_POOL_ALL].current, 12 * MiB);
        /* one physical page: B's last MiB is what page 1's first view shows at [2M, 3M) */
        fill(a, b + 4 * MiB, 1 * MiB, 33);
        CHECK(intact(a, s - 1 * MiB, 1 * MiB, 33));
        CHECK(intact(a, s, 5 * MiB, 11));
        char *first = order ? s : b, *other = order ? b : s;
        give(a, first);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        /* the other block's three pages stay (its shared page among them) */
        CHECK_EQ(reserved(a), 6 * MiB);
        CHECK(order ? intact(a, b, 4 * MiB, 22) : intact(a, s, 5 * MiB, 11));
        if (order)
            CHECK(intact(a, b + 4 * MiB, 1 * MiB, 33));
        give(a, other);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK_EQ(reserved(a), 0);
        CHECK_EQ(vmm_test_stats(a).mapped_bytes[VMM_POOL_ALL].current, 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* Head: S [0, 3M), Q [3M, 6M), W [6M, 10M); Q freed and its whole page 2 reclaimed: page 1 keeps
 * the free suffix [3M, 4M), beside a one-page gap that no 4.5 MiB request fits. X (4.5 MiB) grows
 * after W and starts 1 MiB into its first page, page 1 mapped again. */
static void head(void)
{
    for (int alias = 0; alias < 2; alias++) {
        vmm_allocator *a = make(alias, 64 * MiB);
        if (!a)
            return;
        char *s = take(a, 3 * MiB), *q = take(a, 3 * MiB), *w = take(a, 4 * MiB);
        CHECK_EQ((uintptr_t)w, (uintptr_t)s + 6 * MiB);
        fill(a, s, 3 * MiB, 1);
        fill(a, w, 4 * MiB, 2);
        give(a, q);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 8 * MiB);
        char *x = take(a, 4 * MiB + 512 * 1024);
        fill(a, x, 4 * MiB + 512 * 1024, 3);
        if (!alias) {
            CHECK_EQ(reserved(a), 14 * MiB);
        } else {
            CHECK_EQ(reserved(a), 12 * MiB);
            CHECK_EQ(((uintptr_t)x - (uintptr_t)s) % (2 * MiB), 1 * MiB);
            CHECK(intact(a, s + 3 * MiB, 1 * MiB, 3)); /* X's first MiB, through page 1's first view */
        }
        CHECK(intact(a, s, 3 * MiB, 1));
        CHECK(intact(a, w, 4 * MiB, 2));
        CHECK(intact(a, x, 4 * MiB + 512 * 1024, 3));
        give(a, s);
        give(a, w);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK(intact(a, x, 4 * MiB + 512 * 1024, 3));
        CHECK_EQ(reserved(a), 6 * MiB); /* X's three pages */
        give(a, x);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* Every page of a 14 MiB device: A [0, 3M), S [3M, 8M), C [8M, 12M); A freed; B (5 MiB) after C
 * fits only with its last page in page 1's free prefix (key off: ENOMEM). S and B freed, C stays:
 * 10 MiB of pages are free, in two runs with page 1 split between its views; a 10 MiB request
 * needs page 1 whole, which dropping B's idle view gives (growth at the device's end). */
static void full_device(void)
{
    for (int alias = 0; alias < 2; alias++) {
        vmm_allocator *a = make(alias, 14 * MiB);
        if (!a)
            return;
        char *pa = take(a, 3 * MiB), *s = take(a, 5 * MiB), *c = take(a, 4 * MiB);
        CHECK_EQ((uintptr_t)c, (uintptr_t)pa + 8 * MiB);
        fill(a, c, 4 * MiB, 7);
        give(a, pa);
        void *p = NULL;
        int rc = vmm_malloc(a, 5 * MiB, NULL, &p);
        CHECK_OK(vmm_check(a));
        if (!alias) {
            /* six pages for S and C, three for B, one of them page 0's: 16 MiB */
            CHECK_EQ(rc, VMM_ENOMEM);
            vmm_destroy(a);
            continue;
        }
        CHECK_OK(rc);
        char *b = p;
        CHECK_EQ(reserved(a), 14 * MiB);
        give(a, s);
        give(a, b);
        char *d = take(a, 10 * MiB);
        CHECK(d != NULL);
        CHECK_EQ(reserved(a), 14 * MiB);
        CHECK(intact(a, c, 4 * MiB, 7));
        if (d) {
            fill(a, d, 10 * MiB, 5);
            CHECK(intact(a, d, 10 * MiB, 5));
            CHECK(intact(a, c, 4 * MiB, 7));
            give(a, d);
        }
        give(a, c);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* vmm_destroy with both blocks and both views in place. */
static void destroy_mapped(void)
{
    char *s, *b;
    vmm_allocator *a = tail_case(1, &s, &b);
    if (!a)
        return;
    CHECK_EQ(reserved(a), 10 * MiB);
    vmm_destroy(a);
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* alias_place: T1 [0, 3M), S [3M, 7.5M) (stays), T2 [7.5M, 10.5M); the temporaries freed and
 * their whole pages given back: S is alone, page 1 keeps the free prefix [2M, 3M) and page 3 the
 * free suffix [7.5M, 8M). Returns the allocator (6 MiB reserved: S's three pages), *s. */
static vmm_allocator *stayer_case(int alias, const char *extra, char **s)
{
    vmm_allocator *a = make_conf(alias, 64 * MiB, extra);
    if (!a)
        return NULL;
    char *t1 = take(a, 3 * MiB);
    *s = take(a, 4 * MiB + 512 * 1024);
    char *t2 = take(a, 3 * MiB);
    CHECK_EQ((uintptr_t)*s, (uintptr_t)t1 + 3 * MiB);
    CHECK_EQ((uintptr_t)t2, (uintptr_t)t1 + 7 * MiB + 512 * 1024);
    fill(a, *s, 4 * MiB + 512 * 1024, 41);
    give(a, t1);
    give(a, t2);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(reserved(a), 6 * MiB);
    return a;
}

/* The next block (3.5 MiB) takes both of the stayer's edges: page 3's suffix where it starts (the
 * run goes on there), page 1's prefix of exactly its last MiB as its last page (a second view):
 * one new page. Key off (and alias_pages alone: the growth continues the run, so no head, and
 * its last page would hold 1 MiB of page 1's prefix, which it does too) : compared below. Then S
 * freed first: its pages go back but for the shared one, which the block keeps. */
static void place_stayer(void)
{
    const char *modes[] = {"", ",alias_place:true"};
    for (int m = 0; m < 3; m++) {
        char *s;
        vmm_allocator *a = stayer_case(m > 0, m == 2 ? modes[1] : modes[0], &s);
        if (!a)
            return;
        char *n = take(a, 3 * MiB + 512 * 1024);
        fill(a, n, 3 * MiB + 512 * 1024, 42);
        CHECK_EQ((uintptr_t)n, (uintptr_t)s + 4 * MiB + 512 * 1024);
        if (m == 0) {
            CHECK_EQ(reserved(a), 10 * MiB); /* two new pages after S */
        } else {
            CHECK_EQ(reserved(a), 8 * MiB); /* one: the last page is page 1 again */
            CHECK(same(a, s - 1 * MiB, n + 2 * MiB + 512 * 1024, 1 * MiB)); /* N's last MiB, page 1 */
        }
        CHECK(intact(a, s, 4 * MiB + 512 * 1024, 41));
        CHECK(intact(a, n, 3 * MiB + 512 * 1024, 42));
        give(a, s);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK_EQ(reserved(a), 6 * MiB); /* N's three pages, page 3 and page 1 among them */
        CHECK(intact(a, n, 3 * MiB + 512 * 1024, 42));
        give(a, n);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* The in-page gap rule: a 3.125 MiB block after S (too large for page 0 and page 1's prefix in
 * place) ends 0.625 MiB into its second page; page 1's free prefix (1 MiB) would leave 0.375 MiB
 * free inside that page, more than alias_place_tail_gap's default 256K: a new page instead. With
 * alias_place_tail_gap:512K the prefix is taken. */
static void place_tail_gap(void)
{
    for (int wide = 0; wide < 2; wide++) {
        char *s;
        vmm_allocator *a = stayer_case(1, wide ? ",alias_place:true,alias_place_tail_gap:512K"
                                                : ",alias_place:true", &s);
        if (!a)
            return;
        size_t nb = 3 * MiB + 128 * 1024;
        char *n = take(a, nb);
        CHECK_EQ((uintptr_t)n, (uintptr_t)s + 4 * MiB + 512 * 1024);
        fill(a, n, nb, 43);
        CHECK_EQ(reserved(a), wide ? 8 * MiB : 10 * MiB);
        if (wide) /* N's last 0.625 MiB through page 1's first view */
            CHECK(same(a, s - 1 * MiB, n + 2 * MiB + 512 * 1024, 640 * 1024));
        CHECK(intact(a, n, nb, 43));
        CHECK(intact(a, s, 4 * MiB + 512 * 1024, 41));
        give(a, n);
        give(a, s);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* Same-size reuse: X (5 MiB) freed between two live blocks; a request of its size, or of at most
 * alias_place_slack (1M) less, takes X's place again, mapping nothing; a 3 MiB request (2 MiB
 * less) is built by growth (here into X's idle pages, unmapped and mapped again, as the growth
 * past the high-water mark recycles them), where the key off takes X by best fit. */
static void place_reuse(void)
{
    for (int place = 0; place < 2; place++) {
        vmm_allocator *a = make_conf(1, 64 * MiB, place ? ",alias_place:true" : "");
        if (!a)
            return;
        char *pa = take(a, 4 * MiB), *x = take(a, 5 * MiB), *pb = take(a, 3 * MiB);
        CHECK_EQ((uintptr_t)x, (uintptr_t)pa + 4 * MiB);
        give(a, x);
        int64_t maps0 = vmm_test_stats(a).num_pages_mapped;
        char *y = take(a, 5 * MiB);
        CHECK_EQ((uintptr_t)y, (uintptr_t)x);
        give(a, y);
        y = take(a, 4 * MiB + 512 * 1024);
        CHECK_EQ((uintptr_t)y, (uintptr_t)x);
        give(a, y);
        CHECK_EQ(vmm_test_stats(a).num_pages_mapped, maps0);
        int64_t maps = vmm_test_stats(a).num_pages_mapped;
        y = take(a, 3 * MiB);
        if (place)
            CHECK(vmm_test_stats(a).num_pages_mapped > maps);
        else
            CHECK_EQ(vmm_test_stats(a).num_pages_mapped, maps);
        fill(a, y, 3 * MiB, 44);
        CHECK(intact(a, y, 3 * MiB, 44));
        give(a, y);
        give(a, pa);
        give(a, pb);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* Lanes run during an alias's driver calls (vmm_alias_map lets them go around mem_map and
 * set_access): a free block found before one alias is mapped may be another thread's by the time
 * the next one is. The driver's mem_map is wrapped so that, inside the growth's first alias map,
 * a second thread's malloc runs on the same stream (a lane path) and waits for nothing. */
static struct {
    const vmm_driver_ops *real;
    vmm_driver_ops ops;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int armed, go, done;
    vmm_allocator *a;
    size_t size;
    void *got;
    int rc;
} race = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Wait up to 5 s for *flag (race.mu held); 0 on timeout. */
static int race_wait(int *flag)
{
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += 5;
    while (!*flag)
        if (pthread_cond_timedwait(&race.cv, &race.mu, &t))
            return *flag;
    return 1;
}

static int race_mem_map(vmm_driver *d, uintptr_t va, size_t size, size_t offset, vmm_phys h)
{
    pthread_mutex_lock(&race.mu);
    if (race.armed) {
        race.armed = 0;
        race.go = 1;
        pthread_cond_broadcast(&race.cv);
        /* the other thread's malloc goes through its lane now; on a timeout (it needed the
         * allocator lock) the test fails below, nothing hangs */
        race_wait(&race.done);
    }
    pthread_mutex_unlock(&race.mu);
    return race.real->mem_map(d, va, size, offset, h);
}

static void *race_thread(void *arg)
{
    (void)arg;
    /* a first malloc under the allocator lock from a second thread opens the lanes */
    void *w = NULL;
    CHECK_OK(vmm_malloc(race.a, 4096, NULL, &w));
    CHECK_OK(vmm_free(race.a, w));
    pthread_mutex_lock(&race.mu);
    race.done = 0;
    race.go = 0;
    race.armed = 1;
    pthread_cond_broadcast(&race.cv);
    race_wait(&race.go);
    pthread_mutex_unlock(&race.mu);
    race.rc = vmm_malloc(race.a, race.size, NULL, &race.got);
    pthread_mutex_lock(&race.mu);
    race.done = 1;
    pthread_cond_broadcast(&race.cv);
    pthread_mutex_unlock(&race.mu);
    return NULL;
}

/* alias_pages: S [0, 2.5M), Q [2.5M, 4M), W [4M, 12M), P [12M, 13.5M), R [13.5M, 16M); Q and P
 * freed: page 1 has the free suffix [2.5M, 4M) (a head), page 6 the free prefix [12M, 13.5M) (a
 * tail), and neither fits X (3 MiB), which grows after R, two pages: its first a view of page 1 (X
 * starting 0.5 MiB into it), its last a view of page 6. While the first of the two views is
 * mapped, thread B mallocs 1.5 MiB: its lane's best fit is page 1's suffix, unless X's growth
 * has made it a view's already. Whatever B gets, its bytes and X's must be different memory: B's
 * data intact after X is written, vmm_check clean, both freed. */
static void lane_race(void)
{
    vmm_allocator *a = make_conf(1, 64 * MiB, ",thread_cache:4M,lanes:true");
    if (!a)
        return;
    char *s = take(a, 2 * MiB + 512 * 1024), *q = take(a, 1 * MiB + 512 * 1024), *w = take(a, 8 * MiB);
    char *p = take(a, 1 * MiB + 512 * 1024), *r = take(a, 2 * MiB + 512 * 1024);
    CHECK_EQ((uintptr_t)r, (uintptr_t)s + 13 * MiB + 512 * 1024);
    give(a, q);
    give(a, p);
    CHECK_OK(vmm_empty_cache(a)); /* Q and P out of the thread cache */
    CHECK_OK(vmm_check(a));
    CHECK_EQ(reserved(a), 16 * MiB);
    race.a = a;
    race.size = 1 * MiB + 512 * 1024;
    race.got = NULL;
    race.real = a->drv->ops;
    race.ops = *race.real;
    race.ops.mem_map = race_mem_map;
    a->drv->ops = &race.ops;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, race_thread, NULL), 0);
    pthread_mutex_lock(&race.mu);
    race_wait(&race.armed);
    pthread_mutex_unlock(&race.mu);
    void *x = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &x));
    pthread_join(t, NULL);
    a->drv->ops = race.real;
    CHECK(race.done);
    CHECK_OK(race.rc);
    char *b = race.got;
    CHECK(b != NULL && x != NULL);
    CHECK_OK(vmm_check(a));
    if (b && x) {
        fill(a, b, race.size, 51);
        fill(a, x, 3 * MiB, 52);
        CHECK(intact(a, b, race.size, 51));
        CHECK(intact(a, x, 3 * MiB, 52));
        give(a, b);
        give(a, x);
    }
    give(a, s);
    give(a, w);
    give(a, r);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_EQ(reserved(a), 0);
    vmm_destroy(a);
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* The history trace's segment_map / segment_unmap ranges replayed forward (PyTorch's viewer replays
 * them back from a snapshot's segments, which leave SHADOW bytes out): a map covers bytes no
 * earlier map holds, an unmap only bytes one does, and the bytes held add up to reserved bytes.
 * Returns those bytes, -1 when a rule is broken. */
static int64_t trace_mapped(vmm_allocator *a)
{
    enum { N = 4096, R = 256 };
    static vmm_trace_entry e[N];
    uintptr_t lo[R], hi[R];
    size_t n = 0;
    int64_t got = vmm_history_get(a, e, N), held = 0;
    CHECK(got >= 0 && got < N);
    for (int64_t k = 0; k < got; k++) {
        uintptr_t x = e[k].addr, y = x + e[k].size;
        if (e[k].action == VMM_TRACE_SEGMENT_MAP) {
            for (size_t j = 0; j < n; j++)
                if (x < hi[j] && lo[j] < y)
                    return -1;
            if (n == R)
                return -1;
            lo[n] = x, hi[n++] = y;
            held += (int64_t)(y - x);
        } else if (e[k].action == VMM_TRACE_SEGMENT_UNMAP) {
            size_t covered = 0;
            for (size_t j = 0; j < n; j++)
                if (x < hi[j] && lo[j] < y)
                    covered += (hi[j] < y ? hi[j] : y) - (lo[j] > x ? lo[j] : x);
            if (covered != y - x)
                return -1;
            for (size_t j = 0; j < n;) {
                if (!(x < hi[j] && lo[j] < y)) {
                    j++;
                    continue;
                }
                uintptr_t l = lo[j], h = hi[j];
                lo[j] = lo[--n], hi[j] = hi[n]; /* out; its parts outside [x, y) back in */
                if (l < x)
                    lo[n] = l, hi[n++] = x;
                if (h > y)
                    lo[n] = y, hi[n++] = h;
            }
            held -= (int64_t)(y - x);
        }
    }
    return held;
}

/* With history on, the tail case in both free orders: the trace's mapped bytes are reserved
 * bytes after every step (no cached handles at these points). */
static void trace_views(void)
{
    for (int order = 0; order < 2; order++) {
        vmm_allocator *a = make(1, 64 * MiB);
        if (!a)
            return;
        CHECK_OK(vmm_record_history(a, 4000));
        char *pa = take(a, 3 * MiB), *s = take(a, 5 * MiB);
        give(a, pa);
        char *b = take(a, 5 * MiB);
        CHECK_EQ(a->n_aliases, 1);
        CHECK_EQ(trace_mapped(a), reserved(a));
        give(a, order ? b : s);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(a->n_aliases, 0);
        CHECK_EQ(trace_mapped(a), reserved(a));
        give(a, order ? s : b);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(trace_mapped(a), 0);
        CHECK_EQ(reserved(a), 0);
        vmm_destroy(a);
    }
}

/* Driver refusals on the alias paths, injected by wrapping the driver's ops: the next fail_map
 * mem_map calls, fail_access set_access calls, fail_unmap mem_unmap calls fail. */
static struct {
    const vmm_driver_ops *real;
    vmm_driver_ops ops;
    int fail_map, fail_access, fail_unmap;
    uintptr_t refuse_va; /* mem_unmap of the range at this address always fails (0: none) */
    uintptr_t last_map_va;
} flt;

static int flt_mem_map(vmm_driver *d, uintptr_t va, size_t size, size_t offset, vmm_phys h)
{
    if (flt.fail_map > 0) {
        flt.fail_map--;
        return 1; /* any nonzero driver result */
    }
    flt.last_map_va = va;
    return flt.real->mem_map(d, va, size, offset, h);
}

static int flt_set_access(vmm_driver *d, uintptr_t va, size_t size)
{
    if (flt.fail_access > 0) {
        flt.fail_access--;
        return 1;
    }
    return flt.real->set_access(d, va, size);
}

static int flt_mem_unmap(vmm_driver *d, uintptr_t va, size_t size)
{
    if (flt.fail_unmap > 0 || (flt.refuse_va && va == flt.refuse_va)) {
        flt.fail_unmap -= flt.fail_unmap > 0;
        return 1;
    }
    return flt.real->mem_unmap(d, va, size);
}

static void flt_install(vmm_allocator *a)
{
    flt.real = a->drv->ops;
    flt.ops = *flt.real;
    flt.ops.mem_map = flt_mem_map;
    flt.ops.set_access = flt_set_access;
    flt.ops.mem_unmap = flt_mem_unmap;
    flt.fail_map = flt.fail_access = flt.fail_unmap = 0;
    flt.refuse_va = flt.last_map_va = 0;
    a->drv->ops = &flt.ops;
}

/* drop_view refused by the driver: the tail case's B freed, the view's unmap always refused:
 * empty_cache reports it and leaves the view with its free bytes indexed again (vmm_check; a
 * 1.5 MiB malloc takes them); once the driver unmaps, empty_cache drops it. */
static void drop_refused(void)
{
    char *s, *b;
    vmm_allocator *a = tail_case(1, &s, &b);
    if (!a)
        return;
    flt_install(a);
    flt.refuse_va = (uintptr_t)s + 9 * MiB; /* the view: B's last page */
    give(a, b);
    int rc = vmm_empty_cache(a);
    CHECK(rc == VMM_OK || rc == VMM_EDRIVER);
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 1);
    char *c = take(a, 1 * MiB + 512 * 1024);
    CHECK(c != NULL);
    if (c) {
        fill(a, c, 1 * MiB + 512 * 1024, 63);
        CHECK(intact(a, c, 1 * MiB + 512 * 1024, 63));
        give(a, c);
    }
    CHECK(intact(a, s, 5 * MiB, 11));
    flt.refuse_va = 0;
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 0);
    give(a, s);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_EQ(reserved(a), 0);
    a->drv->ops = flt.real;
    vmm_destroy(a);
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* The tail case's B (its last page a view of page 1) with the alias's mem_map refused (kind 0),
 * its set_access refused and the unmap made (1), its set_access refused and every unmap of it
 * refused (2: a view that owns nothing stays mapped). The malloc fails with VMM_EDRIVER and the
 * allocator is intact (vmm_check), B succeeds on a retry, S's data stays; with kind 2, S freed and
 * empty_cache while the driver still refuses unmaps must not give page 1's handle back while its
 * other view maps it. Everything freed: reserved 0, nothing left on the device. */
static void alias_faults(void)
{
    for (int kind = 0; kind < 3; kind++) {
        vmm_allocator *a = make(1, 64 * MiB);
        if (!a)
            return;
        flt_install(a);
        char *pa = take(a, 3 * MiB), *s = take(a, 5 * MiB);
        fill(a, s, 5 * MiB, 61);
        give(a, pa);
        if (kind == 0)
            flt.fail_map = 1;
        else
            flt.fail_access = 1;
        if (kind == 2) /* B's last page, [12M, 14M) from pa: the view refuses every unmap */
            flt.refuse_va = (uintptr_t)s + 9 * MiB;
        void *b = NULL;
        int rc = vmm_malloc(a, 5 * MiB, NULL, &b);
        CHECK_EQ(rc, VMM_EDRIVER);
        CHECK_OK(vmm_check(a));
        CHECK_EQ(flt.fail_map + flt.fail_access + flt.fail_unmap, 0);
        CHECK(intact(a, s, 5 * MiB, 61));
        if (kind == 2) {
            CHECK_EQ(a->n_aliases, 1);
            CHECK_EQ(flt.last_map_va, flt.refuse_va);
            give(a, s);
            /* the refused unmap is reported; page 1's first view must stay (its handle mapped) */
            rc = vmm_empty_cache(a);
            CHECK(rc == VMM_OK || rc == VMM_EDRIVER);
            CHECK_OK(vmm_check(a));
            CHECK_EQ(a->n_aliases, 1);
            CHECK_EQ(reserved(a), 2 * MiB);
            flt.refuse_va = 0;
            s = take(a, 5 * MiB);
            fill(a, s, 5 * MiB, 61);
        }
        b = take(a, 5 * MiB);
        fill(a, b, 5 * MiB, 62);
        CHECK(intact(a, s, 5 * MiB, 61));
        CHECK(intact(a, b, 5 * MiB, 62));
        give(a, s);
        give(a, b);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK_EQ(reserved(a), 0);
        CHECK_EQ(a->n_aliases, 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* A view's bytes freed while stream work queued before the free still writes them (the
 * caching rule: a free is stream ordered) must not be unmapped before that work has run, as no
 * page is (vmm_block_idle): the tail case's B gets a fill of its last MiB, through the view, queued
 * behind a held kernel; B freed; empty_cache keeps the view; once the stream has run, it drops
 * it. Simulator only (the gate is a simulated kernel). */
static void queued_work(void)
{
    if (on_double())
        return;
    char *s, *b;
    vmm_allocator *a = tail_case(1, &s, &b);
    if (!a)
        return;
    CHECK_EQ(a->n_aliases, 1);
    vmm_test_gate g = {0};
    CHECK_OK(vmm_sim_launch(a, NULL, vmm_test_gate_wait, &g));
    CHECK_OK(vmm_sim_memset32(a, b + 4 * MiB, 0x5a5a5a5a, MiB / 4, NULL));
    give(a, b);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 1); /* else the fill below writes an unmapped page */
    atomic_store(&g.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 0);
    CHECK(intact(a, s, 5 * MiB, 11));
    give(a, s);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_EQ(reserved(a), 0);
    vmm_destroy(a);
    vmm_test_check_no_sim_leaks();
}

/* View 0's shadow is the free block the other view took; work queued on its stream before that
 * free may still read it through view 0's addresses. The blocks beside it need not carry that
 * stamp: S, used on a second stream (record_stream) and freed first, turns FREE with its earlier
 * stamp once that stream's event completes, after pa (the shadow's bytes) was freed behind held
 * work on the default stream. Page 1 is then [pa's MiB, a SHADOW][S's MiB, FREE and idle]; the view
 * must stay mapped until the default stream ran pa's work (before the fix, vmm_alias_reclaim
 * dropped it and the fill below read an unmapped page: vmm-stress seed 74, 4 threads,
 * ipc:false,alias_pages:true,alias_place:true). Simulator only (the gates are simulated kernels). */
static void shadow_queued_work(void)
{
    if (on_double())
        return;
    vmm_allocator *a = make_conf(1, 64 * MiB, ",alias_place:true");
    if (!a)
        return;
    vmm_stream st2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &st2));
    char *pa = take(a, 3 * MiB), *s = take(a, 5 * MiB);
    CHECK_EQ((uintptr_t)s, (uintptr_t)pa + 3 * MiB);
    vmm_test_gate g2 = {0}, g1 = {0};
    CHECK_OK(vmm_sim_launch(a, st2, vmm_test_gate_wait, &g2));
    CHECK_OK(vmm_record_stream(a, s, st2));
    give(a, s); /* deferred: its event on st2 waits behind g2 */
    CHECK_OK(vmm_empty_cache(a)); /* a fence past S's stamp on the default stream, completed */
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_sim_launch(a, NULL, vmm_test_gate_wait, &g1));
    CHECK_OK(vmm_sim_memset32(a, pa + 2 * MiB, 0x5a5a5a5a, MiB / 4, NULL));
    give(a, pa);
    char *b = take(a, 5 * MiB); /* its last page: page 1 again, pa's free MiB */
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 1);
    atomic_store(&g2.open, 1);
    /* S's event completes once g2 has ended: empty_cache takes S then */
    for (int k = 0; k < 2000 && a->pending[VMM_LARGE].current; k++) {
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
        CHECK_OK(vmm_empty_cache(a));
    }
    CHECK_EQ(a->pending[VMM_LARGE].current, 0);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 1); /* else the fill below reads an unmapped page */
    atomic_store(&g1.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(a->n_aliases, 0); /* pa's work ran: view 0 goes */
    give(a, b);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    CHECK_EQ(reserved(a), 0);
    CHECK_OK(vmm_sim_stream_destroy(a, st2));
    vmm_destroy(a);
    vmm_test_check_no_sim_leaks();
}

int main(void)
{
    place_stayer();
    place_tail_gap();
    place_reuse();
    tail();
    head();
    full_device();
    destroy_mapped();
    lane_race();
    trace_views();
    alias_faults();
    drop_refused();
    queued_work();
    shadow_queued_work();
    TEST_DONE();
}
