/* proxy.c — dual dispatch to a prefill/decode pair, regular proxying and GET forwarding over
 * per-loop upstream pools: admission and queueing, health-aware picks under per-worker caps,
 * retries with a new pair, SSE pass-through with back-pressure, logprob merging, failure /
 * abort propagation to the other side, drain deadlines of removed workers. */
#include "router/proxy.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/list.h"
#include "common/log.h"
#include "router/pick.h"
#include "router/retry.h"
#include "http/sse.h"

#define POOL_MAX_IDLE 64 /* idle keep-alive connections kept per (loop, worker) */
/* Client write queue above which decode is paused until the client drains it. */
#define STREAM_HIGH_WATER (256u * 1024u)
/* A buffered (non-streamed) upstream body larger than this fails the request. */
#define MAX_UPSTREAM_BODY ((size_t)256 << 20)
/* Housekeeping period: drain deadlines of removed workers, queued requests re-tried. */
#define TICK_MS 250
/* A retry that would leave less than this before the request's deadline is not started. */
#define MIN_ATTEMPT_MS 100

typedef struct pool_entry_s {
    baton_worker_t *w; /* referenced while cached */
    baton_http_pool_t *pool;
} pool_entry_t;

struct preq_s;

struct baton_proxy_loop_s {
    uv_loop_t *loop;
    baton_router_t *router;
    pool_entry_t *pools;
    size_t n_pools, cap_pools;
    uint64_t gen; /* registry generation the pool cache was last checked against */
    unsigned active;
    baton_list_t live;  /* of preq_t.link: every live request of this loop, newest first */
    baton_list_t queue; /* of preq_t.qlink: waiting for admission, FIFO */
    uv_timer_t tick;
    uv_async_t wake;
    baton_admission_waker_t waker;
    int started;
    unsigned open_handles; /* pl is freed when the last one closed */
};

enum mode { MODE_PD, MODE_REGULAR, MODE_FORWARD };
enum { UP_PREFILL = 0, UP_MAIN = 1 }; /* MAIN: decode in PD mode, the only worker otherwise */

/* What the client gets for a failure, decided before a retry is tried: if the retry finds no
 * pair, this is the answer. */
enum fail_kind { FAIL_NONE, FAIL_ERROR, FAIL_PASS };
enum deferred { DEF_NONE, DEF_FAIL, DEF_ABORT };
enum tmode { TM_NONE, TM_QUEUE, TM_BACKOFF };
enum tstate { TS_CLOSED_NEVER, TS_OPEN, TS_CLOSING };

/* The serialized body of one PD attempt, shared by its two upstream requests (the HTTP client
 * writes it without copying, so it lives until both reported on_done). */
typedef struct body_s {
    unsigned refs;
    baton_buf_t buf;
} body_t;

typedef struct fail_s {
    enum fail_kind kind;
    int status;
    const char *type, *code; /* static strings */
    char *msg;               /* owned; NULL: a generic message */
    char ctype[128];         /* FAIL_PASS */
    baton_buf_t body;        /* FAIL_PASS: the worker's own answer */
} fail_t;

typedef struct upstream_s {
    struct preq_s *pr;
    int side;
    baton_worker_t *w;             /* referenced */
    baton_whealth_ticket_t ticket; /* 0 once its outcome was reported (or no health layer) */
    baton_http_creq_t *creq;       /* non-NULL while in flight */
    body_t *body;                  /* PD: the attempt's body */
    char *path;                    /* owned when the worker has a prefix or there is a query */
    const char *path_use;
    char *auth; /* "Bearer <api_key>", owned */
    baton_http_header_t hdrs[2];
    size_t n_hdrs;
    int status;             /* 0 until on_head */
    unsigned reserved : 1;  /* holds one of w's in-flight slots */
    unsigned sse : 1;       /* Content-Type: text/event-stream */
    unsigned buffer : 1;    /* keep the body */
    unsigned cancelled : 1; /* we cancelled it: its on_done is bookkeeping only */
    unsigned stale : 1;     /* its attempt was abandoned for a retry: freed at on_done */
    int err;                /* on_done's error */
    char ctype[128];
    baton_buf_t resp;
} upstream_t;

typedef struct preq_s {
    baton_proxy_loop_t *pl;
    baton_http_req_t *req; /* NULL once the client request is finished */
    const char *route;
    enum mode mode;
    baton_pdreq_t pd;       /* PD and regular modes */
    upstream_t *up[2];      /* the current attempt; NULL where unused */
    unsigned pending;       /* upstream requests in flight, of every attempt */
    unsigned attempts;      /* attempts dispatched */
    uint64_t deadline_ns;   /* the whole request's deadline (uv_hrtime); 0 = none */
    baton_worker_t **avoid; /* workers of failed attempts (referenced) */
    size_t n_avoid, cap_avoid;

    unsigned streaming : 1;       /* client stream started */
    unsigned bp_paused : 1;       /* decode paused: client write queue over the watermark */
    unsigned holding : 1;         /* decode paused: an event waits for prefill's logprobs */
    unsigned main_ended : 1;      /* the streamed upstream ended while events were held */
    unsigned waiting_prefill : 1; /* non-streamed: decode done, prefill's logprobs needed */
    unsigned lp_ready : 1;        /* prefill finished: lp (maybe NULL) is final */
    unsigned lp_pass : 1;         /* stream: nothing more to merge, bytes pass untouched */
    unsigned borrowed : 1;        /* an attempt sent the client's own body bytes */
    unsigned slot : 1;            /* holds an admission slot */
    unsigned queued : 1;          /* in the loop's admission queue */
    unsigned no_retry : 1;        /* shutting down: failures are final */

    enum deferred def;
    fail_t fail;

    uv_timer_t timer; /* queue timeout or retry back-off */
    enum tmode tmode;
    enum tstate tstate;
    uint64_t queued_ns;

    baton_pdreq_lp_t *lp;
    baton_sse_splitter_t sse;
    baton_buf_t held;
    uint64_t merged_mask;
    baton_buf_t scratch;

    uint64_t ttfb_ns;             /* when the first response byte went to the client; 0 before */
    baton_list_t link;  /* in pl->live */
    baton_list_t qlink; /* in pl->queue while queued */
} preq_t;

