/* router/control/worker_health.h — worker (HTTP) health for the router: per-worker breaker and
 * check state, the admission call the request path makes, the one status-changing function,
 * metrics. */
#ifndef BATON_ROUTER_WORKER_HEALTH_H
#define BATON_ROUTER_WORKER_HEALTH_H

#include "common/metrics.h"
#include "health/breaker.h"
#include "router/control/worker_health_types.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"

/*
 * One baton_whealth_t per router, shared by every loop. It keeps, per registered worker, a
 * circuit breaker (breaker.h: passive signals, the outcomes of real requests) and the active-
 * check counter (worker_health_types.h; fed by worker_check.h). Both are published to the
 * registry's atomics (health HEALTHY/UNHEALTHY, breaker CLOSED/OPEN/HALF_OPEN), so registry
 * snapshots, /workers and /readiness see them without calling in here.
 *
 * ---- How the request path uses it ----
 *
 * The router picks through baton_pick() (router/dataplane/pick.h), which admits each candidate its
 * policy chooses with baton_whealth_admit() under the per-worker caps; baton_whealth_pick() is the
 * same without caps or an avoid list. Either way the pattern is:
 *
 *   baton_whealth_ticket_t t;
 *   baton_worker_t *w = baton_whealth_pick(wh, policy, BATON_ROLE_DECODE, &t);
 *   if (w == NULL) → BATON_ENOWORKER (503)
 *   ... send the request ...
 *   when its outcome is known (on_done, or earlier when a 2xx head arrived and the rest is a
 *   stream): baton_whealth_done(wh, w, t, baton_breaker_outcome(err, status));
 *   baton_worker_unref(w);
 *
 * Rules:
 *   - "May I pick this worker now?" is baton_whealth_admit(): registered, not draining, health
 *     UP, and the breaker admits (CLOSED; HALF_OPEN with its probe slot free — admit takes the
 *     slot). baton_whealth_pick() = candidates that could be admitted → policy → admit,
 *     re-choosing without the worker if the admit lost a race (a half-open probe slot).
 *   - Every successful admit/pick is matched by exactly one baton_whealth_done(), also when the
 *     request was never sent (e.g. the prefill was picked but no decode was: report NEUTRAL),
 *     so that a half-open probe slot is never held for nothing.
 *   - Outcomes: baton_breaker_outcome(err, status) — connect errors, timeouts, 5xx, early close
 *     and malformed responses are failures, 4xx and cancels are neutral. A request the router
 *     retries elsewhere still reports its own outcome for this worker.
 *   - A worker that a plain registry snapshot (BATON_SNAP_ELIGIBLE) returns is healthy and not
 *     OPEN but may still be refused by admit (a half-open probe already out): callers that do
 *     their own selection must call admit and pick again on 0.
 *
 * ---- How the router wires it up ----
 *
 *   start-up (main thread, before the loops run):
 *     baton_whealth_config_init(&cfg);  (then the router's flags/config on top)
 *     baton_whealth_create(&wh, registry, &cfg);
 *     baton_whealth_metrics_init(wh, metrics_registry);
 *   on ONE loop (the first router loop, or a dedicated thread's loop):
 *     baton_wcheck_create(&wc, loop, wh); baton_wcheck_start(wc);   (worker_check.h; also when
 *     cfg.check.enabled == 0: it then only runs the sync that lets breakers recover on time)
 *   shutdown: baton_wcheck_close(wc, cb, ctx) on that loop; once cb ran and no loop can call
 *     in any more, baton_whealth_destroy(wh).
 *
 * Threading: every function is thread-safe (an rwlock on the per-worker table: readers on the
 * request path, the writer only when workers come and go; each breaker has its own mutex, taken
 * only while it is not CLOSED or has counted failures).
 * Ownership: the registry and the metrics registry are the caller's and must outlive `wh`.
 * The table holds a reference on each worker until a sync sees it removed.
 */

typedef struct baton_whealth_s baton_whealth_t;

/* cfg NULL = defaults (copied). 0, BATON_EINVAL (NULL reg) or BATON_ENOMEM. */
int baton_whealth_create(baton_whealth_t **wh_p, baton_registry_t *reg,
                         const baton_whealth_config_t *cfg);
