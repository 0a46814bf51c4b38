/* transfer/ctrl_conn.c — control connections: accept, read and dispatch frames with per-state
 * rules, send, heartbeats, and the one-way failure path (close, fence, fail rooms). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

#define B(s)  BATON_PHASE_BIT(s)
#define CLOSE B(BATON__CONN_CLOSING)
static const uint32_t conn_legal[BATON__CONN_N_STATES] = {
    [BATON__CONN_NEW] = B(BATON__CONN_PENDING) | B(BATON__CONN_CONNECTING) | CLOSE,
    [BATON__CONN_CONNECTING] = B(BATON__CONN_AUTH) | B(BATON__CONN_HELLO) | CLOSE,
    [BATON__CONN_PENDING] = B(BATON__CONN_AUTH) | B(BATON__CONN_HELLO) | CLOSE,
    [BATON__CONN_AUTH] = B(BATON__CONN_PENDING) | B(BATON__CONN_HELLO) | CLOSE,
    [BATON__CONN_HELLO] = B(BATON__CONN_TP_CONNECT) | B(BATON__CONN_UP) | CLOSE,
    /* A transport that refuses the peer hands over to the next one offered. */
    [BATON__CONN_TP_CONNECT] = B(BATON__CONN_TP_CONNECT) | B(BATON__CONN_UP) | CLOSE,
    [BATON__CONN_UP] = CLOSE,
};
#undef CLOSE
#undef B
static const char *const conn_names[BATON__CONN_N_STATES] = {
    [BATON__CONN_NEW] = "new",
    [BATON__CONN_PENDING] = "pending",
    [BATON__CONN_CONNECTING] = "connecting",
    [BATON__CONN_HELLO] = "hello",
    [BATON__CONN_TP_CONNECT] = "transport_connect",
    [BATON__CONN_UP] = "up",
    [BATON__CONN_CLOSING] = "closing",
    [BATON__CONN_AUTH] = "auth",
};
const baton_phase_table_t baton__conn_phases = {BATON__LOG, "conn", BATON__CONN_N_STATES,
                                                conn_legal, conn_names};

static const char *role_name(int role)
{
    return role == BATON__ROLE_DECODE ? "decode" : "prefill";
}

baton__conn_t *baton__conn_new(baton_xfer_engine_t *eng, int role)
{
    baton__conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    c->tcp = malloc(sizeof(*c->tcp));
    if (c->tcp == NULL) {
        free(c);
        return NULL;
    }
    uv_tcp_init(&eng->ploop, c->tcp);
    c->tcp->data = c;
    c->eng = eng;
    c->role = role;
    c->gen = eng->next_gen++;
    c->tp_index = -1;
    c->rbuf = (baton_buf_t)BATON_BUF_INIT;
    c->t_start_ms = baton_now_ms();
    baton_u64map_init(&c->rooms);
    baton_u64map_init(&c->rmems);
    baton_u64map_init(&c->smems);
    baton_heartbeat_init(&c->hb, eng->cfg.heartbeat_interval_ms, eng->cfg.heartbeat_misses,
                         c->t_start_ms);
    snprintf(c->addr, sizeof(c->addr), "?");
    snprintf(c->ip, sizeof(c->ip), "?");
    baton_list_push(&eng->conns, &c->link);
    return c;
}

static void fill_addr(baton__conn_t *c)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    if (uv_tcp_getpeername(c->tcp, (struct sockaddr *)&ss, &len) != 0)
        return;
    char *ip = c->ip;
    int port = 0;
    if (ss.ss_family == AF_INET) {
        uv_ip4_name((struct sockaddr_in *)&ss, ip, sizeof(c->ip));
        port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
        snprintf(c->addr, sizeof(c->addr), "%s:%d", ip, port);
    } else if (ss.ss_family == AF_INET6) {
        uv_ip6_name((struct sockaddr_in6 *)&ss, ip, sizeof(c->ip));
        port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
        snprintf(c->addr, sizeof(c->addr), "[%s]:%d", ip, port);
    }
}

