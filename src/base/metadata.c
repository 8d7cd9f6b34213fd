/*
 * Host memory for the allocator's own records (blocks, segments, pages, events).
 *
 * When the process has jemalloc loaded (the tests, stress and bench programs link it), records come
 * from a private jemalloc arena without thread cache, so they never mix with the application's heap
 * and their footprint is measurable. The library itself must not link jemalloc: Debian's build uses
 * initial-exec TLS and cannot be dlopen'ed into Python, which is how PyTorch loads pluggable
 * allocators. So the symbols are looked up at run time, and the system allocator serves otherwise.
 */
#include <dlfcn.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"
#include "base/metadata.h"

/* jemalloc's mallocx flag encoding (jemalloc.h, stable since 4.0): the arena index + 1 in bits 20+,
 * tcache index + 2 in bits 8..19 (so "no tcache" is 1 << 8), and 0x40 for zeroed memory. */
enum {
    JE_MALLOCX_ZERO = 0x40,
    JE_MALLOCX_TCACHE_NONE = (-1 + 2) << 8,
    JE_MALLOCX_ARENA_SHIFT = 20,
};

typedef int (*mallctl_fn)(const char *, void *, size_t *, void *, size_t);
typedef void *(*mallocx_fn)(size_t, int);
typedef void (*sdallocx_fn)(void *, size_t, int);

struct vmm_meta {
    mallocx_fn mallocx;   /* NULL: libc */
    sdallocx_fn sdallocx;
    int flags;            /* arena | no tcache */
    _Atomic int64_t bytes;
};

/* Find jemalloc in the process (not in this library's dependencies) and make a private arena. */
static int meta_try_jemalloc(vmm_meta *m)
{
    mallctl_fn ctl = (mallctl_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "mallctl");
    mallocx_fn mx = (mallocx_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "mallocx");
    sdallocx_fn sdx = (sdallocx_fn)(uintptr_t)dlsym(RTLD_DEFAULT, "sdallocx");
    if (!ctl || !mx || !sdx)
        return 0;
    unsigned arena = 0;
    size_t sz = sizeof arena;
    if (ctl("arenas.create", &arena, &sz, NULL, 0) != 0)
        return 0;
    m->mallocx = mx;
    m->sdallocx = sdx;
    m->flags = (int)((arena + 1u) << JE_MALLOCX_ARENA_SHIFT) | JE_MALLOCX_TCACHE_NONE;
    return 1;
}

int vmm_meta_open(vmm_meta **out)
{
    vmm_meta *m = calloc(1, sizeof *m);
    if (!m)
        return vmm_fail(VMM_EHOSTMEM, "metadata: out of host memory");
    if (!getenv("VMM_META_NO_JEMALLOC"))
        meta_try_jemalloc(m);
    *out = m;
    return VMM_OK;
}

/* The arena itself is left to jemalloc: destroying it would need every record freed first, and an
 * idle arena costs only its empty extents, which jemalloc's decay returns to the OS. */
void vmm_meta_close(vmm_meta *m) { free(m); }

void *vmm_meta_alloc(vmm_meta *m, size_t size)
{
    void *p = m->mallocx ? m->mallocx(size, m->flags | JE_MALLOCX_ZERO) : calloc(1, size);
    if (p)
        atomic_fetch_add_explicit(&m->bytes, (int64_t)size, memory_order_relaxed);
    return p;
}

void vmm_meta_free(vmm_meta *m, void *p, size_t size)
{
    if (!p)
        return;
    atomic_fetch_sub_explicit(&m->bytes, (int64_t)size, memory_order_relaxed);
    if (m->sdallocx)
        m->sdallocx(p, size, m->flags);
    else
        free(p);
}

int64_t vmm_meta_bytes(const vmm_meta *m)
{
    return atomic_load_explicit(&((vmm_meta *)m)->bytes, memory_order_relaxed);
}

const char *vmm_meta_backend(const vmm_meta *m) { return m->mallocx ? "jemalloc-arena" : "libc"; }
