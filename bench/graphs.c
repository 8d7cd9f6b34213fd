/*
 * vmm-bench record-graphs: a trace with capture segments, recorded on a simulated device.
 *
 * A training loop in the way torch.cuda.graph is used with a shared pool (make_graphed_callables,
 * cudagraph trees): weights allocated eagerly, a few eager warm-up steps, then the forward and the
 * backward step each captured on a side stream into one private pool (vmm_pool_begin before the
 * capture, vmm_pool_end after it, as PyTorch's beginAllocateToPool / endAllocateToPool), replayed
 * every step with eager optimizer and logging work between the replays, and released at the end
 * (PyTorch's releasePool, once per graph), after which eager steps may use the memory again.
 *
 * Every allocator call is written as a line of PyTorch's trace CSV (action,addr,size,stream,time_us)
 * with the simulated device's real addresses and streams; the pool calls as pool_begin, pool_end and
 * pool_release lines whose addr and size carry the pool id (see bench/trace.c).
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"

typedef struct rec {
    FILE *f;
    vmm_allocator *a;
    uint64_t n;
    int fail;
} rec;

typedef struct blk {
    void *p;
    size_t size;
    vmm_stream s;
} blk;

static long long sid(vmm_stream s) { return (long long)(uintptr_t)s; }

static blk ralloc(rec *r, size_t size, vmm_stream s)
{
    blk b = {NULL, size, s};
    if (r->fail)
        return b;
    int rc = vmm_malloc(r->a, size, s, &b.p);
    if (rc != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: vmm_malloc(%zu): %s\n", size, vmm_last_error());
        r->fail = 1;
        return b;
    }
    fprintf(r->f, "alloc,%llu,%zu,%lld,%llu\n", (unsigned long long)(uintptr_t)b.p, size, sid(s),
            (unsigned long long)r->n++);
    return b;
}

static void rfree(rec *r, blk *b)
{
    if (!b->p)
        return;
    if (vmm_free(r->a, b->p) != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: vmm_free: %s\n", vmm_last_error());
        r->fail = 1;
    }
    fprintf(r->f, "free_completed,%llu,%zu,%lld,%llu\n", (unsigned long long)(uintptr_t)b->p, b->size,
            sid(b->s), (unsigned long long)r->n++);
    b->p = NULL;
}

static void pool(rec *r, const char *what, uint64_t id1, vmm_stream s)
{
    if (r->fail)
        return;
    int rc = !strcmp(what, "pool_begin") ? vmm_pool_begin(r->a, 0, id1, s)
             : !strcmp(what, "pool_end") ? vmm_pool_end(r->a, 0, id1)
                                         : vmm_pool_release(r->a, 0, id1);
    if (rc != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: %s: %s\n", what, vmm_last_error());
        r->fail = 1;
    }
    fprintf(r->f, "%s,0,%llu,%lld,%llu\n", what, (unsigned long long)id1, sid(s), (unsigned long long)r->n++);
}

/* Sizes: activations of a batch (MiB-scale, varying with the step's sequence length), small
 * bookkeeping tensors. */
static size_t act_size(uint64_t *rng, size_t scale)
{
    uint64_t x = bench_rand(rng);
    if (x % 4 == 0)
        return 512 + (size_t)(bench_rand(rng) % (64 << 10));
    return ((size_t)(1 + bench_rand(rng) % 24) << 20) * scale / 8 + (size_t)(bench_rand(rng) % 4096) * 512;
}

enum { WEIGHTS = 24, ACTS = 32, OUTS = 8 };

