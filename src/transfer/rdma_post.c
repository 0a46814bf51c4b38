/* transfer/rdma_post.c — RDMA WRITE and READ (pull mode): slices, stripes, signalling,
 * completions, failure, fence. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/rdma.h"

static int validate(rdma_peer_t *peer, const baton__tp_write_t *w)
{
    for (size_t i = 0; i < w->n_sges; i++) {
        const baton__tp_sge_t *s = &w->sges[i];
        if (s->len == 0 || !s->src || !s->src_mr || s->src_mr->tp != &peer->tp->base)
            return BATON_EINVAL;
        uintptr_t src = (uintptr_t)s->src, base = (uintptr_t)s->src_mr->addr;
        if (src < base || src - base > s->src_mr->len || s->len > s->src_mr->len - (src - base))
            return BATON_EINVAL;
        const rdma_rmem_t *rm = baton__rdma_rmem_find(peer, s->dst_mem);
        if (!rm) {
            log_error("rdma", "write_rejected room=%llu reason=unknown_region mem_id=%u",
                      (unsigned long long)w->room_id, s->dst_mem);
            return BATON_ERKEY;
        }
        if (s->dst < rm->base || s->dst - rm->base > rm->len ||
            s->len > rm->len - (s->dst - rm->base)) {
            log_error("rdma",
                      "write_rejected room=%llu reason=out_of_bounds mem_id=%u dst=0x%llx "
                      "len=%llu region=0x%llx+%llu",
                      (unsigned long long)w->room_id, s->dst_mem, (unsigned long long)s->dst,
                      (unsigned long long)s->len, (unsigned long long)rm->base,
                      (unsigned long long)rm->len);
            return BATON_ERKEY;
        }
    }
    return 0;
}

/* Queues a write or a read (same op, same accounting) and posts what fits. */
static int start_op(rdma_peer_t *peer, baton__tp_write_t *w, int is_read)
{
    if (!w || !w->cb || !w->sges || w->n_sges == 0)
        return BATON_EINVAL;
    if (peer->state != RDMA_PEER_UP || peer->fail_err || peer->fencing)
        return BATON_EPEERDOWN;
    int err = validate(peer, w);
    if (err)
        return err;
    if (is_read) {
        int can = 0;
        for (int i = 0; i < peer->nqps; i++)
            can |= peer->qps[i].max_rd > 0;
        if (!can) {
            log_error("rdma", "read_rejected room=%llu reason=no_initiator_depth",
                      (unsigned long long)w->room_id);
            return BATON_ENOTSUP; /* a device (or peer) that takes no RDMA READ at all */
        }
    }
    rdma_op_t *op = calloc(1, sizeof(*op));
    if (!op)
        return BATON_ENOMEM;
    op->is_read = is_read;
    op->w = w;
    op->peer = peer;
    op->seq = peer->op_seq++;
    op->rm_idx = -1;
    if (peer->ops_tail)
        peer->ops_tail->next = op;
    else
        peer->ops_head = op;
    peer->ops_tail = op;
    if (!peer->post_cursor)
        peer->post_cursor = op;
    /* posting here is fine: completions (and so callbacks) only come from the CQ later */
    baton__rdma_pump(peer);
    return 0;
}

int baton__rdma_write(baton__tp_peer_t *bp, baton__tp_write_t *w)
{
    if (bp->role != BATON__TP_ROLE_INITIATOR)
        return BATON_EINVAL;
    return start_op(container_of(bp, rdma_peer_t, base), w, 0);
}

int baton__rdma_read(baton__tp_peer_t *bp, baton__tp_write_t *w)
{
    /* either role: the puller connected the control channel (TARGET) in Baton's pull mode */
    return start_op(container_of(bp, rdma_peer_t, base), w, 1);
}

static uint32_t outstanding(const rdma_qp_t *qp)
{
    return (uint32_t)(qp->next_seq - qp->tail_seq);
}

/* CQEs kept back for drain markers, which fences post without a budget check. */
static uint32_t cq_budget(const rdma_dev_t *dev)
{
    uint32_t margin = dev->cq_size / 4 < 64 ? dev->cq_size / 4 : 64;
    return dev->cq_size - margin;
}

