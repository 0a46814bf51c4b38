/* proxy_vllm.c — the proxy's PD protocol back ends beside SGLang's: vLLM's NIXL two-phase flow
 * (prefill first, its kv_transfer_params handed to decode), vLLM's Mooncake transfer_id flow,
 * SGLang DP-attention ranks, same-protocol decode picks, and releasing the blocks a NIXL
 * prefill holds for a decode that never read them. */
#include "router/proxy_internal.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/dp_rank.h"
#include "router/pdproto.h"

/* ---------------------------------------------------------------------------------------- */
/* Pairing                                                                                  */

static int same_protocol(const baton_worker_t *w, const void *prefill)
{
    return w->pd_protocol == ((const baton_worker_t *)prefill)->pd_protocol;
}

baton_pick_rc_t baton__pick_decode_for(baton_router_t *r, baton__preq_t *pr,
                                       const baton_worker_t *prefill, baton_route_ctx_t *ctx,
                                       baton_pick_t *out)
{
    /* A decode of another protocol could not read this prefill's KV at all. */
    return baton_pick_ctx(r->registry, baton_router_policy(r, BATON_ROLE_DECODE), r->health,
                          r->cfg->max_worker_requests, BATON_ROLE_DECODE, pr->avoid, pr->n_avoid,
                          same_protocol, prefill, ctx, out);
}

/* ---------------------------------------------------------------------------------------- */
/* Request id                                                                               */

/* The client's X-Request-Id is kept when it is a plain token (it names the request in both
 * engines' logs); anything else gets a fresh id. */
static void request_id_init(baton__preq_t *pr)
{
    const baton_http_header_t *h = baton_http_req_header(pr->req, "X-Request-Id");
    size_t len = h ? strlen(h->value) : 0;
    int ok = len > 0 && len < sizeof(pr->reqid);
    for (size_t i = 0; ok && i < len; i++)
        ok = isalnum((unsigned char)h->value[i]) || strchr("-_.:", h->value[i]);
    if (ok)
        memcpy(pr->reqid, h->value, len + 1);
    else
        snprintf(pr->reqid, sizeof(pr->reqid), "baton-%016" PRIx64, baton_bootstrap_room());
}

/* ---------------------------------------------------------------------------------------- */
/* Dispatch                                                                                 */

static baton__body_t *body_new(baton_buf_t *buf, unsigned refs)
{
    baton__body_t *b = calloc(1, sizeof(*b));
    if (!b)
        return NULL;
    b->buf = *buf;
    *buf = (baton_buf_t)BATON_BUF_INIT;
    b->refs = refs;
    return b;
}

static int up_send(baton__preq_t *pr, baton__upstream_t *u)
{
    int rc = baton__up_start(pr, u, "POST", baton_api_path(pr->pd.api), u->body->buf.data,
                             u->body->buf.len);
    if (rc)
        baton__side_failed(pr, u, rc);
    return 0;
}

/* vllm-nixl phase 1: only the prefill is sent; decode keeps its pick until phase 2. */
static int nixl_dispatch(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL];
    baton_buf_t buf = BATON_BUF_INIT;
    int rc = baton_pdproto_nixl_prefill(&pr->pd, &buf);
    if (rc || !(p->body = body_new(&buf, 1))) {
        baton_buf_free(&buf);
        return rc ? rc : BATON_ENOMEM;
    }
    p->buffer = 1; /* its kv_transfer_params are needed */
    baton__pr_set_phase(pr, PH_SENT, "nixl_prefill");
    log_debug("router", "dispatch route=%s protocol=vllm-nixl prefill=%s decode=%s id=%s",
              pr->route, p->w->url, pr->up[UP_MAIN]->w->url, pr->reqid);
    return up_send(pr, p);
}

/* Sends both legs of a pair, each with its own body. */
static int send_pair(baton__preq_t *pr, baton_buf_t *pbuf, baton_buf_t *dbuf, const char *why)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    if (!(p->body = body_new(pbuf, 1)) || !(d->body = body_new(dbuf, 1)))
        return BATON_ENOMEM;
    baton__pr_set_phase(pr, PH_SENT, why);
    up_send(pr, p);
    if (d->w && !baton__pr_decided(pr) && pr->phase == PH_SENT)
        up_send(pr, d);
    return 0;
}

/* The attempt holds an in-flight count on the upstream's DP rank until it settles. */
static void up_dp_hold(baton__upstream_t *u, int rank)
{
    u->dp_rank = rank;
    u->dp_held = u->w->dp_size > 1;
}

static int dp_round_robin(const baton__preq_t *pr)
{
    const baton_config_t *cfg = pr->pl->router->cfg;
    return cfg && cfg->dp_round_robin;
}

/* vllm-mooncake: one transfer_id for both legs, sent at once. A retry is a new transfer with
 * a new id (the old prefill may still push for the old one). A data-parallel prefill runs it on
 * the rank the router picks: the prefill leg carries X-data-parallel-rank (vLLM's API server
 * routes by it) and the decode names that rank's engine, {engine_id}_dp{rank} (what vLLM's DP
 * engine cores register with the Mooncake bootstrap server; docs/PROTOCOLS.md §3). */
