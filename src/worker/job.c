/* job.c — a generation request's life cycle in baton-worker (see job.h): admission, the job and
 * sequence phases, rendezvous deadlines, streaming and the final answer, failures, client
 * aborts, the scheduler's callbacks. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/clock.h"
#include "common/log.h"
#include "worker/continuation.h"
#include "worker/responses_store.h"
#include "worker/job.h"
#include "worker/vllm.h"
#include "worker/render.h"

#define COMP "worker"

/* ---- phases ------------------------------------------------------------------------------- */

#define B(p) BATON_PHASE_BIT(p)
#define ENDS (B(WK_JOB_FAILED) | B(WK_JOB_ABORTED))
static const uint32_t job_legal[WK_JOB_N_PHASES] = {
    [WK_JOB_NEW] = B(WK_JOB_RUNNING) | B(WK_JOB_MATCHING) | B(WK_JOB_PAGES) | ENDS,
    [WK_JOB_MATCHING] = B(WK_JOB_PAGES) | ENDS,
    [WK_JOB_PAGES] = B(WK_JOB_RUNNING) | B(WK_JOB_RECEIVING) | ENDS,
    [WK_JOB_RECEIVING] = B(WK_JOB_RUNNING) | ENDS,
    [WK_JOB_RUNNING] = B(WK_JOB_DONE) | ENDS,
};
static const char *const job_names[WK_JOB_N_PHASES] = {
    [WK_JOB_NEW] = "new",         [WK_JOB_MATCHING] = "matching",
    [WK_JOB_PAGES] = "pages",     [WK_JOB_RECEIVING] = "receiving",
    [WK_JOB_RUNNING] = "running", [WK_JOB_DONE] = "done",
    [WK_JOB_FAILED] = "failed",   [WK_JOB_ABORTED] = "aborted",
};
const wk_phase_table_t wk_job_phases = {COMP, "job", WK_JOB_N_PHASES, job_legal, job_names};

static const uint32_t seq_legal[WK_SS_N_PHASES] = {
    [WK_SS_NEW] = B(WK_SS_RUNNING) | B(WK_SS_KV_WAIT) | B(WK_SS_GONE),
    [WK_SS_KV_WAIT] = B(WK_SS_MATCHED) | B(WK_SS_KV_IN) | B(WK_SS_GONE),
    [WK_SS_MATCHED] = B(WK_SS_RUNNING) | B(WK_SS_GONE),
    [WK_SS_KV_IN] = B(WK_SS_RUNNING) | B(WK_SS_DONE) | B(WK_SS_GONE),
    [WK_SS_RUNNING] = B(WK_SS_HANDOFF) | B(WK_SS_DONE) | B(WK_SS_GONE),
    [WK_SS_HANDOFF] = B(WK_SS_DONE) | B(WK_SS_GONE),
};
static const char *const seq_names[WK_SS_N_PHASES] = {
    [WK_SS_NEW] = "new",     [WK_SS_KV_WAIT] = "kv_wait", [WK_SS_MATCHED] = "matched",
    [WK_SS_KV_IN] = "kv_in", [WK_SS_RUNNING] = "running", [WK_SS_HANDOFF] = "handoff",
    [WK_SS_DONE] = "done",   [WK_SS_GONE] = "gone",
};
const wk_phase_table_t wk_seq_phases = {COMP, "seq", WK_SS_N_PHASES, seq_legal, seq_names};
#undef ENDS
#undef B

/* The rendezvous phases: the job waits on its deadline. */
static int rendezvous(wk_job_phase_t p)
{
    return p == WK_JOB_MATCHING || p == WK_JOB_PAGES || p == WK_JOB_RECEIVING;
}

static void dl_link(wk_job_t *job);
static void dl_unlink(wk_job_t *job);

int wk_job_to(wk_job_t *job, wk_job_phase_t to)
{
    if (!baton_phase_legal(&wk_job_phases, job->phase, to))
        return baton_phase_refuse(&wk_job_phases, job->phase, to, "id=%s", job->id);
    int was = rendezvous(job->phase), is = rendezvous(to);
    job->phase = to;
    if (!was && is)
        dl_link(job);
    else if (was && !is)
        dl_unlink(job);
    return 0;
}

