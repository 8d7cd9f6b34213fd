/*
 * vmm-bench: replay recorded allocation traces through vmmalloc's expandable and classic modes,
 * measure host latency against glibc and jemalloc, and show replay time against trace length.
 *
 *   vmm-bench replay FILE [--capacity SIZE] [--min-capacity] [--json] [--plot OUT.svg]
 *                         [--mode both|expandable|classic] [--conf K:V,...] [--handles] [--check N]
 *                         [--no-progress] [--driver sim|cuda] [--snapshot-at-peak OUT.pickle]
 *   vmm-bench latency [--max-live N] [--threads 1..8] [--conf K:V,...] [--ring-passes N] [--quick]
 *                     [--json]
 *   vmm-bench scale [--max-events N] [--json]
 *   vmm-bench frames [--quick] [--json]
 *   vmm-bench sleep [--gib N] [--backup-gib M] [--quick] [--json]
 *   vmm-bench ipc [--conf K:V,...] [--quick] [--json]
 *   vmm-bench growth [--quick] [--json]
 *   vmm-bench handoff [--exchange] [--pairs N] [--conf K:V,...] [--quick] [--json]
 *   vmm-bench gen N OUT.csv [--seed S]
 */
#include <errno.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

extern char **environ;

static void usage(FILE *f)
{
    fprintf(f,
            "usage:\n"
            "  vmm-bench replay FILE [options]   replay a trace through expandable and classic mode\n"
            "      FILE: PyTorch trace CSV (action,addr,size,stream[,time_us]), RMM log CSV\n"
            "            (Thread,Time,Action,Pointer,Size,Stream) or a torch.cuda.memory snapshot pickle;\n"
            "            pool_begin / pool_end / pool_release lines (addr, size = a pool id) replay as\n"
            "            capture segments: vmm_pool_begin & co., graph memory kept apart and reported\n"
            "      --capacity SIZE   simulated device memory (default 80G)\n"
            "      --min-capacity    also bisect the smallest capacity that completes without OOM\n"
            "      --mode M          both (default), expandable or classic\n"
            "      --conf K:V,...    extra allocator configuration for both modes\n"
            "      --driver cuda     the real GPU instead of the simulator (with --json; the\n"
            "                        device's memory is the capacity; driver_time_ns is 0: not\n"
            "                        modeled; host_time_ns includes the driver's time)\n"
            "      --handles         expandable mode four times, side by side: the default, fixed\n"
            "                        2 MiB handles (max_handle_size:2M), fixed 20 MiB pages\n"
            "                        (large_page_size:20M) and handles sized by need up to 20 MiB\n"
            "                        (max_handle_size:20M); --conf applies to all; then each one's\n"
            "                        held / handed out, min capacity and driver time against targets\n"
            "      --json            one JSON object per mode per line\n"
            "      --plot OUT.svg    allocated and reserved over the trace (gnuplot)\n"
            "      --snapshot-at-peak OUT.pickle\n"
            "                        with --mode expandable or classic: the allocator's snapshot\n"
            "                        (torch.cuda.memory._snapshot's format, for PyTorch's memory\n"
            "                        viewer) where reserved bytes first reach their peak; the\n"
            "                        trace is replayed a second time to get there\n"
            "      --check N         run vmm_check every N events (slow; for testing)\n"
            "      --no-progress     no progress bar\n"
            "  vmm-bench record-graphs OUT.csv [--steps N] [--seed S]\n"
            "                                    record a trace with capture segments on the sim: a\n"
            "                                    training loop whose steps are CUDA graphs sharing a pool\n"
            "  vmm-bench latency [--max-live N] [--threads 1..8] [--conf K:V,...] [--ring-passes N]\n"
            "                    [--quick] [--json]\n"
            "                                    malloc+free cost vs glibc and jemalloc (pair and ring\n"
            "                                    patterns; 1, 2, 4.. N threads (default 4), each on its\n"
            "                                    own stream; live 100 .. --max-live, default 10^6, 10^4\n"
            "                                    with --quick; --conf: added to vmmalloc's\n"
            "                                    configuration, e.g. lanes:false; --ring-passes: times\n"
            "                                    each ring is run through before the clock, default 4)\n"
            "  vmm-bench scale [--max-events N] [--json]\n"
            "                                    replay time vs length of generated traces\n"
            "  vmm-bench frames [--quick] [--json]\n"
            "                                    cost of history recording with call stacks\n"
            "  vmm-bench sleep [--gib N] [--backup-gib M] [--quick] [--json]\n"
            "                                    sleep / wake by mode, beside published figures\n"
            "  vmm-bench ipc [--conf K:V,...] [--quick] [--json]\n"
            "                                    cost of exportable pages and of sharing a block\n"
            "  vmm-bench growth [--quick] [--json]\n"
            "                                    another thread's malloc + free while one thread grows\n"
            "  vmm-bench handoff [--exchange] [--pairs N] [--conf K:V,...] [--quick] [--json]\n"
            "                                    one thread mallocs, another frees (producer / consumer);\n"
            "                                    --exchange: two threads, each frees what the other mallocs\n"
            "  vmm-bench gen N OUT.csv [--seed S] write a synthetic trace of N events\n");
}

