// ctest-labels: unit
// ctest-timeout: 180
/* CUDA graphs on the simulated device: capture, replay, private pools (src/core/capture.c,
 * src/features/mempool.c; the sim's capture model in src/driver/drv_sim.c).
 *  - a captured graph replayed several times, with eager allocations and vmm_empty_cache between
 *    the replays: no eager block ever lies in the graph's memory, the replays' writes are intact and
 *    never reach eager memory (expandable and classic segments);
 *  - two graphs sharing one pool: the pool's memory goes back only when its last user releases it;
 *  - the rules while capturing: no event or fence recorded, no wait, no synchronization (the sim
 *    invalidates a capture that breaks them, and counts what was done); frees of blocks used by
 *    other streams deferred until the capture ended, uses recorded by captured work dropped then;
 *    an OOM that would need a wait fails, saying capture prevented the sync;
 *  - capture modes: another thread allocating (cuMemCreate & co.) during a global-mode capture does
 *    not invalidate it, while the same driver call made by that thread in global mode does;
 *  - a route by filter (PyTorch's: the stream's capture id), a fork into the capture;
 *  - pinned host memory freed while its stream captures: no event recorded into the capture;
 *  - API errors; stats JSON and vmm_check know the pools. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)

static vmm_allocator *make(const char *extra)
{
    char conf[256];
    snprintf(conf, sizeof conf, "driver:sim,sim_backed:true,sim_capacity:512M%s%s", *extra ? "," : "",
             extra);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    return a;
}

/* Fill n bytes (a multiple of 4) at p with a 32-bit value, in stream order (captured when s captures). */
static void fill(vmm_allocator *a, void *p, size_t n, uint32_t v, vmm_stream s)
{
    CHECK_OK(vmm_sim_memset32(a, p, v, n / 4, s));
}

/* Backed sim: device memory is host memory; call after a synchronization. */
static int holds(const void *p, size_t n, uint32_t v)
{
    const uint32_t *w = p;
    for (size_t i = 0; i < n / 4; i += 97)
        if (w[i] != v)
            return 0;
    return w[n / 4 - 1] == v;
}

static int in_pool(vmm_allocator *a, const void *p, uint64_t id0)
{
    uint64_t i0 = 99, i1 = 99;
    if (vmm_pool_lookup(a, p, &i0, &i1) != VMM_OK)
        return -1;
    return i0 == id0 && i1 == 0;
}

static int overlaps(const void *p, size_t n, const void *q, size_t m)
{
    uintptr_t a = (uintptr_t)p, b = (uintptr_t)q;
    return a < b + m && b < a + n;
}

static vmm_sim_counters counters(vmm_allocator *a)
{
    vmm_sim_counters c;
    memset(&c, 0, sizeof c);
    CHECK_OK(vmm_sim_get_counters(a, &c));
    return c;
}

/* What a capture must not have done: record events (but the test's own: `records`), wait on them,
 * synchronize anything. */
static void check_nothing_synced(const vmm_sim_counters *c0, const vmm_sim_counters *c1, uint64_t records)
{
    CHECK_EQ(c1->calls[VMM_SIM_CALL_EVENT_RECORD], c0->calls[VMM_SIM_CALL_EVENT_RECORD] + records);
    CHECK_EQ(c1->calls[VMM_SIM_CALL_EVENT_SYNC], c0->calls[VMM_SIM_CALL_EVENT_SYNC]);
    CHECK_EQ(c1->calls[VMM_SIM_CALL_STREAM_SYNC], c0->calls[VMM_SIM_CALL_STREAM_SYNC]);
    CHECK_EQ(c1->calls[VMM_SIM_CALL_DEVICE_SYNC], c0->calls[VMM_SIM_CALL_DEVICE_SYNC]);
    CHECK_EQ(c1->calls[VMM_SIM_CALL_MEM_FREE], c0->calls[VMM_SIM_CALL_MEM_FREE]);
    CHECK_EQ(c1->device_syncs, c0->device_syncs);
    CHECK_EQ(c1->stream_syncs, c0->stream_syncs);
    CHECK_EQ(c1->event_syncs, c0->event_syncs);
    CHECK_EQ(c1->failures[VMM_SIM_CALL_MEM_CREATE], c0->failures[VMM_SIM_CALL_MEM_CREATE]);
}

