/* transfer/rdma.c — the RDMA transport's ops table: start/stop, capabilities, peer lifetimes. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/rdma.h"

static void rdma_fini(baton__tp_t *btp);

/* The drain watchdog: a failed peer whose QPs have not drained within the bound is finished
 * in software (a NIC that stopped completing would otherwise hold its fence forever). */
static void watchdog_cb(uv_timer_t *t)
{
    rdma_tp_t *tp = t->data;
    uint64_t now = uv_now(t->loop);
    int draining = 0;
    tp->wd_gen++;
    /* a check may fire callbacks that destroy any peer: look each one up afresh */
    for (;;) {
        rdma_peer_t *p = NULL;
        for (baton_list_t *it = tp->peers.next; it != &tp->peers && !p; it = it->next) {
            rdma_peer_t *c = container_of(it, rdma_peer_t, link);
            if (c->fail_err && c->wd_gen != tp->wd_gen)
                p = c;
        }
        if (!p)
            break;
        p->wd_gen = tp->wd_gen;
        baton__rdma_peer_hold(p);
        baton__rdma_drain_check(p, now);
        if (!p->destroyed && !p->drained)
            draining = 1;
        baton__rdma_peer_release(p);
    }
    if (!draining)
        uv_timer_stop(t);
}

void baton__rdma_watchdog_arm(rdma_tp_t *tp)
{
    if (!tp->watchdog_init || uv_is_active((uv_handle_t *)&tp->watchdog))
        return;
    uint64_t every = tp->tun.drain_check_ms ? tp->tun.drain_check_ms : tp->drain_bound_ms / 4;
    if (every < 1)
        every = 1;
    uv_timer_start(&tp->watchdog, watchdog_cb, every, every);
}

static void watchdog_closed_cb(uv_handle_t *h)
{
    rdma_tp_t *tp = h->data;
    if (--tp->handles_open == 0 && tp->finishing)
        baton__rdma_poll_closed(tp);
}

/* Fork safety is process-wide: ibv_fork_init must run before any registration. */
static void fork_setup(const baton_xfer_config_t *cfg)
{
    if (cfg->rdma_fork_init) {
        int rc = ibv_fork_init();
        if (rc)
            log_warn("rdma",
                     "fork_init_failed err=%s: a fork after registration may corrupt "
                     "registered memory",
                     baton_strerror(baton__rdma_err_ret(rc)));
        else
            log_info("rdma", "fork_init done");
    }
}

