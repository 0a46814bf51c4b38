/* client_conn.c — the HTTP client's connections: connect, idle list, writes, response parsing. */
#include "http/client_internal.h"

#include "baton/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);
static void on_plain_eof(cconn_t *conn, ssize_t nread);

void baton__hc_conn_release(cconn_t *conn)
{
    baton_http_pool_t *pool = conn->pool;
    conn->req = NULL;
    conn->reused = 1;
    if (!conn->keep_alive || conn->writing || pool->destroyed || pool->n_idle >= pool->max_idle) {
        baton__hc_conn_close(conn);
        return;
    }
    /* Keep reading while idle: EOF or stray bytes mean the upstream dropped it. */
    if (baton__hc_conn_read_start(conn) != 0) {
        baton__hc_conn_close(conn);
        return;
    }
    conn->idle = 1;
    baton_list_push_front(&pool->idle, &conn->link);
    pool->n_idle++;
}

int baton__hc_conn_read_start(cconn_t *conn)
{
    int err = uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read);
    return err == UV_EALREADY ? 0 : err;
}

/* The warmest idle connection, or NULL. */
cconn_t *baton__hc_idle_first(const baton_http_pool_t *pool)
{
    baton_list_t *first = baton_list_first(&pool->idle);
    return first ? container_of(first, cconn_t, link) : NULL;
}

void baton__hc_idle_unlink(cconn_t *conn)
{
    baton_http_pool_t *pool = conn->pool;
    if (!conn->idle)
        return;
    baton_list_remove(&conn->link);
    conn->idle = 0;
    pool->n_idle--;
}

static void conn_maybe_free(cconn_t *conn)
{
    if (conn->refs > 0)
        return;
    baton_http_pool_t *pool = conn->pool;
    baton_tls_conn_free(conn->tls);
    free(conn);
    pool->n_handles--;
    baton__hc_pool_maybe_free(pool);
}

static void on_conn_close(uv_handle_t *h)
{
    cconn_t *conn = h->data;
    conn->refs--;
    conn_maybe_free(conn);
}

void baton__hc_conn_close(cconn_t *conn)
{
    if (conn->closing)
        return;
    conn->closing = 1;
    baton__hc_idle_unlink(conn);
    if (conn->counted) {
        conn->counted = 0;
        conn->pool->n_conns--;
    }
    if (conn->req) {
        conn->req->conn = NULL;
        conn->req = NULL;
    }
    if (conn->gai_pending)
        uv_cancel((uv_req_t *)&conn->gai);
    uv_close((uv_handle_t *)&conn->tcp, on_conn_close);
}

void baton__hc_attach(cconn_t *conn, creq_t *r)
{
    conn->req = r;
    r->conn = conn;
    conn->keep_alive = 0;
    llhttp_init(&conn->parser, HTTP_RESPONSE, &r->pool->settings);
    conn->parser.data = conn;
}

/* A write of TLS records: the ciphertext is owned by the request and freed with it. */
typedef struct twrite_s {
    uv_write_t req;
    cconn_t *conn;
    baton_buf_t buf;
    int is_request; /* carries a request (conn->writing) rather than handshake records */
} twrite_t;

static void on_write(uv_write_t *w, int status)
{
    cconn_t *conn = w->data;
    conn->writing = 0;
    if (status == UV_ECANCELED || conn->closing)
        return;
    if (status < 0 && conn->req)
        baton__hc_conn_fail(conn, BATON_EEOF);
    else if (status < 0)
        baton__hc_conn_close(conn);
}

static void on_tls_write(uv_write_t *w, int status)
{
    twrite_t *tw = container_of(w, twrite_t, req);
    cconn_t *conn = tw->conn;
    int is_request = tw->is_request;
    baton_buf_free(&tw->buf);
    free(tw);
    if (is_request) {
        conn->wreq.data = conn;
        on_write(&conn->wreq, status);
    } else if (status < 0 && status != UV_ECANCELED && !conn->closing) {
        baton__hc_conn_fail(conn, BATON_EEOF);
    }
}

