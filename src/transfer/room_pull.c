/* transfer/room_pull.c — pull mode on the holder's caller thread: exports (key → held source
 * pages), serving a pull (an offer for an exported key) with the write path (tcp, shm) or a grant
 * the puller reads with RDMA READ (rdma), export timeouts and releases (baton/transfer.h,
 * "pull mode"). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "transfer/internal.h"

typedef struct export_s {
    baton_xfer_engine_t *eng;
    uint64_t key;
    uint32_t n_layers, ppl;
    baton_xfer_iov_t *src;
    int32_t done_status;
    int64_t first_token;
    uint8_t payload[BATON_XFER_DONE_PAYLOAD_MAX];
    size_t payload_len;
    baton_xfer_export_cb cb;
    void *data;
    baton_xfer_room_t *serving; /* the pull being served, NULL while waiting */
    int has_timer;              /* loop mode: the timeout runs on the caller loop */
    uv_timer_t timer;
    uint64_t deadline_ms; /* own-progress mode: baton_now_ms() of the timeout, 0: none */
    /* a granted pull (RDMA READ): the source regions, held (refs) until the pull ended, so
     * that none is deregistered while the puller's NIC may read it */
    baton_xfer_mem_t **mems;
    size_t n_mems;
} export_t;

static void export_free(export_t *ex)
{
    for (size_t i = 0; i < ex->n_mems; i++)
        atomic_fetch_sub(&ex->mems[i]->refs, 1);
    free(ex->mems);
    free(ex->src);
    free(ex);
}

static void on_timer_closed(uv_handle_t *h)
{
    export_free(h->data);
}

/* Takes the export out of the table and frees it (after its timer closed). */
static void export_drop(export_t *ex)
{
    baton_u64map_del(&ex->eng->exports, ex->key);
    if (ex->has_timer) {
        uv_timer_stop(&ex->timer);
        uv_close((uv_handle_t *)&ex->timer, on_timer_closed);
    } else {
        export_free(ex);
    }
}

static void export_end(export_t *ex, int status)
{
    baton_xfer_export_cb cb = ex->cb;
    void *data = ex->data;
    baton_xfer_engine_t *eng = ex->eng;
    uint64_t key = ex->key;
    export_drop(ex);
    log_debug(BATON__LOG, "export_end key=%" PRIu64 " status=%s", key,
              status ? baton_err_name(status) : "pulled");
    cb(eng, key, status, data);
}

static void on_export_timeout(uv_timer_t *t)
{
    export_t *ex = t->data;
    if (ex->serving == NULL) /* a pull under way ends by its own rules */
        export_end(ex, BATON_ETIMEOUT);
}

static int export_locked(baton_xfer_engine_t *eng, const baton_xfer_export_t *x,
                         baton_xfer_export_cb cb, void *data)
{
    if (x == NULL || cb == NULL || x->n_layers == 0 || x->pages_per_layer == 0 || x->src == NULL ||
        x->done.payload_len > BATON_XFER_DONE_PAYLOAD_MAX ||
        (x->done.payload_len && x->done.payload == NULL) ||
        (uint64_t)x->n_layers * x->pages_per_layer > BATON__OFFER_MAX_PAGES)
        return BATON_EINVAL;
    if (eng->destroying)
        return BATON_ESHUTDOWN;
    if (baton_u64map_get(&eng->exports, x->key) != NULL)
        return BATON_EEXIST;
    size_t n = (size_t)x->n_layers * x->pages_per_layer;
    for (size_t i = 0; i < n; i++)
        if (x->src[i].addr == NULL || x->src[i].len == 0)
            return BATON_EINVAL;
    export_t *ex = calloc(1, sizeof(*ex));
    if (ex == NULL || (ex->src = malloc(n * sizeof(*ex->src))) == NULL) {
        free(ex);
        return BATON_ENOMEM;
    }
    memcpy(ex->src, x->src, n * sizeof(*ex->src));
    ex->eng = eng;
    ex->key = x->key;
    ex->n_layers = x->n_layers;
    ex->ppl = x->pages_per_layer;
    ex->done_status = x->done.status;
    ex->first_token = x->done.first_token;
    ex->payload_len = x->done.payload_len;
    if (x->done.payload_len)
        memcpy(ex->payload, x->done.payload, x->done.payload_len);
    ex->cb = cb;
    ex->data = data;
    if (baton_u64map_put(&eng->exports, x->key, ex) != 0) {
        export_free(ex);
        return BATON_ENOMEM;
    }
    if (x->timeout_ms && eng->caller_loop == NULL) {
        /* The current millisecond rounded up: the expiry test (now_ms >= deadline) then never
         * fires before timeout_ms whole milliseconds have passed since this call. */
        ex->deadline_ms = (uv_hrtime() + 999999u) / 1000000u + x->timeout_ms;
        uint64_t due = atomic_load(&eng->pull_due_ms);
        if (due == 0 || ex->deadline_ms < due)
            atomic_store(&eng->pull_due_ms, ex->deadline_ms);
    } else if (x->timeout_ms) {
        uv_timer_init(eng->caller_loop, &ex->timer);
        ex->timer.data = ex;
        ex->has_timer = 1;
        uv_timer_start(&ex->timer, on_export_timeout, x->timeout_ms, 0);
    }
    return 0;
}

