/* policy.h — worker selection policies (round_robin, random, power_of_two) and the router's RNG. */
#ifndef BATON_ROUTER_POLICY_H
#define BATON_ROUTER_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "router/registry.h"

/*
 * A policy object is shared by all router threads; prefill and decode each get their own
 * (--prefill-policy / --decode-policy), regular workers use --policy.
 *
 * Threading: every function is thread-safe and lock-free. round_robin keeps one atomic counter
 * per policy object; random and power_of_two use a per-thread generator (xoshiro256**, seeded
 * from getrandom(2) the first time a thread uses it; never rand()).
 *
 * Ownership: baton_policy_select() neither takes nor drops references: it returns one of the
 * pointers it was given. baton_policy_pick() returns a NEW reference (see registry.h).
 */

typedef enum {
    BATON_POLICY_ROUND_ROBIN = 0,
    BATON_POLICY_RANDOM = 1,
    BATON_POLICY_POWER_OF_TWO = 2,
} baton_policy_kind_t;

/* "round_robin", "random", "power_of_two". */
const char *baton_policy_name(baton_policy_kind_t kind);
/* Accepts the names above. 0 or BATON_EINVAL. */
int baton_policy_parse(const char *name, baton_policy_kind_t *kind_p);

typedef struct baton_policy_s baton_policy_t;

/* 0, BATON_EINVAL (unknown kind) or BATON_ENOMEM. */
int baton_policy_create(baton_policy_t **policy_p, baton_policy_kind_t kind);
void baton_policy_destroy(baton_policy_t *policy); /* NULL is ignored */
baton_policy_kind_t baton_policy_kind(const baton_policy_t *policy);

/*
 * Chooses one of cands[0..n) (typically a BATON_SNAP_ELIGIBLE snapshot). NULL when n == 0.
 *   round_robin:  cands[counter++ % n]
 *   random:       uniform
 *   power_of_two: two distinct uniform picks, the one with fewer in-flight requests wins,
 *                 ties broken at random (n == 1: the only one).
 */
baton_worker_t *baton_policy_select(baton_policy_t *policy, baton_worker_t *const *cands, size_t n);

/*
 * Snapshot of the eligible workers of `role` + select + reference: returns a NEW reference to
 * the chosen worker, or NULL when none is eligible (→ BATON_ENOWORKER for the caller) or on
 * allocation failure. No health admission and no caps: the router's request path picks with
 * baton_pick() (pick.h) instead.
 */
baton_worker_t *baton_policy_pick(baton_policy_t *policy, baton_registry_t *reg,
                                  baton_worker_role_t role);

/* ---- per-thread RNG ---- */

/* 64 uniform random bits. */
uint64_t baton_rand_u64(void);
/* Uniform in [0, n) without modulo bias; 0 when n == 0. */
uint64_t baton_rand_below(uint64_t n);
/* A bootstrap_room: uniform in [0, 2^63-1] (PROTOCOLS.md §1). */
uint64_t baton_bootstrap_room(void);

#endif
