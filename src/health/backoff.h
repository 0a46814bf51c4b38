/* health/backoff.h — Baton's one jittered exponential back-off (pure; the caller owns time and
 * the random bits), and the reconnect back-off built on it. */
#ifndef BATON_HEALTH_BACKOFF_H
#define BATON_HEALTH_BACKOFF_H

#include <stdint.h>

/*
 * The one implementation behind every back-off in Baton: peers' reconnects (baton_backoff_t
 * below), the router's retries (router/dataplane/retry.c) and the breakers' cool-downs
 * (health/breaker.c). Each keeps its own parameters; the arithmetic lives here once. Pure
 * functions, any thread.
 *
 * baton_backoff_cap(): the un-jittered delay of attempt n (n = 0 is the first):
 *   min(base_ms * 2^n, max_ms), saturating, never overflowing (base_ms 0 stays 0).
 * baton_backoff_jitter(): a delay drawn uniformly from [cap - ceil(cap * jitter), cap] with the
 *   random bits `rnd` (rnd % span), so the cap is never exceeded and callers that failed together
 *   do not come back together. jitter is a fraction in [0, 1] (clamped; NaN = 0): 0 returns cap,
 *   BATON_BACKOFF_EQUAL_JITTER (0.5) draws from [cap/2, cap] ("equal jitter", cap/2 rounded
 *   down), 1 from [0, cap].
 */
#define BATON_BACKOFF_EQUAL_JITTER 0.5

uint64_t baton_backoff_cap(uint64_t base_ms, uint64_t max_ms, unsigned n);
uint64_t baton_backoff_jitter(uint64_t cap, double jitter, uint64_t rnd);

/*
 * Delay for attempt n (n = 0 after a success): cap = min(max_ms, min_ms * 2^n), then
 * "equal jitter": a uniform draw in [cap/2, cap], never below min_ms. The attempt counter
 * saturates, so the delay stays at max_ms (plus jitter) forever: a peer is never black-listed,
 * it is retried at the slowest rate until it answers, and reset() after a success.
 * Not thread-safe; one per peer.
 */
typedef struct {
    uint32_t min_ms;
    uint32_t max_ms;
    uint32_t attempt;
    uint64_t rng; /* xorshift64* state, never 0 */
} baton_backoff_t;

/* min_ms >= 1 and max_ms >= min_ms are enforced (clamped). seed 0 is replaced. */
void baton_backoff_init(baton_backoff_t *b, uint32_t min_ms, uint32_t max_ms, uint64_t seed);
/* The next delay; advances the attempt counter. */
uint32_t baton_backoff_next(baton_backoff_t *b);
void baton_backoff_reset(baton_backoff_t *b);

#endif
