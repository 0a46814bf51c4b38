/* config.c — router configuration: the option table, defaults, the JSON file and the command
 * line (--help: config_help.c). */
#include "router/control/config.h"
#include "router/control/config_int.h"

#include "baton/error.h"
#include "common/token_bucket.h"

#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    SET_PREFILL_POLICY = 1u << 0,
    SET_DECODE_POLICY = 1u << 1,
};

typedef baton__opt_t opt_t;

#define OFF(f) offsetof(baton_config_t, f)
#define U64MAX ((uint64_t)1 << 53) /* JSON integers beyond this are not exact anyway */

static const opt_t options[] = {
    {"--host", NULL, "host", OPT_STR, OFF(host), 0, 0, 0, "HOST", "address to listen on"},
    {"--port", NULL, "port", OPT_INT, OFF(port), 0, 65535, 0, "N", "port (0 = ephemeral)"},
    {"--threads", NULL, "threads", OPT_UINT, OFF(threads), 1, 1024, 0, "N",
     "event-loop threads sharing the port"},
    {"--policy", NULL, "policy", OPT_POLICY, OFF(policy), 0, 0, 0, "P",
     "worker selection: round_robin | random | power_of_two | least_load | consistent_hash | "
     "cache_aware | precise"},
    {"--prefill-policy", NULL, "prefill_policy", OPT_POLICY, OFF(prefill_policy), 0, 0,
     SET_PREFILL_POLICY, "P", "policy for prefill workers (the choices of --policy)"},
    {"--decode-policy", NULL, "decode_policy", OPT_POLICY, OFF(decode_policy), 0, 0,
     SET_DECODE_POLICY, "P", "policy for decode workers (the choices of --policy)"},
    {"--log-level", NULL, "log_level", OPT_LOGLEVEL, OFF(log_level), 0, 0, 0, "L",
     "debug | info | warn | error"},
    {"--max-header-bytes", "limits", "max_header_bytes", OPT_SIZE, OFF(limits.max_header_bytes),
     256, (uint64_t)1 << 30, 0, "N", "request line + headers limit (431)"},
    {"--max-headers", "limits", "max_headers", OPT_SIZE, OFF(limits.max_headers), 1, 100000, 0, "N",
     "header count limit (431)"},
    {"--max-body-bytes", "limits", "max_body_bytes", OPT_SIZE, OFF(limits.max_body_bytes), 1,
     (uint64_t)1 << 40, 0, "N", "request body limit (413)"},
    {"--header-timeout-ms", "limits", "header_timeout_ms", OPT_U64, OFF(limits.header_timeout_ms),
     1, U64MAX, 0, "MS", "time to receive the headers (408)"},
    {"--body-timeout-ms", "limits", "body_timeout_ms", OPT_U64, OFF(limits.body_timeout_ms), 1,
     U64MAX, 0, "MS", "longest gap between body reads (408)"},
    {"--keepalive-timeout-ms", "limits", "keepalive_timeout_ms", OPT_U64,
     OFF(limits.keepalive_timeout_ms), 1, U64MAX, 0, "MS", "idle keep-alive connection timeout"},
    {"--max-connections", "limits", "max_connections", OPT_UINT, OFF(limits.max_connections), 1,
     10000000, 0, "N", "client connections per thread (503 over it)"},
    {"--connect-timeout-ms", "timeouts", "connect_timeout_ms", OPT_U64, OFF(timeouts.connect_ms), 0,
     U64MAX, 0, "MS", "upstream connect timeout (0 = none)"},
    {"--first-byte-timeout-ms", "timeouts", "first_byte_timeout_ms", OPT_U64,
     OFF(timeouts.first_byte_ms), 0, U64MAX, 0, "MS",
     "upstream request sent -> first response byte (0 = none)"},
    {"--idle-timeout-ms", "timeouts", "idle_timeout_ms", OPT_U64, OFF(timeouts.idle_ms), 0, U64MAX,
     0, "MS", "longest gap between upstream response chunks (0 = none)"},
    {"--request-timeout-ms", "timeouts", "request_timeout_ms", OPT_U64, OFF(timeouts.total_ms), 0,
     U64MAX, 0, "MS", "whole upstream request (0 = none)"},
    {"--prefill-timeout-ms", "timeouts", "prefill_timeout_ms", OPT_U64, OFF(prefill_timeout_ms), 0,
     U64MAX, 0, "MS", "prefill's whole answer (0 = none)"},
    {"--max-retries", "retries", "max_retries", OPT_UINT, OFF(max_retries), 0, 100, 0, "N",
     "retries with a new pair before any byte reached the client"},
    {"--retry-backoff-ms", "retries", "retry_backoff_ms", OPT_U64, OFF(retry_backoff_ms), 0, U64MAX,
     0, "MS", "first retry back-off (doubles, with jitter)"},
    {"--retry-backoff-max-ms", "retries", "retry_backoff_max_ms", OPT_U64,
     OFF(retry_backoff_max_ms), 0, U64MAX, 0, "MS", "retry back-off cap"},
    {"--retry-budget-ms", "retries", "retry_budget_ms", OPT_U64, OFF(retry_budget_ms), 0, U64MAX, 0,
     "MS", "no retry starts later than this after the request arrived"},
    {"--migration-limit", "retries", "migration_limit", OPT_UINT, OFF(migration_limit), 0, 100, 0,
     "N", "a stream whose decode dies goes on on another one, this many times (0 = never)"},
    {"--max-concurrent-requests", "admission", "max_concurrent_requests", OPT_UINT,
     OFF(max_concurrent_requests), 0, 10000000, 0, "N",
     "requests proxied at once, all threads (0 = unlimited)"},
    {"--queue-size", "admission", "queue_size", OPT_UINT, OFF(queue_size), 0, 10000000, 0, "N",
     "requests waiting for admission; beyond it 429 (0 = no queue)"},
    {"--queue-timeout-ms", "admission", "queue_timeout_ms", OPT_U64, OFF(queue_timeout_ms), 1,
     U64MAX, 0, "MS", "longest wait in the queue, then 408"},
    {"--priority-preempt", "admission", "priority_preempt", OPT_BOOL, OFF(priority_preempt), 0, 1,
     0, "", "a higher class sheds the newest queued lower-class request when the queue is full"},
    {"--priority-reserve-pct", "admission", "priority_reserve_pct", OPT_UINT,
     OFF(priority_reserve_pct), 0, 1000, 0, "PCT",
     "slots interactive may use beyond --max-concurrent-requests, in % (system: twice)"},
    {"--priority-to-workers", "admission", "priority_to_workers", OPT_BOOL,
     OFF(priority_to_workers), 0, 1, 0, "",
     "vLLM PD legs carry the class as vLLM's priority (needs --scheduling-policy priority)"},
    {"--max-worker-requests", "admission", "max_worker_requests", OPT_UINT,
     OFF(max_worker_requests), 0, 10000000, 0, "N",
     "in-flight requests per worker (0 = unlimited)"},
    {"--check-interval-ms", "health", "check_interval_ms", OPT_U64, OFF(check_interval_ms), 0,
     U64MAX, 0, "MS", "active health check interval (0 = no active checks)"},
    {"--check-fast-interval-ms", "health", "check_fast_interval_ms", OPT_U64,
     OFF(check_fast_interval_ms), 1, U64MAX, 0, "MS",
     "check interval while a worker changes state"},
    {"--check-down-interval-ms", "health", "check_down_interval_ms", OPT_U64,
     OFF(check_down_interval_ms), 1, U64MAX, 0, "MS", "check interval while a worker is down"},
    {"--check-timeout-ms", "health", "check_timeout_ms", OPT_U64, OFF(check_timeout_ms), 1, U64MAX,
     0, "MS", "one health check, connect included"},
    {"--check-rise", "health", "check_rise", OPT_UINT, OFF(check_rise), 1, 1000, 0, "N",
     "passing checks for a down worker to come up"},
    {"--check-fall", "health", "check_fall", OPT_UINT, OFF(check_fall), 1, 1000, 0, "N",
     "failing checks for an up worker to go down"},
    {"--check-path", "health", "check_path", OPT_STR, OFF(check_path), 0, 0, 0, "PATH",
     "health check path (after the worker's URL prefix)"},
    {"--breaker-threshold", "health", "breaker_threshold", OPT_UINT, OFF(breaker_threshold), 0,
     1000000, 0, "N", "consecutive failures that open a worker's breaker (0 = off)"},
    {"--breaker-cooldown-ms", "health", "breaker_cooldown_ms", OPT_U64, OFF(breaker_cooldown_ms), 1,
     U64MAX, 0, "MS", "first open period of a breaker (doubles per re-open)"},
    {"--breaker-cooldown-max-ms", "health", "breaker_cooldown_max_ms", OPT_U64,
     OFF(breaker_cooldown_max_ms), 1, U64MAX, 0, "MS", "longest open period"},
    {"--drain-timeout-ms", NULL, "drain_timeout_ms", OPT_U64, OFF(drain_timeout_ms), 0, U64MAX, 0,
     "MS", "SIGTERM: time in-flight requests get to finish"},
    {"--worker-drain-timeout-ms", NULL, "worker_drain_timeout_ms", OPT_U64,
     OFF(worker_drain_timeout_ms), 0, U64MAX, 0, "MS",
     "a removed worker's in-flight requests get this long"},
    /* Authentication, authorisation and resource limits. */
    {"--api-key", "auth", "api_key", OPT_STRLIST, OFF(api_keys), 0, 0, 0, "KEY",
     "accepted Bearer key on inference routes (repeatable)"},
    {"--api-key-file", "auth", "api_key_file", OPT_STR, OFF(api_key_file), 0, 0, 0, "FILE",
     "accepted keys, one per line (re-read on SIGHUP)"},
    {"--metrics-token", "auth", "metrics_token", OPT_STR, OFF(metrics_token), 0, 0, 0, "TOKEN",
     "Bearer token /metrics requires (none: /metrics is open)"},
    {"--admin-token", "auth", "admin_token", OPT_STR, OFF(admin_token), 0, 0, 0, "TOKEN",
     "Bearer token of the admin routes (none: loopback clients only)"},
    {"--admin-token-file", "auth", "admin_token_file", OPT_STR, OFF(admin_token_file), 0, 0, 0,
     "FILE", "the admin token from a file (re-read on SIGHUP)"},
    {"--rate-limit", "auth", "rate_limit", OPT_RATE, OFF(rate_limit), 0, 0, 0, "RPS[:BURST]",
     "requests per second per API key (per client address without keys); 429 over it"},
    {"--forward-authorization", "auth", "forward_authorization", OPT_BOOL,
     OFF(forward_authorization), 0, 1, 0, "", "pass the client's Authorization to workers"},
    {"--worker-api-key", "auth", "worker_api_key", OPT_STR, OFF(worker_api_key), 0, 0, 0, "KEY",
     "Bearer key sent to workers that have no api_key of their own"},
    {"--max-buffered-bytes", "limits", "max_buffered_bytes", OPT_SIZE,
     OFF(limits.max_buffered_bytes), 0, (uint64_t)1 << 50, 0, "N",
     "request bodies + queued responses held at once, all threads (0 = 1/4 of RAM)"},
    {"--max-sse-event-bytes", "limits", "max_sse_event_bytes", OPT_SIZE, OFF(max_sse_event_bytes),
     1024, (uint64_t)1 << 40, 0, "N",
     "largest SSE event a worker may stream; past it the stream ends with an error event"},
    /* Shared registry on etcd. */
    {"--registry", "registry", "url", OPT_STR, OFF(registry_url), 0, 0, 0, "URL",
     "share workers through etcd: etcd[s]://host:port[,host:port...]/prefix"},
    {"--registry-user", "registry", "user", OPT_STR, OFF(registry_user), 0, 0, 0, "NAME",
     "etcd user (authentication)"},
    {"--registry-password-file", "registry", "password_file", OPT_STR, OFF(registry_password_file),
     0, 0, 0, "FILE", "file holding the etcd user's password"},
    {"--registry-timeout-ms", "registry", "timeout_ms", OPT_U64, OFF(registry_timeout_ms), 1,
     U64MAX, 0, "MS", "one etcd call, connect included"},
    /* TLS: the client port, and the router's connections to https:// workers. */
    {"--tls-cert", "tls", "cert", OPT_STR, OFF(tls_cert), 0, 0, 0, "FILE",
     "serve HTTPS: certificate chain (PEM, leaf first); reloaded on SIGHUP"},
    {"--tls-key", "tls", "key", OPT_STR, OFF(tls_key), 0, 0, 0, "FILE",
     "private key (PEM) of --tls-cert; reloaded on SIGHUP"},
    {"--tls-client-ca", "tls", "client_ca", OPT_STR, OFF(tls_client_ca), 0, 0, 0, "FILE",
     "require client certificates issued by this CA (mTLS)"},
    {"--upstream-ca", "tls", "upstream_ca", OPT_STR, OFF(upstream_ca), 0, 0, 0, "FILE",
     "CA bundle that https:// workers are verified against"},
    {"--upstream-cert", "tls", "upstream_cert", OPT_STR, OFF(upstream_cert), 0, 0, 0, "FILE",
     "client certificate presented to https:// workers (mTLS)"},
    {"--upstream-key", "tls", "upstream_key", OPT_STR, OFF(upstream_key), 0, 0, 0, "FILE",
     "private key of --upstream-cert"},
    /* cache- and session-aware routing (policy.h) */
    {"--cache-threshold-pct", "routing", "cache_threshold_pct", OPT_UINT,
     OFF(policy_params.cache_threshold_pct), 0, 100, 0, "N",
     "cache_aware: a match must cover more than N% of the prompt"},
    {"--balance-abs-threshold", "routing", "balance_abs_threshold", OPT_UINT,
     OFF(policy_params.balance_abs_threshold), 0, 1000000, 0, "N",
     "load guard: imbalanced when max - min in-flight > N"},
    {"--balance-rel-threshold-pct", "routing", "balance_rel_threshold_pct", OPT_UINT,
     OFF(policy_params.balance_rel_threshold_pct), 100, 1000000, 0, "N",
     "load guard: and max > N% of min"},
    {"--cache-max-blocks", "routing", "cache_max_blocks", OPT_SIZE,
     OFF(policy_params.cache_max_blocks), 1, 1ull << 32, 0, "N",
     "cache_aware: per-worker tree bound (prefix names, LRU)"},
    {"--cache-block-words", "routing", "cache_block_words", OPT_UINT,
     OFF(policy_params.cache_block_words), 1, 65536, 0, "N", "cache_aware: words per tree block"},
    {"--hash-vnodes", "routing", "hash_vnodes", OPT_UINT, OFF(policy_params.hash_vnodes), 1, 4096,
     0, "N", "consistent_hash: virtual nodes per worker"},
    {"--session-key-field", "routing", "session_key_field", OPT_STR, OFF(session_key_field), 0, 0,
     0, "NAME", "JSON field used as the session key after the headers and `user`"},
    /* TLS to etcd: an etcds:// --registry; reloaded on SIGHUP. */
    {"--registry-ca", "registry", "ca", OPT_STR, OFF(registry_ca), 0, 0, 0, "FILE",
     "CA bundle etcd's certificate is verified against (etcds:// only)"},
    {"--registry-cert", "registry", "cert", OPT_STR, OFF(registry_cert), 0, 0, 0, "FILE",
     "client certificate presented to etcd (its --client-cert-auth)"},
    {"--registry-key", "registry", "key", OPT_STR, OFF(registry_key), 0, 0, 0, "FILE",
     "private key of --registry-cert"},
    /* PD protocols: vLLM's NIXL / Mooncake connectors beside SGLang's. */
    {"--pd-protocol", NULL, "pd_protocol", OPT_STR, OFF(pd_protocol), 0, 0, 0, "P",
     "protocol of workers registered without one: sglang | vllm-nixl | vllm-mooncake"},
    /* reported load for least_load (load_poll.h), cache_aware refinements */
    {"--load-poll-interval-ms", "routing", "load_poll_interval_ms", OPT_U64,
     OFF(load_poll_interval_ms), 0, 3600000, 0, "MS",
     "poll every worker's /get_load this often; least_load adds the reported load (0 = off)"},
    {"--cache-tie-pct", "routing", "cache_tie_pct", OPT_UINT, OFF(policy_params.cache_tie_pct), 0,
     100, 0, "N",
     "cache_aware: matches within N% of the best are ties, least load wins (0 = exact)"},
    {"--cache-l3-pct", "routing", "cache_l3_pct", OPT_UINT, OFF(policy_params.cache_l3_pct), 0, 100,
     0, "P",
     "cache_aware, workers sharing a KV store (L3): fetching a prefix costs P% of computing it; "
     "the cheapest worker wins, queued words included (0 = off)"},
    {"--balance-by-words", "routing", "balance_by_words", OPT_BOOL,
     OFF(policy_params.balance_by_words), 0, 1, 0, "",
     "cache_aware: the load guard compares in-flight prompt words, not requests"},
    /* precise routing on KV events (policy_precise.h, kv_route.h) */
    {"--precise-prefill-weight-pct", "routing", "precise_prefill_weight_pct", OPT_UINT,
     OFF(policy_params.precise_prefill_weight_pct), 0, 100000, 0, "N",
     "precise: weight of the uncached prefill tokens in the cost, %"},
    {"--precise-load-weight-pct", "routing", "precise_load_weight_pct", OPT_UINT,
     OFF(policy_params.precise_load_weight_pct), 0, 100000, 0, "N",
     "precise: weight of the worker's in-flight prompt tokens in the cost, %"},
    {"--precise-l2-credit-pct", "routing", "precise_l2_credit_pct", OPT_UINT,
     OFF(policy_params.precise_l2_credit_pct), 0, 100, 0, "N",
     "precise: an L2 (CPU) block's worth, % of an L1 block"},
    {"--precise-l3-credit-pct", "routing", "precise_l3_credit_pct", OPT_UINT,
     OFF(policy_params.precise_l3_credit_pct), 0, 100, 0, "N",
     "precise: a block in the KV store (L3, --store-kv-events), % of an L1 block, on every "
     "worker"},
    {"--store-kv-events", "routing", "store_kv_events", OPT_STR, OFF(store_kv_events), 0, 0, 0,
     "EP", "precise: the baton-store master's KV events (ZMQ); its blocks count as L3 everywhere"},
    {"--store-kv-events-replay", "routing", "store_kv_events_replay", OPT_STR,
     OFF(store_kv_events_replay), 0, 0, 0, "EP",
     "the store master's KV event replay endpoint (history on subscribe and after a gap)"},
    {"--precise-tie-pct", "routing", "precise_tie_pct", OPT_UINT,
     OFF(policy_params.precise_tie_pct), 0, 100, 0, "N",
     "precise: costs within N% of the prompt's tokens tie; the least loaded wins"},
    {"--precise-temperature-pct", "routing", "precise_temperature_pct", OPT_UINT,
     OFF(policy_params.precise_temperature_pct), 0, 100000, 0, "N",
     "precise: sample with weight exp(-cost / (N% x prompt tokens)) (0 = the minimum)"},
    {"--precise-provisional-ms", "routing", "precise_provisional_ms", OPT_UINT,
     OFF(policy_params.precise_provisional_ms), 0, 600000, 0, "MS",
     "precise: a routed request's blocks count as on its worker this long (0 = off)"},
    {"--kv-events-max-blocks", "routing", "kv_events_max_blocks", OPT_U64, OFF(kv_max_blocks), 1,
     1ull << 40, 0, "N",
     "KV events: blocks indexed per worker rank; past it the stream is dropped"},
    {"--kv-events-replay-timeout-ms", "routing", "kv_events_replay_timeout_ms", OPT_UINT,
     OFF(kv_replay_timeout_ms), 1, 600000, 0, "MS",
     "KV events: one replay of a publisher's history may take this long (it never delays the "
     "other subscriptions)"},
    {"--kv-events-unmatched-after", "routing", "kv_events_unmatched_after", OPT_U64,
     OFF(kv_unmatched_after), 1, 1ull << 40, 0, "N",
     "KV events: warn when a worker's blocks matched none of this many routed requests"},
    {"--pd-uncached-token-threshold", "routing", "pd_uncached_token_threshold", OPT_UINT,
     OFF(pd_uncached_threshold), 0, 1u << 30, 0, "N",
     "PD with precise: the decode alone when it holds all but <= N prompt tokens (0 = off)"},
    {"--balance-by-tokens", "routing", "balance_by_tokens", OPT_BOOL,
     OFF(policy_params.balance_by_tokens), 0, 1, 0, "",
     "least_load and the in-flight counts use the prompt's real tokens (a model with a "
     "--tokenizer) instead of its words"},
    /* the router's tokenizers (rtok.h) */
    {"--tokenizer", NULL, "tokenizer", OPT_MODELMAP, OFF(tokenizers), 0, 0, 0, "[MODEL=]PATH",
     "a model's tokenizer.json (or its directory): prompts are tokenized in the router "
     "(repeatable; without MODEL= every model without its own)"},
    {"--max-model-len", NULL, "max_model_len", OPT_MODELMAP, OFF(max_model_lens), 0, 0, 0,
     "[MODEL=]N",
     "context length: prompt tokens + max_tokens over N is refused with 400 before any worker "
     "(needs the model's --tokenizer; repeatable)"},
    {"--tokenize-cache-bytes", NULL, "tokenize_cache_bytes", OPT_SIZE, OFF(tokenize_cache_bytes), 0,
     (uint64_t)1 << 40, 0, "N",
     "per thread: bytes of prompt prefixes and their token ids kept for multi-turn chats (0 = "
     "off)"},
    {"--tokenize-cache-entries", NULL, "tokenize_cache_entries", OPT_UINT,
     OFF(tokenize_cache_entries), 0, 1000000, 0, "N",
     "per thread: prompt prefixes kept at most (0 = off)"},
    /* DP-rank selection (dp_rank.h) */
    {"--dp-round-robin", "routing", "dp_round_robin", OPT_BOOL, OFF(dp_round_robin), 0, 1, 0, "",
     "data-parallel workers: ranks round robin instead of the rank with the fewest requests in "
     "flight"},
};
#define N_OPTIONS (sizeof(options) / sizeof(options[0]))
const baton__opt_t *const baton__config_options = options;
const size_t baton__config_n_options = N_OPTIONS;

