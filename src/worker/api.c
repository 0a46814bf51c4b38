/* api.c — baton-worker's HTTP API and request life cycle: parse, schedule, rendezvous, answer. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/log.h"
#include "worker/render.h"
#include "worker/request.h"
#include "worker/simtext.h"
#include "worker/worker.h"

#define COMP                 "worker"
#define SCHED_STEPS_PER_TURN 64 /* steps done per loop turn before yielding to I/O */

/* One sequence of a job: scheduler entry, generator, rendezvous handle, stream position. */
typedef struct wk_sstate_s {
    wk_seq_t seq;
    wk_job_t *job;
    size_t index;
    wk_gen_t gen;
    wk_stream_state_t st;
    wk_boot_pub_t pub;
    wk_boot_wait_t wait;
    int pub_active, wait_active;
    int32_t first_token;
    int done;
} wk_sstate_t;

struct wk_job_s {
    wk_worker_t *w;
    baton_http_req_t *http;
    wk_request_t req;
    wk_sstate_t *ss;
    const wk_gen_t **gens;
    char id[48];
    long long created;
    uint64_t start_ns;
    size_t n_done, n_booted;
    int streaming; /* the SSE response has started */
    int ttft_seen;
    const char *route;
    wk_job_t *prev, *next;
};

void wk_config_default(wk_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->mode = WK_MODE_REGULAR;
    cfg->host = "127.0.0.1";
    cfg->port = 30000;
    cfg->bootstrap_port = 8998;
    cfg->model_name = "baton-sim";
    cfg->prefill_us_per_token = 20;
    cfg->decode_us_per_token = 2000;
    cfg->max_batch = 32;
    cfg->max_queue = 1024;
    cfg->bootstrap_timeout_ms = 30000;
}

const char *wk_mode_name(wk_mode_t m)
{
    switch (m) {
    case WK_MODE_PREFILL:
        return "prefill";
    case WK_MODE_DECODE:
        return "decode";
    default:
        return "regular";
    }
}

/* ---- metrics helpers ---- */

static void count_request(wk_worker_t *w, const char *route, int status)
{
    if (w->m_requests == NULL)
        return;
    char st[16];
    if (status > 0)
        snprintf(st, sizeof(st), "%d", status);
    else
        snprintf(st, sizeof(st), "aborted");
    const char *labels[2] = {route, st};
    baton_counter_inc_labels(w->m_requests, labels);
}

static void observe_duration(wk_worker_t *w, const char *route, uint64_t start_ns)
{
    if (w->m_duration == NULL)
        return;
    const char *labels[1] = {route};
    baton_metric_child_t *c = baton_metric_child(w->m_duration, labels);
    if (c)
        baton_histogram_observe(c, (double)(uv_hrtime() - start_ns) / 1e9);
}

static void inc(baton_metric_child_t *c, double v)
{
    if (c)
        baton_counter_add(c, v);
}

/* ---- scheduler driver ---- */

static void sched_drive(wk_worker_t *w);

static void sched_idle_cb(uv_idle_t *h)
{
    sched_drive(h->data);
}

static void sched_timer_cb(uv_timer_t *t)
{
    sched_drive(t->data);
}

/* Runs due steps; re-arms the timer for the next step end, or the idle handle when work is
 * due now (an idle handle, not a 0 ms timer: libuv would rerun that timer in the same turn and
 * starve I/O). */
static void sched_drive(wk_worker_t *w)
{
    if (w->shutting_down && !wk_sched_busy(&w->sched) && wk_sched_waiting(&w->sched) == 0) {
        uv_idle_stop(&w->sched_idle);
        uv_timer_stop(&w->sched_timer);
        return;
    }
    uint64_t now = uv_hrtime();
    uint64_t next = wk_sched_poll(&w->sched, now, SCHED_STEPS_PER_TURN);
    if (next == WK_SCHED_IDLE) {
        uv_idle_stop(&w->sched_idle);
        uv_timer_stop(&w->sched_timer);
    } else if (next <= now) {
        uv_timer_stop(&w->sched_timer);
        uv_idle_start(&w->sched_idle, sched_idle_cb);
    } else {
        uv_idle_stop(&w->sched_idle);
        uint64_t ms = (next - now + 999999) / 1000000;
        uv_timer_start(&w->sched_timer, sched_timer_cb, ms, 0);
    }
}

static void sched_kick(wk_worker_t *w)
{
    /* never run steps inside the caller's call: callbacks would re-enter it */
    uv_idle_start(&w->sched_idle, sched_idle_cb);
}

/* ---- job life cycle ---- */

