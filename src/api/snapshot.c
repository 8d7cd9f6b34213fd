/*
 * Snapshots in PyTorch's format (torch.cuda.memory._snapshot(), pickled by _dump_snapshot), written
 * as a pickle by hand: protocol 2 needs only a dozen opcodes for dicts, lists, ints, floats,
 * strings, bools, None and a 2-tuple, plus the memo for shared frame lists.
 *
 * The allocator's state is serialized into a host buffer (the "body") under its lock. Call stacks
 * (src/history.h) are symbolized only after the lock is released: the body refers to each distinct
 * stack by a memo index (LONG_BINGET), and a "prelude" written before it in the file defines those
 * memo entries. The prelude is the value of a first "device_traces" key of the top dict, which the
 * body's own "device_traces" replaces: the loaded dict holds only PyTorch's keys, and each frame
 * list and frame dict is stored once however many blocks and events share it (PyTorch's own
 * pickler shares them the same way). Every opcode used is one that pytorch.org/memory_viz's
 * unpickler (MemoryViz.js) reads.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/group.h"
#include "base/errors.h"
#include "core/config.h"
#include "api/history.h"
#include "core/lock.h"
#include "core/tcache.h"
#include "core/types.h"
#include "features/mempool.h"

/* Pickle opcodes used (Python's Lib/pickletools.py documents each). */
enum {
    OP_PROTO = 0x80,      /* followed by the protocol number */
    PROTOCOL = 2,         /* the oldest with PROTO, NEWTRUE and TUPLE2; every Python 3 reads it */
    OP_STOP = '.',
    OP_NONE = 'N',
    OP_NEWTRUE = 0x88,
    OP_NEWFALSE = 0x89,
    OP_BININT1 = 'K',     /* 1-byte unsigned */
    OP_BININT2 = 'M',     /* 2-byte unsigned, little endian */
    OP_BININT = 'J',      /* 4-byte signed, little endian */
    OP_LONG1 = 0x8a,      /* 1-byte length, then two's complement little endian bytes */
    OP_BINFLOAT = 'G',    /* 8-byte IEEE double, big endian */
    OP_BINUNICODE = 'X',  /* 4-byte length, little endian, then UTF-8 bytes */
    OP_EMPTY_DICT = '}',
    OP_EMPTY_LIST = ']',
    OP_SETITEM = 's',     /* dict[key] = value, both popped */
    OP_APPEND = 'a',      /* list.append(value) */
    OP_TUPLE2 = 0x86,
    OP_LONG_BINPUT = 'r', /* memo[4-byte index] = top of stack */
    OP_LONG_BINGET = 'j', /* push memo[4-byte index] */
};

/* A growing output buffer; `failed` is sticky so emitters need not check each call. */
typedef struct pk {
    unsigned char *buf;
    size_t len, cap;
    int failed;
} pk;

static void pk_bytes(pk *p, const void *src, size_t n)
{
    if (p->failed)
        return;
    if (p->len + n > p->cap) {
        size_t ncap = p->cap ? p->cap : 4096;
        while (ncap < p->len + n)
            ncap *= 2;
        unsigned char *nb = realloc(p->buf, ncap);
        if (!nb) {
            p->failed = 1;
            return;
        }
        p->buf = nb;
        p->cap = ncap;
    }
    memcpy(p->buf + p->len, src, n);
    p->len += n;
}

static void pk_op(pk *p, int op)
{
    unsigned char c = (unsigned char)op;
    pk_bytes(p, &c, 1);
}

