/* transfer/room_decode.c — decode-side rooms: OFFER, DONE, ABORT / ABORT_ACK, room timeouts, the
 * puller's RDMA READs of a GRANT, and the receiver's bounds check for transports that place bytes
 * themselves (tcp). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

#define B(s) BATON_PHASE_BIT(s)
static const uint32_t droom_legal[BATON__DR_N_STATES] = {
    [BATON__DR_NEW] = B(BATON__DR_QUEUED) | B(BATON__DR_SENT),
    [BATON__DR_QUEUED] = B(BATON__DR_SENT),
    [BATON__DR_SENT] = B(BATON__DR_ABORTING) | B(BATON__DR_READING) | B(BATON__DR_FAILING),
    /* A READ that cannot start leaves the room offered, as before the GRANT. */
    [BATON__DR_READING] = B(BATON__DR_SENT) | B(BATON__DR_FAILING),
};
#undef B
static const char *const droom_names[BATON__DR_N_STATES] = {
    [BATON__DR_NEW] = "new",         [BATON__DR_QUEUED] = "queued",
    [BATON__DR_SENT] = "sent",       [BATON__DR_ABORTING] = "aborting",
    [BATON__DR_FAILING] = "failing", [BATON__DR_READING] = "reading",
};
const baton_phase_table_t baton__droom_phases = {BATON__LOG, "droom", BATON__DR_N_STATES,
                                                 droom_legal, droom_names};

void baton__droom_finish(baton__droom_t *dr, int status)
{
    baton_xfer_engine_t *eng = dr->eng;
    baton_u64map_del(&eng->drooms, dr->room_id);
    if (dr->conn != NULL) {
        baton_u64map_del(&dr->conn->rooms, dr->room_id);
        dr->conn = NULL;
    }
    dr->status = status;
    if (status == 0) {
        atomic_fetch_add(&eng->st_rooms_done, 1);
        atomic_fetch_add(&eng->st_bytes_received, dr->total_bytes);
    } else {
        atomic_fetch_add(&eng->st_rooms_failed, 1);
        if (status == BATON_EABORTED || status == BATON_ETIMEOUT)
            atomic_fetch_add(&eng->st_rooms_aborted, 1);
        log_debug(BATON__LOG, "room_failed role=decode room=%" PRIu64 " err=%s", dr->room_id,
                  baton_err_name(status));
    }
    baton__ev_post(eng, &dr->ev);
}

void baton__droom_submit(baton_xfer_engine_t *eng, baton__droom_t *dr)
{
    dr->t_offer_ms = baton_now_ms();
    if (baton_u64map_put(&eng->drooms, dr->room_id, dr) != 0) {
        baton__droom_finish(dr, BATON_ENOMEM);
        return;
    }
    if (eng->shutting_down) {
        baton__droom_finish(dr, BATON_ESHUTDOWN);
        return;
    }
    baton__peer_t *p = baton__peer_get(eng, dr->host, dr->port, 1);
    if (p == NULL) {
        baton__droom_finish(dr, BATON_ENOMEM);
        return;
    }
    dr->peer = p;
    p->forget = 0; /* wanted again */
    baton__peer_demand(p);
    if (p->conn != NULL && p->conn->state == BATON__CONN_UP) {
        baton__droom_send(p->conn, dr);
    } else if (p->health.state == BATON_PEER_CONNECTING) {
        (void)BATON__DR_MOVE(dr, BATON__DR_QUEUED);
        baton_list_push(&p->queued, &dr->link);
    } else {
        /* Down and waiting for its back-off: fail fast so the caller can pick another pair. */
        baton__droom_finish(dr, BATON_EPEERDOWN);
    }
}

