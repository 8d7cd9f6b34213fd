/*
 * Stream capture in the CUDA double.
 *
 * cuStreamBeginCapture: "When a stream is in capture mode, all operations pushed into the stream
 * will not be executed, but will instead be captured into a graph, which will be returned via
 * cuStreamEndCapture." A graph here is a set of opaque nodes with their dependencies: enough to
 * answer cuStreamGetCaptureInfo and to tell a fork that was never joined back (the CUDA Programming
 * Guide's cross-stream rules: a stream waiting on an event recorded in a capture joins it; "Failing
 * to rejoin to the origin stream will result in failure of the overall capture operation"). Graphs
 * are never launched.
 *
 * Potentially unsafe calls (cuThreadExchangeStreamCaptureMode). cuda.h: "some actions, such as a
 * call to cudaMalloc, may be unsafe"; "CU_STREAM_CAPTURE_MODE_GLOBAL: ... If the local thread has an
 * ongoing capture sequence that was not initiated with CU_STREAM_CAPTURE_MODE_RELAXED at
 * cuStreamBeginCapture, or if any other thread has a concurrent capture sequence initiated with
 * CU_STREAM_CAPTURE_MODE_GLOBAL, this thread is prohibited from potentially unsafe API calls."
 * "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: If the local thread has an ongoing capture sequence not
 * initiated with CU_STREAM_CAPTURE_MODE_RELAXED, it is prohibited from potentially unsafe API calls.
 * Concurrent capture sequences in other threads are ignored." "CU_STREAM_CAPTURE_MODE_RELAXED: The
 * local thread is not prohibited from potentially unsafe API calls."
 * cuda.h names only cudaMalloc (cuMemAlloc). The double also treats as unsafe, a conservative
 * reading: cuMemFree, cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess,
 * cuMemAddressReserve, cuMemAddressFree, cuMemHostAlloc, cuMemFreeHost (allocation calls that are
 * not stream ordered, as cudaMalloc), and cuEventQuery, cuEventSynchronize, cuStreamSynchronize,
 * cuStreamQuery, cuCtxSynchronize (the Programming Guide forbids querying or synchronizing what a
 * capture encompasses; a thread cannot know which work another thread captures). A prohibited call
 * returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ("the operation is not permitted when the stream is
 * capturing") and invalidates the captures that prohibit it (Programming Guide, Invalidation: "When
 * an invalid operation is attempted during stream capture, any associated capture graphs are
 * invalidated.").
 */
#include <stdlib.h>

#include "cd_internal.h"

static _Thread_local CUstreamCaptureMode thread_mode; /* 0: CU_STREAM_CAPTURE_MODE_GLOBAL, the default */

static CUgraph graph_handle(const cd_graph *g) { return (CUgraph)(uintptr_t)cd_encode(g->id, CD_TAG_GRAPH); }

static CUgraphNode node_handle(cd_node *n) { return (CUgraphNode)(void *)n; }

static cd_node *node_of(CUgraphNode h) { return (cd_node *)(void *)h; }

static void graph_free(cd_graph *g)
{
    while (g->nodes) {
        cd_node *next = g->nodes->next;
        cd_nodes_free(&g->nodes->deps);
        free(g->nodes);
        g->nodes = next;
    }
    cd_map_del(&cd.graphs, g->id);
    free(g);
}

unsigned cd_graphs_live(void) { return (unsigned)cd.graphs.count; }

cd_capture *cd_capture_find(uint64_t id)
{
    for (cd_capture *c = cd.captures; c; c = c->next)
        if (c->id == id)
            return c;
    return NULL;
}

void cd_capture_invalidate(cd_capture *c) { c->invalidated = true; }

bool cd_ctx_blocking_capture(const cd_ctx *c)
{
    for (const cd_stream *s = c->streams; s; s = s->next)
        if (s->blocking && s->cap)
            return true;
    return false;
}