static void on_head(baton_http_creq_t *creq, int status, const baton_http_header_t *headers,
                    size_t n_headers);
static void on_data(baton_http_creq_t *creq, const char *data, size_t len);
static void on_done(baton_http_creq_t *creq, int err);
static const baton_http_client_cb_t client_cb = {on_head, on_data, on_done};

static void side_failed(preq_t *pr, upstream_t *u, int err);
static void finish_error(preq_t *pr, int status, const char *msg, const char *type,
                         const char *code, const char *abort_reason);
static void client_write(preq_t *pr, const char *data, size_t len);
static void queue_run(baton_proxy_loop_t *pl);

/* ---------------------------------------------------------------------------------------- */
/* Shared router state                                                                      */

static baton_policy_t **policy_slot(baton_router_t *r, baton_worker_role_t role)
{
    return role == BATON_ROLE_PREFILL  ? &r->prefill_policy
           : role == BATON_ROLE_DECODE ? &r->decode_policy
                                       : &r->regular_policy;
}

baton_policy_t *baton_router_policy(baton_router_t *r, baton_worker_role_t role)
{
    return __atomic_load_n(policy_slot(r, role), __ATOMIC_ACQUIRE);
}

baton_policy_t *baton_router_set_policy(baton_router_t *r, baton_worker_role_t role,
                                        baton_policy_t *p)
{
    return __atomic_exchange_n(policy_slot(r, role), p, __ATOMIC_ACQ_REL);
}

/* ---------------------------------------------------------------------------------------- */
/* Loop context, pools, housekeeping                                                        */

static void on_tick(uv_timer_t *t);
static void on_wake(uv_async_t *a);

static void wake_loop(void *ctx)
{
    baton_proxy_loop_t *pl = ctx;
    uv_async_send(&pl->wake);
}

int baton_proxy_loop_create(baton_proxy_loop_t **pl_p, uv_loop_t *loop, baton_router_t *router)
{
    baton_proxy_loop_t *pl = calloc(1, sizeof(*pl));
    if (!pl)
        return BATON_ENOMEM;
    pl->loop = loop;
    pl->router = router;
    baton_list_init(&pl->live);
    baton_list_init(&pl->queue);
    pl->gen = baton_registry_generation(router->registry);
    pl->waker.wake = wake_loop;
    pl->waker.ctx = pl;
    atomic_init(&pl->waker.waiting, 0);
    *pl_p = pl;
    return 0;
}

int baton_proxy_loop_start(baton_proxy_loop_t *pl)
{
    int rc = uv_timer_init(pl->loop, &pl->tick);
    if (rc)
        return rc;
    pl->tick.data = pl;
    pl->open_handles++;
    rc = uv_async_init(pl->loop, &pl->wake, on_wake);
    if (rc) {
        pl->started = 1; /* destroy closes the timer */
        return rc;
    }
    pl->wake.data = pl;
    pl->open_handles++;
    pl->started = 1;
    uv_timer_start(&pl->tick, on_tick, TICK_MS, TICK_MS);
    uv_unref((uv_handle_t *)&pl->tick);
    uv_unref((uv_handle_t *)&pl->wake);
    if (pl->router->admission)
        baton_admission_register(pl->router->admission, &pl->waker);
    return 0;
}

static void on_pl_handle_closed(uv_handle_t *h)
{
    baton_proxy_loop_t *pl = h->data;
    if (--pl->open_handles == 0)
        free(pl);
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
    pl->pools = NULL;
    pl->n_pools = pl->cap_pools = 0;
    if (pl->router->admission && pl->started)
        baton_admission_unregister(pl->router->admission, &pl->waker);
    if (pl->open_handles == 0) {
        free(pl);
        return;
    }
    /* Both handles carry pl in data; the last close frees it. */
    unsigned n = pl->open_handles;
    if (n >= 1)
        uv_close((uv_handle_t *)&pl->tick, on_pl_handle_closed);
    if (n >= 2)
        uv_close((uv_handle_t *)&pl->wake, on_pl_handle_closed);
}