/* ---- a graph replayed between eager allocations ----------------------------------------------- */

enum { EAGER = 24 };

static void graph_replay(int expandable)
{
    vmm_allocator *a = make(expandable ? "expandable_segments:true" : "expandable_segments:false");
    if (!a)
        return;
    vmm_stream s = NULL, e = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_OK(vmm_sim_stream_create(a, &e));
    /* memory cached on s before the capture: an unrouted capture would reuse it */
    void *w[8];
    for (int i = 0; i < 8; i++)
        CHECK_OK(vmm_malloc(a, 3 * MiB / 2, s, &w[i]));
    for (int i = 0; i < 8; i++)
        CHECK_OK(vmm_free(a, w[i]));
    CHECK_OK(vmm_sim_synchronize(a));

    vmm_sim_counters c0 = counters(a);
    CHECK_OK(vmm_pool_begin(a, 1, 0, s));
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    void *x = NULL, *y = NULL, *t = NULL, *z = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &x));
    CHECK_OK(vmm_malloc(a, 3 * MiB, s, &y));
    CHECK_OK(vmm_malloc(a, 2 * MiB, s, &t));
    fill(a, x, 1 * MiB, 0x11111111u, s);
    fill(a, y, 3 * MiB, 0x22222222u, s);
    fill(a, t, 2 * MiB, 0x44444444u, s);
    CHECK_OK(vmm_free(a, t)); /* a temporary of the graph: its memory stays the graph's */
    CHECK_OK(vmm_malloc(a, 2 * MiB, s, &z));
    fill(a, z, 2 * MiB, 0x33333333u, s);
    CHECK_OK(vmm_check(a));
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g)); /* not invalidated: nothing broke the rules */
    CHECK_EQ(vmm_sim_graph_nodes(g), 4);
    CHECK_OK(vmm_pool_end(a, 1, 0));
    vmm_sim_counters c1 = counters(a);
    check_nothing_synced(&c0, &c1, 0);
    CHECK_EQ(in_pool(a, x, 1), 1);
    CHECK_EQ(in_pool(a, y, 1), 1);
    CHECK_EQ(in_pool(a, z, 1), 1);
    CHECK_EQ(in_pool(a, t, 1), 1);
    for (int i = 0; i < 8; i++)
        CHECK(!overlaps(x, MiB, w[i], 3 * MiB / 2) && !overlaps(y, 3 * MiB, w[i], 3 * MiB / 2));
    vmm_pool_stats ps;
    CHECK_OK(vmm_pool_get_stats(a, 1, 0, &ps));
    CHECK_EQ(ps.use_count, 1);
    CHECK_EQ(ps.allocations, 3);
    CHECK_EQ(ps.num_mallocs, 4);
    CHECK(ps.reserved_bytes >= (int64_t)(6 * MiB));
    int64_t pool_reserved = ps.reserved_bytes;

    /* replays, with eager work between them */
    static const size_t sizes[EAGER] = {512, 4096, 100000, MiB, 2 * MiB, 3 * MiB, 5 * MiB, 700,
                                        MiB / 2, 6 * MiB, 2 * MiB + 512, 9000, 1536, 3 * MiB / 2,
                                        MiB + 4096, 20 * MiB, 64, 8192, 4 * MiB, 2 * MiB, 12000,
                                        MiB, 7 * MiB, 256};
    for (int round = 0; round < 4; round++) {
        void *q[EAGER];
        for (int i = 0; i < EAGER; i++) {
            vmm_stream st = i % 3 ? s : e;
            CHECK_OK(vmm_malloc(a, sizes[i], st, &q[i]));
            CHECK_EQ(in_pool(a, q[i], 0), 1);
            CHECK(!overlaps(q[i], sizes[i], x, MiB) && !overlaps(q[i], sizes[i], y, 3 * MiB) &&
                  !overlaps(q[i], sizes[i], z, 2 * MiB) && !overlaps(q[i], sizes[i], t, 2 * MiB));
            fill(a, q[i], sizes[i] / 4 * 4, 0xEE000000u + (uint32_t)(round * 100 + i), st);
        }
        CHECK_OK(vmm_sim_synchronize(a));
        CHECK_OK(vmm_sim_graph_launch(a, g, s)); /* fails if the graph's memory were unmapped */
        CHECK_OK(vmm_sim_synchronize(a));
        CHECK(holds(x, MiB, 0x11111111u));
        CHECK(holds(y, 3 * MiB, 0x22222222u));
        CHECK(holds(z, 2 * MiB, 0x33333333u));
        for (int i = 0; i < EAGER; i++)
            CHECK(holds(q[i], sizes[i] / 4 * 4, 0xEE000000u + (uint32_t)(round * 100 + i)));
        for (int i = 0; i < EAGER; i++)
            CHECK_OK(vmm_free(a, q[i]));
        CHECK_OK(vmm_empty_cache(a)); /* the graph's pages stay */
        CHECK_OK(vmm_check(a));
        CHECK_OK(vmm_pool_get_stats(a, 1, 0, &ps));
        CHECK_EQ(ps.reserved_bytes, pool_reserved);
    }
    char json[16384];
    CHECK(vmm_stats_json(a, json, sizeof json) > 0);
    CHECK(strstr(json, "\"private_pools.count\":1") != NULL);
    CHECK(strstr(json, "\"private_pools.routes\":0") != NULL);

    /* the graph goes: its pool's memory returns to the default pools after one device sync */
    vmm_stats st0 = vmm_test_stats(a);
    CHECK_OK(vmm_pool_release(a, 1, 0));
    vmm_stats st1 = vmm_test_stats(a);
    CHECK_EQ(st1.num_sync_all_streams, st0.num_sync_all_streams + 1);
    CHECK_EQ(vmm_pool_get_stats(a, 1, 0, &ps), VMM_EINVAL);
    CHECK_EQ(vmm_pool_release(a, 1, 0), VMM_EINVAL);
    CHECK_EQ(in_pool(a, x, 0), 1);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, x));
    CHECK_OK(vmm_free(a, y));
    CHECK_OK(vmm_free(a, z));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current, 0);
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
}