static void job_unlink_free(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    if (job->prev)
        job->prev->next = job->next;
    else if (w->jobs == job)
        w->jobs = job->next;
    if (job->next)
        job->next->prev = job->prev;
    w->n_jobs--;
    for (size_t i = 0; i < job->req.n_items; i++)
        wk_gen_free(&job->ss[i].gen);
    free(job->ss);
    free(job->gens);
    wk_request_free(&job->req);
    free(job);
}

/* Takes every sequence out of the scheduler and the rendezvous. No callback follows. */
static void job_cancel_all(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        wk_sched_cancel(&w->sched, &ss->seq);
        if (ss->wait_active) {
            ss->wait_active = 0;
            w->n_boot_waiting--;
            wk_boot_wait_cancel(&ss->wait);
        }
        if (ss->pub_active) {
            ss->pub_active = 0;
            w->n_boot_pub--;
            wk_boot_publish_cancel(&ss->pub);
        } else if (w->cfg.mode == WK_MODE_PREFILL && !ss->done && w->boot &&
                   job->req.items[i].has_boot) {
            /* never published: tell its decode now rather than let it time out */
            wk_boot_abort(w->boot, job->req.items[i].room, BATON_ECANCELED);
        }
    }
}

static void render_ctx(wk_job_t *job, wk_render_ctx_t *ctx)
{
    wk_worker_t *w = job->w;
    ctx->id = job->id;
    ctx->model = job->req.model ? job->req.model : w->cfg.model_name;
    ctx->created = job->created;
    ctx->input_logprobs = w->cfg.mode != WK_MODE_DECODE;
    ctx->e2e_s = (double)(uv_hrtime() - job->start_ns) / 1e9;
}

static void job_fail(wk_job_t *job, int status, const char *message, const char *code)
{
    wk_worker_t *w = job->w;
    job_cancel_all(job);
    const char *type = status >= 500 ? "server_error" : "invalid_request_error";
    log_warn(COMP, "request_failed id=%s route=%s status=%d code=%s reason=\"%s\"", job->id,
             job->route, status, code, message);
    if (job->streaming) {
        baton_buf_t b = BATON_BUF_INIT;
        if (wk_render_stream_error(message, type, code, &b) == 0)
            baton_http_stream_write(job->http, b.data, b.len);
        baton_buf_free(&b);
        baton_http_stream_end(job->http);
    } else {
        baton_http_respond_error(job->http, status, message, type, NULL, code);
    }
    count_request(w, job->route, status);
    observe_duration(w, job->route, job->start_ns);
    job_unlink_free(job);
}

static void job_fail_err(wk_job_t *job, int err, const char *what)
{
    char msg[256];
    int status = 502;
    const char *code = "bootstrap_failed";
    switch (err) {
    case BATON_ETIMEOUT:
        status = 504;
        code = "bootstrap_timeout";
        snprintf(msg, sizeof(msg), "%s: no rendezvous within %llu ms", what,
                 (unsigned long long)job->w->cfg.bootstrap_timeout_ms);
        break;
    case BATON_EABORTED:
        code = "bootstrap_aborted";
        snprintf(msg, sizeof(msg), "%s: the peer aborted the room", what);
        break;
    case BATON_ENOMEM:
        status = 500;
        code = "internal_error";
        snprintf(msg, sizeof(msg), "%s: out of memory", what);
        break;
    case BATON_ESHUTDOWN:
        status = 503;
        code = "shutting_down";
        snprintf(msg, sizeof(msg), "%s: the worker is shutting down", what);
        break;
    case BATON_EEXIST:
        status = 409;
        code = "bootstrap_room_in_use";
        snprintf(msg, sizeof(msg), "%s: the bootstrap room is already in use", what);
        break;
    case BATON_EPEERDOWN:
        code = "bootstrap_peer_down";
        snprintf(msg, sizeof(msg), "%s: the bootstrap connection was lost", what);
        break;
    default:
        code = "bootstrap_unreachable";
        snprintf(msg, sizeof(msg), "%s: %s", what, baton_strerror(err));
        break;
    }
    job_fail(job, status, msg, code);
}

/* Sends whatever item i's client has not seen yet (streaming only). */
static void job_emit(wk_job_t *job, wk_sstate_t *ss)
{
    wk_worker_t *w = job->w;
    if (!job->ttft_seen && ss->gen.n_tokens > 0) {
        job->ttft_seen = 1;
        if (w->m_ttft)
            baton_histogram_observe(w->m_ttft, (double)(uv_hrtime() - job->start_ns) / 1e9);
    }
    if (!job->req.stream)
        return;
    if (!job->streaming) {
        static const baton_http_header_t hdrs[] = {{"Cache-Control", "no-cache"}};
        job->streaming = 1;
        baton_http_stream_start(job->http, 200, "text/event-stream", hdrs, 1);
    }
    wk_render_ctx_t ctx;
    render_ctx(job, &ctx);
    baton_buf_t b = BATON_BUF_INIT;
    if (wk_render_stream_progress(&ctx, &job->req, ss->index, &ss->gen, &ss->st, &b) == 0 &&
        b.len > 0)
        baton_http_stream_write(job->http, b.data, b.len); /* BATON_ECLOSED: on_abort follows */
    baton_buf_free(&b);
}

