/* kvxfer_send.c — the prefill side of the KV hand-off: a room's phases (kvxfer_int.h), matching
 * offers with requests, filling and writing the layers, DONE, tombstones for given-up rooms. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/kvdone.h"
#include "worker/kvpattern.h"
#include "worker/kvxfer_int.h"

#define COMP WK_KV_COMP

/* An offer whose request never comes is aborted after the timeout plus this grace, so a decode
 * that is still waiting sees its own timeout (504) rather than our abort (502). */
#define ORPHAN_GRACE_MS 1000

/* ---- phases ---------------------------------------------------------------------------- */

#define B(p) BATON_PHASE_BIT(p)
/* legal[from]: the phases `from` may move to (kvxfer_int.h draws the same table). */
static const uint32_t legal[WK_SEND_N_PHASES] = {
    [WK_SEND_NEW] = B(WK_SEND_ORPHAN) | B(WK_SEND_WAITING) | B(WK_SEND_TOMB),
    [WK_SEND_ORPHAN] = B(WK_SEND_MATCHED) | B(WK_SEND_TOMB),
    [WK_SEND_WAITING] = B(WK_SEND_MATCHED) | B(WK_SEND_TOMB),
    [WK_SEND_MATCHED] =
        B(WK_SEND_FINISHING) | B(WK_SEND_ENDING) | B(WK_SEND_DROPPED) | B(WK_SEND_CLOSED),
    [WK_SEND_FINISHING] = B(WK_SEND_ENDING) | B(WK_SEND_DROPPED) | B(WK_SEND_CLOSED),
    [WK_SEND_ENDING] = B(WK_SEND_DROPPED) | B(WK_SEND_CLOSED),
    [WK_SEND_DROPPED] = B(WK_SEND_CLOSED),
    [WK_SEND_CLOSED] = 0,
    [WK_SEND_TOMB] = 0,
};

static const char *const names[WK_SEND_N_PHASES] = {
    [WK_SEND_NEW] = "new",         [WK_SEND_ORPHAN] = "orphan",       [WK_SEND_WAITING] = "waiting",
    [WK_SEND_MATCHED] = "matched", [WK_SEND_FINISHING] = "finishing", [WK_SEND_ENDING] = "ending",
    [WK_SEND_DROPPED] = "dropped", [WK_SEND_CLOSED] = "closed",       [WK_SEND_TOMB] = "tomb",
};

const wk_kv_phases_t wk__kv_send_phases = {COMP, "kv_send", WK_SEND_N_PHASES, legal, names};
#undef B

int wk__kv_send_to(wk_kv_send_t *s, wk_kv_send_phase_t to)
{
    return BATON_PHASE_MOVE(&wk__kv_send_phases, s->phase, to, "room=%" PRIu64, s->room_id);
}

/* Whether a request holds the room (may call wk_kv_send_*, gets `sent`). */
static int held(const wk_kv_send_t *s)
{
    return s->phase == WK_SEND_WAITING || s->phase == WK_SEND_MATCHED ||
           s->phase == WK_SEND_FINISHING || s->phase == WK_SEND_ENDING;
}

/* Layers are filled and written only while computing or finishing. */
static int pumping(const wk_kv_send_t *s)
{
    return s->phase == WK_SEND_MATCHED || s->phase == WK_SEND_FINISHING;
}

/* ---- the room's lists and map ---------------------------------------------------------- */

static void list_push(baton_list_t *l, int which, wk_kv_send_t *s)
{
    s->list = which;
    baton_list_push(l, &s->link);
}

static void list_remove(wk_kv_send_t *s)
{
    if (s->list == WK_KV_L_NONE)
        return;
    baton_list_remove(&s->link);
    s->list = WK_KV_L_NONE;
}

static wk_kv_send_t *list_head(const baton_list_t *l)
{
    baton_list_t *first = baton_list_first(l);
    return first ? container_of(first, wk_kv_send_t, link) : NULL;
}

/* The room failed or was given up: remembered for a timeout period, so that its late request
 * or offer is refused at once. */
static void tomb_push(wk_kv_t *kv, wk_kv_send_t *s, uint64_t now)
{
    wk__kv_send_to(s, WK_SEND_TOMB);
    s->expires_ms = now + kv->cfg.timeout_ms;
    list_push(&kv->tombs, WK_KV_L_TOMBS, s);
}

