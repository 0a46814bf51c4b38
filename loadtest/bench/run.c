/* run.c — baton-bench's load engine: keep-alive HTTP/1.1 connections on one libuv loop, the
 * closed- and open-loop schedulers, multi-turn sessions and per-request measurement. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <llhttp.h>
#include <uv.h>

#include "http/tls.h"
#include "baton/error.h"
#include "common/list.h"
#include "bench.h"

/*
 * Everything runs on one loop thread. The bench is its own HTTP client rather than the
 * router's upstream client library, so that a bug or a cost in the code under test cannot
 * hide in the instrument that measures it.
 *
 * Timestamps are uv_hrtime() taken once per read, before parsing: a chunk's arrival time is
 * the time its bytes were read, whatever the parsing costs afterwards.
 */

typedef struct run_s run_t;
typedef struct conn_s conn_t;
typedef struct req_s req_t;
typedef struct session_s session_t;

typedef struct turn_s {
    baton_buf_t user_own; /* a random prompt; dataset prompts are borrowed */
    const char *user;
    size_t user_len;
    uint32_t user_words;
    baton_buf_t assistant; /* the reply, once the turn is done */
} turn_t;

struct session_s {
    run_t *run;
    turn_t *turns; /* multi_turn of them */
    unsigned n;    /* turns asked so far */
    uint32_t history_words;
    char user[32];    /* the session key sent as "user" (multi-turn) */
    unsigned group;   /* which shared prefix */
    uint64_t t_sched; /* open loop: the arrival time of a session still waiting to start */
    session_t *next_pending;
    session_t *next_thinking; /* in run's thinking FIFO (t_sched: when it wakes) */
};

struct req_s {
    run_t *run;
    session_t *sess;
    conn_t *conn;
    baton_list_t link; /* in run->inflight while in flight */
    int refs;          /* in flight + writes pending: freed at 0 */
    baton_buf_t head, body;
    uint64_t t_sched, t_start, deadline;
    uint32_t input_tokens;
    int measured;
    int in_flight;
    int retried;
    int status;
    size_t resp_bytes;
    baton_buf_t errbody;
    bb_resp_t resp;
};

struct conn_s {
    uv_tcp_t tcp;
    uv_connect_t creq;
    baton_tls_conn_t *tls; /* https:// only */
    llhttp_t parser;
    run_t *run;
    req_t *req;
    baton_list_t idle_link; /* in run->idle while idle */
    int idle;
    int reused;
    int closing;
    int msg_done;
    uint64_t t_read;
};

struct run_s {
    const bb_config_t *cfg;
    bb_results_t *res;
    uv_loop_t loop;
    uv_timer_t arrival_timer, tick_timer;
    uv_signal_t sigint;
    llhttp_settings_t settings;
    baton_tls_t *tls; /* https:// only */
    struct sockaddr_storage addr;
    char path[600];
    char host_hdr[300];
    bb_body_opts_t body_opts;

    baton_list_t idle; /* of conn_t.idle_link, most recently used first */
    unsigned n_conns;
    baton_list_t inflight; /* of req_t.link, newest first */
    unsigned n_inflight;
    session_t *pending_head, *pending_tail;
    uint64_t n_pending;

    bb_rng_t rng;
    session_t *think_head, *think_tail; /* --think-time: sessions between turns, FIFO (one
                                         * think time for all, so wake order = arrival order) */
    unsigned n_thinking;
    baton_buf_t *shared; /* --shared-prefix: the n_shared shared prompts */
    unsigned n_shared;
    uint64_t sessions_started;
    bb_arrival_t arrival;
    int open_loop;
    int arrivals_stopped;
    uint64_t t0, t_measure, t_end, next_arrival, last_done, last_progress;
    uint64_t issued_measured, issued_total;
    struct rusage ru_start;
    int ru_taken;
    int stopping, finished;
    int progress_dirty;
    char readbuf[65536];
};

static void start_session(run_t *run, uint64_t t_sched);
static void session_end(run_t *run, session_t *s);
static void wake_thinkers(run_t *run, uint64_t now);
static void session_free(session_t *s);
static void send_turn(session_t *s, uint64_t t_sched);
static void dispatch(req_t *req, int fresh_conn);
static void check_done(run_t *run);

/* ---- results ---- */

static void take_rusage_start(run_t *run)
{
    if (!run->ru_taken) {
        getrusage(RUSAGE_SELF, &run->ru_start);
        run->ru_taken = 1;
    }
}

static double tv_s(struct timeval tv)
{
    return (double)tv.tv_sec + (double)tv.tv_usec / 1e6;
}

static void note_error(run_t *run, bb_err_kind_t kind, int status, const char *msg)
{
    bb_results_t *res = run->res;
    res->failed++;
    res->errors[kind]++;
    if (kind == BB_ERR_HTTP && status > 0 && status < 600)
        res->http_status[status]++;
    if (!res->first_error[kind][0])
        snprintf(res->first_error[kind], sizeof(res->first_error[kind]), "%s",
                 msg && *msg ? msg : bb_err_kind_name(kind));
}