/* Marks a sequence finished; returns 1 when it was the job's last (call job_complete then). */
static int seq_finish(wk_sstate_t *ss)
{
    wk_job_t *job = ss->job;
    if (ss->done)
        return 0;
    ss->done = 1;
    inc(job->w->m_gen_tokens, ss->gen.n_tokens);
    return ++job->n_done == job->req.n_items;
}

static void job_complete(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk_render_ctx_t ctx;
    render_ctx(job, &ctx);
    baton_buf_t b = BATON_BUF_INIT;
    int rc;
    if (job->req.stream) {
        for (size_t i = 0; i < job->req.n_items; i++)
            job_emit(job, &job->ss[i]); /* starts the stream if nothing was sent yet */
        rc = wk_render_stream_tail(&ctx, &job->req, job->gens, &b);
        if (rc == 0)
            baton_http_stream_write(job->http, b.data, b.len);
        baton_http_stream_end(job->http);
    } else {
        rc = wk_render_full(&ctx, &job->req, job->gens, &b);
        if (rc == 0)
            baton_http_respond(job->http, 200, "application/json", NULL, 0, b.data, b.len);
        else
            baton_http_respond_error(job->http, 500, "out of memory", "server_error", NULL,
                                     "internal_error");
    }
    baton_buf_free(&b);
    uint64_t p, c;
    wk_render_usage(&job->req, job->gens, &p, &c);
    log_debug(COMP,
              "request_done id=%s route=%s items=%zu prompt_tokens=%llu "
              "completion_tokens=%llu",
              job->id, job->route, job->req.n_items, (unsigned long long)p, (unsigned long long)c);
    count_request(w, job->route, rc == 0 ? 200 : 500);
    observe_duration(w, job->route, job->start_ns);
    job_unlink_free(job);
}

static void on_abort(baton_http_req_t *http)
{
    wk_job_t *job = http->data;
    wk_worker_t *w = job->w;
    log_info(COMP, "request_aborted id=%s route=%s reason=client_gone", job->id, job->route);
    job_cancel_all(job);
    if (job->streaming)
        baton_http_stream_end(http);
    else
        baton_http_respond_error(http, 499, "client closed the request", "server_error", NULL,
                                 "client_closed");
    count_request(w, job->route, 0);
    job_unlink_free(job);
}

/* ---- scheduler callbacks ---- */

static void on_published(wk_boot_pub_t *pub, int status);

static int on_prefilled(wk_sched_t *s, wk_seq_t *seq)
{
    wk_sstate_t *ss = seq->data;
    wk_job_t *job = ss->job;
    wk_worker_t *w = job->w;
    const wk_item_t *it = &job->req.items[ss->index];
    if (w->cfg.mode == WK_MODE_PREFILL) {
        wk_boot_result_t res = {
            .prompt_tokens = it->prompt_tokens,
            .first_token = it->max_tokens > 0 ? wk_sim_token(it->seed, 0) : -1,
        };
        if (ss->gen.finish == WK_FINISH_NONE && wk_gen_push(&ss->gen, res.first_token) != 0) {
            job_fail_err(job, BATON_ENOMEM, "prefill");
            return 0;
        }
        int rc = wk_boot_publish(w->boot, &ss->pub, it->room, &res, on_published);
        if (rc != 0) {
            job_fail_err(job, rc, "prefill handoff");
            return 0;
        }
        ss->pub_active = 1;
        w->n_boot_pub++;
        return 0;
    }
    /* regular: the first token comes out of prefill, the rest out of decode steps */
    if (ss->gen.finish == WK_FINISH_NONE) {
        if (wk_gen_push(&ss->gen, wk_gen_next_id(&ss->gen)) != 0) {
            job_fail_err(job, BATON_ENOMEM, "generate");
            return 0;
        }
        job_emit(job, ss);
    }
    if (ss->gen.finish != WK_FINISH_NONE) {
        if (seq_finish(ss))
            job_complete(job);
        return 0;
    }
    return 1;
}

static int on_decoded(wk_sched_t *s, wk_seq_t *seq)
{
    wk_sstate_t *ss = seq->data;
    wk_job_t *job = ss->job;
    if (wk_gen_push(&ss->gen, wk_gen_next_id(&ss->gen)) != 0) {
        job_fail_err(job, BATON_ENOMEM, "generate");
        return 0;
    }
    job_emit(job, ss);
    if (ss->gen.finish != WK_FINISH_NONE) {
        if (seq_finish(ss))
            job_complete(job);
        return 0;
    }
    return 1;
}

