/*
 * vmm-gpu-probe: what the CUDA driver of this machine does and what its virtual memory calls cost,
 * as one JSON object on stdout (tools/gpu-check turns it into report.md and costs.json).
 *
 *   vmm-gpu-probe [--facts | --costs] [--quick] [--max-size SIZE_MiB] [--iters N] [--seconds S]
 *
 * --facts: the facts only; --costs: the costs only (with the versions, device and granularities).
 *
 * Facts: versions, device, VMM attributes, granularities (plain / POSIX fd / RDMA flag), cuMemMap at
 * a nonzero offset (and the data seen through both mappings), one cuMemSetAccess over several
 * handles, one handle mapped at two places (alias_pages: data written through one, read through the
 * other), the largest cuMemAddressReserve, zero-fill of new handles, cuMemGetInfo around a release,
 * the RDMA pointer attribute, POSIX fd export / import. The nonzero-offset mapping runs in a child
 * process (a fault there must not end the context of the other facts; "context_after" says whether
 * it left a sticky error), cut off after 20 s.
 * Costs: create / map / setAccess / unmap / release / reserve / address free by handle size (first
 * call and steady median / p90), setAccess by handles in the range, cuMemAlloc / cuMemFree by size,
 * cuEventRecord / cuEventQuery. Memory is bounded: at most one handle of --max-size (default 1 GiB)
 * plus 128 MiB live at a time; every loop is bounded by --iters and by the --seconds budget.
 *
 * libcuda.so.1 is loaded the way the library loads it (dlopen, then cuGetProcAddress_v2 at API
 * version 12000), so the CUDA driver double stands in for it in CI. Exit 77: no driver or no device.
 */
#define _GNU_SOURCE
#include <cuda.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB (1024ull * 1024ull)

typedef CUresult (*getproc_fn)(const char *, void **, int, cuuint64_t, CUdriverProcAddressQueryResult *);

/* Entry points, resolved at 12000 (the prototypes of the ABI that version selects). */
static struct {
    CUresult (*Init)(unsigned);
    CUresult (*DriverGetVersion)(int *);
    CUresult (*GetErrorName)(CUresult, const char **);
    CUresult (*DeviceGet)(CUdevice *, int);
    CUresult (*DeviceGetCount)(int *);
    CUresult (*DeviceGetAttribute)(int *, CUdevice_attribute, CUdevice);
    CUresult (*DeviceGetName)(char *, int, CUdevice);
    CUresult (*DeviceTotalMem)(size_t *, CUdevice);
    CUresult (*PrimaryCtxRetain)(CUcontext *, CUdevice);
    CUresult (*PrimaryCtxRelease)(CUdevice);
    CUresult (*CtxSetCurrent)(CUcontext);
    CUresult (*CtxSynchronize)(void);
    CUresult (*MemGetInfo)(size_t *, size_t *);
    CUresult (*MemGetAllocationGranularity)(size_t *, const CUmemAllocationProp *, CUmemAllocationGranularity_flags);
    CUresult (*MemAddressReserve)(CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long);
    CUresult (*MemAddressFree)(CUdeviceptr, size_t);
    CUresult (*MemCreate)(CUmemGenericAllocationHandle *, size_t, const CUmemAllocationProp *, unsigned long long);
    CUresult (*MemRelease)(CUmemGenericAllocationHandle);
    CUresult (*MemMap)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
    CUresult (*MemUnmap)(CUdeviceptr, size_t);
    CUresult (*MemSetAccess)(CUdeviceptr, size_t, const CUmemAccessDesc *, size_t);
    CUresult (*MemExport)(void *, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long);
    CUresult (*MemImport)(CUmemGenericAllocationHandle *, void *, CUmemAllocationHandleType);
    CUresult (*MemAlloc)(CUdeviceptr *, size_t);
    CUresult (*MemFree)(CUdeviceptr);
    CUresult (*MemsetD8Async)(CUdeviceptr, unsigned char, size_t, CUstream);
    CUresult (*MemcpyHtoDAsync)(CUdeviceptr, const void *, size_t, CUstream);
    CUresult (*MemcpyDtoHAsync)(void *, CUdeviceptr, size_t, CUstream);
    CUresult (*StreamSynchronize)(CUstream);
    CUresult (*EventCreate)(CUevent *, unsigned);
    CUresult (*EventRecord)(CUevent, CUstream);
    CUresult (*EventQuery)(CUevent);
    CUresult (*EventDestroy)(CUevent);
    CUresult (*PointerGetAttribute)(void *, CUpointer_attribute, CUdeviceptr); /* optional */
} cu;

static CUdevice dev;
static CUmemAccessDesc access_rw;
static double deadline_s;
static int iters = 20;
static int first_item = 1; /* JSON comma state of the object being written */

