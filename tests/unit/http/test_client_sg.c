/* test_client_sg.c — the client's scatter-gather bodies (baton_http_requestv) against the real
 * server, plain and TLS: the bytes the server received are the segments in order. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "baton/error.h"
#include "common/buf.h"
#include "http/client.h"
#include "http/server.h"
#include "http/tls.h"

#include "tls_test_pki.h"

#define MAX_SEGS 12
#define BIG_LEN  (100 * 1024) /* past the TLS layer's 4 KiB staging and one 64 KiB read */
/* Past what a loopback socket takes at once: the client queues the rest of a partial write. */
#define HUGE_LEN (8 * 1024 * 1024)

/* Stands for the huge segment in a case's list of texts. */
static const char HUGE_SEG[] = "huge";

/* One request to send: its segments, and what the server must have received. */
typedef struct sg_case_s {
    uv_buf_t segs[MAX_SEGS];
    unsigned n;
    baton_buf_t want;
} sg_case_t;

typedef struct sgfx_s {
    uv_loop_t loop;
    uv_timer_t guard;
    baton_http_server_t *srv;
    baton_http_pool_t *pool;
    baton_tls_t *st, *ct;
    sg_case_t cases[5];
    int n_cases;
    int next;
    int done_ok;
    int in_api;
    int cb_in_api;
    char *big;
    char *huge;
    baton_buf_t got; /* the echoed body of the request in flight */
    char got_len_hdr[32];
} sgfx_t;

/* The server answers with the body it parsed and the length it counted. */
static void echo_handler(baton_http_req_t *req, void *ctx)
{
    char len[32];
    snprintf(len, sizeof(len), "%zu", req->body_len);
    baton_http_header_t extra[] = {{"X-Body-Len", len}};
    assert_int_equal(baton_http_respond(req, 200, "application/octet-stream", extra, 1, req->body,
                                        req->body_len),
                     0);
}

static void on_guard(uv_timer_t *t)
{
    fail_msg("test did not finish within 10 s");
}

static void start_next(sgfx_t *fx);

static void c_on_head(baton_http_creq_t *req, int status, const baton_http_header_t *h, size_t n)
{
    sgfx_t *fx = req->data;
    fx->cb_in_api += fx->in_api;
    assert_int_equal(status, 200);
    for (size_t i = 0; i < n; i++)
        if (strcasecmp(h[i].name, "x-body-len") == 0)
            snprintf(fx->got_len_hdr, sizeof(fx->got_len_hdr), "%s", h[i].value);
}

static void c_on_data(baton_http_creq_t *req, const char *data, size_t len)
{
    sgfx_t *fx = req->data;
    fx->cb_in_api += fx->in_api;
    assert_int_equal(baton_buf_append(&fx->got, data, len), 0);
}

static void c_on_done(baton_http_creq_t *req, int err)
{
    sgfx_t *fx = req->data;
    fx->cb_in_api += fx->in_api;
    assert_int_equal(err, 0);
    sg_case_t *c = &fx->cases[fx->next - 1];
    char want_len[32];
    snprintf(want_len, sizeof(want_len), "%zu", c->want.len);
    assert_string_equal(fx->got_len_hdr, want_len);
    assert_int_equal(fx->got.len, c->want.len);
    assert_memory_equal(fx->got.data, c->want.data, c->want.len);
    fx->done_ok++;
    baton_buf_reset(&fx->got);
    fx->got_len_hdr[0] = '\0';
    if (fx->next < fx->n_cases) {
        start_next(fx);
        return;
    }
    baton_http_pool_destroy(fx->pool);
    baton_http_server_close(fx->srv, NULL);
    uv_close((uv_handle_t *)&fx->guard, NULL);
}

static void start_next(sgfx_t *fx)
{
    static const baton_http_client_cb_t cb = {c_on_head, c_on_data, c_on_done};
    sg_case_t *c = &fx->cases[fx->next++];
    baton_http_creq_t *req;
    /* The segment array is a local copy: the client must not keep a pointer to it. */
    uv_buf_t segs[MAX_SEGS];
    memcpy(segs, c->segs, sizeof(segs));
    fx->in_api = 1;
    int rc =
        baton_http_requestv(&req, fx->pool, "POST", "/echo", NULL, 0, segs, c->n, NULL, &cb, fx);
    fx->in_api = 0;
    memset(segs, 0xA5, sizeof(segs));
    assert_int_equal(rc, 0);
}

static void add_case(sgfx_t *fx, const char *const *texts, unsigned n)
{
    sg_case_t *c = &fx->cases[fx->n_cases++];
    c->want = (baton_buf_t)BATON_BUF_INIT;
    for (unsigned i = 0; i < n; i++) {
        /* NULL: the big segment, HUGE_SEG: the huge one */
        const char *t = !texts[i] ? fx->big : texts[i] == HUGE_SEG ? fx->huge : texts[i];
        size_t len = !texts[i] ? BIG_LEN : texts[i] == HUGE_SEG ? HUGE_LEN : strlen(t);
        c->segs[i] = uv_buf_init((char *)t, (unsigned)len);
        assert_int_equal(baton_buf_append(&c->want, t, len), 0);
    }
    c->n = n;
}

