/*
 * History: a fixed ring of the allocator's last events (PyTorch's device trace), and the call
 * stacks recorded with them. The ring, the stack depot and the address map are written under the
 * allocator's lock by the hooks (VMM_HISTORY in internal.h) and read under it too, so they need no
 * locking of their own. src/history.h describes the stacks; docs/snapshots.md the costs.
 *
 * Stacks:
 *  - native: unw_backtrace (libunwind, when present) or glibc's backtrace() into a buffer of
 *    return addresses, interned in the depot; dladdr runs only when a snapshot is written
 *    (vmm_symbolize).
 *  - Python: the frames of the calling thread, read through CPython's C API found with dlsym (the
 *    library never links libpython). Reading them needs the GIL: under the allocator's lock only a
 *    thread that holds it already is read (the cyclic GC is paused meanwhile, so no finalizer can
 *    run and re-enter the allocator); vmm_malloc gathers them before its lock for threads that
 *    released the GIL (vmm_history_context_begin). Each code object is kept (one reference) in a
 *    process-wide table with its file and function name, so a frame is two integers.
 */
#include <dlfcn.h>
#include <errno.h>
#include <execinfo.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <link.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/errors.h"
#include "base/metadata.h"
#include "api/history.h"
#include "core/lock.h"
#include "core/tcache.h"
#include "core/types.h"

enum {
    NATIVE_MAX = 64,              /* return addresses kept per stack */
    NATIVE_SKIP = 2,              /* capture_stack and vmm_history_add themselves */
    PY_MAX = 96,                  /* Python frames kept per stack */
    STACK_MAX = NATIVE_MAX + PY_MAX,
    DEPOT_MAX_WORDS = 8 << 20,    /* 64 MiB of interned stacks per allocator, then no new ones */
    PY_LINE_BITS = 24,
};

/* ---- clock ----------------------------------------------------------------------------------- */

uint64_t vmm_history_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Trace times are microseconds since the epoch, as PyTorch writes them, but read from the
 * monotonic clock plus one offset taken once per process: they never go back when the wall clock
 * is stepped, and every allocator's events share one time base. */
static int64_t epoch_offset_ns;
static pthread_once_t epoch_once = PTHREAD_ONCE_INIT;

static void epoch_init(void)
{
    struct timespec rt;
    clock_gettime(CLOCK_REALTIME, &rt);
    uint64_t mono = vmm_history_now_ns();
    epoch_offset_ns = (int64_t)((uint64_t)rt.tv_sec * 1000000000ull + (uint64_t)rt.tv_nsec) - (int64_t)mono;
}

/* ---- the stack depot ------------------------------------------------------------------------- */

/* Records in one array of words: a header (hash in the low 32 bits, frame count above) and the
 * frames. A stack's id is its header's index + 1. An open-addressing table of ids finds them. */
typedef struct depot {
    uint64_t *w;
    size_t n_w, cap_w;
    uint32_t *slots;   /* ids, 0 empty; size a power of two */
    size_t n_slots, n_stacks;
    size_t dropped;    /* stacks not kept: the depot was full or out of memory */
} depot;

static uint32_t hash_words(const uint64_t *w, size_t n)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        h ^= w[i];
        h *= 0xff51afd7ed558ccdull;
        h ^= h >> 32;
    }
    return (uint32_t)(h ^ (h >> 29)) | 1u; /* never 0 */
}

static int depot_grow_slots(depot *d)
{
    size_t ns = d->n_slots ? d->n_slots * 2 : 1024;
    uint32_t *s = calloc(ns, sizeof *s);
    if (!s)
        return -1;
    for (size_t i = 0; i < d->n_slots; i++) {
        uint32_t id = d->slots[i];
        if (!id)
            continue;
        size_t j = (uint32_t)d->w[id - 1] & (ns - 1);
        while (s[j])
            j = (j + 1) & (ns - 1);
        s[j] = id;
    }
    free(d->slots);
    d->slots = s;
    d->n_slots = ns;
    return 0;
}

static uint32_t depot_intern(depot *d, const uint64_t *f, size_t n)
{
    if (!n)
        return 0;
    uint32_t h = hash_words(f, n);
    if (d->n_slots) {
        for (size_t j = h & (d->n_slots - 1);; j = (j + 1) & (d->n_slots - 1)) {
            uint32_t id = d->slots[j];
            if (!id)
                break;
            const uint64_t *r = &d->w[id - 1];
            if ((uint32_t)r[0] == h && (r[0] >> 32) == n && memcmp(r + 1, f, n * sizeof *f) == 0)
                return id;
        }
    }
    if (d->n_w + n + 1 > DEPOT_MAX_WORDS) {
        d->dropped++;
        return 0;
    }
    if ((d->n_stacks + 1) * 2 > d->n_slots && depot_grow_slots(d)) {
        d->dropped++;
        return 0;
    }
    if (d->n_w + n + 1 > d->cap_w) {
        size_t nc = d->cap_w ? d->cap_w * 2 : 4096;
        while (nc < d->n_w + n + 1)
            nc *= 2;
        uint64_t *nw = realloc(d->w, nc * sizeof *nw);
        if (!nw) {
            d->dropped++;
            return 0;
        }
        d->w = nw;
        d->cap_w = nc;
    }
    uint32_t id = (uint32_t)d->n_w + 1;
    d->w[d->n_w] = (uint64_t)h | (uint64_t)n << 32;
    memcpy(&d->w[d->n_w + 1], f, n * sizeof *f);
    d->n_w += n + 1;
    size_t j = h & (d->n_slots - 1);
    while (d->slots[j])
        j = (j + 1) & (d->n_slots - 1);
    d->slots[j] = id;
    d->n_stacks++;
    return id;
}

