/* store/srpc.c — calls over one control connection: request ids, replies matched to them, a
 * deadline per call, and a fresh connection on the next call after a failure (so a client cut off
 * for a while recovers by itself). */
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/list.h"
#include "common/log.h"
#include "store/elect.h"
#include "store/sconn.h"

typedef struct call_s {
    struct call_s *next;
    uint32_t req_id;
    uint64_t deadline_ms;
    baton__srpc_cb cb;
    void *data;
    int status;                /* set when failed before a reply */
    baton_buf_t pending_frame; /* the request, until the connection is up */
    baton__sp_msg_t *msg_copy;
} call_t;

struct baton__srpc_s {
    baton__sconn_opts_t o;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    char id[BATON__SP_ID_MAX + 1];
    char host[BATON__SP_HOST_MAX + 1];
    int port;
    int down_status;
    baton__sconn_t *conn; /* NULL: none */
    int up;
    uint32_t next_id;
    call_t *calls;    /* sent or waiting for the connection */
    call_t *failed;   /* to be reported on the next loop turn */
    uv_timer_t timer; /* deadlines, and deferred completions */
    int destroyed;
    baton__resolver_t *resolver; /* the target is looked up before each connection */
    int resolving;
    uint64_t epoch;               /* counts connections up and down (baton__srpc_epoch) */
    atomic_uint_fast64_t *mirror; /* NULL, or where baton__srpc_epoch's value is also kept */
};

static void publish_epoch(baton__srpc_t *r)
{
    if (r->mirror)
        atomic_store(r->mirror, baton__srpc_epoch(r));
}

/* Deep copy of the request (its arrays), kept until the connection is up. */
static baton__sp_msg_t *msg_dup(const baton__sp_msg_t *m)
{
    baton__sp_msg_t *c = malloc(sizeof(*c));
    if (c == NULL)
        return NULL;
    *c = *m;
    c->items = NULL;
    c->slices = NULL;
    c->ritems = NULL;
    c->nodes = NULL;
    c->text = NULL;
    c->n_ritems = c->n_nodes = c->text_len = 0;
    if (m->n_items) {
        c->items = malloc(m->n_items * sizeof(*c->items));
        if (c->items == NULL)
            goto fail;
        memcpy(c->items, m->items, m->n_items * sizeof(*c->items));
    }
    if (m->n_slices) {
        c->slices = malloc(m->n_slices * sizeof(*c->slices));
        if (c->slices == NULL)
            goto fail;
        memcpy(c->slices, m->slices, m->n_slices * sizeof(*c->slices));
    }
    if (m->text_len) {
        c->text = malloc(m->text_len);
        if (c->text == NULL)
            goto fail;
        memcpy(c->text, m->text, m->text_len);
        c->text_len = m->text_len;
    }
    return c;
fail:
    free(c->items);
    free(c->slices);
    free(c);
    return NULL;
}

static void msg_drop(baton__sp_msg_t *m)
{
    if (m) {
        free(m->items);
        free(m->slices);
        free(m->text);
        free(m);
    }
}

static void on_timer(uv_timer_t *t);

static void free_srpc(uv_handle_t *h)
{
    free(h->data);
}

static void arm(baton__srpc_t *r)
{
    uint64_t now = baton_now_ms(), next = UINT64_MAX;
    if (r->failed)
        next = now;
    for (call_t *c = r->calls; c; c = c->next)
        if (c->deadline_ms < next)
            next = c->deadline_ms;
    if (next == UINT64_MAX)
        uv_timer_stop(&r->timer);
    else
        uv_timer_start(&r->timer, on_timer, next > now ? next - now : 0, 0);
}

static void fail_all(baton__srpc_t *r, int status)
{
    while (r->calls) {
        call_t *c = r->calls;
        r->calls = c->next;
        c->status = status;
        c->next = r->failed;
        r->failed = c;
    }
}

static void report_failed(baton__srpc_t *r)
{
    call_t *list = r->failed;
    r->failed = NULL;
    while (list) {
        call_t *c = list;
        list = c->next;
        c->cb(c->data, c->status, NULL);
        msg_drop(c->msg_copy);
        free(c);
    }
}

static void on_timer(uv_timer_t *t)
{
    baton__srpc_t *r = t->data;
    uint64_t now = baton_now_ms();
    call_t **pp = &r->calls;
    while (*pp) {
        call_t *c = *pp;
        if (c->deadline_ms <= now) {
            *pp = c->next;
            c->status = BATON_XFER_ETIMEOUT;
            c->next = r->failed;
            r->failed = c;
        } else {
            pp = &c->next;
        }
    }
    /* Behind a resolver, a call that timed out may mean a leader that is gone without a word
     * (stopped, partitioned): the next call looks it up again on a fresh connection. */
    if (r->failed && r->resolver && r->conn && !r->destroyed)
        baton__sconn_close(r->conn, BATON_XFER_ETIMEOUT);
    report_failed(r);
    if (!r->destroyed)
        arm(r);
}

static void send_waiting(baton__srpc_t *r)
{
    for (call_t *c = r->calls; c; c = c->next)
        if (c->msg_copy) {
            int rc = baton__sconn_send(r->conn, c->msg_copy);
            msg_drop(c->msg_copy);
            c->msg_copy = NULL;
            if (rc != 0)
                c->deadline_ms = 0; /* fails on the next timer turn */
        }
    arm(r);
}

static void on_ready(baton__sconn_t *c, int status, void *data)
{
    baton__srpc_t *r = data;
    (void)c;
    (void)status;
    r->up = 1;
    r->epoch++;
    publish_epoch(r);
    send_waiting(r);
}

