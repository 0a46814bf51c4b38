/* test_policy_cache.c — cache- and load-aware routing state: the approximate prefix tree (insert,
 * match, LRU bound, restart drop, concurrent readers on N threads), the consistent-hash ring
 * (distribution, remapping on join/leave), the load guard, and the three new policies. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "router/dataplane/pick.h"
#include "router/dataplane/policy.h"
#include "router/dataplane/policy_ring.h"
#include "router/dataplane/policy_tree.h"
#include "router/control/registry.h"
#include "registry_fixture.h"

static int setup(void **state)
{
    static fixture_t f;
    if (fixture_fill(&f, 7100, BATON_ROLE_PREFILL) != 0)
        return -1;
    *state = &f;
    return 0;
}

static void chain(const char *s, unsigned block, baton_ptree_chain_t *c)
{
    assert_int_equal(baton_ptree_chain(s, strlen(s), block, c), 0);
}

/* ---- the tree ---- */

static void test_chain(void **state)
{
    (void)state;
    baton_ptree_chain_t c;
    chain("  a b  c d e ", 2, &c);
    assert_int_equal(c.words, 5);
    assert_int_equal(c.n, 3); /* after 2, 4 and 5 words */
    assert_int_equal(c.ends[0], 2);
    assert_int_equal(c.ends[1], 4);
    assert_int_equal(c.ends[2], 5);
    baton_ptree_chain_t d;
    chain("a\tb\nc d x y", 2, &d); /* same words, other spaces: the same names */
    assert_true(c.hash[0] == d.hash[0] && c.hash[1] == d.hash[1]);
    assert_true(c.hash[2] != d.hash[2]);
    baton_ptree_chain_free(&c);
    baton_ptree_chain_free(&d);
    assert_int_equal(baton_ptree_words("  a b  c d e ", 13), 5);
    assert_int_equal(baton_ptree_words("x", 1), 1);
    assert_int_equal(baton_ptree_words(" \t\n", 3), 0);
    chain("   ", 2, &c);
    assert_int_equal(c.n, 0);
    assert_int_equal(c.words, 0);
    baton_ptree_chain_free(&c);
}

static void test_tree_match_insert(void **state)
{
    fixture_t *f = *state;
    baton_ptree_t *t;
    assert_int_equal(baton_ptree_create(&t, 1000), 0);
    baton_ptree_chain_t a, b, q;
    chain("sys prompt is long here then user one asks", 2, &a); /* 9 words */
    chain("sys prompt is long here then user two asks", 2, &b); /* diverges at word 8 */
    chain("sys prompt is long here then user one asks and more", 2, &q);
    baton_ptree_insert(t, f->w[1], &a);
    baton_ptree_insert(t, f->w[2], &b);
    uint32_t m[N];
    baton_ptree_match(t, &q, f->w, N, m);
    assert_int_equal(m[0], 0);
    /* a's whole blocks: its last, partial block ("asks") names a prefix q does not end at —
     * matches are block-granular, as the worker's page-granular cache is */
    assert_int_equal(m[1], 8);
    assert_int_equal(m[2], 6); /* blocks of 2: "then user" is the last shared block */
    assert_int_equal(m[3], 0);
    size_t bytes;
    assert_int_equal(baton_ptree_size(t, f->w[1]->id, &bytes), a.n);
    assert_true(bytes > 0);
    /* a restart (new incarnation) empties the worker's tree */
    atomic_fetch_add(&f->w[1]->incarnation, 1);
    baton_ptree_match(t, &q, f->w, N, m);
    assert_int_equal(m[1], 0);
    assert_int_equal(baton_ptree_size(t, f->w[1]->id, NULL), 0);
    /* the health layer's view drives it: down and up again is a new incarnation, and so is a
     * breaker closing after it opened; staying healthy is not */
    unsigned inc = atomic_load(&f->w[2]->incarnation);
    baton_registry_set_health(f->reg, f->w[2], BATON_HEALTH_HEALTHY);
    assert_int_equal(atomic_load(&f->w[2]->incarnation), inc);
    baton_registry_set_health(f->reg, f->w[2], BATON_HEALTH_UNHEALTHY);
    assert_int_equal(atomic_load(&f->w[2]->incarnation), inc);
    baton_registry_set_health(f->reg, f->w[2], BATON_HEALTH_HEALTHY);
    assert_int_equal(atomic_load(&f->w[2]->incarnation), inc + 1);
    baton_registry_set_breaker(f->reg, f->w[2], BATON_BREAKER_OPEN);
    baton_registry_set_breaker(f->reg, f->w[2], BATON_BREAKER_CLOSED);
    assert_int_equal(atomic_load(&f->w[2]->incarnation), inc + 2);
    baton_ptree_match(t, &q, f->w, N, m);
    assert_int_equal(m[2], 0); /* w2's tree went with its old incarnation */
    baton_ptree_insert(t, f->w[2], &b);
    baton_ptree_match(t, &q, f->w, N, m);
    assert_int_equal(m[2], 6);
    baton_ptree_drop(t, f->w[2]->id);
    baton_ptree_match(t, &q, f->w, N, m);
    assert_int_equal(m[2], 0);
    baton_ptree_chain_free(&a);
    baton_ptree_chain_free(&b);
    baton_ptree_chain_free(&q);
    baton_ptree_destroy(t);
}

