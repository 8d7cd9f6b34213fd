// ctest-labels: unit
/* Snapshot pickles: an allocator with live, pending, free and fused blocks and a recorded history
 * with native call stacks (expandable segments), then one without stacks (classic segments), is
 * written with vmm_snapshot_pickle, and tests/snapshot_check.py reads it back with a restricted
 * unpickler and checks it against PyTorch's format, against what PyTorch's memory viewer does with
 * it (replayed step by step), and against what this program knows: keys, block states and sizes
 * (a pending block keeps its requested size), segment sums against the stats, times in
 * microseconds since the epoch, frames on every block and alloc recorded with stacks (named from
 * libc), the trace against vmm_history_csv. Needs python3 (skips with 77 without it). */
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static char live_txt[8192], pending_txt[4096], groups_txt[4096], stacked_txt[4096];
static char extra_json[2048]; /* more EXPECT keys, ",\"key\": value..." */

static unsigned long long epoch_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (unsigned long long)ts.tv_sec * 1000000ull + (unsigned long long)ts.tv_nsec / 1000u;
}

static void add_stacked(void *p)
{
    size_t n = strlen(stacked_txt);
    snprintf(stacked_txt + n, sizeof stacked_txt - n, "%s%llu", n ? "," : "",
             (unsigned long long)(uintptr_t)p);
}

static void add_live(vmm_allocator *a, void *p, size_t requested)
{
    size_t n = strlen(live_txt);
    snprintf(live_txt + n, sizeof live_txt - n, "%s[%llu,%zu,%zu]", n ? "," : "",
             (unsigned long long)(uintptr_t)p, vmm_usable_size(a, p), requested);
}

static void add_pending(void *p, size_t size, size_t requested)
{
    size_t n = strlen(pending_txt);
    snprintf(pending_txt + n, sizeof pending_txt - n, "%s[%llu,%zu,%zu]", n ? "," : "",
             (unsigned long long)(uintptr_t)p, size, requested);
}

static void add_group(void **ptrs, const size_t *sizes, size_t k)
{
    size_t n = strlen(groups_txt);
    n += (size_t)snprintf(groups_txt + n, sizeof groups_txt - n, "%s[%llu,[", n ? "," : "",
                          (unsigned long long)(uintptr_t)ptrs[0]);
    for (size_t i = 0; i < k; i++)
        n += (size_t)snprintf(groups_txt + n, sizeof groups_txt - n, "%s[%llu,%zu]", i ? "," : "",
                              (unsigned long long)((uintptr_t)ptrs[i] - (uintptr_t)ptrs[0]), sizes[i]);
    snprintf(groups_txt + n, sizeof groups_txt - n, "]]");
}

static int run_checker(const char *python, vmm_allocator *a, int expandable, const char *tag,
                       const char *actions)
{
    char snap[256], exp[256], csvp[256], cmd[2048];
    snprintf(snap, sizeof snap, "/tmp/vmm_snap_%d_%s.pickle", (int)getpid(), tag);
    snprintf(exp, sizeof exp, "/tmp/vmm_snap_%d_%s.json", (int)getpid(), tag);
    snprintf(csvp, sizeof csvp, "/tmp/vmm_snap_%d_%s.csv", (int)getpid(), tag);
    CHECK_OK(vmm_snapshot_pickle(a, snap));
    CHECK_OK(vmm_history_csv(a, csvp));
    vmm_stats st;
    CHECK_OK(vmm_get_stats(a, &st));
    int64_t trace_len = vmm_history_get(a, NULL, 0);
    FILE *f = fopen(exp, "w");
    CHECK(f != NULL);
    if (!f)
        return 1;
    fprintf(f, "{\"device\": 0, \"expandable\": %s, \"page_size_min\": %zu,\n", expandable ? "true" : "false",
            2 * MiB);
    fprintf(f, " \"segment_bytes\": %lld, \"allocated_bytes\": %lld, \"active_bytes\": %lld,\n",
            (long long)(expandable ? st.mapped_bytes[0].current : st.reserved_bytes[0].current),
            (long long)st.allocated_bytes[0].current, (long long)st.active_bytes[0].current);
    fprintf(f, " \"trace_len\": %lld, \"trace_actions\": [%s],\n", (long long)trace_len, actions);
    fprintf(f, " \"live\": [%s],\n \"pending\": [%s],\n \"groups\": [%s],\n \"stacked\": [%s]%s}\n",
            live_txt, pending_txt, groups_txt, stacked_txt, extra_json);
    fclose(f);
    snprintf(cmd, sizeof cmd, "%s %s %s %s %s", python, vmm_test_source_path("tests/snapshot_check.py"),
             snap, exp, csvp);
    int rc = system(cmd);
    CHECK_EQ(rc, 0);
    if (rc == 0) {
        unlink(snap);
        unlink(exp);
        unlink(csvp);
    } else {
        fprintf(stderr, "kept %s %s %s\n", snap, exp, csvp);
    }
    live_txt[0] = pending_txt[0] = groups_txt[0] = stacked_txt[0] = extra_json[0] = '\0';
    return rc;
}

