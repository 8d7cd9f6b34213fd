/*
 * Contexts of the CUDA double: one primary context per device, and a per-thread context stack.
 *
 * A primary context is active while retained. When the last reference goes, cuda.h says "The
 * context is automatically reset once the last reference to it is released": its streams, events
 * and cuMemAlloc memory die with it (using one afterwards aborts as a destroyed handle). Virtual
 * memory (handles, reservations, mappings) and page-locked host memory are left alone: cuda.h
 * ties cuMemCreate to "the target device specified through the prop structure", not to a context
 * (a choice where cuda.h does not say). The simulated device lives on; so does the context's
 * sticky error (see cd_ctx_fail). The CUcontext value stays the same across resets.
 */
#include <stdio.h>
#include <stdlib.h>

#include "cd_internal.h"

enum { STACK_MAX = 256 };

/* The calling thread's context stack; the top is its current context. */
static _Thread_local struct {
    cd_ctx *v[STACK_MAX];
    int depth;
} stack;

cd_ctx *cd_current(void) { return stack.depth ? stack.v[stack.depth - 1] : NULL; }

static CUcontext handle_of(cd_ctx *c) { return (CUcontext)(void *)c; }

cd_ctx *cd_ctx_of(CUcontext h)
{
    for (int i = 0; h && i < cd.ndev; i++)
        if (handle_of(&cd.dev[i].ctx) == h)
            return &cd.dev[i].ctx;
    return NULL;
}

cd_device *cd_ctx_dev(const cd_ctx *c) { return &cd.dev[c->dev]; }

CUresult cd_ctx_usable(const cd_ctx *c)
{
    /* CUDA_ERROR_INVALID_CONTEXT: "This most frequently indicates that there is no context bound
     * to the current thread. This can also be returned if the context passed to an API call is not
     * a valid handle (such as a context that has had cuCtxDestroy() invoked on it)." A primary
     * context released to zero is such a context until retained again. */
    if (!c || !c->retain)
        return CUDA_ERROR_INVALID_CONTEXT;
    return c->sticky;
}

CUresult cd_enter(cd_ctx **out)
{
    cd_ctx *c = cd_current();
    CUresult r = cd_ctx_usable(c);
    *out = r ? NULL : c;
    return r;
}

/*
 * CUDA_ERROR_ILLEGAL_ADDRESS: "While executing a kernel, the device encountered a load or store
 * instruction on an invalid memory address. This leaves the process in an inconsistent state and
 * any further CUDA work will return the same error. To continue using CUDA, the process must be
 * terminated and relaunched." The double keeps the error on the context whose work hit it, not on
 * the whole process (a narrower reading, so that a test can go on with another device), and for
 * the life of the process (a reset does not clear it, as cuda.h says only relaunching does).
 */
void cd_ctx_fail(cd_ctx *c, CUresult r, const char *fmt, ...)
{
    if (c->sticky)
        return;
    c->sticky = r;
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cudadouble: device %d: ", c->dev);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, ": every later call in this context returns CUDA_ERROR_ILLEGAL_ADDRESS\n");
    va_end(ap);
}

/* ---- primary contexts ------------------------------------------------------------------------- */

CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    CD_CALL(cuDevicePrimaryCtxRetain);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_device *d = cd_dev(dev);
    if (d) {
        /* "Unlike cuCtxCreate() the newly retained context is not pushed onto the stack." */
        d->ctx.retain++;
        d->ctx.ever_retained = true;
        *pctx = handle_of(&d->ctx);
    }
    cd_unlock();
    return d ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

/* The context's last reference went (lock held on entry and on return; dropped meanwhile, as
 * destroying streams and freeing memory wait for the device). */
