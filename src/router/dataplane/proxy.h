/* proxy.h — request dispatch: PD pairs (prefill + decode at once), regular workers, and plain
 * forwarding of info endpoints; per-loop upstream connection pools. */
#ifndef BATON_ROUTER_PROXY_H
#define BATON_ROUTER_PROXY_H

#include <stdint.h>
#include <jansson.h>
#include <uv.h>

#include <stdatomic.h>

#include "common/metrics.h"
#include "router/control/worker_health.h"
#include "http/client.h"
#include "http/server.h"
#include "router/dataplane/admission.h"
#include "router/auth.h"
#include "router/control/config.h"
#include "router/dataplane/pdreq.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"
#include "router/dataplane/resil_metrics.h"
#include "router/dataplane/router_metrics.h"

/*
 * What every router thread shares. Built once on the main thread before the loops start and
 * read-only afterwards (the registry, policies, health table, admission and metrics are
 * thread-safe themselves), except:
 *   - the three policy pointers, which a reload (SIGHUP) may swap: read them with
 *     baton_router_policy(); the old objects stay valid until the router exits;
 *   - `draining`, set once by SIGTERM (readiness answers 503 from then on).
 * health, admission and resil may be NULL (no health layer / no admission control / no
 * metrics), which tests use.
 */
typedef struct baton_router_s {
    const baton_config_t *cfg;
    baton_registry_t *registry;
    baton_policy_t *prefill_policy;
    baton_policy_t *decode_policy;
    baton_policy_t *regular_policy;
    baton_metrics_t *metrics_reg;
    baton_router_metrics_t *metrics;
    baton_whealth_t *health;
    baton_admission_t *admission;
    baton_resil_metrics_t *resil;
    struct baton_token_metrics_s *tokens; /* TTFT / ITL per route (token_metrics.h); may be NULL */
    atomic_int draining;
    baton_auth_t *auth; /* API keys, tokens, rate limits; NULL = every route open */
    /* TLS: the client port's configuration (NULL: plain HTTP) and the one for
     * https:// workers (NULL when neither --upstream-ca nor a system bundle could be loaded:
     * such workers then fail). Both are reloaded in place on SIGHUP. */
    struct baton_tls_s *server_tls;
    struct baton_tls_s *upstream_tls;
    /* PD protocols: baton_pd_stranded_releases_total{protocol,result}, in
     * metrics_reg (NULL: not counted). */
    baton_metric_family_t *pd_releases;
    baton_metric_family_t *pd_alone; /* baton_pd_decode_alone_total{protocol} */
    /* The shared memory budget (--max-buffered-bytes; NULL: none): the proxy charges the
     * response bytes it holds for a request (buffered answers, an open SSE event, events held
     * for prefill) to `used` and `upstream_used`, and keeps streams' queued bytes in their
     * share of `out_used`. */
    baton_http_budget_t *budget;
    /* The KV-event subscriptions and their index (kv_route.h), with --kv-events; NULL without:
     * the precise policy then chooses by load. */
    struct baton_kvroute_s *kv;
    /* The tokenizers (--tokenizer, rtok.h): NULL when none is configured at start. */
    struct baton_rtok_s *rtok;
} baton_router_t;

/* Registers the PD protocols' metric family in r->metrics_reg. 0 or BATON_EEXIST. */
int baton_proxy_pd_metrics_init(baton_router_t *r);

/* The policy for a role (an atomic load: a reload may swap it). */
baton_policy_t *baton_router_policy(baton_router_t *r, baton_worker_role_t role);
/* Installs a new policy for a role and returns the old one, which the caller keeps alive until
 * no loop can use it any more (in practice: until exit). */
baton_policy_t *baton_router_set_policy(baton_router_t *r, baton_worker_role_t role,
                                        baton_policy_t *p);

/*
 * One per loop/thread: the upstream pools of that loop, one per worker, created on first use
 * and dropped when the registry says the worker was removed.
 *
 * Threading: everything here runs on the owning loop's thread; nothing is shared with other
 * loops, so the request path takes no lock of its own (the registry snapshot and the metric
 * child lookups take theirs briefly).
 */
typedef struct baton_proxy_loop_s baton_proxy_loop_t;

int baton_proxy_loop_create(baton_proxy_loop_t **pl_p, uv_loop_t *loop, baton_router_t *router);

