/* proxy.c — a proxied request's state machine: its phases and the one function that changes
 * them, its life time, the upstream and client events that drive it, and the entry points
 * (inference requests, GET forwarding). The other concerns are in proxy_*.c. */
#include "router/dataplane/proxy_internal.h"
#include "router/dataplane/migrate.h"
#include "router/dataplane/models.h"
#include "router/dataplane/proxy_pd.h"
#include "router/dataplane/resp_history.h"
#include "router/dataplane/route_ctx.h"
#include "router/dataplane/rtok_req.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "baton/error.h"
#include "common/log.h"

/* ---------------------------------------------------------------------------------------- */
/* Phases                                                                                   */

#define B(ph) BATON_PHASE_BIT(ph)
/* What follows every phase: the live phases may all be decided (FAIL_DEFERRED when the
 * failure waits for in-flight requests that borrow the client's body, ABORTED when the
 * client goes away, DONE when the answer goes out now). */
#define DECIDED (B(PH_FAIL_DEFERRED) | B(PH_ABORTED) | B(PH_DONE))
static const uint32_t phase_next[PH_COUNT] = {
    /* Leaving the queue is always to NEW: from there it is dispatched, queued again (at the
     * head), or answered (timeout, shutdown, client gone). */
    [PH_NEW] = B(PH_QUEUED) | B(PH_SENT) | B(PH_ABORTED) | B(PH_DONE),
    [PH_QUEUED] = B(PH_NEW),
    [PH_SENT] = B(PH_STREAMING) | B(PH_WAIT_PREFILL) | B(PH_RETRY_WAIT) | DECIDED,
    /* Prefill may still fail (retried: nothing reached the client). */
    [PH_WAIT_PREFILL] = B(PH_RETRY_WAIT) | DECIDED,
    /* RETRY_WAIT from STREAMING: the stream goes on on another worker (a migration). */
    [PH_STREAMING] = B(PH_HOLDING) | B(PH_RETRY_WAIT) | DECIDED,
    [PH_HOLDING] = B(PH_STREAMING) | B(PH_HELD_END) | DECIDED,
    [PH_HELD_END] = DECIDED,
    [PH_RETRY_WAIT] = B(PH_SENT) | DECIDED,
    /* The client may still go away while a decided failure waits. */
    [PH_FAIL_DEFERRED] = B(PH_ABORTED) | B(PH_DONE),
    [PH_ABORTED] = B(PH_DONE),
    [PH_DONE] = 0,
};
#undef DECIDED
#undef B

static const char *const phase_names[PH_COUNT] = {
    [PH_NEW] = "new",
    [PH_QUEUED] = "queued",
    [PH_SENT] = "sent",
    [PH_WAIT_PREFILL] = "wait_prefill",
    [PH_STREAMING] = "streaming",
    [PH_HOLDING] = "holding",
    [PH_HELD_END] = "held_end",
    [PH_RETRY_WAIT] = "retry_wait",
    [PH_FAIL_DEFERRED] = "fail_deferred",
    [PH_ABORTED] = "aborted",
    [PH_DONE] = "done",
};

const baton_phase_table_t baton__proxy_phases = {"router", "proxy_phase", PH_COUNT, phase_next,
                                                 phase_names};

int baton__proxy_phase_allowed(baton__proxy_phase_t from, baton__proxy_phase_t to)
{
    return baton_phase_legal(&baton__proxy_phases, from, to);
}

const char *baton__proxy_phase_name(baton__proxy_phase_t ph)
{
    return baton_phase_name(&baton__proxy_phases, ph);
}

int baton__pr_set_phase(baton__preq_t *pr, baton__proxy_phase_t to, const char *why)
{
    baton__proxy_phase_t from = pr->phase;
    /* DONE is the client request finished: the one who finished it cleared pr->req. */
    if (!baton__proxy_phase_allowed(from, to) || (to == PH_DONE) != (pr->req == NULL)) {
        pr->pl->phase_refused++;
        return baton_phase_refuse(&baton__proxy_phases, from, to, "route=%s why=%s", pr->route,
                                  why);
    }
    /* The request timer serves QUEUED (queue timeout) and RETRY_WAIT (back-off) only. */
    if (from == PH_QUEUED || from == PH_RETRY_WAIT)
        baton__pr_timer_stop(pr);
    pr->phase = to;
    log_debug("router", "proxy_phase route=%s %s->%s why=%s", pr->route,
              baton__proxy_phase_name(from), baton__proxy_phase_name(to), why);
    return 0;
}

