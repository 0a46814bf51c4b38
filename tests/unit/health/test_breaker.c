/* test_breaker.c — the circuit breaker state machine on a fake clock: every transition, the
 * single half-open probe, neutral 4xx, stale tickets, cool-down growth/cap/jitter, threads. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdatomic.h>
#include <string.h>

#include "baton/error.h"
#include "common/rand.h"
#include "health/breaker.h"

/* ---- a recorder for on_change ---- */

#define MAX_CHANGES 64

typedef struct {
    int n;
    baton_breaker_state_t from[MAX_CHANGES], to[MAX_CHANGES];
    const char *reason[MAX_CHANGES];
} changes_t;

static void on_change(baton_breaker_t *b, baton_breaker_state_t from, baton_breaker_state_t to,
                      const char *reason, void *ctx)
{
    changes_t *c = ctx;
    if (c->n < MAX_CHANGES) {
        c->from[c->n] = from;
        c->to[c->n] = to;
        c->reason[c->n] = reason;
    }
    c->n++;
}

static baton_breaker_config_t cfg_nojitter(void)
{
    baton_breaker_config_t cfg;
    baton_breaker_config_init(&cfg);
    cfg.jitter = 0;
    return cfg;
}

/* Records n failures, each with a fresh ticket. */
static void fail_n(baton_breaker_t *b, uint64_t now, int n)
{
    for (int i = 0; i < n; i++) {
        baton_breaker_ticket_t t = baton_breaker_allow(b, now);
        assert_true(t != 0);
        baton_breaker_record(b, now, t, BATON_OUTCOME_FAILURE);
    }
}

static void test_defaults(void **state)
{
    baton_breaker_config_t cfg;
    baton_breaker_config_init(&cfg);
    assert_int_equal(cfg.failure_threshold, 5);
    assert_int_equal(cfg.cooldown_base_ms, 1000);
    assert_int_equal(cfg.cooldown_max_ms, 30000);
    assert_true(cfg.jitter > 0.19 && cfg.jitter < 0.21);
    assert_int_equal(cfg.probe_timeout_ms, 60000);
    assert_string_equal(baton_breaker_outcome_name(BATON_OUTCOME_NEUTRAL), "neutral");
}

static void test_outcome_classification(void **state)
{
    assert_int_equal(baton_breaker_outcome(0, 200), BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_outcome(0, 204), BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_outcome(0, 302), BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_outcome(0, 400), BATON_OUTCOME_NEUTRAL);
    assert_int_equal(baton_breaker_outcome(0, 404), BATON_OUTCOME_NEUTRAL);
    assert_int_equal(baton_breaker_outcome(0, 408), BATON_OUTCOME_NEUTRAL);
    assert_int_equal(baton_breaker_outcome(0, 429), BATON_OUTCOME_NEUTRAL);
    assert_int_equal(baton_breaker_outcome(0, 500), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(0, 503), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(0, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_ECONNECT, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_ETIMEOUT_CONNECT, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_ETIMEOUT_FIRST_BYTE, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_ETIMEOUT_IDLE, 200), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_ETIMEOUT_TOTAL, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_EEOF, 200), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_EUPSTREAM, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(-111 /* ECONNREFUSED */, 0), BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_outcome(BATON_ECANCELED, 0), BATON_OUTCOME_NEUTRAL);
    assert_int_equal(baton_breaker_outcome(BATON_ESHUTDOWN, 0), BATON_OUTCOME_NEUTRAL);
}

static void test_closed_to_open_after_threshold(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    changes_t ch = {0};
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, on_change, &ch, 1), 0);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);

    fail_n(&b, 100, 4);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    assert_int_equal(ch.n, 0);
    fail_n(&b, 100, 1);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_OPEN);
    assert_int_equal(ch.n, 1);
    assert_int_equal(ch.from[0], BATON_BREAKER_CLOSED);
    assert_int_equal(ch.to[0], BATON_BREAKER_OPEN);
    assert_string_equal(ch.reason[0], "consecutive_failures");

    /* Open: nothing admitted before the cool-down ends. */
    assert_int_equal(baton_breaker_allow(&b, 100), 0);
    assert_int_equal(baton_breaker_allow(&b, 1099), 0);
    assert_false(baton_breaker_would_allow(&b, 1099));
    baton_breaker_info_t info;
    baton_breaker_get_info(&b, &info);
    assert_int_equal(info.open_until_ms, 1100);
    assert_int_equal(info.cooldown_ms, 1000);
    assert_int_equal(info.opens, 1);
    baton_breaker_destroy(&b);
}