/* ---- rendezvous callbacks ---- */

static void on_published(wk_boot_pub_t *pub, int status)
{
    wk_sstate_t *ss = pub->data;
    wk_job_t *job = ss->job;
    ss->pub_active = 0;
    job->w->n_boot_pub--;
    if (status != 0) {
        inc(job->w->m_rooms_failed, 1);
        job_fail_err(job, status, "prefill handoff");
        return;
    }
    inc(job->w->m_rooms_ok, 1);
    if (seq_finish(ss))
        job_complete(job);
}

/* Decode: every room of the job has met its prefill; start answering. */
static void decode_begin(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    int all_done = 0, submitted = 0;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        if (ss->gen.finish == WK_FINISH_NONE) {
            if (wk_gen_push(&ss->gen, ss->first_token) != 0) {
                job_fail_err(job, BATON_ENOMEM, "decode");
                return;
            }
            job_emit(job, ss);
        }
        if (ss->gen.finish != WK_FINISH_NONE) {
            all_done = seq_finish(ss);
        } else {
            ss->seq.prompt_tokens = job->req.items[i].prompt_tokens;
            wk_sched_submit_decode(&w->sched, &ss->seq);
            submitted = 1;
        }
    }
    if (submitted)
        sched_kick(w);
    if (all_done)
        job_complete(job);
}

static void on_rendezvous(wk_boot_wait_t *wt, int status, const wk_boot_result_t *res)
{
    wk_sstate_t *ss = wt->data;
    wk_job_t *job = ss->job;
    wk_worker_t *w = job->w;
    const wk_item_t *it = &job->req.items[ss->index];
    ss->wait_active = 0;
    w->n_boot_waiting--;
    if (status != 0) {
        inc(w->m_rooms_failed, 1);
        job_fail_err(job, status, "decode rendezvous");
        return;
    }
    inc(w->m_rooms_ok, 1);
    int want_first = it->max_tokens > 0;
    if (res->prompt_tokens != it->prompt_tokens || (res->first_token >= 0) != want_first ||
        res->first_token >= WK_SIM_VOCAB_SIZE) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "bootstrap mismatch for room %llu: prefill computed %u prompt tokens and first "
                 "token %d, decode expected %u prompt tokens",
                 (unsigned long long)it->room, res->prompt_tokens, res->first_token,
                 it->prompt_tokens);
        job_fail(job, 500, msg, "bootstrap_mismatch");
        return;
    }
    ss->first_token = res->first_token;
    if (++job->n_booted == job->req.n_items)
        decode_begin(job);
}

/* ---- request entry ---- */

static int job_start(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk_mode_t mode = w->cfg.mode;
    if (mode == WK_MODE_DECODE) {
        for (size_t i = 0; i < job->req.n_items; i++) {
            wk_sstate_t *ss = &job->ss[i];
            const wk_item_t *it = &job->req.items[i];
            ss->wait.data = ss;
            int rc = wk_boot_wait(w->boot, &ss->wait, it->boot_host, it->boot_port, it->room,
                                  on_rendezvous);
            if (rc != 0) {
                job_fail_err(job, rc, "decode rendezvous");
                return rc;
            }
            ss->wait_active = 1;
            w->n_boot_waiting++;
        }
        return 0;
    }
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        ss->seq.prompt_tokens = job->req.items[i].prompt_tokens;
        ss->pub.data = ss;
        wk_sched_submit_prefill(&w->sched, &ss->seq);
    }
    sched_kick(w);
    return 0;
}

