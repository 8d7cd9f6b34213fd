/*
 * Internal cross-file functions of vmmalloc, grouped by the file that defines them.
 * Layers call downward only: alloc.c -> segment.c / pool.c -> driver (driver.h).
 */
#ifndef VMM_INTERNAL_H
#define VMM_INTERNAL_H

#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "vmmalloc.h"

#define VMM_KiB ((size_t)1 << 10)
#define VMM_MiB ((size_t)1 << 20)
#define VMM_GiB ((size_t)1 << 30)

#if defined(__GNUC__)
#define VMM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define VMM_LIKELY(x) __builtin_expect(!!(x), 1)
#define VMM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define VMM_PRINTF(f, a)
#define VMM_LIKELY(x) (x)
#define VMM_UNLIKELY(x) (x)
#endif

/* The largest power of two not above x (x > 0). */
static inline size_t vmm_floor_pow2(size_t x)
{
    return (size_t)1 << (63 - __builtin_clzll((unsigned long long)x));
}

/* ---- error.c ---------------------------------------------------------------------------- */

/* Set this thread's vmm_last_error() text and return `status` (so callers can `return vmm_fail(...)`). */
int vmm_fail(int status, const char *fmt, ...) VMM_PRINTF(2, 3);
/* Map a driver result to a status code: OUT_OF_MEMORY -> VMM_ENOMEM, NO_DEVICE & co -> VMM_ENODEV,
 * NOT_SUPPORTED -> VMM_ENOTSUP, anything else -> VMM_EDRIVER. */
int vmm_status_from_drv(int drv_result);
/* vmm_fail with the driver call named: "<what>: CUDA_ERROR_X (n)". */
int vmm_fail_drv(int drv_result, const char *what);
/* Clear this thread's last error (successful calls leave it alone; only tests need this). */
void vmm_clear_error(void);

/* ---- config.c ----------------------------------------------------------------------------- */

enum { VMM_DRIVER_SIM = 0, VMM_DRIVER_CUDA = 1 };
/* roundup_power2_divisions intervals, as PyTorch: interval 0 holds sizes below 2 MiB, interval k
 * (k >= 1) sizes in [2^k MiB, 2^(k+1) MiB), the last one everything above. */
enum { VMM_POW2_INTERVALS = 16 };

typedef struct vmm_config {
    int driver;                          /* VMM_DRIVER_*; default cuda (tests and bench ask for sim) */
    int device;
    int peer_all;                        /* peer_access:all (default): every peer the driver allows */
    uint64_t peer_mask;                  /* peer_access:[..]: bit i grants device i */
    int ipc;                             /* pages exportable (ipc.c): 1 true, 0 false, -1 auto */
    int expandable_segments;             /* default 1 */
    size_t max_split_size;               /* bytes; SIZE_MAX = unlimited (default) */
    size_t max_non_split_rounding;       /* bytes; default 20 MiB */
    /* roundup_power2_divisions: divisions per interval (see VMM_POW2_INTERVALS); 0 = plain 512 B
     * rounding. Set with one number for all intervals, or PyTorch's list form [64:8,256:4,>:1]. */
    unsigned pow2_divisions[VMM_POW2_INTERVALS];
    double garbage_collection_threshold; /* 0 = off */
    double per_process_memory_fraction;  /* 1.0 = whole device */
    size_t small_page_size;              /* bytes mapped per page in the small pool */
    size_t large_page_size;              /* bytes mapped per page in the large pool */
    size_t max_handle_size;              /* largest physical handle of the large pool (segment.c) */
    size_t thread_cache;                 /* bytes each thread may keep freed for itself; 0 off */
    int grow_unlocked;                   /* 1: growth creates handles unlocked (segment.c) */
    int lanes;                           /* 1: per-stream locks once two threads are seen (lane.c) */
    int depot;                           /* 1: full bins of freeing threads go to the depot (tcache.c) */
    /* sim */
    vmm_sim_options sim;
} vmm_config;

/* Defaults for every key. */
void vmm_config_defaults(vmm_config *c);
/* Parse "key:value,..." into c (on top of what c holds). VMM_ECONFIG naming the key on error; c is
 * unchanged then. */
int vmm_config_parse(vmm_config *c, const char *conf);
/* Defaults, then VMMALLOC_CONF, then conf. */
int vmm_config_load(vmm_config *c, const char *conf);
/* Render c as "key:value,..."; returns length or VMM_ERANGE. */
int vmm_config_format(const vmm_config *c, char *buf, size_t len);
/* Parse a size with optional K/M/G/T[iB] suffix (powers of 1024). 0 on success. */
int vmm_parse_size(const char *s, size_t len, size_t *out);
/* Key i of the option table and its documentation (via *doc); NULL past the last key. */
const char *vmm_config_key_doc(size_t i, const char **doc);

/* ---- metadata.c --------------------------------------------------------------------------- */

/* Host memory for block, segment and page records. Uses a private jemalloc arena when the process
 * has jemalloc loaded (found with dlsym at run time; the library never links it), else the system
 * allocator. Thread safe. */
typedef struct vmm_meta vmm_meta;
/* VMM_META_NO_JEMALLOC=1 in the environment forces the libc path (for tests). */
int vmm_meta_open(vmm_meta **out);
void vmm_meta_close(vmm_meta *m);
void *vmm_meta_alloc(vmm_meta *m, size_t size);       /* zeroed; NULL when out of host memory */
void vmm_meta_free(vmm_meta *m, void *p, size_t size);
int64_t vmm_meta_bytes(const vmm_meta *m);           /* bytes currently allocated */
const char *vmm_meta_backend(const vmm_meta *m);      /* "jemalloc-arena" or "libc" */


/* ---- allocator state (defined by alloc.c; shared by segment.c, pool.c, events.c, stats.c) ---- */

#include <pthread.h>

/* Pool index inside the allocator; stats index is pool + 1 (VMM_POOL_SMALL / VMM_POOL_LARGE). */
enum { VMM_SMALL = 0, VMM_LARGE = 1, VMM_NPOOLS = 2 };

typedef enum vmm_block_state {
    VMM_BLOCK_FREE = 0,      /* mapped, cached, in the free index */
    VMM_BLOCK_UNMAPPED = 1,  /* page aligned VA with no physical pages, in the unmapped index */
    VMM_BLOCK_ALLOCATED = 2, /* handed out, in the live table */
    VMM_BLOCK_PENDING = 3,   /* freed, waiting for events of other streams (deferred list) */
    VMM_BLOCK_DETACHING = 4, /* whole idle pages on their way out: still mapped, in no index, on
                              * the callbacks' detach list until before_unmap has run (callbacks.c) */
    VMM_BLOCK_MAPPING = 5,   /* page aligned VA a growth maps next: unmapped, in no index, on the
                              * growth list while its handles are created with the lock released
                              * (segment.c), so no other thread grows into, merges or frees it */
} vmm_block_state;
/* A block freed into a thread cache (tcache.c) keeps state ALLOCATED and its live-table slot, so
 * that no code under the allocator lock ever sees a field change that only the thread's own lock
 * guards: only `requested` changes (when the cache hands the block out again), and the free that
 * put it there touched only its slot (tc_owner). Whether a cache holds a block is its cache's bin's
 * to say (vmm_tc_holds). */

typedef struct vmm_block vmm_block;
typedef struct vmm_segment vmm_segment;
typedef struct vmm_stream_rec vmm_stream_rec;

