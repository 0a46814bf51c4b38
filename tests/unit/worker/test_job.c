/* test_job.c — a generation request's life cycle (src/worker/job.c, job_pd.c) against a fake
 * HTTP response sink: the job and sequence phase tables, full and streamed answers with their
 * exact text, refusals, client aborts, and the PD life cycle between a real prefill and decode
 * worker on one loop (loopback tcp), including the rendezvous deadline. The sink replaces
 * http/server.h's response calls at link time (-Wl,--wrap), so no socket carries the answers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../phase_checks.h"

#include "baton/error.h"
#include "common/buf.h"
#include "loop_test.h"
#include "worker/job.h"

/* ---- the fake response sink --------------------------------------------------------------- */

typedef struct sink_s {
    baton_http_req_t req;
    char body_in[1024];
    int status;
    char content_type[64];
    baton_buf_t out; /* the body, or the stream's chunks one after the other */
    int n_chunks;
    int streamed;
    int finished; /* calls that finish the request: exactly one is allowed */
    char code[64];
    char message[512];
} sink_t;

static sink_t *sink_of(baton_http_req_t *req)
{
    return container_of(req, sink_t, req);
}

static void finish(sink_t *k)
{
    k->finished++;
}

int __wrap_baton_http_respond(baton_http_req_t *req, int status, const char *content_type,
                              const baton_http_header_t *extra, size_t n_extra, const char *body,
                              size_t body_len)
{
    sink_t *k = sink_of(req);
    (void)extra;
    (void)n_extra;
    k->status = status;
    snprintf(k->content_type, sizeof(k->content_type), "%s", content_type ? content_type : "");
    baton_buf_append(&k->out, body, body_len);
    finish(k);
    return 0;
}

int __wrap_baton_http_respond_error(baton_http_req_t *req, int status, const char *message,
                                    const char *type, const char *param, const char *code)
{
    sink_t *k = sink_of(req);
    (void)type;
    (void)param;
    k->status = status;
    snprintf(k->code, sizeof(k->code), "%s", code ? code : "");
    snprintf(k->message, sizeof(k->message), "%s", message);
    finish(k);
    return 0;
}

int __wrap_baton_http_stream_start(baton_http_req_t *req, int status, const char *content_type,
                                   const baton_http_header_t *extra, size_t n_extra)
{
    sink_t *k = sink_of(req);
    (void)extra;
    (void)n_extra;
    assert_int_equal(k->streamed, 0);
    k->streamed = 1;
    k->status = status;
    snprintf(k->content_type, sizeof(k->content_type), "%s", content_type);
    return 0;
}

int __wrap_baton_http_stream_write(baton_http_req_t *req, const char *data, size_t len)
{
    sink_t *k = sink_of(req);
    assert_int_equal(k->streamed, 1);
    assert_int_equal(k->finished, 0);
    baton_buf_append(&k->out, data, len);
    k->n_chunks++;
    return 0;
}

int __wrap_baton_http_stream_end(baton_http_req_t *req)
{
    sink_t *k = sink_of(req);
    assert_int_equal(k->streamed, 1);
    finish(k);
    return 0;
}

static sink_t *sink_new(const char *path, const char *body)
{
    sink_t *k = calloc(1, sizeof(*k));
    assert_non_null(k);
    snprintf(k->body_in, sizeof(k->body_in), "%s", body);
    k->req.method = "POST";
    k->req.path = path;
    k->req.query = "";
    k->req.body = k->body_in;
    k->req.body_len = strlen(k->body_in);
    baton_buf_append(&k->out, "", 0);
    return k;
}

/* The body as a string (the buffer is terminated for strstr). */
static const char *sink_text(sink_t *k)
{
    baton_buf_append(&k->out, "", 1);
    k->out.len--;
    return k->out.data;
}

static void sink_free(sink_t *k)
{
    baton_buf_free(&k->out);
    free(k);
}

/* ---- workers on one loop ------------------------------------------------------------------ */

static uv_loop_t loop;
static uv_timer_t keepalive;
static int closed;

#define RUN_UNTIL(cond) LOOP_RUN_UNTIL(&loop, cond)

static void loop_up(void)
{
    closed = 0;
    assert_int_equal(uv_loop_init(&loop), 0);
    loop_test_keepalive(&loop, &keepalive);
}

