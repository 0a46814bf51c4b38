/* policy.h — worker selection policies (round_robin, random, power_of_two, least_load,
 * consistent_hash, cache_aware, precise), the request context they read, and the router's RNG. */
#ifndef BATON_ROUTER_POLICY_H
#define BATON_ROUTER_POLICY_H

#include <stddef.h>
#include <stdint.h>

#include "router/dataplane/policy_tree.h"
#include "router/control/registry.h"

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
    BATON_POLICY_LEAST_LOAD = 3,
    BATON_POLICY_CONSISTENT_HASH = 4,
    BATON_POLICY_CACHE_AWARE = 5,
    BATON_POLICY_PRECISE = 6,
} baton_policy_kind_t;
#define BATON_POLICY__COUNT 7

/* "round_robin", "random", "power_of_two", "least_load", "consistent_hash", "cache_aware",
 * "precise". */
const char *baton_policy_name(baton_policy_kind_t kind);
/* Accepts the names above. 0 or BATON_EINVAL. */
int baton_policy_parse(const char *name, baton_policy_kind_t *kind_p);

typedef struct baton_policy_s baton_policy_t;

/*
 * The knobs of the state-keeping policies (config.h: --cache-threshold-pct ...). SGLang's
 * cache_aware defaults: cache_threshold 0.3, balance_abs_threshold 64, balance_rel_threshold
 * 1.5; consistent hashing 160 virtual nodes.
 */
typedef struct baton_policy_params_s {
    unsigned cache_threshold_pct;       /* cache_aware: a match of more than this % of the
                                         * prompt's words wins, else least load (30) */
    unsigned balance_abs_threshold;     /* load guard: imbalanced when max - min in-flight > this */
    unsigned balance_rel_threshold_pct; /* ... and max > this % of min (150) */
    size_t cache_max_blocks;            /* per worker tree bound, in prefix names (262144) */
    unsigned cache_block_words;         /* words per tree block (16) */
    unsigned hash_vnodes;               /* consistent_hash: points per worker (160) */
    /* cache_aware refinements (0 keeps SGLang's rule): */
    unsigned cache_tie_pct; /* matches within this % of the best one are equal and the least
                             * loaded of them wins (0: only exact ties) */
    int balance_by_words;   /* 1: the load guard compares in-flight prompt words, not
                             * requests (thresholds then in words) */
    /* precise (policy_precise.h): the cost's weights in % (prefill 100, load 100), the L2
     * credit in % of an L1 block (75), near-ties within this % of the prompt's tokens (2), a
     * sampling temperature in % (0: the minimum), provisional entries' life (2,000 ms; 0: off) */
    unsigned precise_prefill_weight_pct;
    unsigned precise_load_weight_pct;
    unsigned precise_l2_credit_pct;
    unsigned precise_l3_credit_pct; /* a store (L3) block, % of an L1 block (50) */
    unsigned precise_tie_pct;
    unsigned precise_temperature_pct;
    unsigned precise_provisional_ms;
    int balance_by_tokens; /* 1: in-flight prompt counts add the prompt's real token count
                            * when the request has one (ctx->n_tokens), not its words */
    unsigned cache_l3_pct;  /* workers share a KV store (HiCache's L3): the longest match is
                             * reachable from every worker, fetching the words it lacks costs
                             * this % of computing them; the cheapest worker (that plus its
                             * in-flight prompt words) wins (0: no shared store) */
} baton_policy_params_t;

void baton_policy_params_default(baton_policy_params_t *p);

/* 0, BATON_EINVAL (unknown kind) or BATON_ENOMEM. Default parameters. */
int baton_policy_create(baton_policy_t **policy_p, baton_policy_kind_t kind);
/* The same with parameters (NULL: defaults). */
int baton_policy_create_with(baton_policy_t **policy_p, baton_policy_kind_t kind,
                             const baton_policy_params_t *params);
void baton_policy_destroy(baton_policy_t *policy); /* NULL is ignored */
baton_policy_kind_t baton_policy_kind(const baton_policy_t *policy);
/* 1 when the policy is of this kind with these parameters (NULL: defaults): a reload keeps it
 * (and its trees) then, else it builds a new one. */
int baton_policy_same(const baton_policy_t *policy, baton_policy_kind_t kind,
                      const baton_policy_params_t *params);

/*
 * Chooses one of cands[0..n) (typically a BATON_SNAP_ELIGIBLE snapshot). NULL when n == 0.
 *   round_robin:  cands[counter++ % n]
 *   random:       uniform
 *   power_of_two: two distinct uniform picks, the one with fewer in-flight requests wins,
 *                 ties broken at random (n == 1: the only one).
 */
baton_worker_t *baton_policy_select(baton_policy_t *policy, baton_worker_t *const *cands, size_t n);

/*
 * What one request brings to the choice. Strings are borrowed from the request and must stay
 * valid until baton_route_ctx_free(); everything may be absent (NULL / 0).
 *   text:    the prompt text (cache_aware matches it against the per-worker trees);
 *   session: the session key (consistent_hash): x-session-affinity / X-Session-ID header, the
 *            OpenAI `user` field, or the configured JSON field;
 *   words:   prompt words (tokens of the simulated engine), for least_load's token count.
 * The chain is built lazily, once per block size, by the policies that need it.
 */
