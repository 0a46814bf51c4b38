/* router_metrics.h — the router's Prometheus families (baton_*) and the calls that update them. */
#ifndef BATON_ROUTER_METRICS_H
#define BATON_ROUTER_METRICS_H

#include "common/buf.h"
#include "common/metrics.h"
#include "router/control/registry.h"

/*
 * Families (all names prefixed baton_):
 *   baton_requests_total{route,status}                 counter   requests answered
 *   baton_request_duration_seconds{route}              histogram first request byte → last
 *                                                                response byte
 *   baton_time_to_first_byte_seconds{route}            histogram first request byte → first
 *                                                                response byte (router-observed)
 *   baton_model_requests_total{model,status}           counter   proxied inference requests
 *       answered, by requested model ("other" when no registered worker names it)
 *   baton_worker_in_flight_requests{worker,role}       gauge     per worker (label = worker id)
 *   baton_workers{role}                                gauge     registered workers per role
 *   baton_upstream_errors_total{role,kind}             counter   failed upstream requests,
 *       kind: connect | timeout | status_5xx | closed | protocol | canceled | other
 *
 * Label cardinality: `route` must come from a fixed set (the router's endpoints, "other" for
 * anything else, "admin" for registration calls); `status` is the numeric HTTP status.
 *
 * Threading: every function is thread-safe; the update calls take a family lock briefly for the
 * child lookup and update atomically. The worker gauges are synced from the registry when the
 * metrics are rendered (baton_router_metrics_render), so the request path never touches them.
 * Ownership: `reg` (the metrics registry) is the caller's and must outlive `m`; other parts
 * (health, transfer) may register their own families in the same registry.
 */

typedef struct baton_router_metrics_s baton_router_metrics_t;

/* Registers the families in `reg`. 0, BATON_EEXIST (already registered) or BATON_ENOMEM. */
int baton_router_metrics_create(baton_router_metrics_t **m_p, baton_metrics_t *reg);
void baton_router_metrics_destroy(baton_router_metrics_t *m); /* NULL is ignored */

/* One finished client request. ttfb_s < 0 when no response byte was sent (not observed). */
void baton_router_metrics_request_done(baton_router_metrics_t *m, const char *route, int status,
                                       double duration_s, double ttfb_s);

/* One failed upstream request; `kind` from the list above. */
/* One finished inference request for `model` (a registered model's id, or "other"). */
void baton_router_metrics_model_done(baton_router_metrics_t *m, const char *model, int status);

void baton_router_metrics_upstream_error(baton_router_metrics_t *m, baton_worker_role_t role,
                                         const char *kind);

/* Maps an error from the HTTP client (client.h on_done) to a kind: BATON_ECONNECT → "connect",
 * BATON_ETIMEOUT_* → "timeout", BATON_EEOF/BATON_ECLOSED → "closed", BATON_EUPSTREAM/EPROTO →
 * "protocol", BATON_ECANCELED → "canceled", other negative → "other". */
const char *baton_router_metrics_error_kind(int err);

/* Sets baton_workers and baton_worker_in_flight_requests from `workers` (removed workers'
 * series disappear). Called by render; exposed for tests. */
void baton_router_metrics_sync(baton_router_metrics_t *m, baton_registry_t *workers);

/* sync(workers) then the whole metrics registry in text format 0.0.4, appended to out.
 * 0 or BATON_ENOMEM. `workers` may be NULL (no sync). */
int baton_router_metrics_render(baton_router_metrics_t *m, baton_registry_t *workers,
                                baton_buf_t *out);

/* Buckets used by the two histograms (seconds, 0.0005 .. 600). */
extern const double baton_router_latency_buckets[];
extern const size_t baton_router_latency_buckets_n;

#endif