static int release_locked(baton_xfer_engine_t *eng, uint64_t key)
{
    export_t *ex = baton_u64map_get(&eng->exports, key);
    if (ex == NULL)
        return BATON_ENOTFOUND;
    if (ex->serving != NULL)
        return BATON_EBUSY;
    export_drop(ex);
    return 0;
}

int baton_xfer_export(baton_xfer_engine_t *engine, const baton_xfer_export_t *ex,
                      baton_xfer_export_cb cb, void *data)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, export_locked(engine, ex, cb, data));
}

int baton_xfer_export_release(baton_xfer_engine_t *engine, uint64_t key)
{
    if (engine == NULL)
        return BATON_EINVAL;
    return BATON__LOCKED(engine, release_locked(engine, key));
}

int baton_xfer_pull(baton_xfer_engine_t *engine, const char *host, int port,
                    const baton_xfer_offer_t *offer, baton_xfer_offer_cb cb, void *data)
{
    /* The pull is the offer: the key travels as its room id, the holder's engine matches it. */
    return baton_xfer_offer(engine, host, port, offer, cb, data);
}

/* ---- serving, from the engine's event dispatch (caller thread, lock held) ---------------- */

static void on_pull_written(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    (void)room;
    (void)layer;
    (void)status; /* the room's end reports the outcome (its writes' failures included) */
    (void)data;
}

/* rdma, and a puller that knows GRANT: the puller's NIC reads the sources (RDMA READ) instead of
 * ours writing them. The export holds its source regions until the pull ends. */
static int grant(export_t *ex, baton_xfer_room_t *room)
{
    baton_xfer_engine_t *eng = ex->eng;
    uint32_t n = ex->n_layers * ex->ppl;
    baton__grant_cmd_t *g = calloc(1, sizeof(*g) + (size_t)n * sizeof(g->pages[0]));
    baton__cmd_t *cmd = calloc(1, sizeof(*cmd));
    baton_xfer_mem_t **mems = calloc(n, sizeof(*mems));
    int rc = g && cmd && mems ? 0 : BATON_ENOMEM;
    size_t n_mems = 0;
    for (uint32_t i = 0; rc == 0 && i < n; i++) {
        baton_xfer_mem_t *m = baton__mem_find(eng, ex->src[i].addr, ex->src[i].len);
        if (m == NULL)
            rc = BATON_EINVAL; /* a source outside registered memory */
        else if (m->mr[room->tp_index] == NULL)
            rc = BATON_ENOTSUP; /* not registered with rdma */
        if (rc != 0)
            break;
        g->pages[i].addr = (uintptr_t)ex->src[i].addr;
        g->pages[i].len = (uint32_t)ex->src[i].len;
        g->pages[i].mem_id = m->id;
        size_t k = 0;
        while (k < n_mems && mems[k] != m)
            k++;
        if (k == n_mems)
            mems[n_mems++] = m;
    }
    if (rc != 0) {
        free(g);
        free(cmd);
        free(mems);
        return rc;
    }
    for (size_t k = 0; k < n_mems; k++)
        atomic_fetch_add(&mems[k]->refs, 1);
    ex->mems = mems;
    ex->n_mems = n_mems;
    g->room = room;
    g->n_pages = n;
    g->done.status = ex->done_status;
    g->done.first_token = ex->first_token;
    g->done.len = (uint16_t)ex->payload_len;
    memcpy(g->done.payload, ex->payload, ex->payload_len);
    room->caller_ended = 1; /* the room is the engine's from here on */
    atomic_fetch_add(&room->refs, 1);
    cmd->type = BATON__CMD_GRANT;
    cmd->u.grant = g;
    baton__cmd_post(eng, cmd);
    log_debug(BATON__LOG, "pull_granted key=%" PRIu64 " peer=%s pages=%" PRIu32, room->room_id,
              room->peer_id, n);
    return 0;
}

