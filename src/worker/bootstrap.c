/* bootstrap.c — room rendezvous over TCP: prefill listener and room table, decode peer
 * connections (see bootstrap.h; frames in frame.h). */
#include "worker/bootstrap.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/log.h"
#include "worker/frame.h"
#include "worker/roommap.h"

#define COMP                            "worker"
#define container_of(ptr, type, member) ((type *)((char *)(ptr)-offsetof(type, member)))

typedef struct tlist_s {
    wk_boot_tnode_t *head, *tail;
} tlist_t;

/* A bootstrap TCP connection: accepted by a prefill (decode peer) or made by a decode. */
typedef struct conn_s {
    uv_tcp_t tcp;
    wk_boot_t *boot;
    baton_buf_t in;
    int is_peer; /* decode side: a peer_t */
    int closing;
    int counted;                /* included in stats.connections */
    struct conn_s *prev, *next; /* in boot->conns (prefill side) */
} conn_t;

typedef enum { PEER_RESOLVING, PEER_CONNECTING, PEER_CONNECTED, PEER_CLOSING } peer_state_t;

/* Decode side: one connection per prefill bootstrap endpoint. */
typedef struct peer_s {
    conn_t c; /* first: the tcp handle's container */
    peer_state_t state;
    char host[256];
    int port;
    uv_getaddrinfo_t gai;
    uv_connect_t connect_req;
    int tcp_inited;
    int pending_ops; /* gai/connect requests still owning this struct */
    wk_boot_wait_t *waits_head, *waits_tail;
    struct peer_s *prev, *next; /* in boot->peers */
} peer_t;

/* Prefill side: the state of one room. */
typedef enum { ROOM_READY, ROOM_WAITING, ROOM_ABORTED } room_state_t;

typedef struct proom_s {
    uint64_t room;
    room_state_t state;
    wk_boot_pub_t *pub; /* READY */
    conn_t *waiter;     /* WAITING */
    wk_boot_tnode_t tn;
} proom_t;

typedef struct write_req_s {
    uv_write_t req;
    wk_boot_pub_t *pub; /* DONE writes: whom to tell */
    uint8_t data[WK_FRAME_MAX];
} write_req_t;

struct wk_boot_s {
    uv_loop_t *loop;
    uint64_t timeout_ms;
    uv_tcp_t listener;
    int listening;
    int port;
    uv_timer_t timer;
    int closing;
    unsigned open_handles;
    void (*close_cb)(void *arg);
    void *close_arg;

    wk_roommap_t prooms; /* prefill: room → proom_t */
    tlist_t ptimeouts;   /* prefill room deadlines */
    conn_t *conns;       /* prefill: accepted connections */

    wk_roommap_t waits; /* decode: room → wk_boot_wait_t */
    tlist_t wtimeouts;  /* decode wait deadlines */
    peer_t *peers;

    wk_boot_stats_t stats;
    char scratch[65536];
};

/* ---- deadline lists ---- */

static void tl_remove(tlist_t *l, wk_boot_tnode_t *n)
{
    if (!n->linked)
        return;
    if (n->prev)
        n->prev->next = n->next;
    else
        l->head = n->next;
    if (n->next)
        n->next->prev = n->prev;
    else
        l->tail = n->prev;
    n->prev = n->next = NULL;
    n->linked = 0;
}

/* Deadlines are nearly always appended in order; walk back from the tail otherwise. */
static void tl_insert(tlist_t *l, wk_boot_tnode_t *n, uint64_t deadline)
{
    tl_remove(l, n);
    n->deadline_ms = deadline;
    wk_boot_tnode_t *after = l->tail;
    while (after != NULL && after->deadline_ms > deadline)
        after = after->prev;
    n->prev = after;
    n->next = after ? after->next : l->head;
    if (n->next)
        n->next->prev = n;
    else
        l->tail = n;
    if (after)
        after->next = n;
    else
        l->head = n;
    n->linked = 1;
}

static void timer_cb(uv_timer_t *t);

