// ctest-labels: gpu
// ctest-timeout: 180
// ctest-cudadouble
/* CUDA graph capture against the cuda driver (driver:cuda): on a real GPU, and in CI on the CUDA
 * double (copy test_gpu_capture_double), which refuses "potentially unsafe" calls as cuda.h's
 * capture modes say and invalidates the capture (cuStreamEndCapture then gives no graph), and
 * refuses queries of captured events. The double records graphs but never launches them, so a
 * "replay" here is the captured memsets issued again on the stream, as the graph would run them.
 *  - a capture in global mode with allocations routed to a private pool that need new pages
 *    (cuMemCreate, cuMemMap, cuMemSetAccess in relaxed mode), a temporary freed inside it, a block
 *    used by a forked stream and freed inside it, while another thread allocates, frees, empties
 *    the cache and checks on its own stream: the capture stays valid, the allocator records no
 *    event and synchronizes nothing meanwhile;
 *  - an allocation that needs a wait fails during the capture, saying capture prevented the sync;
 *  - replays between eager allocations: no eager block in the graph's memory, data intact;
 *  - the negative control: the same cuMemCreate from that thread in global mode invalidates;
 *  - the pool's memory goes back at the last release; nothing left alive at the end. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifndef VMM_HAVE_CUDA_H
int main(void)
{
    printf("built without the CUDA toolkit: there is no cuda driver to test (skipped)\n");
    return 77;
}
#else

#include <cuda.h>
#include <cudaTypedefs.h>

#include "cudadouble.h"
#include "internal.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
enum { WORDS = 1024 };

static PFN_cuStreamBeginCapture_v10010 begin_capture;
static PFN_cuStreamEndCapture_v10000 end_capture;
static PFN_cuGraphDestroy_v10000 graph_destroy;
static PFN_cuMemCreate_v10020 mem_create;
static PFN_cuMemRelease_v10020 mem_release;

static int resolve(void)
{
    void *p;
#define R_(var, sym)                                                                           \
    if (!(p = vmm_test_cu_proc(sym)))                                                          \
        return 0;                                                                              \
    memcpy(&var, &p, sizeof p);
    R_(begin_capture, "cuStreamBeginCapture")
    R_(end_capture, "cuStreamEndCapture")
    R_(graph_destroy, "cuGraphDestroy")
    R_(mem_create, "cuMemCreate")
    R_(mem_release, "cuMemRelease")
#undef R_
    return 1;
}

static int device_count = 1;

static int gpu_gate(void)
{
    vmm_driver *d = NULL;
    char msg[512];
    int r = vmm_driver_cuda_open(0, &d, msg, sizeof msg);
    int gate = vmm_test_gpu_gate(r, msg);
    if (d) {
        vmm_device_info info;
        if (d->ops->device_info(d, &info) == VMM_DRV_SUCCESS) {
            device_count = info.device_count;
            if (!info.vmm_supported) {
                printf("device 0 has no VMM: capture scenarios use classic segments only\n");
            }
        }
        d->ops->close(d);
    }
    return gate;
}

static int in_pool(vmm_allocator *a, const void *p, uint64_t id0)
{
    uint64_t i0 = 99, i1 = 99;
    return vmm_pool_lookup(a, p, &i0, &i1) == VMM_OK && i0 == id0 && i1 == 0;
}

static int holds(vmm_driver *d, void *s, const void *p, uint32_t v)
{
    static uint32_t host[WORDS];
    memset(host, 0, sizeof host);
    if (d->ops->memcpy_dtoh(d, host, (uintptr_t)p, sizeof host, s) || d->ops->stream_sync(d, s))
        return 0;
    for (int i = 0; i < WORDS; i++)
        if (host[i] != v)
            return 0;
    return 1;
}

/* Calls of the allocator that must not happen while capturing (the test's own fork / join records
 * two events). */
typedef struct counts {
    unsigned long record, query, esync, ssync, csync, ffree;
} counts;

static counts count(const cudadouble_hooks_t *h)
{
    counts c = {0, 0, 0, 0, 0, 0};
    if (h) {
        c.record = h->calls("cuEventRecord");
        c.query = h->calls("cuEventQuery");
        c.esync = h->calls("cuEventSynchronize");
        c.ssync = h->calls("cuStreamSynchronize");
        c.csync = h->calls("cuCtxSynchronize");
        c.ffree = h->calls("cuMemFree");
    }
    return c;
}

typedef struct thread_arg {
    vmm_allocator *a;
    void *stream;
    int control; /* raw cuMemCreate in global mode: must invalidate */
} thread_arg;

