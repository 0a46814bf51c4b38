/* test_token_bucket.c — common/token_bucket: burst, refill rate, the wait it reports, a clock
 * going backwards, idle buckets, and the "RPS[:BURST]" parser. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "common/token_bucket.h"

#define MS 1000000ull /* ns */

static void test_burst_then_refill(void **state)
{
    (void)state;
    baton_token_bucket_t tb;
    uint64_t t = 5000 * MS, wait = 0;
    baton_token_bucket_init(&tb, 3, t);
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t, &wait), 1);
    /* empty: 2 per second means one token in 500 ms */
    assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t, &wait), 0);
    assert_int_equal(wait, 500);
    assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t + 499 * MS, &wait), 0);
    assert_int_equal(wait, 1);
    assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t + 500 * MS, &wait), 1);
    assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t + 500 * MS, &wait), 0);
    /* a long idle time refills to the burst, not beyond */
    t += 3600000 * MS;
    assert_true(baton_token_bucket_full(&tb, 2.0, 3, t));
    for (int i = 0; i < 3; i++)
        assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t, NULL), 1);
    assert_int_equal(baton_token_bucket_take(&tb, 2.0, 3, t, NULL), 0);
    assert_false(baton_token_bucket_full(&tb, 2.0, 3, t));
}

static void test_steady_rate(void **state)
{
    (void)state;
    /* 10 requests per second offered 100 per second for 10 s: about 10 * 10 + burst pass. */
    baton_token_bucket_t tb;
    baton_token_bucket_init(&tb, 5, 0);
    int ok = 0;
    for (uint64_t t = 0; t < 10000 * MS; t += 10 * MS)
        ok += baton_token_bucket_take(&tb, 10.0, 5, t, NULL);
    assert_in_range(ok, 100, 105);
}

static void test_clock_backwards(void **state)
{
    (void)state;
    baton_token_bucket_t tb;
    baton_token_bucket_init(&tb, 1, 1000 * MS);
    assert_int_equal(baton_token_bucket_take(&tb, 1.0, 1, 1000 * MS, NULL), 1);
    /* an earlier time refills nothing and does not move last_ns back */
    assert_int_equal(baton_token_bucket_take(&tb, 1.0, 1, 10 * MS, NULL), 0);
    assert_int_equal(baton_token_bucket_take(&tb, 1.0, 1, 1999 * MS, NULL), 0);
    assert_int_equal(baton_token_bucket_take(&tb, 1.0, 1, 2000 * MS, NULL), 1);
}

static void test_parse(void **state)
{
    (void)state;
    double r = 0, b = 0;
    assert_int_equal(baton_token_bucket_parse("10", &r, &b), 0);
    assert_true(r == 10.0 && b == 10.0);
    assert_int_equal(baton_token_bucket_parse("2.5:7", &r, &b), 0);
    assert_true(r == 2.5 && b == 7.0);
    assert_int_equal(baton_token_bucket_parse("0.2", &r, &b), 0);
    assert_true(r == 0.2 && b == 1.0);
    const char *bad[] = {"", "0", "-1", "x", "1:", "1:0", "1:-2", "1:2x", "1x", " 1", "1:1.5",
                         "nan", "inf",
                         /* below one request per hour: waits no client would honour */
                         "1e-10", "1e-300", "0.0001"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
        r = b = -1;
        assert_int_equal(baton_token_bucket_parse(bad[i], &r, &b), -1);
        assert_true(r == -1 && b == -1); /* untouched on failure */
    }
}

/* The wait is rounded up to a whole millisecond, never 0, and stays finite at the slowest rate
 * the parser accepts (no float-to-integer overflow). */
static void test_wait_bounds(void **state)
{
    (void)state;
    double r = 0, b = 0;
    assert_int_equal(baton_token_bucket_parse(BATON_TOKEN_BUCKET_MIN_RATE_STR, &r, &b), 0);
    baton_token_bucket_t tb;
    baton_token_bucket_init(&tb, b, 0);
    uint64_t wait = 0;
    assert_int_equal(baton_token_bucket_take(&tb, r, b, 0, &wait), 1);
    assert_int_equal(baton_token_bucket_take(&tb, r, b, 0, &wait), 0);
    assert_true(wait >= 1 && wait <= (uint64_t)(1000.0 / r) + 1);
    /* a caller passing a rate below the parser's range still gets a bounded wait */
    baton_token_bucket_init(&tb, 1, 0);
    assert_int_equal(baton_token_bucket_take(&tb, 1e-300, 1, 0, NULL), 1);
    assert_int_equal(baton_token_bucket_take(&tb, 1e-300, 1, 0, &wait), 0);
    assert_true(wait >= 1 && wait <= BATON_TOKEN_BUCKET_MAX_WAIT_MS);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_burst_then_refill), cmocka_unit_test(test_steady_rate),
        cmocka_unit_test(test_clock_backwards),   cmocka_unit_test(test_parse),
        cmocka_unit_test(test_wait_bounds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