/* Sequences waiting for their room, and computed ones whose KV is going out: the gauges and
 * /get_load count them. */
static int kv_waiting(wk_seq_phase_t p)
{
    return p == WK_SS_KV_WAIT || p == WK_SS_MATCHED;
}

int wk_seq_to(wk_sstate_t *ss, wk_seq_phase_t to)
{
    wk_worker_t *w = ss->job->w;
    if (!baton_phase_legal(&wk_seq_phases, ss->phase, to))
        return baton_phase_refuse(&wk_seq_phases, ss->phase, to, "id=%s", ss->job->id);
    w->n_kv_waiting += (unsigned)kv_waiting(to) - (unsigned)kv_waiting(ss->phase);
    w->n_boot_pub += (unsigned)(to == WK_SS_HANDOFF) - (unsigned)(ss->phase == WK_SS_HANDOFF);
    ss->phase = to;
    return 0;
}

/* ---- metrics helpers ---------------------------------------------------------------------- */

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
    wk_worker_count_request(w, route, status);
}

static void observe_duration(wk_worker_t *w, const char *route, uint64_t start_ns)
{
    const char *labels[1] = {route};
    baton_histogram_observe(baton_metric_child(w->m_duration, labels),
                            baton_seconds_since(start_ns));
}

/* ---- rendezvous deadlines: one timer for a FIFO (every job waits the same time) ----------- */

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

static void job_fail_pool(wk_job_t *job);

/* Every deadline due by now fails its job. */
static void dl_timer_cb(uv_timer_t *t)
{
    wk_worker_t *w = t->data;
    uint64_t now = baton_now_ms();
    wk_job_t *job;
    while ((job = dl_first(w)) != NULL && job->deadline_ms <= now) {
        if (job->phase == WK_JOB_PAGES)
            job_fail_pool(job);
        else
            wk__job_fail_err(job, BATON_ETIMEOUT,
                             w->cfg.mode == WK_MODE_DECODE ? "decode" : "prefill", NULL);
    }
    dl_arm(w);
}

/* ---- the end of a job --------------------------------------------------------------------- */

static void job_unlink_free(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    baton_list_remove(&job->link);
    w->n_jobs--;
    wk_vllm_hb_stop(job->hb);
    job->hb = NULL;
    if (w->tier)
        wk_tier_detach(w->tier, job);
    wk__job_cache_release(job);
    for (size_t i = 0; i < job->req.n_items; i++)
        wk_gen_free(&job->ss[i].gen);
    free(job->ss);
    free(job->gens);
    free(job->slots);
    wk_request_free(&job->req);
    json_decref(job->conv);
    free(job);
}

/* Takes every sequence out of the scheduler and lets go of its KV room (aborting it when it is
 * still open; its pages come back under the fencing rule), then moves the job to its end. No
 * callback follows. `reason` labels the rooms' failure in the metrics. */
static void job_end(wk_job_t *job, wk_job_phase_t end, const char *reason)
{
    wk_worker_t *w = job->w;
    if (job->phase == WK_JOB_PAGES)
        wk_kv_reserve_cancel(w->kv, &job->resv); /* a no-op when it is not queued */
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        wk_sched_cancel(&w->sched, &ss->seq);
        if (ss->phase != WK_SS_DONE)
            wk_seq_to(ss, WK_SS_GONE);
        if (w->tier)
            wk_tier_offload_seq_end(w->tier, ss, 0); /* its copies finish on their own */
        if (ss->recv) {
            wk_kv_recv_drop(ss->recv, reason);
            ss->recv = NULL;
        }
        if (ss->send) {
            wk_kv_send_drop(ss->send, reason);
            ss->send = NULL;
        }
        if (ss->hold) { /* never answered: its decode will not pull */
            wk_vllm_hold_drop(ss->hold, end == WK_JOB_ABORTED ? "aborted" : "failed");
            ss->hold = NULL;
        }
    }
    wk_job_to(job, end);
}

