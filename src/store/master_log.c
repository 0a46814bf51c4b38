/* store/master_log.c — the leader master's operation log in etcd (every object put, commit and
 * free, every node registered and lost, written through transactions fenced by the leader's
 * lease) and a new leader's restore from it, so that a failover keeps every committed object. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/log.h"
#include "etcd/etcd.h"
#include "store/master.h"

#define COMP          "store"
#define TXN_OPS_MAX   128 /* etcd's default --max-txn-ops */
#define RETRY_MS      200
#define RESTORE_LIMIT 4096

/*
 * Keys, under the registry URL's prefix:
 *   <prefix>/store/node/<node id> {"incarnation","host","xfer_port","ctrl_port","segment_bytes"}
 *   <prefix>/store/obj/<put id, hex>   {"state":"putting"|"complete","ns","key" (base64 both),
 *                                       "len","crc","pin","replicas","stripes",
 *                                       "slices":[[node id, incarnation, off, len] | null, ...]}
 * One queue, one transaction in flight: etcd applies the records in the order the metadata
 * changed, each transaction only while the leader key still carries this master's lease (a
 * deposed leader's late writes fail instead of landing after its successor's). A reply to a
 * client waits until every record queued before it is in etcd (baton__mlog_wait), so whatever
 * a client was told survives a failover.
 */

typedef struct lop_s {
    struct lop_s *next;
    uint64_t seq;
    char *key;
    char *value; /* NULL: delete */
} lop_t;

typedef struct waiter_s {
    struct waiter_s *next;
    uint64_t seq;
    baton__mlog_wait_cb fn;
    void *arg;
} waiter_t;

struct baton__mlog_s {
    baton__master_t *ms;
    baton_etcd_t *etcd;
    char base[300];     /* "<prefix>/store/" */
    lop_t *head, *tail; /* queued, oldest first */
    lop_t *flight;      /* the transaction in flight (detached from the queue) */
    uint64_t enq, done; /* sequence numbers: last queued, last in etcd */
    waiter_t *waiters, **wtail;
    uv_timer_t retry, restore_retry, kick;
    int sending;
    uint64_t flight_start_ms;
    baton__mlog_stats_t st;
    /* restore */
    baton__mlog_done_cb restored;
    char *next_key;
    uint64_t restore_start_ms;
};

static const char *inc_hex(uint64_t inc, char out[17])
{
    snprintf(out, 17, "%016llx", (unsigned long long)inc);
    return out;
}

/* ---- the queue and its transactions --------------------------------------------------------- */

static void flush(baton__mlog_t *l);

static void on_kick(uv_timer_t *t)
{
    flush(t->data);
}

static void enqueue(baton__mlog_t *l, char *key, char *value)
{
    lop_t *op = calloc(1, sizeof(*op));
    if (op == NULL || key == NULL) {
        /* a record that cannot be queued would make the log lie: stop leading */
        free(op);
        free(key);
        free(value);
        baton__master_step_down(l->ms, "out of memory for the operation log");
        return;
    }
    op->seq = ++l->enq;
    op->key = key;
    op->value = value;
    if (l->tail)
        l->tail->next = op;
    else
        l->head = op;
    l->tail = op;
    l->st.queued++;
    /* not at once: the records of one request (a batch) go out in one transaction, sent when
     * the request is answered (baton__mlog_wait) or on the next loop turn */
    if (l->flight == NULL && !uv_is_active((uv_handle_t *)&l->kick))
        uv_timer_start(&l->kick, on_kick, 0, 0);
}

static void free_ops(lop_t *op)
{
    while (op) {
        lop_t *next = op->next;
        free(op->key);
        free(op->value);
        free(op);
        op = next;
    }
}

static void wake(baton__mlog_t *l, int status)
{
    while (l->waiters && (status != 0 || l->waiters->seq <= l->done)) {
        waiter_t *w = l->waiters;
        l->waiters = w->next;
        if (l->waiters == NULL)
            l->wtail = &l->waiters;
        w->fn(w->arg, status);
        free(w);
    }
}

static void send_flight(baton__mlog_t *l);

static void on_retry(uv_timer_t *t)
{
    baton__mlog_t *l = t->data;
    if (l->flight && !l->sending)
        send_flight(l);
}

