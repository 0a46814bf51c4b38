/* transfer/ctrl_handshake.c — HELLO both ways (transport choice in the decode side's order, after
 * ctrl_auth.c's challenge-response when a secret is set), region announcements (MEM / MEM_DEL)
 * and the hand-over of data lanes to their transport. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

static void set_remote_addr(baton__conn_t *c, baton__tp_peer_t *tpp)
{
    int len = sizeof(tpp->remote_addr);
    memset(&tpp->remote_addr, 0, sizeof(tpp->remote_addr));
    if (c->tcp != NULL)
        uv_tcp_getpeername(c->tcp, (struct sockaddr *)&tpp->remote_addr, &len);
}

static void fill_hello(baton__conn_t *c, baton__hello_t *h, int role)
{
    memset(h, 0, sizeof(*h));
    h->proto = BATON__PROTO_VERSION;
    h->role = (uint8_t)role;
    snprintf(h->engine_id, sizeof(h->engine_id), "%s", c->eng->engine_id);
    h->incarnation = c->eng->incarnation;
    h->generation = c->gen;
    h->heartbeat_ms = c->eng->cfg.heartbeat_interval_ms;
}

/* A transport peer that was connected (or tried) but is not going to be used: fence it, then
 * destroy it. Tracked so shutdown waits for it. */
static void retired_fenced(baton__tp_peer_t *tpp, int status, void *arg)
{
    baton_xfer_engine_t *eng = arg;
    tpp->tp->ops->peer_destroy(tpp);
    eng->retiring--;
    baton__maybe_finish_shutdown(eng);
}

static void retire_tp(baton_xfer_engine_t *eng, baton__tp_peer_t *tpp)
{
    tpp->ctx = NULL;
    eng->retiring++;
    if (tpp->tp->ops->peer_fence(tpp, retired_fenced, eng) != 0) {
        tpp->tp->ops->peer_destroy(tpp);
        eng->retiring--;
    }
}

static void mark_up(baton__conn_t *c)
{
    baton_xfer_engine_t *eng = c->eng;
    (void)BATON__CONN_MOVE(c, BATON__CONN_UP);
    baton__admit_release(c); /* authenticated and through the handshake: no longer pending */
    uint64_t now = baton_now_ms();
    baton_heartbeat_init(&c->hb, eng->cfg.heartbeat_interval_ms, eng->cfg.heartbeat_misses, now);
    atomic_fetch_add(&eng->st_peers_up, 1);
}

/* ---- decode side ------------------------------------------------------------------------- */

void baton__hs_decode_start(baton__conn_t *c)
{
    if (c->eng->secret_len > 0)
        baton__auth_decode_start(c); /* HELLO once the prefill side proved the secret */
    else
        baton__hs_decode_hello(c);
}

void baton__hs_decode_hello(baton__conn_t *c)
{
    baton_xfer_engine_t *eng = c->eng;
    baton__hello_t h;
    fill_hello(c, &h, BATON__ROLE_DECODE);
    uint8_t(*blobs)[BATON__TP_BLOB_MAX] = eng->hs_blobs;
    for (int i = 0; i < eng->n_tp; i++) {
        baton__tp_t *tp = eng->tp[i];
        baton__tp_peer_t *tpp = NULL;
        int rc = tp->ops->peer_create(tp, BATON__TP_ROLE_TARGET, c->gen, &tpp);
        if (rc != 0) {
            log_warn(BATON__LOG, "transport_peer_failed transport=%s peer=%s err=%s", tp->ops->name,
                     c->addr, baton_err_name(rc));
            continue;
        }
        tpp->tp = tp;
        tpp->role = BATON__TP_ROLE_TARGET;
        tpp->generation = c->gen;
        tpp->ctx = c;
        set_remote_addr(c, tpp);
        size_t len = 0;
        rc = tp->ops->peer_info(tpp, blobs[i], BATON__TP_BLOB_MAX, &len);
        if (rc != 0 || len > BATON__TP_BLOB_MAX) {
            log_warn(BATON__LOG, "transport_info_failed transport=%s err=%s", tp->ops->name,
                     baton_err_name(rc));
            tp->ops->peer_destroy(tpp);
            continue;
        }
        c->cand[i] = tpp;
        h.tp[h.n_tp].id = (uint8_t)eng->tp_ids[i];
        h.tp[h.n_tp].len = (uint16_t)len;
        h.tp[h.n_tp].blob = blobs[i];
        h.n_tp++;
    }
    if (h.n_tp == 0) {
        baton__conn_fail(c, BATON_ENODEV, "no transport could prepare a connection");
        return;
    }
    baton_buf_t b = BATON_BUF_INIT;
    int rc = baton__enc_hello(&b, &h);
    if (rc != 0) {
        baton_buf_free(&b);
        baton__conn_fail(c, rc, "cannot encode HELLO");
        return;
    }
    (void)BATON__CONN_MOVE(c, BATON__CONN_HELLO);
    baton__conn_send(c, &b);
    baton_buf_free(&b);
}