static wk_config_t fast_cfg(wk_mode_t mode)
{
    wk_config_t c;
    wk_config_default(&c);
    c.mode = mode;
    c.bootstrap_port = 0;
    c.prefill_us_per_token = 10;
    c.decode_us_per_token = 200;
    c.kv_pool_tokens = 4096;
    c.transports[0] = BATON_XFER_TRANSPORT_TCP;
    c.n_transports = 1;
    c.bootstrap_timeout_ms = 20000;
    return c;
}

static void worker_up(wk_worker_t *w, const wk_config_t *cfg)
{
    assert_int_equal(wk_worker_init(w, &loop, cfg), 0);
}

static void on_closed(wk_worker_t *w)
{
    (void)w;
    closed++;
}

static void loop_down(wk_worker_t **ws, int n)
{
    for (int i = 0; i < n; i++) {
        assert_int_equal(ws[i]->n_jobs, 0);
        assert_int_equal(ws[i]->n_kv_waiting, 0);
        assert_int_equal(ws[i]->n_boot_pub, 0);
        ws[i]->on_closed = on_closed;
        wk_worker_close(ws[i]);
    }
    RUN_UNTIL(closed == n);
    uv_close((uv_handle_t *)&keepalive, NULL);
    uv_run(&loop, UV_RUN_DEFAULT);
    assert_int_equal(uv_loop_close(&loop), 0); /* nothing of the workers left on the loop */
}

/* KV page slots in use (the gauge, synced first). */
static double used_slots(wk_worker_t *w)
{
    wk_kv_metrics_sync(w->kv);
    return loop_test_metric(w->metrics, "baton_kv_pool_slots{state=\"used\"}");
}

static wk_job_t *submit(wk_worker_t *w, sink_t *k, wk_api_t api)
{
    wk_job_handle(w, &k->req, api);
    return k->finished ? NULL : k->req.data;
}

/* ---- the phase tables --------------------------------------------------------------------- */

static void test_phase_tables(void **state)
{
    (void)state;
    const wk_phase_table_t *j = &wk_job_phases, *s = &wk_seq_phases;
    /* the three modes' paths */
    assert_true(wk_phase_legal(j, WK_JOB_NEW, WK_JOB_RUNNING));
    assert_true(wk_phase_legal(j, WK_JOB_NEW, WK_JOB_MATCHING));
    assert_true(wk_phase_legal(j, WK_JOB_MATCHING, WK_JOB_PAGES));
    assert_true(wk_phase_legal(j, WK_JOB_PAGES, WK_JOB_RUNNING));
    assert_true(wk_phase_legal(j, WK_JOB_NEW, WK_JOB_PAGES));
    assert_true(wk_phase_legal(j, WK_JOB_PAGES, WK_JOB_RECEIVING));
    assert_true(wk_phase_legal(j, WK_JOB_RECEIVING, WK_JOB_RUNNING));
    assert_true(wk_phase_legal(j, WK_JOB_RUNNING, WK_JOB_DONE));
    /* every live phase may fail or lose its client; the ends are final */
    for (unsigned p = WK_JOB_NEW; p <= WK_JOB_RUNNING; p++) {
        assert_true(wk_phase_legal(j, p, WK_JOB_FAILED));
        assert_true(wk_phase_legal(j, p, WK_JOB_ABORTED));
    }
    for (unsigned to = 0; to < WK_JOB_N_PHASES; to++) {
        assert_false(wk_phase_legal(j, WK_JOB_DONE, to));
        assert_false(wk_phase_legal(j, WK_JOB_FAILED, to));
        assert_false(wk_phase_legal(j, WK_JOB_ABORTED, to));
    }
    /* no answer before running; a prefill never receives, a decode never matches */
    assert_false(wk_phase_legal(j, WK_JOB_RECEIVING, WK_JOB_DONE));
    assert_false(wk_phase_legal(j, WK_JOB_MATCHING, WK_JOB_RUNNING));
    assert_false(wk_phase_legal(j, WK_JOB_MATCHING, WK_JOB_RECEIVING));
    assert_false(wk_phase_legal(j, WK_JOB_RUNNING, WK_JOB_PAGES));

    assert_true(wk_phase_legal(s, WK_SS_KV_WAIT, WK_SS_MATCHED));
    assert_true(wk_phase_legal(s, WK_SS_RUNNING, WK_SS_HANDOFF));
    assert_true(wk_phase_legal(s, WK_SS_HANDOFF, WK_SS_DONE));
    assert_true(wk_phase_legal(s, WK_SS_KV_IN, WK_SS_DONE));
    assert_false(wk_phase_legal(s, WK_SS_KV_WAIT, WK_SS_RUNNING)); /* not before its room */
    assert_false(wk_phase_legal(s, WK_SS_DONE, WK_SS_GONE));
    assert_false(wk_phase_legal(s, WK_SS_MATCHED, WK_SS_DONE));
}