void baton__droom_send(baton__conn_t *c, baton__droom_t *dr)
{
    baton_xfer_engine_t *eng = c->eng;
    int idx = c->tp_index;
    const baton__tp_caps_t *caps = &eng->caps[idx];
    int rc = 0;
    if (caps->needs_shm && !dr->shm_ok)
        rc = BATON_ENOTSUP; /* pages not in memfd memory cannot be reached over shm */
    if (dr->cuda && !caps->cuda_remote)
        rc = BATON_ENOTSUP;
    for (size_t i = 0; rc == 0 && i < dr->n_mems; i++)
        if (dr->mems[i]->mr[idx] == NULL)
            rc = BATON_ENOTSUP;
    if (rc != 0) {
        log_warn(BATON__LOG,
                 "room_refused room=%" PRIu64 " peer=%s transport=%s "
                 "reason=pages_not_reachable_by_transport",
                 dr->room_id, c->addr, baton_xfer_transport_name(eng->tp_ids[idx]));
        baton__droom_finish(dr, rc);
        return;
    }
    if (dr->first_page != 0 && c->remote_proto < BATON__PROTO_FIRST_PAGE) {
        /* an older prefill would refuse the OFFER's length and drop the whole connection */
        log_warn(BATON__LOG,
                 "room_refused room=%" PRIu64 " peer=%s reason=peer_cannot_skip_cached_pages",
                 dr->room_id, c->addr);
        baton__droom_finish(dr, BATON_ENOTSUP);
        return;
    }
    baton__offer_page_t *pages = malloc((size_t)dr->n_pages * sizeof(*pages));
    if (pages == NULL) {
        baton__droom_finish(dr, BATON_ENOMEM);
        return;
    }
    for (uint32_t i = 0; i < dr->n_pages; i++) {
        pages[i].addr = dr->pages[i].addr;
        pages[i].len = (uint32_t)dr->pages[i].len;
        pages[i].mem_id = dr->pages[i].mem_id;
    }
    baton_buf_t b = BATON_BUF_INIT;
    rc = baton__enc_offer_from(&b, dr->room_id, eng->incarnation, dr->n_layers,
                               dr->first_page + dr->ppl, dr->first_page, pages);
    free(pages);
    if (rc == 0)
        rc = baton_u64map_put(&c->rooms, dr->room_id, dr);
    if (rc != 0) {
        baton_buf_free(&b);
        baton__droom_finish(dr, rc);
        return;
    }
    dr->conn = c;
    (void)BATON__DR_MOVE(dr, BATON__DR_SENT);
    baton__conn_send(c, &b);
    baton_buf_free(&b);
}

void baton__droom_abort(baton_xfer_engine_t *eng, uint64_t room_id, int status)
{
    baton__droom_t *dr = baton_u64map_get(&eng->drooms, room_id);
    if (dr == NULL)
        return; /* already finished: its completion is on its way */
    switch (dr->state) {
    case BATON__DR_QUEUED:
        baton_list_remove(&dr->link);
        baton__droom_finish(dr, status); /* never offered: nothing can land */
        break;
    case BATON__DR_SENT: {
        (void)BATON__DR_MOVE(dr, BATON__DR_ABORTING);
        dr->abort_status = status;
        baton_buf_t b = BATON_BUF_INIT;
        if (baton__enc_abort(&b, room_id, status) == 0)
            baton__conn_send(dr->conn, &b);
        else
            baton__conn_fail(dr->conn, BATON_ENOMEM, "cannot encode ABORT");
        baton_buf_free(&b);
        break;
    }
    case BATON__DR_READING:
        /* Our own READs are landing in the pages: they cannot be recalled one by one, so the
         * room ends when they do (bounded: they complete, or the connection fails and is
         * fenced), with this status, and the holder hears READ_DONE with it. */
        if (dr->read_abort == 0)
            dr->read_abort = status;
        break;
    default:
        break; /* aborting or failing already: it completes after its fence */
    }
}

/* ---- pull by RDMA READ (the puller's side) ------------------------------------------------ */

static void send_read_done(baton__conn_t *c, uint64_t room_id, int status)
{
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_read_done(&b, room_id, status) == 0)
        baton__conn_send(c, &b);
    else
        baton__conn_fail(c, BATON_ENOMEM, "cannot encode READ_DONE");
    baton_buf_free(&b);
}

static void on_tp_read(baton__tp_write_t *w, int status)
{
    baton__droom_t *dr = w->data;
    if (dr->state != BATON__DR_READING)
        return; /* the connection failed: the room completes after its fence */
    if (status != 0) {
        /* The transport failed the connection (a READ completed in error: the peer is told
         * through peer_failed); the room completes after the fence, like a write's. */
        (void)BATON__DR_MOVE(dr, BATON__DR_FAILING);
        return;
    }
    /* Every READ completed: the bytes are in place and nothing more lands in the pages. */
    int st = dr->read_abort;
    send_read_done(dr->conn, dr->room_id, st);
    baton__droom_finish(dr, st);
}

/* The holder's answer to our pull on rdma: its source pages (same shape as ours) and DONE's
 * fields. The READs go over this connection's QPs only: keys from another connection (a stale
 * incarnation) are unknown to its transport and refused there. */