int baton__pull_on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room)
{
    export_t *ex = baton_u64map_get(&eng->exports, room->room_id);
    if (ex == NULL)
        return 0;   /* an ordinary offer: the application's */
    room->pull = 1; /* the application never sees this room, nor its end */
    int same = ex->serving == NULL && room->n_layers == ex->n_layers && room->ppl == ex->ppl;
    for (uint32_t i = 0; same && i < ex->n_layers * ex->ppl; i++)
        same = room->pages[i].len == ex->src[i].len;
    if (!same) {
        log_warn(BATON__LOG, "pull_refused key=%" PRIu64 " peer=%s reason=%s", room->room_id,
                 room->peer_id, ex->serving ? "already_served" : "shape_mismatch");
        baton_xfer_room_abort(room, BATON_EINVAL); /* the export keeps waiting */
        return 1;
    }
    ex->serving = room;
    baton_xfer_done_t done = {ex->done_status, ex->first_token, ex->payload, ex->payload_len};
    int rc;
    if (room->transport == BATON_XFER_TRANSPORT_RDMA &&
        room->peer_proto >= BATON__PROTO_PULL_READ && room->first_page == 0) {
        rc = grant(ex, room);
    } else {
        rc = baton_xfer_write_room(room, ex->src, (size_t)ex->n_layers * ex->ppl, on_pull_written,
                                   NULL);
        if (rc == 0)
            rc = baton_xfer_room_complete(room, &done); /* DONE after every write is acked */
    }
    if (rc != 0) {
        log_warn(BATON__LOG, "pull_failed key=%" PRIu64 " err=%s", room->room_id,
                 baton_err_name(rc));
        ex->serving = NULL;
        baton_xfer_room_abort(room, rc);
        export_end(ex, rc); /* e.g. sources outside registered memory: it can never serve */
    }
    return 1;
}

int baton__pull_on_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status)
{
    if (!room->pull)
        return 0;
    export_t *ex = baton_u64map_get(&eng->exports, room->room_id);
    if (ex != NULL && ex->serving == room)
        export_end(ex, status);
    return 1; /* a refused pull's end is ours too */
}

void baton__pull_on_wake(baton_xfer_engine_t *eng)
{
    uint64_t now = baton_now_ms(), next = 0;
    size_t it = 0;
    export_t *ex;
    /* Collect first: ending an export runs its callback, which may export or release keys
     * (changing the table under the iteration). */
    uint64_t *due = NULL;
    size_t n_due = 0, cap = 0;
    while ((ex = baton_u64map_next(&eng->exports, &it, NULL)) != NULL) {
        if (ex->deadline_ms == 0 || ex->serving != NULL)
            continue; /* a pull under way ends by its own rules, as in loop mode */
        if (ex->deadline_ms > now) {
            next = next == 0 || ex->deadline_ms < next ? ex->deadline_ms : next;
            continue;
        }
        if (n_due == cap) {
            size_t ncap = cap ? cap * 2 : 8;
            uint64_t *nd = realloc(due, ncap * sizeof(*nd));
            if (nd == NULL) { /* retried at the next tick */
                next = now;
                break;
            }
            due = nd;
            cap = ncap;
        }
        due[n_due++] = ex->key;
    }
    /* Published before the callbacks: an export they make lowers it again. */
    atomic_store(&eng->pull_due_ms, next);
    for (size_t i = 0; i < n_due; i++) {
        ex = baton_u64map_get(&eng->exports, due[i]);
        /* still the expired export (a callback may have released it, or re-exported the key) */
        if (ex != NULL && ex->serving == NULL && ex->deadline_ms != 0 && ex->deadline_ms <= now)
            export_end(ex, BATON_ETIMEOUT);
    }
    free(due);
}

void baton__pull_drop_all(baton_xfer_engine_t *eng)
{
    size_t it = 0;
    export_t *ex;
    while ((ex = baton_u64map_next(&eng->exports, &it, NULL)) != NULL)
        if (ex->serving == NULL)
            export_drop(ex);
}
