/* test_worker_health.c — the rise/fall counter and the worker health table on a fake clock:
 * admission, pick, breaker publishing, the status change function, metrics, removal. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "baton/error.h"
#include "common/buf.h"
#include "common/metrics.h"
#include "router/control/worker_health.h"
#include "router/dataplane/policy.h"
#include "router/control/registry.h"

/* ---- the counter ---- */

static void test_hcounter(void **state)
{
    baton_hcounter_t c;
    baton_hcounter_init(&c, 2, 3); /* 0..4, UP when >= 2 */
    assert_int_equal(c.health, 2);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_UP_CHECKING);
    assert_true(baton_hcounter_is_up(&c));
    assert_true(baton_hcounter_is_changing(&c));

    /* Unconfirmed: one failure takes it down (settled). */
    assert_int_equal(baton_hcounter_update(&c, 0), -1);
    assert_int_equal(c.health, 0);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_DOWN);
    assert_false(baton_hcounter_is_changing(&c));
    assert_int_equal(baton_hcounter_update(&c, 0), 0);
    assert_int_equal(c.health, 0);

    /* rise = 2 successes to come up, and then it is settled at the top. */
    assert_int_equal(baton_hcounter_update(&c, 1), 0);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_DOWN_CHECKING);
    assert_int_equal(baton_hcounter_update(&c, 1), 1);
    assert_int_equal(c.health, 4);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_UP);
    assert_int_equal(baton_hcounter_update(&c, 1), 0);
    assert_int_equal(c.health, 4);

    /* A blip is absorbed both ways. */
    assert_int_equal(baton_hcounter_update(&c, 0), 0);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_UP_CHECKING);
    assert_int_equal(baton_hcounter_update(&c, 1), 0);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_UP);

    /* fall = 3 consecutive failures from settled UP. */
    assert_int_equal(baton_hcounter_update(&c, 0), 0);
    assert_int_equal(baton_hcounter_update(&c, 0), 0);
    assert_true(baton_hcounter_is_up(&c));
    assert_int_equal(baton_hcounter_update(&c, 0), -1);
    assert_false(baton_hcounter_is_up(&c));

    /* Down side blip. */
    assert_int_equal(baton_hcounter_update(&c, 1), 0);
    assert_int_equal(baton_hcounter_update(&c, 0), 0);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_DOWN);

    baton_hcounter_force(&c, 1);
    assert_int_equal(baton_hcounter_state(&c), BATON_WH_UP);
    baton_hcounter_init(&c, 0, 0); /* clamped to 1/1: flips on every result */
    assert_int_equal(baton_hcounter_update(&c, 0), -1);
    assert_int_equal(baton_hcounter_update(&c, 1), 1);
    assert_string_equal(baton_whealth_state_name(BATON_WH_DOWN_CHECKING), "down_checking");
}

/* ---- the table ---- */

static uint64_t fake_now;
static uint64_t fake_clock(void *ctx)
{
    return fake_now;
}

typedef struct {
    baton_registry_t *reg;
    baton_metrics_t *metrics;
    baton_whealth_t *wh;
    baton_policy_t *rr;
    baton_worker_t *w[3]; /* decode workers */
} fx_t;

static int setup(void **state)
{
    static fx_t f;
    memset(&f, 0, sizeof(f));
    fake_now = 1000000;
    if (baton_registry_create(&f.reg) != 0)
        return -1;
    for (int i = 0; i < 3; i++) {
        char url[64];
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 7100 + i);
        baton_worker_spec_t spec;
        baton_worker_spec_init(&spec);
        spec.url = url;
        spec.role = BATON_ROLE_DECODE;
        if (baton_registry_add(f.reg, &spec, &f.w[i], NULL, 0) != 0)
            return -1;
    }
    baton_whealth_config_t cfg;
    baton_whealth_config_init(&cfg);
    cfg.breaker.jitter = 0;
    cfg.clock_ms = fake_clock;
    f.metrics = baton_metrics_create();
    if (f.metrics == NULL || baton_whealth_create(&f.wh, f.reg, &cfg) != 0 ||
        baton_whealth_metrics_init(f.wh, f.metrics) != 0 ||
        baton_policy_create(&f.rr, BATON_POLICY_ROUND_ROBIN) != 0)
        return -1;
    baton_whealth_sync(f.wh);
    *state = &f;
    return 0;
}

static int teardown(void **state)
{
    fx_t *f = *state;
    baton_workers_unref(f->w, 3);
    baton_whealth_destroy(f->wh);
    baton_policy_destroy(f->rr);
    baton_registry_destroy(f->reg);
    baton_metrics_destroy(f->metrics);
    return 0;
}