static void test_success_resets_consecutive_count(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 1), 0);
    for (int round = 0; round < 3; round++) {
        fail_n(&b, 0, 4);
        baton_breaker_ticket_t t = baton_breaker_allow(&b, 0);
        baton_breaker_record(&b, 0, t, BATON_OUTCOME_SUCCESS);
        baton_breaker_info_t info;
        baton_breaker_get_info(&b, &info);
        assert_int_equal(info.failures, 0);
    }
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    baton_breaker_destroy(&b);
}

static void test_4xx_do_not_count(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 1), 0);
    /* Many 4xx in a row never open. */
    for (int i = 0; i < 50; i++) {
        baton_breaker_ticket_t t = baton_breaker_allow(&b, 0);
        assert_true(t != 0);
        baton_breaker_record(&b, 0, t, baton_breaker_outcome(0, 400 + i % 30));
    }
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    /* ...and do not hide failures either: 4 failures, a 404, one failure → open. */
    fail_n(&b, 0, 4);
    baton_breaker_ticket_t t = baton_breaker_allow(&b, 0);
    baton_breaker_record(&b, 0, t, baton_breaker_outcome(0, 404));
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    fail_n(&b, 0, 1);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_OPEN);
    baton_breaker_destroy(&b);
}

static void test_half_open_single_probe_success_closes(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    changes_t ch = {0};
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, on_change, &ch, 1), 0);
    fail_n(&b, 0, 5);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_OPEN);

    assert_true(baton_breaker_would_allow(&b, 1000));
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_OPEN); /* would_allow takes nothing */
    baton_breaker_ticket_t probe = baton_breaker_allow(&b, 1000);
    assert_true(probe != 0);
    assert_true(baton_breaker_ticket_is_probe(probe));
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    assert_int_equal(ch.to[1], BATON_BREAKER_HALF_OPEN);
    assert_string_equal(ch.reason[1], "cooldown_elapsed");

    /* Exactly one probe at a time. */
    for (int i = 0; i < 10; i++)
        assert_int_equal(baton_breaker_allow(&b, 1000 + i), 0);
    assert_false(baton_breaker_would_allow(&b, 1010));

    baton_breaker_record(&b, 1020, probe, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    assert_int_equal(ch.n, 3);
    assert_int_equal(ch.from[2], BATON_BREAKER_HALF_OPEN);
    assert_int_equal(ch.to[2], BATON_BREAKER_CLOSED);
    assert_string_equal(ch.reason[2], "probe_succeeded");
    baton_breaker_ticket_t t = baton_breaker_allow(&b, 1020);
    assert_true(t != 0);
    assert_false(baton_breaker_ticket_is_probe(t));

    /* Closing reset the cool-down level: the next opening waits the base again. */
    fail_n(&b, 2000, 5);
    baton_breaker_info_t info;
    baton_breaker_get_info(&b, &info);
    assert_int_equal(info.opens, 1);
    assert_int_equal(info.cooldown_ms, 1000);
    baton_breaker_destroy(&b);
}

static void test_probe_failure_reopens_with_growth_and_cap(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    cfg.cooldown_base_ms = 100;
    cfg.cooldown_max_ms = 1500;
    changes_t ch = {0};
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, on_change, &ch, 1), 0);
    uint64_t now = 0;
    fail_n(&b, now, 5);
    const uint64_t expect[] = {100, 200, 400, 800, 1500, 1500, 1500};
    for (size_t i = 0; i < sizeof(expect) / sizeof(expect[0]); i++) {
        baton_breaker_info_t info;
        baton_breaker_get_info(&b, &info);
        assert_int_equal(info.state, BATON_BREAKER_OPEN);
        assert_int_equal(info.cooldown_ms, expect[i]);
        assert_int_equal(info.opens, i + 1);
        assert_int_equal(baton_breaker_cooldown_cap(&cfg, (unsigned)i + 1), expect[i]);
        /* Not a millisecond early. */
        assert_int_equal(baton_breaker_allow(&b, now + expect[i] - 1), 0);
        now += expect[i];
        baton_breaker_ticket_t probe = baton_breaker_allow(&b, now);
        assert_true(baton_breaker_ticket_is_probe(probe));
        baton_breaker_record(&b, now, probe, BATON_OUTCOME_FAILURE);
        assert_string_equal(ch.reason[ch.n - 1], "probe_failed");
    }
    /* The cap holds for absurd opening counts too. */
    assert_int_equal(baton_breaker_cooldown_cap(&cfg, 1000), 1500);
    baton_breaker_destroy(&b);
}

static void test_probe_neutral_frees_slot(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 1), 0);
    fail_n(&b, 0, 5);
    baton_breaker_ticket_t p1 = baton_breaker_allow(&b, 1000);
    assert_true(baton_breaker_ticket_is_probe(p1));
    assert_int_equal(baton_breaker_allow(&b, 1000), 0);
    baton_breaker_record(&b, 1001, p1, baton_breaker_outcome(0, 429));
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    baton_breaker_ticket_t p2 = baton_breaker_allow(&b, 1002);
    assert_true(baton_breaker_ticket_is_probe(p2));
    baton_breaker_record(&b, 1003, p2, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    baton_breaker_destroy(&b);
}

