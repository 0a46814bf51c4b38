/* transfer/engine_api.c — the caller-thread side of rooms: argument checks, then commands to the
 * progress thread (offer, abort, connect, writes, complete). */
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

static int endpoint_ok(const char *host, int port)
{
    return host != NULL && host[0] != '\0' && strlen(host) < 256 && port > 0 && port <= 65535;
}

/* A command naming a peer endpoint (connect, forget). */
static int endpoint_locked(baton_xfer_engine_t *engine, baton__cmd_type_t type, const char *host,
                           int port)
{
    if (engine == NULL || !endpoint_ok(host, port))
        return BATON_EINVAL;
    if (engine->destroying)
        return BATON_ESHUTDOWN;
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return BATON_ENOMEM;
    cmd->type = type;
    strcpy(cmd->u.connect.host, host);
    cmd->u.connect.port = port;
    baton__cmd_post(engine, cmd);
    return 0;
}

/* Adds m to the distinct-region list of a room or write (small: usually one or two). */
static int add_mem(baton_xfer_mem_t ***mems_p, size_t *n_p, size_t *cap_p, baton_xfer_mem_t *m)
{
    for (size_t i = *n_p; i > 0; i--)
        if ((*mems_p)[i - 1] == m)
            return 0;
    if (*n_p == *cap_p) {
        size_t cap = *cap_p ? *cap_p * 2 : 4;
        baton_xfer_mem_t **a = realloc(*mems_p, cap * sizeof(*a));
        if (a == NULL)
            return BATON_ENOMEM;
        *mems_p = a;
        *cap_p = cap;
    }
    (*mems_p)[(*n_p)++] = m;
    return 0;
}

static int offer_locked(baton_xfer_engine_t *engine, const char *host, int port,
                        const baton_xfer_offer_t *offer, uint32_t first_page,
                        baton_xfer_offer_cb cb, void *data)
{
    if (engine == NULL || !endpoint_ok(host, port) || offer == NULL || cb == NULL ||
        offer->pages == NULL || offer->n_layers == 0 || offer->pages_per_layer == 0 ||
        first_page >= offer->pages_per_layer)
        return BATON_EINVAL;
    if (engine->destroying)
        return BATON_ESHUTDOWN;
    if ((uint64_t)offer->n_layers * offer->pages_per_layer > BATON__OFFER_MAX_PAGES)
        return BATON_EINVAL;
    /* only the pages from first_page on are offered (and given in offer->pages) */
    uint64_t n = (uint64_t)offer->n_layers * (offer->pages_per_layer - first_page);
    if (baton_u64map_get(&engine->caller_rooms, offer->room_id) != NULL)
        return BATON_EEXIST;

    baton__droom_t *dr = calloc(1, sizeof(*dr));
    if (dr == NULL)
        return BATON_ENOMEM;
    dr->pages = malloc(n * sizeof(*dr->pages));
    dr->layer_seen = calloc(offer->n_layers, 1);
    if (offer->layer_cb != NULL)
        dr->layer_evs = calloc(offer->n_layers, sizeof(*dr->layer_evs));
    if (dr->pages == NULL || dr->layer_seen == NULL ||
        (offer->layer_cb != NULL && dr->layer_evs == NULL)) {
        free(dr->pages);
        free(dr->layer_seen);
        free(dr->layer_evs);
        free(dr);
        return BATON_ENOMEM;
    }
    size_t cap_mems = 0;
    int rc = 0;
    dr->shm_ok = 1;
    baton_xfer_mem_t *last = NULL;
    for (uint64_t i = 0; i < n; i++) {
        const baton_xfer_iov_t *pg = &offer->pages[i];
        if (pg->addr == NULL || pg->len == 0 || pg->len > UINT32_MAX) {
            rc = BATON_EINVAL;
            break;
        }
        baton_xfer_mem_t *m = last;
        uintptr_t a = (uintptr_t)pg->addr;
        if (m == NULL || a < (uintptr_t)m->addr || a - (uintptr_t)m->addr > m->len ||
            pg->len > m->len - (a - (uintptr_t)m->addr))
            m = baton__mem_find(engine, pg->addr, pg->len);
        if (m == NULL) {
            rc = BATON_EINVAL; /* a destination page outside registered memory */
            break;
        }
        if (m != last && (rc = add_mem(&dr->mems, &dr->n_mems, &cap_mems, m)) != 0)
            break;
        last = m;
        dr->pages[i].addr = (uint64_t)a;
        dr->pages[i].len = pg->len;
        dr->pages[i].mem_id = m->id;
        dr->pages[i].kind = m->kind;
        dr->total_bytes += pg->len;
        if (m->memfd < 0 && m->kind != BATON_XFER_MEM_CUDA) /* CUDA: reached through IPC */
            dr->shm_ok = 0;
        if (m->kind == BATON_XFER_MEM_CUDA)
            dr->cuda = 1;
    }
    if (rc == 0)
        rc = baton_u64map_put(&engine->caller_rooms, offer->room_id, dr);
    if (rc != 0) {
        free(dr->mems);
        free(dr->pages);
        free(dr->layer_seen);
        free(dr->layer_evs);
        free(dr);
        return rc;
    }
    for (size_t i = 0; i < dr->n_mems; i++)
        atomic_fetch_add(&dr->mems[i]->refs, 1);
    dr->eng = engine;
    dr->room_id = offer->room_id;
    dr->n_layers = offer->n_layers;
    dr->ppl = offer->pages_per_layer - first_page;
    dr->first_page = first_page;
    dr->n_pages = (uint32_t)n;
    dr->cb = cb;
    dr->data = data;
    dr->layer_cb = offer->layer_cb;
    for (uint32_t l = 0; dr->layer_cb != NULL && l < dr->n_layers; l++) {
        dr->layer_evs[l].type = BATON__EV_LAYER;
        dr->layer_evs[l].embedded = 1;
        dr->layer_evs[l].u.droom = dr;
    }
    strcpy(dr->host, host);
    dr->port = port;
    dr->abort_status = BATON_EABORTED;
    baton_list_init(&dr->link);
    dr->cmd.type = BATON__CMD_OFFER;
    dr->cmd.embedded = 1;
    dr->cmd.u.offer = dr;
    dr->ev.type = BATON__EV_OFFER_DONE;
    dr->ev.embedded = 1;
    dr->ev.u.droom = dr;
    baton__cmd_post(engine, &dr->cmd);
    return 0;
}