static void send_free(wk_kv_send_t *s)
{
    free(s->p.ids);
    free(s->layer_st);
    free(s->lease.slots);
    free(s->why);
    free(s);
}

/* Frees s once nothing refers to it anymore. */
static void send_maybe_free(wk_kv_send_t *s)
{
    if (held(s) || s->xroom != NULL || s->lease.work > 0 || s->in_map || s->list != WK_KV_L_NONE)
        return;
    send_free(s);
}

static void map_remove(wk_kv_t *kv, wk_kv_send_t *s)
{
    if (s->in_map) {
        baton_u64map_del(&kv->rooms, s->room_id);
        s->in_map = 0;
    }
}

/* A room known from its offer or a refusal, before any request: in the map, phase NEW. */
static wk_kv_send_t *send_new(wk_kv_t *kv, uint64_t id)
{
    wk_kv_send_t *s = calloc(1, sizeof(*s));
    if (s == NULL || baton_u64map_put(&kv->rooms, id, s) != 0) {
        free(s);
        return NULL;
    }
    s->kv = kv;
    s->room_id = id;
    s->in_map = 1;
    return s;
}

/* ---- DONE, writes and fills ------------------------------------------------------------ */

/* DONE goes out (its status says whether the room was written); the room moves to ENDING. */
static void send_complete(wk_kv_send_t *s, int32_t status)
{
    wk_kv_t *kv = s->kv;
    uint8_t payload[WK_KVDONE_LEN];
    wk__kv_done_encode(kv, &s->p, payload);
    baton_xfer_done_t done = {status, status == WK_KVDONE_ST_OK ? s->first_token : -1, payload,
                              sizeof(payload)};
    wk__kv_send_to(s, WK_SEND_ENDING);
    int rc = baton_xfer_room_complete(s->xroom, &done);
    if (rc != 0 && rc != BATON_ECANCELED && rc != BATON_ESHUTDOWN) {
        log_warn(COMP, "kv_complete_failed room=%" PRIu64 " err=%s", s->room_id,
                 baton_err_name(rc));
        baton_xfer_room_abort(s->xroom, rc);
    }
}

/* A failure while pumping: the room is aborted and its close reports `err` to the request. */
static void send_abort(wk_kv_send_t *s, int err)
{
    baton_xfer_room_abort(s->xroom, err);
    wk__kv_send_to(s, WK_SEND_ENDING);
}

static void on_write(baton_xfer_room_t *room, uint32_t layer, int status, void *data)
{
    (void)room;
    (void)data;
    if (status != 0)
        log_debug(COMP, "kv_write_failed layer=%" PRIu32 " err=%s", layer, baton_err_name(status));
}