baton_router_t *baton_proxy_loop_router(baton_proxy_loop_t *pl)
{
    return pl->router;
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
/* Worker selection (pick.h) with this router's policy, health layer and cap                */

static void pick_release(baton_router_t *r, baton_pick_t *p, baton_breaker_outcome_t outcome)
{
    baton_pick_release(r->health, p, outcome);
}

static baton_pick_rc_t pick(baton_router_t *r, baton_worker_role_t role,
                            baton_worker_t *const *avoid, size_t n_avoid, int use_cap,
                            baton_pick_t *out)
{
    return baton_pick(r->registry, baton_router_policy(r, role), r->health,
                      use_cap ? r->cfg->max_worker_requests : 0, role, avoid, n_avoid, out);
}

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

/* 429 with Retry-After: the router is saturated now, a later try may pass. */
static void pr_respond_queue_full(preq_t *pr)
{
    baton_http_req_t *req = pr->req;
    if (!req)
        return;
    pr->req = NULL;
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

static void body_unref(body_t *b)
{
    if (b && --b->refs == 0) {
        baton_buf_free(&b->buf);
        free(b);
    }
}

/* Gives back what the upstream holds on its worker: the in-flight slot and, when its outcome
 * was not reported yet, the health ticket (with `outcome`). */
static void up_report(upstream_t *u, baton_breaker_outcome_t outcome)
{
    baton_router_t *r = u->pr->pl->router;
    if (u->ticket) {
        if (r->health)
            baton_whealth_done(r->health, u->w, u->ticket, outcome);
        u->ticket = 0;
    }
}

static void up_settle(upstream_t *u, baton_breaker_outcome_t outcome)
{
    up_report(u, outcome);
    if (u->reserved) {
        u->reserved = 0;
        baton_worker_in_flight_dec(u->w);
    }
}

/* Frees an upstream that is not in flight. */
static void up_free(upstream_t *u)
{
    if (!u)
        return;
    up_settle(u, BATON_OUTCOME_NEUTRAL);
    baton_worker_unref(u->w);
    free(u->path);
    free(u->auth);
    baton_buf_free(&u->resp);
    body_unref(u->body);
    free(u);
}

static upstream_t *up_new(preq_t *pr, int side, baton_pick_t *p)
{
    upstream_t *u = calloc(1, sizeof(*u));
    if (!u)
        return NULL;
    u->pr = pr;
    u->side = side;
    u->w = p->w;
    u->ticket = p->ticket;
    u->reserved = 1;
    p->w = NULL;
    p->ticket = 0;
    return u;
}

static void pr_free(preq_t *pr)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    for (int i = 0; i < 2; i++)
        up_free(pr->up[i]);
    baton_workers_unref(pr->avoid, pr->n_avoid);
    free(pr->avoid);
    baton_pdreq_free(&pr->pd);
    baton_pdreq_lp_free(pr->lp);
    baton_sse_splitter_free(&pr->sse);
    baton_buf_free(&pr->held);
    baton_buf_free(&pr->scratch);
    baton_buf_free(&pr->fail.body);
    free(pr->fail.msg);
    baton_list_remove(&pr->link);
    pl->active--;
    int slot = pr->slot;
    free(pr);
    if (slot && r->admission) {
        baton_resil_metrics_active(r->resil, -1);
        baton_admission_release(r->admission);
    }
}

static void on_pr_timer_closed(uv_handle_t *h)
{
    pr_free(h->data);
}

static void pr_maybe_free(preq_t *pr)
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

static void on_pr_timer(uv_timer_t *t);

static void timer_start(preq_t *pr, enum tmode mode, uint64_t ms)
{
    if (pr->tstate == TS_CLOSED_NEVER) {
        uv_timer_init(pr->pl->loop, &pr->timer);
        pr->timer.data = pr;
        pr->tstate = TS_OPEN;
    }
    pr->tmode = mode;
    uv_timer_start(&pr->timer, on_pr_timer, ms, 0);
}

static void timer_stop(preq_t *pr)
{
    if (pr->tstate == TS_OPEN)
        uv_timer_stop(&pr->timer);
    pr->tmode = TM_NONE;
}

static int borrowed_body(const preq_t *pr)
{
    /* Regular attempts send the client's own body bytes, which live as long as the client
     * request; PD attempts send their own serialized body, and forwarding sends none. */
    return pr->borrowed;
}

static void cancel_up(upstream_t *u, const char *reason)
{
    if (u && u->creq && !u->cancelled) {
        u->cancelled = 1;
        baton_resil_metrics_abort(u->pr->pl->router->resil, u->w->role, reason);
        log_debug("router", "upstream_abort route=%s side=%s worker=%s reason=%s", u->pr->route,
                  baton_worker_role_name(u->w->role), u->w->url, reason);
        baton_http_request_cancel(u->creq);
    }
}

static void cancel_all(preq_t *pr, const char *reason)
{
    cancel_up(pr->up[UP_PREFILL], reason);
    cancel_up(pr->up[UP_MAIN], reason);
}

static void update_pause(preq_t *pr)
{
    upstream_t *u = pr->up[UP_MAIN];
    if (u && u->creq && !u->cancelled)
        baton_http_request_pause(u->creq, pr->bp_paused || pr->holding);
}

/* ---- failures decided for the client ---- */

static void fail_free(fail_t *f)
{
    free(f->msg);
    baton_buf_free(&f->body);
    memset(f, 0, sizeof(*f));
}

static void fail_clear(preq_t *pr)
{
    fail_free(&pr->fail);
}

static void fail_set_error(preq_t *pr, int status, const char *msg, const char *type,
                           const char *code)
{
    fail_clear(pr);
    pr->fail.kind = FAIL_ERROR;
    pr->fail.status = status;
    pr->fail.type = type;
    pr->fail.code = code;
    pr->fail.msg = strdup(msg); /* NULL: a generic message is used */
}

/* Sends the stored failure now: JSON before the stream started, else an SSE error event and
 * [DONE]; decode's own answer is passed through as it came. */
static void emit_failure(preq_t *pr)
{
    fail_t *f = &pr->fail;
    if (!pr->req)
        return;
    if (f->kind == FAIL_PASS && !pr->streaming) {
        pr_respond(pr, f->status, f->ctype[0] ? f->ctype : "application/json",
                   f->body.data ? f->body.data : "", f->body.len);
        return;
    }
    const char *msg = f->msg ? f->msg : "upstream request failed";
    const char *type = f->kind == FAIL_ERROR ? f->type : "upstream_error";
    const char *code = f->kind == FAIL_ERROR ? f->code : "upstream_error";
    int status = f->kind == FAIL_NONE ? 502 : f->status;
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

/* Finishes the client request with the stored failure once no upstream request borrows its
 * body; cancels whatever is still in flight. */
static void finish_failure(preq_t *pr, const char *abort_reason)
{
    cancel_all(pr, abort_reason);
    if (borrowed_body(pr) && pr->pending) {
        if (pr->def == DEF_NONE)
            pr->def = DEF_FAIL;
        return;
    }
    emit_failure(pr);
}

static void finish_error(preq_t *pr, int status, const char *msg, const char *type,
                         const char *code, const char *abort_reason)
{
    if (pr->def == DEF_NONE)
        fail_set_error(pr, status, msg, type, code);
    finish_failure(pr, abort_reason);
}

static void run_deferred(preq_t *pr)
{
    if (!pr->req || pr->pending || pr->def == DEF_NONE)
        return;
    if (pr->def == DEF_FAIL)
        emit_failure(pr);
    else if (pr->streaming)
        pr_stream_end(pr, 499); /* the client is gone: this only finishes the request */
    else
        pr_respond_error(pr, 499, "client closed the request", "invalid_request_error",
                         "client_closed");
}

/* ---- the admission queue ---- */

/* The oldest queued request, or NULL. */
static preq_t *queue_head(const baton_proxy_loop_t *pl)
{
    baton_list_t *first = baton_list_first(&pl->queue);
    return first ? container_of(first, preq_t, qlink) : NULL;
}

/* Takes pr out of its loop's queue; `final`: it leaves for good (its wait is observed), not
 * just to try for a worker and maybe come back to the head. */
static void queue_remove(preq_t *pr, int final)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (!pr->queued)
        return;
    pr->queued = 0;
    baton_list_remove(&pr->qlink);
    if (r->admission)
        baton_admission_dequeue(r->admission, &pl->waker);
    baton_resil_metrics_queue_depth(r->resil, -1);
    if (final)
        baton_resil_metrics_queue_time(r->resil, baton_seconds_since(pr->queued_ns));
    timer_stop(pr);
}

/* 0, or BATON_EBUSY when the queue is full. */
static int queue_add(preq_t *pr)
{
    baton_proxy_loop_t *pl = pr->pl;
    baton_router_t *r = pl->router;
    if (!r->admission || baton_admission_enqueue(r->admission, &pl->waker) != 0)
        return BATON_EBUSY;
    pr->queued = 1;
    pr->queued_ns = uv_hrtime();
    baton_list_push(&pl->queue, &pr->qlink);
    baton_resil_metrics_queue_depth(r->resil, +1);
    timer_start(pr, TM_QUEUE, r->cfg->queue_timeout_ms);
    return 0;
}

static void on_client_abort(baton_http_req_t *req)
{
    preq_t *pr = req->data;
    log_debug("router", "client_abort route=%s peer=%s", pr->route, req->peer);
    queue_remove(pr, 1);
    if (pr->tmode == TM_BACKOFF)
        timer_stop(pr);
    pr->def = DEF_ABORT;
    cancel_all(pr, "client_closed");
    run_deferred(pr); /* finishes now when nothing is in flight */
    pr_maybe_free(pr);
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
/* Attempts and retries                                                                     */

static const char *side_name(const upstream_t *u)
{
    return baton_worker_role_name(u->w->role);
}

static void avoid_add(preq_t *pr, baton_worker_t *w)
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
 * per-attempt response state is reset. Its workers are avoided by the next pick. */
static void abandon_attempt(preq_t *pr, const char *abort_reason)
{
    for (int i = 0; i < 2; i++) {
        upstream_t *u = pr->up[i];
        if (!u)
            continue;
        pr->up[i] = NULL;
        avoid_add(pr, u->w);
        if (u->creq) {
            cancel_up(u, abort_reason);
            u->stale = 1;
        } else {
            up_free(u);
        }
    }
    pr->bp_paused = pr->holding = pr->main_ended = pr->waiting_prefill = 0;
    pr->lp_ready = pr->lp_pass = 0;
    pr->merged_mask = 0;
    baton_pdreq_lp_free(pr->lp);
    pr->lp = NULL;
    baton_sse_splitter_free(&pr->sse);
    baton_buf_free(&pr->held);
}

static uint64_t ms_left(const preq_t *pr, uint64_t now_ns)
{
    if (!pr->deadline_ns)
        return UINT64_MAX;
    return pr->deadline_ns > now_ns ? (pr->deadline_ns - now_ns) / 1000000u : 0;
}

/*
 * A failure of side u (err < 0: transport; err 0: u->status) was decided and stored in pr->fail.
 * Returns 1 when a retry with a new pair was scheduled instead of answering the client.
 */
static int try_retry(preq_t *pr, upstream_t *u, int err)
{
    baton_router_t *r = pr->pl->router;
    if (!pr->req || pr->def != DEF_NONE || pr->streaming || pr->ttfb_ns || pr->no_retry ||
        pr->mode == MODE_FORWARD)
        return 0;
    uint64_t now = uv_hrtime();
    /* An attempt's total limit that is not the request's own deadline is a phase limit (the
     * prefill timeout): retryable like any phase timeout. */
    int cls = err == BATON_ETIMEOUT_TOTAL && ms_left(pr, now) > MIN_ATTEMPT_MS
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
    baton_retry_plan_t plan = baton_retry_plan(&pol, pr->attempts - 1, elapsed, ms_left(pr, now),
                                               MIN_ATTEMPT_MS, baton_rand_u64(), &delay);
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
             pr->route, pr->attempts + 1, side_name(u), u->w->url, baton_retry_reason_name(why),
             err ? baton_err_name(err) : "-", u->status, (unsigned long long)delay);
    abandon_attempt(pr, "peer_failed");
    timer_start(pr, TM_BACKOFF, delay);
    return 1;
}

static int is_timeout(int err)
{
    return err == BATON_ETIMEOUT_CONNECT || err == BATON_ETIMEOUT_FIRST_BYTE ||
           err == BATON_ETIMEOUT_IDLE || err == BATON_ETIMEOUT_TOTAL || err == BATON_ETIMEOUT;
}

/* An upstream failed at the transport level (err < 0) or answered with a non-2xx status that
 * is reported as this side's failure. Decides the client's answer, then retries with a new
 * pair when allowed, else answers and cancels the rest. */
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
        } else if (is_timeout(err)) { /* the connect timeout was taken above */
            status = 504;
            ci = C_TIMEOUT;
        } else if (err == BATON_ESHUTDOWN) {
            status = 503;
            ci = C_UNAVAILABLE;
        } else {
            status = err == BATON_ENOMEM ? 500 : 502;
            ci = C_FAILED;
        }
        if (err == BATON_ESHUTDOWN)
            snprintf(msg, sizeof(msg), "%s worker %s was removed and its drain deadline passed",
                     side, u->w->url);
        else
            snprintf(msg, sizeof(msg), "%s worker %s failed: %s", side, u->w->url,
                     baton_strerror(err));
    } else {
        /* The worker's own error: its status, with the start of its body. */
        int n = u->resp.len < 200 ? (int)u->resp.len : 200;
        snprintf(msg, sizeof(msg), "%s worker %s returned HTTP %d%s%.*s", side, u->w->url,
                 u->status, n ? ": " : "", n, u->resp.data ? u->resp.data : "");
        status = u->status >= 400 && u->status <= 599 ? u->status : 502;
        ci = C_STATUS;
    }
    log_warn("router",
             "upstream_failed route=%s side=%s worker=%s err=%s status=%d streaming=%d "
             "attempt=%u",
             pr->route, side, u->w->url, err ? baton_err_name(err) : "-", u->status,
             (int)pr->streaming, pr->attempts);
    unsigned role = (unsigned)u->w->role < BATON_ROLE_COUNT ? (unsigned)u->w->role : 2;
    if (pr->def == DEF_NONE)
        fail_set_error(pr, status, msg, "upstream_error", codes[role][ci]);
    if (try_retry(pr, u, err))
        return;
    finish_failure(pr,
                   err == BATON_ENOMEM || err == BATON_ETOOBIG ? "router_error" : "peer_failed");
}

