/* test_client.c — the upstream client against the real server and a scripted raw server. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "baton/error.h"
#include "common/buf.h"
#include "http/client.h"
#include "http/server.h"

#include "http_test_util.h"

/* How the baton server under test answers. */
enum smode { S_ECHO, S_CHUNKED, S_HOLD, S_PARTIAL_HOLD, S_CANCEL, S_STOP };
/* How the raw (scripted) server answers. */
enum rmode {
    R_NONE,
    R_UNTIL_CLOSE,
    R_STALE,
    R_MALFORMED,
    R_SHORT,
    R_INTERIM,
    R_TRAILING,
    R_TRAILERS
};

#define MAX_RAW_CONNS 8
#define MAX_RESULTS   4

typedef struct cfx_s cfx_t;

typedef struct rconn_s {
    uv_tcp_t tcp;
    cfx_t *fx;
    int id;
    char buf[8192];
    size_t len;
    int nreq;
    int closed;
} rconn_t;

typedef struct result_s {
    int done_calls;
    int err;
    int status;
    int head_calls;
    char x_reply[32];
    baton_buf_t body;
    int data_calls;
    int data_while_paused;
} result_t;

struct cfx_s {
    uv_loop_t loop;
    uv_timer_t guard;
    uv_timer_t step; /* test-specific delayed actions */
    /* baton server */
    baton_http_server_t *srv;
    int smode;
    int srv_requests;
    int srv_aborts;
    char peers[4][64];
    baton_http_req_t *held;
    /* raw server */
    uv_tcp_t rlisten;
    int rmode;
    rconn_t *rconns[MAX_RAW_CONNS];
    int n_rconns;
    int port;
    /* client */
    baton_http_pool_t *pool;
    baton_http_timeouts_t to;
    baton_http_creq_t *creq;
    int in_api; /* set while inside baton_http_request/cancel: callbacks must not run then */
    int cb_in_api;
    int n_started;
    int n_wanted; /* requests to run one after the other */
    result_t res[MAX_RESULTS];
    int cancel_on_data;
    int pause_on_data;
    int paused;
    int wait_aborts; /* before closing, wait for the server to see this many aborts */
    int delay_second_ms;
    unsigned pool_conns_after_first;
    unsigned pool_conns_before_second;
    unsigned srv_conns_seen;
    int stopping;
};

static cfx_t *g_fx;

/* ---- baton server side ---- */

static void srv_on_abort(baton_http_req_t *req)
{
    cfx_t *fx = req->data;
    fx->srv_aborts++;
    if (fx->held == req)
        fx->held = NULL;
    int rc;
    if (fx->smode == S_PARTIAL_HOLD)
        rc = baton_http_stream_end(req);
    else
        rc = baton_http_respond(req, 500, NULL, NULL, 0, "{}", 2);
    assert_int_equal(rc, BATON_ECLOSED);
}

static void srv_handler(baton_http_req_t *req, void *ctx)
{
    cfx_t *fx = ctx;
    req->data = fx;
    if (fx->srv_requests < 4)
        snprintf(fx->peers[fx->srv_requests], sizeof(fx->peers[0]), "%s", req->peer);
    fx->srv_requests++;
    fx->srv_conns_seen = baton_http_server_connections(fx->srv);
    switch (fx->smode) {
    case S_ECHO: {
        baton_buf_t b = BATON_BUF_INIT;
        baton_buf_printf(&b, "%s %s %s", req->method, req->path, req->body);
        baton_http_header_t extra[] = {{"X-Reply", "yes"}};
        baton_http_respond(req, 201, "text/plain", extra, 1, b.data, b.len);
        baton_buf_free(&b);
        break;
    }
    case S_CHUNKED:
        baton_http_stream_start(req, 200, "text/event-stream", NULL, 0);
        baton_http_stream_write(req, "one ", 4);
        baton_http_stream_write(req, "two ", 4);
        baton_http_stream_write(req, "three", 5);
        baton_http_stream_end(req);
        break;
    case S_HOLD:
        fx->held = req;
        req->on_abort = srv_on_abort;
        break;
    case S_PARTIAL_HOLD:
        fx->held = req;
        req->on_abort = srv_on_abort;
        baton_http_stream_start(req, 200, "text/plain", NULL, 0);
        baton_http_stream_write(req, "partial", 7);
        break;
    case S_STOP: /* stop accepting, then answer: the connection must close after it */
        baton_http_server_stop_accepting(fx->srv);
        baton_http_respond(req, 200, "text/plain", NULL, 0, "bye", 3);
        break;
    case S_CANCEL:
        fx->held = req;
        req->on_abort = srv_on_abort;
        fx->in_api = 1;
        baton_http_request_cancel(fx->creq);
        fx->in_api = 0;
        break;
    }
}

