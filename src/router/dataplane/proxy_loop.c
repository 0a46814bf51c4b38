/* proxy_loop.c — the router's shared policy slots and the proxy's per-loop context: upstream
 * pools per worker, housekeeping (drain deadlines of removed workers, queue wake-ups) and the
 * shutdown that ends every request of the loop. */
#include "router/dataplane/proxy_internal.h"
#include "router/dataplane/rtok.h"

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/log.h"

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
/* Loop context                                                                             */

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
    pl->http = &baton_http_client_ops;
    baton_list_init(&pl->live);
    baton_list_init(&pl->queue);
    pl->gen = baton_registry_generation(router->registry);
    pl->waker.wake = wake_loop;
    pl->waker.ctx = pl;
    atomic_init(&pl->waker.waiting, 0);
    *pl_p = pl;
    return 0;
}

void baton__proxy_loop_set_client_ops(baton_proxy_loop_t *pl, const baton_http_client_ops_t *ops)
{
    pl->http = ops;
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
    uv_timer_start(&pl->tick, on_tick, BATON_PROXY_TICK_MS, BATON_PROXY_TICK_MS);
    uv_unref((uv_handle_t *)&pl->tick);
    uv_unref((uv_handle_t *)&pl->wake);
    if (pl->router->admission)
        baton_admission_register(pl->router->admission, &pl->waker);
    return 0;
}

static size_t spare_size(int kind)
{
    return kind == BATON__SPARE_PREQ ? sizeof(baton__preq_t) : sizeof(baton__upstream_t);
}

void *baton__pl_calloc(baton_proxy_loop_t *pl, int kind)
{
    if (pl->n_spare[kind] == 0)
        return calloc(1, spare_size(kind));
    void *p = pl->spare[kind][--pl->n_spare[kind]];
    memset(p, 0, spare_size(kind));
    return p;
}

void baton__pl_free(baton_proxy_loop_t *pl, int kind, void *p)
{
    if (BATON_POOL_REUSE && p && pl->n_spare[kind] < BATON__SPARE_MAX)
        pl->spare[kind][pl->n_spare[kind]++] = p;
    else
        free(p);
}

baton_rtok_local_t *baton__pl_rtok(baton_proxy_loop_t *pl)
{
    if (!pl->rtok && pl->router->rtok)
        pl->rtok = baton_rtok_local_new(pl->router->rtok);
    return pl->rtok;
}

static void pl_free(baton_proxy_loop_t *pl)
{
    baton_rtok_local_free(pl->rtok);
    for (int k = 0; k < BATON__SPARE_KINDS; k++)
        while (pl->n_spare[k] > 0)
            free(pl->spare[k][--pl->n_spare[k]]);
    free(pl);
}

static void on_pl_handle_closed(uv_handle_t *h)
{
    baton_proxy_loop_t *pl = h->data;
    if (--pl->open_handles == 0)
        pl_free(pl);
}

void baton_proxy_loop_destroy(baton_proxy_loop_t *pl)
{
    if (!pl)
        return;
    for (size_t i = 0; i < pl->n_pools; i++) {
        pl->http->pool_destroy(pl->pools[i].pool);
        baton_worker_unref(pl->pools[i].w);
    }
    free(pl->pools);
    pl->pools = NULL;
    pl->n_pools = pl->cap_pools = 0;
    if (pl->router->admission && pl->started)
        baton_admission_unregister(pl->router->admission, &pl->waker);
    if (pl->open_handles == 0) {
        pl_free(pl);
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

/* ---------------------------------------------------------------------------------------- */
/* Upstream pools                                                                           */

/* Drops the pools of removed workers (their in-flight requests finish on their own). */
static void pools_sweep(baton_proxy_loop_t *pl)
{
    for (size_t i = 0; i < pl->n_pools;) {
        if (baton_worker_is_removed(pl->pools[i].w)) {
            pl->http->pool_destroy(pl->pools[i].pool);
            baton_worker_unref(pl->pools[i].w);
            pl->pools[i] = pl->pools[--pl->n_pools];
        } else {
            i++;
        }
    }
}

/* Keyed by the worker object: the cache holds a reference, so the pointer cannot be reused by
 * another worker while cached. */
baton_http_pool_t *baton__pool_for(baton_proxy_loop_t *pl, baton_worker_t *w)
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
        baton__pool_entry_t *p = realloc(pl->pools, cap * sizeof(*p));
        if (!p)
            return NULL;
        pl->pools = p;
        pl->cap_pools = cap;
    }
    baton_http_pool_t *pool;
    if (pl->http->pool_create(&pool, pl->loop, w->parsed.host, w->parsed.port,
                              BATON_PROXY_POOL_MAX_IDLE))
        return NULL;
    if (w->parsed.tls) {
        if (pl->router->upstream_tls == NULL || pl->http->set_tls == NULL) {
            log_error("router", "upstream_tls_unavailable worker=%s", w->url);
            pl->http->pool_destroy(pool);
            return NULL;
        }
        pl->http->set_tls(pool, pl->router->upstream_tls);
    }
    baton_worker_ref(w);
    pl->pools[pl->n_pools++] = (baton__pool_entry_t){w, pool};
    return pool;
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
        baton__preq_t *pr = container_of(it, baton__preq_t, link);
        for (int i = 0; i < 2; i++) {
            baton__upstream_t *u = pr->up[i];
            if (!u || !u->creq || u->cancelled || !baton_worker_is_removed(u->w))
                continue;
            uint64_t since = baton_worker_removed_ns(u->w);
            if (!since || now - since < limit_ns)
                continue;
            log_warn("router", "drain_deadline route=%s side=%s worker=%s drain_timeout_ms=%llu",
                     pr->route, baton__side_name(u), u->w->url,
                     (unsigned long long)r->cfg->worker_drain_timeout_ms);
            baton__up_cancel(u, "drain_timeout");
            if (!baton__pr_decided(pr))
                baton__side_failed(pr, u, BATON_ESHUTDOWN);
            break; /* the request's state changed; the next tick looks again */
        }
    }
}

static void on_tick(uv_timer_t *t)
{
    baton_proxy_loop_t *pl = t->data;
    drain_sweep(pl);
    baton__queue_run(pl);
}

static void on_wake(uv_async_t *a)
{
    baton__queue_run(a->data);
}

void baton_proxy_loop_cancel_all(baton_proxy_loop_t *pl)
{
    baton__preq_t *pr;
    while ((pr = baton__queue_head(pl)) != NULL) {
        baton__queue_remove(pr, 1);
        baton__pr_respond_error(pr, 503, "router shutting down", "service_unavailable_error",
                                "shutting_down");
        baton__pr_maybe_free(pr);
    }
    for (baton_list_t *it = pl->live.next, *next; it != &pl->live; it = next) {
        next = it->next;
        pr = container_of(it, baton__preq_t, link);
        pr->no_retry = 1;
        if (pr->phase == PH_RETRY_WAIT) {
            baton__finish_failure(pr, "shutdown"); /* the last attempt's failure */
        } else if (!baton__pr_decided(pr) && (pr->up[0] || pr->up[1])) {
            baton__finish_error(pr, 503, "router shutting down: drain deadline passed",
                                "service_unavailable_error", "shutting_down", "shutdown");
        } else {
            baton__pr_cancel_all(pr, "shutdown");
        }
        baton__pr_maybe_free(pr);
    }
}