static void on_closed(baton__sconn_t *c, int status, void *data)
{
    baton__srpc_t *r = data;
    (void)c;
    if (status != 0)
        log_debug("store", "srpc_down peer=%s:%d reason=\"%s\"", r->host, r->port,
                  baton_store_strerror(status));
    r->conn = NULL;
    r->up = 0;
    r->epoch++;
    publish_epoch(r);
    fail_all(r, r->destroyed ? BATON_XFER_ESHUTDOWN : r->down_status);
    if (r->destroyed) {
        report_failed(r);
        uv_close((uv_handle_t *)&r->timer, free_srpc);
        return;
    }
    arm(r);
}

static void on_msg(baton__sconn_t *conn, baton__sp_msg_t *m, void *data)
{
    baton__srpc_t *r = data;
    if (m->type != BATON__SP_REPLY) {
        baton__sconn_close(conn, BATON_XFER_EPROTO);
        return;
    }
    for (call_t **pp = &r->calls; *pp; pp = &(*pp)->next) {
        call_t *c = *pp;
        if (c->req_id != m->req_id)
            continue;
        *pp = c->next;
        if (m->status == BATON_STORE_ENOLEADER && r->resolver)
            baton__sconn_close(conn, BATON_STORE_ENOLEADER); /* a standby: look again */
        c->cb(c->data, 0, m);
        msg_drop(c->msg_copy);
        free(c);
        arm(r);
        return;
    }
    /* a reply after its call timed out: dropped */
}

static void on_resolved(void *data, int status, const char *host, int port)
{
    baton__srpc_t *r = data;
    r->resolving = 0;
    if (r->destroyed) {
        uv_close((uv_handle_t *)&r->timer, free_srpc);
        return;
    }
    if (status == 0) {
        snprintf(r->host, sizeof(r->host), "%s", host);
        r->port = port;
        if (baton__sconn_connect(&r->o, r->host, r->port, &r->conn) == 0)
            return;
        r->conn = NULL;
    }
    fail_all(r, r->down_status);
    arm(r);
}

/* Starts a connection (after a lookup of the target when there is a resolver). */
static int open_conn(baton__srpc_t *r)
{
    if (r->conn || r->resolving)
        return 0;
    if (r->resolver) {
        int rc = baton__resolve(r->resolver, on_resolved, r);
        if (rc == 0)
            r->resolving = 1;
        return rc;
    }
    int rc = baton__sconn_connect(&r->o, r->host, r->port, &r->conn);
    if (rc != 0)
        r->conn = NULL;
    return rc;
}

uint64_t baton__srpc_epoch(const baton__srpc_t *r)
{
    return r->up ? r->epoch : 0;
}

void baton__srpc_mirror_epoch(baton__srpc_t *r, atomic_uint_fast64_t *out)
{
    r->mirror = out;
    publish_epoch(r);
}

void baton__srpc_set_resolver(baton__srpc_t *r, baton__resolver_t *resolver)
{
    r->resolver = resolver;
}

int baton__srpc_create(const baton__sconn_opts_t *o, const char *host, int port, int down_status,
                       baton__srpc_t **r_p)
{
    baton__srpc_t *r = calloc(1, sizeof(*r));
    if (r == NULL || strlen(host) > BATON__SP_HOST_MAX) {
        free(r);
        return BATON_XFER_EINVAL;
    }
    r->o = *o;
    if (o->secret && o->secret_len) {
        memcpy(r->secret, o->secret, o->secret_len);
        r->o.secret = r->secret;
    }
    snprintf(r->id, sizeof(r->id), "%s", o->id ? o->id : "store-client");
    r->o.id = r->id;
    r->o.on_msg = on_msg;
    r->o.on_ready = on_ready;
    r->o.on_close = on_closed;
    r->o.data = r;
    if (r->o.max_body == 0)
        r->o.max_body = BATON__SP_REPLY_MAX;
    snprintf(r->host, sizeof(r->host), "%s", host);
    r->port = port;
    r->down_status = down_status;
    r->next_id = 1;
    uv_timer_init(o->loop, &r->timer);
    r->timer.data = r;
    *r_p = r;
    return 0;
}

int baton__srpc_call(baton__srpc_t *r, baton__sp_msg_t *m, uint32_t timeout_ms, baton__srpc_cb cb,
                     void *data)
{
    if (r->destroyed)
        return BATON_XFER_ESHUTDOWN;
    call_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return BATON_XFER_ENOMEM;
    m->req_id = r->next_id++;
    if (r->next_id == 0)
        r->next_id = 1;
    c->req_id = m->req_id;
    c->deadline_ms = baton_now_ms() + timeout_ms;
    c->cb = cb;
    c->data = data;
    if (r->up) {
        int rc = baton__sconn_send(r->conn, m);
        if (rc != 0) {
            free(c);
            return rc;
        }
    } else {
        c->msg_copy = msg_dup(m);
        if (c->msg_copy == NULL) {
            free(c);
            return BATON_XFER_ENOMEM;
        }
        if (open_conn(r) != 0) {
            c->status = r->down_status; /* reported on the next loop turn */
            c->next = r->failed;
            r->failed = c;
            arm(r);
            return 0;
        }
    }
    c->next = r->calls;
    r->calls = c;
    arm(r);
    return 0;
}

void baton__srpc_destroy(baton__srpc_t *r)
{
    r->destroyed = 1;
    if (r->conn) {
        baton__sconn_close(r->conn, 0); /* on_closed fails the calls and frees r */
        return;
    }
    fail_all(r, BATON_XFER_ESHUTDOWN);
    report_failed(r);
    if (r->resolving)
        return; /* freed by the lookup's callback */
    uv_close((uv_handle_t *)&r->timer, free_srpc);
}
