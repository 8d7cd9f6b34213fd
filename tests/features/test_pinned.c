// ctest-labels: unit
// ctest-timeout: 120
/*
 * Pinned host memory on the simulated driver (backed): size classes, stream-ordered reuse through
 * events (never before a slow launch ends, and malloc does not wait for it), record_stream, stats,
 * empty cache, bad pointers, injected failures, threads, and no leak after vmm_destroy.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define CONF "driver:sim,sim_capacity:1G,sim_backed:true"

/* A launch that holds its stream until the test opens the gate. */
typedef struct gate {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int open, entered;
} gate;

static void gate_init(gate *g)
{
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->open = g->entered = 0;
}

static void gate_wait_fn(void *arg)
{
    gate *g = arg;
    pthread_mutex_lock(&g->mu);
    g->entered = 1;
    pthread_cond_broadcast(&g->cv);
    while (!g->open)
        pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

static void gate_open(gate *g)
{
    pthread_mutex_lock(&g->mu);
    g->open = 1;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

static void gate_destroy(gate *g)
{
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static vmm_pinned_stats pstats(vmm_allocator *a)
{
    vmm_pinned_stats s;
    memset(&s, 0xff, sizeof s);
    CHECK_OK(vmm_pinned_get_stats(a, &s));
    return s;
}

static void test_classes_and_stats(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    vmm_pinned_stats s = pstats(a);
    CHECK_EQ(s.reserved_bytes.current, 0); /* nothing before the first call */

    /* size classes: powers of two from 512 */
    const size_t req[] = {1, 512, 513, 4096, 5000, 1 << 20};
    const size_t cls[] = {512, 512, 1024, 4096, 8192, 1 << 20};
    void *p[6];
    size_t total_cls = 0, total_req = 0;
    for (int i = 0; i < 6; i++) {
        CHECK_OK(vmm_pinned_malloc(a, req[i], NULL, &p[i]));
        CHECK(p[i] != NULL);
        CHECK_EQ(vmm_pinned_usable_size(a, p[i]), cls[i]);
        memset(p[i], 0x5a, req[i]); /* real host memory */
        total_cls += cls[i];
        total_req += req[i];
    }
    s = pstats(a);
    CHECK_EQ(s.allocations.current, 6);
    CHECK_EQ(s.allocated_bytes.current, total_cls);
    CHECK_EQ(s.requested_bytes.current, total_req);
    CHECK_EQ(s.reserved_bytes.current, total_cls);
    CHECK_EQ(s.segments.current, 6);
    CHECK_EQ(s.num_host_alloc, 6);
    CHECK_EQ(s.num_reuses, 0);
    vmm_sim_counters c;
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.calls[VMM_SIM_CALL_HOST_ALLOC], 6);
    CHECK_EQ(c.live_host_allocs, 6);
    CHECK(c.host_bytes >= total_cls);
    CHECK_EQ(c.phys_bytes, 0); /* host memory is not charged to the device */

    /* size 0 and too large */
    void *z = (void *)1;
    CHECK_OK(vmm_pinned_malloc(a, 0, NULL, &z));
    CHECK(z == NULL);
    CHECK_EQ(vmm_pinned_malloc(a, SIZE_MAX, NULL, &z), VMM_EINVAL);
    CHECK_EQ(vmm_pinned_malloc(a, 64, NULL, NULL), VMM_EINVAL);

    for (int i = 0; i < 6; i++)
        CHECK_OK(vmm_pinned_free(a, p[i]));
    s = pstats(a);
    CHECK_EQ(s.allocations.current, 0);
    CHECK_EQ(s.allocations.peak, 6);
    CHECK_EQ(s.allocated_bytes.current, 0);
    CHECK_EQ(s.allocated_bytes.peak, total_cls);
    CHECK_EQ(s.reserved_bytes.current, total_cls); /* cached, not returned */
    CHECK_EQ(s.pending_blocks + s.cached_blocks, 6);

    /* once the default stream ran past the frees, the same sizes are served from the cache */
    CHECK_OK(vmm_sim_synchronize(a));
    for (int i = 0; i < 6; i++) {
        void *q = NULL;
        CHECK_OK(vmm_pinned_malloc(a, cls[i], NULL, &q));
        CHECK(q != NULL);
        CHECK_OK(vmm_pinned_free(a, q));
        CHECK_OK(vmm_sim_synchronize(a));
    }
    s = pstats(a);
    CHECK_EQ(s.num_host_alloc, 6);
    CHECK_EQ(s.num_reuses, 6);

    char json[4096];
    int n = vmm_pinned_stats_json(a, json, sizeof json);
    CHECK(n > 0);
    CHECK(strstr(json, "\"pinned.reserved_bytes.current\":") != NULL);
    CHECK(strstr(json, "\"pinned.num_reuses\":6") != NULL);
    CHECK_EQ(vmm_pinned_stats_json(a, json, 16), VMM_ERANGE);
    CHECK_EQ(strlen(json), 15);

    CHECK_OK(vmm_pinned_reset_stats(a, 1));
    s = pstats(a);
    CHECK_EQ(s.allocations.peak, 0);
    CHECK_EQ(s.num_reuses, 0);

    /* empty cache returns everything */
    CHECK_OK(vmm_pinned_empty_cache(a));
    s = pstats(a);
    CHECK_EQ(s.reserved_bytes.current, 0);
    CHECK_EQ(s.segments.current, 0);
    CHECK_EQ(s.cached_blocks, 0);
    CHECK_OK(vmm_sim_get_counters(a, &c));
    CHECK_EQ(c.live_host_allocs, 0);
    CHECK_EQ(c.host_bytes, 0);
    CHECK_EQ(c.calls[VMM_SIM_CALL_HOST_FREE], 6);
    vmm_destroy(a);
}

/* A block used by a slow launch is not handed out again before the launch ends, and malloc does
 * not wait for it meanwhile. */
static void test_reuse_waits_for_events(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    vmm_stream s;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    gate g;
    gate_init(&g);
    void *blk = NULL, *other = NULL, *again = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 64 << 10, s, &blk));
    CHECK_OK(vmm_sim_launch(a, s, gate_wait_fn, &g)); /* "a copy still reading blk" */
    CHECK_OK(vmm_pinned_free(a, blk));
    for (int i = 0; i < 5; i++) {
        unsigned long long t0 = vmm_test_now_ns();
        CHECK_OK(vmm_pinned_malloc(a, 64 << 10, s, &other));
        unsigned long long dt = vmm_test_now_ns() - t0;
        CHECK(other != NULL && other != blk);
        CHECK(dt < 500ull * 1000 * 1000); /* did not wait for the gate */
        CHECK_OK(vmm_pinned_free(a, other)); /* queued behind the gate as well */
        vmm_test_sleep_ms(10);
    }
    vmm_pinned_stats st = pstats(a);
    CHECK_EQ(st.pending_blocks, 6);  /* blk and the five others, all behind the gate */
    CHECK_EQ(st.num_event_waits, 0);

    /* empty cache leaves pending blocks alone */
    CHECK_OK(vmm_pinned_empty_cache(a));
    st = pstats(a);
    CHECK_EQ(st.reserved_bytes.current, 6 * (64 << 10));

    gate_open(&g);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_pinned_malloc(a, 64 << 10, s, &again));
    CHECK(again != NULL);
    st = pstats(a);
    CHECK_EQ(st.num_host_alloc, 6); /* served from the cache once the gate opened */
    CHECK_EQ(st.num_reuses, 1);
    CHECK_OK(vmm_pinned_free(a, again));
    vmm_destroy(a);
    gate_destroy(&g);
}

