/* arrival.c — xoshiro256** PRNG and Poisson / fixed-rate arrival gaps. */
#include "arrival.h"

#include <math.h>

static uint64_t splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static inline uint64_t rotl(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

void bb_rng_seed(bb_rng_t *r, uint64_t seed)
{
    uint64_t x = seed;
    for (int i = 0; i < 4; i++)
        r->s[i] = splitmix64(&x);
}

uint64_t bb_rng_u64(bb_rng_t *r)
{
    uint64_t *s = r->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double bb_rng_double(bb_rng_t *r)
{
    return (double)(bb_rng_u64(r) >> 11) * 0x1.0p-53;
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
