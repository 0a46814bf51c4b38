/* kvxfer_export.c — the holder's side of pull mode (vllm-nixl prefill): a held room's KV filled
 * on the thread pool, exported through libbaton's pull API, then pulled, timed out or released
 * (see kvxfer.h, "holder"). */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "worker/kvxfer_int.h"

#define COMP WK_KV_COMP

/* FILLING: the KV is being written into the pages; EXPORTED: libbaton holds the export (a pull
 * may come); ENDED: nothing more is reported (freed once no fill job runs on it). */
typedef enum { EX_FILLING = 0, EX_EXPORTED, EX_ENDED } ex_phase_t;

struct wk_kv_export_s {
    wk_kv_t *kv;
    uint64_t key;
    ex_phase_t phase;
    wk_kv_roomp_t p;
    /* HOLD_USER | HOLD_XFER from the start: the pages are the export's until it is over, and
     * only libbaton's export callback (or a release it accepted) says so. */
    wk_kvlease_t lease;
    int32_t first_token;
    uint32_t timeout_ms;
    uint32_t fills_left;
    int fill_failed;
    wk_kv_ready_cb ready; /* NULL once the holder let go */
    wk_kv_export_end_cb end;
    void *data;
};

static void export_maybe_free(wk_kv_export_t *e)
{
    if (e->phase != EX_ENDED || e->lease.work > 0)
        return;
    free(e->p.ids);
    free(e->lease.slots); /* NULL once returned to the pool */
    free(e);
}

/* The export is over, or never came to be: a pull for its key that arrives later is refused at
 * once (a tombstone, as for a refused push room) instead of waiting as an orphan offer, and the
 * pages go back once no fill job runs on them. */
static void export_over(wk_kv_export_t *e)
{
    e->phase = EX_ENDED;
    e->ready = NULL;
    e->end = NULL;
    wk_kv_send_refuse(e->kv, e->key);
    wk__kv_lease_drop(e->kv, &e->lease, WK_KV_HOLD_USER | WK_KV_HOLD_XFER);
}

static void on_export_end(baton_xfer_engine_t *eng, uint64_t key, int status, void *data)
{
    wk_kv_export_t *e = data;
    (void)eng;
    wk_kv_export_end_cb end = e->end;
    void *d = e->data;
    log_debug(COMP, "kv_export_end key=%" PRIu64 " status=%s", key,
              status ? baton_err_name(status) : "pulled");
    /* counted like a pushed room of the prefill side: a hand-off, ok or failed by reason */
    if (status == 0)
        baton_counter_add(e->kv->m_ok, 1);
    else
        wk__kv_count_fail(e->kv, wk__kv_reason_of(status));
    export_over(e);
    if (end)
        end(d, status);
    export_maybe_free(e);
}

/* Every layer is filled: the pages go to libbaton as an export. */
static void export_publish(wk_kv_export_t *e)
{
    wk_kv_t *kv = e->kv;
    uint32_t L = kv->cfg.shape.layers;
    int rc = e->fill_failed ? BATON_ENOMEM : kv->closing ? BATON_ESHUTDOWN : 0;
    baton_xfer_iov_t *iov = rc ? NULL : malloc((size_t)L * e->p.ppl * sizeof(*iov));
    if (!rc && !iov)
        rc = BATON_ENOMEM;
    if (!rc) {
        uint8_t payload[WK_KVDONE_LEN];
        wk__kv_room_iov(kv, e->lease.slots, e->p.ppl, e->p.n_tokens, 0, L, iov);
        wk__kv_done_encode(kv, &e->p, payload);
        baton_xfer_export_t x = {
            e->key,        L,
            e->p.ppl,      iov,
            e->timeout_ms, {WK_KVDONE_ST_OK, e->first_token, payload, sizeof(payload)}};
        rc = baton_xfer_export(kv->eng, &x, on_export_end, e);
    }
    free(iov);
    wk_kv_ready_cb ready = e->ready;
    void *d = e->data;
    if (rc) {
        log_warn(COMP, "kv_export_failed key=%" PRIu64 " err=%s", e->key, baton_err_name(rc));
        export_over(e);
    } else {
        e->phase = EX_EXPORTED;
        log_debug(COMP, "kv_exported key=%" PRIu64 " pages=%u", e->key, L * e->p.ppl);
    }
    if (ready)
        ready(d, rc);
}

