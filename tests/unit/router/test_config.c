/* test_config.c — router configuration: defaults, JSON file, CLI, precedence, bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "baton/error.h"
#include "router/control/config.h"
#include "help_check.h"

#ifndef BATON_SOURCE_DIR
#error "BATON_SOURCE_DIR must be defined"
#endif

static char errbuf[512];

static int parse(baton_config_t *cfg, int argc, char **argv)
{
    errbuf[0] = '\0';
    assert_int_equal(baton_config_init(cfg), 0);
    int rc = baton_config_from_args(cfg, argc, argv, errbuf, sizeof(errbuf));
    if (rc < 0)
        assert_true(errbuf[0] != '\0');
    return rc;
}

#define ARGV(...)       ((char *[]){"baton", __VA_ARGS__})
#define ARGC(...)       ((int)(sizeof((char *[]){"baton", __VA_ARGS__}) / sizeof(char *)))
#define PARSE(cfg, ...) parse(cfg, ARGC(__VA_ARGS__), ARGV(__VA_ARGS__))

static void test_defaults(void **state)
{
    baton_config_t c;
    assert_int_equal(parse(&c, 1, (char *[]){"baton"}), 0);
    assert_string_equal(c.host, "127.0.0.1");
    assert_int_equal(c.port, 8000);
    assert_true(c.threads >= 1);
    assert_int_equal(c.threads, (unsigned)sysconf(_SC_NPROCESSORS_ONLN));
    assert_null(c.config_path);
    assert_int_equal(c.policy, BATON_POLICY_ROUND_ROBIN);
    assert_int_equal(c.prefill_policy, BATON_POLICY_ROUND_ROBIN);
    assert_int_equal(c.decode_policy, BATON_POLICY_ROUND_ROBIN);
    assert_int_equal(c.log_level, BATON_LOG_INFO);
    assert_int_equal(c.limits.max_body_bytes, 64 * 1024 * 1024);
    assert_int_equal(c.limits.max_header_bytes, 65536);
    assert_int_equal(c.limits.max_connections, 10000);
    assert_true(c.timeouts.first_byte_ms >= 300000); /* long prefills */
    assert_true(c.timeouts.connect_ms > 0);
    assert_int_equal(c.n_workers, 0);
    baton_config_free(&c);
}

static void test_cli(void **state)
{
    baton_config_t c;
    assert_int_equal(PARSE(&c, "--host", "0.0.0.0", "--port=9001", "--threads", "3", "--prefill",
                           "http://127.0.0.1:30001", "8998", "--prefill", "http://127.0.0.1:30003",
                           "--decode", "http://127.0.0.1:30002", "--prefill",
                           "http://127.0.0.1:30005", "none", "--worker", "http://127.0.0.1:30004",
                           "--prefill", "http://127.0.0.1:30006", "9000", "--policy", "random",
                           "--decode-policy", "power_of_two", "--log-level", "debug",
                           "--max-body-bytes", "1024", "--first-byte-timeout-ms", "0",
                           "--max-connections", "5", "--keepalive-timeout-ms=7"),
                     0);
    assert_string_equal(c.host, "0.0.0.0");
    assert_int_equal(c.port, 9001);
    assert_int_equal(c.threads, 3);
    assert_int_equal(c.policy, BATON_POLICY_RANDOM);
    assert_int_equal(c.prefill_policy, BATON_POLICY_RANDOM); /* follows --policy */
    assert_int_equal(c.decode_policy, BATON_POLICY_POWER_OF_TWO);
    assert_int_equal(c.log_level, BATON_LOG_DEBUG);
    assert_int_equal(c.limits.max_body_bytes, 1024);
    assert_int_equal(c.timeouts.first_byte_ms, 0);
    assert_int_equal(c.limits.max_connections, 5);
    assert_int_equal(c.limits.keepalive_timeout_ms, 7);
    assert_int_equal(c.n_workers, 6);
    struct {
        const char *url;
        baton_worker_role_t role;
        int port;
    } want[] = {
        {"http://127.0.0.1:30001", BATON_ROLE_PREFILL, 8998},
        {"http://127.0.0.1:30003", BATON_ROLE_PREFILL, -1}, /* next word was a flag */
        {"http://127.0.0.1:30002", BATON_ROLE_DECODE, -1},
        {"http://127.0.0.1:30005", BATON_ROLE_PREFILL, -1}, /* explicit none */
        {"http://127.0.0.1:30004", BATON_ROLE_REGULAR, -1},
        {"http://127.0.0.1:30006", BATON_ROLE_PREFILL, 9000},
    };
    for (size_t i = 0; i < 6; i++) {
        assert_string_equal(c.workers[i].url, want[i].url);
        assert_int_equal(c.workers[i].role, want[i].role);
        assert_int_equal(c.workers[i].bootstrap_port, want[i].port);
    }

    /* the workers register */
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(baton_config_apply_workers(&c, reg, errbuf, sizeof(errbuf)), 0);
    size_t counts[BATON_ROLE_COUNT];
    baton_registry_counts(reg, counts, NULL);
    assert_int_equal(counts[BATON_ROLE_PREFILL], 4);
    assert_int_equal(counts[BATON_ROLE_DECODE], 1);
    assert_int_equal(counts[BATON_ROLE_REGULAR], 1);
    baton_registry_destroy(reg);
    baton_config_free(&c);

    /* the same URL twice on the command line: apply reports the duplicate */
    assert_int_equal(PARSE(&c, "--decode", "http://h:1", "--decode", "http://h:1/"), 0);
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(baton_config_apply_workers(&c, reg, errbuf, sizeof(errbuf)), BATON_EEXIST);
    assert_non_null(strstr(errbuf, "http://h:1"));
    baton_registry_destroy(reg);
    baton_config_free(&c);
}

