/*
 * Configuration: "key:value,key:value" strings (PyTorch's PYTORCH_CUDA_ALLOC_CONF syntax, jemalloc's
 * MALLOC_CONF idea). One table below describes every key: its parser, its formatter, its default
 * and its documentation. docs/user-guide.md mirrors this table.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "base/errors.h"
#include "core/config.h"
#include "driver/driver.h"

enum {
    KEY_MAX = 64,          /* longest key we accept, for messages */
    CONF_ENV_MAX = 4096,   /* longest VMMALLOC_CONF we parse */
    MAX_SPLIT_MIN_MB = 20, /* PyTorch refuses max_split_size_mb at or below this (its large segment) */
};

/* A value token: [s, s+len). */
typedef struct token {
    const char *s;
    size_t len;
} token;

typedef int (*opt_parse_fn)(vmm_config *c, const char *key, token v);
typedef int (*opt_format_fn)(const vmm_config *c, char *buf, size_t len);

typedef struct option_desc {
    const char *key;
    opt_parse_fn parse;  /* NULL: a true/false key, the int at `flag` */
    opt_format_fn format;
    const char *doc;     /* shown by docs; default included */
    size_t flag;         /* true/false keys: offsetof the int in vmm_config (FLAG) */
} option_desc;

/* The options table's entries: a key with its parser and formatter, or a true/false key and its
 * field (an int in vmm_config: anything else is refused at compile time). */
#define OPT(key, parse, format, doc) {key, parse, format, doc, 0}
#define FLAG_OPT(key, field, doc)                                                                  \
    {key, NULL, NULL, doc,                                                                         \
     offsetof(vmm_config, field) + 0 * sizeof(_Generic(((vmm_config *)0)->field, int: 1))}

/* ---- value parsers ------------------------------------------------------------------------- */

static int token_eq(token v, const char *lit)
{
    size_t n = strlen(lit);
    if (n != v.len)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)v.s[i]) != lit[i])
            return 0;
    return 1;
}

static int bad_value(const char *key, token v, const char *want)
{
    return vmm_fail(VMM_ECONFIG, "config key '%s': bad value '%.*s' (expected %s)", key, (int)v.len,
                    v.s, want);
}

static int parse_bool(const char *key, token v, int *out)
{
    if (token_eq(v, "true") || token_eq(v, "1") || token_eq(v, "yes")) {
        *out = 1;
        return VMM_OK;
    }
    if (token_eq(v, "false") || token_eq(v, "0") || token_eq(v, "no")) {
        *out = 0;
        return VMM_OK;
    }
    return bad_value(key, v, "true or false");
}

static int opt_parse(const option_desc *o, vmm_config *c, token v)
{
    return o->parse ? o->parse(c, o->key, v) : parse_bool(o->key, v, (int *)((char *)c + o->flag));
}

static int opt_format(const option_desc *o, const vmm_config *c, char *b, size_t n)
{
    if (o->format)
        return o->format(c, b, n);
    return snprintf(b, n, "%s", *(const int *)((const char *)c + o->flag) ? "true" : "false");
}

/* Unsigned decimal integer, whole token, no overflow. */
static int parse_u64(token v, uint64_t *out)
{
    uint64_t x = 0;
    if (v.len == 0)
        return -1;
    for (size_t i = 0; i < v.len; i++) {
        if (!isdigit((unsigned char)v.s[i]))
            return -1;
        unsigned d = (unsigned)(v.s[i] - '0');
        if (x > (UINT64_MAX - d) / 10)
            return -1;
        x = x * 10 + d;
    }
    *out = x;
    return 0;
}

static int parse_double(token v, double *out)
{
    char tmp[64];
    char *end;
    if (v.len == 0 || v.len >= sizeof tmp)
        return -1;
    memcpy(tmp, v.s, v.len);
    tmp[v.len] = '\0';
    errno = 0;
    double x = strtod(tmp, &end);
    if (*end != '\0' || errno != 0 || !isfinite(x))
        return -1;
    *out = x;
    return 0;
}

int vmm_parse_size(const char *s, size_t len, size_t *out)
{
    size_t digits = 0;
    while (digits < len && isdigit((unsigned char)s[digits]))
        digits++;
    uint64_t n;
    if (parse_u64((token){s, digits}, &n) != 0)
        return -1;
    token suffix = {s + digits, len - digits};
    unsigned shift;
    if (suffix.len == 0 || token_eq(suffix, "b"))
        shift = 0;
    else if (token_eq(suffix, "k") || token_eq(suffix, "kb") || token_eq(suffix, "kib"))
        shift = 10;
    else if (token_eq(suffix, "m") || token_eq(suffix, "mb") || token_eq(suffix, "mib"))
        shift = 20;
    else if (token_eq(suffix, "g") || token_eq(suffix, "gb") || token_eq(suffix, "gib"))
        shift = 30;
    else if (token_eq(suffix, "t") || token_eq(suffix, "tb") || token_eq(suffix, "tib"))
        shift = 40;
    else
        return -1;
    if (shift && n > (SIZE_MAX >> shift))
        return -1;
    *out = (size_t)(n << shift);
    return 0;
}