/* record_stream bookkeeping, allocated on the first record_stream of a block: most blocks never
 * need it, and keeping it out of vmm_block keeps the record at one 128-byte size class.
 *
 * One slot per use: uses[i] and events[i] (both arrays of capacity cap_uses == cap_events; the
 * block's n_uses slots are in use). record_stream fills events[i] with an event from the pool,
 * prepared for uses[i] (event_prepare), so that the free only has to record it; NULL when none
 * could be had then (the free, or the deferred scan after it, tries again). While the block is
 * allocated no slot is recorded. Once freed (PENDING), slots [0, n_events) hold events recorded on
 * their stream and slots [n_events, n_uses) are still unrecorded; a slot leaves (its event back
 * to the pool) when its event completed, and the block is free when no slot is left. */
typedef struct vmm_block_ext {
    vmm_stream *uses;          /* record_stream streams other than the block's own */
    vmm_event *events;         /* parallel to uses: the slot's event, NULL when it has none yet */
    uint32_t cap_uses;
    uint32_t n_events;         /* pending: slots [0, n_events) are recorded */
    uint32_t cap_events;       /* capacity of events (always cap_uses) */
} vmm_block_ext;

/* Field order matters: the best-fit walk and a thread cache's malloc / free pair touch only the
 * first 64 bytes (treap key and links, state, n_uses, requested, the flags); the allocator's free
 * reads both neighbours (second line). With 10^6 live blocks a freed block's record is cold, so a
 * second line cost the ring pattern one more cache miss per pair. */
struct vmm_block {
    uintptr_t addr;
    size_t size;
    vmm_segment *seg;
    vmm_block *left, *right;   /* free-index treap children */
    uint32_t prio;             /* treap priority */
    uint8_t state;             /* vmm_block_state */
    uint8_t in_index;          /* 1 while in a free / unmapped treap */
    uint8_t grouped;           /* group != NULL (group.c), where the thread caches look */
    uint32_t n_uses;           /* streams in ext->uses (0 when ext is NULL) */
    size_t requested;          /* bytes asked for (allocated / pending blocks) */
    /* ---- second cache line ---- */
    vmm_block *prev, *next;    /* address neighbours inside the segment */
    uint64_t free_seq;         /* own stream's free sequence number when last freed */
    uint64_t gc_stamp;         /* allocator malloc count when freed (garbage collection age) */
    vmm_block_ext *ext;        /* record_stream uses and pending events; NULL until needed */
    vmm_block *dprev, *dnext;  /* deferred list links */
    struct vmm_group *group;   /* fused buffers of vmm_malloc_group (group.c); NULL otherwise */
};

/* 128 bytes is a jemalloc size class whose regions are 128-aligned, so the hot first half of a
 * record is one cache line (at 144 bytes, the 160 class straddled lines in every other record). */
_Static_assert(sizeof(struct vmm_block) == 128, "vmm_block: keep the record at 128 bytes");
_Static_assert(offsetof(struct vmm_block, requested) + sizeof(size_t) <= 64,
               "vmm_block: what a thread cache's pair touches stays in the first cache line");

struct vmm_segment {
    uintptr_t base;            /* VA reservation (expandable) or mem_alloc pointer (classic) */
    size_t size;
    vmm_stream stream;
    vmm_stream key;            /* lane of its blocks in the free indexes: the stream, or for tagged
                                * memory its lane's key (sleep.c); equal to srec->key */
    vmm_stream_rec *srec;
    int pool;                  /* VMM_SMALL / VMM_LARGE */
    int expandable;
    size_t page_size;          /* expandable: bytes per page */
    size_t max_handle_pages;   /* expandable: most pages one physical handle covers (segment.c) */
    size_t n_pages;
    vmm_phys *pages;           /* expandable: handle mapped at each page, 0 when unmapped; a handle
                                * covering several pages is named at each, so its extent is the
                                * run of equal entries (vmm_seg_handle_pages) */
    size_t mapped_pages;
    vmm_block *first;          /* lowest block */
    vmm_segment *prev, *next;  /* allocator's segment list */
    struct vmm_mempool *mp;    /* private pool owning it (mempool.c); NULL: the default pools */
    int asleep;                /* sleep.c: 1 frozen for sleep (FREE blocks out of the index), 2
                                * asleep (no page mapped); 0 awake */
};

/* A private pool (mempool.c): PyTorch's PrivatePool. Its segments' free and unmapped blocks live
 * in its own indexes, so only allocations routed to it (vmm_pool_begin) reuse them; its pages are
 * never unmapped while it is in use. */
typedef struct vmm_mempool {
    uint64_t id[2];                    /* MempoolId_t; (0, 0) is the default pools and never here */
    int64_t use_count;                 /* users (graphs, vmm_pool_retain); 0: released */
    int routed;                        /* a vmm_pool_begin route to it is in force */
    int freeable;                      /* released while captures were routed: dissolved later */
    uint64_t n_mallocs;                /* allocations served */
    vmm_block *free_tree[VMM_NPOOLS];  /* its FREE blocks, as vmm_allocator.free_tree */
    vmm_block *unmapped_tree[VMM_NPOOLS];
    struct vmm_mempool *next;
} vmm_mempool;

/* The index roots of a segment's blocks: its private pool's, or its lane's (mapped free blocks)
 * and the allocator's (unmapped ones). */
#define VMM_FREE_ROOT(a, seg)                                                                  \
    ((seg)->mp ? &(seg)->mp->free_tree[(seg)->pool] : &(seg)->srec->free_tree[(seg)->pool])
#define VMM_UNMAPPED_ROOT(a, seg)                                                              \
    ((seg)->mp ? &(seg)->mp->unmapped_tree[(seg)->pool] : &(a)->unmapped_tree[(seg)->pool])

/* What a lane's path changes besides its blocks and index, kept apart from the allocator's (lane.c)
 * and folded into them whenever the allocator lock is taken: the small pool's hot counters
 * as deltas (vmm_hot_up / vmm_hot_down on d: current is the net change, peak the highest net,
 * allocated and freed the ups and downs), mallocs (malloc_count), lane-path mallocs and frees, and
 * a cache of block records. */
typedef struct vmm_books {
    int in_path;               /* 1 while its lane path runs (under the lane's lock) */
    int dirty;                 /* deltas not folded yet */
    vmm_stats d;
    uint64_t mallocs;
    uint64_t counts[2];
    vmm_block *block_cache;
    size_t n_block_cache;
} vmm_books;

typedef struct vmm_fence {
    vmm_event ev;
    uint64_t seq;              /* stream sequence number covered */
    struct vmm_fence *next;
} vmm_fence;

struct vmm_stream_rec {
    /* read by other threads' lane lookups (lane.c): set before the record is linked, then fixed */
    vmm_stream stream;
    vmm_stream key;            /* lane key of its segments: the stream for tag 0, else the record's
                                * address | 1 (never a stream pointer) */
    int tag;                   /* tag of the allocations it serves (sleep.c); 0: untagged */
    vmm_stream_rec *next;
    /* written under the allocator lock only */
    uint64_t done_seq;         /* highest sequence number proven complete by a fence */
    vmm_fence *fences, *fences_tail; /* outstanding fences, oldest first */
    int retired;               /* destroyed by the user: all its work has run, record nothing on it */
    /* ---- the lane (lane.c): its lock and what its path changes, padded off the fields above
     * (records are not line aligned) and off the next record ---- */
    char pad0_[64];
    _Atomic int lock;
    uint64_t seq;              /* frees stamped on this stream so far */
    /* mapped FREE blocks of its segments in the default pools by (size, addr): one index per lane,
     * so that a lane's best fit and merges touch nothing of another's */
    vmm_block *free_tree[VMM_NPOOLS];
    vmm_books bk;
    char pad1_[64];
};

/* A growth making its driver calls with the allocator lock released (segment.c): the MAPPING block
 * it parked, what it holds out of the cache (for vmm_check), and the room it holds meanwhile (summed
 * over the list by segment.c's room checks). */
