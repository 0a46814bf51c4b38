/* verbs_model.c — the software NIC behind the wrapped verbs: QP states, RDMA WRITE, faults. */
#include "verbs_model.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/list.h"

#define VM_MAX_DEVS    8
#define VM_MAX_INLINE  256
#define VM_MAX_SGE     32
#define VM_GID_TBL_LEN 4 /* RoCE; InfiniBand ports have 1 */
#define VM_MAX_DEVMEM  16
#define VM_MAX_EXPORTS 64

/* One recursive lock around every entry point (verbs, the provider ops and the vm_* calls): two
 * transports may call in from two threads (QP setup), and whole engines from their progress
 * threads (test_xfer_pull_rdma); see the header. */
static pthread_mutex_t vm_lock = PTHREAD_RECURSIVE_MUTEX_INITIALIZER_NP;

static pthread_mutex_t *vm_guard_lock(void)
{
    pthread_mutex_lock(&vm_lock);
    return &vm_lock;
}

static void vm_guard_unlock(pthread_mutex_t **m)
{
    pthread_mutex_unlock(*m);
}

#define VM_GUARD()                                                                                 \
    pthread_mutex_t *vm_guard_ __attribute__((cleanup(vm_guard_unlock), unused)) = vm_guard_lock()

/* Every model object is on one list so vm_reset frees it and vm_live_objects counts it. */
typedef enum { K_DEVLIST, K_CTX, K_PD, K_MR, K_CHAN, K_CQ, K_QP } vm_kind_t;

typedef struct vm_hdr {
    vm_kind_t kind;
    int live;
    void *base;
    struct vm_hdr *next_all;
} vm_hdr_t;

typedef struct {
    union ibv_gid gid;
    uint32_t type; /* IBV_GID_TYPE_* */
    uint32_t ndev;
} vm_gid_t;

typedef struct {
    struct ibv_device ibdev;
    vm_dev_cfg_t cfg;
    enum ibv_port_state port_state[2];
    uint16_t lid[2];
    vm_gid_t gids[2][VM_GID_TBL_LEN];
    int fatal; /* completes nothing, modify/destroy fail with EIO */
} vm_dev_t;

typedef struct vm_ctx {
    struct ibv_context ctx;
    vm_hdr_t hdr;
    int dev;
    int async_wfd;
    struct ibv_async_event *events;
    int nevents, capevents, headevent;
    uint64_t async_gotten, async_acked;
    int children;
} vm_ctx_t;

typedef struct {
    struct ibv_pd pd;
    vm_hdr_t hdr;
    vm_ctx_t *vctx;
    int children;
} vm_pd_t;

typedef struct {
    struct ibv_mr mr;
    vm_hdr_t hdr;
    vm_pd_t *vpd;
    vm_mr_info_t info;
} vm_mr_t;

typedef struct vm_cq vm_cq_t;

typedef struct {
    struct ibv_comp_channel ch;
    vm_hdr_t hdr;
    vm_ctx_t *vctx;
    int wfd;
    vm_cq_t **queue; /* CQs with an event pending, FIFO */
    int nq, capq, headq;
} vm_chan_t;

typedef struct vm_qp vm_qp_t;

typedef struct {
    struct ibv_wc wc;
    vm_qp_t *qp;
    uint64_t seq;
} vm_cqe_t;

struct vm_cq {
    struct ibv_cq cq;
    vm_hdr_t hdr;
    vm_ctx_t *vctx;
    vm_chan_t *chan;
    vm_cqe_t *ring;
    int cap, head, count;
    int armed;
    uint64_t events_gotten, events_acked;
    int qps;
    int broken; /* overflowed / CQ error: nothing is polled from it anymore */
};

typedef struct vm_wr {
    struct vm_wr *prev, *next;
    vm_qp_t *qp;
    uint64_t seq;
    uint64_t wr_id;
    unsigned int send_flags;
    int num_sge;
    struct ibv_sge sge[VM_MAX_SGE];
    uint64_t remote_addr;
    uint32_t rkey;
    enum ibv_wr_opcode opcode;
    int is_inline;
    uint8_t inline_data[VM_MAX_INLINE];
    uint32_t inline_len;
} vm_wr_t;

struct vm_qp {
    struct ibv_qp qp;
    vm_hdr_t hdr;
    vm_ctx_t *vctx;
    vm_pd_t *vpd;
    vm_cq_t *scq, *rcq;
    vm_qp_info_t info;
    int held;
    uint64_t next_seq;    /* seq of the next posted WR */
    uint64_t retired_seq; /* WRs below this have had a covering CQE polled */
    int queued;           /* WRs not yet run or flushed */
    int reads_queued;     /* RDMA READs among them */
    uint64_t events_gotten, events_acked;
};

typedef struct {
    uintptr_t addr;
    size_t len;
    vm_qp_t *qp;   /* the writer */
    int unflushed; /* device memory, no completed read on its QP since */
} vm_landing_t;

typedef struct {
    uint8_t *base;
    size_t size, maplen;
} vm_devmem_t;

typedef struct {
    int fd;
    uintptr_t base;
    size_t size;
} vm_export_t;

static struct {
    vm_dev_t devs[VM_MAX_DEVS];
    int ndevs;
    int vis_first, vis_count; /* vis_count < 0: all */
    int no_kernel;
    int auto_exec;
    vm_hdr_t *all;
    vm_wr_t *wr_head, *wr_tail;
    int nqueued;
    struct {
        int countdown;
        int err;
    } faults[VM_OP_COUNT_];
    int wr_fail_countdown;
    enum ibv_wc_status wr_fail_status;
    vm_stats_t st;
    uint32_t next_qpn;
    uint32_t next_key;
    vm_qp_t **qps; /* every QP ever created, creation order */
    int nqps, capqps;
    vm_mr_t **mrs;
    int nmrs, capmrs;
    vm_landing_t *landings;
    size_t nlandings, caplandings;
    vm_devmem_t devmem[VM_MAX_DEVMEM];
    vm_export_t exports[VM_MAX_EXPORTS];
    int nexports;
    int peermem;
    int fork_inits;
} M = {.vis_count = -1, .next_qpn = 0x1000, .next_key = 0x100};