static void on_txn(void *data, int err, json_t *res)
{
    baton__mlog_t *l = data;
    l->sending = 0;
    if (err == BATON_XFER_ECANCELED)
        return;
    if (err != 0) { /* etcd unreachable or slow: the same records again (puts and deletes are
                     * idempotent); losing the lease meanwhile ends the leadership */
        l->st.retries++;
        log_warn(COMP, "oplog_write_failed reason=\"%s\" action=retry", baton_store_strerror(err));
        uv_timer_start(&l->retry, on_retry, RETRY_MS, 0);
        return;
    }
    if (!json_is_true(json_object_get(res, "succeeded"))) {
        free_ops(l->flight);
        l->flight = NULL;
        baton__master_step_down(l->ms, "the leader key no longer carries this master's lease");
        return;
    }
    size_t n = 0;
    for (lop_t *op = l->flight; op; op = op->next, n++)
        l->done = op->seq;
    l->st.txns++;
    l->st.ops += n;
    l->st.txn_ms += baton_now_ms() - l->flight_start_ms;
    free_ops(l->flight);
    l->flight = NULL;
    wake(l, 0);
    flush(l);
}

/* Sends the transaction in flight, fenced by the leader key's lease. */
static void send_flight(baton__mlog_t *l)
{
    int64_t lease = baton__elect_lease(l->ms->elect);
    if (lease == 0 || !baton__elect_is_leader(l->ms->elect)) {
        uv_timer_start(&l->retry, on_retry, RETRY_MS, 0);
        return;
    }
    const char *lk = baton__elect_key(l->ms->elect);
    json_t *ops = json_array();
    for (lop_t *op = l->flight; op; op = op->next) {
        json_t *k = baton_etcd_b64(op->key, strlen(op->key));
        if (op->value)
            json_array_append_new(ops, json_pack("{s:{s:o,s:o}}", "request_put", "key", k, "value",
                                                 baton_etcd_b64(op->value, strlen(op->value))));
        else
            json_array_append_new(ops, json_pack("{s:{s:o}}", "request_delete_range", "key", k));
    }
    char lease_s[24];
    snprintf(lease_s, sizeof(lease_s), "%lld", (long long)lease);
    json_t *body =
        json_pack("{s:[{s:o,s:s,s:s,s:s}],s:o}", "compare", "key", baton_etcd_b64(lk, strlen(lk)),
                  "target", "LEASE", "result", "EQUAL", "lease", lease_s, "success", ops);
    l->flight_start_ms = baton_now_ms();
    if (body != NULL && baton_etcd_call(l->etcd, "/v3/kv/txn", body, on_txn, l) == 0)
        l->sending = 1;
    else
        uv_timer_start(&l->retry, on_retry, RETRY_MS, 0);
    json_decref(body);
}

/* Starts the next transaction when none is in flight: up to TXN_OPS_MAX queued records. */
static void flush(baton__mlog_t *l)
{
    if (l->flight || l->head == NULL)
        return;
    lop_t *op = l->head;
    for (int i = 1; i < TXN_OPS_MAX && op->next; i++)
        op = op->next;
    l->flight = l->head;
    l->head = op->next;
    if (l->head == NULL)
        l->tail = NULL;
    op->next = NULL;
    send_flight(l);
}

int baton__mlog_wait(baton__master_t *ms, baton__mlog_wait_cb fn, void *arg)
{
    baton__mlog_t *l = ms->log;
    if (l == NULL || l->done >= l->enq)
        return 1;
    flush(l);
    waiter_t *w = calloc(1, sizeof(*w));
    if (w == NULL)
        return 1; /* cannot park it: answer now (no worse than before the log existed) */
    w->seq = l->enq;
    w->fn = fn;
    w->arg = arg;
    *l->wtail = w;
    l->wtail = &w->next;
    return 0;
}

/* ---- what is written ------------------------------------------------------------------------ */

static char *obj_key(baton__mlog_t *l, uint64_t put_id)
{
    char *k = malloc(strlen(l->base) + 24);
    if (k)
        sprintf(k, "%sobj/%016llx", l->base, (unsigned long long)put_id);
    return k;
}