typedef struct vmm_growth {
    vmm_block *blk;
    int pool;
    size_t held_bytes;         /* cached handles taken: still in reserved_bytes */
    size_t held_handles;       /* ... and in n_handles */
    size_t new_bytes;          /* handles being created: room against the cap until made */
    size_t new_handles;        /* ... their count: room in the handle cache */
    size_t maps;               /* handles to map: quarantine room for a rollback's failed unmaps */
    struct vmm_growth *next;
} vmm_growth;

typedef struct vmm_free_handle {
    vmm_phys h;
    size_t size;
    int pool;                  /* pool its bytes are counted in (where it was last mapped) */
} vmm_free_handle;

/* A page whose rollback unmap failed (segment.c): the driver still maps handle h at va while the
 * page table says unmapped. The handle stays out of the cache and the VA out of use until an
 * unmap succeeds; its bytes stay reserved in `pool`. */
typedef struct vmm_quarantined {
    uintptr_t va;
    size_t size;
    vmm_phys h;
    int pool;
} vmm_quarantined;

/* The live table: pointer -> allocated block. Small-pool blocks in half the shards, chosen by the
 * pointer's 2 MiB region, so that threads allocating on their own streams (so in their own
 * segments) look blocks up without sharing a cache line; large-pool blocks in one shard of the
 * other half until lanes open (lane.c), then new ones in that half by region too (pool.c). A
 * shard: open addressing, linear probing, backward-shift deletion, a lock of its own that the
 * small-pool shards always use and the large-pool ones once lanes have opened. Writers hold the
 * allocator lock, or a lane's, and the shard's where it is used; a thread cache's free (tcache.c)
 * holds only the shard's, and writes nothing but its slot's tc_owner; readers holding the
 * allocator lock (which holds every lane's) need no shard lock, except to copy whole slots. */
enum { VMM_LIVE_SHARDS = 256 };
/* Thread caches (tcache.c) keep small-pool blocks up to VMM_TC_MAX_SIZE bytes in bins of
 * VMM_TC_STEP-byte steps (pool.c's MIN_BLOCK rounding): PyTorch's small tensors and the ring pattern
 * of vmm-bench latency. The live table records a block's step (vmm_live_slot.tc_class). */
enum { VMM_TC_STEP = 512, VMM_TC_MAX_SIZE = 64 << 10, VMM_TC_BINS = VMM_TC_MAX_SIZE / VMM_TC_STEP };
_Static_assert(VMM_TC_BINS <= 255, "a step number fits vmm_live_slot.tc_class");
/* A slot keeps its block's address beside the record pointer: probes compare keys in the table
 * and touch no record (with 10^6 live blocks each record is a cache miss). A thread cache's free
 * reads and writes the slot only, never the record (with the record read, the 10^6-live ring
 * pattern cost ~460 ns a pair, ~230 without: docs/benchmarks.md), so the slot also holds what it needs:
 * the block's lane key, its requested bytes, its size in thread-cache steps while a cache may take
 * it, and the number of the last cache it went into. blk NULL: empty. */
typedef struct vmm_live_slot {
    uintptr_t addr;
    vmm_block *blk;
    vmm_stream key;            /* blk->seg->key: a thread cache's bins keep blocks by lane */
    uint32_t requested;        /* blk->requested while tc_class is set (otherwise 0) */
    uint8_t tc_class;          /* blk->size / VMM_TC_STEP when a thread cache may take it: small
                                * pool, at most VMM_TC_MAX_SIZE, no record_stream use, no group;
                                * 0: never (set at insert, cleared by vmm_live_tc_forbid) */
    uint8_t pad_;
    _Atomic uint16_t tc_owner; /* number of the last thread cache the block was freed into, 0:
                                * none; a hint that the block may be in that cache's bin, where
                                * vmm_tc_holds looks (a cache's malloc leaves it stale). Written
                                * by a cache's free under the shard's lock; read without it by
                                * lookups under the allocator lock (relaxed: vmm_tc_take_live
                                * decides under locks) */
} vmm_live_slot;
_Static_assert(sizeof(vmm_live_slot) == 32, "vmm_live_slot: two per cache line");
typedef struct vmm_live_shard {
    _Alignas(64) _Atomic int lock;
    vmm_live_slot *t;
    size_t cap, n;
    size_t reserved;           /* inserts made room for and not done yet (lanes: several writers) */
} vmm_live_shard;
_Static_assert(sizeof(vmm_live_shard) == 64, "vmm_live_shard: one cache line each");

struct vmm_allocator {
    _Atomic int lock;                  /* vmm_lock: 0 free, 1 held, 2 held with sleepers */
    vmm_config cfg;
    vmm_driver *drv;
    vmm_meta *meta;
    vmm_device_info dev;
    size_t cap;                        /* most reserved bytes allowed (memory fraction) */
    size_t page_size[VMM_NPOOLS];
    size_t va_size[VMM_NPOOLS];        /* default VA reservation size per pool */
    vmm_block *unmapped_tree[VMM_NPOOLS]; /* unmapped free blocks by (stream, size, addr); mapped
                                        * ones are in their lane's index (vmm_stream_rec) */
    size_t n_unmapped_blocks;
    vmm_segment *segs;
    size_t n_segs;
    vmm_free_handle *fh;               /* per-device cache of unmapped physical handles */
    size_t n_fh, cap_fh;
    size_t n_handles;                  /* physical handles created and not released */
    vmm_growth *growing;               /* growths in flight with the lock released (segment.c) */
    uint64_t growths_unlocked;         /* growths whose driver calls ran unlocked (stats JSON) */
    vmm_quarantined *quar;             /* pages still mapped after a failed rollback unmap */
    size_t n_quar, cap_quar;
    vmm_event *ev_pool;                /* idle events */
    size_t n_ev_pool, cap_ev_pool;
    size_t n_events;                   /* events created and not destroyed */
    vmm_block *deferred;               /* pending frees */
    _Atomic size_t n_deferred;         /* blocks on it: written under the allocator lock, read
                                        * by lanes (relaxed: a lane's trim waits while some are) */
    vmm_stream_rec *_Atomic streams;   /* lanes (stream records): linked under the allocator lock,
                                        * read without it by lane.c (records live to vmm_destroy) */
    vmm_stream *sim_streams;           /* streams made with vmm_sim_stream_create */
    size_t n_sim_streams, cap_sim_streams;
    vmm_block *block_cache;            /* recycled block records (linked through ->next) */
    size_t n_block_cache;
    uint64_t malloc_count;
    size_t reserved_hwm;               /* most reserved bytes so far (expandable growth policy) */
    vmm_stats stats;                   /* hot arrays kept partly: see vmm_hot_up, vmm_stats_derive */
    vmm_stat pending[VMM_NPOOLS];      /* deferred frees (blocks, bytes): active = allocation + */
    vmm_stat pending_bytes[VMM_NPOOLS]; /* pending, so the hot path leaves active to be derived */
    struct vmm_pinned *pinned;         /* pinned host memory cache (pinned.c), made on first use */
    struct vmm_history *history;       /* event ring (history.c); NULL while not recording */
    struct vmm_sleep *sleep;           /* tags and sleeping blocks (sleep.c); NULL until a tag is used */
    struct vmm_ipc *ipc;               /* exports and imports (ipc.c); NULL until first used */
    struct vmm_cb *cb;                 /* free-memory and mapping callbacks (callbacks.c) */
    int cb_free_n;                     /* free-memory callbacks registered */
    int cb_mapping;                    /* mapping callbacks set */
    int cur_tag;                       /* tag of allocations made now (vmm_set_tag); 0: untagged */
    int tag_path;                      /* malloc goes through vmm_lane_get: cur_tag set, or untagged
                                        * memory sleeps */
    int mixed_lanes;                   /* classic mode holds tagged (VMM) segments too */
    uint64_t t0_ns;                    /* monotonic clock at vmm_create (trace times count from it) */
    vmm_mempool *mempools;             /* private pools (mempool.c) */
    vmm_mempool *cur_mp;               /* private pool of the malloc in progress (set and cleared
                                        * by malloc_locked): segments made now are its */
    struct vmm_route *routes;          /* vmm_pool_begin routes in force, oldest first */
    size_t n_routes, cap_routes;       /* n_routes != 0: captures underway (malloc routes, defers) */
    struct vmm_capture *capture;       /* capture.c: uses recorded on capturing streams */
    /* ---- read by the thread caches' fast paths without the allocator lock: never written while
     * the allocator is in use (tcs itself is; its `on` flag is atomic) ---- */
    _Alignas(64) struct vmm_tc_state *tcs; /* thread caches (tcache.c); set by vmm_create */
    _Atomic int lanes_on;              /* lane paths allowed (lane.c); set once, lock held */
    int lanes_open;                    /* the same for lock holders: the allocator lock takes every
                                        * lane's, small-pool counters go to lanes' books */
    uint64_t lane_counts[2];           /* folded lane-path mallocs and frees (stats JSON) */
    uintptr_t lock_owner;              /* lane.c: the thread (vmm_thread_id) that last took the allocator lock to
                                        * malloc or free, until lanes open (a second thread opens them) */
    int lanes_watch;                   /* lanes may still open (vmm_lanes_update) */
    int lanes_let_go;                  /* vmm_lanes_yield's depth: nested yields are no-ops */
    int shards_locked;                 /* live shards of the large pool take their locks too: set
                                        * when lanes open, never cleared (a lane path that saw
                                        * lanes_on may probe them after lanes closed) */
    vmm_live_shard live[VMM_LIVE_SHARDS];
};

