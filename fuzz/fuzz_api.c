/*
 * API fuzzer (libFuzzer): drives the public API of one allocator on the simulated device from the
 * input's bytes, and checks what vmmalloc.h promises against a shadow model:
 *  - live blocks with their fill patterns (first and last bytes written by the host, read back
 *    before every free and after wakes of BACKUP sleeps), alignment, usable size, no overlap;
 *  - tags asleep or awake (vmm_is_asleep agrees; allocations under a sleeping tag refuse);
 *  - private pools and global-mode captures (a route is always in force while a stream captures,
 *    as PyTorch does): a capture ends valid unless the fuzzer itself made a call the header says
 *    may synchronize;
 *  - pinned blocks (size class, stats);
 *  - mapping callbacks: an after_map never names a page already reported mapped, a before_unmap
 *    names only reported pages, and the reported set equals vmm_get_mappings (without faults);
 *  - status codes within each function's documented list; frees never fail;
 *  - vmm_check after every step; after vmm_destroy no simulated resource is alive and every
 *    reported page was reported unmapped.
 * Random driver faults (vmm_sim_fail_random) are part of the input. Any violation aborts with a
 * message (a crash for libFuzzer). docs/stress.md says how to run it and what it does not cover.
 */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "vmmalloc.h"
#include "vmmalloc_sim.h"

#define MiB ((size_t)1 << 20)

enum { MAX_LIVE = 48, MAX_PINNED = 16, MAX_PAGES = 4096, N_STREAMS = 3, N_TAGS = 3, MAX_OPS = 400 };

static const char *const tag_names[N_TAGS] = {"", "a", "b"};

typedef struct live {
    void *p;
    size_t size;      /* asked for */
    int tag;          /* tag current at malloc */
    int known;        /* contents are the pattern (else undefined: a DISCARD sleep) */
    unsigned seed;
    int group;        /* a fused group (freed through its first pointer) */
} live;

typedef struct pinned {
    void *p;
    size_t size;
} pinned;

typedef struct fz {
    const uint8_t *d;
    size_t n, pos;
    vmm_allocator *a;
    vmm_stream s[N_STREAMS];
    live blk[MAX_LIVE];
    int n_live;
    pinned pin[MAX_PINNED];
    int n_pin;
    int cur_tag;
    int asleep[N_TAGS];
    int used_tag[N_TAGS];
    int slept_mode[N_TAGS];
    int faults;          /* random faults on */
    int fault_kind;      /* and their setting, to turn them on again for vmm_destroy */
    double fault_p;
    unsigned fault_seed;
    int expandable;
    /* pools: ids 1..3; routes in force */
    int routed[4];
    int users[4];
    int capturing;       /* stream 1 captures (route to pool 1 in force) */
    int unsafe;          /* a call that may synchronize was made during the capture */
    vmm_sim_graph *graphs[8];    /* each holds a user of pool 1 (its capture's vmm_pool_begin) */
    int n_graphs;
    int captured_writes;         /* memsets recorded by the capture in progress */
    int replayed;                /* a graph was replayed: pool 1's memory may be written any time */
    /* mapping callbacks */
    int cb_on;
    uintptr_t pages[MAX_PAGES];
    size_t page_size[MAX_PAGES];
    int n_pages;
    int history;
    unsigned seed;
} fz;

static fz F;

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_api: contract violated: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (last error: %s)\n", vmm_last_error());
    va_end(ap);
    abort();
}

static unsigned u8(fz *f) { return f->pos < f->n ? f->d[f->pos++] : 0; }
static unsigned u16(fz *f) { return u8(f) | u8(f) << 8; }

/* rc must be one of the listed codes (terminated by 1) */
static void allowed(int rc, const char *fn, ...)
{
    va_list ap;
    va_start(ap, fn);
    for (int c = va_arg(ap, int); c != 1; c = va_arg(ap, int))
        if (c == rc) {
            va_end(ap);
            return;
        }
    va_end(ap);
    die("%s returned %d (%s), not in its documented list", fn, rc, vmm_status_name(rc));
}

/* ---- mapping callbacks: the reported set of pages ------------------------------------------- */

static int page_find(uintptr_t va)
{
    for (int i = 0; i < F.n_pages; i++)
        if (F.pages[i] == va)
            return i;
    return -1;
}

