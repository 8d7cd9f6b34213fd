#include "testutil.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "vmmalloc.h"

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