static baton_http_timeouts_t attempt_timeouts(preq_t *pr, int side)
{
    const baton_config_t *cfg = pr->pl->router->cfg;
    baton_http_timeouts_t to = cfg->timeouts;
    if (side == UP_PREFILL && cfg->prefill_timeout_ms) {
        to.first_byte_ms = cfg->prefill_timeout_ms;
        if (!to.total_ms || cfg->prefill_timeout_ms < to.total_ms)
            to.total_ms = cfg->prefill_timeout_ms;
    }
    if (pr->deadline_ns) {
        uint64_t left = ms_left(pr, uv_hrtime());
        if (left == 0)
            left = 1; /* fails at once with ETIMEOUT_TOTAL */
        if (!to.total_ms || left < to.total_ms)
            to.total_ms = left;
    }
    return to;
}

static int up_start(preq_t *pr, upstream_t *u, const char *method, const char *path,
                    const char *body, size_t len)
{
    baton_worker_t *w = u->w;
    const char *query = pr->req->query ? pr->req->query : "";

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
    baton_http_timeouts_t to = attempt_timeouts(pr, u->side);
    int rc = baton_http_request(&u->creq, pool, method, u->path_use, u->hdrs, u->n_hdrs, body, len,
                                &to, &client_cb, u);
    if (rc) {
        u->creq = NULL;
        return rc;
    }
    pr->pending++;
    return 0;
}

