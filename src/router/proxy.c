/* proxy.c — dual dispatch to a prefill/decode pair, regular proxying and GET forwarding over
 * per-loop upstream pools: SSE pass-through with back-pressure, logprob merging, and failure /
 * abort propagation to the other side. */
#include "router/proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/log.h"
#include "router/sse.h"

#define POOL_MAX_IDLE 64 /* idle keep-alive connections kept per (loop, worker) */
/* Client write queue above which decode is paused until the client drains it. */
#define STREAM_HIGH_WATER (256u * 1024u)
/* A buffered (non-streamed) upstream body larger than this fails the request. */
#define MAX_UPSTREAM_BODY ((size_t)256 << 20)

typedef struct pool_entry_s {
    baton_worker_t *w; /* referenced while cached */
    baton_http_pool_t *pool;
} pool_entry_t;

struct baton_proxy_loop_s {
    uv_loop_t *loop;
    baton_router_t *router;
    pool_entry_t *pools;
    size_t n_pools, cap_pools;
    uint64_t gen; /* registry generation the pool cache was last checked against */
    unsigned active;
};

enum mode { MODE_PD, MODE_REGULAR, MODE_FORWARD };
enum { UP_PREFILL = 0, UP_MAIN = 1 }; /* MAIN: decode in PD mode, the only worker otherwise */

enum deferred { DEF_NONE, DEF_ERROR, DEF_ABORT };

typedef struct upstream_s {
    struct preq_s *pr;
    baton_worker_t *w;       /* referenced; NULL when the slot is unused */
    baton_http_creq_t *creq; /* non-NULL while in flight */
    char *path;              /* owned when the worker has a prefix or there is a query */
    const char *path_use;
    char *auth; /* "Bearer <api_key>", owned */
    baton_http_header_t hdrs[2];
    size_t n_hdrs;
    int status;    /* 0 until on_head */
    int sse;       /* Content-Type: text/event-stream */
    int buffer;    /* keep the body */
    int cancelled; /* we cancelled it: its on_done is bookkeeping only */
    int done;
    int err; /* on_done's error */
    char ctype[128];
    baton_buf_t body;
} upstream_t;

typedef struct preq_s {
    baton_proxy_loop_t *pl;
    baton_http_req_t *req; /* NULL once the client request is finished */
    const char *route;
    enum mode mode;
    baton_pdreq_t pd; /* PD and regular modes */
    upstream_t up[2];
    unsigned pending; /* upstream requests in flight */

    unsigned streaming : 1;       /* client stream started */
    unsigned bp_paused : 1;       /* decode paused: client write queue over the watermark */
    unsigned holding : 1;         /* decode paused: an event waits for prefill's logprobs */
    unsigned main_ended : 1;      /* the streamed upstream ended while events were held */
    unsigned waiting_prefill : 1; /* non-streamed: decode done, prefill's logprobs needed */
    unsigned lp_ready : 1;        /* prefill finished: lp (maybe NULL) is final */
    unsigned lp_pass : 1;         /* stream: nothing more to merge, bytes pass untouched */

    /* A failure decided while the client body is still lent to an upstream request. */
    enum deferred def;
    int def_status;
    const char *def_type, *def_code;
    char *def_msg;

    baton_pdreq_lp_t *lp;
    baton_sse_splitter_t sse;
    baton_buf_t held;
    uint64_t merged_mask;
    baton_buf_t scratch;

    uint64_t ttfb_ns; /* when the first response byte went to the client; 0 before */
} preq_t;

static void on_head(baton_http_creq_t *creq, int status, const baton_http_header_t *headers,
                    size_t n_headers);
static void on_data(baton_http_creq_t *creq, const char *data, size_t len);
static void on_done(baton_http_creq_t *creq, int err);
static const baton_http_client_cb_t client_cb = {on_head, on_data, on_done};

/* ---------------------------------------------------------------------------------------- */
/* Loop context and pools                                                                   */

int baton_proxy_loop_create(baton_proxy_loop_t **pl_p, uv_loop_t *loop, baton_router_t *router)
{
    baton_proxy_loop_t *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return BATON_ENOMEM;
    pl->loop = loop;
    pl->router = router;
    pl->gen = baton_registry_generation(router->registry);
    *pl_p = pl;
    return 0;
}