/* Take blocks of `size` on `stream` until blk comes back or `ms` pass; the others are kept in
 * keep[] (freed by the caller). Returns 1 when blk came back. */
static int reuse_within(vmm_allocator *a, void *blk, size_t size, vmm_stream stream, unsigned ms,
                        void **keep, int *n_keep, int cap)
{
    unsigned long long end = vmm_test_now_ns() + (unsigned long long)ms * 1000000ull;
    while (vmm_test_now_ns() < end && *n_keep < cap) {
        void *q = NULL;
        CHECK_OK(vmm_pinned_malloc(a, size, stream, &q));
        if (q == blk)
            return 1;
        keep[(*n_keep)++] = q;
        vmm_test_sleep_ms(5);
    }
    return 0;
}

static void test_record_stream(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    vmm_stream s1, s2;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    enum { CAP = 64 };
    void *keep[CAP];
    int n_keep = 0;

    /* without record_stream, work on s2 does not hold the block back */
    gate g1;
    gate_init(&g1);
    void *blk = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 8192, s1, &blk));
    CHECK_OK(vmm_sim_launch(a, s2, gate_wait_fn, &g1));
    CHECK_OK(vmm_pinned_free(a, blk));
    CHECK(reuse_within(a, blk, 8192, s1, 2000, keep, &n_keep, CAP));
    CHECK_OK(vmm_pinned_free(a, blk));
    gate_open(&g1);
    CHECK_OK(vmm_sim_synchronize(a));

    /* with record_stream(s2), it waits for s2 */
    gate g2;
    gate_init(&g2);
    CHECK_OK(vmm_pinned_malloc(a, 8192, s1, &blk));
    CHECK_OK(vmm_pinned_record_stream(a, blk, s2));
    CHECK_OK(vmm_pinned_record_stream(a, blk, s2)); /* twice is once */
    CHECK_OK(vmm_pinned_record_stream(a, blk, s1)); /* its own stream: nothing new */
    CHECK_OK(vmm_sim_launch(a, s2, gate_wait_fn, &g2));
    CHECK_OK(vmm_pinned_free(a, blk));
    CHECK(!reuse_within(a, blk, 8192, s1, 200, keep, &n_keep, CAP));
    vmm_pinned_stats st = pstats(a);
    CHECK_EQ(st.pending_blocks, 1);
    CHECK(st.num_events >= 2); /* one event per used stream */
    gate_open(&g2);
    CHECK_OK(vmm_sim_synchronize(a));
    int n_before = n_keep;
    CHECK(reuse_within(a, blk, 8192, s1, 2000, keep, &n_keep, CAP));
    CHECK_EQ(n_keep, n_before); /* came back on the first try */
    CHECK_OK(vmm_pinned_free(a, blk));
    for (int i = 0; i < n_keep; i++)
        CHECK_OK(vmm_pinned_free(a, keep[i]));
    vmm_destroy(a);
    gate_destroy(&g1);
    gate_destroy(&g2);
}

