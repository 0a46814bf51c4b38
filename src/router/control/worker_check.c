/* worker_check.c — active health checks: one timer and one check connection per worker, on one
 * loop; targets follow the registry. */
#include "router/control/worker_check.h"

#include "baton/error.h"
#include "common/log.h"
#include "common/rand.h"
#include "common/buf.h"
#include "http/client.h"
#include "router/control/worker_models.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "health"

typedef struct target_s {
    baton_wcheck_t *wc;
    baton_worker_t *w; /* a reference */
    uv_timer_t timer;
    baton_http_pool_t *pool; /* max_idle 0: a fresh connection per check */
    baton_http_creq_t *req;  /* the check in flight, or NULL */
    int status;              /* of the check in flight, 0 until its head arrived */
    char *path;              /* worker prefix + check path */
    char *auth;              /* "Bearer <api_key>" or NULL */
    char *models_path;       /* worker prefix + /v1/models: read when it has no model_id */
    baton_buf_t models;      /* the model list being read */
    int models_status;       /* of the model list request, 0 until its head arrived */
    int dropping;            /* removed: freed once the timer closed and no check is out */
    int timer_open;
    int seen;            /* mark for the registry sweep */
    uint64_t last_delay; /* what the timer was last armed with */
    struct target_s *next;
} target_t;

struct baton_wcheck_s {
    uv_loop_t *loop;
    baton_whealth_t *wh;
    baton_wcheck_config_t cfg;
    uv_timer_t sync_timer;
    int sync_open;
    target_t *targets;
    size_t n_targets;
    size_t n_alive; /* targets not yet freed (including dropping ones) */
    uint64_t seen_gen;
    uint64_t rng;
    uint64_t started;
    int closing;
    baton_wcheck_close_cb close_cb;
    void *close_ctx;
    struct baton_tls_s *tls; /* for https:// workers; not owned */
};

void baton_wcheck_set_tls(baton_wcheck_t *wc, struct baton_tls_s *tls)
{
    wc->tls = tls;
}

int baton_wcheck_create(baton_wcheck_t **wc_p, uv_loop_t *loop, baton_whealth_t *wh)
{
    if (wc_p == NULL || loop == NULL || wh == NULL)
        return BATON_EINVAL;
    const baton_whealth_config_t *cfg = baton_whealth_config(wh);
    if (cfg->check.enabled && cfg->check.timeout_ms == 0)
        return BATON_EINVAL; /* a hung worker would hold its check forever */
    baton_wcheck_t *wc = calloc(1, sizeof(*wc));
    if (wc == NULL)
        return BATON_ENOMEM;
    wc->loop = loop;
    wc->wh = wh;
    wc->cfg = cfg->check;
    if (wc->cfg.sync_interval_ms == 0)
        wc->cfg.sync_interval_ms = 250;
    if (wc->cfg.interval_ms == 0)
        wc->cfg.interval_ms = 1;
    if (wc->cfg.fast_interval_ms == 0)
        wc->cfg.fast_interval_ms = wc->cfg.interval_ms;
    if (wc->cfg.down_interval_ms == 0)
        wc->cfg.down_interval_ms = wc->cfg.interval_ms;
    wc->rng = (cfg->seed ^ 0xD1B54A32D192ED03ull) | 1;
    /* Initialized now so close() always has a handle to close (its callback then never runs
     * inside close()); an initialized, stopped timer does not keep the loop alive. */
    int err = uv_timer_init(loop, &wc->sync_timer);
    if (err != 0) {
        free(wc);
        return err;
    }
    wc->sync_timer.data = wc;
    wc->sync_open = 1;
    *wc_p = wc;
    return 0;
}

size_t baton_wcheck_targets(const baton_wcheck_t *wc)
{
    return wc->n_targets;
}

uint64_t baton_wcheck_checks_started(const baton_wcheck_t *wc)
{
    return wc->started;
}

