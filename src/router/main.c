/* main.c — the `baton` router executable: configuration, shared state, one libuv loop + HTTP
 * server per thread on one reuseport address, the worker health checker, signals (SIGTERM
 * drain, SIGHUP reload). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <uv.h>

#include "baton/error.h"
#include "common/fd_limit.h"
#include "common/log.h"
#include "common/metrics.h"
#include "router/control/kv_route.h"
#include "router/control/load_poll.h"
#include "router/control/worker_check.h"
#include "router/control/worker_health.h"
#include "http/server.h"
#include "http/tls.h"
#include "router/dataplane/admission.h"
#include "router/control/config.h"
#include "router/control/etcd_sync.h"
#include "router/dataplane/policy.h"
#include "router/dataplane/proxy.h"
#include "router/control/registry.h"
#include "router/control/reload.h"
#include "router/dataplane/resil_metrics.h"
#include "router/dataplane/rtok.h"
#include "router/dataplane/router_metrics.h"
#include "router/routes.h"
#include "router/dataplane/token_metrics.h"

/* After the drain deadline, requests are cancelled; if something still holds the process (an
 * upstream that never reports its close), it exits anyway this much later. */
#define SHUTDOWN_GRACE_MS 10000
/* How often a draining loop looks whether its last request finished. */
#define DRAIN_POLL_MS 20

typedef struct app_s app_t;

enum stop_mode { STOP_NONE = 0, STOP_DRAIN = 1, STOP_FORCE = 2 };

typedef struct rthread_s {
    app_t *app;
    unsigned idx;
    uv_thread_t tid;
    int started;
    uv_loop_t loop;
    uv_async_t stop;
    uv_timer_t drain_poll;
    atomic_int stop_mode; /* enum stop_mode, set by the main thread */
    int stop_closed;      /* `stop` is closing: no more sends (guarded by app->lock) */
    int mode_seen;        /* the mode this loop acted on */
    baton_http_server_t *srv;
    baton_proxy_loop_t *pl;
    baton_wcheck_t *wc; /* thread 0 only */
    baton_lpoll_t *lp;  /* thread 0 only, with --load-poll-interval-ms */
    int port;           /* in: port to bind; out: the real port */
    int rc;             /* start-up result */
    uv_sem_t ready;
} rthread_t;

typedef struct retired_s {
    baton_policy_t *p;
    struct retired_s *next;
} retired_t;

struct app_s {
    int argc;
    char **argv;
    baton_config_t cfg;
    baton_router_t router;
    rthread_t *threads;
    unsigned n_threads;
    uv_loop_t *main_loop;
    uv_signal_t sigint, sigterm, sighup;
    uv_timer_t deadline;
    uv_async_t thread_done;
    uv_mutex_t lock;
    unsigned n_done;              /* guarded by lock */
    int stopping;                 /* 1 draining, 2 forced */
    retired_t *retired;           /* policies replaced by reloads: freed at exit */
    baton_http_budget_t budget;   /* buffered bytes, all threads' servers */
    baton_etcd_sync_t *etcd_sync; /* --registry etcd://...: on the main loop; NULL without */
    baton_tls_t *registry_tls;    /* --registry etcds://...: the sync's TLS; NULL without */
};

/* ---- router threads ---- */

static void on_handle_closed(uv_handle_t *h)
{
    (void)h;
}

static void on_srv_closed(baton_http_server_t *srv)
{
    rthread_t *t = srv->data;
    t->srv = NULL;
    /* No proxied request is alive any more: the pools can go (idle connections close). */
    baton_proxy_loop_destroy(t->pl);
    t->pl = NULL;
    if (t->wc) {
        baton_wcheck_close(t->wc, NULL, NULL);
        t->wc = NULL;
    }
    if (t->lp) {
        baton_lpoll_close(t->lp, NULL, NULL);
        t->lp = NULL;
    }
    uv_close((uv_handle_t *)&t->drain_poll, on_handle_closed);
    uv_mutex_lock(&t->app->lock);
    t->stop_closed = 1;
    uv_mutex_unlock(&t->app->lock);
    uv_close((uv_handle_t *)&t->stop, on_handle_closed);
}

static void close_server(rthread_t *t)
{
    if (!t->srv)
        return;
    uv_timer_stop(&t->drain_poll);
    baton_http_server_t *srv = t->srv;
    baton_http_server_stop_accepting(srv);
    baton_http_server_close(srv, on_srv_closed);
}

static void on_drain_poll(uv_timer_t *timer)
{
    rthread_t *t = timer->data;
    if (t->pl && baton_proxy_loop_active(t->pl) == 0) {
        log_debug("router", "drained thread=%u", t->idx);
        close_server(t);
    }
}

