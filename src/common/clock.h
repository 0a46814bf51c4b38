/* clock.h — the monotonic clock (libuv's uv_hrtime) in the units Baton's components use. */
#ifndef BATON_COMMON_CLOCK_H
#define BATON_COMMON_CLOCK_H

#include <stdint.h>
#include <uv.h>

/* Monotonic milliseconds (arbitrary origin; only differences mean something). */
static inline uint64_t baton_now_ms(void)
{
    return uv_hrtime() / 1000000u;
}

/* Seconds from start_ns to end_ns (uv_hrtime values); 0 when end_ns is not later. */
static inline double baton_seconds_between(uint64_t start_ns, uint64_t end_ns)
{
    return end_ns > start_ns ? (double)(end_ns - start_ns) / 1e9 : 0.0;
}

/* Seconds since start_ns (a uv_hrtime value). */
static inline double baton_seconds_since(uint64_t start_ns)
{
    return baton_seconds_between(start_ns, uv_hrtime());
}

#endif
