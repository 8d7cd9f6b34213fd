/* vmm-bench helpers: clock, sizes, formatting, progress bar, random numbers, quantiles. */
#include <ctype.h>
#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "bench.h"

uint64_t bench_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

int bench_parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (!s || !isdigit((unsigned char)*s))
        return -1;
    unsigned long long n = strtoull(s, &end, 10);
    unsigned shift = 0;
    if (*end) {
        static const char *const names[] = {"k", "kb", "kib", "m", "mb", "mib",
                                            "g", "gb", "gib", "t", "tb", "tib"};
        int found = -1;
        for (int i = 0; i < 12; i++)
            if (!strcasecmp(end, names[i]))
                found = i / 3;
        if (found < 0 && strcasecmp(end, "b"))
            return -1;
        if (found >= 0)
            shift = 10u * (unsigned)(found + 1);
    }
    if (shift && n > (UINT64_MAX >> shift))
        return -1;
    *out = (uint64_t)n << shift;
    return 0;
}

const char *bench_fmt_bytes(char *buf, size_t len, double b)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    double v = b < 0 ? -b : b;
    while (v >= 1024 && u < 4) {
        v /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%s%.2f %s" : "%s%.0f %s", b < 0 ? "-" : "", v, unit[u]);
    return buf;
}

const char *bench_fmt_ns(char *buf, size_t len, double ns)
{
    if (ns < 1e3)
        snprintf(buf, len, "%.0f ns", ns);
    else if (ns < 1e6)
        snprintf(buf, len, "%.1f us", ns / 1e3);
    else if (ns < 1e9)
        snprintf(buf, len, "%.1f ms", ns / 1e6);
    else
        snprintf(buf, len, "%.2f s", ns / 1e9);
    return buf;
}

static int progress_on = 1;
static int progress_drawn;
static uint64_t progress_last_ns;

void bench_progress_enable(int on) { progress_on = on; }

void bench_progress(const char *what, uint64_t done, uint64_t total)
{
    if (!progress_on || !isatty(STDERR_FILENO) || total == 0)
        return;
    uint64_t now = bench_now_ns();
    /* Redraw at most 10 times a second: the terminal must not cost more than the work. */
    if (progress_drawn && now - progress_last_ns < 100000000ull && done < total)
        return;
    progress_last_ns = now;
    enum { WIDTH = 40 };
    int fill = (int)((double)done / (double)total * WIDTH);
    char bar[WIDTH + 1];
    for (int i = 0; i < WIDTH; i++)
        bar[i] = i < fill ? '#' : '.';
    bar[WIDTH] = 0;
    fprintf(stderr, "\r%-28.28s [%s] %5.1f%%", what, bar, 100.0 * (double)done / (double)total);
    fflush(stderr);
    progress_drawn = 1;
}

void bench_progress_end(void)
{
    if (progress_drawn) {
        fprintf(stderr, "\r%80s\r", "");
        fflush(stderr);
        progress_drawn = 0;
    }
}

uint64_t bench_rand(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

long long bench_json_num(vmm_allocator *a, const char *key, long long missing)
{
    static char json[1 << 16];
    if (vmm_stats_json(a, json, sizeof json) < 0)
        return missing;
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *k = strstr(json, pat);
    return k ? atoll(k + strlen(pat)) : missing;
}

double bench_quantile(double *v, size_t n, double q)
{
    if (n == 0)
        return 0;
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(q * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

void *bench_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "vmm-bench: out of host memory (%zu bytes)\n", n);
        exit(BENCH_EXIT_FAIL);
    }
    return p;
}

void *bench_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q) {
        fprintf(stderr, "vmm-bench: out of host memory (%zu bytes)\n", n);
        exit(BENCH_EXIT_FAIL);
    }
    return q;
}

void bench_log_sizes(size_t *sizes, int n, double lo, double hi)
{
    uint64_t rng = 42;
    for (int i = 0; i < n; i++) {
        double u = (double)(bench_rand(&rng) >> 11) / 9007199254740992.0;
        double s = exp(log(lo) + u * (log(hi) - log(lo)));
        sizes[i] = ((size_t)s + 511) / 512 * 512;
    }
}

int bench_glibc(void *(**malloc_fn)(size_t), void (**free_fn)(void *))
{
    void *h = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (!h)
        h = dlopen("libc.so.6", RTLD_NOW);
    if (!h)
        return -1;
    /* dlsym on libc's own handle: glibc's malloc, not the jemalloc one the program links */
    *(void **)malloc_fn = dlsym(h, "malloc");
    *(void **)free_fn = dlsym(h, "free");
    return *malloc_fn && *free_fn ? 0 : -1;
}
