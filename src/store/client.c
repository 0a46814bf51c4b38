/* store/client.c — the store client (include/baton/store.h): batch put (PUT_START, nodes pull the
 * slices from the caller's registered buffers, COMMIT / REVOKE), batch get (offers straight into
 * the caller's buffers, CRC32C and lease checked), exists and remove. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "common/log.h"
#include "store/sconn.h"

#define COMP "store"

int baton__parse_hostport(const char *s, char *host, size_t cap, int *port_p);

#include "store/client_int.h"
#include "store/elect.h"

/* "host:port" (the last colon splits): also the store programs' parser, defined here so the
 * client library stands alone for other programs that link it (baton-worker). */
int baton__parse_hostport(const char *s, char *host, size_t cap, int *port_p)
{
    const char *colon = strrchr(s, ':');
    if (colon == NULL || colon == s || (size_t)(colon - s) >= cap)
        return -1;
    char *end;
    long p = strtol(colon + 1, &end, 10);
    if (*end != '\0' || p <= 0 || p > 65535)
        return -1;
    memcpy(host, s, (size_t)(colon - s));
    host[colon - s] = '\0';
    *port_p = (int)p;
    return 0;
}

/* ---- life time ------------------------------------------------------------------------------ */

void baton_store_config_init(baton_store_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->size = sizeof(*cfg);
    cfg->request_timeout_ms = 5000;
    cfg->reconnect_min_ms = 50;
    cfg->reconnect_max_ms = 2000;
    cfg->location_cache = 4096;
    cfg->inline_max = BATON__SP_INLINE_DEFAULT;
}

void baton_store_put_opts_init(baton_store_put_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->size = sizeof(*opts);
    opts->replicas = 1;
}

int baton_store_client_create(uv_loop_t *loop, const baton_store_config_t *cfg_in,
                              baton_store_client_t **client_p)
{
    baton_store_config_t cfg;
    baton_store_config_init(&cfg);
    if (cfg_in == NULL || cfg_in->size < offsetof(baton_store_config_t, host))
        return BATON_XFER_EINVAL;
    memcpy(&cfg, cfg_in, cfg_in->size < sizeof(cfg) ? cfg_in->size : sizeof(cfg));
    if (cfg.master == NULL || cfg.engine == NULL ||
        (cfg.secret &&
         (cfg.secret_len < BATON_XFER_SECRET_MIN || cfg.secret_len > BATON_XFER_SECRET_MAX)))
        return BATON_XFER_EINVAL;
    int etcd = strncmp(cfg.master, "etcd://", 7) == 0;
    baton_store_client_t *cl = calloc(1, sizeof(*cl));
    if (cl == NULL)
        return BATON_XFER_ENOMEM;
    char mhost[BATON__SP_HOST_MAX + 1] = "0.0.0.0";
    int mport = 0;
    if ((!etcd && baton__parse_hostport(cfg.master, mhost, sizeof(mhost), &mport) != 0) ||
        (cfg.ns && strlen(cfg.ns) > BATON_STORE_NAMESPACE_MAX) ||
        (cfg.host && strlen(cfg.host) > BATON__SP_HOST_MAX) ||
        cfg.inline_max > BATON__SP_INLINE_MAX) {
        free(cl);
        return BATON_XFER_EINVAL;
    }
    cl->eng = cfg.engine;
    if ((loop == NULL) != (baton_xfer_engine_fd(cfg.engine) >= 0)) {
        free(cl);
        return BATON_XFER_EINVAL; /* the client adopts the engine's mode */
    }
    if (loop == NULL) {
        int rc = baton__own_start(cl, &loop);
        if (rc != 0) {
            free(cl);
            return rc;
        }
    }
    cl->loop = loop;
    snprintf(cl->ns, sizeof(cl->ns), "%s", cfg.ns ? cfg.ns : "default");
    snprintf(cl->host, sizeof(cl->host), "%s", cfg.host ? cfg.host : "127.0.0.1");
    snprintf(cl->id, sizeof(cl->id), "%s", baton_xfer_engine_id(cfg.engine));
    cl->timeout_ms = cfg.request_timeout_ms ? cfg.request_timeout_ms : 5000;
    cl->inline_max = cfg.inline_max;
    uv_mutex_init(&cl->loc_lock);
    uv_mutex_init(&cl->inline_lock);
    cl->so.loop = loop;
    if (cfg.secret) {
        memcpy(cl->secret, cfg.secret, cfg.secret_len);
        cl->so.secret = cl->secret;
        cl->so.secret_len = cfg.secret_len;
    }
    cl->so.id = cl->id;
    cl->so.max_body = BATON__SP_REPLY_MAX;
    if (getrandom(&cl->key_seq, sizeof(cl->key_seq), 0) != sizeof(cl->key_seq))
        cl->key_seq = uv_hrtime();
    int rc = baton__loc_init(cl, cfg.location_cache);
    if (rc == 0 && etcd)
        rc = baton__resolver_create(loop, cfg.master, &cl->resolver);
    if (rc == 0)
        rc = baton__srpc_create(&cl->so, mhost, mport, BATON_STORE_ENOLEADER, &cl->master);
    if (rc == 0 && cl->resolver)
        baton__srpc_set_resolver(cl->master, cl->resolver);
    if (rc == 0)
        baton__srpc_mirror_epoch(cl->master, &cl->master_epoch);
    if (rc == 0 && cl->own)
        rc = baton__own_run(cl);
    if (rc != 0) {
        if (cl->master) {
            baton__srpc_mirror_epoch(cl->master, NULL); /* cl goes before the srpc closes */
            baton__srpc_destroy(cl->master);
        }
        if (cl->resolver)
            baton__resolver_close(cl->resolver);
        if (cl->own)
            baton__own_abort(cl);
        baton__loc_free(cl);
        uv_mutex_destroy(&cl->loc_lock);
        uv_mutex_destroy(&cl->inline_lock);
        free(cl);
        return rc;
    }
    *client_p = cl;
    return 0;
}

