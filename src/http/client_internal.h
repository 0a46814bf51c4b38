/* client_internal.h — the HTTP client's private types: the pool, a connection, a request. */
#ifndef BATON_HTTP_CLIENT_INTERNAL_H
#define BATON_HTTP_CLIENT_INTERNAL_H

#include "http/client.h"
#include "http/head.h"
#include "http/tls.h"

#include "common/buf.h"
#include "common/list.h"

#include <llhttp.h>

/*
 * The client's files: client.c (the pool, a request's life: timers, completion, the API) and
 * client_conn.c (connections: connect, the write path, reading and parsing responses).
 *
 * Data path and ownership (every callback runs on the pool's loop):
 *   write  the request head is formatted into r->head (the request's); the body's segments are
 *          the caller's and written without copying (valid until on_done). A partial write
 *          queues the rest by pointer; over TLS the ciphertext is the request's (freed with it)
 *          or the pool's scratch buffer for what the socket takes at once.
 *   read   libuv reads into pool->rbuf, shared by the pool's connections: nothing keeps a
 *          pointer into it once on_read returns. The response head is copied into r->resp
 *          (http/head.h, the request's; its header pointers are valid during on_head); body
 *          bytes go to on_data straight from the read buffer, or into r->held while paused.
 */

/* Shared by the pool's connections: see "read" above. */
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

/* ---- client.c: the pool, the request's life (timers, completion), the API ---- */

void baton__hc_set_phase(creq_t *r, int phase);
/* Delivers on_done (never from inside an API call) and frees the request afterwards. */
void baton__hc_finish(creq_t *r, int err);
void baton__hc_pool_maybe_free(baton_http_pool_t *pool);

/* ---- client_conn.c: connections, the write path, reading and parsing responses ---- */

void baton__hc_settings_init(llhttp_settings_t *s);
int baton__hc_conn_read_start(cconn_t *conn);
/* r's connection is done with it: back to the idle list when it may be reused, else closed. */
void baton__hc_conn_release(cconn_t *conn);
/* The warmest idle connection, or NULL. */
cconn_t *baton__hc_idle_first(const baton_http_pool_t *pool);
void baton__hc_idle_unlink(cconn_t *conn);
void baton__hc_conn_close(cconn_t *conn);
/* The connection failed with a request on it (called on the loop, never inside an API call). */
void baton__hc_conn_fail(cconn_t *conn, int err);
/* Opens a new connection for r. 0, or an error after which r is not attached. */
int baton__hc_conn_open(baton_http_pool_t *pool, creq_t *r);
void baton__hc_attach(cconn_t *conn, creq_t *r);
/* Head and body segments out in one writev (see client_conn.c). */
int baton__hc_send_request(creq_t *r);
/* The whole response is in: on_done(0). */
void baton__hc_complete(creq_t *r);

#endif
