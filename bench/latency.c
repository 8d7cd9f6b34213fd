/*
 * vmm-bench latency: host cost of a warm-cache malloc+free pair with a live set held, for vmmalloc
 * (expandable and classic, simulated unbacked device) and, as yardsticks in the same run, glibc's
 * malloc/free and jemalloc's mallocx/dallocx on the same size pattern.
 *
 * The program links jemalloc, which replaces malloc; glibc's own functions are looked up in
 * libc.so.6 with dlsym on that library's handle.
 */
#include <dlfcn.h>
#include <gnu/libc-version.h>
#include <jemalloc/jemalloc.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum kind { K_EXPANDABLE, K_CLASSIC, K_GLIBC, K_JEMALLOC, K_COUNT };
static const char *const kind_name[K_COUNT] = {"expandable", "classic", "glibc", "jemalloc"};

enum pattern { P_SMALL, P_LARGE, P_MIXED, P_COUNT };
static const char *const pattern_name[P_COUNT] = {"small", "large", "mixed"};
static const char *const pattern_desc[P_COUNT] = {
    "fixed 4 KiB (small pool)", "fixed 8 MiB (large pool)", "mixed, log-uniform 512 B .. 16 MiB"};

enum {
    SMALL_SIZE = 4096,
    LARGE_SIZE = 8 * BENCH_MiB,
    MIXED_MIN = 512,
    MIXED_MAX = 16 * BENCH_MiB,
    N_SIZES = 4096,   /* mixed sizes are cycled from a table this long (power of two) */
    BATCH = 256,      /* pairs per timed batch: long enough that clock_gettime (~20 ns) is noise */
    BATCHES = 400,    /* batches per cell: 102400 pairs, p99 from 400 samples (per thread) */
    QUICK_BATCHES = 20,
};
/* Host allocators hold their live set in real (virtual) memory; above this they are not run. */
static const uint64_t HOST_LIVE_BUDGET = 32ull << 30;

static void *(*glibc_malloc)(size_t);
static void (*glibc_free)(void *);

static int resolve_glibc(void)
{
    void *h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libc.so.6", RTLD_NOW);
    if (!h)
        return -1;
    /* dlsym on libc's own handle: glibc's malloc, not the jemalloc one the program links. */
    *(void **)&glibc_malloc = dlsym(h, "malloc");
    *(void **)&glibc_free = dlsym(h, "free");
    return glibc_malloc && glibc_free ? 0 : -1;
}

typedef struct cell {
    enum kind kind;
    enum pattern pat;
    vmm_allocator *a;
    const size_t *sizes; /* N_SIZES entries */
    uint64_t live;       /* blocks this thread holds */
    int batches;
    double *samples;     /* ns per pair, one per batch */
    pthread_barrier_t *barrier;
    int failed;
} cell;

static void *do_alloc(const cell *c, size_t size)
{
    void *p = NULL;
    switch (c->kind) {
    case K_EXPANDABLE:
    case K_CLASSIC:
        if (vmm_malloc(c->a, size, NULL, &p) != VMM_OK)
            return NULL;
        return p;
    case K_GLIBC:
        return glibc_malloc(size);
    case K_JEMALLOC:
        return mallocx(size, 0);
    default:
        return NULL;
    }
}

static void do_free(const cell *c, void *p)
{
    switch (c->kind) {
    case K_EXPANDABLE:
    case K_CLASSIC:
        vmm_free(c->a, p);
        break;
    case K_GLIBC:
        glibc_free(p);
        break;
    case K_JEMALLOC:
        dallocx(p, 0);
        break;
    default:
        break;
    }
}

/* The timed loops, one per allocator, so no dispatch sits inside the measured pairs. */
#define TIMED_LOOP(c, ALLOC, FREE)                                                         \
    do {                                                                                   \
        size_t k_ = 0;                                                                     \
        for (int b_ = -1; b_ < (c)->batches; b_++) { /* batch -1 warms up */                \
            uint64_t t0_ = bench_now_ns();                                                 \
            for (int i_ = 0; i_ < BATCH; i_++) {                                           \
                size_t sz_ = (c)->sizes[k_++ & (N_SIZES - 1)];                              \
                void *p_ = ALLOC;                                                          \
                if (!p_) {                                                                 \
                    (c)->failed = 1;                                                       \
                    return;                                                                \
                }                                                                          \
                FREE;                                                                      \
            }                                                                              \
            uint64_t t1_ = bench_now_ns();                                                 \
            if (b_ >= 0)                                                                   \
                (c)->samples[b_] = (double)(t1_ - t0_) / BATCH;                            \
        }                                                                                  \
    } while (0)

static void timed(cell *c)
{
    void *p;
    (void)p;
    switch (c->kind) {
    case K_EXPANDABLE:
    case K_CLASSIC: {
        vmm_allocator *a = c->a;
        TIMED_LOOP(c, (vmm_malloc(a, sz_, NULL, &p) == VMM_OK ? p : NULL), vmm_free(a, p_));
        break;
    }
    case K_GLIBC:
        TIMED_LOOP(c, glibc_malloc(sz_), glibc_free(p_));
        break;
    case K_JEMALLOC:
        TIMED_LOOP(c, mallocx(sz_, 0), dallocx(p_, 0));
        break;
    default:
        break;
    }
}

