/*
 * Block records and the pools: size rounding, best-fit index (a treap ordered by stream, size,
 * address, like PyTorch's std::set), split / merge, and the live-block hash table.
 */

#include <stdlib.h>

#include "base/base.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "base/mutex.h"
#include "core/config.h"
#include "core/counters.h"
#include "core/lane.h"
#include "core/pool.h"
#include "core/trace.h"
#include "core/types.h"

enum {
    MIN_BLOCK = 512,                  /* PyTorch kMinBlockSize: every size a multiple of it */
    SMALL_SIZE = 1 << 20,             /* requests up to 1 MiB go to the small pool */
    SMALL_BUFFER = 2 << 20,           /* classic small-pool segment */
    LARGE_BUFFER = 20 << 20,          /* classic segment for requests below MIN_LARGE_ALLOC */
    MIN_LARGE_ALLOC = 10 << 20,
    ROUND_LARGE = 2 << 20,            /* classic large segments round up to this */
    LIVE_MIN_CAP = 64,                /* first live-table size (power of two) */
    LIVE_LOAD_DIV = 4,                /* live table kept at most 1/4 full: at 1/2, probe runs of
                                       * varying length made the lookup's and removal's loop exits
                                       * mispredict on ~1 pair in 3; 2 more slots (32 bytes) per
                                       * live block */
    BLOCK_CACHE_MAX = 4096,           /* recycled records kept: ~0.5 MiB of host memory at most */
    LANE_CACHE_MAX = 256,             /* per lane (lane.c): a lane path's splits and merges */
};

/* ---- rounding ---------------------------------------------------------------------------- */

static unsigned pow2_divisions_for(const vmm_config *c, size_t size)
{
    /* interval 0: below 2 MiB; interval k: [2^k, 2^(k+1)) MiB (see config.h comment). */
    unsigned log_size = 63u - (unsigned)__builtin_clzll((unsigned long long)size);
    unsigned index = log_size > 20 ? log_size - 20 : 0;
    if (index >= VMM_POW2_INTERVALS)
        index = VMM_POW2_INTERVALS - 1;
    return c->pow2_divisions[index];
}

static size_t next_division(size_t size, unsigned divisions)
{
    if ((size & (size - 1)) == 0)
        return size;
    size_t floor2 = vmm_floor_pow2(size);
    size_t step = floor2 / divisions;
    if (step == 0)
        return size;
    size_t rounded = size & ~(step - 1);
    return rounded == size ? size : rounded + step;
}

static inline size_t round_size(const vmm_config *c, size_t size)
{
    if (size < MIN_BLOCK)
        return MIN_BLOCK;
    unsigned div = pow2_divisions_for(c, size);
    /* Only when a division step is at least 512 B, so results stay multiples of 512. */
    if (div > 1 && size > (size_t)MIN_BLOCK * div)
        return next_division(size, div);
    return (size + MIN_BLOCK - 1) / MIN_BLOCK * MIN_BLOCK;
}

size_t vmm_round_size(const vmm_config *c, size_t size) { return round_size(c, size); }

static inline int pool_of(size_t rounded) { return rounded <= SMALL_SIZE ? VMM_SMALL : VMM_LARGE; }

int vmm_pool_of(size_t rounded) { return pool_of(rounded); }

size_t vmm_classic_segment_size(size_t rounded)
{
    if (rounded <= SMALL_SIZE)
        return SMALL_BUFFER;
    if (rounded < MIN_LARGE_ALLOC)
        return LARGE_BUFFER;
    return (rounded + ROUND_LARGE - 1) / ROUND_LARGE * ROUND_LARGE;
}

/* ---- block records ----------------------------------------------------------------------- */

/* A record with its treap priority set and every other field stale (recycled) or zero (new), from
 * the record cache of books bk (a lane's), or the allocator's (bk NULL). */
_Static_assert(sizeof(vmm_block) == VMM_META_REC, "block records come from vmm_meta_rec_alloc");

static vmm_block *block_pop(vmm_allocator *a, vmm_books *bk)
{
    vmm_block **cache = bk ? &bk->block_cache : &a->block_cache;
    size_t *n = bk ? &bk->n_block_cache : &a->n_block_cache;
    vmm_block *b = *cache;
    if (b) {
        /* recycled: splitting and merging churn records, the metadata allocator is slower */
        *cache = b->next;
        (*n)--;
        return b;
    }
    b = vmm_meta_rec_alloc(a->meta); /* thread safe: lane paths allocate side by side */
    if (b) {
        /* treap priority from a counter hashed (splitmix-style): deterministic, well mixed */
        static _Thread_local uint64_t ctr;
        uint64_t z = (++ctr + (uint64_t)(uintptr_t)b) * 0x9E3779B97F4A7C15ull;
        z ^= z >> 31;
        b->prio = (uint32_t)(z * 0xBF58476D1CE4E5B9ull >> 32);
    }
    return b;
}

/* Every field but prio set, one store each: a compound-literal assignment compiles to
 * `rep stos` over the record, whose start-up cost alone was a sizeable part of a cached malloc.
 * Lists every field of struct vmm_block (its size assertion flags additions). */
static inline void block_init(vmm_block *f, uintptr_t addr, size_t size, vmm_segment *seg,
                              vmm_block *prev, vmm_block *next, uint64_t free_seq, uint64_t gc_stamp)
{
    f->addr = addr;
    f->size = size;
    f->seg = seg;
    f->left = f->right = NULL;
    f->state = VMM_BLOCK_FREE;
    f->in_index = 0;
    f->grouped = 0;
    f->n_uses = 0;
    f->prev = prev;
    f->next = next;
    f->requested = 0;
    f->free_seq = free_seq;
    f->gc_stamp = gc_stamp;
    f->ext = NULL;
    f->dprev = f->dnext = NULL;
    f->group = NULL;
}

vmm_block *vmm_block_new(vmm_allocator *a)
{
    vmm_block *b = block_pop(a, NULL);
    if (b)
        block_init(b, 0, 0, NULL, NULL, NULL, 0, 0);
    return b;
}

/* A record's side record (record_stream uses), freed with it. */
static void ext_free(vmm_allocator *a, vmm_block *b)
{
    vmm_block_ext *x = b->ext;
    if (VMM_UNLIKELY(x != NULL)) {
        if (x->uses)
            vmm_meta_free(a->meta, x->uses, x->cap_uses * sizeof *x->uses);
        if (x->events)
            vmm_meta_free(a->meta, x->events, x->cap_events * sizeof *x->events);
        vmm_meta_free(a->meta, x, sizeof *x);
        b->ext = NULL;
    }
}

