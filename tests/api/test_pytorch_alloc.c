// ctest-labels: unit
// ctest-timeout: 120
/*
 * The PyTorch pluggable allocator entry points on the simulated driver: per-device allocators made
 * lazily from VMMALLOC_CONF + vmm_torch_configure + "device:N", used from several threads on two
 * devices; the stats / empty_cache / record_stream / reset helpers; OOM returns NULL and keeps the
 * report; bad conf, bad device and bad pointers are reported.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

/* Value of "key" in the device's stats JSON; -999 when missing. */
static long long stat_of(int device, const char *key)
{
    static char json[1 << 16];
    int n = vmm_torch_stats_json(device, json, sizeof json);
    CHECK(n > 0);
    if (n <= 0)
        return -999;
    char pat[160];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *p = strstr(json, pat);
    return p ? strtoll(p + strlen(pat), NULL, 10) : -999;
}

typedef struct worker_arg {
    int device;
    unsigned seed;
    int fails;
    long mallocs;
} worker_arg;

static void *worker(void *argp)
{
    worker_arg *w = argp;
    void *live[16] = {0};
    size_t sizes[16] = {0};
    for (int i = 0; i < 800; i++) {
        w->seed = w->seed * 1103515245u + 12345u;
        int k = (int)((w->seed >> 16) % 16);
        if (live[k]) {
            if (((unsigned char *)live[k])[sizes[k] - 1] != (unsigned char)(k + 1))
                w->fails++;
            vmm_torch_free(live[k], (ptrdiff_t)sizes[k], w->device, NULL);
            live[k] = NULL;
        } else {
            sizes[k] = (size_t)1 + (w->seed >> 4) % (3u << 20);
            live[k] = vmm_torch_malloc((ptrdiff_t)sizes[k], w->device, NULL);
            if (!live[k]) {
                w->fails++;
                continue;
            }
            w->mallocs++;
            ((unsigned char *)live[k])[sizes[k] - 1] = (unsigned char)(k + 1);
        }
    }
    for (int k = 0; k < 16; k++)
        if (live[k])
            vmm_torch_free(live[k], (ptrdiff_t)sizes[k], w->device, NULL);
    return NULL;
}

static void test_configure(void)
{
    char msg[2048];
    CHECK_EQ(vmm_torch_configure("no_such_key:1"), VMM_ECONFIG);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0);
    CHECK(strstr(msg, "no_such_key") != NULL);
    CHECK_EQ(vmm_torch_configure("sim_capacity:lots"), VMM_ECONFIG);
    CHECK_OK(vmm_torch_configure("sim_backed:true"));
}

static void test_threads_two_devices(void)
{
    enum { NT = 4 };
    pthread_t t[NT];
    worker_arg w[NT];
    for (int i = 0; i < NT; i++) {
        w[i] = (worker_arg){i % 2, 1000u + (unsigned)i, 0, 0};
        pthread_create(&t[i], NULL, worker, &w[i]);
    }
    long per_dev[2] = {0, 0};
    for (int i = 0; i < NT; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].fails, 0);
        per_dev[w[i].device] += w[i].mallocs;
    }
    vmm_allocator *a0 = NULL, *a1 = NULL;
    CHECK_OK(vmm_torch_get_allocator(0, &a0));
    CHECK_OK(vmm_torch_get_allocator(1, &a1));
    CHECK(a0 && a1 && a0 != a1);
    for (int d = 0; d < 2; d++) {
        CHECK(per_dev[d] > 0);
        CHECK_EQ(stat_of(d, "allocation.all.allocated"), per_dev[d]);
        CHECK_EQ(stat_of(d, "allocation.all.current"), 0);
        CHECK_EQ(stat_of(d, "allocated_bytes.all.current"), 0);
        CHECK(stat_of(d, "allocated_bytes.all.peak") > 0);
        CHECK(stat_of(d, "reserved_bytes.all.current") > 0);
        CHECK_EQ(stat_of(d, "num_ooms"), 0);
    }
    CHECK_OK(vmm_check(a0));
    CHECK_OK(vmm_check(a1));
    /* the conf reached the allocators: capacity from VMMALLOC_CONF, backing from configure, and
     * each its own device */
    char conf[4096];
    CHECK(vmm_config_string(a1, conf, sizeof conf) > 0);
    CHECK(strstr(conf, "device:1") != NULL);
    CHECK(strstr(conf, "sim_backed:true") != NULL);
    /* too late to configure now */
    CHECK_EQ(vmm_torch_configure("sim_backed:false"), VMM_EINVAL);
}