static void *thread_main(void *arg)
{
    cell *c = arg;
    void **live = bench_xmalloc((c->live ? c->live : 1) * sizeof *live);
    uint64_t n = 0;
    /* The live set: blocks of the pattern's sizes, held while the pairs run. The offset into the
     * size table differs from the timed loop's so the held sizes are not the timed ones. */
    for (; n < c->live; n++) {
        live[n] = do_alloc(c, c->sizes[(n * 7 + 13) & (N_SIZES - 1)]);
        if (!live[n]) {
            c->failed = 1;
            break;
        }
    }
    pthread_barrier_wait(c->barrier);
    if (!c->failed)
        timed(c);
    pthread_barrier_wait(c->barrier);
    for (uint64_t i = 0; i < n; i++)
        do_free(c, live[i]);
    free(live);
    return NULL;
}

typedef struct result {
    int ran;
    double median, p99;
    const char *why; /* why not run */
} result;

static double pattern_mean(const size_t *sizes)
{
    double s = 0;
    for (int i = 0; i < N_SIZES; i++)
        s += (double)sizes[i];
    return s / N_SIZES;
}

static result run_cell(enum kind k, enum pattern pat, const size_t *sizes, uint64_t live, int threads,
                       int batches)
{
    result res = {0};
    double live_bytes = pattern_mean(sizes) * (double)live;
    vmm_allocator *a = NULL;
    if (k == K_GLIBC || k == K_JEMALLOC) {
        if (live_bytes > (double)HOST_LIVE_BUDGET) {
            res.why = "live set exceeds host budget";
            return res;
        }
    } else {
        /* Room for the live set, classic mode's segment rounding and the timed pairs; unbacked, so
         * the number costs nothing. */
        uint64_t cap = (uint64_t)(live_bytes * 2.5) + (16ull << 30);
        cap = (cap + 2 * BENCH_MiB - 1) / (2 * BENCH_MiB) * (2 * BENCH_MiB);
        char conf[256];
        snprintf(conf, sizeof conf,
                 "driver:sim,sim_backed:false,sim_capacity:%llu,expandable_segments:%s",
                 (unsigned long long)cap, k == K_EXPANDABLE ? "true" : "false");
        int rc = vmm_create(conf, &a);
        if (rc != VMM_OK) {
            fprintf(stderr, "vmm-bench: vmm_create(%s): %s\n", conf, vmm_last_error());
            res.why = "vmm_create failed";
            return res;
        }
    }
    pthread_barrier_t barrier;
    pthread_barrier_init(&barrier, NULL, (unsigned)threads);
    cell cells[2];
    pthread_t tid[2];
    double *samples = bench_xmalloc((size_t)threads * (size_t)batches * sizeof *samples);
    for (int i = 0; i < threads; i++) {
        cells[i] = (cell){.kind = k, .pat = pat, .a = a, .sizes = sizes,
                          .live = live / (uint64_t)threads, .batches = batches,
                          .samples = samples + (size_t)i * (size_t)batches, .barrier = &barrier};
        if (i)
            pthread_create(&tid[i], NULL, thread_main, &cells[i]);
    }
    thread_main(&cells[0]);
    int failed = cells[0].failed;
    for (int i = 1; i < threads; i++) {
        pthread_join(tid[i], NULL);
        failed |= cells[i].failed;
    }
    pthread_barrier_destroy(&barrier);
    if (failed) {
        res.why = "allocation failed";
        if (a)
            fprintf(stderr, "vmm-bench: %s %s live=%llu: %s\n", kind_name[k], pattern_name[pat],
                    (unsigned long long)live, vmm_last_error());
    } else {
        size_t n = (size_t)threads * (size_t)batches;
        res.ran = 1;
        res.median = bench_quantile(samples, n, 0.5);
        res.p99 = bench_quantile(samples, n, 0.99);
    }
    free(samples);
    vmm_destroy(a);
    return res;
}

static void make_sizes(enum pattern p, size_t *sizes)
{
    uint64_t rng = 42;
    for (int i = 0; i < N_SIZES; i++) {
        if (p == P_SMALL)
            sizes[i] = SMALL_SIZE;
        else if (p == P_LARGE)
            sizes[i] = LARGE_SIZE;
        else {
            double u = (double)(bench_rand(&rng) >> 11) / 9007199254740992.0;
            double s = exp(log((double)MIXED_MIN) + u * (log((double)MIXED_MAX) - log((double)MIXED_MIN)));
            sizes[i] = ((size_t)s + 511) / 512 * 512;
        }
    }
}

