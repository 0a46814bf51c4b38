/* proxy_relay.c — what the client receives: responses recorded in the metrics, decode's SSE
 * stream passed through with back-pressure, prefill's input logprobs merged in front (events
 * held until prefill answers), buffered answers passed on. */
#include "router/dataplane/proxy_internal.h"

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "router/control/worker_models.h"
#include "router/dataplane/migrate.h"
#include "router/dataplane/resp_history.h"
#include "router/dataplane/responses.h"

/* ---------------------------------------------------------------------------------------- */
/* Client responses (each records the request in the metrics)                               */

/* 499 (nginx's "client closed request") when the client was gone. */
static void record(baton_router_t *r, uint64_t start_ns, const char *route, int status, int rc,
                   uint64_t ttfb_ns)
{
    uint64_t now = uv_hrtime();
    baton_router_metrics_request_done(r->metrics, route, rc == BATON_ECLOSED ? 499 : status,
                                      baton_seconds_between(start_ns, now),
                                      ttfb_ns ? baton_seconds_between(start_ns, ttfb_ns) : -1.0);
}

int baton__respond(baton_router_t *r, baton_http_req_t *req, const char *route, int status,
                   const char *content_type, const char *body, size_t len)
{
    uint64_t start = req->start_ns; /* req is gone once finished */
    int rc = baton_http_respond(req, status, content_type, NULL, 0, body, len);
    record(r, start, route, status, rc, uv_hrtime());
    return rc;
}

int baton__respond_error(baton_router_t *r, baton_http_req_t *req, const char *route, int status,
                         const char *message, const char *type, const char *param, const char *code)
{
    uint64_t start = req->start_ns;
    int rc = baton_http_respond_error(req, status, message, type, param, code);
    record(r, start, route, status, rc, uv_hrtime());
    return rc;
}

/* The request by model: the label is a model some registered worker serves (its pool was
 * chosen by name), else "other", so clients' names cannot grow the label set. */
static void record_model(baton__preq_t *pr, int status, int rc)
{
    const char *model =
        pr->rctx_built && pr->rctx.model_pool == (int)BATON_POOL_NAMED ? pr->rctx.model : "other";
    baton_router_metrics_model_done(pr->pl->router->metrics, model,
                                    rc == BATON_ECLOSED ? 499 : status);
}