static int abort_locked(baton_xfer_engine_t *engine, uint64_t room_id)
{
    if (engine == NULL)
        return BATON_EINVAL;
    if (engine->destroying)
        return BATON_ESHUTDOWN;
    if (baton_u64map_get(&engine->caller_rooms, room_id) == NULL)
        return BATON_ENOTFOUND;
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return BATON_ENOMEM;
    cmd->type = BATON__CMD_ABORT;
    cmd->u.abort_room = room_id;
    baton__cmd_post(engine, cmd);
    return 0;
}

/* ---- prefill side ---------------------------------------------------------------------- */

uint64_t baton_xfer_room_id(const baton_xfer_room_t *room)
{
    return room->room_id;
}

uint32_t baton_xfer_room_layers(const baton_xfer_room_t *room)
{
    return room->n_layers;
}

uint32_t baton_xfer_room_pages_per_layer(const baton_xfer_room_t *room)
{
    return room->first_page + room->ppl;
}

uint32_t baton_xfer_room_first_page(const baton_xfer_room_t *room)
{
    return room->first_page;
}

uint64_t baton_xfer_room_page_len(const baton_xfer_room_t *room, uint32_t layer, uint32_t page)
{
    if (layer >= room->n_layers || page < room->first_page || page - room->first_page >= room->ppl)
        return 0;
    return room->pages[(size_t)layer * room->ppl + (page - room->first_page)].len;
}

const char *baton_xfer_room_peer_id(const baton_xfer_room_t *room)
{
    return room->peer_id;
}

baton_xfer_transport_t baton_xfer_room_transport(const baton_xfer_room_t *room)
{
    return room->transport;
}

void baton_xfer_room_set_data(baton_xfer_room_t *room, void *data)
{
    baton__api_scope_t scope;
    baton__api_enter(room->eng, &scope);
    room->user = data;
    baton__api_leave(room->eng, &scope);
}

void *baton_xfer_room_get_data(const baton_xfer_room_t *room)
{
    return BATON__LOCKED(room->eng, room->user);
}

