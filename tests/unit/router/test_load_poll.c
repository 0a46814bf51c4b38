/* test_load_poll.c — reported load for least_load: parsing SGLang's /get_load answers, the load
 * estimate (report + in-flight since, fresh reports only), least_load following it, and the
 * poller on a real loop against loopback HTTP servers (an answer stored, a failure withdrawn,
 * the worker's prefix and api key used, a clean close). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <uv.h>

#include "baton/error.h"
#include "common/clock.h"
#include "http/server.h"
#include "router/control/load_poll.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"

static baton_worker_t *add_worker(baton_registry_t *reg, const char *url, const char *key)
{
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = url;
    spec.role = BATON_ROLE_REGULAR;
    spec.api_key = key;
    baton_worker_t *w = NULL;
    assert_int_equal(baton_registry_add(reg, &spec, &w, NULL, 0), 0);
    return w;
}

static void report(baton_worker_t *w, long load, long base, uint64_t until)
{
    atomic_store(&w->reported_load, load);
    atomic_store(&w->reported_base, base);
    atomic_store(&w->reported_until_ms, until);
}

static void test_parse(void **state)
{
    (void)state;
    long l = -1;
    const char *dp2 = "[{\"dp_rank\":0,\"num_reqs\":3,\"num_waiting_reqs\":1},"
                      "{\"dp_rank\":1,\"num_reqs\":4}]";
    assert_int_equal(baton_load_parse(dp2, strlen(dp2), &l), 0);
    assert_int_equal(l, 7);
    const char *split = "[{\"num_running_reqs\":2,\"num_waiting_reqs\":5}]";
    assert_int_equal(baton_load_parse(split, strlen(split), &l), 0);
    assert_int_equal(l, 7);
    const char *old = "{\"load\":9}";
    assert_int_equal(baton_load_parse(old, strlen(old), &l), 0);
    assert_int_equal(l, 9);
    const char *bad[] = {"",
                         "nope",
                         "[]",
                         "{}",
                         "{\"load\":\"3\"}",
                         "{\"load\":-1}",
                         "[{\"num_running_reqs\":2}]",
                         "[{\"num_reqs\":1}, 3]",
                         "[{\"num_reqs\":-4}]"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        l = 42;
        assert_int_equal(baton_load_parse(bad[i], strlen(bad[i]), &l), BATON_EINVAL);
        assert_int_equal(l, 42); /* untouched */
    }
}

static void test_worker_load(void **state)
{
    (void)state;
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_worker_t *w = add_worker(reg, "http://127.0.0.1:7100", NULL);
    uint64_t now = 1000000;
    for (int i = 0; i < 2; i++)
        baton_worker_in_flight_inc(w);
    assert_int_equal(baton_worker_load(w, now), 2); /* no report: the own count */
    report(w, 10, 2, now + 100);
    assert_int_equal(baton_worker_load(w, now), 10); /* the worker's own total */
    for (int i = 0; i < 3; i++)
        baton_worker_in_flight_inc(w);
    assert_int_equal(baton_worker_load(w, now), 13); /* + 3 sent since the report */
    for (int i = 0; i < 5; i++)
        baton_worker_in_flight_dec(w);
    assert_int_equal(baton_worker_load(w, now), 8); /* - 2 finished since */
    report(w, 0, 0, now + 100);
    for (int i = 0; i < 3; i++)
        baton_worker_in_flight_inc(w);
    assert_int_equal(baton_worker_load(w, now), 3); /* never below the own count */
    report(w, 50, 3, now + 100);
    assert_int_equal(baton_worker_load(w, now + 100), 50);
    assert_int_equal(baton_worker_load(w, now + 101), 3); /* stale: ignored */
    report(w, 50, 3, 0);
    assert_int_equal(baton_worker_load(w, now), 3); /* withdrawn */
    for (int i = 0; i < 3; i++)
        baton_worker_in_flight_dec(w);
    baton_worker_unref(w);
    baton_registry_destroy(reg);
}

/* Equal in-flight counts: the worker that reports more load loses every time; once that report
 * is stale the two share the requests again. */
static void test_least_load_follows_reports(void **state)
{
    (void)state;
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_worker_t *w[2] = {add_worker(reg, "http://127.0.0.1:7101", NULL),
                            add_worker(reg, "http://127.0.0.1:7102", NULL)};
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_LEAST_LOAD), 0);
    report(w[0], 6, 0, baton_now_ms() + 60000);
    for (int i = 0; i < 100; i++)
        assert_ptr_equal(baton_policy_select(p, w, 2), w[1]);
    /* w1 has 7 of ours in flight now: more than w0's 6 reported */
    for (int i = 0; i < 7; i++)
        baton_worker_in_flight_inc(w[1]);
    for (int i = 0; i < 100; i++)
        assert_ptr_equal(baton_policy_select(p, w, 2), w[0]);
    for (int i = 0; i < 7; i++)
        baton_worker_in_flight_dec(w[1]);
    report(w[0], 6, 0, baton_now_ms() - 1);
    int seen0 = 0;
    for (int i = 0; i < 400; i++)
        seen0 += baton_policy_select(p, w, 2) == w[0];
    assert_true(seen0 > 100 && seen0 < 300);
    baton_policy_destroy(p);
    baton_workers_unref(w, 2);
    baton_registry_destroy(reg);
}

