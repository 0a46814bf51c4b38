/* test_etcd.c — the etcd client's pure parts: endpoint URLs, base64, prefix ranges, int64s. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "baton/error.h"
#include "etcd/etcd.h"

static void url_parse(void **state)
{
    (void)state;
    baton_etcd_url_t u;
    char err[128];
    assert_int_equal(baton_etcd_url_parse("etcd://127.0.0.1:2379,10.0.0.2,h3:12379/baton/", &u, err,
                                          sizeof(err)),
                     0);
    assert_int_equal(u.n, 3);
    assert_string_equal(u.host[0], "127.0.0.1");
    assert_int_equal(u.port[0], 2379);
    assert_string_equal(u.host[1], "10.0.0.2");
    assert_int_equal(u.port[1], 2379); /* etcd's default */
    assert_string_equal(u.host[2], "h3");
    assert_int_equal(u.port[2], 12379);
    assert_string_equal(u.prefix, "/baton"); /* trailing '/' dropped */
    assert_int_equal(u.tls, 0);
    const char *bad[] = {"http://h:1/p", "etcd://h:1",   "etcd://h:1/",   "etcd://h:0/p",
                         "etcd://h:x/p", "etcd://:1/p",  "etcd://h:1,/p", "https://h:1/p",
                         "etcds://h:1",  "etcds://h:1/", "etcds:/h:1/p"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        err[0] = '\0';
        assert_int_equal(baton_etcd_url_parse(bad[i], &u, err, sizeof(err)), BATON_EINVAL);
        assert_true(err[0] != '\0');
    }
}

/* etcds://: the same endpoint list over TLS; a client for it needs a TLS configuration. */
static void url_parse_tls(void **state)
{
    (void)state;
    baton_etcd_url_t u;
    char err[128];
    assert_int_equal(
        baton_etcd_url_parse("etcds://127.0.0.1:2379,etcd-1/reg", &u, err, sizeof(err)), 0);
    assert_int_equal(u.tls, 1);
    assert_int_equal(u.n, 2);
    assert_string_equal(u.host[0], "127.0.0.1");
    assert_string_equal(u.host[1], "etcd-1");
    assert_int_equal(u.port[1], 2379);
    assert_string_equal(u.prefix, "/reg");
    baton_etcd_t *e = NULL;
    assert_int_equal(baton_etcd_create(&e, uv_default_loop(), &u, NULL, NULL, NULL, 1000),
                     BATON_EINVAL);
    assert_null(e);
}

static void base64_round_trip(void **state)
{
    (void)state;
    json_t *j = baton_etcd_b64("/baton/workers/w-1", 18);
    assert_string_equal(json_string_value(j), "L2JhdG9uL3dvcmtlcnMvdy0x");
    size_t n;
    char *back = baton_etcd_unb64(j, &n);
    assert_int_equal(n, 18);
    assert_string_equal(back, "/baton/workers/w-1");
    free(back);
    json_decref(j);
    json_t *bad = json_string("not base64!");
    assert_null(baton_etcd_unb64(bad, NULL));
    json_decref(bad);
    /* every length's padding, every byte value, and malformed forms */
    unsigned char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)(255 - i);
    for (size_t len = 0; len <= 256; len += (len < 8 ? 1 : 61)) {
        json_t *e = baton_etcd_b64((const char *)all, len);
        char *d = baton_etcd_unb64(e, &n);
        assert_non_null(d);
        assert_int_equal(n, len);
        assert_memory_equal(d, all, len);
        free(d);
        json_decref(e);
    }
    const char *malformed[] = {"QQ", "QQ=", "Q===", "QQ==QQ==", "QQ=A", "QQ\nA", "Q-A="};
    for (size_t i = 0; i < sizeof(malformed) / sizeof(malformed[0]); i++) {
        bad = json_string(malformed[i]);
        assert_null(baton_etcd_unb64(bad, NULL));
        json_decref(bad);
    }
    assert_null(baton_etcd_unb64(NULL, NULL));
}

static void prefix_end_and_ints(void **state)
{
    (void)state;
    char end[64];
    baton_etcd_prefix_end("/baton/workers/", end, sizeof(end));
    assert_string_equal(end, "/baton/workers0"); /* '/' + 1 */
    json_t *o = json_pack("{s:s, s:I, s:s}", "revision", "9007199254740993", "n", (json_int_t)7,
                          "bad", "12x");
    assert_true(baton_etcd_int(o, "revision", 0) == 9007199254740993LL); /* beyond a double */
    assert_int_equal(baton_etcd_int(o, "n", 0), 7);
    assert_int_equal(baton_etcd_int(o, "bad", -1), -1);
    assert_int_equal(baton_etcd_int(o, "absent", -2), -2);
    json_decref(o);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(url_parse),
        cmocka_unit_test(url_parse_tls),
        cmocka_unit_test(base64_round_trip),
        cmocka_unit_test(prefix_end_and_ints),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
