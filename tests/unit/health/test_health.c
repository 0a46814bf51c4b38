/* test_health.c — back-off, heartbeat and peer state machine tests on a fake clock. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "health/backoff.h"
#include "health/heartbeat.h"
#include "health/peer_state.h"

static void test_backoff_grows_caps_and_jitters(void **state)
{
    baton_backoff_t b;
    baton_backoff_init(&b, 50, 2000, 42);
    uint32_t prev_cap = 50;
    for (int i = 0; i < 20; i++) {
        uint32_t cap = 50u << (i < 6 ? i : 6);
        if (cap > 2000)
            cap = 2000;
        uint32_t d = baton_backoff_next(&b);
        assert_true(d >= 50);
        assert_true(d >= cap / 2);
        assert_true(d <= cap);
        assert_true(cap >= prev_cap);
        prev_cap = cap;
    }
    /* Saturated: always within [max/2, max] — retried forever, never black-listed. */
    for (int i = 0; i < 1000; i++) {
        uint32_t d = baton_backoff_next(&b);
        assert_true(d >= 1000 && d <= 2000);
    }
    baton_backoff_reset(&b);
    uint32_t d = baton_backoff_next(&b);
    assert_true(d >= 50 && d <= 50);
}

static void test_backoff_jitter_spreads(void **state)
{
    /* Two peers failing at the same moment should not retry in lock-step. */
    baton_backoff_t a, b;
    baton_backoff_init(&a, 100, 10000, 1);
    baton_backoff_init(&b, 100, 10000, 2);
    int differ = 0;
    for (int i = 0; i < 10; i++)
        differ += baton_backoff_next(&a) != baton_backoff_next(&b);
    assert_true(differ >= 5);
}

static void test_backoff_clamps_bad_config(void **state)
{
    baton_backoff_t b;
    baton_backoff_init(&b, 0, 0, 0);
    for (int i = 0; i < 100; i++)
        assert_int_equal(baton_backoff_next(&b), 1);
    baton_backoff_init(&b, 10, UINT32_MAX, 7);
    for (int i = 0; i < 200; i++) {
        uint32_t d = baton_backoff_next(&b);
        assert_true(d >= 10);
    }
}

/* The shared arithmetic behind reconnects, retries and breaker cool-downs. */
static void test_backoff_cap_and_jitter(void **state)
{
    /* cap: base * 2^n, capped, saturating; base 0 stays 0 even for huge n */
    assert_int_equal(baton_backoff_cap(100, 1000, 0), 100);
    assert_int_equal(baton_backoff_cap(100, 1000, 3), 800);
    assert_int_equal(baton_backoff_cap(100, 1000, 4), 1000);
    assert_int_equal(baton_backoff_cap(100, 1000, 4000000000u), 1000);
    assert_int_equal(baton_backoff_cap(0, 1000, 4000000000u), 0);
    assert_int_equal(baton_backoff_cap(2000, 1000, 0), 1000);
    assert_true(baton_backoff_cap(UINT64_MAX / 4, UINT64_MAX, 9) == UINT64_MAX);

    /* jitter 0: the cap itself, whatever the random bits */
    assert_int_equal(baton_backoff_jitter(700, 0, 12345), 700);
    /* equal jitter on an odd cap: [floor(75/2), 75], both ends reached */
    uint64_t lo = UINT64_MAX, hi = 0;
    for (uint64_t r = 0; r < 1000; r++) {
        uint64_t d = baton_backoff_jitter(75, BATON_BACKOFF_EQUAL_JITTER, r);
        assert_true(d >= 37 && d <= 75);
        lo = d < lo ? d : lo;
        hi = d > hi ? d : hi;
    }
    assert_int_equal(lo, 37);
    assert_int_equal(hi, 75);
    /* a fraction: 0.2 of 1000 -> [800, 1000]; 1 -> [0, cap] */
    lo = UINT64_MAX;
    for (uint64_t r = 0; r < 1000; r++) {
        uint64_t d = baton_backoff_jitter(1000, 0.2, r);
        assert_true(d >= 800 && d <= 1000);
        lo = d < lo ? d : lo;
    }
    assert_int_equal(lo, 800);
    assert_int_equal(baton_backoff_jitter(10, 1.0, 0), 0);
    assert_int_equal(baton_backoff_jitter(10, 7.0, 10), 10); /* clamped to 1 */
    /* huge caps neither overflow nor leave the range */
    assert_true(baton_backoff_jitter(UINT64_MAX, BATON_BACKOFF_EQUAL_JITTER, 99) >= UINT64_MAX / 2);
    assert_true(baton_backoff_jitter(UINT64_MAX, 1.0, UINT64_MAX) == UINT64_MAX);
}