int baton__config_err(char *err, size_t errlen, int rc, const char *fmt, ...)
{
    if (err != NULL && errlen > 0) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return rc;
}

static unsigned default_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    if (n < 1)
        return 1;
    return n > 1024 ? 1024 : (unsigned)n;
}

int baton_config_init(baton_config_t *cfg)
{
    memset(cfg, 0, sizeof(*cfg));
    cfg->host = strdup("127.0.0.1");
    if (cfg->host == NULL)
        return BATON_ENOMEM;
    cfg->port = 8000;
    cfg->threads = default_threads();
    cfg->policy = BATON_POLICY_ROUND_ROBIN;
    cfg->prefill_policy = BATON_POLICY_ROUND_ROBIN;
    cfg->decode_policy = BATON_POLICY_ROUND_ROBIN;
    cfg->log_level = BATON_LOG_INFO;
    /* The same values as baton_http_limits_default() (http/server.h); kept here so --help can
     * print them without the HTTP library. */
    cfg->limits.max_header_bytes = 64 * 1024;
    cfg->limits.max_headers = 100;
    cfg->limits.max_body_bytes = 64 * 1024 * 1024;
    cfg->limits.header_timeout_ms = 30000;
    cfg->limits.body_timeout_ms = 60000;
    cfg->tokenize_cache_bytes = (size_t)16 << 20;
    cfg->tokenize_cache_entries = 256;
    cfg->limits.keepalive_timeout_ms = 75000;
    cfg->limits.max_connections = 10000;
    cfg->max_sse_event_bytes = BATON_CONFIG_MAX_SSE_EVENT_BYTES;
    cfg->timeouts.connect_ms = 5000;
    cfg->timeouts.first_byte_ms = 600000;
    cfg->timeouts.idle_ms = 120000;
    cfg->timeouts.total_ms = 3600000;
    cfg->prefill_timeout_ms = 600000;
    cfg->max_retries = 2;
    cfg->retry_backoff_ms = 50;
    cfg->retry_backoff_max_ms = 2000;
    cfg->retry_budget_ms = 30000;
    cfg->migration_limit = 3;
    cfg->max_concurrent_requests = 1024;
    cfg->queue_size = 1024;
    cfg->queue_timeout_ms = 30000;
    cfg->priority_reserve_pct = 50;
    cfg->max_worker_requests = 0;
    cfg->check_interval_ms = 2000;
    cfg->check_fast_interval_ms = 500;
    cfg->check_down_interval_ms = 2000;
    cfg->check_timeout_ms = 1000;
    cfg->check_rise = 2;
    cfg->check_fall = 3;
    cfg->check_path = strdup("/health");
    if (cfg->check_path == NULL) {
        free(cfg->host);
        cfg->host = NULL;
        return BATON_ENOMEM;
    }
    cfg->breaker_threshold = 5;
    cfg->breaker_cooldown_ms = 1000;
    cfg->breaker_cooldown_max_ms = 30000;
    cfg->drain_timeout_ms = 10000;
    cfg->worker_drain_timeout_ms = 30000;
    cfg->registry_timeout_ms = 2000;
    baton_policy_params_default(&cfg->policy_params);
    cfg->kv_max_blocks = 4u << 20;
    cfg->kv_unmatched_after = 100;
    cfg->kv_replay_timeout_ms = 2000;
    cfg->pd_uncached_threshold = 256;
    cfg->pd_protocol = strdup("sglang");
    if (cfg->pd_protocol == NULL) {
        free(cfg->host);
        free(cfg->check_path);
        cfg->host = cfg->check_path = NULL;
        return BATON_ENOMEM;
    }
    return 0;
}

