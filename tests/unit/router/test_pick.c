/* test_pick.c — worker selection: eligibility, per-worker caps (also under concurrent picks),
 * avoiding failed workers with fallback, half-open breakers admitting one probe. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>

#include "baton/error.h"
#include "router/control/worker_health.h"
#include "router/dataplane/pick.h"

static baton_registry_t *reg;
static baton_policy_t *rr;
static baton_worker_t *ws[3];

static int setup(void **state)
{
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(baton_policy_create(&rr, BATON_POLICY_ROUND_ROBIN), 0);
    for (int i = 0; i < 3; i++) {
        char u[64];
        snprintf(u, sizeof(u), "http://10.0.0.%d:8000", i + 1);
        baton_worker_spec_t s;
        baton_worker_spec_init(&s);
        s.url = u;
        s.role = BATON_ROLE_DECODE;
        assert_int_equal(baton_registry_add(reg, &s, &ws[i], NULL, 0), 0);
    }
    return 0;
}

static int teardown(void **state)
{
    baton_workers_unref(ws, 3);
    baton_registry_destroy(reg);
    baton_policy_destroy(rr);
    return 0;
}

static baton_worker_t *pick_ok(baton_whealth_t *h, unsigned cap, baton_worker_t *const *avoid,
                               size_t n_avoid, baton_pick_t *p)
{
    assert_int_equal(baton_pick(reg, rr, h, cap, BATON_ROLE_DECODE, avoid, n_avoid, p),
                     BATON_PICK_OK);
    assert_non_null(p->w);
    return p->w;
}

static void test_none_and_roles(void **state)
{
    baton_pick_t p;
    assert_int_equal(baton_pick(reg, rr, NULL, 0, BATON_ROLE_PREFILL, NULL, 0, &p),
                     BATON_PICK_NONE);
    assert_null(p.w);
    pick_ok(NULL, 0, NULL, 0, &p);
    assert_int_equal(p.w->role, BATON_ROLE_DECODE);
    assert_int_equal(baton_worker_in_flight(p.w), 1); /* reserved at once */
    baton_worker_t *w = p.w;
    baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL);
    assert_null(p.w);
    assert_int_equal(baton_worker_in_flight(w), 0);
    baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL); /* no-op */
}

static void test_caps(void **state)
{
    baton_pick_t p[4];
    for (int i = 0; i < 3; i++)
        pick_ok(NULL, 1, NULL, 0, &p[i]);
    /* three distinct workers, each at its cap of one */
    assert_true(p[0].w != p[1].w && p[1].w != p[2].w && p[0].w != p[2].w);
    assert_int_equal(baton_pick(reg, rr, NULL, 1, BATON_ROLE_DECODE, NULL, 0, &p[3]),
                     BATON_PICK_CAPPED);
    /* no cap: still picked */
    pick_ok(NULL, 0, NULL, 0, &p[3]);
    assert_int_equal(baton_worker_in_flight(p[3].w), 2);
    baton_worker_t *freed = p[1].w;
    baton_pick_release(NULL, &p[3], BATON_OUTCOME_NEUTRAL);
    baton_pick_release(NULL, &p[1], BATON_OUTCOME_NEUTRAL);
    assert_ptr_equal(pick_ok(NULL, 1, NULL, 0, &p[1]), freed); /* the only one with room */
    for (int i = 0; i < 3; i++)
        baton_pick_release(NULL, &p[i], BATON_OUTCOME_NEUTRAL);
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_worker_in_flight(ws[i]), 0);
}

static void test_avoid(void **state)
{
    baton_pick_t p;
    baton_worker_t *avoid[2] = {ws[0], ws[1]};
    for (int i = 0; i < 6; i++) {
        assert_ptr_equal(pick_ok(NULL, 0, avoid, 2, &p), ws[2]);
        baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL);
    }
    /* everything avoided: one of them rather than none */
    baton_worker_t *all[3] = {ws[0], ws[1], ws[2]};
    pick_ok(NULL, 0, all, 3, &p);
    baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL);
    /* the fresh one at its cap: an avoided one with room is taken */
    baton_pick_t hold;
    assert_ptr_equal(pick_ok(NULL, 1, avoid, 2, &hold), ws[2]);
    baton_worker_t *got = pick_ok(NULL, 1, avoid, 2, &p);
    assert_true(got == ws[0] || got == ws[1]);
    baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL);
    baton_pick_release(NULL, &hold, BATON_OUTCOME_NEUTRAL);
}