static int is_pow2(size_t x) { return x && !(x & (x - 1)); }

static int format_size(char *buf, size_t len, size_t v)
{
    static const char *units[] = {"", "K", "M", "G", "T"};
    unsigned u = 0;
    while (u < 4 && v && (v & 1023) == 0) {
        v >>= 10;
        u++;
    }
    return snprintf(buf, len, "%zu%s", v, units[u]);
}

/* ---- one parser and formatter per key -------------------------------------------------------- */

static int p_driver(vmm_config *c, const char *key, token v)
{
    if (token_eq(v, "sim"))
        c->driver = VMM_DRIVER_SIM;
    else if (token_eq(v, "cuda"))
        c->driver = VMM_DRIVER_CUDA;
    else
        return bad_value(key, v, "cuda or sim");
    return VMM_OK;
}
static int f_driver(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%s", c->driver == VMM_DRIVER_SIM ? "sim" : "cuda");
}

static int p_device(vmm_config *c, const char *key, token v)
{
    uint64_t x;
    if (parse_u64(v, &x) != 0 || x > 1024)
        return bad_value(key, v, "a device number 0..1024");
    c->device = (int)x;
    return VMM_OK;
}
static int f_device(const vmm_config *c, char *b, size_t n) { return snprintf(b, n, "%d", c->device); }

/* peer_access: all | none | [1,3]: the devices whose kernels may touch this allocator's memory. */
static int p_peers(vmm_config *c, const char *key, token v)
{
    if (token_eq(v, "all")) {
        c->peer_all = 1;
        c->peer_mask = 0;
        return VMM_OK;
    }
    if (token_eq(v, "none")) {
        c->peer_all = 0;
        c->peer_mask = 0;
        return VMM_OK;
    }
    if (v.len < 2 || v.s[0] != '[' || v.s[v.len - 1] != ']')
        return bad_value(key, v, "all, none or a list of device numbers [1,2]");
    uint64_t mask = 0;
    const char *p = v.s + 1, *end = v.s + v.len - 1;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        uint64_t d;
        if (parse_u64((token){p, (size_t)(item_end - p)}, &d) != 0 || d >= 64)
            return bad_value(key, v, "device numbers 0..63 in the list");
        mask |= (uint64_t)1 << d;
        p = comma ? comma + 1 : end;
    }
    c->peer_all = 0;
    c->peer_mask = mask;
    return VMM_OK;
}
static int f_peers(const vmm_config *c, char *b, size_t n)
{
    if (c->peer_all)
        return snprintf(b, n, "all");
    if (!c->peer_mask)
        return snprintf(b, n, "none");
    size_t off = 0;
    int first = 1;
    for (int i = 0; i < 64; i++)
        if (c->peer_mask >> i & 1) {
            int k = snprintf(b + (off < n ? off : n), off < n ? n - off : 0, "%s%d", first ? "[" : ",", i);
            off += (size_t)(k > 0 ? k : 0);
            first = 0;
        }
    int k = snprintf(b + (off < n ? off : n), off < n ? n - off : 0, "]");
    return (int)(off + (size_t)(k > 0 ? k : 0));
}

/* ipc: true | false | auto (ipc.c). */
static int p_ipc(vmm_config *c, const char *key, token v)
{
    if (token_eq(v, "auto")) {
        c->ipc = -1;
        return VMM_OK;
    }
    return parse_bool(key, v, &c->ipc);
}
static int f_ipc(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%s", c->ipc < 0 ? "auto" : c->ipc ? "true" : "false");
}

static int p_max_split(vmm_config *c, const char *key, token v)
{
    uint64_t mb;
    if (parse_u64(v, &mb) != 0 || mb > (SIZE_MAX >> 20))
        return bad_value(key, v, "a number of MiB");
    if (mb <= MAX_SPLIT_MIN_MB)
        return vmm_fail(VMM_ECONFIG, "config key '%s': %llu MiB is too small (must be > %d)", key,
                        (unsigned long long)mb, MAX_SPLIT_MIN_MB);
    c->max_split_size = (size_t)mb << 20;
    return VMM_OK;
}
static int f_max_split(const vmm_config *c, char *b, size_t n)
{
    if (c->max_split_size == SIZE_MAX)
        return snprintf(b, n, "unlimited");
    return snprintf(b, n, "%zu", c->max_split_size >> 20);
}

static int p_non_split(vmm_config *c, const char *key, token v)
{
    uint64_t mb;
    if (parse_u64(v, &mb) != 0 || mb > (SIZE_MAX >> 21))
        return bad_value(key, v, "a number of MiB");
    c->max_non_split_rounding = (size_t)mb << 20;
    return VMM_OK;
}
static int f_non_split(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%zu", c->max_non_split_rounding >> 20);
}

/* One number (a power of two, or 0/1 for none) for every interval, or a list
 * [K:V,...,>:V] where K is a power-of-two MiB size naming an interval; intervals up to K that no
 * earlier entry set get V, and '>' sets all the rest. */