int baton_wcheck_target_info(const baton_wcheck_t *wc, const baton_worker_t *w,
                             uint64_t *last_delay_ms, int *in_flight)
{
    for (const target_t *t = wc->targets; t != NULL; t = t->next) {
        if (t->w != w)
            continue;
        if (last_delay_ms != NULL)
            *last_delay_ms = t->last_delay;
        if (in_flight != NULL)
            *in_flight = t->req != NULL;
        return 0;
    }
    return BATON_ENOTFOUND;
}

/* ---- freeing ---- */

static void maybe_finish_close(baton_wcheck_t *wc)
{
    if (!wc->closing || wc->n_alive > 0 || wc->sync_open)
        return;
    if (wc->close_cb != NULL)
        wc->close_cb(wc, wc->close_ctx);
    free(wc);
}

static void target_maybe_free(target_t *t)
{
    if (t->timer_open || t->req != NULL)
        return;
    baton_wcheck_t *wc = t->wc;
    baton_http_pool_destroy(t->pool); /* frees itself once the cancelled check is reported */
    baton_worker_unref(t->w);
    free(t->path);
    free(t->auth);
    free(t->models_path);
    baton_buf_free(&t->models);
    free(t);
    wc->n_alive--;
    maybe_finish_close(wc);
}

static void on_target_timer_closed(uv_handle_t *h)
{
    target_t *t = h->data;
    t->timer_open = 0;
    target_maybe_free(t);
}

/* Unlinks t and starts freeing it (cancels its check). */
static void target_drop(target_t *t)
{
    baton_wcheck_t *wc = t->wc;
    for (target_t **pp = &wc->targets; *pp != NULL; pp = &(*pp)->next) {
        if (*pp == t) {
            *pp = t->next;
            wc->n_targets--;
            break;
        }
    }
    t->next = NULL;
    t->dropping = 1;
    if (t->req != NULL)
        baton_http_request_cancel(t->req); /* on_done(ECANCELED) comes on a later turn */
    uv_close((uv_handle_t *)&t->timer, on_target_timer_closed);
}

/* ---- one check ---- */

static void on_target_timer(uv_timer_t *h);

static void schedule_after(target_t *t, int state)
{
    const baton_wcheck_config_t *c = &t->wc->cfg;
    uint64_t d;
    switch (state) {
    case BATON_WH_UP:
        d = c->interval_ms;
        break;
    case BATON_WH_DOWN:
        d = c->down_interval_ms;
        break;
    default:
        d = c->fast_interval_ms;
        break;
    }
    t->last_delay = d;
    uv_timer_start(&t->timer, on_target_timer, d, 0);
}

static void report(target_t *t, int ok, int status, int err)
{
    int state = baton_whealth_check_result(t->wc->wh, t->w, ok, status, err);
    if (state < 0) { /* removed between two syncs */
        target_drop(t);
        return;
    }
    schedule_after(t, state);
}

static int start_models(target_t *t);

static void on_check_head(baton_http_creq_t *req, int status, const baton_http_header_t *headers,
                          size_t n_headers)
{
    target_t *t = req->data;
    t->status = status;
}

static void on_check_done(baton_http_creq_t *req, int err)
{
    target_t *t = req->data;
    t->req = NULL;
    if (t->dropping || t->wc->closing) {
        target_maybe_free(t);
        return;
    }
    int ok = err == 0 && t->status >= 200 && t->status < 400;
    if (ok && t->w->model_id == NULL && start_models(t) == 0)
        return; /* reported once the list is read */
    report(t, ok, t->status, err);
}

static const baton_http_client_cb_t check_cb = {
    .on_head = on_check_head,
    .on_data = NULL,
    .on_done = on_check_done,
};

/* ---- the model list of a worker registered without a model_id ---- */

#define MODELS_BODY_MAX (256u * 1024u)

static void on_models_head(baton_http_creq_t *req, int status, const baton_http_header_t *headers,
                           size_t n_headers)
{
    target_t *t = req->data;
    t->models_status = status;
}

static void on_models_data(baton_http_creq_t *req, const char *data, size_t len)
{
    target_t *t = req->data;
    if (t->models.len + len <= MODELS_BODY_MAX)
        baton_buf_append(&t->models, data, len); /* out of memory: the list is not understood */
}

