/* test_tier_policy.c — HiCache's policies on a fake clock (prefetch timeout rule, best_effort /
 * wait_complete / timeout, the minimum hit), the write policies, the L2 pool (lookup, LRU
 * eviction, pins, dirty pages handed to write-back) and the page layout's fill and check. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "worker/kvshape.h"
#include "worker/tier_l2.h"
#include "worker/tier_policy.h"

static void test_timeout_rule(void **state)
{
    (void)state;
    wk_pf_cfg_t c;
    wk_pf_cfg_default(&c);
    /* SGLang: 2 s + 0.1 s per 1,024 tokens, capped at 30 s */
    assert_int_equal(wk_pf_timeout_ms(&c, 0), 2000);
    assert_int_equal(wk_pf_timeout_ms(&c, 1024), 2100);
    assert_int_equal(wk_pf_timeout_ms(&c, 10240), 3000);
    assert_int_equal(wk_pf_timeout_ms(&c, 1023), 2099);
    assert_int_equal(wk_pf_timeout_ms(&c, 280 * 1024), 30000);
    assert_int_equal(wk_pf_timeout_ms(&c, 1u << 30), 30000);
    /* the minimum hit to bother: 256 tokens */
    assert_false(wk_pf_worth(&c, 0));
    assert_false(wk_pf_worth(&c, 255));
    assert_true(wk_pf_worth(&c, 256));
}

static void test_prefetch_policies(void **state)
{
    (void)state;
    wk_pf_cfg_t c;
    wk_pf_cfg_default(&c);
    c.step_ms = 5;
    wk_pf_t pf;
    uint64_t now = 1000000; /* the fake clock, ms */

    /* wait_complete: never before the last page, however long it takes */
    wk_pf_start(&pf, &c, WK_PF_WAIT_COMPLETE, now, 64, 16);
    assert_false(wk_pf_may_go(&pf, now));
    assert_false(wk_pf_may_go(&pf, now + 3600 * 1000));
    pf.done_pages = 63;
    assert_false(wk_pf_may_go(&pf, now + 3600 * 1000));
    pf.done_pages = 64;
    assert_true(wk_pf_may_go(&pf, now));
    /* ... or when every batch ended, some failed */
    wk_pf_start(&pf, &c, WK_PF_WAIT_COMPLETE, now, 64, 16);
    pf.done_pages = 10;
    pf.finished = 1;
    assert_true(wk_pf_may_go(&pf, now));

    /* timeout: 64 pages × 16 tokens = 1,024 tokens → 2,100 ms */
    wk_pf_start(&pf, &c, WK_PF_TIMEOUT, now, 64, 16);
    assert_false(wk_pf_may_go(&pf, now + 2099));
    assert_true(wk_pf_may_go(&pf, now + 2100));
    pf.done_pages = 64; /* complete before the timeout: goes at once */
    assert_true(wk_pf_may_go(&pf, now + 1));

    /* best_effort: one scheduler step, then with what arrived */
    wk_pf_start(&pf, &c, WK_PF_BEST_EFFORT, now, 64, 16);
    assert_false(wk_pf_may_go(&pf, now + 4));
    pf.done_pages = 3;
    assert_true(wk_pf_may_go(&pf, now + 5));
    assert_int_equal(pf.done_pages, 3);

    /* names */
    wk_pf_policy_t p;
    assert_int_equal(wk_pf_policy_parse("timeout", &p), 0);
    assert_int_equal(p, WK_PF_TIMEOUT);
    assert_int_equal(wk_pf_policy_parse("sometimes", &p), -1);
    assert_string_equal(wk_pf_policy_name(WK_PF_BEST_EFFORT), "best_effort");
}

static void test_write_policies(void **state)
{
    (void)state;
    wk_wp_policy_t p;
    assert_int_equal(wk_wp_policy_parse("write_through_selective", &p), 0);
    assert_int_equal(p, WK_WP_WRITE_THROUGH_SELECTIVE);
    assert_int_equal(wk_wp_policy_parse("write_around", &p), -1);
    /* write_through: everything, everywhere, at once */
    assert_true(wk_wp_to_l2(WK_WP_WRITE_THROUGH, 1) && wk_wp_to_l3(WK_WP_WRITE_THROUGH, 1));
    assert_false(wk_wp_on_evict(WK_WP_WRITE_THROUGH));
    /* selective: only a page used more than once */
    assert_false(wk_wp_to_l2(WK_WP_WRITE_THROUGH_SELECTIVE, 1));
    assert_false(wk_wp_to_l3(WK_WP_WRITE_THROUGH_SELECTIVE, 1));
    assert_true(wk_wp_to_l2(WK_WP_WRITE_THROUGH_SELECTIVE, 2));
    assert_true(wk_wp_to_l3(WK_WP_WRITE_THROUGH_SELECTIVE, 2));
    /* write_back: L2 now, L3 on eviction */
    assert_true(wk_wp_to_l2(WK_WP_WRITE_BACK, 1));
    assert_false(wk_wp_to_l3(WK_WP_WRITE_BACK, 5));
    assert_true(wk_wp_on_evict(WK_WP_WRITE_BACK));
}