static void handle_generation(wk_worker_t *w, baton_http_req_t *http, wk_api_t api,
                              const char *route)
{
    uint64_t start_ns = uv_hrtime();
    wk_parse_err_t perr = {0};
    wk_job_t *job = calloc(1, sizeof(*job));
    if (job == NULL) {
        baton_http_respond_error(http, 500, "out of memory", "server_error", NULL,
                                 "internal_error");
        count_request(w, route, 500);
        return;
    }
    int rc = wk_request_parse(&job->req, api, http->body, http->body_len, &perr);
    if (rc != 0) {
        free(job);
        baton_http_respond_error(http, perr.status, perr.message,
                                 perr.status >= 500 ? "server_error" : "invalid_request_error",
                                 perr.param[0] ? perr.param : NULL, perr.code);
        count_request(w, route, perr.status);
        return;
    }
    const char *bad = NULL;
    if (w->cfg.mode != WK_MODE_REGULAR && !job->req.has_boot)
        bad = w->cfg.mode == WK_MODE_PREFILL
                  ? "this worker runs in prefill mode: bootstrap_room is required"
                  : "this worker runs in decode mode: bootstrap_host, bootstrap_port and "
                    "bootstrap_room are required";
    for (size_t i = 0; !bad && w->cfg.mode == WK_MODE_DECODE && i < job->req.n_items; i++)
        if (job->req.items[i].boot_host == NULL || job->req.items[i].boot_port <= 0)
            bad = "this worker runs in decode mode: bootstrap_host and bootstrap_port are "
                  "required";
    unsigned waiting = wk_sched_waiting(&w->sched) + w->n_boot_waiting;
    int status = 0;
    const char *code = NULL;
    if (bad) {
        status = 400;
        code = "bootstrap_required";
    } else if (w->shutting_down) {
        status = 503;
        bad = "the worker is shutting down";
        code = "shutting_down";
    } else if (waiting + job->req.n_items > w->cfg.max_queue) {
        status = 503;
        bad = "the worker's queue is full";
        code = "queue_full";
    }
    if (status) {
        wk_request_free(&job->req);
        free(job);
        baton_http_respond_error(http, status, bad,
                                 status >= 500 ? "server_error" : "invalid_request_error",
                                 status == 400 ? "bootstrap_room" : NULL, code);
        count_request(w, route, status);
        return;
    }

    size_t n = job->req.n_items;
    job->w = w;
    job->http = http;
    job->route = route;
    job->start_ns = start_ns;
    job->created = (long long)time(NULL);
    job->ss = calloc(n, sizeof(*job->ss));
    job->gens = calloc(n, sizeof(*job->gens));
    if (job->ss == NULL || job->gens == NULL) {
        free(job->ss);
        free(job->gens);
        wk_request_free(&job->req);
        free(job);
        baton_http_respond_error(http, 500, "out of memory", "server_error", NULL,
                                 "internal_error");
        count_request(w, route, 500);
        return;
    }
    uint64_t idv = wk_sim_mix(w->id_salt, ++w->id_counter);
    snprintf(job->id, sizeof(job->id), "%s%016llx",
             api == WK_API_CHAT          ? "chatcmpl-"
             : api == WK_API_COMPLETIONS ? "cmpl-"
                                         : "",
             (unsigned long long)idv);
    uint64_t prompt_tokens = 0;
    for (size_t i = 0; i < n; i++) {
        wk_sstate_t *ss = &job->ss[i];
        const wk_item_t *it = &job->req.items[i];
        ss->job = job;
        ss->index = i;
        ss->seq.data = ss;
        ss->first_token = -1;
        wk_stop_t stop;
        wk_item_stop(it, &stop);
        /* a prefill answers as if max_tokens were 1: it computes only the first token */
        uint32_t max = it->max_tokens;
        if (w->cfg.mode == WK_MODE_PREFILL && max > 1)
            max = 1;
        wk_gen_init(&ss->gen, it->seed, max, &stop);
        job->gens[i] = &ss->gen;
        prompt_tokens += it->prompt_tokens;
    }
    inc(w->m_prompt_tokens, (double)prompt_tokens);
    job->next = w->jobs;
    if (w->jobs)
        w->jobs->prev = job;
    w->jobs = job;
    w->n_jobs++;
    http->data = job;
    http->on_abort = on_abort;
    log_debug(COMP, "request id=%s route=%s items=%zu stream=%d pd=%d", job->id, route, n,
              job->req.stream, job->req.has_boot);
    job_start(job);
}

/* ---- simple endpoints ---- */

static void respond_json(baton_http_req_t *req, int status, json_t *j)
{
    char *s = j ? json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(12)) : NULL;
    json_decref(j);
    if (s == NULL) {
        baton_http_respond_error(req, 500, "out of memory", "server_error", NULL, "internal_error");
        return;
    }
    baton_http_respond(req, status, "application/json", NULL, 0, s, strlen(s));
    free(s);
}

static json_t *server_info(wk_worker_t *w)
{
    json_t *boot_port = w->cfg.mode == WK_MODE_PREFILL && w->boot
                            ? json_integer(wk_boot_port(w->boot))
                            : json_null();
    return json_pack("{s:s,s:s,s:s,s:s,s:o,s:i,s:i,s:i,s:s,s:{s:I,s:I,s:I}}", "model_path",
                     w->cfg.model_name, "served_model_name", w->cfg.model_name, "tokenizer_path",
                     "whitespace", "disaggregation_mode",
                     w->cfg.mode == WK_MODE_REGULAR ? "null" : wk_mode_name(w->cfg.mode),
                     "disaggregation_bootstrap_port", boot_port, "max_running_requests",
                     (int)w->cfg.max_batch, "max_queued_requests", (int)w->cfg.max_queue, "port",
                     w->http_port, "version", "baton-worker 0.1.0", "baton_worker",
                     "prefill_us_per_token", (json_int_t)w->cfg.prefill_us_per_token,
                     "decode_us_per_token", (json_int_t)w->cfg.decode_us_per_token,
                     "bootstrap_timeout_ms", (json_int_t)w->cfg.bootstrap_timeout_ms);
}

