/* transfer/rdma_qp.c — the RC QP state machine (RESET-INIT-RTR-RTS-ERR) and handshake blob. */
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "common/rand.h"
#include "transfer/rdma.h"
#include "transfer/le_bytes.h"

/* Values from PROTOCOLS.md §4 (Mooncake's, which are rc_pingpong's plus retries). */
#define QP_ACCESS        (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE)
#define QP_MIN_RNR_TIMER 12
#define QP_TIMEOUT       14
#define QP_RETRY_CNT     7
#define QP_RNR_RETRY     7
#define QP_RD_ATOMIC     16
#define QP_HOP_LIMIT     64

#define B(s) BATON_PHASE_BIT(s)
static const uint32_t qp_legal[RDMA_QP_N_STATES] = {
    [RDMA_QP_NONE] = B(RDMA_QP_INIT),
    [RDMA_QP_INIT] = B(RDMA_QP_RTR) | B(RDMA_QP_ERR) | B(RDMA_QP_NONE),
    [RDMA_QP_RTR] = B(RDMA_QP_RTS) | B(RDMA_QP_ERR) | B(RDMA_QP_NONE),
    [RDMA_QP_RTS] = B(RDMA_QP_ERR) | B(RDMA_QP_NONE),
    [RDMA_QP_ERR] = B(RDMA_QP_NONE),
};
static const uint32_t peer_legal[RDMA_PEER_N_STATES] = {
    [RDMA_PEER_NEW] = B(RDMA_PEER_UP) | B(RDMA_PEER_FAILED),
    /* UP -> NEW: the connect is taken back when its first sweep cannot be queued */
    [RDMA_PEER_UP] = B(RDMA_PEER_NEW) | B(RDMA_PEER_FAILED),
};
#undef B
static const char *const qp_names[RDMA_QP_N_STATES] = {
    [RDMA_QP_NONE] = "none", [RDMA_QP_INIT] = "init", [RDMA_QP_RTR] = "rtr",
    [RDMA_QP_RTS] = "rts",   [RDMA_QP_ERR] = "err",
};
static const char *const peer_names[RDMA_PEER_N_STATES] = {
    [RDMA_PEER_NEW] = "new", [RDMA_PEER_UP] = "up", [RDMA_PEER_FAILED] = "failed"};
const baton_phase_table_t baton__rdma_qp_phases = {"rdma", "qp", RDMA_QP_N_STATES, qp_legal,
                                                   qp_names};
const baton_phase_table_t baton__rdma_peer_phases = {"rdma", "peer", RDMA_PEER_N_STATES, peer_legal,
                                                     peer_names};

static const char *state_name(rdma_qp_state_t s)
{
    return baton_phase_name(&baton__rdma_qp_phases, s);
}

/* A PSN only has to differ between incarnations of a pair: the transport's own generator
 * (QPs are created on its progress thread only). */
static uint32_t psn_next(rdma_tp_t *tp)
{
    return (uint32_t)(baton_splitmix64(&tp->psn_state) & 0xffffff);
}

