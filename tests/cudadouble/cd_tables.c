/* Small containers of the CUDA double: a hash map, sorted address ranges, node sets. */
#include <stdlib.h>
#include <string.h>

#include "cd_internal.h"

/* ---- cd_map: linear probing, load at most 1/2, deletion by backward shift (no tombstones) ----- */

static size_t map_home(const cd_map *m, uint64_t key)
{
    /* multiplicative hashing spreads the sequential keys (ids, page numbers) */
    return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 20) & (m->cap - 1);
}

static void map_insert(cd_map *m, uint64_t key, void *val)
{
    size_t i = map_home(m, key);
    while (m->keys[i] && m->keys[i] != key)
        i = (i + 1) & (m->cap - 1);
    if (!m->keys[i])
        m->count++;
    m->keys[i] = key;
    m->vals[i] = val;
}

static int map_grow(cd_map *m)
{
    size_t cap = m->cap ? m->cap * 2 : 64;
    cd_map n = {calloc(cap, sizeof(uint64_t)), calloc(cap, sizeof(void *)), cap, 0};
    if (!n.keys || !n.vals) {
        free(n.keys);
        free(n.vals);
        return -1;
    }
    for (size_t i = 0; i < m->cap; i++)
        if (m->keys[i])
            map_insert(&n, m->keys[i], m->vals[i]);
    free(m->keys);
    free(m->vals);
    *m = n;
    return 0;
}

void *cd_map_get(const cd_map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    for (size_t i = map_home(m, key); m->keys[i]; i = (i + 1) & (m->cap - 1))
        if (m->keys[i] == key)
            return m->vals[i];
    return NULL;
}

int cd_map_put(cd_map *m, uint64_t key, void *val)
{
    if ((m->count + 1) * 2 > m->cap && map_grow(m) != 0)
        return -1;
    map_insert(m, key, val);
    return 0;
}

void *cd_map_del(cd_map *m, uint64_t key)
{
    if (!m->cap || !key)
        return NULL;
    size_t mask = m->cap - 1, i = map_home(m, key);
    while (m->keys[i] != key) {
        if (!m->keys[i])
            return NULL;
        i = (i + 1) & mask;
    }
    void *val = m->vals[i];
    /* Move later members of the probe run back into the hole when their home allows it. */
    for (size_t j = (i + 1) & mask; m->keys[j]; j = (j + 1) & mask) {
        size_t home = map_home(m, m->keys[j]);
        if (((j - home) & mask) >= ((j - i) & mask)) {
            m->keys[i] = m->keys[j];
            m->vals[i] = m->vals[j];
            i = j;
        }
    }
    m->keys[i] = 0;
    m->vals[i] = NULL;
    m->count--;
    return val;
}

/* ---- cd_ranges -------------------------------------------------------------------------------- */

/* Index of the first range starting above addr. */
static size_t ranges_upper(const cd_ranges *r, uintptr_t addr)
{
    size_t lo = 0, hi = r->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (r->v[mid]->start <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

cd_range *cd_ranges_find(const cd_ranges *r, uintptr_t addr)
{
    size_t i = ranges_upper(r, addr);
    if (i == 0)
        return NULL;
    cd_range *x = r->v[i - 1];
    return addr - x->start < x->len ? x : NULL;
}

bool cd_ranges_overlap(const cd_ranges *r, uintptr_t addr, size_t len)
{
    if (len == 0)
        return false;
    size_t i = ranges_upper(r, addr);
    if (i > 0 && addr - r->v[i - 1]->start < r->v[i - 1]->len)
        return true;
    return i < r->n && r->v[i]->start - addr < len;
}

int cd_ranges_add(cd_ranges *r, cd_range *x)
{
    if (r->n == r->cap) {
        size_t cap = r->cap ? r->cap * 2 : 16;
        cd_range **v = realloc(r->v, cap * sizeof *v);
        if (!v)
            return -1;
        r->v = v;
        r->cap = cap;
    }
    size_t i = ranges_upper(r, x->start);
    memmove(&r->v[i + 1], &r->v[i], (r->n - i) * sizeof *r->v);
    r->v[i] = x;
    r->n++;
    return 0;
}

void cd_ranges_remove(cd_ranges *r, cd_range *x)
{
    size_t i = ranges_upper(r, x->start);
    if (i == 0 || r->v[i - 1] != x)
        return;
    memmove(&r->v[i - 1], &r->v[i], (r->n - i) * sizeof *r->v);
    r->n--;
}

/* ---- cd_nodes --------------------------------------------------------------------------------- */

static int nodes_reserve(cd_nodes *s, size_t n)
{
    if (n <= s->cap)
        return 0;
    size_t cap = s->cap ? s->cap : 4;
    while (cap < n)
        cap *= 2;
    CUgraphNode *v = realloc(s->v, cap * sizeof *v);
    if (!v)
        return -1;
    s->v = v;
    CUgraphEdgeData *e = realloc(s->edges, cap * sizeof *e);
    if (!e)
        return -1;
    memset(e + s->cap, 0, (cap - s->cap) * sizeof *e);
    s->edges = e;
    s->cap = cap;
    return 0;
}

int cd_nodes_add(cd_nodes *s, CUgraphNode n)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->v[i] == n)
            return 0;
    if (nodes_reserve(s, s->n + 1))
        return -1;
    s->v[s->n++] = n;
    return 0;
}

int cd_nodes_union(cd_nodes *s, const cd_nodes *o)
{
    for (size_t i = 0; i < o->n; i++)
        if (cd_nodes_add(s, o->v[i]))
            return -1;
    return 0;
}

int cd_nodes_copy(cd_nodes *dst, const cd_nodes *src)
{
    if (nodes_reserve(dst, src->n))
        return -1;
    if (src->n)
        memcpy(dst->v, src->v, src->n * sizeof *src->v);
    dst->n = src->n;
    return 0;
}

void cd_nodes_clear(cd_nodes *s) { s->n = 0; }

void cd_nodes_free(cd_nodes *s)
{
    free(s->v);
    free(s->edges);
    memset(s, 0, sizeof *s);
}
