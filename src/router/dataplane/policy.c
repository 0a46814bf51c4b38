/* policy.c — the policies' objects and selection: round_robin / random / power_of_two /
 * least_load / consistent_hash / cache_aware / precise (policy_precise.c), their counters, and
 * the per-thread RNG. */
#include "router/dataplane/policy.h"

#include <pthread.h>
#include <stdio.h>

#include "router/dataplane/policy_precise.h"
#include "router/dataplane/policy_ring.h"

#include "baton/error.h"
#include "common/clock.h"
#include "common/rand.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

struct baton_policy_s {
    baton_policy_kind_t kind;
    atomic_ullong rr_next; /* round_robin position; shared by all threads */
    baton_policy_params_t params;
    baton_ptree_t *tree; /* cache_aware */
    baton_precise_t *precise; /* precise */
    /* consistent_hash: the ring of the last candidate set, rebuilt when the set changes */
    pthread_mutex_t ring_mu;
    baton_ring_t *ring;
    uint64_t ring_sig;
    char (*ring_ids)[BATON_WORKER_ID_MAX];
    size_t ring_n;
    /* counters */
    atomic_ullong chosen[BATON_CHOICE__COUNT];
    atomic_ullong hit_words, prompt_words;
};

static const char *const policy_names[] = {"round_robin", "random",          "power_of_two",
                                           "least_load",  "consistent_hash", "cache_aware",
                                           "precise"};
static const char *const choice_names[] = {"policy", "cache", "load", "session", "pin"};

const char *baton_choice_name(baton_choice_t c)
{
    return (unsigned)c < BATON_CHOICE__COUNT ? choice_names[c] : "unknown";
}

void baton_policy_params_default(baton_policy_params_t *p)
{
    p->cache_threshold_pct = 30;
    p->balance_abs_threshold = 64;
    p->balance_rel_threshold_pct = 150;
    p->cache_max_blocks = 262144;
    p->cache_block_words = 16;
    p->hash_vnodes = 160;
    p->cache_tie_pct = 0; /* SGLang's rule unless asked */
    p->balance_by_words = 0;
    p->precise_prefill_weight_pct = 100;
    p->precise_load_weight_pct = 100;
    p->precise_l2_credit_pct = 75;
    p->precise_l3_credit_pct = 50;
    p->precise_tie_pct = 2;
    p->precise_temperature_pct = 0;
    p->precise_provisional_ms = 2000;
    p->balance_by_tokens = 0;
    p->cache_l3_pct = 0; /* no shared store */
}

const char *baton_policy_name(baton_policy_kind_t kind)
{
    if ((unsigned)kind < sizeof(policy_names) / sizeof(policy_names[0]))
        return policy_names[kind];
    return "unknown";
}

int baton_policy_parse(const char *name, baton_policy_kind_t *kind_p)
{
    if (name == NULL)
        return BATON_EINVAL;
    for (size_t i = 0; i < sizeof(policy_names) / sizeof(policy_names[0]); i++) {
        if (strcmp(name, policy_names[i]) == 0) {
            *kind_p = (baton_policy_kind_t)i;
            return 0;
        }
    }
    return BATON_EINVAL;
}

int baton_policy_create(baton_policy_t **policy_p, baton_policy_kind_t kind)
{
    return baton_policy_create_with(policy_p, kind, NULL);
}

int baton_policy_create_with(baton_policy_t **policy_p, baton_policy_kind_t kind,
                             const baton_policy_params_t *params)
{
    if ((unsigned)kind >= BATON_POLICY__COUNT)
        return BATON_EINVAL;
    baton_policy_t *p = calloc(1, sizeof(*p));
    if (p == NULL)
        return BATON_ENOMEM;
    p->kind = kind;
    atomic_init(&p->rr_next, 0);
    if (params)
        p->params = *params;
    else
        baton_policy_params_default(&p->params);
    if (p->params.cache_block_words == 0)
        p->params.cache_block_words = 1;
    if (p->params.hash_vnodes == 0)
        p->params.hash_vnodes = 1;
    pthread_mutex_init(&p->ring_mu, NULL);
    if (kind == BATON_POLICY_CACHE_AWARE &&
        baton_ptree_create(&p->tree, p->params.cache_max_blocks ? p->params.cache_max_blocks : 1)) {
        baton_policy_destroy(p);
        return BATON_ENOMEM;
    }
    if (kind == BATON_POLICY_PRECISE && !(p->precise = baton__precise_create())) {
        baton_policy_destroy(p);
        return BATON_ENOMEM;
    }
    *policy_p = p;
    return 0;
}