/* ---- stats.c ------------------------------------------------------------------------------ */

/* Add delta to a single counter (current, peak, allocated / freed). Inline: the malloc / free
 * path makes about 20 of these per pair, a call each cost more than the update. */
static inline void vmm_stat_add(vmm_stat *s, int64_t d)
{
    s->current += d;
    if (d > 0) {
        s->allocated += d;
        if (s->current > s->peak)
            s->peak = s->current;
    } else {
        s->freed -= d;
    }
}
/* Add delta to st[ALL] and st[pool + 1]. */
static inline void vmm_stat_update(vmm_stat *st, int pool, int64_t d)
{
    vmm_stat_add(&st[VMM_POOL_ALL], d);
    vmm_stat_add(&st[pool + 1], d);
}
/* The same with the sign known (d >= 0): no branch on it. */
static inline void vmm_stat_up(vmm_stat *st, int pool, int64_t d)
{
    for (int i = 0; i < 2; i++) {
        vmm_stat *s = &st[i ? pool + 1 : VMM_POOL_ALL];
        s->current += d;
        s->allocated += d;
        if (s->current > s->peak)
            s->peak = s->current;
    }
}
static inline void vmm_stat_down(vmm_stat *st, int pool, int64_t d)
{
    st[VMM_POOL_ALL].current -= d;
    st[VMM_POOL_ALL].freed += d;
    st[pool + 1].current -= d;
    st[pool + 1].freed += d;
}

/* The malloc / free path's stats (allocation, allocated_bytes, requested_bytes, inactive_split,
 * inactive_split_bytes) keep only the pool entries and the ALL peak; ALL's current, allocated and
 * freed are the pools' sums. active / active_bytes keep only their peaks (current = allocation +
 * pending). vmm_stats_derive fills in the rest. A malloc + free pair makes ~12 stat updates; this
 * halves the memory writes. Returns ALL's current. */
static inline int64_t vmm_hot_up(vmm_stat *st, int pool, int64_t d)
{
    vmm_stat *s = &st[pool + 1];
    s->current += d;
    s->allocated += d;
    if (s->current > s->peak)
        s->peak = s->current;
    int64_t all = st[VMM_POOL_SMALL].current + st[VMM_POOL_LARGE].current;
    if (all > st[VMM_POOL_ALL].peak)
        st[VMM_POOL_ALL].peak = all;
    return all;
}
static inline void vmm_hot_down(vmm_stat *st, int pool, int64_t d)
{
    st[pool + 1].current -= d;
    st[pool + 1].freed += d;
}
/* A free of allocated block b in counters st (the allocator's, or a lane's deltas): what pool.c's
 * take counted up. */
static inline void vmm_count_free(const vmm_allocator *a, vmm_stats *st, const vmm_block *b)
{
    int pool = b->seg->pool;
    vmm_hot_down(st->allocation, pool, 1);
    vmm_hot_down(st->allocated_bytes, pool, (int64_t)b->size);
    vmm_hot_down(st->requested_bytes, pool, (int64_t)b->requested);
    if (a->cfg.max_split_size != SIZE_MAX && b->size >= a->cfg.max_split_size)
        vmm_stat_add(&st->oversize_allocations, -1);
}
static inline void vmm_peak_at(vmm_stat *s, int64_t current)
{
    if (current > s->peak)
        s->peak = current;
}
/* a->stats with the derived counters filled in (caller holds the lock). */
void vmm_stats_derive(const vmm_allocator *a, vmm_stats *out);

/* ---- pool.c ------------------------------------------------------------------------------- */

size_t vmm_round_size(const vmm_config *c, size_t size);
int vmm_pool_of(size_t rounded);
/* Classic segment size for a rounded request (2 MiB / 20 MiB / round up to 2 MiB). */
size_t vmm_classic_segment_size(size_t rounded);
vmm_block *vmm_block_new(vmm_allocator *a);
void vmm_block_delete(vmm_allocator *a, vmm_block *b);
/* Free the recycled records (destroy). */
void vmm_block_cache_drain(vmm_allocator *a);
/* Treap over (stream, size, addr). */
void vmm_tree_insert(vmm_block **root, vmm_block *b);
void vmm_tree_erase(vmm_block **root, vmm_block *b);
vmm_block *vmm_tree_lower_bound(vmm_block *root, vmm_stream s, size_t size, uintptr_t addr);
vmm_block *vmm_tree_next(vmm_block *root, const vmm_block *b);
int vmm_tree_contains(vmm_block *root, const vmm_block *b);
/* Put a FREE / UNMAPPED block in its index (and inactive_split stats), take it out. */
void vmm_pool_insert(vmm_allocator *a, vmm_block *b);
void vmm_pool_erase(vmm_allocator *a, vmm_block *b);
/* Split b (not in an index) so it keeps `size` bytes; returns the remainder (same state, not indexed). */
vmm_block *vmm_block_split(vmm_allocator *a, vmm_block *b, size_t size);
/* The same with a record the caller allocated (cannot fail). */
void vmm_block_split_into(vmm_block *b, vmm_block *r, size_t size);
/* Merge b (not in an index, FREE or UNMAPPED) with neighbours of the same state; returns the result
 * (not indexed). */
vmm_block *vmm_block_merge(vmm_allocator *a, vmm_block *b);
/* Free every record in a lane's record cache (vmm_destroy). */
void vmm_block_cache_drain_books(vmm_allocator *a, vmm_books *bk);
/* Take *b out of the free index for an allocation of `size` (rounded), split if the rules say so,
 * mark it allocated and live, update stats. `fitted`: *b is vmm_pool_best_fit's answer for `size`,
 * which lets a split leave the remainder in *b's index slot; *b is then a new record (the
 * allocated one). */
int vmm_pool_take(vmm_allocator *a, vmm_block **b, size_t size, size_t requested, int fitted);
/* malloc's cached path in one call: round `size`, best fit (in private pool mp's free blocks for
 * lane key s, or lane sr's when mp is NULL; sr NULL: the lane has no record yet, so no block),
 * take. *out NULL (VMM_OK) when no cached block fits; *rounded and *pool are set either way for
 * the slow path. */
