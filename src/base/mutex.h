/*
 * Base layer: the futex mutex (mutex.c) behind every lock of the library.
 */
#ifndef VMM_MUTEX_H
#define VMM_MUTEX_H

#include <stdatomic.h>

#include "base/base.h"

/* The futex mutex behind vmm_lock, for other locks (live shards, thread caches). Word: 0 free,
 * 1 held, 2 held with sleepers. The fast paths are inline: one RMW each way. */
void vmm_mutex_lock_slow(_Atomic int *w);
void vmm_mutex_wake(_Atomic int *w);
static inline void vmm_mutex_lock(_Atomic int *w)
{
    int c = 0;
    if (VMM_UNLIKELY(!atomic_compare_exchange_strong_explicit(w, &c, 1, memory_order_acquire,
                                                              memory_order_relaxed)))
        vmm_mutex_lock_slow(w);
}
/* 1 when taken (never waits). */
static inline int vmm_mutex_trylock(_Atomic int *w)
{
    int c = 0;
    return atomic_compare_exchange_strong_explicit(w, &c, 1, memory_order_acquire,
                                                   memory_order_relaxed);
}
static inline void vmm_mutex_unlock(_Atomic int *w)
{
    if (VMM_UNLIKELY(atomic_exchange_explicit(w, 0, memory_order_release) == 2))
        vmm_mutex_wake(w);
}

#endif /* VMM_MUTEX_H */