int baton__rdma_init_tuned(const baton__tp_env_t *env, const baton__rdma_tunables_t *tun,
                           baton__tp_t **tp_p)
{
    if (!env || !env->loop || !env->cfg || !tp_p || !tun)
        return BATON_EINVAL;
    const baton_xfer_config_t *cfg = env->cfg;
    rdma_tp_t *tp = calloc(1, sizeof(*tp));
    if (!tp)
        return BATON_ENOMEM;
    tp->base.ops = &baton__tp_rdma_ops;
    baton_list_init(&tp->peers);
    tp->base.env = env;
    tp->base.id = BATON_XFER_TRANSPORT_RDMA;
    tp->tun = *tun;
    if (tp->tun.max_wr < 2)
        tp->tun.max_wr = 2;
    if (tp->tun.signal_every < 1)
        tp->tun.signal_every = 1;
    if (tp->tun.signal_every > tp->tun.max_wr / 2)
        tp->tun.signal_every = tp->tun.max_wr / 2; /* a full queue always holds a signalled WR */
    if (tp->tun.post_batch < 1)
        tp->tun.post_batch = 1;
    if (tp->tun.cq_size < 16)
        tp->tun.cq_size = 16;
    if (tp->tun.max_sge < 1)
        tp->tun.max_sge = 1;
    tp->slice_size = cfg->slice_size ? cfg->slice_size : 64 * 1024;
    tp->qps_per_nic = cfg->rdma_qps_per_nic ? cfg->rdma_qps_per_nic : 2;
    if (tp->qps_per_nic > 16)
        tp->qps_per_nic = 16;
    tp->traffic_class = (uint8_t)(cfg->rdma_traffic_class > 255 ? 255 : cfg->rdma_traffic_class);
    tp->service_level = (uint8_t)(cfg->rdma_service_level > 15 ? 15 : cfg->rdma_service_level);
    if (cfg->rdma_traffic_class > 255 || cfg->rdma_service_level > 15)
        log_warn("rdma", "qos_clamped traffic_class=%u service_level=%u",
                 (unsigned)tp->traffic_class, (unsigned)tp->service_level);
    tp->hugepages = cfg->rdma_hugepages != 0;
    tp->drain_bound_ms = cfg->rdma_drain_timeout_ms ? cfg->rdma_drain_timeout_ms : 5000;
    /* PSNs only have to differ between incarnations of a pair: per transport, seeded by the
     * clock and the transport's address so two engines in one process draw apart */
    tp->psn_state = uv_hrtime() ^ ((uint64_t)(uintptr_t)tp << 17) ^ env->incarnation;
    fork_setup(cfg);

    int err = baton__rdma_devs_open(tp, cfg->rdma_devices);
    if (err) {
        free(tp);
        return err; /* BATON_ENODEV: logged; the engine falls back */
    }
    while (tp->qps_per_nic > 1 && (uint32_t)tp->ndevs * tp->qps_per_nic > BATON__RDMA_MAX_QPS)
        tp->qps_per_nic--;
    /* one RDMA WRITE may not exceed any port's max message */
    for (int i = 0; i < tp->ndevs; i++)
        if (tp->devs[i].max_msg_sz && tp->slice_size > tp->devs[i].max_msg_sz)
            tp->slice_size = tp->devs[i].max_msg_sz;
    tp->chunk = baton__rdma_chunk_size(tp);
    err = uv_timer_init(env->loop, &tp->watchdog);
    if (!err) {
        tp->watchdog.data = tp;
        tp->watchdog_init = 1;
        tp->handles_open++;
        uv_unref((uv_handle_t *)&tp->watchdog); /* never keeps the loop alive on its own */
        err = baton__rdma_poll_start(tp);
    }
    if (err) {
        log_error("rdma", "poll_start_failed err=%s", baton_strerror(err));
        rdma_fini(&tp->base); /* frees once the handles opened so far have closed */
        return err;
    }
    log_info("rdma",
             "transport_ready devices=%d qps_per_nic=%u slice=%u max_wr=%u max_sge=%u "
             "inline=%u signal_every=%u mr_chunk=%llu traffic_class=%u service_level=%u "
             "drain_bound_ms=%llu",
             tp->ndevs, tp->qps_per_nic, tp->slice_size, tp->tun.max_wr, tp->tun.max_sge,
             tp->tun.max_inline, tp->tun.signal_every, (unsigned long long)tp->chunk,
             (unsigned)tp->traffic_class, (unsigned)tp->service_level,
             (unsigned long long)tp->drain_bound_ms);
    *tp_p = &tp->base;
    return 0;
}

static int rdma_init(const baton__tp_env_t *env, baton__tp_t **tp_p)
{
    baton__rdma_tunables_t tun;
    baton__rdma_tunables_default(&tun);
    return baton__rdma_init_tuned(env, &tun, tp_p);
}

static void peer_teardown(rdma_peer_t *peer);

static void rdma_fini(baton__tp_t *btp)
{
    rdma_tp_t *tp = container_of(btp, rdma_tp_t, base);
    while (!baton_list_empty(&tp->peers)) {
        rdma_peer_t *peer = container_of(tp->peers.next, rdma_peer_t, link);
        log_error("rdma", "fini_with_live_peer generation=%llu (engine bug): destroying it",
                  (unsigned long long)peer->base.generation);
        peer_teardown(peer);
    }
    tp->finishing = 1;
    if (tp->watchdog_init) {
        tp->watchdog_init = 0;
        uv_close((uv_handle_t *)&tp->watchdog, watchdog_closed_cb);
    }
    baton__rdma_poll_stop(tp);
    if (tp->handles_open == 0)
        baton__rdma_poll_closed(tp);
}