void baton__respond_json_hdr(baton_router_t *r, baton_http_req_t *req, const char *route,
                             int status, json_t *j, const baton_http_header_t *hdr)
{
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    if (!s) {
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    uint64_t start = req->start_ns; /* req is gone once finished */
    int rc = baton_http_respond(req, status, "application/json", hdr, hdr ? 1 : 0, s, strlen(s));
    record(r, start, route, status, rc, uv_hrtime());
    free(s);
}

void baton__respond_json(baton_router_t *r, baton_http_req_t *req, const char *route, int status,
                         json_t *j)
{
    baton__respond_json_hdr(r, req, route, status, j, NULL);
}

/* The client request, taken out of pr for the one call that finishes it (phase DONE). */
static baton_http_req_t *take_req(baton__preq_t *pr, const char *why)
{
    baton_http_req_t *req = pr->req;
    if (!req)
        return NULL;
    pr->req = NULL;
    baton__pr_set_phase(pr, PH_DONE, why);
    return req;
}

void baton__pr_respond(baton__preq_t *pr, int status, const char *ctype, const char *body,
                       size_t len)
{
    baton_http_req_t *req = take_req(pr, "respond");
    if (req)
        record_model(pr, status,
                     baton__respond(pr->pl->router, req, pr->route, status, ctype, body, len));
}

void baton__pr_respond_error(baton__preq_t *pr, int status, const char *message, const char *type,
                             const char *code)
{
    baton_http_req_t *req = take_req(pr, "respond_error");
    if (req)
        record_model(pr, status,
                     baton__respond_error(pr->pl->router, req, pr->route, status, message, type,
                                          NULL, code));
}

/* 429 with Retry-After: the router is saturated now, a later try may pass. */
void baton__pr_respond_queue_full(baton__preq_t *pr)
{
    baton_http_req_t *req = take_req(pr, "queue_full");
    if (!req)
        return;
    baton_router_t *r = pr->pl->router;
    json_t *j = json_pack("{s:{s:s,s:s,s:n,s:s}}", "error", "message",
                          "router overloaded: the admission queue is full, retry later", "type",
                          "rate_limit_error", "param", "code", "queue_full");
    char *s = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    uint64_t start = req->start_ns;
    static const baton_http_header_t extra[] = {{"Retry-After", "1"}};
    int rc = s ? baton_http_respond(req, 429, "application/json", extra, 1, s, strlen(s))
               : baton_http_respond_error(req, 429, "queue full", "rate_limit_error", NULL,
                                          "queue_full");
    free(s);
    record(r, start, pr->route, 429, rc, uv_hrtime());
    record_model(pr, 429, rc);
}

void baton__pr_stream_start(baton__preq_t *pr)
{
    static const baton_http_header_t extra[] = {{"Cache-Control", "no-cache"}};
    baton__pr_set_phase(pr, PH_STREAMING, "decode_stream");
    pr->ttfb_ns = uv_hrtime();
    baton_token_scan_start(pr->pl->router->tokens, &pr->tokens, pr->route, pr->req->start_ns);
    baton_http_stream_start(pr->req, 200, "text/event-stream", extra, 1);
}

void baton__pr_stream_end(baton__preq_t *pr, int status_for_metrics)
{
    baton_http_req_t *req = take_req(pr, "stream_end");
    if (!req)
        return;
    uint64_t start = req->start_ns;
    int rc = baton_http_stream_end(req);
    record(pr->pl->router, start, pr->route, status_for_metrics, rc, pr->ttfb_ns);
    record_model(pr, status_for_metrics, rc);
}

/* ---------------------------------------------------------------------------------------- */
/* Streaming to the client                                                                  */

void baton__relay_update_pause(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_MAIN];
    if (u && u->creq && !u->cancelled)
        pr->pl->http->pause(u->creq, pr->bp_paused || pr->phase == PH_HOLDING);
}

static void client_write(baton__preq_t *pr, const char *data, size_t len)
{
    if (!pr->req || len == 0)
        return;
    /* TTFT / ITL: scans, never copies; the clock only for bytes that end an event. */
    unsigned events = baton_token_scan_events(&pr->tokens, data, len);
    if (events)
        baton_token_scan_observe(&pr->tokens, events, uv_hrtime());
    pr->events_out += events;
    baton_http_stream_write(pr->req, data, len);
    /* Back-pressure: decode is not read while the client's queue is over the watermark, or
     * holds anything while streams together have more than their share of the budget queued;
     * it is read again once the client drained its queue (on_client_drain). */
    size_t q = baton_http_write_queue_size(pr->req);
    const baton_http_budget_t *b = pr->pl->router->budget;
    if (!pr->bp_paused && (q > BATON_PROXY_STREAM_HIGH_WATER ||
                           (q > 0 && b && b->max && atomic_load(&b->out_used) > b->max / 2))) {
        pr->bp_paused = 1;
        baton__relay_update_pause(pr);
    }
}

/* One complete SSE event of decode's stream while logprobs are merged. */
static int stream_event_cb(const char *raw, size_t len, void *arg)
{
    baton__preq_t *pr = arg;
    if (pr->phase == PH_HOLDING) {
        if (baton_buf_append(&pr->held, raw, len))
            return BATON_ENOMEM;
        return 0;
    }
    const char *payload;
    size_t plen;
    if (pr->lp_pass || !baton_sse_single_data(raw, len, &payload, &plen) ||
        !memmem(payload, plen, "input_token_logprobs", 20)) {
        client_write(pr, raw, len);
        return 0;
    }
    if (!pr->lp_ready) {
        /* Prefill's logprobs go in front of this event: hold it (and what follows). */
        baton__pr_set_phase(pr, PH_HOLDING, "wait_logprobs");
        baton__relay_update_pause(pr);
        return baton_buf_append(&pr->held, raw, len) ? BATON_ENOMEM : 0;
    }
    baton_buf_reset(&pr->scratch);
    int rc = baton_pdreq_merge_event(pr->lp, payload, plen, &pr->scratch);
    if (rc > 0) {
        client_write(pr, "data: ", 6);
        client_write(pr, pr->scratch.data, pr->scratch.len);
        client_write(pr, "\n\n", 2);
        if (!pr->pd.batch)
            pr->lp_pass = 1; /* a single request merges once */
    } else {
        client_write(pr, raw, len);
    }
    return 0;
}