/* Delete record b (side record freed) into a record cache of at most cap records, or free it. */
static void cache_put(vmm_allocator *a, vmm_block **cache, size_t *n, size_t cap, vmm_block *b)
{
    ext_free(a, b);
    if (*n < cap) {
        b->next = *cache;
        *cache = b;
        (*n)++;
        return;
    }
    vmm_meta_rec_free(a->meta, b);
}

static void cache_drain(vmm_allocator *a, vmm_block **cache, size_t *n)
{
    while (*cache) {
        vmm_block *b = *cache;
        *cache = b->next;
        vmm_meta_rec_free(a->meta, b);
    }
    *n = 0;
}

void vmm_block_delete(vmm_allocator *a, vmm_block *b)
{
    cache_put(a, &a->block_cache, &a->n_block_cache, BLOCK_CACHE_MAX, b);
}

/* Delete a record of a segment's blocks into the record cache of its books (NULL: the allocator's). */
static void block_drop(vmm_allocator *a, vmm_books *bk, vmm_block *b)
{
    if (bk)
        cache_put(a, &bk->block_cache, &bk->n_block_cache, LANE_CACHE_MAX, b);
    else
        vmm_block_delete(a, b);
}

void vmm_block_cache_drain_books(vmm_allocator *a, vmm_books *bk)
{
    cache_drain(a, &bk->block_cache, &bk->n_block_cache);
}

void vmm_block_cache_drain(vmm_allocator *a)
{
    cache_drain(a, &a->block_cache, &a->n_block_cache);
}

/* ---- treap ------------------------------------------------------------------------------- */

/* The first key is the segment's lane key (segment.key): its stream for untagged memory, so
 * callers pass a stream; tagged memory has lanes of its own (sleep.c). */
static int key_cmp(vmm_stream s, size_t size, uintptr_t addr, const vmm_block *b)
{
    uintptr_t bs = (uintptr_t)b->seg->key, ks = (uintptr_t)s;
    if (ks != bs)
        return ks < bs ? -1 : 1;
    if (size != b->size)
        return size < b->size ? -1 : 1;
    if (addr != b->addr)
        return addr < b->addr ? -1 : 1;
    return 0;
}

/* (s, size, addr) < b's key, or <= with or_equal: computed without branches. The walks below
 * descend by this test, and with mixed request sizes its outcome is a coin toss at every level:
 * as branches, a mispredict per level or two dominated the cached malloc + free pair. */
static inline int key_before(vmm_stream s, size_t size, uintptr_t addr, const vmm_block *b,
                             int or_equal)
{
    uintptr_t bs = (uintptr_t)b->seg->key, ks = (uintptr_t)s;
    size_t bsz = b->size;
    int addr_ok = (addr < b->addr) | ((addr == b->addr) & or_equal);
    return (ks < bs) | ((ks == bs) & ((size < bsz) | ((size == bsz) & addr_ok)));
}

/* Branchy compare for insert / erase, whose walks are short on the cached path (erase follows a
 * known key; in fixed-size loops every outcome predicts well and the branchless form cost more). */
static int block_less(const vmm_block *x, const vmm_block *y)
{
    return key_cmp(x->seg->key, x->size, x->addr, y) < 0;
}

/* Split t into keys < k (l) and keys >= k (r). */
static void treap_split(vmm_block *t, const vmm_block *k, vmm_block **l, vmm_block **r)
{
    while (t) {
        if (block_less(t, k)) {
            *l = t;
            l = &t->right;
            t = t->right;
        } else {
            *r = t;
            r = &t->left;
            t = t->left;
        }
    }
    *l = *r = NULL;
}

static vmm_block *treap_merge(vmm_block *l, vmm_block *r)
{
    vmm_block *root = NULL, **link = &root;
    while (l && r) {
        if (l->prio > r->prio) {
            *link = l;
            link = &l->right;
            l = l->right;
        } else {
            *link = r;
            link = &r->left;
            r = r->left;
        }
    }
    *link = l ? l : r;
    return root;
}

void vmm_tree_insert(vmm_block **root, vmm_block *b)
{
    vmm_block **link = root;
    /* descend while parents have higher priority, then split the subtree around b */
    while (*link && (*link)->prio > b->prio)
        link = block_less(b, *link) ? &(*link)->left : &(*link)->right;
    treap_split(*link, b, &b->left, &b->right);
    *link = b;
}

void vmm_tree_erase(vmm_block **root, vmm_block *b)
{
    vmm_block **link = root;
    while (*link && *link != b)
        link = block_less(b, *link) ? &(*link)->left : &(*link)->right;
    if (*link) {
        *link = treap_merge(b->left, b->right);
        b->left = b->right = NULL;
    }
}

int vmm_tree_contains(vmm_block *root, const vmm_block *b)
{
    while (root && root != b)
        root = block_less(b, root) ? root->left : root->right;
    return root == b;
}

vmm_block *vmm_tree_lower_bound(vmm_block *t, vmm_stream s, size_t size, uintptr_t addr)
{
    vmm_block *best = NULL;
    while (t) {
        /* both children loaded, then selected: conditional moves, no data-dependent branch */
        vmm_block *l = t->left, *r = t->right;
        int le = key_before(s, size, addr, t, 1);
        best = le ? t : best;
        t = le ? l : r;
    }
    return best;
}

vmm_block *vmm_tree_next(vmm_block *t, const vmm_block *b)
{
    vmm_block *best = NULL;
    while (t) {
        vmm_block *l = t->left, *r = t->right;
        int lt = key_before(b->seg->key, b->size, b->addr, t, 0);
        best = lt ? t : best;
        t = lt ? l : r;
    }
    return best;
}

/* ---- pools -------------------------------------------------------------------------------- */

static int live_reserve(vmm_allocator *a, uintptr_t addr, int pool);
static void live_put_block(vmm_allocator *a, vmm_block *b);
static void live_unreserve(vmm_allocator *a, uintptr_t addr, int pool);

static int is_split(const vmm_block *b) { return b->prev || b->next; }

/* Where a segment's blocks count: its lane's deltas while its lane path runs (lane.c), else the
 * allocator's counters. */
static inline vmm_stats *stats_of(vmm_allocator *a, const vmm_segment *seg)
{
    vmm_books *bk = vmm_books_of(a, seg);
    return bk ? &bk->d : &a->stats;
}

/* Where a segment's block records are recycled: its lane's cache while lanes are open, whoever
 * splits or merges (the allocator lock holds every lane's), so that the records a lane's frees
 * give back serve its mallocs; the allocator's otherwise. */
static inline vmm_books *rec_books(vmm_allocator *a, const vmm_segment *seg)
{
    return VMM_UNLIKELY(a->lanes_open) && !seg->mp ? &seg->srec->bk : NULL;
}