static void test_tree_bound_lru(void **state)
{
    fixture_t *f = *state;
    baton_ptree_t *t;
    assert_int_equal(baton_ptree_create(&t, 10), 0); /* 10 names per worker */
    char text[256];
    baton_ptree_chain_t c[8];
    for (int s = 0; s < 8; s++) {
        /* 4 one-word blocks each: session s */
        snprintf(text, sizeof(text), "s%d a%d b%d c%d", s, s, s, s);
        chain(text, 1, &c[s]);
    }
    for (int s = 0; s < 8; s++) {
        baton_ptree_insert(t, f->w[0], &c[s]);
        assert_true(baton_ptree_size(t, f->w[0]->id, NULL) <= 10);
    }
    uint32_t m;
    /* the newest two sessions are whole (8 names); older ones were evicted leaves-first */
    baton_ptree_match(t, &c[7], f->w, 1, &m);
    assert_int_equal(m, 4);
    baton_ptree_match(t, &c[6], f->w, 1, &m);
    assert_int_equal(m, 4);
    baton_ptree_match(t, &c[0], f->w, 1, &m);
    assert_int_equal(m, 0);
    /* 10 names: session 5 keeps its two first blocks (prefixes outlive their leaves) */
    baton_ptree_match(t, &c[5], f->w, 1, &m);
    assert_int_equal(m, 2);
    for (int s = 0; s < 8; s++)
        baton_ptree_chain_free(&c[s]);
    baton_ptree_destroy(t);
}

/* N threads (the router's loops) match and insert concurrently: every match sees a consistent
 * tree (a session's own prefix always fully matched after its insert), the bound holds. */
typedef struct {
    baton_ptree_t *t;
    baton_worker_t **w;
    int id;
    int bad;
} thr_t;

static void *thr_main(void *arg)
{
    thr_t *a = arg;
    char text[128];
    for (int i = 0; i < 2000; i++) {
        baton_ptree_chain_t c;
        snprintf(text, sizeof(text), "shared system prompt t%d session %d turn words", a->id,
                 i % 50);
        if (baton_ptree_chain(text, strlen(text), 2, &c) != 0) {
            a->bad++;
            continue;
        }
        baton_ptree_insert(a->t, a->w[a->id % N], &c);
        uint32_t m[N];
        baton_ptree_match(a->t, &c, a->w, N, m);
        if (m[a->id % N] != c.words) /* 256 names per worker hold 50 sessions × 4 easily */
            a->bad++;
        baton_ptree_chain_free(&c);
    }
    return NULL;
}

