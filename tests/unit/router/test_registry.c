/* test_registry.c — worker registry: validation, duplicates, removal, references, snapshots. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "router/control/registry.h"

static int add(baton_registry_t *reg, const char *url, baton_worker_role_t role, int bport,
               baton_worker_t **w_p)
{
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = url;
    spec.role = role;
    spec.bootstrap_port = bport;
    char err[256] = "";
    int rc = baton_registry_add(reg, &spec, w_p, err, sizeof(err));
    if (rc != 0)
        assert_true(err[0] != '\0'); /* every failure says why */
    return rc;
}

static void test_add_and_fields(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    uint64_t g0 = baton_registry_generation(reg);
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    spec.url = "HTTP://LocalHost:30000/";
    spec.role = BATON_ROLE_PREFILL;
    spec.bootstrap_port = 8998;
    spec.api_key = "sk-1";
    spec.model_id = "m";
    spec.priority = 7;
    spec.cost = 2.5;
    spec.labels_json = "{ \"zone\" : \"a\" }";
    baton_worker_t *w = NULL;
    assert_int_equal(baton_registry_add(reg, &spec, &w, NULL, 0), 0);
    assert_non_null(w);
    assert_string_equal(w->url, "http://localhost:30000");
    assert_string_equal(w->parsed.host, "localhost");
    assert_int_equal(w->parsed.port, 30000);
    assert_string_equal(w->parsed.prefix, "");
    assert_int_equal(w->role, BATON_ROLE_PREFILL);
    assert_int_equal(w->bootstrap_port, 8998);
    assert_string_equal(w->api_key, "sk-1");
    assert_string_equal(w->model_id, "m");
    assert_int_equal(w->priority, 7);
    assert_true(w->cost == 2.5);
    assert_string_equal(w->labels_json, "{\"zone\":\"a\"}");
    assert_int_equal(strlen(w->id), 10);
    assert_true(strncmp(w->id, "w-", 2) == 0);
    assert_int_equal(baton_worker_health(w), BATON_HEALTH_HEALTHY);
    assert_int_equal(baton_worker_breaker(w), BATON_BREAKER_CLOSED);
    assert_true(baton_worker_is_eligible(w));
    assert_true(baton_registry_generation(reg) > g0);

    /* ids are stable: a fresh registry gives the same URL the same id */
    baton_registry_t *reg2;
    assert_int_equal(baton_registry_create(&reg2), 0);
    baton_worker_t *w2 = NULL;
    assert_int_equal(add(reg2, "http://localhost:30000", BATON_ROLE_DECODE, -1, &w2), 0);
    assert_string_equal(w2->id, w->id);
    /* Pinned (FNV-1a 32 of the normalized URL, then fmix32): ids must not move when the hash
     * code moves (common/hash.h), or replicas and restarts would disagree. */
    assert_string_equal(w->id, "w-f688d769");
    assert_null(w2->api_key);
    assert_string_equal(w2->labels_json, "{}");
    baton_worker_unref(w2);
    baton_registry_destroy(reg2);

    baton_worker_t *g = baton_registry_get(reg, w->id);
    assert_ptr_equal(g, w);
    baton_worker_unref(g);
    g = baton_registry_find_url(reg, "http://LOCALHOST:30000//");
    assert_ptr_equal(g, w);
    baton_worker_unref(g);
    assert_null(baton_registry_get(reg, "w-nope"));
    baton_worker_unref(w);
    baton_registry_destroy(reg);
}