static void record(run_t *run, req_t *req, bb_err_kind_t err, const char *msg, uint64_t t_done)
{
    const bb_config_t *cfg = run->cfg;
    bb_results_t *res = run->res;
    if (err == BB_ERR_CANCELED)
        return;
    if (!req->measured) {
        res->warmup_requests++;
        return;
    }
    if (err != BB_ERR_NONE) {
        note_error(run, err, req->status, msg);
        return;
    }
    double e2e = (double)(t_done - req->t_start) / 1e6;
    double ttft = (double)(req->resp.t_first - req->t_start) / 1e6;
    uint32_t out = bb_resp_output_tokens(&req->resp);
    double tpot = 0;
    int oom = bb_vec_push(&res->e2e_ms, e2e) || bb_vec_push(&res->ttft_ms, ttft);
    if (cfg->stream && out > 1) {
        tpot = (e2e - ttft) / (double)(out - 1);
        oom = oom || bb_vec_push(&res->tpot_ms, tpot);
    }
    for (size_t i = 0; i < req->resp.itl_ms.n && !oom; i++)
        oom = bb_vec_push(&res->itl_ms, req->resp.itl_ms.v[i]);
    if (oom) {
        note_error(run, BB_ERR_BAD_RESPONSE, 0, "bench out of memory recording samples");
        return;
    }
    res->completed++;
    res->total_input_tokens += req->input_tokens;
    if (req->resp.usage_prompt >= 0 && req->resp.usage_cached >= 0) {
        res->usage_prompt_tokens += (uint64_t)req->resp.usage_prompt;
        res->cached_tokens += (uint64_t)req->resp.usage_cached;
    }
    res->total_output_tokens += out;
    if ((!cfg->slo_ttft_ms || ttft <= cfg->slo_ttft_ms) &&
        (!cfg->slo_tpot_ms || tpot <= cfg->slo_tpot_ms) &&
        (!cfg->slo_e2e_ms || e2e <= cfg->slo_e2e_ms))
        res->good++;
    if (t_done > run->last_done)
        run->last_done = t_done;
}

/* ---- requests ---- */

static void req_unref(req_t *req)
{
    if (--req->refs > 0)
        return;
    baton_buf_free(&req->head);
    baton_buf_free(&req->body);
    baton_buf_free(&req->errbody);
    bb_resp_free(&req->resp);
    free(req);
}

/* May issue one more request at t? Counts it when yes. */
static int claim(run_t *run, uint64_t t)
{
    const bb_config_t *cfg = run->cfg;
    if (run->stopping)
        return 0;
    if (t < run->t_measure)
        return 1;
    if (run->t_end && t >= run->t_end)
        return 0;
    if (cfg->num_requests && run->issued_measured >= cfg->num_requests)
        return 0;
    take_rusage_start(run);
    run->issued_measured++;
    return 1;
}

/* The request ended (well or not); its connection is already detached. */
static void req_complete(req_t *req, bb_err_kind_t err, const char *msg, uint64_t t_done)
{
    run_t *run = req->run;
    session_t *s = req->sess;
    if (req->in_flight) {
        req->in_flight = 0;
        baton_list_remove(&req->link);
        run->n_inflight--;
    }
    record(run, req, err, msg, t_done);
    run->progress_dirty = 1;

    int more = err == BB_ERR_NONE && s->n < run->cfg->multi_turn;
    if (more) {
        turn_t *t = &s->turns[s->n - 1];
        size_t len;
        char *txt = baton_buf_steal(&req->resp.text, &len);
        t->assistant.data = txt;
        t->assistant.len = t->assistant.cap = len;
        s->history_words += t->user_words + bb_count_words(txt ? txt : "", len);
    }
    req_unref(req);

    uint64_t now = uv_hrtime();
    if (more && run->cfg->think_s > 0 && !run->stopping) {
        /* the user reads the answer and types: the next turn waits (on_tick wakes it) */
        s->t_sched = now + (uint64_t)(run->cfg->think_s * 1e9);
        s->next_thinking = NULL;
        if (run->think_tail)
            run->think_tail->next_thinking = s;
        else
            run->think_head = s;
        run->think_tail = s;
        run->n_thinking++;
    } else if (more && claim(run, now)) {
        send_turn(s, now);
    } else {
        session_end(run, s);
    }
    check_done(run);
}

/* The session is over: frees it and lets the next one start (closed loop: a new one; open
 * loop: the first waiting for a slot). */
static void session_end(run_t *run, session_t *s)
{
    uint64_t now = uv_hrtime();
    session_free(s);
    if (!run->open_loop) {
        if (claim(run, now))
            start_session(run, now);
    } else if (run->pending_head && !run->stopping) {
        session_t *p = run->pending_head;
        run->pending_head = p->next_pending;
        if (!run->pending_head)
            run->pending_tail = NULL;
        run->n_pending--;
        send_turn(p, p->t_sched);
    }
}

/* Sessions whose think time is over send their next turn (or end, when no more may be sent);
 * all of them go when the run stops. */
