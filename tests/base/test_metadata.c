// ctest-labels: unit
/* Metadata records come from a private jemalloc arena in programs that link jemalloc, from libc
 * otherwise, and their bytes are counted either way; tables and the pool's block records from
 * huge-page chunks. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#ifdef VMM_HAVE_JEMALLOC
#include <jemalloc/jemalloc.h>
#endif

#include "internal.h"
#include "testutil.h"

static void exercise(vmm_meta *m)
{
    enum { N = 1000 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        p[i] = vmm_meta_alloc(m, 64 + (size_t)i);
        CHECK(p[i] != NULL);
        CHECK(((unsigned char *)p[i])[63] == 0); /* zeroed */
        memset(p[i], 0xab, 64 + (size_t)i);
    }
    int64_t expect = 0;
    for (int i = 0; i < N; i++)
        expect += 64 + i;
    CHECK_EQ(vmm_meta_bytes(m), expect);
    for (int i = 0; i < N; i++)
        vmm_meta_free(m, p[i], 64 + (size_t)i);
    CHECK_EQ(vmm_meta_bytes(m), 0);
}

/* Whether the pages at p are mapped (mincore fails with ENOMEM on an unmapped range). */
static int mapped(const void *p)
{
    unsigned char v;
    return mincore((void *)((uintptr_t)p & ~(uintptr_t)4095), 4096, &v) == 0;
}

/* Tables: power-of-two sizes of 64 KiB up come from 2 MiB chunks split in halves (buddies), zeroed
 * each time, counted, and a chunk whose blocks are all free again is unmapped. */
static void tables(vmm_meta *m)
{
    enum { KiB = 1024, MiB = 1024 * 1024 };
    int64_t base = vmm_meta_bytes(m);
    /* below 64 KiB, or not a power of two: the records' allocator (still zeroed and counted) */
    unsigned char *small = vmm_meta_table_alloc(m, 32 * KiB);
    unsigned char *odd = vmm_meta_table_alloc(m, 96 * KiB);
    CHECK(small && odd && small[32 * KiB - 1] == 0 && odd[96 * KiB - 1] == 0);
    CHECK_EQ(vmm_meta_bytes(m), base + 128 * KiB);
    vmm_meta_table_free(m, small, 32 * KiB);
    vmm_meta_table_free(m, odd, 96 * KiB);

    /* two 1 MiB tables are the two halves of one aligned chunk */
    unsigned char *a = vmm_meta_table_alloc(m, MiB), *b = vmm_meta_table_alloc(m, MiB);
    CHECK(a && b);
    CHECK_EQ(((uintptr_t)a ^ (uintptr_t)b), (uintptr_t)MiB);
    CHECK_EQ(((uintptr_t)a & (2 * MiB - 1)) % MiB, 0);
    CHECK_EQ(vmm_meta_bytes(m), base + 2 * MiB);
    memset(a, 0xab, MiB);
    /* a freed block comes back zeroed: a's half split into 64 KiB tables */
    vmm_meta_table_free(m, a, MiB);
    unsigned char *t[16];
    for (int i = 0; i < 16; i++) {
        t[i] = vmm_meta_table_alloc(m, 64 * KiB);
        CHECK(t[i] != NULL);
        CHECK(((uintptr_t)t[i] & ~(uintptr_t)(MiB - 1)) == ((uintptr_t)a & ~(uintptr_t)(MiB - 1)));
        for (size_t j = 0; j < 64 * KiB; j += 4096)
            CHECK(t[i][j] == 0 && t[i][j + 4095] == 0);
        memset(t[i], 0xcd, 64 * KiB);
    }
    CHECK_EQ(vmm_meta_bytes(m), base + 2 * MiB);
    /* all free again, in an order that merges only at the end: the chunk is unmapped */
    for (int i = 15; i >= 0; i -= 2)
        vmm_meta_table_free(m, t[i], 64 * KiB);
    for (int i = 0; i < 16; i += 2)
        vmm_meta_table_free(m, t[i], 64 * KiB);
    CHECK(mapped(b));
    vmm_meta_table_free(m, b, MiB);
    CHECK(!mapped(b) && !mapped(a));
    CHECK_EQ(vmm_meta_bytes(m), base);

    /* 2 MiB and more: a chunk of its own, aligned to 2 MiB, unmapped when freed */
    unsigned char *big = vmm_meta_table_alloc(m, 4 * MiB);
    CHECK(big != NULL);
    CHECK_EQ((uintptr_t)big & (2 * MiB - 1), 0);
    CHECK(big[0] == 0 && big[4 * MiB - 1] == 0);
    CHECK_EQ(vmm_meta_bytes(m), base + 4 * MiB);
    vmm_meta_table_free(m, big, 4 * MiB);
    CHECK(!mapped(big));
    CHECK_EQ(vmm_meta_bytes(m), base);
}