int vmm_pool_malloc_cached(vmm_allocator *a, vmm_mempool *mp, vmm_stream_rec *sr, size_t size,
                           vmm_stream s, vmm_block **out, size_t *rounded, int *pool);
/* Return an allocated / pending block to its pool (merge, index, stats). */
void vmm_pool_release_block(vmm_allocator *a, vmm_block *b);
/* vmm_pool_release is also the public release of a private pool (vmmalloc.h, three arguments:
 * mempool.c). Inside the library a call with two arguments (allocator, block) is the block's. */
#define VMM_POOL_RELEASE_PICK_(x1, x2, x3, name, ...) name
#define vmm_pool_release(...)                                                                  \
    VMM_POOL_RELEASE_PICK_(__VA_ARGS__, vmm_pool_release, vmm_pool_release_block, _)(__VA_ARGS__)
/* Live table. */
int vmm_live_insert(vmm_allocator *a, vmm_block *b);
vmm_block *vmm_live_find(vmm_allocator *a, uintptr_t addr);
/* The same by table slot: find gives the slot, remove_at takes it (one probe sequence per free). */
vmm_block *vmm_live_find_slot(vmm_allocator *a, uintptr_t addr, size_t *slot);
void vmm_live_remove_at(vmm_allocator *a, size_t slot);
/* The slot's tc_owner as it reads now (a hint for vmm_tc_take_live). */
unsigned vmm_live_owner_at(const vmm_allocator *a, size_t slot);
/* Find and remove b (at addr; no thread cache may hold it: a drain's own block, or a large-pool
 * block) under its shard's lock in one hold, for writers that another lane may race on the shard:
 * 1 done, 0 it is not there (nothing changed). A free uses vmm_tc_take_live. */
int vmm_live_take(vmm_allocator *a, uintptr_t addr, const vmm_block *b);
/* Writer's locks held: b (allocated) may no longer go to a thread cache (record_stream, groups). */
void vmm_live_tc_forbid(vmm_allocator *a, const vmm_block *b);
/* Thread caches, no allocator lock: addr's slot in its small-pool shard with that shard's lock
 * held (good until vmm_live_slot_unlock), or NULL with none held. A cache's free writes tc_owner
 * there; nothing else of the slot may change. */
vmm_live_slot *vmm_live_slot_lock(vmm_allocator *a, uintptr_t addr, size_t *shard);
#define vmm_live_slot_unlock(a, shard) vmm_mutex_unlock(&(a)->live[(shard)].lock)
/* The slot vmm_live_slot_lock gave goes out of the table, and its shard's lock is let go. */
void vmm_live_slot_take(vmm_allocator *a, size_t shard, vmm_live_slot *sl);
/* A thread cache hands the block at addr out again for `requested` bytes (its cache's lock held):
 * block record and slot. */
void vmm_live_set_requested(vmm_allocator *a, uintptr_t addr, size_t requested);
/* Tests only (NULL otherwise): called by a full bin's move to the depot after a block left the bin
 * and before its slot names the depot, with both caches' locks held. */
extern void (*vmm_tc_test_depot_hook)(uintptr_t addr);
/* A cached block moves between a thread's cache and the depot (tcache.c; the thread's cache's lock
 * and the depot's held, no shard's): its slot names cache `owner` (0: none), and with
 * requested > 0 it is handed out for that many bytes (record and slot). */
void vmm_live_set_owner(vmm_allocator *a, uintptr_t addr, unsigned owner, size_t requested);
/* vmm_check: NULL when b's slot agrees with b (no thread cache holding anything), else what not. */
const char *vmm_live_check_slot(vmm_allocator *a, const vmm_block *b);
/* Blocks in the live table (thread-cached ones too; allocator lock held). */
size_t vmm_live_count(const vmm_allocator *a);
void vmm_live_free_table(vmm_allocator *a);
/* Lanes' free: the live block at addr (the large pool's shards first unless small_only, whose
 * locks are taken while lanes are open; then the small pool's) and its lane *sr (NULL: a private
 * pool's), read while the block was live; *pool: where it was found; *copy: its small-pool slot.
 * NULL when addr is not live. */
vmm_block *vmm_live_lane_of(vmm_allocator *a, uintptr_t addr, int small_only, vmm_stream_rec **sr,
                            vmm_live_slot *copy, int *pool);
/* Whether addr is still live block b of lane sr in `pool`: with sr's lock held, once true it stays
 * so (only that lane's paths and the allocator lock's holder free its blocks' records). */
int vmm_live_still(vmm_allocator *a, uintptr_t addr, const vmm_block *b, const vmm_stream_rec *sr, int pool);
/* Every block in the live table, thread-cached ones included (allocator lock held). */
#define VMM_LIVE_FOREACH(a, b)                                                                 \
    for (size_t vmm_s_ = 0; vmm_s_ < VMM_LIVE_SHARDS; vmm_s_++)                               \
        for (size_t vmm_i_ = 0; vmm_i_ < (a)->live[vmm_s_].cap; vmm_i_++)                     \
            if (((b) = (a)->live[vmm_s_].t[vmm_i_].blk) != NULL)

/* ---- events.c ----------------------------------------------------------------------------- */

/* Stream record of s (created on first use); NULL when out of host memory. */
vmm_stream_rec *vmm_stream_rec_get(vmm_allocator *a, vmm_stream s);
/* Put a new record (fields set) on the list; its lane lock is born held while lanes are open. */
void vmm_stream_rec_link(vmm_allocator *a, vmm_stream_rec *r);
/* The same without creating one: NULL when s has no record yet. Safe without the allocator lock
 * (lane.c): records are linked with a release store (vmm_stream_rec_link), the list head is read
 * atomically, and records live until vmm_destroy. */
vmm_stream_rec *vmm_stream_rec_find(vmm_allocator *a, vmm_stream s);
/* The record whose lane key follows prev's (the first with prev NULL): walks the lanes in the
 * order of their keys, which was the order of the one free index of all lanes before indexes were
 * per lane (reclaim keeps its order so). */
vmm_stream_rec *vmm_stream_rec_next_key(vmm_allocator *a, const vmm_stream_rec *prev);
/* An idle event from the pool, or a new one (VMM_EHOSTMEM / driver status, message set). */
int vmm_event_get(vmm_allocator *a, vmm_event *out);
/* Back to the pool; never fails (the pool has room for every event created). */
void vmm_event_put(vmm_allocator *a, vmm_event e);
/* An event for a use of a block on stream s: from the pool and made recordable on s
 * (event_prepare, when the driver has it). NULL when none could be had; sets no error message
 * (callers go on without one and try again later). */
vmm_event vmm_event_for_use(vmm_allocator *a, vmm_stream s);
/* Free of a block with record_stream uses: record each slot's event on its stream (getting one
 * first for an empty slot) and put the block on the deferred list. Never fails: a slot that
 * cannot be recorded now stays unrecorded, and the deferred scan retries it. */
void vmm_defer_free(vmm_allocator *a, vmm_block *b);
/* Poll pending frees (retrying unrecorded slots first); completed ones return to their pool.
 * Never blocks. */
void vmm_events_process(vmm_allocator *a);
/* Wait for every pending free (counts num_event_waits): unrecorded slots are retried, and when
 * still impossible their stream is synchronized instead (counted as an event wait too). Returns
 * how many pending frees completed. */
