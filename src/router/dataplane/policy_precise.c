/* policy_precise.c — the `precise` policy: the request's token blocks matched against each
 * worker's KV-event index chain, Dynamo's cost (uncached prefill + in-flight load), near-ties to
 * the least loaded, an optional temperature, and provisional entries for a burst. */
#include "router/dataplane/policy_precise.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "common/clock.h"
#include "common/hash.h"
#include "common/rand.h"
#include "kvevents/index.h"
#include "router/control/kv_route.h"

#define PROV_SLOTS 65536u
#define PROV_PROBE 4
#define CAND_STACK 64

typedef struct {
    uint64_t key;
    uint64_t worker; /* the worker id's hash */
    uint64_t until_ms;
} prov_t;

struct baton_precise_s {
    pthread_mutex_t mu;
    prov_t *prov; /* PROV_SLOTS, allocated on first use */
    atomic_ullong fallbacks, prov_hits, l3_credited, l3_tokens;
};

baton_precise_t *baton__precise_create(void)
{
    baton_precise_t *pp = calloc(1, sizeof(*pp));
    if (pp)
        pthread_mutex_init(&pp->mu, NULL);
    return pp;
}

void baton__precise_destroy(baton_precise_t *pp)
{
    if (!pp)
        return;
    pthread_mutex_destroy(&pp->mu);
    free(pp->prov);
    free(pp);
}

void baton__precise_stats(baton_precise_t *pp, baton_precise_stats_t *st)
{
    st->fallbacks = pp ? atomic_load(&pp->fallbacks) : 0;
    st->provisional_hits = pp ? atomic_load(&pp->prov_hits) : 0;
    st->l3_credited = pp ? atomic_load(&pp->l3_credited) : 0;
    st->l3_tokens = pp ? atomic_load(&pp->l3_tokens) : 0;
}

const uint64_t *baton__precise_keys(baton_route_ctx_t *ctx, uint32_t *nb, uint32_t *bs)
{
    *nb = *bs = 0;
    if (!ctx || !ctx->tokens || !ctx->n_tokens || !ctx->kv)
        return NULL;
    uint32_t b = baton_kvroute_block_size(ctx->kv);
    if (!b)
        return NULL;
    if (ctx->kv_bs != b) {
        uint32_t n = ctx->n_tokens > UINT32_MAX ? UINT32_MAX : (uint32_t)ctx->n_tokens;
        uint64_t *k = realloc(ctx->kv_keys, ((size_t)n / b + 1) * sizeof(*k));
        if (!k)
            return NULL;
        ctx->kv_keys = k;
        ctx->kv_nb = baton_kvidx_chain(b, ctx->tokens, n, k);
        ctx->kv_bs = b;
    }
    *nb = ctx->kv_nb;
    *bs = b;
    return ctx->kv_keys;
}

static uint64_t worker_hash(const baton_worker_t *w)
{
    return baton_fnv1a64_add(BATON_FNV1A64_INIT, w->id, strlen(w->id)) | 1;
}

static prov_t *prov_slot(prov_t *t, uint64_t key, int insert, uint64_t now)
{
    size_t at = baton_mix64(key) & (PROV_SLOTS - 1), victim = at;
    for (int k = 0; k < PROV_PROBE; k++) {
        prov_t *p = &t[(at + k) & (PROV_SLOTS - 1)];
        if (p->key == key)
            return p;
        if (insert && (p->key == 0 || p->until_ms < now))
            return p;
        if (t[victim].until_ms > p->until_ms)
            victim = (at + k) & (PROV_SLOTS - 1);
    }
    return insert ? &t[victim] : NULL; /* full: the entry closest to expiry goes */
}

/* For each candidate, the leading blocks provisionally on it. */
static void prov_match(baton_precise_t *pp, const uint64_t *keys, uint32_t nb,
                       baton_worker_t *const *cands, size_t n, uint32_t *out)
{
    memset(out, 0, n * sizeof(*out));
    uint64_t now = baton_now_ms();
    pthread_mutex_lock(&pp->mu);
    if (!pp->prov) {
        pthread_mutex_unlock(&pp->mu);
        return;
    }
    /* One worker per block: the chain ends where the holder changes or the entry lapsed. */
    uint64_t holder = 0;
    uint32_t run = 0;
    for (uint32_t b = 0; b < nb; b++) {
        prov_t *p = prov_slot(pp->prov, keys[b], 0, now);
        if (!p || p->until_ms < now || (b > 0 && p->worker != holder))
            break;
        holder = p->worker;
        run = b + 1;
    }
    pthread_mutex_unlock(&pp->mu);
    if (!run)
        return;
    for (size_t i = 0; i < n; i++)
        if (worker_hash(cands[i]) == holder)
            out[i] = run;
}

void baton__precise_chosen(baton_precise_t *pp, const baton_policy_params_t *pr, baton_worker_t *w,
                           baton_route_ctx_t *ctx)
{
    uint32_t nb, bs;
    const uint64_t *keys = baton__precise_keys(ctx, &nb, &bs);
    if (!pp || !keys || !nb || !pr->precise_provisional_ms)
        return;
    uint64_t now = baton_now_ms(), h = worker_hash(w);
    pthread_mutex_lock(&pp->mu);
    if (!pp->prov)
        pp->prov = calloc(PROV_SLOTS, sizeof(*pp->prov));
    if (pp->prov)
        for (uint32_t b = 0; b < nb; b++) {
            prov_t *p = prov_slot(pp->prov, keys[b], 1, now);
            *p =
                (prov_t){.key = keys[b], .worker = h, .until_ms = now + pr->precise_provisional_ms};
        }
    pthread_mutex_unlock(&pp->mu);
}