/*
 * Writes what the socket takes at once (uv_try_write: nothing queued, and no epoll_ctl — libuv
 * re-registers the fd whenever a queued write completes). Returns the bytes written; an error
 * counts as 0 and the caller queues everything with uv_write, which reports it the usual way.
 * libuv keeps the order: it refuses a try_write while writes are queued.
 */
static size_t try_write(cconn_t *conn, const uv_buf_t *bufs, unsigned n)
{
    int w = uv_try_write((uv_stream_t *)&conn->tcp, bufs, n);
    return w > 0 ? (size_t)w : 0;
}

/* Writes the ciphertext in *out: what the socket takes at once (then *out is emptied, its storage
 * kept), else the rest is queued and takes *out's storage along. */
static int tls_write_out(cconn_t *conn, baton_buf_t *out, int is_request)
{
    size_t done = 0;
    if (out->len > 0) {
        uv_buf_t all = uv_buf_init(out->data, (unsigned)out->len);
        done = try_write(conn, &all, 1);
    }
    if (done == out->len) {
        baton_buf_reset(out); /* the caller's buffer: it frees or reuses it */
        return 0;
    }
    twrite_t *tw = malloc(sizeof(*tw));
    if (tw == NULL) {
        baton_buf_free(out);
        return BATON_ENOMEM;
    }
    tw->conn = conn;
    tw->buf = *out;
    tw->is_request = is_request;
    *out = (baton_buf_t)BATON_BUF_INIT;
    uv_buf_t b = uv_buf_init(tw->buf.data + done, (unsigned)(tw->buf.len - done));
    int err = uv_write(&tw->req, (uv_stream_t *)&conn->tcp, &b, 1, on_tls_write);
    if (err) {
        baton_buf_free(&tw->buf);
        free(tw);
    } else if (is_request) {
        conn->writing = 1;
    }
    return err;
}

/* Queues what try_write left of the head and body (a partial write) without copying it. */
static int write_rest(creq_t *r, size_t done)
{
    cconn_t *conn = r->conn;
    unsigned i = 0;
    while (done >= r->wbufs[i].len) /* done < the total: some bytes are left */
        done -= r->wbufs[i++].len;
    uv_buf_t first = r->wbufs[i]; /* restored below: a retry sends the request again */
    r->wbufs[i].base += done;
    r->wbufs[i].len -= done;
    conn->wreq.data = conn;
    int err =
        uv_write(&conn->wreq, (uv_stream_t *)&conn->tcp, r->wbufs + i, r->n_wbufs - i, on_write);
    r->wbufs[i] = first;
    if (err == 0)
        conn->writing = 1;
    return err;
}

/* Head and body segments go out in one writev, straight from the socket call when the socket
 * takes them (the usual case), else the rest queued; the body is never copied (over TLS:
 * encrypted straight from the segments, small ones joined into one record). */
int baton__hc_send_request(creq_t *r)
{
    cconn_t *conn = r->conn;
    int err = 0;
    r->wbufs[0] = uv_buf_init(r->head.data, (unsigned)r->head.len);
    if (conn->tls) {
        /* The pool's scratch buffer (a partial write takes its storage along). */
        baton_buf_t *out = &conn->pool->tls_scratch;
        baton_buf_reset(out);
        err = baton_tls_conn_encrypt(conn->tls, r->wbufs, r->n_wbufs, out);
        err = err ? err : tls_write_out(conn, out, 1);
        if (err || out->cap > FREE_BUF_MAX)
            baton_buf_free(out);
    } else {
        size_t done = try_write(conn, r->wbufs, r->n_wbufs);
        if (done < r->head.len + r->body_len)
            err = write_rest(r, done);
    }
    if (err)
        return err;
    baton__hc_set_phase(r, PH_FIRST_BYTE);
    return 0;
}

static int retryable(cconn_t *conn, creq_t *r, int err)
{
    return err == BATON_EEOF && conn->reused && !r->got_bytes && !r->retried && !r->done;
}

