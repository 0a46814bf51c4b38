/* test_prefix_cache.c — the worker's prefix cache: page-granular match, insert, LRU eviction
 * under a token bound, holds that block eviction, the "always compute one token" rule. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "baton/error.h"
#include "worker/prefix_cache.h"

#define P 4 /* tokens per page in these tests */

/* ids[i] = base + i */
static void seq(int64_t *ids, uint32_t n, int64_t base)
{
    for (uint32_t i = 0; i < n; i++)
        ids[i] = base + i;
}

static void test_match_insert(void **state)
{
    (void)state;
    wk_pcache_t *pc;
    assert_int_equal(wk_pcache_create(&pc, 1000, P), 0);
    int64_t a[18];
    seq(a, 18, 100);
    assert_int_equal(wk_pcache_match(pc, a, 18, NULL), 0);
    /* only whole pages go in: 18 tokens → 4 pages */
    assert_int_equal(wk_pcache_insert(pc, a, 18), 16);
    wk_pcache_stats_t st;
    wk_pcache_stats(pc, &st);
    assert_int_equal(st.cached_tokens, 16);
    assert_int_equal(st.nodes, 4);
    /* the same prompt: 16 cached, 2 computed */
    assert_int_equal(wk_pcache_match(pc, a, 18, NULL), 16);
    /* a prompt of exactly 16: at most n - 1 may be cached → 12 */
    assert_int_equal(wk_pcache_match(pc, a, 16, NULL), 12);
    /* diverging inside page 2 (token 9): pages 0 and 1 hit */
    int64_t b[18];
    seq(b, 18, 100);
    b[9] = -1;
    assert_int_equal(wk_pcache_match(pc, b, 18, NULL), 8);
    /* inserting b shares its first two pages: 2 new nodes */
    assert_int_equal(wk_pcache_insert(pc, b, 18), 16);
    wk_pcache_stats(pc, &st);
    assert_int_equal(st.nodes, 6);
    /* the same page contents under another parent is another node (a radix path, not a bag) */
    int64_t c[9];
    seq(c, 9, 104); /* c's first page equals a's second page */
    assert_int_equal(wk_pcache_match(pc, c, 9, NULL), 0);
    wk_pcache_stats(pc, &st);
    assert_int_equal(st.hit_tokens, 16 + 12 + 8);
    assert_int_equal(st.miss_tokens, 18 + 2 + 4 + 10 + 9);
    wk_pcache_destroy(pc);
}

static void test_lru_bound(void **state)
{
    (void)state;
    wk_pcache_t *pc;
    assert_int_equal(wk_pcache_create(&pc, 3 * 2 * P, P), 0); /* 6 pages */
    int64_t s[4][2 * P + 1];
    for (int k = 0; k < 4; k++)
        seq(s[k], 2 * P + 1, 1000 * (k + 1));
    for (int k = 0; k < 3; k++)
        assert_int_equal(wk_pcache_insert(pc, s[k], 2 * P + 1), 2 * P);
    /* touch session 0 so session 1 is the least recently used */
    assert_int_equal(wk_pcache_match(pc, s[0], 2 * P + 1, NULL), 2 * P);
    assert_int_equal(wk_pcache_insert(pc, s[3], 2 * P + 1), 2 * P);
    wk_pcache_stats_t st;
    wk_pcache_stats(pc, &st);
    assert_int_equal(st.cached_tokens, 6 * P); /* never above capacity */
    assert_int_equal(st.evictions, 2);
    assert_int_equal(st.evicted_tokens, 2 * P);
    assert_int_equal(wk_pcache_match(pc, s[1], 2 * P + 1, NULL), 0); /* evicted */
    assert_int_equal(wk_pcache_match(pc, s[0], 2 * P + 1, NULL), 2 * P);
    assert_int_equal(wk_pcache_match(pc, s[2], 2 * P + 1, NULL), 2 * P);
    assert_int_equal(wk_pcache_match(pc, s[3], 2 * P + 1, NULL), 2 * P);
    /* many more inserts: the bound holds throughout */
    int64_t x[5 * P];
    for (int k = 0; k < 200; k++) {
        seq(x, 5 * P, 50000 + 7 * k);
        wk_pcache_insert(pc, x, 5 * P);
        wk_pcache_stats(pc, &st);
        assert_true(st.cached_tokens <= 6 * P);
    }
    wk_pcache_destroy(pc);
}

static void test_hold_blocks_eviction(void **state)
{
    (void)state;
    wk_pcache_t *pc;
    assert_int_equal(wk_pcache_create(&pc, 2 * P, P), 0); /* 2 pages */
    int64_t a[2 * P + 1], b[2 * P + 1];
    seq(a, 2 * P + 1, 10);
    seq(b, 2 * P + 1, 90);
    assert_int_equal(wk_pcache_insert(pc, a, 2 * P + 1), 2 * P);
    wk_pcache_hold_t h = NULL;
    assert_int_equal(wk_pcache_match(pc, a, 2 * P + 1, &h), 2 * P);
    assert_non_null(h);
    /* full and every page held: b cannot go in, a stays */
    assert_int_equal(wk_pcache_insert(pc, b, 2 * P + 1), 0);
    assert_int_equal(wk_pcache_match(pc, a, 2 * P + 1, NULL), 2 * P);
    wk_pcache_stats_t st;
    wk_pcache_stats(pc, &st);
    assert_int_equal(st.held, 1);
    wk_pcache_release(pc, h);
    assert_int_equal(wk_pcache_insert(pc, b, 2 * P + 1), 2 * P);
    assert_int_equal(wk_pcache_match(pc, a, 2 * P + 1, NULL), 0);
    wk_pcache_stats(pc, &st);
    assert_int_equal(st.held, 0);
    /* a miss holds nothing */
    assert_int_equal(wk_pcache_match(pc, a, 2 * P + 1, &h), 0);
    assert_null(h);
    wk_pcache_destroy(pc);
}

static void test_off_and_bad(void **state)
{
    (void)state;
    wk_pcache_t *pc;
    assert_int_equal(wk_pcache_create(&pc, 10, 0), BATON_EINVAL);
    assert_int_equal(wk_pcache_create(&pc, 0, P), 0);
    int64_t a[3 * P];
    seq(a, 3 * P, 1);
    assert_int_equal(wk_pcache_insert(pc, a, 3 * P), 0);
    assert_int_equal(wk_pcache_match(pc, a, 3 * P, NULL), 0);
    assert_int_equal(wk_pcache_match(pc, a, 0, NULL), 0);
    wk_pcache_destroy(pc);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_match_insert),
        cmocka_unit_test(test_lru_bound),
        cmocka_unit_test(test_hold_blocks_eviction),
        cmocka_unit_test(test_off_and_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
