// ctest-labels: unit
/* Growth creates its physical handles with the allocator lock released (segment.c): threads grow
 * (large allocations that need new handles, on their own streams and on a shared one) while others
 * malloc and free cached blocks, call vmm_check and vmm_empty_cache; every check passes and nothing
 * leaks. Then, with mem_create taking real time (sim_real_time_create), a cached malloc on another
 * stream completes while a create is in flight: counted, not timed. Last, untagged memory is put
 * to sleep while a growth into it is in flight. The timed runs use handles of up to 20 MiB: with
 * the default of one handle per 2 MiB page a 64 MiB growth is 32 creates, and the test took 45 s
 * (past its 120 s limit under load) instead of about 2 s. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

static vmm_allocator *A;
static atomic_int growers_left;

enum { GROW_LIVE = 4 };
static int grow_iters;

typedef struct targ {
    vmm_stream s;
    unsigned id;
    int errors;
    long hits;
} targ;

static uint64_t rnd(uint64_t *x)
{
    *x ^= *x << 13, *x ^= *x >> 7, *x ^= *x << 17;
    return *x;
}

/* Large allocations of new sizes: most need new handles. */
static void *grower(void *arg)
{
    targ *t = arg;
    void *p[GROW_LIVE] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull ^ (t->id * 7919u + 1);
    for (int it = 0; it < grow_iters; it++) {
        int i = (int)(rnd(&x) % GROW_LIVE);
        if (p[i]) {
            if (vmm_free(A, p[i]))
                t->errors++;
            p[i] = NULL;
        }
        size_t n = (size_t)(rnd(&x) % (120u << 20)) + (3u << 20);
        if (vmm_malloc(A, n, t->s, &p[i]) || !p[i])
            t->errors++;
    }
    for (int i = 0; i < GROW_LIVE; i++)
        if (p[i] && vmm_free(A, p[i]))
            t->errors++;
    atomic_fetch_sub(&growers_left, 1);
    return NULL;
}

/* Cached large blocks, checks and cache trims while the growers grow. */
static void *cached(void *arg)
{
    targ *t = arg;
    uint64_t x = 88172645463325252ull ^ t->id;
    for (int it = 0; atomic_load(&growers_left) > 0; it++) {
        void *p = NULL;
        size_t n = (size_t)(rnd(&x) % 4 + 2) << 20;
        if (vmm_malloc(A, n, t->s, &p) || !p)
            t->errors++;
        else if (vmm_free(A, p))
            t->errors++;
        if (it % 16 == 0 && vmm_check(A)) {
            fprintf(stderr, "vmm_check: %s\n", vmm_last_error());
            t->errors++;
        }
        if (it % 200 == 199 && vmm_empty_cache(A))
            t->errors++;
    }
    return NULL;
}

static void stress(const char *conf, int iters)
{
    grow_iters = iters;
    CHECK_OK(vmm_create(conf, &A));
    if (!A)
        return;
    enum { GROWERS = 3, CACHED = 2 };
    pthread_t th[GROWERS + CACHED];
    targ ta[GROWERS + CACHED];
    vmm_stream shared;
    CHECK_OK(vmm_sim_stream_create(A, &shared));
    atomic_store(&growers_left, GROWERS);
    for (unsigned i = 0; i < GROWERS + CACHED; i++) {
        ta[i] = (targ){NULL, i + 1, 0, 0};
        /* two growers share a stream: one may take the free block another's growth extends */
        if (i < 2)
            ta[i].s = shared;
        else
            CHECK_OK(vmm_sim_stream_create(A, &ta[i].s));
    }
    for (unsigned i = 0; i < GROWERS + CACHED; i++)
        pthread_create(&th[i], NULL, i < GROWERS ? grower : cached, &ta[i]);
    for (unsigned i = 0; i < GROWERS + CACHED; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(ta[i].errors, 0);
    }
    CHECK_OK(vmm_check(A));
    vmm_stats s;
    CHECK_OK(vmm_get_stats(A, &s));
    CHECK_EQ(s.allocation[0].current, 0);
    CHECK_EQ(s.num_ooms, 0);
    CHECK_OK(vmm_empty_cache(A));
    CHECK_OK(vmm_check(A));
    vmm_destroy(A);
    A = NULL;
}

/* One grower (64 MiB at a time, kept: every malloc grows), one thread on another stream freeing
 * and reallocating a small block beside a live one (its page stays mapped: never recycled). A hit:
 * the same create was in flight before and after that malloc / free pair, which the allocator lock
 * held across mem_create would make impossible. */
enum { LOCKSTEP_GROWS = 16 };

static void *lockstep_grower(void *arg)
{
    targ *t = arg;
    void *p[LOCKSTEP_GROWS] = {0};
    for (int i = 0; i < LOCKSTEP_GROWS; i++)
        if (vmm_malloc(A, 64u << 20, t->s, &p[i]) || !p[i])
            t->errors++;
    for (int i = 0; i < LOCKSTEP_GROWS; i++)
        if (p[i] && vmm_free(A, p[i]))
            t->errors++;
    atomic_fetch_sub(&growers_left, 1);
    return NULL;
}

static void *lockstep_cached(void *arg)
{
    targ *t = arg;
    void *keep = NULL;
    if (vmm_malloc(A, 4096, t->s, &keep) || !keep)
        t->errors++;
    while (atomic_load(&growers_left) > 0) {
        vmm_sim_counters c1, c2;
        if (vmm_sim_get_counters(A, &c1))
            t->errors++;
        if (!c1.creates_in_flight)
            continue;
        void *p = NULL;
        if (vmm_malloc(A, 4096, t->s, &p) || !p || vmm_free(A, p))
            t->errors++;
        if (vmm_sim_get_counters(A, &c2))
            t->errors++;
        if (c2.creates_in_flight && c2.calls[VMM_SIM_CALL_MEM_CREATE] == c1.calls[VMM_SIM_CALL_MEM_CREATE])
            t->hits++;
    }
    if (keep && vmm_free(A, keep))
        t->errors++;
    return NULL;
}