static void arm_timer(wk_boot_t *b)
{
    if (b->closing)
        return;
    uint64_t next = UINT64_MAX;
    if (b->ptimeouts.head)
        next = b->ptimeouts.head->deadline_ms;
    if (b->wtimeouts.head && b->wtimeouts.head->deadline_ms < next)
        next = b->wtimeouts.head->deadline_ms;
    if (next == UINT64_MAX) {
        uv_timer_stop(&b->timer);
        return;
    }
    uint64_t now = uv_now(b->loop);
    uv_timer_start(&b->timer, timer_cb, next > now ? next - now : 0, 0);
}

/* ---- writes ---- */

static void write_cb(uv_write_t *req, int status);

static int send_frame(conn_t *c, const wk_frame_t *f, wk_boot_pub_t *pub)
{
    if (c->closing)
        return BATON_ECLOSED;
    write_req_t *wr = malloc(sizeof(*wr));
    if (wr == NULL)
        return BATON_ENOMEM;
    wr->pub = pub;
    size_t len = wk_frame_encode(f, wr->data);
    uv_buf_t buf = uv_buf_init((char *)wr->data, (unsigned)len);
    int rc = uv_write(&wr->req, (uv_stream_t *)&c->tcp, &buf, 1, write_cb);
    if (rc != 0) {
        free(wr);
        return rc;
    }
    if (pub)
        pub->wr = wr;
    return 0;
}

static void send_abort(conn_t *c, uint64_t room, int reason)
{
    wk_frame_t f = {.type = WK_FRAME_ABORT, .room = room, .status = reason};
    int rc = send_frame(c, &f, NULL);
    if (rc != 0 && rc != BATON_ECLOSED)
        log_warn(COMP, "bootstrap_abort_send_failed room=%llu err=%s", (unsigned long long)room,
                 baton_strerror(rc));
}

static void write_cb(uv_write_t *req, int status)
{
    write_req_t *wr = container_of(req, write_req_t, req);
    wk_boot_pub_t *pub = wr->pub;
    free(wr);
    if (pub == NULL)
        return;
    pub->wr = NULL;
    wk_boot_t *b = pub->boot;
    if (status == 0)
        b->stats.rooms_done++;
    else
        b->stats.rooms_failed++;
    pub->cb(pub, status);
}

/* ---- connections ---- */

static void conn_close(conn_t *c, const char *why, int err);

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    buf->base = c->boot->scratch;
    buf->len = sizeof(c->boot->scratch);
}

static void handle_closed(wk_boot_t *b)
{
    if (--b->open_handles == 0 && b->closing) {
        wk_roommap_free(&b->prooms);
        wk_roommap_free(&b->waits);
        void (*cb)(void *) = b->close_cb;
        void *arg = b->close_arg;
        free(b);
        if (cb)
            cb(arg);
    }
}

/* ---- prefill side ---- */

static void proom_free(wk_boot_t *b, proom_t *r)
{
    tl_remove(&b->ptimeouts, &r->tn);
    wk_roommap_del(&b->prooms, r->room);
    free(r);
}

/* Turns the room into a tombstone for one timeout period. */
static void proom_abort(wk_boot_t *b, proom_t *r)
{
    r->state = ROOM_ABORTED;
    r->pub = NULL;
    r->waiter = NULL;
    tl_insert(&b->ptimeouts, &r->tn, uv_now(b->loop) + b->timeout_ms);
    arm_timer(b);
}

/* Both halves are there: send DONE and forget the room. */
static void proom_handoff(wk_boot_t *b, proom_t *r, conn_t *c, wk_boot_pub_t *pub)
{
    wk_frame_t f = {.type = WK_FRAME_DONE,
                    .room = r->room,
                    .status = 0,
                    .prompt_tokens = pub->res.prompt_tokens,
                    .first_token = pub->res.first_token};
    pub->entry = NULL;
    proom_free(b, r);
    int rc = send_frame(c, &f, pub);
    if (rc != 0) {
        /* we are in a read callback, so reporting here is not inside the publisher's call */
        log_warn(COMP, "bootstrap_done_send_failed room=%llu err=%s", (unsigned long long)f.room,
                 baton_strerror(rc));
        b->stats.rooms_failed++;
        pub->cb(pub, rc);
    }
}