static void misuse(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void misuse(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("verbs_model: MISUSE: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    M.st.misuse++;
}

static void *grow(void *arr, int *cap, size_t elem, int need)
{
    if (need <= *cap)
        return arr;
    int ncap = *cap ? *cap * 2 : 16;
    while (ncap < need)
        ncap *= 2;
    void *p = realloc(arr, (size_t)ncap * elem);
    if (!p) {
        fprintf(stderr, "verbs_model: out of memory\n");
        abort();
    }
    *cap = ncap;
    return p;
}

static void *obj_new(size_t size, size_t hdr_off, vm_kind_t kind)
{
    char *p = calloc(1, size);
    if (!p) {
        fprintf(stderr, "verbs_model: out of memory\n");
        abort();
    }
    vm_hdr_t *h = (vm_hdr_t *)(p + hdr_off);
    h->kind = kind;
    h->live = 1;
    h->base = p;
    h->next_all = M.all;
    M.all = h;
    return p;
}

#define OBJ_NEW(type, kind) ((type *)obj_new(sizeof(type), offsetof(type, hdr), kind))

static int fault(vm_op_t op)
{
    if (M.faults[op].countdown > 0 && --M.faults[op].countdown == 0)
        return M.faults[op].err;
    return 0;
}

static void pipe_nb_write(int fd)
{
    char b = 1;
    if (write(fd, &b, 1) != 1)
        misuse("event pipe full");
}

/* ---------------------------------------------------------------------------------------- */
/* configuration                                                                              */

void vm_dev_cfg_default(vm_dev_cfg_t *cfg, int index)
{
    VM_GUARD();
    memset(cfg, 0, sizeof(*cfg));
    snprintf(cfg->name, sizeof(cfg->name), "vm_%d", index);
    cfg->nports = 1;
    cfg->active_mtu = IBV_MTU_4096;
    cfg->max_mtu = IBV_MTU_4096;
    cfg->port_state = IBV_PORT_ACTIVE;
    cfg->link_layer = IBV_LINK_LAYER_ETHERNET;
    cfg->lid = (uint16_t)(0x10 + index);
    /* ::ffff:10.0.0.(1+index), the shape of a RoCE v2 GID */
    cfg->gid[10] = 0xff;
    cfg->gid[11] = 0xff;
    cfg->gid[12] = 10;
    cfg->gid[15] = (uint8_t)(1 + index);
    cfg->max_mr_size = 1ull << 40;
    cfg->max_qp_wr = 32768;
    cfg->max_sge = 30;
    cfg->max_cqe = 1 << 22;
    cfg->subnet = index;
    cfg->max_inline = VM_MAX_INLINE;
    cfg->max_msg_sz = 1u << 30;
    cfg->max_rd_atom = 16;
}

/* Builds a port's GID table the way a ConnectX port shows it. */
static void gid_table(vm_dev_t *d, int dev, int port)
{
    vm_gid_t *t = d->gids[port];
    memset(t, 0, sizeof(d->gids[port]));
    if (d->cfg.link_layer != IBV_LINK_LAYER_ETHERNET) {
        /* subnet prefix fe80::/64 + port GUID */
        t[0].gid.raw[0] = 0xfe;
        t[0].gid.raw[1] = 0x80;
        t[0].gid.raw[8] = 0x02;
        t[0].gid.raw[14] = (uint8_t)dev;
        t[0].gid.raw[15] = (uint8_t)(port + 1);
        t[0].type = IBV_GID_TYPE_IB;
        return;
    }
    /* fe80::<EUI-64 of the MAC>, once as v1 and once as v2, then the IP address twice */
    for (int i = 0; i < 2; i++) {
        t[i].gid.raw[0] = 0xfe;
        t[i].gid.raw[1] = 0x80;
        t[i].gid.raw[8] = 0x02;
        t[i].gid.raw[11] = 0xff;
        t[i].gid.raw[12] = 0xfe;
        t[i].gid.raw[14] = (uint8_t)dev;
        t[i].gid.raw[15] = (uint8_t)(port + 1);
        memcpy(t[i + 2].gid.raw, d->cfg.gid, 16);
        if (port == 1)
            t[i + 2].gid.raw[14] = 1; /* port 2 has its own address */
    }
    t[0].type = t[2].type = IBV_GID_TYPE_ROCE_V1;
    t[1].type = t[3].type = IBV_GID_TYPE_ROCE_V2;
    for (int i = 0; i < 4; i++)
        t[i].ndev = (uint32_t)(10 + dev * 2 + port);
    if (d->cfg.roce_v1_only) {
        memset(&t[1], 0, sizeof(t[1]));
        memset(&t[3], 0, sizeof(t[3]));
    }
}

static int gid_tbl_len(const vm_dev_t *d)
{
    return d->cfg.link_layer == IBV_LINK_LAYER_ETHERNET ? VM_GID_TBL_LEN : 1;
}

static const vm_gid_t *gid_at(const vm_dev_t *d, int port, int index)
{
    if (port < 1 || port > d->cfg.nports || index < 0 || index >= gid_tbl_len(d))
        return NULL;
    const vm_gid_t *g = &d->gids[port - 1][index];
    static const uint8_t zero[16];
    return memcmp(g->gid.raw, zero, 16) ? g : NULL;
}

void vm_reset(void)
{
    VM_GUARD();
    vm_hdr_t *h = M.all;
    while (h) {
        vm_hdr_t *next = h->next_all;
        char *base = h->base;
        if (h->kind == K_CTX) {
            vm_ctx_t *c = (vm_ctx_t *)base;
            if (h->live) {
                close(c->ctx.async_fd);
                close(c->async_wfd);
            }
            free(c->events);
        } else if (h->kind == K_CHAN) {
            vm_chan_t *ch = (vm_chan_t *)base;
            if (h->live) {
                close(ch->ch.fd);
                close(ch->wfd);
            }
            free(ch->queue);
        } else if (h->kind == K_CQ) {
            free(((vm_cq_t *)base)->ring);
        } else if (h->kind == K_DEVLIST) {
            /* the array itself was handed to the caller; base is the tracking record */
        }
        free(base);
        h = next;
    }
    vm_wr_t *w = M.wr_head;
    while (w) {
        vm_wr_t *n = w->next;
        free(w);
        w = n;
    }
    free(M.qps);
    free(M.mrs);
    free(M.landings);
    for (int i = 0; i < VM_MAX_DEVMEM; i++)
        if (M.devmem[i].base)
            munmap(M.devmem[i].base, M.devmem[i].maplen);
    for (int i = 0; i < M.nexports; i++)
        if (M.exports[i].fd >= 0)
            close(M.exports[i].fd);
    memset(&M, 0, sizeof(M));
    M.vis_count = -1;
    M.next_qpn = 0x1000;
    M.next_key = 0x100;
}

int vm_add_device(const vm_dev_cfg_t *cfg)
{
    VM_GUARD();
    if (M.ndevs >= VM_MAX_DEVS)
        return -1;
    vm_dev_t *d = &M.devs[M.ndevs];
    memset(d, 0, sizeof(*d));
    d->cfg = *cfg;
    d->port_state[0] = cfg->port_state;
    d->port_state[1] = cfg->port2_state ? cfg->port2_state : IBV_PORT_ACTIVE;
    d->lid[0] = cfg->lid;
    d->lid[1] = (uint16_t)(cfg->lid + 0x100);
    gid_table(d, M.ndevs, 0);
    gid_table(d, M.ndevs, 1);
    d->ibdev.node_type = IBV_NODE_CA;
    d->ibdev.transport_type = IBV_TRANSPORT_IB;
    snprintf(d->ibdev.name, sizeof(d->ibdev.name), "%s", cfg->name);
    snprintf(d->ibdev.dev_name, sizeof(d->ibdev.dev_name), "uverbs%d", M.ndevs);
    return M.ndevs++;
}

void vm_set_visible(int first, int count)
{
    VM_GUARD();
    M.vis_first = first;
    M.vis_count = count;
}

void vm_set_no_kernel_support(int on)
{
    VM_GUARD();
    M.no_kernel = on;
}

void vm_set_auto_execute(int on)
{
    VM_GUARD();
    M.auto_exec = on;
}

void vm_fail_op(vm_op_t op, int nth, int err)
{
    VM_GUARD();
    if (op < 0 || op >= VM_OP_COUNT_)
        return;
    M.faults[op].countdown = nth;
    M.faults[op].err = err;
}

void vm_fail_wr(int nth, enum ibv_wc_status status)
{
    VM_GUARD();
    M.wr_fail_countdown = nth;
    M.wr_fail_status = status;
}

static int dev_index(struct ibv_device *d)
{
    for (int i = 0; i < M.ndevs; i++)
        if (&M.devs[i].ibdev == d)
            return i;
    return -1;
}

/* ---------------------------------------------------------------------------------------- */
/* device memory                                                                              */

static vm_devmem_t *devmem_of(uintptr_t a, size_t len)
{
    for (int i = 0; i < VM_MAX_DEVMEM; i++) {
        vm_devmem_t *m = &M.devmem[i];
        if (m->base && a >= (uintptr_t)m->base && a < (uintptr_t)m->base + m->maplen) {
            if (len && a + len > (uintptr_t)m->base + m->size)
                return NULL;
            return m;
        }
    }
    return NULL;
}

void *vm_devmem_alloc(size_t size)
{
    VM_GUARD();
    long pg = sysconf(_SC_PAGESIZE);
    size_t maplen = (size + (size_t)pg - 1) & ~((size_t)pg - 1);
    for (int i = 0; i < VM_MAX_DEVMEM; i++) {
        if (M.devmem[i].base)
            continue;
        void *p = mmap(NULL, maplen, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        M.devmem[i].base = p;
        M.devmem[i].size = size;
        M.devmem[i].maplen = maplen;
        return p;
    }
    return NULL;
}

void vm_devmem_free(void *p)
{
    VM_GUARD();
    for (int i = 0; i < VM_MAX_DEVMEM; i++) {
        if (M.devmem[i].base == p) {
            munmap(p, M.devmem[i].maplen);
            memset(&M.devmem[i], 0, sizeof(M.devmem[i]));
            return;
        }
    }
    misuse("vm_devmem_free of unknown memory");
}

int vm_devmem_range(const void *p, void **base_p, size_t *size_p)
{
    VM_GUARD();
    vm_devmem_t *m = devmem_of((uintptr_t)p, 0);
    if (!m || (uintptr_t)p >= (uintptr_t)m->base + m->size)
        return 0;
    *base_p = m->base;
    *size_p = m->size;
    return 1;
}

int vm_devmem_export(const void *base, size_t size)
{
    VM_GUARD();
    vm_devmem_t *m = devmem_of((uintptr_t)base, size);
    if (!m || size == 0 || M.nexports == VM_MAX_EXPORTS)
        return -1;
    int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    M.exports[M.nexports].fd = fd;
    M.exports[M.nexports].base = (uintptr_t)base;
    M.exports[M.nexports].size = size;
    M.nexports++;
    return fd;
}

/* The DMA path: the only way into device memory. */
static void dma_copy(void *dst, const void *src, size_t len)
{
    vm_devmem_t *d = devmem_of((uintptr_t)dst, 0), *s = devmem_of((uintptr_t)src, 0);
    if (d)
        mprotect(d->base, d->maplen, PROT_READ | PROT_WRITE);
    if (s && s != d)
        mprotect(s->base, s->maplen, PROT_READ | PROT_WRITE);
    memmove(dst, src, len);
    if (d)
        mprotect(d->base, d->maplen, PROT_NONE);
    if (s && s != d)
        mprotect(s->base, s->maplen, PROT_NONE);
}

void vm_devmem_write(void *dst, const void *src, size_t len)
{
    VM_GUARD();
    dma_copy(dst, src, len);
}

void vm_devmem_read(void *dst, const void *src, size_t len)
{
    VM_GUARD();
    dma_copy(dst, src, len);
}

int vm_devmem_unflushed(void)
{
    VM_GUARD();
    int n = 0;
    for (size_t i = 0; i < M.nlandings; i++)
        n += M.landings[i].unflushed;
    return n;
}

void vm_set_peermem(int on)
{
    VM_GUARD();
    M.peermem = on;
}

/* ---------------------------------------------------------------------------------------- */
/* completions and events                                                                     */

static void chan_push(vm_chan_t *ch, vm_cq_t *cq)
{
    ch->queue = grow(ch->queue, &ch->capq, sizeof(*ch->queue), ch->headq + ch->nq + 1);
    ch->queue[ch->headq + ch->nq++] = cq;
    pipe_nb_write(ch->wfd);
    M.st.cq_events++;
}

static void async_push(vm_ctx_t *c, struct ibv_async_event ev)
{
    c->events = grow(c->events, &c->capevents, sizeof(*c->events), c->headevent + c->nevents + 1);
    c->events[c->headevent + c->nevents++] = ev;
    pipe_nb_write(c->async_wfd);
    M.st.async_events++;
}

static void cq_push(vm_cq_t *cq, vm_qp_t *qp, uint64_t seq, uint64_t wr_id, enum ibv_wc_status st)
{
    if (!cq->hdr.live) {
        misuse("completion for a destroyed CQ");
        return;
    }
    if (cq->broken || M.devs[cq->vctx->dev].fatal)
        return; /* lost: nothing completes on a broken CQ or a dead device */
    if (cq->count == cq->cap) {
        M.st.cq_overflows++;
        misuse("CQ overflow (cqe=%d)", cq->cap);
        cq->broken = 1;
        struct ibv_async_event ev = {.event_type = IBV_EVENT_CQ_ERR};
        ev.element.cq = &cq->cq;
        async_push(cq->vctx, ev);
        return;
    }
    vm_cqe_t *e = &cq->ring[(cq->head + cq->count++) % cq->cap];
    memset(e, 0, sizeof(*e));
    e->wc.wr_id = wr_id;
    e->wc.status = st;
    e->wc.opcode = IBV_WC_RDMA_WRITE;
    e->wc.qp_num = qp->qp.qp_num;
    e->wc.vendor_err = st == IBV_WC_SUCCESS ? 0 : 0x80 + st;
    e->qp = qp;
    e->seq = seq;
    M.st.cqes++;
    if (cq->armed && cq->chan) {
        cq->armed = 0;
        chan_push(cq->chan, cq);
    }
}

static void wr_unlink(vm_wr_t *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        M.wr_head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        M.wr_tail = w->prev;
    w->qp->queued--;
    if (w->opcode == IBV_WR_RDMA_READ)
        w->qp->reads_queued--;
    M.nqueued--;
}

static void qp_set_state(vm_qp_t *qp, enum ibv_qp_state s)
{
    qp->qp.state = s;
    qp->info.state = s;
    if (qp->info.nhistory < VM_MAX_STATES)
        qp->info.history[qp->info.nhistory++] = s;
}

/* QP → ERR: every WR still queued completes with a flush error and never lands. */
static void qp_to_err(vm_qp_t *qp)
{
    if (qp->info.state == IBV_QPS_ERR)
        return;
    qp_set_state(qp, IBV_QPS_ERR);
    vm_wr_t *w = M.wr_head;
    while (w) {
        vm_wr_t *n = w->next;
        if (w->qp == qp) {
            wr_unlink(w);
            cq_push(qp->scq, qp, w->seq, w->wr_id, IBV_WC_WR_FLUSH_ERR);
            M.st.wrs_flushed++;
            free(w);
        }
        w = n;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* device list, context, queries                                                              */

struct ibv_device **__wrap_ibv_get_device_list(int *num_devices)
{
    VM_GUARD();
    int err = fault(VM_OP_GET_DEVICE_LIST);
    if (M.no_kernel)
        err = ENOSYS;
    if (err) {
        if (num_devices)
            *num_devices = 0;
        errno = err;
        return NULL;
    }
    int first = M.vis_count < 0 ? 0 : M.vis_first;
    int count = M.vis_count < 0 ? M.ndevs : M.vis_count;
    if (first + count > M.ndevs)
        count = M.ndevs > first ? M.ndevs - first : 0;
    struct ibv_device **list = calloc((size_t)count + 1, sizeof(*list));
    if (!list) {
        errno = ENOMEM;
        return NULL;
    }
    for (int i = 0; i < count; i++)
        list[i] = &M.devs[first + i].ibdev;
    if (num_devices)
        *num_devices = count;
    /* track the list so a missing ibv_free_device_list shows as a live object */
    struct {
        vm_hdr_t hdr;
        struct ibv_device **list;
    } *rec = obj_new(sizeof(*rec), 0, K_DEVLIST);
    rec->list = list;
    return list;
}

void __wrap_ibv_free_device_list(struct ibv_device **list)
{
    VM_GUARD();
    for (vm_hdr_t *h = M.all; h; h = h->next_all) {
        if (h->kind != K_DEVLIST || !h->live)
            continue;
        struct {
            vm_hdr_t hdr;
            struct ibv_device **list;
        } *rec = h->base;
        if (rec->list == list) {
            h->live = 0;
            free(list);
            return;
        }
    }
    misuse("ibv_free_device_list on an unknown list");
}

const char *__wrap_ibv_get_device_name(struct ibv_device *device)
{
    VM_GUARD();
    return device ? device->name : NULL;
}

static int vm_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad);
static int vm_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc);
static int vm_req_notify_cq(struct ibv_cq *ibcq, int solicited_only);

struct ibv_context *__wrap_ibv_open_device(struct ibv_device *device)
{
    VM_GUARD();
    int d = dev_index(device);
    if (d < 0) {
        misuse("ibv_open_device on an unknown device");
        errno = ENODEV;
        return NULL;
    }
    int err = fault(VM_OP_OPEN_DEVICE);
    if (err) {
        errno = err;
        return NULL;
    }
    int fds[2];
    if (pipe(fds) != 0)
        return NULL;
    vm_ctx_t *c = OBJ_NEW(vm_ctx_t, K_CTX);
    c->dev = d;
    c->ctx.device = device;
    c->ctx.cmd_fd = -1;
    c->ctx.async_fd = fds[0];
    c->async_wfd = fds[1];
    fcntl(c->async_wfd, F_SETFL, fcntl(c->async_wfd, F_GETFL) | O_NONBLOCK);
    c->ctx.num_comp_vectors = 1;
    c->ctx.abi_compat = NULL; /* not extended: inline helpers fall back to exported verbs */
    c->ctx.ops.post_send = vm_post_send;
    c->ctx.ops.poll_cq = vm_poll_cq;
    c->ctx.ops.req_notify_cq = vm_req_notify_cq;
    pthread_mutex_init(&c->ctx.mutex, NULL);
    return &c->ctx;
}

int __wrap_ibv_close_device(struct ibv_context *ctx)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    if (!c->hdr.live) {
        misuse("ibv_close_device twice");
        return EINVAL;
    }
    if (c->children) {
        misuse("ibv_close_device with %d PDs/CQs/channels still open", c->children);
        return EBUSY;
    }
    if (c->async_gotten != c->async_acked)
        misuse("ibv_close_device with un-acked async events");
    c->hdr.live = 0;
    close(c->ctx.async_fd);
    close(c->async_wfd);
    pthread_mutex_destroy(&c->ctx.mutex);
    return 0;
}

int __wrap_ibv_query_device(struct ibv_context *ctx, struct ibv_device_attr *a)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_QUERY_DEVICE);
    if (err)
        return err;
    const vm_dev_cfg_t *cfg = &M.devs[c->dev].cfg;
    memset(a, 0, sizeof(*a));
    snprintf(a->fw_ver, sizeof(a->fw_ver), "model-1.0");
    a->node_guid = 0x0200000000000000ull + (uint64_t)c->dev;
    a->max_mr_size = cfg->max_mr_size;
    a->page_size_cap = 4096;
    a->vendor_id = 0x02c9;
    a->max_qp = 65536;
    a->max_qp_wr = cfg->max_qp_wr;
    a->max_sge = cfg->max_sge;
    a->max_cq = 65536;
    a->max_cqe = cfg->max_cqe;
    a->max_mr = 1 << 20;
    a->max_pd = 1 << 16;
    a->max_qp_rd_atom = cfg->max_rd_atom;
    a->max_qp_init_rd_atom = cfg->max_rd_atom;
    a->phys_port_cnt = cfg->nports;
    return 0;
}

