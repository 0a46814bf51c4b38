/* transfer/rdma_dev.c — one verbs context per HCA: discovery, port/GID/limits, PD, CQ. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/rdma.h"

void baton__rdma_tunables_default(baton__rdma_tunables_t *tun)
{
    memset(tun, 0, sizeof(*tun));
    tun->max_wr = 256;
    tun->max_sge = 4;
    tun->max_inline = 64;
    tun->signal_every = 16;
    tun->post_batch = 32;
    tun->cq_size = 4096;
    tun->max_mr_size = 0;
    tun->drain_check_ms = 0;
    tun->sysfs_root = "/sys";
}

/* Is `name` in the comma-separated filter? An entry may pin the GID index ("name:N"): *gid_p
 * gets N, or -1 when the entry has none. */
static int name_listed(const char *name, const char *filter, int *gid_p)
{
    size_t n = strlen(name);
    const char *p = filter;
    *gid_p = -1;
    while (*p) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > p && t[-1] == ' ')
            t--;
        const char *colon = memchr(p, ':', (size_t)(t - p));
        const char *ne = colon ? colon : t;
        if ((size_t)(ne - p) == n && strncmp(p, name, n) == 0) {
            if (colon) {
                char num[8] = {0};
                size_t k = (size_t)(t - colon - 1);
                char *end = NULL;
                long v = -1;
                if (k > 0 && k < sizeof(num)) {
                    memcpy(num, colon + 1, k);
                    v = strtol(num, &end, 10);
                }
                if (!end || *end || v < 0 || v > 255) {
                    log_warn("rdma", "bad_gid_override entry=\"%.*s\" (ignored)", (int)(t - p), p);
                    v = -1;
                }
                *gid_p = (int)v;
            }
            return 1;
        }
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

static const char *gid_type_name(int t)
{
    return t == BATON__RDMA_GID_ROCE_V2 ? "v2" : t == BATON__RDMA_GID_ROCE_V1 ? "v1" : "ib";
}

static int gid_is_zero(const union ibv_gid *g)
{
    static const uint8_t zero[16];
    return memcmp(g->raw, zero, 16) == 0;
}

static int gid_is_v4_mapped(const union ibv_gid *g)
{
    static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
    return memcmp(g->raw, pfx, 12) == 0;
}

static int gid_is_link_local(const union ibv_gid *g)
{
    return g->raw[0] == 0xfe && (g->raw[1] & 0xc0) == 0x80;
}

/*
 * How good a RoCE GID entry is for a connection that may cross routers. A ConnectX port lists
 * each address twice (v1 then v2) and the link-local one first, so index 0 is the v1
 * link-local entry: layer 2 only. v2 (UDP/IP) routes; an IPv4-mapped address with a netdev is
 * what a routed RoCE fabric configures, then a global IPv6 v2 address. v1 entries are never
 * chosen automatically (Mooncake's findBestGidIndex skips them too): a v1 GID fails the first
 * WRITE across a router, so an L2-only deployment pins one explicitly ("name:N").
 * 0: unusable (empty, or v1).
 */
static int gid_score(const struct ibv_gid_entry *e)
{
    if (gid_is_zero(&e->gid))
        return 0;
    if (e->gid_type == IBV_GID_TYPE_ROCE_V2) {
        if (gid_is_v4_mapped(&e->gid))
            return e->ndev_ifindex ? 6 : 5;
        if (!gid_is_link_local(&e->gid))
            return e->ndev_ifindex ? 4 : 3;
        return 2;
    }
    return 0;
}

static int gid_type_of(uint32_t t)
{
    return t == IBV_GID_TYPE_ROCE_V2   ? BATON__RDMA_GID_ROCE_V2
           : t == IBV_GID_TYPE_ROCE_V1 ? BATON__RDMA_GID_ROCE_V1
                                       : BATON__RDMA_GID_IB;
}

