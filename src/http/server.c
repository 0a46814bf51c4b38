/* server.c — HTTP/1.1 server: accept, llhttp parsing, limits, keep-alive, responses, streaming. */
#include "http/server.h"

#include "http/tls.h"

#include "baton/error.h"
#include "common/buf.h"
#include "common/list.h"
#include "common/log.h"

#include <errno.h>
#include <llhttp.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* One read buffer per server (per loop): libuv hands it to exactly one read_cb at a time and
 * nothing keeps pointers into it after read_cb returns, so idle connections own no buffer. */
#define READ_BUF_SIZE (64 * 1024)
/* After an error response, unread request bytes are drained this long before the close, so the
 * kernel sends FIN rather than RST and the client gets to read the error. */
#define LINGER_MS 2000
/* Initial arena: a typical request line + headers fits without a realloc. */
#define ARENA_INIT 1024
#define NO_VALUE   UINT32_MAX
/* Accepts per listener wake-up: bounded so one busy listener cannot starve the loop. */
#define ACCEPT_BATCH 64
/* Out of descriptors: accepting pauses this long, doubling up to the cap (nginx pauses too). */
#define ACCEPT_BACKOFF_MIN_MS 100
#define ACCEPT_BACKOFF_MAX_MS 1000
/* How often connections waiting for the memory budget look again. */
#define BUDGET_POLL_MS 20
/* Bodies this small (and at most max/64) may use the budget's reserve of max/8. */
#define SMALL_BODY_MAX (1024 * 1024)
/* Request buffers (head arena, header offsets, body) a finished request hands back to its server
 * for the next one, so a request on a busy loop allocates none while idle keep-alive
 * connections still own no buffer. Bounded in count and size (a larger one is freed). */
#ifndef BATON_POOL_REUSE
#define BATON_POOL_REUSE 1 /* 0 in sanitizer builds (CMakeLists.txt) */
#endif
#define SPARE_BUFS    64
#define SPARE_BUF_MAX (64 * 1024)
/* A streamed response's head and chunks written during one loop turn are gathered and sent in
 * one write when the turn's I/O callbacks are done (a uv_check handle), not one syscall each:
 * an upstream read carrying several SSE events costs one write to the client. Past this many
 * bytes they go out at once. */
#define CORK_MAX (64 * 1024)

enum timer_mode {
    TM_NONE,
    TM_IDLE,   /* keep-alive wait: silent close */
    TM_HEAD,   /* first byte → end of headers: 408 */
    TM_BODY,   /* longest gap between body reads: 408 */
    TM_ABORT,  /* deliver on_abort on a later loop turn */
    TM_RESUME, /* parse bytes that arrived while the previous request was with the handler */
    TM_LINGER, /* draining after an error response */
};

typedef struct hdr_off_s {
    uint32_t name;
    uint32_t value;
} hdr_off_t;

typedef struct conn_s conn_t;

typedef struct spare_s {
    baton_buf_t b[SPARE_BUFS];
    unsigned n;
} spare_t;

struct baton_http_server_s {
    uv_loop_t *loop;
    /* The listening socket is polled and accepted here rather than by uv_listen: libuv retries
     * accept at once after EMFILE, so a process out of descriptors would spin on it. */
    uv_poll_t listener;
    int listen_fd;
    uv_timer_t accept_timer; /* the back-off while out of descriptors */
    uint64_t accept_backoff_ms;
    baton_http_budget_t *budget; /* NULL: none */
    uv_timer_t budget_timer;     /* runs while a connection waits for the budget */
    /* Closed by server_close only: its close callback completes a close on a later loop turn
     * even when stop_accepting already closed the listener and no connection is left. */
    uv_timer_t close_token;
    baton_http_limits_t limits;
    baton_http_handler_cb handler;
    void *ctx;
    baton_tls_t *tls; /* not owned; NULL: plain TCP */
    llhttp_settings_t settings;
    char *rbuf;
    spare_t spare_arena, spare_hdrs, spare_body, spare_cork; /* see SPARE_BUFS */
    baton_buf_t tls_scratch; /* ciphertext of one write (conn_write) */
    int tls_scratch_busy;
    uv_check_t flush_check; /* runs while a connection has corked bytes (CORK_MAX) */
    baton_list_t corked;    /* of conn_t.cork_link */
    baton_list_t conns;     /* of conn_t.link: every connection until its memory is freed */
    unsigned n_conns;       /* open, counted against max_connections */
    unsigned n_live;        /* listener + connection structs not yet freed */
    int port;
    unsigned listening : 1;
    unsigned listener_inited : 1;
    unsigned accept_paused : 1;
    unsigned listener_closing : 1;
    unsigned stopping : 1;
    unsigned closing : 1;
    baton_http_server_close_cb close_cb;
};

typedef struct wreq_s {
    uv_write_t req;
    conn_t *conn;
    size_t len;
    char data[];
} wreq_t;

struct conn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown_req;
    llhttp_t parser;
    baton_http_server_t *srv;
    baton_tls_conn_t *tls; /* NULL on a plain TCP listener */
    baton_list_t link;     /* in srv->conns */
    size_t charged;        /* body bytes counted in srv->budget (reserved or read) */
    size_t body_total;     /* the Content-Length of the body being read; 0 when chunked */
    baton_http_req_t req;  /* the one request being read or handled */
    baton_buf_t arena;     /* url, header names and values, each NUL-terminated */
    baton_buf_t hdrs;      /* hdr_off_t[] while parsing, then baton_http_header_t[] after them */
    baton_buf_t body;
    baton_buf_t pending;    /* bytes read while a request is with the handler (pipelining) */
    baton_buf_t cork;       /* streamed bytes of this loop turn, not written yet (CORK_MAX) */
    baton_list_t cork_link; /* in srv->corked while cork holds bytes */
    size_t head_bytes;
    size_t n_hdrs;
    size_t wq_bytes; /* bytes in our write requests that the socket has not taken yet */
    uint64_t last_read;
    uint32_t url_off;
    int err_status;
    const char *err_msg;
    uint8_t timer_mode;
    unsigned counted : 1;    /* counted in n_conns */
    unsigned in_msg : 1;     /* a request began and is not complete */
    unsigned in_field : 1;   /* llhttp is inside a header name */
    unsigned head_done : 1;  /* headers complete: later header callbacks are chunked trailers */
    unsigned req_active : 1; /* handed to the handler, not finished */
    unsigned keep_alive : 1;
    unsigned parser_paused : 1;
    unsigned in_feed : 1;
    unsigned closing : 1;     /* no more requests: shutting down or closed */
    unsigned tcp_closing : 1; /* uv_close called on tcp */
    unsigned tcp_closed : 1;
    unsigned timer_closing : 1;
    unsigned read_stopped : 1;
    unsigned streaming : 1;
    unsigned chunked_out : 1;
    unsigned no_body_out : 1; /* HEAD request: headers only */
    unsigned abort_sent : 1;
    unsigned in_body : 1;     /* reading a request body: reads are checked against the budget */
    unsigned small_body : 1;  /* its Content-Length lets it use the budget's reserve */
    unsigned reserved : 1;    /* its whole Content-Length is charged: it reads freely */
    unsigned in_reserve : 1;  /* charged to the small-body reserve, not the main budget */
    unsigned budget_wait : 1; /* reading stopped until the budget has room */
};

static void conn_close_hard(conn_t *c);
static void buf_take(spare_t *s, baton_buf_t *b);
static void conn_close_graceful(conn_t *c);
static void conn_send_error(conn_t *c, int status, const char *message, const char *code);
static void conn_maybe_free(conn_t *c);
static void conn_feed(conn_t *c, const char *data, size_t len);
static void server_maybe_done(baton_http_server_t *srv);
static void conn_read_start(conn_t *c);
static void on_timer(uv_timer_t *t);

