/* Gap placement (TFLite's greedy by size and the orders the heuristics try): items go one by one,
 * each into a gap between the time-overlapping items placed before it.
 *
 * Finding the time-overlapping placed items fast: a segment tree over time slots. An item is stored
 * in the O(log slots) nodes that tile its lifetime ("cover" lists) and is noted in every node its
 * lifetime only partly covers ("part" lists). A query for [lo, hi) walks the nodes it intersects,
 * taking cover lists on the way and, where a node lies wholly inside the query, its part list.
 * Every item reported overlaps the query, so the cost follows the output, not the number placed.
 * An item can sit in several visited lists; it is reported only by the node holding its first
 * slot inside the query, max(item lo, query lo): exactly one visited node holds that slot and
 * lists the item (in its cover list, or in its part list when the node is wholly inside). */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

/* A list entry carries the item's first slot so that the duplicate filter in report() does not
 * have to look the item up (most of a query's time went into those cache misses). */
typedef struct entry {
    uint32_t item, lo;
} entry;

typedef struct vec32 {
    entry *v;
    uint32_t n, cap;
} vec32;

static int vec_push(vec32 *a, entry x)
{
    if (a->n == a->cap) {
        uint32_t nc = a->cap ? 2 * a->cap : 4;
        entry *nv = realloc(a->v, (size_t)nc * sizeof *nv);
        if (!nv)
            return VMM_EHOSTMEM;
        a->v = nv;
        a->cap = nc;
    }
    a->v[a->n++] = x;
    return VMM_OK;
}

typedef struct seg_tree {
    uint32_t leaves; /* power of two >= slots */
    vec32 *cover, *part;
} seg_tree;

static int seg_insert(seg_tree *t, uint32_t node, uint32_t nl, uint32_t nr, uint32_t lo, uint32_t hi, entry item)
{
    if (hi <= nl || nr <= lo)
        return VMM_OK;
    if (lo <= nl && nr <= hi)
        return vec_push(&t->cover[node], item);
    if (vec_push(&t->part[node], item))
        return VMM_EHOSTMEM;
    uint32_t mid = nl + (nr - nl) / 2;
    if (seg_insert(t, 2 * node, nl, mid, lo, hi, item))
        return VMM_EHOSTMEM;
    return seg_insert(t, 2 * node + 1, mid, nr, lo, hi, item);
}

typedef struct span {
    uint64_t off, end;
} span;

typedef struct query {
    const seg_tree *t;
    const uint64_t *off;
    const plan_item *items;
    span *out;
    size_t n, cap;
    int oom;
} query;

static void report(query *q, const vec32 *a, uint32_t nl, uint32_t nr, uint32_t lo)
{
    if (q->n + a->n > q->cap) {
        size_t nc = 2 * (q->n + a->n);
        span *no = realloc(q->out, nc * sizeof *no);
        if (!no) {
            q->oom = 1;
            return;
        }
        q->out = no;
        q->cap = nc;
    }
    for (uint32_t k = 0; k < a->n; k++) {
        uint32_t first = a->v[k].lo > lo ? a->v[k].lo : lo;
        if (first < nl || first >= nr)
            continue;
        uint32_t j = a->v[k].item;
        q->out[q->n++] = (span){q->off[j], q->off[j] + q->items[j].size};
    }
}

static void seg_query(query *q, uint32_t node, uint32_t nl, uint32_t nr, uint32_t lo, uint32_t hi)
{
    if (hi <= nl || nr <= lo)
        return;
    report(q, &q->t->cover[node], nl, nr, lo);
    if (lo <= nl && nr <= hi) {
        report(q, &q->t->part[node], nl, nr, lo);
        return;
    }
    uint32_t mid = nl + (nr - nl) / 2;
    seg_query(q, 2 * node, nl, mid, lo, hi);
    seg_query(q, 2 * node + 1, mid, nr, lo, hi);
}

enum {
    /* Below this many spans insertion sort beats partitioning (the usual 8-32 range). */
    SPAN_SORT_SMALL = 16,
};

