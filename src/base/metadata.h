/*
 * Base layer: host memory for the allocator's records (metadata.c).
 */
#ifndef VMM_METADATA_H
#define VMM_METADATA_H

#include <stddef.h>
#include <stdint.h>

/* Host memory for block, segment and page records. Uses a private jemalloc arena when the process
 * has jemalloc loaded (found with dlsym at run time; the library never links it), else the system
 * allocator. Thread safe. */
typedef struct vmm_meta vmm_meta;
/* VMM_META_NO_JEMALLOC=1 in the environment forces the libc path (for tests). */
int vmm_meta_open(vmm_meta **out);
void vmm_meta_close(vmm_meta *m);
void *vmm_meta_alloc(vmm_meta *m, size_t size);       /* zeroed; NULL when out of host memory */
void vmm_meta_free(vmm_meta *m, void *p, size_t size);
int64_t vmm_meta_bytes(const vmm_meta *m);           /* bytes currently allocated */
const char *vmm_meta_backend(const vmm_meta *m);      /* "jemalloc-arena" or "libc" */

#endif /* VMM_METADATA_H */