static void on_models_done(baton_http_creq_t *req, int err)
{
    target_t *t = req->data;
    t->req = NULL;
    if (t->dropping || t->wc->closing) {
        target_maybe_free(t);
        return;
    }
    /* The health check passed: a worker without a model list (404, not JSON) stays unnamed
     * and serves as a single-model worker does. */
    if (err == 0 && t->models_status == 200 &&
        baton_worker_models_found(t->w, t->models.data ? t->models.data : "", t->models.len) == 0)
        log_debug(COMP, "worker_models id=%s read", t->w->id);
    baton_buf_free(&t->models);
    report(t, 1, 200, 0);
}

static const baton_http_client_cb_t models_cb = {
    .on_head = on_models_head,
    .on_data = on_models_data,
    .on_done = on_models_done,
};

/* Starts reading t's /v1/models on the check's pool. 0, or an error (nothing started). */
static int start_models(target_t *t)
{
    baton_wcheck_t *wc = t->wc;
    if (t->models_path == NULL) {
        size_t plen = strlen(t->w->parsed.prefix) + sizeof("/v1/models");
        t->models_path = malloc(plen);
        if (t->models_path == NULL)
            return BATON_ENOMEM;
        snprintf(t->models_path, plen, "%s/v1/models", t->w->parsed.prefix);
    }
    baton_http_header_t hdr[2] = {{"User-Agent", "baton-health"}, {"Authorization", t->auth}};
    baton_http_timeouts_t to = {.connect_ms = wc->cfg.timeout_ms, .total_ms = wc->cfg.timeout_ms};
    t->models_status = 0;
    baton_buf_free(&t->models);
    int err = baton_http_request(&t->req, t->pool, "GET", t->models_path, hdr, t->auth ? 2 : 1,
                                 NULL, 0, &to, &models_cb, t);
    if (err != 0)
        t->req = NULL;
    return err;
}

static void on_target_timer(uv_timer_t *h)
{
    target_t *t = h->data;
    baton_wcheck_t *wc = t->wc;
    if (t->dropping || wc->closing || t->req != NULL)
        return;
    if (baton_worker_is_removed(t->w)) {
        target_drop(t);
        return;
    }
    int err = 0;
    if (t->pool == NULL)
        err = baton_http_pool_create(&t->pool, wc->loop, t->w->parsed.host, t->w->parsed.port, 0);
    if (err == 0 && t->w->parsed.tls) /* without a configuration the check fails: unhealthy */
        baton_http_pool_set_tls(t->pool, wc->tls);
    if (err == 0) {
        baton_http_header_t hdr[2];
        size_t nh = 0;
        hdr[nh].name = "User-Agent";
        hdr[nh++].value = "baton-health";
        if (t->auth != NULL) {
            hdr[nh].name = "Authorization";
            hdr[nh++].value = t->auth;
        }
        baton_http_timeouts_t to = {
            .connect_ms = wc->cfg.timeout_ms,
            .first_byte_ms = 0,
            .idle_ms = 0,
            .total_ms = wc->cfg.timeout_ms,
        };
        t->status = 0;
        err = baton_http_request(&t->req, t->pool, "GET", t->path, hdr, nh, NULL, 0, &to, &check_cb,
                                 t);
        if (err != 0)
            t->req = NULL;
    }
    wc->started++;
    if (err != 0) {
        log_debug(COMP, "worker_check_start_failed id=%s err=%s", t->w->id, baton_err_name(err));
        report(t, 0, 0, err);
    }
}

/* ---- following the registry ---- */

static target_t *target_find(baton_wcheck_t *wc, const baton_worker_t *w)
{
    for (target_t *t = wc->targets; t != NULL; t = t->next)
        if (t->w == w)
            return t;
    return NULL;
}