void baton_proxy_loop_destroy(baton_proxy_loop_t *pl)
{
    if (!pl)
        return;
    for (size_t i = 0; i < pl->n_pools; i++) {
        baton_http_pool_destroy(pl->pools[i].pool);
        baton_worker_unref(pl->pools[i].w);
    }
    free(pl->pools);
    free(pl);
}

baton_router_t *baton_proxy_loop_router(baton_proxy_loop_t *pl)
{
    return pl->router;
}

uv_loop_t *baton_proxy_loop_uv(baton_proxy_loop_t *pl)
{
    return pl->loop;
}

unsigned baton_proxy_loop_active(const baton_proxy_loop_t *pl)
{
    return pl->active;
}

/* Drops the pools of removed workers (their in-flight requests finish on their own). */
static void pools_sweep(baton_proxy_loop_t *pl)
{
    for (size_t i = 0; i < pl->n_pools;) {
        if (baton_worker_is_removed(pl->pools[i].w)) {
            baton_http_pool_destroy(pl->pools[i].pool);
            baton_worker_unref(pl->pools[i].w);
            pl->pools[i] = pl->pools[--pl->n_pools];
        } else {
            i++;
        }
    }
}

/* The loop's pool for a worker, created on first use. Keyed by the worker object: the cache
 * holds a reference, so the pointer cannot be reused by another worker while cached. */
static baton_http_pool_t *pool_for(baton_proxy_loop_t *pl, baton_worker_t *w)
{
    uint64_t gen = baton_registry_generation(pl->router->registry);
    if (gen != pl->gen) {
        pl->gen = gen;
        pools_sweep(pl);
    }
    for (size_t i = 0; i < pl->n_pools; i++)
        if (pl->pools[i].w == w)
            return pl->pools[i].pool;
    if (pl->n_pools == pl->cap_pools) {
        size_t cap = pl->cap_pools ? pl->cap_pools * 2 : 8;
        pool_entry_t *p = realloc(pl->pools, cap * sizeof(*p));
        if (!p)
            return NULL;
        pl->pools = p;
        pl->cap_pools = cap;
    }
    baton_http_pool_t *pool;
    if (baton_http_pool_create(&pool, pl->loop, w->parsed.host, w->parsed.port, POOL_MAX_IDLE))
        return NULL;
    baton_worker_ref(w);
    pl->pools[pl->n_pools++] = (pool_entry_t){w, pool};
    return pool;
}

/* ---------------------------------------------------------------------------------------- */
/* Client responses (each records the request in the metrics)                               */

static double since_s(uint64_t start_ns, uint64_t now_ns)
{
    return now_ns > start_ns ? (double)(now_ns - start_ns) / 1e9 : 0.0;
}