static void test_helpers(void)
{
    char msg[2048];
    /* live blocks show in the stats */
    void *p[3];
    for (int i = 0; i < 3; i++) {
        p[i] = vmm_torch_malloc(1000 * (i + 1), 0, NULL);
        CHECK(p[i] != NULL);
    }
    CHECK_EQ(stat_of(0, "allocation.all.current"), 3);
    CHECK_EQ(stat_of(0, "requested_bytes.all.current"), 6000);

    /* a pointer freed with the wrong device still finds its allocator */
    vmm_torch_free(p[2], 3000, 1, NULL);
    CHECK_EQ(stat_of(0, "allocation.all.current"), 2);

    /* record_stream */
    vmm_allocator *a0 = NULL;
    CHECK_OK(vmm_torch_get_allocator(0, &a0));
    vmm_stream s;
    CHECK_OK(vmm_sim_stream_create(a0, &s));
    CHECK_OK(vmm_torch_record_stream(p[0], s));
    int local;
    CHECK_EQ(vmm_torch_record_stream(&local, s), VMM_EBADPTR);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0 && strstr(msg, "record_stream") != NULL);
    vmm_torch_free(p[0], 1000, 0, s);
    vmm_torch_free(p[1], 2000, 0, NULL);
    CHECK_EQ(stat_of(0, "allocation.all.current"), 0);

    /* a bad free is reported, not fatal */
    vmm_torch_free(&local, 4, 0, NULL);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0 && strstr(msg, "vmm_torch_free") != NULL);

    /* size 0 and negative sizes, bad devices */
    CHECK(vmm_torch_malloc(0, 0, NULL) == NULL);
    CHECK(vmm_torch_malloc(-5, 0, NULL) == NULL);
    CHECK(vmm_torch_malloc(64, VMM_TORCH_MAX_DEVICES, NULL) == NULL);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0 && strstr(msg, "out of range") != NULL);
    CHECK(vmm_torch_stats_json(-2, msg, sizeof msg) == VMM_EINVAL);
    CHECK_EQ(vmm_torch_empty_cache(-7), VMM_EINVAL);

    /* peaks */
    CHECK(stat_of(0, "allocated_bytes.all.peak") > 0);
    CHECK_OK(vmm_torch_reset_peaks(0));
    CHECK_EQ(stat_of(0, "allocated_bytes.all.peak"), 0);
    CHECK_OK(vmm_torch_reset_peaks(-1));

    /* empty cache gives memory back. It never waits: the first call records fences on the streams
     * of the frees, and once the streams ran past them the second one releases the pages. */
    long long before = stat_of(0, "reserved_bytes.all.current");
    CHECK(before > 0);
    CHECK_OK(vmm_torch_empty_cache(-1));
    CHECK_OK(vmm_sim_synchronize(a0));
    CHECK_OK(vmm_torch_empty_cache(0));
    CHECK(stat_of(0, "reserved_bytes.all.current") < before);

    /* out of memory: NULL, and the report is kept for any thread to read */
    char oom[2048] = "";
    CHECK_EQ(vmm_torch_oom_report(oom, sizeof oom), 0);
    void *big = vmm_torch_malloc((ptrdiff_t)2 << 30, 1, NULL); /* 2 GiB on a 1 GiB device */
    CHECK(big == NULL);
    CHECK(vmm_torch_oom_report(oom, sizeof oom) > 0);
    CHECK(strstr(oom, "out of memory") != NULL);
    CHECK(strstr(oom, "2048.00 MiB") != NULL);
    CHECK_EQ(stat_of(1, "num_ooms"), 1);
    /* a short buffer gets a terminated prefix, the full length is returned */
    char tiny[8];
    CHECK_EQ(vmm_torch_oom_report(tiny, sizeof tiny), (long long)strlen(oom));
    CHECK_EQ(strlen(tiny), 7);
    /* the allocator is still fine afterwards */
    void *q = vmm_torch_malloc(1 << 20, 1, NULL);
    CHECK(q != NULL);
    vmm_torch_free(q, 1 << 20, 1, NULL);
}

/* Without the graph hooks the capture guard refuses a malloc on a capturing stream that no private
 * pool routes; a stream that does not capture is served as ever (off the allocator lock when its
 * thread cache has the block: the capture query comes first). */