/* ---- sending ------------------------------------------------------------------------------ */

typedef struct {
    uv_write_t req;
    baton__conn_t *conn;
    char *data;
} send_req_t;

static void on_sent(uv_write_t *req, int status)
{
    send_req_t *s = container_of(req, send_req_t, req);
    baton__conn_t *c = s->conn;
    free(s->data);
    free(s);
    if (status < 0 && status != UV_ECANCELED)
        baton__conn_fail(c, BATON_EPEERDOWN, uv_strerror(status));
    else if (c->close_after_send)
        baton__conn_fail(c, BATON_ENOTSUP, "handshake refused");
}

void baton__conn_send(baton__conn_t *conn, baton_buf_t *buf)
{
    if (buf->len == 0)
        return;
    if (conn->state == BATON__CONN_CLOSING || conn->tcp == NULL) {
        baton_buf_reset(buf);
        return;
    }
    send_req_t *s = malloc(sizeof(*s));
    if (s == NULL) {
        baton_buf_reset(buf);
        baton__conn_fail(conn, BATON_ENOMEM, "out of memory sending a frame");
        return;
    }
    size_t len;
    s->data = baton_buf_steal(buf, &len);
    s->conn = conn;
    uv_buf_t b = uv_buf_init(s->data, (unsigned)len);
    int rc = uv_write(&s->req, (uv_stream_t *)conn->tcp, &b, 1, on_sent);
    if (rc != 0) {
        free(s->data);
        free(s);
        baton__conn_fail(conn, BATON_EPEERDOWN, uv_strerror(rc));
    }
}

/* ---- failure ------------------------------------------------------------------------------ */

static void conn_finish(baton__conn_t *c)
{
    baton_xfer_engine_t *eng = c->eng;
    int status = c->fail_status;
    if (c->role == BATON__ROLE_DECODE) {
        size_t it = 0;
        baton__droom_t *dr;
        while ((dr = baton_u64map_next(&c->rooms, &it, NULL)) != NULL) {
            /* The transport is fenced: nothing can land in these pages anymore. */
            dr->conn = NULL;
            baton__droom_finish(dr, dr->state == BATON__DR_ABORTING ? dr->abort_status : status);
        }
    } else {
        baton__proom_close_all(c, status);
    }
    if (c->tp_peer != NULL) {
        c->tp_peer->tp->ops->peer_destroy(c->tp_peer);
        c->tp_peer = NULL;
    }
    size_t it = 0;
    baton__rmem_t *rm;
    while ((rm = baton_u64map_next(&c->rmems, &it, NULL)) != NULL)
        free(rm);
    baton_u64map_free(&c->rmems);
    baton_u64map_free(&c->smems);
    baton_u64map_free(&c->rooms);
    baton__admit_release(c);
    baton_buf_free(&c->rbuf);
    free(c->peer_hello);
    free(c->peer_hello_buf);
    baton_list_remove(&c->link);
    free(c);
    baton__maybe_finish_shutdown(eng);
}

static void pending_done(baton__conn_t *c)
{
    if (--c->pending == 0)
        conn_finish(c);
}

static void on_tcp_closed(uv_handle_t *h)
{
    baton__conn_t *c = h->data;
    free(h);
    if (c == NULL)
        return;
    c->tcp = NULL;
    pending_done(c);
}

static void on_fenced(baton__tp_peer_t *tpp, int status, void *arg)
{
    baton__conn_t *c = arg;
    if (status != 0)
        log_warn(BATON__LOG, "fence_failed peer=%s err=%s", c->addr, baton_err_name(status));
    pending_done(c);
}

static void finish_deferred(void *arg)
{
    pending_done(arg);
}

