/* pd_vllm_nixl.c — vLLM's NIXL PD protocol: the prefill first, its kv_transfer_params then
 * handed to the decode, and releasing the blocks a prefill holds for a decode that never read
 * them. */
#include "router/dataplane/proxy_pd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dataplane/pdproto.h"

/* Phase 1: only the prefill leg is built; decode keeps its pick until phase 2. */
static int build(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL];
    baton__pd_request_id_init(pr);
    /* vLLM merges no prompt logprobs across legs: decode's answer is the client's as is. */
    pr->pd.logprobs = 0;
    pr->lp_ready = 0;
    baton_buf_t buf = BATON_BUF_INIT;
    int rc = baton_pdproto_nixl_prefill(&pr->pd, &buf);
    if (rc || !(p->body = baton__pd_body_new(&buf, 1))) {
        baton_buf_free(&buf);
        return rc ? rc : BATON_ENOMEM;
    }
    p->buffer = 1; /* its kv_transfer_params are needed */
    return 0;
}

static int dispatch(baton__preq_t *pr)
{
    log_debug("router", "dispatch route=%s protocol=vllm-nixl prefill=%s decode=%s id=%s",
              pr->route, pr->up[UP_PREFILL]->w->url, pr->up[UP_MAIN]->w->url, pr->reqid);
    return baton__pd_send_legs(pr, "nixl_prefill");
}

/* Phase 2: the decode leg carries the prefill's kv_transfer_params (or the client gets a 502). */
static int on_prefill_done(baton__preq_t *pr, baton__upstream_t *p)
{
    baton__upstream_t *d = pr->up[UP_MAIN];
    if (!d || d->body)
        return 0; /* the decode leg went out already: prefill's answer is just final */
    baton_buf_t buf = BATON_BUF_INIT;
    char why[128];
    int rc = baton_pdproto_nixl_decode(&pr->pd, p->resp.data, p->resp.len, &buf, p->remote_rid,
                                       sizeof(p->remote_rid), why, sizeof(why));
    baton_buf_free(&p->resp);
    if (rc == BATON_EUPSTREAM) {
        char msg[256];
        snprintf(msg, sizeof(msg), "prefill worker %s: %s", p->w->id, why); /* id, never the URL */
        log_warn("router", "nixl_prefill_unusable route=%s worker=%s id=%s why=%s", pr->route,
                 p->w->url, pr->reqid, why);
        baton__finish_error(pr, 502, msg, "server_error", "prefill_no_kv_transfer_params",
                            "peer_failed");
        return 1;
    }
    if (rc || !(d->body = baton__pd_body_new(&buf, 1))) {
        baton_buf_free(&buf);
        baton__finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                            "router_error");
        return 1;
    }
    /* From here the prefill holds the request's blocks until the decode reads them. */
    p->held = 1;
    pr->lp_ready = 1;
    log_debug("router", "nixl_decode route=%s decode=%s id=%s", pr->route, d->w->url, pr->reqid);
    baton__pd_up_send(pr, d);
    return 1;
}

/* Decode's tokens exist only after it read the prefill's blocks. */
static void on_decode_progress(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL];
    if (p)
        p->held = 0;
}

/* ---------------------------------------------------------------------------------------- */
/* Releasing stranded blocks                                                                */

int baton_proxy_pd_metrics_init(baton_router_t *r)
{
    static const char *const labels[] = {"protocol", "result"};
    /* result: released (2xx) | refused (another status: the engine frees them at its own
     * timeout) | failed (no answer) */
    r->pd_releases = baton_metrics_counter(
        r->metrics_reg, "baton_pd_stranded_releases_total",
        "Prefill KV blocks the router asked to release because their decode never read them.", 2,
        labels);
    /* the decode alone (proxy_pd.h: alone), by protocol */
    r->pd_alone = baton_metrics_counter(
        r->metrics_reg, "baton_pd_decode_alone_total",
        "PD requests sent to the decode alone: it held all but --pd-uncached-token-threshold "
        "tokens of the prompt, so no prefill leg ran.",
        1, labels);
    return r->pd_releases && r->pd_alone ? 0 : BATON_EEXIST;
}