/* ---- two graphs share a pool --------------------------------------------------------------------- */

static void shared_pool(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    vmm_sim_graph *g1 = NULL, *g2 = NULL;
    void *a1 = NULL, *a2 = NULL, *b1 = NULL;
    CHECK_OK(vmm_pool_begin(a, 0, 7, s)); /* graph_pool_handle() ids have the second half set */
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &a1));
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &a2));
    fill(a, a1, 4 * MiB, 0xA1A1A1A1u, s);
    fill(a, a2, 4 * MiB, 0xA2A2A2A2u, s);
    CHECK_OK(vmm_free(a, a2));
    CHECK_OK(vmm_sim_capture_end(a, s, &g1));
    CHECK_OK(vmm_pool_end(a, 0, 7));

    CHECK_OK(vmm_pool_begin(a, 0, 7, s)); /* second user */
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_THREAD_LOCAL));
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &b1));
    CHECK(b1 == a2); /* the second graph reuses what the first freed: same pool */
    fill(a, b1, 4 * MiB, 0xB1B1B1B1u, s);
    CHECK_OK(vmm_sim_capture_end(a, s, &g2));
    CHECK_OK(vmm_pool_end(a, 0, 7));
    vmm_pool_stats ps;
    CHECK_OK(vmm_pool_get_stats(a, 0, 7, &ps));
    CHECK_EQ(ps.use_count, 2);
    CHECK_EQ(ps.routed, 0);

    /* the first graph goes: the second still uses the pool, nothing returns */
    int64_t syncs = vmm_test_stats(a).num_sync_all_streams;
    CHECK_OK(vmm_pool_release(a, 0, 7));
    CHECK_EQ(vmm_test_stats(a).num_sync_all_streams, syncs);
    CHECK_OK(vmm_pool_get_stats(a, 0, 7, &ps));
    CHECK_EQ(ps.use_count, 1);
    CHECK_OK(vmm_free(a, a1)); /* an output of the first graph: back to the pool, not eager code */
    void *q = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &q));
    CHECK_EQ(in_pool(a, q, 0), 1);
    CHECK(q != a1 && q != b1);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_sim_graph_launch(a, g2, s)); /* still mapped */
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK(holds(b1, 4 * MiB, 0xB1B1B1B1u));
    CHECK_OK(vmm_check(a));

    /* the last user goes: the memory is the default pools' now */
    CHECK_OK(vmm_pool_release(a, 0, 7));
    CHECK_EQ(vmm_test_stats(a).num_sync_all_streams, syncs + 1);
    CHECK_EQ(vmm_pool_get_stats(a, 0, 7, &ps), VMM_EINVAL);
    void *r = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &r));
    CHECK(r == a1); /* the best fit now is the former pool's free block */
    CHECK_OK(vmm_free(a, r));
    CHECK_OK(vmm_free(a, q));
    CHECK_OK(vmm_free(a, b1));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g1);
    vmm_sim_graph_destroy(g2);
}