int __wrap_ibv_query_port(struct ibv_context *ctx, uint8_t port, struct _compat_ibv_port_attr *out)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_QUERY_PORT);
    if (err)
        return err;
    const vm_dev_t *d = &M.devs[c->dev];
    if (port < 1 || port > d->cfg.nports)
        return EINVAL;
    /* the caller's object is a full struct ibv_port_attr (see ___ibv_query_port) */
    struct ibv_port_attr *a = (struct ibv_port_attr *)out;
    memset(a, 0, sizeof(*a));
    a->state = d->port_state[port - 1];
    a->max_mtu = d->cfg.max_mtu;
    a->active_mtu = d->cfg.active_mtu;
    a->gid_tbl_len = gid_tbl_len(d);
    a->max_msg_sz = d->cfg.max_msg_sz;
    a->pkey_tbl_len = 1;
    a->lid = d->lid[port - 1];
    a->link_layer = d->cfg.link_layer;
    a->phys_state = a->state == IBV_PORT_ACTIVE ? 5 : 3;
    return 0;
}

int __wrap__ibv_query_gid_ex(struct ibv_context *ctx, uint32_t port, uint32_t index,
                             struct ibv_gid_entry *entry, uint32_t flags, size_t entry_size)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_QUERY_GID);
    if (err)
        return err;
    if (flags || entry_size < sizeof(*entry)) {
        misuse("ibv_query_gid_ex with flags %u / entry size %zu", flags, entry_size);
        return EINVAL;
    }
    const vm_dev_t *d = &M.devs[c->dev];
    if (port < 1 || port > d->cfg.nports || index >= (uint32_t)gid_tbl_len(d))
        return EINVAL;
    const vm_gid_t *g = gid_at(d, (int)port, (int)index);
    if (!g)
        return ENODATA; /* an empty slot */
    memset(entry, 0, sizeof(*entry));
    entry->gid = g->gid;
    entry->gid_index = index;
    entry->port_num = port;
    entry->gid_type = g->type;
    entry->ndev_ifindex = g->ndev;
    return 0;
}