static void reset(cd_ctx *c)
{
    cd_device *d = cd_ctx_dev(c);
    for (cd_stream *s = c->streams; s; s = s->next)
        if (s->cap)
            cd_limitation("cuDevicePrimaryCtxRelease", "device %d's primary context reset while its "
                          "stream %p is capturing is not modelled", c->dev, (void *)s);
    cd_stream *streams = c->streams;
    c->streams = NULL;
    unsigned long n = 0;
    for (cd_stream *s = streams; s; s = s->next, n++)
        cd_map_del(&cd.streams, s->id);
    /* Events: collect those of this context, then unlink them. */
    cd_event **events = NULL;
    size_t n_events = 0;
    for (size_t i = 0; i < cd.events.cap; i++) {
        cd_event *e = cd.events.vals[i];
        if (cd.events.keys[i] && e->ctx == c) {
            cd_event **v = realloc(events, (n_events + 1) * sizeof *v);
            if (!v)
                break; /* out of host memory: those left stay alive, a leak but no harm */
            events = v;
            events[n_events++] = e;
        }
    }
    for (size_t i = 0; i < n_events; i++) {
        cd_map_del(&cd.events, events[i]->id);
        cd_simev_unref(events[i]->sim);
        cd_nodes_free(&events[i]->nodes);
        free(events[i]);
    }
    free(events);
    cd_linear **lin = NULL;
    size_t n_lin = cd_linear_take_ctx(c, &lin);
    c->reclaimed += n + n_events + n_lin;
    cd_unlock();
    while (streams) {
        cd_stream *next = streams->next;
        cd_stream_sim_destroy(d, streams->sim);
        cd_nodes_free(&streams->tail);
        free(streams);
        streams = next;
    }
    for (size_t i = 0; i < n_lin; i++) {
        d->ops->mem_free(d->sim, lin[i]->r.start);
        free(lin[i]);
    }
    free(lin);
    cd_lock();
}

static CUresult primary_release(CUdevice dev)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_device *d = cd_dev(dev);
    if (!d) {
        r = CUDA_ERROR_INVALID_DEVICE;
    } else if (!d->ctx.retain) {
        /* "Releasing a primary context that has not been previously retained will fail with
         * CUDA_ERROR_INVALID_CONTEXT." */
        r = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--d->ctx.retain == 0) {
        /* "The context is automatically reset once the last reference to it is released." And
         * "unlike cuCtxDestroy() this method does not pop the context from stack in any
         * circumstances": threads keep the handle current, and get INVALID_CONTEXT until a retain. */
        reset(&d->ctx);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    CD_CALL(cuDevicePrimaryCtxRelease);
    return primary_release(dev);
}

/* The CUDA 7.0 ABI (same prototype): modelled as _v2; cuda.h documents only the current one. */
CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
{
    CD_CALL(cuDevicePrimaryCtxRelease);
    return primary_release(dev);
}

/* ---- the context stack ------------------------------------------------------------------------ */

CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx)
{
    CD_CALL(cuCtxGetCurrent);
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* cuda.h lists no INVALID_VALUE; a NULL out pointer gets it all the same. */
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    /* "If no context is bound to the calling CPU thread then *pctx is set to NULL and
     * CUDA_SUCCESS is returned." */
    cd_ctx *c = cd_current();
    *pctx = c ? handle_of(c) : NULL;
    return CUDA_SUCCESS;
}

/* A handle a thread may make current (lock held). */
static CUresult bindable(CUcontext ctx, cd_ctx **out)
{
    *out = cd_ctx_of(ctx);
    return *out && (*out)->retain ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx)
{
    CD_CALL(cuCtxSetCurrent);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!ctx) {
        /* "If ctx is NULL then this will be equivalent to popping the top of the calling CPU
         * thread's CUDA context stack (or a no-op if the calling CPU thread's CUDA context stack
         * is empty)." */
        if (stack.depth)
            stack.depth--;
        return CUDA_SUCCESS;
    }
    cd_ctx *c;
    cd_lock();
    r = bindable(ctx, &c);
    cd_unlock();
    if (r)
        return r;
    /* "If there exists a CUDA context stack on the calling CPU thread, this will replace the top
     * of that stack with ctx." (An empty stack gets it as its only entry.) */
    if (stack.depth)
        stack.v[stack.depth - 1] = c;
    else
        stack.v[stack.depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult push(CUcontext ctx)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c;
    cd_lock();
    r = bindable(ctx, &c); /* NULL is not a context: INVALID_CONTEXT (cuda.h is silent) */
    cd_unlock();
    if (r)
        return r;
    if (stack.depth == STACK_MAX)
        cd_limitation("cuCtxPushCurrent", "the context stack holds at most %d entries", STACK_MAX);
    /* "Pushes the given context ctx onto the CPU thread's stack of current contexts." */
    stack.v[stack.depth++] = c;
    return CUDA_SUCCESS;
}