/* Picks d->gid / gid_index / gid_type for d->port (the override, or the best entry). */
static int choose_gid(rdma_dev_t *d, int tbl_len)
{
    struct ibv_gid_entry e;
    int err;
    if (d->link_layer != IBV_LINK_LAYER_ETHERNET) {
        /* InfiniBand routes by LID inside the subnet; index 0 holds the port GID (subnet prefix
         * + GUID) for the GRH when there is one */
        int idx = d->gid_override >= 0 ? d->gid_override : 0;
        err = baton__rdma_err_ret(ibv_query_gid(d->ctx, d->port, idx, &d->gid));
        if (err)
            return err;
        d->gid_index = idx;
        d->gid_type = BATON__RDMA_GID_IB;
        return 0;
    }
    if (d->gid_override >= 0) {
        memset(&e, 0, sizeof(e));
        err = baton__rdma_err_ret(
            ibv_query_gid_ex(d->ctx, d->port, (uint32_t)d->gid_override, &e, 0));
        if (err)
            return err;
        if (gid_is_zero(&e.gid))
            return BATON_ENODEV;
        d->gid = e.gid;
        d->gid_index = d->gid_override;
        d->gid_type = gid_type_of(e.gid_type);
        log_info("rdma", "gid_override name=%s port=%u gid_index=%d type=%s", d->name,
                 (unsigned)d->port, d->gid_index, gid_type_name(d->gid_type));
        return 0;
    }
    int best = -1, best_score = 0;
    for (int i = 0; i < tbl_len; i++) {
        memset(&e, 0, sizeof(e));
        if (ibv_query_gid_ex(d->ctx, d->port, (uint32_t)i, &e, 0) != 0)
            continue; /* an empty slot (ENODATA) or one being changed */
        int sc = gid_score(&e);
        if (sc > best_score) {
            best_score = sc;
            best = i;
            d->gid = e.gid;
            d->gid_type = gid_type_of(e.gid_type);
        }
    }
    if (best < 0) {
        log_warn("rdma",
                 "gid_not_routable name=%s port=%u: no RoCE v2 entry (a v1 GID is used only "
                 "when pinned with rdma_devices \"%s:N\")",
                 d->name, (unsigned)d->port, d->name);
        return BATON_ENODEV;
    }
    d->gid_index = best;
    return 0;
}

/* The prefix length of the local interface that holds an IPv4-mapped GID's address (the
 * subnet the handshake announces, so peers can prefer NICs on the same rail); 0: unknown. */
static uint8_t ipv4_prefix_len(const union ibv_gid *g)
{
    if (!gid_is_v4_mapped(g))
        return 0;
    struct ifaddrs *ifs = NULL, *i;
    uint8_t plen = 0;
    if (getifaddrs(&ifs) != 0)
        return 0;
    for (i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || !i->ifa_netmask || i->ifa_addr->sa_family != AF_INET)
            continue;
        const struct sockaddr_in *a = (const struct sockaddr_in *)i->ifa_addr;
        if (memcmp(&a->sin_addr.s_addr, g->raw + 12, 4) != 0)
            continue;
        uint32_t m = ntohl(((const struct sockaddr_in *)i->ifa_netmask)->sin_addr.s_addr);
        while (m & 0x80000000u) {
            plen++;
            m <<= 1;
        }
        break;
    }
    freeifaddrs(ifs);
    return plen;
}

/* Re-reads what a port event may have changed: state, LID, MTU, limits, and the GID choice. */
static int query_port(rdma_dev_t *d)
{
    struct ibv_port_attr pa;
    memset(&pa, 0, sizeof(pa));
    int err = baton__rdma_err_ret(ibv_query_port(d->ctx, d->port, &pa));
    if (err)
        return err;
    if (pa.state != IBV_PORT_ACTIVE)
        return BATON_ENODEV;
    d->active_mtu = pa.active_mtu;
    d->lid = pa.lid;
    d->link_layer = pa.link_layer;
    d->max_msg_sz = pa.max_msg_sz ? pa.max_msg_sz : UINT32_MAX;
    err = choose_gid(d, pa.gid_tbl_len > 0 ? pa.gid_tbl_len : 1);
    if (!err && d->link_layer == IBV_LINK_LAYER_ETHERNET)
        d->prefix_len = ipv4_prefix_len(&d->gid);
    return err;
}

