/* server_conn.c — an HTTP server connection: states, reading, parsing, timers, closing. */
#include "http/server_internal.h"

#include "baton/error.h"
#include "common/log.h"
#include "common/phase.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

/* After an error response, unread request bytes are drained this long before the close, so the
 * kernel sends FIN rather than RST and the client gets to read the error. */
#define LINGER_MS 2000
/* Initial arena: a typical request line + headers fits without a realloc. */
#define ARENA_INIT 1024
/* Bodies this small (and at most max/64) may use the budget's reserve of max/8. */
#define SMALL_BODY_MAX (1024 * 1024)

static void on_timer(uv_timer_t *t);
static void conn_maybe_free(conn_t *c);

/* ---------------------------------------------------------------------------------------- */
/* States                                                                                    */

#define B(st) BATON_PHASE_BIT(st)
/* Every live state may end: LINGER (answered, or no keep-alive: FIN, drain) while the server
 * still owns the request bytes, CLOSED when the socket goes. */
#define ENDS (B(CS_LINGER) | B(CS_CLOSED))
static const uint32_t state_next[CS_COUNT] = {
    [CS_IDLE] = B(CS_HEAD) | ENDS,
    /* A request without a body goes to the handler from its head. */
    [CS_HEAD] = B(CS_BODY) | B(CS_HANDLER) | ENDS,
    [CS_BODY] = B(CS_BODY_WAIT) | B(CS_HANDLER) | ENDS,
    [CS_BODY_WAIT] = B(CS_BODY) | ENDS,
    /* Finished (keep-alive: the next request, or LINGER from IDLE), or the socket closed under
     * the handler. */
    [CS_HANDLER] = B(CS_IDLE) | B(CS_ABORTED),
    [CS_LINGER] = B(CS_CLOSED),
    [CS_ABORTED] = B(CS_CLOSED), /* the handler finished */
    [CS_CLOSED] = B(CS_FREEING),
    [CS_FREEING] = 0,
};
#undef ENDS
#undef B

static const char *const state_names[CS_COUNT] = {
    [CS_IDLE] = "idle",           [CS_HEAD] = "head",       [CS_BODY] = "body",
    [CS_BODY_WAIT] = "body_wait", [CS_HANDLER] = "handler", [CS_LINGER] = "linger",
    [CS_ABORTED] = "aborted",     [CS_CLOSED] = "closed",   [CS_FREEING] = "freeing",
};

static const baton_phase_table_t state_table = {"http", "conn_state", CS_COUNT, state_next,
                                                state_names};

int baton__hs_state_allowed(baton__hs_state_t from, baton__hs_state_t to)
{
    return baton_phase_legal(&state_table, from, to);
}

const char *baton__hs_state_name(baton__hs_state_t st)
{
    return baton_phase_name(&state_table, st);
}

