/*
 * Core: what the allocator may do while streams capture CUDA graphs (capture.c).
 */
#ifndef VMM_CAPTURE_H
#define VMM_CAPTURE_H

#include "core/types.h"

/* Put the calling thread in relaxed capture mode for the allocator's driver calls (PyTorch's
 * CUDAStreamCaptureModeGuard): returns the mode to give back to vmm_capture_restore, -1 when the
 * driver has no modes. Cheap (thread-local in the driver). */
int vmm_capture_relax(vmm_allocator *a);
void vmm_capture_restore(vmm_allocator *a, int prev);
/* 1 when stream s takes part in a capture now (the driver says so); *id (may be NULL) its id. */
int vmm_capture_stream(vmm_allocator *a, vmm_stream s, uint64_t *id);
/* The allocator must not wait, synchronize or free with an implied synchronization now: routes are
 * in force (captures underway) or stream s captures. Sets no error. */
int vmm_capture_no_sync(vmm_allocator *a, vmm_stream s);
/* Words for an OOM report saying why nothing was waited for (after no_sync), into buf. */
void vmm_capture_oom_note(vmm_allocator *a, vmm_stream s, char *buf, size_t len);
/* record_stream of live block b on stream s, which captures (capture id): remembered, so that the
 * use is dropped rather than waited for once that capture has ended (its work runs in replays). */
int vmm_capture_use_add(vmm_allocator *a, vmm_block *b, vmm_stream s, uint64_t id);
/* What an unrecorded use slot of pending block b on stream s may do now. */
enum { VMM_USE_RECORD = 0, VMM_USE_WAIT = 1, VMM_USE_DROP = 2 };
int vmm_capture_use_check(vmm_allocator *a, const vmm_block *b, vmm_stream s);
/* record_stream of b on s while s does not capture: the use is eager (waited for) from now on. */
void vmm_capture_use_eager(vmm_allocator *a, const vmm_block *b, vmm_stream s);
/* Uses remembered (vmm_check, tests). */
size_t vmm_capture_uses(const vmm_allocator *a);
/* Forget what was remembered for block b (its free completed) or for stream s (destroyed). */
void vmm_capture_forget_block(vmm_allocator *a, const vmm_block *b);
void vmm_capture_forget_stream(vmm_allocator *a, vmm_stream s);
void vmm_capture_destroy(vmm_allocator *a);

#endif /* VMM_CAPTURE_H */
