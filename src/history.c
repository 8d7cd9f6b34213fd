/*
 * History: a fixed ring of the allocator's last events (PyTorch's device trace). The ring is
 * written under the allocator's lock by the hooks (VMM_HISTORY in internal.h) and copied out
 * under it too, so it needs no locking of its own.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "internal.h"

struct vmm_history {
    vmm_trace_entry *ring;
    size_t cap;   /* entries the ring holds at most */
    size_t head;  /* index of the oldest entry */
    size_t n;     /* entries held */
};

/* A ring entry must stay small: the hooks copy one per event on the malloc path. */
_Static_assert(sizeof(vmm_trace_entry) <= 40, "trace entry grew");

static const char *const action_names[VMM_TRACE_ACTION_COUNT] = {
    [VMM_TRACE_ALLOC] = "alloc",
    [VMM_TRACE_FREE_REQUESTED] = "free_requested",
    [VMM_TRACE_FREE_COMPLETED] = "free_completed",
    [VMM_TRACE_SEGMENT_ALLOC] = "segment_alloc",
    [VMM_TRACE_SEGMENT_FREE] = "segment_free",
    [VMM_TRACE_SEGMENT_MAP] = "segment_map",
    [VMM_TRACE_SEGMENT_UNMAP] = "segment_unmap",
    [VMM_TRACE_OOM] = "oom",
};

VMM_API const char *vmm_trace_action_name(int action)
{
    if (action < 0 || action >= VMM_TRACE_ACTION_COUNT)
        return "unknown";
    return action_names[action];
}

uint64_t vmm_history_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void vmm_history_add(vmm_allocator *a, int action, uintptr_t addr, size_t size, vmm_stream s)
{
    struct vmm_history *h = a->history;
    size_t i = h->head + h->n;
    if (i >= h->cap)
        i -= h->cap;
    if (h->n == h->cap) { /* full: overwrite the oldest */
        h->head = h->head + 1 == h->cap ? 0 : h->head + 1;
    } else {
        h->n++;
    }
    vmm_trace_entry *e = &h->ring[i];
    e->action = action;
    e->addr = addr;
    e->size = size;
    e->stream = s;
    e->time_us = (vmm_history_now_ns() - a->t0_ns) / 1000u;
}

/* Copy the newest min(n, max) entries, oldest first. */
static size_t ring_copy(const struct vmm_history *h, vmm_trace_entry *out, size_t max)
{
    size_t k = h->n < max ? h->n : max;
    size_t skip = h->n - k;
    for (size_t j = 0; j < k; j++) {
        size_t i = h->head + skip + j;
        out[j] = h->ring[i >= h->cap ? i - h->cap : i];
    }
    return k;
}

static void history_free(vmm_allocator *a, struct vmm_history *h)
{
    if (!h)
        return;
    vmm_meta_free(a->meta, h->ring, h->cap * sizeof *h->ring);
    vmm_meta_free(a->meta, h, sizeof *h);
}

VMM_API int vmm_record_history(vmm_allocator *a, size_t max_entries)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_record_history: allocator is NULL");
    if (max_entries > SIZE_MAX / sizeof(vmm_trace_entry))
        return vmm_fail(VMM_EINVAL, "vmm_record_history: %zu entries is too many", max_entries);
    struct vmm_history *h = NULL;
    if (max_entries) {
        /* allocated outside the lock; a large ring can take a while to zero */
        h = vmm_meta_alloc(a->meta, sizeof *h);
        vmm_trace_entry *ring = vmm_meta_alloc(a->meta, max_entries * sizeof *ring);
        if (!h || !ring) {
            if (h)
                vmm_meta_free(a->meta, h, sizeof *h);
            if (ring)
                vmm_meta_free(a->meta, ring, max_entries * sizeof *ring);
            return vmm_fail(VMM_EHOSTMEM, "vmm_record_history: out of host memory for %zu entries",
                            max_entries);
        }
        h->ring = ring;
        h->cap = max_entries;
    }
    vmm_lock(a);
    struct vmm_history *old = a->history;
    if (h && old)
        h->n = ring_copy(old, h->ring, h->cap);
    a->history = h;
    vmm_unlock(a);
    history_free(a, old);
    return VMM_OK;
}

int vmm_history_copy(vmm_allocator *a, vmm_trace_entry **out, size_t *n)
{
    *out = NULL;
    *n = 0;
    struct vmm_history *h = a->history;
    if (!h || !h->n)
        return VMM_OK;
    vmm_trace_entry *e = vmm_meta_alloc(a->meta, h->n * sizeof *e);
    if (!e)
        return VMM_EHOSTMEM;
    *out = e;
    *n = ring_copy(h, e, h->n);
    return VMM_OK;
}

VMM_API int64_t vmm_history_get(vmm_allocator *a, vmm_trace_entry *out, size_t max)
{
    if (!a || (!out && max))
        return vmm_fail(VMM_EINVAL, "vmm_history_get: %s is NULL", a ? "out" : "allocator");
    vmm_lock(a);
    size_t n = 0;
    if (a->history) {
        n = a->history->n;
        ring_copy(a->history, out, max);
    }
    vmm_unlock(a);
    return (int64_t)n;
}

VMM_API int vmm_history_csv(vmm_allocator *a, const char *path)
{
    if (!a || !path)
        return vmm_fail(VMM_EINVAL, "vmm_history_csv: %s is NULL", a ? "path" : "allocator");
    vmm_lock(a);
    vmm_trace_entry *e = NULL;
    size_t n = 0;
    int rc = vmm_history_copy(a, &e, &n);
    vmm_unlock(a);
    if (rc)
        return vmm_fail(VMM_EHOSTMEM, "vmm_history_csv: out of host memory for a copy of the ring");
    FILE *f = fopen(path, "w");
    if (!f) {
        int err = errno;
        if (e)
            vmm_meta_free(a->meta, e, n * sizeof *e);
        return vmm_fail(VMM_EINVAL, "vmm_history_csv: cannot write %s: %s", path, strerror(err));
    }
    fputs("action,addr,size,stream,time_us\n", f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s,0x%" PRIxPTR ",%zu,0x%" PRIxPTR ",%" PRIu64 "\n",
                vmm_trace_action_name(e[i].action), e[i].addr, e[i].size, (uintptr_t)e[i].stream,
                e[i].time_us);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    if (e)
        vmm_meta_free(a->meta, e, n * sizeof *e);
    if (bad)
        return vmm_fail(VMM_EINVAL, "vmm_history_csv: error writing %s", path);
    return VMM_OK;
}

void vmm_history_destroy(vmm_allocator *a)
{
    history_free(a, a->history);
    a->history = NULL;
}