int baton__hs_set_state(conn_t *c, baton__hs_state_t to)
{
    int rc = BATON_PHASE_MOVE(&state_table, c->state, to, "peer=%s", c->req.peer);
    if (rc != 0)
        c->srv->state_refused++; /* this server's share of baton_phase_refused() */
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* A request's life                                                                          */

const baton_http_header_t *baton_http_req_header(const baton_http_req_t *req, const char *name)
{
    for (size_t i = 0; i < req->n_headers; i++)
        if (strcasecmp(req->headers[i].name, name) == 0)
            return &req->headers[i];
    return NULL;
}

void baton__hs_timer_start(conn_t *c, enum baton__hs_timer_mode mode, uint64_t ms)
{
    c->timer_mode = (uint8_t)mode;
    uv_timer_start(&c->timer, on_timer, ms, 0);
}

void baton__hs_req_reset(conn_t *c)
{
    srv_t *srv = c->srv;
    baton__hs_buf_give(&srv->spare_arena, &c->head.arena);
    baton__hs_buf_give(&srv->spare_hdrs, &c->head.hdrs);
    baton__hs_buf_give(&srv->spare_body, &c->body);
    baton__hs_body_release(c);
    c->small_body = 0;
    c->reserved = 0;
    c->body_total = 0;
    baton_http_req_t *r = &c->req;
    r->data = NULL;
    r->on_abort = NULL;
    r->on_drain = NULL;
    r->method = "";
    r->path = "";
    r->query = "";
    r->headers = NULL;
    r->n_headers = 0;
    r->body = "";
    r->body_len = 0;
}

void baton__hs_arm_idle(conn_t *c)
{
    /* A TLS handshake still going on is bounded by the header timeout, not the idle one. */
    if (c->tls && !baton_tls_conn_established(c->tls) && c->srv->limits.header_timeout_ms)
        baton__hs_timer_start(c, TM_HEAD, c->srv->limits.header_timeout_ms);
    else if (c->srv->limits.keepalive_timeout_ms)
        baton__hs_timer_start(c, TM_IDLE, c->srv->limits.keepalive_timeout_ms);
    else
        uv_timer_stop(&c->timer);
}

static void dispatch(conn_t *c)
{
    baton_http_req_t *r = &c->req;
    r->body = c->body.data ? c->body.data : "";
    r->body_len = c->body.len;
    c->streaming = 0;
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    c->srv->handler(r, c->srv->ctx);
}

/* The handler is done with the request (respond or stream_end). */
void baton__hs_req_finish(conn_t *c)
{
    int aborted = c->state == CS_ABORTED;
    baton__hs_set_state(c, aborted ? CS_CLOSED : CS_IDLE);
    c->streaming = 0;
    baton__hs_req_reset(c);
    baton__hs_cork_unlink(c); /* empty by now (stream_end wrote it); the storage goes back */
    baton__hs_buf_give(&c->srv->spare_cork, &c->cork);
    if (aborted) {
        conn_maybe_free(c);
        return;
    }
    if (!c->keep_alive || c->srv->stopping) {
        baton__hs_close_graceful(c);
        return;
    }
    if (c->in_feed)
        return; /* baton__hs_feed goes on with the bytes it holds */
    if (c->read_stopped) {
        c->read_stopped = 0;
        baton__hs_read_start(c);
        if (baton__hs_tcp_closing(c))
            return;
    }
    if (c->pending.len > 0)
        baton__hs_timer_start(c, TM_RESUME, 0);
    else
        baton__hs_arm_idle(c);
}

/* ---------------------------------------------------------------------------------------- */
/* llhttp callbacks                                                                          */

static int fail_cb(conn_t *c, int status, const char *msg)
{
    c->err_status = status;
    c->err_msg = msg;
    return -1;
}

/* The head module's verdict (http/head.h) as the answer it gets. */
static int head_rc(conn_t *c, int rc)
{
    if (rc == 0)
        return 0;
    if (rc == BATON__HEAD_TOO_MANY)
        return fail_cb(c, 431, "too many request headers");
    if (rc == BATON__HEAD_TOO_LARGE)
        return fail_cb(c, 431, "request line and headers are too large");
    return fail_cb(c, 500, "out of memory");
}

static int on_message_begin(llhttp_t *p)
{
    conn_t *c = p->data;
    srv_t *srv = c->srv;
    baton__hs_set_state(c, CS_HEAD);
    baton__hs_req_reset(c);
    c->req.start_ns = uv_hrtime();
    baton__hs_buf_take(&srv->spare_arena, &c->head.arena);
    baton__hs_buf_take(&srv->spare_hdrs, &c->head.hdrs);
    baton__http_head_begin(&c->head, srv->limits.max_header_bytes, srv->limits.max_headers);
    /* Room for 16 headers' offsets and pointers: no realloc for a typical request. */
    if (baton_buf_reserve(&c->head.arena, ARENA_INIT) != 0 ||
        baton_buf_reserve(&c->head.hdrs, 512) != 0)
        return fail_cb(c, 500, "out of memory");
    if (c->srv->limits.header_timeout_ms)
        baton__hs_timer_start(c, TM_HEAD, c->srv->limits.header_timeout_ms);
    else
        uv_timer_stop(&c->timer);
    return 0;
}

/* The request target goes first into the head's arena (offset 0), NUL-terminated. */
static int on_url(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    /* RFC 9112 3.2: the request target is visible ASCII (llhttp lets tabs and bytes >= 0x80
     * through, which a proxy would forward as they came). */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)at[i] < 0x21 || (unsigned char)at[i] > 0x7e)
            return fail_cb(c, 400, "malformed HTTP request: invalid byte in the request target");
    return head_rc(c, baton__http_head_append(&c->head, at, len));
}

