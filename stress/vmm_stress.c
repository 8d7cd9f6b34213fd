/*
 * vmm-stress: randomized malloc / free / record_stream / empty_cache on several threads and
 * streams against one allocator, with data checks done by stream work, an independent shadow of
 * the live ranges, vmm_check at phase boundaries, fault injection and a leak check at the end.
 * docs/stress.md explains every option and check. Uses the public API only (vmmalloc.h and
 * vmmalloc_sim.h), so it tests what users get.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vmmalloc.h"
#include "vmmalloc_sim.h"

/* ---- constants ----------------------------------------------------------------------------- */

enum {
    /* vmm_malloc promises at least this alignment (vmmalloc.h). */
    ALIGNMENT = 512,
    /* Blocks up to this size are filled word by word; larger ones get every word of their first
     * and last FILL_EDGE bytes plus one word per ALIGNMENT bytes in between. Any two blocks that
     * overlap share at least one aligned 512-byte unit, so the sampled word of that unit is
     * written by both and the later writer breaks the earlier one's pattern. */
    FULL_FILL_MAX = 256 << 10,
    FILL_EDGE = 4096,
    /* Printed violations; the rest are only counted. */
    MAX_PRINTED = 20,
    /* Pool boundary of the caching design: requests up to 1 MiB live in the small pool. */
    SMALL_POOL_MAX = 1 << 20,
};

#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

/* ---- options ------------------------------------------------------------------------------- */

enum { SIZES_UNIFORM, SIZES_LOGUNIFORM, SIZES_TRAINING };
static const char *const size_names[] = {"uniform", "loguniform", "training"};

typedef struct options {
    uint64_t seed;
    int threads;
    int streams;
    int sizes;
    double live_fraction;
    double faults;
    double seconds;
    uint64_t ops;
    uint64_t check_every;   /* ops between phase boundaries (all threads together) */
    size_t capacity;
    size_t max_size;        /* 0: derived from the distribution and the capacity */
    const char *conf;       /* appended to the generated conf */
    int compare;
    int json;
    int keep_going;
    int quiet;
    int expandable;         /* -1: as the conf says (default true) */
    int plant_skip_record;  /* self-test: hand blocks off without vmm_record_stream */
    double captures;        /* probability that an op is a graph op (capture, replay, destroy) */
    uint64_t sleep_every;   /* --sleep-every N: a sleep / wake cycle every N phase boundaries */
    int map_callbacks;      /* --map-callbacks: a mapping callbacks' map checked at every phase */
    int producer_consumer;  /* --producer-consumer: even threads allocate, odd ones free theirs */
} options;

static options opt = {
    .seed = 0, .threads = 2, .streams = 4, .sizes = SIZES_TRAINING, .live_fraction = 0.8,
    .faults = 0.0, .seconds = 10.0, .ops = 0, .check_every = 2000, .capacity = 2 * GiB,
    .max_size = 0, .conf = "", .compare = 0, .json = 0, .keep_going = 0, .quiet = 0,
    .expandable = -1,
};
static char repro_cmd[4096];

/* ---- small helpers -------------------------------------------------------------------------- */