static void on_stop(uv_async_t *a)
{
    rthread_t *t = a->data;
    int mode = atomic_load(&t->stop_mode);
    if (!t->srv || mode <= t->mode_seen)
        return;
    t->mode_seen = mode;
    if (mode == STOP_DRAIN) {
        /* No new connections; idle keep-alive ones close, busy ones after their response. */
        baton_http_server_stop_accepting(t->srv);
        uv_timer_start(&t->drain_poll, on_drain_poll, 0, DRAIN_POLL_MS);
        return;
    }
    /* Deadline: every request still here gets its answer (503 or an SSE error) now. */
    if (t->pl)
        baton_proxy_loop_cancel_all(t->pl);
    close_server(t);
}

static void thread_main(void *arg)
{
    rthread_t *t = arg;
    app_t *app = t->app;
    int rc;

    if ((rc = uv_loop_init(&t->loop)) != 0 ||
        (rc = baton_proxy_loop_create(&t->pl, &t->loop, &app->router)) != 0 ||
        (rc = baton_proxy_loop_start(t->pl)) != 0 ||
        (rc = baton_http_server_create(&t->srv, &t->loop, &app->cfg.limits, baton_routes_handle,
                                       t->pl)) != 0 ||
        (t->srv->data = t, 0) || (baton_http_server_set_budget(t->srv, &app->budget), 0) ||
        (baton_http_server_set_tls(t->srv, app->router.server_tls), 0) ||
        (rc = baton_http_server_listen(t->srv, app->cfg.host, t->port, 1)) != 0) {
        /* Start-up failure: the process exits; nothing to unwind. */
        t->rc = rc;
        uv_sem_post(&t->ready);
        return;
    }
    t->port = baton_http_server_port(t->srv);
    t->stop.data = t;
    t->drain_poll.data = t;
    if ((rc = uv_async_init(&t->loop, &t->stop, on_stop)) != 0 ||
        (rc = uv_timer_init(&t->loop, &t->drain_poll)) != 0) {
        t->rc = rc;
        uv_sem_post(&t->ready);
        return;
    }
    /* The first loop also runs the active health checks (and the breakers' cool-down sync). */
    if (t->idx == 0 && app->router.health) {
        if ((rc = baton_wcheck_create(&t->wc, &t->loop, app->router.health)) != 0 ||
            (baton_wcheck_set_tls(t->wc, app->router.upstream_tls), 0) ||
            (rc = baton_wcheck_start(t->wc)) != 0) {
            t->rc = rc;
            uv_sem_post(&t->ready);
            return;
        }
    }
    /* ... and the reported-load poller for least_load, when asked for. */
    if (t->idx == 0 && app->cfg.load_poll_interval_ms > 0) {
        if ((rc = baton_lpoll_create(&t->lp, &t->loop, app->router.registry,
                                     app->cfg.load_poll_interval_ms)) != 0 ||
            (baton_lpoll_set_tls(t->lp, app->router.upstream_tls), 0) ||
            (rc = baton_lpoll_start(t->lp)) != 0) {
            t->rc = rc;
            uv_sem_post(&t->ready);
            return;
        }
    }
    t->rc = 0;
    uv_sem_post(&t->ready);

    uv_run(&t->loop, UV_RUN_DEFAULT);
    if (uv_loop_close(&t->loop) != 0)
        log_debug("router", "loop_close_busy thread=%u", t->idx);

    uv_mutex_lock(&app->lock);
    app->n_done++;
    uv_mutex_unlock(&app->lock);
    uv_async_send(&app->thread_done);
}

static int start_thread(app_t *app, unsigned idx, int port)
{
    rthread_t *t = &app->threads[idx];
    t->app = app;
    t->idx = idx;
    t->port = port;
    atomic_init(&t->stop_mode, STOP_NONE);
    if (uv_sem_init(&t->ready, 0) != 0)
        return BATON_ENOMEM;
    int rc = uv_thread_create(&t->tid, thread_main, t);
    if (rc == 0) {
        uv_sem_wait(&t->ready);
        t->started = 1;
        rc = t->rc;
    }
    uv_sem_destroy(&t->ready);
    return rc;
}

static void send_stop(app_t *app, enum stop_mode mode)
{
    /* Under the lock: a thread that closed its server closes `stop` too, and a send to a
     * closed handle is undefined. */
    uv_mutex_lock(&app->lock);
    for (unsigned i = 0; i < app->n_threads; i++) {
        atomic_store(&app->threads[i].stop_mode, mode);
        if (app->threads[i].started && !app->threads[i].stop_closed)
            uv_async_send(&app->threads[i].stop);
    }
    uv_mutex_unlock(&app->lock);
}

/* ---- main thread: signals, reload and shutdown ---- */

static void close_main_handles(app_t *app)
{
    uv_close((uv_handle_t *)&app->sigint, NULL);
    uv_close((uv_handle_t *)&app->sigterm, NULL);
    uv_close((uv_handle_t *)&app->sighup, NULL);
    uv_close((uv_handle_t *)&app->deadline, NULL);
    uv_close((uv_handle_t *)&app->thread_done, NULL);
    baton_etcd_sync_close(app->etcd_sync);
    app->etcd_sync = NULL;
}