/* ---- output ---------------------------------------------------------------------------------- */
static void key(const char *k)
{
    printf("%s\n\"%s\":", first_item ? "" : ",", k);
    first_item = 0;
}
static void open_obj(const char *k)
{
    if (k)
        key(k);
    printf("{");
    first_item = 1;
}
static void close_obj(void)
{
    printf("}");
    first_item = 0;
}
static void kv_str(const char *k, const char *v)
{
    key(k);
    putchar('"');
    for (const char *p = v ? v : ""; *p; p++)
        if (*p == '"' || *p == '\\')
            printf("\\%c", *p);
        else if ((unsigned char)*p < 0x20)
            printf("\\u%04x", *p);
        else
            putchar(*p);
    putchar('"');
}
static void kv_int(const char *k, long long v)
{
    key(k);
    printf("%lld", v);
}
static void kv_bool(const char *k, int v)
{
    key(k);
    printf(v ? "true" : "false");
}
static const char *err_name(CUresult r)
{
    const char *s = NULL;
    if (cu.GetErrorName && cu.GetErrorName(r, &s) == CUDA_SUCCESS && s)
        return s;
    static char buf[32];
    snprintf(buf, sizeof buf, "CUresult %d", (int)r);
    return buf;
}
static void kv_res(const char *k, CUresult r) { kv_str(k, r == CUDA_SUCCESS ? "CUDA_SUCCESS" : err_name(r)); }

/* ---- time ------------------------------------------------------------------------------------ */
static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
static int over_budget(void) { return (double)now_ns() / 1e9 > deadline_s; }

/* Samples of one call kind at one size: the first, then the rest for median / p90. */
typedef struct {
    uint64_t first;
    uint64_t v[512];
    int n;
    int failed;
    CUresult err;
} samples;

static void add(samples *s, uint64_t ns)
{
    if (s->n == 0 && s->first == 0)
        s->first = ns ? ns : 1;
    else if (s->n < (int)(sizeof s->v / sizeof s->v[0]))
        s->v[s->n++] = ns;
}
static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}
static void emit_samples(const char *k, samples *s)
{
    open_obj(k);
    kv_int("first_ns", (long long)s->first);
    kv_int("n", s->n);
    if (s->n) {
        qsort(s->v, (size_t)s->n, sizeof s->v[0], cmp_u64);
        kv_int("median_ns", (long long)s->v[s->n / 2]);
        kv_int("p90_ns", (long long)s->v[(s->n * 9) / 10 < s->n ? (s->n * 9) / 10 : s->n - 1]);
        kv_int("min_ns", (long long)s->v[0]);
    }
    if (s->failed)
        kv_str("error", err_name(s->err));
    close_obj();
}

/* Time one call into samples; on failure remember the error. TIMED evaluates to the result: the
 * comma operator reads the clock before the call's arguments are evaluated, timed() after. */
static uint64_t t0_clock;
static CUresult timed(samples *s, CUresult r)
{
    uint64_t t1 = now_ns();
    if (r == CUDA_SUCCESS)
        add(s, t1 - t0_clock);
    else if (!s->failed) {
        s->failed = 1;
        s->err = r;
    }
    return r;
}
#define TIMED(s, call) (t0_clock = now_ns(), timed((s), (call)))

/* ---- loading --------------------------------------------------------------------------------- */
static void *lib;

static int load(void)
{
    lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "vmm-gpu-probe: no CUDA driver: dlopen(libcuda.so.1): %s\n", dlerror());
        return 77;
    }
    /* dlsym returns void *; POSIX guarantees the conversion to a function pointer (memcpy: ISO C) */
    getproc_fn gp = NULL;
    void *sym = dlsym(lib, "cuGetProcAddress_v2");
    memcpy(&gp, &sym, sizeof sym);
    if (!gp) {
        fprintf(stderr, "vmm-gpu-probe: libcuda.so.1 has no cuGetProcAddress_v2 (driver older than CUDA 12.0?)\n");
        return 1;
    }
    static const struct {
        const char *name;
        void **slot;
        int optional;
    } table[] = {
#define E(n, f) {"cu" #n, (void **)&cu.f, 0}
        E(Init, Init), E(DriverGetVersion, DriverGetVersion), E(GetErrorName, GetErrorName),
        E(DeviceGet, DeviceGet), E(DeviceGetCount, DeviceGetCount), E(DeviceGetAttribute, DeviceGetAttribute),
        E(DeviceGetName, DeviceGetName), E(DeviceTotalMem, DeviceTotalMem),
        E(DevicePrimaryCtxRetain, PrimaryCtxRetain), E(DevicePrimaryCtxRelease, PrimaryCtxRelease),
        E(CtxSetCurrent, CtxSetCurrent), E(CtxSynchronize, CtxSynchronize), E(MemGetInfo, MemGetInfo),
        E(MemGetAllocationGranularity, MemGetAllocationGranularity), E(MemAddressReserve, MemAddressReserve),
        E(MemAddressFree, MemAddressFree), E(MemCreate, MemCreate), E(MemRelease, MemRelease), E(MemMap, MemMap),
        E(MemUnmap, MemUnmap), E(MemSetAccess, MemSetAccess), E(MemExportToShareableHandle, MemExport),
        E(MemImportFromShareableHandle, MemImport), E(MemAlloc, MemAlloc), E(MemFree, MemFree),
        E(MemsetD8Async, MemsetD8Async), E(MemcpyHtoDAsync, MemcpyHtoDAsync), E(MemcpyDtoHAsync, MemcpyDtoHAsync),
        E(StreamSynchronize, StreamSynchronize), E(EventCreate, EventCreate), E(EventRecord, EventRecord),
        E(EventQuery, EventQuery), E(EventDestroy, EventDestroy),
        {"cuPointerGetAttribute", (void **)&cu.PointerGetAttribute, 1},
#undef E
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        CUdriverProcAddressQueryResult st = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
        *table[i].slot = NULL;
        CUresult r = gp(table[i].name, table[i].slot, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &st);
        if ((r != CUDA_SUCCESS || !*table[i].slot) && !table[i].optional) {
            fprintf(stderr, "vmm-gpu-probe: cuGetProcAddress(%s, 12000): result %d, status %d\n", table[i].name,
                    (int)r, (int)st);
            return 1;
        }
    }
    return 0;
}