void vmm_pool_insert(vmm_allocator *a, vmm_block *b)
{
    int pool = b->seg->pool;
    b->left = b->right = NULL;
    b->in_index = 1;
    if (b->state == VMM_BLOCK_UNMAPPED) {
        vmm_tree_insert(VMM_UNMAPPED_ROOT(a, b->seg), b);
        a->n_unmapped_blocks++;
        return;
    }
    vmm_tree_insert(VMM_FREE_ROOT(a, b->seg), b);
    if (is_split(b)) {
        vmm_stats *st = stats_of(a, b->seg);
        vmm_hot_up(st->inactive_split, pool, 1);
        vmm_hot_up(st->inactive_split_bytes, pool, (int64_t)b->size);
    }
}

void vmm_pool_erase(vmm_allocator *a, vmm_block *b)
{
    int pool = b->seg->pool;
    b->in_index = 0;
    if (b->state == VMM_BLOCK_UNMAPPED) {
        vmm_tree_erase(VMM_UNMAPPED_ROOT(a, b->seg), b);
        a->n_unmapped_blocks--;
        return;
    }
    vmm_tree_erase(VMM_FREE_ROOT(a, b->seg), b);
    if (is_split(b)) {
        vmm_stats *st = stats_of(a, b->seg);
        vmm_hot_down(st->inactive_split, pool, 1);
        vmm_hot_down(st->inactive_split_bytes, pool, (int64_t)b->size);
    }
}

/* ---- lifetimes ----------------------------------------------------------------------------
 * A layer-by-layer forward pass keeps some tensors (1.125 and 4.5 MiB activations that stay to the
 * end) among others freed within a few allocations (1.5 and 3 MiB temporaries). Best fit puts a
 * tensor that stays into a temporary's hole (1.125 MiB in 1.5 MiB), and the sliver beside it
 * (0.375 MiB) serves no later large request: with one handle per page such slivers held 14.3 pages
 * above what was handed out at the peak of a 244 MiB pass. Online a block's lifetime is guessed
 * from its size's history in its lane: a size most of whose blocks are still live is predicted to
 * stay. Once such a request's best fit, a hole between blocks (not at the end of a mapped run),
 * would leave a sliver (1 MiB or less) or, for a request of LIFE_PARTIAL_PAGES pages or more, end
 * inside a page that the hole's remainder then shares, the lane splits: from then on requests
 * predicted to stay take the best fit among its longlived segments' free blocks or grow one of
 * them, and the others grow only the lane's other segments (their best fit still takes any free
 * block). The temporaries then free whole runs that the next ones refill, and what stays packs end
 * to end: 4.3 pages on that pass. The partly-used-page rule is for autocast's weight copies in a
 * bf16 forward pass (12.5 MiB copies that stay, each put into a freed 20 MiB activation's hole:
 * 1.0523 held/handed on a 2.7B-parameter model at context 512, 1.0009 with the rule); under two
 * pages, a request's many partly used pages are mostly activations' that later small requests
 * fill, and splitting on them cost a forward pass 0.0008 of smallest capacity (docs/benchmarks.md,
 * "Handle sizes").
 * Splitting every lane from the start (a second segment at once) got to 2.3 pages there but cost
 * the traces of 1 GB or more up to two pages each, past the smallest-capacity target on three
 * (docs/benchmarks.md, "Handle sizes"). A request of LIFE_BIG or more is never predicted to stay:
 * a sliver beside it costs under 0.4% of it, and one wrongly predicted (the second block of a
 * size, while the first is live) grows the longlived segments by all its pages, which the other
 * segments' growths then take back page by page layer after layer (a calibration loop's 1 GiB
 * temporaries: 21,372 pages remapped against 5,888). Expandable large pool of the default pools
 * only. */

enum {
    LIFE_SLIVER = 1 << 20,  /* a free remainder no large request fits (the large pool's floor) */
    LIFE_PARTIAL_PAGES = 2, /* requests this many pages or more split the lane on a partly used page */
    LIFE_SCAN = 64,         /* longlived candidates looked at past other segments' blocks */
    LIFE_PROBE = 4,         /* slots a size may take, from its hash on (the table's window) */
};
_Static_assert((VMM_LIFE_SLOTS & (VMM_LIFE_SLOTS - 1)) == 0 && (int)LIFE_PROBE <= (int)VMM_LIFE_SLOTS,
               "life table: a power of two, at least one window");
#define LIFE_BIG ((size_t)256 << 20) /* requests this large are never predicted to stay */

/* The history is keyed by the exact size. It was a direct-mapped table of 32 slots, where 12.5, 20
 * and 50 MiB shared one: every 20 MiB temporary restarted the count of the 12.5 MiB weight copies
 * that stay, so none was ever predicted to stay. Now a size takes a slot in a window of LIFE_PROBE
 * from its hash, a new one the window's empty slot or else the window's size counted least
 * recently, which is forgotten (so a lane keeps up to VMM_LIFE_SLOTS sizes, fewer where windows
 * crowd). Every large malloc and free looks its size up (up to three times a pair), so the hash
 * is one multiply (Fibonacci hashing: the product's top bits) and the first slot is tried apart. */
enum { LIFE_HASH_BITS = 7 }; /* log2(VMM_LIFE_SLOTS) */
_Static_assert((1 << LIFE_HASH_BITS) == VMM_LIFE_SLOTS, "LIFE_HASH_BITS: log2 of the table size");

static inline size_t life_hash(size_t size)
{
    /* large sizes are multiples of 512 */
    return (size_t)(((uint64_t)size >> 9) * 0x9E3779B97F4A7C15ull >> (64 - LIFE_HASH_BITS));
}

/* Size's slot in sr's history, or NULL when it has none; with insert, a slot (emptied) for a size
 * that has none. */
static inline vmm_life_slot *life_find(vmm_stream_rec *sr, size_t size, int insert)
{
    size_t h = life_hash(size);
    vmm_life_slot *victim = &sr->life[h];
    if (VMM_LIKELY(victim->size == size))
        return victim;
    for (unsigned k = 1; k < LIFE_PROBE; k++) {
        vmm_life_slot *l = &sr->life[(h + k) & (VMM_LIFE_SLOTS - 1)];
        if (l->size == size)
            return l;
        if (insert && victim->size && (!l->size || (int32_t)(l->last - victim->last) < 0))
            victim = l; /* an empty slot, else the stalest (by difference: the clock wraps) */
    }
    if (!insert)
        return NULL;
    victim->size = size;
    victim->n_alloc = victim->n_free = 0;
    return victim;
}

int vmm_pool_long_lived(const vmm_allocator *a, vmm_stream_rec *sr, size_t size)
{
    if (!sr || !a->cfg.lifetime_split || !a->cfg.expandable_segments || pool_of(size) != VMM_LARGE)
        return -1;
    if (size >= LIFE_BIG)
        return 0;
    const vmm_life_slot *l = life_find(sr, size, 0);
    return l && 2ull * l->n_free < l->n_alloc;
}

