/* store/node.c — `baton-store node`: contributes one memory segment registered with libbaton,
 * registers it with the master and keeps it alive with heartbeats, places puts (pulls the bytes
 * a client exports into the segment) and serves gets (writes a segment range into the room a
 * client offers). It never looks at the bytes. */
#include <getopt.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <unistd.h>

#include "common/log.h"
#include "store/elect.h"
#include "store/sconn.h"

#define COMP               "store"
#define HEARTBEAT_MS       500
#define CLIENT_PEERS_MAX   1024 /* default --max-client-peers */
#define PEERS_LOG_EVERY_MS 5000
/* Default --write-timeout-ms: the master's put timeout. A put older than that may be taken over
 * and its space is reclaimed 10 min later, so a pull bounded by it never lands in space another
 * object holds; and a client whose engine keeps a pull without answering it (its export gone,
 * its room callback holding the room) cannot hold a write, and its answer, for ever. */
#define WRITE_TIMEOUT_MS 30000

/* A client engine this node pulled puts from (its libbaton listener host:port): the node's engine
 * keeps a peer for it while the client's control connections to this node live (conns), and
 * forgets it when the last one closes, so a node does not collect one peer per client it ever
 * served. At most max_client_peers are kept at once (live); beyond, the least recently used one
 * is forgotten even with its client still connected (its next put makes a fresh peer). */
typedef struct cpeer_s {
    struct cpeer_s *next;
    char host[BATON__SP_HOST_MAX + 1];
    int port;
    uint32_t conns;
    int live; /* the engine keeps a peer for it */
    uint64_t last_ms;
} cpeer_t;

typedef struct pwrite_s {
    struct pwrite_s *next;
    struct node_s *nd;
    baton__sconn_t *conn; /* NULL once the client's connection closed */
    uint32_t req_id;
    uint64_t key;
    char host[BATON__SP_HOST_MAX + 1]; /* the client engine it pulls from */
    int port;
} pwrite_t;

typedef struct node_s {
    uv_loop_t *loop;
    const char *master_host;
    int master_port;
    const char *host;
    const char *id;
    uint64_t seg_bytes;
    baton_xfer_transport_t transport;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    size_t secret_len;
    baton_xfer_engine_t *eng;
    baton_xfer_mem_t *mem;
    uint8_t *base;
    baton__slisten_t *ctrl;
    int ctrl_port;
    baton__srpc_t *master;
    baton__resolver_t *resolver; /* --registry: the leader is looked up in etcd */
    uint64_t incarnation;
    uint32_t node, seg;
    int registered, call_pending;
    uv_timer_t hb;
    uv_signal_t sigint, sigterm;
    pwrite_t *writes;
    atomic_uint_fast64_t reads, refused; /* also the progress thread's (serve_read) */
    uint64_t writes_done;
    cpeer_t *cpeers;
    uint32_t live_cpeers, max_cpeers;
    uint64_t cpeers_forgotten;
    uint64_t peers_logged, forgotten_logged, peers_log_ms; /* last logged, and when */
} node_t;

/* ---- gets: a client's offer names the range ------------------------------------------------- */

/* Runs on the engine's progress thread (baton_xfer_engine_serve): the engine writes the range
 * and sends DONE itself, so a get never waits for this process's loop. Reads only what never
 * changes after start (base, size, region). */
static int serve_read(void *data, uint64_t room_id, uint64_t len, baton_xfer_mem_t **mem_p,
                      uint64_t *off_p)
{
    node_t *nd = data;
    uint64_t off = baton__sp_room_off(room_id);
    if (len == 0 || off > nd->seg_bytes || len > nd->seg_bytes - off) {
        atomic_fetch_add(&nd->refused, 1);
        return BATON_XFER_ERKEY;
    }
    atomic_fetch_add(&nd->reads, 1);
    *mem_p = nd->mem;
    *off_p = off;
    return 0;
}

/* Offers of any other shape (not a store client's): refused. */
static void on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    node_t *nd = data;
    (void)eng;
    atomic_fetch_add(&nd->refused, 1);
    log_warn(COMP, "node_read_refused peer=%s reason=\"not a one-page read\"",
             baton_xfer_room_peer_id(room));
    baton_xfer_room_abort(room, BATON_XFER_ERKEY);
}

