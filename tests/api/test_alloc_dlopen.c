// ctest-labels: unit
// ctest-plain-host: built without the library, testutil or jemalloc
/* A plain host program loads the shared library with dlopen (as PyTorch's pluggable allocator
 * does) and uses it through dlsym: the library must not need jemalloc or anything preloaded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*create_fn)(const char *, void **);
typedef int (*malloc_fn)(void *, size_t, void *, void **);
typedef int (*free_fn)(void *, void *);
typedef void (*destroy_fn)(void *);

int main(void)
{
    const char *path = getenv("VMM_SHARED_LIB");
    if (!path) {
        fprintf(stderr, "VMM_SHARED_LIB not set\n");
        return 1;
    }
    /* The point of the test: nothing in this process provides jemalloc. */
    if (dlsym(RTLD_DEFAULT, "mallctl") != NULL) {
        fprintf(stderr, "jemalloc is loaded in the test process: the test proves nothing\n");
        return 1;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", path, dlerror());
        return 1;
    }
    create_fn create;
    malloc_fn vmalloc;
    free_fn vfree;
    destroy_fn destroy;
    *(void **)&create = dlsym(h, "vmm_create");
    *(void **)&vmalloc = dlsym(h, "vmm_malloc");
    *(void **)&vfree = dlsym(h, "vmm_free");
    *(void **)&destroy = dlsym(h, "vmm_destroy");
    if (!create || !vmalloc || !vfree || !destroy) {
        fprintf(stderr, "missing symbols\n");
        return 1;
    }
    void *a = NULL, *p = NULL;
    int failures = 0;
    /* Loading the library must not have pulled jemalloc in either. */
    failures += dlsym(RTLD_DEFAULT, "mallctl") != NULL;
    failures += create("driver:sim,sim_capacity:1G", &a) != 0;
    if (a) {
        failures += vmalloc(a, 1 << 20, NULL, &p) != 0 || p == NULL;
        failures += vfree(a, p) != 0;
        destroy(a);
    }
    dlclose(h);
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
