// ctest-labels: unit
// ctest-timeout: 120
// ctest-cudadouble
/*
 * alias_pages (src/core/alias.c): a growth maps a partly used page whose free part fits its first
 * or last page a second time, instead of a new page.
 *  - tail: a stayer's first page keeps a free prefix once the block before it is gone; a later
 *    block grown elsewhere in VA ends in that prefix: one page fewer held (with the key off the
 *    same steps hold one more), its bytes written through one view read through the other;
 *  - head: a stayer's last page keeps a free suffix that no gap next to it can use; a later block
 *    starts at that offset of its first page, which is the same page;
 *  - freeing either block first, then empty_cache: the bytes go back (reserved down to what the
 *    other block holds, then to 0), the other block's data intact;
 *  - on a device just large enough, the aliased growth fits where the key off runs out of memory,
 *    and a growth that needs every page drops the view that holds nothing, whose page is then
 *    idle whole and remapped;
 *  - destroy with views still mapped returns every handle and VA range (sim counters);
 *  - vmm_check after every step (each byte owned by one view, reserved counting a page once).
 * On the CUDA double (copy test_alias_double) the same steps run against driver:cuda, the bytes
 * checked through cuMemcpy where the double offers no host view.
 */
#include <stdint.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"
#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

static int on_double(void)
{
    const char *e = getenv("VMM_EXPECT_CUDA_DOUBLE");
    return e && strcmp(e, "1") == 0;
}

/* An allocator with 2 MiB one-handle pages, alias_pages as asked, `cap` bytes of device. */
static vmm_allocator *make(int alias, size_t cap)
{
    char conf[256];
    vmm_allocator *a = NULL;
    if (on_double()) {
        /* the double's device is larger: cap it with the memory fraction */
        vmm_allocator *probe = NULL;
        if (vmm_create("driver:cuda", &probe) != VMM_OK) {
            fprintf(stderr, "driver:cuda: %s\n", vmm_last_error());
            vmm_test_failures++;
            return NULL;
        }
        /* half a MiB over: the cap is rounded down to whole pages */
        double frac = (double)(cap + MiB / 2) / (double)probe->dev.total_bytes;
        vmm_destroy(probe);
        snprintf(conf, sizeof conf, "driver:cuda,ipc:false,max_handle_size:2M,alias_pages:%s,"
                 "per_process_memory_fraction:%.9f,thread_cache:0", alias ? "true" : "false", frac);
    } else {
        snprintf(conf, sizeof conf, "driver:sim,sim_capacity:%zuM,sim_backed:true,ipc:false,max_handle_size:2M,"
                 "alias_pages:%s,thread_cache:0", cap / MiB, alias ? "true" : "false");
    }
    CHECK_OK(vmm_create(conf, &a));
    return a;
}

static int64_t reserved(vmm_allocator *a)
{
    return vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current;
}

static void *take(vmm_allocator *a, size_t n)
{
    void *p = NULL;
    CHECK_OK(vmm_malloc(a, n, NULL, &p));
    CHECK_OK(vmm_check(a));
    return p;
}

static void give(vmm_allocator *a, void *p)
{
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_check(a));
}

/* Bytes through the device pointer, by the driver's stream-ordered copies and a sync (the
 * double's device memory is not the host's to touch), one pattern per MiB (seed + k for the k-th)
 * so that any whole MiB can be checked on its own. */
static void fill(vmm_allocator *a, void *p, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    if (!h)
        return;
    for (size_t k = 0; k * MiB < n; k++)
        vmm_test_fill(h + k * MiB, n - k * MiB < MiB ? n - k * MiB : MiB, seed + (unsigned)k, 4096);
    CHECK_EQ(a->drv->ops->memcpy_htod(a->drv, (uintptr_t)p, h, n, NULL), 0);
    CHECK_EQ(a->drv->ops->stream_sync(a->drv, NULL), 0);
    free(h);
}

