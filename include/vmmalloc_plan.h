/*
 * vmmalloc offline planner: place buffers with known lifetimes at fixed offsets in one arena.
 *
 * Conventions (zstd style), for every function below:
 *  - Return value: VMM_OK (0) or a negative VMM_E* code from vmmalloc.h; on failure vmm_last_error()
 *    holds a one-line message for the calling thread and the caller's arrays are unchanged.
 *  - Units: sizes, alignments, offsets and arena sizes are bytes. Lifetimes are abstract time steps
 *    (any monotone clock: an op index, an event ordinal); a lifetime is half-open [lower, upper).
 *  - Ownership: the caller owns every array it passes in. A vmm_plan_problem filled by the library
 *    is released with vmm_plan_problem_free.
 *  - Thread safety: every function is reentrant; concurrent calls on distinct arrays are safe.
 *    vmm_plan may start worker threads of its own (heuristics) and joins them before returning.
 *
 * The problem: two buffers conflict when their lifetimes intersect; conflicting buffers must not
 * overlap in [offset, offset + size). Each offset must be a multiple of the buffer's alignment.
 * Contiguous groups: buffers with the same group id >= 0 sit side by side, in the order they
 * appear in the array: member k+1 starts at align_up(offset_k + size_k, alignment_{k+1}). A group
 * is one fused block (as MindSpore's continuous AllReduce buffers): it occupies its whole extent
 * from the earliest member's lower to the latest member's upper.
 */
#ifndef VMMALLOC_PLAN_H
#define VMMALLOC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "vmmalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One buffer. All fields but offset are input; offset is written by vmm_plan. */
typedef struct vmm_plan_buffer {
    int64_t lower;      /* first time step at which the buffer is live */
    int64_t upper;      /* first time step at which it is dead again; upper > lower */
    uint64_t size;      /* bytes, > 0 */
    uint64_t alignment; /* bytes, a power of two; 0 means 1 */
    int64_t group;      /* contiguous group id, or -1 for none */
    uint64_t offset;    /* bytes from the arena start (output of vmm_plan, input of vmm_plan_verify) */
} vmm_plan_buffer;

/* Algorithms; vmm_plan_algo_name gives the CLI spelling of each. */
typedef enum vmm_plan_algo {
    VMM_PLAN_NAIVE = 0,       /* "naive": no reuse, end to end (ExecuTorch's baseline) */
    VMM_PLAN_GREEDY = 1,      /* "greedy": largest first into shared objects, best fit by size (ExecuTorch) */
    VMM_PLAN_GREEDY_SIZE = 2, /* "greedy-size": largest first into the best-fit gap (TFLite) */
    VMM_PLAN_TREE = 3,        /* "tree": temporal/spatial split tree (torch inductor) */
    VMM_PLAN_HEURISTICS = 4,  /* "heuristics": many order x fit rules in parallel, the best kept (SOMAS) */
    VMM_PLAN_EXACT = 5,       /* "exact": complete search seeded with the heuristics' best */
    VMM_PLAN_BEST = 6,        /* "best": heuristics, then exact within the time limit */
    VMM_PLAN_ALGO_COUNT = 7
} vmm_plan_algo;

typedef struct vmm_plan_options {
    int algo;            /* a vmm_plan_algo; default VMM_PLAN_BEST */
    double time_limit_s; /* seconds the exact search may run (exact, best), counted from the start
                          * of the call; default 10. See node_limit. */
    uint64_t capacity;   /* 0 (default): minimise the arena. Else exact/best stop at the first plan that
                          * fits in capacity bytes, and vmm_plan returns VMM_ENOMEM when the plan it
                          * returns does not fit (vmm_last_error says whether the exact search proved
                          * that none does); the offsets are written all the same. */
    int threads;         /* worker threads for heuristics, and with 2 or more the exact search runs
                          * its two searches side by side; 0 (default) = online CPUs */
    uint64_t node_limit; /* 0 (default): none. Else the exact search (exact, best) stops after this
                          * many nodes in all (when minimising, half for each of its two searches),
                          * or at the time limit if that comes first. The search is anytime: its
                          * nodes come in the same order whatever the limits and the best plan found
                          * so far is kept, so a run gives the arena any longer run had when it was
                          * as many nodes in. With a node limit (and a time limit long enough not to
                          * matter) the arena is the same on any machine, at any load, with any
                          * number of threads. Not counted: the reordering pass of best on more
                          * than 4096 buffers, which only the time limit stops. */
} vmm_plan_options;

