/*
 * Thread caches: per thread and allocator, the small blocks the thread freed, kept for its next
 * malloc of the same rounded size on the same stream, so that a cached malloc + free pair takes no
 * lock another thread needs (issue 13: two threads on one allocator got less done than one).
 *
 * What a cache may hold: allocated blocks of the small pool up to TC_MAX_SIZE bytes with no
 * record_stream uses and no group, of at most TC_LANES streams (a thread driving more keeps none:
 * tc_lane_check). A cached block stays ALLOCATED in the allocator's books (its
 * live-table slot, its segment's block list), so nothing the allocator lock guards changes when a
 * block enters or leaves a cache; a cache's bins say which blocks it holds, under its own lock.
 * The user-visible counters move by a per-cache delta that the allocator folds in under its lock
 * (vmm_tc_fold) before it reports stats, and that a thread folds before its own slow path.
 *
 * A free reads and writes only the block's live-table slot (vmm_live_slot: size step, lane key,
 * requested bytes) and this thread's cache: at 10^6 live blocks the record is one more cache miss
 * (the ring pattern: ~460 ns a pair with it, ~230 without). It marks the slot with the cache's number
 * (tc_owner), which a malloc from the cache leaves stale: a double free is a slot naming this
 * cache whose bin holds the block. A slot naming another cache: the free tries that cache's lock,
 * and when its bins do not hold the block, the block is live and this cache keeps it
 * (named_elsewhere_live); else (busy, or held: a double free) the allocator asks that cache
 * (vmm_tc_holds) and takes the slot out of the table under that cache's lock (vmm_tc_take_live),
 * so that a free racing it into the cache cannot fall between the two. Retired caches are kept
 * for new threads, never freed before vmm_destroy: a free may read a number whose cache retired
 * meanwhile. A malloc writes the slot only when its size differs from the requested bytes the
 * slot has.
 *
 * Locks, in order: the registry mutex (thread exit, cache creation, vmm_destroy), the allocator
 * lock (or a lane's), a cache's lock, the depot's lock (below), a live shard's lock. A fast path
 * takes its cache's lock and one live shard's; it never takes the allocator lock while holding its
 * cache's. A free takes the shard's lock first and only tries its cache's, and the cache the slot
 * names (busy: the allocator does the free).
 *
 * Peaks: a thread's fast paths cannot see what other threads' caches hold, so with several
 * threads the peaks of allocation / allocated_bytes / requested_bytes / active may be off by the
 * bytes other threads' caches held (at most thread_cache each). With one thread they are exact.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/errors.h"
#include "base/mutex.h"
#include "core/counters.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/tcache.h"
#include "core/types.h"

enum {
    TC_STEP = VMM_TC_STEP,              /* bins at the rounding step (pool.c MIN_BLOCK) */
    TC_MAX_SIZE = VMM_TC_MAX_SIZE,      /* largest block cached (internal.h) */
    TC_BINS = VMM_TC_BINS,              /* one bin per rounded size: 128 */
    TC_BIN_CAP = 16,                    /* blocks per bin: a bin is a random walk between empty
                                         * and full, so at 16 about 1 malloc in 17 of a balanced mix
                                         * finds it empty when nothing else empties it */
    TL_SLOTS = 8,                       /* allocators a thread holds a cache of at once */
    TC_MAX_NUM = UINT16_MAX,            /* cache numbers 1..this (vmm_live_slot.tc_owner) */
    TC_CAP_SHARE = 512,                 /* a cache may hold up to 1/this of the small pool's
                                         * allocated bytes when that exceeds thread_cache: with
                                         * 10^6 live blocks of 0.5-64 KiB (13 GiB), 4 MiB held
                                         * 0.03% of them and a malloc missed the cache twice as
                                         * often as with 16-32 MiB (docs/benchmarks.md) */
    TC_LANES = 2,                       /* lanes (streams) one cache serves (tc_lane_check) */
    TC_REARM = 1 << 16,                 /* frees on one lane in a row that turn a spread cache
                                         * back on (tc_lane_check) */
};

/* A cached block: what a malloc from the cache needs of it besides its address, so that it
 * touches neither the block's record nor its live-table slot (with 10^6 live blocks both are
 * cold). */
typedef struct tc_entry {
    vmm_block *b;
    vmm_stream key;                     /* its lane: a malloc finds its stream's block */
    uint32_t req;                       /* its requested bytes, which its slot has too: a malloc
                                         * of another size writes both (vmm_live_set_requested) */
} tc_entry;

typedef struct tc_bin {
    uint32_t n;
    uintptr_t addr[TC_BIN_CAP];         /* LIFO: the last freed is the warmest. Apart from e: a
                                         * free's double-free check reads these two lines only */
    tc_entry e[TC_BIN_CAP];             /* e[i]: addr[i]'s */
} tc_bin;


/* Counters the fast paths moved since the last fold, for allocation, allocated_bytes and
 * requested_bytes of the small pool: ups, downs, and the highest running net (for peaks). */
enum { TC_ALLOCATION, TC_BYTES, TC_REQUESTED, TC_NSTATS };
/* How the fast paths fared: mallocs served / not, frees kept / not (the allocator's to do), and of
 * those kept, the blocks another cache had handed out (named_elsewhere_live). */
enum { TC_HIT, TC_MISS, TC_KEPT, TC_PASSED, TC_KEPT_OTHERS, TC_NCOUNTS };
_Static_assert((int)TC_NCOUNTS == (int)VMM_TC_COUNTS, "vmm_tc_info's counts");
typedef struct tc_delta {
    int64_t up, down, net, max_net;
} tc_delta;

struct vmm_tcache {
    _Alignas(64) _Atomic int lock;
    vmm_allocator *a;
    size_t bytes;                       /* bytes of the blocks held */
    _Atomic int dirty;                  /* deltas not folded yet (relaxed: the owner peeks) */
    tc_delta d[TC_NSTATS];
    uint64_t n[TC_NCOUNTS];             /* since the last fold */
    uint64_t past_kept, past_hits;      /* frees kept and mallocs served before it, halved at
                                         * each fold (frees_others_blocks) */
    struct vmm_tcache *next;            /* the allocator's list (allocator lock) */
    uint16_t num;                       /* this cache's number (tc_owner in the live table); 0:
                                         * none left, the cache takes no frees */
    _Atomic uint32_t held;              /* the depot's: blocks it holds, read without its lock */
    /* The lanes of the frees it took (tc_lane_check), and whether a free came on one more
     * (spread: it takes no frees and serves no mallocs); run: frees in a row on lanes[0] since
     * it spread */
    vmm_stream lanes[TC_LANES];
    unsigned n_lanes;
    int spread;
    uint32_t run;
    tc_bin bins[TC_BINS];
};

/* Cache numbers: the table grows by doubling into a new one, and the old ones stay until
 * vmm_destroy, so that a free reading one with no lock never reads freed memory. */
typedef struct num_table {
    struct num_table *older;
    size_t cap;
    _Atomic(vmm_tcache *) c[];
} num_table;

