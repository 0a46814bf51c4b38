/* transfer/mem.c — memory registration (host, memfd-backed, CUDA) and region lookup. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "transfer/internal.h"

void baton__lmem_free(baton__lmem_t *m)
{
    for (int i = 0; i < BATON__MAX_TP; i++)
        free(m->blob[i]);
    free(m);
}

/* Index of the first region whose base is > addr. */
static size_t upper_bound(const baton_xfer_engine_t *eng, uintptr_t addr)
{
    size_t lo = 0, hi = eng->n_mems;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if ((uintptr_t)eng->mems[mid]->addr <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

baton_xfer_mem_t *baton__mem_find(baton_xfer_engine_t *eng, const void *addr, uint64_t len)
{
    uintptr_t a = (uintptr_t)addr;
    if (len == 0 || a > UINTPTR_MAX - len)
        return NULL;
    size_t i = upper_bound(eng, a);
    if (i == 0)
        return NULL;
    baton_xfer_mem_t *m = eng->mems[i - 1];
    uintptr_t base = (uintptr_t)m->addr;
    if (a + len > base + m->len)
        return NULL;
    return m;
}

static int overlaps(const baton_xfer_engine_t *eng, uintptr_t a, size_t len)
{
    size_t i = upper_bound(eng, a);
    if (i > 0) {
        const baton_xfer_mem_t *m = eng->mems[i - 1];
        if ((uintptr_t)m->addr + m->len > a)
            return 1;
    }
    if (i < eng->n_mems && (uintptr_t)eng->mems[i]->addr < a + len)
        return 1;
    return 0;
}

static void dereg_transports(baton_xfer_mem_t *m)
{
    for (int i = 0; i < BATON__MAX_TP; i++) {
        if (m->mr[i] == NULL)
            continue;
        int rc = m->mr[i]->tp->ops->mem_dereg(m->mr[i]);
        if (rc != 0)
            log_warn(BATON__LOG, "mem_dereg_failed id=%" PRIu32 " transport=%s err=%s", m->id,
                     m->mr[i]->tp->ops->name, baton_err_name(rc));
        m->mr[i] = NULL;
    }
}

static int do_register(baton_xfer_engine_t *eng, void *addr, size_t len, baton_xfer_mem_kind_t kind,
                       int device, int memfd, uint64_t token, baton_xfer_mem_t **mem_p)
{
    if (eng->destroying)
        return BATON_ESHUTDOWN;
    if (addr == NULL || len == 0 || (uintptr_t)addr > UINTPTR_MAX - len || mem_p == NULL)
        return BATON_EINVAL;
    if (kind != BATON_XFER_MEM_HOST && kind != BATON_XFER_MEM_CUDA)
        return BATON_EINVAL;
#ifndef BATON_HAVE_CUDA
    if (kind == BATON_XFER_MEM_CUDA)
        return BATON_ENOTSUP;
#endif
    if (overlaps(eng, (uintptr_t)addr, len))
        return BATON_EEXIST;
    if (eng->n_mems == eng->cap_mems) {
        size_t cap = eng->cap_mems ? eng->cap_mems * 2 : 8;
        baton_xfer_mem_t **a = realloc(eng->mems, cap * sizeof(*a));
        if (a == NULL)
            return BATON_ENOMEM;
        eng->mems = a;
        eng->cap_mems = cap;
    }
    baton_xfer_mem_t *m = calloc(1, sizeof(*m));
    baton__lmem_t *lm = calloc(1, sizeof(*lm));
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (m == NULL || lm == NULL || cmd == NULL) {
        free(m);
        free(lm);
        free(cmd);
        return BATON_ENOMEM;
    }
    m->eng = eng;
    m->id = eng->next_mem_id++;
    m->addr = addr;
    m->len = len;
    m->kind = kind;
    m->device = device;
    m->memfd = memfd;
    m->token = token;
    atomic_init(&m->refs, 0);
    lm->id = m->id;
    lm->base = (uint64_t)(uintptr_t)addr;
    lm->len = len;
    lm->kind = kind;
    lm->shm_ok = memfd >= 0 || kind == BATON_XFER_MEM_CUDA; /* memfd, or CUDA IPC */

    baton__tp_mem_params_t p = {addr, len, kind, device, memfd, token};
    int rc = 0;
    for (int i = 0; i < eng->n_tp; i++) {
        baton__tp_t *tp = eng->tp[i];
        rc = tp->ops->mem_reg(tp, &p, &m->mr[i]);
        if (rc == BATON_ENOTSUP) {
            /* This transport cannot reach this kind of memory; the others still can. */
            m->mr[i] = NULL;
            rc = 0;
            continue;
        }
        if (rc != 0) {
            log_warn(BATON__LOG, "mem_register_failed transport=%s len=%zu err=%s", tp->ops->name,
                     len, baton_err_name(rc));
            break;
        }
        m->mr[i]->tp = tp;
        lm->reg[i] = 1;
        uint8_t blob[BATON__TP_BLOB_MAX];
        size_t blen = 0;
        rc = tp->ops->mem_key(m->mr[i], blob, sizeof(blob), &blen);
        if (rc != 0)
            break;
        if (blen > 0) {
            lm->blob[i] = malloc(blen);
            if (lm->blob[i] == NULL) {
                rc = BATON_ENOMEM;
                break;
            }
            memcpy(lm->blob[i], blob, blen);
        }
        lm->blob_len[i] = (uint16_t)blen;
    }
    if (rc != 0) {
        dereg_transports(m);
        baton__lmem_free(lm);
        free(m);
        free(cmd);
        return rc;
    }
    size_t at = upper_bound(eng, (uintptr_t)addr);
    memmove(&eng->mems[at + 1], &eng->mems[at], (eng->n_mems - at) * sizeof(eng->mems[0]));
    eng->mems[at] = m;
    eng->n_mems++;
    cmd->type = BATON__CMD_MEM_ADD;
    cmd->u.mem_add = lm;
    baton__cmd_post(eng, cmd);
    *mem_p = m;
    return 0;
}

int baton_xfer_mem_register(baton_xfer_engine_t *engine, void *addr, size_t len,
                            baton_xfer_mem_kind_t kind, int device, baton_xfer_mem_t **mem_p)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, do_register(engine, addr, len, kind, device, -1, 0, mem_p));
}

