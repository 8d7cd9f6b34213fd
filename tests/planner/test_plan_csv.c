// ctest-labels: unit
// ctest-timeout: 300
/* Planner input: the interval CSV, the PyTorch trace CSV, malformed lines, and the shared
 * workloads end to end (heuristics, verified, close to the bound). */
#include <stdio.h>
#include <string.h>

#include "testutil.h"
#include "vmmalloc_plan.h"

static int parse(const char *text, vmm_plan_problem *p) { return vmm_plan_parse_csv(text, strlen(text), "t.csv", p); }

static void expect_error(const char *text, const char *needle)
{
    vmm_plan_problem p;
    int rc = parse(text, &p);
    CHECK_EQ(rc, VMM_EINVAL);
    if (rc == VMM_EINVAL && !strstr(vmm_last_error(), needle)) {
        fprintf(stderr, "message '%s' lacks '%s'\n", vmm_last_error(), needle);
        vmm_test_failures++;
    }
    CHECK(p.buffers == NULL && p.count == 0);
}

int main(void)
{
    vmm_plan_problem p;
    CHECK_OK(parse("id,lower,upper,size\r\nb1,0,3,4\nb2,3,9,4\n\n", &p));
    CHECK_EQ(p.count, 2);
    CHECK(strcmp(p.ids[1], "b2") == 0);
    CHECK_EQ(p.buffers[1].upper, 9);
    CHECK_EQ(p.buffers[0].group, -1);
    vmm_plan_problem_free(&p);
    CHECK_OK(parse("id,lower,upper,size,alignment,group,offset\n0,0,2,10,16,3,0\n1,1,2,7,,,5\n", &p));
    CHECK_EQ(p.count, 2);
    CHECK_EQ(p.buffers[0].alignment, 16);
    CHECK_EQ(p.buffers[0].group, 3);
    CHECK_EQ(p.buffers[1].group, -1);
    CHECK(p.has_alignment && p.has_group);
    vmm_plan_problem_free(&p);

    expect_error("id,lower,upper,size\nb1,0,3,4\nb2,3,x,4\n", "t.csv:3:");
    expect_error("id,lower,upper,size\nb1,0,3\n", "t.csv:2: 3 fields");
    expect_error("id,lower,upper,size\nb1,5,3,4\n", "t.csv:2: upper");
    expect_error("id,lower,upper,size\nb1,0,3,0\n", "t.csv:2: bad size");
    expect_error("id,lower,upper,size\nb1,0,3,-4\n", "t.csv:2: bad size");
    expect_error("id,lower,upper,size,alignment\nb1,0,3,4,3\n", "t.csv:2: bad alignment");
    expect_error("name,start,end\n", "t.csv:1: header");
    expect_error("", "empty input");
    expect_error("action,addr,size,stream\nalloc,512,64,0\nalloc,512,64,0\n", "t.csv:3: alloc");
    expect_error("action,addr,size,stream\nalloc,zz,64,0\n", "t.csv:2: bad addr");

    /* Trace: time is the event ordinal; unfreed blocks live to the end; other actions count as time. */
    CHECK_OK(parse("action,addr,size,stream,time_us\nalloc,512,100,0,1\nalloc,1024,50,0,2\n"
                   "free_requested,512,100,0,3\nfree_completed,512,100,0,4\nalloc,512,30,0,5\n", &p));
    CHECK(p.from_trace);
    CHECK_EQ(p.count, 3);
    CHECK_EQ(p.buffers[0].lower, 0);
    CHECK_EQ(p.buffers[0].upper, 3);
    CHECK_EQ(p.buffers[1].upper, 5);
    CHECK_EQ(p.buffers[2].lower, 4);
    uint64_t lb = 0;
    CHECK_OK(vmm_plan_lower_bound(p.buffers, p.count, &lb));
    CHECK_EQ(lb, 150);
    vmm_plan_problem_free(&p);

    /* The shared workloads: they must be there (a missing directory fails loudly). */
    static const char *const files[] = {
        "workloads/minimalloc/A.1048576.csv",
        "workloads/iree/iree_mobilebert.csv",
        "workloads/somas/somas_resnet50.csv",
        "workloads/pytorch/cs336_bcrafton_gpt2small_compiled_trainstep.trace.csv",
    };
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        const char *path = vmm_test_source_path(files[k]);
        int rc = vmm_plan_load_csv(path, &p);
        if (rc) {
            fprintf(stderr, "cannot load %s: %s (is workloads/ in the source tree?)\n", path,
                    vmm_last_error());
            vmm_test_failures++;
            continue;
        }
        CHECK(p.count > 50);
        vmm_plan_options o;
        vmm_plan_options_init(&o);
        o.algo = VMM_PLAN_HEURISTICS;
        vmm_plan_result r;
        CHECK_OK(vmm_plan(p.buffers, p.count, &o, &r));
        CHECK_OK(vmm_plan_verify(p.buffers, p.count, NULL));
        printf("%s: %zu buffers, arena/bound %.4f (%s)\n", files[k], p.count,
               (double)r.arena_bytes / (double)r.lower_bound_bytes, r.winner);
        if (k > 0) /* real traces: within 1% (docs/planner.md has the figures) */
            CHECK((double)r.arena_bytes <= 1.01 * (double)r.lower_bound_bytes);
        char out[4096];
        snprintf(out, sizeof out, "%s/plan_csv_roundtrip.csv", getenv("VMM_BINARY_DIR") ? getenv("VMM_BINARY_DIR") : ".");
        CHECK_OK(vmm_plan_save_csv(&p, out));
        vmm_plan_problem q;
        CHECK_OK(vmm_plan_load_csv(out, &q));
        CHECK_EQ(q.count, p.count);
        for (size_t i = 0; i < q.count && i < p.count; i++)
            CHECK(q.buffers[i].size == p.buffers[i].size && q.buffers[i].lower == p.buffers[i].lower);
        vmm_plan_problem_free(&q);
        remove(out);
        vmm_plan_problem_free(&p);
    }
    CHECK_EQ(vmm_plan_load_csv("/nonexistent/x.csv", &p), VMM_ENOTSUP);
    TEST_DONE();
}