static void test_tree_concurrent(void **state)
{
    fixture_t *f = *state;
    baton_ptree_t *t;
    assert_int_equal(baton_ptree_create(&t, 256), 0);
    enum { T = 4 };
    pthread_t th[T];
    thr_t a[T];
    for (int i = 0; i < T; i++) {
        a[i] = (thr_t){t, f->w, i, 0};
        assert_int_equal(pthread_create(&th[i], NULL, thr_main, &a[i]), 0);
    }
    for (int i = 0; i < T; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(a[i].bad, 0);
    }
    for (int i = 0; i < N; i++)
        assert_true(baton_ptree_size(t, f->w[i]->id, NULL) <= 256);
    size_t bytes;
    assert_true(baton_ptree_total(t, &bytes) > 0);
    baton_ptree_destroy(t);
}

/* ---- the ring ---- */

static void test_ring_distribution_and_remap(void **state)
{
    (void)state;
    const char *ids[5] = {"w-00000001", "w-00000002", "w-00000003", "w-00000004", "w-00000005"};
    baton_ring_t *r4, *r5, *r3;
    assert_int_equal(baton_ring_build(&r4, ids, 4, 160), 0);
    assert_int_equal(baton_ring_build(&r5, ids, 5, 160), 0);
    /* without ids[1]: the remaining keep their order for the lookup by name below */
    const char *ids3[3] = {ids[0], ids[2], ids[3]};
    assert_int_equal(baton_ring_build(&r3, ids3, 3, 160), 0);
    enum { K = 20000 };
    unsigned count[4] = {0}, moved_join = 0, moved_leave = 0, wrong_leave = 0;
    for (unsigned k = 0; k < K; k++) {
        char key[32];
        int len = snprintf(key, sizeof(key), "session-%u", k);
        uint64_t h = baton_ring_hash(key, (size_t)len);
        size_t a = baton_ring_lookup(r4, h);
        assert_true(a < 4);
        count[a]++;
        size_t b = baton_ring_lookup(r5, h);
        if (b != a) {
            moved_join++;
            if (b != 4)
                wrong_leave++; /* a join may only move keys TO the new worker */
        }
        const char *c = ids3[baton_ring_lookup(r3, h)];
        if (strcmp(c, ids[a]) != 0) {
            moved_leave++;
            if (a != 1)
                wrong_leave++; /* a leave may only move the leaver's keys */
        }
    }
    /* 160 virtual nodes: every worker within ±25% of a fair share */
    for (int i = 0; i < 4; i++)
        assert_true(count[i] > K / 4 * 3 / 4 && count[i] < K / 4 * 5 / 4);
    assert_int_equal(wrong_leave, 0);
    assert_int_equal(moved_leave, count[1]);
    /* a fifth worker takes about 1/5 of the keys */
    assert_true(moved_join > K / 5 / 2 && moved_join < K / 5 * 3 / 2);
    /* stateless: a ring built again (another router) agrees */
    baton_ring_t *again;
    assert_int_equal(baton_ring_build(&again, ids, 4, 160), 0);
    for (unsigned k = 0; k < 1000; k++)
        assert_int_equal(baton_ring_lookup(again, k * 0x9e3779b97f4a7c15ULL),
                         baton_ring_lookup(r4, k * 0x9e3779b97f4a7c15ULL));
    assert_int_equal(baton_ring_lookup(NULL, 1), SIZE_MAX);
    baton_ring_free(again);
    baton_ring_free(r3);
    baton_ring_free(r4);
    baton_ring_free(r5);
}

/* ---- the load guard and the policies ---- */

static void set_load(fixture_t *f, long a, long b, long c, long d)
{
    long v[N] = {a, b, c, d};
    for (int i = 0; i < N; i++)
        atomic_store(&f->w[i]->in_flight, v[i]);
}

static void test_load_guard(void **state)
{
    fixture_t *f = *state;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp); /* abs 64, rel 150% */
    set_load(f, 0, 0, 0, 0);
    assert_false(baton__policy_imbalanced(&pp, f->w, N));
    set_load(f, 10, 70, 20, 30); /* diff 60: not over abs */
    assert_false(baton__policy_imbalanced(&pp, f->w, N));
    set_load(f, 10, 80, 20, 30); /* diff 70 > 64 and 80 > 15 */
    assert_true(baton__policy_imbalanced(&pp, f->w, N));
    set_load(f, 200, 270, 220, 230); /* diff 70 but 270 < 300: relative guard holds it */
    assert_false(baton__policy_imbalanced(&pp, f->w, N));
    set_load(f, 200, 301, 220, 230); /* diff 101, 301 > 300 */
    assert_true(baton__policy_imbalanced(&pp, f->w, N));
    set_load(f, 0, 0, 0, 0);
}