struct vmm_tc_state {
    /* read by every fast path: this line is written only by vmm_tc_off / pause / resume */
    _Alignas(64) _Atomic int on;        /* fast paths allowed */
    int off;                            /* off for good (vmm_tc_off): lane.c closes its lanes */
    uint64_t id;                        /* unique per vmm_create: tells a thread's slot for a
                                         * destroyed allocator from one at the same address */
    size_t cap_bytes;                   /* thread_cache key: the least of cap */
    _Atomic size_t cap;                 /* most bytes one cache holds: cap_bytes, or a power of
                                         * two near 1/TC_CAP_SHARE of the small pool's allocated
                                         * bytes when more; set by folds, when it changes */
    int simple_round;                   /* sizes up to TC_MAX_SIZE round up to 512 B steps */
    vmm_tc_release_fn release;          /* gives a drained block back (alloc.c) */
    vmm_tcache *depot;                  /* blocks one thread's full bins pass to other threads'
                                         * empty ones while lanes are open (depot_put); lives
                                         * as long as the allocator, in no thread's slots */
    /* written under the allocator lock (folds, new caches): a line of its own, or every fold would
     * take the line above from the other threads' caches */
    _Alignas(64) vmm_tcache *list;      /* every cache */
    size_t n;
    num_table *_Atomic nums;            /* nums->c[k]: the cache numbered k, or NULL. Frees
                                         * read it with no lock (vmm_tc_free) */
    vmm_tcache *spare;                  /* retired caches, for the next new thread: never freed
                                         * before vmm_destroy, as a free may be trying its lock */
    uint64_t counts[TC_NCOUNTS];        /* folded counts of every cache */
};

/* ---- the registry: live allocators, for thread exit and slot reuse ------------------------ */

typedef struct tl_slot {
    vmm_allocator *a;
    uint64_t id;
    vmm_tcache *tc;
} tl_slot;

/* The thread's slots, made with its first cache, are the value of a pthread key (whose destructor
 * gives the caches back at thread exit), and the fast paths find them through a _Thread_local
 * copy (tl_mine): pthread_getspecific, a call into libc of ~17 instructions, was 1.3 ns of the
 * cached pair's 25.5 (docs/benchmarks.md, "Latency"). Linked into a program the access is one
 * load; the shared library is built with TLS descriptors (-mtls-dialect=gnu2, CMakeLists.txt),
 * where an access is a call returning the offset instead of __tls_get_addr, and a dlopen past
 * glibc's static TLS surplus (Python) falls back to dynamic TLS instead of failing to load as the
 * initial-exec model did. A shared library built without them (VMM_SLOTS_BY_KEY: a compiler
 * without -mtls-dialect=gnu2, such as clang 14) reads the key as before: there the _Thread_local
 * cost a __tls_get_addr call per access, 27.7 ns a pair against 25.9-26.8. */

typedef struct reg_entry {
    vmm_allocator *a;
    uint64_t id;
} reg_entry;

static pthread_mutex_t reg_mu = PTHREAD_MUTEX_INITIALIZER;
static reg_entry *reg;
static size_t reg_n, reg_cap;
static _Atomic uint64_t next_id = 1;
static pthread_key_t exit_key;
static pthread_once_t exit_once = PTHREAD_ONCE_INIT;
static _Atomic int exit_key_made;

#if defined(VMM_SLOTS_BY_KEY)
static inline tl_slot *slots_get(void)
{
    if (VMM_UNLIKELY(!atomic_load_explicit(&exit_key_made, memory_order_acquire)))
        return NULL;
    return pthread_getspecific(exit_key);
}
static inline void slots_set(tl_slot *s) { (void)s; }
#else
static _Thread_local tl_slot *tl_mine; /* the key's value, NULL from its destructor on */

static inline tl_slot *slots_get(void)
{
    return tl_mine;
}
static inline void slots_set(tl_slot *s) { tl_mine = s; }
#endif

/* Caller holds reg_mu. */
static int reg_alive(const vmm_allocator *a, uint64_t id)
{
    for (size_t i = 0; i < reg_n; i++)
        if (reg[i].a == a && reg[i].id == id)
            return 1;
    return 0;
}

/* Take cache tc out of its allocator (registry and allocator locks held): blocks back, deltas
 * folded, record freed. */
static void cache_retire(vmm_allocator *a, vmm_tcache *tc)
{
    vmm_tc_drain_one(a, tc);
    vmm_tc_state *T = a->tcs;
    if (tc->num) /* slots naming it find no cache there (or a later one) */
        atomic_store_explicit(&atomic_load_explicit(&T->nums, memory_order_relaxed)->c[tc->num], NULL,
                              memory_order_release);
    for (vmm_tcache **pp = &T->list; *pp; pp = &(*pp)->next)
        if (*pp == tc) {
            *pp = tc->next;
            T->n--;
            break;
        }
    /* kept, not freed: a free that read its number may be trying its lock (vmm_tc_free), and
     * finds number 0 under it */
    vmm_mutex_lock(&tc->lock);
    tc->num = 0;
    vmm_mutex_unlock(&tc->lock);
    tc->next = T->spare;
    T->spare = tc;
}

/* Thread exit (arg: the thread's slots): every cache of a live allocator goes back to it. */
static void on_thread_exit(void *arg)
{
    tl_slot *slots = arg;
    slots_set(NULL);
    pthread_mutex_lock(&reg_mu);
    for (int i = 0; i < TL_SLOTS; i++) {
        tl_slot *s = &slots[i];
        if (s->a && reg_alive(s->a, s->id)) {
            vmm_lock(s->a);
            cache_retire(s->a, s->tc);
            vmm_unlock(s->a);
        }
    }
    pthread_mutex_unlock(&reg_mu);
    free(slots); /* the key's value is NULL already (glibc clears it before the destructor) */
}

static void make_exit_key(void)
{
    if (pthread_key_create(&exit_key, on_thread_exit) == 0)
        atomic_store_explicit(&exit_key_made, 1, memory_order_release);
}

static void cache_number(vmm_tc_state *T, vmm_tcache *tc);

static void nums_free(vmm_tc_state *T)
{
    num_table *t = atomic_load_explicit(&T->nums, memory_order_relaxed);
    while (t) {
        num_table *older = t->older;
        free(t);
        t = older;
    }
}