void baton_config_free(baton_config_t *cfg)
{
    if (cfg == NULL)
        return;
    free(cfg->host);
    free(cfg->config_path);
    free(cfg->check_path);
    for (size_t i = 0; i < cfg->api_keys.n; i++)
        free(cfg->api_keys.v[i]);
    free(cfg->api_keys.v);
    baton_config_strlist_t *lists[] = {&cfg->tokenizers, &cfg->max_model_lens};
    for (size_t l = 0; l < 2; l++) {
        for (size_t i = 0; i < lists[l]->n; i++)
            free(lists[l]->v[i]);
        free(lists[l]->v);
    }
    free(cfg->api_key_file);
    free(cfg->metrics_token);
    free(cfg->store_kv_events);
    free(cfg->store_kv_events_replay);
    free(cfg->admin_token);
    free(cfg->admin_token_file);
    free(cfg->rate_limit);
    free(cfg->worker_api_key);
    free(cfg->registry_url);
    free(cfg->registry_user);
    free(cfg->registry_password_file);
    free(cfg->session_key_field);
    free(cfg->pd_protocol);
    for (size_t i = 0; i < cfg->n_workers; i++)
        baton_worker_desc_free(&cfg->workers[i]);
    free(cfg->workers);
    /* TLS */
    free(cfg->tls_cert);
    free(cfg->tls_key);
    free(cfg->tls_client_ca);
    free(cfg->upstream_ca);
    free(cfg->upstream_cert);
    free(cfg->upstream_key);
    /* TLS to etcd */
    free(cfg->registry_ca);
    free(cfg->registry_cert);
    free(cfg->registry_key);
    memset(cfg, 0, sizeof(*cfg));
}