/* ---- raw server side ---- */

static void raw_send(rconn_t *rc, const char *s)
{
    uv_buf_t b = uv_buf_init((char *)s, (unsigned)strlen(s));
    int n = uv_try_write((uv_stream_t *)&rc->tcp, &b, 1);
    assert_int_equal(n, (int)strlen(s)); /* tiny writes on loopback */
}

static void raw_close(rconn_t *rc)
{
    if (rc->closed)
        return;
    rc->closed = 1;
    uv_close((uv_handle_t *)&rc->tcp, NULL);
}

static void raw_on_request(rconn_t *rc)
{
    cfx_t *fx = rc->fx;
    switch (fx->rmode) {
    case R_UNTIL_CLOSE:
        raw_send(rc, "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nhello ");
        raw_send(rc, "world");
        raw_close(rc);
        break;
    case R_STALE:
        if (rc->id == 0 && rc->nreq == 1) {
            raw_send(rc, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst");
        } else if (rc->id == 0) {
            raw_close(rc); /* the keep-alive connection "went stale" */
        } else {
            raw_send(rc, "HTTP/1.1 200 OK\r\nContent-Length: 6\r\n\r\nsecond");
        }
        break;
    case R_MALFORMED:
        raw_send(rc, "HTTP/1.1 2x0 What\r\n\r\n");
        break;
    case R_SHORT:
        raw_send(rc, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly ten b");
        raw_close(rc);
        break;
    case R_INTERIM:
        raw_send(rc, "HTTP/1.1 100 Continue\r\n\r\n"
                     "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Reply: final\r\n\r\nok");
        break;
    case R_TRAILING:
        raw_send(rc, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nokJUNK");
        break;
    case R_TRAILERS: {
        /* A head of 990 headers, then a chunked body with 20 trailers: together they pass the
         * client's 1000-header limit, the head alone does not. */
        baton_buf_t b = BATON_BUF_INIT;
        baton_buf_append_str(&b, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n"
                                 "X-Reply: head\r\n");
        for (int i = 0; i < 988; i++)
            baton_buf_printf(&b, "X-H%d: v\r\n", i);
        baton_buf_append_str(&b, "\r\n2\r\nok\r\n0\r\n");
        for (int i = 0; i < 20; i++)
            baton_buf_printf(&b, "X-Reply: trailer%d\r\n", i);
        baton_buf_append_str(&b, "\r\n");
        raw_send(rc, b.data);
        baton_buf_free(&b);
        break;
    }
    }
}

static void raw_alloc(uv_handle_t *h, size_t s, uv_buf_t *b)
{
    rconn_t *rc = h->data;
    b->base = rc->buf + rc->len;
    b->len = sizeof(rc->buf) - 1 - rc->len;
}

static void raw_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b)
{
    rconn_t *rc = s->data;
    if (n < 0) {
        raw_close(rc);
        return;
    }
    rc->len += (size_t)n;
    rc->buf[rc->len] = '\0';
    const char *end;
    while (!rc->closed && (end = find_crlfcrlf(rc->buf, rc->len)) != NULL) {
        size_t hl = (size_t)(end - rc->buf) + 4;
        memmove(rc->buf, rc->buf + hl, rc->len - hl);
        rc->len -= hl;
        rc->nreq++;
        raw_on_request(rc);
    }
}

static void raw_on_conn(uv_stream_t *ls, int status)
{
    cfx_t *fx = ls->data;
    assert_int_equal(status, 0);
    assert_true(fx->n_rconns < MAX_RAW_CONNS);
    rconn_t *rc = calloc(1, sizeof(*rc));
    rc->fx = fx;
    rc->id = fx->n_rconns;
    fx->rconns[fx->n_rconns++] = rc;
    uv_tcp_init(&fx->loop, &rc->tcp);
    rc->tcp.data = rc;
    assert_int_equal(uv_accept(ls, (uv_stream_t *)&rc->tcp), 0);
    uv_read_start((uv_stream_t *)&rc->tcp, raw_alloc, raw_read);
}

/* ---- fixture ---- */

static void on_guard(uv_timer_t *t)
{
    fail_msg("test did not finish within 10 s");
}

static cfx_t *cfx_new(int smode, int rmode, const baton_http_limits_t *lim)
{
    cfx_t *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    g_fx = fx;
    fx->smode = smode;
    fx->rmode = rmode;
    fx->n_wanted = 1;
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    uv_timer_init(&fx->loop, &fx->guard);
    uv_timer_start(&fx->guard, on_guard, 10000, 0);
    uv_timer_init(&fx->loop, &fx->step);
    fx->step.data = fx;
    if (rmode == R_NONE) {
        assert_int_equal(baton_http_server_create(&fx->srv, &fx->loop, lim, srv_handler, fx), 0);
        assert_int_equal(baton_http_server_listen(fx->srv, "127.0.0.1", 0, 0), 0);
        fx->port = baton_http_server_port(fx->srv);
    } else {
        uv_tcp_init(&fx->loop, &fx->rlisten);
        fx->rlisten.data = fx;
        struct sockaddr_in a;
        uv_ip4_addr("127.0.0.1", 0, &a);
        assert_int_equal(uv_tcp_bind(&fx->rlisten, (struct sockaddr *)&a, 0), 0);
        assert_int_equal(uv_listen((uv_stream_t *)&fx->rlisten, 16, raw_on_conn), 0);
        struct sockaddr_in b;
        int l = sizeof(b);
        uv_tcp_getsockname(&fx->rlisten, (struct sockaddr *)&b, &l);
        fx->port = ntohs(b.sin_port);
    }
    assert_int_equal(baton_http_pool_create(&fx->pool, &fx->loop, "127.0.0.1", fx->port, 8), 0);
    return fx;
}

static void cfx_stop(cfx_t *fx)
{
    if (fx->stopping)
        return;
    fx->stopping = 1;
    baton_http_pool_destroy(fx->pool);
    if (fx->srv)
        baton_http_server_close(fx->srv, NULL);
    if (fx->rmode != R_NONE) {
        uv_close((uv_handle_t *)&fx->rlisten, NULL);
        for (int i = 0; i < fx->n_rconns; i++)
            raw_close(fx->rconns[i]);
    }
    uv_close((uv_handle_t *)&fx->guard, NULL);
    uv_close((uv_handle_t *)&fx->step, NULL);
}

static void cfx_run(cfx_t *fx)
{
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&fx->loop), 0); /* nothing left open */
}