/* ---- frees and uses while capturing ------------------------------------------------------------ */

static void deferred_frees(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    vmm_stream s = NULL, e = NULL, e2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_OK(vmm_sim_stream_create(a, &e));
    CHECK_OK(vmm_sim_stream_create(a, &e2));

    /* an eager block used by busy stream e, freed while a capture is underway (an autograd thread's
     * free): deferred, no event recorded until the capture ended */
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 2 * MiB, s, &p));
    CHECK_OK(vmm_record_stream(a, p, e));
    vmm_test_gate gate = {0};
    CHECK_OK(vmm_sim_launch(a, e, vmm_test_gate_wait, &gate));
    vmm_sim_counters c0 = counters(a);
    CHECK_OK(vmm_pool_begin(a, 3, 0, s));
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    CHECK_OK(vmm_free(a, p));
    CHECK_EQ(a->n_deferred, 1);

    /* a block of the graph used by captured work on a forked stream, freed inside the capture: not
     * reused by the capture (it waits), and its use is dropped after the capture (no event) */
    void *u = NULL, *v = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &u));
    fill(a, u, MiB, 0x55555555u, s);
    CHECK_OK(vmm_sim_stream_wait_stream(a, e2, s)); /* fork: e2 joins the capture */
    CHECK_OK(vmm_record_stream(a, u, e2));
    CHECK_EQ(vmm_capture_uses(a), 1);
    fill(a, u, MiB, 0x66666666u, e2); /* captured work on e2 using u */
    CHECK_OK(vmm_sim_stream_wait_stream(a, s, e2)); /* join */
    CHECK_OK(vmm_free(a, u));
    CHECK_EQ(a->n_deferred, 2);
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &v));
    CHECK(v != u); /* u still waits: the replay's e2 work on u is not ordered before v's */
    CHECK_EQ(in_pool(a, v, 3), 1);
    CHECK_OK(vmm_check(a));
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g));
    vmm_sim_counters c1 = counters(a);
    check_nothing_synced(&c0, &c1, 2); /* the fork and the join record an event each */
    CHECK_OK(vmm_pool_end(a, 3, 0));
    /* no capture now: p's event is recorded on e (busy), u's captured use is dropped */
    vmm_sim_counters c2 = counters(a);
    CHECK_EQ(c2.calls[VMM_SIM_CALL_EVENT_RECORD], c1.calls[VMM_SIM_CALL_EVENT_RECORD] + 1);
    CHECK_EQ(vmm_capture_uses(a), 0);
    CHECK_EQ(a->n_deferred, 1);
    vmm_pool_stats ps;
    CHECK_OK(vmm_pool_get_stats(a, 3, 0, &ps));
    CHECK_EQ(ps.pending_bytes, 0);
    void *w = NULL;
    CHECK_OK(vmm_malloc(a, 2 * MiB, s, &w));
    CHECK(w != p); /* e still holds p */
    atomic_store(&gate.open, 1);
    while (!atomic_load(&gate.done))
        vmm_test_sleep_ms(1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_free(a, w));
    void *w2 = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &w2)); /* polls: p's event completed */
    CHECK_EQ(a->n_deferred, 0);
    CHECK_OK(vmm_free(a, w2));
    CHECK_OK(vmm_free(a, v));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_pool_release(a, 3, 0));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
}