int baton__pr_decided(const baton__preq_t *pr)
{
    return pr->phase == PH_FAIL_DEFERRED || pr->phase == PH_ABORTED || pr->phase == PH_DONE;
}

int baton__pr_streamed(const baton__preq_t *pr)
{
    return pr->ttfb_ns != 0;
}

uint64_t baton__pr_ms_left(const baton__preq_t *pr, uint64_t now_ns)
{
    if (!pr->deadline_ns)
        return UINT64_MAX;
    return pr->deadline_ns > now_ns ? (pr->deadline_ns - now_ns) / 1000000u : 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Request life time                                                                        */

static size_t pr_held_bytes(const baton__preq_t *pr)
{
    size_t n = baton_sse_pending(&pr->sse) + pr->held.len + pr->fail.body.len + pr->lp_bytes;
    for (int i = 0; i < 2; i++)
        if (pr->up[i])
            n += pr->up[i]->resp.len;
    return n;
}

static void budget_move(baton_http_budget_t *b, size_t from, size_t to)
{
    if (to > from) {
        atomic_fetch_add(&b->used, to - from);
        atomic_fetch_add(&b->upstream_used, to - from);
    } else if (to < from) {
        atomic_fetch_sub(&b->used, from - to);
        atomic_fetch_sub(&b->upstream_used, from - to);
    }
}

int baton__pr_account(baton__preq_t *pr, size_t extra)
{
    baton_http_budget_t *b = pr->pl->router->budget;
    size_t now = pr_held_bytes(pr) + extra;
    if (!b || now == pr->charged)
        return 0;
    budget_move(b, pr->charged, now);
    int grew = now > pr->charged;
    pr->charged = now;
    if (!grew || !b->max || atomic_load(&b->used) <= b->max)
        return 0;
    /* Over the budget. Small answers still pass while bodies fill it (as small bodies have
     * their reserve), up to an eighth of it for all of them together. */
    size_t small = b->max / 64 < BATON_PROXY_SMALL_ANSWER ? b->max / 64 : BATON_PROXY_SMALL_ANSWER;
    if (now <= small && atomic_load(&b->upstream_used) <= b->max / 8)
        return 0;
    return BATON_ETOOBIG;
}

static void pr_free(baton__preq_t *pr)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (r->budget)
        budget_move(r->budget, pr->charged, 0);
    pr->charged = 0;
    for (int i = 0; i < 2; i++)
        baton__up_free(pr->up[i]);
    baton_workers_unref(pr->avoid, pr->n_avoid);
    free(pr->avoid);
    baton_pdreq_free(&pr->pd);
    baton_mig_free(pr->mig);
    free(pr->resp_conv);
    baton_buf_free(&pr->resp_body);
    baton_route_ctx_free(&pr->rctx);
    baton_pdreq_lp_free(pr->lp);
    baton_sse_splitter_free(&pr->sse);
    baton_buf_free(&pr->held);
    baton_buf_free(&pr->scratch);
    baton__fail_free(&pr->fail);
    baton_list_remove(&pr->link);
    pl->active--;
    int slot = pr->slot;
    baton__pl_free(pl, BATON__SPARE_PREQ, pr);
    if (slot && r->admission) {
        baton_resil_metrics_active(r->resil, -1);
        baton_admission_release(r->admission);
    }
}

static void on_pr_timer_closed(uv_handle_t *h)
{
    pr_free(h->data);
}

void baton__pr_maybe_free(baton__preq_t *pr)
{
    if (pr->req || pr->pending || pr->tstate == TS_CLOSING)
        return;
    if (pr->tstate == TS_OPEN) {
        pr->tstate = TS_CLOSING;
        uv_close((uv_handle_t *)&pr->timer, on_pr_timer_closed);
        return;
    }
    pr_free(pr);
}

/* One timer per request; what its expiry means follows the phase. */
static void on_pr_timer(uv_timer_t *t)
{
    baton__preq_t *pr = t->data;
    if (pr->phase == PH_QUEUED)
        baton__queue_timeout(pr);
    else if (pr->phase == PH_RETRY_WAIT)
        baton__retry_fire(pr);
    baton__pr_maybe_free(pr);
}