static void cfx_free(cfx_t *fx)
{
    for (int i = 0; i < MAX_RESULTS; i++)
        baton_buf_free(&fx->res[i].body);
    for (int i = 0; i < fx->n_rconns; i++)
        free(fx->rconns[i]);
    free(fx);
    g_fx = NULL;
}

/* ---- client callbacks ---- */

static void start_request(cfx_t *fx);

static void c_on_head(baton_http_creq_t *req, int status, const baton_http_header_t *h, size_t n)
{
    cfx_t *fx = req->data;
    result_t *r = &fx->res[fx->n_started - 1];
    if (fx->in_api)
        fx->cb_in_api++;
    r->head_calls++;
    r->status = status;
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(h[i].name, "x-reply") == 0)
            snprintf(r->x_reply, sizeof(r->x_reply), "%s", h[i].value);
}

static void on_step_resume(uv_timer_t *t)
{
    cfx_t *fx = t->data;
    fx->paused = 0;
    baton_http_request_pause(fx->creq, 0);
}

static void c_on_data(baton_http_creq_t *req, const char *data, size_t len)
{
    cfx_t *fx = req->data;
    result_t *r = &fx->res[fx->n_started - 1];
    if (fx->in_api)
        fx->cb_in_api++;
    if (fx->paused)
        r->data_while_paused++;
    r->data_calls++;
    baton_buf_append(&r->body, data, len);
    if (fx->cancel_on_data) {
        fx->in_api = 1;
        baton_http_request_cancel(req);
        fx->in_api = 0;
    }
    if (fx->pause_on_data && r->data_calls == 1) {
        fx->paused = 1;
        baton_http_request_pause(req, 1);
        uv_timer_start(&fx->step, on_step_resume, 120, 0);
    }
}