static void render_ctx(wk_job_t *job, wk_render_ctx_t *ctx)
{
    wk_worker_t *w = job->w;
    ctx->id = job->id;
    ctx->model = job->req.model ? job->req.model : w->cfg.model_name;
    ctx->created = job->created;
    ctx->input_logprobs = w->cfg.mode != WK_MODE_DECODE;
    ctx->e2e_s = baton_seconds_since(job->start_ns);
    ctx->seq = &job->resp_seq;
}

void wk__job_fail_reason(wk_job_t *job, int status, const char *message, const char *code,
                         const char *reason)
{
    wk_worker_t *w = job->w;
    job_end(job, WK_JOB_FAILED, reason);
    const char *type = error_type(status);
    log_warn(COMP, "request_failed id=%s route=%s status=%d code=%s reason=\"%s\"", job->id,
             job->route, status, code, message);
    if (job->streaming) {
        baton_buf_t b = BATON_BUF_INIT;
        wk_render_ctx_t ctx;
        render_ctx(job, &ctx);
        if ((job->req.api == WK_API_RESPONSES
                 ? wk_render_responses_error(&ctx, message, code, &b)
                 : wk_render_stream_error(message, type, code, &b)) == 0)
            baton_http_stream_write(job->http, b.data, b.len);
        baton_buf_free(&b);
        baton_http_stream_end(job->http);
    } else {
        baton_http_respond_error(job->http, status, message, type, NULL, code);
    }
    wk_worker_count_request(w, job->route, status);
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
    wk__job_fail_reason(job, 503, msg, "kv_pool_exhausted", "pool_exhausted");
}

/* Maps a KV hand-off error to the answer (docs/WORKER.md, "Failures"). */
void wk__job_fail_err(wk_job_t *job, int err, const char *what, const char *detail)
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
    wk__job_fail_reason(job, status, msg, code, reason);
}

/* ---- answering ---------------------------------------------------------------------------- */

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
        /* X-Baton-Continuation: this stream can be continued elsewhere (continuation.h) */
        static const baton_http_header_t hdrs[] = {{"Cache-Control", "no-cache"},
                                                   {"X-Baton-Continuation", "1"}};
        job->streaming = 1;
        baton_http_stream_start(job->http, 200, "text/event-stream", hdrs,
                                job->req.api == WK_API_RESPONSES ? 1 : 2);
    }
    wk_render_ctx_t ctx;
    render_ctx(job, &ctx);
    baton_buf_t b = BATON_BUF_INIT;
    if (wk_render_stream_progress(&ctx, &job->req, ss->index, &ss->gen, &ss->st, &b) == 0 &&
        b.len > 0)
        baton_http_stream_write(job->http, b.data, b.len); /* BATON_ECLOSED: on_abort follows */
    baton_buf_free(&b);
}

/* A continuation's sequences stopped mid-step: those the client got the last step's chunk of
 * are a token ahead of the others (or look it: a step may show nothing new). Before the next
 * token, the ones behind take theirs and send what the client lacks of that step, in order,
 * so the events follow the uninterrupted stream's. */
static int job_catch_up(wk_job_t *job)
{
    uint32_t top = 0;
    job->catchup = 0;
    for (size_t i = 0; i < job->req.n_items; i++)
        if (job->ss[i].gen.n_tokens > top)
            top = job->ss[i].gen.n_tokens;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        int pushed = 0;
        while (ss->gen.finish == WK_FINISH_NONE && ss->gen.n_tokens < top) {
            if (wk_gen_push(&ss->gen, wk_gen_next_id(&ss->gen)) != 0)
                return BATON_ENOMEM;
            pushed = 1;
        }
        if (pushed)
            job_emit(job, ss);
    }
    return 0;
}

int wk__job_seq_push(wk_sstate_t *ss, int32_t token, const char *what)
{
    if (ss->job->catchup) {
        if (job_catch_up(ss->job) != 0) {
            wk__job_fail_err(ss->job, BATON_ENOMEM, what, NULL);
            return -1;
        }
        if (ss->gen.finish != WK_FINISH_NONE)
            return 0;                     /* it caught up to its end */
        token = wk_gen_next_id(&ss->gen); /* it may have caught up past the one computed */
    }
    if (wk_gen_push(&ss->gen, token) != 0) {
        wk__job_fail_err(ss->job, BATON_ENOMEM, what, NULL);
        return -1;
    }
    job_emit(ss->job, ss);
    return 0;
}