/* The devices op's next slice may leave from: GPU memory goes through the NICs nearest its GPU
 * while this connection has a live QP on one of them (all of them otherwise). */
static uint32_t slice_devs(const rdma_peer_t *peer, const rdma_op_t *op)
{
    const rdma_mr_t *mr = container_of(op->w->sges[op->sge_idx].src_mr, rdma_mr_t, base);
    if (!mr->near_devs)
        return UINT32_MAX;
    for (int i = 0; i < peer->nqps; i++) {
        const rdma_qp_t *qp = &peer->qps[i];
        if (qp->state == RDMA_QP_RTS && !qp->dev->dead && (mr->near_devs >> qp->dev->index & 1))
            return mr->near_devs;
    }
    return UINT32_MAX;
}

/* The next QP, round-robin, on one of `devs`, that can take one more WR in this pump (a READ
 * also needs one of the QP's max_rd slots). */
static int pick_qp(rdma_peer_t *peer, uint32_t batch, uint32_t devs, int is_read)
{
    for (int t = 0; t < peer->nqps; t++) {
        int qi = (int)((peer->rr + (uint32_t)t) % (uint32_t)peer->nqps);
        rdma_qp_t *qp = &peer->qps[qi];
        if (qp->state != RDMA_QP_RTS || qp->dev->dead || !(devs >> qp->dev->index & 1))
            continue;
        if (peer->clen[qi] >= batch || outstanding(qp) + peer->clen[qi] >= qp->max_wr)
            continue;
        if (is_read && qp->reads_out >= qp->max_rd)
            continue; /* the initiator depth: more READs would wait in the NIC (or be refused) */
        if (qp->dev->cq_used >= cq_budget(qp->dev)) {
            qp->dev->starved = 1; /* another peer's completions must pump us */
            continue;
        }
        peer->rr = (uint32_t)(qi + 1) % (uint32_t)peer->nqps;
        return qi;
    }
    return -1;
}

/* GPU memory with weak GPUDirect write ordering: every (QP, region) pair that carried a slice
 * is read back once the op's writes completed (see readback()). */
static void note_readback(rdma_op_t *op, int qi, uint32_t mem)
{
    for (uint32_t i = 0; i < op->n_rb; i++)
        if (op->rb[i].qi == qi && op->w->sges[op->rb[i].sge].dst_mem == mem)
            return;
    if (op->n_rb == op->cap_rb) {
        uint32_t ncap = op->cap_rb ? op->cap_rb * 2 : 4;
        rdma_rb_t *n = realloc(op->rb, ncap * sizeof(*n));
        if (!n) {
            if (!op->status)
                op->status = BATON_ENOMEM; /* cannot promise visibility: fail the write */
            return;
        }
        op->rb = n;
        op->cap_rb = ncap;
    }
    op->rb[op->n_rb].qi = (uint16_t)qi;
    op->rb[op->n_rb].sge = (uint32_t)op->sge_idx;
    op->n_rb++;
    op->rb_state = 1;
}

