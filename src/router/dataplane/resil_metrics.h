/* resil_metrics.h — Prometheus families of the router's resilience layer: retries, aborts sent
 * to workers, admission queue depth and time, rejections, and admission per priority class. */
#ifndef BATON_ROUTER_RESIL_METRICS_H
#define BATON_ROUTER_RESIL_METRICS_H

#include "common/metrics.h"
#include "router/control/registry.h"
#include "router/dataplane/priority.h"

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
 *   baton_admission_rejected_total{reason}      counter  queue_full (429) | queue_timeout (408)
 *   baton_active_requests                       gauge    requests holding an admission slot
 *   baton_stream_migrations_total{outcome}      counter  streams whose worker died after
 *       tokens reached the client: started (a continuation went to another worker) | completed
 *       (a migrated stream reached its end) | finished (only [DONE] was missing: the router
 *       ended it) | failed (a migrated stream ended with the error event) | limit
 *       (--migration-limit reached) | out_of_time (retry budget or deadline) | no_worker
 * Per priority class (priority="bulk|default|interactive|system", every class present from the
 * start):
 *   baton_priority_admitted_total{priority}     counter  requests admitted (dispatched to a
 *       worker for the first time), queued before or not
 *   baton_priority_queued_total{priority}       counter  requests that had to wait in the queue
 *   baton_priority_queue_depth{priority}        gauge    requests of the class waiting now
 *   baton_priority_queue_time_seconds{priority} histogram time spent waiting, admitted or not
 *   baton_priority_shed_total{priority,reason}  counter  requests refused by admission:
 *       queue_full (429: the queue was at the class's limit) | preempted (429: shed from the queue
 *       for a higher class, --priority-preempt) | queue_timeout (408)
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

void baton_resil_metrics_prio_admitted(baton_resil_metrics_t *m, baton_prio_t p);
/* One request of class p joined (+1, counted in queued_total too when `fresh`) or left (-1). */
void baton_resil_metrics_prio_depth(baton_resil_metrics_t *m, baton_prio_t p, int delta, int fresh);
void baton_resil_metrics_prio_queue_time(baton_resil_metrics_t *m, baton_prio_t p, double seconds);
void baton_resil_metrics_prio_shed(baton_resil_metrics_t *m, baton_prio_t p, const char *reason);

#endif
