/* worker.c — baton-worker's engine side (see worker.h): configuration defaults, start-up of the
 * scheduler, metrics and KV hand-off, the scheduler driver, and closing it all; the HTTP front
 * end is http_api.c, a request's life cycle job.c. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "baton/error.h"
#include "common/log.h"
#include "worker/responses_store.h"
#include "worker/vllm.h"
#include "worker/job.h"
#include "worker/kvev.h"
#include "worker/worker.h"

#define COMP                 "worker"
#define SCHED_STEPS_PER_TURN 64 /* steps done per loop turn before yielding to I/O */

void wk_config_default(wk_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->mode = WK_MODE_REGULAR;
    cfg->host = "127.0.0.1";
    cfg->port = 30000;
    cfg->max_body_bytes = 64u << 20;
    cfg->max_buffered_bytes = 256u << 20;
    cfg->max_connections = 4096;
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
    cfg->cache_tokens = WK_DEFAULT_CACHE_TOKENS;
    cfg->protocol = WK_PROTO_SGLANG;
    cfg->kv_hold_timeout_ms = 30000;
    cfg->drain_timeout_ms = 10000; /* the router's --drain-timeout-ms default */
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

void wk_worker_sched_kick(wk_worker_t *w)
{
    /* never run steps inside the caller's call: callbacks would re-enter it */
    uv_idle_start(&w->sched_idle, sched_idle_cb);
}

void wk_worker_count_request(wk_worker_t *w, const char *route, int status)
{
    char st[16];
    if (status > 0)
        snprintf(st, sizeof(st), "%d", status);
    else
        snprintf(st, sizeof(st), "aborted");
    const char *labels[2] = {route, st};
    baton_counter_inc_labels(w->m_requests, labels);
}

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
    f = baton_metrics_gauge(w->metrics, "baton_worker_buffered_bytes",
                            "HTTP request-body bytes being read plus answer bytes queued to "
                            "clients; request bodies wait past --max-buffered-bytes.",
                            0, NULL);
    w->m_buffered = baton_metric_child(f, NULL);
    /* prefix cache (job_cache.c) */
    f = baton_metrics_counter(w->metrics, "baton_worker_cache_hit_tokens_total",
                              "Prompt tokens found in the prefix cache (not computed again).", 0,
                              NULL);
    w->m_cache_hit = baton_metric_child(f, NULL);
    f = baton_metrics_counter(w->metrics, "baton_worker_cache_miss_tokens_total",
                              "Prompt tokens not in the prefix cache (computed).", 0, NULL);
    w->m_cache_miss = baton_metric_child(f, NULL);
    f = baton_metrics_counter(w->metrics, "baton_worker_cache_evicted_tokens_total",
                              "Tokens evicted from the prefix cache (LRU).", 0, NULL);
    w->m_cache_evict = baton_metric_child(f, NULL);
    f = baton_metrics_gauge(w->metrics, "baton_worker_cache_tokens",
                            "Tokens held in the prefix cache now.", 0, NULL);
    w->m_cache_size = baton_metric_child(f, NULL);
    if (w->cfg.mode == WK_MODE_REGULAR)
        return;
    f = baton_metrics_gauge(w->metrics, "baton_worker_bootstrap_waiting",
                            "PD sequences waiting for their peer's room or for KV pages.", 0, NULL);
    w->m_boot_waiting = baton_metric_child(f, NULL);
}