static void span_swap(span *a, span *b)
{
    span t = *a;
    *a = *b;
    *b = t;
}

/* Spans by offset: quicksort (median of three, the smaller side recursed, so O(log n) depth)
 * finished by insertion sort; several times faster than qsort's indirect calls here. */
static void span_sort(span *s, size_t n)
{
    while (n > SPAN_SORT_SMALL) {
        size_t m = n / 2;
        if (s[m].off < s[0].off)
            span_swap(&s[m], &s[0]);
        if (s[n - 1].off < s[0].off)
            span_swap(&s[n - 1], &s[0]);
        if (s[n - 1].off < s[m].off)
            span_swap(&s[n - 1], &s[m]);
        uint64_t pivot = s[m].off;
        size_t i = 0, j = n - 1;
        for (;;) {
            while (s[i].off < pivot)
                i++;
            while (s[j].off > pivot)
                j--;
            if (i >= j)
                break;
            span_swap(&s[i], &s[j]);
            i++;
            j--;
        }
        /* [0, j] <= pivot <= [j + 1, n) */
        size_t left = j + 1;
        if (left < n - left) {
            span_sort(s, left);
            s += left;
            n -= left;
        } else {
            span_sort(s + left, n - left);
            n = left;
        }
    }
    for (size_t i = 1; i < n; i++) {
        span x = s[i];
        size_t k = i;
        while (k > 0 && s[k - 1].off > x.off) {
            s[k] = s[k - 1];
            k--;
        }
        s[k] = x;
    }
}

/* Offset for an item of size/align among the sorted spans, by fit rule. */
static uint64_t choose_gap(const span *s, size_t n, uint64_t size, uint64_t align, int fit)
{
    uint64_t cur = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
    for (size_t k = 0; k < n; k++) {
        uint64_t at = plan_align_up(cur, align);
        if (s[k].off > at && s[k].off - at >= size) {
            uint64_t gap = s[k].off - cur;
            if (fit == PLAN_FIT_FIRST)
                return at;
            if (gap < best_gap) {
                best_gap = gap;
                best = at;
            }
        }
        if (s[k].end > cur)
            cur = s[k].end;
    }
    return best != UINT64_MAX ? best : plan_align_up(cur, align);
}

int plan_place(const plan_ctx *c, const uint32_t *order, int fit, uint64_t *off)
{
    return plan_place_fixed(c, order, 0, fit, off);
}

int plan_place_fixed(const plan_ctx *c, const uint32_t *order, size_t nfixed, int fit, uint64_t *off)
{
    seg_tree t = {1, NULL, NULL};
    while (t.leaves < c->slots)
        t.leaves *= 2;
    t.cover = calloc(2 * (size_t)t.leaves, sizeof *t.cover);
    t.part = calloc(2 * (size_t)t.leaves, sizeof *t.part);
    query q = {&t, off, c->items, malloc((c->n ? c->n : 1) * sizeof *q.out), 0, c->n ? c->n : 1, 0};
    int rc = VMM_OK;
    if (!t.cover || !t.part || !q.out)
        rc = VMM_EHOSTMEM;
    for (size_t k = 0; !rc && k < c->n; k++) {
        uint32_t i = order[k];
        const plan_item *it = &c->items[i];
        if (k < nfixed) {
            rc = seg_insert(&t, 1, 0, t.leaves, it->lo, it->hi, (entry){i, it->lo});
            continue;
        }
        q.n = 0;
        seg_query(&q, 1, 0, t.leaves, it->lo, it->hi);
        if (q.oom) {
            rc = VMM_EHOSTMEM;
            break;
        }
        span_sort(q.out, q.n);
        off[i] = choose_gap(q.out, q.n, it->size, it->align, fit);
        rc = seg_insert(&t, 1, 0, t.leaves, it->lo, it->hi, (entry){i, it->lo});
    }
    for (size_t k = 0; t.cover && t.part && k < 2 * (size_t)t.leaves; k++) {
        free(t.cover[k].v);
        free(t.part[k].v);
    }
    free(t.cover);
    free(t.part);
    free(q.out);
    return rc ? vmm_fail(VMM_EHOSTMEM, "plan: out of host memory") : VMM_OK;
}

