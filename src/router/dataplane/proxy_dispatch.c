/* proxy_dispatch.c — starting an attempt: health-aware picks under per-worker caps, a PD pair
 * (one body with a fresh room, sent to both at once) or a regular worker, the upstream requests
 * through the loop's client, and giving back what they hold on their workers. */
#include "router/dataplane/proxy_internal.h"
#include "router/dataplane/proxy_pd.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dataplane/dp_rank.h"
#include "router/dataplane/policy_precise.h"

/* ---------------------------------------------------------------------------------------- */
/* Worker selection (pick.h) with this router's policy, health layer and cap                */

static void pick_release(baton_router_t *r, baton_pick_t *p, baton_breaker_outcome_t outcome)
{
    baton_pick_release(r->health, p, outcome);
}

baton_pick_rc_t baton__pick(baton_router_t *r, baton_worker_role_t role,
                            baton_worker_t *const *avoid, size_t n_avoid, int use_cap,
                            baton_route_ctx_t *ctx, baton_pick_t *out)
{
    return baton_pick_ctx(r->registry, baton_router_policy(r, role), r->health,
                          use_cap ? r->cfg->max_worker_requests : 0, role, avoid, n_avoid, NULL,
                          NULL, ctx, out);
}

static int same_protocol(const baton_worker_t *w, const void *prefill)
{
    return w->pd_protocol == ((const baton_worker_t *)prefill)->pd_protocol;
}

