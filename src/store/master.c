/* store/master.c — `baton-store master`: options, the control listener and its requests (puts,
 * gets, exists, removes, stat, node registration and heartbeats), node liveness and the tick. */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "store/master.h"

#define COMP "store"

/* ---- replies ------------------------------------------------------------------------------ */

/* A reply under construction: items, the slice table, the nodes the slices name. */
typedef struct {
    baton__sp_msg_t m;
    size_t cap_slices;
    uint8_t *node_seen; /* by node index */
} reply_t;

static int reply_init(reply_t *r, const baton__master_t *ms, const baton__sp_msg_t *req)
{
    memset(r, 0, sizeof(*r));
    r->m.type = BATON__SP_REPLY;
    r->m.req_id = req->req_id;
    if (req->n_items) {
        r->m.ritems = calloc(req->n_items, sizeof(*r->m.ritems));
        if (r->m.ritems == NULL)
            return BATON_XFER_ENOMEM;
    }
    r->node_seen = calloc(ms->n_nodes + 1, 1);
    return r->node_seen ? 0 : BATON_XFER_ENOMEM;
}

static int reply_add_view(reply_t *r, const baton__master_t *ms, baton__sp_ritem_t *it,
                          const baton__obj_view_t *v)
{
    size_t n = (size_t)v->n_replicas * v->n_slices;
    if (r->m.n_slices + n > r->cap_slices) {
        size_t cap = (r->cap_slices ? r->cap_slices * 2 : 64) + n;
        baton__slice_t *s = realloc(r->m.slices, cap * sizeof(*s));
        if (s == NULL)
            return BATON_XFER_ENOMEM;
        r->m.slices = s;
        r->cap_slices = cap;
    }
    it->first_slice = r->m.n_slices;
    it->n_replicas = (uint8_t)v->n_replicas;
    it->n_slices = (uint8_t)v->n_slices;
    memcpy(&r->m.slices[r->m.n_slices], v->slices, n * sizeof(*v->slices));
    r->m.n_slices += (uint32_t)n;
    for (size_t i = 0; i < n; i++) {
        uint32_t node = v->slices[i].node;
        if (node >= ms->n_nodes || r->node_seen[node])
            continue;
        r->node_seen[node] = 1;
        baton__sp_node_t *nodes = realloc(r->m.nodes, (r->m.n_nodes + 1) * sizeof(*nodes));
        if (nodes == NULL)
            return BATON_XFER_ENOMEM;
        r->m.nodes = nodes;
        baton__sp_node_t *x = &nodes[r->m.n_nodes++];
        memset(x, 0, sizeof(*x));
        x->node = node;
        snprintf(x->host, sizeof(x->host), "%s", ms->nodes[node].host);
        x->xfer_port = ms->nodes[node].xfer_port;
        x->ctrl_port = ms->nodes[node].ctrl_port;
    }
    return 0;
}

static void reply_send(baton__sconn_t *c, reply_t *r)
{
    if (baton__sconn_send(c, &r->m) != 0)
        baton__sconn_close(c, BATON_XFER_ENOMEM);
    free(r->node_seen);
    r->m.text = NULL; /* never owned here */
    r->m.text_len = 0;
    baton__sp_msg_free(&r->m);
}

static void reply_status(baton__sconn_t *c, const baton__sp_msg_t *req, int status)
{
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_REPLY;
    m.req_id = req->req_id;
    m.status = status;
    if (baton__sconn_send(c, &m) != 0)
        baton__sconn_close(c, BATON_XFER_ENOMEM);
}

/* ---- requests ------------------------------------------------------------------------------ */

/* GET, and EXISTS with BATON__SP_F_LOCATE: the lease, the checksum and the placement. */
static int locate(baton__master_t *ms, reply_t *r, const baton__sp_msg_t *req,
                  const baton__sp_item_t *it, baton__sp_ritem_t *out, uint64_t now)
{
    baton__obj_view_t v;
    int rc = baton__meta_get(ms->meta, req->ns, it->key, now, &v);
    if (rc == 0) {
        out->len = v.len;
        out->crc = v.crc;
        out->lease_ms = (uint32_t)v.lease_ms;
        out->n_replicas = (uint8_t)v.n_replicas;
        rc = reply_add_view(r, ms, out, &v);
    }
    return rc;
}

