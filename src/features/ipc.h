/*
 * Feature: IPC export and import records (ipc.c), the part of sharing blocks across processes
 * that the core consults: a free of a shared block (vmm_ipc_hold), the sleep feature (is a
 * segment shared), vmm_check and vmm_destroy. The public entry points vmm_ipc_* (api/ipc_api.c)
 * keep these records through the functions below. All of them run under the allocator's lock,
 * but vmm_ipc_counter_map / vmm_ipc_counter_unmap, which touch no allocator.
 */
#ifndef VMM_IPC_H
#define VMM_IPC_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "core/types.h"

/* An exported block: what vmm_ipc_get_handle made of it. */
typedef struct vmm_ipc_export {
    uintptr_t addr;           /* the block */
    size_t size;
    int fd;                   /* the counter's memfd */
    _Atomic int64_t *count;   /* references outstanding (shared with the other processes) */
    uint64_t id;
    int limbo;                /* freed by its owner: freed for good once count is zero */
    int releasing;            /* the collector frees it now */
} vmm_ipc_export;

/* A mapping of another process's block (vmm_ipc_open). */
typedef struct vmm_ipc_import {
    uintptr_t base;           /* reservation of the mapping */
    size_t n, page_size;
    uintptr_t ptr;            /* what vmm_ipc_open returned */
    vmm_phys *h;              /* imported handles, one per page */
    _Atomic int64_t *count;   /* the exporter's counter */
} vmm_ipc_import;

/* a->ipc: the two lists, in the allocator's metadata. */
struct vmm_ipc {
    vmm_ipc_export *ex;
    size_t n_ex, cap_ex;
    vmm_ipc_import *im;
    size_t n_im, cap_im;
    uint64_t next_id;
    int collector;            /* the collector is registered (api/ipc_api.c sets it) */
};

/* ---- for the core and the other features ---- */

/* vmm_free of block b (caller holds the lock): 0 free it as usual; 1 it was shared and a consumer
 * still has it open, so it stays allocated until they let go (limbo); VMM_EBADPTR (message set)
 * for a second free of a block in limbo. */
int vmm_ipc_hold(vmm_allocator *a, vmm_block *b);
/* vmm_check's part (caller holds the lock). */
int vmm_ipc_check(vmm_allocator *a);
/* Some block of segment s is shared and open (or about to be opened) in another process. */
int vmm_ipc_shared_in(vmm_allocator *a, const vmm_segment *s);
/* vmm_destroy (before the segments go): opened mappings closed, export records dropped. */
void vmm_ipc_destroy(vmm_allocator *a);
/* vmm_create: apply the ipc key (pages exportable or not). VMM_ECONFIG for ipc:true on a device
 * that cannot export. */
int vmm_ipc_setup(vmm_allocator *a);

/* ---- for the public entry points (api/ipc_api.c) ---- */

/* a->ipc, made on first use (the thread caches go off then: a shared block's free must reach
 * vmm_ipc_hold); NULL out of host memory. */
struct vmm_ipc *vmm_ipc_state(vmm_allocator *a);
/* The export record of the block at addr, NULL for none (I may be NULL). */
vmm_ipc_export *vmm_ipc_export_find(struct vmm_ipc *I, uintptr_t addr);
/* A new export record of block b with its counter (zero references) in a->ipc (made already):
 * VMM_OK and *out, or VMM_EHOSTMEM (message set, naming vmm_ipc_get_handle). */
int vmm_ipc_export_add(vmm_allocator *a, const vmm_block *b, vmm_ipc_export **out);
/* Forget export record r (its counter closed). */
void vmm_ipc_export_drop(vmm_allocator *a, vmm_ipc_export *r);
/* Room for one more import record in a->ipc (made if need be): 0, or -1 out of host memory. */
int vmm_ipc_import_room(vmm_allocator *a);
/* Undo an import: unmap the first `mapped` pages at base, release the first `got` handles of hs,
 * free the reservation (va_size bytes; 0 for none). */
void vmm_ipc_import_undo(vmm_allocator *a, uintptr_t base, size_t ps, vmm_phys *hs, size_t got,
                         size_t mapped, size_t va_size);
/* Close import r (no longer on the list): mapping undone, handles freed, its reference given back. */
void vmm_ipc_import_release(vmm_allocator *a, const vmm_ipc_import *r);
/* The stats' ipc_* counters from the lists. */
void vmm_ipc_stats_update(vmm_allocator *a);
/* The counter behind memfd fd, mapped shared (NULL on failure, errno set); unmap NULL is a no-op. */
_Atomic int64_t *vmm_ipc_counter_map(int fd);
void vmm_ipc_counter_unmap(_Atomic int64_t *c);

#endif /* VMM_IPC_H */