static void after_map(void *ctx, uintptr_t va, size_t size, int dev, const uint64_t *h, size_t n)
{
    if (!n || size % n)
        die("after_map: %zu bytes in %zu handles", size, n);
    size_t ps = size / n;
    for (size_t i = 0; i < n; i++) {
        if (page_find(va + i * ps) >= 0)
            die("after_map of 0x%lx, mapped already", (unsigned long)(va + i * ps));
        if (F.n_pages == MAX_PAGES)
            die("more than %d pages mapped", MAX_PAGES);
        F.page_size[F.n_pages] = ps;
        F.pages[F.n_pages++] = va + i * ps;
    }
}

static void before_unmap(void *ctx, uintptr_t va, size_t size, int dev, const uint64_t *h, size_t n)
{
    if (!n || size % n)
        die("before_unmap: %zu bytes in %zu handles", size, n);
    size_t ps = size / n;
    for (size_t i = 0; i < n; i++) {
        int k = page_find(va + i * ps);
        if (k < 0)
            die("before_unmap of 0x%lx, which no after_map reported", (unsigned long)(va + i * ps));
        F.pages[k] = F.pages[--F.n_pages];
        F.page_size[k] = F.page_size[F.n_pages];
    }
}

typedef struct runs {
    size_t pages, missing;
} runs;

static void count_run(void *ctx, uintptr_t va, size_t size, int dev, const uint64_t *h, size_t n)
{
    runs *r = ctx;
    size_t ps = n ? size / n : size;
    for (size_t i = 0; i < n; i++) {
        r->pages++;
        if (page_find(va + i * ps) < 0)
            r->missing++;
    }
}

static void check_mappings(void)
{
    if (!F.cb_on || F.faults)
        return;
    runs r = {0, 0};
    int rc = vmm_get_mappings(F.a, count_run, &r);
    allowed(rc, "vmm_get_mappings", VMM_OK, VMM_EHOSTMEM, 1);
    if (rc == VMM_OK && (r.missing || r.pages != (size_t)F.n_pages))
        die("mapping callbacks reported %d pages, vmm_get_mappings %zu (%zu unreported)", F.n_pages,
            r.pages, r.missing);
}

static int free_cb(void *ctx) { return 0; }

/* ---- blocks ---------------------------------------------------------------------------------- */

/* The private pool id (1..3) of a live block, 0 for the default pools. */
static int pool_of(const live *b)
{
    uint64_t i0 = 9, i1 = 9;
    if (vmm_pool_lookup(F.a, b->p, &i0, &i1))
        die("vmm_pool_lookup of a live block");
    return (int)i0;
}


/* A block sleeps: its tag sleeps and it lies in the default pools (private pools do not sleep). */
static int block_asleep(const live *b)
{
    if (!F.asleep[b->tag])
        return 0;
    uint64_t i0 = 9, i1 = 9;
    int rc = vmm_pool_lookup(F.a, b->p, &i0, &i1);
    if (rc)
        die("vmm_pool_lookup of a live block: %d", rc);
    return i0 == 0 && i1 == 0;
}

static void fill(live *b)
{
    unsigned char *p = b->p;
    size_t k = b->size / 2 < 64 ? b->size / 2 : 64; /* head and tail apart */
    for (size_t i = 0; i < k; i++) {
        p[i] = (unsigned char)(b->seed + i);
        p[b->size - 1 - i] = (unsigned char)(b->seed ^ i);
    }
    b->known = 1;
}

static void verify(const live *b, const char *when)
{
    if (!b->known || block_asleep(b))
        return;
    const unsigned char *p = b->p;
    size_t k = b->size / 2 < 64 ? b->size / 2 : 64; /* head and tail apart */
    for (size_t i = 0; i < k; i++)
        if (p[i] != (unsigned char)(b->seed + i) || p[b->size - 1 - i] != (unsigned char)(b->seed ^ i))
            die("block %p (%zu bytes, tag \"%s\") lost its contents (%s)", b->p, b->size,
                tag_names[b->tag], when);
}

static void add_live(void *p, size_t size, int group)
{
    if (((uintptr_t)p & 511) != 0)
        die("pointer %p not aligned to 512", p);
    size_t us = vmm_usable_size(F.a, p);
    if (us < size)
        die("usable size %zu below the %zu asked for", us, size);
    for (int i = 0; i < F.n_live; i++) {
        uintptr_t x = (uintptr_t)F.blk[i].p, y = (uintptr_t)p;
        if (x < y + size && y < x + F.blk[i].size)
            die("new block %p overlaps live %p", p, F.blk[i].p);
    }
    live *b = &F.blk[F.n_live++];
    *b = (live){p, size, F.cur_tag, 0, F.seed++ * 2654435761u, group};
    fill(b);
    if (F.replayed && pool_of(b) == 1)
        b->known = 0; /* a replay still queued may write it (the pool is shared) */
}

