/* test_json_scan.c — common/json_scan.h: the scanner's accept/reject edge cases (each one also
 * checked against jansson, whose behaviour it must match), the member index with duplicates, the
 * readers, and splicing top-level members. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "baton/error.h"
#include "common/json_scan.h"

/* Scans buf[0..len), asserts the verdict `want_ok`, and that jansson agrees. */
static void expect_n(const char *buf, size_t len, int want_ok)
{
    baton_json_scan_t s;
    baton_json_scan_init(&s, NULL, 0);
    int rc = baton_json_scan(&s, buf, len);
    json_t *j = json_loadb(buf, len, JSON_DECODE_ANY, NULL);
    if ((rc == 0) != want_ok)
        fail_msg("scanner %s: %.*s", rc == 0 ? "accepts" : "rejects", (int)len, buf);
    if ((j != NULL) != want_ok)
        fail_msg("jansson %s (the test's expectation is wrong): %.*s", j ? "accepts" : "rejects",
                 (int)len, buf);
    if (rc)
        assert_non_null(s.err_text);
    json_decref(j);
    baton_json_scan_free(&s);
}

static void expect(const char *text, int want_ok)
{
    expect_n(text, strlen(text), want_ok);
}

static void test_grammar(void **state)
{
    (void)state;
    static const char *const good[] = {
        "{}",
        "[]",
        " {\"a\":1} \r\n\t",
        "\"x\"",
        "0",
        "-0",
        "1.5",
        "1e5",
        "1E+5",
        "-1.25e-3",
        "true",
        "false",
        "null",
        "[1,[2,{\"a\":[null]}]]",
        "{\"a\":{},\"b\":[]}",
        "\"\"",
    };
    static const char *const bad[] = {
        "",        " ",
        "{",       "}",
        "[1,]",    "{\"a\":1,}",
        "{\"a\"}", "{1:2}",
        "{'a':1}", "01",
        "1.",      ".5",
        "1e",      "+1",
        "-",       "--1",
        "tru",     "truex",
        "nul",     "True",
        "[1 2]",   "{} x",
        "{}{}",    "[1]]",
        "\"a",     "{\"a\" 1}",
        "NaN",     "Infinity",
        "0x10",    "1.e5",
        "[,1]",    "{,}",
        "/**/{}",  "{\"a\":1 \"b\":2}",
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(*good); i++)
        expect(good[i], 1);
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++)
        expect(bad[i], 0);
}

static void test_strings(void **state)
{
    (void)state;
    expect("\"\\\" \\\\ \\/ \\b \\f \\n \\r \\t\"", 1);
    expect("\"\\u0041\\u00e9\\u20AC\"", 1);
    expect("\"\\ud83d\\ude00\"", 1); /* a surrogate pair */
    expect("\"\\ud83d\"", 0);        /* a high surrogate alone */
    expect("\"\\ud83dx\"", 0);
    expect("\"\\ud83d\\u0041\"", 0); /* followed by something else */
    expect("\"\\ude00\"", 0);        /* a low surrogate alone */
    expect("\"\\u0000\"", 0);        /* no JSON_ALLOW_NUL */
    expect("{\"a\\u0000b\":1}", 0);  /* nor in keys */
    expect("\"\\u12\"", 0);
    expect("\"\\u12G4\"", 0);
    expect("\"\\x\"", 0);
    expect("\"\\'\"", 0);
    expect("\"a\tb\"", 0); /* raw control characters */
    expect("\"a\nb\"", 0);
    expect("\"\x7f\"", 1); /* DEL is not a control character for JSON */
}

static void test_utf8(void **state)
{
    (void)state;
    expect("\"\xc3\xa9\"", 1);         /* é */
    expect("\"\xe2\x82\xac\"", 1);     /* € */
    expect("\"\xf0\x9f\x98\x80\"", 1); /* U+1F600 */
    expect("\"\xf4\x8f\xbf\xbf\"", 1); /* U+10FFFF */
    expect("\"\xc0\xaf\"", 0);         /* overlong '/' */
    expect("\"\xc1\xbf\"", 0);         /* overlong */
    expect("\"\xe0\x80\xaf\"", 0);     /* overlong, 3 bytes */
    expect("\"\xf0\x80\x80\xaf\"", 0); /* overlong, 4 bytes */
    expect("\"\xed\xa0\x80\"", 0);     /* an encoded surrogate */
    expect("\"\xf4\x90\x80\x80\"", 0); /* above U+10FFFF */
    expect("\"\xf5\x80\x80\x80\"", 0);
    expect("\"\xff\"", 0);
    expect("\"\x80\"", 0); /* a stray continuation byte */
    expect("\"\xc3\"", 0); /* truncated */
    expect("\"\xe2\x82\"", 0);
    expect("\"\xc3\x41\"", 0);      /* a missing continuation byte */
    expect("\xc3\xa9", 0);          /* outside a string */
    expect("{\"k\xc3\xa9\":1}", 1); /* in a key */
    expect("{\"k\xed\xa0\x80\":1}", 0);
}