/* The connection failed with a request on it (called on the loop, never inside an API call). */
void baton__hc_conn_fail(cconn_t *conn, int err)
{
    creq_t *r = conn->req;
    baton__hc_conn_close(conn);
    if (r == NULL || r->done)
        return;
    if (retryable(conn, r, err)) {
        /* The upstream closed a keep-alive connection we thought idle: once more, fresh. */
        r->retried = 1;
        log_debug("http", "upstream_retry host=%s port=%d", r->pool->host, r->pool->port);
        if (baton__hc_conn_open(r->pool, r) == 0)
            return;
        err = BATON_ECONNECT;
    }
    baton__hc_finish(r, err);
}

static void on_connect(uv_connect_t *cr, int status)
{
    cconn_t *conn = cr->data;
    if (status == UV_ECANCELED || conn->closing)
        return;
    creq_t *r = conn->req;
    if (status < 0 || r == NULL) {
        if (r)
            log_debug("http", "upstream_connect_failed host=%s port=%d err=%s", r->pool->host,
                      r->pool->port, baton_strerror(status));
        baton__hc_conn_fail(conn, BATON_ECONNECT);
        return;
    }
    conn->connected = 1;
    if (conn->pool->tls) {
        /* The request waits for the handshake (bounded by the connect timeout): a peer that
         * fails verification never sees a byte of it. */
        baton_buf_t out = BATON_BUF_INIT;
        int err = baton_tls_conn_create(&conn->tls, conn->pool->tls, conn->pool->host);
        if (err == 0) {
            char peer[64];
            snprintf(peer, sizeof(peer), "%.40s:%d", conn->pool->host, conn->pool->port);
            baton_tls_conn_set_peer(conn->tls, peer);
            baton_tls_conn_use_session(conn->tls, conn->pool->session);
            err = baton_tls_conn_start(conn->tls, &out);
        }
        err = err ? err : tls_write_out(conn, &out, 0);
        baton_buf_free(&out);
        if (err || baton__hc_conn_read_start(conn) != 0)
            baton__hc_conn_fail(conn, err == BATON_ETLS ? BATON_ETLS : BATON_ECONNECT);
        return;
    }
    if (!r->paused && baton__hc_conn_read_start(conn) != 0) {
        baton__hc_conn_fail(conn, BATON_ECONNECT);
        return;
    }
    if (baton__hc_send_request(r) != 0)
        baton__hc_conn_fail(conn, BATON_ECONNECT);
}

static void on_resolved(uv_getaddrinfo_t *g, int status, struct addrinfo *res)
{
    cconn_t *conn = g->data;
    conn->gai_pending = 0;
    conn->refs--;
    if (conn->closing) {
        uv_freeaddrinfo(res);
        conn_maybe_free(conn);
        return;
    }
    int err = status;
    if (!err && res == NULL)
        err = UV_EAI_NONAME;
    if (!err) {
        conn->connect_req.data = conn;
        err = uv_tcp_connect(&conn->connect_req, &conn->tcp, res->ai_addr, on_connect);
    }
    uv_freeaddrinfo(res);
    if (err) {
        log_debug("http", "upstream_resolve_failed host=%s err=%s", conn->pool->host,
                  baton_strerror(err));
        baton__hc_conn_fail(conn, BATON_ECONNECT);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    cconn_t *conn = h->data;
    buf->base = conn->pool->rbuf;
    buf->len = READ_BUF_SIZE;
}

/* Opens a new connection for r. 0, or an error after which r is not attached. */
int baton__hc_conn_open(baton_http_pool_t *pool, creq_t *r)
{
    cconn_t *conn = calloc(1, sizeof(*conn));
    if (conn == NULL)
        return BATON_ENOMEM;
    conn->pool = pool;
    int err = uv_tcp_init(pool->loop, &conn->tcp);
    if (err) {
        free(conn);
        return err;
    }
    conn->tcp.data = conn;
    conn->refs = 1;
    conn->counted = 1;
    pool->n_handles++;
    pool->n_conns++;
    uv_tcp_nodelay(&conn->tcp, 1);
    baton__hc_attach(conn, r);
    r->got_bytes = 0;
    baton__hc_set_phase(r, PH_CONNECT);
    if (pool->literal) {
        conn->connect_req.data = conn;
        err = uv_tcp_connect(&conn->connect_req, &conn->tcp, (struct sockaddr *)&pool->addr,
                             on_connect);
    } else {
        char port[16];
        snprintf(port, sizeof(port), "%d", pool->port);
        struct addrinfo hints;
        memset(&hints, 0, sizeof(hints));
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        conn->gai.data = conn;
        err = uv_getaddrinfo(pool->loop, &conn->gai, on_resolved, pool->host, port, &hints);
        if (!err) {
            conn->gai_pending = 1;
            conn->refs++;
        }
    }
    if (err) {
        baton__hc_conn_close(conn); /* detaches r */
        return err;
    }
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    creq_t *r = ((cconn_t *)p->data)->req;
    baton__http_head_begin(&r->resp, MAX_RESP_HEADER_BYTES, MAX_RESP_HEADERS);
    r->msg_complete = 0;
    return 0;
}

/* The head module's errors (limits, memory) all make the response malformed here. */
static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    return baton__http_head_field(&((cconn_t *)p->data)->req->resp, at, len) ? -1 : 0;
}