/* Records (vmm_meta_rec_alloc): zeroed though the room held an older record, distinct, counted,
 * and a chunk of them (2 MiB: 16,383 records and its header) given back to the OS when its last
 * record is freed, but for one spare kept mapped. */
static void records(vmm_meta *m)
{
    enum { PER = (1 << 21) / VMM_META_REC - 1, N = 3 * PER + 10 };
    static void *r[N];
    for (int i = 0; i < N; i++) {
        r[i] = vmm_meta_rec_alloc(m);
        CHECK(r[i] != NULL);
        CHECK(((uintptr_t)r[i] & (VMM_META_REC - 1)) == 0);
        CHECK(((unsigned char *)r[i])[0] == 0 && ((unsigned char *)r[i])[VMM_META_REC - 1] == 0);
        memset(r[i], 0xcd, VMM_META_REC);
    }
    CHECK_EQ(vmm_meta_bytes(m), (int64_t)N * VMM_META_REC);
    /* four chunks: the second one's records freed (the chunk kept as the spare), then as many again:
     * zeroed though their rooms held records */
    uintptr_t c1 = (uintptr_t)r[PER] & ~(uintptr_t)((1 << 21) - 1);
    CHECK(((uintptr_t)r[2 * PER - 1] & ~(uintptr_t)((1 << 21) - 1)) == c1);
    for (int i = PER; i < 2 * PER; i++)
        vmm_meta_rec_free(m, r[i]);
    CHECK(mapped((void *)c1)); /* the spare */
    for (int i = PER; i < 2 * PER; i++) {
        r[i] = vmm_meta_rec_alloc(m);
        CHECK(r[i] != NULL && ((unsigned char *)r[i])[5] == 0);
    }
    for (int i = 0; i < N; i++)
        for (int j = i + 1; j < N && j < i + 4; j++)
            CHECK(r[i] != r[j]);
    uintptr_t c0 = (uintptr_t)r[0] & ~(uintptr_t)((1 << 21) - 1);
    for (int i = 0; i < N; i++)
        vmm_meta_rec_free(m, r[i]);
    CHECK_EQ(vmm_meta_bytes(m), 0);
    int still = 0;
    for (int i = 0; i < N; i += PER)
        still += mapped((void *)((uintptr_t)r[i] & ~(uintptr_t)((1 << 21) - 1)));
    CHECK(still <= 1); /* the spare only */
    (void)c0;
}

int main(void)
{
    vmm_meta *m;
#ifdef VMM_HAVE_JEMALLOC
    /* Keep a reference so the linker cannot drop jemalloc from this program. */
    void *probe = mallocx(16, 0);
    CHECK(probe != NULL);
    dallocx(probe, 0);

    CHECK_OK(vmm_meta_open(&m));
    CHECK(strcmp(vmm_meta_backend(m), "jemalloc-arena") == 0);
    /* The record lives in an arena other than the default (0). */
    void *rec = vmm_meta_alloc(m, 128);
    unsigned arena = 0;
    size_t sz = sizeof arena;
    CHECK(mallctl("arenas.lookup", &arena, &sz, &rec, sizeof rec) == 0);
    CHECK(arena != 0);
    vmm_meta_free(m, rec, 128);
    exercise(m);
    tables(m);
    records(m);
    vmm_meta_close(m);
#else
    /* built without jemalloc (VMM_REQUIRE_JEMALLOC=OFF): the arena half cannot run; libc's does */
    fprintf(stderr, "test_metadata: built without jemalloc: the private-arena checks were not run\n");
#endif

    setenv("VMM_META_NO_JEMALLOC", "1", 1);
    CHECK_OK(vmm_meta_open(&m));
    CHECK(strcmp(vmm_meta_backend(m), "libc") == 0);
    exercise(m);
    tables(m);
    records(m);
    vmm_meta_close(m);
    TEST_DONE();
}
