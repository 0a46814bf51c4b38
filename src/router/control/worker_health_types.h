/* router/control/worker_health_types.h — types of worker (HTTP) health: the active-check state
 * machine, its configuration and defaults, and what /workers can show. Types only (HAProxy
 * check-t.h). */
#ifndef BATON_ROUTER_WORKER_HEALTH_TYPES_H
#define BATON_ROUTER_WORKER_HEALTH_TYPES_H

#include <stdint.h>

#include "health/breaker.h"

/*
 * Active-check state: one counter with hysteresis (HAProxy's "health"), 0 .. rise+fall-1.
 *
 *   counter:   0 ........ rise-1 | rise ........ rise+fall-1
 *              DOWN  DOWN_CHECKING | UP_CHECKING          UP
 *              (settled)           |                      (settled)
 *
 * A passing check adds one, a failing check takes one away, except at the two crossings:
 *   - UP side, counter == rise, a check fails   → DOWN, counter = 0 (settled);
 *   - DOWN side, counter == rise-1, a check passes → UP, counter = rise+fall-1 (settled).
 * So a settled UP worker goes DOWN after `fall` consecutive failures, a settled DOWN worker
 * comes UP after `rise` consecutive successes, and a lone blip in either direction is absorbed
 * (it only moves the counter). "Changing" = not settled: the checker then uses the fast
 * interval, so a state change is confirmed or dropped quickly.
 *
 * A newly registered worker starts UP with counter = rise (UP_CHECKING, not confirmed): it takes
 * traffic at once (the registry marks new workers healthy), one failed check takes it DOWN, and
 * fall-1 passing checks settle it.
 *
 * Only the UP/DOWN side reaches the registry (baton_worker_health_t HEALTHY / UNHEALTHY), and
 * it changes in exactly one place: baton_whealth_set_health() (worker_health.h).
 */
typedef enum {
    BATON_WH_UP = 0,            /* settled up */
    BATON_WH_UP_CHECKING = 1,   /* up (takes traffic), last checks failed or not confirmed */
    BATON_WH_DOWN_CHECKING = 2, /* down (no traffic), last checks passed */
    BATON_WH_DOWN = 3,          /* settled down */
} baton_whealth_state_t;

/* "up", "up_checking", "down_checking", "down". */
const char *baton_whealth_state_name(baton_whealth_state_t s);

/* The counter above; pure, not thread-safe (the owner locks). */
typedef struct baton_hcounter_s {
    unsigned health;
    unsigned rise; /* >= 1 */
    unsigned fall; /* >= 1 */
} baton_hcounter_t;

/* rise/fall 0 are taken as 1. Starts at rise (UP_CHECKING). */
void baton_hcounter_init(baton_hcounter_t *c, unsigned rise, unsigned fall);
/* One check result (ok != 0: passed). Returns +1 when it just went UP, -1 when it just went
 * DOWN, 0 otherwise. */
int baton_hcounter_update(baton_hcounter_t *c, int ok);
/* Forces a side, settled (an operator's or a test's decision). */
void baton_hcounter_force(baton_hcounter_t *c, int up);
int baton_hcounter_is_up(const baton_hcounter_t *c);
int baton_hcounter_is_changing(const baton_hcounter_t *c);
baton_whealth_state_t baton_hcounter_state(const baton_hcounter_t *c);

/*
 * Active checks: GET <worker prefix><path> on a fresh connection, passed when the response is
 * complete with a 2xx/3xx status within timeout_ms (connect included); anything else fails.
 * Scheduling: the next check of a worker starts `interval` after its previous one ended:
 *   fast_interval_ms while changing (not settled), interval_ms when settled UP,
 *   down_interval_ms when settled DOWN.
 * A worker's first check runs after a uniform random delay in [0, interval_ms) (jitter), so a
 * router that starts with many workers, or a batch of registrations, does not check them all
 * at once. New and removed workers are picked up from the registry's generation counter every
 * sync_interval_ms.
 */
typedef struct baton_wcheck_config_s {
    int enabled;               /* 0: no active checks (breakers still work); default 1 */
    uint64_t interval_ms;      /* default 2000 */
    uint64_t fast_interval_ms; /* default 500 */
    uint64_t down_interval_ms; /* default 2000 */
    uint64_t timeout_ms;       /* default 1000; must be > 0 */
    unsigned rise;             /* default 2 */
    unsigned fall;             /* default 3 */
    char path[128];            /* default "/health"; appended to the worker's URL prefix */
    uint64_t sync_interval_ms; /* default 250 */
} baton_wcheck_config_t;

/* Everything the worker-health layer is configured with. */
typedef struct baton_whealth_config_s {
    baton_wcheck_config_t check;
    baton_breaker_config_t breaker;
    /* Monotonic milliseconds; NULL = uv_hrtime() / 1e6. Tests inject a fake clock. */
    uint64_t (*clock_ms)(void *ctx);
    void *clock_ctx;
    uint64_t seed; /* jitter seed; 0 = from the clock */
} baton_whealth_config_t;

/* Fills every default listed above and in breaker.h. */
void baton_whealth_config_init(baton_whealth_config_t *cfg);

/* A token from an admission (baton_whealth_admit / _pick) that its outcome must be reported
 * with (baton_whealth_done). 0 is never a valid ticket. */
typedef uint64_t baton_whealth_ticket_t;

/* What /workers (and tests) can read about one worker. */
typedef struct baton_whealth_info_s {
    baton_whealth_state_t state;
    unsigned counter; /* 0 .. rise+fall-1 */
    unsigned rise, fall;
    baton_breaker_info_t breaker;
    uint64_t checks;        /* active checks finished */
    uint64_t checks_failed; /* of which failed */
    uint64_t last_check_ms; /* clock_ms when the last check ended; 0 = none yet */
    int last_check_status;  /* HTTP status of the last check, 0 when none */
    int last_check_err;     /* 0 or the client error of the last check */
    uint64_t transitions;   /* health UP/DOWN changes */
} baton_whealth_info_t;

#endif