static void on_thread_done(uv_async_t *a)
{
    app_t *app = a->data;
    uv_mutex_lock(&app->lock);
    unsigned done = app->n_done;
    uv_mutex_unlock(&app->lock);
    if (done == app->n_threads)
        close_main_handles(app);
}

static void on_grace_over(uv_timer_t *timer)
{
    log_warn("router", "shutdown_grace_exceeded ms=%d", SHUTDOWN_GRACE_MS);
    fflush(stderr);
    _exit(0);
}

static void force_stop(app_t *app, const char *why)
{
    if (app->stopping >= 2)
        return;
    app->stopping = 2;
    unsigned left = 0;
    if (app->router.admission)
        left = baton_admission_active(app->router.admission) +
               baton_admission_queued(app->router.admission);
    log_warn("router", "drain_deadline reason=%s requests_left=%u", why, left);
    send_stop(app, STOP_FORCE);
    uv_timer_start(&app->deadline, on_grace_over, SHUTDOWN_GRACE_MS, 0);
}

static void on_drain_deadline(uv_timer_t *timer)
{
    force_stop(timer->data, "drain_timeout");
}

static const char *sig_name(int signum)
{
    return signum == SIGINT ? "SIGINT" : signum == SIGTERM ? "SIGTERM" : "SIGHUP";
}

static void on_signal(uv_signal_t *s, int signum)
{
    app_t *app = s->data;
    if (app->stopping) {
        /* A second signal: do not wait for the rest of the drain. */
        log_info("router", "signal signal=%s action=stop_now", sig_name(signum));
        force_stop(app, "second_signal");
        return;
    }
    app->stopping = 1;
    atomic_store(&app->router.draining, 1);
    log_info("router", "shutdown signal=%s drain_timeout_ms=%llu", sig_name(signum),
             (unsigned long long)app->cfg.drain_timeout_ms);
    send_stop(app, STOP_DRAIN);
    app->deadline.data = app;
    uv_timer_start(&app->deadline, on_drain_deadline, app->cfg.drain_timeout_ms, 0);
}

static void retire_policy(app_t *app, baton_policy_t *p)
{
    retired_t *r = malloc(sizeof(*r));
    if (r == NULL) {
        /* Leaking one small policy object beats freeing it under a loop that may use it. */
        log_warn("router", "reload_policy_leaked reason=\"out of memory\"");
        return;
    }
    r->p = p;
    r->next = app->retired;
    app->retired = r;
}

/* SIGHUP, TLS part: certificates and keys are read again from the same files; connections
 * already open keep the generation they started with (see http/tls.h). */
static void reload_tls(app_t *app)
{
    baton_tls_t *cfgs[3] = {app->router.server_tls, app->router.upstream_tls, app->registry_tls};
    const char *names[3] = {"client_port", "upstream", "registry"};
    for (int i = 0; i < 3; i++) {
        char err[512] = "";
        if (cfgs[i] == NULL)
            continue;
        if (baton_tls_reload(cfgs[i], err, sizeof(err)) == 0)
            log_info("router", "tls_reloaded which=%s", names[i]);
        else
            log_error("router", "tls_reload_failed which=%s reason=\"%s\" (previous kept)",
                      names[i], err);
    }
}

/* SIGHUP, tokenizer part: the files are read again (a new model revision), from the same
 * command line and --config; the new set replaces the old one whole, or the old one stays. */
static void reload_tokenizers(app_t *app, const baton_config_t *next)
{
    char err[512] = "";
    baton_rtok_set_t *set;
    if (!app->router.rtok)
        return;
    if (baton_rtok_set_load(next, &set, err, sizeof(err)) != 0) {
        log_error("router", "reload_tokenizer_failed reason=\"%s\" (previous tokenizers kept)",
                  err);
        return;
    }
    baton_rtok_install(app->router.rtok, set);
    log_info("router", "tokenizers_reloaded models=%zu", set ? set->n : 0);
}

