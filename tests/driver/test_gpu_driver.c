// ctest-labels: gpu
// ctest-timeout: 300
// ctest-cudadouble
/*
 * The driver contract (src/driver/driver.h) checked against the cuda driver: on a real GPU, and in CI on
 * the CUDA double (tests/cudadouble, the copy of this test named test_gpu_driver_double). The same
 * rules the sim driver's tests check, so a failure here means the contract (and so the simulator)
 * says something CUDA does not. Every failing check prints the result the driver gave. Only what
 * cuda.h promises is checked: no release twice, no va_free over mappings, no map over a mapping.
 *
 * Besides the rules: the calling thread's context is left as it was (none, or another device's);
 * events are recordable on another device's streams once prepared; set_access grants enabled
 * peers (observed through the double's "a kernel on device B touches this" hook); pages carry the
 * RDMA flag and exportable handle type the device supports; error names come from the driver.
 *
 * Exits 77 (skip) only when no CUDA driver is installed or it sees no device (vmm_test_gpu_gate);
 * any other failure to open fails. On a device without VMM support only the classic (cuMemAlloc)
 * checks run, and it exits 77 after them when they pass, since the VMM contract could not be
 * checked there.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

enum {
    SKIP = 77,
    HOST_DELAY_MS = 200, /* how long a host function holds its stream: far above launch latency */
    THREADS = 4,
    THREAD_ROUNDS = 20,
};

static vmm_driver *drv;
static const vmm_driver_ops *ops;
static size_t gran;

