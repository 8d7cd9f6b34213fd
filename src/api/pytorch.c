/*
 * The PyTorch pluggable allocator: vmm_torch_malloc / vmm_torch_free with the signatures
 * torch.cuda.memory.CUDAPluggableAllocator loads, one vmm_allocator per device created on first
 * use, and the helpers python/vmmalloc calls with ctypes for what the pluggable path cannot reach
 * (stats, empty_cache, record_stream, the OOM report, history and snapshots).
 *
 * The per-device table is read without a lock on the malloc path (an acquire load of a pointer
 * written once under the table mutex); creation, the conf and the kept messages are under that
 * mutex. Messages are kept process wide because vmm_last_error() is per thread and PyTorch
 * allocates from whichever thread runs the op, while Python asks from its own.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/errors.h"
#include "core/capture.h"
#include "core/config.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/types.h"
#include "features/mempool.h"

enum { TORCH_MESSAGE_MAX = 2048 }; /* as error.c's per-thread message: room for the OOM report */

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(vmm_allocator *) g_alloc[VMM_TORCH_MAX_DEVICES];
static char *g_conf;                         /* vmm_torch_configure's conf, or NULL */
static char g_error[TORCH_MESSAGE_MAX];      /* last failure of a vmm_torch_* call */
static char g_oom[TORCH_MESSAGE_MAX];        /* last out-of-memory report */
static _Atomic int g_capture_guard;          /* vmm_torch_set_capture_guard */
static size_t g_hist_entries;                /* vmm_torch_record_history_ex(-1, ...): applied to */
static unsigned g_hist_flags;                /* allocators created later too (g_mu) */
static _Thread_local int t_malloc_status;    /* vmm_torch_malloc_status */

/* Keep this thread's vmm_last_error() as the process-wide message (and as the OOM report when
 * status is VMM_ENOMEM); returns status. */
static int keep_error(int status)
{
    pthread_mutex_lock(&g_mu);
    snprintf(g_error, sizeof g_error, "%s", vmm_last_error());
    if (status == VMM_ENOMEM)
        snprintf(g_oom, sizeof g_oom, "%s", vmm_last_error());
    pthread_mutex_unlock(&g_mu);
    return status;
}

static int bad_device(int device, const char *fn)
{
    return keep_error(vmm_fail(VMM_EINVAL, "%s: device %d is out of range (0..%d)", fn, device,
                               VMM_TORCH_MAX_DEVICES - 1));
}

/* g_conf (if any) followed by "device:N": keys later in the string win. Caller frees. */
static char *device_conf(int device)
{
    const char *base = g_conf ? g_conf : "";
    size_t n = strlen(base) + 32;
    char *s = malloc(n);
    if (s)
        snprintf(s, n, "%s%sdevice:%d", base, *base ? "," : "", device);
    return s;
}

/* The allocator of `device`, created on first use. */
static int get_allocator(int device, vmm_allocator **out, const char *fn)
{
    if (device < 0 || device >= VMM_TORCH_MAX_DEVICES)
        return bad_device(device, fn);
    vmm_allocator *a = atomic_load_explicit(&g_alloc[device], memory_order_acquire);
    if (VMM_LIKELY(a != NULL)) {
        *out = a;
        return VMM_OK;
    }
    pthread_mutex_lock(&g_mu);
    int rc = VMM_OK;
    a = atomic_load_explicit(&g_alloc[device], memory_order_relaxed);
    if (!a) {
        char *conf = device_conf(device);
        if (!conf)
            rc = vmm_fail(VMM_EHOSTMEM, "%s: out of host memory", fn);
        else
            rc = vmm_create(conf, &a);
        free(conf);
        /* history asked for every device (PyTorch's _record_memory_history has no device):
         * this one records from its start; a failure is kept but does not fail the creation */
        if (rc == VMM_OK && g_hist_entries && vmm_record_history_ex(a, g_hist_entries, g_hist_flags))
            snprintf(g_error, sizeof g_error, "%s: recording history on device %d: %s", fn, device,
                     vmm_last_error());
        if (rc == VMM_OK)
            atomic_store_explicit(&g_alloc[device], a, memory_order_release);
        else
            snprintf(g_error, sizeof g_error, "%s: creating the allocator of device %d: %s", fn, device,
                     vmm_last_error());
    }
    pthread_mutex_unlock(&g_mu);
    *out = a;
    return rc;
}

