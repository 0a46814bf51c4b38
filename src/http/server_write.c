/* server_write.c — the HTTP server's write path: responses, streams, the cork, TLS out. */
#include "http/server_internal.h"

#include "baton/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A streamed response's head and chunks written during one loop turn are gathered and sent in
 * one write when the turn's I/O callbacks are done (a uv_check handle), not one syscall each:
 * an upstream read carrying several SSE events costs one write to the client. Past this many
 * bytes they go out at once. */
#define CORK_MAX (64 * 1024)

static const char *reason_phrase(int status)
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

static void on_write(uv_write_t *wr, int status)
{
    baton__hs_wreq_t *w = container_of(wr, baton__hs_wreq_t, req);
    conn_t *c = w->conn;
    c->wq_bytes -= w->len;
    if (c->srv->budget)
        atomic_fetch_sub(&c->srv->budget->out_used, w->len);
    free(w);
    if (status < 0) {
        baton__hs_close_hard(c);
        return;
    }
    if (c->wq_bytes == 0 && c->state == CS_HANDLER && c->req.on_drain)
        c->req.on_drain(&c->req);
}

/* Writes bufs in order: straight to the socket when it takes them, else one copy queued.
 * 0, or BATON_ECLOSED after closing the connection on a write error. */
int baton__hs_write_raw(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (baton__hs_tcp_closing(c))
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
            baton__hs_close_hard(c);
            return BATON_ECLOSED;
        }
        if (done == total)
            return 0;
    }
    size_t rest = total - done;
    baton__hs_wreq_t *w = malloc(sizeof(*w) + rest);
    if (w == NULL) {
        log_error("http", "write_oom bytes=%zu peer=%s", rest, c->req.peer);
        baton__hs_close_hard(c);
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
        baton__hs_close_hard(c);
        return BATON_ECLOSED;
    }
    c->wq_bytes += rest;
    if (c->srv->budget) /* a share of its own: bodies never wait for slow readers */
        atomic_fetch_add(&c->srv->budget->out_used, rest);
    return 0;
}

/* Ciphertext the TLS layer produced: written, then the buffer is released. */
int baton__hs_write_out(conn_t *c, baton_buf_t *out)
{
    int rc = 0;
    if (out->len > 0) {
        uv_buf_t b = uv_buf_init(out->data, (unsigned)out->len);
        rc = baton__hs_write_raw(c, &b, 1);
    }
    baton_buf_free(out);
    return rc;
}

/*
 * Plaintext out: through the TLS layer when the listener has one. The ciphertext goes through
 * the server's scratch buffer, which baton__hs_write_raw has written or copied before it returns,
 * so an encrypted write allocates nothing; a write nested in another (from a callback) gets its
 * own.
 */
static int conn_write_now(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (c->tls == NULL)
        return baton__hs_write_raw(c, bufs, n);
    if (baton__hs_tcp_closing(c))
        return BATON_ECLOSED;
    srv_t *srv = c->srv;
    if (srv->tls_scratch_busy) {
        baton_buf_t out = BATON_BUF_INIT;
        if (baton_tls_conn_encrypt(c->tls, bufs, n, &out) != 0) {
            baton_buf_free(&out);
            baton__hs_close_hard(c);
            return BATON_ECLOSED;
        }
        return baton__hs_write_out(c, &out);
    }
    baton_buf_t *out = &srv->tls_scratch;
    int rc = 0;
    srv->tls_scratch_busy = 1;
    if (baton_tls_conn_encrypt(c->tls, bufs, n, out) != 0) {
        baton__hs_close_hard(c);
        rc = BATON_ECLOSED;
    } else if (out->len > 0) {
        uv_buf_t b = uv_buf_init(out->data, (unsigned)out->len);
        rc = baton__hs_write_raw(c, &b, 1);
    }
    srv->tls_scratch_busy = 0;
    if (out->cap > BATON__HS_SPARE_BUF_MAX)
        baton_buf_free(out);
    else
        baton_buf_reset(out);
    return rc;
}

void baton__hs_cork_unlink(conn_t *c)
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
int baton__hs_write(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    if (c->cork.len == 0)
        return n ? conn_write_now(c, bufs, n) : 0;
    uv_buf_t all[4];
    unsigned k = 0;
    all[k++] = uv_buf_init(c->cork.data, (unsigned)c->cork.len);
    for (unsigned i = 0; i < n; i++)
        all[k++] = bufs[i];
    int rc = conn_write_now(c, all, k);
    baton__hs_cork_unlink(c);
    return rc;
}