void baton_policy_destroy(baton_policy_t *policy)
{
    if (!policy)
        return;
    baton_ptree_destroy(policy->tree);
    baton__precise_destroy(policy->precise);
    baton_ring_free(policy->ring);
    free(policy->ring_ids);
    pthread_mutex_destroy(&policy->ring_mu);
    free(policy);
}

baton_policy_kind_t baton_policy_kind(const baton_policy_t *policy)
{
    return policy->kind;
}

int baton_policy_same(const baton_policy_t *policy, baton_policy_kind_t kind,
                      const baton_policy_params_t *params)
{
    baton_policy_params_t d;
    if (!params) {
        baton_policy_params_default(&d);
        params = &d;
    }
    const baton_policy_params_t *a = &policy->params;
    /* create_with raises 0 block words / vnodes to 1: compare what it would keep */
    unsigned bw = params->cache_block_words ? params->cache_block_words : 1;
    unsigned vn = params->hash_vnodes ? params->hash_vnodes : 1;
    return policy->kind == kind && a->cache_threshold_pct == params->cache_threshold_pct &&
           a->balance_abs_threshold == params->balance_abs_threshold &&
           a->balance_rel_threshold_pct == params->balance_rel_threshold_pct &&
           a->cache_max_blocks == params->cache_max_blocks && a->cache_block_words == bw &&
           a->hash_vnodes == vn && a->cache_tie_pct == params->cache_tie_pct &&
           a->balance_by_words == params->balance_by_words &&
           a->precise_prefill_weight_pct == params->precise_prefill_weight_pct &&
           a->precise_load_weight_pct == params->precise_load_weight_pct &&
           a->precise_l2_credit_pct == params->precise_l2_credit_pct &&
           a->precise_l3_credit_pct == params->precise_l3_credit_pct &&
           a->precise_tie_pct == params->precise_tie_pct &&
           a->precise_temperature_pct == params->precise_temperature_pct &&
           a->precise_provisional_ms == params->precise_provisional_ms &&
           a->balance_by_tokens == params->balance_by_tokens &&
           a->cache_l3_pct == params->cache_l3_pct;
}

/* ---- RNG: xoshiro256** per thread, seeded once from getrandom(2) through splitmix64 ---- */

static _Thread_local uint64_t rng_state[4];
static _Thread_local int rng_seeded;

static void rng_seed(void)
{
    uint64_t seed = 0;
    ssize_t got = -1;
    for (int tries = 0; tries < 4 && got != (ssize_t)sizeof(seed); tries++)
        got = getrandom(&seed, sizeof(seed), 0);
    if (got != (ssize_t)sizeof(seed)) {
        /* No entropy source (very old kernel / seccomp): mix time, pid and a stack address so
         * threads still diverge. Rooms then are less unpredictable, but still unique enough. */
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        seed = (uint64_t)ts.tv_nsec ^ ((uint64_t)ts.tv_sec << 32) ^ (uint64_t)getpid() ^
               (uint64_t)(uintptr_t)&ts;
    }
    baton_xoshiro_seed(rng_state, seed);
    rng_seeded = 1;
}

uint64_t baton_rand_u64(void)
{
    if (!rng_seeded)
        rng_seed();
    return baton_xoshiro_next(rng_state);
}

uint64_t baton_rand_below(uint64_t n)
{
    if (n == 0)
        return 0;
    /* Reject the top partial range so every residue is equally likely. */
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = baton_rand_u64();
        if (r >= threshold)
            return r % n;
    }
}

uint64_t baton_bootstrap_room(void)
{
    return baton_rand_u64() >> 1;
}

/* ---- selection ---- */

/* ---- least load, the guard, the ring, the tree ---- */