static int rendered_contains(fx_t *f, const char *needle)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_metrics_render(f->metrics, &b), 0);
    int found = b.data != NULL && strstr(b.data, needle) != NULL;
    baton_buf_free(&b);
    return found;
}

static void fail_worker(fx_t *f, baton_worker_t *w, int n)
{
    for (int i = 0; i < n; i++) {
        baton_whealth_ticket_t t;
        assert_int_equal(baton_whealth_admit(f->wh, w, &t), 1);
        baton_whealth_done(f->wh, w, t, baton_breaker_outcome(BATON_ECONNECT, 0));
    }
}

static void test_defaults_and_sync(void **state)
{
    fx_t *f = *state;
    const baton_whealth_config_t *c = baton_whealth_config(f->wh);
    assert_int_equal(c->check.interval_ms, 2000);
    assert_int_equal(c->check.fast_interval_ms, 500);
    assert_int_equal(c->check.timeout_ms, 1000);
    assert_int_equal(c->check.rise, 2);
    assert_int_equal(c->check.fall, 3);
    assert_string_equal(c->check.path, "/health");
    assert_int_equal(baton_whealth_size(f->wh), 3);
    baton_whealth_info_t info;
    assert_int_equal(baton_whealth_info(f->wh, f->w[0], &info), 0);
    assert_int_equal(info.state, BATON_WH_UP_CHECKING);
    assert_int_equal(info.breaker.state, BATON_BREAKER_CLOSED);

    char line[160];
    snprintf(line, sizeof(line), "baton_worker_health{worker=\"%s\",role=\"decode\"} 1",
             f->w[1]->id);
    assert_true(rendered_contains(f, line));
    snprintf(line, sizeof(line), "baton_worker_breaker_state{worker=\"%s\",role=\"decode\"} 0",
             f->w[1]->id);
    assert_true(rendered_contains(f, line));
    /* A second metrics init is refused. */
    assert_int_equal(baton_whealth_metrics_init(f->wh, f->metrics), BATON_EEXIST);
}

static void test_set_health_is_the_one_switch(void **state)
{
    fx_t *f = *state;
    baton_worker_t *w = f->w[0];
    baton_whealth_ticket_t t;
    assert_int_equal(baton_whealth_admit(f->wh, w, &t), 1);
    baton_whealth_done(f->wh, w, t, BATON_OUTCOME_SUCCESS);

    assert_int_equal(baton_whealth_set_health(f->wh, w, 0, "test: operator"), 0);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_UNHEALTHY);
    assert_int_equal(baton_whealth_admit(f->wh, w, &t), 0);
    assert_int_equal(t, 0);
    char line[160];
    snprintf(line, sizeof(line), "baton_worker_health{worker=\"%s\",role=\"decode\"} 0", w->id);
    assert_true(rendered_contains(f, line));
    snprintf(line, sizeof(line),
             "baton_worker_health_transitions_total{worker=\"%s\",to=\"down\"} 1", w->id);
    assert_true(rendered_contains(f, line));
    /* Not picked while down. */
    for (int i = 0; i < 12; i++) {
        baton_worker_t *p = baton_whealth_pick(f->wh, f->rr, BATON_ROLE_DECODE, &t);
        assert_non_null(p);
        assert_true(p != w);
        assert_true(t != 0);
        baton_whealth_done(f->wh, p, t, BATON_OUTCOME_SUCCESS);
        baton_worker_unref(p);
    }
    /* Same side again: no transition counted. */
    assert_int_equal(baton_whealth_set_health(f->wh, w, 0, "again"), 0);
    baton_whealth_info_t info;
    assert_int_equal(baton_whealth_info(f->wh, w, &info), 0);
    assert_int_equal(info.transitions, 1);
    assert_int_equal(info.state, BATON_WH_DOWN);

    assert_int_equal(baton_whealth_set_health(f->wh, w, 1, "test: back"), 0);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_HEALTHY);
    assert_int_equal(baton_whealth_admit(f->wh, w, &t), 1);
    baton_whealth_done(f->wh, w, t, BATON_OUTCOME_SUCCESS);
    snprintf(line, sizeof(line), "baton_worker_health_transitions_total{worker=\"%s\",to=\"up\"} 1",
             w->id);
    assert_true(rendered_contains(f, line));
}