static void do_objects(baton__master_t *ms, baton__sconn_t *c, const baton__sp_msg_t *req)
{
    uint64_t now = baton_now_ms();
    reply_t r;
    if (reply_init(&r, ms, req) != 0) {
        free(r.node_seen);
        free(r.m.ritems);
        reply_status(c, req, BATON_XFER_ENOMEM);
        return;
    }
    r.m.n_ritems = req->n_items;
    int prefix_open = 1;
    for (uint32_t i = 0; i < req->n_items; i++) {
        const baton__sp_item_t *it = &req->items[i];
        baton__sp_ritem_t *out = &r.m.ritems[i];
        baton__obj_view_t v;
        int rc = 0;
        switch (req->type) {
        case BATON__SP_PUT_START: {
            baton__put_req_t pr = {req->ns, it->key, it->x, it->y, req->replicas, req->flags};
            rc = baton__meta_put_start(ms->meta, &pr, now, &v);
            if (rc == 0) {
                out->put_id = v.put_id;
                out->len = v.len;
                rc = reply_add_view(&r, ms, out, &v);
            }
            break;
        }
        case BATON__SP_PUT_COMMIT:
            rc = baton__meta_put_commit(ms->meta, req->ns, it->key, it->x, now);
            break;
        case BATON__SP_PUT_REVOKE:
            rc = baton__meta_put_revoke(ms->meta, req->ns, it->key, it->x, now);
            break;
        case BATON__SP_GET:
            rc = locate(ms, &r, req, it, out, now);
            break;
        case BATON__SP_EXISTS: {
            /* a located key, or a missing one; anything else is answered as a plain exists */
            if ((req->flags & BATON__SP_F_LOCATE) &&
                ((rc = locate(ms, &r, req, it, out, now)) == 0 || rc == BATON_XFER_ENOTFOUND))
                break;
            uint32_t reps = 0;
            rc = baton__meta_exists(ms->meta, req->ns, it->key, now, 1, &out->len, &reps)
                     ? 0
                     : BATON_XFER_ENOTFOUND;
            out->n_replicas = (uint8_t)reps;
            out->lease_ms = rc == 0 ? (uint32_t)ms->opts.lease_ttl_ms : 0;
            break;
        }
        case BATON__SP_REMOVE:
            rc = baton__meta_remove(ms->meta, req->ns, it->key, now);
            break;
        default:
            rc = BATON_XFER_EPROTO;
        }
        out->status = rc;
        if (rc != 0)
            prefix_open = 0;
        else if (prefix_open)
            r.m.prefix++;
    }
    reply_send(c, &r);
}

static void do_stat(baton__master_t *ms, baton__sconn_t *c, const baton__sp_msg_t *req)
{
    baton__meta_stats_t st;
    baton__meta_stats(ms->meta, &st);
    baton_buf_t b = BATON_BUF_INIT;
    baton_buf_printf(&b,
                     "{\"capacity\":%llu,\"used\":%llu,\"objects\":%llu,\"putting\":%llu,"
                     "\"nodes\":%u,\"segments\":%u,\"leader\":true,\"evictions\":%llu,"
                     "\"node_list\":[",
                     (unsigned long long)st.capacity, (unsigned long long)st.used,
                     (unsigned long long)st.objects, (unsigned long long)st.putting, st.nodes,
                     st.segments, (unsigned long long)st.evictions);
    int first = 1;
    for (size_t i = 0; i < ms->n_nodes; i++) {
        const baton__mnode_t *n = &ms->nodes[i];
        if (!n->alive)
            continue;
        const char *id = baton__meta_node_id(ms->meta, (uint32_t)i);
        baton_buf_printf(&b, "%s{\"id\":", first ? "" : ",");
        baton_buf_append_json_string(&b, id, strlen(id));
        uint64_t cap = baton__meta_segment_capacity(ms->meta, n->seg);
        baton_buf_printf(&b, ",\"capacity\":%llu,\"used\":%llu}", (unsigned long long)cap,
                         (unsigned long long)(cap - baton__meta_segment_free(ms->meta, n->seg)));
        first = 0;
    }
    baton_buf_append_str(&b, "]}");
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_REPLY;
    m.req_id = req->req_id;
    m.text = b.data;
    m.text_len = (uint32_t)b.len;
    if (baton__sconn_send(c, &m) != 0)
        baton__sconn_close(c, BATON_XFER_ENOMEM);
    baton_buf_free(&b);
}

