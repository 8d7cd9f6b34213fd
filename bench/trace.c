/*
 * Trace readers for vmm-bench: PyTorch's flattened device trace CSV, RMM's log CSV, a PyTorch
 * snapshot pickle (through snapshot_to_trace.py), and a synthetic generator.
 *
 * Addresses are resolved to dense allocation ids while reading (a map from live address to id),
 * so a replay only indexes an array. Frees of addresses not live in the trace (allocated before the
 * recording began) are dropped here and counted.
 */
#include <errno.h>
#include <math.h>
#include <spawn.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench.h"

extern char **environ;

#ifndef BENCH_SCRIPT_DIR
#define BENCH_SCRIPT_DIR "bench/scripts"
#endif

/* ---- live address -> id map: open addressing, linear probing, backward-shift deletion ------- */
typedef struct addr_map {
    uint64_t *keys; /* address + 1, so 0 marks an empty slot */
    uint32_t *vals;
    uint64_t *sizes;
    size_t cap, n;
} addr_map;

static size_t addr_hash(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static void map_grow(addr_map *m);

static void map_put(addr_map *m, uint64_t addr, uint32_t id, uint64_t size)
{
    if (2 * (m->n + 1) > m->cap)
        map_grow(m);
    size_t i = addr_hash(addr, m->cap);
    while (m->keys[i])
        i = (i + 1) & (m->cap - 1);
    m->keys[i] = addr + 1;
    m->vals[i] = id;
    m->sizes[i] = size;
    m->n++;
}

static void map_grow(addr_map *m)
{
    addr_map old = *m;
    m->cap = old.cap ? old.cap * 2 : 1024;
    m->keys = calloc(m->cap, sizeof *m->keys);
    m->vals = bench_xmalloc(m->cap * sizeof *m->vals);
    m->sizes = bench_xmalloc(m->cap * sizeof *m->sizes);
    if (!m->keys) {
        fprintf(stderr, "vmm-bench: out of host memory\n");
        exit(BENCH_EXIT_FAIL);
    }
    m->n = 0;
    for (size_t i = 0; i < old.cap; i++)
        if (old.keys[i])
            map_put(m, old.keys[i] - 1, old.vals[i], old.sizes[i]);
    free(old.keys);
    free(old.vals);
    free(old.sizes);
}

/* Remove addr; returns 1 and its id/size when it was live. */
static int map_take(addr_map *m, uint64_t addr, uint32_t *id, uint64_t *size)
{
    if (!m->cap)
        return 0;
    size_t i = addr_hash(addr, m->cap);
    while (m->keys[i] && m->keys[i] != addr + 1)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        return 0;
    *id = m->vals[i];
    *size = m->sizes[i];
    /* Backward shift: pull later entries of the probe run into the hole. */
    size_t hole = i;
    for (size_t j = (i + 1) & (m->cap - 1); m->keys[j]; j = (j + 1) & (m->cap - 1)) {
        size_t home = addr_hash(m->keys[j] - 1, m->cap);
        int movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
        if (movable) {
            m->keys[hole] = m->keys[j];
            m->vals[hole] = m->vals[j];
            m->sizes[hole] = m->sizes[j];
            hole = j;
        }
    }
    m->keys[hole] = 0;
    m->n--;
    return 1;
}

static void map_free(addr_map *m)
{
    free(m->keys);
    free(m->vals);
    free(m->sizes);
    memset(m, 0, sizeof *m);
}

/* ---- building a trace ------------------------------------------------------------------------ */
typedef struct builder {
    bench_trace *t;
    addr_map live;
    uint64_t live_bytes;
} builder;

static void push(bench_trace *t, uint8_t op, uint32_t id, uint64_t size, uint16_t stream)
{
    if (t->n == t->cap) {
        t->cap = t->cap ? t->cap * 2 : 4096;
        t->ev = bench_xrealloc(t->ev, t->cap * sizeof *t->ev);
    }
    t->ev[t->n++] = (bench_event){.size = size, .id = id, .stream = stream, .op = op};
}

/* Index of a trace stream id, adding it on first sight. -1 when there are too many streams. */
static int stream_index(bench_trace *t, int64_t s)
{
    for (uint32_t i = 0; i < t->n_streams; i++)
        if (t->streams[i] == s)
            return (int)i;
    if (t->n_streams == UINT16_MAX)
        return -1;
    t->streams = bench_xrealloc(t->streams, (t->n_streams + 1) * sizeof *t->streams);
    t->streams[t->n_streams] = s;
    return (int)t->n_streams++;
}

/* Index of a private pool id, adding it on first sight. */
static uint32_t pool_index(bench_trace *t, uint64_t id0, uint64_t id1)
{
    for (uint32_t i = 0; i < t->n_pools; i++)
        if (t->pools[i][0] == id0 && t->pools[i][1] == id1)
            return i;
    t->pools = bench_xrealloc(t->pools, (t->n_pools + 1) * sizeof *t->pools);
    t->pools[t->n_pools][0] = id0;
    t->pools[t->n_pools][1] = id1;
    return t->n_pools++;
}

static void on_free(builder *b, uint64_t addr)
{
    uint32_t id;
    uint64_t size;
    if (!map_take(&b->live, addr, &id, &size)) {
        b->t->skipped_frees++;
        return;
    }
    /* The free goes to the allocation's stream: that is the block's owner in both allocators. */
    push(b->t, BENCH_OP_FREE, id, size, 0);
    b->live_bytes -= size;
}

static void on_alloc(builder *b, uint64_t addr, uint64_t size, uint16_t stream)
{
    uint32_t id;
    uint64_t old;
    if (map_take(&b->live, addr, &id, &old)) {
        /* A missing free: the recording lost it. Free the old block first so the replay goes on. */
        push(b->t, BENCH_OP_FREE, id, old, 0);
        b->live_bytes -= old;
        b->t->implicit_frees++;
    }
    id = b->t->n_ids++;
    map_put(&b->live, addr, id, size);
    push(b->t, BENCH_OP_ALLOC, id, size, stream);
    b->live_bytes += size;
    if (b->live_bytes > b->t->peak_live)
        b->t->peak_live = b->live_bytes;
}

/* ---- CSV parsing ----------------------------------------------------------------------------- */
enum { MAX_FIELDS = 8 };

static int split(char *line, char **f)
{
    size_t len = strlen(line);
    while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
        line[--len] = 0;
    int n = 0;
    char *p = line;
    for (;;) {
        if (n == MAX_FIELDS)
            return MAX_FIELDS + 1;
        f[n++] = p;
        char *c = strchr(p, ',');
        if (!c)
            break;
        *c = 0;
        p = c + 1;
    }
    return n;
}

static int parse_u64(const char *s, int base, uint64_t *out)
{
    char *end;
    while (*s == ' ')
        s++;
    if (!*s || *s == '-')
        return -1;
    if (base == 16 && (s[0] == '0' && (s[1] == 'x' || s[1] == 'X')))
        s += 2;
    else if (base == 10 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X'))
        base = 16, s += 2;
    errno = 0;
    unsigned long long v = strtoull(s, &end, base);
    while (*end == ' ')
        end++;
    if (errno || *end || end == s)
        return -1;
    *out = v;
    return 0;
}

static int parse_i64(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || *end || end == s)
        return -1;
    *out = v;
    return 0;
}

typedef enum { FMT_PYTORCH, FMT_RMM } csv_format;

static int bad_line(const char *path, uint64_t line, const char *what, const char *field)
{
    fprintf(stderr, "vmm-bench: %s: line %llu: %s%s%s%s\n", path, (unsigned long long)line, what,
            field ? " ('" : "", field ? field : "", field ? "')" : "");
    return BENCH_EXIT_INPUT;
}

static int parse_pytorch(builder *b, char **f, int nf, const char *path, uint64_t line)
{
    if (nf != 4 && nf != 5)
        return bad_line(path, line, "expected 4 or 5 fields: action,addr,size,stream[,time_us]", NULL);
    const char *a = f[0];
    int is_alloc = !strcmp(a, "alloc"), is_free = !strcmp(a, "free_completed");
    int pool_op = !strcmp(a, "pool_begin") ? BENCH_OP_POOL_BEGIN
                  : !strcmp(a, "pool_end") ? BENCH_OP_POOL_END
                  : !strcmp(a, "pool_release") ? BENCH_OP_POOL_RELEASE : 0;
    if (!is_alloc && !is_free && !pool_op && strcmp(a, "free_requested") && strncmp(a, "segment_", 8) &&
        strcmp(a, "snapshot") && strcmp(a, "oom"))
        return bad_line(path, line, "unknown action", a);
    uint64_t addr, size;
    int64_t stream, time_us;
    if (parse_u64(f[1], 10, &addr))
        return bad_line(path, line, "bad address", f[1]);
    if (parse_u64(f[2], 10, &size))
        return bad_line(path, line, "bad size", f[2]);
    if (parse_i64(f[3], &stream))
        return bad_line(path, line, "bad stream", f[3]);
    if (nf == 5 && f[4][0] && parse_i64(f[4], &time_us))
        return bad_line(path, line, "bad time_us", f[4]);
    if (pool_op) {
        /* capture segments: addr and size carry the pool id */
        int s = stream_index(b->t, stream);
        if (s < 0)
            return bad_line(path, line, "more than 65535 streams", NULL);
        if (!addr && !size)
            return bad_line(path, line, "pool id (0, 0) names the default pools", NULL);
        push(b->t, (uint8_t)pool_op, pool_index(b->t, addr, size), 0, (uint16_t)s);
    } else if (is_alloc) {
        int s = stream_index(b->t, stream);
        if (s < 0)
            return bad_line(path, line, "more than 65535 streams", NULL);
        on_alloc(b, addr, size, (uint16_t)s);
    } else if (is_free) {
        on_free(b, addr);
    } else {
        b->t->ignored++;
    }
    return 0;
}

static int parse_rmm(builder *b, char **f, int nf, const char *path, uint64_t line)
{
    if (nf != 6)
        return bad_line(path, line, "expected 6 fields: Thread,Time,Action,Pointer,Size,Stream", NULL);
    const char *a = f[2];
    uint64_t addr, size, stream;
    if (parse_u64(f[3], 16, &addr))
        return bad_line(path, line, "bad pointer (hex)", f[3]);
    if (parse_u64(f[4], 10, &size))
        return bad_line(path, line, "bad size", f[4]);
    if (parse_u64(f[5], 16, &stream))
        return bad_line(path, line, "bad stream", f[5]);
    if (!strcmp(a, "allocate")) {
        int s = stream_index(b->t, (int64_t)stream);
        if (s < 0)
            return bad_line(path, line, "more than 65535 streams", NULL);
        on_alloc(b, addr, size, (uint16_t)s);
    } else if (!strcmp(a, "free")) {
        on_free(b, addr);
    } else if (!strcmp(a, "allocate failure")) {
        b->t->failed_allocs++;
    } else {
        return bad_line(path, line, "unknown action (allocate, allocate failure, free)", a);
    }
    return 0;
}

static int parse_stream(FILE *fp, const char *path, bench_trace *t)
{
    builder b = {.t = t};
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    uint64_t lineno = 0;
    csv_format fmt = FMT_PYTORCH;
    int rc = BENCH_EXIT_OK;
    char *f[MAX_FIELDS];

    if ((len = getline(&line, &cap, fp)) < 0) {
        fprintf(stderr, "vmm-bench: %s: empty file, expected a trace CSV header\n", path);
        free(line);
        return BENCH_EXIT_INPUT;
    }
    lineno = 1;
    int nf = split(line, f);
    if (nf >= 4 && !strcmp(f[0], "action") && !strcmp(f[1], "addr") && !strcmp(f[2], "size") &&
        !strcmp(f[3], "stream") && (nf == 4 || (nf == 5 && !strcmp(f[4], "time_us")))) {
        fmt = FMT_PYTORCH;
        if (!t->format)
            t->format = "pytorch-csv";
    } else if (nf == 6 && !strcmp(f[0], "Thread") && !strcmp(f[1], "Time") &&
               !strcmp(f[2], "Action") && !strcmp(f[3], "Pointer") && !strcmp(f[4], "Size") &&
               !strcmp(f[5], "Stream")) {
        fmt = FMT_RMM;
        t->format = "rmm-csv";
    } else {
        fprintf(stderr,
                "vmm-bench: %s: line 1: unrecognized header; expected "
                "'action,addr,size,stream[,time_us]' (PyTorch trace CSV), "
                "'Thread,Time,Action,Pointer,Size,Stream' (RMM log) or a snapshot pickle\n",
                path);
        free(line);
        return BENCH_EXIT_INPUT;
    }
    /* Stream 0 is always index 0, so an event's stream index 0 means the default stream. */
    if (stream_index(t, 0) != 0)
        abort();
    while ((len = getline(&line, &cap, fp)) >= 0) {
        lineno++;
        if (len == 0 || line[0] == '\n' || (line[0] == '\r' && line[1] == '\n'))
            continue;
        if (memchr(line, 0, (size_t)len)) {
            rc = bad_line(path, lineno, "binary data in a text trace", NULL);
            break;
        }
        nf = split(line, f);
        t->lines++;
        rc = fmt == FMT_PYTORCH ? parse_pytorch(&b, f, nf, path, lineno)
                                : parse_rmm(&b, f, nf, path, lineno);
        if (rc)
            break;
    }
    if (!rc && ferror(fp)) {
        fprintf(stderr, "vmm-bench: %s: read error after line %llu\n", path,
                (unsigned long long)lineno);
        rc = BENCH_EXIT_FAIL;
    }
    free(line);
    map_free(&b.live);
    return rc;
}

/* A snapshot pickle: run the converter (Python standard library only, refuses every class) and
 * read its CSV from a pipe. */
static int load_pickle(const char *path, bench_trace *t)
{
    const char *script = getenv("VMM_BENCH_CONVERTER");
    if (!script)
        script = BENCH_SCRIPT_DIR "/snapshot_to_trace.py";
    int fd[2];
    if (pipe(fd)) {
        perror("vmm-bench: pipe");
        return BENCH_EXIT_FAIL;
    }
    /* posix_spawn, not fork: no atfork handlers run (jemalloc's take every arena lock). */
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd[1], STDOUT_FILENO);
    posix_spawn_file_actions_addclose(&fa, fd[0]);
    posix_spawn_file_actions_addclose(&fa, fd[1]);
    char *argv[] = {"python3", (char *)script, (char *)path, NULL};
    pid_t pid;
    fflush(NULL);
    int serr = posix_spawnp(&pid, "python3", &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (serr) {
        fprintf(stderr, "vmm-bench: cannot run python3 %s: %s\n", script, strerror(serr));
        close(fd[0]);
        close(fd[1]);
        return BENCH_EXIT_FAIL;
    }
    close(fd[1]);
    FILE *fp = fdopen(fd[0], "r");
    if (!fp) {
        close(fd[0]);
        waitpid(pid, NULL, 0);
        return BENCH_EXIT_FAIL;
    }
    t->format = "pytorch-snapshot";
    int rc = parse_stream(fp, path, t);
    /* Drain so the converter never blocks on a full pipe after an early parse error. */
    char sink[4096];
    while (fread(sink, 1, sizeof sink, fp) > 0) {
    }
    fclose(fp);
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "vmm-bench: %s: snapshot conversion failed (%s exited %d)\n", path, script,
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        return WIFEXITED(status) && WEXITSTATUS(status) == 2 ? BENCH_EXIT_INPUT : BENCH_EXIT_FAIL;
    }
    return rc;
}

