/* server_internal.h — the HTTP server's private types: the server, a connection and its states. */
#ifndef BATON_HTTP_SERVER_INTERNAL_H
#define BATON_HTTP_SERVER_INTERNAL_H

#include "http/head.h"
#include "http/server.h"
#include "http/tls.h"

#include "common/buf.h"
#include "common/list.h"

#include <llhttp.h>

/*
 * The server's files, one concern each (all on the server's one loop):
 *   server.c         the listener: accept, the EMFILE back-off, the connection cap, a
 *                    connection's set-up; the server's life (create, stop, close)
 *   server_conn.c    a connection: its states (the one transition function), reading,
 *                    parsing with llhttp and http/head.h, timers, the request's life, closing
 *   server_write.c   the write path: responses, streams, the per-turn cork, TLS encryption
 *   server_budget.c  memory: the shared budget of buffered bytes, the spare request buffers
 *
 * Data path and ownership (every callback below runs on the server's loop):
 *   read      libuv reads into srv->rbuf, the one read buffer of the server (on_alloc): nothing
 *             keeps a pointer into it once on_read returns. Over TLS the plaintext comes from
 *             the TLS layer's buffer, also only for the call.
 *   parse     llhttp copies the head into c->head (arena + header table, owned by the
 *             connection) and the body into c->body; both are the request's until it is
 *             finished, then go back to the server's spares (srv->spare_*), never shared.
 *   pipeline  bytes read while a request is with the handler wait in c->pending (connection's).
 *   write     a response's bytes are written at once (uv_try_write) or copied into one wreq_t
 *             (freed in on_write); a stream's bytes of one loop turn gather in c->cork, written
 *             by the server's uv_check (on_flush_check) at the end of the turn. Over TLS the
 *             ciphertext passes through srv->tls_scratch, written or copied before return.
 */

/* One read buffer per server (per loop): see "read" above. */
#define BATON__HS_READ_BUF (64 * 1024)
/* Request buffers kept for reuse (see "parse"): bounded in count and size. */
#ifndef BATON_POOL_REUSE
#define BATON_POOL_REUSE 1 /* 0 in sanitizer builds (CMakeLists.txt) */
#endif
#define BATON__HS_SPARE_BUFS    64
#define BATON__HS_SPARE_BUF_MAX (64 * 1024)

/* What the connection's one timer means when it fires (one timer per connection). */
enum baton__hs_timer_mode {
    TM_NONE,
    TM_IDLE,   /* keep-alive wait: silent close */
    TM_HEAD,   /* first byte → end of headers: 408 */
    TM_BODY,   /* longest gap between body reads: 408 */
    TM_ABORT,  /* deliver on_abort on a later loop turn */
    TM_RESUME, /* parse bytes that arrived while the previous request was with the handler */
    TM_LINGER, /* draining after an error response */
};

/*
 * The state of a connection. It changes only in baton__hs_set_state(), a checked move through
 * common/phase.h: a move the table in server_conn.c does not list is refused (logged, counted
 * in baton_phase_refused() and in srv->state_refused).
 *
 *   IDLE ──► HEAD ──► BODY ◄──► BODY_WAIT
 *    ▲        │        │
 *    │        ▼        ▼
 *    └───── HANDLER ◄──┘      (finished: IDLE for the next request, then LINGER without
 *               │              keep-alive)
 *               └──► ABORTED (the socket closed under the handler) ──► CLOSED
 *   IDLE, HEAD, BODY, BODY_WAIT ──► LINGER (an error answered, or no keep-alive: FIN, drain)
 *   IDLE, HEAD, BODY, BODY_WAIT, LINGER ──► CLOSED ──► FREEING
 *
 * The order matters: every state from LINGER on is "closing" (no more requests), every state
 * from ABORTED on has the socket closing (uv_close called).
 */
typedef enum baton__hs_state_e {
    CS_IDLE,      /* no request begun: a fresh, keep-alive or TLS-handshaking connection */
    CS_HEAD,      /* reading a request line and headers (the header timeout runs) */
    CS_BODY,      /* reading a request body: reads are checked against the memory budget */
    CS_BODY_WAIT, /* reading stopped until the budget has room (or the body timeout: 503) */
    CS_HANDLER,   /* the request is with the handler; later bytes wait in `pending` */
    CS_LINGER,    /* no more requests: writes flushed, FIN sent, the client's bytes drained */
    CS_ABORTED,   /* the socket is closing and the handler still holds the request */
    CS_CLOSED,    /* the socket is closing or closed; no request held */
    CS_FREEING,   /* both handles closing: the struct is freed in the timer's close callback */
    CS_COUNT
} baton__hs_state_t;