static void on_decode_tp_connected(baton__tp_peer_t *tpp, int status, void *arg)
{
    baton__conn_t *c = arg;
    if (c->state != BATON__CONN_TP_CONNECT || c->tp_peer != tpp)
        return; /* the connection failed meanwhile; its fence takes care of tpp */
    if (status != 0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%s transport connect failed: %s", tpp->tp->ops->name,
                 baton_strerror(status));
        baton__conn_fail(c, status, msg);
        return;
    }
    /* Regions go first: the control channel is ordered, so every OFFER after this point finds
     * its regions announced on the other side. */
    baton_xfer_engine_t *eng = c->eng;
    for (baton_list_t *it = eng->lmems.next; it != &eng->lmems; it = it->next)
        baton__hs_announce_mem(c, container_of(it, baton__lmem_t, link));
    mark_up(c);
    baton__peer_on_up(c->peer, c);
}

static int decode_on_hello(baton__conn_t *c, const baton__hello_t *h)
{
    baton_xfer_engine_t *eng = c->eng;
    if (h->role != BATON__ROLE_PREFILL)
        return BATON_EPROTO;
    if (h->echo_generation != c->gen) {
        log_warn(BATON__LOG, "stale_hello_ignored peer=%s echo=%016" PRIx64 " gen=%016" PRIx64,
                 c->addr, h->echo_generation, c->gen);
        return 0;
    }
    if (h->status < 0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "peer refused the handshake: %s", baton_strerror(h->status));
        baton__conn_fail(c, h->status, msg);
        return 0;
    }
    if (h->n_tp != 1)
        return BATON_EPROTO;
    int idx = baton__tp_index(eng, (baton_xfer_transport_t)h->tp[0].id);
    if (idx < 0 || c->cand[idx] == NULL)
        return BATON_EPROTO; /* it chose a transport we did not offer */
    snprintf(c->remote_id, sizeof(c->remote_id), "%s", h->engine_id);
    c->remote_inc = h->incarnation;
    c->remote_gen = h->generation;
    c->remote_proto = h->proto;
    c->tp_peer = c->cand[idx];
    c->cand[idx] = NULL;
    c->tp_index = idx;
    for (int i = 0; i < BATON__MAX_TP; i++) {
        if (c->cand[i] != NULL) {
            c->cand[i]->tp->ops->peer_destroy(c->cand[i]);
            c->cand[i] = NULL;
        }
    }
    (void)BATON__CONN_MOVE(c, BATON__CONN_TP_CONNECT);
    int rc = c->tp_peer->tp->ops->peer_connect(c->tp_peer, h->tp[0].blob, h->tp[0].len,
                                               on_decode_tp_connected, c);
    if (rc != 0) {
        char msg[128];
        snprintf(msg, sizeof(msg), "%s transport refused the peer: %s", c->tp_peer->tp->ops->name,
                 baton_strerror(rc));
        baton__conn_fail(c, rc, msg);
    }
    return 0;
}