static int write_locked(baton_xfer_room_t *room, uint32_t first, uint32_t count, uint32_t cb_layer,
                        const baton_xfer_iov_t *src, size_t n_src, void *cuda_event,
                        baton_xfer_write_cb cb, void *data)
{
    if (room == NULL || src == NULL || cb == NULL)
        return BATON_EINVAL;
    baton_xfer_engine_t *eng = room->eng;
    if (eng->destroying)
        return BATON_ESHUTDOWN;
    if (room->caller_ended)
        return BATON_ECANCELED;
    if (first >= room->n_layers || count > room->n_layers - first)
        return BATON_EINVAL;
    /* the caller gives the full shape; the cached pages' sources are skipped */
    size_t shape_ppl = (size_t)room->first_page + room->ppl;
    if (n_src != (size_t)count * shape_ppl)
        return BATON_EINVAL;
    for (uint32_t l = first; l < first + count; l++)
        if (room->written[l])
            return BATON_EEXIST;

    size_t n_sges = (size_t)count * room->ppl;
    baton__wreq_t *wr = calloc(1, sizeof(*wr) + n_sges * sizeof(baton__tp_sge_t));
    if (wr == NULL)
        return BATON_ENOMEM;
    size_t cap_mems = 0;
    baton_xfer_mem_t *last = NULL;
    int rc = 0;
    size_t base = (size_t)first * room->ppl;
    for (size_t k = 0; k < n_sges; k++) {
        size_t j = k / room->ppl * shape_ppl + room->first_page + k % room->ppl; /* src index */
        const baton__offer_page_t *pg = &room->pages[base + k];
        if (src[j].addr == NULL || src[j].len != pg->len) {
            rc = BATON_EINVAL;
            break;
        }
        baton_xfer_mem_t *m = last;
        uintptr_t a = (uintptr_t)src[j].addr;
        if (m == NULL || a < (uintptr_t)m->addr || a - (uintptr_t)m->addr > m->len ||
            src[j].len > m->len - (a - (uintptr_t)m->addr))
            m = baton__mem_find(eng, src[j].addr, src[j].len);
        if (m == NULL) {
            rc = BATON_EINVAL; /* a source outside registered memory */
            break;
        }
        if (m->mr[room->tp_index] == NULL) {
            rc = BATON_ENOTSUP; /* the room's transport cannot read this region */
            break;
        }
        if (m != last && (rc = add_mem(&wr->mems, &wr->n_mems, &cap_mems, m)) != 0)
            break;
        last = m;
        baton__tp_sge_t *s = &wr->sges[k];
        s->src = src[j].addr;
        s->src_mr = m->mr[room->tp_index];
        s->dst = pg->addr;
        s->dst_mem = pg->mem_id;
        s->dst_page = (uint32_t)(base + k);
        s->len = pg->len;
        wr->bytes += pg->len;
    }
    if (rc != 0) {
        free(wr->mems);
        free(wr);
        return rc;
    }
    for (uint32_t l = first; l < first + count; l++)
        room->written[l] = 1;
    for (size_t i = 0; i < wr->n_mems; i++)
        atomic_fetch_add(&wr->mems[i]->refs, 1);
    atomic_fetch_add(&room->refs, 1);
    room->caller_writes++;
    wr->room = room;
    wr->layer = cb_layer;
    wr->cb = cb;
    wr->data = data;
    wr->cuda_event = cuda_event;
    wr->w.room_id = room->room_id;
    wr->w.sges = wr->sges;
    wr->w.n_sges = n_sges;
    wr->cmd.type = BATON__CMD_WRITE;
    wr->cmd.embedded = 1;
    wr->cmd.u.write = wr;
    wr->ev.type = BATON__EV_WRITE_DONE;
    wr->ev.embedded = 1;
    wr->ev.u.wreq = wr;
    baton__cmd_post(eng, &wr->cmd);
    return 0;
}