size_t vmm_events_wait_all(vmm_allocator *a);
/* Poll outstanding fences (no blocking). */
void vmm_fences_poll(vmm_allocator *a);
/* Record a fence on every stream with frees not yet covered by one. */
void vmm_fences_record(vmm_allocator *a);
/* Wait on outstanding fences (counts num_event_waits); returns how many were waited on. */
size_t vmm_fences_wait(vmm_allocator *a);
/* Memory of a FREE block proven idle (no queued work can still touch it). */
int vmm_block_idle(const vmm_block *b);
/* Destroy: wait all, return events, destroy every event and stream record. */
void vmm_events_shutdown(vmm_allocator *a);
/* Forget fences of a stream that is being destroyed (its work has run). */
void vmm_stream_rec_retire(vmm_allocator *a, vmm_stream s);
/* A stream was created (possibly at a retired stream's address): track it again. */
void vmm_stream_rec_revive(vmm_allocator *a, vmm_stream s);

/* ---- segment.c ---------------------------------------------------------------------------- */

/* Expandable: map pages so that a free range of `size` bytes exists for stream/pool, and return
 * that FREE block (indexed). VMM_ENOMEM with *short_pages = handles missing when physical memory is
 * short; other codes for driver failures (state unchanged). */
int vmm_seg_grow(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size, vmm_block **out,
                 size_t *short_pages);
/* Unmap idle whole handles inside FREE blocks until `want` pages were freed (SIZE_MAX: all).
 * Returns the number of pages unmapped. */
size_t vmm_seg_reclaim(vmm_allocator *a, size_t want);
/* Release cached handles to the driver (all, or just those whose size is not a multiple of
 * `keep_size`, until `need` bytes were released); returns bytes released. */
size_t vmm_handles_release(vmm_allocator *a, size_t keep_size, size_t need);
/* Free reservations that are wholly unmapped. */
void vmm_seg_free_empty(vmm_allocator *a);
/* Classic: cuMemAlloc a segment for a rounded request; returns its FREE block (indexed). */
int vmm_seg_classic_alloc(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size,
                          vmm_block **out);
/* Classic: free cached whole segments (only >= min_size; stop once `need` bytes freed). */
size_t vmm_seg_classic_release(vmm_allocator *a, size_t min_size, size_t need, int oldest_first);
/* Destroy every segment, handle and record. */
void vmm_seg_destroy_all(vmm_allocator *a);
/* Grant the peers of the peer_access key (vmm_create). VMM_ECONFIG for a listed peer refused. */
int vmm_seg_peers_init(vmm_allocator *a);
/* Sum of bytes of cached handles, per pool (for stats checks). */
size_t vmm_handles_bytes(const vmm_allocator *a, int pool);
/* Quarantine entry (see vmm_quarantined) covering va, NULL when none (vmm_check). */
const vmm_quarantined *vmm_quarantine_find(const vmm_allocator *a, uintptr_t va);
/* Map pages [p0, p0 + n) of expandable segment seg with cached or new handles and grant access
 * (peers included), as growth does: VMM_ENOMEM with *short_pages when memory is short; on any
 * failure nothing is mapped. Block states are the caller's business (sleep.c: wake). */
int vmm_seg_map_pages(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n, size_t *short_pages);
/* Unmap the handle mapped at page pg of seg, every page it covers (no-op when unmapped), and
 * release it (release = 1; a handle the driver will not release is cached) or cache it (0).
 * VMM_EDRIVER when the unmap fails (nothing changed), VMM_EHOSTMEM. Block states are the caller's
 * business. */
int vmm_seg_unmap_page(vmm_allocator *a, vmm_segment *seg, size_t pg, int release);
/* Pages from pg to the end of the handle mapped there (1 when pg is unmapped). */
size_t vmm_seg_handle_pages(const vmm_segment *s, size_t pg);
/* Physical handles mapped in s (vmm_check counts handles). */
size_t vmm_seg_handles(const vmm_segment *s);
/* vmm_check's part: handle extents of s; NULL when right, else what is wrong (*at: where). */
const char *vmm_seg_check_handles(const vmm_segment *s, uintptr_t *at);
/* Unmap the pages of a DETACHING block after its before_unmap (callbacks.c): see segment.c. */
size_t vmm_seg_finish_detached(vmm_allocator *a, vmm_block *u, vmm_block **rest);

/* ---- pinned.c ----------------------------------------------------------------------------- */

/* Wait for pending pinned frees, return every pinned block and event to the driver, free the
 * state; called by vmm_destroy before the driver closes. No-op when pinned memory was never used. */
void vmm_pinned_destroy(vmm_allocator *a);

/* ---- history.c ---------------------------------------------------------------------------- */

/* Append an event (VMM_TRACE_*) to the ring; caller holds the lock. Use VMM_HISTORY, whose cost
 * while history is off is one predictable branch. */
void vmm_history_add(vmm_allocator *a, int action, uintptr_t addr, size_t size, vmm_stream s);
#define VMM_HISTORY(a, action, addr, size, stream)                                            \
    do {                                                                                      \
        if (VMM_UNLIKELY((a)->history != NULL))                                               \
            vmm_history_add((a), (action), (uintptr_t)(addr), (size_t)(size), (stream));      \
    } while (0)
/* Monotonic clock in nanoseconds (trace times). */
uint64_t vmm_history_now_ns(void);
/* Copy the ring, oldest first, into a new array of *n entries from vmm_meta_alloc (*out NULL when
 * empty); the caller frees it. VMM_OK or VMM_EHOSTMEM. */
int vmm_history_copy(vmm_allocator *a, vmm_trace_entry **out, size_t *n);
/* Free the ring (vmm_destroy). */
void vmm_history_destroy(vmm_allocator *a);

/* ---- group.c ------------------------------------------------------------------------------ */

/* Forget the fused-buffer record of block b (vmm_free of its head; caller holds the lock). */
void vmm_group_drop(vmm_allocator *a, vmm_block *b);
/* Free the records of groups still live (vmm_destroy, before the live table goes). */
void vmm_group_destroy_all(vmm_allocator *a);
/* Members of b's group: their count, and the offset and size of member i. */
size_t vmm_group_parts(const vmm_block *b);
void vmm_group_part(const vmm_block *b, size_t i, size_t *offset, size_t *size);

/* ---- capture.c ---------------------------------------------------------------------------- */

/* Put the calling thread in relaxed capture mode for the allocator's driver calls (PyTorch's
 * CUDAStreamCaptureModeGuard): returns the mode to give back to vmm_capture_restore, -1 when the
 * driver has no modes. Cheap (thread-local in the driver). */
int vmm_capture_relax(vmm_allocator *a);
void vmm_capture_restore(vmm_allocator *a, int prev);
/* 1 when stream s takes part in a capture now (the driver says so); *id (may be NULL) its id. */
int vmm_capture_stream(vmm_allocator *a, vmm_stream s, uint64_t *id);
/* The allocator must not wait, synchronize or free with an implied synchronization now: routes are
 * in force (captures underway) or stream s captures. Sets no error. */
int vmm_capture_no_sync(vmm_allocator *a, vmm_stream s);
/* Words for an OOM report saying why nothing was waited for (after no_sync), into buf. */
void vmm_capture_oom_note(vmm_allocator *a, vmm_stream s, char *buf, size_t len);
/* record_stream of live block b on stream s, which captures (capture id): remembered, so that the
 * use is dropped rather than waited for once that capture has ended (its work runs in replays). */
