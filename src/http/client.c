/* client.c — upstream HTTP/1.1 client: keep-alive pool per upstream, phase timeouts, streaming. */
#include "http/client.h"

#include "http/head.h"
#include "http/tls.h"

#include "baton/error.h"
#include "common/buf.h"
#include "common/list.h"
#include "common/log.h"

#include <llhttp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* Shared by the pool's connections: a read_cb never keeps pointers into it (see server.c). */
#define READ_BUF_SIZE (64 * 1024)
/* Sanity limits on what an upstream may send as a response head. */
#define MAX_RESP_HEADER_BYTES (1024 * 1024)
#define MAX_RESP_HEADERS      1000
/* Body segments held in the request itself; more take one allocation (rare: the router sends
 * one or two). */
#define BODY_SEGS_INLINE 3
/* Freed request structs a pool keeps for reuse, with their buffers (head, response headers):
 * a request on a warm pool allocates nothing. Buffers grown past FREE_BUF_MAX are let go. */
#ifndef BATON_POOL_REUSE
#define BATON_POOL_REUSE 1 /* 0 in sanitizer builds (CMakeLists.txt) */
#endif
#define FREE_REQS_MAX (BATON_POOL_REUSE ? 64 : 0)
#define FREE_BUF_MAX  (16 * 1024)

typedef struct cconn_s cconn_t;
typedef struct creq_s creq_t;

struct baton_http_pool_s {
    uv_loop_t *loop;
    char host[256];
    int port;
    unsigned max_idle;
    int literal;
    struct sockaddr_storage addr;
    char host_hdr[300];
    char *rbuf;
    baton_tls_t *tls;             /* not owned; NULL: plain TCP */
    baton_tls_session_t *session; /* the last TLS session, offered by new connections */
    baton_buf_t tls_scratch;      /* ciphertext of one request (send_request) */
    llhttp_settings_t settings;
    baton_list_t idle; /* of cconn_t.link, LIFO: the most recently used is the warmest */
    unsigned n_idle;
    unsigned n_conns;       /* idle + busy, not closing */
    unsigned n_handles;     /* connection structs not freed yet */
    unsigned n_reqs;        /* request structs not freed yet */
    baton_list_t free_reqs; /* of creq_t.free_link: freed ones kept for reuse */
    unsigned n_free;
    int destroyed;
};

struct cconn_s {
    uv_tcp_t tcp;
    uv_connect_t connect_req;
    uv_getaddrinfo_t gai;
    uv_write_t wreq;
    llhttp_t parser;
    baton_http_pool_t *pool;
    baton_tls_conn_t *tls; /* NULL on a plain connection */
    baton_list_t link;     /* in pool->idle while idle */
    creq_t *req;
    unsigned refs; /* tcp handle + a pending getaddrinfo */
    unsigned reused : 1;
    unsigned closing : 1;
    unsigned idle : 1;
    unsigned counted : 1;
    unsigned keep_alive : 1;
    unsigned writing : 1;
    unsigned gai_pending : 1;
    unsigned connected : 1;
};

enum phase { PH_CONNECT, PH_FIRST_BYTE, PH_BODY };
enum tmode { CT_NONE, CT_PHASE, CT_DEFER, CT_RESUME };

struct creq_s {
    baton_http_creq_t pub;
    baton_http_pool_t *pool;
    cconn_t *conn;
    uv_timer_t timer; /* one per request, switched per phase */
    baton_http_client_cb_t cb;
    baton_http_timeouts_t to;
    uv_buf_t *wbufs; /* [0] the head, then the body's segments: one uv_write */
    unsigned n_wbufs;
    uv_buf_t wbufs_inline[1 + BODY_SEGS_INLINE];
    size_t body_len;
    baton_buf_t head;        /* the request line and headers */
    baton_list_t free_link;  /* in pool->free_reqs once freed */
    uint64_t total_deadline; /* uv_now() ms; 0 = none */
    uint64_t phase_start;
    uint64_t last_read;
    uint64_t paused_at;
    int phase;
    int tmode;
    int deferred_err;
    int status;
    baton__http_head_t resp; /* the response head (http/head.h) */
    baton_buf_t held;        /* body bytes parsed while paused */
    unsigned retried : 1;
    unsigned got_bytes : 1;
    unsigned paused : 1;
    unsigned done : 1; /* on_done delivered or scheduled */
    unsigned held_complete : 1;
    unsigned is_head : 1;
    unsigned msg_complete : 1;
};