/* ---- prefill side ------------------------------------------------------------------------ */

static void prefill_try_next(baton__conn_t *c);

static void refuse(baton__conn_t *c, int status)
{
    baton__hello_t h;
    fill_hello(c, &h, BATON__ROLE_PREFILL);
    h.echo_generation = c->remote_gen;
    h.status = status;
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_hello(&b, &h) == 0) {
        c->close_after_send = 1;
        baton__conn_send(c, &b);
    } else {
        baton__conn_fail(c, status, "handshake refused");
    }
    baton_buf_free(&b);
}

static void on_prefill_tp_connected(baton__tp_peer_t *tpp, int status, void *arg)
{
    baton__conn_t *c = arg;
    if (c->state != BATON__CONN_TP_CONNECT || c->tp_peer != tpp)
        return;
    baton_xfer_engine_t *eng = c->eng;
    if (status != 0) {
        log_warn(BATON__LOG, "transport_refused transport=%s peer=%s err=%s fallback=next",
                 tpp->tp->ops->name, c->addr, baton_err_name(status));
        c->tp_peer = NULL;
        c->tp_index = -1;
        retire_tp(eng, tpp);
        prefill_try_next(c);
        return;
    }
    uint8_t *blob = eng->hs_blobs[0];
    size_t len = 0;
    int rc = tpp->tp->ops->peer_info(tpp, blob, BATON__TP_BLOB_MAX, &len);
    if (rc != 0 || len > BATON__TP_BLOB_MAX) {
        baton__conn_fail(c, rc ? rc : BATON_EPROTO, "transport info failed");
        return;
    }
    baton__hello_t h;
    fill_hello(c, &h, BATON__ROLE_PREFILL);
    h.echo_generation = c->remote_gen;
    h.n_tp = 1;
    h.tp[0].id = (uint8_t)tpp->tp->id;
    h.tp[0].len = (uint16_t)len;
    h.tp[0].blob = blob;
    baton_buf_t b = BATON_BUF_INIT;
    rc = baton__enc_hello(&b, &h);
    if (rc != 0) {
        baton_buf_free(&b);
        baton__conn_fail(c, rc, "cannot encode HELLO");
        return;
    }
    baton__conn_send(c, &b);
    baton_buf_free(&b);
    if (c->state == BATON__CONN_CLOSING)
        return;
    mark_up(c);
    c->reported_up = 1;
    log_info(BATON__LOG,
             "peer_up role=prefill peer=%s id=%s incarnation=%016" PRIx64 " transport=%s", c->addr,
             c->remote_id, c->remote_inc, tpp->tp->ops->name);
    baton__post_peer_event(eng, c->addr, c->remote_id, c->remote_inc, BATON_XFER_PEER_UP,
                           tpp->tp->id, 0, 0);
}

static void prefill_try_next(baton__conn_t *c)
{
    baton_xfer_engine_t *eng = c->eng;
    const baton__hello_t *h = c->peer_hello;
    while (c->prefill_try < h->n_tp) {
        const baton__hello_tp_t *t = &h->tp[c->prefill_try++];
        int idx = baton__tp_index(eng, (baton_xfer_transport_t)t->id);
        if (idx < 0)
            continue;
        baton__tp_t *tp = eng->tp[idx];
        baton__tp_peer_t *tpp = NULL;
        int rc = tp->ops->peer_create(tp, BATON__TP_ROLE_INITIATOR, c->gen, &tpp);
        if (rc != 0) {
            log_warn(BATON__LOG, "transport_peer_failed transport=%s peer=%s err=%s", tp->ops->name,
                     c->addr, baton_err_name(rc));
            continue;
        }
        tpp->tp = tp;
        tpp->role = BATON__TP_ROLE_INITIATOR;
        tpp->generation = c->gen;
        tpp->ctx = c;
        set_remote_addr(c, tpp);
        c->tp_peer = tpp;
        c->tp_index = idx;
        (void)BATON__CONN_MOVE(c, BATON__CONN_TP_CONNECT);
        rc = tp->ops->peer_connect(tpp, t->blob, t->len, on_prefill_tp_connected, c);
        if (rc == 0)
            return;
        log_info(BATON__LOG, "transport_refused transport=%s peer=%s err=%s fallback=next",
                 tp->ops->name, c->addr, baton_err_name(rc));
        c->tp_peer = NULL;
        c->tp_index = -1;
        tp->ops->peer_destroy(tpp);
    }
    log_warn(BATON__LOG, "handshake_refused peer=%s id=%s reason=no_common_transport", c->addr,
             c->remote_id);
    refuse(c, BATON_ENOTSUP);
}