/* ---------------------------------------------------------------------------------------- */
/* Limits, reason phrases, small helpers                                                     */

void baton_http_limits_default(baton_http_limits_t *limits)
{
    limits->max_header_bytes = 64 * 1024;
    limits->max_headers = 100;
    limits->max_body_bytes = 64 * 1024 * 1024;
    limits->header_timeout_ms = 30000;
    limits->body_timeout_ms = 60000;
    limits->keepalive_timeout_ms = 75000;
    limits->max_connections = 10000;
    limits->max_buffered_bytes = 0;
    limits->answer_half_closed = 0;
}

const char *baton_http_reason(int status)
{
    switch (status) {
    case 100:
        return "Continue";
    case 101:
        return "Switching Protocols";
    case 200:
        return "OK";
    case 201:
        return "Created";
    case 202:
        return "Accepted";
    case 204:
        return "No Content";
    case 206:
        return "Partial Content";
    case 301:
        return "Moved Permanently";
    case 302:
        return "Found";
    case 304:
        return "Not Modified";
    case 307:
        return "Temporary Redirect";
    case 308:
        return "Permanent Redirect";
    case 400:
        return "Bad Request";
    case 401:
        return "Unauthorized";
    case 403:
        return "Forbidden";
    case 404:
        return "Not Found";
    case 405:
        return "Method Not Allowed";
    case 406:
        return "Not Acceptable";
    case 408:
        return "Request Timeout";
    case 409:
        return "Conflict";
    case 410:
        return "Gone";
    case 411:
        return "Length Required";
    case 413:
        return "Payload Too Large";
    case 414:
        return "URI Too Long";
    case 415:
        return "Unsupported Media Type";
    case 417:
        return "Expectation Failed";
    case 422:
        return "Unprocessable Entity";
    case 429:
        return "Too Many Requests";
    case 431:
        return "Request Header Fields Too Large";
    case 499:
        return "Client Closed Request";
    case 500:
        return "Internal Server Error";
    case 501:
        return "Not Implemented";
    case 502:
        return "Bad Gateway";
    case 503:
        return "Service Unavailable";
    case 504:
        return "Gateway Timeout";
    case 505:
        return "HTTP Version Not Supported";
    default:
        break;
    }
    if (status >= 100 && status < 200)
        return "Informational";
    if (status >= 200 && status < 300)
        return "Success";
    if (status >= 300 && status < 400)
        return "Redirection";
    if (status >= 400 && status < 500)
        return "Client Error";
    return "Server Error";
}

const baton_http_header_t *baton_http_req_header(const baton_http_req_t *req, const char *name)
{
    for (size_t i = 0; i < req->n_headers; i++)
        if (strcasecmp(req->headers[i].name, name) == 0)
            return &req->headers[i];
    return NULL;
}

static int json_append_string(baton_buf_t *b, const char *s)
{
    return baton_buf_append_json_string(b, s, strlen(s));
}

static int error_json(baton_buf_t *b, const char *message, const char *type, const char *param,
                      const char *code)
{
    int r = baton_buf_append_str(b, "{\"error\":{\"message\":");
    r = r ? r : json_append_string(b, message ? message : "");
    r = r ? r : baton_buf_append_str(b, ",\"type\":");
    r = r ? r : json_append_string(b, type ? type : "");
    r = r ? r : baton_buf_append_str(b, ",\"param\":");
    r = r ? r : (param ? json_append_string(b, param) : baton_buf_append_str(b, "null"));
    r = r ? r : baton_buf_append_str(b, ",\"code\":");
    r = r ? r : (code ? json_append_string(b, code) : baton_buf_append_str(b, "null"));
    r = r ? r : baton_buf_append_str(b, "}}");
    return r;
}

static void timer_start(conn_t *c, enum timer_mode mode, uint64_t ms)
{
    c->timer_mode = (uint8_t)mode;
    uv_timer_start(&c->timer, on_timer, ms, 0);
}

/* ---------------------------------------------------------------------------------------- */
/* The memory budget (server.h)                                                              */

static void budget_add(baton_http_server_t *srv, size_t n)
{
    if (srv->budget && n)
        atomic_fetch_add(&srv->budget->used, n);
}

static void budget_sub(baton_http_server_t *srv, size_t n)
{
    if (srv->budget && n)
        atomic_fetch_sub(&srv->budget->used, n);
}

/*
 * Whether c may read more of its body now. A body with a Content-Length is admitted whole: its
 * length is charged at once (all or nothing), so bodies never each hold part of the budget
 * while all wait for more (a deadlock only the body timeout would break). A chunked body is
 * charged as it is read, one read at a time. Whatever the limit, a body that is the only thing
 * in the budget goes on (else a body over the budget could never finish). Small bodies that do
 * not fit take the separate reserve, so a big body cannot starve them.
 */
static int budget_admit(conn_t *c)
{
    baton_http_budget_t *b = c->srv->budget;
    if (b == NULL || b->max == 0 || !c->in_body || c->closing || c->reserved)
        return 1; /* a closing connection's reads are dropped, never buffered */
    size_t used = atomic_load(&b->used);
    size_t others = used > c->charged ? used - c->charged : 0; /* c->charged: main budget here */
    if (c->body_total == 0)                                    /* chunked */
        return others == 0 || (used < b->max && READ_BUF_SIZE <= b->max - used);
    if (others == 0 || (others < b->max && c->body_total <= b->max - others)) {
        budget_add(c->srv, c->body_total - c->charged);
        c->charged = c->body_total;
        c->reserved = 1;
        return 1;
    }
    if (!c->small_body)
        return 0;
    size_t rmax = b->max / 8;
    size_t rused = atomic_fetch_add(&b->reserve_used, c->body_total);
    if (rused > rmax || c->body_total > rmax - rused) {
        atomic_fetch_sub(&b->reserve_used, c->body_total);
        return 0;
    }
    budget_sub(c->srv, c->charged); /* bytes read before the reservation move over */
    c->charged = c->body_total;
    c->reserved = 1;
    c->in_reserve = 1;
    return 1;
}

static void body_release(conn_t *c)
{
    if (c->in_reserve && c->srv->budget)
        atomic_fetch_sub(&c->srv->budget->reserve_used, c->charged);
    else
        budget_sub(c->srv, c->charged);
    c->charged = 0;
    c->in_reserve = 0;
}

static void on_budget_timer(uv_timer_t *t)
{
    baton_http_server_t *srv = t->data;
    int waiting = 0;
    for (baton_list_t *it = srv->conns.next; it != &srv->conns; it = it->next) {
        conn_t *c = container_of(it, conn_t, link);
        if (!c->budget_wait)
            continue;
        if (c->closing || !budget_admit(c)) {
            waiting += !c->closing;
            continue;
        }
        c->budget_wait = 0;
        c->read_stopped = 0;
        conn_read_start(c);
    }
    if (!waiting)
        uv_timer_stop(t);
}

/* libuv reported UV_ENOBUFS: on_alloc refused a buffer because the budget is full. */
static void budget_wait(conn_t *c)
{
    baton_http_server_t *srv = c->srv;
    uv_read_stop((uv_stream_t *)&c->tcp);
    c->read_stopped = 1;
    if (!c->budget_wait) {
        c->budget_wait = 1;
        atomic_fetch_add(&srv->budget->waits, 1);
        log_warn_limited("http", "body_waits_for_budget",
                         "body_waits_for_budget used=%zu max=%zu peer=%s",
                         atomic_load(&srv->budget->used), srv->budget->max, c->req.peer);
    }
    if (!uv_is_active((uv_handle_t *)&srv->budget_timer))
        uv_timer_start(&srv->budget_timer, on_budget_timer, BUDGET_POLL_MS, BUDGET_POLL_MS);
}