static void test_stale_tickets_ignored(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 1), 0);
    /* Admitted while CLOSED, still in flight when the breaker opens. */
    baton_breaker_ticket_t old_ok = baton_breaker_allow(&b, 0);
    baton_breaker_ticket_t old_fail = baton_breaker_allow(&b, 0);
    fail_n(&b, 0, 5);
    baton_breaker_ticket_t probe = baton_breaker_allow(&b, 1000);
    assert_true(baton_breaker_ticket_is_probe(probe));
    /* The late results must not be taken for the probe's. */
    baton_breaker_record(&b, 1001, old_ok, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    assert_int_equal(baton_breaker_allow(&b, 1001), 0); /* the probe is still out */
    baton_breaker_record(&b, 1001, old_fail, BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    /* A zero ticket is never anything. */
    baton_breaker_record(&b, 1001, 0, BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    baton_breaker_record(&b, 1002, probe, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    /* A probe ticket recorded twice: the second is stale. */
    baton_breaker_record(&b, 1003, probe, BATON_OUTCOME_FAILURE);
    baton_breaker_info_t info;
    baton_breaker_get_info(&b, &info);
    assert_int_equal(info.failures, 0);
    baton_breaker_destroy(&b);
}

static void test_silent_probe_given_up(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    cfg.probe_timeout_ms = 500;
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 1), 0);
    fail_n(&b, 0, 5);
    baton_breaker_ticket_t p1 = baton_breaker_allow(&b, 1000);
    assert_true(p1 != 0);
    assert_int_equal(baton_breaker_allow(&b, 1499), 0);
    assert_true(baton_breaker_would_allow(&b, 1500));
    baton_breaker_ticket_t p2 = baton_breaker_allow(&b, 1500);
    assert_true(baton_breaker_ticket_is_probe(p2));
    assert_true(p2 != p1);
    /* The given-up probe's failure arrives late: ignored. */
    baton_breaker_record(&b, 1600, p1, BATON_OUTCOME_FAILURE);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    baton_breaker_record(&b, 1600, p2, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    baton_breaker_destroy(&b);
}

static void test_poll_expire_reset(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    changes_t ch = {0};
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, on_change, &ch, 1), 0);
    assert_int_equal(baton_breaker_poll(&b, 0), BATON_BREAKER_CLOSED);
    fail_n(&b, 0, 5);
    assert_int_equal(baton_breaker_poll(&b, 999), BATON_BREAKER_OPEN);
    assert_int_equal(baton_breaker_poll(&b, 1000), BATON_BREAKER_HALF_OPEN);
    /* poll made it half-open without taking the probe slot. */
    baton_breaker_ticket_t p = baton_breaker_allow(&b, 1000);
    assert_true(baton_breaker_ticket_is_probe(p));
    baton_breaker_record(&b, 1000, p, BATON_OUTCOME_FAILURE); /* open, 2 s */
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_OPEN);

    baton_breaker_expire(&b, 1001);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    assert_string_equal(ch.reason[ch.n - 1], "expired");
    baton_breaker_expire(&b, 1002); /* no effect outside OPEN */
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_HALF_OPEN);
    /* expire kept the opening count: a failing probe waits longer (4 s now). */
    p = baton_breaker_allow(&b, 1002);
    baton_breaker_record(&b, 1002, p, BATON_OUTCOME_FAILURE);
    baton_breaker_info_t info;
    baton_breaker_get_info(&b, &info);
    assert_int_equal(info.cooldown_ms, 4000);

    baton_breaker_reset(&b, 1003);
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    assert_string_equal(ch.reason[ch.n - 1], "reset");
    baton_breaker_get_info(&b, &info);
    assert_int_equal(info.opens, 0);
    assert_int_equal(info.transitions, (uint64_t)ch.n);
    baton_breaker_destroy(&b);
}

static void test_jitter_bounds(void **state)
{
    baton_breaker_config_t cfg;
    baton_breaker_config_init(&cfg);
    cfg.jitter = 0.5;
    cfg.cooldown_base_ms = 1000;
    cfg.cooldown_max_ms = 1000;
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 12345), 0);
    uint64_t now = 0, lo = UINT64_MAX, hi = 0;
    for (int i = 0; i < 200; i++) {
        fail_n(&b, now, 5);
        baton_breaker_info_t info;
        baton_breaker_get_info(&b, &info);
        assert_true(info.cooldown_ms >= 500 && info.cooldown_ms <= 1000);
        lo = info.cooldown_ms < lo ? info.cooldown_ms : lo;
        hi = info.cooldown_ms > hi ? info.cooldown_ms : hi;
        baton_breaker_reset(&b, now);
        now += 10;
    }
    /* Actually jittered: 200 draws spread over most of the range. */
    assert_true(lo < 650);
    assert_true(hi > 850);
    baton_breaker_destroy(&b);
}

