/* transfer/room_prefill.c — prefill-side rooms: accept an OFFER, run the caller's writes through
 * the transport, and send DONE / ABORT / ABORT_ACK only once no write is in flight. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

#include "transfer/cuda_shim.h"

#define B(s) BATON_PHASE_BIT(s)
#define ENDS (B(BATON__PR_ABORT_PEER) | B(BATON__PR_CLOSED))
static const uint32_t proom_legal[BATON__PR_N_STATES] = {
    [BATON__PR_NEW] = B(BATON__PR_OPEN) | B(BATON__PR_CLOSED),
    [BATON__PR_OPEN] =
        B(BATON__PR_COMPLETING) | B(BATON__PR_ABORT_LOCAL) | B(BATON__PR_GRANTED) | ENDS,
    [BATON__PR_COMPLETING] = B(BATON__PR_ABORT_LOCAL) | ENDS,
    [BATON__PR_ABORT_LOCAL] = ENDS,
    /* The peer may repeat its ABORT: the last reason is the one reported. */
    [BATON__PR_ABORT_PEER] = ENDS,
    [BATON__PR_GRANTED] = ENDS,
};
#undef ENDS
#undef B
static const char *const proom_names[BATON__PR_N_STATES] = {
    [BATON__PR_NEW] = "new",
    [BATON__PR_OPEN] = "open",
    [BATON__PR_COMPLETING] = "completing",
    [BATON__PR_ABORT_LOCAL] = "abort_local",
    [BATON__PR_ABORT_PEER] = "abort_peer",
    [BATON__PR_CLOSED] = "closed",
    [BATON__PR_GRANTED] = "granted",
};
const baton_phase_table_t baton__proom_phases = {BATON__LOG, "proom", BATON__PR_N_STATES,
                                                 proom_legal, proom_names};

static void send_frame_abort(baton__conn_t *c, uint64_t room, int reason)
{
    baton_buf_t b = BATON_BUF_INIT;
    if (baton__enc_abort(&b, room, reason) == 0)
        baton__conn_send(c, &b);
    baton_buf_free(&b);
}

static void fail_cuda_waits(baton_xfer_room_t *room, int status);

static void room_close(baton_xfer_room_t *room, int status)
{
    baton_xfer_engine_t *eng = room->eng;
    fail_cuda_waits(room, status ? status : BATON_ECANCELED);
    (void)BATON__PR_MOVE(room, BATON__PR_CLOSED);
    if (room->conn != NULL) {
        baton_u64map_del(&room->conn->rooms, room->room_id);
        room->conn = NULL;
    }
    if (status == 0) {
        atomic_fetch_add(&eng->st_rooms_done, 1);
    } else {
        atomic_fetch_add(&eng->st_rooms_failed, 1);
        if (status == BATON_EABORTED)
            atomic_fetch_add(&eng->st_rooms_aborted, 1);
    }
    if (!room->served) { /* a served room has no caller side to tell */
        room->ev_closed.status = status;
        baton__ev_post(eng, &room->ev_closed);
    }
    baton__room_unref(room); /* the progress thread's reference */
}

/* Once the room's last write finished: appends the frame it waits to send (DONE, ABORT or
 * ABORT_ACK) to `b` and returns 1 with the status to close it with; 0 while it must wait. The
 * caller sends `b`, then closes the room. */
static int room_end_frame(baton_xfer_room_t *room, baton_buf_t *b, int *status_p)
{
    if (room->inflight > 0 || room->conn == NULL)
        return 0;
    baton__conn_t *c = room->conn;
    int rc;
    switch (room->state) {
    case BATON__PR_COMPLETING:
        rc = baton__enc_done(b, room->room_id, room->done.status, room->done.first_token,
                             room->done.payload, room->done.len);
        *status_p = c->state == BATON__CONN_CLOSING ? c->fail_status : 0;
        break;
    case BATON__PR_ABORT_LOCAL:
        rc = baton__enc_abort(b, room->room_id, room->abort_reason);
        *status_p = BATON_EABORTED;
        break;
    case BATON__PR_ABORT_PEER:
        rc = baton__enc_abort_ack(b, room->room_id);
        *status_p = BATON_EABORTED;
        break;
    default:
        return 0;
    }
    if (rc != 0) {
        /* Without its frame the decode side could only time out: lose the connection instead,
         * which fails the room there at once (and fences its pages). */
        baton__conn_fail(c, BATON_ENOMEM, "cannot encode a room's last frame");
        if (*status_p == 0)
            *status_p = BATON_ENOMEM;
    }
    return 1;
}

