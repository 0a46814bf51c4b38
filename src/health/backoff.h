/* health/backoff.h — exponential reconnect back-off with jitter (pure; the caller owns time). */
#ifndef BATON_HEALTH_BACKOFF_H
#define BATON_HEALTH_BACKOFF_H

#include <stdint.h>

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

/* A uniform 64-bit draw from the same generator (used for jitter elsewhere). */
uint64_t baton_backoff_rand(baton_backoff_t *b);

#endif