static void wake_thinkers(run_t *run, uint64_t now)
{
    while (run->think_head && (run->stopping || run->think_head->t_sched <= now)) {
        session_t *s = run->think_head;
        run->think_head = s->next_thinking;
        if (!run->think_head)
            run->think_tail = NULL;
        run->n_thinking--;
        if (!run->stopping && claim(run, now))
            send_turn(s, s->t_sched);
        else if (run->stopping)
            session_free(s);
        else
            session_end(run, s);
    }
}

/* ---- connections ---- */

static void on_close(uv_handle_t *h)
{
    conn_t *c = h->data;
    run_t *run = c->run;
    run->n_conns--;
    baton_tls_conn_free(c->tls);
    free(c);
    check_done(run);
}

/* The most recently used idle connection, or NULL. */
static conn_t *idle_first(const run_t *run)
{
    baton_list_t *first = baton_list_first(&run->idle);
    return first ? container_of(first, conn_t, idle_link) : NULL;
}

static void idle_remove(conn_t *c)
{
    if (!c->idle)
        return;
    baton_list_remove(&c->idle_link);
    c->idle = 0;
}

static void idle_push(conn_t *c)
{
    run_t *run = c->run;
    c->idle = 1;
    baton_list_push_front(&run->idle, &c->idle_link);
}

static void conn_close(conn_t *c)
{
    if (c->closing)
        return;
    c->closing = 1;
    idle_remove(c);
    uv_close((uv_handle_t *)&c->tcp, on_close);
}

/* The connection failed: close it and fail or retry its request. */
static void conn_fail(conn_t *c, bb_err_kind_t kind, const char *msg)
{
    req_t *req = c->req;
    c->req = NULL;
    int reused = c->reused;
    conn_close(c);
    if (!req)
        return;
    req->conn = NULL;
    /* A keep-alive connection the server closed while it sat idle: the request never reached
     * it, so it is sent again once on a new connection (as HTTP clients do). */
    if ((kind == BB_ERR_EOF || kind == BB_ERR_IO) && reused && req->resp_bytes == 0 &&
        !req->retried) {
        req->retried = 1;
        dispatch(req, 1);
        return;
    }
    req_complete(req, kind, msg, uv_hrtime());
}

/* One per write: a request's write can still be queued for its callback when its response is
 * already in and the connection carries the next request. */
typedef struct write_s {
    uv_write_t w;
    req_t *req; /* NULL for TLS handshake records */
    conn_t *conn;
    baton_buf_t tls_out; /* the ciphertext written, over TLS */
} write_t;

static void on_write(uv_write_t *w, int status)
{
    write_t *wr = container_of(w, write_t, w);
    req_t *req = wr->req;
    conn_t *c = wr->conn;
    baton_buf_free(&wr->tls_out);
    free(wr);
    /* The connection outlives the callback: libuv runs write callbacks before close_cb. */
    if (status < 0 && status != UV_ECANCELED && !c->closing && (c->req == req || !req))
        conn_fail(c, BB_ERR_IO, uv_strerror(status));
    if (req)
        req_unref(req);
}

/* Writes TLS records (taking *out); handshake records carry no request. 0 or a libuv error. */
static int tls_write(conn_t *c, req_t *req, baton_buf_t *out)
{
    if (out->len == 0) {
        baton_buf_free(out);
        return 0;
    }
    write_t *wr = calloc(1, sizeof(*wr));
    if (!wr) {
        baton_buf_free(out);
        return UV_ENOMEM;
    }
    wr->req = req;
    wr->conn = c;
    wr->tls_out = *out;
    *out = (baton_buf_t)BATON_BUF_INIT;
    uv_buf_t b = uv_buf_init(wr->tls_out.data, (unsigned)wr->tls_out.len);
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, &b, 1, on_write);
    if (rc < 0) {
        baton_buf_free(&wr->tls_out);
        free(wr);
        return rc;
    }
    if (req)
        req->refs++;
    return 0;
}

static void conn_send(conn_t *c, req_t *req)
{
    run_t *run = c->run;
    c->req = req;
    req->conn = c;
    req->status = 0;
    req->resp_bytes = 0;
    llhttp_init(&c->parser, HTTP_RESPONSE, &run->settings);
    c->parser.data = c;
    uv_buf_t bufs[2] = {uv_buf_init(req->head.data, (unsigned)req->head.len),
                        uv_buf_init(req->body.data, (unsigned)req->body.len)};
    if (c->tls) {
        baton_buf_t out = BATON_BUF_INIT;
        int rc = baton_tls_conn_encrypt(c->tls, bufs, 2, &out);
        rc = rc ? rc : tls_write(c, req, &out);
        baton_buf_free(&out);
        if (rc)
            conn_fail(c, BB_ERR_IO, "TLS write failed");
        return;
    }
    write_t *wr = calloc(1, sizeof(*wr));
    if (!wr) {
        conn_fail(c, BB_ERR_IO, "out of memory");
        return;
    }
    wr->req = req;
    wr->conn = c;
    int rc = uv_write(&wr->w, (uv_stream_t *)&c->tcp, bufs, 2, on_write);
    if (rc < 0) {
        free(wr);
        conn_fail(c, BB_ERR_IO, uv_strerror(rc));
        return;
    }
    req->refs++;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    conn_t *c = h->data;
    /* One loop thread and the read callback follows at once: one buffer serves everyone. */
    *buf = uv_buf_init(c->run->readbuf, sizeof(c->run->readbuf));
}