static void lockstep(int unlocked)
{
    /* 5 ms per create: a cached malloc needs microseconds */
    char conf[256];
    snprintf(conf, sizeof conf, "driver:sim,sim_capacity:4G,sim_backed:false,thread_cache:0,"
             "sim_real_time_create:true,sim_cost_ns:[mem_create:5000000],max_handle_size:20M,grow_unlocked:%s",
             unlocked ? "true" : "false");
    CHECK_OK(vmm_create(conf, &A));
    if (!A)
        return;
    targ g = {NULL, 1, 0, 0}, c = {NULL, 2, 0, 0};
    CHECK_OK(vmm_sim_stream_create(A, &g.s));
    CHECK_OK(vmm_sim_stream_create(A, &c.s));
    atomic_store(&growers_left, 1);
    pthread_t tg, tc;
    pthread_create(&tc, NULL, lockstep_cached, &c);
    pthread_create(&tg, NULL, lockstep_grower, &g);
    pthread_join(tg, NULL);
    pthread_join(tc, NULL);
    CHECK_EQ(g.errors, 0);
    CHECK_EQ(c.errors, 0);
    /* the control: with the lock held across a growth's creates no malloc completes between two
     * looks at one create in flight */
    if (unlocked)
        CHECK(c.hits > 0);
    else
        CHECK_EQ(c.hits, 0);
    vmm_sim_counters k;
    CHECK_OK(vmm_sim_get_counters(A, &k));
    CHECK(k.calls[VMM_SIM_CALL_MEM_CREATE] >= LOCKSTEP_GROWS);
    CHECK_EQ(k.creates_in_flight, 0);
    /* the stats JSON counts the growths that let the lock go */
    static char js[1 << 16];
    CHECK(vmm_stats_json(A, js, sizeof js) > 0);
    const char *u = strstr(js, "\"growths_unlocked\":");
    CHECK(u != NULL);
    if (u && unlocked)
        CHECK(atoll(strchr(u, ':') + 1) >= LOCKSTEP_GROWS);
    else if (u)
        CHECK_EQ(atoll(strchr(u, ':') + 1), 0);
    CHECK_OK(vmm_check(A));
    vmm_destroy(A);
    A = NULL;
    fprintf(stderr, "grow_unlocked:%s: cached mallocs completed during one create: %ld\n",
            unlocked ? "true" : "false", c.hits);
}

/* Untagged memory put to sleep while a growth into it creates its handles: the growth gives its
 * handles and range back and fails (or, if it finished first, the block sleeps); checks pass
 * throughout, and after the wake memory is allocated again. */
typedef struct sleeper_arg {
    vmm_stream s;
    void *p;
    int rc;
} sleeper_arg;

static void *sleep_grower(void *arg)
{
    sleeper_arg *t = arg;
    t->rc = vmm_malloc(A, 64u << 20, t->s, &t->p);
    return NULL;
}

static void sleep_meanwhile(void)
{
    CHECK_OK(vmm_create("driver:sim,sim_capacity:4G,sim_backed:false,thread_cache:0,"
                        "sim_real_time_create:true,sim_cost_ns:[mem_create:40000000],max_handle_size:20M", &A));
    if (!A)
        return;
    sleeper_arg t = {NULL, NULL, 0};
    CHECK_OK(vmm_sim_stream_create(A, &t.s));
    pthread_t th;
    pthread_create(&th, NULL, sleep_grower, &t);
    vmm_sim_counters c;
    do
        CHECK_OK(vmm_sim_get_counters(A, &c));
    while (!c.creates_in_flight && c.calls[VMM_SIM_CALL_MEM_CREATE] == 0);
    const char *untagged[] = {""};
    CHECK_OK(vmm_sleep(A, untagged, 1, VMM_SLEEP_DISCARD));
    CHECK_OK(vmm_check(A)); /* the growth is most likely still in flight */
    pthread_join(th, NULL);
    /* finished before the sleep, or failed as any malloc under a sleeping tag does (the growth
     * gives up, and alloc.c's retry meets vmm_lane_get's refusal) */
    CHECK(t.rc == VMM_OK || t.rc == VMM_EINVAL);
    CHECK_OK(vmm_check(A));
    CHECK_OK(vmm_wake(A, untagged, 1));
    CHECK_OK(vmm_check(A));
    void *q = NULL;
    CHECK_OK(vmm_malloc(A, 64u << 20, t.s, &q));
    CHECK_OK(vmm_check(A));
    CHECK_OK(vmm_free(A, q));
    if (t.p)
        CHECK_OK(vmm_free(A, t.p));
    CHECK_OK(vmm_empty_cache(A));
    CHECK_OK(vmm_check(A));
    vmm_destroy(A);
    A = NULL;
    fprintf(stderr, "growth meeting a sleep: %s\n", t.rc ? "gave back and failed" : "finished first");
}

int main(void)
{
    /* instant creates: many windows, checks between them */
    stress("driver:sim,sim_capacity:8G,sim_backed:false,thread_cache:0", 3000);
    /* creates that last (0.5 ms): vmm_check and empty_cache meet growths in flight */
    stress("driver:sim,sim_capacity:8G,sim_backed:false,thread_cache:0,sim_real_time_create:true,"
           "sim_cost_ns:[mem_create:500000],max_handle_size:20M", 30);
    lockstep(1);
    lockstep(0);
    sleep_meanwhile();
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes + g.live_handles + g.mapped_bytes + g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_events + g.live_streams, 0);
    TEST_DONE();
}
