/* client.c — upstream HTTP/1.1 client: keep-alive pools, a request's life and timeouts, the API. */
#include "http/client_internal.h"

#include "baton/error.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static void on_ctimer(uv_timer_t *t);

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

void baton__hc_set_phase(creq_t *r, int phase)
{
    r->phase = phase;
    r->phase_start = uv_now(r->pool->loop);
    r->last_read = r->phase_start;
    arm_phase(r);
}

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
    baton__hc_pool_maybe_free(pool);
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

/* Delivers on_done (never from inside an API call) and frees the request afterwards. */
void baton__hc_finish(creq_t *r, int err)
{
    cconn_t *conn = r->conn;
    if (conn) {
        r->conn = NULL;
        if (err == 0) {
            baton__hc_conn_release(conn);
        } else {
            conn->req = NULL;
            baton__hc_conn_close(conn);
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
        baton__hc_complete(r);
        return;
    }
    if (conn && conn->connected && baton__hc_conn_read_start(conn) != 0) {
        baton__hc_conn_fail(conn, BATON_EEOF);
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
        baton__hc_finish(r, r->deferred_err);
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
        /* Connected, but the TLS handshake did not baton__hc_finish in time: a TLS failure. */
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
    baton__hc_finish(r, err); /* closes the connection: the upstream sees it at once */
}

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
    baton__hc_settings_init(&pool->settings);
    *pool_p = pool;
    return 0;
}

void baton__hc_pool_maybe_free(baton_http_pool_t *pool)
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
    while ((conn = baton__hc_idle_first(pool)) != NULL)
        baton__hc_conn_close(conn);
    baton__hc_pool_maybe_free(pool);
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
    /* Appends, not printf: this runs for every upstream request. */
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
    while ((conn = baton__hc_idle_first(pool)) != NULL) {
        baton__hc_idle_unlink(conn);
        baton__hc_attach(conn, r);
        if (baton__hc_send_request(r) == 0)
            return 0;
        conn->req = NULL;
        r->conn = NULL;
        baton__hc_conn_close(conn);
    }
    err = baton__hc_conn_open(pool, r);
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
        baton__hc_conn_close(conn);
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