static void test_bad_pointers(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    int local;
    /* before any pinned call */
    CHECK_EQ(vmm_pinned_free(a, &local), VMM_EBADPTR);
    CHECK_EQ(vmm_pinned_record_stream(a, &local, NULL), VMM_EBADPTR);
    CHECK_OK(vmm_pinned_free(a, NULL));
    CHECK_OK(vmm_pinned_empty_cache(a));
    CHECK_EQ(vmm_pinned_free(NULL, &local), VMM_EINVAL);

    void *p = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 3000, NULL, &p));
    vmm_pinned_stats before = pstats(a);
    CHECK_EQ(vmm_pinned_free(a, &local), VMM_EBADPTR);
    CHECK(strstr(vmm_last_error(), "vmm_pinned_free") != NULL);
    CHECK_EQ(vmm_pinned_free(a, (char *)p + 8), VMM_EBADPTR);
    CHECK_EQ(vmm_pinned_record_stream(a, (char *)p + 8, NULL), VMM_EBADPTR);
    vmm_pinned_stats after = pstats(a);
    CHECK(memcmp(&before, &after, sizeof before) == 0);
    /* device free of a pinned pointer is refused too */
    CHECK_EQ(vmm_free(a, p), VMM_EBADPTR);
    CHECK_OK(vmm_pinned_free(a, p));
    CHECK_EQ(vmm_pinned_free(a, p), VMM_EBADPTR);
    CHECK(strstr(vmm_last_error(), "already freed") != NULL);
    CHECK_EQ(vmm_pinned_record_stream(a, p, NULL), VMM_EBADPTR);
    CHECK_EQ(vmm_pinned_usable_size(a, p), 0);
    vmm_destroy(a);
}