static int bad_usage(const char *msg, const char *arg)
{
    fprintf(stderr, "vmm-bench: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    usage(stderr);
    return BENCH_EXIT_INPUT;
}

static const char *base_name(const char *p)
{
    const char *s = strrchr(p, '/');
    return s ? s + 1 : p;
}

/* ---- replay output --------------------------------------------------------------------------- */
static double ratio(const bench_replay_result *r)
{
    return r->peak_allocated > 0 ? (double)r->peak_reserved / (double)r->peak_allocated : 0;
}

static uint64_t syncs(const bench_replay_result *r) { return r->device_syncs + r->stream_syncs; }

/* A file name as a JSON string body: quotes, backslashes and control characters escaped. */
static void json_escape(char *out, size_t len, const char *s)
{
    size_t o = 0;
    for (; *s && o + 7 < len; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            o += (size_t)snprintf(out + o, len - o, "\\%c", c);
        else if (c < 0x20)
            o += (size_t)snprintf(out + o, len - o, "\\u%04x", c);
        else
            out[o++] = (char)c;
    }
    out[o] = 0;
}

static int cuda_replay; /* replay --driver cuda */
/* The replay's costs are not the simulator's default (cold) table: --driver cuda (real time) or a
 * sim_cost_ns / sim_cost_file key in --conf. The steady-state figure below reprices calls of the
 * default table, so it has no meaning then. */
static int costs_not_default;
/* Driver time under the steady-state A100 figures (cuMemCreate 7.6 us, cuMemSetAccess 21 us,
 * cuMemUnmap 11 us; docs/benchmarks.md, "Handle sizes"): the modeled time, which used the simulator's
 * default (cold) costs, with those three calls repriced. -1 where the replay used other costs. */
static double steady_ns(const bench_replay_result *x)
{
    if (costs_not_default)
        return -1;
    double d = (double)x->driver_time_ns;
    d -= (double)x->calls[VMM_SIM_CALL_MEM_CREATE] * (193000.0 - 7600.0);
    d -= (double)x->calls[VMM_SIM_CALL_SET_ACCESS] * (36000.0 - 21000.0);
    d -= (double)x->calls[VMM_SIM_CALL_MEM_UNMAP] * (25600.0 - 11000.0);
    return d > 0 ? d : 0;
}

static void print_json(const bench_trace *t, const char *path, const bench_replay_result *r)
{
    char name[512], steady[32] = "null";
    json_escape(name, sizeof name, base_name(path));
    double sn = steady_ns(r);
    if (sn >= 0)
        snprintf(steady, sizeof steady, "%.0f", sn);
    printf("{\"mode\":\"%s\",\"trace\":\"%s\",\"format\":\"%s\",\"events\":%llu,\"allocations\":%u,"
           "\"capacity_bytes\":%llu,\"lower_bound_bytes\":%llu,\"peak_allocated_bytes\":%lld,"
           "\"peak_reserved_bytes\":%lld,\"reserved_over_allocated\":%.6f,\"ooms\":%llu,"
           "\"fragmentation_ooms\":%llu,\"device_syncs\":%llu,\"stream_syncs\":%llu,\"event_syncs\":%llu,"
           "\"num_sync_all_streams\":%lld,\"num_event_waits\":%lld,\"num_alloc_retries\":%lld,"
           "\"num_pages_remapped\":%lld,\"driver_time_ns\":%llu,\"driver_time_steady_ns\":%s,"
           "\"host_time_ns\":%llu,\"peak_allocated_small_bytes\":%lld,\"peak_reserved_small_bytes\":%lld,"
           "\"peak_allocated_large_bytes\":%lld,\"peak_reserved_large_bytes\":%lld,",
           r->mode, name, t->format, (unsigned long long)r->events, t->n_ids,
           (unsigned long long)r->capacity, (unsigned long long)t->peak_live, (long long)r->peak_allocated,
           (long long)r->peak_reserved, ratio(r), (unsigned long long)r->ooms,
           (unsigned long long)r->frag_ooms, (unsigned long long)r->device_syncs,
           (unsigned long long)r->stream_syncs, (unsigned long long)r->event_syncs,
           (long long)r->num_sync_all_streams, (long long)r->num_event_waits,
           (long long)r->num_alloc_retries, (long long)r->num_pages_remapped,
           (unsigned long long)r->driver_time_ns, steady, (unsigned long long)r->host_time_ns,
           (long long)r->pool_peak_allocated[0], (long long)r->pool_peak_reserved[0],
           (long long)r->pool_peak_allocated[1], (long long)r->pool_peak_reserved[1]);
    printf("\"driver\":\"%s\",\"num_device_alloc\":%lld,\"num_device_free\":%lld,\"num_pages_mapped\":%lld,"
           "\"num_pages_unmapped\":%lld,",
           cuda_replay ? "cuda" : "sim", (long long)r->num_device_alloc, (long long)r->num_device_free,
           (long long)r->num_pages_mapped, (long long)r->num_pages_unmapped);
    printf("\"driver_calls\":{");
    int first = 1;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        if (r->calls[k]) {
            printf("%s\"%s\":%llu", first ? "" : ",", vmm_sim_call_name(k), (unsigned long long)r->calls[k]);
            first = 0;
        }
    printf("}");
    if (t->n_pools)
        printf(",\"private_pools\":%u,\"graph_allocations\":%llu,\"graph_bytes\":%llu,"
               "\"peak_private_reserved_bytes\":%lld,\"eager_allocations_in_graph_memory\":%llu",
               t->n_pools, (unsigned long long)r->graph_allocs, (unsigned long long)r->graph_bytes,
               (long long)r->peak_private_reserved, (unsigned long long)r->eager_in_pools);
    if (r->min_capacity >= 0) {
        if (r->min_capacity > 0)
            printf(",\"min_capacity_bytes\":%lld,\"min_capacity_over_lower_bound\":%.6f",
                   (long long)r->min_capacity, (double)r->min_capacity / (double)t->peak_live);
        else
            printf(",\"min_capacity_bytes\":null");
    }
    printf("}\n");
}

typedef enum { ROW_BYTES, ROW_RATIO, ROW_COUNT, ROW_NS } row_kind;

static void row(const char *label, row_kind k, const double *v, int n)
{
    char buf[32];
    printf("  %-44s", label);
    for (int i = 0; i < n; i++) {
        switch (k) {
        case ROW_BYTES:
            printf(" %14s", v[i] < 0 ? "none" : bench_fmt_bytes(buf, sizeof buf, v[i]));
            break;
        case ROW_RATIO:
            printf(" %14.3f", v[i]);
            break;
        case ROW_COUNT:
            printf(" %14.0f", v[i]);
            break;
        case ROW_NS:
            printf(" %14s", bench_fmt_ns(buf, sizeof buf, v[i]));
            break;
        }
    }
    printf("\n");
}

/* The fragmentation targets for one column: held / handed out at the peak (<= 1.01 on traces of 1 GB or
 * more, else at most 2 pages of 2 MiB over per pool), min capacity <= 1.005x the lower bound (1 GB
 * or more; when measured), driver time <= 1.25x fixed 20 MiB pages under both cost sets. */
static void print_targets(const bench_trace *t, const bench_replay_result *x, const bench_replay_result *p20)
{
    const double page = 2.0 * 1024 * 1024;
    int big = t->peak_live >= 1000000000ull;
    printf("%-12s ", x->mode);
    if (big) {
        printf("held/handed %.4f (<= 1.01: %s)", ratio(x), ratio(x) <= 1.01 ? "met" : "MISSED");
    } else {
        double over[2];
        for (int k = 0; k < 2; k++)
            over[k] = (double)(x->pool_peak_reserved[k] - x->pool_peak_allocated[k]) / page;
        printf("pages over small %.2f, large %.2f (<= 2 each: %s)", over[0], over[1],
               over[0] <= 2 && over[1] <= 2 ? "met" : "MISSED");
    }
    if (x->min_capacity > 0 && t->peak_live) {
        double m = (double)x->min_capacity / (double)t->peak_live;
        printf("; min capacity %.4fx", m);
        if (big)
            printf(" (<= 1.005: %s)", m <= 1.005 ? "met" : "MISSED");
    }
    double c = p20->driver_time_ns ? (double)x->driver_time_ns / (double)p20->driver_time_ns : 0;
    if (costs_not_default) {
        printf("; driver time %.2fx of 20M pages under this replay's costs (<= 1.25: %s)\n", c,
               c <= 1.25 ? "met" : "MISSED");
        return;
    }
    double s = steady_ns(p20) > 0 ? steady_ns(x) / steady_ns(p20) : 0;
    printf("; driver time %.2fx cold, %.2fx steady of 20M pages (<= 1.25: %s)\n", c, s,
           c <= 1.25 && s <= 1.25 ? "met" : c <= 1.25 || s <= 1.25 ? "one of two" : "MISSED");
}

static void print_table(const bench_trace *t, const char *path, const bench_replay_result *r, int n)
{
    char b1[32], b2[32], b3[32];
    double v[4] = {0, 0, 0, 0};
    printf("Trace      %s\n", path);
    printf("           %s, %llu lines, %zu replayed events (alloc / free), %u allocations, %u stream%s",
           t->format, (unsigned long long)t->lines, t->n, t->n_ids, t->n_streams,
           t->n_streams == 1 ? "" : "s");
    if (t->skipped_frees)
        printf(",\n           %llu frees of blocks allocated before the recording skipped",
               (unsigned long long)t->skipped_frees);
    if (t->implicit_frees)
        printf(", %llu missing frees supplied", (unsigned long long)t->implicit_frees);
    if (t->n_pools)
        printf(",\n           capture segments: %u private pool%s (pool_begin / pool_end / pool_release)",
               t->n_pools, t->n_pools == 1 ? "" : "s");
    printf("\nDevice     simulated, %s, unbacked (driver:sim); each mode on its own device\n",
           bench_fmt_bytes(b1, sizeof b1, (double)r[0].capacity));
    printf("Lower bound (largest sum of live bytes in the trace): %s\n\n",
           bench_fmt_bytes(b2, sizeof b2, (double)t->peak_live));
    printf("  %-44s", "");
    for (int i = 0; i < n; i++)
        printf(" %14s", r[i].mode);
    printf("\n");
#define ROW(label, kind, expr)                                                             \
    do {                                                                                   \
        for (int i_ = 0; i_ < n; i_++) {                                                   \
            const bench_replay_result *x = &r[i_];                                         \
            (void)x;                                                                       \
            v[i_] = (double)(expr);                                                        \
        }                                                                                  \
        row(label, kind, v, n);                                                            \
    } while (0)
    ROW("peak allocated (handed out, rounded)", ROW_BYTES, x->peak_allocated);
    ROW("peak reserved (device memory held)", ROW_BYTES, x->peak_reserved);
    ROW("reserved / allocated (1.000 = no waste)", ROW_RATIO, ratio(x));
    ROW("reserved / lower bound", ROW_RATIO, (double)x->peak_reserved / (double)(t->peak_live ? t->peak_live : 1));
    int have_min = r[0].min_capacity >= 0;
    if (have_min)
        ROW("min capacity without OOM (--min-capacity)", ROW_BYTES, x->min_capacity > 0 ? (double)x->min_capacity : -1.0);
    ROW("OOMs", ROW_COUNT, x->ooms);
    ROW("  of which fragmentation (free+cached>=ask)", ROW_COUNT, x->frag_ooms);
    if (t->n_pools) {
        /* capture segments: graph memory kept apart (private pools, docs/pytorch.md) */
        ROW("allocations routed to private pools", ROW_COUNT, x->graph_allocs);
        ROW("  their bytes", ROW_BYTES, x->graph_bytes);
        ROW("peak private-pool reserve (at pool ends)", ROW_BYTES, x->peak_private_reserved);
        ROW("eager allocations in graph memory (0)", ROW_COUNT, x->eager_in_pools);
    }
    ROW("device + stream synchronizations", ROW_COUNT, syncs(x));
    ROW("blocking event waits", ROW_COUNT, x->event_syncs);
    printf("  driver calls (simulated CUDA driver API)\n");
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++) {
        int any = 0;
        for (int i = 0; i < n; i++)
            any |= r[i].calls[k] != 0;
        if (!any)
            continue;
        char label[64];
        snprintf(label, sizeof label, "  %s", vmm_sim_call_name(k));
        ROW(label, ROW_COUNT, x->calls[k]);
    }
    ROW("modeled driver time", ROW_NS, x->driver_time_ns);
    if (!costs_not_default)
        ROW("  with the steady-state A100 costs", ROW_NS, steady_ns(x));
    ROW("host time (allocator calls)", ROW_NS, x->host_time_ns);
    ROW("host time per event", ROW_NS, x->events ? (double)x->host_time_ns / (double)x->events : 0);
#undef ROW
    printf("\n  reserved / allocated: device memory held per byte handed out; the excess is memory cached\n"
           "  but unusable for the requests that came (fragmentation). A fragmentation OOM is one where\n"
           "  the device's free memory plus the allocator's cached memory would have covered the request.\n");

    /* The verdict, for a user deciding whether expandable mode fixes their OOMs. */
    if (n == 2) {
        const bench_replay_result *e = &r[0], *c = &r[1];
        double saved = (double)(c->peak_reserved - e->peak_reserved);
        printf("\nVerdict: ");
        if (c->ooms && !e->ooms)
            printf("classic mode hits %llu OOM%s (%llu from fragmentation) on this %s device; expandable mode "
                   "completes the trace with %s reserved.\n",
                   (unsigned long long)c->ooms, c->ooms == 1 ? "" : "s", (unsigned long long)c->frag_ooms,
                   b1, bench_fmt_bytes(b3, sizeof b3, (double)e->peak_reserved));
        else if (e->ooms)
            printf("expandable mode hit %llu OOM%s (%llu from fragmentation): the trace needs more than %s.\n",
                   (unsigned long long)e->ooms, e->ooms == 1 ? "" : "s", (unsigned long long)e->frag_ooms, b1);
        else
            printf("expandable mode reserves %s %s than classic mode for the same allocations "
                   "(waste over allocated: %.1f%% vs %.1f%%), with %llu synchronizations vs %llu.\n",
                   bench_fmt_bytes(b3, sizeof b3, saved < 0 ? -saved : saved), saved >= 0 ? "less" : "MORE",
                   100 * (ratio(e) - 1), 100 * (ratio(c) - 1), (unsigned long long)syncs(e),
                   (unsigned long long)syncs(c));
        if (have_min && e->min_capacity > 0 && c->min_capacity > 0)
            printf("         Smallest GPU that runs it: %s with expandable, %s with classic.\n",
                   bench_fmt_bytes(b1, sizeof b1, (double)e->min_capacity),
                   bench_fmt_bytes(b2, sizeof b2, (double)c->min_capacity));
    }
    /* --handles: the default against the fixed sizes, in the three measures of issue 26 */
    if (n == 4 && !strcmp(r[0].mode, "default")) {
        printf("\n");
        for (int i = 0; i < n; i++)
            print_targets(t, &r[i], &r[2]);
    }
    if (r[0].ooms && r[0].first_oom[0])
        printf("\nFirst OOM (%s): %s\n", r[0].mode, r[0].first_oom);
    if (n == 2 && r[1].ooms && r[1].first_oom[0])
        printf("\nFirst OOM (%s): %s\n", r[1].mode, r[1].first_oom);
}

