/* test_worker_check.c — the active checker on a real loop against loopback HTTP servers: rise and
 * fall, fast interval while changing, jittered first checks, hung workers (a listener that never
 * accepts, a SIGSTOPped process), workers added and removed at run time, checks disabled. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <uv.h>

#include "baton/error.h"
#include "router/control/worker_check.h"
#include "router/control/worker_health.h"
#include "http/server.h"
#include "router/control/registry.h"

#define INTERVAL      300
#define FAST          40
#define DOWN_INTERVAL 150
#define TIMEOUT       200
#define RISE          2
#define FALL          3
#define BOUND_MS      8000 /* every wait is bounded by this */

/* ---- loopback servers ---- */

enum { S_OK, S_FAIL, S_HOLD };

#define MAX_HELD 16

typedef struct srv_s {
    baton_http_server_t *srv;
    int port;
    int mode;
    int requests;
    char last_path[256];
    char last_auth[128];
    int model_reads; /* GET <prefix>/v1/models after a passing check (no model_id) */
    char models_path[256];
    char models_auth[128];
    baton_http_req_t *held[MAX_HELD];
    int closed;
} srv_t;

static void held_forget(srv_t *s, baton_http_req_t *req)
{
    for (int i = 0; i < MAX_HELD; i++)
        if (s->held[i] == req)
            s->held[i] = NULL;
}

static void on_held_abort(baton_http_req_t *req)
{
    srv_t *s = req->data;
    held_forget(s, req);
    baton_http_respond(req, 200, "text/plain", NULL, 0, "late", 4); /* finishes it */
}

static void handler(baton_http_req_t *req, void *ctx)
{
    srv_t *s = ctx;
    const baton_http_header_t *auth = baton_http_req_header(req, "authorization");
    size_t plen = strlen(req->path);
    if (plen >= 10 && strcmp(req->path + plen - 10, "/v1/models") == 0) {
        /* not a health check: the model list of a worker registered without a model_id */
        s->model_reads++;
        snprintf(s->models_path, sizeof(s->models_path), "%s", req->path);
        snprintf(s->models_auth, sizeof(s->models_auth), "%s", auth != NULL ? auth->value : "");
        baton_http_respond(req, 404, "text/plain", NULL, 0, "no", 2);
        return;
    }
    s->requests++;
    snprintf(s->last_path, sizeof(s->last_path), "%s", req->path);
    snprintf(s->last_auth, sizeof(s->last_auth), "%s", auth != NULL ? auth->value : "");
    if (s->mode == S_OK) {
        baton_http_respond(req, 200, "text/plain", NULL, 0, "ok", 2);
    } else if (s->mode == S_FAIL) {
        baton_http_respond(req, 500, "text/plain", NULL, 0, "sick", 4);
    } else {
        for (int i = 0; i < MAX_HELD; i++) {
            if (s->held[i] == NULL) {
                s->held[i] = req;
                req->data = s;
                req->on_abort = on_held_abort;
                return;
            }
        }
        baton_http_respond(req, 503, "text/plain", NULL, 0, "full", 4);
    }
}

static void on_srv_closed(baton_http_server_t *srv)
{
    (void)srv;
}

/* ---- fixture ---- */

#define MAX_SRV 8

typedef struct fx_s fx_t;
struct fx_s {
    uv_loop_t loop;
    uv_check_t check;
    uv_timer_t guard;
    baton_registry_t *reg;
    baton_whealth_t *wh;
    baton_wcheck_t *wc;
    int wc_closed;
    srv_t srv[MAX_SRV];
    int nsrv;
    baton_worker_t *w[MAX_SRV];
    int (*pred)(fx_t *);
    void (*observe)(fx_t *);
    int met;
    /* observer state */
    baton_worker_t *watch;
    uint64_t base_failed, base_passed;
    int violations;
    int at_cross;
    int saw_fast;
    char why[256];
};

static void on_check(uv_check_t *h)
{
    fx_t *fx = h->data;
    if (fx->observe != NULL)
        fx->observe(fx);
    if (fx->pred != NULL && fx->pred(fx)) {
        fx->met = 1;
        uv_stop(&fx->loop);
    }
}

static void on_guard(uv_timer_t *h)
{
    uv_stop(h->loop);
}