/* Writes every filled layer that may go now; completes the room when all are out. */
static void send_pump(wk_kv_send_t *s)
{
    wk_kv_t *kv = s->kv;
    if (!pumping(s) || kv->closing || !wk_kvlease_live(&s->lease))
        return;
    uint32_t L = kv->cfg.shape.layers;
    uint32_t filled = 0;
    for (uint32_t l = 0; l < L; l++)
        if (s->layer_st[l] >= WK_KV_F_FILLED)
            filled++;
    baton_xfer_iov_t *iov = malloc((size_t)L * s->p.ppl * sizeof(*iov));
    if (iov == NULL) {
        send_abort(s, BATON_ENOMEM);
        return;
    }
    int rc = 0;
    if (s->n_write_now == 0) {
        /* not layer-wise: one write for the whole room once all of it is computed and filled */
        if (s->phase != WK_SEND_FINISHING || filled < L) {
            free(iov);
            return;
        }
        wk__kv_room_iov(kv, s->lease.slots, s->p.ppl, s->p.n_tokens, 0, L, iov);
        if (s->t_first_write_ns == 0)
            s->t_first_write_ns = uv_hrtime();
        rc = baton_xfer_write_room(s->xroom, iov, (size_t)L * s->p.ppl, on_write, s);
        log_debug(COMP, "kv_write room=%" PRIu64 " layers=0-%" PRIu32 " err=%s", s->room_id, L - 1,
                  rc ? baton_err_name(rc) : "-");
        if (rc == 0) {
            for (uint32_t l = 0; l < L; l++)
                s->layer_st[l] = WK_KV_F_WRITTEN;
            s->n_written = L;
        }
    } else {
        for (uint32_t l = 0; l < L && rc == 0; l++) {
            if (s->layer_st[l] != WK_KV_F_FILLED || s->n_write_now == 0)
                continue;
            wk__kv_room_iov(kv, s->lease.slots, s->p.ppl, s->p.n_tokens, l, l + 1, iov);
            if (s->t_first_write_ns == 0)
                s->t_first_write_ns = uv_hrtime();
            rc = baton_xfer_write_layer(s->xroom, l, iov, s->p.ppl, on_write, s);
            log_debug(COMP, "kv_write room=%" PRIu64 " layers=%" PRIu32 "-%" PRIu32 " err=%s",
                      s->room_id, l, l, rc ? baton_err_name(rc) : "-");
            if (rc == 0) {
                s->layer_st[l] = WK_KV_F_WRITTEN;
                s->n_written++;
            }
        }
    }
    free(iov);
    if (rc != 0) {
        if (rc != BATON_ECANCELED && rc != BATON_ESHUTDOWN) {
            log_warn(COMP, "kv_write_refused room=%" PRIu64 " err=%s", s->room_id,
                     baton_err_name(rc));
            baton_xfer_room_abort(s->xroom, rc);
        }
        wk__kv_send_to(s, WK_SEND_ENDING); /* the room's close reports what happened */
        return;
    }
    if (s->phase == WK_SEND_FINISHING && s->n_written == L)
        send_complete(s, WK_KVDONE_ST_OK);
}

static void fill_work(uv_work_t *req)
{
    wk_kv_work_t *w = req->data;
    wk_kv_send_t *s = w->room;
    wk_kv_t *kv = w->kv;
    for (uint32_t l = w->l0; l < w->l1; l++) {
        wk__kv_fill_layer(kv, s->lease.slots, &s->p, l);
        if (s->corrupt && l == kv->cfg.shape.layers - 1) {
            /* test-only fault: one byte of the last layer's first offered page (corrupt is
             * set when matched, after p.first_page) */
            uint32_t j = s->p.first_page;
            uint8_t *p = wk__kv_page_addr(kv, l, s->lease.slots[j]);
            p[s->room_id % wk__kv_page_len(kv, s->p.n_tokens, j)] ^= 0x5A;
        }
    }
}

static void fill_done(uv_work_t *req, int status)
{
    wk_kv_work_t *w = req->data;
    wk_kv_t *kv = w->kv;
    wk_kv_send_t *s = w->room;
    for (uint32_t l = w->l0; l < w->l1; l++)
        s->layer_st[l] = status == 0 ? WK_KV_F_FILLED : WK_KV_F_NONE;
    wk__kv_work_end(w, &s->lease);
    if (status != 0 && pumping(s))
        send_abort(s, BATON_ECANCELED);
    send_pump(s);
    send_maybe_free(s);
    wk__kv_maybe_destroy_engine(kv);
}

/* Starts filling layers [l0, l1) that are not filled yet. */
static void send_fill(wk_kv_send_t *s, uint32_t l0, uint32_t l1)
{
    wk_kv_t *kv = s->kv;
    if (!wk_kvlease_live(&s->lease) || kv->closing)
        return;
    /* one job per layer: a whole room filled at once spreads over every thread of the pool */
    for (uint32_t l = l0; l < l1; l++) {
        if (s->layer_st[l] != WK_KV_F_NONE)
            continue;
        int rc = wk__kv_queue_work(kv, &s->lease, s, l, l + 1, fill_work, fill_done);
        if (rc != 0) {
            log_warn(COMP, "kv_fill_failed room=%" PRIu64 " err=%s", s->room_id,
                     baton_err_name(rc));
            if (pumping(s))
                send_abort(s, rc);
            return;
        }
        s->layer_st[l] = WK_KV_F_FILLING;
    }
}

/* ---- matching offers and requests ------------------------------------------------------ */