int vmm_pool_life_split(const vmm_stream_rec *sr) { return sr->life_split; }

/* Large-pool block b of a default-pool expandable segment is allocated (freed 0) or freed. */
static inline void life_note(vmm_block *b, int freed)
{
    const vmm_segment *seg = b->seg;
    /* a small request in a large-pool sliver is never predicted (vmm_pool_long_lived): counting it
     * would only take a large size's slot and restart that size's count */
    if (!seg->expandable || seg->mp || pool_of(b->size) != VMM_LARGE)
        return;
    vmm_life_slot *l = life_find(seg->srec, b->size, !freed);
    if (!l)
        return; /* a free of a size forgotten since */
    l->last = ++seg->srec->life_clock;
    if (freed) {
        if (l->n_free < l->n_alloc)
            l->n_free++;
    } else if (++l->n_alloc == UINT32_MAX) {
        l->n_alloc /= 2; /* the ratio is what counts */
        l->n_free /= 2;
    }
}

static inline vmm_block *best_fit(vmm_allocator *a, vmm_block *root, vmm_stream s, size_t size)
{
    vmm_block *b = vmm_tree_lower_bound(root, s, size, 0);
    if (!b || b->seg->key != s)
        return NULL;
    size_t max_split = a->cfg.max_split_size;
    /* Keep oversize blocks for oversize requests, and don't waste more than
     * max_non_split_rounding on one (PyTorch's rules). */
    if (max_split != SIZE_MAX && size < max_split && b->size >= max_split)
        return NULL;
    if (max_split != SIZE_MAX && size >= max_split && b->size - size >= a->cfg.max_non_split_rounding)
        return NULL;
    return b;
}

/* Best fit in lane sr (key s) for a request predicted to stay ("Lifetimes"): before the lane has
 * split, the lane's best fit unless, in a hole between blocks, it would leave a sliver or a partly
 * used page (then the lane splits and NULL: the request grows a longlived segment); after, the best fit among longlived segments'
 * free blocks, or NULL when none fits (a longlived segment grows). Past LIFE_SCAN blocks of other
 * segments the lane's best fit after all: growth would not find the longlived block further on
 * either (a free block that fits alone is no growth target) and would reserve a new segment per
 * request. *fitted cleared when the answer is not the lower bound (pool_take may then not carve
 * it in its index slot). */
static vmm_block *best_fit_long(vmm_allocator *a, vmm_stream_rec *sr, vmm_block *root, vmm_stream s,
                                size_t size, int *fitted)
{
    vmm_block *b = best_fit(a, root, s, size), *b0 = b;
    if (!b)
        return NULL;
    if (!sr->life_split) {
        size_t rem = b->size - size, ps = b->seg->page_size;
        int run_end = !b->next || b->next->state == VMM_BLOCK_UNMAPPED;
        int partial = size >= LIFE_PARTIAL_PAGES * ps && (b->addr + size) % ps != 0;
        if (rem == 0 || run_end || (rem > LIFE_SLIVER && !partial))
            return b;
        sr->life_split = 1;
        return NULL;
    }
    size_t max_split = a->cfg.max_split_size;
    for (int n = 0; b->seg->longlived != 1; n++) {
        b = vmm_tree_next(root, b);
        if (!b || b->seg->key != s)
            return NULL;
        if (n == LIFE_SCAN)
            return b0;
        *fitted = 0;
        /* best_fit's rules, which hold for every larger block: oversize blocks for oversize
         * requests only, and no more than max_non_split_rounding wasted on one */
        if (max_split != SIZE_MAX && size < max_split && b->size >= max_split)
            return NULL;
        if (max_split != SIZE_MAX && size >= max_split && b->size - size >= a->cfg.max_non_split_rounding)
            return NULL;
    }
    return b;
}

vmm_block *vmm_pool_fit_any(vmm_allocator *a, vmm_stream_rec *sr, int pool, size_t size)
{
    return sr ? best_fit(a, sr->free_tree[pool], sr->key, size) : NULL;
}

void vmm_block_split_into(vmm_block *b, vmm_block *r, size_t size)
{
    r->addr = b->addr + size;
    r->size = b->size - size;
    r->seg = b->seg;
    r->state = b->state;
    r->free_seq = b->free_seq;
    r->gc_stamp = b->gc_stamp;
    r->prev = b;
    r->next = b->next;
    if (b->next)
        b->next->prev = r;
    b->next = r;
    b->size = size;
}

vmm_block *vmm_block_split(vmm_allocator *a, vmm_block *b, size_t size)
{
    vmm_block *r = block_pop(a, rec_books(a, b->seg));
    if (r) {
        block_init(r, 0, 0, NULL, NULL, NULL, 0, 0);
        vmm_block_split_into(b, r, size);
    }
    return r;
}

/* Absorb `n` (the next neighbour of b, out of the index) into b and delete it. */
static void absorb_next(vmm_allocator *a, vmm_block *b, vmm_block *n)
{
    b->size += n->size;
    b->next = n->next;
    if (n->next)
        n->next->prev = b;
    if (n->free_seq > b->free_seq)
        b->free_seq = n->free_seq;
    if (n->gc_stamp > b->gc_stamp)
        b->gc_stamp = n->gc_stamp;
    block_drop(a, rec_books(a, b->seg), n);
}

vmm_block *vmm_block_merge(vmm_allocator *a, vmm_block *b)
{
    vmm_block *n = b->next;
    if (n && n->state == b->state) {
        vmm_pool_erase(a, n);
        absorb_next(a, b, n);
    }
    vmm_block *p = b->prev;
    if (p && p->state == b->state) {
        vmm_pool_erase(a, p);
        absorb_next(a, p, b);
        b = p;
    }
    return b;
}

static int should_split(const vmm_allocator *a, const vmm_block *b, size_t size)
{
    size_t rem = b->size - size;
    if (b->seg->expandable || b->seg->pool == VMM_SMALL)
        return rem >= MIN_BLOCK;
    return size < a->cfg.max_split_size && rem > SMALL_SIZE;
}

/* Allocation carved from the front of free block b, which stays indexed in its slot with the
 * remainder's key. Valid when b is the lower bound of (stream, size, 0) and the remainder is not
 * smaller than `size`: the remainder's key then still lies above (stream, size, 0), so no other key
 * falls between its old and new key. inactive_split stats change by the net amount, as PyTorch's
 * alloc_found_block does ("an already-split inactive block is being shrunk"): same current and
 * peak as erase + insert, two stat updates fewer on the hot path. */