/* ---- plot ------------------------------------------------------------------------------------ */
static int plot(const char *out, const char *path, const bench_trace *t, const bench_replay_result *r, int n,
                uint64_t every)
{
    size_t len = strlen(out);
    char *dat = bench_xmalloc(len + 8), *gp = bench_xmalloc(len + 8);
    snprintf(dat, len + 8, "%s.dat", out);
    snprintf(gp, len + 8, "%s.gp", out);
    FILE *f = fopen(dat, "w");
    if (!f) {
        fprintf(stderr, "vmm-bench: cannot create %s: %s\n", dat, strerror(errno));
        return BENCH_EXIT_FAIL;
    }
    fprintf(f, "# event");
    for (int i = 0; i < n; i++)
        fprintf(f, " %s_allocated_GiB %s_reserved_GiB", r[i].mode, r[i].mode);
    fprintf(f, "\n");
    size_t rows = 0;
    for (int i = 0; i < n; i++)
        rows = r[i].n_samples > rows ? r[i].n_samples : rows;
    for (size_t s = 0; s < rows; s++) {
        fprintf(f, "%llu", (unsigned long long)(s * every));
        for (int i = 0; i < n; i++) {
            size_t j = s < r[i].n_samples ? s : r[i].n_samples - 1;
            fprintf(f, " %.6f %.6f", r[i].tl_alloc[j] / (1 << 30), r[i].tl_reserved[j] / (1 << 30));
        }
        fprintf(f, "\n");
    }
    fclose(f);
    f = fopen(gp, "w");
    if (!f) {
        fprintf(stderr, "vmm-bench: cannot create %s: %s\n", gp, strerror(errno));
        return BENCH_EXIT_FAIL;
    }
    fprintf(f, "set terminal svg size 1000,560 dynamic font 'sans,12'\nset output '%s'\n", out);
    fprintf(f, "set title 'vmm-bench replay: %s (lower bound %.3f GiB)' noenhanced\n", base_name(path),
            (double)t->peak_live / (1 << 30));
    fprintf(f, "set xlabel 'trace event'\nset ylabel 'GiB'\nset key top left\nset grid\n");
    fprintf(f, "plot ");
    for (int i = 0; i < n; i++)
        fprintf(f, "%s'%s' using 1:%d with lines lw 2 title '%s reserved', '%s' using 1:%d with lines dt 2 title '%s allocated'",
                i ? ", " : "", dat, 3 + 2 * i, r[i].mode, dat, 2 + 2 * i, r[i].mode);
    fprintf(f, "\n");
    fclose(f);
    fflush(NULL);
    /* posix_spawn, not fork: no atfork handlers run (jemalloc's take every arena lock). */
    pid_t pid = -1;
    char *gargv[] = {"gnuplot", gp, NULL};
    int serr = posix_spawnp(&pid, "gnuplot", NULL, NULL, gargv, environ);
    if (serr) {
        fprintf(stderr, "vmm-bench: cannot run gnuplot: %s\n", strerror(serr));
        pid = -1;
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status)) {
        fprintf(stderr, "vmm-bench: gnuplot %s failed\n", gp);
        free(dat);
        free(gp);
        return BENCH_EXIT_FAIL;
    }
    fprintf(stderr, "vmm-bench: wrote %s (data %s, script %s)\n", out, dat, gp);
    free(dat);
    free(gp);
    return BENCH_EXIT_OK;
}

