/* kvxfer_recv.c — the decode side of the KV hand-off: a room's phases (kvxfer_int.h), offers,
 * per-layer verification of the received KV, DONE and the verdict, peer endpoints. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "worker/kvdone.h"
#include "worker/kvpattern.h"
#include "worker/kvxfer_int.h"
#include "worker/simtext.h"

#define COMP WK_KV_COMP

/* A prefill endpoint as the decode saw it in libbaton's peer events. */
struct wk_kv_ep_s {
    wk_kv_ep_t *next;
    char name[300];
    int state; /* baton_xfer_peer_state_t, 0 before the first event */
    uint32_t up_seq;
};

/* ---- phases ---------------------------------------------------------------------------- */

#define B(p) BATON_PHASE_BIT(p)
/* legal[from]: the phases `from` may move to (kvxfer_int.h draws the same table). */
static const uint32_t legal[WK_RECV_N_PHASES] = {
    [WK_RECV_NEW] = B(WK_RECV_OFFERED),
    [WK_RECV_OFFERED] = B(WK_RECV_CHECKING) | B(WK_RECV_ENDED) | B(WK_RECV_ABORTING),
    [WK_RECV_CHECKING] = B(WK_RECV_GOT) | B(WK_RECV_ENDED),
    [WK_RECV_GOT] = B(WK_RECV_ENDED),
    [WK_RECV_ABORTING] = B(WK_RECV_ENDED),
    [WK_RECV_ENDED] = 0,
};

static const char *const names[WK_RECV_N_PHASES] = {
    [WK_RECV_NEW] = "new", [WK_RECV_OFFERED] = "offered",   [WK_RECV_CHECKING] = "checking",
    [WK_RECV_GOT] = "got", [WK_RECV_ABORTING] = "aborting", [WK_RECV_ENDED] = "ended",
};

const wk_kv_phases_t wk__kv_recv_phases = {COMP, "kv_recv", WK_RECV_N_PHASES, legal, names};
#undef B

int wk__kv_recv_to(wk_kv_recv_t *r, wk_kv_recv_phase_t to)
{
    return BATON_PHASE_MOVE(&wk__kv_recv_phases, r->phase, to, "room=%" PRIu64, r->room_id);
}

/* Whether the request holds the handle (gets the callback, may drop it). */
static int held(const wk_kv_recv_t *r)
{
    return r->phase == WK_RECV_OFFERED || r->phase == WK_RECV_CHECKING || r->phase == WK_RECV_GOT;
}

/* ---- peer endpoints -------------------------------------------------------------------- */

static wk_kv_ep_t *ep_get(wk_kv_t *kv, const char *name)
{
    for (wk_kv_ep_t *e = kv->eps; e; e = e->next)
        if (strcmp(e->name, name) == 0)
            return e;
    if (kv->n_eps >= 4096)
        return NULL; /* bogus bootstrap ports must not grow this forever; only precision is lost */
    wk_kv_ep_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return NULL;
    kv->n_eps++;
    snprintf(e->name, sizeof(e->name), "%s", name);
    e->next = kv->eps;
    kv->eps = e;
    return e;
}

void wk__kv_recv_peer_event(wk_kv_t *kv, const baton_xfer_peer_info_t *info)
{
    wk_kv_ep_t *e = ep_get(kv, info->endpoint);
    if (e == NULL)
        return;
    e->state = info->state;
    if (info->state == BATON_XFER_PEER_UP)
        e->up_seq++;
}

void wk__kv_recv_free_eps(wk_kv_t *kv)
{
    while (kv->eps) {
        wk_kv_ep_t *e = kv->eps;
        kv->eps = e->next;
        free(e);
    }
}

/* ---- verdicts -------------------------------------------------------------------------- */

static void recv_maybe_free(wk_kv_recv_t *r)
{
    if (r->phase != WK_RECV_ENDED || r->lease.work > 0)
        return;
    free(r->p.ids);
    free(r->layer_queued);
    free(r->lease.slots); /* NULL once returned to the pool */
    free(r);
}