static void test_injected_failures(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    void *small = NULL, *big = NULL;
    /* a cached block of another class, then host_alloc fails once: the cache is released and the
     * retry succeeds */
    CHECK_OK(vmm_pinned_malloc(a, 4096, NULL, &small));
    CHECK_OK(vmm_pinned_free(a, small));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_pinned_malloc(a, 512, NULL, &big)); /* polls: small becomes cached */
    CHECK_OK(vmm_pinned_free(a, big));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_HOST_ALLOC, 1));
    CHECK_OK(vmm_pinned_malloc(a, 1 << 16, NULL, &big));
    CHECK(big != NULL);
    vmm_pinned_stats s = pstats(a);
    CHECK_EQ(s.num_host_free, 2);      /* the cached 4096 and 512 blocks went back */
    CHECK_EQ(s.segments.current, 1);

    /* host memory exhausted for good: EHOSTMEM with a report, state unchanged */
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_HOST_ALLOC, 1.0, 7));
    void *x = (void *)1;
    CHECK_EQ(vmm_pinned_malloc(a, 1 << 20, NULL, &x), VMM_EHOSTMEM);
    CHECK(x == NULL);
    CHECK(strstr(vmm_last_error(), "cannot pin") != NULL);
    vmm_pinned_stats s2 = pstats(a);
    CHECK(memcmp(&s, &s2, sizeof s) == 0);
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_HOST_ALLOC, 0.0, 7));

    /* event_record fails at free: the free succeeds all the same (a caller that cannot retry a
     * failed free would leak the block), the use is recorded by the next poll */
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_EVENT_RECORD, 1));
    CHECK_OK(vmm_pinned_free(a, big));
    CHECK_EQ(vmm_pinned_usable_size(a, big), 0);
    CHECK_EQ(vmm_pinned_free(a, big), VMM_EBADPTR);
    s = pstats(a);
    CHECK_EQ(s.allocations.current, 0);
    CHECK_EQ(s.pending_blocks, 1);
    vmm_destroy(a);

    /* the events are taken when the uses are recorded (malloc, record_stream): a free with event
     * creation failing needs none */
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    vmm_stream s1;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_pinned_malloc(a, 1 << 16, NULL, &big));
    CHECK_OK(vmm_pinned_record_stream(a, big, s1));
    s = pstats(a);
    CHECK_EQ(s.num_events, 2);
    CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_EVENT_CREATE, 1.0, 9));
    CHECK_OK(vmm_pinned_free(a, big));
    s = pstats(a);
    CHECK_EQ(s.num_events, 2);
    CHECK_EQ(s.pending_blocks + s.cached_blocks, 1);
    vmm_destroy(a);
}

static vmm_sim_counters sim_counters(vmm_allocator *a)
{
    vmm_sim_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(vmm_sim_get_counters(a, &c));
    return c;
}

/* Allocate `size` on `stream` n times while blk must stay out (kept in keep[]). */
static void check_not_reused(vmm_allocator *a, void *blk, size_t size, vmm_stream stream,
                             void **keep, int n)
{
    for (int i = 0; i < n; i++) {
        CHECK_OK(vmm_pinned_malloc(a, size, stream, &keep[i]));
        CHECK(keep[i] != NULL && keep[i] != blk);
    }
}

/* Event creation fails when the uses are recorded (malloc, record_stream), and, in the second
 * round, at free time too: the free succeeds, the block is not handed out while the used stream
 * is busy (the polls record the uses once events can be had, behind that work), and comes back
 * after it. */
