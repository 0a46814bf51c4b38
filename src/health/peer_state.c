/* health/peer_state.c — connector-side peer state transitions and reconnect scheduling. */
#include "health/peer_state.h"

void baton_peer_health_init(baton_peer_health_t *h, uint32_t backoff_min_ms,
                            uint32_t backoff_max_ms, uint32_t connect_timeout_ms,
                            uint32_t idle_after_ms, uint64_t seed, uint64_t now_ms)
{
    baton_backoff_init(&h->backoff, backoff_min_ms, backoff_max_ms, seed);
    h->state = BATON_PEER_IDLE;
    h->connect_timeout_ms = connect_timeout_ms ? connect_timeout_ms : 1;
    h->idle_after_ms = idle_after_ms;
    h->deadline_ms = 0;
    h->since_ms = now_ms;
    h->last_demand_ms = now_ms;
    h->failures = 0;
    h->reconnects = 0;
    h->ever_up = 0;
    h->last_error = 0;
}

static void enter(baton_peer_health_t *h, baton_peer_state_t s, uint64_t now_ms)
{
    h->state = s;
    h->since_ms = now_ms;
}

unsigned baton_peer_health_demand(baton_peer_health_t *h, uint64_t now_ms)
{
    h->last_demand_ms = now_ms;
    return h->state == BATON_PEER_IDLE ? BATON_PEER_ACT_CONNECT : 0;
}

void baton_peer_health_connecting(baton_peer_health_t *h, uint64_t now_ms)
{
    enter(h, BATON_PEER_CONNECTING, now_ms);
    h->deadline_ms = now_ms + h->connect_timeout_ms;
}

void baton_peer_health_up(baton_peer_health_t *h, uint64_t now_ms)
{
    if (h->ever_up)
        h->reconnects++;
    h->ever_up = 1;
    h->failures = 0;
    h->last_error = 0;
    baton_backoff_reset(&h->backoff);
    enter(h, BATON_PEER_UP, now_ms);
}

uint32_t baton_peer_health_down(baton_peer_health_t *h, uint64_t now_ms, int err)
{
    if (h->state == BATON_PEER_DOWN || h->state == BATON_PEER_IDLE)
        return 0;
    uint32_t delay = baton_backoff_next(&h->backoff);
    h->failures++;
    h->last_error = err;
    enter(h, BATON_PEER_DOWN, now_ms);
    h->deadline_ms = now_ms + delay;
    return delay;
}

unsigned baton_peer_health_tick(baton_peer_health_t *h, uint64_t now_ms)
{
    switch (h->state) {
    case BATON_PEER_CONNECTING:
        return now_ms >= h->deadline_ms ? BATON_PEER_ACT_TIMEOUT : 0;
    case BATON_PEER_DOWN:
        if (now_ms < h->deadline_ms)
            return 0;
        if (h->idle_after_ms != 0 && now_ms - h->last_demand_ms >= h->idle_after_ms) {
            /* Nobody asked for this peer lately: stop probing it, connect on the next demand. */
            enter(h, BATON_PEER_IDLE, now_ms);
            baton_backoff_reset(&h->backoff);
            return 0;
        }
        return BATON_PEER_ACT_CONNECT;
    default:
        return 0;
    }
}

const char *baton_peer_state_name(baton_peer_state_t s)
{
    switch (s) {
    case BATON_PEER_IDLE:
        return "idle";
    case BATON_PEER_CONNECTING:
        return "connecting";
    case BATON_PEER_UP:
        return "up";
    case BATON_PEER_DOWN:
        return "down";
    }
    return "unknown";
}