static void test_numbers(void **state)
{
    (void)state;
    expect("9223372036854775807", 1);
    expect("9223372036854775808", 0); /* too big integer */
    expect("-9223372036854775808", 1);
    expect("-9223372036854775809", 0);
    expect("99999999999999999999", 0);
    expect("9223372036854775808.0", 1); /* a real: no integer limit */
    expect("1e308", 1);
    expect("1.7976931348623157e308", 1);
    expect("1.7976931348623159e308", 0); /* rounds past DBL_MAX */
    expect("1e309", 0);                  /* real number overflow */
    expect("-1e309", 0);
    expect("0.1e310", 0);
    expect("1000e306", 0);
    expect("1e-400", 1); /* underflow passes */
    expect("0e999999", 1);
    expect("0.000e99999999999999", 1);
    expect("1e99999999999999999999", 0);
    expect("0.00001e310", 1);
}

static void test_depth(void **state)
{
    (void)state;
    /* jansson counts every value: 2048 nested empty arrays pass, 2048 around a scalar do not. */
    size_t n = 2049;
    char *b = malloc(2 * n + 2);
    assert_non_null(b);
    for (size_t d = 2047; d <= 2049; d++) {
        memset(b, '[', d);
        memset(b + d, ']', d);
        expect_n(b, 2 * d, d <= 2048);
        memset(b, '[', d);
        b[d] = '1';
        memset(b + d + 1, ']', d);
        expect_n(b, 2 * d + 1, d <= 2047);
    }
    free(b);
    /* objects count the same */
    char *deep = malloc(6 * 2050);
    size_t len = 0;
    assert_non_null(deep);
    for (int i = 0; i < 2047; i++) {
        memcpy(deep + len, "{\"\":", 4);
        len += 4;
    }
    deep[len++] = '1';
    memset(deep + len, '}', 2047);
    expect_n(deep, len + 2047, 1); /* 2047 objects and the scalar: depth 2048 */
    memmove(deep + 4, deep, len + 2047);
    memcpy(deep, "{\"\":", 4);
    deep[len + 4 + 2047] = '}';
    expect_n(deep, len + 4 + 2048, 0);
    free(deep);
}

static void test_nul_bytes(void **state)
{
    (void)state;
    /* jansson loses ONE NUL right after a number or literal (its look-ahead push-back). */
    expect_n("0\0", 2, 1);
    expect_n("[1\0]", 4, 1);
    expect_n("true\0 ", 6, 1);
    expect_n("{\"a\":null\0}", 11, 1);
    expect_n("0\0\0", 3, 0);
    expect_n("0\0x", 3, 0);
    expect_n("{}\0", 3, 0);
    expect_n("\"a\"\0", 4, 0);
    expect_n("\0{}", 3, 0);
    expect_n("\"a\0\"", 4, 0);
    expect_n("[1,\0]", 5, 0);
    expect_n("{\0}", 3, 0);

    /* the readers and the splice step over it */
    static const char body[] = "{\"a\":12\0,\"b\":true}";
    baton_json_scan_t s;
    baton_json_scan_init(&s, NULL, 0);
    assert_int_equal(baton_json_scan(&s, body, sizeof(body) - 1), 0);
    assert_int_equal(s.n_members, 2);
    assert_int_equal(s.members[0].val.len, 2);
    assert_int_equal(baton_json_int(&s.members[0].val), 12);
    baton_json_iter_t it;
    baton_json_val_t k, v;
    baton_json_iter_init(&it, &s.root);
    assert_true(baton_json_object_next(&it, &k, &v));
    assert_int_equal(v.len, 2);
    assert_true(baton_json_object_next(&it, &k, &v));
    assert_true(baton_json_str_eq(&k, "b"));
    assert_int_equal(v.type, BATON_JSON_TRUE);
    baton_json_splice_t sp;
    baton_buf_t out = BATON_BUF_INIT;
    assert_int_equal(baton_json_splice(&s, NULL, 0, "}", 1, &sp), 0);
    assert_int_equal(baton_json_splice_flatten(&sp, &out), 0);
    assert_string_equal(out.data, "{\"a\":12,\"b\":true}");
    assert_int_equal(out.len, strlen(out.data));
    baton_json_splice_free(&sp);
    baton_buf_free(&out);
    baton_json_scan_free(&s);
}