void baton_http_server_set_budget(baton_http_server_t *srv, baton_http_budget_t *budget)
{
    srv->budget = budget;
}

/* ---------------------------------------------------------------------------------------- */
/* Writing                                                                                   */

static void on_write(uv_write_t *wr, int status)
{
    wreq_t *w = container_of(wr, wreq_t, req);
    conn_t *c = w->conn;
    c->wq_bytes -= w->len;
    if (c->srv->budget)
        atomic_fetch_sub(&c->srv->budget->out_used, w->len);
    free(w);
    if (status < 0) {
        conn_close_hard(c);
        return;
    }
    if (c->wq_bytes == 0 && c->req_active && !c->tcp_closing && c->req.on_drain)
        c->req.on_drain(&c->req);
}

/* Writes bufs in order: straight to the socket when it takes them, else one copy queued.
 * 0, or BATON_ECLOSED after closing the connection on a write error. */
static int conn_write_raw(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (c->tcp_closing)
        return BATON_ECLOSED;
    size_t total = 0;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    if (total == 0)
        return 0;
    size_t done = 0;
    if (c->wq_bytes == 0) {
        int r = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
        if (r >= 0)
            done = (size_t)r;
        else if (r != UV_EAGAIN && r != UV_ENOSYS) {
            conn_close_hard(c);
            return BATON_ECLOSED;
        }
        if (done == total)
            return 0;
    }
    size_t rest = total - done;
    wreq_t *w = malloc(sizeof(*w) + rest);
    if (w == NULL) {
        log_error("http", "write_oom bytes=%zu peer=%s", rest, c->req.peer);
        conn_close_hard(c);
        return BATON_ECLOSED;
    }
    size_t skip = done, off = 0;
    for (unsigned i = 0; i < n; i++) {
        size_t len = bufs[i].len;
        if (skip >= len) {
            skip -= len;
            continue;
        }
        memcpy(w->data + off, bufs[i].base + skip, len - skip);
        off += len - skip;
        skip = 0;
    }
    w->conn = c;
    w->len = rest;
    uv_buf_t b = uv_buf_init(w->data, (unsigned)rest);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) != 0) {
        free(w);
        conn_close_hard(c);
        return BATON_ECLOSED;
    }
    c->wq_bytes += rest;
    if (c->srv->budget) /* a share of its own: bodies never wait for slow readers */
        atomic_fetch_add(&c->srv->budget->out_used, rest);
    return 0;
}

/* Ciphertext the TLS layer produced: written, then the buffer is released. */
static int conn_write_out(conn_t *c, baton_buf_t *out)
{
    int rc = 0;
    if (out->len > 0) {
        uv_buf_t b = uv_buf_init(out->data, (unsigned)out->len);
        rc = conn_write_raw(c, &b, 1);
    }
    baton_buf_free(out);
    return rc;
}

/*
 * Plaintext out: through the TLS layer when the listener has one. The ciphertext goes through
 * the server's scratch buffer, which conn_write_raw has written or copied before it returns, so
 * an encrypted write allocates nothing; a write nested in another (from a callback) gets its own.
 */
static int conn_write_now(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (c->tls == NULL)
        return conn_write_raw(c, bufs, n);
    if (c->tcp_closing)
        return BATON_ECLOSED;
    baton_http_server_t *srv = c->srv;
    if (srv->tls_scratch_busy) {
        baton_buf_t out = BATON_BUF_INIT;
        if (baton_tls_conn_encrypt(c->tls, bufs, n, &out) != 0) {
            baton_buf_free(&out);
            conn_close_hard(c);
            return BATON_ECLOSED;
        }
        return conn_write_out(c, &out);
    }
    baton_buf_t *out = &srv->tls_scratch;
    int rc = 0;
    srv->tls_scratch_busy = 1;
    if (baton_tls_conn_encrypt(c->tls, bufs, n, out) != 0) {
        conn_close_hard(c);
        rc = BATON_ECLOSED;
    } else if (out->len > 0) {
        uv_buf_t b = uv_buf_init(out->data, (unsigned)out->len);
        rc = conn_write_raw(c, &b, 1);
    }
    srv->tls_scratch_busy = 0;
    if (out->cap > SPARE_BUF_MAX)
        baton_buf_free(out);
    else
        baton_buf_reset(out);
    return rc;
}

static void cork_unlink(conn_t *c)
{
    if (c->cork.len > 0) {
        baton_list_remove(&c->cork_link);
        baton_buf_reset(&c->cork);
    }
    if (c->cork.cap > CORK_MAX)
        baton_buf_free(&c->cork);
}

/* Every write goes through here: corked bytes first, in the same write, so order is kept.
 * n <= 3 (the most any caller here passes). */
static int conn_write(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (c->cork.len == 0)
        return n ? conn_write_now(c, bufs, n) : 0;
    uv_buf_t all[4];
    unsigned k = 0;
    all[k++] = uv_buf_init(c->cork.data, (unsigned)c->cork.len);
    for (unsigned i = 0; i < n; i++)
        all[k++] = bufs[i];
    int rc = conn_write_now(c, all, k);
    cork_unlink(c);
    return rc;
}

static void on_flush_check(uv_check_t *h)
{
    baton_http_server_t *srv = h->data;
    baton_list_t *l;
    while ((l = baton_list_first(&srv->corked)) != NULL)
        conn_write(container_of(l, conn_t, cork_link), NULL, 0);
    uv_check_stop(h);
}

/* Adds bytes to the connection's cork (flushed at the end of this loop turn, or now when it is
 * full). 0, or BATON_ECLOSED after closing the connection. */
static int cork_add(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    baton_http_server_t *srv = c->srv;
    buf_take(&srv->spare_cork, &c->cork);
    size_t before = c->cork.len, total = 0;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    if (before + total >= CORK_MAX)
        return conn_write(c, bufs, n); /* the corked bytes and these, without copying these */
    for (unsigned i = 0; i < n; i++) {
        if (baton_buf_append(&c->cork, bufs[i].base, bufs[i].len) != 0) {
            c->cork.len = before; /* out of memory: what is corked, then these, now */
            if (before > 0)
                c->cork.data[before] = '\0';
            return conn_write(c, bufs, n);
        }
    }
    if (before == 0 && c->cork.len > 0) {
        baton_list_push(&srv->corked, &c->cork_link);
        if (!uv_is_active((uv_handle_t *)&srv->flush_check))
            uv_check_start(&srv->flush_check, on_flush_check);
    }
    return 0;
}

/* "Content-Length: <n>" (NUL-terminated) into out (at least 40 bytes). */
static void content_length_line(char *out, size_t n)
{
    static const char k[] = "Content-Length: ";
    memcpy(out, k, sizeof(k) - 1);
    out[sizeof(k) - 1 + baton_fmt_uint(out + sizeof(k) - 1, n, 10)] = '\0';
}

/*
 * Builds the status line and headers into `stack` (or a malloc'd block when it does not fit;
 * *heap_p is set then and the caller frees it). `framing` is the Content-Length or
 * Transfer-Encoding line without CRLF, or NULL.
 */
