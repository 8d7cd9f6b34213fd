/*
 * vmm-bench growth: what another thread's malloc + free pays while one thread grows the allocator.
 *
 * The sim's mem_create takes its modeled cost in real time (sim_real_time_create: 193 us, the A100
 * figure in src/driver/drv_sim.c). Thread G allocates new 64 MiB blocks on its own stream and keeps them:
 * every malloc is a growth that creates handles. Thread C, on another stream, runs malloc + free
 * pairs of an 8 MiB block (the large pool: no thread cache, so each call takes the allocator lock)
 * for as long as G runs, and times each pair. Run with grow_unlocked:true (the default: a growth
 * creates its handles with the lock released) and grow_unlocked:false (the lock held across the
 * creates, as every growth did before): C's median, p99 and longest pair, and G's time per growth.
 *
 * Then the driver calls made under the allocator lock (issue 13: none while holding a lock another
 * stream's cached path needs): G grows, frees and empties the cache in rounds, every call taking its
 * modeled cost in real time (sim_real_time); C's pairs run on its lane (lanes:true), or under the
 * allocator lock (lanes:false, which is what they waited for before driver calls let the lanes go).
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum {
    GROW_MIB = 64,     /* each of G's blocks: 4 handles of up to 20 MiB, 4 creates */
    PAIR_MIB = 8,
    CALLS_PAIR_KIB = 512, /* the second table's pairs: the small pool, past the thread cache's 64 KiB */
    MAX_SAMPLES = 1 << 22,
};

typedef struct run_ctx {
    vmm_allocator *a;
    vmm_stream gs, cs;
    int grows;
    _Atomic int growing;       /* G has started and not finished */
    double grow_ms;            /* G: wall time per growth */
    double *samples;           /* C: ns per pair */
    size_t n;
    int errors;
} run_ctx;

static void *grower(void *arg)
{
    run_ctx *r = arg;
    void **held = bench_xmalloc((size_t)r->grows * sizeof *held);
    atomic_store(&r->growing, 1);
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < r->grows; i++)
        if (vmm_malloc(r->a, (size_t)GROW_MIB << 20, r->gs, &held[i]) != VMM_OK)
            held[i] = NULL, r->errors++;
    r->grow_ms = (double)(bench_now_ns() - t0) / 1e6 / r->grows;
    atomic_store(&r->growing, 0);
    for (int i = 0; i < r->grows; i++)
        if (held[i])
            vmm_free(r->a, held[i]);
    free(held);
    return NULL;
}

/* C's pairs of `bytes`, from G's start to its end. */
static void pairs_of(run_ctx *r, size_t bytes)
{
    while (!atomic_load(&r->growing))
        ;
    while (atomic_load(&r->growing) && r->n < MAX_SAMPLES) {
        void *p = NULL;
        uint64_t t0 = bench_now_ns();
        if (vmm_malloc(r->a, bytes, r->cs, &p) != VMM_OK || vmm_free(r->a, p) != VMM_OK)
            r->errors++;
        r->samples[r->n++] = (double)(bench_now_ns() - t0);
    }
}

static void pairs(run_ctx *r) { pairs_of(r, (size_t)PAIR_MIB << 20); }

/* An allocator of conf with G's and C's streams; BENCH_EXIT_OK or the failure, reported. */
static int run_open(run_ctx *r, const char *conf)
{
    if (vmm_create(conf, &r->a) != VMM_OK) {
        fprintf(stderr, "vmm-bench growth: vmm_create(%s): %s\n", conf, vmm_last_error());
        return BENCH_EXIT_FAIL;
    }
    if (vmm_sim_stream_create(r->a, &r->gs) != VMM_OK || vmm_sim_stream_create(r->a, &r->cs) != VMM_OK) {
        fprintf(stderr, "vmm-bench growth: vmm_sim_stream_create: %s\n", vmm_last_error());
        vmm_destroy(r->a);
        return BENCH_EXIT_FAIL;
    }
    r->samples = bench_xmalloc(MAX_SAMPLES * sizeof *r->samples);
    return BENCH_EXIT_OK;
}

static void run_close(run_ctx *r)
{
    free(r->samples);
    vmm_sim_stream_destroy(r->a, r->gs);
    vmm_sim_stream_destroy(r->a, r->cs);
    vmm_destroy(r->a);
}

/* BENCH_EXIT_OK with C's median, p99 and longest pair in us, or the failure, reported. */
static int run_result(run_ctx *r, double q[3])
{
    if (r->errors || !r->n) {
        fprintf(stderr, "vmm-bench growth: %d failed calls, %zu pairs\n", r->errors, r->n);
        return BENCH_EXIT_FAIL;
    }
    q[0] = bench_quantile(r->samples, r->n, 0.5) / 1e3;
    q[1] = bench_quantile(r->samples, r->n, 0.99) / 1e3;
    q[2] = bench_quantile(r->samples, r->n, 1.0) / 1e3;
    return BENCH_EXIT_OK;
}