/* The one mover refuses an illegal move, leaves the phase, and keeps the gauges exact. */
static void test_movers(void **state)
{
    (void)state;
    wk_worker_t w;
    memset(&w, 0, sizeof(w));
    wk_job_t job;
    memset(&job, 0, sizeof(job));
    job.w = &w;
    baton_list_init(&job.dl_link);
    wk_sstate_t ss;
    memset(&ss, 0, sizeof(ss));
    ss.job = &job;
    assert_int_equal(wk_job_to(&job, WK_JOB_DONE), BATON_EINVAL);
    assert_int_equal(job.phase, WK_JOB_NEW);
    assert_int_equal(wk_seq_to(&ss, WK_SS_KV_WAIT), 0);
    assert_int_equal(w.n_kv_waiting, 1);
    assert_int_equal(wk_seq_to(&ss, WK_SS_MATCHED), 0);
    assert_int_equal(w.n_kv_waiting, 1); /* still waiting for its compute */
    assert_int_equal(wk_seq_to(&ss, WK_SS_HANDOFF), BATON_EINVAL);
    assert_int_equal(ss.phase, WK_SS_MATCHED);
    assert_int_equal(wk_seq_to(&ss, WK_SS_RUNNING), 0);
    assert_int_equal(w.n_kv_waiting, 0);
    assert_int_equal(wk_seq_to(&ss, WK_SS_HANDOFF), 0);
    assert_int_equal(w.n_boot_pub, 1);
    assert_int_equal(wk_seq_to(&ss, WK_SS_GONE), 0);
    assert_int_equal(w.n_boot_pub, 0);
    assert_int_equal(w.n_kv_waiting, 0);
}

/* ---- regular mode ------------------------------------------------------------------------- */

static void test_generate_full(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t w;
    wk_config_t cfg = fast_cfg(WK_MODE_REGULAR);
    worker_up(&w, &cfg);
    sink_t *k = sink_new("/generate",
                         "{\"text\":\"hello world\",\"sampling_params\":{\"max_new_tokens\":8}}");
    wk_job_t *job = submit(&w, k, WK_API_GENERATE);
    assert_non_null(job);
    assert_int_equal(job->phase, WK_JOB_RUNNING);
    assert_int_equal(job->ss[0].phase, WK_SS_RUNNING);
    assert_int_equal(w.n_jobs, 1);
    assert_int_equal(k->finished, 0); /* never answered inside the call */
    RUN_UNTIL(k->finished);
    assert_int_equal(k->finished, 1);
    assert_int_equal(k->status, 200);
    assert_string_equal(k->content_type, "application/json");
    assert_non_null(strstr(sink_text(k), "\"text\":\"route ten to was data fast wind eight\""));
    assert_non_null(strstr(sink_text(k), "\"completion_tokens\":8"));
    assert_int_equal(w.n_jobs, 0);
    assert_int_equal(
        loop_test_metric(w.metrics,
                         "baton_worker_requests_total{route=\"generate\",status=\"200\"}"),
        1);
    assert_int_equal(loop_test_metric(w.metrics, "baton_worker_generation_tokens_total"), 8);
    sink_free(k);
    wk_worker_t *ws[] = {&w};
    loop_down(ws, 1);
}

