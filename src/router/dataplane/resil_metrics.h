/* resil_metrics.h — Prometheus families of the router's resilience layer: retries, aborts sent
 * to workers, admission queue depth and time, rejections. */
#ifndef BATON_ROUTER_RESIL_METRICS_H
#define BATON_ROUTER_RESIL_METRICS_H

#include "common/metrics.h"
#include "router/control/registry.h"

/*
 * Families (registered in the router's metrics registry next to router_metrics.h's; worker
 * health and breaker families come from router/control/worker_health.h):
 *   baton_retries_total{role,reason}            counter  attempts retried with a new pair, by
 *       the role of the side that failed and why (connect|closed|timeout|status|drained)
 *   baton_retries_exhausted_total{reason}       counter  retryable failures answered to the
 *       client anyway: max_retries | out_of_time | no_worker (no pair for the retry)
 *   baton_upstream_aborts_total{role,reason}    counter  upstream requests the router closed
 *       before they ended: peer_failed (the other side of the pair failed, or the attempt is
 *       retried) | client_closed | timeout (a phase timeout) | drain_timeout (removed worker) |
 *       shutdown (SIGTERM drain deadline) | router_error
 *   baton_queue_depth                           gauge    requests waiting for admission now
 *   baton_queue_time_seconds                    histogram time spent waiting, admitted or not
 *   baton_admission_rejected_total{reason}      counter  queue_full (429) | queue_timeout (503)
 *   baton_active_requests                       gauge    requests holding an admission slot
 *   baton_stream_migrations_total{outcome}      counter  streams whose worker died after
 *       tokens reached the client: started (a continuation went to another worker) | completed
 *       (a migrated stream reached its end) | finished (only [DONE] was missing: the router
 *       ended it) | failed (a migrated stream ended with the error event) | limit
 *       (--migration-limit reached) | out_of_time (retry budget or deadline) | no_worker
 *
 * Threading: every call is thread-safe (child lookups take the family lock briefly, updates are
 * atomic); every update call accepts m == NULL (nothing counted).
 * Ownership: the metrics registry must outlive m.
 */

typedef struct baton_resil_metrics_s baton_resil_metrics_t;

/* 0, BATON_EEXIST (families already registered), BATON_ENOMEM. */
int baton_resil_metrics_create(baton_resil_metrics_t **m_p, baton_metrics_t *reg);
void baton_resil_metrics_destroy(baton_resil_metrics_t *m);

void baton_resil_metrics_retry(baton_resil_metrics_t *m, baton_worker_role_t role,
                               const char *reason);
void baton_resil_metrics_retries_exhausted(baton_resil_metrics_t *m, const char *reason);
void baton_resil_metrics_abort(baton_resil_metrics_t *m, baton_worker_role_t role,
                               const char *reason);
void baton_resil_metrics_queue_depth(baton_resil_metrics_t *m, int delta);
void baton_resil_metrics_queue_time(baton_resil_metrics_t *m, double seconds);
void baton_resil_metrics_rejected(baton_resil_metrics_t *m, const char *reason);
void baton_resil_metrics_active(baton_resil_metrics_t *m, int delta);
void baton_resil_metrics_migration(baton_resil_metrics_t *m, const char *outcome);

#endif