static void on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                           void *data)
{
    (void)eng;
    (void)room;
    (void)status;
    (void)data;
}

/* ---- client peers ------------------------------------------------------------------------ */

static void cpeer_forget(node_t *nd, cpeer_t *cp, const char *why)
{
    if (!cp->live)
        return;
    cp->live = 0;
    nd->live_cpeers--;
    nd->cpeers_forgotten++;
    log_debug(COMP, "node_client_peer_forgotten addr=%s:%d reason=%s", cp->host, cp->port, why);
    baton_xfer_forget(nd->eng, cp->host, cp->port);
}

/* Connection c's puts come from the engine at host:port. */
static void cpeer_use(node_t *nd, baton__sconn_t *c, const char *host, int port)
{
    cpeer_t *cp = nd->cpeers, *old = baton__sconn_get_data(c);
    while (cp && !(cp->port == port && strcmp(cp->host, host) == 0))
        cp = cp->next;
    if (cp == NULL && (cp = calloc(1, sizeof(*cp))) != NULL) {
        snprintf(cp->host, sizeof(cp->host), "%s", host);
        cp->port = port;
        cp->next = nd->cpeers;
        nd->cpeers = cp;
    }
    if (cp == NULL)
        return; /* untracked: kept by the engine until its end (out of memory only) */
    cp->last_ms = uv_now(nd->loop);
    if (old != cp) {
        cp->conns++;
        baton__sconn_set_data(c, cp);
        if (old && --old->conns == 0) { /* the same connection, another engine: rare */
            cpeer_forget(nd, old, "client_gone");
            for (cpeer_t **pp = &nd->cpeers; *pp; pp = &(*pp)->next)
                if (*pp == old) {
                    *pp = old->next;
                    break;
                }
            free(old);
        }
    }
    if (cp->live)
        return;
    cp->live = 1;
    if (++nd->live_cpeers <= nd->max_cpeers)
        return;
    cpeer_t *lru = NULL;
    for (cpeer_t *x = nd->cpeers; x; x = x->next)
        if (x->live && x != cp && (lru == NULL || x->last_ms < lru->last_ms))
            lru = x;
    if (lru)
        cpeer_forget(nd, lru, "bound");
}

/* A client's control connection closed: its peer goes with its last one. */
static void cpeer_release(node_t *nd, baton__sconn_t *c)
{
    cpeer_t *cp = baton__sconn_get_data(c);
    if (cp == NULL || --cp->conns > 0)
        return;
    cpeer_forget(nd, cp, "client_gone");
    for (cpeer_t **pp = &nd->cpeers; *pp; pp = &(*pp)->next)
        if (*pp == cp) {
            *pp = cp->next;
            break;
        }
    free(cp);
}

/* The engine's peer count and the client peers forgotten, logged when either changed (at most
 * every PEERS_LOG_EVERY_MS): the node's account of what it keeps per client. */
static void log_peers(node_t *nd)
{
    baton_xfer_stats_t st;
    baton_xfer_engine_stats_sized(nd->eng, &st, sizeof(st));
    uint64_t now = uv_now(nd->loop);
    if ((st.peers == nd->peers_logged && nd->cpeers_forgotten == nd->forgotten_logged) ||
        now - nd->peers_log_ms < PEERS_LOG_EVERY_MS)
        return;
    nd->peers_logged = st.peers;
    nd->forgotten_logged = nd->cpeers_forgotten;
    nd->peers_log_ms = now;
    log_info(COMP, "node_peers xfer_peers=%llu client_peers=%u client_peers_forgotten=%llu",
             (unsigned long long)st.peers, nd->live_cpeers,
             (unsigned long long)nd->cpeers_forgotten);
}

/* ---- puts: the client asks, the node pulls -------------------------------------------------- */

static void reply(baton__sconn_t *c, uint32_t req_id, int status)
{
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_REPLY;
    m.req_id = req_id;
    m.status = status;
    if (c && baton__sconn_send(c, &m) != 0)
        baton__sconn_close(c, BATON_XFER_ENOMEM);
}