static void test_disabled_never_opens(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    cfg.failure_threshold = 0;
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 1), 0);
    for (int i = 0; i < 100; i++) {
        baton_breaker_ticket_t t = baton_breaker_allow(&b, 0);
        assert_true(t != 0);
        baton_breaker_record(&b, 0, t, BATON_OUTCOME_FAILURE);
    }
    assert_int_equal(baton_breaker_state(&b), BATON_BREAKER_CLOSED);
    baton_breaker_destroy(&b);
}

static void test_bad_config_clamped(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    cfg.cooldown_base_ms = 0;
    cfg.cooldown_max_ms = 0;
    cfg.jitter = -3;
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 0), 0);
    fail_n(&b, 0, 5);
    baton_breaker_info_t info;
    baton_breaker_get_info(&b, &info);
    assert_int_equal(info.cooldown_ms, 1);
    assert_true(baton_breaker_allow(&b, 1) != 0);
    baton_breaker_destroy(&b);
}

/* ---- threads: never more than one probe out ---- */

typedef struct {
    baton_breaker_t *b;
    _Atomic uint64_t *clock;
    atomic_int *probes_out;
    atomic_int *violations;
    atomic_int *probes_seen;
    int seed;
} thr_t;

static void *hammer(void *arg)
{
    thr_t *a = arg;
    uint64_t x = (uint64_t)a->seed * 2654435761u + 1;
    for (int i = 0; i < 20000; i++) {
        uint64_t r = baton_xorshift64s(&x);
        uint64_t now = atomic_fetch_add(a->clock, 1);
        baton_breaker_ticket_t t = baton_breaker_allow(a->b, now);
        if (t == 0)
            continue;
        int probe = baton_breaker_ticket_is_probe(t);
        if (probe) {
            atomic_fetch_add(a->probes_seen, 1);
            if (atomic_fetch_add(a->probes_out, 1) != 0)
                atomic_fetch_add(a->violations, 1);
            atomic_fetch_sub(a->probes_out, 1); /* before record: the slot is ours until then */
        }
        baton_breaker_outcome_t o = (r % 3 == 0)   ? BATON_OUTCOME_FAILURE
                                    : (r % 3 == 1) ? BATON_OUTCOME_SUCCESS
                                                   : BATON_OUTCOME_NEUTRAL;
        baton_breaker_record(a->b, now, t, o);
    }
    return NULL;
}

static void test_threads_single_probe(void **state)
{
    baton_breaker_config_t cfg = cfg_nojitter();
    cfg.failure_threshold = 2;
    cfg.cooldown_base_ms = 20;
    cfg.cooldown_max_ms = 50;
    /* The clock is a shared counter, one tick per allow() of any thread: a thread descheduled
     * while it holds the probe sees the others tick past any probe timeout, and the breaker then
     * rightly gives that probe up and admits a new one (test_silent_probe_given_up covers that).
     * Here probes are never given up, so two out at once is always a violation. */
    cfg.probe_timeout_ms = 0;
    baton_breaker_t b = {0};
    assert_int_equal(baton_breaker_init(&b, &cfg, NULL, NULL, 7), 0);
    _Atomic uint64_t clock = 0;
    atomic_int out = 0, viol = 0, seen = 0;
    pthread_t th[4];
    thr_t args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (thr_t){&b, &clock, &out, &viol, &seen, i + 1};
        assert_int_equal(pthread_create(&th[i], NULL, hammer, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    assert_int_equal(atomic_load(&viol), 0);
    assert_true(atomic_load(&seen) > 0); /* the half-open path was exercised */
    baton_breaker_info_t info;
    baton_breaker_get_info(&b, &info);
    assert_true(info.transitions > 3);
    baton_breaker_destroy(&b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_outcome_classification),
        cmocka_unit_test(test_closed_to_open_after_threshold),
        cmocka_unit_test(test_success_resets_consecutive_count),
        cmocka_unit_test(test_4xx_do_not_count),
        cmocka_unit_test(test_half_open_single_probe_success_closes),
        cmocka_unit_test(test_probe_failure_reopens_with_growth_and_cap),
        cmocka_unit_test(test_probe_neutral_frees_slot),
        cmocka_unit_test(test_stale_tickets_ignored),
        cmocka_unit_test(test_silent_probe_given_up),
        cmocka_unit_test(test_poll_expire_reset),
        cmocka_unit_test(test_jitter_bounds),
        cmocka_unit_test(test_disabled_never_opens),
        cmocka_unit_test(test_bad_config_clamped),
        cmocka_unit_test(test_threads_single_probe),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
