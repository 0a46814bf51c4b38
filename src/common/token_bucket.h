/* token_bucket.h — one token bucket (rate limiting) and the "RPS[:BURST]" syntax that sets it. */
#ifndef BATON_COMMON_TOKEN_BUCKET_H
#define BATON_COMMON_TOKEN_BUCKET_H

#include <stdint.h>

/*
 * Pure functions on caller-owned state and a caller-supplied clock (nanoseconds, monotonic), so
 * tests drive time themselves. Not thread-safe: the caller guards a shared bucket.
 *
 * A bucket holds up to `burst` tokens and gains `rate` tokens per second; a request takes one.
 */
typedef struct baton_token_bucket_s {
    double tokens;
    uint64_t last_ns; /* when tokens was last brought up to date */
} baton_token_bucket_t;

/* A full bucket at now_ns. */
void baton_token_bucket_init(baton_token_bucket_t *tb, double burst, uint64_t now_ns);

/*
 * Refills for the time since the last call, then takes one token: 1 taken, or 0 when the bucket
 * is empty, with *wait_ms_p (may be NULL) set to the milliseconds until a token is there
 * (in [1, BATON_TOKEN_BUCKET_MAX_WAIT_MS], rounded up). rate > 0, burst >= 1. A clock going
 * backwards refills nothing.
 */
int baton_token_bucket_take(baton_token_bucket_t *tb, double rate, double burst, uint64_t now_ns,
                            uint64_t *wait_ms_p);

/* 1 when the bucket is full at now_ns (an idle bucket: the same as a new one, may be dropped). */
int baton_token_bucket_full(const baton_token_bucket_t *tb, double rate, double burst,
                            uint64_t now_ns);

/* The slowest rate accepted: one request per hour (a client told to wait longer would not). */
#define BATON_TOKEN_BUCKET_MIN_RATE     (1.0 / 3600.0)
#define BATON_TOKEN_BUCKET_MIN_RATE_STR "0.000278"
/* The longest wait take() reports, whatever the rate it is given (a bit over an hour). */
#define BATON_TOKEN_BUCKET_MAX_WAIT_MS ((uint64_t)3601 * 1000)

/* Parses "RPS" or "RPS:BURST" (RPS a decimal in [BATON_TOKEN_BUCKET_MIN_RATE, 1e9], BURST an
 * integer in [1, 1e9]; burst defaults to max(1, ceil(RPS))). 0, or -1 on bad syntax or range. */
int baton_token_bucket_parse(const char *s, double *rate_p, double *burst_p);

#endif