static void test_check_results_rise_fall(void **state)
{
    fx_t *f = *state;
    baton_worker_t *w = f->w[1];
    /* Confirm first: fall - 1 = 2 passes settle the new worker. */
    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 200, 0), BATON_WH_UP_CHECKING);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 200, 0), BATON_WH_UP);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 0, 500, 0), BATON_WH_UP_CHECKING);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 0, 0, BATON_ETIMEOUT_TOTAL),
                     BATON_WH_UP_CHECKING);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_HEALTHY);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 0, 0, BATON_ECONNECT), BATON_WH_DOWN);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_UNHEALTHY);
    size_t counts[BATON_ROLE_COUNT], elig[BATON_ROLE_COUNT];
    baton_registry_counts(f->reg, counts, elig);
    assert_int_equal(elig[BATON_ROLE_DECODE], 2);

    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 200, 0), BATON_WH_DOWN_CHECKING);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_UNHEALTHY);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 204, 0), BATON_WH_UP);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_HEALTHY);

    baton_whealth_info_t info;
    assert_int_equal(baton_whealth_info(f->wh, w, &info), 0);
    assert_int_equal(info.checks, 7);
    assert_int_equal(info.checks_failed, 3);
    assert_int_equal(info.last_check_status, 204);
    assert_int_equal(info.last_check_ms, fake_now);
    assert_int_equal(info.transitions, 2);
}

static void test_breaker_published_and_skipped(void **state)
{
    fx_t *f = *state;
    baton_worker_t *bad = f->w[2];
    fail_worker(f, bad, 4);
    assert_int_equal(baton_worker_breaker(bad), BATON_BREAKER_CLOSED);
    fail_worker(f, bad, 1);
    assert_int_equal(baton_worker_breaker(bad), BATON_BREAKER_OPEN);
    assert_false(baton_worker_is_eligible(bad));
    char line[160];
    snprintf(line, sizeof(line), "baton_worker_breaker_state{worker=\"%s\",role=\"decode\"} 1",
             bad->id);
    assert_true(rendered_contains(f, line));
    snprintf(line, sizeof(line),
             "baton_worker_breaker_transitions_total{worker=\"%s\",to=\"open\"} 1", bad->id);
    assert_true(rendered_contains(f, line));

    baton_whealth_ticket_t t;
    assert_int_equal(baton_whealth_admit(f->wh, bad, &t), 0);
    for (int i = 0; i < 10; i++) {
        baton_worker_t *p = baton_whealth_pick(f->wh, f->rr, BATON_ROLE_DECODE, &t);
        assert_non_null(p);
        assert_true(p != bad);
        baton_whealth_done(f->wh, p, t, BATON_OUTCOME_SUCCESS);
        baton_worker_unref(p);
    }

    /* Cool-down over: a sync publishes HALF_OPEN (the registry makes it eligible again)... */
    fake_now += 999;
    baton_whealth_sync(f->wh);
    assert_int_equal(baton_worker_breaker(bad), BATON_BREAKER_OPEN);
    fake_now += 1;
    baton_whealth_sync(f->wh);
    assert_int_equal(baton_worker_breaker(bad), BATON_BREAKER_HALF_OPEN);
    assert_true(baton_worker_is_eligible(bad));

    /* ...and exactly one pick gets it as a probe while the probe is out. */
    baton_whealth_ticket_t probe = 0;
    int got = 0;
    for (int i = 0; i < 9; i++) {
        baton_worker_t *p = baton_whealth_pick(f->wh, f->rr, BATON_ROLE_DECODE, &t);
        assert_non_null(p);
        if (p == bad) {
            got++;
            probe = t;
            assert_true(baton_breaker_ticket_is_probe(t));
        } else {
            baton_whealth_done(f->wh, p, t, BATON_OUTCOME_SUCCESS);
        }
        baton_worker_unref(p);
    }
    assert_int_equal(got, 1);
    baton_whealth_done(f->wh, bad, probe, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_worker_breaker(bad), BATON_BREAKER_CLOSED);
    snprintf(line, sizeof(line), "baton_worker_breaker_state{worker=\"%s\",role=\"decode\"} 0",
             bad->id);
    assert_true(rendered_contains(f, line));
}

static void test_health_up_expires_open_breaker(void **state)
{
    fx_t *f = *state;
    baton_worker_t *w = f->w[0];
    fail_worker(f, w, 5);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_OPEN);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 0, 0, BATON_ECONNECT), BATON_WH_DOWN);
    fake_now += 10; /* far from the 1 s cool-down */
    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 200, 0), BATON_WH_DOWN_CHECKING);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_OPEN);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 200, 0), BATON_WH_UP);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_HALF_OPEN);
    baton_whealth_ticket_t t;
    assert_int_equal(baton_whealth_admit(f->wh, w, &t), 1);
    assert_true(baton_breaker_ticket_is_probe(t));
    baton_whealth_done(f->wh, w, t, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_CLOSED);
}

