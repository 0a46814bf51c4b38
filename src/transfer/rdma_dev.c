/* transfer/rdma_dev.c — one verbs context per HCA: discovery, port/GID/limits, PD, CQ. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/rdma.h"

baton__rdma_tunables_t baton__rdma_tunables = {
    .max_wr = 256,
    .max_sge = 4,
    .max_inline = 64,
    .signal_every = 16,
    .post_batch = 32,
    .cq_size = 4096,
    .gid_index = 0,
    .max_mr_size = 0,
};

static int name_listed(const char *name, const char *filter)
{
    size_t n = strlen(name);
    const char *p = filter;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > p && t[-1] == ' ')
            t--;
        if ((size_t)(t - p) == n && strncmp(p, name, n) == 0)
            return 1;
        p = e;
    }
    return 0;
}

static int set_nonblock(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return baton__rdma_err_errno(errno);
    return 0;
}

static int open_one(rdma_tp_t *tp, struct ibv_device *ibdev, rdma_dev_t *d)
{
    const char *name = ibv_get_device_name(ibdev);
    struct ibv_device_attr attr;
    struct ibv_port_attr pa;
    int err;

    memset(d, 0, sizeof(*d));
    d->tp = tp;
    snprintf(d->name, sizeof(d->name), "%s", name ? name : "?");
    d->ctx = ibv_open_device(ibdev);
    if (!d->ctx) {
        err = baton__rdma_err_null();
        log_warn("rdma", "device_skipped name=%s reason=open_failed err=%s", d->name,
                 baton_strerror(err));
        return err;
    }
    err = baton__rdma_err_ret(ibv_query_device(d->ctx, &attr));
    if (err) {
        log_warn("rdma", "device_skipped name=%s reason=query_device_failed err=%s", d->name,
                 baton_strerror(err));
        goto fail_ctx;
    }
    if (attr.phys_port_cnt == 0) {
        log_warn("rdma", "device_skipped name=%s reason=no_ports", d->name);
        err = BATON_ENODEV;
        goto fail_ctx;
    }
    d->port = 0;
    for (uint8_t p = 1; p <= attr.phys_port_cnt; p++) {
        memset(&pa, 0, sizeof(pa));
        if (baton__rdma_err_ret(ibv_query_port(d->ctx, p, &pa)) == 0 &&
            pa.state == IBV_PORT_ACTIVE) {
            d->port = p;
            break;
        }
    }
    if (!d->port) {
        log_warn("rdma", "device_skipped name=%s reason=no_active_port ports=%u", d->name,
                 (unsigned)attr.phys_port_cnt);
        err = BATON_ENODEV;
        goto fail_ctx;
    }
    d->active_mtu = pa.active_mtu;
    d->lid = pa.lid;
    d->link_layer = pa.link_layer;
    d->gid_index = tp->tun.gid_index;
    err = baton__rdma_err_ret(ibv_query_gid(d->ctx, d->port, d->gid_index, &d->gid));
    if (err) {
        log_warn("rdma", "device_skipped name=%s reason=query_gid_failed gid_index=%d err=%s",
                 d->name, d->gid_index, baton_strerror(err));
        goto fail_ctx;
    }
    static const uint8_t zero[16];
    if (d->link_layer == IBV_LINK_LAYER_ETHERNET && memcmp(d->gid.raw, zero, 16) == 0) {
        log_warn("rdma", "device_skipped name=%s reason=empty_gid gid_index=%d", d->name,
                 d->gid_index);
        err = BATON_ENODEV;
        goto fail_ctx;
    }
    d->max_mr_size = attr.max_mr_size;
    d->max_qp_wr = attr.max_qp_wr > 0 ? (uint32_t)attr.max_qp_wr : 1;
    d->max_rd_atom = (uint8_t)(attr.max_qp_rd_atom > 16 ? 16 : attr.max_qp_rd_atom);
    d->max_init_rd_atom = (uint8_t)(attr.max_qp_init_rd_atom > 16 ? 16 : attr.max_qp_init_rd_atom);

    d->pd = ibv_alloc_pd(d->ctx);
    if (!d->pd) {
        err = baton__rdma_err_null();
        log_warn("rdma", "device_skipped name=%s reason=alloc_pd_failed err=%s", d->name,
                 baton_strerror(err));
        goto fail_ctx;
    }
    d->chan = ibv_create_comp_channel(d->ctx);
    if (!d->chan) {
        err = baton__rdma_err_null();
        log_warn("rdma", "device_skipped name=%s reason=comp_channel_failed err=%s", d->name,
                 baton_strerror(err));
        goto fail_pd;
    }
    d->cq_size = tp->tun.cq_size;
    if (attr.max_cqe > 0 && d->cq_size > (uint32_t)attr.max_cqe)
        d->cq_size = (uint32_t)attr.max_cqe;
    d->cq = ibv_create_cq(d->ctx, (int)d->cq_size, d, d->chan, 0);
    if (!d->cq) {
        err = baton__rdma_err_null();
        log_warn("rdma", "device_skipped name=%s reason=create_cq_failed cqe=%u err=%s", d->name,
                 d->cq_size, baton_strerror(err));
        goto fail_chan;
    }
    /* both fds join the progress loop: reads must never block it */
    if ((err = set_nonblock(d->chan->fd)) != 0 || (err = set_nonblock(d->ctx->async_fd)) != 0) {
        log_warn("rdma", "device_skipped name=%s reason=nonblock_failed err=%s", d->name,
                 baton_strerror(err));
        goto fail_cq;
    }
    d->qp_hash = calloc(BATON__RDMA_QP_HASH, sizeof(*d->qp_hash));
    if (!d->qp_hash) {
        err = BATON_ENOMEM;
        goto fail_cq;
    }
    d->port_up = 1;
    return 0;

