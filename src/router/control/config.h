/* config.h — the router's configuration: defaults, conf/baton.json and the command line. */
#ifndef BATON_ROUTER_CONFIG_H
#define BATON_ROUTER_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "common/log.h"
#include "http/client.h"
#include "http/server.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"

/*
 * Every key of the JSON config file is also a command-line flag (underscores become dashes,
 * nested objects are flattened: "limits":{"max_body_bytes":N} is --max-body-bytes N). The
 * command line overrides the file whatever the order of the flags; --config is read first.
 *
 *  JSON key                     CLI flag                    default
 *  host                         --host HOST                 127.0.0.1
 *  port                         --port N                    8000 (0 = ephemeral)
 *  threads                      --threads N                 number of cores (1..1024)
 *  policy                       --policy P                  round_robin (regular workers, and
 *                                                           prefill/decode unless set below)
 *  prefill_policy               --prefill-policy P          = policy
 *  decode_policy                --decode-policy P           = policy
 *                               (P: round_robin | random | power_of_two | least_load |
 *                                consistent_hash | cache_aware | precise)
 *  log_level                    --log-level L               info (debug|info|warn|error)
 *  workers: [ {url, worker_type, bootstrap_port, api_key, model_id, priority, cost, labels} ]
 *                               --prefill URL [BOOTSTRAP_PORT]   (repeatable; the optional
 *                                     second word is taken as the port when it is a number
 *                                     1..65535 or "none"/"null", else it is the next flag)
 *                               --decode URL                (repeatable)
 *                               --worker URL                (repeatable; a regular worker)
 *       worker_type: "prefill" | "decode" | "regular" (default "regular");
 *       bootstrap_port: integer or null, prefill only; api_key, model_id: strings;
 *       priority: integer >= 0 (50); cost: number >= 0 (1.0); labels: object.
 *       Workers from the file and the command line are all registered; a command-line worker
 *       with the same URL as a file worker replaces it.
 *  limits.max_header_bytes      --max-header-bytes N        65536   (431 over it)
 *  limits.max_headers           --max-headers N             100     (431 over it)
 *  limits.max_body_bytes        --max-body-bytes N          67108864 (64 MiB, 413 over it)
 *  limits.header_timeout_ms     --header-timeout-ms N       30000   (408)
 *  limits.body_timeout_ms       --body-timeout-ms N         60000   (408)
 *  limits.keepalive_timeout_ms  --keepalive-timeout-ms N    75000
 *  limits.max_connections       --max-connections N         10000   (per thread; 503 over it)
 *  timeouts.connect_timeout_ms      --connect-timeout-ms N      5000
 *  timeouts.first_byte_timeout_ms   --first-byte-timeout-ms N   600000 (a 100k-token prefill
 *                                                               can take minutes)
 *  timeouts.idle_timeout_ms         --idle-timeout-ms N         120000 (gap between chunks)
 *  timeouts.request_timeout_ms      --request-timeout-ms N      3600000 (whole request)
 *  timeouts.prefill_timeout_ms      --prefill-timeout-ms N      600000 (prefill's whole answer:
 *                                                               a 100k-token prompt's prefill
 *                                                               plus queueing; 0 = none)
 *                               (timeouts: 0 = none. connect/first_byte/idle apply to every
 *                               upstream request; first_byte is decode's (or a regular
 *                               worker's) first response byte, which comes after prefill and the
 *                               KV hand-off; request_timeout_ms bounds the whole client request
 *                               across retries, from its first byte: no upstream request of it
 *                               outlives that deadline)
 *  retries.max_retries          --max-retries N             2    (extra attempts with a new
 *                                                               pair and room, only while no
 *                                                               byte reached the client, on
 *                                                               connect errors, early closes,
 *                                                               phase timeouts and 408/429/500/
 *                                                               502/503/504 from either side)
 *  retries.retry_backoff_ms     --retry-backoff-ms N        50   (first back-off; doubles per
 *                                                               retry, drawn uniformly from
 *                                                               [b/2, b] (jitter))
 *  retries.retry_backoff_max_ms --retry-backoff-max-ms N    2000 (back-off cap)
 *  retries.retry_budget_ms      --retry-budget-ms N         30000 (no retry starts later than
 *                                                               this after the request arrived)
 *  retries.migration_limit      --migration-limit N         3    (a stream whose decode dies
 *                                                               after tokens reached the client
 *                                                               goes on on another decode, at
 *                                                               most N times per request and
 *                                                               within the retry budget; only
 *                                                               workers that take a continuation:
 *                                                               docs/ROUTER.md "Migration")
 *  admission.max_concurrent_requests --max-concurrent-requests N  1024 (whole router, all
 *                                                               threads; 0 = unlimited;
 *                                                               interactive and system requests
 *                                                               have a reserve beyond it)
 *  admission.queue_size         --queue-size N              1024 (requests waiting for a slot or
 *                                                               for a worker under its cap; a
 *                                                               request beyond it gets 429
 *                                                               queue_full; 0 = no queue)
 *  admission.queue_timeout_ms   --queue-timeout-ms N        30000 (a request queued longer gets
 *                                                               408 queue_timeout)
 *  admission.priority_reserve_pct --priority-reserve-pct PCT 50  (slots interactive requests may
 *                                                               hold beyond
 *                                                               --max-concurrent-requests, in %
 *                                                               of it, at least one; system
 *                                                               twice that; 0 = none)
 *  admission.priority_preempt   --priority-preempt          off  (a request that finds the queue
 *                                                               at its class's limit
 *                                                               sheds the newest queued request
 *                                                               of a lower class, 429, and
 *                                                               takes its place)
 *  admission.priority_to_workers --priority-to-workers      off  (vLLM PD legs carry the class
 *                                                               as vLLM's integer `priority`;
 *                                                               the vLLM workers must run with
 *                                                               --scheduling-policy priority)
 *  admission.max_worker_requests --max-worker-requests N    0    (in-flight requests per worker;
 *                                                               a worker at its cap is not
 *                                                               picked; 0 = unlimited)
 *  health.check_interval_ms     --check-interval-ms N       2000 (active GET /health per worker;
 *                                                               0 = no active checks)
 *  health.check_fast_interval_ms --check-fast-interval-ms N 500  (while a worker changes state)
 *  health.check_down_interval_ms --check-down-interval-ms N 2000 (while a worker is down)
 *  health.check_timeout_ms      --check-timeout-ms N        1000
 *  health.check_rise            --check-rise N              2    (passing checks to come up)
 *  health.check_fall            --check-fall N              3    (failing checks to go down)
 *  health.check_path            --check-path PATH           /health
 *  health.breaker_threshold     --breaker-threshold N       5    (consecutive failures that open
 *                                                               a worker's circuit breaker;
 *                                                               0 = no breaker)
 *  health.breaker_cooldown_ms   --breaker-cooldown-ms N     1000 (first open period; doubles)
 *  health.breaker_cooldown_max_ms --breaker-cooldown-max-ms N 30000
 *  drain_timeout_ms             --drain-timeout-ms N        10000 (SIGTERM: in-flight requests
 *                                                               may finish this long, then are
 *                                                               cancelled; keep it below the
 *                                                               orchestrator's kill deadline)
 *  worker_drain_timeout_ms      --worker-drain-timeout-ms N 30000 (a removed worker's in-flight
 *                                                               requests may finish this long,
 *                                                               then are cancelled)
 *  Authentication, authorisation and resource limits (docs/SECURITY.md):
 *  auth.api_key (string or array) --api-key KEY             none (repeatable; with any key set,
 *                                                               inference routes need
 *                                                               "Authorization: Bearer KEY", else
 *                                                               401 invalid_api_key)
 *  auth.api_key_file            --api-key-file FILE         none (one key per line, '#' comments;
 *                                                               re-read on SIGHUP)
 *  auth.metrics_token           --metrics-token TOKEN       none (/metrics open without it)
 *  auth.admin_token             --admin-token TOKEN         none (admin routes: /workers*,
 *                                                               /add_worker, /remove_worker,
 *                                                               /list_workers; without a token
 *                                                               they answer loopback clients only)
 *  auth.admin_token_file        --admin-token-file FILE     none (first line; re-read on SIGHUP)
 *  auth.rate_limit              --rate-limit RPS[:BURST]    none (token bucket per API key, per
 *                                                               client address when no keys are
 *                                                               set; 429 with Retry-After)
 *  auth.forward_authorization   --forward-authorization     off  (pass the client's
 *                                                               Authorization header to workers)
 *  auth.worker_api_key          --worker-api-key KEY        none (sent to workers without an
 *                                                               api_key of their own)
 *  limits.max_buffered_bytes    --max-buffered-bytes N      0 = a quarter of physical memory
 *                                                               (request bodies being read plus
 *                                                               response bytes queued to
 *                                                               clients, all threads; over it a
 *                                                               body waits, 503 after the body
 *                                                               timeout)
 *  limits.max_sse_event_bytes   --max-sse-event-bytes N     16777216 (16 MiB: an SSE event of a
 *                                                               worker's stream held whole; past
 *                                                               it the stream ends with an error
 *                                                               event and the leg is closed)
 *  -- shared registry on etcd --
 *  registry.url                 --registry URL              none (etcd://host:port[,host:port
 *                                                               ...]/prefix: workers are shared
 *                                                               with every router on the prefix)
 *  registry.user                --registry-user NAME        none (etcd authentication)
 *  registry.password_file       --registry-password-file F  none (the user's password, read at
 *                                                               start)
 *  registry.timeout_ms          --registry-timeout-ms N     2000 (one etcd call)
 *  TLS (see docs/SECURITY.md). Certificates and keys are PEM files, reloaded on SIGHUP
 *  without dropping established connections:
 *  tls.cert                     --tls-cert FILE             none (with tls.key: the client port
 *                                                               speaks HTTPS only; chain allowed)
 *  tls.key                      --tls-key FILE              none
 *  tls.client_ca                --tls-client-ca FILE        none (clients must present a
 *                                                               certificate from this CA: mTLS)
 *  tls.upstream_ca              --upstream-ca FILE          system bundle (https:// workers are
 *                                                               verified: chain + host name/IP)
 *  tls.upstream_cert            --upstream-cert FILE        none (client certificate presented
 *  tls.upstream_key             --upstream-key FILE         to https:// workers: mTLS)
 *  -- cache- and session-aware routing (policy.h) --
 *  routing.cache_threshold_pct  --cache-threshold-pct N     30  (cache_aware: the best match
 *                                                               must cover more than N% of the
 *                                                               prompt's words; SGLang 0.3)
 *  routing.balance_abs_threshold --balance-abs-threshold N  64  (load guard: imbalanced when
 *                                                               max - min in-flight > N ...)
 *  routing.balance_rel_threshold_pct --balance-rel-threshold-pct N 150 (... and max > N% of
 *                                                               min; SGLang 1.5)
 *  routing.cache_max_blocks     --cache-max-blocks N        262144 (per-worker tree bound, in
 *                                                               prefix names; LRU beyond)
 *  routing.cache_block_words    --cache-block-words N       16  (words per tree block)
 *  routing.hash_vnodes          --hash-vnodes N             160 (consistent_hash virtual nodes)
 *  routing.session_key_field    --session-key-field NAME    none (a top-level JSON field used
 *                                                               as the session key after the
 *                                                               x-session-affinity /
 *                                                               X-Session-ID headers and `user`)
 *  -- TLS to etcd (see docs/SECURITY.md): registry.url etcds://host:port[,...]/prefix
 *  speaks TLS to every member (etcd's https:// client URLs); files reloaded on SIGHUP --
 *  registry.ca                  --registry-ca FILE          system bundle (etcd's certificate is
 *                                                               verified: chain + host name/IP)
 *  registry.cert                --registry-cert FILE        none (client certificate presented
 *  registry.key                 --registry-key FILE         to etcd: its --client-cert-auth)
 *  -- PD protocols --
 *  pd_protocol                  --pd-protocol P             sglang (the protocol of workers
 *                                                           registered without their own:
 *                                                           sglang | vllm-nixl | vllm-mooncake)
 *       worker entries (file and POST /workers) may add: pd_protocol (overrides the router's),
 *       engine_id and bootstrap_addr ("http://host:port"; required for a vllm-mooncake prefill,
 *       refused elsewhere), dp_size (sglang only: data-parallel ranks, 0 = none).
 *  -- reported load (load_poll.h), cache_aware refinements (policy.h) --
 *  routing.load_poll_interval_ms --load-poll-interval-ms MS 0   (0 = off; else GET /get_load of
 *                                                               every worker this often, and
 *                                                               least_load ranks by the report
 *                                                               + in-flight since)
 *  routing.cache_tie_pct        --cache-tie-pct N           0   (cache_aware: matches within N%
 *                                                               of the best are ties, the least
 *                                                               loaded wins; 0 = exact ties)
 *  routing.cache_l3_pct         --cache-l3-pct P            0   (cache_aware with workers sharing
 *                                                               a KV store: a prefix is
 *                                                               reachable everywhere, fetching it
 *                                                               costs P% of computing it; the
 *                                                               cheapest worker wins, in-flight
 *                                                               prompt words added; 0 = off)
 *  routing.balance_by_words     --balance-by-words          false (cache_aware's guard compares
 *                                                               in-flight prompt words; the
 *                                                               thresholds are then words)
 *  -- precise routing on KV events (policy_precise.h, kv_route.h) --
 *  routing.precise_prefill_weight_pct --precise-prefill-weight-pct N 100 (uncached prefill tokens'
 *                                                               weight in the cost)
 *  routing.precise_load_weight_pct --precise-load-weight-pct N 100 (in-flight tokens' weight)
 *  routing.precise_l2_credit_pct --precise-l2-credit-pct N  75  (an L2 block's worth of an L1 one)
 *  routing.precise_l3_credit_pct --precise-l3-credit-pct N  50  (a block the KV store holds, on
 *                                                               every worker, % of an L1 one)
 *  routing.store_kv_events      --store-kv-events EP        none (the store master's KV events:
 *                                                               blocks reachable as L3 by all)
 *  routing.store_kv_events_replay --store-kv-events-replay EP none (its replay endpoint)
 *  routing.precise_tie_pct      --precise-tie-pct N         2   (costs within N% of the prompt's
 *                                                               tokens tie: least load wins)
 *  routing.precise_temperature_pct --precise-temperature-pct N 0 (sample by exp(-cost/T); 0 = min)
 *  routing.precise_provisional_ms --precise-provisional-ms MS 2000 (a routed request's blocks count
 *                                                               as on its worker until confirmed)
 *  routing.kv_events_max_blocks --kv-events-max-blocks N    4194304 (per worker rank; past it the
 *                                                               subscription is dropped)
 *  routing.kv_events_replay_timeout_ms --kv-events-replay-timeout-ms MS 2000 (one replay of a
 *                                                               publisher's history)
 *  routing.kv_events_unmatched_after --kv-events-unmatched-after N 100 (requests matched with no
 *                                                               hit before a worker is reported)
 *  routing.pd_uncached_token_threshold --pd-uncached-token-threshold N 256 (PD: decode alone when
 *                                                               it holds all but <= N prompt
 * tokens; 0 = off) routing.balance_by_tokens    --balance-by-tokens         false (least_load's
 * tie-break and the in-flight counts add the prompt's real tokens, for a model with a tokenizer,
 * instead of its words)
 *  -- the router's tokenizers (rtok.h, docs/TOKENIZER.md) --
 *  tokenizer                    --tokenizer [MODEL=]PATH    none (repeatable; JSON: "PATH", an
 *                                                               array of "[MODEL=]PATH", or
 *                                                               {"MODEL": "PATH", ...}; loaded at
 *                                                               start, refused when unloadable;
 *                                                               reloaded on SIGHUP)
 *  max_model_len                --max-model-len [MODEL=]N   none (repeatable; JSON: N, an array,
 *                                                               or {"MODEL": N}; prompt +
 * max_tokens over N is a 400) tokenize_cache_bytes         --tokenize-cache-bytes N    16777216
 * (per thread; 0 = off) tokenize_cache_entries       --tokenize-cache-entries N  256 (per thread; 0
 * = off)
 *  -- DP-rank selection (dp_rank.h) --
 *  routing.dp_round_robin       --dp-round-robin            false (a data-parallel worker's rank
 *                                                               is the one with the fewest of this
 *                                                               router's requests in flight, ties
 *                                                               rotating; true: round robin)
 *                               --config FILE               none (the JSON file above)
 *                               --help                      print this and exit 0
 *
 * Unknown keys in the file and unknown flags are errors (typos must not pass silently).
 *
 * Threading: a config is built once at start-up on the main thread and is read-only while the
 * router runs (a reload builds a new one).
 * Ownership: the config owns all its strings; baton_config_free() releases them.
 */

