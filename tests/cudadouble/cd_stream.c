/*
 * Streams, events and stream-ordered work of the CUDA double.
 *
 * A stream is a simulator stream of its context's device (the legacy stream is the simulator's
 * default stream); events are simulator events. The double adds:
 *
 *  - Contexts: "hEvent and hStream must be from the same context otherwise
 *    CUDA_ERROR_INVALID_HANDLE is returned" (cuEventRecord).
 *  - The legacy stream's implicit synchronization. cuStreamCreate: "CU_STREAM_NON_BLOCKING:
 *    Specifies that work running in the created stream may run concurrently with work in stream 0
 *    (the NULL stream), and that the created stream should perform no implicit synchronization with
 *    stream 0." So work on a blocking stream waits for the legacy stream's work queued before it,
 *    and work on the legacy stream waits for every blocking stream's (done with short-lived
 *    simulator events).
 *  - The per-thread default stream (CU_STREAM_PER_THREAD, and NULL for _ptsz entry points) is
 *    modelled by the legacy stream: a per-thread stream synchronizes only with the legacy stream,
 *    the legacy one with all blocking streams, so the double orders more than CUDA does, never
 *    less. Capturing on it aborts (a double limitation).
 *  - Cross-device waits. cuStreamWaitEvent: "hEvent may be from a different context or device than
 *    hStream." The simulator orders within one device; across devices the waiting stream runs a
 *    function that blocks on the other device's event, as of the call (the event's simulator event
 *    is shared with the wait: a later cuEventRecord gets a fresh one).
 *  - Access checks in stream order. Memsets and copies run as simulator host functions that check,
 *    when they run, that the stream's device may touch the device memory (cuMemSetAccess masks,
 *    cuMemAlloc blocks of that device, cuMemHostAlloc memory). If not, nothing is touched and the
 *    context gets the sticky CUDA_ERROR_ILLEGAL_ADDRESS (see cd_ctx_fail); work of a failed context
 *    no longer runs (cuLaunchHostFunc: "the function will not be called in the event of an error in
 *    the CUDA context").
 *  - Capture (cd_capture.c): work on a capturing stream becomes a graph node and does not run.
 *
 * Destroyed or unknown stream and event handles abort (see cd_decode).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cd_internal.h"

_Thread_local bool cd_in_callback;

static CUstream stream_handle(const cd_stream *s)
{
    return (CUstream)(uintptr_t)cd_encode(s->id, CD_TAG_STREAM);
}

CUresult cd_stream_get(const char *call, CUstream h, bool ptsz, cd_stream **out, bool *per_thread)
{
    uintptr_t v = (uintptr_t)h;
    bool per = v == (uintptr_t)CU_STREAM_PER_THREAD || (v == 0 && ptsz);
    if (per_thread)
        *per_thread = per;
    if (v == 0 || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        /* The special handles name the current context's default streams (cuStreamGetCtx:
         * "Specifying any of the special handles will return the context current to the calling
         * thread. If no context is current to the calling thread, CUDA_ERROR_INVALID_CONTEXT is
         * returned."). */
        cd_ctx *c;
        CUresult r = cd_enter(&c);
        *out = r ? NULL : &c->legacy;
        return r;
    }
    cd_stream *s = cd_decode(call, h, CD_TAG_STREAM, &cd.streams, "stream");
    *out = s;
    return cd_ctx_usable(s->ctx);
}

cd_event *cd_event_get(const char *call, CUevent h)
{
    return cd_decode(call, h, CD_TAG_EVENT, &cd.events, "event");
}

/* ---- simulator events ------------------------------------------------------------------------- */

static CUresult simev_new(cd_device *d, cd_simev **out)
{
    cd_simev *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult r = (CUresult)d->ops->event_create(d->sim, &e->ev);
    if (r) {
        free(e);
        return r;
    }
    e->dev = d->ordinal;
    e->refs = 1;
    *out = e;
    return CUDA_SUCCESS;
}

void cd_simev_unref(cd_simev *e)
{
    if (!e || --e->refs)
        return;
    cd_device *d = cd_dev(e->dev);
    d->ops->event_destroy(d->sim, e->ev); /* a pending event may go: its queued marker stays */
    free(e);
}

/* Later work on simulator stream `to` waits for what is queued on `from` now (one device). */
static CUresult sim_order(cd_device *d, void *from, void *to)
{
    vmm_event e;
    CUresult r = (CUresult)d->ops->event_create(d->sim, &e);
    if (r)
        return r;
    r = (CUresult)d->ops->event_record(d->sim, e, from);
    if (!r)
        r = (CUresult)d->ops->stream_wait_event(d->sim, to, e);
    d->ops->event_destroy(d->sim, e);
    return r;
}

