/* store/sconn.c — baton-store's control connections: TCP framing with the bounded decoder, the
 * HMAC challenge-response before any request (libbaton's transcript MAC, the store's labels),
 * the listener, and srpc (request/reply matching, time-outs, reconnect on the next call). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "common/log.h"
#include "store/sconn.h"
#include "transfer/internal.h" /* baton__auth_mac: the KV bootstrap's transcript MAC */

#define COMP "store"

static const char LABEL_LISTENER[] = "baton store-auth v1 listener";
static const char LABEL_CONNECTOR[] = "baton store-auth v1 connector";

typedef enum { SC_CONNECTING, SC_AUTH, SC_UP, SC_CLOSING } sc_state_t;

struct baton__sconn_s {
    uv_tcp_t tcp;
    uv_timer_t timer; /* the handshake's deadline */
    uv_connect_t creq;
    baton__sconn_opts_t o;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    char id[BATON__SP_ID_MAX + 1];
    int listener_side;
    sc_state_t state;
    int close_reason;
    int heard;  /* the peer sent a byte */
    int paused; /* reads stopped: more than o.max_queued bytes wait to be sent to the peer */
    int handles_open;
    uint8_t my_nonce[BATON__SP_NONCE];
    char peer_id[BATON__SP_ID_MAX + 1];
    uint8_t peer_nonce[BATON__SP_NONCE];
    baton_buf_t rbuf;
    char peer_ip[64];
    baton__slisten_t *listener;
    void *udata;
};

struct baton__slisten_s {
    uv_tcp_t tcp;
    baton__sconn_opts_t o;
    uint8_t secret[BATON_XFER_SECRET_MAX];
    char id[BATON__SP_ID_MAX + 1];
    uint64_t refused;
    uint64_t paused; /* times an accepted connection's reads stopped for its unsent replies */
};

static void sc_fail(baton__sconn_t *c, int reason);
static void drain_frames(baton__sconn_t *c);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static void copy_opts(baton__sconn_opts_t *dst, uint8_t *secret, char *id,
                      const baton__sconn_opts_t *src)
{
    *dst = *src;
    if (src->secret && src->secret_len) {
        size_t n =
            src->secret_len < BATON_XFER_SECRET_MAX ? src->secret_len : BATON_XFER_SECRET_MAX;
        memcpy(secret, src->secret, n);
        dst->secret = secret;
        dst->secret_len = n;
    } else {
        dst->secret = NULL;
        dst->secret_len = 0;
    }
    snprintf(id, BATON__SP_ID_MAX + 1, "%s", src->id ? src->id : "store");
    dst->id = id;
    if (dst->handshake_ms == 0)
        dst->handshake_ms = 5000;
    if (dst->max_body == 0)
        dst->max_body = BATON__SP_REQ_MAX;
}

static int fresh_nonce(uint8_t *n)
{
    size_t got = 0;
    while (got < BATON__SP_NONCE) {
        ssize_t r = getrandom(n + got, BATON__SP_NONCE - got, 0);
        if (r <= 0)
            return BATON_XFER_ENODEV;
        got += (size_t)r;
    }
    return 0;
}

int baton__sconn_auth_mac(const uint8_t *secret, size_t secret_len, int listener,
                          const char *conn_id, const uint8_t *conn_nonce, const char *lis_id,
                          const uint8_t *lis_nonce, uint8_t *mac)
{
    baton__auth_party_t d, p;
    memset(&d, 0, sizeof(d));
    memset(&p, 0, sizeof(p));
    snprintf(d.id, sizeof(d.id), "%s", conn_id);
    snprintf(p.id, sizeof(p.id), "%s", lis_id);
    memcpy(d.nonce, conn_nonce, BATON__SP_NONCE);
    memcpy(p.nonce, lis_nonce, BATON__SP_NONCE);
    return baton__auth_mac(secret, secret_len, listener ? LABEL_LISTENER : LABEL_CONNECTOR, &d, &p,
                           mac);
}

/* The transcript: the connector is libbaton's "decode" party, the listener its "prefill". */
static int transcript_mac(const baton__sconn_t *c, int listener, uint8_t *mac)
{
    const char *conn_id = c->listener_side ? c->peer_id : c->id;
    const char *lis_id = c->listener_side ? c->id : c->peer_id;
    const uint8_t *conn_nonce = c->listener_side ? c->peer_nonce : c->my_nonce;
    const uint8_t *lis_nonce = c->listener_side ? c->my_nonce : c->peer_nonce;
    return baton__sconn_auth_mac(c->o.secret, c->o.secret_len, listener, conn_id, conn_nonce,
                                 lis_id, lis_nonce, mac);
}