/* Appends the next slice of op to QP qi's chain and advances op's cursor. */
static void add_slice(rdma_peer_t *peer, rdma_op_t *op, int qi, uint32_t batch)
{
    rdma_qp_t *qp = &peer->qps[qi];
    const baton__tp_sge_t *s = &op->w->sges[op->sge_idx];
    if (op->rm_idx < 0) {
        rdma_rmem_t *rm = baton__rdma_rmem_find(peer, s->dst_mem);
        op->rm_idx = (int)(rm - peer->rmems); /* validated when the write started */
    }
    const rdma_rmem_t *rm = &peer->rmems[op->rm_idx];
    const rdma_mr_t *mr = container_of(s->src_mr, rdma_mr_t, base);
    uintptr_t src = (uintptr_t)s->src + op->sge_off;
    uint64_t dst = s->dst + op->sge_off;
    uint64_t len = s->len - op->sge_off, lroom, rroom;
    if (len > peer->tp->slice_size)
        len = peer->tp->slice_size;
    /* a slice never crosses an MR boundary on either side */
    uint32_t lkey = baton__rdma_lkey(mr, qp->dev->index, src, &lroom);
    uint32_t rkey = baton__rdma_rkey(rm, qp->rnic, dst, &rroom);
    if (len > lroom)
        len = lroom;
    if (len > rroom)
        len = rroom;

    uint32_t j = peer->clen[qi]++;
    struct ibv_sge *sg = &peer->csge[(size_t)qi * batch + j];
    struct ibv_send_wr *wr = &peer->cwr[(size_t)qi * batch + j];
    sg->addr = src;
    sg->length = (uint32_t)len;
    sg->lkey = lkey;
    memset(wr, 0, sizeof(*wr));
    wr->sg_list = sg;
    wr->num_sge = 1;
    wr->opcode = op->is_read ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
    /* the provider copies inline data with the CPU at post time: only host memory may go
     * inline, a device pointer would be dereferenced on the host; a READ sends no data */
    wr->send_flags = (!op->is_read && len <= qp->max_inline && mr->base.kind == BATON_XFER_MEM_HOST)
                         ? IBV_SEND_INLINE
                         : 0;
    wr->wr.rdma.remote_addr = dst;
    wr->wr.rdma.rkey = rkey;
    rdma_wr_rec_t *rec = &qp->ring[(qp->next_seq + j) % qp->max_wr];
    rec->op = op;
    rec->len = (uint32_t)len;
    rec->is_read = (uint8_t)op->is_read;
    qp->reads_out += (uint32_t)op->is_read;
    op->inflight++;
    qp->dev->cq_used++;
    if (rm->readback && !op->is_read)
        note_readback(op, qi, s->dst_mem);

    op->sge_off += len;
    if (op->sge_off == s->len) {
        op->sge_idx++;
        op->sge_off = 0;
        op->rm_idx = -1;
        if (op->sge_idx == op->w->n_sges)
            op->posted_all = 1;
    }
}

/* Forgets the WRs of QP qi's chain from index `from` on: they were never posted. */
static void unwind_chain(rdma_peer_t *peer, int qi, uint32_t from, uint32_t n, int err)
{
    rdma_qp_t *qp = &peer->qps[qi];
    for (uint32_t j = from; j < n; j++) {
        rdma_wr_rec_t *rec = &qp->ring[(qp->next_seq + j - from) % qp->max_wr];
        qp->reads_out -= rec->is_read;
        rec->is_read = 0;
        rec->op->inflight--;
        if (!rec->op->status)
            rec->op->status = err;
        rec->op = NULL;
        qp->dev->cq_used--;
    }
}

/* Posts QP qi's chain: every signal_every-th WR and the last one ask for a completion, so the
 * newest WR on a QP is always signalled and a drain always ends with a CQE. */
static int post_chain(rdma_peer_t *peer, int qi, uint32_t batch)
{
    rdma_qp_t *qp = &peer->qps[qi];
    uint32_t n = peer->clen[qi];
    struct ibv_send_wr *wrs = &peer->cwr[(size_t)qi * batch];
    peer->clen[qi] = 0;
    for (uint32_t j = 0; j < n; j++) {
        wrs[j].next = j + 1 < n ? &wrs[j + 1] : NULL;
        wrs[j].wr_id = qp->next_seq + j;
        if (++qp->since_signal >= peer->tp->tun.signal_every || j + 1 == n) {
            wrs[j].send_flags |= IBV_SEND_SIGNALED;
            qp->since_signal = 0;
        }
    }
    struct ibv_send_wr *bad = NULL;
    int rc = ibv_post_send(qp->qp, wrs, &bad);
    uint32_t posted = n;
    if (rc)
        posted = (bad >= wrs && bad < wrs + n) ? (uint32_t)(bad - wrs) : 0;
    qp->next_seq += posted;
    if (posted)
        qp->last_signalled = (wrs[posted - 1].send_flags & IBV_SEND_SIGNALED) != 0;
    if (!rc)
        return 0;
    int err = baton__rdma_err_ret(rc);
    log_error("rdma", "post_send_failed dev=%s qpn=%u posted=%u of=%u outstanding=%u err=%s",
              qp->dev->name, qp->qpn, posted, n, outstanding(qp), baton_strerror(err));
    unwind_chain(peer, qi, posted, n, err);
    return err;
}

