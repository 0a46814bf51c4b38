/* pick.h — choosing the worker for one upstream request: eligible workers the health layer
 * admits, under the per-worker in-flight cap, avoiding workers that failed this request. */
#ifndef BATON_ROUTER_PICK_H
#define BATON_ROUTER_PICK_H

#include <stddef.h>

#include "router/control/worker_health.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"

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
    uint32_t tokens; /* prompt words added to w->in_flight_tokens (given back with the slot) */
} baton_pick_t;

/* health may be NULL (every eligible worker is admitted). */
baton_pick_rc_t baton_pick(baton_registry_t *reg, baton_policy_t *policy, baton_whealth_t *health,
                           unsigned cap, baton_worker_role_t role, baton_worker_t *const *avoid,
                           size_t n_avoid, baton_pick_t *out);

/* A hard filter on the candidates (see baton_pick_ctx). */
typedef int (*baton_pick_keep_cb)(const baton_worker_t *w, const void *arg);

/*
 * baton_pick with the request's context (policy.h; NULL: none). The policy chooses with it and
 * is told the choice (cache_aware records the prompt for the chosen worker); the chosen worker's
 * in-flight prompt words rise by ctx->words (out->tokens) until the slot is given back.
 * ctx->pin (X-Baton-Target-Worker: a worker id, or several separated by commas, one per role)
 * names the worker to use for a role when one of the listed ids is a worker of that role: that
 * worker or nothing (BATON_PICK_NONE when it is not eligible; CAPPED at its cap); roles the pin
 * does not name are chosen by the policy. Whether the caller may pin is decided by the caller
 * (baton_pin_allowed in route_ctx.c). Only workers for which keep(w, keep_arg) is 1 are
 * candidates (keep NULL: every worker); unlike avoid[], a hard rule: e.g. a decode must speak
 * its prefill's PD protocol.
 */
baton_pick_rc_t baton_pick_ctx(baton_registry_t *reg, baton_policy_t *policy,
                               baton_whealth_t *health, unsigned cap, baton_worker_role_t role,
                               baton_worker_t *const *avoid, size_t n_avoid,
                               baton_pick_keep_cb keep, const void *keep_arg,
                               baton_route_ctx_t *ctx, baton_pick_t *out);

/* Gives back what a pick holds on its worker (in-flight slot and prompt words), not the
 * reference: for callers that keep the worker. */
void baton_pick_unreserve(baton_worker_t *w, uint32_t tokens);

/* Gives back a pick that was not used: the ticket with `outcome` (NEUTRAL: nothing was learnt
 * about the worker), the in-flight slot and the reference. No-op when p->w is NULL. */
void baton_pick_release(baton_whealth_t *health, baton_pick_t *p, baton_breaker_outcome_t outcome);

#endif