static void test_ineligible(void **state)
{
    baton_pick_t p;
    baton_registry_set_health(reg, ws[2], BATON_HEALTH_UNHEALTHY);
    baton_registry_set_draining(reg, ws[1], 1);
    for (int i = 0; i < 5; i++) {
        assert_ptr_equal(pick_ok(NULL, 0, NULL, 0, &p), ws[0]);
        baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL);
    }
    baton_registry_set_breaker(reg, ws[0], BATON_BREAKER_OPEN);
    /* nothing eligible is NONE, not CAPPED: waiting would not help */
    assert_int_equal(baton_pick(reg, rr, NULL, 1, BATON_ROLE_DECODE, NULL, 0, &p), BATON_PICK_NONE);
    baton_registry_set_breaker(reg, ws[0], BATON_BREAKER_CLOSED);
    baton_registry_set_draining(reg, ws[1], 0);
    baton_registry_set_health(reg, ws[2], BATON_HEALTH_HEALTHY);
}

static uint64_t fake_now;
static uint64_t fake_clock(void *ctx)
{
    return fake_now;
}

static void test_half_open_probe(void **state)
{
    baton_whealth_config_t cfg;
    baton_whealth_config_init(&cfg);
    cfg.check.enabled = 0;
    cfg.breaker.failure_threshold = 1;
    cfg.breaker.cooldown_base_ms = 100;
    cfg.breaker.cooldown_max_ms = 100;
    cfg.breaker.jitter = 0;
    cfg.clock_ms = fake_clock;
    fake_now = 1000;
    baton_whealth_t *h;
    assert_int_equal(baton_whealth_create(&h, reg, &cfg), 0);
    baton_whealth_sync(h);
    /* only ws[0] stays eligible: it is the one under test */
    baton_registry_set_draining(reg, ws[1], 1);
    baton_registry_set_draining(reg, ws[2], 1);

    baton_pick_t p, q;
    pick_ok(h, 0, NULL, 0, &p);
    assert_ptr_equal(p.w, ws[0]);
    assert_true(p.ticket != 0);
    baton_pick_release(h, &p, BATON_OUTCOME_FAILURE); /* one failure opens it */
    assert_int_equal(baton_worker_breaker(ws[0]), BATON_BREAKER_OPEN);
    assert_int_equal(baton_pick(reg, rr, h, 0, BATON_ROLE_DECODE, NULL, 0, &p), BATON_PICK_NONE);
    fake_now += 150;
    baton_whealth_sync(h); /* cool-down over: half-open */
    assert_int_equal(baton_worker_breaker(ws[0]), BATON_BREAKER_HALF_OPEN);
    pick_ok(h, 0, NULL, 0, &p); /* the probe */
    assert_int_equal(baton_pick(reg, rr, h, 0, BATON_ROLE_DECODE, NULL, 0, &q), BATON_PICK_NONE);
    assert_int_equal(baton_worker_in_flight(ws[0]), 1); /* the refused pick reserved nothing */
    baton_pick_release(h, &p, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_worker_breaker(ws[0]), BATON_BREAKER_CLOSED);
    pick_ok(h, 0, NULL, 0, &p);
    pick_ok(h, 0, NULL, 0, &q); /* closed: no probe limit */
    baton_pick_release(h, &p, BATON_OUTCOME_SUCCESS);
    baton_pick_release(h, &q, BATON_OUTCOME_SUCCESS);
    baton_registry_set_draining(reg, ws[1], 0);
    baton_registry_set_draining(reg, ws[2], 0);
    baton_whealth_destroy(h);
}

#define THREADS 4
#define ROUNDS  20000

static atomic_int over_cap;

static void *hammer(void *arg)
{
    for (int i = 0; i < ROUNDS; i++) {
        baton_pick_t p;
        if (baton_pick(reg, rr, NULL, 2, BATON_ROLE_DECODE, NULL, 0, &p) != BATON_PICK_OK)
            continue;
        if (baton_worker_in_flight(p.w) > 2)
            atomic_fetch_add(&over_cap, 1);
        baton_pick_release(NULL, &p, BATON_OUTCOME_NEUTRAL);
    }
    return NULL;
}

static void test_concurrent_caps(void **state)
{
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        assert_int_equal(pthread_create(&th[i], NULL, hammer, NULL), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&over_cap), 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_worker_in_flight(ws[i]), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_none_and_roles),  cmocka_unit_test(test_caps),
        cmocka_unit_test(test_avoid),           cmocka_unit_test(test_ineligible),
        cmocka_unit_test(test_half_open_probe), cmocka_unit_test(test_concurrent_caps),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