static int mooncake_dispatch(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL];
    char xfer[96], engine[320];
    snprintf(xfer, sizeof(xfer), "xfer-%s-%u", pr->reqid, pr->attempts);
    snprintf(engine, sizeof(engine), "%s", p->w->engine_id);
    if (p->w->dp_size > 1) {
        int rank = baton_dp_pick(p->w, dp_round_robin(pr));
        up_dp_hold(p, rank);
        snprintf(p->dp_hdr, sizeof(p->dp_hdr), "%d", rank);
        snprintf(engine, sizeof(engine), "%.300s_dp%d", p->w->engine_id, rank);
    }
    baton_buf_t pb = BATON_BUF_INIT, db = BATON_BUF_INIT;
    int rc = baton_pdproto_mooncake(&pr->pd, xfer, engine, p->w->bootstrap_addr, &pb, &db);
    if (!rc)
        rc = send_pair(pr, &pb, &db, "mooncake_dispatch");
    baton_buf_free(&pb);
    baton_buf_free(&db);
    log_debug("router",
              "dispatch route=%s protocol=vllm-mooncake prefill=%s transfer_id=%s engine=%s",
              pr->route, p->w->url, xfer, engine);
    return rc;
}

int baton__pd_dispatch_vllm(baton__preq_t *pr)
{
    if (!pr->reqid[0])
        request_id_init(pr);
    /* vLLM merges no prompt logprobs across legs: decode's answer is the client's as is. */
    pr->pd.logprobs = 0;
    pr->lp_ready = 0;
    if (pr->up[UP_PREFILL]->w->pd_protocol == BATON_PD_VLLM_NIXL)
        return nixl_dispatch(pr);
    return mooncake_dispatch(pr);
}

/* ---- SGLang DP attention ---- */

int baton__pd_dispatch_dp(baton__preq_t *pr)
{
    baton__upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
    int dp_p = p->w->dp_size, dp_d = d->w->dp_size, rank_p, rank_d;
    /* Least loaded (or round robin) per worker over its ranks; the decode's rank is one that can
     * share the room with the prefill's (dp_rank.h, pdproto.h). */
    baton_dp_pick_pair(p->w, d->w, dp_round_robin(pr), &rank_p, &rank_d);
    up_dp_hold(p, rank_p);
    up_dp_hold(d, rank_d);
    size_t n = baton_pdreq_n_rooms(&pr->pd);
    uint64_t rooms_stack[16], *rooms = n > 16 ? malloc(n * sizeof(*rooms)) : rooms_stack;
    if (!rooms)
        return BATON_ENOMEM;
    for (size_t i = 0; i < n; i++)
        rooms[i] = baton_pdproto_dp_room(baton_bootstrap_room(), dp_p, rank_p, dp_d, rank_d);
    /* The bootstrap members once, then each leg its own splice with its ranks. */
    baton_buf_t bs = BATON_BUF_INIT;
    int rc =
        baton_pdreq_bootstrap_members(&pr->pd, p->w->parsed.host, p->w->bootstrap_port, rooms, &bs);
    if (rooms != rooms_stack)
        free(rooms);
    baton_buf_t pb = BATON_BUF_INIT, db = BATON_BUF_INIT;
    if (!rc)
        rc = baton_pdproto_dp_body(&pr->pd, bs.data, rank_p, -1, &pb);
    if (!rc)
        rc = baton_pdproto_dp_body(&pr->pd, bs.data, rank_d, rank_p, &db);
    baton_buf_free(&bs);
    p->buffer = pr->pd.logprobs;
    if (!rc)
        rc = send_pair(pr, &pb, &db, "pd_dispatch_dp");
    baton_buf_free(&pb);
    baton_buf_free(&db);
    log_debug("router", "dispatch route=%s dp prefill=%s rank=%d/%d decode=%s rank=%d/%d",
              pr->route, p->w->url, rank_p, dp_p, d->w->url, rank_d, dp_d);
    return rc;
}

/* ---------------------------------------------------------------------------------------- */
/* NIXL phase 2                                                                             */

int baton__nixl_waiting(const baton__preq_t *pr, const baton__upstream_t *u)
{
    return u->side == UP_PREFILL && u->w->pd_protocol == BATON_PD_VLLM_NIXL && pr->up[UP_MAIN] &&
           !pr->up[UP_MAIN]->body;
}

void baton__nixl_prefill_done(baton__preq_t *pr, baton__upstream_t *p)
{
    baton__upstream_t *d = pr->up[UP_MAIN];
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
        return;
    }
    if (rc || !(d->body = body_new(&buf, 1))) {
        baton_buf_free(&buf);
        baton__finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                            "router_error");
        return;
    }
    /* From here the prefill holds the request's blocks until the decode reads them. */
    p->held = 1;
    pr->lp_ready = 1;
    log_debug("router", "nixl_decode route=%s decode=%s id=%s", pr->route, d->w->url, pr->reqid);
    up_send(pr, d);
}

void baton__nixl_decode_progress(baton__preq_t *pr)
{
    /* Decode's tokens exist only after it read the prefill's blocks. */
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
    return r->pd_releases ? 0 : BATON_EEXIST;
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
void baton__nixl_release(baton__upstream_t *p)
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
