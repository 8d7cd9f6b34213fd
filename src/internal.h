/*
 * Internal cross-file functions of vmmalloc, grouped by the file that defines them.
 * Layers call downward only: alloc.c -> segment.c / pool.c -> driver (driver.h).
 */
#ifndef VMM_INTERNAL_H
#define VMM_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "driver.h"
#include "vmmalloc.h"

#define VMM_KiB ((size_t)1 << 10)
#define VMM_MiB ((size_t)1 << 20)
#define VMM_GiB ((size_t)1 << 30)

#if defined(__GNUC__)
#define VMM_PRINTF(f, a) __attribute__((format(printf, f, a)))
#define VMM_LIKELY(x) __builtin_expect(!!(x), 1)
#define VMM_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define VMM_PRINTF(f, a)
#define VMM_LIKELY(x) (x)
#define VMM_UNLIKELY(x) (x)
#endif

/* ---- error.c ---------------------------------------------------------------------------- */

/* Set this thread's vmm_last_error() text and return `status` (so callers can `return vmm_fail(...)`). */
int vmm_fail(int status, const char *fmt, ...) VMM_PRINTF(2, 3);
/* Map a driver result to a status code: OUT_OF_MEMORY -> VMM_ENOMEM, NO_DEVICE & co -> VMM_ENODEV,
 * NOT_SUPPORTED -> VMM_ENOTSUP, anything else -> VMM_EDRIVER. */
int vmm_status_from_drv(int drv_result);
/* vmm_fail with the driver call named: "<what>: CUDA_ERROR_X (n)". */
int vmm_fail_drv(int drv_result, const char *what);
/* Clear this thread's last error (successful calls leave it alone; only tests need this). */
void vmm_clear_error(void);

/* ---- config.c ----------------------------------------------------------------------------- */

enum { VMM_DRIVER_SIM = 0, VMM_DRIVER_CUDA = 1 };
/* roundup_power2_divisions intervals, as PyTorch: interval 0 holds sizes below 2 MiB, interval k
 * (k >= 1) sizes in [2^k MiB, 2^(k+1) MiB), the last one everything above. */
enum { VMM_POW2_INTERVALS = 16 };

typedef struct vmm_config {
    int driver;                          /* VMM_DRIVER_*; default cuda (tests and bench ask for sim) */
    int device;
    int expandable_segments;             /* default 1 */
    size_t max_split_size;               /* bytes; SIZE_MAX = unlimited (default) */
    size_t max_non_split_rounding;       /* bytes; default 20 MiB */
    /* roundup_power2_divisions: divisions per interval (see VMM_POW2_INTERVALS); 0 = plain 512 B
     * rounding. Set with one number for all intervals, or PyTorch's list form [64:8,256:4,>:1]. */
    unsigned pow2_divisions[VMM_POW2_INTERVALS];
    double garbage_collection_threshold; /* 0 = off */
    double per_process_memory_fraction;  /* 1.0 = whole device */
    size_t small_page_size;              /* bytes mapped per page in the small pool */
    size_t large_page_size;              /* bytes mapped per page in the large pool */
    /* sim */
    vmm_sim_options sim;
} vmm_config;

/* Defaults for every key. */
void vmm_config_defaults(vmm_config *c);
/* Parse "key:value,..." into c (on top of what c holds). VMM_ECONFIG naming the key on error; c is
 * unchanged then. */
int vmm_config_parse(vmm_config *c, const char *conf);
/* Defaults, then VMMALLOC_CONF, then conf. */
int vmm_config_load(vmm_config *c, const char *conf);
/* Render c as "key:value,..."; returns length or VMM_ERANGE. */
int vmm_config_format(const vmm_config *c, char *buf, size_t len);
/* Parse a size with optional K/M/G/T[iB] suffix (powers of 1024). 0 on success. */
int vmm_parse_size(const char *s, size_t len, size_t *out);
/* Key i of the option table and its documentation (via *doc); NULL past the last key. */
const char *vmm_config_key_doc(size_t i, const char **doc);

/* ---- metadata.c --------------------------------------------------------------------------- */

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

#endif /* VMM_INTERNAL_H */