/* A result must equal the contract's; prints both names when not. */
#define CHECK_RES(expr, want)                                                              \
    do {                                                                                   \
        int got_ = (expr);                                                                 \
        if (got_ != (want)) {                                                              \
            fprintf(stderr, "%s:%d: %s gave %s (%d), contract says %s\n", __FILE__, __LINE__, \
                    #expr, vmm_drv_result_name(got_), got_, vmm_drv_result_name(want));    \
            vmm_test_failures++;                                                           \
        }                                                                                  \
    } while (0)

/* Queue a fill of n bytes at va with the word `value` on stream s. */
static void fill(uintptr_t va, size_t n, uint32_t value, void *s)
{
    CHECK_RES(ops->memset32(drv, va, value, n / 4, s), VMM_DRV_SUCCESS);
}

/* Read n bytes at va (stream s, then synchronized) and count words different from value. */
static size_t count_mismatches(uintptr_t va, size_t n, uint32_t value, void *s)
{
    uint32_t *buf = malloc(n);
    if (!buf)
        return n;
    memset(buf, 0, n);
    CHECK_RES(ops->memcpy_dtoh(drv, buf, va, n, s), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_sync(drv, s), VMM_DRV_SUCCESS);
    size_t bad = 0;
    for (size_t i = 0; i < n / 4; i++)
        bad += buf[i] != value;
    free(buf);
    return bad;
}

/* ---- device facts ------------------------------------------------------------------------------ */

static void test_device_info(const vmm_device_info *info)
{
    CHECK(info->total_bytes > 0);
    CHECK(info->name[0] != '\0');
    CHECK(info->granularity > 0 && (info->granularity & (info->granularity - 1)) == 0);
    CHECK(info->recommended_granularity >= info->granularity);
    CHECK_EQ(info->recommended_granularity % info->granularity, 0);
    size_t free_b = 0, total_b = 0;
    CHECK_RES(ops->mem_get_info(drv, &free_b, &total_b), VMM_DRV_SUCCESS);
    CHECK(total_b > 0 && free_b <= total_b);
    CHECK(total_b <= info->total_bytes);
}

/* ---- classic alloc/free -------------------------------------------------------------------------- */

static void test_classic(void)
{
    uintptr_t p = 0;
    const size_t n = 1 << 20;
    CHECK_RES(ops->mem_alloc(drv, n, &p), VMM_DRV_SUCCESS);
    CHECK(p != 0);
    CHECK_EQ(p % 256, 0);
    fill(p, n, 0x5eed5eedu, NULL);
    CHECK_EQ(count_mismatches(p, n, 0x5eed5eedu, NULL), 0);
    CHECK_RES(ops->mem_free(drv, p), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_free(drv, p), VMM_DRV_INVALID_VALUE); /* no longer known */
}

/* ---- VMM rules ------------------------------------------------------------------------------------ */

static void test_vmm_rules(void)
{
    const size_t g = gran;
    uintptr_t va = 0;
    CHECK_RES(ops->va_reserve(drv, 8 * g, 0, &va), VMM_DRV_SUCCESS);
    CHECK(va != 0);
    CHECK_EQ(va % g, 0);

    /* Sizes of physical memory must be granularity multiples. */
    vmm_phys bad = 0;
    CHECK_RES(ops->mem_create(drv, g + g / 2, &bad), VMM_DRV_INVALID_VALUE);
    CHECK_RES(ops->mem_create(drv, 0, &bad), VMM_DRV_INVALID_VALUE);

    vmm_phys h1 = 0, h2 = 0, big = 0;
    CHECK_RES(ops->mem_create(drv, g, &h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_create(drv, g, &h2), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_create(drv, 2 * g, &big), VMM_DRV_SUCCESS);
    CHECK(h1 != 0 && h2 != 0 && h1 != h2);

    /* One handle at two addresses: both mappings show the same memory. */
    CHECK_RES(ops->mem_map(drv, va, g, 0, h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_map(drv, va + g, g, 0, h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->set_access(drv, va, 2 * g), VMM_DRV_SUCCESS); /* one call over both */
    fill(va, g, 0xa1a1a1a1u, NULL);
    CHECK_EQ(count_mismatches(va + g, g, 0xa1a1a1a1u, NULL), 0);
    fill(va + g, g, 0xb2b2b2b2u, NULL);
    CHECK_EQ(count_mismatches(va, g, 0xb2b2b2b2u, NULL), 0);

    /* The driver knows which handle backs each page. */
    vmm_phys seen = 0;
    CHECK_RES(ops->lookup_mapping(drv, va, &seen), VMM_DRV_SUCCESS);
    CHECK(seen == h1);
    CHECK_RES(ops->lookup_mapping(drv, va + g + 4096, &seen), VMM_DRV_SUCCESS);
    CHECK(seen == h1);
    CHECK_RES(ops->lookup_mapping(drv, va + 2 * g, &seen), VMM_DRV_INVALID_VALUE);
    CHECK(seen == 0);

    /* Misuse of map that cuda.h gives an error for: misaligned address, size other than the
     * handle's, nonzero offset ("currently must be zero"). Mapping over a mapped range is not
     * checked: cuda.h forbids it without promising an error. */
    CHECK_RES(ops->mem_map(drv, va + 2 * g + 4096, g, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_RES(ops->mem_map(drv, va + 2 * g, 2 * g, 0, h2), VMM_DRV_INVALID_VALUE);
    CHECK_RES(ops->mem_map(drv, va + 2 * g, g, g, big), VMM_DRV_INVALID_VALUE);

    /* Misuse of unmap: nothing mapped there; part of a mapping. */
    CHECK_RES(ops->mem_unmap(drv, va + 2 * g, g), VMM_DRV_INVALID_VALUE);
    CHECK_RES(ops->mem_map(drv, va + 4 * g, 2 * g, 0, big), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_unmap(drv, va + 4 * g, g), VMM_DRV_INVALID_VALUE);

    /* Unmap and map again elsewhere: the contents move with the handle. */
    CHECK_RES(ops->mem_unmap(drv, va, g), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_unmap(drv, va + g, g), VMM_DRV_SUCCESS);
    CHECK_RES(ops->lookup_mapping(drv, va, &seen), VMM_DRV_INVALID_VALUE);
    CHECK_RES(ops->mem_map(drv, va + 3 * g, g, 0, h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->set_access(drv, va + 3 * g, g), VMM_DRV_SUCCESS);
    CHECK_EQ(count_mismatches(va + 3 * g, g, 0xb2b2b2b2u, NULL), 0);

    /* Released while mapped: the memory stays until it is unmapped. */
    CHECK_RES(ops->mem_map(drv, va + 2 * g, g, 0, h2), VMM_DRV_SUCCESS);
    CHECK_RES(ops->set_access(drv, va + 2 * g, g), VMM_DRV_SUCCESS);
    fill(va + 2 * g, g, 0xc3c3c3c3u, NULL);
    CHECK_RES(ops->mem_release(drv, h2), VMM_DRV_SUCCESS);
    CHECK_EQ(count_mismatches(va + 2 * g, g, 0xc3c3c3c3u, NULL), 0);
    CHECK_RES(ops->mem_unmap(drv, va + 2 * g, g), VMM_DRV_SUCCESS);

    /* Tear down (a second release would be undefined behaviour: not tried). */
    CHECK_RES(ops->mem_unmap(drv, va + 3 * g, g), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_unmap(drv, va + 4 * g, 2 * g), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_release(drv, h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_release(drv, big), VMM_DRV_SUCCESS);
    CHECK_RES(ops->va_free(drv, va, 8 * g), VMM_DRV_SUCCESS);
}

static void test_out_of_memory(const vmm_device_info *info)
{
    /* More than the whole device, rounded to the granularity. */
    size_t too_much = (info->total_bytes / gran + 1) * gran;
    vmm_phys h = 0;
    CHECK_RES(ops->mem_create(drv, too_much, &h), VMM_DRV_OUT_OF_MEMORY);
    uintptr_t p = 0;
    CHECK_RES(ops->mem_alloc(drv, too_much, &p), VMM_DRV_OUT_OF_MEMORY);
}

/* ---- streams and events ------------------------------------------------------------------------- */

typedef struct order_log {
    atomic_int next;
    int seen[8];
} order_log;

typedef struct order_step {
    order_log *log;
    int id;
    unsigned delay_ms;
} order_step;

static void log_step(void *arg)
{
    order_step *s = arg;
    if (s->delay_ms)
        vmm_test_sleep_ms(s->delay_ms);
    int i = atomic_fetch_add(&s->log->next, 1);
    if (i < 8)
        s->log->seen[i] = s->id;
}

typedef struct flag_step {
    atomic_int *flag;
    atomic_int *observed; /* when non-NULL: record *flag instead of setting it */
    unsigned delay_ms;
} flag_step;

static void flag_run(void *arg)
{
    flag_step *s = arg;
    if (s->delay_ms)
        vmm_test_sleep_ms(s->delay_ms);
    if (s->observed)
        atomic_store(s->observed, atomic_load(s->flag));
    else
        atomic_store(s->flag, 1);
}

static void test_streams(void)
{
    void *s1 = NULL, *s2 = NULL;
    vmm_event e = NULL;
    CHECK_RES(ops->stream_create(drv, &s1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_create(drv, &s2), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_create(drv, &e), VMM_DRV_SUCCESS);

    /* An event never recorded counts as complete. */
    CHECK_RES(ops->event_query(drv, e), VMM_DRV_SUCCESS);

    /* FIFO order on one stream, even when the first step is slow. */
    order_log log = {.next = 0};
    order_step steps[3] = {{&log, 1, HOST_DELAY_MS / 4}, {&log, 2, 0}, {&log, 3, 0}};
    for (int i = 0; i < 3; i++)
        CHECK_RES(ops->launch_host(drv, s1, log_step, &steps[i]), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_sync(drv, s1), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&log.next), 3);
    CHECK(log.seen[0] == 1 && log.seen[1] == 2 && log.seen[2] == 3);

    /* An event is NOT_READY until its stream reaches it. */
    atomic_int done = 0;
    flag_step slow = {&done, NULL, HOST_DELAY_MS};
    CHECK_RES(ops->launch_host(drv, s1, flag_run, &slow), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_record(drv, e, s1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_query(drv, e), VMM_DRV_NOT_READY);
    CHECK_RES(ops->event_sync(drv, e), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&done), 1);
    CHECK_RES(ops->event_query(drv, e), VMM_DRV_SUCCESS);

    /* stream_wait_event: work on s2 waits for s1's slow step without blocking the host. */
    atomic_int flag = 0, observed = -1;
    flag_step setter = {&flag, NULL, HOST_DELAY_MS};
    flag_step watcher = {&flag, &observed, 0};
    unsigned long long t0 = vmm_test_now_ns();
    CHECK_RES(ops->launch_host(drv, s1, flag_run, &setter), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_record(drv, e, s1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_wait_event(drv, s2, e), VMM_DRV_SUCCESS);
    CHECK_RES(ops->launch_host(drv, s2, flag_run, &watcher), VMM_DRV_SUCCESS);
    unsigned long long queued_ns = vmm_test_now_ns() - t0;
    CHECK(queued_ns < (unsigned long long)HOST_DELAY_MS * 1000000ull / 2); /* host not blocked */
    CHECK_RES(ops->stream_sync(drv, s2), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&observed), 1);

    /* The same across a real device operation: a fill queued behind a slow step on s1 is seen by
     * a copy on s2 that waits for s1's event. */
    const size_t n = 1 << 20;
    uintptr_t p = 0;
    CHECK_RES(ops->mem_alloc(drv, n, &p), VMM_DRV_SUCCESS);
    fill(p, n, 0x11111111u, s1);
    CHECK_RES(ops->stream_sync(drv, s1), VMM_DRV_SUCCESS);
    atomic_int unused = 0;
    flag_step hold = {&unused, NULL, HOST_DELAY_MS};
    CHECK_RES(ops->launch_host(drv, s1, flag_run, &hold), VMM_DRV_SUCCESS);
    fill(p, n, 0x22222222u, s1);
    CHECK_RES(ops->event_record(drv, e, s1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_wait_event(drv, s2, e), VMM_DRV_SUCCESS);
    CHECK_EQ(count_mismatches(p, n, 0x22222222u, s2), 0);
    CHECK_RES(ops->mem_free(drv, p), VMM_DRV_SUCCESS);

    /* device_sync waits for every stream. */
    atomic_int dev_done = 0;
    flag_step last = {&dev_done, NULL, HOST_DELAY_MS / 2};
    CHECK_RES(ops->launch_host(drv, s2, flag_run, &last), VMM_DRV_SUCCESS);
    CHECK_RES(ops->device_sync(drv), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&dev_done), 1);

    CHECK_RES(ops->event_destroy(drv, e), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_destroy(drv, s1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_destroy(drv, s2), VMM_DRV_SUCCESS);
}

/* ---- threads: every op from fresh threads (the driver makes its context current on each) ---------- */

typedef struct worker {
    uintptr_t va; /* this thread's own g-sized slot */
    uint32_t value;
    int failures;
} worker;

static void *worker_run(void *arg)
{
    worker *w = arg;
    uint32_t *buf = malloc(gran);
    if (!buf) {
        w->failures++;
        return NULL;
    }
    for (int round = 0; round < THREAD_ROUNDS; round++) {
        vmm_phys h = 0;
        void *s = NULL;
        int ok = ops->mem_create(drv, gran, &h) == VMM_DRV_SUCCESS;
        ok = ok && ops->stream_create(drv, &s) == VMM_DRV_SUCCESS;
        ok = ok && ops->mem_map(drv, w->va, gran, 0, h) == VMM_DRV_SUCCESS;
        ok = ok && ops->set_access(drv, w->va, gran) == VMM_DRV_SUCCESS;
        ok = ok && ops->memset32(drv, w->va, w->value + (uint32_t)round, gran / 4, s) == VMM_DRV_SUCCESS;
        ok = ok && ops->memcpy_dtoh(drv, buf, w->va, gran, s) == VMM_DRV_SUCCESS;
        ok = ok && ops->stream_sync(drv, s) == VMM_DRV_SUCCESS;
        for (size_t i = 0; ok && i < gran / 4; i++)
            ok = buf[i] == w->value + (uint32_t)round;
        ok = ok && ops->mem_unmap(drv, w->va, gran) == VMM_DRV_SUCCESS;
        ok = ok && ops->mem_release(drv, h) == VMM_DRV_SUCCESS;
        ok = ok && ops->stream_destroy(drv, s) == VMM_DRV_SUCCESS;
        if (!ok) {
            w->failures++;
            break;
        }
    }
    free(buf);
    return NULL;
}

static void test_threads(void)
{
    uintptr_t va = 0;
    CHECK_RES(ops->va_reserve(drv, THREADS * gran, 0, &va), VMM_DRV_SUCCESS);
    pthread_t t[THREADS];
    worker w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker){va + (uintptr_t)i * gran, 0x01000000u * (uint32_t)(i + 1), 0};
        CHECK_EQ(pthread_create(&t[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].failures, 0);
    }
    CHECK_RES(ops->va_free(drv, va, THREADS * gran), VMM_DRV_SUCCESS);
}

/* ---- what a real GPU needs beyond the rules --------------------------------------------------- */

/* Entry points the test calls itself, to observe the driver as the CUDA runtime would. */
static struct {
    CUresult (*ctx_get_current)(CUcontext *);
    CUresult (*ctx_set_current)(CUcontext);
    CUresult (*primary_retain)(CUcontext *, CUdevice);
    CUresult (*primary_release)(CUdevice);
    CUresult (*event_create)(CUevent *, unsigned);
    CUresult (*event_record)(CUevent, CUstream);
    CUresult (*event_destroy)(CUevent);
    CUresult (*props_from_handle)(CUmemAllocationProp *, CUmemGenericAllocationHandle);
    CUresult (*can_access_peer)(int *, CUdevice, CUdevice);
} raw;

static int raw_load(void)
{
#define RAW_(member, name)                                                                 \
    do {                                                                                   \
        void *p_ = vmm_test_cu_proc(name);                                                 \
        if (!p_) {                                                                         \
            fprintf(stderr, "cannot resolve %s\n", name);                                 \
            return 0;                                                                      \
        }                                                                                  \
        memcpy(&raw.member, &p_, sizeof p_);                                               \
    } while (0)
    RAW_(ctx_get_current, "cuCtxGetCurrent");
    RAW_(ctx_set_current, "cuCtxSetCurrent");
    RAW_(primary_retain, "cuDevicePrimaryCtxRetain");
    RAW_(primary_release, "cuDevicePrimaryCtxRelease");
    RAW_(event_create, "cuEventCreate");
    RAW_(event_record, "cuEventRecord");
    RAW_(event_destroy, "cuEventDestroy");
    RAW_(props_from_handle, "cuMemGetAllocationPropertiesFromHandle");
    RAW_(can_access_peer, "cuDeviceCanAccessPeer");
#undef RAW_
    return 1;
}

static CUcontext current_ctx(void)
{
    CUcontext c = NULL;
    if (raw.ctx_get_current(&c) != CUDA_SUCCESS)
        return (CUcontext)(uintptr_t)1; /* never a context: makes the comparison fail */
    return c;
}

/* A few ops of every kind, each followed by a look at the thread's context. */
static void ops_keep_context(CUcontext want, const char *who)
{
    size_t f = 0, t = 0;
    void *s = NULL;
    vmm_event e = NULL;
    uintptr_t p = 0;
#define KEEP_(call)                                                                        \
    do {                                                                                   \
        CHECK_RES(call, VMM_DRV_SUCCESS);                                                  \
        if (current_ctx() != want) {                                               \
            fprintf(stderr, "%s: after %s the thread holds context %p, had %p\n", who, #call, \
                    (void *)current_ctx(), (void *)want);                                  \
            vmm_test_failures++;                                                           \
        }                                                                                  \
    } while (0)
    KEEP_(ops->mem_get_info(drv, &f, &t));
    KEEP_(ops->stream_create(drv, &s));
    KEEP_(ops->event_create(drv, &e));
    KEEP_(ops->event_record(drv, e, s));
    KEEP_(ops->event_sync(drv, e));
    KEEP_(ops->mem_alloc(drv, 4096, &p));
    KEEP_(ops->mem_free(drv, p));
    KEEP_(ops->event_destroy(drv, e));
    KEEP_(ops->stream_destroy(drv, s));
    if (gran) {
        uintptr_t va = 0;
        vmm_phys h = 0;
        KEEP_(ops->va_reserve(drv, gran, 0, &va));
        KEEP_(ops->mem_create(drv, gran, &h));
        KEEP_(ops->mem_map(drv, va, gran, 0, h));
        KEEP_(ops->set_access(drv, va, gran));
        KEEP_(ops->mem_unmap(drv, va, gran));
        KEEP_(ops->mem_release(drv, h));
        KEEP_(ops->va_free(drv, va, gran));
    }
#undef KEEP_
}

static void *context_thread(void *arg)
{
    int other = *(int *)arg;
    /* A fresh thread has no context: it must still have none after our calls, or the runtime
     * would take our device as this thread's current device. */
    CHECK(current_ctx() == NULL);
    ops_keep_context(NULL, "thread without a context");
    if (other >= 0) {
        /* A thread working on another device keeps that device's context. */
        CUcontext c1 = NULL;
        CHECK_EQ(raw.primary_retain(&c1, (CUdevice)other), CUDA_SUCCESS);
        CHECK_EQ(raw.ctx_set_current(c1), CUDA_SUCCESS);
        ops_keep_context(c1, "thread on another device");
        CHECK_EQ(raw.ctx_set_current(NULL), CUDA_SUCCESS);
        CHECK_EQ(raw.primary_release((CUdevice)other), CUDA_SUCCESS);
    }
    return NULL;
}

static void test_context_hygiene(const vmm_device_info *info)
{
    int other = info->device_count > 1 ? (info->ordinal == 0 ? 1 : 0) : -1;
    pthread_t t;
    CHECK_EQ(pthread_create(&t, NULL, context_thread, &other), 0);
    pthread_join(t, NULL);
}

typedef struct hold_arg {
    unsigned ms;
} hold_arg;

static void hold_run(void *arg) { vmm_test_sleep_ms(((hold_arg *)arg)->ms); }

/* An event of device 0's driver recorded on a stream of device 1: CUDA refuses a raw event of
 * another context, the driver's prepared events work, and order is kept. */
static void test_cross_device_events(const vmm_device_info *info)
{
    if (info->device_count < 2) {
        printf("one device: cross-device events not checked\n");
        return;
    }
    int other = info->ordinal == 0 ? 1 : 0;
    char msg[256];
    vmm_driver *d1 = NULL;
    CHECK_RES(vmm_driver_cuda_open(other, &d1, msg, sizeof msg), VMM_DRV_SUCCESS);
    if (!d1)
        return;
    void *s1 = NULL;
    CHECK_RES(d1->ops->stream_create(d1, &s1), VMM_DRV_SUCCESS);

    /* The reason for event_prepare: a raw event of our context on the other device's stream. */
    CUcontext c0 = NULL, prev = NULL;
    CHECK_EQ(raw.ctx_get_current(&prev), CUDA_SUCCESS);
    CHECK_EQ(raw.primary_retain(&c0, (CUdevice)info->ordinal), CUDA_SUCCESS);
    CHECK_EQ(raw.ctx_set_current(c0), CUDA_SUCCESS);
    CUevent rawev = NULL;
    CHECK_EQ(raw.event_create(&rawev, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CHECK_EQ(raw.event_record(rawev, (CUstream)s1), CUDA_ERROR_INVALID_HANDLE);
    CHECK_EQ(raw.event_destroy(rawev), CUDA_SUCCESS);
    CHECK_EQ(raw.ctx_set_current(prev), CUDA_SUCCESS);
    CHECK_EQ(raw.primary_release((CUdevice)info->ordinal), CUDA_SUCCESS);

    vmm_event e = NULL;
    CHECK_RES(ops->event_create(drv, &e), VMM_DRV_SUCCESS);
    CHECK(ops->event_prepare != NULL);
    if (ops->event_prepare)
        CHECK_RES(ops->event_prepare(drv, e, s1), VMM_DRV_SUCCESS);
    hold_arg hold = {HOST_DELAY_MS};
    CHECK_RES(d1->ops->launch_host(d1, s1, hold_run, &hold), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_record(drv, e, s1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_query(drv, e), VMM_DRV_NOT_READY);
    /* A stream of our own device may wait on it (cross-device waits are allowed). */
    void *s0 = NULL;
    CHECK_RES(ops->stream_create(drv, &s0), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_wait_event(drv, s0, e), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_sync(drv, s0), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_query(drv, e), VMM_DRV_SUCCESS);
    /* The same event goes back to its own device's streams. */
    CHECK_RES(ops->event_record(drv, e, s0), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_sync(drv, e), VMM_DRV_SUCCESS);
    CHECK_RES(ops->event_destroy(drv, e), VMM_DRV_SUCCESS);
    CHECK_RES(ops->stream_destroy(drv, s0), VMM_DRV_SUCCESS);
    CHECK_RES(d1->ops->stream_destroy(d1, s1), VMM_DRV_SUCCESS);
    d1->ops->close(d1);
}

/* set_access grants enabled peers; without peer_enable the peer cannot touch the memory. */
static void test_peers(const vmm_device_info *info)
{
    if (info->device_count < 2) {
        printf("one device: peer access not checked\n");
        return;
    }
    int other = info->ordinal == 0 ? 1 : 0;
    const cudadouble_hooks_t *hooks = cudadouble_hooks();
    int can = 0;
    CHECK_EQ(raw.can_access_peer(&can, (CUdevice)other, (CUdevice)info->ordinal), CUDA_SUCCESS);
    CHECK(ops->peer_enable != NULL);
    if (!ops->peer_enable)
        return;
    CHECK_RES(ops->peer_enable(drv, info->ordinal), VMM_DRV_SUCCESS); /* own device: no-op */
    CHECK_RES(ops->peer_enable(drv, info->device_count), VMM_DRV_INVALID_DEVICE);

    uintptr_t va = 0;
    vmm_phys h1 = 0, h2 = 0;
    uint32_t word = 0;
    CHECK_RES(ops->va_reserve(drv, 2 * gran, 0, &va), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_create(drv, gran, &h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_create(drv, gran, &h2), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_map(drv, va, gran, 0, h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->set_access(drv, va, gran), VMM_DRV_SUCCESS); /* no peer yet */
    if (hooks) {
        CHECK_EQ(hooks->device_access(info->ordinal, va, sizeof word, &word, 0), CUDA_SUCCESS);
        CHECK_EQ(hooks->device_access(other, va, sizeof word, &word, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
    }
    if (!can) {
        CHECK_RES(ops->peer_enable(drv, other), VMM_DRV_NOT_SUPPORTED);
    } else {
        CHECK_RES(ops->peer_enable(drv, other), VMM_DRV_SUCCESS);
        CHECK_RES(ops->mem_map(drv, va + gran, gran, 0, h2), VMM_DRV_SUCCESS);
        CHECK_RES(ops->set_access(drv, va + gran, gran), VMM_DRV_SUCCESS);
        if (hooks) {
            CHECK_EQ(hooks->device_access(other, va + gran, sizeof word, &word, 1), CUDA_SUCCESS);
            /* mapped before the peer was enabled: needs set_access again (the allocator does it) */
            CHECK_EQ(hooks->device_access(other, va, sizeof word, &word, 0), CUDA_ERROR_ILLEGAL_ADDRESS);
            CHECK_RES(ops->set_access(drv, va, 2 * gran), VMM_DRV_SUCCESS);
            CHECK_EQ(hooks->device_access(other, va, sizeof word, &word, 0), CUDA_SUCCESS);
        } else {
            printf("real GPU: peer reach is not observable without a kernel; set_access results checked\n");
        }
        CHECK_RES(ops->mem_unmap(drv, va + gran, gran), VMM_DRV_SUCCESS);
    }
    CHECK_RES(ops->mem_unmap(drv, va, gran), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_release(drv, h1), VMM_DRV_SUCCESS);
    CHECK_RES(ops->mem_release(drv, h2), VMM_DRV_SUCCESS);
    CHECK_RES(ops->va_free(drv, va, 2 * gran), VMM_DRV_SUCCESS);
}

/* Pages are made RDMA-capable and exportable when the device can (NCCL registration, IPC). */
static void test_page_properties(const vmm_device_info *info)
{
    vmm_phys h = 0;
    CHECK_RES(ops->mem_create(drv, gran, &h), VMM_DRV_SUCCESS);
    vmm_device_info now;
    CHECK_RES(ops->device_info(drv, &now), VMM_DRV_SUCCESS);
    CUmemAllocationProp prop;
    memset(&prop, 0, sizeof prop);
    CHECK_EQ(raw.props_from_handle(&prop, (CUmemGenericAllocationHandle)h), CUDA_SUCCESS);
    CHECK_EQ(prop.type, CU_MEM_ALLOCATION_TYPE_PINNED);
    CHECK_EQ(prop.location.type, CU_MEM_LOCATION_TYPE_DEVICE);
    CHECK_EQ(prop.location.id, info->ordinal);
    CHECK_EQ(prop.allocFlags.gpuDirectRDMACapable != 0, info->gdr_supported != 0);
    CHECK_EQ((prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) != 0,
             now.posix_fd_handles != 0);
    printf("pages: gpuDirectRDMACapable %d, POSIX fd handles %d\n", prop.allocFlags.gpuDirectRDMACapable,
           now.posix_fd_handles);
    if (cudadouble_hooks()) {
        /* the double's defaults look like a data-center GPU: both on */
        CHECK(info->gdr_supported);
        CHECK(now.posix_fd_handles);
    }
    CHECK_RES(ops->mem_release(drv, h), VMM_DRV_SUCCESS);
}

static void test_error_names(void)
{
    /* Outside the contract's table: named by the driver's cuGetErrorName. */
    CHECK(strcmp(vmm_drv_result_name(CUDA_ERROR_ILLEGAL_ADDRESS), "CUDA_ERROR_ILLEGAL_ADDRESS") == 0);
    CHECK(strcmp(vmm_drv_result_name(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED),
                 "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED") == 0);
}

int main(void)
{
    char msg[512];
    int r = vmm_driver_cuda_open(0, &drv, msg, sizeof msg);
    int gate = vmm_test_gpu_gate(r, msg);
    if (gate)
        return gate;
    if (!raw_load())
        return 1;
    ops = drv->ops;
    CHECK(strcmp(ops->name, "cuda") == 0);
    CHECK_EQ(drv->is_sim, 0);
    vmm_device_info info;
    CHECK_RES(ops->device_info(drv, &info), VMM_DRV_SUCCESS);
    gran = info.vmm_supported ? info.granularity : 0;
    printf("device %d of %d: %s, %zu MiB, granularity %zu KiB (recommended %zu KiB), VMM %s, "
           "RDMA %d\n", info.ordinal, info.device_count, info.name, info.total_bytes >> 20,
           info.granularity >> 10, info.recommended_granularity >> 10,
           info.vmm_supported ? "supported" : "not supported", info.gdr_supported);
    CHECK(info.device_count >= 1);

    test_device_info(&info);
    test_error_names();
    test_classic();
    test_streams();
    test_context_hygiene(&info);
    test_cross_device_events(&info);
    if (info.vmm_supported) {
        gran = info.granularity;
        test_vmm_rules();
        test_out_of_memory(&info);
        test_threads();
        test_peers(&info);
        test_page_properties(&info);
    } else {
        /* The VMM ops must refuse cleanly rather than reach the driver. */
        uintptr_t va = 0;
        vmm_phys h = 0;
        CHECK_RES(ops->va_reserve(drv, 2 << 20, 0, &va), VMM_DRV_NOT_SUPPORTED);
        CHECK_RES(ops->mem_create(drv, 2 << 20, &h), VMM_DRV_NOT_SUPPORTED);
    }

    /* A second driver on the same device works alongside the first (one primary context). */
    vmm_driver *second = NULL;
    CHECK_RES(vmm_driver_cuda_open(info.ordinal, &second, msg, sizeof msg), VMM_DRV_SUCCESS);
    if (second) {
        uintptr_t p = 0;
        CHECK_RES(second->ops->mem_alloc(second, 4096, &p), VMM_DRV_SUCCESS);
        CHECK_RES(second->ops->mem_free(second, p), VMM_DRV_SUCCESS);
        second->ops->close(second);
    }
    ops->close(drv);

    const cudadouble_hooks_t *hooks = cudadouble_hooks();
    if (hooks) {
        /* everything given back: no handle, mapping, reservation, stream, event or context left */
        vmm_sim_counters live;
        unsigned ctxs = 0;
        hooks->live(&live, &ctxs);
        CHECK_EQ(live.live_handles, 0);
        CHECK_EQ(live.mapped_bytes, 0);
        CHECK_EQ(live.reserved_va_bytes, 0);
        CHECK_EQ(live.live_classic_allocs, 0);
        CHECK_EQ(live.live_streams, 0);
        CHECK_EQ(live.live_events, 0);
        CHECK_EQ(ctxs, 0);
    }
    if (!info.vmm_supported && vmm_test_failures == 0) {
        printf("classic checks passed; VMM contract not checked: the device has no VMM support\n");
        return SKIP;
    }
    TEST_DONE();
}

#endif /* VMM_HAVE_CUDA_H */
