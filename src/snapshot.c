/*
 * Snapshots in PyTorch's format (torch.cuda.memory._snapshot(), pickled by _dump_snapshot), written
 * as a pickle by hand: protocol 2 needs only a dozen opcodes for dicts, lists, ints, floats,
 * strings, bools, None and a 2-tuple, and no memo. The state is serialized into a host buffer under
 * the allocator's lock and written to the file after it is released.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

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

static void emit_block(pk *p, const vmm_block *b)
{
    pk_op(p, OP_EMPTY_DICT);
    kv_uint(p, "address", b->addr);
    kv_uint(p, "size", b->size);
    kv_uint(p, "requested_size", b->state == VMM_BLOCK_FREE ? 0 : b->requested);
    kv_str(p, "state", block_state_name(b->state));
    size_t n = b->state == VMM_BLOCK_ALLOCATED ? vmm_group_parts(b) : 0;
    if (!n) {
        kv_empty_list(p, "frames");
    } else {
        /* memory_viz shows frames, not extra keys: name the group there too */
        char name[96];
        snprintf(name, sizeof name, "vmm_malloc_group: %zu fused buffers", n);
        pk_str(p, "frames");
        pk_op(p, OP_EMPTY_LIST);
        pk_op(p, OP_EMPTY_DICT);
        kv_str(p, "filename", "vmmalloc");
        kv_uint(p, "line", 0);
        kv_str(p, "name", name);
        pk_op(p, OP_APPEND);
        pk_op(p, OP_SETITEM);
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
static void emit_segment(pk *p, const vmm_allocator *a, const vmm_segment *s, const vmm_block *first,
                         const vmm_block *end)
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
    pk_int(p, 0);
    pk_int(p, 0);
    pk_op(p, OP_TUPLE2);
    pk_op(p, OP_SETITEM);
    pk_str(p, "is_expandable");
    pk_bool(p, s->expandable);
    pk_op(p, OP_SETITEM);
    kv_empty_list(p, "frames");
    pk_str(p, "blocks");
    pk_op(p, OP_EMPTY_LIST);
    for (const vmm_block *b = first; b != end; b = b->next)
        emit_block(p, b);
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
static void emit_segments(pk *p, const vmm_allocator *a, vmm_segment **sorted)
{
    pk_str(p, "segments");
    pk_op(p, OP_EMPTY_LIST);
    for (size_t i = 0; i < a->n_segs; i++) {
        const vmm_segment *s = sorted[i];
        if (!s->expandable) {
            emit_segment(p, a, s, s->first, NULL);
            continue;
        }
        const vmm_block *b = s->first;
        while (b) {
            while (b && b->state == VMM_BLOCK_UNMAPPED)
                b = b->next;
            if (!b)
                break;
            const vmm_block *e = b;
            while (e && e->state != VMM_BLOCK_UNMAPPED)
                e = e->next;
            emit_segment(p, a, s, b, e);
            b = e;
        }
    }
    pk_op(p, OP_SETITEM);
}

/* ---- traces and settings ------------------------------------------------------------------- */

static void emit_traces(pk *p, const vmm_allocator *a, const vmm_trace_entry *e, size_t n)
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
            if (e[i].action == VMM_TRACE_OOM) /* torch.cuda._memory_viz.trace reads it */
                kv_uint(p, "device_free", e[i].addr);
            kv_empty_list(p, "frames");
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
    pk_op(p, OP_SETITEM);
}

/* Serialize the whole snapshot; caller holds the lock. */
static int snapshot_build(vmm_allocator *a, pk *p)
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
    size_t ntr = 0;
    if (vmm_history_copy(a, &tr, &ntr)) {
        free(sorted);
        return VMM_EHOSTMEM;
    }
    pk_op(p, OP_PROTO);
    pk_op(p, PROTOCOL);
    pk_op(p, OP_EMPTY_DICT);
    emit_segments(p, a, sorted);
    emit_traces(p, a, tr, ntr);
    emit_settings(p, a);
    kv_empty_list(p, "external_annotations");
    pk_op(p, OP_STOP);
    free(sorted);
    if (tr)
        vmm_meta_free(a->meta, tr, ntr * sizeof *tr);
    return p->failed ? VMM_EHOSTMEM : VMM_OK;
}

VMM_API int vmm_snapshot_pickle(vmm_allocator *a, const char *path)
{
    if (!a || !path)
        return vmm_fail(VMM_EINVAL, "vmm_snapshot_pickle: %s is NULL", a ? "path" : "allocator");
    pk p = {0};
    vmm_lock(a);
    int rc = snapshot_build(a, &p);
    vmm_unlock(a);
    if (rc) {
        free(p.buf);
        return vmm_fail(rc, "vmm_snapshot_pickle: out of host memory");
    }
    FILE *f = fopen(path, "wb");
    if (!f) {
        int err = errno;
        free(p.buf);
        return vmm_fail(VMM_EINVAL, "vmm_snapshot_pickle: cannot write %s: %s", path, strerror(err));
    }
    int bad = fwrite(p.buf, 1, p.len, f) != p.len;
    bad |= fclose(f) != 0;
    free(p.buf);
    if (bad)
        return vmm_fail(VMM_EINVAL, "vmm_snapshot_pickle: error writing %s", path);
    return VMM_OK;
}
