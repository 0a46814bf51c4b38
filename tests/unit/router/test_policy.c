/* test_policy.c — round_robin, random, power_of_two and the RNG helpers. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "baton/error.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"
#include "registry_fixture.h"

static int setup(void **state)
{
    static fixture_t f;
    if (fixture_fill(&f, 7000, BATON_ROLE_DECODE) != 0)
        return -1;
    *state = &f;
    return 0;
}

static int index_of(fixture_t *f, baton_worker_t *w)
{
    for (int i = 0; i < N; i++)
        if (f->w[i] == w)
            return i;
    return -1;
}

static void test_names(void **state)
{
    baton_policy_kind_t k;
    assert_int_equal(baton_policy_parse("round_robin", &k), 0);
    assert_int_equal(k, BATON_POLICY_ROUND_ROBIN);
    assert_int_equal(baton_policy_parse("random", &k), 0);
    assert_int_equal(k, BATON_POLICY_RANDOM);
    assert_int_equal(baton_policy_parse("power_of_two", &k), 0);
    assert_int_equal(k, BATON_POLICY_POWER_OF_TWO);
    /* the load- and cache-aware ones */
    assert_int_equal(baton_policy_parse("least_load", &k), 0);
    assert_int_equal(k, BATON_POLICY_LEAST_LOAD);
    assert_int_equal(baton_policy_parse("consistent_hash", &k), 0);
    assert_int_equal(k, BATON_POLICY_CONSISTENT_HASH);
    assert_int_equal(baton_policy_parse("cache_aware", &k), 0);
    assert_int_equal(k, BATON_POLICY_CACHE_AWARE);
    assert_int_equal(baton_policy_parse("cache-aware", &k), BATON_EINVAL);
    assert_int_equal(baton_policy_parse("", &k), BATON_EINVAL);
    assert_string_equal(baton_policy_name(BATON_POLICY_POWER_OF_TWO), "power_of_two");
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, (baton_policy_kind_t)9), BATON_EINVAL);
}

static void test_round_robin_order(void **state)
{
    fixture_t *f = *state;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_ROUND_ROBIN), 0);
    int first = index_of(f, baton_policy_select(p, f->w, N));
    assert_true(first >= 0);
    for (int i = 1; i < 3 * N; i++)
        assert_int_equal(index_of(f, baton_policy_select(p, f->w, N)), (first + i) % N);
    /* pick goes through the registry: each worker once per cycle */
    int seen[N] = {0};
    for (int i = 0; i < N; i++) {
        baton_worker_t *w = baton_policy_pick(p, f->reg, BATON_ROLE_DECODE);
        assert_non_null(w);
        seen[index_of(f, w)]++;
        baton_worker_unref(w);
    }
    for (int i = 0; i < N; i++)
        assert_int_equal(seen[i], 1);
    baton_policy_destroy(p);
}

static void test_empty_and_single(void **state)
{
    fixture_t *f = *state;
    for (int k = 0; k < 3; k++) {
        baton_policy_t *p;
        assert_int_equal(baton_policy_create(&p, (baton_policy_kind_t)k), 0);
        assert_null(baton_policy_select(p, f->w, 0));
        assert_null(baton_policy_pick(p, f->reg, BATON_ROLE_PREFILL)); /* no prefill workers */
        for (int i = 0; i < 5; i++)
            assert_ptr_equal(baton_policy_select(p, f->w, 1), f->w[0]);
        baton_policy_destroy(p);
    }
}

static void test_random_covers_all(void **state)
{
    fixture_t *f = *state;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_RANDOM), 0);
    int seen[N] = {0};
    for (int i = 0; i < 4000; i++)
        seen[index_of(f, baton_policy_select(p, f->w, N))]++;
    for (int i = 0; i < N; i++)
        assert_true(seen[i] > 500); /* expected 1000 each; 500 is many sigmas away */
    baton_policy_destroy(p);
}

