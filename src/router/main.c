/* main.c — the `baton` router executable: configuration, shared state, one libuv loop + HTTP
 * server per thread on one reuseport address, signal handling. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <uv.h>

#include "baton/error.h"
#include "common/log.h"
#include "common/metrics.h"
#include "http/server.h"
#include "router/config.h"
#include "router/policy.h"
#include "router/proxy.h"
#include "router/registry.h"
#include "router/router_metrics.h"
#include "router/routes.h"

/* A stuck shutdown (an upstream that never closes) must not keep the process alive. */
#define SHUTDOWN_DEADLINE_MS 10000

typedef struct app_s app_t;

typedef struct rthread_s {
    app_t *app;
    unsigned idx;
    uv_thread_t tid;
    int started;
    uv_loop_t loop;
    uv_async_t stop;
    baton_http_server_t *srv;
    baton_proxy_loop_t *pl;
    int port; /* in: port to bind; out: the real port */
    int rc;   /* start-up result */
    uv_sem_t ready;
} rthread_t;

struct app_s {
    baton_config_t cfg;
    baton_router_t router;
    rthread_t *threads;
    unsigned n_threads;
    uv_loop_t *main_loop;
    uv_signal_t sigint, sigterm;
    uv_timer_t deadline;
    uv_async_t thread_done;
    uv_mutex_t lock;
    unsigned n_done; /* guarded by lock */
    int stopping;
};

/* ---- router threads ---- */

/* The thread a loop runs on; the server's close callback carries no context of its own. */
static __thread rthread_t *cur_thread;

static void on_srv_closed(baton_http_server_t *srv)
{
    rthread_t *t = cur_thread;
    (void)srv;
    t->srv = NULL;
    /* No proxied request is alive any more: the pools can go (idle connections close). */
    baton_proxy_loop_destroy(t->pl);
    t->pl = NULL;
    uv_close((uv_handle_t *)&t->stop, NULL);
}

static void on_stop(uv_async_t *a)
{
    rthread_t *t = a->data;
    if (!t->srv)
        return;
    baton_http_server_stop_accepting(t->srv);
    baton_http_server_close(t->srv, on_srv_closed);
}

static void thread_main(void *arg)
{
    rthread_t *t = arg;
    app_t *app = t->app;
    int rc;

    cur_thread = t;
    if ((rc = uv_loop_init(&t->loop)) != 0 ||
        (rc = baton_proxy_loop_create(&t->pl, &t->loop, &app->router)) != 0 ||
        (rc = baton_http_server_create(&t->srv, &t->loop, &app->cfg.limits, baton_routes_handle,
                                       t->pl)) != 0 ||
        (rc = baton_http_server_listen(t->srv, app->cfg.host, t->port, 1)) != 0) {
        /* Start-up failure: the process exits; nothing to unwind. */
        t->rc = rc;
        uv_sem_post(&t->ready);
        return;
    }
    t->port = baton_http_server_port(t->srv);
    t->stop.data = t;
    if ((rc = uv_async_init(&t->loop, &t->stop, on_stop)) != 0) {
        t->rc = rc;
        uv_sem_post(&t->ready);
        return;
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

/* ---- main thread: signals and shutdown ---- */

static void close_main_handles(app_t *app)
{
    uv_close((uv_handle_t *)&app->sigint, NULL);
    uv_close((uv_handle_t *)&app->sigterm, NULL);
    uv_close((uv_handle_t *)&app->deadline, NULL);
    uv_close((uv_handle_t *)&app->thread_done, NULL);
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

static void on_deadline(uv_timer_t *timer)
{
    log_warn("router", "shutdown_deadline_exceeded ms=%d", SHUTDOWN_DEADLINE_MS);
    fflush(stderr);
    _exit(0);
}

static void on_signal(uv_signal_t *s, int signum)
{
    app_t *app = s->data;
    if (app->stopping) {
        log_info("router", "signal_ignored signal=%s reason=already_stopping",
                 signum == SIGINT ? "SIGINT" : "SIGTERM");
        return;
    }
    app->stopping = 1;
    log_info("router", "shutdown signal=%s", signum == SIGINT ? "SIGINT" : "SIGTERM");
    for (unsigned i = 0; i < app->n_threads; i++)
        uv_async_send(&app->threads[i].stop);
    uv_timer_start(&app->deadline, on_deadline, SHUTDOWN_DEADLINE_MS, 0);
}

static int create_shared(app_t *app, char *err, size_t errlen)
{
    baton_router_t *r = &app->router;
    int rc;
    r->cfg = &app->cfg;
    if ((rc = baton_registry_create(&r->registry)) != 0) {
        snprintf(err, errlen, "registry: %s", baton_strerror(rc));
        return rc;
    }
    if ((rc = baton_config_apply_workers(&app->cfg, r->registry, err, errlen)) != 0)
        return rc;
    if ((rc = baton_policy_create(&r->prefill_policy, app->cfg.prefill_policy)) != 0 ||
        (rc = baton_policy_create(&r->decode_policy, app->cfg.decode_policy)) != 0 ||
        (rc = baton_policy_create(&r->regular_policy, app->cfg.policy)) != 0) {
        snprintf(err, errlen, "policy: %s", baton_strerror(rc));
        return rc;
    }
    if (!(r->metrics_reg = baton_metrics_create())) {
        snprintf(err, errlen, "metrics: out of memory");
        return BATON_ENOMEM;
    }
    if ((rc = baton_router_metrics_create(&r->metrics, r->metrics_reg)) != 0) {
        snprintf(err, errlen, "metrics: %s", baton_strerror(rc));
        return rc;
    }
    return 0;
}

static void destroy_shared(app_t *app)
{
    baton_router_t *r = &app->router;
    baton_router_metrics_destroy(r->metrics);
    if (r->metrics_reg)
        baton_metrics_destroy(r->metrics_reg);
    baton_policy_destroy(r->prefill_policy);
    baton_policy_destroy(r->decode_policy);
    baton_policy_destroy(r->regular_policy);
    if (r->registry)
        baton_registry_destroy(r->registry);
    baton_config_free(&app->cfg);
}

int main(int argc, char **argv)
{
    static app_t app;
    char err[512] = "";
    int rc;

    signal(SIGPIPE, SIG_IGN); /* a client gone mid-write is an error code, not a signal */

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

    if ((rc = create_shared(&app, err, sizeof(err))) != 0) {
        log_error("router", "startup_failed reason=\"%s\"", err);
        destroy_shared(&app);
        return 2;
    }
    size_t counts[BATON_ROLE_COUNT];
    baton_registry_counts(app.router.registry, counts, NULL);
    log_info("router",
             "starting threads=%u prefill=%zu decode=%zu regular=%zu prefill_policy=%s "
             "decode_policy=%s policy=%s",
             app.cfg.threads, counts[BATON_ROLE_PREFILL], counts[BATON_ROLE_DECODE],
             counts[BATON_ROLE_REGULAR], baton_policy_name(app.cfg.prefill_policy),
             baton_policy_name(app.cfg.decode_policy), baton_policy_name(app.cfg.policy));

    app.main_loop = uv_default_loop();
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

    app.sigint.data = app.sigterm.data = &app;
    uv_signal_init(app.main_loop, &app.sigint);
    uv_signal_init(app.main_loop, &app.sigterm);
    uv_signal_start(&app.sigint, on_signal, SIGINT);
    uv_signal_start(&app.sigterm, on_signal, SIGTERM);
    uv_timer_init(app.main_loop, &app.deadline);
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
