/*
 * vmm-bench sleep: sleep and wake of N GiB by mode, on the simulated device.
 *
 *  - discard (vLLM's level 2): an unbacked sim (accounting only, so 47.4 GiB fits any host), blocks
 *    of one tag, sleep with VMM_SLEEP_DISCARD then wake; what is reported is the modeled driver time
 *    (sim.driver_time_ns: the cost model's per-call costs, measured on an A100 for 2 MiB pages) and
 *    the host time of the allocator itself;
 *  - backup (level 1, torch_memory_saver's CPU backup): a backed sim (real memory), the blocks
 *    filled, sleep with VMM_SLEEP_BACKUP then wake; reported: wall time (real host copies between the
 *    simulated device's memfd pages and the host buffer, plus first-touch faults of fresh pages) and
 *    the modeled driver time; then the same with VMM_SLEEP_KEEP_HOST on a second cycle (the host
 *    buffer reused: what the pinning costs). A GPU estimate adds the modeled driver time to the bytes
 *    over the plain pinned copy bandwidth measured on a PCIe Gen4 x16 GPU (24.43 GiB/s device to
 *    host, 23.54 GiB/s host to device; torch_memory_saver issue #111, NVIDIA L20).
 * Each at two page sizes of the large pool: 2 MiB (vmmalloc's default) and 32 MiB (the power of two
 * nearest PyTorch's 20 MiB expandable-segment page; page sizes here are powers of two).
 * The published figures printed beside them are those issue 12 cites.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

#define GiB ((double)(1ull << 30))

/* Published figures (cited by issue 12; sources in docs/benchmarks.md). */
static const double VLLM_L2_SLEEP_GIB = 47.4, VLLM_L2_SLEEP_S = 0.31; /* vLLM level-2 sleep */
static const double VLLM_L1_BACKUP_GIBS = 2.0;                         /* vLLM level 1, with backup */
static const double TMS_PAUSE_GIBS = 2.41, TMS_RESUME_GIBS = 5.32;     /* torch_memory_saver #111 */
static const double PCIE_DTOH_GIBS = 24.43, PCIE_HTOD_GIBS = 23.54;    /* plain pinned copies, #111 */

typedef struct phase {
    double wall_s;       /* host wall time of the call */
    double driver_s;     /* modeled driver time of its calls */
    uint64_t calls[VMM_SIM_CALL_COUNT];
} phase;

typedef struct result {
    const char *mode;
    size_t page;
    double gib;
    phase sleep, wake, sleep2, wake2;
    int have2;
    size_t freed_bytes; /* mem_get_info rise at sleep */
} result;

static int counters(vmm_allocator *a, vmm_sim_counters *c)
{
    int rc = vmm_sim_get_counters(a, c);
    if (rc)
        fprintf(stderr, "vmm-bench sleep: vmm_sim_get_counters: %s\n", vmm_last_error());
    return rc;
}

static void phase_end(vmm_allocator *a, const vmm_sim_counters *c0, uint64_t t0, phase *p)
{
    vmm_sim_counters c1;
    p->wall_s = (double)(bench_now_ns() - t0) * 1e-9;
    if (counters(a, &c1))
        return;
    p->driver_s = (double)(c1.driver_time_ns - c0->driver_time_ns) * 1e-9;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        p->calls[k] = c1.calls[k] - c0->calls[k];
}

static const char *const TAG[] = {"weights"};