/* Reports a failure to the request (the handle is gone afterwards). */
static void recv_fail(wk_kv_recv_t *r, int status, const char *detail)
{
    wk_kv_t *kv = r->kv;
    int had_req = held(r);
    wk__kv_count_fail(kv, wk__kv_reason_of(status));
    wk__kv_recv_to(r, WK_RECV_ENDED);
    if (had_req) {
        wk__kv_lease_drop(kv, &r->lease, WK_KV_HOLD_USER);
        r->cb(r->data, status, NULL, detail);
    }
}

static void check_work(uv_work_t *req)
{
    wk_kv_work_t *w = req->data;
    const wk_kv_recv_t *r = w->room;
    wk_kv_t *kv = w->kv;
    uint32_t P = kv->cfg.shape.page_tokens;
    for (uint32_t l = w->l0; l < w->l1; l++) {
        for (uint32_t j = 0; j < r->p.ppl; j++) {
            uint32_t first = j * P;
            uint32_t n = wk_kvshape_page_tokens_at(&kv->cfg.shape, r->p.n_tokens, j);
            if (j < r->p.first_page) {
                /* Not offered: the decode's cache kept this page's KV from an earlier turn. The
                 * simulated cache holds token ids, not bytes, so its KV is put back from them
                 * (the pool pages are the request's own); a real engine would share the page. */
                wk_kv_fill(wk__kv_page_addr(kv, l, r->lease.slots[j]), kv->token_bytes,
                           r->p.ids + first, first, n, l);
                continue;
            }
            uint64_t off = 0;
            uint64_t d = wk_kv_check(wk__kv_page_addr(kv, l, r->lease.slots[j]), kv->token_bytes,
                                     r->p.ids + first, first, n, l, &off);
            if (d != 0 && w->diff == 0) {
                w->bad_layer = l;
                w->bad_page = j;
                w->bad_off = off;
            }
            w->diff |= d;
        }
    }
}

static void check_finish(wk_kv_recv_t *r);

static void check_done(uv_work_t *req, int status)
{
    wk_kv_work_t *w = req->data;
    wk_kv_t *kv = w->kv;
    wk_kv_recv_t *r = w->room;
    if (status != 0)
        r->check_failed = 1;
    /* the first bad byte of the lowest bad layer, whatever order the jobs end in */
    if (w->diff != 0 && (r->diff == 0 || w->bad_layer < r->bad_layer)) {
        r->bad_layer = w->bad_layer;
        r->bad_page = w->bad_page;
        r->bad_off = w->bad_off;
    }
    r->diff |= w->diff;
    wk__kv_work_end(w, &r->lease);
    if (--r->checks_pending > 0)
        return;
    if (r->phase == WK_RECV_CHECKING) {
        check_finish(r);
        return;
    }
    /* A layer checked early, before DONE (or the room failed meanwhile: then this may be the
     * last thing that held r). */
    recv_maybe_free(r);
    wk__kv_maybe_destroy_engine(kv);
}

/* Queues the check of `layer`; 0 or an error (the layer stays unqueued). */
static int check_queue(wk_kv_recv_t *r, uint32_t layer)
{
    int rc = wk__kv_queue_work(r->kv, &r->lease, r, layer, layer + 1, check_work, check_done);
    if (rc != 0)
        return rc;
    r->layer_queued[layer] = 1;
    r->checks_pending++;
    return 0;
}