/* The legacy stream's implicit synchronization before work on s (lock held). */
static CUresult implicit_sync(cd_stream *s)
{
    cd_ctx *c = s->ctx;
    cd_device *d = cd_ctx_dev(c);
    if (s == &c->legacy) {
        for (cd_stream *t = c->streams; t; t = t->next)
            if (t->blocking && !t->cap) {
                CUresult r = sim_order(d, t->sim, NULL);
                if (r)
                    return r;
            }
        return CUDA_SUCCESS;
    }
    return s->blocking ? sim_order(d, NULL, s->sim) : CUDA_SUCCESS;
}

/* Before stream-ordered work on s (lock held): the capture rules, then (when the work will run)
 * the implicit synchronization. *captured: the work is a graph node now (node added when
 * add_node). */
static CUresult work_begin(cd_stream *s, bool per_thread, bool add_node, bool *captured)
{
    CUresult r = cd_capture_check(s, per_thread, captured);
    if (r)
        return r;
    if (*captured)
        return add_node ? cd_capture_node(s) : CUDA_SUCCESS;
    return implicit_sync(s);
}

/* ---- stream-ordered work ---------------------------------------------------------------------- */

/* OP_MARK does nothing: queued after a wait, it tells cuStreamQuery when the wait is over. */
typedef enum { OP_SET8, OP_SET32, OP_DTOH, OP_HTOD, OP_HOST, OP_XWAIT, OP_MARK } op_kind;

typedef struct cd_op {
    op_kind kind;
    const char *call;
    cd_ctx *ctx;
    uint64_t stream_id; /* 0: the context's legacy stream (a stream may be destroyed meanwhile) */
    uintptr_t dptr;
    void *host;
    size_t n;        /* elements (memsets) or bytes (copies) */
    uint32_t value;
    CUhostFn fn;
    void *arg;
    cd_simev *wait;  /* OP_XWAIT: the other device's event */
} cd_op;

static void op_memory(cd_op *op)
{
    size_t bytes = op->kind == OP_SET32 ? op->n * 4 : op->n;
    bool write = op->kind != OP_DTOH;
    cd_lock();
    if (op->ctx->sticky) {
        /* the context failed earlier: its work no longer runs */
    } else if (!cd_dev_can_touch(op->ctx->dev, op->dptr, bytes, write)) {
        cd_ctx_fail(op->ctx, CUDA_ERROR_ILLEGAL_ADDRESS, "%s on a stream of device %d touched [%#llx, +%zu), "
                    "which that device may not %s (no mapping, or no cuMemSetAccess grant for it)",
                    op->call, op->ctx->dev, (unsigned long long)op->dptr, bytes, write ? "write" : "read");
    } else {
        /* Under the lock, so nothing unmaps the memory meanwhile. */
        unsigned char *p = (unsigned char *)op->dptr;
        switch (op->kind) {
        case OP_SET8:
            memset(p, (int)(op->value & 0xff), op->n);
            break;
        case OP_SET32:
            for (size_t i = 0; i < op->n; i++)
                memcpy(p + 4 * i, &op->value, 4);
            break;
        case OP_DTOH:
            memcpy(op->host, p, op->n);
            break;
        default:
            memcpy(p, op->host, op->n);
            break;
        }
    }
    cd_unlock();
}

/* The op is done: its stream has one pending item less (lock held). */
static void op_done(cd_op *op)
{
    cd_stream *s = op->stream_id ? cd_map_get(&cd.streams, op->stream_id) : &op->ctx->legacy;
    if (s)
        s->pending--;
}

/* Runs on the simulator stream's worker thread, in stream order. */
static void op_run(void *arg)
{
    cd_op *op = arg;
    if (op->kind == OP_MARK) {
        /* nothing to do */
    } else if (op->kind == OP_XWAIT) {
        /* The device-side wait: this stream goes on once the other device reaches the event. */
        cd_device *w = cd_dev(op->wait->dev);
        w->ops->event_sync(w->sim, op->wait->ev);
        cd_lock();
        cd_simev_unref(op->wait);
        cd_unlock();
    } else if (op->kind == OP_HOST) {
        cd_lock();
        bool failed = op->ctx->sticky != CUDA_SUCCESS;
        cd_unlock();
        if (!failed) {
            cd_in_callback = true;
            op->fn(op->arg);
            cd_in_callback = false;
        }
    } else {
        op_memory(op);
    }
    cd_lock();
    op_done(op);
    cd_unlock();
    free(op);
}