static void expandable_snapshot(const char *python)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G", &a));
    if (!a)
        return;
    /* a snapshot without history has empty traces */
    void *p0 = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, NULL, &p0));
    add_live(a, p0, 1 * MiB);
    CHECK_EQ(run_checker(python, a, 1, "nohist", ""), 0);
    add_live(a, p0, 1 * MiB);

    unsigned long long t_start = epoch_us();
    CHECK_OK(vmm_record_history_ex(a, 10000, VMM_HISTORY_STACKS_NATIVE));
    vmm_stream s1 = NULL, s2 = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s1));
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    void *p[12];
    size_t sz[12];
    for (int i = 0; i < 12; i++) {
        sz[i] = (i % 3 == 0) ? (size_t)(i + 1) * 700 * 1024 + 123 : (size_t)(i + 1) * 5000;
        CHECK_OK(vmm_malloc(a, sz[i], i % 2 ? s1 : s2, &p[i]));
    }
    /* free every third: inactive blocks between live ones */
    for (int i = 0; i < 12; i++) {
        if (i % 3 == 1)
            CHECK_OK(vmm_free(a, p[i]));
        else if (i != 5) {
            add_live(a, p[i], sz[i]);
            add_stacked(p[i]);
        }
    }
    /* p[5] (on s1) used by a kernel on s2 that waits: pending while the snapshot is taken */
    vmm_test_gate g = {0};
    CHECK_OK(vmm_record_stream(a, p[5], s2));
    CHECK_OK(vmm_sim_launch(a, s2, vmm_test_gate_wait, &g));
    size_t pend_size = vmm_usable_size(a, p[5]);
    CHECK_OK(vmm_free(a, p[5]));
    add_pending(p[5], pend_size, sz[5]);
    /* fused buffers */
    size_t gs[4] = {3000, 100, 1 * MiB, 9000};
    void *gp[4];
    CHECK_OK(vmm_malloc_group(a, gs, 4, s1, gp));
    add_live(a, gp[0], (size_t)((uintptr_t)gp[3] - (uintptr_t)gp[0]) + gs[3]);
    add_group(gp, gs, 4);
    /* an unmapped range between mapped ones: a big block freed and its pages reclaimed */
    void *big = NULL, *after = NULL;
    CHECK_OK(vmm_malloc(a, 40 * MiB, s1, &big));
    CHECK_OK(vmm_malloc(a, 6 * MiB, s1, &after));
    add_live(a, after, 6 * MiB);
    add_stacked(after);
    CHECK_OK(vmm_free(a, big));
    CHECK_OK(vmm_empty_cache(a));
    void *huge = NULL;
    CHECK_EQ(vmm_malloc(a, 2000 * MiB, s1, &huge), VMM_ENOMEM);
    CHECK_OK(vmm_check(a));
    /* frames: named from libc (dladdr), the test's own code unnamed (not exported) but present */
    snprintf(extra_json, sizeof extra_json,
             ",\n \"frames\": \"some\", \"frame_names\": [\"__libc_start_main\"], "
             "\"frame_files\": [\"libc.so.6\", \"test_snapshot\"], \"segment_frames\": true, "
             "\"time_window\": [%llu, %llu]",
             t_start, epoch_us() + 1);
    CHECK_EQ(run_checker(python, a, 1, "exp",
                         "\"alloc\",\"free_requested\",\"free_completed\",\"segment_map\","
                         "\"segment_unmap\",\"oom\""),
             0);
    atomic_store(&g.open, 1);
    CHECK_OK(vmm_sim_synchronize(a));
    vmm_destroy(a);
}

static void classic_snapshot(const char *python)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:1G,expandable_segments:false", &a));
    if (!a)
        return;
    unsigned long long t_start = epoch_us();
    CHECK_OK(vmm_record_history(a, 10000));
    void *p[6];
    for (int i = 0; i < 6; i++) {
        size_t s = (size_t)(i + 1) * 300 * 1024;
        CHECK_OK(vmm_malloc(a, s, NULL, &p[i]));
        if (i % 2)
            CHECK_OK(vmm_free(a, p[i]));
        else
            add_live(a, p[i], s);
    }
    void *x = NULL;
    CHECK_OK(vmm_malloc(a, 30 * MiB, NULL, &x));
    CHECK_OK(vmm_free(a, x));
    CHECK_OK(vmm_empty_cache(a));
    snprintf(extra_json, sizeof extra_json, ",\n \"frames\": \"none\", \"time_window\": [%llu, %llu]",
             t_start, epoch_us() + 1);
    CHECK_EQ(run_checker(python, a, 0, "classic",
                         "\"alloc\",\"free_requested\",\"free_completed\",\"segment_alloc\","
                         "\"segment_free\""),
             0);
    CHECK_EQ(vmm_snapshot_pickle(a, "/nonexistent-dir/s.pickle"), VMM_EINVAL);
    CHECK(strstr(vmm_last_error(), "/nonexistent-dir/s.pickle") != NULL);
    CHECK_EQ(vmm_snapshot_pickle(NULL, "/tmp/x"), VMM_EINVAL);
    CHECK_EQ(vmm_snapshot_pickle(a, NULL), VMM_EINVAL);
    vmm_destroy(a);
}

int main(void)
{
    const char *python = vmm_test_python();
    if (!python) {
        fprintf(stderr, "test_snapshot: python3 is not installed: skipped\n");
        return 77;
    }
    expandable_snapshot(python);
    classic_snapshot(python);
    /* the checker against a snapshot PyTorch itself wrote (workloads/pytorch, in the tree): its
     * format and viewer checks must hold there too */
    char real[1024], cmd[2048]; /* copied: vmm_test_source_path reuses one buffer */
    snprintf(real, sizeof real, "%s", vmm_test_source_path("workloads/pytorch/cs336_bcrafton_memory_snapshot.pickle"));
    CHECK_EQ(access(real, R_OK), 0);
    snprintf(cmd, sizeof cmd, "%s %s --pytorch-only %s", python, vmm_test_source_path("tests/snapshot_check.py"),
             real);
    CHECK_EQ(system(cmd), 0);
    TEST_DONE();
}