/* SIGHUP: workers and policies from the configuration file (and the same command line). */
static void reload(app_t *app)
{
    char err[512] = "";
    reload_tls(app);
    baton_config_t next;
    if (baton_config_init(&next) != 0) {
        log_error("router", "reload_failed reason=\"out of memory\"");
        return;
    }
    int rc = baton_config_from_args(&next, app->argc, app->argv, err, sizeof(err));
    if (rc != 0) {
        log_error("router", "reload_failed reason=\"%s\" (configuration unchanged)",
                  err[0] ? err : baton_strerror(rc));
        baton_config_free(&next);
        return;
    }
    reload_tokenizers(app, &next);
    if (app->cfg.config_path == NULL) {
        log_warn("router", "reload_skipped reason=\"no --config file\"");
        baton_config_free(&next);
        return;
    }
    err[0] = '\0';
    baton_reload_result_t res;
    rc = baton_reload_workers(app->router.registry, &app->cfg, &next, &res, err, sizeof(err));
    if (rc != 0)
        log_error("router", "reload_partial reason=\"%s\"", err);

    baton_worker_role_t roles[3] = {BATON_ROLE_PREFILL, BATON_ROLE_DECODE, BATON_ROLE_REGULAR};
    baton_policy_kind_t kinds[3] = {next.prefill_policy, next.decode_policy, next.policy};
    for (int i = 0; i < 3; i++) {
        baton_policy_t *cur = baton_router_policy(&app->router, roles[i]);
        if (baton_policy_same(cur, kinds[i], &next.policy_params))
            continue; /* a new object would start with empty cache_aware trees */
        baton_policy_t *np;
        if (baton_policy_create_with(&np, kinds[i], &next.policy_params) != 0) {
            log_error("router", "reload_policy_failed role=%s reason=\"out of memory\"",
                      baton_worker_role_name(roles[i]));
            continue;
        }
        retire_policy(app, baton_router_set_policy(&app->router, roles[i], np));
    }
    /* What the next reload compares with. The loops never read these fields. */
    baton_config_worker_t *tw = app->cfg.workers;
    size_t tn = app->cfg.n_workers;
    app->cfg.workers = next.workers;
    app->cfg.n_workers = next.n_workers;
    next.workers = tw;
    next.n_workers = tn;
    app->cfg.policy = next.policy;
    app->cfg.prefill_policy = next.prefill_policy;
    app->cfg.decode_policy = next.decode_policy;
    baton_config_free(&next);

    size_t counts[BATON_ROLE_COUNT];
    baton_registry_counts(app->router.registry, counts, NULL);
    log_info("router",
             "reloaded added=%zu removed=%zu changed=%zu unchanged=%zu prefill=%zu decode=%zu "
             "regular=%zu prefill_policy=%s decode_policy=%s policy=%s",
             res.added, res.removed, res.changed, res.unchanged, counts[BATON_ROLE_PREFILL],
             counts[BATON_ROLE_DECODE], counts[BATON_ROLE_REGULAR],
             baton_policy_name(app->cfg.prefill_policy), baton_policy_name(app->cfg.decode_policy),
             baton_policy_name(app->cfg.policy));
}

static void on_sighup(uv_signal_t *s, int signum)
{
    app_t *app = s->data;
    log_info("router", "signal signal=SIGHUP action=reload");
    if (app->stopping) {
        log_info("router", "reload_skipped reason=shutting_down");
        return;
    }
    char err[512] = "";
    if (baton_auth_reload(app->router.auth, err, sizeof(err)) != 0)
        log_error("router", "auth_reload_failed reason=\"%s\" (keys and tokens unchanged)", err);
    else if (app->cfg.api_key_file || app->cfg.admin_token_file)
        log_info("router", "auth_reloaded api_keys=%zu admin_token=%d",
                 baton_auth_n_keys(app->router.auth), baton_auth_has_admin_token(app->router.auth));
    reload(app);
}

static int create_health(app_t *app, char *err, size_t errlen)
{
    const baton_config_t *c = &app->cfg;
    baton_router_t *r = &app->router;
    baton_whealth_config_t hc;
    baton_whealth_config_init(&hc);
    hc.check.enabled = c->check_interval_ms > 0;
    if (c->check_interval_ms)
        hc.check.interval_ms = c->check_interval_ms;
    hc.check.fast_interval_ms = c->check_fast_interval_ms;
    hc.check.down_interval_ms = c->check_down_interval_ms;
    hc.check.timeout_ms = c->check_timeout_ms;
    hc.check.rise = c->check_rise;
    hc.check.fall = c->check_fall;
    snprintf(hc.check.path, sizeof(hc.check.path), "%s", c->check_path ? c->check_path : "/health");
    hc.breaker.failure_threshold = c->breaker_threshold;
    hc.breaker.cooldown_base_ms = c->breaker_cooldown_ms;
    hc.breaker.cooldown_max_ms = c->breaker_cooldown_max_ms > c->breaker_cooldown_ms
                                     ? c->breaker_cooldown_max_ms
                                     : c->breaker_cooldown_ms;
    int rc = baton_whealth_create(&r->health, r->registry, &hc);
    if (rc == 0)
        rc = baton_whealth_metrics_init(r->health, r->metrics_reg);
    if (rc != 0)
        snprintf(err, errlen, "health: %s", baton_strerror(rc));
    return rc;
}