int bench_latency(const bench_latency_opts *o)
{
    if (resolve_glibc()) {
        fprintf(stderr, "vmm-bench: cannot find glibc's malloc/free in libc.so.6: %s\n", dlerror());
        return BENCH_EXIT_FAIL;
    }
    int batches = o->quick ? QUICK_BATCHES : BATCHES;
    enum { MAX_DEC = 7 };
    uint64_t lives[MAX_DEC];
    int n_lives = 0;
    for (uint64_t l = 100; l <= o->max_live && n_lives < MAX_DEC; l *= 10)
        lives[n_lives++] = l;
    /* Targets: 1 thread, small pattern at 10^3 live (fast path) and the 10^6 / 10^3 growth. */
    double t_fast_exp = 0, t_fast_glibc = 0, at3[P_COUNT] = {0}, at6[P_COUNT] = {0};
    size_t sizes[N_SIZES];
    char b1[32], b2[32];

    if (!o->json)
        printf("Host cost of one malloc+free pair with a live set held (ns; median and p99 of %d batches of "
               "%d pairs per thread).\nvmmalloc runs on the simulated device, unbacked (host-side cost only). glibc %s, jemalloc %s.\n",
               batches, BATCH, gnu_get_libc_version(), JEMALLOC_VERSION);
    for (int p = 0; p < P_COUNT; p++) {
        make_sizes((enum pattern)p, sizes);
        for (int th = 1; th <= o->max_threads; th++) {
            if (!o->json) {
                printf("\n%s, %d thread%s\n", pattern_desc[p], th, th > 1 ? "s" : "");
                printf("%10s", "live");
                for (int k = 0; k < K_COUNT; k++)
                    printf(" %19s", kind_name[k]);
                printf(" %10s %10s\n", "exp/glibc", "cls/glibc");
                printf("%10s", "");
                for (int k = 0; k < K_COUNT; k++)
                    printf(" %9s %9s", "median", "p99");
                printf("\n");
            }
            for (int li = 0; li < n_lives; li++) {
                result r[K_COUNT];
                for (int k = 0; k < K_COUNT; k++) {
                    bench_progress(pattern_name[p], (uint64_t)(li * K_COUNT + k),
                                   (uint64_t)(n_lives * K_COUNT));
                    r[k] = run_cell((enum kind)k, (enum pattern)p, sizes, lives[li], th, batches);
                }
                bench_progress_end();
                double g = r[K_GLIBC].ran ? r[K_GLIBC].median : 0;
                if (o->json) {
                    for (int k = 0; k < K_COUNT; k++) {
                        printf("{\"bench\":\"latency\",\"pattern\":\"%s\",\"threads\":%d,\"live\":%llu,"
                               "\"allocator\":\"%s\"",
                               pattern_name[p], th, (unsigned long long)lives[li], kind_name[k]);
                        if (r[k].ran) {
                            printf(",\"median_ns\":%.1f,\"p99_ns\":%.1f", r[k].median, r[k].p99);
                            if (g > 0)
                                printf(",\"ratio_to_glibc\":%.3f", r[k].median / g);
                        } else {
                            printf(",\"skipped\":\"%s\"", r[k].why);
                        }
                        printf("}\n");
                    }
                } else {
                    printf("%10llu", (unsigned long long)lives[li]);
                    for (int k = 0; k < K_COUNT; k++) {
                        if (r[k].ran)
                            printf(" %9.1f %9.1f", r[k].median, r[k].p99);
                        else
                            printf(" %9s %9s", "n/a", "");
                    }
                    for (int k = K_EXPANDABLE; k <= K_CLASSIC; k++) {
                        if (r[k].ran && g > 0)
                            printf(r[k].median / g < 0.1 ? " %9.3fx" : " %9.2fx", r[k].median / g);
                        else
                            printf(" %10s", "n/a");
                    }
                    printf("\n");
                }
                fflush(stdout);
                if (th == 1 && r[K_EXPANDABLE].ran) {
                    if (lives[li] == 1000) {
                        at3[p] = r[K_EXPANDABLE].median;
                        if (p == P_SMALL) {
                            t_fast_exp = r[K_EXPANDABLE].median;
                            t_fast_glibc = g;
                        }
                    }
                    if (lives[li] == 1000000)
                        at6[p] = r[K_EXPANDABLE].median;
                }
            }
        }
    }
    if (o->json)
        return BENCH_EXIT_OK;
    printf("\nTargets (1 thread, expandable mode):\n");
    if (t_fast_exp > 0 && t_fast_glibc > 0)
        printf("  fast path <= 1.5x glibc (small, 10^3 live): %s vs %s = %.2fx -> %s\n",
               bench_fmt_ns(b1, sizeof b1, t_fast_exp), bench_fmt_ns(b2, sizeof b2, t_fast_glibc),
               t_fast_exp / t_fast_glibc, t_fast_exp <= 1.5 * t_fast_glibc ? "met" : "MISSED");
    for (int p = 0; p < P_COUNT; p++)
        if (at3[p] > 0 && at6[p] > 0)
            printf("  10^6 live <= 2x 10^3 live (%s): %.1f ns vs %.1f ns = %.2fx -> %s\n", pattern_name[p],
                   at6[p], at3[p], at6[p] / at3[p], at6[p] <= 2 * at3[p] ? "met" : "MISSED");
    return BENCH_EXIT_OK;
}