int vmm_tc_setup(vmm_allocator *a, size_t cap_bytes, int simple_round, int depot,
                 vmm_tc_release_fn release)
{
    vmm_tc_state *T = aligned_alloc(64, (sizeof *T + 63) / 64 * 64);
    if (!T)
        return vmm_fail(VMM_EHOSTMEM, "vmm_create: out of host memory");
    memset(T, 0, sizeof *T);
    T->id = atomic_fetch_add(&next_id, 1);
    T->cap_bytes = cap_bytes;
    atomic_init(&T->cap, cap_bytes);
    T->simple_round = simple_round;
    T->release = release;
    atomic_init(&T->on, cap_bytes > 0);
    if (cap_bytes && depot) {
        T->depot = aligned_alloc(64, (sizeof *T->depot + 63) / 64 * 64);
        if (T->depot) {
            memset(T->depot, 0, sizeof *T->depot);
            T->depot->a = a;
            vmm_witness_register(a, &T->depot->lock, VMM_RANK_DEPOT, "the depot's lock", 0);
            cache_number(T, T->depot); /* no other thread knows a yet */
            if (!T->depot->num) {
                free(T->depot);
                T->depot = NULL;
            }
        }
        if (!T->depot) {
            nums_free(T);
            free(T);
            return vmm_fail(VMM_EHOSTMEM, "vmm_create: out of host memory");
        }
    }
    pthread_mutex_lock(&reg_mu);
    if (reg_n == reg_cap) {
        size_t ncap = reg_cap ? 2 * reg_cap : 16;
        reg_entry *nr = realloc(reg, ncap * sizeof *nr);
        if (!nr) {
            pthread_mutex_unlock(&reg_mu);
            free(T->depot);
            nums_free(T);
            free(T);
            return vmm_fail(VMM_EHOSTMEM, "vmm_create: out of host memory");
        }
        reg = nr;
        reg_cap = ncap;
    }
    reg[reg_n++] = (reg_entry){a, T->id};
    pthread_mutex_unlock(&reg_mu);
    a->tcs = T;
    return VMM_OK;
}

void vmm_tc_unregister(vmm_allocator *a)
{
    if (!a->tcs)
        return;
    pthread_mutex_lock(&reg_mu);
    for (size_t i = 0; i < reg_n; i++)
        if (reg[i].a == a && reg[i].id == a->tcs->id) {
            reg[i] = reg[--reg_n];
            break;
        }
    if (!reg_n) {
        free(reg);
        reg = NULL;
        reg_cap = 0;
    }
    pthread_mutex_unlock(&reg_mu);
}

void vmm_tc_destroy(vmm_allocator *a)
{
    vmm_tc_state *T = a->tcs;
    if (!T)
        return;
    while (T->list) {
        vmm_tcache *tc = T->list;
        vmm_tc_drain_one(a, tc);
        T->list = tc->next;
        free(tc);
    }
    while (T->spare) {
        vmm_tcache *tc = T->spare;
        T->spare = tc->next;
        free(tc);
    }
    if (T->depot) {
        vmm_tc_drain_one(a, T->depot);
        free(T->depot);
    }
    nums_free(T);
    free(T);
    a->tcs = NULL;
}

/* Give tc the lowest free number (allocator lock held); none left or out of memory: 0, and tc
 * takes no frees. Numbers of retired caches are given again: a slot naming one is a hint only. */
static void cache_number(vmm_tc_state *T, vmm_tcache *tc)
{
    num_table *t = atomic_load_explicit(&T->nums, memory_order_relaxed);
    size_t k = 1;
    while (t && k < t->cap && atomic_load_explicit(&t->c[k], memory_order_relaxed))
        k++;
    if (k > TC_MAX_NUM)
        return;
    if (!t || k >= t->cap) {
        size_t old = t ? t->cap : 0, ncap = old ? 2 * old : 16;
        num_table *nt = malloc(sizeof *nt + ncap * sizeof nt->c[0]);
        if (!nt)
            return;
        nt->older = t;
        nt->cap = ncap;
        for (size_t i = 0; i < ncap; i++)
            atomic_init(&nt->c[i], i < old ? atomic_load_explicit(&t->c[i], memory_order_relaxed) : NULL);
        atomic_store_explicit(&T->nums, nt, memory_order_release);
        t = nt;
    }
    /* under its lock: a retired cache given again may be under a free's trylock (vmm_tc_free) */
    vmm_mutex_lock(&tc->lock);
    tc->num = (uint16_t)k;
    vmm_mutex_unlock(&tc->lock);
    atomic_store_explicit(&t->c[k], tc, memory_order_release);
}

/* This thread's cache for a, made on first use; NULL when caches are off or out of memory. Takes
 * the registry and allocator locks when it makes one (caller holds neither). */
static vmm_tcache *cache_make(vmm_allocator *a)
{
    vmm_tc_state *T = a->tcs;
    vmm_tcache *tc = aligned_alloc(64, (sizeof *tc + 63) / 64 * 64);
    if (!tc)
        return NULL;
    memset(tc, 0, sizeof *tc);
    tc->a = a;
    vmm_witness_register(a, &tc->lock, VMM_RANK_CACHE, "a thread cache's lock", 0);
    (void)pthread_once(&exit_once, make_exit_key);
    tl_slot *tl_slots = slots_get();
    if (!tl_slots) {
        tl_slot *slots = calloc(TL_SLOTS, sizeof *slots);
        /* the key's destructor gets the slots at this thread's exit */
        if (!slots || !atomic_load(&exit_key_made) || pthread_setspecific(exit_key, slots) != 0) {
            free(slots);
            free(tc);
            return NULL;
        }
        slots_set(slots);
        tl_slots = slots;
    }
    pthread_mutex_lock(&reg_mu);
    /* a slot: an empty one, one for an allocator since destroyed, else the least recent */
    int pick = -1;
    for (int i = 0; i < TL_SLOTS && pick < 0; i++)
        if (!tl_slots[i].a || !reg_alive(tl_slots[i].a, tl_slots[i].id))
            pick = i;
    if (pick < 0) {
        pick = TL_SLOTS - 1;
        tl_slot *s = &tl_slots[pick];
        vmm_lock(s->a);
        cache_retire(s->a, s->tc);
        vmm_unlock(s->a);
    }
    vmm_lock(a);
    vmm_tcache *fresh = NULL, *sp = T->spare;
    if (sp) {
        /* a retired cache: cleared under its lock, which a free may be trying (vmm_tc_free) */
        T->spare = sp->next;
        vmm_mutex_lock(&sp->lock);
        memset((char *)sp + offsetof(vmm_tcache, a), 0, sizeof *sp - offsetof(vmm_tcache, a));
        sp->a = a;
        vmm_mutex_unlock(&sp->lock);
        fresh = tc;
        tc = sp;
    }
    /* most recent first: move the others down one */
    memmove(&tl_slots[1], &tl_slots[0], (size_t)pick * sizeof tl_slots[0]);
    tl_slots[0] = (tl_slot){a, T->id, tc};
    tc->next = T->list;
    T->list = tc;
    T->n++;
    cache_number(T, tc);
    vmm_unlock(a);
    pthread_mutex_unlock(&reg_mu);
    free(fresh);
    return tc;
}

/* This thread's cache for a, NULL when it has none. */
static inline vmm_tcache *cache_find(const vmm_allocator *a, uint64_t id)
{
    const tl_slot *sl = slots_get();
    if (VMM_UNLIKELY(!sl))
        return NULL;
    for (int i = 0; i < TL_SLOTS; i++)
        if (sl[i].a == a && sl[i].id == id)
            return sl[i].tc;
    return NULL;
}

