/* http_api.c — baton-worker's HTTP API and request life cycle: parse, schedule, hand the KV off,
 * answer. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "http/tls.h"
#include "worker/render.h"
#include "worker/request.h"
#include "worker/simtext.h"
#include "worker/worker.h"

#define COMP                 "worker"
#define SCHED_STEPS_PER_TURN 64 /* steps done per loop turn before yielding to I/O */

/* One sequence of a job: scheduler entry, generator, KV room, stream position. */
typedef struct wk_sstate_s {
    wk_seq_t seq;
    wk_job_t *job;
    size_t index;
    wk_gen_t gen;
    wk_stream_state_t st;
    wk_kv_recv_t *recv; /* decode: its room, until the sequence ends */
    wk_kv_send_t *send; /* prefill: its room, until DONE went out */
    int kv_waiting;     /* counted in w->n_kv_waiting */
    int handed_off;     /* prefill: computed, counted in w->n_boot_pub */
    int matched;
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
    size_t n_done, n_booted, n_matched;
    int streaming; /* the SSE response has started */
    int ttft_seen;
    const char *route;
    baton_list_t link; /* in w->jobs */

    /* KV page slots for every sequence of the job, reserved at once */
    wk_kv_resv_t resv;
    uint32_t *slots;
    uint32_t n_slots;
    int resv_queued;

    /* the rendezvous deadline (bootstrap timeout), in the worker's FIFO of deadlines */
    baton_list_t dl_link; /* in w->deadlines while linked (points at itself otherwise) */
    uint64_t deadline_ms;
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
    wk_kvshape_preset(WK_KV_DEFAULT_PRESET, &cfg->shape);
    cfg->preset = WK_KV_DEFAULT_PRESET;
    cfg->kv_pool_tokens = 0; /* auto */
    cfg->transports[0] = BATON_XFER_TRANSPORT_SHM;
    cfg->transports[1] = BATON_XFER_TRANSPORT_TCP;
    cfg->n_transports = 2;
    cfg->layerwise = 1;
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
    char st[16];
    if (status > 0)
        snprintf(st, sizeof(st), "%d", status);
    else
        snprintf(st, sizeof(st), "aborted");
    const char *labels[2] = {route, st};
    baton_counter_inc_labels(w->m_requests, labels);
}

/* The OpenAI error type of an HTTP status. */
static const char *error_type(int status)
{
    return status >= 500 ? "server_error" : "invalid_request_error";
}

/* Answers a request that never became a job. */
static void reject(wk_worker_t *w, baton_http_req_t *http, const char *route, int status,
                   const char *message, const char *param, const char *code)
{
    baton_http_respond_error(http, status, message, error_type(status), param, code);
    count_request(w, route, status);
}

