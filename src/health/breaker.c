/* breaker.c — the circuit breaker state machine (closed / open / half-open with one probe). */
#include "health/breaker.h"

#include "baton/error.h"
#include "common/rand.h"
#include "health/backoff.h"

#include <string.h>

#define STATE_BITS 2u
#define STATE_MASK 3u

static uint64_t pack(uint64_t epoch, baton_breaker_state_t s)
{
    return (epoch << STATE_BITS) | (uint64_t)s;
}

static baton_breaker_state_t word_state(uint64_t w)
{
    return (baton_breaker_state_t)(w & STATE_MASK);
}

static uint64_t word_epoch(uint64_t w)
{
    return w >> STATE_BITS;
}

const char *baton_breaker_state_name(baton_breaker_state_t s)
{
    switch (s) {
    case BATON_BREAKER_CLOSED:
        return "closed";
    case BATON_BREAKER_OPEN:
        return "open";
    case BATON_BREAKER_HALF_OPEN:
        return "half_open";
    }
    return "unknown";
}

const char *baton_breaker_outcome_name(baton_breaker_outcome_t o)
{
    switch (o) {
    case BATON_OUTCOME_SUCCESS:
        return "success";
    case BATON_OUTCOME_FAILURE:
        return "failure";
    case BATON_OUTCOME_NEUTRAL:
        return "neutral";
    }
    return "unknown";
}

baton_breaker_outcome_t baton_breaker_outcome(int err, int status)
{
    if (err == 0) {
        if (status >= 500 || status <= 0)
            return BATON_OUTCOME_FAILURE;
        if (status >= 400)
            return BATON_OUTCOME_NEUTRAL;
        return BATON_OUTCOME_SUCCESS;
    }
    switch (err) {
    case BATON_ECANCELED:
    case BATON_ENOMEM:
    case BATON_EINVAL:
    case BATON_ESHUTDOWN:
        return BATON_OUTCOME_NEUTRAL; /* the router's doing, not the worker's */
    default:
        return BATON_OUTCOME_FAILURE;
    }
}

void baton_breaker_config_init(baton_breaker_config_t *cfg)
{
    cfg->failure_threshold = 5;
    cfg->cooldown_base_ms = 1000;
    cfg->cooldown_max_ms = 30000;
    cfg->jitter = 0.2;
    cfg->probe_timeout_ms = 60000;
}

uint64_t baton_breaker_cooldown_cap(const baton_breaker_config_t *cfg, unsigned k)
{
    return baton_backoff_cap(cfg->cooldown_base_ms, cfg->cooldown_max_ms, k > 0 ? k - 1 : 0);
}

int baton_breaker_init(baton_breaker_t *b, const baton_breaker_config_t *cfg,
                       baton_breaker_change_cb on_change, void *ctx, uint64_t seed)
{
    void *data = b->data;
    memset(b, 0, sizeof(*b));
    b->data = data;
    if (cfg != NULL)
        b->cfg_ = *cfg;
    else
        baton_breaker_config_init(&b->cfg_);
    if (b->cfg_.cooldown_base_ms < 1)
        b->cfg_.cooldown_base_ms = 1;
    if (b->cfg_.cooldown_max_ms < b->cfg_.cooldown_base_ms)
        b->cfg_.cooldown_max_ms = b->cfg_.cooldown_base_ms;
    if (!(b->cfg_.jitter >= 0)) /* also NaN */
        b->cfg_.jitter = 0;
    if (b->cfg_.jitter > 1)
        b->cfg_.jitter = 1;
    b->on_change_ = on_change;
    b->ctx_ = ctx;
    b->rng_ = seed != 0 ? seed : BATON_GOLDEN_GAMMA ^ (uint64_t)(uintptr_t)b;
    if (b->rng_ == 0)
        b->rng_ = 1;
    atomic_init(&b->word_, pack(1, BATON_BREAKER_CLOSED));
    atomic_init(&b->failures_, 0);
    if (pthread_mutex_init(&b->lock_, NULL) != 0)
        return BATON_ENOMEM;
    return 0;
}

void baton_breaker_destroy(baton_breaker_t *b)
{
    pthread_mutex_destroy(&b->lock_);
}

baton_breaker_state_t baton_breaker_state(const baton_breaker_t *b)
{
    return word_state(atomic_load_explicit(&((baton_breaker_t *)b)->word_, memory_order_acquire));
}

/* ---- transitions (lock held) ---- */

