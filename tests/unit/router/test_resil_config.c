/* test_resil_config.c — the resilience keys of the router configuration: defaults, CLI flags,
 * JSON sections (retries, admission, health, timeouts, top-level drain), ranges, --help. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "router/control/config.h"
#include "help_check.h"

static char errbuf[512];

static int parse(baton_config_t *cfg, int argc, char **argv)
{
    errbuf[0] = '\0';
    assert_int_equal(baton_config_init(cfg), 0);
    return baton_config_from_args(cfg, argc, argv, errbuf, sizeof(errbuf));
}

#define ARGV(...)       ((char *[]){"baton", __VA_ARGS__})
#define ARGC(...)       ((int)(sizeof((char *[]){"baton", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(cfg, ...) parse(cfg, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

static void test_defaults(void **state)
{
    baton_config_t c;
    assert_int_equal(parse(&c, 1, (char *[]){"baton"}), 0);
    /* long enough for a 100k-token prompt's prefill and first decoded token */
    assert_true(c.prefill_timeout_ms >= 300000);
    assert_true(c.timeouts.first_byte_ms >= 300000);
    assert_true(c.timeouts.connect_ms > 0 && c.timeouts.connect_ms <= 10000);
    assert_int_equal(c.max_retries, 2);
    assert_true(c.retry_backoff_ms > 0 && c.retry_backoff_ms <= c.retry_backoff_max_ms);
    assert_true(c.retry_budget_ms > 0);
    assert_true(c.max_concurrent_requests > 0);
    assert_true(c.queue_size > 0);
    assert_true(c.queue_timeout_ms > 0);
    assert_int_equal(c.max_worker_requests, 0);
    assert_true(c.check_interval_ms > 0);
    assert_true(c.check_timeout_ms > 0 && c.check_timeout_ms < c.check_interval_ms);
    assert_string_equal(c.check_path, "/health");
    assert_true(c.check_rise >= 1 && c.check_fall >= 1);
    assert_true(c.breaker_threshold > 0);
    assert_true(c.drain_timeout_ms > 0 && c.worker_drain_timeout_ms > 0);
    baton_config_free(&c);
}

static void test_cli(void **state)
{
    baton_config_t c;
    assert_int_equal(
        PARSE(&c, "--max-retries", "5", "--retry-backoff-ms", "10", "--retry-backoff-max-ms=20",
              "--retry-budget-ms", "3000", "--max-concurrent-requests", "7", "--queue-size", "0",
              "--queue-timeout-ms", "1500", "--max-worker-requests", "3", "--check-interval-ms",
              "0", "--check-fast-interval-ms", "100", "--check-down-interval-ms", "300",
              "--check-timeout-ms", "50", "--check-rise", "1", "--check-fall", "4", "--check-path",
              "/ready", "--breaker-threshold", "0", "--breaker-cooldown-ms", "200",
              "--breaker-cooldown-max-ms", "400", "--drain-timeout-ms", "0",
              "--worker-drain-timeout-ms", "2500", "--prefill-timeout-ms", "9000"),
        0);
    assert_int_equal(c.max_retries, 5);
    assert_int_equal(c.retry_backoff_ms, 10);
    assert_int_equal(c.retry_backoff_max_ms, 20);
    assert_int_equal(c.retry_budget_ms, 3000);
    assert_int_equal(c.max_concurrent_requests, 7);
    assert_int_equal(c.queue_size, 0);
    assert_int_equal(c.queue_timeout_ms, 1500);
    assert_int_equal(c.max_worker_requests, 3);
    assert_int_equal(c.check_interval_ms, 0);
    assert_int_equal(c.check_fast_interval_ms, 100);
    assert_int_equal(c.check_down_interval_ms, 300);
    assert_int_equal(c.check_timeout_ms, 50);
    assert_int_equal(c.check_rise, 1);
    assert_int_equal(c.check_fall, 4);
    assert_string_equal(c.check_path, "/ready");
    assert_int_equal(c.breaker_threshold, 0);
    assert_int_equal(c.breaker_cooldown_ms, 200);
    assert_int_equal(c.breaker_cooldown_max_ms, 400);
    assert_int_equal(c.drain_timeout_ms, 0);
    assert_int_equal(c.worker_drain_timeout_ms, 2500);
    assert_int_equal(c.prefill_timeout_ms, 9000);
    baton_config_free(&c);
}