/* Compares the offer with the request's own shape; 0 when they agree. */
static int shape_check(const wk_kv_t *kv, const wk_kv_send_t *s, char *why, size_t cap)
{
    baton_xfer_room_t *x = s->xroom;
    uint32_t L = kv->cfg.shape.layers;
    uint32_t ppl = wk_kv_slots_for(kv, s->p.n_tokens);
    if (baton_xfer_room_layers(x) != L || baton_xfer_room_pages_per_layer(x) != ppl) {
        snprintf(why, cap, "offer has %u layers x %u pages, prefill needs %u x %u",
                 baton_xfer_room_layers(x), baton_xfer_room_pages_per_layer(x), L, ppl);
        return -1;
    }
    /* pages below first_page are the decode's cached prefix: not offered, so no length */
    for (uint32_t l = 0; l < L; l++)
        for (uint32_t j = baton_xfer_room_first_page(x); j < ppl; j++)
            if (baton_xfer_room_page_len(x, l, j) != wk__kv_page_len(kv, s->p.n_tokens, j)) {
                snprintf(why, cap,
                         "offer page %u of layer %u has %" PRIu64 " bytes, prefill has %" PRIu64, j,
                         l, baton_xfer_room_page_len(x, l, j),
                         wk__kv_page_len(kv, s->p.n_tokens, j));
                return -1;
            }
    return 0;
}

/* Both sides of the room are here. */
static void send_match(wk_kv_send_t *s)
{
    wk_kv_t *kv = s->kv;
    wk__kv_send_to(s, WK_SEND_MATCHED);
    char why[160];
    if (shape_check(kv, s, why, sizeof(why)) != 0) {
        log_warn(COMP, "kv_room_mismatch room=%" PRIu64 " reason=\"%s\"", s->room_id, why);
        s->mismatch = 1;
        free(s->why);
        s->why = strdup(why);
        send_complete(s, WK_KVDONE_ST_MISMATCH); /* the decode learns why; nothing is written */
        return;
    }
    s->p.first_page = baton_xfer_room_first_page(s->xroom);
    baton_counter_add(kv->m_skipped, (double)s->p.first_page * kv->cfg.shape.layers);
    if (kv->cfg.fault_corrupt_every > 0 && ++kv->fault_counter % kv->cfg.fault_corrupt_every == 0) {
        s->corrupt = 1;
        log_warn(COMP, "fault_injected kind=corrupt_kv room=%" PRIu64, s->room_id);
    }
    list_push(&kv->matched, WK_KV_L_MATCHED, s);
    wk__kv_kick(kv);
}

void wk__kv_send_deliver_matched(wk_kv_t *kv)
{
    wk_kv_send_t *s;
    while ((s = list_head(&kv->matched)) != NULL) {
        list_remove(s);
        if (held(s) && s->matched)
            s->matched(s->data);
    }
}

void wk__kv_send_on_room(baton_xfer_engine_t *eng, baton_xfer_room_t *room, void *data)
{
    wk_kv_t *kv = data;
    uint64_t id = baton_xfer_room_id(room);
    (void)eng;
    if (kv->closing) {
        baton_xfer_room_abort(room, BATON_ESHUTDOWN);
        return;
    }
    wk_kv_send_t *s = baton_u64map_get(&kv->rooms, id);
    if (s == NULL) {
        s = send_new(kv, id);
        if (s == NULL) {
            baton_xfer_room_abort(room, BATON_ENOMEM);
            return;
        }
        wk__kv_send_to(s, WK_SEND_ORPHAN);
        s->xroom = room;
        s->expires_ms = baton_now_ms() + kv->cfg.timeout_ms + ORPHAN_GRACE_MS;
        list_push(&kv->orphans, WK_KV_L_ORPHANS, s);
        baton_xfer_room_set_data(room, s);
        log_debug(COMP, "kv_offer_waiting room=%" PRIu64 " peer=%s", id,
                  baton_xfer_room_peer_id(room));
        return;
    }
    if (s->phase == WK_SEND_WAITING) {
        s->xroom = room;
        baton_xfer_room_set_data(room, s);
        send_match(s);
        return;
    }
    /* A tombstone (its request failed or left), or a second offer for a room already open. */
    int tomb = s->phase == WK_SEND_TOMB;
    log_info(COMP, "kv_offer_refused room=%" PRIu64 " peer=%s reason=%s", id,
             baton_xfer_room_peer_id(room), tomb ? "request_gone" : "room_in_use");
    wk__kv_count_fail(kv, tomb ? "aborted" : "refused");
    baton_xfer_room_abort(room, tomb ? BATON_ECANCELED : BATON_EEXIST);
}