void baton__rdma_pump(rdma_peer_t *peer)
{
    uint32_t batch = peer->tp->tun.post_batch;
    /* one round builds at most `batch` WRs per QP and posts them as one chain per QP; rounds
     * repeat until the queues are full or nothing is left to post */
    while (peer->state == RDMA_PEER_UP && !peer->fail_err && peer->post_cursor) {
        rdma_op_t *op = peer->post_cursor;
        int added = 0;
        while (op) {
            int qi = pick_qp(peer, batch, slice_devs(peer, op), op->is_read);
            if (qi < 0)
                break; /* every QP full: completions will pump again */
            add_slice(peer, op, qi, batch);
            added++;
            if (op->posted_all)
                op = op->next;
        }
        peer->post_cursor = op;
        int err = 0;
        for (int qi = 0; qi < peer->nqps; qi++) {
            if (!peer->clen[qi])
                continue;
            if (err) {
                /* the connection is failing: nothing more goes to the wire */
                unwind_chain(peer, qi, 0, peer->clen[qi], err);
                peer->clen[qi] = 0;
                continue;
            }
            err = post_chain(peer, qi, batch);
        }
        if (err)
            baton__rdma_peer_fail(peer, err);
        if (!added)
            break;
    }
}

rdma_peer_t *baton__rdma_on_wc(rdma_dev_t *dev, const struct ibv_wc *wc)
{
    rdma_qp_t *qp = baton__rdma_qp_hash_find(dev, wc->qp_num);
    if (!qp) {
        log_debug("rdma", "wc_ignored dev=%s qpn=%u status=%s reason=unknown_qp", dev->name,
                  wc->qp_num, ibv_wc_status_str(wc->status));
        return NULL;
    }
    rdma_peer_t *peer = qp->peer;
    uint64_t s = wc->wr_id;
    if (s < qp->tail_seq || s >= qp->next_seq) {
        log_error("rdma", "wc_ignored dev=%s qpn=%u wr_id=%llu reason=not_outstanding", dev->name,
                  qp->qpn, (unsigned long long)s);
        baton__rdma_peer_fail(peer, BATON_EPROTO);
        return peer;
    }
    int err = 0;
    if (wc->status != IBV_WC_SUCCESS) {
        err = baton__rdma_err_wc(wc->status);
        if (wc->status == IBV_WC_WR_FLUSH_ERR && peer->fail_err)
            log_debug("rdma", "wc_flushed dev=%s qpn=%u wr_id=%llu", dev->name, qp->qpn,
                      (unsigned long long)s);
        else
            log_error("rdma",
                      "wc_failed dev=%s qpn=%u remote_qpn=%u generation=%llu wr_id=%llu "
                      "status=\"%s\" (%d) vendor_err=0x%x",
                      dev->name, qp->qpn, qp->remote_qpn, (unsigned long long)peer->base.generation,
                      (unsigned long long)s, ibv_wc_status_str(wc->status), (int)wc->status,
                      wc->vendor_err);
        baton__rdma_peer_fail(peer, err);
        if (qp->state == RDMA_QP_NONE)
            return peer; /* abandoned by the failure (a dead device): already accounted */
    }
    /* one completion covers its WR and every earlier unsignalled one on this QP */
    for (uint64_t q = qp->tail_seq; q <= s; q++) {
        rdma_wr_rec_t *rec = &qp->ring[q % qp->max_wr];
        dev->cq_used--;
        qp->reads_out -= rec->is_read;
        rec->is_read = 0;
        if (rec->op) {
            rec->op->inflight--;
            if (err && !rec->op->status)
                rec->op->status = peer->fail_err ? peer->fail_err : err;
            rec->op = NULL;
        }
    }
    qp->tail_seq = s + 1;
    return peer;
}

/*
 * The read-back that makes GPUDirect writes visible: one small signalled RDMA READ per (QP, GPU
 * region) pair the op wrote through, posted after all its writes completed. A read on an RC
 * QP executes after the writes before it and its response leaves the responder only once they
 * reached the memory (PCIe reads do not pass posted writes), so its completion means the data
 * is in place for the GPU too. Returns 1 while the op must wait (reads posted, or no room yet),
 * 0 when it may finish (op->status says how).
 */
