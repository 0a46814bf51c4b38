/* arrival.c — the bench RNG (xoshiro256** from common/rand.h) and Poisson / fixed-rate arrival
 * gaps. */
#include "arrival.h"

#include <math.h>

#include "common/rand.h"

void bb_rng_seed(bb_rng_t *r, uint64_t seed)
{
    baton_xoshiro_seed(r->s, seed);
}

uint64_t bb_rng_u64(bb_rng_t *r)
{
    return baton_xoshiro_next(r->s);
}

double bb_rng_double(bb_rng_t *r)
{
    return baton_unit_double(bb_rng_u64(r));
}

uint64_t bb_rng_range(bb_rng_t *r, uint64_t lo, uint64_t hi)
{
    uint64_t span = hi - lo + 1;
    if (span == 0) /* the whole 64-bit range */
        return bb_rng_u64(r);
    /* Rejection removes the modulo bias. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % span;
    uint64_t x;
    do {
        x = bb_rng_u64(r);
    } while (x >= limit);
    return lo + x % span;
}

double bb_rng_exp(bb_rng_t *r, double rate)
{
    /* 1 - u is in (0, 1], so the log is finite. */
    return -log(1.0 - bb_rng_double(r)) / rate;
}

void bb_arrival_init(bb_arrival_t *a, bb_arrival_kind_t kind, double rate, uint64_t seed)
{
    a->kind = kind;
    a->rate = rate;
    bb_rng_seed(&a->rng, seed);
}

uint64_t bb_arrival_next_gap_ns(bb_arrival_t *a)
{
    double gap_s = a->kind == BB_ARRIVAL_FIXED ? 1.0 / a->rate : bb_rng_exp(&a->rng, a->rate);
    double ns = gap_s * 1e9;
    if (ns > 1e18)
        ns = 1e18;
    return (uint64_t)ns;
}