void cd_capture_invalidate_ctx(const cd_ctx *c, bool blocking_only)
{
    for (const cd_stream *s = c->streams; s; s = s->next)
        if (s->cap && (s->blocking || !blocking_only))
            cd_capture_invalidate(s->cap);
}

CUresult cd_capture_unsafe(void)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    CUresult r = CUDA_SUCCESS;
    pthread_t self = pthread_self();
    for (cd_capture *c = cd.captures; c; c = c->next) {
        if (c->mode == CU_STREAM_CAPTURE_MODE_RELAXED)
            continue;
        bool mine = pthread_equal(c->owner, self) != 0;
        bool global =
            thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c->mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (mine || global) {
            cd_capture_invalidate(c);
            r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
        }
    }
    return r;
}

CUresult cd_capture_check(cd_stream *s, bool per_thread, bool *capturing)
{
    *capturing = false;
    cd_ctx *c = s->ctx;
    if (s == &c->legacy && cd_ctx_blocking_capture(c)) {
        if (per_thread)
            cd_limitation("stream-ordered work", "the per-thread default stream while a blocking stream "
                          "of its context captures: the double models it by the legacy stream, which "
                          "cannot be used then");
        /* cuStreamIsCapturing: "When a blocking stream is capturing, the legacy stream is in an
         * unusable state until the blocking stream capture is terminated. The legacy stream is not
         * supported for stream capture, but attempted use would have an implicit dependency on the
         * capturing stream(s)." CUDA_ERROR_STREAM_CAPTURE_IMPLICIT: "a disallowed implicit
         * dependency on a current capture sequence from cudaStreamLegacy". Invalidated, as any
         * invalid operation during capture. */
        cd_capture_invalidate_ctx(c, true);
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
    if (!s->cap)
        return CUDA_SUCCESS;
    /* Programming Guide, Invalidation: "continuing to use any capturing stream or capture events
     * associated with the graph is invalid and will return an error until the stream capture is
     * ended with cudaStreamEndCapture()"; cuda.h, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED: "the
     * current capture sequence on the stream has been invalidated due to a previous error". */
    if (s->cap->invalidated)
        return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    *capturing = true;
    return CUDA_SUCCESS;
}

CUresult cd_capture_node(cd_stream *s)
{
    cd_graph *g = s->cap->graph;
    cd_node *n = calloc(1, sizeof *n);
    if (!n || cd_nodes_copy(&n->deps, &s->tail)) {
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUgraphNode h = node_handle(n);
    cd_nodes_clear(&s->tail);
    if (cd_nodes_add(&s->tail, h)) { /* cannot fail: the set had room for the deps */
        cd_nodes_free(&n->deps);
        free(n);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    n->next = g->nodes;
    g->nodes = n;
    g->n_nodes++;
    return CUDA_SUCCESS;
}

CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    CD_CALL(cuThreadExchangeStreamCaptureMode);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    /* "Sets the calling thread's stream capture interaction mode to the value contained in *mode,
     * and overwrites *mode with the previous mode for the thread." */
    CUstreamCaptureMode prev = thread_mode;
    thread_mode = *mode;
    *mode = prev;
    return CUDA_SUCCESS;
}

/* Every stream taking part in capture c (all contexts). */
#define FOR_MEMBERS(c, s)                                                                       \
    for (int dev_ = 0; dev_ < cd.ndev; dev_++)                                                  \
        for (cd_stream *s = cd.dev[dev_].ctx.streams; s; s = s->next)                           \
            if (s->cap == (c))

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_stream *s = NULL;
    bool per_thread = false;
    r = cd_stream_get("cuStreamBeginCapture", h, ptsz, &s, &per_thread);
    if (!r && per_thread)
        cd_limitation("cuStreamBeginCapture", "capture on the per-thread default stream (allowed by "
                      "CUDA): the double models that stream by the legacy stream");
    /* "Capture may not be initiated if stream is CU_STREAM_LEGACY." cuda.h names no code:
     * CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED ("the operation is not permitted when the stream is
     * capturing"), what shipped drivers answer. */
    if (!r && s == &s->ctx->legacy)
        r = CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    if (!r && (unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        r = CUDA_ERROR_INVALID_VALUE;
    /* "it may only be initiated if the stream is not already in capture mode": INVALID_VALUE, the
     * one error cuda.h lists; the ongoing capture is left as it is. */
    if (!r && s->cap)
        r = CUDA_ERROR_INVALID_VALUE;
    cd_capture *c = r ? NULL : calloc(1, sizeof *c);
    cd_graph *g = r ? NULL : calloc(1, sizeof *g);
    if (!r && (!c || !g))
        r = CUDA_ERROR_OUT_OF_MEMORY;
    if (!r) {
        g->id = cd.next_id + 1;
        g->capturing = true;
        if (cd_map_put(&cd.graphs, g->id, g))
            r = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (!r) {
        cd.next_id++;
        /* "A unique id representing the capture sequence may be queried via
         * cuStreamGetCaptureInfo" ("unique over the lifetime of the process"). */
        *c = (cd_capture){++cd.next_capture, mode, pthread_self(), s, g, false, cd.captures};
        cd.captures = c;
        s->cap = c;
        cd_nodes_clear(&s->tail);
    } else {
        free(c);
        free(g);
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    CD_CALL(cuStreamBeginCapture);
    return begin_capture(hStream, mode, false);
}

CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    CD_CALL(cuStreamBeginCapture);
    return begin_capture(hStream, mode, true);
}

/* The CUDA 10.0 ABI had no mode; it captures in CU_STREAM_CAPTURE_MODE_GLOBAL, "the default mode"
 * (cuda.h does not document the old entry point). */
CUresult CUDAAPI cuStreamBeginCapture(CUstream hStream)
{
    CD_CALL(cuStreamBeginCapture);
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream hStream)
{
    CD_CALL(cuStreamBeginCapture);
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

/* Marks every node reachable backwards from the set (iteratively: captures can be long). 0, or -1
 * out of host memory. */
static int mark_from(const cd_nodes *set)
{
    cd_nodes todo = {0};
    int r = cd_nodes_copy(&todo, set);
    while (!r && todo.n) {
        cd_node *n = node_of(todo.v[--todo.n]);
        if (n->mark)
            continue;
        n->mark = true;
        for (size_t i = 0; !r && i < n->deps.n; i++)
            if (!node_of(n->deps.v[i])->mark)
                r = cd_nodes_add(&todo, n->deps.v[i]);
    }
    cd_nodes_free(&todo);
    return r;
}

/* Every stream that joined c had its last work joined back into the origin stream. */
static bool joined(cd_capture *c)
{
    if (mark_from(&c->origin->tail))
        cd_limitation("cuStreamEndCapture", "out of host memory checking the capture's joins");
    bool ok = true;
    FOR_MEMBERS(c, s)
        for (size_t i = 0; s != c->origin && i < s->tail.n; i++)
            ok &= node_of(s->tail.v[i])->mark;
    for (cd_node *n = c->graph->nodes; n; n = n->next)
        n->mark = false;
    return ok;
}

static CUresult end_capture(CUstream h, CUgraph *phGraph, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    cd_lock();
    cd_stream *s = NULL;
    r = cd_stream_get("cuStreamEndCapture", h, ptsz, &s, NULL);
    cd_capture *c = r ? NULL : s->cap;
    /* "Capture must have been initiated on hStream via a call to cuStreamBeginCapture." A stream
     * not capturing: INVALID_VALUE (cuda.h's list). */
    if (!r && (!phGraph || !c))
        r = CUDA_ERROR_INVALID_VALUE;
    /* "Capture must be ended on the same stream in which it was initiated":
     * CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "the capture was not initiated in this stream". */
    if (!r && c->origin != s) {
        cd_capture_invalidate(c);
        r = CUDA_ERROR_STREAM_CAPTURE_UNMATCHED;
    }
    /* "If the mode argument to cuStreamBeginCapture was not CU_STREAM_CAPTURE_MODE_RELAXED, this
     * call must be from the same thread as cuStreamBeginCapture." -> WRONG_THREAD; the capture goes
     * on (invalidated) for its own thread to end. */
    if (!r && c->mode != CU_STREAM_CAPTURE_MODE_RELAXED && !pthread_equal(c->owner, pthread_self())) {
        cd_capture_invalidate(c);
        r = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    }
    if (r) {
        cd_unlock();
        return r;
    }
    /* "If capture was invalidated, due to a violation of the rules of stream capture, then a NULL
     * graph will be returned." (CUDA_ERROR_STREAM_CAPTURE_INVALIDATED) An unjoined fork fails the
     * capture too: CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "the capture sequence contains a fork that was
     * not joined to the primary stream". Either way every member stream leaves capture mode
     * (Programming Guide: "All streams being captured into the same capture graph are taken out of
     * capture mode upon cudaStreamEndCapture()"). */
    if (c->invalidated)
        r = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
    else if (!joined(c))
        r = CUDA_ERROR_STREAM_CAPTURE_UNJOINED;
    FOR_MEMBERS(c, m)
    {
        m->cap = NULL;
        cd_nodes_clear(&m->tail);
    }
    for (cd_capture **pp = &cd.captures; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    if (r) {
        graph_free(c->graph);
        *phGraph = NULL;
    } else {
        c->graph->capturing = false;
        *phGraph = graph_handle(c->graph);
    }
    free(c);
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    CD_CALL(cuStreamEndCapture);
    return end_capture(hStream, phGraph, false);
}

CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    CD_CALL(cuStreamEndCapture);
    return end_capture(hStream, phGraph, true);
}

/* Status of s (lock held); IMPLICIT for the legacy stream next to a blocking capture. */
static CUresult status_of(cd_stream *s, CUstreamCaptureStatus *st)
{
    /* cuStreamIsCapturing: "if this is called on CU_STREAM_LEGACY (the "null stream") while a
     * blocking stream in the same context is capturing, it will return
     * CUDA_ERROR_STREAM_CAPTURE_IMPLICIT and *captureStatus is unspecified after the call. The
     * blocking stream capture is not invalidated." (cuStreamGetCaptureInfo says the same.) */
    if (s == &s->ctx->legacy && cd_ctx_blocking_capture(s->ctx))
        return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    *st = !s->cap ? CU_STREAM_CAPTURE_STATUS_NONE
          : s->cap->invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                : CU_STREAM_CAPTURE_STATUS_ACTIVE;
    return CUDA_SUCCESS;
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *st, bool ptsz)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_stream *s = NULL;
    r = cd_stream_get("cuStreamIsCapturing", h, ptsz, &s, NULL);
    if (!r)
        r = status_of(s, st);
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    CD_CALL(cuStreamIsCapturing);
    return is_capturing(hStream, captureStatus, false);
}

CUresult CUDAAPI cuStreamIsCapturing_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    CD_CALL(cuStreamIsCapturing);
    return is_capturing(hStream, captureStatus, true);
}

/* Every cuStreamGetCaptureInfo ABI. */
static CUresult capture_info(CUstream h, bool ptsz, CUstreamCaptureStatus *st, cuuint64_t *id_out,
                             CUgraph *graph_out, const CUgraphNode **deps_out,
                             const CUgraphEdgeData **edges_out, size_t *n_out)
{
    CUresult r = cd_check_init();
    if (r)
        return r;
    /* "captureStatus_out - Location to return the capture status of the stream; required". "If
     * edgeData_out is non-NULL then dependencies_out must be as well." */
    if (!st || (edges_out && !deps_out))
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_stream *s = NULL;
    r = cd_stream_get("cuStreamGetCaptureInfo", h, ptsz, &s, NULL);
    if (!r)
        r = status_of(s, st);
    /* "Valid data (other than capture status) is returned only if both of the following are true:
     * the call returns CUDA_SUCCESS; the returned capture status is CU_STREAM_CAPTURE_STATUS_ACTIVE".
     * The dependencies are the stream's, "valid until the next API call which operates on the
     * stream"; their edge data is all zero (no annotations), so no CUDA_ERROR_LOSSY_QUERY. */
    if (!r && *st == CU_STREAM_CAPTURE_STATUS_ACTIVE) {
        if (id_out)
            *id_out = s->cap->id;
        if (graph_out)
            *graph_out = graph_handle(s->cap->graph);
        if (deps_out)
            *deps_out = s->tail.v;
        if (edges_out)
            *edges_out = s->tail.edges;
        if (n_out)
            *n_out = s->tail.n;
    }
    cd_unlock();
    return r;
}

CUresult CUDAAPI cuStreamGetCaptureInfo(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                        cuuint64_t *id_out)
{
    CD_CALL(cuStreamGetCaptureInfo);
    return capture_info(hStream, false, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                             cuuint64_t *id_out)
{
    CD_CALL(cuStreamGetCaptureInfo);
    return capture_info(hStream, true, captureStatus_out, id_out, NULL, NULL, NULL, NULL);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v2(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out,
                                           const CUgraphNode **dependencies_out, size_t *numDependencies_out)
{
    CD_CALL(cuStreamGetCaptureInfo);
    return capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v2_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                cuuint64_t *id_out, CUgraph *graph_out,
                                                const CUgraphNode **dependencies_out,
                                                size_t *numDependencies_out)
{
    CD_CALL(cuStreamGetCaptureInfo);
    return capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out, NULL,
                        numDependencies_out);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                           cuuint64_t *id_out, CUgraph *graph_out,
                                           const CUgraphNode **dependencies_out,
                                           const CUgraphEdgeData **edgeData_out, size_t *numDependencies_out)
{
    CD_CALL(cuStreamGetCaptureInfo);
    return capture_info(hStream, false, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}

CUresult CUDAAPI cuStreamGetCaptureInfo_v3_ptsz(CUstream hStream, CUstreamCaptureStatus *captureStatus_out,
                                                cuuint64_t *id_out, CUgraph *graph_out,
                                                const CUgraphNode **dependencies_out,
                                                const CUgraphEdgeData **edgeData_out,
                                                size_t *numDependencies_out)
{
    CD_CALL(cuStreamGetCaptureInfo);
    return capture_info(hStream, true, captureStatus_out, id_out, graph_out, dependencies_out, edgeData_out,
                        numDependencies_out);
}

CUresult CUDAAPI cuGraphDestroy(CUgraph hGraph)
{
    CD_CALL(cuGraphDestroy);
    CUresult r = cd_check_init();
    if (r)
        return r;
    if (!hGraph)
        return CUDA_ERROR_INVALID_VALUE;
    cd_lock();
    cd_graph *g = cd_decode("cuGraphDestroy", hGraph, CD_TAG_GRAPH, &cd.graphs, "graph");
    /* cuStreamGetCaptureInfo: "All operations other than destroy and node removal are permitted on
     * the graph while the capture sequence is in progress." */
    if (g->capturing)
        cd_undefined("cuGraphDestroy", "graph %p is still being captured into; cuda.h, "
                     "cuStreamGetCaptureInfo: \"All operations other than destroy and node removal are "
                     "permitted on the graph while the capture sequence is in progress.\"", (void *)hGraph);
    /* "Destroys the graph specified by hGraph, as well as all of its nodes." */
    graph_free(g);
    cd_unlock();
    return CUDA_SUCCESS;
}