/* A whole response arrived at t_done: hand the connection back and finish the request. */
static void conn_response_done(conn_t *c, int keep, uint64_t t_done)
{
    run_t *run = c->run;
    req_t *req = c->req;
    c->req = NULL;
    req->conn = NULL;
    bb_err_kind_t err = BB_ERR_NONE;
    char msg[200] = "";
    if (req->status != 200) {
        err = BB_ERR_HTTP;
        snprintf(msg, sizeof(msg), "HTTP %d: %.*s", req->status, (int)req->errbody.len,
                 req->errbody.data ? req->errbody.data : "");
    } else {
        bb_resp_finish(&req->resp, t_done);
        err = req->resp.err;
        snprintf(msg, sizeof(msg), "%s", req->resp.err_msg);
    }
    if (keep && !run->stopping && !c->closing)
        idle_push(c);
    else
        conn_close(c);
    req_complete(req, err, msg, t_done);
}

/* Response bytes (decrypted over TLS); non-zero when the connection is done with them. */
static int conn_on_bytes(void *owner, const char *data, size_t len)
{
    conn_t *c = owner;
    req_t *req = c->req;
    if (!req || c->closing) {
        conn_close(c);
        return 1;
    }
    req->resp_bytes += len;
    c->msg_done = 0;
    llhttp_errno_t e = llhttp_execute(&c->parser, data, len);
    if (e == HPE_PAUSED && c->msg_done) {
        const char *pos = llhttp_get_error_pos(&c->parser);
        size_t used = pos ? (size_t)(pos - data) : len;
        /* Bytes after the response we asked for: not a server we can keep talking to. */
        int keep =
            llhttp_should_keep_alive(&c->parser) && used >= len && !c->run->cfg->new_connection;
        conn_response_done(c, keep, c->t_read);
        return 1;
    } else if (e != HPE_OK) {
        char msg[160];
        snprintf(msg, sizeof(msg), "malformed HTTP response: %s %s", llhttp_errno_name(e),
                 llhttp_get_error_reason(&c->parser) ? llhttp_get_error_reason(&c->parser) : "");
        conn_fail(c, BB_ERR_BAD_RESPONSE, msg);
        return 1;
    }
    return 0;
}

static void on_tls_bytes(conn_t *c, const char *data, size_t len)
{
    int was_up = baton_tls_conn_established(c->tls);
    baton_buf_t out = BATON_BUF_INIT;
    int rc = baton_tls_conn_feed(c->tls, data, len, &out, conn_on_bytes, c);
    if (!c->closing && tls_write(c, NULL, &out) != 0 && rc == 0)
        rc = BATON_ETLS;
    baton_buf_free(&out);
    if (c->closing)
        return;
    if (rc != 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "TLS: %s",
                 rc == 1 ? "closed" : baton_tls_reason_label(baton_tls_conn_reason(c->tls)));
        c->reused = 0;
        conn_fail(c, rc == 1 ? BB_ERR_EOF : BB_ERR_CONNECT, msg);
        return;
    }
    if (!was_up && baton_tls_conn_established(c->tls) && c->req)
        conn_send(c, c->req);
}

static void on_read(uv_stream_t *st, ssize_t nread, const uv_buf_t *buf)
{
    conn_t *c = st->data;
    req_t *req = c->req;
    if (nread == 0)
        return;
    if (!req || c->closing) {
        /* The server closed an idle connection, or spoke out of turn: either way it is done. */
        conn_close(c);
        return;
    }
    if (nread < 0) {
        if (nread == UV_EOF) {
            c->msg_done = 0;
            llhttp_errno_t e = llhttp_finish(&c->parser);
            if (c->msg_done && (e == HPE_OK || e == HPE_PAUSED)) {
                conn_response_done(c, 0, uv_hrtime());
                return;
            }
        }
        conn_fail(c, nread == UV_EOF ? BB_ERR_EOF : BB_ERR_IO,
                  nread == UV_EOF ? "server closed the connection before the response ended"
                                  : uv_strerror((int)nread));
        return;
    }
    c->t_read = uv_hrtime();
    if (c->tls)
        on_tls_bytes(c, buf->base, (size_t)nread);
    else
        conn_on_bytes(c, buf->base, (size_t)nread);
}

static int on_headers_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    if (c->req)
        c->req->status = p->status_code;
    return 0;
}