static void observe_duration(wk_worker_t *w, const char *route, uint64_t start_ns)
{
    const char *labels[1] = {route};
    baton_histogram_observe(baton_metric_child(w->m_duration, labels),
                            baton_seconds_since(start_ns));
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

/* ---- rendezvous deadlines: one timer for a FIFO (every job waits the same time) ---- */

static void job_fail_err(wk_job_t *job, int err, const char *what, const char *detail);
static void job_fail_pool(wk_job_t *job);
static void dl_timer_cb(uv_timer_t *t);

static wk_job_t *dl_first(const wk_worker_t *w)
{
    baton_list_t *first = baton_list_first(&w->deadlines);
    return first ? container_of(first, wk_job_t, dl_link) : NULL;
}

static void dl_arm(wk_worker_t *w)
{
    wk_job_t *head = dl_first(w);
    if (head == NULL) {
        uv_timer_stop(&w->dl_timer);
        return;
    }
    uint64_t now = baton_now_ms();
    uint64_t due = head->deadline_ms;
    uv_timer_start(&w->dl_timer, dl_timer_cb, due > now ? due - now : 0, 0);
}

static void dl_unlink(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    if (baton_list_empty(&job->dl_link))
        return;
    int was_head = dl_first(w) == job;
    baton_list_remove(&job->dl_link);
    if (was_head && !w->shutting_down)
        dl_arm(w);
}

static void dl_link(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    job->deadline_ms = baton_now_ms() + w->cfg.bootstrap_timeout_ms;
    baton_list_push(&w->deadlines, &job->dl_link);
    if (dl_first(w) == job)
        dl_arm(w);
}

static void dl_timer_cb(uv_timer_t *t)
{
    wk_worker_t *w = t->data;
    uint64_t now = baton_now_ms();
    wk_job_t *job;
    while ((job = dl_first(w)) != NULL && job->deadline_ms <= now) {
        dl_unlink(job);
        if (job->resv_queued)
            job_fail_pool(job);
        else
            job_fail_err(job, BATON_ETIMEOUT, w->cfg.mode == WK_MODE_DECODE ? "decode" : "prefill",
                         NULL);
    }
    dl_arm(w);
}

/* ---- job life cycle ---- */

static void job_unlink_free(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    baton_list_remove(&job->link);
    w->n_jobs--;
    for (size_t i = 0; i < job->req.n_items; i++)
        wk_gen_free(&job->ss[i].gen);
    free(job->ss);
    free(job->gens);
    free(job->slots);
    wk_request_free(&job->req);
    free(job);
}

static void seq_kv_wait_end(wk_sstate_t *ss)
{
    if (ss->kv_waiting) {
        ss->kv_waiting = 0;
        ss->job->w->n_kv_waiting--;
    }
}

static void seq_handoff_end(wk_sstate_t *ss)
{
    if (ss->handed_off) {
        ss->handed_off = 0;
        ss->job->w->n_boot_pub--;
    }
}

/* Takes every sequence out of the scheduler and lets go of its KV room (aborting it when it is
 * still open; its pages come back under the fencing rule). No callback follows. `reason` labels
 * the rooms' failure in the metrics. */
static void job_cancel_all(wk_job_t *job, const char *reason)
{
    wk_worker_t *w = job->w;
    dl_unlink(job);
    if (job->resv_queued) {
        job->resv_queued = 0;
        wk_kv_reserve_cancel(w->kv, &job->resv);
    }
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        wk_sched_cancel(&w->sched, &ss->seq);
        seq_kv_wait_end(ss);
        seq_handoff_end(ss);
        if (ss->recv) {
            wk_kv_recv_drop(ss->recv, reason);
            ss->recv = NULL;
        }
        if (ss->send) {
            wk_kv_send_drop(ss->send, reason);
            ss->send = NULL;
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
    ctx->e2e_s = baton_seconds_since(job->start_ns);
}

static void job_fail_reason(wk_job_t *job, int status, const char *message, const char *code,
                            const char *reason)
{
    wk_worker_t *w = job->w;
    job_cancel_all(job, reason);
    const char *type = error_type(status);
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

static void job_fail_pool(wk_job_t *job)
{
    char msg[200];
    snprintf(msg, sizeof(msg),
             "no KV pages free for this request within %llu ms (it needs %u of the pool's %u page "
             "slots)",
             (unsigned long long)job->w->cfg.bootstrap_timeout_ms, job->n_slots,
             wk_kv_pool_slots(job->w->kv));
    job_fail_reason(job, 503, msg, "kv_pool_exhausted", "pool_exhausted");
}

/* Maps a KV hand-off error to the answer (docs/WORKER.md, "Failures"). */
static void job_fail_err(wk_job_t *job, int err, const char *what, const char *detail)
{
    char msg[512];
    int status = 502;
    const char *code = "bootstrap_failed", *reason = "canceled";
    const char *d = detail && detail[0] ? detail : NULL;
    switch (err) {
    case BATON_ETIMEOUT:
        status = 504;
        code = "bootstrap_timeout";
        reason = "timeout";
        snprintf(msg, sizeof(msg), "%s: no rendezvous within %llu ms", what,
                 (unsigned long long)job->w->cfg.bootstrap_timeout_ms);
        break;
    case BATON_EABORTED:
        code = "bootstrap_aborted";
        snprintf(msg, sizeof(msg), "%s: the peer aborted the room", what);
        break;
    case BATON_EPEERDOWN:
        code = "bootstrap_peer_down";
        snprintf(msg, sizeof(msg), "%s: the KV transfer peer went down", what);
        break;
    case WK_EUNREACHABLE:
        code = "bootstrap_unreachable";
        snprintf(msg, sizeof(msg), "%s: the prefill's bootstrap port is unreachable", what);
        break;
    case WK_EMISMATCH:
        status = 500;
        code = "bootstrap_mismatch";
        snprintf(msg, sizeof(msg), "%s: bootstrap mismatch: %s", what,
                 d ? d : "prefill and decode disagree about the room");
        d = NULL;
        break;
    case BATON_EKVCORRUPT:
        status = 500;
        code = "kv_corrupted";
        snprintf(msg, sizeof(msg), "%s: KV cache verification failed: %s", what,
                 d ? d : "received bytes differ");
        d = NULL;
        break;
    case BATON_ENOTSUP:
    case BATON_ERKEY:
    case BATON_ESTALE:
        code = "bootstrap_refused";
        snprintf(msg, sizeof(msg), "%s: the KV transfer was refused: %s", what,
                 baton_strerror(err));
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
    default:
        snprintf(msg, sizeof(msg), "%s: %s", what, baton_strerror(err));
        break;
    }
    if (d) {
        size_t n = strlen(msg);
        snprintf(msg + n, sizeof(msg) - n, " (%s)", d);
    }
    job_fail_reason(job, status, msg, code, reason);
}

/* Sends whatever item i's client has not seen yet (streaming only). */
static void job_emit(wk_job_t *job, wk_sstate_t *ss)
{
    wk_worker_t *w = job->w;
    if (!job->ttft_seen && ss->gen.n_tokens > 0) {
        job->ttft_seen = 1;
        baton_histogram_observe(w->m_ttft, baton_seconds_since(job->start_ns));
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

/* Adds a generated token and streams what it made visible. 0, or -1 after failing the job. */
static int seq_push(wk_sstate_t *ss, int32_t token, const char *what)
{
    if (wk_gen_push(&ss->gen, token) != 0) {
        job_fail_err(ss->job, BATON_ENOMEM, what, NULL);
        return -1;
    }
    job_emit(ss->job, ss);
    return 0;
}

/* Marks a sequence finished; returns 1 when it was the job's last (call job_complete then). A
 * decode sequence gives its KV pages back here. */
static int seq_finish(wk_sstate_t *ss)
{
    wk_job_t *job = ss->job;
    if (ss->done)
        return 0;
    ss->done = 1;
    if (ss->recv) {
        wk_kv_recv_drop(ss->recv, "done");
        ss->recv = NULL;
    }
    baton_counter_add(job->w->m_gen_tokens, ss->gen.n_tokens);
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
    job_cancel_all(job, "done"); /* nothing is left open by now; this only tidies */
    job_unlink_free(job);
}

/* After a step: 1 while the sequence goes on decoding, else 0 (the job completes with its last
 * sequence). */
static int seq_continue(wk_sstate_t *ss)
{
    if (ss->gen.finish == WK_FINISH_NONE)
        return 1;
    if (seq_finish(ss))
        job_complete(ss->job);
    return 0;
}

static void on_abort(baton_http_req_t *http)
{
    wk_job_t *job = http->data;
    wk_worker_t *w = job->w;
    log_info(COMP, "request_aborted id=%s route=%s reason=client_gone", job->id, job->route);
    job_cancel_all(job, "canceled");
    if (job->streaming)
        baton_http_stream_end(http);
    else
        baton_http_respond_error(http, 499, "client closed the request", "server_error", NULL,
                                 "client_closed");
    count_request(w, job->route, 0);
    job_unlink_free(job);
}

/* ---- a sequence's prompt for the KV hand-off ---- */

/* Fills *pr for item i; *tmp_p is an allocation to free after use (NULL when none). */
static int item_prompt(const wk_item_t *it, wk_kv_prompt_t *pr, int64_t **tmp_p)
{
    *tmp_p = NULL;
    pr->n_tokens = it->prompt_tokens;
    pr->seed = it->seed;
    pr->want_first = it->max_tokens > 0;
    if (it->ids != NULL) {
        pr->ids = it->ids; /* a token-id prompt: its ids are the tokens */
        return 0;
    }
    int64_t *ids = malloc((size_t)it->prompt_tokens * sizeof(*ids));
    if (ids == NULL)
        return BATON_ENOMEM;
    wk_sim_word_ids(it->prompt ? it->prompt : "", it->prompt_len, ids, it->prompt_tokens);
    pr->ids = ids;
    *tmp_p = ids;
    return 0;
}

/* Page slots every sequence of the job needs, in item order. */
static uint32_t job_slots_needed(wk_job_t *job)
{
    uint64_t n = 0;
    for (size_t i = 0; i < job->req.n_items; i++)
        n += wk_kv_slots_for(job->w->kv, job->req.items[i].prompt_tokens);
    return n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
}

/* Reserves the job's slots; then() runs once they are there (now or later). 0 when reserved or
 * queued; on an error the job has failed. */
static int job_reserve(wk_job_t *job, void (*then)(wk_job_t *job), wk_kv_resv_cb cb)
{
    wk_worker_t *w = job->w;
    job->n_slots = job_slots_needed(job);
    job->slots = malloc((size_t)job->n_slots * sizeof(*job->slots));
    if (job->slots == NULL) {
        job_fail_err(job, BATON_ENOMEM, "kv pages", NULL);
        return BATON_ENOMEM;
    }
    int rc = wk_kv_reserve(w->kv, &job->resv, job->n_slots, job->slots, cb, job);
    if (rc == BATON_ETOOBIG || rc < 0) {
        char msg[200];
        snprintf(msg, sizeof(msg),
                 "the prompt needs %u KV page slots, more than the whole pool (%u); raise "
                 "--kv-pool-tokens",
                 job->n_slots, wk_kv_pool_slots(w->kv));
        job_fail_reason(job, 503, msg, "kv_pool_exhausted", "pool_exhausted");
        return BATON_ETOOBIG;
    }
    if (rc == 1) {
        job->resv_queued = 1;
        return 0;
    }
    then(job);
    return 0;
}

/* ---- scheduler callbacks ---- */

static void on_layer(wk_sched_t *s, wk_seq_t *seq, uint32_t layer)
{
    wk_sstate_t *ss = seq->data;
    /* The KV of the layer exists now either way (filling it is the simulation's stand-in for
     * computing it, so it overlaps the compute in both modes); only layer-wise sends it now. */
    if (ss->send)
        wk_kv_send_layer(ss->send, layer, ss->job->w->cfg.layerwise);
}

static int on_prefilled(wk_sched_t *s, wk_seq_t *seq)
{
    wk_sstate_t *ss = seq->data;
    wk_job_t *job = ss->job;
    wk_worker_t *w = job->w;
    const wk_item_t *it = &job->req.items[ss->index];
    if (w->cfg.mode == WK_MODE_PREFILL) {
        int32_t first = it->max_tokens > 0 ? wk_sim_token(it->seed, 0) : -1;
        if (ss->gen.finish == WK_FINISH_NONE && wk_gen_push(&ss->gen, first) != 0) {
            job_fail_err(job, BATON_ENOMEM, "prefill", NULL);
            return 0;
        }
        /* the rest of the KV goes out now; the answer waits for DONE */
        ss->handed_off = 1;
        w->n_boot_pub++;
        wk_kv_send_finish(ss->send, first);
        return 0;
    }
    /* regular: the first token comes out of prefill, the rest out of decode steps */
    if (ss->gen.finish == WK_FINISH_NONE && seq_push(ss, wk_gen_next_id(&ss->gen), "generate"))
        return 0;
    return seq_continue(ss);
}

static int on_decoded(wk_sched_t *s, wk_seq_t *seq)
{
    wk_sstate_t *ss = seq->data;
    if (seq_push(ss, wk_gen_next_id(&ss->gen), "generate"))
        return 0;
    return seq_continue(ss);
}

/* ---- prefill: match rooms, reserve source pages, compute, hand off ---- */

static void on_sent(void *data, int status, const char *detail)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    ss->send = NULL;
    seq_handoff_end(ss);
    if (status != 0) {
        job_fail_err(job, status, "prefill handoff", detail);
        return;
    }
    if (seq_finish(ss))
        job_complete(job);
}

/* Every room met its offer and the source pages are reserved: compute. */
static void prefill_go(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    job->resv_queued = 0;
    dl_unlink(job);
    uint32_t off = 0;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        uint32_t n = wk_kv_slots_for(w->kv, job->req.items[i].prompt_tokens);
        if (wk_kv_send_slots(ss->send, job->slots + off) != 0) {
            wk_kv_unreserve(w->kv, job->slots + off, job->n_slots - off);
            job_fail_err(job, BATON_ENOMEM, "prefill", NULL);
            return;
        }
        off += n;
    }
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        seq_kv_wait_end(ss);
        ss->seq.prompt_tokens = job->req.items[i].prompt_tokens;
        wk_sched_submit_prefill(&w->sched, &ss->seq);
    }
    sched_kick(w);
}

static void on_prefill_slots(wk_kv_resv_t *r)
{
    prefill_go(r->w.data);
}

static void on_matched(void *data)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    if (ss->matched)
        return;
    ss->matched = 1;
    if (++job->n_matched == job->req.n_items)
        job_reserve(job, prefill_go, on_prefill_slots);
}

/* ---- decode: reserve pages, offer the rooms, verify, decode ---- */

/* Every room of the job has its KV; start answering. */
static void decode_begin(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    int all_done = 0, submitted = 0;
    dl_unlink(job);
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        if (ss->gen.finish == WK_FINISH_NONE && seq_push(ss, ss->first_token, "decode"))
            return;
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

static void on_received(void *data, int status, const wk_kv_got_t *got, const char *detail)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    if (status != 0) {
        ss->recv = NULL; /* gone with the failure */
        job_fail_err(job, status, "decode", detail);
        return;
    }
    seq_kv_wait_end(ss);
    /* the generator continues from what the KV says: its seed and the first token */
    ss->gen.seed = got->seed;
    ss->first_token = got->first_token;
    if (++job->n_booted == job->req.n_items)
        decode_begin(job);
}

static void decode_offer(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    job->resv_queued = 0;
    uint32_t off = 0;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        const wk_item_t *it = &job->req.items[i];
        uint32_t n = wk_kv_slots_for(w->kv, it->prompt_tokens);
        wk_kv_prompt_t pr;
        int64_t *tmp = NULL;
        int rc = item_prompt(it, &pr, &tmp);
        if (rc == 0)
            rc = wk_kv_recv_start(w->kv, it->boot_host, it->boot_port, it->room, &pr,
                                  job->slots + off, on_received, ss, &ss->recv);
        free(tmp);
        if (rc != 0) {
            /* the slots of the rooms that started are theirs now; the rest come back */
            wk_kv_unreserve(w->kv, job->slots + off, job->n_slots - off);
            job_fail_err(job, rc, "decode", NULL);
            return;
        }
        off += n;
    }
}