static void conn_close(cconn_t *conn);
static void conn_fail(cconn_t *conn, int err);
static int conn_open(baton_http_pool_t *pool, creq_t *req);
static void pool_maybe_free(baton_http_pool_t *pool);
static void on_ctimer(uv_timer_t *t);
static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf);
static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf);

static int conn_read_start(cconn_t *conn)
{
    int err = uv_read_start((uv_stream_t *)&conn->tcp, on_alloc, on_read);
    return err == UV_EALREADY ? 0 : err;
}

/* ---------------------------------------------------------------------------------------- */
/* Request timers                                                                            */

static void timer_set(creq_t *r, int mode, uint64_t ms)
{
    r->tmode = mode;
    uv_timer_start(&r->timer, on_ctimer, ms, 0);
}

/* Arms the timer for the earlier of the phase deadline and the total deadline. */
static void arm_phase(creq_t *r)
{
    uint64_t due = 0;
    switch (r->phase) {
    case PH_CONNECT:
        due = r->to.connect_ms ? r->phase_start + r->to.connect_ms : 0;
        break;
    case PH_FIRST_BYTE:
        due = r->to.first_byte_ms ? r->phase_start + r->to.first_byte_ms : 0;
        break;
    case PH_BODY:
        due = r->to.idle_ms ? r->last_read + r->to.idle_ms : 0;
        break;
    }
    if (r->total_deadline && (!due || r->total_deadline < due))
        due = r->total_deadline;
    if (!due || r->paused) {
        uv_timer_stop(&r->timer);
        r->tmode = CT_NONE;
        return;
    }
    uint64_t now = uv_now(r->pool->loop);
    timer_set(r, CT_PHASE, due > now ? due - now : 0);
}

static void set_phase(creq_t *r, int phase)
{
    r->phase = phase;
    r->phase_start = uv_now(r->pool->loop);
    r->last_read = r->phase_start;
    arm_phase(r);
}

/* ---------------------------------------------------------------------------------------- */
/* Finishing                                                                                 */

static void creq_free(creq_t *r)
{
    baton_buf_free(&r->head);
    baton_buf_free(&r->resp.arena);
    baton_buf_free(&r->resp.hdrs);
    baton_buf_free(&r->held);
    free(r);
}

/* Keeps a buffer's storage for the next request unless it grew unusually large. */
static void buf_recycle(baton_buf_t *b)
{
    if (b->cap > FREE_BUF_MAX)
        baton_buf_free(b);
    else
        baton_buf_reset(b);
}

static void on_creq_close(uv_handle_t *h)
{
    creq_t *r = h->data;
    baton_http_pool_t *pool = r->pool;
    if (r->wbufs != r->wbufs_inline)
        free(r->wbufs);
    r->wbufs = NULL;
    pool->n_reqs--;
    if (pool->destroyed || pool->n_free >= FREE_REQS_MAX) {
        creq_free(r);
    } else {
        buf_recycle(&r->head);
        buf_recycle(&r->resp.arena);
        buf_recycle(&r->resp.hdrs);
        baton_buf_free(&r->held); /* rarely used, possibly large */
        baton_list_push_front(&pool->free_reqs, &r->free_link);
        pool->n_free++;
    }
    pool_maybe_free(pool);
}

/* A zeroed request struct: a freed one of the pool's (its buffers kept, emptied) or a new one. */
static creq_t *creq_alloc(baton_http_pool_t *pool)
{
    baton_list_t *first = baton_list_first(&pool->free_reqs);
    if (first == NULL)
        return calloc(1, sizeof(creq_t));
    baton_list_remove(first);
    pool->n_free--;
    creq_t *r = container_of(first, creq_t, free_link);
    baton_buf_t head = r->head, arena = r->resp.arena, hdrs = r->resp.hdrs;
    memset(r, 0, sizeof(*r));
    r->head = head;
    r->resp.arena = arena;
    r->resp.hdrs = hdrs;
    return r;
}