static void test_unmatched_admit_released_neutral(void **state)
{
    fx_t *f = *state;
    baton_worker_t *w = f->w[0];
    fail_worker(f, w, 5);
    fake_now += 1000;
    baton_whealth_ticket_t t;
    assert_int_equal(baton_whealth_admit(f->wh, w, &t), 1); /* the probe */
    baton_whealth_ticket_t t2;
    assert_int_equal(baton_whealth_admit(f->wh, w, &t2), 0);
    /* Never sent (no partner found): released as NEUTRAL, the slot is free again. */
    baton_whealth_done(f->wh, w, t, BATON_OUTCOME_NEUTRAL);
    assert_int_equal(baton_whealth_admit(f->wh, w, &t2), 1);
    baton_whealth_done(f->wh, w, t2, BATON_OUTCOME_SUCCESS);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_CLOSED);
    assert_int_equal(baton_whealth_breaker_reset(f->wh, w), 0);
}

static void test_draining_and_removed(void **state)
{
    fx_t *f = *state;
    baton_whealth_ticket_t t;
    baton_registry_set_draining(f->reg, f->w[0], 1);
    assert_int_equal(baton_whealth_admit(f->wh, f->w[0], &t), 0);
    baton_registry_set_draining(f->reg, f->w[0], 0);

    baton_worker_t *w = f->w[2];
    baton_whealth_ticket_t inflight;
    assert_int_equal(baton_whealth_admit(f->wh, w, &inflight), 1); /* across the removal */
    assert_int_equal(baton_registry_remove(f->reg, w->id), 0);
    assert_int_equal(baton_whealth_admit(f->wh, w, &t), 0);
    baton_whealth_sync(f->wh);
    assert_int_equal(baton_whealth_size(f->wh), 2);
    baton_whealth_info_t info;
    assert_int_equal(baton_whealth_info(f->wh, w, &info), BATON_ENOTFOUND);
    assert_int_equal(baton_whealth_check_result(f->wh, w, 1, 200, 0), BATON_ENOTFOUND);
    assert_int_equal(baton_whealth_set_health(f->wh, w, 0, "x"), BATON_ENOTFOUND);
    baton_whealth_done(f->wh, w, inflight, BATON_OUTCOME_FAILURE); /* ignored, no crash */
    char needle[64];
    snprintf(needle, sizeof(needle), "worker=\"%s\"", w->id);
    assert_false(rendered_contains(f, needle));

    /* The same URL registered again is a new worker with the same id: fresh state, series back. */
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = w->url;
    spec.role = BATON_ROLE_DECODE;
    baton_worker_t *again = NULL;
    assert_int_equal(baton_registry_add(f->reg, &spec, &again, NULL, 0), 0);
    assert_string_equal(again->id, w->id);
    baton_whealth_sync(f->wh);
    assert_int_equal(baton_whealth_size(f->wh), 3);
    char line[160];
    snprintf(line, sizeof(line), "baton_worker_health{worker=\"%s\",role=\"decode\"} 1", w->id);
    assert_true(rendered_contains(f, line));
    assert_int_equal(baton_whealth_admit(f->wh, again, &t), 1);
    baton_whealth_done(f->wh, again, t, BATON_OUTCOME_SUCCESS);
    baton_worker_unref(again);
}

static void test_pick_none(void **state)
{
    fx_t *f = *state;
    baton_whealth_ticket_t t = 99;
    assert_null(baton_whealth_pick(f->wh, f->rr, BATON_ROLE_PREFILL, &t));
    assert_int_equal(t, 0);
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_whealth_set_health(f->wh, f->w[i], 0, "all down"), 0);
    assert_null(baton_whealth_pick(f->wh, f->rr, BATON_ROLE_DECODE, &t));
    assert_null(baton_whealth_pick(f->wh, f->rr, BATON_ROLE_ANY, &t));
}

static void test_lazy_entry_before_sync(void **state)
{
    fx_t *f = *state;
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = "http://127.0.0.1:7999";
    baton_worker_t *w = NULL;
    assert_int_equal(baton_registry_add(f->reg, &spec, &w, NULL, 0), 0);
    /* No sync yet: admission and failures still work (state created on demand). */
    fail_worker(f, w, 5);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_OPEN);
    assert_int_equal(baton_whealth_size(f->wh), 4);
    baton_whealth_sync(f->wh);
    assert_int_equal(baton_whealth_size(f->wh), 4);
    baton_worker_unref(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hcounter),
        cmocka_unit_test_setup_teardown(test_defaults_and_sync, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_health_is_the_one_switch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_check_results_rise_fall, setup, teardown),
        cmocka_unit_test_setup_teardown(test_breaker_published_and_skipped, setup, teardown),
        cmocka_unit_test_setup_teardown(test_health_up_expires_open_breaker, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unmatched_admit_released_neutral, setup, teardown),
        cmocka_unit_test_setup_teardown(test_draining_and_removed, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pick_none, setup, teardown),
        cmocka_unit_test_setup_teardown(test_lazy_entry_before_sync, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