/* Sends what the room waits for once its last write finished, and closes it. */
static void room_progress(baton_xfer_room_t *room)
{
    baton_buf_t b = BATON_BUF_INIT;
    int status;
    if (room_end_frame(room, &b, &status)) {
        baton__conn_send(room->conn, &b);
        room_close(room, status);
    }
    baton_buf_free(&b);
}

static void room_progress(baton_xfer_room_t *room);
static void on_tp_write(baton__tp_write_t *w, int status);
static void write_done(baton__wreq_t *wr, int status);

void baton__proom_set_serve(baton_xfer_engine_t *eng, baton_xfer_serve_cb cb, void *data)
{
    eng->serve_cb = cb;
    eng->serve_data = data;
}

/* baton_xfer_engine_serve: answers a one-page room here, on the progress thread. 1 when the
 * room was taken (served or aborted), 0 when it goes to the caller as usual. */
static int serve_offer(baton_xfer_engine_t *eng, baton_xfer_room_t *room)
{
    if (eng->serve_cb == NULL || room->n_layers != 1 || room->ppl != 1 || room->first_page != 0)
        return 0;
    const baton__offer_page_t *pg = &room->pages[0];
    baton_xfer_mem_t *m = NULL;
    uint64_t off = 0;
    int rc = eng->serve_cb(eng->serve_data, room->room_id, pg->len, &m, &off);
    if (rc > 0)
        return 0;
    room->served = 1;
    atomic_store(&room->refs, 1); /* the caller never sees it: only this thread's reference */
    if (rc == 0 && (m == NULL || m->eng != eng || off > m->len || pg->len > m->len - off))
        rc = BATON_ERKEY;
    else if (rc == 0 && m->mr[room->tp_index] == NULL)
        rc = BATON_ENOTSUP;
    baton__wreq_t *wr = NULL;
    if (rc == 0) {
        wr = calloc(1, sizeof(*wr) + sizeof(baton__tp_sge_t));
        if (wr == NULL || (wr->mems = malloc(sizeof(*wr->mems))) == NULL) {
            free(wr);
            rc = BATON_ENOMEM;
        }
    }
    if (rc != 0) {
        baton__proom_abort(eng, room, rc);
        return 1;
    }
    atomic_fetch_add(&m->refs, 1);
    wr->mems[0] = m;
    wr->n_mems = 1;
    wr->room = room;
    wr->layer = UINT32_MAX;
    wr->bytes = pg->len;
    wr->sges[0] = (baton__tp_sge_t){0};
    wr->sges[0].src = (uint8_t *)m->addr + off;
    wr->sges[0].src_mr = m->mr[room->tp_index];
    wr->sges[0].dst = pg->addr;
    wr->sges[0].dst_mem = pg->mem_id;
    wr->sges[0].dst_page = 0;
    wr->sges[0].len = pg->len;
    wr->w.room_id = room->room_id;
    wr->w.sges = wr->sges;
    wr->w.n_sges = 1;
    wr->w.cb = on_tp_write;
    wr->w.data = wr;
    room->written[0] = 1;
    room->done = (baton__done_copy_t){0};
    room->done.first_token = -1;
    /* COMPLETING before the write: a transport that completes it at once sends DONE then */
    (void)BATON__PR_MOVE(room, BATON__PR_COMPLETING);
    room->inflight++;
    rc = room->conn->tp_peer->tp->ops->write(room->conn->tp_peer, &wr->w);
    if (rc != 0) {
        room->inflight--;
        write_done(wr, rc);
        baton__proom_abort(eng, room, rc);
    }
    return 1;
}

