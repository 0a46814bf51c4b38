/* test_worker_desc.c — the worker descriptor's one field list: every field round-trips through
 * JSON, and a change in any one field makes two descriptors differ. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "baton/error.h"
#include "router/control/worker_desc.h"

/* A value of each kind other than its default (so a field that is not carried shows). */
static void fill(baton_worker_desc_t *d)
{
    baton_worker_desc_init(d);
    d->url = strdup("http://h:9/p");
    d->role = BATON_ROLE_PREFILL;
    d->bootstrap_port = 8998;
    d->api_key = strdup("k");
    d->model_id = strdup("m");
    d->priority = 7;
    d->cost = 2.5;
    d->labels_json = strdup("{\"zone\":\"a\"}");
    d->pd_protocol = BATON_PD_VLLM_MOONCAKE;
    d->engine_id = strdup("e");
    d->bootstrap_addr = strdup("http://b:1");
    d->dp_size = 4;
}

static int equal(const baton_worker_desc_t *a, const baton_worker_desc_t *b)
{
    baton_worker_spec_t va, vb;
    BATON_WORKER_DESC_COPY_FIELDS(&va, a);
    BATON_WORKER_DESC_COPY_FIELDS(&vb, b);
    return baton_worker_spec_equal(&va, &vb);
}

static void test_round_trip(void **state)
{
    (void)state;
    baton_worker_desc_t a, b;
    fill(&a);
    baton_worker_spec_t v;
    BATON_WORKER_DESC_COPY_FIELDS(&v, &a);
    json_t *j = baton_worker_spec_to_json(&v, 1);
    assert_non_null(j);
    char err[128] = "";
    assert_int_equal(baton_worker_desc_from_json(&b, j, 1, "w", err, sizeof(err)), 0);
    assert_true(equal(&a, &b));
    /* every field made the trip: each one's key is in the JSON */
#define X(kind, name, key) assert_non_null(json_object_get(j, key));
    BATON_WORKER_DESC_FIELDS(X)
#undef X
    /* without secrets the api key stays home */
    json_t *pub = baton_worker_spec_to_json(&v, 0);
    assert_null(json_object_get(pub, "api_key"));
    json_decref(pub);
    json_decref(j);
    baton_worker_desc_free(&b);

    /* a copy is equal; changing any one field makes it differ */
    assert_int_equal(baton_worker_desc_dup(&b, &v), 0);
    assert_true(equal(&a, &b));
    baton_worker_desc_free(&b);
    baton_worker_desc_free(&a);
}

/* Each field in turn, changed in a copy: the copies differ (the comparison covers the list). */
static void test_each_field_compared(void **state)
{
    (void)state;
    baton_worker_desc_t a;
    fill(&a);
    baton_worker_spec_t v, w;
    BATON_WORKER_DESC_COPY_FIELDS(&v, &a);
    w = v;
    w.url = "http://h:10/p";
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.url = "http://H:9/p/"; /* the same URL, spelled otherwise */
    assert_true(baton_worker_spec_equal(&v, &w));
    w = v;
    w.role = BATON_ROLE_DECODE;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.bootstrap_port = -1;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.api_key = NULL;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.model_id = "n";
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.priority = 8;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.cost = 2.0;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.labels_json = "{\"zone\":\"b\"}";
    assert_false(baton_worker_spec_equal(&v, &w));
    w.labels_json = "{ \"zone\" : \"a\" }"; /* the same object, written otherwise */
    assert_true(baton_worker_spec_equal(&v, &w));
    w = v;
    w.pd_protocol = BATON_PD_UNSET;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.engine_id = "f";
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.bootstrap_addr = NULL;
    assert_false(baton_worker_spec_equal(&v, &w));
    w = v;
    w.dp_size = 0;
    assert_false(baton_worker_spec_equal(&v, &w));
    baton_worker_desc_free(&a);
}

static void test_strict_and_lenient(void **state)
{
    (void)state;
    baton_worker_desc_t d;
    char err[128];
    json_t *j = json_pack("{s:s, s:n, s:s}", "url", "http://h:1", "priority", "color", "red");
    /* a config file: an unknown key and a null priority are errors, naming where */
    assert_int_equal(baton_worker_desc_from_json(&d, j, 1, "workers[0]", err, sizeof(err)),
                     BATON_EINVAL);
    assert_non_null(strstr(err, "workers[0]"));
    /* the admin API: both ignored, the default kept */
    assert_int_equal(baton_worker_desc_from_json(&d, j, 0, NULL, err, sizeof(err)), 0);
    assert_int_equal(d.priority, 50);
    baton_worker_desc_free(&d);
    json_decref(j);
    j = json_pack("{s:i}", "bootstrap_port", 70000);
    assert_int_equal(baton_worker_desc_from_json(&d, j, 0, NULL, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "bootstrap_port"));
    json_decref(j);
    j = json_pack("{s:s}", "worker_type", "decode");
    assert_int_equal(baton_worker_desc_from_json(&d, j, 0, NULL, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "url"));
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_each_field_compared),
        cmocka_unit_test(test_strict_and_lenient),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
