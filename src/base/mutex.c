/*
 * The futex mutex behind the allocator lock, the live shards' and the thread caches' locks (the
 * inline fast paths are in the header). "Futexes Are Tricky", mutex 3. Lock word: 0 free, 1 held,
 * 2 held and a thread may sleep. pthread_mutex costs a type dispatch plus an RMW per lock and per
 * unlock; a malloc + free pair takes the lock twice, and on the dev VM the mutex was ~40% of the
 * pair. This lock keeps one RMW each way, which is what correctness needs: an unlock must see a
 * waiter's 2 to wake it. Waiters spin first, because critical sections on the cached path last
 * ~50 ns and a futex sleep costs microseconds.
 */
#include <linux/futex.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/mutex.h"

enum { LOCK_SPINS = 100 }; /* ~1 us of pause loops: a few critical sections' worth */

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

void vmm_mutex_lock_slow(_Atomic int *w)
{
    for (int i = 0; i < LOCK_SPINS; i++) {
        int c = 0;
        if (atomic_load_explicit(w, memory_order_relaxed) == 0 &&
            atomic_compare_exchange_weak_explicit(w, &c, 1, memory_order_acquire, memory_order_relaxed))
            return;
        cpu_relax();
    }
    /* mark it contended: an unlock that sees 2 wakes a sleeper */
    while (atomic_exchange_explicit(w, 2, memory_order_acquire) != 0) {
        syscall(SYS_futex, (int *)w, FUTEX_WAIT_PRIVATE, 2, NULL, NULL, 0);
    }
}

void vmm_mutex_wake(_Atomic int *w)
{
    /* the unlock's one RMW saw 2: whoever marked the word (may sleep) is woken */
    syscall(SYS_futex, (int *)w, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}
