// ctest-labels: gpu
// ctest-timeout: 300
// ctest-cudadouble
/* The allocator's scenarios against the cuda driver (driver:cuda): on a real GPU, and in CI on the
 * CUDA double (copy test_gpu_alloc_double, 2 devices). Exits 77 only when no CUDA driver is
 * installed or it sees no device; a device without VMM fails nothing but skips the VMM scenarios. Each scenario is capped to 1 GiB of the device with
 * per_process_memory_fraction, so it behaves the same on any GPU size:
 *  - fragmentation: 150 x 6 MiB, free two of three, ask for 600 MiB: classic mode OOMs, expandable
 *    mode remaps free pages and succeeds, with the data of live blocks intact (device memset / copy);
 *  - stream-ordered reuse: a block freed after record_stream on a busy stream is not handed out to
 *    another stream before that stream's work ends, and malloc does not block meanwhile;
 *  - vmm_check after every step, and empty_cache returns everything at the end;
 *  - with 2+ devices: record_stream with another device's stream (the free must not fail, the
 *    block must wait for that stream), peer access (default all; peer_access:none then
 *    vmm_enable_peer_access reaches memory mapped before), pinned memory used by both devices;
 *  - the calling thread's context is left as it was (none);
 *  - vmm_check asks the driver about mapped pages, not every page of an 80 GiB reservation;
 *  - on the double: driver faults leave the allocator consistent and no call synchronizes. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <pthread.h>

#ifndef VMM_HAVE_CUDA_H
#include <stdio.h>
int main(void)
{
    printf("built without the CUDA toolkit: there is no cuda driver to test (skipped)\n");
    return 77;
}
#else

#include <cuda.h>

#include "cudadouble.h"
#include "internal.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
enum { N = 150, PATTERN_WORDS = 1024 };

static int device_count = 1;

/* 0: go on; else the exit code (77 skip only for no driver / no device, see vmm_test_gpu_gate). */
static int gpu_gate(void)
{
    vmm_driver *d = NULL;
    char msg[512];
    int r = vmm_driver_cuda_open(0, &d, msg, sizeof msg);
    int gate = vmm_test_gpu_gate(r, msg);
    if (d) {
        vmm_device_info info;
        if (d->ops->device_info(d, &info) == VMM_DRV_SUCCESS)
            device_count = info.device_count;
        d->ops->close(d);
    }
    return gate;
}

static int usable_gpu(double *fraction)
{
    vmm_allocator *a = NULL;
    if (vmm_create("driver:cuda", &a) != VMM_OK) {
        fprintf(stderr, "driver:cuda allocator: %s\n", vmm_last_error());
        vmm_test_failures++;
        return 0;
    }
    int ok = a->dev.vmm_supported;
    *fraction = (double)VMM_GiB / (double)a->dev.total_bytes;
    fprintf(stderr, "device %d: %s, %zu MiB, granularity %zu KiB, VMM %s\n", a->dev.ordinal, a->dev.name,
            a->dev.total_bytes >> 20, a->dev.granularity >> 10, ok ? "yes" : "no");
    vmm_destroy(a);
    return ok && *fraction < 1.0;
}

/* Fill the first PATTERN_WORDS words of p with value, in stream order. */
static void fill(vmm_allocator *a, void *p, uint32_t value)
{
    CHECK_EQ(a->drv->ops->memset32(a->drv, (uintptr_t)p, value, PATTERN_WORDS, NULL), 0);
}

static int intact(vmm_allocator *a, void *p, uint32_t value)
{
    static uint32_t host[PATTERN_WORDS];
    memset(host, 0, sizeof host);
    if (a->drv->ops->memcpy_dtoh(a->drv, host, (uintptr_t)p, sizeof host, NULL) != 0 ||
        a->drv->ops->stream_sync(a->drv, NULL) != 0)
        return 0;
    for (int i = 0; i < PATTERN_WORDS; i++)
        if (host[i] != value)
            return 0;
    return 1;
}

