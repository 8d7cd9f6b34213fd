/*
 * vmm-bench handoff: one thread allocates, another frees (a producer and a consumer).
 *
 * Thread P mallocs blocks of the latency bench's ring sizes (log-uniform 512 B - 64 KiB, the small
 * pool and its thread caches) and passes each pointer through a single-producer single-consumer
 * ring of RING_SLOTS slots to thread C, which frees it; on vmmalloc both use one stream, as the
 * forward and the backward thread of a training step do. A pair is one malloc and its free;
 * throughput is pairs / wall time of the run, in 10^6 pairs/s. Without the depot (tcache.c) each
 * block C freed went back to its pool under the stream's lane lock, and each malloc P's cache
 * missed (all of them: P never frees) took the same lock. Compared in one run:
 * vmmalloc with thread_cache_depot true (the default) and false, glibc's malloc/free, jemalloc's
 * mallocx/dallocx, and the ring alone (pointers not allocated: the floor).
 *
 * --exchange: two threads, each mallocs and passes every block to the other through its own ring,
 * and frees what the other passed it (forward and backward threads that both allocate and free
 * each other's tensors). A pair is still one malloc and its free; both threads' pairs count.
 */
#ifndef VMM_HAVE_JEMALLOC
/* Built without jemalloc (configured with -DVMM_REQUIRE_JEMALLOC=OFF, as tools/gpu-check does on a
 * machine without it): this bench measures against it, so it says so and does not run. */
#include <stdio.h>

#include "bench.h"

int bench_handoff(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "vmm-bench: built without jemalloc (VMM_REQUIRE_JEMALLOC=OFF): handoff compares against it, "
                    "so it does not run\n");
    return BENCH_EXIT_FAIL;
}
#else
#include <jemalloc/jemalloc.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "vmmalloc_sim.h"

enum {
    RING_SLOTS = 1024, /* in flight at most: a power of two */
    N_SIZES = 4096,
    ROUNDS = 7,        /* each round runs every allocator once, in turn: the VM's two vCPUs
                        * hand data over at rates that change from second to second (the ring
                        * alone: 15-210 Mpairs/s), so allocators are compared round by round */
    MAX_ROUNDS = 15,
};
enum kind { K_DEPOT, K_NO_DEPOT, K_GLIBC, K_JEMALLOC, K_QUEUE, K_COUNT };
static const char *const kind_name[K_COUNT] = {"vmmalloc", "vmmalloc, thread_cache_depot:false",
                                                "glibc", "jemalloc", "the ring alone"};
static const char *const kind_key[K_COUNT] = {"vmmalloc", "vmmalloc_no_depot", "glibc", "jemalloc", "queue"};

/* Pointers from one thread to another, single producer and single consumer. */
typedef struct ring {
    void *slot[RING_SLOTS];
    _Alignas(64) _Atomic uint64_t head; /* pointers put */
    _Alignas(64) _Atomic uint64_t tail; /* pointers taken */
} ring;

typedef struct run {
    enum kind k;
    vmm_allocator *a;
    vmm_stream s;
    const size_t *sizes;
    uint64_t n;                         /* mallocs per allocating thread */
    ring q[2];                          /* q[0]: P to C (thread 0 to 1); q[1]: 1 to 0 (--exchange) */
    _Alignas(64) int malloc_errors[2];
    _Alignas(64) int free_errors[2];
} run;

static int exchange;                    /* --exchange */
static void *(*glibc_malloc)(size_t);
static void (*glibc_free)(void *);

static void *get(run *r, size_t size, uint64_t i)
{
    void *p = NULL;
    switch (r->k) {
    case K_GLIBC:
        return glibc_malloc(size);
    case K_JEMALLOC:
        return mallocx(size, 0);
    case K_QUEUE:
        return (void *)(uintptr_t)(i + 1);
    default:
        return vmm_malloc(r->a, size, r->s, &p) == VMM_OK ? p : NULL;
    }
}

/* 0 when freed */
static int put(run *r, void *p)
{
    switch (r->k) {
    case K_GLIBC:
        glibc_free(p);
        return 0;
    case K_JEMALLOC:
        dallocx(p, 0);
        return 0;
    case K_QUEUE:
        return 0;
    default:
        return vmm_free(r->a, p) != VMM_OK;
    }
}

