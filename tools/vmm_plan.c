/* vmm-plan: plan a CSV of buffer lifetimes (or a flattened PyTorch trace) into one arena.
 * Exit status: 0 planned, 1 planning failed (capacity too small, out of memory), 2 bad usage or
 * malformed input. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "vmmalloc_plan.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: vmm-plan FILE [--algo NAME] [--time-limit S] [--node-limit N] [--capacity [ID=]B]...\n"
            "                [--double-cursor] [--long-lived F] [--threads N] [--output OUT.csv]\n"
            "                [--json] [--plot FILE.svg]\n"
            "  FILE        id,lower,upper,size[,alignment][,group][,arena][,unplanned][,alias][,key]\n"
            "              CSV, or a trace CSV (action,addr,size,stream[,time_us]); lifetimes are\n"
            "              [lower, upper); arena: its id (0-15); unplanned: 1 = the runtime's (no\n"
            "              arena bytes); alias: the id of a buffer dying where this one is born\n"
            "              (upper = this lower + 1) whose bytes it may take; key: for --algo reuse\n"
            "  --algo      naive, greedy, greedy-size, tree, heuristics, exact, best (default),\n"
            "              reuse, double-cursor\n"
            "  --time-limit seconds for the exact search (default 10)\n"
            "  --node-limit stop the exact search after N nodes (default: none); the search is\n"
            "              anytime: a run cut by either limit keeps the best plan found so far,\n"
            "              and N nodes give the same arena on any machine and at any load\n"
            "  --capacity  bytes the plan must fit in (exact/best stop at the first plan that does);\n"
            "              ID=B for arena ID alone (repeat per arena), B alone for every arena\n"
            "  --double-cursor  long-lived buffers below every short-lived one (for any --algo;\n"
            "              always so with --algo double-cursor)\n"
            "  --long-lived F  long-lived = lifetime >= F of the arena's time span (default 0.5)\n"
            "  --threads   worker threads (default: CPUs); with 2 or more, exact/best run their\n"
            "              two searches (the tiling search its two time directions) side by side\n"
            "  --output    write the plan (input columns plus offset); '-' for stdout\n"
            "  --json      print one JSON object instead of the text summary\n"
            "  --plot      write the placement as an SVG picture\n"
            "or:    vmm-plan --generate STYLE --buffers N [--seed S] [--output OUT.csv]\n"
            "  writes an instance whose optimum is its lower bound, 1048576 bytes: the rectangle\n"
            "  [0, 16N) x [0, 1048576) cut into N buffers by STYLE (guillotine, balanced,\n"
            "  alternate, pinwheel), shuffled; the offset column is the cut (an optimal plan)\n");
}

/* --generate: write the instance (offsets = the cut) and stop. */
static int generate(const char *style_name, unsigned long long n, unsigned long long seed, const char *output)
{
    int style;
    if (vmm_plan_gen_style_from_name(style_name, &style)) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        return 2;
    }
    vmm_plan_problem p;
    memset(&p, 0, sizeof p);
    p.count = (size_t)n;
    p.buffers = calloc(n ? n : 1, sizeof *p.buffers);
    p.ids = calloc(n ? n : 1, sizeof *p.ids);
    int rc = p.buffers && p.ids ? vmm_plan_generate(style, (size_t)n, seed, p.buffers) : VMM_EHOSTMEM;
    for (size_t i = 0; !rc && i < p.count; i++) {
        p.ids[i] = malloc(24);
        if (!p.ids[i])
            rc = VMM_EHOSTMEM;
        else
            snprintf(p.ids[i], 24, "b%zu", i);
    }
    if (!rc)
        rc = vmm_plan_save_csv(&p, output ? output : "-");
    if (rc)
        fprintf(stderr, "vmm-plan: %s\n", rc == VMM_EHOSTMEM ? "out of host memory" : vmm_last_error());
    vmm_plan_problem_free(&p);
    return rc == VMM_EINVAL ? 2 : rc ? 1 : 0;
}

static int parse_num(const char *s, double *out)
{
    char *end;
    double v = strtod(s, &end);
    if (end == s || *end || !(v >= 0))
        return -1;
    *out = v;
    return 0;
}