fail_cq:
    if (ibv_destroy_cq(d->cq))
        log_warn("rdma", "destroy_cq_failed name=%s", d->name);
fail_chan:
    if (ibv_destroy_comp_channel(d->chan))
        log_warn("rdma", "destroy_comp_channel_failed name=%s", d->name);
fail_pd:
    if (ibv_dealloc_pd(d->pd))
        log_warn("rdma", "dealloc_pd_failed name=%s", d->name);
fail_ctx:
    if (ibv_close_device(d->ctx))
        log_warn("rdma", "close_device_failed name=%s", d->name);
    d->ctx = NULL;
    return err;
}

int baton__rdma_devs_open(rdma_tp_t *tp, const char *filter)
{
    int n = 0;
    errno = 0;
    struct ibv_device **list = ibv_get_device_list(&n);
    if (!list) {
        int e = errno;
        log_warn("rdma",
                 "no_rdma_device reason=device_list_failed errno=%d (%s): this host has no RDMA "
                 "support (kernel/driver); the next transport is used",
                 e, strerror(e));
        return BATON_ENODEV;
    }
    if (n == 0) {
        ibv_free_device_list(list);
        log_warn("rdma", "no_rdma_device reason=no_devices: ibv_get_device_list found no RDMA "
                         "device; the next transport is used");
        return BATON_ENODEV;
    }
    if (filter && !*filter)
        filter = NULL;
    for (int i = 0; i < n && list[i]; i++) {
        const char *name = ibv_get_device_name(list[i]);
        if (filter && (!name || !name_listed(name, filter)))
            continue;
        if (tp->ndevs == BATON__RDMA_MAX_DEVS) {
            log_warn("rdma", "device_skipped name=%s reason=too_many_devices max=%d",
                     name ? name : "?", BATON__RDMA_MAX_DEVS);
            continue;
        }
        rdma_dev_t *d = &tp->devs[tp->ndevs];
        if (open_one(tp, list[i], d) == 0) {
            d->index = tp->ndevs++;
            char gid[40];
            snprintf(gid, sizeof(gid), "%02x%02x:%02x%02x:%02x%02x:%02x%02x", d->gid.raw[8],
                     d->gid.raw[9], d->gid.raw[10], d->gid.raw[11], d->gid.raw[12], d->gid.raw[13],
                     d->gid.raw[14], d->gid.raw[15]);
            log_info("rdma",
                     "device_open name=%s port=%u mtu=%d lid=%u link=%s gid=..%s "
                     "max_mr_size=%llu max_qp_wr=%u cqe=%u",
                     d->name, (unsigned)d->port, 128 << d->active_mtu, (unsigned)d->lid,
                     d->link_layer == IBV_LINK_LAYER_ETHERNET ? "roce" : "ib", gid,
                     (unsigned long long)d->max_mr_size, d->max_qp_wr, d->cq_size);
        }
    }
    ibv_free_device_list(list);
    if (tp->ndevs == 0) {
        log_warn("rdma",
                 "no_rdma_device reason=none_usable found=%d filter=%s; the next "
                 "transport is used",
                 n, filter ? filter : "(all)");
        return BATON_ENODEV;
    }
    return 0;
}