int baton__rdma_qp_create(rdma_peer_t *peer, rdma_qp_t *qp, rdma_dev_t *dev)
{
    const baton__rdma_tunables_t *tun = &peer->tp->tun;
    uint32_t max_wr = tun->max_wr < dev->max_qp_wr ? tun->max_wr : dev->max_qp_wr;
    struct ibv_qp_init_attr ia;
    int err;

    memset(qp, 0, sizeof(*qp));
    qp->peer = peer;
    qp->dev = dev;
    uint32_t want_sge = tun->max_sge < dev->max_sge ? tun->max_sge : dev->max_sge;
    uint32_t want_inline = tun->max_inline;
    for (;;) {
        memset(&ia, 0, sizeof(ia));
        ia.qp_context = qp;
        ia.send_cq = dev->cq;
        ia.recv_cq = dev->cq;
        ia.cap.max_send_wr = max_wr;
        ia.cap.max_recv_wr = 1; /* RDMA WRITE needs no receives */
        ia.cap.max_send_sge = want_sge;
        ia.cap.max_recv_sge = 1;
        ia.cap.max_inline_data = want_inline;
        ia.qp_type = IBV_QPT_RC;
        ia.sq_sig_all = 0; /* selective signalling */
        qp->qp = ibv_create_qp(dev->pd, &ia);
        if (qp->qp)
            break;
        err = baton__rdma_err_null();
        if (err == UV_EINVAL && want_inline > 0) {
            /* the device takes less (or no) inline data than we asked: do without inline */
            log_warn("rdma", "create_qp_inline_refused dev=%s max_inline=%u: retrying without",
                     dev->name, want_inline);
            want_inline = 0;
            continue;
        }
        log_error("rdma", "create_qp_failed dev=%s max_wr=%u max_sge=%u err=%s", dev->name, max_wr,
                  want_sge, baton_strerror(err));
        return err;
    }
    qp->qpn = qp->qp->qp_num;
    qp->psn = psn_next(peer->tp);
    /* ibv_create_qp wrote back what the provider granted (possibly rounded up); we never use
     * more than we asked for, nor more than was granted */
    qp->max_wr = ia.cap.max_send_wr < max_wr ? ia.cap.max_send_wr : max_wr;
    qp->max_inline = ia.cap.max_inline_data < want_inline ? ia.cap.max_inline_data : want_inline;
    qp->max_sge = ia.cap.max_send_sge < want_sge ? ia.cap.max_send_sge : want_sge;
    max_wr = qp->max_wr;
    qp->ring = calloc(max_wr, sizeof(*qp->ring));
    if (!qp->ring) {
        err = BATON_ENOMEM;
        goto fail;
    }

    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = dev->port;
    a.qp_access_flags = QP_ACCESS;
    err = baton__rdma_err_ret(ibv_modify_qp(
        qp->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));
    if (err) {
        log_error("rdma", "modify_qp_failed dev=%s qpn=%u to=init err=%s", dev->name, qp->qpn,
                  baton_strerror(err));
        goto fail;
    }
    RDMA_QP_MOVE(qp, RDMA_QP_INIT);
    baton__rdma_qp_hash_add(dev, qp);
    return 0;

fail:
    if (ibv_destroy_qp(qp->qp))
        log_warn("rdma", "destroy_qp_failed dev=%s qpn=%u", dev->name, qp->qpn);
    qp->qp = NULL;
    free(qp->ring);
    qp->ring = NULL;
    return err;
}