/* Runs the loop until pred holds (checked after every loop iteration) or BOUND_MS/timeout. */
static int run_until(fx_t *fx, int (*pred)(fx_t *), uint64_t timeout_ms)
{
    fx->pred = pred;
    fx->met = pred != NULL && pred(fx);
    if (fx->met)
        return 1;
    uv_timer_start(&fx->guard, on_guard, timeout_ms, 0);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    uv_timer_stop(&fx->guard);
    fx->pred = NULL;
    return fx->met;
}

static void run_for(fx_t *fx, uint64_t ms)
{
    run_until(fx, NULL, ms);
}

static void fx_init(fx_t *fx, const baton_whealth_config_t *cfg_in)
{
    memset(fx, 0, sizeof(*fx));
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    assert_int_equal(uv_check_init(&fx->loop, &fx->check), 0);
    fx->check.data = fx;
    assert_int_equal(uv_check_start(&fx->check, on_check), 0);
    uv_unref((uv_handle_t *)&fx->check);
    assert_int_equal(uv_timer_init(&fx->loop, &fx->guard), 0);
    assert_int_equal(baton_registry_create(&fx->reg), 0);
    baton_whealth_config_t cfg;
    if (cfg_in != NULL) {
        cfg = *cfg_in;
    } else {
        baton_whealth_config_init(&cfg);
        cfg.check.interval_ms = INTERVAL;
        cfg.check.fast_interval_ms = FAST;
        cfg.check.down_interval_ms = DOWN_INTERVAL;
        cfg.check.timeout_ms = TIMEOUT;
        cfg.check.rise = RISE;
        cfg.check.fall = FALL;
        cfg.check.sync_interval_ms = 20;
    }
    assert_int_equal(baton_whealth_create(&fx->wh, fx->reg, &cfg), 0);
    assert_int_equal(baton_wcheck_create(&fx->wc, &fx->loop, fx->wh), 0);
}

static void on_wc_closed(baton_wcheck_t *wc, void *ctx)
{
    fx_t *fx = ctx;
    fx->wc_closed++;
}

static void close_walk(uv_handle_t *h, void *arg)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void fx_fini(fx_t *fx)
{
    baton_wcheck_close(fx->wc, on_wc_closed, fx);
    for (int i = 0; i < fx->nsrv; i++)
        if (fx->srv[i].srv != NULL)
            baton_http_server_close(fx->srv[i].srv, on_srv_closed);
    uv_close((uv_handle_t *)&fx->check, NULL);
    uv_close((uv_handle_t *)&fx->guard, NULL);
    uint64_t start = uv_hrtime();
    while (uv_loop_alive(&fx->loop) && uv_hrtime() - start < 5000000000ull) {
        uv_run(&fx->loop, UV_RUN_NOWAIT);
        usleep(1000);
    }
    assert_int_equal(fx->wc_closed, 1);
    int rc = uv_loop_close(&fx->loop);
    if (rc != 0) { /* report, then clean up anyway */
        uv_walk(&fx->loop, close_walk, NULL);
        uv_run(&fx->loop, UV_RUN_DEFAULT);
        uv_loop_close(&fx->loop);
    }
    assert_int_equal(rc, 0); /* every handle the checker and servers opened was closed */
    baton_workers_unref(fx->w, (size_t)fx->nsrv);
    baton_whealth_destroy(fx->wh);
    baton_registry_destroy(fx->reg);
}

static baton_worker_t *register_port(fx_t *fx, int port, const char *prefix, const char *key)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", port, prefix != NULL ? prefix : "");
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = url;
    spec.role = BATON_ROLE_DECODE;
    spec.api_key = key;
    baton_worker_t *w = NULL;
    assert_int_equal(baton_registry_add(fx->reg, &spec, &w, NULL, 0), 0);
    return w;
}

/* A loopback HTTP server (index returned) and, when reg, its worker in the registry. */
static int add_server(fx_t *fx, int mode, int reg, const char *prefix, const char *key)
{
    assert_true(fx->nsrv < MAX_SRV);
    int i = fx->nsrv++;
    srv_t *s = &fx->srv[i];
    s->mode = mode;
    assert_int_equal(baton_http_server_create(&s->srv, &fx->loop, NULL, handler, s), 0);
    assert_int_equal(baton_http_server_listen(s->srv, "127.0.0.1", 0, 0), 0);
    s->port = baton_http_server_port(s->srv);
    assert_true(s->port > 0);
    if (reg)
        fx->w[i] = register_port(fx, s->port, prefix, key);
    return i;
}

