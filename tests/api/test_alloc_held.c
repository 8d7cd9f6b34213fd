// ctest-labels: unit
/* Held against handed out (docs/benchmarks.md, "Handle sizes"): the default holds at most two
 * pages per pool more than it hands out on a small job (~95 MiB) and one page per stream on ten streams
 * driven by one thread, where handles sized by need up to 20 MiB (the default before) hold the
 * rest of a 20 MiB handle per growth; growth recycles a hole between live blocks only when it
 * holds RECYCLE_MIN_PAGES (2) whole pages, so a request of a small hole's size later fits in place,
 * and a free block at the end of a mapped run whatever its size; one thread on ten streams holds no
 * more with its thread cache than without, and on six streams whose small blocks that stay were
 * allocated after their stream's temporaries were freed, at most two pages more; a small request
 * takes a large-pool sliver between live blocks before a new small-pool page; a growth takes the
 * idle pages of the free block above its target that the request does not reach; on a
 * layer-by-layer forward pass the tensors that stay are kept apart from the temporaries
 * (lifetime_split), at least four pages fewer over than without, and a temporary of 256 MiB or more
 * is never taken for one that stays; a small request in a large-pool sliver does not count in the
 * large sizes' history. */
#include <stdint.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static vmm_allocator *make(const char *extra)
{
    char conf[256];
    snprintf(conf, sizeof conf, "driver:sim,sim_capacity:4G,sim_backed:false,ipc:false%s", extra);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    return a;
}

/* Peak reserved minus peak allocated of a pool, in 2 MiB pages (rounded down). */
static int64_t pages_over(vmm_allocator *a, int pool)
{
    vmm_stats st = vmm_test_stats(a);
    return (st.reserved_bytes[pool].peak - st.allocated_bytes[pool].peak) / (int64_t)(2 * MiB);
}

/* A small CNN job: weights and activations of odd sizes kept live one after another (each a
 * growth of one to three pages), small tensors beside them; about 100 MiB at the end. */
static void small_job(vmm_allocator *a, void **p, size_t *n)
{
    static const size_t big[] = {1536 * KiB, 2359296, 4718592, 1179648, 3 * MiB + 4096, 2 * MiB + 512};
    static const size_t small[] = {512, 4 * KiB, 64 * KiB, 256 * KiB, 147456};
    *n = 0;
    for (int i = 0; i < 40; i++) {
        CHECK_OK(vmm_malloc(a, big[i % 6], NULL, &p[(*n)++]));
        CHECK_OK(vmm_malloc(a, small[i % 5], NULL, &p[(*n)++]));
    }
    CHECK_OK(vmm_check(a));
}

static void test_small_job(void)
{
    void *p[128];
    size_t n;
    vmm_allocator *a = make("");
    if (!a)
        return;
    small_job(a, p, &n);
    CHECK(vmm_test_stats(a).allocated_bytes[VMM_POOL_ALL].peak > 90 * (int64_t)MiB);
    CHECK(pages_over(a, VMM_POOL_SMALL) <= 2);
    CHECK(pages_over(a, VMM_POOL_LARGE) <= 2);
    for (size_t i = 0; i < n; i++)
        CHECK_OK(vmm_free(a, p[i]));
    vmm_destroy(a);

    /* the same job with handles by need up to 20 MiB: the last growth's handle reaches ahead */
    a = make(",max_handle_size:20M");
    if (!a)
        return;
    small_job(a, p, &n);
    CHECK(pages_over(a, VMM_POOL_LARGE) > 2);
    for (size_t i = 0; i < n; i++)
        CHECK_OK(vmm_free(a, p[i]));
    vmm_destroy(a);
}

/* One thread, ten streams, each with a 3 MiB block and a small one live: every stream has a
 * segment of its own, so a big handle per stream holds its unused rest. */
