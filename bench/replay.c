/*
 * Trace replay on a simulated device: one fresh allocator per run, unbacked (no host memory behind
 * the device), so traces of real training jobs replay in milliseconds on any machine.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

enum { PROGRESS_STRIDE = 1 << 14 /* events between progress-bar updates: cheap, still smooth */ };

static int make_allocator(const bench_replay_opts *o, uint64_t capacity, vmm_allocator **a)
{
    char conf[1024];
    if (o->cuda) /* the real device: its memory is the capacity */
        snprintf(conf, sizeof conf, "driver:cuda,expandable_segments:%s%s%s", o->expandable ? "true" : "false",
                 o->extra_conf && *o->extra_conf ? "," : "", o->extra_conf ? o->extra_conf : "");
    else
        snprintf(conf, sizeof conf, "driver:sim,sim_backed:false,sim_capacity:%llu,expandable_segments:%s%s%s",
                 (unsigned long long)capacity, o->expandable ? "true" : "false",
                 o->extra_conf && *o->extra_conf ? "," : "", o->extra_conf ? o->extra_conf : "");
    int rc = vmm_create(conf, a);
    if (rc != VMM_OK)
        fprintf(stderr, "vmm-bench: vmm_create(\"%s\"): %s: %s\n", conf, vmm_strerror(rc),
                vmm_last_error());
    return rc;
}

static void sample(vmm_allocator *a, bench_replay_result *r, size_t cap)
{
    vmm_stats st;
    if (r->n_samples >= cap || vmm_get_stats(a, &st) != VMM_OK)
        return;
    r->tl_alloc[r->n_samples] = (double)st.allocated_bytes[VMM_POOL_ALL].current;
    r->tl_reserved[r->n_samples] = (double)st.reserved_bytes[VMM_POOL_ALL].current;
    r->n_samples++;
}

/* --snapshot-at-peak: reserved bytes have reached the peak the first replay saw. */
static int snapshot_due(vmm_allocator *a, const bench_replay_opts *o)
{
    vmm_stats st;
    return vmm_get_stats(a, &st) == VMM_OK && st.reserved_bytes[VMM_POOL_ALL].current >= o->snapshot_reserved;
}

static int snapshot(vmm_allocator *a, const char *out, size_t event, bench_replay_result *r)
{
    int rc = vmm_snapshot_pickle(a, out);
    if (rc != VMM_OK) {
        fprintf(stderr, "vmm-bench: vmm_snapshot_pickle(%s): %s: %s\n", out, vmm_strerror(rc), vmm_last_error());
        return 1;
    }
    r->snapshot_event = (int64_t)event;
    return 0;
}

/* An OOM is a fragmentation OOM when the bytes the allocator holds unused plus what the device
 * still has free would have covered the request. */
static int is_fragmentation_oom(vmm_allocator *a, uint64_t request)
{
    vmm_stats st;
    vmm_sim_counters c;
    if (vmm_get_stats(a, &st) != VMM_OK || vmm_sim_get_counters(a, &c) != VMM_OK)
        return 0;
    int64_t cached = st.reserved_bytes[VMM_POOL_ALL].current - st.allocated_bytes[VMM_POOL_ALL].current;
    uint64_t dev_free = c.capacity_bytes > c.phys_bytes ? c.capacity_bytes - c.phys_bytes : 0;
    return (uint64_t)(cached > 0 ? cached : 0) + dev_free >= request;
}

/* Capture segments: the pool routed on each trace stream (pool index + 1, 0 none), and what the
 * allocations got. */
static int64_t private_reserved(vmm_allocator *a)
{
    return bench_json_num(a, "private_pools.reserved_bytes", 0);
}