/* One captured step: temporaries freed inside the capture, OUTS outputs kept. */
static void capture_step(rec *r, vmm_stream cap, uint64_t pool_id, uint64_t *rng, blk *outs)
{
    pool(r, "pool_begin", pool_id, cap);
    if (!r->fail && vmm_sim_capture_begin(r->a, cap, VMM_SIM_CAPTURE_GLOBAL) != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: capture: %s\n", vmm_last_error());
        r->fail = 1;
    }
    blk t[ACTS];
    for (int i = 0; i < ACTS; i++) {
        t[i] = ralloc(r, act_size(rng, 8), cap);
        if (i >= 4 && bench_rand(rng) % 3)
            rfree(r, &t[i - 4]); /* activations die as the step goes on */
    }
    for (int i = 0; i < OUTS; i++)
        outs[i] = ralloc(r, act_size(rng, 8), cap);
    for (int i = 0; i < ACTS; i++)
        rfree(r, &t[i]);
    vmm_sim_graph *g = NULL;
    if (!r->fail && vmm_sim_capture_end(r->a, cap, &g) != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: capture invalidated: %s\n", vmm_last_error());
        r->fail = 1;
    }
    vmm_sim_graph_destroy(g); /* unbacked device: replays would run nothing; the trace is the point */
    pool(r, "pool_end", pool_id, cap);
}

static void eager_step(rec *r, vmm_stream s, uint64_t *rng, size_t scale)
{
    blk t[ACTS];
    int n = ACTS / 2 + (int)(bench_rand(rng) % (ACTS / 2));
    for (int i = 0; i < n; i++)
        t[i] = ralloc(r, act_size(rng, scale), s);
    for (int i = n; i-- > 0;)
        rfree(r, &t[i]);
}

int bench_record_graphs(const char *out, uint64_t steps, uint64_t seed)
{
    FILE *f = fopen(out, "w");
    if (!f) {
        fprintf(stderr, "vmm-bench: cannot create %s\n", out);
        return BENCH_EXIT_FAIL;
    }
    rec r = {f, NULL, 0, 0};
    if (vmm_create("driver:sim,sim_backed:false,sim_capacity:16G", &r.a) != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: vmm_create: %s\n", vmm_last_error());
        fclose(f);
        return BENCH_EXIT_FAIL;
    }
    vmm_stream main_s = NULL, cap = NULL;
    if (vmm_sim_stream_create(r.a, &main_s) != VMM_OK || vmm_sim_stream_create(r.a, &cap) != VMM_OK) {
        fprintf(stderr, "vmm-bench record-graphs: streams: %s\n", vmm_last_error());
        r.fail = 1;
    }
    fprintf(f, "action,addr,size,stream,time_us\n");
    uint64_t rng = seed;
    blk w[WEIGHTS], fwd[OUTS], bwd[OUTS];
    for (int i = 0; i < WEIGHTS; i++)
        w[i] = ralloc(&r, ((size_t)4 + bench_rand(&rng) % 60) << 20, main_s);
    for (int i = 0; i < 3; i++)
        eager_step(&r, main_s, &rng, 8);
    /* graph_pool_handle(): one pool for both graphs, captured in the order they replay */
    capture_step(&r, cap, 1, &rng, fwd);
    capture_step(&r, cap, 1, &rng, bwd);
    for (uint64_t s = 0; s < steps && !r.fail; s++) {
        /* replays (no allocator call), then the optimizer's and the logger's eager work */
        eager_step(&r, main_s, &rng, 2);
        blk log = ralloc(&r, 512 + (size_t)(bench_rand(&rng) % (1 << 20)), main_s);
        rfree(&r, &log);
    }
    /* the graphs go: their outputs, then one release per graph */
    for (int i = 0; i < OUTS; i++) {
        rfree(&r, &fwd[i]);
        rfree(&r, &bwd[i]);
    }
    pool(&r, "pool_release", 1, cap);
    pool(&r, "pool_release", 1, cap);
    for (int i = 0; i < 3; i++)
        eager_step(&r, main_s, &rng, 12); /* bigger eager steps: the former graph memory serves them */
    for (int i = 0; i < WEIGHTS; i++)
        rfree(&r, &w[i]);
    vmm_destroy(r.a);
    int bad = ferror(f);
    if (fclose(f) || bad) {
        fprintf(stderr, "vmm-bench: write error on %s\n", out);
        return BENCH_EXIT_FAIL;
    }
    return r.fail ? BENCH_EXIT_FAIL : BENCH_EXIT_OK;
}