static int64_t ten_streams(const char *extra, int64_t *allocated)
{
    vmm_allocator *a = make(extra);
    if (!a)
        return -1;
    vmm_stream s[10];
    void *p[20];
    for (int i = 0; i < 10; i++) {
        CHECK_OK(vmm_sim_stream_create(a, &s[i]));
        CHECK_OK(vmm_malloc(a, 3 * MiB, s[i], &p[2 * i]));
        CHECK_OK(vmm_malloc(a, 24 * KiB, s[i], &p[2 * i + 1]));
    }
    CHECK_OK(vmm_check(a));
    vmm_stats st = vmm_test_stats(a);
    *allocated = st.allocated_bytes[VMM_POOL_LARGE].peak;
    for (int i = 0; i < 20; i++)
        CHECK_OK(vmm_free(a, p[i]));
    vmm_destroy(a);
    return st.reserved_bytes[VMM_POOL_LARGE].peak;
}

static void test_ten_streams(void)
{
    int64_t al = 0, res = ten_streams("", &al);
    CHECK_EQ(al, 30 * (int64_t)MiB);
    CHECK(res <= al + 10 * (int64_t)MiB); /* 2 pages for each 3 MiB block */
    int64_t res20 = ten_streams(",max_handle_size:20M", &al);
    CHECK(res20 >= 10 * 20 * (int64_t)MiB);
}

/* Blocks A (4 MiB), H, B (4 MiB); H freed makes a hole between live blocks. Holding one whole page
 * (H of 2 or 3 MiB), a growth past the peak leaves it mapped, and a request of its size lands in it
 * without a growth. With H of 4 or 8 MiB (two or four whole pages) the growth takes its pages. */
static void hole(size_t hole_bytes, int recycled)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    void *pa, *ph, *pb, *pc, *pd;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &pa));
    CHECK_OK(vmm_malloc(a, hole_bytes, NULL, &ph));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &pb));
    CHECK((uintptr_t)ph == (uintptr_t)pa + 4 * MiB && (uintptr_t)pb == (uintptr_t)ph + hole_bytes);
    CHECK_OK(vmm_free(a, ph));
    vmm_stats s0 = vmm_test_stats(a);
    CHECK_OK(vmm_malloc(a, 12 * MiB, NULL, &pc)); /* larger than the hole: a growth */
    CHECK_OK(vmm_check(a));
    vmm_stats s1 = vmm_test_stats(a);
    int64_t moved = s1.num_pages_remapped - s0.num_pages_remapped;
    CHECK_EQ(moved, recycled ? (int64_t)(hole_bytes / (2 * MiB)) : 0);
    CHECK_EQ(s1.reserved_bytes[VMM_POOL_LARGE].current,
             s0.reserved_bytes[VMM_POOL_LARGE].current + 12 * (int64_t)MiB - (recycled ? (int64_t)hole_bytes : 0));
    /* the hole's size again: in place when it stayed mapped, no new memory either way for the
     * two-page hole */
    CHECK_OK(vmm_malloc(a, hole_bytes, NULL, &pd));
    vmm_stats s2 = vmm_test_stats(a);
    if (!recycled) {
        CHECK_EQ((uintptr_t)pd, (uintptr_t)ph);
        CHECK_EQ(s2.reserved_bytes[VMM_POOL_LARGE].current, s1.reserved_bytes[VMM_POOL_LARGE].current);
    }
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, pa));
    CHECK_OK(vmm_free(a, pb));
    CHECK_OK(vmm_free(a, pc));
    CHECK_OK(vmm_free(a, pd));
    vmm_destroy(a);
}

/* A free block at the end of the mapped run (the unmapped rest of the segment after it) goes to a
 * growth elsewhere even with one whole page: no new slivers. */