int baton__sconn_mac_equal(const uint8_t *a, const uint8_t *b)
{
    volatile uint8_t diff = 0;
    for (size_t i = 0; i < BATON__SP_MAC; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

/* ---- writes -----------------------------------------------------------------------------------
 */

typedef struct {
    uv_write_t req;
    char *data;
} wreq_t;

static void on_written(uv_write_t *req, int status)
{
    wreq_t *w = (wreq_t *)req;
    baton__sconn_t *c = req->handle->data;
    free(w->data);
    free(w);
    (void)status; /* a failed write shows as a failed read / close too */
    /* A paused peer read its replies: read its requests again once half the bound is sent. */
    if (c->paused && c->state != SC_CLOSING && c->tcp.write_queue_size <= c->o.max_queued / 2) {
        c->paused = 0;
        uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
        drain_frames(c);
    }
}

static int sc_write_msg(baton__sconn_t *c, const baton__sp_msg_t *m)
{
    baton_buf_t b = BATON_BUF_INIT;
    int rc = baton__sp_encode(&b, m);
    if (rc != 0) {
        baton_buf_free(&b);
        return rc;
    }
    wreq_t *w = malloc(sizeof(*w));
    if (w == NULL) {
        baton_buf_free(&b);
        return BATON_XFER_ENOMEM;
    }
    size_t len;
    w->data = baton_buf_steal(&b, &len);
    uv_buf_t ub = uv_buf_init(w->data, (unsigned)len);
    rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &ub, 1, on_written);
    if (rc != 0) {
        free(w->data);
        free(w);
        return rc;
    }
    /* A peer that does not read what it asked for stops being read: the bytes queued for it stay
     * within the bound and the loop never waits for it. */
    if (c->o.max_queued && !c->paused && c->tcp.write_queue_size > c->o.max_queued) {
        c->paused = 1;
        uv_read_stop((uv_stream_t *)&c->tcp);
        if (c->listener)
            c->listener->paused++;
    }
    return 0;
}

int baton__sconn_send(baton__sconn_t *c, const baton__sp_msg_t *m)
{
    if (c->state != SC_UP)
        return BATON_XFER_ECANCELED;
    return sc_write_msg(c, m);
}

/* ---- life time --------------------------------------------------------------------------------
 */

static void on_handle_closed(uv_handle_t *h)
{
    baton__sconn_t *c = h->data;
    if (--c->handles_open > 0)
        return;
    if (c->o.on_close)
        c->o.on_close(c, c->close_reason, c->o.data);
    baton_buf_free(&c->rbuf);
    free(c);
}

static void sc_fail(baton__sconn_t *c, int reason)
{
    if (c->state == SC_CLOSING)
        return;
    /* A peer that connects and closes without a byte is a TCP probe (a standby master checking
     * the leader is there, a tcpSocket health check), not a refused client. */
    if (c->listener && c->state != SC_UP && (c->heard || reason != BATON_XFER_EPEERDOWN))
        c->listener->refused++;
    c->state = SC_CLOSING;
    c->close_reason = reason;
    uv_close((uv_handle_t *)&c->timer, on_handle_closed);
    uv_close((uv_handle_t *)&c->tcp, on_handle_closed);
}

void baton__sconn_close(baton__sconn_t *c, int reason)
{
    sc_fail(c, reason);
}

void baton__sconn_set_data(baton__sconn_t *c, void *data)
{
    c->udata = data;
}

void *baton__sconn_get_data(const baton__sconn_t *c)
{
    return c->udata;
}

const char *baton__sconn_peer_ip(const baton__sconn_t *c)
{
    return c->peer_ip;
}

static void on_deadline(uv_timer_t *t)
{
    baton__sconn_t *c = t->data;
    log_warn(COMP, "store_conn_refused peer=%s reason=\"handshake time-out\"", c->peer_ip);
    sc_fail(c, BATON_XFER_ETIMEOUT);
}

static void sc_up(baton__sconn_t *c)
{
    c->state = SC_UP;
    uv_timer_stop(&c->timer);
    if (c->o.on_ready)
        c->o.on_ready(c, 0, c->o.data);
}

/* ---- the handshake ----------------------------------------------------------------------------
 */

static void auth_refused(baton__sconn_t *c, const char *why)
{
    log_warn(COMP, "store_auth_refused peer=%s reason=\"%s\"", c->peer_ip, why);
    sc_fail(c, BATON_XFER_EAUTH);
}

/* 1 when the frame was the handshake's (consumed), 0 when it is a request for the user. */
static int handshake_frame(baton__sconn_t *c, baton__sp_msg_t *m)
{
    if (c->state == SC_UP) {
        if (m->type <= BATON__SP_AUTH_PROOF) {
            auth_refused(c, "handshake frame after the handshake");
            return 1;
        }
        return 0;
    }
    baton__sp_msg_t out;
    memset(&out, 0, sizeof(out));
    if (c->listener_side) {
        if (m->type == BATON__SP_AUTH_CHALLENGE && c->peer_id[0] == '\0') {
            snprintf(c->peer_id, sizeof(c->peer_id), "%s", m->id[0] ? m->id : "-");
            memcpy(c->peer_nonce, m->nonce, BATON__SP_NONCE);
            out.type = BATON__SP_AUTH_RESPONSE;
            snprintf(out.id, sizeof(out.id), "%s", c->id);
            memcpy(out.nonce, c->my_nonce, BATON__SP_NONCE);
            if (transcript_mac(c, 1, out.mac) != 0 || sc_write_msg(c, &out) != 0)
                sc_fail(c, BATON_XFER_ENOMEM);
            return 1;
        }
        if (m->type == BATON__SP_AUTH_PROOF && c->peer_id[0] != '\0') {
            uint8_t want[BATON__SP_MAC];
            if (transcript_mac(c, 0, want) != 0 || !baton__sconn_mac_equal(want, m->mac))
                auth_refused(c, "wrong proof");
            else
                sc_up(c);
            return 1;
        }
        auth_refused(c, "request before authentication");
        return 1;
    }
    if (m->type == BATON__SP_AUTH_RESPONSE) {
        snprintf(c->peer_id, sizeof(c->peer_id), "%s", m->id[0] ? m->id : "-");
        memcpy(c->peer_nonce, m->nonce, BATON__SP_NONCE);
        uint8_t want[BATON__SP_MAC];
        if (transcript_mac(c, 1, want) != 0 || !baton__sconn_mac_equal(want, m->mac)) {
            auth_refused(c, "listener failed its proof");
            return 1;
        }
        out.type = BATON__SP_AUTH_PROOF;
        if (transcript_mac(c, 0, out.mac) != 0 || sc_write_msg(c, &out) != 0) {
            sc_fail(c, BATON_XFER_ENOMEM);
            return 1;
        }
        sc_up(c);
        return 1;
    }
    auth_refused(c, "unexpected frame in the handshake");
    return 1;
}

/* ---- reads ------------------------------------------------------------------------------------
 */

/* Reads land at the end of the connection's buffer (no copy). */
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    baton__sconn_t *c = h->data;
    (void)suggested;
    if (baton_buf_reserve(&c->rbuf, 65536) != 0) {
        *buf = uv_buf_init(NULL, 0); /* read fails with UV_ENOBUFS */
        return;
    }
    *buf = uv_buf_init(c->rbuf.data + c->rbuf.len, 65536);
}