int __wrap_ibv_fork_init(void)
{
    VM_GUARD();
    M.fork_inits++;
    return 0;
}

int vm_fork_inits(void)
{
    VM_GUARD();
    return M.fork_inits;
}

int __wrap_ibv_query_gid(struct ibv_context *ctx, uint8_t port, int index, union ibv_gid *gid)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_QUERY_GID);
    if (err) {
        errno = err;
        return -1;
    }
    const vm_dev_t *d = &M.devs[c->dev];
    if (port < 1 || port > d->cfg.nports || index < 0 || index >= gid_tbl_len(d)) {
        errno = EINVAL;
        return -1;
    }
    const vm_gid_t *g = gid_at(d, port, index);
    if (g)
        memcpy(gid->raw, g->gid.raw, 16);
    else
        memset(gid->raw, 0, 16); /* ibv_query_gid reports an empty slot as zeros */
    return 0;
}

int __wrap_ibv_get_async_event(struct ibv_context *ctx, struct ibv_async_event *ev)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    if (c->nevents == 0 && !(fcntl(ctx->async_fd, F_GETFL) & O_NONBLOCK)) {
        misuse("blocking ibv_get_async_event with nothing queued would hang");
        errno = EAGAIN;
        return -1;
    }
    char b;
    if (read(ctx->async_fd, &b, 1) != 1)
        return -1; /* errno from read: EAGAIN */
    *ev = c->events[c->headevent++];
    c->nevents--;
    c->async_gotten++;
    if (ev->event_type == IBV_EVENT_QP_FATAL || ev->event_type == IBV_EVENT_QP_REQ_ERR ||
        ev->event_type == IBV_EVENT_QP_ACCESS_ERR || ev->event_type == IBV_EVENT_COMM_EST ||
        ev->event_type == IBV_EVENT_SQ_DRAINED || ev->event_type == IBV_EVENT_QP_LAST_WQE_REACHED)
        container_of(ev->element.qp, vm_qp_t, qp)->events_gotten++;
    return 0;
}

void __wrap_ibv_ack_async_event(struct ibv_async_event *ev)
{
    VM_GUARD();
    /* the element tells which context; the model keeps counts on the QP when there is one */
    if (ev->event_type == IBV_EVENT_QP_FATAL || ev->event_type == IBV_EVENT_QP_REQ_ERR ||
        ev->event_type == IBV_EVENT_QP_ACCESS_ERR || ev->event_type == IBV_EVENT_COMM_EST ||
        ev->event_type == IBV_EVENT_SQ_DRAINED || ev->event_type == IBV_EVENT_QP_LAST_WQE_REACHED) {
        vm_qp_t *qp = container_of(ev->element.qp, vm_qp_t, qp);
        qp->events_acked++;
        qp->vctx->async_acked++;
        return;
    }
    if (ev->event_type == IBV_EVENT_CQ_ERR) {
        container_of(ev->element.cq, vm_cq_t, cq)->vctx->async_acked++;
        return;
    }
    /* port / device events: credit the context that still has one un-acked */
    for (vm_hdr_t *h = M.all; h; h = h->next_all) {
        if (h->kind != K_CTX)
            continue;
        vm_ctx_t *c = h->base;
        if (c->async_gotten > c->async_acked) {
            c->async_acked++;
            return;
        }
    }
    misuse("ibv_ack_async_event without a matching event");
}

/* ---------------------------------------------------------------------------------------- */
/* PD and MR                                                                                  */

struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *ctx)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_ALLOC_PD);
    if (err) {
        errno = err;
        return NULL;
    }
    vm_pd_t *p = OBJ_NEW(vm_pd_t, K_PD);
    p->vctx = c;
    p->pd.context = ctx;
    p->pd.handle = M.next_key++;
    c->children++;
    return &p->pd;
}

int __wrap_ibv_dealloc_pd(struct ibv_pd *pd)
{
    VM_GUARD();
    vm_pd_t *p = container_of(pd, vm_pd_t, pd);
    if (!p->hdr.live) {
        misuse("ibv_dealloc_pd twice");
        return EINVAL;
    }
    if (p->children) {
        misuse("ibv_dealloc_pd with %d MRs/QPs still using it", p->children);
        return EBUSY;
    }
    p->hdr.live = 0;
    p->vctx->children--;
    return 0;
}

static struct ibv_mr *reg_mr(struct ibv_pd *pd, void *addr, size_t length, unsigned int access,
                             vm_op_t op)
{
    vm_pd_t *p = container_of(pd, vm_pd_t, pd);
    int err = fault(op);
    if (!err && !p->hdr.live) {
        misuse("reg_mr on a freed PD");
        err = EINVAL;
    }
    const vm_dev_cfg_t *cfg = &M.devs[p->vctx->dev].cfg;
    if (!err && (length == 0 || length > cfg->max_mr_size))
        err = EINVAL;
    /* the kernel refuses remote write without local write */
    if (!err && (access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) &&
        !(access & IBV_ACCESS_LOCAL_WRITE))
        err = EINVAL;
    /* device memory by pointer pins through nvidia-peermem only; else get_user_pages fails */
    if (!err && op == VM_OP_REG_MR && devmem_of((uintptr_t)addr, 0) && !M.peermem)
        err = EFAULT;
    if (err) {
        errno = err;
        return NULL;
    }
    vm_mr_t *m = OBJ_NEW(vm_mr_t, K_MR);
    m->vpd = p;
    m->mr.context = pd->context;
    m->mr.pd = pd;
    m->mr.addr = addr;
    m->mr.length = length;
    m->mr.handle = M.next_key;
    /* distinct lkey and rkey so a mix-up is caught */
    m->mr.lkey = 0x10000u + M.next_key;
    m->mr.rkey = 0x800000u + M.next_key;
    M.next_key++;
    m->info.exists = 1;
    m->info.dev = p->vctx->dev;
    m->info.addr = addr;
    m->info.length = length;
    m->info.access = access;
    m->info.lkey = m->mr.lkey;
    m->info.rkey = m->mr.rkey;
    p->children++;
    M.mrs = grow(M.mrs, &M.capmrs, sizeof(*M.mrs), M.nmrs + 1);
    M.mrs[M.nmrs++] = m;
    M.st.mrs_registered++;
    return &m->mr;
}

struct ibv_mr *__wrap_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t length, int access)
{
    VM_GUARD();
    return reg_mr(pd, addr, length, (unsigned int)access, VM_OP_REG_MR);
}

struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr, size_t length, uint64_t iova,
                                       unsigned int access)
{
    VM_GUARD();
    if (iova != (uintptr_t)addr)
        misuse("reg_mr_iova2 with iova != addr is not modelled");
    return reg_mr(pd, addr, length, access, VM_OP_REG_MR);
}

struct ibv_mr *__wrap_ibv_reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t length,
                                        uint64_t iova, int fd, int access)
{
    VM_GUARD();
    /* the dma-buf is an exported device range; WRs address it by iova */
    vm_export_t *x = NULL;
    for (int i = 0; i < M.nexports; i++)
        if (M.exports[i].fd == fd)
            x = &M.exports[i];
    if (!x) {
        errno = EBADF;
        return NULL;
    }
    if (offset + length > x->size || offset + length < offset) {
        errno = EINVAL;
        return NULL;
    }
    if (iova != x->base + offset)
        misuse("reg_dmabuf_mr iova 0x%llx != export base + offset (not modelled)",
               (unsigned long long)iova);
    return reg_mr(pd, (void *)(uintptr_t)iova, length, (unsigned int)access, VM_OP_REG_DMABUF_MR);
}

int __wrap_ibv_dereg_mr(struct ibv_mr *mr)
{
    VM_GUARD();
    vm_mr_t *m = container_of(mr, vm_mr_t, mr);
    if (!m->hdr.live) {
        misuse("ibv_dereg_mr twice");
        return EINVAL;
    }
    m->hdr.live = 0;
    m->info.deregistered = 1;
    m->vpd->children--;
    return 0;
}

static vm_mr_t *mr_find(int dev, vm_pd_t *pd, uint32_t key, int remote)
{
    for (int i = 0; i < M.nmrs; i++) {
        vm_mr_t *m = M.mrs[i];
        if (!m->hdr.live || m->info.dev != dev || m->vpd != pd)
            continue;
        if ((remote ? m->mr.rkey : m->mr.lkey) == key)
            return m;
    }
    return NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* completion channel and CQ                                                                  */

struct ibv_comp_channel *__wrap_ibv_create_comp_channel(struct ibv_context *ctx)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_CREATE_COMP_CHANNEL);
    if (err) {
        errno = err;
        return NULL;
    }
    int fds[2];
    if (pipe(fds) != 0)
        return NULL;
    vm_chan_t *ch = OBJ_NEW(vm_chan_t, K_CHAN);
    ch->vctx = c;
    ch->ch.context = ctx;
    ch->ch.fd = fds[0];
    ch->wfd = fds[1];
    fcntl(ch->wfd, F_SETFL, fcntl(ch->wfd, F_GETFL) | O_NONBLOCK);
    c->children++;
    return &ch->ch;
}