static void do_free(int i)
{
    live *b = &F.blk[i];
    verify(b, "before its free");
    int rc = vmm_free(F.a, b->p);
    if (rc)
        die("vmm_free of a live block returned %d", rc);
    *b = F.blk[--F.n_live];
}

static vmm_stream pick_stream(fz *f) { return f->s[u8(f) % N_STREAMS]; }

static size_t pick_size(fz *f)
{
    unsigned k = u8(f);
    unsigned v = u16(f);
    switch (k % 4) {
    case 0:
        return 1 + v % 4096;             /* small */
    case 1:
        return 1 + (size_t)v * 32;       /* up to 2 MiB */
    case 2:
        return (size_t)(1 + v % 24) * MiB; /* large */
    default:
        return (size_t)v * 512 + (k >> 2); /* odd sizes, 0 included */
    }
}

/* ---- sleep state ----------------------------------------------------------------------------- */

static void sync_asleep(const char *fn)
{
    for (int t = 0; t < N_TAGS; t++) {
        if (!F.used_tag[t])
            continue;
        int r = vmm_is_asleep(F.a, tag_names[t]);
        if (r < 0)
            die("%s: vmm_is_asleep(\"%s\") = %d", fn, tag_names[t], r);
        F.asleep[t] = r;
    }
}

/* Every kind off (kind -1 covers only the kinds vmm_sim_fail_random's "every kind" names). */
static void faults_off(vmm_allocator *a)
{
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        vmm_sim_fail_random(a, k, 0, 0);
}

/* ---- steps ----------------------------------------------------------------------------------- */

