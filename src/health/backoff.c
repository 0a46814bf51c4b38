/* health/backoff.c — the jittered exponential back-off, and the reconnect back-off on it. */
#include "health/backoff.h"

#include "common/rand.h"

#include <math.h>

uint64_t baton_backoff_cap(uint64_t base_ms, uint64_t max_ms, unsigned n)
{
    uint64_t c = base_ms;
    /* Stops doubling once capped, so a huge n costs at most 64 rounds. */
    for (unsigned i = 0; i < n && c < max_ms && c != 0; i++)
        c = c > UINT64_MAX / 2 ? UINT64_MAX : c * 2;
    return c < max_ms ? c : max_ms;
}

uint64_t baton_backoff_jitter(uint64_t cap, double jitter, uint64_t rnd)
{
    if (!(jitter > 0)) /* also NaN */
        return cap;
    if (jitter > 1)
        jitter = 1;
    /* The offset is rounded up and the bound taken from cap, so cap/2 rounds down exactly at
     * 0.5 even where a double cannot hold cap. */
    double off_d = ceil((double)cap * jitter);
    uint64_t off = off_d >= (double)cap ? cap : (uint64_t)off_d;
    uint64_t lo = cap - off;
    uint64_t span = cap - lo; /* the draw is in [lo, cap] */
    return lo + (span == UINT64_MAX ? rnd : rnd % (span + 1));
}

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

/* A uniform 64-bit draw from the back-off's own generator (its jitter). */
static uint64_t backoff_rand(baton_backoff_t *b)
{
    return baton_xorshift64s(&b->rng);
}

uint32_t baton_backoff_next(baton_backoff_t *b)
{
    uint64_t cap = baton_backoff_cap(b->min_ms, b->max_ms, b->attempt);
    if (b->attempt < 64)
        b->attempt++;
    uint64_t d = baton_backoff_jitter(cap, BATON_BACKOFF_EQUAL_JITTER, backoff_rand(b));
    if (d < b->min_ms)
        d = b->min_ms;
    return (uint32_t)d;
}

void baton_backoff_reset(baton_backoff_t *b)
{
    b->attempt = 0;
}
