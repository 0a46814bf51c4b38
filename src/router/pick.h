/* pick.h — choosing the worker for one upstream request: eligible workers the health layer
 * admits, under the per-worker in-flight cap, avoiding workers that failed this request. */
#ifndef BATON_ROUTER_PICK_H
#define BATON_ROUTER_PICK_H

#include <stddef.h>

#include "router/worker_health.h"
#include "router/policy.h"
#include "router/registry.h"

/*
 * Candidates are the registry's BATON_SNAP_ELIGIBLE workers of the role (healthy, breaker not
 * open, not draining or removed) whose in-flight count is under `cap` (0 = no cap). Those not
 * in avoid[] are chosen first; avoided ones only when nothing else is left (a retry prefers a
 * new pair, but one worker is better than none). The policy chooses; the health layer must
 * admit (a half-open breaker admits one probe at a time): a refused worker is dropped and the
 * policy chooses again among the rest. The chosen worker's in-flight count is raised at once,
 * with a compare-and-swap against the cap, so concurrent picks on several threads never push a
 * worker past its cap.
 *
 * Threading: thread-safe (the registry, policy and health layer are). Ownership: on
 * BATON_PICK_OK, out->w is a new reference holding one in-flight slot and out->ticket is the
 * health ticket (0 without a health layer); give both back with baton_pick_release(), or keep
 * them in the upstream request and report its outcome (baton_whealth_done) and
 * baton_worker_in_flight_dec() yourself.
 */

typedef enum {
    BATON_PICK_OK = 0,
    BATON_PICK_CAPPED, /* eligible workers exist, but every one is at its cap */
    BATON_PICK_NONE,   /* no eligible worker (or the health layer refused them all) */
} baton_pick_rc_t;

typedef struct baton_pick_s {
    baton_worker_t *w;
    baton_whealth_ticket_t ticket;
} baton_pick_t;

/* health may be NULL (every eligible worker is admitted). */
baton_pick_rc_t baton_pick(baton_registry_t *reg, baton_policy_t *policy, baton_whealth_t *health,
                           unsigned cap, baton_worker_role_t role, baton_worker_t *const *avoid,
                           size_t n_avoid, baton_pick_t *out);

/* The same among the workers for which keep(w, arg) is 1 only (unlike avoid[], a hard rule:
 * e.g. a decode must speak its prefill's PD protocol). keep NULL: every worker. */
typedef int (*baton_pick_keep_cb)(const baton_worker_t *w, const void *arg);
baton_pick_rc_t baton_pick_if(baton_registry_t *reg, baton_policy_t *policy,
                              baton_whealth_t *health, unsigned cap, baton_worker_role_t role,
                              baton_worker_t *const *avoid, size_t n_avoid, baton_pick_keep_cb keep,
                              const void *keep_arg, baton_pick_t *out);

/* Gives back a pick that was not used: the ticket with `outcome` (NEUTRAL: nothing was learnt
 * about the worker), the in-flight slot and the reference. No-op when p->w is NULL. */
void baton_pick_release(baton_whealth_t *health, baton_pick_t *p, baton_breaker_outcome_t outcome);

#endif