static int check_divisions(const char *key, token v, uint64_t d)
{
    if (d > 1 && !is_pow2((size_t)d))
        return bad_value(key, v, "divisions that are powers of two");
    if (d > 1024)
        return bad_value(key, v, "at most 1024 divisions");
    return VMM_OK;
}

static unsigned log2_floor(uint64_t x)
{
    unsigned r = 0;
    while (x >>= 1)
        r++;
    return r;
}

static int p_pow2(vmm_config *c, const char *key, token v)
{
    unsigned div[VMM_POW2_INTERVALS] = {0};
    uint64_t d;
    if (v.len && v.s[0] != '[') {
        if (parse_u64(v, &d) != 0)
            return bad_value(key, v, "a number or a list [64:8,>:1]");
        int rc = check_divisions(key, v, d);
        if (rc)
            return rc;
        for (int i = 0; i < VMM_POW2_INTERVALS; i++)
            div[i] = (unsigned)d;
        memcpy(c->pow2_divisions, div, sizeof div);
        return VMM_OK;
    }
    if (v.len < 2 || v.s[v.len - 1] != ']')
        return bad_value(key, v, "a list in brackets");
    size_t next_unset = 0;
    const char *p = v.s + 1, *end = v.s + v.len - 1;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        const char *colon = memchr(p, ':', (size_t)(item_end - p));
        if (!colon)
            return bad_value(key, v, "list items K:V");
        token k = {p, (size_t)(colon - p)}, val = {colon + 1, (size_t)(item_end - colon - 1)};
        if (parse_u64(val, &d) != 0)
            return bad_value(key, v, "list values that are numbers");
        int rc = check_divisions(key, v, d);
        if (rc)
            return rc;
        size_t last;
        if (k.len == 1 && k.s[0] == '>') {
            last = VMM_POW2_INTERVALS - 1;
        } else {
            uint64_t mb;
            if (parse_u64(k, &mb) != 0 || !is_pow2((size_t)mb))
                return bad_value(key, v, "list keys that are power-of-two MiB sizes or '>'");
            last = log2_floor(mb);
            if (last >= VMM_POW2_INTERVALS)
                last = VMM_POW2_INTERVALS - 1;
        }
        for (size_t i = next_unset; i <= last; i++)
            div[i] = (unsigned)d;
        if (last + 1 > next_unset)
            next_unset = last + 1;
        p = comma ? comma + 1 : end;
    }
    memcpy(c->pow2_divisions, div, sizeof div);
    return VMM_OK;
}
static int f_pow2(const vmm_config *c, char *b, size_t n)
{
    int all_same = 1;
    for (int i = 1; i < VMM_POW2_INTERVALS; i++)
        all_same &= c->pow2_divisions[i] == c->pow2_divisions[0];
    if (all_same)
        return snprintf(b, n, "%u", c->pow2_divisions[0]);
    int w = snprintf(b, n, "[");
    for (int i = 0; i < VMM_POW2_INTERVALS; i++) {
        size_t off = (size_t)w < n ? (size_t)w : n;
        if (i == VMM_POW2_INTERVALS - 1)
            w += snprintf(b + off, n - off, ">:%u]", c->pow2_divisions[i]);
        else
            w += snprintf(b + off, n - off, "%llu:%u,", 1ull << i, c->pow2_divisions[i]);
    }
    return w;
}

static int p_gc(vmm_config *c, const char *key, token v)
{
    double x;
    if (parse_double(v, &x) != 0 || !(x > 0.0 && x < 1.0))
        return bad_value(key, v, "a number strictly between 0 and 1");
    c->garbage_collection_threshold = x;
    return VMM_OK;
}
static int f_gc(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%g", c->garbage_collection_threshold);
}

static int p_fraction(vmm_config *c, const char *key, token v)
{
    double x;
    if (parse_double(v, &x) != 0 || !(x > 0.0 && x <= 1.0))
        return bad_value(key, v, "a number in (0, 1]");
    c->per_process_memory_fraction = x;
    return VMM_OK;
}
static int f_fraction(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%g", c->per_process_memory_fraction);
}

/* Sizes that must be powers of two of at least 4 KiB (page sizes, granularities). */
static int parse_pow2_size(const char *key, token v, size_t *out)
{
    size_t x;
    if (vmm_parse_size(v.s, v.len, &x) != 0 || !is_pow2(x) || x < 4 * VMM_KiB)
        return bad_value(key, v, "a power-of-two size of at least 4K, e.g. 2M");
    *out = x;
    return VMM_OK;
}

static int p_thread_cache(vmm_config *c, const char *key, token v)
{
    size_t x;
    if (vmm_parse_size(v.s, v.len, &x) != 0 || x > VMM_GiB)
        return bad_value(key, v, "a size of at most 1G, e.g. 4M, or 0 for off");
    c->thread_cache = x;
    return VMM_OK;
}
static int f_thread_cache(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->thread_cache);
}

