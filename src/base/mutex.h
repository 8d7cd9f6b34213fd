/*
 * Base layer: the futex mutex (mutex.c) behind every lock of the library.
 */
#ifndef VMM_MUTEX_H
#define VMM_MUTEX_H

#include <stdatomic.h>

#include "base/base.h"

/* ---- lock ranks, checked in debug builds (jemalloc's witness) -------------------------------
 * A lock registered with a rank (core/lock.h lists them) may be waited for only while the thread
 * holds locks of lower ranks, or of its own rank when it was registered `multi` (several held at
 * once in an order of their own, such as the lanes). A wait out of order aborts, naming both
 * locks; a trylock never waits, so it is recorded but not checked (the thread caches try locks
 * against the order on purpose). Unregistered locks are not checked. Built with VMM_WITNESS
 * (Debug and sanitizer builds: CMakeLists.txt); otherwise every call below is compiled out. */
#if defined(VMM_WITNESS)
/* Register lock w of `owner` (forgotten with it); registering an address again replaces it. */
void vmm_witness_register(const void *owner, _Atomic int *w, int rank, const char *name, int multi);
/* Forget every lock of owner (its memory is about to go), and the calling thread's holds of them. */
void vmm_witness_forget(const void *owner);
void vmm_witness_wait(_Atomic int *w);    /* about to wait for w: check, then record it held */
void vmm_witness_taken(_Atomic int *w);   /* a trylock took w: record it held */
void vmm_witness_release(_Atomic int *w); /* w is released */
#else
#define vmm_witness_register(owner, w, rank, name, multi) ((void)0)
#define vmm_witness_forget(owner) ((void)0)
#define vmm_witness_wait(w) ((void)0)
#define vmm_witness_taken(w) ((void)0)
#define vmm_witness_release(w) ((void)0)
#endif

/* The futex mutex behind vmm_lock, for other locks (live shards, thread caches). Word: 0 free,
 * 1 held, 2 held with sleepers. The fast paths are inline: one RMW each way. */
void vmm_mutex_lock_slow(_Atomic int *w);
void vmm_mutex_wake(_Atomic int *w);
static inline void vmm_mutex_lock(_Atomic int *w)
{
    vmm_witness_wait(w);
    int c = 0;
    if (VMM_UNLIKELY(!atomic_compare_exchange_strong_explicit(w, &c, 1, memory_order_acquire,
                                                              memory_order_relaxed)))
        vmm_mutex_lock_slow(w);
}
/* 1 when taken (never waits). */
static inline int vmm_mutex_trylock(_Atomic int *w)
{
    int c = 0;
    int taken = atomic_compare_exchange_strong_explicit(w, &c, 1, memory_order_acquire,
                                                        memory_order_relaxed);
#if defined(VMM_WITNESS)
    if (taken)
        vmm_witness_taken(w);
#endif
    return taken;
}
static inline void vmm_mutex_unlock(_Atomic int *w)
{
    vmm_witness_release(w);
    if (VMM_UNLIKELY(atomic_exchange_explicit(w, 0, memory_order_release) == 2))
        vmm_mutex_wake(w);
}

#endif /* VMM_MUTEX_H */
