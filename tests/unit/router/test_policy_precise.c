/* test_policy_precise.c — the precise policy on a KV-event index filled by hand: the cost
 * (uncached prefill, L2 credit, in-flight load), near-ties to the least loaded, the temperature,
 * provisional entries, the fallback without token ids, the decode-alone measure, and the L3
 * credit of the blocks the KV store holds. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "kvevents/wire.h"
#include "router/control/kv_route.h"
#include "router/dataplane/policy.h"
#include "router/dataplane/policy_precise.h"
#include "registry_fixture.h"

typedef struct {
    fixture_t f;
    baton_kvroute_t *kr;
} pfix_t;

/* Stores the first n blocks (of 4 tokens) of ids on worker i (source i) in medium m. */
static void store(pfix_t *p, int i, const uint32_t *ids, uint32_t n, const char *m)
{
    baton_kvev_hash_t h[8];
    for (uint32_t k = 0; k < n; k++)
        h[k] = (baton_kvev_hash_t){.i = 1000 * (i + 1) + k};
    baton_kvev_event_t e = {.type = BATON_KVEV_STORED,
                            .hashes = h,
                            .n_hashes = n,
                            .token_ids = (uint32_t *)ids,
                            .n_tokens = n * 4,
                            .block_size = 4};
    strcpy(e.medium, m);
    baton_kvev_batch_t b = {.dp_rank = 0, .events = &e, .n_events = 1};
    assert_int_equal(baton__kvroute_inject(p->kr, p->f.w[i], i, &b), 0);
}

static const uint32_t A[16] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};

static int setup(void **state)
{
    static pfix_t p;
    if (fixture_fill(&p.f, 7300, BATON_ROLE_REGULAR) != 0 ||
        baton_kvroute_create(&p.kr, p.f.reg, NULL, NULL) != 0)
        return -1;
    /* w0: 3 blocks of A in L1; w1: 1 block in L1; w2: 3 blocks in L2; w3: nothing */
    store(&p, 0, A, 3, "GPU");
    store(&p, 1, A, 1, "GPU");
    store(&p, 2, A, 3, "CPU");
    *state = &p;
    return 0;
}

static int teardown_p(void **state)
{
    pfix_t *p = *state;
    baton_kvroute_destroy(p->kr);
    *state = &p->f;
    return teardown(state);
}

static baton_worker_t *pick(baton_policy_t *pol, pfix_t *p, const uint32_t *ids, size_t n,
                            baton_choice_t *why, uint32_t *matched)
{
    baton_route_ctx_t ctx = {.tokens = ids, .n_tokens = n, .kv = p->kr};
    baton_worker_t *w = baton_policy_select_ctx(pol, p->f.w, N, &ctx, why, matched);
    baton_policy_chosen(pol, w, &ctx, *why, *matched);
    baton_route_ctx_free(&ctx);
    return w;
}