/* Queue op on s (lock held); takes op. */
static CUresult op_queue(cd_stream *s, cd_op *op)
{
    cd_device *d = cd_ctx_dev(s->ctx);
    op->ctx = s->ctx;
    op->stream_id = s->id;
    CUresult r = (CUresult)d->ops->launch_host(d->sim, s->sim, op_run, op);
    if (r)
        free(op);
    else
        s->pending++;
    return r;
}

/* A no-op after a wait queued on s (lock held). */
static CUresult mark_queue(cd_stream *s, const char *call)
{
    cd_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (cd_op){.kind = OP_MARK, .call = call};
    return op_queue(s, op);
}

static CUresult async_memory(const char *call, op_kind kind, CUdeviceptr dptr, void *host, size_t n,
                             uint32_t value, CUstream hs, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_stream *s = NULL;
    bool per_thread = false, captured = false;
    r = cd_stream_get(call, hs, ptsz, &s, &per_thread);
    size_t bytes = n;
    if (!r && kind == OP_SET32) {
        /* cuMemsetD32Async: "The dstDevice pointer must be four byte aligned." */
        if ((dptr & 3) || n > SIZE_MAX / 4)
            r = CUDA_ERROR_INVALID_VALUE;
        bytes = n * 4;
    }
    /* The device side must be memory the driver knows, wholly (mapped pages, a cuMemAlloc block,
     * cuMemHostAlloc memory); the host side of a copy must not be device address space. cuda.h is
     * silent on both: INVALID_VALUE, in every list here. Whether the stream's device may touch the
     * memory is decided when the work runs (see op_memory). */
    if (!r && !cd_known_memory(dptr, bytes))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r && (kind == OP_DTOH || kind == OP_HTOD) &&
        ((!host && n) || cd_device_space((uintptr_t)host, n)))
        r = CUDA_ERROR_INVALID_VALUE;
    if (!r)
        r = work_begin(s, per_thread, true, &captured);
    if (!r && !captured && n) {
        cd_op *op = calloc(1, sizeof *op);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *op = (cd_op){.kind = kind, .call = call, .dptr = dptr, .host = host, .n = n, .value = value};
            r = op_queue(s, op);
        }
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuMemsetD32Async(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    CD_CALL(cuMemsetD32Async);
    return async_memory("cuMemsetD32Async", OP_SET32, dstDevice, NULL, N, ui, hStream, false);
}

CUresult CUDAAPI cuMemsetD32Async_ptsz(CUdeviceptr dstDevice, unsigned int ui, size_t N, CUstream hStream)
{
    CD_CALL(cuMemsetD32Async);
    return async_memory("cuMemsetD32Async", OP_SET32, dstDevice, NULL, N, ui, hStream, true);
}

CUresult CUDAAPI cuMemsetD8Async(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    CD_CALL(cuMemsetD8Async);
    return async_memory("cuMemsetD8Async", OP_SET8, dstDevice, NULL, N, uc, hStream, false);
}

CUresult CUDAAPI cuMemsetD8Async_ptsz(CUdeviceptr dstDevice, unsigned char uc, size_t N, CUstream hStream)
{
    CD_CALL(cuMemsetD8Async);
    return async_memory("cuMemsetD8Async", OP_SET8, dstDevice, NULL, N, uc, hStream, true);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                      CUstream hStream)
{
    CD_CALL(cuMemcpyDtoHAsync);
    return async_memory("cuMemcpyDtoHAsync", OP_DTOH, srcDevice, dstHost, ByteCount, 0, hStream, false);
}

CUresult CUDAAPI cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                           CUstream hStream)
{
    CD_CALL(cuMemcpyDtoHAsync);
    return async_memory("cuMemcpyDtoHAsync", OP_DTOH, srcDevice, dstHost, ByteCount, 0, hStream, true);
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                      CUstream hStream)
{
    CD_CALL(cuMemcpyHtoDAsync);
    return async_memory("cuMemcpyHtoDAsync", OP_HTOD, dstDevice, (void *)(uintptr_t)srcHost, ByteCount, 0,
                        hStream, false);
}

CUresult CUDAAPI cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount,
                                           CUstream hStream)
{
    CD_CALL(cuMemcpyHtoDAsync);
    return async_memory("cuMemcpyHtoDAsync", OP_HTOD, dstDevice, (void *)(uintptr_t)srcHost, ByteCount, 0,
                        hStream, true);
}