static void test_chat_stream(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t w;
    wk_config_t cfg = fast_cfg(WK_MODE_REGULAR);
    worker_up(&w, &cfg);
    sink_t *k = sink_new("/v1/chat/completions",
                         "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":"
                         "\"Hello!\"}],\"max_tokens\":6,\"stream\":true}");
    assert_non_null(submit(&w, k, WK_API_CHAT));
    RUN_UNTIL(k->finished);
    assert_int_equal(k->finished, 1);
    assert_int_equal(k->streamed, 1);
    assert_int_equal(k->status, 200);
    assert_string_equal(k->content_type, "text/event-stream");
    assert_true(k->n_chunks >= 2);
    /* "not the time red one was", one word at a time, in order, then the end */
    const char *text = sink_text(k);
    static const char *const words[] = {"\"not\"",  "\" the\"", "\" time\"",
                                        "\" red\"", "\" one\"", "\" was\""};
    const char *at = text;
    for (size_t i = 0; i < 6; i++) {
        at = strstr(at, words[i]);
        assert_non_null(at);
    }
    assert_non_null(strstr(at, "\"finish_reason\":\"length\""));
    size_t n = strlen(text);
    assert_true(n > 14);
    assert_string_equal(text + n - 14, "data: [DONE]\n\n");
    assert_int_equal(
        loop_test_metric(w.metrics, "baton_worker_requests_total{route=\"chat\",status=\"200\"}"),
        1);
    sink_free(k);
    wk_worker_t *ws[] = {&w};
    loop_down(ws, 1);
}

static void test_refusals(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t w;
    wk_config_t cfg = fast_cfg(WK_MODE_REGULAR);
    cfg.max_queue = 1;
    worker_up(&w, &cfg);
    /* a bad body never becomes a job */
    sink_t *bad =
        sink_new("/generate", "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":-2}}");
    assert_null(submit(&w, bad, WK_API_GENERATE));
    assert_int_equal(bad->status, 400);
    assert_int_equal(bad->finished, 1);
    assert_int_equal(w.n_jobs, 0);
    /* the first waits in the queue (the scheduler runs on a later turn); the second overflows */
    sink_t *a =
        sink_new("/generate", "{\"text\":\"a\",\"sampling_params\":{\"max_new_tokens\":2}}");
    sink_t *b =
        sink_new("/generate", "{\"text\":\"b\",\"sampling_params\":{\"max_new_tokens\":2}}");
    assert_non_null(submit(&w, a, WK_API_GENERATE));
    assert_null(submit(&w, b, WK_API_GENERATE));
    assert_int_equal(b->status, 503);
    assert_string_equal(b->code, "queue_full");
    RUN_UNTIL(a->finished);
    assert_int_equal(a->status, 200);
    assert_int_equal(
        loop_test_metric(w.metrics,
                         "baton_worker_requests_total{route=\"generate\",status=\"503\"}"),
        1);
    assert_int_equal(
        loop_test_metric(w.metrics,
                         "baton_worker_requests_total{route=\"generate\",status=\"400\"}"),
        1);
    sink_free(bad);
    sink_free(a);
    sink_free(b);
    wk_worker_t *ws[] = {&w};
    loop_down(ws, 1);
}

/* The client leaves mid-stream: the stream ends at once, the sequence leaves the scheduler. */
static void test_client_abort(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t w;
    wk_config_t cfg = fast_cfg(WK_MODE_REGULAR);
    worker_up(&w, &cfg);
    sink_t *k = sink_new("/generate", "{\"text\":\"long\",\"sampling_params\":{\"max_new_tokens\":"
                                      "100000},\"stream\":true}");
    sink_t *q = sink_new("/generate", "{\"text\":\"quiet\",\"sampling_params\":{\"max_new_tokens\":"
                                      "100000}}");
    assert_non_null(submit(&w, k, WK_API_GENERATE));
    assert_non_null(submit(&w, q, WK_API_GENERATE));
    RUN_UNTIL(k->n_chunks >= 3 && wk_sched_running(&w.sched) == 2);
    k->req.on_abort(&k->req);
    assert_int_equal(k->finished, 1); /* the stream was ended, no error status after it */
    assert_int_equal(w.n_jobs, 1);
    q->req.on_abort(&q->req);
    assert_int_equal(q->finished, 1);
    assert_int_equal(q->status, 499);
    assert_string_equal(q->code, "client_closed");
    assert_int_equal(w.n_jobs, 0);
    /* the decode step in progress ends without them, and no step follows */
    RUN_UNTIL(!wk_sched_busy(&w.sched));
    assert_int_equal(wk_sched_running(&w.sched) + wk_sched_waiting(&w.sched), 0);
    assert_int_equal(
        loop_test_metric(w.metrics,
                         "baton_worker_requests_total{route=\"generate\",status=\"aborted\"}"),
        2);
    sink_free(k);
    sink_free(q);
    wk_worker_t *ws[] = {&w};
    loop_down(ws, 1);
}