static baton_worker_t *sel(baton_policy_t *p, fixture_t *f, baton_route_ctx_t *ctx,
                           baton_choice_t *why, uint32_t *matched)
{
    baton_worker_t *w = baton_policy_select_ctx(p, f->w, N, ctx, why, matched);
    baton_policy_chosen(p, w, ctx, *why, *matched);
    return w;
}

static void test_cache_aware(void **state)
{
    fixture_t *f = *state;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.cache_block_words = 2;
    pp.balance_abs_threshold = 4;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create_with(&p, BATON_POLICY_CACHE_AWARE, &pp), 0);
    set_load(f, 0, 0, 0, 0);
    const char *t1 = "you are a helpful bot user asks about rivers";
    const char *t2 = "you are a helpful bot user asks about rivers assistant says water user more";
    baton_route_ctx_t c1 = {.text = t1, .text_len = strlen(t1), .words = 9};
    baton_route_ctx_t c2 = {.text = t2, .text_len = strlen(t2), .words = 14};
    baton_choice_t why;
    uint32_t m;
    atomic_store(&f->w[2]->in_flight, 0);
    set_load(f, 1, 1, 0, 1); /* empty trees: the least loaded, w2 */
    baton_worker_t *first = sel(p, f, &c1, &why, &m);
    assert_ptr_equal(first, f->w[2]);
    assert_int_equal(why, BATON_CHOICE_LOAD);
    /* the follow-up turn goes where its prefix is, although w2 is now the busiest */
    set_load(f, 0, 0, 3, 0);
    assert_ptr_equal(sel(p, f, &c2, &why, &m), f->w[2]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    assert_int_equal(m, 8); /* 4 whole blocks of 2 */
    /* under the threshold (8 of 40 words < 30%): least load */
    const char *t3 = "you are a helpful bot user asks about rivers x x x x x x x x x x x x x x x x "
                     "x x x x x x x x x x x x x x x";
    baton_route_ctx_t c3 = {.text = t3, .text_len = strlen(t3), .words = 40};
    assert_ptr_not_equal(sel(p, f, &c3, &why, &m), f->w[2]);
    assert_int_equal(why, BATON_CHOICE_LOAD);
    /* the guard: imbalanced (diff 9 > 4, 9 > 1.5 × 0) → shortest queue despite the match */
    set_load(f, 0, 1, 9, 1);
    assert_ptr_equal(sel(p, f, &c2, &why, &m), f->w[0]);
    assert_int_equal(why, BATON_CHOICE_LOAD);
    set_load(f, 0, 0, 0, 0);
    /* the worker's fields and the policy's counters */
    assert_true(atomic_load(&f->w[2]->cache_tree_names) > 0);
    assert_true(atomic_load(&f->w[2]->cache_hit_ppm) > 0);
    baton_policy_stats_t st;
    baton_policy_stats(p, &st);
    assert_int_equal(st.chosen[BATON_CHOICE_CACHE], 1);
    assert_int_equal(st.chosen[BATON_CHOICE_LOAD], 3);
    assert_int_equal(st.predicted_hit_words, 8);
    assert_int_equal(st.prompt_words, 9 + 14 + 40 + 14);
    assert_true(st.tree_names > 0 && st.tree_bytes > 0);
    baton_route_ctx_free(&c1);
    baton_route_ctx_free(&c2);
    baton_route_ctx_free(&c3);
    /* what a reload compares: kind and every knob */
    assert_true(baton_policy_same(p, BATON_POLICY_CACHE_AWARE, &pp));
    assert_false(baton_policy_same(p, BATON_POLICY_LEAST_LOAD, &pp));
    pp.cache_threshold_pct = 50;
    assert_false(baton_policy_same(p, BATON_POLICY_CACHE_AWARE, &pp));
    assert_false(baton_policy_same(p, BATON_POLICY_CACHE_AWARE, NULL));
    baton_policy_destroy(p);
}