static int on_body(llhttp_t *p, const char *at, size_t len)
{
    conn_t *c = p->data;
    req_t *req = c->req;
    if (!req)
        return 0;
    if (req->status == 200) {
        bb_resp_feed(&req->resp, at, len, c->t_read);
    } else if (req->errbody.len < 512) {
        size_t n = len < 512 - req->errbody.len ? len : 512 - req->errbody.len;
        if (baton_buf_append(&req->errbody, at, n))
            return 0; /* the message is only for the report */
    }
    return 0;
}

static int on_message_complete(llhttp_t *p)
{
    conn_t *c = p->data;
    c->msg_done = 1;
    return HPE_PAUSED; /* one response per request: stop here */
}

static void on_connect(uv_connect_t *cr, int status)
{
    conn_t *c = cr->data;
    if (status == UV_ECANCELED || c->closing)
        return;
    if (status < 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "connect: %s", uv_strerror(status));
        c->reused = 0; /* never retried: the server is not there */
        conn_fail(c, BB_ERR_CONNECT, msg);
        return;
    }
    int rc = uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
    if (rc < 0) {
        conn_fail(c, BB_ERR_IO, uv_strerror(rc));
        return;
    }
    if (c->run->tls) { /* the request goes out once the handshake is done (on_tls_bytes) */
        baton_buf_t out = BATON_BUF_INIT;
        rc = baton_tls_conn_create(&c->tls, c->run->tls, c->run->cfg->url.host);
        rc = rc ? rc : baton_tls_conn_start(c->tls, &out);
        rc = rc ? rc : tls_write(c, NULL, &out);
        baton_buf_free(&out);
        if (rc) {
            c->reused = 0;
            conn_fail(c, BB_ERR_CONNECT, "TLS handshake could not start");
        }
        return;
    }
    conn_send(c, c->req);
}

static void dispatch(req_t *req, int fresh_conn)
{
    run_t *run = req->run;
    conn_t *c = fresh_conn ? NULL : idle_first(run);
    if (c) {
        idle_remove(c);
        c->reused = 1;
        conn_send(c, req);
        return;
    }
    c = calloc(1, sizeof(*c));
    if (!c) {
        req_complete(req, BB_ERR_IO, "out of memory", uv_hrtime());
        return;
    }
    c->run = run;
    int rc = uv_tcp_init(&run->loop, &c->tcp);
    if (rc < 0) {
        free(c);
        req_complete(req, BB_ERR_IO, uv_strerror(rc), uv_hrtime());
        return;
    }
    c->tcp.data = c;
    run->n_conns++;
    run->res->connections_opened++;
    c->req = req;
    req->conn = c;
    uv_tcp_nodelay(&c->tcp, 1);
    c->creq.data = c;
    rc = uv_tcp_connect(&c->creq, &c->tcp, (const struct sockaddr *)&run->addr, on_connect);
    if (rc < 0) {
        char msg[160];
        snprintf(msg, sizeof(msg), "connect: %s", uv_strerror(rc));
        conn_fail(c, rc == UV_EMFILE || rc == UV_ENFILE ? BB_ERR_IO : BB_ERR_CONNECT, msg);
    }
}

/* ---- sessions ---- */

static void session_free(session_t *s)
{
    if (!s)
        return;
    for (unsigned i = 0; i < s->run->cfg->multi_turn; i++) {
        baton_buf_free(&s->turns[i].user_own);
        baton_buf_free(&s->turns[i].assistant);
    }
    free(s->turns);
    free(s);
}

static session_t *session_new(run_t *run)
{
    session_t *s = calloc(1, sizeof(*s));
    if (!s)
        return NULL;
    s->run = run;
    uint64_t id = run->sessions_started++;
    snprintf(s->user, sizeof(s->user), "bench-s%llu", (unsigned long long)id);
    s->group = run->n_shared ? (unsigned)(id % run->n_shared) : 0;
    s->turns = calloc(run->cfg->multi_turn, sizeof(*s->turns));
    if (!s->turns) {
        free(s);
        return NULL;
    }
    return s;
}

static uint32_t range(run_t *run, uint32_t lo, uint32_t hi)
{
    return lo == hi ? lo : (uint32_t)bb_rng_range(&run->rng, lo, hi);
}