int baton__proom_on_offer(baton__conn_t *c, const baton__offer_t *o)
{
    baton_xfer_engine_t *eng = c->eng;
    if (o->incarnation != c->remote_inc) {
        /* Not from the engine that said HELLO here: refuse it rather than leave it waiting. */
        log_warn(BATON__LOG, "stale_offer_refused peer=%s room=%" PRIu64, c->addr, o->room);
        send_frame_abort(c, o->room, BATON_ESTALE);
        return 0;
    }
    if (baton_u64map_get(&c->rooms, o->room) != NULL)
        return BATON_EPROTO; /* the decode side keeps room ids unique while open */
    for (uint32_t i = 0; i < o->n_pages; i++) {
        baton__offer_page_t pg;
        baton__offer_page(o, i, &pg);
        baton__rmem_t *rm = baton_u64map_get(&c->rmems, pg.mem_id);
        if (rm == NULL || !rm->usable || pg.addr < rm->base || pg.len > rm->len ||
            pg.addr - rm->base > rm->len - pg.len) {
            log_warn(BATON__LOG,
                     "offer_refused peer=%s room=%" PRIu64 " page=%" PRIu32 " mem=%" PRIu32
                     " reason=%s",
                     c->addr, o->room, i, pg.mem_id,
                     rm == NULL    ? "unknown_region"
                     : !rm->usable ? "region_unusable"
                                   : "page_outside_region");
            send_frame_abort(c, o->room, BATON_ERKEY);
            return 0;
        }
    }
    baton_xfer_room_t *room = calloc(1, sizeof(*room));
    if (room == NULL)
        goto nomem;
    room->pages = malloc((size_t)o->n_pages * sizeof(*room->pages));
    room->written = calloc(o->n_layers, 1);
    if (room->pages == NULL || room->written == NULL) {
        free(room->pages);
        free(room->written);
        free(room);
        goto nomem;
    }
    for (uint32_t i = 0; i < o->n_pages; i++)
        baton__offer_page(o, i, &room->pages[i]);
    atomic_init(&room->refs, 2); /* progress thread + caller */
    room->eng = eng;
    room->room_id = o->room;
    room->n_layers = o->n_layers;
    room->ppl = o->pages_per_layer - o->first_page; /* decode_offer checked first_page < it */
    room->first_page = o->first_page;
    snprintf(room->peer_id, sizeof(room->peer_id), "%s", c->remote_id);
    room->transport = eng->tp_ids[c->tp_index];
    room->tp_index = c->tp_index;
    room->peer_proto = c->remote_proto;
    room->conn = c;
    (void)BATON__PR_MOVE(room, BATON__PR_OPEN);
    room->ev_room.type = BATON__EV_ROOM;
    room->ev_room.embedded = 1;
    room->ev_room.u.room = room;
    room->ev_closed.type = BATON__EV_ROOM_CLOSED;
    room->ev_closed.embedded = 1;
    room->ev_closed.u.room = room;
    if (baton_u64map_put(&c->rooms, o->room, room) != 0) {
        free(room->pages);
        free(room->written);
        free(room);
        goto nomem;
    }
    if (serve_offer(eng, room))
        return 0;
    baton__ev_post(eng, &room->ev_room);
    return 0;
nomem:
    send_frame_abort(c, o->room, BATON_ENOMEM);
    return 0;
}

int baton__proom_on_abort(baton__conn_t *c, uint64_t room_id, int reason)
{
    baton_xfer_room_t *room = baton_u64map_get(&c->rooms, room_id);
    if (room == NULL) {
        /* Already done or never seen: acknowledge so the decode side can release its pages. */
        baton_buf_t b = BATON_BUF_INIT;
        if (baton__enc_abort_ack(&b, room_id) == 0)
            baton__conn_send(c, &b);
        baton_buf_free(&b);
        return 0;
    }
    (void)BATON__PR_MOVE(room, BATON__PR_ABORT_PEER);
    room->abort_reason = reason;
    room_progress(room);
    return 0;
}