typedef struct vmm_plan_result {
    uint64_t arena_bytes;       /* max over buffers of offset + size */
    uint64_t lower_bound_bytes; /* vmm_plan_lower_bound of the input */
    int optimal;                /* 1 when arena_bytes is proven minimal (equals the bound, or the
                                 * exact search finished), else 0 */
    double seconds;             /* wall time of the call */
    uint64_t nodes;             /* exact search nodes visited (0 for the other algorithms) */
    char winner[48];            /* what produced the plan, e.g. "size-desc/best-fit" */
} vmm_plan_result;

/* Defaults (see the fields). Not needed when the struct is zeroed except for time_limit_s. */
VMM_API void vmm_plan_options_init(vmm_plan_options *opt);

/*
 * Plan n buffers: writes every bufs[i].offset, and *res when res is not NULL.
 * opt NULL means defaults. The plan passes vmm_plan_verify before this returns VMM_OK.
 * Returns VMM_OK, VMM_EINVAL (bad buffer: zero size, upper <= lower, alignment not a power of two,
 * offsets that would overflow; bad options), VMM_ENOMEM (capacity given and proven too small),
 * VMM_EHOSTMEM, VMM_ECORRUPT (a plan failed verification: a planner bug, never expected).
 */
VMM_API int vmm_plan(vmm_plan_buffer *bufs, size_t n, const vmm_plan_options *opt,
                     vmm_plan_result *res);

/*
 * Independent check of a plan: lifetimes and sizes valid, offsets aligned, groups contiguous and
 * in order, no two conflicting buffers overlapping. Writes the arena size (max offset + size) to
 * *arena_bytes when not NULL. O(n log n + n * live) time.
 * Returns VMM_OK, VMM_EINVAL (invalid buffer), VMM_ECORRUPT (the plan breaks a rule; the message
 * names the buffers by index), VMM_EHOSTMEM.
 */
VMM_API int vmm_plan_verify(const vmm_plan_buffer *bufs, size_t n, uint64_t *arena_bytes);

/* Lower bound on any plan's arena: the peak of live bytes, with each group counted as one block
 * over its whole extent. Offsets are ignored. Returns VMM_OK, VMM_EINVAL, VMM_EHOSTMEM. */
VMM_API int vmm_plan_lower_bound(const vmm_plan_buffer *bufs, size_t n, uint64_t *out);

/* The algorithm's name ("greedy-size"), or "unknown". Static string. */
VMM_API const char *vmm_plan_algo_name(int algo);
/* Parse a name as written by vmm_plan_algo_name. Returns VMM_OK or VMM_EINVAL. */
VMM_API int vmm_plan_algo_from_name(const char *name, int *algo);

/* ---- files -------------------------------------------------------------------------------- */

/* A problem read from a file: the buffers plus the id column of each (strings, as written). */
typedef struct vmm_plan_problem {
    vmm_plan_buffer *buffers;
    char **ids;
    size_t count;
    int has_alignment; /* the input had an alignment column */
    int has_group;     /* the input had a group column */
    int from_trace;    /* 1 when read from a PyTorch trace (action,addr,size,stream[,time_us]) */
} vmm_plan_problem;

/*
 * Read a planner CSV (header `id,lower,upper,size` then optional `alignment`, `group`; other
 * columns such as `offset` are ignored) or a flattened PyTorch trace CSV (header
 * `action,addr,size,stream[,time_us]`): each alloc up to the free_completed of the same address
 * becomes a buffer, time being the event's ordinal (data row index from 0); a block never freed
 * lives to one past the last event. Other trace actions are skipped; zero-size allocs are dropped.
 * Returns VMM_OK, VMM_EINVAL with "file:line: reason" in vmm_last_error() (malformed line, bad
 * number, unknown header), VMM_ENOTSUP (cannot open), VMM_EHOSTMEM. *out is zeroed on failure.
 */
VMM_API int vmm_plan_load_csv(const char *path, vmm_plan_problem *out);
/* Same from memory: text of len bytes, name used in messages. */
VMM_API int vmm_plan_parse_csv(const char *text, size_t len, const char *name, vmm_plan_problem *out);
/* Release what vmm_plan_load_csv filled in; the struct is zeroed. NULL is a no-op. */
VMM_API void vmm_plan_problem_free(vmm_plan_problem *p);

/* Write `id,lower,upper,size[,alignment][,group],offset` to path ("-" = stdout).
 * Returns VMM_OK or VMM_ENOTSUP (cannot write). */
VMM_API int vmm_plan_save_csv(const vmm_plan_problem *p, const char *path);

/* Write the placement as an SVG picture (time across, address up; one rectangle per buffer).
 * Returns VMM_OK, VMM_ENOTSUP (cannot write), VMM_EINVAL (empty problem). */
VMM_API int vmm_plan_save_svg(const vmm_plan_problem *p, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_PLAN_H */
