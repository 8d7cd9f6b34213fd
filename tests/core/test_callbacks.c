// ctest-labels: unit
// ctest-timeout: 120
/* Free-memory and mapping callbacks (src/core/callbacks.c) on the simulated device:
 *  - a free-memory callback runs on a cache miss with the allocator's lock released (it frees a
 *    block it holds, which needs the lock), and the request is then served from the cache without
 *    growing; runs and hits are counted; nested misses inside a callback do not run them again;
 *    removal;
 *  - mapping callbacks keep their own map of pages (with their own mutex): it equals the
 *    allocator's view (vmm_get_mappings, checked by vmm_check against the driver) after every step
 *    (growth, frees, empty_cache, recycling of idle pages for another stream when memory is short,
 *    sleep and wake); before_unmap runs while the pages are still mapped (the callback reads them),
 *    after_map once access is granted; a thread holding the callback's mutex while it calls the
 *    allocator does not deadlock against a callback; late registration replays what is mapped;
 *    destroy reports everything unmapped. */
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

/* ---- free-memory callbacks -------------------------------------------------------------------- */

typedef struct holder {
    vmm_allocator *a;
    void *held;
    int calls;
    int nested;
} holder;

static int give_back(void *ctx)
{
    holder *h = ctx;
    h->calls++;
    if (h->nested) { /* a miss inside a callback runs no callbacks again */
        void *p = NULL;
        CHECK_OK(vmm_malloc(h->a, 64 * MiB, NULL, &p));
        CHECK_OK(vmm_free(h->a, p));
    }
    if (!h->held)
        return 0;
    CHECK_OK(vmm_free(h->a, h->held)); /* takes the allocator's lock: we must not hold it */
    h->held = NULL;
    return 1;
}

static void free_memory_callbacks(void)
{
    printf("free-memory callbacks\n");
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:256M", &a));
    if (!a)
        return;
    holder h = {a, NULL, 0, 0};
    CHECK_OK(vmm_malloc(a, 8 * MiB, NULL, &h.held));
    void *first = h.held;
    CHECK_EQ(vmm_add_free_memory_callback(NULL, give_back, &h), VMM_EINVAL);
    CHECK_OK(vmm_add_free_memory_callback(a, give_back, &h));
    int64_t creates = vmm_test_stats(a).num_device_alloc;
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, 8 * MiB, NULL, &p)); /* miss: the callback frees `first` */
    CHECK_EQ(h.calls, 1);
    CHECK(p == first);
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.num_device_alloc, creates);
    CHECK_EQ(st.num_free_memory_callbacks, 1);
    CHECK_EQ(st.num_free_memory_callback_hits, 1);
    /* nothing to give: counted as a run, not a hit; growth goes on */
    h.nested = 1;
    void *q = NULL;
    CHECK_OK(vmm_malloc(a, 16 * MiB, NULL, &q));
    CHECK_EQ(h.calls, 2);
    st = vmm_test_stats(a);
    CHECK_EQ(st.num_free_memory_callbacks, 2);
    CHECK_EQ(st.num_free_memory_callback_hits, 1);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_remove_free_memory_callback(a, give_back, &h));
    CHECK_EQ(vmm_remove_free_memory_callback(a, give_back, &h), VMM_EINVAL);
    void *r = NULL;
    CHECK_OK(vmm_malloc(a, 32 * MiB, NULL, &r));
    CHECK_EQ(h.calls, 2);
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(a, q));
    CHECK_OK(vmm_free(a, r));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

/* ---- mapping callbacks ------------------------------------------------------------------------ */

enum { MAXPAGES = 4096 };

typedef struct pagemap {
    vmm_allocator *a;  /* vmm_check from inside the callbacks: the transient states too */
    long checks;
    pthread_mutex_t mu;
    size_t n;
    uintptr_t va[MAXPAGES];
    uint64_t h[MAXPAGES];
    int errors;
    long maps, unmaps;
} pagemap;

static long find(const pagemap *m, uintptr_t va)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->va[i] == va)
            return (long)i;
    return -1;
}