int wk__job_seq_finish(wk_sstate_t *ss)
{
    wk_job_t *job = ss->job;
    if (ss->phase == WK_SS_DONE)
        return 0;
    wk_seq_to(ss, WK_SS_DONE);
    if (job->w->cfg.mode == WK_MODE_DECODE)
        wk__job_cache_store(ss); /* a decode keeps a finished sequence's KV for the next turn */
    if (job->w->tier)
        wk_tier_offload_seq_end(job->w->tier, ss, 1);
    if (ss->recv) {
        wk_kv_recv_drop(ss->recv, "done");
        ss->recv = NULL;
    }
    baton_counter_add(job->w->m_gen_tokens, ss->gen.n_tokens);
    return ++job->n_done == job->req.n_items;
}

void wk__job_complete(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk_render_ctx_t ctx;
    render_ctx(job, &ctx);
    /* Kept before the answer goes out: a follow-up may name it as soon as the client has it. */
    if (job->conv && job->req.n_items > 0)
        wk_resp_store(w, job->id, job->conv, job->gens[0]->text.data, job->gens[0]->final_len);
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
        if (job->req.vllm_leg == WK_VLLM_NIXL_PREFILL) {
            if (rc == 0) /* adds kv_transfer_params naming the exported pages */
                rc = wk_vllm_answer(w->vllm, job->id, job->req.n_items, &b);
            for (size_t i = 0; i < job->req.n_items; i++) {
                if (rc != 0 && job->ss[i].hold) /* nobody will learn where they are */
                    wk_vllm_hold_drop(job->ss[i].hold, "failed");
                job->ss[i].hold = NULL; /* handed over, or released */
            }
        }
        if (rc == 0)
            baton_http_respond(job->http, 200, "application/json", NULL, 0, b.data, b.len);
        else if (rc == BATON_ETIMEOUT)
            baton_http_respond_error(job->http, 503,
                                     "the held KV pages expired before the answer "
                                     "(--kv-hold-timeout-ms is shorter than the request)",
                                     "server_error", NULL, "kv_hold_expired");
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
    wk_worker_count_request(w, job->route, rc == 0 ? 200 : rc == BATON_ETIMEOUT ? 503 : 500);
    observe_duration(w, job->route, job->start_ns);
    job_end(job, WK_JOB_DONE, "done"); /* nothing is left open by now; this only tidies */
    job_unlink_free(job);
}

/* After a step: 1 while the sequence goes on decoding, else 0 (the job completes with its last
 * sequence). */
static int seq_continue(wk_sstate_t *ss)
{
    if (ss->gen.finish == WK_FINISH_NONE)
        return 1;
    if (wk__job_seq_finish(ss))
        wk__job_complete(ss->job);
    return 0;
}

static void on_abort(baton_http_req_t *http)
{
    wk_job_t *job = http->data;
    wk_worker_t *w = job->w;
    log_info(COMP, "request_aborted id=%s route=%s reason=client_gone", job->id, job->route);
    job_end(job, WK_JOB_ABORTED, "canceled");
    if (job->streaming)
        baton_http_stream_end(http);
    else
        baton_http_respond_error(http, 499, "client closed the request", "server_error", NULL,
                                 "client_closed");
    wk_worker_count_request(w, job->route, 0);
    job_unlink_free(job);
}

void wk_job_leftover(wk_job_t *job)
{
    log_error(COMP, "shutdown_leftover_request id=%s", job->id);
    job_end(job, WK_JOB_ABORTED, "shutdown");
    job_unlink_free(job);
}

void wk_job_fail_all_shutdown(wk_worker_t *w)
{
    while (!baton_list_empty(&w->jobs)) /* each failure unlinks and frees its job */
        wk__job_fail_reason(container_of(w->jobs.next, wk_job_t, link), 503,
                            "the worker is shutting down: its drain timeout passed",
                            "shutting_down", "shutdown");
}

