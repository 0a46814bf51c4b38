/* common/hash.h — Baton's one non-cryptographic hash, FNV-1a (64- and 32-bit), and the integer
 * mixer its hash tables use; one definition each. */
#ifndef BATON_COMMON_HASH_H
#define BATON_COMMON_HASH_H

#include <stddef.h>
#include <stdint.h>

/*
 * Pure inline functions, safe from any thread. FNV-1a because its values are stable across
 * builds, hosts and languages: worker ids (the registry), the simulated engine's text seeds
 * (src/worker/simtext.c, mirrored by tests/integration/simtext.py) and metric label sets all
 * depend on that. Not fit for anything an attacker chooses the input of and then profits from
 * collisions; hash tables keyed that way must bound their chains.
 *
 * Incremental use: h = BATON_FNV1A64_INIT, then h = baton_fnv1a64_add(h, ...) per piece (or
 * baton_fnv1a64_step(h, v) for one value), and h is the hash of the concatenation.
 */

#define BATON_FNV1A64_INIT  0xcbf29ce484222325ull /* the offset basis */
#define BATON_FNV1A64_PRIME 0x100000001b3ull
#define BATON_FNV1A32_INIT  2166136261u
#define BATON_FNV1A32_PRIME 16777619u

/* One FNV-1a step: xor in v (a byte for standard FNV-1a), multiply by the prime. */
static inline uint64_t baton_fnv1a64_step(uint64_t h, uint64_t v)
{
    return (h ^ v) * BATON_FNV1A64_PRIME;
}

static inline uint32_t baton_fnv1a32_step(uint32_t h, uint32_t v)
{
    return (h ^ v) * BATON_FNV1A32_PRIME;
}

/* Continues h over len bytes. */
static inline uint64_t baton_fnv1a64_add(uint64_t h, const void *data, size_t len)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < len; i++)
        h = baton_fnv1a64_step(h, p[i]);
    return h;
}

/* Continues h over the bytes of a NUL-terminated string (the NUL not included). */
static inline uint64_t baton_fnv1a64_add_str(uint64_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = baton_fnv1a64_step(h, *p);
    return h;
}

static inline uint32_t baton_fnv1a32_add_str(uint32_t h, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++)
        h = baton_fnv1a32_step(h, *p);
    return h;
}

/* FNV-1a 64 of len bytes. */
static inline uint64_t baton_fnv1a64(const void *data, size_t len)
{
    return baton_fnv1a64_add(BATON_FNV1A64_INIT, data, len);
}

/* A bucket index source for integer and pointer keys: the first half of murmur3's fmix64, which
 * spreads the high bits into the low ones a power-of-two mask keeps. */
static inline uint64_t baton_hash_u64(uint64_t k)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdull;
    k ^= k >> 33;
    return k;
}

#endif
