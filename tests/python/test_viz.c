// ctest-labels: unit
// ctest-timeout: 180
/* vmm-viz (python/vmmalloc/_vmm_viz.py): a snapshot with a recorded workload (growing and shrinking memory,
 * pending and fused blocks, an OOM) and its trace CSV are rendered to HTML; tests/viz_check.py
 * checks the pages' content, then screenshots them with headless Chromium and checks the pictures
 * show the chart lines and block colours. Skips (77) when python3 is absent; when chromium is
 * absent the HTML checks still run and the test skips with the reason printed.
 * VMM_VIZ_KEEP=DIR keeps the files there (to look at them). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

/* A training-like pattern: a few steps of activations growing then freed, weights kept. */
static void workload(vmm_allocator *a, vmm_stream s1, vmm_stream s2, vmm_test_gate *g, void **keep, size_t nkeep)
{
    uint64_t x = 12345;
    for (size_t i = 0; i < nkeep; i++) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        CHECK_OK(vmm_malloc(a, (size_t)(x >> 44) % (3 * MiB) + 4096, s1, &keep[i]));
    }
    for (int step = 0; step < 4; step++) {
        void *act[24];
        for (int i = 0; i < 24; i++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            size_t sz = (i % 4 == 0) ? (size_t)(x >> 40) % (12 * MiB) + MiB : (size_t)(x >> 48) % (256 * 1024) + 512;
            CHECK_OK(vmm_malloc(a, sz, i % 5 == 0 ? s2 : s1, &act[i]));
            vmm_test_sleep_ms(1);
        }
        for (int i = 23; i >= 0; i--) {
            if (step == 3 && i % 6 == 1)
                continue; /* some stay live at the end */
            CHECK_OK(vmm_free(a, act[i]));
        }
        vmm_test_sleep_ms(3);
        if (step == 1)
            CHECK_OK(vmm_empty_cache(a));
    }
    void *huge = NULL;
    CHECK_EQ(vmm_malloc(a, 900 * MiB, s1, &huge), VMM_ENOMEM);
    size_t gs[5] = {2 * MiB, 300 * 1024, 700 * 1024, 5000, MiB};
    void *gp[5];
    CHECK_OK(vmm_malloc_group(a, gs, 5, s1, gp));
    /* pending: used on s2 by a kernel that waits until the snapshot is written */
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s1, &p));
    CHECK_OK(vmm_record_stream(a, p, s2));
    CHECK_OK(vmm_sim_launch(a, s2, vmm_test_gate_wait, g));
    CHECK_OK(vmm_free(a, p));
}

int main(void)
{
    const char *python = vmm_test_python();
    if (!python) {
        fprintf(stderr, "test_viz: python3 is not installed: skipped\n");
        return 77;
    }
    const char *keep_dir = getenv("VMM_VIZ_KEEP");
    char dir[256];
    if (keep_dir && *keep_dir) {
        snprintf(dir, sizeof dir, "%s", keep_dir);
        mkdir(dir, 0755);
    } else {
        snprintf(dir, sizeof dir, "/tmp/vmm_viz_XXXXXX");
        CHECK(mkdtemp(dir) != NULL);
    }
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:512M,sim_backed:false", &a));
    if (!a)
        TEST_DONE();
    CHECK_OK(vmm_record_history(a, 100000));
    vmm_stream s1 = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    vmm_test_gate g = {0};
    void *keep[16];
    workload(a, s1, s2, &g, keep, 16);
    CHECK_OK(vmm_check(a));
    char snap[512], csvp[512], cmd[4096];
    snprintf(snap, sizeof snap, "%s/snapshot.pickle", dir);
    snprintf(csvp, sizeof csvp, "%s/trace.csv", dir);
    CHECK_OK(vmm_snapshot_pickle(a, snap));
    CHECK_OK(vmm_history_csv(a, csvp));
    atomic_store(&g.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    vmm_destroy(a);

    char check_py[1024], viz_py[1024]; /* vmm_test_source_path returns a static buffer */
    snprintf(check_py, sizeof check_py, "%s", vmm_test_source_path("tests/viz_check.py"));
    snprintf(viz_py, sizeof viz_py, "%s", vmm_test_source_path("python/vmmalloc/_vmm_viz.py"));
    snprintf(cmd, sizeof cmd, "%s %s %s %s %s", python, check_py, viz_py, snap, csvp);
    int rc = system(cmd);
    int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : 1;
    CHECK(status == 0 || status == 77);
    if (!(keep_dir && *keep_dir)) {
        snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
        CHECK_EQ(system(cmd), 0);
    }
    if (vmm_test_failures == 0 && status == 77)
        return 77;
    TEST_DONE();
}