static int grow_nodes(baton__master_t *ms, uint32_t node)
{
    if (node < ms->n_nodes)
        return 0;
    baton__mnode_t *n = realloc(ms->nodes, (node + 1) * sizeof(*n));
    if (n == NULL)
        return BATON_XFER_ENOMEM;
    memset(&n[ms->n_nodes], 0, (node + 1 - ms->n_nodes) * sizeof(*n));
    ms->nodes = n;
    ms->n_nodes = node + 1;
    return 0;
}

/* A node (re)registers. A new incarnation of a known id is a restarted node: what the master
 * knew of its memory is gone (lost), and it gets a fresh segment. */
static void do_register(baton__master_t *ms, baton__sconn_t *c, const baton__sp_msg_t *req)
{
    uint64_t now = baton_now_ms();
    uint32_t node;
    int rc = req->id[0] && req->seg_bytes ? 0 : BATON_XFER_EINVAL;
    if (rc == 0)
        rc = baton__meta_node_add(ms->meta, req->id, &node);
    if (rc == 0)
        rc = grow_nodes(ms, node);
    if (rc != 0) {
        reply_status(c, req, rc);
        return;
    }
    baton__mnode_t *n = &ms->nodes[node];
    if (!(n->alive && n->incarnation == req->export_key)) {
        if (n->alive)
            baton__meta_node_lost(ms->meta, node, now);
        baton__meta_node_add(ms->meta, req->id, &node);
        rc = baton__meta_segment_add(ms->meta, node, req->seg_bytes, &n->seg);
        if (rc != 0) {
            reply_status(c, req, rc);
            return;
        }
        n->alive = 1;
        n->incarnation = req->export_key;
        snprintf(n->host, sizeof(n->host), "%s",
                 req->host[0] ? req->host : baton__sconn_peer_ip(c));
        n->xfer_port = req->xfer_port;
        n->ctrl_port = req->ctrl_port;
        log_info(COMP, "node_registered id=%s node=%u addr=%s:%u segment_bytes=%llu", req->id, node,
                 n->host, n->xfer_port, (unsigned long long)req->seg_bytes);
    }
    n->last_seen_ms = now;
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_REPLY;
    m.req_id = req->req_id;
    m.node = node;
    m.seg = n->seg;
    if (baton__sconn_send(c, &m) != 0)
        baton__sconn_close(c, BATON_XFER_ENOMEM);
}

static void do_heartbeat(baton__master_t *ms, baton__sconn_t *c, const baton__sp_msg_t *req)
{
    if (req->node >= ms->n_nodes || !ms->nodes[req->node].alive ||
        ms->nodes[req->node].incarnation != req->export_key) {
        reply_status(c, req, BATON_XFER_ENOTFOUND); /* the node registers again */
        return;
    }
    ms->nodes[req->node].last_seen_ms = baton_now_ms();
    reply_status(c, req, 0);
}

static void on_ctrl_msg(baton__sconn_t *c, baton__sp_msg_t *m, void *data)
{
    baton__master_t *ms = data;
    ms->requests++;
    if (!ms->leader) { /* a standby: clients and nodes look the leader up again */
        reply_status(c, m, BATON_STORE_ENOLEADER);
        return;
    }
    switch (m->type) {
    case BATON__SP_PUT_START:
    case BATON__SP_PUT_COMMIT:
    case BATON__SP_PUT_REVOKE:
    case BATON__SP_GET:
    case BATON__SP_EXISTS:
    case BATON__SP_REMOVE:
        if (m->type == BATON__SP_PUT_START &&
            (m->replicas == 0 || m->replicas > BATON_STORE_REPLICAS_MAX)) {
            reply_status(c, m, BATON_XFER_EINVAL);
            return;
        }
        do_objects(ms, c, m);
        return;
    case BATON__SP_STAT:
        do_stat(ms, c, m);
        return;
    case BATON__SP_NODE_REGISTER:
        do_register(ms, c, m);
        return;
    case BATON__SP_NODE_HEARTBEAT:
        do_heartbeat(ms, c, m);
        return;
    default:
        ms->refused_requests++;
        reply_status(c, m, BATON_XFER_EPROTO);
        baton__sconn_close(c, BATON_XFER_EPROTO);
    }
}

