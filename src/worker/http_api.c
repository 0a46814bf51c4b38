/* http_api.c — baton-worker's HTTP front end: the route table, the informational endpoints
 * (/health, /get_server_info, /get_load, /metrics, ...), and starting and stopping the server;
 * generation routes hand the request to job.c. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/log.h"
#include "http/tls.h"
#include "worker/vllm.h"
#include "worker/job.h"
#include "tokenizer/tok_api.h"
#include "worker/worker.h"
#include "worker/wtok.h"

#define COMP "worker"

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
    baton_gauge_set(w->m_buffered,
                    (double)(atomic_load(&w->budget.used) + atomic_load(&w->budget.reserve_used)));
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

typedef enum {
    R_GENERATE,
    R_CHAT,
    R_COMPLETIONS,
    R_RESPONSES,
    R_GET,
    R_ABORT,
    R_LEASE,
    R_TOKENIZE,
    R_DETOKENIZE
} route_kind_t;

typedef struct route_s {
    const char *path;
    const char *method;
    route_kind_t kind;
} route_t;

static const route_t routes[] = {
    {"/generate", "POST", R_GENERATE},
    {"/v1/chat/completions", "POST", R_CHAT},
    {"/v1/completions", "POST", R_COMPLETIONS},
    {"/v1/responses", "POST", R_RESPONSES},
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
    {"/abort_requests", "POST", R_ABORT}, /* vllm-nixl prefill: release held pages */
    {"/kv_lease", "POST", R_LEASE},       /* vllm-nixl prefill: a decode's heartbeat */
    {"/tokenize", "POST", R_TOKENIZE},    /* vLLM's, with --tokenizer */
    {"/detokenize", "POST", R_DETOKENIZE},
};

/* /tokenize and /detokenize in vLLM's shapes, with the worker's --tokenizer. */
static void handle_tokenize(wk_worker_t *w, baton_http_req_t *req, int detok)
{
    const char *route = detok ? "/detokenize" : "/tokenize";
    if (!wk_tok_enabled()) {
        baton_http_respond_error(req, 404, "this worker has no tokenizer (--tokenizer)",
                                 "invalid_request_error", NULL, "not_found");
        wk_worker_count_request(w, route, 404);
        return;
    }
    json_t *resp = NULL;
    baton_tok_api_err_t e;
    int rc = wk_tok_api(detok, req->body, req->body_len, &resp, &e);
    int status = rc == 0 ? 200 : rc == 1 ? 400 : 500;
    if (rc == 1)
        resp = baton_tok_api_error_json(e.message, e.param);
    else if (rc)
        resp = json_pack("{s:{s:s,s:s,s:n,s:i}}", "error", "message", "out of memory", "type",
                         "InternalServerError", "param", "code", 500);
    respond_json(req, status, resp);
    wk_worker_count_request(w, route, status);
}

static void handle_get(wk_worker_t *w, baton_http_req_t *req, const char *path)
{
    if (strcmp(path, "/health") == 0 || strcmp(path, "/health_generate") == 0) {
        int ok = !w->shutting_down && !w->draining;
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
            wk_worker_count_request(w, "other", 405);
        } else {
            char msg[300];
            snprintf(msg, sizeof(msg), "unknown path %.256s", req->path);
            baton_http_respond_error(req, 404, msg, "invalid_request_error", NULL, "not_found");
            wk_worker_count_request(w, "other", 404);
        }
        return;
    }
    switch (match->kind) {
    case R_GENERATE:
        wk_job_handle(w, req, WK_API_GENERATE);
        break;
    case R_CHAT:
        wk_job_handle(w, req, WK_API_CHAT);
        break;
    case R_COMPLETIONS:
        wk_job_handle(w, req, WK_API_COMPLETIONS);
        break;
    case R_RESPONSES:
        wk_job_handle(w, req, WK_API_RESPONSES);
        break;
    case R_TOKENIZE:
    case R_DETOKENIZE:
        handle_tokenize(w, req, match->kind == R_DETOKENIZE);
        break;
    case R_LEASE:
    case R_ABORT:
        if (w->vllm) {
            if (match->kind == R_LEASE)
                wk_vllm_handle_lease(w->vllm, req);
            else
                wk_vllm_handle_abort(w->vllm, req);
        } else {
            baton_http_respond_error(req, 404, "no held KV pages here (vllm-nixl prefill only)",
                                     "invalid_request_error", NULL, "not_found");
            wk_worker_count_request(w, "other", 404);
        }
        break;
    default:
        handle_get(w, req, match->path);
        break;
    }
}

/* ---- start / stop ---- */

int wk_worker_start(wk_worker_t *w, uv_loop_t *loop, const wk_config_t *cfg)
{
    int rc = wk_worker_init(w, loop, cfg);
    if (rc != 0)
        return rc;
    baton_http_limits_t lim;
    baton_http_limits_default(&lim);
    lim.max_body_bytes = cfg->max_body_bytes;
    lim.max_connections = cfg->max_connections;
    lim.max_buffered_bytes = cfg->max_buffered_bytes;
    rc = baton_http_server_create(&w->http, loop, &lim, http_handler, w);
    if (rc != 0) {
        log_error(COMP, "start_failed what=http err=%s", baton_strerror(rc));
        return rc;
    }
    w->budget.max = cfg->max_buffered_bytes;
    baton_http_server_set_budget(w->http, &w->budget);
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

static void http_closed_cb(baton_http_server_t *srv)
{
    wk_worker_t *w = srv->data;
    w->http = NULL;
    wk_worker_close(w);
}

void wk_worker_drain_begin(wk_worker_t *w)
{
    w->draining = 1;
    if (w->http)
        baton_http_server_stop_accepting(w->http);
}

int wk_worker_drained(const wk_worker_t *w)
{
    return w->n_jobs == 0 && (w->http == NULL || baton_http_server_connections(w->http) == 0);
}

void wk_worker_shutdown(wk_worker_t *w, void (*on_closed)(wk_worker_t *w))
{
    if (w->shutting_down)
        return;
    log_info(COMP, "shutting_down inflight=%u", w->n_jobs);
    w->shutting_down = 1;
    w->on_closed = on_closed;
    if (w->http) {
        w->http->data = w;
        baton_http_server_close(w->http, http_closed_cb);
    } else {
        wk_worker_close(w);
    }
}
