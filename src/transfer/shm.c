/* transfer/shm.c — the shared-memory transport (same host): the writer maps the reader's memfd
 * pages and copies straight into them, behind a cross-process fence; CUDA IPC for device memory. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/log.h"
#include "transfer/transport.h"
#include "common/u64map.h"

#include "transfer/cuda_shim.h"
#include "transfer/le_bytes.h"

/*
 * Handles. The decode side (TARGET) keeps its pages in memfd segments (baton_xfer_mem_alloc).
 * A segment travels as (pid, fd number, token): the prefill side (INITIATOR) opens
 * /proc/<pid>/fd/<fd>, checks that the link names the memfd "baton-<token>" (a reused fd
 * number cannot pass), checks the size and maps it. Both sides first prove they share a host
 * and a pid namespace (boot id + pid-namespace inode in the handshake blob).
 *
 * Fence. The writer, not the reader, moves the bytes, so the reader cannot stop them by closing
 * a socket. Each connection has a one-page fence segment owned by the reader:
 *   writer, around every copy step:  busy = 1; if (revoked) { busy = 0; stop; } copy; busy = 0;
 *   reader, to fence:                revoked = 1; wait until busy == 0 or the writer is dead.
 * Both use sequentially consistent atomics, so either the writer sees `revoked` before it
 * copies, or the reader sees `busy` and waits for the step to end. Either way, once the fence
 * callback runs no byte can land anymore. The writer's death is seen through a pidfd.
 */

#define SHM_BLOB_VERSION 1
#define FENCE_MAGIC      0x46454E43424154ull /* "BATFENC" */
#define COPY_BUDGET      (32u << 20)         /* bytes copied per loop iteration, all peers */

typedef struct {
    uint64_t magic;
    _Atomic uint64_t revoked;
    _Atomic uint64_t busy;
} shm_fence_t;

typedef struct {
    char boot_id[37];
    uint64_t pidns;
    uint32_t pid;
} host_id_t;

typedef struct shm_tp_s shm_tp_t;
typedef struct shm_peer_s shm_peer_t;

typedef struct shm_job_s {
    struct shm_job_s *next;
    baton__tp_write_t *w;
    size_t sge;
    uint64_t off;
} shm_job_t;

struct shm_tp_s {
    baton__tp_t base;
    host_id_t self;
    uv_idle_t copier;
    int copier_on;
    shm_peer_t *active; /* peers with queued jobs (singly linked) */
    int cuda_ready;
};

typedef struct {
    baton__tp_mr_t base;
    int memfd;
    uint64_t token;
#ifdef BATON_HAVE_CUDA
    CUipcMemHandle ipc;
    uint64_t ipc_offset;
#endif
} shm_mr_t;

typedef struct {
    uint8_t *map;   /* our mapping of the peer's region */
    size_t map_len; /* host: mmap length */
    uint64_t base;  /* the peer's address of the region */
    uint64_t len;
    baton_xfer_mem_kind_t kind;
#ifdef BATON_HAVE_CUDA
    CUdeviceptr dbase; /* opened IPC allocation (cuIpcCloseMemHandle) */
#endif
} shm_rmem_t;

struct shm_peer_s {
    baton__tp_peer_t base;
    shm_peer_t *next_active;
    int queued_active;
    host_id_t remote;
    /* target: our fence segment */
    int fence_fd;
    uint64_t fence_token;
    shm_fence_t *fence; /* target: own mapping; initiator: mapping of the peer's */
    int pidfd;          /* target: the writer process */
    uv_timer_t *fence_timer;
    /* initiator */
    baton_u64map_t rmems;
    shm_job_t *jobs_head, *jobs_tail;
    int failed;
    int fencing;
    baton__tp_done_cb cb;
    void *cb_arg;
    int cb_status;
};

static int read_host_id(host_id_t *h)
{
    memset(h, 0, sizeof(*h));
    int fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return BATON_ENODEV;
    ssize_t n = read(fd, h->boot_id, 36);
    close(fd);
    if (n != 36)
        return BATON_ENODEV;
    struct stat st;
    if (stat("/proc/self/ns/pid", &st) != 0)
        return BATON_ENODEV;
    h->pidns = (uint64_t)st.st_ino;
    h->pid = (uint32_t)getpid();
    return 0;
}