static char *build_head(conn_t *c, char *stack, size_t stack_cap, char **heap_p, size_t *len_p,
                        int status, const char *ctype, const baton_http_header_t *extra,
                        size_t n_extra, const char *framing)
{
    const char *reason = baton_http_reason(status);
    const char *conn_line = NULL;
    if (!c->keep_alive)
        conn_line = "Connection: close\r\n";
    else if (c->req.http_minor == 0)
        conn_line = "Connection: keep-alive\r\n";
    size_t need = 32 + strlen(reason) + 2;
    if (ctype)
        need += 16 + strlen(ctype);
    if (framing)
        need += strlen(framing) + 2;
    if (conn_line)
        need += strlen(conn_line);
    for (size_t i = 0; i < n_extra; i++)
        need += strlen(extra[i].name) + strlen(extra[i].value) + 4;
    char *out = stack;
    *heap_p = NULL;
    if (need > stack_cap) {
        out = malloc(need);
        if (out == NULL)
            return NULL;
        *heap_p = out;
    }
    char *p = out;
#define PUT(s)                                                                                     \
    do {                                                                                           \
        size_t l_ = strlen(s);                                                                     \
        memcpy(p, s, l_);                                                                          \
        p += l_;                                                                                   \
    } while (0)
    PUT("HTTP/1.1 ");
    p += baton_fmt_uint(p, (uint64_t)(status >= 0 ? status : 0), 10);
    PUT(" ");
    PUT(reason);
    PUT("\r\n");
    if (ctype) {
        PUT("Content-Type: ");
        PUT(ctype);
        PUT("\r\n");
    }
    if (framing) {
        PUT(framing);
        PUT("\r\n");
    }
    if (conn_line)
        PUT(conn_line);
    for (size_t i = 0; i < n_extra; i++) {
        PUT(extra[i].name);
        PUT(": ");
        PUT(extra[i].value);
        PUT("\r\n");
    }
    PUT("\r\n");
#undef PUT
    *len_p = (size_t)(p - out);
    return out;
}

/* ---------------------------------------------------------------------------------------- */
/* Request life                                                                              */

/* Hands a request buffer back to the server's spares (emptied) or frees it. */
static void buf_give(spare_t *s, baton_buf_t *b)
{
    if (BATON_POOL_REUSE && b->data && b->cap <= SPARE_BUF_MAX && s->n < SPARE_BUFS) {
        baton_buf_reset(b);
        s->b[s->n++] = *b;
        *b = (baton_buf_t)BATON_BUF_INIT;
    } else {
        baton_buf_free(b);
    }
}

/* An empty buffer gets a spare's storage when there is one. */
static void buf_take(spare_t *s, baton_buf_t *b)
{
    if (b->data == NULL && s->n > 0)
        *b = s->b[--s->n];
}

static void spare_free(spare_t *s)
{
    while (s->n > 0)
        baton_buf_free(&s->b[--s->n]);
}

static void req_reset(conn_t *c)
{
    baton_http_server_t *srv = c->srv;
    buf_give(&srv->spare_arena, &c->arena);
    buf_give(&srv->spare_hdrs, &c->hdrs);
    buf_give(&srv->spare_body, &c->body);
    body_release(c);
    c->in_body = 0;
    c->small_body = 0;
    c->reserved = 0;
    c->body_total = 0;
    c->n_hdrs = 0;
    c->head_bytes = 0;
    c->in_field = 0;
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

static void arm_idle(conn_t *c)
{
    /* A TLS handshake still going on is bounded by the header timeout, not the idle one. */
    if (c->tls && !baton_tls_conn_established(c->tls) && c->srv->limits.header_timeout_ms)
        timer_start(c, TM_HEAD, c->srv->limits.header_timeout_ms);
    else if (c->srv->limits.keepalive_timeout_ms)
        timer_start(c, TM_IDLE, c->srv->limits.keepalive_timeout_ms);
    else
        uv_timer_stop(&c->timer);
}

static void dispatch(conn_t *c)
{
    baton_http_req_t *r = &c->req;
    r->body = c->body.data ? c->body.data : "";
    r->body_len = c->body.len;
    c->req_active = 1;
    c->streaming = 0;
    c->abort_sent = 0;
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    c->srv->handler(r, c->srv->ctx);
}

/* The handler is done with the request (respond or stream_end). */
static void req_finish(conn_t *c)
{
    c->req_active = 0;
    c->streaming = 0;
    req_reset(c);
    cork_unlink(c); /* empty by now (stream_end wrote it); the storage goes back */
    buf_give(&c->srv->spare_cork, &c->cork);
    if (c->tcp_closing) {
        conn_maybe_free(c);
        return;
    }
    if (!c->keep_alive || c->srv->stopping) {
        conn_close_graceful(c);
        return;
    }
    if (c->in_feed)
        return; /* conn_feed goes on with the bytes it holds */
    if (c->read_stopped) {
        c->read_stopped = 0;
        conn_read_start(c);
        if (c->tcp_closing)
            return;
    }
    if (c->pending.len > 0)
        timer_start(c, TM_RESUME, 0);
    else
        arm_idle(c);
}

/* ---------------------------------------------------------------------------------------- */
/* llhttp callbacks                                                                          */

static int fail_cb(conn_t *c, int status, const char *msg)
{
    c->err_status = status;
    c->err_msg = msg;
    return -1;
}

static int count_head(conn_t *c, size_t len)
{
    c->head_bytes += len;
    if (c->head_bytes > c->srv->limits.max_header_bytes)
        return fail_cb(c, 431, "request line and headers are too large");
    return 0;
}

static int append_arena(conn_t *c, const char *at, size_t len)
{
    if (count_head(c, len) != 0)
        return -1;
    if (baton_buf_append(&c->arena, at, len) != 0)
        return fail_cb(c, 500, "out of memory");
    return 0;
}

static int on_message_begin(llhttp_t *p)
{
    conn_t *c = p->data;
    c->in_msg = 1;
    c->head_done = 0;
    req_reset(c);
    c->req.start_ns = uv_hrtime();
    buf_take(&c->srv->spare_arena, &c->arena);
    buf_take(&c->srv->spare_hdrs, &c->hdrs);
    /* Room for 16 headers' offsets and pointers: no realloc for a typical request. */
    if (baton_buf_reserve(&c->arena, ARENA_INIT) != 0 || baton_buf_reserve(&c->hdrs, 512) != 0)
        return fail_cb(c, 500, "out of memory");
    c->url_off = 0;
    if (c->srv->limits.header_timeout_ms)
        timer_start(c, TM_HEAD, c->srv->limits.header_timeout_ms);
    else
        uv_timer_stop(&c->timer);
    return 0;
}

static int on_url(llhttp_t *p, const char *at, size_t len)
{
    /* RFC 9112 3.2: the request target is visible ASCII (llhttp lets tabs and bytes >= 0x80
     * through, which a proxy would forward as they came). */
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)at[i] < 0x21 || (unsigned char)at[i] > 0x7e)
            return fail_cb(p->data, 400,
                           "malformed HTTP request: invalid byte in the request "
                           "target");
    return append_arena(p->data, at, len);
}

static int on_url_complete(llhttp_t *p)
{
    return append_arena(p->data, "", 1);
}

static int on_header_field(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    /* Trailers of a chunked body are counted against the header limit and dropped: the
     * headers' pointers into the arena are final once the headers are complete (growing the
     * arena or the offsets there would leave them dangling — found by fuzz_http_server). */
    if (c->head_done)
        return count_head(c, len);
    if (!c->in_field) {
        if (c->n_hdrs >= c->srv->limits.max_headers)
            return fail_cb(c, 431, "too many request headers");
        hdr_off_t h = {(uint32_t)c->arena.len, NO_VALUE};
        if (baton_buf_append(&c->hdrs, &h, sizeof(h)) != 0)
            return fail_cb(c, 500, "out of memory");
        c->n_hdrs++;
        c->in_field = 1;
        if (count_head(c, 4) != 0) /* ": " and CRLF */
            return -1;
    }
    return append_arena(c, at, len);
}

static int on_header_field_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    if (c->head_done)
        return 0;
    c->in_field = 0;
    return append_arena(c, "", 1);
}