/* An allocation during capture that only a wait could serve fails, saying why; nothing synced. */
static void oom_in_capture(int expandable)
{
    vmm_allocator *a = make(expandable ? "sim_capacity:64M" : "sim_capacity:64M,expandable_segments:false");
    if (!a)
        return;
    vmm_stream s = NULL, e = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_OK(vmm_sim_stream_create(a, &e));
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 40 * MiB, s, &p));
    CHECK_OK(vmm_record_stream(a, p, e));
    vmm_test_gate gate = {0};
    CHECK_OK(vmm_sim_launch(a, e, vmm_test_gate_wait, &gate));
    CHECK_OK(vmm_free(a, p)); /* pending on e */
    vmm_sim_counters c0 = counters(a);
    CHECK_OK(vmm_pool_begin(a, 9, 9, s));
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    void *q = NULL;
    CHECK_EQ(vmm_malloc(a, 40 * MiB, s, &q), VMM_ENOMEM);
    CHECK(strstr(vmm_last_error(), "capture prevented the sync") != NULL);
    CHECK(strstr(vmm_last_error(), "private-pool route") != NULL);
    if (!strstr(vmm_last_error(), "capture prevented the sync"))
        fprintf(stderr, "message: %s\n", vmm_last_error());
    CHECK_OK(vmm_malloc(a, 4 * MiB, s, &q)); /* what fits still works */
    CHECK_OK(vmm_empty_cache(a)); /* does nothing that syncs */
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g));
    vmm_sim_counters c1 = counters(a);
    check_nothing_synced(&c0, &c1, 0);
    CHECK_OK(vmm_pool_end(a, 9, 9));
    atomic_store(&gate.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_free(a, q));
    CHECK_OK(vmm_pool_release(a, 9, 9));
    void *r = NULL;
    CHECK_OK(vmm_malloc(a, 40 * MiB, s, &r)); /* no capture: it may wait now */
    CHECK_OK(vmm_free(a, r));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
}

/* ---- capture modes ---------------------------------------------------------------------------------- */

typedef struct eager_arg {
    vmm_allocator *a;
    vmm_stream e;
    int raw_create; /* negative control: a driver call in global mode, bypassing the allocator */
    int mode_after;
} eager_arg;

static void *eager_thread(void *p)
{
    eager_arg *x = p;
    vmm_allocator *a = x->a;
    if (x->raw_create) {
        vmm_phys h = 0;
        int r = a->drv->ops->mem_create(a->drv, a->dev.granularity, &h);
        CHECK_EQ(r, VMM_DRV_STREAM_CAPTURE_UNSUPPORTED);
        if (r == VMM_DRV_SUCCESS)
            a->drv->ops->mem_release(a->drv, h);
        return NULL;
    }
    /* eager work of another thread while the main thread captures in global mode: new pages
     * (mem_create, mem_map, set_access), a free, empty_cache (unmap, release), vmm_check (lookups) */
    void *b[4];
    for (int i = 0; i < 4; i++)
        CHECK_OK(vmm_malloc(a, 30 * MiB, x->e, &b[i]));
    for (int i = 0; i < 4; i++)
        CHECK_OK(vmm_free(a, b[i]));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    int m = VMM_SIM_CAPTURE_GLOBAL;
    CHECK_OK(vmm_sim_capture_mode_exchange(a, &m)); /* the allocator gave the thread its mode back */
    x->mode_after = m;
    return NULL;
}