void baton__conn_fail(baton__conn_t *c, int status, const char *why)
{
    if (c->state == BATON__CONN_CLOSING)
        return;
    baton_xfer_engine_t *eng = c->eng;
    baton__conn_state_t prev = c->state;
    (void)BATON__CONN_MOVE(c, BATON__CONN_CLOSING);
    c->fail_status = status;
    c->pending = 1; /* released by finish_deferred: conn_finish never runs inside this call */

    if (c->role == BATON__ROLE_DECODE && prev != BATON__CONN_UP) {
        /* A failed attempt: the peer state machine logs it once, with its retry delay. */
        log_debug(BATON__LOG, "attempt_failed peer=%s state=%s reason=\"%s\"", c->addr,
                  baton_phase_name(&baton__conn_phases, prev), why);
    } else if (status == BATON_EAUTH || status == BATON_EBUSY) {
        /* ctrl_auth.c / ctrl_admit.c's callers logged the refusal, rate-limited: an outsider can
         * repeat it at will. */
        log_debug(BATON__LOG, "conn_closed peer=%s reason=\"%s\"", c->addr, why);
    } else if (status == BATON_ESHUTDOWN) {
        log_info(BATON__LOG, "conn_closed peer=%s reason=\"%s\"", c->addr, why);
    } else if (prev == BATON__CONN_PENDING || prev == BATON__CONN_AUTH) {
        /* Anyone who reaches the port can open and drop connections at will. */
        baton_log_limited(BATON_LOG_INFO, 10, BATON__LOG, "conn_closed",
                          "conn_closed peer=%s reason=\"%s\"", c->addr, why);
    } else {
        /* A peer that goes with no room in flight (its process ended) lost nothing. */
        baton_log(c->rooms.count ? BATON_LOG_WARN : BATON_LOG_INFO, BATON__LOG,
                  "peer_down role=%s peer=%s id=%s incarnation=%016llx state=%s err=%s "
                  "reason=\"%s\" rooms=%zu",
                  role_name(c->role), c->peer ? c->peer->endpoint : c->addr,
                  c->remote_id[0] ? c->remote_id : "-", (unsigned long long)c->remote_inc,
                  baton_phase_name(&baton__conn_phases, prev), baton_err_name(status), why,
                  c->rooms.count);
    }
    if (prev == BATON__CONN_UP)
        atomic_fetch_sub(&eng->st_peers_up, 1);
    if (c->role == BATON__ROLE_PREFILL && c->reported_up)
        baton__post_peer_event(
            eng, c->addr, c->remote_id, c->remote_inc, BATON_XFER_PEER_GONE,
            c->tp_index >= 0 ? eng->tp_ids[c->tp_index] : BATON_XFER_TRANSPORT_NONE, status, 0);

    if (c->tcp != NULL) {
        c->pending++;
        uv_close((uv_handle_t *)c->tcp, on_tcp_closed);
    }
    if (c->role == BATON__ROLE_DECODE) {
        size_t it = 0;
        baton__droom_t *dr;
        while ((dr = baton_u64map_next(&c->rooms, &it, NULL)) != NULL)
            if (dr->state != BATON__DR_ABORTING && dr->state != BATON__DR_FAILING)
                (void)BATON__DR_MOVE(dr, BATON__DR_FAILING);
    }
    for (int i = 0; i < BATON__MAX_TP; i++) {
        if (c->cand[i] != NULL) {
            c->cand[i]->tp->ops->peer_destroy(c->cand[i]);
            c->cand[i] = NULL;
        }
    }
    if (c->tp_peer != NULL) {
        c->pending++;
        int rc = c->tp_peer->tp->ops->peer_fence(c->tp_peer, on_fenced, c);
        if (rc != 0) {
            log_error(BATON__LOG, "fence_refused peer=%s err=%s", c->addr, baton_err_name(rc));
            c->pending--;
        }
    }
    if (c->peer != NULL)
        baton__peer_on_conn_failed(c->peer, c, status, why);
    if (baton__tp_defer(&eng->env, finish_deferred, c) != 0)
        pending_done(c); /* no memory to defer: finishing now is still correct, only early */
}