static int rdma_query(baton__tp_t *btp, baton__tp_caps_t *caps)
{
    if (!caps)
        return BATON_EINVAL;
    memset(caps, 0, sizeof(*caps));
    caps->max_slice = 0;    /* any length: the transport slices itself */
    caps->remote_check = 1; /* the target HCA checks rkey, bounds and access */
#ifdef BATON_HAVE_CUDA
    caps->cuda_local = 1;
    caps->cuda_remote = 1;
#endif
    return 0;
}

/* ---- peers ------------------------------------------------------------------------------- */

static void peer_free(rdma_peer_t *peer)
{
    free(peer->qps);
    free(peer->cwr);
    free(peer->csge);
    free(peer->clen);
    baton__rdma_rmems_free(peer);
    while (peer->flushes) {
        rdma_flush_t *f = peer->flushes;
        peer->flushes = f->next;
        free(f);
    }
    free(peer);
}

void baton__rdma_peer_hold(rdma_peer_t *peer)
{
    peer->holds++;
}

void baton__rdma_peer_release(rdma_peer_t *peer)
{
    if (--peer->holds == 0 && peer->destroyed)
        peer_free(peer);
}

static int rdma_peer_create(baton__tp_t *btp, baton__tp_role_t role, uint64_t generation,
                            baton__tp_peer_t **peer_p)
{
    rdma_tp_t *tp = container_of(btp, rdma_tp_t, base);
    if (!peer_p || (role != BATON__TP_ROLE_TARGET && role != BATON__TP_ROLE_INITIATOR))
        return BATON_EINVAL;
    rdma_peer_t *peer = calloc(1, sizeof(*peer));
    if (!peer)
        return BATON_ENOMEM;
    peer->tp = tp;
    peer->base.tp = btp;
    peer->base.role = role;
    peer->base.generation = generation;
    if (role == BATON__TP_ROLE_TARGET) {
        /* the target proposes the pairs: Q QPs per usable NIC, k-major (see rdma.h) */
        rdma_dev_t *devs[BATON__RDMA_MAX_DEVS];
        int R = baton__rdma_usable_devs(tp, devs, BATON__RDMA_MAX_DEVS);
        if (R == 0) {
            log_error("rdma", "peer_create_failed generation=%llu reason=no_usable_device",
                      (unsigned long long)generation);
            free(peer);
            return BATON_ENODEV;
        }
        int n = R * (int)tp->qps_per_nic;
        peer->qps = calloc((size_t)n, sizeof(*peer->qps));
        if (!peer->qps) {
            free(peer);
            return BATON_ENOMEM;
        }
        for (int i = 0; i < n; i++) {
            int err = baton__rdma_qp_create(peer, &peer->qps[i], devs[i % R]);
            if (err) {
                for (int j = 0; j < i; j++)
                    baton__rdma_qp_destroy(&peer->qps[j]);
                peer_free(peer);
                return err;
            }
            peer->nqps = i + 1;
        }
    }
    baton_list_push_front(&tp->peers, &peer->link);
    *peer_p = &peer->base;
    return 0;
}