static void depot_free(depot *d)
{
    if (!d)
        return;
    free(d->w);
    free(d->slots);
    free(d);
}

/* ---- address -> stack id (live blocks; segments at addr | 1) ---------------------------------- */

typedef struct addr_map {
    uintptr_t *keys;   /* 0 empty */
    uint32_t *vals;
    size_t cap, n;     /* cap a power of two */
} addr_map;

static size_t map_hash(uintptr_t k, size_t cap)
{
    uint64_t x = (uint64_t)k * 0x9e3779b97f4a7c15ull;
    return (size_t)(x >> 32) & (cap - 1);
}

static int map_grow(addr_map *m)
{
    size_t nc = m->cap ? m->cap * 2 : 1024;
    uintptr_t *k = calloc(nc, sizeof *k);
    uint32_t *v = calloc(nc, sizeof *v);
    if (!k || !v) {
        free(k);
        free(v);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->keys[i])
            continue;
        size_t j = map_hash(m->keys[i], nc);
        while (k[j])
            j = (j + 1) & (nc - 1);
        k[j] = m->keys[i];
        v[j] = m->vals[i];
    }
    free(m->keys);
    free(m->vals);
    m->keys = k;
    m->vals = v;
    m->cap = nc;
    return 0;
}

static long map_find(const addr_map *m, uintptr_t key)
{
    if (!m->cap)
        return -1;
    for (size_t j = map_hash(key, m->cap);; j = (j + 1) & (m->cap - 1)) {
        if (m->keys[j] == key)
            return (long)j;
        if (!m->keys[j])
            return -1;
    }
}

/* Remove slot j, shifting later members of its cluster back (no tombstones). */
static void map_remove_at(addr_map *m, size_t j)
{
    size_t mask = m->cap - 1;
    size_t i = j;
    for (;;) {
        m->keys[i] = 0;
        size_t k = i;
        for (;;) {
            k = (k + 1) & mask;
            if (!m->keys[k]) {
                m->n--;
                return;
            }
            size_t home = map_hash(m->keys[k], m->cap);
            /* k's entry may move to i when its home is not in (i, k] (cyclically) */
            if (i <= k ? (home <= i || home > k) : (home <= i && home > k))
                break;
        }
        m->keys[i] = m->keys[k];
        m->vals[i] = m->vals[k];
        i = k;
    }
}

static void map_put(addr_map *m, uintptr_t key, uint32_t val)
{
    long j = map_find(m, key);
    if (!val) {
        if (j >= 0)
            map_remove_at(m, (size_t)j);
        return;
    }
    if (j >= 0) {
        m->vals[j] = val;
        return;
    }
    if ((m->n + 1) * 2 > m->cap && map_grow(m))
        return; /* out of host memory: that block shows no frames */
    size_t k = map_hash(key, m->cap);
    while (m->keys[k])
        k = (k + 1) & (m->cap - 1);
    m->keys[k] = key;
    m->vals[k] = val;
    m->n++;
}

static uint32_t map_get(const addr_map *m, uintptr_t key)
{
    long j = map_find(m, key);
    return j < 0 ? 0 : m->vals[j];
}

static uint32_t map_take(addr_map *m, uintptr_t key)
{
    long j = map_find(m, key);
    if (j < 0)
        return 0;
    uint32_t v = m->vals[j];
    map_remove_at(m, (size_t)j);
    return v;
}

/* ---- native stacks ----------------------------------------------------------------------------
 * libunwind's unw_backtrace (libunwind.so.8, Debian package libunwind8) when the system has it:
 * it caches each frame's unwind rule and takes ~7 ns a frame where glibc's backtrace (libgcc's
 * DWARF unwinder, which parses the rules again at every call) takes ~200. Same semantics (return
 * addresses, innermost first). VMMALLOC_UNWIND=backtrace forces glibc's. Loaded RTLD_LOCAL: its
 * _Unwind_* symbols do not replace the process's own. */
/* Text of libvmmalloc.so itself, [own_lo, own_hi): leading frames in it are not kept (the caller
 * is what matters, and the malloc's fast and slow paths would otherwise make two stacks of one
 * call site). Empty in a static link, where the library's code is the program's. */
static uintptr_t own_lo, own_hi;

static void own_text_anchor(void) {}

static int own_text_cb(struct dl_phdr_info *info, size_t size, void *data)
{
    (void)size;
    uintptr_t anchor = (uintptr_t)data;
    for (int i = 0; i < info->dlpi_phnum; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        uintptr_t lo = info->dlpi_addr + ph->p_vaddr, hi = lo + ph->p_memsz;
        if (ph->p_type == PT_LOAD && (ph->p_flags & PF_X) && anchor >= lo && anchor < hi) {
            const char *name = info->dlpi_name ? strrchr(info->dlpi_name, '/') : NULL;
            name = name ? name + 1 : info->dlpi_name;
            if (name && strncmp(name, "libvmmalloc.so", 14) == 0) {
                own_lo = lo;
                own_hi = hi;
            }
            return 1;
        }
    }
    return 0;
}

static int (*unw_backtrace_fn)(void **, int);
static pthread_once_t unwind_once = PTHREAD_ONCE_INIT;