static void test_free_events_create_fails(void)
{
    for (int again_at_free = 0; again_at_free < 2; again_at_free++) {
        vmm_allocator *a = NULL;
        CHECK_OK(vmm_create(CONF, &a));
        if (!a)
            return;
        vmm_stream s1, s2;
        CHECK_OK(vmm_sim_stream_create(a, &s1));
        CHECK_OK(vmm_sim_stream_create(a, &s2));
        gate g;
        gate_init(&g);
        void *blk = NULL, *keep[4];
        CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_EVENT_CREATE, 1.0, 10));
        CHECK_OK(vmm_pinned_malloc(a, 8192, s1, &blk));
        CHECK_OK(vmm_pinned_record_stream(a, blk, s2));
        CHECK_EQ(pstats(a).num_events, 0);
        if (!again_at_free)
            CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_EVENT_CREATE, 0.0, 10));
        CHECK_OK(vmm_sim_launch(a, s2, gate_wait_fn, &g)); /* s2 still reads blk */
        CHECK_OK(vmm_pinned_free(a, blk));
        vmm_pinned_stats st = pstats(a);
        CHECK_EQ(st.allocations.current, 0);
        CHECK_EQ(st.pending_blocks, 1);
        CHECK_EQ(st.num_events, again_at_free ? 0 : 2);
        check_not_reused(a, blk, 8192, s1, keep, 2);
        if (again_at_free) {
            CHECK_EQ(pstats(a).pending_blocks, 1);
            CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_EVENT_CREATE, 0.0, 10));
        }
        check_not_reused(a, blk, 8192, s1, keep + 2, 1); /* this poll records the uses */
        CHECK(pstats(a).num_events >= 2);
        vmm_test_sleep_ms(20);
        check_not_reused(a, blk, 8192, s1, keep + 3, 1);
        CHECK_EQ(pstats(a).pending_blocks, 1);
        gate_open(&g);
        CHECK_OK(vmm_sim_synchronize(a));
        void *q = NULL;
        CHECK_OK(vmm_pinned_malloc(a, 8192, s1, &q));
        CHECK(q == blk); /* the only cached block of its class */
        CHECK_EQ(pstats(a).pending_blocks, 0);
        CHECK_OK(vmm_pinned_free(a, q));
        for (int i = 0; i < 4; i++)
            CHECK_OK(vmm_pinned_free(a, keep[i]));
        vmm_destroy(a);
        gate_destroy(&g);
    }
}

/* event_record fails at free time: the free succeeds, the use stays unrecorded until the next
 * poll records it (behind s2's work), and the block comes back only after that work. */
static void test_free_events_record_fails(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    vmm_stream s1, s2;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    gate g;
    gate_init(&g);
    void *blk = NULL, *keep[3];
    CHECK_OK(vmm_pinned_malloc(a, 4096, s1, &blk));
    CHECK_OK(vmm_pinned_record_stream(a, blk, s2));
    CHECK_OK(vmm_sim_launch(a, s2, gate_wait_fn, &g));
    CHECK_OK(vmm_sim_fail_nth(a, VMM_SIM_CALL_EVENT_RECORD, 2)); /* s2's (s1's is first) */
    CHECK_OK(vmm_pinned_free(a, blk));
    CHECK_EQ(sim_counters(a).failures[VMM_SIM_CALL_EVENT_RECORD], 1);
    CHECK_EQ(pstats(a).pending_blocks, 1);
    check_not_reused(a, blk, 4096, s1, keep, 2);
    vmm_test_sleep_ms(20);
    check_not_reused(a, blk, 4096, s1, keep + 2, 1);
    CHECK_EQ(pstats(a).pending_blocks, 1);
    gate_open(&g);
    CHECK_OK(vmm_sim_synchronize(a));
    void *q = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 4096, s1, &q));
    CHECK(q == blk);
    CHECK_OK(vmm_pinned_free(a, q));
    for (int i = 0; i < 3; i++)
        CHECK_OK(vmm_pinned_free(a, keep[i]));
    vmm_destroy(a);
    gate_destroy(&g);
}

/* No event can ever be created: every free succeeds, empty_cache keeps the pending blocks (their
 * uses are unrecorded), and vmm_destroy waits for their streams and returns everything, also with
 * the stream syncs failing. */
static void test_free_events_never(void)
{
    for (int sync_fails = 0; sync_fails < 2; sync_fails++) {
        vmm_allocator *a = NULL;
        CHECK_OK(vmm_create(CONF, &a));
        if (!a)
            return;
        vmm_stream s1, s2;
        CHECK_OK(vmm_sim_stream_create(a, &s1));
        CHECK_OK(vmm_sim_stream_create(a, &s2));
        CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_EVENT_CREATE, 1.0, 11));
        void *p[6];
        for (int i = 0; i < 6; i++) {
            CHECK_OK(vmm_pinned_malloc(a, (size_t)1024 << i, i % 2 ? s1 : s2, &p[i]));
            CHECK_OK(vmm_pinned_record_stream(a, p[i], i % 2 ? s2 : s1));
        }
        for (int i = 0; i < 5; i++)
            CHECK_OK(vmm_pinned_free(a, p[i]));
        CHECK_OK(vmm_sim_synchronize(a));
        CHECK_OK(vmm_pinned_empty_cache(a));
        vmm_pinned_stats st = pstats(a);
        CHECK_EQ(st.pending_blocks, 5); /* unrecorded: not reusable, not released */
        CHECK_EQ(st.num_events, 0);
        CHECK_EQ(st.segments.current, 6);
        if (sync_fails)
            CHECK_OK(vmm_sim_fail_random(a, VMM_SIM_CALL_STREAM_SYNC, 1.0, 12));
        fprintf(stderr, "(a report of 1 live pinned block is expected next)\n");
        vmm_destroy(a); /* p[5] still live */
        vmm_sim_counters g;
        vmm_sim_global_live(&g);
        CHECK_EQ(g.host_bytes, 0);
        CHECK_EQ(g.live_host_allocs, 0);
        CHECK_EQ(g.live_events, 0);
        CHECK_EQ(g.live_streams, 0);
    }
}

