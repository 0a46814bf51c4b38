/* test_stats.c — baton-bench percentiles against numpy's default (linear) definition, summaries. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>

#include "arrival.h"
#include "stats.h"

#define EPS 1e-9

/* Values numpy.percentile gives (method="linear", the default). */
static void test_percentile_numpy_values(void **state)
{
    double a[100];
    for (int i = 0; i < 100; i++)
        a[i] = i + 1;
    /* np.percentile(np.arange(1, 101), [0, 50, 90, 99, 100]) */
    assert_true(fabs(bb_percentile_sorted(a, 100, 0) - 1.0) < EPS);
    assert_true(fabs(bb_percentile_sorted(a, 100, 50) - 50.5) < EPS);
    assert_true(fabs(bb_percentile_sorted(a, 100, 90) - 90.1) < EPS);
    assert_true(fabs(bb_percentile_sorted(a, 100, 99) - 99.01) < EPS);
    assert_true(fabs(bb_percentile_sorted(a, 100, 100) - 100.0) < EPS);

    /* np.percentile([1, 2, 3, 4], [50, 90, 99]) -> 2.5, 3.7, 3.97 */
    double b[] = {1, 2, 3, 4};
    assert_true(fabs(bb_percentile_sorted(b, 4, 50) - 2.5) < EPS);
    assert_true(fabs(bb_percentile_sorted(b, 4, 90) - 3.7) < EPS);
    assert_true(fabs(bb_percentile_sorted(b, 4, 99) - 3.97) < EPS);

    /* np.percentile([15, 20, 35, 40, 50], 40) -> 29.0 */
    double c[] = {15, 20, 35, 40, 50};
    assert_true(fabs(bb_percentile_sorted(c, 5, 40) - 29.0) < EPS);

    /* One sample: every percentile is that sample. */
    double d[] = {7.25};
    assert_true(fabs(bb_percentile_sorted(d, 1, 50) - 7.25) < EPS);
    assert_true(fabs(bb_percentile_sorted(d, 1, 99) - 7.25) < EPS);

    /* Two samples: straight line between them. */
    double e[] = {10, 20};
    assert_true(fabs(bb_percentile_sorted(e, 2, 99) - 19.9) < EPS);
}

static void test_summary_sorts_and_describes(void **state)
{
    /* Unsorted; mean 5, population std 2 (numpy.std default ddof=0). */
    double v[] = {9, 4, 2, 5, 4, 7, 4, 5};
    bb_summary_t s;
    bb_summarize(v, 8, &s);
    assert_int_equal(s.n, 8);
    assert_true(fabs(s.mean - 5.0) < EPS);
    assert_true(fabs(s.std - 2.0) < EPS);
    assert_true(fabs(s.min - 2.0) < EPS);
    assert_true(fabs(s.max - 9.0) < EPS);
    /* sorted: 2 4 4 4 5 5 7 9; p50 at 3.5 -> 4.5; p90 at 6.3 -> 7 + 0.3*2 = 7.6 */
    assert_true(fabs(s.p50 - 4.5) < EPS);
    assert_true(fabs(s.p90 - 7.6) < EPS);
    assert_true(fabs(s.p99 - (7 + 0.93 * 2)) < EPS);
    for (int i = 1; i < 8; i++)
        assert_true(v[i - 1] <= v[i]);

    bb_summarize(NULL, 0, &s);
    assert_int_equal(s.n, 0);
    assert_true(s.mean == 0 && s.p99 == 0);
}

/* Percentiles of a large exponential sample land on the distribution's quantiles. */
static void test_exponential_quantiles(void **state)
{
    enum { N = 200000 };
    double *v = malloc(N * sizeof(*v));
    assert_non_null(v);
    bb_rng_t r;
    bb_rng_seed(&r, 42);
    for (int i = 0; i < N; i++)
        v[i] = bb_rng_exp(&r, 1.0);
    bb_summary_t s;
    bb_summarize(v, N, &s);
    /* Quantile q of Exp(1) is -ln(1-q); loose bounds (the sampling error is far smaller). */
    assert_true(fabs(s.p50 - log(2.0)) < 0.02);
    assert_true(fabs(s.p90 - log(10.0)) < 0.05);
    assert_true(fabs(s.p99 - log(100.0)) < 0.15);
    assert_true(fabs(s.mean - 1.0) < 0.02);
    assert_true(fabs(s.std - 1.0) < 0.03);
    free(v);
}

static void test_vec_grows(void **state)
{
    bb_vec_t v = {0};
    for (int i = 0; i < 10000; i++)
        assert_int_equal(bb_vec_push(&v, i), 0);
    assert_int_equal(v.n, 10000);
    assert_true(v.v[9999] == 9999.0);
    bb_vec_free(&v);
    assert_null(v.v);
    assert_int_equal(v.n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_percentile_numpy_values),
        cmocka_unit_test(test_summary_sorts_and_describes),
        cmocka_unit_test(test_exponential_quantiles),
        cmocka_unit_test(test_vec_grows),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