/* Every layer was checked (phase CHECKING): the verdict. */
static void check_finish(wk_kv_recv_t *r)
{
    wk_kv_t *kv = r->kv;
    char detail[200];
    if (r->check_failed) {
        recv_fail(r, BATON_ENOMEM, "the check could not run");
    } else if (r->diff != 0) {
        baton_counter_add(kv->m_corrupt, 1);
        log_error(COMP,
                  "kv_corrupted room=%" PRIu64 " layer=%" PRIu32 " page=%" PRIu32
                  " offset=%" PRIu64,
                  r->room_id, r->bad_layer, r->bad_page, r->bad_off);
        snprintf(detail, sizeof(detail),
                 "received KV differs from the prefill's at layer %u, page %u, byte %" PRIu64,
                 r->bad_layer, r->bad_page, r->bad_off);
        recv_fail(r, BATON_EKVCORRUPT, detail);
    } else {
        /* The generator's seed comes out of the received bytes: any difference left in them
         * would change every token (the check above already refused it). */
        wk_kv_got_t got = {r->p.n_tokens,
                           r->first_token,
                           r->p.seed ^ r->diff,
                           r->p.has_hits,
                           {r->p.hits[0], r->p.hits[1], r->p.hits[2]}};
        if (r->p.want_first && wk_sim_token(got.seed, 0) != r->first_token) {
            baton_counter_add(kv->m_corrupt, 1);
            snprintf(detail, sizeof(detail),
                     "first token %d does not follow from the received KV (expected %d)",
                     r->first_token, wk_sim_token(got.seed, 0));
            log_error(COMP, "kv_corrupted room=%" PRIu64 " reason=\"%s\"", r->room_id, detail);
            recv_fail(r, BATON_EKVCORRUPT, detail);
        } else {
            wk__kv_recv_to(r, WK_RECV_GOT);
            baton_counter_add(kv->m_ok, 1);
            /* the request may drop (and so free) r inside the callback: hands off after */
            r->cb(r->data, 0, &got, "");
            wk__kv_maybe_destroy_engine(kv);
            return;
        }
    }
    recv_maybe_free(r);
    wk__kv_maybe_destroy_engine(kv);
}

/* DONE arrived: is it the room this request expects? 0, or a mismatch with its reason. */
static int payload_check(const wk_kv_t *kv, const wk_kv_recv_t *r, const baton_xfer_done_t *d,
                         char *why, size_t cap)
{
    wk_kvdone_t p;
    if (wk_kvdone_decode(d->payload, d->payload_len, &p) != 0) {
        snprintf(why, cap, "the prefill's DONE is not a baton-worker KV hand-off");
        return -1;
    }
    if (p.layers != kv->cfg.shape.layers || p.token_bytes != kv->token_bytes ||
        p.page_tokens != kv->cfg.shape.page_tokens) {
        snprintf(why, cap,
                 "model shape differs: prefill has %u layers, %" PRIu64
                 " bytes per token, %u-token "
                 "pages; decode has %u, %" PRIu64 ", %u",
                 p.layers, p.token_bytes, p.page_tokens, kv->cfg.shape.layers, kv->token_bytes,
                 kv->cfg.shape.page_tokens);
        return -1;
    }
    if (p.n_tokens != r->p.n_tokens || p.seed != r->p.seed) {
        snprintf(why, cap,
                 "prefill computed %u prompt tokens (seed %016" PRIx64 "), decode expected %u "
                 "(seed %016" PRIx64 ")",
                 p.n_tokens, p.seed, r->p.n_tokens, r->p.seed);
        return -1;
    }
    if (d->status == WK_KVDONE_ST_MISMATCH) {
        snprintf(why, cap, "the prefill refused the offered pages for this prompt");
        return -1;
    }
    if (d->status != WK_KVDONE_ST_OK) {
        snprintf(why, cap, "the prefill reported status %d", (int)d->status);
        return -1;
    }
    if ((d->first_token >= 0) != (r->p.want_first != 0) || d->first_token >= WK_SIM_VOCAB_SIZE) {
        snprintf(why, cap, "first token %" PRId64 " does not fit the request", d->first_token);
        return -1;
    }
    return 0;
}

/* ---- libbaton's callbacks -------------------------------------------------------------- */

