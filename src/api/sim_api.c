/* The vmm_sim_* public functions: thin wrappers over the simulated driver of an allocator. */
#include "api/sim_api.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/events.h"
#include "core/lock.h"
#include "core/types.h"
#include "driver/driver.h"

static int need_sim(vmm_allocator *a, const char *fn)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "%s: allocator is NULL", fn);
    if (!a->drv->is_sim)
        return vmm_fail(VMM_ENOTSUP, "%s: the allocator does not run on the simulated driver", fn);
    return VMM_OK;
}

VMM_API int vmm_sim_stream_create(vmm_allocator *a, vmm_stream *out)
{
    int rc = need_sim(a, "vmm_sim_stream_create");
    if (rc)
        return rc;
    if (!out)
        return vmm_fail(VMM_EINVAL, "vmm_sim_stream_create: out is NULL");
    vmm_lock(a);
    if (a->n_sim_streams == a->cap_sim_streams) {
        size_t ncap = a->cap_sim_streams ? a->cap_sim_streams * 2 : 8;
        vmm_stream *n = vmm_meta_alloc(a->meta, ncap * sizeof *n);
        if (!n) {
            vmm_unlock(a);
            return vmm_fail(VMM_EHOSTMEM, "vmm_sim_stream_create: out of host memory");
        }
        for (size_t i = 0; i < a->n_sim_streams; i++)
            n[i] = a->sim_streams[i];
        if (a->sim_streams)
            vmm_meta_free(a->meta, a->sim_streams, a->cap_sim_streams * sizeof *n);
        a->sim_streams = n;
        a->cap_sim_streams = ncap;
    }
    int r = a->drv->ops->stream_create(a->drv, out);
    if (r == VMM_DRV_SUCCESS) {
        a->sim_streams[a->n_sim_streams++] = *out;
        vmm_stream_rec_revive(a, *out);
    }
    vmm_unlock(a);
    return r ? vmm_fail_drv(r, "vmm_sim_stream_create") : VMM_OK;
}

VMM_API int vmm_sim_stream_destroy(vmm_allocator *a, vmm_stream s)
{
    int rc = need_sim(a, "vmm_sim_stream_destroy");
    if (rc)
        return rc;
    vmm_lock(a);
    size_t i = 0;
    while (i < a->n_sim_streams && a->sim_streams[i] != s)
        i++;
    if (i == a->n_sim_streams) {
        vmm_unlock(a);
        return vmm_fail(VMM_EINVAL, "vmm_sim_stream_destroy: %p is not a stream of this allocator", s);
    }
    int r = a->drv->ops->stream_destroy(a->drv, s);
    if (r == VMM_DRV_SUCCESS) {
        a->sim_streams[i] = a->sim_streams[--a->n_sim_streams];
        vmm_stream_rec_retire(a, s);
    }
    vmm_unlock(a);
    return r ? vmm_fail_drv(r, "vmm_sim_stream_destroy") : VMM_OK;
}

VMM_API int vmm_sim_launch(vmm_allocator *a, vmm_stream s, void (*fn)(void *), void *arg)
{
    int rc = need_sim(a, "vmm_sim_launch");
    if (rc)
        return rc;
    if (!fn)
        return vmm_fail(VMM_EINVAL, "vmm_sim_launch: fn is NULL");
    int r = a->drv->ops->launch_host(a->drv, s, fn, arg);
    return r ? vmm_fail_drv(r, "vmm_sim_launch") : VMM_OK;
}

VMM_API int vmm_sim_synchronize(vmm_allocator *a)
{
    int rc = need_sim(a, "vmm_sim_synchronize");
    if (rc)
        return rc;
    int r = a->drv->ops->device_sync(a->drv);
    return r ? vmm_fail_drv(r, "vmm_sim_synchronize") : VMM_OK;
}

int vmm_sim_counters_of(vmm_allocator *a, vmm_sim_counters *out)
{
    return a->drv->is_sim ? vmm_sim_driver_counters(a->drv, out) : -1;
}

VMM_API int vmm_sim_get_counters(vmm_allocator *a, vmm_sim_counters *out)
{
    int rc = need_sim(a, "vmm_sim_get_counters");
    if (rc)
        return rc;
    if (!out)
        return vmm_fail(VMM_EINVAL, "vmm_sim_get_counters: out is NULL");
    int r = vmm_sim_driver_counters(a->drv, out);
    return r ? vmm_fail_drv(r, "vmm_sim_get_counters") : VMM_OK;
}

VMM_API int vmm_sim_fail_nth(vmm_allocator *a, int kind, uint64_t nth)
{
    int rc = need_sim(a, "vmm_sim_fail_nth");
    if (rc)
        return rc;
    if (kind < -1 || kind >= VMM_SIM_CALL_COUNT)
        return vmm_fail(VMM_EINVAL, "vmm_sim_fail_nth: kind %d out of range", kind);
    int r = vmm_sim_driver_fail_nth(a->drv, kind, nth);
    return r ? vmm_fail_drv(r, "vmm_sim_fail_nth") : VMM_OK;
}

VMM_API int vmm_sim_fail_random(vmm_allocator *a, int kind, double p, uint64_t seed)
{
    int rc = need_sim(a, "vmm_sim_fail_random");
    if (rc)
        return rc;
    if (kind < -1 || kind >= VMM_SIM_CALL_COUNT || !(p >= 0.0 && p <= 1.0))
        return vmm_fail(VMM_EINVAL, "vmm_sim_fail_random: kind %d or p %g out of range", kind, p);
    int r = vmm_sim_driver_fail_random(a->drv, kind, p, seed);
    return r ? vmm_fail_drv(r, "vmm_sim_fail_random") : VMM_OK;
}

