/* transfer/tcp_stage.c — the tcp transport's pinned bounce buffers for CUDA device memory and
 * the driver copies through them (the data path is described in tcp_stage.h). */
#include "transfer/tcp_stage.h"

#include <stdlib.h>

#include "baton/error.h"
#include "common/log.h"
#include "transfer/cuda_shim.h"

void tcp_stage_init(tcp_stage_t *st, const baton__tp_env_t *env, int target, uint64_t slice,
                    uint32_t lanes)
{
    *st = (tcp_stage_t){.env = env};
    if (target) {
        st->chunk = TCP_STAGE_RECV_CHUNK;
        st->max = lanes;
    } else {
        uint64_t n = TCP_STAGE_BOUND / slice;
        st->chunk = (size_t)slice;
        st->max = n < 2 ? 2 : (uint32_t)n;
    }
}

int tcp_stage_source(tcp_stage_t *st, const void *src, size_t len, uint8_t **chunk_p)
{
    int err = 0;
    uint8_t *c = tcp_stage_get(st, src, &err);
    if (c != NULL && (err = tcp_stage_dtoh(st, c, src, len)) != 0) {
        tcp_stage_put(st, c);
        c = NULL;
    }
    *chunk_p = c;
    return err;
}

int tcp_stage_arrived(tcp_stage_t *st, const uint8_t *chunk, size_t *fill, size_t n, uint8_t **dst,
                      uint64_t left)
{
    *fill += n;
    if (*fill < st->chunk && left > 0)
        return 0;
    int rc = tcp_stage_htod(st, *dst, chunk, *fill);
    *dst += *fill;
    *fill = 0;
    return rc;
}

#ifdef BATON_HAVE_CUDA
int tcp_stage_reg(void *addr, size_t len)
{
    CUdeviceptr base = 0, p = (CUdeviceptr)(uintptr_t)addr;
    size_t size = 0;
    if (baton__cuda_bind(p, NULL) != 0 ||
        baton__cu.mem_get_address_range(&base, &size, p) != CUDA_SUCCESS || p - base > size ||
        len > size - (p - base))
        return BATON_ENOTSUP;
    return 0;
}

/* The progress thread needs a current context for every driver call; the first device pointer
 * decides which (the primary context of the device that owns it), as registration does. */
static int stage_ctx(tcp_stage_t *st, const void *dev)
{
    if (st->ctx == 0)
        st->ctx = baton__cuda_bind((CUdeviceptr)(uintptr_t)dev, NULL) == 0 ? 1 : -1;
    return st->ctx > 0 ? 0 : BATON_ENODEV;
}

static void held_add(tcp_stage_t *st, int64_t bytes)
{
    if (st->env->stage_buffer_bytes != NULL)
        atomic_fetch_add_explicit(st->env->stage_buffer_bytes, (uint_fast64_t)bytes,
                                  memory_order_relaxed);
}

static void staged_add(tcp_stage_t *st, size_t n)
{
    if (st->env->staged_bytes != NULL)
        atomic_fetch_add_explicit(st->env->staged_bytes, n, memory_order_relaxed);
}

uint8_t *tcp_stage_get(tcp_stage_t *st, const void *dev, int *err)
{
    *err = stage_ctx(st, dev);
    if (*err != 0)
        return NULL;
    if (st->n_free > 0)
        return st->free[--st->n_free];
    if (st->n_all == st->max)
        return NULL; /* bound reached: the caller waits for a put */
    if (st->all == NULL) {
        st->all = calloc(st->max, sizeof(*st->all));
        st->free = calloc(st->max, sizeof(*st->free));
        if (st->all == NULL || st->free == NULL) {
            free(st->all);
            free(st->free);
            st->all = st->free = NULL;
            *err = BATON_ENOMEM;
            return NULL;
        }
    }
    void *p = NULL;
    CUresult r = baton__cu.mem_host_alloc(&p, st->chunk, 0);
    if (r != CUDA_SUCCESS || p == NULL) {
        log_warn("tcp", "stage_alloc_failed bytes=%zu err=%s", st->chunk, baton__cuda_errstr(r));
        *err = BATON_ENOMEM;
        return NULL;
    }
    st->all[st->n_all++] = p;
    held_add(st, (int64_t)st->chunk);
    return p;
}

void tcp_stage_put(tcp_stage_t *st, uint8_t *chunk)
{
    st->free[st->n_free++] = chunk;
}

int tcp_stage_dtoh(tcp_stage_t *st, uint8_t *chunk, const void *dev, size_t n)
{
    CUresult r = baton__cu.memcpy_dtoh(chunk, (CUdeviceptr)(uintptr_t)dev, n);
    if (r != CUDA_SUCCESS) {
        log_warn("tcp", "stage_copy_failed dir=dtoh len=%zu err=%s", n, baton__cuda_errstr(r));
        return BATON_EINVAL;
    }
    staged_add(st, n);
    return 0;
}

int tcp_stage_htod(tcp_stage_t *st, void *dev, const uint8_t *chunk, size_t n)
{
    CUresult r = baton__cu.memcpy_htod((CUdeviceptr)(uintptr_t)dev, chunk, n);
    if (r != CUDA_SUCCESS) {
        log_warn("tcp", "stage_copy_failed dir=htod len=%zu err=%s", n, baton__cuda_errstr(r));
        return BATON_EINVAL;
    }
    staged_add(st, n);
    return 0;
}

void tcp_stage_fini(tcp_stage_t *st)
{
    for (uint32_t i = 0; i < st->n_all; i++)
        if (baton__cu.mem_free_host(st->all[i]) != CUDA_SUCCESS)
            log_warn("tcp", "stage_free_failed bytes=%zu", st->chunk);
    held_add(st, -(int64_t)(st->chunk * st->n_all));
    free(st->all);
    free(st->free);
    st->all = st->free = NULL;
    st->n_all = st->n_free = 0;
}
#else
/* Without CUDA no device memory is registered, so none of these is reached. */
int tcp_stage_reg(void *addr, size_t len)
{
    return BATON_ENOTSUP;
}

uint8_t *tcp_stage_get(tcp_stage_t *st, const void *dev, int *err)
{
    *err = BATON_ENOTSUP;
    return NULL;
}

void tcp_stage_put(tcp_stage_t *st, uint8_t *chunk) {}

int tcp_stage_dtoh(tcp_stage_t *st, uint8_t *chunk, const void *dev, size_t n)
{
    return BATON_ENOTSUP;
}

int tcp_stage_htod(tcp_stage_t *st, void *dev, const uint8_t *chunk, size_t n)
{
    return BATON_ENOTSUP;
}

void tcp_stage_fini(tcp_stage_t *st) {}
#endif
