/* test_proxy_fsm.c — the proxy's request state machine against a fake upstream client (its ops
 * table) and a fake client side (the server's respond/stream calls wrapped at link time): PD
 * happy paths, prefill/decode failures before and after the stream, client disconnects in each
 * phase, retry with a new pair and room, queue timeout, and the transition table. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/buf.h"
#include "router/dataplane/proxy_internal.h"

/* ---------------------------------------------------------------------------------------- */
/* The client side: baton_http_respond*, baton_http_stream_* are wrapped (-Wl,--wrap=...)     */

typedef struct fake_client_s {
    baton_http_req_t req; /* first: the proxy sees only this */
    int status;           /* of the response or of the stream's head; 0 before */
    int finished;         /* calls that finished the request (must end at 1) */
    int streamed;
    char code[64]; /* the error code of respond_error */
    baton_buf_t body;
    size_t queue; /* what baton_http_write_queue_size reports (back-pressure) */
} fake_client_t;

static fake_client_t *fc(baton_http_req_t *req)
{
    return (fake_client_t *)req;
}

int __wrap_baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                              const baton_http_header_t *extra, size_t n_extra, const char *body,
                              size_t len);
int __wrap_baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                              const baton_http_header_t *extra, size_t n_extra, const char *body,
                              size_t len)
{
    (void)content_type, (void)extra, (void)n_extra;
    fake_client_t *c = fc(req);
    c->status = status;
    c->finished++;
    baton_buf_append(&c->body, body, len);
    return 0;
}

int __wrap_baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                                    const char *type, const char *param, const char *code);
int __wrap_baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                                    const char *type, const char *param, const char *code)
{
    (void)type, (void)param;
    fake_client_t *c = fc(req);
    c->status = status;
    c->finished++;
    snprintf(c->code, sizeof(c->code), "%s", code ? code : "");
    baton_buf_append(&c->body, message, strlen(message));
    return 0;
}

int __wrap_baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                                   const baton_http_header_t *extra, size_t n_extra);
int __wrap_baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                                   const baton_http_header_t *extra, size_t n_extra)
{
    (void)extra, (void)n_extra;
    assert_string_equal(content_type, "text/event-stream");
    fake_client_t *c = fc(req);
    assert_int_equal(c->streamed, 0);
    c->status = status;
    c->streamed = 1;
    return 0;
}

int __wrap_baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len);
int __wrap_baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len)
{
    fake_client_t *c = fc(req);
    assert_int_equal(c->streamed, 1);
    assert_int_equal(c->finished, 0);
    baton_buf_append(&c->body, data, len);
    return 0;
}

size_t __wrap_baton_http_write_queue_size(const baton_http_req_t *req);
size_t __wrap_baton_http_write_queue_size(const baton_http_req_t *req)
{
    return ((const fake_client_t *)req)->queue;
}

int __wrap_baton_http_stream_end(baton_http_req_t *req);
int __wrap_baton_http_stream_end(baton_http_req_t *req)
{
    fake_client_t *c = fc(req);
    assert_int_equal(c->streamed, 1);
    c->finished++;
    return 0;
}

/* ---------------------------------------------------------------------------------------- */
/* The fake upstream client: records requests, the test injects their events                */

typedef struct fake_pool_s {
    int port;
} fake_pool_t;

#define MAX_UP 16

typedef struct fake_up_s {
    baton_http_creq_t pub; /* first: the proxy's handle */
    const baton_http_client_cb_t *cb;
    int port;
    char method[8];
    char path[128];
    char *body; /* a copy, to inspect */
    int cancelled, paused, done;
} fake_up_t;

static fake_up_t ups[MAX_UP];
static int n_ups;
static int pools_alive;

static int fake_pool_create(baton_http_pool_t **pool_p, uv_loop_t *loop, const char *host, int port,
                            unsigned max_idle)
{
    (void)loop, (void)max_idle;
    assert_string_equal(host, "127.0.0.1");
    fake_pool_t *p = calloc(1, sizeof(*p));
    p->port = port;
    pools_alive++;
    *pool_p = (baton_http_pool_t *)p;
    return 0;
}

static void fake_pool_destroy(baton_http_pool_t *pool)
{
    pools_alive--;
    free(pool);
}