static void on_wait_frame(conn_t *c, uint64_t room)
{
    wk_boot_t *b = c->boot;
    proom_t *r = wk_roommap_get(&b->prooms, room);
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || wk_roommap_put(&b->prooms, room, r) != 0) {
            free(r);
            send_abort(c, room, BATON_ENOMEM);
            return;
        }
        r->room = room;
        r->state = ROOM_WAITING;
        r->waiter = c;
        tl_insert(&b->ptimeouts, &r->tn, uv_now(b->loop) + 2 * b->timeout_ms);
        arm_timer(b);
        log_debug(COMP, "bootstrap_wait room=%llu", (unsigned long long)room);
        return;
    }
    switch (r->state) {
    case ROOM_READY:
        proom_handoff(b, r, c, r->pub);
        break;
    case ROOM_ABORTED:
        send_abort(c, room, BATON_EABORTED);
        break;
    case ROOM_WAITING:
        /* a second decode for the same room: refuse it, keep the first */
        send_abort(c, room, BATON_EEXIST);
        break;
    }
}

static void on_abort_frame_prefill(conn_t *c, uint64_t room)
{
    wk_boot_t *b = c->boot;
    proom_t *r = wk_roommap_get(&b->prooms, room);
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || wk_roommap_put(&b->prooms, room, r) != 0) {
            free(r);
            return;
        }
        r->room = room;
        proom_abort(b, r);
        return;
    }
    if (r->state == ROOM_WAITING && r->waiter != c)
        return; /* not this peer's room */
    wk_boot_pub_t *pub = r->state == ROOM_READY ? r->pub : NULL;
    proom_abort(b, r);
    log_info(COMP, "bootstrap_room_aborted room=%llu by=decode", (unsigned long long)room);
    if (pub) {
        pub->entry = NULL;
        b->stats.rooms_failed++;
        pub->cb(pub, BATON_EABORTED);
    }
}

int wk_boot_publish(wk_boot_t *b, wk_boot_pub_t *pub, uint64_t room, const wk_boot_result_t *res,
                    wk_boot_pub_cb cb)
{
    pub->boot = b;
    pub->room = room;
    pub->res = *res;
    pub->cb = cb;
    pub->entry = NULL;
    pub->wr = NULL;
    if (b->closing)
        return BATON_ESHUTDOWN;
    proom_t *r = wk_roommap_get(&b->prooms, room);
    if (r != NULL) {
        if (r->state == ROOM_READY)
            return BATON_EEXIST;
        if (r->state == ROOM_ABORTED)
            return BATON_EABORTED;
        /* WAITING: the decode is already here. The DONE write completes the publish later. */
        conn_t *c = r->waiter;
        wk_frame_t f = {.type = WK_FRAME_DONE,
                        .room = room,
                        .prompt_tokens = res->prompt_tokens,
                        .first_token = res->first_token};
        int rc = send_frame(c, &f, pub);
        if (rc != 0)
            return rc == BATON_ENOMEM ? rc : BATON_EPEERDOWN;
        proom_free(b, r);
        return 0;
    }
    r = calloc(1, sizeof(*r));
    if (r == NULL)
        return BATON_ENOMEM;
    if (wk_roommap_put(&b->prooms, room, r) != 0) {
        free(r);
        return BATON_ENOMEM;
    }
    r->room = room;
    r->state = ROOM_READY;
    r->pub = pub;
    pub->entry = r;
    tl_insert(&b->ptimeouts, &r->tn, uv_now(b->loop) + b->timeout_ms);
    arm_timer(b);
    return 0;
}

void wk_boot_publish_cancel(wk_boot_pub_t *pub)
{
    wk_boot_t *b = pub->boot;
    if (pub->entry) {
        proom_t *r = pub->entry;
        pub->entry = NULL;
        proom_abort(b, r);
    }
    if (pub->wr) {
        /* DONE is already on its way: the room was handed off, nothing to take back */
        ((write_req_t *)pub->wr)->pub = NULL;
        pub->wr = NULL;
    }
}