static void fill_work(uv_work_t *req)
{
    wk_kv_work_t *w = req->data;
    wk_kv_export_t *e = w->room;
    for (uint32_t l = w->l0; l < w->l1; l++)
        wk__kv_fill_layer(w->kv, e->lease.slots, &e->p, l);
}

static void fill_done(uv_work_t *req, int status)
{
    wk_kv_work_t *w = req->data;
    wk_kv_export_t *e = w->room;
    wk_kv_t *kv = w->kv;
    if (status != 0)
        e->fill_failed = 1;
    /* published while this job still counts on the lease, so that a callback that lets go of
     * the export cannot free it under us */
    if (--e->fills_left == 0 && e->phase == EX_FILLING)
        export_publish(e);
    wk__kv_work_end(w, &e->lease);
    export_maybe_free(e);
    wk__kv_maybe_destroy_engine(kv);
}

int wk_kv_export_start(wk_kv_t *kv, uint64_t key, const wk_kv_prompt_t *pr, const uint32_t *slots,
                       int32_t first_token, uint32_t timeout_ms, wk_kv_ready_cb ready,
                       wk_kv_export_end_cb end, void *data, wk_kv_export_t **e_p)
{
    if (kv->closing)
        return BATON_ESHUTDOWN;
    if (pr->n_tokens == 0 || ready == NULL || end == NULL)
        return BATON_EINVAL;
    uint32_t L = kv->cfg.shape.layers, ppl = wk_kv_slots_for(kv, pr->n_tokens);
    wk_kv_export_t *e = calloc(1, sizeof(*e));
    int64_t *ids = wk__kv_copy_ids(pr);
    if (e == NULL || ids == NULL ||
        wk_kvlease_init(&e->lease, slots, ppl, WK_KV_HOLD_USER | WK_KV_HOLD_XFER) != 0) {
        free(e);
        free(ids);
        return BATON_ENOMEM;
    }
    e->kv = kv;
    e->key = key;
    e->p = (wk_kv_roomp_t){.ids = ids,
                           .n_tokens = pr->n_tokens,
                           .seed = pr->seed,
                           .want_first = pr->want_first,
                           .ppl = ppl};
    e->first_token = pr->want_first ? first_token : -1;
    e->timeout_ms = timeout_ms;
    e->ready = ready;
    e->end = end;
    e->data = data;
    /* one job per layer: a long prompt's KV is written by every thread of the pool */
    int rc = 0;
    for (uint32_t l = 0; l < L && rc == 0; l++)
        if ((rc = wk__kv_queue_work(kv, &e->lease, e, l, l + 1, fill_work, fill_done)) == 0)
            e->fills_left++;
    if (rc != 0 && e->fills_left == 0) {
        free(e->lease.slots); /* never given to the pool's accounting: still the caller's */
        free(ids);
        free(e);
        return rc;
    }
    if (rc != 0)
        e->fill_failed = 1; /* reported through ready once the queued fills end */
    *e_p = e;
    return 0;
}

int wk_kv_export_release(wk_kv_export_t *e, int detach, const char *reason)
{
    if (e->phase == EX_ENDED)
        return 0;
    if (e->phase == EX_EXPORTED) {
        int rc = baton_xfer_export_release(e->kv->eng, e->key);
        if (rc == BATON_EBUSY) { /* a pull is being served: it ends by its own rules */
            if (detach) {
                e->ready = NULL;
                e->end = NULL;
            }
            return BATON_EBUSY;
        }
        wk__kv_count_fail(e->kv, reason); /* an exported hand-off that never happened */
    }
    export_over(e);
    export_maybe_free(e);
    return 0;
}