/* ---- pull by RDMA READ (the holder's side) ---------------------------------------------- */

/* Appends a MEM frame for each source region of g the puller has not been told about on this
 * connection (its transport needs the rkeys); the keys die with the connection, and a region
 * deregistered later is withdrawn with MEM_DEL (engine.c). On failure the regions noted here are
 * forgotten again (their frames are not sent): the puller refuses a region announced twice. */
static int enc_source_mems(baton__conn_t *c, const baton__grant_cmd_t *g, baton_buf_t *b)
{
    uint32_t added[64];
    size_t n_added = 0;
    int rc = 0;
    baton_xfer_engine_t *eng = c->eng;
    for (uint32_t i = 0; rc == 0 && i < g->n_pages; i++) {
        uint32_t id = g->pages[i].mem_id;
        if (baton_u64map_get(&c->smems, id) != NULL)
            continue;
        const baton__lmem_t *m = NULL;
        for (baton_list_t *it = eng->lmems.next; it != &eng->lmems && m == NULL; it = it->next) {
            const baton__lmem_t *x = container_of(it, baton__lmem_t, link);
            if (x->id == id)
                m = x;
        }
        if (m == NULL || !m->reg[c->tp_index] || n_added == sizeof(added) / sizeof(added[0])) {
            rc = BATON_EINVAL; /* not registered with this transport (withdrawn), or too many */
            break;
        }
        baton__mem_t f = {m->id,
                          (uint8_t)m->kind,
                          m->base,
                          m->len,
                          (uint8_t)eng->tp_ids[c->tp_index],
                          m->blob_len[c->tp_index],
                          m->blob[c->tp_index]};
        rc = baton__enc_mem(b, &f);
        if (rc == 0)
            rc = baton_u64map_put(&c->smems, id, c);
        if (rc == 0)
            added[n_added++] = id;
    }
    if (rc != 0)
        for (size_t k = 0; k < n_added; k++)
            baton_u64map_del(&c->smems, added[k]);
    return rc;
}

void baton__proom_grant(baton_xfer_engine_t *eng, baton__grant_cmd_t *g)
{
    (void)eng;
    baton_xfer_room_t *room = g->room;
    baton__conn_t *c = room->conn;
    if (room->state == BATON__PR_OPEN && c != NULL && c->state == BATON__CONN_UP) {
        baton_buf_t b = BATON_BUF_INIT;
        int rc = enc_source_mems(c, g, &b);
        if (rc == 0)
            rc = baton__enc_grant(&b, room->room_id, g->done.status, g->done.first_token,
                                  g->done.payload, g->done.len, g->n_pages, g->pages);
        if (rc == 0) {
            room->granted_bytes = 0;
            for (uint32_t i = 0; i < g->n_pages; i++)
                room->granted_bytes += g->pages[i].len;
            /* From here the puller's NIC may read the sources until READ_DONE or the fence. */
            (void)BATON__PR_MOVE(room, BATON__PR_GRANTED);
            baton__conn_send(c, &b);
        } else {
            log_warn(BATON__LOG, "grant_failed room=%" PRIu64 " err=%s", room->room_id,
                     baton_err_name(rc));
            (void)BATON__PR_MOVE(room, BATON__PR_ABORT_LOCAL);
            room->abort_reason = rc;
            room_progress(room);
        }
        baton_buf_free(&b);
    }
    /* else: aborted or closed meanwhile, its closing event says so */
    baton__room_unref(room);
    free(g);
}

int baton__proom_on_read_done(baton__conn_t *c, uint64_t room_id, int status)
{
    baton_xfer_room_t *room = baton_u64map_get(&c->rooms, room_id);
    if (room == NULL || room->state != BATON__PR_GRANTED) {
        log_debug(BATON__LOG, "stale_read_done_ignored room=%" PRIu64, room_id);
        return 0;
    }
    /* The puller's READs are over (it sends READ_DONE only once all completed): the sources
     * are ours again. */
    if (status == 0)
        atomic_fetch_add(&room->eng->st_bytes_written, room->granted_bytes);
    room_close(room, status);
    return 0;
}