static int p_small_page(vmm_config *c, const char *key, token v)
{
    return parse_pow2_size(key, v, &c->small_page_size);
}
static int f_small_page(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->small_page_size);
}
static int p_large_page(vmm_config *c, const char *key, token v)
{
    /* Not required to be a power of two: PyTorch's 20 MiB pages are a multiple of 2 MiB. */
    size_t x;
    if (vmm_parse_size(v.s, v.len, &x) != 0 || x < 4 * VMM_KiB || x % (4 * VMM_KiB))
        return bad_value(key, v, "a size that is a multiple of 4K, e.g. 2M or 20M");
    c->large_page_size = x;
    return VMM_OK;
}
static int f_large_page(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->large_page_size);
}

static int p_max_handle(vmm_config *c, const char *key, token v)
{
    size_t x;
    if (vmm_parse_size(v.s, v.len, &x) != 0 || x < 4 * VMM_KiB || x % (4 * VMM_KiB) || x > VMM_GiB)
        return bad_value(key, v, "a size that is a multiple of 4K, at most 1G, e.g. 20M");
    c->max_handle_size = x;
    return VMM_OK;
}
static int f_max_handle(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->max_handle_size);
}

static int p_place_size(const char *key, token v, size_t *out)
{
    size_t x;
    if (vmm_parse_size(v.s, v.len, &x) != 0 || x > 2 * VMM_MiB)
        return bad_value(key, v, "a size of at most 2M, e.g. 256K or 0");
    *out = x;
    return VMM_OK;
}
static int p_place_gap(vmm_config *c, const char *key, token v)
{
    return p_place_size(key, v, &c->alias_place_tail_gap);
}
static int f_place_gap(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->alias_place_tail_gap);
}
static int p_place_slack(vmm_config *c, const char *key, token v)
{
    return p_place_size(key, v, &c->alias_place_slack);
}
static int f_place_slack(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->alias_place_slack);
}

static int p_sim_capacity(vmm_config *c, const char *key, token v)
{
    size_t x;
    if (vmm_parse_size(v.s, v.len, &x) != 0 || x == 0)
        return bad_value(key, v, "a size such as 80G");
    c->sim.capacity = x;
    return VMM_OK;
}
static int f_sim_capacity(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->sim.capacity);
}
static int p_sim_gran(vmm_config *c, const char *key, token v)
{
    return parse_pow2_size(key, v, &c->sim.granularity);
}
static int f_sim_gran(const vmm_config *c, char *b, size_t n)
{
    return format_size(b, n, c->sim.granularity);
}
static int call_kind_from_token(token v) { return vmm_sim_call_kind(v.s, v.len); }

/* [kind:ns,kind:ns] overrides modeled costs of the listed call kinds. */
static int p_sim_cost(vmm_config *c, const char *key, token v)
{
    uint64_t cost[VMM_SIM_CALL_COUNT];
    memcpy(cost, c->sim.cost_ns, sizeof cost);
    if (v.len < 2 || v.s[0] != '[' || v.s[v.len - 1] != ']')
        return bad_value(key, v, "a list [mem_map:1450,set_access:36000] of nanoseconds");
    const char *p = v.s + 1, *end = v.s + v.len - 1;
    while (p < end) {
        const char *comma = memchr(p, ',', (size_t)(end - p));
        const char *item_end = comma ? comma : end;
        const char *colon = memchr(p, ':', (size_t)(item_end - p));
        uint64_t ns;
        if (!colon || parse_u64((token){colon + 1, (size_t)(item_end - colon - 1)}, &ns) != 0)
            return bad_value(key, v, "list items kind:nanoseconds");
        int kind = call_kind_from_token((token){p, (size_t)(colon - p)});
        if (kind < 0)
            return vmm_fail(VMM_ECONFIG, "config key '%s': unknown call kind '%.*s'", key,
                            (int)(colon - p), p);
        cost[kind] = ns;
        p = comma ? comma + 1 : end;
    }
    memcpy(c->sim.cost_ns, cost, sizeof cost);
    return VMM_OK;
}
static int f_sim_cost(const vmm_config *c, char *b, size_t n)
{
    int w = 0;
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++) {
        size_t off = (size_t)w < n ? (size_t)w : n;
        w += snprintf(b + off, n - off, "%s%s:%llu", k ? "," : "[", vmm_sim_call_name(k),
                      (unsigned long long)c->sim.cost_ns[k]);
    }
    size_t off = (size_t)w < n ? (size_t)w : n;
    return w + snprintf(b + off, n - off, "]");
}