static void on_pulled(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    pwrite_t *w = data;
    node_t *nd = w->nd;
    (void)room_id;
    (void)done;
    for (pwrite_t **pp = &nd->writes; *pp; pp = &(*pp)->next)
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    if (status == 0)
        nd->writes_done++;
    else
        log_warn_limited(COMP, "node_write_failed", "node_write_failed peer=%s:%d err=%s", w->host,
                         w->port, baton_store_strerror(status));
    reply(w->conn, w->req_id, status);
    free(w);
}

static void do_write(node_t *nd, baton__sconn_t *c, const baton__sp_msg_t *m)
{
    if (m->n_slices == 0 || m->host[0] == '\0' || m->xfer_port == 0) {
        reply(c, m->req_id, BATON_XFER_EINVAL);
        return;
    }
    baton_xfer_iov_t *pages = calloc(m->n_slices, sizeof(*pages));
    pwrite_t *w = calloc(1, sizeof(*w));
    if (pages == NULL || w == NULL) {
        free(pages);
        free(w);
        reply(c, m->req_id, BATON_XFER_ENOMEM);
        return;
    }
    for (uint32_t i = 0; i < m->n_slices; i++) {
        uint64_t off = m->slices[i].off, len = m->slices[i].len;
        if (len == 0 || off > nd->seg_bytes || len > nd->seg_bytes - off) {
            atomic_fetch_add(&nd->refused, 1);
            free(pages);
            free(w);
            reply(c, m->req_id, BATON_XFER_ERKEY);
            return;
        }
        pages[i] = (baton_xfer_iov_t){nd->base + off, len};
    }
    baton_xfer_offer_t offer = {m->export_key, 1, m->n_slices, pages, NULL};
    w->nd = nd;
    w->conn = c;
    w->req_id = m->req_id;
    w->key = m->export_key;
    snprintf(w->host, sizeof(w->host), "%s", m->host);
    w->port = m->xfer_port;
    cpeer_use(nd, c, m->host, m->xfer_port);
    int rc = baton_xfer_pull(nd->eng, m->host, m->xfer_port, &offer, on_pulled, w);
    free(pages);
    if (rc != 0) {
        free(w);
        reply(c, m->req_id, rc);
        return;
    }
    w->next = nd->writes;
    nd->writes = w;
}

static void on_ctrl_msg(baton__sconn_t *c, baton__sp_msg_t *m, void *data)
{
    node_t *nd = data;
    if (m->type == BATON__SP_NODE_WRITE) {
        do_write(nd, c, m);
        return;
    }
    reply(c, m->req_id, BATON_XFER_EPROTO);
    baton__sconn_close(c, BATON_XFER_EPROTO);
}

static void on_ctrl_closed(baton__sconn_t *c, int status, void *data)
{
    node_t *nd = data;
    (void)status;
    for (pwrite_t *w = nd->writes; w; w = w->next)
        if (w->conn == c)
            w->conn = NULL; /* the pull goes on; its answer has nowhere to go */
    cpeer_release(nd, c);   /* a pull still running keeps the engine's peer until it ends */
}

/* ---- the master --------------------------------------------------------------------------- */

static void send_heartbeat(node_t *nd);

static void on_master_reply(void *data, int status, baton__sp_msg_t *r)
{
    node_t *nd = data;
    nd->call_pending = 0;
    if (status != 0) {
        if (nd->registered)
            log_warn(COMP, "node_master_unreachable reason=\"%s\"", baton_store_strerror(status));
        return; /* the next heartbeat tries again (and reconnects) */
    }
    if (!nd->registered) {
        if (r->status != 0) {
            log_error(COMP, "node_register_refused reason=\"%s\"", baton_store_strerror(r->status));
            return;
        }
        nd->registered = 1;
        nd->node = r->node;
        nd->seg = r->seg;
        log_info(COMP, "node_registered id=%s node=%u segment=%u", nd->id, nd->node, nd->seg);
        return;
    }
    if (r->status == BATON_XFER_ENOTFOUND) { /* the master lost us (or restarted): again */
        log_warn(COMP, "node_unknown_to_master id=%s action=register", nd->id);
        nd->registered = 0;
    } else if (r->status == 0 && (r->node != nd->node || r->seg != nd->seg)) {
        /* a successor master restored us from its log under another index */
        log_info(COMP, "node_renumbered id=%s node=%u segment=%u", nd->id, r->node, r->seg);
        nd->node = r->node;
        nd->seg = r->seg;
    }
}