static int fragmentation(double fraction, int expandable)
{
    char conf[128];
    snprintf(conf, sizeof conf, "driver:cuda,expandable_segments:%s,per_process_memory_fraction:%.6f",
             expandable ? "true" : "false", fraction);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    if (!a)
        return -1;
    void *p[N];
    for (int i = 0; i < N; i++) {
        CHECK_OK(vmm_malloc(a, 6 * MiB, NULL, &p[i]));
        fill(a, p[i], 0xA5000000u + (uint32_t)i);
    }
    for (int i = 0; i < N; i++)
        if (i % 3 != 1) {
            CHECK_OK(vmm_free(a, p[i]));
            p[i] = NULL;
        }
    CHECK_OK(vmm_check(a));
    void *big = NULL;
    int rc = vmm_malloc(a, 600 * MiB, NULL, &big);
    CHECK_OK(vmm_check(a));
    if (rc == VMM_OK) {
        fill(a, big, 0x5A5A5A5Au);
        CHECK(intact(a, big, 0x5A5A5A5Au));
        CHECK_OK(vmm_free(a, big));
    }
    for (int i = 0; i < N; i++)
        if (p[i]) {
            CHECK(intact(a, p[i], 0xA5000000u + (uint32_t)i));
            CHECK_OK(vmm_free(a, p[i]));
        }
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    return rc;
}

static void sleep_host(void *arg) { vmm_test_sleep_ms((unsigned)(uintptr_t)arg); }

static void stream_reuse(void)
{
    /* Streams come from a driver of their own (same primary context), so they outlive the allocator
     * as an application's streams do. */
    vmm_driver *d = NULL;
    char msg[256];
    CHECK_EQ(vmm_driver_cuda_open(0, &d, msg, sizeof msg), 0);
    if (!d)
        return;
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:cuda", &a));
    if (!a) {
        d->ops->close(d);
        return;
    }
    void *s1 = NULL, *s2 = NULL;
    CHECK_EQ(d->ops->stream_create(d, &s1), 0);
    CHECK_EQ(d->ops->stream_create(d, &s2), 0);
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, s2, &p));
    CHECK_OK(vmm_record_stream(a, p, s1));
    /* s1 stays busy for 300 ms; the free must not hand p to s2 before that. */
    CHECK_EQ(d->ops->launch_host(d, s1, sleep_host, (void *)(uintptr_t)300), 0);
    CHECK_OK(vmm_free(a, p));
    unsigned long long t0 = vmm_test_now_ns();
    for (int i = 0; i < 8; i++) {
        void *q = NULL;
        CHECK_OK(vmm_malloc(a, 4 * MiB, s2, &q));
        if (vmm_test_now_ns() - t0 < 250ull * 1000000ull)
            CHECK(q != p);
        CHECK_OK(vmm_free(a, q));
        CHECK_OK(vmm_check(a));
    }
    CHECK(vmm_test_now_ns() - t0 < 250ull * 1000000ull); /* malloc did not wait for s1 */
    vmm_stats st;
    CHECK_OK(vmm_get_stats(a, &st));
    CHECK_EQ(st.num_event_waits, 0);
    CHECK_EQ(d->ops->stream_sync(d, s1), 0);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    CHECK_EQ(d->ops->stream_destroy(d, s1), 0);
    CHECK_EQ(d->ops->stream_destroy(d, s2), 0);
    d->ops->close(d);
}

/* ---- multi-device scenarios ------------------------------------------------------------------- */

typedef struct hold_arg {
    unsigned ms;
} hold_arg;

static void hold_run(void *arg) { vmm_test_sleep_ms(((hold_arg *)arg)->ms); }

/* record_stream with a stream of device 1 on device 0's allocator: the free succeeds and the block
 * waits for that stream; pinned memory handed to both devices' streams the same. */