/* --snapshot-at-peak: the same replay again (the sim's replays are deterministic), stopped at the
 * first malloc that takes reserved bytes to the peak the first one saw, where the allocator's
 * snapshot (PyTorch's pickle format: docs/snapshots.md) is written. */
static int snapshot_at_peak(const bench_trace *t, const bench_replay_opts *o, const bench_replay_result *r,
                            const char *out)
{
    if (r->peak_reserved <= 0) {
        fprintf(stderr, "vmm-bench: %s mode never reserved memory (every allocation failed?): no snapshot "
                        "written\n", r->mode);
        return BENCH_EXIT_FAIL;
    }
    bench_replay_opts q = *o;
    bench_replay_result s;
    q.sample_every = 0;
    q.progress = 0;
    q.snapshot_out = out;
    q.snapshot_reserved = r->peak_reserved;
    int rc = bench_replay(t, &q, &s);
    if (!rc && s.snapshot_event < 0) {
        fprintf(stderr, "vmm-bench: the second replay never reached the first one's reserved peak (%lld "
                        "bytes): no snapshot written\n", (long long)r->peak_reserved);
        rc = BENCH_EXIT_FAIL;
    } else if (!rc) {
        fprintf(stderr, "vmm-bench: wrote %s: %s mode's snapshot after event %lld of %llu, where reserved "
                        "bytes first reach their peak, %.2f MiB (allocated peaks at %.2f MiB)\n",
                out, r->mode, (long long)s.snapshot_event, (unsigned long long)t->n,
                (double)r->peak_reserved / BENCH_MiB, (double)r->peak_allocated / BENCH_MiB);
    }
    bench_replay_result_free(&s);
    return rc;
}