int baton__rdma_dev_refresh(rdma_dev_t *dev)
{
    union ibv_gid old = dev->gid;
    uint16_t old_lid = dev->lid;
    int old_index = dev->gid_index;
    int err = query_port(dev);
    if (err) {
        log_warn("rdma", "port_refresh_failed name=%s port=%u err=%s", dev->name,
                 (unsigned)dev->port, baton_strerror(err));
        return err;
    }
    if (old_lid != dev->lid || old_index != dev->gid_index || memcmp(&old, &dev->gid, 16) != 0)
        log_info("rdma", "port_address_changed name=%s port=%u lid=%u gid_index=%d type=%s",
                 dev->name, (unsigned)dev->port, (unsigned)dev->lid, dev->gid_index,
                 gid_type_name(dev->gid_type));
    return 0;
}

static const char *sysfs_root(const rdma_tp_t *tp)
{
    return tp->tun.sysfs_root && *tp->tun.sysfs_root ? tp->tun.sysfs_root : "/sys";
}

/* A PCI device's resolved sysfs path and NUMA node ("", -1 when unknown). */
static void pci_locate(const char *link, char *path, size_t cap, int *numa_p)
{
    char real[PATH_MAX], f[PATH_MAX + 16];
    path[0] = '\0';
    *numa_p = -1;
    if (!realpath(link, real))
        return;
    snprintf(path, cap, "%s", real);
    snprintf(f, sizeof(f), "%s/numa_node", real);
    FILE *fp = fopen(f, "r");
    if (fp) {
        if (fscanf(fp, "%d", numa_p) != 1)
            *numa_p = -1;
        fclose(fp);
    }
}

/* Path components two PCI paths share: the deeper, the closer (same switch, same root port). */
static int common_depth(const char *a, const char *b)
{
    int depth = 0;
    while (*a && *a == *b) {
        a++;
        b++;
        if (*a == '/' || *a == '\0')
            depth += (*b == '/' || *b == '\0');
    }
    return depth;
}

uint32_t baton__rdma_near_devs(const rdma_tp_t *tp, const char *gpu_bus_id)
{
    char link[PATH_MAX], gpath[PATH_MAX], id[32];
    int gnuma, best = -1;
    uint32_t mask = 0, all = 0;
    size_t i;
    for (i = 0; gpu_bus_id[i] && i + 1 < sizeof(id); i++)
        id[i] = (char)tolower((unsigned char)gpu_bus_id[i]); /* sysfs names are lower case */
    id[i] = '\0';
    snprintf(link, sizeof(link), "%s/bus/pci/devices/%s", sysfs_root(tp), id);
    pci_locate(link, gpath, sizeof(gpath), &gnuma);
    if (!gpath[0])
        return 0;
    for (int d = 0; d < tp->ndevs; d++) {
        const rdma_dev_t *dev = &tp->devs[d];
        all |= 1u << d;
        if (!dev->pci_path[0])
            continue;
        int score =
            common_depth(dev->pci_path, gpath) * 2 + (gnuma >= 0 && dev->numa_node == gnuma);
        if (score > best) {
            best = score;
            mask = 0;
        }
        if (score == best)
            mask |= 1u << d;
    }
    return mask == all ? 0 : mask;
}

struct ibv_mr *baton__rdma_dev_rb_mr(rdma_dev_t *dev)
{
    if (!dev->rb_mr) {
        dev->rb_mr = ibv_reg_mr(dev->pd, dev->rb_buf, sizeof(dev->rb_buf), IBV_ACCESS_LOCAL_WRITE);
        if (!dev->rb_mr)
            log_error("rdma", "readback_reg_failed dev=%s err=%s", dev->name,
                      baton_strerror(baton__rdma_err_null()));
    }
    return dev->rb_mr;
}

/* Opens one context for (ibdev, port): every active port is a device of its own to the rest
 * of the transport (its own PD, CQ and QPs), so a port's events touch only its connections. */
