/* health/breaker.h — the per-worker circuit breaker: a pure, thread-safe state machine on a
 * caller-supplied clock (passive signals: outcomes of real requests). */
#ifndef BATON_HEALTH_BREAKER_H
#define BATON_HEALTH_BREAKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>

#include "health/breaker_state.h"

/*
 * States and transitions (every transition increments the breaker's epoch, see tickets):
 *
 *   CLOSED ──(failure_threshold consecutive FAILUREs)──────────────────────▶ OPEN
 *   OPEN ──(cool-down elapsed: the next allow() or poll())───────────────▶ HALF_OPEN
 *   OPEN ──(baton_breaker_expire(): e.g. the active check saw the worker come back)──▶ HALF_OPEN
 *   HALF_OPEN ──(the probe's SUCCESS)──────────────────────────────────────▶ CLOSED
 *   HALF_OPEN ──(the probe's FAILURE)──────────────────────────────────────▶ OPEN (longer)
 *   any ──(baton_breaker_reset())──────────────────────────────────────────▶ CLOSED
 *
 * CLOSED admits everything. A SUCCESS resets the failure count; NEUTRAL leaves it alone.
 * OPEN admits nothing until its cool-down ends.
 * HALF_OPEN admits exactly one request at a time, the probe. Its outcome decides: SUCCESS
 *   closes, FAILURE re-opens, NEUTRAL (a 4xx, a cancel: the worker told us nothing) frees the
 *   slot for the next probe. A probe that reports nothing within probe_timeout_ms is given up
 *   (its late outcome is ignored) and the next allow() admits a new probe, so a lost report
 *   can never wedge the worker.
 *
 * Why consecutive failures and not a failure ratio over a window: it needs no clock and no
 * per-window storage while CLOSED, it is exact at low traffic (a ratio over 3 requests is
 * noise and needs a minimum-volume rule), and it trips fast on what actually breaks a worker
 * (dead process: every request fails). A worker that fails only some requests is left to the
 * active health check and to the request-level retries.
 *
 * Cool-down for the k-th consecutive opening (k = 1 after a CLOSED period), with the one
 * back-off of health/backoff.h:
 *   c_k = min(cooldown_base_ms * 2^(k-1), cooldown_max_ms), then drawn uniformly from
 *   [c_k - ceil(c_k * jitter), c_k] (at least 1 ms), so the cap is never exceeded and breakers
 * opened together (one crash seen by every worker's clients) do not probe together. k resets when
 * the breaker closes.
 *
 * Defaults (baton_breaker_config_init): failure_threshold 5, cooldown_base_ms 1000,
 * cooldown_max_ms 30000, jitter 0.2, probe_timeout_ms 60000.
 *
 * Outcomes (PROTOCOLS.md §1): connect errors, timeouts, 5xx, an early close or a
 * malformed response are FAILUREs; 1xx-3xx are SUCCESSes; 4xx (the request's fault, or the
 * worker shedding load while alive) and cancels are NEUTRAL — they never count against a worker.
 *
 * Tickets: allow() returns a ticket (non-zero) that the caller hands back to record() with the
 * outcome of that one request. A ticket names the epoch it was issued in; an outcome whose
 * epoch is gone (a request admitted before the breaker opened, a given-up probe) is ignored, so
 * a late result can never be taken for the probe's.
 *
 * Threading: every function is thread-safe. allow() while CLOSED is one atomic load, and
 * record(SUCCESS) while CLOSED with no failure counted is two — the request path takes the
 * mutex only when something is wrong. on_change runs with the breaker's mutex held, once per
 * transition, in order: it must not call back into this breaker (logging, metrics and the
 * registry's atomic setters are fine).
 *
 * Ownership: the caller allocates the breaker (embed it), init() before use, destroy() after
 * the last call.
 */

typedef enum {
    BATON_OUTCOME_SUCCESS = 0,
    BATON_OUTCOME_FAILURE = 1,
    BATON_OUTCOME_NEUTRAL = 2,
} baton_breaker_outcome_t;

const char *baton_breaker_outcome_name(baton_breaker_outcome_t o); /* "success", ... */

/* The outcome of one upstream request from the HTTP client's on_done error (client.h) and the
 * response status (0 when no head arrived): err 0 → by status (5xx FAILURE, 4xx NEUTRAL, else
 * SUCCESS; status 0 → FAILURE); BATON_ECANCELED and the router's own errors (ENOMEM, EINVAL,
 * ESHUTDOWN) → NEUTRAL; every other error (connect, timeouts, EOF, malformed, libuv codes) →
 * FAILURE. */
baton_breaker_outcome_t baton_breaker_outcome(int err, int status);

