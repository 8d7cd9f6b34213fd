/*
 * Call stacks of the history (src/history.c) as seen by the snapshot writer (src/snapshot.c) and
 * by the malloc path (src/alloc.c). Private to the library.
 *
 * A stack is captured when an event is recorded (under the allocator's lock): native return
 * addresses (backtrace) and, when the Python helper asks for them, the Python frames of the
 * calling thread. Stacks are interned in a per-allocator depot and named by a 32-bit id (0: no
 * stack); ring entries and live blocks keep ids, not frames. Nothing is symbolized until a
 * snapshot is written: return addresses through dladdr, Python frames through a process-wide
 * table of code objects that keeps each one's file and function name.
 */
#ifndef VMM_HISTORY_H
#define VMM_HISTORY_H

#include <stddef.h>
#include <stdint.h>

#include "core/trace.h"
#include "core/types.h"

/* Append an event (VMM_TRACE_*) to the ring; caller holds the lock. The recorder that
 * VMM_HISTORY (core/trace.h) calls through a->hooks.trace while recording. */
void vmm_history_add(vmm_allocator *a, int action, uintptr_t addr, size_t size, vmm_stream s);
/* Monotonic clock in nanoseconds (trace times). */
uint64_t vmm_history_now_ns(void);
/* Copy the ring, oldest first, into a new array of *n entries from vmm_meta_alloc (*out NULL when
 * empty); the caller frees it. VMM_OK or VMM_EHOSTMEM. */
int vmm_history_copy(vmm_allocator *a, vmm_trace_entry **out, size_t *n);
/* Free the ring (vmm_destroy). */
void vmm_history_destroy(vmm_allocator *a);

/* ---- Python frames gathered before the allocator's lock ---------------------------------------
 *
 * A thread that released the GIL (PyTorch's ops run their C++ side without it) cannot have its
 * Python frames read under the allocator's lock: taking the GIL there could deadlock with a thread
 * that holds the GIL and waits for the lock (a tensor freed from Python). vmm_malloc therefore
 * gathers them before it takes the lock, as PyTorch's caching allocator does:
 *
 *     VMM_HISTORY_CONTEXT_BEGIN(a);
 *     vmm_lock(a); ... vmm_unlock(a);
 *     VMM_HISTORY_CONTEXT_END();
 *
 * Cost while no allocator records Python stacks: one load of vmm_history_py_users. Events recorded
 * in between use the gathered frames; events elsewhere (a free from a thread holding the GIL)
 * read the frames under the lock, which needs no GIL acquisition since the thread holds it. */
extern _Atomic int vmm_history_py_users;
void vmm_history_context_begin(vmm_allocator *a);
void vmm_history_context_end(void);
#define VMM_HISTORY_CONTEXT_BEGIN(a)                                                           \
    do {                                                                                       \
        if (VMM_UNLIKELY(vmm_history_py_users != 0))                                           \
            vmm_history_context_begin(a);                                                      \
    } while (0)
#define VMM_HISTORY_CONTEXT_END()                                                              \
    do {                                                                                       \
        if (VMM_UNLIKELY(vmm_history_py_users != 0))                                           \
            vmm_history_context_end();                                                         \
    } while (0)

/* ---- what the snapshot writer reads (caller holds the allocator's lock) -------------------- */

/* The stack of a live or pending block (the one recorded at its alloc), of a segment (recorded
 * where it was mapped or allocated: key is its first address), 0 when none. */
uint32_t vmm_history_block_stack(const vmm_allocator *a, uintptr_t block_addr);
uint32_t vmm_history_segment_stack(const vmm_allocator *a, uintptr_t seg_addr);

/* The ring, oldest first, with each entry's stack id (ids NULL-able: then not copied). *out and
 * *ids come from malloc; *n entries. VMM_OK or VMM_EHOSTMEM. */
int vmm_history_copy_ex(vmm_allocator *a, vmm_trace_entry **out, uint32_t **ids, size_t *n);

/* Frames of stack `id` as raw words (see vmm_frame_word); returns their count (0 for id 0 or an
 * unknown id), copying at most max into out. */
size_t vmm_history_stack_words(const vmm_allocator *a, uint32_t id, uint64_t *out, size_t max);

/* Which unwinder native stacks use: "libunwind" (unw_backtrace from libunwind.so.8, when the
 * system has it) or "backtrace" (glibc's; also with VMMALLOC_UNWIND=backtrace). */
const char *vmm_history_unwinder(void);

/* ---- symbolization (no lock needed) -------------------------------------------------------- */

/* A raw frame word: a native return address (top bit clear), or a Python frame (top bit set:
 * code object index in bits 24..62, line in bits 0..23). */
#define VMM_FRAME_PY ((uint64_t)1 << 63)

typedef struct vmm_frame {
    const char *filename; /* never NULL */
    const char *name;     /* never NULL */
    int64_t line;
} vmm_frame;

/* Symbolize a raw stack (native frames innermost first, then Python frames innermost first) into
 * the frames a snapshot shows, innermost first: native frames outside the library and above the
 * Python interpreter, then the Python frames. Strings point into *strings (a buffer this call
 * grows with realloc; the caller frees it); returns the number of frames written to out (at most
 * max), or -1 when out of host memory. `cache` speeds up repeated addresses (see below). */
typedef struct vmm_symcache vmm_symcache;
vmm_symcache *vmm_symcache_new(void);
void vmm_symcache_free(vmm_symcache *c);
/* Frames of one raw stack; the returned frames stay valid until vmm_symcache_free. */
long vmm_symbolize(vmm_symcache *c, const uint64_t *words, size_t n, vmm_frame *out, size_t max);

#endif /* VMM_HISTORY_H */