/* A callback may call the allocator: check it is consistent whatever the call in progress is (a
 * sleep with its segments frozen, pages detached and waiting for their unmap). */
static void check_inside(pagemap *m)
{
    if (m->a) {
        CHECK_OK(vmm_check(m->a));
        m->checks++;
    }
}

static void after_map(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *handles, size_t n)
{
    pagemap *m = ctx;
    check_inside(m);
    pthread_mutex_lock(&m->mu);
    m->maps++;
    size_t ps = size / n;
    for (size_t i = 0; i < n; i++) {
        if (find(m, va + i * ps) >= 0 || m->n == MAXPAGES || !handles[i] || device != 0) {
            m->errors++;
            continue;
        }
        m->va[m->n] = va + i * ps;
        m->h[m->n++] = handles[i];
        ((volatile char *)(va + i * ps))[0] = 1; /* access is granted already: no fault */
    }
    pthread_mutex_unlock(&m->mu);
}

static void before_unmap(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *handles, size_t n)
{
    pagemap *m = ctx;
    check_inside(m);
    pthread_mutex_lock(&m->mu);
    m->unmaps++;
    size_t ps = size / n;
    for (size_t i = 0; i < n; i++) {
        long k = find(m, va + i * ps);
        if (k < 0 || m->h[k] != handles[i]) {
            m->errors++;
            continue;
        }
        (void)((volatile char *)(va + i * ps))[ps - 1]; /* still mapped: no fault */
        m->va[k] = m->va[m->n - 1];
        m->h[k] = m->h[m->n - 1];
        m->n--;
    }
    (void)device;
    pthread_mutex_unlock(&m->mu);
}

typedef struct viewer {
    pagemap *m;
    size_t pages;
    int mismatches;
} viewer;

static void view(void *ctx, uintptr_t va, size_t size, int device, const uint64_t *handles, size_t n)
{
    viewer *v = ctx;
    size_t ps = size / n;
    for (size_t i = 0; i < n; i++) {
        long k = find(v->m, va + i * ps);
        if (k < 0 || v->m->h[k] != handles[i])
            v->mismatches++;
        v->pages++;
    }
    (void)device;
}

/* The callbacks' map equals the allocator's view, which vmm_check compares with the driver's. */
static void same_view(vmm_allocator *a, pagemap *m, const char *when)
{
    CHECK_OK(vmm_check(a));
    pthread_mutex_lock(&m->mu);
    viewer v = {m, 0, 0};
    CHECK_OK(vmm_get_mappings(a, view, &v));
    int ok = v.mismatches == 0 && v.pages == m->n && m->errors == 0;
    if (!ok)
        fprintf(stderr, "%s: the callbacks' map has %zu pages (%d errors), the allocator %zu (%d differ)\n",
                when, m->n, m->errors, v.pages, v.mismatches);
    CHECK(ok);
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ((size_t)st.mapped_bytes[0].current, m->n * 2 * MiB);
    pthread_mutex_unlock(&m->mu);
}

typedef struct contender {
    vmm_allocator *a;
    pagemap *m;
    atomic_int holding, done;
} contender;

/* Holds the callbacks' mutex while it calls the allocator. */
static void *contend(void *arg)
{
    contender *c = arg;
    pthread_mutex_lock(&c->m->mu);
    atomic_store(&c->holding, 1);
    vmm_test_sleep_ms(50); /* the other thread is in malloc now, its after_map waits for us */
    void *p = NULL;
    CHECK_OK(vmm_malloc(c->a, 1000, NULL, &p)); /* needs the allocator: must not be held */
    vmm_stats st;
    CHECK_OK(vmm_get_stats(c->a, &st));
    pthread_mutex_unlock(&c->m->mu);
    CHECK_OK(vmm_free(c->a, p));
    atomic_store(&c->done, 1);
    return NULL;
}

