/* health/backoff.c — exponential reconnect back-off with equal jitter. */
#include "health/backoff.h"

#include "common/rand.h"

void baton_backoff_init(baton_backoff_t *b, uint32_t min_ms, uint32_t max_ms, uint64_t seed)
{
    if (min_ms == 0)
        min_ms = 1;
    if (max_ms < min_ms)
        max_ms = min_ms;
    b->min_ms = min_ms;
    b->max_ms = max_ms;
    b->attempt = 0;
    b->rng = seed != 0 ? seed : BATON_GOLDEN_GAMMA;
}

uint64_t baton_backoff_rand(baton_backoff_t *b)
{
    return baton_xorshift64s(&b->rng);
}

uint32_t baton_backoff_next(baton_backoff_t *b)
{
    uint64_t cap = b->min_ms;
    /* 2^32 > any uint32 max_ms: stop doubling once capped so the shift never overflows. */
    for (uint32_t i = 0; i < b->attempt && cap < b->max_ms; i++)
        cap <<= 1;
    if (cap > b->max_ms)
        cap = b->max_ms;
    if (b->attempt < 64)
        b->attempt++;
    uint64_t half = cap / 2;
    uint64_t d = half + baton_backoff_rand(b) % (cap - half + 1);
    if (d < b->min_ms)
        d = b->min_ms;
    return (uint32_t)d;
}

void baton_backoff_reset(baton_backoff_t *b)
{
    b->attempt = 0;
}