/* Takes ring in's pointers from number `got` on, up to `upto` and as many as were put, and frees
 * them (thread `side`); returns the count taken. */
static uint64_t consume(run *r, int side, ring *in, uint64_t got, uint64_t upto)
{
    uint64_t head = atomic_load_explicit(&in->head, memory_order_acquire);
    if (head > upto)
        head = upto;
    for (; got < head; got++) {
        void *p = in->slot[got & (RING_SLOTS - 1)];
        atomic_store_explicit(&in->tail, got + 1, memory_order_release);
        if (p && put(r, p))
            r->free_errors[side]++;
    }
    return got;
}

/* Thread `side` mallocs r->n blocks into ring q[side]; waits while it is full, freeing meanwhile
 * what ring `in` (when not NULL) holds. Returns how many of `in` it took. */
static uint64_t produce(run *r, int side, ring *in)
{
    ring *out = &r->q[side];
    uint64_t got = 0;
    for (uint64_t i = 0; i < r->n; i++) {
        void *p = get(r, r->sizes[(i + (uint64_t)side * (N_SIZES / 2)) & (N_SIZES - 1)], i);
        if (!p)
            r->malloc_errors[side]++;
        while (i - atomic_load_explicit(&out->tail, memory_order_acquire) >= RING_SLOTS) {
            uint64_t had = got;
            if (in)
                got = consume(r, side, in, got, got + RING_SLOTS);
            if (got == had)
                sched_yield(); /* full: the other thread is behind */
        }
        out->slot[i & (RING_SLOTS - 1)] = p;
        atomic_store_explicit(&out->head, i + 1, memory_order_release);
        if (in)
            got = consume(r, side, in, got, got + RING_SLOTS);
    }
    return got;
}

static void *producer(void *arg)
{
    produce(arg, 0, NULL);
    return NULL;
}

static void *consumer(void *arg)
{
    run *r = arg;
    for (uint64_t got = 0; got < r->n;) {
        uint64_t had = got;
        got = consume(r, 1, &r->q[0], got, r->n);
        if (got == had)
            sched_yield(); /* empty: P is behind */
    }
    return NULL;
}

typedef struct trader {
    run *r;
    int side;
} trader;

/* --exchange: mallocs into its ring, frees what the other's ring brings */
static void *exchanger(void *arg)
{
    trader *t = arg;
    ring *in = &t->r->q[1 - t->side];
    for (uint64_t got = produce(t->r, t->side, in); got < t->r->n;) {
        uint64_t had = got;
        got = consume(t->r, t->side, in, got, t->r->n);
        if (got == had)
            sched_yield();
    }
    return NULL;
}

/* One timed run of n pairs a thread; Mpairs/s, or -1 on a failure (reported). */
static double timed(run *r, uint64_t n)
{
    r->n = n;
    for (int i = 0; i < 2; i++) {
        atomic_store(&r->q[i].head, 0);
        atomic_store(&r->q[i].tail, 0);
    }
    pthread_t t0, t1;
    trader tr[2] = {{r, 0}, {r, 1}};
    uint64_t start = bench_now_ns();
    if (exchange ? pthread_create(&t1, NULL, exchanger, &tr[1]) || pthread_create(&t0, NULL, exchanger, &tr[0])
                 : pthread_create(&t1, NULL, consumer, r) || pthread_create(&t0, NULL, producer, r)) {
        fprintf(stderr, "vmm-bench handoff: pthread_create failed\n");
        exit(BENCH_EXIT_FAIL);
    }
    pthread_join(t0, NULL);
    pthread_join(t1, NULL);
    double s = (double)(bench_now_ns() - start) / 1e9;
    int me = r->malloc_errors[0] + r->malloc_errors[1], fe = r->free_errors[0] + r->free_errors[1];
    if (me || fe) {
        fprintf(stderr, "vmm-bench handoff: %s: %d mallocs and %d frees failed (%s)\n", kind_name[r->k],
                me, fe, vmm_last_error());
        return -1;
    }
    return (double)n * (exchange ? 2 : 1) / s / 1e6;
}