static void test_validation(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    const char *bad_urls[] = {
        "",
        "localhost:3000",
        "ftp://a:1",
        "http://",
        "http://:80",
        "http://a:0",
        "http://a:65536",
        "http://a:12x",
        "http://a:",
        "http://a b:1",
        "http://u@a:1",
        "http://a:1/?q=1",
        "http://a:1#f",
        "http://[::1:1",
        "http://[zz]:1",
        "ftp://a:1",
        "http://a^b:1",
        "http://a:1\n",
    };
    for (size_t i = 0; i < sizeof(bad_urls) / sizeof(bad_urls[0]); i++) {
        if (add(reg, bad_urls[i], BATON_ROLE_REGULAR, -1, NULL) != BATON_EINVAL)
            fail_msg("accepted bad url '%s'", bad_urls[i]);
    }
    baton_worker_spec_t spec;
    baton_worker_spec_init(&spec);
    char err[128];
    assert_int_equal(baton_registry_add(reg, &spec, NULL, err, sizeof(err)), BATON_EINVAL);
    assert_non_null(strstr(err, "url"));
    /* bootstrap_port: prefill only, 1..65535 */
    assert_int_equal(add(reg, "http://a:1", BATON_ROLE_DECODE, 8998, NULL), BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", BATON_ROLE_REGULAR, 8998, NULL), BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", BATON_ROLE_PREFILL, 0, NULL), BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", BATON_ROLE_PREFILL, 65536, NULL), BATON_EINVAL);
    assert_int_equal(add(reg, "http://a:1", (baton_worker_role_t)7, -1, NULL), BATON_EINVAL);
    spec.url = "http://a:1";
    spec.labels_json = "[1]";
    assert_int_equal(baton_registry_add(reg, &spec, NULL, NULL, 0), BATON_EINVAL);
    spec.labels_json = "{bad";
    assert_int_equal(baton_registry_add(reg, &spec, NULL, NULL, 0), BATON_EINVAL);
    spec.labels_json = NULL;
    spec.priority = -1;
    assert_int_equal(baton_registry_add(reg, &spec, NULL, NULL, 0), BATON_EINVAL);
    spec.priority = 0;
    spec.cost = -1;
    assert_int_equal(baton_registry_add(reg, &spec, NULL, NULL, 0), BATON_EINVAL);
    spec.cost = 0;
    /* api_key goes into an Authorization header: any control byte would split or break it */
    const char *bad_keys[] = {"k\r\nX-Evil: 1", "k\n", "k\tk", "k\x7f",
                              "k\x01",          "",    "a b",  "k\xff"};
    for (size_t i = 0; i < sizeof(bad_keys) / sizeof(*bad_keys); i++) {
        spec.api_key = bad_keys[i];
        err[0] = '\0';
        if (baton_registry_add(reg, &spec, NULL, err, sizeof(err)) != BATON_EINVAL)
            fail_msg("accepted api_key #%zu", i);
        assert_non_null(strstr(err, "api_key"));
    }
    spec.api_key = NULL;
    assert_int_equal(baton_registry_size(reg), 0);

    /* good ones, incl. IPv6, default port and a path prefix */
    baton_worker_t *w;
    assert_int_equal(add(reg, "http://[::1]:9000/", BATON_ROLE_PREFILL, 1, &w), 0);
    assert_string_equal(w->url, "http://[::1]:9000");
    assert_string_equal(w->parsed.host, "::1");
    baton_worker_unref(w);
    assert_int_equal(add(reg, "http://example.com/v1/", BATON_ROLE_REGULAR, -1, &w), 0);
    assert_string_equal(w->url, "http://example.com:80/v1");
    assert_string_equal(w->parsed.prefix, "/v1");
    assert_int_equal(w->parsed.port, 80);
    baton_worker_unref(w);
    assert_int_equal(add(reg, "http://10.0.0.1:65535", BATON_ROLE_PREFILL, 65535, NULL), 0);
    assert_int_equal(baton_registry_size(reg), 3);
    baton_registry_destroy(reg);
}

static void test_duplicate(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    assert_int_equal(add(reg, "http://127.0.0.1:8001", BATON_ROLE_PREFILL, -1, NULL), 0);
    /* the same URL under another role or spelling is still a duplicate */
    assert_int_equal(add(reg, "http://127.0.0.1:8001", BATON_ROLE_DECODE, -1, NULL), BATON_EEXIST);
    assert_int_equal(add(reg, "http://127.0.0.1:8001/", BATON_ROLE_PREFILL, -1, NULL),
                     BATON_EEXIST);
    assert_int_equal(add(reg, "HTTP://127.0.0.1:8001", BATON_ROLE_REGULAR, -1, NULL), BATON_EEXIST);
    assert_int_equal(baton_registry_size(reg), 1);
    /* after removal it may be added again */
    assert_int_equal(baton_registry_remove_url(reg, "http://127.0.0.1:8001/"), 0);
    assert_int_equal(baton_registry_remove_url(reg, "http://127.0.0.1:8001"), BATON_ENOTFOUND);
    assert_int_equal(add(reg, "http://127.0.0.1:8001", BATON_ROLE_DECODE, -1, NULL), 0);
    baton_registry_destroy(reg);
}