static void test_capture_guard(void)
{
    char msg[2048];
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_torch_get_allocator(0, &a));
    vmm_stream s = NULL;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    CHECK_EQ(vmm_torch_set_capture_guard(1), 0);
    void *p = vmm_torch_malloc(4096, 0, s);
    CHECK(p != NULL);
    vmm_torch_free(p, 4096, 0, s);
    for (int i = 0; i < 2; i++) { /* the second malloc: the block the first free cached */
        p = vmm_torch_malloc(4096, 0, s);
        CHECK(p != NULL);
        vmm_torch_free(p, 4096, 0, s);
    }
    CHECK(vmm_test_json_num(a, "thread_caches.malloc_hits") >= 2);
    CHECK_OK(vmm_sim_capture_begin(a, s, VMM_SIM_CAPTURE_RELAXED));
    CHECK(vmm_torch_malloc(4096, 0, s) == NULL);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0 && strstr(msg, "capturing a CUDA graph") != NULL);
    vmm_sim_graph *g = NULL;
    CHECK_OK(vmm_sim_capture_end(a, s, &g));
    vmm_sim_graph_destroy(g);
    p = vmm_torch_malloc(4096, 0, s); /* the capture is over */
    CHECK(p != NULL);
    vmm_torch_free(p, 4096, 0, s);
    CHECK_EQ(vmm_torch_set_capture_guard(0), 1);
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_torch_empty_cache(0));
    CHECK_OK(vmm_sim_stream_destroy(a, s));
}

static void test_bad_env_conf(void)
{
    char msg[2048];
    vmm_torch_shutdown();
    setenv("VMMALLOC_CONF", "driver:sim,nonsense_key:3", 1);
    CHECK(vmm_torch_malloc(4096, 0, NULL) == NULL);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0);
    CHECK(strstr(msg, "nonsense_key") != NULL);
    CHECK(strstr(msg, "device 0") != NULL);
    vmm_allocator *a = (vmm_allocator *)&msg;
    CHECK_EQ(vmm_torch_get_allocator(0, &a), VMM_ECONFIG);
    CHECK(a == NULL);
    CHECK_EQ(vmm_torch_configure(NULL), VMM_ECONFIG); /* the environment is checked too */
    /* fixed environment: works again */
    setenv("VMMALLOC_CONF", "driver:sim,sim_capacity:256M", 1);
    CHECK_OK(vmm_torch_configure(NULL));
    void *p = vmm_torch_malloc(4096, 3, NULL);
    CHECK(p != NULL);
    vmm_torch_free(p, 4096, 3, NULL);
    vmm_torch_shutdown();
}

/* What torch.cuda's memory functions need of the library: a memory fraction set per device at run
 * time (PyTorch's set_memory_fraction_fn shape), reset of the cumulative counters without the peaks,
 * history for every device including those created later, the thread's malloc status, and which
 * devices have an allocator. */