static void test_run_end(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    vmm_stream s;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    void *pa, *pe, *pc;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &pa));
    CHECK_OK(vmm_malloc(a, 2 * MiB, NULL, &pe));
    CHECK_OK(vmm_free(a, pe)); /* the run's last page, idle, beside the unmapped rest */
    vmm_stats s0 = vmm_test_stats(a);
    CHECK_OK(vmm_malloc(a, 8 * MiB, s, &pc)); /* another stream's segment grows */
    vmm_stats s1 = vmm_test_stats(a);
    CHECK_EQ(s1.num_pages_remapped - s0.num_pages_remapped, 1);
    CHECK_EQ(s1.reserved_bytes[VMM_POOL_ALL].current, s0.reserved_bytes[VMM_POOL_ALL].current + 6 * (int64_t)MiB);
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, pa));
    CHECK_OK(vmm_free(a, pc));
    vmm_destroy(a);
}

/* A growth into an unmapped range between two free blocks: A (4 MiB, free) | U (16 MiB, unmapped:
 * its pages went to another stream's growth) | B (free, idle) | C (in use). A request that fits
 * neither A nor B grows into U from A on. B's pages the request does not reach are idle beside it
 * and go to the growth instead of new handles (three whole-slide inferences held 1.10-1.16x what
 * they handed out while such a B stayed mapped). b_mib: B's size; size_mib: the request. */
static void grow_beside_idle(size_t b_mib, size_t size_mib)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    vmm_stream s;
    CHECK_OK(vmm_sim_stream_create(a, &s));
    void *pa, *ph, *pb, *pc, *ps, *pr;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &pa));
    CHECK_OK(vmm_malloc(a, 16 * MiB, NULL, &ph));
    CHECK_OK(vmm_malloc(a, b_mib * MiB, NULL, &pb));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &pc));
    CHECK_OK(vmm_free(a, ph));
    vmm_stats s0 = vmm_test_stats(a);
    CHECK_OK(vmm_malloc(a, 16 * MiB, s, &ps)); /* past the peak: takes H's eight pages */
    vmm_stats s1 = vmm_test_stats(a);
    CHECK_EQ(s1.num_pages_remapped - s0.num_pages_remapped, 8);
    CHECK_EQ(s1.reserved_bytes[VMM_POOL_ALL].current, s0.reserved_bytes[VMM_POOL_ALL].current);
    CHECK_OK(vmm_free(a, pa));
    CHECK_OK(vmm_free(a, pb));
    CHECK_OK(vmm_malloc(a, size_mib * MiB, NULL, &pr));
    CHECK_EQ((uintptr_t)pr, (uintptr_t)pa); /* grown from A on */
    CHECK_OK(vmm_check(a));
    vmm_stats s2 = vmm_test_stats(a);
    /* pages of U the request needs, and of B it leaves: B's whole pages at or past the request's end */
    size_t need = size_mib - 4 < 16 ? size_mib - 4 : 16, b_left = 4 + 16 + b_mib - (size_mib > 20 ? size_mib : 20);
    size_t take = b_left < need ? b_left : need;
    CHECK_EQ(s2.num_pages_remapped - s1.num_pages_remapped, (int64_t)(take / 2));
    CHECK_EQ(s2.reserved_bytes[VMM_POOL_ALL].current,
             s1.reserved_bytes[VMM_POOL_ALL].current + (int64_t)((need - take) * MiB));
    CHECK_OK(vmm_free(a, pr));
    CHECK_OK(vmm_free(a, pc));
    CHECK_OK(vmm_free(a, ps));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

/* One thread on ten streams: small blocks freed in a scattered order (the thread's cache keeps some
 * of each stream's), then a growth past the peak on one stream. The cache must hold no page that
 * growth could have recycled: peak reserved as with thread_cache:0. */