int baton__rdma_qp_connect(rdma_qp_t *qp, uint32_t remote_qpn, uint32_t remote_psn,
                           const uint8_t gid[16], uint16_t lid, enum ibv_mtu remote_mtu)
{
    rdma_dev_t *dev = qp->dev;
    struct ibv_qp_attr a;
    int err;

    if (qp->state != RDMA_QP_INIT)
        return BATON_EINVAL;
    /* both sides compute the same minimum: an unnegotiated MTU drops every large packet */
    enum ibv_mtu mtu = dev->active_mtu;
    if (remote_mtu < mtu)
        mtu = remote_mtu;
    if (mtu > IBV_MTU_4096)
        mtu = IBV_MTU_4096;
    qp->path_mtu = mtu;
    qp->remote_qpn = remote_qpn;

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = mtu;
    a.dest_qp_num = remote_qpn;
    a.rq_psn = remote_psn;
    a.max_dest_rd_atomic = dev->max_rd_atom < QP_RD_ATOMIC ? dev->max_rd_atom : QP_RD_ATOMIC;
    a.min_rnr_timer = QP_MIN_RNR_TIMER;
    /* RoCE always carries a GRH (its GID is the IP address); InfiniBand routes by LID */
    if (dev->link_layer == IBV_LINK_LAYER_ETHERNET) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, gid, 16);
        a.ah_attr.grh.sgid_index = (uint8_t)dev->gid_index;
        a.ah_attr.grh.hop_limit = QP_HOP_LIMIT;
        a.ah_attr.grh.traffic_class = dev->tp->traffic_class;
    }
    a.ah_attr.dlid = lid;
    a.ah_attr.sl = dev->tp->service_level;
    a.ah_attr.src_path_bits = 0;
    a.ah_attr.port_num = dev->port;
    err = baton__rdma_err_ret(ibv_modify_qp(qp->qp, &a,
                                            IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
                                                IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                                                IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));
    if (err) {
        log_error("rdma", "modify_qp_failed dev=%s qpn=%u to=rtr remote_qpn=%u mtu=%d err=%s",
                  dev->name, qp->qpn, remote_qpn, 128 << mtu, baton_strerror(err));
        return err;
    }
    RDMA_QP_MOVE(qp, RDMA_QP_RTR);

    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_RTS;
    a.timeout = QP_TIMEOUT;
    a.retry_cnt = QP_RETRY_CNT;
    a.rnr_retry = QP_RNR_RETRY;
    a.sq_psn = qp->psn;
    /* The initiator depth: RDMA READs (pull mode, GPU read-back) this QP may have on the wire.
     * Above the responder's max_dest_rd_atomic the peer NIC would refuse them (remote invalid
     * request), so it is the least of our device's limit, the peer's (its blob) and 16. */
    uint8_t rd = dev->max_init_rd_atom < QP_RD_ATOMIC ? dev->max_init_rd_atom : QP_RD_ATOMIC;
    if (qp->peer->remote_rd && qp->peer->remote_rd < rd)
        rd = qp->peer->remote_rd;
    a.max_rd_atomic = rd;
    err = baton__rdma_err_ret(ibv_modify_qp(qp->qp, &a,
                                            IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
                                                IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                                IBV_QP_MAX_QP_RD_ATOMIC));
    if (err) {
        log_error("rdma", "modify_qp_failed dev=%s qpn=%u to=rts err=%s", dev->name, qp->qpn,
                  baton_strerror(err));
        return err;
    }
    RDMA_QP_MOVE(qp, RDMA_QP_RTS);
    qp->max_rd = rd;
    qp->reads_out = 0;
    return 0;
}

int baton__rdma_qp_error(rdma_qp_t *qp)
{
    if (qp->state == RDMA_QP_NONE || qp->state == RDMA_QP_ERR)
        return 0;
    struct ibv_qp_attr a;
    memset(&a, 0, sizeof(a));
    a.qp_state = IBV_QPS_ERR;
    int err = baton__rdma_err_ret(ibv_modify_qp(qp->qp, &a, IBV_QP_STATE));
    if (err) {
        /* the QP keeps its state: it is destroyed after draining, which stops it as well */
        log_error("rdma", "modify_qp_failed dev=%s qpn=%u from=%s to=err err=%s", qp->dev->name,
                  qp->qpn, state_name(qp->state), baton_strerror(err));
        return err;
    }
    RDMA_QP_MOVE(qp, RDMA_QP_ERR);
    return 0;
}

void baton__rdma_qp_destroy(rdma_qp_t *qp)
{
    if (qp->state == RDMA_QP_NONE)
        return;
    baton__rdma_qp_hash_del(qp->dev, qp);
    int err = baton__rdma_err_ret(ibv_destroy_qp(qp->qp));
    if (err)
        log_error("rdma", "destroy_qp_failed dev=%s qpn=%u err=%s", qp->dev->name, qp->qpn,
                  baton_strerror(err));
    log_debug("rdma", "qp_destroyed dev=%s qpn=%u", qp->dev->name, qp->qpn);
    qp->qp = NULL;
    RDMA_QP_MOVE(qp, RDMA_QP_NONE);
    free(qp->ring);
    qp->ring = NULL;
}