static int create_shared(app_t *app, char *err, size_t errlen)
{
    baton_router_t *r = &app->router;
    int rc;
    r->cfg = &app->cfg;
    atomic_init(&r->draining, 0);
    if ((rc = baton_registry_create(&r->registry)) != 0) {
        snprintf(err, errlen, "registry: %s", baton_strerror(rc));
        return rc;
    }
    baton_pd_protocol_t pd_default = BATON_PD_SGLANG;
    baton_pd_protocol_parse(app->cfg.pd_protocol, &pd_default); /* validated by the config */
    baton_registry_set_pd_default(r->registry, pd_default);
    if ((rc = baton_config_apply_workers(&app->cfg, r->registry, err, errlen)) != 0)
        return rc;
    const baton_policy_params_t *pp = &app->cfg.policy_params;
    if ((rc = baton_policy_create_with(&r->prefill_policy, app->cfg.prefill_policy, pp)) != 0 ||
        (rc = baton_policy_create_with(&r->decode_policy, app->cfg.decode_policy, pp)) != 0 ||
        (rc = baton_policy_create_with(&r->regular_policy, app->cfg.policy, pp)) != 0) {
        snprintf(err, errlen, "policy: %s", baton_strerror(rc));
        return rc;
    }
    if (!(r->metrics_reg = baton_metrics_create())) {
        snprintf(err, errlen, "metrics: out of memory");
        return BATON_ENOMEM;
    }
    if ((rc = baton_router_metrics_create(&r->metrics, r->metrics_reg)) != 0 ||
        (rc = baton_resil_metrics_create(&r->resil, r->metrics_reg)) != 0 ||
        (rc = baton_proxy_pd_metrics_init(r)) != 0) {
        snprintf(err, errlen, "metrics: %s", baton_strerror(rc));
        return rc;
    }
    r->tokens = baton_token_metrics_create(r->metrics_reg);
    baton_rtok_set_t *set;
    char why[400];
    if ((rc = baton_rtok_set_load(&app->cfg, &set, why, sizeof(why))) != 0) {
        snprintf(err, errlen, "%s", why);
        return rc;
    }
    if ((rc = baton_rtok_create(&r->rtok, set, app->cfg.tokenize_cache_bytes,
                                app->cfg.tokenize_cache_entries, r->metrics_reg)) != 0) {
        baton_rtok_set_unref(set);
        snprintf(err, errlen, "tokenizer: %s", baton_strerror(rc));
        return rc;
    }
    for (size_t i = 0; set && i < set->n; i++)
        log_info("router", "tokenizer model=%s path=%s chat_template=%s max_model_len=%llu",
                 set->m[i].model ? set->m[i].model : "*", set->m[i].path,
                 set->m[i].tmpl ? "yes" : "no", (unsigned long long)set->m[i].max_model_len);
    if ((rc = baton_admission_create(&r->admission, app->cfg.max_concurrent_requests,
                                     app->cfg.queue_size)) != 0) {
        snprintf(err, errlen, "admission: %s", baton_strerror(rc));
        return rc;
    }
    baton_admission_set_reserve(r->admission, app->cfg.priority_reserve_pct);
    if ((rc = baton_auth_create(&r->auth, &app->cfg, err, errlen)) != 0)
        return rc;
    /* KV-event subscriptions: their thread follows the registry (idle while no worker names an
     * endpoint); the precise policy reads their index. */
    baton_kvroute_opts_t ko = {.max_blocks_per_source = app->cfg.kv_max_blocks,
                               .unmatched_after = app->cfg.kv_unmatched_after,
                               .replay_timeout_ms = (int)app->cfg.kv_replay_timeout_ms,
                               .store_endpoint = app->cfg.store_kv_events,
                               .store_replay_endpoint = app->cfg.store_kv_events_replay};
    if ((rc = baton_kvroute_create(&r->kv, r->registry, r->metrics_reg, &ko)) != 0 ||
        (rc = baton_kvroute_start(r->kv)) != 0) {
        snprintf(err, errlen, "kv events: %s", baton_strerror(rc));
        return rc;
    }
    baton_registry_set_kv(r->registry, r->kv);
    return create_health(app, err, errlen);
}

/* TLS: the client port's and the upstream side's configurations. */
static int create_tls(app_t *app, char *err, size_t errlen)
{
    const baton_config_t *c = &app->cfg;
    baton_router_t *r = &app->router;
    char why[400] = "";
    int rc;
    if (c->tls_cert || c->tls_key || c->tls_client_ca) {
        baton_tls_opts_t o = {c->tls_cert, c->tls_key, c->tls_client_ca};
        if (c->tls_cert == NULL || c->tls_key == NULL) {
            snprintf(err, errlen, "tls: --tls-cert and --tls-key go together");
            return BATON_EINVAL;
        }
        if ((rc = baton_tls_create(&r->server_tls, BATON_TLS_SERVER, &o, why, sizeof(why)))) {
            snprintf(err, errlen, "tls: %s", why);
            return rc;
        }
    }
    baton_tls_opts_t u = {c->upstream_cert, c->upstream_key, c->upstream_ca};
    rc = baton_tls_create(&r->upstream_tls, BATON_TLS_CLIENT, &u, why, sizeof(why));
    if (rc && (c->upstream_ca || c->upstream_cert || c->upstream_key)) {
        snprintf(err, errlen, "upstream tls: %s", why);
        return rc;
    }
    if (rc) /* only the system bundle was tried: plain-HTTP deployments must still start */
        log_warn("router", "upstream_tls_unavailable reason=\"%s\" (https:// workers will fail)",
                 why);
    if ((rc = baton_tls_metrics_init(r->metrics_reg)) != 0) {
        snprintf(err, errlen, "tls metrics: %s", baton_strerror(rc));
        return rc;
    }
    log_info("router", "tls client_port=%s client_auth=%s upstream_ca=%s upstream_client_cert=%s",
             r->server_tls ? "https" : "off", c->tls_client_ca ? "required" : "off",
             c->upstream_ca ? c->upstream_ca : "system", c->upstream_cert ? "yes" : "no");
    return 0;
}