static void conn_release(cconn_t *conn)
{
    baton_http_pool_t *pool = conn->pool;
    conn->req = NULL;
    conn->reused = 1;
    if (!conn->keep_alive || conn->writing || pool->destroyed || pool->n_idle >= pool->max_idle) {
        conn_close(conn);
        return;
    }
    /* Keep reading while idle: EOF or stray bytes mean the upstream dropped it. */
    if (conn_read_start(conn) != 0) {
        conn_close(conn);
        return;
    }
    conn->idle = 1;
    baton_list_push_front(&pool->idle, &conn->link);
    pool->n_idle++;
}

/* Delivers on_done (never from inside an API call) and frees the request afterwards. */
static void finish(creq_t *r, int err)
{
    cconn_t *conn = r->conn;
    if (conn) {
        r->conn = NULL;
        if (err == 0) {
            conn_release(conn);
        } else {
            conn->req = NULL;
            conn_close(conn);
        }
    }
    r->done = 1;
    uv_timer_stop(&r->timer);
    r->tmode = CT_NONE;
    r->cb.on_done(&r->pub, err);
    uv_close((uv_handle_t *)&r->timer, on_creq_close);
}

static void defer_finish(creq_t *r, int err)
{
    r->done = 1;
    r->deferred_err = err;
    timer_set(r, CT_DEFER, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Connections                                                                               */

/* The warmest idle connection, or NULL. */
static cconn_t *idle_first(const baton_http_pool_t *pool)
{
    baton_list_t *first = baton_list_first(&pool->idle);
    return first ? container_of(first, cconn_t, link) : NULL;
}

static void idle_unlink(cconn_t *conn)
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
    pool_maybe_free(pool);
}

static void on_conn_close(uv_handle_t *h)
{
    cconn_t *conn = h->data;
    conn->refs--;
    conn_maybe_free(conn);
}

static void conn_close(cconn_t *conn)
{
    if (conn->closing)
        return;
    conn->closing = 1;
    idle_unlink(conn);
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

static void attach(cconn_t *conn, creq_t *r)
{
    conn->req = r;
    r->conn = conn;
    conn->keep_alive = 0;
    llhttp_init(&conn->parser, HTTP_RESPONSE, &r->pool->settings);
    conn->parser.data = conn;
}

static void on_write(uv_write_t *w, int status)
{
    cconn_t *conn = w->data;
    conn->writing = 0;
    if (status == UV_ECANCELED || conn->closing)
        return;
    if (status < 0 && conn->req)
        conn_fail(conn, BATON_EEOF);
    else if (status < 0)
        conn_close(conn);
}

/* A write of TLS records: the ciphertext is owned by the request and freed with it. */
typedef struct twrite_s {
    uv_write_t req;
    cconn_t *conn;
    baton_buf_t buf;
    int is_request; /* carries a request (conn->writing) rather than handshake records */
} twrite_t;

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
        conn_fail(conn, BATON_EEOF);
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
static int send_request(creq_t *r)
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
    set_phase(r, PH_FIRST_BYTE);
    return 0;
}

static int retryable(cconn_t *conn, creq_t *r, int err)
{
    return err == BATON_EEOF && conn->reused && !r->got_bytes && !r->retried && !r->done;
}

/* The connection failed with a request on it (called on the loop, never inside an API call). */
static void conn_fail(cconn_t *conn, int err)
{
    creq_t *r = conn->req;
    conn_close(conn);
    if (r == NULL || r->done)
        return;
    if (retryable(conn, r, err)) {
        /* The upstream closed a keep-alive connection we thought idle: once more, fresh. */
        r->retried = 1;
        log_debug("http", "upstream_retry host=%s port=%d", r->pool->host, r->pool->port);
        if (conn_open(r->pool, r) == 0)
            return;
        err = BATON_ECONNECT;
    }
    finish(r, err);
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
        conn_fail(conn, BATON_ECONNECT);
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
        if (err || conn_read_start(conn) != 0)
            conn_fail(conn, err == BATON_ETLS ? BATON_ETLS : BATON_ECONNECT);
        return;
    }
    if (!r->paused && conn_read_start(conn) != 0) {
        conn_fail(conn, BATON_ECONNECT);
        return;
    }
    if (send_request(r) != 0)
        conn_fail(conn, BATON_ECONNECT);
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
        conn_fail(conn, BATON_ECONNECT);
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    cconn_t *conn = h->data;
    buf->base = conn->pool->rbuf;
    buf->len = READ_BUF_SIZE;
}

