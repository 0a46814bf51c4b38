/* fake_cuda.c — a stand-in libcuda.so.1 for rehearsing the GPU checks on a host without a GPU:
 * the driver calls libbaton and baton-gpu-check make, behaving like the real driver where it
 * matters to them. Device memory is a memfd mapped twice: the address handed out is PROT_NONE (a
 * CPU load or store through it faults, as one into real device memory would) and the driver copies
 * through a second, private mapping. Calls that need a current context fail without one
 * (CUDA_ERROR_INVALID_CONTEXT); an IPC handle cannot be opened in the process that made it; a
 * kernel runs later, on the driver's own thread, and an event recorded after it completes only
 * then. Streams are treated as non-blocking (memory copies never wait for kernels). Only the one
 * kernel of fill.cu exists. Loaded by dlopen through LD_LIBRARY_PATH; never installed. */
#include <cuda.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "gpu_pattern.h"

#define FAKE_API __attribute__((visibility("default")))

/* ---- contexts ----------------------------------------------------------------------------- */

static int inited;
static __thread CUcontext current;
static CUcontext const primary = (CUcontext)(uintptr_t)0xc0de0000;

#define NEED_INIT()                                                                                \
    do {                                                                                           \
        if (!inited)                                                                               \
            return CUDA_ERROR_NOT_INITIALIZED;                                                     \
    } while (0)
#define NEED_CTX()                                                                                 \
    do {                                                                                           \
        NEED_INIT();                                                                               \
        if (current == NULL)                                                                       \
            return CUDA_ERROR_INVALID_CONTEXT;                                                     \
    } while (0)