static void capture_modes(void)
{
    for (int control = 0; control < 2; control++) {
        vmm_allocator *a = make("");
        if (!a)
            return;
        vmm_stream s = NULL, e = NULL;
        CHECK_OK(vmm_sim_stream_create(a, &s));
        CHECK_OK(vmm_sim_stream_create(a, &e));
        CHECK_OK(vmm_pool_begin(a, 2, 2, s));
        CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
        void *p = NULL;
        CHECK_OK(vmm_malloc(a, 50 * MiB, s, &p)); /* the capturing thread itself creates pages */
        eager_arg x = {a, e, control, -1};
        pthread_t th;
        CHECK_EQ(pthread_create(&th, NULL, eager_thread, &x), 0);
        pthread_join(th, NULL);
        if (!control)
            CHECK_EQ(x.mode_after, VMM_SIM_CAPTURE_GLOBAL);
        vmm_sim_graph *g = NULL;
        int rc = vmm_sim_capture_end(a, s, &g);
        if (control) {
            /* the rule is real: the same call in global mode from that thread invalidates */
            CHECK_EQ(rc, VMM_EDRIVER);
            CHECK(strstr(vmm_last_error(), "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED") != NULL);
            CHECK(g == NULL);
        } else {
            CHECK_OK(rc);
        }
        CHECK_OK(vmm_pool_end(a, 2, 2));
        CHECK_OK(vmm_free(a, p));
        CHECK_OK(vmm_pool_release(a, 2, 2));
        CHECK_OK(vmm_check(a));
        vmm_destroy(a);
        vmm_sim_graph_destroy(g);
    }
}

/* ---- a route by filter, as PyTorch sets it ------------------------------------------------------- */

typedef struct filter_ctx {
    vmm_allocator *a;
    uint64_t capture_id;
    int calls;
} filter_ctx;

static int same_capture(void *ctx, vmm_stream s)
{
    filter_ctx *f = ctx;
    f->calls++;
    int capturing = 0;
    uint64_t id = 0;
    return vmm_sim_stream_capture_info(f->a, s, &capturing, &id) == VMM_OK && capturing &&
           id == f->capture_id && id != 0;
}

static void filter_route(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    vmm_stream s = NULL, s2 = NULL, e = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    CHECK_OK(vmm_sim_stream_create(a, &e));
    filter_ctx f = {a, 0, 0};
    CHECK_OK(vmm_pool_begin_filter(a, 5, 0, same_capture, &f)); /* before the capture begins */
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_RELAXED));
    int capturing = 0;
    CHECK_OK(vmm_sim_stream_capture_info(a, s, &capturing, &f.capture_id));
    CHECK_EQ(capturing, 1);
    void *p = NULL, *q = NULL, *r = NULL;
    CHECK_OK(vmm_malloc(a, MiB, s, &p));
    CHECK_OK(vmm_sim_stream_wait_stream(a, s2, s)); /* s2 forks into the capture */
    CHECK_OK(vmm_malloc(a, MiB, s2, &q));
    CHECK_OK(vmm_malloc(a, MiB, e, &r)); /* eager, another stream: not the graph's */
    CHECK_EQ(in_pool(a, p, 5), 1);
    CHECK_EQ(in_pool(a, q, 5), 1);
    CHECK_EQ(in_pool(a, r, 0), 1);
    CHECK(f.calls >= 3);
    CHECK_OK(vmm_sim_stream_wait_stream(a, s, s2)); /* join */
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g));
    CHECK_OK(vmm_pool_end(a, 5, 0));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(a, q));
    CHECK_OK(vmm_free(a, r));
    CHECK_OK(vmm_pool_release(a, 5, 0));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
}

