/*
 * Fused buffers: n buffers side by side in one block. The block is an ordinary vmm_malloc block
 * (so pools, stats and frees need nothing new); a small record hung on it (vmm_block.group) keeps
 * the members' offsets and sizes for snapshots. Members other than the first are interior
 * pointers, which vmm_free already refuses.
 */
#include "api/group.h"
#include "base/errors.h"
#include "base/metadata.h"
#include "core/lock.h"
#include "core/pool.h"
#include "core/types.h"

struct vmm_group {
    size_t n;
    size_t part[][2]; /* offset, size of each member */
};

static size_t group_bytes(size_t n) { return sizeof(struct vmm_group) + n * 2 * sizeof(size_t); }

static void group_free(vmm_allocator *a, struct vmm_group *g)
{
    vmm_meta_free(a->meta, g, group_bytes(g->n));
}

static void group_drop(vmm_allocator *a, vmm_block *b);
static void group_destroy_all(vmm_allocator *a);

static int group_fail(void **ptrs, size_t n, int status, const char *what)
{
    if (ptrs)
        for (size_t i = 0; i < n; i++)
            ptrs[i] = NULL;
    return vmm_fail(status, "vmm_malloc_group: %s", what);
}

VMM_API int vmm_malloc_group(vmm_allocator *a, const size_t *sizes, size_t n, vmm_stream stream,
                             void **ptrs)
{
    if (!a || !sizes || !ptrs)
        return group_fail(ptrs, ptrs ? n : 0, VMM_EINVAL, "NULL argument");
    if (n == 0)
        return group_fail(ptrs, n, VMM_EINVAL, "no buffers (n == 0)");
    if (n > (SIZE_MAX - sizeof(struct vmm_group)) / (2 * sizeof(size_t)))
        return group_fail(ptrs, n, VMM_EINVAL, "too many buffers");
    /* Each size, and the running total plus one alignment step, stay below 2^62 (checked in that
     * order, so the subtraction cannot wrap): the sums below cannot overflow. */
    const size_t limit = (size_t)1 << 62;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (sizes[i] == 0)
            return group_fail(ptrs, n, VMM_EINVAL, "a buffer of size 0");
        if (sizes[i] >= limit - VMM_GROUP_ALIGN || total >= limit - VMM_GROUP_ALIGN - sizes[i])
            return group_fail(ptrs, n, VMM_EINVAL, "total size too large");
        total = (total + VMM_GROUP_ALIGN - 1) / VMM_GROUP_ALIGN * VMM_GROUP_ALIGN + sizes[i];
    }
    struct vmm_group *g = vmm_meta_alloc(a->meta, group_bytes(n));
    if (!g)
        return group_fail(ptrs, n, VMM_EHOSTMEM, "out of host memory for the group record");
    g->n = n;
    size_t off = 0;
    for (size_t i = 0; i < n; i++) {
        off = (off + VMM_GROUP_ALIGN - 1) / VMM_GROUP_ALIGN * VMM_GROUP_ALIGN;
        g->part[i][0] = off;
        g->part[i][1] = sizes[i];
        off += sizes[i];
    }
    void *base = NULL;
    int rc = vmm_malloc(a, total, stream, &base);
    if (rc) {
        group_free(a, g);
        for (size_t i = 0; i < n; i++)
            ptrs[i] = NULL;
        return rc; /* vmm_malloc's message (the OOM report) stays */
    }
    vmm_lock(a);
    vmm_block *b = vmm_live_find(a, (uintptr_t)base);
    int set = b && !b->group;
    if (set) {
        /* the core frees and destroys through these (a block with a group is freed under the lock) */
        a->hooks.group_drop = group_drop;
        a->hooks.group_destroy_all = group_destroy_all;
        b->group = g;
        b->grouped = 1;
        vmm_live_tc_forbid(a, b); /* freed through the allocator, which drops the group */
    }
    vmm_unlock(a);
    if (!set) {
        /* only a concurrent vmm_free of a pointer nobody else has yet could get here */
        group_free(a, g);
        return group_fail(ptrs, n, VMM_ECORRUPT, "the block vanished before its record was set");
    }
    for (size_t i = 0; i < n; i++)
        ptrs[i] = (char *)base + g->part[i][0];
    return VMM_OK;
}

static void group_drop(vmm_allocator *a, vmm_block *b)
{
    group_free(a, b->group);
    b->group = NULL;
    b->grouped = 0;
}

static void group_destroy_all(vmm_allocator *a)
{
    vmm_block *b;
    VMM_LIVE_FOREACH(a, b)
        if (b->group)
            group_drop(a, b);
}

size_t vmm_group_parts(const vmm_block *b) { return b->group ? b->group->n : 0; }

void vmm_group_part(const vmm_block *b, size_t i, size_t *offset, size_t *size)
{
    *offset = b->group->part[i][0];
    *size = b->group->part[i][1];
}