static CUresult pop(CUcontext *pctx)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* An empty stack has nothing to pop: INVALID_CONTEXT (in cuda.h's list; it does not say). */
    if (!stack.depth)
        return CUDA_ERROR_INVALID_CONTEXT;
    /* "Pops the current CUDA context from the CPU thread and passes back the old context handle
     * in *pctx." pctx may be NULL when the caller does not want it (cuda.h is silent). */
    cd_ctx *c = stack.v[--stack.depth];
    if (pctx)
        *pctx = handle_of(c);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext ctx)
{
    CD_CALL(cuCtxPushCurrent);
    return push(ctx);
}

CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CD_CALL(cuCtxPopCurrent);
    return pop(pctx);
}

/* The CUDA 2.0 ABIs (same prototypes): the same stack. */
CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx)
{
    CD_CALL(cuCtxPushCurrent);
    return push(ctx);
}

CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx)
{
    CD_CALL(cuCtxPopCurrent);
    return pop(pctx);
}

/* ctx NULL: the current context. */
static CUresult get_device(CUdevice *device, CUcontext ctx)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_ctx *c = ctx ? cd_ctx_of(ctx) : cd_current();
    r = cd_ctx_usable(c);
    if (!r && !device)
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        *device = c->dev;
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuCtxGetDevice(CUdevice *device)
{
    CD_CALL(cuCtxGetDevice);
    /* "Returns in *device the handle of the current context's device." */
    return get_device(device, NULL);
}

CUresult CUDAAPI cuCtxGetDevice_v2(CUdevice *device, CUcontext ctx)
{
    CD_CALL(cuCtxGetDevice);
    /* "If the specified context is NULL, the API will return the current context's device." */
    return get_device(device, ctx);
}

/* ---- synchronization -------------------------------------------------------------------------- */

static CUresult ctx_synchronize(cd_ctx *c)
{
    cd_lock();
    CUresult r = cd_ctx_usable(c);
    /* Synchronizing a context with a capturing stream: the CUDA Programming Guide ("It is also
     * invalid to query the execution status of or synchronize a broader handle which encompasses an
     * active stream capture, such as a device or context handle"); cuda.h's cuCtxRecordEvent says
     * of the like "the call will invalidate all the conflicting captures". */
    for (cd_stream *s = r ? NULL : c->streams; s; s = s->next)
        if (s->cap) {
            cd_capture_invalidate(s->cap);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    if (!r)
        r = cd_capture_unsafe();
    cd_unlock();
    if (r)
        return r;
    /* "Blocks until the current context has completed all preceding requested tasks." */
    cd_device *d = cd_ctx_dev(c);
    r = d->ops->device_sync(d->sim);
    if (r)
        return r;
    /* "cuCtxSynchronize() returns an error if one of the preceding tasks failed." */
    cd_lock();
    r = c->sticky;
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuCtxSynchronize(void)
{
    CD_CALL(cuCtxSynchronize);
    CUresult r = cd_check_init();
    return r ? r : ctx_synchronize(cd_current());
}

CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx)
{
    CD_CALL(cuCtxSynchronize);
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* "If the specified context is NULL, the API will operate on the current context." */
    return ctx_synchronize(ctx ? cd_ctx_of(ctx) : cd_current());
}

/* ---- hooks ------------------------------------------------------------------------------------ */

CUcontext cd_hook_current_context(void)
{
    cd_ctx *c = cd_current();
    return c ? handle_of(c) : NULL;
}

CUcontext cd_hook_primary_context(int dev, unsigned *retain_count)
{
    cd_lock();
    cd_device *d = atomic_load(&cd.initialized) ? cd_dev(dev) : NULL;
    CUcontext h = d && d->ctx.ever_retained ? handle_of(&d->ctx) : NULL;
    if (retain_count)
        *retain_count = d ? d->ctx.retain : 0;
    cd_unlock();
    return h;
}

unsigned cd_retained_total(void)
{
    unsigned n = 0;
    cd_lock();
    for (int i = 0; i < cd.ndev; i++)
        n += cd.dev[i].ctx.retain;
    cd_unlock();
    return n;
}
