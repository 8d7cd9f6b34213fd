// ctest-labels: unit
/* PyTorch's environment variables: the keys PyTorch shares with vmmalloc are applied from
 * PYTORCH_ALLOC_CONF (or, when it is unset, PYTORCH_CUDA_ALLOC_CONF) with PyTorch's value syntax
 * (True / False), below VMMALLOC_CONF and the conf string; PyTorch-only keys warn once per process
 * on stderr and are ignored; unknown keys, vmmalloc-only keys and bad values there fail with
 * VMM_ECONFIG naming the variable and the key, in vmm_config_load and vmm_create alike. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

static void clear_env(void)
{
    unsetenv("PYTORCH_ALLOC_CONF");
    unsetenv("PYTORCH_CUDA_ALLOC_CONF");
    unsetenv("VMMALLOC_CONF");
}

/* Run vmm_config_load(c, conf) with stderr captured into buf. */
static int load_captured(vmm_config *c, const char *conf, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof path, "/tmp/vmm_config_env_%d.txt", (int)getpid());
    fflush(stderr);
    int saved = dup(2);
    int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
    CHECK(saved >= 0 && fd >= 0);
    dup2(fd, 2);
    int rc = vmm_config_load(c, conf);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    lseek(fd, 0, SEEK_SET);
    ssize_t n = read(fd, buf, len - 1);
    buf[n > 0 ? n : 0] = '\0';
    close(fd);
    unlink(path);
    return rc;
}

static size_t count(const char *hay, const char *needle)
{
    size_t n = 0;
    for (const char *p = hay; (p = strstr(p, needle)) != NULL; p += strlen(needle))
        n++;
    return n;
}

static void expect_error(const char *var, const char *value, const char *in_message)
{
    clear_env();
    setenv(var, value, 1);
    vmm_config c;
    CHECK_EQ(vmm_config_load(&c, "driver:sim"), VMM_ECONFIG);
    if (!strstr(vmm_last_error(), var) || !strstr(vmm_last_error(), in_message)) {
        fprintf(stderr, "%s=%s: message lacks '%s' or the variable: %s\n", var, value, in_message,
                vmm_last_error());
        vmm_test_failures++;
    }
    vmm_allocator *a = NULL;
    CHECK_EQ(vmm_create("driver:sim,sim_capacity:64M", &a), VMM_ECONFIG);
    CHECK(a == NULL);
    CHECK(strstr(vmm_last_error(), in_message) != NULL);
}