typedef struct worker_arg {
    vmm_allocator *a;
    vmm_stream s;
    unsigned seed;
    int fails;
} worker_arg;

static void *worker(void *argp)
{
    worker_arg *w = argp;
    void *live[8] = {0};
    for (int i = 0; i < 600; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        int k = (int)((w->seed >> 16) % 8);
        if (live[k]) {
            if (((unsigned char *)live[k])[0] != (unsigned char)k)
                w->fails++;
            if (vmm_pinned_free(w->a, live[k]) != VMM_OK)
                w->fails++;
            live[k] = NULL;
        } else {
            size_t size = (size_t)512 << ((w->seed >> 8) % 6);
            if (vmm_pinned_malloc(w->a, size, w->s, &live[k]) != VMM_OK || !live[k])
                w->fails++;
            else
                memset(live[k], k, size);
        }
    }
    for (int k = 0; k < 8; k++)
        if (live[k] && vmm_pinned_free(w->a, live[k]) != VMM_OK)
            w->fails++;
    return NULL;
}

static void test_threads(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    enum { NT = 4 };
    pthread_t t[NT];
    worker_arg w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker_arg){a, NULL, (unsigned)i * 77u + 1u, 0};
        CHECK_OK(vmm_sim_stream_create(a, &w[i].s));
    }
    for (int i = 0; i < NT; i++)
        pthread_create(&t[i], NULL, worker, &w[i]);
    for (int i = 0; i < NT; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].fails, 0);
    }
    vmm_pinned_stats s = pstats(a);
    CHECK_EQ(s.allocations.current, 0);
    CHECK_EQ(s.allocated_bytes.current, 0);
    CHECK(s.num_reuses > 0);
    CHECK_EQ(s.pending_blocks + s.cached_blocks, s.segments.current);
    vmm_destroy(a);
}

/* vmm_destroy with a live block and a pending one (its launch still running) returns everything. */
typedef struct opener {
    gate *g;
} opener;

static void *open_later(void *arg)
{
    vmm_test_sleep_ms(100);
    gate_open(((opener *)arg)->g);
    return NULL;
}

static void test_destroy_returns_all(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(CONF, &a));
    if (!a)
        return;
    vmm_stream s;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    gate g;
    gate_init(&g);
    void *live = NULL, *pend = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 10000, s, &live));
    CHECK_OK(vmm_pinned_malloc(a, 20000, s, &pend));
    CHECK_OK(vmm_sim_launch(a, s, gate_wait_fn, &g));
    CHECK_OK(vmm_pinned_free(a, pend));
    pthread_t t;
    opener o = {&g};
    pthread_create(&t, NULL, open_later, &o);
    fprintf(stderr, "(a report of 1 live pinned block is expected next)\n");
    vmm_destroy(a);
    pthread_join(t, NULL);
    gate_destroy(&g);
}

int main(void)
{
    test_classes_and_stats();
    test_reuse_waits_for_events();
    test_record_stream();
    test_bad_pointers();
    test_injected_failures();
    test_free_events_create_fails();
    test_free_events_record_fails();
    test_free_events_never();
    test_threads();
    test_destroy_returns_all();
    /* nothing of any simulated device is left, pinned memory included */
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.host_bytes, 0);
    CHECK_EQ(g.live_host_allocs, 0);
    CHECK_EQ(g.live_events, 0);
    CHECK_EQ(g.phys_bytes, 0);
    TEST_DONE();
}