static void go(baton_breaker_t *b, baton_breaker_state_t to, const char *reason)
{
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_relaxed);
    baton_breaker_state_t from = word_state(w);
    atomic_store_explicit(&b->word_, pack(word_epoch(w) + 1, to), memory_order_release);
    b->transitions_++;
    if (b->on_change_ != NULL)
        b->on_change_(b, from, to, reason, b->ctx_);
}

static void go_open(baton_breaker_t *b, uint64_t now, const char *reason)
{
    if (b->opens_ < 64)
        b->opens_++;
    uint64_t c = baton_breaker_cooldown_cap(&b->cfg_, b->opens_);
    if (b->cfg_.jitter > 0) {
        c = baton_backoff_jitter(c, b->cfg_.jitter, baton_xorshift64s(&b->rng_));
        if (c == 0) /* jitter 1 may draw 0: an OPEN breaker stays open for at least 1 ms */
            c = 1;
    }
    b->cooldown_ = c;
    b->open_until_ = now + c;
    b->probe_busy_ = 0;
    atomic_store_explicit(&b->failures_, 0, memory_order_relaxed);
    go(b, BATON_BREAKER_OPEN, reason);
}

static void go_half_open(baton_breaker_t *b, const char *reason)
{
    b->probe_busy_ = 0;
    b->open_until_ = 0;
    b->cooldown_ = 0;
    go(b, BATON_BREAKER_HALF_OPEN, reason);
}

static void go_closed(baton_breaker_t *b, const char *reason)
{
    b->opens_ = 0;
    b->probe_busy_ = 0;
    b->open_until_ = 0;
    b->cooldown_ = 0;
    atomic_store_explicit(&b->failures_, 0, memory_order_relaxed);
    go(b, BATON_BREAKER_CLOSED, reason);
}

static int probe_lost(const baton_breaker_t *b, uint64_t now)
{
    return b->probe_busy_ && b->cfg_.probe_timeout_ms > 0 &&
           now - b->probe_since_ >= b->cfg_.probe_timeout_ms;
}

/* Lock held: applies the time-driven changes (cool-down over, probe given up). */
static void advance(baton_breaker_t *b, uint64_t now)
{
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_relaxed);
    switch (word_state(w)) {
    case BATON_BREAKER_OPEN:
        if (now >= b->open_until_)
            go_half_open(b, "cooldown_elapsed");
        break;
    case BATON_BREAKER_HALF_OPEN:
        if (probe_lost(b, now)) {
            /* Same state, new epoch: the silent probe's ticket goes stale. */
            b->probe_busy_ = 0;
            atomic_store_explicit(&b->word_, pack(word_epoch(w) + 1, BATON_BREAKER_HALF_OPEN),
                                  memory_order_release);
        }
        break;
    case BATON_BREAKER_CLOSED:
        break;
    }
}

/* ---- API ---- */

baton_breaker_ticket_t baton_breaker_allow(baton_breaker_t *b, uint64_t now_ms)
{
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_acquire);
    if (word_state(w) == BATON_BREAKER_CLOSED)
        return w;
    baton_breaker_ticket_t t = 0;
    pthread_mutex_lock(&b->lock_);
    advance(b, now_ms);
    w = atomic_load_explicit(&b->word_, memory_order_relaxed);
    switch (word_state(w)) {
    case BATON_BREAKER_CLOSED:
        t = w;
        break;
    case BATON_BREAKER_HALF_OPEN:
        if (!b->probe_busy_) {
            b->probe_busy_ = 1;
            b->probe_since_ = now_ms;
            t = w;
        }
        break;
    case BATON_BREAKER_OPEN:
        break;
    }
    pthread_mutex_unlock(&b->lock_);
    return t;
}

int baton_breaker_ticket_is_probe(baton_breaker_ticket_t ticket)
{
    return ticket != 0 && word_state(ticket) == BATON_BREAKER_HALF_OPEN;
}

int baton_breaker_would_allow(baton_breaker_t *b, uint64_t now_ms)
{
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_acquire);
    if (word_state(w) == BATON_BREAKER_CLOSED)
        return 1;
    int ok = 0;
    pthread_mutex_lock(&b->lock_);
    w = atomic_load_explicit(&b->word_, memory_order_relaxed);
    switch (word_state(w)) {
    case BATON_BREAKER_CLOSED:
        ok = 1;
        break;
    case BATON_BREAKER_OPEN:
        ok = now_ms >= b->open_until_;
        break;
    case BATON_BREAKER_HALF_OPEN:
        ok = !b->probe_busy_ || probe_lost(b, now_ms);
        break;
    }
    pthread_mutex_unlock(&b->lock_);
    return ok;
}