static CUresult launch_host_func(CUstream hs, CUhostFn fn, void *userData, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* "fn - The function to call": none is INVALID_VALUE (cuda.h is silent). */
    if (!fn)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_stream *s = NULL;
    bool per_thread = false, captured = false;
    r = cd_stream_get("cuLaunchHostFunc", hs, ptsz, &s, &per_thread);
    if (!r)
        r = work_begin(s, per_thread, true, &captured);
    /* "The function will be called after currently enqueued work and will block work added after
     * it." */
    if (!r && !captured) {
        cd_op *op = calloc(1, sizeof *op);
        if (!op) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *op = (cd_op){.kind = OP_HOST, .call = "cuLaunchHostFunc", .fn = fn, .arg = userData};
            r = op_queue(s, op);
        }
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuLaunchHostFunc(CUstream hStream, CUhostFn fn, void *userData)
{
    CD_CALL(cuLaunchHostFunc);
    return launch_host_func(hStream, fn, userData, false);
}

CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream hStream, CUhostFn fn, void *userData)
{
    CD_CALL(cuLaunchHostFunc);
    return launch_host_func(hStream, fn, userData, true);
}

/* ---- streams ---------------------------------------------------------------------------------- */

CUresult CUDAAPI cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    CD_CALL(cuStreamCreate);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c);
    /* "Valid values for Flags are: CU_STREAM_DEFAULT ... CU_STREAM_NON_BLOCKING" */
    if (!r && (!phStream || (Flags & ~(unsigned)CU_STREAM_NON_BLOCKING)))
        r = CUDA_ERROR_INVALID_VALUE;
    cd_stream *s = r ? NULL : calloc(1, sizeof *s);
    if (!r && !s)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    cd_device *d = r ? NULL : cd_ctx_dev(c);
    if (!r)
        r = (CUresult)d->ops->stream_create(d->sim, &s->sim);
    if (!r) {
        s->id = ++cd.next_id;
        s->ctx = c;
        s->blocking = !(Flags & CU_STREAM_NON_BLOCKING);
        if (cd_map_put(&cd.streams, s->id, s)) {
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            s->next = c->streams;
            c->streams = s;
            *phStream = stream_handle(s);
        }
    }
    cd_unlock();
    if (r && s && s->sim)
        d->ops->stream_destroy(d->sim, s->sim); /* an idle new stream: no wait */
    if (r)
        free(s);
    return r;
}

typedef struct reap {
    cd_device *d;
    void *sim;
} reap;

static void *reaper(void *arg)
{
    reap *x = arg;
    x->d->ops->stream_destroy(x->d->sim, x->sim);
    free(x);
    return NULL;
}

/* The stream's queue is empty now (lock not needed: simulator calls only). */
static bool sim_idle(cd_device *d, void *sim)
{
    vmm_event e;
    if (d->ops->event_create(d->sim, &e))
        return false;
    bool idle = !d->ops->event_record(d->sim, e, sim) && d->ops->event_query(d->sim, e) == 0;
    d->ops->event_destroy(d->sim, e);
    return idle;
}

void cd_stream_sim_destroy(cd_device *d, void *sim)
{
    /* cuStreamDestroy: "In case the device is still doing work in the stream hStream when
     * cuStreamDestroy() is called, the function will return immediately and the resources
     * associated with hStream will be released automatically once the device has completed all
     * work in hStream." The simulator's destroy drains the queue: a busy stream is handed to a
     * thread of its own. */
    if (!sim_idle(d, sim)) {
        reap *x = malloc(sizeof *x);
        pthread_t t;
        pthread_attr_t attr;
        if (x && pthread_attr_init(&attr) == 0) {
            *x = (reap){d, sim};
            pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
            int ok = pthread_create(&t, &attr, reaper, x) == 0;
            pthread_attr_destroy(&attr);
            if (ok)
                return;
        }
        free(x);
    }
    d->ops->stream_destroy(d->sim, sim);
}