static int prefill_on_hello(baton__conn_t *c, const baton__hello_t *h)
{
    baton_xfer_engine_t *eng = c->eng;
    if (h->role != BATON__ROLE_DECODE || h->echo_generation != 0 || h->status != 0)
        return BATON_EPROTO;
    snprintf(c->remote_id, sizeof(c->remote_id), "%s", h->engine_id);
    c->remote_inc = h->incarnation;
    c->remote_gen = h->generation;
    c->remote_proto = h->proto;
    /* A restarted decode engine (same id, new incarnation): everything of the old one is
     * retired now rather than when its heartbeats run out. */
    for (baton_list_t *it = eng->conns.next; it != &eng->conns;) {
        baton__conn_t *o = container_of(it, baton__conn_t, link);
        it = it->next;
        if (o != c && o->role == BATON__ROLE_PREFILL && o->state != BATON__CONN_CLOSING &&
            strcmp(o->remote_id, c->remote_id) == 0 && o->remote_inc != c->remote_inc)
            baton__conn_fail(o, BATON_EPEERDOWN, "peer restarted (new incarnation)");
    }
    /* The blobs point into the read buffer: keep a copy while transports are tried. */
    size_t total = 0;
    for (int i = 0; i < h->n_tp; i++)
        total += h->tp[i].len;
    c->peer_hello = malloc(sizeof(*h));
    c->peer_hello_buf = malloc(total ? total : 1);
    if (c->peer_hello == NULL || c->peer_hello_buf == NULL)
        return BATON_ENOMEM;
    *c->peer_hello = *h;
    size_t off = 0;
    for (int i = 0; i < h->n_tp; i++) {
        memcpy(c->peer_hello_buf + off, h->tp[i].blob, h->tp[i].len);
        c->peer_hello->tp[i].blob = c->peer_hello_buf + off;
        off += h->tp[i].len;
    }
    (void)BATON__CONN_MOVE(c, BATON__CONN_HELLO);
    c->prefill_try = 0;
    prefill_try_next(c);
    return 0;
}

int baton__hs_on_hello(baton__conn_t *c, const baton__hello_t *h)
{
    if (!baton__auth_check_hello(c, h))
        return 0; /* refused and closed before anything of it was used */
    if (c->role == BATON__ROLE_DECODE)
        return decode_on_hello(c, h);
    return prefill_on_hello(c, h);
}

/* ---- lanes ------------------------------------------------------------------------------- */

