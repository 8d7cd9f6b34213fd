// ctest-labels: gpu
// ctest-timeout: 300
/* The allocator's scenarios against the real driver (driver:cuda). Exits 77 when no usable GPU with
 * virtual memory management is present. Each scenario is capped to 1 GiB of the device with
 * per_process_memory_fraction, so it behaves the same on any GPU size:
 *  - fragmentation: 150 x 6 MiB, free two of three, ask for 600 MiB: classic mode OOMs, expandable
 *    mode remaps free pages and succeeds, with the data of live blocks intact (device memset / copy);
 *  - stream-ordered reuse: a block freed after record_stream on a busy stream is not handed out to
 *    another stream before that stream's work ends, and malloc does not block meanwhile;
 *  - vmm_check after every step, and empty_cache returns everything at the end. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
enum { N = 150, PATTERN_WORDS = 1024 };

static int usable_gpu(double *fraction)
{
    vmm_allocator *a = NULL;
    if (vmm_create("driver:cuda", &a) != VMM_OK) {
        fprintf(stderr, "no usable GPU: %s\n", vmm_last_error());
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

int main(void)
{
    double fraction = 1.0;
    if (!usable_gpu(&fraction))
        return 77;
    CHECK_EQ(fragmentation(fraction, 0), VMM_ENOMEM);
    CHECK_EQ(fragmentation(fraction, 1), VMM_OK);
    stream_reuse();
    TEST_DONE();
}