/* Builds two trees (w0 holds an 8-word prefix of the probe, w1 a 6-word one), then routes the
 * probe with w0 the busier: which worker cache_aware picks, and why / how much it matched. */
static baton_worker_t *probe_ties(fixture_t *f, unsigned tie_pct, baton_choice_t *why, uint32_t *m)
{
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.cache_block_words = 2;
    pp.balance_abs_threshold = 1000; /* no guard */
    pp.cache_tie_pct = tie_pct;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create_with(&p, BATON_POLICY_CACHE_AWARE, &pp), 0);
    const char *a = "you are a helpful bot user asks about rivers";
    const char *b =
        "you are a helpful bot user asks zz q q q q q q q q q q q q q q q q q q q q q q "
        "q q q q q q";
    const char *probe = "you are a helpful bot user asks about rivers and lakes";
    baton_route_ctx_t ca = {.text = a, .text_len = strlen(a), .words = 9};
    baton_route_ctx_t cb = {.text = b, .text_len = strlen(b), .words = 36};
    baton_route_ctx_t cp = {.text = probe, .text_len = strlen(probe), .words = 11};
    baton_choice_t w;
    uint32_t mm;
    set_load(f, 0, 1, 1, 1);
    assert_ptr_equal(sel(p, f, &ca, &w, &mm), f->w[0]);
    set_load(f, 1, 0, 1, 1); /* b's 6-word match on w0 is under 30% of 36: least load, w1 */
    assert_ptr_equal(sel(p, f, &cb, &w, &mm), f->w[1]);
    set_load(f, 3, 0, 1, 1);
    baton_worker_t *got = sel(p, f, &cp, why, m);
    set_load(f, 0, 0, 0, 0);
    baton_route_ctx_free(&ca);
    baton_route_ctx_free(&cb);
    baton_route_ctx_free(&cp);
    if (tie_pct != 0) /* a reload compares the knob too */
        assert_false(baton_policy_same(p, BATON_POLICY_CACHE_AWARE, NULL));
    baton_policy_destroy(p);
    return got;
}

/* The two refinements, off by default: near-equal matches decided by load, and a guard on
 * in-flight prompt words. */