static void test_remove_keeps_referenced_worker(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_worker_t *w;
    assert_int_equal(add(reg, "http://127.0.0.1:8002", BATON_ROLE_DECODE, -1, &w), 0);
    baton_worker_in_flight_inc(w); /* a request in flight holds w */
    char id[BATON_WORKER_ID_MAX];
    strcpy(id, w->id);
    uint64_t g = baton_registry_generation(reg);
    assert_int_equal(baton_registry_remove(reg, id), 0);
    assert_true(baton_registry_generation(reg) > g);
    assert_int_equal(baton_registry_remove(reg, id), BATON_ENOTFOUND);
    assert_null(baton_registry_get(reg, id));
    /* still valid for the request that holds it */
    assert_true(baton_worker_is_removed(w));
    assert_true(baton_worker_is_draining(w));
    assert_false(baton_worker_is_eligible(w));
    assert_string_equal(w->url, "http://127.0.0.1:8002");
    assert_int_equal(baton_worker_in_flight(w), 1);
    baton_registry_set_draining(reg, w, 0); /* a removed worker stays draining */
    assert_true(baton_worker_is_draining(w));
    baton_worker_in_flight_dec(w);
    baton_worker_unref(w); /* the last reference frees it (ASan/valgrind would see a leak) */

    /* destroy with outstanding references: workers outlive the registry */
    assert_int_equal(add(reg, "http://127.0.0.1:8003", BATON_ROLE_DECODE, -1, &w), 0);
    baton_registry_destroy(reg);
    assert_true(baton_worker_is_removed(w));
    assert_string_equal(w->url, "http://127.0.0.1:8003");
    baton_worker_unref(w);
}

static void test_snapshot_and_counts(void **state)
{
    baton_registry_t *reg;
    assert_int_equal(baton_registry_create(&reg), 0);
    baton_worker_t *p[3], *d[2];
    char url[64];
    for (int i = 0; i < 3; i++) {
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9100 + i);
        assert_int_equal(add(reg, url, BATON_ROLE_PREFILL, 8998 + i, &p[i]), 0);
    }
    for (int i = 0; i < 2; i++) {
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 9200 + i);
        assert_int_equal(add(reg, url, BATON_ROLE_DECODE, -1, &d[i]), 0);
    }
    assert_int_equal(add(reg, "http://127.0.0.1:9300", BATON_ROLE_REGULAR, -1, NULL), 0);

    size_t counts[BATON_ROLE_COUNT], elig[BATON_ROLE_COUNT];
    baton_registry_counts(reg, counts, elig);
    assert_int_equal(counts[BATON_ROLE_PREFILL], 3);
    assert_int_equal(counts[BATON_ROLE_DECODE], 2);
    assert_int_equal(counts[BATON_ROLE_REGULAR], 1);
    assert_int_equal(elig[BATON_ROLE_PREFILL], 3);

    baton_worker_t *out[8];
    size_t n = baton_registry_snapshot(reg, BATON_ROLE_PREFILL, BATON_SNAP_ELIGIBLE, out, 8);
    assert_int_equal(n, 3);
    for (size_t i = 0; i < n; i++)
        assert_ptr_equal(out[i], p[i]); /* registration order */
    baton_workers_unref(out, n);

    /* capacity smaller than the match count: total reported, only cap referenced */
    n = baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, out, 2);
    assert_int_equal(n, 6);
    baton_workers_unref(out, 2);
    assert_int_equal(baton_registry_snapshot(reg, BATON_ROLE_ANY, BATON_SNAP_ALL, NULL, 0), 6);

    /* health, breaker and draining take workers out of the eligible set */
    uint64_t g = baton_registry_generation(reg);
    baton_registry_set_health(reg, p[0], BATON_HEALTH_UNHEALTHY);
    assert_true(baton_registry_generation(reg) > g);
    g = baton_registry_generation(reg);
    baton_registry_set_health(reg, p[0], BATON_HEALTH_UNHEALTHY); /* no change, no bump */
    assert_true(baton_registry_generation(reg) == g);
    baton_registry_set_breaker(reg, p[1], BATON_BREAKER_OPEN);
    baton_registry_set_breaker(reg, d[0], BATON_BREAKER_HALF_OPEN); /* still eligible */
    baton_registry_set_draining(reg, d[1], 1);
    n = baton_registry_snapshot(reg, BATON_ROLE_PREFILL, BATON_SNAP_ELIGIBLE, out, 8);
    assert_int_equal(n, 1);
    assert_ptr_equal(out[0], p[2]);
    baton_workers_unref(out, n);
    n = baton_registry_snapshot(reg, BATON_ROLE_DECODE, BATON_SNAP_ELIGIBLE, out, 8);
    assert_int_equal(n, 1);
    assert_ptr_equal(out[0], d[0]);
    baton_workers_unref(out, n);
    baton_registry_counts(reg, counts, elig);
    assert_int_equal(counts[BATON_ROLE_PREFILL], 3);
    assert_int_equal(elig[BATON_ROLE_PREFILL], 1);
    assert_int_equal(elig[BATON_ROLE_DECODE], 1);
    assert_int_equal(elig[BATON_ROLE_REGULAR], 1);
    n = baton_registry_snapshot(reg, BATON_ROLE_PREFILL, BATON_SNAP_ALL, out, 8);
    assert_int_equal(n, 3);
    baton_workers_unref(out, n);

    baton_workers_unref(p, 3);
    baton_workers_unref(d, 2);
    baton_registry_destroy(reg);
}