int bench_trace_load(const char *path, bench_trace *t)
{
    memset(t, 0, sizeof *t);
    FILE *fp = fopen(path, "r");
    if (!fp) {
        fprintf(stderr, "vmm-bench: cannot open %s: %s\n", path, strerror(errno));
        return BENCH_EXIT_INPUT;
    }
    int c = fgetc(fp);
    int rc;
    if (c == 0x80) { /* pickle protocol 2+ opcode PROTO */
        fclose(fp);
        rc = load_pickle(path, t);
    } else {
        if (c != EOF)
            ungetc(c, fp);
        rc = parse_stream(fp, path, t);
        fclose(fp);
    }
    if (rc)
        bench_trace_free(t);
    return rc;
}

void bench_trace_synthetic(bench_trace *t, uint64_t n, uint64_t seed)
{
    memset(t, 0, sizeof *t);
    t->format = "synthetic";
    builder b = {.t = t};
    stream_index(t, 0);
    stream_index(t, 1);
    /* A live set that hovers around 1000 blocks, like a training step's activations and
     * temporaries; sizes log-uniform from 512 B to 64 MiB, 512-byte aligned like PyTorch's. */
    enum { TARGET_LIVE = 1000 };
    uint64_t *live = bench_xmalloc(4 * TARGET_LIVE * sizeof *live);
    size_t n_live = 0;
    uint64_t next_addr = 1ull << 40, rng = seed;
    t->ev = bench_xmalloc((size_t)n * sizeof *t->ev);
    t->cap = (size_t)n;
    while (t->n < n) {
        uint64_t r = bench_rand(&rng);
        int room = t->n + n_live + 1 < n; /* leave room to free everything by the end */
        int alloc = room && n_live < 4 * TARGET_LIVE - 1 &&
                    (n_live == 0 || (r % 1000) < (n_live < TARGET_LIVE ? 600u : 400u));
        if (alloc) {
            double u = (double)(bench_rand(&rng) >> 11) / 9007199254740992.0;
            uint64_t size = (uint64_t)exp(log(512.0) + u * (log(64.0 * BENCH_MiB) - log(512.0)));
            size = (size + 511) / 512 * 512;
            uint64_t addr = next_addr;
            next_addr += size + 512;
            on_alloc(&b, addr, size, (uint16_t)(bench_rand(&rng) % 8 == 0));
            live[n_live++] = addr;
        } else {
            if (n_live == 0)
                break; /* one slot left and nothing to free: stop one event short */
            size_t i = (size_t)(bench_rand(&rng) % n_live);
            on_free(&b, live[i]);
            live[i] = live[--n_live];
        }
    }
    t->lines = t->n;
    free(live);
    map_free(&b.live);
}