/* ---- subcommands ----------------------------------------------------------------------------- */
static int cmd_replay(int argc, char **argv)
{
    const char *path = NULL, *plot_out = NULL, *conf = NULL, *mode = "both", *snap_out = NULL;
    uint64_t capacity = 80ull << 30, check_every = 0;
    int json = 0, min_cap = 0, progress = 1, handles = 0, snap_rc = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--json"))
            json = 1;
        else if (!strcmp(a, "--handles"))
            handles = 1;
        else if (!strcmp(a, "--min-capacity"))
            min_cap = 1;
        else if (!strcmp(a, "--no-progress"))
            progress = 0;
        else if (!strcmp(a, "--capacity") && more) {
            if (bench_parse_size(argv[++i], &capacity) || capacity < 2 * BENCH_MiB)
                return bad_usage("bad --capacity (a size like 80G, at least 2M)", argv[i]);
        } else if (!strcmp(a, "--plot") && more)
            plot_out = argv[++i];
        else if (!strcmp(a, "--snapshot-at-peak") && more)
            snap_out = argv[++i];
        else if (!strcmp(a, "--conf") && more)
            conf = argv[++i];
        else if (!strcmp(a, "--driver") && more) {
            const char *d = argv[++i];
            if (strcmp(d, "sim") && strcmp(d, "cuda"))
                return bad_usage("bad --driver (sim, cuda)", d);
            cuda_replay = !strcmp(d, "cuda");
        } else if (!strcmp(a, "--mode") && more) {
            mode = argv[++i];
            if (strcmp(mode, "both") && strcmp(mode, "expandable") && strcmp(mode, "classic"))
                return bad_usage("bad --mode (both, expandable, classic)", mode);
        } else if (!strcmp(a, "--check") && more) {
            if (bench_parse_size(argv[++i], &check_every) || !check_every)
                return bad_usage("bad --check (a positive event count)", argv[i]);
        } else if (a[0] == '-' && a[1])
            return bad_usage("unknown option or missing value", a);
        else if (!path)
            path = a;
        else
            return bad_usage("more than one trace file", a);
    }
    if (!path)
        return bad_usage("replay needs a trace file", NULL);
    if (cuda_replay && (!json || min_cap || plot_out))
        return bad_usage("--driver cuda goes with --json, without --min-capacity or --plot", NULL);
    if (snap_out && (handles || !strcmp(mode, "both") || cuda_replay))
        return bad_usage("--snapshot-at-peak goes with --mode expandable or classic, without --handles or "
                         "--driver cuda", NULL);
    costs_not_default = cuda_replay || (conf && strstr(conf, "sim_cost"));
    bench_progress_enable(progress);

    bench_trace t;
    int rc = bench_trace_load(path, &t);
    if (rc)
        return rc;
    if (t.n_ids == 0) {
        fprintf(stderr, "vmm-bench: %s: no allocations in the trace\n", path);
        bench_trace_free(&t);
        return BENCH_EXIT_INPUT;
    }
    bench_replay_result r[4];
    int n = 0;
    uint64_t every = plot_out ? (t.n / 4000 + 1) : 0; /* a few thousand points per curve */
    /* --handles: the handle policies side by side, each column named for its policy */
    static const char *const hconf[4] = {"", "max_handle_size:2M", "large_page_size:20M",
                                         "max_handle_size:20M"};
    static const char *const hname[4] = {"default", "2M handles", "20M pages", "20M by need"};
    char confs[4][1024];
    for (int m = 0; m < (handles ? 4 : 2) && !rc; m++) {
        int expandable = handles || m == 0;
        if (!handles &&
            ((expandable && !strcmp(mode, "classic")) || (!expandable && !strcmp(mode, "expandable"))))
            continue;
        const char *c = conf;
        if (handles) {
            snprintf(confs[m], sizeof confs[m], "%s%s%s", hconf[m], *hconf[m] && conf ? "," : "",
                     conf ? conf : "");
            c = confs[m];
        }
        bench_replay_opts o = {.expandable = expandable, .capacity = capacity, .extra_conf = c,
                               .sample_every = every, .check_every = check_every,
                               .progress = t.n > 200000, .cuda = cuda_replay};
        rc = bench_replay(&t, &o, &r[n]);
        if (handles)
            r[n].mode = hname[m];
        if (!rc && min_cap) {
            o.progress = 1;
            rc = bench_min_capacity(&t, &o, &r[n]);
        }
        if (!rc && snap_out)
            snap_rc = snapshot_at_peak(&t, &o, &r[n], snap_out); /* the results print all the same */
        n++;
    }
    if (!rc) {
        if (json)
            for (int i = 0; i < n; i++)
                print_json(&t, path, &r[i]);
        else
            print_table(&t, path, r, n);
        if (plot_out)
            rc = plot(plot_out, path, &t, r, n, every);
    }
    for (int i = 0; i < n; i++)
        bench_replay_result_free(&r[i]);
    bench_trace_free(&t);
    return rc ? rc : snap_rc;
}