static void unwind_init(void)
{
    const char *e = getenv("VMMALLOC_UNWIND");
    int use_libunwind = !(e && strcmp(e, "backtrace") == 0);
#if defined(__SANITIZE_THREAD__)
    /* libunwind frees its per-thread cache in a thread-exit destructor that locks a mutex, after
     * ThreadSanitizer has torn down the thread's state: it crashes there. TSan builds use glibc's. */
    use_libunwind = 0;
#endif
    if (use_libunwind) {
        void *h = dlopen("libunwind.so.8", RTLD_NOW | RTLD_LOCAL);
        if (h)
            *(void **)&unw_backtrace_fn = dlsym(h, "unw_backtrace");
    }
    dl_iterate_phdr(own_text_cb, (void *)(uintptr_t)&own_text_anchor);
    /* the first call loads what the unwinder needs (libgcc_s: a dlopen): here, not under a lock */
    void *warm[4];
    if (unw_backtrace_fn)
        (void)unw_backtrace_fn(warm, 4);
    (void)backtrace(warm, 4);
}

const char *vmm_history_unwinder(void)
{
    pthread_once(&unwind_once, unwind_init);
    return unw_backtrace_fn ? "libunwind" : "backtrace";
}

/* ---- CPython, found at run time -------------------------------------------------------------- */

typedef void *pyobj;
static struct {
    int ok;                              /* every function below was found (Python >= 3.10) */
    int (*IsInitialized)(void);
    int (*IsFinalizing)(void);           /* Py_IsFinalizing (3.13) or _Py_IsFinalizing; may be NULL */
    int (*GILState_Check)(void);
    void *(*GILState_GetThisThreadState)(void);
    void *(*ThreadState_GetUnchecked)(void); /* may be NULL: then GILState_Check decides */
    int (*GILState_Ensure)(void);
    void (*GILState_Release)(int);
    pyobj (*Eval_GetFrame)(void);
    pyobj (*Frame_GetBack)(pyobj);
    pyobj (*Frame_GetCode)(pyobj);
    int (*Frame_GetLineNumber)(pyobj);
    int (*Frame_GetLasti)(pyobj);        /* 3.11+; may be NULL: then lines are not cached */
    int (*GC_Disable)(void);
    int (*GC_Enable)(void);
    pyobj (*Object_GetAttrString)(pyobj, const char *);
    const char *(*Unicode_AsUTF8)(pyobj);
    void (*IncRef)(pyobj);
    void (*DecRef)(pyobj);
    void (*Err_Fetch)(pyobj *, pyobj *, pyobj *);
    void (*Err_Restore)(pyobj, pyobj, pyobj);
} py;
static pthread_once_t py_once = PTHREAD_ONCE_INIT;

#define PY_SYM(field, name) (*(void **)&py.field = dlsym(RTLD_DEFAULT, name))

static void py_resolve(void)
{
    int all = 1;
    all &= PY_SYM(IsInitialized, "Py_IsInitialized") != NULL;
    all &= PY_SYM(GILState_Check, "PyGILState_Check") != NULL;
    all &= PY_SYM(GILState_GetThisThreadState, "PyGILState_GetThisThreadState") != NULL;
    all &= PY_SYM(GILState_Ensure, "PyGILState_Ensure") != NULL;
    all &= PY_SYM(GILState_Release, "PyGILState_Release") != NULL;
    all &= PY_SYM(Eval_GetFrame, "PyEval_GetFrame") != NULL;
    all &= PY_SYM(Frame_GetBack, "PyFrame_GetBack") != NULL;
    all &= PY_SYM(Frame_GetCode, "PyFrame_GetCode") != NULL;
    all &= PY_SYM(Frame_GetLineNumber, "PyFrame_GetLineNumber") != NULL;
    all &= PY_SYM(GC_Disable, "PyGC_Disable") != NULL;
    all &= PY_SYM(GC_Enable, "PyGC_Enable") != NULL;
    all &= PY_SYM(Object_GetAttrString, "PyObject_GetAttrString") != NULL;
    all &= PY_SYM(Unicode_AsUTF8, "PyUnicode_AsUTF8") != NULL;
    all &= PY_SYM(IncRef, "Py_IncRef") != NULL;
    all &= PY_SYM(DecRef, "Py_DecRef") != NULL;
    all &= PY_SYM(Err_Fetch, "PyErr_Fetch") != NULL;
    all &= PY_SYM(Err_Restore, "PyErr_Restore") != NULL;
    PY_SYM(Frame_GetLasti, "PyFrame_GetLasti");
    if (!PY_SYM(IsFinalizing, "Py_IsFinalizing"))
        PY_SYM(IsFinalizing, "_Py_IsFinalizing");
    if (!PY_SYM(ThreadState_GetUnchecked, "PyThreadState_GetUnchecked"))
        PY_SYM(ThreadState_GetUnchecked, "_PyThreadState_UncheckedGet");
    py.ok = all;
}

static int py_running(void)
{
    return py.ok && py.IsInitialized() && !(py.IsFinalizing && py.IsFinalizing());
}

/* This thread holds the GIL (checked without taking anything). */
static int py_holds_gil(void)
{
    if (py.ThreadState_GetUnchecked) {
        void *cur = py.ThreadState_GetUnchecked();
        return cur != NULL && cur == py.GILState_GetThisThreadState();
    }
    return py.GILState_Check();
}

/* Code objects seen in any stack, kept alive (one reference each) so that a pointer names one
 * code object for the life of the process; their names are copied once. Written with the GIL
 * held; read by snapshots from any thread: a mutex orders both. */
typedef struct code_rec {
    pyobj code;
    char *filename, *name;
} code_rec;
static pthread_mutex_t code_mu = PTHREAD_MUTEX_INITIALIZER;
static code_rec *codes;
static size_t n_codes, cap_codes;
static uint32_t *code_slots; /* index + 1, by code pointer */
static size_t n_code_slots;