static int64_t scattered(const char *extra)
{
    vmm_allocator *a = make(extra);
    if (!a)
        return -1;
    enum { S = 10, PER = 300 };
    static void *p[S * PER];
    vmm_stream s[S];
    uint32_t x = 12345;
    for (int i = 0; i < S; i++)
        CHECK_OK(vmm_sim_stream_create(a, &s[i]));
    for (int i = 0; i < S * PER; i++) {
        x = x * 1103515245u + 12345u;
        size_t size = (size_t)512 << ((x >> 16) % 8); /* 512 B .. 64 KiB */
        CHECK_OK(vmm_malloc(a, size, s[i % S], &p[i]));
    }
    for (int k = 0; k < S * PER; k++) { /* every index once, scattered (7 is prime to 3000) */
        int i = (int)(((size_t)k * 7) % (S * PER));
        CHECK_OK(vmm_free(a, p[i]));
    }
    void *big;
    CHECK_OK(vmm_malloc(a, 64 * MiB, s[0], &big));
    CHECK_OK(vmm_check(a));
    int64_t peak = vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].peak;
    CHECK_OK(vmm_free(a, big));
    vmm_destroy(a);
    return peak;
}

static void test_scattered_caches(void)
{
    int64_t with = scattered(""), without = scattered(",thread_cache:0");
    CHECK(with > 0);
    CHECK_EQ(with, without);
}

/* One thread serving several streams in turn (bench/scripts/gen_offload_trace.py, small): per layer each
 * stream allocates temporaries of 4 KiB - 1 MiB, frees them, then allocates two small blocks that
 * stay. With a cache serving every stream the blocks that stay came from it, the temporaries freed
 * last, scattered over the stream's pages, which no other stream's growth could recycle: 1.65x
 * held what was handed out on ten streams; here 32 pages more than thread_cache:0 held. A cache
 * serves at most two streams (tcache.c, tc_lane_check): peak reserved within two pages of
 * thread_cache:0 (not equal: the first two streams' blocks were cached until the third came).
 * Returns peak reserved, *allocated its peak allocated. */
static int64_t offload(const char *extra, int64_t *allocated)
{
    vmm_allocator *a = make(extra);
    if (!a)
        return -1;
    enum { S = 6, LAYERS = 24, TEMPS = 60, KV = 2 };
    static void *kv[S * LAYERS * KV];
    void *tmp[TEMPS];
    vmm_stream s[S];
    int nkv = 0;
    uint32_t x = 7;
    static const size_t sizes[] = {4 * KiB, 8 * KiB, 16 * KiB, 32 * KiB, 64 * KiB, 256 * KiB, 512 * KiB, MiB};
    for (int i = 0; i < S; i++)
        CHECK_OK(vmm_sim_stream_create(a, &s[i]));
    for (int l = 0; l < LAYERS; l++)
        for (int i = 0; i < S; i++) {
            for (int k = 0; k < TEMPS; k++) {
                x = x * 1103515245u + 12345u;
                CHECK_OK(vmm_malloc(a, sizes[(x >> 16) % 8], s[i], &tmp[k]));
            }
            for (int k = 0; k < TEMPS; k++)
                CHECK_OK(vmm_free(a, tmp[k]));
            for (int k = 0; k < KV; k++) {
                x = x * 1103515245u + 12345u;
                CHECK_OK(vmm_malloc(a, sizes[(x >> 16) % 5], s[i], &kv[nkv++]));
            }
        }
    CHECK_OK(vmm_check(a));
    vmm_stats st = vmm_test_stats(a);
    *allocated = st.allocated_bytes[VMM_POOL_ALL].peak;
    for (int k = 0; k < nkv; k++)
        CHECK_OK(vmm_free(a, kv[k]));
    vmm_destroy(a);
    return st.reserved_bytes[VMM_POOL_ALL].peak;
}

static void test_offload_streams(void)
{
    int64_t alloc_with = 0, alloc_without = 0;
    int64_t with = offload("", &alloc_with), without = offload(",thread_cache:0", &alloc_without);
    printf("offload: peak reserved %lld with the cache, %lld without, peak allocated %lld\n",
           (long long)with, (long long)without, (long long)alloc_without);
    CHECK(with > 0 && without > 0);
    CHECK_EQ(alloc_with, alloc_without);
    CHECK(with <= without + (int64_t)(2 * 2 * MiB));
}