/* One allocator's state across the rounds. */
typedef struct subject {
    run *r;
    double v[MAX_ROUNDS];          /* Mpairs/s of each round */
    long long hits0, misses0, lane0, others0;
} subject;

static long long num(const run *r, const char *key) { return bench_json_num(r->a, key, 0); }

static void close_run(run *r)
{
    if (r && r->a) {
        if (r->s)
            vmm_sim_stream_destroy(r->a, r->s);
        vmm_destroy(r->a);
    }
    free(r);
}

/* An allocator of kind k, warmed up: vmmalloc's lanes open (a second thread), its pool grown to the
 * pattern's size. NULL on a failure (reported). */
static run *open_run(enum kind k, const char *conf_extra, const size_t *sizes, uint64_t pairs)
{
    run *r = bench_xmalloc(sizeof *r);
    memset(r, 0, sizeof *r);
    r->k = k;
    r->sizes = sizes;
    if (k == K_DEPOT || k == K_NO_DEPOT) {
        char conf[512];
        snprintf(conf, sizeof conf, "driver:sim,sim_backed:false,sim_capacity:16G,thread_cache_depot:%s%s%s",
                 k == K_DEPOT ? "true" : "false", conf_extra ? "," : "", conf_extra ? conf_extra : "");
        /* the warm-up opens the lanes: C's first free that its cache passes on, a second
         * thread's under the allocator lock */
        if (vmm_create(conf, &r->a) != VMM_OK || vmm_sim_stream_create(r->a, &r->s) != VMM_OK) {
            fprintf(stderr, "vmm-bench handoff: %s\n", vmm_last_error());
            close_run(r); /* the allocator too, when only the stream failed */
            return NULL;
        }
    }
    if (timed(r, pairs / 8 + 1) < 0) {
        close_run(r);
        return NULL;
    }
    return r;
}