static wk_tier_key_t key_of(unsigned i)
{
    wk_tier_key_t k;
    int64_t ids[1] = {(int64_t)i};
    wk_tier_key_next(NULL, ids, 1, &k);
    return k;
}

typedef struct {
    int calls;
    int32_t slot;
} dirty_seen_t;

static void on_dirty(void *ud, wk_l2_t *l2, int32_t slot, const wk_tier_key_t *key)
{
    dirty_seen_t *d = ud;
    (void)l2;
    (void)key;
    d->calls++;
    d->slot = slot;
}

static void test_l2_pool(void **state)
{
    (void)state;
    uint8_t mem[4 * 100];
    dirty_seen_t d = {0, -1};
    wk_l2_t *l2;
    assert_int_equal(wk_l2_create(&l2, mem, sizeof(mem) + 50, 100, on_dirty, &d), 0);
    wk_tier_key_t k[6];
    for (int i = 0; i < 6; i++)
        k[i] = key_of((unsigned)i);
    /* fill 4 slots; a FILLING entry is not found, a READY one is */
    int32_t s[4];
    for (int i = 0; i < 4; i++) {
        s[i] = wk_l2_alloc(l2, &k[i]);
        assert_true(s[i] >= 0);
        assert_int_equal(wk_l2_find(l2, &k[i]), -1);
        wk_l2_commit(l2, s[i], i == 1); /* k1 dirty */
        assert_int_equal(wk_l2_find(l2, &k[i]), s[i]);
    }
    assert_int_equal(wk_l2_alloc(l2, &k[2]), -1); /* already there */
    /* LRU now k0 k1 k2 k3 (found in that order); k0 pinned: k1 is next, dirty: handed to the
     * callback (pinned by it), so k2 goes */
    wk_l2_pin(l2, s[0]);
    int32_t n4 = wk_l2_alloc(l2, &k[4]);
    assert_int_equal(n4, s[2]);
    assert_int_equal(d.calls, 1);
    assert_int_equal(d.slot, s[1]);
    assert_int_equal(wk_l2_find(l2, &k[2]), -1);
    assert_int_equal(wk_l2_find(l2, &k[0]), s[0]);
    /* LRU k1 k3 k0: k1 pinned by its write-back, k3 goes */
    int32_t n5 = wk_l2_alloc(l2, &k[5]);
    assert_int_equal(n5, s[3]);
    assert_int_equal(d.calls, 1); /* already being written back: not handed over again */
    /* now every slot is pinned, filling or being written back: none */
    wk_tier_key_t k6 = key_of(6);
    assert_int_equal(wk_l2_alloc(l2, &k6), -2);
    wk_l2_stats_t st;
    wk_l2_stats(l2, &st);
    assert_int_equal(st.slots, 4);
    assert_int_equal(st.used, 4);
    assert_int_equal(st.evictions, 2);
    /* the write-back finished: k1 is clean and unpinned, so it can go now */
    wk_l2_clean(l2, s[1]);
    wk_l2_unpin(l2, s[1]);
    assert_int_equal(wk_l2_alloc(l2, &k6), s[1]);
    wk_l2_commit(l2, n5, 0);
    wk_l2_drop(l2, n4); /* a fill that failed goes */
    assert_int_equal(wk_l2_find(l2, &k[4]), -1);
    wk_l2_destroy(l2);
}

static void test_page_layout(void **state)
{
    (void)state;
    wk_kvshape_t s;
    assert_int_equal(wk_kvshape_preset("tiny", &s), 0);
    uint64_t pb = wk_tier_page_bytes(&s);
    assert_int_equal(pb, (uint64_t)s.layers * s.page_tokens * wk_kvshape_token_bytes(&s));
    uint8_t *p = malloc(pb);
    int64_t ids[64];
    for (int i = 0; i < 64; i++)
        ids[i] = 1000 + i;
    wk_tier_page_fill(p, &s, ids + 16, 16);
    assert_int_equal(wk_tier_page_check(p, &s, ids + 16, 16), 0);
    /* another position, another token, one flipped byte in either half: all caught */
    assert_int_equal(wk_tier_page_check(p, &s, ids + 16, 0), -1);
    assert_int_equal(wk_tier_page_check(p, &s, ids + 17, 16), -1);
    p[pb / 2 - 1] ^= 1;
    assert_int_equal(wk_tier_page_check(p, &s, ids + 16, 16), -1);
    p[pb / 2 - 1] ^= 1;
    p[pb - 1] ^= 0x80;
    assert_int_equal(wk_tier_page_check(p, &s, ids + 16, 16), -1);
    free(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_timeout_rule),   cmocka_unit_test(test_prefetch_policies),
        cmocka_unit_test(test_write_policies), cmocka_unit_test(test_l2_pool),
        cmocka_unit_test(test_page_layout),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