static void handle_metrics(wk_worker_t *w, baton_http_req_t *req)
{
    if (w->metrics == NULL) {
        baton_http_respond_error(req, 503, "metrics unavailable", "server_error", NULL, NULL);
        return;
    }
    if (w->m_queue)
        baton_gauge_set(w->m_queue, wk_sched_waiting(&w->sched) + w->n_boot_waiting);
    if (w->m_running)
        baton_gauge_set(w->m_running, wk_sched_running(&w->sched));
    if (w->m_inflight)
        baton_gauge_set(w->m_inflight, w->n_jobs);
    if (w->m_boot_waiting)
        baton_gauge_set(w->m_boot_waiting, w->n_boot_waiting);
    if (w->boot) {
        wk_boot_stats_t st;
        wk_boot_get_stats(w->boot, &st);
        if (w->m_boot_conns)
            baton_gauge_set(w->m_boot_conns, st.connections);
        if (st.proto_errors > w->boot_proto_seen) {
            inc(w->m_boot_proto, (double)(st.proto_errors - w->boot_proto_seen));
            w->boot_proto_seen = st.proto_errors;
        }
    }
    baton_buf_t b = BATON_BUF_INIT;
    if (baton_metrics_render(w->metrics, &b) != 0) {
        baton_buf_free(&b);
        baton_http_respond_error(req, 500, "out of memory", "server_error", NULL, NULL);
        return;
    }
    baton_http_respond(req, 200, "text/plain; version=0.0.4; charset=utf-8", NULL, 0,
                       b.data ? b.data : "", b.len);
    baton_buf_free(&b);
}

typedef enum { R_GENERATE, R_CHAT, R_COMPLETIONS, R_GET } route_kind_t;

typedef struct route_s {
    const char *path;
    const char *method;
    route_kind_t kind;
} route_t;

static const route_t routes[] = {
    {"/generate", "POST", R_GENERATE},
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/health", "GET", R_GET},
    {"/health_generate", "GET", R_GET},
    {"/get_server_info", "GET", R_GET},
    {"/server_info", "GET", R_GET},
    {"/get_model_info", "GET", R_GET},
    {"/model_info", "GET", R_GET},
    {"/v1/models", "GET", R_GET},
    {"/get_load", "GET", R_GET},
    {"/metrics", "GET", R_GET},
    {"/flush_cache", "POST", R_GET},
};

static void handle_get(wk_worker_t *w, baton_http_req_t *req, const char *path)
{
    if (strcmp(path, "/health") == 0 || strcmp(path, "/health_generate") == 0) {
        int ok = !w->shutting_down;
        baton_http_respond(req, ok ? 200 : 503, "text/plain", NULL, 0, "", 0);
    } else if (strcmp(path, "/get_server_info") == 0 || strcmp(path, "/server_info") == 0) {
        respond_json(req, 200, server_info(w));
    } else if (strcmp(path, "/get_model_info") == 0 || strcmp(path, "/model_info") == 0) {
        respond_json(req, 200,
                     json_pack("{s:s,s:n,s:b}", "model_path", w->cfg.model_name, "tokenizer_path",
                               "is_generation", 1));
    } else if (strcmp(path, "/v1/models") == 0) {
        respond_json(req, 200,
                     json_pack("{s:s,s:[{s:s,s:s,s:I,s:s,s:s}]}", "object", "list", "data", "id",
                               w->cfg.model_name, "object", "model", "created",
                               (json_int_t)w->started_at, "owned_by", "baton", "root",
                               w->cfg.model_name));
    } else if (strcmp(path, "/get_load") == 0) {
        unsigned waiting = wk_sched_waiting(&w->sched) + w->n_boot_waiting;
        unsigned running = wk_sched_running(&w->sched);
        respond_json(req, 200,
                     json_pack("[{s:i,s:i,s:i,s:i,s:i}]", "dp_rank", 0, "num_reqs",
                               (int)(waiting + running + w->n_boot_pub), "num_waiting_reqs",
                               (int)waiting, "num_running_reqs", (int)running, "num_handoff_reqs",
                               (int)w->n_boot_pub));
    } else if (strcmp(path, "/metrics") == 0) {
        handle_metrics(w, req);
    } else { /* /flush_cache */
        baton_http_respond(req, 200, "text/plain", NULL, 0, "Cache flushed.\n", 15);
    }
}