/* A small request with no fit in the small pool takes a large-pool sliver (1 MiB or less, between
 * two live blocks: no large request fits it) instead of a new small-pool page; a sliver at the end
 * of a mapped run is left to growth. */
static void test_large_sliver(void)
{
    /* lifetime_split off: the second 2.5 MiB request (every block of its size still live) would be
     * predicted to stay, and its fit's sliver would send it to a segment of its own */
    vmm_allocator *a = make(",lifetime_split:false");
    if (!a)
        return;
    void *x, *y, *z, *s1, *s2;
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &x));
    CHECK_OK(vmm_malloc(a, 5 * MiB / 2, NULL, &y)); /* its last page: 0.5 MiB free, then unmapped */
    CHECK_EQ((uintptr_t)y, (uintptr_t)x + 3 * MiB);
    CHECK_OK(vmm_free(a, x));
    CHECK_OK(vmm_malloc(a, 5 * MiB / 2, NULL, &z)); /* x's hole: 0.5 MiB left before y */
    CHECK_EQ((uintptr_t)z, (uintptr_t)x);
    CHECK_OK(vmm_malloc(a, 256 * KiB, NULL, &s1));
    CHECK_EQ((uintptr_t)s1, (uintptr_t)x + 5 * MiB / 2);
    vmm_stats st = vmm_test_stats(a);
    CHECK_EQ(st.reserved_bytes[VMM_POOL_SMALL].current, 0);
    CHECK_EQ(st.allocated_bytes[VMM_POOL_LARGE].current, (int64_t)(5 * MiB + 256 * KiB));
    /* the 0.5 MiB after y, at the end of the mapped run, is growth's, not a small block's */
    CHECK_OK(vmm_malloc(a, 512 * KiB, NULL, &s2));
    CHECK((uintptr_t)s2 < (uintptr_t)x || (uintptr_t)s2 >= (uintptr_t)y + 3 * MiB);
    CHECK_EQ(vmm_test_stats(a).reserved_bytes[VMM_POOL_SMALL].current, (int64_t)(2 * MiB));
    CHECK_OK(vmm_check(a));
    CHECK_OK(vmm_free(a, s1));
    CHECK_OK(vmm_free(a, s2));
    CHECK_OK(vmm_free(a, y));
    CHECK_OK(vmm_free(a, z));
    CHECK_OK(vmm_check(a));
    vmm_destroy(a);
}

/* One thread's layer-by-layer forward pass, the shape of a recorded one (workloads/pytorch,
 * cs336_silmont2000_memory_forward_bf16_128): per layer 1.125 and 4.5 MiB tensors that stay to the
 * end among 1.5 and 3 MiB temporaries, then two odd-sized outputs. Best fit put the tensors that
 * stay into the temporaries' holes, leaving 0.375 MiB slivers that no later large request fits:
 * with lifetime_split off the large pool holds 11 pages over at its peak, 6 with it (the default:
 * the tensors that stay go to a segment of their own once one would leave a sliver, pool.c,
 * "Lifetimes"). Sizes in units of 0.375 MiB; a layer's last temporary (slot 0) is freed at the
 * next one's end (slot 1). */
