/* test_retry.c — retry classification, jittered exponential back-off bounds, count and time
 * budget decisions. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "baton/error.h"
#include "router/dataplane/retry.h"

static void test_classify(void **state)
{
    /* transport failures of a worker that could not serve */
    assert_int_equal(baton_retry_classify(BATON_ECONNECT, 0), BATON_RETRY_CONNECT);
    assert_int_equal(baton_retry_classify(BATON_ETIMEOUT_CONNECT, 0), BATON_RETRY_CONNECT);
    assert_int_equal(baton_retry_classify(BATON_EEOF, 0), BATON_RETRY_CLOSED);
    assert_int_equal(baton_retry_classify(BATON_ECLOSED, 0), BATON_RETRY_CLOSED);
    assert_int_equal(baton_retry_classify(BATON_EUPSTREAM, 0), BATON_RETRY_CLOSED);
    assert_int_equal(baton_retry_classify(BATON_ETIMEOUT_FIRST_BYTE, 0), BATON_RETRY_TIMEOUT);
    assert_int_equal(baton_retry_classify(BATON_ETIMEOUT_IDLE, 0), BATON_RETRY_TIMEOUT);
    assert_int_equal(baton_retry_classify(BATON_ESHUTDOWN, 0), BATON_RETRY_DRAINED);
    /* a transport error wins over a status seen before it */
    assert_int_equal(baton_retry_classify(BATON_EEOF, 200), BATON_RETRY_CLOSED);
    /* never: the whole-request deadline, our own cancels and errors */
    assert_int_equal(baton_retry_classify(BATON_ETIMEOUT_TOTAL, 0), BATON_RETRY_NO);
    assert_int_equal(baton_retry_classify(BATON_ECANCELED, 0), BATON_RETRY_NO);
    assert_int_equal(baton_retry_classify(BATON_ENOMEM, 0), BATON_RETRY_NO);
    assert_int_equal(baton_retry_classify(BATON_ETOOBIG, 0), BATON_RETRY_NO);
    assert_int_equal(baton_retry_classify(BATON_EINVAL, 0), BATON_RETRY_NO);
    /* statuses: exactly 408, 429, 500, 502, 503, 504 */
    int yes[] = {408, 429, 500, 502, 503, 504};
    for (size_t i = 0; i < sizeof(yes) / sizeof(*yes); i++)
        assert_int_equal(baton_retry_classify(0, yes[i]), BATON_RETRY_STATUS);
    int no[] = {0, 200, 204, 301, 400, 401, 403, 404, 409, 413, 422, 501, 505, 599};
    for (size_t i = 0; i < sizeof(no) / sizeof(*no); i++)
        assert_int_equal(baton_retry_classify(0, no[i]), BATON_RETRY_NO);
    assert_string_equal(baton_retry_reason_name(BATON_RETRY_CONNECT), "connect");
    assert_string_equal(baton_retry_reason_name(BATON_RETRY_DRAINED), "drained");
    assert_string_equal(baton_retry_reason_name(BATON_RETRY_NO), "no");
}

static void test_backoff_bounds(void **state)
{
    baton_retry_policy_t p = {5, 100, 1000, 0};
    /* un-jittered: 100, 200, 400, 800, 1000, 1000 ...; drawn in [b/2, b] */
    uint64_t caps[] = {100, 200, 400, 800, 1000, 1000, 1000};
    for (unsigned k = 1; k <= 7; k++) {
        uint64_t lo = UINT64_MAX, hi = 0;
        for (uint64_t rnd = 0; rnd < 5000; rnd++) {
            uint64_t d = baton_retry_backoff_ms(&p, k, rnd * 0x9E3779B97F4A7C15ull);
            assert_true(d >= caps[k - 1] / 2 && d <= caps[k - 1]);
            lo = d < lo ? d : lo;
            hi = d > hi ? d : hi;
        }
        /* the jitter actually spreads over the range */
        assert_int_equal(lo, caps[k - 1] / 2);
        assert_int_equal(hi, caps[k - 1]);
    }
    /* huge retry counts do not overflow */
    assert_true(baton_retry_backoff_ms(&p, 4000000000u, 7) <= 1000);
    baton_retry_policy_t z = {5, 0, 0, 0};
    assert_int_equal(baton_retry_backoff_ms(&z, 3, 12345), 0);
    baton_retry_policy_t big = {5, UINT64_MAX / 4, UINT64_MAX, 0};
    assert_true(baton_retry_backoff_ms(&big, 10, 99) >= UINT64_MAX / 2);
}

static void test_plan(void **state)
{
    baton_retry_policy_t p = {2, 100, 1000, 0};
    uint64_t d = 0;
    assert_int_equal(baton_retry_plan(&p, 0, 0, UINT64_MAX, 100, 1, &d), BATON_RETRY_PLAN_GO);
    assert_true(d >= 50 && d <= 100);
    assert_int_equal(baton_retry_plan(&p, 1, 0, UINT64_MAX, 100, 1, &d), BATON_RETRY_PLAN_GO);
    assert_true(d >= 100 && d <= 200);
    /* the count */
    assert_int_equal(baton_retry_plan(&p, 2, 0, UINT64_MAX, 100, 1, &d),
                     BATON_RETRY_PLAN_EXHAUSTED);
    baton_retry_policy_t none = {0, 100, 1000, 0};
    assert_int_equal(baton_retry_plan(&none, 0, 0, UINT64_MAX, 100, 1, &d),
                     BATON_RETRY_PLAN_EXHAUSTED);
    /* the budget: the back-off must end within it */
    baton_retry_policy_t b = {10, 100, 100, 1000};
    assert_int_equal(baton_retry_plan(&b, 0, 800, UINT64_MAX, 0, 1, &d), BATON_RETRY_PLAN_GO);
    assert_int_equal(baton_retry_plan(&b, 0, 950, UINT64_MAX, 0, 0, &d),
                     BATON_RETRY_PLAN_GO); /* rnd 0 → 50 ms: ends at 1000 */
    assert_int_equal(baton_retry_plan(&b, 0, 960, UINT64_MAX, 0, 0, &d),
                     BATON_RETRY_PLAN_OUT_OF_TIME);
    assert_int_equal(baton_retry_plan(&b, 0, 5000, UINT64_MAX, 0, 1, &d),
                     BATON_RETRY_PLAN_OUT_OF_TIME);
    /* the request's deadline: an attempt needs min_left after its back-off */
    assert_int_equal(baton_retry_plan(&p, 0, 0, 1000, 100, 0, &d), BATON_RETRY_PLAN_GO);
    assert_int_equal(baton_retry_plan(&p, 0, 0, 140, 100, 0, &d),
                     BATON_RETRY_PLAN_OUT_OF_TIME); /* 50 ms back-off leaves 90 */
    assert_int_equal(baton_retry_plan(&p, 0, 0, 0, 0, 0, &d), BATON_RETRY_PLAN_OUT_OF_TIME);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_classify),
        cmocka_unit_test(test_backoff_bounds),
        cmocka_unit_test(test_plan),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