/* Injects a fresh room for the pair in up[] and sends the one serialized body to both. */
static int pd_dispatch(preq_t *pr)
{
    upstream_t *p = pr->up[UP_PREFILL], *d = pr->up[UP_MAIN];
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
    body_t *b = calloc(1, sizeof(*b));
    if (!b)
        return BATON_ENOMEM;
    b->buf = pr->pd.out; /* this attempt's bytes: a retry serializes its own */
    pr->pd.out = (baton_buf_t)BATON_BUF_INIT;
    b->refs = 2;
    p->body = d->body = b;
    p->buffer = pr->pd.logprobs;
    const char *path = baton_api_path(pr->pd.api);
    if ((rc = up_start(pr, p, "POST", path, b->buf.data, b->buf.len)) != 0) {
        side_failed(pr, p, rc);
        return 0;
    }
    if ((rc = up_start(pr, d, "POST", path, b->buf.data, b->buf.len)) != 0) {
        side_failed(pr, d, rc);
        return 0;
    }
    log_debug("router", "dispatch route=%s prefill=%s decode=%s batch=%zu stream=%d attempt=%u",
              pr->route, p->w->url, d->w->url, pr->pd.batch, pr->pd.stream, pr->attempts);
    return 0;
}

/* The "no worker" answer, naming what is missing. */
static void respond_no_worker(preq_t *pr, int pd_missing_prefill)
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
    pr_respond_error(pr, 503, msg, "service_unavailable_error", code);
}

enum start_rc { ST_STARTED, ST_WAIT, ST_NOWORKER, ST_NOMEM };

/*
 * Picks workers for a new attempt and dispatches it: a PD pair when both roles can be picked,
 * else a regular worker. ST_WAIT: every eligible worker of a role needed is at its cap.
 * *missing_prefill tells which role was missing for ST_NOWORKER.
 */