static vmm_block *carve_front(vmm_allocator *a, vmm_block *b, size_t size)
{
    vmm_block *f = block_pop(a, rec_books(a, b->seg));
    if (VMM_UNLIKELY(!f))
        return NULL;
    int pool = b->seg->pool;
    vmm_stats *st = stats_of(a, b->seg);
    int was_split = is_split(b);
    /* one initialisation of the whole record (vmm_block_new would clear it first) */
    block_init(f, b->addr, size, b->seg, b->prev, b, b->free_seq, b->gc_stamp);
    if (b->prev)
        b->prev->next = f;
    else
        b->seg->first = f;
    b->prev = f;
    b->addr += size;
    b->size -= size;
    if (was_split) {
        vmm_hot_down(st->inactive_split_bytes, pool, (int64_t)size);
    } else {
        vmm_hot_up(st->inactive_split, pool, 1);
        vmm_hot_up(st->inactive_split_bytes, pool, (int64_t)b->size);
    }
    return f;
}

static inline int pool_take(vmm_allocator *a, vmm_block **bp, size_t size, size_t requested,
                            int fitted)
{
    vmm_block *b = *bp;
    {
        /* room first so the insert below cannot fail after the block changed (the allocated
         * block keeps b's address whichever way it is split) */
        int rc = live_reserve(a, b->addr, b->seg->pool);
        if (VMM_UNLIKELY(rc))
            return rc;
    }
    if (!should_split(a, b, size)) {
        vmm_pool_erase(a, b);
    } else if (fitted && b->size - size >= size) {
        vmm_block *f = carve_front(a, b, size);
        if (!f) {
            live_unreserve(a, b->addr, b->seg->pool);
            return vmm_fail(VMM_EHOSTMEM, "vmm_malloc: out of host memory for a block record");
        }
        b = f;
    } else {
        vmm_pool_erase(a, b);
        vmm_block *rem = vmm_block_split(a, b, size);
        if (!rem) {
            vmm_pool_insert(a, b);
            live_unreserve(a, b->addr, b->seg->pool);
            return vmm_fail(VMM_EHOSTMEM, "vmm_malloc: out of host memory for a block record");
        }
        vmm_pool_insert(a, rem);
    }
    int pool = b->seg->pool;
    b->state = VMM_BLOCK_ALLOCATED;
    b->requested = requested;
    if (pool == VMM_LARGE)
        life_note(b, 0);
    live_put_block(a, b); /* room was made above */
    /* a lane's deltas while its path runs: active's peaks are taken when they are folded (lane.c) */
    vmm_books *bk = vmm_books_of(a, b->seg);
    vmm_stats *st = bk ? &bk->d : &a->stats;
    int64_t all_n = vmm_hot_up(st->allocation, pool, 1);
    int64_t all_b = vmm_hot_up(st->allocated_bytes, pool, (int64_t)b->size);
    vmm_hot_up(st->requested_bytes, pool, (int64_t)requested);
    if (a->cfg.max_split_size != SIZE_MAX && b->size >= a->cfg.max_split_size)
        vmm_stat_add(&st->oversize_allocations, 1);
    if (!bk) {
        /* active (= allocation + pending) rises only here: its peaks */
        vmm_peak_at(&st->active[pool + 1], st->allocation[pool + 1].current + a->pending[pool].current);
        vmm_peak_at(&st->active[VMM_POOL_ALL], all_n + a->pending[0].current + a->pending[1].current);
        vmm_peak_at(&st->active_bytes[pool + 1],
                    st->allocated_bytes[pool + 1].current + a->pending_bytes[pool].current);
        vmm_peak_at(&st->active_bytes[VMM_POOL_ALL],
                    all_b + a->pending_bytes[0].current + a->pending_bytes[1].current);
    }
    *bp = b;
    return VMM_OK;
}

int vmm_pool_take(vmm_allocator *a, vmm_block **bp, size_t size, size_t requested, int fitted)
{
    return pool_take(a, bp, size, requested, fitted);
}


/* A free block of the large pool that a small request of `size` bytes (rounded) fits and that no
 * large request ever can: of 1 MiB or less, between two live blocks (it grows only when one of them
 * is freed), in an expandable segment of lane s. With one handle per page, a large pool's peak
 * holds such slivers where activations of odd sizes (5 MiB beside 1 MiB gaps, 1.125 MiB tensors in
 * 1.5 MiB holes) were placed; serving small requests there instead of growing the small pool met
 * the smallest-capacity target on the two traces that missed it (ctx-128 forward 1.0061x -> 1.0032x
 * the lower bound, its mixed-precision run 1.0055x -> 1.0047x) and changed no other trace of 1 GB
 * or more by over 0.0001 (docs/benchmarks.md, "Handle sizes"). Slivers beside unmapped pages or a
 * segment's end are left: growth extends those for large requests. */
static vmm_block *large_sliver(vmm_stream_rec *sr, vmm_stream s, size_t size)
{
    vmm_block *l = vmm_tree_lower_bound(sr->free_tree[VMM_LARGE], s, size, 0);
    if (!l || l->seg->key != s || !l->seg->expandable || l->size > SMALL_SIZE)
        return NULL;
    if (!l->prev || l->prev->state != VMM_BLOCK_ALLOCATED || !l->next || l->next->state != VMM_BLOCK_ALLOCATED)
        return NULL;
    return l;
}

int vmm_pool_aliasable(const vmm_allocator *a, const vmm_segment *seg)
{
    return a->cfg.alias_pages && seg->expandable && seg->pool == VMM_LARGE && !seg->mp &&
           !seg->srec->tag && !seg->asleep && seg->max_handle_pages == 1 && !a->dev.posix_fd_handles &&
           !a->cb_mapping;
}

/* alias_place (alias.c): whether free block b, the best fit for a large request of r bytes, is
 * refused, so that growth builds the request from free page edges and whole pages. Taken: a
 * request under a page (it fits in one page's free run, as best fit places it), a block of the
 * same size (within alias_place_slack: the layout of a freed block of that size again), and with
 * alias_place_hybrid one whose remainder is no gap inside a page (it ends on a page boundary or
 * runs past the end of the page where the request ends). */
static int place_refuses(const vmm_allocator *a, const vmm_block *b, size_t r)
{
    const vmm_segment *seg = b->seg;
    size_t ps = seg->page_size;
    if (r < ps || b->size - r <= a->cfg.alias_place_slack || !vmm_pool_aliasable(a, seg))
        return 0;
    if (a->cfg.alias_place_hybrid) {
        size_t e = b->addr + r - seg->base, end = b->addr + b->size - seg->base;
        if (e % ps == 0 || end % ps == 0 || end / ps != e / ps)
            return 0;
    }
    return 1;
}