/* ---- pinned host memory freed while its stream captures -------------------------------------------- */

static void pinned_in_capture(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    void *h = NULL, *h2 = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 4096, s, &h)); /* a staging buffer of the stream */
    vmm_sim_counters c0 = counters(a);
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_GLOBAL));
    CHECK_OK(vmm_pinned_free(a, h));              /* its event is not recorded into the capture */
    CHECK_OK(vmm_pinned_malloc(a, 4096, s, &h2)); /* polls (queries, host_alloc: relaxed mode) */
    CHECK(h2 != h);
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g));
    vmm_sim_counters c1 = counters(a);
    check_nothing_synced(&c0, &c1, 0);
    vmm_pinned_stats ps;
    CHECK_OK(vmm_pinned_get_stats(a, &ps));
    CHECK_EQ(ps.pending_blocks, 1);
    CHECK_OK(vmm_pinned_free(a, h2));
    CHECK_OK(vmm_sim_synchronize(a));
    void *h3 = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 4096, s, &h3)); /* no capture: h's event is recorded, then done */
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_pinned_empty_cache(a));
    CHECK_OK(vmm_pinned_get_stats(a, &ps));
    CHECK(ps.pending_blocks <= 1);
    CHECK_OK(vmm_pinned_free(a, h3));
    vmm_destroy(a);
    vmm_sim_graph_destroy(g);
}

/* ---- errors ---------------------------------------------------------------------------------------- */

static void api_errors(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    CHECK_EQ(vmm_pool_begin(a, 0, 0, NULL), VMM_EINVAL);
    CHECK_EQ(vmm_pool_begin(NULL, 1, 0, NULL), VMM_EINVAL);
    CHECK_EQ(vmm_pool_end(a, 1, 0), VMM_EINVAL);
    CHECK_EQ(vmm_pool_release(a, 1, 0), VMM_EINVAL);
    CHECK_OK(vmm_pool_begin(a, 1, 0, NULL));
    CHECK_EQ(vmm_pool_begin(a, 1, 0, NULL), VMM_EINVAL); /* one route per pool */
    CHECK_OK(vmm_pool_begin(a, 2, 0, NULL));              /* another pool: allowed */
    CHECK_EQ(a->n_routes, 2);
    CHECK_OK(vmm_pool_end(a, 1, 0));
    CHECK_EQ(vmm_pool_end(a, 1, 0), VMM_EINVAL);
    CHECK_OK(vmm_pool_end(a, 2, 0));
    CHECK_OK(vmm_pool_retain(a, 1, 0)); /* two users now */
    vmm_pool_stats ps;
    CHECK_OK(vmm_pool_get_stats(a, 1, 0, &ps));
    CHECK_EQ(ps.use_count, 2);
    CHECK_EQ(ps.segments, 0);
    CHECK_OK(vmm_pool_release(a, 1, 0));
    CHECK_OK(vmm_pool_release(a, 1, 0));
    CHECK_EQ(vmm_pool_release(a, 1, 0), VMM_EINVAL);
    CHECK_OK(vmm_pool_release(a, 2, 0));
    uint64_t i0, i1;
    int local = 0;
    CHECK_EQ(vmm_pool_lookup(a, &local, &i0, &i1), VMM_EBADPTR);
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

int main(void)
{
    graph_replay(1);
    graph_replay(0);
    shared_pool();
    deferred_frees();
    oom_in_capture(1);
    oom_in_capture(0);
    capture_modes();
    filter_route();
    pinned_in_capture();
    api_errors();
    vmm_test_check_no_sim_leaks();
    TEST_DONE();
}
