/*
 * vmm-bench: shared declarations of the benchmark program's files (trace.c, replay.c, latency.c,
 * util.c, main.c). Nothing here is part of the library.
 */
#ifndef VMM_BENCH_H
#define VMM_BENCH_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "vmmalloc.h"
#include "vmmalloc_sim.h"

/* Exit codes: 2 is bad usage or bad input (a malformed trace), 1 a failure while running. */
enum { BENCH_EXIT_OK = 0, BENCH_EXIT_FAIL = 1, BENCH_EXIT_INPUT = 2 };

enum { BENCH_MiB = 1 << 20 };

/* ---- util.c ---------------------------------------------------------------------------------- */
uint64_t bench_now_ns(void);
/* "80G", "512MiB", "1048576" -> bytes; 0 on success, -1 on a bad string. */
int bench_parse_size(const char *s, uint64_t *out);
/* Human-readable bytes ("1.23 GiB") into buf. Returns buf. */
const char *bench_fmt_bytes(char *buf, size_t len, double bytes);
/* Human-readable duration from nanoseconds ("12.3 ms"). Returns buf. */
const char *bench_fmt_ns(char *buf, size_t len, double ns);
/* Progress bar on stderr, drawn only when stderr is a terminal and progress is enabled. */
void bench_progress_enable(int on);
void bench_progress(const char *what, uint64_t done, uint64_t total);
void bench_progress_end(void);
/* splitmix64: a small deterministic generator for synthetic traces and size patterns. */
uint64_t bench_rand(uint64_t *state);
/* Quantile q (0..1) of n doubles; sorts v in place. */
double bench_quantile(double *v, size_t n, double q);
void *bench_xmalloc(size_t n);
/* The number of key in a's vmm_stats_json, or `missing` when the key or the JSON is not there. */
long long bench_json_num(vmm_allocator *a, const char *key, long long missing);
void *bench_xrealloc(void *p, size_t n);
/* n sizes log-uniform in [lo, hi), rounded up to 512 B, from a splitmix64 seeded with 42: the
 * latency bench's ring and mixed patterns, and the handoff bench's sizes. */
void bench_log_sizes(size_t *sizes, int n, double lo, double hi);
/* glibc's own malloc and free, looked up in libc.so.6 (the program links jemalloc, which replaces
 * malloc). 0, or -1 when they cannot be found. */
int bench_glibc(void *(**malloc_fn)(size_t), void (**free_fn)(void *));

/* ---- trace.c --------------------------------------------------------------------------------- */
/* Pool events (capture segments): vmm_pool_begin / vmm_pool_end / vmm_pool_release of the private
 * pool bench_trace.pools[id] (CUDA graph capture; trace CSV actions pool_begin, pool_end,
 * pool_release with addr, size = the pool id's two halves, stream = the routed stream). */
enum bench_op { BENCH_OP_ALLOC = 0, BENCH_OP_FREE = 1, BENCH_OP_POOL_BEGIN = 2, BENCH_OP_POOL_END = 3,
                BENCH_OP_POOL_RELEASE = 4 };

/* One replayed event. Trace addresses are resolved to dense allocation ids when the trace is read,
 * so the replay indexes an array of the allocator's pointers by id. */
typedef struct bench_event {
    uint64_t size;   /* bytes asked for (alloc); the allocation's size (free) */
    uint32_t id;     /* allocation id, 0..n_ids-1 */
    uint16_t stream; /* index into bench_trace.streams */
    uint8_t op;      /* enum bench_op */
    uint8_t pad_;
} bench_event;
_Static_assert(sizeof(bench_event) == 16, "events stay compact: 10^7 of them are replayed");

typedef struct bench_trace {
    bench_event *ev;
    size_t n, cap;
    uint32_t n_ids;
    int64_t *streams; /* trace stream ids (0 = default stream), by index */
    uint32_t n_streams;
    uint64_t peak_live;     /* largest sum of live sizes: the lower bound for any allocator */
    uint64_t lines;         /* data lines read */
    uint64_t ignored;       /* lines whose action does not drive the replay (free_requested, ...) */
    uint64_t skipped_frees; /* frees of blocks allocated before the recording began */
    uint64_t implicit_frees; /* allocs at a still-live address: the old block is freed first */
    uint64_t failed_allocs; /* allocation failures recorded in the trace (RMM "allocate failure") */
    const char *format;     /* "pytorch-csv", "rmm-csv", "pytorch-snapshot", "synthetic" */
    uint64_t (*pools)[2];   /* private pool ids of the pool events, by index */
    uint32_t n_pools;
} bench_trace;

/* Read a trace (format detected from the header; a snapshot pickle goes through
 * snapshot_to_trace.py). On malformed input prints "path:line: what" and returns BENCH_EXIT_INPUT;
 * BENCH_EXIT_FAIL for I/O errors. */
int bench_trace_load(const char *path, bench_trace *t);
/* A synthetic trace of n events (allocs and frees, a bounded live set, sizes from 512 B to 64 MiB,
 * two streams), deterministic for a seed; every block is freed by the end. */
void bench_trace_synthetic(bench_trace *t, uint64_t n, uint64_t seed);
/* Write a trace as PyTorch trace CSV (alloc / free_completed) with made-up addresses. */
int bench_trace_write_csv(const bench_trace *t, const char *path);
void bench_trace_free(bench_trace *t);

