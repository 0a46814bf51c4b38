/* health/heartbeat.c — connection liveness from received traffic and heartbeat timing. */
#include "health/heartbeat.h"

void baton_heartbeat_init(baton_heartbeat_t *hb, uint32_t interval_ms, uint32_t misses,
                          uint64_t now_ms)
{
    hb->interval_ms = interval_ms ? interval_ms : 1;
    hb->misses = misses ? misses : 1;
    hb->last_rx_ms = now_ms;
    hb->last_tx_ms = now_ms;
}

void baton_heartbeat_rx(baton_heartbeat_t *hb, uint64_t now_ms)
{
    /* A clock that steps back must not make a live peer look dead later. */
    if (now_ms > hb->last_rx_ms)
        hb->last_rx_ms = now_ms;
}

void baton_heartbeat_tx(baton_heartbeat_t *hb, uint64_t now_ms)
{
    if (now_ms > hb->last_tx_ms)
        hb->last_tx_ms = now_ms;
}

int baton_heartbeat_due(const baton_heartbeat_t *hb, uint64_t now_ms)
{
    return now_ms >= hb->last_tx_ms + hb->interval_ms;
}

uint64_t baton_heartbeat_window_ms(const baton_heartbeat_t *hb)
{
    return (uint64_t)hb->interval_ms * hb->misses;
}

int baton_heartbeat_expired(const baton_heartbeat_t *hb, uint64_t now_ms)
{
    return now_ms > hb->last_rx_ms + baton_heartbeat_window_ms(hb);
}