/* Builds and sends the session's next turn, scheduled at t_sched. */
static void send_turn(session_t *s, uint64_t t_sched)
{
    run_t *run = s->run;
    const bb_config_t *cfg = run->cfg;
    req_t *req = calloc(1, sizeof(*req));
    turn_t *t = &s->turns[s->n];
    uint32_t max_tokens = range(run, cfg->out_lo, cfg->out_hi);
    int rc = req ? 0 : BATON_ENOMEM;
    if (!rc && cfg->dataset) {
        const bb_item_t *it = &cfg->dataset->items[bb_rng_u64(&run->rng) % cfg->dataset->n];
        t->user = it->prompt;
        t->user_len = it->prompt_len;
        t->user_words = it->prompt_words;
        if (!cfg->out_given)
            max_tokens = it->output_words;
    } else if (!rc) {
        t->user_words = range(run, cfg->in_lo, cfg->in_hi);
        rc = bb_random_prompt(&t->user_own, &run->rng, t->user_words);
        t->user = t->user_own.data ? t->user_own.data : "";
        t->user_len = t->user_own.len;
    }
    if (!rc && s->n == 0 && run->n_shared) {
        /* the first turn opens with the session group's shared prompt */
        const baton_buf_t *sp = &run->shared[s->group];
        baton_buf_t b = BATON_BUF_INIT;
        rc = baton_buf_append(&b, sp->data, sp->len) || baton_buf_append(&b, " ", 1) ||
             baton_buf_append(&b, t->user, t->user_len);
        baton_buf_free(&t->user_own);
        t->user_own = b;
        t->user = b.data ? b.data : "";
        t->user_len = b.len;
        t->user_words += cfg->shared_prefix_words;
        rc = rc ? BATON_ENOMEM : 0;
    }
    s->n++;
    bb_turn_t turns_small[8];
    bb_turn_t *turns = s->n <= 8 ? turns_small : malloc(s->n * sizeof(*turns));
    if (!turns)
        rc = BATON_ENOMEM;
    if (!rc) {
        for (unsigned i = 0; i < s->n; i++) {
            turns[i].user = s->turns[i].user;
            turns[i].user_len = s->turns[i].user_len;
            turns[i].assistant =
                i + 1 < s->n ? (s->turns[i].assistant.data ? s->turns[i].assistant.data : "")
                             : NULL;
            turns[i].assistant_len = i + 1 < s->n ? s->turns[i].assistant.len : 0;
        }
        bb_body_opts_t o = run->body_opts;
        if (cfg->multi_turn > 1 || run->n_shared)
            o.user = s->user; /* lets consistent_hash keep a session together */
        rc = bb_render_body(&req->body, &o, turns, s->n, max_tokens);
    }
    if (turns && turns != turns_small)
        free(turns);
    if (!rc)
        rc = baton_buf_printf(&req->head,
                              "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                              "Accept: */*\r\nContent-Length: %zu\r\n%s\r\n",
                              run->path, run->host_hdr, req->body.len,
                              run->cfg->new_connection ? "Connection: close\r\n" : "");
    for (unsigned i = 0; !rc && i < run->cfg->n_headers; i++) {
        /* before the blank line that ends the head */
        req->head.len -= 2;
        rc = baton_buf_printf(&req->head, "%s\r\n\r\n", run->cfg->headers[i]);
    }
    if (rc) {
        fprintf(stderr, "baton-bench: out of memory building a request\n");
        if (req) {
            baton_buf_free(&req->head);
            baton_buf_free(&req->body);
            free(req);
        }
        session_free(s);
        run->stopping = 1;
        check_done(run);
        return;
    }
    req->run = run;
    req->sess = s;
    req->refs = 1;
    req->input_tokens = s->history_words + t->user_words;
    req->t_sched = t_sched;
    req->measured = t_sched >= run->t_measure;
    bb_resp_init(&req->resp, cfg->endpoint, cfg->stream, cfg->multi_turn > 1);
    req->t_start = uv_hrtime();
    if (run->open_loop && !cfg->max_concurrency && req->t_start > t_sched) {
        double lag = (double)(req->t_start - t_sched) / 1e6;
        if (req->measured && lag > run->res->max_lag_ms)
            run->res->max_lag_ms = lag;
    }
    if (cfg->timeout_s > 0)
        req->deadline = req->t_start + (uint64_t)(cfg->timeout_s * 1e9);
    req->in_flight = 1;
    baton_list_push_front(&run->inflight, &req->link);
    run->n_inflight++;
    run->issued_total++;
    dispatch(req, 0);
}

static void start_session(run_t *run, uint64_t t_sched)
{
    session_t *s = session_new(run);
    if (!s) {
        fprintf(stderr, "baton-bench: out of memory starting a session\n");
        run->stopping = 1;
        return;
    }
    if (run->open_loop && run->cfg->max_concurrency &&
        run->n_inflight >= run->cfg->max_concurrency) {
        s->t_sched = t_sched;
        if (run->pending_tail)
            run->pending_tail->next_pending = s;
        else
            run->pending_head = s;
        run->pending_tail = s;
        run->n_pending++;
        return;
    }
    send_turn(s, t_sched);
}

/* ---- timers, stop ---- */