static void destroy_shared(app_t *app)
{
    baton_router_t *r = &app->router;
    baton_tls_destroy(r->server_tls);
    baton_tls_destroy(r->upstream_tls);
    baton_tls_destroy(app->registry_tls); /* the etcd sync, its user, is gone by now */
    app->registry_tls = NULL;
    baton_kvroute_destroy(r->kv); /* its thread holds worker references: before the registry */
    r->kv = NULL;
    baton_whealth_destroy(r->health);
    baton_auth_free(r->auth);
    baton_admission_destroy(r->admission);
    baton_resil_metrics_destroy(r->resil);
    baton_token_metrics_destroy(r->tokens);
    baton_rtok_destroy(r->rtok);
    r->rtok = NULL;
    baton_router_metrics_destroy(r->metrics);
    if (r->metrics_reg)
        baton_metrics_destroy(r->metrics_reg);
    baton_policy_destroy(r->prefill_policy);
    baton_policy_destroy(r->decode_policy);
    baton_policy_destroy(r->regular_policy);
    while (app->retired) {
        retired_t *n = app->retired->next;
        baton_policy_destroy(app->retired->p);
        free(app->retired);
        app->retired = n;
    }
    if (r->registry)
        baton_registry_destroy(r->registry);
    baton_config_free(&app->cfg);
}

/*
 * Descriptors: the soft limit is raised to the hard one (1024 by default would cap the router
 * far below --max-connections), and client connections are kept to half of what is left, so
 * upstream connections, pools and files always find descriptors (the server backs off on
 * EMFILE as a last resort, server.h).
 */
static void raise_fd_limit(baton_config_t *cfg, unsigned n_threads)
{
    baton_fd_limit_t fl;
    if (baton_fd_limit_raise(&fl) != 0) {
        log_warn("router", "fd_limit_unknown");
        return;
    }
    uint64_t cap = fl.soft;
    uint64_t share = cap / 2 / (n_threads ? n_threads : 1);
    if (share < 1)
        share = 1;
    if ((uint64_t)cfg->limits.max_connections > share) {
        log_info("router",
                 "max_connections_lowered from=%u to=%llu reason=\"descriptor limit %llu: half "
                 "of it for client connections\"",
                 cfg->limits.max_connections, (unsigned long long)share, (unsigned long long)cap);
        cfg->limits.max_connections = (unsigned)share;
    }
    log_info("router",
             "fd_limit soft_before=%llu soft=%llu hard=%llu max_connections=%u threads=%u",
             (unsigned long long)fl.before, (unsigned long long)cap, (unsigned long long)fl.hard,
             cfg->limits.max_connections, n_threads);
}

/* --max-buffered-bytes 0: a quarter of physical memory (at least 64 MiB). */
static size_t buffered_budget(const baton_config_t *cfg)
{
    if (cfg->limits.max_buffered_bytes)
        return cfg->limits.max_buffered_bytes;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    size_t b = pages > 0 && psz > 0 ? (size_t)pages / 4 * (size_t)psz : 0;
    return b < ((size_t)64 << 20) ? (size_t)64 << 20 : b;
}

/* --registry etcds://: the TLS client configuration every etcd connection uses. Options that
 * only TLS uses are refused with a plaintext etcd:// URL rather than ignored: an operator who
 * gave a CA expects the traffic to be encrypted. */
static int create_registry_tls(app_t *app, char *err, size_t errlen)
{
    const baton_config_t *c = &app->cfg;
    int tls = strncmp(c->registry_url, "etcds://", 8) == 0;
    if (!tls && (c->registry_ca || c->registry_cert || c->registry_key)) {
        snprintf(err, errlen, "--registry-ca/-cert/-key need an etcds:// (TLS) --registry");
        return BATON_EINVAL;
    }
    if (!tls)
        return 0;
    if ((c->registry_cert == NULL) != (c->registry_key == NULL)) {
        snprintf(err, errlen, "--registry-cert and --registry-key go together");
        return BATON_EINVAL;
    }
    char why[400] = "";
    baton_tls_opts_t o = {c->registry_cert, c->registry_key, c->registry_ca};
    int rc = baton_tls_create(&app->registry_tls, BATON_TLS_CLIENT, &o, why, sizeof(why));
    if (rc != 0) {
        snprintf(err, errlen, "tls: %s", why);
        return rc;
    }
    log_info("router", "registry_tls ca=%s client_cert=%s",
             c->registry_ca ? c->registry_ca : "system", c->registry_cert ? "yes" : "no");
    return 0;
}

