/* transfer/rdma_poll.c — completion channel and async event fds on the progress loop. */
#include <errno.h>
#include <stdlib.h>

#include "common/log.h"
#include "transfer/rdma.h"

#define WC_BATCH 32

static void dev_disable(rdma_dev_t *dev, const char *why);

void baton__rdma_cq_drain(rdma_dev_t *dev)
{
    struct ibv_wc wc[WC_BATCH];
    rdma_peer_t *touched = NULL;
    if (__atomic_load_n(&dev->dead, __ATOMIC_RELAXED))
        return; /* its QPs were finished in software; late completions would count twice */
    for (;;) {
        int n = ibv_poll_cq(dev->cq, WC_BATCH, wc);
        if (n < 0) {
            int err = baton__rdma_err_count(n);
            log_error("rdma", "poll_cq_failed dev=%s err=%s", dev->name, baton_strerror(err));
            dev_disable(dev, "poll_cq failed");
            break;
        }
        for (int i = 0; i < n; i++) {
            rdma_peer_t *peer = baton__rdma_on_wc(dev, &wc[i]);
            if (peer && !peer->touched) {
                peer->touched = 1;
                peer->touch_next = touched;
                touched = peer;
                baton__rdma_peer_hold(peer); /* a callback below may destroy it */
            }
        }
        if (n < WC_BATCH)
            break;
    }
    /* settle after the whole batch: writes finish once, drained QPs go, the queue refills */
    for (rdma_peer_t *p = touched; p; p = p->touch_next)
        p->touched = 0;
    while (touched) {
        rdma_peer_t *p = touched;
        touched = p->touch_next;
        if (!p->destroyed)
            baton__rdma_settle(p);
        baton__rdma_peer_release(p);
    }
    if (dev->starved && dev->cq_used < dev->cq_size / 2) {
        /* CQ room came back: peers that waited only for it have no completion of their own to
         * wake them. Half-empty first, so they do not trickle one WR at a time. */
        dev->starved = 0;
        baton_list_t *peers = &dev->tp->peers;
        for (baton_list_t *it = peers->next; it != peers; it = it->next) {
            rdma_peer_t *p = container_of(it, rdma_peer_t, link);
            if (p->post_cursor)
                baton__rdma_pump(p);
        }
    }
}

static void comp_cb(uv_poll_t *h, int status, int events)
{
    rdma_dev_t *dev = h->data;
    if (status < 0)
        log_error("rdma", "comp_poll_error dev=%s err=%s", dev->name, uv_strerror(status));
    /* drain every event (the fd is non-blocking), ack them in one call, re-arm, then poll:
     * a completion that raced the re-arm is still found by the poll */
    unsigned int nev = 0;
    struct ibv_cq *cq;
    void *cq_ctx;
    while (ibv_get_cq_event(dev->chan, &cq, &cq_ctx) == 0)
        nev++;
    if (errno != EAGAIN && errno != EWOULDBLOCK)
        log_error("rdma", "get_cq_event_failed dev=%s err=%s", dev->name,
                  baton_strerror(baton__rdma_err_errno(errno)));
    if (nev)
        ibv_ack_cq_events(dev->cq, nev);
    int err = baton__rdma_err_ret(ibv_req_notify_cq(dev->cq, 0));
    if (err)
        log_error("rdma", "req_notify_cq_failed dev=%s err=%s", dev->name, baton_strerror(err));
    baton__rdma_cq_drain(dev);
}

/* Every peer with a QP on dev fails: a port or device error takes all of them down. A dead
 * device completes nothing (no flushes either): its QPs are finished in software at once,
 * also for peers that had failed before. */
static void fail_dev_peers(rdma_dev_t *dev, int err)
{
    rdma_tp_t *tp = dev->tp;
    int dead = __atomic_load_n(&dev->dead, __ATOMIC_RELAXED);
    for (baton_list_t *it = tp->peers.next; it != &tp->peers; it = it->next) {
        rdma_peer_t *p = container_of(it, rdma_peer_t, link);
        int uses = 0;
        for (int i = 0; i < p->nqps; i++)
            uses |= p->qps[i].dev == dev && p->qps[i].state != RDMA_QP_NONE;
        if (!uses)
            continue;
        baton__rdma_peer_fail(p, err);
        if (dead) {
            for (int i = 0; i < p->nqps; i++)
                if (p->qps[i].dev == dev)
                    baton__rdma_qp_abandon(&p->qps[i]);
            baton__rdma_schedule_sweep(p);
        }
    }
}

static void dev_disable(rdma_dev_t *dev, const char *why)
{
    log_error("rdma", "device_disabled dev=%s port=%u reason=\"%s\": disconnecting its peers",
              dev->name, (unsigned)dev->port, why);
    __atomic_store_n(&dev->dead, 1, __ATOMIC_RELAXED);
    fail_dev_peers(dev, BATON_EPEERDOWN);
}