/* ---- the poller against loopback servers ---- */

typedef struct {
    baton_http_server_t *srv;
    int port;
    int status;
    const char *body;
    int requests;
    char last_path[128], last_auth[128];
} srv_t;

static void handler(baton_http_req_t *req, void *ctx)
{
    srv_t *s = ctx;
    s->requests++;
    snprintf(s->last_path, sizeof(s->last_path), "%s", req->path);
    const baton_http_header_t *a = baton_http_req_header(req, "authorization");
    snprintf(s->last_auth, sizeof(s->last_auth), "%s", a ? a->value : "");
    baton_http_respond(req, s->status, "application/json", NULL, 0, s->body, strlen(s->body));
}

static void on_srv_closed(baton_http_server_t *srv)
{
    (void)srv;
}

static struct {
    uv_loop_t loop;
    uv_timer_t tick;
    int closed;
} L;

static void on_tick(uv_timer_t *t)
{
    (void)t;
}

static void on_lp_closed(baton_lpoll_t *lp, void *ctx)
{
    (void)lp;
    (void)ctx;
    L.closed++;
}

static void test_poller(void **state)
{
    (void)state;
    memset(&L, 0, sizeof(L));
    assert_int_equal(uv_loop_init(&L.loop), 0);
    assert_int_equal(uv_timer_init(&L.loop, &L.tick), 0);
    uv_timer_start(&L.tick, on_tick, 5, 5);
    srv_t s[3] = {
        {.status = 200, .body = "[{\"dp_rank\":0,\"num_reqs\":4,\"num_waiting_reqs\":1}]"},
        {.status = 200, .body = "{\"load\":2}"},
        {.status = 500, .body = "{\"error\":\"sick\"}"}};
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_worker_t *w[3];
    for (int i = 0; i < 3; i++) {
        assert_int_equal(baton_http_server_create(&s[i].srv, &L.loop, NULL, handler, &s[i]), 0);
        assert_int_equal(baton_http_server_listen(s[i].srv, "127.0.0.1", 0, 0), 0);
        s[i].port = baton_http_server_port(s[i].srv);
        char url[96];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", s[i].port, i == 1 ? "/v2" : "");
        w[i] = add_worker(reg, url, i == 0 ? "k-123" : NULL);
    }
    report(w[2], 99, 0, baton_now_ms() + 600000); /* a report the failing poll must withdraw */
    baton_lpoll_t *lp;
    assert_int_equal(baton_lpoll_create(&lp, &L.loop, reg, 0), BATON_EINVAL);
    assert_int_equal(baton_lpoll_create(&lp, &L.loop, reg, 50), 0);
    assert_int_equal(baton_lpoll_start(lp), 0);
    baton_worker_in_flight_inc(w[1]);
    uint64_t t0 = baton_now_ms();
    while ((baton_lpoll_ok(lp) < 4 || baton_lpoll_failed(lp) < 2) && baton_now_ms() - t0 < 10000)
        uv_run(&L.loop, UV_RUN_ONCE);
    assert_true(baton_lpoll_ok(lp) >= 4);
    assert_true(baton_lpoll_failed(lp) >= 2);
    uint64_t now = baton_now_ms();
    assert_int_equal(atomic_load(&w[0]->reported_load), 4); /* num_reqs counts the waiting */
    assert_int_equal(baton_worker_load(w[0], now), 4);
    assert_int_equal(atomic_load(&w[1]->reported_load), 2);
    assert_int_equal(atomic_load(&w[1]->reported_base), 1); /* our in-flight count then */
    assert_int_equal(baton_worker_load(w[1], now), 2);
    assert_int_equal(atomic_load(&w[2]->reported_until_ms), 0); /* withdrawn */
    assert_int_equal(baton_worker_load(w[2], now), 0);
    assert_string_equal(s[0].last_path, "/get_load");
    assert_string_equal(s[0].last_auth, "Bearer k-123");
    assert_string_equal(s[1].last_path, "/v2/get_load");
    assert_string_equal(s[1].last_auth, "");
    baton_worker_in_flight_dec(w[1]);

    baton_lpoll_close(lp, on_lp_closed, NULL);
    assert_int_equal(L.closed, 0); /* never inside the call */
    for (int i = 0; i < 3; i++)
        baton_http_server_close(s[i].srv, on_srv_closed);
    uv_close((uv_handle_t *)&L.tick, NULL);
    t0 = baton_now_ms();
    while (uv_loop_alive(&L.loop) && baton_now_ms() - t0 < 5000)
        uv_run(&L.loop, UV_RUN_ONCE);
    assert_int_equal(L.closed, 1);
    assert_int_equal(uv_loop_close(&L.loop), 0); /* every handle closed */
    baton_workers_unref(w, 3);
    baton_registry_destroy(reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse),
        cmocka_unit_test(test_worker_load),
        cmocka_unit_test(test_least_load_follows_reports),
        cmocka_unit_test(test_poller),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
