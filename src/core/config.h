/*
 * Core: the configuration string (config.c): keys, defaults, parsing, formatting.
 */
#ifndef VMM_CONFIG_H
#define VMM_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "driver/driver.h"
#include "vmmalloc.h"

/* VMM_DRIVER_SIM, VMM_DRIVER_CUDA (the driver key's values): driver/driver.h. */
/* roundup_power2_divisions intervals, as PyTorch: interval 0 holds sizes below 2 MiB, interval k
 * (k >= 1) sizes in [2^k MiB, 2^(k+1) MiB), the last one everything above. */
enum { VMM_POW2_INTERVALS = 16 };

typedef struct vmm_config {
    int driver;                          /* VMM_DRIVER_*; default cuda (tests and bench ask for sim) */
    int device;
    int peer_all;                        /* peer_access:all (default): every peer the driver allows */
    uint64_t peer_mask;                  /* peer_access:[..]: bit i grants device i */
    int ipc;                             /* pages exportable (ipc.c): 1 true, 0 false, -1 auto */
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
    size_t max_handle_size;              /* largest physical handle of the large pool (segment.c) */
    size_t thread_cache;                 /* bytes each thread may keep freed for itself; 0 off */
    int grow_unlocked;                   /* 1: growth creates handles unlocked (segment.c) */
    int lanes;                           /* 1: per-stream locks once two threads are seen (lane.c) */
    int depot;                           /* 1: full bins of freeing threads go to the depot (tcache.c) */
    int alias_pages;                     /* 1: growth maps partly used pages a second time (alias.c) */
    int lifetime_split;                  /* 1: blocks predicted to stay get segments of their own (pool.c) */
    int alias_place;                     /* 1: large blocks built from free page edges (alias.c) */
    int alias_place_hybrid;              /* 1: with alias_place, best fit that leaves no gap in a page */
    size_t alias_place_tail_gap;         /* alias_place: most free bytes a tail view may leave */
    size_t alias_place_slack;            /* alias_place: most bytes a reused free block may exceed */
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

#endif /* VMM_CONFIG_H */