static uint64_t mix64(uint64_t x)
{
    /* splitmix64 finalizer: a cheap bijection with good avalanche, enough for patterns and RNG. */
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t rng_next(rng *r)
{
    r->s += 0x9e3779b97f4a7c15ull;
    return mix64(r->s);
}
/* Uniform in [0, n); n > 0. */
static uint64_t rng_below(rng *r, uint64_t n)
{
    return rng_next(r) % n;
}
static double rng_unit(rng *r)
{
    return (double)(rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_ns(long ns)
{
    struct timespec ts = {ns / 1000000000L, ns % 1000000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static size_t round_up(size_t x, size_t m)
{
    return (x + m - 1) / m * m;
}

/* "2G", "512M", "4096", "1.5GiB" -> bytes. Returns 0 on success. */
static int parse_size(const char *s, size_t *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || !(v >= 0))
        return -1;
    double mult = 1;
    switch (*end) {
    case 'k': case 'K': mult = 1024.0; end++; break;
    case 'm': case 'M': mult = 1024.0 * 1024; end++; break;
    case 'g': case 'G': mult = 1024.0 * 1024 * 1024; end++; break;
    case 't': case 'T': mult = 1024.0 * 1024 * 1024 * 1024; end++; break;
    default: break;
    }
    if (mult > 1 && (end[0] == 'i' || end[0] == 'I') && (end[1] == 'b' || end[1] == 'B'))
        end += 2;
    else if (mult > 1 && (end[0] == 'b' || end[0] == 'B'))
        end++;
    if (*end)
        return -1;
    *out = (size_t)(v * mult);
    return 0;
}

/* Value of `key` in a "key:value,..." string (as vmm_config_string writes it), or NULL. */
static const char *conf_value(const char *conf, const char *key, char *buf, size_t len)
{
    size_t kl = strlen(key);
    for (const char *p = conf; p && *p;) {
        if (strncmp(p, key, kl) == 0 && p[kl] == ':') {
            const char *v = p + kl + 1;
            size_t n = strcspn(v, ",");
            if (n >= len)
                n = len - 1;
            memcpy(buf, v, n);
            buf[n] = 0;
            return buf;
        }
        p = strchr(p, ',');
        if (p)
            p++;
    }
    return NULL;
}

/* ---- run state ------------------------------------------------------------------------------ */

typedef struct block {
    uint64_t id;
    char *ptr;
    size_t size;        /* requested */
    size_t usable;      /* vmm_usable_size */
    int stream;         /* index into run.streams */
    int huge;           /* training mix: long-lived buffer */
    int filled_ok;      /* the fill launch was queued */
    int handed;         /* given to another stream with record_stream */
    uint64_t key;       /* pattern key */
    uint64_t key2;      /* pattern the other stream writes after a hand-off */
    long slow_ns;       /* how long the other stream's launch lingers */
    atomic_int refs;    /* host + queued launches; the last one frees the record */
    atomic_int filled;  /* set by the fill launch when it has run */
    struct run *run;
} block;

typedef struct range {
    uintptr_t start, end;
    uint64_t id;
} range;

typedef struct thread_state {
    struct run *run;
    int index;
    rng r;
    block **live;
    size_t nlive, cap;
    /* training mix */
    size_t seq_len;
    uint64_t seq_ops;
    pthread_t tid;
} thread_state;

typedef struct counters {
    atomic_uint_fast64_t ops, mallocs, frees, handoffs, exchanges, empty_caches, zero_size;
    atomic_uint_fast64_t ooms, frag_ooms, fault_ooms, naive_free_ooms, oom_retry_ok;
    atomic_uint_fast64_t injected_errors;  /* clean error codes surfaced while faults were on */
    atomic_uint_fast64_t launches_failed, verified, bytes_verified;
    atomic_uint_fast64_t checks;
    atomic_uint_fast64_t captures, replays, graph_destroys, graph_verifies, capture_ooms, shared_pools;
} counters;

typedef struct run {
    const char *label;
    int expandable;
    int is_sim;
    vmm_allocator *a;
    vmm_stream *streams;
    int nstreams;
    size_t capacity;       /* device memory */
    size_t limit;          /* capacity x per_process_memory_fraction */
    size_t page;           /* page size for the footprint of live blocks */
    size_t live_cap;       /* live-set cap in requested bytes */
    size_t max_size;
    thread_state *ts;
    /* shadow of live ranges, sorted by start */
    pthread_mutex_t shadow_mu;
    range *shadow;
    size_t nshadow, shadow_cap;
    uint64_t shadow_usable, shadow_requested;
    uint64_t peak_shadow_usable;
    /* OOM classification needs every thread outside the allocator */
    pthread_rwlock_t oom_lock;
    /* blocks handed to whichever thread takes them next (freed from a thread that did not allocate) */
    pthread_mutex_t xchg_mu;
    block **xchg;
    size_t nxchg, xchg_cap;
    pthread_barrier_t barrier;
    atomic_int stop;
    atomic_size_t live_bytes;
    atomic_uint_fast64_t next_id;
    uint64_t our_syncs;
    double t0, t_end;
    counters c;
    int64_t peak_allocated, peak_reserved, event_waits, pages_remapped, device_syncs, stream_syncs;
    long long tc_hits, tc_kept, tc_others; /* thread caches: mallocs served, frees kept, of those
                                            * the blocks another cache handed out (stats JSON) */
    long long grows_unlocked;   /* growths that created handles with the lock released */
    long long lane_mallocs, lane_frees; /* done under a lane's lock only (src/core/lane.c) */
    uint64_t violations_at_start;
    int empty_rounds;      /* empty_cache calls the recovery at the end needed */
    /* --sleep-every, --map-callbacks (see sleep_cycle, mapwatch) */
    uint64_t phases, sleeps, wakes, wake_retries;
    uint64_t our_stream_syncs;
    struct mapwatch *mw;
    /* --captures: graphs (see graph_capture) */
    pthread_mutex_t graph_mu;        /* one graph op at a time */
    pthread_rwlock_t graph_mem_lock; /* graphs[] for the eager blocks' check */
    struct graph_rec *graphs[8];
    size_t ngraphs;
    uint64_t next_pool;
    vmm_stream cap_s, cap_s2;        /* the capture stream and the one forked into captures */
    atomic_int capturing;
} run_t;

static atomic_uint_fast64_t violations;
static pthread_mutex_t report_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_int monitor_stop;
static double g_t0; /* start of the current run, for the time stamps of violations */

static void violation(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void violation(const char *fmt, ...)
{
    uint64_t n = atomic_fetch_add(&violations, 1) + 1;
    if (n > MAX_PRINTED)
        return;
    pthread_mutex_lock(&report_mu);
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "\nVIOLATION %" PRIu64 " at %.2fs: ", n, now_s() - g_t0);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    if (n == MAX_PRINTED)
        fprintf(stderr, "(further violations are only counted)\n");
    fflush(stderr);
    pthread_mutex_unlock(&report_mu);
}

/* ---- blocks and patterns -------------------------------------------------------------------- */

static void block_unref(block *b)
{
    if (atomic_fetch_sub(&b->refs, 1) == 1)
        free(b);
}

static uint64_t pattern_word(uint64_t key, size_t off)
{
    return mix64(key ^ (off * 0x2545f4914f6cdd1dull));
}

/* Offsets of the words that carry the pattern: call fn for each. Returns the first offset at which
 * `fn` reported a mismatch count > 0 through *bad (or leaves it). */
typedef struct walk {
    uint64_t key;
    int write;
    size_t mismatches;
    size_t first_off;
    uint64_t first_expected, first_got;
} walk;

static void touch_word(walk *w, char *base, size_t off, size_t size)
{
    uint64_t want = pattern_word(w->key, off);
    size_t n = size - off < 8 ? size - off : 8;
    if (w->write) {
        memcpy(base + off, &want, n);
        return;
    }
    uint64_t got = 0;
    memcpy(&got, base + off, n);
    if (n < 8)
        want &= (((uint64_t)1) << (8 * n)) - 1;
    if (got != want) {
        if (w->mismatches++ == 0) {
            w->first_off = off;
            w->first_expected = want;
            w->first_got = got;
        }
    }
}

static void pattern_walk(walk *w, char *base, size_t size)
{
    if (size <= FULL_FILL_MAX) {
        for (size_t off = 0; off < size; off += 8)
            touch_word(w, base, off, size);
        return;
    }
    size_t off = 0;
    for (; off < FILL_EDGE; off += 8)
        touch_word(w, base, off, size);
    for (; off < size - FILL_EDGE; off += ALIGNMENT)
        touch_word(w, base, off, size);
    for (off = round_up(size - FILL_EDGE, 8) - 8; off < size; off += 8)
        touch_word(w, base, off, size);
}

static void pattern_fill(uint64_t key, char *base, size_t size)
{
    walk w = {.key = key, .write = 1};
    pattern_walk(&w, base, size);
}

/* Returns the number of mismatching words; reports the first. */
static size_t pattern_verify(const block *b, uint64_t key, const char *when)
{
    walk w = {.key = key, .write = 0};
    pattern_walk(&w, b->ptr, b->size);
    if (w.mismatches)
        violation("data mismatch (%s): block %" PRIu64 " ptr %p size %zu stream %d%s: %zu bad word(s), "
                  "first at offset %zu: expected 0x%016" PRIx64 " got 0x%016" PRIx64,
                  when, b->id, (void *)b->ptr, b->size, b->stream, b->handed ? " (handed off)" : "",
                  w.mismatches, w.first_off, w.first_expected, w.first_got);
    return w.mismatches;
}

/* Stream work (runs on the sim stream's worker thread). */
static void launch_fill(void *arg)
{
    block *b = arg;
    pattern_fill(b->key, b->ptr, b->size);
    atomic_store_explicit(&b->filled, 1, memory_order_release);
    block_unref(b);
}

static void launch_verify(void *arg)
{
    block *b = arg;
    pattern_verify(b, b->key, "verify before free");
    atomic_fetch_add(&b->run->c.verified, 1);
    atomic_fetch_add(&b->run->c.bytes_verified, b->size);
    block_unref(b);
}

/* The slow user on another stream: still running after the host freed the block. It checks the
 * fill, lingers, rewrites with its own pattern, lingers again and checks that nobody else wrote:
 * a block handed out while this runs shows up on one side or the other. */
static void launch_slow_user(void *arg)
{
    block *b = arg;
    pattern_verify(b, b->key, "other stream, before rewrite");
    sleep_ns(b->slow_ns);
    pattern_fill(b->key2, b->ptr, b->size);
    sleep_ns(b->slow_ns);
    pattern_verify(b, b->key2, "other stream, after rewrite");
    atomic_fetch_add(&b->run->c.verified, 1);
    atomic_fetch_add(&b->run->c.bytes_verified, b->size);
    block_unref(b);
}

/* Queue fn(b) on stream `s`; the launch holds a reference. Returns 1 when queued. */
static int launch(run_t *R, int s, void (*fn)(void *), block *b)
{
    atomic_fetch_add(&b->refs, 1);
    int rc = vmm_sim_launch(R->a, R->streams[s], fn, b);
    if (rc == VMM_OK)
        return 1;
    atomic_fetch_sub(&b->refs, 1);
    atomic_fetch_add(&R->c.launches_failed, 1);
    if (opt.faults > 0 && rc == VMM_EDRIVER)
        atomic_fetch_add(&R->c.injected_errors, 1);
    else
        violation("vmm_sim_launch failed without fault injection: %s (%s)", vmm_status_name(rc),
                  vmm_last_error());
    return 0;
}

/* ---- shadow of live ranges --------------------------------------------------------------------- */

static size_t shadow_lower(run_t *R, uintptr_t start)
{
    size_t lo = 0, hi = R->nshadow;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (R->shadow[mid].start < start)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static void shadow_insert(run_t *R, const block *b)
{
    uintptr_t start = (uintptr_t)b->ptr, end = start + b->usable;
    if (start % ALIGNMENT)
        violation("misaligned pointer: block %" PRIu64 " ptr %p (size %zu) is not %d-byte aligned",
                  b->id, (void *)b->ptr, b->size, ALIGNMENT);
    if (b->usable < b->size)
        violation("vmm_usable_size(%p) = %zu is below the requested %zu (block %" PRIu64 ")",
                  (void *)b->ptr, b->usable, b->size, b->id);
    pthread_mutex_lock(&R->shadow_mu);
    size_t i = shadow_lower(R, start);
    if (i > 0 && R->shadow[i - 1].end > start)
        violation("overlap: block %" PRIu64 " [%p, +%zu) starts inside live block %" PRIu64 " [%p, %p)",
                  b->id, (void *)b->ptr, b->usable, R->shadow[i - 1].id,
                  (void *)R->shadow[i - 1].start, (void *)R->shadow[i - 1].end);
    if (i < R->nshadow && R->shadow[i].start < end)
        violation("overlap: block %" PRIu64 " [%p, +%zu) runs into live block %" PRIu64 " at %p",
                  b->id, (void *)b->ptr, b->usable, R->shadow[i].id, (void *)R->shadow[i].start);
    if (R->nshadow == R->shadow_cap) {
        size_t ncap = R->shadow_cap ? 2 * R->shadow_cap : 1024;
        range *n = realloc(R->shadow, ncap * sizeof *n);
        if (!n) {
            fprintf(stderr, "vmm-stress: out of host memory\n");
            abort();
        }
        R->shadow = n;
        R->shadow_cap = ncap;
    }
    memmove(&R->shadow[i + 1], &R->shadow[i], (R->nshadow - i) * sizeof *R->shadow);
    R->shadow[i] = (range){start, end, b->id};
    R->nshadow++;
    R->shadow_usable += b->usable;
    R->shadow_requested += b->size;
    if (R->shadow_usable > R->peak_shadow_usable)
        R->peak_shadow_usable = R->shadow_usable;
    pthread_mutex_unlock(&R->shadow_mu);
}

static void shadow_remove(run_t *R, const block *b)
{
    pthread_mutex_lock(&R->shadow_mu);
    size_t i = shadow_lower(R, (uintptr_t)b->ptr);
    if (i < R->nshadow && R->shadow[i].id == b->id) {
        memmove(&R->shadow[i], &R->shadow[i + 1], (R->nshadow - i - 1) * sizeof *R->shadow);
        R->nshadow--;
        R->shadow_usable -= b->usable;
        R->shadow_requested -= b->size;
    } else {
        violation("shadow lost block %" PRIu64 " at %p (an overlapping block replaced it?)", b->id,
                  (void *)b->ptr);
    }
    pthread_mutex_unlock(&R->shadow_mu);
}

/* Bytes of whole pages touched by live blocks: what no amount of remapping can give back. */
static size_t shadow_footprint(run_t *R)
{
    size_t total = 0;
    uintptr_t covered = 0; /* end of the last counted page */
    for (size_t i = 0; i < R->nshadow; i++) {
        uintptr_t s = R->shadow[i].start / R->page * R->page;
        uintptr_t e = round_up(R->shadow[i].end, R->page);
        if (s < covered)
            s = covered;
        if (e > s) {
            total += e - s;
            covered = e;
        }
    }
    return total;
}

/* ---- sizes ---------------------------------------------------------------------------------- */

static size_t pick_size(run_t *R, thread_state *t, int *huge)
{
    rng *r = &t->r;
    size_t max = R->max_size;
    *huge = 0;
    switch (opt.sizes) {
    case SIZES_UNIFORM:
        return 1 + rng_below(r, max);
    case SIZES_LOGUNIFORM: {
        double lo = log(512.0), hi = log((double)max);
        return (size_t)exp(lo + (hi - lo) * rng_unit(r));
    }
    default:
        break;
    }
    /* Training-like: the sequence length changes every few hundred ops; activations come in a few
     * shapes scaled by it, so many blocks share a size; a few huge long-lived buffers (weights,
     * optimizer state); small parameters and gradients. Scaled so the longest sequence gives an
     * activation of about capacity/256. */
    if (t->seq_ops-- == 0) {
        t->seq_len = 128 * (1 + rng_below(r, 32));
        t->seq_ops = 100 + rng_below(r, 400);
    }
    size_t hidden = R->capacity / 256 / 4096 / 2;
    if (hidden < 16)
        hidden = 16;
    size_t act = t->seq_len * hidden * 2;
    uint64_t k = rng_below(r, 100);
    size_t s;
    if (k < 2) {
        *huge = 1;
        s = R->capacity / 20 + rng_below(r, R->capacity / 20);
    } else if (k < 27) {
        double lo = log(512.0), hi = log(64.0 * 1024);
        s = (size_t)exp(lo + (hi - lo) * rng_unit(r));
    } else if (k < 37) {
        /* attention scores: seq^2 x heads x 2 bytes, scaled like the activations */
        s = t->seq_len * t->seq_len / 4096 * hidden / 4;
    } else {
        static const unsigned mult[] = {1, 1, 1, 2, 3, 4};
        s = act * mult[rng_below(r, sizeof mult / sizeof mult[0])];
    }
    if (s < 1)
        s = 1;
    return s > max ? max : s;
}

/* ---- operations ------------------------------------------------------------------------------- */

static void live_push(thread_state *t, block *b)
{
    if (t->nlive == t->cap) {
        size_t ncap = t->cap ? 2 * t->cap : 256;
        block **n = realloc(t->live, ncap * sizeof *n);
        if (!n) {
            fprintf(stderr, "vmm-stress: out of host memory\n");
            abort();
        }
        t->live = n;
        t->cap = ncap;
    }
    t->live[t->nlive++] = b;
}

static block *live_take(thread_state *t, size_t i)
{
    block *b = t->live[i];
    t->live[i] = t->live[--t->nlive];
    return b;
}

static int is_clean_failure(int rc)
{
    return rc == VMM_ENOMEM || rc == VMM_EDRIVER;
}

static uint64_t total_failures(run_t *R)
{
    vmm_sim_counters c;
    if (!R->is_sim || vmm_sim_get_counters(R->a, &c) != VMM_OK)
        return 0;
    uint64_t n = 0;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        n += c.failures[k];
    return n;
}

/* ---- CUDA graphs (--captures P) --------------------------------------------------------------------
 * With probability P an op is a graph op instead, one at a time (graph_mu): capture a graph on the
 * capture stream into a private pool (new, or shared with a live graph), replay one, or destroy one.
 * A capture allocates blocks on the capture stream (routed to the pool with vmm_pool_begin), fills
 * them with captured launches, frees some inside the capture (temporaries; some after a forked
 * stream used them, with vmm_record_stream), keeps the others as outputs (in the shadow). Other
 * threads go on meanwhile. Checks: the capture is never invalidated (no allocator call breaks the
 * capture rules; the sim invalidates one that does), a replay never finds its memory unmapped, its
 * outputs hold their pattern right after it (checked by a launch queued behind it), no eager block
 * lies in a graph's memory (vmm_pool_lookup says the default pools, and no range of a live graph
 * overlaps it), and eager patterns stay intact while replays write graph memory. */

enum { GRAPH_MAX = 6, GRAPH_BLOCKS = 10 };

typedef struct gfill {
    char *ptr;
    size_t size;
    uint64_t key;
} gfill;

typedef struct graph_rec {
    uint64_t pool;       /* private pool (pool, 0) */
    vmm_sim_graph *g;
    block *outs[GRAPH_BLOCKS];
    size_t nouts;
    gfill fills[GRAPH_BLOCKS]; /* arguments of the captured launches (replays run them again) */
    range mem[GRAPH_BLOCKS];   /* every block the capture allocated: the graph's memory */
    size_t nmem;
    struct run *run;
} graph_rec;

static void graph_fill(void *arg)
{
    gfill *f = arg;
    pattern_fill(f->key, f->ptr, f->size);
}

static void graph_verify(void *arg)
{
    graph_rec *g = arg;
    for (size_t i = 0; i < g->nouts; i++)
        pattern_verify(g->outs[i], g->outs[i]->key, "graph output right after a replay");
    atomic_fetch_add(&g->run->c.graph_verifies, 1);
}

static void graph_marker(void *arg) { atomic_store((atomic_int *)arg, 1); }

/* An eager block must not lie in a live graph's memory. */
static void graph_mem_check(run_t *R, const block *b)
{
    uint64_t id0 = 1, id1 = 1;
    int rc = vmm_pool_lookup(R->a, b->ptr, &id0, &id1);
    if (rc != VMM_OK || id0 || id1)
        violation("eager block %" PRIu64 " at %p is in private pool (%" PRIu64 ", %" PRIu64 ") (%s)", b->id,
                  (void *)b->ptr, id0, id1, rc ? vmm_last_error() : "lookup ok");
    uintptr_t s = (uintptr_t)b->ptr, e = s + b->usable;
    pthread_rwlock_rdlock(&R->graph_mem_lock);
    for (size_t k = 0; k < R->ngraphs; k++) {
        const graph_rec *g = R->graphs[k];
        for (size_t i = 0; i < g->nmem; i++)
            if (g->mem[i].start < e && s < g->mem[i].end)
                violation("eager block %" PRIu64 " [%p, +%zu) overlaps memory of graph (pool %" PRIu64 ")",
                          b->id, (void *)b->ptr, b->usable, g->pool);
    }
    pthread_rwlock_unlock(&R->graph_mem_lock);
}

/* Wait until the capture stream has run what is queued on it (a marker launch; no sync call). */
static void graph_drain(run_t *R)
{
    atomic_int done;
    atomic_init(&done, 0);
    while (vmm_sim_launch(R->a, R->cap_s, graph_marker, &done) != VMM_OK)
        ; /* only an injected fault fails it */
    while (!atomic_load(&done))
        sleep_ns(20000);
}

static void graph_capture(run_t *R, thread_state *t)
{
    graph_rec *g = calloc(1, sizeof *g);
    if (!g)
        abort();
    g->run = R;
    int shared = R->ngraphs && rng_below(&t->r, 10) < 3;
    g->pool = shared ? R->graphs[rng_below(&t->r, R->ngraphs)]->pool : ++R->next_pool;
    /* The whole capture is one reader of oom_lock: an OOM is classified (as writer) only while no
     * capture is underway, since the allocator rightly refuses to wait during one. */
    pthread_rwlock_rdlock(&R->oom_lock);
    atomic_store(&R->capturing, 1);
    int rc = vmm_pool_begin(R->a, g->pool, 0, R->cap_s);
    if (rc != VMM_OK) {
        violation("vmm_pool_begin(%" PRIu64 ") failed: %s", g->pool, vmm_last_error());
        atomic_store(&R->capturing, 0);
        pthread_rwlock_unlock(&R->oom_lock);
        free(g);
        return;
    }
    int mode = (int)rng_below(&t->r, 3);
    rc = vmm_sim_capture_begin(R->a, R->cap_s, mode);
    if (rc != VMM_OK)
        violation("vmm_sim_capture_begin failed: %s", vmm_last_error());
    size_t n = 2 + rng_below(&t->r, GRAPH_BLOCKS - 1);
    size_t cap_max = R->max_size / 8 < 8 * MiB ? R->max_size / 8 : 8 * MiB;
    for (size_t i = 0; i < n && rc == VMM_OK; i++) {
        size_t size = 512 + rng_below(&t->r, cap_max > 1024 ? cap_max : 1024);
        void *p = NULL;
        int mrc = vmm_malloc(R->a, size, R->cap_s, &p);
        if (mrc != VMM_OK) {
            if (mrc == VMM_ENOMEM || (opt.faults > 0 && mrc == VMM_EDRIVER))
                atomic_fetch_add(&R->c.capture_ooms, 1);
            else
                violation("vmm_malloc(%zu) during capture failed: %s (%s)", size, vmm_status_name(mrc),
                          vmm_last_error());
            continue;
        }
        block *b = calloc(1, sizeof *b);
        if (!b)
            abort();
        b->id = atomic_fetch_add(&R->next_id, 1);
        b->ptr = p;
        b->size = size;
        b->usable = vmm_usable_size(R->a, p);
        b->stream = -1;
        b->key = mix64(opt.seed ^ mix64(b->id) ^ 0x6a09e667u);
        b->run = R;
        atomic_init(&b->refs, 1);
        uint64_t id0 = 0, id1 = 1;
        if (vmm_pool_lookup(R->a, p, &id0, &id1) != VMM_OK || id0 != g->pool || id1)
            violation("block allocated during capture at %p is not in its pool %" PRIu64, p, g->pool);
        g->mem[g->nmem++] = (range){(uintptr_t)p, (uintptr_t)p + b->usable, b->id};
        gfill *f = &g->fills[g->nmem - 1];
        *f = (gfill){p, size, b->key};
        /* captured: runs at each replay (an injected fault leaves it out: not an output then) */
        int filled = vmm_sim_launch(R->a, R->cap_s, graph_fill, f) == VMM_OK;
        if (filled && rng_below(&t->r, 2)) {
            shadow_insert(R, b); /* an output: live until the graph goes */
            g->outs[g->nouts++] = b;
            continue;
        }
        if (rng_below(&t->r, 3) == 0) {
            /* a forked stream of the capture uses it too; it is freed before that work is joined in
             * replay order: the free must wait for the capture's end, then drop that use */
            if (vmm_sim_stream_wait_stream(R->a, R->cap_s2, R->cap_s) == VMM_OK) {
                if (vmm_record_stream(R->a, p, R->cap_s2) != VMM_OK && !(opt.faults > 0))
                    violation("vmm_record_stream during capture failed: %s", vmm_last_error());
                vmm_sim_launch(R->a, R->cap_s2, graph_fill, f);
                if (vmm_sim_stream_wait_stream(R->a, R->cap_s, R->cap_s2) != VMM_OK && !(opt.faults > 0))
                    violation("join of the forked capture stream failed: %s", vmm_last_error());
            }
        }
        int frc = vmm_free(R->a, p);
        if (frc != VMM_OK)
            violation("vmm_free of a temporary during capture failed: %s", vmm_last_error());
        free(b);
    }
    rc = vmm_sim_capture_end(R->a, R->cap_s, &g->g);
    if (rc != VMM_OK)
        violation("the capture was invalidated or failed (pool %" PRIu64 ", mode %d): %s", g->pool, mode,
                  vmm_last_error());
    if (vmm_pool_end(R->a, g->pool, 0) != VMM_OK)
        violation("vmm_pool_end(%" PRIu64 ") failed: %s", g->pool, vmm_last_error());
    atomic_store(&R->capturing, 0);
    pthread_rwlock_unlock(&R->oom_lock);
    atomic_fetch_add(&R->c.captures, 1);
    atomic_fetch_add(&R->c.shared_pools, (uint64_t)shared);
    pthread_rwlock_wrlock(&R->graph_mem_lock);
    R->graphs[R->ngraphs++] = g;
    pthread_rwlock_unlock(&R->graph_mem_lock);
}

static void graph_replay(run_t *R, thread_state *t)
{
    graph_rec *g = R->graphs[rng_below(&t->r, R->ngraphs)];
    if (!g->g)
        return; /* its capture failed */
    int rc = vmm_sim_graph_launch(R->a, g->g, R->cap_s);
    if (rc != VMM_OK)
        violation("replay of the graph of pool %" PRIu64 " failed (its memory unmapped?): %s", g->pool,
                  vmm_last_error());
    else if (g->nouts)
        vmm_sim_launch(R->a, R->cap_s, graph_verify, g); /* queued behind the replay */
    atomic_fetch_add(&R->c.replays, 1);
}

static void graph_destroy(run_t *R, size_t k)
{
    graph_drain(R); /* no replay or verify of it queued any more */
    pthread_rwlock_wrlock(&R->graph_mem_lock);
    graph_rec *g = R->graphs[k];
    R->graphs[k] = R->graphs[--R->ngraphs];
    pthread_rwlock_unlock(&R->graph_mem_lock);
    /* one reader: the outputs leave the shadow and the pool's memory moves together */
    pthread_rwlock_rdlock(&R->oom_lock);
    for (size_t i = 0; i < g->nouts; i++) {
        block *b = g->outs[i];
        shadow_remove(R, b);
        /* vmm_free of a live block cannot fail (vmmalloc.h), faults or not */
        if (vmm_free(R->a, b->ptr) != VMM_OK)
            violation("vmm_free of a graph output failed: %s", vmm_last_error());
        free(b);
    }
    int rc = vmm_pool_release(R->a, g->pool, 0);
    pthread_rwlock_unlock(&R->oom_lock);
    if (rc != VMM_OK && !(opt.faults > 0 && rc == VMM_EDRIVER))
        violation("vmm_pool_release(%" PRIu64 ") failed: %s", g->pool, vmm_last_error());
    vmm_sim_graph_destroy(g->g);
    free(g);
    atomic_fetch_add(&R->c.graph_destroys, 1);
}

static void op_graph(run_t *R, thread_state *t)
{
    if (!R->is_sim || pthread_mutex_trylock(&R->graph_mu) != 0)
        return;
    uint64_t k = rng_below(&t->r, 10);
    if (!R->ngraphs || (R->ngraphs < GRAPH_MAX && k < 4))
        graph_capture(R, t);
    else if (k < 8)
        graph_replay(R, t);
    else
        graph_destroy(R, rng_below(&t->r, R->ngraphs));
    pthread_mutex_unlock(&R->graph_mu);
}

/* Private pools hold memory the shadow does not see (their free blocks): bytes for OOM checks. */
static size_t pool_free_bytes(run_t *R)
{
    static _Thread_local char json[65536];
    if (vmm_stats_json(R->a, json, sizeof json) < 0)
        return 0;
    const char *r = strstr(json, "\"private_pools.reserved_bytes\":");
    const char *a = strstr(json, "\"private_pools.allocated_bytes\":");
    if (!r || !a)
        return 0;
    long long res = atoll(strchr(r, ':') + 1), alloc = atoll(strchr(a, ':') + 1);
    return res > alloc ? (size_t)(res - alloc) : 0;
}

/* An OOM: retry with every other thread outside the allocator, then decide whether live memory
 * really left no room. Called without oom_lock held. Returns the retried pointer with oom_lock
 * still held (for writing), so that the caller enters it in the shadow before any other thread
 * can classify an OOM: released in between, another thread's classification would see the
 * allocator hold a block the shadow lacks. Returns NULL (lock released) on failure. */
static void *classify_oom(run_t *R, size_t size, int stream)
{
    pthread_rwlock_wrlock(&R->oom_lock);
    uint64_t f0 = total_failures(R);
    void *p = NULL;
    int rc = vmm_malloc(R->a, size, R->streams[stream], &p);
    if (rc == VMM_OK) {
        atomic_fetch_add(&R->c.oom_retry_ok, 1);
        return p;
    }
    char err[512];
    snprintf(err, sizeof err, "%s", vmm_last_error());
    if (!is_clean_failure(rc)) {
        violation("vmm_malloc(%zu) failed with %s: %s", size, vmm_status_name(rc), err);
    } else if (total_failures(R) != f0) {
        atomic_fetch_add(&R->c.fault_ooms, 1);
        atomic_fetch_add(&R->c.injected_errors, 1);
    } else if (rc == VMM_EDRIVER) {
        violation("vmm_malloc(%zu) returned EDRIVER with no injected fault: %s", size, err);
    } else {
        atomic_fetch_add(&R->c.ooms, 1);
        pthread_mutex_lock(&R->shadow_mu);
        size_t foot = shadow_footprint(R);
        uint64_t usable = R->shadow_usable;
        pthread_mutex_unlock(&R->shadow_mu);
        /* --captures: private pools keep free memory only they reuse, and during a capture the
         * allocator may not wait for pending frees (the OOM says so): not fragmentation */
        int capturing = opt.captures > 0 && atomic_load(&R->capturing);
        if (opt.captures > 0)
            foot += pool_free_bytes(R);
        size_t need = round_up(size, R->page);
        if (!R->is_sim) {
            /* the real device's capacity and other users are unknown here: count only */
            pthread_rwlock_unlock(&R->oom_lock);
            return NULL;
        }
        if (usable + round_up(size, ALIGNMENT) <= R->limit)
            atomic_fetch_add(&R->c.naive_free_ooms, 1);
        if (foot + need <= R->limit) {
            atomic_fetch_add(&R->c.frag_ooms, 1);
            /* --sleep-every: tags keep their pages apart, the footprint above is too low */
            if (R->expandable && !capturing && !opt.sleep_every)
                violation("fragmentation OOM in expandable mode: request %zu (%zu in pages) on stream %d, "
                          "live blocks cover %zu bytes of pages, limit %zu: %s",
                          size, need, stream, foot, R->limit, err);
        }
    }
    pthread_rwlock_unlock(&R->oom_lock);
    return NULL;
}

static void do_malloc(run_t *R, thread_state *t, size_t size, int huge, int s)
{
    if (atomic_load(&R->live_bytes) + size > R->live_cap)
        return;
    void *p = NULL;
    pthread_rwlock_rdlock(&R->oom_lock);
    int rc = vmm_malloc(R->a, size, R->streams[s], &p);
    if (rc != VMM_OK) {
        pthread_rwlock_unlock(&R->oom_lock);
        p = classify_oom(R, size, s); /* on success oom_lock stays held until shadow_insert */
        if (!p)
            return;
    }
    atomic_fetch_add(&R->c.mallocs, 1);
    block *b = calloc(1, sizeof *b);
    if (!b) {
        fprintf(stderr, "vmm-stress: out of host memory\n");
        abort();
    }
    b->id = atomic_fetch_add(&R->next_id, 1);
    b->ptr = p;
    b->size = size;
    b->usable = vmm_usable_size(R->a, p);
    b->stream = s;
    b->huge = huge;
    b->key = mix64(opt.seed ^ mix64(b->id));
    b->run = R;
    atomic_init(&b->refs, 1);
    atomic_init(&b->filled, 0);
    shadow_insert(R, b);
    pthread_rwlock_unlock(&R->oom_lock);
    if (opt.captures > 0)
        graph_mem_check(R, b);
    atomic_fetch_add(&R->live_bytes, size);
    if (R->is_sim)
        b->filled_ok = launch(R, s, launch_fill, b);
    live_push(t, b);
}

static void op_malloc(run_t *R, thread_state *t)
{
    int huge;
    size_t size = pick_size(R, t, &huge);
    do_malloc(R, t, size, huge, (int)rng_below(&t->r, (uint64_t)R->nstreams));
}

/* Free a block the caller holds (already taken off its list). Returns 0 when freed. vmm_free of a
 * live block cannot fail, injected driver faults or not (vmmalloc.h: PyTorch's free hook cannot
 * retry): a failure is a violation, and the block stays with the caller, without further data
 * checks. */
static int free_block(run_t *R, block *b)
{
    if (b->filled_ok && !b->handed && R->is_sim)
        launch(R, b->stream, launch_verify, b);
    pthread_rwlock_rdlock(&R->oom_lock);
    shadow_remove(R, b);
    int rc = vmm_free(R->a, b->ptr);
    if (rc != VMM_OK) {
        shadow_insert(R, b);
        pthread_rwlock_unlock(&R->oom_lock);
        violation("vmm_free(%p) of live block %" PRIu64 " failed: %s (%s)", (void *)b->ptr, b->id,
                  vmm_status_name(rc), vmm_last_error());
        b->filled_ok = 0; /* a verify may be queued already: no more stream work on it */
        return -1;
    }
    pthread_rwlock_unlock(&R->oom_lock);
    atomic_fetch_sub(&R->live_bytes, b->size);
    atomic_fetch_add(&R->c.frees, 1);
    block_unref(b);
    return 0;
}

static void op_free(run_t *R, thread_state *t)
{
    if (!t->nlive)
        return;
    size_t i = rng_below(&t->r, t->nlive);
    /* Huge training buffers live long: usually pick another block. */
    if (t->live[i]->huge && rng_below(&t->r, 10) != 0)
        return;
    block *b = live_take(t, i);
    if (free_block(R, b) != 0)
        live_push(t, b);
}

/* Hand a filled block to another stream whose slow launch still writes it after the host frees it. */
static void op_handoff(run_t *R, thread_state *t)
{
    if (!t->nlive || !R->is_sim)
        return;
    size_t i = rng_below(&t->r, t->nlive);
    block *b = t->live[i];
    if (!b->filled_ok || !atomic_load_explicit(&b->filled, memory_order_acquire))
        return; /* its fill has not run yet: another stream would race with it */
    live_take(t, i);
    int other;
    if (R->nstreams > 1) {
        other = (int)rng_below(&t->r, (uint64_t)R->nstreams - 1);
        if (other >= b->stream)
            other++;
    } else {
        other = R->nstreams; /* the default stream, kept after the created ones */
    }
    b->handed = 1;
    b->key2 = mix64(b->key ^ 0x5bd1e995u);
    b->slow_ns = (long)(50000 + rng_below(&t->r, 1000000)); /* 0.05-1 ms, twice */
    /* --plant-bug skip-record-stream: the user-side twin of an allocator that forgets a stream's
     * event, to show that the checks catch memory reused while another stream still writes it. */
    int rc = opt.plant_skip_record ? VMM_OK : vmm_record_stream(R->a, b->ptr, R->streams[other]);
    if (rc != VMM_OK) {
        if (opt.faults > 0 && is_clean_failure(rc))
            atomic_fetch_add(&R->c.injected_errors, 1);
        else
            violation("vmm_record_stream(%p) failed: %s (%s)", (void *)b->ptr, vmm_status_name(rc),
                      vmm_last_error());
        b->handed = 0;
    } else if (launch(R, other, launch_slow_user, b)) {
        atomic_fetch_add(&R->c.handoffs, 1);
    }
    size_t size = b->size;
    int stream = b->stream;
    if (free_block(R, b) != 0) {
        live_push(t, b);
        return;
    }
    /* Reuse probe: the same size on the same stream right away, which best fit serves from the
     * block just freed unless the allocator (rightly) still holds it for the other stream. */
    if (rng_below(&t->r, 2))
        do_malloc(R, t, size, 0, stream);
}

static void op_empty_cache(run_t *R)
{
    pthread_rwlock_rdlock(&R->oom_lock);
    int rc = vmm_empty_cache(R->a);
    pthread_rwlock_unlock(&R->oom_lock);
    atomic_fetch_add(&R->c.empty_caches, 1);
    if (rc == VMM_OK)
        return;
    if (opt.faults > 0 && rc == VMM_EDRIVER)
        atomic_fetch_add(&R->c.injected_errors, 1);
    else
        violation("vmm_empty_cache failed: %s (%s)", vmm_status_name(rc), vmm_last_error());
}

/* Give a live block to the exchange, or free one from it: frees from a thread that did not
 * allocate. give: 1 give only, 0 take only, -1 either (a coin). */
static void exchange(run_t *R, thread_state *t, int give)
{
    block *b = NULL;
    pthread_mutex_lock(&R->xchg_mu);
    if (R->nxchg && give != 1 && (give == 0 || rng_below(&t->r, 2))) {
        b = R->xchg[--R->nxchg];
    } else if (t->nlive && give != 0) {
        if (R->nxchg == R->xchg_cap) {
            size_t ncap = R->xchg_cap ? 2 * R->xchg_cap : 64;
            block **n = realloc(R->xchg, ncap * sizeof *n);
            if (!n) {
                fprintf(stderr, "vmm-stress: out of host memory\n");
                abort();
            }
            R->xchg = n;
            R->xchg_cap = ncap;
        }
        R->xchg[R->nxchg++] = live_take(t, rng_below(&t->r, t->nlive));
    }
    pthread_mutex_unlock(&R->xchg_mu);
    if (b) {
        atomic_fetch_add(&R->c.exchanges, 1);
        if (free_block(R, b) != 0)
            live_push(t, b);
    }
}

static void op_exchange(run_t *R, thread_state *t) { exchange(R, t, -1); }

/* --producer-consumer: even threads malloc and give their blocks to the exchange, odd threads
 * mostly free what it holds (the thread caches' depot, src/core/tcache.c: the freeing thread's full
 * bins go to the allocating threads) and malloc and free a few of their own, as a backward thread
 * does. Checks and empty_cache as in the usual mix, rarely. */
static void producer_consumer_op(run_t *R, thread_state *t)
{
    uint64_t k = rng_below(&t->r, 1000);
    if (k >= 998)
        op_empty_cache(R);
    else if (t->index % 2 == 0)
        k < 550 || !t->nlive ? op_malloc(R, t) : exchange(R, t, 1);
    else if (k < 50)
        op_malloc(R, t);
    else if (k < 100 && t->nlive)
        op_free(R, t);
    else
        exchange(R, t, 0);
}

static void op_zero(run_t *R)
{
    void *p = (void *)1;
    int rc = vmm_malloc(R->a, 0, R->streams[0], &p);
    atomic_fetch_add(&R->c.zero_size, 1);
    if (rc != VMM_OK || p != NULL)
        violation("vmm_malloc(0) gave %s and %p, expected OK and NULL", vmm_status_name(rc), p);
}

static void one_op(run_t *R, thread_state *t)
{
    if (opt.captures > 0 && rng_unit(&t->r) < opt.captures) {
        op_graph(R, t);
        atomic_fetch_add(&R->c.ops, 1);
        return;
    }
    if (opt.producer_consumer) {
        producer_consumer_op(R, t);
        atomic_fetch_add(&R->c.ops, 1);
        return;
    }
    uint64_t k = rng_below(&t->r, 1000);
    if (k < 500)
        op_malloc(R, t);
    else if (k < 860)
        op_free(R, t);
    else if (k < 960)
        op_handoff(R, t);
    else if (k < 990)
        op_exchange(R, t);
    else if (k < 998)
        op_empty_cache(R);
    else
        op_zero(R);
    atomic_fetch_add(&R->c.ops, 1);
}

/* ---- phase boundary checks -------------------------------------------------------------------- */

static void phase_check(run_t *R, const char *when)
{
    atomic_fetch_add(&R->c.checks, 1);
    int rc = vmm_check(R->a);
    if (rc != VMM_OK)
        violation("vmm_check (%s) failed: %s (%s)", when, vmm_status_name(rc), vmm_last_error());
    vmm_stats st;
    rc = vmm_get_stats(R->a, &st);
    if (rc != VMM_OK) {
        violation("vmm_get_stats failed: %s", vmm_status_name(rc));
        return;
    }
    pthread_mutex_lock(&R->shadow_mu);
    uint64_t usable = R->shadow_usable, requested = R->shadow_requested, n = R->nshadow;
    pthread_mutex_unlock(&R->shadow_mu);
    if ((uint64_t)st.allocated_bytes[VMM_POOL_ALL].current != usable)
        violation("stats (%s): allocated_bytes.all.current = %" PRId64 " but the live blocks' usable sizes "
                  "sum to %" PRIu64, when, st.allocated_bytes[VMM_POOL_ALL].current, usable);
    if ((uint64_t)st.requested_bytes[VMM_POOL_ALL].current != requested)
        violation("stats (%s): requested_bytes.all.current = %" PRId64 " but the live blocks asked for %" PRIu64,
                  when, st.requested_bytes[VMM_POOL_ALL].current, requested);
    if ((uint64_t)st.allocation[VMM_POOL_ALL].current != n)
        violation("stats (%s): allocation.all.current = %" PRId64 " but %" PRIu64 " blocks are live", when,
                  st.allocation[VMM_POOL_ALL].current, n);
    if (st.allocated_bytes[VMM_POOL_SMALL].current + st.allocated_bytes[VMM_POOL_LARGE].current !=
        st.allocated_bytes[VMM_POOL_ALL].current)
        violation("stats (%s): allocated_bytes small + large != all", when);
    if (st.reserved_bytes[VMM_POOL_ALL].current < st.allocated_bytes[VMM_POOL_ALL].current)
        violation("stats (%s): reserved %" PRId64 " < allocated %" PRId64, when,
                  st.reserved_bytes[VMM_POOL_ALL].current, st.allocated_bytes[VMM_POOL_ALL].current);
    if (R->is_sim && (uint64_t)st.reserved_bytes[VMM_POOL_ALL].current > R->limit)
        violation("stats (%s): reserved %" PRId64 " exceeds the limit %zu", when,
                  st.reserved_bytes[VMM_POOL_ALL].current, R->limit);
    if (st.allocated_bytes[VMM_POOL_ALL].peak > R->peak_allocated)
        R->peak_allocated = st.allocated_bytes[VMM_POOL_ALL].peak;
    if (st.reserved_bytes[VMM_POOL_ALL].peak > R->peak_reserved)
        R->peak_reserved = st.reserved_bytes[VMM_POOL_ALL].peak;
    R->event_waits = st.num_event_waits;
    R->pages_remapped = st.num_pages_remapped;
    if (!R->is_sim)
        return;
    vmm_sim_counters c;
    if (vmm_sim_get_counters(R->a, &c) != VMM_OK) {
        violation("vmm_sim_get_counters failed");
        return;
    }
    if (c.phys_bytes != (uint64_t)st.reserved_bytes[VMM_POOL_ALL].current)
        violation("stats (%s): reserved_bytes.all.current = %" PRId64 " but the device holds %" PRIu64
                  " bytes of physical memory for us", when, st.reserved_bytes[VMM_POOL_ALL].current,
                  c.phys_bytes);
    /* Classic segments come from mem_alloc, which the device does not count as mapped. */
    if (R->expandable && c.mapped_bytes != (uint64_t)st.mapped_bytes[VMM_POOL_ALL].current)
        violation("stats (%s): mapped_bytes.all.current = %" PRId64 " but the device maps %" PRIu64, when,
                  st.mapped_bytes[VMM_POOL_ALL].current, c.mapped_bytes);
    R->device_syncs = (int64_t)(c.device_syncs - R->our_syncs);
    if (opt.captures > 0) /* vmm_pool_release: one device sync when a pool's last user goes */
        R->device_syncs -= st.num_sync_all_streams;
    R->stream_syncs = (int64_t)(c.stream_syncs - R->our_stream_syncs);
    if (R->expandable && (R->device_syncs > 0 || R->stream_syncs > 0))
        violation("synchronization in expandable mode (%s): %" PRId64 " device and %" PRIu64
                  " stream syncs by the allocator", when, R->device_syncs, c.stream_syncs);
}

/* ---- mapping callbacks (--map-callbacks) ---------------------------------------------------------
 * after_map / before_unmap keep their own map of pages (their own mutex). At every phase boundary,
 * with every thread outside the allocator, the map must equal the allocator's mapped pages
 * (vmm_get_mappings, whose page table vmm_check has just compared with the driver's): same pages,
 * same physical handles. before_unmap also checks the pages are still mapped when it runs. */

typedef struct mapwatch {
    pthread_mutex_t mu;
    size_t n, cap;
    uintptr_t *va;
    uint64_t *h;
    uint64_t errors, maps, unmaps;
    size_t seen, differ; /* vmm_get_mappings pass */
} mapwatch;

static long mw_find(const mapwatch *m, uintptr_t va)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->va[i] == va)
            return (long)i;
    return -1;
}

static void mw_after_map(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *h, size_t n)
{
    mapwatch *m = ctx;
    pthread_mutex_lock(&m->mu);
    m->maps++;
    for (size_t i = 0; i < n; i++) {
        uintptr_t p = va + i * (size / n);
        if (mw_find(m, p) >= 0 || !h[i]) {
            m->errors++;
            continue;
        }
        if (m->n == m->cap) {
            m->cap = m->cap ? 2 * m->cap : 1024;
            m->va = realloc(m->va, m->cap * sizeof *m->va);
            m->h = realloc(m->h, m->cap * sizeof *m->h);
            if (!m->va || !m->h)
                abort();
        }
        m->va[m->n] = p;
        m->h[m->n++] = h[i];
    }
    (void)device;
    pthread_mutex_unlock(&m->mu);
}

static void mw_before_unmap(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *h, size_t n)
{
    mapwatch *m = ctx;
    pthread_mutex_lock(&m->mu);
    m->unmaps++;
    for (size_t i = 0; i < n; i++) {
        long k = mw_find(m, va + i * (size / n));
        if (k < 0 || m->h[k] != h[i]) {
            m->errors++;
            continue;
        }
        m->va[k] = m->va[m->n - 1];
        m->h[k] = m->h[--m->n];
    }
    (void)device;
    pthread_mutex_unlock(&m->mu);
}

static void mw_view(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *h, size_t n)
{
    mapwatch *m = ctx;
    for (size_t i = 0; i < n; i++) {
        long k = mw_find(m, va + i * (size / n));
        m->differ += k < 0 || m->h[k] != h[i];
        m->seen++;
    }
    (void)device;
}

static void mapwatch_check(run_t *R, const char *when)
{
    mapwatch *m = R->mw;
    if (!m)
        return;
    pthread_mutex_lock(&m->mu);
    m->seen = m->differ = 0;
    int rc = vmm_get_mappings(R->a, mw_view, m);
    if (rc != VMM_OK)
        violation("vmm_get_mappings failed: %s", vmm_last_error());
    else if (m->differ || m->seen != m->n || m->errors)
        violation("mapping callbacks (%s): their map has %zu pages (%" PRIu64 " inconsistent notices), the "
                  "allocator maps %zu, %zu of them differ", when, m->n, m->errors, m->seen, m->differ);
    pthread_mutex_unlock(&m->mu);
}

static void mapwatch_start(run_t *R)
{
    R->mw = calloc(1, sizeof *R->mw);
    pthread_mutex_init(&R->mw->mu, NULL);
    if (vmm_set_mapping_callbacks(R->a, mw_after_map, mw_before_unmap, R->mw) != VMM_OK)
        violation("vmm_set_mapping_callbacks failed: %s", vmm_last_error());
}

/* After vmm_destroy: before_unmap came for every page. */
static void mapwatch_end(run_t *R)
{
    mapwatch *m = R->mw;
    if (!m)
        return;
    if (m->n || m->errors)
        violation("mapping callbacks: %zu pages still in their map after vmm_destroy, %" PRIu64
                  " inconsistent notices", m->n, m->errors);
    free(m->va);
    free(m->h);
    pthread_mutex_destroy(&m->mu);
    free(m);
    R->mw = NULL;
}

/* ---- sleep / wake cycles (--sleep-every) -----------------------------------------------------------
 * Blocks get one of three tags (the tag changes at every phase boundary). Every N boundaries, with
 * every thread outside the allocator, a random set of tags goes to sleep with backup; the checks
 * then: vmm_check, the stats against the shadow (allocated unchanged, sleeping bytes at most what is
 * allocated, reserved equal to what the device holds), an allocation under a sleeping tag refused;
 * then a staged wake (one tag, checks, the rest). A wake that fails with faults injected is retried
 * with faults off. Every byte is checked later by the verify launch each block gets at its free. */

static const char *const stress_tags[3] = {"", "weights", "kv_cache"};

static void sleep_checks(run_t *R, const char *when)
{
    int rc = vmm_check(R->a);
    if (rc != VMM_OK)
        violation("vmm_check (%s) failed: %s", when, vmm_last_error());
    vmm_stats st;
    if (vmm_get_stats(R->a, &st) != VMM_OK)
        return;
    pthread_mutex_lock(&R->shadow_mu);
    uint64_t usable = R->shadow_usable;
    pthread_mutex_unlock(&R->shadow_mu);
    if ((uint64_t)st.allocated_bytes[VMM_POOL_ALL].current != usable)
        violation("stats (%s): allocated_bytes %" PRId64 " but the live blocks' usable sizes sum to %" PRIu64,
                  when, st.allocated_bytes[VMM_POOL_ALL].current, usable);
    if (st.sleeping_bytes.current < 0 || (uint64_t)st.sleeping_bytes.current > usable)
        violation("stats (%s): sleeping_bytes %" PRId64 " out of [0, %" PRIu64 "]", when,
                  st.sleeping_bytes.current, usable);
    vmm_sim_counters c;
    if (R->is_sim && vmm_sim_get_counters(R->a, &c) == VMM_OK &&
        c.phys_bytes != (uint64_t)st.reserved_bytes[VMM_POOL_ALL].current)
        violation("stats (%s): reserved %" PRId64 " but the device holds %" PRIu64, when,
                  st.reserved_bytes[VMM_POOL_ALL].current, c.phys_bytes);
    if (opt.map_callbacks)
        mapwatch_check(R, when);
}

static void faults_set(run_t *R, int on)
{
    if (R->is_sim && opt.faults > 0)
        vmm_sim_fail_random(R->a, -1, on ? opt.faults : 0.0, opt.seed + R->phases);
}

static void sleep_cycle(run_t *R)
{
    rng r = {mix64(opt.seed ^ (R->phases * 0x9e37u))};
    vmm_sim_counters c0;
    if (R->is_sim)
        vmm_sim_get_counters(R->a, &c0);
    /* untagged blocks of classic mode live in cuMemAlloc segments, which cannot sleep */
    int first = R->expandable ? 0 : 1;
    const char *names[3];
    size_t n = 0;
    for (int t = first; t < 3; t++)
        if (rng_below(&r, 2))
            names[n++] = stress_tags[t];
    if (!n)
        names[n++] = stress_tags[2];
    int rc = vmm_sleep(R->a, names, n, VMM_SLEEP_BACKUP | VMM_SLEEP_KEEP_HOST);
    /* with faults: a copy or an unmap may fail (EDRIVER), pinning host memory too (EHOSTMEM) */
    if (rc != VMM_OK && !(opt.faults > 0 && (is_clean_failure(rc) || rc == VMM_EHOSTMEM)))
        violation("vmm_sleep failed: %s (%s)", vmm_status_name(rc), vmm_last_error());
    if (rc == VMM_OK)
        R->sleeps++;
    sleep_checks(R, "asleep");
    int asleep = vmm_is_asleep(R->a, names[0]);
    if (asleep == 1) {
        void *p = NULL;
        vmm_set_tag(R->a, names[0]);
        int mrc = vmm_malloc(R->a, 4096, R->streams[0], &p);
        if (mrc != VMM_EINVAL)
            violation("vmm_malloc under the sleeping tag \"%s\" gave %s, expected EINVAL", names[0],
                      vmm_status_name(mrc));
        if (p)
            vmm_free(R->a, p);
    }
    /* staged wake: the first tag, then the rest */
    for (int stage = 0; stage < 2; stage++) {
        const char *const *w = stage == 0 ? names : NULL;
        size_t wn = stage == 0 ? 1 : 0;
        rc = vmm_wake(R->a, w, wn);
        if (rc != VMM_OK) {
            if (!(opt.faults > 0 && (is_clean_failure(rc) || rc == VMM_EHOSTMEM)))
                violation("vmm_wake failed: %s (%s)", vmm_status_name(rc), vmm_last_error());
            faults_set(R, 0);
            R->wake_retries++;
            rc = vmm_wake(R->a, w, wn);
            faults_set(R, 1);
            if (rc != VMM_OK)
                violation("vmm_wake failed again with faults off: %s (%s)", vmm_status_name(rc),
                          vmm_last_error());
        }
        if (rc == VMM_OK)
            R->wakes++;
        sleep_checks(R, stage == 0 ? "after a staged wake" : "awake");
    }
    for (int t = 0; t < 3; t++)
        if (vmm_is_asleep(R->a, stress_tags[t]) == 1)
            violation("tag \"%s\" still asleep after the wakes", stress_tags[t]);
    /* the tag of the next phase's allocations */
    vmm_set_tag(R->a, stress_tags[first + (int)rng_below(&r, (uint64_t)(3 - first))]);
    /* wake frees a backup buffer it cannot reuse (cudaFreeHost synchronizes the device); waits the
     * driver would not give an event for synchronize a stream: both are the cycle's, not malloc's */
    vmm_sim_counters c1;
    if (R->is_sim && vmm_sim_get_counters(R->a, &c1) == VMM_OK) {
        R->our_syncs += c1.device_syncs - c0.device_syncs;
        R->our_stream_syncs += c1.stream_syncs - c0.stream_syncs;
    }
}

/* ---- threads ------------------------------------------------------------------------------------ */

static void *worker(void *arg)
{
    thread_state *t = arg;
    run_t *R = t->run;
    uint64_t per_phase = opt.check_every / (uint64_t)opt.threads;
    if (per_phase == 0)
        per_phase = 1;
    for (;;) {
        for (uint64_t i = 0; i < per_phase; i++) {
            /* End the phase early when the run is over, so --seconds holds however slow ops are. */
            if ((opt.ops && atomic_load(&R->c.ops) >= opt.ops) ||
                (opt.seconds > 0 && now_s() - R->t0 >= opt.seconds) ||
                (!opt.keep_going && atomic_load(&violations) > R->violations_at_start))
                break;
            one_op(R, t);
        }
        int serial = pthread_barrier_wait(&R->barrier) == PTHREAD_BARRIER_SERIAL_THREAD;
        if (serial) {
            phase_check(R, "phase boundary");
            if (opt.map_callbacks)
                mapwatch_check(R, "phase boundary");
            if (opt.sleep_every && ++R->phases % opt.sleep_every == 0)
                sleep_cycle(R);
            double el = now_s() - R->t0;
            uint64_t ops = atomic_load(&R->c.ops);
            if ((opt.ops && ops >= opt.ops) || (opt.seconds > 0 && el >= opt.seconds) ||
                (!opt.ops && opt.seconds <= 0) ||
                (!opt.keep_going && atomic_load(&violations) > R->violations_at_start))
                atomic_store(&R->stop, 1);
        }
        pthread_barrier_wait(&R->barrier);
        if (atomic_load(&R->stop))
            break;
    }
    return NULL;
}

static void *monitor(void *arg)
{
    run_t *R = arg;
    while (!atomic_load(&monitor_stop)) {
        sleep_ns(250000000L);
        if (atomic_load(&monitor_stop))
            break;
        fprintf(stderr, "\r[%s] %.1fs ops %" PRIuFAST64 " live %zu MiB ooms %" PRIuFAST64 " frag %" PRIuFAST64
                        " handoffs %" PRIuFAST64 " violations %" PRIuFAST64 "   ",
                R->label, now_s() - R->t0, atomic_load(&R->c.ops), atomic_load(&R->live_bytes) >> 20,
                atomic_load(&R->c.ooms), atomic_load(&R->c.frag_ooms), atomic_load(&R->c.handoffs),
                atomic_load(&violations));
        fflush(stderr);
    }
    return NULL;
}

/* ---- one run -------------------------------------------------------------------------------- */

static int setup(run_t *R, int expandable)
{
    char conf[2048];
    if (expandable < 0)
        snprintf(conf, sizeof conf, "driver:sim,sim_capacity:%zu,%s", opt.capacity, opt.conf);
    else
        snprintf(conf, sizeof conf, "driver:sim,sim_capacity:%zu,expandable_segments:%s,%s", opt.capacity,
                 expandable ? "true" : "false", opt.conf);
    int rc = vmm_create(conf, &R->a);
    if (rc != VMM_OK) {
        fprintf(stderr, "vmm-stress: vmm_create(\"%s\") failed: %s (%s)\n", conf, vmm_status_name(rc),
                vmm_last_error());
        return -1;
    }
    char cs[4096], v[64];
    if (vmm_config_string(R->a, cs, sizeof cs) < 0)
        cs[0] = 0;
    R->expandable = !(conf_value(cs, "expandable_segments", v, sizeof v) && strcmp(v, "false") == 0);
    R->label = R->expandable ? "expandable" : "classic";
    double fraction = 1.0;
    if (conf_value(cs, "per_process_memory_fraction", v, sizeof v))
        fraction = strtod(v, NULL);
    size_t small_page = 2 * MiB, large_page = 2 * MiB;
    if (conf_value(cs, "small_page_size", v, sizeof v))
        parse_size(v, &small_page);
    if (conf_value(cs, "large_page_size", v, sizeof v))
        parse_size(v, &large_page);
    /* Classic segments are 2 MiB / 20 MiB / rounded to 2 MiB; measure both modes with the same
     * page so their counts compare; the larger page keeps the estimate conservative. */
    R->page = small_page > large_page ? small_page : large_page;
    if (R->page < 2 * MiB)
        R->page = 2 * MiB;

    vmm_stream s0;
    rc = vmm_sim_stream_create(R->a, &s0);
    R->is_sim = rc != VMM_ENOTSUP;
    R->capacity = opt.capacity;
    if (R->is_sim) {
        if (rc != VMM_OK) {
            fprintf(stderr, "vmm-stress: vmm_sim_stream_create failed: %s\n", vmm_last_error());
            return -1;
        }
        vmm_sim_counters c;
        if (vmm_sim_get_counters(R->a, &c) == VMM_OK && c.capacity_bytes)
            R->capacity = c.capacity_bytes;
        R->nstreams = opt.streams;
        R->streams = calloc((size_t)opt.streams + 1, sizeof *R->streams);
        R->streams[0] = s0;
        for (int i = 1; i < opt.streams; i++) {
            rc = vmm_sim_stream_create(R->a, &R->streams[i]);
            if (rc != VMM_OK) {
                fprintf(stderr, "vmm-stress: vmm_sim_stream_create failed: %s\n", vmm_last_error());
                return -1;
            }
        }
        R->streams[opt.streams] = NULL; /* default stream: hand-off target with --streams 1 */
        if (opt.captures > 0 && (vmm_sim_stream_create(R->a, &R->cap_s) != VMM_OK ||
                                 vmm_sim_stream_create(R->a, &R->cap_s2) != VMM_OK)) {
            fprintf(stderr, "vmm-stress: vmm_sim_stream_create failed: %s\n", vmm_last_error());
            return -1;
        }
    } else {
        if (opt.faults > 0) {
            fprintf(stderr, "vmm-stress: --faults needs the simulated driver\n");
            return -1;
        }
        fprintf(stderr, "vmm-stress: the driver is not the simulator: fill/verify data checks and hand-offs "
                        "need the sim (the public API has no device memset/copy yet); running the shadow, "
                        "stats, OOM and vmm_check checks on the default stream only\n");
        R->nstreams = 1;
        R->streams = calloc(2, sizeof *R->streams);
    }
    R->limit = (size_t)((double)R->capacity * fraction);
    R->live_cap = (size_t)((double)R->limit * opt.live_fraction);
    R->max_size = opt.max_size;
    if (!R->max_size) {
        R->max_size = opt.sizes == SIZES_UNIFORM ? R->capacity / 16 : R->capacity / 4;
        if (R->max_size > GiB)
            R->max_size = GiB;
    }
    if (R->max_size < 512)
        R->max_size = 512;
    pthread_mutex_init(&R->shadow_mu, NULL);
    pthread_mutex_init(&R->xchg_mu, NULL);
    pthread_mutex_init(&R->graph_mu, NULL);
    pthread_rwlock_init(&R->graph_mem_lock, NULL);
    pthread_rwlockattr_t ra;
    pthread_rwlockattr_init(&ra);
    /* Writers (OOM classification) must not starve behind a steady stream of readers. */
    pthread_rwlockattr_setkind_np(&ra, PTHREAD_RWLOCK_PREFER_WRITER_NONRECURSIVE_NP);
    pthread_rwlock_init(&R->oom_lock, &ra);
    pthread_rwlockattr_destroy(&ra);
    pthread_barrier_init(&R->barrier, NULL, (unsigned)opt.threads);
    atomic_init(&R->stop, 0);
    atomic_init(&R->live_bytes, 0);
    atomic_init(&R->next_id, 1);
    R->violations_at_start = atomic_load(&violations);
    return 0;
}

static void teardown_checks(run_t *R)
{
    /* Faults off, then free everything (with verification) and check that memory comes back. */
    if (R->is_sim && opt.faults > 0)
        vmm_sim_fail_random(R->a, -1, 0.0, opt.seed);
    for (size_t i = 0; i < R->nxchg; i++)
        live_push(&R->ts[0], R->xchg[i]);
    R->nxchg = 0;
    while (R->ngraphs) /* graphs go first: their pools' memory returns at the last release */
        graph_destroy(R, R->ngraphs - 1);
    for (int i = 0; i < opt.threads; i++) {
        thread_state *t = &R->ts[i];
        while (t->nlive) {
            block *b = live_take(t, t->nlive - 1);
            if (free_block(R, b) != 0) {
                violation("vmm_free(%p) of block %" PRIu64 " still fails with faults off: %s", (void *)b->ptr,
                          b->id, vmm_last_error());
                block_unref(b);
            }
        }
    }
    if (R->is_sim) {
        int rc = vmm_sim_synchronize(R->a);
        R->our_syncs++;
        if (rc != VMM_OK)
            violation("vmm_sim_synchronize failed: %s", vmm_last_error());
    }
    phase_check(R, "after freeing everything");
    /* vmm_empty_cache never waits: memory freed since the last fence on its stream is released
     * only once a fence recorded by one empty_cache has completed. So: empty_cache (records the
     * fences), synchronize (they complete), empty_cache (releases); a third round must not be
     * needed. */
    vmm_stats st;
    for (R->empty_rounds = 1; R->empty_rounds <= 2; R->empty_rounds++) {
        int rc = vmm_empty_cache(R->a);
        if (rc != VMM_OK)
            violation("final vmm_empty_cache failed: %s (%s)", vmm_status_name(rc), vmm_last_error());
        if (vmm_get_stats(R->a, &st) == VMM_OK && st.reserved_bytes[VMM_POOL_ALL].current == 0)
            break;
        if (R->is_sim && R->empty_rounds < 2) {
            vmm_sim_synchronize(R->a);
            R->our_syncs++;
        }
    }
    phase_check(R, "after the final empty_cache");
    if (vmm_get_stats(R->a, &st) == VMM_OK) {
        if (st.reserved_bytes[VMM_POOL_ALL].current != 0 || st.allocated_bytes[VMM_POOL_ALL].current != 0 ||
            st.mapped_bytes[VMM_POOL_ALL].current != 0)
            violation("memory not recovered: after freeing everything and vmm_empty_cache, reserved %" PRId64
                      ", allocated %" PRId64 ", mapped %" PRId64 " bytes",
                      st.reserved_bytes[VMM_POOL_ALL].current, st.allocated_bytes[VMM_POOL_ALL].current,
                      st.mapped_bytes[VMM_POOL_ALL].current);
        if (st.allocated_bytes[VMM_POOL_ALL].peak > R->peak_allocated)
            R->peak_allocated = st.allocated_bytes[VMM_POOL_ALL].peak;
        if (st.reserved_bytes[VMM_POOL_ALL].peak > R->peak_reserved)
            R->peak_reserved = st.reserved_bytes[VMM_POOL_ALL].peak;
        R->event_waits = st.num_event_waits;
        R->pages_remapped = st.num_pages_remapped;
        static char json[65536];
        if (vmm_stats_json(R->a, json, sizeof json) >= 0) {
            const char *h = strstr(json, "\"thread_caches.malloc_hits\":");
            const char *k = strstr(json, "\"thread_caches.frees_kept\":");
            R->tc_hits = h ? atoll(strchr(h, ':') + 1) : 0;
            R->tc_kept = k ? atoll(strchr(k, ':') + 1) : 0;
            const char *o = strstr(json, "\"thread_caches.frees_kept_from_others\":");
            R->tc_others = o ? atoll(strchr(o, ':') + 1) : 0;
            const char *g = strstr(json, "\"growths_unlocked\":");
            R->grows_unlocked = g ? atoll(strchr(g, ':') + 1) : 0;
            const char *lm = strstr(json, "\"lanes.mallocs\":");
            const char *lf = strstr(json, "\"lanes.frees\":");
            R->lane_mallocs = lm ? atoll(strchr(lm, ':') + 1) : 0;
            R->lane_frees = lf ? atoll(strchr(lf, ':') + 1) : 0;
        }
    }
    if (R->is_sim) {
        vmm_sim_counters c;
        if (vmm_sim_get_counters(R->a, &c) == VMM_OK && (c.phys_bytes || c.live_handles || c.mapped_bytes))
            violation("device memory not recovered: %" PRIu64 " physical bytes, %" PRIu64 " handles, %" PRIu64
                      " mapped bytes left after vmm_empty_cache",
                      c.phys_bytes, c.live_handles, c.mapped_bytes);
    }
}

static double run_once(run_t *R, int expandable)
{
    memset(R, 0, sizeof *R);
    if (setup(R, expandable) != 0)
        exit(2);
    R->ts = calloc((size_t)opt.threads, sizeof *R->ts);
    if (opt.map_callbacks)
        mapwatch_start(R);
    for (int t = 2; opt.sleep_every && t >= 0; t--) /* every tag known; untagged first */
        vmm_set_tag(R->a, stress_tags[t]);
    if (R->is_sim && opt.faults > 0)
        vmm_sim_fail_random(R->a, -1, opt.faults, opt.seed);
    R->t0 = g_t0 = now_s();
    pthread_t mon;
    int progress = isatty(STDERR_FILENO) && !opt.quiet;
    atomic_store(&monitor_stop, 0);
    if (progress)
        pthread_create(&mon, NULL, monitor, R);
    for (int i = 0; i < opt.threads; i++) {
        thread_state *t = &R->ts[i];
        t->run = R;
        t->index = i;
        t->r.s = mix64(opt.seed + 0x1000193u * (uint64_t)(i + 1));
        pthread_create(&t->tid, NULL, worker, t);
    }
    for (int i = 0; i < opt.threads; i++)
        pthread_join(R->ts[i].tid, NULL);
    if (progress) {
        atomic_store(&monitor_stop, 1);
        pthread_join(mon, NULL);
        fputc('\n', stderr);
    }
    double elapsed = now_s() - R->t0;
    teardown_checks(R);
    vmm_destroy(R->a);
    R->a = NULL;
    mapwatch_end(R);
    for (int i = 0; i < opt.threads; i++)
        free(R->ts[i].live);
    free(R->ts);
    free(R->xchg);
    free(R->shadow);
    free(R->streams);
    pthread_barrier_destroy(&R->barrier);
    pthread_rwlock_destroy(&R->oom_lock);
    pthread_mutex_destroy(&R->shadow_mu);
    pthread_mutex_destroy(&R->xchg_mu);
    pthread_mutex_destroy(&R->graph_mu);
    pthread_rwlock_destroy(&R->graph_mem_lock);
    return elapsed;
}

/* ---- output -------------------------------------------------------------------------------------- */

static void print_summary(const run_t *R, double secs, int json, FILE *f)
{
    const counters *c = &R->c;
#define L(x) (unsigned long long)atomic_load(&c->x)
    if (json) {
        fprintf(f,
                "{\"mode\":\"%s\",\"ops\":%llu,\"mallocs\":%llu,\"frees\":%llu,\"handoffs\":%llu,"
                "\"cross_thread_frees\":%llu,\"empty_caches\":%llu,\"verified_blocks\":%llu,"
                "\"verified_bytes\":%llu,\"checks\":%llu,\"peak_live_bytes\":%llu,\"peak_allocated_bytes\":%lld,"
                "\"peak_reserved_bytes\":%lld,\"ooms\":%llu,\"fragmentation_ooms\":%llu,"
                "\"ooms_with_free_bytes\":%llu,\"oom_retries_ok\":%llu,\"fault_ooms\":%llu,"
                "\"injected_errors\":%llu,\"failed_launches\":%llu,\"event_waits\":%lld,\"pages_remapped\":%lld,"
                "\"allocator_device_syncs\":%lld,\"allocator_stream_syncs\":%lld,\"final_empty_cache_rounds\":%d,"
                "\"captures\":%llu,\"replays\":%llu,\"graph_verifies\":%llu,\"graph_destroys\":%llu,"
                "\"capture_ooms\":%llu,\"seconds\":%.3f}",
                R->label, L(ops), L(mallocs), L(frees), L(handoffs), L(exchanges), L(empty_caches), L(verified),
                L(bytes_verified), L(checks), (unsigned long long)R->peak_shadow_usable,
                (long long)R->peak_allocated, (long long)R->peak_reserved, L(ooms), L(frag_ooms),
                L(naive_free_ooms), L(oom_retry_ok), L(fault_ooms), L(injected_errors), L(launches_failed),
                (long long)R->event_waits, (long long)R->pages_remapped, (long long)R->device_syncs,
                (long long)R->stream_syncs, R->empty_rounds, L(captures), L(replays), L(graph_verifies),
                L(graph_destroys), L(capture_ooms), secs);
        return;
    }
    fprintf(f, "%-10s %.1fs: %llu ops (%llu mallocs, %llu frees, %llu hand-offs, %llu cross-thread frees, "
               "%llu empty_cache), %llu blocks verified, %llu checks\n",
            R->label, secs, L(ops), L(mallocs), L(frees), L(handoffs), L(exchanges), L(empty_caches), L(verified),
            L(checks));
    if (opt.captures > 0)
        fprintf(f, "%-10s graphs: %llu captures (%llu into a shared pool, %llu allocations refused while "
                   "capturing), %llu replays (%llu verified), %llu destroyed\n",
                R->label, L(captures), L(shared_pools), L(capture_ooms), L(replays), L(graph_verifies),
                L(graph_destroys));
    if (opt.sleep_every)
        fprintf(f, "%-10s sleep: %llu sleeps, %llu wakes (%llu retried with faults off)\n", R->label,
                (unsigned long long)R->sleeps, (unsigned long long)R->wakes,
                (unsigned long long)R->wake_retries);
    if (opt.map_callbacks && R->mw)
        fprintf(f, "%-10s mapping callbacks: %llu after_map, %llu before_unmap\n", R->label,
                (unsigned long long)R->mw->maps, (unsigned long long)R->mw->unmaps);
    fprintf(f, "%-10s peak live %.1f MiB, peak allocated %.1f MiB, peak reserved %.1f MiB of %.1f MiB; "
               "OOMs %llu (fragmentation %llu, with free bytes %llu, fault-caused %llu), injected errors %llu, "
               "event waits %lld, pages remapped %lld, thread caches: %lld mallocs served, %lld frees kept "
               "(%lld of another cache's blocks), "
               "growths unlocked %lld, lane mallocs %lld, lane frees %lld\n",
            R->label, (double)R->peak_shadow_usable / MiB, (double)R->peak_allocated / MiB,
            (double)R->peak_reserved / MiB, (double)R->capacity / MiB, L(ooms), L(frag_ooms), L(naive_free_ooms),
            L(fault_ooms), L(injected_errors), (long long)R->event_waits, (long long)R->pages_remapped,
            R->tc_hits, R->tc_kept, R->tc_others, R->grows_unlocked, R->lane_mallocs, R->lane_frees);
#undef L
}

static void leak_check(void)
{
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    if (g.phys_bytes || g.live_handles || g.mapped_bytes || g.reserved_va_bytes || g.live_classic_allocs ||
        g.live_streams || g.live_events)
        violation("leak after vmm_destroy: %" PRIu64 " physical bytes, %" PRIu64 " handles, %" PRIu64
                  " mapped bytes, %" PRIu64 " VA bytes, %" PRIu64 " classic allocations, %" PRIu64
                  " streams, %" PRIu64 " events still live",
                  g.phys_bytes, g.live_handles, g.mapped_bytes, g.reserved_va_bytes, g.live_classic_allocs,
                  g.live_streams, g.live_events);
}

/* A crash inside stream work or the allocator still tells how to reproduce it. */
static void on_fatal(int sig)
{
    static const char msg[] = "\nvmm-stress: fatal signal; reproduce with:\n  ";
    ssize_t w = write(STDERR_FILENO, msg, sizeof msg - 1);
    w = write(STDERR_FILENO, repro_cmd, strlen(repro_cmd));
    w = write(STDERR_FILENO, "\n", 1);
    (void)w;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vmm-stress [options]\n"
            "  --seed N            random seed (default: from the clock; printed)\n"
            "  --threads T         host threads (default 2)\n"
            "  --streams S         simulated streams (default 4)\n"
            "  --sizes D           uniform | loguniform | training (default training)\n"
            "  --live-fraction F   cap live requested bytes at F x usable device memory (default 0.8)\n"
            "  --capacity SIZE     simulated device memory, e.g. 512M (default 2G)\n"
            "  --max-size SIZE     largest request (default: capacity/16 uniform, capacity/4 else, <= 1G)\n"
            "  --faults P          every driver call fails with probability P (sim only)\n"
            "  --seconds S         stop after S seconds (default 10; with --ops: whichever first)\n"
            "  --ops N             stop after N operations\n"
            "  --check-every N     vmm_check and stats comparison every N ops (default 2000)\n"
            "  --conf STRING       appended to the allocator conf (e.g. max_split_size_mb:64, driver:cuda)\n"
            "  --expandable B      true | false (default: the conf's, i.e. true)\n"
            "  --compare           run expandable_segments true then false on the same seed\n"
            "  --keep-going        do not stop at the first phase with a violation\n"
            "  --json              print one JSON summary object on stdout\n"
            "  --quiet             no progress line\n"
            "  --sleep-every N     every N phase boundaries, put random tags to sleep (backup) and wake\n"
            "                      them in two stages; blocks are tagged per phase (see docs/stress.md)\n"
            "  --map-callbacks     mapping callbacks keep a map of pages, checked against the allocator's\n"
            "                      at every phase boundary\n"
            "  --producer-consumer even threads malloc and give their blocks away, odd threads free them\n"
            "                      (the thread caches' depot; see docs/stress.md)\n"
            "  --captures P        with probability P an op captures a CUDA graph into a private pool,\n"
            "                      replays one or destroys one (sim only; see docs/stress.md)\n"
            "  --plant-bug skip-record-stream\n"
            "                      self-test: hand blocks to other streams without vmm_record_stream;\n"
            "                      the run must then report violations\n");
}

static void build_repro(char **argv)
{
    size_t n = (size_t)snprintf(repro_cmd, sizeof repro_cmd,
                                "%s --seed %" PRIu64 " --threads %d --streams %d --sizes %s --live-fraction %g "
                                "--capacity %zu --faults %g --check-every %" PRIu64,
                                argv[0], opt.seed, opt.threads, opt.streams, size_names[opt.sizes],
                                opt.live_fraction, opt.capacity, opt.faults, opt.check_every);
    if (opt.ops && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --ops %" PRIu64, opt.ops);
    if (n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --seconds %g", opt.seconds);
    if (opt.max_size && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --max-size %zu", opt.max_size);
    if (opt.expandable >= 0 && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --expandable %s",
                              opt.expandable ? "true" : "false");
    if (opt.plant_skip_record && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --plant-bug skip-record-stream");
    if (opt.captures > 0 && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --captures %g", opt.captures);
    if (opt.sleep_every && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --sleep-every %" PRIu64, opt.sleep_every);
    if (opt.map_callbacks && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --map-callbacks");
    if (opt.producer_consumer && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --producer-consumer");
    if (opt.compare && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --compare");
    if (opt.conf[0] && n < sizeof repro_cmd)
        n += (size_t)snprintf(repro_cmd + n, sizeof repro_cmd - n, " --conf '%s'", opt.conf);
    (void)n;
}

static int parse_args(int argc, char **argv)
{
    int have_seed = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = 0, used = 1;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        } else if (!strcmp(a, "--compare")) {
            opt.compare = 1, used = 0;
        } else if (!strcmp(a, "--json")) {
            opt.json = 1, used = 0;
        } else if (!strcmp(a, "--keep-going")) {
            opt.keep_going = 1, used = 0;
        } else if (!strcmp(a, "--quiet")) {
            opt.quiet = 1, used = 0;
        } else if (!strcmp(a, "--map-callbacks")) {
            opt.map_callbacks = 1, used = 0;
        } else if (!strcmp(a, "--producer-consumer")) {
            opt.producer_consumer = 1, used = 0;
        } else if (!v) {
            bad = 1;
        } else if (!strcmp(a, "--seed")) {
            opt.seed = strtoull(v, NULL, 0), have_seed = 1;
        } else if (!strcmp(a, "--threads")) {
            opt.threads = atoi(v), bad = opt.threads < 1 || opt.threads > 256;
        } else if (!strcmp(a, "--streams")) {
            opt.streams = atoi(v), bad = opt.streams < 1 || opt.streams > 256;
        } else if (!strcmp(a, "--sizes")) {
            bad = 1;
            for (int k = 0; k < 3; k++)
                if (!strcmp(v, size_names[k]))
                    opt.sizes = k, bad = 0;
        } else if (!strcmp(a, "--live-fraction")) {
            opt.live_fraction = atof(v), bad = !(opt.live_fraction > 0 && opt.live_fraction <= 1.5);
        } else if (!strcmp(a, "--capacity")) {
            bad = parse_size(v, &opt.capacity) || opt.capacity < 16 * MiB;
        } else if (!strcmp(a, "--max-size")) {
            bad = parse_size(v, &opt.max_size);
        } else if (!strcmp(a, "--faults")) {
            opt.faults = atof(v), bad = !(opt.faults >= 0 && opt.faults < 1);
        } else if (!strcmp(a, "--seconds")) {
            opt.seconds = atof(v), bad = !(opt.seconds >= 0);
        } else if (!strcmp(a, "--ops")) {
            opt.ops = strtoull(v, NULL, 0);
        } else if (!strcmp(a, "--check-every")) {
            opt.check_every = strtoull(v, NULL, 0), bad = opt.check_every == 0;
        } else if (!strcmp(a, "--conf")) {
            opt.conf = v;
        } else if (!strcmp(a, "--sleep-every")) {
            opt.sleep_every = strtoull(v, NULL, 0), bad = opt.sleep_every == 0;
        } else if (!strcmp(a, "--captures")) {
            opt.captures = atof(v), bad = !(opt.captures >= 0 && opt.captures <= 1);
        } else if (!strcmp(a, "--plant-bug")) {
            bad = strcmp(v, "skip-record-stream") != 0;
            opt.plant_skip_record = 1;
        } else if (!strcmp(a, "--expandable")) {
            bad = strcmp(v, "true") && strcmp(v, "false");
            opt.expandable = !strcmp(v, "true");
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "vmm-stress: bad option or value: %s%s%s\n", a, v ? " " : "", v ? v : "");
            usage(stderr);
            return -1;
        }
        i += used;
    }
    if (!have_seed)
        opt.seed = mix64((uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32));
    return 0;
}

int main(int argc, char **argv)
{
    if (parse_args(argc, argv) != 0)
        return 2;
    build_repro(argv);
    signal(SIGSEGV, on_fatal);
    signal(SIGBUS, on_fatal);
    signal(SIGABRT, on_fatal);
    if (!opt.json)
        printf("vmm-stress: seed %" PRIu64 ", %d thread(s) x %d stream(s), sizes %s, capacity %zu MiB, "
               "live fraction %g, faults %g\n",
               opt.seed, opt.threads, opt.streams, size_names[opt.sizes], opt.capacity >> 20, opt.live_fraction,
               opt.faults);
    fflush(stdout);

    static run_t runs[2];
    double secs[2];
    int nruns = opt.compare ? 2 : 1;
    for (int i = 0; i < nruns; i++) {
        int mode = opt.compare ? (i == 0) : opt.expandable;
        secs[i] = run_once(&runs[i], mode);
        if (!opt.json) {
            print_summary(&runs[i], secs[i], 0, stdout);
            fflush(stdout);
        }
    }
    if (runs[0].is_sim)
        leak_check();
    uint64_t v = atomic_load(&violations);
    if (opt.json) {
        printf("{\"seed\":%" PRIu64 ",\"threads\":%d,\"streams\":%d,\"sizes\":\"%s\",\"capacity\":%zu,"
               "\"faults\":%g,\"violations\":%" PRIu64 ",",
               opt.seed, opt.threads, opt.streams, size_names[opt.sizes], runs[0].capacity, opt.faults, v);
        if (nruns == 1) {
            printf("\"run\":");
            print_summary(&runs[0], secs[0], 1, stdout);
        } else {
            printf("\"expandable\":");
            print_summary(&runs[0], secs[0], 1, stdout);
            printf(",\"classic\":");
            print_summary(&runs[1], secs[1], 1, stdout);
        }
        printf("}\n");
    }
    if (v) {
        fprintf(stderr, "vmm-stress: FAILED with %" PRIu64 " violation(s), seed %" PRIu64 "; reproduce with:\n  %s\n",
                v, opt.seed, repro_cmd);
        if (opt.threads > 1)
            fprintf(stderr, "  (with several threads the interleaving varies: run it a few times, or with "
                            "--threads 1)\n");
        return 1;
    }
    if (!opt.json)
        printf("vmm-stress: OK, no violations\n");
    return 0;
}