static vmm_allocator *existing(int device)
{
    return atomic_load_explicit(&g_alloc[device], memory_order_acquire);
}

/* Capture guard: stream captures and no private-pool route takes its allocations. The capture
 * query first, without the allocator lock: a malloc on a stream that does not capture (nearly all)
 * keeps its lock-free paths (thread cache, lane). */
static int capture_refused(vmm_allocator *a, void *stream)
{
    if (!vmm_capture_stream(a, stream, NULL))
        return 0;
    vmm_lock(a);
    int refused = vmm_mempool_route(a, stream) == NULL;
    vmm_unlock(a);
    return refused;
}

VMM_API void *vmm_torch_malloc(ptrdiff_t size, int device, void *stream)
{
    vmm_allocator *a = NULL;
    t_malloc_status = VMM_OK;
    if (size <= 0) {
        if (size < 0)
            t_malloc_status = keep_error(vmm_fail(VMM_EINVAL, "vmm_torch_malloc: negative size %td", size));
        return NULL;
    }
    if ((t_malloc_status = get_allocator(device, &a, "vmm_torch_malloc")) != VMM_OK)
        return NULL;
    if (VMM_UNLIKELY(atomic_load_explicit(&g_capture_guard, memory_order_relaxed)) &&
        capture_refused(a, stream)) {
        keep_error(vmm_fail(VMM_ENOTSUP,
                            "vmm_torch_malloc: stream %p is capturing a CUDA graph, but vmmalloc's "
                            "graph hooks (beginAllocateToPool & co.) are not installed, so the "
                            "graph's memory could be handed to other allocations while replays "
                            "write it; refused. Install with the graph hooks (vmmalloc.graphs) or "
                            "capture with torch.cuda.MemPool(allocator=...)", stream));
        t_malloc_status = VMM_ENOTSUP;
        return NULL;
    }
    void *p = NULL;
    int rc = vmm_malloc(a, (size_t)size, stream, &p);
    if (rc)
        keep_error(rc);
    t_malloc_status = rc;
    return rc ? NULL : p;
}

VMM_API int vmm_torch_malloc_status(void) { return t_malloc_status; }

VMM_API void vmm_torch_free(void *ptr, ptrdiff_t size, int device, void *stream)
{
    if (!ptr)
        return;
    /* the device PyTorch names first, then the others (a pointer may move between devices'
     * bookkeeping only through a caller's mistake, but freeing it right costs little) */
    vmm_allocator *a = device >= 0 && device < VMM_TORCH_MAX_DEVICES ? existing(device) : NULL;
    int rc = a ? vmm_free(a, ptr) : VMM_EBADPTR;
    for (int d = 0; rc == VMM_EBADPTR && d < VMM_TORCH_MAX_DEVICES; d++) {
        vmm_allocator *o = existing(d);
        if (o && o != a && vmm_usable_size(o, ptr))
            rc = vmm_free(o, ptr);
    }
    if (rc == VMM_EBADPTR)
        vmm_fail(VMM_EBADPTR, "vmm_torch_free: %p (%td bytes, device %d) is not a live block of "
                              "any device's allocator", ptr, size, device);
    if (rc) {
        keep_error(rc);
        fprintf(stderr, "vmmalloc: %s\n", vmm_last_error());
    }
}

VMM_API int vmm_torch_configure(const char *conf)
{
    vmm_config c;
    int rc = vmm_config_load(&c, conf);
    if (rc)
        return keep_error(rc);
    pthread_mutex_lock(&g_mu);
    for (int d = 0; d < VMM_TORCH_MAX_DEVICES && rc == VMM_OK; d++)
        if (atomic_load_explicit(&g_alloc[d], memory_order_relaxed))
            rc = vmm_fail(VMM_EINVAL, "vmm_torch_configure: the allocator of device %d exists "
                                      "already; configure before the first CUDA allocation", d);
    char *copy = NULL;
    if (rc == VMM_OK && conf && *conf && !(copy = strdup(conf)))
        rc = vmm_fail(VMM_EHOSTMEM, "vmm_torch_configure: out of host memory");
    if (rc == VMM_OK) {
        free(g_conf);
        g_conf = copy;
    }
    pthread_mutex_unlock(&g_mu);
    return rc ? keep_error(rc) : VMM_OK;
}