static int on_url_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    return head_rc(c, baton__http_head_append(&c->head, "", 1));
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    return head_rc(c, baton__http_head_field(&c->head, at, len));
}

static int on_header_field_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    return head_rc(c, baton__http_head_field_done(&c->head));
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    return head_rc(c, baton__http_head_value(&c->head, at, len));
}

static int on_header_value_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    return head_rc(c, baton__http_head_value_done(&c->head));
}

/* Whether the request's Transfer-Encoding lines, together, name exactly one coding: chunked
 * (RFC 9112 6.1: a server that does not implement a coding answers 501; llhttp would read the
 * body as chunked and ignore the rest). */
static int te_chunked_only(const baton_http_req_t *r)
{
    int n = 0;
    for (size_t i = 0; i < r->n_headers; i++) {
        if (strcasecmp(r->headers[i].name, "transfer-encoding") != 0)
            continue;
        for (const char *v = r->headers[i].value; *v;) {
            v += strspn(v, " \t,");
            size_t len = strcspn(v, " \t,");
            if (len == 0)
                continue;
            if (len != 7 || strncasecmp(v, "chunked", 7) != 0 || ++n > 1)
                return 0;
            v += len;
        }
    }
    return n == 1;
}

static int on_headers_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    srv_t *srv = c->srv;
    baton_http_req_t *r = &c->req;
    if (p->http_major != 1)
        return fail_cb(c, 505, "only HTTP/1.x is supported");
    /* The arena is final now (trailers are dropped): the headers point into it. */
    if (head_rc(c, baton__http_head_finish(&c->head, &r->headers, &r->n_headers)) != 0)
        return -1;

    char *url = c->head.arena.data; /* reserved in on_message_begin: never NULL here */
    char *q = strchr(url, '?');
    if (q) {
        *q = '\0';
        r->query = q + 1;
    } else {
        r->query = "";
    }
    r->path = url;
    r->method = llhttp_method_name((llhttp_method_t)p->method);
    r->http_minor = p->http_minor;
    c->no_body_out = (p->method == HTTP_HEAD);

    int chunked = (p->flags & F_CHUNKED) != 0;
    int has_len = (p->flags & F_CONTENT_LENGTH) != 0;
    if ((p->flags & F_TRANSFER_ENCODING) && !te_chunked_only(r))
        return fail_cb(c, 501, "transfer codings other than chunked are not implemented");
    if (has_len && p->content_length > srv->limits.max_body_bytes)
        return fail_cb(c, 413, "request body is too large");
    int want_body = chunked || (has_len && p->content_length > 0);
    if (want_body)
        baton__hs_buf_take(&srv->spare_body, &c->body);
    if (has_len && p->content_length > 0 &&
        baton_buf_reserve(&c->body, (size_t)p->content_length) != 0)
        return fail_cb(c, 500, "out of memory");
    if (want_body) {
        baton__hs_set_state(c, CS_BODY);
        const baton_http_budget_t *b = srv->budget;
        c->small_body =
            b && has_len && p->content_length <= SMALL_BODY_MAX && p->content_length <= b->max / 64;
        c->body_total = has_len && !chunked ? (size_t)p->content_length : 0;
        baton__hs_budget_admit(c); /* reserve now if it fits; else its next read waits (on_alloc) */
        const baton_http_header_t *e = baton_http_req_header(r, "expect");
        if (e && p->http_minor >= 1 && strcasecmp(e->value, "100-continue") == 0)
            baton__hs_send_continue(c);
        c->last_read = uv_now(srv->loop);
        if (srv->limits.body_timeout_ms)
            baton__hs_timer_start(c, TM_BODY, srv->limits.body_timeout_ms);
        else
            uv_timer_stop(&c->timer);
    }
    return 0;
}