static char *py_attr_utf8(pyobj o, const char *attr)
{
    pyobj v = py.Object_GetAttrString(o, attr);
    if (!v)
        return NULL;
    const char *s = py.Unicode_AsUTF8(v);
    char *copy = s ? strdup(s) : NULL;
    py.DecRef(v);
    return copy;
}

static int code_slots_grow(void)
{
    size_t ns = n_code_slots ? n_code_slots * 2 : 1024;
    uint32_t *s = calloc(ns, sizeof *s);
    if (!s)
        return -1;
    for (size_t i = 0; i < n_codes; i++) {
        size_t j = map_hash((uintptr_t)codes[i].code, ns);
        while (s[j])
            j = (j + 1) & (ns - 1);
        s[j] = (uint32_t)i + 1;
    }
    free(code_slots);
    code_slots = s;
    n_code_slots = ns;
    return 0;
}

/* Index of code object co (GIL and code_mu held), added when new; UINT32_MAX when out of memory. */
static uint32_t code_index_locked(pyobj co)
{
    if (n_code_slots) {
        for (size_t j = map_hash((uintptr_t)co, n_code_slots);; j = (j + 1) & (n_code_slots - 1)) {
            uint32_t id = code_slots[j];
            if (!id)
                break;
            if (codes[id - 1].code == co)
                return id - 1;
        }
    }
    if ((n_codes + 1) * 2 > n_code_slots && code_slots_grow())
        return UINT32_MAX;
    if (n_codes == cap_codes) {
        size_t nc = cap_codes ? cap_codes * 2 : 256;
        code_rec *nr = realloc(codes, nc * sizeof *nr);
        if (!nr)
            return UINT32_MAX;
        codes = nr;
        cap_codes = nc;
    }
    /* attribute lookups must not see (or clear) an exception the thread is propagating */
    pyobj et, ev, tb;
    py.Err_Fetch(&et, &ev, &tb);
    char *file = py_attr_utf8(co, "co_filename");
    char *name = py_attr_utf8(co, "co_name"); /* the function's name, as PyTorch's frames */
    py.Err_Restore(et, ev, tb);
    py.IncRef(co);
    codes[n_codes] = (code_rec){co, file ? file : strdup("??"), name ? name : strdup("??")};
    size_t j = map_hash((uintptr_t)co, n_code_slots);
    while (code_slots[j])
        j = (j + 1) & (n_code_slots - 1);
    code_slots[j] = (uint32_t)n_codes + 1;
    return (uint32_t)n_codes++;
}

/* Line of each (code index, instruction offset) seen: PyFrame_GetLineNumber walks the code's line
 * table from its start at every call, the largest part of a walk's cost. Under code_mu. */
static addr_map line_cache;

static int frame_line_locked(pyobj f, uint32_t ci)
{
    int lasti = py.Frame_GetLasti ? py.Frame_GetLasti(f) : -1;
    if (lasti < 0 || ci >= (1u << 24))
        return py.Frame_GetLineNumber(f);
    uintptr_t key = ((uintptr_t)(ci + 1) << 32) | (uint32_t)lasti;
    uint32_t v = map_get(&line_cache, key);
    if (v)
        return (int)v - 1;
    int line = py.Frame_GetLineNumber(f);
    map_put(&line_cache, key, (uint32_t)(line < 0 ? 0 : line) + 1);
    return line;
}

/* The calling thread's Python frames, innermost first, as frame words. The thread holds the GIL.
 * The cyclic GC is paused: materializing a frame object allocates, and a collection there could
 * run finalizers that free tensors, re-entering the allocator whose lock may be held. */
static size_t py_walk(uint64_t *out, size_t max)
{
    size_t n = 0;
    int gc_was_on = py.GC_Disable();
    pthread_mutex_lock(&code_mu);
    pyobj f = py.Eval_GetFrame(); /* borrowed */
    if (f)
        py.IncRef(f);
    while (f && n < max) {
        pyobj co = py.Frame_GetCode(f);
        uint32_t ci = co ? code_index_locked(co) : UINT32_MAX;
        if (co)
            py.DecRef(co);
        if (ci != UINT32_MAX) {
            int line = frame_line_locked(f, ci);
            uint64_t ln = line > 0 ? (uint64_t)line & ((1u << PY_LINE_BITS) - 1) : 0;
            out[n++] = VMM_FRAME_PY | (uint64_t)ci << PY_LINE_BITS | ln;
        }
        pyobj back = py.Frame_GetBack(f);
        py.DecRef(f);
        f = back;
    }
    if (f)
        py.DecRef(f);
    pthread_mutex_unlock(&code_mu);
    if (gc_was_on)
        py.GC_Enable();
    return n;
}

/* ---- gathering Python frames before the lock (vmm_malloc) ------------------------------------ */

_Atomic int vmm_history_py_users;

static _Thread_local struct {
    vmm_allocator *a; /* frames gathered for this allocator's current call; NULL when none */
    size_t n;
    uint64_t w[PY_MAX];
} tls_py;

/* Called by vmm_malloc before it takes the lock (VMM_HISTORY_CONTEXT_BEGIN, history.h), only while
 * some allocator records Python stacks. */
