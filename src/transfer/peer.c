/* transfer/peer.c — decode-side peers by endpoint: connect attempts, the health state machine,
 * reconnect after back-off, and the rooms waiting for a connection. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

#define PEER_IDLE_AFTER_MS 60000

static void post_state(baton__peer_t *p, baton_xfer_peer_state_t st, int reason)
{
    baton__post_peer_event(p->eng, p->endpoint, p->remote_id, p->remote_inc, st, p->transport,
                           reason, p->health.reconnects);
}

baton__peer_t *baton__peer_get(baton_xfer_engine_t *eng, const char *host, int port, int create)
{
    for (baton_list_t *it = eng->peers.next; it != &eng->peers; it = it->next) {
        baton__peer_t *p = container_of(it, baton__peer_t, link);
        if (p->port == port && strcmp(p->host, host) == 0)
            return p;
    }
    if (!create || eng->shutting_down)
        return NULL;
    baton__peer_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return NULL;
    p->eng = eng;
    snprintf(p->host, sizeof(p->host), "%s", host);
    p->port = port;
    if (strchr(host, ':') != NULL)
        snprintf(p->endpoint, sizeof(p->endpoint), "[%s]:%d", host, port);
    else
        snprintf(p->endpoint, sizeof(p->endpoint), "%s:%d", host, port);
    uint64_t seed = eng->incarnation ^ ((uint64_t)port << 17) ^ (uintptr_t)p;
    baton_peer_health_init(&p->health, eng->cfg.reconnect_min_ms, eng->cfg.reconnect_max_ms,
                           eng->cfg.connect_timeout_ms, PEER_IDLE_AFTER_MS, seed, baton_now_ms());
    baton_list_init(&p->queued);
    p->gai.data = p;
    baton_list_push(&eng->peers, &p->link);
    atomic_fetch_add(&eng->st_peers, 1);
    return p;
}

static void fail_queued(baton__peer_t *p, int status)
{
    while (!baton_list_empty(&p->queued)) {
        baton__droom_t *dr = container_of(p->queued.next, baton__droom_t, link);
        baton_list_remove(&dr->link);
        baton__droom_finish(dr, status); /* never sent: nothing can land */
    }
}

static void attempt_failed(baton__peer_t *p, int status, const char *why)
{
    uint64_t now = baton_now_ms();
    int was_up = p->health.state == BATON_PEER_UP;
    uint32_t delay = baton_peer_health_down(&p->health, now, status);
    /* With no room queued for the peer (its process ended after the last one), losing it and
     * failing to reach it again lose nothing: info. Queued rooms that now fail: a warning. */
    int quiet = baton_list_empty(&p->queued);
    baton_log(quiet ? BATON_LOG_INFO : BATON_LOG_WARN, BATON__LOG,
              "%s peer=%s err=%s reason=\"%s\" retry_in_ms=%" PRIu32,
              was_up ? "peer_lost" : "peer_connect_failed", p->endpoint, baton_err_name(status),
              why, delay);
    post_state(p, BATON_XFER_PEER_DOWN, status);
    fail_queued(p, BATON_EPEERDOWN);
}

static void on_connect(uv_connect_t *req, int status)
{
    baton__conn_t *c = req->data;
    if (c->state != BATON__CONN_CONNECTING)
        return; /* failed meanwhile (timeout, shutdown) */
    if (status < 0) {
        char msg[96];
        snprintf(msg, sizeof(msg), "connect failed: %s", uv_strerror(status));
        baton__conn_fail(c, BATON_EPEERDOWN, msg);
        return;
    }
    int rc = baton__conn_start_read(c);
    if (rc != 0) {
        baton__conn_fail(c, BATON_EPEERDOWN, uv_strerror(rc));
        return;
    }
    baton__hs_decode_start(c);
}

static void connect_addr(baton__peer_t *p, const struct sockaddr *sa)
{
    baton__conn_t *c = baton__conn_new(p->eng, BATON__ROLE_DECODE);
    if (c == NULL) {
        attempt_failed(p, BATON_ENOMEM, "out of memory");
        return;
    }
    c->peer = p;
    (void)BATON__CONN_MOVE(c, BATON__CONN_CONNECTING);
    snprintf(c->addr, sizeof(c->addr), "%.79s", p->endpoint);
    p->conn = c;
    c->creq.data = c;
    int rc = uv_tcp_connect(&c->creq, c->tcp, sa, on_connect);
    if (rc != 0)
        baton__conn_fail(c, BATON_EPEERDOWN, uv_strerror(rc));
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    baton__peer_t *p = req->data;
    p->resolving = 0;
    if (p->eng->shutting_down || p->health.state != BATON_PEER_CONNECTING) {
        uv_freeaddrinfo(res);
        if (p->eng->shutting_down) {
            /* The peer was kept alive only for this callback. */
            baton_xfer_engine_t *eng = p->eng;
            baton_list_remove(&p->link);
            free(p);
            baton__maybe_finish_shutdown(eng);
        }
        return;
    }
    if (status < 0 || res == NULL) {
        uv_freeaddrinfo(res);
        attempt_failed(p, BATON_ECONNECT, status < 0 ? uv_strerror(status) : "no address");
        return;
    }
    struct sockaddr_storage ss;
    memcpy(&ss, res->ai_addr, res->ai_addrlen);
    uv_freeaddrinfo(res);
    ((struct sockaddr_in *)&ss)->sin_port = htons((uint16_t)p->port);
    connect_addr(p, (struct sockaddr *)&ss);
}