static int pool_event(vmm_allocator *a, const bench_trace *t, const bench_event *e, vmm_stream s,
                      uint32_t *routed, bench_replay_result *r, size_t at)
{
    const uint64_t *id = t->pools[e->id];
    int rc;
    const char *what;
    if (e->op == BENCH_OP_POOL_BEGIN) {
        what = "vmm_pool_begin";
        rc = vmm_pool_begin(a, id[0], id[1], s);
        if (rc == VMM_OK)
            routed[e->stream] = e->id + 1;
    } else if (e->op == BENCH_OP_POOL_END) {
        what = "vmm_pool_end";
        int64_t res = private_reserved(a);
        if (res > r->peak_private_reserved)
            r->peak_private_reserved = res;
        rc = vmm_pool_end(a, id[0], id[1]);
        for (uint32_t k = 0; k < t->n_streams; k++)
            if (routed[k] == e->id + 1)
                routed[k] = 0;
    } else {
        what = "vmm_pool_release";
        rc = vmm_pool_release(a, id[0], id[1]);
    }
    if (rc != VMM_OK)
        fprintf(stderr, "vmm-bench: %s(%llu, %llu) at event %zu: %s\n", what, (unsigned long long)id[0],
                (unsigned long long)id[1], at, vmm_last_error());
    return rc;
}

/* An allocation of a trace with capture segments: in its pool when routed, else in the default
 * pools (never in a graph's memory). */
static void pool_account(vmm_allocator *a, const bench_trace *t, const bench_event *e, void *p,
                         const uint32_t *routed, bench_replay_result *r)
{
    uint64_t id0 = 0, id1 = 0;
    if (vmm_pool_lookup(a, p, &id0, &id1) != VMM_OK)
        id0 = id1 = ~0ull;
    uint32_t pool = routed[e->stream];
    if (pool) {
        r->graph_allocs++;
        r->graph_bytes += e->size;
        if (id0 != t->pools[pool - 1][0] || id1 != t->pools[pool - 1][1])
            r->eager_in_pools++; /* a routed allocation outside its pool: as wrong */
    } else if (id0 || id1) {
        if (!r->eager_in_pools)
            fprintf(stderr, "vmm-bench: an eager allocation (%p, %llu bytes) lies in private pool "
                            "(%llu, %llu): graph memory handed out\n",
                    p, (unsigned long long)e->size, (unsigned long long)id0, (unsigned long long)id1);
        r->eager_in_pools++;
    }
}

static int check(vmm_allocator *a, uint64_t at)
{
    if (vmm_check(a) == VMM_OK)
        return 0;
    fprintf(stderr, "vmm-bench: vmm_check failed after event %llu: %s\n", (unsigned long long)at,
            vmm_last_error());
    return -1;
}