void baton__client_free(baton_store_client_t *cl)
{
    baton__loc_free(cl);
    baton__inline_free(cl);
    uv_mutex_destroy(&cl->loc_lock);
    uv_mutex_destroy(&cl->inline_lock);
    free(cl->nodes);
    free(cl);
}

static void on_close_poll(uv_timer_t *t)
{
    baton_store_client_t *cl = t->data;
    if (cl->ops > 0)
        return; /* transfers still fencing: their callbacks come first */
    uv_timer_stop(t);
    baton__later_close(cl);
    if (cl->close_cb)
        cl->close_cb(cl, cl->close_data);
    uv_close((uv_handle_t *)t, NULL);
    if (cl->own == NULL)        /* own-progress: freed by the host's dispatch, after its close_cb */
        baton__client_free(cl); /* the timer is not used after uv_close: no callback was given */
}

void baton_store_client_destroy(baton_store_client_t *cl, baton_store_close_cb close_cb, void *data)
{
    if (cl->own && !baton__own_here(cl)) {
        (void)baton__own_destroy(cl, close_cb, data); /* fails only for a second destroy */
        return;
    }
    cl->closing = 1;
    cl->close_cb = close_cb;
    cl->close_data = data;
    baton__srpc_mirror_epoch(cl->master, NULL); /* the srpc may close after cl is freed */
    atomic_store(&cl->master_epoch, 0);
    baton__srpc_destroy(cl->master);
    for (size_t i = 0; i < cl->n_nodes; i++)
        baton__srpc_destroy(cl->nodes[i].rpc);
    if (cl->resolver)
        baton__resolver_close(cl->resolver);
    uv_timer_init(cl->loop, &cl->close_timer);
    cl->close_timer.data = cl;
    uv_timer_start(&cl->close_timer, on_close_poll, 0, 10);
}

/* ---- operations ------------------------------------------------------------------------------ */

op_t *baton__op_new(baton_store_client_t *cl, uint8_t type, size_t n, baton_store_batch_cb cb,
                    void *data)
{
    op_t *op = calloc(1, sizeof(*op));
    if (op == NULL)
        return NULL;
    op->o = calloc(n, sizeof(*op->o));
    op->res = calloc(n, sizeof(*op->res));
    if (op->o == NULL || op->res == NULL) {
        free(op->o);
        free(op->res);
        free(op);
        return NULL;
    }
    op->cl = cl;
    op->type = type;
    op->n = n;
    op->cb = cb;
    op->data = data;
    cl->ops++;
    return op;
}

void baton__op_finish(op_t *op, int status)
{
    size_t prefix = 0;
    int open = 1;
    for (size_t i = 0; i < op->n; i++) {
        if (status != 0)
            op->o[i].status = status;
        op->res[i].status = op->o[i].status;
        op->res[i].len = op->o[i].obj_len;
        op->res[i].replicas = op->o[i].n_replicas;
        if (op->res[i].status != 0)
            open = 0;
        else if (open)
            prefix++;
    }
    op->cb(op->data, status, op->res, op->n, prefix);
    for (size_t i = 0; i < op->n; i++)
        baton__obj_reset(&op->o[i]);
    op->cl->ops--;
    free(op->nodes);
    free(op->o);
    free(op->res);
    free(op);
}

