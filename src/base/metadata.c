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
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

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

/* Tables (vmm_meta_table_alloc): power-of-two blocks of TBL_MIN .. TBL_CHUNK / 2 bytes carved from
 * 2 MiB chunks by halving (a buddy system: a freed block merges with its free buddy, and a chunk
 * whole again goes back to the OS); TBL_CHUNK or more, chunks of their own. */
enum {
    TBL_MIN_SHIFT = 16,
    TBL_CHUNK_SHIFT = 21,
    TBL_ORDERS = TBL_CHUNK_SHIFT - TBL_MIN_SHIFT, /* free lists: 64 KiB .. 1 MiB */
};
#define TBL_MIN ((size_t)1 << TBL_MIN_SHIFT)
#define TBL_CHUNK ((size_t)1 << TBL_CHUNK_SHIFT)

typedef struct tbl_free {
    struct tbl_free *next;
} tbl_free;

/* A chunk of records (vmm_meta_rec_alloc, "records" below). */
enum { REC_PER_CHUNK = (int)(TBL_CHUNK / VMM_META_REC) };
typedef struct rec_chunk {
    struct rec_chunk *next, *prev; /* in rec_part while it has a free record */
    tbl_free *free;                /* freed records */
    uint32_t used;                 /* records handed out */
    uint32_t fresh;                /* records never handed out start at this index */
} rec_chunk;
_Static_assert(sizeof(rec_chunk) <= VMM_META_REC, "the chunk header fits in the first record's room");

struct vmm_meta {
    mallocx_fn mallocx;   /* NULL: libc */
    sdallocx_fn sdallocx;
    int flags;            /* arena | no tcache */
    _Atomic int64_t bytes;
    pthread_mutex_t tbl_mu;           /* the free lists (growths of several lanes' shards) */
    tbl_free *tbl[TBL_ORDERS];        /* tbl[k]: free blocks of TBL_MIN << k bytes */
    pthread_mutex_t rec_mu;           /* the record chunks (vmm_meta_rec_alloc) */
    struct rec_chunk *rec_part;       /* chunks with a free record */
    struct rec_chunk *rec_spare;      /* one empty chunk kept mapped */
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
    pthread_mutex_init(&m->tbl_mu, NULL);
    pthread_mutex_init(&m->rec_mu, NULL);
    if (!getenv("VMM_META_NO_JEMALLOC"))
        meta_try_jemalloc(m);
    *out = m;
    return VMM_OK;
}

/* The arena itself is left to jemalloc: destroying it would need every record freed first, and an
 * idle arena costs only its empty extents, which jemalloc's decay returns to the OS. */
void vmm_meta_close(vmm_meta *m)
{
    if (m->rec_spare)
        munmap(m->rec_spare, TBL_CHUNK);
    while (m->rec_part) { /* records not freed (vmm_meta_bytes says how many bytes): their chunks go */
        rec_chunk *c = m->rec_part;
        m->rec_part = c->next;
        munmap(c, TBL_CHUNK);
    }
    pthread_mutex_destroy(&m->rec_mu);
    pthread_mutex_destroy(&m->tbl_mu);
    free(m);
}

/* Bytes handed out, for vmm_meta_bytes: records, tables and record chunks alike. */
static inline void meta_count(vmm_meta *m, int64_t delta)
{
    atomic_fetch_add_explicit(&m->bytes, delta, memory_order_relaxed);
}

void *vmm_meta_alloc(vmm_meta *m, size_t size)
{
    void *p = m->mallocx ? m->mallocx(size, m->flags | JE_MALLOCX_ZERO) : calloc(1, size);
    if (p)
        meta_count(m, (int64_t)size);
    return p;
}

void vmm_meta_free(vmm_meta *m, void *p, size_t size)
{
    if (!p)
        return;
    meta_count(m, -(int64_t)size);
    if (m->sdallocx)
        m->sdallocx(p, size, m->flags);
    else
        free(p);
}

/* ---- tables ------------------------------------------------------------------------------ */

/* `size` bytes (a multiple of TBL_CHUNK) aligned to TBL_CHUNK, zeroed, asked to be backed by
 * transparent huge pages (madvise: where THP is off or "never" the advice is refused and 4 KiB
 * pages serve); NULL when out of memory. */