/* Opens a memfd of another process by (pid, fd), checking it is the one named by token. */
static int open_peer_fd(uint32_t pid, int32_t fd, uint64_t token, int *out)
{
    if (fd < 0 || pid == 0)
        return BATON_ERKEY;
    char path[64], link[256], want[40];
    snprintf(path, sizeof(path), "/proc/%" PRIu32 "/fd/%" PRId32, pid, fd);
    ssize_t n = readlink(path, link, sizeof(link) - 1);
    if (n < 0)
        return BATON_ERKEY;
    link[n] = '\0';
    snprintf(want, sizeof(want), "baton-%016" PRIx64, token);
    if (strstr(link, want) == NULL)
        return BATON_ERKEY; /* the fd number now names something else */
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0)
        return BATON_ERKEY;
    /* The link may have changed between readlink and open: check again on the open file. */
    char self[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", f);
    n = readlink(self, link, sizeof(link) - 1);
    if (n < 0 || (link[n] = '\0', strstr(link, want) == NULL)) {
        close(f);
        return BATON_ERKEY;
    }
    *out = f;
    return 0;
}

/* ---- handshake blobs -------------------------------------------------------------------- */

#define PEER_BLOB_LEN (1 + 1 + 2 + 4 + 8 + 36 + 4 + 8 + 8)

static size_t enc_peer_blob(uint8_t *b, const host_id_t *h, int32_t fence_fd, uint64_t token,
                            uint64_t gen)
{
    b[0] = SHM_BLOB_VERSION;
    b[1] = 0;
    b[2] = b[3] = 0;
    baton__le_put32(b + 4, h->pid);
    baton__le_put64(b + 8, h->pidns);
    memcpy(b + 16, h->boot_id, 36);
    baton__le_put32(b + 52, (uint32_t)fence_fd);
    baton__le_put64(b + 56, token);
    baton__le_put64(b + 64, gen);
    return PEER_BLOB_LEN;
}

static int dec_peer_blob(const uint8_t *b, size_t len, host_id_t *h, int32_t *fence_fd,
                         uint64_t *token)
{
    if (len != PEER_BLOB_LEN || b[0] != SHM_BLOB_VERSION)
        return BATON_EPROTO;
    memset(h, 0, sizeof(*h));
    h->pid = baton__le_get32(b + 4);
    h->pidns = baton__le_get64(b + 8);
    memcpy(h->boot_id, b + 16, 36);
    for (int i = 0; i < 36; i++)
        if (h->boot_id[i] < 0x20 || h->boot_id[i] > 0x7e)
            return BATON_EPROTO;
    *fence_fd = (int32_t)baton__le_get32(b + 52);
    *token = baton__le_get64(b + 56);
    if (h->pid == 0)
        return BATON_EPROTO;
    return 0;
}

static int same_host(const host_id_t *a, const host_id_t *b)
{
    return memcmp(a->boot_id, b->boot_id, 36) == 0 && a->pidns == b->pidns;
}

/* ---- CUDA (device memory through CUDA IPC) ----------------------------------------------- */

#ifdef BATON_HAVE_CUDA
/* Makes a primary context current on the progress thread once. */
static int cuda_ready(shm_tp_t *t)
{
    if (t->cuda_ready)
        return t->cuda_ready > 0 ? 0 : BATON_ENODEV;
    CUdevice dev;
    CUcontext ctx;
    if (baton__cuda_load() != 0 || baton__cu.device_get(&dev, 0) != CUDA_SUCCESS ||
        baton__cu.primary_ctx_retain(&ctx, dev) != CUDA_SUCCESS ||
        baton__cu.ctx_set_current(ctx) != CUDA_SUCCESS) {
        t->cuda_ready = -1;
        return BATON_ENODEV;
    }
    t->cuda_ready = 1;
    return 0;
}
#endif

/* ---- the copier --------------------------------------------------------------------------- */

static void schedule(shm_tp_t *t, shm_peer_t *p);

static void finish_job(shm_peer_t *p, int status)
{
    shm_job_t *j = p->jobs_head;
    p->jobs_head = j->next;
    if (p->jobs_head == NULL)
        p->jobs_tail = NULL;
    baton__tp_write_t *w = j->w;
    free(j);
    w->cb(w, status);
}

