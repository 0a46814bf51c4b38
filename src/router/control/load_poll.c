/* load_poll.c — the reported-load poller: one timer on one loop, one GET /get_load per worker and
 * interval, the answers stored on the workers for least_load. */
#include "router/control/load_poll.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/clock.h"
#include "common/log.h"
#include "http/client.h"

#define COMP      "load_poll"
#define BODY_MAX  (64 * 1024) /* a /get_load answer is a few hundred bytes per DP rank */
#define SNAP_HINT 64

typedef struct poll_s {
    baton_lpoll_t *lp;
    baton_worker_t *w; /* a reference */
    baton_http_pool_t *pool;
    baton_http_creq_t *req;
    int status;
    char *path, *auth;
    char *body;
    size_t len;
    int too_big;
    struct poll_s *next;
} poll_t;

struct baton_lpoll_s {
    uv_loop_t *loop;
    baton_registry_t *reg;
    uint64_t interval_ms;
    uv_timer_t timer;
    int timer_open;
    poll_t *polls; /* out now */
    uint64_t ok, failed;
    int closing;
    baton_lpoll_close_cb close_cb;
    void *close_ctx;
    struct baton_tls_s *tls;
};

/* ---- the answer ---- */

static int sum_rank(json_t *e, long *sum)
{
    json_t *n = json_object_get(e, "num_reqs");
    if (json_is_integer(n)) {
        *sum += (long)json_integer_value(n);
        return 0;
    }
    json_t *r = json_object_get(e, "num_running_reqs"), *q = json_object_get(e, "num_waiting_reqs");
    if (!json_is_integer(r) || !json_is_integer(q))
        return BATON_EINVAL;
    *sum += (long)(json_integer_value(r) + json_integer_value(q));
    return 0;
}

int baton_load_parse(const char *body, size_t len, long *load_p)
{
    json_t *j = json_loadb(body, len, 0, NULL);
    if (j == NULL)
        return BATON_EINVAL;
    int rc = BATON_EINVAL;
    long sum = 0;
    if (json_is_array(j) && json_array_size(j) > 0) {
        size_t i;
        json_t *e;
        rc = 0;
        json_array_foreach(j, i, e)
        {
            if (!json_is_object(e) || sum_rank(e, &sum) != 0) {
                rc = BATON_EINVAL;
                break;
            }
        }
    } else if (json_is_object(j) && json_is_integer(json_object_get(j, "load"))) {
        sum = (long)json_integer_value(json_object_get(j, "load"));
        rc = 0;
    }
    json_decref(j);
    if (rc == 0 && sum < 0)
        rc = BATON_EINVAL;
    if (rc == 0)
        *load_p = sum;
    return rc;
}

/* ---- freeing ---- */

static void maybe_finish_close(baton_lpoll_t *lp)
{
    if (!lp->closing || lp->polls != NULL || lp->timer_open)
        return;
    if (lp->close_cb != NULL)
        lp->close_cb(lp, lp->close_ctx);
    free(lp);
}

