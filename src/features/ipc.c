/*
 * Sharing blocks across processes: the export and import records (the public entry points that
 * make and use them are api/ipc_api.c, whose header comment tells the whole mechanism).
 *
 * An export record is a block that vmm_ipc_get_handle exported, with its reference counter (a
 * small memfd shared between the processes). vmm_free of an exported block whose counter is not
 * zero leaves the block allocated, in limbo (vmm_ipc_hold); the collector frees it once the
 * counter came down to zero. Exports whose counter is zero are forgotten when their block is
 * freed. An import record is another process's block mapped here (vmm_ipc_open), until
 * vmm_ipc_close or vmm_destroy.
 *
 * Locking: the export and import lists are under the allocator's lock.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "core/pool.h"
#include "core/tcache.h"
#include "core/types.h"
#include "driver/driver.h"
#include "features/ipc.h"

enum { COUNTER_BYTES = 4096 }; /* the counter's memfd: one page */

typedef struct vmm_ipc ipc_state;

ipc_state *vmm_ipc_state(vmm_allocator *a)
{
    if (!a->ipc) {
        vmm_tc_off(a); /* a shared block's free must reach vmm_ipc_hold */
        a->ipc = vmm_meta_alloc(a->meta, sizeof(ipc_state));
    }
    return a->ipc;
}

static int grow(vmm_meta *m, void **v, size_t *cap, size_t n, size_t elem)
{
    if (n < *cap)
        return 0;
    size_t ncap = *cap ? 2 * *cap : 8;
    void *x = vmm_meta_alloc(m, ncap * elem);
    if (!x)
        return -1;
    if (n)
        memcpy(x, *v, n * elem);
    if (*v)
        vmm_meta_free(m, *v, *cap * elem);
    *v = x;
    *cap = ncap;
    return 0;
}