static void resolve_policies(baton_config_t *cfg)
{
    if (!(cfg->set_flags_ & SET_PREFILL_POLICY))
        cfg->prefill_policy = cfg->policy;
    if (!(cfg->set_flags_ & SET_DECODE_POLICY))
        cfg->decode_policy = cfg->policy;
}

/* ---- typed setters ---- */

int baton__config_parse_u64(const char *s, uint64_t *v_p)
{
    if (s == NULL || *s < '0' || *s > '9') /* no sign, no spaces, no empty */
        return BATON_EINVAL;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || *end != '\0')
        return BATON_EINVAL;
    *v_p = v;
    return 0;
}

static void store_number(baton_config_t *cfg, const opt_t *o, uint64_t v)
{
    char *field = (char *)cfg + o->offset;
    switch (o->type) {
    case OPT_INT:
        *(int *)field = (int)v;
        break;
    case OPT_UINT:
        *(unsigned *)field = (unsigned)v;
        break;
    case OPT_SIZE:
        *(size_t *)field = (size_t)v;
        break;
    case OPT_U64:
        *(uint64_t *)field = v;
        break;
    default:
        break;
    }
}

/* Applies a value given as text (the command line, or a JSON string for string options). */
static int set_from_string(baton_config_t *cfg, const opt_t *o, const char *where,
                           const char *value, char *err, size_t errlen)
{
    char *field = (char *)cfg + o->offset;
    switch (o->type) {
    case OPT_MODELMAP:
    case OPT_STRLIST: {
        baton_config_strlist_t *l = (baton_config_strlist_t *)field;
        if (value[0] == '\0')
            return baton__config_err(err, errlen, BATON_EINVAL, "%s: must not be empty", where);
        char **v = realloc(l->v, (l->n + 1) * sizeof(*v));
        if (v == NULL)
            return baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
        l->v = v;
        if ((l->v[l->n] = strdup(value)) == NULL)
            return baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
        l->n++;
        return 0;
    }
    case OPT_BOOL:
        if (strcmp(value, "true") == 0 || strcmp(value, "1") == 0)
            *(int *)field = 1;
        else if (strcmp(value, "false") == 0 || strcmp(value, "0") == 0)
            *(int *)field = 0;
        else
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: expected true or false, not '%s'", where, value);
        return 0;
    case OPT_RATE:
    case OPT_STR: {
        if (value[0] == '\0')
            return baton__config_err(err, errlen, BATON_EINVAL, "%s: must not be empty", where);
        double rate, burst;
        if (o->type == OPT_RATE && baton_token_bucket_parse(value, &rate, &burst) != 0)
            return baton__config_err(
                err, errlen, BATON_EINVAL,
                "%s: expected RPS or RPS:BURST (RPS > 0, BURST an integer >= 1), not "
                "'%.64s'",
                where, value);
        if (o->offset == OFF(check_path) &&
            (value[0] != '/' || strlen(value) >= 128 || strpbrk(value, " \r\n\t") != NULL))
            return baton__config_err(
                err, errlen, BATON_EINVAL,
                "%s: must be a path starting with '/', without spaces, under 128 bytes", where);
        baton_pd_protocol_t proto;
        if (o->offset == OFF(pd_protocol) && baton_pd_protocol_parse(value, &proto) != 0)
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: unknown protocol '%s' (sglang, vllm-nixl, vllm-mooncake)",
                                     where, value);
        char *s = strdup(value);
        if (s == NULL)
            return baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
        free(*(char **)field);
        *(char **)field = s;
        return 0;
    }
    case OPT_POLICY: {
        baton_policy_kind_t k;
        if (baton_policy_parse(value, &k) != 0)
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: unknown policy '%s' (round_robin, random, power_of_two, "
                                     "least_load, consistent_hash, cache_aware, precise)",
                                     where, value);
        *(baton_policy_kind_t *)field = k;
        cfg->set_flags_ |= o->set_flag;
        return 0;
    }
    case OPT_LOGLEVEL: {
        baton_log_level_t l;
        if (baton_log_parse_level(value, &l) != 0)
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: unknown log level '%s' (debug, info, warn, error)", where,
                                     value);
        *(baton_log_level_t *)field = l;
        return 0;
    }
    default: {
        uint64_t v;
        if (baton__config_parse_u64(value, &v) != 0)
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: not a non-negative integer: '%s'", where, value);
        if (v < o->min || v > o->max)
            return baton__config_err(
                err, errlen, BATON_EINVAL, "%s: %llu is out of range %llu..%llu", where,
                (unsigned long long)v, (unsigned long long)o->min, (unsigned long long)o->max);
        store_number(cfg, o, v);
        return 0;
    }
    }
}