static int64_t forward_pass(const char *extra)
{
    static const struct {
        char op;
        unsigned char slot, units;
    } layer[] = {
        {'+', 2, 4}, {'+', 3, 4}, {'-', 2, 4}, {'+', 4, 3}, {'+', 5, 3}, {'+', 6, 3}, {'+', 7, 4},
        {'+', 8, 4}, {'+', 9, 4}, {'-', 7, 4}, {'-', 8, 4}, {'+', 10, 4}, {'+', 11, 4},
        {'+', 12, 4}, {'-', 10, 4}, {'-', 11, 4}, {'+', 13, 4}, {'+', 14, 4}, {'-', 13, 4},
        {'+', 15, 4}, {'-', 14, 4}, {'+', 16, 4}, {'+', 17, 8}, {'+', 18, 8}, {'-', 17, 8},
        {'-', 16, 4}, {'+', 19, 8}, {'-', 18, 8}, {'+', 20, 4}, {'-', 20, 4}, {'-', 15, 4},
        {'-', 19, 8}, {'+', 21, 3}, {'-', 9, 4}, {'-', 12, 4}, {'+', 22, 4}, {'+', 23, 4},
        {'+', 24, 4}, {'-', 23, 4}, {'+', 25, 12}, {'+', 26, 8}, {'+', 27, 12}, {'+', 28, 8},
        {'+', 29, 8}, {'+', 30, 8}, {'-', 29, 8}, {'+', 31, 8}, {'-', 30, 8}, {'+', 32, 12},
        {'-', 31, 8}, {'+', 33, 4}, {'-', 26, 8}, {'-', 28, 8}, {'+', 0, 4}, {'-', 3, 4},
        {'-', 22, 4}, {'-', 24, 4}, {'-', 33, 4}, {'-', 1, 4},
    };
    enum { LAYERS = 12, SLOTS = 34, KEPT = 7 };
    const size_t unit = 3 * MiB / 8;
    vmm_allocator *a = make(extra);
    if (!a)
        return -1;
    void *slot[SLOTS] = {0}, *kept[LAYERS * KEPT + 2];
    size_t nk = 0;
    for (int l = 0; l < LAYERS; l++) {
        for (size_t i = 0; i < sizeof layer / sizeof layer[0]; i++) {
            void **p = &slot[layer[i].slot];
            if (layer[i].op == '+') {
                CHECK_OK(vmm_malloc(a, layer[i].units * unit, NULL, p));
                /* the 1.125 and 4.5 MiB tensors stay */
                if (layer[i].units == 3 || layer[i].units == 12)
                    kept[nk++] = *p;
            } else if (*p) {
                CHECK_OK(vmm_free(a, *p));
            }
            if (layer[i].op == '-' || layer[i].units == 3 || layer[i].units == 12)
                *p = NULL;
        }
        slot[1] = slot[0];
        slot[0] = NULL;
    }
    CHECK_OK(vmm_malloc(a, 15360000, NULL, &kept[nk++]));
    CHECK_OK(vmm_malloc(a, 10240000, NULL, &kept[nk++]));
    CHECK_OK(vmm_check(a));
    int64_t over = pages_over(a, VMM_POOL_LARGE);
    for (size_t i = 0; i < nk; i++)
        CHECK_OK(vmm_free(a, kept[i]));
    for (int i = 0; i < SLOTS; i++)
        if (slot[i])
            CHECK_OK(vmm_free(a, slot[i]));
    vmm_destroy(a);
    return over;
}

static void test_lifetimes(void)
{
    int64_t split = forward_pass(""), one = forward_pass(",lifetime_split:false");
    printf("forward pass: large pool %lld pages over with lifetime_split, %lld without\n",
           (long long)split, (long long)one);
    CHECK(split >= 0 && one >= 0);
    CHECK(split + 4 <= one);
}

/* A request of 256 MiB or more is never predicted to stay (pool.c, "Lifetimes"): once the lane
 * has split, the second of two live 300 MiB temporaries grows the segment the first one grew, right
 * after it, instead of a longlived segment whose pages later growths would then take back page by
 * page (a calibration loop's 1 GiB temporaries: 21,372 pages remapped against 5,888). */