/* Handles every whole frame in the read buffer (until the connection pauses or closes). */
static void drain_frames(baton__sconn_t *c)
{
    /* Until authenticated only small handshake frames are accepted. */
    uint32_t limit = c->state == SC_UP ? c->o.max_body : 4096;
    while (c->state != SC_CLOSING && !c->paused) {
        size_t flen;
        int rc = baton__sp_frame_check((uint8_t *)c->rbuf.data, c->rbuf.len, limit, &flen);
        if (rc == 1)
            break;
        if (rc < 0) {
            log_warn(COMP, "store_frame_refused peer=%s reason=\"%s\"", c->peer_ip,
                     baton_xfer_strerror(rc));
            sc_fail(c, rc);
            return;
        }
        if (c->rbuf.len < flen)
            break;
        baton__sp_msg_t m;
        rc = baton__sp_decode((uint8_t *)c->rbuf.data, flen, limit, &m);
        baton_buf_consume(&c->rbuf, flen);
        if (rc != 0) {
            log_warn(COMP, "store_frame_refused peer=%s reason=\"malformed body\"", c->peer_ip);
            sc_fail(c, rc);
            return;
        }
        int consumed = (c->o.secret || c->state != SC_UP) ? handshake_frame(c, &m) : 0;
        if (!consumed && c->state == SC_UP && c->o.on_msg)
            c->o.on_msg(c, &m, c->o.data);
        baton__sp_msg_free(&m);
        limit = c->state == SC_UP ? c->o.max_body : 4096;
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    baton__sconn_t *c = s->data;
    if (nread < 0) {
        sc_fail(c, nread == UV_EOF ? BATON_XFER_EPEERDOWN : (int)nread);
        return;
    }
    (void)buf;
    if (nread == 0 || c->state == SC_CLOSING)
        return;
    c->heard = 1;
    c->rbuf.len += (size_t)nread;
    drain_frames(c);
}

static baton__sconn_t *sc_new(const baton__sconn_opts_t *o, int listener_side)
{
    baton__sconn_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return NULL;
    copy_opts(&c->o, c->secret, c->id, o);
    c->listener_side = listener_side;
    if (fresh_nonce(c->my_nonce) != 0) {
        free(c);
        return NULL;
    }
    uv_tcp_init(o->loop, &c->tcp);
    uv_timer_init(o->loop, &c->timer);
    c->tcp.data = c->timer.data = c;
    c->handles_open = 2;
    uv_timer_start(&c->timer, on_deadline, c->o.handshake_ms, 0);
    return c;
}

static void on_connected(uv_connect_t *req, int status)
{
    baton__sconn_t *c = req->data;
    if (c->state == SC_CLOSING)
        return;
    if (status != 0) {
        sc_fail(c, status);
        return;
    }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (c->o.secret == NULL) {
        sc_up(c);
        return;
    }
    c->state = SC_AUTH;
    baton__sp_msg_t m;
    memset(&m, 0, sizeof(m));
    m.type = BATON__SP_AUTH_CHALLENGE;
    snprintf(m.id, sizeof(m.id), "%s", c->id);
    memcpy(m.nonce, c->my_nonce, BATON__SP_NONCE);
    if (sc_write_msg(c, &m) != 0)
        sc_fail(c, BATON_XFER_ENOMEM);
}

int baton__sconn_connect(const baton__sconn_opts_t *o, const char *host, int port,
                         baton__sconn_t **c_p)
{
    struct sockaddr_storage sa;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0)
        return BATON_XFER_EINVAL;
    baton__sconn_t *c = sc_new(o, 0);
    if (c == NULL)
        return BATON_XFER_ENOMEM;
    snprintf(c->peer_ip, sizeof(c->peer_ip), "%s:%d", host, port);
    c->creq.data = c;
    c->state = SC_CONNECTING;
    int rc = uv_tcp_connect(&c->creq, &c->tcp, (struct sockaddr *)&sa, on_connected);
    if (rc != 0) {
        c->o.on_close = NULL; /* a call that fails fires no callback */
        sc_fail(c, rc);
        return rc;
    }
    *c_p = c;
    return 0;
}