static int intact(vmm_allocator *a, const void *p, size_t n, unsigned seed)
{
    unsigned char *h = malloc(n);
    int ok = h && a->drv->ops->memcpy_dtoh(a->drv, h, (uintptr_t)p, n, NULL) == 0 &&
             a->drv->ops->stream_sync(a->drv, NULL) == 0;
    for (size_t k = 0; ok && k * MiB < n; k++)
        ok = vmm_test_intact(h + k * MiB, n - k * MiB < MiB ? n - k * MiB : MiB, seed + (unsigned)k, 4096);
    free(h);
    return ok;
}

/* Tail: A [0, 3M) and S [3M, 8M) (S stays); A freed; B (5 MiB) grows after S, pages 4-6, and its
 * last page (1 MiB used) is page 1, whose free prefix [2M, 3M) A left. Returns the allocator with
 * S and B live; *s, *b their pointers. */
static vmm_allocator *tail_case(int alias, char **s, char **b)
{
    vmm_allocator *a = make(alias, 64 * MiB);
    if (!a)
        return NULL;
    char *pa = take(a, 3 * MiB);
    *s = take(a, 5 * MiB);
    CHECK_EQ((uintptr_t)*s, (uintptr_t)pa + 3 * MiB);
    fill(a, *s, 5 * MiB, 11);
    give(a, pa);
    CHECK_EQ(reserved(a), 8 * MiB);
    *b = take(a, 5 * MiB);
    fill(a, *b, 5 * MiB, 22);
    CHECK(intact(a, *s, 5 * MiB, 11));
    CHECK(intact(a, *b, 5 * MiB, 22));
    return a;
}