/* ---- liveness and the tick ----------------------------------------------------------------- */

static void on_tick(uv_timer_t *t)
{
    baton__master_t *ms = t->data;
    uint64_t now = baton_now_ms();
    /* A tick far later than due means this process did not run (stopped, starved): the nodes'
     * silence is then ours, not theirs. They get a fresh node timeout instead of being lost. */
    if (ms->last_tick_ms && now - ms->last_tick_ms > ms->opts.node_timeout_ms / 2) {
        log_warn(COMP, "master_stalled for_ms=%llu action=\"node timeouts restarted\"",
                 (unsigned long long)(now - ms->last_tick_ms));
        for (size_t i = 0; i < ms->n_nodes; i++)
            ms->nodes[i].last_seen_ms = now;
    }
    ms->last_tick_ms = now;
    for (size_t i = 0; i < ms->n_nodes; i++) {
        baton__mnode_t *n = &ms->nodes[i];
        if (n->alive && now - n->last_seen_ms > ms->opts.node_timeout_ms) {
            size_t lost = baton__meta_node_lost(ms->meta, (uint32_t)i, now);
            n->alive = 0;
            log_warn(COMP, "node_lost id=%s node=%zu silent_ms=%llu objects_lost=%zu",
                     baton__meta_node_id(ms->meta, (uint32_t)i), i,
                     (unsigned long long)(now - n->last_seen_ms), lost);
        }
    }
    baton__meta_tick(ms->meta, now);
}

/* Leadership through etcd. A master that gains it starts from empty metadata (nodes register
 * again when their heartbeats are refused); one that loses it exits, so that it can never serve
 * beside the new leader: its supervisor starts it again as a standby. */
static void on_leadership(void *data, int leader)
{
    baton__master_t *ms = data;
    if (leader) {
        ms->leader = 1;
        log_info(COMP, "master_leading");
        return;
    }
    ms->leader = 0;
    log_error(COMP, "master_leadership_lost action=exit");
    ms->exit_code = 1;
    uv_stop(ms->loop);
}

static void on_signal(uv_signal_t *s, int signum)
{
    baton__master_t *ms = s->data;
    log_info(COMP, "master_stopping signal=%d", signum);
    uv_stop(ms->loop);
}

/* ---- options ------------------------------------------------------------------------------- */

static void usage(FILE *f)
{
    fprintf(f, "usage: baton-store master --host H --port P --http-port N [options]\n"
               "  --host H                      address of the control and HTTP listeners "
               "(127.0.0.1)\n"
               "  --port P                      control port (clients and nodes)\n"
               "  --http-port N                 HTTP API: /health, /metrics, /batch_query_keys\n"
               "  --registry etcd://H:P,.../PFX master election through etcd (leader + standbys)\n"
               "  --lease-ttl-ms N              lease granted by get / exists (10000)\n"
               "  --eviction-high-watermark F   evict above this share of capacity (0.90)\n"
               "  --eviction-ratio F            share of capacity freed per eviction (0.05)\n"
               "  --node-timeout-ms N           a node silent this long is lost (3000)\n"
               "  --kv-secret-file F            shared secret of clients and nodes (HMAC)\n"
               "  --namespace-quota NS=BYTES    bytes namespace NS may hold (K/M/G; repeatable)\n"
               "  --admin-token-file F          bearer token required by /metrics and "
               "/batch_query_keys\n");
}

static int parse_u64(const char *s, uint64_t *v)
{
    char *end;
    unsigned long long x = strtoull(s, &end, 10);
    if (*s == '\0' || *end != '\0' || *s == '-')
        return -1;
    *v = x;
    return 0;
}

static int parse_share(const char *s, double *v)
{
    char *end;
    double x = strtod(s, &end);
    if (*s == '\0' || *end != '\0' || !(x > 0 && x <= 1))
        return -1;
    *v = x;
    return 0;
}