/* One complete event of a Responses stream: its final event's response is kept with the
 * conversation (resp_history.h), for a follow-up. */
static int resp_event_cb(const char *raw, size_t len, void *arg)
{
    baton__preq_t *pr = arg;
    const char *payload;
    size_t plen;
    if (baton_sse_single_data(raw, len, &payload, &plen) &&
        baton_resp_history_final_event(payload, plen))
        baton_resp_history_note(pr->resp_conv, payload, plen);
    client_write(pr, raw, len);
    return 0;
}

static void flush_pending_raw(baton__preq_t *pr)
{
    if (baton_sse_pending(&pr->sse)) {
        client_write(pr, pr->sse.pending.data, pr->sse.pending.len);
        baton_sse_splitter_free(&pr->sse);
    }
}

/* Complete events passed through untouched; those of one upstream read that lie next to each
 * other go out in one write (`coalesce`: they point into the caller's bytes, which outlive the
 * feed; events cut from the splitter's own buffer are written one by one before it moves). */
typedef struct pass_run_s {
    baton__preq_t *pr;
    const char *run;
    size_t len;
    int coalesce;
} pass_run_t;

static int pass_event_cb(const char *raw, size_t len, void *arg)
{
    pass_run_t *p = arg;
    if (p->len && raw == p->run + p->len) {
        p->len += len;
        return 0;
    }
    if (p->len)
        client_write(p->pr, p->run, p->len);
    p->run = raw;
    p->len = len;
    if (!p->coalesce) {
        client_write(p->pr, raw, len);
        p->len = 0;
    }
    return 0;
}

/* One complete SSE event of a stream that may go on on another worker: what the client gets
 * of it is noted (migrate.h), and after a migration it carries the first stream's ids. Events
 * that go as they came are coalesced like pass_event_cb's (arg: its pass_run_t). */
static int mig_event_cb(const char *raw, size_t len, void *arg)
{
    pass_run_t *p = arg;
    baton__preq_t *pr = p->pr;
    const char *payload;
    size_t plen;
    int rc = 0;
    if (baton_sse_single_data(raw, len, &payload, &plen)) {
        baton_buf_reset(&pr->scratch);
        rc = baton_mig_event(pr->mig, payload, plen, &pr->scratch);
    }
    if (rc <= 0)
        return rc < 0 ? rc : pass_event_cb(raw, len, p);
    if (p->len) /* what came before it goes first */
        client_write(pr, p->run, p->len);
    p->len = 0;
    client_write(pr, pr->scratch.data, pr->scratch.len);
    return 0;
}

/* Whether bytes that start at an event boundary end at one: their last line is blank ("\n" or
 * "\r\n" after a line end), so every event in them is complete (the splitter's rule). */
static int ends_event(const char *d, size_t n)
{
    return n >= 2 && d[n - 1] == '\n' &&
           (d[n - 2] == '\n' || (n >= 3 && d[n - 2] == '\r' && d[n - 3] == '\n'));
}

/* The worker's stream holds an event open past --max-sse-event-bytes: the stream ends with an
 * error event (the partial event is dropped, never written) and the leg is closed. */
static void event_too_large(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_MAIN];
    size_t cap = pr->pl->router->cfg->max_sse_event_bytes;
    char msg[256];
    snprintf(msg, sizeof(msg), "%s worker %s streamed an SSE event larger than %zu bytes",
             baton__side_name(u), u->w->id, cap);
    log_warn_limited("router", "sse_event_too_large",
                     "sse_event_too_large route=%s worker=%s held=%zu max=%zu", pr->route,
                     u->w->url, baton_sse_pending(&pr->sse), cap);
    baton_sse_splitter_free(&pr->sse);
    baton__finish_error(pr, 502, msg, "upstream_error", "sse_event_too_large", "router_error");
}