static int cmd_latency(int argc, char **argv)
{
    bench_latency_opts o = {.max_live = 0, .max_threads = 4, .ring_passes = BENCH_RING_PASSES};
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        int more = i + 1 < argc;
        if (!strcmp(a, "--json"))
            o.json = 1;
        else if (!strcmp(a, "--quick"))
            o.quick = 1;
        else if (!strcmp(a, "--conf") && more)
            o.conf = argv[++i];
        else if (!strcmp(a, "--max-live") && more) {
            if (bench_parse_size(argv[++i], &o.max_live) || o.max_live < 100)
                return bad_usage("bad --max-live (at least 100)", argv[i]);
        } else if (!strcmp(a, "--ring-passes") && more) {
            o.ring_passes = atoi(argv[++i]);
            if (o.ring_passes < 0 || o.ring_passes > 100)
                return bad_usage("bad --ring-passes (0 to 100)", argv[i]);
        } else if (!strcmp(a, "--threads") && more) {
            o.max_threads = atoi(argv[++i]);
            if (o.max_threads < 1 || o.max_threads > BENCH_LATENCY_MAX_THREADS)
                return bad_usage("bad --threads (1 to 8)", argv[i]);
        } else
            return bad_usage("unknown latency option", a);
    }
    /* Default live sets up to 10^6; --quick stops at 10^4 (filling 10^6 blocks per cell is what
     * takes the time) unless --max-live says otherwise. */
    if (!o.max_live)
        o.max_live = o.quick ? 10000 : 1000000;
    return bench_latency(&o);
}

