/* retry.c — retry classification of upstream failures and the jittered exponential back-off. */
#include "router/dataplane/retry.h"

#include "baton/error.h"
#include "health/backoff.h"

const char *baton_retry_reason_name(baton_retry_reason_t r)
{
    switch (r) {
    case BATON_RETRY_NO:
        return "no";
    case BATON_RETRY_CONNECT:
        return "connect";
    case BATON_RETRY_CLOSED:
        return "closed";
    case BATON_RETRY_TIMEOUT:
        return "timeout";
    case BATON_RETRY_STATUS:
        return "status";
    case BATON_RETRY_DRAINED:
        return "drained";
    }
    return "no";
}

baton_retry_reason_t baton_retry_classify(int err, int status)
{
    switch (err) {
    case 0:
        break;
    case BATON_ECONNECT:
    case BATON_ETIMEOUT_CONNECT:
    case BATON_ETLS: /* the handshake failed: no byte of the request was sent */
        return BATON_RETRY_CONNECT;
    case BATON_EEOF:
    case BATON_ECLOSED:
    case BATON_EUPSTREAM:
        return BATON_RETRY_CLOSED;
    case BATON_ETIMEOUT_FIRST_BYTE:
    case BATON_ETIMEOUT_IDLE:
        return BATON_RETRY_TIMEOUT;
    case BATON_ESHUTDOWN:
        return BATON_RETRY_DRAINED;
    default:
        return BATON_RETRY_NO;
    }
    switch (status) {
    case 408:
    case 429:
    case 500:
    case 502:
    case 503:
    case 504:
        return BATON_RETRY_STATUS;
    default:
        return BATON_RETRY_NO;
    }
}

uint64_t baton_retry_backoff_ms(const baton_retry_policy_t *p, unsigned retry, uint64_t rnd)
{
    if (retry < 1)
        retry = 1;
    uint64_t b = baton_backoff_cap(p->backoff_ms, p->backoff_max_ms, retry - 1);
    return baton_backoff_jitter(b, BATON_BACKOFF_EQUAL_JITTER, rnd);
}

baton_retry_plan_t baton_retry_plan(const baton_retry_policy_t *p, unsigned retries_done,
                                    uint64_t elapsed_ms, uint64_t deadline_left_ms,
                                    uint64_t min_left_ms, uint64_t rnd, uint64_t *delay_ms)
{
    if (retries_done >= p->max_retries)
        return BATON_RETRY_PLAN_EXHAUSTED;
    uint64_t d = baton_retry_backoff_ms(p, retries_done + 1, rnd);
    if (p->budget_ms && (elapsed_ms >= p->budget_ms || d > p->budget_ms - elapsed_ms))
        return BATON_RETRY_PLAN_OUT_OF_TIME;
    if (deadline_left_ms != UINT64_MAX &&
        (deadline_left_ms <= d || deadline_left_ms - d < min_left_ms))
        return BATON_RETRY_PLAN_OUT_OF_TIME;
    *delay_ms = d;
    return BATON_RETRY_PLAN_GO;
}