int vmm_capture_use_add(vmm_allocator *a, vmm_block *b, vmm_stream s, uint64_t id);
/* What an unrecorded use slot of pending block b on stream s may do now. */
enum { VMM_USE_RECORD = 0, VMM_USE_WAIT = 1, VMM_USE_DROP = 2 };
int vmm_capture_use_check(vmm_allocator *a, const vmm_block *b, vmm_stream s);
/* record_stream of b on s while s does not capture: the use is eager (waited for) from now on. */
void vmm_capture_use_eager(vmm_allocator *a, const vmm_block *b, vmm_stream s);
/* Uses remembered (vmm_check, tests). */
size_t vmm_capture_uses(const vmm_allocator *a);
/* Forget what was remembered for block b (its free completed) or for stream s (destroyed). */
void vmm_capture_forget_block(vmm_allocator *a, const vmm_block *b);
void vmm_capture_forget_stream(vmm_allocator *a, vmm_stream s);
void vmm_capture_destroy(vmm_allocator *a);

/* ---- mempool.c ---------------------------------------------------------------------------- */

/* The private pool an allocation on stream s goes to while routes are in force (NULL: default). */
vmm_mempool *vmm_mempool_route(vmm_allocator *a, vmm_stream s);
/* Released pools waiting for a moment without captures (and for their tags to be awake):
 * dissolve them now if possible (synchronizes the device once). Called when the last route ends,
 * by vmm_empty_cache and by vmm_wake. */
void vmm_mempool_settle(vmm_allocator *a);
/* Totals over private pools for the stats JSON and the OOM report (caller holds the lock). */
void vmm_mempool_totals(const vmm_allocator *a, int64_t *pools, int64_t *reserved, int64_t *allocated,
                        int64_t *routes);
/* vmm_check's part: pools' indexes, routes. *nfree / *nunm: blocks in the pools' indexes. */
int vmm_mempool_check(vmm_allocator *a, size_t *nfree, size_t *nunm);
/* Pool id of a segment ((0, 0) for the default pools), e.g. for snapshots' segment_pool_id. */
void vmm_mempool_id_of(const vmm_segment *s, uint64_t id[2]);
/* Free every pool record and route (vmm_destroy, after the segments went). */
void vmm_mempool_destroy_all(vmm_allocator *a);

/* ---- alloc.c ------------------------------------------------------------------------------ */

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

/* ---- tcache.c: thread caches --------------------------------------------------------------- */

typedef struct vmm_tcache vmm_tcache;
typedef struct vmm_tc_state vmm_tc_state;
/* Give a cached block back to its pool (allocator lock held, block out of its bin): the
 * structural part of a free, no stats (the cache's delta counted it). alloc.c's. */
typedef void (*vmm_tc_release_fn)(vmm_allocator *a, vmm_block *b);
/* vmm_create: caches of at most cap_bytes (0: off); simple_round: sizes up to 64 KiB round to
 * 512 B steps; depot: full bins of freeing threads may go to the depot. VMM_EHOSTMEM. */
int vmm_tc_setup(vmm_allocator *a, size_t cap_bytes, int simple_round, int depot,
                 vmm_tc_release_fn release);
/* vmm_destroy: first (no lock held) unregister, so exiting threads leave a alone; then (lock
 * held) give back every cache's blocks and free the caches. */
void vmm_tc_unregister(vmm_allocator *a);
void vmm_tc_destroy(vmm_allocator *a);
/* Fast paths, allocator lock NOT held: 1 when served by the calling thread's cache, 0 when the
 * allocator must do it (nothing changed). malloc: a block of size's rounded size on stream s. */
int vmm_tc_malloc(vmm_allocator *a, size_t size, vmm_stream s, void **ptr);
/* *trim, when it returns 0: what the caller gives back of the calling thread's cache before its
 * free (vmm_tc_trim_self): 0 nothing, a block size for that bin (it was full, or the cache), or
 * SIZE_MAX for every bin (the cache holds more than a cap that fell). */
int vmm_tc_free(vmm_allocator *a, void *ptr, size_t *trim);
/* Allocator lock held: fold every cache's stats deltas (stats readers), or the calling thread's
 * own (before its slow path changes the counters, which keeps its peaks exact). */
void vmm_tc_fold(vmm_allocator *a);
void vmm_tc_fold_self(vmm_allocator *a);
/* Allocator lock held: give every cache's blocks back (or the calling thread's only); returns the
 * bytes given back. */
size_t vmm_tc_drain(vmm_allocator *a, int self_only);
size_t vmm_tc_drain_one(vmm_allocator *a, vmm_tcache *tc);
/* Allocator lock held: the older half of the calling thread's bin of blocks of `size` back, or of
 * every bin (size SIZE_MAX): a miss that found no fit, a full bin, a full cache; the thread keeps
 * its warm blocks. Returns the bytes given back. */
size_t vmm_tc_trim_self(vmm_allocator *a, size_t size);
/* Lane s's lock held (lane.c), not the allocator's: the older half of the calling thread's blocks
 * of lane s in its bin of `size`-byte blocks back to their pool; no deltas folded. Returns 0 when
 * the bin holds only other lanes' blocks (the allocator trims those), else 1. */
int vmm_tc_trim_lane(vmm_allocator *a, size_t size, vmm_stream s);
/* Lane s's lock held, not the allocator's: the older half of the calling thread's blocks of lane
 * s in every bin back (vmm_tc_trim_self's second step, for one lane; no deltas folded). Returns
 * the bytes given back. */
size_t vmm_tc_trim_lane_all(vmm_allocator *a, vmm_stream s);
/* Lane s's lock held, not the allocator's: vmm_tc_give_fit without folding deltas. */
size_t vmm_tc_give_fit_lane(vmm_allocator *a, size_t size, vmm_stream s);
/* Allocator lock held: the calling thread's smallest cached block of lane s at least `size` bytes
 * back to its pool (a malloc that found no fit: one block, the least disturbance). Returns its
 * size, 0 when the cache has none. */
size_t vmm_tc_give_fit(vmm_allocator *a, size_t size, vmm_stream s);
/* Allocator lock held: caches off for good, drained: sleep, IPC, tags, private pools, history and
 * callbacks need every malloc and free to pass under the allocator lock. */
void vmm_tc_off(vmm_allocator *a);
/* Off for good (vmm_tc_off; not a pause). */
int vmm_tc_disabled(const vmm_allocator *a);
int vmm_tc_on(const vmm_allocator *a);
/* Allocator lock held: caches drained and off until vmm_tc_resume (with pause's return), so that
 * the caller sees one state no thread changes meanwhile (vmm_check, snapshots). */
int vmm_tc_pause(vmm_allocator *a);
void vmm_tc_resume(vmm_allocator *a, int was);
/* Allocator lock or s->blk's lane's held, no thread cache's: 1 when the cache numbered
 * s->tc_owner holds s->blk (takes that cache's lock to look), 0 when no cache does. */
int vmm_tc_holds(vmm_allocator *a, const vmm_live_slot *s);
/* A free's removal from the live table (allocator lock or b's lane's held, no thread cache's): b
 * at addr goes out of the table unless a thread cache holds it (a free of a block freed already).
 * Looking and taking are one step under the lock of the cache the slot names, which every free
 * into that cache holds, so two threads freeing one pointer at once cannot put the block both in a
 * cache and in its pool. hint: the slot's tc_owner as the caller last saw it (0: none), whose
 * cache is locked first. 1 taken, 0 not in the table or cached (nothing changed). */
int vmm_tc_take_live(vmm_allocator *a, uintptr_t addr, const vmm_block *b, unsigned hint);
/* Caches, bytes they hold, most bytes one may hold now, and counts up to the last vmm_tc_fold
 * (the caller folds first, as for the stats): mallocs served and not, frees kept and not (the
 * allocator's), frees kept of blocks another cache handed out; allocator lock held. */
enum { VMM_TC_COUNTS = 5 };
void vmm_tc_info(vmm_allocator *a, size_t *caches, size_t *bytes, size_t *cap,
                 uint64_t counts[VMM_TC_COUNTS]);

/* ---- sleep.c: tags, lanes, sleep / wake --------------------------------------------------- */

