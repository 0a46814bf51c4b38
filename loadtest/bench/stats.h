/* stats.h — baton-bench statistics: numpy-style percentiles and per-metric summaries. */
#ifndef BATON_BENCH_STATS_H
#define BATON_BENCH_STATS_H

#include <stddef.h>

/*
 * Percentile p (0..100) of an ascending array, with numpy.percentile's default "linear"
 * interpolation (the one SGLang's bench_serving and vLLM's bench serve use): position
 * p/100 * (n-1), interpolated between its two neighbours. n must be >= 1.
 */
double bb_percentile_sorted(const double *sorted, size_t n, double p);

typedef struct bb_summary_s {
    size_t n;
    double mean, std; /* std: population standard deviation (numpy.std's default) */
    double min, p50, p90, p99, max;
} bb_summary_t;

/* Sorts v in place and summarises it; n == 0 gives an all-zero summary with n = 0. */
void bb_summarize(double *v, size_t n, bb_summary_t *out);

/* A growable array of doubles; the owner frees it with bb_vec_free. */
typedef struct bb_vec_s {
    double *v;
    size_t n, cap;
} bb_vec_t;

/* 0 or BATON_ENOMEM. */
int bb_vec_push(bb_vec_t *vec, double x);
void bb_vec_free(bb_vec_t *vec);

#endif