static void on_step_wait_aborts(uv_timer_t *t)
{
    cfx_t *fx = t->data;
    if (fx->srv_aborts >= fx->wait_aborts)
        cfx_stop(fx);
}

static void on_step_start(uv_timer_t *t)
{
    cfx_t *fx = t->data;
    fx->pool_conns_before_second = baton_http_pool_connections(fx->pool);
    start_request(fx);
}

static void c_on_done(baton_http_creq_t *req, int err)
{
    cfx_t *fx = req->data;
    result_t *r = &fx->res[fx->n_started - 1];
    if (fx->in_api)
        fx->cb_in_api++;
    r->done_calls++;
    r->err = err;
    if (fx->n_started == 1)
        fx->pool_conns_after_first = baton_http_pool_connections(fx->pool);
    if (fx->n_started < fx->n_wanted) {
        if (fx->delay_second_ms)
            uv_timer_start(&fx->step, on_step_start, (uint64_t)fx->delay_second_ms, 0);
        else
            start_request(fx);
        return;
    }
    if (fx->wait_aborts)
        uv_timer_start(&fx->step, on_step_wait_aborts, 5, 5);
    else
        cfx_stop(fx);
}

static const char *g_body = "payload";

static void start_request(cfx_t *fx)
{
    static const baton_http_client_cb_t cb = {c_on_head, c_on_data, c_on_done};
    baton_http_header_t hdrs[] = {{"X-A", "1"}, {"Host", "ignored"}};
    fx->n_started++;
    fx->in_api = 1;
    int r = baton_http_request(&fx->creq, fx->pool, "POST", "/x?q=1", hdrs, 2, g_body,
                               strlen(g_body), &fx->to, &cb, fx);
    fx->in_api = 0;
    assert_int_equal(r, 0);
}

static cfx_t *run_simple(int smode, int rmode)
{
    cfx_t *fx = cfx_new(smode, rmode, NULL);
    start_request(fx);
    cfx_run(fx);
    return fx;
}

static void assert_one_done(cfx_t *fx, int err)
{
    assert_int_equal(fx->res[0].done_calls, 1);
    if (fx->res[0].err != err)
        fail_msg("err %s, want %s", baton_err_name(fx->res[0].err), baton_err_name(err));
    assert_int_equal(fx->cb_in_api, 0);
}

/* ---- tests ---- */

static void test_content_length(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_NONE);
    assert_one_done(fx, 0);
    assert_int_equal(fx->res[0].head_calls, 1);
    assert_int_equal(fx->res[0].status, 201);
    assert_string_equal(fx->res[0].x_reply, "yes");
    assert_string_equal(fx->res[0].body.data, "POST /x payload");
    assert_int_equal(fx->pool_conns_after_first, 1); /* back in the pool */
    cfx_free(fx);
}