void baton_breaker_record(baton_breaker_t *b, uint64_t now_ms, baton_breaker_ticket_t ticket,
                          baton_breaker_outcome_t outcome)
{
    if (ticket == 0 || b->cfg_.failure_threshold == 0)
        return;
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_acquire);
    if (word_epoch(w) != word_epoch(ticket))
        return; /* stale: admitted in an epoch that is over */
    if (word_state(w) == BATON_BREAKER_CLOSED && outcome != BATON_OUTCOME_FAILURE &&
        (outcome == BATON_OUTCOME_NEUTRAL ||
         atomic_load_explicit(&b->failures_, memory_order_relaxed) == 0))
        return; /* the hot path: nothing to change */

    pthread_mutex_lock(&b->lock_);
    w = atomic_load_explicit(&b->word_, memory_order_relaxed);
    if (word_epoch(w) != word_epoch(ticket)) {
        pthread_mutex_unlock(&b->lock_);
        return;
    }
    switch (word_state(w)) {
    case BATON_BREAKER_CLOSED:
        if (outcome == BATON_OUTCOME_SUCCESS) {
            atomic_store_explicit(&b->failures_, 0, memory_order_relaxed);
        } else if (outcome == BATON_OUTCOME_FAILURE) {
            unsigned f = atomic_load_explicit(&b->failures_, memory_order_relaxed) + 1;
            atomic_store_explicit(&b->failures_, f, memory_order_relaxed);
            if (f >= b->cfg_.failure_threshold)
                go_open(b, now_ms, "consecutive_failures");
        }
        break;
    case BATON_BREAKER_HALF_OPEN: /* same epoch: this is the probe */
        if (outcome == BATON_OUTCOME_SUCCESS)
            go_closed(b, "probe_succeeded");
        else if (outcome == BATON_OUTCOME_FAILURE)
            go_open(b, now_ms, "probe_failed");
        else
            b->probe_busy_ = 0;
        break;
    case BATON_BREAKER_OPEN: /* issues no tickets */
        break;
    }
    pthread_mutex_unlock(&b->lock_);
}

baton_breaker_state_t baton_breaker_poll(baton_breaker_t *b, uint64_t now_ms)
{
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_acquire);
    if (word_state(w) == BATON_BREAKER_CLOSED)
        return BATON_BREAKER_CLOSED;
    pthread_mutex_lock(&b->lock_);
    advance(b, now_ms);
    baton_breaker_state_t s = word_state(atomic_load_explicit(&b->word_, memory_order_relaxed));
    pthread_mutex_unlock(&b->lock_);
    return s;
}

void baton_breaker_expire(baton_breaker_t *b, uint64_t now_ms)
{
    pthread_mutex_lock(&b->lock_);
    if (baton_breaker_state(b) == BATON_BREAKER_OPEN)
        go_half_open(b, "expired");
    pthread_mutex_unlock(&b->lock_);
}

void baton_breaker_reset(baton_breaker_t *b, uint64_t now_ms)
{
    pthread_mutex_lock(&b->lock_);
    if (baton_breaker_state(b) != BATON_BREAKER_CLOSED) {
        go_closed(b, "reset");
    } else {
        b->opens_ = 0;
        atomic_store_explicit(&b->failures_, 0, memory_order_relaxed);
    }
    pthread_mutex_unlock(&b->lock_);
}

void baton_breaker_get_info(baton_breaker_t *b, baton_breaker_info_t *info)
{
    pthread_mutex_lock(&b->lock_);
    uint64_t w = atomic_load_explicit(&b->word_, memory_order_relaxed);
    info->state = word_state(w);
    info->epoch = word_epoch(w);
    info->failures = atomic_load_explicit(&b->failures_, memory_order_relaxed);
    info->opens = b->opens_;
    info->open_until_ms = info->state == BATON_BREAKER_OPEN ? b->open_until_ : 0;
    info->cooldown_ms = info->state == BATON_BREAKER_OPEN ? b->cooldown_ : 0;
    info->probe_busy = info->state == BATON_BREAKER_HALF_OPEN ? b->probe_busy_ : 0;
    info->transitions = b->transitions_;
    pthread_mutex_unlock(&b->lock_);
}