static void foreign_stream(void)
{
    vmm_driver *d1 = NULL;
    char msg[256];
    CHECK_EQ(vmm_driver_cuda_open(1, &d1, msg, sizeof msg), 0);
    if (!d1)
        return;
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:cuda", &a));
    if (!a) {
        d1->ops->close(d1);
        return;
    }
    void *s1 = NULL;
    CHECK_EQ(d1->ops->stream_create(d1, &s1), 0);
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &p));
    CHECK_OK(vmm_record_stream(a, p, s1));
    hold_arg hold = {300};
    CHECK_EQ(d1->ops->launch_host(d1, s1, hold_run, &hold), 0);
    unsigned long long t0 = vmm_test_now_ns();
    CHECK_OK(vmm_free(a, p)); /* used to fail: an event of device 0 cannot be recorded on s1 */
    for (int i = 0; i < 4; i++) {
        void *q = NULL;
        CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &q));
        if (vmm_test_now_ns() - t0 < 250ull * 1000000ull)
            CHECK(q != p);
        CHECK_OK(vmm_free(a, q));
        CHECK_OK(vmm_check(a));
    }
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.num_event_waits, 0);

    /* pinned: a staging buffer used by a copy on each device */
    void *h = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 1 << 20, NULL, &h));
    CHECK_OK(vmm_pinned_record_stream(a, h, s1));
    CHECK_EQ(d1->ops->launch_host(d1, s1, hold_run, &hold), 0);
    CHECK_OK(vmm_pinned_free(a, h));
    void *h2 = NULL;
    CHECK_OK(vmm_pinned_malloc(a, 1 << 20, NULL, &h2));
    CHECK(h2 != h); /* s1 still holds the old one */
    CHECK_OK(vmm_pinned_free(a, h2));

    CHECK_EQ(d1->ops->stream_sync(d1, s1), 0);
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    CHECK_EQ(d1->ops->stream_destroy(d1, s1), 0);
    d1->ops->close(d1);
}

/* A kernel on device 1 may touch device 0's blocks once peer access is on. */
static void peer_access(const cudadouble_hooks_t *hooks)
{
    uint32_t word = 0;
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:cuda", &a)); /* peer_access:all by default */
    if (!a)
        return;
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 6 * MiB, NULL, &p));
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)p, sizeof word, &word, 1), CUDA_SUCCESS);
    CHECK_OK(vmm_free(a, p));
    vmm_destroy(a);

    CHECK_OK(vmm_create("driver:cuda,peer_access:none", &a));
    if (!a)
        return;
    CHECK_OK(vmm_malloc(a, 6 * MiB, NULL, &p));
    void *small = NULL;
    CHECK_OK(vmm_malloc(a, 4096, NULL, &small));
    CHECK_EQ(hooks->device_access(0, (CUdeviceptr)(uintptr_t)p, sizeof word, &word, 0), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)p, sizeof word, &word, 0),
             CUDA_ERROR_ILLEGAL_ADDRESS);
    CHECK_OK(vmm_enable_peer_access(a, 1)); /* reaches what was mapped before */
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)p, sizeof word, &word, 0), CUDA_SUCCESS);
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)small, sizeof word, &word, 0), CUDA_SUCCESS);
    void *later = NULL;
    CHECK_OK(vmm_malloc(a, 40 * MiB, NULL, &later)); /* and what is mapped after */
    CHECK_EQ(hooks->device_access(1, (CUdeviceptr)(uintptr_t)later + 30 * MiB, sizeof word, &word, 0),
             CUDA_SUCCESS);
    CHECK_EQ(vmm_enable_peer_access(a, device_count), VMM_ENODEV);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(a, small));
    CHECK_OK(vmm_free(a, later));
    vmm_destroy(a);
}

/* ---- one device -------------------------------------------------------------------------------- */

static void *no_context_thread(void *arg)
{
    vmm_allocator *a = arg;
    CUresult (*get_current)(CUcontext *) = NULL;
    void *fn = vmm_test_cu_proc("cuCtxGetCurrent");
    memcpy(&get_current, &fn, sizeof fn);
    CHECK(get_current != NULL);
    if (!get_current)
        return NULL;
    CUcontext c = (CUcontext)(uintptr_t)1;
    CHECK_EQ(get_current(&c), CUDA_SUCCESS);
    CHECK(c == NULL);
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &p));
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_EQ(get_current(&c), CUDA_SUCCESS);
    if (c != NULL) {
        fprintf(stderr, "a thread without a context was left with %p by the allocator\n", (void *)c);
        vmm_test_failures++;
    }
    return NULL;
}

static void context_hygiene(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:cuda", &a));
    if (!a)
        return;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, no_context_thread, a), 0);
    pthread_join(t, NULL);
    vmm_destroy(a);
}

/* vmm_check must not ask the driver about every page of the reservation (80 GiB: 40960 pages of
 * the large pool alone), or it cannot sit in a timed scenario on a real GPU. */
