/* test_reload.c — SIGHUP's worker diff: added, removed (drain starts), changed (old object
 * drains, new one registered), unchanged, API workers left alone, removed ones re-asserted. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "baton/error.h"
#include "router/control/config.h"
#include "router/control/registry.h"
#include "router/control/reload.h"

static char errbuf[512];

static void load(baton_config_t *c, const char *json)
{
    assert_int_equal(baton_config_init(c), 0);
    int rc = baton_config_load_json(c, json, "test", errbuf, sizeof(errbuf));
    if (rc != 0)
        fail_msg("config: %s", errbuf);
}

static int registered(baton_registry_t *reg, const char *url)
{
    baton_worker_t *w = baton_registry_find_url(reg, url);
    baton_worker_unref(w);
    return w != NULL;
}

static void test_diff(void **state)
{
    baton_config_t a, b;
    load(&a, "{\"workers\":["
             "{\"url\":\"http://10.0.0.1:1\",\"worker_type\":\"prefill\",\"bootstrap_port\":9000},"
             "{\"url\":\"http://10.0.0.2:1\",\"worker_type\":\"decode\"},"
             "{\"url\":\"http://10.0.0.3:1\",\"worker_type\":\"decode\",\"priority\":1}]}");
    load(&b, "{\"workers\":["
             /* same as before, written differently */
             "{\"url\":\"http://10.0.0.1:1/\",\"worker_type\":\"prefill\",\"bootstrap_port\":9000},"
             /* changed: priority */
             "{\"url\":\"http://10.0.0.3:1\",\"worker_type\":\"decode\",\"priority\":2},"
             /* new */
             "{\"url\":\"http://10.0.0.4:1\",\"worker_type\":\"regular\"}]}");
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(baton_config_apply_workers(&a, reg, errbuf, sizeof(errbuf)), 0);
    /* a worker registered through the API: reloads never touch it */
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = "http://10.0.0.9:1";
    assert_int_equal(baton_registry_add(reg, &spec, NULL, NULL, 0), 0);

    baton_worker_t *old2 = baton_registry_find_url(reg, "http://10.0.0.2:1");
    baton_worker_t *old3 = baton_registry_find_url(reg, "http://10.0.0.3:1");
    baton_worker_t *keep1 = baton_registry_find_url(reg, "http://10.0.0.1:1");
    assert_non_null(old2);
    assert_non_null(old3);

    baton_reload_result_t res;
    assert_int_equal(baton_reload_workers(reg, &a, &b, &res, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(res.added, 1);
    assert_int_equal(res.removed, 1);
    assert_int_equal(res.changed, 1);
    assert_int_equal(res.unchanged, 1);

    /* removed: draining, out of the registry; its object stays valid while referenced */
    assert_false(registered(reg, "http://10.0.0.2:1"));
    assert_true(baton_worker_is_removed(old2) && baton_worker_is_draining(old2));
    assert_true(baton_worker_removed_ns(old2) > 0);
    /* changed: a new object with the new attributes; the old one drains */
    baton_worker_t *new3 = baton_registry_find_url(reg, "http://10.0.0.3:1");
    assert_non_null(new3);
    assert_ptr_not_equal(new3, old3);
    assert_int_equal(new3->priority, 2);
    assert_true(baton_worker_is_removed(old3));
    assert_string_equal(new3->id, old3->id); /* ids are stable per URL */
    /* unchanged: the very same object, untouched */
    baton_worker_t *same1 = baton_registry_find_url(reg, "http://10.0.0.1:1");
    assert_ptr_equal(same1, keep1);
    assert_false(baton_worker_is_draining(same1));
    /* added, and the API worker is still there */
    assert_true(registered(reg, "http://10.0.0.4:1"));
    assert_true(registered(reg, "http://10.0.0.9:1"));
    assert_int_equal(baton_registry_size(reg), 4);

    /* an unchanged config worker removed through the API comes back on the next reload */
    assert_int_equal(baton_registry_remove_url(reg, "http://10.0.0.1:1"), 0);
    assert_int_equal(baton_reload_workers(reg, &b, &b, &res, errbuf, sizeof(errbuf)), 0);
    assert_int_equal(res.unchanged, 3);
    assert_int_equal(res.added + res.removed + res.changed, 0);
    assert_true(registered(reg, "http://10.0.0.1:1"));
    assert_int_equal(baton_registry_size(reg), 4);

    /* a config worker whose URL the API registered already is adopted, not an error */
    baton_config_t c;
    load(&c, "{\"workers\":[{\"url\":\"http://10.0.0.9:1\"}]}");
    assert_int_equal(baton_reload_workers(reg, &b, &c, &res, errbuf, sizeof(errbuf)), 0);
    assert_true(registered(reg, "http://10.0.0.9:1"));
    assert_false(registered(reg, "http://10.0.0.1:1"));
    assert_int_equal(baton_registry_size(reg), 1);

    baton_worker_unref(old2);
    baton_worker_unref(old3);
    baton_worker_unref(new3);
    baton_worker_unref(keep1);
    baton_worker_unref(same1);
    baton_registry_destroy(reg);
    baton_config_free(&a);
    baton_config_free(&b);
    baton_config_free(&c);
}

static void test_same_worker(void **state)
{
    baton_config_worker_t x = {.url = "http://H:1",
                               .role = BATON_ROLE_DECODE,
                               .bootstrap_port = -1,
                               .priority = 50,
                               .cost = 1.0};
    baton_config_worker_t y = x;
    y.url = "http://h:1/";
    assert_true(baton_reload_same_worker(&x, &y));
    y.api_key = "k";
    assert_false(baton_reload_same_worker(&x, &y));
    y = x;
    y.role = BATON_ROLE_PREFILL;
    assert_false(baton_reload_same_worker(&x, &y));
    y = x;
    y.labels_json = "{\"a\":1}";
    assert_false(baton_reload_same_worker(&x, &y));
    y = x;
    y.url = "http://h:2";
    assert_false(baton_reload_same_worker(&x, &y));
    y.url = "not a url";
    assert_false(baton_reload_same_worker(&x, &y));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_diff),
        cmocka_unit_test(test_same_worker),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