int baton_xfer_mem_alloc(baton_xfer_engine_t *engine, size_t len, baton_xfer_mem_t **mem_p)
{
    if (engine == NULL || len == 0 || mem_p == NULL)
        return BATON_EINVAL;
    if (engine->destroying)
        return BATON_ESHUTDOWN;
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    if (len > SIZE_MAX - pg)
        return BATON_EINVAL;
    size_t maplen = (len + pg - 1) / pg * pg;
    uint64_t token = 0;
    if (getrandom(&token, sizeof(token), 0) != (ssize_t)sizeof(token))
        token = uv_hrtime() ^ (uint64_t)getpid();
    /* The name carries a random token: a peer that opens the fd through /proc checks it, so a
     * reused fd number can never be mistaken for this segment. */
    char name[64];
    snprintf(name, sizeof(name), "baton-%016" PRIx64, token);
    int fd = memfd_create(name, MFD_CLOEXEC);
    if (fd < 0)
        return uv_translate_sys_error(errno);
    if (ftruncate(fd, (off_t)maplen) != 0) {
        int e = errno;
        close(fd);
        return uv_translate_sys_error(e);
    }
    void *p = mmap(NULL, maplen, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        close(fd);
        return uv_translate_sys_error(e);
    }
    int rc = BATON__LOCKED(
        engine, do_register(engine, p, maplen, BATON_XFER_MEM_HOST, 0, fd, token, mem_p));
    if (rc != 0) {
        munmap(p, maplen);
        close(fd);
    }
    return rc;
}

void *baton_xfer_mem_addr(const baton_xfer_mem_t *mem)
{
    return mem->addr;
}

size_t baton_xfer_mem_len(const baton_xfer_mem_t *mem)
{
    return mem->len;
}

static void free_mem(baton_xfer_mem_t *m)
{
    if (m->memfd >= 0) {
        munmap(m->addr, m->len);
        close(m->memfd);
    }
    free(m);
}

static int deregister_locked(baton_xfer_engine_t *engine, baton_xfer_mem_t *mem)
{
    if (engine->destroying)
        return BATON_ESHUTDOWN;
    if (atomic_load(&mem->refs) > 0)
        return BATON_EBUSY;
    size_t i;
    for (i = 0; i < engine->n_mems; i++)
        if (engine->mems[i] == mem)
            break;
    if (i == engine->n_mems)
        return BATON_ENOTFOUND;
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return BATON_ENOMEM;
    memmove(&engine->mems[i], &engine->mems[i + 1], (engine->n_mems - i - 1) * sizeof(mem));
    engine->n_mems--;
    dereg_transports(mem);
    cmd->type = BATON__CMD_MEM_DEL;
    cmd->u.mem_del = mem->id;
    baton__cmd_post(engine, cmd);
    free_mem(mem);
    return 0;
}

int baton_xfer_mem_deregister(baton_xfer_engine_t *engine, baton_xfer_mem_t *mem)
{
    if (engine == NULL || mem == NULL || mem->eng != engine)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, deregister_locked(engine, mem));
}

/* Progress thread, at the end of shutdown, before the transports stop: the caller no longer
 * touches regions once it called destroy. */
void baton__mem_dereg_all(baton_xfer_engine_t *eng)
{
    for (size_t i = 0; i < eng->n_mems; i++)
        dereg_transports(eng->mems[i]);
}

/* Caller thread, once the engine is closed. */
void baton__mem_free_all(baton_xfer_engine_t *eng)
{
    for (size_t i = 0; i < eng->n_mems; i++)
        free_mem(eng->mems[i]);
    free(eng->mems);
    eng->mems = NULL;
    eng->n_mems = eng->cap_mems = 0;
}