static void mapping_callbacks(void)
{
    printf("mapping callbacks\n");
    vmm_allocator *a = NULL;
    /* 96 MiB: a second stream's growth has to recycle the first stream's idle pages */
    CHECK_OK(vmm_create("driver:sim,sim_capacity:96M", &a));
    if (!a)
        return;
    static pagemap m;
    pthread_mutex_init(&m.mu, NULL);
    m.a = a;
    void *early = NULL;
    CHECK_OK(vmm_malloc(a, 5 * MiB, NULL, &early)); /* mapped before the callbacks exist */
    CHECK_OK(vmm_set_mapping_callbacks(a, after_map, before_unmap, &m));
    same_view(a, &m, "late registration");
    CHECK_EQ(vmm_set_mapping_callbacks(a, after_map, before_unmap, &m), VMM_EINVAL);
    void *p[8];
    for (int i = 0; i < 8; i++)
        CHECK_OK(vmm_malloc(a, (size_t)(i + 1) * 1536 * 1024, NULL, &p[i]));
    same_view(a, &m, "growth");
    for (int i = 0; i < 8; i += 2)
        CHECK_OK(vmm_free(a, p[i]));
    same_view(a, &m, "frees");
    CHECK_OK(vmm_empty_cache(a));
    CHECK_OK(vmm_sim_synchronize(a));
    CHECK_OK(vmm_empty_cache(a));
    same_view(a, &m, "empty_cache");
    CHECK(m.unmaps > 0);
    /* another stream, memory short: its growth takes the idle pages of the default stream */
    vmm_stream s2;
    CHECK_OK(vmm_sim_stream_create(a, &s2));
    void *big = NULL;
    CHECK_OK(vmm_malloc(a, 50 * MiB, NULL, &big));
    CHECK_OK(vmm_free(a, big));
    int64_t remapped = vmm_test_stats(a).num_pages_remapped;
    void *other = NULL;
    CHECK_OK(vmm_malloc(a, 50 * MiB, s2, &other));
    CHECK(vmm_test_stats(a).num_pages_remapped > remapped);
    same_view(a, &m, "recycling for another stream");
    /* sleep and wake */
    CHECK_OK(vmm_sleep(a, NULL, 0, VMM_SLEEP_DISCARD));
    same_view(a, &m, "asleep");
    CHECK_EQ(m.n, 0);
    CHECK_OK(vmm_wake(a, NULL, 0));
    same_view(a, &m, "awake");
    CHECK_OK(vmm_free(a, other)); /* its idle pages serve the next growth (detached first) */
    /* a thread holding the callbacks' mutex calls the allocator while a callback waits for it */
    contender c = {.a = a, .m = &m};
    pthread_t th;
    pthread_create(&th, NULL, contend, &c);
    while (!atomic_load(&c.holding))
        vmm_test_sleep_ms(1);
    void *more = NULL;
    alarm(30); /* a deadlock fails the test instead of hanging it */
    CHECK_OK(vmm_malloc(a, 12 * MiB, NULL, &more));
    pthread_join(th, NULL);
    alarm(0);
    CHECK(atomic_load(&c.done));
    same_view(a, &m, "contention");
    CHECK_OK(vmm_free(a, more));
    for (int i = 1; i < 8; i += 2)
        CHECK_OK(vmm_free(a, p[i]));
    CHECK_OK(vmm_free(a, early));
    same_view(a, &m, "all freed");
    CHECK(m.maps > 0 && m.unmaps > 0);
    CHECK(m.checks > 0);
    m.a = NULL; /* no vmm_check while destroy runs */
    vmm_destroy(a);
    CHECK_EQ(m.n, 0); /* destroy announced every page still mapped */
    CHECK_EQ(m.errors, 0);
    /* removal: nothing is reported after it */
    CHECK_OK(vmm_create("driver:sim,sim_capacity:96M", &a));
    if (!a)
        return;
    CHECK_OK(vmm_set_mapping_callbacks(a, after_map, before_unmap, &m));
    CHECK_OK(vmm_set_mapping_callbacks(a, NULL, NULL, NULL));
    long maps = m.maps;
    void *x = NULL;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &x));
    CHECK_EQ(m.maps, maps);
    CHECK_OK(vmm_free(a, x));
    vmm_destroy(a);
}

int main(void)
{
    free_memory_callbacks();
    mapping_callbacks();
    vmm_test_check_no_sim_leaks();
    TEST_DONE();
}