static void *chunk_map(size_t size)
{
    size_t span = size + TBL_CHUNK;
    char *raw = mmap(NULL, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    char *p = (char *)(((uintptr_t)raw + TBL_CHUNK - 1) & ~(uintptr_t)(TBL_CHUNK - 1));
    if (p > raw)
        munmap(raw, (size_t)(p - raw));
    if (p + size < raw + span)
        munmap(p + size, (size_t)(raw + span - (p + size)));
    (void)madvise(p, size, MADV_HUGEPAGE);
    return p;
}

static unsigned tbl_order(size_t size) { return (unsigned)__builtin_ctzll(size) - TBL_MIN_SHIFT; }

void *vmm_meta_table_alloc(vmm_meta *m, size_t size)
{
    if (size < TBL_MIN || (size & (size - 1)))
        return vmm_meta_alloc(m, size);
    void *p;
    if (size >= TBL_CHUNK) {
        p = chunk_map(size);
    } else {
        unsigned k = tbl_order(size), j = k;
        pthread_mutex_lock(&m->tbl_mu);
        while (j < TBL_ORDERS && !m->tbl[j])
            j++;
        char *b;
        if (j < TBL_ORDERS) {
            b = (char *)m->tbl[j];
            m->tbl[j] = m->tbl[j]->next;
        } else {
            b = chunk_map(TBL_CHUNK);
        }
        if (b) {
            /* halve down to the order asked: the upper halves go to the free lists */
            while (j > k) {
                j--;
                tbl_free *hi = (tbl_free *)(b + (TBL_MIN << j));
                hi->next = m->tbl[j];
                m->tbl[j] = hi;
            }
        }
        pthread_mutex_unlock(&m->tbl_mu);
        p = b;
        if (p)
            memset(p, 0, size); /* a free block holds a list link, a reused one old slots */
    }
    if (p)
        meta_count(m, (int64_t)size);
    return p;
}

void vmm_meta_table_free(vmm_meta *m, void *p, size_t size)
{
    if (!p)
        return;
    if (size < TBL_MIN || (size & (size - 1))) {
        vmm_meta_free(m, p, size);
        return;
    }
    meta_count(m, -(int64_t)size);
    if (size >= TBL_CHUNK) {
        munmap(p, size);
        return;
    }
    uintptr_t b = (uintptr_t)p;
    pthread_mutex_lock(&m->tbl_mu);
    for (unsigned k = tbl_order(size);; k++) {
        if (k == TBL_ORDERS) { /* the whole chunk is free */
            pthread_mutex_unlock(&m->tbl_mu);
            munmap((void *)b, TBL_CHUNK);
            return;
        }
        /* chunks are aligned to their size, so a block's buddy differs in one address bit */
        uintptr_t buddy = b ^ (TBL_MIN << k);
        tbl_free **pp = &m->tbl[k];
        while (*pp && (uintptr_t)*pp != buddy)
            pp = &(*pp)->next;
        if (!*pp) {
            tbl_free *f = (tbl_free *)b;
            f->next = m->tbl[k];
            m->tbl[k] = f;
            break;
        }
        *pp = (*pp)->next;
        b &= ~(uintptr_t)(TBL_MIN << k);
    }
    pthread_mutex_unlock(&m->tbl_mu);
}

/* ---- records ----------------------------------------------------------------------------- */

/* Records of VMM_META_REC bytes carved from 2 MiB chunks advised MADV_HUGEPAGE (chunk_map), the first
 * record's room holding the chunk's header: a record is then found without a TLB miss at 10^6 live
 * blocks, where a free's walk of the pool touches a record of its neighbour. A chunk goes back to the
 * OS when its last record is freed, but for one spare. */


static void rec_unlink(vmm_meta *m, rec_chunk *c)
{
    if (c->prev)
        c->prev->next = c->next;
    else
        m->rec_part = c->next;
    if (c->next)
        c->next->prev = c->prev;
    c->next = c->prev = NULL;
}

void *vmm_meta_rec_alloc(vmm_meta *m)
{
    pthread_mutex_lock(&m->rec_mu);
    rec_chunk *c = m->rec_part;
    if (!c) {
        c = m->rec_spare;
        m->rec_spare = NULL;
        if (!c)
            c = chunk_map(TBL_CHUNK); /* zeroed */
        if (!c) {
            pthread_mutex_unlock(&m->rec_mu);
            return NULL;
        }
        if (!c->fresh && !c->used)
            c->fresh = 1; /* record 0 is the header */
        c->next = NULL;
        c->prev = NULL;
        m->rec_part = c;
    }
    char *p;
    if (c->free) {
        p = (char *)c->free;
        c->free = c->free->next;
    } else {
        p = (char *)c + (size_t)c->fresh++ * VMM_META_REC;
    }
    if (++c->used == REC_PER_CHUNK - 1)
        rec_unlink(m, c); /* full */
    pthread_mutex_unlock(&m->rec_mu);
    memset(p, 0, VMM_META_REC); /* a freed record holds a list link, a reused one old fields */
    meta_count(m, VMM_META_REC);
    return p;
}

void vmm_meta_rec_free(vmm_meta *m, void *p)
{
    if (!p)
        return;
    meta_count(m, -(int64_t)VMM_META_REC);
    rec_chunk *c = (rec_chunk *)((uintptr_t)p & ~(uintptr_t)(TBL_CHUNK - 1));
    pthread_mutex_lock(&m->rec_mu);
    if (c->used == REC_PER_CHUNK - 1) { /* was full: has a free record again */
        c->next = m->rec_part;
        c->prev = NULL;
        if (m->rec_part)
            m->rec_part->prev = c;
        m->rec_part = c;
    }
    tbl_free *f = p;
    f->next = c->free;
    c->free = f;
    rec_chunk *gone = NULL;
    if (--c->used == 0) {
        rec_unlink(m, c);
        if (m->rec_spare) {
            gone = c;
        } else {
            c->free = NULL; /* a fresh chunk again, kept mapped (records are zeroed when handed out) */
            c->fresh = 1;
            m->rec_spare = c;
        }
    }
    pthread_mutex_unlock(&m->rec_mu);
    if (gone)
        munmap(gone, TBL_CHUNK);
}

int64_t vmm_meta_bytes(const vmm_meta *m)
{
    return atomic_load_explicit(&((vmm_meta *)m)->bytes, memory_order_relaxed);
}

const char *vmm_meta_backend(const vmm_meta *m) { return m->mallocx ? "jemalloc-arena" : "libc"; }