static int on_header_value(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    if (c->head_done)
        return count_head(c, len);
    hdr_off_t *h = (hdr_off_t *)c->hdrs.data + (c->n_hdrs - 1);
    if (h->value == NO_VALUE)
        h->value = (uint32_t)c->arena.len;
    return append_arena(c, at, len);
}

static int on_header_value_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    if (c->head_done || c->n_hdrs == 0)
        return 0;
    hdr_off_t *h = (hdr_off_t *)c->hdrs.data + (c->n_hdrs - 1);
    if (h->value == NO_VALUE)
        h->value = (uint32_t)c->arena.len;
    return append_arena(c, "", 1);
}

static void send_continue(conn_t *c)
{
    static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    uv_buf_t b = uv_buf_init((char *)msg, sizeof(msg) - 1);
    conn_write(c, &b, 1);
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
    baton_http_server_t *srv = c->srv;
    baton_http_req_t *r = &c->req;
    if (p->http_major != 1)
        return fail_cb(c, 505, "only HTTP/1.x is supported");
    c->head_done = 1;

    /* The arena is final now: turn offsets into pointers, stored after the offsets. */
    size_t n = c->n_hdrs;
    size_t off_bytes = n * sizeof(hdr_off_t);
    size_t align = (off_bytes + 15) & ~(size_t)15;
    if (baton_buf_reserve(&c->hdrs, align - off_bytes + n * sizeof(baton_http_header_t) + 16) != 0)
        return fail_cb(c, 500, "out of memory");
    char *base = c->arena.data ? c->arena.data : "";
    hdr_off_t *offs = (hdr_off_t *)c->hdrs.data;
    baton_http_header_t *hs = (baton_http_header_t *)(c->hdrs.data + align);
    for (size_t i = 0; i < n; i++) {
        hs[i].name = base + offs[i].name;
        hs[i].value = offs[i].value == NO_VALUE ? "" : base + offs[i].value;
    }
    r->headers = n ? hs : NULL;
    r->n_headers = n;

    char *url = base + c->url_off;
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
        buf_take(&srv->spare_body, &c->body);
    if (has_len && p->content_length > 0 &&
        baton_buf_reserve(&c->body, (size_t)p->content_length) != 0)
        return fail_cb(c, 500, "out of memory");
    if (want_body) {
        c->in_body = 1;
        const baton_http_budget_t *b = srv->budget;
        c->small_body =
            b && has_len && p->content_length <= SMALL_BODY_MAX && p->content_length <= b->max / 64;
        c->body_total = has_len && !chunked ? (size_t)p->content_length : 0;
        budget_admit(c); /* reserve now if it fits; else its next read waits (on_alloc) */
        const baton_http_header_t *e = baton_http_req_header(r, "expect");
        if (e && p->http_minor >= 1 && strcasecmp(e->value, "100-continue") == 0)
            send_continue(c);
        c->last_read = uv_now(srv->loop);
        if (srv->limits.body_timeout_ms)
            timer_start(c, TM_BODY, srv->limits.body_timeout_ms);
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
        budget_add(c->srv, len);
    }
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    c->in_msg = 0;
    c->in_body = 0;
    c->keep_alive = llhttp_should_keep_alive(p) && !p->upgrade;
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    /* Stop here: the rest of the buffer is the next (pipelined) request, parsed only after
     * this one is finished. */
    return HPE_PAUSED;
}

/* ---------------------------------------------------------------------------------------- */
/* Reading and parsing                                                                       */

static void stash(conn_t *c, const char *data, size_t len)
{
    if (baton_buf_append(&c->pending, data, len) != 0) {
        conn_close_hard(c);
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
        conn_send_error(c, st, c->err_msg, code);
        return;
    }
    char msg[160];
    const char *reason = llhttp_get_error_reason(&c->parser);
    snprintf(msg, sizeof(msg), "malformed HTTP request: %s (%s)", reason ? reason : "parse error",
             llhttp_errno_name(e));
    conn_send_error(c, 400, msg, "bad_request");
}

static void conn_feed(conn_t *c, const char *data, size_t len)
{
    c->in_feed = 1;
    while (len > 0 && !c->closing) {
        if (c->req_active) {
            stash(c, data, len);
            break;
        }
        if (c->parser_paused) {
            llhttp_resume(&c->parser);
            c->parser_paused = 0;
        }
        llhttp_errno_t e = llhttp_execute(&c->parser, data, len);
        if (e == HPE_OK || c->closing) /* closing: a write inside a callback failed */
            break;
        if (e == HPE_PAUSED && !c->in_msg && c->err_status == 0) {
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
    if (c->closing || c->req_active)
        return;
    if (c->read_stopped) { /* stopped while the pipeline backlog was over the limit */
        c->read_stopped = 0;
        conn_read_start(c);
        if (c->tcp_closing)
            return;
    }
    /* Not re-armed by bytes that start no request (stray CRLFs cannot keep a connection). */
    if (!c->in_msg && c->timer_mode != TM_IDLE)
        arm_idle(c);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    if (!budget_admit(c)) {
        *buf = uv_buf_init(NULL, 0); /* read_cb gets UV_ENOBUFS: wait for the budget */
        return;
    }
    buf->base = c->srv->rbuf;
    buf->len = READ_BUF_SIZE;
}

/* Plaintext in: straight from the socket, or decrypted by the TLS layer. */
static int conn_on_plain(void *owner, const char *data, size_t len)
{
    conn_t *c = owner;
    if (c->closing)
        return 1; /* lingering: drop */
    if (c->timer_mode == TM_BODY)
        c->last_read = uv_now(c->srv->loop);
    if (c->req_active || c->pending.len > 0) {
        stash(c, data, len);
        return c->closing;
    }
    conn_feed(c, data, len);
    return c->closing;
}

/* A plain-HTTP request on the TLS port gets a plain-HTTP answer saying so, as nginx does. */
static void send_plaintext_refusal(conn_t *c)
{
    static const char body[] = "{\"error\":{\"message\":\"plain HTTP request sent to an HTTPS "
                               "port\",\"type\":\"invalid_request_error\",\"param\":null,"
                               "\"code\":\"tls_required\"}}";
    char head[160];
    int n = snprintf(head, sizeof(head),
                     "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nConnection: close\r\n\r\n",
                     sizeof(body) - 1);
    uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)n),
                        uv_buf_init((char *)body, (unsigned)(sizeof(body) - 1))};
    conn_write_raw(c, bufs, 2);
}