static int p_sim_cost_file(vmm_config *c, const char *key, token v)
{
    char path[VMM_SIM_COST_FILE_MAX];
    if (token_eq(v, "none")) { /* back to cost_ns alone (what vmm_config_format prints by default) */
        c->sim.n_cost_points = 0;
        c->sim.cost_file[0] = 0;
        return VMM_OK;
    }
    if (v.len == 0 || v.len >= sizeof path)
        return bad_value(key, v, "a file path (no commas) shorter than 256 bytes");
    memcpy(path, v.s, v.len);
    path[v.len] = 0;
    FILE *f = fopen(path, "r");
    if (!f)
        return vmm_fail(VMM_ECONFIG, "config key '%s': cannot open %s: %s", key, path, strerror(errno));
    enum { MAX_BYTES = 4 << 20 }; /* a cost table is a few KiB; this bounds a wrong file */
    char *text = malloc(MAX_BYTES + 1);
    size_t n = text ? fread(text, 1, MAX_BYTES + 1, f) : 0;
    fclose(f);
    if (!text)
        return vmm_fail(VMM_ENOMEM, "config key '%s': no memory to read %s", key, path);
    if (n > MAX_BYTES) {
        free(text);
        return vmm_fail(VMM_ECONFIG, "config key '%s': %s is over 4 MiB: not a cost table", key, path);
    }
    text[n] = 0;
    /* into a copy: a bad file leaves the configuration as it was */
    vmm_sim_options o = c->sim;
    int rc = vmm_sim_cost_table_parse(&o, key, path, text);
    free(text);
    if (rc != VMM_OK)
        return rc;
    memcpy(o.cost_file, path, v.len + 1);
    c->sim = o;
    return VMM_OK;
}
static int f_sim_cost_file(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%s", c->sim.cost_file[0] ? c->sim.cost_file : "none");
}

static int p_sim_fault_kind(vmm_config *c, const char *key, token v)
{
    int kind;
    if (token_eq(v, "none"))
        kind = -2;
    else if (token_eq(v, "all"))
        kind = -1;
    else if ((kind = call_kind_from_token(v)) < 0)
        return bad_value(key, v, "none, all or a call kind such as mem_map");
    c->sim.fail_kind = kind;
    return VMM_OK;
}
static int f_sim_fault_kind(const vmm_config *c, char *b, size_t n)
{
    if (c->sim.fail_kind == -2)
        return snprintf(b, n, "none");
    if (c->sim.fail_kind == -1)
        return snprintf(b, n, "all");
    return snprintf(b, n, "%s", vmm_sim_call_name(c->sim.fail_kind));
}
static int p_sim_fault_p(vmm_config *c, const char *key, token v)
{
    double x;
    if (parse_double(v, &x) != 0 || x < 0.0 || x > 1.0)
        return bad_value(key, v, "a probability in [0, 1]");
    c->sim.fail_p = x;
    return VMM_OK;
}
static int f_sim_fault_p(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%g", c->sim.fail_p);
}
static int p_sim_fault_seed(vmm_config *c, const char *key, token v)
{
    uint64_t x;
    if (parse_u64(v, &x) != 0)
        return bad_value(key, v, "an unsigned integer");
    c->sim.fail_seed = x;
    return VMM_OK;
}
static int f_sim_fault_seed(const vmm_config *c, char *b, size_t n)
{
    return snprintf(b, n, "%llu", (unsigned long long)c->sim.fail_seed);
}

