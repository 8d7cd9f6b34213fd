/*
 * Core: per-lane locks and the lane paths (lane.c).
 */
#ifndef VMM_LANE_H
#define VMM_LANE_H

#include <pthread.h>

#include "core/types.h"

/* vmm_create, configuration loaded: whether lanes may open. */
void vmm_lanes_setup(vmm_allocator *a);
/* Allocator lock held (malloc, free): open the lanes once a second thread mallocs or frees;
 * close them for good once thread caches are off for good (no lane path could run: the allocator
 * lock stops taking their locks). No-op otherwise: inline for one thread's malloc, which makes it
 * every time. */
void vmm_lanes_update_slow(vmm_allocator *a);
/* The calling thread, as a number no other live thread has: its thread pointer (what glibc's
 * pthread_self returns) read inline where the architecture allows, which spares the one-thread
 * malloc a call into libc. Never 0. */
static inline uintptr_t vmm_thread_id(void)
{
#if defined(__x86_64__) && defined(__GNUC__)
    uintptr_t tp;
    __asm__("movq %%fs:0, %0" : "=r"(tp)); /* the TCB's self pointer (x86-64 TLS ABI) */
    return tp;
#else
    return (uintptr_t)pthread_self();
#endif
}

static inline void vmm_lanes_update(vmm_allocator *a)
{
    if (VMM_LIKELY(!a->lanes_open) && (!a->lanes_watch || a->lock_owner == vmm_thread_id()))
        return;
    vmm_lanes_update_slow(a);
}
/* Lane paths, allocator lock NOT held: 1 when done on the stream's lane with its lock only, 0 when
 * the allocator must do it (nothing changed). malloc: a cached block of the small pool; free: the
 * block at ptr, which the thread cache passed on because its bin is full, and the older half of
 * that bin's blocks of the same lane (trim: the bin's block size). */
int vmm_lane_malloc(vmm_allocator *a, size_t size, vmm_stream s, void **ptr);
int vmm_lane_free(vmm_allocator *a, void *ptr, size_t trim);
/* The books a segment's blocks change: its lane's while that lane's path runs, else NULL (the
 * allocator's own counters and record cache: under the allocator lock). */
static inline vmm_books *vmm_books_of(const vmm_allocator *a, const vmm_segment *seg)
{
    return VMM_UNLIKELY(a->lanes_open) && seg->srec->bk.in_path ? &seg->srec->bk : NULL;
}

#endif /* VMM_LANE_H */
