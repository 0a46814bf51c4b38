/* test_dp_rank.c — DP-rank selection (dp_rank.h): the least-loaded choice and its rotating ties,
 * the per-(worker, rank) in-flight counts taken and given back, decode ranks restricted to those
 * that share a room with the prefill's, round robin, and registration of a vllm-mooncake DP
 * prefill. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>

#include "baton/error.h"
#include "router/dataplane/dp_rank.h"

static baton_registry_t *reg;

static baton_worker_t *add(const char *url, baton_worker_role_t role, int dp)
{
    baton_worker_spec_t s;
    baton_worker_spec_init(&s);
    s.url = url;
    s.role = role;
    s.dp_size = dp;
    baton_worker_t *w = NULL;
    assert_int_equal(baton_registry_add(reg, &s, &w, NULL, 0), 0);
    return w;
}

static int setup(void **state)
{
    (void)state;
    return baton_registry_create(&reg);
}

static int teardown(void **state)
{
    (void)state;
    baton_registry_destroy(reg);
    return 0;
}

static void test_least_pure(void **state)
{
    (void)state;
    long load[6] = {3, 1, 2, 1, 0, 5};
    assert_int_equal(baton_dp_least(load, 0, 1, 6, 0), 4); /* the minimum wins */
    long tie[4] = {2, 2, 2, 2};
    /* equal loads: the candidate at turn % count first, so ties rotate */
    for (unsigned t = 0; t < 8; t++)
        assert_int_equal(baton_dp_least(tie, 0, 1, 4, t), (int)(t % 4));
    long two[4] = {1, 0, 1, 0};
    assert_int_equal(baton_dp_least(two, 0, 1, 4, 0), 1);
    assert_int_equal(baton_dp_least(two, 0, 1, 4, 2), 3); /* tie between 1 and 3 rotates */
    /* candidates 1, 3, 5 only (a decode's ranks compatible with a prefill rank) */
    assert_int_equal(baton_dp_least(load, 1, 2, 3, 0), 1);
    long odd[6] = {0, 4, 0, 2, 0, 9};
    assert_int_equal(baton_dp_least(odd, 1, 2, 3, 0), 3);
}

static void test_counts_and_release(void **state)
{
    (void)state;
    baton_worker_t *p = add("http://10.0.0.1:1", BATON_ROLE_PREFILL, 4);
    baton_worker_t *d = add("http://10.0.0.2:1", BATON_ROLE_DECODE, 0);
    int held[8], rd;
    /* four requests in flight: one on each rank, whatever the order */
    int seen = 0;
    for (int i = 0; i < 4; i++) {
        baton_dp_pick_pair(p, d, 0, &held[i], &rd);
        assert_int_equal(rd, 0);
        seen |= 1 << held[i];
    }
    assert_int_equal(seen, 0xF);
    for (int r = 0; r < 4; r++)
        assert_int_equal(baton_dp_in_flight(p, r), 1);
    /* rank 2's request ends: the next two go there and then spread again */
    baton_dp_release(p, 2);
    assert_int_equal(baton_dp_in_flight(p, 2), 0);
    baton_dp_pick_pair(p, d, 0, &held[4], &rd);
    assert_int_equal(held[4], 2);
    /* a long request keeps rank 0 busy: every later short one avoids it */
    for (int r = 1; r < 4; r++)
        baton_dp_release(p, r);
    for (int i = 0; i < 6; i++) {
        int r = baton_dp_pick(p, 0);
        assert_int_not_equal(r, 0);
        baton_dp_release(p, r);
    }
    baton_dp_release(p, 0);
    for (int r = 0; r < 4; r++)
        assert_int_equal(baton_dp_in_flight(p, r), 0);
    /* a non-DP worker counts nothing and always has rank 0 */
    assert_int_equal(baton_dp_pick(d, 0), 0);
    assert_int_equal(baton_dp_in_flight(d, 0), 0);
    baton_dp_release(d, 0);
    baton_worker_unref(p);
    baton_worker_unref(d);
}

static void test_decode_compatible(void **state)
{
    (void)state;
    baton_worker_t *p = add("http://10.0.0.3:1", BATON_ROLE_PREFILL, 4);
    baton_worker_t *d = add("http://10.0.0.4:1", BATON_ROLE_DECODE, 6);
    /* gcd(4, 6) = 2: the decode rank has the prefill rank's parity; load spreads over them */
    int cnt[6] = {0};
    for (int i = 0; i < 24; i++) {
        int rp, rd;
        baton_dp_pick_pair(p, d, 0, &rp, &rd);
        assert_int_equal(rd % 2, rp % 2);
        cnt[rd]++;
    }
    for (int r = 0; r < 6; r++) {
        assert_int_equal(cnt[r], 4); /* everything still in flight: perfectly balanced */
        assert_int_equal(baton_dp_in_flight(d, r), 4);
    }
    for (int r = 0; r < 4; r++)
        assert_int_equal(baton_dp_in_flight(p, r), 6);
    baton_worker_unref(p);
    baton_worker_unref(d);
}

static void test_round_robin(void **state)
{
    (void)state;
    baton_worker_t *p = add("http://10.0.0.5:1", BATON_ROLE_PREFILL, 3);
    baton_worker_t *d = add("http://10.0.0.6:1", BATON_ROLE_DECODE, 2);
    /* round robin ignores the load: rank 0 busy or not, the ranks go 0, 1, 2, 0, ... */
    for (int i = 0; i < 6; i++) {
        int rp, rd;
        baton_dp_pick_pair(p, d, 1, &rp, &rd);
        assert_int_equal(rp, i % 3);
        assert_int_equal(rd, i % 2); /* gcd 1: every decode rank fits, in turn */
    }
    assert_int_equal(baton_dp_in_flight(p, 0), 2); /* counted all the same */
    baton_worker_unref(p);
    baton_worker_unref(d);
}

static void test_mooncake_registration(void **state)
{
    (void)state;
    baton_worker_spec_t s;
    baton_worker_spec_init(&s);
    s.url = "http://10.0.0.7:1";
    s.role = BATON_ROLE_PREFILL;
    s.pd_protocol = BATON_PD_VLLM_MOONCAKE;
    s.engine_id = "eng";
    s.bootstrap_addr = "http://10.0.0.7:8998";
    s.dp_size = 2;
    baton_worker_t *w = NULL;
    assert_int_equal(baton_registry_add(reg, &s, &w, NULL, 0), 0);
    assert_int_equal(w->dp_size, 2);
    baton_worker_unref(w);
    /* a Mooncake decode or a NIXL worker takes no rank from the router */
    char err[160];
    s.url = "http://10.0.0.8:1";
    s.role = BATON_ROLE_DECODE;
    s.engine_id = s.bootstrap_addr = NULL;
    assert_int_equal(baton_registry_add(reg, &s, NULL, err, sizeof(err)), BATON_EINVAL);
    s.role = BATON_ROLE_PREFILL;
    s.pd_protocol = BATON_PD_VLLM_NIXL;
    assert_int_equal(baton_registry_add(reg, &s, NULL, err, sizeof(err)), BATON_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_least_pure),
        cmocka_unit_test_setup_teardown(test_counts_and_release, setup, teardown),
        cmocka_unit_test_setup_teardown(test_decode_compatible, setup, teardown),
        cmocka_unit_test_setup_teardown(test_round_robin, setup, teardown),
        cmocka_unit_test_setup_teardown(test_mooncake_registration, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
