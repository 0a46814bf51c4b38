/* vllm_hold.c — the vllm-nixl prefill's held KV pages: one libbaton export per sequence, kept
 * until the decode pulls it, its lease runs out (renewed by POST /kv_lease, the decode's
 * heartbeats) or POST /abort_requests releases it (see vllm.h). */
#include "worker/vllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/list.h"
#include "common/log.h"
#include "worker/job.h"
#include "worker/worker.h"

#define COMP "worker"

/* ---- held pages (NIXL prefill) ------------------------------------------------------------ */

struct wk_vllm_s {
    wk_worker_t *w;
    uint64_t lease_ms;  /* vLLM's kv_lease_duration: the grant, and 3/2 of a renewal */
    uv_timer_t *sweep;  /* ends the holds whose lease ran out (its own allocation: see close) */
    baton_list_t holds; /* of wk_vllm_hold_t.link, oldest first */
    baton_metric_child_t *m_held;
    baton_metric_family_t *m_released;
    baton_metric_child_t *m_renewals;
};

struct wk_vllm_hold_s {
    wk_vllm_t *v;
    baton_list_t link;
    char id[64]; /* the request id (remote_request_id) */
    size_t index;
    wk_kv_export_t *ex;       /* the pages, exported once ready; NULL once the hold ended */
    uint32_t *slots, n_slots; /* their ids: the answer's remote_block_ids */
    int exported;             /* ready fired with 0 */
    int ended;                /* counted as released; still the request's until it lets go */
    wk_vllm_ready_cb ready;   /* the request's, until the answer */
    void *data;
    uint64_t expires_ms; /* the lease: baton_now_ms() after which the sweep ends the hold */
};

static void on_sweep(uv_timer_t *t);

int wk_vllm_create(wk_vllm_t **v_p, wk_worker_t *w, uint64_t lease_ms)
{
    wk_vllm_t *v = calloc(1, sizeof(*v));
    if (!v || !(v->sweep = malloc(sizeof(*v->sweep)))) {
        free(v);
        return BATON_ENOMEM;
    }
    v->w = w;
    v->lease_ms = lease_ms;
    baton_list_init(&v->holds);
    uv_timer_init(w->loop, v->sweep);
    v->sweep->data = v;
    /* a lease ends within a tenth of its length (at least every 5 ms, at most every second) */
    uint64_t every = lease_ms / 10 < 5 ? 5 : lease_ms / 10 > 1000 ? 1000 : lease_ms / 10;
    uv_timer_start(v->sweep, on_sweep, every, every);
    uv_unref((uv_handle_t *)v->sweep);
    baton_metric_family_t *rn = baton_metrics_counter(
        w->metrics, "baton_worker_kv_lease_renewals_total",
        "vllm-nixl prefill: held sequences whose lease a decode's heartbeat extended.", 0, NULL);
    v->m_renewals = rn ? baton_metric_child(rn, NULL) : NULL;
    static const char *const result[] = {"result"};
    baton_metric_family_t *g = baton_metrics_gauge(
        w->metrics, "baton_worker_kv_holds",
        "vllm-nixl prefill: sequences whose KV pages are held for their decode's pull.", 0, NULL);
    v->m_released = baton_metrics_counter(
        w->metrics, "baton_worker_kv_holds_released_total",
        "vllm-nixl prefill: held KV pages released, by why (pulled, timeout, aborted, failed, "
        "shutdown).",
        1, result);
    v->m_held = g ? baton_metric_child(g, NULL) : NULL;
    *v_p = v;
    return 0;
}

/* The hold is over (its export's last word came, or it was let go): counted, then freed. The
 * pages are the export's to give back (kvxfer.h: only libbaton's end or an accepted release). */
static void hold_count_end(wk_vllm_hold_t *h, const char *result)
{
    wk_vllm_t *v = h->v;
    const char *lv[] = {result};
    if (v->m_released)
        baton_counter_add(baton_metric_child(v->m_released, lv), 1);
    if (v->m_held)
        baton_gauge_add(v->m_held, -1);
    log_info(COMP, "kv_hold_released id=%s seq=%zu result=%s", h->id, h->index, result);
    baton_list_remove(&h->link);
    h->ended = 1;
}

static void hold_end(wk_vllm_hold_t *h, const char *result)
{
    if (!h->ended)
        hold_count_end(h, result);
    free(h->slots);
    free(h);
}

static void on_hold_ready(void *data, int status)
{
    wk_vllm_hold_t *h = data;
    wk_vllm_ready_cb ready = h->ready;
    void *d = h->data;
    if (status != 0) {
        h->ex = NULL; /* gone with the failure */
        hold_end(h, "failed");
    } else {
        h->exported = 1;
        h->expires_ms = baton_now_ms() + h->v->lease_ms; /* held from now */
    }
    if (ready)
        ready(d, status);
}