typedef struct baton__hs_spare_s {
    baton_buf_t b[BATON__HS_SPARE_BUFS];
    unsigned n;
} baton__hs_spare_t;

typedef struct baton__hs_conn_s conn_t;

/* The server; its public part (the caller's `data`) first. */
typedef struct baton__hs_server_s {
    baton_http_server_t pub;
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
    char *rbuf; /* BATON__HS_READ_BUF bytes, lent to one read_cb at a time */
    baton__hs_spare_t spare_arena, spare_hdrs, spare_body, spare_cork;
    baton_buf_t tls_scratch; /* ciphertext of one write (server_write.c) */
    int tls_scratch_busy;
    uv_check_t flush_check; /* runs while a connection has corked bytes */
    baton_list_t corked;    /* of conn_t.cork_link */
    baton_list_t conns;     /* of conn_t.link: every connection until its memory is freed */
    unsigned n_conns;       /* open, counted against max_connections */
    unsigned n_live;        /* listener + connection structs not yet freed */
    unsigned state_refused; /* illegal state moves refused (a bug when not 0; tests check it) */
    int port;
    /* The listener's and the server's life: each a separate fact, not one state (the listener
     * closes on stop_accepting long before the server closes). */
    unsigned listening : 1;
    unsigned listener_inited : 1;
    unsigned accept_paused : 1;
    unsigned listener_closing : 1;
    unsigned stopping : 1;
    unsigned closing : 1;
    baton_http_server_close_cb close_cb;
} srv_t;

typedef struct baton__hs_wreq_s {
    uv_write_t req;
    conn_t *conn;
    size_t len;
    char data[];
} baton__hs_wreq_t;

struct baton__hs_conn_s {
    uv_tcp_t tcp;
    uv_timer_t timer;
    uv_shutdown_t shutdown_req;
    llhttp_t parser;
    srv_t *srv;
    baton_tls_conn_t *tls;   /* NULL on a plain TCP listener */
    baton_list_t link;       /* in srv->conns */
    baton__hs_state_t state; /* changed only by baton__hs_set_state() */
    size_t charged;          /* body bytes counted in srv->budget (reserved or read) */
    size_t body_total;       /* the Content-Length of the body being read; 0 when chunked */
    baton_http_req_t req;    /* the one request being read or handled */
    baton__http_head_t head; /* request target, header names and values (http/head.h) */
    baton_buf_t body;
    baton_buf_t pending;    /* bytes read while a request is with the handler (pipelining) */
    baton_buf_t cork;       /* streamed bytes of this loop turn, not written yet */
    baton_list_t cork_link; /* in srv->corked while cork holds bytes */
    size_t wq_bytes;        /* bytes in our write requests that the socket has not taken yet */
    uint64_t last_read;
    int err_status;
    const char *err_msg;
    uint8_t timer_mode;
    /* Not the state: facts that hold across several states, or options of one response. */
    unsigned counted : 1;       /* counted in n_conns (a connection over the cap never is) */
    unsigned keep_alive : 1;    /* the request allows another after it (option of the request) */
    unsigned parser_paused : 1; /* llhttp is paused after a message (llhttp's own state) */
    unsigned in_feed : 1;       /* baton__hs_feed() is on the stack (re-entry guard) */
    unsigned tcp_closed : 1;    /* the socket's close callback ran (CLOSED or ABORTED) */
    unsigned read_stopped : 1;  /* uv_read_stop: budget wait, pipelining back-pressure */
    unsigned streaming : 1;     /* the response is a stream (HANDLER and ABORTED alike) */
    unsigned chunked_out : 1;   /* the stream is chunked (HTTP/1.1) */
    unsigned no_body_out : 1;   /* HEAD request: headers only */
    unsigned small_body : 1;    /* its Content-Length lets it use the budget's reserve */
    unsigned reserved : 1;      /* its whole Content-Length is charged: it reads freely */
    unsigned in_reserve : 1;    /* charged to the small-body reserve, not the main budget */
};