_Atomic int64_t *vmm_ipc_counter_map(int fd)
{
    void *p = mmap(NULL, COUNTER_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    return p == MAP_FAILED ? NULL : (_Atomic int64_t *)p;
}

void vmm_ipc_counter_unmap(_Atomic int64_t *c)
{
    if (c)
        munmap((void *)c, COUNTER_BYTES);
}

void vmm_ipc_stats_update(vmm_allocator *a)
{
    ipc_state *I = a->ipc;
    int64_t ex = 0, limbo = 0;
    for (size_t i = 0; I && i < I->n_ex; i++) {
        if (I->ex[i].limbo)
            limbo++;
        else
            ex++;
    }
    a->stats.ipc_exported_blocks = ex;
    a->stats.ipc_limbo_blocks = limbo;
    a->stats.ipc_open_mappings = I ? (int64_t)I->n_im : 0;
}

vmm_ipc_export *vmm_ipc_export_find(ipc_state *I, uintptr_t addr)
{
    for (size_t i = 0; I && i < I->n_ex; i++)
        if (I->ex[i].addr == addr)
            return &I->ex[i];
    return NULL;
}

void vmm_ipc_export_drop(vmm_allocator *a, vmm_ipc_export *r)
{
    ipc_state *I = a->ipc;
    vmm_ipc_counter_unmap(r->count);
    close(r->fd);
    *r = I->ex[--I->n_ex];
    vmm_ipc_stats_update(a);
}

int vmm_ipc_export_add(vmm_allocator *a, const vmm_block *b, vmm_ipc_export **out)
{
    ipc_state *I = a->ipc;
    if (grow(a->meta, (void **)&I->ex, &I->cap_ex, I->n_ex, sizeof *I->ex))
        return vmm_fail(VMM_EHOSTMEM, "vmm_ipc_get_handle: out of host memory");
    int fd = memfd_create("vmmalloc-ipc-refs", MFD_CLOEXEC);
    _Atomic int64_t *c = NULL;
    if (fd < 0 || ftruncate(fd, COUNTER_BYTES) != 0 || !(c = vmm_ipc_counter_map(fd))) {
        int rc = vmm_fail(VMM_EHOSTMEM, "vmm_ipc_get_handle: no shared memory for the reference "
                                        "counter: %s", strerror(errno));
        if (fd >= 0)
            close(fd);
        return rc;
    }
    vmm_ipc_export *rec = &I->ex[I->n_ex++];
    *rec = (vmm_ipc_export){b->addr, b->size, fd, c, ++I->next_id, 0, 0};
    *out = rec;
    return VMM_OK;
}

int vmm_ipc_import_room(vmm_allocator *a)
{
    ipc_state *I = vmm_ipc_state(a);
    return !I || grow(a->meta, (void **)&I->im, &I->cap_im, I->n_im, sizeof *I->im) ? -1 : 0;
}

void vmm_ipc_import_undo(vmm_allocator *a, uintptr_t base, size_t ps, vmm_phys *hs, size_t got,
                         size_t mapped, size_t va_size)
{
    const vmm_driver_ops *ops = a->drv->ops;
    for (size_t k = 0; k < mapped; k++)
        ops->mem_unmap(a->drv, base + k * ps, ps);
    for (size_t k = 0; k < got; k++)
        ops->mem_release(a->drv, hs[k]);
    if (va_size)
        ops->va_free(a->drv, base, va_size);
}

void vmm_ipc_import_release(vmm_allocator *a, const vmm_ipc_import *r)
{
    vmm_ipc_import_undo(a, r->base, r->page_size, r->h, r->n, r->n, r->n * r->page_size);
    vmm_meta_free(a->meta, r->h, r->n * sizeof *r->h);
    atomic_fetch_sub(r->count, 1);
    vmm_ipc_counter_unmap(r->count);
}

/* ---- setup ---------------------------------------------------------------------------------- */

int vmm_ipc_setup(vmm_allocator *a)
{
    int want = a->cfg.ipc;
    if (want < 0)
        return VMM_OK; /* auto: as the driver creates pages by default */
    const vmm_driver_ops *ops = a->drv->ops;
    if (!ops->set_exportable)
        return want ? vmm_fail(VMM_ECONFIG, "ipc:true: the %s driver cannot export memory", ops->name)
                    : VMM_OK;
    int r = ops->set_exportable(a->drv, want);
    if (r == VMM_DRV_NOT_SUPPORTED)
        return vmm_fail(VMM_ECONFIG, "ipc:true: device %d (%s) cannot export pages as POSIX file "
                                     "descriptors%s", a->dev.ordinal, a->dev.name,
                        a->drv->is_sim ? " (the simulated device needs sim_backed:true)"
                                       : " (HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED is 0)");
    if (r)
        return vmm_fail_drv(r, "vmm_create: set_exportable");
    r = ops->device_info(a->drv, &a->dev);
    return r ? vmm_fail_drv(r, "vmm_create: device_info") : VMM_OK;
}

/* ---- what the core consults ------------------------------------------------------------------ */

int vmm_ipc_hold(vmm_allocator *a, vmm_block *b)
{
    vmm_ipc_export *r = vmm_ipc_export_find(a->ipc, b->addr);
    if (!r)
        return 0;
    if (r->limbo && !r->releasing)
        return vmm_fail(VMM_EBADPTR, "vmm_free: %p was already freed (it waits, shared, until the "
                                     "other processes let go)", (void *)b->addr);
    if (r->releasing || atomic_load(r->count) <= 0) {
        vmm_ipc_export_drop(a, r);
        return 0;
    }
    r->limbo = 1;
    vmm_ipc_stats_update(a);
    return 1;
}

int vmm_ipc_shared_in(vmm_allocator *a, const vmm_segment *s)
{
    ipc_state *I = a->ipc;
    for (size_t i = 0; I && i < I->n_ex; i++)
        if (I->ex[i].addr >= s->base && I->ex[i].addr - s->base < s->size &&
            (I->ex[i].limbo || atomic_load(I->ex[i].count) > 0))
            return 1;
    return 0;
}

/* ---- check and teardown ---------------------------------------------------------------------- */

int vmm_ipc_check(vmm_allocator *a)
{
    ipc_state *I = a->ipc;
    int64_t ex = 0, limbo = 0;
    for (size_t i = 0; I && i < I->n_ex; i++) {
        vmm_block *b = vmm_live_find(a, I->ex[i].addr);
        if (!b || b->size != I->ex[i].size)
            return vmm_fail(VMM_ECORRUPT, "vmm_check: exported block at 0x%llx is not live",
                            (unsigned long long)I->ex[i].addr);
        if (I->ex[i].limbo)
            limbo++;
        else
            ex++;
    }
    if (ex != a->stats.ipc_exported_blocks || limbo != a->stats.ipc_limbo_blocks ||
        (I ? (int64_t)I->n_im : 0) != a->stats.ipc_open_mappings)
        return vmm_fail(VMM_ECORRUPT, "vmm_check: IPC stats differ from the export and import lists");
    return VMM_OK;
}

void vmm_ipc_destroy(vmm_allocator *a)
{
    ipc_state *I = a->ipc;
    if (!I)
        return;
    int limbo = 0;
    for (size_t i = 0; i < I->n_ex; i++)
        limbo |= I->ex[i].limbo;
    if (limbo)
        fprintf(stderr, "vmmalloc: vmm_destroy: blocks shared with other processes are returned while "
                        "they may still have them open\n");
    while (I->n_im) {
        vmm_ipc_import r = I->im[--I->n_im];
        vmm_ipc_import_release(a, &r);
    }
    while (I->n_ex)
        vmm_ipc_export_drop(a, &I->ex[I->n_ex - 1]);
    if (I->ex)
        vmm_meta_free(a->meta, I->ex, I->cap_ex * sizeof *I->ex);
    if (I->im)
        vmm_meta_free(a->meta, I->im, I->cap_im * sizeof *I->im);
    vmm_meta_free(a->meta, I, sizeof *I);
    a->ipc = NULL;
    vmm_ipc_stats_update(a);
}