static void on_hold_end(void *data, int status)
{
    wk_vllm_hold_t *h = data;
    h->ex = NULL;
    if (status != 0 && status != BATON_ETIMEOUT)
        log_warn(COMP, "kv_hold_pull_failed id=%s seq=%zu err=%s", h->id, h->index,
                 baton_err_name(status));
    const char *result = status == 0 ? "pulled" : status == BATON_ETIMEOUT ? "timeout" : "failed";
    if (h->ready) /* not answered yet (another sequence outlasted the timeout): the request */
        hold_count_end(h, result); /* still holds h; its answer fails, its end frees h */
    else
        hold_end(h, result);
}

int wk_vllm_hold_start(wk_vllm_t *v, const char *id, const wk_request_t *req, size_t i,
                       wk_vllm_ready_cb ready, void *data, wk_vllm_hold_t **h_p)
{
    wk_worker_t *w = v->w;
    const wk_item_t *it = &req->items[i];
    wk_vllm_hold_t *h = calloc(1, sizeof(*h));
    if (!h)
        return BATON_ENOMEM;
    h->v = v;
    h->index = i;
    h->ready = ready;
    h->data = data;
    snprintf(h->id, sizeof(h->id), "%s", id);
    h->n_slots = wk_kv_slots_for(w->kv, it->prompt_tokens);
    h->slots = malloc((size_t)h->n_slots * sizeof(*h->slots));
    wk_kv_resv_t resv;
    int rc = h->slots ? wk_kv_reserve(w->kv, &resv, h->n_slots, h->slots, NULL, h) : BATON_ENOMEM;
    if (rc == 1) { /* the pool is busy: holding must not wait behind other requests */
        wk_kv_reserve_cancel(w->kv, &resv);
        rc = BATON_EBUSY;
    }
    if (rc != 0) {
        free(h->slots);
        free(h);
        return rc;
    }
    wk_kv_prompt_t pr;
    int64_t *tmp;
    rc = wk__job_item_prompt(it, &pr, &tmp);
    /* no export timeout: the lease (expires_ms from the export on, the sweep) ends an unread
     * hold */
    if (rc == 0)
        rc = wk_kv_export_start(w->kv, wk_vllm_room(id, i), &pr, h->slots,
                                it->max_tokens > 0 ? wk_sim_token(it->seed, 0) : -1, 0,
                                on_hold_ready, on_hold_end, h, &h->ex);
    free(tmp);
    if (rc != 0) {
        wk_kv_unreserve(w->kv, h->slots, h->n_slots);
        free(h->slots);
        free(h);
        return rc;
    }
    baton_list_push(&v->holds, &h->link);
    if (v->m_held)
        baton_gauge_add(v->m_held, 1);
    log_debug(COMP, "kv_hold id=%s seq=%zu slots=%u", id, i, h->n_slots);
    *h_p = h;
    return 0;
}

/* Lets go of the pages now; 0, or BATON_EBUSY while a pull is being served (it then ends by
 * its own rules: reported by on_hold_end unless `detach`). */
static int hold_release(wk_vllm_hold_t *h, int detach, const char *result)
{
    int rc = h->ex && !h->ended ? wk_kv_export_release(h->ex, detach, result) : 0;
    if (rc == 0 || detach)
        hold_end(h, result);
    return rc;
}

void wk_vllm_hold_drop(wk_vllm_hold_t *h, const char *result)
{
    hold_release(h, 1, result);
}

int wk_vllm_answer(wk_vllm_t *v, const char *id, size_t n, baton_buf_t *body)
{
    wk_worker_t *w = v->w;
    json_t *blocks = json_array();
    json_t *ans = json_loadb(body->data, body->len, 0, NULL);
    int rc = blocks && json_is_object(ans) ? 0 : BATON_ENOMEM;
    /* every sequence's pages, in sequence order (the decode pulls sequence i from key i); a hold
     * that ended already (its export timed out) is not in the list any more */
    wk_vllm_hold_t *found[64], **hs = n <= 64 ? found : calloc(n, sizeof(*hs));
    size_t n_found = 0;
    if (!hs)
        rc = BATON_ENOMEM;
    for (size_t i = 0; rc == 0 && i < n; i++)
        for (baton_list_t *l = v->holds.next; l != &v->holds; l = l->next) {
            wk_vllm_hold_t *h = container_of(l, wk_vllm_hold_t, link);
            if (h->index == i && strcmp(h->id, id) == 0) {
                hs[n_found++] = h;
                break;
            }
        }
    if (rc == 0 && n_found != n)
        rc = BATON_ETIMEOUT;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        hs[i]->ready = NULL; /* the holds live on by themselves from here */
        hs[i]->expires_ms = baton_now_ms() + v->lease_ms; /* the lease is granted now */
        for (uint32_t k = 0; k < hs[i]->n_slots; k++)
            json_array_append_new(blocks, json_integer(hs[i]->slots[k]));
    }
    if (hs != found)
        free(hs);
    /* remote_host / remote_port: libbaton's bootstrap address, where the pull goes;
     * baton_lease_port: this worker's HTTP port on remote_host, where the decode's heartbeats
     * renew the lease (vLLM sends them over NIXL's notifications, which libbaton has not) */
    json_t *ktp =
        rc ? NULL
           : json_pack("{s:b, s:b, s:s, s:O, s:s, s:s, s:i, s:i, s:i}", "do_remote_prefill", 1,
                       "do_remote_decode", 0, "remote_engine_id", wk_kv_engine_id(w->kv),
                       "remote_block_ids", blocks, "remote_request_id", id, "remote_host",
                       w->cfg.host, "remote_port", wk_kv_listen_port(w->kv), "tp_size", 1,
                       "baton_lease_port", w->http_port);
    char *text = NULL;
    if (ktp && json_object_set_new(ans, "kv_transfer_params", ktp) == 0)
        text = json_dumps(ans, JSON_COMPACT);
    json_decref(blocks);
    json_decref(ans);
    if (!text)
        return rc ? rc : BATON_ENOMEM; /* handed over: the holds time out on their own */
    baton_buf_reset(body);
    rc = baton_buf_append(body, text, strlen(text)) ? BATON_ENOMEM : 0;
    free(text);
    return rc;
}

