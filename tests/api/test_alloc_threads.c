// ctest-labels: unit
/* Multi-threaded use: threads x streams allocate, write, verify and free concurrently; blocks never
 * overlap (each thread's pattern survives), vmm_check passes, nothing leaks. */
#include <pthread.h>
#include <stdint.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

enum { THREADS = 4, ITERS = 3000, LIVE = 32 };

static vmm_allocator *A;

typedef struct targ {
    vmm_stream s;
    unsigned id;
    int errors;
} targ;

static void *worker(void *arg)
{
    targ *t = arg;
    char *p[LIVE] = {0};
    size_t n[LIVE] = {0};
    uint64_t x = 88172645463325252ull ^ t->id;
    for (int it = 0; it < ITERS; it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        int i = (int)(x % LIVE);
        if (p[i]) {
            if (p[i][0] != (char)(t->id + i) || p[i][n[i] - 1] != (char)(t->id + i))
                t->errors++;
            if (vmm_free(A, p[i]))
                t->errors++;
            p[i] = NULL;
        } else {
            n[i] = (x >> 8) % 3 == 0 ? ((x >> 16) % (8u << 20)) + 1 : ((x >> 16) % 100000) + 1;
            if (vmm_malloc(A, n[i], t->s, (void **)&p[i]) || !p[i]) {
                t->errors++;
                continue;
            }
            p[i][0] = p[i][n[i] - 1] = (char)(t->id + i);
            if (i == 0 && vmm_record_stream(A, p[i], NULL))
                t->errors++;
        }
        if (it % 500 == 0 && vmm_check(A))
            t->errors++;
        if (it % 1000 == 999 && vmm_empty_cache(A))
            t->errors++;
    }
    for (int i = 0; i < LIVE; i++)
        if (p[i] && vmm_free(A, p[i]))
            t->errors++;
    return NULL;
}

int main(void)
{
    CHECK_OK(vmm_create("driver:sim,sim_capacity:2G,sim_backed:true", &A));
    if (!A)
        TEST_DONE();
    pthread_t th[THREADS];
    targ ta[THREADS];
    for (unsigned i = 0; i < THREADS; i++) {
        ta[i].id = i * 40;
        ta[i].errors = 0;
        CHECK_OK(vmm_sim_stream_create(A, &ta[i].s));
        pthread_create(&th[i], NULL, worker, &ta[i]);
    }
    for (unsigned i = 0; i < THREADS; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ(ta[i].errors, 0);
    }
    CHECK_OK(vmm_check(A));
    vmm_stats s;
    CHECK_OK(vmm_get_stats(A, &s));
    CHECK_EQ(s.allocation[0].current, 0);
    CHECK_EQ(s.num_ooms, 0);
    vmm_destroy(A);
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes + g.live_handles + g.mapped_bytes + g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_events + g.live_streams, 0);
    TEST_DONE();
}