/* 499 (nginx's "client closed request") when the client was gone. */
static void record(baton_router_t *r, uint64_t start_ns, const char *route, int status, int rc,
                   uint64_t ttfb_ns)
{
    uint64_t now = uv_hrtime();
    baton_router_metrics_request_done(r->metrics, route, rc == BATON_ECLOSED ? 499 : status,
                                      since_s(start_ns, now),
                                      ttfb_ns ? since_s(start_ns, ttfb_ns) : -1.0);
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

static void pr_respond(preq_t *pr, int status, const char *ctype, const char *body, size_t len)
{
    baton_http_req_t *req = pr->req;
    if (!req)
        return;
    pr->req = NULL;
    baton__respond(pr->pl->router, req, pr->route, status, ctype, body, len);
}

static void pr_respond_error(preq_t *pr, int status, const char *message, const char *type,
                             const char *code)
{
    baton_http_req_t *req = pr->req;
    if (!req)
        return;
    pr->req = NULL;
    baton__respond_error(pr->pl->router, req, pr->route, status, message, type, NULL, code);
}

static void pr_stream_start(preq_t *pr)
{
    static const baton_http_header_t extra[] = {{"Cache-Control", "no-cache"}};
    pr->streaming = 1;
    pr->ttfb_ns = uv_hrtime();
    baton_http_stream_start(pr->req, 200, "text/event-stream", extra, 1);
}

static void pr_stream_end(preq_t *pr, int status_for_metrics)
{
    baton_http_req_t *req = pr->req;
    if (!req)
        return;
    pr->req = NULL;
    uint64_t start = req->start_ns;
    int rc = baton_http_stream_end(req);
    record(pr->pl->router, start, pr->route, status_for_metrics, rc, pr->ttfb_ns);
}

/* ---------------------------------------------------------------------------------------- */
/* Request lifetime                                                                         */

static void up_release(upstream_t *u)
{
    baton_worker_unref(u->w);
    u->w = NULL;
    free(u->path);
    u->path = NULL;
    free(u->auth);
    u->auth = NULL;
    baton_buf_free(&u->body);
}

static void pr_maybe_free(preq_t *pr)
{
    if (pr->req || pr->pending)
        return;
    for (int i = 0; i < 2; i++)
        up_release(&pr->up[i]);
    baton_pdreq_free(&pr->pd);
    baton_pdreq_lp_free(pr->lp);
    baton_sse_splitter_free(&pr->sse);
    baton_buf_free(&pr->held);
    baton_buf_free(&pr->scratch);
    free(pr->def_msg);
    pr->pl->active--;
    free(pr);
}

static int borrowed_body(const preq_t *pr)
{
    /* Regular mode sends the client's own body bytes, which live as long as the client request;
     * PD mode sends pr->pd.out, and forwarding sends none. */
    return pr->mode == MODE_REGULAR;
}

static void cancel_up(upstream_t *u)
{
    if (u->creq && !u->cancelled) {
        u->cancelled = 1;
        baton_http_request_cancel(u->creq);
    }
}

static void cancel_all(preq_t *pr)
{
    cancel_up(&pr->up[UP_PREFILL]);
    cancel_up(&pr->up[UP_MAIN]);
}

static void update_pause(preq_t *pr)
{
    upstream_t *u = &pr->up[UP_MAIN];
    if (u->creq && !u->cancelled)
        baton_http_request_pause(u->creq, pr->bp_paused || pr->holding);
}

/* Sends the client an error now: JSON before the stream started, else an SSE error event and
 * [DONE]. */
static void emit_error(preq_t *pr, int status, const char *msg, const char *type, const char *code)
{
    if (!pr->req)
        return;
    if (pr->streaming) {
        baton_buf_t ev = BATON_BUF_INIT;
        if (baton_sse_error_event(&ev, msg, type, code) == 0)
            baton_http_stream_write(pr->req, ev.data, ev.len);
        baton_buf_free(&ev);
        pr_stream_end(pr, 200);
    } else {
        pr_respond_error(pr, status, msg, type, code);
    }
}

/* Finishes the client request with an error once no upstream request borrows its body. */
static void finish_error(preq_t *pr, int status, const char *msg, const char *type,
                         const char *code)
{
    cancel_all(pr);
    if (borrowed_body(pr) && pr->pending) {
        if (pr->def == DEF_NONE) {
            pr->def = DEF_ERROR;
            pr->def_status = status;
            pr->def_type = type;
            pr->def_code = code;
            pr->def_msg = strdup(msg);
        }
        return;
    }
    emit_error(pr, status, msg, type, code);
}

static void run_deferred(preq_t *pr)
{
    if (!pr->req || pr->pending || pr->def == DEF_NONE)
        return;
    if (pr->def == DEF_ERROR)
        emit_error(pr, pr->def_status, pr->def_msg ? pr->def_msg : "upstream request failed",
                   pr->def_type, pr->def_code);
    else if (pr->streaming)
        pr_stream_end(pr, 499); /* the client is gone: this only finishes the request */
    else
        pr_respond_error(pr, 499, "client closed the request", "invalid_request_error",
                         "client_closed");
}

static void on_client_abort(baton_http_req_t *req)
{
    preq_t *pr = req->data;
    log_debug("router", "client_abort route=%s peer=%s", pr->route, req->peer);
    pr->def = DEF_ABORT;
    cancel_all(pr);
    run_deferred(pr); /* finishes now when nothing is in flight */
}

static void on_client_drain(baton_http_req_t *req)
{
    preq_t *pr = req->data;
    if (pr->bp_paused) {
        pr->bp_paused = 0;
        update_pause(pr);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Failures                                                                                 */

static const char *side_name(const upstream_t *u)
{
    return baton_worker_role_name(u->w->role);
}

/* An upstream failed at the transport level (err < 0) or answered with a non-2xx status that
 * is reported as this side's failure. Decides the client's answer and cancels the rest.
 * (A retry with a new pair, issue 4, slots in here: before any byte reached the client.) */
static void side_failed(preq_t *pr, upstream_t *u, int err)
{
    /* Static codes: a deferred failure keeps the pointer. */
    static const char *const codes[BATON_ROLE_COUNT][4] = {
        {"prefill_unavailable", "prefill_timeout", "prefill_failed", "prefill_error"},
        {"decode_unavailable", "decode_timeout", "decode_failed", "decode_error"},
        {"worker_unavailable", "worker_timeout", "worker_failed", "worker_error"},
    };
    enum { C_UNAVAILABLE, C_TIMEOUT, C_FAILED, C_STATUS } ci;
    char msg[512];
    const char *side = side_name(u);
    int status;

    if (err) {
        if (err == BATON_ECONNECT || err == BATON_ETIMEOUT_CONNECT) {
            status = err == BATON_ECONNECT ? 502 : 504;
            ci = C_UNAVAILABLE;
        } else if (err == BATON_ETIMEOUT_FIRST_BYTE || err == BATON_ETIMEOUT_IDLE ||
                   err == BATON_ETIMEOUT_TOTAL || err == BATON_ETIMEOUT) {
            status = 504;
            ci = C_TIMEOUT;
        } else {
            status = err == BATON_ENOMEM ? 500 : 502;
            ci = C_FAILED;
        }
        snprintf(msg, sizeof(msg), "%s worker %s failed: %s", side, u->w->url, baton_strerror(err));
    } else {
        /* The worker's own error: its status, with the start of its body. */
        int n = u->body.len < 200 ? (int)u->body.len : 200;
        snprintf(msg, sizeof(msg), "%s worker %s returned HTTP %d%s%.*s", side, u->w->url,
                 u->status, n ? ": " : "", n, u->body.data ? u->body.data : "");
        status = u->status >= 400 && u->status <= 599 ? u->status : 502;
        ci = C_STATUS;
    }
    log_warn("router", "upstream_failed route=%s side=%s worker=%s err=%s status=%d streaming=%d",
             pr->route, side, u->w->url, err ? baton_err_name(err) : "-", u->status,
             (int)pr->streaming);
    unsigned role = (unsigned)u->w->role < BATON_ROLE_COUNT ? (unsigned)u->w->role : 2;
    finish_error(pr, status, msg, "upstream_error", codes[role][ci]);
}

/* ---------------------------------------------------------------------------------------- */
/* Streaming to the client                                                                  */

static void client_write(preq_t *pr, const char *data, size_t len)
{
    if (!pr->req || len == 0)
        return;
    baton_http_stream_write(pr->req, data, len);
    if (!pr->bp_paused && baton_http_write_queue_size(pr->req) > STREAM_HIGH_WATER) {
        pr->bp_paused = 1;
        update_pause(pr);
    }
}

/* One complete SSE event of decode's stream while logprobs are merged. */
static int stream_event_cb(const char *raw, size_t len, void *arg)
{
    preq_t *pr = arg;
    if (pr->holding) {
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
        pr->holding = 1;
        update_pause(pr);
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

static void flush_pending_raw(preq_t *pr)
{
    if (baton_sse_pending(&pr->sse)) {
        client_write(pr, pr->sse.pending.data, pr->sse.pending.len);
        baton_sse_splitter_free(&pr->sse);
    }
}

static void stream_bytes(preq_t *pr, const char *data, size_t len)
{
    if (pr->mode != MODE_PD || !pr->pd.logprobs || (pr->lp_pass && !pr->holding)) {
        client_write(pr, data, len);
        return;
    }
    if (baton_sse_feed(&pr->sse, data, len, stream_event_cb, pr) < 0) {
        finish_error(pr, 500, "router out of memory while streaming", "server_error",
                     "internal_error");
        return;
    }
    if (pr->lp_pass && !pr->holding)
        flush_pending_raw(pr);
}

/* Prefill is done: release the events held for its logprobs, in order. */
static void release_held(preq_t *pr)
{
    if (pr->holding) {
        pr->holding = 0;
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
    if (pr->main_ended) {
        flush_pending_raw(pr);
        pr_stream_end(pr, 200);
    } else {
        update_pause(pr);
    }
}

/* ---------------------------------------------------------------------------------------- */
/* Upstream callbacks                                                                       */

static int is_2xx(int status)
{
    return status >= 200 && status <= 299;
}

static void on_head(baton_http_creq_t *creq, int status, const baton_http_header_t *headers,
                    size_t n_headers)
{
    upstream_t *u = creq->data;
    preq_t *pr = u->pr;
    u->status = status;
    for (size_t i = 0; i < n_headers; i++) {
        if (strcasecmp(headers[i].name, "Content-Type") == 0) {
            snprintf(u->ctype, sizeof(u->ctype), "%s", headers[i].value);
            break;
        }
    }
    u->sse = strncasecmp(u->ctype, "text/event-stream", 17) == 0;
    if (u->cancelled || !pr->req)
        return;

    if (u == &pr->up[UP_MAIN]) {
        if (is_2xx(status) && pr->pd.stream && u->sse && pr->mode != MODE_FORWARD) {
            pr_stream_start(pr);
        } else {
            u->buffer = 1;
            if (!is_2xx(status))
                cancel_up(&pr->up[UP_PREFILL]); /* decode's error will be passed through */
        }
    } else if (!is_2xx(status)) {
        /* Prefill refused: decode would wait for a KV hand-off that never comes. */
        u->buffer = 1;
        cancel_up(&pr->up[UP_MAIN]);
    }
}

static void on_data(baton_http_creq_t *creq, const char *data, size_t len)
{
    upstream_t *u = creq->data;
    preq_t *pr = u->pr;
    if (u->cancelled || !pr->req)
        return;
    if (u == &pr->up[UP_MAIN] && pr->streaming) {
        stream_bytes(pr, data, len);
        return;
    }
    if (!u->buffer)
        return; /* prefill's answer is read to the end and dropped */
    if (u->body.len + len > MAX_UPSTREAM_BODY) {
        side_failed(pr, u, BATON_ETOOBIG);
        return;
    }
    if (baton_buf_append(&u->body, data, len))
        finish_error(pr, 500, "router out of memory buffering a response", "server_error",
                     "internal_error");
}

/* Decode (or the regular worker) finished a buffered response: pass it on. */
static void main_body_done(preq_t *pr)
{
    upstream_t *u = &pr->up[UP_MAIN];
    const char *ctype = u->ctype[0] ? u->ctype : "application/json";
    if (!is_2xx(u->status)) {
        cancel_up(&pr->up[UP_PREFILL]);
        log_info("router", "upstream_status route=%s side=%s worker=%s status=%d", pr->route,
                 side_name(u), u->w->url, u->status);
        pr_respond(pr, u->status, ctype, u->body.data ? u->body.data : "", u->body.len);
        return;
    }
    if (pr->mode == MODE_PD && pr->pd.logprobs) {
        if (!pr->lp_ready) {
            pr->waiting_prefill = 1;
            return;
        }
        baton_buf_reset(&pr->scratch);
        if (pr->lp && baton_pdreq_merge_body(pr->lp, u->body.data, u->body.len, &pr->scratch) > 0) {
            pr_respond(pr, u->status, ctype, pr->scratch.data, pr->scratch.len);
            return;
        }
    }
    pr_respond(pr, u->status, ctype, u->body.data ? u->body.data : "", u->body.len);
}

static void prefill_ok(preq_t *pr)
{
    upstream_t *u = &pr->up[UP_PREFILL];
    if (pr->pd.logprobs) {
        pr->lp = baton_pdreq_lp_extract(u->body.data, u->body.len);
        baton_buf_free(&u->body);
    }
    pr->lp_ready = 1;
    if (pr->streaming) {
        if (!pr->lp && !pr->pd.batch)
            pr->lp_pass = 1; /* nothing to merge: events pass untouched */
        release_held(pr);
    } else if (pr->waiting_prefill) {
        pr->waiting_prefill = 0;
        main_body_done(pr);
    }
}

static void on_done(baton_http_creq_t *creq, int err)
{
    upstream_t *u = creq->data;
    preq_t *pr = u->pr;
    baton_router_t *r = pr->pl->router;

    u->creq = NULL;
    u->done = 1;
    u->err = err;
    pr->pending--;
    baton_worker_in_flight_dec(u->w);
    if (err)
        baton_router_metrics_upstream_error(r->metrics, u->w->role,
                                            baton_router_metrics_error_kind(err));
    else if (u->status >= 500)
        baton_router_metrics_upstream_error(r->metrics, u->w->role, "status_5xx");

    if (u->cancelled || !pr->req || pr->def != DEF_NONE) {
        run_deferred(pr);
        pr_maybe_free(pr);
        return;
    }
    if (u == &pr->up[UP_PREFILL]) {
        if (err)
            side_failed(pr, u, err);
        else if (!is_2xx(u->status))
            side_failed(pr, u, 0);
        else
            prefill_ok(pr);
    } else if (err) {
        side_failed(pr, u, err);
    } else if (pr->streaming) {
        if (pr->holding) {
            pr->main_ended = 1; /* ends when prefill's logprobs release the held events */
        } else {
            flush_pending_raw(pr);
            pr_stream_end(pr, 200);
        }
    } else {
        main_body_done(pr);
    }
    run_deferred(pr);
    pr_maybe_free(pr);
}

/* ---------------------------------------------------------------------------------------- */
/* Dispatch                                                                                 */

static int up_start(preq_t *pr, upstream_t *u, const char *method, const char *path,
                    const char *body, size_t len)
{
    baton_router_t *r = pr->pl->router;
    baton_worker_t *w = u->w;
    const char *query = pr->req->query ? pr->req->query : "";

    u->pr = pr;
    if (!w->parsed.prefix[0] && !query[0]) {
        u->path_use = path;
    } else {
        if (asprintf(&u->path, "%s%s%s%s", w->parsed.prefix, path, query[0] ? "?" : "", query) <
            0) {
            u->path = NULL;
            return BATON_ENOMEM;
        }
        u->path_use = u->path;
    }
    u->n_hdrs = 0;
    if (body)
        u->hdrs[u->n_hdrs++] = (baton_http_header_t){"Content-Type", "application/json"};
    /* The worker's own key wins; else the client's credentials go through (copied: the
     * upstream request may outlive the client request). */
    const baton_http_header_t *cauth = baton_http_req_header(pr->req, "Authorization");
    if (w->api_key || cauth) {
        if (w->api_key ? asprintf(&u->auth, "Bearer %s", w->api_key) < 0
                       : !(u->auth = strdup(cauth->value))) {
            u->auth = NULL;
            return BATON_ENOMEM;
        }
        u->hdrs[u->n_hdrs++] = (baton_http_header_t){"Authorization", u->auth};
    }
    baton_http_pool_t *pool = pool_for(pr->pl, w);
    if (!pool)
        return BATON_ENOMEM;
    int rc = baton_http_request(&u->creq, pool, method, u->path_use, u->hdrs, u->n_hdrs, body, len,
                                &r->cfg->timeouts, &client_cb, u);
    if (rc) {
        u->creq = NULL;
        return rc;
    }
    pr->pending++;
    baton_worker_in_flight_inc(w);
    return 0;
}

/* Injects a fresh room for the pair in up[] and sends the one serialized body to both. */
static int pd_dispatch(preq_t *pr)
{
    upstream_t *p = &pr->up[UP_PREFILL], *d = &pr->up[UP_MAIN];
    uint64_t rooms_stack[16], *rooms = rooms_stack;
    size_t n = baton_pdreq_n_rooms(&pr->pd);
    int rc;

    if (n > 16 && !(rooms = malloc(n * sizeof(*rooms))))
        return BATON_ENOMEM;
    for (size_t i = 0; i < n; i++)
        rooms[i] = baton_bootstrap_room();
    rc = baton_pdreq_inject(&pr->pd, p->w->parsed.host, p->w->bootstrap_port, rooms);
    if (rooms != rooms_stack)
        free(rooms);
    if (rc)
        return rc;
    p->buffer = pr->pd.logprobs;
    const char *path = baton_api_path(pr->pd.api);
    if ((rc = up_start(pr, p, "POST", path, pr->pd.out.data, pr->pd.out.len)) != 0) {
        side_failed(pr, p, rc);
        return 0;
    }
    if ((rc = up_start(pr, d, "POST", path, pr->pd.out.data, pr->pd.out.len)) != 0) {
        side_failed(pr, d, rc);
        return 0;
    }
    log_debug("router", "dispatch route=%s prefill=%s decode=%s batch=%zu stream=%d", pr->route,
              p->w->url, d->w->url, pr->pd.batch, pr->pd.stream);
    return 0;
}

static preq_t *pr_new(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                      enum mode mode)
{
    preq_t *pr = calloc(1, sizeof(*pr));
    if (!pr)
        return NULL;
    pr->pl = pl;
    pr->req = req;
    pr->route = route;
    pr->mode = mode;
    pr->up[0].pr = pr->up[1].pr = pr;
    pl->active++;
    req->data = pr;
    req->on_abort = on_client_abort;
    req->on_drain = on_client_drain;
    return pr;
}

void baton_proxy_inference(baton_proxy_loop_t *pl, baton_http_req_t *req, baton_api_t api)
{
    baton_router_t *r = pl->router;
    const char *route = baton_api_path(api);
    baton_pdreq_error_t perr;
    baton_pdreq_t pd;

    int rc = baton_pdreq_parse(&pd, api, req->body, req->body_len, &perr);
    if (rc == BATON_EINVAL) {
        baton__respond_error(r, req, route, perr.status, perr.message, "invalid_request_error",
                             perr.param[0] ? perr.param : NULL, perr.code);
        return;
    }
    if (rc) {
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }

    baton_worker_t *p = baton_policy_pick(r->prefill_policy, r->registry, BATON_ROLE_PREFILL);
    baton_worker_t *d =
        p ? baton_policy_pick(r->decode_policy, r->registry, BATON_ROLE_DECODE) : NULL;
    baton_worker_t *w = NULL;
    if (!p || !d) {
        w = baton_policy_pick(r->regular_policy, r->registry, BATON_ROLE_REGULAR);
        if (!w) {
            const char *msg = !p ? "no prefill worker available" : "no decode worker available";
            const char *code = !p ? "no_prefill_worker" : "no_decode_worker";
            size_t counts[BATON_ROLE_COUNT];
            baton_registry_counts(r->registry, counts, NULL);
            if (!counts[BATON_ROLE_PREFILL] && !counts[BATON_ROLE_DECODE]) {
                msg = "no worker available";
                code = "no_worker";
            }
            baton_worker_unref(p);
            baton_worker_unref(d);
            baton_pdreq_free(&pd);
            baton__respond_error(r, req, route, 503, msg, "service_unavailable_error", NULL, code);
            return;
        }
        baton_worker_unref(p);
        baton_worker_unref(d);
        p = d = NULL;
    }

    preq_t *pr = pr_new(pl, req, route, w ? MODE_REGULAR : MODE_PD);
    if (!pr) {
        baton_worker_unref(p);
        baton_worker_unref(d);
        baton_worker_unref(w);
        baton_pdreq_free(&pd);
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    pr->pd = pd;
    if (pr->mode == MODE_PD) {
        pr->up[UP_PREFILL].w = p;
        pr->up[UP_MAIN].w = d;
        rc = pd_dispatch(pr);
    } else {
        pr->up[UP_MAIN].w = w;
        /* The client's bytes go as they came: no re-serialization for a plain proxy. */
        rc = up_start(pr, &pr->up[UP_MAIN], "POST", route, req->body, req->body_len);
        if (rc)
            side_failed(pr, &pr->up[UP_MAIN], rc);
        rc = 0;
    }
    if (rc)
        finish_error(pr, 500, "router out of memory", "server_error", "internal_error");
    pr_maybe_free(pr);
}

int baton_proxy_forward(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                        const baton_worker_role_t *roles, size_t n_roles)
{
    baton_router_t *r = pl->router;
    baton_worker_t *w = NULL;
    for (size_t i = 0; i < n_roles && !w; i++) {
        baton_policy_t *pol = roles[i] == BATON_ROLE_PREFILL  ? r->prefill_policy
                              : roles[i] == BATON_ROLE_DECODE ? r->decode_policy
                                                              : r->regular_policy;
        w = baton_policy_pick(pol, r->registry, roles[i]);
    }
    if (!w)
        return BATON_ENOWORKER;
    preq_t *pr = pr_new(pl, req, route, MODE_FORWARD);
    if (!pr) {
        baton_worker_unref(w);
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return 0;
    }
    pr->up[UP_MAIN].w = w;
    pr->up[UP_MAIN].buffer = 1;
    int rc = up_start(pr, &pr->up[UP_MAIN], "GET", req->path, NULL, 0);
    if (rc)
        side_failed(pr, &pr->up[UP_MAIN], rc);
    pr_maybe_free(pr);
    return 0;
}
