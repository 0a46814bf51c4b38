/* test_bootstrap.c — the PD rendezvous on a real loop: a prefill and a decode module in one
 * process over loopback TCP; ordering, timeouts, aborts, garbage frames, peer loss. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/bootstrap.h"

static uv_loop_t loop;
static uv_timer_t tick;

static void tick_cb(uv_timer_t *t) {}

/* Runs the loop until *flag != 0 or ms pass; returns *flag. */
static int run_until(int *flag, uint64_t ms)
{
    uint64_t deadline = uv_now(&loop) + ms;
    uv_timer_start(&tick, tick_cb, 5, 5);
    while (!*flag && uv_now(&loop) < deadline)
        uv_run(&loop, UV_RUN_ONCE);
    uv_timer_stop(&tick);
    return *flag;
}

static void run_for(uint64_t ms)
{
    int never = 0;
    run_until(&never, ms);
}

typedef struct waiter_s {
    wk_boot_wait_t w;
    int called;
    int status;
    wk_boot_result_t res;
} waiter_t;

typedef struct pubber_s {
    wk_boot_pub_t p;
    int called;
    int status;
} pubber_t;

static void wait_cb(wk_boot_wait_t *w, int status, const wk_boot_result_t *res)
{
    waiter_t *x = w->data;
    x->called++;
    x->status = status;
    if (status == 0) {
        assert_non_null(res);
        x->res = *res;
    } else {
        assert_null(res);
    }
}

static void pub_cb(wk_boot_pub_t *p, int status)
{
    pubber_t *x = p->data;
    x->called++;
    x->status = status;
}

typedef struct env_s {
    wk_boot_t *prefill;
    wk_boot_t *decode;
    int port;
} env_t;

static int closed_count;

static void closed_cb(void *arg)
{
    closed_count++;
}

static void env_up(env_t *e, uint64_t timeout_ms)
{
    assert_int_equal(wk_boot_create(&e->prefill, &loop, timeout_ms), 0);
    assert_int_equal(wk_boot_create(&e->decode, &loop, timeout_ms), 0);
    assert_int_equal(wk_boot_listen(e->prefill, "127.0.0.1", 0), 0);
    e->port = wk_boot_port(e->prefill);
    assert_true(e->port > 0);
}

static void env_down(env_t *e)
{
    closed_count = 0;
    if (e->prefill)
        wk_boot_close(e->prefill, closed_cb, NULL);
    if (e->decode)
        wk_boot_close(e->decode, closed_cb, NULL);
    int want = (e->prefill != NULL) + (e->decode != NULL);
    for (int i = 0; i < 1000 && closed_count < want; i++)
        uv_run(&loop, UV_RUN_ONCE);
    assert_int_equal(closed_count, want);
}

static int setup(void **state)
{
    assert_int_equal(uv_loop_init(&loop), 0);
    uv_timer_init(&loop, &tick);
    return 0;
}

static int teardown(void **state)
{
    uv_close((uv_handle_t *)&tick, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0); /* nothing left open */
    return 0;
}

static void test_publish_then_wait(void **state)
{
    env_t e;
    env_up(&e, 5000);
    pubber_t p = {.p.data = &p};
    waiter_t w = {.w.data = &w};
    wk_boot_result_t res = {.prompt_tokens = 17, .first_token = 42};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 1001, &res, pub_cb), 0);
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 1001, &res, pub_cb), BATON_EEXIST);
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 1001, wait_cb), 0);
    assert_int_equal(w.called, 0); /* never inside the call */
    assert_true(run_until(&w.called, 5000));
    assert_int_equal(w.status, 0);
    assert_int_equal(w.res.prompt_tokens, 17);
    assert_int_equal(w.res.first_token, 42);
    assert_true(run_until(&p.called, 5000));
    assert_int_equal(p.status, 0);
    assert_int_equal(p.called, 1);
    assert_int_equal(w.called, 1);
    env_down(&e);
}

