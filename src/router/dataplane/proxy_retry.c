/* proxy_retry.c — failures of a proxied request: what the client is told (JSON before the
 * stream, an SSE error event after, or decode's own answer), retries with a new pair after a
 * jittered back-off, the other side cancelled at once, answers deferred until nothing in flight
 * borrows the client's body, and blame for the breakers. */
#include "router/dataplane/proxy_internal.h"
#include "router/dataplane/migrate.h"
#include "router/dataplane/responses.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dataplane/retry.h"

/* ---------------------------------------------------------------------------------------- */
/* Failures decided for the client                                                          */

void baton__fail_free(baton__fail_t *f)
{
    free(f->msg);
    baton_buf_free(&f->body);
    memset(f, 0, sizeof(*f));
}

static void fail_set_error(baton__preq_t *pr, int status, const char *msg, const char *type,
                           const char *code)
{
    baton__fail_free(&pr->fail);
    pr->fail.kind = FAIL_ERROR;
    pr->fail.status = status;
    pr->fail.type = type;
    pr->fail.code = code;
    pr->fail.msg = strdup(msg); /* NULL: a generic message is used */
}

/* Sends the stored failure now: JSON before the stream started, else an SSE error event and
 * [DONE]; decode's own answer is passed through as it came. */
static void emit_failure(baton__preq_t *pr)
{
    baton__fail_t *f = &pr->fail;
    if (!pr->req)
        return;
    int streamed = baton__pr_streamed(pr);
    if (f->kind == FAIL_PASS && !streamed) {
        baton__pr_respond(pr, f->status, f->ctype[0] ? f->ctype : "application/json",
                          f->body.data ? f->body.data : "", f->body.len);
        return;
    }
    const char *msg = f->msg ? f->msg : "upstream request failed";
    const char *type = f->kind == FAIL_ERROR ? f->type : "upstream_error";
    const char *code = f->kind == FAIL_ERROR ? f->code : "upstream_error";
    int status = f->kind == FAIL_NONE ? 502 : f->status;
    if (streamed && pr->mig && pr->mig->migrations)
        baton_resil_metrics_migration(pr->pl->router->resil, "failed");
    if (streamed) {
        /* Only whole events went out (proxy_relay.c): the part of one still held is dropped,
         * so the error event is an event of its own that every SSE parser sees. */
        baton_sse_splitter_free(&pr->sse);
        baton_buf_t ev = BATON_BUF_INIT;
        if ((pr->pd.api == BATON_API_RESPONSES
                 ? baton_responses_error_event(&ev, msg, code, pr->events_out)
                 : baton_sse_error_event(&ev, msg, type, code)) == 0)
            baton_http_stream_write(pr->req, ev.data, ev.len);
        baton_buf_free(&ev);
        baton__pr_stream_end(pr, 200);
    } else {
        baton__pr_respond_error(pr, status, msg, type, code);
    }
}

void baton__finish_failure(baton__preq_t *pr, const char *abort_reason)
{
    baton__pr_cancel_all(pr, abort_reason);
    /* Regular attempts send the client's own body bytes, which live as long as the client
     * request; PD attempts send their own serialized body, and forwarding sends none. */
    if (pr->borrowed && pr->pending) {
        if (!baton__pr_decided(pr))
            baton__pr_set_phase(pr, PH_FAIL_DEFERRED, abort_reason);
        return;
    }
    emit_failure(pr);
}

void baton__finish_error(baton__preq_t *pr, int status, const char *msg, const char *type,
                         const char *code, const char *abort_reason)
{
    if (!baton__pr_decided(pr))
        fail_set_error(pr, status, msg, type, code);
    baton__finish_failure(pr, abort_reason);
}