static int fake_request(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                        const char *path, const baton_http_header_t *headers, size_t n_headers,
                        const char *body, size_t body_len, const baton_http_timeouts_t *timeouts,
                        const baton_http_client_cb_t *cb, void *data)
{
    (void)headers, (void)n_headers, (void)timeouts;
    assert_true(n_ups < MAX_UP);
    fake_up_t *u = &ups[n_ups++];
    memset(u, 0, sizeof(*u));
    u->pub.data = data;
    u->cb = cb;
    u->port = ((fake_pool_t *)pool)->port;
    snprintf(u->method, sizeof(u->method), "%s", method);
    snprintf(u->path, sizeof(u->path), "%s", path);
    u->body = body ? strndup(body, body_len) : NULL;
    *req_p = &u->pub;
    return 0;
}

/* The proxy sends through the scatter-gather entry point: the fake keeps the joined body. */
static int fake_requestv(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                         const char *path, const baton_http_header_t *headers, size_t n_headers,
                         const uv_buf_t *body, unsigned n_body,
                         const baton_http_timeouts_t *timeouts, const baton_http_client_cb_t *cb,
                         void *data)
{
    baton_buf_t joined = BATON_BUF_INIT;
    for (unsigned i = 0; i < n_body; i++)
        assert_int_equal(baton_buf_append(&joined, body[i].base, body[i].len), 0);
    int rc = fake_request(req_p, pool, method, path, headers, n_headers,
                          n_body ? (joined.data ? joined.data : "") : NULL, joined.len, timeouts,
                          cb, data);
    baton_buf_free(&joined);
    return rc;
}

static void fake_pause(baton_http_creq_t *req, int paused)
{
    fake_up_t *u = (fake_up_t *)req;
    assert_false(u->done);
    u->paused = paused;
}

/* The real client reports the cancel on a later loop turn: flush() delivers it. */
static void fake_cancel(baton_http_creq_t *req)
{
    fake_up_t *u = (fake_up_t *)req;
    assert_false(u->done);
    assert_false(u->cancelled); /* the proxy cancels once */
    u->cancelled = 1;
}

static const baton_http_client_ops_t fake_ops = {
    .pool_create = fake_pool_create,
    .pool_destroy = fake_pool_destroy,
    .request = fake_request,
    .requestv = fake_requestv,
    .pause = fake_pause,
    .cancel = fake_cancel,
};

static void up_head(int i, int status, const char *ctype)
{
    fake_up_t *u = &ups[i];
    assert_false(u->done);
    baton_http_header_t h = {"Content-Type", ctype};
    u->cb->on_head(&u->pub, status, &h, 1);
}

static void up_data(int i, const char *s)
{
    fake_up_t *u = &ups[i];
    assert_false(u->done);
    u->cb->on_data(&u->pub, s, strlen(s));
}

static void up_done(int i, int err)
{
    fake_up_t *u = &ups[i];
    assert_false(u->done);
    u->done = 1;
    u->cb->on_done(&u->pub, err);
}

/* A whole upstream answer. */
static void up_answer(int i, int status, const char *ctype, const char *body)
{
    up_head(i, status, ctype);
    if (body)
        up_data(i, body);
    up_done(i, 0);
}

/* Delivers on_done(ECANCELED) for every cancelled request, as the real client's next turn. */
static void flush_cancels(void)
{
    for (int i = 0; i < n_ups; i++)
        if (ups[i].cancelled && !ups[i].done)
            up_done(i, BATON_ECANCELED);
}

/* ---------------------------------------------------------------------------------------- */
/* Fixture: two prefills (8001, 8002; bootstrap 7001, 7002), two decodes (9001, 9002)        */

static uv_loop_t loop;
static baton_config_t cfg;
static baton_registry_t *reg;
static baton_policy_t *pol[3];
static baton_router_t router;
static baton_proxy_loop_t *pl;

