/* Simulated streams and events with real delays: FIFO order, events that complete when their stream
 * reaches them, stream_wait_event ordering two streams without blocking the host, the syncs (and
 * mem_free's implied device sync), stream teardown, and concurrent use from many threads. */
// ctest-labels: unit
// ctest-timeout: 120
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "driver.h"
#include "testutil.h"

#define MiB ((size_t)1 << 20)
#define MS 1000000ull

enum { SLOW_MS = 50 }; /* the stand-in kernel's run time: long enough to observe, short enough to wait */

static vmm_driver *open_dev(int backed)
{
    vmm_sim_options o;
    vmm_sim_default_options(&o);
    o.capacity = 256 * MiB;
    o.backed = backed;
    vmm_driver *d = NULL;
    CHECK_EQ(vmm_driver_sim_open(&o, &d), VMM_DRV_SUCCESS);
    return d;
}

static void sleep_slow(void *arg)
{
    (void)arg;
    vmm_test_sleep_ms(SLOW_MS);
}

static void set_flag(void *arg) { atomic_store((atomic_int *)arg, 1); }

static void sleep_then_set(void *arg)
{
    vmm_test_sleep_ms(SLOW_MS);
    atomic_store((atomic_int *)arg, 1);
}

typedef struct order_log {
    int seen[200];
    int n;
} order_log;

typedef struct order_arg {
    order_log *log;
    int i;
} order_arg;

static void log_order(void *arg)
{
    order_arg *a = arg;
    a->log->seen[a->log->n++] = a->i; /* only the stream's worker writes */
}

static void test_fifo(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    void *s = NULL;
    CHECK_EQ(op->stream_create(d, &s), VMM_DRV_SUCCESS);
    order_log log = {{0}, 0};
    order_arg args[200];
    CHECK_EQ(op->launch_host(d, s, sleep_slow, NULL), VMM_DRV_SUCCESS); /* items pile up behind it */
    for (int i = 0; i < 200; i++) {
        args[i] = (order_arg){&log, i};
        CHECK_EQ(op->launch_host(d, s, log_order, &args[i]), VMM_DRV_SUCCESS);
    }
    CHECK_EQ(op->stream_sync(d, s), VMM_DRV_SUCCESS);
    CHECK_EQ(log.n, 200);
    int in_order = 1;
    for (int i = 0; i < log.n; i++)
        in_order &= log.seen[i] == i;
    CHECK(in_order);
    CHECK_EQ(op->launch_host(d, s, NULL, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->stream_destroy(d, s), VMM_DRV_SUCCESS);
}

static void test_event_semantics(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    void *s = NULL;
    vmm_event e = NULL, never = NULL;
    atomic_int done = 0;
    CHECK_EQ(op->stream_create(d, &s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_create(d, &e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_create(d, &never), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_query(d, never), VMM_DRV_SUCCESS); /* never recorded: complete */
    CHECK_EQ(op->event_sync(d, never), VMM_DRV_SUCCESS);

    unsigned long long t0 = vmm_test_now_ns();
    CHECK_EQ(op->launch_host(d, s, sleep_then_set, &done), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, s), VMM_DRV_SUCCESS);
    unsigned long long t1 = vmm_test_now_ns();
    CHECK(t1 - t0 < SLOW_MS * MS / 2); /* the host was not blocked by the launch */
    CHECK_EQ(op->event_query(d, e), VMM_DRV_NOT_READY);
    CHECK_EQ(atomic_load(&done), 0);
    CHECK_EQ(op->event_sync(d, e), VMM_DRV_SUCCESS);
    unsigned long long t2 = vmm_test_now_ns();
    CHECK(t2 - t0 >= (SLOW_MS - 5) * MS);
    CHECK_EQ(atomic_load(&done), 1); /* the event completed after the work before it */
    CHECK_EQ(op->event_query(d, e), VMM_DRV_SUCCESS);

    /* polling (no sync) also sees the event complete, once the work has run */
    atomic_store(&done, 0);
    CHECK_EQ(op->launch_host(d, s, sleep_then_set, &done), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, s), VMM_DRV_SUCCESS);
    int polls = 0;
    while (op->event_query(d, e) == VMM_DRV_NOT_READY) {
        /* no check of done here: the function may have set it while its stream has not yet
         * marked the work complete (NOT_READY then is right), seen once under TSan */
        polls++;
        vmm_test_sleep_ms(1);
    }
    CHECK(polls > 0);
    CHECK_EQ(atomic_load(&done), 1);

    /* re-record: the latest record counts (on an idle stream it completes almost at once) */
    void *idle = NULL;
    CHECK_EQ(op->stream_create(d, &idle), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, s, sleep_slow, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_query(d, e), VMM_DRV_NOT_READY);
    CHECK_EQ(op->event_record(d, e, idle), VMM_DRV_SUCCESS);
    t0 = vmm_test_now_ns();
    CHECK_EQ(op->event_sync(d, e), VMM_DRV_SUCCESS);
    CHECK(vmm_test_now_ns() - t0 < SLOW_MS * MS / 2);

    /* destroying an event with a record still pending is allowed and does not wait */
    vmm_event pending = NULL;
    CHECK_EQ(op->event_create(d, &pending), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, s, sleep_slow, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, pending, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_query(d, pending), VMM_DRV_NOT_READY);
    t0 = vmm_test_now_ns();
    CHECK_EQ(op->event_destroy(d, pending), VMM_DRV_SUCCESS);
    CHECK(vmm_test_now_ns() - t0 < SLOW_MS * MS / 2);

    /* bad handles */
    CHECK_EQ(op->event_query(d, pending), VMM_DRV_INVALID_HANDLE);
    CHECK_EQ(op->event_destroy(d, pending), VMM_DRV_INVALID_HANDLE); /* twice */
    CHECK_EQ(op->event_record(d, pending, s), VMM_DRV_INVALID_HANDLE);
    CHECK_EQ(op->event_sync(d, NULL), VMM_DRV_INVALID_HANDLE);
    CHECK_EQ(op->event_record(d, e, (void *)&done), VMM_DRV_INVALID_HANDLE); /* not a stream */
    CHECK_EQ(op->stream_wait_event(d, s, pending), VMM_DRV_INVALID_HANDLE);
    CHECK_EQ(op->event_create(d, NULL), VMM_DRV_INVALID_VALUE);

    CHECK_EQ(op->device_sync(d), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_destroy(d, e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_destroy(d, never), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, s), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, idle), VMM_DRV_SUCCESS);
}