static baton_whealth_info_t info_of(fx_t *fx, baton_worker_t *w)
{
    baton_whealth_info_t info;
    memset(&info, 0, sizeof(info));
    if (baton_whealth_info(fx->wh, w, &info) != 0)
        info.state = (baton_whealth_state_t)-1;
    return info;
}

static int is_up_side(baton_whealth_state_t s)
{
    return s == BATON_WH_UP || s == BATON_WH_UP_CHECKING;
}

static uint64_t last_delay(fx_t *fx, baton_worker_t *w)
{
    uint64_t d = 0;
    assert_int_equal(baton_wcheck_target_info(fx->wc, w, &d, NULL), 0);
    return d;
}

/* predicates on fx->watch */
static int watch_settled_up(fx_t *fx)
{
    return info_of(fx, fx->watch).state == BATON_WH_UP;
}
static int watch_down_side(fx_t *fx)
{
    return !is_up_side(info_of(fx, fx->watch).state);
}
static int watch_up_side(fx_t *fx)
{
    return is_up_side(info_of(fx, fx->watch).state);
}

/* Observers: every loop iteration, the counter must agree with the results seen so far. */
static void observe_fall(fx_t *fx)
{
    baton_whealth_info_t in = info_of(fx, fx->watch);
    uint64_t fails = in.checks_failed - fx->base_failed;
    if (is_up_side(in.state) && fails >= FALL && !fx->violations++)
        snprintf(fx->why, sizeof(fx->why), "still up after %llu failures",
                 (unsigned long long)fails);
    if (!is_up_side(in.state) && fails < FALL && !fx->violations++)
        snprintf(fx->why, sizeof(fx->why), "down after %llu failures", (unsigned long long)fails);
    if (!is_up_side(in.state) && fx->at_cross == 0)
        fx->at_cross = (int)fails;
    if (in.state == BATON_WH_UP_CHECKING && fails > 0) {
        uint64_t d = 0;
        int in_flight = 0;
        if (baton_wcheck_target_info(fx->wc, fx->watch, &d, &in_flight) == 0 && d == FAST)
            fx->saw_fast++;
    }
}

static void observe_rise(fx_t *fx)
{
    baton_whealth_info_t in = info_of(fx, fx->watch);
    uint64_t passes = (in.checks - in.checks_failed) - fx->base_passed;
    if (!is_up_side(in.state) && passes >= RISE && !fx->violations++)
        snprintf(fx->why, sizeof(fx->why), "still down after %llu passes",
                 (unsigned long long)passes);
    if (is_up_side(in.state) && passes < RISE && !fx->violations++)
        snprintf(fx->why, sizeof(fx->why), "up after %llu passes", (unsigned long long)passes);
    if (is_up_side(in.state) && fx->at_cross == 0)
        fx->at_cross = (int)passes;
    if (in.state == BATON_WH_DOWN_CHECKING) {
        uint64_t d = 0;
        if (baton_wcheck_target_info(fx->wc, fx->watch, &d, NULL) == 0 && d == FAST)
            fx->saw_fast++;
    }
}

/* Drives fx->watch (server index i) from settled UP to DOWN with 500s. */
static void drive_down(fx_t *fx, int i)
{
    fx->srv[i].mode = S_FAIL;
    fx->base_failed = info_of(fx, fx->watch).checks_failed;
    fx->violations = 0;
    fx->at_cross = 0;
    fx->saw_fast = 0;
    fx->observe = observe_fall;
    assert_true(run_until(fx, watch_down_side, BOUND_MS));
    fx->observe = NULL;
    if (fx->violations)
        fail_msg("%s", fx->why);
    assert_int_equal(fx->at_cross, FALL);
    assert_true(fx->saw_fast > 0); /* checked at the fast interval while going down */
    assert_int_equal(baton_worker_health(fx->watch), BATON_HEALTH_UNHEALTHY);
    baton_whealth_info_t in = info_of(fx, fx->watch);
    assert_int_equal(in.state, BATON_WH_DOWN);
    assert_int_equal(in.last_check_status, 500);
    assert_int_equal(last_delay(fx, fx->watch), DOWN_INTERVAL); /* settled down */
}

