/*
 * Feature: pinned host memory (pinned.c).
 */
#ifndef VMM_PINNED_H
#define VMM_PINNED_H

#include "core/types.h"

/* Wait for pending pinned frees, return every pinned block and event to the driver, free the
 * state; called by vmm_destroy before the driver closes. No-op when pinned memory was never used. */
void vmm_pinned_destroy(vmm_allocator *a);

#endif /* VMM_PINNED_H */