static int setup(void **state)
{
    (void)state;
    assert_int_equal(uv_loop_init(&loop), 0);
    assert_int_equal(baton_config_init(&cfg), 0);
    cfg.max_retries = 0;
    cfg.retry_backoff_ms = 1;
    cfg.retry_backoff_max_ms = 1;
    cfg.queue_timeout_ms = 20;
    assert_int_equal(baton_registry_create(&reg), 0);
    static const struct {
        const char *url;
        baton_worker_role_t role;
        int bport;
    } ws[] = {{"http://127.0.0.1:8001", BATON_ROLE_PREFILL, 7001},
              {"http://127.0.0.1:8002", BATON_ROLE_PREFILL, 7002},
              {"http://127.0.0.1:9001", BATON_ROLE_DECODE, -1},
              {"http://127.0.0.1:9002", BATON_ROLE_DECODE, -1}};
    for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++) {
        baton_worker_spec_t s;
        baton_worker_spec_init(&s);
        s.url = ws[i].url;
        s.role = ws[i].role;
        s.bootstrap_port = ws[i].bport;
        baton_worker_t *w;
        assert_int_equal(baton_registry_add(reg, &s, &w, NULL, 0), 0);
        baton_worker_unref(w);
    }
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_policy_create(&pol[i], BATON_POLICY_ROUND_ROBIN), 0);
    memset(&router, 0, sizeof(router));
    router.cfg = &cfg;
    router.registry = reg;
    router.prefill_policy = pol[0];
    router.decode_policy = pol[1];
    router.regular_policy = pol[2];
    assert_int_equal(baton_proxy_loop_create(&pl, &loop, &router), 0);
    baton__proxy_loop_set_client_ops(pl, &fake_ops);
    n_ups = 0;
    return 0;
}

/* Runs the loop's pending work (timers closing) without blocking. */
static void spin(void)
{
    for (int i = 0; i < 10; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
}

static int teardown(void **state)
{
    (void)state;
    flush_cancels();
    spin();
    /* every request finished and freed, no transition refused */
    assert_int_equal(baton_proxy_loop_active(pl), 0);
    assert_int_equal(pl->phase_refused, 0);
    baton_proxy_loop_destroy(pl);
    spin();
    assert_int_equal(pools_alive, 0);
    assert_int_equal(uv_loop_close(&loop), 0); /* no handle left open */
    for (int i = 0; i < n_ups; i++)
        free(ups[i].body);
    for (int i = 0; i < 3; i++)
        baton_policy_destroy(pol[i]);
    baton_registry_destroy(reg);
    baton_config_free(&cfg);
    return 0;
}

static void client_init(fake_client_t *c, const char *body)
{
    memset(c, 0, sizeof(*c));
    c->req.method = "POST";
    c->req.path = "/v1/chat/completions";
    c->req.query = "";
    c->req.body = body;
    c->req.body_len = strlen(body);
    c->req.start_ns = uv_hrtime();
    snprintf(c->req.peer, sizeof(c->req.peer), "127.0.0.1:1");
}

static void chat(fake_client_t *c, const char *body)
{
    client_init(c, body);
    baton_proxy_inference(pl, &c->req, BATON_API_CHAT);
}

static void generate(fake_client_t *c, const char *body)
{
    client_init(c, body);
    c->req.path = "/generate";
    baton_proxy_inference(pl, &c->req, BATON_API_GENERATE);
}

static baton__preq_t *preq(fake_client_t *c)
{
    return c->req.data;
}

static void client_done(fake_client_t *c)
{
    baton_buf_free(&c->body);
}

/* The client received exactly `want`. */
static void assert_client_body(const fake_client_t *c, const char *want)
{
    assert_int_equal(c->body.len, strlen(want));
    assert_memory_equal(c->body.data, want, c->body.len);
}

/* The bootstrap fields the proxy injected into an upstream body. */
static void injected(int i, int *bport, uint64_t *room)
{
    json_t *j = json_loads(ups[i].body, 0, NULL);
    assert_non_null(j);
    assert_string_equal(json_string_value(json_object_get(j, "bootstrap_host")), "127.0.0.1");
    *bport = (int)json_integer_value(json_object_get(j, "bootstrap_port"));
    *room = (uint64_t)json_integer_value(json_object_get(j, "bootstrap_room"));
    json_decref(j);
}

static const char *const CHAT =
    "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
static const char *const CHAT_STREAM =
    "{\"model\":\"m\",\"stream\":true,\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}";
static const char *const GEN_LP = "{\"text\":\"hi\",\"return_logprob\":true}";
static const char *const GEN_LP_STREAM =
    "{\"text\":\"hi\",\"return_logprob\":true,\"stream\":true}";
static const char *const PREFILL_LP = "{\"text\":\"\",\"meta_info\":{\"input_token_logprobs\":"
                                      "[[-1,1,null],[-0.5,2,null]]}}";
static const char *const JSON = "application/json";
static const char *const SSE = "text/event-stream";

/* ---------------------------------------------------------------------------------------- */
/* Happy paths                                                                              */

static void test_pd_nonstream(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT);
    /* one body, sent to prefill then decode at once, same path, same bytes */
    assert_int_equal(n_ups, 2);
    assert_int_equal(ups[0].port, 8001);
    assert_int_equal(ups[1].port, 9001);
    assert_string_equal(ups[0].method, "POST");
    assert_string_equal(ups[1].path, "/v1/chat/completions");
    assert_string_equal(ups[0].body, ups[1].body);
    int bport;
    uint64_t room;
    injected(0, &bport, &room);
    assert_int_equal(bport, 7001);
    assert_int_equal(preq(&c)->phase, PH_SENT);

    up_answer(1, 200, JSON, "{\"choices\":[1]}");
    /* decode's answer goes out at once (no logprobs to wait for) */
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 200);
    assert_client_body(&c, "{\"choices\":[1]}");
    assert_int_equal(baton_proxy_loop_active(pl), 1); /* prefill still read to the end */
    up_answer(0, 200, JSON, "{}");
    assert_false(ups[0].cancelled || ups[1].cancelled);
    spin();
    assert_int_equal(baton_proxy_loop_active(pl), 0);
    assert_int_equal(c.finished, 1);
    client_done(&c);
}