static void test_settles_up_with_prefix_and_key(void **state)
{
    fx_t fx;
    fx_init(&fx, NULL);
    int i = add_server(&fx, S_OK, 1, "/pfx", "sekret");
    fx.watch = fx.w[i];
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    assert_true(run_until(&fx, watch_settled_up, BOUND_MS));
    assert_string_equal(fx.srv[i].last_path, "/pfx/health");
    assert_string_equal(fx.srv[i].last_auth, "Bearer sekret");
    /* passing checks of a worker without a model_id read its model list, same prefix and key */
    assert_true(fx.srv[i].model_reads > 0);
    assert_string_equal(fx.srv[i].models_path, "/pfx/v1/models");
    assert_string_equal(fx.srv[i].models_auth, "Bearer sekret");
    assert_int_equal(baton_worker_health(fx.w[i]), BATON_HEALTH_HEALTHY);
    baton_whealth_info_t in = info_of(&fx, fx.w[i]);
    assert_int_equal(in.checks, FALL - 1); /* a new worker is up, confirmed by fall-1 passes */
    assert_int_equal(in.checks_failed, 0);
    assert_int_equal(in.last_check_status, 200);
    assert_int_equal(last_delay(&fx, fx.w[i]), INTERVAL); /* settled: the slow interval */
    assert_int_equal(baton_wcheck_targets(fx.wc), 1);
    fx_fini(&fx);
}

static void test_fall_on_500_then_rise(void **state)
{
    fx_t fx;
    fx_init(&fx, NULL);
    int i = add_server(&fx, S_OK, 1, NULL, NULL);
    fx.watch = fx.w[i];
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    assert_true(run_until(&fx, watch_settled_up, BOUND_MS));

    drive_down(&fx, i);

    /* Back: up after exactly `rise` passes, checked fast while coming up. */
    fx.srv[i].mode = S_OK;
    baton_whealth_info_t in = info_of(&fx, fx.watch);
    fx.base_passed = in.checks - in.checks_failed;
    fx.violations = 0;
    fx.at_cross = 0;
    fx.saw_fast = 0;
    fx.observe = observe_rise;
    assert_true(run_until(&fx, watch_up_side, BOUND_MS));
    fx.observe = NULL;
    if (fx.violations)
        fail_msg("%s", fx.why);
    assert_int_equal(fx.at_cross, RISE);
    assert_true(fx.saw_fast > 0);
    assert_int_equal(info_of(&fx, fx.watch).state, BATON_WH_UP); /* settled at once */
    assert_int_equal(baton_worker_health(fx.watch), BATON_HEALTH_HEALTHY);
    assert_int_equal(info_of(&fx, fx.watch).transitions, 2);
    fx_fini(&fx);
}

static int all_targets(fx_t *fx)
{
    return baton_wcheck_targets(fx->wc) == (size_t)fx->nsrv;
}

static int all_checked(fx_t *fx)
{
    for (int i = 0; i < fx->nsrv; i++)
        if (fx->srv[i].requests == 0)
            return 0;
    return 1;
}

static void test_first_checks_jittered(void **state)
{
    baton_whealth_config_t cfg;
    baton_whealth_config_init(&cfg);
    cfg.check.interval_ms = 1000;
    cfg.check.timeout_ms = TIMEOUT;
    cfg.check.sync_interval_ms = 20;
    fx_t fx;
    fx_init(&fx, &cfg);
    for (int i = 0; i < MAX_SRV; i++)
        add_server(&fx, S_OK, 1, NULL, NULL);
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    assert_true(run_until(&fx, all_targets, BOUND_MS));
    uint64_t d[MAX_SRV];
    int distinct = 0;
    for (int i = 0; i < MAX_SRV; i++) {
        int in_flight = 1;
        assert_int_equal(baton_wcheck_target_info(fx.wc, fx.w[i], &d[i], &in_flight), 0);
        assert_true(d[i] < 1000); /* within the interval */
        int seen = 0;
        for (int j = 0; j < i; j++)
            seen |= d[j] == d[i];
        distinct += !seen;
    }
    assert_true(distinct >= MAX_SRV / 2); /* spread out, not all at once */
    /* And each one is really checked (bounded wait, no timing assertion). */
    assert_true(run_until(&fx, all_checked, BOUND_MS));
    fx_fini(&fx);
}

/* A listener that never accepts: connects complete in the kernel's backlog, nothing answers —
 * what a SIGSTOPped worker looks like from outside. */