/* The calling thread's cache, made when missing, not locked; NULL when caches are off. */
static inline vmm_tcache *cache_get(vmm_allocator *a)
{
    vmm_tc_state *T = a->tcs;
    if (!atomic_load_explicit(&T->on, memory_order_relaxed))
        return NULL;
    vmm_tcache *tc = cache_find(a, T->id);
    if (VMM_UNLIKELY(!tc))
        tc = cache_make(a);
    return tc;
}

/* After taking tc's lock: 1 when caches are still on. Pause / off clear `on` before they drain
 * under each cache's lock, so it is seen here. Acquire: a resume's release store orders what the
 * pausing thread read before it. */
static inline int cache_still_on(vmm_allocator *a)
{
    return atomic_load_explicit(&a->tcs->on, memory_order_acquire);
}

/* The calling thread's cache, made when missing, locked; NULL when caches are off. */
static inline vmm_tcache *cache_lock(vmm_allocator *a)
{
    vmm_tcache *tc = cache_get(a);
    if (!tc)
        return NULL;
    vmm_mutex_lock(&tc->lock);
    if (VMM_UNLIKELY(!cache_still_on(a))) {
        vmm_mutex_unlock(&tc->lock);
        return NULL;
    }
    return tc;
}

/* A relaxed store (a plain one on x86), and only when clean: no RMW on the fast path. */
static inline void mark_dirty(vmm_tcache *tc)
{
    if (!atomic_load_explicit(&tc->dirty, memory_order_relaxed))
        atomic_store_explicit(&tc->dirty, 1, memory_order_relaxed);
}

static inline void delta_up(tc_delta *d, int64_t x)
{
    d->up += x;
    d->net += x;
    if (d->net > d->max_net)
        d->max_net = d->net;
}

static inline void delta_down(tc_delta *d, int64_t x)
{
    d->down += x;
    d->net -= x;
}

/* Bytes of each block in bin. */
static inline size_t bin_size(const vmm_tcache *tc, const tc_bin *bin)
{
    return (size_t)(bin - tc->bins + 1) * TC_STEP;
}

/* Take entry k out of bin, whose blocks are `size` bytes (the others keep their order: oldest at
 * the bottom, which the trims' "older half" relies on); the block is no longer cached. Caller
 * holds tc's lock. */
static inline tc_entry bin_take_sized(vmm_tcache *tc, tc_bin *bin, uint32_t k, uintptr_t *addr,
                                      size_t size)
{
    tc_entry e = bin->e[k];
    *addr = bin->addr[k];
    /* a malloc takes the newest, at the top: no move (a loop: a bin is short) */
    for (uint32_t i = k + 1; i < bin->n; i++) {
        bin->e[i - 1] = bin->e[i];
        bin->addr[i - 1] = bin->addr[i];
    }
    bin->n--;
    tc->bytes -= size;
    return e;
}

/* The same, the size from the bin's place (a division by sizeof(tc_bin): off the malloc path). */
static tc_entry bin_take(vmm_tcache *tc, tc_bin *bin, uint32_t k, uintptr_t *addr)
{
    return bin_take_sized(tc, bin, k, addr, bin_size(tc, bin));
}

/* The depot's count of blocks, which mallocs read without its lock (its lock held). */
static inline void held_add(vmm_tcache *d, int x)
{
    atomic_store_explicit(&d->held, atomic_load_explicit(&d->held, memory_order_relaxed) + (uint32_t)x,
                          memory_order_relaxed);
}

/* Entry k of bin back to the allocator (allocator lock or the block's lane's held, and tc's). */
static size_t bin_give(vmm_allocator *a, vmm_tcache *tc, tc_bin *bin, uint32_t k)
{
    uintptr_t addr;
    tc_entry e = bin_take(tc, bin, k, &addr);
    if (tc == a->tcs->depot)
        held_add(tc, -1);
    a->tcs->release(a, e.b);
    return bin_size(tc, bin);
}

/* 1 when bin holds the block at addr. */
static inline int bin_holds(const tc_bin *bin, uintptr_t addr)
{
    for (uint32_t i = 0; i < bin->n; i++)
        if (bin->addr[i] == addr)
            return 1;
    return 0;
}

/* Whether a bin holds blocks of `size` bytes, and which. The slow paths ask by the block's size,
 * not its slot's step: record_stream and groups clear the step of a block that a racing free (a
 * user's bug) may have put into a cache meanwhile. */
static inline int bin_sized(size_t size) { return size >= TC_STEP && size <= TC_MAX_SIZE; }
static inline tc_bin *bin_of_size(vmm_tcache *tc, size_t size) { return &tc->bins[size / TC_STEP - 1]; }

/* The cache numbered k, or NULL (its lock not taken). Numbers change only under the allocator
 * lock; a reader without it (vmm_tc_free) may get a cache retired or numbered anew since, never
 * freed memory, and checks the number under the cache's lock. */
static vmm_tcache *cache_numbered(vmm_tc_state *T, unsigned k)
{
    num_table *t = atomic_load_explicit(&T->nums, memory_order_acquire);
    return k && t && k < t->cap ? atomic_load_explicit(&t->c[k], memory_order_acquire) : NULL;
}

/* Index of the newest (malloc: the warmest) or oldest (give-backs: the coldest) block of lane s
 * in bin, or -1. */
static inline int bin_find(const tc_bin *bin, vmm_stream s, int oldest)
{
    for (uint32_t j = 0; j < bin->n; j++) {
        uint32_t i = oldest ? j : bin->n - 1 - j;
        if (bin->e[i].key == s)
            return (int)i;
    }
    return -1;
}

/* ---- the depot ----------------------------------------------------------------------------
 * One thread frees what another allocates (a producer and a consumer on one stream): the
 * consumer's bins fill and the producer's stay empty, so without the depot every block went back
 * to its pool under the lane's lock and came out of it again under the same lock, both threads
 * queueing on it (~650 ns a pair on this VM's 2 cores, `vmm-bench handoff`). A full bin of a
 * thread that frees what others allocate (frees_others_blocks) passes its older half to the
 * depot's bin of that size instead, and a malloc whose bin has no block of its stream takes the
 * depot's newest. Only while lanes are open (a second thread was seen): a single thread gives
 * back as before, and the replays stay as tight. The depot holds at most the caches' cap; drains
 * (empty_cache, pause, destroy, OOM, a growth's) take it as any cache.
 * Locks: a thread's cache, then the depot, then a live shard; never the depot, then a cache. */
void (*vmm_tc_test_depot_hook)(uintptr_t addr);

static inline int depot_open(const vmm_allocator *a)
{
    return a->tcs->depot && vmm_lanes_on(a);
}