void baton__rdma_devs_close(rdma_tp_t *tp)
{
    for (int i = 0; i < tp->ndevs; i++) {
        rdma_dev_t *d = &tp->devs[i];
        int err;
        if ((err = baton__rdma_err_ret(ibv_destroy_cq(d->cq))) != 0)
            log_warn("rdma", "destroy_cq_failed name=%s err=%s", d->name, baton_strerror(err));
        if ((err = baton__rdma_err_ret(ibv_destroy_comp_channel(d->chan))) != 0)
            log_warn("rdma", "destroy_comp_channel_failed name=%s err=%s", d->name,
                     baton_strerror(err));
        if ((err = baton__rdma_err_ret(ibv_dealloc_pd(d->pd))) != 0)
            log_warn("rdma", "dealloc_pd_failed name=%s err=%s (a registration still open?)",
                     d->name, baton_strerror(err));
        if ((err = baton__rdma_err_ret(ibv_close_device(d->ctx))) != 0)
            log_warn("rdma", "close_device_failed name=%s err=%s", d->name, baton_strerror(err));
        free(d->qp_hash);
        d->qp_hash = NULL;
    }
    tp->ndevs = 0;
}

uint64_t baton__rdma_chunk_size(const rdma_tp_t *tp)
{
    uint64_t c = UINT64_MAX;
    for (int i = 0; i < tp->ndevs; i++)
        if (tp->devs[i].max_mr_size && tp->devs[i].max_mr_size < c)
            c = tp->devs[i].max_mr_size;
    if (tp->tun.max_mr_size && tp->tun.max_mr_size < c)
        c = tp->tun.max_mr_size;
    c &= ~(uint64_t)4095;
    return c ? c : 4096;
}

void baton__rdma_qp_hash_add(rdma_dev_t *dev, rdma_qp_t *qp)
{
    rdma_qp_t **b = &dev->qp_hash[qp->qpn % BATON__RDMA_QP_HASH];
    qp->hnext = *b;
    *b = qp;
}

void baton__rdma_qp_hash_del(rdma_dev_t *dev, rdma_qp_t *qp)
{
    for (rdma_qp_t **p = &dev->qp_hash[qp->qpn % BATON__RDMA_QP_HASH]; *p; p = &(*p)->hnext) {
        if (*p == qp) {
            *p = qp->hnext;
            qp->hnext = NULL;
            return;
        }
    }
}

rdma_qp_t *baton__rdma_qp_hash_find(rdma_dev_t *dev, uint32_t qpn)
{
    for (rdma_qp_t *q = dev->qp_hash[qpn % BATON__RDMA_QP_HASH]; q; q = q->hnext)
        if (q->qpn == qpn)
            return q;
    return NULL;
}

int baton__rdma_usable_devs(rdma_tp_t *tp, rdma_dev_t **out, int cap)
{
    int n = 0;
    for (int i = 0; i < tp->ndevs && n < cap; i++)
        if (!tp->devs[i].dead && tp->devs[i].port_up)
            out[n++] = &tp->devs[i];
    return n;
}