static int on_chunk_header(llhttp_t *p)
{
    conn_t *c = p->data;
    if (p->content_length > c->srv->limits.max_body_bytes - c->body.len)
        return fail_cb(c, 413, "request body is too large");
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (len > c->srv->limits.max_body_bytes - c->body.len)
        return fail_cb(c, 413, "request body is too large");
    if (baton_buf_append(&c->body, at, len) != 0)
        return fail_cb(c, 500, "out of memory");
    if (!c->reserved) { /* chunked, or read before its reservation: charged as read */
        c->charged += len;
        baton__hs_budget_add(c->srv, len);
    }
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    if (baton__hs_closing(c))
        return HPE_PAUSED;              /* a write inside a callback failed: nothing to hand over */
    baton__hs_set_state(c, CS_HANDLER); /* baton__hs_feed hands it to the handler */
    c->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    /* Stop here: the rest of the buffer is the next (pipelined) request, parsed only after
     * this one is finished. */
    return HPE_PAUSED;
}

void baton__hs_settings_init(llhttp_settings_t *s)
{
    llhttp_settings_init(s);
    s->on_message_begin = on_message_begin;
    s->on_url = on_url;
    s->on_url_complete = on_url_complete;
    s->on_header_field = on_header_field;
    s->on_header_field_complete = on_header_field_complete;
    s->on_header_value = on_header_value;
    s->on_header_value_complete = on_header_value_complete;
    s->on_headers_complete = on_headers_complete;
    s->on_chunk_header = on_chunk_header;
    s->on_body = on_body;
    s->on_message_complete = on_message_complete;
}

/* ---------------------------------------------------------------------------------------- */
/* Reading and parsing                                                                       */

void baton__hs_stash(conn_t *c, const char *data, size_t len)
{
    if (baton_buf_append(&c->pending, data, len) != 0) {
        baton__hs_close_hard(c);
        return;
    }
    /* Back-pressure on a client that pipelines faster than we answer. */
    if (c->pending.len > c->srv->limits.max_header_bytes && !c->read_stopped) {
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->read_stopped = 1;
    }
}

static void parse_error(conn_t *c, llhttp_errno_t e)
{
    if (c->err_status) {
        int st = c->err_status;
        const char *code = st == 413   ? "request_too_large"
                           : st == 431 ? "request_header_fields_too_large"
                           : st == 505 ? "http_version_not_supported"
                           : st == 501 ? "not_implemented"
                           : st == 400 ? "bad_request"
                                       : "internal_error";
        baton__hs_send_error(c, st, c->err_msg, code);
        return;
    }
    char msg[160];
    const char *reason = llhttp_get_error_reason(&c->parser);
    snprintf(msg, sizeof(msg), "malformed HTTP request: %s (%s)", reason ? reason : "parse error",
             llhttp_errno_name(e));
    baton__hs_send_error(c, 400, msg, "bad_request");
}

