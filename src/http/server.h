/* server.h — HTTP/1.1 server on one libuv loop (llhttp parsing, limits, keep-alive, streaming). */
#ifndef BATON_HTTP_SERVER_H
#define BATON_HTTP_SERVER_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "http/common.h"

/*
 * Threading: a server instance belongs to one loop and every function here must be called on
 * that loop's thread. Several instances (one per loop/thread) may listen on the same host:port
 * with SO_REUSEPORT; the kernel spreads connections over them.
 *
 * Life of a request:
 *   1. The server reads and parses a request; the limits below are enforced with an
 *      OpenAI-style JSON error ({"error":{"message","type","param","code"}}) and the
 *      connection is closed after that error: 400 malformed HTTP, 408 header/body read timeout,
 *      413 body too large, 431 request line + headers too large, 503 connection cap, 503
 *      server_busy when a body waited for the memory budget (below) past the body timeout.
 *      When the process runs out of descriptors (EMFILE/ENFILE), the instance stops accepting
 *      for a back-off (100 ms doubling to 1 s, as nginx does) instead of spinning on accept,
 *      and resumes by itself.
 *   2. Once the whole request (headers and de-chunked body) is in, handler(req, ctx) is called.
 *      The request (and its path, headers and body) stays valid and owned by the server until
 *      the handler finishes it with exactly one of baton_http_respond*() or
 *      baton_http_stream_end(). The handler may finish it inside the call or any time later.
 *   3. If the client goes away before the request is finished, req->on_abort (when set) is
 *      called once, later, on the loop. The request stays valid: the handler must still finish
 *      it (the write calls then return BATON_ECLOSED and write nothing; finishing frees it).
 *   4. After a request is finished, the connection is kept alive (HTTP/1.1 default,
 *      "Connection: keep-alive" for 1.0) or closed. Pipelined requests are parsed only after
 *      the previous response is finished (bytes read meanwhile are buffered, bounded by the
 *      header limit).
 *
 * Ownership: `body` and `data` passed to the respond/write calls are copied (or written before
 * return) and may be reused by the caller right away. The request's strings (method, path,
 * query, headers, body) live in the connection's buffers (server_internal.h: the data path) and
 * are the server's: valid until the request is finished, reused for the next request after it.
 *
 * Callbacks: handler, on_abort, on_drain and close_cb all run on the server's loop, from its
 * I/O, timer or check callbacks, never inside a call to this API.
 */

typedef struct baton_http_limits_s {
    size_t max_header_bytes;    /* request line + headers; 431. Default 64 KiB */
    size_t max_headers;         /* header count; 431. Default 100 */
    size_t max_body_bytes;      /* 413. Default 64 MiB */
    uint64_t header_timeout_ms; /* first byte of a request to end of headers; 408. Default 30 s */
    uint64_t body_timeout_ms;   /* longest gap between body reads; 408. Default 60 s */
    uint64_t keepalive_timeout_ms; /* idle keep-alive connection is closed. Default 75 s */
    unsigned max_connections;      /* per instance; over it → 503 and close. Default 10000 */
    /* Request-body bytes being read plus response bytes queued to clients that the server may
     * hold, shared by every instance given the same budget (baton_http_server_set_budget); 0 in
     * the limits means "derive from memory" to the router and nothing to the server. */
    size_t max_buffered_bytes;
    /* 1: a client that half-closes (EOF) after a complete request still gets its answer, and
     * the connection closes after it; a client that is really gone is then noticed when a write
     * to it fails. 0 (the default): EOF is the client's abort. */
    unsigned answer_half_closed;
} baton_http_limits_t;

/* Fills the defaults above. */
void baton_http_limits_default(baton_http_limits_t *limits);

/*
 * A memory budget shared by server instances on any threads (the caller owns it; it must
 * outlive them). Bytes of request bodies being read and response bytes queued to slow clients
 * count against `max`. A body with a Content-Length is admitted whole (its length charged at
 * once) or not at all; a chunked one is charged as it is read. A body that does not fit stops
 * being read (back-pressure: its bytes wait in the kernel) and resumes when bytes are freed, or
 * gets 503 server_busy when the body timeout passes first. A body that is alone in the budget
 * always goes on, so one body larger than `max` (up to max_body_bytes) can still be served.
 * Bodies of at most min(1 MiB, max/64) bytes that do not fit take a separate reserve of max/8,
 * so big bodies cannot starve small requests. One read (64 KiB) per thread may overshoot.
 * Response bytes queued to clients are always accepted and counted in `out_used`, apart from
 * the bodies' budget (the proxy applies its own back-pressure to them).
 */
typedef struct baton_http_budget_s {
    _Atomic size_t used;              /* main budget, read with atomic_load */
    size_t max;                       /* set before use; 0 = no limit */
    _Atomic size_t reserve_used;      /* the small-body reserve (max/8) */
    _Atomic unsigned long long waits; /* times a body had to wait (for logs and tests) */
    /* Response bytes queued to clients, a share of their own: a body never waits for them
     * (clients that do not read cannot starve requests). Whoever streams keeps it bounded with
     * back-pressure (the router: BATON_PROXY_STREAM_HIGH_WATER per stream, max/2 in all). */
    _Atomic size_t out_used;
    /* Of `used`: the bytes a handler holds for upstreams (the router's buffered answers and
     * open SSE events), charged by the handler itself (for metrics). */
    _Atomic size_t upstream_used;
} baton_http_budget_t;

