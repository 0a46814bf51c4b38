/* test_server_state.c — the server connection's state table and its one transition function. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "baton/error.h"
#include "common/log.h"
#include "common/phase.h"
#include "http/server_internal.h"

/* ---- the table ---- */

static void test_table(void **state)
{
    for (int a = 0; a < CS_COUNT; a++) {
        const char *na = baton__hs_state_name((baton__hs_state_t)a);
        assert_string_not_equal(na, "?");
        for (int b = 0; b < a; b++) /* names line up with the enum: one each */
            assert_string_not_equal(na, baton__hs_state_name((baton__hs_state_t)b));
        assert_false(baton__hs_state_allowed((baton__hs_state_t)a, (baton__hs_state_t)a));
        /* Once closing, never back to taking requests. */
        if (a >= CS_LINGER)
            for (int b = 0; b < CS_LINGER; b++)
                assert_false(baton__hs_state_allowed((baton__hs_state_t)a, (baton__hs_state_t)b));
        /* Every state but the last can close. */
        if (a != CS_FREEING && a != CS_CLOSED)
            assert_true(baton__hs_state_allowed((baton__hs_state_t)a, CS_CLOSED) ||
                        baton__hs_state_allowed((baton__hs_state_t)a, CS_ABORTED));
    }
    assert_string_equal(baton__hs_state_name(CS_COUNT), "?");
    assert_false(baton__hs_state_allowed(CS_FREEING, CS_CLOSED));
    assert_false(baton__hs_state_allowed(CS_COUNT, CS_IDLE));
}

/* ---- a connection on a socketpair, driven the way the read callback drives it ---- */

typedef struct fx_s {
    uv_loop_t loop;
    srv_t *srv;
    conn_t *c;
    int peer;               /* the client's end */
    baton_http_req_t *held; /* a request the handler keeps */
    int hold;
    int requests;
    int aborts;
    int closed;
    unsigned refused_at_close; /* illegal moves counted over the server's whole life */
} fx_t;

static void on_abort(baton_http_req_t *req)
{
    fx_t *fx = req->data;
    fx->aborts++;
    assert_int_equal(baton_http_respond(req, 200, NULL, NULL, 0, "{}", 2), BATON_ECLOSED);
    fx->held = NULL;
}

static void handler(baton_http_req_t *req, void *ctx)
{
    fx_t *fx = ctx;
    fx->requests++;
    req->data = fx;
    req->on_abort = on_abort;
    if (fx->hold) {
        fx->held = req;
        return;
    }
    baton_http_respond(req, 200, NULL, NULL, 0, req->body, req->body_len);
}

static void on_closed(baton_http_server_t *srv)
{
    fx_t *fx = srv->data;
    fx->closed = 1;
    fx->refused_at_close = baton__hs_srv(srv)->state_refused;
}

static void fx_start(fx_t *fx)
{
    memset(fx, 0, sizeof(*fx));
    assert_int_equal(uv_loop_init(&fx->loop), 0);
    baton_http_server_t *pub;
    assert_int_equal(baton_http_server_create(&pub, &fx->loop, NULL, handler, fx), 0);
    pub->data = fx;
    fx->srv = baton__hs_srv(pub);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
    fx->peer = sv[1];
    fx->c = baton__hs_conn_new(fx->srv, sv[0]);
    assert_non_null(fx->c);
    baton__hs_conn_admit(fx->c);
    assert_int_equal(fx->c->state, CS_IDLE);
}

static void fx_feed(fx_t *fx, const char *bytes)
{
    conn_t *c = fx->c;
    if (c->state == CS_HANDLER || c->pending.len > 0)
        baton__hs_stash(c, bytes, strlen(bytes));
    else
        baton__hs_feed(c, bytes, strlen(bytes));
}

static void fx_turns(fx_t *fx, int n)
{
    char sink[4096];
    for (int i = 0; i < n; i++) {
        uv_run(&fx->loop, UV_RUN_NOWAIT);
        while (read(fx->peer, sink, sizeof(sink)) > 0) {
        }
    }
}

static void fx_finish(fx_t *fx, unsigned refused)
{
    baton_http_server_close(&fx->srv->pub, on_closed);
    for (int i = 0; i < 1000 && !fx->closed; i++)
        fx_turns(fx, 1);
    assert_true(fx->closed);
    assert_int_equal(fx->refused_at_close, refused);
    close(fx->peer);
    assert_int_equal(uv_loop_close(&fx->loop), 0);
}

/* A refused move is counted and leaves the state alone; the moves a connection makes through
 * requests (pipelined, chunked with trailers, kept and finished later) are all legal. */
static void test_moves(void **state)
{
    fx_t fx;
    fx_start(&fx);
    fx.hold = 1;
    fx_feed(&fx, "GET /a HTTP/1.1\r\nHost: x\r\n\r\n"
                 "POST /b HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                 "3\r\nabc\r\n0\r\nX-Trailer: t\r\n\r\n");
    assert_int_equal(fx.requests, 1);
    assert_int_equal(fx.c->state, CS_HANDLER);
    assert_int_equal(fx.srv->state_refused, 0);

    assert_int_equal(baton__hs_set_state(fx.c, CS_HEAD), BATON_EINVAL);
    assert_int_equal(fx.c->state, CS_HANDLER);
    assert_int_equal(fx.srv->state_refused, 1);
    assert_int_equal(baton_phase_refused(), 1); /* the process-wide count of common/phase.h */

    fx.hold = 0;
    assert_int_equal(baton_http_respond(fx.held, 200, NULL, NULL, 0, "{}", 2), 0);
    fx.held = NULL;
    fx_turns(&fx, 4); /* the pipelined request is parsed on a later turn */
    assert_int_equal(fx.requests, 2);
    assert_int_equal(fx.c->state, CS_IDLE);
    assert_int_equal(fx.srv->state_refused, 1); /* nothing but the refused move above */
    fx_finish(&fx, 1);
    assert_int_equal(baton_phase_refused(), 1);
    baton_phase_refused_reset();
}

/* The socket closes under the handler: ABORTED, on_abort on a later turn, then CLOSED. */
static void test_aborted(void **state)
{
    fx_t fx;
    fx_start(&fx);
    fx.hold = 1;
    fx_feed(&fx, "GET /a HTTP/1.1\r\n\r\n");
    assert_int_equal(fx.c->state, CS_HANDLER);
    conn_t *c = fx.c;
    baton__hs_close_hard(c);
    assert_int_equal(c->state, CS_ABORTED);
    assert_int_equal(fx.aborts, 0); /* never inside the call that closed */
    fx_turns(&fx, 2);
    assert_int_equal(fx.aborts, 1);
    assert_null(fx.held);
    fx_finish(&fx, 0);
}

/* A request line over the header limit: LINGER (the 431 answer, then FIN and drain). */
static void test_error_lingers(void **state)
{
    fx_t fx;
    fx_start(&fx);
    fx.srv->limits.max_header_bytes = 64;
    fx_feed(&fx, "GET /aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa");
    assert_int_equal(fx.c->state, CS_LINGER);
    assert_int_equal(fx.requests, 0);
    assert_int_equal(fx.srv->state_refused, 0);
    fx_finish(&fx, 0);
}

int main(void)
{
    baton_log_set_level(BATON_LOG_ERROR);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_table),
        cmocka_unit_test(test_moves),
        cmocka_unit_test(test_aborted),
        cmocka_unit_test(test_error_lingers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