/* A per-model map in JSON: {"MODEL": "PATH" | N, ...} becomes "MODEL=VALUE" entries; a bare
 * integer is the value for every model. */
static int set_modelmap_json(baton_config_t *cfg, const opt_t *o, const char *where, json_t *value,
                             char *err, size_t errlen)
{
    char buf[4096];
    if (json_is_integer(value) && json_integer_value(value) >= 0) {
        snprintf(buf, sizeof(buf), "%lld", (long long)json_integer_value(value));
        return set_from_string(cfg, o, where, buf, err, errlen);
    }
    const char *k;
    json_t *v;
    json_object_foreach(value, k, v)
    {
        int n;
        if (json_is_string(v))
            n = snprintf(buf, sizeof(buf), "%s=%s", k, json_string_value(v));
        else if (json_is_integer(v) && json_integer_value(v) >= 0)
            n = snprintf(buf, sizeof(buf), "%s=%lld", k, (long long)json_integer_value(v));
        else
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s.%.100s: must be a string or a non-negative integer", where,
                                     k);
        if (k[0] == '\0' || strchr(k, '=') || n < 0 || (size_t)n >= sizeof(buf))
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: a model name must be non-empty, without '=', and the "
                                     "entry under 4096 bytes",
                                     where);
        int rc = set_from_string(cfg, o, where, buf, err, errlen);
        if (rc != 0)
            return rc;
    }
    return 0;
}