static void test_big_temporaries(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    void *l = NULL, *h = NULL, *r = NULL, *x1 = NULL, *x2 = NULL, *t1 = NULL, *t2 = NULL;
    /* a 1.25 MiB hole between live blocks; a second 1.125 MiB block (the first is live: predicted
     * to stay) would leave a 0.125 MiB sliver there, so the lane splits */
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &l));
    CHECK_OK(vmm_malloc(a, 5 * MiB / 4, NULL, &h));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &r));
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x1));
    CHECK_OK(vmm_free(a, h));
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x2));
    CHECK((uintptr_t)x2 - (uintptr_t)l > 64 * MiB); /* grown in a longlived segment of its own */
    CHECK_OK(vmm_malloc(a, 300 * MiB, NULL, &t1));
    CHECK_OK(vmm_malloc(a, 300 * MiB, NULL, &t2));
    CHECK((uintptr_t)t1 - (uintptr_t)l < 64 * MiB);
    CHECK_EQ((uintptr_t)t2, (uintptr_t)t1 + 300 * MiB);
    CHECK_OK(vmm_check(a));
    void *all[] = {l, r, x1, x2, t1, t2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(vmm_free(a, all[i]));
    vmm_destroy(a);
}

/* lifetime_split must not cost memory: a request predicted to stay whose best fit it turns down
 * takes that block when the device is full (no OOM while a free block fits), the longlived scan
 * gives up on the lane's best fit past many other blocks (no new segment per request). */
static void life_full_device(void)
{
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create("driver:sim,sim_capacity:12M,sim_backed:false,ipc:false", &a));
    if (!a)
        return;
    void *l, *h, *r, *x1, *x2 = NULL, *x3 = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &l));
    CHECK_OK(vmm_malloc(a, 5 * MiB / 4, NULL, &h));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &r));
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x1));
    CHECK_OK(vmm_free(a, h)); /* a 1.25 MiB hole between live blocks; no whole idle page anywhere */
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x2)); /* predicted to stay; fits the hole */
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x3)); /* and the run's tail */
    CHECK_OK(vmm_check(a));
    void *p[] = {l, r, x1, x2, x3};
    for (int i = 0; i < 5; i++)
        CHECK_OK(vmm_free(a, p[i]));
    vmm_destroy(a);
}

static void life_many_holes(void)
{
    enum { HOLES = 66, N = 40 };
    vmm_allocator *a = make("");
    if (!a)
        return;
    static void *h[HOLES], *sep[HOLES], *x[N];
    void *l;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &l));
    for (int i = 0; i < HOLES; i++) {
        CHECK_OK(vmm_malloc(a, 5 * MiB / 4, NULL, &h[i]));
        CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &sep[i]));
    }
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x[0]));
    for (int i = 0; i < HOLES; i++)
        CHECK_OK(vmm_free(a, h[i])); /* 66 holes of 1.25 MiB between live blocks */
    for (int i = 1; i < N; i++)
        CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x[i])); /* the size stays: all live */
    vmm_stats st = vmm_test_stats(a);
    CHECK(st.segment[VMM_POOL_LARGE].current <= 2); /* 21 before the fix */
    CHECK_OK(vmm_check(a));
    vmm_destroy(a); /* live blocks reported, all memory returned */
}

/* A small request placed in a large-pool sliver does not disturb the large sizes' history (pool.c,
 * life_note): a second 1.125 MiB tensor (the first still live) is still predicted to stay. In the
 * direct-mapped table before, 4 KiB took 1.125 MiB's slot and restarted its count. */