/*
 * Decode's (or the regular worker's) stream: only whole events reach the client, so a failure
 * (an error event) always starts at an event boundary; the bytes of an event not yet complete
 * wait in pr->sse, at most --max-sse-event-bytes of them.
 */
/* A Responses answer: note which worker holds it (GET/DELETE by id go there). */
static void note_response(baton__preq_t *pr, const char *data, size_t len)
{
    baton__upstream_t *u = pr->up[UP_MAIN];
    if (pr->pd.api == BATON_API_RESPONSES && pr->mode != MODE_FORWARD && u && u->w && data)
        baton_responses_note(u->w->id, data, len, &pr->resp_seen, &pr->resp_noted);
}

void baton__relay_stream_bytes(baton__preq_t *pr, const char *data, size_t len)
{
    note_response(pr, data, len);
    int merge = pr->mode == MODE_PD && pr->pd.logprobs && (!pr->lp_pass || pr->phase == PH_HOLDING);
    int rc;
    if (merge) {
        rc = baton_sse_feed(&pr->sse, data, len, stream_event_cb, pr);
    } else if (pr->mig && pr->mig->capable) {
        pass_run_t p = {pr, NULL, 0, baton_sse_pending(&pr->sse) == 0};
        rc = baton_sse_feed(&pr->sse, data, len, mig_event_cb, &p);
        if (p.len)
            client_write(pr, p.run, p.len);
    } else if (pr->resp_conv) {
        rc = baton_sse_feed(&pr->sse, data, len, resp_event_cb, pr);
    } else if (!baton_sse_pending(&pr->sse) && ends_event(data, len)) {
        client_write(pr, data, len); /* the usual read: whole events, nothing left open */
        rc = 0;
    } else {
        pass_run_t p = {pr, NULL, 0, baton_sse_pending(&pr->sse) == 0};
        rc = baton_sse_feed(&pr->sse, data, len, pass_event_cb, &p);
        if (p.len)
            client_write(pr, p.run, p.len);
    }
    if (rc < 0) {
        baton__finish_error(pr, 500, "router out of memory while streaming", "server_error",
                            "internal_error", "router_error");
        return;
    }
    if (pr->req && baton_sse_pending(&pr->sse) > pr->pl->router->cfg->max_sse_event_bytes)
        event_too_large(pr);
    baton__pr_account(pr, 0); /* counted (each stream's part is capped above) */
}

void baton__relay_stream_done(baton__preq_t *pr)
{
    if (pr->mig && pr->mig->migrations && pr->mig->done)
        baton_resil_metrics_migration(pr->pl->router->resil, "completed");
    if (pr->phase == PH_HOLDING) {
        /* Ends when prefill's logprobs release the held events. */
        baton__pr_set_phase(pr, PH_HELD_END, "decode_ended_holding");
        return;
    }
    flush_pending_raw(pr);
    baton__pr_stream_end(pr, 200);
}