void wk_boot_abort(wk_boot_t *b, uint64_t room, int reason)
{
    if (b->closing)
        return;
    proom_t *r = wk_roommap_get(&b->prooms, room);
    if (r == NULL) {
        r = calloc(1, sizeof(*r));
        if (r == NULL || wk_roommap_put(&b->prooms, room, r) != 0) {
            free(r);
            return; /* the decode falls back on its own timeout */
        }
        r->room = room;
        proom_abort(b, r);
        return;
    }
    if (r->state == ROOM_WAITING) {
        send_abort(r->waiter, room, reason);
        proom_abort(b, r);
        log_info(COMP, "bootstrap_room_aborted room=%llu by=prefill reason=\"%s\"",
                 (unsigned long long)room, baton_strerror(reason));
    }
}

/* A prefill-side connection went away: rooms it was waiting for are forgotten. */
static void drop_waiters_of(wk_boot_t *b, conn_t *c)
{
    size_t n = 0;
    for (size_t i = 0; i < b->prooms.cap; i++) {
        proom_t *r = b->prooms.slots[i].val;
        if (r && r->state == ROOM_WAITING && r->waiter == c)
            n++;
    }
    if (n == 0)
        return;
    uint64_t *rooms = malloc(n * sizeof(*rooms));
    if (rooms == NULL) {
        /* cannot collect them: detach instead so nothing points at the closed connection */
        for (size_t i = 0; i < b->prooms.cap; i++) {
            proom_t *r = b->prooms.slots[i].val;
            if (r && r->state == ROOM_WAITING && r->waiter == c)
                r->state = ROOM_ABORTED, r->waiter = NULL;
        }
        return;
    }
    size_t k = 0;
    for (size_t i = 0; i < b->prooms.cap && k < n; i++) {
        proom_t *r = b->prooms.slots[i].val;
        if (r && r->state == ROOM_WAITING && r->waiter == c)
            rooms[k++] = r->room;
    }
    for (size_t i = 0; i < k; i++) {
        proom_t *r = wk_roommap_get(&b->prooms, rooms[i]);
        if (r)
            proom_free(b, r);
    }
    free(rooms);
}

/* ---- decode side ---- */

static void peer_unlink_wait(peer_t *p, wk_boot_wait_t *w)
{
    if (w->prev)
        w->prev->next = w->next;
    else
        p->waits_head = w->next;
    if (w->next)
        w->next->prev = w->prev;
    else
        p->waits_tail = w->prev;
    w->prev = w->next = NULL;
}

/* Takes the wait out of every structure; the caller then reports or forgets it. */
static void wait_detach(wk_boot_wait_t *w)
{
    wk_boot_t *b = w->boot;
    peer_t *p = w->peer;
    if (p)
        peer_unlink_wait(p, w);
    w->peer = NULL;
    tl_remove(&b->wtimeouts, &w->tn);
    wk_roommap_del(&b->waits, w->room);
}

static void wait_fail(wk_boot_wait_t *w, int status)
{
    wk_boot_t *b = w->boot;
    wait_detach(w);
    b->stats.rooms_failed++;
    w->cb(w, status, NULL);
}

static void peer_send_wait(peer_t *p, wk_boot_wait_t *w)
{
    wk_frame_t f = {.type = WK_FRAME_WAIT, .room = w->room};
    int rc = send_frame(&p->c, &f, NULL);
    if (rc != 0)
        log_warn(COMP, "bootstrap_wait_send_failed room=%llu err=%s", (unsigned long long)w->room,
                 baton_strerror(rc));
    else
        w->sent = 1;
}

/* Fails every wait of the peer and closes it; new waits will open a fresh connection. */
static void peer_fail(peer_t *p, int status, const char *why)
{
    wk_boot_t *b = p->c.boot;
    if (p->state == PEER_CLOSING)
        return;
    log_warn(COMP, "bootstrap_peer_down peer=%s:%d reason=%s err=%s", p->host, p->port, why,
             baton_strerror(status));
    p->state = PEER_CLOSING;
    if (p->prev)
        p->prev->next = p->next;
    else if (b->peers == p)
        b->peers = p->next;
    if (p->next)
        p->next->prev = p->prev;
    p->prev = p->next = NULL;
    wk_boot_wait_t *w;
    while ((w = p->waits_head) != NULL)
        wait_fail(w, status);
    conn_close(&p->c, why, status);
}