static inline srv_t *baton__hs_srv(baton_http_server_t *pub)
{
    return container_of(pub, srv_t, pub);
}

/* No more requests on c (LINGER and after). */
static inline int baton__hs_closing(const conn_t *c)
{
    return c->state >= CS_LINGER;
}

/* The handler holds c's request (HANDLER, or ABORTED: the socket closed under it). */
static inline int baton__hs_req_held(const conn_t *c)
{
    return c->state == CS_HANDLER || c->state == CS_ABORTED;
}

/* uv_close was called on c's socket (ABORTED and after). */
static inline int baton__hs_tcp_closing(const conn_t *c)
{
    return c->state >= CS_ABORTED;
}

/* Hands a request buffer back to the server's spares (emptied) or frees it (every request does
 * this for its head and body: inline). */
static inline void baton__hs_buf_give(baton__hs_spare_t *s, baton_buf_t *b)
{
    if (BATON_POOL_REUSE && b->data && b->cap <= BATON__HS_SPARE_BUF_MAX &&
        s->n < BATON__HS_SPARE_BUFS) {
        baton_buf_reset(b);
        s->b[s->n++] = *b;
        *b = (baton_buf_t)BATON_BUF_INIT;
    } else {
        baton_buf_free(b);
    }
}

/* An empty buffer gets a spare's storage when there is one. */
static inline void baton__hs_buf_take(baton__hs_spare_t *s, baton_buf_t *b)
{
    if (b->data == NULL && s->n > 0)
        *b = s->b[--s->n];
}

/* ---- server_conn.c: states, reading, parsing, the request's life, closing ---- */

/* 1 when `from` → `to` is in the table, else 0. */
int baton__hs_state_allowed(baton__hs_state_t from, baton__hs_state_t to);
const char *baton__hs_state_name(baton__hs_state_t st);
/* Moves c to `to`: 0, or BATON_EINVAL (refused, counted, logged; the state is unchanged). */
int baton__hs_set_state(conn_t *c, baton__hs_state_t to);
void baton__hs_settings_init(llhttp_settings_t *s);
void baton__hs_timer_start(conn_t *c, enum baton__hs_timer_mode mode, uint64_t ms);
void baton__hs_req_reset(conn_t *c);
void baton__hs_req_finish(conn_t *c); /* the handler finished the request */
void baton__hs_arm_idle(conn_t *c);
int baton__hs_tls_attach(conn_t *c);
void baton__hs_read_start(conn_t *c);
/* Bytes read: parsed, or stashed while a request is with the handler. */
void baton__hs_feed(conn_t *c, const char *data, size_t len);
void baton__hs_stash(conn_t *c, const char *data, size_t len);
void baton__hs_on_tcp_close(uv_handle_t *h);
void baton__hs_close_hard(conn_t *c);
void baton__hs_close_graceful(conn_t *c);

/* ---- server.c: the listener and the server's life ---- */

/* A live connection on descriptor fd (not yet counted against the cap); NULL when it could not
 * be set up (fd closed, nothing left behind). */
conn_t *baton__hs_conn_new(srv_t *srv, int fd);
/* Counts c against the cap and readies its parser for the first request. */
void baton__hs_conn_admit(conn_t *c);
void baton__hs_server_maybe_done(srv_t *srv);

/* ---- server_write.c: the write path ---- */

int baton__hs_write(conn_t *c, const uv_buf_t *bufs, unsigned n);
int baton__hs_write_raw(conn_t *c, const uv_buf_t *bufs, unsigned n);
int baton__hs_write_out(conn_t *c, baton_buf_t *out);
void baton__hs_cork_unlink(conn_t *c);
void baton__hs_send_continue(conn_t *c);
void baton__hs_send_plaintext_refusal(conn_t *c);
/* Server-generated error (limits, timeouts, malformed input): JSON body, then close. */
void baton__hs_send_error(conn_t *c, int status, const char *message, const char *code);

/* ---- server_budget.c: the memory budget and the spare buffers ---- */

void baton__hs_budget_add(srv_t *srv, size_t n);
void baton__hs_budget_sub(srv_t *srv, size_t n);
int baton__hs_budget_admit(conn_t *c);
void baton__hs_body_release(conn_t *c);
void baton__hs_budget_wait(conn_t *c);
void baton__hs_spare_free(baton__hs_spare_t *s);

#endif