static CUmemAllocationProp prop_of(int fd, int rdma)
{
    CUmemAllocationProp p;
    memset(&p, 0, sizeof p);
    p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    p.location.id = dev;
    p.requestedHandleTypes = fd ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
    p.allocFlags.gpuDirectRDMACapable = rdma ? 1 : 0;
    return p;
}

static size_t gran_min;

/* Handle and allocation sizes measured: 2 MiB (today's granularity) to 1 GiB, x4 steps and 1 GiB. */
static const size_t cost_sizes[] = {2 * MiB, 8 * MiB, 32 * MiB, 128 * MiB, 512 * MiB, 1024 * MiB};
enum { N_COST_SIZES = sizeof cost_sizes / sizeof cost_sizes[0] };

/* Reserve, map a new handle of `size`, grant access. 0 on success (then *va, *h live). */
static CUresult map_new(size_t size, const CUmemAllocationProp *p, CUdeviceptr *va, CUmemGenericAllocationHandle *h)
{
    CUresult r = cu.MemAddressReserve(va, size, 0, 0, 0);
    if (r)
        return r;
    if ((r = cu.MemCreate(h, size, p, 0)) != CUDA_SUCCESS) {
        cu.MemAddressFree(*va, size);
        return r;
    }
    if ((r = cu.MemMap(*va, size, 0, *h, 0)) != CUDA_SUCCESS) {
        cu.MemRelease(*h);
        cu.MemAddressFree(*va, size);
        return r;
    }
    if ((r = cu.MemSetAccess(*va, size, &access_rw, 1)) != CUDA_SUCCESS) {
        cu.MemUnmap(*va, size);
        cu.MemRelease(*h);
        cu.MemAddressFree(*va, size);
    }
    return r;
}
static void unmap_free(CUdeviceptr va, size_t size, CUmemGenericAllocationHandle h)
{
    cu.MemUnmap(va, size);
    cu.MemRelease(h);
    cu.MemAddressFree(va, size);
}

/* Copy n bytes device -> host through the legacy stream and wait. */
static CUresult d2h(void *dst, CUdeviceptr src, size_t n)
{
    CUresult r = cu.MemcpyDtoHAsync(dst, src, n, 0);
    return r ? r : cu.StreamSynchronize(0);
}
static CUresult h2d(CUdeviceptr dst, const void *src, size_t n)
{
    CUresult r = cu.MemcpyHtoDAsync(dst, src, n, 0);
    return r ? r : cu.StreamSynchronize(0);
}