static void life_small_in_sliver(void)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    void *l, *h, *r, *x1, *t, *u, *b, *s = NULL, *x2 = NULL;
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &l));
    CHECK_OK(vmm_malloc(a, 5 * MiB / 4, NULL, &h));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &r));
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x1));
    CHECK_OK(vmm_malloc(a, 3 * MiB, NULL, &t));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &b));
    CHECK_OK(vmm_free(a, t));
    CHECK_OK(vmm_malloc(a, 5 * MiB / 2, NULL, &u)); /* a first of its size: 0.5 MiB left before b */
    CHECK_EQ((uintptr_t)u, (uintptr_t)t);
    CHECK_OK(vmm_malloc(a, 4 * KiB, NULL, &s)); /* no small-pool page yet: the sliver */
    CHECK_EQ((uintptr_t)s, (uintptr_t)u + 5 * MiB / 2);
    CHECK_OK(vmm_free(a, h)); /* a 1.25 MiB hole between live blocks */
    CHECK_OK(vmm_malloc(a, 9 * MiB / 8, NULL, &x2)); /* predicted to stay: not into the hole */
    CHECK((uintptr_t)x2 - (uintptr_t)l > 64 * MiB);
    CHECK_OK(vmm_check(a));
    void *all[] = {l, r, x1, u, b, s, x2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(vmm_free(a, all[i]));
    vmm_destroy(a);
}

/* Autocast's weight copies in a bf16 forward pass: a 12.5 MiB copy that stays, put by best fit into
 * a freed 20 MiB activation's hole, ends inside a page that the 7.5 MiB remainder shares; with
 * lifetime_split such a request (two pages or more) splits the lane and grows a longlived segment
 * instead (pool.c, "Lifetimes"). With `temporary`, a 20 MiB block is allocated in the hole and
 * freed first: 12.5 and 20 MiB shared a slot of the direct-mapped history table, so the copies'
 * count restarted and the second copy was not predicted to stay. With `churn`, the history's windows
 * are full of other sizes first: a new size still takes the stalest slot of its window. */
static void life_partial_page(int temporary, int churn)
{
    vmm_allocator *a = make("");
    if (!a)
        return;
    void *l, *h, *r, *k1, *t, *k2 = NULL;
    /* churn: 400 other large sizes first, each allocated and freed, which fill the history's
     * windows; the table still takes the copies' size (evicting the stalest) */
    for (int i = 0; i < churn; i++) {
        CHECK_OK(vmm_malloc(a, 3 * MiB + (size_t)i * 4 * KiB, NULL, &t));
        CHECK_OK(vmm_free(a, t));
    }
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &l));
    CHECK_OK(vmm_malloc(a, 20 * MiB, NULL, &h));
    CHECK_OK(vmm_malloc(a, 4 * MiB, NULL, &r));
    CHECK_OK(vmm_malloc(a, 25 * MiB / 2, NULL, &k1)); /* a first of its size: the run's end */
    CHECK_OK(vmm_free(a, h));                         /* a 20 MiB hole between live blocks */
    if (temporary) {
        CHECK_OK(vmm_malloc(a, 20 * MiB, NULL, &t));
        CHECK_EQ((uintptr_t)t, (uintptr_t)h);
        CHECK_OK(vmm_free(a, t));
    }
    CHECK_OK(vmm_malloc(a, 25 * MiB / 2, NULL, &k2)); /* predicted to stay: not into the hole */
    CHECK((uintptr_t)k2 - (uintptr_t)l > 64 * MiB);
    CHECK_OK(vmm_check(a));
    void *all[] = {l, r, k1, k2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        CHECK_OK(vmm_free(a, all[i]));
    vmm_destroy(a);
}

int main(void)
{
    test_small_job();
    test_ten_streams();
    hole(2 * MiB, 0);
    hole(3 * MiB, 0);
    hole(4 * MiB, 1);
    hole(8 * MiB, 1);
    test_run_end();
    grow_beside_idle(12, 18); /* the request ends inside U: all of B idle */
    grow_beside_idle(20, 22); /* it reaches 2 MiB into B: the other 18 MiB idle */
    life_full_device();
    life_many_holes();
    life_small_in_sliver();
    life_partial_page(0, 0);
    life_partial_page(1, 0);
    life_partial_page(0, 400);
    test_scattered_caches();
    test_offload_streams();
    test_large_sliver();
    test_lifetimes();
    test_big_temporaries();
    TEST_DONE();
}