/* --max-sse-event-bytes' default: an event carrying a long prompt's logprobs fits. */
#define BATON_CONFIG_MAX_SSE_EVENT_BYTES ((size_t)16 << 20)

/* A configured worker: the worker descriptor (worker_desc.h), owning its strings. */
typedef baton_worker_desc_t baton_config_worker_t;

/* A repeatable string option (--api-key). */
typedef struct baton_config_strlist_s {
    char **v;
    size_t n;
} baton_config_strlist_t;

typedef struct baton_config_s {
    char *host;
    int port;
    unsigned threads;
    char *config_path; /* NULL when no --config */
    baton_policy_kind_t policy;
    baton_policy_kind_t prefill_policy; /* resolved: never "unset" after parsing */
    baton_policy_kind_t decode_policy;
    baton_log_level_t log_level;
    baton_http_limits_t limits;     /* for baton_http_server_create */
    size_t max_sse_event_bytes;     /* a streamed event held whole, at most */
    baton_http_timeouts_t timeouts; /* for baton_http_request (upstream), ms, 0 = none */
    baton_config_worker_t *workers;
    size_t n_workers;

    /* Resilience (see the table above). */
    uint64_t prefill_timeout_ms;
    unsigned max_retries;
    uint64_t retry_backoff_ms;
    uint64_t retry_backoff_max_ms;
    uint64_t retry_budget_ms;
    unsigned migration_limit;
    unsigned max_concurrent_requests;
    unsigned queue_size;
    uint64_t queue_timeout_ms;
    unsigned max_worker_requests;
    unsigned priority_reserve_pct; /* --priority-reserve-pct */
    int priority_preempt;          /* --priority-preempt */
    int priority_to_workers;       /* --priority-to-workers */
    uint64_t check_interval_ms;
    uint64_t check_fast_interval_ms;
    uint64_t check_down_interval_ms;
    uint64_t check_timeout_ms;
    unsigned check_rise;
    unsigned check_fall;
    char *check_path;
    unsigned breaker_threshold;
    uint64_t breaker_cooldown_ms;
    uint64_t breaker_cooldown_max_ms;
    uint64_t drain_timeout_ms;
    uint64_t worker_drain_timeout_ms;
    /* cache- and session-aware routing */
    baton_policy_params_t policy_params;
    char *session_key_field;        /* NULL = none */
    uint64_t load_poll_interval_ms; /* reported load for least_load; 0 = off */
    /* KV-event subscriptions (kv_route.h) */
    char *store_kv_events;          /* the store master's KV events (NULL: no L3 source) */
    char *store_kv_events_replay;   /* and its replay endpoint */
    uint64_t kv_max_blocks;         /* per worker DP rank; 0 = 4 Mi */
    unsigned kv_replay_timeout_ms;  /* one replay of a publisher's history */
    uint64_t kv_unmatched_after;    /* routed requests before a never-matching worker is reported */
    unsigned pd_uncached_threshold; /* PD: decode alone when at most this many tokens uncached */

    /* Authentication, authorisation and resource limits (NULL = not set). */
    baton_config_strlist_t api_keys;
    char *api_key_file;
    char *metrics_token;
    char *admin_token;
    char *admin_token_file;
    char *rate_limit; /* "RPS[:BURST]", validated */
    int forward_authorization;
    char *worker_api_key;
    /* Shared registry on etcd; NULL = none. */
    char *registry_url;
    char *registry_user;
    char *registry_password_file;
    uint64_t registry_timeout_ms;
    /* TLS: file paths, NULL when not given. */
    char *tls_cert;
    char *tls_key;
    char *tls_client_ca;
    char *upstream_ca;
    char *upstream_cert;
    char *upstream_key;
    /* TLS to etcd: file paths, NULL when not given (etcds:// registries only). */
    char *registry_ca;
    char *registry_cert;
    char *registry_key;
    /* PD protocols. */
    char *pd_protocol; /* "sglang" | "vllm-nixl" | "vllm-mooncake" (validated) */
    /* DP-rank selection: 1 = round robin, 0 = least loaded (default). */
    int dp_round_robin;
    /* The router's tokenizers (rtok.h): "[MODEL=]PATH" and "[MODEL=]N" entries. */
    baton_config_strlist_t tokenizers;
    baton_config_strlist_t max_model_lens;
    size_t tokenize_cache_bytes;     /* per loop thread; 0 = no prefix cache */
    unsigned tokenize_cache_entries; /* per loop thread; 0 = no prefix cache */

    /* Private to config.c: which keys were given explicitly. */
    unsigned set_flags_;
} baton_config_t;

