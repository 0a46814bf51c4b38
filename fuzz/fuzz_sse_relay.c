/* fuzz/fuzz_sse_relay.c — libFuzzer harness for the router's SSE relay (proxy_relay.c) as a
 * worker drives it: a streamed request (regular, or PD with prefill's logprobs merged) whose
 * worker stream arrives in arbitrary chunks, with events left open, past the event cap, and
 * ending cleanly or failing mid-event. Checks what the client receives: finished exactly once,
 * an open event never held past the cap (plus one chunk), and an error event that a WHATWG
 * EventSource parser dispatches as an event of its own, followed by [DONE]. The proxy runs
 * against a fake upstream client (its ops table) and a fake client side (the server's respond
 * and stream calls wrapped at link time, as in tests/unit/router/test_proxy_fsm.c). */
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/log.h"
#include "fuzz_check.h"
#include "router/dataplane/proxy_internal.h"

#define EVENT_CAP 256 /* --max-sse-event-bytes here: small, so the cap is reached */

/* ---- the client side ---- */

typedef struct fake_client_s {
    baton_http_req_t req; /* first: the proxy sees only this */
    int finished, streamed;
    baton_buf_t body;
} fake_client_t;

int __wrap_baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                              const baton_http_header_t *extra, size_t n_extra, const char *body,
                              size_t len);
int __wrap_baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                              const baton_http_header_t *extra, size_t n_extra, const char *body,
                              size_t len)
{
    (void)status, (void)content_type, (void)extra, (void)n_extra, (void)body, (void)len;
    fake_client_t *c = (fake_client_t *)req;
    CHECK(!c->streamed);
    c->finished++;
    return 0;
}

int __wrap_baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                                    const char *type, const char *param, const char *code);
int __wrap_baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                                    const char *type, const char *param, const char *code)
{
    (void)status, (void)message, (void)type, (void)param, (void)code;
    fake_client_t *c = (fake_client_t *)req;
    CHECK(!c->streamed);
    c->finished++;
    return 0;
}

int __wrap_baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                                   const baton_http_header_t *extra, size_t n_extra);
int __wrap_baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                                   const baton_http_header_t *extra, size_t n_extra)
{
    (void)status, (void)content_type, (void)extra, (void)n_extra;
    fake_client_t *c = (fake_client_t *)req;
    CHECK(!c->streamed && !c->finished);
    c->streamed = 1;
    return 0;
}

int __wrap_baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len);
int __wrap_baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len)
{
    fake_client_t *c = (fake_client_t *)req;
    CHECK(c->streamed && !c->finished);
    CHECK(baton_buf_append(&c->body, data, len) == 0);
    return 0;
}

size_t __wrap_baton_http_write_queue_size(const baton_http_req_t *req);
size_t __wrap_baton_http_write_queue_size(const baton_http_req_t *req)
{
    (void)req;
    return 0;
}

int __wrap_baton_http_stream_end(baton_http_req_t *req);
int __wrap_baton_http_stream_end(baton_http_req_t *req)
{
    fake_client_t *c = (fake_client_t *)req;
    CHECK(c->streamed);
    c->finished++;
    return 0;
}

/* ---- the upstream client ---- */

typedef struct fake_up_s {
    baton_http_creq_t pub; /* first: the proxy's handle */
    const baton_http_client_cb_t *cb;
    int port, cancelled, done;
} fake_up_t;

static fake_up_t ups[8];
static int n_ups;

static int fake_pool_create(baton_http_pool_t **pool_p, uv_loop_t *loop, const char *host, int port,
                            unsigned max_idle)
{
    (void)loop, (void)host, (void)max_idle;
    int *p = malloc(sizeof(*p));
    CHECK(p != NULL);
    *p = port;
    *pool_p = (baton_http_pool_t *)p;
    return 0;
}

static void fake_pool_destroy(baton_http_pool_t *pool)
{
    free(pool);
}

static int fake_request(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                        const char *path, const baton_http_header_t *headers, size_t n_headers,
                        const char *body, size_t body_len, const baton_http_timeouts_t *timeouts,
                        const baton_http_client_cb_t *cb, void *data)
{
    (void)method, (void)path, (void)headers, (void)n_headers, (void)body, (void)body_len;
    (void)timeouts;
    CHECK(n_ups < (int)(sizeof(ups) / sizeof(*ups)));
    fake_up_t *u = &ups[n_ups++];
    memset(u, 0, sizeof(*u));
    u->pub.data = data;
    u->cb = cb;
    u->port = *(int *)pool;
    *req_p = &u->pub;
    return 0;
}

