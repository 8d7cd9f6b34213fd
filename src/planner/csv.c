/* Planner files: the interval CSV (MiniMalloc's format plus alignment/group), the flattened PyTorch
 * trace CSV, plan output and the SVG picture. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner.h"

enum {
    CSV_MAX_FIELDS = 16, /* more columns than any known input; extra ones are an error */
    SVG_WIDTH = 1200,    /* picture size in SVG user units */
    SVG_HEIGHT = 700,
    SVG_MARGIN = 40,
};

typedef struct field {
    const char *p;
    size_t len;
} field;

/* Split one line at commas, trimming blanks. Returns the field count, or -1 if too many. */
static int split_line(const char *p, size_t len, field *f)
{
    int n = 0;
    size_t s = 0;
    for (size_t i = 0; i <= len; i++) {
        if (i < len && p[i] != ',')
            continue;
        if (n == CSV_MAX_FIELDS)
            return -1;
        size_t a = s, b = i;
        while (a < b && isspace((unsigned char)p[a]))
            a++;
        while (b > a && isspace((unsigned char)p[b - 1]))
            b--;
        f[n++] = (field){p + a, b - a};
        s = i + 1;
    }
    return n;
}

static int field_is(field f, const char *name) { return f.len == strlen(name) && memcmp(f.p, name, f.len) == 0; }