static void test_pd_nonstream_logprobs_wait_prefill(void **state)
{
    (void)state;
    fake_client_t c;
    generate(&c, GEN_LP);
    assert_int_equal(n_ups, 2);
    up_answer(1, 200, JSON,
              "{\"text\":\"out\",\"meta_info\":{\"input_token_logprobs\":[[-0.25,3,null]]}}");
    /* decode first: the answer waits for prefill's logprobs */
    assert_int_equal(c.finished, 0);
    assert_int_equal(preq(&c)->phase, PH_WAIT_PREFILL);
    up_answer(0, 200, JSON, PREFILL_LP);
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 200);
    json_t *j = json_loadb(c.body.data, c.body.len, 0, NULL);
    json_t *a = json_object_get(json_object_get(j, "meta_info"), "input_token_logprobs");
    assert_int_equal(json_array_size(a), 3); /* prefill's two in front of decode's one */
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 0), 1)), 1);
    assert_int_equal(json_integer_value(json_array_get(json_array_get(a, 2), 1)), 3);
    json_decref(j);
    client_done(&c);
}

static void test_pd_stream(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT_STREAM);
    up_head(1, 200, SSE);
    assert_int_equal(c.streamed, 1);
    assert_int_equal(c.status, 200);
    assert_int_equal(preq(&c)->phase, PH_STREAMING);
    up_data(1, "data: {\"a\":1}\n\n");
    /* back-pressure: the client's queue over the watermark pauses decode, a drain resumes */
    c.queue = BATON_PROXY_STREAM_HIGH_WATER + 1;
    up_data(1, "data: {\"a\":2}\n\n");
    assert_int_equal(ups[1].paused, 1);
    c.queue = 0;
    c.req.on_drain(&c.req);
    assert_int_equal(ups[1].paused, 0);
    up_data(1, "data: [DONE]\n\n");
    up_answer(0, 200, JSON, "{}");
    assert_int_equal(c.finished, 0); /* prefill's end does not end the stream */
    up_done(1, 0);
    assert_int_equal(c.finished, 1);
    assert_client_body(&c, "data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: [DONE]\n\n");
    client_done(&c);
}

/* Decode's event that carries input logprobs waits (decode paused) for prefill's; decode ends
 * while it is held: the stream ends once prefill's logprobs released it, merged. */