typedef struct observe {
    atomic_int *flag;
    atomic_int seen; /* flag's value when the observer ran, + 10 once it ran */
} observe;

static void observe_flag(void *arg)
{
    observe *o = arg;
    atomic_store(&o->seen, 10 + atomic_load(o->flag));
}

static void test_stream_wait_event(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    void *a = NULL, *b = NULL;
    vmm_event e = NULL;
    CHECK_EQ(op->stream_create(d, &a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_create(d, &b), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_create(d, &e), VMM_DRV_SUCCESS);

    /* without the wait, b runs ahead of a: the observer sees the flag still 0 */
    atomic_int flag = 0;
    observe o1 = {&flag, 0};
    CHECK_EQ(op->launch_host(d, a, sleep_then_set, &flag), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, b, observe_flag, &o1), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_sync(d, b), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&o1.seen), 10);
    CHECK_EQ(op->stream_sync(d, a), VMM_DRV_SUCCESS);

    /* with it, b's later work waits for a's work before the record */
    atomic_store(&flag, 0);
    observe o2 = {&flag, 0};
    unsigned long long t0 = vmm_test_now_ns();
    CHECK_EQ(op->launch_host(d, a, sleep_then_set, &flag), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_wait_event(d, b, e), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, b, observe_flag, &o2), VMM_DRV_SUCCESS);
    CHECK(vmm_test_now_ns() - t0 < SLOW_MS * MS / 2); /* the host did not wait */
    CHECK_EQ(atomic_load(&o2.seen), 0);
    CHECK_EQ(op->stream_sync(d, b), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&o2.seen), 11);
    CHECK(vmm_test_now_ns() - t0 >= (SLOW_MS - 5) * MS);

    /* the wait binds the record current at the call: recording e again later changes nothing */
    atomic_store(&flag, 0);
    observe o3 = {&flag, 0};
    CHECK_EQ(op->launch_host(d, a, sleep_then_set, &flag), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_wait_event(d, NULL, e), VMM_DRV_SUCCESS); /* the default stream */
    CHECK_EQ(op->launch_host(d, NULL, observe_flag, &o3), VMM_DRV_SUCCESS);
    CHECK_EQ(op->event_record(d, e, b), VMM_DRV_SUCCESS); /* b is idle: completes at once */
    CHECK_EQ(op->event_destroy(d, e), VMM_DRV_SUCCESS);   /* and the event goes away */
    CHECK_EQ(op->stream_sync(d, NULL), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&o3.seen), 11);

    CHECK_EQ(op->stream_destroy(d, a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, b), VMM_DRV_SUCCESS);
}

