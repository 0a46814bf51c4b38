/* test_url.c — baton_url_parse: accepted forms and everything it must refuse. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "baton/error.h"
#include "http/common.h"

static void test_good(void **state)
{
    baton_url_t u;
    assert_int_equal(baton_url_parse("http://127.0.0.1:8000", &u), 0);
    assert_string_equal(u.host, "127.0.0.1");
    assert_int_equal(u.port, 8000);
    assert_string_equal(u.prefix, "");

    assert_int_equal(baton_url_parse("http://example.com", &u), 0);
    assert_string_equal(u.host, "example.com");
    assert_int_equal(u.port, 80);
    assert_string_equal(u.prefix, "");

    assert_int_equal(baton_url_parse("http://[::1]:9000/v1/", &u), 0);
    assert_string_equal(u.host, "::1");
    assert_int_equal(u.port, 9000);
    assert_string_equal(u.prefix, "/v1");

    assert_int_equal(baton_url_parse("HTTP://worker-1.local:65535/a/b", &u), 0);
    assert_string_equal(u.host, "worker-1.local");
    assert_int_equal(u.port, 65535);
    assert_string_equal(u.prefix, "/a/b");

    assert_int_equal(baton_url_parse("http://h/", &u), 0);
    assert_string_equal(u.host, "h");
    assert_string_equal(u.prefix, "");

    assert_int_equal(baton_url_parse("http://[fe80::1]", &u), 0);
    assert_string_equal(u.host, "fe80::1");
    assert_int_equal(u.port, 80);
    assert_int_equal(u.tls, 0);

    /* https://: TLS, port 443 unless given */
    assert_int_equal(baton_url_parse("HTTPS://w.example:8443/p", &u), 0);
    assert_string_equal(u.host, "w.example");
    assert_int_equal(u.port, 8443);
    assert_string_equal(u.prefix, "/p");
    assert_int_equal(u.tls, 1);
    assert_int_equal(baton_url_parse("https://127.0.0.1", &u), 0);
    assert_int_equal(u.port, 443);
    assert_int_equal(u.tls, 1);
}

static void test_bad(void **state)
{
    static const char *bad[] = {
        "",
        "127.0.0.1:8000",
        "https://",
        "https://:443",
        "ftp://h",
        "http://",
        "http://:80",
        "http://h:",
        "http://h:0",
        "http://h:65536",
        "http://h:99999999999",
        "http://h:abc",
        "http://h:8a",
        "http://[::1",
        "http://[]:1",
        "http://[zz]:1",
        "http://[::1]x",
        "http://h:80?x=1",
        "http://h/a?b",
        "http://h/a#f",
        "http://user@h",
        "http://h /x",
        "http://h/a b",
        "http://h:-1",
    };
    baton_url_t u;
    memset(&u, 0x5a, sizeof(u));
    baton_url_t before = u;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int r = baton_url_parse(bad[i], &u);
        if (r != BATON_EINVAL)
            fail_msg("accepted bad URL '%s' (r=%d)", bad[i], r);
    }
    /* Output is untouched on failure. */
    assert_memory_equal(&u, &before, sizeof(u));
    assert_int_equal(baton_url_parse(NULL, &u), BATON_EINVAL);
    assert_int_equal(baton_url_parse("http://h", NULL), BATON_EINVAL);

    char longhost[400] = "http://";
    memset(longhost + 7, 'a', 300);
    longhost[307] = '\0';
    assert_int_equal(baton_url_parse(longhost, &u), BATON_EINVAL);
    char longpath[400] = "http://h/";
    memset(longpath + 9, 'p', 300);
    longpath[309] = '\0';
    assert_int_equal(baton_url_parse(longpath, &u), BATON_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_good),
        cmocka_unit_test(test_bad),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
