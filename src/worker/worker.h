/* worker.h — baton-worker's configuration and top-level state (private to src/worker). */
#ifndef BATON_WORKER_WORKER_H
#define BATON_WORKER_WORKER_H

#include <stdint.h>
#include <uv.h>

#include "baton/transfer.h"
#include "common/list.h"
#include "common/metrics.h"
#include "http/server.h"
#include "worker/kvshape.h"
#include "worker/kvxfer.h"
#include "worker/prefix_cache.h"
#include "worker/sched.h"

typedef enum { WK_MODE_REGULAR = 0, WK_MODE_PREFILL, WK_MODE_DECODE } wk_mode_t;

typedef struct wk_config_s {
    wk_mode_t mode;
    const char *host;
    int port;
    int bootstrap_port; /* prefill only */
    const char *model_name;
    uint64_t prefill_us_per_token;
    uint64_t decode_us_per_token; /* one decode step */
    unsigned max_batch;
    unsigned max_queue;
    uint64_t bootstrap_timeout_ms;
    /* KV hand-off (prefill and decode modes) */
    wk_kvshape_t shape;
    const char *preset;      /* name of the preset the shape started from, NULL when custom */
    uint64_t kv_pool_tokens; /* 0 = auto (wk_kvshape_auto_pool_tokens) */
    baton_xfer_transport_t transports[BATON_XFER_MAX_TRANSPORTS];
    int n_transports;                /* fallback order */
    int layerwise;                   /* prefill: write each layer as it is computed */
    uint32_t fault_corrupt_kv_every; /* tests only: prefill corrupts every Nth room */
    /* TLS: HTTPS on the HTTP port when set; main.c owns it (and reloads it on
     * SIGHUP), the worker only uses it. */
    struct baton_tls_s *tls;
    /* prefix cache (prefix_cache.h), every mode: capacity in tokens, 0 = off */
    uint64_t cache_tokens;
    /* KV events (kvev.h): the prefix cache's pages published on these ZMQ endpoints; NULL = off */
    const char *kv_events_endpoint, *kv_events_replay_endpoint;
    /* vLLM PD protocols (vllm.h) */
    int protocol;                /* wk_proto_t: sglang (default), vllm-nixl, vllm-mooncake */
    uint64_t kv_hold_timeout_ms; /* vllm-nixl: the lease (vLLM's kv_lease_duration), vllm.h */
    const char *kv_secret_file;  /* KV bootstrap shared secret (file contents); NULL: none */
    /* The KV listener's bounds on connections not through their handshake (0: libbaton's
     * defaults; baton_xfer_config_t.max_pending_conns and the two after it). */
    uint32_t kv_max_pending, kv_max_pending_per_addr;
    uint64_t kv_pending_buffer_bytes;
    /* The HTTP port's bounds (http/server.h): body size, bytes of bodies being read plus
     * answers queued to clients that do not read, connections. */
    uint64_t max_body_bytes, max_buffered_bytes;
    unsigned max_connections;
    uint64_t drain_timeout_ms; /* SIGTERM: time in-flight requests get to finish (drain.h) */
} wk_config_t;

/* Default prefix cache capacity: 1 Mi tokens hold a few thousand chat sessions (~8 MiB). */
#define WK_DEFAULT_CACHE_TOKENS (1u << 20)

void wk_config_default(wk_config_t *cfg);
const char *wk_mode_name(wk_mode_t m);

typedef struct wk_job_s wk_job_t;

typedef struct wk_worker_s {
    uv_loop_t *loop;
    wk_config_t cfg;
    baton_http_server_t *http;
    wk_kv_t *kv;            /* prefill and decode modes */
    struct wk_vllm_s *vllm; /* vllm-nixl prefill: held pages (vllm.h) */
    wk_sched_t sched;
    uv_timer_t sched_timer;
    uv_idle_t sched_idle;
    uv_timer_t dl_timer;    /* rendezvous deadlines */
    baton_list_t deadlines; /* of wk_job_t.dl_link, FIFO (every job waits the same time) */
    int http_port;

    baton_list_t jobs; /* of wk_job_t.link: in flight, for shutdown and load reporting */
    unsigned n_jobs;
    unsigned n_kv_waiting; /* PD sequences waiting for their peer's room or for KV pages */
    unsigned n_boot_pub;   /* prefill sequences computed, their KV going out */
    uint64_t id_salt, id_counter;
    struct json_t *responses;      /* Responses API: id → conversation (responses_store.h) */
    struct json_t *response_order; /* ... their ids, oldest first */
    long long started_at;
    int draining; /* SIGTERM: new requests get 503, those in flight finish (drain.h) */
    int shutting_down;
    unsigned n_closing; /* handles and parts still closing */
    void (*on_closed)(struct wk_worker_s *w);

    baton_metrics_t *metrics;
    baton_metric_family_t *m_requests; /* {route,status} */
    baton_metric_family_t *m_duration; /* {route} */
    baton_metric_child_t *m_ttft;
    baton_metric_child_t *m_prompt_tokens, *m_gen_tokens;
    baton_metric_child_t *m_queue, *m_running, *m_inflight, *m_boot_waiting, *m_buffered;
    baton_http_budget_t budget; /* cfg.max_buffered_bytes, shown as baton_worker_buffered_bytes */
    /* prefix cache (job_cache.c); pcache NULL when --cache-tokens 0 */
    wk_pcache_t *pcache;
    struct wk_kvev_s *kvev; /* its KV-event publisher (kvev.h); NULL when off */
    baton_metric_child_t *m_cache_hit, *m_cache_miss, *m_cache_evict, *m_cache_size;
    uint64_t cache_evictions_seen;
} wk_worker_t;

/* ---- http_api.c ---- */

/* wk_worker_init, then the HTTP server, listening (logs the listening lines). Returns 0 or a
 * negative error with a log line saying what failed. */
int wk_worker_start(wk_worker_t *w, uv_loop_t *loop, const wk_config_t *cfg);

/* Stop: in-flight requests are aborted, every handle closed; on_closed runs when the loop has
 * nothing of the worker's left. A graceful stop drains first (drain.h). */
void wk_worker_shutdown(wk_worker_t *w, void (*on_closed)(wk_worker_t *w));
/* The drain's two halves: no new connections (idle ones close, busy ones after their answer)
 * and 503 shutting_down for any request still begun; then 1 once no request and no connection
 * is left. */
void wk_worker_drain_begin(wk_worker_t *w);
int wk_worker_drained(const wk_worker_t *w);

/* ---- worker.c: everything but the HTTP server ---- */

/* Creates the scheduler, its timers, the metrics and the KV hand-off (PD modes). 0 or a negative
 * error (logged). */
int wk_worker_init(wk_worker_t *w, uv_loop_t *loop, const wk_config_t *cfg);
/* After the HTTP server closed (every request aborted): lets go of any job left, closes the KV
 * hand-off and the timers; w->on_closed (when set) runs once all of it is closed. */
void wk_worker_close(wk_worker_t *w);
/* Runs the scheduler on a later loop turn (never inside the caller's call). */
void wk_worker_sched_kick(wk_worker_t *w);
/* Counts an answer in baton_worker_requests_total (status 0: the client left). */
void wk_worker_count_request(wk_worker_t *w, const char *route, int status);

#endif