/* ---- the scheduler's callbacks ------------------------------------------------------------ */

static void on_nixl_held(void *data, int status)
{
    wk_sstate_t *ss = data;
    wk_job_t *job = ss->job;
    if (status != 0) {
        ss->hold = NULL; /* gone with the failure */
        wk__job_fail_err(job, status, "prefill", NULL);
        return;
    }
    if (wk__job_seq_finish(ss))
        wk__job_complete(job);
}

/* A vllm-nixl prefill's sequence was computed: its KV is exported for the decode's pull before
 * the answer names it, so a decode that pulls at once finds it. */
static void job_nixl_hold(wk_sstate_t *ss)
{
    wk_job_t *job = ss->job;
    wk_seq_to(ss, WK_SS_HANDOFF);
    int rc = wk_vllm_hold_start(job->w->vllm, job->id, &job->req, ss->index, on_nixl_held, ss,
                                &ss->hold);
    if (rc == BATON_EBUSY || rc == BATON_ETOOBIG)
        wk__job_fail_reason(job, 503, "no KV pages free to hold for the decode's pull",
                            "kv_pool_exhausted", "pool_exhausted");
    else if (rc != 0)
        wk__job_fail_err(job, rc, "prefill", NULL);
}

int wk_job_on_prefilled(wk_sched_t *s, wk_seq_t *seq)
{
    wk_sstate_t *ss = seq->data;
    (void)s;
    wk__job_cache_store(ss); /* the prompt's KV exists now */
    if (ss->job->w->tier)
        wk_tier_store(ss->job->w->tier, ss);
    if (ss->job->w->cfg.mode == WK_MODE_PREFILL && ss->job->req.vllm_leg != WK_VLLM_NIXL_PREFILL) {
        wk__job_pd_prefilled(ss);
        return 0;
    }
    /* regular: the first token comes out of prefill, the rest out of decode steps */
    if (ss->gen.finish == WK_FINISH_NONE &&
        wk__job_seq_push(ss, wk_gen_next_id(&ss->gen), "generate"))
        return 0;
    if (ss->job->req.vllm_leg == WK_VLLM_NIXL_PREFILL) {
        job_nixl_hold(ss); /* the answer waits until every sequence's KV is exported */
        return 0;
    }
    return seq_continue(ss);
}

int wk_job_on_decoded(wk_sched_t *s, wk_seq_t *seq)
{
    wk_sstate_t *ss = seq->data;
    (void)s;
    if (wk__job_seq_push(ss, wk_gen_next_id(&ss->gen), "generate"))
        return 0;
    return seq_continue(ss);
}

/* ---- admission and start ------------------------------------------------------------------ */

/* Every sequence's lookup is done: into the scheduler. */
static void submit_now(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    for (size_t i = 0; i < job->req.n_items; i++) {
        wk_sstate_t *ss = &job->ss[i];
        wk_seq_to(ss, WK_SS_RUNNING);
        ss->seq.prompt_tokens = job->req.items[i].prompt_tokens;
        wk_sched_submit_prefill(&w->sched, &ss->seq);
    }
    wk_worker_sched_kick(w);
}

void wk__job_submit_prefill(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    wk__job_cache_match(job); /* only the uncached tokens are charged */
    if (w->tier && wk_tier_lookup(w->tier, job, submit_now))
        return; /* L2 / L3 first: submit_now follows */
    submit_now(job);
}

static void job_start(wk_job_t *job)
{
    wk_worker_t *w = job->w;
    /* a vllm-nixl prefill computes like a plain request; its pages are held at the answer */
    if (w->cfg.mode != WK_MODE_REGULAR && job->req.vllm_leg != WK_VLLM_NIXL_PREFILL &&
        !wk_vllm_decode_alone(w->cfg.protocol, w->cfg.mode, &job->req)) {
        wk__job_pd_start(job);
        return;
    }
    wk_job_to(job, WK_JOB_RUNNING);
    wk__job_submit_prefill(job);
}