static void test_chunked_response(void **state)
{
    cfx_t *fx = run_simple(S_CHUNKED, R_NONE);
    assert_one_done(fx, 0);
    assert_int_equal(fx->res[0].status, 200);
    assert_string_equal(fx->res[0].body.data, "one two three");
    assert_int_equal(fx->pool_conns_after_first, 1);
    cfx_free(fx);
}

static void test_read_until_close(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_UNTIL_CLOSE);
    assert_one_done(fx, 0);
    assert_int_equal(fx->res[0].status, 200);
    assert_string_equal(fx->res[0].body.data, "hello world");
    assert_int_equal(fx->pool_conns_after_first, 0); /* not reusable */
    cfx_free(fx);
}

static void test_connect_refused(void **state)
{
    cfx_t *fx = cfx_new(S_ECHO, R_NONE, NULL);
    baton_http_pool_destroy(fx->pool);
    int port = unused_port();
    assert_true(port > 0);
    assert_int_equal(baton_http_pool_create(&fx->pool, &fx->loop, "localhost", port, 8), 0);
    start_request(fx);
    assert_int_equal(fx->res[0].done_calls, 0); /* never inside baton_http_request */
    cfx_run(fx);
    assert_one_done(fx, BATON_ECONNECT);
    assert_int_equal(fx->res[0].head_calls, 0);
    cfx_free(fx);
}

static void test_first_byte_timeout(void **state)
{
    cfx_t *fx = cfx_new(S_HOLD, R_NONE, NULL);
    fx->to.first_byte_ms = 100;
    fx->wait_aborts = 1; /* the upstream must see the close */
    start_request(fx);
    cfx_run(fx);
    assert_one_done(fx, BATON_ETIMEOUT_FIRST_BYTE);
    assert_int_equal(fx->srv_aborts, 1);
    assert_int_equal(fx->pool_conns_after_first, 0);
    cfx_free(fx);
}

static void test_idle_timeout(void **state)
{
    cfx_t *fx = cfx_new(S_PARTIAL_HOLD, R_NONE, NULL);
    fx->to.first_byte_ms = 5000;
    fx->to.idle_ms = 100;
    fx->wait_aborts = 1;
    start_request(fx);
    cfx_run(fx);
    assert_one_done(fx, BATON_ETIMEOUT_IDLE);
    assert_int_equal(fx->res[0].status, 200);
    assert_string_equal(fx->res[0].body.data, "partial");
    assert_int_equal(fx->srv_aborts, 1);
    cfx_free(fx);
}

static void test_total_timeout(void **state)
{
    cfx_t *fx = cfx_new(S_PARTIAL_HOLD, R_NONE, NULL);
    fx->to.idle_ms = 5000;
    fx->to.total_ms = 150;
    fx->wait_aborts = 1;
    start_request(fx);
    cfx_run(fx);
    assert_one_done(fx, BATON_ETIMEOUT_TOTAL);
    cfx_free(fx);
}

static void test_cancel(void **state)
{
    cfx_t *fx = cfx_new(S_CANCEL, R_NONE, NULL);
    fx->wait_aborts = 1;
    start_request(fx);
    cfx_run(fx);
    assert_one_done(fx, BATON_ECANCELED);
    assert_int_equal(fx->srv_requests, 1);
    assert_int_equal(fx->srv_aborts, 1); /* the server saw the connection close */
    assert_int_equal(fx->pool_conns_after_first, 0);
    cfx_free(fx);
}

static void test_cancel_in_on_data(void **state)
{
    cfx_t *fx = cfx_new(S_CHUNKED, R_NONE, NULL);
    fx->cancel_on_data = 1;
    start_request(fx);
    cfx_run(fx);
    assert_one_done(fx, BATON_ECANCELED);
    assert_int_equal(fx->res[0].data_calls, 1);
    cfx_free(fx);
}