/* --registry: the shared worker set (etcd), kept in sync on the main loop. */
static int start_etcd_sync(app_t *app, char *err, size_t errlen)
{
    char password[256] = "";
    const baton_config_t *c = &app->cfg;
    int rc = create_registry_tls(app, err, errlen);
    if (rc != 0)
        return rc;
    if (c->registry_password_file != NULL) {
        FILE *f = fopen(c->registry_password_file, "r");
        if (f == NULL || fgets(password, sizeof(password), f) == NULL) {
            snprintf(err, errlen, "cannot read %s: %s", c->registry_password_file,
                     f == NULL ? strerror(errno) : "empty file");
            if (f)
                fclose(f);
            return BATON_EINVAL;
        }
        fclose(f);
        password[strcspn(password, "\r\n")] = '\0';
    }
    baton_etcd_sync_config_t sc = {c->registry_url, c->registry_user, password,
                                   c->registry_timeout_ms, app->registry_tls};
    rc = baton_etcd_sync_create(&app->etcd_sync, app->main_loop, app->router.registry,
                                app->router.metrics_reg, &sc, err, errlen);
    if (rc == 0)
        baton_etcd_sync_start(app->etcd_sync);
    return rc;
}

static int host_is_loopback(const char *host)
{
    return strncmp(host, "127.", 4) == 0 || strcmp(host, "::1") == 0 ||
           strcmp(host, "localhost") == 0;
}

/*
 * The router's threads share their port through SO_REUSEPORT, which would also let a second
 * router process (same user) join it and take half of the clients. A plain bind first, without
 * SO_REUSEPORT, fails while any socket listens on the port, so a second router refuses to start.
 * Returns 1 when the port is taken, 0 otherwise (an address that does not parse is left to the
 * real bind, which reports it).
 */
static int port_taken(const char *host, int port)
{
    struct sockaddr_storage ss;
    memset(&ss, 0, sizeof(ss));
    if (port == 0)
        return 0; /* an ephemeral port is never another process's */
    if (uv_ip4_addr(host, port, (struct sockaddr_in *)&ss) != 0 &&
        uv_ip6_addr(host, port, (struct sockaddr_in6 *)&ss) != 0)
        return 0;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)); /* TIME_WAIT is no owner */
    socklen_t len =
        ss.ss_family == AF_INET ? sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
    int taken = bind(fd, (struct sockaddr *)&ss, len) != 0 && errno == EADDRINUSE;
    close(fd);
    return taken;
}