int wk_worker_init(wk_worker_t *w, uv_loop_t *loop, const wk_config_t *cfg)
{
    memset(w, 0, sizeof(*w));
    baton_list_init(&w->jobs);
    baton_list_init(&w->deadlines);
    w->loop = loop;
    w->cfg = *cfg;
    if (cfg->kv_secret_file != NULL && wk_kv_secret_check(cfg->kv_secret_file) != 0) {
        log_error(COMP, "start_failed what=kv_secret_file mode=%s", wk_mode_name(cfg->mode));
        return BATON_EINVAL;
    }
    w->started_at = (long long)time(NULL);
    w->id_salt = uv_hrtime() ^ ((uint64_t)uv_os_getpid() << 32);
    wk_sched_cfg_t sc = {
        .prefill_ns_per_token = cfg->prefill_us_per_token * 1000,
        .decode_ns_per_step = cfg->decode_us_per_token * 1000,
        .max_batch = cfg->max_batch,
    };
    int rc = wk_sched_init(&w->sched, &sc, wk_job_on_prefilled, wk_job_on_decoded, w);
    if (rc != 0) {
        log_error(COMP, "start_failed what=scheduler err=%s", baton_strerror(rc));
        return rc;
    }
    uv_timer_init(loop, &w->sched_timer);
    w->sched_timer.data = w;
    uv_idle_init(loop, &w->sched_idle);
    w->sched_idle.data = w;
    metrics_init(w);
    if (cfg->cache_tokens &&
        (rc = wk_pcache_create(&w->pcache, cfg->cache_tokens, cfg->shape.page_tokens)) != 0) {
        log_error(COMP, "start_failed what=prefix_cache err=%s", baton_strerror(rc));
        return rc;
    }
    if (cfg->kv_events_endpoint &&
        wk_kvev_create(&w->kvev, loop, w->pcache, cfg->shape.page_tokens, cfg->kv_events_endpoint,
                       cfg->kv_events_replay_endpoint) != 0)
        return BATON_EINVAL;

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
        kc.secret_file = cfg->kv_secret_file;
        kc.max_pending = cfg->kv_max_pending;
        kc.max_pending_per_addr = cfg->kv_max_pending_per_addr;
        kc.pending_buffer_bytes = cfg->kv_pending_buffer_bytes;
        /* logs "bootstrap_listening addr=H:P" (libbaton) once the prefill listens */
        rc = wk_kv_create(&w->kv, loop, &kc, w->metrics);
        if (rc != 0) {
            log_error(COMP, "start_failed what=kv_transfer err=%s", baton_strerror(rc));
            return rc;
        }
        if (cfg->mode == WK_MODE_PREFILL)
            wk_sched_set_layers(&w->sched, cfg->shape.layers, wk_job_on_layer);
        if (cfg->mode == WK_MODE_PREFILL && cfg->protocol == WK_PROTO_VLLM_NIXL &&
            (rc = wk_vllm_create(&w->vllm, w, cfg->kv_hold_timeout_ms)) != 0) {
            log_error(COMP, "start_failed what=vllm_holds err=%s", baton_strerror(rc));
            return rc;
        }
    }
    return 0;
}

/* ---- close ---- */

static void maybe_closed(wk_worker_t *w)
{
    if (--w->n_closing > 0)
        return;
    wk_sched_free(&w->sched);
    wk_resp_free(w);
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

void wk_worker_close(wk_worker_t *w)
{
    w->shutting_down = 1;
    /* every request was aborted and finished by now; anything left is a bug worth a line */
    while (!baton_list_empty(&w->jobs)) /* newest first */
        wk_job_leftover(container_of(w->jobs.prev, wk_job_t, link));
    wk_kvev_destroy(w->kvev); /* stops observing the cache first */
    w->kvev = NULL;
    wk_pcache_destroy(w->pcache); /* no job holds a page any more */
    w->pcache = NULL;
    w->n_closing = 1;
    wk_vllm_close(w->vllm); /* held pages' rooms go before the hand-off closes */
    w->vllm = NULL;
    if (w->kv) {
        w->n_closing++;
        wk_kv_close(w->kv, kv_closed_cb, w);
        w->kv = NULL;
    }
    w->n_closing += 3;
    uv_close((uv_handle_t *)&w->sched_timer, handle_closed_cb);
    uv_close((uv_handle_t *)&w->sched_idle, handle_closed_cb);
    uv_close((uv_handle_t *)&w->dl_timer, handle_closed_cb);
    maybe_closed(w); /* the caller's own share */
}