/* ---- handshake blob ----------------------------------------------------------------------
 * header, 40 bytes, little endian:
 *   0 u32 magic "BRDM"   4 u16 version   6 u8 role (1 target, 2 initiator)
 *   7 u8 responder resources: the max_dest_rd_atomic every QP of the sender accepts (the least
 *        over its devices, at most 16); the receiver keeps its max_rd_atomic at or below it.
 *        0 in blobs of older senders: unknown (the receiver then uses its own limit, as before)
 *   8 u16 n_qps         10 u16 0        12 u32 0
 *  16 u64 generation (the sender's connection)
 *  24 u64 echo: the generation of the blob this one answers (0 in the target's)
 *  32 u64 incarnation of the sender's engine (for logs)
 * then n_qps entries of 32 bytes, entry i of both blobs being one RC pair:
 *   0 u16 device index  2 u8 port  3 u8 active MTU (enum ibv_mtu)  4 u16 LID
 *   6 u8 link layer (IBV_LINK_LAYER_*; 0 from older peers: unknown)
 *   7 u8 GID type << 6 | IPv4 prefix length of the GID's subnet (0: unknown)
 *   8 u8 gid[16]       24 u32 QPN  28 u32 PSN
 * Bytes 6-7 were zero in the first version, so the version stays 1: zeros mean "unknown" and
 * pair as before.
 */
#define BLOB_MAGIC   0x4d445242u
#define BLOB_VERSION 1
#define BLOB_HDR     40
#define BLOB_ENT     32

int baton__rdma_peer_info(baton__tp_peer_t *bp, uint8_t *buf, size_t cap, size_t *len_p)
{
    rdma_peer_t *peer = container_of(bp, rdma_peer_t, base);
    if (!buf || !len_p)
        return BATON_EINVAL;
    if (peer->nqps == 0) {
        /* the initiator's QPs exist only once it has seen the target's blob */
        log_error("rdma", "peer_info_too_early generation=%llu role=%s",
                  (unsigned long long)bp->generation,
                  bp->role == BATON__TP_ROLE_TARGET ? "target" : "initiator");
        return BATON_EINVAL;
    }
    size_t need = BLOB_HDR + (size_t)peer->nqps * BLOB_ENT;
    if (cap < need)
        return BATON_ETOOBIG;
    memset(buf, 0, need);
    baton__le_put32(buf, BLOB_MAGIC);
    baton__le_put16(buf + 4, BLOB_VERSION);
    buf[6] = bp->role == BATON__TP_ROLE_TARGET ? 1 : 2;
    uint8_t rd = QP_RD_ATOMIC;
    for (int i = 0; i < peer->nqps; i++)
        if (peer->qps[i].dev->max_rd_atom < rd)
            rd = peer->qps[i].dev->max_rd_atom;
    buf[7] = rd;
    baton__le_put16(buf + 8, (uint16_t)peer->nqps);
    baton__le_put64(buf + 16, bp->generation);
    baton__le_put64(buf + 24, bp->role == BATON__TP_ROLE_TARGET ? 0 : peer->remote_generation);
    baton__le_put64(buf + 32, peer->tp->base.env->incarnation);
    for (int i = 0; i < peer->nqps; i++) {
        const rdma_qp_t *qp = &peer->qps[i];
        uint8_t *e = buf + BLOB_HDR + (size_t)i * BLOB_ENT;
        baton__le_put16(e, (uint16_t)qp->dev->index);
        e[2] = qp->dev->port;
        e[3] = (uint8_t)qp->dev->active_mtu;
        baton__le_put16(e + 4, qp->dev->lid);
        e[6] = qp->dev->link_layer;
        e[7] = (uint8_t)((qp->dev->gid_type & 3) << 6 | (qp->dev->prefix_len & 63));
        memcpy(e + 8, qp->dev->gid.raw, 16);
        baton__le_put32(e + 24, qp->qpn);
        baton__le_put32(e + 28, qp->psn);
    }
    *len_p = need;
    return 0;
}

typedef struct {
    uint16_t dev;
    uint8_t port;
    uint8_t mtu;
    uint8_t link_layer;
    uint8_t gid_type;
    uint8_t prefix_len;
    uint16_t lid;
    uint8_t gid[16];
    uint32_t qpn;
    uint32_t psn;
} blob_ent_t;