VMM_API int vmm_torch_get_allocator(int device, vmm_allocator **out)
{
    if (!out)
        return keep_error(vmm_fail(VMM_EINVAL, "vmm_torch_get_allocator: out is NULL"));
    *out = NULL;
    return get_allocator(device, out, "vmm_torch_get_allocator");
}

VMM_API int vmm_torch_stats_json(int device, char *buf, size_t len)
{
    vmm_allocator *a = NULL;
    int rc = get_allocator(device, &a, "vmm_torch_stats_json");
    if (rc)
        return rc;
    rc = vmm_stats_json(a, buf, len);
    return rc < 0 ? keep_error(rc) : rc;
}

/* Apply fn to one device's allocator, or to every existing one when device is -1. */
static int for_devices(int device, int (*fn)(vmm_allocator *), const char *name)
{
    if (device != -1) {
        vmm_allocator *a = NULL;
        int rc = get_allocator(device, &a, name);
        if (rc == VMM_OK && (rc = fn(a)) != VMM_OK)
            keep_error(rc);
        return rc;
    }
    int first = VMM_OK;
    for (int d = 0; d < VMM_TORCH_MAX_DEVICES; d++) {
        vmm_allocator *a = existing(d);
        int rc = a ? fn(a) : VMM_OK;
        if (rc && first == VMM_OK)
            first = keep_error(rc);
    }
    return first;
}

static int reset_peaks(vmm_allocator *a) { return vmm_reset_stats(a, 0); }

VMM_API int vmm_torch_reset_accumulated(int device)
{
    return for_devices(device, vmm_reset_accumulated_stats, "vmm_torch_reset_accumulated");
}

VMM_API int vmm_torch_has_allocator(int device)
{
    return device >= 0 && device < VMM_TORCH_MAX_DEVICES && existing(device) != NULL;
}

VMM_API void vmm_torch_set_memory_fraction(double fraction, int device)
{
    vmm_allocator *a = NULL;
    int rc = get_allocator(device, &a, "vmm_torch_set_memory_fraction");
    if (rc == VMM_OK && (rc = vmm_set_memory_fraction(a, fraction)) != VMM_OK)
        keep_error(rc);
    if (rc) /* the hook returns nothing: say it where it is seen */
        fprintf(stderr, "vmmalloc: %s\n", vmm_last_error());
}

VMM_API int vmm_torch_get_memory_fraction(int device, double *fraction, size_t *cap_bytes)
{
    vmm_allocator *a = NULL;
    int rc = get_allocator(device, &a, "vmm_torch_get_memory_fraction");
    if (rc == VMM_OK && (rc = vmm_get_memory_fraction(a, fraction, cap_bytes)) != VMM_OK)
        keep_error(rc);
    return rc;
}

VMM_API int vmm_torch_record_history_ex(int device, size_t max_entries, unsigned flags)
{
    if (device != -1) {
        vmm_allocator *a = NULL;
        int rc = get_allocator(device, &a, "vmm_torch_record_history_ex");
        if (rc == VMM_OK && (rc = vmm_record_history_ex(a, max_entries, flags)) != VMM_OK)
            keep_error(rc);
        return rc;
    }
    /* every device: those in use now, and (through get_allocator) those created later. Under the
     * table mutex, so that no allocator is created between the walk and the setting. */
    int first = VMM_OK;
    pthread_mutex_lock(&g_mu);
    g_hist_entries = max_entries;
    g_hist_flags = flags;
    for (int d = 0; d < VMM_TORCH_MAX_DEVICES; d++) {
        vmm_allocator *a = existing(d);
        int rc = a ? vmm_record_history_ex(a, max_entries, flags) : VMM_OK;
        if (rc && first == VMM_OK) {
            first = rc;
            snprintf(g_error, sizeof g_error, "%s", vmm_last_error()); /* keep_error takes g_mu */
        }
    }
    pthread_mutex_unlock(&g_mu);
    return first;
}

VMM_API int vmm_torch_empty_cache(int device)
{
    return for_devices(device, vmm_empty_cache, "vmm_torch_empty_cache");
}

VMM_API int vmm_torch_reset_peaks(int device)
{
    return for_devices(device, reset_peaks, "vmm_torch_reset_peaks");
}