static void test_members_and_duplicates(void **state)
{
    (void)state;
    baton_json_member_t space[2];
    baton_json_scan_t s;
    const char *body = "{\"a\":1,\"s\\u0074ream\":true,\"a\":[1,2],\"n\":null,\"o\":{\"x\":1,"
                       "\"x\":\"last\"},\"r\":2.5}";
    baton_json_scan_init(&s, space, 2);
    assert_int_equal(baton_json_scan(&s, body, strlen(body)), 0);
    assert_int_equal(s.root.type, BATON_JSON_OBJECT);
    assert_int_equal(s.n_members, 6); /* duplicates kept, grown past the caller's space */
    const baton_json_member_t *m = baton_json_scan_get(&s, "a");
    assert_non_null(m);
    assert_int_equal(m->val.type, BATON_JSON_ARRAY); /* the last one wins */
    assert_int_equal(baton_json_array_size(&m->val), 2);
    m = baton_json_scan_get(&s, "stream"); /* compared decoded */
    assert_non_null(m);
    assert_int_equal(m->val.type, BATON_JSON_TRUE);
    assert_null(baton_json_scan_get(&s, "missing"));
    assert_int_equal(baton_json_scan_get(&s, "n")->val.type, BATON_JSON_NULL);
    assert_int_equal(baton_json_scan_get(&s, "r")->val.type, BATON_JSON_REAL);
    assert_true(baton_json_number(&baton_json_scan_get(&s, "r")->val) == 2.5);
    baton_json_val_t x;
    assert_true(baton_json_object_get(&baton_json_scan_get(&s, "o")->val, "x", &x));
    assert_true(baton_json_str_eq(&x, "last"));
    assert_false(baton_json_object_get(&baton_json_scan_get(&s, "o")->val, "y", &x));
    baton_json_scan_free(&s);

    /* a non-object root has no members */
    baton_json_scan_init(&s, space, 2);
    assert_int_equal(baton_json_scan(&s, "[1,2]", 5), 0);
    assert_int_equal(s.n_members, 0);
    assert_int_equal(s.root.type, BATON_JSON_ARRAY);
    assert_int_equal(baton_json_scan(&s, "[1,", 3), BATON_EINVAL);
    assert_int_equal(s.err_pos, 3);
    baton_json_scan_free(&s);
}

static void test_readers(void **state)
{
    (void)state;
    const char *body = "[\"a\\\"b\\\\\", \"\\u00e9\\ud83d\\ude00\\n\", -42, 9223372036854775807,"
                       " -9223372036854775808, \"plain\", {\"k\":[1,{\"z\":\"]}\"}]}, 1e2]";
    baton_json_scan_t s;
    baton_json_scan_init(&s, NULL, 0);
    assert_int_equal(baton_json_scan(&s, body, strlen(body)), 0);
    assert_int_equal(baton_json_array_size(&s.root), 8);
    baton_json_iter_t it;
    baton_json_val_t v;
    baton_buf_t b = BATON_BUF_INIT;
    baton_json_iter_init(&it, &s.root);
    assert_true(baton_json_array_next(&it, &v));
    assert_int_equal(baton_json_str_append(&v, &b), 0);
    assert_string_equal(b.data, "a\"b\\");
    assert_int_equal(baton_json_str_len(&v), 4);
    assert_true(baton_json_str_eq(&v, "a\"b\\"));
    assert_false(baton_json_str_eq(&v, "a\"b"));
    assert_true(baton_json_array_next(&it, &v));
    baton_buf_reset(&b);
    assert_int_equal(baton_json_str_append(&v, &b), 0);
    assert_string_equal(b.data, "\xc3\xa9\xf0\x9f\x98\x80\n");
    assert_true(baton_json_str_eq(&v, "\xc3\xa9\xf0\x9f\x98\x80\n"));
    assert_true(baton_json_array_next(&it, &v));
    assert_int_equal(v.type, BATON_JSON_INTEGER);
    assert_int_equal(baton_json_int(&v), -42);
    assert_true(baton_json_array_next(&it, &v));
    assert_true(baton_json_int(&v) == INT64_MAX);
    assert_true(baton_json_array_next(&it, &v));
    assert_true(baton_json_int(&v) == INT64_MIN);
    assert_true(baton_json_array_next(&it, &v));
    assert_true(baton_json_str_eq(&v, "plain"));
    assert_true(baton_json_array_next(&it, &v));
    assert_int_equal(v.type, BATON_JSON_OBJECT); /* brackets inside strings do not count */
    baton_json_val_t k;
    assert_true(baton_json_object_get(&v, "k", &k));
    assert_int_equal(baton_json_array_size(&k), 2);
    assert_true(baton_json_array_next(&it, &v));
    assert_int_equal(v.type, BATON_JSON_REAL);
    assert_true(baton_json_number(&v) == 100.0);
    assert_false(baton_json_array_next(&it, &v));
    baton_buf_free(&b);
    baton_json_scan_free(&s);
}