void vmm_history_context_begin(vmm_allocator *a)
{
    tls_py.a = NULL;
    if (!py_running())
        return;
    if (py_holds_gil())
        return; /* read under the lock, no GIL to take */
    if (!py.GILState_GetThisThreadState())
        return; /* a thread Python never saw (a C++ worker): it has no Python frames */
    int st = py.GILState_Ensure();
    tls_py.n = py_walk(tls_py.w, PY_MAX);
    py.GILState_Release(st);
    tls_py.a = a;
}

void vmm_history_context_end(void) { tls_py.a = NULL; }

/* ---- the ring -------------------------------------------------------------------------------- */

struct vmm_history {
    vmm_trace_entry *ring;
    uint32_t *ids;    /* stack id per ring slot (NULL without stacks) */
    size_t cap;       /* entries the ring holds at most */
    size_t head;      /* index of the oldest entry */
    size_t n;         /* entries held */
    unsigned flags;   /* VMM_HISTORY_* */
    depot *dep;       /* interned stacks (NULL without stacks) */
    addr_map map;     /* block address (or segment address | 1) -> stack of its alloc / map */
};

/* A ring entry must stay small: the hooks copy one per event on the malloc path. */
_Static_assert(sizeof(vmm_trace_entry) <= 40, "trace entry grew");

static const char *const action_names[VMM_TRACE_ACTION_COUNT] = {
    [VMM_TRACE_ALLOC] = "alloc",
    [VMM_TRACE_FREE_REQUESTED] = "free_requested",
    [VMM_TRACE_FREE_COMPLETED] = "free_completed",
    [VMM_TRACE_SEGMENT_ALLOC] = "segment_alloc",
    [VMM_TRACE_SEGMENT_FREE] = "segment_free",
    [VMM_TRACE_SEGMENT_MAP] = "segment_map",
    [VMM_TRACE_SEGMENT_UNMAP] = "segment_unmap",
    [VMM_TRACE_OOM] = "oom",
};

VMM_API const char *vmm_trace_action_name(int action)
{
    if (action < 0 || action >= VMM_TRACE_ACTION_COUNT)
        return "unknown";
    return action_names[action];
}

/* Interned stack of the calling thread, 0 when none was captured. noinline: NATIVE_SKIP counts
 * this function and vmm_history_add as the innermost frames. */
static __attribute__((noinline)) uint32_t capture_stack(vmm_allocator *a, struct vmm_history *h)
{
    uint64_t w[STACK_MAX];
    size_t n = 0;
    if (h->flags & VMM_HISTORY_STACKS_NATIVE) {
        void *pcs[NATIVE_MAX + NATIVE_SKIP];
        int k = unw_backtrace_fn ? unw_backtrace_fn(pcs, NATIVE_MAX + NATIVE_SKIP)
                                 : backtrace(pcs, NATIVE_MAX + NATIVE_SKIP);
        int i = NATIVE_SKIP;
        while (i < k && (uintptr_t)pcs[i] >= own_lo && (uintptr_t)pcs[i] < own_hi)
            i++;
        for (; i < k; i++)
            w[n++] = (uint64_t)(uintptr_t)pcs[i] & ~VMM_FRAME_PY;
    }
    if (h->flags & VMM_HISTORY_STACKS_PYTHON) {
        if (tls_py.a == a) {
            memcpy(w + n, tls_py.w, tls_py.n * sizeof *w);
            n += tls_py.n;
        } else if (py_running() && py_holds_gil()) {
            n += py_walk(w + n, PY_MAX);
        }
    }
    return depot_intern(h->dep, w, n);
}

__attribute__((noinline)) void vmm_history_add(vmm_allocator *a, int action, uintptr_t addr,
                                               size_t size, vmm_stream s)
{
    struct vmm_history *h = a->history;
    size_t i = h->head + h->n;
    if (i >= h->cap)
        i -= h->cap;
    if (h->n == h->cap) { /* full: overwrite the oldest */
        h->head = h->head + 1 == h->cap ? 0 : h->head + 1;
    } else {
        h->n++;
    }
    vmm_trace_entry *e = &h->ring[i];
    e->action = action;
    e->addr = addr;
    e->size = size;
    e->stream = s;
    e->time_us = (uint64_t)((int64_t)vmm_history_now_ns() + epoch_offset_ns) / 1000u;
    if (!h->ids)
        return;
    /* PyTorch's context levels: "state" keeps frames for live blocks and segments only, "alloc"
     * adds them to the trace entries of allocations, "all" (the default) to frees too. */
    int trace = !(h->flags & VMM_HISTORY_CONTEXT_STATE);
    int frees = trace && !(h->flags & VMM_HISTORY_CONTEXT_ALLOC);
    uint32_t id = 0;
    switch (action) {
    case VMM_TRACE_ALLOC:
        id = capture_stack(a, h);
        map_put(&h->map, addr, id);
        id = trace ? id : 0;
        break;
    case VMM_TRACE_FREE_REQUESTED:
        id = frees ? capture_stack(a, h) : 0;
        break;
    case VMM_TRACE_FREE_COMPLETED: /* may come from a later call: the block's alloc stack, as PyTorch */
        id = map_take(&h->map, addr);
        id = frees ? id : 0;
        break;
    case VMM_TRACE_SEGMENT_ALLOC:
    case VMM_TRACE_SEGMENT_MAP:
        id = capture_stack(a, h);
        map_put(&h->map, addr | 1u, id);
        id = trace ? id : 0;
        break;
    case VMM_TRACE_SEGMENT_FREE:
    case VMM_TRACE_SEGMENT_UNMAP:
        map_take(&h->map, addr | 1u);
        id = frees ? capture_stack(a, h) : 0;
        break;
    default:
        id = trace ? capture_stack(a, h) : 0;
        break;
    }
    h->ids[i] = id;
}