static void test_wait_then_publish(void **state)
{
    env_t e;
    env_up(&e, 5000);
    pubber_t p = {.p.data = &p};
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "localhost", e.port, 7, wait_cb), 0);
    waiter_t w2 = {.w.data = &w2};
    assert_int_equal(wk_boot_wait(e.decode, &w2.w, "127.0.0.1", e.port, 7, wait_cb), BATON_EEXIST);
    run_for(100); /* the WAIT reaches the prefill first */
    assert_int_equal(w.called, 0);
    wk_boot_result_t res = {.prompt_tokens = 3, .first_token = -1};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 7, &res, pub_cb), 0);
    assert_int_equal(p.called, 0);
    assert_true(run_until(&w.called, 5000));
    assert_int_equal(w.status, 0);
    assert_int_equal(w.res.prompt_tokens, 3);
    assert_int_equal(w.res.first_token, -1);
    assert_true(run_until(&p.called, 5000));
    assert_int_equal(p.status, 0);
    env_down(&e);
}

static void test_many_rooms_one_connection(void **state)
{
    env_t e;
    env_up(&e, 5000);
    enum { N = 200 };
    static waiter_t w[N];
    static pubber_t p[N];
    memset(w, 0, sizeof(w));
    memset(p, 0, sizeof(p));
    for (int i = 0; i < N; i++) {
        w[i].w.data = &w[i];
        p[i].p.data = &p[i];
        /* half published before the decode asks, half after */
        if (i % 2 == 0) {
            wk_boot_result_t r = {.prompt_tokens = (uint32_t)i, .first_token = i % 64};
            assert_int_equal(wk_boot_publish(e.prefill, &p[i].p, 5000 + i, &r, pub_cb), 0);
        }
        assert_int_equal(wk_boot_wait(e.decode, &w[i].w, "127.0.0.1", e.port, 5000 + i, wait_cb),
                         0);
    }
    run_for(50);
    for (int i = 1; i < N; i += 2) {
        wk_boot_result_t r = {.prompt_tokens = (uint32_t)i, .first_token = i % 64};
        assert_int_equal(wk_boot_publish(e.prefill, &p[i].p, 5000 + i, &r, pub_cb), 0);
    }
    int all = 0;
    for (int spin = 0; spin < 2000 && !all; spin++) {
        run_for(5);
        all = 1;
        for (int i = 0; i < N; i++)
            if (!w[i].called || !p[i].called)
                all = 0;
    }
    assert_true(all);
    for (int i = 0; i < N; i++) {
        assert_int_equal(w[i].status, 0);
        assert_int_equal(w[i].res.prompt_tokens, (uint32_t)i); /* each room its own answer */
        assert_int_equal(w[i].res.first_token, i % 64);
        assert_int_equal(p[i].status, 0);
    }
    wk_boot_stats_t st;
    wk_boot_get_stats(e.decode, &st);
    assert_int_equal(st.connections, 1); /* multiplexed on one connection */
    assert_int_equal(st.rooms_done, N);
    env_down(&e);
}

static void test_decode_timeout(void **state)
{
    env_t e;
    env_up(&e, 200);
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 99, wait_cb), 0);
    assert_true(run_until(&w.called, 3000));
    assert_int_equal(w.status, BATON_ETIMEOUT);
    run_for(50); /* the ABORT reaches the prefill */
    /* the prefill now knows the room is dead: a late publish fails at once */
    pubber_t p = {.p.data = &p};
    wk_boot_result_t res = {1, 1};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 99, &res, pub_cb), BATON_EABORTED);
    run_for(50);
    assert_int_equal(p.called, 0);
    assert_int_equal(w.called, 1);
    env_down(&e);
}