/* ---- PD: a prefill and a decode worker on one loop ---------------------------------------- */

static void pd_body(char *out, size_t cap, wk_worker_t *p, uint64_t room, int stream)
{
    snprintf(out, cap,
             "{\"text\":\"hello world\",\"sampling_params\":{\"max_new_tokens\":8},"
             "\"stream\":%s,\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,"
             "\"bootstrap_room\":%llu}",
             stream ? "true" : "false", wk_kv_listen_port(p->kv), (unsigned long long)room);
}

static void test_pd(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t p, d;
    wk_config_t pc = fast_cfg(WK_MODE_PREFILL), dc = fast_cfg(WK_MODE_DECODE);
    worker_up(&p, &pc);
    worker_up(&d, &dc);
    char body[512];
    pd_body(body, sizeof(body), &p, 123456789, 0);
    sink_t *pk = sink_new("/generate", body), *dk = sink_new("/generate", body);
    wk_job_t *pj = submit(&p, pk, WK_API_GENERATE);
    wk_job_t *dj = submit(&d, dk, WK_API_GENERATE);
    assert_non_null(pj);
    assert_non_null(dj);
    assert_int_equal(pj->phase, WK_JOB_MATCHING);
    assert_int_equal(pj->ss[0].phase, WK_SS_KV_WAIT);
    assert_int_equal(dj->phase, WK_JOB_RECEIVING); /* its pages were free at once */
    assert_int_equal(p.n_kv_waiting, 1);
    assert_int_equal(d.n_kv_waiting, 1);
    RUN_UNTIL(pk->finished && dk->finished);
    assert_int_equal(pk->status, 200);
    assert_int_equal(dk->status, 200);
    /* the prefill answers its first token only; the decode the whole text, as a regular worker */
    assert_non_null(strstr(sink_text(pk), "\"text\":\"route\""));
    assert_non_null(strstr(sink_text(dk), "\"text\":\"route ten to was data fast wind eight\""));
    assert_int_equal(loop_test_metric(p.metrics, "baton_kv_rooms_total{result=\"ok\"}"), 1);
    assert_int_equal(loop_test_metric(d.metrics, "baton_kv_rooms_total{result=\"ok\"}"), 1);
    RUN_UNTIL(used_slots(&p) == 0 && used_slots(&d) == 0);
    sink_free(pk);
    sink_free(dk);
    wk_worker_t *ws[] = {&p, &d};
    loop_down(ws, 2);
}

/* The decode's prefill never gets the request: the deadline answers 504 and frees the pages. */
static void test_pd_deadline(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t p, d;
    wk_config_t pc = fast_cfg(WK_MODE_PREFILL), dc = fast_cfg(WK_MODE_DECODE);
    dc.bootstrap_timeout_ms = 100;
    worker_up(&p, &pc);
    worker_up(&d, &dc);
    char body[512];
    pd_body(body, sizeof(body), &p, 5, 1);
    sink_t *dk = sink_new("/generate", body);
    wk_job_t *dj = submit(&d, dk, WK_API_GENERATE);
    assert_non_null(dj);
    RUN_UNTIL(dk->finished);
    assert_int_equal(dk->status, 504);
    assert_int_equal(dk->streamed, 0); /* nothing was streamed yet: a status, not an SSE error */
    assert_string_equal(dk->code, "bootstrap_timeout");
    assert_non_null(strstr(dk->message, "decode: no rendezvous within 100 ms"));
    assert_int_equal(d.n_jobs, 0);
    assert_int_equal(
        loop_test_metric(d.metrics, "baton_kv_room_failures_total{reason=\"timeout\"}"), 1);
    /* the prefill side learns of the abort: its waiting offer becomes a tombstone, so the late
     * prefill request fails at once (409/502), not after its own deadline */
    RUN_UNTIL(loop_test_metric(p.metrics, "baton_kv_room_failures_total{reason=\"aborted\"}") == 1);
    sink_t *pk = sink_new("/generate", body);
    assert_null(submit(&p, pk, WK_API_GENERATE));
    assert_int_equal(pk->finished, 1);
    assert_int_equal(pk->status, 502);
    assert_string_equal(pk->code, "bootstrap_aborted");
    RUN_UNTIL(used_slots(&d) == 0); /* the decode's pages came back after the abort */
    sink_free(dk);
    sink_free(pk);
    wk_worker_t *ws[] = {&p, &d};
    loop_down(ws, 2);
}