int baton__hs_on_lane_hello(baton__conn_t *c, const baton__frame_t *f, const uint8_t *rest,
                            size_t rest_len)
{
    baton_xfer_engine_t *eng = c->eng;
    baton__conn_t *owner = NULL;
    for (baton_list_t *it = eng->conns.next; it != &eng->conns; it = it->next) {
        baton__conn_t *o = container_of(it, baton__conn_t, link);
        if (o->role == BATON__ROLE_PREFILL && o->state == BATON__CONN_UP &&
            o->remote_inc == f->u.lane_hello.incarnation &&
            o->remote_gen == f->u.lane_hello.generation) {
            owner = o;
            break;
        }
    }
    if (owner == NULL || owner->tp_peer == NULL) {
        /* A lane of a connection that is gone or never was: a stale reconnect, not an error of
         * any live peer. */
        baton__conn_fail(c, BATON_ESTALE, "lane for an unknown connection");
        return 0;
    }
    uv_read_stop((uv_stream_t *)c->tcp);
    int rc = owner->tp_peer->tp->ops->adopt_lane(owner->tp_peer, c->tcp, f->u.lane_hello.lane, rest,
                                                 rest_len);
    if (rc != 0) {
        char msg[96];
        snprintf(msg, sizeof(msg), "lane refused: %s", baton_strerror(rc));
        baton__conn_fail(c, rc, msg);
        return 0;
    }
    /* The socket is the transport's now; this pending connection object simply goes away. */
    c->tcp = NULL;
    baton__admit_release(c);
    baton_list_remove(&c->link);
    baton_buf_free(&c->rbuf);
    baton_u64map_free(&c->rooms);
    baton_u64map_free(&c->rmems);
    free(c);
    return 1;
}

/* ---- regions ------------------------------------------------------------------------------ */

void baton__hs_announce_mem(baton__conn_t *c, const baton__lmem_t *m)
{
    int idx = c->tp_index;
    if (idx < 0 || !m->reg[idx])
        return; /* that transport cannot reach it; rooms using it are refused before OFFER */
    if (c->eng->caps[idx].needs_shm && !m->shm_ok)
        return; /* a source-only region for shm (not memfd): the peer could not map it */
    baton__mem_t f = {.mem_id = m->id,
                      .kind = (uint8_t)m->kind,
                      .base = m->base,
                      .len = m->len,
                      .transport = (uint8_t)c->eng->tp_ids[idx],
                      .blob_len = m->blob_len[idx],
                      .blob = m->blob[idx]};
    baton_buf_t b = BATON_BUF_INIT;
    int rc = baton__enc_mem(&b, &f);
    if (rc == 0)
        baton__conn_send(c, &b);
    else
        baton__conn_fail(c, rc, "cannot encode MEM");
    baton_buf_free(&b);
}

int baton__hs_on_mem(baton__conn_t *c, const baton__mem_t *m)
{
    if (c->tp_peer == NULL || m->transport != (uint8_t)c->tp_peer->tp->id)
        return BATON_EPROTO;
    if (baton_u64map_get(&c->rmems, m->mem_id) != NULL)
        return BATON_EPROTO;
    baton__rmem_t *rm = calloc(1, sizeof(*rm));
    if (rm == NULL)
        return BATON_ENOMEM;
    rm->id = m->mem_id;
    rm->base = m->base;
    rm->len = m->len;
    rm->kind = (baton_xfer_mem_kind_t)m->kind;
    int rc = c->tp_peer->tp->ops->mem_add(c->tp_peer, m->mem_id, m->base, m->len, rm->kind, m->blob,
                                          m->blob_len);
    rm->usable = rc == 0;
    if (rc != 0)
        log_info(BATON__LOG, "peer_region_unusable peer=%s mem=%" PRIu32 " err=%s", c->addr,
                 m->mem_id, baton_err_name(rc));
    if (baton_u64map_put(&c->rmems, m->mem_id, rm) != 0) {
        if (rm->usable)
            c->tp_peer->tp->ops->mem_del(c->tp_peer, m->mem_id);
        free(rm);
        return BATON_ENOMEM;
    }
    return 0;
}

int baton__hs_on_mem_del(baton__conn_t *c, uint32_t mem_id)
{
    baton__rmem_t *rm = baton_u64map_del(&c->rmems, mem_id);
    if (rm == NULL)
        return 0;
    if (rm->usable)
        c->tp_peer->tp->ops->mem_del(c->tp_peer, mem_id);
    free(rm);
    return 0;
}
