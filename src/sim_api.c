/* The vmm_sim_* public functions: thin wrappers over the simulated driver of an allocator. */
#include "internal.h"

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