/* ---- facts ----------------------------------------------------------------------------------- */
static void fact_granularity(void)
{
    open_obj("granularity");
    static const char *const names[] = {"plain", "posix_fd", "rdma", "posix_fd_rdma"};
    for (int i = 0; i < 4; i++) {
        CUmemAllocationProp p = prop_of(i & 1, i >> 1);
        size_t mn = 0, rec = 0;
        CUresult r1 = cu.MemGetAllocationGranularity(&mn, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
        CUresult r2 = cu.MemGetAllocationGranularity(&rec, &p, CU_MEM_ALLOC_GRANULARITY_RECOMMENDED);
        open_obj(names[i]);
        if (r1 == CUDA_SUCCESS)
            kv_int("minimum", (long long)mn);
        else
            kv_res("minimum_error", r1);
        if (r2 == CUDA_SUCCESS)
            kv_int("recommended", (long long)rec);
        else
            kv_res("recommended_error", r2);
        close_obj();
        if (i == 0 && r1 == CUDA_SUCCESS)
            gran_min = mn;
    }
    close_obj();
}

/* cuMemMap of the second granule of a two-granule handle (cuda.h 13.0: offset "currently must be
 * zero"), and the data seen through both mappings. */
static void fact_offset_map(void)
{
    open_obj("map_nonzero_offset");
    size_t g = gran_min, size = 2 * g;
    CUmemAllocationProp p = prop_of(0, 0);
    CUdeviceptr a = 0, b = 0;
    CUmemGenericAllocationHandle h = 0;
    CUresult r = map_new(size, &p, &a, &h);
    if (r) {
        kv_res("setup_error", r);
        close_obj();
        return;
    }
    if ((r = cu.MemAddressReserve(&b, g, 0, 0, 0)) != CUDA_SUCCESS) {
        kv_res("setup_error", r);
        unmap_free(a, size, h);
        close_obj();
        return;
    }
    r = cu.MemMap(b, g, g, h, 0);
    kv_res("map_result", r);
    kv_bool("accepted", r == CUDA_SUCCESS);
    if (r == CUDA_SUCCESS) {
        CUresult ra = cu.MemSetAccess(b, g, &access_rw, 1);
        kv_res("set_access_result", ra);
        unsigned char *buf = malloc(g), *back = malloc(g);
        int same_ab = -1, same_ba = -1;
        if (ra == CUDA_SUCCESS && buf && back) {
            /* write through the full mapping's second granule, read through the offset mapping */
            for (size_t i = 0; i < g; i++)
                buf[i] = (unsigned char)(i * 7 + 3);
            if (h2d(a + g, buf, g) == CUDA_SUCCESS && d2h(back, b, g) == CUDA_SUCCESS)
                same_ab = memcmp(buf, back, g) == 0;
            /* and the other way round */
            for (size_t i = 0; i < g; i++)
                buf[i] = (unsigned char)(i * 13 + 1);
            if (h2d(b, buf, g) == CUDA_SUCCESS && d2h(back, a + g, g) == CUDA_SUCCESS)
                same_ba = memcmp(buf, back, g) == 0;
        }
        free(buf);
        free(back);
        if (same_ab >= 0)
            kv_bool("data_written_full_read_offset_equal", same_ab);
        if (same_ba >= 0)
            kv_bool("data_written_offset_read_full_equal", same_ba);
        cu.MemUnmap(b, g);
    }
    cu.MemAddressFree(b, g);
    unmap_free(a, size, h);
    /* a copy through a bad mapping faults and leaves a sticky error on the context */
    kv_res("context_after", cu.CtxSynchronize());
    close_obj();
}

/* The nonzero-offset mapping is the one fact that may break the context: if the driver accepts it
 * and a copy through it faults, the sticky error ends every later call of this process. So it runs
 * in a child forked before this process initializes CUDA (a child forked after cuInit cannot use
 * CUDA), cut off after OFFSET_CHILD_S seconds; the parent keeps the child's JSON member, or says
 * how the child ended. The child's memory goes back to the device when it exits. */
enum { OFFSET_CHILD_S = 20, OFFSET_OUT_MAX = 16384 };
static char offset_out[OFFSET_OUT_MAX + 1];
static char offset_status[160];

static void offset_child(int wfd)
{
    if (dup2(wfd, STDOUT_FILENO) < 0)
        _exit(3);
    alarm(OFFSET_CHILD_S); /* the parent kills it too; this covers a parent that died */
    CUcontext ctx;
    CUmemAllocationProp p = prop_of(0, 0);
    if (cu.Init(0) || cu.DeviceGet(&dev, 0) || cu.PrimaryCtxRetain(&ctx, dev) || cu.CtxSetCurrent(ctx))
        _exit(4);
    access_rw.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access_rw.location.id = dev;
    access_rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    p.location.id = dev;
    if (cu.MemGetAllocationGranularity(&gran_min, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM) || !gran_min)
        _exit(5);
    first_item = 1;
    fact_offset_map();
    fflush(stdout);
    _exit(0);
}

static void run_offset_child(void)
{
    int fds[2];
    size_t n = 0;
    offset_out[0] = '\0';
    if (pipe(fds)) {
        snprintf(offset_status, sizeof offset_status, "not run: pipe: %s", strerror(errno));
        return;
    }
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(offset_status, sizeof offset_status, "not run: fork: %s", strerror(errno));
        close(fds[0]);
        close(fds[1]);
        return;
    }
    if (pid == 0) {
        close(fds[0]);
        offset_child(fds[1]);
    }
    close(fds[1]);
    uint64_t end = now_ns() + (uint64_t)OFFSET_CHILD_S * 1000000000u;
    int timed_out = 0;
    for (;;) {
        uint64_t t = now_ns();
        if (t >= end) {
            timed_out = 1;
            break;
        }
        struct pollfd pf = {.fd = fds[0], .events = POLLIN};
        int pr = poll(&pf, 1, (int)((end - t) / 1000000u) + 1);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr <= 0)
            continue; /* the clock decides */
        char tmp[4096];
        ssize_t got = read(fds[0], tmp, sizeof tmp);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            break; /* EOF: the child ended (or closed its output) */
        size_t take = (size_t)got < OFFSET_OUT_MAX - n ? (size_t)got : OFFSET_OUT_MAX - n;
        memcpy(offset_out + n, tmp, take);
        n += take;
    }
    offset_out[n] = '\0';
    close(fds[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int st = 0;
    pid_t w = 0;
    /* a child stuck inside the driver may not die at once: wait up to 2 s, then go on without it */
    for (int i = 0; i < 200 && (w = waitpid(pid, &st, WNOHANG)) == 0; i++)
        usleep(10000);
    if (w != pid)
        snprintf(offset_status, sizeof offset_status, "child %s and was not reaped", timed_out ? "timed out" : "hung");
    else if (timed_out)
        snprintf(offset_status, sizeof offset_status, "child timed out after %d s (killed)", OFFSET_CHILD_S);
    else if (WIFSIGNALED(st))
        snprintf(offset_status, sizeof offset_status, "child killed by signal %d (%s)", WTERMSIG(st),
                 strsignal(WTERMSIG(st)));
    else if (WEXITSTATUS(st) != 0)
        snprintf(offset_status, sizeof offset_status, "child exit %d (3 output, 4 init/context, 5 granularity)",
                 WEXITSTATUS(st));
    else if (n == 0 || offset_out[n - 1] != '}')
        snprintf(offset_status, sizeof offset_status, "child exit 0 with incomplete output");
    else
        offset_status[0] = '\0'; /* complete */
}

/* The child's member of "facts", or an object saying why there is none. */
static void emit_offset_fact(void)
{
    if (!offset_status[0]) {
        printf("%s%s", first_item ? "" : ",", offset_out);
        first_item = 0;
        return;
    }
    open_obj("map_nonzero_offset");
    kv_str("child", offset_status);
    if (offset_out[0])
        kv_str("child_output", offset_out);
    close_obj();
}

/* One cuMemSetAccess over a range made of several handles, then a memset over all of it. */
static void fact_access_span(void)
{
    enum { K = 4 };
    open_obj("set_access_spanning_handles");
    size_t g = gran_min;
    CUmemAllocationProp p = prop_of(0, 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h[K] = {0};
    CUresult r = cu.MemAddressReserve(&va, K * g, 0, 0, 0);
    int made = 0;
    for (; r == CUDA_SUCCESS && made < K; made++) {
        if ((r = cu.MemCreate(&h[made], g, &p, 0)) != CUDA_SUCCESS)
            break;
        if ((r = cu.MemMap(va + made * g, g, 0, h[made], 0)) != CUDA_SUCCESS) {
            cu.MemRelease(h[made]);
            break;
        }
    }
    kv_int("handles", K);
    if (r) {
        kv_res("setup_error", r);
    } else {
        r = cu.MemSetAccess(va, K * g, &access_rw, 1);
        kv_res("result", r);
        if (r == CUDA_SUCCESS) {
            CUresult m = cu.MemsetD8Async(va, 0x5a, K * g, 0);
            if (!m)
                m = cu.StreamSynchronize(0);
            unsigned char c = 0;
            if (!m)
                m = d2h(&c, va + K * g - 1, 1);
            kv_res("memset_whole_range", m);
            if (!m)
                kv_bool("last_byte_written", c == 0x5a);
        }
    }
    for (int i = 0; i < made; i++) {
        cu.MemUnmap(va + i * g, g);
        cu.MemRelease(h[i]);
    }
    if (va)
        cu.MemAddressFree(va, K * g);
    close_obj();
}

/* One handle mapped at two places that are not side by side (the allocator's alias_pages: a partly
 * used page mapped again where a growth's first or last page lies): bytes written through one view
 * by a copy on the legacy stream, read through the other after a stream sync, and the same the
 * other way by a memset; then one view unmapped, the other still reading the data. The driver
 * contract (driver.h, "Mappings") and the Programming Guide's virtual aliasing say both hold once
 * the writing operation completed; this checks it on the machine. */
static void fact_alias_views(void)
{
    enum { N = 4096 };
    open_obj("alias_two_views");
    size_t g = gran_min;
    CUmemAllocationProp p = prop_of(0, 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h = 0;
    int mapped[2] = {0, 0};
    CUresult r = cu.MemAddressReserve(&va, 3 * g, 0, 0, 0);
    if (r == CUDA_SUCCESS && (r = cu.MemCreate(&h, g, &p, 0)) != CUDA_SUCCESS)
        h = 0;
    CUdeviceptr v[2] = {va, va + 2 * g}; /* granule 1 stays unmapped between them */
    for (int i = 0; r == CUDA_SUCCESS && i < 2; i++)
        if ((r = cu.MemMap(v[i], g, 0, h, 0)) == CUDA_SUCCESS)
            mapped[i] = 1;
    for (int i = 0; r == CUDA_SUCCESS && i < 2; i++)
        r = cu.MemSetAccess(v[i], g, &access_rw, 1);
    kv_res("map_twice", r);
    if (r == CUDA_SUCCESS) {
        static unsigned char w[N], rd[N];
        for (int i = 0; i < N; i++)
            w[i] = (unsigned char)(i * 7 + 3);
        /* a copy into view 0 at the granule's end, read through view 1 */
        CUresult c = h2d(v[0] + g - N, w, N);
        if (!c)
            c = d2h(rd, v[1] + g - N, N);
        kv_res("copy_view0_read_view1", c);
        if (!c)
            kv_bool("view1_sees_view0_write", memcmp(w, rd, N) == 0);
        /* a memset through view 1, read through view 0 */
        c = cu.MemsetD8Async(v[1], 0xa5, N, 0);
        if (!c)
            c = cu.StreamSynchronize(0);
        if (!c)
            c = d2h(rd, v[0], N);
        kv_res("memset_view1_read_view0", c);
        if (!c) {
            int same = 1;
            for (int i = 0; i < N; i++)
                same &= rd[i] == 0xa5;
            kv_bool("view0_sees_view1_memset", same);
        }
        /* view 1 gone: view 0 keeps the memory and its data */
        c = cu.MemUnmap(v[1], g);
        kv_res("unmap_one_view", c);
        if (!c) {
            mapped[1] = 0;
            c = d2h(rd, v[0] + g - N, N);
            kv_res("read_other_view_after", c);
            if (!c)
                kv_bool("other_view_data_kept", memcmp(w, rd, N) == 0);
        }
    }
    for (int i = 0; i < 2; i++)
        if (mapped[i])
            cu.MemUnmap(v[i], g);
    if (h)
        cu.MemRelease(h);
    if (va)
        cu.MemAddressFree(va, 3 * g);
    close_obj();
}

static void fact_largest_reserve(void)
{
    open_obj("largest_reserve");
    size_t best = 0;
    CUresult last = CUDA_SUCCESS;
    for (int sh = 30; sh <= 50; sh++) { /* 1 GiB .. 1 PiB, doubling */
        size_t s = (size_t)1 << sh;
        CUdeviceptr va = 0;
        CUresult r = cu.MemAddressReserve(&va, s, 0, 0, 0);
        if (r) {
            last = r;
            break;
        }
        cu.MemAddressFree(va, s);
        best = s;
    }
    kv_int("bytes", (long long)best);
    kv_str("how", "powers of two from 1 GiB up to 1 PiB, each reserved and freed alone");
    if (last)
        kv_res("next_failed_with", last);
    close_obj();
}

/* New handle memory: does it read as zero after a handle that held data was released? */
static void fact_zero_fill(void)
{
    open_obj("new_memory_zero");
    size_t g = gran_min;
    CUmemAllocationProp p = prop_of(0, 0);
    unsigned char *buf = malloc(g);
    int rounds = 0, all_zero = 1;
    CUresult err = CUDA_SUCCESS;
    for (int k = 0; k < 4 && buf && !err; k++) {
        CUdeviceptr va;
        CUmemGenericAllocationHandle h;
        if ((err = map_new(g, &p, &va, &h)) != CUDA_SUCCESS)
            break;
        err = d2h(buf, va, g);
        for (size_t i = 0; !err && i < g; i++)
            if (buf[i]) {
                all_zero = 0;
                break;
            }
        if (!err) { /* dirty it for the next round */
            err = cu.MemsetD8Async(va, 0xa5, g, 0);
            if (!err)
                err = cu.StreamSynchronize(0);
        }
        unmap_free(va, g, h);
        rounds += !err;
    }
    free(buf);
    kv_int("rounds", rounds);
    kv_str("how", "create+map one granule, read it all, memset 0xa5, release; 4 rounds");
    if (err)
        kv_res("error", err);
    else
        kv_bool("read_as_zero", all_zero);
    close_obj();
}

static void fact_mem_get_info(void)
{
    open_obj("mem_get_info_around_release");
    size_t s = 256 * MiB, f0 = 0, f1 = 0, f2 = 0, f3 = 0, total = 0;
    CUmemAllocationProp p = prop_of(0, 0);
    CUdeviceptr va;
    CUmemGenericAllocationHandle h;
    cu.MemGetInfo(&f0, &total);
    CUresult r = map_new(s, &p, &va, &h);
    if (r) {
        kv_res("error", r);
        close_obj();
        return;
    }
    cu.MemGetInfo(&f1, &total);
    cu.MemUnmap(va, s);
    cu.MemGetInfo(&f2, &total);
    cu.MemRelease(h);
    cu.MemGetInfo(&f3, &total);
    cu.MemAddressFree(va, s);
    kv_int("handle_bytes", (long long)s);
    kv_int("free_before", (long long)f0);
    kv_int("free_mapped", (long long)f1);
    kv_int("free_after_unmap", (long long)f2);
    kv_int("free_after_release", (long long)f3);
    kv_int("drop_on_create", (long long)f0 - (long long)f1);
    kv_int("rise_on_release", (long long)f3 - (long long)f2);
    close_obj();
}

static void fact_rdma(int supported)
{
    open_obj("rdma_pointer_attribute");
    kv_bool("device_attribute", supported);
    if (!cu.PointerGetAttribute) {
        kv_str("skipped", "cuPointerGetAttribute not resolvable in this driver");
    } else {
        for (int flag = 0; flag < 2; flag++) {
            if (flag && !supported)
                break;
            CUmemAllocationProp p = prop_of(0, flag);
            CUdeviceptr va = 0;
            CUmemGenericAllocationHandle h = 0;
            CUresult r = map_new(gran_min, &p, &va, &h);
            int mapped = r == CUDA_SUCCESS; /* map_new undoes its own partial work */
            /* cuda.h says "a boolean" without its width: 8 zeroed bytes hold whatever it writes */
            long long v = 0;
            if (mapped)
                r = cu.PointerGetAttribute(&v, CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE, va);
            const char *k = flag ? "with_flag" : "without_flag";
            if (r)
                kv_res(k, r);
            else
                kv_int(k, v != 0);
            if (mapped)
                unmap_free(va, gran_min, h);
        }
    }
    close_obj();
}

static void fact_posix_fd(int supported)
{
    open_obj("posix_fd_export");
    kv_bool("device_attribute", supported);
    CUmemAllocationProp p = prop_of(1, 0);
    CUmemGenericAllocationHandle h = 0, h2 = 0;
    CUresult r = cu.MemCreate(&h, gran_min, &p, 0);
    kv_res("create_with_fd_type", r);
    if (!r) {
        int fd = -1;
        CUresult e = cu.MemExport(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
        kv_res("export", e);
        if (!e) {
            CUresult im = cu.MemImport(&h2, (void *)(intptr_t)fd, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
            kv_res("import_same_process", im);
            if (!im)
                cu.MemRelease(h2);
            close(fd);
        }
        cu.MemRelease(h);
    }
    close_obj();
}

/* ---- costs ----------------------------------------------------------------------------------- */
static void cost_by_size(size_t max_size)
{
    static const char *const kinds[] = {"va_reserve", "mem_create", "mem_map", "set_access",
                                        "mem_unmap",  "mem_release", "va_free"};
    enum { NK = 7 };
    CUmemAllocationProp p = prop_of(0, 0);
    key("by_handle_size");
    printf("[");
    int firstsz = 1;
    for (int si = 0; si < N_COST_SIZES && cost_sizes[si] <= max_size; si++) {
        size_t s = cost_sizes[si];
        if (s % gran_min)
            continue;
        samples *sm = calloc(NK, sizeof *sm);
        if (!sm)
            break;
        int n = s >= 512 * MiB ? (iters < 8 ? iters : 8) : iters;
        for (int i = 0; i <= n && !over_budget(); i++) {
            CUdeviceptr va = 0;
            CUmemGenericAllocationHandle h = 0;
            if (TIMED(&sm[0], cu.MemAddressReserve(&va, s, 0, 0, 0)))
                break;
            if (TIMED(&sm[1], cu.MemCreate(&h, s, &p, 0))) {
                cu.MemAddressFree(va, s);
                break;
            }
            CUresult r = TIMED(&sm[2], cu.MemMap(va, s, 0, h, 0));
            int mapped = r == CUDA_SUCCESS;
            if (!r)
                r = TIMED(&sm[3], cu.MemSetAccess(va, s, &access_rw, 1));
            if (mapped)
                TIMED(&sm[4], cu.MemUnmap(va, s));
            TIMED(&sm[5], cu.MemRelease(h));
            TIMED(&sm[6], cu.MemAddressFree(va, s));
            if (r)
                break;
        }
        printf("%s\n{\"size\":%zu", firstsz ? "" : ",", s);
        firstsz = 0;
        first_item = 0;
        for (int k = 0; k < NK; k++)
            emit_samples(kinds[k], &sm[k]);
        printf("}");
        free(sm);
    }
    printf("]");
    first_item = 0;
}

/* cuMemSetAccess over k handles of one granule each, mapped side by side. */
static void cost_access_by_handles(void)
{
    enum { KMAX = 64 };
    size_t g = gran_min;
    CUmemAllocationProp p = prop_of(0, 0);
    CUdeviceptr va = 0;
    CUmemGenericAllocationHandle h[KMAX];
    int made = 0;
    key("set_access_by_handles");
    printf("[");
    CUresult r = cu.MemAddressReserve(&va, KMAX * g, 0, 0, 0);
    for (; !r && made < KMAX; made++) {
        if ((r = cu.MemCreate(&h[made], g, &p, 0)) != CUDA_SUCCESS)
            break;
        if ((r = cu.MemMap(va + made * g, g, 0, h[made], 0)) != CUDA_SUCCESS) {
            cu.MemRelease(h[made]);
            break;
        }
    }
    int firstk = 1;
    for (int k = 1; !r && k <= KMAX; k *= 2) {
        samples s;
        memset(&s, 0, sizeof s);
        for (int i = 0; i <= iters && !over_budget(); i++)
            if (TIMED(&s, cu.MemSetAccess(va, (size_t)k * g, &access_rw, 1)))
                break;
        printf("%s\n{\"handles\":%d,\"bytes\":%zu", firstk ? "" : ",", k, (size_t)k * g);
        firstk = 0;
        first_item = 0;
        emit_samples("set_access", &s);
        printf("}");
    }
    printf("]");
    first_item = 0;
    for (int i = 0; i < made; i++) {
        cu.MemUnmap(va + i * g, g);
        cu.MemRelease(h[i]);
    }
    if (va)
        cu.MemAddressFree(va, KMAX * g);
    if (r)
        kv_res("set_access_by_handles_error", r);
}

static void cost_classic(size_t max_size)
{
    key("mem_alloc_by_size");
    printf("[");
    int firsts = 1;
    for (int si = 0; si < N_COST_SIZES && cost_sizes[si] <= max_size; si++) {
        size_t s = cost_sizes[si];
        samples a, f;
        memset(&a, 0, sizeof a);
        memset(&f, 0, sizeof f);
        for (int i = 0; i <= iters && !over_budget(); i++) {
            CUdeviceptr d = 0;
            if (TIMED(&a, cu.MemAlloc(&d, s)))
                break;
            TIMED(&f, cu.MemFree(d));
        }
        printf("%s\n{\"size\":%zu", firsts ? "" : ",", s);
        firsts = 0;
        first_item = 0;
        emit_samples("mem_alloc", &a);
        emit_samples("mem_free", &f);
        printf("}");
    }
    printf("]");
    first_item = 0;
}

static void cost_events(void)
{
    open_obj("events");
    samples rec, q;
    memset(&rec, 0, sizeof rec);
    memset(&q, 0, sizeof q);
    CUevent e;
    CUresult r = cu.EventCreate(&e, CU_EVENT_DISABLE_TIMING);
    if (r) {
        kv_res("error", r);
        close_obj();
        return;
    }
    for (int i = 0; i <= 10 * iters && !over_budget(); i++) {
        if (TIMED(&rec, cu.EventRecord(e, 0)))
            break;
        CUresult qr = TIMED(&q, cu.EventQuery(e));
        if (qr != CUDA_SUCCESS && qr != CUDA_ERROR_NOT_READY)
            break;
    }
    cu.StreamSynchronize(0);
    cu.EventDestroy(e);
    emit_samples("event_record", &rec);
    emit_samples("event_query", &q);
    close_obj();
}

int main(int argc, char **argv)
{
    size_t max_size = 1024 * MiB;
    double seconds = 90;
    int facts = 1, costs = 1;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--facts")) {
            costs = 0;
        } else if (!strcmp(argv[i], "--costs")) {
            facts = 0;
        } else if (!strcmp(argv[i], "--quick")) {
            max_size = 32 * MiB;
            iters = 5;
            seconds = 20;
        } else if (!strcmp(argv[i], "--max-size") && i + 1 < argc) {
            max_size = (size_t)strtoull(argv[++i], NULL, 10) * MiB;
        } else if (!strcmp(argv[i], "--iters") && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) {
            seconds = atof(argv[++i]);
        } else {
            fprintf(stderr, "usage: vmm-gpu-probe [--facts | --costs] [--quick] [--max-size MiB] [--iters N] [--seconds S]\n");
            return 2;
        }
    }
    if (iters < 1 || iters > 500 || max_size < 2 * MiB) {
        fprintf(stderr, "vmm-gpu-probe: --iters must be 1..500, --max-size at least 2\n");
        return 2;
    }
    int rc = load();
    if (rc)
        return rc;
    if (facts)
        run_offset_child(); /* before this process initializes CUDA */
    CUresult r = cu.Init(0);
    int ndev = 0;
    if (r == CUDA_ERROR_NO_DEVICE || (r == CUDA_SUCCESS && cu.DeviceGetCount(&ndev) == CUDA_SUCCESS && ndev == 0)) {
        fprintf(stderr, "vmm-gpu-probe: no CUDA device\n");
        return 77;
    }
    if (r) {
        fprintf(stderr, "vmm-gpu-probe: cuInit: %s\n", err_name(r));
        return 1;
    }
    CUcontext ctx;
    if ((r = cu.DeviceGet(&dev, 0)) || (r = cu.PrimaryCtxRetain(&ctx, dev)) || (r = cu.CtxSetCurrent(ctx))) {
        fprintf(stderr, "vmm-gpu-probe: device 0 / its primary context: %s\n", err_name(r));
        return 1;
    }
    access_rw.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    access_rw.location.id = dev;
    access_rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    deadline_s = (double)now_ns() / 1e9 + seconds;
    uint64_t t_start = now_ns();

    int ver = 0, vmm = 0, fd = 0, rdma = 0, major = 0, minor = 0;
    char name[256] = "";
    size_t total = 0;
    cu.DriverGetVersion(&ver);
    cu.DeviceGetName(name, sizeof name, dev);
    cu.DeviceTotalMem(&total, dev);
    cu.DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
    cu.DeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
    cu.DeviceGetAttribute(&rdma, CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, dev);
    cu.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    cu.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);

    printf("{");
    first_item = 1;
    kv_str("tool", "vmm-gpu-probe");
    kv_int("cuda_h_version", CUDA_VERSION);
    kv_int("resolved_at_api_version", 12000);
    open_obj("facts");
    kv_int("driver_version", ver);
    kv_int("devices", ndev);
    kv_str("device_name", name);
    kv_int("device_total_bytes", (long long)total);
    key("compute_capability");
    printf("\"%d.%d\"", major, minor);
    kv_bool("vmm_supported", vmm);
    kv_bool("posix_fd_supported", fd);
    kv_bool("rdma_with_vmm_supported", rdma);
    kv_bool("cuda_double", dlsym(lib, "cudadouble_hooks_table") != NULL);
    fact_granularity();
    if (!vmm || !gran_min) {
        kv_str("skipped", "no VMM support or no granularity: the VMM facts and costs need both");
        close_obj();
        printf("}\n");
        return 1;
    }
    if (facts) {
        emit_offset_fact();
        fact_access_span();
        fact_alias_views();
        fact_largest_reserve();
        fact_zero_fill();
        fact_mem_get_info();
        fact_rdma(rdma);
        fact_posix_fd(fd);
    }
    close_obj();
    if (!costs) {
        kv_int("elapsed_ms", (long long)((now_ns() - t_start) / 1000000u));
        printf("}\n");
        cu.CtxSetCurrent(NULL);
        cu.PrimaryCtxRelease(dev);
        return 0;
    }

    open_obj("costs");
    kv_int("iters", iters);
    kv_int("max_size", (long long)max_size);
    cost_by_size(max_size);
    cost_access_by_handles();
    cost_classic(max_size);
    cost_events();
    kv_bool("budget_exhausted", over_budget());
    close_obj();
    kv_int("elapsed_ms", (long long)((now_ns() - t_start) / 1000000u));
    printf("}\n");
    cu.CtxSetCurrent(NULL);
    cu.PrimaryCtxRelease(dev);
    return 0;
}