static int set_from_json(baton_config_t *cfg, const opt_t *o, const char *where, json_t *value,
                         char *err, size_t errlen)
{
    switch (o->type) {
    case OPT_MODELMAP:
        if (json_is_object(value) || json_is_integer(value))
            return set_modelmap_json(cfg, o, where, value, err, errlen);
        __attribute__((fallthrough)); /* a string or an array of them */
    case OPT_STRLIST:
        if (json_is_array(value)) {
            size_t i;
            json_t *e;
            json_array_foreach(value, i, e)
            {
                if (!json_is_string(e))
                    return baton__config_err(err, errlen, BATON_EINVAL, "%s[%zu]: must be a string",
                                             where, i);
                int rc = set_from_string(cfg, o, where, json_string_value(e), err, errlen);
                if (rc != 0)
                    return rc;
            }
            return 0;
        }
        if (!json_is_string(value))
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: must be a string or an array of them", where);
        return set_from_string(cfg, o, where, json_string_value(value), err, errlen);
    case OPT_BOOL:
        if (!json_is_boolean(value))
            return baton__config_err(err, errlen, BATON_EINVAL, "%s: must be true or false", where);
        *(int *)((char *)cfg + o->offset) = json_is_true(value);
        return 0;
    case OPT_RATE:
    case OPT_STR:
    case OPT_POLICY:
    case OPT_LOGLEVEL:
        if (!json_is_string(value))
            return baton__config_err(err, errlen, BATON_EINVAL, "%s: must be a string", where);
        return set_from_string(cfg, o, where, json_string_value(value), err, errlen);
    default: {
        if (!json_is_integer(value))
            return baton__config_err(err, errlen, BATON_EINVAL, "%s: must be an integer", where);
        json_int_t v = json_integer_value(value);
        if (v < 0 || (uint64_t)v < o->min || (uint64_t)v > o->max)
            return baton__config_err(err, errlen, BATON_EINVAL,
                                     "%s: %lld is out of range %llu..%llu", where, (long long)v,
                                     (unsigned long long)o->min, (unsigned long long)o->max);
        store_number(cfg, o, (uint64_t)v);
        return 0;
    }
    }
}