/* The decode's page pool: a prompt bigger than the pool is refused at once; a job that does not
 * fit now waits in PAGES (the deadline not yet due) and moves on when the pages come back. */
static void test_pd_pages(void **state)
{
    (void)state;
    loop_up();
    wk_worker_t p, d;
    wk_config_t pc = fast_cfg(WK_MODE_PREFILL), dc = fast_cfg(WK_MODE_DECODE);
    dc.kv_pool_tokens = 4 * 16; /* 4 slots of the tiny preset's 16-token pages */
    worker_up(&p, &pc);
    worker_up(&d, &dc);
    char body[1024], words[400];
    size_t n = 0;
    for (int i = 0; i < 60; i++) /* 60 words: 4 pages a layer, the whole pool */
        n += (size_t)snprintf(words + n, sizeof(words) - n, "w%d ", i);
    snprintf(body, sizeof(body),
             "{\"text\":\"%s\",\"sampling_params\":{\"max_new_tokens\":2},"
             "\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,\"bootstrap_room\":1}",
             words, wk_kv_listen_port(p.kv));
    sink_t *a = sink_new("/generate", body);
    wk_job_t *aj = submit(&d, a, WK_API_GENERATE);
    assert_non_null(aj);
    assert_int_equal(aj->phase, WK_JOB_RECEIVING); /* it took every slot */
    /* the same prompt twice in one request needs 8 slots: never */
    char big[1100];
    snprintf(big, sizeof(big),
             "{\"text\":[\"%s\",\"%s\"],\"sampling_params\":{\"max_new_tokens\":2},"
             "\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,"
             "\"bootstrap_room\":[2,3]}",
             words, words, wk_kv_listen_port(p.kv));
    sink_t *tb = sink_new("/generate", big);
    assert_null(submit(&d, tb, WK_API_GENERATE));
    assert_int_equal(tb->status, 503);
    assert_string_equal(tb->code, "kv_pool_exhausted");
    assert_non_null(strstr(tb->message, "needs 8 KV page slots, more than the whole pool (4)"));
    /* a second one fits the pool but not now: it waits for pages */
    snprintf(body, sizeof(body),
             "{\"text\":\"short\",\"sampling_params\":{\"max_new_tokens\":2},"
             "\"bootstrap_host\":\"127.0.0.1\",\"bootstrap_port\":%d,\"bootstrap_room\":4}",
             wk_kv_listen_port(p.kv));
    sink_t *b = sink_new("/generate", body);
    wk_job_t *bj = submit(&d, b, WK_API_GENERATE);
    assert_non_null(bj);
    assert_int_equal(bj->phase, WK_JOB_PAGES);
    assert_int_equal(d.n_kv_waiting, 2);
    /* the first one's client leaves: its room is aborted, its pages come back once the
     * offer is over, and the waiting job gets them and offers its room */
    a->req.on_abort(&a->req);
    assert_int_equal(a->status, 499);
    RUN_UNTIL(bj->phase == WK_JOB_RECEIVING);
    assert_int_equal(b->finished, 0);
    b->req.on_abort(&b->req);
    RUN_UNTIL(used_slots(&d) == 0);
    sink_free(a);
    sink_free(tb);
    sink_free(b);
    wk_worker_t *ws[] = {&p, &d};
    loop_down(ws, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phase_tables),
        cmocka_unit_test(test_movers),
        cmocka_unit_test(test_refused_count_starts),
        cmocka_unit_test(test_generate_full),
        cmocka_unit_test(test_chat_stream),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_client_abort),
        cmocka_unit_test(test_pd),
        cmocka_unit_test(test_pd_deadline),
        cmocka_unit_test(test_pd_pages),
        cmocka_unit_test(test_no_refused_phase_moves),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