static void test_heartbeat(void **state)
{
    baton_heartbeat_t hb;
    baton_heartbeat_init(&hb, 250, 4, 1000);
    assert_int_equal(baton_heartbeat_window_ms(&hb), 1000);
    assert_false(baton_heartbeat_due(&hb, 1249));
    assert_true(baton_heartbeat_due(&hb, 1250));
    baton_heartbeat_tx(&hb, 1250);
    assert_false(baton_heartbeat_due(&hb, 1400));
    assert_false(baton_heartbeat_expired(&hb, 2000));
    assert_true(baton_heartbeat_expired(&hb, 2001));
    baton_heartbeat_rx(&hb, 1900);
    assert_false(baton_heartbeat_expired(&hb, 2900));
    assert_true(baton_heartbeat_expired(&hb, 2901));
    /* A clock stepping back never moves last_rx backwards. */
    baton_heartbeat_rx(&hb, 10);
    assert_false(baton_heartbeat_expired(&hb, 2900));
}

static void test_peer_connect_up_down_reconnect(void **state)
{
    baton_peer_health_t h;
    uint64_t now = 5000;
    baton_peer_health_init(&h, 50, 2000, 1000, 0, 99, now);
    assert_int_equal(h.state, BATON_PEER_IDLE);
    assert_int_equal(baton_peer_health_tick(&h, now), 0);
    assert_int_equal(baton_peer_health_demand(&h, now), BATON_PEER_ACT_CONNECT);
    baton_peer_health_connecting(&h, now);
    assert_int_equal(baton_peer_health_demand(&h, now), 0);
    assert_int_equal(baton_peer_health_tick(&h, now + 999), 0);
    baton_peer_health_up(&h, now + 10);
    assert_int_equal(h.state, BATON_PEER_UP);
    assert_int_equal(h.reconnects, 0);
    assert_int_equal(baton_peer_health_tick(&h, now + 100000), 0);

    now += 20000;
    uint32_t d = baton_peer_health_down(&h, now, -1);
    assert_int_equal(h.state, BATON_PEER_DOWN);
    assert_true(d >= 50 && d <= 50);
    assert_int_equal(baton_peer_health_down(&h, now, -2), 0); /* exactly once */
    assert_int_equal(h.last_error, -1);
    assert_int_equal(baton_peer_health_tick(&h, now + d - 1), 0);
    assert_int_equal(baton_peer_health_tick(&h, now + d), BATON_PEER_ACT_CONNECT);

    /* Attempts keep failing: delays grow, then stay capped; attempts never stop. */
    uint32_t last = 0;
    for (int i = 0; i < 30; i++) {
        baton_peer_health_connecting(&h, now);
        assert_int_equal(baton_peer_health_tick(&h, now + 1000), BATON_PEER_ACT_TIMEOUT);
        now += 1000;
        d = baton_peer_health_down(&h, now, -3);
        assert_true(d <= 2000);
        if (i > 10)
            assert_true(d >= 1000);
        last = d;
        assert_int_equal(baton_peer_health_tick(&h, now + d), BATON_PEER_ACT_CONNECT);
        now += d;
    }
    (void)last;
    assert_int_equal(h.failures, 31);
    baton_peer_health_connecting(&h, now);
    baton_peer_health_up(&h, now + 1);
    assert_int_equal(h.reconnects, 1);
    assert_int_equal(h.failures, 0);
    /* Back-off was reset by the success. */
    d = baton_peer_health_down(&h, now + 2, -4);
    assert_int_equal(d, 50);
}

static void test_peer_idles_without_demand_and_wakes_on_demand(void **state)
{
    baton_peer_health_t h;
    uint64_t now = 0;
    baton_peer_health_init(&h, 10, 100, 500, 1000, 5, now);
    baton_peer_health_demand(&h, now);
    baton_peer_health_connecting(&h, now);
    baton_peer_health_up(&h, now + 1);
    uint32_t d = baton_peer_health_down(&h, now + 2, -1);
    now += 2 + d;
    assert_int_equal(baton_peer_health_tick(&h, now), BATON_PEER_ACT_CONNECT);
    baton_peer_health_connecting(&h, now);
    now += 500;
    assert_int_equal(baton_peer_health_tick(&h, now), BATON_PEER_ACT_TIMEOUT);
    d = baton_peer_health_down(&h, now, -1);
    now += d + 1000; /* no demand for over idle_after_ms */
    assert_int_equal(baton_peer_health_tick(&h, now), 0);
    assert_int_equal(h.state, BATON_PEER_IDLE);
    assert_int_equal(baton_peer_health_tick(&h, now + 100000), 0);
    assert_int_equal(baton_peer_health_demand(&h, now + 100000), BATON_PEER_ACT_CONNECT);
    assert_string_equal(baton_peer_state_name(BATON_PEER_IDLE), "idle");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_backoff_grows_caps_and_jitters),
        cmocka_unit_test(test_backoff_jitter_spreads),
        cmocka_unit_test(test_backoff_clamps_bad_config),
        cmocka_unit_test(test_backoff_cap_and_jitter),
        cmocka_unit_test(test_heartbeat),
        cmocka_unit_test(test_peer_connect_up_down_reconnect),
        cmocka_unit_test(test_peer_idles_without_demand_and_wakes_on_demand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