/* Every key, in the order vmm_config_format prints them. */
static const option_desc options[] = {
    OPT("driver", p_driver, f_driver, "cuda|sim: the real GPU through libcuda.so.1, or the simulated device (default cuda)"),
    OPT("device", p_device, f_device, "device ordinal (default 0)"),
    OPT("peer_access", p_peers, f_peers,
     "devices granted access to this allocator's expandable memory: all (every peer the driver allows), none, or [1,2] (default all)"),
    FLAG_OPT("expandable_segments", expandable_segments,
     "true: VA ranges that grow by mapping pages; false: classic cuMemAlloc segments (default true)"),
    OPT("ipc", p_ipc, f_ipc,
     "pages exportable to other processes (vmm_ipc_get_handle): true, false, or auto: where the device supports POSIX file descriptor handles (default auto)"),
    OPT("max_split_size_mb", p_max_split, f_max_split,
     "blocks at least this large are never split; must be > 20 (default unlimited)"),
    OPT("max_non_split_rounding_mb", p_non_split, f_non_split,
     "an oversize request may take a cached block up to this much larger (default 20)"),
    OPT("roundup_power2_divisions", p_pow2, f_pow2,
     "round sizes up to N steps per power-of-two interval; N or [64:8,256:4,>:1] (default 0: 512 B steps)"),
    OPT("garbage_collection_threshold", p_gc, f_gc,
     "with a memory fraction below 1, free old cached blocks once reserved bytes pass this share of it (default 0: off)"),
    OPT("per_process_memory_fraction", p_fraction, f_fraction,
     "cap on reserved bytes, as a share of device memory (default 1)"),
    OPT("small_page_size", p_small_page, f_small_page,
     "bytes per mapped page in the small pool, a multiple of the granularity (default 2M)"),
    OPT("large_page_size", p_large_page, f_large_page,
     "bytes per mapped page in the large pool, a multiple of the granularity (default 2M)"),
    OPT("max_handle_size", p_max_handle, f_max_handle,
     "largest physical handle in the large pool: growth maps handles sized by need, whole pages up to this (fewer driver calls); at most large_page_size: one handle per page; exportable pages (ipc) are one per handle (default 2M: one handle per page; 20M: ~1/7 the driver time, up to 2% more held)"),
    OPT("thread_cache", p_thread_cache, f_thread_cache,
     "bytes of small blocks (up to 64K) each thread keeps for its own next mallocs, taking no lock other threads need; more (a power of two near 1/512) once the small pool's allocated bytes exceed 512 times this; 0 turns it off (default 4M)"),
    FLAG_OPT("grow_unlocked", grow_unlocked,
     "true: a growth creates its physical handles with the allocator lock released, so other threads' mallocs and frees do not wait for cuMemCreate; false keeps the lock across it (default true)"),
    FLAG_OPT("lanes", lanes,
     "true: once two threads use the allocator, a cached malloc or free of the small pool takes only its stream's lock (a lane), so threads on their own streams do not queue on the allocator lock; false keeps one lock (default true)"),
    FLAG_OPT("thread_cache_depot", depot,
     "true: while lanes are open, a thread that frees more small blocks than it allocates passes its full bins to a depot that other threads' mallocs take from, instead of back to their stream's pool under its lock (producer / consumer threads); false gives them back (default true)"),
    FLAG_OPT("lifetime_split", lifetime_split,
     "true: with expandable segments, a large request of a size most of whose blocks in its stream are still live (a tensor that stays) is placed in a segment of its own, apart from short-lived ones, so that it does not leave slivers or partly used pages in their holes; false: one best fit (default true)"),
    FLAG_OPT("alias_pages", alias_pages,
     "true: with expandable segments and one handle per page (max_handle_size:2M), a large-pool growth whose first or last page would be partly used maps instead the page of a free block that fits (a free suffix or prefix of a partly used page) a second time there, so the free part of a page whose block stays is used wherever the next blocks land; false maps a new page (default false)"),
    FLAG_OPT("alias_place", alias_place,
     "true (with alias_pages): a large request of a page or more that no free block of its size (alias_place_slack) serves is built in unmapped VA from the free edges of partly used pages and whole pages: its first page a view of a page's free suffix used whole (one of exactly the request's last partial page first, else the largest), its last page a view of a page's free prefix that leaves at most alias_place_tail_gap free, the pages between cached or new handles, so no free bytes are left inside a page; views with nothing in use are unmapped before each such growth (default false)"),
    FLAG_OPT("alias_place_hybrid", alias_place_hybrid,
     "true: with alias_place, best fit into a free block is still taken when it leaves no free bytes between two used ranges of one page (fewer driver calls) (default false)"),
    OPT("alias_place_tail_gap", p_place_gap, f_place_gap,
     "alias_place: a tail view maps a page's free prefix only when it leaves at most this many bytes of it free, else a new page (default 256K)"),
    OPT("alias_place_slack", p_place_slack, f_place_slack,
     "alias_place: a free block serves a request of a page or more by best fit only when it exceeds it by at most this (0: the same size only), else growth builds it from page edges (default 1M)"),
    OPT("sim_capacity", p_sim_capacity, f_sim_capacity, "simulated device memory (default 80G)"),
    OPT("sim_granularity", p_sim_gran, f_sim_gran, "simulated allocation granularity (default 2M)"),
    FLAG_OPT("sim_backed", sim.backed,
     "true: simulated memory is real host memory; false: accounting only (default true)"),
    FLAG_OPT("sim_vmm_supported", sim.vmm_supported,
     "false simulates a device without virtual memory management (default true)"),
    FLAG_OPT("sim_cost_model", sim.cost_model,
     "add modeled driver-call costs to sim.driver_time_ns (default true)"),
    OPT("sim_cost_ns", p_sim_cost, f_sim_cost,
     "override modeled costs, [kind:ns,...] (defaults from measured CUDA costs; see docs)"),
    OPT("sim_cost_file", p_sim_cost_file, f_sim_cost_file,
     "JSON file whose \"sim_cost_table\" ([kind, size_bytes, ns] items; size 0: flat) sets modeled costs, by size where sized, e.g. the costs.json of tools/gpu-check (default none: the built-in model)"),
    FLAG_OPT("sim_real_time_create", sim.real_time_create,
     "true: each mem_create also takes its modeled cost in real time (a sleep, no lock held), for concurrency tests (default false)"),
    FLAG_OPT("sim_real_time", sim.real_time,
     "true: every call takes its modeled cost in real time (a sleep, no lock held), for what other threads wait for (default false)"),
    OPT("sim_fault_kind", p_sim_fault_kind, f_sim_fault_kind,
     "call kind that fails at random: none, all or a kind such as mem_map (default none)"),
    OPT("sim_fault_p", p_sim_fault_p, f_sim_fault_p, "probability that such a call fails (default 0)"),
    OPT("sim_fault_seed", p_sim_fault_seed, f_sim_fault_seed, "seed of the fault generator (default 1)"),
};