/* ---- listener ---------------------------------------------------------------------------------
 */

static void on_accept(uv_stream_t *server, int status)
{
    baton__slisten_t *l = server->data;
    if (status != 0)
        return;
    baton__sconn_t *c = sc_new(&l->o, 1);
    if (c == NULL)
        return;
    c->listener = l;
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) {
        c->o.on_close = NULL;
        sc_fail(c, BATON_XFER_ECANCELED);
        return;
    }
    struct sockaddr_storage sa;
    int len = sizeof(sa);
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&sa, &len) == 0)
        uv_ip_name((struct sockaddr *)&sa, c->peer_ip, sizeof(c->peer_ip));
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (c->o.secret == NULL)
        sc_up(c);
    else
        c->state = SC_AUTH;
}

int baton__slisten_start(const baton__sconn_opts_t *o, const char *host, int port, int *port_p,
                         baton__slisten_t **l_p)
{
    struct sockaddr_storage sa;
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&sa) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&sa) != 0)
        return BATON_XFER_EINVAL;
    baton__slisten_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return BATON_XFER_ENOMEM;
    copy_opts(&l->o, l->secret, l->id, o);
    uv_tcp_init(o->loop, &l->tcp);
    l->tcp.data = l;
    int rc = uv_tcp_bind(&l->tcp, (struct sockaddr *)&sa, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&l->tcp, 256, on_accept);
    if (rc != 0) {
        uv_close((uv_handle_t *)&l->tcp, (uv_close_cb)free);
        return rc;
    }
    struct sockaddr_storage bound;
    int len = sizeof(bound);
    uv_tcp_getsockname(&l->tcp, (struct sockaddr *)&bound, &len);
    *port_p = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *l_p = l;
    return 0;
}

void baton__slisten_close(baton__slisten_t *l)
{
    uv_close((uv_handle_t *)&l->tcp, (uv_close_cb)free);
}

uint64_t baton__slisten_refused(const baton__slisten_t *l)
{
    return l->refused;
}

uint64_t baton__slisten_paused(const baton__slisten_t *l)
{
    return l->paused;
}

int baton__store_read_secret(const char *path, uint8_t *buf, size_t cap, size_t *len_p)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        log_error(COMP, "secret_unreadable path=%s reason=\"%s\"", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && (st.st_mode & 007) != 0)
        log_warn(COMP, "secret_file_permissions path=%s mode=%03o hint=\"chmod 640\"", path,
                 (unsigned)(st.st_mode & 0777));
    size_t n = fread(buf, 1, cap, f);
    int longer = fgetc(f) != EOF;
    fclose(f);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (longer || n < BATON_XFER_SECRET_MIN || n > BATON_XFER_SECRET_MAX) {
        log_error(COMP, "secret_invalid path=%s reason=\"%d to %d bytes expected\"", path,
                  BATON_XFER_SECRET_MIN, BATON_XFER_SECRET_MAX);
        return -1;
    }
    *len_p = n;
    return 0;
}
