/* health/peer_state.h — the connector side's peer state machine: connect, up, down, back-off. */
#ifndef BATON_HEALTH_PEER_STATE_H
#define BATON_HEALTH_PEER_STATE_H

#include <stdint.h>

#include "health/backoff.h"

/*
 *            demand                 handshake ok
 *   IDLE ------------> CONNECTING ----------------> UP
 *    ^                  |     ^                      |
 *    | no demand for    |fail | back-off elapsed     | fail (heartbeats missed, reset,
 *    | idle_after_ms    v     |                      |  transport error)
 *    +--------------- DOWN <-------------------------+
 *
 * Pure: the caller supplies a millisecond clock, acts on what tick() returns and reports
 * outcomes. DOWN always leads back to CONNECTING after the back-off (capped, jittered) while
 * someone still wants the peer; a peer nobody used for idle_after_ms rests in IDLE and is
 * connected again on the next demand — nothing is black-listed for good.
 * Not thread-safe; one per peer.
 */
typedef enum {
    BATON_PEER_IDLE = 0,
    BATON_PEER_CONNECTING = 1,
    BATON_PEER_UP = 2,
    BATON_PEER_DOWN = 3,
} baton_peer_state_t;

/* What tick() / demand() ask the caller to do (bit mask). */
enum {
    BATON_PEER_ACT_CONNECT = 1, /* start a connect attempt now, then call _connecting() */
    BATON_PEER_ACT_TIMEOUT = 2, /* the attempt overran connect_timeout_ms: abandon it, _down() */
};

typedef struct {
    baton_peer_state_t state;
    baton_backoff_t backoff;
    uint32_t connect_timeout_ms;
    uint32_t idle_after_ms; /* 0: never rest in IDLE */
    uint64_t deadline_ms;   /* CONNECTING: give up at; DOWN: next attempt at */
    uint64_t since_ms;      /* entered the current state at */
    uint64_t last_demand_ms;
    uint32_t failures;   /* consecutive failed attempts / downs since the last UP */
    uint32_t reconnects; /* UPs after a previous UP */
    int ever_up;
    int last_error;
} baton_peer_health_t;

void baton_peer_health_init(baton_peer_health_t *h, uint32_t backoff_min_ms,
                            uint32_t backoff_max_ms, uint32_t connect_timeout_ms,
                            uint32_t idle_after_ms, uint64_t seed, uint64_t now_ms);

/* Someone wants the peer (an offer, an explicit connect). Returns ACT_CONNECT when IDLE. */
unsigned baton_peer_health_demand(baton_peer_health_t *h, uint64_t now_ms);
/* A connect attempt started (after ACT_CONNECT). */
void baton_peer_health_connecting(baton_peer_health_t *h, uint64_t now_ms);
/* The handshake completed. */
void baton_peer_health_up(baton_peer_health_t *h, uint64_t now_ms);
/* The attempt failed or the UP connection died: DOWN, next attempt after the back-off.
 * Returns the delay chosen. No effect (returns 0) when already DOWN or IDLE. */
uint32_t baton_peer_health_down(baton_peer_health_t *h, uint64_t now_ms, int err);
/* Periodic: returns the actions due at now_ms. */
unsigned baton_peer_health_tick(baton_peer_health_t *h, uint64_t now_ms);

const char *baton_peer_state_name(baton_peer_state_t s);

#endif