long baton_worker_load(const baton_worker_t *w, uint64_t now_ms)
{
    long own = baton_worker_in_flight(w);
    uint64_t until = atomic_load_explicit(&w->reported_until_ms, memory_order_acquire);
    if (until == 0 || now_ms > until)
        return own;
    long est = atomic_load_explicit(&w->reported_load, memory_order_relaxed) + own -
               atomic_load_explicit(&w->reported_base, memory_order_relaxed);
    return est > own ? est : own;
}

/* Least load (baton_worker_load), then fewest in-flight prompt words; ties at random
 * (reservoir). */
static baton_worker_t *least_loaded(baton_worker_t *const *cands, size_t n)
{
    baton_worker_t *best = NULL;
    long bl = 0, bt = 0;
    uint64_t ties = 0;
    uint64_t now = baton_now_ms();
    for (size_t i = 0; i < n; i++) {
        long l = baton_worker_load(cands[i], now);
        long t = atomic_load_explicit(&cands[i]->in_flight_tokens, memory_order_relaxed);
        if (!best || l < bl || (l == bl && t < bt)) {
            best = cands[i];
            bl = l;
            bt = t;
            ties = 1;
        } else if (l == bl && t == bt && baton_rand_below(++ties) == 0) {
            best = cands[i];
        }
    }
    return best;
}

baton_worker_t *baton__policy_least_loaded(baton_worker_t *const *cands, size_t n)
{
    return least_loaded(cands, n);
}

int baton__policy_imbalanced(const baton_policy_params_t *pp, baton_worker_t *const *cands,
                             size_t n)
{
    long mx = 0, mn = 0;
    for (size_t i = 0; i < n; i++) {
        long l = pp->balance_by_words
                     ? atomic_load_explicit(&cands[i]->in_flight_tokens, memory_order_relaxed)
                     : baton_worker_in_flight(cands[i]);
        if (i == 0 || l > mx)
            mx = l;
        if (i == 0 || l < mn)
            mn = l;
    }
    /* SGLang: both thresholds must be exceeded. */
    return (unsigned long)(mx - mn) > pp->balance_abs_threshold &&
           (double)mx > (double)mn * pp->balance_rel_threshold_pct / 100.0;
}

static uint64_t set_signature(baton_worker_t *const *cands, size_t n)
{
    uint64_t sum = 0, x = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t h = baton_ring_hash(cands[i]->id, strlen(cands[i]->id));
        sum += h;
        x ^= h * BATON_GOLDEN_GAMMA;
    }
    return sum ^ (x << 1) ^ n;
}

static baton_worker_t *by_ring(baton_policy_t *p, baton_worker_t *const *cands, size_t n,
                               const char *key, size_t key_len)
{
    uint64_t sig = set_signature(cands, n);
    char id[BATON_WORKER_ID_MAX] = "";
    pthread_mutex_lock(&p->ring_mu);
    if (!p->ring || p->ring_sig != sig || p->ring_n != n) {
        /* The candidate set changed: rebuild over the ids (order does not matter). */
        const char **ids = malloc(n * sizeof(*ids));
        char(*copy)[BATON_WORKER_ID_MAX] = malloc(n * sizeof(*copy));
        baton_ring_t *r = NULL;
        if (ids && copy) {
            for (size_t i = 0; i < n; i++) {
                snprintf(copy[i], sizeof(copy[i]), "%s", cands[i]->id);
                ids[i] = copy[i];
            }
            if (baton_ring_build(&r, ids, n, p->params.hash_vnodes) == 0) {
                baton_ring_free(p->ring);
                free(p->ring_ids);
                p->ring = r;
                p->ring_ids = copy;
                p->ring_n = n;
                p->ring_sig = sig;
                copy = NULL;
            }
        }
        free(ids);
        free(copy);
    }
    if (p->ring && p->ring_sig == sig) {
        size_t at = baton_ring_lookup(p->ring, baton_ring_hash(key, key_len));
        if (at < p->ring_n)
            memcpy(id, p->ring_ids[at], sizeof(id));
    }
    pthread_mutex_unlock(&p->ring_mu);
    for (size_t i = 0; i < n; i++)
        if (strcmp(cands[i]->id, id) == 0)
            return cands[i];
    return NULL; /* no memory for the ring: the caller falls back */
}

