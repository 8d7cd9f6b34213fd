/*
 * Feature: IPC export records and imports (ipc.c).
 */
#ifndef VMM_IPC_H
#define VMM_IPC_H

#include "core/types.h"

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

#endif /* VMM_IPC_H */