static void run_cases(int tls)
{
    sgfx_t *fx = calloc(1, sizeof(*fx));
    assert_non_null(fx);
    fx->big = malloc(BIG_LEN);
    assert_non_null(fx->big);
    for (size_t i = 0; i < BIG_LEN; i++)
        fx->big[i] = (char)('a' + (i * 7) % 26);
    fx->huge = malloc(HUGE_LEN);
    assert_non_null(fx->huge);
    for (size_t i = 0; i < HUGE_LEN; i++)
        fx->huge[i] = (char)('A' + (i * 11) % 26);

    static const char *one[] = {"{\"model\":\"m\",\"prompt\":\"hi\"}"};
    static const char *two[] = {"{\"model\":\"m\",\"prompt\":\"hi\"", ",\"bootstrap_room\":42}"};
    /* More than the client keeps inline and than libuv's small write array, an empty segment,
     * and a segment far larger than one TLS record. */
    static const char *many[] = {
        "{", "\"a\":1,", "", "\"b\":\"", NULL, "\",", "\"c\":[1,2,3]", ",\"d\":", "true", "", "}"};
    static const char *big_only[] = {NULL};
    static const char *huge[] = {"[", HUGE_SEG, "]"};
    add_case(fx, one, 1);
    add_case(fx, two, 2);
    add_case(fx, many, sizeof(many) / sizeof(many[0]));
    add_case(fx, big_only, 1);
    add_case(fx, huge, 3);

    assert_int_equal(uv_loop_init(&fx->loop), 0);
    uv_timer_init(&fx->loop, &fx->guard);
    uv_timer_start(&fx->guard, on_guard, 10000, 0);
    assert_int_equal(baton_http_server_create(&fx->srv, &fx->loop, NULL, echo_handler, fx), 0);
    char err[256] = "";
    if (tls) {
        baton_tls_opts_t so = {path("srv.pem"), path("srv.key"), NULL};
        baton_tls_opts_t co = {NULL, NULL, path("ca.pem")};
        if (baton_tls_create(&fx->st, BATON_TLS_SERVER, &so, err, sizeof(err)) != 0 ||
            baton_tls_create(&fx->ct, BATON_TLS_CLIENT, &co, err, sizeof(err)) != 0)
            fail_msg("baton_tls_create: %s", err);
        baton_http_server_set_tls(fx->srv, fx->st);
    }
    assert_int_equal(baton_http_server_listen(fx->srv, "127.0.0.1", 0, 0), 0);
    assert_int_equal(baton_http_pool_create(&fx->pool, &fx->loop, "127.0.0.1",
                                            baton_http_server_port(fx->srv), 4),
                     0);
    if (tls)
        baton_http_pool_set_tls(fx->pool, fx->ct);
    start_next(fx);
    uv_run(&fx->loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&fx->loop), 0); /* nothing left open */

    assert_int_equal(fx->done_ok, fx->n_cases);
    assert_int_equal(fx->cb_in_api, 0);
    for (int i = 0; i < fx->n_cases; i++)
        baton_buf_free(&fx->cases[i].want);
    baton_buf_free(&fx->got);
    baton_tls_destroy(fx->st);
    baton_tls_destroy(fx->ct);
    free(fx->big);
    free(fx->huge);
    free(fx);
}

static void test_segments_plain(void **state)
{
    run_cases(0);
}

static void test_segments_tls(void **state)
{
    run_cases(1);
}

static void never_cb(baton_http_creq_t *req, int err)
{
    fail_msg("no callback may run for a refused request");
}

static void test_segments_bad_args(void **state)
{
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    baton_http_pool_t *pool;
    assert_int_equal(baton_http_pool_create(&pool, &loop, "127.0.0.1", 9, 1), 0);
    static const baton_http_client_cb_t cb = {NULL, NULL, never_cb};
    baton_http_creq_t *req;
    uv_buf_t bad[2] = {uv_buf_init("x", 1), {.base = NULL, .len = 3}};
    assert_int_equal(baton_http_requestv(&req, pool, "POST", "/", NULL, 0, bad, 2, NULL, &cb, NULL),
                     BATON_EINVAL);
    assert_int_equal(
        baton_http_requestv(&req, pool, "POST", "/", NULL, 0, NULL, 1, NULL, &cb, NULL),
        BATON_EINVAL);
    baton_http_pool_destroy(pool);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_segments_plain),
        cmocka_unit_test(test_segments_tls),
        cmocka_unit_test(test_segments_bad_args),
    };
    return cmocka_run_group_tests(tests, setup_pki, teardown_pki);
}