/* The chain of the prompt for this policy's block size, built once per request. */
static const baton_ptree_chain_t *ctx_chain(baton_policy_t *p, baton_route_ctx_t *ctx)
{
    if (!ctx || !ctx->text)
        return NULL;
    if (ctx->chain_block != p->params.cache_block_words) {
        baton_ptree_chain_free(&ctx->chain);
        ctx->chain_block = 0;
        if (baton_ptree_chain(ctx->text, ctx->text_len, p->params.cache_block_words, &ctx->chain) !=
            0)
            return NULL;
        ctx->chain_block = p->params.cache_block_words;
    }
    return &ctx->chain;
}

#define MATCH_STACK 64

/* With a store shared by every worker (HiCache's L3), the longest match `top` is reachable from
 * any of them at the cost of fetching what a worker does not hold: a worker's cost is the words
 * of `top` it lacks × cache_l3_pct / 100 plus the prompt words already in flight on it (work
 * queued ahead, in the same unit). The cheapest wins, ties to fewer requests in flight: an L3
 * hit is cheaper than a miss and dearer than an L1 hit, and never bought with a queue. */
static baton_worker_t *by_l3_cost(const baton_policy_t *p, baton_worker_t *const *cands, size_t n,
                                  const uint32_t *m, uint32_t *top_p, uint32_t *bm_p)
{
    uint32_t top = 0;
    for (size_t i = 0; i < n; i++)
        if (m[i] > top)
            top = m[i];
    baton_worker_t *best = NULL;
    uint64_t best_cost = UINT64_MAX;
    uint32_t bm = 0, ties = 0;
    long best_req = 0;
    for (size_t i = 0; i < n; i++) {
        long q = atomic_load_explicit(&cands[i]->in_flight_tokens, memory_order_relaxed);
        uint64_t cost =
            (uint64_t)(top - m[i]) * p->params.cache_l3_pct + (uint64_t)(q > 0 ? q : 0) * 100;
        long req = baton_worker_in_flight(cands[i]);
        int take = !best || cost < best_cost || (cost == best_cost && req < best_req);
        if (take)
            ties = 1;
        else if (cost == best_cost && req == best_req) /* equal: one of them at random */
            take = baton_rand_below(++ties) == 0;
        if (take) {
            best = cands[i];
            best_cost = cost;
            best_req = req;
            bm = m[i];
        }
    }
    *top_p = top;
    *bm_p = bm;
    return best;
}

static baton_worker_t *by_cache(baton_policy_t *p, baton_worker_t *const *cands, size_t n,
                                baton_route_ctx_t *ctx, baton_choice_t *why, uint32_t *matched_p)
{
    const baton_ptree_chain_t *c = ctx_chain(p, ctx);
    *why = BATON_CHOICE_LOAD;
    if (baton__policy_imbalanced(&p->params, cands, n) || !c || c->words == 0)
        return least_loaded(cands, n);
    uint32_t stack[MATCH_STACK], *m = n <= MATCH_STACK ? stack : malloc(n * sizeof(*m));
    if (!m)
        return least_loaded(cands, n);
    baton_ptree_match(p->tree, c, cands, n, m);
    baton_worker_t *best = NULL;
    uint32_t bm = 0;
    if (p->params.cache_l3_pct > 0) {
        uint32_t top;
        best = by_l3_cost(p, cands, n, m, &top, &bm);
        if (m != stack)
            free(m);
        /* by cache when the reachable prefix passes the threshold, whoever holds it */
        if ((uint64_t)top * 100 > (uint64_t)c->words * p->params.cache_threshold_pct)
            *why = BATON_CHOICE_CACHE;
        *matched_p = bm;
        return best;
    }
    for (size_t i = 0; i < n; i++) {
        if (m[i] > bm || (m[i] == bm && m[i] > 0 &&
                          baton_worker_in_flight(cands[i]) < baton_worker_in_flight(best))) {
            best = cands[i];
            bm = m[i];
        }
    }
    if (best && p->params.cache_tie_pct > 0) {
        /* near-equal matches (a group's shared prompt on several workers): by load among them,
         * so a hot prefix spreads over the workers that hold it instead of piling on one */
        uint64_t floor =
            (uint64_t)bm * (100 - (p->params.cache_tie_pct > 100 ? 100 : p->params.cache_tie_pct));
        uint64_t now = baton_now_ms();
        long bl = baton_worker_load(best, now);
        for (size_t i = 0; i < n; i++) {
            if (m[i] == 0 || (uint64_t)m[i] * 100 < floor)
                continue;
            long l = baton_worker_load(cands[i], now);
            if (l < bl) {
                best = cands[i];
                bl = l;
            }
        }
        for (size_t i = 0; i < n; i++)
            if (cands[i] == best)
                bm = m[i]; /* what it really matched, for the threshold and the prediction */
    }
    if (m != stack)
        free(m);
    if (best && (uint64_t)bm * 100 > (uint64_t)c->words * p->params.cache_threshold_pct) {
        *why = BATON_CHOICE_CACHE;
        *matched_p = bm;
        return best;
    }
    baton_worker_t *w = least_loaded(cands, n);
    if (w == best)
        *matched_p = bm; /* a match below the threshold still counts where it lands */
    return w;
}

