/* rand.h — the small non-cryptographic generators Baton uses (splitmix64, xoshiro256**,
 * xorshift64*), one definition each. */
#ifndef BATON_COMMON_RAND_H
#define BATON_COMMON_RAND_H

#include <stdint.h>

/*
 * Pure functions on caller-owned state: no locks, no globals. Callers keep one state per
 * thread (or guard it themselves) and decide how to seed it. None of these is fit for secrets;
 * they draw jitter, policy choices, bootstrap rooms and reproducible test data.
 */

#define BATON_GOLDEN_GAMMA 0x9E3779B97F4A7C15ull /* splitmix64's increment */

/* splitmix64's output function (a bijection that mixes every bit into every other). */
static inline uint64_t baton_mix64(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* splitmix64: advances *x and returns the next value. */
static inline uint64_t baton_splitmix64(uint64_t *x)
{
    return baton_mix64(*x += BATON_GOLDEN_GAMMA);
}

static inline uint64_t baton_rotl64(uint64_t x, int k)
{
    return (x << k) | (x >> (64 - k));
}

/* xoshiro256** state from one 64-bit seed (through splitmix64, so any seed will do). */
static inline void baton_xoshiro_seed(uint64_t s[4], uint64_t seed)
{
    for (int i = 0; i < 4; i++)
        s[i] = baton_splitmix64(&seed);
}

/* xoshiro256**: the next value. */
static inline uint64_t baton_xoshiro_next(uint64_t s[4])
{
    uint64_t result = baton_rotl64(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = baton_rotl64(s[3], 45);
    return result;
}

/* xorshift64*: one word of state, which must never be 0. */
static inline uint64_t baton_xorshift64s(uint64_t *x)
{
    uint64_t v = *x;
    v ^= v >> 12;
    v ^= v << 25;
    v ^= v >> 27;
    *x = v;
    return v * 0x2545F4914F6CDD1Dull;
}

/* A uniform double in [0, 1) from the top 53 bits of x. */
static inline double baton_unit_double(uint64_t x)
{
    return (double)(x >> 11) * 0x1.0p-53;
}

#endif