int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *channel)
{
    VM_GUARD();
    vm_chan_t *ch = container_of(channel, vm_chan_t, ch);
    if (!ch->hdr.live) {
        misuse("ibv_destroy_comp_channel twice");
        return EINVAL;
    }
    if (ch->ch.refcnt) {
        misuse("ibv_destroy_comp_channel with %d CQs attached", ch->ch.refcnt);
        return EBUSY;
    }
    ch->hdr.live = 0;
    close(ch->ch.fd);
    close(ch->wfd);
    ch->vctx->children--;
    return 0;
}

struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *ctx, int cqe, void *cq_context,
                                    struct ibv_comp_channel *channel, int comp_vector)
{
    VM_GUARD();
    vm_ctx_t *c = container_of(ctx, vm_ctx_t, ctx);
    int err = fault(VM_OP_CREATE_CQ);
    if (!err && (cqe < 1 || cqe > M.devs[c->dev].cfg.max_cqe))
        err = EINVAL;
    if (!err && channel && channel->context != ctx) {
        misuse("create_cq with a channel of another context");
        err = EINVAL;
    }
    if (!err && (comp_vector < 0 || comp_vector >= ctx->num_comp_vectors))
        err = EINVAL;
    if (err) {
        errno = err;
        return NULL;
    }
    vm_cq_t *cq = OBJ_NEW(vm_cq_t, K_CQ);
    cq->ring = calloc((size_t)cqe, sizeof(*cq->ring));
    if (!cq->ring)
        abort();
    cq->cap = cqe;
    cq->vctx = c;
    cq->chan = channel ? container_of(channel, vm_chan_t, ch) : NULL;
    cq->cq.context = ctx;
    cq->cq.channel = channel;
    cq->cq.cq_context = cq_context;
    cq->cq.cqe = cqe;
    if (channel)
        channel->refcnt++;
    c->children++;
    return &cq->cq;
}

int __wrap_ibv_destroy_cq(struct ibv_cq *ibcq)
{
    VM_GUARD();
    vm_cq_t *cq = container_of(ibcq, vm_cq_t, cq);
    if (!cq->hdr.live) {
        misuse("ibv_destroy_cq twice");
        return EINVAL;
    }
    if (cq->qps) {
        misuse("ibv_destroy_cq with %d QPs attached", cq->qps);
        return EBUSY;
    }
    if (cq->events_gotten != cq->events_acked)
        misuse("ibv_destroy_cq with %llu un-acked completion events (would block forever)",
               (unsigned long long)(cq->events_gotten - cq->events_acked));
    cq->hdr.live = 0;
    if (cq->chan) {
        cq->chan->ch.refcnt--;
        /* events still queued on the channel for this CQ vanish with it */
        for (int i = 0; i < cq->chan->nq; i++)
            if (cq->chan->queue[cq->chan->headq + i] == cq)
                cq->chan->queue[cq->chan->headq + i] = NULL;
    }
    cq->vctx->children--;
    return M.devs[cq->vctx->dev].fatal ? EIO : 0;
}

int __wrap_ibv_get_cq_event(struct ibv_comp_channel *channel, struct ibv_cq **cq_p, void **ctx_p)
{
    VM_GUARD();
    vm_chan_t *ch = container_of(channel, vm_chan_t, ch);
    for (;;) {
        if (ch->nq == 0 && !(fcntl(channel->fd, F_GETFL) & O_NONBLOCK)) {
            misuse("blocking ibv_get_cq_event with nothing queued would hang");
            errno = EAGAIN;
            return -1;
        }
        char b;
        if (read(channel->fd, &b, 1) != 1)
            return -1; /* EAGAIN */
        vm_cq_t *cq = ch->queue[ch->headq++];
        ch->nq--;
        if (!cq)
            continue; /* its CQ was destroyed */
        cq->events_gotten++;
        *cq_p = &cq->cq;
        *ctx_p = cq->cq.cq_context;
        return 0;
    }
}

void __wrap_ibv_ack_cq_events(struct ibv_cq *ibcq, unsigned int nevents)
{
    VM_GUARD();
    vm_cq_t *cq = container_of(ibcq, vm_cq_t, cq);
    cq->events_acked += nevents;
    if (cq->events_acked > cq->events_gotten)
        misuse("ibv_ack_cq_events acks more events than were received");
}

static int vm_req_notify_cq(struct ibv_cq *ibcq, int solicited_only)
{
    VM_GUARD();
    vm_cq_t *cq = container_of(ibcq, vm_cq_t, cq);
    int err = fault(VM_OP_REQ_NOTIFY_CQ);
    if (err)
        return err;
    if (!cq->hdr.live) {
        misuse("req_notify_cq on a destroyed CQ");
        return EINVAL;
    }
    cq->armed = 1;
    return 0;
}

static int vm_poll_cq(struct ibv_cq *ibcq, int n, struct ibv_wc *wc)
{
    VM_GUARD();
    vm_cq_t *cq = container_of(ibcq, vm_cq_t, cq);
    if (!cq->hdr.live) {
        misuse("poll_cq on a destroyed CQ");
        return -1;
    }
    if (cq->broken || M.devs[cq->vctx->dev].fatal)
        return 0;
    int i = 0;
    while (i < n && cq->count) {
        vm_cqe_t *e = &cq->ring[cq->head];
        cq->head = (cq->head + 1) % cq->cap;
        cq->count--;
        wc[i++] = e->wc;
        /* the send-queue slots of this WR and every earlier one are free again */
        if (e->qp->hdr.live && e->seq + 1 > e->qp->retired_seq)
            e->qp->retired_seq = e->seq + 1;
    }
    return i;
}

/* ---------------------------------------------------------------------------------------- */
/* QP                                                                                         */

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia);

struct ibv_qp *__wrap_ibv_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    VM_GUARD();
    pthread_mutex_lock(&vm_lock);
    struct ibv_qp *qp = create_qp(pd, ia);
    int e = errno;
    pthread_mutex_unlock(&vm_lock);
    errno = e;
    return qp;
}

static uint32_t round_pow2(uint32_t v)
{
    uint32_t r = 1;
    while (r < v)
        r <<= 1;
    return r;
}

static struct ibv_qp *create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *ia)
{
    vm_pd_t *p = container_of(pd, vm_pd_t, pd);
    const vm_dev_cfg_t *cfg = &M.devs[p->vctx->dev].cfg;
    int err = fault(VM_OP_CREATE_QP);
    if (!err && ia->qp_type != IBV_QPT_RC)
        err = EOPNOTSUPP;
    if (!err && (!ia->send_cq || !ia->recv_cq || ia->send_cq->context != pd->context ||
                 ia->recv_cq->context != pd->context)) {
        misuse("create_qp with CQs of another context");
        err = EINVAL;
    }
    if (!err &&
        (ia->cap.max_send_wr < 1 || ia->cap.max_send_wr > (uint32_t)cfg->max_qp_wr ||
         ia->cap.max_recv_wr > (uint32_t)cfg->max_qp_wr ||
         ia->cap.max_send_sge > (uint32_t)cfg->max_sge || ia->cap.max_send_sge > VM_MAX_SGE ||
         ia->cap.max_recv_sge > (uint32_t)cfg->max_sge ||
         ia->cap.max_inline_data > (uint32_t)cfg->max_inline))
        err = EINVAL;
    if (!err && M.devs[p->vctx->dev].fatal)
        err = EIO;
    if (err) {
        errno = err;
        return NULL;
    }
    /* like a provider: capacities rounded up and written back (never below what was asked) */
    ia->cap.max_send_wr = round_pow2(ia->cap.max_send_wr);
    if ((int)ia->cap.max_send_wr > cfg->max_qp_wr)
        ia->cap.max_send_wr = (uint32_t)cfg->max_qp_wr;
    if (ia->cap.max_inline_data) {
        ia->cap.max_inline_data = (ia->cap.max_inline_data + 31) & ~31u;
        if (ia->cap.max_inline_data > (uint32_t)cfg->max_inline)
            ia->cap.max_inline_data = (uint32_t)cfg->max_inline;
    }
    vm_qp_t *qp = OBJ_NEW(vm_qp_t, K_QP);
    qp->vctx = p->vctx;
    qp->vpd = p;
    qp->scq = container_of(ia->send_cq, vm_cq_t, cq);
    qp->rcq = container_of(ia->recv_cq, vm_cq_t, cq);
    qp->qp.context = pd->context;
    qp->qp.qp_context = ia->qp_context;
    qp->qp.pd = pd;
    qp->qp.send_cq = ia->send_cq;
    qp->qp.recv_cq = ia->recv_cq;
    qp->qp.qp_num = M.next_qpn++;
    qp->qp.handle = qp->qp.qp_num;
    qp->qp.qp_type = IBV_QPT_RC;
    pthread_mutex_init(&qp->qp.mutex, NULL);
    pthread_cond_init(&qp->qp.cond, NULL);
    qp->info.exists = 1;
    qp->info.dev = p->vctx->dev;
    qp->info.cap = ia->cap;
    qp->info.sq_sig_all = ia->sq_sig_all;
    qp_set_state(qp, IBV_QPS_RESET);
    qp->scq->qps++;
    if (qp->rcq != qp->scq)
        qp->rcq->qps++;
    p->children++;
    M.qps = grow(M.qps, &M.capqps, sizeof(*M.qps), M.nqps + 1);
    M.qps[M.nqps++] = qp;
    M.st.qps_created++;
    return &qp->qp;
}