/* Index in the ring of the j-th of the newest k entries, oldest first. */
static size_t ring_index(const struct vmm_history *h, size_t k, size_t j)
{
    size_t i = h->head + (h->n - k) + j;
    return i >= h->cap ? i - h->cap : i;
}

/* Copy the newest min(n, max) entries (and their stack ids when ids is not NULL), oldest first. */
static size_t ring_copy(const struct vmm_history *h, vmm_trace_entry *out, uint32_t *ids, size_t max)
{
    size_t k = h->n < max ? h->n : max;
    for (size_t j = 0; j < k; j++) {
        size_t i = ring_index(h, k, j);
        out[j] = h->ring[i];
        if (ids)
            ids[j] = h->ids ? h->ids[i] : 0;
    }
    return k;
}

static void history_free(vmm_allocator *a, struct vmm_history *h)
{
    if (!h)
        return;
    if (h->flags & VMM_HISTORY_STACKS_PYTHON)
        atomic_fetch_sub(&vmm_history_py_users, 1);
    depot_free(h->dep);
    free(h->map.keys);
    free(h->map.vals);
    free(h->ids);
    vmm_meta_free(a->meta, h->ring, h->cap * sizeof *h->ring);
    vmm_meta_free(a->meta, h, sizeof *h);
}

VMM_API int vmm_record_history(vmm_allocator *a, size_t max_entries)
{
    return vmm_record_history_ex(a, max_entries, 0);
}

VMM_API int vmm_record_history_ex(vmm_allocator *a, size_t max_entries, unsigned flags)
{
    if (!a)
        return vmm_fail(VMM_EINVAL, "vmm_record_history: allocator is NULL");
    if (max_entries > SIZE_MAX / sizeof(vmm_trace_entry) || max_entries > UINT32_MAX)
        return vmm_fail(VMM_EINVAL, "vmm_record_history: %zu entries is too many", max_entries);
    if (flags & ~(unsigned)(VMM_HISTORY_STACKS_ALL | VMM_HISTORY_CONTEXT_STATE | VMM_HISTORY_CONTEXT_ALLOC))
        return vmm_fail(VMM_EINVAL, "vmm_record_history: unknown flags 0x%x", flags);
    if ((flags & VMM_HISTORY_CONTEXT_STATE) && (flags & VMM_HISTORY_CONTEXT_ALLOC))
        return vmm_fail(VMM_EINVAL, "vmm_record_history: context state and alloc are exclusive");
    pthread_once(&epoch_once, epoch_init);
    unsigned stacks = flags & VMM_HISTORY_STACKS_ALL;
    if (stacks & VMM_HISTORY_STACKS_PYTHON) {
        pthread_once(&py_once, py_resolve);
        if (!py.ok)
            return vmm_fail(VMM_ENOTSUP, "vmm_record_history: Python stacks need a process running "
                                         "CPython 3.10 or later (its C API was not found)");
    }
    if (stacks & VMM_HISTORY_STACKS_NATIVE)
        pthread_once(&unwind_once, unwind_init); /* may dlopen: not under the lock */
    struct vmm_history *h = NULL;
    if (max_entries) {
        /* allocated outside the lock; a large ring can take a while to zero */
        h = vmm_meta_alloc(a->meta, sizeof *h);
        vmm_trace_entry *ring = vmm_meta_alloc(a->meta, max_entries * sizeof *ring);
        uint32_t *ids = stacks ? calloc(max_entries, sizeof *ids) : NULL;
        depot *dep = stacks ? calloc(1, sizeof *dep) : NULL;
        if (!h || !ring || (stacks && (!ids || !dep))) {
            if (h)
                vmm_meta_free(a->meta, h, sizeof *h);
            if (ring)
                vmm_meta_free(a->meta, ring, max_entries * sizeof *ring);
            free(ids);
            free(dep);
            return vmm_fail(VMM_EHOSTMEM, "vmm_record_history: out of host memory for %zu entries",
                            max_entries);
        }
        h->ring = ring;
        h->ids = ids;
        h->dep = dep;
        h->cap = max_entries;
        h->flags = flags;
        if (stacks & VMM_HISTORY_STACKS_PYTHON)
            atomic_fetch_add(&vmm_history_py_users, 1);
    }
    vmm_lock(a);
    struct vmm_history *old = a->history;
    if (h && old) {
        h->n = ring_copy(old, h->ring, h->ids, h->cap);
        if (h->dep && old->dep) {
            /* keep the stacks (ids stay valid) and the block map of the old ring */
            depot_free(h->dep);
            h->dep = old->dep;
            old->dep = NULL;
            h->map = old->map;
            old->map = (addr_map){0};
        } else if (!h->dep) {
            /* no stacks from now on; frames of entries copied over are dropped */
        } else {
            memset(h->ids, 0, h->cap * sizeof *h->ids);
        }
    }
    vmm_tc_off(a); /* every event must pass under the lock to be recorded */
    a->hooks.trace = vmm_history_add; /* VMM_HISTORY (core/trace.h) records through it */
    a->history = h;
    vmm_unlock(a);
    history_free(a, old);
    return VMM_OK;
}

int vmm_history_copy_ex(vmm_allocator *a, vmm_trace_entry **out, uint32_t **ids, size_t *n)
{
    *out = NULL;
    if (ids)
        *ids = NULL;
    *n = 0;
    struct vmm_history *h = a->history;
    if (!h || !h->n)
        return VMM_OK;
    vmm_trace_entry *e = malloc(h->n * sizeof *e);
    uint32_t *d = ids ? malloc(h->n * sizeof *d) : NULL;
    if (!e || (ids && !d)) {
        free(e);
        free(d);
        return VMM_EHOSTMEM;
    }
    *n = ring_copy(h, e, d, h->n);
    *out = e;
    if (ids)
        *ids = d;
    return VMM_OK;
}