static void failed_deferred(void *arg)
{
    shm_peer_t *p = arg;
    if (!p->fencing)
        p->base.tp->env->peer_failed(&p->base, p->failed);
}

static void peer_fail(shm_peer_t *p, int err, const char *why)
{
    if (p->failed || p->fencing)
        return;
    p->failed = err;
    log_warn("shm", "peer_failed gen=%016" PRIx64 " err=%s reason=\"%s\"", p->base.generation,
             baton_err_name(err), why);
    if (baton__tp_defer(p->base.tp->env, failed_deferred, p) != 0)
        p->base.tp->env->peer_failed(&p->base, err);
}

/* Copies up to *budget bytes of p's queue. Returns 0 when the queue is empty. */
static int copy_some(shm_tp_t *t, shm_peer_t *p, uint64_t *budget)
{
    uint64_t slice = t->base.env->cfg->slice_size ? t->base.env->cfg->slice_size : 65536;
    while (p->jobs_head != NULL && *budget > 0) {
        if (p->failed || p->fencing)
            return 0;
        shm_job_t *j = p->jobs_head;
        const baton__tp_sge_t *g = &j->w->sges[j->sge];
        shm_rmem_t *rm = baton_u64map_get(&p->rmems, g->dst_mem);
        if (rm == NULL) {
            finish_job(p, BATON_ERKEY); /* withdrawn meanwhile */
            continue;
        }
        uint64_t n = g->len - j->off;
        if (n > slice)
            n = slice;
        uint8_t *dst = rm->map + (g->dst - rm->base) + j->off;
        const uint8_t *src = (const uint8_t *)g->src + j->off;
        atomic_store(&p->fence->busy, 1);
        if (atomic_load(&p->fence->revoked)) {
            atomic_store(&p->fence->busy, 0);
            peer_fail(p, BATON_EPEERDOWN, "the reader revoked this connection");
            return 0;
        }
#ifdef BATON_HAVE_CUDA
        if (rm->kind == BATON_XFER_MEM_CUDA || g->src_mr->kind == BATON_XFER_MEM_CUDA) {
            /* the driver copies only with a context current on this (the progress) thread */
            CUresult r = cuda_ready(t) != 0 ? CUDA_ERROR_INVALID_CONTEXT
                                            : baton__cu.memcpy((CUdeviceptr)(uintptr_t)dst,
                                                               (CUdeviceptr)(uintptr_t)src, n);
            atomic_store(&p->fence->busy, 0);
            if (r != CUDA_SUCCESS) {
                finish_job(p, BATON_EINVAL);
                continue;
            }
        } else
#endif
        {
            memcpy(dst, src, n);
            atomic_store(&p->fence->busy, 0);
        }
        j->off += n;
        *budget = *budget > n ? *budget - n : 0;
        if (j->off == g->len) {
            j->off = 0;
            if (++j->sge == j->w->n_sges)
                finish_job(p, 0);
        }
    }
    return p->jobs_head != NULL;
}

static void on_copier(uv_idle_t *h)
{
    shm_tp_t *t = h->data;
    uint64_t budget = COPY_BUDGET;
    shm_peer_t *list = t->active;
    t->active = NULL;
    /* Round robin: every active peer gets a share of this iteration's budget. */
    while (list != NULL) {
        shm_peer_t *p = list;
        list = p->next_active;
        p->queued_active = 0;
        uint64_t share = budget / 2 > (1u << 20) ? budget / 2 : (1u << 20);
        if (copy_some(t, p, &share) && !p->failed && !p->fencing)
            schedule(t, p);
        budget = budget > share ? budget - share : 0;
    }
    if (t->active == NULL) {
        uv_idle_stop(&t->copier);
        t->copier_on = 0;
    }
}

static void schedule(shm_tp_t *t, shm_peer_t *p)
{
    if (!p->queued_active) {
        p->queued_active = 1;
        p->next_active = NULL;
        shm_peer_t **pp = &t->active;
        while (*pp != NULL)
            pp = &(*pp)->next_active;
        *pp = p;
    }
    if (!t->copier_on) {
        t->copier_on = 1;
        uv_idle_start(&t->copier, on_copier);
    }
}

