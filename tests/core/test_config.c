// ctest-labels: unit
/* Config strings: every key parses, bad values and unknown keys give VMM_ECONFIG naming the key,
 * a failed parse leaves the config unchanged, the environment applies below the string. */
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "testutil.h"

static void expect_config_error(const char *conf, const char *key_in_message)
{
    vmm_config c, before;
    vmm_config_defaults(&c);
    before = c;
    int rc = vmm_config_parse(&c, conf);
    CHECK_EQ(rc, VMM_ECONFIG);
    if (!strstr(vmm_last_error(), key_in_message)) {
        fprintf(stderr, "message for '%s' lacks '%s': %s\n", conf, key_in_message, vmm_last_error());
        vmm_test_failures++;
    }
    CHECK(memcmp(&c, &before, sizeof c) == 0);
}

int main(void)
{
    vmm_config c;
    vmm_config_defaults(&c);
    CHECK_EQ(c.driver, VMM_DRIVER_CUDA);
    CHECK_EQ(c.expandable_segments, 1);
    CHECK(c.max_split_size == SIZE_MAX);
    CHECK_EQ(c.max_non_split_rounding, 20 * VMM_MiB);
    CHECK_EQ(c.small_page_size, 2 * VMM_MiB);
    CHECK_EQ(c.large_page_size, 2 * VMM_MiB);
    CHECK_EQ(c.sim.capacity, 80 * VMM_GiB);
    CHECK_EQ(c.sim.granularity, 2 * VMM_MiB);
    CHECK_EQ(c.grow_unlocked, 1);
    CHECK_EQ(c.lanes, 1);
    CHECK_EQ(c.depot, 1);
    {
        vmm_config g;
        vmm_config_defaults(&g);
        CHECK_OK(vmm_config_parse(&g, "lanes:false"));
        CHECK_EQ(g.lanes, 0);
        expect_config_error("lanes:2", "lanes");
        CHECK_OK(vmm_config_parse(&g, "thread_cache_depot:false"));
        CHECK_EQ(g.depot, 0);
        expect_config_error("thread_cache_depot:maybe", "thread_cache_depot");
        CHECK_EQ(g.lifetime_split, 1);
        CHECK_OK(vmm_config_parse(&g, "lifetime_split:false"));
        CHECK_EQ(g.lifetime_split, 0);
        expect_config_error("lifetime_split:2", "lifetime_split");
    }
    {
        vmm_config g;
        vmm_config_defaults(&g);
        CHECK_OK(vmm_config_parse(&g, "grow_unlocked:false"));
        CHECK_EQ(g.grow_unlocked, 0);
        expect_config_error("grow_unlocked:sometimes", "grow_unlocked");
    }

    CHECK_OK(vmm_config_parse(&c, "driver:sim, device:3,expandable_segments:False,max_split_size_mb:64,"
                                  "max_non_split_rounding_mb:8,garbage_collection_threshold:0.6,"
                                  "per_process_memory_fraction:0.5,small_page_size:4M,large_page_size:20MiB,"
                                  "sim_capacity:1G,sim_granularity:64K,sim_backed:false,"
                                  "sim_cost_ns:[mem_map:7,set_access:9],sim_fault_kind:mem_create,"
                                  "sim_fault_p:0.25,sim_fault_seed:42"));
    CHECK_EQ(c.driver, VMM_DRIVER_SIM);
    CHECK_EQ(c.device, 3);
    CHECK_EQ(c.expandable_segments, 0);
    CHECK_EQ(c.max_split_size, 64 * VMM_MiB);
    CHECK_EQ(c.max_non_split_rounding, 8 * VMM_MiB);
    CHECK(c.garbage_collection_threshold == 0.6);
    CHECK(c.per_process_memory_fraction == 0.5);
    CHECK_EQ(c.small_page_size, 4 * VMM_MiB);
    CHECK_EQ(c.large_page_size, 20 * VMM_MiB);
    CHECK_EQ(c.sim.capacity, VMM_GiB);
    CHECK_EQ(c.sim.granularity, 64 * VMM_KiB);
    CHECK_EQ(c.sim.backed, 0);
    CHECK_EQ(c.sim.cost_ns[VMM_SIM_CALL_MEM_MAP], 7);
    CHECK_EQ(c.sim.cost_ns[VMM_SIM_CALL_SET_ACCESS], 9);
    CHECK_EQ(c.sim.fail_kind, VMM_SIM_CALL_MEM_CREATE);
    CHECK(c.sim.fail_p == 0.25);
    CHECK_EQ(c.sim.fail_seed, 42);

    /* roundup_power2_divisions: one number, then PyTorch's list form. */
    CHECK_OK(vmm_config_parse(&c, "roundup_power2_divisions:4"));
    for (int i = 0; i < VMM_POW2_INTERVALS; i++)
        CHECK_EQ(c.pow2_divisions[i], 4);
    CHECK_OK(vmm_config_parse(&c, "roundup_power2_divisions:[1:16,4:8,>:2]"));
    CHECK_EQ(c.pow2_divisions[0], 16); /* below 2 MiB */
    CHECK_EQ(c.pow2_divisions[1], 8);  /* [2, 4) MiB */
    CHECK_EQ(c.pow2_divisions[2], 8);  /* [4, 8) MiB */
    CHECK_EQ(c.pow2_divisions[3], 2);
    CHECK_EQ(c.pow2_divisions[VMM_POW2_INTERVALS - 1], 2);

    /* Formatting round-trips through the parser. */
    char buf[4096];
    int n = vmm_config_format(&c, buf, sizeof buf);
    CHECK(n > 0);
    vmm_config d;
    vmm_config_defaults(&d);
    CHECK_OK(vmm_config_parse(&d, buf));
    CHECK(memcmp(&c, &d, sizeof c) == 0);
    CHECK_EQ(vmm_config_format(&c, buf, 10), VMM_ERANGE);

    /* Sizes. */
    size_t sz;
    CHECK(vmm_parse_size("80G", 3, &sz) == 0 && sz == 80 * VMM_GiB);
    CHECK(vmm_parse_size("3KiB", 4, &sz) == 0 && sz == 3 * VMM_KiB);
    CHECK(vmm_parse_size("1T", 2, &sz) == 0 && sz == ((size_t)1 << 40));
    CHECK(vmm_parse_size("17", 2, &sz) == 0 && sz == 17);
    CHECK(vmm_parse_size("", 0, &sz) != 0);
    CHECK(vmm_parse_size("12Q", 3, &sz) != 0);
    CHECK(vmm_parse_size("99999999999999999999", 20, &sz) != 0);
    CHECK(vmm_parse_size("99999999999T", 12, &sz) != 0);

    /* Bad input: the key is named and nothing changes. */
    expect_config_error("bogus:1", "bogus");
    expect_config_error("driver:opencl", "driver");
    expect_config_error("expandable_segments:maybe", "expandable_segments");
    expect_config_error("max_split_size_mb:10", "max_split_size_mb");
    expect_config_error("garbage_collection_threshold:1.5", "garbage_collection_threshold");
    expect_config_error("per_process_memory_fraction:0", "per_process_memory_fraction");
    expect_config_error("small_page_size:3M", "small_page_size");
    expect_config_error("sim_capacity:lots", "sim_capacity");
    expect_config_error("sim_granularity:1000", "sim_granularity");
    expect_config_error("roundup_power2_divisions:3", "roundup_power2_divisions");
    expect_config_error("roundup_power2_divisions:[3:4]", "roundup_power2_divisions");
    expect_config_error("sim_cost_ns:[warp:5]", "warp");
    expect_config_error("sim_fault_kind:everything", "sim_fault_kind");
    expect_config_error("device:3,expandable_segments", "expandable_segments");
    expect_config_error("device:-1", "device");

    /* VMMALLOC_CONF applies first, the string overrides it; a bad env value is reported as such. */
    setenv("VMMALLOC_CONF", "driver:sim,sim_capacity:2G", 1);
    CHECK_OK(vmm_config_load(&c, "sim_capacity:4G"));
    CHECK_EQ(c.driver, VMM_DRIVER_SIM);
    CHECK_EQ(c.sim.capacity, 4 * VMM_GiB);
    setenv("VMMALLOC_CONF", "nope:1", 1);
    CHECK_EQ(vmm_config_load(&c, NULL), VMM_ECONFIG);
    CHECK(strstr(vmm_last_error(), "VMMALLOC_CONF") != NULL);
    CHECK(strstr(vmm_last_error(), "nope") != NULL);
    unsetenv("VMMALLOC_CONF");

    /* Every key in the table is documented and accepted by the parser with its formatted default. */
    vmm_config_defaults(&c);
    const char *doc;
    size_t i = 0;
    for (const char *key; (key = vmm_config_key_doc(i, &doc)) != NULL; i++)
        CHECK(doc && strlen(doc) > 10 && strlen(key) > 2);
    CHECK(i >= 19);

    /* Status table. */
    CHECK(strcmp(vmm_status_name(VMM_ENOMEM), "ENOMEM") == 0);
    CHECK(strcmp(vmm_strerror(VMM_OK), "success") == 0);
    CHECK(strcmp(vmm_strerror(12345), "unknown status") == 0);
    CHECK(strcmp(vmm_status_name(12345), "UNKNOWN") == 0);
    TEST_DONE();
}
