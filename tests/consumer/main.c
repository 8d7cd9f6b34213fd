/* A user's program: includes the installed header, links the installed library, calls it. */
#include <stdio.h>
#include <string.h>

#include <vmmalloc.h>

static int failures;

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "consumer: FAILED: %s\n", what);
        failures++;
    }
}

int main(void)
{
    check(strcmp(vmm_status_name(VMM_EINVAL), "EINVAL") == 0, "vmm_status_name(VMM_EINVAL)");
    check(strcmp(vmm_status_name(VMM_OK), "OK") == 0, "vmm_status_name(VMM_OK)");
    check(strcmp(vmm_strerror(VMM_ENOMEM), vmm_strerror(VMM_EINVAL)) != 0, "distinct texts");
    check(strcmp(vmm_strerror(12345), "unknown status") == 0, "vmm_strerror(unknown)");
#ifdef CONSUMER_TRY_CREATE
    vmm_allocator *a = NULL;
    int rc = vmm_create("driver:sim,sim_capacity:1G", &a);
    if (rc != VMM_OK)
        fprintf(stderr, "consumer: vmm_create: %s: %s\n", vmm_status_name(rc), vmm_last_error());
    check(rc == VMM_OK && a != NULL, "vmm_create on the simulated device");
    if (a) {
        void *p = NULL;
        check(vmm_malloc(a, 1 << 20, NULL, &p) == VMM_OK && p != NULL, "vmm_malloc 1 MiB");
        check(vmm_free(a, p) == VMM_OK, "vmm_free");
        vmm_destroy(a);
    }
    vmm_allocator *bad = NULL;
    check(vmm_create("no_such_key:1", &bad) == VMM_ECONFIG && bad == NULL, "unknown key refused");
    check(strstr(vmm_last_error(), "no_such_key") != NULL, "message names the key");
    printf("consumer: status names, texts and an allocator on the simulated device: ok\n");
#else
    printf("consumer: status names and texts: ok (vmm_create not exported yet: not called)\n");
#endif
    return failures ? 1 : 0;
}