/* Every field came from the network: check them all before touching a QP. */
static int blob_parse(const uint8_t *b, size_t len, int *role_p, uint64_t *gen_p, uint64_t *echo_p,
                      int *n_p, uint8_t *rd_p, blob_ent_t *ents)
{
    if (!b || len < BLOB_HDR || baton__le_get32(b) != BLOB_MAGIC)
        return BATON_EPROTO;
    if (baton__le_get16(b + 4) != BLOB_VERSION)
        return BATON_EPROTO;
    int role = b[6];
    int n = baton__le_get16(b + 8);
    if ((role != 1 && role != 2) || n < 1 || n > BATON__RDMA_MAX_QPS)
        return BATON_EPROTO;
    if (len != BLOB_HDR + (size_t)n * BLOB_ENT)
        return BATON_EPROTO;
    for (int i = 0; i < n; i++) {
        const uint8_t *e = b + BLOB_HDR + (size_t)i * BLOB_ENT;
        blob_ent_t *x = &ents[i];
        x->dev = baton__le_get16(e);
        x->port = e[2];
        x->mtu = e[3];
        x->lid = baton__le_get16(e + 4);
        x->link_layer = e[6];
        x->gid_type = e[7] >> 6;
        x->prefix_len = e[7] & 63;
        memcpy(x->gid, e + 8, 16);
        x->qpn = baton__le_get32(e + 24);
        x->psn = baton__le_get32(e + 28);
        if (x->dev >= BATON__RDMA_MAX_DEVS || x->port == 0 || x->mtu < IBV_MTU_256 ||
            x->mtu > IBV_MTU_4096 || x->qpn > 0xffffff || x->psn > 0xffffff || x->prefix_len > 32)
            return BATON_EPROTO;
    }
    *role_p = role;
    *rd_p = b[7] > QP_RD_ATOMIC ? QP_RD_ATOMIC : b[7];
    *gen_p = baton__le_get64(b + 16);
    *echo_p = baton__le_get64(b + 24);
    *n_p = n;
    return 0;
}