int main(int argc, char **argv)
{
    const char *file = NULL, *output = NULL, *plot = NULL, *gen = NULL;
    unsigned long long gen_n = 0, gen_seed = 1;
    int json = 0;
    vmm_plan_options opt;
    vmm_plan_options_init(&opt);
    uint64_t caps[VMM_PLAN_MAX_ARENAS] = {0};
    int caps_given = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        double d;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            json = 1;
        } else if (strcmp(a, "--algo") == 0 && v) {
            if (vmm_plan_algo_from_name(v, &opt.algo)) {
                fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
                return 2;
            }
            i++;
        } else if (strcmp(a, "--time-limit") == 0 && v) {
            if (parse_num(v, &opt.time_limit_s)) {
                fprintf(stderr, "vmm-plan: bad --time-limit '%s'\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--node-limit") == 0 && v) {
            char *end;
            unsigned long long nl = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-') {
                fprintf(stderr, "vmm-plan: bad --node-limit '%s'\n", v);
                return 2;
            }
            opt.node_limit = nl;
            i++;
        } else if (strcmp(a, "--capacity") == 0 && v) {
            char *end;
            const char *eq = strchr(v, '=');
            unsigned long long id = 0;
            if (eq) {
                id = strtoull(v, &end, 10);
                if (end != eq || v[0] == '-' || id >= VMM_PLAN_MAX_ARENAS) {
                    fprintf(stderr, "vmm-plan: bad --capacity '%s' (ID=BYTES, ID from 0 to %d)\n", v,
                            VMM_PLAN_MAX_ARENAS - 1);
                    return 2;
                }
            }
            const char *num = eq ? eq + 1 : v;
            unsigned long long c = strtoull(num, &end, 10);
            if (end == num || *end || num[0] == '-' || (eq && c == 0)) {
                fprintf(stderr, "vmm-plan: bad --capacity '%s'\n", v);
                return 2;
            }
            if (eq) {
                caps[id] = c;
                caps_given = 1;
            } else {
                opt.capacity = c;
            }
            i++;
        } else if (strcmp(a, "--generate") == 0 && v) {
            gen = argv[++i];
        } else if ((strcmp(a, "--buffers") == 0 || strcmp(a, "--seed") == 0) && v) {
            char *end;
            unsigned long long x = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-') {
                fprintf(stderr, "vmm-plan: bad %s '%s'\n", a, v);
                return 2;
            }
            *(a[2] == 'b' ? &gen_n : &gen_seed) = x;
            i++;
        } else if (strcmp(a, "--double-cursor") == 0) {
            opt.double_cursor = 1;
        } else if (strcmp(a, "--long-lived") == 0 && v) {
            if (parse_num(v, &opt.long_lived) || opt.long_lived > 1) {
                fprintf(stderr, "vmm-plan: bad --long-lived '%s' (a fraction, 0 to 1)\n", v);
                return 2;
            }
            i++;
        } else if (strcmp(a, "--threads") == 0 && v) {
            if (parse_num(v, &d) || d > 1024) {
                fprintf(stderr, "vmm-plan: bad --threads '%s'\n", v);
                return 2;
            }
            opt.threads = (int)d;
            i++;
        } else if (strcmp(a, "--output") == 0 && v) {
            output = argv[++i];
        } else if (strcmp(a, "--plot") == 0 && v) {
            plot = argv[++i];
        } else if (a[0] == '-' && a[1] == '-') {
            fprintf(stderr, "vmm-plan: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        } else if (!file) {
            file = a;
        } else {
            fprintf(stderr, "vmm-plan: more than one input file\n");
            return 2;
        }
    }
    if (gen)
        return generate(gen, gen_n, gen_seed, output);
    if (!file) {
        usage(stderr);
        return 2;
    }
    vmm_plan_problem p;
    int rc = vmm_plan_load_csv(file, &p);
    if (rc) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        return rc == VMM_EHOSTMEM ? 1 : 2;
    }
    if (caps_given) {
        for (uint32_t id = 0; id < VMM_PLAN_MAX_ARENAS; id++) {
            int any = 0;
            for (size_t i = 0; i < p.count && !any; i++)
                any = p.buffers[i].arena == id && !(p.buffers[i].flags & VMM_PLAN_UNPLANNED);
            if (caps[id] && !any) {
                fprintf(stderr, "vmm-plan: --capacity %u=%llu: unknown arena %u (no planned buffer of %s "
                        "is in it)\n", id, (unsigned long long)caps[id], id, file);
                vmm_plan_problem_free(&p);
                return 2;
            }
        }
        opt.capacities = caps;
    }
    vmm_plan_result r;
    memset(&r, 0, sizeof r);
    rc = vmm_plan(p.buffers, p.count, &opt, &r);
    int status = 0;
    if (rc == VMM_EINVAL) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        vmm_plan_problem_free(&p);
        return 2;
    }
    if (rc && rc != VMM_ENOMEM) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        vmm_plan_problem_free(&p);
        return 1;
    }
    if (rc == VMM_ENOMEM) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        status = 1;
    }
    if (output && vmm_plan_save_csv(&p, output)) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        status = 1;
    }
    if (plot && vmm_plan_save_svg(&p, plot)) {
        fprintf(stderr, "vmm-plan: %s\n", vmm_last_error());
        status = 1;
    }
    FILE *o = output && strcmp(output, "-") == 0 ? stderr : stdout;
    double ratio = r.lower_bound_bytes ? (double)r.arena_bytes / (double)r.lower_bound_bytes : 1.0;
    if (json) {
        fprintf(o,
                "{\"file\": \"%s\", \"algo\": \"%s\", \"double_cursor\": %s, \"winner\": \"%s\", \"buffers\": %zu, "
                "\"unplanned\": %u, \"arena_bytes\": %llu, \"lower_bound_bytes\": %llu, \"ratio\": %.6f, "
                "\"optimal\": %s, \"fits_capacity\": %s, \"nodes\": %llu, \"seconds\": %.6f, \"arenas\": [",
                file, vmm_plan_algo_name(opt.algo),
                opt.double_cursor || opt.algo == VMM_PLAN_DOUBLE_CURSOR ? "true" : "false", r.winner, p.count,
                r.unplanned, (unsigned long long)r.arena_bytes, (unsigned long long)r.lower_bound_bytes, ratio,
                r.optimal ? "true" : "false", rc == VMM_ENOMEM ? "false" : "true", (unsigned long long)r.nodes,
                r.seconds);
        for (uint32_t k = 0; k < r.arena_count; k++) {
            const vmm_plan_arena_result *ar = &r.arenas[k];
            fprintf(o,
                    "%s{\"id\": %u, \"buffers\": %u, \"arena_bytes\": %llu, \"lower_bound_bytes\": %llu, "
                    "\"capacity\": %llu, \"long_lived_bytes\": %llu, \"optimal\": %s}",
                    k ? ", " : "", ar->id, ar->buffers, (unsigned long long)ar->bytes,
                    (unsigned long long)ar->lower_bound_bytes, (unsigned long long)ar->capacity,
                    (unsigned long long)ar->long_lived_bytes, ar->optimal ? "true" : "false");
        }
        fprintf(o, "]}\n");
    } else {
        fprintf(o, "%s: %zu buffers, algo %s (%s): arena %llu bytes, lower bound %llu (x%.4f)%s, %.3f s\n", file,
                p.count, vmm_plan_algo_name(opt.algo), r.winner, (unsigned long long)r.arena_bytes,
                (unsigned long long)r.lower_bound_bytes, ratio, r.optimal ? ", optimal" : "", r.seconds);
        if (r.arena_count > 1 || r.unplanned)
            for (uint32_t k = 0; k < r.arena_count; k++)
                fprintf(o, "  arena %u: %u buffers, %llu bytes, lower bound %llu%s\n", r.arenas[k].id,
                        r.arenas[k].buffers, (unsigned long long)r.arenas[k].bytes,
                        (unsigned long long)r.arenas[k].lower_bound_bytes, r.arenas[k].optimal ? ", optimal" : "");
        if (r.unplanned)
            fprintf(o, "  unplanned (the runtime's): %u buffers\n", r.unplanned);
    }
    vmm_plan_problem_free(&p);
    return status;
}