/* Whether tc's thread frees what others allocate, by its counts since its last fold (its
 * allocator-lock slow paths and stats readers fold) plus half those before: at least
 * DEPOT_MIN_FREES frees kept, and twice as many as mallocs served. A thread that reuses its
 * blocks (each on its own stream, the ring pattern) keeps its full bins' give-backs on its own
 * lane, which no other thread waits for: through the depot, its blocks crossed a lock and a line
 * both threads write, ~8% fewer pairs a second with two threads (vmm-bench latency, ring). */
enum { DEPOT_MIN_FREES = 32 };
static inline int frees_others_blocks(const vmm_tcache *tc)
{
    uint64_t kept = tc->n[TC_KEPT] + tc->past_kept, hits = tc->n[TC_HIT] + tc->past_hits;
    return kept >= DEPOT_MIN_FREES && kept > 2 * hits;
}

/* The older half of tc's full bin to the depot, as much as the depot has room for (tc's lock
 * held, no shard's). Each block's slot names the depot from then on. */
static void depot_put(vmm_allocator *a, vmm_tcache *tc, tc_bin *bin)
{
    vmm_tc_state *T = a->tcs;
    vmm_tcache *d = T->depot;
    size_t size = bin_size(tc, bin);
    vmm_mutex_lock(&d->lock);
    if (cache_still_on(a)) { /* else a pause or vmm_tc_off is draining every cache */
        tc_bin *db = &d->bins[bin - tc->bins];
        size_t cap = atomic_load_explicit(&T->cap, memory_order_relaxed);
        uint32_t n = (bin->n + 1) / 2;
        if (n > TC_BIN_CAP - db->n)
            n = TC_BIN_CAP - db->n;
        while (n && d->bytes + n * size > cap)
            n--;
        for (; n; n--) {
            uintptr_t addr;
            tc_entry e = bin_take(tc, bin, 0, &addr); /* the oldest, at the bottom */
            if (VMM_UNLIKELY(vmm_tc_test_depot_hook != NULL))
                vmm_tc_test_depot_hook(addr);
            vmm_live_set_owner(a, addr, d->num, 0);
            db->addr[db->n] = addr;
            db->e[db->n++] = e;
            d->bytes += size;
            held_add(d, 1);
        }
    }
    vmm_mutex_unlock(&d->lock);
}

/* The depot's newest block of lane s in the bin of index i, taken out, its slot naming no cache
 * (so that whichever thread frees it may keep it) and handed out for `requested` bytes; 0 when
 * it has none (tc's lock held, no shard's). */
static uintptr_t depot_take(vmm_allocator *a, size_t i, vmm_stream s, size_t requested)
{
    vmm_tcache *d = a->tcs->depot;
    uintptr_t addr = 0;
    vmm_mutex_lock(&d->lock);
    tc_bin *db = &d->bins[i];
    int k = db->n && cache_still_on(a) ? bin_find(db, s, 0) : -1;
    if (k >= 0) {
        tc_entry e = bin_take(d, db, (uint32_t)k, &addr);
        held_add(d, -1);
        vmm_live_set_owner(a, addr, 0, e.req != requested ? requested : 0);
    }
    vmm_mutex_unlock(&d->lock);
    return addr;
}

int vmm_tc_malloc(vmm_allocator *a, size_t size, vmm_stream s, void **ptr)
{
    if (size > TC_MAX_SIZE)
        return 0;
    vmm_tcache *tc = cache_lock(a);
    if (!tc)
        return 0;
    if (VMM_UNLIKELY(tc->spread)) { /* a thread on several streams: no cache (tc_lane_check) */
        tc->n[TC_MISS]++;
        mark_dirty(tc);
        vmm_mutex_unlock(&tc->lock);
        return 0;
    }
    size_t r = a->tcs->simple_round ? (size + TC_STEP - 1) / TC_STEP * TC_STEP
                                    : vmm_round_size(&a->cfg, size);
    if (r < TC_STEP)
        r = TC_STEP;
    tc_bin *bin = &tc->bins[r / TC_STEP - 1];
    int k = r <= TC_MAX_SIZE ? bin_find(bin, s, 0) : -1;
    uintptr_t addr = 0;
    if (k < 0 && r <= TC_MAX_SIZE && depot_open(a) &&
        atomic_load_explicit(&a->tcs->depot->held, memory_order_relaxed))
        addr = depot_take(a, (size_t)(bin - tc->bins), s, size);
    if (k < 0 && !addr) {
        tc->n[TC_MISS]++;
        mark_dirty(tc);
        vmm_mutex_unlock(&tc->lock);
        return 0;
    }
    if (k >= 0) {
        tc_entry e = bin_take_sized(tc, bin, (uint32_t)k, &addr, r);
        if (e.req != size)
            vmm_live_set_requested(a, addr, size); /* record and slot */
    }
    tc->n[TC_HIT]++;
    mark_dirty(tc);
    delta_up(&tc->d[TC_ALLOCATION], 1);
    delta_up(&tc->d[TC_BYTES], (int64_t)r);
    delta_up(&tc->d[TC_REQUESTED], (int64_t)size);
    vmm_mutex_unlock(&tc->lock);
    *ptr = (void *)addr;
    return 1;
}

/* Whether the block at addr, whose slot names cache `owner` (another thread's), is not in that
 * cache: a malloc from a cache leaves the slot naming it, so the blocks one thread allocates from
 * its cache and another frees (forward and backward threads on one stream) named the first, and
 * every such free went to the allocator: 0.45 of mallocs served by the caches instead of 0.81 with
 * two threads passing every block to each other (vmm-bench handoff --exchange, docs/benchmarks.md
 * "Handoff"). The block's
 * shard lock held: no other free can cache it meanwhile. That cache's lock is only tried (the
 * order is cache, then shard); busy, or the depot's (a block in the depot is freed already), 0.
 * Under the lock its bins are exact, and it is still the cache numbered `owner` (cache_numbered
 * may return one retired or renumbered since). */
static int named_elsewhere_live(vmm_tc_state *T, unsigned owner, unsigned cls, uintptr_t addr)
{
    vmm_tcache *o = cache_numbered(T, owner);
    if (!o || o == T->depot || !vmm_mutex_trylock(&o->lock))
        return 0;
    int live = o->num == owner && !bin_holds(&o->bins[cls - 1], addr);
    vmm_mutex_unlock(&o->lock);
    return live;
}

/* Whether tc may keep a free of lane `key` (tc's lock held). A cache serves at most TC_LANES
 * lanes: a thread driving more streams keeps none of their blocks. A malloc served from the cache
 * takes the block freed last (LIFO) wherever it lies, where the pool's best fit packs blocks at
 * the low end of the free space; blocks that stay live then lie scattered over pages that the
 * stream's frees would have emptied. One stream mostly reuses those holes itself; with several, each
 * stream's segment holds its own, and growth on another stream cannot recycle them (holes of fewer
 * than RECYCLE_MIN_PAGES whole pages, segment.c). One thread on ten streams, per layer temporaries
 * freed and then a few small blocks that stay (bench/scripts/gen_offload_trace.py, 6.9 GB) held 1.0446x
 * what it handed out with its cache and 1.0016x without (docs/benchmarks.md, "Handle sizes").
 * Giving back the cache at each change of lane does not help (1.0455x): the blocks that stay come
 * from the cache while it serves their stream. Two lanes stay cached (a thread on its stream and
 * the default one, issue 13's threads each on their own stream). A lane past TC_LANES spreads the
 * cache: *trim SIZE_MAX, and the caller's vmm_tc_trim_self gives back every block it holds.
 * TC_REARM frees in a row on one lane (a thread that moved to another stream for good) make it a
 * cache of that lane again. */