/* Splices `body` and returns the flattened bytes (static buffer). */
static const char *spliced(const char *body, const char *const *drop, size_t n_drop,
                           const char *tail, size_t *n_segs)
{
    static baton_buf_t out = BATON_BUF_INIT;
    baton_json_scan_t s;
    baton_json_splice_t sp;
    baton_json_scan_init(&s, NULL, 0);
    assert_int_equal(baton_json_scan(&s, body, strlen(body)), 0);
    assert_int_equal(baton_json_splice(&s, drop, n_drop, tail, strlen(tail), &sp), 0);
    assert_int_equal(baton_json_splice_flatten(&sp, &out), 0);
    assert_int_equal(out.len, sp.total);
    *n_segs = sp.n;
    baton_json_splice_free(&sp);
    baton_json_scan_free(&s);
    return out.data;
}

static void test_splice(void **state)
{
    (void)state;
    static const char *const room[] = {"bootstrap_room", "bootstrap_host"};
    size_t n;
    /* nothing dropped: the body itself (to its last value) and the tail: two segments */
    assert_string_equal(spliced(" { \"a\" : 1 , \"b\":[2] } ", room, 2, ",\"x\":1}", &n),
                        "{ \"a\" : 1 , \"b\":[2],\"x\":1}");
    assert_int_equal(n, 2);
    /* dropped first, middle, last, and every duplicate, keys compared decoded */
    assert_string_equal(spliced("{\"bootstrap_room\":1,\"a\":1,\"bootstrap_\\u0068ost\":\"h\","
                                "\"b\":2,\"bootstrap_room\":[3]}",
                                room, 2, ",\"x\":1}", &n),
                        "{\"a\":1,\"b\":2,\"x\":1}");
    /* everything dropped: the tail's leading comma goes */
    assert_string_equal(spliced("{\"bootstrap_room\":1}", room, 2, ",\"x\":1}", &n), "{\"x\":1}");
    assert_string_equal(spliced("{}", room, 2, ",\"x\":1}", &n), "{\"x\":1}");
    assert_string_equal(spliced("{\"a\":1}", NULL, 0, "}", &n), "{\"a\":1}");
    /* many runs: more segments than the inline ones */
    assert_string_equal(spliced("{\"bootstrap_room\":0,\"a\":1,\"bootstrap_room\":0,\"b\":1,"
                                "\"bootstrap_room\":0,\"c\":1,\"bootstrap_room\":0,\"d\":1,"
                                "\"bootstrap_room\":0,\"e\":1,\"bootstrap_room\":0,\"f\":1,"
                                "\"bootstrap_room\":0,\"g\":1}",
                                room, 2, "}", &n),
                        "{\"a\":1,\"b\":1,\"c\":1,\"d\":1,\"e\":1,\"f\":1,\"g\":1}");
    assert_true(n > BATON_JSON_SPLICE_INLINE);

    /* refused: not an object, or a tail that does not close it */
    baton_json_scan_t s;
    baton_json_splice_t sp;
    baton_json_scan_init(&s, NULL, 0);
    assert_int_equal(baton_json_scan(&s, "[1]", 3), 0);
    assert_int_equal(baton_json_splice(&s, NULL, 0, "}", 1, &sp), BATON_EINVAL);
    assert_int_equal(baton_json_scan(&s, "{}", 2), 0);
    assert_int_equal(baton_json_splice(&s, NULL, 0, "x}", 2, &sp), BATON_EINVAL);
    baton_json_scan_free(&s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_grammar),
        cmocka_unit_test(test_strings),
        cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_depth),
        cmocka_unit_test(test_nul_bytes),
        cmocka_unit_test(test_members_and_duplicates),
        cmocka_unit_test(test_readers),
        cmocka_unit_test(test_splice),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