static void test_bad_cli(void **state)
{
    baton_config_t c;
#define BAD(...)                                                                                   \
    do {                                                                                           \
        assert_int_equal(PARSE(&c, __VA_ARGS__), BATON_EINVAL);                                    \
        baton_config_free(&c);                                                                     \
    } while (0)
    BAD("--bogus");
    BAD("extra");
    BAD("--port");
    BAD("--port", "x");
    BAD("--port", "-1");
    BAD("--port", "65536");
    BAD("--port", "80x");
    BAD("--port", "");
    BAD("--threads", "0");
    BAD("--threads", "99999");
    BAD("--priority-reserve-pct", "1001");
    BAD("--priority-reserve-pct", "-5");
    BAD("--policy", "cache-aware"); /* cache_aware is the name; names are exact */
    BAD("--cache-threshold-pct", "101");
    BAD("--balance-rel-threshold-pct", "99");
    BAD("--cache-max-blocks", "0");
    BAD("--prefill-policy", "");
    BAD("--log-level", "loud");
    BAD("--host", "");
    BAD("--max-body-bytes", "0");
    BAD("--max-body-bytes", "18446744073709551616"); /* overflows u64 */
    BAD("--prefill");
    BAD("--prefill", "http://h:1", "0");
    BAD("--prefill", "http://h:1", "70000");
    BAD("--prefill", "http://h:1", "12ab");
    BAD("--prefill", "http://h:1", "junk"); /* not a port: it is taken as a flag */
    BAD("--prefill", "h:1");
    BAD("--decode", "ftp://h:1");
    BAD("--worker", "--port");
    BAD("--config");
    BAD("--config", "/nonexistent/baton.json");
    BAD("--port8000");
#undef BAD
    /* the message names the culprit */
    assert_int_equal(PARSE(&c, "--port", "x"), BATON_EINVAL);
    assert_non_null(strstr(errbuf, "--port"));
    assert_non_null(strstr(errbuf, "'x'"));
    baton_config_free(&c);
    assert_int_equal(PARSE(&c, "--frobnicate"), BATON_EINVAL);
    assert_non_null(strstr(errbuf, "--frobnicate"));
    baton_config_free(&c);
    /* --help wins over anything else */
    assert_int_equal(PARSE(&c, "--bogus", "--help"), BATON_CONFIG_HELP);
    baton_config_free(&c);
}