static int tc_lane_check(vmm_tcache *tc, vmm_stream key, size_t *trim)
{
    if (VMM_LIKELY(!tc->spread)) {
        for (unsigned i = 0; i < tc->n_lanes; i++)
            if (tc->lanes[i] == key)
                return 1;
        if (tc->n_lanes < TC_LANES) {
            tc->lanes[tc->n_lanes++] = key;
            return 1;
        }
        tc->spread = 1;
        tc->run = 0;
        tc->lanes[0] = key;
        *trim = SIZE_MAX;
        return 0;
    }
    if (tc->lanes[0] != key) {
        tc->lanes[0] = key;
        tc->run = 0;
    } else if (++tc->run >= TC_REARM) {
        tc->spread = 0;
        tc->n_lanes = 1;
    }
    return 0;
}

int vmm_tc_free(vmm_allocator *a, void *ptr, size_t *trim)
{
    *trim = 0;
    vmm_tc_state *T = a->tcs;
    if (!atomic_load_explicit(&T->on, memory_order_relaxed))
        return 0;
    /* Anything unusual is the allocator's business: bad pointers, uses on other streams, groups,
     * blocks too large or of the large pool (tc_class 0), and a block another cache may hold.
     * Only the slot is read: with 10^6 live blocks the record would be one more cache miss. The
     * shard's lock is held across (no other free can take the block meanwhile), and this cache's
     * lock is tried under it, against the order (cache, shard) that drains follow: busy means a
     * drain or a fold, and the allocator does this free. */
    size_t sh;
    vmm_live_slot *sl = vmm_live_slot_lock(a, (uintptr_t)ptr, &sh);
    if (!sl)
        return 0;
    unsigned cls = sl->tc_class;
    vmm_tcache *tc = cls ? cache_find(a, T->id) : NULL;
    unsigned owner = atomic_load_explicit(&sl->tc_owner, memory_order_relaxed);
    /* a slot naming another cache: maybe in that cache, when the allocator asks it */
    if (!tc || !tc->num ||
        (owner && owner != tc->num && !named_elsewhere_live(T, owner, cls, sl->addr)) ||
        !vmm_mutex_trylock(&tc->lock)) {
        vmm_live_slot_unlock(a, sh);
        if (cls && !tc)
            cache_get(a); /* this thread's first: made now (not under the shard's lock) for the next */
        return 0;
    }
    tc_bin *bin = &tc->bins[cls - 1];
    size_t size = (size_t)cls * TC_STEP, cap = atomic_load_explicit(&T->cap, memory_order_relaxed);
    int keep = 0;
    if (VMM_UNLIKELY(!cache_still_on(a))) {
        keep = -1;
    } else if (owner == tc->num && bin_holds(bin, sl->addr)) {
        keep = -1; /* freed twice: the allocator says so */
    } else if (VMM_UNLIKELY(!tc_lane_check(tc, sl->key, trim))) {
        tc->n[TC_PASSED]++; /* the allocator frees it (and, spread just now, the cache's blocks) */
        mark_dirty(tc);
    } else if (bin->n == TC_BIN_CAP || tc->bytes + size > cap) {
        /* full: the allocator frees this one, and the caller has the cache give back the older
         * half of this bin in the same lock pass (of this bin only when bytes ran out too: halving
         * every bin emptied the bins of sizes the thread still uses, ~25% more misses on the
         * ring pattern). A cache holding more than its cap by itself (keeping never passes it:
         * the cap fell with the small pool, cap_follow) gives back the older half of every bin
         * (SIZE_MAX), or frees of sizes whose bins are empty would pass it until the thread
         * happened to use those it holds. */
        *trim = tc->bytes > cap ? SIZE_MAX : size;
        tc->n[TC_PASSED]++;
        mark_dirty(tc);
    } else {
        keep = 1;
        atomic_store_explicit(&sl->tc_owner, tc->num, memory_order_relaxed);
        bin->addr[bin->n] = sl->addr;
        bin->e[bin->n++] = (tc_entry){sl->blk, sl->key, sl->requested};
    }
    uint32_t requested = sl->requested;
    vmm_live_slot_unlock(a, sh);
    if (keep > 0) {
        tc->n[TC_KEPT]++;
        tc->n[TC_KEPT_OTHERS] += owner && owner != tc->num;
        tc->bytes += size;
        mark_dirty(tc);
        delta_down(&tc->d[TC_ALLOCATION], 1);
        delta_down(&tc->d[TC_BYTES], (int64_t)size);
        delta_down(&tc->d[TC_REQUESTED], (int64_t)requested);
        /* full now, or the next free of this size would pass: the older half to the depot, when
         * this thread frees what others allocate */
        if ((bin->n == TC_BIN_CAP || tc->bytes + size > cap) && frees_others_blocks(tc) &&
            depot_open(a))
            depot_put(a, tc, bin);
    }
    vmm_mutex_unlock(&tc->lock);
    return keep > 0;
}

int vmm_tc_holds(vmm_allocator *a, const vmm_live_slot *s)
{
    vmm_tc_state *T = a->tcs;
    if (!T || !bin_sized(s->blk->size))
        return 0;
    for (;;) {
        unsigned owner = atomic_load_explicit(&s->tc_owner, memory_order_relaxed);
        vmm_tcache *tc = cache_numbered(T, owner);
        if (!tc)
            return 0;
        vmm_mutex_lock(&tc->lock);
        /* A block leaves a cache only under that cache's lock, and its slot names its next holder
         * before the lock goes: named still, it is in this bin or in none. Renamed while this
         * thread waited (a full bin's half on its way to the depot, out of the bin already), the
         * new holder is asked: without this, a freed block in transit passed for live, and a
         * record_stream on it went out with the depot's next malloc (found in review). */
        if (atomic_load_explicit(&s->tc_owner, memory_order_relaxed) != owner) {
            vmm_mutex_unlock(&tc->lock);
            continue;
        }
        int held = bin_holds(bin_of_size(tc, s->blk->size), s->addr);
        vmm_mutex_unlock(&tc->lock);
        return held;
    }
}