static int stalled_listener(int *port_p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    assert_true(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    assert_int_equal(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    assert_int_equal(listen(fd, 64), 0);
    socklen_t len = sizeof(a);
    assert_int_equal(getsockname(fd, (struct sockaddr *)&a, &len), 0);
    *port_p = ntohs(a.sin_port);
    return fd;
}

static int watch_down_settled(fx_t *fx)
{
    return info_of(fx, fx->watch).state == BATON_WH_DOWN;
}

static void test_stalled_listener_times_out(void **state)
{
    fx_t fx;
    fx_init(&fx, NULL);
    int port;
    int fd = stalled_listener(&port);
    fx.w[0] = register_port(&fx, port, NULL, NULL);
    fx.nsrv = 1; /* no server object: srv[0].srv stays NULL */
    fx.watch = fx.w[0];
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    assert_true(run_until(&fx, watch_down_settled, BOUND_MS));
    baton_whealth_info_t in = info_of(&fx, fx.watch);
    assert_true(in.last_check_err == BATON_ETIMEOUT_TOTAL ||
                in.last_check_err == BATON_ETIMEOUT_CONNECT);
    assert_int_equal(in.last_check_status, 0);
    assert_int_equal(baton_worker_health(fx.watch), BATON_HEALTH_UNHEALTHY);
    fx_fini(&fx);
    close(fd);
}

/* A real process answering /health, then SIGSTOPped and SIGCONTed. */
static pid_t spawn_health_server(int *port_p)
{
    int fd = stalled_listener(port_p);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;) {
            int c = accept(fd, NULL, NULL);
            if (c < 0)
                continue;
            char buf[4096];
            size_t got = 0;
            while (got < sizeof(buf) - 1) {
                ssize_t n = read(c, buf + got, sizeof(buf) - 1 - got);
                if (n <= 0)
                    break;
                got += (size_t)n;
                buf[got] = '\0';
                if (strstr(buf, "\r\n\r\n") != NULL)
                    break;
            }
            static const char resp[] =
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
            ssize_t w = write(c, resp, sizeof(resp) - 1);
            (void)w;
            close(c);
        }
    }
    close(fd);
    return pid;
}

static void test_sigstop_detected_and_recovered(void **state)
{
    fx_t fx;
    fx_init(&fx, NULL);
    int port;
    pid_t pid = spawn_health_server(&port);
    fx.w[0] = register_port(&fx, port, NULL, NULL);
    fx.nsrv = 1;
    fx.watch = fx.w[0];
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    int ok = run_until(&fx, watch_settled_up, BOUND_MS);
    if (ok) {
        kill(pid, SIGSTOP);
        ok = run_until(&fx, watch_down_settled, BOUND_MS);
        kill(pid, SIGCONT);
    }
    int down_err = info_of(&fx, fx.watch).last_check_err;
    int recovered = ok && run_until(&fx, watch_settled_up, BOUND_MS);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    assert_true(ok);
    assert_true(down_err == BATON_ETIMEOUT_TOTAL || down_err == BATON_ETIMEOUT_CONNECT);
    assert_true(recovered);
    assert_int_equal(baton_worker_health(fx.watch), BATON_HEALTH_HEALTHY);
    fx_fini(&fx);
}

static int held_and_b_checked(fx_t *fx)
{
    int held = 0;
    for (int i = 0; i < MAX_HELD; i++)
        held |= fx->srv[0].held[i] != NULL;
    return held && fx->srv[1].requests > 0;
}

static int one_target(fx_t *fx)
{
    return baton_wcheck_targets(fx->wc) == 1;
}