void baton__pr_timer_start(baton__preq_t *pr, uint64_t ms)
{
    if (pr->tstate == TS_CLOSED_NEVER) {
        uv_timer_init(pr->pl->loop, &pr->timer);
        pr->timer.data = pr;
        pr->tstate = TS_OPEN;
    }
    uv_timer_start(&pr->timer, on_pr_timer, ms, 0);
}

void baton__pr_timer_stop(baton__preq_t *pr)
{
    if (pr->tstate == TS_OPEN)
        uv_timer_stop(&pr->timer);
}

/* ---------------------------------------------------------------------------------------- */
/* Client events                                                                            */

static void on_client_abort(baton_http_req_t *req)
{
    baton__preq_t *pr = req->data;
    log_debug("router", "client_abort route=%s peer=%s", pr->route, req->peer);
    baton__queue_remove(pr, 1);
    if (pr->phase != PH_ABORTED)
        baton__pr_set_phase(pr, PH_ABORTED, "client_closed"); /* stops a back-off timer */
    baton__pr_cancel_all(pr, "client_closed");
    baton__run_deferred(pr); /* finishes now when nothing is in flight */
    baton__pr_maybe_free(pr);
}

static void on_client_drain(baton_http_req_t *req)
{
    baton__preq_t *pr = req->data;
    if (pr->bp_paused) {
        pr->bp_paused = 0;
        baton__relay_update_pause(pr);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Upstream events                                                                          */

/*
 * Prefill failed after decode began streaming tokens: decode had its KV by then (it streams
 * only after the hand-off), so its answer is right and stays; ending it would turn a good
 * answer into an error. Only when prefill's logprobs are still needed is the stream failed.
 * A migration's pair whose decode has not answered yet (SENT) is not late: its decode waits
 * for that prefill's KV.
 */
static int prefill_failure_is_late(const baton__preq_t *pr)
{
    return baton__pr_streamed(pr) && !pr->pd.logprobs && pr->phase != PH_SENT;
}

void baton__proxy_on_head(baton_http_creq_t *creq, int status, const baton_http_header_t *headers,
                          size_t n_headers)
{
    baton__upstream_t *u = creq->data;
    baton__preq_t *pr = u->pr;
    u->status = status;
    int capable = 0;
    for (size_t i = 0; i < n_headers; i++) {
        if (strcasecmp(headers[i].name, "Content-Type") == 0)
            snprintf(u->ctype, sizeof(u->ctype), "%s", headers[i].value);
        else if (strcasecmp(headers[i].name, BATON_MIG_HEADER) == 0)
            capable = 1;
    }
    u->sse = strncasecmp(u->ctype, "text/event-stream", 17) == 0;
    if (u->cancelled || u->stale || !pr->req)
        return;

    if (u->side == UP_MAIN) {
        if (baton__is_2xx(status) && pr->pd.stream && u->sse && pr->mode != MODE_FORWARD) {
            /* The worker answers: that is its outcome for the breaker (a half-open probe must
             * not wait for the end of a long stream). */
            baton__up_report(u, BATON_OUTCOME_SUCCESS); /* the in-flight slot stays */
            baton__stream_answer(pr, u, capable);
        } else {
            u->buffer = 1;
            if (!baton__is_2xx(status))
                baton__up_cancel(pr->up[UP_PREFILL], "peer_failed"); /* decode's error decides */
        }
    } else if (!baton__is_2xx(status)) {
        /* Prefill refused: decode would wait for a KV hand-off that never comes. (Once decode
         * streams it has its KV: see prefill_failure_is_late.) */
        u->buffer = 1;
        if (!prefill_failure_is_late(pr))
            baton__up_cancel(pr->up[UP_MAIN], "peer_failed");
    }
}

void baton__proxy_on_data(baton_http_creq_t *creq, const char *data, size_t len)
{
    baton__upstream_t *u = creq->data;
    baton__preq_t *pr = u->pr;
    if (u->cancelled || u->stale || !pr->req)
        return;
    if (u->side == UP_MAIN && baton__pr_streamed(pr)) {
        if (pr->pd_ops)
            pr->pd_ops->on_decode_progress(pr);
        baton__relay_stream_bytes(pr, data, len);
        return;
    }
    if (!u->buffer)
        return; /* prefill's answer is read to the end and dropped */
    /* Every buffered byte counts against --max-buffered-bytes: past it the leg fails (502
     * naming the side) rather than the router growing without a bound. */
    if (u->resp.len + len > BATON_PROXY_MAX_UPSTREAM_BODY || baton__pr_account(pr, len) != 0) {
        baton__up_cancel(u, "router_error");
        baton__side_failed(pr, u, BATON_ETOOBIG);
        return;
    }
    if (baton_buf_append(&u->resp, data, len))
        baton__finish_error(pr, 500, "router out of memory buffering a response", "server_error",
                            "internal_error", "router_error");
}

/* The upstream's outcome for its worker's breaker and the metrics. */
static void up_account(baton__preq_t *pr, baton__upstream_t *u, int err)
{
    baton_router_t *r = pr->pl->router;
    /* The passive health signal: connect errors, timeouts, 5xx and early closes count against
     * the worker; 4xx and our own cancels do not. */
    baton_breaker_outcome_t outcome = baton_breaker_outcome(err, u->status);
    if (outcome == BATON_OUTCOME_FAILURE && baton__blames_prefill(pr, u, err)) {
        /* Decode is alive and says its prefill peer failed it: one dead prefill must not open
         * every decode's breaker. Nor is the prefill charged on decode's word: its KV link from
         * that decode may simply be reconnecting (after a restart); a prefill that is really
         * down fails the router's own requests and checks. */
        outcome = BATON_OUTCOME_NEUTRAL;
        baton__upstream_t *p = pr->up[UP_PREFILL];
        log_info("router", "failure_attributed_to_peer route=%s decode=%s prefill=%s status=%d",
                 pr->route, u->w->url, p ? p->w->url : "-", u->status);
    }
    baton__up_settle(u, outcome);
    if (r->admission)
        baton_admission_kick(r->admission); /* a worker has room again */
    if (err && err != BATON_ECANCELED)
        baton_router_metrics_upstream_error(r->metrics, u->w->role,
                                            baton_router_metrics_error_kind(err));
    else if (!err && u->status >= 500)
        baton_router_metrics_upstream_error(r->metrics, u->w->role, "status_5xx");
    if (baton__is_timeout(err) && !u->cancelled)
        baton_resil_metrics_abort(r->resil, u->w->role, "timeout");
}

void baton__proxy_on_done(baton_http_creq_t *creq, int err)
{
    baton__upstream_t *u = creq->data;
    baton__preq_t *pr = u->pr;

    u->creq = NULL;
    u->err = err;
    pr->pending--;
    up_account(pr, u, err);

    if (u->stale) {
        baton__up_free(u);
    } else if (u->cancelled || baton__pr_decided(pr)) {
        /* bookkeeping only: the answer was decided elsewhere */
    } else if (u->side == UP_PREFILL) {
        if (baton__is_2xx(u->status) && !err) {
            /* The protocol's next step (vllm-nixl: the decode leg), else prefill's part is done */
            if (!pr->pd_ops->on_prefill_done(pr, u))
                baton__relay_prefill_ok(pr);
        } else if (prefill_failure_is_late(pr)) {
            log_warn("router",
                     "prefill_failed_after_stream route=%s worker=%s err=%s status=%d "
                     "(decode's stream continues)",
                     pr->route, u->w->url, err ? baton_err_name(err) : "-", u->status);
            pr->lp_ready = 1;
        } else {
            baton__side_failed(pr, u, err);
        }
    } else if (err) {
        baton__side_failed(pr, u, err);
    } else if (baton__pr_streamed(pr)) {
        if (!baton__try_migrate(pr, u)) /* a stream that ended before [DONE] goes on */
            baton__relay_stream_done(pr);
    } else {
        if (baton__is_2xx(u->status) && pr->pd_ops)
            pr->pd_ops->on_decode_progress(pr); /* decode answered: it read the KV */
        baton__relay_main_body_done(pr);
    }
    baton__run_deferred(pr);
    baton__pr_maybe_free(pr);
}

/* ---------------------------------------------------------------------------------------- */
/* Entry points                                                                             */

static baton__preq_t *pr_new(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                             enum baton__proxy_mode mode)
{
    baton__preq_t *pr = baton__pl_calloc(pl, BATON__SPARE_PREQ);
    if (!pr)
        return NULL;
    pr->pl = pl;
    pr->req = req;
    pr->route = route;
    pr->mode = mode;
    pr->phase = PH_NEW;
    uint64_t total = pl->router->cfg->timeouts.total_ms;
    if (total)
        pr->deadline_ns = req->start_ns + total * 1000000u;
    baton_list_push_front(&pl->live, &pr->link);
    pl->active++;
    req->data = pr;
    req->on_abort = on_client_abort;
    req->on_drain = on_client_drain;
    return pr;
}

/* 1 when a regular worker is registered (eligible or not: a down one is a 503, not a 501). */
static int regular_workers(baton_router_t *r)
{
    size_t counts[BATON_ROLE_COUNT];
    baton_registry_counts(r->registry, counts, NULL);
    return counts[BATON_ROLE_REGULAR] > 0;
}

/* /tokenize, /detokenize: answered here when the router has the model's tokenizer (1), else
 * forwarded to a regular worker like any regular-only API (0). */
static int answer_tokenize(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                           baton_api_t api)
{
    baton_rtok_local_t *L = baton__pl_rtok(pl);
    if (!L || (api != BATON_API_TOKENIZE && api != BATON_API_DETOKENIZE))
        return 0;
    json_t *resp = NULL;
    baton_rtok_refusal_t ref;
    int rc = baton_rtok_api(L, api == BATON_API_DETOKENIZE, req->body, req->body_len, &resp, &ref);
    if (rc == BATON_ENOTFOUND)
        return 0;
    if (rc == 1)
        baton__respond_json(pl->router, req, route, 400,
                            baton_tok_api_error_json(ref.message, ref.param));
    else if (rc)
        baton__respond_error(pl->router, req, route, 500, "router out of memory", "server_error",
                             NULL, "internal_error");
    else
        baton__respond_json(pl->router, req, route, 200, resp);
    return 1;
}

/* The route context, with the prompt's token ids when the router has the model's tokenizer:
 * 0, 1 when refused for its context length (answered), or BATON_ENOMEM. */
static int prepare_ctx(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                       const baton_pdreq_t *pd, baton_route_ctx_t *ctx)
{
    int rc = baton_route_ctx_build(ctx, pl->router, pd, req);
    baton_rtok_local_t *L = rc ? NULL : baton__pl_rtok(pl);
    baton_rtok_refusal_t ref;
    if (L && (rc = baton_rtok_request(L, pd, ctx, &ref)) == 1)
        baton__respond_json(pl->router, req, route, 400,
                            baton_tok_api_error_json(ref.message, ref.param));
    if (rc)
        baton_route_ctx_free(ctx);
    return rc;
}

void baton_proxy_inference(baton_proxy_loop_t *pl, baton_http_req_t *req, baton_api_t api)
{
    baton_router_t *r = pl->router;
    const char *route = baton_api_path(api);
    baton_pdreq_error_t perr;
    baton_pdreq_t pd;
    baton_buf_t expanded = BATON_BUF_INIT; /* a follow-up with its conversation as input */
    char *conv = NULL;

    int rc = api == BATON_API_RESPONSES
                 ? baton_resp_history_prepare(req->body, req->body_len, &expanded, &conv)
                 : 0;
    if (rc == 0)
        rc = expanded.len ? baton_pdreq_parse(&pd, api, expanded.data, expanded.len, &perr)
                          : baton_pdreq_parse(&pd, api, req->body, req->body_len, &perr);
    if (rc == BATON_EINVAL) {
        free(conv);
        baton_buf_free(&expanded);
        baton__respond_error(r, req, route, perr.status, perr.message, "invalid_request_error",
                             perr.param[0] ? perr.param : NULL, perr.code);
        return;
    }
    if (rc) {
        free(conv);
        baton_buf_free(&expanded);
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    /* Until pr owns them, every early answer below frees pd, conv and expanded. */
    if (answer_tokenize(pl, req, route, api)) {
        baton_pdreq_free(&pd);
        free(conv);
        baton_buf_free(&expanded);
        return;
    }
    if (baton_api_regular_only(api) && !regular_workers(r)) {
        baton_pdreq_free(&pd); /* not a Responses request: nothing else to free */
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "%s is served by regular workers only, and this router has none (prefill/decode "
                 "workers do not serve it)",
                 route);
        baton__respond_error(r, req, route, 501, msg, "invalid_request_error", NULL,
                             "unsupported_in_pd_mode");
        return;
    }
    if (baton_models_refuse(r, req, route, &pd)) {
        baton_pdreq_free(&pd);
        free(conv);
        baton_buf_free(&expanded);
        return;
    }
    baton_route_ctx_t ctx;
    if ((rc = prepare_ctx(pl, req, route, &pd, &ctx)) != 0) {
        baton_pdreq_free(&pd);
        free(conv);
        baton_buf_free(&expanded);
        if (rc != 1)
            baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                                 "internal_error");
        return;
    }
    baton__preq_t *pr = pr_new(pl, req, route, MODE_PD);
    if (!pr) {
        baton_route_ctx_free(&ctx);
        baton_pdreq_free(&pd);
        free(conv);
        baton_buf_free(&expanded);
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    baton_pdreq_move(&pr->pd, &pd); /* it points into itself: never a plain copy */
    pr->resp_conv = conv;
    pr->resp_body = expanded; /* pd borrows its bytes, which stay where they are */
    pr->rctx = ctx; /* its strings are its own or the request's, its chain not built yet */
    pr->rctx_built = 1;
    if (baton__try_start(pr, 1) == ST_WAIT) {
        if (baton__queue_add(pr) != 0) {
            baton_resil_metrics_rejected(r->resil, "queue_full");
            /* A client flood hits this once per request: rate-limited (common/log.h). */
            baton_log_limited(BATON_LOG_INFO, 10, "router", "queue_full",
                              "queue_full route=%s peer=%s queued=%u", route, req->peer,
                              r->admission ? baton_admission_queued(r->admission) : 0);
            baton__pr_respond_queue_full(pr);
        }
    }
    baton__pr_maybe_free(pr);
}

/* Forwards req (its method and path, no body) to the worker of pick w (taken over). */
static void forward_picked(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                           baton_pick_t *w)
{
    baton_router_t *r = pl->router;
    baton__preq_t *pr = pr_new(pl, req, route, MODE_FORWARD);
    baton__upstream_t *u = pr ? baton__up_new(pr, UP_MAIN, w) : NULL;
    if (!u) {
        baton_pick_release(r->health, w, BATON_OUTCOME_NEUTRAL);
        if (pr) {
            pr->req = NULL;
            baton__pr_set_phase(pr, PH_DONE, "oom");
            req->data = NULL;
            req->on_abort = NULL;
            req->on_drain = NULL;
            baton__pr_maybe_free(pr);
        }
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    pr->up[UP_MAIN] = u;
    pr->attempts = 1;
    u->buffer = 1;
    baton__pr_set_phase(pr, PH_SENT, "forward");
    int rc = baton__up_start(pr, u, req->method, req->path, NULL, 0);
    if (rc)
        baton__side_failed(pr, u, rc);
    baton__pr_maybe_free(pr);
}

int baton_proxy_forward(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                        const baton_worker_role_t *roles, size_t n_roles)
{
    baton_pick_t w = {0};
    for (size_t i = 0; i < n_roles && !w.w; i++)
        baton__pick(pl->router, roles[i], NULL, 0, 0, NULL, &w);
    if (!w.w)
        return BATON_ENOWORKER;
    forward_picked(pl, req, route, &w);
    return 0;
}

int baton_proxy_forward_to(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                           const char *worker_id)
{
    baton_worker_t *target = baton_registry_get(pl->router->registry, worker_id);
    if (!target)
        return BATON_ENOWORKER;
    baton_route_ctx_t ctx = {.pin = worker_id};
    baton_pick_t w = {0};
    baton__pick(pl->router, target->role, NULL, 0, 0, &ctx, &w);
    baton_route_ctx_free(&ctx);
    baton_worker_unref(target);
    if (!w.w)
        return BATON_ENOWORKER;
    forward_picked(pl, req, route, &w);
    return 0;
}