static void *other_thread(void *p)
{
    thread_arg *x = p;
    if (x->control) {
        CUmemAllocationProp prop;
        memset(&prop, 0, sizeof prop);
        prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
        prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        prop.location.id = 0;
        CUmemGenericAllocationHandle h = 0;
        CUresult r = mem_create(&h, x->a->dev.granularity, &prop, 0);
        CHECK_EQ(r, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        if (r == CUDA_SUCCESS)
            mem_release(h);
        return NULL;
    }
    void *b[3];
    for (int i = 0; i < 3; i++)
        CHECK_OK(vmm_malloc(x->a, 24 * MiB, x->stream, &b[i]));
    for (int i = 0; i < 3; i++)
        CHECK_OK(vmm_free(x->a, b[i]));
    CHECK_OK(vmm_empty_cache(x->a));
    CHECK_OK(vmm_check(x->a));
    return NULL;
}

static void capture(const cudadouble_hooks_t *hooks, int control)
{
    vmm_driver *d = NULL;
    char msg[256];
    CHECK_EQ(vmm_driver_cuda_open(0, &d, msg, sizeof msg), 0);
    if (!d)
        return;
    vmm_allocator *a = NULL;
    /* 256 MiB of the device, so that the OOM below is real on any GPU */
    char conf[128];
    vmm_device_info info;
    CHECK_EQ(d->ops->device_info(d, &info), 0);
    snprintf(conf, sizeof conf, "driver:cuda,per_process_memory_fraction:%.6f",
             (double)(256 * MiB) / (double)info.total_bytes);
    CHECK_OK(vmm_create(conf, &a));
    if (!a) {
        d->ops->close(d);
        return;
    }
    void *s = NULL, *s2 = NULL, *e = NULL, *e2 = NULL;
    CHECK_EQ(d->ops->stream_create(d, &s), 0);
    CHECK_EQ(d->ops->stream_create(d, &s2), 0);
    CHECK_EQ(d->ops->stream_create(d, &e), 0);
    CHECK_EQ(d->ops->stream_create(d, &e2), 0);
    /* eager memory cached on s, and a block pending on e2 for the OOM below */
    void *w = NULL, *big = NULL;
    CHECK_OK(vmm_malloc(a, 8 * MiB, s, &w));
    CHECK_OK(vmm_free(a, w));
    CHECK_OK(vmm_malloc(a, 120 * MiB, s, &big));
    CHECK_OK(vmm_record_stream(a, big, e2));
    CHECK_OK(vmm_free(a, big)); /* pending: the event on e2 is recorded (e2 idle, so done soon) */

    counts c0 = count(hooks);
    CHECK_OK(vmm_pool_begin(a, 1, 0, s));
    CHECK_EQ(begin_capture((CUstream)s, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    void *x = NULL, *y = NULL, *t = NULL, *u = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &x)); /* new pages, in relaxed mode */
    CHECK_OK(vmm_malloc(a, 30 * MiB, s, &y));
    CHECK_OK(vmm_malloc(a, 2 * MiB, s, &t));
    CHECK_EQ(d->ops->memset32(d, (uintptr_t)x, 0x11111111u, WORDS, s), 0);
    CHECK_EQ(d->ops->memset32(d, (uintptr_t)y, 0x22222222u, WORDS, s), 0);
    CHECK_EQ(d->ops->memset32(d, (uintptr_t)t, 0x44444444u, WORDS, s), 0);
    CHECK_OK(vmm_free(a, t));
    /* fork s2 into the capture, use a block there, join, free it */
    vmm_event fork = NULL, join = NULL;
    CHECK_EQ(d->ops->event_create(d, &fork), 0);
    CHECK_EQ(d->ops->event_create(d, &join), 0);
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &u));
    CHECK_EQ(d->ops->event_record(d, fork, s), 0);
    CHECK_EQ(d->ops->stream_wait_event(d, s2, fork), 0);
    CHECK_OK(vmm_record_stream(a, u, s2));
    CHECK_EQ(d->ops->memset32(d, (uintptr_t)u, 0x55555555u, WORDS, s2), 0);
    CHECK_EQ(d->ops->event_record(d, join, s2), 0);
    CHECK_EQ(d->ops->stream_wait_event(d, s, join), 0);
    CHECK_OK(vmm_free(a, u));
    void *v = NULL;
    CHECK_OK(vmm_malloc(a, 1 * MiB, s, &v));
    CHECK(v != u);
    CHECK_EQ(d->ops->memset32(d, (uintptr_t)v, 0x66666666u, WORDS, s), 0);
    /* a wait would serve this one (big is pending): it fails instead, and says why */
    void *q = NULL;
    CHECK_EQ(vmm_malloc(a, 200 * MiB, s, &q), VMM_ENOMEM);
    CHECK(strstr(vmm_last_error(), "capture prevented the sync") != NULL);
    /* meanwhile another thread of the program works eagerly */
    thread_arg ta = {a, e, control};
    pthread_t th;
    CHECK_EQ(pthread_create(&th, NULL, other_thread, &ta), 0);
    pthread_join(th, NULL);
    CHECK_OK(vmm_check(a));
    CUgraph graph = NULL;
    CUresult r = end_capture((CUstream)s, &graph);
    counts c1 = count(hooks);
    if (control) {
        CHECK_EQ(r, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        CHECK(graph == NULL);
    } else {
        CHECK_EQ(r, CUDA_SUCCESS);
        CHECK(graph != NULL);
    }
    if (hooks) {
        CHECK_EQ(c1.record, c0.record + 2);
        /* queries of events recorded before the capture are allowed in relaxed mode; one of a
         * captured event would have invalidated the capture (checked above) */
        (void)c1.query;
        CHECK_EQ(c1.esync, c0.esync);
        CHECK_EQ(c1.ssync, c0.ssync);
        CHECK_EQ(c1.csync, c0.csync);
        CHECK_EQ(c1.ffree, c0.ffree);
    }
    CHECK_OK(vmm_pool_end(a, 1, 0));
    d->ops->event_destroy(d, fork);
    d->ops->event_destroy(d, join);
    if (graph)
        CHECK_EQ(graph_destroy(graph), CUDA_SUCCESS);
    CHECK(in_pool(a, x, 1) && in_pool(a, y, 1) && in_pool(a, v, 1) && in_pool(a, t, 1));

    /* replays (the captured memsets again) between eager allocations */
    for (int round = 0; round < 3 && !control; round++) {
        void *eg[6];
        size_t sz[6] = {MiB, 2 * MiB, 30 * MiB, 512, 5 * MiB, 1536};
        for (int i = 0; i < 6; i++) {
            CHECK_OK(vmm_malloc(a, sz[i], i % 2 ? e : s, &eg[i]));
            CHECK(in_pool(a, eg[i], 0));
            CHECK_EQ(d->ops->memset32(d, (uintptr_t)eg[i], 0xEE000000u + (uint32_t)i,
                                      sz[i] / 4 < WORDS ? sz[i] / 4 : WORDS, i % 2 ? e : s), 0);
        }
        CHECK_EQ(d->ops->stream_sync(d, e), 0);
        CHECK_EQ(d->ops->memset32(d, (uintptr_t)x, 0x11111111u, WORDS, s), 0);
        CHECK_EQ(d->ops->memset32(d, (uintptr_t)y, 0x22222222u, WORDS, s), 0);
        CHECK_EQ(d->ops->memset32(d, (uintptr_t)t, 0x44444444u, WORDS, s), 0);
        CHECK_EQ(d->ops->memset32(d, (uintptr_t)u, 0x55555555u, WORDS, s), 0);
        CHECK_EQ(d->ops->memset32(d, (uintptr_t)v, 0x66666666u, WORDS, s), 0);
        CHECK(holds(d, s, x, 0x11111111u));
        CHECK(holds(d, s, y, 0x22222222u));
        CHECK(holds(d, s, v, 0x66666666u));
        CHECK(holds(d, s, eg[2], 0xEE000002u)); /* the replay did not reach eager memory */
        for (int i = 0; i < 6; i++)
            CHECK_OK(vmm_free(a, eg[i]));
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
    }
    CHECK_OK(vmm_free(a, x));
    CHECK_OK(vmm_free(a, y));
    CHECK_OK(vmm_free(a, v));
    CHECK_OK(vmm_pool_release(a, 1, 0)); /* cuCtxSynchronize once, then the memory is eager's */
    CHECK(in_pool(a, x, 0));
    void *after = NULL;
    CHECK_OK(vmm_malloc(a, 200 * MiB, s, &after)); /* no capture: waiting on big is fine now */
    CHECK_OK(vmm_free(a, after));
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
    CHECK_EQ(d->ops->stream_destroy(d, s), 0);
    CHECK_EQ(d->ops->stream_destroy(d, s2), 0);
    CHECK_EQ(d->ops->stream_destroy(d, e), 0);
    CHECK_EQ(d->ops->stream_destroy(d, e2), 0);
    d->ops->close(d);
}

int main(void)
{
    int gate = gpu_gate();
    if (gate)
        return gate;
    if (!resolve()) {
        fprintf(stderr, "cannot resolve the capture entry points\n");
        return 1;
    }
    const cudadouble_hooks_t *hooks = cudadouble_hooks();
    capture(hooks, 0);
    if (hooks) {
        capture(hooks, 1);
        cudadouble_objects_t o;
        hooks->objects(&o);
        CHECK_EQ(o.captures, 0);
        CHECK_EQ(o.graphs, 0);
        vmm_sim_counters live;
        unsigned ctxs = 0;
        hooks->live(&live, &ctxs);
        CHECK_EQ(live.live_handles, 0);
        CHECK_EQ(live.mapped_bytes, 0);
        CHECK_EQ(live.reserved_va_bytes, 0);
    } else {
        printf("real GPU: the negative control and the call counts need the double\n");
    }
    (void)device_count;
    TEST_DONE();
}

#endif /* VMM_HAVE_CUDA_H */