static CUresult stream_destroy(CUstream h)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* The default streams are no stream to destroy: INVALID_HANDLE (cuda.h is silent). */
    if (!h || h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    cd_lock();
    cd_stream *s = cd_decode("cuStreamDestroy", h, CD_TAG_STREAM, &cd.streams, "stream");
    r = cd_ctx_usable(s->ctx);
    if (!r && s->cap)
        cd_undefined("cuStreamDestroy", "stream %p is capturing; cuda.h: \"Capture must be ended on the "
                     "same stream in which it was initiated\" and gives no result for destroying it "
                     "first", (void *)h);
    if (!r) {
        cd_map_del(&cd.streams, s->id);
        cd_stream **pp = &s->ctx->streams;
        while (*pp != s)
            pp = &(*pp)->next;
        *pp = s->next;
    }
    cd_unlock();
    if (r)
        return r;
    cd_stream_sim_destroy(cd_ctx_dev(s->ctx), s->sim);
    cd_nodes_free(&s->tail);
    free(s);
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuStreamDestroy_v2(CUstream hStream)
{
    CD_CALL(cuStreamDestroy);
    return stream_destroy(hStream);
}

CUresult CUDAAPI cuStreamDestroy(CUstream hStream)
{
    CD_CALL(cuStreamDestroy); /* the CUDA 2.0 ABI: same prototype, same rules */
    return stream_destroy(hStream);
}

/* Checks shared by cuStreamSynchronize and cuStreamQuery (lock held); then, for a
 * synchronization, the legacy stream's implicit synchronization. */
static CUresult stream_wait_checks(cd_stream *s, bool sync)
{
    /* Programming Guide: "It is invalid to synchronize or query the execution status of a stream
     * which is being captured"; cuda.h, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: "the operation is not
     * permitted when the stream is capturing". The capture is invalidated. */
    if (s->cap) {
        cd_capture_invalidate(s->cap);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    /* The legacy stream "encompasses" capturing blocking streams (cuStreamIsCapturing: "When a
     * blocking stream is capturing, the legacy stream is in an unusable state"):
     * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "a disallowed implicit dependency on a current capture
     * sequence from cudaStreamLegacy". */
    if (s == &s->ctx->legacy && cd_ctx_blocking_capture(s->ctx)) {
        cd_capture_invalidate_ctx(s->ctx, true);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    /* Both are "potentially unsafe" while another capture forbids them (a conservative reading:
     * cuda.h names cudaMalloc as the example). */
    CUresult r = cd_capture_unsafe();
    return r || !sync ? r : implicit_sync(s);
}

static CUresult stream_synchronize(CUstream h, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_stream *s = NULL;
    r = cd_stream_get("cuStreamSynchronize", h, ptsz, &s, NULL);
    if (!r)
        r = stream_wait_checks(s, true);
    cd_unlock();
    if (r)
        return r;
    /* "Waits until the device has completed all operations in the stream specified by hStream."
     * Not under the lock: the stream's work may need it. */
    cd_device *d = cd_ctx_dev(s->ctx);
    r = (CUresult)d->ops->stream_sync(d->sim, s->sim);
    cd_lock();
    if (!r)
        r = s->ctx->sticky; /* \notefnerr: errors of earlier asynchronous work */
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamSynchronize(CUstream hStream)
{
    CD_CALL(cuStreamSynchronize);
    return stream_synchronize(hStream, false);
}

CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream hStream)
{
    CD_CALL(cuStreamSynchronize);
    return stream_synchronize(hStream, true);
}

static CUresult stream_query(CUstream h, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_stream *s = NULL;
    r = cd_stream_get("cuStreamQuery", h, ptsz, &s, NULL);
    if (!r)
        r = stream_wait_checks(s, false);
    /* "Returns CUDA_SUCCESS if all operations in the stream specified by hStream have completed,
     * or CUDA_ERROR_NOT_READY if not." The double counts its own queued operations (memsets,
     * copies, host functions, waits): a probe marker queued now would make a stream that just
     * finished look busy for a moment. */
    if (!r)
        r = s->pending ? CUDA_ERROR_NOT_READY : s->ctx->sticky;
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamQuery(CUstream hStream)
{
    CD_CALL(cuStreamQuery);
    return stream_query(hStream, false);
}

CUresult CUDAAPI cuStreamQuery_ptsz(CUstream hStream)
{
    CD_CALL(cuStreamQuery);
    return stream_query(hStream, true);
}

static CUresult stream_get_ctx(CUstream h, bool ptsz, CUcontext *pctx, CUgreenCtx *pGreenCtx)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!pctx) /* cuda.h is silent: INVALID_VALUE */
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_stream *s = NULL;
    /* "The returned context is the context that was active in the calling thread when the stream
     * was created." */
    r = cd_stream_get("cuStreamGetCtx", h, ptsz, &s, NULL);
    if (!r) {
        *pctx = (CUcontext)(void *)s->ctx;
        /* cuStreamGetCtx_v2: "If the stream is associated with a regular context, the API returns
         * the regular context in pCtx and NULL in pGreenCtx." (pGreenCtx may be NULL here.) */
        if (pGreenCtx)
            *pGreenCtx = NULL;
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamGetCtx(CUstream hStream, CUcontext *pctx)
{
    CD_CALL(cuStreamGetCtx);
    return stream_get_ctx(hStream, false, pctx, NULL);
}

CUresult CUDAAPI cuStreamGetCtx_ptsz(CUstream hStream, CUcontext *pctx)
{
    CD_CALL(cuStreamGetCtx);
    return stream_get_ctx(hStream, true, pctx, NULL);
}

CUresult CUDAAPI cuStreamGetCtx_v2(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    CD_CALL(cuStreamGetCtx);
    return stream_get_ctx(hStream, false, pCtx, pGreenCtx);
}

CUresult CUDAAPI cuStreamGetCtx_v2_ptsz(CUstream hStream, CUcontext *pCtx, CUgreenCtx *pGreenCtx)
{
    CD_CALL(cuStreamGetCtx);
    return stream_get_ctx(hStream, true, pCtx, pGreenCtx);
}

/* ---- events ----------------------------------------------------------------------------------- */

CUresult CUDAAPI cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    CD_CALL(cuEventCreate);
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_ctx *c = NULL;
    cd_lock();
    r = cd_enter(&c); /* "Creates an event *phEvent for the current context" */
    const unsigned known = CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING | CU_EVENT_INTERPROCESS;
    /* "CU_EVENT_INTERPROCESS must be specified along with CU_EVENT_DISABLE_TIMING." */
    if (!r && (!phEvent || (Flags & ~known) ||
               ((Flags & CU_EVENT_INTERPROCESS) && !(Flags & CU_EVENT_DISABLE_TIMING))))
        r = CUDA_ERROR_INVALID_VALUE;
    cd_event *e = r ? NULL : calloc(1, sizeof *e);
    if (!r && !e)
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!r)
        r = simev_new(cd_ctx_dev(c), &e->sim);
    if (!r) {
        e->id = ++cd.next_id;
        e->ctx = c;
        e->flags = Flags;
        if (cd_map_put(&cd.events, e->id, e)) {
            cd_simev_unref(e->sim);
            r = CUDA_ERROR_OUT_OF_MEMORY;
        } else {
            *phEvent = (CUevent)(uintptr_t)cd_encode(e->id, CD_TAG_EVENT);
        }
    }
    if (r)
        free(e);
    cd_unlock();
    return r;
}

static CUresult event_record(CUevent he, CUstream hs, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!he)
        return CUDA_ERROR_INVALID_HANDLE;
    cd_lock();
    cd_event *e = cd_event_get("cuEventRecord", he);
    cd_stream *s = NULL;
    bool per_thread = false, captured = false;
    r = cd_ctx_usable(e->ctx);
    if (!r)
        r = cd_stream_get("cuEventRecord", hs, ptsz, &s, &per_thread);
    /* "hEvent and hStream must be from the same context otherwise CUDA_ERROR_INVALID_HANDLE is
     * returned." */
    if (!r && s->ctx != e->ctx)
        r = CUDA_ERROR_INVALID_HANDLE;
    /* An event recorded in a capturing stream is a capture event: no node, it carries the stream's
     * dependencies for a later cuStreamWaitEvent (fork and join). */
    if (!r)
        r = work_begin(s, per_thread, false, &captured);
    if (!r && captured) {
        if (cd_nodes_copy(&e->nodes, &s->tail))
            r = CUDA_ERROR_OUT_OF_MEMORY;
        else
            e->cap_id = s->cap->id;
    } else if (!r) {
        /* "cuEventRecord() can be called multiple times on the same event and will overwrite the
         * previously captured state. Other APIs such as cuStreamWaitEvent() use the most recently
         * captured state at the time of the API call, and are not affected by later calls" -- a
         * cross-device wait still holds the simulator event: record into a fresh one. */
        cd_device *d = cd_ctx_dev(e->ctx);
        if (e->sim->refs > 1) {
            cd_simev *fresh;
            r = simev_new(d, &fresh);
            if (!r) {
                cd_simev_unref(e->sim);
                e->sim = fresh;
            }
        }
        if (!r)
            r = (CUresult)d->ops->event_record(d->sim, e->sim->ev, s->sim);
        if (!r)
            e->cap_id = 0;
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuEventRecord(CUevent hEvent, CUstream hStream)
{
    CD_CALL(cuEventRecord);
    return event_record(hEvent, hStream, false);
}

CUresult CUDAAPI cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    CD_CALL(cuEventRecord);
    return event_record(hEvent, hStream, true);
}

/* cuEventQuery / cuEventSynchronize on an event last recorded in capture (lock held). */
static CUresult captured_event(cd_event *e)
{
    if (!e->cap_id)
        return CUDA_SUCCESS;
    /* CUDA_ERROR_CAPTURED_EVENT: "the operation is not permitted on an event which was last
     * recorded in a capturing stream"; cuThreadExchangeStreamCaptureMode gives this very case,
     * "attempting cuEventQuery on an event that was last recorded inside a capture sequence". The
     * capture, if still going, is invalidated (an invalid operation during capture). */
    cd_capture *c = cd_capture_find(e->cap_id);
    if (c)
        cd_capture_invalidate(c);
    return CUDA_ERROR_CAPTURED_EVENT;
}

CUresult CUDAAPI cuEventQuery(CUevent hEvent)
{
    CD_CALL(cuEventQuery);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!hEvent)
        return CUDA_ERROR_INVALID_HANDLE;
    cd_lock();
    cd_event *e = cd_event_get("cuEventQuery", hEvent);
    r = cd_ctx_usable(e->ctx);
    if (!r)
        r = captured_event(e);
    if (!r)
        r = cd_capture_unsafe();
    /* "Returns CUDA_SUCCESS if all captured work has been completed, or CUDA_ERROR_NOT_READY if any
     * captured work is incomplete." "Before the first call to cuEventRecord(), an event represents
     * an empty set of work, so for example cuEventQuery() would return CUDA_SUCCESS." */
    if (!r) {
        cd_device *d = cd_ctx_dev(e->ctx);
        r = (CUresult)d->ops->event_query(d->sim, e->sim->ev);
    }
    if (r == CUDA_SUCCESS)
        r = e->ctx->sticky;
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuEventSynchronize(CUevent hEvent)
{
    CD_CALL(cuEventSynchronize);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!hEvent)
        return CUDA_ERROR_INVALID_HANDLE;
    cd_lock();
    cd_event *e = cd_event_get("cuEventSynchronize", hEvent);
    cd_ctx *c = e->ctx;
    r = cd_ctx_usable(c);
    if (!r)
        r = captured_event(e);
    if (!r)
        r = cd_capture_unsafe();
    cd_simev *se = r ? NULL : e->sim;
    if (se)
        se->refs++; /* the event may be re-recorded or destroyed while this thread waits */
    cd_unlock();
    if (r)
        return r;
    /* "Waits until the completion of all work currently captured in hEvent." */
    cd_device *d = cd_dev(se->dev);
    r = (CUresult)d->ops->event_sync(d->sim, se->ev);
    cd_lock();
    cd_simev_unref(se);
    if (!r)
        r = c->sticky;
    cd_unlock();
    return r;
}

static CUresult event_destroy(CUevent h)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!h)
        return CUDA_ERROR_INVALID_HANDLE;
    cd_lock();
    cd_event *e = cd_event_get("cuEventDestroy", h);
    r = cd_ctx_usable(e->ctx);
    if (!r) {
        /* "An event may be destroyed before it is complete ... the call does not block on
         * completion of the event, and any associated resources will automatically be released
         * asynchronously at completion." */
        cd_map_del(&cd.events, e->id);
        cd_simev_unref(e->sim);
        cd_nodes_free(&e->nodes);
        free(e);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuEventDestroy_v2(CUevent hEvent)
{
    CD_CALL(cuEventDestroy);
    return event_destroy(hEvent);
}

CUresult CUDAAPI cuEventDestroy(CUevent hEvent)
{
    CD_CALL(cuEventDestroy); /* the CUDA 2.0 ABI: same prototype, same rules */
    return event_destroy(hEvent);
}

/* ---- waits ------------------------------------------------------------------------------------ */

/* s waits for e, neither in capture (lock held). */
static CUresult wait_running(cd_stream *s, cd_event *e)
{
    CUresult r = implicit_sync(s);
    if (r)
        return r;
    cd_device *sd = cd_ctx_dev(s->ctx), *ed = cd_ctx_dev(e->ctx);
    if (sd == ed) {
        r = (CUresult)sd->ops->stream_wait_event(sd->sim, s->sim, e->sim->ev);
        return r ? r : mark_queue(s, "cuStreamWaitEvent");
    }
    /* Another device: nothing to wait for when its work is done already; else a function on s
     * blocks until it is. */
    r = (CUresult)ed->ops->event_query(ed->sim, e->sim->ev);
    if (r != CUDA_ERROR_NOT_READY)
        return r;
    cd_op *op = calloc(1, sizeof *op);
    if (!op)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *op = (cd_op){.kind = OP_XWAIT, .call = "cuStreamWaitEvent", .wait = e->sim};
    e->sim->refs++;
    r = op_queue(s, op);
    if (r)
        e->sim->refs--; /* still referenced by the event: no destroy here */
    return r;
}

/* s waits for e, last recorded in capture sequence e->cap_id (lock held). */
static CUresult wait_captured(cd_stream *s, bool per_thread, cd_event *e)
{
    cd_capture *c = cd_capture_find(e->cap_id);
    if (!c) {
        /* The capture ended: the event stands for graph nodes, never for work that runs. */
        if (s->cap)
            cd_capture_invalidate(s->cap);
        return CUDA_ERROR_CAPTURED_EVENT;
    }
    if (c->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    if (s->cap && s->cap != c) {
        /* Programming Guide: "It is invalid to merge two separate capture graphs by waiting on a
         * captured event from a stream which is being captured and is associated with a different
         * capture graph than the event." cuda.h: CUDA_ERROR_STREAM_CAPTURE_MERGE. */
        cd_capture_invalidate(s->cap);
        cd_capture_invalidate(c);
        return CUDA_ERROR_STREAM_CAPTURE_MERGE;
    }
    if (per_thread)
        cd_limitation("cuStreamWaitEvent", "the per-thread default stream joining a capture: it is "
                      "modelled by the legacy stream");
    if (s == &s->ctx->legacy) {
        /* "Capture may not be initiated if stream is CU_STREAM_LEGACY": nor may it be joined. */
        cd_capture_invalidate(c);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    /* Programming Guide: "When a stream waits on a captured event, it is placed into capture mode if
     * it is not already, and the next item in the stream will have additional dependencies on the
     * nodes in the captured event." (a fork; waiting back on the origin stream is the join) */
    if (!s->cap) {
        s->cap = c;
        cd_nodes_clear(&s->tail);
    }
    return cd_nodes_union(&s->tail, &e->nodes) ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_SUCCESS;
}

static CUresult stream_wait_event(CUstream hs, CUevent he, unsigned int flags, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* "hEvent - Event to wait on (may not be NULL)" */
    if (!he)
        return CUDA_ERROR_INVALID_HANDLE;
    /* flags: CU_EVENT_WAIT_DEFAULT or CU_EVENT_WAIT_EXTERNAL */
    if (flags & ~(unsigned)CU_EVENT_WAIT_EXTERNAL)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_stream *s = NULL;
    bool per_thread = false, capturing = false;
    r = cd_stream_get("cuStreamWaitEvent", hs, ptsz, &s, &per_thread);
    cd_event *e = r ? NULL : cd_event_get("cuStreamWaitEvent", he);
    if (!r)
        r = cd_ctx_usable(e->ctx); /* "hEvent may be from a different context or device than hStream." */
    if (!r && e->cap_id) {
        r = wait_captured(s, per_thread, e);
        cd_unlock();
        return r;
    }
    if (!r)
        r = cd_capture_check(s, per_thread, &capturing);
    if (!r && capturing) {
        /* Programming Guide: "It is invalid to wait on a non-captured event from a stream which is
         * being captured without specifying the cudaEventWaitExternal flag." cuda.h,
         * CUDA_ERROR_STREAM_CAPTURE_ISOLATION: "a dependency would have been created which crosses
         * the capture sequence boundary. Only implicit in-stream ordering dependencies are allowed
         * to cross the boundary." With CU_EVENT_WAIT_EXTERNAL: "Event is captured in the graph as
         * an external event node". */
        if (flags & CU_EVENT_WAIT_EXTERNAL) {
            r = cd_capture_node(s);
        } else {
            cd_capture_invalidate(s->cap);
            r = CUDA_ERROR_STREAM_CAPTURE_ISOLATION;
        }
    } else if (!r) {
        /* CU_EVENT_WAIT_EXTERNAL: "This flag is invalid outside of stream capture." */
        r = flags ? CUDA_ERROR_INVALID_VALUE : wait_running(s, e);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    CD_CALL(cuStreamWaitEvent);
    return stream_wait_event(hStream, hEvent, Flags, false);
}

CUresult CUDAAPI cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    CD_CALL(cuStreamWaitEvent);
    return stream_wait_event(hStream, hEvent, Flags, true);
}