static void on_decode_slots(wk_kv_resv_t *r)
{
    decode_offer(r->w.data);
}

/* ---- request entry ---- */

static void job_start(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk_mode_t mode = w->cfg.mode;
    if (mode == WK_MODE_REGULAR) {
        for (size_t i = 0; i < job->req.n_items; i++) {
            wk_sstate_t *ss = &job->ss[i];
            ss->seq.prompt_tokens = job->req.items[i].prompt_tokens;
            wk_sched_submit_prefill(&w->sched, &ss->seq);
        }
        sched_kick(w);
        return;
    }
    for (size_t i = 0; i < job->req.n_items; i++) {
        job->ss[i].kv_waiting = 1;
        w->n_kv_waiting++;
    }
    dl_link(job);
    if (mode == WK_MODE_DECODE) {
        job_reserve(job, decode_offer, on_decode_slots);
        return;
    }
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        const wk_item_t *it = &job->req.items[i];
        wk_kv_prompt_t pr;
        int64_t *tmp = NULL;
        int rc = item_prompt(it, &pr, &tmp);
        if (rc == 0)
            rc = wk_kv_send_open(w->kv, it->room, &pr, on_matched, on_sent, ss, &ss->send);
        free(tmp);
        if (rc != 0) {
            job_fail_err(job, rc, "prefill", NULL);
            return;
        }
    }
}

