/* Instances with a known optimum: a time x address rectangle cut recursively into smaller
 * rectangles, each a buffer. Every time step is covered exactly, so the peak of live bytes (the
 * lower bound) is the rectangle's height and the cut itself is a plan that meets it: the optimum.
 * The buffers come out shuffled, each with its place in the cut as offset (a witness). */
#include <stdlib.h>
#include <string.h>

#include "planner.h"

typedef struct rect {
    int64_t t0, t1;
    uint64_t y0, y1;
} rect;

typedef struct rng {
    uint64_t s;
} rng;

static uint64_t next(rng *r)
{
    /* splitmix64: the same sequence on every platform */
    uint64_t x = (r->s += UINT64_C(0x9E3779B97F4A7C15));
    x = (x ^ (x >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)) * UINT64_C(0x94D049BB133111EB);
    return x ^ (x >> 31);
}

/* Uniform in [0, n), n > 0. */
static uint64_t below(rng *r, uint64_t n) { return next(r) % n; }

/* A cut point strictly inside [a, b) in units of g, between 15% and 85% of the way when there is
 * room; 0 when the extent cannot be cut. */
static int64_t cut_point(rng *r, int64_t a, int64_t b, int64_t g)
{
    int64_t units = (b - a) / g;
    if (units < 2)
        return 0;
    int64_t lo = units * 15 / 100, hi = units * 85 / 100;
    lo = lo < 1 ? 1 : lo;
    hi = hi < lo ? lo : hi;
    return a + g * (lo + (int64_t)below(r, (uint64_t)(hi - lo + 1)));
}

const char *plan_gen_style_name(int style)
{
    static const char *const names[VMM_PLAN_GEN_COUNT] = {"guillotine", "balanced", "alternate", "pinwheel"};
    return style >= 0 && style < VMM_PLAN_GEN_COUNT ? names[style] : "unknown";
}

VMM_API int vmm_plan_gen_style_from_name(const char *name, int *style)
{
    for (int i = 0; name && style && i < VMM_PLAN_GEN_COUNT; i++)
        if (strcmp(name, plan_gen_style_name(i)) == 0) {
            *style = i;
            return VMM_OK;
        }
    return vmm_fail(VMM_EINVAL, "plan generate: unknown cut style '%s' (guillotine, balanced, alternate, pinwheel)",
                    name ? name : "(null)");
}

VMM_API const char *vmm_plan_gen_style_name(int style) { return plan_gen_style_name(style); }

VMM_API int vmm_plan_generate(int style, size_t n, uint64_t seed, vmm_plan_buffer *out)
{
    if (style < 0 || style >= VMM_PLAN_GEN_COUNT)
        return vmm_fail(VMM_EINVAL, "plan generate: unknown cut style %d", style);
    if (n < 1 || n > VMM_PLAN_GEN_MAX || !out)
        return vmm_fail(VMM_EINVAL, "plan generate: buffer count %zu not in 1..%d (or NULL output)", n,
                        VMM_PLAN_GEN_MAX);
    rect *p = malloc(n * sizeof *p);
    int *depth = calloc(n, sizeof *depth);
    if (!p || !depth) {
        free(p);
        free(depth);
        return vmm_fail(VMM_EHOSTMEM, "plan generate: out of host memory");
    }
    rng r = {seed};
    /* 16 time steps and 1 MiB / 4n bytes per piece on average leave room to cut every piece. */
    const int64_t tg = 1;
    const int64_t yg = VMM_PLAN_GEN_GRANULE;
    p[0] = (rect){0, 16 * (int64_t)n, 0, VMM_PLAN_GEN_HEIGHT};
    size_t count = 1;
    int stuck = 0;
    while (count < n && stuck < 1000) {
        size_t k = 0;
        if (style == VMM_PLAN_GEN_BALANCED) { /* the largest piece (area, time x address share) */
            double best = -1;
            for (size_t i = 0; i < count; i++) {
                double a = (double)(p[i].t1 - p[i].t0) * (double)(p[i].y1 - p[i].y0);
                if (a > best)
                    best = a, k = i;
            }
        } else {
            k = (size_t)below(&r, count);
        }
        rect q = p[k];
        /* the direction: alternate by depth, else in proportion to the relative extents */
        double rt = (double)(q.t1 - q.t0) / (double)(16 * (int64_t)n);
        double ry = (double)(q.y1 - q.y0) / (double)VMM_PLAN_GEN_HEIGHT;
        int by_time = style == VMM_PLAN_GEN_ALTERNATE ? depth[k] % 2 == 0
                                                      : (double)below(&r, 1 << 20) / (1 << 20) * (rt + ry) < rt;
        if (style == VMM_PLAN_GEN_PINWHEEL && count + 4 <= n && below(&r, 4) == 0) {
            /* Five pieces no straight cut separates: four arms around a centre. */
            int64_t ta = cut_point(&r, q.t0, q.t1, tg), tb = ta ? cut_point(&r, ta, q.t1, tg) : 0;
            int64_t ya = (int64_t)cut_point(&r, (int64_t)q.y0, (int64_t)q.y1, yg);
            int64_t yb = ya ? cut_point(&r, ya, (int64_t)q.y1, yg) : 0;
            if (ta && tb && ya && yb) {
                uint64_t uya = (uint64_t)ya, uyb = (uint64_t)yb;
                rect arms[5] = {{q.t0, tb, q.y0, uya}, {tb, q.t1, q.y0, uyb}, {ta, q.t1, uyb, q.y1},
                                {q.t0, ta, uya, q.y1}, {ta, tb, uya, uyb}};
                int d = depth[k] + 1;
                p[k] = arms[0];
                depth[k] = d;
                for (int j = 1; j < 5; j++) {
                    p[count] = arms[j];
                    depth[count++] = d;
                }
                stuck = 0;
                continue;
            }
        }
        int64_t c = by_time ? cut_point(&r, q.t0, q.t1, tg) : cut_point(&r, (int64_t)q.y0, (int64_t)q.y1, yg);
        if (!c) {
            by_time = !by_time; /* too thin that way: the other */
            c = by_time ? cut_point(&r, q.t0, q.t1, tg) : cut_point(&r, (int64_t)q.y0, (int64_t)q.y1, yg);
        }
        if (!c) {
            stuck++;
            continue;
        }
        stuck = 0;
        rect a = q, b = q;
        if (by_time)
            a.t1 = b.t0 = c;
        else
            a.y1 = b.y0 = (uint64_t)c;
        p[k] = a;
        p[count] = b;
        depth[k]++;
        depth[count++] = depth[k];
    }
    /* Shuffle (Fisher-Yates) so that the order tells nothing of the cut. */
    for (size_t i = count; i > 1; i--) {
        size_t j = (size_t)below(&r, i);
        rect t = p[i - 1];
        p[i - 1] = p[j];
        p[j] = t;
    }
    for (size_t i = 0; i < count; i++)
        out[i] = (vmm_plan_buffer){p[i].t0, p[i].t1, p[i].y1 - p[i].y0, 0, -1, p[i].y0, 0, 0, 0, 0};
    free(p);
    free(depth);
    if (count < n)
        return vmm_fail(VMM_EINVAL, "plan generate: only %zu pieces could be cut", count);
    return VMM_OK;
}
