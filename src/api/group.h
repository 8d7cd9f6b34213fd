/*
 * API: fused buffers (group.c, vmm_malloc_group).
 */
#ifndef VMM_GROUP_H
#define VMM_GROUP_H

#include "core/types.h"

/* Forget the fused-buffer record of block b (vmm_free of its head; caller holds the lock). */
void vmm_group_drop(vmm_allocator *a, vmm_block *b);
/* Free the records of groups still live (vmm_destroy, before the live table goes). */
void vmm_group_destroy_all(vmm_allocator *a);
/* Members of b's group: their count, and the offset and size of member i. */
size_t vmm_group_parts(const vmm_block *b);
void vmm_group_part(const vmm_block *b, size_t i, size_t *offset, size_t *size);

#endif /* VMM_GROUP_H */