/* ---- JSON file ---- */

static const opt_t *find_json_opt(const char *section, const char *key)
{
    for (size_t i = 0; i < N_OPTIONS; i++) {
        const opt_t *o = &options[i];
        if (strcmp(o->key, key) != 0)
            continue;
        if ((section == NULL) != (o->section == NULL))
            continue;
        if (section != NULL && strcmp(section, o->section) != 0)
            continue;
        return o;
    }
    return NULL;
}

/* A key of the top level that holds options ("limits", "timeouts", "retries", ...). */
static int is_section(const char *key)
{
    for (size_t i = 0; i < N_OPTIONS; i++)
        if (options[i].section != NULL && strcmp(options[i].section, key) == 0)
            return 1;
    return 0;
}

static int load_section(baton_config_t *cfg, json_t *obj, const char *section, const char *origin,
                        char *err, size_t errlen)
{
    const char *key;
    json_t *v;
    char where[256];
    json_object_foreach(obj, key, v)
    {
        if (section != NULL)
            snprintf(where, sizeof(where), "%s: %s.%s", origin, section, key);
        else
            snprintf(where, sizeof(where), "%s: %s", origin, key);
        int rc;
        if (section == NULL && is_section(key)) {
            if (!json_is_object(v))
                return baton__config_err(err, errlen, BATON_EINVAL, "%s: must be an object", where);
            rc = load_section(cfg, v, key, origin, err, errlen);
        } else if (section == NULL && strcmp(key, "workers") == 0) {
            if (!json_is_array(v))
                return baton__config_err(err, errlen, BATON_EINVAL, "%s: must be an array", where);
            size_t i;
            json_t *jw;
            rc = 0;
            json_array_foreach(v, i, jw)
            {
                snprintf(where, sizeof(where), "%s: workers[%zu]", origin, i);
                rc = baton__config_json_worker(cfg, jw, where, err, errlen);
                if (rc != 0)
                    break;
            }
        } else {
            const opt_t *o = find_json_opt(section, key);
            if (o == NULL)
                return baton__config_err(err, errlen, BATON_EINVAL, "%s: unknown key", where);
            rc = set_from_json(cfg, o, where, v, err, errlen);
        }
        if (rc != 0)
            return rc;
    }
    return 0;
}

int baton_config_load_json(baton_config_t *cfg, const char *text, const char *origin, char *err,
                           size_t errlen)
{
    json_error_t jerr;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (root == NULL)
        return baton__config_err(err, errlen, BATON_EINVAL, "%s:%d:%d: %s", origin, jerr.line,
                                 jerr.column, jerr.text);
    int rc;
    if (!json_is_object(root))
        rc = baton__config_err(err, errlen, BATON_EINVAL, "%s: the top level must be an object",
                               origin);
    else
        rc = load_section(cfg, root, NULL, origin, err, errlen);
    json_decref(root);
    if (rc == 0)
        resolve_policies(cfg);
    return rc;
}

