/* server.c — the HTTP server's listener (accept, EMFILE back-off, connection cap) and its life. */
#include "http/server_internal.h"

#include "baton/error.h"
#include "common/log.h"

#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Accepts per listener wake-up: bounded so one busy listener cannot starve the loop. */
#define ACCEPT_BATCH 64
/* Out of descriptors: accepting pauses this long, doubling up to the cap (nginx pauses too). */
#define ACCEPT_BACKOFF_MIN_MS 100
#define ACCEPT_BACKOFF_MAX_MS 1000

static void on_listener_io(uv_poll_t *h, int status, int events);

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
conn_t *baton__hs_conn_new(srv_t *srv, int fd)
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
    baton__hs_req_reset(c);
    c->req.server = &srv->pub;
    if (uv_tcp_open(&c->tcp, fd) != 0) {
        close(fd);
        baton__hs_set_state(c, CS_CLOSED);
        uv_close((uv_handle_t *)&c->tcp, baton__hs_on_tcp_close);
        return NULL;
    }
    return c;
}

/* Counts c against the cap and readies its parser for the first request. */
void baton__hs_conn_admit(conn_t *c)
{
    c->counted = 1;
    c->srv->n_conns++;
    llhttp_init(&c->parser, HTTP_REQUEST, &c->srv->settings);
    c->parser.data = c;
    c->keep_alive = 1;
}

/* Takes an accepted descriptor: a connection, or a 503 when the instance is at its cap. */
static void conn_accepted(srv_t *srv, int fd)
{
    conn_t *c = baton__hs_conn_new(srv, fd);
    if (c == NULL)
        return;
    format_peer(c);
    if (srv->tls && baton__hs_tls_attach(c) != 0)
        return;
    if (srv->n_conns >= srv->limits.max_connections) {
        log_warn_limited("http", "connection_rejected",
                         "connection_rejected reason=max_connections limit=%u peer=%s",
                         srv->limits.max_connections, c->req.peer);
        baton__hs_read_start(c);
        baton__hs_send_error(c, 503, "too many connections", "too_many_connections");
        return;
    }
    baton__hs_conn_admit(c);
    uv_tcp_nodelay(&c->tcp, 1);
    baton__hs_read_start(c);
    if (!baton__hs_tcp_closing(c))
        baton__hs_arm_idle(c);
}

static void on_accept_timer(uv_timer_t *t)
{
    srv_t *srv = t->data;
    if (!srv->accept_paused || srv->listener_closing)
        return;
    srv->accept_paused = 0;
    /* Level-triggered: pending connections wake the listener again at once. */
    if (uv_poll_start(&srv->listener, UV_READABLE, on_listener_io) != 0)
        log_error("http", "accept_resume_failed");
}

/* Out of descriptors: pause accepting for a back-off instead of retrying in a tight loop. The
 * connections wait in the kernel's backlog meanwhile. */
static void accept_pause(srv_t *srv, int err)
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
    srv_t *srv = h->data;
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
    srv_t *srv = calloc(1, sizeof(*srv));
    if (srv == NULL)
        return BATON_ENOMEM;
    srv->rbuf = malloc(BATON__HS_READ_BUF);
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
    baton__hs_settings_init(&srv->settings);
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
    *srv_p = &srv->pub;
    return 0;
}

int baton_http_server_listen(baton_http_server_t *pub, const char *host, int port, int reuseport)
{
    srv_t *srv = baton__hs_srv(pub);
    if (pub == NULL || host == NULL || port < 0 || port > 65535)
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

void baton_http_server_set_tls(baton_http_server_t *pub, baton_tls_t *tls)
{
    srv_t *srv = baton__hs_srv(pub);
    srv->tls = tls;
}

void baton_http_server_set_budget(baton_http_server_t *pub, baton_http_budget_t *budget)
{
    srv_t *srv = baton__hs_srv(pub);
    srv->budget = budget;
}

int baton_http_server_port(const baton_http_server_t *pub)
{
    return container_of(pub, const srv_t, pub)->port;
}

unsigned baton_http_server_connections(const baton_http_server_t *pub)
{
    return container_of(pub, const srv_t, pub)->n_conns;
}

static void on_listener_close(uv_handle_t *h)
{
    srv_t *srv = h->data;
    if (h == (uv_handle_t *)&srv->listener && srv->listen_fd >= 0) {
        close(srv->listen_fd);
        srv->listen_fd = -1;
    }
    srv->n_live--;
    baton__hs_server_maybe_done(srv);
}

static void close_listener(srv_t *srv)
{
    if (srv->listener_closing)
        return;
    srv->listener_closing = 1;
    uv_timer_stop(&srv->accept_timer);
    if (srv->listener_inited)
        uv_close((uv_handle_t *)&srv->listener, on_listener_close);
}

void baton_http_server_stop_accepting(baton_http_server_t *pub)
{
    srv_t *srv = baton__hs_srv(pub);
    srv->stopping = 1;
    close_listener(srv);
    /* baton__hs_close_hard only starts closing: c stays listed until its close callback */
    for (baton_list_t *it = srv->conns.next; it != &srv->conns; it = it->next) {
        conn_t *c = container_of(it, conn_t, link);
        if (c->state == CS_IDLE)
            baton__hs_close_hard(c);
    }
}

void baton_http_server_close(baton_http_server_t *pub, baton_http_server_close_cb close_cb)
{
    srv_t *srv = baton__hs_srv(pub);
    if (srv->closing)
        return;
    srv->closing = 1;
    srv->stopping = 1;
    srv->close_cb = close_cb;
    close_listener(srv);
    for (baton_list_t *it = srv->conns.next; it != &srv->conns; it = it->next)
        baton__hs_close_hard(container_of(it, conn_t, link));
    uv_close((uv_handle_t *)&srv->accept_timer, on_listener_close);
    uv_close((uv_handle_t *)&srv->budget_timer, on_listener_close);
    uv_close((uv_handle_t *)&srv->flush_check, on_listener_close);
    uv_close((uv_handle_t *)&srv->close_token, on_listener_close);
}

void baton__hs_server_maybe_done(srv_t *srv)
{
    if (!srv->closing || srv->n_live > 0)
        return;
    if (srv->close_cb)
        srv->close_cb(&srv->pub);
    baton__hs_spare_free(&srv->spare_arena);
    baton__hs_spare_free(&srv->spare_hdrs);
    baton__hs_spare_free(&srv->spare_body);
    baton__hs_spare_free(&srv->spare_cork);
    baton_buf_free(&srv->tls_scratch);
    free(srv->rbuf);
    free(srv);
}