static int parse_quota(const char *s, baton__master_opts_t *o)
{
    const char *eq = strchr(s, '=');
    if (eq == NULL || eq == s || (size_t)(eq - s) > BATON_STORE_NAMESPACE_MAX || o->n_quotas >= 16)
        return -1;
    char *end;
    unsigned long long v = strtoull(eq + 1, &end, 10);
    uint64_t mul = 1;
    if (*end == 'K' || *end == 'k')
        mul = 1ull << 10, end++;
    else if (*end == 'M' || *end == 'm')
        mul = 1ull << 20, end++;
    else if (*end == 'G' || *end == 'g')
        mul = 1ull << 30, end++;
    if (end == eq + 1 || *end != '\0' || eq[1] == '-' || v == 0 || v > UINT64_MAX / mul)
        return -1;
    memcpy(o->quota_ns[o->n_quotas], s, (size_t)(eq - s));
    o->quota_ns[o->n_quotas][eq - s] = '\0';
    o->quota_bytes[o->n_quotas++] = v * mul;
    return 0;
}

static int parse_opts(int argc, char **argv, baton__master_opts_t *o)
{
    enum {
        O_HOST = 1,
        O_PORT,
        O_HTTP,
        O_REG,
        O_LEASE,
        O_HWM,
        O_RATIO,
        O_NODE_TO,
        O_SECRET,
        O_TOKEN,
        O_QUOTA,
        O_HELP
    };
    static const struct option lo[] = {
        {"host", required_argument, NULL, O_HOST},
        {"port", required_argument, NULL, O_PORT},
        {"http-port", required_argument, NULL, O_HTTP},
        {"registry", required_argument, NULL, O_REG},
        {"lease-ttl-ms", required_argument, NULL, O_LEASE},
        {"eviction-high-watermark", required_argument, NULL, O_HWM},
        {"eviction-ratio", required_argument, NULL, O_RATIO},
        {"node-timeout-ms", required_argument, NULL, O_NODE_TO},
        {"kv-secret-file", required_argument, NULL, O_SECRET},
        {"admin-token-file", required_argument, NULL, O_TOKEN},
        {"namespace-quota", required_argument, NULL, O_QUOTA},
        {"help", no_argument, NULL, O_HELP},
        {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof(*o));
    o->host = "127.0.0.1";
    o->port = -1;
    o->http_port = -1;
    o->lease_ttl_ms = 10000;
    o->high_watermark = 0.90;
    o->evict_ratio = 0.05;
    o->node_timeout_ms = 3000;
    uint64_t v;
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "", lo, NULL)) != -1) {
        switch (c) {
        case O_HOST:
            o->host = optarg;
            break;
        case O_PORT:
        case O_HTTP:
            if (parse_u64(optarg, &v) != 0 || v > 65535) {
                fprintf(stderr, "baton-store master: bad port '%s'\n", optarg);
                return -1;
            }
            *(c == O_PORT ? &o->port : &o->http_port) = (int)v;
            break;
        case O_REG:
            o->registry = optarg;
            break;
        case O_LEASE:
        case O_NODE_TO:
            if (parse_u64(optarg, &v) != 0 || v == 0) {
                fprintf(stderr, "baton-store master: bad duration '%s'\n", optarg);
                return -1;
            }
            *(c == O_LEASE ? &o->lease_ttl_ms : &o->node_timeout_ms) = v;
            break;
        case O_HWM:
        case O_RATIO:
            if (parse_share(optarg, c == O_HWM ? &o->high_watermark : &o->evict_ratio) != 0) {
                fprintf(stderr, "baton-store master: '%s' is not a share in (0, 1]\n", optarg);
                return -1;
            }
            break;
        case O_SECRET:
            o->secret_file = optarg;
            break;
        case O_QUOTA:
            if (parse_quota(optarg, o) != 0) {
                fprintf(stderr, "baton-store master: --namespace-quota wants NS=BYTES[K|M|G] "
                                "(at most 16)\n");
                return -1;
            }
            break;
        case O_TOKEN:
            o->admin_token_file = optarg;
            break;
        case O_HELP:
            usage(stdout);
            exit(0);
        default:
            usage(stderr);
            return -1;
        }
    }
    if (optind < argc || o->port < 0 || o->http_port < 0) {
        usage(stderr);
        return -1;
    }
    return 0;
}

static int read_token(const char *path, char *out, size_t cap)
{
    FILE *f = fopen(path, "r");
    if (f == NULL)
        return -1;
    size_t n = fread(out, 1, cap - 1, f);
    fclose(f);
    out[n] = '\0';
    while (n > 0 && (out[n - 1] == '\n' || out[n - 1] == '\r'))
        out[--n] = '\0';
    return n > 0 ? 0 : -1;
}