typedef struct baton_breaker_config_s {
    unsigned failure_threshold; /* consecutive failures that open; 0 = breaker disabled */
    uint64_t cooldown_base_ms;  /* first cool-down (>= 1) */
    uint64_t cooldown_max_ms;   /* cap (>= base) */
    double jitter;              /* 0..1: fraction taken off the cool-down at random */
    uint64_t probe_timeout_ms;  /* a silent probe is given up after this; 0 = never */
} baton_breaker_config_t;

void baton_breaker_config_init(baton_breaker_config_t *cfg);

typedef struct baton_breaker_s baton_breaker_t;

/* Called on every transition (see Threading). reason: a static string such as
 * "consecutive_failures", "cooldown_elapsed", "probe_succeeded", "probe_failed", "expired",
 * "reset". */
typedef void (*baton_breaker_change_cb)(baton_breaker_t *b, baton_breaker_state_t from,
                                        baton_breaker_state_t to, const char *reason, void *ctx);

typedef uint64_t baton_breaker_ticket_t; /* 0 = denied */

struct baton_breaker_s {
    void *data; /* the caller's */

    /* Private to breaker.c. */
    _Atomic uint64_t word_; /* epoch << 2 | state: the lock-free fast path reads only this */
    atomic_uint failures_;  /* consecutive failures while CLOSED */
    pthread_mutex_t lock_;
    baton_breaker_config_t cfg_;
    baton_breaker_change_cb on_change_;
    void *ctx_;
    unsigned opens_;       /* consecutive openings without a close (k above) */
    uint64_t open_until_;  /* OPEN: when the cool-down ends */
    uint64_t cooldown_;    /* OPEN: the cool-down drawn for this opening */
    int probe_busy_;       /* HALF_OPEN: a probe is out */
    uint64_t probe_since_; /* HALF_OPEN: when it was admitted */
    uint64_t rng_;         /* xorshift64* state for the jitter */
    uint64_t transitions_;
};

/* cfg NULL = defaults (copied; out-of-range values are clamped). on_change may be NULL.
 * seed: for the jitter (0 = any). 0 or BATON_ENOMEM (mutex). */
int baton_breaker_init(baton_breaker_t *b, const baton_breaker_config_t *cfg,
                       baton_breaker_change_cb on_change, void *ctx, uint64_t seed);
void baton_breaker_destroy(baton_breaker_t *b);

/* May I send a request now? A non-zero ticket (pass it to record() exactly once), or 0. May
 * move OPEN → HALF_OPEN (cool-down over) and take the probe slot. */
baton_breaker_ticket_t baton_breaker_allow(baton_breaker_t *b, uint64_t now_ms);

/* 1 when the ticket is a HALF_OPEN probe's. */
int baton_breaker_ticket_is_probe(baton_breaker_ticket_t ticket);

/* Would allow() admit a request now? Takes nothing (no probe slot, no transition): for
 * filtering candidates before choosing one. */
int baton_breaker_would_allow(baton_breaker_t *b, uint64_t now_ms);

/* The outcome of the request admitted with `ticket`. Tickets from a past epoch are ignored. */
void baton_breaker_record(baton_breaker_t *b, uint64_t now_ms, baton_breaker_ticket_t ticket,
                          baton_breaker_outcome_t outcome);

/* Timer-driven housekeeping: OPEN → HALF_OPEN once the cool-down is over (so a registry
 * snapshot sees the worker eligible again without waiting for a request), and gives up a
 * silent probe. Returns the state after. */
baton_breaker_state_t baton_breaker_poll(baton_breaker_t *b, uint64_t now_ms);

/* Ends an OPEN cool-down now (→ HALF_OPEN; other states unchanged). The opening count k is
 * kept, so a failing probe still re-opens with a longer cool-down. */
void baton_breaker_expire(baton_breaker_t *b, uint64_t now_ms);

/* → CLOSED with no failures counted and k = 0 (operator action). */
void baton_breaker_reset(baton_breaker_t *b, uint64_t now_ms);

/* The state now (one atomic load). */
baton_breaker_state_t baton_breaker_state(const baton_breaker_t *b);

typedef struct baton_breaker_info_s {
    baton_breaker_state_t state;
    unsigned failures;      /* consecutive failures counted while CLOSED */
    unsigned opens;         /* k */
    uint64_t open_until_ms; /* OPEN only, else 0 */
    uint64_t cooldown_ms;   /* OPEN only: this opening's cool-down, else 0 */
    int probe_busy;         /* HALF_OPEN only */
    uint64_t epoch;
    uint64_t transitions;
} baton_breaker_info_t;

void baton_breaker_get_info(baton_breaker_t *b, baton_breaker_info_t *info);

/* The un-jittered cool-down for the k-th opening (k >= 1), for tests and documentation. */
uint64_t baton_breaker_cooldown_cap(const baton_breaker_config_t *cfg, unsigned k);

#endif