static void handle_generation(wk_worker_t *w, baton_http_req_t *http, wk_api_t api)
{
    const char *route = wk_api_name(api); /* the metrics' route label */
    uint64_t start_ns = uv_hrtime();
    wk_parse_err_t perr = {0};
    wk_job_t *job = calloc(1, sizeof(*job));
    if (job != NULL)
        baton_list_init(&job->dl_link);
    if (job == NULL) {
        reject(w, http, route, 500, "out of memory", NULL, "internal_error");
        return;
    }
    int rc = wk_request_parse(&job->req, api, http->body, http->body_len, &perr);
    if (rc != 0) {
        free(job);
        reject(w, http, route, perr.status, perr.message, perr.param[0] ? perr.param : NULL,
               perr.code);
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
    unsigned waiting = wk_sched_waiting(&w->sched) + w->n_kv_waiting;
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
        if (status != 400 && w->cfg.mode == WK_MODE_PREFILL && w->kv)
            for (size_t i = 0; i < job->req.n_items; i++)
                if (job->req.items[i].has_boot)
                    wk_kv_send_refuse(w->kv, job->req.items[i].room);
        wk_request_free(&job->req);
        free(job);
        reject(w, http, route, status, bad, status == 400 ? "bootstrap_room" : NULL, code);
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
        reject(w, http, route, 500, "out of memory", NULL, "internal_error");
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
    baton_counter_add(w->m_prompt_tokens, (double)prompt_tokens);
    baton_list_push(&w->jobs, &job->link);
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
    json_t *boot_port = w->cfg.mode == WK_MODE_PREFILL && w->kv
                            ? json_integer(wk_kv_listen_port(w->kv))
                            : json_null();
    char tps[64];
    wk_kv_transport_list(w->cfg.transports, w->cfg.n_transports, tps, sizeof(tps));
    const wk_kvshape_t *sh = &w->cfg.shape;
    json_t *kv =
        json_pack("{s:s,s:i,s:i,s:i,s:i,s:i,s:I,s:I,s:s,s:b}", "preset",
                  w->cfg.preset ? w->cfg.preset : "custom", "layers", (int)sh->layers, "kv_heads",
                  (int)sh->kv_heads, "head_dim", (int)sh->head_dim, "dtype_bytes",
                  (int)sh->dtype_bytes, "page_tokens", (int)sh->page_tokens,
                  "token_bytes_per_layer", (json_int_t)wk_kvshape_token_bytes(sh), "pool_tokens",
                  (json_int_t)(w->kv ? (uint64_t)wk_kv_pool_slots(w->kv) * sh->page_tokens : 0),
                  "transport", tps, "layerwise", w->cfg.layerwise);
    return json_pack(
        "{s:s,s:s,s:s,s:s,s:o,s:i,s:i,s:i,s:s,s:{s:I,s:I,s:I},s:o}", "model_path",
        w->cfg.model_name, "served_model_name", w->cfg.model_name, "tokenizer_path", "whitespace",
        "disaggregation_mode", w->cfg.mode == WK_MODE_REGULAR ? "null" : wk_mode_name(w->cfg.mode),
        "disaggregation_bootstrap_port", boot_port, "max_running_requests", (int)w->cfg.max_batch,
        "max_queued_requests", (int)w->cfg.max_queue, "port", w->http_port, "version",
        "baton-worker 0.1.0", "baton_worker", "prefill_us_per_token",
        (json_int_t)w->cfg.prefill_us_per_token, "decode_us_per_token",
        (json_int_t)w->cfg.decode_us_per_token, "bootstrap_timeout_ms",
        (json_int_t)w->cfg.bootstrap_timeout_ms, "kv", kv ? kv : json_null());
}

static void handle_metrics(wk_worker_t *w, baton_http_req_t *req)
{
    if (w->metrics == NULL) {
        baton_http_respond_error(req, 503, "metrics unavailable", "server_error", NULL, NULL);
        return;
    }
    baton_gauge_set(w->m_queue, wk_sched_waiting(&w->sched) + w->n_kv_waiting);
    baton_gauge_set(w->m_running, wk_sched_running(&w->sched));
    baton_gauge_set(w->m_inflight, w->n_jobs);
    baton_gauge_set(w->m_boot_waiting, w->n_kv_waiting);
    if (w->kv)
        wk_kv_metrics_sync(w->kv);
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
        unsigned waiting = wk_sched_waiting(&w->sched) + w->n_kv_waiting;
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
        handle_generation(w, req, WK_API_GENERATE);
        break;
    case R_CHAT:
        handle_generation(w, req, WK_API_CHAT);
        break;
    case R_COMPLETIONS:
        handle_generation(w, req, WK_API_COMPLETIONS);
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
    w->m_requests = baton_metrics_counter(w->metrics, "baton_worker_requests_total",
                                          "Requests answered, by route and HTTP status.", 2, rs);
    w->m_duration = baton_metrics_histogram(w->metrics, "baton_worker_request_duration_seconds",
                                            "Time from request arrival to the end of the answer.",
                                            1, r, baton_latency_buckets, baton_latency_buckets_n);
    baton_metric_family_t *f;
    f = baton_metrics_histogram(w->metrics, "baton_worker_time_to_first_token_seconds",
                                "Time from request arrival to its first generated token.", 0, NULL,
                                baton_latency_buckets, baton_latency_buckets_n);
    w->m_ttft = baton_metric_child(f, NULL);
    f = baton_metrics_counter(w->metrics, "baton_worker_prompt_tokens_total",
                              "Prompt tokens of accepted requests.", 0, NULL);
    w->m_prompt_tokens = baton_metric_child(f, NULL);
    f = baton_metrics_counter(w->metrics, "baton_worker_generation_tokens_total",
                              "Tokens generated (completion tokens).", 0, NULL);
    w->m_gen_tokens = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(w->metrics, "baton_worker_queue_depth",
                            "Sequences waiting: for prefill, for a decode slot, or for their "
                            "prefill peer.",
                            0, NULL);
    w->m_queue = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(w->metrics, "baton_worker_running_sequences",
                            "Sequences in the running (decode) batch.", 0, NULL);
    w->m_running = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(w->metrics, "baton_worker_inflight_requests",
                            "HTTP generation requests in flight.", 0, NULL);
    w->m_inflight = baton_metric_child(f, NULL);
    if (w->cfg.mode == WK_MODE_REGULAR)
        return;
    f = baton_metrics_gauge(w->metrics, "baton_worker_bootstrap_waiting",
                            "PD sequences waiting for their peer's room or for KV pages.", 0, NULL);
    w->m_boot_waiting = baton_metric_child(f, NULL);
}

int wk_worker_start(wk_worker_t *w, uv_loop_t *loop, const wk_config_t *cfg)
{
    memset(w, 0, sizeof(*w));
    baton_list_init(&w->jobs);
    baton_list_init(&w->deadlines);
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

    uv_timer_init(loop, &w->dl_timer);
    w->dl_timer.data = w;
    if (cfg->mode != WK_MODE_REGULAR) {
        wk_kv_cfg_t kc;
        memset(&kc, 0, sizeof(kc));
        kc.prefill = cfg->mode == WK_MODE_PREFILL;
        kc.listen_host = cfg->host;
        kc.listen_port = cfg->bootstrap_port;
        kc.shape = cfg->shape;
        kc.pool_tokens =
            cfg->kv_pool_tokens ? cfg->kv_pool_tokens : wk_kvshape_auto_pool_tokens(&cfg->shape);
        memcpy(kc.transports, cfg->transports, sizeof(kc.transports));
        kc.n_transports = cfg->n_transports;
        kc.timeout_ms = cfg->bootstrap_timeout_ms;
        kc.fault_corrupt_every = cfg->fault_corrupt_kv_every;
        /* logs "bootstrap_listening addr=H:P" (libbaton) once the prefill listens */
        rc = wk_kv_create(&w->kv, loop, &kc, w->metrics);
        if (rc != 0) {
            log_error(COMP, "start_failed what=kv_transfer err=%s", baton_strerror(rc));
            return rc;
        }
        if (cfg->mode == WK_MODE_PREFILL)
            wk_sched_set_layers(&w->sched, cfg->shape.layers, on_layer);
    }
    rc = baton_http_server_create(&w->http, loop, NULL, http_handler, w);
    if (rc != 0) {
        log_error(COMP, "start_failed what=http err=%s", baton_strerror(rc));
        return rc;
    }
    if (cfg->tls) {
        baton_http_server_set_tls(w->http, cfg->tls);
        if (w->metrics)
            baton_tls_metrics_init(w->metrics);
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
             "decode_us_per_token=%llu bootstrap_timeout_ms=%llu layerwise=%d",
             wk_mode_name(cfg->mode), cfg->model_name, cfg->max_batch, cfg->max_queue,
             (unsigned long long)cfg->prefill_us_per_token,
             (unsigned long long)cfg->decode_us_per_token,
             (unsigned long long)cfg->bootstrap_timeout_ms, cfg->layerwise);
    log_info(COMP, "listening addr=%s:%d tls=%s", cfg->host, w->http_port, cfg->tls ? "on" : "off");
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

static void kv_closed_cb(void *arg)
{
    maybe_closed(arg);
}

static void http_closed_cb(baton_http_server_t *srv)
{
    wk_worker_t *w = closing_worker;
    w->http = NULL;
    /* every request was aborted and finished by now; anything left is a bug worth a line */
    while (!baton_list_empty(&w->jobs)) {
        /* newest first */
        wk_job_t *job = container_of(w->jobs.prev, wk_job_t, link);
        log_error(COMP, "shutdown_leftover_request id=%s", job->id);
        job_cancel_all(job, "shutdown");
        job_unlink_free(job);
    }
    if (w->kv) {
        pending_closes++;
        wk_kv_close(w->kv, kv_closed_cb, w);
        w->kv = NULL;
    }
    pending_closes += 3;
    uv_close((uv_handle_t *)&w->sched_timer, handle_closed_cb);
    uv_close((uv_handle_t *)&w->sched_idle, handle_closed_cb);
    uv_close((uv_handle_t *)&w->dl_timer, handle_closed_cb);
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