int bench_replay(const bench_trace *t, const bench_replay_opts *o, bench_replay_result *r)
{
    memset(r, 0, sizeof *r);
    r->mode = o->expandable ? "expandable" : "classic";
    r->capacity = o->capacity;
    r->min_capacity = -1;
    r->snapshot_event = -1;
    vmm_allocator *a;
    if (make_allocator(o, o->capacity, &a) != VMM_OK)
        return BENCH_EXIT_FAIL;

    int rc = BENCH_EXIT_OK;
    /* Written through now, not calloc'ed: first-touch page faults must not land in the timing. */
    size_t n_ptr = t->n_ids ? t->n_ids : 1;
    void **ptr = bench_xmalloc(n_ptr * sizeof *ptr);
    memset(ptr, 0, n_ptr * sizeof *ptr);
    vmm_stream *streams = calloc(t->n_streams ? t->n_streams : 1, sizeof *streams);
    uint32_t *routed = calloc(t->n_streams ? t->n_streams : 1, sizeof *routed);
    if (!streams || !routed) {
        fprintf(stderr, "vmm-bench: out of host memory\n");
        exit(BENCH_EXIT_FAIL);
    }
    for (uint32_t i = 0; i < t->n_streams; i++) {
        if (t->streams[i] == 0)
            continue; /* the default stream */
        int s = vmm_sim_stream_create(a, &streams[i]);
        if (s != VMM_OK) {
            fprintf(stderr, "vmm-bench: vmm_sim_stream_create: %s\n", vmm_last_error());
            rc = BENCH_EXIT_FAIL;
            goto out;
        }
    }
    size_t tl_cap = 0;
    if (o->sample_every) {
        tl_cap = t->n / o->sample_every + 2;
        r->tl_alloc = bench_xmalloc(tl_cap * sizeof(double));
        r->tl_reserved = bench_xmalloc(tl_cap * sizeof(double));
    }
    /* What the device did before the replay (create, streams) is not the trace's cost. */
    vmm_sim_counters c0, c1;
    memset(&c0, 0, sizeof c0); /* driver:cuda has no sim counters: all zero there */
    memset(&c1, 0, sizeof c1);
    vmm_sim_get_counters(a, &c0);

    uint64_t host = 0, t0 = bench_now_ns();
    size_t i;
    for (i = 0; i < t->n; i++) {
        const bench_event *e = &t->ev[i];
        if (e->op >= BENCH_OP_POOL_BEGIN) {
            if (pool_event(a, t, e, streams[e->stream], routed, r, i) != VMM_OK) {
                rc = BENCH_EXIT_FAIL;
                break;
            }
        } else if (e->op == BENCH_OP_ALLOC) {
            int s = vmm_malloc(a, e->size, streams[e->stream], &ptr[e->id]);
            if (t->n_pools && s == VMM_OK)
                pool_account(a, t, e, ptr[e->id], routed, r);
            if (o->snapshot_out && s == VMM_OK && r->snapshot_event < 0) {
                uint64_t t1 = bench_now_ns();
                host += t1 - t0;
                if (snapshot_due(a, o)) {
                    if (snapshot(a, o->snapshot_out, i, r))
                        rc = BENCH_EXIT_FAIL;
                    i++;
                    t0 = bench_now_ns();
                    break; /* the rest of this replay is not wanted */
                }
                t0 = bench_now_ns();
            }
            if (s == VMM_ENOMEM) {
                uint64_t t1 = bench_now_ns();
                host += t1 - t0;
                if (!r->ooms)
                    snprintf(r->first_oom, sizeof r->first_oom, "%s", vmm_last_error());
                r->ooms++;
                r->frag_ooms += (uint64_t)is_fragmentation_oom(a, e->size);
                ptr[e->id] = NULL; /* its free is then a no-op */
                if (o->stop_at_first_oom) {
                    i++;
                    t0 = bench_now_ns();
                    break;
                }
                t0 = bench_now_ns();
            } else if (s != VMM_OK) {
                fprintf(stderr, "vmm-bench: vmm_malloc(%llu) at event %zu: %s: %s\n",
                        (unsigned long long)e->size, i, vmm_strerror(s), vmm_last_error());
                rc = BENCH_EXIT_FAIL;
                break;
            }
        } else {
            int s = vmm_free(a, ptr[e->id]);
            if (s != VMM_OK) {
                fprintf(stderr, "vmm-bench: vmm_free at event %zu: %s: %s\n", i, vmm_strerror(s),
                        vmm_last_error());
                rc = BENCH_EXIT_FAIL;
                break;
            }
            ptr[e->id] = NULL;
        }
        if ((o->sample_every && i % o->sample_every == 0) || (o->check_every && i % o->check_every == 0) ||
            (o->progress && i % PROGRESS_STRIDE == 0)) {
            /* Bookkeeping outside the timed region. */
            uint64_t t1 = bench_now_ns();
            host += t1 - t0;
            if (o->sample_every && i % o->sample_every == 0)
                sample(a, r, tl_cap);
            if (o->check_every && i % o->check_every == 0 && check(a, i)) {
                rc = BENCH_EXIT_FAIL;
                break;
            }
            if (o->progress)
                bench_progress(r->mode, i, t->n);
            t0 = bench_now_ns();
        }
    }
    host += bench_now_ns() - t0;
    if (o->progress)
        bench_progress_end();
    r->events = i;
    r->host_time_ns = host;
    if (!rc && r->eager_in_pools) {
        fprintf(stderr, "vmm-bench: %llu allocation(s) got memory of the wrong pool (graph memory handed to "
                        "eager code, or a graph's allocation outside its pool)\n",
                (unsigned long long)r->eager_in_pools);
        rc = BENCH_EXIT_FAIL;
    }
    if (o->sample_every)
        sample(a, r, tl_cap);
    if (!rc && o->check_every && check(a, i))
        rc = BENCH_EXIT_FAIL;

    vmm_stats st;
    vmm_get_stats(a, &st);
    vmm_sim_get_counters(a, &c1);
    r->peak_allocated = st.allocated_bytes[VMM_POOL_ALL].peak;
    r->peak_reserved = st.reserved_bytes[VMM_POOL_ALL].peak;
    for (int k = 0; k < 2; k++) {
        r->pool_peak_allocated[k] = st.allocated_bytes[VMM_POOL_SMALL + k].peak;
        r->pool_peak_reserved[k] = st.reserved_bytes[VMM_POOL_SMALL + k].peak;
    }
    r->num_sync_all_streams = st.num_sync_all_streams;
    r->num_event_waits = st.num_event_waits;
    r->num_alloc_retries = st.num_alloc_retries;
    r->num_pages_remapped = st.num_pages_remapped;
    r->num_device_alloc = st.num_device_alloc;
    r->num_device_free = st.num_device_free;
    r->num_pages_mapped = st.num_pages_mapped;
    r->num_pages_unmapped = st.num_pages_unmapped;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        r->calls[k] = c1.calls[k] - c0.calls[k];
    r->device_syncs = c1.device_syncs - c0.device_syncs;
    r->stream_syncs = c1.stream_syncs - c0.stream_syncs;
    r->event_syncs = c1.event_syncs - c0.event_syncs;
    r->driver_time_ns = c1.driver_time_ns - c0.driver_time_ns;

    /* Blocks the trace never frees (or a stopped replay left) go back before destroy. */
    for (uint32_t k = 0; k < t->n_ids; k++)
        if (ptr[k] && vmm_free(a, ptr[k]) != VMM_OK && !rc) {
            fprintf(stderr, "vmm-bench: cleanup free: %s\n", vmm_last_error());
            rc = BENCH_EXIT_FAIL;
        }
out:
    vmm_destroy(a);
    free(ptr);
    free(streams);
    free(routed);
    return rc;
}