baton_worker_t *baton_policy_select(baton_policy_t *policy, baton_worker_t *const *cands, size_t n)
{
    return baton_policy_select_ctx(policy, cands, n, NULL, NULL, NULL);
}

baton_worker_t *baton_policy_select_ctx(baton_policy_t *policy, baton_worker_t *const *cands,
                                        size_t n, baton_route_ctx_t *ctx, baton_choice_t *why_p,
                                        uint32_t *matched_p)
{
    baton_choice_t why_local;
    uint32_t matched_local;
    baton_choice_t *why = why_p ? why_p : &why_local;
    uint32_t *matched = matched_p ? matched_p : &matched_local;
    *why = BATON_CHOICE_POLICY;
    *matched = 0;
    if (policy == NULL || cands == NULL || n == 0)
        return NULL;
    switch (policy->kind) {
    case BATON_POLICY_LEAST_LOAD:
        *why = BATON_CHOICE_LOAD;
        return least_loaded(cands, n);
    case BATON_POLICY_CONSISTENT_HASH: {
        baton_worker_t *w = NULL;
        if (ctx && ctx->session && ctx->session_len)
            w = by_ring(policy, cands, n, ctx->session, ctx->session_len);
        if (w) {
            *why = BATON_CHOICE_SESSION;
            return w;
        }
        *why = BATON_CHOICE_LOAD;
        return least_loaded(cands, n);
    }
    case BATON_POLICY_CACHE_AWARE:
        return by_cache(policy, cands, n, ctx, why, matched);
    case BATON_POLICY_PRECISE:
        return baton__precise_select(policy->precise, &policy->params, cands, n, ctx, why, matched);
    default:
        break;
    }
    if (n == 1)
        return cands[0];
    switch (policy->kind) {
    case BATON_POLICY_ROUND_ROBIN: {
        unsigned long long i = atomic_fetch_add_explicit(&policy->rr_next, 1, memory_order_relaxed);
        return cands[i % n];
    }
    case BATON_POLICY_RANDOM:
        return cands[baton_rand_below(n)];
    case BATON_POLICY_POWER_OF_TWO: {
        size_t i = (size_t)baton_rand_below(n);
        size_t j = (size_t)baton_rand_below(n - 1);
        if (j >= i)
            j++; /* two distinct candidates */
        long li = baton_worker_in_flight(cands[i]);
        long lj = baton_worker_in_flight(cands[j]);
        if (li < lj)
            return cands[i];
        if (lj < li)
            return cands[j];
        return (baton_rand_u64() & 1) ? cands[i] : cands[j];
    }
    default: /* handled above */
        break;
    }
    return NULL;
}