static enum start_rc start_attempt(preq_t *pr, int *missing_prefill)
{
    baton_router_t *r = pr->pl->router;
    baton_pick_t p = {0}, d = {0}, w = {0};
    baton_pick_rc_t prc, drc = BATON_PICK_NONE, wrc;
    *missing_prefill = 1;
    prc = pick(r, BATON_ROLE_PREFILL, pr->avoid, pr->n_avoid, 1, &p);
    if (prc == BATON_PICK_OK) {
        drc = pick(r, BATON_ROLE_DECODE, pr->avoid, pr->n_avoid, 1, &d);
        if (drc != BATON_PICK_OK) {
            pick_release(r, &p, BATON_OUTCOME_NEUTRAL);
            *missing_prefill = 0;
        }
    }
    if (prc == BATON_PICK_OK && drc == BATON_PICK_OK) {
        upstream_t *up = up_new(pr, UP_PREFILL, &p), *ud = up ? up_new(pr, UP_MAIN, &d) : NULL;
        if (!up || !ud) {
            pick_release(r, &p, BATON_OUTCOME_NEUTRAL);
            pick_release(r, &d, BATON_OUTCOME_NEUTRAL);
            up_free(up);
            return ST_NOMEM;
        }
        pr->mode = MODE_PD;
        pr->up[UP_PREFILL] = up;
        pr->up[UP_MAIN] = ud;
        pr->attempts++;
        return pd_dispatch(pr) ? ST_NOMEM : ST_STARTED;
    }
    wrc = pick(r, BATON_ROLE_REGULAR, pr->avoid, pr->n_avoid, 1, &w);
    if (wrc == BATON_PICK_OK) {
        upstream_t *u = up_new(pr, UP_MAIN, &w);
        if (!u) {
            pick_release(r, &w, BATON_OUTCOME_NEUTRAL);
            return ST_NOMEM;
        }
        pr->mode = MODE_REGULAR;
        pr->up[UP_MAIN] = u;
        pr->attempts++;
        pr->borrowed = 1;
        /* The client's bytes go as they came: no re-serialization for a plain proxy. */
        const char *route = baton_api_path(pr->pd.api);
        int rc = up_start(pr, u, "POST", route, pr->req->body, pr->req->body_len);
        if (rc)
            side_failed(pr, u, rc);
        return ST_STARTED;
    }
    if (prc == BATON_PICK_CAPPED || drc == BATON_PICK_CAPPED || wrc == BATON_PICK_CAPPED)
        return ST_WAIT;
    return ST_NOWORKER;
}

/*
 * Admission then the first attempt. Returns ST_WAIT when the request must wait (no slot, or
 * every eligible worker at its cap): it holds no slot then. Otherwise the request was
 * dispatched or answered.
 */
static enum start_rc try_start(preq_t *pr, int fair)
{
    baton_router_t *r = pr->pl->router;
    if (r->admission && !pr->slot) {
        if (!baton_admission_try_acquire(r->admission, fair))
            return ST_WAIT;
        pr->slot = 1;
        baton_resil_metrics_active(r->resil, +1);
    }
    int missing_prefill;
    enum start_rc rc = start_attempt(pr, &missing_prefill);
    if (rc == ST_WAIT || rc == ST_NOWORKER) {
        if (pr->slot && r->admission) {
            pr->slot = 0;
            baton_resil_metrics_active(r->resil, -1);
            if (rc == ST_WAIT)
                baton_admission_release_quiet(r->admission);
            else
                baton_admission_release(r->admission);
        }
    }
    if (rc == ST_NOWORKER)
        respond_no_worker(pr, missing_prefill);
    else if (rc == ST_NOMEM)
        finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                     "router_error");
    return rc;
}

/* Starts queued requests of this loop while capacity allows, in order. */
static void queue_run(baton_proxy_loop_t *pl)
{
    preq_t *pr;
    while ((pr = queue_head(pl)) != NULL) {
        baton_router_t *r = pl->router;
        /* Try before leaving the queue (so the queue counts it until it has a slot), but with
         * fair = 0: it is the one allowed to take a slot. */
        if (r->admission && !pr->slot) {
            if (!baton_admission_try_acquire(r->admission, 0))
                return;
            pr->slot = 1;
            baton_resil_metrics_active(r->resil, +1);
        }
        queue_remove(pr, 0);
        enum start_rc rc = try_start(pr, 0);
        if (rc != ST_WAIT)
            baton_resil_metrics_queue_time(r->resil, baton_seconds_since(pr->queued_ns));
        if (rc == ST_WAIT) {
            /* All at their caps again: back to the head of the queue, nothing lost. */
            if (r->admission && baton_admission_enqueue(r->admission, &pl->waker) == 0) {
                pr->queued = 1;
                baton_list_push_front(&pl->queue, &pr->qlink);
                baton_resil_metrics_queue_depth(r->resil, +1);
                uint64_t waited = (uv_hrtime() - pr->queued_ns) / 1000000u;
                uint64_t left =
                    r->cfg->queue_timeout_ms > waited ? r->cfg->queue_timeout_ms - waited : 1;
                timer_start(pr, TM_QUEUE, left);
            } else {
                baton_resil_metrics_queue_time(r->resil, baton_seconds_since(pr->queued_ns));
                baton_resil_metrics_rejected(r->resil, "queue_full");
                pr_respond_queue_full(pr);
                pr_maybe_free(pr);
            }
            return;
        }
        pr_maybe_free(pr);
    }
}

static void on_pr_timer(uv_timer_t *t)
{
    preq_t *pr = t->data;
    baton_router_t *r = pr->pl->router;
    enum tmode mode = pr->tmode;
    pr->tmode = TM_NONE;
    if (mode == TM_QUEUE) {
        queue_remove(pr, 1);
        baton_resil_metrics_rejected(r->resil, "queue_timeout");
        char msg[160];
        snprintf(msg, sizeof(msg),
                 "no capacity within the queue timeout (%llu ms): every worker is busy",
                 (unsigned long long)r->cfg->queue_timeout_ms);
        pr_respond_error(pr, 503, msg, "service_unavailable_error", "queue_timeout");
    } else if (mode == TM_BACKOFF && pr->req && pr->def == DEF_NONE) {
        /* The new attempt owns the outcome; the last one's failure is kept aside for the case
         * no pair can be picked. */
        fail_t last = pr->fail;
        memset(&pr->fail, 0, sizeof(pr->fail));
        int missing_prefill;
        enum start_rc rc = start_attempt(pr, &missing_prefill);
        if (rc == ST_STARTED) {
            fail_free(&last);
        } else if (rc == ST_NOMEM) {
            fail_free(&last);
            finish_error(pr, 500, "router out of memory", "server_error", "internal_error",
                         "router_error");
        } else {
            baton_resil_metrics_retries_exhausted(r->resil, "no_worker");
            fail_clear(pr);
            pr->fail = last;
            finish_failure(pr, "peer_failed");
        }
    }
    pr_maybe_free(pr);
}