static void test_prefill_timeout(void **state)
{
    env_t e;
    env_up(&e, 150);
    pubber_t p = {.p.data = &p};
    wk_boot_result_t res = {1, 1};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 5, &res, pub_cb), 0);
    assert_true(run_until(&p.called, 3000));
    assert_int_equal(p.status, BATON_ETIMEOUT);
    /* a decode arriving late is told at once instead of waiting for its own timeout */
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 5, wait_cb), 0);
    assert_true(run_until(&w.called, 100));
    assert_int_equal(w.status, BATON_EABORTED);
    env_down(&e);
}

static void test_cancels(void **state)
{
    env_t e;
    env_up(&e, 5000);
    /* prefill withdraws before the decode comes: the decode learns it at once */
    pubber_t p = {.p.data = &p};
    wk_boot_result_t res = {1, 1};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 11, &res, pub_cb), 0);
    wk_boot_publish_cancel(&p.p);
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 11, wait_cb), 0);
    assert_true(run_until(&w.called, 2000));
    assert_int_equal(w.status, BATON_EABORTED);
    assert_int_equal(p.called, 0);

    /* decode withdraws while the prefill holds the room: the publish fails with EABORTED */
    pubber_t p2 = {.p.data = &p2};
    waiter_t w2 = {.w.data = &w2};
    assert_int_equal(wk_boot_wait(e.decode, &w2.w, "127.0.0.1", e.port, 12, wait_cb), 0);
    run_for(50);
    wk_boot_wait_cancel(&w2.w);
    run_for(50);
    assert_int_equal(wk_boot_publish(e.prefill, &p2.p, 12, &res, pub_cb), BATON_EABORTED);

    /* decode withdraws right after asking for a published room: the WAIT already left, so the
     * prefill hands the room off; the DONE that comes back for the cancelled wait is ignored */
    pubber_t p3 = {.p.data = &p3};
    waiter_t w3 = {.w.data = &w3};
    assert_int_equal(wk_boot_publish(e.prefill, &p3.p, 13, &res, pub_cb), 0);
    assert_int_equal(wk_boot_wait(e.decode, &w3.w, "127.0.0.1", e.port, 13, wait_cb), 0);
    wk_boot_wait_cancel(&w3.w);
    assert_true(run_until(&p3.called, 2000));
    assert_int_equal(p3.status, 0);
    run_for(50);
    assert_int_equal(w3.called, 0);
    env_down(&e);
}

static void test_connect_refused(void **state)
{
    env_t e;
    env_up(&e, 5000);
    int port = e.port;
    /* close the prefill so nothing listens on its port any more */
    closed_count = 0;
    wk_boot_close(e.prefill, closed_cb, NULL);
    e.prefill = NULL;
    while (closed_count < 1)
        uv_run(&loop, UV_RUN_ONCE);
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", port, 1, wait_cb), 0);
    assert_true(run_until(&w.called, 3000));
    assert_int_equal(w.status, UV_ECONNREFUSED);
    assert_int_equal(wk_boot_wait(e.decode, &w.w, NULL, port, 1, wait_cb), BATON_EINVAL);
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", 0, 1, wait_cb), BATON_EINVAL);
    env_down(&e);
}

static void test_peer_lost(void **state)
{
    env_t e;
    env_up(&e, 5000);
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 3, wait_cb), 0);
    run_for(50);
    closed_count = 0;
    wk_boot_close(e.prefill, closed_cb, NULL);
    e.prefill = NULL;
    assert_true(run_until(&w.called, 3000));
    assert_int_equal(w.status, BATON_EPEERDOWN);
    env_down(&e);
}

/* ---- garbage on the bootstrap port ---- */

typedef struct raw_s {
    uv_tcp_t tcp;
    uv_connect_t creq;
    uv_write_t wreq;
    const char *payload;
    size_t len;
    int eof, closed;
    char rbuf[256];
} raw_t;

static void raw_alloc(uv_handle_t *h, size_t s, uv_buf_t *b)
{
    raw_t *r = h->data;
    *b = uv_buf_init(r->rbuf, sizeof(r->rbuf));
}