typedef struct baton_route_ctx_s {
    const char *text;
    size_t text_len;
    const char *session;
    size_t session_len;
    uint32_t words;
    const char *pin; /* X-Baton-Target-Worker (pick.c), NULL when none */
    /* The requested model and the pool it selects (worker_models.h: baton_model_pool_t; 0 =
     * every worker); pick.c keeps only the pool's workers. */
    const char *model;
    int model_pool;
    /* The prompt's token ids from the model's tokenizer, as the engine will see them (chat
     * template rendered): NULL / 0 when the router has no tokenizer for the model. Borrowed from
     * the request like the strings above. Exact-prefix policies hash these, never the text. */
    const uint32_t *tokens;
    size_t n_tokens;
    /* The KV-event index (kv_route.h) the precise policy reads; NULL without one. */
    struct baton_kvroute_s *kv;
    /* private to policy_precise.c: the tokens' block keys for the index's block size */
    uint64_t *kv_keys;
    uint32_t kv_nb, kv_bs;
    /* private: text built from the request (route_ctx.c), freed with the context */
    char *owned;
    uint32_t *client_ids;   /* the token ids a client sent itself (route_ctx.c) */
    uint32_t *owned_tokens; /* the array tokens points to, when the context owns it */
    /* private to policy.c */
    baton_ptree_chain_t chain;
    unsigned chain_block; /* 0: not built */
} baton_route_ctx_t;

void baton_route_ctx_free(baton_route_ctx_t *ctx);

/* What a pick adds to the chosen worker's in-flight prompt count for this request: the
 * prompt's words, or with balance_by_tokens its token count when known. */
uint32_t baton_policy_prompt_load(const baton_policy_t *policy, const baton_route_ctx_t *ctx);

/* Why a worker was chosen (metrics: chosen-by-cache vs chosen-by-load). */
typedef enum {
    BATON_CHOICE_POLICY = 0, /* a stateless policy's own rule */
    BATON_CHOICE_CACHE,      /* cache_aware: the best match was above the threshold */
    BATON_CHOICE_LOAD,       /* least load: by policy, cache miss, guard, or no session key */
    BATON_CHOICE_SESSION,    /* consistent_hash: the ring */
    BATON_CHOICE_PIN,        /* X-Baton-Target-Worker */
    BATON_CHOICE__COUNT
} baton_choice_t;
const char *baton_choice_name(baton_choice_t c); /* "policy", "cache", "load", "session", "pin" */

/*
 * baton_policy_select with the request's context (ctx may be NULL: no text, no session).
 *   least_load:      fewest in-flight requests, then fewest in-flight prompt tokens, ties at
 *                    random (the router's own counts: two routers never herd on a stale one);
 *   consistent_hash: the ring over the candidates' ids (virtual nodes), keyed by the session;
 *                    without a session key, least_load;
 *   precise:         the KV-event index's exact prefix match and Dynamo's cost
 *                    (policy_precise.h); without token ids, least_load;
 *   cache_aware:     SGLang's rule — when the candidates are imbalanced (max - min in-flight >
 *                    balance_abs_threshold AND max > min × balance_rel_threshold) the least
 *                    loaded; else the longest tree match when it covers more than
 *                    cache_threshold of the prompt (ties: less load), else the least loaded.
 * *why_p (may be NULL) says which rule chose; *matched_p (may be NULL) the words of the prompt
 * the chosen worker's tree matched (cache_aware; else 0).
 */
baton_worker_t *baton_policy_select_ctx(baton_policy_t *policy, baton_worker_t *const *cands,
                                        size_t n, baton_route_ctx_t *ctx, baton_choice_t *why_p,
                                        uint32_t *matched_p);

/* The request was sent to w: cache_aware records its prompt in w's tree and refreshes w's
 * cache fields (registry.h); the choice counters are kept. Others: counters only. */
void baton_policy_chosen(baton_policy_t *policy, baton_worker_t *w, baton_route_ctx_t *ctx,
                         baton_choice_t why, uint32_t matched);

/*
 * The load least_load ranks a worker by: its in-flight requests from this router, refined by
 * the load the worker itself reported (load_poll.h) while that report is fresh, as SGLang's
 * and vLLM's routers combine polled and local counts. The report is the worker's total (other
 * routers' requests included) when it was read; requests this router sent or finished since
 * then are added or taken off (in_flight - in_flight then), and it is never below this
 * router's own in-flight count. Without a fresh report: the in-flight count alone.
 */
long baton_worker_load(const baton_worker_t *w, uint64_t now_ms);

/* cache_aware's load guard (internal; tests): 1 when the candidates' in-flight counts (or, with
 * balance_by_words, in-flight prompt words) exceed both the absolute and the relative
 * threshold. */
int baton__policy_imbalanced(const baton_policy_params_t *pp, baton_worker_t *const *cands,
                             size_t n);

/* Counters of one policy object, for /metrics. */
typedef struct baton_policy_stats_s {
    uint64_t chosen[BATON_CHOICE__COUNT];
    uint64_t predicted_hit_words; /* cache_aware: words its trees matched on the chosen worker */
    uint64_t prompt_words;        /* words of every prompt chosen for */
    size_t tree_names, tree_bytes;
    uint64_t precise_fallbacks;        /* precise: chosen by load for want of token ids / index */
    uint64_t precise_provisional_hits; /* precise: choices provisional entries decided */
    uint64_t precise_l3_credited;      /* precise: choices whose worker got L3 (store) credit */
    uint64_t precise_l3_tokens;        /* precise: prompt tokens credited as L3 on the chosen */
} baton_policy_stats_t;
void baton_policy_stats(baton_policy_t *policy, baton_policy_stats_t *st);

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