/* One run: allocate gib in blocks of `block` bytes under one tag, sleep, wake (twice when backed). */
static int run(const char *mode, double gib, size_t page, int backed, result *r)
{
    char conf[256];
    size_t cap = (size_t)(gib * GiB) + (size_t)(4 * GiB);
    snprintf(conf, sizeof conf, "driver:sim,sim_capacity:%zu,sim_backed:%s,large_page_size:%zu",
             cap, backed ? "true" : "false", page);
    vmm_allocator *a = NULL;
    if (vmm_create(conf, &a) != VMM_OK) {
        fprintf(stderr, "vmm-bench sleep: vmm_create(%s): %s\n", conf, vmm_last_error());
        return BENCH_EXIT_FAIL;
    }
    memset(r, 0, sizeof *r);
    r->mode = mode;
    r->page = page;
    r->gib = gib;
    /* tensors of a model: 512 MiB blocks, the rest in one */
    size_t total = (size_t)(gib * GiB), block = (size_t)512 << 20;
    size_t n = (total + block - 1) / block;
    void **p = bench_xmalloc(n * sizeof *p);
    int rc = vmm_set_tag(a, "weights");
    for (size_t i = 0; i < n && !rc; i++) {
        size_t sz = i + 1 < n ? block : total - (n - 1) * block;
        rc = vmm_malloc(a, sz, NULL, &p[i]);
        if (!rc && backed)
            memset(p[i], (int)(i + 1), sz); /* backed sim memory is host memory */
    }
    if (rc) {
        fprintf(stderr, "vmm-bench sleep: allocating %.2f GiB: %s\n", gib, vmm_last_error());
        free(p);
        vmm_destroy(a);
        return BENCH_EXIT_FAIL;
    }
    int smode = backed ? VMM_SLEEP_BACKUP : VMM_SLEEP_DISCARD;
    for (int cycle = 0; cycle < (backed ? 2 : 1) && !rc; cycle++) {
        int m = smode | (cycle == 0 && backed ? VMM_SLEEP_KEEP_HOST : 0);
        vmm_sim_counters c0;
        size_t f0 = 0, f1 = 0;
        vmm_stats st;
        vmm_get_stats(a, &st);
        counters(a, &c0);
        f0 = (size_t)(c0.capacity_bytes - c0.phys_bytes);
        uint64_t t0 = bench_now_ns();
        rc = vmm_sleep(a, TAG, 1, m);
        phase_end(a, &c0, t0, cycle ? &r->sleep2 : &r->sleep);
        vmm_sim_counters c1;
        counters(a, &c1);
        f1 = (size_t)(c1.capacity_bytes - c1.phys_bytes);
        if (!cycle)
            r->freed_bytes = f1 - f0;
        if (rc)
            break;
        counters(a, &c0);
        t0 = bench_now_ns();
        rc = vmm_wake(a, TAG, 1);
        phase_end(a, &c0, t0, cycle ? &r->wake2 : &r->wake);
        r->have2 = cycle;
    }
    if (rc)
        fprintf(stderr, "vmm-bench sleep: %s\n", vmm_last_error());
    if (!rc && backed) /* the contents survived */
        for (size_t i = 0; i < n && !rc; i++)
            if (((unsigned char *)p[i])[0] != (unsigned char)(i + 1) ||
                ((unsigned char *)p[i])[(i + 1 < n ? block : total - (n - 1) * block) - 1] != (unsigned char)(i + 1)) {
                fprintf(stderr, "vmm-bench sleep: block %zu lost its contents\n", i);
                rc = -1;
            }
    if (!rc && vmm_check(a) != VMM_OK) {
        fprintf(stderr, "vmm-bench sleep: vmm_check: %s\n", vmm_last_error());
        rc = -1;
    }
    for (size_t i = 0; i < n; i++)
        vmm_free(a, p[i]);
    free(p);
    vmm_destroy(a);
    return rc ? BENCH_EXIT_FAIL : BENCH_EXIT_OK;
}

static void print_phase(const char *what, const phase *p, double gib, double copy_gibs, int json, int last)
{
    double est = p->driver_s + (copy_gibs > 0 ? gib / copy_gibs : 0);
    if (json) {
        printf("\"%s\":{\"wall_s\":%.6f,\"driver_s\":%.6f,\"gpu_estimate_s\":%.6f,\"mem_create\":%llu,"
               "\"mem_map\":%llu,\"set_access\":%llu,\"mem_unmap\":%llu,\"mem_release\":%llu,\"memcpy\":%llu,"
               "\"host_alloc\":%llu,\"host_free\":%llu}%s",
               what, p->wall_s, p->driver_s, est, (unsigned long long)p->calls[VMM_SIM_CALL_MEM_CREATE],
               (unsigned long long)p->calls[VMM_SIM_CALL_MEM_MAP],
               (unsigned long long)p->calls[VMM_SIM_CALL_SET_ACCESS],
               (unsigned long long)p->calls[VMM_SIM_CALL_MEM_UNMAP],
               (unsigned long long)p->calls[VMM_SIM_CALL_MEM_RELEASE],
               (unsigned long long)p->calls[VMM_SIM_CALL_MEMCPY],
               (unsigned long long)p->calls[VMM_SIM_CALL_HOST_ALLOC],
               (unsigned long long)p->calls[VMM_SIM_CALL_HOST_FREE], last ? "" : ",");
        return;
    }
    printf("    %-17s wall %8.4f s  modeled driver %7.4f s  (%.1f GiB/s)   GPU estimate %7.4f s (%.1f GiB/s)\n"
           "    %-17s calls: %llu create, %llu map, %llu set_access, %llu unmap, %llu release, %llu copies\n",
           what, p->wall_s, p->driver_s, p->driver_s > 0 ? gib / p->driver_s : 0.0, est,
           est > 0 ? gib / est : 0.0, "", (unsigned long long)p->calls[VMM_SIM_CALL_MEM_CREATE],
           (unsigned long long)p->calls[VMM_SIM_CALL_MEM_MAP],
           (unsigned long long)p->calls[VMM_SIM_CALL_SET_ACCESS],
           (unsigned long long)p->calls[VMM_SIM_CALL_MEM_UNMAP],
           (unsigned long long)p->calls[VMM_SIM_CALL_MEM_RELEASE],
           (unsigned long long)p->calls[VMM_SIM_CALL_MEMCPY]);
}