static char *write_tmp(const char *text)
{
    char *path = strdup("/tmp/baton-test-config-XXXXXX");
    assert_non_null(path);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    size_t len = strlen(text);
    assert_int_equal(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

static void test_file_and_override(void **state)
{
    char *path = write_tmp("{\"host\":\"10.0.0.1\",\"port\":7000,\"threads\":2,"
                           "\"policy\":\"power_of_two\",\"prefill_policy\":\"random\","
                           "\"log_level\":\"warn\","
                           "\"workers\":["
                           "{\"url\":\"http://127.0.0.1:30001\",\"worker_type\":\"prefill\","
                           "\"bootstrap_port\":8998,\"api_key\":\"k\",\"model_id\":\"m\","
                           "\"priority\":3,\"cost\":0.5,\"labels\":{\"zone\":\"a\"}},"
                           "{\"url\":\"http://127.0.0.1:30002\",\"worker_type\":\"decode\","
                           "\"bootstrap_port\":null}],"
                           "\"limits\":{\"max_body_bytes\":2048,\"header_timeout_ms\":1000},"
                           "\"timeouts\":{\"connect_timeout_ms\":100,\"idle_timeout_ms\":0}}");
    baton_config_t c;
    /* --port given BEFORE --config still wins: the CLI overrides the file whatever the order */
    assert_int_equal(PARSE(&c, "--port", "7001", "--config", path, "--decode-policy", "round_robin",
                           "--prefill", "http://127.0.0.1:30001", "9999", "--decode",
                           "http://127.0.0.1:30003", "--max-body-bytes", "4096"),
                     0);
    assert_string_equal(c.config_path, path);
    assert_string_equal(c.host, "10.0.0.1");
    assert_int_equal(c.port, 7001);
    assert_int_equal(c.threads, 2);
    assert_int_equal(c.policy, BATON_POLICY_POWER_OF_TWO);
    assert_int_equal(c.prefill_policy, BATON_POLICY_RANDOM);
    assert_int_equal(c.decode_policy, BATON_POLICY_ROUND_ROBIN);
    assert_int_equal(c.log_level, BATON_LOG_WARN);
    assert_int_equal(c.limits.max_body_bytes, 4096);
    assert_int_equal(c.limits.header_timeout_ms, 1000);
    assert_int_equal(c.limits.max_headers, 100); /* untouched default */
    assert_int_equal(c.timeouts.connect_ms, 100);
    assert_int_equal(c.timeouts.idle_ms, 0);
    /* the CLI prefill with the same URL replaced the file's; the new decode was added */
    assert_int_equal(c.n_workers, 3);
    assert_string_equal(c.workers[0].url, "http://127.0.0.1:30001");
    assert_int_equal(c.workers[0].bootstrap_port, 9999);
    assert_null(c.workers[0].api_key);
    assert_int_equal(c.workers[1].role, BATON_ROLE_DECODE);
    assert_int_equal(c.workers[1].bootstrap_port, -1);
    assert_string_equal(c.workers[2].url, "http://127.0.0.1:30003");
    baton_config_free(&c);

    /* the file alone keeps every worker field */
    assert_int_equal(PARSE(&c, "--config", path), 0);
    assert_int_equal(c.port, 7000);
    assert_int_equal(c.decode_policy, BATON_POLICY_POWER_OF_TWO); /* follows policy */
    assert_int_equal(c.n_workers, 2);
    assert_string_equal(c.workers[0].api_key, "k");
    assert_string_equal(c.workers[0].model_id, "m");
    assert_int_equal(c.workers[0].priority, 3);
    assert_true(c.workers[0].cost == 0.5);
    assert_string_equal(c.workers[0].labels_json, "{\"zone\":\"a\"}");
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(baton_config_apply_workers(&c, reg, errbuf, sizeof(errbuf)), 0);
    baton_worker_t *w = baton_registry_find_url(reg, "http://127.0.0.1:30001");
    assert_non_null(w);
    assert_string_equal(w->api_key, "k");
    assert_int_equal(w->bootstrap_port, 8998);
    baton_worker_unref(w);
    baton_registry_destroy(reg);
    baton_config_free(&c);
    unlink(path);
    free(path);
}

static void test_bad_json(void **state)
{
    const char *bad[] = {
        "",
        "[]",
        "{\"port\":\"8000\"}",
        "{\"port\":8000.5}",
        "{\"port\":-1}",
        "{\"port\":70000}",
        "{\"host\":5}",
        "{\"hots\":\"x\"}",
        "{\"threads\":0}",
        "{\"policy\":\"nope\"}",
        "{\"limits\":{\"max_bodybytes\":1}}",
        "{\"limits\":{\"max_body_bytes\":0}}",
        "{\"limits\":5}",
        "{\"timeouts\":{\"connect_timeout_ms\":-5}}",
        "{\"max_body_bytes\":5}", /* belongs under limits */
        "{\"workers\":{}}",
        "{\"workers\":[5]}",
        "{\"workers\":[{}]}",
        "{\"workers\":[{\"url\":\"h:1\"}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"worker_type\":\"big\"}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"bootstrap_port\":8998}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"worker_type\":\"prefill\","
        "\"bootstrap_port\":0}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"worker_type\":\"prefill\","
        "\"bootstrap_port\":\"8998\"}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"priority\":-1}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"labels\":[]}]}",
        "{\"workers\":[{\"url\":\"http://h:1\",\"color\":\"red\"}]}",
        "{\"port\":1,\"port\":2}",
        "{\"port\":8000",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        baton_config_t c;
        assert_int_equal(baton_config_init(&c), 0);
        errbuf[0] = '\0';
        int rc = baton_config_load_json(&c, bad[i], "test.json", errbuf, sizeof(errbuf));
        if (rc != BATON_EINVAL)
            fail_msg("accepted bad config %s", bad[i]);
        assert_non_null(strstr(errbuf, "test.json"));
        baton_config_free(&c);
    }
}

static void test_shipped_example(void **state)
{
    baton_config_t c;
    assert_int_equal(PARSE(&c, "--config", BATON_SOURCE_DIR "/conf/baton.json"), 0);
    assert_true(c.n_workers >= 2);
    assert_int_equal(c.priority_reserve_pct, 50);
    assert_int_equal(c.priority_preempt, 0);
    assert_int_equal(c.priority_to_workers, 0);
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(baton_config_apply_workers(&c, reg, errbuf, sizeof(errbuf)), 0);
    baton_registry_destroy(reg);
    baton_config_free(&c);
    /* the priority options from the command line */
    assert_int_equal(PARSE(&c, "--priority-reserve-pct", "0", "--priority-preempt",
                           "--priority-to-workers"),
                     0);
    assert_int_equal(c.priority_reserve_pct, 0);
    assert_int_equal(c.priority_preempt, 1);
    assert_int_equal(c.priority_to_workers, 1);
    baton_config_free(&c);
}

static void test_help_lists_every_flag(void **state)
{
    const char *flags[] = {"--host",
                           "--port",
                           "--config",
                           "--threads",
                           "--prefill URL [BOOTSTRAP_PORT]",
                           "--decode URL",
                           "--worker URL",
                           "--policy",
                           "--prefill-policy",
                           "--decode-policy",
                           "--log-level",
                           "--max-header-bytes",
                           "--max-headers",
                           "--max-body-bytes",
                           "--header-timeout-ms",
                           "--body-timeout-ms",
                           "--keepalive-timeout-ms",
                           "--max-connections",
                           "--connect-timeout-ms",
                           "--first-byte-timeout-ms",
                           "--idle-timeout-ms",
                           "--request-timeout-ms",
                           "--help",
                           "(default: 127.0.0.1)",
                           "(default: 8000)",
                           "(default: 67108864)"};
    assert_help_lists(flags, sizeof(flags) / sizeof(flags[0]));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_defaults),
        cmocka_unit_test(test_cli),
        cmocka_unit_test(test_bad_cli),
        cmocka_unit_test(test_file_and_override),
        cmocka_unit_test(test_bad_json),
        cmocka_unit_test(test_shipped_example),
        cmocka_unit_test(test_help_lists_every_flag),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