int vmm_tc_take_live(vmm_allocator *a, uintptr_t addr, const vmm_block *b, unsigned hint)
{
    vmm_tc_state *T = a->tcs;
    if (!T || b->seg->pool != VMM_SMALL)
        return vmm_live_take(a, addr, b); /* no cache takes large-pool blocks */
    /* Lock order is cache, then shard: with the named cache's lock held, no free can put the block
     * into that cache, and no other cache takes a block whose slot names one (vmm_tc_free). When
     * the slot names another cache than the one locked (the hint was stale), go round again. */
    vmm_tcache *locked = cache_numbered(T, hint);
    if (locked)
        vmm_mutex_lock(&locked->lock);
    for (;;) {
        size_t sh;
        vmm_live_slot *sl = vmm_live_slot_lock(a, addr, &sh);
        if (sl && sl->blk != b) {
            vmm_live_slot_unlock(a, sh);
            sl = NULL;
        }
        unsigned owner = sl ? atomic_load_explicit(&sl->tc_owner, memory_order_relaxed) : 0;
        vmm_tcache *tc = sl && bin_sized(b->size) ? cache_numbered(T, owner) : NULL;
        if (!sl || tc == locked) {
            int held = sl && tc && bin_holds(bin_of_size(tc, b->size), addr);
            if (held)
                vmm_live_slot_unlock(a, sh);
            else if (sl)
                vmm_live_slot_take(a, sh, sl);
            if (locked)
                vmm_mutex_unlock(&locked->lock);
            return sl && !held;
        }
        vmm_live_slot_unlock(a, sh);
        if (locked)
            vmm_mutex_unlock(&locked->lock);
        if ((locked = tc) != NULL) /* NULL: the hint named a cache the slot no longer does */
            vmm_mutex_lock(&locked->lock);
    }
}

/* The caches' cap after the small pool's allocated bytes moved (allocator lock held, deltas
 * folded). Powers of two, so that it changes seldom: every fast path reads its cache line. */
static void cap_follow(vmm_allocator *a)
{
    vmm_tc_state *T = a->tcs;
    int64_t allocated = a->stats.allocated_bytes[VMM_SMALL + 1].current;
    size_t cap = T->cap_bytes;
    size_t share = allocated > 0 ? (size_t)allocated / TC_CAP_SHARE : 0;
    if (share > cap)
        cap = vmm_floor_pow2(share);
    if (cap < T->cap_bytes)
        cap = T->cap_bytes;
    if (cap != atomic_load_explicit(&T->cap, memory_order_relaxed))
        atomic_store_explicit(&T->cap, cap, memory_order_relaxed);
}

/* Fold tc's deltas into a->stats (allocator lock and tc's lock held). */
static void fold_locked(vmm_allocator *a, vmm_tcache *tc)
{
    if (!atomic_load_explicit(&tc->dirty, memory_order_relaxed))
        return;
    vmm_stats *st = &a->stats;
    vmm_stat *arr[TC_NSTATS] = {st->allocation, st->allocated_bytes, st->requested_bytes};
    const int pi = VMM_SMALL + 1;
    int64_t before_pool[TC_NSTATS], before_all[TC_NSTATS];
    for (int k = 0; k < TC_NSTATS; k++) {
        vmm_stat *s = arr[k];
        tc_delta *d = &tc->d[k];
        before_pool[k] = s[pi].current;
        before_all[k] = s[VMM_POOL_SMALL].current + s[VMM_POOL_LARGE].current;
        s[pi].current += d->up - d->down;
        s[pi].allocated += d->up;
        s[pi].freed += d->down;
        vmm_peak_at(&s[pi], before_pool[k] + d->max_net);
        vmm_peak_at(&s[VMM_POOL_ALL], before_all[k] + d->max_net);
    }
    /* active = allocation + pending: its peaks where the allocations' were highest */
    int64_t pend_n = a->pending[0].current + a->pending[1].current;
    int64_t pend_b = a->pending_bytes[0].current + a->pending_bytes[1].current;
    vmm_peak_at(&st->active[pi], before_pool[TC_ALLOCATION] + tc->d[TC_ALLOCATION].max_net +
                                     a->pending[VMM_SMALL].current);
    vmm_peak_at(&st->active[VMM_POOL_ALL],
                before_all[TC_ALLOCATION] + tc->d[TC_ALLOCATION].max_net + pend_n);
    vmm_peak_at(&st->active_bytes[pi], before_pool[TC_BYTES] + tc->d[TC_BYTES].max_net +
                                           a->pending_bytes[VMM_SMALL].current);
    vmm_peak_at(&st->active_bytes[VMM_POOL_ALL],
                before_all[TC_BYTES] + tc->d[TC_BYTES].max_net + pend_b);
    for (int k = 0; k < TC_NCOUNTS; k++)
        a->tcs->counts[k] += tc->n[k];
    /* a stats reader folds every cache: the depot's test still sees what came before */
    tc->past_kept = (tc->past_kept + tc->n[TC_KEPT]) / 2;
    tc->past_hits = (tc->past_hits + tc->n[TC_HIT]) / 2;
    memset(tc->d, 0, sizeof tc->d);
    memset(tc->n, 0, sizeof tc->n);
    atomic_store_explicit(&tc->dirty, 0, memory_order_relaxed);
}

void vmm_tc_fold(vmm_allocator *a)
{
    if (!a->tcs)
        return;
    for (vmm_tcache *tc = a->tcs->list; tc; tc = tc->next) {
        vmm_mutex_lock(&tc->lock);
        fold_locked(a, tc);
        vmm_mutex_unlock(&tc->lock);
    }
    cap_follow(a);
}

void vmm_tc_fold_self(vmm_allocator *a)
{
    if (!a->tcs)
        return;
    vmm_tcache *tc = cache_find(a, a->tcs->id);
    /* only this thread sets dirty, so a clean cache stays clean until it returns */
    if (tc && atomic_load_explicit(&tc->dirty, memory_order_relaxed)) {
        vmm_mutex_lock(&tc->lock);
        fold_locked(a, tc);
        vmm_mutex_unlock(&tc->lock);
        cap_follow(a); /* a cache at work: its cap follows the pool (stats readers' folds too) */
    }
}

/* The calling thread's cache, locked, its deltas not folded (a lane's lock held, not the
 * allocator's, whose counters a fold writes); NULL when it has none. */
static vmm_tcache *self_locked_nofold(vmm_allocator *a)
{
    vmm_tcache *tc = a->tcs ? cache_find(a, a->tcs->id) : NULL;
    if (tc)
        vmm_mutex_lock(&tc->lock);
    return tc;
}

/* The same, its deltas folded. Allocator lock held. */
static vmm_tcache *self_locked(vmm_allocator *a)
{
    vmm_tcache *tc = self_locked_nofold(a);
    if (tc)
        fold_locked(a, tc);
    return tc;
}

/* Give back the blocks of every bin (half: the older half of each; only: just the bin of blocks
 * of that size, 0 for all). Caller holds the allocator lock and tc's. Returns bytes given. */
static size_t drain_locked(vmm_allocator *a, vmm_tcache *tc, unsigned half, size_t only)
{
    size_t given = 0;
    int i0 = only ? (int)(only / TC_STEP) - 1 : 0, i1 = only ? i0 + 1 : TC_BINS;
    for (int i = i0; i < i1; i++) {
        tc_bin *bin = &tc->bins[i];
        uint32_t n = half ? (bin->n + 1) / 2 : bin->n; /* the bottom of the stack: oldest */
        while (n--)
            given += bin_give(a, tc, bin, 0); /* the free was counted by the delta folded before */
    }
    return given;
}