/* ---- replay.c -------------------------------------------------------------------------------- */
typedef struct bench_replay_opts {
    int expandable;
    uint64_t capacity;
    const char *extra_conf;  /* appended to the allocator's conf, may be NULL */
    int stop_at_first_oom;   /* for the min-capacity search */
    uint64_t sample_every;   /* 0: no timeline; else record allocated/reserved every n events */
    uint64_t check_every;    /* 0: never; else vmm_check every n events and at the end */
    int progress;
    int cuda;                /* 1: the real device (driver:cuda; capacity is the device's), no sim counters */
    /* Non-NULL: write the allocator's snapshot (vmm_snapshot_pickle) here after the first malloc
     * that leaves reserved bytes at snapshot_reserved or more (a replay's peak, from an earlier
     * replay of the same trace: replays on the sim are deterministic), and end the replay there. */
    const char *snapshot_out;
    int64_t snapshot_reserved;
} bench_replay_opts;

typedef struct bench_replay_result {
    const char *mode;
    uint64_t capacity;
    uint64_t events;         /* events replayed */
    int64_t peak_allocated;
    int64_t peak_reserved;
    uint64_t ooms, frag_ooms;
    uint64_t calls[VMM_SIM_CALL_COUNT]; /* driver calls during the replay, by kind */
    uint64_t device_syncs, stream_syncs, event_syncs;
    int64_t num_sync_all_streams, num_event_waits, num_alloc_retries, num_pages_remapped;
    int64_t pool_peak_allocated[2], pool_peak_reserved[2]; /* small, large pool */
    uint64_t driver_time_ns; /* modeled by the sim (0 on driver:cuda: not modeled) */
    int64_t num_device_alloc, num_device_free, num_pages_mapped, num_pages_unmapped; /* vmm_stats */
    uint64_t host_time_ns;   /* wall time inside the allocator calls' loop */
    int64_t min_capacity;    /* -1: not measured; 0: none found up to --capacity */
    char first_oom[512];     /* the first OOM message */
    double *tl_alloc, *tl_reserved; /* timeline in bytes, n_samples entries */
    size_t n_samples;
    /* traces with capture segments (pool events) */
    uint64_t graph_allocs, graph_bytes; /* allocations routed to private pools, their bytes */
    uint64_t eager_in_pools;            /* eager allocations in a private pool's memory: must be 0 */
    int64_t peak_private_reserved;      /* most bytes the private pools held (at pool ends) */
    int64_t snapshot_event;             /* the event after which snapshot_out was written; -1 none */
} bench_replay_result;

/* Replay the trace on a fresh simulated device. Returns BENCH_EXIT_OK or BENCH_EXIT_FAIL (an error
 * other than OOM, printed). */
int bench_replay(const bench_trace *t, const bench_replay_opts *o, bench_replay_result *r);
/* Smallest capacity (multiple of 2 MiB) at which the trace completes without OOM, by bisection
 * between the lower bound and o->capacity. Fills r->min_capacity. */
int bench_min_capacity(const bench_trace *t, const bench_replay_opts *o, bench_replay_result *r);
void bench_replay_result_free(bench_replay_result *r);

/* ---- graphs.c -------------------------------------------------------------------------------- */
/* Record a trace with capture segments on a simulated device: a training loop whose forward and
 * backward steps are captured as CUDA graphs into one shared private pool and replayed, with eager
 * work between the replays, then released; every allocator call written as trace CSV (real
 * addresses and streams, pool events). */
int bench_record_graphs(const char *out, uint64_t steps, uint64_t seed);

/* ---- latency.c ------------------------------------------------------------------------------- */
enum { BENCH_LATENCY_MAX_THREADS = 8 };
typedef struct bench_latency_opts {
    uint64_t max_live;  /* largest live-set size (default 10^6) */
    int max_threads;    /* 1 .. BENCH_LATENCY_MAX_THREADS (default 4): runs 1, 2, 4, ... and this */
    int quick;          /* fewer batches, for smoke tests */
    int json;
    const char *conf;   /* appended to vmmalloc's configuration (e.g. lanes:false); NULL: none */
    int ring_passes;    /* ring warm-up: passes through each thread's ring before the clock starts
                         * (default BENCH_RING_PASSES; 0: the batch warm-up only) */
} bench_latency_opts;
enum { BENCH_RING_PASSES = 4 };
int bench_latency(const bench_latency_opts *o);

/* ---- frames.c -------------------------------------------------------------------------------- */
typedef struct bench_frames_opts {
    int quick; /* fewer rounds, for smoke tests */
    int json;
} bench_frames_opts;
/* Cost per malloc and free of history recording without and with native call stacks. */
int bench_frames(const bench_frames_opts *o);

/* ---- sleep.c --------------------------------------------------------------------------------- */
/* vmm-bench sleep [--gib N] [--backup-gib M] [--quick] [--json]: sleep / wake by mode. */
int bench_sleep(int argc, char **argv);

/* ---- ipc.c ----------------------------------------------------------------------------------- */
/* vmm-bench ipc [--conf K:V,...] [--quick] [--json]: exportable pages and sharing, what they cost. */
int bench_ipc(int argc, char **argv);

/* ---- growth.c -------------------------------------------------------------------------------- */
/* vmm-bench growth [--quick] [--json]: another thread's malloc + free while one thread grows, with
 * the lock released around mem_create (grow_unlocked:true) and held (false). */
int bench_growth(int argc, char **argv);

/* ---- handoff.c ------------------------------------------------------------------------------- */
/* vmm-bench handoff [--exchange] [--pairs N] [--conf K:V,...] [--quick] [--json]: one thread
 * allocates, another frees (producer / consumer; --exchange: each frees what the other allocates),
 * vmmalloc with and without the thread caches' depot, glibc, jemalloc. */
int bench_handoff(int argc, char **argv);

#endif