static void print_result(const result *r, int json, int first)
{
    int backed = strcmp(r->mode, "backup") == 0;
    double dtoh = backed ? PCIE_DTOH_GIBS : 0, htod = backed ? PCIE_HTOD_GIBS : 0;
    if (json) {
        printf("%s{\"mode\":\"%s\",\"gib\":%.3f,\"page_bytes\":%zu,\"freed_bytes\":%zu,", first ? "" : ",", r->mode,
               r->gib, r->page, r->freed_bytes);
        print_phase("sleep", &r->sleep, r->gib, dtoh, 1, 0);
        print_phase("wake", &r->wake, r->gib, htod, 1, !r->have2);
        if (r->have2) {
            print_phase("sleep_kept_host", &r->sleep2, r->gib, dtoh, 1, 0);
            print_phase("wake_kept_host", &r->wake2, r->gib, htod, 1, 1);
        }
        printf("}");
        return;
    }
    printf("  %s, %.2f GiB, %zu MiB pages (mem_get_info rose by %.2f GiB at sleep)\n", r->mode, r->gib,
           r->page >> 20, (double)r->freed_bytes / GiB);
    print_phase("sleep", &r->sleep, r->gib, dtoh, 0, 0);
    print_phase("wake", &r->wake, r->gib, htod, 0, 0);
    if (r->have2) {
        print_phase("sleep (kept host)", &r->sleep2, r->gib, dtoh, 0, 0);
        print_phase("wake (kept host)", &r->wake2, r->gib, htod, 0, 0);
    }
}

int bench_sleep(int argc, char **argv)
{
    double gib = VLLM_L2_SLEEP_GIB, backup_gib = 4.0;
    int json = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--json")) {
            json = 1;
        } else if (!strcmp(argv[i], "--quick")) {
            gib = 4.0;
            backup_gib = 0.5;
        } else if (!strcmp(argv[i], "--gib") && i + 1 < argc) {
            gib = atof(argv[++i]);
        } else if (!strcmp(argv[i], "--backup-gib") && i + 1 < argc) {
            backup_gib = atof(argv[++i]);
        } else {
            fprintf(stderr, "vmm-bench sleep: unknown option %s\n"
                            "usage: vmm-bench sleep [--gib N] [--backup-gib M] [--quick] [--json]\n", argv[i]);
            return BENCH_EXIT_INPUT;
        }
    }
    if (!(gib > 0) || !(backup_gib > 0)) {
        fprintf(stderr, "vmm-bench sleep: sizes must be positive\n");
        return BENCH_EXIT_INPUT;
    }
    static const size_t pages[2] = {(size_t)2 << 20, (size_t)32 << 20};
    result r[4];
    int n = 0, rc = BENCH_EXIT_OK;
    for (int k = 0; k < 2 && !rc; k++)
        rc = run("discard", gib, pages[k], 0, &r[n++]);
    for (int k = 0; k < 2 && !rc; k++)
        rc = run("backup", backup_gib, pages[k], 1, &r[n++]);
    if (rc)
        return rc;
    if (json) {
        printf("{\"published\":{\"vllm_level2_sleep_gib\":%.1f,\"vllm_level2_sleep_s\":%.2f,"
               "\"vllm_level1_backup_gibs\":%.1f,\"tms_pause_gibs\":%.2f,\"tms_resume_gibs\":%.2f,"
               "\"pcie_dtoh_gibs\":%.2f,\"pcie_htod_gibs\":%.2f},\"runs\":[",
               VLLM_L2_SLEEP_GIB, VLLM_L2_SLEEP_S, VLLM_L1_BACKUP_GIBS, TMS_PAUSE_GIBS, TMS_RESUME_GIBS,
               PCIE_DTOH_GIBS, PCIE_HTOD_GIBS);
        for (int i = 0; i < n; i++)
            print_result(&r[i], 1, i == 0);
        printf("]}\n");
        return BENCH_EXIT_OK;
    }
    printf("vmm-bench sleep: simulated device, cost model per call (docs/benchmarks.md); GPU estimate = "
           "modeled driver time + bytes at %.2f / %.2f GiB/s (D2H / H2D plain pinned copies)\n",
           PCIE_DTOH_GIBS, PCIE_HTOD_GIBS);
    for (int i = 0; i < n; i++)
        print_result(&r[i], 0, i == 0);
    printf("published: vLLM level-2 sleep of %.1f GiB in %.2f s (%.0f GiB/s); vLLM level 1 with backup "
           "~%.0f GiB/s; torch_memory_saver CPU backup %.2f GiB/s pause, %.2f GiB/s resume\n",
           VLLM_L2_SLEEP_GIB, VLLM_L2_SLEEP_S, VLLM_L2_SLEEP_GIB / VLLM_L2_SLEEP_S, VLLM_L1_BACKUP_GIBS,
           TMS_PAUSE_GIBS, TMS_RESUME_GIBS);
    return BENCH_EXIT_OK;
}