/* Starts the loop's housekeeping, on the loop's thread before it runs: a 250 ms tick (drain
 * deadlines of removed workers, queued requests waiting for a worker under its cap) and the
 * wake-up that admission control sends when capacity frees up. 0 or a libuv error. */
int baton_proxy_loop_start(baton_proxy_loop_t *pl);

/* Destroys the pools (each pool frees itself once its in-flight requests finished) and closes
 * the loop's handles; pl is freed once they closed. Call on the loop's thread after the loop's
 * HTTP server has closed, i.e. when no proxied request is alive any more. */
void baton_proxy_loop_destroy(baton_proxy_loop_t *pl);

/* The drain deadline passed (SIGTERM): every request of this loop is ended now — queued ones
 * get 503 shutting_down, proxied ones have their upstream requests closed and get 503 (or an
 * SSE error event when streaming). They finish on their own once the closes are reported. */
void baton_proxy_loop_cancel_all(baton_proxy_loop_t *pl);

baton_router_t *baton_proxy_loop_router(baton_proxy_loop_t *pl);

/* Proxied requests alive on this loop now (queued ones included). */
unsigned baton_proxy_loop_active(const baton_proxy_loop_t *pl);

/*
 * Proxies one inference request (POST chat/completions/generate). Validates the body (400),
 * then dispatches it:
 *   - to a prefill + decode pair when both roles have an eligible worker: the body with the
 *     bootstrap fields injected is serialized once and sent to both at the same time;
 *     decode's status and body (or SSE stream, passed through as it arrives) go to the client,
 *     prefill's answer is read to the end (its input logprobs merged in front when asked);
 *   - else to a regular worker (the client's body untouched);
 *   - else 503.
 * Admission first (admission.h): a slot router-wide and a pair of workers under their
 * in-flight caps, else the request waits in the loop's queue (429 when the queue is full, 503
 * after queue_timeout_ms). Workers are chosen among those the health layer admits (healthy,
 * breaker not open, not draining), avoiding the workers of failed attempts when others exist.
 * Upstream failures before any byte reached the client are retried (retry.h) with a new pair
 * and a new room after a jittered back-off; the failed attempt's other side is closed at once
 * (a retry that finds no pair — every candidate down, open or at its cap — answers the last
 * attempt's failure instead of waiting).
 * When no retry is left: 502/504 JSON naming the side (or decode's own non-2xx status and
 * body); after a stream started → an SSE error event and [DONE]. Either way the other upstream
 * request is cancelled at once; a client disconnect cancels both. Every upstream request's
 * outcome feeds its worker's circuit breaker. The request is always finished exactly once.
 */
void baton_proxy_inference(baton_proxy_loop_t *pl, baton_http_req_t *req, baton_api_t api);

/*
 * Forwards a GET (info endpoints: /v1/models, /get_server_info, ...) to one eligible worker of
 * the first role in roles[] that has one, passing its status and body through. Returns 0 when
 * the request was taken over (it will be finished), BATON_ENOWORKER when no worker of those
 * roles is eligible (the request is untouched; the caller answers).
 */
int baton_proxy_forward(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                        const baton_worker_role_t *roles, size_t n_roles);
/* The same (the request's own method, no body) to the worker with this id, when it is
 * registered and eligible; else BATON_ENOWORKER (the request untouched). */
int baton_proxy_forward_to(baton_proxy_loop_t *pl, baton_http_req_t *req, const char *route,
                           const char *worker_id);

/* ---- helpers shared with routes.c ---- */

/* Responds and records the request in the metrics (route label, status, duration, TTFB). */
int baton__respond(baton_router_t *r, baton_http_req_t *req, const char *route, int status,
                   const char *content_type, const char *body, size_t len);
int baton__respond_error(baton_router_t *r, baton_http_req_t *req, const char *route, int status,
                         const char *message, const char *type, const char *param,
                         const char *code);
/* Responds with j as compact JSON (j is consumed; NULL, or out of memory: a 500). */
void baton__respond_json(baton_router_t *r, baton_http_req_t *req, const char *route, int status,
                         json_t *j);
/* The same with one extra header (Allow, WWW-Authenticate, Retry-After); hdr may be NULL. */
void baton__respond_json_hdr(baton_router_t *r, baton_http_req_t *req, const char *route,
                             int status, json_t *j, const baton_http_header_t *hdr);

#endif
