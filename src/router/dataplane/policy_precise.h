/* policy_precise.h — the `precise` policy's choice (internal to policy.c): a request's token
 * blocks against the KV-event index (kv_route.h), Dynamo's cost, provisional entries. */
#ifndef BATON_ROUTER_POLICY_PRECISE_H
#define BATON_ROUTER_POLICY_PRECISE_H

#include <stddef.h>
#include <stdint.h>

#include "router/dataplane/policy.h"

/*
 * cost(w) = prefill_weight × (prompt tokens − block_size × (L1 + l2_credit × L2 + l3_credit × L3))
 *         + load_weight × w's in-flight prompt tokens
 * where L1, L2 (and L3) are the leading blocks of the prompt w holds in each tier (the index's
 * chain match: a block counts only when every block before it is held too). The lowest cost
 * wins; candidates within tie_pct % of the prompt's tokens of it are ties, and the least loaded
 * of them wins (least_load's rule). With a temperature, the choice is sampled instead, with
 * weight exp(−(cost − min) / (temperature × prompt tokens)).
 *
 * Provisional entries (llm-d's approach): once a request is sent to w, its blocks count as held
 * by w in L1 for provisional_ms (until the worker's own event confirms them), so a burst of one
 * prefix sent before the first event arrives does not scatter. One table per policy object,
 * 65,536 entries (a block key keeps the last worker routed to), overwritten when full, under
 * one mutex held for a table lookup per block.
 *
 * L3: the leading blocks the KV store holds (kv_route's store source) are reachable from every
 * worker; a worker's L3 count is what of them it does not hold itself, so a block counts at its
 * best tier per worker (L1, then L2, then L3), at l3_credit (precise_l3_credit_pct, 50).
 *
 * Without token ids (the client sent text and the router has no tokenizer for the model) or
 * before any worker announced a block, the choice is least_load's, counted as a fallback.
 */
typedef struct baton_precise_s baton_precise_t;

baton_precise_t *baton__precise_create(void);
void baton__precise_destroy(baton_precise_t *pp);

/* least_load's rule (policy.c). */
baton_worker_t *baton__policy_least_loaded(baton_worker_t *const *cands, size_t n);

baton_worker_t *baton__precise_select(baton_precise_t *pp, const baton_policy_params_t *pr,
                                      baton_worker_t *const *cands, size_t n,
                                      baton_route_ctx_t *ctx, baton_choice_t *why,
                                      uint32_t *matched);
/* The request went to w: its blocks become provisional entries for w. */
void baton__precise_chosen(baton_precise_t *pp, const baton_policy_params_t *pr, baton_worker_t *w,
                           baton_route_ctx_t *ctx);

typedef struct {
    uint64_t fallbacks;        /* choices made without token ids or index */
    uint64_t provisional_hits; /* choices where provisional entries added blocks */
    uint64_t l3_credited;      /* choices where the chosen worker had L3 (store) credit */
    uint64_t l3_tokens;        /* the tokens so credited */
} baton_precise_stats_t;
void baton__precise_stats(baton_precise_t *pp, baton_precise_stats_t *st);

/* The prompt tokens the index says w holds (whole leading blocks, L1 and L2; provisional
 * entries do not count): what PD's decode-alone rule reads. 0 without token ids or index. */
uint32_t baton__precise_cached(baton_route_ctx_t *ctx, baton_worker_t *w);

/* The request's block keys for the index's block size, built once per request (NULL when the
 * request has no token ids, the index no block size yet, or memory ran out). */
const uint64_t *baton__precise_keys(baton_route_ctx_t *ctx, uint32_t *nb, uint32_t *bs);

#endif