size_t vmm_tc_drain_one(vmm_allocator *a, vmm_tcache *tc)
{
    vmm_mutex_lock(&tc->lock);
    fold_locked(a, tc);
    size_t n = drain_locked(a, tc, 0, 0);
    vmm_mutex_unlock(&tc->lock);
    return n;
}

/* The calling thread's smallest cached block of lane s at least `size` large back: a fit once it
 * is back. fold: under the allocator lock (its deltas folded), else under the lane's. */
static size_t give_fit(vmm_allocator *a, size_t size, vmm_stream s, int fold)
{
    if (size > TC_MAX_SIZE)
        return 0;
    vmm_tcache *tc = fold ? self_locked(a) : self_locked_nofold(a);
    if (!tc)
        return 0;
    size_t given = 0;
    for (size_t i = (size + TC_STEP - 1) / TC_STEP - 1; i < TC_BINS && !given; i++) {
        int k = bin_find(&tc->bins[i], s, 1);
        if (k >= 0) {
            given = bin_give(a, tc, &tc->bins[i], (uint32_t)k);
        }
    }
    vmm_mutex_unlock(&tc->lock);
    return given;
}

size_t vmm_tc_give_fit(vmm_allocator *a, size_t size, vmm_stream s) { return give_fit(a, size, s, 1); }

size_t vmm_tc_give_fit_lane(vmm_allocator *a, size_t size, vmm_stream s) { return give_fit(a, size, s, 0); }

size_t vmm_tc_trim_self(vmm_allocator *a, size_t size)
{
    vmm_tcache *tc = self_locked(a);
    if (!tc)
        return 0;
    /* a spread cache (tc_lane_check) gives back all it holds: it keeps nothing from now on */
    size_t n = drain_locked(a, tc, !tc->spread, size == SIZE_MAX ? 0 : size);
    vmm_mutex_unlock(&tc->lock);
    return n;
}


/* The older half of lane s's blocks in bin back (lane s's lock and tc's held); *had: whether the
 * bin held any of them. Returns the bytes given back. */
static size_t trim_lane_bin(vmm_allocator *a, vmm_tcache *tc, tc_bin *bin, vmm_stream s, int *had)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < bin->n; i++)
        n += bin->e[i].key == s;
    *had = n > 0;
    size_t given = 0;
    for (n = (n + 1) / 2; n--;)
        given += bin_give(a, tc, bin, (uint32_t)bin_find(bin, s, 1));
    return given;
}

int vmm_tc_trim_lane(vmm_allocator *a, size_t size, vmm_stream s)
{
    if (!bin_sized(size))
        return 0;
    vmm_tcache *tc = self_locked_nofold(a);
    if (!tc)
        return 0;
    tc_bin *bin = bin_of_size(tc, size);
    int had;
    trim_lane_bin(a, tc, bin, s, &had);
    int ok = had || bin->n == 0;
    vmm_mutex_unlock(&tc->lock);
    return ok;
}

size_t vmm_tc_trim_lane_all(vmm_allocator *a, vmm_stream s)
{
    vmm_tcache *tc = self_locked_nofold(a);
    if (!tc)
        return 0;
    size_t given = 0;
    int had;
    for (int i = 0; i < TC_BINS; i++)
        if (tc->bins[i].n)
            given += trim_lane_bin(a, tc, &tc->bins[i], s, &had);
    /* and the depot's blocks of this lane: free memory of this lane that no pool can use */
    vmm_tcache *d = a->tcs->depot;
    if (d) {
        vmm_mutex_lock(&d->lock);
        for (int i = 0; i < TC_BINS; i++)
            if (d->bins[i].n)
                given += trim_lane_bin(a, d, &d->bins[i], s, &had);
        vmm_mutex_unlock(&d->lock);
    }
    vmm_mutex_unlock(&tc->lock);
    return given;
}

size_t vmm_tc_drain(vmm_allocator *a, int self_only)
{
    if (!a->tcs)
        return 0;
    if (self_only) {
        /* and the depot: blocks no thread holds for its own, back before new memory */
        vmm_tcache *tc = cache_find(a, a->tcs->id);
        return (tc ? vmm_tc_drain_one(a, tc) : 0) + (a->tcs->depot ? vmm_tc_drain_one(a, a->tcs->depot) : 0);
    }
    size_t n = 0;
    for (vmm_tcache *tc = a->tcs->list; tc; tc = tc->next)
        n += vmm_tc_drain_one(a, tc);
    if (a->tcs->depot)
        n += vmm_tc_drain_one(a, a->tcs->depot);
    return n;
}

void vmm_tc_off(vmm_allocator *a)
{
    if (!a->tcs || !atomic_load_explicit(&a->tcs->on, memory_order_relaxed))
        return;
    atomic_store_explicit(&a->tcs->on, 0, memory_order_relaxed);
    a->tcs->off = 1;
    vmm_tc_drain(a, 0);
}

int vmm_tc_disabled(const vmm_allocator *a)
{
    return a->tcs && a->tcs->off;
}

int vmm_tc_pause(vmm_allocator *a)
{
    int was = vmm_tc_on(a);
    if (was) {
        /* each drain takes the cache's lock, so no fast path is under way once it returns, and
         * the next one sees `on` cleared and queues for the allocator lock */
        atomic_store_explicit(&a->tcs->on, 0, memory_order_relaxed);
        vmm_tc_drain(a, 0);
    }
    return was;
}

void vmm_tc_resume(vmm_allocator *a, int was)
{
    if (was)
        atomic_store_explicit(&a->tcs->on, 1, memory_order_release);
}

int vmm_tc_on(const vmm_allocator *a)
{
    return a->tcs && atomic_load_explicit(&a->tcs->on, memory_order_relaxed);
}

void vmm_tc_info(vmm_allocator *a, size_t *caches, size_t *bytes, size_t *cap,
                 uint64_t counts[VMM_TC_COUNTS])
{
    *caches = *bytes = *cap = 0;
    memset(counts, 0, VMM_TC_COUNTS * sizeof *counts);
    if (!a->tcs)
        return;
    *cap = atomic_load_explicit(&a->tcs->cap, memory_order_relaxed);
    memcpy(counts, a->tcs->counts, sizeof a->tcs->counts);
    for (vmm_tcache *tc = a->tcs->list; tc; tc = tc->next) {
        vmm_mutex_lock(&tc->lock);
        (*caches)++;
        *bytes += tc->bytes;
        vmm_mutex_unlock(&tc->lock);
    }
    vmm_tcache *d = a->tcs->depot;
    if (d) {
        vmm_mutex_lock(&d->lock);
        *bytes += d->bytes;
        vmm_mutex_unlock(&d->lock);
    }
}
