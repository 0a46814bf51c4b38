/* test_buf_rand.c — baton_buf's JSON string literal and the generators of common/rand.h. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "common/buf.h"
#include "common/rand.h"

static void expect_json(const char *in, size_t len, const char *want)
{
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_buf_append(&b, "x", 1), 0);
    assert_int_equal(baton_buf_append_json_string(&b, in, len), 0);
    assert_int_equal(b.len, strlen(want) + 1);
    assert_string_equal(b.data + 1, want);
    baton_buf_free(&b);
}

static void test_json_string(void **state)
{
    (void)state;
    expect_json("", 0, "\"\"");
    expect_json("plain text", 10, "\"plain text\"");
    expect_json("a\"b\\c", 5, "\"a\\\"b\\\\c\"");
    expect_json("l1\nl2\r\t", 7, "\"l1\\nl2\\r\\t\"");
    expect_json("\x01\x1f"
                "e",
                3, "\"\\u0001\\u001fe\"");
    expect_json("caf\xc3\xa9", 5, "\"caf\xc3\xa9\""); /* UTF-8 passes as it is */
    expect_json("a\0b", 3, "\"a\\u0000b\"");          /* the length counts, not the NUL */
}

/* Reference values computed independently (Python) from the published algorithms. */
/* The hand-made number formatting of the HTTP heads agrees with printf at the edges. */
static void test_fmt_uint(void **state)
{
    (void)state;
    static const uint64_t vals[] = {
        0, 1, 9, 10, 15, 16, 255, 1000, 0x800000, UINT32_MAX, (uint64_t)UINT32_MAX + 1, UINT64_MAX};
    for (size_t i = 0; i < sizeof(vals) / sizeof(*vals); i++) {
        char got[21], want[32];
        size_t n = baton_fmt_uint(got, vals[i], 10);
        got[n] = '\0';
        snprintf(want, sizeof(want), "%llu", (unsigned long long)vals[i]);
        assert_string_equal(got, want);
        n = baton_fmt_uint(got, vals[i], 16);
        got[n] = '\0';
        snprintf(want, sizeof(want), "%llx", (unsigned long long)vals[i]);
        assert_string_equal(got, want);
    }
    baton_buf_t b = BATON_BUF_INIT;
    assert_int_equal(baton_buf_append_str(&b, "Content-Length: "), 0);
    assert_int_equal(baton_buf_append_uint(&b, 1234567), 0);
    assert_int_equal(b.len, strlen("Content-Length: 1234567"));
    assert_memory_equal(b.data, "Content-Length: 1234567", b.len);
    baton_buf_free(&b);
}

static void test_generators(void **state)
{
    (void)state;
    uint64_t x = 0;
    assert_true(baton_splitmix64(&x) == 0xe220a8397b1dcdafull);
    assert_true(baton_splitmix64(&x) == 0x6e789e6aa1b965f4ull);
    assert_true(baton_splitmix64(&x) == 0x06c45d188009454full);

    uint64_t s[4];
    baton_xoshiro_seed(s, 42);
    assert_true(baton_xoshiro_next(s) == 0x15780b2e0c2ec716ull);
    assert_true(baton_xoshiro_next(s) == 0x6104d9866d113a7eull);
    assert_true(baton_xoshiro_next(s) == 0xae17533239e499a1ull);

    uint64_t r = 1;
    assert_true(baton_xorshift64s(&r) == 0x47e4ce4b896cdd1dull);
    assert_true(baton_xorshift64s(&r) == 0xabcfa6a8e079651dull);
    assert_true(baton_xorshift64s(&r) == 0xb9d10d8feb731f57ull);

    assert_true(baton_unit_double(0) == 0.0);
    assert_true(baton_unit_double(UINT64_MAX) < 1.0);
    assert_true(baton_unit_double((uint64_t)1 << 63) == 0.5);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_json_string),
        cmocka_unit_test(test_fmt_uint),
        cmocka_unit_test(test_generators),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
