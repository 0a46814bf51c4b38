/* token_bucket.c — token bucket arithmetic and the "RPS[:BURST]" parser (rate limits). */
#include "common/token_bucket.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>

static void refill(baton_token_bucket_t *tb, double rate, double burst, uint64_t now_ns)
{
    if (now_ns > tb->last_ns) {
        tb->tokens += (double)(now_ns - tb->last_ns) / 1e9 * rate;
        tb->last_ns = now_ns;
    }
    if (tb->tokens > burst)
        tb->tokens = burst;
}

void baton_token_bucket_init(baton_token_bucket_t *tb, double burst, uint64_t now_ns)
{
    tb->tokens = burst;
    tb->last_ns = now_ns;
}

int baton_token_bucket_take(baton_token_bucket_t *tb, double rate, double burst, uint64_t now_ns,
                            uint64_t *wait_ms_p)
{
    refill(tb, rate, burst, now_ns);
    if (tb->tokens >= 1.0) {
        tb->tokens -= 1.0;
        return 1;
    }
    if (wait_ms_p != NULL) {
        /* The epsilon keeps float error from adding a millisecond to an exact wait. */
        double ms = ceil((1.0 - tb->tokens) / rate * 1000.0 - 1e-6);
        /* Compared before the conversion: a double beyond uint64_t's range (or NaN) converted
         * to it is undefined behaviour. */
        if (!(ms < (double)BATON_TOKEN_BUCKET_MAX_WAIT_MS))
            *wait_ms_p = BATON_TOKEN_BUCKET_MAX_WAIT_MS;
        else
            *wait_ms_p = ms < 1.0 ? 1 : (uint64_t)ms;
    }
    return 0;
}

int baton_token_bucket_full(const baton_token_bucket_t *tb, double rate, double burst,
                            uint64_t now_ns)
{
    baton_token_bucket_t t = *tb;
    refill(&t, rate, burst, now_ns);
    return t.tokens >= burst;
}

int baton_token_bucket_parse(const char *s, double *rate_p, double *burst_p)
{
    if (s == NULL || *s < '0' || *s > '9')
        return -1;
    errno = 0;
    char *end;
    double rate = strtod(s, &end);
    if (errno != 0 || end == s || !(rate >= BATON_TOKEN_BUCKET_MIN_RATE) || rate > 1e9)
        return -1;
    double burst = ceil(rate) < 1.0 ? 1.0 : ceil(rate);
    if (*end == ':') {
        const char *b = end + 1;
        if (*b < '0' || *b > '9')
            return -1;
        unsigned long long v = strtoull(b, &end, 10);
        if (errno != 0 || v < 1 || v > 1000000000ull)
            return -1;
        burst = (double)v;
    }
    if (*end != '\0')
        return -1;
    *rate_p = rate;
    *burst_p = burst;
    return 0;
}