void vmm_config_defaults(vmm_config *c)
{
    memset(c, 0, sizeof *c);
    c->driver = VMM_DRIVER_CUDA;
    c->device = 0;
    c->expandable_segments = 1;
    /* all: memory behaves like cudaMalloc'd memory once peers are enabled, since PyTorch's pluggable
     * allocator interface never tells the allocator which peers the application enables */
    c->peer_all = 1;
    c->ipc = -1;
    c->max_split_size = SIZE_MAX;
    c->max_non_split_rounding = 20 * VMM_MiB;
    c->garbage_collection_threshold = 0.0;
    c->per_process_memory_fraction = 1.0;
    /* 2 MiB: the CUDA granularity on current GPUs, so a free hole never strands more than 2 MiB. */
    c->small_page_size = 2 * VMM_MiB;
    c->large_page_size = 2 * VMM_MiB;
    /* 2 MiB, one handle per page: every idle page of a hole can be unmapped and serve growth
     * elsewhere, so the replays hold at most 0.7% more than they hand out at the peak; 20M
     * (PyTorch's large-pool page) costs ~1/7 the driver time and holds up to 2% more on the same
     * traces (docs/benchmarks.md, "Handle sizes") */
    c->max_handle_size = 2 * VMM_MiB;
    /* 4 MiB: a few hundred of the small blocks a step frees, a rounding error of a GPU's memory */
    c->thread_cache = 4 * VMM_MiB;
    c->grow_unlocked = 1;
    c->lanes = 1;
    c->depot = 1;
    c->lifetime_split = 1;
    /* alias_place's measured setting on the 76 traces (docs/benchmarks.md, "Handle sizes") */
    c->alias_place_tail_gap = 256 * VMM_KiB;
    c->alias_place_slack = VMM_MiB;
    vmm_sim_default_options(&c->sim);
}

/* Split the next "key:value" item at *pp, honouring [..] nesting so list values may hold commas. */
static int next_item(const char **pp, token *key, token *val)
{
    const char *p = *pp;
    while (*p == ',' || isspace((unsigned char)*p))
        p++;
    if (!*p)
        return 0;
    const char *start = p;
    int depth = 0;
    while (*p && !(depth == 0 && *p == ',')) {
        depth += (*p == '[') - (*p == ']');
        p++;
    }
    const char *end = p;
    while (end > start && isspace((unsigned char)end[-1]))
        end--;
    const char *colon = memchr(start, ':', (size_t)(end - start));
    *key = (token){start, colon ? (size_t)(colon - start) : (size_t)(end - start)};
    *val = colon ? (token){colon + 1, (size_t)(end - colon - 1)} : (token){end, 0};
    while (key->len && isspace((unsigned char)key->s[key->len - 1]))
        key->len--;
    while (val->len && isspace((unsigned char)val->s[0])) {
        val->s++;
        val->len--;
    }
    *pp = p;
    return colon ? 1 : -1;
}

int vmm_config_parse(vmm_config *c, const char *conf)
{
    if (!conf)
        return VMM_OK;
    vmm_config tmp = *c; /* all or nothing */
    const char *p = conf;
    token key, val;
    int r;
    while ((r = next_item(&p, &key, &val)) != 0) {
        char name[KEY_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(key.len < KEY_MAX - 1 ? key.len : KEY_MAX - 1), key.s);
        if (r < 0)
            return vmm_fail(VMM_ECONFIG, "config: item '%s' has no ':value'", name);
        const option_desc *o = NULL;
        for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
            if (strlen(options[i].key) == key.len && memcmp(options[i].key, key.s, key.len) == 0)
                o = &options[i];
        if (!o)
            return vmm_fail(VMM_ECONFIG, "config: unknown key '%s'", name);
        int rc = opt_parse(o, &tmp, val);
        if (rc != VMM_OK)
            return rc;
    }
    *c = tmp;
    return VMM_OK;
}

/* ---- the environment: PyTorch's variables, then VMMALLOC_CONF --------------------------------- */

/* Keys of PyTorch's allocator config (c10/core/AllocatorConfig.h, c10/cuda/CUDAAllocatorConfig.h)
 * that mean what vmmalloc's key of the same name means: applied from PyTorch's variables. */
static const char *const torch_shared_keys[] = {
    "expandable_segments", "max_split_size_mb", "max_non_split_rounding_mb",
    "roundup_power2_divisions", "garbage_collection_threshold", "per_process_memory_fraction",
};
/* Settings of PyTorch's own allocators (the cudaMallocAsync backend, the pinned host allocator,
 * CUDA graphs, ...) that vmmalloc has no use for: in PyTorch's variables they are ignored with a
 * warning, once per key and process, since users set them for the native allocator. */
static const char *const torch_only_keys[] = {
    "backend", "release_lock_on_cudamalloc", "release_lock_on_hipmalloc",
    "pinned_use_cuda_host_register", "pinned_use_hip_host_register", "pinned_num_register_threads",
    "pinned_reserve_segment_size_mb", "pinned_use_background_threads", "pinned_free_catch_all",
    "graph_capture_record_stream_reuse", "throw_on_cudamalloc_oom", "expandable_segments_handle_type",
};
_Static_assert(sizeof torch_only_keys / sizeof torch_only_keys[0] <= 32, "one warning bit per key");
static _Atomic uint32_t torch_warned; /* bit i: torch_only_keys[i] was reported */