static void test_torch_dropin_helpers(void)
{
    char msg[2048];
    vmm_torch_shutdown();
    setenv("VMMALLOC_CONF", "driver:sim,sim_capacity:1G", 1);
    CHECK_EQ(vmm_torch_has_allocator(0), 0);
    CHECK_EQ(vmm_torch_has_allocator(-1), 0);
    CHECK_EQ(vmm_torch_has_allocator(VMM_TORCH_MAX_DEVICES), 0);

    /* history asked for every device before any exists: device 0 records from its first malloc */
    CHECK_OK(vmm_torch_record_history_ex(-1, 1000, 0));
    void *p = vmm_torch_malloc(1 << 20, 0, NULL);
    CHECK(p != NULL);
    CHECK_EQ(vmm_torch_malloc_status(), VMM_OK);
    CHECK_EQ(vmm_torch_has_allocator(0), 1);
    CHECK_EQ(vmm_torch_has_allocator(1), 0);
    vmm_allocator *a0 = NULL;
    CHECK_OK(vmm_torch_get_allocator(0, &a0));
    vmm_trace_entry tr[8];
    int64_t n = vmm_history_get(a0, tr, 8);
    CHECK(n >= 1); /* at least the alloc (and the segment map before it) */

    /* fraction: 1 GiB device, 0.25 caps at 256 MiB; 300 MiB fails, 200 MiB fits */
    double f = 0;
    size_t cap = 0;
    CHECK_OK(vmm_torch_get_memory_fraction(0, &f, &cap));
    CHECK(f == 1.0);
    CHECK_EQ(cap, (size_t)1 << 30);
    vmm_torch_set_memory_fraction(0.25, 0);
    CHECK_OK(vmm_torch_get_memory_fraction(0, &f, &cap));
    CHECK(f == 0.25);
    CHECK_EQ(cap, (size_t)256 << 20);
    CHECK(vmm_torch_malloc((ptrdiff_t)300 << 20, 0, NULL) == NULL);
    CHECK_EQ(vmm_torch_malloc_status(), VMM_ENOMEM);
    CHECK(strstr(vmm_last_error(), "this allocator may use 256.00 MiB") != NULL);
    void *q = vmm_torch_malloc((ptrdiff_t)200 << 20, 0, NULL);
    CHECK(q != NULL);
    CHECK_EQ(vmm_torch_malloc_status(), VMM_OK);
    vmm_torch_free(q, (ptrdiff_t)200 << 20, 0, NULL);
    /* a bad fraction changes nothing and says so */
    vmm_torch_set_memory_fraction(1.5, 0);
    CHECK(vmm_torch_last_error(msg, sizeof msg) > 0 && strstr(msg, "not in [0, 1]") != NULL);
    CHECK_OK(vmm_torch_get_memory_fraction(0, &f, NULL));
    CHECK(f == 0.25);
    CHECK_EQ(vmm_set_memory_fraction(NULL, 0.5), VMM_EINVAL);
    /* back to the whole device: 300 MiB fits again */
    vmm_torch_set_memory_fraction(1.0, 0);
    q = vmm_torch_malloc((ptrdiff_t)300 << 20, 0, NULL);
    CHECK(q != NULL);
    vmm_torch_free(q, (ptrdiff_t)300 << 20, 0, NULL);
    /* the fraction is per device: device 1 keeps the whole device */
    vmm_torch_set_memory_fraction(0.1, 0);
    q = vmm_torch_malloc((ptrdiff_t)300 << 20, 1, NULL);
    CHECK(q != NULL);
    vmm_torch_free(q, (ptrdiff_t)300 << 20, 1, NULL);
    /* device 1 was created after the history request: it records too */
    vmm_allocator *a1 = NULL;
    CHECK_OK(vmm_torch_get_allocator(1, &a1));
    n = vmm_history_get(a1, tr, 8);
    CHECK(n >= 2);

    /* size 0: NULL with status OK (PyTorch's own allocator returns nullptr for 0 bytes) */
    CHECK(vmm_torch_malloc(0, 0, NULL) == NULL);
    CHECK_EQ(vmm_torch_malloc_status(), VMM_OK);

    /* reset of the cumulative counters keeps peaks; reset of peaks keeps the cumulative ones */
    CHECK(stat_of(0, "num_ooms") == 1);
    long long peak = stat_of(0, "allocated_bytes.all.peak");
    CHECK(peak >= (200 << 20));
    CHECK(stat_of(0, "allocation.all.allocated") >= 3);
    CHECK_OK(vmm_torch_reset_accumulated(0));
    CHECK_EQ(stat_of(0, "num_ooms"), 0);
    CHECK_EQ(stat_of(0, "allocation.all.allocated"), 0);
    CHECK_EQ(stat_of(0, "allocation.all.freed"), 0);
    CHECK_EQ(stat_of(0, "allocated_bytes.all.peak"), peak);
    CHECK_EQ(stat_of(0, "allocation.all.current"), 1);
    CHECK(stat_of(1, "allocation.all.allocated") >= 1); /* device 1 untouched */
    CHECK_OK(vmm_torch_reset_accumulated(-1));
    CHECK_EQ(stat_of(1, "allocation.all.allocated"), 0);
    CHECK_EQ(vmm_reset_accumulated_stats(NULL), VMM_EINVAL);

    /* stop recording everywhere; a device created later does not record */
    CHECK_OK(vmm_torch_record_history_ex(-1, 0, 0));
    vmm_torch_free(p, 1 << 20, 0, NULL);
    q = vmm_torch_malloc(4096, 2, NULL);
    CHECK(q != NULL);
    vmm_allocator *a2 = NULL;
    CHECK_OK(vmm_torch_get_allocator(2, &a2));
    CHECK_EQ(vmm_history_get(a2, tr, 8), 0);
    vmm_torch_free(q, 4096, 2, NULL);
    vmm_torch_shutdown();
}

int main(void)
{
    setenv("VMMALLOC_CONF", "driver:sim,sim_capacity:1G", 1);
    test_configure();
    test_threads_two_devices();
    test_helpers();
    test_capture_guard();
    test_bad_env_conf();
    test_torch_dropin_helpers();
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes, 0);
    CHECK_EQ(g.live_handles, 0);
    CHECK_EQ(g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_events, 0);
    TEST_DONE();
}