void wk_vllm_handle_abort(wk_vllm_t *v, baton_http_req_t *http)
{
    json_t *j = json_loadb(http->body, http->body_len, 0, NULL);
    json_t *ids = json_object_get(j, "request_ids");
    if (!json_is_array(ids)) {
        json_decref(j);
        baton_http_respond_error(http, 400, "'request_ids' must be an array of strings",
                                 "invalid_request_error", "request_ids", "invalid_value");
        return;
    }
    size_t released = 0, k;
    json_t *id;
    json_array_foreach(ids, k, id)
    {
        if (!json_is_string(id))
            continue;
        /* every hold of that id but one whose pull is under way (that pull finishes) */
        for (baton_list_t *l = v->holds.next, *next; l != &v->holds; l = next) {
            next = l->next;
            wk_vllm_hold_t *h = container_of(l, wk_vllm_hold_t, link);
            /* an unanswered request's holds are its own (its end releases them) */
            if (h->exported && !h->ready && strcmp(h->id, json_string_value(id)) == 0 &&
                hold_release(h, 0, "aborted") == 0)
                released++;
        }
    }
    json_decref(j);
    char out[64];
    int n = snprintf(out, sizeof(out), "{\"released\":%zu}", released);
    baton_http_respond(http, 200, "application/json", NULL, 0, out, (size_t)n);
}

/* Ends the holds whose lease ran out: an answered one now unless a pull is under way (that
 * pull finishes); an unanswered one is counted, its request then fails (kv_hold_expired). */
static void on_sweep(uv_timer_t *t)
{
    wk_vllm_t *v = t->data;
    uint64_t now = baton_now_ms();
    for (baton_list_t *l = v->holds.next, *next; l != &v->holds; l = next) {
        next = l->next;
        wk_vllm_hold_t *h = container_of(l, wk_vllm_hold_t, link);
        if (h->ended || !h->exported || h->expires_ms > now)
            continue;
        if (h->ready == NULL) {
            hold_release(h, 0, "timeout");
        } else if (h->ex && wk_kv_export_release(h->ex, 1, "timeout") == 0) {
            h->ex = NULL;
            hold_count_end(h, "timeout"); /* the request still holds h; its end frees it */
        }
    }
}

void wk_vllm_handle_lease(wk_vllm_t *v, baton_http_req_t *http)
{
    json_t *j = json_loadb(http->body, http->body_len, 0, NULL);
    json_t *ids = json_object_get(j, "request_ids");
    if (!json_is_array(ids)) {
        json_decref(j);
        baton_http_respond_error(http, 400, "'request_ids' must be an array of strings",
                                 "invalid_request_error", "request_ids", "invalid_value");
        return;
    }
    /* vLLM: each heartbeat moves the expiry to max(expiry, now + 2/3 of the lease) */
    uint64_t until = baton_now_ms() + v->lease_ms * 2 / 3;
    size_t renewed = 0, k;
    json_t *id;
    json_array_foreach(ids, k, id)
    {
        if (!json_is_string(id))
            continue;
        for (baton_list_t *l = v->holds.next; l != &v->holds; l = l->next) {
            wk_vllm_hold_t *h = container_of(l, wk_vllm_hold_t, link);
            if (!h->ended && strcmp(h->id, json_string_value(id)) == 0) {
                if (h->expires_ms < until)
                    h->expires_ms = until;
                renewed++;
            }
        }
    }
    json_decref(j);
    if (v->m_renewals && renewed)
        baton_counter_add(v->m_renewals, renewed);
    log_debug(COMP, "kv_lease_renewed holds=%zu", renewed);
    char out[64];
    int n = snprintf(out, sizeof(out), "{\"renewed\":%zu}", renewed);
    baton_http_respond(http, 200, "application/json", NULL, 0, out, (size_t)n);
}

static void on_sweep_closed(uv_handle_t *h)
{
    free(h);
}

void wk_vllm_close(wk_vllm_t *v)
{
    if (!v)
        return;
    while (!baton_list_empty(&v->holds))
        hold_release(container_of(v->holds.next, wk_vllm_hold_t, link), 1, "shutdown");
    uv_close((uv_handle_t *)v->sweep, on_sweep_closed); /* freed when the loop lets it go */
    free(v);
}