static char *node_key(baton__mlog_t *l, const char *id)
{
    char *k = malloc(strlen(l->base) + strlen(id) + 8);
    if (k)
        sprintf(k, "%snode/%s", l->base, id);
    return k;
}

void baton__mlog_journal(void *data, const baton__meta_rec_t *rec)
{
    baton__master_t *ms = data;
    baton__mlog_t *l = ms->log;
    if (l == NULL)
        return;
    if (rec->state == BATON__OBJ_FREED) {
        enqueue(l, obj_key(l, rec->put_id), NULL);
        return;
    }
    json_t *sl = json_array();
    for (size_t i = 0; i < (size_t)rec->n_replicas * rec->n_slices; i++) {
        const baton__slice_t *s = &rec->slices[i];
        if (s->node == BATON__SLICE_LOST || s->node >= ms->n_nodes) {
            json_array_append_new(sl, json_null());
            continue;
        }
        char inc[17];
        json_array_append_new(sl, json_pack("[s,s,I,I]", baton__meta_node_id(ms->meta, s->node),
                                            inc_hex(ms->nodes[s->node].incarnation, inc),
                                            (json_int_t)s->off, (json_int_t)s->len));
    }
    json_t *v =
        json_pack("{s:s,s:o,s:o,s:I,s:I,s:b,s:i,s:i,s:o}", "state",
                  rec->state == BATON__OBJ_COMPLETE ? "complete" : "putting", "ns",
                  baton_etcd_b64(rec->ns, strlen(rec->ns)), "key",
                  baton_etcd_b64(rec->key, strlen(rec->key)), "len", (json_int_t)rec->len, "crc",
                  (json_int_t)rec->crc, "pin", (rec->flags & BATON_STORE_PUT_SOFT_PIN) != 0,
                  "replicas", (int)rec->n_replicas, "stripes", (int)rec->n_slices, "slices", sl);
    json_t *block =
        rec->state == BATON__OBJ_COMPLETE ? baton__mkvev_block_json(ms, rec->put_id) : NULL;
    if (v && block)
        json_object_set_new(v, "block", block);
    else
        json_decref(block);
    enqueue(l, obj_key(l, rec->put_id), v ? json_dumps(v, JSON_COMPACT) : NULL);
    json_decref(v);
}

void baton__mlog_node(baton__master_t *ms, uint32_t node, int up)
{
    baton__mlog_t *l = ms->log;
    if (l == NULL || node >= ms->n_nodes)
        return;
    const baton__mnode_t *n = &ms->nodes[node];
    char *key = node_key(l, baton__meta_node_id(ms->meta, node));
    if (!up) {
        enqueue(l, key, NULL);
        return;
    }
    char inc[17];
    json_t *v =
        json_pack("{s:s,s:s,s:i,s:i,s:I}", "incarnation", inc_hex(n->incarnation, inc), "host",
                  n->host, "xfer_port", (int)n->xfer_port, "ctrl_port", (int)n->ctrl_port,
                  "segment_bytes", (json_int_t)baton__meta_segment_capacity(ms->meta, n->seg));
    enqueue(l, key, v ? json_dumps(v, JSON_COMPACT) : NULL);
    json_decref(v);
}

/* ---- a new leader's restore ----------------------------------------------------------------- */

static void restore_node(baton__mlog_t *l, const char *id, json_t *v, uint64_t now)
{
    const char *inc = json_string_value(json_object_get(v, "incarnation"));
    const char *host = json_string_value(json_object_get(v, "host"));
    json_int_t xp = json_integer_value(json_object_get(v, "xfer_port"));
    json_int_t cp = json_integer_value(json_object_get(v, "ctrl_port"));
    json_int_t bytes = json_integer_value(json_object_get(v, "segment_bytes"));
    uint32_t node;
    if (inc == NULL || host == NULL || xp <= 0 || xp > 65535 || cp <= 0 || cp > 65535 ||
        bytes <= 0 ||
        baton__master_node_up(l->ms, id, strtoull(inc, NULL, 16), host, (uint16_t)xp, (uint16_t)cp,
                              (uint64_t)bytes, now, 0, &node) != 0) {
        l->st.dropped++;
        log_warn(COMP, "restore_node_dropped id=%s", id);
        return;
    }
    l->st.restored_nodes++;
}