int baton__droom_on_grant(baton__conn_t *c, const baton__grant_t *g)
{
    baton_xfer_engine_t *eng = c->eng;
    baton__droom_t *dr = baton_u64map_get(&c->rooms, g->done.room);
    if (dr == NULL || dr->state != BATON__DR_SENT) {
        /* Aborted before the grant arrived (our ABORT crossed it): we read nothing, and the
         * holder answers that ABORT with ABORT_ACK. */
        log_debug(BATON__LOG, "stale_grant_ignored room=%" PRIu64, g->done.room);
        return 0;
    }
    int rc = 0;
    if (g->n_pages != dr->n_pages)
        rc = BATON_EPROTO;
    baton__tp_sge_t *sg = rc ? NULL : calloc(dr->n_pages, sizeof(*sg));
    if (rc == 0 && sg == NULL)
        rc = BATON_ENOMEM;
    for (uint32_t i = 0; rc == 0 && i < dr->n_pages; i++) {
        baton__offer_page_t src;
        baton__grant_page(g, i, &src);
        const baton__dpage_t *pg = &dr->pages[i];
        baton_xfer_mem_t *mem = NULL;
        for (size_t k = 0; k < dr->n_mems && mem == NULL; k++)
            if (dr->mems[k]->id == pg->mem_id)
                mem = dr->mems[k];
        if (src.len != pg->len || mem == NULL || mem->mr[c->tp_index] == NULL) {
            rc = BATON_EPROTO;
            break;
        }
        sg[i].src = (const void *)(uintptr_t)pg->addr; /* local: where the bytes land */
        sg[i].src_mr = mem->mr[c->tp_index];
        sg[i].dst = src.addr; /* remote: the holder's source page */
        sg[i].dst_mem = src.mem_id;
        sg[i].dst_page = i;
        sg[i].len = pg->len;
    }
    if (rc == 0) {
        dr->rd_sges = sg;
        dr->rd.room_id = dr->room_id;
        dr->rd.sges = sg;
        dr->rd.n_sges = dr->n_pages;
        dr->rd.cb = on_tp_read;
        dr->rd.data = dr;
        dr->done.status = g->done.status;
        dr->done.first_token = g->done.first_token;
        dr->done.len = g->done.payload_len;
        memcpy(dr->done.payload, g->done.payload, g->done.payload_len);
        (void)BATON__DR_MOVE(dr, BATON__DR_READING);
        rc = c->tp_peer->tp->ops->read(c->tp_peer, &dr->rd);
        if (rc != 0)
            (void)BATON__DR_MOVE(dr, BATON__DR_SENT);
    } else {
        free(sg);
    }
    if (rc != 0) {
        /* Nothing was posted: the pages are untouched. Tell the holder (it releases the
         * export with that error) and end the room. */
        log_warn(BATON__LOG, "grant_refused room=%" PRIu64 " peer=%s err=%s", dr->room_id, c->addr,
                 baton_err_name(rc));
        atomic_fetch_add(&eng->st_writes_rejected, 1);
        send_read_done(c, dr->room_id, rc);
        baton__droom_finish(dr, rc);
    }
    return 0;
}

int baton__droom_on_done(baton__conn_t *c, const baton__done_t *d)
{
    baton__droom_t *dr = baton_u64map_get(&c->rooms, d->room);
    if (dr == NULL) {
        log_debug(BATON__LOG, "stale_done_ignored room=%" PRIu64, d->room);
        return 0;
    }
    if (dr->state == BATON__DR_READING)
        return BATON_EPROTO; /* a granted room ends with our READ_DONE, never with DONE */
    if (dr->state == BATON__DR_ABORTING) {
        /* DONE was on its way before our ABORT; it proves the writes are over. */
        baton__droom_finish(dr, dr->abort_status);
        return 0;
    }
    dr->done.status = d->status;
    dr->done.first_token = d->first_token;
    dr->done.len = d->payload_len;
    memcpy(dr->done.payload, d->payload, d->payload_len);
    baton__droom_finish(dr, 0);
    return 0;
}

int baton__droom_on_layer_done(baton__conn_t *c, uint64_t room_id, uint32_t layer)
{
    baton__droom_t *dr = baton_u64map_get(&c->rooms, room_id);
    if (dr == NULL) {
        /* Like DONE: the room may have ended here (abort, timeout) while the frame was sent. */
        log_debug(BATON__LOG, "stale_layer_done_ignored room=%" PRIu64 " layer=%" PRIu32, room_id,
                  layer);
        return 0;
    }
    /* The prefill side reports each layer of a room it knows at most once, and only a layer
     * the OFFER had: anything else is a broken peer (the connection closes, as for a
     * duplicate OFFER). */
    if (layer >= dr->n_layers || dr->layer_seen[layer])
        return BATON_EPROTO;
    dr->layer_seen[layer] = 1;
    if (dr->state != BATON__DR_SENT || dr->layer_cb == NULL)
        return 0; /* aborting: the room is over for the caller */
    baton__ev_post(c->eng, &dr->layer_evs[layer]);
    return 0;
}