/* ---------------------------------------------------------------------------------------- */
/* Housekeeping                                                                             */

/* Removed workers get worker_drain_timeout_ms to finish what they have; then their upstream
 * requests are closed (a request that did not reach its client yet is retried elsewhere). */
static void drain_sweep(baton_proxy_loop_t *pl)
{
    baton_router_t *r = pl->router;
    uint64_t now = uv_hrtime();
    uint64_t limit_ns = r->cfg->worker_drain_timeout_ms * 1000000u;
    for (baton_list_t *it = pl->live.next, *next; it != &pl->live; it = next) {
        next = it->next;
        preq_t *pr = container_of(it, preq_t, link);
        for (int i = 0; i < 2; i++) {
            upstream_t *u = pr->up[i];
            if (!u || !u->creq || u->cancelled || !baton_worker_is_removed(u->w))
                continue;
            uint64_t since = baton_worker_removed_ns(u->w);
            if (!since || now - since < limit_ns)
                continue;
            log_warn("router", "drain_deadline route=%s side=%s worker=%s drain_timeout_ms=%llu",
                     pr->route, side_name(u), u->w->url,
                     (unsigned long long)r->cfg->worker_drain_timeout_ms);
            cancel_up(u, "drain_timeout");
            if (pr->req && pr->def == DEF_NONE)
                side_failed(pr, u, BATON_ESHUTDOWN);
            break; /* the request's state changed; the next tick looks again */
        }
    }
}

static void on_tick(uv_timer_t *t)
{
    baton_proxy_loop_t *pl = t->data;
    drain_sweep(pl);
    queue_run(pl);
}

static void on_wake(uv_async_t *a)
{
    queue_run(a->data);
}

void baton_proxy_loop_cancel_all(baton_proxy_loop_t *pl)
{
    preq_t *pr;
    while ((pr = queue_head(pl)) != NULL) {
        queue_remove(pr, 1);
        pr_respond_error(pr, 503, "router shutting down", "service_unavailable_error",
                         "shutting_down");
        pr_maybe_free(pr);
    }
    for (baton_list_t *it = pl->live.next, *next; it != &pl->live; it = next) {
        next = it->next;
        pr = container_of(it, preq_t, link);
        pr->no_retry = 1;
        if (pr->tmode == TM_BACKOFF) {
            timer_stop(pr);
            finish_failure(pr, "shutdown"); /* the last attempt's failure */
        } else if (pr->req && pr->def == DEF_NONE && (pr->up[0] || pr->up[1])) {
            finish_error(pr, 503, "router shutting down: drain deadline passed",
                         "service_unavailable_error", "shutting_down", "shutdown");
        } else {
            cancel_all(pr, "shutdown");
        }
        pr_maybe_free(pr);
    }
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
                     "internal_error", "router_error");
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

/*
 * Prefill failed after decode began streaming tokens: decode had its KV by then (it streams
 * only after the hand-off), so its answer is right and stays; ending it would turn a good
 * answer into an error. Only when prefill's logprobs are still needed is the stream failed.
 */
static int prefill_failure_is_late(const preq_t *pr)
{
    return pr->streaming && !pr->pd.logprobs;
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
    if (u->cancelled || u->stale || !pr->req)
        return;

    if (u->side == UP_MAIN) {
        if (is_2xx(status) && pr->pd.stream && u->sse && pr->mode != MODE_FORWARD) {
            /* The worker answers: that is its outcome for the breaker (a half-open probe must
             * not wait for the end of a long stream). */
            up_report(u, BATON_OUTCOME_SUCCESS); /* the in-flight slot stays until the end */
            pr_stream_start(pr);
        } else {
            u->buffer = 1;
            if (!is_2xx(status))
                cancel_up(pr->up[UP_PREFILL], "peer_failed"); /* decode's error decides */
        }
    } else if (!is_2xx(status)) {
        /* Prefill refused: decode would wait for a KV hand-off that never comes. (Once decode
         * streams it has its KV: see prefill_failure_is_late.) */
        u->buffer = 1;
        if (!prefill_failure_is_late(pr))
            cancel_up(pr->up[UP_MAIN], "peer_failed");
    }
}

static void on_data(baton_http_creq_t *creq, const char *data, size_t len)
{
    upstream_t *u = creq->data;
    preq_t *pr = u->pr;
    if (u->cancelled || u->stale || !pr->req)
        return;
    if (u->side == UP_MAIN && pr->streaming) {
        stream_bytes(pr, data, len);
        return;
    }
    if (!u->buffer)
        return; /* prefill's answer is read to the end and dropped */
    if (u->resp.len + len > MAX_UPSTREAM_BODY) {
        cancel_up(u, "router_error");
        side_failed(pr, u, BATON_ETOOBIG);
        return;
    }
    if (baton_buf_append(&u->resp, data, len))
        finish_error(pr, 500, "router out of memory buffering a response", "server_error",
                     "internal_error", "router_error");
}

/* Decode (or the regular worker) finished a buffered response: pass it on. */
static void main_body_done(preq_t *pr)
{
    upstream_t *u = pr->up[UP_MAIN];
    const char *ctype = u->ctype[0] ? u->ctype : "application/json";
    if (!is_2xx(u->status)) {
        cancel_up(pr->up[UP_PREFILL], "peer_failed");
        log_info("router", "upstream_status route=%s side=%s worker=%s status=%d attempt=%u",
                 pr->route, side_name(u), u->w->url, u->status, pr->attempts);
        /* Decode's own answer goes to the client as it came, unless a retry does better. */
        fail_clear(pr);
        pr->fail.kind = FAIL_PASS;
        pr->fail.status = u->status;
        snprintf(pr->fail.ctype, sizeof(pr->fail.ctype), "%s", ctype);
        pr->fail.body = u->resp;
        u->resp = (baton_buf_t)BATON_BUF_INIT;
        if (try_retry(pr, u, 0))
            return;
        finish_failure(pr, "peer_failed");
        return;
    }
    if (pr->mode == MODE_PD && pr->pd.logprobs) {
        if (!pr->lp_ready) {
            pr->waiting_prefill = 1;
            return;
        }
        baton_buf_reset(&pr->scratch);
        if (pr->lp && baton_pdreq_merge_body(pr->lp, u->resp.data, u->resp.len, &pr->scratch) > 0) {
            pr_respond(pr, u->status, ctype, pr->scratch.data, pr->scratch.len);
            return;
        }
    }
    pr_respond(pr, u->status, ctype, u->resp.data ? u->resp.data : "", u->resp.len);
}