/* Opens a new connection for r. 0, or an error after which r is not attached. */
static int conn_open(baton_http_pool_t *pool, creq_t *r)
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
    attach(conn, r);
    r->got_bytes = 0;
    set_phase(r, PH_CONNECT);
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
        conn_close(conn); /* detaches r */
        return err;
    }
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Response parsing                                                                          */

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

static void complete(creq_t *r)
{
    finish(r, 0);
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
        complete(r);
        return;
    }
    log_debug("http", "upstream_malformed host=%s port=%d err=%s reason=\"%s\"", r->pool->host,
              r->pool->port, llhttp_errno_name(e), llhttp_get_error_reason(&conn->parser));
    conn_fail(conn, BATON_EUPSTREAM);
}

static void on_plain_eof(cconn_t *conn, ssize_t nread);

/* Response bytes: straight from the socket, or decrypted by the TLS layer. */
static int on_plain(void *owner, const char *data, size_t len)
{
    cconn_t *conn = owner;
    creq_t *r = conn->req;
    if (r == NULL || conn->closing) {
        conn_close(conn); /* idle connection: unexpected bytes */
        return 1;
    }
    if (r->msg_complete) {
        conn_fail(conn, BATON_EUPSTREAM); /* bytes past a held, complete response */
        return 1;
    }
    r->got_bytes = 1;
    r->last_read = uv_now(r->pool->loop);
    if (r->phase != PH_BODY)
        set_phase(r, PH_BODY);
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
        conn_fail(conn, BATON_ETLS);
        return;
    }
    if (!was_up && baton_tls_conn_established(conn->tls) && conn->req) {
        creq_t *r = conn->req;
        if (r->paused)
            uv_read_stop((uv_stream_t *)&conn->tcp);
        if (send_request(r) != 0)
            conn_fail(conn, BATON_ECONNECT);
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    cconn_t *conn = s->data;
    if (nread == 0)
        return;
    if (nread < 0 && conn->tls && !baton_tls_conn_established(conn->tls)) {
        baton_tls_conn_eof(conn->tls);
        conn_fail(conn, BATON_ETLS); /* the upstream hung up on the handshake */
        return;
    }
    if (conn->req == NULL) {
        conn_close(conn); /* idle connection: EOF, error or unexpected bytes */
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
        conn_close(conn);
        return;
    }
    if (nread == UV_EOF && r->got_bytes && !r->msg_complete) {
        llhttp_finish(&conn->parser); /* a read-until-close body ends here */
        if (r->msg_complete) {
            conn->keep_alive = 0;
            if (r->paused || r->held.len > 0)
                r->held_complete = 1;
            else
                complete(r);
            return;
        }
    }
    conn_fail(conn, BATON_EEOF);
}

/* ---------------------------------------------------------------------------------------- */
/* Timer callback: timeouts, deferred completion, resume after pause                         */

static void resume_delivery(creq_t *r)
{
    cconn_t *conn = r->conn;
    if (r->held.len > 0) {
        baton_buf_t held = r->held;
        r->held = (baton_buf_t)BATON_BUF_INIT;
        if (r->cb.on_data)
            r->cb.on_data(&r->pub, held.data, held.len);
        baton_buf_free(&held);
        if (r->done || r->conn != conn)
            return;
        if (r->paused)
            return;
    }
    if (r->held_complete) {
        complete(r);
        return;
    }
    if (conn && conn->connected && conn_read_start(conn) != 0) {
        conn_fail(conn, BATON_EEOF);
        return;
    }
    arm_phase(r);
}

