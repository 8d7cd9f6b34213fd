// ctest-labels: unit
/* sim_cost_file: a cost table by size (the costs.json tools/gpu-check writes) is loaded, sets flat
 * costs and sized points, interpolates between points, and is what an allocator's modeled driver
 * time then follows; a bad file leaves the configuration as it was. The built-in model stays the
 * default (no file). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static char dir[] = "/tmp/vmm_sim_costs_XXXXXX";

static const char *write_file(const char *name, const char *text)
{
    static char path[4][512];
    static int next;
    char *p = path[next++ % 4];
    snprintf(p, sizeof path[0], "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
    return p;
}

static void expect_bad(const char *path, const char *in_message)
{
    vmm_config c, before;
    vmm_config_defaults(&c);
    before = c;
    char conf[600];
    snprintf(conf, sizeof conf, "sim_cost_file:%s", path);
    CHECK_EQ(vmm_config_parse(&c, conf), VMM_ECONFIG);
    if (!strstr(vmm_last_error(), in_message)) {
        fprintf(stderr, "message for %s lacks '%s': %s\n", path, in_message, vmm_last_error());
        vmm_test_failures++;
    }
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

/* Modeled driver time of: 100 MiB then 30 MiB malloc'd (no free) on a fresh unbacked sim. */
static uint64_t driver_time_of(const char *extra, int64_t *reserved)
{
    char conf[700];
    snprintf(conf, sizeof conf, "driver:sim,sim_backed:false,sim_capacity:4G,thread_cache:0%s%s", *extra ? "," : "",
             extra);
    vmm_allocator *a = NULL;
    CHECK_OK(vmm_create(conf, &a));
    if (!a)
        return 0;
    void *p = NULL, *q = NULL;
    CHECK_OK(vmm_malloc(a, 100u << 20, NULL, &p));
    CHECK_OK(vmm_malloc(a, 30u << 20, NULL, &q));
    vmm_sim_counters k;
    CHECK_OK(vmm_sim_get_counters(a, &k));
    *reserved = vmm_test_stats(a).reserved_bytes[VMM_POOL_ALL].current;
    CHECK_OK(vmm_free(a, p));
    CHECK_OK(vmm_free(a, q));
    vmm_destroy(a);
    return k.driver_time_ns;
}

int main(void)
{
    CHECK(mkdtemp(dir) != NULL);

    /* the default: no file, the built-in flat model */
    vmm_config c;
    vmm_config_defaults(&c);
    CHECK_EQ(c.sim.n_cost_points, 0);
    CHECK_EQ(c.sim.cost_ns[VMM_SIM_CALL_MEM_CREATE], 193000);
    char buf[4096];
    CHECK(vmm_config_format(&c, buf, sizeof buf) > 0);
    CHECK(strstr(buf, "sim_cost_file:none") != NULL);

    /* a table: other members are ignored; size 0 is flat; points by size */
    const char *good = write_file("costs.json",
                                  "{\"device\": \"x\", \"costs\": {\"a\": [1, 2]},\n"
                                  " \"sim_cost_table\": [\n"
                                  "  [\"mem_map\", 0, 7],\n"
                                  "  [\"mem_create\", 2097152, 1000], [\"mem_create\", 20971520, 10000],\n"
                                  "  [\"set_access\", 4194304, 200] , [\"set_access\",2097152,100]\n"
                                  " ],\n \"after\": null}\n");
    char conf[600];
    snprintf(conf, sizeof conf, "sim_cost_file:%s", good);
    CHECK_OK(vmm_config_parse(&c, conf));
    CHECK_EQ(c.sim.n_cost_points, 4);
    CHECK_EQ(c.sim.cost_ns[VMM_SIM_CALL_MEM_MAP], 7);
    CHECK_EQ(c.sim.cost_ns[VMM_SIM_CALL_MEM_CREATE], 193000); /* flat stays for kinds without size 0 */
    CHECK(strcmp(c.sim.cost_file, good) == 0);
    const vmm_sim_options *o = &c.sim;
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_MEM_CREATE, 2u << 20), 1000);
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_MEM_CREATE, 20u << 20), 10000);
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_MEM_CREATE, 11u << 20), 5500);  /* between: linear */
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_MEM_CREATE, 1u << 20), 1000);   /* below: the first */
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_MEM_CREATE, 38u << 20), 19000); /* above: the line */
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_SET_ACCESS, 3u << 20), 150);     /* order in the file free */
    CHECK_EQ(vmm_sim_cost_of(o, VMM_SIM_CALL_MEM_MAP, 64u << 20), 7);        /* no points: flat */
    CHECK(vmm_config_format(&c, buf, sizeof buf) > 0);
    CHECK(strstr(buf, good) != NULL);
    CHECK_OK(vmm_config_parse(&c, "sim_cost_file:none"));
    CHECK_EQ(c.sim.n_cost_points, 0);
    CHECK_EQ(c.sim.cost_ns[VMM_SIM_CALL_MEM_MAP], 7); /* flat costs the file set stay, as sim_cost_ns */

    /* bad files: a clear message, the configuration unchanged */
    char missing[600];
    snprintf(missing, sizeof missing, "%s/absent.json", dir);
    expect_bad(missing, "cannot open");
    expect_bad(write_file("none.json", "{\"costs\": []}"), "no \"sim_cost_table\"");
    expect_bad(write_file("kind.json", "{\"sim_cost_table\": [[\"warp\", 0, 1]]}"), "warp");
    expect_bad(write_file("shape.json", "{\"sim_cost_table\": [[\"mem_map\", -1, 1]]}"), "bad item");
    expect_bad(write_file("open.json", "{\"sim_cost_table\": [[\"mem_map\", 0, 1]"), "bad item");

    /* the allocator's modeled time follows the table: every flat cost 0, mem_create 1000 ns per
     * 2 MiB (two points, extrapolated above), so driver time = 1000 x created bytes / 2 MiB */
    char table[4096];
    int w = snprintf(table, sizeof table, "{\"sim_cost_table\": [");
    for (int k = 0; k < VMM_SIM_CALL_COUNT; k++)
        w += snprintf(table + w, sizeof table - (size_t)w, "[\"%s\", 0, 0],", vmm_sim_call_name(k));
    snprintf(table + w, sizeof table - (size_t)w,
             "[\"mem_create\", 2097152, 1000], [\"mem_create\", 4194304, 2000]]}");
    const char *linear = write_file("linear.json", table);
    char extra[600];
    snprintf(extra, sizeof extra, "sim_cost_file:%s", linear);
    int64_t reserved = 0, reserved_default = 0;
    uint64_t t = driver_time_of(extra, &reserved);
    uint64_t t_default = driver_time_of("", &reserved_default);
    CHECK(reserved >= (130 << 20));
    CHECK_EQ(reserved, reserved_default);
    CHECK_EQ((long long)t, (long long)(1000 * (uint64_t)reserved / (2u << 20)));
    CHECK(t_default > 193000); /* the built-in model: at least one create at 193 us */
    CHECK(t != t_default);

    unlink(good);
    unlink(linear);
    static const char *const others[] = {"none.json", "kind.json", "shape.json", "open.json"};
    for (int i = 0; i < 4; i++) {
        char p[600];
        snprintf(p, sizeof p, "%s/%s", dir, others[i]);
        unlink(p);
    }
    rmdir(dir);
    vmm_test_check_no_sim_leaks();
    TEST_DONE();
}