/* Prefill is done: release the events held for its logprobs, in order. */
static void release_held(baton__preq_t *pr)
{
    int ended = pr->phase == PH_HELD_END;
    if (pr->phase == PH_HOLDING || ended) {
        /* HELD_END stays until the end below: stream_event_cb holds only in HOLDING. */
        if (!ended)
            baton__pr_set_phase(pr, PH_STREAMING, "logprobs_ready");
        baton_buf_t held = pr->held;
        pr->held = (baton_buf_t)BATON_BUF_INIT;
        baton_sse_splitter_t tmp = BATON_SSE_SPLITTER_INIT;
        if (held.len) /* held holds whole events only: tmp keeps nothing back */
            baton_sse_feed(&tmp, held.data, held.len, stream_event_cb, pr);
        baton_sse_splitter_free(&tmp);
        baton_buf_free(&held);
        baton__pr_account(pr, 0);
    }
    if (ended) {
        flush_pending_raw(pr);
        baton__pr_stream_end(pr, 200);
    } else {
        baton__relay_update_pause(pr);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Buffered answers                                                                         */

int baton__is_2xx(int status)
{
    return status >= 200 && status <= 299;
}

/* A worker's model list as API-key holders see it: the OpenAI fields of each model, nothing of
 * the engine's own (vLLM's "root" is the model's path on the worker). 0, or BATON_EINVAL when
 * the answer is not a JSON object. */
static int models_public(const char *body, size_t len, baton_buf_t *out)
{
    static const char *const keep[] = {"id", "object", "created", "owned_by", "max_model_len"};
    json_t *in = json_loadb(body ? body : "", len, 0, NULL);
    json_t *data = json_object_get(in, "data");
    json_t *list = json_array();
    int rc = json_is_object(in) && list ? 0 : BATON_EINVAL; /* no "data": an empty list */
    size_t i;
    json_t *m;
    json_array_foreach(data, i, m)
    {
        json_t *o = json_object();
        for (size_t k = 0; o && json_is_object(m) && k < sizeof(keep) / sizeof(*keep); k++) {
            json_t *v = json_object_get(m, keep[k]);
            if (v && (json_is_string(v) || json_is_integer(v)))
                json_object_set(o, keep[k], v);
        }
        if (!o || json_array_append_new(list, o))
            rc = BATON_ENOMEM;
    }
    json_t *res = rc ? NULL : json_pack("{s:s,s:O}", "object", "list", "data", list);
    rc = rc ? rc : res ? baton_pdreq_dump(res, out) : BATON_ENOMEM;
    json_decref(res);
    json_decref(list);
    json_decref(in);
    return rc;
}

void baton__relay_main_body_done(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_MAIN];
    const char *ctype = u->ctype[0] ? u->ctype : "application/json";
    if (baton__is_2xx(u->status) && baton__pr_streamed(pr)) {
        /* a continuation answered, but not with a stream: the client's stream cannot take it */
        baton__side_failed(pr, u, BATON_EUPSTREAM);
        return;
    }
    if (!baton__is_2xx(u->status)) {
        baton__main_status_failed(pr, u, ctype);
        return;
    }
    if (pr->mode == MODE_FORWARD && strcmp(pr->route, "/v1/models") == 0) {
        baton_buf_reset(&pr->scratch);
        if (models_public(u->resp.data, u->resp.len, &pr->scratch) != 0) {
            baton__pr_respond_error(pr, 502, "the worker's model list is not understood",
                                    "upstream_error", "worker_failed");
            return;
        }
        baton__pr_respond(pr, 200, "application/json", pr->scratch.data, pr->scratch.len);
        return;
    }
    if (pr->mode == MODE_PD && pr->pd.logprobs) {
        if (!pr->lp_ready) {
            baton__pr_set_phase(pr, PH_WAIT_PREFILL, "decode_done_first");
            return;
        }
        baton_buf_reset(&pr->scratch);
        if (pr->lp && baton_pdreq_merge_body(pr->lp, u->resp.data, u->resp.len, &pr->scratch) > 0) {
            baton__pr_respond(pr, u->status, ctype, pr->scratch.data, pr->scratch.len);
            return;
        }
    }
    note_response(pr, u->resp.data, u->resp.len);
    if (pr->resp_conv && u->resp.data)
        baton_resp_history_note(pr->resp_conv, u->resp.data, u->resp.len);
    baton__pr_respond(pr, u->status, ctype, u->resp.data ? u->resp.data : "", u->resp.len);
}

void baton__relay_prefill_ok(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_PREFILL];
    if (pr->pd.logprobs) {
        pr->lp = baton_pdreq_lp_extract(u->resp.data, u->resp.len);
        pr->lp_bytes = pr->lp ? u->resp.len : 0;
        baton_buf_free(&u->resp);
    }
    pr->lp_ready = 1;
    if (baton__pr_streamed(pr)) {
        if (!pr->lp && !pr->pd.batch)
            pr->lp_pass = 1; /* nothing to merge: events pass untouched */
        release_held(pr);
    } else if (pr->phase == PH_WAIT_PREFILL) {
        baton__relay_main_body_done(pr);
    }
}