static void on_ctimer(uv_timer_t *t)
{
    creq_t *r = t->data;
    int mode = r->tmode;
    r->tmode = CT_NONE;
    switch (mode) {
    case CT_DEFER:
        r->done = 0;
        finish(r, r->deferred_err);
        return;
    case CT_RESUME:
        resume_delivery(r);
        return;
    case CT_PHASE:
        break;
    default:
        return;
    }
    uint64_t now = uv_now(r->pool->loop);
    int err = 0;
    if (r->total_deadline && now >= r->total_deadline)
        err = BATON_ETIMEOUT_TOTAL;
    else if (r->phase == PH_CONNECT && r->to.connect_ms && now >= r->phase_start + r->to.connect_ms)
        err = BATON_ETIMEOUT_CONNECT;
    else if (r->phase == PH_FIRST_BYTE && r->to.first_byte_ms &&
             now >= r->phase_start + r->to.first_byte_ms)
        err = BATON_ETIMEOUT_FIRST_BYTE;
    if (err == BATON_ETIMEOUT_CONNECT && r->conn && r->conn->tls) {
        /* Connected, but the TLS handshake did not finish in time: a TLS failure. */
        baton_tls_conn_timed_out(r->conn->tls);
        err = BATON_ETLS;
    } else if (r->phase == PH_BODY && r->to.idle_ms && now >= r->last_read + r->to.idle_ms)
        err = BATON_ETIMEOUT_IDLE;
    if (!err) {
        arm_phase(r);
        return;
    }
    log_debug("http", "upstream_timeout host=%s port=%d err=%s", r->pool->host, r->pool->port,
              baton_err_name(err));
    finish(r, err); /* closes the connection: the upstream sees it at once */
}

/* ---------------------------------------------------------------------------------------- */
/* Public API                                                                                */

int baton_http_pool_create(baton_http_pool_t **pool_p, uv_loop_t *loop, const char *host, int port,
                           unsigned max_idle)
{
    if (pool_p == NULL || loop == NULL || host == NULL || port <= 0 || port > 65535)
        return BATON_EINVAL;
    size_t hlen = strlen(host);
    if (hlen == 0 || hlen >= sizeof(((baton_http_pool_t *)0)->host))
        return BATON_EINVAL;
    baton_http_pool_t *pool = calloc(1, sizeof(*pool));
    if (pool == NULL)
        return BATON_ENOMEM;
    pool->rbuf = malloc(READ_BUF_SIZE);
    if (pool->rbuf == NULL) {
        free(pool);
        return BATON_ENOMEM;
    }
    pool->loop = loop;
    baton_list_init(&pool->idle);
    baton_list_init(&pool->free_reqs);
    memcpy(pool->host, host, hlen + 1);
    pool->port = port;
    pool->max_idle = max_idle;
    /* "localhost" is what the server side binds for it too (127.0.0.1), so no lookup. */
    const char *lit = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    int v6 = 0;
    if (uv_ip4_addr(lit, port, (struct sockaddr_in *)&pool->addr) == 0) {
        pool->literal = 1;
    } else if (uv_ip6_addr(lit, port, (struct sockaddr_in6 *)&pool->addr) == 0) {
        pool->literal = 1;
        v6 = 1;
    }
    if (port == 80)
        snprintf(pool->host_hdr, sizeof(pool->host_hdr), v6 ? "[%s]" : "%s", host);
    else
        snprintf(pool->host_hdr, sizeof(pool->host_hdr), v6 ? "[%s]:%d" : "%s:%d", host, port);
    llhttp_settings_init(&pool->settings);
    pool->settings.on_message_begin = on_message_begin;
    pool->settings.on_header_field = on_header_field;
    pool->settings.on_header_field_complete = on_header_field_complete;
    pool->settings.on_header_value = on_header_value;
    pool->settings.on_header_value_complete = on_header_value_complete;
    pool->settings.on_headers_complete = on_headers_complete;
    pool->settings.on_body = on_body;
    pool->settings.on_message_complete = on_message_complete;
    *pool_p = pool;
    return 0;
}

static void pool_maybe_free(baton_http_pool_t *pool)
{
    if (!pool->destroyed || pool->n_handles > 0 || pool->n_reqs > 0)
        return;
    baton_list_t *l;
    while ((l = baton_list_first(&pool->free_reqs)) != NULL) {
        baton_list_remove(l);
        creq_free(container_of(l, creq_t, free_link));
    }
    baton_tls_session_free(pool->session);
    baton_buf_free(&pool->tls_scratch);
    free(pool->rbuf);
    free(pool);
}