/* The node index a logged slice names: its node must be known with the same incarnation. */
static uint32_t slice_node(baton__master_t *ms, json_t *s)
{
    const char *id = json_string_value(json_array_get(s, 0));
    const char *inc = json_string_value(json_array_get(s, 1));
    if (id == NULL || inc == NULL)
        return BATON__SLICE_LOST;
    uint64_t incarnation = strtoull(inc, NULL, 16);
    for (size_t i = 0; i < ms->n_nodes; i++)
        if (ms->nodes[i].alive && ms->nodes[i].incarnation == incarnation &&
            strcmp(baton__meta_node_id(ms->meta, (uint32_t)i), id) == 0)
            return (uint32_t)i;
    return BATON__SLICE_LOST;
}

static void restore_obj(baton__mlog_t *l, const char *etcd_key, uint64_t put_id, json_t *v,
                        uint64_t now)
{
    baton__master_t *ms = l->ms;
    const char *state = json_string_value(json_object_get(v, "state"));
    char *ns = baton_etcd_unb64(json_object_get(v, "ns"), NULL);
    char *key = baton_etcd_unb64(json_object_get(v, "key"), NULL);
    json_t *sl = json_object_get(v, "slices");
    json_int_t reps = json_integer_value(json_object_get(v, "replicas"));
    json_int_t stripes = json_integer_value(json_object_get(v, "stripes"));
    int rc = BATON_XFER_EINVAL;
    baton__slice_t *slices = NULL;
    if (state && ns && key && reps > 0 && reps <= 255 && stripes > 0 && stripes <= 255 &&
        json_array_size(sl) == (size_t)(reps * stripes) &&
        (slices = calloc((size_t)(reps * stripes), sizeof(*slices))) != NULL) {
        for (size_t i = 0; i < json_array_size(sl); i++) {
            json_t *s = json_array_get(sl, i);
            slices[i].node = json_is_array(s) ? slice_node(ms, s) : BATON__SLICE_LOST;
            slices[i].seg = slices[i].node == BATON__SLICE_LOST ? 0 : ms->nodes[slices[i].node].seg;
            slices[i].off = (uint64_t)json_integer_value(json_array_get(s, 2));
            slices[i].len = (uint64_t)json_integer_value(json_array_get(s, 3));
        }
        baton__meta_rec_t rec = {
            put_id,
            strcmp(state, "complete") == 0 ? BATON__OBJ_COMPLETE : BATON__OBJ_PUTTING,
            ns,
            key,
            (uint64_t)json_integer_value(json_object_get(v, "len")),
            (uint32_t)json_integer_value(json_object_get(v, "crc")),
            json_is_true(json_object_get(v, "pin")) ? BATON_STORE_PUT_SOFT_PIN : 0,
            (uint32_t)reps,
            (uint32_t)stripes,
            slices};
        rc = baton__meta_restore(ms->meta, &rec, now);
        if (rc == 0 && rec.state == BATON__OBJ_COMPLETE && json_object_get(v, "block"))
            baton__mkvev_restored(ms, put_id, json_object_get(v, "block"));
        if (rc == 0 && rec.state == BATON__OBJ_COMPLETE)
            l->st.restored_objects++;
        else if (rc == 0)
            l->st.restored_putting++;
    }
    if (rc != 0) { /* gone (every copy of a stripe on a node that did not come back) or bad */
        l->st.dropped++;
        log_warn(COMP, "restore_object_dropped put_id=%llu reason=\"%s\"",
                 (unsigned long long)put_id, baton_store_strerror(rc));
        enqueue(l, strdup(etcd_key), NULL);
    }
    free(slices);
    free(ns);
    free(key);
}

static void restore_page(baton__mlog_t *l);
static void on_restore_retry(uv_timer_t *t);