static void step(fz *f)
{
    vmm_allocator *a = f->a;
    unsigned op = u8(f) % 32;
    int rc;
    switch (op) {
    case 0: case 1: case 2: case 3: case 4: { /* malloc */
        if (f->n_live == MAX_LIVE)
            break;
        size_t size = pick_size(f);
        vmm_stream s = pick_stream(f);
        void *p = (void *)1;
        rc = vmm_malloc(a, size, s, &p);
        allowed(rc, "vmm_malloc", VMM_OK, VMM_ENOMEM, VMM_EINVAL, VMM_EDRIVER, VMM_EHOSTMEM, 1);
        if (rc == VMM_EINVAL && !f->asleep[f->cur_tag])
            die("vmm_malloc(%zu): EINVAL while tag \"%s\" is awake", size, tag_names[f->cur_tag]);
        if (rc == VMM_OK && f->asleep[f->cur_tag] && size) {
            /* a routed allocation may go to a private pool, which does not sleep */
            uint64_t i0 = 0, i1 = 0;
            vmm_pool_lookup(a, p, &i0, &i1);
            if (!i0 && !i1)
                die("vmm_malloc under sleeping tag \"%s\" succeeded", tag_names[f->cur_tag]);
        }
        if (rc != VMM_OK && p != NULL)
            die("vmm_malloc failed but *ptr is %p", p);
        if (rc == VMM_OK && size == 0 && p != NULL)
            die("vmm_malloc(0) gave %p", p);
        if (rc == VMM_OK && size)
            add_live(p, size, 0);
        break;
    }
    case 5: case 6: case 7: /* free */
        if (f->n_live)
            do_free((int)(u8(f) % f->n_live));
        break;
    case 8: { /* record_stream */
        if (!f->n_live)
            break;
        live *b = &f->blk[u8(f) % f->n_live];
        rc = vmm_record_stream(a, b->p, pick_stream(f));
        allowed(rc, "vmm_record_stream", VMM_OK, VMM_EHOSTMEM, 1);
        break;
    }
    case 9: { /* fused group */
        if (f->n_live == MAX_LIVE)
            break;
        size_t sizes[4];
        size_t n = 1 + u8(f) % 4, total = 0;
        for (size_t i = 0; i < n; i++)
            total += sizes[i] = 1 + u16(f) % 8192;
        void *ptrs[4] = {0};
        rc = vmm_malloc_group(a, sizes, n, pick_stream(f), ptrs);
        allowed(rc, "vmm_malloc_group", VMM_OK, VMM_ENOMEM, VMM_EINVAL, VMM_EHOSTMEM, VMM_EDRIVER, 1);
        if (rc == VMM_EINVAL && !f->asleep[f->cur_tag])
            die("vmm_malloc_group: EINVAL while the tag is awake");
        if (rc == VMM_OK) {
            for (size_t i = 1; i < n; i++)
                if (((uintptr_t)ptrs[i] & (VMM_GROUP_ALIGN - 1)) || ptrs[i] < ptrs[i - 1])
                    die("group member %zu misplaced", i);
            add_live(ptrs[0], (size_t)((char *)ptrs[n - 1] - (char *)ptrs[0]) + sizes[n - 1], 1);
            (void)total;
        } else {
            for (size_t i = 0; i < n; i++)
                if (ptrs[i])
                    die("vmm_malloc_group failed with ptrs[%zu] set", i);
        }
        break;
    }
    case 10: { /* set_tag */
        int t = (int)(u8(f) % N_TAGS);
        rc = vmm_set_tag(a, tag_names[t]);
        allowed(rc, "vmm_set_tag", VMM_OK, VMM_ENOTSUP, VMM_EHOSTMEM, 1);
        if (rc == VMM_OK) {
            f->cur_tag = t;
            f->used_tag[t] = 1;
        } else if (rc == VMM_ENOTSUP && f->expandable) {
            die("vmm_set_tag: ENOTSUP with VMM support");
        }
        break;
    }
    case 11: { /* sleep */
        unsigned k = u8(f);
        int modes[3] = {VMM_SLEEP_DISCARD, VMM_SLEEP_BACKUP, VMM_SLEEP_BACKUP | VMM_SLEEP_KEEP_HOST};
        int mode = modes[k % 3];
        int t = (int)((k >> 2) % (N_TAGS + 1)); /* N_TAGS: every tag */
        if (t < N_TAGS && !f->used_tag[t])
            break;
        const char *one[1] = {t < N_TAGS ? tag_names[t] : NULL};
        int was[N_TAGS];
        memcpy(was, f->asleep, sizeof was);
        if (f->capturing)
            f->unsafe = 1; /* sleep waits for work: documented to synchronize streams */
        rc = t < N_TAGS ? vmm_sleep(a, one, 1, mode) : vmm_sleep(a, NULL, 0, mode);
        allowed(rc, "vmm_sleep", VMM_OK, VMM_EINVAL, VMM_ENOTSUP, VMM_EHOSTMEM, VMM_EDRIVER, 1);
        sync_asleep("vmm_sleep");
        for (int u = 0; u < N_TAGS; u++) {
            if (!f->used_tag[u] || was[u] == f->asleep[u])
                continue;
            if (rc != VMM_OK && rc != VMM_EDRIVER)
                die("vmm_sleep failed (%d) but tag \"%s\" changed", rc, tag_names[u]);
            if (!f->asleep[u])
                die("vmm_sleep woke tag \"%s\"", tag_names[u]);
            f->slept_mode[u] = rc == VMM_OK ? mode : VMM_SLEEP_DISCARD;
            for (int i = 0; i < f->n_live; i++)
                if (f->blk[i].tag == u && !(f->slept_mode[u] & VMM_SLEEP_BACKUP) && block_asleep(&f->blk[i]))
                    f->blk[i].known = 0;
        }
        if (rc == VMM_OK)
            for (int u = 0; u < N_TAGS; u++)
                if (f->used_tag[u] && (t == N_TAGS || t == u) && !f->asleep[u])
                    die("vmm_sleep OK but tag \"%s\" awake", tag_names[u]);
        break;
    }
    case 12: { /* wake */
        int t = (int)(u8(f) % (N_TAGS + 1));
        if (t < N_TAGS && !f->used_tag[t])
            break;
        const char *one[1] = {t < N_TAGS ? tag_names[t] : NULL};
        int was[N_TAGS];
        memcpy(was, f->asleep, sizeof was);
        if (f->capturing)
            f->unsafe = 1;
        rc = t < N_TAGS ? vmm_wake(a, one, 1) : vmm_wake(a, NULL, 0);
        allowed(rc, "vmm_wake", VMM_OK, VMM_EINVAL, VMM_ENOMEM, VMM_EDRIVER, VMM_EHOSTMEM, 1);
        sync_asleep("vmm_wake");
        for (int u = 0; u < N_TAGS; u++) {
            if (!f->used_tag[u])
                continue;
            if (rc != VMM_OK && was[u] != f->asleep[u])
                die("vmm_wake failed (%d) but tag \"%s\" changed", rc, tag_names[u]);
            if (rc == VMM_OK && (t == N_TAGS || t == u) && f->asleep[u])
                die("vmm_wake OK but tag \"%s\" asleep", tag_names[u]);
            if (was[u] && !f->asleep[u])
                for (int i = 0; i < f->n_live; i++)
                    if (f->blk[i].tag == u)
                        verify(&f->blk[i], "after a wake");
        }
        break;
    }
    case 13: { /* pool begin (not while capturing: that route is the capture's) */
        int id = 1 + (int)(u8(f) % 3);
        if (f->capturing)
            break;
        rc = vmm_pool_begin(a, (uint64_t)id, 0, pick_stream(f));
        allowed(rc, "vmm_pool_begin", VMM_OK, VMM_EINVAL, VMM_EHOSTMEM, 1);
        if (rc == VMM_EINVAL && !f->routed[id])
            die("vmm_pool_begin: EINVAL without a route to that pool");
        if (rc == VMM_OK) {
            if (f->routed[id])
                die("vmm_pool_begin: a second route to one pool accepted");
            f->routed[id] = 1;
            f->users[id]++;
        }
        break;
    }
    case 14: { /* pool end */
        int id = 1 + (int)(u8(f) % 3);
        if (f->capturing && id == 1)
            break;
        rc = vmm_pool_end(a, (uint64_t)id, 0);
        allowed(rc, "vmm_pool_end", VMM_OK, VMM_EINVAL, 1);
        if ((rc == VMM_OK) != (f->routed[id] != 0))
            die("vmm_pool_end returned %d with route %d", rc, f->routed[id]);
        f->routed[id] = 0;
        break;
    }
    case 15: { /* pool retain / release */
        int id = 1 + (int)(u8(f) % 3);
        if (u8(f) & 1) {
            rc = vmm_pool_retain(a, (uint64_t)id, 0);
            allowed(rc, "vmm_pool_retain", VMM_OK, VMM_EHOSTMEM, 1);
            f->users[id] += rc == VMM_OK;
        } else {
            if (id == 1 && f->users[1] <= f->n_graphs + f->capturing)
                break; /* the graphs' and the capture's users (PyTorch releases when a graph goes) */
            rc = vmm_pool_release(a, (uint64_t)id, 0);
            allowed(rc, "vmm_pool_release", VMM_OK, VMM_EINVAL, VMM_EDRIVER, 1);
            if ((rc == VMM_EINVAL) != (f->users[id] == 0))
                die("vmm_pool_release returned %d with %d users", rc, f->users[id]);
            if (rc != VMM_EINVAL)
                f->users[id]--;
        }
        break;
    }
    case 16: { /* capture begin / end on stream 1, with a route to pool 1 */
        if (!f->capturing) {
            if (f->routed[1] || f->n_graphs == 8)
                break;
            rc = vmm_pool_begin(a, 1, 0, f->s[1]);
            allowed(rc, "vmm_pool_begin", VMM_OK, VMM_EHOSTMEM, 1);
            if (rc)
                break;
            f->routed[1] = 1;
            f->users[1]++;
            rc = vmm_sim_capture_begin(a, f->s[1], VMM_SIM_CAPTURE_GLOBAL);
            if (rc) { /* a fault: no capture */
                allowed(rc, "vmm_sim_capture_begin", VMM_EDRIVER, 1);
                rc = vmm_pool_end(a, 1, 0);
                if (rc)
                    die("vmm_pool_end of the capture's route: %d", rc);
                f->routed[1] = 0;
                break;
            }
            f->capturing = 1;
            f->unsafe = 0;
            f->captured_writes = 0;
        } else {
            vmm_sim_graph *g = NULL;
            rc = vmm_sim_capture_end(a, f->s[1], &g);
            if (rc && !f->unsafe && !f->faults)
                die("capture invalidated by the allocator: %s", vmm_last_error());
            f->capturing = 0;
            rc = vmm_pool_end(a, 1, 0);
            if (rc)
                die("vmm_pool_end of the capture's route: %d", rc);
            f->routed[1] = 0;
            if (g && f->captured_writes) {
                f->graphs[f->n_graphs++] = g; /* keeps the capture's user of pool 1 */
            } else {
                vmm_sim_graph_destroy(g);
                rc = vmm_pool_release(a, 1, 0); /* the capture's user, as a graph destroyed */
                allowed(rc, "vmm_pool_release", VMM_OK, VMM_EDRIVER, 1);
                f->users[1]--;
            }
        }
        break;
    }
    case 17: { /* captured work writing a block of the capture's pool (recorded, not run) */
        if (!f->capturing || !f->n_live)
            break;
        live *b = &f->blk[u8(f) % f->n_live];
        if (pool_of(b) != 1 || b->size < 4)
            break;
        rc = vmm_sim_memset32(a, b->p, 0xdeadbeefu, b->size / 4 < 16 ? b->size / 4 : 16, f->s[1]);
        if (rc && !f->faults && !f->unsafe) /* (a capture the fuzzer broke refuses work) */
            die("vmm_sim_memset32 in a capture: %d", rc);
        f->captured_writes += rc == VMM_OK;
        b->known = 0; /* replays write it */
        break;
    }
    case 30: { /* replay a graph (its pool has users: its memory is still its own), or destroy it */
        if (!f->n_graphs)
            break;
        int i = (int)(u8(f) % f->n_graphs);
        if (u8(f) % 4) {
            rc = vmm_sim_graph_launch(a, f->graphs[i], f->s[2]);
            f->replayed = 1;
            if (rc && !f->faults)
                die("replay of a graph whose pool has users: %d", rc);
            /* it writes pool 1's memory: blocks there now (pools may be shared) lose their pattern */
            for (int k = 0; k < f->n_live; k++)
                if (pool_of(&f->blk[k]) == 1)
                    f->blk[k].known = 0;
        } else {
            vmm_sim_graph_destroy(f->graphs[i]);
            f->graphs[i] = f->graphs[--f->n_graphs];
            if (f->capturing)
                f->unsafe = 1; /* the last user's release synchronizes (after the route ends) */
            rc = vmm_pool_release(a, 1, 0);
            allowed(rc, "vmm_pool_release", VMM_OK, VMM_EDRIVER, 1);
            f->users[1]--;
        }
        break;
    }
    case 18: { /* pinned malloc */
        if (f->n_pin == MAX_PINNED)
            break;
        size_t size = 1 + u16(f) * (u8(f) % 8 + 1);
        void *p = NULL;
        rc = vmm_pinned_malloc(a, size, pick_stream(f), &p);
        allowed(rc, "vmm_pinned_malloc", VMM_OK, VMM_EHOSTMEM, VMM_EDRIVER, 1);
        if (rc == VMM_OK) {
            size_t us = vmm_pinned_usable_size(a, p);
            if (us < size || (us & (us - 1)) || us < 512)
                die("pinned block of %zu bytes has class %zu", size, us);
            memset(p, 0x5c, size < 256 ? size : 256);
            f->pin[f->n_pin++] = (pinned){p, size};
        }
        break;
    }
    case 19: { /* pinned free / record_stream */
        if (!f->n_pin)
            break;
        int i = (int)(u8(f) % f->n_pin);
        if (u8(f) & 1) {
            rc = vmm_pinned_record_stream(a, f->pin[i].p, pick_stream(f));
            allowed(rc, "vmm_pinned_record_stream", VMM_OK, VMM_EHOSTMEM, 1);
        } else {
            rc = vmm_pinned_free(a, f->pin[i].p);
            if (rc)
                die("vmm_pinned_free of a live block returned %d", rc);
            f->pin[i] = f->pin[--f->n_pin];
        }
        break;
    }
    case 20: /* pinned empty cache: cuMemFreeHost synchronizes */
        if (f->capturing)
            break;
        rc = vmm_pinned_empty_cache(a);
        allowed(rc, "vmm_pinned_empty_cache", VMM_OK, VMM_EDRIVER, 1);
        break;
    case 21: { /* mapping callbacks on / off */
        if (!f->cb_on) {
            rc = vmm_set_mapping_callbacks(a, after_map, before_unmap, NULL);
            allowed(rc, "vmm_set_mapping_callbacks", VMM_OK, VMM_EHOSTMEM, 1);
            f->cb_on = rc == VMM_OK;
        } else {
            rc = vmm_set_mapping_callbacks(a, NULL, NULL, NULL);
            if (rc)
                die("removing the mapping callbacks: %d", rc);
            f->cb_on = 0;
            f->n_pages = 0;
        }
        break;
    }
    case 22: { /* free-memory callback */
        rc = vmm_add_free_memory_callback(a, free_cb, f);
        allowed(rc, "vmm_add_free_memory_callback", VMM_OK, VMM_EHOSTMEM, VMM_EINVAL, 1);
        if (rc == VMM_OK && (u8(f) & 1)) {
            rc = vmm_remove_free_memory_callback(a, free_cb, f);
            if (rc)
                die("removing a free-memory callback just added: %d", rc);
        }
        break;
    }
    case 23: /* empty cache: never synchronizes */
        rc = vmm_empty_cache(a);
        allowed(rc, "vmm_empty_cache", VMM_OK, VMM_EDRIVER, 1);
        break;
    case 24: { /* history and snapshots */
        unsigned k = u8(f);
        if (k % 4 == 0) {
            rc = vmm_record_history_ex(a, f->history ? 0 : 64, (k >> 2) & 1 ? VMM_HISTORY_STACKS_NATIVE : 0);
            allowed(rc, "vmm_record_history_ex", VMM_OK, VMM_EHOSTMEM, 1);
            if (rc == VMM_OK)
                f->history = !f->history;
        } else if (k % 4 == 1) {
            char path[64];
            snprintf(path, sizeof path, "/tmp/vmm_fuzz_%d.pickle", (int)getpid());
            rc = vmm_snapshot_pickle(a, path);
            allowed(rc, "vmm_snapshot_pickle", VMM_OK, VMM_EHOSTMEM, 1);
            unlink(path);
        } else {
            vmm_trace_entry e[8];
            int64_t n = vmm_history_get(a, e, 8);
            if (n < 0)
                die("vmm_history_get: %lld", (long long)n);
        }
        break;
    }
    case 25: { /* faults on / off */
        unsigned k = u8(f);
        int kind = k % 4 == 0 ? -1 : (int)(u8(f) % VMM_SIM_CALL_COUNT);
        double p = (double)(1 + k % 16) / 128.0;
        if (f->faults) {
            faults_off(a);
            f->faults = 0;
        } else {
            if (vmm_sim_fail_random(a, kind, p, k))
                die("vmm_sim_fail_random");
            f->faults = 1;
            f->fault_kind = kind;
            f->fault_p = p;
            f->fault_seed = k;
        }
        break;
    }
    case 26: /* synchronize (not while capturing: it would invalidate by definition) */
        if (!f->capturing)
            (void)vmm_sim_synchronize(a);
        break;
    case 27: { /* stats, config, lookups */
        vmm_stats st;
        if (vmm_get_stats(a, &st))
            die("vmm_get_stats");
        if (st.allocation[VMM_POOL_ALL].current != f->n_live)
            die("%lld allocations counted, %d live", (long long)st.allocation[VMM_POOL_ALL].current, f->n_live);
        char buf[8192];
        rc = vmm_stats_json(a, buf, sizeof buf);
        if (rc <= 0 && rc != VMM_ERANGE)
            die("vmm_stats_json: %d", rc);
        vmm_pinned_stats ps;
        if (vmm_pinned_get_stats(a, &ps))
            die("vmm_pinned_get_stats");
        if (ps.allocations.current != f->n_pin)
            die("%lld pinned blocks counted, %d live", (long long)ps.allocations.current, f->n_pin);
        if (f->n_live) {
            live *b = &f->blk[u8(f) % f->n_live];
            char t[VMM_TAG_NAME_MAX + 1];
            rc = vmm_tag_of(a, b->p, t, sizeof t);
            if (rc < 0 || strcmp(t, tag_names[b->tag]))
                die("vmm_tag_of %p: %d \"%s\", expected \"%s\"", b->p, rc, rc < 0 ? "" : t, tag_names[b->tag]);
            if (vmm_usable_size(a, (char *)b->p + 1) != 0)
                die("usable size of an interior pointer");
            if (b->size > 512 && vmm_free(a, (char *)b->p + 512) != VMM_EBADPTR)
                die("vmm_free of an interior pointer did not give EBADPTR");
        }
        break;
    }
    case 28: { /* rewrite a block's pattern */
        if (!f->n_live)
            break;
        live *b = &f->blk[u8(f) % f->n_live];
        if (!block_asleep(b) && !(f->replayed && pool_of(b) == 1)) {
            b->seed = f->seed++ * 2654435761u;
            fill(b);
        }
        break;
    }
    case 29: /* reset stats */
        rc = vmm_reset_stats(a, (int)(u8(f) & 1));
        if (rc)
            die("vmm_reset_stats: %d", rc);
        break;
    default: /* more mallocs */
        break;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    memset(&F, 0, sizeof F);
    F.d = data;
    F.n = size;
    unsigned cfg = u8(&F);
    F.expandable = (cfg & 3) != 0;
    char conf[160];
    snprintf(conf, sizeof conf, "driver:sim,sim_capacity:%dM,sim_backed:true,expandable_segments:%s%s",
             (cfg >> 2 & 1) ? 48 : 96, F.expandable ? "true" : "false",
             (cfg >> 3 & 1) ? ",thread_cache:0" : "");
    if (vmm_create(conf, &F.a))
        die("vmm_create(%s)", conf);
    F.s[0] = NULL;
    for (int i = 1; i < N_STREAMS; i++)
        if (vmm_sim_stream_create(F.a, &F.s[i]))
            die("vmm_sim_stream_create");
    F.used_tag[0] = 1;
    static int trace = -1;
    if (trace < 0)
        trace = getenv("FUZZ_TRACE") != NULL;
    for (int k = 0; k < MAX_OPS && F.pos < F.n; k++) {
        if (trace)
            fprintf(stderr, "step %d: op %u at byte %zu\n", k, F.d[F.pos] % 32u, F.pos);
        step(&F);
        if (trace)
            fprintf(stderr, "  -> last error: %s\n", vmm_last_error());
        int rc = vmm_check(F.a);
        if (rc)
            die("vmm_check after step %d: %d", k, rc);
        check_mappings();
    }
    /* teardown: end the capture, free everything, destroy; faults stay on through the frees and
     * vmm_destroy when the configuration byte says so (destroy must still give everything back) */
    int faulty_end = (cfg >> 4 & 1) && F.faults;
    if (!faulty_end) {
        faults_off(F.a);
        F.faults = 0;
    }
    if (F.capturing) {
        vmm_sim_graph *g = NULL;
        if (vmm_sim_capture_end(F.a, F.s[1], &g) && !F.unsafe && !F.faults)
            die("capture invalidated by the allocator (at the end): %s", vmm_last_error());
        vmm_sim_graph_destroy(g);
    }
    for (int id = 1; id < 4; id++)
        if (F.routed[id] && vmm_pool_end(F.a, (uint64_t)id, 0))
            die("vmm_pool_end at the end");
    for (int i = 0; i < F.n_graphs; i++) { /* graphs go, and their users of pool 1 */
        vmm_sim_graph_destroy(F.graphs[i]);
        allowed(vmm_pool_release(F.a, 1, 0), "vmm_pool_release", VMM_OK, 1);
    }
    while (F.n_live)
        do_free(F.n_live - 1);
    while (F.n_pin)
        if (vmm_pinned_free(F.a, F.pin[--F.n_pin].p))
            die("vmm_pinned_free at the end");
    if (!F.faults && vmm_check(F.a))
        die("vmm_check at the end");
    check_mappings();
    faults_off(F.a); /* (a stream destroy may fail under faults: the fuzzer's own teardown) */
    for (int i = 1; i < N_STREAMS; i++)
        if (vmm_sim_stream_destroy(F.a, F.s[i]))
            die("vmm_sim_stream_destroy");
    if (faulty_end && vmm_sim_fail_random(F.a, F.fault_kind, F.fault_p, F.fault_seed))
        die("vmm_sim_fail_random");
    vmm_destroy(F.a);
    F.a = NULL;
    F.n_graphs = 0;
    if (F.cb_on && F.n_pages)
        die("%d pages reported mapped and never reported unmapped after vmm_destroy", F.n_pages);
    vmm_sim_counters c;
    vmm_sim_global_live(&c);
    if (c.phys_bytes || c.live_handles || c.mapped_bytes || c.reserved_va_bytes || c.live_classic_allocs ||
        c.live_streams || c.live_events || c.host_bytes || c.live_host_allocs)
        die("alive after vmm_destroy: phys %llu handles %llu mapped %llu va %llu classic %llu streams %llu "
            "events %llu host %llu/%llu",
            (unsigned long long)c.phys_bytes, (unsigned long long)c.live_handles,
            (unsigned long long)c.mapped_bytes, (unsigned long long)c.reserved_va_bytes,
            (unsigned long long)c.live_classic_allocs, (unsigned long long)c.live_streams,
            (unsigned long long)c.live_events, (unsigned long long)c.host_bytes,
            (unsigned long long)c.live_host_allocs);
    return 0;
}

#ifdef VMM_FUZZ_STANDALONE
/* Without libFuzzer (gcc builds): run each file named on the command line once. */
int main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        FILE *fp = fopen(argv[i], "rb");
        if (!fp) {
            perror(argv[i]);
            return 2;
        }
        static uint8_t buf[1 << 16];
        size_t n = fread(buf, 1, sizeof buf, fp);
        fclose(fp);
        LLVMFuzzerTestOneInput(buf, n);
    }
    printf("fuzz_api: %d input(s) ran clean\n", argc - 1);
    return 0;
}
#endif