/* No other call may run concurrently or afterwards; stop the checker(s) first. */
void baton_whealth_destroy(baton_whealth_t *wh); /* NULL is ignored */

const baton_whealth_config_t *baton_whealth_config(const baton_whealth_t *wh);
baton_registry_t *baton_whealth_registry(const baton_whealth_t *wh);

/*
 * Registers, in the router's metrics registry (labels: worker = worker id, role = its role):
 *   baton_worker_health{worker,role}                  gauge   1 up, 0 down
 *   baton_worker_breaker_state{worker,role}           gauge   0 closed, 1 open, 2 half-open
 *   baton_worker_health_transitions_total{worker,to}  counter to = up | down
 *   baton_worker_breaker_transitions_total{worker,to} counter to = closed | open | half_open
 * Series of removed workers disappear at the next sync. Call once, before the loops start.
 * 0, BATON_EEXIST (a family of that name exists already) or BATON_ENOMEM.
 */
int baton_whealth_metrics_init(baton_whealth_t *wh, baton_metrics_t *metrics);

/* ---- the request path ---- */

/* 1 and *ticket_p set when a request may be sent to w now (see "Rules"), else 0. */
int baton_whealth_admit(baton_whealth_t *wh, baton_worker_t *w, baton_whealth_ticket_t *ticket_p);

/* A NEW reference to an admitted worker of `role` chosen by `policy`, with its ticket; NULL
 * when none can be admitted (or on allocation failure). */
baton_worker_t *baton_whealth_pick(baton_whealth_t *wh, baton_policy_t *policy,
                                   baton_worker_role_t role, baton_whealth_ticket_t *ticket_p);

/* The outcome of one admitted request (exactly once per ticket). */
void baton_whealth_done(baton_whealth_t *wh, baton_worker_t *w, baton_whealth_ticket_t ticket,
                        baton_breaker_outcome_t outcome);

/* ---- active checks and status ---- */

/*
 * One finished active check of w (the checker calls this): ok, the HTTP status (0 when none)
 * and the client error (0 when none). Moves the counter and, on a crossing, changes the status
 * through baton_whealth_set_health(). Returns the state after (the checker picks its next
 * interval from it), or BATON_ENOTFOUND when w is no longer registered.
 */
int baton_whealth_check_result(baton_whealth_t *wh, baton_worker_t *w, int ok, int status, int err);

/*
 * THE function that changes a worker's health: sets the counter to the settled side, publishes
 * HEALTHY/UNHEALTHY to the registry, updates the metrics and logs
 *   `worker_health_changed id=… url=… role=… from=up|down to=up|down reason="…"`.
 * Going UP also ends an OPEN breaker's cool-down (→ HALF_OPEN): the check just proved the
 * worker answers, so one probe request may confirm it at once instead of waiting up to
 * cooldown_max_ms (full service within a couple of check intervals of a worker's return).
 * No effect (and no log) when the side does not change. BATON_ENOTFOUND for a removed worker.
 */
int baton_whealth_set_health(baton_whealth_t *wh, baton_worker_t *w, int up, const char *reason);

/* Closes w's breaker (operator action). 0 or BATON_ENOTFOUND. */
int baton_whealth_breaker_reset(baton_whealth_t *wh, baton_worker_t *w);

/*
 * Housekeeping, called every sync_interval_ms by the checker (worker_check.h) and safe to call
 * from anywhere: when the registry's generation moved, adds state for new workers and drops it
 * for removed ones (and their metric series); then lets every breaker's cool-down expire on
 * time (OPEN → HALF_OPEN), so snapshots see recovered workers without waiting for a request.
 */
void baton_whealth_sync(baton_whealth_t *wh);

/* 0 and *info, or BATON_ENOTFOUND (w not known: removed, or not synced yet). */
int baton_whealth_info(baton_whealth_t *wh, baton_worker_t *w, baton_whealth_info_t *info);

/* Workers with state in the table now (tests). */
size_t baton_whealth_size(baton_whealth_t *wh);

#endif