void wk__kv_send_on_room_closed(baton_xfer_engine_t *eng, baton_xfer_room_t *room, int status,
                                void *data)
{
    wk_kv_t *kv = data;
    wk_kv_send_t *s = baton_xfer_room_get_data(room);
    (void)eng;
    if (s == NULL)
        return; /* refused at once */
    s->xroom = NULL;
    if (s->phase == WK_SEND_ORPHAN) {
        /* its decode gave up (or went away) before the request came: remember the room for a
         * timeout period so a late request fails at once instead of waiting for its deadline */
        list_remove(s);
        if (!s->counted) {
            s->counted = 1;
            wk__kv_count_fail(kv, wk__kv_reason_of(status ? status : BATON_EABORTED));
        }
        tomb_push(kv, s, baton_now_ms());
        send_maybe_free(s);
        return;
    }
    if (s->phase == WK_SEND_TOMB) {
        send_maybe_free(s); /* an expired offer: its tombstone lives on until it expires */
        return;
    }
    int had_req = held(s);
    wk__kv_send_to(s, WK_SEND_CLOSED);
    map_remove(kv, s);
    list_remove(s); /* a matched callback not delivered yet */
    wk__kv_lease_drop(kv, &s->lease, WK_KV_HOLD_XFER);
    int rep = status;
    if (status == 0 && s->mismatch)
        rep = WK_EMISMATCH;
    if (!s->counted) {
        s->counted = 1;
        if (rep == 0) {
            baton_counter_add(kv->m_ok, 1);
            wk__kv_observe_since(kv->m_xfer, s->t_first_write_ns);
            wk__kv_observe_since(kv->m_tail, s->t_compute_end_ns);
        } else {
            wk__kv_count_fail(kv, wk__kv_reason_of(rep));
        }
    }
    if (had_req) {
        wk__kv_lease_drop(kv, &s->lease, WK_KV_HOLD_USER);
        char detail[200];
        snprintf(detail, sizeof(detail), "%s", rep == WK_EMISMATCH && s->why ? s->why : "");
        s->sent(s->data, rep, detail);
    }
    send_maybe_free(s);
}

/* ---- the request's calls --------------------------------------------------------------- */

int wk_kv_send_open(wk_kv_t *kv, uint64_t room, const wk_kv_prompt_t *pr, wk_kv_matched_cb matched,
                    wk_kv_sent_cb sent, void *data, wk_kv_send_t **s_p)
{
    if (kv->closing)
        return BATON_ESHUTDOWN;
    if (pr->n_tokens == 0)
        return BATON_EINVAL;
    wk_kv_send_t *s = baton_u64map_get(&kv->rooms, room);
    if (s != NULL && s->phase == WK_SEND_TOMB)
        return BATON_EABORTED;
    if (s != NULL && s->phase != WK_SEND_ORPHAN)
        return BATON_EEXIST;
    int64_t *ids = wk__kv_copy_ids(pr);
    uint8_t *layer_st = calloc(kv->cfg.shape.layers, 1);
    wk_kv_send_t *fresh = NULL;
    if (ids != NULL && layer_st != NULL && s == NULL)
        fresh = send_new(kv, room);
    if (ids == NULL || layer_st == NULL || (s == NULL && fresh == NULL)) {
        free(ids);
        free(layer_st);
        return BATON_ENOMEM;
    }
    if (fresh != NULL) {
        s = fresh;
        wk__kv_send_to(s, WK_SEND_WAITING);
    }
    s->data = data;
    s->matched = matched;
    s->sent = sent;
    s->p.ids = ids;
    s->layer_st = layer_st;
    s->p.n_tokens = pr->n_tokens;
    s->p.seed = pr->seed;
    s->p.want_first = pr->want_first;
    s->p.ppl = wk_kv_slots_for(kv, pr->n_tokens);
    s->first_token = -1;
    if (s->phase == WK_SEND_ORPHAN) {
        list_remove(s);
        send_match(s); /* reports through the deferred list, never inside this call */
    }
    *s_p = s;
    return 0;
}