uint32_t baton__precise_cached(baton_route_ctx_t *ctx, baton_worker_t *w)
{
    uint32_t nb, bs, l1 = 0, l2 = 0;
    const uint64_t *keys = baton__precise_keys(ctx, &nb, &bs);
    if (!keys)
        return 0;
    baton_kvroute_match(ctx->kv, keys, nb, &w, 1, &l1, &l2);
    return (l1 + l2) * bs;
}

/* Ties by least_load's rule among cands[idx[0..m)]. */
static baton_worker_t *least_of(baton_worker_t *const *cands, const size_t *idx, size_t m)
{
    baton_worker_t *stack[CAND_STACK], **sub = m <= CAND_STACK ? stack : malloc(m * sizeof(*sub));
    if (!sub)
        return cands[idx[0]];
    for (size_t k = 0; k < m; k++)
        sub[k] = cands[idx[k]];
    baton_worker_t *w = baton__policy_least_loaded(sub, m);
    if (sub != stack)
        free(sub);
    return w;
}

baton_worker_t *baton__precise_select(baton_precise_t *pp, const baton_policy_params_t *pr,
                                      baton_worker_t *const *cands, size_t n,
                                      baton_route_ctx_t *ctx, baton_choice_t *why,
                                      uint32_t *matched)
{
    uint32_t nb, bs;
    const uint64_t *keys = baton__precise_keys(ctx, &nb, &bs);
    *why = BATON_CHOICE_LOAD;
    if (!keys) {
        atomic_fetch_add(&pp->fallbacks, 1);
        return baton__policy_least_loaded(cands, n);
    }
    uint32_t s1[CAND_STACK], s2[CAND_STACK], s3[CAND_STACK];
    double sc[CAND_STACK];
    size_t si[CAND_STACK];
    int heap = n > CAND_STACK;
    uint32_t *l1 = heap ? malloc(n * sizeof(*l1)) : s1, *l2 = heap ? malloc(n * sizeof(*l2)) : s2,
             *pv = heap ? malloc(n * sizeof(*pv)) : s3;
    double *cost = heap ? malloc(n * sizeof(*cost)) : sc;
    size_t *idx = heap ? malloc(n * sizeof(*idx)) : si;
    baton_worker_t *best = NULL;
    if (!l1 || !l2 || !pv || !cost || !idx) {
        best = baton__policy_least_loaded(cands, n);
        goto out;
    }
    baton_kvroute_match(ctx->kv, keys, nb, cands, n, l1, l2);
    prov_match(pp, keys, nb, cands, n, pv);
    uint32_t l3 = baton_kvroute_match_l3(ctx->kv, keys, nb), l3w = 0;
    double tokens = (double)ctx->n_tokens, wp = pr->precise_prefill_weight_pct / 100.0,
           wl = pr->precise_load_weight_pct / 100.0, c2 = pr->precise_l2_credit_pct / 100.0,
           c3 = pr->precise_l3_credit_pct / 100.0;
    double min = 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t held = l1[i] + l2[i];
        if (pv[i] > l1[i]) {
            l1[i] = pv[i];
            l2[i] = held > pv[i] ? held - pv[i] : 0;
        }
        if (pv[i] <= held)
            pv[i] = 0; /* the index knew as much: the entry added nothing */
        /* the store's blocks past what the worker holds itself: L3 for it */
        uint32_t own = l1[i] + l2[i], in3 = l3 > own ? l3 - own : 0;
        double cached = (double)bs * (l1[i] + c2 * l2[i] + c3 * in3);
        double load =
            (double)atomic_load_explicit(&cands[i]->in_flight_tokens, memory_order_relaxed);
        cost[i] = wp * (tokens - cached) + wl * load;
        if (i == 0 || cost[i] < min)
            min = cost[i];
    }
    size_t m = 0;
    if (pr->precise_temperature_pct) {
        /* sampled: weight exp(-(cost - min) / (T × tokens)) */
        double t = pr->precise_temperature_pct / 100.0 * (tokens > 0 ? tokens : 1), sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += cost[i] = exp(-(cost[i] - min) / t);
        double r = (double)(baton_rand_u64() >> 11) / 9007199254740992.0 * sum;
        size_t pick = n - 1;
        for (size_t i = 0; i < n; i++) {
            if (r < cost[i]) {
                pick = i;
                break;
            }
            r -= cost[i];
        }
        best = cands[pick];
        idx[0] = pick;
        m = 1;
    } else {
        double band = tokens * pr->precise_tie_pct / 100.0;
        for (size_t i = 0; i < n; i++)
            if (cost[i] <= min + band)
                idx[m++] = i;
        best = m == 1 ? cands[idx[0]] : least_of(cands, idx, m);
        for (size_t k = 0; k < m; k++)
            if (cands[idx[k]] == best)
                idx[0] = idx[k];
    }
    uint32_t hit = l1[idx[0]] + l2[idx[0]];
    l3w = l3 > hit ? l3 - hit : 0;
    if (l3w && pr->precise_l3_credit_pct) {
        atomic_fetch_add(&pp->l3_credited, 1);
        atomic_fetch_add(&pp->l3_tokens, (uint64_t)l3w * bs);
        hit += l3w;
    }
    if (hit) {
        *why = BATON_CHOICE_CACHE;
        *matched = hit * bs;
        if (pv[idx[0]] > 0)
            atomic_fetch_add(&pp->prov_hits, 1);
    }
out:
    if (heap) {
        free(l1);
        free(l2);
        free(pv);
        free(cost);
        free(idx);
    }
    return best;
}