typedef struct baton_http_server_s baton_http_server_t;
typedef struct baton_http_req_s baton_http_req_t;

/* The server's public part; the rest is private to the server's files (server_internal.h). */
struct baton_http_server_s {
    void *data; /* the caller's, as libuv's handle->data: never touched by the server (the
                 * close callback finds its context here) */
};

typedef void (*baton_http_handler_cb)(baton_http_req_t *req, void *ctx);
typedef void (*baton_http_abort_cb)(baton_http_req_t *req);
typedef void (*baton_http_drain_cb)(baton_http_req_t *req);
typedef void (*baton_http_server_close_cb)(baton_http_server_t *srv);

struct baton_http_req_s {
    void *data;                   /* the handler's; the server never touches it */
    baton_http_abort_cb on_abort; /* set by the handler; see rule 3 above */
    baton_http_drain_cb on_drain; /* set by the handler; called when the write queue empties */

    /* Read-only, valid until the request is finished. All strings are NUL-terminated. */
    const char *method; /* "GET", "POST", ... */
    const char *path;   /* raw path, without the query: "/v1/chat/completions" */
    const char *query;  /* raw query after '?', or "" */
    const baton_http_header_t *headers;
    size_t n_headers;
    const char *body; /* de-chunked body, NUL-terminated; "" when empty */
    size_t body_len;
    int http_minor;    /* 0 or 1 */
    uint64_t start_ns; /* uv_hrtime() when the first byte of the request arrived */
    char peer[64];     /* "127.0.0.1:54321" */
    baton_http_server_t *server;
};

/* Case-insensitive header lookup; NULL when absent. */
const baton_http_header_t *baton_http_req_header(const baton_http_req_t *req, const char *name);

/* Creates a server on `loop`. `limits` may be NULL for the defaults. */
int baton_http_server_create(baton_http_server_t **srv_p, uv_loop_t *loop,
                             const baton_http_limits_t *limits, baton_http_handler_cb handler,
                             void *ctx);

/*
 * Binds and listens on host:port (IPv4 or IPv6 literal, or "localhost"). port 0 picks an
 * ephemeral port; baton_http_server_port() tells which. reuseport != 0 sets SO_REUSEPORT so
 * other instances (other loops) can bind the same address.
 */
int baton_http_server_listen(baton_http_server_t *srv, const char *host, int port, int reuseport);
int baton_http_server_port(const baton_http_server_t *srv);

/* Makes this instance charge its buffered bytes to `budget` (NULL: none). Call before listen. */
void baton_http_server_set_budget(baton_http_server_t *srv, baton_http_budget_t *budget);
/*
 * Makes the listener HTTPS (see http/tls.h): connections accepted from now on run TLS under
 * the same HTTP code. `tls` (a server configuration) is not owned and must outlive the
 * server's close_cb. The header timeout bounds the handshake too (no 408: nothing to send it
 * over); a plain-HTTP request gets a plain 400 saying TLS is required.
 */
struct baton_tls_s;
void baton_http_server_set_tls(baton_http_server_t *srv, struct baton_tls_s *tls);

/* Connections open now on this instance (for metrics and tests). */
unsigned baton_http_server_connections(const baton_http_server_t *srv);

/* Stops accepting new connections; idle keep-alive connections are closed, busy ones are
 * closed as soon as their current response is finished. */
void baton_http_server_stop_accepting(baton_http_server_t *srv);

/*
 * Closes the listener and every connection (in-flight requests see on_abort). close_cb runs
 * once everything is closed and all requests were finished by their handlers, with the server
 * (its `data` still the caller's); the server is freed after close_cb returns.
 */
void baton_http_server_close(baton_http_server_t *srv, baton_http_server_close_cb close_cb);

/* ---- Responses (exactly one finishing call per request) ---- */

/*
 * A complete response with Content-Length. `extra` headers may be NULL. Content-Type defaults
 * to application/json when NULL. Returns 0, or BATON_ECLOSED when the client is gone (the
 * request is finished either way).
 */
int baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                       const baton_http_header_t *extra, size_t n_extra, const char *body,
                       size_t body_len);

/* {"error":{"message":message,"type":type,"param":param or null,"code":code or null}} */
int baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                             const char *type, const char *param, const char *code);

/* Starts a chunked (Transfer-Encoding: chunked) response, e.g. text/event-stream for SSE. */
int baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                            const baton_http_header_t *extra, size_t n_extra);

/*
 * Writes one chunk (len 0 is ignored). Returns 0 or BATON_ECLOSED. The head and the chunks
 * written during one loop turn are gathered (copied, up to 64 KiB; a larger chunk goes out at
 * once with them) and sent in one write when the turn's I/O callbacks have run, before the loop
 * waits again: several SSE events from one upstream read cost one syscall. stream_end (and any
 * other write) sends the gathered bytes first, in the same write.
 */
int baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len);

/* Bytes queued to this client and not yet written to the socket (for back-pressure); the bytes
 * gathered in the current loop turn are not counted (they are written at its end). */
size_t baton_http_write_queue_size(const baton_http_req_t *req);

/* Writes the last chunk and finishes the request. */
int baton_http_stream_end(baton_http_req_t *req);

#endif