static int fake_requestv(baton_http_creq_t **req_p, baton_http_pool_t *pool, const char *method,
                         const char *path, const baton_http_header_t *headers, size_t n_headers,
                         const uv_buf_t *body, unsigned n_body,
                         const baton_http_timeouts_t *timeouts, const baton_http_client_cb_t *cb,
                         void *data)
{
    (void)body, (void)n_body;
    return fake_request(req_p, pool, method, path, headers, n_headers, NULL, 0, timeouts, cb,
                        data);
}

static void fake_pause(baton_http_creq_t *req, int paused)
{
    (void)paused;
    CHECK(!((fake_up_t *)req)->done);
}

static void fake_cancel(baton_http_creq_t *req)
{
    fake_up_t *u = (fake_up_t *)req;
    CHECK(!u->done && !u->cancelled);
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

static fake_up_t *up_on(int port)
{
    for (int i = 0; i < n_ups; i++)
        if (ups[i].port == port)
            return &ups[i];
    return NULL;
}

static void up_head(fake_up_t *u, const char *ctype)
{
    baton_http_header_t h = {"Content-Type", ctype};
    if (!u->done)
        u->cb->on_head(&u->pub, 200, &h, 1);
}

static void up_data(fake_up_t *u, const char *d, size_t n)
{
    if (!u->done && n)
        u->cb->on_data(&u->pub, d, n);
}

static void up_done(fake_up_t *u, int err)
{
    if (u->done)
        return;
    u->done = 1;
    u->cb->on_done(&u->pub, u->cancelled ? BATON_ECANCELED : err);
}

/* ---- two routers: a PD pair, and one regular worker ---- */

static uv_loop_t loop;
static baton_config_t cfg;
static baton_registry_t *reg_pd, *reg_regular;
static baton_policy_t *pol[3];
static baton_router_t router_pd, router_regular;
static baton_proxy_loop_t *pl_pd, *pl_regular;

static void add_worker(baton_registry_t *reg, const char *url, baton_worker_role_t role, int bport)
{
    baton_worker_spec_t s;
    baton_worker_spec_init(&s);
    s.url = url;
    s.role = role;
    s.bootstrap_port = bport;
    CHECK(baton_registry_add(reg, &s, NULL, NULL, 0) == 0);
}

static void router_init(baton_router_t *r, baton_registry_t *reg, baton_proxy_loop_t **pl)
{
    memset(r, 0, sizeof(*r));
    r->cfg = &cfg;
    r->registry = reg;
    r->prefill_policy = pol[0];
    r->decode_policy = pol[1];
    r->regular_policy = pol[2];
    CHECK(baton_proxy_loop_create(pl, &loop, r) == 0);
    baton__proxy_loop_set_client_ops(*pl, &fake_ops);
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc, (void)argv;
    baton_log_set_level(BATON_LOG_ERROR);
    CHECK(uv_loop_init(&loop) == 0);
    CHECK(baton_config_init(&cfg) == 0);
    cfg.max_retries = 0;
    cfg.max_sse_event_bytes = EVENT_CAP;
    CHECK(baton_registry_create(&reg_pd) == 0 && baton_registry_create(&reg_regular) == 0);
    add_worker(reg_pd, "http://127.0.0.1:8001", BATON_ROLE_PREFILL, 7001);
    add_worker(reg_pd, "http://127.0.0.1:9001", BATON_ROLE_DECODE, -1);
    add_worker(reg_regular, "http://127.0.0.1:9501", BATON_ROLE_REGULAR, -1);
    for (int i = 0; i < 3; i++)
        CHECK(baton_policy_create(&pol[i], BATON_POLICY_ROUND_ROBIN) == 0);
    router_init(&router_pd, reg_pd, &pl_pd);
    router_init(&router_regular, reg_regular, &pl_regular);
    return 0;
}

/* ---- what the client saw ---- */

/* The data of the last two events an EventSource dispatches from buf (WHATWG HTML, "event stream
 * interpretation": lines end at CRLF, LF or CR; a blank line dispatches the data lines joined
 * with LF; an event the stream does not end is never dispatched). */
typedef struct whatwg_s {
    baton_buf_t data, last[2];
    int has_data, n;
} whatwg_t;

static void whatwg_line(whatwg_t *w, const char *l, size_t n)
{
    if (n == 0) {
        if (w->has_data) {
            baton_buf_t t = w->last[0];
            w->last[0] = w->last[1];
            w->last[1] = w->data;
            w->data = t;
            w->n++;
        }
        baton_buf_reset(&w->data);
        w->has_data = 0;
        return;
    }
    const char *colon = memchr(l, ':', n);
    size_t name = colon ? (size_t)(colon - l) : n;
    if (name != 4 || memcmp(l, "data", 4) != 0)
        return;
    const char *v = colon ? colon + 1 : l + n;
    if (v < l + n && *v == ' ')
        v++;
    if (w->has_data)
        CHECK(baton_buf_append(&w->data, "\n", 1) == 0);
    CHECK(baton_buf_append(&w->data, v, (size_t)(l + n - v)) == 0);
    w->has_data = 1;
}

static void whatwg_parse(whatwg_t *w, const char *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        size_t j = i;
        while (j < len && s[j] != '\r' && s[j] != '\n')
            j++;
        if (j == len)
            break; /* an unfinished line is never processed */
        whatwg_line(w, s + i, j - i);
        i = j + (s[j] == '\r' && j + 1 < len && s[j + 1] == '\n' ? 2 : 1);
    }
}

