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
            "usage: vmm-plan FILE [--algo NAME] [--time-limit S] [--node-limit N] [--capacity B]\n"
            "                [--threads N] [--output OUT.csv] [--json] [--plot FILE.svg]\n"
            "  FILE        id,lower,upper,size[,alignment][,group] CSV, or a trace CSV\n"
            "              (action,addr,size,stream[,time_us]); lifetimes are [lower, upper)\n"
            "  --algo      naive, greedy, greedy-size, tree, heuristics, exact, best (default)\n"
            "  --time-limit seconds for the exact search (default 10)\n"
            "  --node-limit stop the exact search after N nodes (default: none); the search is\n"
            "              anytime: a run cut by either limit keeps the best plan found so far,\n"
            "              and N nodes give the same arena on any machine and at any load\n"
            "  --capacity  bytes the plan must fit in (exact/best stop at the first plan that does)\n"
            "  --threads   worker threads (default: CPUs); with 2 or more, exact/best run their\n"
            "              two searches side by side\n"
            "  --output    write the plan (input columns plus offset); '-' for stdout\n"
            "  --json      print one JSON object instead of the text summary\n"
            "  --plot      write the placement as an SVG picture\n");
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
    const char *file = NULL, *output = NULL, *plot = NULL;
    int json = 0;
    vmm_plan_options opt;
    vmm_plan_options_init(&opt);
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
            unsigned long long c = strtoull(v, &end, 10);
            if (end == v || *end || v[0] == '-') {
                fprintf(stderr, "vmm-plan: bad --capacity '%s'\n", v);
                return 2;
            }
            opt.capacity = c;
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
    if (json)
        fprintf(o,
                "{\"file\": \"%s\", \"algo\": \"%s\", \"winner\": \"%s\", \"buffers\": %zu, \"arena_bytes\": %llu, "
                "\"lower_bound_bytes\": %llu, \"ratio\": %.6f, \"optimal\": %s, \"fits_capacity\": %s, "
                "\"nodes\": %llu, \"seconds\": %.6f}\n",
                file, vmm_plan_algo_name(opt.algo), r.winner, p.count, (unsigned long long)r.arena_bytes,
                (unsigned long long)r.lower_bound_bytes, ratio, r.optimal ? "true" : "false",
                rc == VMM_ENOMEM ? "false" : "true", (unsigned long long)r.nodes, r.seconds);
    else
        fprintf(o, "%s: %zu buffers, algo %s (%s): arena %llu bytes, lower bound %llu (x%.4f)%s, %.3f s\n", file,
                p.count, vmm_plan_algo_name(opt.algo), r.winner, (unsigned long long)r.arena_bytes,
                (unsigned long long)r.lower_bound_bytes, ratio, r.optimal ? ", optimal" : "", r.seconds);
    vmm_plan_problem_free(&p);
    return status;
}