static void on_flush_check(uv_check_t *h)
{
    srv_t *srv = h->data;
    baton_list_t *l;
    while ((l = baton_list_first(&srv->corked)) != NULL)
        baton__hs_write(container_of(l, conn_t, cork_link), NULL, 0);
    uv_check_stop(h);
}

/* Adds bytes to the connection's cork (flushed at the end of this loop turn, or now when it is
 * full). 0, or BATON_ECLOSED after closing the connection. */
static int cork_add(conn_t *c, const uv_buf_t *bufs, unsigned n)
{
    srv_t *srv = c->srv;
    baton__hs_buf_take(&srv->spare_cork, &c->cork);
    size_t before = c->cork.len, total = 0;
    for (unsigned i = 0; i < n; i++)
        total += bufs[i].len;
    if (before + total >= CORK_MAX)
        return baton__hs_write(c, bufs, n); /* the corked bytes and these, without copying these */
    for (unsigned i = 0; i < n; i++) {
        if (baton_buf_append(&c->cork, bufs[i].base, bufs[i].len) != 0) {
            c->cork.len = before; /* out of memory: what is corked, then these, now */
            if (before > 0)
                c->cork.data[before] = '\0';
            return baton__hs_write(c, bufs, n);
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
    const char *reason = reason_phrase(status);
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

void baton__hs_send_continue(conn_t *c)
{
    static const char msg[] = "HTTP/1.1 100 Continue\r\n\r\n";
    uv_buf_t b = uv_buf_init((char *)msg, sizeof(msg) - 1);
    baton__hs_write(c, &b, 1);
}

/* A plain-HTTP request on the TLS port gets a plain-HTTP answer saying so, as nginx does. */
void baton__hs_send_plaintext_refusal(conn_t *c)
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
    baton__hs_write_raw(c, bufs, 2);
}

/* Server-generated error (limits, timeouts, malformed input): JSON body, then close. */
void baton__hs_send_error(conn_t *c, int status, const char *message, const char *code)
{
    if (baton__hs_closing(c))
        return;
    if (c->tls && !baton_tls_conn_established(c->tls)) {
        /* No TLS session yet to carry an HTTP answer (connection cap, handshake timeout). */
        log_debug("http", "request_rejected status=%d peer=%s reason=\"%s\" tls=handshaking",
                  status, c->req.peer, message);
        baton__hs_close_hard(c);
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
            baton__hs_write(c, bufs, 2);
            free(heap);
        }
    }
    baton_buf_free(&body);
    log_debug("http", "request_rejected status=%d peer=%s reason=\"%s\"", status, c->req.peer,
              message);
    baton__hs_close_graceful(c);
}

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
    if (!baton__hs_req_held(c) || c->streaming)
        return BATON_EINVAL;
    int rc = 0;
    if (baton__hs_tcp_closing(c)) {
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
            baton__hs_close_hard(c);
            rc = BATON_ENOMEM;
        } else {
            uv_buf_t bufs[2] = {uv_buf_init(head, (unsigned)hlen),
                                uv_buf_init((char *)body, (unsigned)body_len)};
            unsigned nb = (bodyless || c->no_body_out || body_len == 0) ? 1 : 2;
            rc = baton__hs_write(c, bufs, nb);
            free(heap);
        }
    }
    baton__hs_req_finish(c);
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
    if (!baton__hs_req_held(c) || c->streaming)
        return BATON_EINVAL;
    c->streaming = 1;
    if (baton__hs_tcp_closing(c))
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
        baton__hs_close_hard(c);
        return BATON_ENOMEM;
    }
    uv_buf_t b = uv_buf_init(head, (unsigned)hlen);
    int rc = cork_add(c, &b, 1); /* goes out with the first chunk when it comes this turn */
    free(heap);
    return rc;
}

/* "<len in hex>\r\n" into out (at least 19 bytes); its length (a relayed stream writes one per
 * upstream read: formatted by hand, not by printf). */
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
    if (!baton__hs_req_held(c) || !c->streaming)
        return BATON_EINVAL;
    if (baton__hs_tcp_closing(c))
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
    if (!baton__hs_req_held(c) || !c->streaming)
        return BATON_EINVAL;
    int rc = 0;
    if (baton__hs_tcp_closing(c)) {
        rc = BATON_ECLOSED;
    } else if (c->chunked_out && !c->no_body_out) {
        uv_buf_t b = uv_buf_init((char *)"0\r\n\r\n", 5); /* with the corked bytes */
        rc = baton__hs_write(c, &b, 1);
    } else {
        rc = baton__hs_write(c, NULL, 0); /* the corked bytes */
    }
    baton__hs_req_finish(c);
    return rc;
}