static void poll_free(poll_t *p)
{
    baton_lpoll_t *lp = p->lp;
    for (poll_t **pp = &lp->polls; *pp != NULL; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    baton_http_pool_destroy(p->pool);
    baton_worker_unref(p->w);
    free(p->path);
    free(p->auth);
    free(p->body);
    free(p);
    maybe_finish_close(lp);
}

/* ---- one poll ---- */

static void on_head(baton_http_creq_t *req, int status, const baton_http_header_t *headers,
                    size_t n_headers)
{
    (void)headers;
    (void)n_headers;
    ((poll_t *)req->data)->status = status;
}

static void on_data(baton_http_creq_t *req, const char *data, size_t len)
{
    poll_t *p = req->data;
    if (p->too_big || p->len + len > BODY_MAX) {
        p->too_big = 1;
        return;
    }
    char *b = realloc(p->body, p->len + len + 1);
    if (b == NULL) {
        p->too_big = 1;
        return;
    }
    memcpy(b + p->len, data, len);
    p->body = b;
    p->len += len;
}

static void on_done(baton_http_creq_t *req, int err)
{
    poll_t *p = req->data;
    baton_lpoll_t *lp = p->lp;
    p->req = NULL;
    long load = 0;
    if (!lp->closing && err == 0 && p->status == 200 && !p->too_big && p->body != NULL &&
        baton_load_parse(p->body, p->len, &load) == 0) {
        baton_worker_t *w = p->w;
        atomic_store_explicit(&w->reported_load, load, memory_order_relaxed);
        atomic_store_explicit(&w->reported_base, baton_worker_in_flight(w), memory_order_relaxed);
        atomic_store_explicit(&w->reported_until_ms, baton_now_ms() + 3 * lp->interval_ms,
                              memory_order_release);
        lp->ok++;
    } else if (!lp->closing) {
        /* withdrawn: least_load goes back to the router's own count for this worker */
        atomic_store_explicit(&p->w->reported_until_ms, 0, memory_order_release);
        lp->failed++;
        log_debug(COMP, "load_poll_failed id=%s status=%d err=%s", p->w->id, p->status,
                  err ? baton_err_name(err) : "none");
    }
    poll_free(p);
}

static const baton_http_client_cb_t poll_cb = {
    .on_head = on_head,
    .on_data = on_data,
    .on_done = on_done,
};

static int poll_start(baton_lpoll_t *lp, baton_worker_t *w)
{
    poll_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return BATON_ENOMEM;
    size_t plen = strlen(w->parsed.prefix) + sizeof("/get_load");
    p->path = malloc(plen);
    int err = p->path == NULL ? BATON_ENOMEM : 0;
    if (err == 0) {
        snprintf(p->path, plen, "%s/get_load", w->parsed.prefix);
        if (w->api_key != NULL && w->api_key[0] != '\0') {
            size_t alen = strlen(w->api_key) + 8;
            if ((p->auth = malloc(alen)) == NULL)
                err = BATON_ENOMEM;
            else
                snprintf(p->auth, alen, "Bearer %s", w->api_key);
        }
    }
    if (err == 0)
        err = baton_http_pool_create(&p->pool, lp->loop, w->parsed.host, w->parsed.port, 0);
    if (err == 0 && w->parsed.tls)
        baton_http_pool_set_tls(p->pool, lp->tls);
    if (err == 0) {
        baton_http_header_t hdr[2] = {{"User-Agent", "baton-load-poll"},
                                      {"Authorization", p->auth}};
        uint64_t limit = lp->interval_ms < 1000 ? 1000 : lp->interval_ms;
        baton_http_timeouts_t to = {.connect_ms = limit, .total_ms = limit};
        err = baton_http_request(&p->req, p->pool, "GET", p->path, hdr, p->auth ? 2 : 1, NULL, 0,
                                 &to, &poll_cb, p);
    }
    if (err != 0) {
        baton_http_pool_destroy(p->pool);
        free(p->path);
        free(p->auth);
        free(p);
        return err;
    }
    baton_worker_ref(w);
    p->w = w;
    p->lp = lp;
    p->next = lp->polls;
    lp->polls = p;
    return 0;
}

static int polling(const baton_lpoll_t *lp, const baton_worker_t *w)
{
    for (const poll_t *p = lp->polls; p != NULL; p = p->next)
        if (p->w == w)
            return 1;
    return 0;
}

static void on_timer(uv_timer_t *h)
{
    baton_lpoll_t *lp = h->data;
    if (lp->closing)
        return;
    baton_worker_t *stack[SNAP_HINT];
    baton_worker_t **ws;
    size_t n =
        baton_registry_snapshot_all(lp->reg, BATON_ROLE_ANY, BATON_SNAP_ALL, stack, SNAP_HINT, &ws);
    for (size_t i = 0; i < n; i++) {
        if (baton_worker_is_removed(ws[i]) || polling(lp, ws[i]))
            continue; /* a worker slower than the interval keeps one poll out, not a pile */
        int err = poll_start(lp, ws[i]);
        if (err != 0) {
            atomic_store_explicit(&ws[i]->reported_until_ms, 0, memory_order_release);
            lp->failed++;
            log_debug(COMP, "load_poll_start_failed id=%s err=%s", ws[i]->id, baton_err_name(err));
        }
    }
    baton_workers_release(ws, n, stack);
}

/* ---- life ---- */

int baton_lpoll_create(baton_lpoll_t **lp_p, uv_loop_t *loop, baton_registry_t *reg,
                       uint64_t interval_ms)
{
    if (lp_p == NULL || loop == NULL || reg == NULL || interval_ms == 0)
        return BATON_EINVAL;
    baton_lpoll_t *lp = calloc(1, sizeof(*lp));
    if (lp == NULL)
        return BATON_ENOMEM;
    int err = uv_timer_init(loop, &lp->timer);
    if (err != 0) {
        free(lp);
        return err;
    }
    lp->timer.data = lp;
    lp->timer_open = 1;
    lp->loop = loop;
    lp->reg = reg;
    lp->interval_ms = interval_ms;
    *lp_p = lp;
    return 0;
}

void baton_lpoll_set_tls(baton_lpoll_t *lp, struct baton_tls_s *tls)
{
    lp->tls = tls;
}

int baton_lpoll_start(baton_lpoll_t *lp)
{
    if (lp->closing)
        return BATON_ESHUTDOWN;
    return uv_timer_start(&lp->timer, on_timer, 0, lp->interval_ms);
}

uint64_t baton_lpoll_ok(const baton_lpoll_t *lp)
{
    return lp->ok;
}

uint64_t baton_lpoll_failed(const baton_lpoll_t *lp)
{
    return lp->failed;
}

static void on_timer_closed(uv_handle_t *h)
{
    baton_lpoll_t *lp = h->data;
    lp->timer_open = 0;
    maybe_finish_close(lp);
}

void baton_lpoll_close(baton_lpoll_t *lp, baton_lpoll_close_cb close_cb, void *ctx)
{
    if (lp == NULL || lp->closing)
        return;
    lp->closing = 1;
    lp->close_cb = close_cb;
    lp->close_ctx = ctx;
    for (poll_t *p = lp->polls; p != NULL; p = p->next)
        if (p->req != NULL)
            baton_http_request_cancel(p->req); /* on_done(ECANCELED) on a later turn frees it */
    uv_close((uv_handle_t *)&lp->timer, on_timer_closed);
}