FAKE_API CUresult cuInit(unsigned int flags)
{
    inited = 1;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDriverGetVersion(int *v)
{
    *v = CUDA_VERSION;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetCount(int *n)
{
    NEED_INIT();
    *n = 1;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    NEED_INIT();
    if (ordinal != 0)
        return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    NEED_INIT();
    snprintf(name, (size_t)len, "fake CUDA device (tests/gpu/fake_cuda.c)");
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    NEED_INIT();
    *v = 0; /* GPUDirect RDMA writes ordering: none (the read-back path) */
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDeviceGetPCIBusId(char *buf, int len, CUdevice d)
{
    NEED_INIT();
    snprintf(buf, (size_t)len, "0000:00:00.0");
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    NEED_INIT();
    *c = primary;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxSetCurrent(CUcontext c)
{
    NEED_INIT();
    current = c;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuCtxGetCurrent(CUcontext *c)
{
    NEED_INIT();
    *c = current;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuGetErrorString(CUresult r, const char **s)
{
    switch (r) {
    case CUDA_SUCCESS:
        *s = "no error";
        break;
    case CUDA_ERROR_INVALID_CONTEXT:
        *s = "invalid device context";
        break;
    case CUDA_ERROR_INVALID_VALUE:
        *s = "invalid argument";
        break;
    case CUDA_ERROR_NOT_FOUND:
        *s = "named symbol not found";
        break;
    case CUDA_ERROR_OUT_OF_MEMORY:
        *s = "out of memory";
        break;
    case CUDA_ERROR_NOT_READY:
        *s = "device not ready";
        break;
    default:
        *s = "fake driver error";
        break;
    }
    return CUDA_SUCCESS;
}

/* ---- device memory ------------------------------------------------------------------------ */

typedef struct {
    uintptr_t dptr; /* the PROT_NONE mapping: the "device address" */
    uint8_t *alias; /* the driver's own read-write mapping of the same pages */
    size_t len;
    int fd;
    int opened; /* by cuIpcOpenMemHandle (fd already closed) */
} fake_alloc_t;

#define MAX_ALLOCS 256
static fake_alloc_t allocs[MAX_ALLOCS];
static pthread_mutex_t mem_lock = PTHREAD_MUTEX_INITIALIZER;

static fake_alloc_t *find(uintptr_t p)
{
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].len && p >= allocs[i].dptr && p - allocs[i].dptr < allocs[i].len)
            return &allocs[i];
    return NULL;
}

/* Where the driver reads or writes `p`: device memory through its alias, host memory as is. */
static uint8_t *hostside(uintptr_t p, size_t n, int *ok)
{
    pthread_mutex_lock(&mem_lock);
    fake_alloc_t *a = find(p);
    uint8_t *r = (uint8_t *)p;
    *ok = 1;
    if (a != NULL) {
        if (n > a->len - (p - a->dptr))
            *ok = 0;
        r = a->alias + (p - a->dptr);
    }
    pthread_mutex_unlock(&mem_lock);
    return r;
}

static CUresult map_fd(int fd, size_t len, int opened, CUdeviceptr *out)
{
    void *d = mmap(NULL, len, PROT_NONE, MAP_SHARED, fd, 0);
    void *a = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (d == MAP_FAILED || a == MAP_FAILED) {
        if (d != MAP_FAILED)
            munmap(d, len);
        if (a != MAP_FAILED)
            munmap(a, len);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_lock(&mem_lock);
    for (int i = 0; i < MAX_ALLOCS; i++)
        if (allocs[i].len == 0) {
            allocs[i] = (fake_alloc_t){(uintptr_t)d, a, len, opened ? -1 : fd, opened};
            pthread_mutex_unlock(&mem_lock);
            *out = (CUdeviceptr)(uintptr_t)d;
            return CUDA_SUCCESS;
        }
    pthread_mutex_unlock(&mem_lock);
    munmap(d, len);
    munmap(a, len);
    return CUDA_ERROR_OUT_OF_MEMORY;
}

static CUresult unmap(CUdeviceptr p, int opened)
{
    pthread_mutex_lock(&mem_lock);
    fake_alloc_t *a = find((uintptr_t)p);
    if (a == NULL || a->dptr != (uintptr_t)p || a->opened != opened) {
        pthread_mutex_unlock(&mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    fake_alloc_t c = *a;
    memset(a, 0, sizeof(*a));
    pthread_mutex_unlock(&mem_lock);
    munmap((void *)c.dptr, c.len);
    munmap(c.alias, c.len);
    if (c.fd >= 0)
        close(c.fd);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuMemAlloc(CUdeviceptr *p, size_t len)
{
    NEED_CTX();
    if (len == 0)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = memfd_create("fake-cuda", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if (ftruncate(fd, (off_t)len) != 0) {
        close(fd);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult r = map_fd(fd, len, 0, p);
    if (r != CUDA_SUCCESS)
        close(fd);
    return r;
}
FAKE_API CUresult cuMemFree(CUdeviceptr p)
{
    NEED_CTX();
    return unmap(p, 0);
}
/* Pinned host memory is ordinary host memory here; like the real driver it needs a context. */
FAKE_API CUresult cuMemHostAlloc(void **p, size_t len, unsigned int flags)
{
    NEED_CTX();
    if (len == 0)
        return CUDA_ERROR_INVALID_VALUE;
    *p = malloc(len);
    return *p != NULL ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_API CUresult cuMemFreeHost(void *p)
{
    NEED_CTX();
    free(p);
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemGetInfo(size_t *free_b, size_t *total)
{
    NEED_CTX();
    *free_b = *total = (size_t)8 << 30;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemGetAddressRange(CUdeviceptr *base, size_t *size, CUdeviceptr p)
{
    NEED_CTX();
    pthread_mutex_lock(&mem_lock);
    fake_alloc_t *a = find((uintptr_t)p);
    if (a != NULL) {
        if (base)
            *base = (CUdeviceptr)a->dptr;
        if (size)
            *size = a->len;
    }
    pthread_mutex_unlock(&mem_lock);
    return a != NULL ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}
FAKE_API CUresult cuPointerGetAttribute(void *data, CUpointer_attribute attr, CUdeviceptr p)
{
    NEED_INIT();
    pthread_mutex_lock(&mem_lock);
    fake_alloc_t *a = find((uintptr_t)p);
    pthread_mutex_unlock(&mem_lock);
    if (a == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    if (attr == CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL)
        *(int *)data = 0;
    else if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE)
        *(unsigned *)data = CU_MEMORYTYPE_DEVICE;
    else
        return CUDA_ERROR_INVALID_VALUE;
    return CUDA_SUCCESS;
}

static CUresult copy(uintptr_t dst, uintptr_t src, size_t n)
{
    NEED_CTX();
    int ok_d, ok_s;
    uint8_t *d = hostside(dst, n, &ok_d);
    const uint8_t *s = hostside(src, n, &ok_s);
    if (!ok_d || !ok_s)
        return CUDA_ERROR_INVALID_VALUE;
    memmove(d, s, n);
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy((uintptr_t)dst, (uintptr_t)src, n);
}
FAKE_API CUresult cuMemcpyHtoD(CUdeviceptr dst, const void *src, size_t n)
{
    return copy((uintptr_t)dst, (uintptr_t)src, n);
}
FAKE_API CUresult cuMemcpyDtoH(void *dst, CUdeviceptr src, size_t n)
{
    return copy((uintptr_t)dst, (uintptr_t)src, n);
}
FAKE_API CUresult cuMemcpyDtoD(CUdeviceptr dst, CUdeviceptr src, size_t n)
{
    return copy((uintptr_t)dst, (uintptr_t)src, n);
}
FAKE_API CUresult cuMemsetD8(CUdeviceptr dst, unsigned char v, size_t n)
{
    NEED_CTX();
    int ok;
    uint8_t *d = hostside((uintptr_t)dst, n, &ok);
    if (!ok)
        return CUDA_ERROR_INVALID_VALUE;
    memset(d, v, n);
    return CUDA_SUCCESS;
}

/* IPC: the handle names the exporting process and its memfd; the importer maps it through
 * /proc (same host, as CUDA IPC requires). */
typedef struct {
    uint32_t magic, pid;
    int32_t fd;
    uint64_t len;
} fake_ipc_t;
#define IPC_MAGIC 0xfa6eca11u

FAKE_API CUresult cuIpcGetMemHandle(CUipcMemHandle *h, CUdeviceptr p)
{
    NEED_CTX();
    pthread_mutex_lock(&mem_lock);
    fake_alloc_t *a = find((uintptr_t)p);
    fake_ipc_t f = {0};
    if (a != NULL && a->dptr == (uintptr_t)p && !a->opened)
        f = (fake_ipc_t){IPC_MAGIC, (uint32_t)getpid(), a->fd, a->len};
    pthread_mutex_unlock(&mem_lock);
    if (f.magic == 0)
        return CUDA_ERROR_INVALID_VALUE;
    memset(h, 0, sizeof(*h));
    memcpy(h->reserved, &f, sizeof(f));
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuIpcOpenMemHandle(CUdeviceptr *p, CUipcMemHandle h, unsigned int flags)
{
    NEED_CTX();
    fake_ipc_t f;
    memcpy(&f, h.reserved, sizeof(f));
    if (f.magic != IPC_MAGIC)
        return CUDA_ERROR_INVALID_VALUE;
    if (f.pid == (uint32_t)getpid())
        return CUDA_ERROR_INVALID_CONTEXT; /* the real driver refuses its own process's handles */
    char path[64];
    snprintf(path, sizeof(path), "/proc/%u/fd/%d", f.pid, f.fd);
    int fd = open(path, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult r = map_fd(fd, f.len, 1, p);
    close(fd);
    return r;
}
FAKE_API CUresult cuIpcCloseMemHandle(CUdeviceptr p)
{
    NEED_CTX();
    return unmap(p, 1);
}

/* ---- streams, events, the kernel: one driver thread runs queued work in order --------------- */

struct CUevent_st {
    int done;
};

typedef struct job_s {
    struct job_s *next;
    CUevent ev;                          /* an event to complete, or */
    uint64_t dst, len, off, seed, delay; /* a fill */
} job_t;

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static job_t *q_head, *q_tail;
static int q_busy, q_started;
static pthread_t q_thread;

static void *runner(void *arg)
{
    pthread_mutex_lock(&q_lock);
    for (;;) {
        while (q_head == NULL)
            pthread_cond_wait(&q_cond, &q_lock);
        job_t *j = q_head;
        q_busy = 1;
        pthread_mutex_unlock(&q_lock);
        if (j->ev == NULL) {
            struct timespec ts = {(time_t)(j->delay / 1000000000u), (long)(j->delay % 1000000000u)};
            nanosleep(&ts, NULL);
            int ok;
            uint8_t *d = hostside((uintptr_t)j->dst, j->len, &ok);
            for (uint64_t i = 0; ok && i < j->len; i++)
                d[i] = gpu_pattern_byte(j->seed, j->off + i);
        }
        pthread_mutex_lock(&q_lock);
        if (j->ev != NULL)
            j->ev->done = 1;
        q_head = j->next;
        if (q_head == NULL)
            q_tail = NULL;
        q_busy = 0;
        free(j);
        pthread_cond_broadcast(&q_cond);
    }
    return NULL;
}

static CUresult enqueue(job_t *j)
{
    pthread_mutex_lock(&q_lock);
    if (!q_started) {
        if (pthread_create(&q_thread, NULL, runner, NULL) != 0) {
            pthread_mutex_unlock(&q_lock);
            free(j);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        pthread_detach(q_thread);
        q_started = 1;
    }
    if (q_tail)
        q_tail->next = j;
    else
        q_head = j;
    q_tail = j;
    pthread_cond_broadcast(&q_cond);
    pthread_mutex_unlock(&q_lock);
    return CUDA_SUCCESS;
}

static CUresult drain(void)
{
    pthread_mutex_lock(&q_lock);
    while (q_head != NULL || q_busy)
        pthread_cond_wait(&q_cond, &q_lock);
    pthread_mutex_unlock(&q_lock);
    return CUDA_SUCCESS;
}

FAKE_API CUresult cuStreamCreate(CUstream *s, unsigned int flags)
{
    NEED_CTX();
    *s = (CUstream)(uintptr_t)0x57;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuStreamDestroy(CUstream s)
{
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuStreamSynchronize(CUstream s)
{
    NEED_CTX();
    return drain();
}
FAKE_API CUresult cuCtxSynchronize(void)
{
    NEED_CTX();
    return drain();
}
FAKE_API CUresult cuEventCreate(CUevent *e, unsigned int flags)
{
    NEED_CTX();
    *e = calloc(1, sizeof(**e));
    return *e ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}
FAKE_API CUresult cuEventDestroy(CUevent e)
{
    drain(); /* never freed under the runner */
    free(e);
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuEventRecord(CUevent e, CUstream s)
{
    NEED_CTX();
    job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&q_lock);
    e->done = 0;
    pthread_mutex_unlock(&q_lock);
    j->ev = e;
    return enqueue(j);
}
FAKE_API CUresult cuEventQuery(CUevent e)
{
    NEED_INIT();
    pthread_mutex_lock(&q_lock);
    int d = e->done;
    pthread_mutex_unlock(&q_lock);
    return d ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}
FAKE_API CUresult cuEventSynchronize(CUevent e)
{
    NEED_INIT();
    pthread_mutex_lock(&q_lock);
    while (!e->done)
        pthread_cond_wait(&q_cond, &q_lock);
    pthread_mutex_unlock(&q_lock);
    return CUDA_SUCCESS;
}

static int module_tag, function_tag;
FAKE_API CUresult cuModuleLoadData(CUmodule *m, const void *image)
{
    NEED_CTX();
    *m = (CUmodule)&module_tag;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuModuleUnload(CUmodule m)
{
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    NEED_CTX();
    if (strcmp(name, GPU_FILL_KERNEL) != 0)
        return CUDA_ERROR_NOT_FOUND;
    *f = (CUfunction)&function_tag;
    return CUDA_SUCCESS;
}
FAKE_API CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shmem, CUstream s,
                                 void **params, void **extra)
{
    NEED_CTX();
    if (f != (CUfunction)&function_tag || params == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return CUDA_ERROR_OUT_OF_MEMORY;
    j->dst = *(uint64_t *)params[0];
    j->len = *(uint64_t *)params[1];
    j->off = *(uint64_t *)params[2];
    j->seed = *(uint64_t *)params[3];
    j->delay = *(uint64_t *)params[4];
    return enqueue(j);
}