int baton__op_copy_keys(op_t *op, const char *const *keys, const baton_store_obj_t *objs)
{
    for (size_t i = 0; i < op->n; i++) {
        const char *k = keys ? keys[i] : objs[i].key;
        size_t kl = k ? strlen(k) : 0;
        if (kl == 0 || kl > BATON_STORE_KEY_MAX)
            return BATON_XFER_EINVAL;
        memcpy(op->o[i].key, k, kl + 1);
        if (objs) {
            op->o[i].addr = objs[i].addr;
            op->o[i].len = objs[i].len;
        }
    }
    return 0;
}

/* A request naming every object of the op. */
int baton__op_request(op_t *op, baton__sp_msg_t *m, baton__sp_item_t **items_p)
{
    memset(m, 0, sizeof(*m));
    baton__sp_item_t *items = calloc(op->n, sizeof(*items));
    if (items == NULL)
        return BATON_XFER_ENOMEM;
    for (size_t i = 0; i < op->n; i++) {
        memcpy(items[i].key, op->o[i].key, sizeof(items[i].key));
        items[i].x = op->type == BATON__SP_PUT_START ? op->o[i].len : op->o[i].put_id;
        items[i].y = op->o[i].crc;
    }
    m->type = op->type;
    snprintf(m->ns, sizeof(m->ns), "%s", op->cl->ns);
    m->n_items = (uint32_t)op->n;
    m->items = items;
    *items_p = items;
    return 0;
}

int baton__op_send(op_t *op, const char *const *keys, const baton_store_obj_t *objs,
                   baton__srpc_cb cb)
{
    baton_store_client_t *cl = op->cl;
    baton__sp_msg_t m;
    baton__sp_item_t *items = NULL;
    int rc = baton__op_copy_keys(op, keys, objs);
    if (rc == 0)
        rc = baton__op_request(op, &m, &items);
    if (rc == 0) {
        m.replicas = op->replicas;
        m.flags = op->flags;
        m.text = op->text;
        m.text_len = op->text_len;
        op->start_ms = baton_now_ms(); /* a get's lease is measured from before the request */
        rc = baton__srpc_call(cl->master, &m, cl->timeout_ms, cb, op);
    }
    free(items);
    free(op->text);
    op->text = NULL;
    if (rc != 0) {
        cl->ops--;
        free(op->o);
        free(op->res);
        free(op);
    }
    return rc;
}

int baton__op_reply_status(const op_t *op, int status, const baton__sp_msg_t *r)
{
    if (status == 0 && r->status != 0)
        status = r->status;
    if (status == 0 && r->n_ritems != op->n)
        status = BATON_XFER_EPROTO;
    return status;
}

/* Keeps an object's placement from the master's reply. */
int baton__op_take_placement(op_t *op, oobj_t *o, const baton__sp_msg_t *r,
                             const baton__sp_ritem_t *it)
{
    size_t n = (size_t)it->n_replicas * it->n_slices;
    if (n == 0 || it->n_slices == 0)
        return BATON_XFER_EPROTO;
    o->slices = malloc(n * sizeof(*o->slices));
    o->slice_try = calloc(it->n_slices, sizeof(*o->slice_try));
    if (o->slices == NULL || o->slice_try == NULL)
        return BATON_XFER_ENOMEM;
    memcpy(o->slices, &r->slices[it->first_slice], n * sizeof(*o->slices));
    o->n_replicas = it->n_replicas;
    o->n_slices = it->n_slices;
    uint64_t sum = 0;
    for (uint32_t s = 0; s < it->n_slices; s++)
        sum += o->slices[s].len;
    return sum == it->len ? 0 : BATON_XFER_EPROTO;
    (void)op;
}

void baton__obj_reset(oobj_t *o)
{
    free(o->slices);
    free(o->slice_try);
    free(o->nodes);
    o->slices = NULL;
    o->slice_try = NULL;
    o->nodes = NULL;
    o->n_nodes = o->n_replicas = o->n_slices = 0;
}

const baton__sp_node_t *baton__op_node(const op_t *op, const oobj_t *o, uint32_t node)
{
    for (uint32_t i = 0; o->nodes && i < o->n_nodes; i++)
        if (o->nodes[i].node == node)
            return &o->nodes[i];
    for (uint32_t i = 0; i < op->n_nodes; i++)
        if (op->nodes[i].node == node)
            return &op->nodes[i];
    return NULL;
}