static void start_connect(baton__peer_t *p)
{
    uint64_t now = baton_now_ms();
    baton_peer_health_connecting(&p->health, now);
    post_state(p, BATON_XFER_PEER_CONNECTING, 0);
    log_debug(BATON__LOG, "peer_connecting peer=%s attempt=%" PRIu32, p->endpoint,
              p->health.failures + 1);
    struct sockaddr_storage ss;
    if (uv_ip4_addr(p->host, p->port, (struct sockaddr_in *)&ss) == 0 ||
        uv_ip6_addr(p->host, p->port, (struct sockaddr_in6 *)&ss) == 0) {
        connect_addr(p, (struct sockaddr *)&ss);
        return;
    }
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = uv_getaddrinfo(&p->eng->ploop, &p->gai, on_resolved, p->host, NULL, &hints);
    if (rc != 0) {
        attempt_failed(p, BATON_ECONNECT, uv_strerror(rc));
        return;
    }
    p->resolving = 1;
}

void baton__peer_demand(baton__peer_t *p)
{
    if (baton_peer_health_demand(&p->health, baton_now_ms()) & BATON_PEER_ACT_CONNECT)
        start_connect(p);
}

void baton__peer_on_up(baton__peer_t *p, baton__conn_t *c)
{
    baton_xfer_engine_t *eng = p->eng;
    uint32_t before = p->health.reconnects;
    baton_peer_health_up(&p->health, baton_now_ms());
    if (p->health.reconnects != before)
        atomic_fetch_add(&eng->st_reconnects, 1);
    int changed = p->remote_inc != 0 && p->remote_inc != c->remote_inc;
    snprintf(p->remote_id, sizeof(p->remote_id), "%s", c->remote_id);
    p->remote_inc = c->remote_inc;
    p->transport = eng->tp_ids[c->tp_index];
    c->reported_up = 1;
    log_info(BATON__LOG,
             "peer_up role=decode peer=%s id=%s incarnation=%016" PRIx64 " transport=%s "
             "reconnects=%" PRIu32 "%s",
             p->endpoint, p->remote_id, p->remote_inc, baton_xfer_transport_name(p->transport),
             p->health.reconnects, changed ? " restarted=1" : "");
    post_state(p, BATON_XFER_PEER_UP, 0);
    while (!baton_list_empty(&p->queued)) {
        baton__droom_t *dr = container_of(p->queued.next, baton__droom_t, link);
        baton_list_remove(&dr->link);
        baton__droom_send(c, dr);
    }
}

void baton__peer_on_conn_failed(baton__peer_t *p, baton__conn_t *c, int status, const char *why)
{
    if (p->conn != c)
        return;
    p->conn = NULL;
    c->peer = NULL;
    if (p->eng->shutting_down) {
        fail_queued(p, BATON_ESHUTDOWN);
        return;
    }
    attempt_failed(p, status, why);
}

void baton__peer_tick(baton__peer_t *p, uint64_t now)
{
    unsigned act = baton_peer_health_tick(&p->health, now);
    if (act & BATON_PEER_ACT_TIMEOUT) {
        if (p->conn != NULL) {
            baton__conn_fail(p->conn, BATON_ETIMEOUT_CONNECT, "connect/handshake timed out");
        } else if (p->resolving) {
            uv_cancel((uv_req_t *)&p->gai);
            attempt_failed(p, BATON_ETIMEOUT_CONNECT, "name resolution timed out");
        } else {
            attempt_failed(p, BATON_ETIMEOUT_CONNECT, "connect timed out");
        }
    }
    if (act & BATON_PEER_ACT_CONNECT)
        start_connect(p);
}

/* Closes p's connection (its rooms, if any, fail with `status`) and unlists p. */
static void peer_release(baton__peer_t *p, int status, const char *why)
{
    fail_queued(p, status);
    if (p->conn != NULL) {
        baton__conn_t *c = p->conn;
        p->conn = NULL;
        c->peer = NULL;
        baton__conn_fail(c, status, why);
    }
    baton_list_remove(&p->link);
    atomic_fetch_sub(&p->eng->st_peers, 1);
}

/* No room waits for p or travels on its connection, and no name lookup is under way. */
static int peer_unused(const baton__peer_t *p)
{
    return baton_list_empty(&p->queued) && !p->resolving &&
           (p->conn == NULL || p->conn->rooms.count == 0);
}

int baton__peer_forget_due(baton__peer_t *p)
{
    if (!p->forget || !peer_unused(p))
        return 0;
    baton_xfer_engine_t *eng = p->eng;
    log_debug(BATON__LOG, "peer_forgotten peer=%s id=%s", p->endpoint, p->remote_id);
    peer_release(p, BATON_ECANCELED, "peer forgotten");
    atomic_fetch_add(&eng->st_peers_forgotten, 1);
    free(p);
    return 1;
}

void baton__peer_forget(baton__peer_t *p)
{
    p->forget = 1;
    (void)baton__peer_forget_due(p);
}

void baton__peer_free(baton__peer_t *p)
{
    baton_xfer_engine_t *eng = p->eng;
    peer_release(p, BATON_ESHUTDOWN, "engine shutdown");
    if (p->resolving) {
        /* on_resolved still has to run; it frees the peer. Keep it listed so shutdown waits. */
        uv_cancel((uv_req_t *)&p->gai);
        baton_list_push(&eng->peers, &p->link);
        p->health.state = BATON_PEER_IDLE;
        return;
    }
    free(p);
}