static void close_if_active(uv_handle_t *h)
{
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

static void finish(run_t *run)
{
    if (run->finished)
        return;
    run->finished = 1;
    run->stopping = 1;
    if (run->cfg->progress)
        printf("\r\033[K");
    fflush(stdout);
    close_if_active((uv_handle_t *)&run->arrival_timer);
    close_if_active((uv_handle_t *)&run->tick_timer);
    close_if_active((uv_handle_t *)&run->sigint);
    conn_t *c;
    while ((c = idle_first(run)) != NULL)
        conn_close(c);
    while (run->pending_head) {
        session_t *p = run->pending_head;
        run->pending_head = p->next_pending;
        session_free(p);
    }
    run->pending_tail = NULL;
    run->n_pending = 0;
    wake_thinkers(run, uv_hrtime()); /* stopping: frees them */
}

static void check_done(run_t *run)
{
    if (run->finished || run->n_inflight > 0 || (run->n_thinking > 0 && !run->stopping))
        return;
    if (run->open_loop && !run->stopping && (!run->arrivals_stopped || run->pending_head))
        return;
    finish(run);
}

static void on_arrival(uv_timer_t *t)
{
    run_t *run = t->data;
    uint64_t now = uv_hrtime();
    /* Every arrival that is due goes out now, stamped with its scheduled time; lateness shows
     * up as max_lag_ms. */
    while (run->next_arrival <= now && !run->stopping) {
        if (!claim(run, run->next_arrival)) {
            run->arrivals_stopped = 1;
            check_done(run);
            return;
        }
        start_session(run, run->next_arrival);
        run->next_arrival += bb_arrival_next_gap_ns(&run->arrival);
    }
    if (run->stopping)
        return;
    /* Timers count from the loop's cached time; refresh it so the wait is not stretched by
     * the time spent since the loop woke up. Resolution stays 1 ms: arrivals can leave up to
     * about 1 ms late (reported as max_lag_ms); latency is measured from when they leave. */
    uv_update_time(&run->loop);
    now = uv_hrtime();
    uint64_t wait_ns = run->next_arrival > now ? run->next_arrival - now : 0;
    uv_timer_start(&run->arrival_timer, on_arrival, (wait_ns + 999999) / 1000000, 0);
}

static void print_progress(run_t *run, uint64_t now)
{
    bb_results_t *res = run->res;
    double el = (double)(now - run->t0) / 1e9;
    double mel = now > run->t_measure ? (double)(now - run->t_measure) / 1e9 : 0;
    printf("\r\033[K  %6.1fs%s  done %llu  failed %llu  in flight %u  waiting %llu  %.1f req/s", el,
           now < run->t_measure ? " (warm-up)" : "", (unsigned long long)res->completed,
           (unsigned long long)res->failed, run->n_inflight, (unsigned long long)run->n_pending,
           mel > 0 ? (double)res->completed / mel : 0.0);
    fflush(stdout);
}

static void on_tick(uv_timer_t *t)
{
    run_t *run = t->data;
    uint64_t now = uv_hrtime();
    if (run->cfg->timeout_s > 0) {
        for (baton_list_t *it = run->inflight.next, *next; it != &run->inflight; it = next) {
            next = it->next;
            req_t *r = container_of(it, req_t, link);
            if (r->deadline && now >= r->deadline && r->conn)
                conn_fail(r->conn, BB_ERR_TIMEOUT, "no complete response within --timeout");
        }
    }
    if (run->n_thinking) {
        wake_thinkers(run, now);
        check_done(run);
    }
    if (run->open_loop && run->t_end && now >= run->t_end && !run->arrivals_stopped) {
        run->arrivals_stopped = 1;
        uv_timer_stop(&run->arrival_timer);
        check_done(run);
    }
    if (run->cfg->progress && !run->finished && now - run->last_progress >= 500000000ULL) {
        run->last_progress = now;
        print_progress(run, now);
    }
}

static void on_sigint(uv_signal_t *h, int signum)
{
    run_t *run = h->data;
    if (run->stopping) {
        fprintf(stderr, "\nbaton-bench: interrupted twice, exiting\n");
        _exit(130);
    }
    run->stopping = 1;
    run->res->interrupted = 1;
    uv_timer_stop(&run->arrival_timer);
    fprintf(stderr, "\nbaton-bench: interrupted; cancelling %u requests in flight\n",
            run->n_inflight);
    for (baton_list_t *it = run->inflight.next, *next; it != &run->inflight; it = next) {
        next = it->next;
        req_t *r = container_of(it, req_t, link);
        if (r->conn) {
            conn_t *c = r->conn;
            c->req = NULL;
            r->conn = NULL;
            conn_close(c);
        }
        req_complete(r, BB_ERR_CANCELED, "interrupted", uv_hrtime());
    }
    check_done(run);
}

/* ---- entry ---- */

static int resolve(run_t *run)
{
    const baton_url_t *u = &run->cfg->url;
    char port[16];
    snprintf(port, sizeof(port), "%d", u->port);
    struct addrinfo hints = {0};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    uv_getaddrinfo_t gr;
    int rc = uv_getaddrinfo(&run->loop, &gr, NULL, u->host, port, &hints);
    if (rc < 0) {
        fprintf(stderr, "baton-bench: cannot resolve %s: %s\n", u->host, uv_strerror(rc));
        return rc;
    }
    memcpy(&run->addr, gr.addrinfo->ai_addr, gr.addrinfo->ai_addrlen);
    uv_freeaddrinfo(gr.addrinfo);
    if (strchr(u->host, ':'))
        snprintf(run->host_hdr, sizeof(run->host_hdr), "[%s]:%d", u->host, u->port);
    else
        snprintf(run->host_hdr, sizeof(run->host_hdr), "%s:%d", u->host, u->port);
    snprintf(run->path, sizeof(run->path), "%s%s", u->prefix, bb_endpoint_path(run->cfg->endpoint));
    return 0;
}

static void free_shared(baton_buf_t *shared, unsigned n)
{
    for (unsigned i = 0; shared && i < n; i++)
        baton_buf_free(&shared[i]);
    free(shared);
}

int bb_run(const bb_config_t *cfg, bb_results_t *res)
{
    run_t *run = calloc(1, sizeof(*run));
    if (!run)
        return BATON_ENOMEM;
    memset(res, 0, sizeof(*res));
    run->cfg = cfg;
    run->res = res;
    baton_list_init(&run->idle);
    baton_list_init(&run->inflight);
    int rc = uv_loop_init(&run->loop);
    if (rc < 0) {
        free(run);
        return rc;
    }
    if ((rc = resolve(run)) < 0) {
        uv_loop_close(&run->loop);
        free(run);
        return rc;
    }
    if (cfg->url.tls) {
        char err[400] = "";
        baton_tls_opts_t o = {NULL, NULL, cfg->ca_file};
        if ((rc = baton_tls_create(&run->tls, BATON_TLS_CLIENT, &o, err, sizeof(err))) != 0) {
            fprintf(stderr, "baton-bench: TLS: %s\n", err);
            uv_loop_close(&run->loop);
            free(run);
            return rc;
        }
    }
    llhttp_settings_init(&run->settings);
    run->settings.on_headers_complete = on_headers_complete;
    run->settings.on_body = on_body;
    run->settings.on_message_complete = on_message_complete;
    run->body_opts.endpoint = cfg->endpoint;
    run->body_opts.stream = cfg->stream;
    run->body_opts.model = cfg->model;
    run->body_opts.ignore_eos = cfg->ignore_eos;
    run->body_opts.token_ids = cfg->token_ids;
    bb_rng_seed(&run->rng, cfg->seed);
    if (cfg->shared_prefix_words) {
        unsigned g = cfg->shared_prefix_groups ? cfg->shared_prefix_groups : 1;
        run->shared = calloc(g, sizeof(*run->shared));
        for (unsigned i = 0; run->shared && i < g; i++)
            if (bb_random_prompt(&run->shared[i], &run->rng, cfg->shared_prefix_words)) {
                free_shared(run->shared, i + 1);
                run->shared = NULL;
            }
        if (!run->shared) {
            uv_loop_close(&run->loop);
            free(run);
            return BATON_ENOMEM;
        }
        run->n_shared = g;
    }
    run->open_loop = cfg->request_rate > 0;
    if (run->open_loop)
        bb_arrival_init(&run->arrival, cfg->arrival, cfg->request_rate, cfg->seed ^ 0xA5A5A5A5ULL);

    uv_timer_init(&run->loop, &run->arrival_timer);
    uv_timer_init(&run->loop, &run->tick_timer);
    uv_signal_init(&run->loop, &run->sigint);
    run->arrival_timer.data = run->tick_timer.data = run->sigint.data = run;
    uv_signal_start(&run->sigint, on_sigint, SIGINT);
    uv_timer_start(&run->tick_timer, on_tick, 50, 50);

    run->t0 = uv_hrtime();
    run->t_measure = run->t0 + (uint64_t)(cfg->warmup_s * 1e9);
    if (cfg->duration_s > 0)
        run->t_end = run->t_measure + (uint64_t)(cfg->duration_s * 1e9);
    if (cfg->warmup_s <= 0)
        take_rusage_start(run);
    if (run->open_loop) {
        run->next_arrival = run->t0;
        on_arrival(&run->arrival_timer);
    } else {
        for (unsigned i = 0; i < cfg->concurrency && !run->stopping; i++)
            if (claim(run, run->t0))
                start_session(run, run->t0);
    }
    check_done(run);
    uv_run(&run->loop, UV_RUN_DEFAULT);

    uint64_t t_stop = uv_hrtime();
    uint64_t end = run->last_done > run->t_measure ? run->last_done : t_stop;
    res->duration_s = end > run->t_measure ? (double)(end - run->t_measure) / 1e9 : 0;
    if (run->ru_taken) {
        struct rusage ru;
        getrusage(RUSAGE_SELF, &ru);
        res->bench_cpu_s = tv_s(ru.ru_utime) + tv_s(ru.ru_stime) - tv_s(run->ru_start.ru_utime) -
                           tv_s(run->ru_start.ru_stime);
    }
    rc = uv_loop_close(&run->loop);
    if (rc < 0)
        fprintf(stderr, "baton-bench: loop closed with handles open: %s\n", uv_strerror(rc));
    baton_tls_destroy(run->tls);
    free_shared(run->shared, run->n_shared);
    free(run);
    return 0;
}

void bb_results_free(bb_results_t *res)
{
    bb_vec_free(&res->ttft_ms);
    bb_vec_free(&res->tpot_ms);
    bb_vec_free(&res->itl_ms);
    bb_vec_free(&res->e2e_ms);
}
