// ctest-labels: unit
/*
 * The cuda driver fails cleanly, with a clear result and message, when there is no usable
 * libcuda.so.1: none at all, the CUDA toolkit's stub library, or a library without
 * cuGetProcAddress. Each case runs in a child process (the test re-executes itself) with
 * LD_LIBRARY_PATH pointing at a directory prepared for it, because the loader reads that variable
 * only at process start and the driver loads libcuda once per process.
 *
 * Without the CUDA toolkit at build time the driver must say so instead.
 */
#include <dlfcn.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "internal.h"
#include "testutil.h"

enum { MSG_LEN = 512 };

/* Open device 0 and check the result is `want` with a message containing `needle`. */
static void expect_open_fails(int want, const char *needle)
{
    char msg[MSG_LEN];
    vmm_driver *d = (vmm_driver *)&msg; /* must be reset to NULL on failure */
    int r = vmm_driver_cuda_open(0, &d, msg, sizeof msg);
    fprintf(stderr, "open: %s (%d): %s\n", vmm_drv_result_name(r), r, msg);
    CHECK_EQ(r, want);
    CHECK(d == NULL);
    CHECK(strstr(msg, needle) != NULL);
    /* The public mapping gives the allocator a "no device" status for every such case. */
    CHECK_EQ(vmm_status_from_drv(r), want == VMM_DRV_NOT_SUPPORTED ? VMM_ENOTSUP : VMM_ENODEV);
    /* A second open gives the same answer (the load outcome is kept, not retried half-way). */
    char msg2[MSG_LEN];
    CHECK_EQ(vmm_driver_cuda_open(0, &d, msg2, sizeof msg2), r);
    CHECK(strcmp(msg, msg2) == 0);
    /* No message buffer is fine too. */
    CHECK_EQ(vmm_driver_cuda_open(0, &d, NULL, 0), r);
}

#ifndef VMM_HAVE_CUDA_H

int main(void)
{
    expect_open_fails(VMM_DRV_NOT_SUPPORTED, "built without the CUDA toolkit");
    TEST_DONE();
}

#else

/* ---- child side: one case, in a process started with the case's LD_LIBRARY_PATH ---------------- */

static int child(const char *expect)
{
    if (strcmp(expect, "stub") == 0) {
        expect_open_fails(VMM_DRV_NOT_INITIALIZED, "stub library");
    } else if (strcmp(expect, "nosym") == 0) {
        expect_open_fails(VMM_DRV_NOT_SUPPORTED, "no cuGetProcAddress");
    } else if (strcmp(expect, "old") == 0) {
        /* the double reporting an 11.8 driver */
        expect_open_fails(VMM_DRV_NOT_SUPPORTED, "vmmalloc needs a driver for CUDA 12.0");
    } else if (strcmp(expect, "initfail") == 0) {
        /* a broken driver: cuInit's own result, named by the driver, and not "no GPU" */
        char msg[MSG_LEN];
        vmm_driver *d = NULL;
        int r = vmm_driver_cuda_open(0, &d, msg, sizeof msg);
        fprintf(stderr, "open: %s (%d): %s\n", vmm_drv_result_name(r), r, msg);
        CHECK_EQ(r, 304); /* CUDA_ERROR_OPERATING_SYSTEM */
        CHECK(strstr(msg, "CUDA_ERROR_OPERATING_SYSTEM") != NULL);
        CHECK(strcmp(vmm_drv_result_name(r), "CUDA_ERROR_OPERATING_SYSTEM") == 0);
        CHECK_EQ(vmm_test_gpu_gate(r, msg), 1); /* a gpu test fails, it does not skip */
        CHECK(d == NULL);
    } else if (strcmp(expect, "nodevice") == 0) {
        char msg[MSG_LEN];
        vmm_driver *d = NULL;
        int r = vmm_driver_cuda_open(0, &d, msg, sizeof msg);
        CHECK_EQ(r, VMM_DRV_NO_DEVICE);
        unsetenv("VMM_EXPECT_CUDA_DOUBLE");
        CHECK_EQ(vmm_test_gpu_gate(r, msg), 77); /* a gpu test skips */
    } else if (strcmp(expect, "baddevice") == 0) {
        char msg[MSG_LEN];
        vmm_driver *d = NULL;
        CHECK_EQ(vmm_driver_cuda_open(5, &d, msg, sizeof msg), VMM_DRV_INVALID_DEVICE);
        CHECK(strstr(msg, "cuDeviceGet(5)") != NULL);
    } else if (strcmp(expect, "absent") == 0) {
        /* Whether the system has a libcuda.so.1 decides what can be expected: on a machine with
         * a driver the search falls through to it. */
        void *probe = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!probe) {
            expect_open_fails(VMM_DRV_NOT_INITIALIZED, "libcuda.so.1 not found: ");
        } else {
            fprintf(stderr, "a system libcuda.so.1 exists: checking that open answers sanely\n");
            char msg[MSG_LEN];
            vmm_driver *d = NULL;
            int r = vmm_driver_cuda_open(0, &d, msg, sizeof msg);
            fprintf(stderr, "open: %s (%d): %s\n", vmm_drv_result_name(r), r, msg);
            if (r == VMM_DRV_SUCCESS) {
                CHECK(d != NULL);
                d->ops->close(d);
            } else {
                CHECK(r == VMM_DRV_NOT_INITIALIZED || r == VMM_DRV_NO_DEVICE ||
                      r == VMM_DRV_INVALID_DEVICE);
                CHECK(d == NULL);
                CHECK(msg[0] != '\0');
            }
            dlclose(probe);
        }
    } else {
        fprintf(stderr, "unknown case %s\n", expect);
        return 2;
    }
    TEST_DONE();
}