static int readback(rdma_peer_t *peer, rdma_op_t *op)
{
    if (op->rb_state != 1)
        return op->rb_state == 2 && op->inflight;
    if (op->status || peer->fail_err) {
        op->rb_state = 0;
        return 0;
    }
    uint32_t need[BATON__RDMA_MAX_QPS] = {0};
    for (uint32_t i = 0; i < op->n_rb; i++)
        need[op->rb[i].qi]++;
    for (int qi = 0; qi < peer->nqps; qi++) {
        rdma_qp_t *qp = &peer->qps[qi];
        if (need[qi] && (outstanding(qp) + need[qi] > qp->max_wr ||
                         qp->dev->cq_used + need[qi] > qp->dev->cq_size ||
                         (qp->reads_out > 0 && qp->reads_out + need[qi] > qp->max_rd)))
            return 1; /* this QP's completions will settle (and bring us back) */
    }
    for (uint32_t i = 0; i < op->n_rb && !op->status; i++) {
        rdma_qp_t *qp = &peer->qps[op->rb[i].qi];
        const baton__tp_sge_t *s = &op->w->sges[op->rb[i].sge];
        rdma_rmem_t *rm = baton__rdma_rmem_find(peer, s->dst_mem);
        struct ibv_mr *lmr = baton__rdma_dev_rb_mr(qp->dev);
        if (!lmr || !rm) {
            op->status = lmr ? BATON_ERKEY : BATON_ENOMEM;
            break;
        }
        uint64_t room;
        struct ibv_sge sg = {.addr = (uintptr_t)lmr->addr, .length = 1, .lkey = lmr->lkey};
        struct ibv_send_wr wr, *bad = NULL;
        memset(&wr, 0, sizeof(wr));
        wr.wr_id = qp->next_seq;
        wr.sg_list = &sg;
        wr.num_sge = 1;
        wr.opcode = IBV_WR_RDMA_READ;
        wr.send_flags = IBV_SEND_SIGNALED;
        wr.wr.rdma.remote_addr = s->dst;
        wr.wr.rdma.rkey = baton__rdma_rkey(rm, qp->rnic, s->dst, &room);
        int rc = ibv_post_send(qp->qp, &wr, &bad);
        if (rc) {
            int err = baton__rdma_err_ret(rc);
            log_error("rdma", "readback_post_failed dev=%s qpn=%u err=%s", qp->dev->name, qp->qpn,
                      baton_strerror(err));
            op->status = err;
            baton__rdma_peer_fail(peer, err);
            break;
        }
        rdma_wr_rec_t *rec = &qp->ring[qp->next_seq % qp->max_wr];
        rec->op = op;
        rec->len = 0;
        rec->is_read = 1;
        qp->reads_out++;
        op->inflight++;
        qp->next_seq++;
        qp->since_signal = 0;
        qp->last_signalled = 1;
        qp->dev->cq_used++;
    }
    op->rb_state = 2;
    return op->inflight != 0;
}

static void fire_flushes(rdma_peer_t *peer)
{
    uint64_t pending = peer->ops_head ? peer->ops_head->seq : UINT64_MAX;
    while (peer->flushes && peer->flushes->upto <= pending && !peer->destroyed) {
        rdma_flush_t *f = peer->flushes;
        peer->flushes = f->next;
        f->cb(&peer->base, 0, f->arg);
        free(f);
    }
}