int bench_min_capacity(const bench_trace *t, const bench_replay_opts *o, bench_replay_result *r)
{
    const uint64_t g = 2 * BENCH_MiB; /* the device granularity: capacities below it mean nothing */
    bench_replay_opts q = *o;
    q.stop_at_first_oom = 1;
    q.sample_every = 0;
    q.check_every = 0;
    q.progress = 0;
    bench_replay_result tmp;

    if (r->ooms) {
        r->min_capacity = 0; /* fails even at the full capacity */
        return BENCH_EXIT_OK;
    }
    /* Below the peak of live bytes nothing can complete: that is the known-bad end. */
    uint64_t lo = t->peak_live / g; /* in granules; lo*g < peak_live or == it */
    if (lo * g >= t->peak_live && lo > 0)
        lo--;
    uint64_t hi = (o->capacity / g) ? o->capacity / g : 1;
    /* Try the peak reserved of a full-capacity run first: usually it already fits, and it
     * shortens the search. */
    uint64_t guess = r->peak_reserved > 0 ? ((uint64_t)r->peak_reserved + g - 1) / g : hi;
    if (guess < hi && guess > lo) {
        q.capacity = guess * g;
        if (bench_replay(t, &q, &tmp) != BENCH_EXIT_OK)
            return BENCH_EXIT_FAIL;
        bench_replay_result_free(&tmp);
        if (tmp.ooms == 0)
            hi = guess;
        else
            lo = guess;
    }
    uint64_t steps = 0, total = 64 - (uint64_t)__builtin_clzll((hi - lo) | 1);
    while (hi - lo > 1) {
        uint64_t mid = lo + (hi - lo) / 2;
        q.capacity = mid * g;
        if (o->progress)
            bench_progress("min capacity", steps++, total);
        if (bench_replay(t, &q, &tmp) != BENCH_EXIT_OK)
            return BENCH_EXIT_FAIL;
        bench_replay_result_free(&tmp);
        if (tmp.ooms == 0)
            hi = mid;
        else
            lo = mid;
    }
    if (o->progress)
        bench_progress_end();
    r->min_capacity = (int64_t)(hi * g);
    return BENCH_EXIT_OK;
}

void bench_replay_result_free(bench_replay_result *r)
{
    free(r->tl_alloc);
    free(r->tl_reserved);
    r->tl_alloc = r->tl_reserved = NULL;
    r->n_samples = 0;
}
