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
 *
 * Arenas (ExecuTorch's mem_id): each buffer names one of VMM_PLAN_MAX_ARENAS arenas; each arena
 * is planned on its own (offsets count from its start), with its own capacity. Buffers in
 * different arenas never conflict.
 * Unplanned buffers (VMM_PLAN_UNPLANNED; ExecuTorch's graph inputs and outputs left to the
 * runtime): they take no arena bytes, are left out of every plan and of the lower bound, and get
 * offset 0.
 * In place (VMM_PLAN_ALIAS): buffer b may take the bytes of buffer a = b.alias when a dies at the
 * step b is born, i.e. a.upper == b.lower + 1 (the two share exactly the step of the operator that
 * reads a and writes b). The planner then puts b at a's offset; the verifier accepts that overlap
 * (the two at the same offset) and no other. A buffer is aliased by at most one other, aliases
 * chain (c may alias b which aliases a), an alias is not a group member nor aliased by a group
 * member, both sit in the same arena, and a buffer aliasing an unplanned one is unplanned too (it
 * lives in the runtime's buffer). A chain is planned as one block of its largest member's size
 * over the whole chain's lifetime: exact when the sizes are equal (optimizer updates, `+=`), a
 * little generous otherwise.
 */
#ifndef VMMALLOC_PLAN_H
#define VMMALLOC_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include "vmmalloc.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Arenas per problem: ids 0 .. VMM_PLAN_MAX_ARENAS - 1. */
#define VMM_PLAN_MAX_ARENAS 16
/* vmm_plan_buffer.flags */
#define VMM_PLAN_UNPLANNED 0x1u /* supplied by the runtime: no arena bytes, offset 0 */
#define VMM_PLAN_ALIAS 0x2u     /* may take the bytes of buffer `alias` (in place) */

/* One buffer. All fields but offset are input; offset is written by vmm_plan. A buffer whose
 * fields after offset are zero is an ordinary one in arena 0, so initialisers written before those
 * fields existed keep their meaning. */
typedef struct vmm_plan_buffer {
    int64_t lower;      /* first time step at which the buffer is live */
    int64_t upper;      /* first time step at which it is dead again; upper > lower */
    uint64_t size;      /* bytes, > 0 */
    uint64_t alignment; /* bytes, a power of two; 0 means 1 */
    int64_t group;      /* contiguous group id, or -1 for none */
    uint64_t offset;    /* bytes from its arena's start (output of vmm_plan, input of vmm_plan_verify) */
    uint32_t arena;     /* arena id, < VMM_PLAN_MAX_ARENAS; default 0 */
    uint32_t flags;     /* VMM_PLAN_UNPLANNED, VMM_PLAN_ALIAS; default 0 */
    uint64_t alias;     /* with VMM_PLAN_ALIAS: index (in the same array) of the buffer whose bytes
                         * this one may take; see the top comment for the rules */
    uint64_t key;       /* the caller's reuse key (dtype, device...) for the "reuse" algorithm:
                         * a freed buffer is reused only by one of the same size, alignment and key */
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
    VMM_PLAN_REUSE = 7,       /* "reuse": exact-key free list in time order (torch inductor's
                               * memory_plan_reuse): a buffer takes a freed one of the same size,
                               * alignment and key, else new bytes at the top */
    VMM_PLAN_DOUBLE_CURSOR = 8, /* "double-cursor" (MindSpore): long-lived buffers bumped up from
                               * the bottom in birth order, short-lived ones packed (greedy-size)
                               * in the region above them */
    VMM_PLAN_ALGO_COUNT = 9
} vmm_plan_algo;

typedef struct vmm_plan_options {
    int algo;            /* a vmm_plan_algo; default VMM_PLAN_BEST */
    double time_limit_s; /* seconds the searches may run (exact, best: the tiling search, the exact
                          * search, the reordering pass), counted from the start of the call;
                          * default 10. See node_limit. */
    uint64_t capacity;   /* 0 (default): minimise the arena. Else exact/best stop at the first plan that
                          * fits in capacity bytes, and vmm_plan returns VMM_ENOMEM when the plan it
                          * returns does not fit (vmm_last_error says whether the exact search proved
                          * that none does); the offsets are written all the same. */
    int threads;         /* worker threads for heuristics, and with 2 or more the exact search runs
                          * its two searches side by side (and the tiling search its two time
                          * directions); 0 (default) = online CPUs */
    uint64_t node_limit; /* 0 (default): none. Else the exact search (exact, best) stops after this
                          * many nodes in all (when minimising, half for each of its two searches),
                          * or at the time limit if that comes first. The search is anytime: its
                          * nodes come in the same order whatever the limits and the best plan found
                          * so far is kept, so a run gives the arena any longer run had when it was
                          * as many nodes in. With a node limit (and a time limit long enough not to
                          * matter) the arena is the same on any machine, at any load, with any
                          * number of threads. Not counted: the reordering pass of best on more
                          * than 4096 buffers, which only the time limit stops. Applies to each
                          * arena's search (and each region's, with double_cursor) on its own.
                          * On an instance whose live bytes equal the bound at every time (a
                          * tiling, docs/planner.md) the tiling search takes half of it first
                          * (and 3/4 of the time left after the heuristics). */
    const uint64_t *capacities; /* NULL, or VMM_PLAN_MAX_ARENAS entries: capacities[a] > 0 is arena
                          * a's capacity (in place of `capacity`), 0 takes `capacity` */
    int double_cursor;   /* 1: best/exact/heuristics keep the long-lived buffers (see long_lived)
                          * below every short-lived one: each region planned on its own, the
                          * short-lived one starting at the long-lived one's top. 0: no such rule.
                          * Always on for VMM_PLAN_DOUBLE_CURSOR. */
    double long_lived;   /* a buffer (alias chain, group) is long-lived when its lifetime covers at
                          * least this fraction of its arena's time span; 0 (default) means 0.5 */
} vmm_plan_options;

/* One arena of a plan. */
typedef struct vmm_plan_arena_result {
    uint32_t id;                /* the arena id */
    uint32_t buffers;           /* planned buffers in it */
    uint64_t bytes;             /* max over its buffers of offset + size */
    uint64_t lower_bound_bytes; /* its peak of live bytes (aliases counted once) */
    uint64_t capacity;          /* the capacity it was planned for, 0 for none */
    uint64_t long_lived_bytes;  /* with the double cursor: the top of the long-lived region */
    int optimal;                /* bytes proven minimal for this arena */
} vmm_plan_arena_result;

typedef struct vmm_plan_result {
    uint64_t arena_bytes;       /* sum over arenas of their bytes (one arena: max offset + size) */
    uint64_t lower_bound_bytes; /* vmm_plan_lower_bound of the input (sum over arenas) */
    int optimal;                /* 1 when arena_bytes is proven minimal (equals the bound, or the
                                 * exact search finished), else 0 */
    double seconds;             /* wall time of the call */
    uint64_t nodes;             /* exact search nodes visited (0 for the other algorithms) */
    char winner[48];            /* what produced the plan, e.g. "size-desc/best-fit" */
    uint32_t arena_count;       /* arenas holding planned buffers, in arenas[0..arena_count) by id */
    uint32_t unplanned;         /* buffers left to the runtime (VMM_PLAN_UNPLANNED or aliasing one) */
    vmm_plan_arena_result arenas[VMM_PLAN_MAX_ARENAS];
} vmm_plan_result;

/* Defaults (see the fields). Not needed when the struct is zeroed except for time_limit_s. */
VMM_API void vmm_plan_options_init(vmm_plan_options *opt);

/*
 * Plan n buffers: writes every bufs[i].offset, and *res when res is not NULL.
 * opt NULL means defaults. The plan passes vmm_plan_verify before this returns VMM_OK. Arenas are
 * planned one after the other, each with the share of the time limit left to it (the time left
 * divided by the arenas left).
 * Returns VMM_OK, VMM_EINVAL (bad buffer: zero size, upper <= lower, alignment not a power of two,
 * offsets that would overflow, arena id out of range, unknown flag, an alias breaking a rule of
 * the top comment; bad options), VMM_ENOMEM (an arena's capacity given and proven too small, or
 * not met by the plan found),
 * VMM_EHOSTMEM, VMM_ECORRUPT (a plan failed verification: a planner bug, never expected).
 */
VMM_API int vmm_plan(vmm_plan_buffer *bufs, size_t n, const vmm_plan_options *opt,
                     vmm_plan_result *res);

/*
 * Check the buffers alone, without planning: what vmm_plan would reject with VMM_EINVAL. On failure
 * *bad (when not NULL) gets the index of the offending buffer and vmm_last_error() the reason
 * (the CSV reader turns the index into a line number). Returns VMM_OK, VMM_EINVAL, VMM_EHOSTMEM.
 */
VMM_API int vmm_plan_check(const vmm_plan_buffer *bufs, size_t n, size_t *bad);

/*
 * Independent check of a plan: lifetimes and sizes valid, offsets aligned, groups contiguous and
 * in order, no two conflicting buffers of one arena overlapping except an alias and its chain at
 * the same offset; unplanned buffers are not checked for overlaps. Writes the sum over arenas of
 * their size (max offset + size) to *arena_bytes when not NULL. O(n log n + n * live) time.
 * Returns VMM_OK, VMM_EINVAL (invalid buffer), VMM_ECORRUPT (the plan breaks a rule; the message
 * names the buffers by index), VMM_EHOSTMEM.
 */
VMM_API int vmm_plan_verify(const vmm_plan_buffer *bufs, size_t n, uint64_t *arena_bytes);

/* Lower bound on any plan's arena: the peak of live bytes, with each group counted as one block
 * over its whole extent, an alias and the buffer it takes counted once where both live, unplanned
 * buffers not at all; with several arenas the sum of their bounds. Offsets are ignored. Returns
 * VMM_OK, VMM_EINVAL, VMM_EHOSTMEM. */
VMM_API int vmm_plan_lower_bound(const vmm_plan_buffer *bufs, size_t n, uint64_t *out);
/* The same for one arena (0 when it has no planned buffer). */
VMM_API int vmm_plan_lower_bound_arena(const vmm_plan_buffer *bufs, size_t n, uint32_t arena, uint64_t *out);

/* The algorithm's name ("greedy-size"), or "unknown". Static string. */
VMM_API const char *vmm_plan_algo_name(int algo);
/* Parse a name as written by vmm_plan_algo_name. Returns VMM_OK or VMM_EINVAL. */
VMM_API int vmm_plan_algo_from_name(const char *name, int *algo);

/* ---- instances with a known optimum ------------------------------------------------------ */

/* Cut styles of vmm_plan_generate. */
typedef enum vmm_plan_gen_style {
    VMM_PLAN_GEN_GUILLOTINE = 0, /* "guillotine": a random piece cut straight, across time or address
                                  * in proportion to its extents: deep, varied */
    VMM_PLAN_GEN_BALANCED = 1,   /* "balanced": always the largest piece: shallow, even sizes */
    VMM_PLAN_GEN_ALTERNATE = 2,  /* "alternate": time and address cuts alternate with depth */
    VMM_PLAN_GEN_PINWHEEL = 3,   /* "pinwheel": guillotine, and one time in four a piece becomes five
                                  * that no straight cut separates (a non-guillotine tiling) */
    VMM_PLAN_GEN_COUNT = 4
} vmm_plan_gen_style;
#define VMM_PLAN_GEN_MAX 100000    /* most buffers one call cuts */
#define VMM_PLAN_GEN_HEIGHT 1048576 /* the rectangle's bytes: the optimum arena */
#define VMM_PLAN_GEN_GRANULE 16    /* address cuts fall on multiples of this */

/*
 * Fill out[0..n) with the pieces of the rectangle [0, 16n) x [0, VMM_PLAN_GEN_HEIGHT) cut into n
 * by style, from seed (the same pieces for the same arguments on any platform), shuffled. Every
 * time step is covered exactly, so the lower bound and the optimum are VMM_PLAN_GEN_HEIGHT; each
 * out[i].offset holds its place in the cut (a plan at the optimum). Alignment 0, group -1.
 * Returns VMM_OK, VMM_EINVAL (style, n out of 1..VMM_PLAN_GEN_MAX, NULL out), VMM_EHOSTMEM.
 */
VMM_API int vmm_plan_generate(int style, size_t n, uint64_t seed, vmm_plan_buffer *out);
/* "guillotine" .., or "unknown". Static string. */
VMM_API const char *vmm_plan_gen_style_name(int style);
/* Parse a style name. VMM_OK or VMM_EINVAL. */
VMM_API int vmm_plan_gen_style_from_name(const char *name, int *style);

/* ---- files -------------------------------------------------------------------------------- */

/* A problem read from a file: the buffers plus the id column of each (strings, as written). */
typedef struct vmm_plan_problem {
    vmm_plan_buffer *buffers;
    char **ids;
    size_t count;
    int has_alignment; /* the input had an alignment column */
    int has_group;     /* the input had a group column */
    int has_arena;     /* the input had an arena column */
    int has_unplanned; /* the input had an unplanned column */
    int has_alias;     /* the input had an alias column */
    int has_key;       /* the input had a key column */
    int from_trace;    /* 1 when read from a PyTorch trace (action,addr,size,stream[,time_us]) */
} vmm_plan_problem;

/*
 * Read a planner CSV (header `id,lower,upper,size` then optional `alignment`, `group`, `arena`
 * (integer id), `unplanned` (0 or 1), `alias` (the id of the buffer this one may take the bytes
 * of, or empty), `key` (unsigned integer); other columns such as `offset` are ignored; every
 * buffer is checked as by vmm_plan_check, the message naming its line) or a flattened PyTorch trace CSV (header
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

/* Write `id,lower,upper,size[,alignment][,group][,arena][,unplanned][,alias][,key],offset` to path
 * ("-" = stdout); the optional columns as the input had them, `arena` always when any buffer is
 * outside arena 0.
 * Returns VMM_OK or VMM_ENOTSUP (cannot write). */
VMM_API int vmm_plan_save_csv(const vmm_plan_problem *p, const char *path);

/* Write the placement as an SVG picture (time across, address up; one rectangle per buffer, one
 * panel per arena, an alias drawn dashed in its target's colour; unplanned buffers counted in the
 * title).
 * Returns VMM_OK, VMM_ENOTSUP (cannot write), VMM_EINVAL (empty problem). */
VMM_API int vmm_plan_save_svg(const vmm_plan_problem *p, const char *path);

#ifdef __cplusplus
}
#endif

#endif /* VMMALLOC_PLAN_H */