static void unschedule(shm_tp_t *t, shm_peer_t *p)
{
    for (shm_peer_t **pp = &t->active; *pp != NULL; pp = &(*pp)->next_active) {
        if (*pp == p) {
            *pp = p->next_active;
            break;
        }
    }
    p->queued_active = 0;
}

/* ---- ops: transport ------------------------------------------------------------------------ */

static int shm_init(const baton__tp_env_t *env, baton__tp_t **tp_p)
{
    shm_tp_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return BATON_ENOMEM;
    int rc = read_host_id(&t->self);
    if (rc != 0) {
        free(t);
        return rc;
    }
    uv_idle_init(env->loop, &t->copier);
    t->copier.data = t;
    *tp_p = &t->base;
    return 0;
}

static void copier_closed(uv_handle_t *h)
{
    free(h->data);
}

static void shm_fini(baton__tp_t *tp)
{
    shm_tp_t *t = (shm_tp_t *)tp;
    uv_close((uv_handle_t *)&t->copier, copier_closed);
}

static int shm_query(baton__tp_t *tp, baton__tp_caps_t *caps)
{
    memset(caps, 0, sizeof(*caps));
    caps->same_host = 1;
    caps->needs_shm = 1;
#ifdef BATON_HAVE_CUDA
    caps->cuda_local = 1;
    caps->cuda_remote = 1;
#endif
    return 0;
}

static int shm_mem_reg(baton__tp_t *tp, const baton__tp_mem_params_t *prm, baton__tp_mr_t **mr_p)
{
    shm_mr_t *m = calloc(1, sizeof(*m));
    if (m == NULL)
        return BATON_ENOMEM;
    m->base.addr = prm->addr;
    m->base.len = prm->len;
    m->base.kind = prm->kind;
    m->memfd = prm->memfd;
    m->token = prm->shm_token;
    if (prm->kind == BATON_XFER_MEM_CUDA) {
#ifdef BATON_HAVE_CUDA
        CUdeviceptr base = 0;
        size_t size = 0;
        /* registration runs on the caller's thread, which may have no current context */
        if (baton__cuda_bind((CUdeviceptr)(uintptr_t)prm->addr, NULL) != 0 ||
            baton__cu.mem_get_address_range(&base, &size, (CUdeviceptr)(uintptr_t)prm->addr) !=
                CUDA_SUCCESS ||
            baton__cu.ipc_get_mem_handle(&m->ipc, base) != CUDA_SUCCESS) {
            free(m);
            return BATON_ENOTSUP;
        }
        m->ipc_offset = (uint64_t)((CUdeviceptr)(uintptr_t)prm->addr - base);
#else
        free(m);
        return BATON_ENOTSUP;
#endif
    }
    *mr_p = &m->base;
    return 0;
}

/* Key: u8 version, u8 kind, u16 0, u32 pid, i32 fd, u64 token, u64 len
 *      [CUDA: 64-byte IPC handle, u64 offset into its allocation]. */
#define KEY_HOST_LEN 28
#define KEY_CUDA_LEN (KEY_HOST_LEN + 64 + 8)

static int shm_mem_key(baton__tp_mr_t *mr, uint8_t *buf, size_t cap, size_t *len_p)
{
    shm_mr_t *m = (shm_mr_t *)mr;
    shm_tp_t *t = (shm_tp_t *)mr->tp;
    *len_p = 0;
    if (mr->kind == BATON_XFER_MEM_HOST && m->memfd < 0)
        return 0; /* plain host memory: usable as a source, not reachable as a destination */
    if (cap < KEY_CUDA_LEN)
        return BATON_ETOOBIG;
    buf[0] = SHM_BLOB_VERSION;
    buf[1] = (uint8_t)mr->kind;
    buf[2] = buf[3] = 0;
    baton__le_put32(buf + 4, t->self.pid);
    baton__le_put32(buf + 8, (uint32_t)m->memfd);
    baton__le_put64(buf + 12, m->token);
    baton__le_put64(buf + 20, mr->len);
    *len_p = KEY_HOST_LEN;
#ifdef BATON_HAVE_CUDA
    if (mr->kind == BATON_XFER_MEM_CUDA) {
        memcpy(buf + KEY_HOST_LEN, &m->ipc, 64);
        baton__le_put64(buf + KEY_HOST_LEN + 64, m->ipc_offset);
        *len_p = KEY_CUDA_LEN;
    }
#endif
    return 0;
}