static void on_frame_decode(peer_t *p, const wk_frame_t *f)
{
    wk_boot_t *b = p->c.boot;
    wk_boot_wait_t *w = wk_roommap_get(&b->waits, f->room);
    if (w == NULL || w->peer != p) {
        log_debug(COMP, "bootstrap_unknown_room room=%llu type=%s", (unsigned long long)f->room,
                  wk_frame_type_name(f->type));
        return;
    }
    if (f->type == WK_FRAME_DONE && f->status == 0) {
        wk_boot_result_t res = {.prompt_tokens = f->prompt_tokens, .first_token = f->first_token};
        wait_detach(w);
        b->stats.rooms_done++;
        w->cb(w, 0, &res);
        return;
    }
    /* the prefill gave up waiting: report it as the timeout it is */
    int status = f->status == BATON_ETIMEOUT ? BATON_ETIMEOUT : BATON_EABORTED;
    if (f->type == WK_FRAME_DONE)
        status = f->status < 0 ? f->status : BATON_EPROTO;
    log_info(COMP, "bootstrap_room_failed room=%llu by=prefill frame=%s reason=\"%s\"",
             (unsigned long long)f->room, wk_frame_type_name(f->type), baton_strerror(f->status));
    wait_fail(w, status);
}

static void on_frame(conn_t *c, const wk_frame_t *f)
{
    if (c->is_peer) {
        peer_t *p = (peer_t *)c;
        if (f->type == WK_FRAME_WAIT) {
            c->boot->stats.proto_errors++;
            peer_fail(p, BATON_EPROTO, "unexpected WAIT from prefill");
            return;
        }
        on_frame_decode(p, f);
        return;
    }
    if (f->type == WK_FRAME_WAIT) {
        on_wait_frame(c, f->room);
    } else if (f->type == WK_FRAME_ABORT) {
        on_abort_frame_prefill(c, f->room);
    } else {
        c->boot->stats.proto_errors++;
        conn_close(c, "unexpected DONE from decode", BATON_EPROTO);
    }
}

static void read_cb(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (c->is_peer)
            peer_fail((peer_t *)c, BATON_EPEERDOWN,
                      nread == UV_EOF ? "closed by prefill" : uv_err_name((int)nread));
        else
            conn_close(c, nread == UV_EOF ? "closed by peer" : uv_err_name((int)nread), 0);
        return;
    }
    if (nread == 0)
        return;
    if (baton_buf_append(&c->in, buf->base, (size_t)nread) != 0) {
        if (c->is_peer)
            peer_fail((peer_t *)c, BATON_ENOMEM, "out of memory");
        else
            conn_close(c, "out of memory", BATON_ENOMEM);
        return;
    }
    size_t off = 0;
    while (!c->closing && off < c->in.len) {
        wk_frame_t f;
        const char *why = NULL;
        int n = wk_frame_decode((const uint8_t *)c->in.data + off, c->in.len - off, &f, &why);
        if (n == 0)
            break;
        if (n < 0) {
            c->boot->stats.proto_errors++;
            if (c->is_peer)
                peer_fail((peer_t *)c, BATON_EPROTO, why);
            else
                conn_close(c, why, BATON_EPROTO);
            return;
        }
        off += (size_t)n;
        on_frame(c, &f);
    }
    if (!c->closing)
        baton_buf_consume(&c->in, off);
}

static void conn_closed_cb(uv_handle_t *h)
{
    conn_t *c = h->data;
    wk_boot_t *b = c->boot;
    baton_buf_free(&c->in);
    free(c); /* peer_t starts with its conn_t */
    handle_closed(b);
}