static int rdma_peer_connect(baton__tp_peer_t *bp, const uint8_t *blob, size_t len,
                             baton__tp_done_cb cb, void *arg)
{
    rdma_peer_t *peer = container_of(bp, rdma_peer_t, base);
    if (!cb || !blob)
        return BATON_EINVAL;
    if (peer->fencing || peer->fail_err)
        return BATON_EPEERDOWN;
    if (peer->state != RDMA_PEER_NEW || peer->connect_pending)
        return BATON_EINVAL; /* connections are one-shot */
    int err = baton__rdma_peer_handshake(peer, blob, len);
    if (err)
        return err;
    size_t nb = (size_t)peer->nqps * peer->tp->tun.post_batch;
    peer->cwr = calloc(nb, sizeof(*peer->cwr));
    peer->csge = calloc(nb, sizeof(*peer->csge));
    peer->clen = calloc((size_t)peer->nqps, sizeof(*peer->clen));
    if (!peer->cwr || !peer->csge || !peer->clen)
        return BATON_ENOMEM;
    RDMA_PEER_MOVE(peer, RDMA_PEER_UP);
    peer->connect_pending = 1;
    peer->connect_cb = cb;
    peer->connect_arg = arg;
    baton__rdma_schedule_sweep(peer);
    if (!peer->sweep_queued) {
        RDMA_PEER_MOVE(peer, RDMA_PEER_NEW);
        peer->connect_pending = 0;
        return BATON_ENOMEM;
    }
    log_info("rdma",
             "peer_up role=%s generation=%llu peer_generation=%llu qps=%d peer_nics=%d mtu=%d",
             bp->role == BATON__TP_ROLE_TARGET ? "target" : "initiator",
             (unsigned long long)bp->generation, (unsigned long long)peer->remote_generation,
             peer->nqps, peer->nrnic, 128 << peer->qps[0].path_mtu);
    return 0;
}

/* Tears down what is left and unlinks; the memory goes when the last hold is released. */
static void peer_teardown(rdma_peer_t *peer)
{
    baton_list_remove(&peer->link);
    for (int i = 0; i < peer->nqps; i++) {
        rdma_qp_t *qp = &peer->qps[i];
        if (qp->state == RDMA_QP_NONE)
            continue;
        if (qp->next_seq != qp->tail_seq)
            log_error("rdma", "peer_destroy_before_drain generation=%llu qpn=%u outstanding=%llu",
                      (unsigned long long)peer->base.generation, qp->qpn,
                      (unsigned long long)(qp->next_seq - qp->tail_seq));
        baton__rdma_qp_error(qp);
        for (uint64_t s = qp->tail_seq; s < qp->next_seq; s++)
            qp->dev->cq_used--;
        baton__rdma_qp_destroy(qp);
    }
    while (peer->ops_head) {
        rdma_op_t *op = peer->ops_head;
        peer->ops_head = op->next;
        log_error("rdma", "peer_destroy_with_write room=%llu (engine bug: no fence)",
                  (unsigned long long)op->w->room_id);
        free(op->rb);
        free(op);
    }
    peer->ops_tail = peer->post_cursor = NULL;
    peer->destroyed = 1;
    peer->holds++;
    baton__rdma_peer_release(peer);
}

static void rdma_peer_destroy(baton__tp_peer_t *bp)
{
    if (!bp)
        return;
    peer_teardown(container_of(bp, rdma_peer_t, base));
}

const baton__tp_ops_t baton__tp_rdma_ops = {
    .name = "rdma",
    .id = BATON_XFER_TRANSPORT_RDMA,
    .init = rdma_init,
    .fini = rdma_fini,
    .query = rdma_query,
    .mem_reg = baton__rdma_mem_reg,
    .mem_key = baton__rdma_mem_key,
    .mem_dereg = baton__rdma_mem_dereg,
    .peer_create = rdma_peer_create,
    .peer_info = baton__rdma_peer_info,
    .peer_connect = rdma_peer_connect,
    .mem_add = baton__rdma_mem_add,
    .mem_del = baton__rdma_mem_del,
    .write = baton__rdma_write,
    .read = baton__rdma_read,
    .flush = baton__rdma_flush,
    .peer_fence = baton__rdma_peer_fence,
    .peer_destroy = rdma_peer_destroy,
    .adopt_lane = baton__tp_notsup_adopt_lane,
};