static int shm_mem_dereg(baton__tp_mr_t *mr)
{
    free(mr);
    return 0;
}

/* ---- ops: peers --------------------------------------------------------------------------- */

static int shm_peer_create(baton__tp_t *tp, baton__tp_role_t role, uint64_t generation,
                           baton__tp_peer_t **peer_p)
{
    shm_peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return BATON_ENOMEM;
    p->base.tp = tp;
    p->base.role = role;
    p->base.generation = generation;
    p->fence_fd = -1;
    p->pidfd = -1;
    baton_u64map_init(&p->rmems);
    if (role == BATON__TP_ROLE_TARGET) {
        if (getrandom(&p->fence_token, sizeof(p->fence_token), 0) != sizeof(p->fence_token))
            p->fence_token = uv_hrtime() ^ generation;
        char name[40];
        snprintf(name, sizeof(name), "baton-%016" PRIx64, p->fence_token);
        p->fence_fd = memfd_create(name, MFD_CLOEXEC);
        if (p->fence_fd < 0 || ftruncate(p->fence_fd, 4096) != 0) {
            int e = errno;
            if (p->fence_fd >= 0)
                close(p->fence_fd);
            free(p);
            return uv_translate_sys_error(e);
        }
        void *map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, p->fence_fd, 0);
        if (map == MAP_FAILED) {
            int e = errno;
            close(p->fence_fd);
            free(p);
            return uv_translate_sys_error(e);
        }
        p->fence = map;
        p->fence->magic = FENCE_MAGIC;
        atomic_store(&p->fence->revoked, 0);
        atomic_store(&p->fence->busy, 0);
    }
    *peer_p = &p->base;
    return 0;
}

static int shm_peer_info(baton__tp_peer_t *tpp, uint8_t *buf, size_t cap, size_t *len_p)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    shm_tp_t *t = (shm_tp_t *)tpp->tp;
    if (cap < PEER_BLOB_LEN)
        return BATON_ETOOBIG;
    *len_p = enc_peer_blob(buf, &t->self, p->fence_fd, p->fence_token, tpp->generation);
    return 0;
}

static void deferred_cb(void *arg)
{
    shm_peer_t *p = arg;
    baton__tp_done_cb cb = p->cb;
    p->cb = NULL;
    if (cb != NULL)
        cb(&p->base, p->cb_status, p->cb_arg);
}

static int defer_cb(shm_peer_t *p, baton__tp_done_cb cb, void *arg, int status)
{
    p->cb = cb;
    p->cb_arg = arg;
    p->cb_status = status;
    return baton__tp_defer(p->base.tp->env, deferred_cb, p);
}

static int shm_peer_connect(baton__tp_peer_t *tpp, const uint8_t *blob, size_t len,
                            baton__tp_done_cb cb, void *arg)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    shm_tp_t *t = (shm_tp_t *)tpp->tp;
    int32_t fence_fd;
    uint64_t token;
    int rc = dec_peer_blob(blob, len, &p->remote, &fence_fd, &token);
    if (rc != 0)
        return rc;
    if (!same_host(&t->self, &p->remote))
        return BATON_ENOTSUP; /* another host or pid namespace: fall back */
    if (tpp->role == BATON__TP_ROLE_INITIATOR) {
        int fd;
        rc = open_peer_fd(p->remote.pid, fence_fd, token, &fd);
        if (rc != 0)
            return BATON_ENOTSUP; /* e.g. /proc of the peer not accessible: fall back */
        struct stat st;
        void *map = MAP_FAILED;
        if (fstat(fd, &st) == 0 && st.st_size == 4096)
            map = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (map == MAP_FAILED)
            return BATON_ENOTSUP;
        p->fence = map;
        if (p->fence->magic != FENCE_MAGIC) {
            munmap(map, 4096);
            p->fence = NULL;
            return BATON_EPROTO;
        }
    } else {
#ifdef SYS_pidfd_open
        p->pidfd = (int)syscall(SYS_pidfd_open, (pid_t)p->remote.pid, 0);
#endif
    }
    return defer_cb(p, cb, arg, 0);
}

