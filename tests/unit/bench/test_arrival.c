/* test_arrival.c — baton-bench PRNG and arrival processes: Poisson statistics, fixed rate. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "arrival.h"

static void test_rng_reproducible(void **state)
{
    bb_rng_t a, b, c;
    bb_rng_seed(&a, 7);
    bb_rng_seed(&b, 7);
    bb_rng_seed(&c, 8);
    int differ = 0;
    for (int i = 0; i < 1000; i++) {
        uint64_t x = bb_rng_u64(&a), y = bb_rng_u64(&b), z = bb_rng_u64(&c);
        assert_true(x == y);
        differ += x != z;
    }
    assert_true(differ > 990);
}

static void test_rng_double_and_range(void **state)
{
    bb_rng_t r;
    bb_rng_seed(&r, 1);
    int counts[10] = {0};
    for (int i = 0; i < 100000; i++) {
        double d = bb_rng_double(&r);
        assert_true(d >= 0.0 && d < 1.0);
        uint64_t k = bb_rng_range(&r, 5, 14);
        assert_true(k >= 5 && k <= 14);
        counts[k - 5]++;
    }
    /* Uniform over 10 values: chi-square with 9 degrees of freedom; 40 is far in the tail. */
    double chi = 0;
    for (int i = 0; i < 10; i++)
        chi += (counts[i] - 10000.0) * (counts[i] - 10000.0) / 10000.0;
    assert_true(chi < 40);
    assert_true(bb_rng_range(&r, 3, 3) == 3);
    (void)bb_rng_range(&r, 0, UINT64_MAX); /* the whole range must not loop forever */
}

/* Poisson arrivals: exponential gaps (mean 1/R, variance 1/R^2) and counts per window with
 * variance equal to their mean. Fixed seed; bounds are several standard errors wide. */
static void test_poisson_statistics(void **state)
{
    const double rate = 200.0;
    enum { N = 200000 };
    bb_arrival_t a;
    bb_arrival_init(&a, BB_ARRIVAL_POISSON, rate, 12345);
    double sum = 0, sq = 0;
    uint64_t t = 0;
    enum { WINDOWS = 1000 };
    static int per_window[WINDOWS]; /* 1 s windows */
    memset(per_window, 0, sizeof(per_window));
    for (int i = 0; i < N; i++) {
        uint64_t g = bb_arrival_next_gap_ns(&a);
        double s = (double)g / 1e9;
        sum += s;
        sq += s * s;
        t += g;
        uint64_t w = t / 1000000000ULL;
        if (w < WINDOWS)
            per_window[w]++;
    }
    double mean = sum / N;
    double var = sq / N - mean * mean;
    assert_true(fabs(mean - 1.0 / rate) / (1.0 / rate) < 0.02);
    assert_true(fabs(var - 1.0 / (rate * rate)) / (1.0 / (rate * rate)) < 0.05);

    /* The arrivals span ~1000 s; use the windows fully covered. */
    int full = (int)(t / 1000000000ULL);
    if (full > WINDOWS)
        full = WINDOWS;
    assert_true(full > 900);
    double cm = 0, cv = 0;
    for (int i = 0; i < full; i++)
        cm += per_window[i];
    cm /= full;
    for (int i = 0; i < full; i++)
        cv += (per_window[i] - cm) * (per_window[i] - cm);
    cv /= full - 1;
    assert_true(fabs(cm - rate) / rate < 0.02);
    /* Index of dispersion of a Poisson process is 1 (a fixed rate would give ~0). */
    assert_true(cv / cm > 0.8 && cv / cm < 1.2);
}

static void test_fixed_rate(void **state)
{
    bb_arrival_t a;
    bb_arrival_init(&a, BB_ARRIVAL_FIXED, 250.0, 1);
    for (int i = 0; i < 1000; i++)
        assert_true(bb_arrival_next_gap_ns(&a) == 4000000ULL);
}

static void test_poisson_same_seed_same_schedule(void **state)
{
    bb_arrival_t a, b;
    bb_arrival_init(&a, BB_ARRIVAL_POISSON, 10.0, 99);
    bb_arrival_init(&b, BB_ARRIVAL_POISSON, 10.0, 99);
    for (int i = 0; i < 100; i++)
        assert_true(bb_arrival_next_gap_ns(&a) == bb_arrival_next_gap_ns(&b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rng_reproducible),
        cmocka_unit_test(test_rng_double_and_range),
        cmocka_unit_test(test_poisson_statistics),
        cmocka_unit_test(test_fixed_rate),
        cmocka_unit_test(test_poisson_same_seed_same_schedule),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