static void on_range(void *data, int err, json_t *res)
{
    baton__mlog_t *l = data;
    if (err == BATON_XFER_ECANCELED)
        return;
    if (err != 0) {
        log_warn(COMP, "restore_read_failed reason=\"%s\" action=retry", baton_store_strerror(err));
        uv_timer_start(&l->restore_retry, on_restore_retry, RETRY_MS, 0);
        return;
    }
    uint64_t now = baton_now_ms();
    json_t *kvs = json_object_get(res, "kvs");
    size_t nodes_len = strlen(l->base) + 5, objs_len = strlen(l->base) + 4;
    char *last = NULL;
    for (size_t i = 0; i < json_array_size(kvs); i++) {
        json_t *kv = json_array_get(kvs, i);
        char *k = baton_etcd_unb64(json_object_get(kv, "key"), NULL);
        char *val = baton_etcd_unb64(json_object_get(kv, "value"), NULL);
        json_t *v = val ? json_loads(val, 0, NULL) : NULL;
        if (k && v && strncmp(k, l->base, strlen(l->base)) == 0) {
            if (strncmp(k + strlen(l->base), "node/", 5) == 0)
                restore_node(l, k + nodes_len, v, now);
            else if (strncmp(k + strlen(l->base), "obj/", 4) == 0)
                restore_obj(l, k, strtoull(k + objs_len, NULL, 16), v, now);
        }
        json_decref(v);
        free(val);
        free(last);
        last = k;
    }
    int more = json_is_true(json_object_get(res, "more"));
    free(l->next_key);
    l->next_key = NULL;
    if (more && last) { /* the next page starts just past the last key */
        size_t n = strlen(last);
        l->next_key = malloc(n + 2);
        if (l->next_key) {
            memcpy(l->next_key, last, n);
            l->next_key[n] = '\0';
            l->next_key[n + 1] = '\0';
        }
    }
    free(last);
    if (more && l->next_key) {
        restore_page(l);
        return;
    }
    l->st.restore_ms = baton_now_ms() - l->restore_start_ms;
    l->restore_start_ms = 0;
    baton__mlog_done_cb cb = l->restored;
    l->restored = NULL;
    cb(l->ms);
}

static void restore_page(baton__mlog_t *l)
{
    char end[320];
    baton_etcd_prefix_end(l->base, end, sizeof(end));
    const char *from = l->next_key ? l->next_key : l->base;
    /* a continuation key ends in the NUL that puts it just past the last one read */
    size_t from_len = l->next_key ? strlen(l->next_key) + 1 : strlen(from);
    json_t *body = json_pack("{s:o,s:o,s:i}", "key", baton_etcd_b64(from, from_len), "range_end",
                             baton_etcd_b64(end, strlen(end)), "limit", RESTORE_LIMIT);
    if (body == NULL || baton_etcd_call(l->etcd, "/v3/kv/range", body, on_range, l) != 0)
        uv_timer_start(&l->restore_retry, on_restore_retry, RETRY_MS, 0);
    json_decref(body);
}

static void on_restore_retry(uv_timer_t *t)
{
    restore_page(t->data);
}

void baton__mlog_restore(baton__master_t *ms, baton__mlog_done_cb done)
{
    baton__mlog_t *l = ms->log;
    l->restored = done;
    l->restore_start_ms = baton_now_ms();
    restore_page(l);
}

/* ---- life ----------------------------------------------------------------------------------- */

int baton__mlog_create(baton__master_t *ms, baton__mlog_t **l_p)
{
    baton__mlog_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return BATON_XFER_ENOMEM;
    l->ms = ms;
    l->etcd = baton__elect_etcd(ms->elect);
    const char *lk = baton__elect_key(ms->elect);
    size_t n = strlen(lk) - strlen("leader"); /* "<prefix>/store/" */
    if (n >= sizeof(l->base)) {
        free(l);
        return BATON_XFER_EINVAL;
    }
    memcpy(l->base, lk, n);
    l->base[n] = '\0';
    l->wtail = &l->waiters;
    uv_timer_init(ms->loop, &l->retry);
    uv_timer_init(ms->loop, &l->restore_retry);
    uv_timer_init(ms->loop, &l->kick);
    l->retry.data = l->restore_retry.data = l->kick.data = l;
    *l_p = l;
    return 0;
}

void baton__mlog_stats(const baton__master_t *ms, baton__mlog_stats_t *st)
{
    if (ms->log) {
        *st = ms->log->st;
        st->pending = ms->log->enq - ms->log->done;
    } else {
        memset(st, 0, sizeof(*st));
    }
}
