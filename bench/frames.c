/*
 * vmm-bench frames: what recording history with call stacks costs per vmm_malloc and per
 * vmm_free, on the simulated device (the cached path: no driver call, so the numbers are the
 * allocator's own work plus the recording).
 *
 * Modes: history off; history on without stacks; history on with native stacks
 * (VMM_HISTORY_STACKS_NATIVE), the allocation made at a call depth of 0, 16 and 48 extra frames
 * (the unwinder's cost grows with the depth; a PyTorch op called from Python is typically 30 to
 * 60 native frames deep). Python frames need a Python process: bench/scripts/frames_python.py measures
 * them through the Python package.
 *
 * Each round mallocs a batch of 64 blocks of 4 KiB, then frees them, timing the two halves; the
 * median round over all gives ns per malloc and ns per free.
 */
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "history.h" /* vmm_history_unwinder */

enum { BATCH = 64, DEPTHS = 3 };

typedef struct frames_run {
    vmm_allocator *a;
    int rounds;
    double *malloc_ns, *free_ns; /* per round, per operation */
    int failed;
} frames_run;

static void round_trip(frames_run *r, int round)
{
    void *p[BATCH];
    uint64_t t0 = bench_now_ns();
    for (int i = 0; i < BATCH; i++)
        if (vmm_malloc(r->a, 4096, NULL, &p[i]) != VMM_OK)
            r->failed = 1;
    uint64_t t1 = bench_now_ns();
    for (int i = 0; i < BATCH; i++)
        vmm_free(r->a, p[i]);
    uint64_t t2 = bench_now_ns();
    r->malloc_ns[round] = (double)(t1 - t0) / BATCH;
    r->free_ns[round] = (double)(t2 - t1) / BATCH;
}

/* Run every round `depth` calls deeper than the caller (noinline, so each level is a frame). */
static __attribute__((noinline)) void at_depth(frames_run *r, int depth)
{
    if (depth > 0) {
        at_depth(r, depth - 1);
        __asm__ volatile("" ::: "memory"); /* not a tail call: the frame stays */
        return;
    }
    for (int k = 0; k < r->rounds; k++)
        round_trip(r, k);
}

typedef struct frames_result {
    const char *mode;
    int depth;
    double malloc_ns, free_ns;
} frames_result;

static int run_mode(const char *mode, int history, unsigned flags, int depth, int rounds,
                    frames_result *out)
{
    frames_run r = {.rounds = rounds};
    r.malloc_ns = bench_xmalloc((size_t)rounds * sizeof(double));
    r.free_ns = bench_xmalloc((size_t)rounds * sizeof(double));
    int rc = vmm_create("driver:sim,sim_capacity:1G,sim_backed:false", &r.a);
    if (rc == VMM_OK && history)
        rc = vmm_record_history_ex(r.a, 1 << 16, flags);
    if (rc != VMM_OK) {
        fprintf(stderr, "vmm-bench frames: %s\n", vmm_last_error());
        free(r.malloc_ns);
        free(r.free_ns);
        vmm_destroy(r.a);
        return BENCH_EXIT_FAIL;
    }
    at_depth(&r, 0); /* warm up: pages mapped, blocks cached, stacks interned */
    at_depth(&r, depth);
    out->mode = mode;
    out->depth = depth;
    out->malloc_ns = bench_quantile(r.malloc_ns, (size_t)rounds, 0.5);
    out->free_ns = bench_quantile(r.free_ns, (size_t)rounds, 0.5);
    free(r.malloc_ns);
    free(r.free_ns);
    vmm_destroy(r.a);
    return r.failed ? BENCH_EXIT_FAIL : BENCH_EXIT_OK;
}

int bench_frames(const bench_frames_opts *o)
{
    static const int depths[DEPTHS] = {0, 16, 48};
    frames_result res[2 + DEPTHS];
    int n = 0, rc = 0;
    int rounds = o->quick ? 200 : 3000;
    rc |= run_mode("off", 0, 0, 0, rounds, &res[n++]);
    rc |= run_mode("history", 1, 0, 0, rounds, &res[n++]);
    for (int d = 0; d < DEPTHS; d++)
        rc |= run_mode("native", 1, VMM_HISTORY_STACKS_NATIVE, depths[d], rounds, &res[n++]);
    if (rc)
        return BENCH_EXIT_FAIL;
    if (o->json) {
        for (int i = 0; i < n; i++)
            printf("{\"mode\": \"%s\", \"extra_depth\": %d, \"malloc_ns\": %.1f, \"free_ns\": %.1f, "
                   "\"unwinder\": \"%s\"}\n",
                   res[i].mode, res[i].depth, res[i].malloc_ns, res[i].free_ns, vmm_history_unwinder());
        return BENCH_EXIT_OK;
    }
    printf("History recording cost per call, 4 KiB blocks on the cached path (sim driver),\n"
           "median of %d rounds of %d mallocs then %d frees; native unwinder: %s\n\n", rounds, BATCH,
           BATCH, vmm_history_unwinder());
    printf("%-34s %12s %12s %14s\n", "mode", "malloc ns", "free ns", "malloc vs off");
    for (int i = 0; i < n; i++) {
        char label[64];
        if (!strcmp(res[i].mode, "native"))
            snprintf(label, sizeof label, "native stacks, +%d frames deep", res[i].depth);
        else
            snprintf(label, sizeof label, "%s", !strcmp(res[i].mode, "off") ? "history off" : "history, no stacks");
        printf("%-34s %12.0f %12.0f %+13.0f\n", label, res[i].malloc_ns, res[i].free_ns,
               res[i].malloc_ns - res[0].malloc_ns);
    }
    printf("\nPython frames: VMMALLOC_LIB=.../libvmmalloc.so python3 bench/scripts/frames_python.py\n");
    return BENCH_EXIT_OK;
}
