/* vllm_hold.c — the vllm-nixl prefill's held KV pages: one room per sequence, kept until the
 * decode pulls it, a timeout or POST /abort_requests releases it (see vllm.h). */
#include "worker/vllm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/list.h"
#include "common/log.h"
#include "worker/job.h"
#include "worker/worker.h"

#define COMP "worker"

/* ---- held pages (NIXL prefill) ------------------------------------------------------------ */

struct wk_vllm_s {
    wk_worker_t *w;
    uint64_t hold_timeout_ms;
    baton_list_t holds; /* of hold_t.link */
    baton_metric_child_t *m_held;
    baton_metric_family_t *m_released;
};

typedef struct hold_s {
    wk_vllm_t *v;
    baton_list_t link;
    char id[64]; /* the request id (remote_request_id) */
    size_t index;
    wk_kv_send_t *send;
    uint32_t *slots, n_slots;
    int slots_given; /* handed to the room (its fencing returns them) */
    int matched;
    int32_t first;
    uv_timer_t timer;
} hold_t;

int wk_vllm_create(wk_vllm_t **v_p, wk_worker_t *w, uint64_t hold_timeout_ms)
{
    wk_vllm_t *v = calloc(1, sizeof(*v));
    if (!v)
        return BATON_ENOMEM;
    v->w = w;
    v->hold_timeout_ms = hold_timeout_ms;
    baton_list_init(&v->holds);
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

static void hold_timer_closed(uv_handle_t *h)
{
    hold_t *hd = h->data;
    free(hd->slots);
    free(hd);
}

/* The hold is over (its room's last word came, or it was dropped): counted, then freed. */
static void hold_end(hold_t *h, const char *result)
{
    wk_vllm_t *v = h->v;
    const char *lv[] = {result};
    if (v->m_released)
        baton_counter_add(baton_metric_child(v->m_released, lv), 1);
    if (v->m_held)
        baton_gauge_add(v->m_held, -1);
    log_info(COMP, "kv_hold_released id=%s seq=%zu result=%s", h->id, h->index, result);
    baton_list_remove(&h->link);
    uv_timer_stop(&h->timer);
    uv_close((uv_handle_t *)&h->timer, hold_timer_closed);
}

/* Released before the pull came (timeout, abort, shutdown): the room is aborted, so a late
 * pull is refused at once, and the pages go back. */
static void hold_drop(hold_t *h, const char *result)
{
    if (h->send)
        wk_kv_send_drop(h->send, result);
    h->send = NULL;
    if (!h->slots_given)
        wk_kv_unreserve(h->v->w->kv, h->slots, h->n_slots);
    hold_end(h, result);
}

static void on_hold_timeout(uv_timer_t *t)
{
    hold_t *h = t->data;
    if (!h->matched) /* a pull under way ends by its own rules */
        hold_drop(h, "timeout");
}

static void on_hold_sent(void *data, int status, const char *detail)
{
    hold_t *h = data;
    h->send = NULL;
    if (status != 0)
        log_warn(COMP, "kv_hold_pull_failed id=%s seq=%zu err=%s detail=%s", h->id, h->index,
                 baton_err_name(status), detail ? detail : "");
    if (!h->slots_given)
        wk_kv_unreserve(h->v->w->kv, h->slots, h->n_slots);
    hold_end(h, status == 0 ? "pulled" : "failed");
}

/* The decode's pull (its offer of the room) arrived: the held KV goes out. */
static void on_hold_matched(void *data)
{
    hold_t *h = data;
    h->matched = 1;
    uv_timer_stop(&h->timer);
    if (wk_kv_send_slots(h->send, h->slots) != 0) {
        hold_drop(h, "failed");
        return;
    }
    h->slots_given = 1;
    wk_kv_send_finish(h->send, h->first); /* fills what is left, writes it, then DONE */
}

static int hold_one(wk_vllm_t *v, const char *id, const wk_request_t *req, size_t i, json_t *blocks)
{
    wk_worker_t *w = v->w;
    const wk_item_t *it = &req->items[i];
    hold_t *h = calloc(1, sizeof(*h));
    if (!h)
        return BATON_ENOMEM;
    h->v = v;
    h->index = i;
    snprintf(h->id, sizeof(h->id), "%s", id);
    h->first = it->max_tokens > 0 ? wk_sim_token(it->seed, 0) : -1;
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
    if (rc == 0)
        rc = wk_kv_send_open(w->kv, wk_vllm_room(id, i), &pr, on_hold_matched, on_hold_sent, h,
                             &h->send);
    free(tmp);
    if (rc != 0) {
        wk_kv_unreserve(w->kv, h->slots, h->n_slots);
        free(h->slots);
        free(h);
        return rc;
    }
    for (uint32_t k = 0; k < h->n_slots; k++)
        json_array_append_new(blocks, json_integer(h->slots[k]));
    uv_timer_init(w->loop, &h->timer);
    h->timer.data = h;
    uv_timer_start(&h->timer, on_hold_timeout, v->hold_timeout_ms, 0);
    baton_list_push(&v->holds, &h->link);
    if (v->m_held)
        baton_gauge_add(v->m_held, 1);
    log_debug(COMP, "kv_hold id=%s seq=%zu slots=%u", id, i, h->n_slots);
    return 0;
}

int wk_vllm_hold(wk_vllm_t *v, const char *id, const wk_request_t *req, baton_buf_t *body)
{
    wk_worker_t *w = v->w;
    json_t *blocks = json_array();
    json_t *ans = json_loadb(body->data, body->len, 0, NULL);
    int rc = blocks && json_is_object(ans) ? 0 : BATON_ENOMEM;
    size_t held = 0;
    while (rc == 0 && held < req->n_items && (rc = hold_one(v, id, req, held, blocks)) == 0)
        held++;
    if (rc != 0) {               /* all or nothing: the decode would pull every sequence */
        for (; held > 0; held--) /* this request's holds are the newest */
            hold_drop(container_of(v->holds.prev, hold_t, link), "failed");
        json_decref(blocks);
        json_decref(ans);
        return rc;
    }
    json_t *ktp = json_pack("{s:b, s:b, s:s, s:o, s:s, s:s, s:i, s:i}", "do_remote_prefill", 1,
                            "do_remote_decode", 0, "remote_engine_id", wk_kv_engine_id(w->kv),
                            "remote_block_ids", blocks, "remote_request_id", id, "remote_host",
                            w->cfg.host, "remote_port", wk_kv_listen_port(w->kv), "tp_size", 1);
    char *text = NULL;
    if (ktp && json_object_set_new(ans, "kv_transfer_params", ktp) == 0)
        text = json_dumps(ans, JSON_COMPACT);
    json_decref(ans);
    if (!text)
        return BATON_ENOMEM; /* the holds time out on their own */
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
        /* every unmatched hold of that id; a pull already under way finishes */
        for (baton_list_t *l = v->holds.next, *next; l != &v->holds; l = next) {
            next = l->next;
            hold_t *h = container_of(l, hold_t, link);
            if (!h->matched && strcmp(h->id, json_string_value(id)) == 0) {
                hold_drop(h, "aborted");
                released++;
            }
        }
    }
    json_decref(j);
    char out[64];
    int n = snprintf(out, sizeof(out), "{\"released\":%zu}", released);
    baton_http_respond(http, 200, "application/json", NULL, 0, out, (size_t)n);
}

void wk_vllm_close(wk_vllm_t *v)
{
    if (!v)
        return;
    while (!baton_list_empty(&v->holds)) {
        hold_drop(container_of(v->holds.next, hold_t, link), "shutdown");
    }
    free(v);
}