static void test_pool_reuse(void **state)
{
    cfx_t *fx = cfx_new(S_ECHO, R_NONE, NULL);
    fx->n_wanted = 3;
    start_request(fx);
    cfx_run(fx);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fx->res[i].done_calls, 1);
        assert_int_equal(fx->res[i].err, 0);
        assert_string_equal(fx->res[i].body.data, "POST /x payload");
    }
    assert_int_equal(fx->cb_in_api, 0);
    assert_int_equal(fx->srv_requests, 3);
    assert_int_equal(fx->pool_conns_after_first, 1);
    assert_int_equal(fx->srv_conns_seen, 1);
    assert_string_equal(fx->peers[0], fx->peers[1]); /* same connection */
    assert_string_equal(fx->peers[1], fx->peers[2]);
    cfx_free(fx);
}

static void test_stale_keepalive_retry(void **state)
{
    cfx_t *fx = cfx_new(S_ECHO, R_STALE, NULL);
    fx->n_wanted = 2;
    start_request(fx);
    cfx_run(fx);
    assert_int_equal(fx->res[0].err, 0);
    assert_string_equal(fx->res[0].body.data, "first");
    assert_int_equal(fx->res[1].done_calls, 1);
    assert_int_equal(fx->res[1].err, 0); /* retried once on a new connection */
    assert_string_equal(fx->res[1].body.data, "second");
    assert_int_equal(fx->n_rconns, 2);
    assert_int_equal(fx->rconns[0]->nreq, 2); /* it really went to the stale one first */
    cfx_free(fx);
}

static void test_idle_closed_by_server(void **state)
{
    baton_http_limits_t l;
    baton_http_limits_default(&l);
    l.keepalive_timeout_ms = 50;
    cfx_t *fx = cfx_new(S_ECHO, R_NONE, &l);
    fx->n_wanted = 2;
    fx->delay_second_ms = 400;
    start_request(fx);
    cfx_run(fx);
    assert_int_equal(fx->res[0].err, 0);
    assert_int_equal(fx->res[1].err, 0);
    assert_int_equal(fx->pool_conns_after_first, 1);
    /* the server's idle close was noticed and the connection dropped from the pool */
    assert_int_equal(fx->pool_conns_before_second, 0);
    assert_string_not_equal(fx->peers[0], fx->peers[1]);
    cfx_free(fx);
}

static void test_server_stop_accepting(void **state)
{
    cfx_t *fx = cfx_new(S_STOP, R_NONE, NULL);
    fx->n_wanted = 2;
    start_request(fx);
    cfx_run(fx);
    assert_int_equal(fx->res[0].err, 0);
    assert_string_equal(fx->res[0].body.data, "bye");
    assert_int_equal(fx->pool_conns_after_first, 0);  /* Connection: close */
    assert_int_equal(fx->res[1].err, BATON_ECONNECT); /* nobody listens any more */
    assert_int_equal(fx->srv_requests, 1);
    cfx_free(fx);
}

static void test_malformed_response(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_MALFORMED);
    assert_one_done(fx, BATON_EUPSTREAM);
    cfx_free(fx);
}

static void test_short_body(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_SHORT);
    assert_one_done(fx, BATON_EEOF);
    assert_int_equal(fx->res[0].status, 200);
    assert_string_equal(fx->res[0].body.data, "only ten b");
    cfx_free(fx);
}

static void test_interim_response(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_INTERIM);
    assert_one_done(fx, 0);
    assert_int_equal(fx->res[0].head_calls, 1);
    assert_int_equal(fx->res[0].status, 200);
    assert_string_equal(fx->res[0].x_reply, "final");
    assert_string_equal(fx->res[0].body.data, "ok");
    cfx_free(fx);
}

static void test_trailing_bytes_not_reused(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_TRAILING);
    assert_one_done(fx, 0);
    assert_string_equal(fx->res[0].body.data, "ok");
    assert_int_equal(fx->pool_conns_after_first, 0);
    cfx_free(fx);
}

