/*
 * Capture awareness: what the allocator may do while streams capture CUDA graphs.
 *
 * While a stream captures, work queued on it is recorded into a graph instead of running, and every
 * replay of the graph runs it again. So, as PyTorch's caching allocator does:
 *  - no event is recorded on a capturing stream (it would be a graph node, not a point in the
 *    stream's eager work, and querying it is an error), and no fence either: frees of blocks used by
 *    other streams wait on the deferred list until no capture is underway (PyTorch's
 *    insert_events_deferred_until_no_capture), and a use recorded on a capturing stream is dropped
 *    once its capture ended, since that work only runs in replays (remove_cudagraph_stream_uses);
 *  - nothing waits or synchronizes: an allocation that cannot be served without it fails with
 *    VMM_ENOMEM saying so;
 *  - driver calls are made with the calling thread in relaxed capture mode
 *    (cuThreadExchangeStreamCaptureMode, PyTorch's CUDAStreamCaptureModeGuard), because cuMemCreate,
 *    cuMemMap, cuMemSetAccess or cuEventQuery from a thread in global mode would invalidate any
 *    global-mode capture of the process (cuda.h). What relaxed mode allows is made safe by the
 *    rules above: the allocator never queries, waits on or synchronizes what a capture holds.
 * "A capture is underway" means: a vmm_pool_begin route is in force (mempool.c; PyTorch calls
 * beginAllocateToPool before cudaStreamBeginCapture and endAllocateToPool after
 * cudaStreamEndCapture, so the routes cover the capture), or the driver says the stream at hand
 * captures (stream_capture_info), which also covers captures nobody told the allocator about.
 */
#include <stdio.h>

#include "base/metadata.h"
#include "core/capture.h"
#include "core/types.h"
#include "driver/driver.h"

/* A use recorded (vmm_record_stream) on a stream while it captured. */
typedef struct cap_use {
    const vmm_block *b;
    vmm_stream s;
    uint64_t id; /* the capture's id */
} cap_use;

struct vmm_capture {
    cap_use *v;
    size_t n, cap;
};

int vmm_capture_relax(vmm_allocator *a)
{
    if (!a->drv->ops->capture_mode_exchange)
        return -1;
    int m = VMM_CAPTURE_MODE_RELAXED;
    if (a->drv->ops->capture_mode_exchange(a->drv, &m) != VMM_DRV_SUCCESS)
        return -1;
    return m;
}

void vmm_capture_restore(vmm_allocator *a, int prev)
{
    if (prev >= 0)
        (void)a->drv->ops->capture_mode_exchange(a->drv, &prev);
}

int vmm_capture_stream(vmm_allocator *a, vmm_stream s, uint64_t *id)
{
    int capturing = 0;
    uint64_t cid = 0;
    if (a->drv->ops->stream_capture_info &&
        a->drv->ops->stream_capture_info(a->drv, s, &capturing, &cid) != VMM_DRV_SUCCESS)
        capturing = 0, cid = 0; /* an unknown (destroyed) stream captures nothing */
    if (id)
        *id = cid;
    return capturing;
}

int vmm_capture_no_sync(vmm_allocator *a, vmm_stream s)
{
    return a->n_routes != 0 || vmm_capture_stream(a, s, NULL);
}

void vmm_capture_oom_note(vmm_allocator *a, vmm_stream s, char *buf, size_t len)
{
    int capturing = vmm_capture_stream(a, s, NULL);
    snprintf(buf, len,
             "; a CUDA graph capture is underway (%s%s%zu private-pool route(s) in force), so the "
             "allocator neither waited on pending frees (%zu) nor synchronized to free cached "
             "memory: capture prevented the sync",
             capturing ? "the allocating stream captures" : "", capturing ? ", " : "", a->n_routes,
             atomic_load_explicit(&a->n_deferred, memory_order_relaxed));
}

/* ---- uses recorded on capturing streams ------------------------------------------------------- */

static cap_use *use_find(struct vmm_capture *c, const vmm_block *b, vmm_stream s)
{
    for (size_t i = 0; c && i < c->n; i++)
        if (c->v[i].b == b && c->v[i].s == s)
            return &c->v[i];
    return NULL;
}

static void use_remove(struct vmm_capture *c, cap_use *u) { *u = c->v[--c->n]; }

int vmm_capture_use_add(vmm_allocator *a, vmm_block *b, vmm_stream s, uint64_t id)
{
    struct vmm_capture *c = a->capture;
    if (!c) {
        c = vmm_meta_alloc(a->meta, sizeof *c);
        if (!c)
            return VMM_EHOSTMEM;
        a->capture = c;
    }
    cap_use *u = use_find(c, b, s);
    if (u) {
        u->id = id;
        return VMM_OK;
    }
    if (c->n == c->cap) {
        size_t ncap = c->cap ? c->cap * 2 : 16;
        cap_use *nv = vmm_meta_alloc(a->meta, ncap * sizeof *nv);
        if (!nv)
            return VMM_EHOSTMEM; /* the use then counts as eager: waited for, which is safe */
        for (size_t i = 0; i < c->n; i++)
            nv[i] = c->v[i];
        if (c->v)
            vmm_meta_free(a->meta, c->v, c->cap * sizeof *c->v);
        c->v = nv;
        c->cap = ncap;
    }
    c->v[c->n++] = (cap_use){b, s, id};
    return VMM_OK;
}

int vmm_capture_use_check(vmm_allocator *a, const vmm_block *b, vmm_stream s)
{
    /* Captures underway: record nothing at all. The check below and the record after it are not
     * atomic with another thread's cuStreamBeginCapture; PyTorch begins its routes before the
     * capture for exactly that reason. */
    if (a->n_routes)
        return VMM_USE_WAIT;
    /* The stream captures now: an event recorded on it would be a graph node. */
    if (vmm_capture_stream(a, s, NULL))
        return VMM_USE_WAIT;
    cap_use *u = use_find(a->capture, b, s);
    if (u) {
        /* The use was captured and its capture has ended: that work runs only in replays of the
         * graph, whose memory is the graph's own. Nothing to wait for. */
        use_remove(a->capture, u);
        return VMM_USE_DROP;
    }
    return VMM_USE_RECORD;
}

void vmm_capture_use_eager(vmm_allocator *a, const vmm_block *b, vmm_stream s)
{
    cap_use *u = use_find(a->capture, b, s);
    if (u)
        use_remove(a->capture, u);
}

void vmm_capture_forget_block(vmm_allocator *a, const vmm_block *b)
{
    struct vmm_capture *c = a->capture;
    for (size_t i = 0; c && i < c->n;)
        if (c->v[i].b == b)
            use_remove(c, &c->v[i]);
        else
            i++;
}

void vmm_capture_forget_stream(vmm_allocator *a, vmm_stream s)
{
    struct vmm_capture *c = a->capture;
    for (size_t i = 0; c && i < c->n;)
        if (c->v[i].s == s)
            use_remove(c, &c->v[i]);
        else
            i++;
}

size_t vmm_capture_uses(const vmm_allocator *a) { return a->capture ? a->capture->n : 0; }

void vmm_capture_destroy(vmm_allocator *a)
{
    struct vmm_capture *c = a->capture;
    if (!c)
        return;
    if (c->v)
        vmm_meta_free(a->meta, c->v, c->cap * sizeof *c->v);
    vmm_meta_free(a->meta, c, sizeof *c);
    a->capture = NULL;
}