static int shm_mem_add(baton__tp_peer_t *tpp, uint32_t mem_id, uint64_t base, uint64_t len,
                       baton_xfer_mem_kind_t kind, const uint8_t *blob, size_t blob_len)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    if (blob_len == 0)
        return BATON_ENOTSUP; /* not shareable memory */
    if (blob_len < KEY_HOST_LEN || blob[0] != SHM_BLOB_VERSION || blob[1] != (uint8_t)kind)
        return BATON_EPROTO;
    uint32_t pid = baton__le_get32(blob + 4);
    int32_t fd = (int32_t)baton__le_get32(blob + 8);
    uint64_t token = baton__le_get64(blob + 12);
    uint64_t klen = baton__le_get64(blob + 20);
    if (pid != p->remote.pid || klen != len)
        return BATON_ERKEY;
    if (baton_u64map_get(&p->rmems, mem_id) != NULL)
        return BATON_EEXIST;
    shm_rmem_t *rm = calloc(1, sizeof(*rm));
    if (rm == NULL)
        return BATON_ENOMEM;
    rm->base = base;
    rm->len = len;
    rm->kind = kind;
    if (kind == BATON_XFER_MEM_HOST) {
        if (blob_len != KEY_HOST_LEN) {
            free(rm);
            return BATON_EPROTO;
        }
        int f;
        int rc = open_peer_fd(pid, fd, token, &f);
        if (rc != 0) {
            free(rm);
            return rc;
        }
        struct stat st;
        void *map = MAP_FAILED;
        if (fstat(f, &st) == 0 && (uint64_t)st.st_size >= len)
            map = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, f, 0);
        close(f);
        if (map == MAP_FAILED) {
            free(rm);
            return BATON_ERKEY;
        }
        rm->map = map;
        rm->map_len = len;
    } else {
#ifdef BATON_HAVE_CUDA
        CUipcMemHandle h;
        if (blob_len != KEY_CUDA_LEN || cuda_ready((shm_tp_t *)tpp->tp) != 0) {
            free(rm);
            return BATON_ENOTSUP;
        }
        memcpy(&h, blob + KEY_HOST_LEN, 64);
        uint64_t off = baton__le_get64(blob + KEY_HOST_LEN + 64);
        if (baton__cu.ipc_open_mem_handle(&rm->dbase, h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS) !=
            CUDA_SUCCESS) {
            free(rm);
            return BATON_ERKEY;
        }
        rm->map = (uint8_t *)(uintptr_t)(rm->dbase + off);
#else
        free(rm);
        return BATON_ENOTSUP;
#endif
    }
    if (baton_u64map_put(&p->rmems, mem_id, rm) != 0) {
        if (rm->kind == BATON_XFER_MEM_HOST)
            munmap(rm->map, rm->map_len);
        free(rm);
        return BATON_ENOMEM;
    }
    return 0;
}

static void unmap_rmem(shm_rmem_t *rm)
{
    if (rm->kind == BATON_XFER_MEM_HOST)
        munmap(rm->map, rm->map_len);
#ifdef BATON_HAVE_CUDA
    else
        baton__cu.ipc_close_mem_handle(rm->dbase);
#endif
    free(rm);
}

static int shm_mem_del(baton__tp_peer_t *tpp, uint32_t mem_id)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    shm_rmem_t *rm = baton_u64map_del(&p->rmems, mem_id);
    if (rm == NULL)
        return BATON_ENOTFOUND;
    unmap_rmem(rm);
    return 0;
}

static int shm_write(baton__tp_peer_t *tpp, baton__tp_write_t *w)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    if (p->failed || p->fencing || p->fence == NULL)
        return BATON_EPEERDOWN;
    /* The writer is the only bounds check here: every destination must lie in a region the
     * reader announced (and we mapped). */
    for (size_t i = 0; i < w->n_sges; i++) {
        const baton__tp_sge_t *g = &w->sges[i];
        shm_rmem_t *rm = baton_u64map_get(&p->rmems, g->dst_mem);
        if (rm == NULL || g->len == 0 || g->dst < rm->base || g->len > rm->len ||
            g->dst - rm->base > rm->len - g->len)
            return BATON_ERKEY;
#ifndef BATON_HAVE_CUDA
        if (g->src_mr == NULL || g->src_mr->kind != BATON_XFER_MEM_HOST)
            return BATON_ENOTSUP;
#endif
    }
    shm_job_t *j = calloc(1, sizeof(*j));
    if (j == NULL)
        return BATON_ENOMEM;
    j->w = w;
    if (p->jobs_tail)
        p->jobs_tail->next = j;
    else
        p->jobs_head = j;
    p->jobs_tail = j;
    schedule((shm_tp_t *)tpp->tp, p);
    return 0;
}

