/* retry.h — the router's retry rules: which upstream failures may be retried with a new pair,
 * and how long to wait before the next attempt (exponential back-off with jitter). */
#ifndef BATON_ROUTER_RETRY_H
#define BATON_ROUTER_RETRY_H

#include <stdint.h>

/*
 * A request is retried only while no byte of its response reached the client (the proxy checks
 * that), with a NEW prefill/decode pair and a NEW bootstrap room, and only for failures that say
 * "this worker could not serve it now", never "this request is wrong":
 *   - connect failures and connect timeouts                         → CONNECT
 *   - the connection closed or reset before the response ended, or a
 *     malformed response (a crashed or broken worker)               → CLOSED
 *   - first-byte and idle timeouts (a hung worker)                  → TIMEOUT
 *   - HTTP 408, 429, 500, 502, 503, 504 from either side            → STATUS
 *     (PROTOCOLS.md §1; other 4xx are the request's fault, 501/505 will not change)
 *   - the worker was removed and its drain deadline passed          → DRAINED
 * The whole-request deadline (BATON_ETIMEOUT_TOTAL), cancels, the router's own errors (ENOMEM,
 * EINVAL, ETOOBIG) and everything else are not retried.
 *
 * Pure functions, no state: safe from any thread.
 */

typedef enum {
    BATON_RETRY_NO = 0,
    BATON_RETRY_CONNECT,
    BATON_RETRY_CLOSED,
    BATON_RETRY_TIMEOUT,
    BATON_RETRY_STATUS,
    BATON_RETRY_DRAINED,
} baton_retry_reason_t;

/* "no", "connect", "closed", "timeout", "status", "drained" (metric label values). */
const char *baton_retry_reason_name(baton_retry_reason_t r);

/* err: the HTTP client's on_done error (0 when the response completed); status: the response
 * status (0 when no head arrived). A transport error wins over the status. */
baton_retry_reason_t baton_retry_classify(int err, int status);

typedef struct baton_retry_policy_s {
    unsigned max_retries;    /* attempts after the first; 0 = never retry */
    uint64_t backoff_ms;     /* before the first retry (un-jittered) */
    uint64_t backoff_max_ms; /* cap of the un-jittered back-off */
    uint64_t budget_ms;      /* no retry may start later than this after the request arrived;
                              * 0 = no budget of its own */
} baton_retry_policy_t;

/*
 * The back-off before retry number `retry` (1 = the first retry): b = min(backoff_ms *
 * 2^(retry-1), backoff_max_ms), then drawn uniformly from [b/2, b] with the random bits `rnd`
 * ("equal jitter": never more than the cap, never so little that a crash storm hammers the
 * survivors, and two requests that failed together do not come back together). The arithmetic is
 * health/backoff.h's, shared with reconnects and breaker cool-downs.
 */
uint64_t baton_retry_backoff_ms(const baton_retry_policy_t *p, unsigned retry, uint64_t rnd);

typedef enum {
    BATON_RETRY_PLAN_GO = 0,      /* retry after *delay_ms */
    BATON_RETRY_PLAN_EXHAUSTED,   /* max_retries attempts were retried already */
    BATON_RETRY_PLAN_OUT_OF_TIME, /* the budget or the request deadline would be passed */
} baton_retry_plan_t;

/*
 * Decides whether retry number retries_done+1 may start. elapsed_ms: since the request arrived;
 * deadline_left_ms: time left before the whole-request deadline (UINT64_MAX: none). A retry is
 * refused when its back-off would end after the budget, or leave less than `min_left_ms` before
 * the deadline (an attempt that cannot finish is not worth starting).
 */
baton_retry_plan_t baton_retry_plan(const baton_retry_policy_t *p, unsigned retries_done,
                                    uint64_t elapsed_ms, uint64_t deadline_left_ms,
                                    uint64_t min_left_ms, uint64_t rnd, uint64_t *delay_ms);

#endif