int baton__master_main(int argc, char **argv)
{
    baton__master_t ms;
    memset(&ms, 0, sizeof(ms));
    if (parse_opts(argc, argv, &ms.opts) != 0)
        return 2;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    size_t secret_len = 0;
    if (ms.opts.secret_file &&
        baton__store_read_secret(ms.opts.secret_file, secret, sizeof(secret), &secret_len) != 0)
        return 2;
    if (ms.opts.admin_token_file &&
        read_token(ms.opts.admin_token_file, ms.admin_token, sizeof(ms.admin_token)) != 0) {
        fprintf(stderr, "baton-store master: cannot read a token from %s\n",
                ms.opts.admin_token_file);
        return 2;
    }
    if (!ms.opts.secret_file)
        log_warn(COMP, "master_unauthenticated hint=\"set --kv-secret-file\"");
    baton__meta_config_t mc;
    baton__meta_config_init(&mc);
    mc.lease_ttl_ms = ms.opts.lease_ttl_ms;
    mc.high_watermark = ms.opts.high_watermark;
    mc.evict_ratio = ms.opts.evict_ratio;
    mc.seed = uv_hrtime();
    if (baton__meta_create(&mc, &ms.meta) != 0)
        return 2;
    for (int i = 0; i < ms.opts.n_quotas; i++)
        if (baton__meta_ns_quota(ms.meta, ms.opts.quota_ns[i], ms.opts.quota_bytes[i]) != 0)
            return 2;
    ms.loop = uv_default_loop();
    baton__sconn_opts_t so = {0};
    so.loop = ms.loop;
    so.secret = secret_len ? secret : NULL;
    so.secret_len = secret_len;
    so.id = "baton-store-master";
    so.max_body = BATON__SP_REQ_MAX;
    so.on_msg = on_ctrl_msg;
    so.data = &ms;
    int port = 0;
    int rc = baton__slisten_start(&so, ms.opts.host, ms.opts.port, &port, &ms.ctrl);
    if (rc != 0) {
        log_error(COMP, "master_listen_failed addr=%s:%d reason=\"%s\"", ms.opts.host, ms.opts.port,
                  baton_store_strerror(rc));
        return 2;
    }
    rc = baton__master_http_start(&ms);
    if (rc != 0) {
        log_error(COMP, "master_http_failed addr=%s:%d reason=\"%s\"", ms.opts.host,
                  ms.opts.http_port, baton_store_strerror(rc));
        return 2;
    }
    log_info(COMP, "master_listening addr=%s:%d lease_ttl_ms=%llu node_timeout_ms=%llu",
             ms.opts.host, port, (unsigned long long)ms.opts.lease_ttl_ms,
             (unsigned long long)ms.opts.node_timeout_ms);
    log_info(COMP, "http_listening addr=%s:%d", ms.opts.host, baton_http_server_port(ms.http));
    ms.leader = ms.opts.registry == NULL;
    if (ms.opts.registry) {
        char value[128];
        snprintf(value, sizeof(value), "%s:%d", ms.opts.host, port);
        rc = baton__elect_start(ms.loop, ms.opts.registry, value, 2, on_leadership, &ms, &ms.elect);
        if (rc != 0) {
            log_error(COMP, "master_registry_failed reason=\"%s\"", baton_store_strerror(rc));
            return 2;
        }
        log_info(COMP, "master_standby registry=%s", ms.opts.registry);
    }
    uv_timer_init(ms.loop, &ms.tick);
    ms.tick.data = &ms;
    uv_timer_start(&ms.tick, on_tick, 250, 250);
    uv_signal_init(ms.loop, &ms.sigint);
    uv_signal_init(ms.loop, &ms.sigterm);
    ms.sigint.data = ms.sigterm.data = &ms;
    uv_signal_start(&ms.sigint, on_signal, SIGINT);
    uv_signal_start(&ms.sigterm, on_signal, SIGTERM);
    uv_run(ms.loop, UV_RUN_DEFAULT);
    baton__meta_destroy(ms.meta);
    free(ms.nodes);
    return ms.exit_code;
}