/* ---- parent side --------------------------------------------------------------------------------- */

/* Run this program as a child with LD_LIBRARY_PATH=libdir checking case `expect`, with the
 * environment variable `env` ("NAME=value", or NULL) set; its exit code. */
static int run_child_env(const char *libdir, const char *expect, const char *env)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        setenv("LD_LIBRARY_PATH", libdir, 1);
        if (env)
            putenv((char *)env);
        char *const args[] = {"test_cuda_nolib", "--child", (char *)expect, NULL};
        execv("/proc/self/exe", args);
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

static int run_child(const char *libdir, const char *expect) { return run_child_env(libdir, expect, NULL); }

/* A temp directory holding libcuda.so.1 as a link to `target`; path written to dir. */
static int make_libdir(char *dir, size_t len, const char *target)
{
    snprintf(dir, len, "/tmp/vmm_nolib_XXXXXX");
    if (!mkdtemp(dir))
        return -1;
    char link[PATH_MAX + 32];
    snprintf(link, sizeof link, "%s/libcuda.so.1", dir);
    if (target && symlink(target, link) != 0)
        return -1;
    return 0;
}

static void remove_libdir(const char *dir)
{
    char link[PATH_MAX + 32];
    snprintf(link, sizeof link, "%s/libcuda.so.1", dir);
    unlink(link);
    rmdir(dir);
}

/* The CUDA toolkit's stub libcuda.so, or NULL. */
static const char *find_stub(void)
{
    static char path[PATH_MAX];
    const char *roots[] = {getenv("CUDA_HOME"), getenv("CUDA_PATH"), "/usr/local/cuda"};
    for (size_t i = 0; i < sizeof roots / sizeof roots[0]; i++) {
        if (!roots[i])
            continue;
        snprintf(path, sizeof path, "%s/lib64/stubs/libcuda.so", roots[i]);
        if (access(path, R_OK) == 0)
            return path;
    }
    return NULL;
}

/* Path of a shared library that surely lacks cuGetProcAddress: the libm this program uses. */
static const char *some_other_library(void)
{
    static char path[PATH_MAX];
    double (*fn)(double) = cos;
    void *addr;
    memcpy(&addr, &fn, sizeof addr);
    Dl_info info;
    if (!dladdr(addr, &info) || !info.dli_fname || info.dli_fname[0] != '/')
        return NULL;
    snprintf(path, sizeof path, "%s", info.dli_fname);
    return path;
}

int main(int argc, char **argv)
{
    if (argc == 3 && strcmp(argv[1], "--child") == 0)
        return child(argv[2]);

    /* Bad arguments are refused before anything is loaded. */
    char msg[MSG_LEN];
    CHECK_EQ(vmm_driver_cuda_open(0, NULL, msg, sizeof msg), VMM_DRV_INVALID_VALUE);
    vmm_driver *d = (vmm_driver *)&msg;
    CHECK_EQ(vmm_driver_cuda_open(-1, &d, msg, sizeof msg), VMM_DRV_INVALID_DEVICE);
    CHECK(d == NULL);
    CHECK(strstr(msg, "-1") != NULL);

    char dir[PATH_MAX];

    /* 1. An empty directory first in the search path: no libcuda.so.1 unless the system has one. */
    CHECK_EQ(make_libdir(dir, sizeof dir, NULL), 0);
    CHECK_EQ(run_child(dir, "absent"), 0);
    remove_libdir(dir);

    /* 2. A library named libcuda.so.1 without cuGetProcAddress. */
    const char *other = some_other_library();
    CHECK(other != NULL);
    if (other) {
        CHECK_EQ(make_libdir(dir, sizeof dir, other), 0);
        CHECK_EQ(run_child(dir, "nosym"), 0);
        remove_libdir(dir);
    }

    /* 3. The toolkit's stub, under the name the driver loads; and its own directory on the path,
     *    which (with only libcuda.so there) must behave as if no library were found. */
    const char *stub = find_stub();
    if (stub) {
        CHECK_EQ(make_libdir(dir, sizeof dir, stub), 0);
        CHECK_EQ(run_child(dir, "stub"), 0);
        remove_libdir(dir);

        char stubdir[PATH_MAX], so1[PATH_MAX + 32];
        snprintf(stubdir, sizeof stubdir, "%s", stub);
        *strrchr(stubdir, '/') = '\0';
        snprintf(so1, sizeof so1, "%s/libcuda.so.1", stubdir);
        CHECK_EQ(run_child(stubdir, access(so1, F_OK) == 0 ? "stub" : "absent"), 0);
    } else {
        /* The stub comes with every toolkit that provides cuda.h; a cuda build without it is odd
         * but possible (headers copied alone): say so rather than fail. */
        fprintf(stderr, "note: no CUDA stub libcuda.so found; stub case not run\n");
    }

    /* 4. The CUDA double (tests/cudadouble) playing drivers that are there but unusable. */
    const char *dbl = getenv("VMM_CUDADOUBLE_DIR");
    if (dbl && *dbl) {
        CHECK_EQ(run_child_env(dbl, "old", "CUDADOUBLE_DRIVER_VERSION=11080"), 0);
        CHECK_EQ(run_child_env(dbl, "initfail", "CUDADOUBLE_FAIL_INIT=304"), 0);
        CHECK_EQ(run_child_env(dbl, "nodevice", "CUDADOUBLE_DEVICES=0"), 0);
        CHECK_EQ(run_child_env(dbl, "baddevice", "CUDADOUBLE_DEVICES=2"), 0);
    } else {
        fprintf(stderr, "note: VMM_CUDADOUBLE_DIR not set (no double built): driver-version and cuInit "
                        "cases not run\n");
    }
    TEST_DONE();
}

#endif