static int open_one(rdma_tp_t *tp, struct ibv_device *ibdev, uint8_t port, int gid_override,
                    rdma_dev_t *d)
{
    const char *name = ibv_get_device_name(ibdev);
    struct ibv_device_attr attr;
    int err;

    memset(d, 0, sizeof(*d));
    d->tp = tp;
    d->gid_override = gid_override;
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
    d->port = port;
    d->nports = attr.phys_port_cnt;
    char link[PATH_MAX];
    snprintf(link, sizeof(link), "%s/class/infiniband/%s/device", sysfs_root(tp), d->name);
    pci_locate(link, d->pci_path, sizeof(d->pci_path), &d->numa_node);
    err = query_port(d);
    if (err) {
        log_warn("rdma", "device_skipped name=%s port=%u reason=port_or_gid err=%s gid_index=%d",
                 d->name, (unsigned)port, baton_strerror(err), d->gid_override);
        goto fail_ctx;
    }
    d->max_mr_size = attr.max_mr_size;
    d->max_qp_wr = attr.max_qp_wr > 0 ? (uint32_t)attr.max_qp_wr : 1;
    d->max_sge = attr.max_sge > 0 ? (uint32_t)attr.max_sge : 1;
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

/* Which ports of ibdev are active (bit p set for port p); 0 when none or it cannot be opened. */
static uint32_t active_ports(struct ibv_device *ibdev, const char *name)
{
    struct ibv_context *ctx = ibv_open_device(ibdev);
    if (!ctx) {
        int err = baton__rdma_err_null();
        log_warn("rdma", "device_skipped name=%s reason=open_failed err=%s", name,
                 baton_strerror(err));
        return 0;
    }
    struct ibv_device_attr attr;
    uint32_t mask = 0;
    int err = baton__rdma_err_ret(ibv_query_device(ctx, &attr));
    if (err) {
        log_warn("rdma", "device_skipped name=%s reason=query_device_failed err=%s", name,
                 baton_strerror(err));
    } else if (attr.phys_port_cnt == 0) {
        log_warn("rdma", "device_skipped name=%s reason=no_ports", name);
    } else {
        for (uint8_t p = 1; p <= attr.phys_port_cnt && p < 32; p++) {
            struct ibv_port_attr pa;
            memset(&pa, 0, sizeof(pa));
            if (baton__rdma_err_ret(ibv_query_port(ctx, p, &pa)) == 0 &&
                pa.state == IBV_PORT_ACTIVE)
                mask |= 1u << p;
        }
        if (!mask)
            log_warn("rdma", "device_skipped name=%s reason=no_active_port ports=%u", name,
                     (unsigned)attr.phys_port_cnt);
    }
    if (ibv_close_device(ctx))
        log_warn("rdma", "close_device_failed name=%s", name);
    return mask;
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
        int gid_override = -1;
        if (filter && (!name || !name_listed(name, filter, &gid_override)))
            continue;
        uint32_t ports = active_ports(list[i], name ? name : "?");
        for (uint8_t port = 1; port < 32; port++) {
            if (!(ports & (1u << port)))
                continue;
            if (tp->ndevs == BATON__RDMA_MAX_DEVS) {
                log_warn("rdma", "device_skipped name=%s port=%u reason=too_many_devices max=%d",
                         name ? name : "?", (unsigned)port, BATON__RDMA_MAX_DEVS);
                continue;
            }
            rdma_dev_t *d = &tp->devs[tp->ndevs];
            if (open_one(tp, list[i], port, gid_override, d) != 0)
                continue;
            d->index = tp->ndevs++;
            char gid[40];
            snprintf(gid, sizeof(gid), "%02x%02x:%02x%02x:%02x%02x:%02x%02x", d->gid.raw[8],
                     d->gid.raw[9], d->gid.raw[10], d->gid.raw[11], d->gid.raw[12], d->gid.raw[13],
                     d->gid.raw[14], d->gid.raw[15]);
            log_info("rdma",
                     "device_open name=%s port=%u mtu=%d lid=%u link=%s gid_index=%d "
                     "gid_type=%s gid=..%s max_mr_size=%llu max_qp_wr=%u max_sge=%u "
                     "max_msg=%u cqe=%u",
                     d->name, (unsigned)d->port, 128 << d->active_mtu, (unsigned)d->lid,
                     d->link_layer == IBV_LINK_LAYER_ETHERNET ? "roce" : "ib", d->gid_index,
                     gid_type_name(d->gid_type), gid, (unsigned long long)d->max_mr_size,
                     d->max_qp_wr, d->max_sge, d->max_msg_sz, d->cq_size);
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
        if (d->rb_mr && (err = baton__rdma_err_ret(ibv_dereg_mr(d->rb_mr))) != 0)
            log_warn("rdma", "dereg_mr_failed name=%s err=%s", d->name, baton_strerror(err));
        d->rb_mr = NULL;
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