static void raw_closed(uv_handle_t *h)
{
    ((raw_t *)h->data)->closed = 1;
}

static void raw_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    raw_t *r = s->data;
    if (n < 0) {
        r->eof = 1;
        uv_close((uv_handle_t *)s, raw_closed);
    }
}

static void raw_written(uv_write_t *req, int status) {}

static void raw_connected(uv_connect_t *req, int status)
{
    raw_t *r = req->data;
    assert_int_equal(status, 0);
    uv_buf_t b = uv_buf_init((char *)r->payload, (unsigned)r->len);
    uv_write(&r->wreq, (uv_stream_t *)&r->tcp, &b, 1, raw_written);
    uv_read_start((uv_stream_t *)&r->tcp, raw_alloc, raw_read);
}

static void send_raw(int port, const char *payload, size_t len)
{
    raw_t r;
    memset(&r, 0, sizeof(r));
    r.payload = payload;
    r.len = len;
    uv_tcp_init(&loop, &r.tcp);
    r.tcp.data = &r;
    r.creq.data = &r;
    struct sockaddr_in a;
    uv_ip4_addr("127.0.0.1", port, &a);
    assert_int_equal(uv_tcp_connect(&r.creq, &r.tcp, (struct sockaddr *)&a, raw_connected), 0);
    /* the prefill must close the connection on its own */
    assert_true(run_until(&r.eof, 3000));
    run_until(&r.closed, 1000);
}

static void test_garbage_frames(void **state)
{
    env_t e;
    env_up(&e, 5000);
    /* an established decode connection with a pending room must survive other peers' garbage */
    waiter_t w = {.w.data = &w};
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 77, wait_cb), 0);
    run_for(50);
    send_raw(e.port, "GET / HTTP/1.1\r\n\r\n", 18);
    static const char done_from_decode[28] = {'B', 'T', 1, 2, 0, 0, 0, 20};
    send_raw(e.port, done_from_decode, sizeof(done_from_decode)); /* wrong direction */
    send_raw(e.port, "BT\x01\x01\xff\xff\xff\xff", 8);            /* absurd length */
    send_raw(e.port, "BT\x07", 3);                                /* unknown version */
    wk_boot_stats_t st;
    wk_boot_get_stats(e.prefill, &st);
    assert_int_equal(st.proto_errors, 4);
    pubber_t p = {.p.data = &p};
    wk_boot_result_t res = {9, 8};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 77, &res, pub_cb), 0);
    assert_true(run_until(&w.called, 3000));
    assert_int_equal(w.status, 0);
    assert_int_equal(w.res.prompt_tokens, 9);
    assert_true(run_until(&p.called, 3000));
    assert_int_equal(p.status, 0);
    env_down(&e);
}

static void test_shutdown_reports(void **state)
{
    env_t e;
    env_up(&e, 5000);
    pubber_t p = {.p.data = &p};
    waiter_t w = {.w.data = &w};
    wk_boot_result_t res = {1, 1};
    assert_int_equal(wk_boot_publish(e.prefill, &p.p, 1, &res, pub_cb), 0);
    assert_int_equal(wk_boot_wait(e.decode, &w.w, "127.0.0.1", e.port, 2, wait_cb), 0);
    env_down(&e);
    assert_int_equal(p.called, 1);
    assert_int_equal(p.status, BATON_ESHUTDOWN);
    assert_int_equal(w.called, 1);
    assert_int_equal(w.status, BATON_ESHUTDOWN);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_publish_then_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wait_then_publish, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_rooms_one_connection, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefill_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_cancels, setup, teardown),
        cmocka_unit_test_setup_teardown(test_connect_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_peer_lost, setup, teardown),
        cmocka_unit_test_setup_teardown(test_garbage_frames, setup, teardown),
        cmocka_unit_test_setup_teardown(test_shutdown_reports, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