static void on_async(rdma_dev_t *dev, const struct ibv_async_event *ev)
{
    const char *what = ibv_event_type_str(ev->event_type);
    switch (ev->event_type) {
    case IBV_EVENT_QP_FATAL:
    case IBV_EVENT_QP_REQ_ERR:
    case IBV_EVENT_QP_ACCESS_ERR:
    case IBV_EVENT_PATH_MIG_ERR: {
        /* look the QP up by number: its memory is ours only while it is in the table */
        rdma_qp_t *qp = baton__rdma_qp_hash_find(dev, ev->element.qp->qp_num);
        log_error("rdma", "async_event dev=%s event=\"%s\" qpn=%u generation=%llu", dev->name, what,
                  ev->element.qp->qp_num,
                  qp ? (unsigned long long)qp->peer->base.generation : 0ull);
        if (qp)
            baton__rdma_peer_fail(qp->peer, BATON_EPEERDOWN);
        break;
    }
    case IBV_EVENT_CQ_ERR:
        /* the CQ overflowed or broke: completions were lost, none will come */
        if (ev->element.cq == dev->cq)
            dev_disable(dev, what);
        break;
    case IBV_EVENT_DEVICE_FATAL:
        dev_disable(dev, what);
        break;
    case IBV_EVENT_PORT_ERR:
    case IBV_EVENT_PORT_ACTIVE:
    case IBV_EVENT_LID_CHANGE:
    case IBV_EVENT_GID_CHANGE:
    case IBV_EVENT_CLIENT_REREGISTER:
    case IBV_EVENT_PKEY_CHANGE:
    case IBV_EVENT_SM_CHANGE:
        /* every context of a device hears every port's events: only ours concern us */
        if (ev->element.port_num != dev->port) {
            log_debug("rdma", "async_event dev=%s port=%d event=\"%s\" ignored (our port %u)",
                      dev->name, ev->element.port_num, what, (unsigned)dev->port);
            break;
        }
        if (ev->event_type == IBV_EVENT_PORT_ERR) {
            log_error("rdma", "async_event dev=%s port=%d event=\"%s\": disconnecting its peers",
                      dev->name, ev->element.port_num, what);
            dev->port_up = 0;
            fail_dev_peers(dev, BATON_EPEERDOWN);
            break;
        }
        log_info("rdma", "async_event dev=%s port=%d event=\"%s\": refreshing the address",
                 dev->name, ev->element.port_num, what);
        /* new connections use the new LID / GID; live ones keep theirs until they fail */
        if (baton__rdma_dev_refresh(dev) == 0 && ev->event_type == IBV_EVENT_PORT_ACTIVE)
            dev->port_up = 1;
        break;
    default:
        log_info("rdma", "async_event dev=%s event=\"%s\"", dev->name, what);
        break;
    }
}

static void async_cb(uv_poll_t *h, int status, int events)
{
    rdma_dev_t *dev = h->data;
    if (status < 0)
        log_error("rdma", "async_poll_error dev=%s err=%s", dev->name, uv_strerror(status));
    struct ibv_async_event ev;
    while (ibv_get_async_event(dev->ctx, &ev) == 0) {
        on_async(dev, &ev);
        /* acked at once: ibv_destroy_qp waits for the acks of its events */
        ibv_ack_async_event(&ev);
    }
}

static void closed_cb(uv_handle_t *h)
{
    rdma_dev_t *dev = h->data;
    rdma_tp_t *tp = dev->tp;
    if (--tp->handles_open == 0 && tp->finishing)
        baton__rdma_poll_closed(tp);
}

int baton__rdma_poll_start(rdma_tp_t *tp)
{
    uv_loop_t *loop = tp->base.env->loop;
    for (int i = 0; i < tp->ndevs; i++) {
        rdma_dev_t *d = &tp->devs[i];
        int err = baton__rdma_err_ret(ibv_req_notify_cq(d->cq, 0));
        if (err) {
            log_error("rdma", "req_notify_cq_failed dev=%s err=%s", d->name, baton_strerror(err));
            return err;
        }
        if ((err = uv_poll_init(loop, &d->comp_poll, d->chan->fd)) != 0)
            return err;
        d->comp_poll.data = d;
        tp->handles_open++;
        d->polls_started |= 1;
        if ((err = uv_poll_init(loop, &d->async_poll, d->ctx->async_fd)) != 0)
            return err;
        d->async_poll.data = d;
        tp->handles_open++;
        d->polls_started |= 2;
        if ((err = uv_poll_start(&d->comp_poll, UV_READABLE, comp_cb)) != 0 ||
            (err = uv_poll_start(&d->async_poll, UV_READABLE, async_cb)) != 0)
            return err;
    }
    return 0;
}

void baton__rdma_poll_stop(rdma_tp_t *tp)
{
    for (int i = 0; i < tp->ndevs; i++) {
        rdma_dev_t *d = &tp->devs[i];
        if (d->polls_started & 1)
            uv_close((uv_handle_t *)&d->comp_poll, closed_cb);
        if (d->polls_started & 2)
            uv_close((uv_handle_t *)&d->async_poll, closed_cb);
        d->polls_started = 0;
    }
}

void baton__rdma_poll_closed(rdma_tp_t *tp)
{
    /* the fds are no longer watched: the verbs objects behind them can go */
    baton__rdma_devs_close(tp);
    log_info("rdma", "transport_closed");
    free(tp);
}