static void test_cost(void **state)
{
    pfix_t *p = *state;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.precise_provisional_ms = 0;
    baton_policy_t *pol;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    baton_choice_t why;
    uint32_t m;
    /* costs 4, 12, 16 - 0.75 x 12 = 7, 16: w0 */
    assert_ptr_equal(pick(pol, p, A, 16, &why, &m), p->f.w[0]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    assert_int_equal(m, 12);
    /* 10 prompt tokens in flight on w0: 14 > w2's 7 (its L2 blocks' credit) */
    atomic_store(&p->f.w[0]->in_flight_tokens, 10);
    assert_ptr_equal(pick(pol, p, A, 16, &why, &m), p->f.w[2]);
    assert_int_equal(m, 12);
    atomic_store(&p->f.w[0]->in_flight_tokens, 0);
    /* without the L2 credit w2 is as bad as w3: w0 again, and w1 beats w2 */
    baton_policy_destroy(pol);
    pp.precise_l2_credit_pct = 0;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    atomic_store(&p->f.w[0]->in_flight_tokens, 100);
    assert_ptr_equal(pick(pol, p, A, 16, &why, &m), p->f.w[1]);
    atomic_store(&p->f.w[0]->in_flight_tokens, 0);
    /* no token ids: least_load, counted */
    baton_route_ctx_t ctx = {.kv = p->kr};
    assert_non_null(baton_policy_select_ctx(pol, p->f.w, N, &ctx, &why, &m));
    assert_int_equal(why, BATON_CHOICE_LOAD);
    baton_policy_stats_t st;
    baton_policy_stats(pol, &st);
    assert_int_equal(st.precise_fallbacks, 1);
    baton_policy_destroy(pol);
}

static void test_ties_and_temperature(void **state)
{
    pfix_t *p = *state;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.precise_provisional_ms = 0;
    pp.precise_tie_pct = 100; /* every cost ties: the least loaded, never w0 (busy) */
    baton_policy_t *pol;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    atomic_store(&p->f.w[0]->in_flight, 3);
    baton_choice_t why;
    uint32_t m;
    for (int k = 0; k < 20; k++)
        assert_ptr_not_equal(pick(pol, p, A, 16, &why, &m), p->f.w[0]);
    atomic_store(&p->f.w[0]->in_flight, 0);
    baton_policy_destroy(pol);
    /* a hot temperature samples every worker; a cold one keeps the minimum */
    pp.precise_tie_pct = 0;
    pp.precise_temperature_pct = 100000;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    int seen[N] = {0};
    for (int k = 0; k < 400; k++) {
        baton_worker_t *w = pick(pol, p, A, 16, &why, &m);
        for (int i = 0; i < N; i++)
            seen[i] += w == p->f.w[i];
    }
    for (int i = 0; i < N; i++)
        assert_true(seen[i] > 0);
    baton_policy_destroy(pol);
    pp.precise_temperature_pct = 1;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    for (int k = 0; k < 50; k++)
        assert_ptr_equal(pick(pol, p, A, 16, &why, &m), p->f.w[0]);
    baton_policy_destroy(pol);
}

static void test_provisional(void **state)
{
    pfix_t *p = *state;
    static const uint32_t B[12] = {70, 71, 72, 73, 74, 75, 76, 77, 78, 79, 80, 81};
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.precise_provisional_ms = 60000;
    baton_policy_t *pol;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    baton_choice_t why;
    uint32_t m;
    /* nobody holds B: the first pick is by load; the next ones follow it */
    baton_worker_t *first = pick(pol, p, B, 12, &why, &m);
    for (int k = 0; k < 10; k++) {
        assert_ptr_equal(pick(pol, p, B, 12, &why, &m), first);
        assert_int_equal(why, BATON_CHOICE_CACHE);
    }
    baton_policy_stats_t st;
    baton_policy_stats(pol, &st);
    assert_int_equal(st.precise_provisional_hits, 10);
    /* ... but they do not count as the decode's confirmed cache */
    baton_route_ctx_t ctx = {.tokens = B, .n_tokens = 12, .kv = p->kr};
    assert_int_equal(baton__precise_cached(&ctx, first), 0);
    baton_route_ctx_t ca = {.tokens = A, .n_tokens = 16, .kv = p->kr};
    assert_int_equal(baton__precise_cached(&ca, p->f.w[2]), 12);
    baton_route_ctx_free(&ctx);
    baton_route_ctx_free(&ca);
    baton_policy_destroy(pol);
}

/* Stores the first n blocks of ids in the KV store's source src of kr (medium L3). */
static void store_l3(baton_kvroute_t *kr, int src, const uint32_t *ids, uint32_t n)
{
    baton_kvev_hash_t h[8];
    for (uint32_t k = 0; k < n; k++)
        h[k] = (baton_kvev_hash_t){.i = 90000 + k};
    baton_kvev_event_t e = {.type = BATON_KVEV_STORED,
                            .hashes = h,
                            .n_hashes = n,
                            .token_ids = (uint32_t *)ids,
                            .n_tokens = n * 4,
                            .block_size = 4};
    strcpy(e.medium, "L3");
    baton_kvev_batch_t b = {.dp_rank = 0, .events = &e, .n_events = 1};
    assert_int_equal(baton__kvroute_inject_l3(kr, src, &b), 0);
}

static void test_l3_credit(void **state)
{
    pfix_t *p = *state;
    /* an index of its own: w0 holds A's first block in L1, w2 all four in L2, the store all
     * four (L3, reachable by every worker) */
    pfix_t q = *p;
    assert_int_equal(baton_kvroute_create(&q.kr, p->f.reg, NULL, NULL), 0);
    store(&q, 0, A, 1, "GPU");
    store(&q, 2, A, 4, "CPU");
    store_l3(q.kr, 9, A, 4);
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.precise_provisional_ms = 0;
    baton_policy_t *pol;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    baton_choice_t why;
    uint32_t m;
    /* each block at its best tier: w0 16 - 4 x (1 + 0.5 x 3) = 6, w1 and w3 16 - 4 x 2 = 8,
     * w2 16 - 4 x 0.75 x 4 = 4 (L2, not L2 + L3) */
    assert_ptr_equal(pick(pol, &q, A, 16, &why, &m), p->f.w[2]);
    assert_int_equal(m, 16);
    baton_policy_stats_t st;
    baton_policy_stats(pol, &st);
    assert_int_equal(st.precise_l3_credited, 0); /* w2 had it all itself */
    /* w2 busy (+12), w0 busy (+3): w0 9, w2 16, w1 and w3 8: the store's credit decides */
    atomic_store(&p->f.w[0]->in_flight_tokens, 3);
    atomic_store(&p->f.w[2]->in_flight_tokens, 12);
    baton_worker_t *w = pick(pol, &q, A, 16, &why, &m);
    assert_true(w == p->f.w[1] || w == p->f.w[3]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    assert_int_equal(m, 16);
    baton_policy_stats(pol, &st);
    assert_int_equal(st.precise_l3_credited, 1);
    assert_int_equal(st.precise_l3_tokens, 16);
    baton_policy_destroy(pol);
    /* without the credit: w0 12 + 3 = 15 beats w1's and w3's 16 and w2's 4 + 12 */
    pp.precise_l3_credit_pct = 0;
    assert_int_equal(baton_policy_create_with(&pol, BATON_POLICY_PRECISE, &pp), 0);
    assert_ptr_equal(pick(pol, &q, A, 16, &why, &m), p->f.w[0]);
    baton_policy_stats(pol, &st);
    assert_int_equal(st.precise_l3_credited, 0);
    baton_policy_destroy(pol);
    /* a prefix the store does not continue: a block past its chain is not credited */
    static const uint32_t C[16] = {1, 2, 3, 4, 99, 98, 97, 96, 9, 10, 11, 12, 13, 14, 15, 16};
    baton_route_ctx_t ctx = {.tokens = C, .n_tokens = 16, .kv = q.kr};
    uint32_t nb, bs;
    const uint64_t *keys = baton__precise_keys(&ctx, &nb, &bs);
    assert_non_null(keys);
    assert_int_equal(baton_kvroute_match_l3(q.kr, keys, nb), 1);
    baton_route_ctx_free(&ctx);
    atomic_store(&p->f.w[0]->in_flight_tokens, 0);
    atomic_store(&p->f.w[2]->in_flight_tokens, 0);
    baton_kvroute_destroy(q.kr);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_ties_and_temperature),
        cmocka_unit_test(test_provisional),
        cmocka_unit_test(test_l3_credit),
    };
    return cmocka_run_group_tests(tests, setup, teardown_p);
}