VMM_API int vmm_sim_on_call(vmm_allocator *a, int kind, vmm_sim_call_hook fn, void *arg)
{
    int rc = need_sim(a, "vmm_sim_on_call");
    if (rc)
        return rc;
    if (kind < -1 || kind >= VMM_SIM_CALL_COUNT)
        return vmm_fail(VMM_EINVAL, "vmm_sim_on_call: kind %d out of range", kind);
    int r = vmm_sim_driver_on_call(a->drv, kind, fn, arg);
    return r ? vmm_fail_drv(r, "vmm_sim_on_call") : VMM_OK;
}

/* ---- capture ------------------------------------------------------------------------------------ */

VMM_API int vmm_sim_capture_begin(vmm_allocator *a, vmm_stream s, int mode)
{
    int rc = need_sim(a, "vmm_sim_capture_begin");
    if (rc)
        return rc;
    if (mode < VMM_SIM_CAPTURE_GLOBAL || mode > VMM_SIM_CAPTURE_RELAXED)
        return vmm_fail(VMM_EINVAL, "vmm_sim_capture_begin: mode %d out of range", mode);
    int r = vmm_sim_driver_capture_begin(a->drv, s, mode);
    if (r == VMM_DRV_INVALID_VALUE)
        return vmm_fail(VMM_EINVAL, "vmm_sim_capture_begin: stream %p captures already", s);
    return r ? vmm_fail_drv(r, "vmm_sim_capture_begin") : VMM_OK;
}

VMM_API int vmm_sim_capture_end(vmm_allocator *a, vmm_stream s, vmm_sim_graph **graph)
{
    if (graph)
        *graph = NULL;
    int rc = need_sim(a, "vmm_sim_capture_end");
    if (rc)
        return rc;
    if (!graph)
        return vmm_fail(VMM_EINVAL, "vmm_sim_capture_end: graph is NULL");
    int r = vmm_sim_driver_capture_end(a->drv, s, graph);
    return r ? vmm_fail_drv(r, "vmm_sim_capture_end") : VMM_OK;
}

VMM_API int vmm_sim_graph_launch(vmm_allocator *a, vmm_sim_graph *g, vmm_stream s)
{
    int rc = need_sim(a, "vmm_sim_graph_launch");
    if (rc)
        return rc;
    if (!g)
        return vmm_fail(VMM_EINVAL, "vmm_sim_graph_launch: graph is NULL");
    int r = vmm_sim_driver_graph_launch(a->drv, g, s);
    return r ? vmm_fail_drv(r, "vmm_sim_graph_launch") : VMM_OK;
}

VMM_API void vmm_sim_graph_destroy(vmm_sim_graph *g) { vmm_sim_driver_graph_destroy(g); }

VMM_API size_t vmm_sim_graph_nodes(const vmm_sim_graph *g) { return vmm_sim_driver_graph_nodes(g); }

VMM_API int vmm_sim_capture_mode_exchange(vmm_allocator *a, int *mode)
{
    int rc = need_sim(a, "vmm_sim_capture_mode_exchange");
    if (rc)
        return rc;
    if (!mode || *mode < VMM_SIM_CAPTURE_GLOBAL || *mode > VMM_SIM_CAPTURE_RELAXED)
        return vmm_fail(VMM_EINVAL, "vmm_sim_capture_mode_exchange: bad mode");
    int r = a->drv->ops->capture_mode_exchange(a->drv, mode);
    return r ? vmm_fail_drv(r, "vmm_sim_capture_mode_exchange") : VMM_OK;
}

VMM_API int vmm_sim_memset32(vmm_allocator *a, void *p, uint32_t value, size_t n, vmm_stream s)
{
    int rc = need_sim(a, "vmm_sim_memset32");
    if (rc)
        return rc;
    int r = a->drv->ops->memset32(a->drv, (uintptr_t)p, value, n, s);
    return r ? vmm_fail_drv(r, "vmm_sim_memset32") : VMM_OK;
}

VMM_API int vmm_sim_stream_wait_stream(vmm_allocator *a, vmm_stream s, vmm_stream on)
{
    int rc = need_sim(a, "vmm_sim_stream_wait_stream");
    if (rc)
        return rc;
    const vmm_driver_ops *ops = a->drv->ops;
    vmm_event e = NULL;
    int r = ops->event_create(a->drv, &e);
    if (!r)
        r = ops->event_record(a->drv, e, on);
    if (!r)
        r = ops->stream_wait_event(a->drv, s, e);
    /* a wait already queued keeps what it waits for: destroying the event now is fine */
    if (e)
        ops->event_destroy(a->drv, e);
    return r ? vmm_fail_drv(r, "vmm_sim_stream_wait_stream") : VMM_OK;
}

VMM_API int vmm_sim_stream_capture_info(vmm_allocator *a, vmm_stream s, int *capturing, uint64_t *id)
{
    int rc = need_sim(a, "vmm_sim_stream_capture_info");
    if (rc)
        return rc;
    if (!capturing || !id)
        return vmm_fail(VMM_EINVAL, "vmm_sim_stream_capture_info: NULL argument");
    int r = a->drv->ops->stream_capture_info(a->drv, s, capturing, id);
    return r ? vmm_fail_drv(r, "vmm_sim_stream_capture_info") : VMM_OK;
}