int wk_kv_send_slots(wk_kv_send_t *s, const uint32_t *slots)
{
    unsigned holds = WK_KV_HOLD_USER | (s->xroom != NULL ? WK_KV_HOLD_XFER : 0);
    return wk_kvlease_init(&s->lease, slots, s->p.ppl, holds);
}

void wk_kv_send_layer(wk_kv_send_t *s, uint32_t layer, int write_now)
{
    if (layer >= s->kv->cfg.shape.layers || !pumping(s))
        return;
    if (write_now)
        s->n_write_now++;
    if (s->layer_st[layer] == WK_KV_F_FILLED)
        send_pump(s);
    else
        send_fill(s, layer, layer + 1);
}

static void load_work(uv_work_t *req)
{
    wk_kv_work_t *w = req->data;
    wk_kv_send_t *s = w->room;
    wk_kv_t *kv = w->kv;
    uint32_t P = kv->cfg.shape.page_tokens;
    uint64_t tb = kv->token_bytes, half = tb / 2;
    uint64_t half_obj = (uint64_t)kv->cfg.shape.layers * P * half;
    uint64_t t0 = uv_hrtime();
    for (uint32_t i = 0; i < w->l1 - w->l0; i++) {
        for (uint32_t l = 0; l < kv->cfg.shape.layers; l++) {
            /* the lease's work count keeps these slots out of the pool until load_done */
            uint8_t *dst = wk__kv_page_addr(kv, l, s->lease.slots[w->l0 + i]);
            for (uint32_t t = 0; t < P; t++) {
                uint64_t at = ((uint64_t)l * P + t) * half;
                memcpy(dst + t * tb, w->objs[i] + at, half);
                memcpy(dst + t * tb + half, w->objs[i] + half_obj + at, tb - half);
            }
        }
    }
    w->ns = uv_hrtime() - t0;
}

static void load_done(uv_work_t *req, int status)
{
    wk_kv_work_t *w = req->data;
    wk_kv_t *kv = w->kv;
    wk_kv_send_t *s = w->room;
    wk_kv_loaded_cb cb = w->loaded;
    void *arg = w->loaded_arg;
    uint64_t ns = w->ns;
    if (status != 0) /* not copied: the fills write those pages from the definition */
        s->p.loaded_n = 0;
    free(w->objs);
    wk__kv_work_end(w, &s->lease);
    cb(arg, status, ns);
    send_maybe_free(s);
    wk__kv_maybe_destroy_engine(kv);
}

int wk_kv_send_load_pages(wk_kv_send_t *s, uint32_t first, uint32_t n, const uint8_t *const *objs,
                          wk_kv_loaded_cb cb, void *arg)
{
    wk_kv_t *kv = s->kv;
    if (s->phase != WK_SEND_MATCHED || s->lease.slots == NULL || s->p.loaded_n || n == 0 ||
        (uint64_t)first + n > s->p.ppl ||
        (uint64_t)(first + n) * kv->cfg.shape.page_tokens > s->p.n_tokens || kv->closing)
        return BATON_EINVAL;
    const uint8_t **copy = malloc(n * sizeof(*copy));
    if (!copy)
        return BATON_ENOMEM;
    memcpy(copy, objs, n * sizeof(*copy));
    /* the fills skip these pages from now on; nothing writes the room before cb */
    s->p.loaded_first = first;
    s->p.loaded_n = n;
    wk_kv_work_t init = {.objs = copy, .loaded = cb, .loaded_arg = arg};
    int rc =
        wk__kv_queue_work_init(kv, &s->lease, s, first, first + n, &init, load_work, load_done);
    if (rc != 0) {
        s->p.loaded_n = 0;
        free(copy);
    }
    return rc;
}

void wk_kv_send_hits(wk_kv_send_t *s, uint32_t l1, uint32_t l2, uint32_t l3)
{
    s->p.hits[0] = l1;
    s->p.hits[1] = l2;
    s->p.hits[2] = l3;
}