static void on_offer_done(void *data, uint64_t room_id, int status, const baton_xfer_done_t *done)
{
    wk_kv_recv_t *r = data;
    wk_kv_t *kv = r->kv;
    /* the engine's last word on the room: nothing can land in its pages anymore */
    wk__kv_lease_drop(kv, &r->lease, WK_KV_HOLD_XFER);
    if (r->phase == WK_RECV_ABORTING) {
        wk__kv_recv_to(r, WK_RECV_ENDED);
        recv_maybe_free(r);
        wk__kv_maybe_destroy_engine(kv);
        return;
    }
    if (status != 0) {
        if (status == BATON_EPEERDOWN && r->ep != NULL && !r->was_up && r->ep->up_seq == r->up_seq)
            status = WK_EUNREACHABLE; /* it never answered since we asked */
        char detail[160];
        snprintf(detail, sizeof(detail), "%s",
                 baton_strerror(status == WK_EUNREACHABLE ? BATON_EPEERDOWN : status));
        recv_fail(r, status, detail);
        recv_maybe_free(r);
        return;
    }
    wk__kv_observe_since(kv->m_xfer, r->t_offer_ns);
    char why[256];
    if (payload_check(kv, r, done, why, sizeof(why)) != 0) {
        log_warn(COMP, "kv_room_mismatch room=%" PRIu64 " reason=\"%s\"", room_id, why);
        recv_fail(r, WK_EMISMATCH, why);
        recv_maybe_free(r);
        return;
    }
    r->first_token = (int32_t)done->first_token;
    wk_kvdone_t dp;
    if (wk_kvdone_decode(done->payload, done->payload_len, &dp) == 0 && dp.has_hits) {
        r->p.has_hits = 1;
        r->p.hits[0] = dp.hit_l1;
        r->p.hits[1] = dp.hit_l2;
        r->p.hits[2] = dp.hit_l3;
    }
    wk__kv_recv_to(r, WK_RECV_CHECKING);
    /* Most layers were queued by on_layer as they landed; here only those libbaton did not
     * report (an older prefill engine, a failed queue). One job per layer: big rooms are
     * checked by every thread of the pool. */
    for (uint32_t l = 0; l < kv->cfg.shape.layers && !r->check_failed; l++) {
        if (r->layer_queued[l])
            continue;
        if (check_queue(r, l) != 0) {
            r->check_failed = 1;
            break;
        }
    }
    if (r->checks_pending == 0)
        check_finish(r);
}

/* libbaton: every byte of `layer` is in place (before DONE). Checking it now overlaps the
 * check with the rest of the transfer, so at DONE little or nothing is left to verify. The
 * pages stay leased (HOLD_XFER until on_offer_done, and the job's own work count). */
static void on_layer(void *data, uint64_t room_id, uint32_t layer)
{
    wk_kv_recv_t *r = data;
    (void)room_id;
    if (r->phase != WK_RECV_OFFERED || r->check_failed || layer >= r->kv->cfg.shape.layers ||
        r->layer_queued[layer])
        return;
    check_queue(r, layer); /* on failure on_offer_done queues it again */
}

/* ---- the request's calls --------------------------------------------------------------- */