int bench_handoff(int argc, char **argv)
{
    uint64_t pairs = 500000;
    int json = 0, rounds = ROUNDS;
    const char *conf = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            pairs = 100000;
            rounds = 3;
        } else if (!strcmp(argv[i], "--pairs") && i + 1 < argc) {
            char *end = NULL;
            pairs = strtoull(argv[++i], &end, 10);
            if (!*argv[i] || *end || pairs == 0) {
                fprintf(stderr, "vmm-bench handoff: --pairs wants a positive count, not %s\n", argv[i]);
                return BENCH_EXIT_INPUT;
            }
        } else if (!strcmp(argv[i], "--conf") && i + 1 < argc) {
            conf = argv[++i];
        } else if (!strcmp(argv[i], "--exchange")) {
            exchange = 1;
        } else {
            fprintf(stderr, "vmm-bench handoff: unknown option %s\n"
                            "usage: vmm-bench handoff [--exchange] [--pairs N] [--conf K:V,...] [--quick] [--json]\n",
                    argv[i]);
            return BENCH_EXIT_INPUT;
        }
    }
    if (bench_glibc(&glibc_malloc, &glibc_free) != 0) {
        fprintf(stderr, "vmm-bench handoff: glibc's malloc not found\n");
        return BENCH_EXIT_FAIL;
    }
    size_t *sizes = bench_xmalloc(N_SIZES * sizeof *sizes);
    bench_log_sizes(sizes, N_SIZES, 512, 64 << 10);
    subject sub[K_COUNT];
    memset(sub, 0, sizeof sub);
    int rc = BENCH_EXIT_OK;
    for (int k = 0; k < K_COUNT && !rc; k++)
        if (!(sub[k].r = open_run((enum kind)k, conf, sizes, pairs)))
            rc = BENCH_EXIT_FAIL;
    for (int k = 0; k < K_COUNT && !rc; k++)
        if (sub[k].r->a) {
            sub[k].hits0 = num(sub[k].r, "thread_caches.malloc_hits");
            sub[k].misses0 = num(sub[k].r, "thread_caches.malloc_misses");
            sub[k].lane0 = num(sub[k].r, "lanes.mallocs");
            sub[k].others0 = num(sub[k].r, "thread_caches.frees_kept_from_others");
        }
    for (int i = 0; i < rounds && !rc; i++)
        for (int k = 0; k < K_COUNT && !rc; k++)
            if ((sub[k].v[i] = timed(sub[k].r, pairs)) < 0)
                rc = BENCH_EXIT_FAIL;
    if (!rc && !json)
        printf("%s (log-uniform 512 B - 64 KiB), through a ring of %d pointers;\n"
               "vmmalloc on one stream, simulated device, unbacked. %d rounds of %llu pairs%s, each round every\n"
               "allocator in turn (after a warm-up of an eighth as many); median and range of the rounds.\n\n"
               "%-36s %9s %15s %11s %13s %12s\n",
               exchange ? "Two threads each malloc and free what the other mallocs"
                        : "One thread mallocs, another frees",
               RING_SLOTS, rounds, (unsigned long long)pairs,
               exchange ? " a thread" : "", "", "Mpairs/s", "range", "ns a pair", "hits/malloc", "lane/malloc");
    double med[K_COUNT];
    for (int k = 0; k < K_COUNT && !rc; k++) {
        subject *x = &sub[k];
        double v[MAX_ROUNDS];
        memcpy(v, x->v, sizeof v);
        med[k] = bench_quantile(v, (size_t)rounds, 0.5);
        double lo = v[0], hi = v[rounds - 1]; /* sorted by bench_quantile */
        double hits = -1, lane = -1, others = -1;
        if (x->r->a) {
            double mallocs = (double)(num(x->r, "thread_caches.malloc_hits") - x->hits0 +
                                      num(x->r, "thread_caches.malloc_misses") - x->misses0);
            hits = mallocs > 0 ? (double)(num(x->r, "thread_caches.malloc_hits") - x->hits0) / mallocs : 0;
            lane = mallocs > 0 ? (double)(num(x->r, "lanes.mallocs") - x->lane0) / mallocs : 0;
            /* frees kept by a cache other than the one that had handed the block out: every free
             * is one malloc's */
            others = mallocs > 0
                         ? (double)(num(x->r, "thread_caches.frees_kept_from_others") - x->others0) / mallocs
                         : 0;
        }
        if (json) {
            printf("{\"bench\":\"handoff\",\"pattern\":\"%s\",\"allocator\":\"%s\",\"pairs\":%llu,"
                   "\"rounds\":%d,\"mpairs_per_s\":%.3f,\"min\":%.3f,\"max\":%.3f",
                   exchange ? "exchange" : "one_way", kind_key[k], (unsigned long long)pairs, rounds, med[k],
                   lo, hi);
            if (hits >= 0)
                printf(",\"cache_hits_per_malloc\":%.3f,\"lane_mallocs_per_malloc\":%.3f,"
                       "\"frees_kept_from_others_per_free\":%.3f",
                       hits, lane, others);
            printf("}\n");
        } else {
            char range[32], h[16] = "", l[16] = "";
            snprintf(range, sizeof range, "%.2f-%.2f", lo, hi);
            if (hits >= 0) {
                snprintf(h, sizeof h, "%.2f", hits);
                snprintf(l, sizeof l, "%.2f", lane);
            }
            if (hits >= 0)
                printf("%-36s %9.2f %15s %11.1f %13s %12s\n", kind_name[k], med[k], range, 1e3 / med[k], h, l);
            else
                printf("%-36s %9.2f %15s %11.1f\n", kind_name[k], med[k], range, 1e3 / med[k]);
        }
    }
    if (!rc && !json) {
        /* the round-by-round ratio: both ran within seconds of each other */
        double rr[MAX_ROUNDS];
        for (int i = 0; i < rounds; i++)
            rr[i] = sub[K_DEPOT].v[i] / sub[K_NO_DEPOT].v[i];
        double rmed = bench_quantile(rr, (size_t)rounds, 0.5);
        printf("\nvmmalloc over thread_cache_depot:false: %.2fx (median of the rounds' ratios; %.2f-%.2fx);\n"
               "over glibc %.2fx, over jemalloc %.2fx (medians)\n",
               rmed, rr[0], rr[rounds - 1], med[K_DEPOT] / med[K_GLIBC], med[K_DEPOT] / med[K_JEMALLOC]);
    }
    for (int k = 0; k < K_COUNT; k++)
        close_run(sub[k].r);
    free(sizes);
    return rc;
}
#endif /* VMM_HAVE_JEMALLOC */