/* baton_config_from_args() returns this (positive) when --help was given. */
#define BATON_CONFIG_HELP 1

/* Fills the defaults (threads = number of cores). 0 or BATON_ENOMEM. */
int baton_config_init(baton_config_t *cfg);
void baton_config_free(baton_config_t *cfg);

/*
 * The whole start-up path: defaults are expected in cfg (baton_config_init); the --config file
 * (if any) is applied, then every other flag. Returns 0, BATON_CONFIG_HELP, or BATON_EINVAL /
 * BATON_ENOMEM with a one-line reason in err (e.g. "--port: not a number: 'x'"). The caller
 * prints the reason and exits with status 2. argv[0] is the program name and is skipped.
 */
int baton_config_from_args(baton_config_t *cfg, int argc, char *const argv[], char *err,
                           size_t errlen);

/* Applies one JSON config file on top of cfg (used by from_args and for reloads).
 * 0, or BATON_EINVAL / BATON_ENOMEM with the reason in err. */
int baton_config_load_file(baton_config_t *cfg, const char *path, char *err, size_t errlen);

/* Same, from JSON text (tests). `origin` names the source in messages. */
int baton_config_load_json(baton_config_t *cfg, const char *text, const char *origin, char *err,
                           size_t errlen);

/* Registers cfg's workers in reg. Stops at the first failure: BATON_EINVAL / BATON_EEXIST /
 * BATON_ENOMEM with "worker URL: reason" in err. */
int baton_config_apply_workers(const baton_config_t *cfg, baton_registry_t *reg, char *err,
                               size_t errlen);

/* Index of the first of cfg's workers [0, n) whose URL normalizes to norm_url, or -1. */
long baton_config_find_worker(const baton_config_t *cfg, size_t n, const char *norm_url);

/* Registers one configured worker with its attributes (baton_registry_add: 0, BATON_EINVAL,
 * BATON_EEXIST or BATON_ENOMEM, the registry's reason in why). */
int baton_config_add_worker(baton_registry_t *reg, const baton_config_worker_t *cw, char *why,
                            size_t whylen);

/* Prints the usage text: every flag with its default. */
void baton_config_print_help(FILE *out, const char *argv0);

#endif