void baton__hs_feed(conn_t *c, const char *data, size_t len)
{
    c->in_feed = 1;
    while (len > 0 && !baton__hs_closing(c)) {
        if (c->state == CS_HANDLER) {
            baton__hs_stash(c, data, len);
            break;
        }
        if (c->parser_paused) {
            llhttp_resume(&c->parser);
            c->parser_paused = 0;
        }
        llhttp_errno_t e = llhttp_execute(&c->parser, data, len);
        if (e == HPE_OK || baton__hs_closing(c)) /* closing: a write inside a callback failed */
            break;
        if (e == HPE_PAUSED && c->state == CS_HANDLER && c->err_status == 0) {
            size_t used = (size_t)(llhttp_get_error_pos(&c->parser) - data);
            data += used;
            len -= used;
            c->parser_paused = 1;
            dispatch(c);
            continue;
        }
        parse_error(c, e);
        break;
    }
    c->in_feed = 0;
    if (baton__hs_closing(c) || c->state == CS_HANDLER)
        return;
    if (c->read_stopped) { /* stopped while the pipeline backlog was over the limit */
        c->read_stopped = 0;
        baton__hs_read_start(c);
        if (baton__hs_tcp_closing(c))
            return;
    }
    /* Not re-armed by bytes that start no request (stray CRLFs cannot keep a connection). */
    if (c->state == CS_IDLE && c->timer_mode != TM_IDLE)
        baton__hs_arm_idle(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    if (!baton__hs_budget_admit(c)) {
        *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS: wait for the budget */
        return;
    }
    buf->base = c->srv->rbuf;
    buf->len = BATON__HS_READ_BUF;
}

/* Plaintext in: straight from the socket, or decrypted by the TLS layer. */
static int conn_on_plain(void *owner, const char *data, size_t len)
{
    conn_t *c = owner;
    if (baton__hs_closing(c))
        return 1; /* lingering: drop */
    if (c->timer_mode == TM_BODY)
        c->last_read = uv_now(c->srv->loop);
    if (c->state == CS_HANDLER || c->pending.len > 0) {
        baton__hs_stash(c, data, len);
        return baton__hs_closing(c);
    }
    baton__hs_feed(c, data, len);
    return baton__hs_closing(c);
}

/* A TLS connection on this HTTPS listener (the handshake starts with the client's bytes). */
int baton__hs_tls_attach(conn_t *c)
{
    if (baton_tls_conn_create(&c->tls, c->srv->tls, NULL) != 0) {
        log_error("http", "tls_conn_oom peer=%s", c->req.peer);
        baton__hs_close_hard(c);
        return -1;
    }
    baton_tls_conn_set_peer(c->tls, c->req.peer);
    return 0;
}

static void on_tls_read(conn_t *c, const char *data, size_t len)
{
    int was_up = baton_tls_conn_established(c->tls);
    baton_buf_t out = BATON_BUF_INIT;
    int rc = baton_tls_conn_feed(c->tls, data, len, &out, conn_on_plain, c);
    baton__hs_write_out(c, &out); /* handshake replies, or the alert that ends it */
    if (rc == 1) {                /* close_notify: the client's EOF */
        baton__hs_close_hard(c);
    } else if (rc != 0) {
        if (baton_tls_conn_reason(c->tls) == BATON_TLS_R_PLAINTEXT)
            baton__hs_send_plaintext_refusal(c);
        c->keep_alive = 0;
        baton__hs_close_graceful(c);
    } else if (!was_up && baton_tls_conn_established(c->tls) && c->state == CS_IDLE &&
               c->timer_mode == TM_HEAD) {
        baton__hs_arm_idle(c); /* handshake done: from now on an idle connection like any other */
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (nread == 0)
        return;
    if (nread == UV_ENOBUFS && !baton__hs_closing(c)) {
        baton__hs_budget_wait(c);
        return;
    }
    if (nread == UV_EOF && !c->tls && c->srv->limits.answer_half_closed &&
        (c->state == CS_HANDLER || (c->state == CS_IDLE && c->wq_bytes))) {
        /* The client half-closed after a whole request: HTTP lets it, so its answer still goes
         * out, then the connection closes (nothing more can come). A client that is really gone
         * shows when a write to it fails. */
        uv_read_stop(s);
        c->read_stopped = 1;
        c->keep_alive = 0;
        if (c->state != CS_HANDLER)
            baton__hs_close_graceful(c); /* the answer is queued: shut down once it is written */
        return;
    }
    if (nread < 0) {
        if (c->tls)
            baton_tls_conn_eof(c->tls);
        baton__hs_close_hard(c);
        return;
    }
    if (baton__hs_closing(c))
        return; /* lingering: drop */
    if (c->tls)
        on_tls_read(c, buf->base, (size_t)nread);
    else
        conn_on_plain(c, buf->base, (size_t)nread);
}

void baton__hs_read_start(conn_t *c)
{
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        baton__hs_close_hard(c);
}

static void on_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    baton_http_limits_t *lim = &c->srv->limits;
    enum baton__hs_timer_mode mode = c->timer_mode;
    c->timer_mode = TM_NONE;
    switch (mode) {
    case TM_IDLE:
    case TM_LINGER:
        baton__hs_close_hard(c);
        break;
    case TM_HEAD:
        if (c->tls && !baton_tls_conn_established(c->tls))
            baton_tls_conn_timed_out(c->tls); /* the header timeout bounds the handshake too */
        baton__hs_send_error(c, 408, "timed out reading the request headers", "request_timeout");
        break;
    case TM_BODY: {
        uint64_t idle = uv_now(c->srv->loop) - c->last_read;
        if (idle < lim->body_timeout_ms) {
            baton__hs_timer_start(c, TM_BODY, lim->body_timeout_ms - idle);
            break;
        }
        if (c->state == CS_BODY_WAIT) { /* the client was not slow: we did not read */
            baton__hs_send_error(
                c, 503, "server busy: too many request bytes buffered; retry later", "server_busy");
            break;
        }
        baton__hs_send_error(c, 408, "timed out reading the request body", "request_timeout");
        break;
    }
    case TM_ABORT:
        if (c->state == CS_ABORTED && c->req.on_abort) /* not finished meanwhile */
            c->req.on_abort(&c->req);
        break;
    case TM_RESUME: {
        baton_buf_t p = c->pending;
        c->pending = (baton_buf_t)BATON_BUF_INIT;
        if (p.len > 0)
            baton__hs_feed(c, p.data, p.len);
        else if (c->state == CS_IDLE)
            baton__hs_arm_idle(c);
        baton_buf_free(&p);
        break;
    }
    case TM_NONE:
        break;
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Closing                                                                                   */

static void on_timer_close(uv_handle_t *h)
{
    conn_t *c = h->data;
    srv_t *srv = c->srv;
    baton_list_remove(&c->link);
    baton__hs_buf_give(&srv->spare_arena, &c->head.arena);
    baton__hs_buf_give(&srv->spare_hdrs, &c->head.hdrs);
    baton__hs_buf_give(&srv->spare_body, &c->body);
    baton__hs_body_release(c);
    baton_buf_free(&c->pending);
    baton__hs_cork_unlink(c);
    baton_buf_free(&c->cork);
    baton_tls_conn_free(c->tls);
    free(c);
    srv->n_live--;
    baton__hs_server_maybe_done(srv);
}

static void conn_maybe_free(conn_t *c)
{
    if (!c->tcp_closed || c->state != CS_CLOSED)
        return;
    baton__hs_set_state(c, CS_FREEING);
    uv_close((uv_handle_t *)&c->timer, on_timer_close);
}

void baton__hs_on_tcp_close(uv_handle_t *h)
{
    conn_t *c = h->data;
    c->tcp_closed = 1;
    conn_maybe_free(c);
}

void baton__hs_close_hard(conn_t *c)
{
    if (baton__hs_tcp_closing(c))
        return;
    int held = c->state == CS_HANDLER;
    baton__hs_set_state(c, held ? CS_ABORTED : CS_CLOSED);
    if (c->counted) {
        c->counted = 0;
        c->srv->n_conns--;
    }
    uv_close((uv_handle_t *)&c->tcp, baton__hs_on_tcp_close);
    baton_buf_free(&c->pending);
    baton__hs_cork_unlink(c); /* unsent stream bytes are dropped with the connection */
    baton_buf_free(&c->cork);
    /* on_abort must not run inside whatever call got us here. */
    if (held)
        baton__hs_timer_start(c, TM_ABORT, 0);
    else
        uv_timer_stop(&c->timer);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    conn_t *c = sr->data;
    if (status < 0 || baton__hs_tcp_closing(c)) {
        baton__hs_close_hard(c);
        return;
    }
    if (c->read_stopped) {
        c->read_stopped = 0;
        baton__hs_read_start(c);
        if (baton__hs_tcp_closing(c))
            return;
    }
    baton__hs_timer_start(c, TM_LINGER, LINGER_MS);
}

/* Flushes queued writes, sends FIN, drains what the client still sends, then closes. A request
 * still with the handler cannot linger (the handler's answer would go after the FIN): that
 * connection closes at once, and the handler sees on_abort. */
void baton__hs_close_graceful(conn_t *c)
{
    if (baton__hs_closing(c))
        return;
    if (c->state == CS_HANDLER) {
        baton__hs_close_hard(c);
        return;
    }
    baton__hs_set_state(c, CS_LINGER);
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    baton_buf_free(&c->pending);
    if (c->tls) {
        baton_buf_t out = BATON_BUF_INIT;
        baton_tls_conn_close_notify(c->tls, &out);
        baton__hs_write_out(c, &out);
        if (baton__hs_tcp_closing(c))
            return;
    }
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        baton__hs_close_hard(c);
}