static int cmd_frames(int argc, char **argv)
{
    bench_frames_opts o = {0};
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            o.json = 1;
        else if (!strcmp(argv[i], "--quick"))
            o.quick = 1;
        else
            return bad_usage("unknown frames option", argv[i]);
    }
    return bench_frames(&o);
}

static int cmd_scale(int argc, char **argv)
{
    uint64_t max_events = 10000000;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json"))
            json = 1;
        else if (!strcmp(argv[i], "--max-events") && i + 1 < argc) {
            if (bench_parse_size(argv[++i], &max_events) || max_events < 10000)
                return bad_usage("bad --max-events (at least 10000)", argv[i]);
        } else
            return bad_usage("unknown scale option", argv[i]);
    }
    if (!json)
        printf("Replay time vs trace length (generated traces: ~1000 live blocks, 512 B .. 64 MiB, 2 streams;\n"
               "80 GiB simulated device, unbacked). Linear scaling = constant ns/event.\n\n"
               "%10s %12s %14s %12s %12s %14s %12s %12s\n",
               "events", "exp time", "exp ns/event", "vs 10^4", "cls time", "cls ns/event", "vs 10^4",
               "exp res/alloc");
    double base[2] = {0, 0}, prev[2] = {0, 0}, worst[2] = {0, 0};
    for (uint64_t n = 10000; n <= max_events; n *= 10) {
        bench_trace t;
        bench_trace_synthetic(&t, n, 7);
        bench_replay_result r[2];
        for (int m = 0; m < 2; m++) {
            bench_replay_opts o = {.expandable = m == 0, .capacity = 80ull << 30, .progress = n >= 1000000};
            if (bench_replay(&t, &o, &r[m])) {
                bench_trace_free(&t);
                return BENCH_EXIT_FAIL;
            }
            double per = (double)r[m].host_time_ns / (double)r[m].events;
            if (n == 10000)
                base[m] = per;
            if (json)
                printf("{\"bench\":\"scale\",\"mode\":\"%s\",\"events\":%llu,\"host_time_ns\":%llu,"
                       "\"ns_per_event\":%.2f,\"ns_per_event_vs_1e4\":%.3f,\"ooms\":%llu,"
                       "\"peak_allocated_bytes\":%lld,\"peak_reserved_bytes\":%lld}\n",
                       r[m].mode, (unsigned long long)r[m].events, (unsigned long long)r[m].host_time_ns, per,
                       per / base[m], (unsigned long long)r[m].ooms, (long long)r[m].peak_allocated,
                       (long long)r[m].peak_reserved);
        }
        if (!json) {
            char b1[32], b2[32];
            double pe = (double)r[0].host_time_ns / (double)r[0].events,
                   pc = (double)r[1].host_time_ns / (double)r[1].events;
            printf("%10llu %12s %14.1f %11.2fx %12s %14.1f %11.2fx %12.4f\n", (unsigned long long)n,
                   bench_fmt_ns(b1, sizeof b1, (double)r[0].host_time_ns), pe, pe / base[0],
                   bench_fmt_ns(b2, sizeof b2, (double)r[1].host_time_ns), pc, pc / base[1],
                   r[0].peak_allocated ? (double)r[0].peak_reserved / (double)r[0].peak_allocated : 0);
            fflush(stdout);
        }
        bench_trace_free(&t);
        for (int m = 0; m < 2; m++) {
            double per = (double)r[m].host_time_ns / (double)r[m].events;
            /* Superlinear growth shows as ns/event rising from one decade to the next; the
             * short traces also pay one-time setup, so growth is measured decade to decade. */
            if (prev[m] > 0 && per / prev[m] > worst[m])
                worst[m] = per / prev[m];
            prev[m] = per;
        }
    }
    if (!json)
        for (int m = 0; m < 2; m++)
            printf("%sTarget (linear scaling, %s): largest ratio of ns/event between consecutive decades %.2fx "
                   "(<= 1.5x) -> %s\n",
                   m ? "" : "\n", m ? "classic" : "expandable", worst[m], worst[m] <= 1.5 ? "met" : "MISSED");
    return BENCH_EXIT_OK;
}