int vmm_pool_malloc_cached(vmm_allocator *a, vmm_mempool *mp, vmm_stream_rec *sr, size_t size,
                           vmm_stream s, vmm_block **out, size_t *rounded, int *pool)
{
    /* one call for malloc's cached path: rounding, pool and best fit inline here */
    size_t r = round_size(&a->cfg, size);
    int p = pool_of(r);
    /* a private pool's blocks are in its own index (mempool.c) */
    vmm_block *root = VMM_UNLIKELY(mp != NULL) ? mp->free_tree[p] : sr ? sr->free_tree[p] : NULL;
    int fitted = 1;
    vmm_block *b = VMM_UNLIKELY(p == VMM_LARGE) && !mp && vmm_pool_long_lived(a, sr, r) == 1
                       ? best_fit_long(a, sr, root, s, r, &fitted)
                       : best_fit(a, root, s, r);
    if (VMM_UNLIKELY(p == VMM_LARGE) && b && a->cfg.alias_place && !mp && place_refuses(a, b, r))
        b = NULL; /* built from page edges and whole pages by growth (segment.c) */
    *rounded = r;
    *pool = p;
    *out = NULL;
    if (VMM_UNLIKELY(!b) && p == VMM_SMALL && !mp && sr)
        b = large_sliver(sr, s, r);
    if (VMM_UNLIKELY(!b))
        return VMM_OK;
    int rc = pool_take(a, &b, r, size, fitted);
    if (rc == VMM_OK)
        *out = b;
    return rc;
}

/* Merge b (just freed, not indexed) into its one free neighbour `keep` (indexed), which stays in
 * its index slot with the merged key. Valid when no indexed key lies between keep's old key and the
 * merged one (which is larger: same stream, larger size); checked against keep's successor. Returns
 * 0 (nothing changed) when it would not be. */
static int merge_in_place(vmm_allocator *a, vmm_block *b, vmm_block *keep)
{
    int pool = b->seg->pool;
    size_t size = b->size + keep->size;
    uintptr_t addr = b->addr < keep->addr ? b->addr : keep->addr;
    const vmm_block *succ = vmm_tree_next(*VMM_FREE_ROOT(a, keep->seg), keep);
    if (succ && key_cmp(b->seg->key, size, addr, succ) >= 0)
        return 0;
    size_t old_size = keep->size;
    if (keep == b->next) {
        keep->addr = b->addr;
        keep->prev = b->prev;
        if (b->prev)
            b->prev->next = keep;
        else
            b->seg->first = keep;
    } else {
        keep->next = b->next;
        if (b->next)
            b->next->prev = keep;
    }
    keep->size = size;
    if (b->free_seq > keep->free_seq)
        keep->free_seq = b->free_seq;
    if (b->gc_stamp > keep->gc_stamp)
        keep->gc_stamp = b->gc_stamp;
    /* keep was split (b is its neighbour): net stat change, as in carve_front */
    vmm_stats *st = stats_of(a, b->seg);
    if (is_split(keep)) {
        vmm_hot_up(st->inactive_split_bytes, pool, (int64_t)b->size);
    } else {
        vmm_hot_down(st->inactive_split, pool, 1);
        vmm_hot_down(st->inactive_split_bytes, pool, (int64_t)old_size);
    }
    block_drop(a, rec_books(a, b->seg), b);
    return 1;
}

void vmm_pool_release(vmm_allocator *a, vmm_block *b)
{
    VMM_HISTORY(a, VMM_TRACE_FREE_COMPLETED, b->addr, b->size, b->seg->stream);
    if (VMM_UNLIKELY(b->state == VMM_BLOCK_PENDING)) {
        /* active is derived (allocation + pending): only a deferred free's end changes a counter */
        int pool = b->seg->pool;
        vmm_stat_add(&a->pending[pool], -1);
        vmm_stat_add(&a->pending_bytes[pool], -(int64_t)b->size);
    }
    if (b->seg->pool == VMM_LARGE)
        life_note(b, 1);
    b->state = VMM_BLOCK_FREE;
    b->n_uses = 0;
    b->gc_stamp = a->malloc_count;
    /* one free neighbour (the common case): grow it where it sits in the index */
    vmm_block *n = b->next, *p = b->prev;
    int n_free = n && n->state == VMM_BLOCK_FREE, p_free = p && p->state == VMM_BLOCK_FREE;
    if (n_free != p_free && merge_in_place(a, b, n_free ? n : p))
        return;
    b = vmm_block_merge(a, b);
    vmm_pool_insert(a, b);
}

/* ---- live table: shards of open addressing, linear probing, backward-shift deletion ------ */

_Static_assert((VMM_LIVE_SHARDS & (VMM_LIVE_SHARDS - 1)) == 0, "shard count: a power of two");
enum {
    /* shards [0, HALF) hold small-pool blocks, [HALF, 2 HALF) the large-pool ones. Only small
     * blocks can be thread-cached, so only their shards are probed without the allocator lock and
     * always need their own lock. While one thread uses the allocator the large pool keeps one
     * shard (HALF) without a lock: large-pool mallocs and frees (most of what a training step
     * does) make no extra atomic read-modify-write (6 per pair cost ~40 ns) and compute no hash.
     * Once lanes have opened (lane.c) its new blocks spread over the half by region as the small
     * pool's do, and every large shard takes its lock: lanes of two threads would otherwise pass
     * one lock's line back and forth (2 threads on 8 MiB pairs: 4 against 20 Mpairs/s). */
    LIVE_HALF = VMM_LIVE_HALF,
};

/* Shard a new block of `pool` at addr goes to: its 2 MiB region hashed (Fibonacci hashing) into
 * the pool's half, so one segment's blocks spread over few shards and two streams' segments seldom
 * share one; the large pool's single shard until lanes have opened. */
static inline size_t live_shard_of(const vmm_allocator *a, uintptr_t addr, int pool)
{
    if (pool != VMM_SMALL && !a->shards_locked)
        return LIVE_HALF;
    size_t s = vmm_live_region_shard(addr);
    return pool == VMM_SMALL ? s : LIVE_HALF + s;
}

/* The shards a block of `pool` at addr may be in: where it would go now, and for the large pool,
 * once lanes have opened, also the single shard of the blocks made before. Returns how many. */
static inline int live_shards(const vmm_allocator *a, uintptr_t addr, int pool, size_t s[2])
{
    s[0] = live_shard_of(a, addr, pool);
    s[1] = LIVE_HALF;
    return pool == VMM_SMALL || s[0] == LIVE_HALF ? 1 : 2;
}

static inline int live_locked(const vmm_allocator *a, size_t shard)
{
    return shard < LIVE_HALF || a->shards_locked;
}

static inline void shard_lock(const vmm_allocator *a, vmm_live_shard *sh, size_t s)
{
    if (live_locked(a, s))
        vmm_mutex_lock(&sh->lock);
}

