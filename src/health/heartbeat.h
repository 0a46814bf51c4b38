/* health/heartbeat.h — liveness of one connection: when to send a heartbeat, when it is dead. */
#ifndef BATON_HEALTH_HEARTBEAT_H
#define BATON_HEALTH_HEARTBEAT_H

#include <stdint.h>

/*
 * Pure bookkeeping on a caller-supplied millisecond clock. Any received frame counts as a sign
 * of life (not only heartbeats), so a busy connection never needs one. The connection is
 * EXPIRED when nothing arrived for interval_ms * misses; a heartbeat is DUE when nothing was
 * sent for interval_ms. Not thread-safe; one per connection.
 */
typedef struct {
    uint32_t interval_ms;
    uint32_t misses;
    uint64_t last_rx_ms;
    uint64_t last_tx_ms;
} baton_heartbeat_t;

/* interval_ms >= 1 and misses >= 1 are enforced. Counts `now` as both last rx and last tx. */
void baton_heartbeat_init(baton_heartbeat_t *hb, uint32_t interval_ms, uint32_t misses,
                          uint64_t now_ms);
void baton_heartbeat_rx(baton_heartbeat_t *hb, uint64_t now_ms);
void baton_heartbeat_tx(baton_heartbeat_t *hb, uint64_t now_ms);
int baton_heartbeat_due(const baton_heartbeat_t *hb, uint64_t now_ms);
int baton_heartbeat_expired(const baton_heartbeat_t *hb, uint64_t now_ms);
/* The detection window, interval_ms * misses. */
uint64_t baton_heartbeat_window_ms(const baton_heartbeat_t *hb);

#endif