static void conn_close(conn_t *c, const char *why, int err)
{
    if (c->closing)
        return;
    c->closing = 1;
    wk_boot_t *b = c->boot;
    if (!c->is_peer) {
        log_info(COMP, "bootstrap_conn_closed reason=\"%s\"%s%s", why, err ? " err=" : "",
                 err ? baton_strerror(err) : "");
        if (c->prev)
            c->prev->next = c->next;
        else if (b->conns == c)
            b->conns = c->next;
        if (c->next)
            c->next->prev = c->prev;
        drop_waiters_of(b, c);
        if (c->counted)
            b->stats.connections--;
        uv_close((uv_handle_t *)&c->tcp, conn_closed_cb);
        return;
    }
    peer_t *p = (peer_t *)c;
    if (c->counted)
        b->stats.connections--;
    c->counted = 0;
    if (p->tcp_inited) {
        uv_close((uv_handle_t *)&c->tcp, conn_closed_cb);
    } else if (p->pending_ops == 0) {
        baton_buf_free(&c->in);
        free(p);
        handle_closed(b);
    } else {
        uv_cancel((uv_req_t *)&p->gai); /* the resolve callback frees it */
    }
}

static void connection_cb(uv_stream_t *server, int status)
{
    wk_boot_t *b = server->data;
    if (status < 0) {
        log_warn(COMP, "bootstrap_accept_failed err=%s", uv_strerror(status));
        return;
    }
    conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        log_error(COMP, "bootstrap_accept_failed err=%s", baton_strerror(BATON_ENOMEM));
        return;
    }
    c->boot = b;
    if (uv_tcp_init(b->loop, &c->tcp) != 0) {
        free(c);
        return;
    }
    c->tcp.data = c;
    b->open_handles++;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->closing = 1;
        uv_close((uv_handle_t *)&c->tcp, conn_closed_cb);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    c->next = b->conns;
    if (b->conns)
        b->conns->prev = c;
    b->conns = c;
    c->counted = 1;
    b->stats.connections++;
    int rc = uv_read_start((uv_stream_t *)&c->tcp, alloc_cb, read_cb);
    if (rc != 0)
        conn_close(c, "read_start failed", rc);
}

/* ---- decode side: peers ---- */

static void connect_cb(uv_connect_t *req, int status)
{
    peer_t *p = req->data;
    p->pending_ops--;
    if (p->state == PEER_CLOSING)
        return; /* closed meanwhile (status is UV_ECANCELED); conn_closed_cb frees it */
    if (status != 0) {
        peer_fail(p, status, "connect failed");
        return;
    }
    wk_boot_t *b = p->c.boot;
    p->state = PEER_CONNECTED;
    p->c.counted = 1;
    b->stats.connections++;
    uv_tcp_nodelay(&p->c.tcp, 1);
    int rc = uv_read_start((uv_stream_t *)&p->c.tcp, alloc_cb, read_cb);
    if (rc != 0) {
        peer_fail(p, rc, "read_start failed");
        return;
    }
    log_info(COMP, "bootstrap_peer_connected peer=%s:%d", p->host, p->port);
    for (wk_boot_wait_t *w = p->waits_head; w; w = w->next)
        if (!w->sent)
            peer_send_wait(p, w);
}

/* Starts connecting; a negative return means nothing is pending (the caller cleans up). */
static int peer_connect(peer_t *p, const struct sockaddr *addr)
{
    wk_boot_t *b = p->c.boot;
    int rc = uv_tcp_init(b->loop, &p->c.tcp);
    if (rc != 0)
        return rc;
    p->tcp_inited = 1;
    p->c.tcp.data = &p->c;
    p->connect_req.data = p;
    rc = uv_tcp_connect(&p->connect_req, &p->c.tcp, addr, connect_cb);
    if (rc != 0)
        return rc;
    p->state = PEER_CONNECTING;
    p->pending_ops++;
    return 0;
}

static void resolve_cb(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    peer_t *p = req->data;
    p->pending_ops--;
    if (p->state == PEER_CLOSING) {
        uv_freeaddrinfo(res);
        if (!p->tcp_inited && p->pending_ops == 0) {
            wk_boot_t *b = p->c.boot;
            baton_buf_free(&p->c.in);
            free(p);
            handle_closed(b);
        }
        return;
    }
    if (status != 0 || res == NULL) {
        uv_freeaddrinfo(res);
        peer_fail(p, status ? status : UV_EAI_NONAME, "resolve failed");
        return;
    }
    int rc = peer_connect(p, res->ai_addr);
    uv_freeaddrinfo(res);
    if (rc != 0)
        peer_fail(p, rc, "connect failed");
}