static void test_pd_stream_logprobs_held(void **state)
{
    (void)state;
    fake_client_t c;
    generate(&c, GEN_LP_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[[-3,3,null]]}}\n\n");
    assert_int_equal(preq(&c)->phase, PH_HOLDING);
    assert_int_equal(ups[1].paused, 1);
    assert_int_equal(c.body.len, 0);
    up_data(1, "data: [DONE]\n\n");
    up_done(1, 0);
    assert_int_equal(preq(&c)->phase, PH_HELD_END);
    assert_int_equal(c.finished, 0);
    up_answer(0, 200, JSON, PREFILL_LP);
    assert_int_equal(c.finished, 1);
    /* the held event went out merged (prefill's token ids 1, 2 before decode's 3), then [DONE] */
    const char *ev = c.body.data;
    assert_non_null(memmem(ev, c.body.len, "[[-1,1,null],[-0.5,2,null],[-3,3,null]]", 39));
    assert_non_null(memmem(ev, c.body.len, "data: [DONE]\n\n", 14));
    client_done(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* Failures                                                                                 */

static void test_prefill_fails_before_decode_streams(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT_STREAM);
    up_done(0, BATON_EEOF);                /* prefill closed before answering */
    assert_int_equal(ups[1].cancelled, 1); /* decode would wait for a KV that never comes */
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.streamed, 0);
    assert_int_equal(c.status, 502);
    assert_string_equal(c.code, "prefill_failed");
    flush_cancels();
    client_done(&c);
}

static void test_prefill_refuses_before_decode_streams(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT);
    up_head(0, 400, JSON); /* prefill refuses: decode is cancelled at once */
    assert_int_equal(ups[1].cancelled, 1);
    up_data(0, "{\"error\":\"bad\"}");
    up_done(0, 0);
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 400);
    assert_string_equal(c.code, "prefill_error");
    client_done(&c);
}

static void test_prefill_fails_after_decode_streams(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"a\":1}\n\n");
    up_done(0, BATON_EEOF); /* decode has its KV: its answer stays */
    assert_false(ups[1].cancelled);
    assert_int_equal(c.finished, 0);
    up_data(1, "data: [DONE]\n\n");
    up_done(1, 0);
    assert_int_equal(c.finished, 1);
    assert_client_body(&c, "data: {\"a\":1}\n\ndata: [DONE]\n\n");
    client_done(&c);
}

static void test_prefill_fails_after_stream_logprobs(void **state)
{
    (void)state;
    fake_client_t c;
    generate(&c, GEN_LP_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[]}}\n\n");
    assert_int_equal(preq(&c)->phase, PH_HOLDING);
    up_done(0, BATON_EEOF); /* the logprobs asked for will not come: the stream fails */
    assert_int_equal(ups[1].cancelled, 1);
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 200);
    assert_non_null(memmem(c.body.data, c.body.len, "prefill_failed", 14));
    assert_non_null(memmem(c.body.data, c.body.len, "data: [DONE]", 12));
    client_done(&c);
}

static void test_decode_fails_status_passed(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT);
    up_head(1, 500, JSON);
    assert_int_equal(ups[0].cancelled, 1); /* decode's error decides: prefill is closed */
    up_data(1, "{\"error\":\"oom\"}");
    up_done(1, 0);
    /* no retry left: decode's own answer goes to the client as it came */
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 500);
    assert_client_body(&c, "{\"error\":\"oom\"}");
    client_done(&c);
}

static void test_decode_fails_while_streaming(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"a\":1}\n\n");
    up_done(1, BATON_EEOF);
    assert_int_equal(ups[0].cancelled, 1);
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 200);
    assert_int_equal(memcmp(c.body.data, "data: {\"a\":1}\n\n", 15), 0);
    assert_non_null(memmem(c.body.data, c.body.len, "decode_failed", 13));
    assert_non_null(memmem(c.body.data, c.body.len, "data: [DONE]", 12));
    client_done(&c);
}

/* ---------------------------------------------------------------------------------------- */
/* The client goes away                                                                     */

/* Aborts in phase `ph`: every upstream of the request still in flight (from ups[first_up] on)
 * is cancelled at once; the client request is finished exactly once, after their reports. */