static void test_json_sections(void **state)
{
    baton_config_t c;
    assert_int_equal(baton_config_init(&c), 0);
    const char *json = "{\"retries\":{\"max_retries\":1,\"retry_budget_ms\":500},"
                       "\"admission\":{\"max_concurrent_requests\":9,\"queue_size\":4,"
                       "\"queue_timeout_ms\":700,\"max_worker_requests\":2},"
                       "\"health\":{\"check_interval_ms\":1000,\"check_path\":\"/h\","
                       "\"breaker_threshold\":3},"
                       "\"timeouts\":{\"prefill_timeout_ms\":1234},"
                       "\"drain_timeout_ms\":111,\"worker_drain_timeout_ms\":222}";
    assert_int_equal(baton_config_load_json(&c, json, "t", errbuf, sizeof(errbuf)), 0);
    assert_int_equal(c.max_retries, 1);
    assert_int_equal(c.retry_budget_ms, 500);
    assert_int_equal(c.max_concurrent_requests, 9);
    assert_int_equal(c.queue_size, 4);
    assert_int_equal(c.queue_timeout_ms, 700);
    assert_int_equal(c.max_worker_requests, 2);
    assert_int_equal(c.check_interval_ms, 1000);
    assert_string_equal(c.check_path, "/h");
    assert_int_equal(c.breaker_threshold, 3);
    assert_int_equal(c.prefill_timeout_ms, 1234);
    assert_int_equal(c.drain_timeout_ms, 111);
    assert_int_equal(c.worker_drain_timeout_ms, 222);
    baton_config_free(&c);
}

static void bad_json(const char *json, const char *needle)
{
    baton_config_t c;
    assert_int_equal(baton_config_init(&c), 0);
    errbuf[0] = '\0';
    assert_int_equal(baton_config_load_json(&c, json, "t", errbuf, sizeof(errbuf)), BATON_EINVAL);
    if (strstr(errbuf, needle) == NULL)
        fail_msg("error '%s' lacks '%s'", errbuf, needle);
    baton_config_free(&c);
}

static void test_bad(void **state)
{
    baton_config_t c;
    /* keys live in their section only */
    bad_json("{\"max_retries\":1}", "unknown key");
    bad_json("{\"retries\":{\"queue_size\":1}}", "unknown key");
    bad_json("{\"health\":{\"check_intervall_ms\":1}}", "unknown key");
    bad_json("{\"retries\":5}", "must be an object");
    bad_json("{\"retries\":{\"max_retries\":-1}}", "out of range");
    bad_json("{\"retries\":{\"max_retries\":\"2\"}}", "must be an integer");
    bad_json("{\"health\":{\"check_path\":\"health\"}}", "must be a path");
    bad_json("{\"health\":{\"check_timeout_ms\":0}}", "out of range");
    bad_json("{\"admission\":{\"queue_timeout_ms\":0}}", "out of range");
    assert_int_equal(PARSE(&c, "--max-retries", "x"), BATON_EINVAL);
    baton_config_free(&c);
    assert_int_equal(PARSE(&c, "--max-retries", "1000"), BATON_EINVAL);
    baton_config_free(&c);
    assert_int_equal(PARSE(&c, "--check-path", "/a b"), BATON_EINVAL);
    baton_config_free(&c);
    assert_int_equal(PARSE(&c, "--check-rise", "0"), BATON_EINVAL);
    baton_config_free(&c);
    assert_int_equal(PARSE(&c, "--drain-timeout-ms"), BATON_EINVAL);
    baton_config_free(&c);
}

static void test_help(void **state)
{
    const char *flags[] = {"--prefill-timeout-ms",
                           "--max-retries",
                           "--retry-backoff-ms",
                           "--retry-backoff-max-ms",
                           "--retry-budget-ms",
                           "--max-concurrent-requests",
                           "--queue-size",
                           "--queue-timeout-ms",
                           "--max-worker-requests",
                           "--check-interval-ms",
                           "--check-fast-interval-ms",
                           "--check-down-interval-ms",
                           "--check-timeout-ms",
                           "--check-rise",
                           "--check-fall",
                           "--check-path",
                           "--breaker-threshold",
                           "--breaker-cooldown-ms",
                           "--breaker-cooldown-max-ms",
                           "--drain-timeout-ms",
                           "--worker-drain-timeout-ms",
                           "SIGHUP",
                           "SIGTERM",
                           "(default: /health)"};
    assert_help_lists(flags, sizeof(flags) / sizeof(flags[0]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),      cmocka_unit_test(test_cli),
        cmocka_unit_test(test_json_sections), cmocka_unit_test(test_bad),
        cmocka_unit_test(test_help),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