int baton__droom_on_abort(baton__conn_t *c, uint64_t room_id, int reason)
{
    baton__droom_t *dr = baton_u64map_get(&c->rooms, room_id);
    if (dr != NULL && dr->state == BATON__DR_READING)
        return BATON_EPROTO; /* our READs are in flight: only the fence may end the room now */
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_abort_ack(&b, room_id) == 0)
        baton__conn_send(c, &b);
    baton_buf_free(&b);
    if (dr == NULL)
        return 0;
    /* The prefill side sends ABORT only once none of its writes for the room is in flight. */
    log_debug(BATON__LOG, "room_aborted_by_peer room=%" PRIu64 " reason=%s", room_id,
              baton_err_name(reason));
    int status = BATON_EABORTED;
    if (dr->state == BATON__DR_ABORTING)
        status = dr->abort_status;
    else if (reason == BATON_ERKEY || reason == BATON_ESTALE || reason == BATON_ENOMEM)
        status = reason; /* the prefill side refused the offer itself: say why */
    baton__droom_finish(dr, status);
    return 0;
}

int baton__droom_on_abort_ack(baton__conn_t *c, uint64_t room_id)
{
    baton__droom_t *dr = baton_u64map_get(&c->rooms, room_id);
    if (dr == NULL || dr->state != BATON__DR_ABORTING) {
        log_debug(BATON__LOG, "stale_abort_ack_ignored room=%" PRIu64, room_id);
        return 0;
    }
    baton__droom_finish(dr, dr->abort_status);
    return 0;
}

void baton__droom_tick(baton_xfer_engine_t *eng, uint64_t now)
{
    uint32_t limit = eng->cfg.room_timeout_ms;
    if (limit == 0 || eng->drooms.count == 0)
        return;
    size_t it = 0;
    baton__droom_t *dr;
    while ((dr = baton_u64map_next(&eng->drooms, &it, NULL)) != NULL) {
        /* a pull whose READs are posted records the timeout and ends when they do */
        if ((dr->state == BATON__DR_SENT || dr->state == BATON__DR_QUEUED ||
             (dr->state == BATON__DR_READING && dr->read_abort == 0)) &&
            now - dr->t_offer_ms > limit) {
            log_warn(BATON__LOG, "room_timeout room=%" PRIu64 " after_ms=%" PRIu64, dr->room_id,
                     now - dr->t_offer_ms);
            baton__droom_abort(eng, dr->room_id, BATON_ETIMEOUT);
        }
    }
}

int baton__resolve_dst(baton__tp_peer_t *tpp, uint64_t room_id, uint32_t page, uint64_t addr,
                       uint64_t len, void **dst_p, baton_xfer_mem_kind_t *kind_p)
{
    baton__conn_t *c = tpp->ctx;
    if (c == NULL || c->state == BATON__CONN_CLOSING || c->tp_peer != tpp)
        return BATON_ENOTFOUND;
    baton__droom_t *dr = baton_u64map_get(&c->rooms, room_id);
    if (dr == NULL)
        return BATON_ENOTFOUND;
    if (dr->state != BATON__DR_SENT)
        return BATON_EABORTED; /* after ABORT nothing more is placed in its pages */
    if (page >= dr->n_pages || len == 0)
        goto reject;
    const baton__dpage_t *pg = &dr->pages[page];
    if (addr < pg->addr || len > pg->len || addr - pg->addr > pg->len - len)
        goto reject;
    *dst_p = (void *)(uintptr_t)addr;
    *kind_p = pg->kind;
    return 0;
reject:
    atomic_fetch_add(&c->eng->st_writes_rejected, 1);
    log_warn(BATON__LOG,
             "write_rejected peer=%s room=%" PRIu64 " page=%" PRIu32 " addr=0x%" PRIx64
             " len=%" PRIu64 " reason=outside_offered_page",
             c->addr, room_id, page, addr, len);
    return BATON_ERKEY;
}

void baton__placed(baton__tp_peer_t *tpp, uint64_t room_id, uint64_t len)
{
    (void)tpp;
    (void)room_id;
    (void)len;
}