int main(void)
{
    char err[4096];
    vmm_config c;

    /* shared keys, PyTorch's syntax */
    clear_env();
    setenv("PYTORCH_CUDA_ALLOC_CONF",
           "expandable_segments:False, max_split_size_mb:64,roundup_power2_divisions:[256:1,512:2,>:4],"
           "garbage_collection_threshold:0.7,per_process_memory_fraction:0.5,max_non_split_rounding_mb:30",
           1);
    CHECK_OK(load_captured(&c, NULL, err, sizeof err));
    CHECK_EQ(err[0], '\0'); /* nothing to warn about */
    CHECK_EQ(c.expandable_segments, 0);
    CHECK_EQ(c.max_split_size, 64 * VMM_MiB);
    CHECK_EQ(c.max_non_split_rounding, 30 * VMM_MiB);
    CHECK(c.garbage_collection_threshold == 0.7);
    CHECK(c.per_process_memory_fraction == 0.5);
    CHECK_EQ(c.pow2_divisions[0], 1);
    CHECK_EQ(c.pow2_divisions[8], 1);  /* 256 MiB */
    CHECK_EQ(c.pow2_divisions[9], 2);  /* 512 MiB */
    CHECK_EQ(c.pow2_divisions[10], 4); /* beyond */
    CHECK_EQ(c.driver, VMM_DRIVER_CUDA); /* untouched keys keep their defaults */

    /* VMMALLOC_CONF wins over PyTorch's variable, and conf over both */
    setenv("VMMALLOC_CONF", "expandable_segments:true,max_split_size_mb:128", 1);
    CHECK_OK(vmm_config_load(&c, "max_split_size_mb:256"));
    CHECK_EQ(c.expandable_segments, 1);
    CHECK_EQ(c.max_split_size, 256 * VMM_MiB);
    CHECK(c.garbage_collection_threshold == 0.7); /* still PyTorch's */

    /* PYTORCH_ALLOC_CONF is read first and PYTORCH_CUDA_ALLOC_CONF only when it is unset (PyTorch's
     * order); True / False capitalized as PyTorch writes them */
    clear_env();
    setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False,max_split_size_mb:64", 1);
    setenv("PYTORCH_ALLOC_CONF", "expandable_segments:True", 1);
    CHECK_OK(vmm_config_load(&c, NULL));
    CHECK_EQ(c.expandable_segments, 1);
    CHECK(c.max_split_size == SIZE_MAX);
    setenv("PYTORCH_ALLOC_CONF", "expandable_segments:False", 1);
    CHECK_OK(vmm_config_load(&c, NULL));
    CHECK_EQ(c.expandable_segments, 0);

    /* PyTorch-only keys: ignored with one warning per key and process */
    clear_env();
    setenv("PYTORCH_ALLOC_CONF",
           "backend:cudaMallocAsync,pinned_use_cuda_host_register:True,release_lock_on_cudamalloc:True,"
           "pinned_num_register_threads:8,graph_capture_record_stream_reuse:True,"
           "expandable_segments:False",
           1);
    CHECK_OK(load_captured(&c, "driver:sim", err, sizeof err));
    CHECK_EQ(c.expandable_segments, 0);
    CHECK_EQ(count(err, "vmmalloc: PYTORCH_ALLOC_CONF: ignoring"), 5);
    CHECK(strstr(err, "'backend:cudaMallocAsync'") != NULL);
    CHECK(strstr(err, "'pinned_use_cuda_host_register:True'") != NULL);
    CHECK(strstr(err, "'release_lock_on_cudamalloc:True'") != NULL);
    CHECK(strstr(err, "'pinned_num_register_threads:8'") != NULL);
    CHECK_OK(load_captured(&c, "driver:sim", err, sizeof err));
    CHECK_EQ(err[0], '\0'); /* once */
    /* through vmm_create too, and the result shows in the config string */
    vmm_allocator *a = NULL;
    CHECK_OK(load_captured(&c, NULL, err, sizeof err)); /* still quiet */
    CHECK_OK(vmm_create("driver:sim,sim_capacity:64M", &a));
    if (a) {
        char conf[4096];
        CHECK(vmm_config_string(a, conf, sizeof conf) > 0);
        CHECK(strstr(conf, "expandable_segments:false") != NULL);
        void *p = NULL;
        CHECK_OK(vmm_malloc(a, 1 << 20, NULL, &p));
        CHECK_OK(vmm_free(a, p));
        vmm_destroy(a);
    }

    /* errors name the variable and the key */
    expect_error("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:maybe", "expandable_segments");
    expect_error("PYTORCH_ALLOC_CONF", "max_split_size_mb:10", "max_split_size_mb");
    expect_error("PYTORCH_ALLOC_CONF", "no_such_key:1", "unknown key 'no_such_key'");
    expect_error("PYTORCH_ALLOC_CONF", "driver:sim", "VMMALLOC_CONF");
    expect_error("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments", "has no ':value'");
    /* an error in PyTorch's variable is not hidden by a good VMMALLOC_CONF */
    clear_env();
    setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:2", 1);
    setenv("VMMALLOC_CONF", "garbage_collection_threshold:0.5", 1);
    CHECK_EQ(vmm_config_load(&c, NULL), VMM_ECONFIG);
    CHECK(strstr(vmm_last_error(), "PYTORCH_ALLOC_CONF") != NULL);
    /* an empty variable is no setting */
    clear_env();
    setenv("PYTORCH_ALLOC_CONF", "", 1);
    CHECK_OK(vmm_config_load(&c, NULL));
    CHECK_EQ(c.expandable_segments, 1);
    clear_env();
    vmm_test_check_no_sim_leaks();
    TEST_DONE();
}