void baton_http_pool_destroy(baton_http_pool_t *pool)
{
    if (pool == NULL || pool->destroyed)
        return;
    pool->destroyed = 1;
    cconn_t *conn;
    while ((conn = idle_first(pool)) != NULL)
        conn_close(conn);
    pool_maybe_free(pool);
}

void baton_http_pool_set_tls(baton_http_pool_t *pool, baton_tls_t *tls)
{
    pool->tls = tls;
    if (tls && pool->session == NULL)
        pool->session = baton_tls_session_new(); /* NULL: every handshake a full one */
}

unsigned baton_http_pool_connections(const baton_http_pool_t *pool)
{
    return pool->n_conns;
}

static int skip_header(const char *name)
{
    return strcasecmp(name, "host") == 0 || strcasecmp(name, "content-length") == 0 ||
           strcasecmp(name, "connection") == 0 || strcasecmp(name, "transfer-encoding") == 0;
}

static int build_request_head(creq_t *r, const char *method, const char *path,
                              const baton_http_header_t *headers, size_t n_headers)
{
    baton_buf_t *b = &r->head;
    size_t need = strlen(method) + strlen(path) + strlen(r->pool->host_hdr) + 96;
    for (size_t i = 0; i < n_headers; i++)
        need += strlen(headers[i].name) + strlen(headers[i].value) + 4;
    if (baton_buf_reserve(b, need) != 0)
        return BATON_ENOMEM;
    /* Appends, not printf: this runs for every upstream request (issue 15). */
    int err = baton_buf_append_str(b, method) || baton_buf_append(b, " ", 1) ||
              baton_buf_append_str(b, path) || baton_buf_append_str(b, " HTTP/1.1\r\nHost: ") ||
              baton_buf_append_str(b, r->pool->host_hdr) || baton_buf_append(b, "\r\n", 2);
    for (size_t i = 0; !err && i < n_headers; i++) {
        if (skip_header(headers[i].name))
            continue;
        err = baton_buf_append_str(b, headers[i].name) || baton_buf_append(b, ": ", 2) ||
              baton_buf_append_str(b, headers[i].value) || baton_buf_append(b, "\r\n", 2);
    }
    int wants_len = r->body_len > 0 || strcmp(method, "POST") == 0 || strcmp(method, "PUT") == 0 ||
                    strcmp(method, "PATCH") == 0;
    if (!err && wants_len)
        err = baton_buf_append_str(b, "Content-Length: ") ||
              baton_buf_append_uint(b, r->body_len) || baton_buf_append(b, "\r\n", 2);
    if (!err)
        err = baton_buf_append_str(b, "Connection: keep-alive\r\n\r\n");
    if (err) {
        baton_buf_free(b);
        return BATON_ENOMEM;
    }
    return 0;
}

static int has_bad_chars(const char *s)
{
    for (; *s; s++)
        if (*s == '\r' || *s == '\n')
            return 1;
    return 0;
}

/* The segments to write after the head (empty ones left out); 0 or an error. */
static int set_body(creq_t *r, const uv_buf_t *body, unsigned n_body)
{
    unsigned n = 0;
    for (unsigned i = 0; i < n_body; i++)
        n += body[i].len > 0;
    r->wbufs = r->wbufs_inline;
    if (n > BODY_SEGS_INLINE && !(r->wbufs = malloc((1 + (size_t)n) * sizeof(uv_buf_t))))
        return BATON_ENOMEM;
    r->n_wbufs = 1;
    r->body_len = 0;
    for (unsigned i = 0; i < n_body; i++) {
        if (body[i].len == 0)
            continue;
        r->wbufs[r->n_wbufs++] = body[i];
        r->body_len += body[i].len;
    }
    return 0;
}