int vmm_history_copy(vmm_allocator *a, vmm_trace_entry **out, size_t *n)
{
    /* internal.h promises memory from vmm_meta_alloc */
    *out = NULL;
    *n = 0;
    struct vmm_history *h = a->history;
    if (!h || !h->n)
        return VMM_OK;
    vmm_trace_entry *e = vmm_meta_alloc(a->meta, h->n * sizeof *e);
    if (!e)
        return VMM_EHOSTMEM;
    *out = e;
    *n = ring_copy(h, e, NULL, h->n);
    return VMM_OK;
}

uint32_t vmm_history_block_stack(const vmm_allocator *a, uintptr_t block_addr)
{
    const struct vmm_history *h = a->history;
    return h && h->dep ? map_get(&h->map, block_addr) : 0;
}

uint32_t vmm_history_segment_stack(const vmm_allocator *a, uintptr_t seg_addr)
{
    const struct vmm_history *h = a->history;
    return h && h->dep ? map_get(&h->map, seg_addr | 1u) : 0;
}

size_t vmm_history_stack_words(const vmm_allocator *a, uint32_t id, uint64_t *out, size_t max)
{
    const struct vmm_history *h = a->history;
    if (!id || !h || !h->dep || id > h->dep->n_w)
        return 0;
    const uint64_t *r = &h->dep->w[id - 1];
    size_t n = (size_t)(r[0] >> 32);
    memcpy(out, r + 1, (n < max ? n : max) * sizeof *out);
    return n;
}

VMM_API int64_t vmm_history_get(vmm_allocator *a, vmm_trace_entry *out, size_t max)
{
    if (!a || (!out && max))
        return vmm_fail(VMM_EINVAL, "vmm_history_get: %s is NULL", a ? "out" : "allocator");
    vmm_lock(a);
    size_t n = 0;
    if (a->history) {
        n = a->history->n;
        ring_copy(a->history, out, NULL, max);
    }
    vmm_unlock(a);
    return (int64_t)n;
}

VMM_API int vmm_history_csv(vmm_allocator *a, const char *path)
{
    if (!a || !path)
        return vmm_fail(VMM_EINVAL, "vmm_history_csv: %s is NULL", a ? "path" : "allocator");
    vmm_lock(a);
    vmm_trace_entry *e = NULL;
    size_t n = 0;
    int rc = vmm_history_copy_ex(a, &e, NULL, &n);
    vmm_unlock(a);
    if (rc)
        return vmm_fail(VMM_EHOSTMEM, "vmm_history_csv: out of host memory for a copy of the ring");
    FILE *f = fopen(path, "w");
    if (!f) {
        int err = errno;
        free(e);
        return vmm_fail(VMM_EINVAL, "vmm_history_csv: cannot write %s: %s", path, strerror(err));
    }
    fputs("action,addr,size,stream,time_us\n", f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, "%s,0x%" PRIxPTR ",%zu,0x%" PRIxPTR ",%" PRIu64 "\n",
                vmm_trace_action_name(e[i].action), e[i].addr, e[i].size, (uintptr_t)e[i].stream,
                e[i].time_us);
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    free(e);
    if (bad)
        return vmm_fail(VMM_EINVAL, "vmm_history_csv: error writing %s", path);
    return VMM_OK;
}

void vmm_history_destroy(vmm_allocator *a)
{
    history_free(a, a->history);
    a->history = NULL;
}

/* ---- symbolization ----------------------------------------------------------------------------- */

typedef struct sym_entry {
    uintptr_t pc;
    const char *filename, *name;
    int own, interp;   /* in this library / in the Python interpreter */
} sym_entry;

struct vmm_symcache {
    sym_entry *e;      /* open addressing by pc (0 empty) */
    size_t cap, n;
    char **strs;       /* interned strings (open addressing by content) */
    size_t str_cap, str_n;
    uintptr_t own_base, py_base;
    int own_is_shared;
    char *(*demangle)(const char *, char *, size_t *, int *);
};

static uint64_t hash_str(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The one copy of s in the cache (NULL when out of memory). */
static const char *intern(vmm_symcache *c, const char *s)
{
    if ((c->str_n + 1) * 2 > c->str_cap) {
        size_t nc = c->str_cap ? c->str_cap * 2 : 256;
        char **ns = calloc(nc, sizeof *ns);
        if (!ns)
            return NULL;
        for (size_t i = 0; i < c->str_cap; i++) {
            if (!c->strs[i])
                continue;
            size_t j = hash_str(c->strs[i]) & (nc - 1);
            while (ns[j])
                j = (j + 1) & (nc - 1);
            ns[j] = c->strs[i];
        }
        free(c->strs);
        c->strs = ns;
        c->str_cap = nc;
    }
    size_t j = hash_str(s) & (c->str_cap - 1);
    for (; c->strs[j]; j = (j + 1) & (c->str_cap - 1))
        if (strcmp(c->strs[j], s) == 0)
            return c->strs[j];
    char *d = strdup(s);
    if (!d)
        return NULL;
    c->strs[j] = d;
    c->str_n++;
    return d;
}

static void own_anchor(void) {}

vmm_symcache *vmm_symcache_new(void)
{
    vmm_symcache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    Dl_info di;
    if (dladdr((void *)(uintptr_t)&own_anchor, &di) && di.dli_fbase) {
        c->own_base = (uintptr_t)di.dli_fbase;
        const char *base = di.dli_fname ? strrchr(di.dli_fname, '/') : NULL;
        base = base ? base + 1 : di.dli_fname;
        /* only the shared library's frames are dropped: a static link shares its object with the
         * program's own code */
        c->own_is_shared = base && strncmp(base, "libvmmalloc.so", 14) == 0;
    }
    pthread_once(&py_once, py_resolve);
    if (py.ok && dladdr((void *)(uintptr_t)py.Eval_GetFrame, &di) && di.dli_fbase)
        c->py_base = (uintptr_t)di.dli_fbase;
    *(void **)&c->demangle = dlsym(RTLD_DEFAULT, "__cxa_demangle");
    return c;
}

void vmm_symcache_free(vmm_symcache *c)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->str_cap; i++)
        free(c->strs[i]);
    free(c->strs);
    free(c->e);
    free(c);
}