static void send_heartbeat(node_t *nd)
{
    if (nd->call_pending)
        return;
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.export_key = nd->incarnation;
    if (nd->registered) {
        m.type = BATON__SP_NODE_HEARTBEAT;
        m.node = nd->node;
    } else {
        m.type = BATON__SP_NODE_REGISTER;
        snprintf(m.id, sizeof(m.id), "%s", nd->id);
        snprintf(m.host, sizeof(m.host), "%s", nd->host);
        m.xfer_port = (uint16_t)baton_xfer_engine_listen_port(nd->eng);
        m.ctrl_port = (uint16_t)nd->ctrl_port;
        m.seg_bytes = nd->seg_bytes;
    }
    if (baton__srpc_call(nd->master, &m, HEARTBEAT_MS * 2, on_master_reply, nd) == 0)
        nd->call_pending = 1;
}

static void on_hb(uv_timer_t *t)
{
    send_heartbeat(t->data);
    log_peers(t->data);
}

static void on_signal(uv_signal_t *s, int signum)
{
    node_t *nd = s->data;
    log_info(COMP, "node_stopping signal=%d", signum);
    uv_stop(nd->loop);
}

/* ---- main --------------------------------------------------------------------------------- */

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23 /* Linux 5.14 */
#endif

/* Makes every page of the segment present before any put: a put then never pays the kernel's
 * page fault and zero-fill of fresh memfd pages (which halved put throughput here). One madvise
 * where the kernel has MADV_POPULATE_WRITE, else a write per page (the segment is all zeros). */
static void prefault(node_t *nd)
{
    uint64_t t0 = uv_hrtime();
    const char *how = "madvise";
    if (madvise(nd->base, nd->seg_bytes, MADV_POPULATE_WRITE) != 0) {
        how = "touch";
        long page = sysconf(_SC_PAGESIZE);
        for (uint64_t off = 0; off < nd->seg_bytes; off += (uint64_t)(page > 0 ? page : 4096))
            ((volatile uint8_t *)nd->base)[off] = 0;
    }
    log_info(COMP, "node_segment_prefaulted bytes=%llu ms=%llu how=%s",
             (unsigned long long)nd->seg_bytes, (unsigned long long)((uv_hrtime() - t0) / 1000000),
             how);
}

static void usage(FILE *f)
{
    fprintf(f, "usage: baton-store node --master H:P --segment-bytes N [options]\n"
               "  --master H:P                 the master's control address\n"
               "  --registry etcd://H:P,.../PFX find the leading master through etcd\n"
               "  --segment-bytes N            memory contributed (K, M, G suffixes)\n"
               "  --host H                     address clients reach this node at (127.0.0.1)\n"
               "  --port P                     control port (0: any; a TCP probe may check it)\n"
               "  --transport tcp|shm|rdma     libbaton transport (tcp)\n"
               "  --id ID                      node id (hostname-pid)\n"
               "  --max-client-peers N         client engines kept connected at once (1024)\n"
               "  --write-timeout-ms N         a put's pull into the segment fails after (30000)\n"
               "  --no-prefault                leave the segment's pages to the first puts\n"
               "  --kv-secret-file F           shared secret (control and data channels)\n");
}

int baton__parse_hostport(const char *s, char *host, size_t cap, int *port_p);

static int parse_bytes(const char *s, uint64_t *v)
{
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (end == s || *s == '-')
        return -1;
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30, end++;
    if (*end != '\0' || x == 0 || x > UINT64_MAX / mul)
        return -1;
    *v = x * mul;
    return 0;
}

