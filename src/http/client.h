/* client.h — upstream HTTP/1.1 client: per-upstream keep-alive pool, phase timeouts, streaming. */
#ifndef BATON_HTTP_CLIENT_H
#define BATON_HTTP_CLIENT_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "http/common.h"

/*
 * Threading: a pool belongs to one loop; every call and every callback happens on that loop's
 * thread. The router keeps one pool per (loop, worker).
 *
 * Life of a request:
 *   baton_http_request() queues it and returns 0 (or an error, and then no callback ever runs).
 *   It takes an idle keep-alive connection or opens a new one, writes the request, and reports:
 *     on_head  once, when the status line and headers are in;
 *     on_data  zero or more times with body bytes (de-chunked), as they arrive;
 *     on_done  exactly once, last, with 0 (whole body received) or a negative error:
 *              BATON_ECONNECT (connect refused/failed), BATON_ETIMEOUT_CONNECT,
 *              BATON_ETIMEOUT_FIRST_BYTE, BATON_ETIMEOUT_IDLE, BATON_ETIMEOUT_TOTAL,
 *              BATON_EEOF (closed before the response ended), BATON_EUPSTREAM (malformed
 *              response), BATON_ECANCELED (baton_http_request_cancel), BATON_ETLS (https:
 *              handshake or certificate verification failed, or the handshake did not finish
 *              within the connect timeout; nothing was sent).
 *   Callbacks never run inside baton_http_request() or baton_http_request_cancel(). After
 *   on_done returns the request handle is freed. on_head/on_data may be NULL.
 *   A connection goes back to the pool only after a complete response that allows keep-alive;
 *   on any error or cancel it is closed (the upstream sees the close at once).
 *   A request that failed on a reused keep-alive connection before any response byte
 *   (the upstream closed it while idle) is retried once on a new connection.
 *
 * Ownership: `method`, `path` and `headers` are formatted into the request head during the call
 * (they may be freed when it returns); `body` (the bytes of every segment) must stay valid until
 * on_done: it is written without copying — the router sends one body to both prefill and decode.
 */

typedef struct baton_http_pool_s baton_http_pool_t;
typedef struct baton_http_creq_s baton_http_creq_t;

typedef struct baton_http_timeouts_s {
    uint64_t connect_ms;    /* TCP connect; 0 = none */
    uint64_t first_byte_ms; /* request written → first response byte; 0 = none */
    uint64_t idle_ms;       /* longest gap between response reads after the first; 0 = none */
    uint64_t total_ms;      /* whole request; 0 = none */
} baton_http_timeouts_t;

typedef struct baton_http_client_cb_s {
    void (*on_head)(baton_http_creq_t *req, int status, const baton_http_header_t *headers,
                    size_t n_headers);
    void (*on_data)(baton_http_creq_t *req, const char *data, size_t len);
    void (*on_done)(baton_http_creq_t *req, int err);
} baton_http_client_cb_t;

/* The handle's public part; the rest is private to client.c. */
struct baton_http_creq_s {
    void *data; /* the caller's */
};

/*
 * host: IP literal or name (resolved once per connect with uv_getaddrinfo); max_idle: idle
 * keep-alive connections kept (extra ones are closed).
 */
int baton_http_pool_create(baton_http_pool_t **pool_p, uv_loop_t *loop, const char *host, int port,
                           unsigned max_idle);

/* Closes idle connections and frees the pool once requests still in flight have finished
 * (they run to completion or are cancelled by their owners). */
void baton_http_pool_destroy(baton_http_pool_t *pool);

/*
 * Makes the pool's new connections TLS (an https:// upstream; see http/tls.h): the peer's
 * certificate must verify against `tls`'s CA and match the pool's host (name or IP). The
 * request is written only after the handshake; a handshake that fails ends the request with
 * on_done(BATON_ETLS) (the connect timeout bounds the handshake too). `tls` (a client
 * configuration) is not owned and must outlive the pool.
 */
struct baton_tls_s;
void baton_http_pool_set_tls(baton_http_pool_t *pool, struct baton_tls_s *tls);

/* Connections (idle + busy) the pool holds now. */
unsigned baton_http_pool_connections(const baton_http_pool_t *pool);

/*
 * Sends `method path` with `headers` (Host, Content-Length and Connection are added by the
 * client) and `body` (may be NULL when body_len is 0). `timeouts` may be NULL (none).
 */
int baton_http_request(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                       const char *path, const baton_http_header_t *headers, size_t n_headers,
                       const char *body, size_t body_len, const baton_http_timeouts_t *timeouts,
                       const baton_http_client_cb_t *cb, void *data);

/*
 * The same with the body as `n_body` segments, written after the head in the same uv_write
 * (one writev; over TLS encrypted from the segments without joining them first, small ones
 * staged into one record). The segments' bytes are not copied and must stay valid until on_done;
 * the array itself is copied (it may be a local). Empty segments are skipped; Content-Length is
 * their total. `body` may be NULL when n_body is 0. baton_http_request() is this with one
 * segment.
 */
int baton_http_requestv(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                        const char *path, const baton_http_header_t *headers, size_t n_headers,
                        const uv_buf_t *body, unsigned n_body,
                        const baton_http_timeouts_t *timeouts, const baton_http_client_cb_t *cb,
                        void *data);

/* Stops delivering body bytes for a while (back-pressure) or resumes. Timers keep running
 * only when not paused. */
void baton_http_request_pause(baton_http_creq_t *req, int paused);

/* Closes the request's connection now; on_done(BATON_ECANCELED) follows on a later loop turn.
 * Safe to call from on_head/on_data; never after on_done (the handle is gone). */
void baton_http_request_cancel(baton_http_creq_t *req);

/*
 * The client as a table of operations, so that a caller can run against a fake upstream in
 * unit tests (the router's proxy reaches the client only through one). The functions keep the
 * contracts above; baton_http_client_ops holds the real ones above and is never modified.
 */
typedef struct baton_http_client_ops_s {
    int (*pool_create)(baton_http_pool_t **pool_p, uv_loop_t *loop, const char *host, int port,
                       unsigned max_idle);
    void (*pool_destroy)(baton_http_pool_t *pool);
    int (*request)(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                   const char *path, const baton_http_header_t *headers, size_t n_headers,
                   const char *body, size_t body_len, const baton_http_timeouts_t *timeouts,
                   const baton_http_client_cb_t *cb, void *data);
    int (*requestv)(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                    const char *path, const baton_http_header_t *headers, size_t n_headers,
                    const uv_buf_t *body, unsigned n_body, const baton_http_timeouts_t *timeouts,
                    const baton_http_client_cb_t *cb, void *data);
    void (*pause)(baton_http_creq_t *req, int paused);
    void (*cancel)(baton_http_creq_t *req);
    void (*set_tls)(baton_http_pool_t *pool, struct baton_tls_s *tls); /* NULL: no TLS */
} baton_http_client_ops_t;

extern const baton_http_client_ops_t baton_http_client_ops;

#endif