static uint32_t be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* 2: same subnet (one rail, no router on the way), 1: reachable, 0: cannot reach. Unknown
 * fields (an older peer's zeros) reach, as they did before they were exchanged. */
static int reach(const rdma_dev_t *d, const blob_ent_t *e)
{
    if (e->link_layer == 0)
        return 1;
    if (e->link_layer != d->link_layer)
        return 0; /* InfiniBand and Ethernet do not meet */
    if (d->link_layer != IBV_LINK_LAYER_ETHERNET)
        return memcmp(d->gid.raw, e->gid, 8) == 0 ? 2 : 0; /* LIDs route in one subnet only */
    if (e->gid_type != (uint8_t)d->gid_type)
        return 0; /* RoCE v1 and v2 packets are different protocols */
    if (e->prefix_len && e->prefix_len == d->prefix_len) {
        uint32_t mask = e->prefix_len >= 32 ? 0xffffffffu : ~(0xffffffffu >> e->prefix_len);
        if ((be32(d->gid.raw + 12) & mask) == (be32(e->gid + 12) & mask))
            return 2;
    }
    /* v2 routes; v1 stays inside layer 2, which the operator chose: without a known common
     * subnet assume it reaches */
    return 1;
}

/* The local NIC for pair i: the best reachability, then the least loaded, then NIC i % L (so
 * equal NICs keep the former i % L spread). NULL when none reaches. */
static rdma_dev_t *pick_local(rdma_dev_t **local, int L, int *load, int i, const blob_ent_t *e)
{
    int best = -1, best_reach = 0;
    for (int t = 0; t < L; t++) {
        int j = (i + t) % L;
        int r = reach(local[j], e);
        if (r > best_reach || (r == best_reach && r > 0 && load[j] < load[best])) {
            best = j;
            best_reach = r;
        }
    }
    if (best < 0)
        return NULL;
    load[best]++;
    return local[best];
}

static void note_rnic(rdma_peer_t *peer, rdma_qp_t *qp, uint16_t dev)
{
    qp->remote_dev = dev;
    for (int i = 0; i < peer->nrnic; i++) {
        if (peer->rnic_dev[i] == dev) {
            qp->rnic = i;
            return;
        }
    }
    qp->rnic = peer->nrnic;
    peer->rnic_dev[peer->nrnic++] = dev;
}

int baton__rdma_peer_handshake(rdma_peer_t *peer, const uint8_t *blob, size_t len)
{
    baton__tp_peer_t *bp = &peer->base;
    blob_ent_t ents[BATON__RDMA_MAX_QPS];
    int role, n, err;
    uint64_t gen, echo;
    uint8_t rd;

    err = blob_parse(blob, len, &role, &gen, &echo, &n, &rd, ents);
    if (err) {
        log_error("rdma", "handshake_rejected generation=%llu reason=malformed_blob len=%zu",
                  (unsigned long long)bp->generation, len);
        return err;
    }
    if (bp->role == BATON__TP_ROLE_TARGET) {
        if (role != 2) {
            log_error("rdma", "handshake_rejected generation=%llu reason=role",
                      (unsigned long long)bp->generation);
            return BATON_EPROTO;
        }
        if (echo != bp->generation) {
            /* a reply to an older connection (its QPs are gone): must not touch ours */
            log_warn("rdma", "stale_handshake_ignored generation=%llu reply_for=%llu",
                     (unsigned long long)bp->generation, (unsigned long long)echo);
            return BATON_ESTALE;
        }
        if (n != peer->nqps) {
            log_error("rdma", "handshake_rejected generation=%llu reason=qp_count got=%d want=%d",
                      (unsigned long long)bp->generation, n, peer->nqps);
            return BATON_EPROTO;
        }
        for (int i = 0; i < n; i++) {
            if (peer->qps[i].state != RDMA_QP_INIT) {
                log_error("rdma", "handshake_rejected generation=%llu reason=qp_state",
                          (unsigned long long)bp->generation);
                return BATON_EPROTO;
            }
        }
    } else {
        if (role != 1 || echo != 0) {
            log_error("rdma", "handshake_rejected generation=%llu reason=role",
                      (unsigned long long)bp->generation);
            return BATON_EPROTO;
        }
        if (peer->nqps) {
            log_error("rdma", "handshake_rejected generation=%llu reason=already_connected",
                      (unsigned long long)bp->generation);
            return BATON_EPROTO;
        }
        rdma_dev_t *local[BATON__RDMA_MAX_DEVS];
        int L = baton__rdma_usable_devs(peer->tp, local, BATON__RDMA_MAX_DEVS);
        if (L == 0) {
            log_error("rdma", "handshake_failed generation=%llu reason=no_usable_device",
                      (unsigned long long)bp->generation);
            return BATON_ENODEV;
        }
        peer->qps = calloc((size_t)n, sizeof(*peer->qps));
        if (!peer->qps)
            return BATON_ENOMEM;
        int load[BATON__RDMA_MAX_DEVS] = {0};
        for (int i = 0; i < n; i++) {
            rdma_dev_t *d = pick_local(local, L, load, i, &ents[i]);
            if (!d) {
                log_error("rdma",
                          "handshake_failed generation=%llu reason=no_reachable_nic peer_dev=%u "
                          "link=%u gid_type=%u",
                          (unsigned long long)bp->generation, (unsigned)ents[i].dev,
                          (unsigned)ents[i].link_layer, (unsigned)ents[i].gid_type);
                return BATON_ENOTSUP;
            }
            err = baton__rdma_qp_create(peer, &peer->qps[i], d);
            if (err)
                return err; /* created ones are torn down by fence/destroy */
            peer->nqps = i + 1;
        }
        peer->remote_generation = gen;
    }
    peer->remote_rd = rd;
    for (int i = 0; i < n; i++) {
        rdma_qp_t *qp = &peer->qps[i];
        note_rnic(peer, qp, ents[i].dev);
        err = baton__rdma_qp_connect(qp, ents[i].qpn, ents[i].psn, ents[i].gid, ents[i].lid,
                                     (enum ibv_mtu)ents[i].mtu);
        if (err)
            return err;
    }
    if (bp->role == BATON__TP_ROLE_TARGET)
        peer->remote_generation = gen;
    return 0;
}