static int key_in(token key, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (strlen(keys[i]) == key.len && memcmp(keys[i], key.s, key.len) == 0)
            return (int)i;
    return -1;
}

static const option_desc *option_by_name(token key)
{
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++)
        if (strlen(options[i].key) == key.len && memcmp(options[i].key, key.s, key.len) == 0)
            return &options[i];
    return NULL;
}

/* Apply the keys of PyTorch's variable `var` (value `env`) that vmmalloc shares, warn about the
 * ones only PyTorch has; VMM_ECONFIG for a bad value, a vmmalloc-only key or an unknown key. */
static int parse_torch_env(vmm_config *c, const char *var, const char *env)
{
    const char *p = env;
    token key, val;
    int r;
    while ((r = next_item(&p, &key, &val)) != 0) {
        char name[KEY_MAX];
        snprintf(name, sizeof name, "%.*s", (int)(key.len < KEY_MAX - 1 ? key.len : KEY_MAX - 1), key.s);
        if (r < 0)
            return vmm_fail(VMM_ECONFIG, "%s: config: item '%s' has no ':value'", var, name);
        const option_desc *o = option_by_name(key);
        if (key_in(key, torch_shared_keys, sizeof torch_shared_keys / sizeof torch_shared_keys[0]) >= 0 && o) {
            int rc = opt_parse(o, c, val);
            if (rc != VMM_OK) {
                char msg[512];
                snprintf(msg, sizeof msg, "%s", vmm_last_error());
                return vmm_fail(rc, "%s: %s", var, msg);
            }
            continue;
        }
        int t = key_in(key, torch_only_keys, sizeof torch_only_keys / sizeof torch_only_keys[0]);
        if (t >= 0) {
            uint32_t bit = (uint32_t)1 << t;
            if (!(atomic_fetch_or(&torch_warned, bit) & bit))
                fprintf(stderr, "vmmalloc: %s: ignoring '%s:%.*s', a setting of PyTorch's own "
                                "allocator that vmmalloc does not have\n",
                        var, name, (int)(val.len < 64 ? val.len : 64), val.s);
            continue;
        }
        if (o)
            return vmm_fail(VMM_ECONFIG, "%s: config key '%s' is vmmalloc's own, not PyTorch's: set it "
                                         "in VMMALLOC_CONF (PyTorch rejects it in its variable)", var, name);
        return vmm_fail(VMM_ECONFIG, "%s: config: unknown key '%s'", var, name);
    }
    return VMM_OK;
}

int vmm_config_load(vmm_config *c, const char *conf)
{
    vmm_config tmp;
    vmm_config_defaults(&tmp);
    /* PyTorch's variable first (PYTORCH_ALLOC_CONF, else the older PYTORCH_CUDA_ALLOC_CONF, as
     * PyTorch reads them), so that VMMALLOC_CONF and conf override its keys */
    const char *tvar = "PYTORCH_ALLOC_CONF";
    const char *tenv = getenv(tvar);
    if (!tenv) {
        tvar = "PYTORCH_CUDA_ALLOC_CONF";
        tenv = getenv(tvar);
    }
    if (tenv && strlen(tenv) > CONF_ENV_MAX)
        return vmm_fail(VMM_ECONFIG, "%s is longer than %d characters", tvar, CONF_ENV_MAX);
    if (tenv) {
        vmm_config t = tmp; /* all or nothing */
        int trc = parse_torch_env(&t, tvar, tenv);
        if (trc != VMM_OK)
            return trc;
        tmp = t;
    }
    const char *env = getenv("VMMALLOC_CONF");
    if (env && strlen(env) > CONF_ENV_MAX)
        return vmm_fail(VMM_ECONFIG, "VMMALLOC_CONF is longer than %d characters", CONF_ENV_MAX);
    int rc = vmm_config_parse(&tmp, env);
    if (rc != VMM_OK) {
        char msg[512];
        snprintf(msg, sizeof msg, "%s", vmm_last_error());
        return vmm_fail(rc, "VMMALLOC_CONF: %s", msg);
    }
    rc = vmm_config_parse(&tmp, conf);
    if (rc != VMM_OK)
        return rc;
    *c = tmp;
    return VMM_OK;
}

int vmm_config_format(const vmm_config *c, char *buf, size_t len)
{
    size_t w = 0;
    for (size_t i = 0; i < sizeof options / sizeof options[0]; i++) {
        char val[1024];
        opt_format(&options[i], c, val, sizeof val);
        int n = snprintf(buf + (w < len ? w : len), w < len ? len - w : 0, "%s%s:%s", i ? "," : "",
                         options[i].key, val);
        w += (size_t)n;
    }
    if (w >= len)
        return VMM_ERANGE;
    return (int)w;
}

/* Key table for docs and the --help of programs: key i's name and text, NULL past the end. */
const char *vmm_config_key_doc(size_t i, const char **doc)
{
    if (i >= sizeof options / sizeof options[0])
        return NULL;
    if (doc)
        *doc = options[i].doc;
    return options[i].key;
}