static void test_syncs(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    vmm_sim_counters c0, c1;
    CHECK_EQ(vmm_sim_driver_counters(d, &c0), VMM_DRV_SUCCESS);
    void *a = NULL, *b = NULL;
    atomic_int fa = 0, fdef = 0, fb = 0;
    CHECK_EQ(op->stream_create(d, &a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_create(d, &b), VMM_DRV_SUCCESS);

    /* stream_sync waits for its stream only */
    CHECK_EQ(op->launch_host(d, a, sleep_then_set, &fa), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, b, set_flag, &fb), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_sync(d, b), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&fb), 1);
    CHECK_EQ(atomic_load(&fa), 0);
    /* device_sync waits for every stream, the default one included */
    CHECK_EQ(op->launch_host(d, NULL, sleep_then_set, &fdef), VMM_DRV_SUCCESS);
    CHECK_EQ(op->device_sync(d), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&fa), 1);
    CHECK_EQ(atomic_load(&fdef), 1);

    /* mem_free synchronizes the device first */
    uintptr_t p = 0;
    atomic_store(&fa, 0);
    CHECK_EQ(op->mem_alloc(d, 1 * MiB, &p), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, a, sleep_then_set, &fa), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_free(d, p), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&fa), 1);

    /* mem_unmap / mem_release do not: they return while work is still running */
    uintptr_t va = 0;
    vmm_phys h = 0;
    atomic_store(&fa, 0);
    CHECK_EQ(op->va_reserve(d, 2 * MiB, 0, &va), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_create(d, 2 * MiB, &h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_map(d, va, 2 * MiB, 0, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->launch_host(d, a, sleep_then_set, &fa), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_unmap(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(op->mem_release(d, h), VMM_DRV_SUCCESS);
    CHECK_EQ(op->va_free(d, va, 2 * MiB), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&fa), 0);

    /* stream_destroy runs the queue to the end */
    atomic_store(&fb, 0);
    CHECK_EQ(op->launch_host(d, b, sleep_then_set, &fb), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, b), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&fb), 1);
    CHECK_EQ(op->stream_destroy(d, b), VMM_DRV_INVALID_HANDLE); /* twice */
    CHECK_EQ(op->stream_destroy(d, NULL), VMM_DRV_INVALID_HANDLE); /* the default stream */
    CHECK_EQ(op->stream_sync(d, b), VMM_DRV_INVALID_HANDLE);
    CHECK_EQ(op->launch_host(d, b, set_flag, &fb), VMM_DRV_INVALID_HANDLE);
    CHECK_EQ(op->stream_create(d, NULL), VMM_DRV_INVALID_VALUE);
    CHECK_EQ(op->stream_sync(d, a), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, a), VMM_DRV_SUCCESS);

    CHECK_EQ(vmm_sim_driver_counters(d, &c1), VMM_DRV_SUCCESS);
    CHECK_EQ(c1.stream_syncs - c0.stream_syncs, 2);
    CHECK_EQ(c1.device_syncs - c0.device_syncs, 2); /* device_sync + mem_free */
    CHECK_EQ(c1.live_streams, 0);
}

/* ---- many threads at once (TSan's job) ---- */

enum { THREADS = 4, ROUNDS = 200 };

typedef struct worker_arg {
    vmm_driver *d;
    void *stream; /* shared by two threads */
    atomic_int *counter;
    int errors;
} worker_arg;