static void http_handler(baton_http_req_t *req, void *ctx)
{
    wk_worker_t *w = ctx;
    const route_t *match = NULL;
    int path_known = 0;
    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(req->path, routes[i].path) != 0)
            continue;
        path_known = 1;
        if (strcmp(req->method, routes[i].method) == 0 ||
            (strcmp(routes[i].method, "GET") == 0 && strcmp(req->method, "HEAD") == 0)) {
            match = &routes[i];
            break;
        }
    }
    if (match == NULL) {
        if (path_known) {
            baton_http_respond_error(req, 405, "method not allowed", "invalid_request_error", NULL,
                                     "method_not_allowed");
            count_request(w, "other", 405);
        } else {
            char msg[300];
            snprintf(msg, sizeof(msg), "unknown path %.256s", req->path);
            baton_http_respond_error(req, 404, msg, "invalid_request_error", NULL, "not_found");
            count_request(w, "other", 404);
        }
        return;
    }
    switch (match->kind) {
    case R_GENERATE:
        handle_generation(w, req, WK_API_GENERATE, "generate");
        break;
    case R_CHAT:
        handle_generation(w, req, WK_API_CHAT, "chat");
        break;
    case R_COMPLETIONS:
        handle_generation(w, req, WK_API_COMPLETIONS, "completions");
        break;
    default:
        handle_get(w, req, match->path);
        break;
    }
}

/* ---- start / stop ---- */

static void metrics_init(wk_worker_t *w)
{
    w->metrics = baton_metrics_create();
    if (w->metrics == NULL) {
        log_warn(COMP, "metrics_unavailable err=%s", baton_strerror(BATON_ENOMEM));
        return;
    }
    static const char *const rs[] = {"route", "status"};
    static const char *const r[] = {"route"};
    static const char *const res[] = {"result"};
    w->m_requests = baton_metrics_counter(w->metrics, "baton_worker_requests_total",
                                          "Requests answered, by route and HTTP status.", 2, rs);
    w->m_duration = baton_metrics_histogram(w->metrics, "baton_worker_request_duration_seconds",
                                            "Time from request arrival to the end of the answer.",
                                            1, r, baton_latency_buckets, baton_latency_buckets_n);
    baton_metric_family_t *f;
    f = baton_metrics_histogram(w->metrics, "baton_worker_time_to_first_token_seconds",
                                "Time from request arrival to its first generated token.", 0, NULL,
                                baton_latency_buckets, baton_latency_buckets_n);
    w->m_ttft = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_counter(w->metrics, "baton_worker_prompt_tokens_total",
                              "Prompt tokens of accepted requests.", 0, NULL);
    w->m_prompt_tokens = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_counter(w->metrics, "baton_worker_generation_tokens_total",
                              "Tokens generated (completion tokens).", 0, NULL);
    w->m_gen_tokens = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_gauge(w->metrics, "baton_worker_queue_depth",
                            "Sequences waiting: for prefill, for a decode slot, or for their "
                            "prefill peer.",
                            0, NULL);
    w->m_queue = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_gauge(w->metrics, "baton_worker_running_sequences",
                            "Sequences in the running (decode) batch.", 0, NULL);
    w->m_running = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_gauge(w->metrics, "baton_worker_inflight_requests",
                            "HTTP generation requests in flight.", 0, NULL);
    w->m_inflight = f ? baton_metric_child(f, NULL) : NULL;
    if (w->cfg.mode == WK_MODE_REGULAR)
        return;
    f = baton_metrics_gauge(w->metrics, "baton_worker_bootstrap_waiting",
                            "Decode sequences waiting for their prefill rendezvous.", 0, NULL);
    w->m_boot_waiting = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_gauge(w->metrics, "baton_worker_bootstrap_connections",
                            "Open bootstrap connections.", 0, NULL);
    w->m_boot_conns = f ? baton_metric_child(f, NULL) : NULL;
    f = baton_metrics_counter(w->metrics, "baton_worker_bootstrap_rooms_total",
                              "Rooms handed off (ok) or failed, by result.", 1, res);
    if (f) {
        static const char *const ok[] = {"ok"}, *const failed[] = {"failed"};
        w->m_rooms_ok = baton_metric_child(f, ok);
        w->m_rooms_failed = baton_metric_child(f, failed);
    }
    f = baton_metrics_counter(w->metrics, "baton_worker_bootstrap_protocol_errors_total",
                              "Bootstrap connections closed for a malformed frame.", 0, NULL);
    w->m_boot_proto = f ? baton_metric_child(f, NULL) : NULL;
}