static peer_t *peer_get(wk_boot_t *b, const char *host, int port, int *err)
{
    for (peer_t *p = b->peers; p; p = p->next)
        if (p->port == port && strcmp(p->host, host) == 0)
            return p;
    if (strlen(host) >= sizeof(((peer_t *)0)->host)) {
        *err = BATON_EINVAL;
        return NULL;
    }
    peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        *err = BATON_ENOMEM;
        return NULL;
    }
    p->c.boot = b;
    p->c.is_peer = 1;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    b->open_handles++; /* released in conn_closed_cb or when freed without a handle */
    p->next = b->peers;
    if (b->peers)
        b->peers->prev = p;
    b->peers = p;

    struct sockaddr_storage ss;
    const char *lit = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    int rc;
    if (uv_ip4_addr(lit, port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(lit, port, (struct sockaddr_in6 *)&ss) == 0) {
        rc = peer_connect(p, (struct sockaddr *)&ss);
    } else {
        p->state = PEER_RESOLVING;
        p->gai.data = p;
        char portstr[16];
        snprintf(portstr, sizeof(portstr), "%d", port);
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        rc = uv_getaddrinfo(b->loop, &p->gai, resolve_cb, host, portstr, &hints);
        if (rc == 0)
            p->pending_ops++;
    }
    if (rc != 0) {
        /* no wait is attached yet: drop the peer quietly, the caller gets the error */
        peer_fail(p, rc, "connect failed");
        *err = rc;
        return NULL;
    }
    return p;
}

int wk_boot_wait(wk_boot_t *b, wk_boot_wait_t *w, const char *host, int port, uint64_t room,
                 wk_boot_wait_cb cb)
{
    memset(&w->tn, 0, sizeof(w->tn));
    w->boot = b;
    w->peer = NULL;
    w->prev = w->next = NULL;
    w->room = room;
    w->cb = cb;
    w->sent = 0;
    if (b->closing)
        return BATON_ESHUTDOWN;
    if (host == NULL || port <= 0 || port > 65535)
        return BATON_EINVAL;
    if (wk_roommap_get(&b->waits, room) != NULL)
        return BATON_EEXIST;
    int rc = wk_roommap_put(&b->waits, room, w);
    if (rc != 0)
        return rc;
    int err = 0;
    peer_t *p = peer_get(b, host, port, &err);
    if (p == NULL) {
        wk_roommap_del(&b->waits, room);
        return err;
    }
    w->peer = p;
    w->prev = p->waits_tail;
    if (p->waits_tail)
        p->waits_tail->next = w;
    else
        p->waits_head = w;
    p->waits_tail = w;
    tl_insert(&b->wtimeouts, &w->tn, uv_now(b->loop) + b->timeout_ms);
    arm_timer(b);
    if (p->state == PEER_CONNECTED)
        peer_send_wait(p, w);
    return 0;
}

void wk_boot_wait_cancel(wk_boot_wait_t *w)
{
    peer_t *p = w->peer;
    if (p == NULL)
        return; /* already reported */
    if (p->state == PEER_CONNECTED && w->sent)
        send_abort(&p->c, w->room, BATON_ECANCELED);
    wait_detach(w);
}

/* ---- timer ---- */

