/* arrival.h — baton-bench randomness: a seeded PRNG and the open-loop arrival processes. */
#ifndef BATON_BENCH_ARRIVAL_H
#define BATON_BENCH_ARRIVAL_H

#include <stdint.h>

/* xoshiro256** seeded through splitmix64: fast, reproducible for a given seed. */
typedef struct bb_rng_s {
    uint64_t s[4];
} bb_rng_t;

void bb_rng_seed(bb_rng_t *r, uint64_t seed);
uint64_t bb_rng_u64(bb_rng_t *r);
/* Uniform in [0, 1). */
double bb_rng_double(bb_rng_t *r);
/* Uniform integer in [lo, hi] (lo <= hi). */
uint64_t bb_rng_range(bb_rng_t *r, uint64_t lo, uint64_t hi);
/* Exponentially distributed with the given rate (> 0): mean 1/rate. */
double bb_rng_exp(bb_rng_t *r, double rate);

typedef enum {
    BB_ARRIVAL_POISSON = 0, /* exponential gaps, mean 1/rate (what bench_serving does) */
    BB_ARRIVAL_FIXED,       /* constant gap 1/rate */
} bb_arrival_kind_t;

typedef struct bb_arrival_s {
    bb_arrival_kind_t kind;
    double rate; /* requests per second, > 0 */
    bb_rng_t rng;
} bb_arrival_t;

void bb_arrival_init(bb_arrival_t *a, bb_arrival_kind_t kind, double rate, uint64_t seed);
/* Gap to the next arrival, in nanoseconds. */
uint64_t bb_arrival_next_gap_ns(bb_arrival_t *a);

#endif