static void count_release(baton_router_t *r, const char *result)
{
    const char *v[] = {"vllm-nixl", result};
    if (r->pd_releases)
        baton_counter_add(baton_metric_child(r->pd_releases, v), 1);
}

typedef struct release_s {
    baton_router_t *router;
    char *path;
    char reqid[BATON__REQID_MAX];
    baton_http_header_t hdrs[2];
    baton_buf_t body;
    char url[256];
    int status;
} release_t;

static void release_head(baton_http_creq_t *creq, int status, const baton_http_header_t *headers,
                         size_t n_headers)
{
    (void)headers;
    (void)n_headers;
    ((release_t *)creq->data)->status = status;
}

static void release_done(baton_http_creq_t *creq, int err)
{
    release_t *rl = creq->data;
    const char *result = err ? "failed" : baton__is_2xx(rl->status) ? "released" : "refused";
    count_release(rl->router, result);
    log_info("router", "nixl_release worker=%s id=%s result=%s status=%d err=%s", rl->url,
             rl->reqid, result, rl->status, err ? baton_err_name(err) : "-");
    baton_buf_free(&rl->body);
    free(rl->path);
    free(rl);
}

/*
 * The decode never read the blocks (it failed, the client left, or the attempt was given up):
 * the prefill is asked to drop the request now rather than when its lease ends (vLLM's
 * kv_lease_duration, 30 s by default, renewed while a decode heartbeats for it).
 * POST {prefix}/abort_requests {"request_ids":[X-Request-Id, remote_request_id]} with the same
 * X-Request-Id; an engine without that endpoint answers 4xx and frees them when the lease ends
 * — counted as "refused", never retried.
 */
static void release(baton__upstream_t *p)
{
    baton__preq_t *pr = p->pr;
    baton_proxy_loop_t *pl = pr->pl;
    p->held = 0;
    release_t *rl = calloc(1, sizeof(*rl));
    baton_http_pool_t *pool = baton__pool_for(pl, p->w);
    if (!rl || !pool || asprintf(&rl->path, "%s/abort_requests", p->w->parsed.prefix) < 0) {
        free(rl);
        count_release(pl->router, "failed");
        return;
    }
    rl->router = pl->router;
    snprintf(rl->reqid, sizeof(rl->reqid), "%s", pr->reqid);
    snprintf(rl->url, sizeof(rl->url), "%s", p->w->url);
    /* Both names: the router's X-Request-Id, and the prefill's own remote_request_id. */
    json_t *j = json_pack("{s:[s]}", "request_ids", pr->reqid);
    if (j && p->remote_rid[0] && strcmp(p->remote_rid, pr->reqid) != 0)
        json_array_append_new(json_object_get(j, "request_ids"), json_string(p->remote_rid));
    int rc = j ? baton_pdreq_dump(j, &rl->body) : BATON_ENOMEM;
    json_decref(j);
    rl->hdrs[0] = (baton_http_header_t){"Content-Type", "application/json"};
    rl->hdrs[1] = (baton_http_header_t){"X-Request-Id", rl->reqid};
    baton_http_timeouts_t to = pl->router->cfg->timeouts;
    to.total_ms = to.first_byte_ms = 5000; /* a release is best effort: never long */
    static const baton_http_client_cb_t cb = {release_head, NULL, release_done};
    baton_http_creq_t *creq;
    if (!rc)
        rc = pl->http->request(&creq, pool, "POST", rl->path, rl->hdrs, 2, rl->body.data,
                               rl->body.len, &to, &cb, rl);
    if (rc) {
        baton_buf_free(&rl->body);
        free(rl->path);
        free(rl);
        count_release(pl->router, "failed");
        return;
    }
    log_info("router", "nixl_release_sent route=%s worker=%s id=%s", pr->route, p->w->url,
             pr->reqid);
}

const baton__pd_ops_t baton__pd_vllm_nixl = {
    .name = "vllm-nixl",
    .build = build,
    .dispatch = dispatch,
    .on_prefill_done = on_prefill_done,
    .on_decode_progress = on_decode_progress,
    .release = release,
    .alone = baton__pd_alone_send,
};