int bench_trace_write_csv(const bench_trace *t, const char *path)
{
    FILE *fp = fopen(path, "w");
    if (!fp) {
        fprintf(stderr, "vmm-bench: cannot create %s: %s\n", path, strerror(errno));
        return BENCH_EXIT_FAIL;
    }
    /* Made-up addresses: id-spaced, so every live block has its own. */
    uint16_t *stream_of = bench_xmalloc((t->n_ids ? t->n_ids : 1) * sizeof *stream_of);
    fprintf(fp, "action,addr,size,stream,time_us\n");
    for (size_t i = 0; i < t->n; i++) {
        const bench_event *e = &t->ev[i];
        if (e->op >= BENCH_OP_POOL_BEGIN) {
            static const char *const names[] = {"pool_begin", "pool_end", "pool_release"};
            fprintf(fp, "%s,%llu,%llu,%lld,%zu\n", names[e->op - BENCH_OP_POOL_BEGIN],
                    (unsigned long long)t->pools[e->id][0], (unsigned long long)t->pools[e->id][1],
                    (long long)t->streams[e->stream], i);
            continue;
        }
        if (e->op == BENCH_OP_ALLOC)
            stream_of[e->id] = e->stream;
        fprintf(fp, "%s,%llu,%llu,%lld,%zu\n", e->op == BENCH_OP_ALLOC ? "alloc" : "free_completed",
                (unsigned long long)(4096 + (uint64_t)e->id * 512), (unsigned long long)e->size,
                (long long)t->streams[stream_of[e->id]], i);
    }
    free(stream_of);
    int bad = ferror(fp);
    if (fclose(fp) || bad) {
        fprintf(stderr, "vmm-bench: write error on %s\n", path);
        return BENCH_EXIT_FAIL;
    }
    return BENCH_EXIT_OK;
}

void bench_trace_free(bench_trace *t)
{
    free(t->ev);
    free(t->streams);
    free(t->pools);
    memset(t, 0, sizeof *t);
}