static void prefill_ok(preq_t *pr)
{
    upstream_t *u = pr->up[UP_PREFILL];
    if (pr->pd.logprobs) {
        pr->lp = baton_pdreq_lp_extract(u->resp.data, u->resp.len);
        baton_buf_free(&u->resp);
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
static int blames_prefill(const preq_t *pr, const upstream_t *u, int err)
{
    if (pr->mode != MODE_PD || u->side != UP_MAIN || u->stale || err || u->status < 500)
        return 0;
    return body_mentions(&u->resp, "bootstrap") || body_mentions(&u->resp, "kvtransfer") ||
           body_mentions(&u->resp, "kv transfer") || body_mentions(&u->resp, "kv_transfer");
}

static void on_done(baton_http_creq_t *creq, int err)
{
    upstream_t *u = creq->data;
    preq_t *pr = u->pr;
    baton_router_t *r = pr->pl->router;

    u->creq = NULL;
    u->err = err;
    pr->pending--;
    /* The passive health signal: connect errors, timeouts, 5xx and early closes count against
     * the worker; 4xx and our own cancels do not. */
    baton_breaker_outcome_t outcome = baton_breaker_outcome(err, u->status);
    if (outcome == BATON_OUTCOME_FAILURE && blames_prefill(pr, u, err)) {
        /* Decode is alive and says its prefill peer failed it: one dead prefill must not open
         * every decode's breaker. Nor is the prefill charged on decode's word: its KV link from
         * that decode may simply be reconnecting (after a restart); a prefill that is really
         * down fails the router's own requests and checks. */
        outcome = BATON_OUTCOME_NEUTRAL;
        upstream_t *p = pr->up[UP_PREFILL];
        log_info("router", "failure_attributed_to_peer route=%s decode=%s prefill=%s status=%d",
                 pr->route, u->w->url, p ? p->w->url : "-", u->status);
    }
    up_settle(u, outcome);
    if (r->admission)
        baton_admission_kick(r->admission); /* a worker has room again */
    if (err && err != BATON_ECANCELED)
        baton_router_metrics_upstream_error(r->metrics, u->w->role,
                                            baton_router_metrics_error_kind(err));
    else if (!err && u->status >= 500)
        baton_router_metrics_upstream_error(r->metrics, u->w->role, "status_5xx");
    if (is_timeout(err) && !u->cancelled)
        baton_resil_metrics_abort(r->resil, u->w->role, "timeout");

    if (u->stale) {
        up_free(u);
        run_deferred(pr);
        pr_maybe_free(pr);
        return;
    }
    if (u->cancelled || !pr->req || pr->def != DEF_NONE) {
        run_deferred(pr);
        pr_maybe_free(pr);
        return;
    }
    if (u->side == UP_PREFILL) {
        if (is_2xx(u->status) && !err) {
            prefill_ok(pr);
        } else if (prefill_failure_is_late(pr)) {
            log_warn("router",
                     "prefill_failed_after_stream route=%s worker=%s err=%s status=%d "
                     "(decode's stream continues)",
                     pr->route, u->w->url, err ? baton_err_name(err) : "-", u->status);
            pr->lp_ready = 1;
        } else {
            side_failed(pr, u, err);
        }
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
/* Entry points                                                                             */

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
    preq_t *pr = pr_new(pl, req, route, MODE_PD);
    if (!pr) {
        baton_pdreq_free(&pd);
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return;
    }
    pr->pd = pd;
    if (try_start(pr, 1) == ST_WAIT) {
        if (queue_add(pr) != 0) {
            baton_resil_metrics_rejected(r->resil, "queue_full");
            log_info("router", "queue_full route=%s peer=%s queued=%u", route, req->peer,
                     r->admission ? baton_admission_queued(r->admission) : 0);
            pr_respond_queue_full(pr);
        }
    }
    pr_maybe_free(pr);
}

int baton_proxy_forward(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                        const baton_worker_role_t *roles, size_t n_roles)
{
    baton_router_t *r = pl->router;
    baton_pick_t w = {0};
    for (size_t i = 0; i < n_roles && !w.w; i++)
        pick(r, roles[i], NULL, 0, 0, &w);
    if (!w.w)
        return BATON_ENOWORKER;
    preq_t *pr = pr_new(pl, req, route, MODE_FORWARD);
    upstream_t *u = pr ? up_new(pr, UP_MAIN, &w) : NULL;
    if (!u) {
        pick_release(r, &w, BATON_OUTCOME_NEUTRAL);
        if (pr) {
            pr->req = NULL;
            req->data = NULL;
            req->on_abort = NULL;
            req->on_drain = NULL;
            pr_maybe_free(pr);
        }
        baton__respond_error(r, req, route, 500, "router out of memory", "server_error", NULL,
                             "internal_error");
        return 0;
    }
    pr->up[UP_MAIN] = u;
    pr->attempts = 1;
    u->buffer = 1;
    int rc = up_start(pr, u, "GET", req->path, NULL, 0);
    if (rc)
        side_failed(pr, u, rc);
    pr_maybe_free(pr);
    return 0;
}
