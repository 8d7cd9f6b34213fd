/*
 * Core: the allocator's records (blocks, segments, lanes, the live table, the allocator
 * itself), shared by every module above the driver. Declarations are in each module's header.
 */
#ifndef VMM_TYPES_H
#define VMM_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/base.h"
#include "base/metadata.h"
#include "core/config.h"
#include "driver/driver.h"
#include "vmmalloc.h"

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
    VMM_BLOCK_SHADOW = 6,    /* alias_pages (alias.c): bytes of a page mapped at two places that
                              * the other view owns; mapped, in no index, never merged or handed
                              * out, inside one page */
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
    int longlived;             /* expandable large pool: holds the blocks its lane predicts to stay
                                * (pool.c, "Lifetimes") */
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

/* Large-pool blocks of one rounded size allocated and freed in a lane (pool.c, "Lifetimes"), in
 * an open-addressed table keyed by the exact size; size 0: an empty slot. */
enum { VMM_LIFE_SLOTS = 128 };
typedef struct vmm_life_slot {
    size_t size;
    uint32_t n_alloc, n_free;
    uint32_t last;             /* the lane's life_clock when the size was last counted */
} vmm_life_slot;

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
    /* pool.c, "Lifetimes": its large-pool sizes' history (life_clock counts the allocations and
     * frees counted there), and whether requests predicted to stay go to longlived segments (set
     * once one would have left a sliver or a partly used page in a hole) */
    vmm_life_slot life[VMM_LIFE_SLOTS];
    uint32_t life_clock;
    int life_split;
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

/* What modules above the core register with it, so that core and feature code calls up without
 * naming them (docs/design.md, "Layers"): jemalloc's hook tables, PyTorch's registered
 * callbacks. Filled in at vmm_create (alloc.c), before any other thread can see the allocator,
 * unless said otherwise; the others are NULL until their module registers, under the allocator
 * lock, and read under it. */
typedef struct vmm_hooks {
    /* the live table's lookups ask whether a thread cache holds a block (tcache.c's vmm_tc_holds;
     * called only for a slot whose tc_owner is set, which a cache of this allocator wrote) */
    int (*tc_holds)(vmm_allocator *a, const vmm_live_slot *s);
    /* callbacks.c unmaps detached pages once their before_unmap ran (segment.c's
     * vmm_seg_finish_detached) */
    size_t (*finish_detached)(vmm_allocator *a, vmm_block *u, vmm_block **rest);
    /* ipc_api.c's collector frees blocks whose last reader let go, as the user would (vmm_free) */
    int (*free)(vmm_allocator *a, void *ptr);
    /* trace recording: history.c's recorder, set with a->history (VMM_HISTORY) */
    void (*trace)(vmm_allocator *a, int action, uintptr_t addr, size_t size, vmm_stream s);
    /* fused buffers (group.c, set by the first vmm_malloc_group): forget block b's group record
     * (its free), every record (vmm_destroy) */
    void (*group_drop)(vmm_allocator *a, vmm_block *b);
    void (*group_destroy_all)(vmm_allocator *a);
    /* sleep.c's vmm_sleep_tag_asleep: mempool.c keeps a released pool whose tag sleeps until the
     * wake (sleep.c's wake settles the pools, so mempool cannot call sleep back directly) */
    int (*tag_asleep)(const vmm_allocator *a, int tag);
} vmm_hooks;

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
    struct vmm_alias *aliases;         /* pages mapped at two places (alias.c) */
    size_t n_aliases;
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
    struct vmm_ipc *ipc;               /* exports and imports (features/ipc.c); NULL until first used */
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
    vmm_hooks hooks;                   /* last: no field of the hot lines above moves */
};

#endif /* VMM_TYPES_H */