static vm_qp_t *qp_find(uint32_t qpn)
{
    for (int i = 0; i < M.nqps; i++)
        if (M.qps[i]->qp.qp_num == qpn)
            return M.qps[i];
    return NULL;
}

enum {
    INIT_REQ = IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
    RTR_REQ = IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
              IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER,
    RTR_OPT = IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX,
    RTS_REQ = IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
              IBV_QP_MAX_QP_RD_ATOMIC,
    RTS_OPT = IBV_QP_CUR_STATE | IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_MIN_RNR_TIMER |
              IBV_QP_PATH_MIG_STATE,
};

/* The RC rows of the kernel's transition table (ib_modify_qp_is_ok). */
static int transition_ok(enum ibv_qp_state cur, enum ibv_qp_state next, int mask)
{
    int req = 0, opt = 0;
    mask &= ~IBV_QP_STATE;
    if (next == IBV_QPS_RESET || next == IBV_QPS_ERR) {
        req = 0;
        opt = 0;
    } else if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        req = INIT_REQ;
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_INIT) {
        opt = INIT_REQ;
    } else if (cur == IBV_QPS_INIT && next == IBV_QPS_RTR) {
        req = RTR_REQ;
        opt = RTR_OPT;
    } else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        req = RTS_REQ;
        opt = RTS_OPT;
    } else if (cur == IBV_QPS_RTS && next == IBV_QPS_RTS) {
        opt = RTS_OPT;
    } else {
        return 0;
    }
    if ((mask & req) != req)
        return 0;
    if (mask & ~(req | opt | IBV_QP_CUR_STATE))
        return 0;
    return 1;
}

static int modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask);

int __wrap_ibv_modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
    VM_GUARD();
    pthread_mutex_lock(&vm_lock);
    int rc = modify_qp(ibqp, a, mask);
    pthread_mutex_unlock(&vm_lock);
    return rc;
}

static int modify_qp(struct ibv_qp *ibqp, struct ibv_qp_attr *a, int mask)
{
    vm_qp_t *qp = container_of(ibqp, vm_qp_t, qp);
    if (!qp->hdr.live) {
        misuse("modify_qp on a destroyed QP");
        return EINVAL;
    }
    int err = fault(VM_OP_MODIFY_QP);
    if (err)
        return err;
    const vm_dev_t *d = &M.devs[qp->vctx->dev];
    if (d->fatal)
        return EIO;
    enum ibv_qp_state cur = qp->info.state;
    if ((mask & IBV_QP_CUR_STATE) && a->cur_qp_state != cur)
        return EINVAL;
    enum ibv_qp_state next = (mask & IBV_QP_STATE) ? a->qp_state : cur;
    if (!transition_ok(cur, next, mask))
        return EINVAL;
    if (mask & IBV_QP_PORT) {
        if (a->port_num < 1 || a->port_num > d->cfg.nports)
            return EINVAL;
    }
    if ((mask & IBV_QP_PKEY_INDEX) && a->pkey_index != 0)
        return EINVAL;
    if ((mask & IBV_QP_ACCESS_FLAGS) &&
        (a->qp_access_flags & ~(unsigned)(IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC)))
        return EINVAL;
    if (mask & IBV_QP_PATH_MTU) {
        if (a->path_mtu < IBV_MTU_256 || a->path_mtu > IBV_MTU_4096 ||
            a->path_mtu > d->cfg.active_mtu)
            return EINVAL;
    }
    if (mask & IBV_QP_AV) {
        if (d->cfg.link_layer == IBV_LINK_LAYER_ETHERNET && !a->ah_attr.is_global)
            return EINVAL; /* RoCE needs the GRH */
        if (a->ah_attr.is_global &&
            !gid_at(d, qp->info.port_num ? qp->info.port_num : 1, a->ah_attr.grh.sgid_index))
            return EINVAL;
        if (a->ah_attr.sl > 15)
            return EINVAL;
        if (a->ah_attr.port_num && a->ah_attr.port_num != qp->info.port_num)
            return EINVAL;
    }
    if ((mask & IBV_QP_MAX_DEST_RD_ATOMIC) && a->max_dest_rd_atomic > d->cfg.max_rd_atom)
        return EINVAL;
    if ((mask & IBV_QP_MAX_QP_RD_ATOMIC) && a->max_rd_atomic > d->cfg.max_rd_atom)
        return EINVAL;
    if ((mask & IBV_QP_MIN_RNR_TIMER) && a->min_rnr_timer > 31)
        return EINVAL;
    if ((mask & IBV_QP_TIMEOUT) && a->timeout > 31)
        return EINVAL;
    if ((mask & IBV_QP_RETRY_CNT) && a->retry_cnt > 7)
        return EINVAL;
    if ((mask & IBV_QP_RNR_RETRY) && a->rnr_retry > 7)
        return EINVAL;

    /* record what the transition was given */
    if (cur == IBV_QPS_RESET && next == IBV_QPS_INIT)
        qp->info.init_mask = mask;
    else if (next == IBV_QPS_RTR)
        qp->info.rtr_mask = mask;
    else if (cur == IBV_QPS_RTR && next == IBV_QPS_RTS)
        qp->info.rts_mask = mask;
    if (mask & IBV_QP_PORT)
        qp->info.port_num = a->port_num;
    if (mask & IBV_QP_PKEY_INDEX)
        qp->info.pkey_index = a->pkey_index;
    if (mask & IBV_QP_ACCESS_FLAGS)
        qp->info.access_flags = a->qp_access_flags;
    if (mask & IBV_QP_PATH_MTU)
        qp->info.path_mtu = a->path_mtu;
    if (mask & IBV_QP_DEST_QPN)
        qp->info.dest_qpn = a->dest_qp_num;
    if (mask & IBV_QP_RQ_PSN)
        qp->info.rq_psn = a->rq_psn;
    if (mask & IBV_QP_MAX_DEST_RD_ATOMIC)
        qp->info.max_dest_rd_atomic = a->max_dest_rd_atomic;
    if (mask & IBV_QP_MIN_RNR_TIMER)
        qp->info.min_rnr_timer = a->min_rnr_timer;
    if (mask & IBV_QP_AV) {
        qp->info.is_global = a->ah_attr.is_global;
        memcpy(qp->info.dgid, a->ah_attr.grh.dgid.raw, 16);
        qp->info.sgid_index = a->ah_attr.grh.sgid_index;
        qp->info.hop_limit = a->ah_attr.grh.hop_limit;
        qp->info.traffic_class = a->ah_attr.grh.traffic_class;
        qp->info.sl = a->ah_attr.sl;
        qp->info.dlid = a->ah_attr.dlid;
    }
    if (mask & IBV_QP_TIMEOUT)
        qp->info.timeout = a->timeout;
    if (mask & IBV_QP_RETRY_CNT)
        qp->info.retry_cnt = a->retry_cnt;
    if (mask & IBV_QP_RNR_RETRY)
        qp->info.rnr_retry = a->rnr_retry;
    if (mask & IBV_QP_SQ_PSN)
        qp->info.sq_psn = a->sq_psn;
    if (mask & IBV_QP_MAX_QP_RD_ATOMIC)
        qp->info.max_rd_atomic = a->max_rd_atomic;

    if (next == IBV_QPS_ERR) {
        qp_to_err(qp);
    } else if (next == IBV_QPS_RESET) {
        /* RESET empties the queues without completions */
        vm_wr_t *w = M.wr_head;
        while (w) {
            vm_wr_t *n = w->next;
            if (w->qp == qp) {
                wr_unlink(w);
                free(w);
            }
            w = n;
        }
        qp->retired_seq = qp->next_seq;
        qp_set_state(qp, IBV_QPS_RESET);
    } else if (next != cur) {
        qp_set_state(qp, next);
    }
    return 0;
}

static int destroy_qp(struct ibv_qp *ibqp);

int __wrap_ibv_destroy_qp(struct ibv_qp *ibqp)
{
    VM_GUARD();
    pthread_mutex_lock(&vm_lock);
    int rc = destroy_qp(ibqp);
    pthread_mutex_unlock(&vm_lock);
    return rc;
}