void baton_route_ctx_free(baton_route_ctx_t *ctx)
{
    if (ctx) {
        baton_ptree_chain_free(&ctx->chain);
        ctx->chain_block = 0;
        free(ctx->owned);
        ctx->owned = NULL;
        free(ctx->client_ids);
        ctx->client_ids = NULL;
        free(ctx->kv_keys);
        ctx->kv_keys = NULL;
        ctx->kv_bs = ctx->kv_nb = 0;
        free(ctx->owned_tokens);
        ctx->owned_tokens = NULL;
    }
}

uint32_t baton_policy_prompt_load(const baton_policy_t *policy, const baton_route_ctx_t *ctx)
{
    if (!ctx)
        return 0;
    if (policy && policy->params.balance_by_tokens && ctx->tokens)
        return ctx->n_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)ctx->n_tokens;
    return ctx->words;
}

void baton_policy_chosen(baton_policy_t *policy, baton_worker_t *w, baton_route_ctx_t *ctx,
                         baton_choice_t why, uint32_t matched)
{
    if (!policy || !w)
        return;
    if ((unsigned)why < BATON_CHOICE__COUNT)
        atomic_fetch_add_explicit(&policy->chosen[why], 1, memory_order_relaxed);
    if (policy->kind == BATON_POLICY_PRECISE) {
        baton__precise_chosen(policy->precise, &policy->params, w, ctx);
        if (ctx && ctx->n_tokens) {
            atomic_fetch_add_explicit(&policy->hit_words, matched, memory_order_relaxed);
            atomic_fetch_add_explicit(&policy->prompt_words, ctx->n_tokens, memory_order_relaxed);
        }
        return;
    }
    if (policy->kind != BATON_POLICY_CACHE_AWARE)
        return;
    const baton_ptree_chain_t *c = ctx_chain(policy, ctx);
    if (!c || c->words == 0)
        return;
    atomic_fetch_add_explicit(&policy->hit_words, matched, memory_order_relaxed);
    atomic_fetch_add_explicit(&policy->prompt_words, c->words, memory_order_relaxed);
    baton_ptree_insert(policy->tree, w, c);
    size_t bytes = 0, names = baton_ptree_size(policy->tree, w->id, &bytes);
    atomic_store_explicit(&w->cache_tree_names, names, memory_order_relaxed);
    atomic_store_explicit(&w->cache_tree_bytes, bytes, memory_order_relaxed);
    /* recent ratio: an EWMA with weight 1/8 (races between threads lose a sample at worst) */
    unsigned sample = (unsigned)((uint64_t)matched * 1000000u / c->words);
    unsigned old = atomic_load_explicit(&w->cache_hit_ppm, memory_order_relaxed);
    atomic_store_explicit(&w->cache_hit_ppm, old - old / 8 + sample / 8, memory_order_relaxed);
}

void baton_policy_stats(baton_policy_t *policy, baton_policy_stats_t *st)
{
    memset(st, 0, sizeof(*st));
    for (int i = 0; i < BATON_CHOICE__COUNT; i++)
        st->chosen[i] = atomic_load(&policy->chosen[i]);
    st->predicted_hit_words = atomic_load(&policy->hit_words);
    st->prompt_words = atomic_load(&policy->prompt_words);
    if (policy->tree)
        st->tree_names = baton_ptree_total(policy->tree, &st->tree_bytes);
    if (policy->precise) {
        baton_precise_stats_t ps;
        baton__precise_stats(policy->precise, &ps);
        st->precise_fallbacks = ps.fallbacks;
        st->precise_provisional_hits = ps.provisional_hits;
        st->precise_l3_credited = ps.l3_credited;
        st->precise_l3_tokens = ps.l3_tokens;
    }
}

#define PICK_STACK 64

baton_worker_t *baton_policy_pick(baton_policy_t *policy, baton_registry_t *reg,
                                  baton_worker_role_t role)
{
    baton_worker_t *stack[PICK_STACK], **cands;
    size_t n =
        baton_registry_snapshot_all(reg, role, BATON_SNAP_ELIGIBLE, stack, PICK_STACK, &cands);
    baton_worker_t *chosen = baton_policy_select(policy, cands, n);
    if (chosen != NULL)
        baton_worker_ref(chosen);
    baton_workers_release(cands, n, stack);
    return chosen;
}