/* ---- reading ------------------------------------------------------------------------------ */

static void alloc_cb(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    baton__conn_t *c = h->data;
    if (baton__admit_reserve(c) != 0) {
        buf->base = NULL;
        buf->len = 0;
        return;
    }
    buf->base = c->rbuf.data + c->rbuf.len;
    buf->len = c->rbuf.cap - c->rbuf.len - 1;
}

/* Frames allowed per (role, state); everything else closes the connection. */
static int allowed(const baton__conn_t *c, int type)
{
    if (c->state == BATON__CONN_AUTH)
        return type == BATON__F_AUTH;
    if (c->state == BATON__CONN_PENDING) {
        /* After the challenge-response only the authenticated peer's HELLO. AUTH and HELLO
         * out of turn are let through to be refused as authentication failures (counted). */
        if (c->authed)
            return type == BATON__F_HELLO;
        return type == BATON__F_HELLO || type == BATON__F_LANE_HELLO || type == BATON__F_AUTH;
    }
    if (c->role == BATON__ROLE_DECODE) {
        switch (c->state) {
        case BATON__CONN_HELLO:
            return type == BATON__F_HELLO;
        case BATON__CONN_TP_CONNECT:
            return type == BATON__F_HEARTBEAT;
        case BATON__CONN_UP:
            return type == BATON__F_DONE || type == BATON__F_ABORT || type == BATON__F_ABORT_ACK ||
                   type == BATON__F_HEARTBEAT || type == BATON__F_LAYER_DONE ||
                   /* pull by RDMA READ: the holder's source regions and its grants */
                   type == BATON__F_GRANT || type == BATON__F_MEM || type == BATON__F_MEM_DEL;
        default:
            return 0;
        }
    }
    switch (c->state) {
    case BATON__CONN_TP_CONNECT:
        return type == BATON__F_HEARTBEAT;
    case BATON__CONN_UP:
        return type == BATON__F_OFFER || type == BATON__F_ABORT || type == BATON__F_ABORT_ACK ||
               type == BATON__F_HEARTBEAT || type == BATON__F_MEM || type == BATON__F_MEM_DEL ||
               type == BATON__F_READ_DONE;
    default:
        return 0;
    }
}

int baton__conn_next_frame(const baton__conn_t *c, const uint8_t *at, size_t len, baton__frame_t *f,
                           size_t *consumed, const char **why)
{
    /* The header first: a frame this state does not take is refused before a byte of its body
     * is buffered (every frame allowed before UP is a small handshake frame). */
    uint8_t type = 0;
    uint32_t length = 0;
    int rc = baton__frame_head(at, len, &type, &length, why);
    if (rc != 0)
        return rc;
    if (!allowed(c, type)) {
        f->type = type;
        return 2;
    }
    return baton__frame_decode(at, len, f, consumed, why);
}