/* A TLS connection on this HTTPS listener (the handshake starts with the client's bytes). */
static int conn_tls_attach(conn_t *c)
{
    if (baton_tls_conn_create(&c->tls, c->srv->tls, NULL) != 0) {
        log_error("http", "tls_conn_oom peer=%s", c->req.peer);
        conn_close_hard(c);
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
    conn_write_out(c, &out); /* handshake replies, or the alert that ends it */
    if (rc == 1) {           /* close_notify: the client's EOF */
        conn_close_hard(c);
    } else if (rc != 0) {
        if (baton_tls_conn_reason(c->tls) == BATON_TLS_R_PLAINTEXT)
            send_plaintext_refusal(c);
        c->keep_alive = 0;
        conn_close_graceful(c);
    } else if (!was_up && baton_tls_conn_established(c->tls) && !c->in_msg && !c->req_active &&
               !c->closing && c->timer_mode == TM_HEAD) {
        arm_idle(c); /* handshake done: from now on an idle connection like any other */
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = s->data;
    if (nread == 0)
        return;
    if (nread == UV_ENOBUFS && !c->closing) {
        budget_wait(c);
        return;
    }
    if (nread == UV_EOF && !c->tls && !c->closing && c->srv->limits.answer_half_closed &&
        !c->in_msg && (c->req_active || c->wq_bytes)) {
        /* The client half-closed after a whole request: HTTP lets it, so its answer still goes
         * out, then the connection closes (nothing more can come). A client that is really gone
         * shows when a write to it fails. */
        uv_read_stop(s);
        c->read_stopped = 1;
        c->keep_alive = 0;
        if (!c->req_active)
            conn_close_graceful(c); /* the answer is queued: shut down once it is written */
        return;
    }
    if (nread < 0) {
        if (c->tls)
            baton_tls_conn_eof(c->tls);
        conn_close_hard(c);
        return;
    }
    if (c->closing)
        return; /* lingering: drop */
    if (c->tls)
        on_tls_read(c, buf->base, (size_t)nread);
    else
        conn_on_plain(c, buf->base, (size_t)nread);
}

static void conn_read_start(conn_t *c)
{
    if (uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read) != 0)
        conn_close_hard(c);
}

static void on_timer(uv_timer_t *t)
{
    conn_t *c = t->data;
    baton_http_limits_t *lim = &c->srv->limits;
    enum timer_mode mode = c->timer_mode;
    c->timer_mode = TM_NONE;
    switch (mode) {
    case TM_IDLE:
    case TM_LINGER:
        conn_close_hard(c);
        break;
    case TM_HEAD:
        if (c->tls && !baton_tls_conn_established(c->tls))
            baton_tls_conn_timed_out(c->tls); /* the header timeout bounds the handshake too */
        conn_send_error(c, 408, "timed out reading the request headers", "request_timeout");
        break;
    case TM_BODY: {
        uint64_t idle = uv_now(c->srv->loop) - c->last_read;
        if (idle < lim->body_timeout_ms) {
            timer_start(c, TM_BODY, lim->body_timeout_ms - idle);
            break;
        }
        if (c->budget_wait) { /* the client was not slow: we did not read */
            c->budget_wait = 0;
            conn_send_error(c, 503, "server busy: too many request bytes buffered; retry later",
                            "server_busy");
            break;
        }
        conn_send_error(c, 408, "timed out reading the request body", "request_timeout");
        break;
    }
    case TM_ABORT:
        if (c->req_active && !c->abort_sent) {
            c->abort_sent = 1;
            if (c->req.on_abort)
                c->req.on_abort(&c->req);
        }
        break;
    case TM_RESUME: {
        baton_buf_t p = c->pending;
        c->pending = (baton_buf_t)BATON_BUF_INIT;
        if (p.len > 0)
            conn_feed(c, p.data, p.len);
        else if (!c->closing && !c->req_active && !c->in_msg)
            arm_idle(c);
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
    baton_http_server_t *srv = c->srv;
    baton_list_remove(&c->link);
    buf_give(&srv->spare_arena, &c->arena);
    buf_give(&srv->spare_hdrs, &c->hdrs);
    buf_give(&srv->spare_body, &c->body);
    body_release(c);
    baton_buf_free(&c->pending);
    cork_unlink(c);
    baton_buf_free(&c->cork);
    baton_tls_conn_free(c->tls);
    free(c);
    srv->n_live--;
    server_maybe_done(srv);
}

static void conn_maybe_free(conn_t *c)
{
    if (!c->tcp_closed || c->req_active || c->timer_closing)
        return;
    c->timer_closing = 1;
    uv_close((uv_handle_t *)&c->timer, on_timer_close);
}

static void on_tcp_close(uv_handle_t *h)
{
    conn_t *c = h->data;
    c->tcp_closed = 1;
    conn_maybe_free(c);
}

static void conn_close_hard(conn_t *c)
{
    if (c->tcp_closing)
        return;
    c->tcp_closing = 1;
    c->closing = 1;
    if (c->counted) {
        c->counted = 0;
        c->srv->n_conns--;
    }
    uv_close((uv_handle_t *)&c->tcp, on_tcp_close);
    baton_buf_free(&c->pending);
    cork_unlink(c); /* unsent stream bytes are dropped with the connection */
    baton_buf_free(&c->cork);
    /* on_abort must not run inside whatever call got us here. */
    if (c->req_active && !c->abort_sent)
        timer_start(c, TM_ABORT, 0);
    else
        uv_timer_stop(&c->timer);
}

static void on_shutdown(uv_shutdown_t *sr, int status)
{
    conn_t *c = sr->data;
    if (status < 0 || c->tcp_closing) {
        conn_close_hard(c);
        return;
    }
    if (c->read_stopped) {
        c->read_stopped = 0;
        conn_read_start(c);
        if (c->tcp_closing)
            return;
    }
    timer_start(c, TM_LINGER, LINGER_MS);
}

/* Flushes queued writes, sends FIN, drains what the client still sends, then closes. */
static void conn_close_graceful(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    uv_timer_stop(&c->timer);
    c->timer_mode = TM_NONE;
    baton_buf_free(&c->pending);
    if (c->tls && !c->tcp_closing) {
        baton_buf_t out = BATON_BUF_INIT;
        baton_tls_conn_close_notify(c->tls, &out);
        conn_write_out(c, &out);
        if (c->tcp_closing)
            return;
    }
    c->shutdown_req.data = c;
    if (uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) != 0)
        conn_close_hard(c);
}

/* Server-generated error (limits, timeouts, malformed input): JSON body, then close. */
static void conn_send_error(conn_t *c, int status, const char *message, const char *code)
{
    if (c->closing)
        return;
    if (c->tls && !baton_tls_conn_established(c->tls)) {
        /* No TLS session yet to carry an HTTP answer (connection cap, handshake timeout). */
        log_debug("http", "request_rejected status=%d peer=%s reason=\"%s\" tls=handshaking",
                  status, c->req.peer, message);
        conn_close_hard(c);
        return;
    }
    c->keep_alive = 0;
    baton_buf_t body = BATON_BUF_INIT;
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    if (error_json(&body, message, type, NULL, code) == 0) {
        char framing[48];
        content_length_line(framing, body.len);
        char stack[512], *heap = NULL;
        size_t hlen = 0;
        char *head = build_head(c, stack, sizeof(stack), &heap, &hlen, status, "application/json",
                                NULL, 0, framing);
        if (head) {
            uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)hlen),
                                uv_buf_init(body.data, (unsigned)body.len)};
            conn_write(c, bufs, 2);
            free(heap);
        }
    }
    baton_buf_free(&body);
    log_debug("http", "request_rejected status=%d peer=%s reason=\"%s\"", status, c->req.peer,
              message);
    conn_close_graceful(c);
}

/* ---------------------------------------------------------------------------------------- */
/* Responses                                                                                 */

static conn_t *req_conn(baton_http_req_t *req)
{
    return container_of(req, conn_t, req);
}

static void decide_close(conn_t *c)
{
    if (c->srv->stopping)
        c->keep_alive = 0;
}

int baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                       const baton_http_header_t *extra, size_t n_extra, const char *body,
                       size_t body_len)
{
    conn_t *c = req_conn(req);
    if (!c->req_active || c->streaming)
        return BATON_EINVAL;
    int rc = 0;
    if (c->tcp_closing) {
        rc = BATON_ECLOSED;
    } else {
        decide_close(c);
        int bodyless = status == 204 || status == 304 || (status >= 100 && status < 200);
        char framing[48];
        if (!bodyless)
            content_length_line(framing, body_len);
        char stack[1024], *heap = NULL;
        size_t hlen = 0;
        char *head = build_head(c, stack, sizeof(stack), &heap, &hlen, status,
                                content_type ? content_type : "application/json", extra, n_extra,
                                bodyless ? NULL : framing);
        if (head == NULL) {
            conn_close_hard(c);
            rc = BATON_ENOMEM;
        } else {
            uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)hlen),
                                uv_buf_init((char *)body, (unsigned)body_len)};
            unsigned nb = (bodyless || c->no_body_out || body_len == 0) ? 1 : 2;
            rc = conn_write(c, bufs, nb);
            free(heap);
        }
    }
    req_finish(c);
    return rc;
}

int baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                             const char *type, const char *param, const char *code)
{
    baton_buf_t body = BATON_BUF_INIT;
    if (error_json(&body, message, type, param, code) != 0) {
        baton_buf_free(&body);
        return baton_http_respond(req, 500, "application/json", NULL, 0, "", 0);
    }
    int rc = baton_http_respond(req, status, "application/json", NULL, 0, body.data, body.len);
    baton_buf_free(&body);
    return rc;
}

int baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                            const baton_http_header_t *extra, size_t n_extra)
{
    conn_t *c = req_conn(req);
    if (!c->req_active || c->streaming)
        return BATON_EINVAL;
    c->streaming = 1;
    if (c->tcp_closing)
        return BATON_ECLOSED;
    decide_close(c);
    /* HTTP/1.0 has no chunked encoding: the body ends with the connection. */
    c->chunked_out = req->http_minor >= 1;
    if (!c->chunked_out)
        c->keep_alive = 0;
    char stack[1024], *heap = NULL;
    size_t hlen = 0;
    char *head = build_head(c, stack, sizeof(stack), &heap, &hlen, status,
                            content_type ? content_type : "text/event-stream", extra, n_extra,
                            c->chunked_out ? "Transfer-Encoding: chunked" : NULL);
    if (head == NULL) {
        conn_close_hard(c);
        return BATON_ENOMEM;
    }
    uv_buf_t b = uv_buf_init(head, (unsigned)hlen);
    int rc = cork_add(c, &b, 1); /* goes out with the first chunk when it comes this turn */
    free(heap);
    return rc;
}

/* "<len in hex>\r\n" into out (at least 19 bytes); its length (a relayed stream writes one per
 * upstream read: formatted by hand, issue 15). */
static size_t chunk_size_line(char *out, size_t len)
{
    size_t n = baton_fmt_uint(out, len, 16);
    out[n] = '\r';
    out[n + 1] = '\n';
    return n + 2;
}

int baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len)
{
    conn_t *c = req_conn(req);
    if (!c->req_active || !c->streaming)
        return BATON_EINVAL;
    if (c->tcp_closing)
        return BATON_ECLOSED;
    if (len == 0 || c->no_body_out)
        return 0;
    if (!c->chunked_out) {
        uv_buf_t b = uv_buf_init((char *)data, (unsigned)len);
        return cork_add(c, &b, 1);
    }
    char size_line[24];
    size_t sl = chunk_size_line(size_line, len);
    uv_buf_t bufs[3] = {uv_buf_init(size_line, (unsigned)sl),
                        uv_buf_init((char *)data, (unsigned)len), uv_buf_init((char *)"\r\n", 2)};
    return cork_add(c, bufs, 3);
}

size_t baton_http_write_queue_size(const baton_http_req_t *req)
{
    const conn_t *c = container_of(req, const conn_t, req);
    return c->wq_bytes;
}

int baton_http_stream_end(baton_http_req_t *req)
{
    conn_t *c = req_conn(req);
    if (!c->req_active || !c->streaming)
        return BATON_EINVAL;
    int rc = 0;
    if (c->tcp_closing) {
        rc = BATON_ECLOSED;
    } else if (c->chunked_out && !c->no_body_out) {
        uv_buf_t b = uv_buf_init((char *)"0\r\n\r\n", 5); /* with the corked bytes */
        rc = conn_write(c, &b, 1);
    } else {
        rc = conn_write(c, NULL, 0); /* the corked bytes */
    }
    req_finish(c);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* Server                                                                                    */

static void format_peer(conn_t *c)
{
    struct sockaddr_storage ss;
    int len = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";
    int port = 0;
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET) {
            struct sockaddr_in *a = (struct sockaddr_in *)&ss;
            uv_ip4_name(a, ip, sizeof(ip));
            port = ntohs(a->sin_port);
        } else if (ss.ss_family == AF_INET6) {
            struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
            uv_ip6_name(a, ip, sizeof(ip));
            port = ntohs(a->sin6_port);
            snprintf(c->req.peer, sizeof(c->req.peer), "[%s]:%d", ip, port);
            return;
        }
    }
    snprintf(c->req.peer, sizeof(c->req.peer), "%s:%d", ip, port);
}

/* A live connection on descriptor fd (not yet counted against the cap); NULL when it could not
 * be set up (fd closed, nothing left behind). */
static conn_t *conn_new(baton_http_server_t *srv, int fd)
{
    conn_t *c = calloc(1, sizeof(*c));
    if (c == NULL) {
        log_warn_limited("http", "accept_oom", "accept_oom");
        close(fd);
        return NULL;
    }
    c->srv = srv;
    uv_tcp_init(srv->loop, &c->tcp);
    uv_timer_init(srv->loop, &c->timer);
    c->tcp.data = c;
    c->timer.data = c;
    baton_list_push_front(&srv->conns, &c->link);
    srv->n_live++;
    req_reset(c);
    c->req.server = srv;
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        c->closing = 1;
        c->tcp_closing = 1;
        uv_close((uv_handle_t *)&c->tcp, on_tcp_close);
        return NULL;
    }
    return c;
}

/* Counts c against the cap and readies its parser for the first request. */
static void conn_admit(conn_t *c)
{
    c->counted = 1;
    c->srv->n_conns++;
    llhttp_init(&c->parser, HTTP_REQUEST, &c->srv->settings);
    c->parser.data = c;
    c->keep_alive = 1;
}

/* Takes an accepted descriptor: a connection, or a 503 when the instance is at its cap. */
static void conn_accepted(baton_http_server_t *srv, int fd)
{
    conn_t *c = conn_new(srv, fd);
    if (c == NULL)
        return;
    format_peer(c);
    if (srv->tls && conn_tls_attach(c) != 0)
        return;
    if (srv->n_conns >= srv->limits.max_connections) {
        log_warn_limited("http", "connection_rejected",
                         "connection_rejected reason=max_connections limit=%u peer=%s",
                         srv->limits.max_connections, c->req.peer);
        conn_read_start(c);
        conn_send_error(c, 503, "too many connections", "too_many_connections");
        return;
    }
    conn_admit(c);
    uv_tcp_nodelay(&c->tcp, 1);
    conn_read_start(c);
    if (!c->tcp_closing)
        arm_idle(c);
}

static void on_listener_io(uv_poll_t *h, int status, int events);

static void on_accept_timer(uv_timer_t *t)
{
    baton_http_server_t *srv = t->data;
    if (!srv->accept_paused || srv->listener_closing)
        return;
    srv->accept_paused = 0;
    /* Level-triggered: pending connections wake the listener again at once. */
    if (uv_poll_start(&srv->listener, UV_READABLE, on_listener_io) != 0)
        log_error("http", "accept_resume_failed");
}

/* Out of descriptors: pause accepting for a back-off instead of retrying in a tight loop. The
 * connections wait in the kernel's backlog meanwhile. */
static void accept_pause(baton_http_server_t *srv, int err)
{
    uint64_t ms = srv->accept_backoff_ms ? srv->accept_backoff_ms * 2 : ACCEPT_BACKOFF_MIN_MS;
    if (ms > ACCEPT_BACKOFF_MAX_MS)
        ms = ACCEPT_BACKOFF_MAX_MS;
    srv->accept_backoff_ms = ms;
    srv->accept_paused = 1;
    uv_poll_stop(&srv->listener);
    uv_timer_start(&srv->accept_timer, on_accept_timer, ms, 0);
    log_warn_limited("http", "accept_paused", "accept_paused err=%s backoff_ms=%llu conns=%u",
                     baton_strerror(err), (unsigned long long)ms, srv->n_conns);
}

