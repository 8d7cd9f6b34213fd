/*
 * Lock ranks checked at run time in debug builds (VMM_WITNESS; see base/mutex.h), as jemalloc's
 * witness: each thread keeps the registered locks it holds, and waiting for a lock of a rank not
 * above every held one aborts with both names. Release builds compile none of it.
 *
 * The table of registered locks is read on every lock operation by every thread, so it takes no
 * lock of its own: a lock of its own would order the threads' operations for the thread
 * sanitizer and hide the races it is there to find. Open addressing over the lock's address with
 * atomic (relaxed) entries; an entry is published by a CAS on its key, after its rank and name,
 * and a lock is registered before any other thread can reach it.
 */
#include "base/mutex.h"

#if defined(VMM_WITNESS)
#include <execinfo.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

enum { SLOTS = 1 << 16, HELD_MAX = 64 };
#define TOMB ((uintptr_t)1)

typedef struct {
    _Atomic uintptr_t key;              /* the lock's address; 0 never used, TOMB forgotten */
    _Atomic(const void *) owner;
    _Atomic int rank;
    _Atomic int multi;
    _Atomic(const char *) name;
} slot;

static slot tab[SLOTS];

typedef struct {
    _Atomic int *w;
    const void *owner;
    int rank, multi;
    const char *name;
} held_lock;

static _Thread_local held_lock held[HELD_MAX];
static _Thread_local int n_held;

static size_t hash(const void *w)
{
    uint64_t x = (uint64_t)(uintptr_t)w;
    x ^= x >> 29;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 32;
    return (size_t)x & (SLOTS - 1);
}

static slot *find(const _Atomic int *w)
{
    uintptr_t k = (uintptr_t)w;
    for (size_t i = hash(w), n = 0; n < SLOTS; i = (i + 1) & (SLOTS - 1), n++) {
        uintptr_t cur = atomic_load_explicit(&tab[i].key, memory_order_relaxed);
        if (cur == k)
            return &tab[i];
        if (cur == 0)
            return NULL;
    }
    return NULL;
}

void vmm_witness_register(const void *owner, _Atomic int *w, int rank, const char *name, int multi)
{
    slot *s = find(w);
    if (!s) {
        for (size_t i = hash(w), n = 0;; i = (i + 1) & (SLOTS - 1), n++) {
            if (n == SLOTS) {
                fprintf(stderr, "vmmalloc: lock witness: more than %d locks registered\n", SLOTS);
                abort();
            }
            uintptr_t cur = atomic_load_explicit(&tab[i].key, memory_order_relaxed);
            if (cur != 0 && cur != TOMB)
                continue;
            atomic_store_explicit(&tab[i].owner, owner, memory_order_relaxed);
            atomic_store_explicit(&tab[i].rank, rank, memory_order_relaxed);
            atomic_store_explicit(&tab[i].multi, multi, memory_order_relaxed);
            atomic_store_explicit(&tab[i].name, name, memory_order_relaxed);
            if (atomic_compare_exchange_strong_explicit(&tab[i].key, &cur, (uintptr_t)w,
                                                        memory_order_release, memory_order_relaxed))
                return;
        }
    }
    atomic_store_explicit(&s->owner, owner, memory_order_relaxed);
    atomic_store_explicit(&s->rank, rank, memory_order_relaxed);
    atomic_store_explicit(&s->multi, multi, memory_order_relaxed);
    atomic_store_explicit(&s->name, name, memory_order_relaxed);
}

void vmm_witness_forget(const void *owner)
{
    for (size_t i = 0; i < SLOTS; i++) {
        uintptr_t cur = atomic_load_explicit(&tab[i].key, memory_order_relaxed);
        if (cur > TOMB && atomic_load_explicit(&tab[i].owner, memory_order_relaxed) == owner)
            atomic_store_explicit(&tab[i].key, TOMB, memory_order_relaxed);
    }
    /* locks of owner that this thread still holds go too: vmm_destroy frees the lane records
     * before its last vmm_unlock, which then has no lane left to let go */
    for (int i = n_held - 1; i >= 0; i--)
        if (held[i].owner == owner)
            held[i] = held[--n_held];
}

static void push(_Atomic int *w, const slot *s)
{
    if (n_held == HELD_MAX) {
        fprintf(stderr, "vmmalloc: lock witness: more than %d locks held by one thread\n", HELD_MAX);
        abort();
    }
    held[n_held++] = (held_lock){w, atomic_load_explicit(&s->owner, memory_order_relaxed),
                                 atomic_load_explicit(&s->rank, memory_order_relaxed),
                                 atomic_load_explicit(&s->multi, memory_order_relaxed),
                                 atomic_load_explicit(&s->name, memory_order_relaxed)};
}

void vmm_witness_wait(_Atomic int *w)
{
    const slot *s = find(w);
    if (!s)
        return;
    int rank = atomic_load_explicit(&s->rank, memory_order_relaxed);
    int multi = atomic_load_explicit(&s->multi, memory_order_relaxed);
    for (int i = 0; i < n_held; i++) {
        if (held[i].rank < rank || (held[i].rank == rank && multi && held[i].w != w))
            continue;
        fprintf(stderr, "vmmalloc: lock order violated: waiting for %s (rank %d, %p) while holding "
                        "%s (rank %d, %p); ranks: core/lock.h\n",
                atomic_load_explicit(&s->name, memory_order_relaxed), rank, (void *)w,
                held[i].name, held[i].rank, (void *)held[i].w);
        void *frames[32];
        backtrace_symbols_fd(frames, backtrace(frames, 32), 2);
        abort();
    }
    push(w, s);
}

void vmm_witness_taken(_Atomic int *w)
{
    const slot *s = find(w);
    if (s)
        push(w, s);
}

void vmm_witness_release(_Atomic int *w)
{
    for (int i = n_held - 1; i >= 0; i--)
        if (held[i].w == w) {
            held[i] = held[--n_held];
            return;
        }
}
#else
typedef int vmm_witness_off_; /* ISO C wants something in a translation unit */
#endif