static char exe_path[4096];
static pthread_once_t exe_once = PTHREAD_ONCE_INIT;
static void exe_init(void)
{
    ssize_t k = readlink("/proc/self/exe", exe_path, sizeof exe_path - 1);
    exe_path[k > 0 ? k : 0] = '\0';
}

/* Symbolize one return address into the cache. NULL when out of memory. */
static const sym_entry *sym_lookup(vmm_symcache *c, uintptr_t pc)
{
    if ((c->n + 1) * 2 > c->cap) {
        size_t nc = c->cap ? c->cap * 2 : 1024;
        sym_entry *ne = calloc(nc, sizeof *ne);
        if (!ne)
            return NULL;
        for (size_t i = 0; i < c->cap; i++) {
            if (!c->e[i].pc)
                continue;
            size_t j = map_hash(c->e[i].pc, nc);
            while (ne[j].pc)
                j = (j + 1) & (nc - 1);
            ne[j] = c->e[i];
        }
        free(c->e);
        c->e = ne;
        c->cap = nc;
    }
    size_t j = map_hash(pc, c->cap);
    for (; c->e[j].pc; j = (j + 1) & (c->cap - 1))
        if (c->e[j].pc == pc)
            return &c->e[j];
    /* a return address points after the call: look up the call itself */
    Dl_info di;
    const ElfW(Sym) *sym = NULL;
    sym_entry s = {.pc = pc};
    char name[512];
    const char *file = "??";
    if (dladdr1((void *)(pc - 1), &di, (void **)&sym, RTLD_DL_SYMENT) && di.dli_fbase) {
        file = di.dli_fname && di.dli_fname[0] ? di.dli_fname : NULL;
        if (!file) {
            pthread_once(&exe_once, exe_init);
            file = exe_path[0] ? exe_path : "??";
        }
        s.own = c->own_is_shared && (uintptr_t)di.dli_fbase == c->own_base;
        s.interp = c->py_base && (uintptr_t)di.dli_fbase == c->py_base;
        /* dladdr answers with the nearest exported symbol below pc: it is pc's function only when
         * pc lies inside it (a static function has no entry of its own) */
        uintptr_t start = (uintptr_t)di.dli_saddr;
        if (di.dli_sname && sym && pc - 1 >= start && pc - 1 < start + sym->st_size) {
            char *dm = NULL;
            int status = -1;
            if (c->demangle && di.dli_sname[0] == '_' && di.dli_sname[1] == 'Z')
                dm = c->demangle(di.dli_sname, NULL, NULL, &status);
            snprintf(name, sizeof name, "%s", dm && status == 0 ? dm : di.dli_sname);
            free(dm);
        } else {
            snprintf(name, sizeof name, "?? (+0x%" PRIxPTR ")", pc - (uintptr_t)di.dli_fbase);
        }
    } else {
        snprintf(name, sizeof name, "?? (0x%" PRIxPTR ")", pc);
    }
    s.filename = intern(c, file);
    s.name = intern(c, name);
    if (!s.filename || !s.name)
        return NULL;
    c->e[j] = s;
    c->n++;
    return &c->e[j];
}

long vmm_symbolize(vmm_symcache *c, const uint64_t *words, size_t n, vmm_frame *out, size_t max)
{
    size_t k = 0, npy = 0;
    for (size_t i = 0; i < n; i++)
        npy += (words[i] & VMM_FRAME_PY) != 0;
    int leading = 1;
    for (size_t i = 0; i < n && k < max; i++) {
        if (words[i] & VMM_FRAME_PY)
            break;
        const sym_entry *s = sym_lookup(c, (uintptr_t)words[i]);
        if (!s)
            return -1;
        if (leading && s->own)
            continue; /* vmmalloc's own frames: the caller is what matters */
        leading = 0;
        if (npy && s->interp)
            break; /* the interpreter: its Python frames follow */
        out[k++] = (vmm_frame){s->filename, s->name, 0};
    }
    if (!npy)
        return (long)k;
    pthread_mutex_lock(&code_mu);
    for (size_t i = 0; i < n && k < max; i++) {
        if (!(words[i] & VMM_FRAME_PY))
            continue;
        uint64_t ci = (words[i] & ~VMM_FRAME_PY) >> PY_LINE_BITS;
        int64_t line = (int64_t)(words[i] & ((1u << PY_LINE_BITS) - 1));
        if (ci < n_codes)
            out[k++] = (vmm_frame){codes[ci].filename, codes[ci].name, line};
    }
    pthread_mutex_unlock(&code_mu);
    return (long)k;
}