static void tail(void)
{
    char *s, *b;
    /* without the key: page 0 goes to B, B's last page is a new one (6 pages for 10 MiB) */
    vmm_allocator *a = tail_case(0, &s, &b);
    if (!a)
        return;
    CHECK_EQ(reserved(a), 12 * MiB);
    CHECK_EQ(vmm_test_stats(a).mapped_bytes[VMM_POOL_ALL].current, 12 * MiB);
    vmm_destroy(a);

    for (int order = 0; order < 2; order++) {
        a = tail_case(1, &s, &b);
        if (!a)
            return;
        /* B's last page is page 1 mapped again: 5 pages held, 6 mapped */
        CHECK_EQ(reserved(a), 10 * MiB);
        CHECK_EQ(vmm_test_stats(a).mapped_bytes[VMM_POOL_ALL].current, 12 * MiB);
        /* one physical page: B's last MiB is what page 1's first view shows at [2M, 3M) */
        fill(a, b + 4 * MiB, 1 * MiB, 33);
        CHECK(intact(a, s - 1 * MiB, 1 * MiB, 33));
        CHECK(intact(a, s, 5 * MiB, 11));
        char *first = order ? s : b, *other = order ? b : s;
        give(a, first);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        /* the other block's three pages stay (its shared page among them) */
        CHECK_EQ(reserved(a), 6 * MiB);
        CHECK(order ? intact(a, b, 4 * MiB, 22) : intact(a, s, 5 * MiB, 11));
        if (order)
            CHECK(intact(a, b + 4 * MiB, 1 * MiB, 33));
        give(a, other);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK_EQ(reserved(a), 0);
        CHECK_EQ(vmm_test_stats(a).mapped_bytes[VMM_POOL_ALL].current, 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* Head: S [0, 3M), Q [3M, 6M), W [6M, 10M); Q freed and its whole page 2 reclaimed: page 1 keeps
 * the free suffix [3M, 4M), beside a one-page gap that no 4.5 MiB request fits. X (4.5 MiB) grows
 * after W and starts 1 MiB into its first page, page 1 mapped again. */
static void head(void)
{
    for (int alias = 0; alias < 2; alias++) {
        vmm_allocator *a = make(alias, 64 * MiB);
        if (!a)
            return;
        char *s = take(a, 3 * MiB), *q = take(a, 3 * MiB), *w = take(a, 4 * MiB);
        CHECK_EQ((uintptr_t)w, (uintptr_t)s + 6 * MiB);
        fill(a, s, 3 * MiB, 1);
        fill(a, w, 4 * MiB, 2);
        give(a, q);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 8 * MiB);
        char *x = take(a, 4 * MiB + 512 * 1024);
        fill(a, x, 4 * MiB + 512 * 1024, 3);
        if (!alias) {
            CHECK_EQ(reserved(a), 14 * MiB);
        } else {
            CHECK_EQ(reserved(a), 12 * MiB);
            CHECK_EQ(((uintptr_t)x - (uintptr_t)s) % (2 * MiB), 1 * MiB);
            CHECK(intact(a, s + 3 * MiB, 1 * MiB, 3)); /* X's first MiB, through page 1's first view */
        }
        CHECK(intact(a, s, 3 * MiB, 1));
        CHECK(intact(a, w, 4 * MiB, 2));
        CHECK(intact(a, x, 4 * MiB + 512 * 1024, 3));
        give(a, s);
        give(a, w);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_OK(vmm_check(a));
        CHECK(intact(a, x, 4 * MiB + 512 * 1024, 3));
        CHECK_EQ(reserved(a), 6 * MiB); /* X's three pages */
        give(a, x);
        CHECK_OK(vmm_empty_cache(a));
        CHECK_EQ(reserved(a), 0);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* Every page of a 14 MiB device: A [0, 3M), S [3M, 8M), C [8M, 12M); A freed; B (5 MiB) after C
 * fits only with its last page in page 1's free prefix (key off: ENOMEM). S and B freed, C stays:
 * 10 MiB of pages are free, in two runs with page 1 split between its views; a 10 MiB request
 * needs page 1 whole, which dropping B's idle view gives (growth at the device's end). */
static void full_device(void)
{
    for (int alias = 0; alias < 2; alias++) {
        vmm_allocator *a = make(alias, 14 * MiB);
        if (!a)
            return;
        char *pa = take(a, 3 * MiB), *s = take(a, 5 * MiB), *c = take(a, 4 * MiB);
        CHECK_EQ((uintptr_t)c, (uintptr_t)pa + 8 * MiB);
        fill(a, c, 4 * MiB, 7);
        give(a, pa);
        void *p = NULL;
        int rc = vmm_malloc(a, 5 * MiB, NULL, &p);
        CHECK_OK(vmm_check(a));
        if (!alias) {
            /* six pages for S and C, three for B, one of them page 0's: 16 MiB */
            CHECK_EQ(rc, VMM_ENOMEM);
            vmm_destroy(a);
            continue;
        }
        CHECK_OK(rc);
        char *b = p;
        CHECK_EQ(reserved(a), 14 * MiB);
        give(a, s);
        give(a, b);
        char *d = take(a, 10 * MiB);
        CHECK(d != NULL);
        CHECK_EQ(reserved(a), 14 * MiB);
        CHECK(intact(a, c, 4 * MiB, 7));
        if (d) {
            fill(a, d, 10 * MiB, 5);
            CHECK(intact(a, d, 10 * MiB, 5));
            CHECK(intact(a, c, 4 * MiB, 7));
            give(a, d);
        }
        give(a, c);
        vmm_destroy(a);
    }
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

/* vmm_destroy with both blocks and both views in place. */
static void destroy_mapped(void)
{
    char *s, *b;
    vmm_allocator *a = tail_case(1, &s, &b);
    if (!a)
        return;
    CHECK_EQ(reserved(a), 10 * MiB);
    vmm_destroy(a);
    if (!on_double())
        vmm_test_check_no_sim_leaks();
}

int main(void)
{
    tail();
    head();
    full_device();
    destroy_mapped();
    TEST_DONE();
}