static int destroy_qp(struct ibv_qp *ibqp)
{
    vm_qp_t *qp = container_of(ibqp, vm_qp_t, qp);
    if (!qp->hdr.live) {
        misuse("ibv_destroy_qp twice");
        return EINVAL;
    }
    /* a dead device or a broken CQ completes nothing: destroying undrained QPs is all that is
     * left (the kernel object goes anyway; on a dead device the call fails) */
    int fatal = M.devs[qp->info.dev].fatal;
    int undrainable = fatal || qp->scq->broken;
    /* fatal: nothing will ever drain; the kernel object goes anyway and the call fails */
    if (!undrainable && qp->queued)
        misuse("ibv_destroy_qp 0x%x with %d WRs still queued (not flushed)", qp->qp.qp_num,
               qp->queued);
    if (!undrainable && qp->next_seq != qp->retired_seq)
        misuse("ibv_destroy_qp 0x%x before it was drained: %llu WRs without a polled CQE",
               qp->qp.qp_num, (unsigned long long)(qp->next_seq - qp->retired_seq));
    if (qp->events_gotten != qp->events_acked)
        misuse("ibv_destroy_qp 0x%x with un-acked async events", qp->qp.qp_num);
    vm_wr_t *w = M.wr_head;
    while (w) {
        vm_wr_t *n = w->next;
        if (w->qp == qp) {
            wr_unlink(w);
            free(w);
        }
        w = n;
    }
    qp->hdr.live = 0;
    qp->info.destroyed = 1;
    qp->scq->qps--;
    if (qp->rcq != qp->scq)
        qp->rcq->qps--;
    qp->vpd->children--;
    M.st.qps_destroyed++;
    return fatal ? EIO : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* data path                                                                                  */

static int vm_post_send(struct ibv_qp *ibqp, struct ibv_send_wr *wr, struct ibv_send_wr **bad)
{
    VM_GUARD();
    vm_qp_t *qp = container_of(ibqp, vm_qp_t, qp);
    int err = 0;
    for (; wr; wr = wr->next) {
        err = fault(VM_OP_POST_SEND);
        if (!err && !qp->hdr.live) {
            misuse("post_send on a destroyed QP");
            err = EINVAL;
        }
        if (!err && qp->info.state != IBV_QPS_RTS && qp->info.state != IBV_QPS_ERR)
            err = EINVAL;
        if (!err && wr->opcode != IBV_WR_RDMA_WRITE && wr->opcode != IBV_WR_RDMA_READ) {
            misuse("post_send opcode %d is not modelled", (int)wr->opcode);
            err = EINVAL;
        }
        if (!err && wr->opcode == IBV_WR_RDMA_READ && (wr->send_flags & IBV_SEND_INLINE))
            err = EINVAL; /* a read has nothing to send */
        if (!err && (wr->num_sge < 0 || (uint32_t)wr->num_sge > qp->info.cap.max_send_sge))
            err = EINVAL;
        if (!err && qp->next_seq - qp->retired_seq >= qp->info.cap.max_send_wr)
            err = ENOMEM;
        uint32_t total = 0;
        for (int i = 0; !err && i < wr->num_sge; i++)
            total += wr->sg_list[i].length;
        if (!err && (wr->send_flags & IBV_SEND_INLINE) && total > qp->info.cap.max_inline_data)
            err = EINVAL;
        if (err)
            break;
        vm_wr_t *w = calloc(1, sizeof(*w));
        if (!w) {
            err = ENOMEM;
            break;
        }
        w->qp = qp;
        w->seq = qp->next_seq++;
        w->wr_id = wr->wr_id;
        w->send_flags = wr->send_flags;
        w->num_sge = wr->num_sge;
        if (wr->num_sge)
            memcpy(w->sge, wr->sg_list, (size_t)wr->num_sge * sizeof(*w->sge));
        w->remote_addr = wr->wr.rdma.remote_addr;
        w->rkey = wr->wr.rdma.rkey;
        w->opcode = wr->opcode;
        if (wr->send_flags & IBV_SEND_INLINE) {
            /* inline data is copied at post time: the caller may reuse the buffer at once */
            w->is_inline = 1;
            for (int i = 0; i < wr->num_sge; i++) {
                memcpy(w->inline_data + w->inline_len, (void *)(uintptr_t)wr->sg_list[i].addr,
                       wr->sg_list[i].length);
                w->inline_len += wr->sg_list[i].length;
            }
        }
        qp->info.wrs_posted++;
        if (qp->info.sq_sig_all || (wr->send_flags & IBV_SEND_SIGNALED))
            qp->info.wrs_signalled++;
        M.st.wrs_posted++;
        uint64_t out = qp->next_seq - qp->retired_seq;
        if (out > M.st.max_outstanding)
            M.st.max_outstanding = out;
        if (M.devs[qp->info.dev].fatal) {
            free(w); /* a dead device: accepted, never executed, never completed */
            continue;
        }
        if (qp->info.state == IBV_QPS_ERR) {
            cq_push(qp->scq, qp, w->seq, w->wr_id, IBV_WC_WR_FLUSH_ERR);
            M.st.wrs_flushed++;
            free(w);
            continue;
        }
        if (w->opcode == IBV_WR_RDMA_READ) {
            if (qp->reads_queued >= qp->info.max_rd_atomic)
                misuse("RDMA READ beyond the initiator depth: %d queued, max_rd_atomic %d",
                       qp->reads_queued, (int)qp->info.max_rd_atomic);
            qp->reads_queued++;
            if ((uint64_t)qp->reads_queued > M.st.max_reads_queued)
                M.st.max_reads_queued = (uint64_t)qp->reads_queued;
        }
        w->prev = M.wr_tail;
        if (M.wr_tail)
            M.wr_tail->next = w;
        else
            M.wr_head = w;
        M.wr_tail = w;
        qp->queued++;
        M.nqueued++;
    }
    if (err) {
        *bad = wr;
        M.st.post_rejected++;
    }
    if (M.auto_exec)
        vm_run();
    return err;
}

static void landing_add(vm_qp_t *qp, uintptr_t addr, size_t len)
{
    if (M.nlandings == M.caplandings) {
        size_t ncap = M.caplandings ? M.caplandings * 2 : 256;
        vm_landing_t *p = realloc(M.landings, ncap * sizeof(*p));
        if (!p)
            abort();
        M.landings = p;
        M.caplandings = ncap;
    }
    M.landings[M.nlandings].addr = addr;
    M.landings[M.nlandings].len = len;
    M.landings[M.nlandings].qp = qp;
    M.landings[M.nlandings].unflushed = devmem_of(addr, 0) != NULL;
    M.nlandings++;
}

static int gid_equal(const uint8_t *a, const uint8_t *b)
{
    return memcmp(a, b, 16) == 0;
}

/* Runs one WR the way the requester and responder HCAs would; returns the WC status. */
static enum ibv_wc_status wr_execute(vm_wr_t *w)
{
    vm_qp_t *qp = w->qp;
    uint64_t total = 0;
    if (!w->is_inline) {
        for (int i = 0; i < w->num_sge; i++) {
            const struct ibv_sge *s = &w->sge[i];
            vm_mr_t *m = mr_find(qp->info.dev, qp->vpd, s->lkey, 0);
            if (!m || s->addr < (uintptr_t)m->mr.addr ||
                s->addr + s->length > (uintptr_t)m->mr.addr + m->mr.length)
                return IBV_WC_LOC_PROT_ERR;
            total += s->length;
        }
    } else {
        total = w->inline_len;
    }
    if (M.wr_fail_countdown > 0 && --M.wr_fail_countdown == 0)
        return M.wr_fail_status;

    /* the responder: a connected, ready peer that agrees on the path */
    vm_qp_t *peer = qp_find(qp->info.dest_qpn);
    if (!peer || !peer->hdr.live ||
        (peer->info.state != IBV_QPS_RTR && peer->info.state != IBV_QPS_RTS))
        return IBV_WC_RETRY_EXC_ERR;
    if (peer->info.dest_qpn != qp->qp.qp_num)
        return IBV_WC_RETRY_EXC_ERR;
    const vm_dev_t *pd = &M.devs[peer->info.dev];
    const vm_dev_t *ld = &M.devs[qp->info.dev];
    int pport = peer->info.port_num ? peer->info.port_num : 1;
    int lport = qp->info.port_num ? qp->info.port_num : 1;
    if (pd->fatal)
        return IBV_WC_RETRY_EXC_ERR;
    if (qp->info.is_global) {
        /* the GRH: source entry, destination entry of the same type, routable between them */
        const vm_gid_t *src = gid_at(ld, lport, qp->info.sgid_index), *dst = NULL;
        for (int i = 0; i < gid_tbl_len(pd) && !dst; i++) {
            const vm_gid_t *g = gid_at(pd, pport, i);
            if (g && gid_equal(g->gid.raw, qp->info.dgid) && (!src || g->type == src->type))
                dst = g;
        }
        if (!src || !dst)
            return IBV_WC_RETRY_EXC_ERR;
        if (ld->cfg.subnet != pd->cfg.subnet &&
            (src->type != IBV_GID_TYPE_ROCE_V2 || src->gid.raw[0] == 0xfe ||
             dst->gid.raw[0] == 0xfe))
            return IBV_WC_RETRY_EXC_ERR; /* v1 and link-local stay inside layer 2 */
    } else if (qp->info.dlid != pd->lid[pport - 1] || ld->cfg.subnet != pd->cfg.subnet) {
        return IBV_WC_RETRY_EXC_ERR;
    }
    if (qp->info.path_mtu > pd->cfg.active_mtu)
        return IBV_WC_RETRY_EXC_ERR; /* packets larger than the peer's MTU are dropped */
    if (qp->info.sq_psn != peer->info.rq_psn)
        return IBV_WC_RETRY_EXC_ERR; /* every packet NAKed as out of sequence */
    if (pd->port_state[pport - 1] != IBV_PORT_ACTIVE ||
        ld->port_state[lport - 1] != IBV_PORT_ACTIVE)
        return IBV_WC_RETRY_EXC_ERR;
    if (w->opcode == IBV_WR_RDMA_READ && qp->info.max_rd_atomic > peer->info.max_dest_rd_atomic)
        return IBV_WC_REM_INV_REQ_ERR; /* more READs than the responder has resources for */
    unsigned need =
        w->opcode == IBV_WR_RDMA_READ ? IBV_ACCESS_REMOTE_READ : IBV_ACCESS_REMOTE_WRITE;
    if (!(peer->info.access_flags & need))
        return IBV_WC_REM_ACCESS_ERR;
    vm_mr_t *rm = mr_find(peer->info.dev, peer->vpd, w->rkey, 1);
    if (!rm || !(rm->info.access & need) || w->remote_addr < (uintptr_t)rm->mr.addr ||
        w->remote_addr + total > (uintptr_t)rm->mr.addr + rm->mr.length)
        return IBV_WC_REM_ACCESS_ERR;

    if (w->opcode == IBV_WR_RDMA_READ) {
        /* the response returns after every earlier write of this QP reached memory */
        const uint8_t *src = (const uint8_t *)(uintptr_t)w->remote_addr;
        for (int i = 0; i < w->num_sge; i++) {
            vm_mr_t *lm = mr_find(qp->info.dev, qp->vpd, w->sge[i].lkey, 0);
            if (!(lm->info.access & IBV_ACCESS_LOCAL_WRITE))
                return IBV_WC_LOC_PROT_ERR;
            dma_copy((void *)(uintptr_t)w->sge[i].addr, src, w->sge[i].length);
            src += w->sge[i].length;
        }
        /* it flushes this QP's earlier writes into the memory it read from (one GPU's BAR):
         * writes into another allocation are not ordered by it */
        vm_devmem_t *target = devmem_of(w->remote_addr, 0);
        for (size_t i = 0; i < M.nlandings; i++)
            if (M.landings[i].qp == qp && devmem_of(M.landings[i].addr, 0) == target)
                M.landings[i].unflushed = 0;
        qp->info.wrs_run++;
        M.st.wrs_run++;
        M.st.reads_run++;
        return IBV_WC_SUCCESS;
    }

    uint8_t *dst = (uint8_t *)(uintptr_t)w->remote_addr;
    if (w->is_inline) {
        dma_copy(dst, w->inline_data, w->inline_len);
    } else {
        for (int i = 0; i < w->num_sge; i++) {
            dma_copy(dst, (void *)(uintptr_t)w->sge[i].addr, w->sge[i].length);
            dst += w->sge[i].length;
        }
    }
    rm->info.writes_landed++;
    rm->info.bytes_landed += total;
    qp->info.wrs_run++;
    qp->info.bytes_run += total;
    M.st.wrs_run++;
    M.st.bytes_landed += total;
    if (total > M.st.max_wr_bytes)
        M.st.max_wr_bytes = total;
    if (total)
        landing_add(qp, (uintptr_t)w->remote_addr, (size_t)total);
    return IBV_WC_SUCCESS;
}

static void wr_run(vm_wr_t *w)
{
    vm_qp_t *qp = w->qp;
    wr_unlink(w);
    enum ibv_wc_status st = wr_execute(w);
    if (st == IBV_WC_SUCCESS) {
        if (qp->info.sq_sig_all || (w->send_flags & IBV_SEND_SIGNALED))
            cq_push(qp->scq, qp, w->seq, w->wr_id, st);
    } else {
        /* an error always completes, signalled or not, and takes the QP down */
        M.st.wrs_failed++;
        cq_push(qp->scq, qp, w->seq, w->wr_id, st);
        qp_to_err(qp);
    }
    free(w);
}

int vm_step(int n)
{
    VM_GUARD();
    int ran = 0;
    vm_wr_t *w = M.wr_head;
    while (w && ran < n) {
        vm_wr_t *next = w->next;
        if (!w->qp->held) {
            wr_run(w);
            ran++;
            /* wr_run may have flushed (freed) the WRs after it on the same QP */
            next = M.wr_head;
            while (next && next->qp->held)
                next = next->next;
        }
        w = next;
    }
    return ran;
}

int vm_run(void)
{
    VM_GUARD();
    return vm_step(1 << 30);
}

int vm_queued(void)
{
    VM_GUARD();
    return M.nqueued;
}

void vm_hold_qp(uint32_t qpn, int hold)
{
    VM_GUARD();
    vm_qp_t *qp = qp_find(qpn);
    if (qp)
        qp->held = hold;
}

/* ---------------------------------------------------------------------------------------- */
/* fault injection and inspection                                                             */

int vm_inject_qp_fatal(uint32_t qpn)
{
    VM_GUARD();
    vm_qp_t *qp = qp_find(qpn);
    if (!qp || !qp->hdr.live)
        return -1;
    qp_to_err(qp);
    struct ibv_async_event ev = {.event_type = IBV_EVENT_QP_FATAL};
    ev.element.qp = &qp->qp;
    async_push(qp->vctx, ev);
    return 0;
}

static int push_dev_event(int dev, enum ibv_event_type type, int port)
{
    int n = 0;
    for (vm_hdr_t *h = M.all; h; h = h->next_all) {
        if (h->kind != K_CTX || !h->live)
            continue;
        vm_ctx_t *c = h->base;
        if (c->dev != dev)
            continue;
        struct ibv_async_event ev = {.event_type = type};
        ev.element.port_num = port;
        async_push(c, ev);
        n++;
    }
    return n;
}

int vm_inject_port_event(int dev, int port, enum ibv_event_type type)
{
    VM_GUARD();
    if (dev < 0 || dev >= M.ndevs || port < 1 || port > M.devs[dev].cfg.nports)
        return -1;
    if (type == IBV_EVENT_PORT_ERR)
        M.devs[dev].port_state[port - 1] = IBV_PORT_DOWN;
    else if (type == IBV_EVENT_PORT_ACTIVE)
        M.devs[dev].port_state[port - 1] = IBV_PORT_ACTIVE;
    return push_dev_event(dev, type, port);
}

int vm_inject_port_err(int dev)
{
    VM_GUARD();
    return vm_inject_port_event(dev, 1, IBV_EVENT_PORT_ERR);
}

int vm_set_device_fatal(int dev, int event)
{
    VM_GUARD();
    if (dev < 0 || dev >= M.ndevs)
        return -1;
    M.devs[dev].fatal = 1;
    /* queued work vanishes: no completion, no flush */
    vm_wr_t *w = M.wr_head;
    while (w) {
        vm_wr_t *n = w->next;
        if (w->qp->info.dev == dev) {
            wr_unlink(w);
            free(w);
        }
        w = n;
    }
    for (vm_hdr_t *h = M.all; h; h = h->next_all) {
        if (h->kind == K_CQ && h->live && ((vm_cq_t *)h->base)->vctx->dev == dev) {
            vm_cq_t *cq = h->base;
            cq->count = 0; /* what was not polled yet is lost with the device */
        } else if (h->kind == K_QP && h->live && ((vm_qp_t *)h->base)->info.dev == dev) {
            qp_set_state(h->base, IBV_QPS_ERR);
        }
    }
    return event ? push_dev_event(dev, IBV_EVENT_DEVICE_FATAL, 0) : 0;
}

int vm_inject_device_fatal(int dev)
{
    VM_GUARD();
    return vm_set_device_fatal(dev, 1);
}

int vm_inject_cq_err(int dev)
{
    VM_GUARD();
    if (dev < 0 || dev >= M.ndevs)
        return -1;
    int n = 0;
    for (vm_hdr_t *h = M.all; h; h = h->next_all) {
        if (h->kind != K_CQ || !h->live)
            continue;
        vm_cq_t *cq = h->base;
        if (cq->vctx->dev != dev)
            continue;
        cq->broken = 1;
        cq->count = 0;
        struct ibv_async_event ev = {.event_type = IBV_EVENT_CQ_ERR};
        ev.element.cq = &cq->cq;
        async_push(cq->vctx, ev);
        n++;
    }
    return n;
}

void vm_set_port_ipv4(int dev, int port, const uint8_t ip[4])
{
    VM_GUARD();
    if (dev < 0 || dev >= M.ndevs || port < 1 || port > 2)
        return;
    vm_gid_t *t = M.devs[dev].gids[port - 1];
    for (int i = 2; i < 4; i++)
        memcpy(&t[i].gid.raw[12], ip, 4);
    if (port == 1)
        memcpy(&M.devs[dev].cfg.gid[12], ip, 4);
}

void vm_stats(vm_stats_t *s)
{
    VM_GUARD();
    *s = M.st;
}

void vm_qp_info(uint32_t qpn, vm_qp_info_t *info)
{
    VM_GUARD();
    vm_qp_t *qp = qp_find(qpn);
    if (!qp) {
        memset(info, 0, sizeof(*info));
        return;
    }
    *info = qp->info;
}

int vm_qp_list(uint32_t *qpns, int max)
{
    VM_GUARD();
    for (int i = 0; i < M.nqps && i < max; i++)
        qpns[i] = M.qps[i]->qp.qp_num;
    return M.nqps;
}

void vm_mr_info(uint32_t rkey, vm_mr_info_t *info)
{
    VM_GUARD();
    for (int i = 0; i < M.nmrs; i++) {
        if (M.mrs[i]->mr.rkey == rkey) {
            *info = M.mrs[i]->info;
            return;
        }
    }
    memset(info, 0, sizeof(*info));
}

uint64_t vm_bytes_landed_in(const void *addr, size_t len)
{
    VM_GUARD();
    uintptr_t a = (uintptr_t)addr, b = a + len;
    uint64_t n = 0;
    for (size_t i = 0; i < M.nlandings; i++) {
        uintptr_t x = M.landings[i].addr, y = x + M.landings[i].len;
        uintptr_t lo = x > a ? x : a, hi = y < b ? y : b;
        if (hi > lo)
            n += hi - lo;
    }
    return n;
}

int vm_live_objects(void)
{
    VM_GUARD();
    int n = 0;
    for (vm_hdr_t *h = M.all; h; h = h->next_all)
        n += h->live;
    return n;
}