static void abort_and_check(fake_client_t *c, baton__proxy_phase_t ph, int first_up)
{
    assert_int_equal(preq(c)->phase, ph);
    int in_flight = 0;
    for (int i = first_up; i < n_ups; i++)
        in_flight += !ups[i].done;
    c->req.on_abort(&c->req);
    for (int i = first_up; i < n_ups; i++)
        assert_true(ups[i].cancelled || ups[i].done);
    if (in_flight) {
        assert_int_equal(preq(c)->phase, PH_ABORTED);
        assert_int_equal(c->finished, 0); /* waits for the cancels to be reported */
    }
    flush_cancels();
    assert_int_equal(c->finished, 1);
    if (!c->streamed) {
        assert_int_equal(c->status, 499);
        assert_string_equal(c->code, "client_closed");
    }
    client_done(c);
}

static void test_abort_sent(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT);
    abort_and_check(&c, PH_SENT, 0);
}

static void test_abort_wait_prefill(void **state)
{
    (void)state;
    fake_client_t c;
    generate(&c, GEN_LP);
    up_answer(1, 200, JSON, "{\"text\":\"x\"}");
    abort_and_check(&c, PH_WAIT_PREFILL, 0);
    assert_int_equal(ups[0].cancelled, 1);
}

static void test_abort_streaming(void **state)
{
    (void)state;
    fake_client_t c;
    chat(&c, CHAT_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"a\":1}\n\n");
    abort_and_check(&c, PH_STREAMING, 0);
    assert_int_equal(ups[0].cancelled && ups[1].cancelled, 1);
}

static void test_abort_holding(void **state)
{
    (void)state;
    fake_client_t c;
    generate(&c, GEN_LP_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[]}}\n\n");
    abort_and_check(&c, PH_HOLDING, 0);
    assert_int_equal(c.body.len, 0); /* the held event never went out */
}

static void test_abort_held_end(void **state)
{
    (void)state;
    fake_client_t c;
    generate(&c, GEN_LP_STREAM);
    up_head(1, 200, SSE);
    up_data(1, "data: {\"text\":\"a\",\"meta_info\":{\"input_token_logprobs\":[]}}\n\n");
    up_done(1, 0);
    abort_and_check(&c, PH_HELD_END, 0);
    assert_int_equal(ups[0].cancelled, 1); /* prefill's logprobs are not needed any more */
    assert_int_equal(c.body.len, 0);
}

static void test_abort_retry_wait(void **state)
{
    (void)state;
    cfg.max_retries = 1;
    cfg.retry_backoff_ms = 10000; /* the loop does not run: the back-off cannot end */
    cfg.retry_backoff_max_ms = 10000;
    fake_client_t c;
    chat(&c, CHAT);
    up_done(0, BATON_ECONNECT);
    assert_int_equal(preq(&c)->phase, PH_RETRY_WAIT);
    flush_cancels(); /* the abandoned decode reports */
    abort_and_check(&c, PH_RETRY_WAIT, n_ups);
    assert_int_equal(n_ups, 2); /* no new attempt after the client left */
}

static void test_abort_queued(void **state)
{
    (void)state;
    assert_int_equal(baton_admission_create(&router.admission, 1, 4), 0);
    cfg.queue_timeout_ms = 60000;
    fake_client_t a, b;
    chat(&a, CHAT);
    chat(&b, CHAT);
    assert_int_equal(n_ups, 2); /* only a was dispatched */
    assert_int_equal(baton_admission_queued(router.admission), 1);
    abort_and_check(&b, PH_QUEUED, n_ups);
    assert_int_equal(baton_admission_queued(router.admission), 0);
    up_answer(1, 200, JSON, "{}");
    up_answer(0, 200, JSON, "{}");
    assert_int_equal(a.status, 200);
    client_done(&a);
    spin();
    baton_admission_destroy(router.admission);
    router.admission = NULL;
}

/* ---------------------------------------------------------------------------------------- */
/* Retry and queue                                                                          */

/* Runs the loop (timers) until *counter reaches n, a bounded number of turns. */
static void run_until(const int *counter, int n)
{
    for (int i = 0; i < 1000 && *counter < n; i++)
        uv_run(&loop, UV_RUN_ONCE);
}