static int write_impl(baton_xfer_room_t *room, uint32_t first, uint32_t count, uint32_t cb_layer,
                      const baton_xfer_iov_t *src, size_t n_src, void *cuda_event,
                      baton_xfer_write_cb cb, void *data)
{
    if (room == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(
        room->eng, write_locked(room, first, count, cb_layer, src, n_src, cuda_event, cb, data));
}

int baton_xfer_write_layer(baton_xfer_room_t *room, uint32_t layer, const baton_xfer_iov_t *src,
                           size_t n_src, baton_xfer_write_cb cb, void *data)
{
    return write_impl(room, layer, 1, layer, src, n_src, NULL, cb, data);
}

int baton_xfer_write_room(baton_xfer_room_t *room, const baton_xfer_iov_t *src, size_t n_src,
                          baton_xfer_write_cb cb, void *data)
{
    if (room == NULL)
        return BATON_EINVAL;
    /* n_layers is immutable: reading it before the lock is fine. */
    return write_impl(room, 0, room->n_layers, UINT32_MAX, src, n_src, NULL, cb, data);
}

int baton_xfer_write_layer_after_event(baton_xfer_room_t *room, uint32_t layer,
                                       const baton_xfer_iov_t *src, size_t n_src, void *cuda_event,
                                       baton_xfer_write_cb cb, void *data)
{
#ifdef BATON_HAVE_CUDA
    if (cuda_event == NULL)
        return BATON_EINVAL;
    return write_impl(room, layer, 1, layer, src, n_src, cuda_event, cb, data);
#else
    return BATON_ENOTSUP;
#endif
}

/* The caller's last word on a prefill room (complete or abort): at most one, never after the
 * engine started closing. On success the command is allocated, typed and the room marked. */
static int room_end_cmd(baton_xfer_room_t *room, baton__cmd_type_t type, baton__cmd_t **cmd_p)
{
    if (room->eng->destroying)
        return BATON_ESHUTDOWN;
    if (room->caller_ended)
        return BATON_ECANCELED;
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return BATON_ENOMEM;
    room->caller_ended = 1;
    cmd->type = type;
    *cmd_p = cmd;
    return 0;
}

static int complete_locked(baton_xfer_room_t *room, const baton_xfer_done_t *done)
{
    if (done->payload_len > BATON_XFER_DONE_PAYLOAD_MAX ||
        (done->payload_len > 0 && done->payload == NULL))
        return BATON_EINVAL;
    baton__cmd_t *cmd;
    int rc = room_end_cmd(room, BATON__CMD_COMPLETE, &cmd);
    if (rc != 0)
        return rc;
    cmd->u.complete.room = room;
    cmd->u.complete.done.status = done->status;
    cmd->u.complete.done.first_token = done->first_token;
    cmd->u.complete.done.len = (uint16_t)done->payload_len;
    if (done->payload_len > 0)
        memcpy(cmd->u.complete.done.payload, done->payload, done->payload_len);
    atomic_fetch_add(&room->refs, 1);
    baton__cmd_post(room->eng, cmd);
    return 0;
}

static int room_abort_locked(baton_xfer_room_t *room, int reason)
{
    baton__cmd_t *cmd;
    int rc = room_end_cmd(room, BATON__CMD_PABORT, &cmd);
    if (rc != 0)
        return rc;
    cmd->u.pabort.room = room;
    cmd->u.pabort.reason = reason < 0 ? reason : BATON_EABORTED;
    atomic_fetch_add(&room->refs, 1);
    baton__cmd_post(room->eng, cmd);
    return 0;
}

/* ---- public entry points: the engine lock and log scope around the calls above ----------- */

static int serve_locked(baton_xfer_engine_t *engine, baton_xfer_serve_cb cb, void *data)
{
    if (engine->destroying)
        return BATON_ESHUTDOWN;
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    if (cmd == NULL)
        return BATON_ENOMEM;
    cmd->type = BATON__CMD_SERVE;
    cmd->u.serve.cb = cb;
    cmd->u.serve.data = data;
    baton__cmd_post(engine, cmd);
    return 0;
}

int baton_xfer_engine_serve(baton_xfer_engine_t *engine, baton_xfer_serve_cb cb, void *data)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, serve_locked(engine, cb, data));
}

int baton_xfer_forget(baton_xfer_engine_t *engine, const char *host, int port)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, endpoint_locked(engine, BATON__CMD_FORGET, host, port));
}

int baton_xfer_connect(baton_xfer_engine_t *engine, const char *host, int port)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, endpoint_locked(engine, BATON__CMD_CONNECT, host, port));
}

int baton_xfer_offer(baton_xfer_engine_t *engine, const char *host, int port,
                     const baton_xfer_offer_t *offer, baton_xfer_offer_cb cb, void *data)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, offer_locked(engine, host, port, offer, 0, cb, data));
}

void baton_xfer_offer_opts_init(baton_xfer_offer_opts_t *opts)
{
    memset(opts, 0, sizeof(*opts));
    opts->size = sizeof(*opts);
}

int baton_xfer_offer_ex(baton_xfer_engine_t *engine, const char *host, int port,
                        const baton_xfer_offer_t *offer, const baton_xfer_offer_opts_t *opts,
                        baton_xfer_offer_cb cb, void *data)
{
    uint32_t first_page = 0;
    if (opts != NULL) {
        /* a field is read only when the caller's struct, as it was compiled, has it */
        if (opts->size < offsetof(baton_xfer_offer_opts_t, first_page))
            return BATON_EINVAL;
        if (opts->size >= offsetof(baton_xfer_offer_opts_t, first_page) + sizeof(uint32_t))
            first_page = opts->first_page;
    }
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, offer_locked(engine, host, port, offer, first_page, cb, data));
}

int baton_xfer_abort(baton_xfer_engine_t *engine, uint64_t room_id)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, abort_locked(engine, room_id));
}

int baton_xfer_room_complete(baton_xfer_room_t *room, const baton_xfer_done_t *done)
{
    if (room == NULL || done == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(room->eng, complete_locked(room, done));
}

int baton_xfer_room_abort(baton_xfer_room_t *room, int reason)
{
    if (room == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(room->eng, room_abort_locked(room, reason));
}