static int one(int unlocked, int grows, int json)
{
    char conf[256];
    snprintf(conf, sizeof conf, "driver:sim,sim_backed:false,sim_capacity:%dG,thread_cache:0,"
             "sim_real_time_create:true,grow_unlocked:%s", grows * GROW_MIB / 1024 + 4,
             unlocked ? "true" : "false");
    run_ctx r = {0};
    r.grows = grows;
    if (run_open(&r, conf) != BENCH_EXIT_OK)
        return BENCH_EXIT_FAIL;
    /* C's block exists before G starts: its pairs are cached from then on */
    void *p = NULL;
    if (vmm_malloc(r.a, (size_t)PAIR_MIB << 20, r.cs, &p) == VMM_OK)
        vmm_free(r.a, p);
    pthread_t t;
    pthread_create(&t, NULL, grower, &r);
    pairs(&r);
    pthread_join(t, NULL);
    double q[3];
    int rc = run_result(&r, q);
    if (!rc && json)
        printf("{\"bench\":\"growth\",\"grow_unlocked\":%s,\"pairs\":%zu,\"median_us\":%.2f,\"p99_us\":%.2f,"
               "\"max_us\":%.2f,\"ms_per_growth\":%.3f}\n",
               unlocked ? "true" : "false", r.n, q[0], q[1], q[2], r.grow_ms);
    else if (!rc)
        printf("%13s %10zu %10.2f %10.2f %10.1f %14.3f\n", unlocked ? "true" : "false", r.n, q[0], q[1], q[2],
               r.grow_ms);
    run_close(&r);
    return rc;
}

/* ---- driver calls under the allocator lock ------------------------------------------------------ */

/* Thread G, rounds times: a 64 MiB block on its stream (a growth), freed, then vmm_empty_cache (a
 * fence's event record and query, four unmaps and handle releases, a VA free: ~150 us of calls made
 * under the allocator lock). */
static void emptier_round(run_ctx *r)
{
    void *p = NULL;
    if (vmm_malloc(r->a, (size_t)GROW_MIB << 20, r->gs, &p) != VMM_OK || vmm_free(r->a, p) != VMM_OK ||
        vmm_empty_cache(r->a) != VMM_OK)
        r->errors++;
}

static void *emptier(void *arg)
{
    run_ctx *r = arg;
    emptier_round(r); /* untimed: its malloc, a second thread's under the allocator lock, opens the lanes */
    atomic_store(&r->growing, 1);
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < r->grows; i++)
        emptier_round(r);
    r->grow_ms = (double)(bench_now_ns() - t0) / 1e6 / r->grows;
    atomic_store(&r->growing, 0);
    return NULL;
}

static int calls_one(int lanes, int rounds, int json)
{
    char conf[256];
    snprintf(conf, sizeof conf, "driver:sim,sim_backed:false,sim_capacity:8G,sim_real_time:true,lanes:%s",
             lanes ? "true" : "false");
    run_ctx r = {0};
    r.grows = rounds;
    if (run_open(&r, conf) != BENCH_EXIT_OK)
        return BENCH_EXIT_FAIL;
    /* C's block exists before G starts, beside one C keeps, which holds their 2 MiB page mapped:
     * vmm_empty_cache cannot take it, so every pair is a cached one */
    size_t bytes = (size_t)CALLS_PAIR_KIB << 10;
    void *p = NULL, *keep = NULL;
    if (vmm_malloc(r.a, bytes, r.cs, &keep) != VMM_OK || vmm_malloc(r.a, bytes, r.cs, &p) != VMM_OK ||
        vmm_free(r.a, p) != VMM_OK)
        r.errors++;
    pthread_t t;
    pthread_create(&t, NULL, emptier, &r);
    pairs_of(&r, bytes);
    pthread_join(t, NULL);
    long long lane_mallocs = bench_json_num(r.a, "lanes.mallocs", -1);
    double q[3];
    int rc = run_result(&r, q);
    if (!rc && json)
        printf("{\"bench\":\"growth_calls\",\"lanes\":%s,\"pairs\":%zu,\"lane_mallocs\":%lld,"
               "\"median_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.2f,\"ms_per_round\":%.3f}\n",
               lanes ? "true" : "false", r.n, lane_mallocs, q[0], q[1], q[2], r.grow_ms);
    else if (!rc)
        printf("%13s %10zu %12lld %10.2f %10.2f %10.1f %13.3f\n", lanes ? "true" : "false", r.n, lane_mallocs,
               q[0], q[1], q[2], r.grow_ms);
    vmm_free(r.a, keep);
    run_close(&r);
    return rc;
}

int bench_growth(int argc, char **argv)
{
    int grows = 32, json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            grows = 8;
        } else {
            fprintf(stderr, "vmm-bench growth: unknown option %s\nusage: vmm-bench growth [--quick] [--json]\n",
                    argv[i]);
            return BENCH_EXIT_INPUT;
        }
    }
    if (!json)
        printf("Another thread's malloc + free of a cached %d MiB block while one thread grows by %d MiB at a\n"
               "time (%d growths; mem_create takes its modeled cost in real time, sim_real_time_create).\n\n"
               "grow_unlocked      pairs  median us     p99 us     max us  ms per growth\n",
               PAIR_MIB, GROW_MIB, grows);
    int rc = one(1, grows, json);
    if (!rc)
        rc = one(0, grows, json);
    if (rc)
        return rc;
    if (!json)
        printf("\nMalloc + free of a cached %d KiB block while the other thread, %d times, allocates %d MiB on its\n"
               "stream, frees it and calls vmm_empty_cache (fence, unmaps, handle releases, VA free under the allocator lock;\n"
               "every driver call takes its modeled cost in real time, sim_real_time). Thread caches on;\n"
               "lanes:true lets the pairs run on their stream's lane, which each driver call lets go.\n\n"
               "        lanes      pairs lane mallocs  median us     p99 us     max us  ms per round\n",
               CALLS_PAIR_KIB, grows, GROW_MIB);
    rc = calls_one(1, grows, json);
    if (!rc)
        rc = calls_one(0, grows, json);
    return rc;
}