void wk_kv_send_finish(wk_kv_send_t *s, int32_t first_token)
{
    if (s->phase != WK_SEND_MATCHED)
        return;
    wk__kv_send_to(s, WK_SEND_FINISHING);
    s->first_token = s->p.want_first ? first_token : -1;
    s->t_compute_end_ns = uv_hrtime();
    send_fill(s, 0, s->kv->cfg.shape.layers);
    send_pump(s);
}

void wk_kv_send_drop(wk_kv_send_t *s, const char *reason)
{
    wk_kv_t *kv = s->kv;
    if (!held(s))
        return;
    list_remove(s); /* a pending matched callback */
    if (!s->counted) {
        s->counted = 1;
        wk__kv_count_fail(kv, reason);
    }
    if (wk_kvlease_live(&s->lease))
        wk__kv_lease_drop(kv, &s->lease, WK_KV_HOLD_USER);
    if (s->phase == WK_SEND_WAITING) {
        /* its offer has not come: remember the room so a late one is refused at once */
        tomb_push(kv, s, baton_now_ms());
        free(s->p.ids);
        s->p.ids = NULL;
        return;
    }
    int abort = pumping(s); /* ENDING: DONE or an abort is out already */
    wk__kv_send_to(s, WK_SEND_DROPPED);
    if (abort) {
        int rc = baton_xfer_room_abort(s->xroom, BATON_ECANCELED);
        if (rc != 0 && rc != BATON_ECANCELED)
            log_debug(COMP, "kv_abort_failed room=%" PRIu64 " err=%s", s->room_id,
                      baton_err_name(rc));
    }
    send_maybe_free(s);
}

void wk_kv_send_refuse(wk_kv_t *kv, uint64_t room)
{
    if (kv->closing)
        return;
    wk_kv_send_t *s = baton_u64map_get(&kv->rooms, room);
    if (s == NULL) {
        s = send_new(kv, room);
        if (s == NULL)
            return;     /* only the fast failure is lost: the decode still times out */
        s->counted = 1; /* no room was opened here: the decode side counts it */
    } else if (s->phase == WK_SEND_ORPHAN) {
        list_remove(s);
        if (s->xroom != NULL)
            baton_xfer_room_abort(s->xroom, BATON_ECANCELED);
        s->counted = 1;
        wk__kv_count_fail(kv, "canceled");
    } else {
        return;
    }
    tomb_push(kv, s, baton_now_ms());
}

/* ---- timers and shutdown --------------------------------------------------------------- */

void wk__kv_send_expire(wk_kv_t *kv, uint64_t now)
{
    wk_kv_send_t *s;
    while ((s = list_head(&kv->tombs)) != NULL && s->expires_ms <= now) {
        list_remove(s);
        map_remove(kv, s);
        send_maybe_free(s);
    }
    while ((s = list_head(&kv->orphans)) != NULL && s->expires_ms <= now) {
        list_remove(s);
        log_warn(COMP, "kv_offer_expired room=%" PRIu64 " waited_ms=%" PRIu64, s->room_id,
                 kv->cfg.timeout_ms + ORPHAN_GRACE_MS);
        s->counted = 1;
        wk__kv_count_fail(kv, "timeout");
        /* a tombstone from now on, and in the map until it expires, so a late request is
         * refused; the room's close (after the abort) only lets go of xroom */
        tomb_push(kv, s, now);
        if (s->xroom != NULL)
            baton_xfer_room_abort(s->xroom, BATON_ETIMEOUT);
    }
}

void wk__kv_send_shutdown(wk_kv_t *kv)
{
    for (baton_list_t *it = kv->orphans.next; it != &kv->orphans; it = it->next) {
        wk_kv_send_t *s = container_of(it, wk_kv_send_t, link);
        if (s->xroom != NULL)
            baton_xfer_room_abort(s->xroom, BATON_ESHUTDOWN);
    }
}

void wk__kv_send_engine_closed(wk_kv_t *kv)
{
    baton_list_t *left[] = {&kv->tombs, &kv->orphans};
    for (int i = 0; i < 2; i++) {
        wk_kv_send_t *s;
        while ((s = list_head(left[i])) != NULL) {
            list_remove(s);
            map_remove(kv, s);
            s->xroom = NULL;
            send_maybe_free(s);
        }
    }
}