static inline void shard_unlock(const vmm_allocator *a, vmm_live_shard *sh, size_t s)
{
    if (live_locked(a, s))
        vmm_mutex_unlock(&sh->lock);
}

/* The empty slot where a block at addr goes (the table has room). */
static vmm_live_slot *live_empty(vmm_live_slot *t, size_t cap, uintptr_t addr)
{
    size_t i = vmm_live_hash(addr, cap - 1);
    while (t[i].blk)
        i = (i + 1) & (cap - 1);
    return &t[i];
}

/* A block's step for the thread caches (vmm_live_slot.tc_class), 0 when no cache may take it. */
static unsigned live_tc_class(const vmm_block *b)
{
    if (b->seg->pool != VMM_SMALL || b->size > VMM_TC_MAX_SIZE || b->n_uses || b->grouped)
        return 0;
    return (unsigned)(b->size / VMM_TC_STEP);
}

/* b's slot, written field by field: a slot built on the stack and copied whole cost the large
 * pattern ~15 ns a pair in failed store-to-load forwarding. */
static void live_put_new(vmm_live_slot *t, size_t cap, vmm_block *b, vmm_stream key, unsigned c)
{
    vmm_live_slot *sl = live_empty(t, cap, b->addr);
    sl->addr = b->addr;
    sl->blk = b;
    sl->key = key;
    sl->requested = c ? (uint32_t)b->requested : 0;
    sl->tc_class = (uint8_t)c;
    sl->pad_ = 0;
    atomic_store_explicit(&sl->tc_owner, 0, memory_order_relaxed);
}

/* Room for one more block of `pool` at addr, held for it (sh->reserved) until live_put_block or
 * live_unreserve. With the allocator lock held and lanes closed the shard has one writer besides
 * the thread caches' frees (tc_owner), and only the move to a larger table needs the shard lock;
 * while lanes are open, writers of two lanes may share a shard, so all of it holds the lock. */
static int live_reserve(vmm_allocator *a, uintptr_t addr, int pool)
{
    size_t s = live_shard_of(a, addr, pool);
    vmm_live_shard *sh = &a->live[s];
    int held = a->lanes_open;
    if (held)
        vmm_mutex_lock(&sh->lock);
    int rc = VMM_OK;
    if (VMM_UNLIKELY(sh->n + sh->reserved + 1 > sh->cap / LIVE_LOAD_DIV)) {
        size_t ncap = sh->cap ? sh->cap * 2 : LIVE_MIN_CAP;
        vmm_live_slot *nt = vmm_meta_table_alloc(a->meta, ncap * sizeof *nt);
        if (!nt) {
            rc = vmm_fail(VMM_EHOSTMEM, "vmm_malloc: out of host memory for the live table");
        } else {
            /* the copy too under the lock: a thread cache's free writes its slot's tc_owner */
            if (!held)
                shard_lock(a, sh, s);
            for (size_t i = 0; i < sh->cap; i++)
                if (sh->t[i].blk)
                    *live_empty(nt, ncap, sh->t[i].addr) = sh->t[i];
            vmm_live_slot *old = sh->t;
            size_t old_cap = sh->cap;
            sh->t = nt;
            sh->cap = ncap;
            if (!held)
                shard_unlock(a, sh, s);
            if (old)
                vmm_meta_table_free(a->meta, old, old_cap * sizeof *old);
        }
    }
    if (rc == VMM_OK)
        sh->reserved++;
    if (held)
        vmm_mutex_unlock(&sh->lock);
    return rc;
}

/* Give back a reservation that will not be used. */
static void live_unreserve(vmm_allocator *a, uintptr_t addr, int pool)
{
    size_t s = live_shard_of(a, addr, pool);
    vmm_live_shard *sh = &a->live[s];
    int held = a->lanes_open;
    if (held)
        vmm_mutex_lock(&sh->lock);
    sh->reserved--;
    if (held)
        vmm_mutex_unlock(&sh->lock);
}

/* Put b in its shard, which has room for it (live_reserve). */
static void live_put_block(vmm_allocator *a, vmm_block *b)
{
    size_t s = live_shard_of(a, b->addr, b->seg->pool);
    vmm_live_shard *sh = &a->live[s];
    vmm_stream key = b->seg->key;
    unsigned c = live_tc_class(b);
    shard_lock(a, sh, s);
    live_put_new(sh->t, sh->cap, b, key, c);
    sh->n++;
    sh->reserved--;
    shard_unlock(a, sh, s);
}

int vmm_live_insert(vmm_allocator *a, vmm_block *b)
{
    int rc = live_reserve(a, b->addr, b->seg->pool);
    if (rc == VMM_OK)
        live_put_block(a, b);
    return rc;
}

size_t vmm_live_count(const vmm_allocator *a)
{
    size_t n = 0;
    for (size_t s = 0; s < VMM_LIVE_SHARDS; s++)
        n += a->live[s].n;
    return n;
}

/* A slot names the shard and the index in it. */
static inline size_t slot_make(size_t shard, size_t i) { return i * VMM_LIVE_SHARDS + shard; }

vmm_block *vmm_live_find_slot(vmm_allocator *a, uintptr_t addr, size_t *slot)
{
    /* the pointer's pool is not known: its large-pool shards, then its small-pool one */
    size_t ss[3];
    int n = live_shards(a, addr, VMM_LARGE, ss);
    for (int k = 0; k < n + 1; k++) {
        if (k == n)
            ss[k] = live_shard_of(a, addr, VMM_SMALL);
        const vmm_live_shard *sh = &a->live[ss[k]];
        size_t i = vmm_live_shard_find(sh, addr);
        if (i == SIZE_MAX)
            continue;
        /* a block in a thread cache is freed as far as callers go (caller holds no shard lock) */
        if (atomic_load_explicit(&sh->t[i].tc_owner, memory_order_relaxed) &&
            a->hooks.tc_holds(a, &sh->t[i]))
            return NULL;
        *slot = slot_make(ss[k], i);
        return sh->t[i].blk;
    }
    return NULL;
}

vmm_block *vmm_live_find(vmm_allocator *a, uintptr_t addr)
{
    size_t slot;
    return vmm_live_find_slot(a, addr, &slot);
}

/* The slot of a thread-cached block at addr, its shard's lock held (released by the caller). */
static vmm_live_slot *cached_slot_lock(vmm_allocator *a, uintptr_t addr, size_t *shard)
{
    vmm_live_slot *sl = vmm_live_slot_lock(a, addr, shard);
    if (VMM_UNLIKELY(!sl))
        abort(); /* a cached block is live by construction: the table is corrupt */
    return sl;
}

static void slot_set_requested(vmm_live_slot *sl, size_t requested)
{
    sl->requested = (uint32_t)requested;
    sl->blk->requested = requested;
}