static int starts(const baton_buf_t *b, const char *p)
{
    size_t n = strlen(p);
    return b->len >= n && memcmp(b->data, p, n) == 0;
}

static void settle(void)
{
    for (int i = 0; i < n_ups; i++)
        if (ups[i].cancelled)
            up_done(&ups[i], BATON_ECANCELED);
    for (int i = 0; i < 10; i++)
        uv_run(&loop, UV_RUN_NOWAIT);
}

/* Input: flags byte (bit 0: PD with logprobs, else a regular worker; bit 1: the stream fails
 * after its bytes, else it ends cleanly), chunk-size byte, then (PD) prefill's body up to a
 * NUL, then the worker's stream bytes. */
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2)
        return 0;
    int pd = data[0] & 1, fail = (data[0] >> 1) & 1;
    size_t step = (size_t)data[1] + 1;
    const char *in = (const char *)data + 2;
    size -= 2;
    const char *pbody = "", *stream = in;
    size_t plen = 0, slen = size;
    if (pd) {
        const char *sep = memchr(in, '\0', size);
        plen = sep ? (size_t)(sep - in) : size;
        pbody = in;
        stream = sep ? sep + 1 : in + size;
        slen = sep ? size - plen - 1 : 0;
    }

    static const char body[] = "{\"text\":\"hi\",\"stream\":true,\"return_logprob\":true}";
    fake_client_t c;
    memset(&c, 0, sizeof(c));
    c.req.method = "POST";
    c.req.path = "/generate";
    c.req.query = "";
    c.req.body = body;
    c.req.body_len = sizeof(body) - 1;
    c.req.start_ns = uv_hrtime();
    snprintf(c.req.peer, sizeof(c.req.peer), "127.0.0.1:1");
    n_ups = 0;
    baton_proxy_loop_t *pl = pd ? pl_pd : pl_regular;
    baton_proxy_inference(pl, &c.req, BATON_API_GENERATE);

    fake_up_t *p = pd ? up_on(8001) : NULL;
    fake_up_t *d = up_on(pd ? 9001 : 9501);
    CHECK(d != NULL && (!pd || p != NULL));
    up_head(d, "text/event-stream");
    /* Prefill answers half-way through decode's stream (events are held, then merged). */
    size_t half = slen / 2;
    for (size_t off = 0; off < slen; off += step) {
        if (p && off >= half) {
            up_head(p, "application/json");
            up_data(p, pbody, plen);
            up_done(p, 0);
            p = NULL;
        }
        size_t n = slen - off < step ? slen - off : step;
        up_data(d, stream + off, n);
        baton__preq_t *pr = c.req.data;
        if (!c.finished && pr)
            CHECK(baton_sse_pending(&pr->sse) <= EVENT_CAP + step);
    }
    if (p) {
        up_head(p, "application/json");
        up_data(p, pbody, plen);
        up_done(p, 0);
    }
    up_done(d, fail ? UV_ECONNRESET : 0);
    settle();

    CHECK(c.finished == 1);
    whatwg_t w = {BATON_BUF_INIT, {BATON_BUF_INIT, BATON_BUF_INIT}, 0, 0};
    whatwg_parse(&w, c.body.data ? c.body.data : "", c.body.len);
    /* A failure (the worker's, or the event cap: the router closed the leg) reached the client
     * as an event of its own: what the router wrote never ends inside an open event. */
    if (fail || d->cancelled) {
        CHECK(w.n >= 2);
        CHECK(starts(&w.last[0], "{\"error\":"));
        CHECK(w.last[1].len == 6 && memcmp(w.last[1].data, "[DONE]", 6) == 0);
    }
    for (int i = 0; i < 2; i++)
        baton_buf_free(&w.last[i]);
    baton_buf_free(&w.data);
    baton_buf_free(&c.body);
    CHECK(baton_proxy_loop_active(pl) == 0);
    return 0;
}