static void timer_cb(uv_timer_t *t)
{
    wk_boot_t *b = t->data;
    uint64_t now = uv_now(b->loop);
    wk_boot_tnode_t *n;
    while ((n = b->ptimeouts.head) != NULL && n->deadline_ms <= now) {
        proom_t *r = container_of(n, proom_t, tn);
        if (r->state == ROOM_READY) {
            wk_boot_pub_t *pub = r->pub;
            log_warn(COMP, "bootstrap_room_timeout room=%llu side=prefill waited_ms=%llu",
                     (unsigned long long)r->room, (unsigned long long)b->timeout_ms);
            pub->entry = NULL;
            proom_abort(b, r); /* a late WAIT learns at once that the room is gone */
            b->stats.rooms_failed++;
            pub->cb(pub, BATON_ETIMEOUT);
        } else {
            /* WAITING entries live twice as long, so the decode's own timeout (and its ABORT)
             * normally comes first; this only cleans up after a decode that went silent */
            if (r->state == ROOM_WAITING && r->waiter)
                send_abort(r->waiter, r->room, BATON_ETIMEOUT);
            proom_free(b, r);
        }
    }
    while ((n = b->wtimeouts.head) != NULL && n->deadline_ms <= now) {
        wk_boot_wait_t *w = container_of(n, wk_boot_wait_t, tn);
        peer_t *p = w->peer;
        log_warn(COMP, "bootstrap_room_timeout room=%llu side=decode peer=%s:%d",
                 (unsigned long long)w->room, p ? p->host : "?", p ? p->port : 0);
        if (p && p->state == PEER_CONNECTED && w->sent)
            send_abort(&p->c, w->room, BATON_ETIMEOUT);
        wait_fail(w, BATON_ETIMEOUT);
    }
    arm_timer(b);
}

/* ---- module ---- */

int wk_boot_create(wk_boot_t **b_p, uv_loop_t *loop, uint64_t timeout_ms)
{
    wk_boot_t *b = calloc(1, sizeof(*b));
    if (b == NULL)
        return BATON_ENOMEM;
    b->loop = loop;
    b->timeout_ms = timeout_ms;
    int rc = uv_timer_init(loop, &b->timer);
    if (rc != 0) {
        free(b);
        return rc;
    }
    b->timer.data = b;
    b->open_handles = 1;
    *b_p = b;
    return 0;
}

int wk_boot_listen(wk_boot_t *b, const char *host, int port)
{
    struct sockaddr_storage ss;
    const char *lit = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    if (uv_ip4_addr(lit, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(lit, port, (struct sockaddr_in6 *)&ss) != 0)
        return BATON_EINVAL;
    int rc = uv_tcp_init(b->loop, &b->listener);
    if (rc != 0)
        return rc;
    b->listener.data = b;
    b->open_handles++;
    b->listening = 1;
    if ((rc = uv_tcp_bind(&b->listener, (struct sockaddr *)&ss, 0)) != 0 ||
        (rc = uv_listen((uv_stream_t *)&b->listener, 511, connection_cb)) != 0)
        return rc; /* the listener is closed by wk_boot_close */
    struct sockaddr_storage name;
    int namelen = sizeof(name);
    if ((rc = uv_tcp_getsockname(&b->listener, (struct sockaddr *)&name, &namelen)) != 0)
        return rc;
    b->port = ntohs(name.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&name)->sin6_port
                                               : ((struct sockaddr_in *)&name)->sin_port);
    return 0;
}

int wk_boot_port(const wk_boot_t *b)
{
    return b->port;
}

void wk_boot_get_stats(const wk_boot_t *b, wk_boot_stats_t *out)
{
    *out = b->stats;
}

static void simple_closed_cb(uv_handle_t *h)
{
    handle_closed(h->data);
}

void wk_boot_close(wk_boot_t *b, void (*close_cb)(void *arg), void *arg)
{
    if (b->closing)
        return;
    b->close_cb = close_cb;
    b->close_arg = arg;
    /* Report what is still pending before the handles go away. */
    wk_boot_tnode_t *n;
    while ((n = b->ptimeouts.head) != NULL) {
        proom_t *r = container_of(n, proom_t, tn);
        wk_boot_pub_t *pub = r->state == ROOM_READY ? r->pub : NULL;
        proom_free(b, r);
        if (pub) {
            pub->entry = NULL;
            pub->cb(pub, BATON_ESHUTDOWN);
        }
    }
    while ((n = b->wtimeouts.head) != NULL)
        wait_fail(container_of(n, wk_boot_wait_t, tn), BATON_ESHUTDOWN);
    b->closing = 1;
    uv_timer_stop(&b->timer);
    uv_close((uv_handle_t *)&b->timer, simple_closed_cb);
    if (b->listening)
        uv_close((uv_handle_t *)&b->listener, simple_closed_cb);
    while (b->conns)
        conn_close(b->conns, "shutdown", 0);
    while (b->peers)
        peer_fail(b->peers, BATON_ESHUTDOWN, "shutdown");
}