int baton_config_load_file(baton_config_t *cfg, const char *path, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return baton__config_err(err, errlen, BATON_EINVAL, "--config: cannot read %s: %s", path,
                                 strerror(errno));
    char *text = NULL;
    size_t len = 0, cap = 0;
    int rc = 0;
    for (;;) {
        if (len + 4096 + 1 > cap) {
            if (cap > (16u << 20)) {
                rc = baton__config_err(err, errlen, BATON_EINVAL, "%s: file too large", path);
                break;
            }
            cap = cap ? cap * 2 : 8192;
            char *t = realloc(text, cap);
            if (t == NULL) {
                rc = baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
                break;
            }
            text = t;
        }
        size_t n = fread(text + len, 1, cap - len - 1, f);
        len += n;
        if (n == 0) {
            if (ferror(f))
                rc = baton__config_err(err, errlen, BATON_EINVAL, "%s: read error", path);
            break;
        }
    }
    fclose(f);
    if (rc == 0) {
        text[len] = '\0';
        rc = baton_config_load_json(cfg, text, path, err, errlen);
    }
    free(text);
    return rc;
}

/* ---- command line ---- */

/* "--name=value" or "--name value". */
const char *baton__config_flag_value(int argc, char *const argv[], int *i, const char *arg,
                                     size_t name_len)
{
    if (arg[name_len] == '=')
        return arg + name_len + 1;
    if (*i + 1 < argc)
        return argv[++*i];
    return NULL;
}

static int flag_matches(const char *arg, const char *flag)
{
    size_t n = strlen(flag);
    return strncmp(arg, flag, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

int baton_config_from_args(baton_config_t *cfg, int argc, char *const argv[], char *err,
                           size_t errlen)
{
    /* --help wins, and --config is applied before every other flag so the CLI overrides it. */
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
            return BATON_CONFIG_HELP;
    }
    for (int i = 1; i < argc; i++) {
        if (!flag_matches(argv[i], "--config"))
            continue;
        const char *path = baton__config_flag_value(argc, argv, &i, argv[i], strlen("--config"));
        if (path == NULL || path[0] == '\0')
            return baton__config_err(err, errlen, BATON_EINVAL, "--config: missing FILE");
        char *p = strdup(path);
        if (p == NULL)
            return baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
        free(cfg->config_path);
        cfg->config_path = p;
        int rc = baton_config_load_file(cfg, path, err, errlen);
        if (rc != 0)
            return rc;
    }
    size_t n_file_workers = cfg->n_workers;
    long last_prefill = -1; /* the worker the last --prefill added, for --prefill-engine-id */

    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        int rc;
        long at = -1;
        if (flag_matches(arg, "--config")) {
            baton__config_flag_value(argc, argv, &i, arg, strlen("--config")); /* done above */
            continue;
        }
        if (flag_matches(arg, "--prefill")) {
            rc = baton__config_cli_worker(cfg, BATON_ROLE_PREFILL, argc, argv, &i, "--prefill",
                                          n_file_workers, &last_prefill, err, errlen);
        } else if (flag_matches(arg, "--decode")) {
            rc = baton__config_cli_worker(cfg, BATON_ROLE_DECODE, argc, argv, &i, "--decode",
                                          n_file_workers, &at, err, errlen);
        } else if (flag_matches(arg, "--worker")) {
            rc = baton__config_cli_worker(cfg, BATON_ROLE_REGULAR, argc, argv, &i, "--worker",
                                          n_file_workers, &at, err, errlen);
        } else if (flag_matches(arg, "--prefill-engine-id")) {
            /* vLLM Mooncake: the engine id of the --prefill before it (its kv_transfer_config) */
            const char *id =
                baton__config_flag_value(argc, argv, &i, arg, strlen("--prefill-engine-id"));
            char *dup;
            if (id == NULL || id[0] == '\0')
                return baton__config_err(err, errlen, BATON_EINVAL,
                                         "--prefill-engine-id: missing ID");
            if (last_prefill < 0)
                return baton__config_err(
                    err, errlen, BATON_EINVAL,
                    "--prefill-engine-id %s: give it after the --prefill it names", id);
            if ((dup = strdup(id)) == NULL)
                return baton__config_err(err, errlen, BATON_ENOMEM, "out of memory");
            free(cfg->workers[last_prefill].engine_id);
            cfg->workers[last_prefill].engine_id = dup;
            rc = 0;
        } else {
            const opt_t *o = NULL;
            for (size_t k = 0; k < N_OPTIONS && o == NULL; k++)
                if (flag_matches(arg, options[k].flag))
                    o = &options[k];
            if (o == NULL)
                return baton__config_err(err, errlen, BATON_EINVAL, "unknown option '%s'", arg);
            /* A boolean flag stands alone; only --flag=false takes a value. */
            const char *value =
                o->type == OPT_BOOL && arg[strlen(o->flag)] == '\0'
                    ? "true"
                    : baton__config_flag_value(argc, argv, &i, arg, strlen(o->flag));
            if (value == NULL)
                return baton__config_err(err, errlen, BATON_EINVAL, "%s: missing value %s", o->flag,
                                         o->metavar);
            rc = set_from_string(cfg, o, o->flag, value, err, errlen);
        }
        if (rc != 0)
            return rc;
    }
    resolve_policies(cfg);
    return 0;
}