static int target_add(baton_wcheck_t *wc, baton_worker_t *w)
{
    target_t *t = calloc(1, sizeof(*t));
    if (t == NULL)
        return BATON_ENOMEM;
    size_t plen = strlen(w->parsed.prefix) + strlen(wc->cfg.path) + 2;
    t->path = malloc(plen);
    if (t->path == NULL) {
        free(t);
        return BATON_ENOMEM;
    }
    snprintf(t->path, plen, "%s%s%s", w->parsed.prefix, wc->cfg.path[0] == '/' ? "" : "/",
             wc->cfg.path);
    if (w->api_key != NULL && w->api_key[0] != '\0') {
        size_t alen = strlen(w->api_key) + 8;
        t->auth = malloc(alen);
        if (t->auth == NULL) {
            free(t->path);
            free(t);
            return BATON_ENOMEM;
        }
        snprintf(t->auth, alen, "Bearer %s", w->api_key);
    }
    int err = uv_timer_init(wc->loop, &t->timer);
    if (err != 0) {
        free(t->auth);
        free(t->path);
        free(t);
        return err;
    }
    t->timer.data = t;
    t->timer_open = 1;
    t->wc = wc;
    baton_worker_ref(w);
    t->w = w;
    t->seen = 1;
    t->next = wc->targets;
    wc->targets = t;
    wc->n_targets++;
    wc->n_alive++;
    /* First check: uniform in [0, interval) so checks of many workers spread out. */
    uint64_t delay = baton_xorshift64s(&wc->rng) % wc->cfg.interval_ms;
    t->last_delay = delay;
    uv_timer_start(&t->timer, on_target_timer, delay, 0);
    log_debug(COMP, "worker_check_added id=%s url=%s first_check_ms=%llu", w->id, w->url,
              (unsigned long long)delay);
    return 0;
}

#define SNAP_STACK 64

static void reconcile(baton_wcheck_t *wc)
{
    baton_registry_t *reg = baton_whealth_registry(wc->wh);
    uint64_t gen = baton_registry_generation(reg);
    if (gen == wc->seen_gen)
        return;
    baton_worker_t *stack[SNAP_STACK];
    baton_worker_t **ws = stack;
    size_t cap = SNAP_STACK;
    size_t total = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, ws, cap);
    if (total > cap) {
        baton_workers_unref(ws, cap);
        cap = total + 16;
        ws = malloc(cap * sizeof(*ws));
        if (ws == NULL)
            return; /* next sync retries */
        total = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, ws, cap);
    }
    size_t n = total < cap ? total : cap;
    int complete = total <= cap;
    for (target_t *t = wc->targets; t != NULL; t = t->next)
        t->seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (baton_worker_is_removed(ws[i]))
            continue;
        target_t *t = target_find(wc, ws[i]);
        if (t != NULL)
            t->seen = 1;
        else if (target_add(wc, ws[i]) != 0)
            complete = 0;
    }
    if (complete) {
        target_t *t = wc->targets;
        while (t != NULL) {
            target_t *next = t->next;
            if (!t->seen || baton_worker_is_removed(t->w)) {
                log_debug(COMP, "worker_check_dropped id=%s url=%s", t->w->id, t->w->url);
                target_drop(t);
            }
            t = next;
        }
        wc->seen_gen = gen;
    }
    baton_workers_unref(ws, n);
    if (ws != stack)
        free(ws);
}

static void on_sync_timer(uv_timer_t *h)
{
    baton_wcheck_t *wc = h->data;
    if (wc->closing)
        return;
    baton_whealth_sync(wc->wh);
    if (wc->cfg.enabled)
        reconcile(wc);
}

int baton_wcheck_start(baton_wcheck_t *wc)
{
    if (wc->closing)
        return BATON_ESHUTDOWN;
    return uv_timer_start(&wc->sync_timer, on_sync_timer, 0, wc->cfg.sync_interval_ms);
}

static void on_sync_closed(uv_handle_t *h)
{
    baton_wcheck_t *wc = h->data;
    wc->sync_open = 0;
    maybe_finish_close(wc);
}

void baton_wcheck_close(baton_wcheck_t *wc, baton_wcheck_close_cb close_cb, void *ctx)
{
    if (wc == NULL || wc->closing)
        return;
    wc->closing = 1;
    wc->close_cb = close_cb;
    wc->close_ctx = ctx;
    while (wc->targets != NULL)
        target_drop(wc->targets);
    uv_close((uv_handle_t *)&wc->sync_timer, on_sync_closed);
}