static int cmd_gen(int argc, char **argv)
{
    uint64_t n = 0, seed = 7;
    const char *out = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (bench_parse_size(argv[++i], &seed))
                return bad_usage("bad --seed", argv[i]);
        } else if (!n) {
            if (bench_parse_size(argv[i], &n) || n < 2)
                return bad_usage("bad event count", argv[i]);
        } else if (!out)
            out = argv[i];
        else
            return bad_usage("unexpected argument", argv[i]);
    }
    if (!n || !out)
        return bad_usage("gen needs N and OUT.csv", NULL);
    bench_trace t;
    bench_trace_synthetic(&t, n, seed);
    int rc = bench_trace_write_csv(&t, out);
    bench_trace_free(&t);
    return rc;
}

static int cmd_record_graphs(int argc, char **argv)
{
    const char *out = NULL;
    uint64_t steps = 20, seed = 1;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--steps") && i + 1 < argc) {
            if (bench_parse_size(argv[++i], &steps) || !steps)
                return bad_usage("bad --steps", argv[i]);
        } else if (!strcmp(argv[i], "--seed") && i + 1 < argc) {
            if (bench_parse_size(argv[++i], &seed))
                return bad_usage("bad --seed", argv[i]);
        } else if (!out && argv[i][0] != '-') {
            out = argv[i];
        } else {
            return bad_usage("unexpected argument", argv[i]);
        }
    }
    if (!out)
        return bad_usage("record-graphs needs OUT.csv", NULL);
    return bench_record_graphs(out, steps, seed);
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? BENCH_EXIT_INPUT : BENCH_EXIT_OK;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "replay"))
        return cmd_replay(argc - 2, argv + 2);
    if (!strcmp(cmd, "record-graphs"))
        return cmd_record_graphs(argc - 2, argv + 2);
    if (!strcmp(cmd, "latency"))
        return cmd_latency(argc - 2, argv + 2);
    if (!strcmp(cmd, "scale"))
        return cmd_scale(argc - 2, argv + 2);
    if (!strcmp(cmd, "gen"))
        return cmd_gen(argc - 2, argv + 2);
    if (!strcmp(cmd, "frames"))
        return cmd_frames(argc - 2, argv + 2);
    if (!strcmp(cmd, "sleep"))
        return bench_sleep(argc - 2, argv + 2);
    if (!strcmp(cmd, "ipc"))
        return bench_ipc(argc - 2, argv + 2);
    if (!strcmp(cmd, "growth"))
        return bench_growth(argc - 2, argv + 2);
    if (!strcmp(cmd, "handoff"))
        return bench_handoff(argc - 2, argv + 2);
    return bad_usage("unknown command", cmd);
}
