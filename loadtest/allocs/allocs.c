/* allocs.c — an LD_PRELOAD shim that counts a process's heap calls (allocations per request). */
/*
 * Loaded with LD_PRELOAD=libbaton_allocs.so into the process to measure (the router, by
 * loadtest/scenarios/allocs.py). It wraps malloc, calloc, realloc, free and the aligned
 * allocators, forwards each call to glibc's own (__libc_*: no dlsym, which may itself allocate),
 * and counts calls and bytes with relaxed atomics, so every thread of the process is counted.
 *
 * Reporting is through a file: when BATON_ALLOCS_FILE names one, the counters live in a shared
 * mapping of it (struct below, host byte order), so a reader sees the live values at any time
 * without a signal or an exit hook. Without the variable the shim only counts (nothing reads it).
 * Not installed: a measuring tool, built next to the benchmarks.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

void *__libc_malloc(size_t size);
void *__libc_calloc(size_t n, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t align, size_t size);
void __libc_free(void *p);

/* The file's layout: a magic word, then the counters (all uint64, host order). */
#define ALLOCS_MAGIC 0x31434f4c4c41ULL /* "ALLOC1" */

typedef struct counters_s {
    uint64_t magic;
    _Atomic uint64_t malloc_calls;
    _Atomic uint64_t calloc_calls;
    _Atomic uint64_t realloc_calls;
    _Atomic uint64_t memalign_calls;
    _Atomic uint64_t free_calls; /* of non-NULL pointers */
    _Atomic uint64_t bytes;      /* requested by the allocating calls */
} counters_t;

/* Until the constructor maps the file (and when there is none) the counts go here. */
static counters_t local_counters;
static counters_t *ctr = &local_counters;

static void count(_Atomic uint64_t *calls, size_t bytes)
{
    atomic_fetch_add_explicit(calls, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&ctr->bytes, bytes, memory_order_relaxed);
}

__attribute__((constructor)) static void allocs_init(void)
{
    const char *path = getenv("BATON_ALLOCS_FILE");
    if (path == NULL || path[0] == '\0')
        return;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0)
        return;
    void *m = MAP_FAILED;
    if (ftruncate(fd, sizeof(counters_t)) == 0)
        m = mmap(NULL, sizeof(counters_t), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return;
    counters_t *c = m;
    /* What was counted before (the loader's own calls) carries over. */
    atomic_store(&c->malloc_calls, atomic_load(&local_counters.malloc_calls));
    atomic_store(&c->calloc_calls, atomic_load(&local_counters.calloc_calls));
    atomic_store(&c->realloc_calls, atomic_load(&local_counters.realloc_calls));
    atomic_store(&c->memalign_calls, atomic_load(&local_counters.memalign_calls));
    atomic_store(&c->free_calls, atomic_load(&local_counters.free_calls));
    atomic_store(&c->bytes, atomic_load(&local_counters.bytes));
    c->magic = ALLOCS_MAGIC;
    ctr = c;
}

void *malloc(size_t size)
{
    count(&ctr->malloc_calls, size);
    return __libc_malloc(size);
}

void *calloc(size_t n, size_t size)
{
    count(&ctr->calloc_calls, n * size);
    return __libc_calloc(n, size);
}

void *realloc(void *p, size_t size)
{
    count(&ctr->realloc_calls, size);
    return __libc_realloc(p, size);
}

void free(void *p)
{
    if (p)
        atomic_fetch_add_explicit(&ctr->free_calls, 1, memory_order_relaxed);
    __libc_free(p);
}

void *memalign(size_t align, size_t size)
{
    count(&ctr->memalign_calls, size);
    return __libc_memalign(align, size);
}

void *aligned_alloc(size_t align, size_t size)
{
    return memalign(align, size);
}

int posix_memalign(void **p, size_t align, size_t size)
{
    if (align < sizeof(void *) || (align & (align - 1)) != 0)
        return EINVAL;
    void *m = memalign(align, size);
    if (m == NULL)
        return ENOMEM;
    *p = m;
    return 0;
}

void *valloc(size_t size)
{
    return memalign((size_t)sysconf(_SC_PAGESIZE), size);
}