static int writer_dead(shm_peer_t *p)
{
    if (p->pidfd >= 0) {
        struct pollfd pfd = {p->pidfd, POLLIN, 0};
        return poll(&pfd, 1, 0) > 0;
    }
    return kill((pid_t)p->remote.pid, 0) != 0 && errno == ESRCH;
}

static void fence_timer_closed(uv_handle_t *h)
{
    free(h);
}

static void fence_poll(uv_timer_t *timer)
{
    shm_peer_t *p = timer->data;
    if (atomic_load(&p->fence->busy) != 0 && !writer_dead(p))
        return;
    uv_close((uv_handle_t *)timer, fence_timer_closed);
    p->fence_timer = NULL;
    deferred_cb(p);
}

static void initiator_fenced(void *arg)
{
    shm_peer_t *p = arg;
    while (p->jobs_head != NULL)
        finish_job(p, BATON_EPEERDOWN);
    deferred_cb(p);
}

static int shm_peer_fence(baton__tp_peer_t *tpp, baton__tp_done_cb cb, void *arg)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    shm_tp_t *t = (shm_tp_t *)tpp->tp;
    if (p->fencing)
        return BATON_EBUSY;
    p->fencing = 1;
    p->cb = cb;
    p->cb_arg = arg;
    p->cb_status = 0;
    if (tpp->role == BATON__TP_ROLE_INITIATOR) {
        /* Copies run only in the copier callback, never now: stop and fail the queue. */
        unschedule(t, p);
        return baton__tp_defer(tpp->tp->env, initiator_fenced, p);
    }
    atomic_store(&p->fence->revoked, 1);
    if (atomic_load(&p->fence->busy) == 0 || p->remote.pid == 0)
        return baton__tp_defer(tpp->tp->env, deferred_cb, p);
    /* The writer is inside a copy step right now: wait for it to leave (or die). */
    p->fence_timer = malloc(sizeof(*p->fence_timer));
    if (p->fence_timer == NULL)
        return BATON_ENOMEM;
    uv_timer_init(tpp->tp->env->loop, p->fence_timer);
    p->fence_timer->data = p;
    uv_timer_start(p->fence_timer, fence_poll, 1, 1);
    return 0;
}

static void shm_peer_destroy(baton__tp_peer_t *tpp)
{
    shm_peer_t *p = (shm_peer_t *)tpp;
    unschedule((shm_tp_t *)tpp->tp, p);
    while (p->jobs_head != NULL)
        finish_job(p, BATON_EPEERDOWN); /* only for a peer destroyed without a fence */
    size_t it = 0;
    shm_rmem_t *rm;
    while ((rm = baton_u64map_next(&p->rmems, &it, NULL)) != NULL)
        unmap_rmem(rm);
    baton_u64map_free(&p->rmems);
    if (p->fence != NULL)
        munmap(p->fence, 4096);
    if (p->fence_fd >= 0)
        close(p->fence_fd);
    if (p->pidfd >= 0)
        close(p->pidfd);
    free(p);
}

const baton__tp_ops_t baton__tp_shm_ops = {
    .name = "shm",
    .id = BATON_XFER_TRANSPORT_SHM,
    .init = shm_init,
    .fini = shm_fini,
    .query = shm_query,
    .mem_reg = shm_mem_reg,
    .mem_key = shm_mem_key,
    .mem_dereg = shm_mem_dereg,
    .peer_create = shm_peer_create,
    .peer_info = shm_peer_info,
    .peer_connect = shm_peer_connect,
    .mem_add = shm_mem_add,
    .mem_del = shm_mem_del,
    .write = shm_write,
    .read = baton__tp_notsup_read, /* shm pulls are served by the holder's copies */
    .flush = baton__tp_notsup_flush,
    .peer_fence = shm_peer_fence,
    .peer_destroy = shm_peer_destroy,
    .adopt_lane = baton__tp_notsup_adopt_lane,
};