static void test_power_of_two_prefers_less_loaded(void **state)
{
    fixture_t *f = *state;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_POWER_OF_TWO), 0);
    /* w[0] idle, the others busy: w[0] wins whenever it is one of the two draws */
    for (int i = 1; i < N; i++)
        for (int k = 0; k < 5 * i; k++)
            baton_worker_in_flight_inc(f->w[i]);
    int seen[N] = {0};
    for (int i = 0; i < 3000; i++)
        seen[index_of(f, baton_policy_select(p, f->w, N))]++;
    /* P(w0 among 2 of 4) = 1/2; w3 (the most loaded) can never win */
    assert_true(seen[0] > 1200);
    assert_int_equal(seen[3], 0);
    assert_true(seen[0] > seen[1] && seen[1] > seen[2]);
    /* two candidates: the less loaded one always wins */
    baton_worker_t *two[2] = {f->w[2], f->w[1]};
    for (int i = 0; i < 50; i++)
        assert_ptr_equal(baton_policy_select(p, two, 2), f->w[1]);
    /* equal load: ties are broken at random, so both win sometimes */
    baton_worker_t *tie[2] = {f->w[0], f->w[0]};
    tie[1] = f->w[1];
    for (int k = 0; k < 5; k++)
        baton_worker_in_flight_inc(f->w[0]); /* now 5 == 5 */
    int wins0 = 0;
    for (int i = 0; i < 400; i++)
        wins0 += baton_policy_select(p, tie, 2) == f->w[0];
    assert_true(wins0 > 100 && wins0 < 300);
    for (int k = 0; k < 5; k++)
        baton_worker_in_flight_dec(f->w[0]);
    for (int i = 1; i < N; i++)
        for (int k = 0; k < 5 * i; k++)
            baton_worker_in_flight_dec(f->w[i]);
    baton_policy_destroy(p);
}

static void test_pick_skips_ineligible(void **state)
{
    fixture_t *f = *state;
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_RANDOM), 0);
    baton_registry_set_health(f->reg, f->w[0], BATON_HEALTH_UNHEALTHY);
    baton_registry_set_breaker(f->reg, f->w[1], BATON_BREAKER_OPEN);
    baton_registry_set_draining(f->reg, f->w[2], 1);
    for (int i = 0; i < 50; i++) {
        baton_worker_t *w = baton_policy_pick(p, f->reg, BATON_ROLE_DECODE);
        assert_ptr_equal(w, f->w[3]);
        baton_worker_unref(w);
    }
    baton_registry_set_health(f->reg, f->w[3], BATON_HEALTH_UNHEALTHY);
    assert_null(baton_policy_pick(p, f->reg, BATON_ROLE_DECODE));
    baton_registry_set_health(f->reg, f->w[0], BATON_HEALTH_HEALTHY);
    baton_registry_set_health(f->reg, f->w[3], BATON_HEALTH_HEALTHY);
    baton_registry_set_breaker(f->reg, f->w[1], BATON_BREAKER_CLOSED);
    baton_registry_set_draining(f->reg, f->w[2], 0);
    baton_policy_destroy(p);
}

static void test_pick_large_fleet(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    for (int i = 0; i < 100; i++) { /* more than pick's on-stack array */
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 20000 + i);
        baton_worker_spec_t spec;
        baton_worker_spec_init(&spec);
        spec.url = url;
        assert_int_equal(baton_registry_add(reg, &spec, NULL, NULL, 0), 0);
    }
    baton_policy_t *p;
    assert_int_equal(baton_policy_create(&p, BATON_POLICY_ROUND_ROBIN), 0);
    for (int i = 0; i < 100; i++) {
        baton_worker_t *w = baton_policy_pick(p, reg, BATON_ROLE_REGULAR);
        assert_non_null(w);
        assert_int_equal(w->parsed.port, 20000 + i);
        baton_worker_unref(w);
    }
    baton_policy_destroy(p);
    baton_registry_destroy(reg);
}

static void test_rng(void **state)
{
    /* rooms stay in [0, 2^63-1] and use the high bits */
    uint64_t or_all = 0;
    for (int i = 0; i < 2000; i++) {
        uint64_t r = baton_bootstrap_room();
        assert_true(r <= INT64_MAX);
        or_all |= r;
    }
    assert_true(or_all == (uint64_t)INT64_MAX);
    /* distinct draws */
    uint64_t a = baton_rand_u64(), b = baton_rand_u64();
    assert_true(a != b);
    assert_int_equal(baton_rand_below(0), 0);
    assert_int_equal(baton_rand_below(1), 0);
    int hits[3] = {0};
    for (int i = 0; i < 3000; i++) {
        uint64_t r = baton_rand_below(3);
        assert_true(r < 3);
        hits[r]++;
    }
    for (int i = 0; i < 3; i++)
        assert_true(hits[i] > 700);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test_setup_teardown(test_round_robin_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_and_single, setup, teardown),
        cmocka_unit_test_setup_teardown(test_random_covers_all, setup, teardown),
        cmocka_unit_test_setup_teardown(test_power_of_two_prefers_less_loaded, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pick_skips_ineligible, setup, teardown),
        cmocka_unit_test(test_pick_large_fleet),
        cmocka_unit_test(test_rng),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