static void test_cache_aware_refinements(void **state)
{
    fixture_t *f = *state;
    baton_choice_t why;
    uint32_t m;
    /* SGLang's rule: the longest match wins, however busy */
    assert_ptr_equal(probe_ties(f, 0, &why, &m), f->w[0]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    assert_int_equal(m, 8);
    /* 6 of 8 is within 30%: the idler of the two that hold the prefix */
    assert_ptr_equal(probe_ties(f, 30, &why, &m), f->w[1]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    assert_int_equal(m, 6);
    /* 6 of 8 is not within 20% */
    assert_ptr_equal(probe_ties(f, 20, &why, &m), f->w[0]);

    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    assert_int_equal(pp.cache_tie_pct, 0);
    assert_int_equal(pp.balance_by_words, 0);
    pp.balance_abs_threshold = 100;
    set_load(f, 1, 1, 1, 1);
    long words[N] = {0, 500, 20, 0};
    for (int i = 0; i < N; i++)
        atomic_store(&f->w[i]->in_flight_tokens, words[i]);
    assert_false(baton__policy_imbalanced(&pp, f->w, N)); /* equal request counts */
    pp.balance_by_words = 1;
    assert_true(baton__policy_imbalanced(&pp, f->w, N)); /* 500 - 0 > 100 words */
    atomic_store(&f->w[1]->in_flight_tokens, 90);
    assert_false(baton__policy_imbalanced(&pp, f->w, N));
    for (int i = 0; i < N; i++)
        atomic_store(&f->w[i]->in_flight_tokens, 0);
    set_load(f, 0, 0, 0, 0);
}

/* Workers sharing a KV store: w0 holds an 8-word prefix of the probe; who gets the probe as w0's
 * queue grows, with fetching priced at l3_pct % of computing. */
static baton_worker_t *probe_l3(fixture_t *f, unsigned l3_pct, long w0_words, baton_choice_t *why,
                                uint32_t *m)
{
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    pp.cache_block_words = 2;
    pp.balance_abs_threshold = 1000; /* no guard */
    pp.cache_l3_pct = l3_pct;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create_with(&p, BATON_POLICY_CACHE_AWARE, &pp), 0);
    const char *a = "you are a helpful bot user asks about rivers";
    const char *probe = "you are a helpful bot user asks about rivers and lakes";
    baton_route_ctx_t ca = {.text = a, .text_len = strlen(a), .words = 9};
    baton_route_ctx_t cp = {.text = probe, .text_len = strlen(probe), .words = 11};
    baton_choice_t w;
    uint32_t mm;
    set_load(f, 0, 1, 1, 1);
    assert_ptr_equal(sel(p, f, &ca, &w, &mm), f->w[0]);
    set_load(f, 1, 1, 0, 1);
    atomic_store(&f->w[0]->in_flight_tokens, w0_words);
    baton_worker_t *got = sel(p, f, &cp, why, m);
    atomic_store(&f->w[0]->in_flight_tokens, 0);
    set_load(f, 0, 0, 0, 0);
    baton_route_ctx_free(&ca);
    baton_route_ctx_free(&cp);
    if (l3_pct != 0)
        assert_false(baton_policy_same(p, BATON_POLICY_CACHE_AWARE, NULL));
    baton_policy_destroy(p);
    return got;
}

static void test_cache_aware_l3_cost(void **state)
{
    fixture_t *f = *state;
    baton_choice_t why;
    uint32_t m;
    baton_policy_params_t pp;
    baton_policy_params_default(&pp);
    assert_int_equal(pp.cache_l3_pct, 0);
    /* off: SGLang's rule, the holder however long its queue */
    assert_ptr_equal(probe_l3(f, 0, 500, &why, &m), f->w[0]);
    assert_int_equal(m, 8);
    /* the holder idle: its L1 hit is the cheapest */
    assert_ptr_equal(probe_l3(f, 10, 0, &why, &m), f->w[0]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    /* 500 words queued on it cost more than fetching 8 words at 10%: the idle w2 (fewest
     * requests in flight among the equal costs), by cache since the prefix is reachable */
    assert_ptr_equal(probe_l3(f, 10, 500, &why, &m), f->w[2]);
    assert_int_equal(why, BATON_CHOICE_CACHE);
    assert_int_equal(m, 0); /* it holds nothing itself: the store does */
    /* a fetch as dear as computing (100%): 5 queued words are still cheaper than 8 to fetch */
    assert_ptr_equal(probe_l3(f, 100, 5, &why, &m), f->w[0]);
    assert_ptr_equal(probe_l3(f, 100, 9, &why, &m), f->w[2]);
}

static void test_consistent_hash_and_least_load(void **state)
{
    fixture_t *f = *state;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_CONSISTENT_HASH), 0);
    baton_choice_t why;
    uint32_t m;
    baton_route_ctx_t s = {.session = "alice", .session_len = 5};
    baton_worker_t *w = sel(p, f, &s, &why, &m);
    assert_int_equal(why, BATON_CHOICE_SESSION);
    set_load(f, 5, 5, 5, 5);
    atomic_store(&w->in_flight, 50); /* load does not move a session */
    for (int i = 0; i < 20; i++)
        assert_ptr_equal(sel(p, f, &s, &why, &m), w);
    /* the same session in the candidate order reversed (another router's snapshot) */
    baton_worker_t *rev[N] = {f->w[3], f->w[2], f->w[1], f->w[0]};
    assert_ptr_equal(baton_policy_select_ctx(p, rev, N, &s, &why, &m), w);
    /* no session key: least load */
    set_load(f, 3, 1, 2, 4);
    baton_route_ctx_t none = {0};
    assert_ptr_equal(sel(p, f, &none, &why, &m), f->w[1]);
    assert_int_equal(why, BATON_CHOICE_LOAD);
    baton_policy_destroy(p);

    assert_int_equal(baton_policy_create(&p, BATON_POLICY_LEAST_LOAD), 0);
    set_load(f, 2, 2, 2, 2);
    atomic_store(&f->w[0]->in_flight_tokens, 500);
    atomic_store(&f->w[1]->in_flight_tokens, 100);
    atomic_store(&f->w[2]->in_flight_tokens, 900);
    atomic_store(&f->w[3]->in_flight_tokens, 300);
    assert_ptr_equal(baton_policy_select_ctx(p, f->w, N, NULL, &why, &m), f->w[1]);
    atomic_store(&f->w[3]->in_flight, 1);
    assert_ptr_equal(baton_policy_select(p, f->w, N), f->w[3]);
    for (int i = 0; i < N; i++)
        atomic_store(&f->w[i]->in_flight_tokens, 0);
    set_load(f, 0, 0, 0, 0);
    baton_policy_destroy(p);
}

