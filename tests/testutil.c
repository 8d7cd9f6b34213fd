#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "vmmalloc.h"
#include "vmmalloc_sim.h"

int vmm_test_failures;

const char *vmm_test_last_error(void) { return vmm_last_error(); }

unsigned long long vmm_test_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000000000ull + (unsigned long long)ts.tv_nsec;
}

void vmm_test_sleep_ms(unsigned ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0) {
    }
}

const char *vmm_test_source_path(const char *rel)
{
    static char buf[4096];
    const char *root = getenv("VMM_SOURCE_DIR");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : ".", rel);
    return buf;
}

void vmm_test_fill(void *p, size_t n, unsigned seed, size_t stride)
{
    char *b = p;
    for (size_t i = 0; i < n; i += stride)
        b[i] = (char)(seed + i / stride);
    b[n - 1] = (char)seed;
}

int vmm_test_intact(const void *p, size_t n, unsigned seed, size_t stride)
{
    const char *b = p;
    for (size_t i = 0; i < n; i += stride)
        if (b[i] != (char)(seed + i / stride))
            return 0;
    return b[n - 1] == (char)seed;
}

vmm_stats vmm_test_stats(vmm_allocator *a)
{
    vmm_stats st;
    memset(&st, 0, sizeof st);
    CHECK_OK(vmm_get_stats(a, &st));
    return st;
}

void vmm_test_gate_wait(void *gate)
{
    vmm_test_gate *g = gate;
    while (!atomic_load(&g->open))
        vmm_test_sleep_ms(1);
    atomic_store(&g->done, 1);
}

const char *vmm_test_python(void)
{
    const char *env = getenv("VMM_PYTHON");
    if (env && *env)
        return env;
    if (access("/usr/bin/python3", X_OK) == 0)
        return "/usr/bin/python3";
    return system("command -v python3 >/dev/null 2>&1") == 0 ? "python3" : NULL;
}

void vmm_test_check_no_sim_leaks(void)
{
    vmm_sim_counters g;
    vmm_sim_global_live(&g);
    CHECK_EQ(g.phys_bytes, 0);
    CHECK_EQ(g.live_handles, 0);
    CHECK_EQ(g.mapped_bytes, 0);
    CHECK_EQ(g.reserved_va_bytes, 0);
    CHECK_EQ(g.live_classic_allocs, 0);
    CHECK_EQ(g.live_streams, 0);
    CHECK_EQ(g.live_events, 0);
}