static void test_retry_new_pair_new_room(void **state)
{
    (void)state;
    cfg.max_retries = 1;
    fake_client_t c, other;
    chat(&c, CHAT);     /* P1 + D1 */
    chat(&other, CHAT); /* P2 + D2: round robin points at P1 + D1 again */
    assert_int_equal(n_ups, 4);
    int bport0, bport1;
    uint64_t room0, room1;
    injected(0, &bport0, &room0);
    up_done(0, BATON_ECONNECT); /* retriable, nothing reached the client */
    assert_int_equal(ups[1].cancelled, 1);
    assert_false(ups[2].cancelled || ups[3].cancelled); /* the other request is untouched */
    assert_int_equal(c.finished, 0);
    assert_int_equal(preq(&c)->phase, PH_RETRY_WAIT);
    flush_cancels();
    run_until(&n_ups, 6);
    assert_int_equal(n_ups, 6);
    /* the failed attempt's workers are avoided (round robin alone would pick them): the other
     * pair, with a fresh room */
    assert_int_equal(ups[4].port, 8002);
    assert_int_equal(ups[5].port, 9002);
    injected(4, &bport1, &room1);
    assert_int_equal(bport0, 7001);
    assert_int_equal(bport1, 7002);
    assert_true(room0 != room1);
    assert_string_equal(ups[4].body, ups[5].body);
    assert_int_equal(preq(&c)->phase, PH_SENT);
    up_answer(5, 200, JSON, "{\"ok\":2}");
    up_answer(4, 200, JSON, "{}");
    assert_int_equal(c.finished, 1);
    assert_int_equal(c.status, 200);
    assert_client_body(&c, "{\"ok\":2}");
    up_answer(3, 200, JSON, "{\"ok\":3}");
    up_answer(2, 200, JSON, "{}");
    assert_int_equal(other.status, 200);
    client_done(&c);
    client_done(&other);
}

/* Decode's retriable status: a retry is planned; when it finds no pair (every prefill gone),
 * the client gets the last attempt's answer — decode's own status and body. */
static void test_retry_finds_no_pair(void **state)
{
    (void)state;
    cfg.max_retries = 1;
    fake_client_t c;
    chat(&c, CHAT);
    up_head(1, 503, JSON);
    assert_int_equal(ups[0].cancelled, 1);
    up_data(1, "{\"error\":\"busy\"}");
    up_done(1, 0);
    assert_int_equal(preq(&c)->phase, PH_RETRY_WAIT);
    assert_int_equal(c.finished, 0);
    assert_int_equal(baton_registry_remove_url(reg, "http://127.0.0.1:8001"), 0);
    assert_int_equal(baton_registry_remove_url(reg, "http://127.0.0.1:8002"), 0);
    flush_cancels();
    run_until(&c.finished, 1);
    assert_int_equal(c.finished, 1);
    assert_int_equal(n_ups, 2); /* no new attempt */
    assert_int_equal(c.status, 503);
    assert_client_body(&c, "{\"error\":\"busy\"}");
    client_done(&c);
}

static void test_no_retry_after_stream_started(void **state)
{
    (void)state;
    cfg.max_retries = 3;
    fake_client_t c;
    chat(&c, CHAT_STREAM);
    up_head(1, 200, SSE);
    up_done(1, BATON_EEOF); /* retriable by its kind, but the client has bytes already */
    assert_int_equal(c.finished, 1);
    assert_non_null(memmem(c.body.data, c.body.len, "decode_failed", 13));
    flush_cancels();
    spin();
    assert_int_equal(n_ups, 2);
    client_done(&c);
}

static void test_queue_timeout(void **state)
{
    (void)state;
    assert_int_equal(baton_admission_create(&router.admission, 1, 4), 0);
    assert_int_equal(baton_proxy_loop_start(pl), 0);
    fake_client_t a, b;
    chat(&a, CHAT);
    chat(&b, CHAT);
    assert_int_equal(n_ups, 2);
    assert_int_equal(preq(&b)->phase, PH_QUEUED);
    run_until(&b.finished, 1);
    assert_int_equal(b.finished, 1);
    assert_int_equal(b.status, 503);
    assert_string_equal(b.code, "queue_timeout");
    assert_int_equal(n_ups, 2); /* b never reached a worker */
    up_answer(1, 200, JSON, "{}");
    up_answer(0, 200, JSON, "{}");
    assert_int_equal(a.status, 200);
    client_done(&a);
    client_done(&b);
    spin();
    assert_int_equal(baton_admission_active(router.admission), 0);
    flush_cancels();
    spin();
    assert_int_equal(baton_proxy_loop_active(pl), 0);
    baton_proxy_loop_destroy(pl);
    spin();
    baton_admission_destroy(router.admission);
    router.admission = NULL;
    /* teardown's destroy is for a loop that was not started: a fresh one */
    assert_int_equal(baton_proxy_loop_create(&pl, &loop, &router), 0);
    baton__proxy_loop_set_client_ops(pl, &fake_ops);
}