static void write_done(baton__wreq_t *wr, int status)
{
    if (wr->room->served) { /* no caller callback: release the source region here */
        for (size_t i = 0; i < wr->n_mems; i++)
            atomic_fetch_sub(&wr->mems[i]->refs, 1);
        free(wr->mems);
        free(wr);
        return;
    }
    wr->ev.status = status;
    baton__ev_post(wr->room->eng, &wr->ev);
}

/* Every write of the layer(s) of wr is acknowledged: appends LAYER_DONE for them to `b` when
 * the decode peer can hear it. The control connection is one ordered stream, so this precedes
 * the room's DONE, which waits for the same acknowledgements and more. 0, or BATON_ENOMEM. */
static int enc_layer_done(const baton_xfer_room_t *room, const baton__wreq_t *wr, baton_buf_t *b)
{
    const baton__conn_t *c = room->conn;
    if (c == NULL || c->state != BATON__CONN_UP || c->remote_proto < BATON__PROTO_LAYER_DONE)
        return 0;
    if (room->state != BATON__PR_OPEN && room->state != BATON__PR_COMPLETING)
        return 0; /* aborting: the decode side drops the room anyway */
    uint32_t first = wr->layer, end = wr->layer + 1;
    if (wr->layer == UINT32_MAX) { /* baton_xfer_write_room */
        first = 0;
        end = room->n_layers;
    }
    int rc = 0;
    for (uint32_t l = first; rc == 0 && l < end; l++)
        rc = baton__enc_layer_done(b, room->room_id, l);
    return rc;
}

static void on_tp_write(baton__tp_write_t *w, int status)
{
    baton__wreq_t *wr = w->data;
    baton_xfer_room_t *room = wr->room;
    baton_buf_t b = BATON_BUF_INIT;
    int end_status = 0;
    room->inflight--;
    if (status != 0 && room->served && room->state == BATON__PR_COMPLETING) {
        /* nobody else can react to the failure: the room must not end with a DONE */
        (void)BATON__PR_MOVE(room, BATON__PR_ABORT_LOCAL);
        room->abort_reason = status;
    }
    if (status == 0) {
        atomic_fetch_add(&room->eng->st_bytes_written, wr->bytes);
        if (enc_layer_done(room, wr, &b) != 0) {
            baton_buf_reset(&b);
            baton__conn_fail(room->conn, BATON_ENOMEM, "cannot encode LAYER_DONE");
        }
    }
    /* The last write of a completed room: its LAYER_DONE and the DONE leave in one send (one
     * segment, one read on the decode side), and before the caller thread is woken. */
    int ended = room_end_frame(room, &b, &end_status);
    if (room->served)
        write_done(wr, status); /* its region is free before DONE can reach the puller */
    if (room->conn != NULL)
        baton__conn_send(room->conn, &b);
    baton_buf_free(&b);
    /* After write_done the caller thread may free wr and drop the write's room reference at
     * any moment; room itself stays valid: this thread's own reference lasts until room_close.
     * The write's event goes before the room's closing event, as the header promises. */
    if (!room->served)
        write_done(wr, status);
    if (ended)
        room_close(room, end_status);
}

static int state_error(const baton_xfer_room_t *room)
{
    switch (room->state) {
    case BATON__PR_ABORT_LOCAL:
    case BATON__PR_ABORT_PEER:
        return BATON_EABORTED;
    case BATON__PR_CLOSED:
        return room->ev_closed.status ? room->ev_closed.status : BATON_ECANCELED;
    default:
        return BATON_ECANCELED;
    }
}