static void pk_le(pk *p, uint64_t v, unsigned n)
{
    unsigned char b[8];
    for (unsigned i = 0; i < n; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    pk_bytes(p, b, n);
}

static void pk_int(pk *p, int64_t v)
{
    if (v >= 0 && v < 0x100) {
        pk_op(p, OP_BININT1);
        pk_le(p, (uint64_t)v, 1);
    } else if (v >= 0 && v < 0x10000) {
        pk_op(p, OP_BININT2);
        pk_le(p, (uint64_t)v, 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
        pk_op(p, OP_BININT);
        pk_le(p, (uint64_t)v, 4);
    } else {
        pk_op(p, OP_LONG1);
        pk_op(p, 8);
        pk_le(p, (uint64_t)v, 8);
    }
}

/* Unsigned values (addresses, sizes) may use all 64 bits: a ninth zero byte keeps them positive. */
static void pk_uint(pk *p, uint64_t v)
{
    if (v <= INT64_MAX) {
        pk_int(p, (int64_t)v);
        return;
    }
    pk_op(p, OP_LONG1);
    pk_op(p, 9);
    pk_le(p, v, 8);
    pk_op(p, 0);
}

static void pk_float(pk *p, double d)
{
    uint64_t bits;
    memcpy(&bits, &d, sizeof bits);
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(bits >> (8 * (7 - i)));
    pk_op(p, OP_BINFLOAT);
    pk_bytes(p, b, 8);
}

static void pk_str(pk *p, const char *s)
{
    size_t n = strlen(s);
    pk_op(p, OP_BINUNICODE);
    pk_le(p, (uint64_t)n, 4);
    pk_bytes(p, s, n);
}

static void pk_bool(pk *p, int v) { pk_op(p, v ? OP_NEWTRUE : OP_NEWFALSE); }

/* Dict entries: key, value, SETITEM (the dict stays on the stack). */
static void kv_uint(pk *p, const char *k, uint64_t v)
{
    pk_str(p, k);
    pk_uint(p, v);
    pk_op(p, OP_SETITEM);
}

static void kv_str(pk *p, const char *k, const char *v)
{
    pk_str(p, k);
    pk_str(p, v);
    pk_op(p, OP_SETITEM);
}

static void kv_empty_list(pk *p, const char *k)
{
    pk_str(p, k);
    pk_op(p, OP_EMPTY_LIST);
    pk_op(p, OP_SETITEM);
}

/* ---- stack references ------------------------------------------------------------------------ */

/* One frame list of the snapshot: a stack of the history, for a fused block with its group frame
 * in front. Its memo index is its position in refs. */
typedef struct stackref {
    uint32_t id;     /* stack id (0: none) */
    uint32_t parts;  /* fused buffers of the block (0: not a fused block) */
    size_t off, n;   /* its raw frame words in refs.words */
} stackref;

typedef struct refs {
    const vmm_allocator *a;
    stackref *r;
    size_t n, cap;
    uint64_t *words;
    size_t n_words, cap_words;
    uint32_t *slots;  /* index + 1 by (id, parts) */
    size_t n_slots;
    int failed;
} refs;

static size_t ref_hash(uint32_t id, uint32_t parts, size_t cap)
{
    uint64_t x = ((uint64_t)id << 32 | parts) * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 32) & (cap - 1);
}

static int refs_grow(refs *R)
{
    size_t ns = R->n_slots ? R->n_slots * 2 : 256;
    uint32_t *s = calloc(ns, sizeof *s);
    stackref *nr = realloc(R->r, ns / 2 * sizeof *nr);
    if (!s || !nr) {
        free(s);
        if (nr)
            R->r = nr;
        return -1;
    }
    R->r = nr;
    R->cap = ns / 2;
    for (size_t i = 0; i < R->n; i++) {
        size_t j = ref_hash(R->r[i].id, R->r[i].parts, ns);
        while (s[j])
            j = (j + 1) & (ns - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(R->slots);
    R->slots = s;
    R->n_slots = ns;
    return 0;
}

/* Memo index of the frame list for (id, parts), registered (and its frames copied) when new. */
static uint32_t ref_get(refs *R, uint32_t id, uint32_t parts)
{
    if (R->n_slots) {
        for (size_t j = ref_hash(id, parts, R->n_slots);; j = (j + 1) & (R->n_slots - 1)) {
            uint32_t k = R->slots[j];
            if (!k)
                break;
            if (R->r[k - 1].id == id && R->r[k - 1].parts == parts)
                return k - 1;
        }
    }
    if (R->n + 1 > R->cap && refs_grow(R)) {
        R->failed = 1;
        return 0;
    }
    uint64_t tmp[1];
    size_t n = vmm_history_stack_words(R->a, id, tmp, 0);
    if (R->n_words + n > R->cap_words) {
        size_t nc = R->cap_words ? R->cap_words * 2 : 4096;
        while (nc < R->n_words + n)
            nc *= 2;
        uint64_t *nw = realloc(R->words, nc * sizeof *nw);
        if (!nw) {
            R->failed = 1;
            return 0;
        }
        R->words = nw;
        R->cap_words = nc;
    }
    if (n) /* no stack (a fused group's parts alone): R->words may still be NULL */
        vmm_history_stack_words(R->a, id, R->words + R->n_words, n);
    R->r[R->n] = (stackref){id, parts, R->n_words, n};
    R->n_words += n;
    size_t j = ref_hash(id, parts, R->n_slots);
    while (R->slots[j])
        j = (j + 1) & (R->n_slots - 1);
    R->slots[j] = (uint32_t)R->n + 1;
    return (uint32_t)R->n++;
}

/* A "frames" value: [] when there is nothing to show, else the shared list from the prelude. */
static void emit_frames(pk *p, refs *R, uint32_t id, uint32_t parts)
{
    pk_str(p, "frames");
    if (!id && !parts) {
        pk_op(p, OP_EMPTY_LIST);
    } else {
        pk_op(p, OP_LONG_BINGET);
        pk_le(p, ref_get(R, id, parts), 4);
    }
    pk_op(p, OP_SETITEM);
}

/* ---- segments ------------------------------------------------------------------------------ */

static const char *block_state_name(int state)
{
    switch (state) {
    case VMM_BLOCK_ALLOCATED:
        return "active_allocated";
    case VMM_BLOCK_PENDING:
        return "active_pending_free";
    default:
        return "inactive";
    }
}

static void emit_block(pk *p, refs *R, const vmm_allocator *a, const vmm_block *b)
{
    pk_op(p, OP_EMPTY_DICT);
    kv_uint(p, "address", b->addr);
    kv_uint(p, "size", b->size);
    /* a pending block keeps what was asked for: PyTorch's viewer draws the rest as rounding */
    kv_uint(p, "requested_size", b->state == VMM_BLOCK_FREE ? 0 : b->requested);
    kv_str(p, "state", block_state_name(b->state));
    int active = b->state == VMM_BLOCK_ALLOCATED || b->state == VMM_BLOCK_PENDING;
    uint32_t id = active ? vmm_history_block_stack(a, b->addr) : 0;
    size_t n = b->state == VMM_BLOCK_ALLOCATED ? vmm_group_parts(b) : 0;
    /* memory_viz shows frames, not extra keys: a fused block names its group in its first frame */
    emit_frames(p, R, id, (uint32_t)n);
    if (n) {
        pk_str(p, "parts");
        pk_op(p, OP_EMPTY_LIST);
        for (size_t i = 0; i < n; i++) {
            size_t off, size;
            vmm_group_part(b, i, &off, &size);
            pk_op(p, OP_EMPTY_DICT);
            kv_uint(p, "offset", off);
            kv_uint(p, "size", size);
            pk_op(p, OP_APPEND);
        }
        pk_op(p, OP_SETITEM);
    }
    pk_op(p, OP_APPEND);
}

/* One segment dict for blocks [first, end) (end NULL: to the segment's end). */
static void emit_segment(pk *p, refs *R, const vmm_allocator *a, const vmm_segment *s,
                         const vmm_block *first, const vmm_block *end)
{
    uint64_t total = 0, allocated = 0, active = 0, requested = 0;
    for (const vmm_block *b = first; b != end; b = b->next) {
        total += b->size;
        if (b->state == VMM_BLOCK_ALLOCATED)
            allocated += b->size;
        if (b->state == VMM_BLOCK_ALLOCATED || b->state == VMM_BLOCK_PENDING) {
            active += b->size;
            requested += b->requested;
        }
    }
    pk_op(p, OP_EMPTY_DICT);
    kv_uint(p, "device", (uint64_t)(a->dev.ordinal > 0 ? a->dev.ordinal : 0));
    kv_uint(p, "address", first->addr);
    kv_uint(p, "total_size", total);
    kv_uint(p, "allocated_size", allocated);
    kv_uint(p, "active_size", active);
    kv_uint(p, "requested_size", requested);
    kv_uint(p, "stream", (uintptr_t)s->stream);
    kv_str(p, "segment_type", s->pool == VMM_SMALL ? "small" : "large");
    pk_str(p, "segment_pool_id");
    uint64_t pool_id[2];
    vmm_mempool_id_of(s, pool_id); /* private pool (CUDA graphs, mempool.c); (0, 0): the default pools */
    pk_uint(p, pool_id[0]);
    pk_uint(p, pool_id[1]);
    pk_op(p, OP_TUPLE2);
    pk_op(p, OP_SETITEM);
    pk_str(p, "is_expandable");
    pk_bool(p, s->expandable);
    pk_op(p, OP_SETITEM);
    /* where the range was mapped (expandable) or the segment allocated (classic) */
    emit_frames(p, R, vmm_history_segment_stack(a, first->addr), 0);
    pk_str(p, "blocks");
    pk_op(p, OP_EMPTY_LIST);
    for (const vmm_block *b = first; b != end; b = b->next)
        emit_block(p, R, a, b);
    pk_op(p, OP_SETITEM);
    pk_op(p, OP_APPEND);
}

static int seg_by_base(const void *x, const void *y)
{
    uintptr_t a = (*(vmm_segment *const *)x)->base, b = (*(vmm_segment *const *)y)->base;
    return (a > b) - (a < b);
}

/* PyTorch reports each mapped range of an expandable segment as a segment of its own: unmapped
 * blocks are page aligned, so the runs between them are whole mapped pages. */
static void emit_segments(pk *p, refs *R, const vmm_allocator *a, vmm_segment **sorted)
{
    pk_str(p, "segments");
    pk_op(p, OP_EMPTY_LIST);
    for (size_t i = 0; i < a->n_segs; i++) {
        const vmm_segment *s = sorted[i];
        if (!s->expandable) {
            emit_segment(p, R, a, s, s->first, NULL);
            continue;
        }
        const vmm_block *b = s->first;
        while (b) {
            /* a growth in flight's MAPPING block is not mapped yet (segment.c) */
            /* nor are the bytes an aliased page's other view owns (alias.c): each byte of
             * device memory is in one segment */
            while (b && (b->state == VMM_BLOCK_UNMAPPED || b->state == VMM_BLOCK_MAPPING ||
                         b->state == VMM_BLOCK_SHADOW))
                b = b->next;
            if (!b)
                break;
            const vmm_block *e = b;
            while (e && e->state != VMM_BLOCK_UNMAPPED && e->state != VMM_BLOCK_MAPPING &&
                   e->state != VMM_BLOCK_SHADOW)
                e = e->next;
            emit_segment(p, R, a, s, b, e);
            b = e;
        }
    }
    pk_op(p, OP_SETITEM);
}

/* ---- traces and settings ------------------------------------------------------------------- */

static void emit_traces(pk *p, refs *R, const vmm_allocator *a, const vmm_trace_entry *e,
                        const uint32_t *ids, size_t n)
{
    int dev = a->dev.ordinal > 0 ? a->dev.ordinal : 0;
    pk_str(p, "device_traces");
    pk_op(p, OP_EMPTY_LIST);
    for (int d = 0; d <= dev; d++) {
        pk_op(p, OP_EMPTY_LIST);
        for (size_t i = 0; d == dev && i < n; i++) {
            pk_op(p, OP_EMPTY_DICT);
            kv_str(p, "action", vmm_trace_action_name(e[i].action));
            kv_uint(p, "addr", e[i].addr);
            kv_uint(p, "size", e[i].size);
            kv_uint(p, "stream", (uintptr_t)e[i].stream);
            kv_uint(p, "time_us", e[i].time_us);
            if (e[i].action == VMM_TRACE_OOM) /* the viewers read it */
                kv_uint(p, "device_free", e[i].addr);
            /* PyTorch's trace entries carry these two strings (torch.compile's context and
             * _set_memory_metadata's text); vmmalloc has neither, so they are empty */
            kv_str(p, "compile_context", "");
            kv_str(p, "user_metadata", "");
            emit_frames(p, R, ids ? ids[i] : 0, 0);
            pk_op(p, OP_APPEND);
        }
        pk_op(p, OP_APPEND);
    }
    pk_op(p, OP_SETITEM);
}

enum { CONF_TEXT_MAX = 4096 }; /* every key with a long value list fits in well under this */

static void emit_settings(pk *p, const vmm_allocator *a)
{
    char conf[CONF_TEXT_MAX];
    if (vmm_config_format(&a->cfg, conf, sizeof conf) < 0)
        conf[0] = '\0';
    pk_str(p, "allocator_settings");
    pk_op(p, OP_EMPTY_DICT);
    kv_str(p, "allocator", "vmmalloc");
    kv_str(p, "PYTORCH_CUDA_ALLOC_CONF", conf);
    pk_str(p, "expandable_segments");
    pk_bool(p, a->cfg.expandable_segments);
    pk_op(p, OP_SETITEM);
    pk_str(p, "max_split_size");
    pk_int(p, a->stats.max_split_size);
    pk_op(p, OP_SETITEM);
    pk_str(p, "garbage_collection_threshold");
    pk_float(p, a->cfg.garbage_collection_threshold);
    pk_op(p, OP_SETITEM);
    /* as PyTorch: divisions per power-of-two interval, keyed "1", "2", "4", ... (MiB) */
    pk_str(p, "roundup_power2_divisions");
    pk_op(p, OP_EMPTY_DICT);
    for (int i = 0; i < VMM_POW2_INTERVALS; i++) {
        char key[24];
        snprintf(key, sizeof key, "%llu", 1ull << i);
        kv_uint(p, key, a->cfg.pow2_divisions[i]);
    }
    pk_op(p, OP_SETITEM);
    pk_op(p, OP_SETITEM);
}

/* Serialize the state into the body (dict items only); caller holds the lock. */
static int snapshot_body(vmm_allocator *a, pk *p, refs *R)
{
    vmm_segment **sorted = NULL;
    if (a->n_segs) {
        sorted = malloc(a->n_segs * sizeof *sorted);
        if (!sorted)
            return VMM_EHOSTMEM;
        size_t i = 0;
        for (vmm_segment *s = a->segs; s; s = s->next)
            sorted[i++] = s;
        qsort(sorted, a->n_segs, sizeof *sorted, seg_by_base);
    }
    vmm_trace_entry *tr = NULL;
    uint32_t *ids = NULL;
    size_t ntr = 0;
    if (vmm_history_copy_ex(a, &tr, &ids, &ntr)) {
        free(sorted);
        return VMM_EHOSTMEM;
    }
    emit_segments(p, R, a, sorted);
    emit_traces(p, R, a, tr, ids, ntr);
    emit_settings(p, a);
    kv_empty_list(p, "external_annotations");
    free(sorted);
    free(tr);
    free(ids);
    return p->failed || R->failed ? VMM_EHOSTMEM : VMM_OK;
}

/* ---- the prelude: every frame list the body refers to ---------------------------------------- */

typedef struct frame_memo {
    vmm_frame *f;      /* open addressing by (filename, name, line); filename NULL when empty */
    uint32_t *idx;     /* memo index of each */
    size_t cap, n;
} frame_memo;

static size_t frame_hash(const vmm_frame *f, size_t cap)
{
    uint64_t x = ((uint64_t)(uintptr_t)f->filename * 31 + (uint64_t)(uintptr_t)f->name) * 31 +
                 (uint64_t)f->line;
    x *= 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 32) & (cap - 1);
}

/* Memo slot of frame f: its index when emitted before (*found = 1), else a free slot. */
static long frame_slot(frame_memo *m, const vmm_frame *f, int *found)
{
    if ((m->n + 1) * 2 > m->cap) {
        size_t nc = m->cap ? m->cap * 2 : 1024;
        vmm_frame *nf = calloc(nc, sizeof *nf);
        uint32_t *ni = calloc(nc, sizeof *ni);
        if (!nf || !ni) {
            free(nf);
            free(ni);
            return -1;
        }
        for (size_t i = 0; i < m->cap; i++) {
            if (!m->f[i].filename)
                continue;
            size_t j = frame_hash(&m->f[i], nc);
            while (nf[j].filename)
                j = (j + 1) & (nc - 1);
            nf[j] = m->f[i];
            ni[j] = m->idx[i];
        }
        free(m->f);
        free(m->idx);
        m->f = nf;
        m->idx = ni;
        m->cap = nc;
    }
    size_t j = frame_hash(f, m->cap);
    for (; m->f[j].filename; j = (j + 1) & (m->cap - 1)) {
        /* strings are interned: equal pointers are equal strings */
        if (m->f[j].filename == f->filename && m->f[j].name == f->name && m->f[j].line == f->line) {
            *found = 1;
            return (long)j;
        }
    }
    *found = 0;
    return (long)j;
}

static void emit_frame_dict(pk *p, const char *filename, int64_t line, const char *name)
{
    pk_op(p, OP_EMPTY_DICT);
    kv_str(p, "filename", filename);
    pk_str(p, "line");
    pk_int(p, line);
    pk_op(p, OP_SETITEM);
    kv_str(p, "name", name);
}

enum { FRAMES_MAX = 256 };

static int snapshot_prelude(pk *p, const refs *R)
{
    if (!R->n)
        return VMM_OK;
    vmm_symcache *sc = vmm_symcache_new();
    if (!sc)
        return VMM_EHOSTMEM;
    frame_memo m = {0};
    uint32_t next_memo = (uint32_t)R->n; /* frame dicts come after the lists */
    int rc = VMM_OK;
    vmm_frame fr[FRAMES_MAX];
    pk_str(p, "device_traces"); /* replaced by the body's own */
    pk_op(p, OP_EMPTY_LIST);
    for (size_t i = 0; i < R->n && rc == VMM_OK; i++) {
        const stackref *r = &R->r[i];
        pk_op(p, OP_EMPTY_LIST);
        if (r->parts) {
            char name[96];
            snprintf(name, sizeof name, "vmm_malloc_group: %u fused buffers", r->parts);
            emit_frame_dict(p, "vmmalloc", 0, name);
            pk_op(p, OP_APPEND);
        }
        long nf = r->n ? vmm_symbolize(sc, R->words + r->off, r->n, fr, FRAMES_MAX) : 0;
        if (nf < 0) {
            rc = VMM_EHOSTMEM;
            break;
        }
        for (long k = 0; k < nf; k++) {
            int found;
            long slot = frame_slot(&m, &fr[k], &found);
            if (slot < 0) {
                rc = VMM_EHOSTMEM;
                break;
            }
            if (found) {
                pk_op(p, OP_LONG_BINGET);
                pk_le(p, m.idx[slot], 4);
            } else {
                emit_frame_dict(p, fr[k].filename, fr[k].line, fr[k].name);
                pk_op(p, OP_LONG_BINPUT);
                pk_le(p, next_memo, 4);
                m.f[slot] = fr[k];
                m.idx[slot] = next_memo++;
                m.n++;
            }
            pk_op(p, OP_APPEND);
        }
        pk_op(p, OP_LONG_BINPUT);
        pk_le(p, (uint64_t)i, 4);
        pk_op(p, OP_APPEND);
    }
    pk_op(p, OP_SETITEM);
    free(m.f);
    free(m.idx);
    vmm_symcache_free(sc);
    if (rc == VMM_OK && p->failed)
        rc = VMM_EHOSTMEM;
    return rc;
}

VMM_API int vmm_snapshot_pickle(vmm_allocator *a, const char *path)
{
    if (!a || !path)
        return vmm_fail(VMM_EINVAL, "vmm_snapshot_pickle: %s is NULL", a ? "path" : "allocator");
    pk body = {0}, pre = {0};
    refs R = {.a = a};
    vmm_lock(a);
    int tc = vmm_tc_pause(a); /* cached blocks show as the free blocks they are */
    int rc = snapshot_body(a, &body, &R);
    vmm_tc_resume(a, tc);
    vmm_unlock(a);
    if (!rc) {
        pk_op(&pre, OP_PROTO);
        pk_op(&pre, PROTOCOL);
        pk_op(&pre, OP_EMPTY_DICT);
        rc = snapshot_prelude(&pre, &R);
        pk_op(&body, OP_STOP);
        if (!rc && (pre.failed || body.failed))
            rc = VMM_EHOSTMEM;
    }
    free(R.r);
    free(R.words);
    free(R.slots);
    if (rc) {
        free(body.buf);
        free(pre.buf);
        return vmm_fail(rc, "vmm_snapshot_pickle: out of host memory");
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        int err = errno;
        free(body.buf);
        free(pre.buf);
        return vmm_fail(VMM_EINVAL, "vmm_snapshot_pickle: cannot write %s: %s", path, strerror(err));
    }
    int bad = fwrite(pre.buf, 1, pre.len, f) != pre.len;
    bad |= fwrite(body.buf, 1, body.len, f) != body.len;
    bad |= fclose(f) != 0;
    free(body.buf);
    free(pre.buf);
    if (bad)
        return vmm_fail(VMM_EINVAL, "vmm_snapshot_pickle: error writing %s", path);
    return VMM_OK;
}