static int on_header_field_complete(llhttp_t *p)
{
    return baton__http_head_field_done(&((cconn_t *)p->data)->req->resp) ? -1 : 0;
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    return baton__http_head_value(&((cconn_t *)p->data)->req->resp, at, len) ? -1 : 0;
}

static int on_header_value_complete(llhttp_t *p)
{
    return baton__http_head_value_done(&((cconn_t *)p->data)->req->resp) ? -1 : 0;
}

static int is_interim(int status)
{
    return status >= 100 && status < 200 && status != 101;
}

static int on_headers_complete(llhttp_t *p)
{
    cconn_t *conn = p->data;
    creq_t *r = conn->req;
    r->status = p->status_code;
    if (is_interim(r->status))
        return 0; /* 100 Continue and friends: the real answer follows */
    const baton_http_header_t *hs;
    size_t n;
    if (baton__http_head_finish(&r->resp, &hs, &n) != 0)
        return -1;
    if (r->cb.on_head)
        r->cb.on_head(&r->pub, r->status, hs, n);
    if (r->done || conn->req != r)
        return -1; /* cancelled from on_head */
    return r->is_head ? 1 : 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    cconn_t *conn = p->data;
    creq_t *r = conn->req;
    if (r->paused)
        return baton_buf_append(&r->held, at, len) == 0 ? 0 : -1;
    if (r->cb.on_data)
        r->cb.on_data(&r->pub, at, len);
    if (r->done || conn->req != r)
        return -1; /* cancelled from on_data */
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    cconn_t *conn = p->data;
    creq_t *r = conn->req;
    if (is_interim(r->status))
        return 0;
    r->msg_complete = 1;
    conn->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
    /* Stop: completion (which may reuse this connection) happens outside the parser. */
    return HPE_PAUSED;
}

void baton__hc_complete(creq_t *r)
{
    baton__hc_finish(r, 0);
}

static void feed(cconn_t *conn, const char *data, size_t len)
{
    creq_t *r = conn->req;
    llhttp_errno_t e = llhttp_execute(&conn->parser, data, len);
    if (r->done || conn->req != r)
        return; /* cancelled inside a callback */
    if (e == HPE_OK)
        return;
    if (e == HPE_PAUSED && r->msg_complete) {
        size_t used = (size_t)(llhttp_get_error_pos(&conn->parser) - data);
        if (used < len)
            conn->keep_alive = 0; /* bytes after the response: not a connection to reuse */
        if (r->paused || r->held.len > 0) {
            r->held_complete = 1;
            return;
        }
        baton__hc_complete(r);
        return;
    }
    log_debug("http", "upstream_malformed host=%s port=%d err=%s reason=\"%s\"", r->pool->host,
              r->pool->port, llhttp_errno_name(e), llhttp_get_error_reason(&conn->parser));
    baton__hc_conn_fail(conn, BATON_EUPSTREAM);
}

