/* health/breaker_state.h — the circuit breaker's state type alone (types only, HAProxy's
 * check-t.h idea), so the router's registry can publish a worker's state without the breaker. */
#ifndef BATON_HEALTH_BREAKER_STATE_H
#define BATON_HEALTH_BREAKER_STATE_H

/* Circuit-breaker state. A new worker starts CLOSED. OPEN workers are never picked;
 * HALF_OPEN workers are eligible (the breaker limits the probes). The values are stored in the
 * registry's atomics and exported as a gauge: never renumber them. */
typedef enum {
    BATON_BREAKER_CLOSED = 0,
    BATON_BREAKER_OPEN = 1,
    BATON_BREAKER_HALF_OPEN = 2,
} baton_breaker_state_t;

/* "closed", "open", "half_open" (log and /workers values). Defined in breaker.c. */
const char *baton_breaker_state_name(baton_breaker_state_t s);

#endif