/* ---------------------------------------------------------------------------------------- */
/* The transition table                                                                     */

static void test_transition_table(void **state)
{
    (void)state;
    for (int p = 0; p < PH_COUNT; p++) {
        assert_false(baton__proxy_phase_allowed(p, p)); /* no self transition */
        assert_false(baton__proxy_phase_allowed(PH_DONE, p));
        assert_false(baton__proxy_phase_allowed(p, PH_COUNT));
        assert_string_not_equal(baton__proxy_phase_name(p), "invalid");
        if (p != PH_DONE)
            assert_true(baton__proxy_phase_allowed(p, PH_DONE) || p == PH_QUEUED);
    }
    assert_true(baton__proxy_phase_allowed(PH_NEW, PH_QUEUED));
    assert_true(baton__proxy_phase_allowed(PH_QUEUED, PH_NEW));
    assert_false(baton__proxy_phase_allowed(PH_QUEUED, PH_SENT)); /* leaves through NEW */
    assert_true(baton__proxy_phase_allowed(PH_SENT, PH_RETRY_WAIT));
    assert_true(baton__proxy_phase_allowed(PH_WAIT_PREFILL, PH_RETRY_WAIT));
    /* once the client has bytes, only a migration (the stream goes on elsewhere), and never
     * while events wait for prefill's logprobs (those streams are not migrated) */
    assert_true(baton__proxy_phase_allowed(PH_STREAMING, PH_RETRY_WAIT));
    assert_false(baton__proxy_phase_allowed(PH_HOLDING, PH_RETRY_WAIT));
    assert_false(baton__proxy_phase_allowed(PH_HELD_END, PH_HOLDING));
    assert_false(baton__proxy_phase_allowed(PH_ABORTED, PH_FAIL_DEFERRED));
    assert_true(baton__proxy_phase_allowed(PH_FAIL_DEFERRED, PH_ABORTED));
    assert_false(baton__proxy_phase_allowed(PH_RETRY_WAIT, PH_STREAMING));

    /* a live request refuses an illegal move and keeps its phase */
    fake_client_t c;
    chat(&c, CHAT);
    baton__preq_t *pr = preq(&c);
    assert_int_equal(baton__pr_set_phase(pr, PH_QUEUED, "test"), BATON_EINVAL);
    assert_int_equal(baton__pr_set_phase(pr, PH_HELD_END, "test"), BATON_EINVAL);
    /* DONE only with the client request finished */
    assert_int_equal(baton__pr_set_phase(pr, PH_DONE, "test"), BATON_EINVAL);
    assert_int_equal(pr->phase, PH_SENT);
    assert_int_equal(pl->phase_refused, 3);
    pl->phase_refused = 0; /* teardown checks the rest of the run */
    up_answer(1, 200, JSON, "{}");
    up_answer(0, 200, JSON, "{}");
    assert_int_equal(c.status, 200);
    client_done(&c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_pd_nonstream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pd_nonstream_logprobs_wait_prefill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pd_stream, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pd_stream_logprobs_held, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefill_fails_before_decode_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefill_refuses_before_decode_streams, setup,
                                        teardown),
        cmocka_unit_test_setup_teardown(test_prefill_fails_after_decode_streams, setup, teardown),
        cmocka_unit_test_setup_teardown(test_prefill_fails_after_stream_logprobs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_fails_status_passed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_fails_while_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_sent, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_wait_prefill, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_streaming, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_holding, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_held_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_retry_wait, setup, teardown),
        cmocka_unit_test_setup_teardown(test_abort_queued, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_new_pair_new_room, setup, teardown),
        cmocka_unit_test_setup_teardown(test_retry_finds_no_pair, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_retry_after_stream_started, setup, teardown),
        cmocka_unit_test_setup_teardown(test_queue_timeout, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transition_table, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