/* The pick path: the in-flight words are held with the slot, and a pin names the worker. */
static void test_pick_tokens_and_pin(void **state)
{
    fixture_t *f = *state;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_LEAST_LOAD), 0);
    baton_route_ctx_t ctx = {.words = 120, .pin = NULL};
    baton_pick_t pk;
    assert_int_equal(
        baton_pick_ctx(f->reg, p, NULL, 0, BATON_ROLE_PREFILL, NULL, 0, NULL, NULL, &ctx, &pk),
        BATON_PICK_OK);
    assert_int_equal(atomic_load(&pk.w->in_flight_tokens), 120);
    baton_worker_t *w = pk.w;
    baton_worker_ref(w);
    baton_pick_release(NULL, &pk, BATON_OUTCOME_NEUTRAL);
    assert_int_equal(atomic_load(&w->in_flight_tokens), 0);
    assert_int_equal(baton_worker_in_flight(w), 0);
    baton_worker_unref(w);
    /* pinned: always that worker, whatever the load; an unknown id pins nothing */
    char pin[64];
    snprintf(pin, sizeof(pin), "w-nothere, %s", f->w[3]->id);
    ctx.pin = pin;
    atomic_store(&f->w[3]->in_flight, 7);
    assert_int_equal(
        baton_pick_ctx(f->reg, p, NULL, 0, BATON_ROLE_PREFILL, NULL, 0, NULL, NULL, &ctx, &pk),
        BATON_PICK_OK);
    assert_ptr_equal(pk.w, f->w[3]);
    baton_pick_release(NULL, &pk, BATON_OUTCOME_NEUTRAL);
    /* pinned to a worker that is not eligible: none, not another one */
    baton_registry_set_draining(f->reg, f->w[3], 1);
    assert_int_equal(
        baton_pick_ctx(f->reg, p, NULL, 0, BATON_ROLE_PREFILL, NULL, 0, NULL, NULL, &ctx, &pk),
        BATON_PICK_NONE);
    baton_registry_set_draining(f->reg, f->w[3], 0);
    /* the pin names a prefill worker: a decode pick is not affected (no decode: none) */
    assert_int_equal(
        baton_pick_ctx(f->reg, p, NULL, 0, BATON_ROLE_DECODE, NULL, 0, NULL, NULL, &ctx, &pk),
        BATON_PICK_NONE);
    atomic_store(&f->w[3]->in_flight, 0);
    baton_policy_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_chain),
        cmocka_unit_test(test_tree_match_insert),
        cmocka_unit_test(test_tree_bound_lru),
        cmocka_unit_test(test_tree_concurrent),
        cmocka_unit_test(test_ring_distribution_and_remap),
        cmocka_unit_test(test_load_guard),
        cmocka_unit_test(test_cache_aware),
        cmocka_unit_test(test_cache_aware_refinements),
        cmocka_unit_test(test_cache_aware_l3_cost),
        cmocka_unit_test(test_consistent_hash_and_least_load),
        cmocka_unit_test(test_pick_tokens_and_pin),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