void wk_job_handle(wk_worker_t *w, baton_http_req_t *http, wk_api_t api)
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
    char *expanded = NULL;
    int rc = api == WK_API_RESPONSES
                 ? wk_resp_prepare(w, http->body, http->body_len, &expanded, &job->conv, &perr)
                 : 0;
    if (rc == 0)
        rc = wk_request_parse(&job->req, api, expanded ? expanded : http->body,
                              expanded ? strlen(expanded) : http->body_len, &perr);
    free(expanded);
    if (rc == BATON_ENOMEM && perr.status == 0) {
        perr.status = 500;
        perr.code = "internal_error";
        snprintf(perr.message, sizeof(perr.message), "out of memory");
    }
    if (rc != 0) {
        json_decref(job->conv);
        free(job);
        reject(w, http, route, perr.status, perr.message, perr.param[0] ? perr.param : NULL,
               perr.code);
        return;
    }
    /* vLLM protocols: the leg must be the one this worker plays */
    const char *bad = wk_vllm_refused(w->cfg.protocol, w->cfg.mode, &job->req);
    int vbad = bad != NULL;
    int alone = wk_vllm_decode_alone(w->cfg.protocol, w->cfg.mode, &job->req);
    if (!bad && !alone && w->cfg.mode != WK_MODE_REGULAR && !job->req.has_boot &&
        job->req.vllm_leg != WK_VLLM_NIXL_PREFILL)
        bad = w->cfg.mode == WK_MODE_PREFILL
                  ? "this worker runs in prefill mode: bootstrap_room is required"
                  : "this worker runs in decode mode: bootstrap_host, bootstrap_port and "
                    "bootstrap_room are required";
    for (size_t i = 0; !bad && !alone && w->cfg.mode == WK_MODE_DECODE && i < job->req.n_items; i++)
        if (job->req.items[i].boot_host == NULL || job->req.items[i].boot_port <= 0)
            bad = "this worker runs in decode mode: bootstrap_host and bootstrap_port are "
                  "required";
    unsigned waiting = wk_sched_waiting(&w->sched) + w->n_kv_waiting;
    int status = 0;
    const char *code = NULL;
    if (bad) {
        status = 400;
        code = vbad ? "kv_transfer_params_invalid" : "bootstrap_required";
    } else if (w->shutting_down || w->draining) {
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
        reject(w, http, route, status, bad,
               status == 400 ? (vbad ? "kv_transfer_params" : "bootstrap_room") : NULL, code);
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
             : api == WK_API_RESPONSES   ? "resp_"
                                         : "",
             (unsigned long long)idv);
    uint64_t prompt_tokens = 0;
    int bad_cont = 0;
    for (size_t i = 0; i < n; i++) {
        wk_sstate_t *ss = &job->ss[i];
        const wk_item_t *it = &job->req.items[i];
        ss->job = job;
        ss->index = i;
        ss->seq.data = ss;
        ss->first_token = -1;
        wk_stop_t stop;
        wk_item_stop(it, &stop);
        /* a prefill answers as if max_tokens were 1: it computes only the first token (and a
         * continuation's prefill only the KV: its decode replays what the client has) */
        uint32_t max = it->max_tokens;
        if (w->cfg.mode == WK_MODE_PREFILL && max > 1)
            max = 1;
        int cont = job->req.cont && job->req.cont[i].present && w->cfg.mode != WK_MODE_PREFILL;
        wk_gen_init(&ss->gen, it->seed, max, &stop);
        job->gens[i] = &ss->gen;
        prompt_tokens += it->prompt_tokens;
        if (cont && !bad_cont) {
            int crc = wk_cont_replay(&job->req.cont[i], &ss->gen, &ss->st);
            if (crc != 0)
                bad_cont = crc;
            job->catchup = 1;
        }
    }
    if (bad_cont) {
        for (size_t i = 0; i < n; i++)
            wk_gen_free(&job->ss[i].gen);
        free(job->ss);
        free(job->gens);
        wk_request_free(&job->req);
        free(job);
        if (bad_cont == BATON_EINVAL)
            reject(w, http, route, 400,
                   "baton_continuation: the text given is not what this request generates",
                   "baton_continuation", "continuation_mismatch");
        else
            reject(w, http, route, 500, "out of memory", NULL, "internal_error");
        return;
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
