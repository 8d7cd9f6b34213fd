/*
 * API: fused buffers (group.c, vmm_malloc_group).
 */
#ifndef VMM_GROUP_H
#define VMM_GROUP_H

#include "core/types.h"

/* Forgetting a block's record (its free) and every record (vmm_destroy, before the live table
 * goes) go through a->hooks.group_drop / group_destroy_all, which the first group sets. */
/* Members of b's group: their count, and the offset and size of member i. */
size_t vmm_group_parts(const vmm_block *b);
void vmm_group_part(const vmm_block *b, size_t i, size_t *offset, size_t *size);

#endif /* VMM_GROUP_H */