static void check_cost(const cudadouble_hooks_t *hooks)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:cuda", &a));
    if (!a)
        return;
    void *p = NULL, *q = NULL;
    CHECK_OK(vmm_malloc(a, 8 * MiB, NULL, &p));
    CHECK_OK(vmm_malloc(a, 4096, NULL, &q));
    unsigned long before = hooks->calls("cuMemRetainAllocationHandle");
    unsigned long long t0 = vmm_test_now_ns();
    CHECK_OK(vmm_check(a));
    double ms = (double)(vmm_test_now_ns() - t0) / 1e6;
    unsigned long asked = hooks->calls("cuMemRetainAllocationHandle") - before;
    printf("vmm_check: %lu driver lookups, %.2f ms, for 5 mapped pages of %zu GiB reserved\n", asked, ms,
           (a->va_size[VMM_LARGE] + a->va_size[VMM_SMALL]) >> 30);
    CHECK(asked <= 16);
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(a, q));
    vmm_destroy(a);
}

/* Injected driver failures on each call kind: the allocator reports them, stays consistent, works
 * once the fault is gone, and never synchronizes. */
static void faults(const cudadouble_hooks_t *hooks)
{
    static const int kinds[] = {VMM_SIM_CALL_VA_RESERVE, VMM_SIM_CALL_MEM_CREATE, VMM_SIM_CALL_MEM_MAP,
                                VMM_SIM_CALL_SET_ACCESS, VMM_SIM_CALL_EVENT_CREATE,
                                VMM_SIM_CALL_EVENT_RECORD};
    vmm_sim_counters c0;
    CHECK_EQ(hooks->counters(0, &c0), 0);
    for (size_t k = 0; k < sizeof kinds / sizeof kinds[0]; k++) {
        vmm_allocator *a = NULL;
        CHECK_OK(vmm_create("driver:cuda", &a));
        if (!a)
            return;
        void *s1 = NULL;
        CHECK_EQ(a->drv->ops->stream_create(a->drv, &s1), 0);
        CHECK_EQ(hooks->fail_nth(0, kinds[k], 1), 0);
        void *p = NULL;
        int rc = vmm_malloc(a, 10 * MiB, NULL, &p);
        CHECK_OK(vmm_check(a));
        if (rc == VMM_OK) {
            CHECK_OK(vmm_record_stream(a, p, s1));
            CHECK_OK(vmm_free(a, p)); /* must not fail, even when its event cannot be had */
        }
        CHECK_OK(vmm_check(a));
        CHECK_OK(vmm_malloc(a, 10 * MiB, NULL, &p));
        CHECK_OK(vmm_free(a, p));
        CHECK_EQ(a->drv->ops->stream_sync(a->drv, s1), 0);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK_EQ(a->drv->ops->stream_destroy(a->drv, s1), 0);
        vmm_destroy(a);
    }
    vmm_sim_counters c1;
    CHECK_EQ(hooks->counters(0, &c1), 0);
    CHECK_EQ(c1.device_syncs - c0.device_syncs, 0);
}

int main(void)
{
    int gate = gpu_gate();
    if (gate)
        return gate;
    double fraction = 1.0;
    if (!usable_gpu(&fraction)) {
        if (vmm_test_failures)
            TEST_DONE();
        printf("device without VMM support: allocator scenarios not run\n");
        return 77;
    }
    CHECK_EQ(fragmentation(fraction, 0), VMM_ENOMEM);
    CHECK_EQ(fragmentation(fraction, 1), VMM_OK);
    stream_reuse();
    context_hygiene();
    const cudadouble_hooks_t *hooks = cudadouble_hooks();
    if (device_count > 1) {
        foreign_stream();
        if (hooks)
            peer_access(hooks);
    } else {
        printf("one device: multi-device scenarios not run\n");
    }
    if (hooks) {
        check_cost(hooks);
        faults(hooks);
        vmm_sim_counters live;
        unsigned ctxs = 0;
        hooks->live(&live, &ctxs);
        CHECK_EQ(live.live_handles, 0);
        CHECK_EQ(live.mapped_bytes, 0);
        CHECK_EQ(live.reserved_va_bytes, 0);
        CHECK_EQ(live.live_events, 0);
        CHECK_EQ(live.live_host_allocs, 0);
    } else {
        printf("real GPU: vmm_check cost and fault scenarios need the double's counters\n");
    }
    TEST_DONE();
}

#endif /* VMM_HAVE_CUDA_H */