static void on_listener_io(uv_poll_t *h, int status, int events)
{
    baton_http_server_t *srv = h->data;
    if (status < 0) {
        log_warn_limited("http", "accept_failed", "accept_failed err=%s", baton_strerror(status));
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH && !srv->listener_closing; i++) {
        int fd = accept4(srv->listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK)
                return;
            if (e == EINTR || e == ECONNABORTED || e == EPROTO)
                continue;
            if (e == EMFILE || e == ENFILE || e == ENOBUFS || e == ENOMEM) {
                accept_pause(srv, -e);
                return;
            }
            log_warn_limited("http", "accept_failed", "accept_failed err=%s", baton_strerror(-e));
            return;
        }
        if (srv->accept_backoff_ms) {
            baton_log_limited(BATON_LOG_INFO, 10, "http", "accept_resumed",
                              "accept_resumed conns=%u", srv->n_conns);
            srv->accept_backoff_ms = 0;
        }
        conn_accepted(srv, fd);
    }
}

int baton_http_server_create(baton_http_server_t **srv_p, uv_loop_t *loop,
                             const baton_http_limits_t *limits, baton_http_handler_cb handler,
                             void *ctx)
{
    if (srv_p == NULL || loop == NULL || handler == NULL)
        return BATON_EINVAL;
    baton_http_server_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return BATON_ENOMEM;
    srv->rbuf = malloc(READ_BUF_SIZE);
    if (srv->rbuf == NULL) {
        free(srv);
        return BATON_ENOMEM;
    }
    srv->loop = loop;
    baton_list_init(&srv->conns);
    srv->listen_fd = -1;
    if (limits)
        srv->limits = *limits;
    else
        baton_http_limits_default(&srv->limits);
    srv->handler = handler;
    srv->ctx = ctx;
    llhttp_settings_init(&srv->settings);
    srv->settings.on_message_begin = on_message_begin;
    srv->settings.on_url = on_url;
    srv->settings.on_url_complete = on_url_complete;
    srv->settings.on_header_field = on_header_field;
    srv->settings.on_header_field_complete = on_header_field_complete;
    srv->settings.on_header_value = on_header_value;
    srv->settings.on_header_value_complete = on_header_value_complete;
    srv->settings.on_headers_complete = on_headers_complete;
    srv->settings.on_chunk_header = on_chunk_header;
    srv->settings.on_body = on_body;
    srv->settings.on_message_complete = on_message_complete;
    uv_timer_init(loop, &srv->close_token);
    srv->close_token.data = srv;
    uv_timer_init(loop, &srv->accept_timer);
    srv->accept_timer.data = srv;
    uv_timer_init(loop, &srv->budget_timer);
    srv->budget_timer.data = srv;
    uv_check_init(loop, &srv->flush_check);
    srv->flush_check.data = srv;
    baton_list_init(&srv->corked);
    srv->n_live = 4; /* the close token, the two timers and the check; the listener later */
    *srv_p = srv;
    return 0;
}

int baton_http_server_listen(baton_http_server_t *srv, const char *host, int port, int reuseport)
{
    if (srv == NULL || host == NULL || port < 0 || port > 65535)
        return BATON_EINVAL;
    if (srv->listening || srv->listener_closing)
        return BATON_EBUSY;
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    socklen_t slen;
    if (strcmp(host, "localhost") == 0)
        host = "127.0.0.1";
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) == 0) {
        slen = sizeof(struct sockaddr_in);
    } else if (uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) == 0) {
        slen = sizeof(struct sockaddr_in6);
    } else {
        return BATON_EINVAL;
    }
    /* libuv 1.44 cannot set SO_REUSEPORT before bind, so the socket is made here. */
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    int err = 0;
    if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) != 0)
        err = -errno;
    if (!err && reuseport && setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof(one)) != 0)
        err = -errno;
    if (!err && bind(fd, (struct sockaddr *)&ss, slen) != 0)
        err = -errno;
    if (err) {
        close(fd);
        return err;
    }
    if (listen(fd, 1024) != 0 || (err = uv_poll_init(srv->loop, &srv->listener, fd)) != 0) {
        err = err ? err : -errno;
        close(fd);
        return err;
    }
    srv->listener.data = srv;
    srv->listen_fd = fd; /* closed in on_listener_close */
    srv->listener_inited = 1;
    srv->n_live++;
    err = uv_poll_start(&srv->listener, UV_READABLE, on_listener_io);
    if (err)
        return err; /* server_close releases the handle and the fd */
    struct sockaddr_storage bound;
    socklen_t blen = sizeof(bound);
    if (getsockname(fd, (struct sockaddr *)&bound, &blen) == 0)
        srv->port = ntohs(bound.ss_family == AF_INET ? ((struct sockaddr_in *)&bound)->sin_port
                                                     : ((struct sockaddr_in6 *)&bound)->sin6_port);
    srv->listening = 1;
    return 0;
}

void baton_http_server_set_tls(baton_http_server_t *srv, baton_tls_t *tls)
{
    srv->tls = tls;
}

int baton_http_server_port(const baton_http_server_t *srv)
{
    return srv->port;
}

unsigned baton_http_server_connections(const baton_http_server_t *srv)
{
    return srv->n_conns;
}

static void on_listener_close(uv_handle_t *h)
{
    baton_http_server_t *srv = h->data;
    if (h == (uv_handle_t *)&srv->listener && srv->listen_fd >= 0) {
        close(srv->listen_fd);
        srv->listen_fd = -1;
    }
    srv->n_live--;
    server_maybe_done(srv);
}

static void close_listener(baton_http_server_t *srv)
{
    if (srv->listener_closing)
        return;
    srv->listener_closing = 1;
    uv_timer_stop(&srv->accept_timer);
    if (srv->listener_inited)
        uv_close((uv_handle_t *)&srv->listener, on_listener_close);
}

void baton_http_server_stop_accepting(baton_http_server_t *srv)
{
    srv->stopping = 1;
    close_listener(srv);
    /* conn_close_hard only starts closing: c stays listed until its close callback */
    for (baton_list_t *it = srv->conns.next; it != &srv->conns; it = it->next) {
        conn_t *c = container_of(it, conn_t, link);
        if (!c->req_active && !c->in_msg && !c->closing)
            conn_close_hard(c);
    }
}

void baton_http_server_close(baton_http_server_t *srv, baton_http_server_close_cb close_cb)
{
    if (srv->closing)
        return;
    srv->closing = 1;
    srv->stopping = 1;
    srv->close_cb = close_cb;
    close_listener(srv);
    for (baton_list_t *it = srv->conns.next; it != &srv->conns; it = it->next)
        conn_close_hard(container_of(it, conn_t, link));
    uv_close((uv_handle_t *)&srv->accept_timer, on_listener_close);
    uv_close((uv_handle_t *)&srv->budget_timer, on_listener_close);
    uv_close((uv_handle_t *)&srv->flush_check, on_listener_close);
    uv_close((uv_handle_t *)&srv->close_token, on_listener_close);
}

static void server_maybe_done(baton_http_server_t *srv)
{
    if (!srv->closing || srv->n_live > 0)
        return;
    if (srv->close_cb)
        srv->close_cb(srv);
    spare_free(&srv->spare_arena);
    spare_free(&srv->spare_hdrs);
    spare_free(&srv->spare_body);
    spare_free(&srv->spare_cork);
    baton_buf_free(&srv->tls_scratch);
    free(srv->rbuf);
    free(srv);
}