static int parse_i64(field f, int64_t *out)
{
    char buf[32];
    if (f.len == 0 || f.len >= sizeof buf)
        return -1;
    memcpy(buf, f.p, f.len);
    buf[f.len] = '\0';
    char *end;
    errno = 0;
    long long v = strtoll(buf, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

static int parse_u64(field f, uint64_t *out)
{
    char buf[32];
    if (f.len == 0 || f.len >= sizeof buf || f.p[0] == '-')
        return -1;
    memcpy(buf, f.p, f.len);
    buf[f.len] = '\0';
    char *end;
    errno = 0;
    unsigned long long v = strtoull(buf, &end, 10);
    if (errno || *end)
        return -1;
    *out = v;
    return 0;
}

typedef struct builder {
    vmm_plan_problem *p;
    size_t cap;
    size_t *line;  /* per buffer: its line (for messages after the whole file is read) */
    char **alias;  /* per buffer: the alias column's id, NULL when empty */
} builder;

static int add_buffer(builder *b, const vmm_plan_buffer *buf, const char *id, size_t idlen)
{
    vmm_plan_problem *p = b->p;
    if (p->count == b->cap) {
        size_t nc = b->cap ? 2 * b->cap : 256;
        vmm_plan_buffer *nb = realloc(p->buffers, nc * sizeof *nb);
        if (!nb)
            return VMM_EHOSTMEM;
        p->buffers = nb;
        char **ni = realloc(p->ids, nc * sizeof *ni);
        if (!ni)
            return VMM_EHOSTMEM;
        p->ids = ni;
        size_t *nl = realloc(b->line, nc * sizeof *nl);
        if (!nl)
            return VMM_EHOSTMEM;
        b->line = nl;
        char **na = realloc(b->alias, nc * sizeof *na);
        if (!na)
            return VMM_EHOSTMEM;
        b->alias = na;
        b->cap = nc;
    }
    b->line[p->count] = 0;
    b->alias[p->count] = NULL;
    char *s = malloc(idlen + 1);
    if (!s)
        return VMM_EHOSTMEM;
    memcpy(s, id, idlen);
    s[idlen] = '\0';
    p->buffers[p->count] = *buf;
    p->ids[p->count] = s;
    p->count++;
    return VMM_OK;
}

/* Open trace allocations by address: open addressing, linear probing, power-of-two table. */
typedef struct open_map {
    uint64_t *key;
    size_t *val; /* index into buffers + 1; 0 = empty slot */
    size_t cap, used;
} open_map;

static size_t map_slot(const open_map *m, uint64_t k)
{
    size_t h = (size_t)((k >> 9) * 0x9E3779B97F4A7C15ull) & (m->cap - 1); /* blocks are 512-aligned */
    while (m->val[h] && m->key[h] != k)
        h = (h + 1) & (m->cap - 1);
    return h;
}

static int map_grow(open_map *m)
{
    open_map g = {NULL, NULL, m->cap ? 2 * m->cap : 1024, 0};
    g.key = calloc(g.cap, sizeof *g.key);
    g.val = calloc(g.cap, sizeof *g.val);
    if (!g.key || !g.val) {
        free(g.key);
        free(g.val);
        return VMM_EHOSTMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->val[i]) {
            size_t h = map_slot(&g, m->key[i]);
            g.key[h] = m->key[i];
            g.val[h] = m->val[i];
            g.used++;
        }
    free(m->key);
    free(m->val);
    *m = g;
    return VMM_OK;
}

/* Remove key at slot h, re-inserting the rest of its probe run (no tombstones). */
static void map_erase(open_map *m, size_t h)
{
    m->val[h] = 0;
    m->used--;
    for (size_t j = (h + 1) & (m->cap - 1); m->val[j]; j = (j + 1) & (m->cap - 1)) {
        uint64_t k = m->key[j];
        size_t v = m->val[j];
        m->val[j] = 0;
        size_t t = map_slot(m, k);
        m->key[t] = k;
        m->val[t] = v;
    }
}

/* Id lookup for the alias column: open addressing over buffer indices by FNV-1a of the id. */
static uint64_t id_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Resolve every alias id to an index; 0 or VMM_EINVAL/VMM_EHOSTMEM with the message set. */
static int resolve_aliases(builder *b, const char *name)
{
    vmm_plan_problem *p = b->p;
    size_t cap = 16;
    while (cap < 2 * p->count)
        cap *= 2;
    size_t *tab = calloc(cap, sizeof *tab); /* index + 1; 0 empty */
    if (!tab)
        return vmm_fail(VMM_EHOSTMEM, "%s: out of host memory", name);
    int rc = VMM_OK;
    for (size_t i = 0; i < p->count; i++) {
        size_t h = (size_t)id_hash(p->ids[i]) & (cap - 1);
        while (tab[h] && strcmp(p->ids[tab[h] - 1], p->ids[i]) != 0)
            h = (h + 1) & (cap - 1);
        if (!tab[h])
            tab[h] = i + 1;
        else if (p->has_alias) { /* ids only need to be unique when aliases name them */
            rc = vmm_fail(VMM_EINVAL, "%s:%zu: id '%s' already used on line %zu", name, b->line[i], p->ids[i],
                          b->line[tab[h] - 1]);
            goto out;
        }
    }
    for (size_t i = 0; i < p->count; i++) {
        if (!b->alias[i])
            continue;
        size_t h = (size_t)id_hash(b->alias[i]) & (cap - 1);
        while (tab[h] && strcmp(p->ids[tab[h] - 1], b->alias[i]) != 0)
            h = (h + 1) & (cap - 1);
        if (!tab[h]) {
            rc = vmm_fail(VMM_EINVAL, "%s:%zu: alias '%s' names no buffer", name, b->line[i], b->alias[i]);
            goto out;
        }
        p->buffers[i].flags |= VMM_PLAN_ALIAS;
        p->buffers[i].alias = tab[h] - 1;
    }
out:
    free(tab);
    return rc;
}

#define PARSE_FAIL(...)                                                                   \
    do {                                                                                  \
        rc = vmm_fail(VMM_EINVAL, __VA_ARGS__);                                           \
        goto out;                                                                         \
    } while (0)

VMM_API int vmm_plan_parse_csv(const char *text, size_t len, const char *name, vmm_plan_problem *out)
{
    if (!out || (!text && len))
        return vmm_fail(VMM_EINVAL, "plan csv: NULL argument");
    memset(out, 0, sizeof *out);
    if (!name)
        name = "(input)";
    builder b = {out, 0, NULL, NULL};
    open_map map = {NULL, NULL, 0, 0};
    field f[CSV_MAX_FIELDS];
    int rc = VMM_OK, nhead = 0, trace = 0;
    int col_id = -1, col_lo = -1, col_hi = -1, col_size = -1, col_align = -1, col_group = -1;
    int col_arena = -1, col_unplanned = -1, col_alias = -1, col_key = -1;
    int col_action = -1, col_addr = -1;
    size_t line = 0;
    int64_t ordinal = 0;
    for (size_t pos = 0; pos < len;) {
        size_t e = pos;
        while (e < len && text[e] != '\n')
            e++;
        size_t l = e - pos;
        const char *p = text + pos;
        pos = e + 1;
        line++;
        if (l && p[l - 1] == '\r')
            l--;
        int nf = split_line(p, l, f);
        if (nf == 1 && f[0].len == 0)
            continue; /* blank line */
        if (nf < 0)
            PARSE_FAIL("%s:%zu: more than %d fields", name, line, CSV_MAX_FIELDS);
        if (nhead == 0) {
            nhead = nf;
            for (int k = 0; k < nf; k++) {
                int *slot = field_is(f[k], "id")        ? &col_id
                            : field_is(f[k], "lower")     ? &col_lo
                            : field_is(f[k], "upper")     ? &col_hi
                            : field_is(f[k], "size")      ? &col_size
                            : field_is(f[k], "alignment") ? &col_align
                            : field_is(f[k], "group")     ? &col_group
                            : field_is(f[k], "arena")     ? &col_arena
                            : field_is(f[k], "unplanned") ? &col_unplanned
                            : field_is(f[k], "alias")     ? &col_alias
                            : field_is(f[k], "key")       ? &col_key
                            : field_is(f[k], "action")    ? &col_action
                            : field_is(f[k], "addr")      ? &col_addr
                                                          : NULL;
                if (slot)
                    *slot = k;
            }
            trace = col_action >= 0;
            if (trace && (col_addr < 0 || col_size < 0))
                PARSE_FAIL("%s:%zu: trace header needs action,addr,size", name, line);
            if (!trace && (col_id < 0 || col_lo < 0 || col_hi < 0 || col_size < 0))
                PARSE_FAIL("%s:%zu: header must name id,lower,upper,size (or action,addr,size,stream "
                           "for a trace)", name, line);
            out->from_trace = trace;
            out->has_alignment = col_align >= 0;
            out->has_group = col_group >= 0;
            if (!trace) {
                out->has_arena = col_arena >= 0;
                out->has_unplanned = col_unplanned >= 0;
                out->has_alias = col_alias >= 0;
                out->has_key = col_key >= 0;
            }
            continue;
        }
        if (nf != nhead)
            PARSE_FAIL("%s:%zu: %d fields, the header has %d", name, line, nf, nhead);
        if (trace) {
            int64_t t = ordinal++;
            int is_alloc = field_is(f[col_action], "alloc");
            int is_free = field_is(f[col_action], "free_completed");
            if (!is_alloc && !is_free)
                continue;
            uint64_t addr, size;
            if (parse_u64(f[col_addr], &addr))
                PARSE_FAIL("%s:%zu: bad addr '%.*s'", name, line, (int)f[col_addr].len, f[col_addr].p);
            if (parse_u64(f[col_size], &size))
                PARSE_FAIL("%s:%zu: bad size '%.*s'", name, line, (int)f[col_size].len, f[col_size].p);
            if ((map.used + 1) * 2 > map.cap && map_grow(&map))
                PARSE_FAIL("%s: out of host memory", name);
            size_t h = map_slot(&map, addr);
            if (is_alloc) {
                if (map.val[h])
                    PARSE_FAIL("%s:%zu: alloc at %llu, which is still allocated", name, line,
                               (unsigned long long)addr);
                if (size == 0)
                    continue;
                char id[24];
                int idl = snprintf(id, sizeof id, "%zu", out->count);
                vmm_plan_buffer nb = {t, INT64_MAX, size, 0, -1, 0, 0, 0, 0, 0};
                if (add_buffer(&b, &nb, id, (size_t)idl))
                    PARSE_FAIL("%s: out of host memory", name);
                map.key[h] = addr;
                map.val[h] = out->count;
                map.used++;
            } else if (map.val[h]) {
                out->buffers[map.val[h] - 1].upper = t;
                map_erase(&map, h);
            } /* a free of a block allocated before the recording began: nothing to plan */
            continue;
        }
        vmm_plan_buffer nb = {0, 0, 0, 0, -1, 0, 0, 0, 0, 0};
        if (parse_i64(f[col_lo], &nb.lower))
            PARSE_FAIL("%s:%zu: bad lower '%.*s'", name, line, (int)f[col_lo].len, f[col_lo].p);
        if (parse_i64(f[col_hi], &nb.upper))
            PARSE_FAIL("%s:%zu: bad upper '%.*s'", name, line, (int)f[col_hi].len, f[col_hi].p);
        if (parse_u64(f[col_size], &nb.size) || nb.size == 0)
            PARSE_FAIL("%s:%zu: bad size '%.*s' (a positive integer)", name, line, (int)f[col_size].len,
                       f[col_size].p);
        if (nb.upper <= nb.lower)
            PARSE_FAIL("%s:%zu: upper %lld not above lower %lld", name, line, (long long)nb.upper,
                       (long long)nb.lower);
        if (col_align >= 0 && f[col_align].len &&
            (parse_u64(f[col_align], &nb.alignment) || (nb.alignment & (nb.alignment - 1))))
            PARSE_FAIL("%s:%zu: bad alignment '%.*s' (a power of two)", name, line, (int)f[col_align].len,
                       f[col_align].p);
        if (col_group >= 0 && f[col_group].len && (parse_i64(f[col_group], &nb.group) || nb.group < -1))
            PARSE_FAIL("%s:%zu: bad group '%.*s' (an integer >= -1)", name, line, (int)f[col_group].len,
                       f[col_group].p);
        uint64_t v;
        if (col_arena >= 0 && f[col_arena].len) {
            if (parse_u64(f[col_arena], &v) || v >= VMM_PLAN_MAX_ARENAS)
                PARSE_FAIL("%s:%zu: unknown arena '%.*s' (an integer from 0 to %d)", name, line,
                           (int)f[col_arena].len, f[col_arena].p, VMM_PLAN_MAX_ARENAS - 1);
            nb.arena = (uint32_t)v;
        }
        if (col_unplanned >= 0 && f[col_unplanned].len) {
            if (parse_u64(f[col_unplanned], &v) || v > 1)
                PARSE_FAIL("%s:%zu: bad unplanned '%.*s' (0 or 1)", name, line, (int)f[col_unplanned].len,
                           f[col_unplanned].p);
            nb.flags |= v ? VMM_PLAN_UNPLANNED : 0;
        }
        if (col_key >= 0 && f[col_key].len && parse_u64(f[col_key], &nb.key))
            PARSE_FAIL("%s:%zu: bad key '%.*s' (an unsigned integer)", name, line, (int)f[col_key].len,
                       f[col_key].p);
        if (add_buffer(&b, &nb, f[col_id].p, f[col_id].len))
            PARSE_FAIL("%s: out of host memory", name);
        b.line[out->count - 1] = line;
        if (col_alias >= 0 && f[col_alias].len) {
            char *a = malloc(f[col_alias].len + 1);
            if (!a)
                PARSE_FAIL("%s: out of host memory", name);
            memcpy(a, f[col_alias].p, f[col_alias].len);
            a[f[col_alias].len] = '\0';
            b.alias[out->count - 1] = a;
        }
    }
    if (nhead == 0)
        PARSE_FAIL("%s:%zu: empty input (no header)", name, line ? line : (size_t)1);
    if (trace)
        for (size_t i = 0; i < out->count; i++)
            if (out->buffers[i].upper == INT64_MAX)
                out->buffers[i].upper = ordinal; /* never freed: live to the end */
    if (!trace) {
        rc = resolve_aliases(&b, name);
        if (rc)
            goto out;
        size_t bad = 0;
        /* The rules of vmm_plan (arenas, aliases, unplanned), named by line and id. */
        if (plan_check(out->buffers, out->count, out->ids, &bad)) {
            const char *why = vmm_last_error();
            if (strncmp(why, "plan: ", 6) == 0)
                why += 6;
            char msg[512];
            snprintf(msg, sizeof msg, "%s", why);
            rc = vmm_fail(VMM_EINVAL, "%s:%zu: %s", name, b.line[bad], msg);
            goto out;
        }
    }
out:
    for (size_t i = 0; b.alias && i < out->count; i++)
        free(b.alias[i]);
    free(b.alias);
    free(b.line);
    free(map.key);
    free(map.val);
    if (rc)
        vmm_plan_problem_free(out);
    return rc;
}

VMM_API int vmm_plan_load_csv(const char *path, vmm_plan_problem *out)
{
    if (!path || !out)
        return vmm_fail(VMM_EINVAL, "plan csv: NULL argument");
    memset(out, 0, sizeof *out);
    FILE *fp = fopen(path, "rb");
    if (!fp)
        return vmm_fail(VMM_ENOTSUP, "%s: cannot open: %s", path, strerror(errno));
    size_t cap = 1 << 16, len = 0;
    char *text = malloc(cap);
    int rc = VMM_OK;
    while (text) {
        size_t got = fread(text + len, 1, cap - len, fp);
        len += got;
        if (len < cap)
            break;
        char *nt = realloc(text, cap * 2);
        if (!nt) {
            free(text);
            text = NULL;
            break;
        }
        text = nt;
        cap *= 2;
    }
    if (!text)
        rc = vmm_fail(VMM_EHOSTMEM, "%s: out of host memory", path);
    else if (ferror(fp))
        rc = vmm_fail(VMM_ENOTSUP, "%s: read error", path);
    fclose(fp);
    if (!rc)
        rc = vmm_plan_parse_csv(text, len, path, out);
    free(text);
    return rc;
}

VMM_API void vmm_plan_problem_free(vmm_plan_problem *p)
{
    if (!p)
        return;
    for (size_t i = 0; p->ids && i < p->count; i++)
        free(p->ids[i]);
    free(p->ids);
    free(p->buffers);
    memset(p, 0, sizeof *p);
}

VMM_API int vmm_plan_save_csv(const vmm_plan_problem *p, const char *path)
{
    if (!p || !path)
        return vmm_fail(VMM_EINVAL, "plan csv: NULL argument");
    int to_stdout = strcmp(path, "-") == 0;
    FILE *fp = to_stdout ? stdout : fopen(path, "w");
    if (!fp)
        return vmm_fail(VMM_ENOTSUP, "%s: cannot write: %s", path, strerror(errno));
    int arena = p->has_arena;
    for (size_t i = 0; i < p->count; i++)
        arena |= p->buffers[i].arena != 0;
    fprintf(fp, "id,lower,upper,size%s%s%s%s%s%s,offset\n", p->has_alignment ? ",alignment" : "",
            p->has_group ? ",group" : "", arena ? ",arena" : "", p->has_unplanned ? ",unplanned" : "",
            p->has_alias ? ",alias" : "", p->has_key ? ",key" : "");
    for (size_t i = 0; i < p->count; i++) {
        const vmm_plan_buffer *b = &p->buffers[i];
        fprintf(fp, "%s,%lld,%lld,%llu", p->ids[i], (long long)b->lower, (long long)b->upper,
                (unsigned long long)b->size);
        if (p->has_alignment)
            fprintf(fp, ",%llu", (unsigned long long)b->alignment);
        if (p->has_group)
            fprintf(fp, ",%lld", (long long)b->group);
        if (arena)
            fprintf(fp, ",%u", b->arena);
        if (p->has_unplanned)
            fprintf(fp, ",%d", (b->flags & VMM_PLAN_UNPLANNED) ? 1 : 0);
        if (p->has_alias)
            fprintf(fp, ",%s", (b->flags & VMM_PLAN_ALIAS) && b->alias < p->count ? p->ids[b->alias] : "");
        if (p->has_key)
            fprintf(fp, ",%llu", (unsigned long long)b->key);
        fprintf(fp, ",%llu\n", (unsigned long long)b->offset);
    }
    int bad = ferror(fp);
    if (to_stdout)
        bad |= fflush(fp) != 0;
    else
        bad |= fclose(fp) != 0;
    return bad ? vmm_fail(VMM_ENOTSUP, "%s: write error", path) : VMM_OK;
}

VMM_API int vmm_plan_save_svg(const vmm_plan_problem *p, const char *path)
{
    if (!p || !path)
        return vmm_fail(VMM_EINVAL, "plan svg: NULL argument");
    if (p->count == 0)
        return vmm_fail(VMM_EINVAL, "plan svg: no buffers to draw");
    if (plan_check(p->buffers, p->count, p->ids, NULL))
        return VMM_EINVAL;
    size_t *root = malloc(p->count * sizeof *root);
    if (!root)
        return vmm_fail(VMM_EHOSTMEM, "plan svg: out of host memory");
    plan_alias_roots(p->buffers, p->count, root);
    int64_t t0 = p->buffers[0].lower, t1 = p->buffers[0].upper;
    uint64_t top[VMM_PLAN_MAX_ARENAS] = {0};
    unsigned used = 0;
    size_t unplanned = 0, aliases = 0;
    for (size_t i = 0; i < p->count; i++) {
        const vmm_plan_buffer *b = &p->buffers[i];
        t0 = b->lower < t0 ? b->lower : t0;
        t1 = b->upper > t1 ? b->upper : t1;
        if (plan_is_unplanned(p->buffers, root, i)) {
            unplanned++;
            continue;
        }
        used |= 1u << b->arena;
        aliases += root[i] != i;
        top[b->arena] = b->offset + b->size > top[b->arena] ? b->offset + b->size : top[b->arena];
    }
    FILE *fp = fopen(path, "w");
    if (!fp) {
        free(root);
        return vmm_fail(VMM_ENOTSUP, "%s: cannot write: %s", path, strerror(errno));
    }
    int panels = __builtin_popcount(used);
    double w = SVG_WIDTH - 2 * SVG_MARGIN, gap = 24;
    double ph = panels ? (SVG_HEIGHT - 2 * SVG_MARGIN - gap * (panels - 1)) / panels : 0;
    double sx = w / (double)(t1 - t0);
    fprintf(fp, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\">\n",
            SVG_WIDTH, SVG_HEIGHT, SVG_WIDTH, SVG_HEIGHT);
    fprintf(fp, "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n");
    fprintf(fp, "<text x=\"%d\" y=\"%d\" font-family=\"sans-serif\" font-size=\"14\">%zu buffers (%zu unplanned, "
            "not drawn; %zu in place, dashed), %d arena%s; time across, address up</text>\n", SVG_MARGIN,
            SVG_MARGIN - 12, p->count, unplanned, aliases, panels, panels == 1 ? "" : "s");
    int k = 0;
    for (uint32_t a = 0; a < VMM_PLAN_MAX_ARENAS; a++) {
        if (!(used >> a & 1u))
            continue;
        double y0 = SVG_MARGIN + k * (ph + gap), sy = ph / (double)(top[a] ? top[a] : 1);
        k++;
        fprintf(fp, "<rect x=\"%d\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"black\"/>\n",
                SVG_MARGIN, y0, w, ph);
        fprintf(fp, "<text x=\"%d\" y=\"%.1f\" font-family=\"sans-serif\" font-size=\"11\">arena %u: %llu bytes"
                "</text>\n", SVG_MARGIN + 4, y0 + 12, a, (unsigned long long)top[a]);
        for (size_t i = 0; i < p->count; i++) {
            const vmm_plan_buffer *b = &p->buffers[i];
            if (b->arena != a || plan_is_unplanned(p->buffers, root, i))
                continue;
            /* Golden-angle hues keep neighbours apart; a chain takes its root's hue. */
            unsigned hue = (unsigned)((root[i] * 137u) % 360u);
            double x = SVG_MARGIN + (double)(b->lower - t0) * sx;
            double y = y0 + ph - (double)(b->offset + b->size) * sy;
            fprintf(fp, "<rect x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" fill=\"hsl(%u,60%%,60%%)\" "
                    "stroke=\"black\" stroke-width=\"%s\"%s><title>%s [%lld,%lld) size %llu offset %llu%s%s</title>"
                    "</rect>\n", x, y, (double)(b->upper - b->lower) * sx, (double)b->size * sy, hue,
                    root[i] != i ? "1" : "0.3", root[i] != i ? " stroke-dasharray=\"3,2\"" : "", p->ids[i],
                    (long long)b->lower, (long long)b->upper, (unsigned long long)b->size,
                    (unsigned long long)b->offset, root[i] != i ? ", in place of " : "",
                    root[i] != i ? p->ids[b->alias] : "");
        }
    }
    fprintf(fp, "</svg>\n");
    free(root);
    int bad = ferror(fp);
    bad |= fclose(fp) != 0;
    return bad ? vmm_fail(VMM_ENOTSUP, "%s: write error", path) : VMM_OK;
}