void baton__rdma_settle(rdma_peer_t *peer)
{
    baton__rdma_peer_hold(peer);
    if (peer->fail_err) {
        for (int i = 0; i < peer->nqps; i++) {
            rdma_qp_t *qp = &peer->qps[i];
            if (qp->state != RDMA_QP_NONE && qp->tail_seq == qp->next_seq) {
                /* drained: nothing of ours is in flight and the pair can write no more */
                baton__rdma_qp_error(qp);
                baton__rdma_qp_destroy(qp);
            }
        }
    }
    /* finished writes, in start order; collected first because callbacks may start writes */
    rdma_op_t *done = NULL, **tail = &done, *prev = NULL;
    for (rdma_op_t *op = peer->ops_head, *next; op; op = next) {
        next = op->next;
        if (op->posted_all && op->inflight == 0 && !readback(peer, op)) {
            if (prev)
                prev->next = next;
            else
                peer->ops_head = next;
            if (peer->ops_tail == op)
                peer->ops_tail = prev;
            if (peer->post_cursor == op)
                peer->post_cursor = next;
            op->next = NULL;
            *tail = op;
            tail = &op->next;
        } else {
            prev = op;
        }
    }
    while (done) {
        rdma_op_t *op = done;
        done = op->next;
        baton__tp_write_t *w = op->w;
        int st = op->status;
        free(op->rb);
        free(op);
        w->cb(w, st); /* exactly once, even if the engine misbehaves below */
    }
    if (!peer->destroyed)
        fire_flushes(peer);
    if (!peer->destroyed)
        baton__rdma_pump(peer);
    if (!peer->destroyed && peer->fencing && !peer->fence_fired && !peer->connect_pending &&
        !peer->ops_head) {
        int live = 0;
        for (int i = 0; i < peer->nqps; i++)
            live += peer->qps[i].state != RDMA_QP_NONE;
        if (!live) {
            peer->drained = 1;
            peer->fence_fired = 1;
            log_info("rdma", "peer_fenced generation=%llu reason=%s",
                     (unsigned long long)peer->base.generation, baton_strerror(peer->fail_err));
            peer->fence_cb(&peer->base, 0, peer->fence_arg);
        }
    }
    baton__rdma_peer_release(peer);
}

static void sweep_cb(void *arg)
{
    rdma_peer_t *peer = arg;
    peer->sweep_queued = 0;
    if (!peer->destroyed && peer->connect_pending) {
        peer->connect_pending = 0;
        peer->connect_cb(&peer->base, peer->fail_err, peer->connect_arg);
    }
    if (!peer->destroyed && peer->fail_err && !peer->fail_told) {
        peer->fail_told = 1;
        const baton__tp_env_t *env = peer->tp->base.env;
        env->peer_failed(&peer->base, peer->fail_err);
    }
    if (!peer->destroyed)
        baton__rdma_settle(peer);
    baton__rdma_peer_release(peer); /* the sweep's hold */
}

void baton__rdma_schedule_sweep(rdma_peer_t *peer)
{
    if (peer->sweep_queued || peer->destroyed)
        return;
    int err = baton__tp_defer(peer->tp->base.env, sweep_cb, peer);
    if (err) {
        log_error("rdma", "defer_failed generation=%llu err=%s",
                  (unsigned long long)peer->base.generation, baton_strerror(err));
        return;
    }
    peer->sweep_queued = 1;
    baton__rdma_peer_hold(peer);
}

void baton__rdma_qp_abandon(rdma_qp_t *qp)
{
    if (qp->state == RDMA_QP_NONE)
        return;
    rdma_peer_t *peer = qp->peer;
    int err = peer->fail_err ? peer->fail_err : BATON_EPEERDOWN;
    if (err == BATON_ECANCELED)
        err = BATON_EPEERDOWN; /* the writes did not finish: the connection is what failed */
    uint64_t n = qp->next_seq - qp->tail_seq;
    if (n)
        log_warn("rdma", "qp_abandoned dev=%s qpn=%u outstanding=%llu: completed in software",
                 qp->dev->name, qp->qpn, (unsigned long long)n);
    for (uint64_t q = qp->tail_seq; q < qp->next_seq; q++) {
        rdma_wr_rec_t *rec = &qp->ring[q % qp->max_wr];
        qp->dev->cq_used--;
        qp->reads_out -= rec->is_read;
        rec->is_read = 0;
        if (rec->op) {
            rec->op->inflight--;
            if (!rec->op->status)
                rec->op->status = err;
            rec->op = NULL;
        }
    }
    qp->tail_seq = qp->next_seq;
    baton__rdma_qp_error(qp); /* may fail with EIO: the destroy below happens anyway */
    baton__rdma_qp_destroy(qp);
}

void baton__rdma_drain_check(rdma_peer_t *peer, uint64_t now_ms)
{
    if (!peer->fail_err || peer->destroyed)
        return;
    int live = 0;
    for (int i = 0; i < peer->nqps; i++)
        live += peer->qps[i].state != RDMA_QP_NONE;
    if (!live) {
        peer->drained = 1;
        return;
    }
    uint64_t bound = peer->tp->drain_bound_ms;
    if (now_ms - peer->fail_ms < bound)
        return;
    log_error("rdma",
              "drain_timeout generation=%llu qps=%d after_ms=%llu: the NIC stopped completing; "
              "finishing the drain in software",
              (unsigned long long)peer->base.generation, live, (unsigned long long)bound);
    for (int i = 0; i < peer->nqps; i++)
        baton__rdma_qp_abandon(&peer->qps[i]);
    peer->drained = 1;
    baton__rdma_schedule_sweep(peer);
}