/* Returns 0, 1 when the connection object is gone (became a lane), or an error. */
static int dispatch(baton__conn_t *c, const baton__frame_t *f, const uint8_t *rest, size_t rest_len,
                    const char **why)
{
    switch (f->type) {
    case BATON__F_HELLO:
        *why = "bad HELLO";
        return baton__hs_on_hello(c, &f->u.hello);
    case BATON__F_AUTH:
        *why = "bad AUTH";
        return baton__auth_on_frame(c, &f->u.auth);
    case BATON__F_LANE_HELLO:
        *why = "bad LANE_HELLO";
        return baton__hs_on_lane_hello(c, f, rest, rest_len);
    case BATON__F_HEARTBEAT:
        return 0;
    case BATON__F_MEM:
        *why = "bad MEM";
        return baton__hs_on_mem(c, &f->u.mem);
    case BATON__F_MEM_DEL:
        *why = "bad MEM_DEL";
        return baton__hs_on_mem_del(c, f->u.mem_del.mem_id);
    case BATON__F_OFFER:
        *why = "bad OFFER";
        return baton__proom_on_offer(c, &f->u.offer);
    case BATON__F_DONE:
        *why = "bad DONE";
        return baton__droom_on_done(c, &f->u.done);
    case BATON__F_ABORT:
        *why = "bad ABORT";
        if (c->role == BATON__ROLE_DECODE)
            return baton__droom_on_abort(c, f->u.abort.room, f->u.abort.reason);
        return baton__proom_on_abort(c, f->u.abort.room, f->u.abort.reason);
    case BATON__F_LAYER_DONE:
        *why = "bad LAYER_DONE";
        return baton__droom_on_layer_done(c, f->u.layer_done.room, f->u.layer_done.layer);
    case BATON__F_GRANT:
        *why = "bad GRANT";
        return baton__droom_on_grant(c, &f->u.grant);
    case BATON__F_READ_DONE:
        *why = "bad READ_DONE";
        return baton__proom_on_read_done(c, f->u.read_done.room, f->u.read_done.status);
    case BATON__F_ABORT_ACK:
        if (c->role == BATON__ROLE_DECODE)
            return baton__droom_on_abort_ack(c, f->u.abort_ack.room);
        return 0; /* the prefill side closes its room when it sends ABORT */
    default:
        return BATON_EPROTO;
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    baton__conn_t *c = s->data;
    if (nread == UV_ENOBUFS && c->admitted) {
        baton_log_limited(BATON_LOG_WARN, 10, BATON__LOG, "pending_budget_exhausted",
                          "conn_refused peer=%s reason=\"pending read budget of %llu bytes in "
                          "use\"",
                          c->addr, (unsigned long long)c->eng->cfg.pending_buffer_bytes);
        baton__conn_fail(c, BATON_EBUSY, "pending read budget exhausted");
        return;
    }
    if (nread < 0) {
        baton__conn_fail(c, BATON_EPEERDOWN,
                         nread == UV_EOF ? "connection closed by peer" : uv_strerror((int)nread));
        return;
    }
    if (buf->base == NULL) {
        baton__conn_fail(c, BATON_ENOMEM, "out of memory reading");
        return;
    }
    c->rbuf.len += (size_t)nread;
    c->rbuf.data[c->rbuf.len] = '\0';
    if (nread > 0)
        baton_heartbeat_rx(&c->hb, baton_now_ms());
    size_t off = 0;
    while (c->state != BATON__CONN_CLOSING) {
        baton__frame_t f;
        size_t consumed = 0;
        const char *why = NULL;
        int rc = baton__conn_next_frame(c, (const uint8_t *)c->rbuf.data + off, c->rbuf.len - off,
                                        &f, &consumed, &why);
        if (rc == 1)
            break;
        if (rc < 0) {
            atomic_fetch_add(&c->eng->st_frames_rejected, 1);
            char msg[160];
            snprintf(msg, sizeof(msg), "malformed frame: %s", why);
            baton__conn_fail(c, BATON_EPROTO, msg);
            return;
        }
        if (rc == 2) {
            if (c->eng->secret_len > 0 && !c->authed && c->role == BATON__ROLE_PREFILL &&
                (c->state == BATON__CONN_PENDING || c->state == BATON__CONN_AUTH)) {
                /* A peer that has not proved the secret gets nothing, whatever it sends. */
                baton__auth_refused(c, "frame before authentication");
                return;
            }
            atomic_fetch_add(&c->eng->st_frames_rejected, 1);
            char msg[160];
            snprintf(msg, sizeof(msg), "unexpected %s frame in state %d", baton__ftype_name(f.type),
                     c->state);
            baton__conn_fail(c, BATON_EPROTO, msg);
            return;
        }
        why = "frame refused";
        /* The frame is parsed out of rbuf: everything it points to stays valid until the bytes
         * are consumed below. A LANE_HELLO gets the rest of the buffer. */
        off += consumed;
        rc = dispatch(c, &f, (const uint8_t *)c->rbuf.data + off, c->rbuf.len - off, &why);
        if (rc == 1)
            return; /* became a data lane: c is gone */
        if (rc < 0) {
            atomic_fetch_add(&c->eng->st_frames_rejected, 1);
            char msg[160];
            snprintf(msg, sizeof(msg), "%s: %s", why, baton_strerror(rc));
            baton__conn_fail(c, rc == BATON_ESTALE ? BATON_ESTALE : BATON_EPROTO, msg);
            return;
        }
    }
    if (off > 0 && c->state != BATON__CONN_CLOSING)
        baton_buf_consume(&c->rbuf, off);
}

int baton__conn_start_read(baton__conn_t *c)
{
    fill_addr(c);
    uv_tcp_nodelay(c->tcp, 1);
    return uv_read_start((uv_stream_t *)c->tcp, alloc_cb, on_read);
}

/* ---- timers ------------------------------------------------------------------------------ */

void baton__conn_tick(baton__conn_t *c, uint64_t now)
{
    if (c->state == BATON__CONN_CLOSING)
        return;
    if (c->state != BATON__CONN_UP) {
        /* The connector's peer state machine times its own attempts; an accepted connection
         * that never finishes its handshake is dropped here. */
        if (c->role == BATON__ROLE_PREFILL && now - c->t_start_ms > c->eng->cfg.connect_timeout_ms)
            baton__conn_fail(c, BATON_ETIMEOUT_CONNECT, "handshake timed out");
        return;
    }
    if (baton_heartbeat_expired(&c->hb, now)) {
        char msg[96];
        snprintf(msg, sizeof(msg), "no traffic for %llu ms (heartbeats missed)",
                 (unsigned long long)(now - c->hb.last_rx_ms));
        baton__conn_fail(c, BATON_EPEERDOWN, msg);
        return;
    }
    if (baton_heartbeat_due(&c->hb, now)) {
        baton_buf_t b = BATON_BUF_INIT;
        if (baton__enc_heartbeat(&b, ++c->hb_seq, now) == 0)
            baton__conn_send(c, &b);
        baton_buf_free(&b);
        baton_heartbeat_tx(&c->hb, now);
    }
}

/* ---- accepting --------------------------------------------------------------------------- */

void baton__listener_accept(uv_stream_t *server, int status)
{
    baton_xfer_engine_t *eng = server->data;
    if (status < 0) {
        log_warn(BATON__LOG, "accept_failed err=%s", uv_err_name(status));
        return;
    }
    baton__conn_t *c = baton__conn_new(eng, BATON__ROLE_PREFILL);
    if (c == NULL) {
        /* Take the connection off the backlog and drop it rather than spin on it. */
        uv_tcp_t *t = malloc(sizeof(*t));
        if (t != NULL) {
            uv_tcp_init(&eng->ploop, t);
            t->data = NULL;
            if (uv_accept(server, (uv_stream_t *)t) == 0)
                log_warn(BATON__LOG, "accept_dropped reason=no_memory");
            uv_close((uv_handle_t *)t, on_tcp_closed);
        }
        return;
    }
    (void)BATON__CONN_MOVE(c, BATON__CONN_PENDING);
    int rc = uv_accept(server, (uv_stream_t *)c->tcp);
    if (rc == 0) {
        fill_addr(c);
        const char *why = NULL;
        if (baton__admit_accept(c, &why) != 0) {
            baton_log_limited(BATON_LOG_WARN, 10, BATON__LOG, "conn_refused",
                              "conn_refused peer=%s reason=\"%s\"", c->addr, why);
            baton__conn_fail(c, BATON_EBUSY, why);
            return;
        }
        rc = baton__conn_start_read(c);
    }
    if (rc != 0) {
        baton__conn_fail(c, BATON_EPEERDOWN, uv_strerror(rc));
        return;
    }
    if (eng->shutting_down)
        baton__conn_fail(c, BATON_ESHUTDOWN, "engine shutting down");
}