int baton__op_keep_nodes(op_t *op, const baton__sp_msg_t *r)
{
    if (r->n_nodes == 0)
        return 0;
    op->nodes = malloc(r->n_nodes * sizeof(*op->nodes));
    if (op->nodes == NULL)
        return BATON_XFER_ENOMEM;
    memcpy(op->nodes, r->nodes, r->n_nodes * sizeof(*op->nodes));
    op->n_nodes = r->n_nodes;
    return 0;
}

/* Offset of slice s inside its object (every replica is sliced the same way). */
uint64_t baton__slice_obj_off(const oobj_t *o, uint32_t s)
{
    uint64_t off = 0;
    for (uint32_t i = 0; i < s; i++)
        off += o->slices[i].len;
    return off;
}

/* ---- exists, remove ---------------------------------------------------------------------------
 */

/* An exists answered with placements (BATON__SP_F_LOCATE): remember them with their lease. */
static void remember_located(op_t *op, oobj_t *o, const baton__sp_msg_t *r,
                             const baton__sp_ritem_t *it)
{
    if (it->status != 0 || it->n_slices == 0 || it->lease_ms == 0)
        return;
    o->crc = it->crc;
    o->lease_ms = it->lease_ms;
    o->lease_start_ms = op->start_ms;
    if (baton__op_take_placement(op, o, r, it) == 0)
        baton__loc_put(op->cl, op, o);
    baton__obj_reset(o);
}

static void on_simple_reply(void *data, int status, baton__sp_msg_t *r)
{
    op_t *op = data;
    status = baton__op_reply_status(op, status, r);
    if (status == 0 && op->type == BATON__SP_EXISTS && r->n_slices > 0 &&
        baton__op_keep_nodes(op, r) == 0)
        for (size_t i = 0; i < op->n; i++)
            remember_located(op, &op->o[i], r, &r->ritems[i]);
    for (size_t i = 0; status == 0 && i < op->n; i++) {
        op->o[i].status = r->ritems[i].status;
        op->o[i].obj_len = r->ritems[i].len;
        op->o[i].n_replicas = r->ritems[i].n_replicas;
        if (op->type == BATON__SP_REMOVE)
            baton__loc_drop(op->cl, op->o[i].key);
    }
    baton__op_finish(op, status);
}

static int simple_call(baton_store_client_t *cl, uint8_t type, const char *const *keys, size_t n,
                       baton_store_batch_cb cb, void *data)
{
    if (keys == NULL || n == 0 || n > BATON_STORE_BATCH_MAX || cb == NULL)
        return BATON_XFER_EINVAL;
    if (cl->own && !baton__own_here(cl))
        return baton__own_post(cl, type, NULL, keys, n, NULL, cb, data);
    if (cl->closing)
        return BATON_XFER_ESHUTDOWN;
    op_t *op = baton__op_new(cl, type, n, cb, data);
    if (op == NULL)
        return BATON_XFER_ENOMEM;
    if (type == BATON__SP_EXISTS && cl->n_locs)
        op->flags = BATON__SP_F_LOCATE;
    return baton__op_send(op, keys, NULL, on_simple_reply);
}

int baton_store_exists(baton_store_client_t *cl, const char *const *keys, size_t n,
                       baton_store_batch_cb cb, void *data)
{
    return simple_call(cl, BATON__SP_EXISTS, keys, n, cb, data);
}

int baton_store_remove(baton_store_client_t *cl, const char *const *keys, size_t n,
                       baton_store_batch_cb cb, void *data)
{
    return simple_call(cl, BATON__SP_REMOVE, keys, n, cb, data);
}

/* ---- shared by put and get (client_data.c) -----------------------------------------------------
 */

baton__srpc_t *baton__client_node_rpc(baton_store_client_t *cl, const char *host, int port)
{
    for (size_t i = 0; i < cl->n_nodes; i++)
        if (cl->nodes[i].port == port && strcmp(cl->nodes[i].host, host) == 0)
            return cl->nodes[i].rpc;
    node_rpc_t *nodes = realloc(cl->nodes, (cl->n_nodes + 1) * sizeof(*nodes));
    if (nodes == NULL)
        return NULL;
    cl->nodes = nodes;
    node_rpc_t *x = &nodes[cl->n_nodes];
    snprintf(x->host, sizeof(x->host), "%s", host);
    x->port = port;
    if (baton__srpc_create(&cl->so, host, port, BATON_XFER_EPEERDOWN, &x->rpc) != 0)
        return NULL;
    cl->n_nodes++;
    return x->rpc;
}
