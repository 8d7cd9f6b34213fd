/*
 * Linear device memory (cuMemAlloc / cuMemFree), page-locked host memory (cuMemHostAlloc /
 * cuMemFreeHost) and cuMemGetInfo: the current context's simulated device does the work; the double
 * remembers each block's device and context (for access checks and for context resets).
 */
#include <stdlib.h>

#include "cd_internal.h"

cd_linear *cd_linear_at(uintptr_t p, size_t n)
{
    cd_linear *l = (cd_linear *)cd_ranges_find(&cd.linear, p);
    return l && n <= l->r.len - (p - l->r.start) ? l : NULL;
}

cd_host *cd_host_at(uintptr_t p, size_t n)
{
    cd_host *h = (cd_host *)cd_ranges_find(&cd.host, p);
    return h && n <= h->r.len - (p - h->r.start) ? h : NULL;
}

size_t cd_linear_take_ctx(cd_ctx *c, cd_linear ***out)
{
    size_t n = 0;
    *out = NULL;
    for (size_t i = 0; i < cd.linear.n; i++)
        n += ((cd_linear *)cd.linear.v[i])->ctx == c;
    if (!n || !(*out = malloc(n * sizeof **out)))
        return 0;
    n = 0;
    for (size_t i = 0; i < cd.linear.n;) {
        cd_linear *l = (cd_linear *)cd.linear.v[i];
        if (l->ctx == c) {
            (*out)[n++] = l;
            cd_ranges_remove(&cd.linear, &l->r);
        } else {
            i++;
        }
    }
    return n;
}

CUresult CUDAAPI cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    CD_CALL(cuMemAlloc);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c);
    /* cuThreadExchangeStreamCaptureMode: "some actions, such as a call to cudaMalloc, may be
     * unsafe" during capture. */
    if (!r)
        r = cd_capture_unsafe();
    /* "If bytesize is 0, cuMemAlloc() returns CUDA_ERROR_INVALID_VALUE." */
    if (!r && (!dptr || bytesize == 0))
        r = CUDA_ERROR_INVALID_VALUE;
    cd_device *d = r ? NULL : cd_ctx_dev(c);
    uintptr_t p = 0;
    if (!r)
        r = (CUresult)d->ops->mem_alloc(d->sim, bytesize, &p);
    cd_linear *l = NULL;
    if (!r) {
        l = malloc(sizeof *l);
        if (l) {
            *l = (cd_linear){{p, bytesize}, c->dev, c};
            if (cd_ranges_add(&cd.linear, &l->r)) {
                free(l);
                l = NULL;
            }
        }
        if (l)
            *dptr = p;
        else
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    cd_unlock();
    if (r && p)
        d->ops->mem_free(d->sim, p); /* waits for the device: never under the lock */
    return r;
}

CUresult CUDAAPI cuMemFree_v2(CUdeviceptr dptr)
{
    CD_CALL(cuMemFree);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c);
    if (!r)
        r = cd_capture_unsafe();
    /* cuda.h is silent on 0: success and nothing done, as cudaFree(NULL) and free(NULL). */
    cd_linear *l = NULL;
    if (!r && dptr) {
        /* "which must have been returned by a previous call to one of the following memory
         * allocation APIs - cuMemAlloc() ...": any device's block (UVA tells which). */
        l = (cd_linear *)cd_ranges_find(&cd.linear, dptr);
        if (!l || l->r.start != dptr)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            cd_ranges_remove(&cd.linear, &l->r); /* a racing second free now fails */
    }
    cd_unlock();
    if (r || !l)
        return r;
    /* "For all other pointers, this API may perform implicit synchronization": the simulator's
     * mem_free synchronizes the device, outside the lock (its workers may need it). */
    cd_device *d = cd_dev(l->dev);
    r = (CUresult)d->ops->mem_free(d->sim, l->r.start);
    free(l);
    return r;
}

CUresult CUDAAPI cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    CD_CALL(cuMemGetInfo);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c);
    if (!r && (!free_bytes || !total_bytes))
        r = CUDA_ERROR_INVALID_VALUE;
    /* "Returns in *total the total amount of memory available to the the current context. Returns
     * in *free the amount of memory on the device that is free" */
    if (!r) {
        cd_device *d = cd_ctx_dev(c);
        r = (CUresult)d->ops->mem_get_info(d->sim, free_bytes, total_bytes);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemHostAlloc(void **pp, size_t bytesize, unsigned int Flags)
{
    CD_CALL(cuMemHostAlloc);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c);
    if (!r)
        r = cd_capture_unsafe();
    /* "All of these flags are orthogonal to one another"; anything else is no flag. A size of 0 is
     * refused (cuda.h is silent; the simulator's rule). */
    const unsigned known =
        CU_MEMHOSTALLOC_PORTABLE | CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_WRITECOMBINED;
    if (!r && (!pp || bytesize == 0 || (Flags & ~known)))
        r = CUDA_ERROR_INVALID_VALUE;
    cd_device *d = r ? NULL : cd_ctx_dev(c);
    void *p = NULL;
    if (!r)
        r = (CUresult)d->ops->host_alloc(d->sim, bytesize, &p);
    cd_host *h = NULL;
    if (!r) {
        h = malloc(sizeof *h);
        if (h) {
            *h = (cd_host){{(uintptr_t)p, bytesize}, c->dev, Flags};
            if (cd_ranges_add(&cd.host, &h->r)) {
                free(h);
                h = NULL;
            }
        }
        if (h)
            *pp = p;
        else
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    cd_unlock();
    if (r && p)
        d->ops->host_free(d->sim, p);
    return r;
}

CUresult CUDAAPI cuMemFreeHost(void *p)
{
    CD_CALL(cuMemFreeHost);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c);
    if (!r)
        r = cd_capture_unsafe();
    cd_host *h = NULL;
    if (!r) {
        /* "which must have been returned by a previous call to cuMemAllocHost()" (or
         * cuMemHostAlloc): anything else is INVALID_VALUE, in the list. */
        h = (cd_host *)cd_ranges_find(&cd.host, (uintptr_t)p);
        if (!h || h->r.start != (uintptr_t)p)
            r = CUDA_ERROR_INVALID_VALUE;
        else
            cd_ranges_remove(&cd.host, &h->r);
    }
    cd_unlock();
    if (r)
        return r;
    cd_device *d = cd_dev(h->dev);
    r = (CUresult)d->ops->host_free(d->sim, p); /* synchronizes the device, as cudaFreeHost */
    free(h);
    return r;
}