void baton__run_deferred(baton__preq_t *pr)
{
    if (!pr->req || pr->pending)
        return;
    if (pr->phase == PH_FAIL_DEFERRED) {
        emit_failure(pr);
    } else if (pr->phase == PH_ABORTED) {
        if (baton__pr_streamed(pr))
            baton__pr_stream_end(pr, 499); /* the client is gone: this only finishes it */
        else
            baton__pr_respond_error(pr, 499, "client closed the request", "invalid_request_error",
                                    "client_closed");
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Retries                                                                                  */

static void avoid_add(baton__preq_t *pr, baton_worker_t *w)
{
    if (baton_workers_contain(pr->avoid, pr->n_avoid, w))
        return;
    if (pr->n_avoid == pr->cap_avoid) {
        size_t cap = pr->cap_avoid ? pr->cap_avoid * 2 : 4;
        baton_worker_t **a = realloc(pr->avoid, cap * sizeof(*a));
        if (!a)
            return; /* avoiding is best effort */
        pr->avoid = a;
        pr->cap_avoid = cap;
    }
    baton_worker_ref(w);
    pr->avoid[pr->n_avoid++] = w;
}

/* Drops the current attempt: its in-flight requests are closed now and freed when they report;
 * per-attempt response state is reset. Its workers are avoided by the next pick (only the
 * failed one's when `failed` is set: a migration keeps its innocent side a candidate). */
static void abandon_attempt(baton__preq_t *pr, const char *abort_reason,
                            const baton__upstream_t *failed)
{
    for (int i = 0; i < 2; i++) {
        baton__upstream_t *u = pr->up[i];
        if (!u)
            continue;
        pr->up[i] = NULL;
        if (!failed || u == failed)
            avoid_add(pr, u->w);
        if (u->creq) {
            baton__up_cancel(u, abort_reason);
            u->stale = 1;
        } else {
            baton__up_free(u);
        }
    }
    pr->bp_paused = 0;
    pr->lp_ready = pr->lp_pass = 0;
    baton_pdreq_lp_free(pr->lp);
    pr->lp = NULL;
    pr->lp_bytes = 0;
    baton_sse_splitter_free(&pr->sse);
    baton_buf_free(&pr->held);
}

/*
 * A failure of side u (err < 0: transport; err 0: u->status) was decided and stored in pr->fail.
 * Returns 1 when a retry with a new pair was scheduled instead of answering the client: only
 * before anything reached the client (SENT, WAIT_PREFILL).
 */
static int try_retry(baton__preq_t *pr, baton__upstream_t *u, int err)
{
    baton_router_t *r = pr->pl->router;
    if ((pr->phase != PH_SENT && pr->phase != PH_WAIT_PREFILL) || pr->ttfb_ns || pr->no_retry ||
        pr->mode == MODE_FORWARD)
        return 0;
    uint64_t now = uv_hrtime();
    /* An attempt's total limit that is not the request's own deadline is a phase limit (the
     * prefill timeout): retryable like any phase timeout. */
    int cls = err == BATON_ETIMEOUT_TOTAL && baton__pr_ms_left(pr, now) > BATON_PROXY_MIN_ATTEMPT_MS
                  ? BATON_ETIMEOUT_FIRST_BYTE
                  : err;
    baton_retry_reason_t why = baton_retry_classify(cls, err ? 0 : u->status);
    if (why == BATON_RETRY_NO)
        return 0;
    const baton_config_t *cfg = r->cfg;
    baton_retry_policy_t pol = {cfg->max_retries, cfg->retry_backoff_ms, cfg->retry_backoff_max_ms,
                                cfg->retry_budget_ms};
    uint64_t elapsed = now > pr->req->start_ns ? (now - pr->req->start_ns) / 1000000u : 0;
    uint64_t delay = 0;
    baton_retry_plan_t plan =
        baton_retry_plan(&pol, pr->attempts - 1, elapsed, baton__pr_ms_left(pr, now),
                         BATON_PROXY_MIN_ATTEMPT_MS, baton_rand_u64(), &delay);
    if (plan != BATON_RETRY_PLAN_GO) {
        if (pol.max_retries > 0)
            baton_resil_metrics_retries_exhausted(
                r->resil, plan == BATON_RETRY_PLAN_EXHAUSTED ? "max_retries" : "out_of_time");
        return 0;
    }
    baton_resil_metrics_retry(r->resil, u->w->role, baton_retry_reason_name(why));
    log_info("router",
             "retry route=%s attempt=%u side=%s worker=%s reason=%s err=%s status=%d "
             "delay_ms=%llu",
             pr->route, pr->attempts + 1, baton__side_name(u), u->w->url,
             baton_retry_reason_name(why), err ? baton_err_name(err) : "-", u->status,
             (unsigned long long)delay);
    abandon_attempt(pr, "peer_failed", NULL);
    baton__pr_set_phase(pr, PH_RETRY_WAIT, baton_retry_reason_name(why));
    baton__pr_timer_start(pr, delay);
    return 1;
}

void baton__retry_fire(baton__preq_t *pr)
{
    baton_router_t *r = pr->pl->router;
    /* The new attempt owns the outcome; the last one's failure is kept aside for the case no
     * pair can be picked. */
    baton__fail_t last = pr->fail;
    memset(&pr->fail, 0, sizeof(pr->fail));
    int missing_prefill;
    enum baton__start_rc rc = baton__start_attempt(pr, &missing_prefill);
    if (rc == ST_STARTED) {
        baton__fail_free(&last);
    } else if (rc == ST_NOMEM) {
        baton__fail_free(&last);
        baton__finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                            "router_error");
    } else {
        if (baton__pr_streamed(pr)) /* a migration found no worker to go on with */
            baton_resil_metrics_migration(r->resil, "no_worker");
        else
            baton_resil_metrics_retries_exhausted(r->resil, "no_worker");
        baton__fail_free(&pr->fail);
        pr->fail = last;
        baton__finish_failure(pr, "peer_failed");
    }
}

int baton__is_timeout(int err)
{
    return err == BATON_ETIMEOUT_CONNECT || err == BATON_ETIMEOUT_FIRST_BYTE ||
           err == BATON_ETIMEOUT_IDLE || err == BATON_ETIMEOUT_TOTAL || err == BATON_ETIMEOUT;
}

void baton__side_failed(baton__preq_t *pr, baton__upstream_t *u, int err)
{
    /* Static codes: a deferred failure keeps the pointer. */
    static const char *const codes[BATON_ROLE_COUNT][4] = {
        {"prefill_unavailable", "prefill_timeout", "prefill_failed", "prefill_error"},
        {"decode_unavailable", "decode_timeout", "decode_failed", "decode_error"},
        {"worker_unavailable", "worker_timeout", "worker_failed", "worker_error"},
    };
    enum { C_UNAVAILABLE, C_TIMEOUT, C_FAILED, C_STATUS } ci;
    char msg[512];
    const char *side = baton__side_name(u);
    int status;

    if (err) {
        if (err == BATON_ECONNECT || err == BATON_ETIMEOUT_CONNECT || err == BATON_ETLS) {
            status = err == BATON_ETIMEOUT_CONNECT ? 504 : 502;
            ci = C_UNAVAILABLE;
        } else if (baton__is_timeout(err)) { /* the connect timeout was taken above */
            status = 504;
            ci = C_TIMEOUT;
        } else if (err == BATON_ESHUTDOWN) {
            status = 503;
            ci = C_UNAVAILABLE;
        } else {
            status = err == BATON_ENOMEM ? 500 : 502;
            ci = C_FAILED;
        }
        /* Clients see the role and the worker id, never its address (the log line below
         * keeps the URL for operators). */
        if (err == BATON_ESHUTDOWN)
            snprintf(msg, sizeof(msg), "%s worker %s was removed and its drain deadline passed",
                     side, u->w->id);
        else if (err == BATON_ETLS) /* the reason is in the log and metrics, not the address */
            snprintf(msg, sizeof(msg),
                     "%s worker failed: TLS handshake or certificate "
                     "verification failed",
                     side);
        else if (err == BATON_ETOOBIG) /* the operator's limit: say which */
            snprintf(msg, sizeof(msg),
                     "%s worker %s failed: its answer does not fit the router's buffer "
                     "(--max-buffered-bytes)",
                     side, u->w->id);
        else
            snprintf(msg, sizeof(msg), "%s worker %s failed: %s", side, u->w->id,
                     baton_strerror(err));
    } else {
        /* The worker's own error: its status, with the start of its body. */
        int n = u->resp.len < 200 ? (int)u->resp.len : 200;
        snprintf(msg, sizeof(msg), "%s worker %s returned HTTP %d%s%.*s", side, u->w->id, u->status,
                 n ? ": " : "", n, u->resp.data ? u->resp.data : "");
        status = u->status >= 400 && u->status <= 599 ? u->status : 502;
        ci = C_STATUS;
    }
    /* Clients can provoke this at will (requests a worker fails): rate-limited per site. */
    log_warn_limited("router", "upstream_failed",
                     "upstream_failed route=%s side=%s worker=%s err=%s status=%d streaming=%d "
                     "attempt=%u",
                     pr->route, side, u->w->url, err ? baton_err_name(err) : "-", u->status,
                     baton__pr_streamed(pr), pr->attempts);
    unsigned role = (unsigned)u->w->role < BATON_ROLE_COUNT ? (unsigned)u->w->role : 2;
    if (!baton__pr_decided(pr))
        fail_set_error(pr, status, msg, "upstream_error", codes[role][ci]);
    if (try_retry(pr, u, err) || baton__try_migrate(pr, u))
        return;
    baton__finish_failure(pr, err == BATON_ENOMEM || err == BATON_ETOOBIG ? "router_error"
                                                                          : "peer_failed");
}

void baton__main_status_failed(baton__preq_t *pr, baton__upstream_t *u, const char *ctype)
{
    baton__up_cancel(pr->up[UP_PREFILL], "peer_failed");
    log_info("router", "upstream_status route=%s side=%s worker=%s status=%d attempt=%u", pr->route,
             baton__side_name(u), u->w->url, u->status, pr->attempts);
    /* Decode's own answer goes to the client as it came, unless a retry does better. */
    baton__fail_free(&pr->fail);
    pr->fail.kind = FAIL_PASS;
    pr->fail.status = u->status;
    snprintf(pr->fail.ctype, sizeof(pr->fail.ctype), "%s", ctype);
    pr->fail.body = u->resp;
    u->resp = (baton_buf_t)BATON_BUF_INIT;
    if (try_retry(pr, u, 0) || baton__try_migrate(pr, u))
        return;
    baton__finish_failure(pr, "peer_failed");
}

/* ---------------------------------------------------------------------------------------- */
/* Migration: a stream goes on on another worker                                            */

/* Whether the attempt's way of sending the request carries the continuation: a regular
 * worker's body, and every PD protocol's decode leg (baton_pdreq_inject, pdproto.c). */
static int carries_continuation(const baton__preq_t *pr)
{
    return pr->mode == MODE_REGULAR || pr->mode == MODE_PD;
}

int baton__stream_answer(baton__preq_t *pr, baton__upstream_t *u, int capable)
{
    baton_router_t *r = pr->pl->router;
    if (!baton__pr_streamed(pr)) {
        baton__pr_stream_start(pr);
        if (capable && r->cfg->migration_limit > 0 && carries_continuation(pr))
            pr->mig = baton_mig_new(&pr->pd); /* NULL: this stream cannot be continued */
        if (pr->mig)
            pr->mig->capable = 1;
        return 0;
    }
    /* A continuation's answer: a worker that does not take it would start over. */
    if (!capable || !carries_continuation(pr)) {
        log_warn_limited("router", "migration_refused",
                         "migration_refused route=%s worker=%s (it does not take continuations)",
                         pr->route, u->w->url);
        baton__up_cancel(u, "peer_failed");
        baton__side_failed(pr, u, BATON_EUPSTREAM);
        return -1;
    }
    baton__pr_set_phase(pr, PH_STREAMING, "migrated");
    return 0;
}

static int all_finished(const baton_mig_t *m)
{
    for (size_t i = 0; i < m->n_seq; i++)
        if (!m->seq[i].finished)
            return 0;
    return 1;
}

int baton__try_migrate(baton__preq_t *pr, baton__upstream_t *u)
{
    baton_router_t *r = pr->pl->router;
    baton_mig_t *m = pr->mig;
    /* The main side broke, or the prefill of a migration's pair failed before its decode
     * answered (SENT: the decode waits for a KV hand-off that will not come). */
    if (!m || !u || (u->side != UP_MAIN && pr->phase != PH_SENT) || !pr->req ||
        baton__pr_decided(pr) || !baton__pr_streamed(pr) || !baton_mig_possible(m) || pr->no_retry)
        return 0;
    if (all_finished(m) && (m->usage || m->api == BATON_API_GENERATE)) {
        /* Everything but [DONE] went out: the stream is ended here (the part of an event that
         * never ended is dropped). */
        baton_sse_splitter_free(&pr->sse);
        baton__pr_cancel_all(pr, "peer_failed");
        baton_http_stream_write(pr->req, "data: [DONE]\n\n", 14);
        m->done = 1;
        baton_resil_metrics_migration(r->resil, "finished");
        baton__pr_stream_end(pr, 200);
        return 1;
    }
    const baton_config_t *cfg = r->cfg;
    baton_retry_policy_t pol = {cfg->migration_limit, cfg->retry_backoff_ms,
                                cfg->retry_backoff_max_ms, cfg->retry_budget_ms};
    uint64_t now = uv_hrtime();
    uint64_t elapsed = now > pr->req->start_ns ? (now - pr->req->start_ns) / 1000000u : 0;
    uint64_t delay = 0;
    baton_retry_plan_t plan =
        baton_retry_plan(&pol, m->migrations, elapsed, baton__pr_ms_left(pr, now),
                         BATON_PROXY_MIN_ATTEMPT_MS, baton_rand_u64(), &delay);
    if (plan != BATON_RETRY_PLAN_GO) {
        baton_resil_metrics_migration(r->resil,
                                      plan == BATON_RETRY_PLAN_EXHAUSTED ? "limit" : "out_of_time");
        return 0;
    }
    if (baton_mig_build(m) != 0)
        return 0;
    m->migrations++;
    baton_resil_metrics_migration(r->resil, "started");
    log_info("router", "migrate route=%s migration=%u worker=%s err=%s status=%d delay_ms=%llu",
             pr->route, m->migrations, u->w->url, u->err ? baton_err_name(u->err) : "-", u->status,
             (unsigned long long)delay);
    abandon_attempt(pr, "peer_failed", u);
    pr->pd.extra = &m->member; /* every later body carries it (PD: baton_pdreq_inject) */
    baton__pr_set_phase(pr, PH_RETRY_WAIT, "migrate");
    baton__pr_timer_start(pr, delay);
    return 1;
}

/* ---------------------------------------------------------------------------------------- */
/* Blame                                                                                    */

/* Case-insensitive search in the first 4 KiB of a response body. */
static int body_mentions(const baton_buf_t *b, const char *word)
{
    size_t n = b->len < 4096 ? b->len : 4096, wl = strlen(word);
    for (size_t i = 0; b->data && i + wl <= n; i++)
        if (strncasecmp(b->data + i, word, wl) == 0)
            return 1;
    return 0;
}

/*
 * A decode's 5xx that is about the KV hand-off (SGLang's bootstrap, a KV transfer) reports its
 * prefill peer's failure, not its own: baton-worker's bootstrap_unreachable /
 * bootstrap_peer_down / bootstrap_timeout / bootstrap_aborted, SGLang's KVTransferError. Such
 * an answer counts for neither worker's breaker (the request is still retried).
 */
int baton__blames_prefill(const baton__preq_t *pr, const baton__upstream_t *u, int err)
{
    if (pr->mode != MODE_PD || u->side != UP_MAIN || u->stale || err || u->status < 500)
        return 0;
    return body_mentions(&u->resp, "bootstrap") || body_mentions(&u->resp, "kvtransfer") ||
           body_mentions(&u->resp, "kv transfer") || body_mentions(&u->resp, "kv_transfer");
}
