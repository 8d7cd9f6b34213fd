/*
 * Feature: tags, tagged lanes, sleep / wake (sleep.c).
 */
#ifndef VMM_SLEEP_H
#define VMM_SLEEP_H

#include "core/types.h"

/* The stream record serving allocations of (stream, tag): tag 0 is vmm_stream_rec_get's; others
 * are made on first use. VMM_EINVAL (message set) while the tag sleeps, VMM_ENOTSUP without
 * VMM support, VMM_EHOSTMEM. */
int vmm_lane_get(vmm_allocator *a, vmm_stream s, int tag, vmm_stream_rec **out);
/* vmm_free of a block in a segment frozen or asleep (its slot in the live table given): no
 * events, nothing to unmap; its backup goes. Never fails. */
void vmm_sleep_free(vmm_allocator *a, vmm_block *b, size_t slot);
/* vmm_check's part: lanes, sleeping bytes, backups (caller holds the lock). */
int vmm_sleep_check(vmm_allocator *a);
/* vmm_destroy: backups freed (host memory), tag table freed. */
void vmm_sleep_destroy(vmm_allocator *a);
/* 1 when tag t is asleep or going to sleep (caller holds the lock). */
int vmm_sleep_tag_asleep(const vmm_allocator *a, int t);

#endif /* VMM_SLEEP_H */