/* A decode for the prefill: one of another protocol could not read its KV at all. */
static baton_pick_rc_t pick_decode_for(baton_router_t *r, baton__preq_t *pr,
                                       const baton_worker_t *prefill, baton_route_ctx_t *ctx,
                                       baton_pick_t *out)
{
    return baton_pick_ctx(r->registry, baton_router_policy(r, BATON_ROLE_DECODE), r->health,
                          r->cfg->max_worker_requests, BATON_ROLE_DECODE, pr->avoid, pr->n_avoid,
                          same_protocol, prefill, ctx, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Upstream requests                                                                        */

static void body_unref(baton__body_t *b)
{
    if (b && --b->refs == 0) {
        baton_buf_free(&b->buf);
        free(b);
    }
}

const char *baton__side_name(const baton__upstream_t *u)
{
    return baton_worker_role_name(u->w->role);
}

/* Gives back the health ticket when its outcome was not reported yet. */
void baton__up_report(baton__upstream_t *u, baton_breaker_outcome_t outcome)
{
    baton_router_t *r = u->pr->pl->router;
    if (u->ticket) {
        if (r->health)
            baton_whealth_done(r->health, u->w, u->ticket, outcome);
        u->ticket = 0;
    }
}

void baton__up_settle(baton__upstream_t *u, baton_breaker_outcome_t outcome)
{
    baton__up_report(u, outcome);
    if (u->reserved) {
        u->reserved = 0;
        baton_pick_unreserve(u->w, u->tokens);
        u->tokens = 0;
    }
    if (u->dp_held) {
        u->dp_held = 0;
        baton_dp_release(u->w, u->dp_rank);
    }
}

void baton__up_free(baton__upstream_t *u)
{
    if (!u)
        return;
    if (u->held)
        u->pd->release(u); /* the decode never read the prefill's blocks */
    baton__up_settle(u, BATON_OUTCOME_NEUTRAL);
    baton_worker_unref(u->w);
    baton_buf_free(&u->resp);
    body_unref(u->body);
    baton__pl_free(u->pr->pl, BATON__SPARE_UP, u);
}

baton__upstream_t *baton__up_new(baton__preq_t *pr, int side, baton_pick_t *p)
{
    baton__upstream_t *u = baton__pl_calloc(pr->pl, BATON__SPARE_UP);
    if (!u)
        return NULL;
    u->pr = pr;
    u->side = side;
    u->w = p->w;
    u->ticket = p->ticket;
    u->reserved = 1;
    u->tokens = p->tokens;
    p->w = NULL;
    p->ticket = 0;
    p->tokens = 0;
    return u;
}

void baton__up_cancel(baton__upstream_t *u, const char *reason)
{
    if (u && u->creq && !u->cancelled) {
        u->cancelled = 1;
        baton_resil_metrics_abort(u->pr->pl->router->resil, u->w->role, reason);
        log_debug("router", "upstream_abort route=%s side=%s worker=%s reason=%s", u->pr->route,
                  baton_worker_role_name(u->w->role), u->w->url, reason);
        u->pr->pl->http->cancel(u->creq);
    }
}

void baton__pr_cancel_all(baton__preq_t *pr, const char *reason)
{
    baton__up_cancel(pr->up[UP_PREFILL], reason);
    baton__up_cancel(pr->up[UP_MAIN], reason);
}

static baton_http_timeouts_t attempt_timeouts(baton__preq_t *pr, int side)
{
    const baton_config_t *cfg = pr->pl->router->cfg;
    baton_http_timeouts_t to = cfg->timeouts;
    if (side == UP_PREFILL && cfg->prefill_timeout_ms) {
        to.first_byte_ms = cfg->prefill_timeout_ms;
        if (!to.total_ms || cfg->prefill_timeout_ms < to.total_ms)
            to.total_ms = cfg->prefill_timeout_ms;
    }
    if (pr->deadline_ns) {
        uint64_t left = baton__pr_ms_left(pr, uv_hrtime());
        if (left == 0)
            left = 1; /* fails at once with ETIMEOUT_TOTAL */
        if (!to.total_ms || left < to.total_ms)
            to.total_ms = left;
    }
    return to;
}

/* printf into buf, or into *heap_p (malloc'd) when it does not fit; NULL when out of memory. */
static const char *fmt_small(char *buf, size_t size, char **heap_p, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, size, fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < size)
        return buf;
    va_start(ap, fmt);
    n = vasprintf(heap_p, fmt, ap);
    va_end(ap);
    if (n < 0)
        *heap_p = NULL;
    return *heap_p;
}

int baton__up_startv(baton__preq_t *pr, baton__upstream_t *u, const char *method, const char *path,
                     const uv_buf_t *body, unsigned n_body)
{
    static const baton_http_client_cb_t client_cb = {baton__proxy_on_head, baton__proxy_on_data,
                                                     baton__proxy_on_done};
    baton_worker_t *w = u->w;
    const char *query = pr->req->query ? pr->req->query : "";
    /* The client formats the path and headers into its request head during the call, so they
     * are built on the stack: no allocation per upstream request but for an unusually long one. */
    char path_buf[512], auth_buf[256];
    char *path_heap = NULL, *auth_heap = NULL;
    baton_http_header_t hdrs[4];
    size_t n_hdrs = 0;
    int rc = BATON_ENOMEM;

    if (w->parsed.prefix[0] || query[0]) {
        path = fmt_small(path_buf, sizeof(path_buf), &path_heap, "%s%s%s%s", w->parsed.prefix, path,
                         query[0] ? "?" : "", query);
        if (!path)
            goto out;
    }
    if (n_body)
        hdrs[n_hdrs++] = (baton_http_header_t){"Content-Type", "application/json"};
    /* The worker's own key wins, then --worker-api-key; the client's credentials go through
     * only with --forward-authorization (they are the router's API keys, not the workers'). */
    const baton_config_t *cfg = pr->pl->router->cfg;
    const char *wkey = w->api_key ? w->api_key : cfg ? cfg->worker_api_key : NULL;
    const baton_http_header_t *cauth =
        cfg && cfg->forward_authorization ? baton_http_req_header(pr->req, "Authorization") : NULL;
    if (wkey || cauth) {
        const char *auth =
            wkey ? fmt_small(auth_buf, sizeof(auth_buf), &auth_heap, "Bearer %s", wkey)
                 : cauth->value;
        if (!auth)
            goto out;
        hdrs[n_hdrs++] = (baton_http_header_t){"Authorization", auth};
    }
    if (pr->reqid[0]) /* vLLM protocols: one id ties the two legs */
        hdrs[n_hdrs++] = (baton_http_header_t){"X-Request-Id", pr->reqid};
    if (u->dp_hdr[0]) /* vLLM's API server runs the request on this DP rank */
        hdrs[n_hdrs++] = (baton_http_header_t){"X-data-parallel-rank", u->dp_hdr};
    baton_http_pool_t *pool = baton__pool_for(pr->pl, w);
    if (!pool)
        goto out;
    baton_http_timeouts_t to = attempt_timeouts(pr, u->side);
    rc = pr->pl->http->requestv(&u->creq, pool, method, path, hdrs, n_hdrs, body, n_body, &to,
                                &client_cb, u);
    if (rc)
        u->creq = NULL;
    else
        pr->pending++;
out:
    free(path_heap);
    free(auth_heap);
    return rc;
}

int baton__up_start(baton__preq_t *pr, baton__upstream_t *u, const char *method, const char *path,
                    const char *body, size_t len)
{
    uv_buf_t seg = {.base = (char *)body, .len = len};
    return baton__up_startv(pr, u, method, path, &seg, body ? 1 : 0);
}

/* ---------------------------------------------------------------------------------------- */
/* Attempts                                                                                 */

/* A regular attempt that continues a stream (migrate.h): the client's body with its
 * continuation, owned by the upstream (a stale attempt may still be writing the last one). */
static int continuation_body(baton__preq_t *pr, baton__upstream_t *u)
{
    static const char *const drop[] = {"baton_continuation"};
    baton_buf_t tail = BATON_BUF_INIT, flat = BATON_BUF_INIT;
    baton_json_splice_t sp = {0};
    int rc = BATON_ENOMEM;
    if (baton_buf_append(&tail, pr->pd.extra->data, pr->pd.extra->len) == 0 &&
        baton_buf_append(&tail, "}", 1) == 0 &&
        baton_pdreq_splice(&pr->pd, drop, 1, tail.data, tail.len, &sp) == 0 &&
        baton_json_splice_flatten(&sp, &flat) == 0 && (u->body = baton__pd_body_new(&flat, 1)))
        rc = 0;
    baton_json_splice_free(&sp);
    baton_buf_free(&flat);
    baton_buf_free(&tail);
    return rc;
}

/* A PD pair in up[]: its protocol, chosen once for the attempt, builds and sends the legs. */
static int pd_dispatch(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    const baton__pd_ops_t *ops = baton__pd_ops_for(p->w, d->w);
    pr->pd_ops = p->pd = d->pd = ops;
    int rc = ops->build(pr);
    return rc ? rc : ops->dispatch(pr);
}

/* PD's decode-alone rule (vLLM router's pd_uncached_token_threshold): the precise decode
 * policy found all but at most the threshold's tokens of the prompt in the chosen decode's
 * cache (the index's confirmed blocks, at least one), and the pair's protocol lets a decode
 * serve a request alone. */
static int decode_alone(baton_router_t *r, baton_route_ctx_t *ctx, const baton__pd_ops_t *ops,
                        baton_worker_t *d)
{
    unsigned th = r->cfg->pd_uncached_threshold;
    if (!th || ops->alone == baton__pd_no_alone || !ctx->n_tokens ||
        baton_policy_kind(baton_router_policy(r, BATON_ROLE_DECODE)) != BATON_POLICY_PRECISE)
        return 0;
    uint32_t cached = baton__precise_cached(ctx, d);
    return cached > 0 && ctx->n_tokens - cached <= th;
}

/* The "no worker" answer, naming what is missing. */
void baton__respond_no_worker(baton__preq_t *pr, int pd_missing_prefill)
{
    baton_router_t *r = pr->pl->router;
    const char *msg =
        pd_missing_prefill ? "no prefill worker available" : "no decode worker available";
    const char *code = pd_missing_prefill ? "no_prefill_worker" : "no_decode_worker";
    size_t counts[BATON_ROLE_COUNT];
    baton_registry_counts(r->registry, counts, NULL);
    if (!counts[BATON_ROLE_PREFILL] && !counts[BATON_ROLE_DECODE]) {
        msg = "no worker available";
        code = "no_worker";
    }
    if (baton_api_regular_only(pr->pd.api)) {
        msg = "no regular worker available";
        code = "no_regular_worker";
    }
    baton__pr_respond_error(pr, 503, msg, "service_unavailable_error", code);
}

enum baton__start_rc baton__start_attempt(baton__preq_t *pr, int *missing_prefill)
{
    baton_router_t *r = pr->pl->router;
    baton_pick_t p = {0}, d = {0}, w = {0};
    baton_pick_rc_t prc, drc = BATON_PICK_NONE, wrc;
    *missing_prefill = 1;
    if (!pr->rctx_built) {
        if (baton_route_ctx_build(&pr->rctx, r, &pr->pd, pr->req) != 0)
            return ST_NOMEM;
        pr->rctx_built = 1;
    }
    baton_route_ctx_t *ctx = &pr->rctx;
    /* Embeddings and the like have no generation to split: regular workers only. */
    prc = baton_api_regular_only(pr->pd.api)
              ? BATON_PICK_NONE
              : baton__pick(r, BATON_ROLE_PREFILL, pr->avoid, pr->n_avoid, 1, ctx, &p);
    if (prc == BATON_PICK_OK) {
        drc = pick_decode_for(r, pr, p.w, ctx, &d);
        if (drc != BATON_PICK_OK) {
            pick_release(r, &p, BATON_OUTCOME_NEUTRAL);
            *missing_prefill = 0;
        }
    }
    if (prc == BATON_PICK_OK && drc == BATON_PICK_OK &&
        decode_alone(r, ctx, baton__pd_ops_for(p.w, d.w), d.w)) {
        /* no prefill leg: the prefill's pick is given back unused */
        const baton__pd_ops_t *ops = baton__pd_ops_for(p.w, d.w);
        pick_release(r, &p, BATON_OUTCOME_NEUTRAL);
        baton__upstream_t *ud = baton__up_new(pr, UP_MAIN, &d);
        if (!ud) {
            pick_release(r, &d, BATON_OUTCOME_NEUTRAL);
            return ST_NOMEM;
        }
        const char *v[] = {ops->name};
        baton_counter_add(baton_metric_child(r->pd_alone, v), 1);
        pr->mode = MODE_REGULAR; /* the decode's answer is final, relayed as a regular one */
        pr->pd_ops = NULL;
        pr->up[UP_MAIN] = ud;
        pr->attempts++;
        ops->alone(pr);
        return ST_STARTED;
    }
    if (prc == BATON_PICK_OK && drc == BATON_PICK_OK) {
        baton__upstream_t *up = baton__up_new(pr, UP_PREFILL, &p);
        baton__upstream_t *ud = up ? baton__up_new(pr, UP_MAIN, &d) : NULL;
        if (!up || !ud) {
            pick_release(r, &p, BATON_OUTCOME_NEUTRAL);
            pick_release(r, &d, BATON_OUTCOME_NEUTRAL);
            baton__up_free(up);
            return ST_NOMEM;
        }
        pr->mode = MODE_PD;
        pr->up[UP_PREFILL] = up;
        pr->up[UP_MAIN] = ud;
        pr->attempts++;
        return pd_dispatch(pr) ? ST_NOMEM : ST_STARTED;
    }
    wrc = baton__pick(r, BATON_ROLE_REGULAR, pr->avoid, pr->n_avoid, 1, ctx, &w);
    if (wrc == BATON_PICK_OK) {
        baton__upstream_t *u = baton__up_new(pr, UP_MAIN, &w);
        if (!u) {
            pick_release(r, &w, BATON_OUTCOME_NEUTRAL);
            return ST_NOMEM;
        }
        pr->mode = MODE_REGULAR;
        pr->pd_ops = NULL;
        pr->up[UP_MAIN] = u;
        pr->attempts++;
        pr->borrowed = 1;
        /* The client's bytes go as they came: no re-serialization for a plain proxy (but for a
         * continuation: the client's members and the one naming what the client has). */
        const char *route = baton_api_path(pr->pd.api);
        if (pr->pd.extra && pr->pd.extra->len && continuation_body(pr, u) != 0)
            return ST_NOMEM;
        baton__pr_set_phase(pr, PH_SENT, "regular_dispatch");
        int rc = u->body
                     ? baton__up_start(pr, u, "POST", route, u->body->buf.data, u->body->buf.len)
                     : baton__up_start(pr, u, "POST", route, pr->pd.body, pr->pd.body_len);
        if (rc)
            baton__side_failed(pr, u, rc);
        return ST_STARTED;
    }
    if (prc == BATON_PICK_CAPPED || drc == BATON_PICK_CAPPED || wrc == BATON_PICK_CAPPED)
        return ST_WAIT;
    return ST_NOWORKER;
}