void baton__rdma_peer_fail(rdma_peer_t *peer, int err)
{
    if (peer->fail_err)
        return;
    peer->fail_err = err;
    RDMA_PEER_MOVE(peer, RDMA_PEER_FAILED);
    peer->fail_ms = uv_now(peer->tp->base.env->loop);
    baton__rdma_watchdog_arm(peer->tp);
    if (err != BATON_ECANCELED)
        log_warn("rdma", "peer_down generation=%llu role=%s err=%s qps=%d: QPs to ERROR, draining",
                 (unsigned long long)peer->base.generation,
                 peer->base.role == BATON__TP_ROLE_TARGET ? "target" : "initiator",
                 baton_strerror(err), peer->nqps);
    for (int i = 0; i < peer->nqps; i++) {
        rdma_qp_t *qp = &peer->qps[i];
        if (__atomic_load_n(&qp->dev->dead, __ATOMIC_RELAXED)) {
            /* a dead device completes nothing, flushes included */
            baton__rdma_qp_abandon(qp);
            continue;
        }
        baton__rdma_qp_error(qp);
        if (qp->state == RDMA_QP_ERR && outstanding(qp) && !qp->last_signalled &&
            outstanding(qp) < qp->max_wr) {
            /* the newest WR was unsignalled (a post failed mid-chain): a signalled marker
             * posted to the ERR QP flushes at once and closes the drain */
            struct ibv_send_wr wr, *bad = NULL;
            memset(&wr, 0, sizeof(wr));
            wr.wr_id = qp->next_seq;
            wr.opcode = IBV_WR_RDMA_WRITE;
            wr.send_flags = IBV_SEND_SIGNALED;
            qp->ring[qp->next_seq % qp->max_wr].op = NULL;
            qp->ring[qp->next_seq % qp->max_wr].is_read = 0;
            if (ibv_post_send(qp->qp, &wr, &bad) == 0) {
                qp->next_seq++;
                qp->last_signalled = 1;
                qp->dev->cq_used++;
            }
        }
    }
    for (rdma_op_t *op = peer->ops_head; op; op = op->next) {
        if (!op->posted_all) {
            op->posted_all = 1; /* the rest of it is never posted */
            if (!op->status)
                op->status = err;
        }
    }
    peer->post_cursor = NULL;
    baton__rdma_schedule_sweep(peer);
}

int baton__rdma_peer_fence(baton__tp_peer_t *bp, baton__tp_done_cb cb, void *arg)
{
    rdma_peer_t *peer = container_of(bp, rdma_peer_t, base);
    if (!cb || peer->fencing)
        return BATON_EINVAL;
    peer->fencing = 1;
    peer->fence_cb = cb;
    peer->fence_arg = arg;
    /* the engine decided: it needs no peer_failed upcall anymore */
    peer->fail_told = 1;
    log_info("rdma", "peer_fence generation=%llu qps=%d writes_in_flight=%s",
             (unsigned long long)bp->generation, peer->nqps, peer->ops_head ? "yes" : "no");
    baton__rdma_peer_fail(peer, BATON_ECANCELED);
    baton__rdma_schedule_sweep(peer);
    return 0;
}

int baton__rdma_flush(baton__tp_peer_t *bp, baton__tp_done_cb cb, void *arg)
{
    rdma_peer_t *peer = container_of(bp, rdma_peer_t, base);
    if (!cb)
        return BATON_EINVAL;
    rdma_flush_t *f = calloc(1, sizeof(*f));
    if (!f)
        return BATON_ENOMEM;
    f->upto = peer->op_seq;
    f->cb = cb;
    f->arg = arg;
    rdma_flush_t **p = &peer->flushes;
    while (*p)
        p = &(*p)->next;
    *p = f;
    baton__rdma_schedule_sweep(peer);
    return 0;
}