/* Trailers of a chunked response are counted against the head's byte limit and dropped: they
 * neither count as headers (990 + 20 would pass the 1000-header limit) nor grow the arena that
 * the headers handed to on_head point into. */
static void test_trailers_dropped(void **state)
{
    cfx_t *fx = run_simple(S_ECHO, R_TRAILERS);
    assert_one_done(fx, 0);
    assert_int_equal(fx->res[0].head_calls, 1);
    assert_int_equal(fx->res[0].status, 200);
    assert_string_equal(fx->res[0].x_reply, "head");
    assert_string_equal(fx->res[0].body.data, "ok");
    cfx_free(fx);
}

static void test_pause_resume(void **state)
{
    cfx_t *fx = cfx_new(S_CHUNKED, R_NONE, NULL);
    fx->pause_on_data = 1;
    fx->to.idle_ms = 40; /* paused time must not count as idle */
    start_request(fx);
    cfx_run(fx);
    assert_one_done(fx, 0);
    assert_string_equal(fx->res[0].body.data, "one two three");
    assert_int_equal(fx->res[0].data_while_paused, 0);
    cfx_free(fx);
}

static void never_cb(baton_http_creq_t *req, int err)
{
    fail_msg("callback after a refused request");
}

static void test_bad_args(void **state)
{
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    baton_http_pool_t *pool;
    assert_int_equal(baton_http_pool_create(&pool, &loop, "127.0.0.1", 0, 1), BATON_EINVAL);
    assert_int_equal(baton_http_pool_create(&pool, &loop, "", 80, 1), BATON_EINVAL);
    assert_int_equal(baton_http_pool_create(&pool, &loop, "127.0.0.1", 65536, 1), BATON_EINVAL);
    assert_int_equal(baton_http_pool_create(&pool, &loop, "127.0.0.1", 9, 1), 0);
    baton_http_creq_t *req;
    baton_http_client_cb_t cb = {NULL, NULL, never_cb};
    baton_http_client_cb_t nocb = {NULL, NULL, NULL};
    assert_int_equal(
        baton_http_request(&req, pool, "GET", "/", NULL, 0, NULL, 0, NULL, &nocb, NULL),
        BATON_EINVAL);
    assert_int_equal(
        baton_http_request(&req, pool, "GET", "/a\r\nX: y", NULL, 0, NULL, 0, NULL, &cb, NULL),
        BATON_EINVAL);
    baton_http_header_t bad[] = {{"X", "v\r\nInjected: 1"}};
    assert_int_equal(baton_http_request(&req, pool, "GET", "/", bad, 1, NULL, 0, NULL, &cb, NULL),
                     BATON_EINVAL);
    assert_int_equal(baton_http_request(&req, pool, "GET", "/", NULL, 0, NULL, 5, NULL, &cb, NULL),
                     BATON_EINVAL);
    assert_int_equal(baton_http_pool_connections(pool), 0);
    baton_http_pool_destroy(pool);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_content_length),
        cmocka_unit_test(test_chunked_response),
        cmocka_unit_test(test_read_until_close),
        cmocka_unit_test(test_connect_refused),
        cmocka_unit_test(test_first_byte_timeout),
        cmocka_unit_test(test_idle_timeout),
        cmocka_unit_test(test_total_timeout),
        cmocka_unit_test(test_cancel),
        cmocka_unit_test(test_cancel_in_on_data),
        cmocka_unit_test(test_pool_reuse),
        cmocka_unit_test(test_stale_keepalive_retry),
        cmocka_unit_test(test_idle_closed_by_server),
        cmocka_unit_test(test_server_stop_accepting),
        cmocka_unit_test(test_malformed_response),
        cmocka_unit_test(test_short_body),
        cmocka_unit_test(test_interim_response),
        cmocka_unit_test(test_trailing_bytes_not_reused),
        cmocka_unit_test(test_trailers_dropped),
        cmocka_unit_test(test_pause_resume),
        cmocka_unit_test(test_bad_args),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