void vmm_live_set_requested(vmm_allocator *a, uintptr_t addr, size_t requested)
{
    size_t s;
    slot_set_requested(cached_slot_lock(a, addr, &s), requested);
    vmm_live_slot_unlock(a, s);
}

void vmm_live_set_owner(vmm_allocator *a, uintptr_t addr, unsigned owner, size_t requested)
{
    size_t s;
    vmm_live_slot *sl = cached_slot_lock(a, addr, &s);
    atomic_store_explicit(&sl->tc_owner, (uint16_t)owner, memory_order_relaxed);
    if (requested)
        slot_set_requested(sl, requested);
    vmm_live_slot_unlock(a, s);
}

void vmm_live_tc_forbid(vmm_allocator *a, const vmm_block *b)
{
    size_t ss[2];
    for (int k = 0, n = live_shards(a, b->addr, b->seg->pool, ss); k < n; k++) {
        vmm_live_shard *sh = &a->live[ss[k]];
        shard_lock(a, sh, ss[k]);
        size_t i = vmm_live_shard_find(sh, b->addr);
        if (i != SIZE_MAX && sh->t[i].blk == b) {
            sh->t[i].tc_class = 0;
            sh->t[i].requested = 0;
        }
        shard_unlock(a, sh, ss[k]);
    }
}

const char *vmm_live_check_slot(vmm_allocator *a, const vmm_block *b)
{
    size_t ss[2];
    for (int k = 0, n = live_shards(a, b->addr, b->seg->pool, ss); k < n; k++) {
        const vmm_live_shard *sh = &a->live[ss[k]];
        size_t i = vmm_live_shard_find(sh, b->addr);
        if (i == SIZE_MAX || sh->t[i].blk != b)
            continue;
        const vmm_live_slot *sl = &sh->t[i];
        if (sl->key != b->seg->key)
            return "live-table slot's lane key is not its segment's";
        /* 0 is allowed where a cache could take the block: a group or use since dropped */
        if (sl->tc_class && sl->tc_class != live_tc_class(b))
            return "live-table slot lets a thread cache take a block it may not hold";
        if (sl->tc_class && sl->requested != b->requested)
            return "live-table slot's requested bytes are not its block's";
        return NULL;
    }
    return "allocated block missing from the live table";
}

/* The live block at addr among `pool`'s shards, and its lane (NULL: a private pool's), read with
 * the shard's lock held, while the slot holds the block: a racing free (the caller's bug) may free
 * its record the moment the lock goes. */
static vmm_block *lookup_lane(vmm_allocator *a, uintptr_t addr, int pool, vmm_stream_rec **sr,
                              vmm_live_slot *copy)
{
    size_t ss[2];
    vmm_block *found = NULL;
    for (int k = 0, n = live_shards(a, addr, pool, ss); k < n && !found; k++) {
        vmm_live_shard *sh = &a->live[ss[k]];
        shard_lock(a, sh, ss[k]);
        size_t i = vmm_live_shard_find(sh, addr);
        if (i != SIZE_MAX) {
            found = sh->t[i].blk;
            *sr = found->seg->mp ? NULL : found->seg->srec;
            if (copy)
                *copy = sh->t[i];
        }
        shard_unlock(a, sh, ss[k]);
    }
    return found;
}

vmm_block *vmm_live_lane_of(vmm_allocator *a, uintptr_t addr, int small_only, vmm_stream_rec **sr,
                            vmm_live_slot *copy, int *pool)
{
    vmm_block *b = NULL;
    *sr = NULL;
    *pool = VMM_LARGE;
    if (!small_only)
        b = lookup_lane(a, addr, VMM_LARGE, sr, NULL);
    if (!b) {
        *pool = VMM_SMALL;
        b = lookup_lane(a, addr, VMM_SMALL, sr, copy);
    }
    return b;
}

int vmm_live_still(vmm_allocator *a, uintptr_t addr, const vmm_block *b, const vmm_stream_rec *sr, int pool)
{
    vmm_stream_rec *now = NULL;
    return lookup_lane(a, addr, pool, &now, NULL) == b && now == sr;
}

/* Remove entry i of shard sh (its lock held where shards are locked). */
static void shard_remove(vmm_live_shard *sh, size_t i)
{
    size_t mask = sh->cap - 1;
    sh->t[i].blk = NULL;
    sh->n--;
    /* shift later entries of the cluster back so lookups never stop at the hole early */
    for (size_t j = (i + 1) & mask; sh->t[j].blk; j = (j + 1) & mask) {
        size_t home = vmm_live_hash(sh->t[j].addr, mask);
        int movable = (j > i) ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            sh->t[i] = sh->t[j];
            sh->t[j].blk = NULL;
            i = j;
        }
    }
}

unsigned vmm_live_owner_at(const vmm_allocator *a, size_t slot)
{
    const vmm_live_slot *sl = &a->live[slot % VMM_LIVE_SHARDS].t[slot / VMM_LIVE_SHARDS];
    return atomic_load_explicit(&sl->tc_owner, memory_order_relaxed);
}

void vmm_live_slot_take(vmm_allocator *a, size_t shard, vmm_live_slot *sl)
{
    vmm_live_shard *sh = &a->live[shard];
    shard_remove(sh, (size_t)(sl - sh->t));
    vmm_live_slot_unlock(a, shard);
}

void vmm_live_remove_at(vmm_allocator *a, size_t slot)
{
    size_t s = slot % VMM_LIVE_SHARDS;
    vmm_live_shard *sh = &a->live[s];
    shard_lock(a, sh, s);
    shard_remove(sh, slot / VMM_LIVE_SHARDS);
    shard_unlock(a, sh, s);
}

int vmm_live_take(vmm_allocator *a, uintptr_t addr, const vmm_block *b)
{
    size_t ss[2];
    int ok = 0;
    for (int k = 0, n = live_shards(a, addr, b->seg->pool, ss); k < n && !ok; k++) {
        vmm_live_shard *sh = &a->live[ss[k]];
        shard_lock(a, sh, ss[k]);
        size_t i = vmm_live_shard_find(sh, addr);
        ok = i != SIZE_MAX && sh->t[i].blk == b;
        if (ok)
            shard_remove(sh, i);
        shard_unlock(a, sh, ss[k]);
    }
    return ok;
}

void vmm_live_free_table(vmm_allocator *a)
{
    for (size_t s = 0; s < VMM_LIVE_SHARDS; s++) {
        vmm_live_shard *sh = &a->live[s];
        if (sh->t)
            vmm_meta_table_free(a->meta, sh->t, sh->cap * sizeof *sh->t);
        sh->t = NULL;
        sh->cap = sh->n = sh->reserved = 0;
    }
}
