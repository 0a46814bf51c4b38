/* proxy_relay.c — what the client receives: responses recorded in the metrics, decode's SSE
 * stream passed through with back-pressure, prefill's input logprobs merged in front (events
 * held until prefill answers), buffered answers passed on. */
#include "router/dataplane/proxy_internal.h"

#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/clock.h"

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
        baton__respond(pr->pl->router, req, pr->route, status, ctype, body, len);
}

void baton__pr_respond_error(baton__preq_t *pr, int status, const char *message, const char *type,
                             const char *code)
{
    baton_http_req_t *req = take_req(pr, "respond_error");
    if (req)
        baton__respond_error(pr->pl->router, req, pr->route, status, message, type, NULL, code);
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
    baton_http_stream_write(pr->req, data, len);
    if (!pr->bp_paused && baton_http_write_queue_size(pr->req) > BATON_PROXY_STREAM_HIGH_WATER) {
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
    int rc = baton_pdreq_merge_event(pr->lp, payload, plen, &pr->merged_mask, &pr->scratch);
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

static void flush_pending_raw(baton__preq_t *pr)
{
    if (baton_sse_pending(&pr->sse)) {
        client_write(pr, pr->sse.pending.data, pr->sse.pending.len);
        baton_sse_splitter_free(&pr->sse);
    }
}

void baton__relay_stream_bytes(baton__preq_t *pr, const char *data, size_t len)
{
    int holding = pr->phase == PH_HOLDING;
    if (pr->mode != MODE_PD || !pr->pd.logprobs || (pr->lp_pass && !holding)) {
        client_write(pr, data, len);
        return;
    }
    if (baton_sse_feed(&pr->sse, data, len, stream_event_cb, pr) < 0) {
        baton__finish_error(pr, 500, "router out of memory while streaming", "server_error",
                            "internal_error", "router_error");
        return;
    }
    if (pr->lp_pass && pr->phase != PH_HOLDING)
        flush_pending_raw(pr);
}

void baton__relay_stream_done(baton__preq_t *pr)
{
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
    }
    if (pr->lp_pass)
        flush_pending_raw(pr);
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

void baton__relay_main_body_done(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_MAIN];
    const char *ctype = u->ctype[0] ? u->ctype : "application/json";
    if (!baton__is_2xx(u->status)) {
        baton__main_status_failed(pr, u, ctype);
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
    baton__pr_respond(pr, u->status, ctype, u->resp.data ? u->resp.data : "", u->resp.len);
}

void baton__relay_prefill_ok(baton__preq_t *pr)
{
    baton__upstream_t *u = pr->up[UP_PREFILL];
    if (pr->pd.logprobs) {
        pr->lp = baton_pdreq_lp_extract(u->resp.data, u->resp.len);
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
