// ctest-labels: unit
// ctest-plain-host: built without the library, testutil or jemalloc
/* A plain host program loads the shared library with dlopen (as PyTorch's pluggable allocator
 * does) and uses it through dlsym: the library must not need jemalloc or anything preloaded. A
 * thread that used the library's thread cache and exits after dlclose must not crash: its cache's
 * thread-exit destructor (a pthread key's) lies in the library, which therefore stays mapped. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

typedef int (*create_fn)(const char *, void **);
typedef int (*malloc_fn)(void *, size_t, void *, void **);
typedef int (*free_fn)(void *, void *);
typedef void (*destroy_fn)(void *);

static malloc_fn vmalloc;
static free_fn vfree;
static void *A;
static pthread_barrier_t bar;
static int thread_failures;

/* A small malloc + free: the block stays in this thread's cache, whose destructor runs at exit. */
static void *cached_user(void *arg)
{
    (void)arg;
    void *q = NULL;
    thread_failures += vmalloc(A, 4096, NULL, &q) != 0 || q == NULL;
    thread_failures += vfree(A, q) != 0;
    pthread_barrier_wait(&bar);
    pthread_barrier_wait(&bar); /* the allocator destroyed and the library dlclose'd */
    return NULL;
}

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
    pthread_t th;
    int threaded = 0;
    /* Loading the library must not have pulled jemalloc in either. */
    failures += dlsym(RTLD_DEFAULT, "mallctl") != NULL;
    failures += create("driver:sim,sim_capacity:1G", &a) != 0;
    if (a) {
        failures += vmalloc(a, 1 << 20, NULL, &p) != 0 || p == NULL;
        failures += vfree(a, p) != 0;
        A = a;
        threaded = pthread_barrier_init(&bar, NULL, 2) == 0 && pthread_create(&th, NULL, cached_user, NULL) == 0;
        failures += !threaded;
        if (threaded)
            pthread_barrier_wait(&bar);
        destroy(a);
    }
    dlclose(h);
    if (threaded) { /* the thread exits now: without the library mapped, its destructor crashed */
        pthread_barrier_wait(&bar);
        pthread_join(th, NULL);
        failures += thread_failures;
    }
    if (failures)
        fprintf(stderr, "%d failure(s)\n", failures);
    return failures ? 1 : 0;
}
