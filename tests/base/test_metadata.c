// ctest-labels: unit
/* Metadata records come from a private jemalloc arena in programs that link jemalloc, from libc
 * otherwise, and their bytes are counted either way. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

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
    vmm_meta_close(m);
#else
    /* built without jemalloc (VMM_REQUIRE_JEMALLOC=OFF): the arena half cannot run; libc's does */
    fprintf(stderr, "test_metadata: built without jemalloc: the private-arena checks were not run\n");
#endif

    setenv("VMM_META_NO_JEMALLOC", "1", 1);
    CHECK_OK(vmm_meta_open(&m));
    CHECK(strcmp(vmm_meta_backend(m), "libc") == 0);
    exercise(m);
    vmm_meta_close(m);
    TEST_DONE();
}