static void test_names(void **state)
{
    baton_worker_role_t r;
    assert_int_equal(baton_worker_role_parse("prefill", &r), 0);
    assert_int_equal(r, BATON_ROLE_PREFILL);
    assert_int_equal(baton_worker_role_parse("decode", &r), 0);
    assert_int_equal(r, BATON_ROLE_DECODE);
    assert_int_equal(baton_worker_role_parse("regular", &r), 0);
    assert_int_equal(r, BATON_ROLE_REGULAR);
    assert_int_equal(baton_worker_role_parse("Prefill", &r), BATON_EINVAL);
    assert_int_equal(baton_worker_role_parse("any", &r), BATON_EINVAL);
    assert_int_equal(baton_worker_role_parse(NULL, &r), BATON_EINVAL);
    assert_string_equal(baton_worker_role_name(BATON_ROLE_DECODE), "decode");
    assert_string_equal(baton_breaker_state_name(BATON_BREAKER_HALF_OPEN), "half_open");
    assert_string_equal(baton_worker_health_name(BATON_HEALTH_UNHEALTHY), "unhealthy");
}

/* add/remove/snapshot/unref from several threads at once (run under ASan/TSan to be sure) */
static baton_registry_t *shared_reg;

static void *churn(void *arg)
{
    int t = (int)(intptr_t)arg;
    char url[64];
    for (int i = 0; i < 300; i++) {
        snprintf(url, sizeof(url), "http://127.0.0.1:%d", 10000 + t * 1000 + (i % 20));
        baton_worker_t *w = NULL;
        baton_worker_spec_t spec;
        baton_worker_spec_init(&spec);
        spec.url = url;
        spec.role = (baton_worker_role_t)(i % 3);
        if (baton_registry_add(shared_reg, &spec, &w, NULL, 0) == 0) {
            baton_worker_in_flight_inc(w);
            baton_worker_t *snap[64];
            size_t n =
                baton_registry_snapshot(shared_reg, BATON_ROLE_ANY, BATON_SNAP_ELIGIBLE, snap, 64);
            baton_workers_unref(snap, n < 64 ? n : 64);
            if (i % 2)
                baton_registry_remove(shared_reg, w->id);
            baton_worker_in_flight_dec(w);
            baton_worker_unref(w);
        }
    }
    return NULL;
}

static void test_concurrent(void **state)
{
    assert_int_equal(baton_registry_create(&shared_reg), 0);
    pthread_t th[4];
    for (int i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, churn, (void *)(intptr_t)i), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    size_t total = baton_registry_size(shared_reg);
    assert_true(total <= 80);
    baton_worker_t *all[128];
    size_t n = baton_registry_snapshot(shared_reg, BATON_ROLE_ANY, BATON_SNAP_ALL, all, 128);
    assert_int_equal(n, total);
    for (size_t i = 0; i < n; i++)
        assert_int_equal(baton_worker_in_flight(all[i]), 0);
    baton_workers_unref(all, n);
    baton_registry_destroy(shared_reg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_and_fields),
        cmocka_unit_test(test_validation),
        cmocka_unit_test(test_duplicate),
        cmocka_unit_test(test_remove_keeps_referenced_worker),
        cmocka_unit_test(test_snapshot_and_counts),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_concurrent),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