VMM_API int vmm_torch_record_stream(void *ptr, void *stream)
{
    for (int d = 0; ptr && d < VMM_TORCH_MAX_DEVICES; d++) {
        vmm_allocator *a = existing(d);
        if (a && vmm_usable_size(a, ptr)) {
            int rc = vmm_record_stream(a, ptr, stream);
            return rc ? keep_error(rc) : VMM_OK;
        }
    }
    return keep_error(vmm_fail(VMM_EBADPTR, "vmm_torch_record_stream: %p is not a live block of any "
                                            "device's allocator", ptr));
}

VMM_API int vmm_torch_snapshot(int device, const char *path)
{
    vmm_allocator *a = NULL;
    int rc = get_allocator(device, &a, "vmm_torch_snapshot");
    if (rc == VMM_OK && (rc = vmm_snapshot_pickle(a, path)) != VMM_OK)
        keep_error(rc);
    return rc;
}

VMM_API int vmm_torch_record_history(int device, size_t max_entries)
{
    vmm_allocator *a = NULL;
    int rc = get_allocator(device, &a, "vmm_torch_record_history");
    if (rc == VMM_OK && (rc = vmm_record_history(a, max_entries)) != VMM_OK)
        keep_error(rc);
    return rc;
}

static int copy_out(const char *src, char *buf, size_t len)
{
    pthread_mutex_lock(&g_mu);
    int n = (int)strlen(src);
    if (buf && len)
        snprintf(buf, len, "%s", src);
    pthread_mutex_unlock(&g_mu);
    return n;
}

VMM_API int vmm_torch_last_error(char *buf, size_t len) { return copy_out(g_error, buf, len); }

VMM_API int vmm_torch_oom_report(char *buf, size_t len) { return copy_out(g_oom, buf, len); }

VMM_API void vmm_torch_shutdown(void)
{
    pthread_mutex_lock(&g_mu);
    for (int d = 0; d < VMM_TORCH_MAX_DEVICES; d++) {
        vmm_allocator *a = atomic_exchange_explicit(&g_alloc[d], NULL, memory_order_acq_rel);
        vmm_destroy(a);
    }
    free(g_conf);
    g_conf = NULL;
    g_hist_entries = 0;
    g_hist_flags = 0;
    g_error[0] = g_oom[0] = '\0';
    atomic_store(&g_capture_guard, 0);
    pthread_mutex_unlock(&g_mu);
}

/* ---- CUDA graphs (CUDAPluggableAllocator's pool hooks; the C++ shim adapts their shapes) ------ */

VMM_API int vmm_torch_begin_allocate_to_pool(int device, uint64_t id0, uint64_t id1,
                                             vmm_stream_filter filter, void *ctx)
{
    vmm_allocator *a = NULL;
    int rc = get_allocator(device, &a, "vmm_torch_begin_allocate_to_pool");
    if (rc == VMM_OK && (rc = vmm_pool_begin_filter(a, id0, id1, filter, ctx)) != VMM_OK)
        keep_error(rc);
    return rc;
}

/* The existing allocator of device (these never create one: there is nothing to end or release). */
static vmm_allocator *pool_allocator(int device, const char *fn)
{
    vmm_allocator *a = device >= 0 && device < VMM_TORCH_MAX_DEVICES ? existing(device) : NULL;
    if (!a)
        keep_error(vmm_fail(VMM_EINVAL, "%s: device %d has no allocator (no pool was begun on it)", fn,
                            device));
    return a;
}

VMM_API int vmm_torch_end_allocate_to_pool(int device, uint64_t id0, uint64_t id1)
{
    vmm_allocator *a = pool_allocator(device, "vmm_torch_end_allocate_to_pool");
    if (!a)
        return VMM_EINVAL;
    int rc = vmm_pool_end(a, id0, id1);
    return rc ? keep_error(rc) : VMM_OK;
}

VMM_API int vmm_torch_release_pool(int device, uint64_t id0, uint64_t id1)
{
    vmm_allocator *a = pool_allocator(device, "vmm_torch_release_pool");
    if (!a)
        return VMM_EINVAL;
    int rc = vmm_pool_release(a, id0, id1);
    return rc ? keep_error(rc) : VMM_OK;
}

VMM_API int vmm_torch_set_capture_guard(int on)
{
    return atomic_exchange_explicit(&g_capture_guard, on != 0, memory_order_relaxed);
}