/* The stream record serving allocations of (stream, tag): tag 0 is vmm_stream_rec_get's; others
 * are made on first use. VMM_EINVAL (message set) while the tag sleeps, VMM_ENOTSUP without
 * VMM support, VMM_EHOSTMEM. */
int vmm_lane_get(vmm_allocator *a, vmm_stream s, int tag, vmm_stream_rec **out);
/* vmm_free of a block in a segment frozen or asleep (its slot in the live table given): no
 * events, nothing to unmap; its backup goes. Never fails. */
void vmm_sleep_free(vmm_allocator *a, vmm_block *b, size_t slot);
/* vmm_check's part: lanes, sleeping bytes, backups (caller holds the lock). */
int vmm_sleep_check(vmm_allocator *a);
/* vmm_destroy: backups freed (host memory), tag table freed. */
void vmm_sleep_destroy(vmm_allocator *a);
/* 1 when tag t is asleep or going to sleep (caller holds the lock). */
int vmm_sleep_tag_asleep(const vmm_allocator *a, int t);

/* ---- ipc.c -------------------------------------------------------------------------------- */

/* vmm_free of block b (caller holds the lock): 0 free it as usual; 1 it was shared and a consumer
 * still has it open, so it stays allocated until they let go (limbo); VMM_EBADPTR (message set)
 * for a second free of a block in limbo. */
int vmm_ipc_hold(vmm_allocator *a, vmm_block *b);
/* vmm_check's part (caller holds the lock). */
int vmm_ipc_check(vmm_allocator *a);
/* Some block of segment s is shared and open (or about to be opened) in another process. */
int vmm_ipc_shared_in(vmm_allocator *a, const vmm_segment *s);
/* vmm_destroy (before the segments go): opened mappings closed, export records dropped. */
void vmm_ipc_destroy(vmm_allocator *a);
/* vmm_create: apply the ipc key (pages exportable or not). VMM_ECONFIG for ipc:true on a device
 * that cannot export. */
int vmm_ipc_setup(vmm_allocator *a);

/* ---- callbacks.c -------------------------------------------------------------------------- */

/* vmm_add_free_memory_callback with the lock held (ipc.c registers its collector so). */
int vmm_cb_add_free_locked(vmm_allocator *a, vmm_free_memory_fn fn, void *ctx);
/* Run the free-memory callbacks with the lock released (caller holds it; it is held again on
 * return). Returns 1 when one reported freeing memory. */
int vmm_cb_run_free(vmm_allocator *a);
/* seg_map_pages succeeded on pages [p0, p0 + n) of seg (caller holds the lock): queue after_map,
 * in the notice vmm_cb_reserve made. Cannot fail. */
void vmm_cb_mapped(vmm_allocator *a, vmm_segment *seg, size_t p0, size_t n);
/* Room for one more queued notice of n pages, made before mapping so that vmm_cb_mapped cannot
 * fail. VMM_EHOSTMEM (message set). */
int vmm_cb_reserve(vmm_allocator *a, size_t n);
/* reclaim of whole pages [p0, p1) (segment page numbers) of FREE block b (in its index) while
 * mapping callbacks are set: carve them into a DETACHING block (out of every index), queue its
 * before_unmap. Returns the pages detached (0 on a host-memory failure: nothing changed). */
size_t vmm_cb_detach(vmm_allocator *a, vmm_block *b, size_t p0, size_t p1);
/* Work is queued (notices, detached pages): the caller should vmm_unlock_deliver. */
int vmm_cb_pending(const vmm_allocator *a);
/* Caller holds the lock: deliver what is queued (lock released meanwhile), then hold it again.
 * wait: until this thread delivered (else another thread delivering now does it). A no-op inside a
 * callback (the delivering thread goes on after it). */
void vmm_cb_flush(vmm_allocator *a, int wait);
/* Release the lock, deliver queued notices in order (no lock but the delivery mutex held), then
 * take the lock again to unmap the detached pages whose before_unmap ran, and release it. */
void vmm_unlock_deliver(vmm_allocator *a);
/* The same, waiting (a few seconds at most) when another thread delivers: for a malloc that needs
 * detached pages unmapped. */
void vmm_unlock_deliver_wait(vmm_allocator *a);
/* Notices made ahead (sleep / wake): a list of after_map (unmap 0) or before_unmap (1) notices for
 * pages [p0, p0 + n) of seg, queued together in the order added, or freed. */
typedef struct vmm_cb_notice vmm_cb_notice;
int vmm_cb_list_add(vmm_allocator *a, vmm_cb_notice **list, vmm_segment *seg, size_t p0, size_t n, int unmap);
void vmm_cb_list_queue(vmm_allocator *a, vmm_cb_notice *list);
void vmm_cb_list_free(vmm_allocator *a, vmm_cb_notice *list);
/* This thread runs a mapping callback of a (sleep / wake refuse to run there). */
int vmm_cb_delivering(const vmm_allocator *a);
/* Block b is on the detach list (vmm_check). */
int vmm_cb_is_detaching(const vmm_allocator *a, const vmm_block *b);
int vmm_cb_check(vmm_allocator *a);
/* vmm_destroy, before taking the lock: before_unmap for every mapping, then free the state. */
void vmm_cb_destroy(vmm_allocator *a);

/* ---- lane.c: per-lane locks --------------------------------------------------------------- */

/* While lanes are open, the allocator lock holds every lane's lock too (vmm_lock / vmm_unlock call
 * these with the allocator's own lock held); taking them folds the lanes' books into the
 * allocator's counters, so every holder of the allocator lock sees them up to date. */
void vmm_lanes_lock_but(vmm_allocator *a, const vmm_stream_rec *keep);
void vmm_lanes_unlock_but(vmm_allocator *a, const vmm_stream_rec *keep);
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

/* ---- the allocator lock (alloc.c's futex mutex; lane.c's lanes) ---------------------------- */

/* While lanes are open the allocator lock holds every lane's lock too. Inline: one branch more
 * than the mutex alone on the one-thread path, which takes it twice per malloc + free pair. */
static inline void vmm_lock(vmm_allocator *a)
{
    vmm_mutex_lock(&a->lock);
    if (VMM_UNLIKELY(a->lanes_open))
        vmm_lanes_lock_but(a, NULL);
}

static inline void vmm_unlock(vmm_allocator *a)
{
    if (VMM_UNLIKELY(a->lanes_open))
        vmm_lanes_unlock_but(a, NULL);
    vmm_mutex_unlock(&a->lock);
}

/* Allocator lock held, around a driver call: the lanes other than keep (NULL: all) let go, so that
 * other streams' lane paths run while the driver works (lane.c, "Driver calls"). Between the two
 * the caller touches no state of a lane it let go; vmm_lanes_resume takes them again and folds
 * their books, and what the caller read of their state before may have changed. A pair inside
 * another (a batch of calls let go once, such as the poll of pending frees) does nothing; an inner
 * pair must then not need a lane kept, which only an outer pair with keep NULL could break. */
static inline void vmm_lanes_yield(vmm_allocator *a, const vmm_stream_rec *keep)
{
    if (VMM_UNLIKELY(a->lanes_open) && a->lanes_let_go++ == 0)
        vmm_lanes_unlock_but(a, keep);
}

static inline void vmm_lanes_resume(vmm_allocator *a, const vmm_stream_rec *keep)
{
    if (VMM_UNLIKELY(a->lanes_open) && --a->lanes_let_go == 0)
        vmm_lanes_lock_but(a, keep);
}

/* Lane paths may run (a relaxed peek; the lane functions read it again with acquire). */
static inline int vmm_lanes_on(const vmm_allocator *a)
{
    return atomic_load_explicit(&a->lanes_on, memory_order_relaxed);
}

#endif /* VMM_INTERNAL_H */