int wk_kv_recv_start(wk_kv_t *kv, const char *host, int port, uint64_t room,
                     const wk_kv_prompt_t *pr, const uint32_t *slots, wk_kv_recv_cb cb, void *data,
                     wk_kv_recv_t **r_p)
{
    if (kv->closing)
        return BATON_ESHUTDOWN;
    if (host == NULL || host[0] == '\0' || strlen(host) > 255 || port <= 0 || port > 65535 ||
        pr->n_tokens == 0)
        return BATON_EINVAL;
    uint32_t L = kv->cfg.shape.layers;
    uint32_t ppl = wk_kv_slots_for(kv, pr->n_tokens);
    /* whole cached pages only, and never all of them (the cache leaves the last token out);
     * none when pulling: an export serves a pull of its whole shape only */
    uint32_t skip = pr->pull ? 0 : pr->cached_tokens / kv->cfg.shape.page_tokens;
    if (skip >= ppl)
        skip = ppl - 1;
    wk_kv_recv_t *r = calloc(1, sizeof(*r));
    baton_xfer_iov_t *iov = malloc((size_t)L * ppl * sizeof(*iov));
    int64_t *ids = wk__kv_copy_ids(pr);
    uint8_t *lq = calloc(L, 1);
    if (r == NULL || iov == NULL || ids == NULL || lq == NULL ||
        wk_kvlease_init(&r->lease, slots, ppl, WK_KV_HOLD_USER | WK_KV_HOLD_XFER) != 0) {
        free(r);
        free(iov);
        free(ids);
        free(lq);
        return BATON_ENOMEM;
    }
    r->layer_queued = lq;
    wk__kv_room_iov(kv, slots, ppl, pr->n_tokens, 0, L, iov);
    if (skip > 0) /* only the uncached pages of every layer are offered, in the same order */
        for (uint32_t l = 0; l < L; l++)
            memmove(iov + (size_t)l * (ppl - skip), iov + (size_t)l * ppl + skip,
                    (size_t)(ppl - skip) * sizeof(*iov));
    char name[300];
    if (strchr(host, ':') != NULL)
        snprintf(name, sizeof(name), "[%s]:%d", host, port);
    else
        snprintf(name, sizeof(name), "%s:%d", host, port);
    r->kv = kv;
    r->room_id = room;
    r->p.ids = ids;
    r->p.n_tokens = pr->n_tokens;
    r->p.seed = pr->seed;
    r->p.want_first = pr->want_first;
    r->p.ppl = ppl;
    r->p.first_page = skip;
    r->cb = cb;
    r->data = data;
    r->first_token = -1;
    r->ep = ep_get(kv, name);
    r->was_up = r->ep && r->ep->state == BATON_XFER_PEER_UP;
    r->up_seq = r->ep ? r->ep->up_seq : 0;
    r->t_offer_ns = uv_hrtime();
    baton_xfer_offer_t off = {room, L, ppl, iov, on_layer};
    baton_xfer_offer_opts_t opts;
    baton_xfer_offer_opts_init(&opts);
    opts.first_page = skip;
    int rc = pr->pull ? baton_xfer_pull(kv->eng, host, port, &off, on_offer_done, r)
                      : baton_xfer_offer_ex(kv->eng, host, port, &off, &opts, on_offer_done, r);
    free(iov);
    if (rc == 0)
        baton_counter_add(kv->m_skipped, (double)skip * L);
    if (rc != 0) {
        free(r->lease.slots);
        free(ids);
        free(lq);
        free(r);
        return rc;
    }
    wk__kv_recv_to(r, WK_RECV_OFFERED);
    *r_p = r;
    return 0;
}

const uint8_t *wk_kv_region(const wk_kv_t *kv)
{
    return kv->base;
}

wk_kvlease_t *wk_kv_recv_lease(wk_kv_recv_t *r)
{
    return &r->lease;
}

void wk_kv_recv_lease_drop(wk_kv_t *kv, wk_kvlease_t *l, unsigned hold)
{
    wk_kv_recv_t *r = container_of(l, wk_kv_recv_t, lease);
    if (hold == 0)
        wk__kv_lease_work_done(kv, l);
    else
        wk__kv_lease_drop(kv, l, hold);
    recv_maybe_free(r);
}

void wk_kv_recv_drop(wk_kv_recv_t *r, const char *reason)
{
    wk_kv_t *kv = r->kv;
    if (!held(r))
        return;
    if (r->phase == WK_RECV_GOT) {
        wk__kv_recv_to(r, WK_RECV_ENDED);
    } else {
        /* before the verdict: counted as the room's failure */
        wk__kv_count_fail(kv, reason);
        if (r->phase == WK_RECV_OFFERED) {
            wk__kv_recv_to(r, WK_RECV_ABORTING);
            int rc = baton_xfer_abort(kv->eng, r->room_id);
            if (rc != 0 && rc != BATON_ENOTFOUND)
                log_debug(COMP, "kv_abort_failed room=%" PRIu64 " err=%s", r->room_id,
                          baton_err_name(rc));
        } else {
            wk__kv_recv_to(r, WK_RECV_ENDED); /* CHECKING: the offer is over already */
        }
    }
    wk__kv_lease_drop(kv, &r->lease, WK_KV_HOLD_USER);
    recv_maybe_free(r);
}