static void start_write(baton__wreq_t *wr)
{
    baton_xfer_room_t *room = wr->room;
    if (room->state != BATON__PR_OPEN || room->conn == NULL ||
        room->conn->state == BATON__CONN_CLOSING) {
        write_done(wr, room->state == BATON__PR_OPEN ? BATON_EPEERDOWN : state_error(room));
        return;
    }
    baton__tp_peer_t *tpp = room->conn->tp_peer;
    wr->w.cb = on_tp_write;
    wr->w.data = wr;
    room->inflight++;
    int rc = tpp->tp->ops->write(tpp, &wr->w);
    if (rc != 0) {
        room->inflight--;
        log_warn(BATON__LOG, "write_refused room=%" PRIu64 " err=%s", room->room_id,
                 baton_err_name(rc));
        write_done(wr, rc);
        room_progress(room);
    }
}

#ifdef BATON_HAVE_CUDA
/* Writes whose CUDA event has not completed yet, in arrival order (linked by cmd.link). */
static baton_list_t *cuda_waits(baton_xfer_engine_t *eng)
{
    return &eng->cuda_waits;
}
#endif

/* A room that ends never starts its waiting writes: they fail (before its closing event). */
static void fail_cuda_waits(baton_xfer_room_t *room, int status)
{
#ifdef BATON_HAVE_CUDA
    baton_list_t *w = cuda_waits(room->eng);
    for (baton_list_t *it = w->next; it != w;) {
        baton__wreq_t *wr = container_of(it, baton__wreq_t, cmd.link);
        it = it->next;
        if (wr->room != room)
            continue;
        baton_list_remove(&wr->cmd.link);
        write_done(wr, status);
    }
#else
    (void)room;
    (void)status;
#endif
}

void baton__proom_write(baton_xfer_engine_t *eng, baton__wreq_t *wr)
{
#ifdef BATON_HAVE_CUDA
    if (wr->cuda_event != NULL) {
        baton_list_push(cuda_waits(eng), &wr->cmd.link);
        return;
    }
#endif
    (void)eng;
    start_write(wr);
}

void baton__proom_cuda_tick(baton_xfer_engine_t *eng)
{
#ifdef BATON_HAVE_CUDA
    baton_list_t *w = cuda_waits(eng);
    for (baton_list_t *it = w->next; it != w;) {
        baton__wreq_t *wr = container_of(it, baton__wreq_t, cmd.link);
        it = it->next;
        CUresult r = baton__cuda_load() == 0 ? baton__cu.event_query((CUevent)wr->cuda_event)
                                             : CUDA_ERROR_NO_DEVICE;
        if (r == CUDA_ERROR_NOT_READY && wr->room->state == BATON__PR_OPEN)
            continue;
        baton_list_remove(&wr->cmd.link);
        if (r == CUDA_SUCCESS || r == CUDA_ERROR_NOT_READY)
            start_write(wr); /* NOT_READY here: the room ended, start_write reports why */
        else
            write_done(wr, BATON_EINVAL);
    }
#else
    (void)eng;
#endif
}

void baton__proom_complete(baton_xfer_engine_t *eng, baton_xfer_room_t *room,
                           const baton__done_copy_t *done)
{
    (void)eng;
    if (room->state != BATON__PR_OPEN)
        return; /* aborted or closed meanwhile: its closing event says so */
    room->done = *done;
    (void)BATON__PR_MOVE(room, BATON__PR_COMPLETING);
    room_progress(room);
}

void baton__proom_abort(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int reason)
{
    (void)eng;
    if (room->state != BATON__PR_OPEN && room->state != BATON__PR_COMPLETING)
        return;
    (void)BATON__PR_MOVE(room, BATON__PR_ABORT_LOCAL);
    room->abort_reason = reason;
    room_progress(room);
}

void baton__proom_close_all(baton__conn_t *c, int status)
{
    size_t it = 0;
    baton_xfer_room_t *room;
    while ((room = baton_u64map_next(&c->rooms, &it, NULL)) != NULL) {
        if (room->inflight > 0)
            log_error(BATON__LOG, "room_writes_outlived_fence room=%" PRIu64 " inflight=%" PRIu32,
                      room->room_id, room->inflight);
        room->conn = NULL;
        baton_u64map_del(&c->rooms, room->room_id);
        room_close(room, status);
    }
}