int baton__node_main(int argc, char **argv);

int baton__node_main(int argc, char **argv)
{
    static const struct option lo[] = {
        {"master", required_argument, NULL, 'm'},
        {"registry", required_argument, NULL, 'r'},
        {"segment-bytes", required_argument, NULL, 's'},
        {"host", required_argument, NULL, 'H'},
        {"port", required_argument, NULL, 'o'},
        {"transport", required_argument, NULL, 't'},
        {"id", required_argument, NULL, 'i'},
        {"max-client-peers", required_argument, NULL, 'P'},
        {"write-timeout-ms", required_argument, NULL, 'W'},
        {"no-prefault", no_argument, NULL, 'F'},
        {"kv-secret-file", required_argument, NULL, 'k'},
        {"help", no_argument, NULL, 'h'},
        {NULL, 0, NULL, 0},
    };
    node_t nd;
    memset(&nd, 0, sizeof(nd));
    nd.host = "127.0.0.1";
    nd.transport = BATON_XFER_TRANSPORT_TCP;
    nd.max_cpeers = CLIENT_PEERS_MAX;
    char mhost[BATON__SP_HOST_MAX + 1] = "", idbuf[64];
    const char *secret_file = NULL, *registry = NULL;
    int ctrl_port = 0;
    int no_prefault = 0;
    uint32_t write_timeout_ms = WRITE_TIMEOUT_MS;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case 'm':
            if (baton__parse_hostport(optarg, mhost, sizeof(mhost), &nd.master_port) != 0) {
                fprintf(stderr, "baton-store node: --master wants HOST:PORT\n");
                return 2;
            }
            break;
        case 'r':
            registry = optarg;
            break;
        case 's':
            if (parse_bytes(optarg, &nd.seg_bytes) != 0) {
                fprintf(stderr, "baton-store node: bad --segment-bytes '%s'\n", optarg);
                return 2;
            }
            break;
        case 'H':
            nd.host = optarg;
            break;
        case 'o': {
            char *end;
            long p = strtol(optarg, &end, 10);
            if (*optarg == '\0' || *end != '\0' || p < 0 || p > 65535) {
                fprintf(stderr, "baton-store node: bad --port '%s'\n", optarg);
                return 2;
            }
            ctrl_port = (int)p;
            break;
        }
        case 't':
            if (baton_xfer_transport_parse(optarg, &nd.transport) != 0) {
                fprintf(stderr, "baton-store node: unknown transport '%s'\n", optarg);
                return 2;
            }
            break;
        case 'i':
            nd.id = optarg;
            break;
        case 'F':
            no_prefault = 1;
            break;
        case 'P': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*end != '\0' || v == 0 || v > 1000000) {
                fprintf(stderr, "baton-store node: bad --max-client-peers '%s'\n", optarg);
                return 2;
            }
            nd.max_cpeers = (uint32_t)v;
            break;
        }
        case 'W': {
            char *end;
            unsigned long v = strtoul(optarg, &end, 10);
            if (*optarg == '\0' || *optarg == '-' || *end != '\0' || v == 0 || v > 3600000) {
                fprintf(stderr, "baton-store node: bad --write-timeout-ms '%s'\n", optarg);
                return 2;
            }
            write_timeout_ms = (uint32_t)v;
            break;
        }
        case 'k':
            secret_file = optarg;
            break;
        case 'h':
            usage(stdout);
            return 0;
        default:
            usage(stderr);
            return 2;
        }
    }
    if (registry && mhost[0] == '\0') {
        snprintf(mhost, sizeof(mhost), "0.0.0.0"); /* looked up before each connection */
        nd.master_port = 0;
    }
    if (optind < argc || mhost[0] == '\0' || nd.seg_bytes == 0) {
        usage(stderr);
        return 2;
    }
    if (secret_file &&
        baton__store_read_secret(secret_file, nd.secret, sizeof(nd.secret), &nd.secret_len) != 0)
        return 2;
    if (nd.id == NULL) {
        char hn[40] = "node";
        gethostname(hn, sizeof(hn) - 1);
        snprintf(idbuf, sizeof(idbuf), "%s-%d", hn, (int)getpid());
        nd.id = idbuf;
    }
    if (getrandom(&nd.incarnation, sizeof(nd.incarnation), 0) != sizeof(nd.incarnation))
        return 2;
    nd.master_host = mhost;
    nd.loop = uv_default_loop();

    baton_xfer_config_t xc;
    baton_xfer_config_init(&xc);
    xc.engine_id = nd.id;
    xc.listen_host = nd.host;
    xc.listen_port = 0;
    xc.transports[0] = nd.transport;
    xc.n_transports = 1;
    /* The node's engine offers rooms only to pull puts (gets are served): every write is bounded;
     * a timed-out pull is aborted and reported once no byte of it can still land. */
    xc.room_timeout_ms = write_timeout_ms;
    if (nd.secret_len) {
        xc.secret = nd.secret;
        xc.secret_len = nd.secret_len;
    }
    baton_xfer_callbacks_t cbs = {on_room, on_room_closed, NULL, &nd};
    int rc = baton_xfer_engine_create(nd.loop, &xc, &cbs, &nd.eng);
    if (rc == 0)
        rc = baton_xfer_mem_alloc(nd.eng, nd.seg_bytes, &nd.mem);
    if (rc != 0) {
        log_error(COMP, "node_start_failed reason=\"%s\"", baton_store_strerror(rc));
        return 2;
    }
    nd.base = baton_xfer_mem_addr(nd.mem);
    if (!no_prefault)
        prefault(&nd);
    rc = baton_xfer_engine_serve(nd.eng, serve_read, &nd);
    if (rc != 0) {
        log_error(COMP, "node_start_failed reason=\"%s\"", baton_store_strerror(rc));
        return 2;
    }

    baton__sconn_opts_t so = {0};
    so.loop = nd.loop;
    so.secret = nd.secret_len ? nd.secret : NULL;
    so.secret_len = nd.secret_len;
    so.id = nd.id;
    so.max_body = BATON__SP_REQ_MAX;
    so.on_msg = on_ctrl_msg;
    so.on_close = on_ctrl_closed;
    so.data = &nd;
    rc = baton__slisten_start(&so, nd.host, ctrl_port, &nd.ctrl_port, &nd.ctrl);
    if (rc == 0) {
        baton__sconn_opts_t mo = so;
        mo.on_msg = NULL;
        mo.on_close = NULL;
        mo.max_body = BATON__SP_REPLY_MAX;
        rc = baton__srpc_create(&mo, nd.master_host, nd.master_port, BATON_STORE_ENOLEADER,
                                &nd.master);
        if (rc == 0 && registry) {
            rc = baton__resolver_create(nd.loop, registry, &nd.resolver);
            if (rc == 0)
                baton__srpc_set_resolver(nd.master, nd.resolver);
        }
    }
    if (rc != 0) {
        log_error(COMP, "node_start_failed reason=\"%s\"", baton_store_strerror(rc));
        return 2;
    }
    log_info(COMP, "node_listening addr=%s:%d", nd.host, nd.ctrl_port);
    log_info(COMP,
             "node_started id=%s host=%s xfer_port=%d ctrl_port=%d segment_bytes=%llu "
             "transport=%s write_timeout_ms=%u",
             nd.id, nd.host, baton_xfer_engine_listen_port(nd.eng), nd.ctrl_port,
             (unsigned long long)nd.seg_bytes, baton_xfer_transport_name(nd.transport),
             (unsigned)write_timeout_ms);
    uv_timer_init(nd.loop, &nd.hb);
    nd.hb.data = &nd;
    uv_timer_start(&nd.hb, on_hb, 0, HEARTBEAT_MS);
    uv_signal_init(nd.loop, &nd.sigint);
    uv_signal_init(nd.loop, &nd.sigterm);
    nd.sigint.data = nd.sigterm.data = &nd;
    uv_signal_start(&nd.sigint, on_signal, SIGINT);
    uv_signal_start(&nd.sigterm, on_signal, SIGTERM);
    uv_run(nd.loop, UV_RUN_DEFAULT);
    return 0;
}