/* Response bytes: straight from the socket, or decrypted by the TLS layer. */
static int on_plain(void *owner, const char *data, size_t len)
{
    cconn_t *conn = owner;
    creq_t *r = conn->req;
    if (r == NULL || conn->closing) {
        baton__hc_conn_close(conn); /* idle connection: unexpected bytes */
        return 1;
    }
    if (r->msg_complete) {
        baton__hc_conn_fail(conn,
                            BATON_EUPSTREAM); /* bytes past a held, baton__hc_complete response */
        return 1;
    }
    r->got_bytes = 1;
    r->last_read = uv_now(r->pool->loop);
    if (r->phase != PH_BODY)
        baton__hc_set_phase(r, PH_BODY);
    feed(conn, data, len);
    return conn->req != r || conn->closing;
}

static void on_tls_read(cconn_t *conn, const char *data, size_t len)
{
    int was_up = baton_tls_conn_established(conn->tls);
    baton_buf_t out = BATON_BUF_INIT;
    int rc = baton_tls_conn_feed(conn->tls, data, len, &out, on_plain, conn);
    if (!conn->closing && tls_write_out(conn, &out, 0) != 0 && rc == 0)
        rc = BATON_ETLS;
    baton_buf_free(&out);
    if (conn->closing)
        return;
    if (rc == 1) { /* close_notify: the upstream's EOF */
        on_plain_eof(conn, UV_EOF);
        return;
    }
    if (rc != 0) { /* the layer logged it (rate-limited) and counted it */
        baton__hc_conn_fail(conn, BATON_ETLS);
        return;
    }
    if (!was_up && baton_tls_conn_established(conn->tls) && conn->req) {
        creq_t *r = conn->req;
        if (r->paused)
            uv_read_stop((uv_stream_t *)&conn->tcp);
        if (baton__hc_send_request(r) != 0)
            baton__hc_conn_fail(conn, BATON_ECONNECT);
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    cconn_t *conn = s->data;
    if (nread == 0)
        return;
    if (nread < 0 && conn->tls && !baton_tls_conn_established(conn->tls)) {
        baton_tls_conn_eof(conn->tls);
        baton__hc_conn_fail(conn, BATON_ETLS); /* the upstream hung up on the handshake */
        return;
    }
    if (conn->req == NULL) {
        baton__hc_conn_close(conn); /* idle connection: EOF, error or unexpected bytes */
        return;
    }
    if (nread < 0) {
        on_plain_eof(conn, nread);
        return;
    }
    if (conn->tls)
        on_tls_read(conn, buf->base, (size_t)nread);
    else
        on_plain(conn, buf->base, (size_t)nread);
}

static void on_plain_eof(cconn_t *conn, ssize_t nread)
{
    creq_t *r = conn->req;
    if (r == NULL) {
        baton__hc_conn_close(conn);
        return;
    }
    if (nread == UV_EOF && r->got_bytes && !r->msg_complete) {
        llhttp_finish(&conn->parser); /* a read-until-close body ends here */
        if (r->msg_complete) {
            conn->keep_alive = 0;
            if (r->paused || r->held.len > 0)
                r->held_complete = 1;
            else
                baton__hc_complete(r);
            return;
        }
    }
    baton__hc_conn_fail(conn, BATON_EEOF);
}
void baton__hc_settings_init(llhttp_settings_t *s)
{
    llhttp_settings_init(s);
    s->on_message_begin = on_message_begin;
    s->on_header_field = on_header_field;
    s->on_header_field_complete = on_header_field_complete;
    s->on_header_value = on_header_value;
    s->on_header_value_complete = on_header_value_complete;
    s->on_headers_complete = on_headers_complete;
    s->on_body = on_body;
    s->on_message_complete = on_message_complete;
}