int wk_worker_start(wk_worker_t *w, uv_loop_t *loop, const wk_config_t *cfg)
{
    memset(w, 0, sizeof(*w));
    w->loop = loop;
    w->cfg = *cfg;
    w->started_at = (long long)time(NULL);
    w->id_salt = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
    wk_sched_cfg_t sc = {
        .prefill_ns_per_token = cfg->prefill_us_per_token * 1000,
        .decode_ns_per_step = cfg->decode_us_per_token * 1000,
        .max_batch = cfg->max_batch,
    };
    int rc = wk_sched_init(&w->sched, &sc, on_prefilled, on_decoded, w);
    if (rc != 0) {
        log_error(COMP, "start_failed what=scheduler err=%s", baton_strerror(rc));
        return rc;
    }
    uv_timer_init(loop, &w->sched_timer);
    w->sched_timer.data = w;
    uv_idle_init(loop, &w->sched_idle);
    w->sched_idle.data = w;
    metrics_init(w);

    if (cfg->mode != WK_MODE_REGULAR) {
        rc = wk_boot_create(&w->boot, loop, cfg->bootstrap_timeout_ms);
        if (rc != 0) {
            log_error(COMP, "start_failed what=bootstrap err=%s", baton_strerror(rc));
            return rc;
        }
    }
    if (cfg->mode == WK_MODE_PREFILL) {
        rc = wk_boot_listen(w->boot, cfg->host, cfg->bootstrap_port);
        if (rc != 0) {
            log_error(COMP, "start_failed what=bootstrap_listen addr=%s:%d err=%s", cfg->host,
                      cfg->bootstrap_port, baton_strerror(rc));
            return rc;
        }
    }
    rc = baton_http_server_create(&w->http, loop, NULL, http_handler, w);
    if (rc != 0) {
        log_error(COMP, "start_failed what=http err=%s", baton_strerror(rc));
        return rc;
    }
    rc = baton_http_server_listen(w->http, cfg->host, cfg->port, 0);
    if (rc != 0) {
        log_error(COMP, "start_failed what=listen addr=%s:%d err=%s", cfg->host, cfg->port,
                  baton_strerror(rc));
        return rc;
    }
    w->http_port = baton_http_server_port(w->http);
    log_info(COMP,
             "started mode=%s model=%s max_batch=%u max_queue=%u prefill_us_per_token=%llu "
             "decode_us_per_token=%llu bootstrap_timeout_ms=%llu",
             wk_mode_name(cfg->mode), cfg->model_name, cfg->max_batch, cfg->max_queue,
             (unsigned long long)cfg->prefill_us_per_token,
             (unsigned long long)cfg->decode_us_per_token,
             (unsigned long long)cfg->bootstrap_timeout_ms);
    if (cfg->mode == WK_MODE_PREFILL)
        log_info(COMP, "bootstrap_listening addr=%s:%d", cfg->host, wk_boot_port(w->boot));
    log_info(COMP, "listening addr=%s:%d", cfg->host, w->http_port);
    return 0;
}

/* ---- shutdown ---- */

/* One worker per process: the server's close callback carries no context. */
static wk_worker_t *closing_worker;
static unsigned pending_closes;

static void maybe_closed(wk_worker_t *w)
{
    if (--pending_closes > 0)
        return;
    wk_sched_free(&w->sched);
    if (w->metrics)
        baton_metrics_destroy(w->metrics);
    w->metrics = NULL;
    log_info(COMP, "stopped");
    if (w->on_closed)
        w->on_closed(w);
}

static void handle_closed_cb(uv_handle_t *h)
{
    maybe_closed(h->data);
}

static void boot_closed_cb(void *arg)
{
    maybe_closed(arg);
}

static void http_closed_cb(baton_http_server_t *srv)
{
    wk_worker_t *w = closing_worker;
    w->http = NULL;
    /* every request was aborted and finished by now; anything left is a bug worth a line */
    while (w->jobs) {
        log_error(COMP, "shutdown_leftover_request id=%s", w->jobs->id);
        job_cancel_all(w->jobs);
        job_unlink_free(w->jobs);
    }
    if (w->boot) {
        pending_closes++;
        wk_boot_close(w->boot, boot_closed_cb, w);
        w->boot = NULL;
    }
    pending_closes += 2;
    uv_close((uv_handle_t *)&w->sched_timer, handle_closed_cb);
    uv_close((uv_handle_t *)&w->sched_idle, handle_closed_cb);
    maybe_closed(w); /* the server's own share */
}

void wk_worker_shutdown(wk_worker_t *w, void (*on_closed)(wk_worker_t *w))
{
    if (w->shutting_down)
        return;
    log_info(COMP, "shutting_down inflight=%u", w->n_jobs);
    w->shutting_down = 1;
    w->on_closed = on_closed;
    closing_worker = w;
    pending_closes = 1;
    if (w->http)
        baton_http_server_close(w->http, http_closed_cb);
    else
        http_closed_cb(NULL);
}