static void bump(void *arg) { atomic_fetch_add((atomic_int *)arg, 1); }

static void *hammer(void *argp)
{
    worker_arg *w = argp;
    vmm_driver *d = w->d;
    const vmm_driver_ops *op = d->ops;
    uintptr_t va = 0;
    vmm_event e = NULL;
    if (op->va_reserve(d, 8 * MiB, 0, &va) || op->event_create(d, &e))
        w->errors++;
    for (int r = 0; r < ROUNDS; r++) {
        vmm_phys h = 0, got = 0;
        uintptr_t p = 0;
        if (op->mem_create(d, 2 * MiB, &h) || op->mem_map(d, va + 2 * MiB, 2 * MiB, 0, h) ||
            op->set_access(d, va + 2 * MiB, 2 * MiB))
            w->errors++;
        if (op->lookup_mapping(d, va + 2 * MiB, &got) || got != h)
            w->errors++;
        ((volatile char *)va)[2 * MiB + (size_t)r] = (char)r;
        if (op->launch_host(d, w->stream, bump, w->counter) || op->event_record(d, e, w->stream))
            w->errors++;
        int q = op->event_query(d, e);
        if (q != VMM_DRV_SUCCESS && q != VMM_DRV_NOT_READY)
            w->errors++;
        if (r % 50 == 0 && (op->mem_alloc(d, 4096, &p) || op->mem_free(d, p)))
            w->errors++;
        if (op->event_sync(d, e) || op->mem_unmap(d, va + 2 * MiB, 2 * MiB) || op->mem_release(d, h))
            w->errors++;
    }
    if (op->event_destroy(d, e) || op->va_free(d, va, 8 * MiB))
        w->errors++;
    return NULL;
}

static void test_concurrency(vmm_driver *d)
{
    const vmm_driver_ops *op = d->ops;
    void *s[2] = {NULL, NULL};
    atomic_int counter = 0;
    vmm_sim_counters c0;
    CHECK_EQ(vmm_sim_driver_counters(d, &c0), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_create(d, &s[0]), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_create(d, &s[1]), VMM_DRV_SUCCESS);
    pthread_t t[THREADS];
    worker_arg w[THREADS];
    for (int i = 0; i < THREADS; i++) {
        w[i] = (worker_arg){d, s[i % 2], &counter, 0};
        CHECK_EQ(pthread_create(&t[i], NULL, hammer, &w[i]), 0);
    }
    for (int i = 0; i < THREADS; i++) {
        pthread_join(t[i], NULL);
        CHECK_EQ(w[i].errors, 0);
    }
    CHECK_EQ(op->device_sync(d), VMM_DRV_SUCCESS);
    CHECK_EQ(atomic_load(&counter), THREADS * ROUNDS);
    CHECK_EQ(op->stream_destroy(d, s[0]), VMM_DRV_SUCCESS);
    CHECK_EQ(op->stream_destroy(d, s[1]), VMM_DRV_SUCCESS);
    vmm_sim_counters c;
    CHECK_EQ(vmm_sim_driver_counters(d, &c), VMM_DRV_SUCCESS);
    CHECK_EQ(c.calls[VMM_SIM_CALL_MEM_CREATE] - c0.calls[VMM_SIM_CALL_MEM_CREATE], THREADS * ROUNDS);
    CHECK_EQ(c.failures[VMM_SIM_CALL_MEM_CREATE] - c0.failures[VMM_SIM_CALL_MEM_CREATE], 0);
    CHECK_EQ(c.phys_bytes + c.live_handles + c.mapped_bytes + c.reserved_va_bytes, 0);
    CHECK_EQ(c.live_events + c.live_streams + c.live_classic_allocs, 0);
}

int main(void)
{
    for (int backed = 1; backed >= 0; backed--) {
        vmm_driver *d = open_dev(backed);
        test_fifo(d);
        test_event_semantics(d);
        test_stream_wait_event(d);
        test_syncs(d);
        if (backed) /* the hammer writes through its mapping */
            test_concurrency(d);
        d->ops->close(d);
    }
    TEST_DONE();
}