int main(int argc, char **argv)
{
    static app_t app;
    char err[512] = "";
    int rc;

    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a signal */
    app.argc = argc;
    app.argv = argv;

    for (int i = 1; i < argc; i++)
        if (strcmp(argv[i], "--version") == 0) {
            printf("baton %s\n", BATON_VERSION_TEXT);
            return 0;
        }
    if (baton_config_init(&app.cfg) != 0) {
        fprintf(stderr, "baton: out of memory\n");
        return 1;
    }
    rc = baton_config_from_args(&app.cfg, argc, argv, err, sizeof(err));
    if (rc == BATON_CONFIG_HELP) {
        baton_config_print_help(stdout, argv[0]);
        baton_config_free(&app.cfg);
        return 0;
    }
    if (rc != 0) {
        fprintf(stderr, "baton: %s\n", err[0] ? err : baton_strerror(rc));
        fprintf(stderr, "Try '%s --help'.\n", argv[0]);
        baton_config_free(&app.cfg);
        return 2;
    }
    /* An explicit BATON_LOG_LEVEL wins over the default level (not over --log-level). */
    if (!getenv("BATON_LOG_LEVEL") || app.cfg.log_level != BATON_LOG_INFO)
        baton_log_set_level(app.cfg.log_level);

    if ((rc = create_shared(&app, err, sizeof(err))) != 0 ||
        (rc = create_tls(&app, err, sizeof(err))) != 0) {
        log_error("router", "startup_failed reason=\"%s\"", err);
        destroy_shared(&app);
        return 2;
    }
    if (port_taken(app.cfg.host, app.cfg.port)) {
        log_error("router", "startup_failed reason=\"port %d is in use\" addr=%s:%d", app.cfg.port,
                  app.cfg.host, app.cfg.port);
        destroy_shared(&app);
        return 1;
    }
    raise_fd_limit(&app.cfg, app.cfg.threads ? app.cfg.threads : 1);
    app.budget.max = buffered_budget(&app.cfg);
    app.router.budget = &app.budget;
    /* Clients (curl --data through some proxies) may half-close after their request. */
    app.cfg.limits.answer_half_closed = 1;
    log_info("router", "memory_budget max_buffered_bytes=%zu max_body_bytes=%zu", app.budget.max,
             app.cfg.limits.max_body_bytes);
    if (baton_auth_has_admin_token(app.router.auth))
        log_info("router", "admin_routes auth=token");
    else
        log_info("router", "admin_routes auth=loopback_only reason=\"no --admin-token: /workers, "
                           "/add_worker, /remove_worker and /list_workers answer loopback clients "
                           "only\"");
    if (baton_auth_n_keys(app.router.auth) == 0)
        /* open inference routes are the loopback default; on another address, a warning */
        baton_log(host_is_loopback(app.cfg.host) ? BATON_LOG_INFO : BATON_LOG_WARN, "router",
                  "api_keys none=1 reason=\"no --api-key/--api-key-file: inference "
                  "routes are open to every client\"");
    else
        log_info("router", "api_keys count=%zu rate_limit=%s forward_authorization=%d",
                 baton_auth_n_keys(app.router.auth),
                 app.cfg.rate_limit ? app.cfg.rate_limit : "none", app.cfg.forward_authorization);
    size_t counts[BATON_ROLE_COUNT];
    baton_registry_counts(app.router.registry, counts, NULL);
    log_info("router",
             "starting threads=%u prefill=%zu decode=%zu regular=%zu prefill_policy=%s "
             "decode_policy=%s policy=%s max_retries=%u max_concurrent=%u queue=%u "
             "check_interval_ms=%llu",
             app.cfg.threads, counts[BATON_ROLE_PREFILL], counts[BATON_ROLE_DECODE],
             counts[BATON_ROLE_REGULAR], baton_policy_name(app.cfg.prefill_policy),
             baton_policy_name(app.cfg.decode_policy), baton_policy_name(app.cfg.policy),
             app.cfg.max_retries, app.cfg.max_concurrent_requests, app.cfg.queue_size,
             (unsigned long long)app.cfg.check_interval_ms);

    app.main_loop = uv_default_loop();
    if (app.cfg.registry_url != NULL && (rc = start_etcd_sync(&app, err, sizeof(err))) != 0) {
        log_error("router", "startup_failed reason=\"registry: %s\"", err);
        destroy_shared(&app);
        return 2;
    }
    /* Listen once etcd's worker set is here: a new replica's first answer is already
     * consistent with the others. etcd down: start after the time-out with what it has. */
    uint64_t list_wait_ms = app.cfg.registry_timeout_ms ? app.cfg.registry_timeout_ms : 2000;
    if (app.etcd_sync != NULL && !baton_etcd_sync_wait_listed(app.etcd_sync, list_wait_ms))
        log_warn("router", "registry_not_read_yet waited_ms=%llu action=\"listening anyway\"",
                 (unsigned long long)list_wait_ms);
    uv_mutex_init(&app.lock);
    app.n_threads = app.cfg.threads ? app.cfg.threads : 1;
    app.threads = calloc(app.n_threads, sizeof(*app.threads));
    if (!app.threads) {
        log_error("router", "startup_failed reason=\"out of memory\"");
        return 1;
    }
    app.thread_done.data = &app;
    uv_async_init(app.main_loop, &app.thread_done, on_thread_done);

    /* The first loop binds the requested port (maybe 0); the rest join it with SO_REUSEPORT. */
    for (unsigned i = 0; i < app.n_threads; i++) {
        int port = i == 0 ? app.cfg.port : app.threads[0].port;
        if ((rc = start_thread(&app, i, port)) != 0) {
            log_error("router", "listen_failed addr=%s:%d thread=%u err=%s", app.cfg.host, port, i,
                      baton_strerror(rc));
            fflush(stderr);
            _exit(1);
        }
    }
    log_info("router", "listening addr=%s:%d threads=%u", app.cfg.host, app.threads[0].port,
             app.n_threads);

    app.sigint.data = app.sigterm.data = app.sighup.data = &app;
    uv_signal_init(app.main_loop, &app.sigint);
    uv_signal_init(app.main_loop, &app.sigterm);
    uv_signal_init(app.main_loop, &app.sighup);
    uv_signal_start(&app.sigint, on_signal, SIGINT);
    uv_signal_start(&app.sigterm, on_signal, SIGTERM);
    uv_signal_start(&app.sighup, on_sighup, SIGHUP);
    uv_timer_init(app.main_loop, &app.deadline);
    app.deadline.data = &app;
    uv_run(app.main_loop, UV_RUN_DEFAULT);

    for (unsigned i = 0; i < app.n_threads; i++)
        if (app.threads[i].started)
            uv_thread_join(&app.threads[i].tid);
    uv_loop_close(app.main_loop);
    free(app.threads);
    uv_mutex_destroy(&app.lock);
    destroy_shared(&app);
    log_info("router", "stopped");
    return 0;
}