/* ---- orders ---------------------------------------------------------------------------------- */

typedef struct keyed {
    uint64_t k1, k2;
    uint32_t idx;
} keyed;

/* k1 desc, k2 desc, index asc (so every order is deterministic). */
static int cmp_keyed(const void *a, const void *b)
{
    const keyed *x = a, *y = b;
    if (x->k1 != y->k1)
        return x->k1 < y->k1 ? 1 : -1;
    if (x->k2 != y->k2)
        return x->k2 < y->k2 ? 1 : -1;
    return (x->idx > y->idx) - (x->idx < y->idx);
}

/* Non-negative doubles order like their bit patterns read as unsigned integers. */
static uint64_t double_key(double d)
{
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

int plan_make_order(const plan_ctx *c, int rule, uint32_t *order)
{
    keyed *k = malloc((c->n ? c->n : 1) * sizeof *k);
    uint64_t *mx = NULL;
    uint32_t leaves = 1;
    if (!k)
        return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
    if (rule == PLAN_ORDER_BREADTH) {
        /* Range maximum of live bytes over each lifetime: an iterative max segment tree. */
        while (leaves < c->slots)
            leaves *= 2;
        mx = calloc(2 * (size_t)leaves, sizeof *mx);
        if (!mx) {
            free(k);
            return vmm_fail(VMM_EHOSTMEM, "plan: out of host memory");
        }
        for (uint32_t s = 0; s < c->slots; s++)
            mx[leaves + s] = c->live[s];
        for (size_t v = leaves - 1; v >= 1; v--)
            mx[v] = mx[2 * v] > mx[2 * v + 1] ? mx[2 * v] : mx[2 * v + 1];
    }
    for (size_t i = 0; i < c->n; i++) {
        const plan_item *it = &c->items[i];
        uint64_t len = it->hi - it->lo;
        keyed *e = &k[i];
        e->idx = (uint32_t)i;
        switch (rule) {
        case PLAN_ORDER_AREA:
            e->k1 = double_key((double)it->size * (double)len);
            e->k2 = it->size;
            break;
        case PLAN_ORDER_LENGTH:
            e->k1 = len;
            e->k2 = it->size;
            break;
        case PLAN_ORDER_BREADTH: {
            uint64_t m = 0;
            for (size_t l = it->lo + (size_t)leaves, r = it->hi + (size_t)leaves; l < r; l /= 2, r /= 2) {
                if (l & 1) {
                    m = mx[l] > m ? mx[l] : m;
                    l++;
                }
                if (r & 1) {
                    r--;
                    m = mx[r] > m ? mx[r] : m;
                }
            }
            e->k1 = m;
            e->k2 = it->size;
            break;
        }
        case PLAN_ORDER_START:
            e->k1 = UINT64_MAX - it->lo;
            e->k2 = it->size;
            break;
        case PLAN_ORDER_END:
            e->k1 = it->hi;
            e->k2 = it->size;
            break;
        default: /* PLAN_ORDER_SIZE */
            e->k1 = it->size;
            e->k2 = len;
            break;
        }
    }
    qsort(k, c->n, sizeof *k, cmp_keyed);
    for (size_t i = 0; i < c->n; i++)
        order[i] = k[i].idx;
    free(k);
    free(mx);
    return VMM_OK;
}

const char *plan_order_name(int rule)
{
    static const char *const names[PLAN_ORDER_COUNT] = {"size", "area", "length", "breadth", "start", "end"};
    return rule >= 0 && rule < PLAN_ORDER_COUNT ? names[rule] : "?";
}

const char *plan_fit_name(int fit) { return fit == PLAN_FIT_FIRST ? "first-fit" : "best-fit"; }