static void test_removed_worker_not_checked(void **state)
{
    fx_t fx;
    fx_init(&fx, NULL);
    add_server(&fx, S_HOLD, 1, NULL, NULL); /* A: its check hangs until cancelled */
    add_server(&fx, S_OK, 1, NULL, NULL);   /* B */
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    assert_true(run_until(&fx, held_and_b_checked, BOUND_MS));
    int in_flight = 0;
    assert_int_equal(baton_wcheck_target_info(fx.wc, fx.w[0], NULL, &in_flight), 0);
    assert_int_equal(in_flight, 1);

    assert_int_equal(baton_registry_remove(fx.reg, fx.w[0]->id), 0);
    assert_true(run_until(&fx, one_target, BOUND_MS));
    assert_int_equal(baton_wcheck_target_info(fx.wc, fx.w[0], NULL, NULL), BATON_ENOTFOUND);
    int a_before = fx.srv[0].requests;
    int b_before = fx.srv[1].requests;
    fx.srv[0].mode = S_OK; /* would answer now, if anyone asked */
    run_for(&fx, 4 * INTERVAL);
    assert_int_equal(fx.srv[0].requests, a_before);
    assert_true(fx.srv[1].requests > b_before); /* the loop did run checks meanwhile */
    assert_int_equal(baton_whealth_size(fx.wh), 1);
    /* The cancelled check closed its connection: the held request was aborted. */
    for (int i = 0; i < MAX_HELD; i++)
        assert_null(fx.srv[0].held[i]);
    fx_fini(&fx);
}

static int first_server_checked(fx_t *fx)
{
    return fx->srv[0].requests > 0;
}

static void test_worker_added_at_run_time(void **state)
{
    fx_t fx;
    fx_init(&fx, NULL);
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    run_for(&fx, 60);
    assert_int_equal(baton_wcheck_targets(fx.wc), 0);
    add_server(&fx, S_OK, 1, NULL, NULL);
    assert_true(run_until(&fx, first_server_checked, BOUND_MS));
    assert_int_equal(baton_wcheck_targets(fx.wc), 1);
    assert_true(baton_wcheck_checks_started(fx.wc) >= 1);
    fx_fini(&fx);
}

static int breaker_half_open(fx_t *fx)
{
    return baton_worker_breaker(fx->watch) == BATON_BREAKER_HALF_OPEN;
}

static void test_disabled_checks_still_sync_breakers(void **state)
{
    baton_whealth_config_t cfg;
    baton_whealth_config_init(&cfg);
    cfg.check.enabled = 0;
    cfg.check.sync_interval_ms = 20;
    cfg.breaker.cooldown_base_ms = 50;
    cfg.breaker.jitter = 0;
    fx_t fx;
    fx_init(&fx, &cfg);
    int i = add_server(&fx, S_OK, 1, NULL, NULL);
    fx.watch = fx.w[i];
    assert_int_equal(baton_wcheck_start(fx.wc), 0);
    for (int k = 0; k < 5; k++) {
        baton_whealth_ticket_t t;
        assert_int_equal(baton_whealth_admit(fx.wh, fx.watch, &t), 1);
        baton_whealth_done(fx.wh, fx.watch, t, BATON_OUTCOME_FAILURE);
    }
    assert_int_equal(baton_worker_breaker(fx.watch), BATON_BREAKER_OPEN);
    assert_true(run_until(&fx, breaker_half_open, BOUND_MS)); /* no request needed */
    run_for(&fx, 100);
    assert_int_equal(fx.srv[i].requests, 0); /* no active checks */
    assert_int_equal(baton_wcheck_targets(fx.wc), 0);
    assert_int_equal(info_of(&fx, fx.watch).state, BATON_WH_UP);
    fx_fini(&fx);
}

static void test_create_errors(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_whealth_config_t cfg;
    baton_whealth_config_init(&cfg);
    cfg.check.timeout_ms = 0;
    baton_whealth_t *wh;
    assert_int_equal(baton_whealth_create(&wh, reg, &cfg), 0);
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    baton_wcheck_t *wc = NULL;
    assert_int_equal(baton_wcheck_create(&wc, &loop, wh), BATON_EINVAL);
    assert_int_equal(baton_wcheck_create(&wc, NULL, wh), BATON_EINVAL);
    assert_int_equal(baton_whealth_create(&wh, NULL, NULL), BATON_EINVAL);
    assert_int_equal(uv_loop_close(&loop), 0);
    baton_whealth_destroy(wh);
    baton_registry_destroy(reg);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_settles_up_with_prefix_and_key),
        cmocka_unit_test(test_fall_on_500_then_rise),
        cmocka_unit_test(test_first_checks_jittered),
        cmocka_unit_test(test_stalled_listener_times_out),
        cmocka_unit_test(test_sigstop_detected_and_recovered),
        cmocka_unit_test(test_removed_worker_not_checked),
        cmocka_unit_test(test_worker_added_at_run_time),
        cmocka_unit_test(test_disabled_checks_still_sync_breakers),
        cmocka_unit_test(test_create_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