int baton_http_requestv(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                        const char *path, const baton_http_header_t *headers, size_t n_headers,
                        const uv_buf_t *body, unsigned n_body,
                        const baton_http_timeouts_t *timeouts, const baton_http_client_cb_t *cb,
                        void *data)
{
    if (req_p == NULL || pool == NULL || method == NULL || path == NULL || cb == NULL ||
        cb->on_done == NULL || (body == NULL && n_body > 0) || (n_headers && !headers))
        return BATON_EINVAL;
    size_t total = 0;
    for (unsigned i = 0; i < n_body; i++) {
        if ((body[i].base == NULL && body[i].len > 0) || body[i].len > SIZE_MAX - total)
            return BATON_EINVAL;
        total += body[i].len;
    }
    if (pool->destroyed)
        return BATON_ESHUTDOWN;
    /* Header injection through a path or header would desynchronise the connection. */
    if (has_bad_chars(method) || has_bad_chars(path) || strchr(method, ' ') || strchr(path, ' '))
        return BATON_EINVAL;
    for (size_t i = 0; i < n_headers; i++)
        if (has_bad_chars(headers[i].name) || has_bad_chars(headers[i].value))
            return BATON_EINVAL;

    creq_t *r = creq_alloc(pool);
    if (r == NULL)
        return BATON_ENOMEM;
    r->pool = pool;
    r->pub.data = data;
    r->cb = *cb;
    if (timeouts)
        r->to = *timeouts;
    r->is_head = strcmp(method, "HEAD") == 0;
    int err = set_body(r, body, n_body);
    err = err ? err : build_request_head(r, method, path, headers, n_headers);
    if (err) {
        if (r->wbufs != r->wbufs_inline)
            free(r->wbufs);
        creq_free(r);
        return err;
    }
    uv_timer_init(pool->loop, &r->timer);
    r->timer.data = r;
    pool->n_reqs++;
    uint64_t now = uv_now(pool->loop);
    if (r->to.total_ms)
        r->total_deadline = now + r->to.total_ms;
    *req_p = &r->pub;

    cconn_t *conn;
    while ((conn = idle_first(pool)) != NULL) {
        idle_unlink(conn);
        attach(conn, r);
        if (send_request(r) == 0)
            return 0;
        conn->req = NULL;
        r->conn = NULL;
        conn_close(conn);
    }
    err = conn_open(pool, r);
    if (err)
        defer_finish(r, BATON_ECONNECT);
    return 0;
}

int baton_http_request(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                       const char *path, const baton_http_header_t *headers, size_t n_headers,
                       const char *body, size_t body_len, const baton_http_timeouts_t *timeouts,
                       const baton_http_client_cb_t *cb, void *data)
{
    if (body == NULL && body_len > 0)
        return BATON_EINVAL;
    uv_buf_t seg = {.base = (char *)body, .len = body_len};
    return baton_http_requestv(req_p, pool, method, path, headers, n_headers, &seg, body ? 1 : 0,
                               timeouts, cb, data);
}

void baton_http_request_pause(baton_http_creq_t *req, int paused)
{
    creq_t *r = container_of(req, creq_t, pub);
    if (r->done)
        return;
    uint64_t now = uv_now(r->pool->loop);
    if (paused && !r->paused) {
        r->paused = 1;
        r->paused_at = now;
        if (r->tmode == CT_PHASE || r->tmode == CT_RESUME) {
            uv_timer_stop(&r->timer);
            r->tmode = CT_NONE;
        }
        if (r->conn && r->conn->connected && !r->conn->closing)
            uv_read_stop((uv_stream_t *)&r->conn->tcp);
    } else if (!paused && r->paused) {
        r->paused = 0;
        uint64_t d = now - r->paused_at;
        if (r->total_deadline)
            r->total_deadline += d;
        r->phase_start += d;
        r->last_read = now;
        timer_set(r, CT_RESUME, 0);
    }
}

void baton_http_request_cancel(baton_http_creq_t *req)
{
    creq_t *r = container_of(req, creq_t, pub);
    if (r->done)
        return;
    if (r->conn) {
        cconn_t *conn = r->conn;
        conn->req = NULL;
        r->conn = NULL;
        conn_close(conn);
    }
    defer_finish(r, BATON_ECANCELED);
}

const baton_http_client_ops_t baton_http_client_ops = {
    .pool_create = baton_http_pool_create,
    .pool_destroy = baton_http_pool_destroy,
    .request = baton_http_request,
    .requestv = baton_http_requestv,
    .pause = baton_http_request_pause,
    .cancel = baton_http_request_cancel,
    .set_tls = baton_http_pool_set_tls,
};
