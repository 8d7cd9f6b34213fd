#include "testutil.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
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

long long vmm_test_json_num(vmm_allocator *a, const char *key)
{
    static _Thread_local char buf[1 << 16];
    if (vmm_stats_json(a, buf, sizeof buf) < 0)
        return -1;
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\":", key);
    const char *k = strstr(buf, pat);
    return k ? atoll(k + strlen(pat)) : -1;
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

int vmm_test_run_python(const char *script, const char *args)
{
#if defined(__SANITIZE_THREAD__)
    (void)script;
    (void)args;
    fprintf(stderr, "ThreadSanitizer build: python3 cannot host the library: skipped\n");
    return 77;
#else
#if defined(__SANITIZE_ADDRESS__)
#define PY_PRELOAD_ "LD_PRELOAD=\"$(${CC:-cc} -print-file-name=libasan.so) " \
                    "$(${CC:-cc} -print-file-name=libubsan.so)\" ASAN_OPTIONS=detect_leaks=0"
#else
#define PY_PRELOAD_ ""
#endif
    const char *py = vmm_test_python();
    if (!py) {
        fprintf(stderr, "python3 not available: skipped\n");
        return 77;
    }
    const char *lib = getenv("VMM_SHARED_LIB");
    if (!lib) {
        fprintf(stderr, "VMM_SHARED_LIB is not set (run through ctest)\n");
        return 1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd,
             "env " PY_PRELOAD_ " VMMALLOC_LIB='%s' VMMALLOC_CONF='driver:sim,sim_capacity:1G' %s '%s'%s%s",
             lib, py, vmm_test_source_path(script), *args ? " " : "", args);
#undef PY_PRELOAD_
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s: %s\n", script,
                st == -1 || !WIFEXITED(st) ? "did not run to its end" : "failed");
        return 1;
    }
    return 0;
#endif
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

int vmm_test_cuda_is_double(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        return 0;
    int is_double = dlsym(lib, "cudadouble_hooks_table") != NULL;
    dlclose(lib);
    return is_double;
}

int vmm_test_gpu_gate(int r, const char *msg)
{
    const char *expect = getenv("VMM_EXPECT_CUDA_DOUBLE");
    int want_double = expect && strcmp(expect, "1") == 0;
    if (r != 0) {
        int no_gpu = r == 3 /* NOT_INITIALIZED */ || r == 100 /* NO_DEVICE */;
        if (no_gpu && !want_double) {
            printf("no usable GPU (skipped): result %d: %s\n", r, msg ? msg : "");
            return 77;
        }
        fprintf(stderr, "opening the cuda driver failed: result %d: %s%s\n", r, msg ? msg : "",
                want_double ? " (this run expects the CUDA double: is its directory on LD_LIBRARY_PATH?)"
                            : " (not a missing driver or device: a broken driver is a failure)");
        return 1;
    }
    int is_double = vmm_test_cuda_is_double();
    if (is_double != want_double) {
        fprintf(stderr, "%s\n", is_double ? "libcuda.so.1 is the CUDA test double but VMM_EXPECT_CUDA_DOUBLE "
                                            "is not set: a GPU run must not pick it up"
                                          : "VMM_EXPECT_CUDA_DOUBLE=1 but libcuda.so.1 is not the double");
        return 1;
    }
    printf("cuda driver: %s\n", is_double ? "the CUDA double (tests/cudadouble)" : "a real libcuda.so.1");
    return 0;
}

void *vmm_test_cu_proc(const char *symbol)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        return NULL;
    void *sym = dlsym(lib, "cuGetProcAddress_v2");
    dlclose(lib); /* still loaded: the library under test holds it */
    if (!sym)
        return NULL;
    /* CUresult cuGetProcAddress_v2(const char *, void **, int, cuuint64_t, int *) */
    int (*get_proc)(const char *, void **, int, unsigned long long, int *);
    memcpy(&get_proc, &sym, sizeof sym);
    void *fn = NULL;
    int status = 0;
    if (get_proc(symbol, &fn, 12000, 1 /* CU_GET_PROC_ADDRESS_LEGACY_STREAM */, &status) != 0 || status != 0)
        return NULL;
    return fn;
}

int vmm_test_run_torch_script(const char *rel)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    (void)rel;
    fprintf(stderr, "sanitizer build: the PyTorch run needs an uninstrumented library: skipped\n");
    return 77;
#else
    const char *lib = getenv("VMM_SHARED_LIB");
    if (!lib) {
        fprintf(stderr, "VMM_SHARED_LIB is not set (run through ctest)\n");
        return 1;
    }
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "env VMMALLOC_LIB='%s' python3 '%s'", lib, vmm_test_source_path(rel));
    int st = system(cmd);
    if (st == -1 || !WIFEXITED(st)) {
        fprintf(stderr, "could not run python3\n");
        return 1;
    }
    int rc = WEXITSTATUS(st);
    if (rc == 127) {
        fprintf(stderr, "python3 not found: skipped\n");
        return 77;
    }
    return rc;
#endif
}
