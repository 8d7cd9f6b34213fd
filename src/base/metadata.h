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
/* Zeroed memory for a hash table of `size` bytes (the live table's shards): a power of two of
 * 64 KiB or more comes from 2 MiB chunks the kernel is asked to back with transparent huge pages
 * (madvise), where a table probed at random costs no TLB miss per lookup: the 10^6-live ring's
 * free makes one such probe (docs/benchmarks.md, "Latency"). Other sizes: vmm_meta_alloc. Free
 * with vmm_meta_table_free and the same size. Counted in vmm_meta_bytes. Thread safe. */
void *vmm_meta_table_alloc(vmm_meta *m, size_t size);
void vmm_meta_table_free(vmm_meta *m, void *p, size_t size);
/* Records of VMM_META_REC bytes (the pool's block records), zeroed, from 2 MiB huge-page chunks;
 * NULL when out of host memory. Free with vmm_meta_rec_free. Counted in vmm_meta_bytes. Thread safe. */
enum { VMM_META_REC = 128 };
void *vmm_meta_rec_alloc(vmm_meta *m);
void vmm_meta_rec_free(vmm_meta *m, void *p);
int64_t vmm_meta_bytes(const vmm_meta *m);           /* bytes currently allocated */
const char *vmm_meta_backend(const vmm_meta *m);      /* "jemalloc-arena" or "libc" */

#endif /* VMM_METADATA_H */
