/* test_priority_class.c — a request's priority class (router/dataplane/priority.c): names, the
 * order of its sources (header, body field, key), the system reservation, errors, the vLLM integer.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "baton/error.h"
#include "router/dataplane/priority.h"

/* The top-level "priority" of a JSON object text, as the request parser hands it over. */
static const baton_json_val_t *field(baton_json_scan_t *s, baton_json_member_t *space,
                                     const char *json)
{
    baton_json_scan_init(s, space, 8);
    assert_int_equal(baton_json_scan(s, json, strlen(json)), 0);
    const baton_json_member_t *m = baton_json_scan_get(s, "priority");
    return m ? &m->val : NULL;
}

static void test_names(void **state)
{
    (void)state;
    baton_prio_t p;
    for (int i = 0; i < BATON_PRIO_COUNT; i++) {
        const char *n = baton_prio_name((baton_prio_t)i);
        assert_int_equal(baton_prio_parse(n, strlen(n), &p), 0);
        assert_int_equal(p, i);
    }
    assert_int_equal(baton_prio_parse("Interactive", 11, &p), 0);
    assert_int_equal(p, BATON_PRIO_INTERACTIVE);
    assert_int_equal(baton_prio_parse("bulky", 5, &p), BATON_EINVAL);
    assert_int_equal(baton_prio_parse("bul", 3, &p), BATON_EINVAL);
    assert_int_equal(baton_prio_parse("", 0, &p), BATON_EINVAL);
    /* vLLM: lower runs earlier, default 0 */
    assert_true(baton_prio_vllm_value(BATON_PRIO_SYSTEM) <
                baton_prio_vllm_value(BATON_PRIO_INTERACTIVE));
    assert_true(baton_prio_vllm_value(BATON_PRIO_INTERACTIVE) <
                baton_prio_vllm_value(BATON_PRIO_DEFAULT));
    assert_int_equal(baton_prio_vllm_value(BATON_PRIO_DEFAULT), 0);
    assert_true(baton_prio_vllm_value(BATON_PRIO_BULK) > 0);
}

static void test_resolve_order(void **state)
{
    (void)state;
    baton_prio_t p;
    baton_prio_error_t e;
    baton_json_scan_t s;
    baton_json_member_t sp[8];
    /* nothing: default; the key's class when it has one */
    assert_int_equal(baton_prio_resolve(NULL, NULL, BATON_PRIO_NONE, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_DEFAULT);
    assert_int_equal(baton_prio_resolve(NULL, NULL, BATON_PRIO_BULK, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_BULK);
    /* the body field, vLLM's sense, over the key */
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":-5}"), BATON_PRIO_BULK, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_INTERACTIVE);
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":3}"), BATON_PRIO_NONE, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_BULK);
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":0}"), BATON_PRIO_BULK, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_DEFAULT);
    /* null is absent: the key's class */
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":null}"), BATON_PRIO_BULK, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_BULK);
    /* the header over both */
    assert_int_equal(baton_prio_resolve("interactive ", field(&s, sp, "{\"priority\":9}"),
                                        BATON_PRIO_BULK, &p, &e),
                     0);
    assert_int_equal(p, BATON_PRIO_INTERACTIVE);
    assert_int_equal(baton_prio_resolve("bulk", NULL, BATON_PRIO_SYSTEM, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_BULK);
}

static void test_resolve_errors_and_system(void **state)
{
    (void)state;
    baton_prio_t p = BATON_PRIO_BULK;
    baton_prio_error_t e;
    baton_json_scan_t s;
    baton_json_member_t sp[8];
    assert_int_equal(baton_prio_resolve("urgent", NULL, BATON_PRIO_NONE, &p, &e), BATON_EINVAL);
    assert_int_equal(e.status, 400);
    assert_string_equal(e.code, "invalid_priority");
    assert_string_equal(e.param, "x-priority");
    assert_non_null(strstr(e.message, "'urgent'"));
    /* a value that is not short and printable is not echoed */
    assert_int_equal(baton_prio_resolve("\x01\x02", NULL, BATON_PRIO_NONE, &p, &e), BATON_EINVAL);
    assert_null(strchr(e.message, '\x01'));
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":\"high\"}"), BATON_PRIO_NONE, &p, &e),
        BATON_EINVAL);
    assert_string_equal(e.code, "invalid_type");
    assert_string_equal(e.param, "priority");
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":1.5}"), BATON_PRIO_NONE, &p, &e),
        BATON_EINVAL);
    /* system: only a key that has it */
    assert_int_equal(baton_prio_resolve("system", NULL, BATON_PRIO_NONE, &p, &e), BATON_EINVAL);
    assert_int_equal(e.status, 403);
    assert_string_equal(e.code, "priority_not_allowed");
    assert_int_equal(baton_prio_resolve("system", NULL, BATON_PRIO_INTERACTIVE, &p, &e),
                     BATON_EINVAL);
    assert_int_equal(p, BATON_PRIO_BULK); /* untouched on failure */
    assert_int_equal(baton_prio_resolve("system", NULL, BATON_PRIO_SYSTEM, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_SYSTEM);
    assert_int_equal(baton_prio_resolve(NULL, NULL, BATON_PRIO_SYSTEM, &p, &e), 0);
    assert_int_equal(p, BATON_PRIO_SYSTEM);
    /* a very negative integer is interactive, never system */
    assert_int_equal(
        baton_prio_resolve(NULL, field(&s, sp, "{\"priority\":-1000}"), BATON_PRIO_NONE, &p, &e),
        0);
    assert_int_equal(p, BATON_PRIO_INTERACTIVE);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_resolve_order),
        cmocka_unit_test(test_resolve_errors_and_system),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
